/* Unicode helpers of the tokenizer (see unicode.h). */
#include "tokenizer/unicode.h"

int dsii_ucat(uint32_t cp) {
    if (cp < 0x80) return dsii_ucat_ascii[cp];
    if (cp > 0x10FFFF) return DSII_UCAT_OTHER;
    /* Binary search for the last range with first <= cp. */
    uint32_t lo = 0, hi = dsii_ucat_n_ranges;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (dsii_ucat_ranges[mid][0] <= cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return DSII_UCAT_OTHER;
    const uint32_t *r = dsii_ucat_ranges[lo - 1];
    return cp <= (r[1] >> 8) ? (int)(r[1] & 0xFF) : DSII_UCAT_OTHER;
}

/* Unicode Table 3-7 (well-formed UTF-8): the allowed range of the second byte depends on
 * the first; later bytes are 80..BF. Returns the sequence length for a lead byte (0 if the
 * byte can never start a sequence) and the second-byte bounds. */
static int utf8_lead(uint8_t b, uint8_t *lo2, uint8_t *hi2) {
    *lo2 = 0x80;
    *hi2 = 0xBF;
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;           /* continuation bytes and overlong C0/C1 */
    if (b < 0xE0) return 2;
    if (b < 0xF0) {
        if (b == 0xE0) *lo2 = 0xA0;   /* overlong */
        if (b == 0xED) *hi2 = 0x9F;   /* surrogates */
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0) *lo2 = 0x90;   /* overlong */
        if (b == 0xF4) *hi2 = 0x8F;   /* > U+10FFFF */
        return 4;
    }
    return 0;
}

int dsii_utf8_check(const uint8_t *s, size_t len) {
    uint8_t lo2, hi2;
    int n = utf8_lead(s[0], &lo2, &hi2);
    if (n == 0) return 0;
    for (int k = 1; k < n; k++) {
        if ((size_t)k >= len) return -1;
        uint8_t lo = k == 1 ? lo2 : 0x80, hi = k == 1 ? hi2 : 0xBF;
        if (s[k] < lo || s[k] > hi) return 0;
    }
    return n;
}

size_t dsii_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp) {
    int n = dsii_utf8_check(s, len);
    if (n <= 0) {
        *cp = DSII_UTF8_INVALID;
        return 1;
    }
    uint32_t c;
    switch (n) {
    case 1: c = s[0]; break;
    case 2: c = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); break;
    case 3: c = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
    default:
        c = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
            ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        break;
    }
    *cp = c;
    return (size_t)n;
}
