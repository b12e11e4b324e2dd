/* The Engram token map normalizer (engram_norm.h). */
#include "engram_norm.h"

#include "tokenizer/unicode.h"

#include <stdlib.h>
#include <string.h>

typedef struct cpbuf {
    uint32_t *p;
    size_t n, cap;
} cpbuf;

static int push(cpbuf *b, uint32_t c) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        uint32_t *p = realloc(b->p, sizeof *p * cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    b->p[b->n++] = c;
    return 0;
}

static const en_map *find_map(const en_map *m, uint32_t n, uint32_t cp) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (m[mid].cp == cp) return &m[mid];
        if (m[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static uint32_t ccc_of(uint32_t cp) {
    uint32_t lo = 0, hi = k_en_n_ccc;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (k_en_ccc[mid].cp == cp) return k_en_ccc[mid].ccc;
        if (k_en_ccc[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

static int is_mn(uint32_t cp) {
    uint32_t lo = 0, hi = k_en_n_mn;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cp < k_en_mn[mid][0]) hi = mid;
        else if (cp > k_en_mn[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* NFKD of one code point (Hangul syllables arithmetically, Unicode §3.12). */
static int nfkd_cp(cpbuf *b, uint32_t cp) {
    if (cp >= 0xAC00 && cp <= 0xD7A3) {
        uint32_t s = cp - 0xAC00;
        if (push(b, 0x1100 + s / 588) || push(b, 0x1161 + (s % 588) / 28)) return -1;
        return s % 28 ? push(b, 0x11A7 + s % 28) : 0;
    }
    const en_map *m = find_map(k_en_decomp, k_en_n_decomp, cp);
    if (!m) return push(b, cp);
    for (uint32_t i = 0; i < m->n; i++)
        if (push(b, k_en_decomp_pool[m->off + i])) return -1;
    return 0;
}

static int is_ws(uint32_t c) { return dsii_ucat(c) == DSII_UCAT_WS; }

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        i += dsii_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (cp == DSII_UTF8_INVALID || cp == 0xFFFD) return 0;
    }
    return 1;
}

static int put_utf8(char **o, size_t *n, size_t *cap, uint32_t c) {
    if (*n + 4 > *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        char *p = realloc(*o, nc);
        if (!p) return -1;
        *o = p;
        *cap = nc;
    }
    uint8_t *d = (uint8_t *)*o + *n;
    if (c < 0x80) d[0] = (uint8_t)c, *n += 1;
    else if (c < 0x800) d[0] = (uint8_t)(0xC0 | c >> 6), d[1] = (uint8_t)(0x80 | (c & 63)), *n += 2;
    else if (c < 0x10000)
        d[0] = (uint8_t)(0xE0 | c >> 12), d[1] = (uint8_t)(0x80 | ((c >> 6) & 63)), d[2] = (uint8_t)(0x80 | (c & 63)), *n += 3;
    else
        d[0] = (uint8_t)(0xF0 | c >> 18), d[1] = (uint8_t)(0x80 | ((c >> 12) & 63)),
        d[2] = (uint8_t)(0x80 | ((c >> 6) & 63)), d[3] = (uint8_t)(0x80 | (c & 63)), *n += 4;
    return 0;
}

int en_normalize(const char *s, size_t len, char **out, size_t *out_len) {
    cpbuf a = {0}, b = {0};
    int rc = 0;
    /* NFKD = NFD(NFKC(s)) */
    for (size_t i = 0; i < len && !rc;) {
        uint32_t cp = 0;
        size_t k = dsii_utf8_decode((const uint8_t *)s + i, len - i, &cp);
        i += k;
        rc = nfkd_cp(&a, cp);
    }
    /* canonical ordering: stable sort of each run of non-starters by combining class */
    for (size_t i = 1; !rc && i < a.n; i++) {
        uint32_t c = ccc_of(a.p[i]);
        if (!c) continue;
        for (size_t j = i; j > 0; j--) {
            uint32_t p = ccc_of(a.p[j - 1]);
            if (!p || p <= c) break;
            uint32_t t = a.p[j];
            a.p[j] = a.p[j - 1];
            a.p[j - 1] = t;
        }
    }
    /* StripAccents, then Lowercase (Final_Sigma: Σ after a letter and not before one -> ς) */
    size_t m = 0;
    for (size_t i = 0; i < a.n; i++)
        if (!is_mn(a.p[i])) a.p[m++] = a.p[i];
    a.n = m;
    for (size_t i = 0; i < a.n && !rc; i++) {
        uint32_t c = a.p[i];
        if (c == 0x03A3) {
            int before = i > 0 && dsii_ucat(a.p[i - 1]) == DSII_UCAT_L;
            int after = i + 1 < a.n && dsii_ucat(a.p[i + 1]) == DSII_UCAT_L;
            rc = push(&b, before && !after ? 0x03C2 : 0x03C3);
            continue;
        }
        const en_map *lm = find_map(k_en_lower, k_en_n_lower, c);
        if (!lm) {
            rc = push(&b, c);
            continue;
        }
        for (uint32_t j = 0; j < lm->n && !rc; j++) rc = push(&b, k_en_lower_pool[lm->off + j]);
    }
    /* [ \t\r\n]+ -> " "; a lone " " survives the Strip; Strip removes White_Space at both ends */
    m = 0;
    int in_run = 0;
    for (size_t i = 0; i < b.n; i++) {
        uint32_t c = b.p[i];
        const int sp = c == ' ' || c == '\t' || c == '\r' || c == '\n';
        if (sp && in_run) continue;
        in_run = sp;
        b.p[m++] = sp ? ' ' : c;
    }
    b.n = m;
    size_t lo = 0, hi = b.n;
    if (!(b.n == 1 && b.p[0] == ' ')) {
        while (lo < hi && is_ws(b.p[lo])) lo++;
        while (hi > lo && is_ws(b.p[hi - 1])) hi--;
    }
    char *o = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = lo; i < hi && !rc; i++) rc = put_utf8(&o, &n, &cap, b.p[i]);
    if (!rc && put_utf8(&o, &n, &cap, 0)) rc = -1;
    free(a.p);
    free(b.p);
    if (rc) {
        free(o);
        return -1;
    }
    *out = o;
    *out_len = n - 1;
    return 0;
}

/* GPT-2 byte-level spelling: code point -> byte, or -1. */
static int byte_of(uint32_t cp) {
    static int16_t inv[324];
    static int init;
    if (!init) {
        for (int i = 0; i < 324; i++) inv[i] = -1;
        int n = 0;
        for (int bb = 0; bb < 256; bb++) {
            int keep = (bb >= 33 && bb <= 126) || (bb >= 161 && bb <= 172) || (bb >= 174 && bb <= 255);
            inv[keep ? bb : 256 + n] = (int16_t)bb;
            if (!keep) n++;
        }
        init = 1;
    }
    return cp < 324 ? inv[cp] : -1;
}

typedef struct slot {
    char *key;
    size_t len;
    uint32_t id;
} slot;

static uint64_t hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

int en_token_map(const char *const *tokens, const size_t *lens, const uint8_t *is_literal, uint32_t n,
                 int32_t *map, uint32_t *n_compressed) {
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap *= 2;
    slot *tab = calloc(cap, sizeof *tab);
    if (!tab) return -1;
    uint32_t next = 0;
    int rc = 0;
    for (uint32_t t = 0; t < n && !rc; t++) {
        const char *tok = tokens[t];
        size_t tl = lens[t];
        char *text = malloc(tl + 1);
        size_t textn = 0;
        int bad = !text;
        if (!bad && is_literal[t]) {
            memcpy(text, tok, tl);
            textn = tl;
        } else {
            for (size_t i = 0; !bad && i < tl;) {
                uint32_t cp = 0;
                size_t k = dsii_utf8_decode((const uint8_t *)tok + i, tl - i, &cp);
                int by = cp == DSII_UTF8_INVALID ? -1 : byte_of(cp);
                if (by < 0) bad = 1;
                else text[textn++] = (char)by, i += k;
            }
        }
        /* invalid UTF-8 (a decoder would print U+FFFD) or U+FFFD itself: key on the token */
        const char *key = tok;
        size_t keyn = tl;
        char *norm = NULL;
        size_t normn = 0;
        if (!bad && valid_utf8(text, textn)) {
            if (en_normalize(text, textn, &norm, &normn)) rc = -1;
            else if (normn) key = norm, keyn = normn;
            else key = text, keyn = textn;
        }
        uint64_t h = hash(key, keyn) & (cap - 1);
        while (!rc && tab[h].key && !(tab[h].len == keyn && !memcmp(tab[h].key, key, keyn))) h = (h + 1) & (cap - 1);
        if (!rc && !tab[h].key) {
            tab[h].key = malloc(keyn + 1);
            if (!tab[h].key) rc = -1;
            else {
                memcpy(tab[h].key, key, keyn);
                tab[h].len = keyn;
                tab[h].id = next++;
            }
        }
        if (!rc) map[t] = (int32_t)tab[h].id;
        free(norm);
        free(text);
    }
    for (size_t i = 0; i < cap; i++) free(tab[i].key);
    free(tab);
    *n_compressed = next;
    return rc;
}
