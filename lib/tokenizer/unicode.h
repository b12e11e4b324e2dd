/*
 * Unicode helpers of the tokenizer: character classes (generated tables,
 * tools/gen_unicode_tables.py) and a UTF-8 decoder that never rejects input.
 */
#ifndef DSI_TOKENIZER_UNICODE_H
#define DSI_TOKENIZER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    DSII_UCAT_OTHER = 0, /* C*, unassigned, and every invalid UTF-8 byte */
    DSII_UCAT_L = 1,     /* General_Category L* */
    DSII_UCAT_M = 2,     /* M* */
    DSII_UCAT_N = 3,     /* N* */
    DSII_UCAT_P = 4,     /* P* */
    DSII_UCAT_S = 5,     /* S* */
    DSII_UCAT_WS = 6     /* White_Space property (never L/M/N/P/S) */
};

extern const char dsii_unicode_version[];
extern const uint8_t dsii_ucat_ascii[128];
extern const uint32_t dsii_ucat_ranges[][2];
extern const uint32_t dsii_ucat_n_ranges;

/* Class of a code point (any value; > 0x10FFFF gives OTHER). */
int dsii_ucat(uint32_t cp);

/* Marker "code point" for an invalid byte: outside the Unicode range, class OTHER. */
#define DSII_UTF8_INVALID 0xFFFFFFFFu

/* Decodes one code point at s[0..len) (len >= 1). Well-formed sequences only (Unicode
 * Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF); anything else consumes
 * exactly one byte and yields DSII_UTF8_INVALID. Returns the byte count (1..4). */
size_t dsii_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);

/* Length of the well-formed sequence starting at s, or 0 if s[0..len) starts with an
 * invalid byte; -1 if it is a valid but truncated prefix (more bytes could complete it). */
int dsii_utf8_check(const uint8_t *s, size_t len);

#endif
