/*
 * Tokenizer unit tests: Unicode classes, the pre-tokenizer splits and BPE merges against
 * expectations written by hand from model-spec.md §6, special tokens, invalid UTF-8, the
 * two-call pattern, the incremental UTF-8 decoder, GGUF loading and its errors.
 * (The cross-check against tests/reference/tokenizer.py is test_tokenizer_reference.c.)
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tests/common/skip.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* GPT-2 spelling of one byte, written independently of the library: printable Latin-1
 * bytes stand for themselves, the other 68 bytes map to U+0100.. in ascending order. */
static void spell_byte(int b, char out[3]) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    unsigned cp;
    if (printable) {
        cp = (unsigned)b;
    } else {
        unsigned k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0; }
}

typedef struct {
    char *tok[1024];
    int32_t type[1024];
    int n;
    char *merge[1024];
    int nm;
} vocab;

static int add_tok(vocab *v, const char *spelling, int32_t type) {
    v->tok[v->n] = strdup(spelling);
    v->type[v->n] = type;
    return v->n++;
}

/* spelling of a plain byte string */
static void spell(const char *s, char *out) {
    out[0] = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char b[3];
        spell_byte(*p, b);
        strcat(out, b);
    }
}

/* adds merge "A B" (plain ASCII parts) and the token A+B; returns the token id */
static int add_merge(vocab *v, const char *a, const char *b) {
    char sa[64], sb[64], m[160], ab[128];
    spell(a, sa);
    spell(b, sb);
    snprintf(m, sizeof m, "%s %s", sa, sb);
    v->merge[v->nm++] = strdup(m);
    snprintf(ab, sizeof ab, "%s%s", sa, sb);
    return add_tok(v, ab, 1);
}

static void vocab_bytes(vocab *v) {
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        char s[3];
        spell_byte(b, s);
        add_tok(v, s, 1);
    }
}

static void vocab_free(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    for (int i = 0; i < v->nm; i++) free(v->merge[i]);
}

#define S_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define S_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define S_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define S_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"

static dsii_tokenizer *build(vocab *v, int with_types) {
    dsii_tokenizer_desc d;
    memset(&d, 0, sizeof d);
    d.n_tokens = (size_t)v->n;
    d.tokens = (const char *const *)v->tok;
    d.token_types = with_types ? v->type : NULL;
    d.n_merges = (size_t)v->nm;
    d.merges = (const char *const *)v->merge;
    d.bos_id = d.eos_id = d.pad_id = -1;
    dsii_tokenizer *t = NULL;
    dsii_error e;
    dsi_status st = dsii_tokenizer_create(NULL, &d, &t, &e);
    if (st != DSI_OK) fail_msg("create: %s", e.msg);
    return t;
}

static size_t tokenize(const dsii_tokenizer *t, const char *s, size_t len, uint32_t flags,
                       dsi_token *out, size_t cap) {
    size_t n = 0;
    dsii_error e;
    dsi_status st = dsii_tokenize(t, s, len, flags, out, cap, &n, &e);
    if (st != DSI_OK) fail_msg("tokenize: %s", e.msg);
    return n;
}

/* ---- Unicode ---------------------------------------------------------------------------- */

static void test_unicode_classes(void **state) {
    (void)state;
    assert_int_equal(dsii_ucat('A'), DSII_UCAT_L);
    assert_int_equal(dsii_ucat('z'), DSII_UCAT_L);
    assert_int_equal(dsii_ucat('5'), DSII_UCAT_N);
    assert_int_equal(dsii_ucat(' '), DSII_UCAT_WS);
    assert_int_equal(dsii_ucat('\t'), DSII_UCAT_WS);
    assert_int_equal(dsii_ucat('\n'), DSII_UCAT_WS);
    assert_int_equal(dsii_ucat(0x1C), DSII_UCAT_OTHER);   /* Cc, not White_Space */
    assert_int_equal(dsii_ucat('!'), DSII_UCAT_P);
    assert_int_equal(dsii_ucat('$'), DSII_UCAT_S);
    assert_int_equal(dsii_ucat('+'), DSII_UCAT_S);
    assert_int_equal(dsii_ucat('`'), DSII_UCAT_S);        /* Sk */
    assert_int_equal(dsii_ucat(0x85), DSII_UCAT_WS);      /* NEL */
    assert_int_equal(dsii_ucat(0xA0), DSII_UCAT_WS);      /* NBSP */
    assert_int_equal(dsii_ucat(0xAB), DSII_UCAT_P);       /* « */
    assert_int_equal(dsii_ucat(0xE9), DSII_UCAT_L);       /* é */
    assert_int_equal(dsii_ucat(0x0301), DSII_UCAT_M);     /* combining acute */
    assert_int_equal(dsii_ucat(0x0378), DSII_UCAT_OTHER); /* unassigned */
    assert_int_equal(dsii_ucat(0x0663), DSII_UCAT_N);     /* Arabic-Indic three */
    assert_int_equal(dsii_ucat(0x00B2), DSII_UCAT_N);     /* superscript two (No) */
    assert_int_equal(dsii_ucat(0x2167), DSII_UCAT_N);     /* Roman numeral eight (Nl) */
    assert_int_equal(dsii_ucat(0x200D), DSII_UCAT_OTHER); /* ZWJ (Cf) */
    assert_int_equal(dsii_ucat(0x200B), DSII_UCAT_OTHER); /* ZWSP is not White_Space */
    assert_int_equal(dsii_ucat(0x2028), DSII_UCAT_WS);
    assert_int_equal(dsii_ucat(0x3000), DSII_UCAT_WS);
    assert_int_equal(dsii_ucat(0x3007), DSII_UCAT_N);     /* 〇 */
    assert_int_equal(dsii_ucat(0x4E2D), DSII_UCAT_L);     /* 中 */
    assert_int_equal(dsii_ucat(0x20AC), DSII_UCAT_S);     /* € */
    assert_int_equal(dsii_ucat(0x1F600), DSII_UCAT_S);    /* 😀 */
    assert_int_equal(dsii_ucat(0x1D538), DSII_UCAT_L);    /* 𝔸 */
    assert_int_equal(dsii_ucat(0xE000), DSII_UCAT_OTHER); /* private use */
    assert_int_equal(dsii_ucat(0x20000), DSII_UCAT_L);    /* CJK ext B (range entry) */
    assert_int_equal(dsii_ucat(0x10FFFF), DSII_UCAT_OTHER);
    assert_int_equal(dsii_ucat(0x110000), DSII_UCAT_OTHER);
    assert_int_equal(dsii_ucat(DSII_UTF8_INVALID), DSII_UCAT_OTHER);
}

static void test_unicode_tables_fresh(void **state) {
    (void)state;
    if (access("/usr/share/unicode/UnicodeData.txt", R_OK) != 0 ||
        access("/usr/share/unicode/PropList.txt", R_OK) != 0)
        DSIT_SKIP_TEST("UNICODE_DATA", "Debian unicode-data absent (/usr/share/unicode): "
                                       "nothing to compare the tables with");
    const char *src = getenv("DSI_SOURCE_DIR"), *bld = getenv("DSI_BUILD_DIR"),
               *py = getenv("DSI_PYTHON");
    if (!src || !bld) fail_msg("DSI_SOURCE_DIR / DSI_BUILD_DIR not set (run through ctest / meson test)");
    char out[4096], cmd[8192], committed[4096];
    snprintf(out, sizeof out, "%s/tests/unicode_tables.fresh.c", bld);
    snprintf(cmd, sizeof cmd, "%s %s/tools/gen_unicode_tables.py --output %s",
             py ? py : "/usr/bin/python3", src, out);
    assert_int_equal(system(cmd), 0);
    snprintf(committed, sizeof committed, "%s/lib/tokenizer/unicode_tables.c", src);
    FILE *a = fopen(out, "rb"), *b = fopen(committed, "rb");
    assert_non_null(a);
    assert_non_null(b);
    int ca, cb;
    long pos = 0;
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        if (ca != cb) fail_msg("lib/tokenizer/unicode_tables.c differs from a fresh generation at byte %ld; "
                               "run tools/gen_unicode_tables.py --output lib/tokenizer/unicode_tables.c", pos);
        pos++;
    } while (ca != EOF);
    fclose(a);
    fclose(b);
    remove(out);
}

static void test_utf8_decoder(void **state) {
    (void)state;
    uint32_t cp;
    const uint8_t ok4[] = {0xF0, 0x9F, 0x98, 0x80};
    assert_int_equal(dsii_utf8_decode(ok4, 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
    const uint8_t overlong[] = {0xC0, 0xAF};
    assert_int_equal(dsii_utf8_decode(overlong, 2, &cp), 1);
    assert_int_equal(cp, DSII_UTF8_INVALID);
    const uint8_t overlong3[] = {0xE0, 0x80, 0xAF};
    assert_int_equal(dsii_utf8_decode(overlong3, 3, &cp), 1);
    assert_int_equal(cp, DSII_UTF8_INVALID);
    const uint8_t surrogate[] = {0xED, 0xA0, 0x80};
    assert_int_equal(dsii_utf8_decode(surrogate, 3, &cp), 1);
    assert_int_equal(cp, DSII_UTF8_INVALID);
    const uint8_t big[] = {0xF4, 0x90, 0x80, 0x80};
    assert_int_equal(dsii_utf8_decode(big, 4, &cp), 1);
    const uint8_t trunc[] = {0xE4, 0xB8};
    assert_int_equal(dsii_utf8_decode(trunc, 2, &cp), 1); /* never reads past len */
    assert_int_equal(dsii_utf8_check(trunc, 2), -1);
    const uint8_t cont[] = {0x80};
    assert_int_equal(dsii_utf8_check(cont, 1), 0);
}

/* ---- pre-tokenizer ---------------------------------------------------------------------- */

typedef struct {
    const char *text;
    char got[2048];
} pieces_ctx;

static void collect(void *user, size_t off, size_t len) {
    pieces_ctx *p = user;
    if (p->got[0]) strcat(p->got, "|");
    strncat(p->got, p->text + off, len);
}

static void expect_pieces(const char *text, size_t len, const char *want) {
    pieces_ctx p;
    p.text = text;
    p.got[0] = 0;
    dsii_pretokenize(text, len, collect, &p);
    if (strcmp(p.got, want) != 0) fail_msg("pieces of \"%s\": got \"%s\", want \"%s\"", text, p.got, want);
}
#define EXPECT_PIECES(lit, want) expect_pieces(lit, sizeof(lit) - 1, want)

static void test_pretokenizer(void **state) {
    (void)state;
    /* Expected pieces worked out by hand from the three §6 regexes (docs/tokenizer.md). */
    EXPECT_PIECES("Hello world", "Hello| world");
    EXPECT_PIECES("a  b", "a| | b");                    /* \s+(?!\S) leaves one space */
    EXPECT_PIECES("a   ", "a|   ");                      /* at the end: the whole run */
    EXPECT_PIECES("12345", "123|45");
    EXPECT_PIECES("1234567890123", "123|456|789|012|3");
    EXPECT_PIECES("abc123def", "abc|123|def");
    EXPECT_PIECES("1,234.5", "1|,|234|.|5");
    EXPECT_PIECES("\xe4\xbd\xa0\xe5\xa5\xbdworld", "\xe4\xbd\xa0\xe5\xa5\xbd|world"); /* 你好world */
    EXPECT_PIECES("a\xe4\xb8\xad", "a|\xe4\xb8\xad");   /* a中: CJK split runs first */
    EXPECT_PIECES("x;\n\ny", "x|;\n\n|y");               /* punctuation keeps newlines */
    EXPECT_PIECES("  \n  x", "  \n| | x");
    EXPECT_PIECES("don't", "don|'t");
    EXPECT_PIECES("\xc2\xab" "abc", "\xc2\xab|abc");    /* «abc: only ASCII P/S join letters */
    EXPECT_PIECES("e\xcc\x81t\xc3\xa9", "e\xcc\x81t\xc3\xa9"); /* marks stay in the word */
    EXPECT_PIECES(" \xcc\x81", " \xcc\x81");            /* space + mark: one piece */
    EXPECT_PIECES("\t\tfoo", "\t|\tfoo");
    EXPECT_PIECES("a\r\nb", "a|\r\n|b");
    EXPECT_PIECES("\xf0\x9f\x98\x80\xf0\x9f\x98\x80 ok", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80| ok");
    /* 👨‍👩: emoji are S, the ZWJ (Cf) matches nothing and stays a piece of its own */
    EXPECT_PIECES("\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
                  "\xf0\x9f\x91\xa8|\xe2\x80\x8d|\xf0\x9f\x91\xa9");
    EXPECT_PIECES("\xff\xfe", "\xff\xfe");               /* invalid bytes: one unmatched run */
    EXPECT_PIECES("\xff" "abc", "\xff" "abc");          /* an invalid byte may prefix a word */
    EXPECT_PIECES("\xe3\x82\xa2\xe3\x83\xbb\xe3\x82\xa4", /* ア・イ: the kana run, then split c */
                  "\xe3\x82\xa2|\xe3\x83\xbb|\xe3\x82\xa4");
    EXPECT_PIECES("foo \xe3\x81\x93\xe3\x82\x93", "foo| |\xe3\x81\x93\xe3\x82\x93"); /* foo こん */
    EXPECT_PIECES("a  1", "a|  |1");                     /* gap ends at the digit split */
    EXPECT_PIECES(" ?!\n", " ?!\n");
    EXPECT_PIECES("x\n\n\n", "x|\n\n\n");
    EXPECT_PIECES("", "");
}

/* ---- BPE ------------------------------------------------------------------------------ */

static void test_bpe_merges(void **state) {
    (void)state;
    vocab v;
    vocab_bytes(&v);
    int ab = add_merge(&v, "a", "b");    /* rank 0 */
    int abc = add_merge(&v, "ab", "c");  /* rank 1 */
    int bc = add_merge(&v, "b", "c");    /* rank 2 */
    int aa = add_merge(&v, "a", "a");    /* rank 3 */
    dsii_tokenizer *t = build(&v, 1);
    dsi_token out[16];
    size_t n = tokenize(t, "abc", 3, 0, out, 16);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], abc);
    n = tokenize(t, "bcab", 4, 0, out, 16);   /* ab (rank 0) first, then bc */
    assert_int_equal(n, 2);
    assert_int_equal(out[0], bc);
    assert_int_equal(out[1], ab);
    n = tokenize(t, "aaa", 3, 0, out, 16);    /* leftmost pair first */
    assert_int_equal(n, 2);
    assert_int_equal(out[0], aa);
    assert_int_equal(out[1], 'a');
    n = tokenize(t, "aaaa", 4, 0, out, 16);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], aa);
    assert_int_equal(out[1], aa);
    /* merges never cross piece boundaries: "a b" is two pieces, "a"+" b" */
    n = tokenize(t, "a bc", 4, 0, out, 16);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 'a');
    char sp[3];
    spell_byte(' ', sp);
    assert_int_equal(out[1], 0x20); /* bytes map to the ids of this vocab's byte tokens */
    assert_int_equal(out[2], bc);
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

static void test_long_input_linear(void **state) {
    (void)state;
    vocab v;
    vocab_bytes(&v);
    int aa = add_merge(&v, "a", "a");
    int a4 = add_merge(&v, "aa", "aa");
    dsii_tokenizer *t = build(&v, 1);
    /* one 1 MiB piece of letters: the heap merge keeps this fast */
    size_t n = 1u << 20;
    char *s = malloc(n);
    memset(s, 'a', n);
    dsi_token *out = malloc(n * sizeof *out);
    size_t got = tokenize(t, s, n, 0, out, n);
    assert_int_equal(got, n / 4);
    for (size_t i = 0; i < got; i++) assert_int_equal(out[i], a4);
    (void)aa;
    free(s);
    free(out);
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

/* ---- special tokens, flags, two-call --------------------------------------------------- */

static dsii_tokenizer *special_vocab(vocab *v, int *ids) {
    vocab_bytes(v);
    ids[0] = add_tok(v, S_BOS, 3);
    ids[1] = add_tok(v, S_EOS, 3);
    ids[2] = add_tok(v, S_USER, 3);
    ids[3] = add_tok(v, S_ASSISTANT, 3);
    ids[4] = add_tok(v, "<think>", 3);
    ids[5] = add_tok(v, "</think>", 3);
    add_merge(v, "h", "i");
    return build(v, 1);
}

static void test_special_tokens(void **state) {
    (void)state;
    vocab v;
    int ids[6];
    dsii_tokenizer *t = special_vocab(&v, ids);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_BOS), ids[0]);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_EOS), ids[1]);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_PAD), -1);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_USER), ids[2]);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_ASSISTANT), ids[3]);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_THINK_BEGIN), ids[4]);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_THINK_END), ids[5]);

    const char *text = S_USER "hi<think></think>" S_ASSISTANT;
    dsi_token out[256];
    size_t n = tokenize(t, text, strlen(text), DSI_TOKENIZE_PARSE_SPECIAL, out, 256);
    assert_int_equal(n, 5);
    assert_int_equal(out[0], ids[2]);
    assert_int_equal(out[1], 256 + 6); /* "hi" */
    assert_int_equal(out[2], ids[4]);
    assert_int_equal(out[3], ids[5]);
    assert_int_equal(out[4], ids[3]);
    /* without the flag the same text never yields a special id */
    n = tokenize(t, text, strlen(text), 0, out, 256);
    assert_true(n > 5);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 6; k++) assert_int_not_equal(out[i], ids[k]);
    /* ADD_BOS */
    n = tokenize(t, "hi", 2, DSI_TOKENIZE_ADD_BOS, out, 256);
    assert_int_equal(n, 2);
    assert_int_equal(out[0], ids[0]);
    /* special token text bytes */
    size_t len;
    const uint8_t *p = dsii_tokenizer_token_bytes(t, ids[2], &len);
    assert_int_equal(len, strlen(S_USER));
    assert_memory_equal(p, S_USER, len);
    assert_null(dsii_tokenizer_token_bytes(t, -1, &len));
    assert_null(dsii_tokenizer_token_bytes(t, v.n, &len));
    assert_true(dsii_tokenizer_is_special(t, ids[4]));
    assert_false(dsii_tokenizer_is_special(t, 'a'));
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

static void test_two_call_and_flags(void **state) {
    (void)state;
    vocab v;
    int ids[6];
    dsii_tokenizer *t = special_vocab(&v, ids);
    dsii_error e;
    size_t need = 0;
    assert_int_equal(dsii_tokenize(t, "hello", 5, 0, NULL, 0, &need, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(need, 5);
    dsi_token out[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    assert_int_equal(dsii_tokenize(t, "hello", 5, 0, out, 4, &need, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(out[0], -7); /* nothing written */
    assert_int_equal(dsii_tokenize(t, "hello", 5, 0, out, 5, &need, &e), DSI_OK);
    assert_int_equal(dsii_tokenize(t, "", 0, 0, NULL, 0, &need, &e), DSI_OK);
    assert_int_equal(need, 0);
    assert_int_equal(dsii_tokenize(t, "a", 1, 0x80, out, 8, &need, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "flags"));
    assert_int_equal(dsii_tokenize(t, NULL, 3, 0, out, 8, &need, &e), DSI_ERR_INVALID_ARGUMENT);
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

static void test_invalid_utf8_bytewise(void **state) {
    (void)state;
    vocab v;
    int ids[6];
    dsii_tokenizer *t = special_vocab(&v, ids);
    const char bad[] = "\xff\x80\xc0\xaf\xed\xa0\x80\xe4\xb8\xf4\x90\x80\x80" "ok\xe4";
    dsi_token out[64];
    size_t n = tokenize(t, bad, sizeof bad - 1, 0, out, 64);
    /* no merges apply: one byte token per byte, in order */
    assert_int_equal(n, sizeof bad - 1);
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = dsii_tokenizer_token_bytes(t, out[i], &l);
        assert_int_equal(l, 1);
        assert_int_equal(p[0], (uint8_t)bad[i]);
    }
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

/* ---- incremental UTF-8 ----------------------------------------------------------------- */

static size_t push(dsii_utf8_stream *s, const char *b, size_t n, char *out) {
    dsii_utf8_stream next;
    size_t o = dsii_utf8_stream_push(s, (const uint8_t *)b, n, (uint8_t *)out, &next);
    *s = next;
    out[o] = 0;
    return o;
}

static void test_utf8_stream(void **state) {
    (void)state;
    dsii_utf8_stream s = {{0}, 0};
    char out[64];
    assert_int_equal(push(&s, "\xe4", 1, out), 0);
    assert_int_equal(push(&s, "\xb8", 1, out), 0);
    assert_int_equal(push(&s, "\xad" "a", 2, out), 4);
    assert_string_equal(out, "\xe4\xb8\xad" "a");
    /* invalid lead byte and a truncated sequence followed by ASCII: U+FFFD each */
    assert_int_equal(push(&s, "\xff" "b\xe4\xb8" "c", 5, out), 8);
    assert_string_equal(out, "\xef\xbf\xbd" "b\xef\xbf\xbd" "c");
    /* unfinished at flush time */
    assert_int_equal(push(&s, "\xf0\x9f", 2, out), 0);
    assert_int_equal(dsii_utf8_stream_flush(&s, (uint8_t *)out), 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    assert_int_equal(dsii_utf8_stream_flush(&s, (uint8_t *)out), 0);
}

/* ---- GGUF loading ---------------------------------------------------------------------- */

static dsi_status load_from(vocab *v, int with_types, const char *model, const char *pre,
                            int64_t bos, dsii_tokenizer **t, dsii_error *e) {
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    assert_non_null(w);
    if (model) assert_int_equal(dsii_gguf_writer_add_string(w, "tokenizer.ggml.model", model, e), DSI_OK);
    if (pre) assert_int_equal(dsii_gguf_writer_add_string(w, "tokenizer.ggml.pre", pre, e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens",
                     (const char *const *)v->tok, NULL, (uint64_t)v->n, e), DSI_OK);
    if (with_types)
        assert_int_equal(dsii_gguf_writer_add_array(w, "tokenizer.ggml.token_type", DSII_GGUF_I32,
                         v->type, (uint64_t)v->n, e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.merges",
                     (const char *const *)v->merge, NULL, (uint64_t)v->nm, e), DSI_OK);
    if (bos != -1) assert_int_equal(dsii_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos, e), DSI_OK);
    void *data;
    size_t size;
    assert_int_equal(dsii_gguf_writer_write_memory(w, &data, &size, e), DSI_OK);
    dsii_gguf_writer_free(w);
    dsii_gguf *g = NULL;
    assert_int_equal(dsii_gguf_open_memory(NULL, data, size, &g, e), DSI_OK);
    dsi_status st = dsii_tokenizer_load(NULL, g, t, e);
    dsii_gguf_close(g);
    dsii_free(NULL, data);
    return st;
}

static void test_gguf_load(void **state) {
    (void)state;
    vocab v;
    int ids[6];
    dsii_tokenizer_free(special_vocab(&v, ids));
    dsii_tokenizer *t = NULL;
    dsii_error e;
    assert_int_equal(load_from(&v, 1, "gpt2", "joyai-llm", -1, &t, &e), DSI_OK);
    assert_int_equal(dsii_tokenizer_n_vocab(t), v.n);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_USER), ids[2]);
    dsi_token out[8];
    assert_int_equal(tokenize(t, "hi", 2, 0, out, 8), 1);
    dsii_tokenizer_free(t);
    /* the bos key wins over the text */
    assert_int_equal(load_from(&v, 1, "gpt2", "joyai-llm", 'x', &t, &e), DSI_OK);
    assert_int_equal(dsii_tokenizer_special(t, DSI_SPECIAL_BOS), 'x');
    dsii_tokenizer_free(t);
    /* errors name the key */
    assert_int_equal(load_from(&v, 1, "llama", "joyai-llm", -1, &t, &e), DSI_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.model"));
    assert_null(t);
    assert_int_equal(load_from(&v, 1, "gpt2", "llama3", -1, &t, &e), DSI_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.pre"));
    assert_int_equal(load_from(&v, 1, NULL, "joyai-llm", -1, &t, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.model"));
    assert_int_equal(load_from(&v, 1, "gpt2", "joyai-llm", 100000, &t, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "bos_token_id"));
    /* a bad merge */
    free(v.merge[0]);
    v.merge[0] = strdup("h");
    assert_int_equal(load_from(&v, 1, "gpt2", "joyai-llm", -1, &t, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.merges[0]"));
    free(v.merge[0]);
    v.merge[0] = strdup("h zz");
    assert_int_equal(load_from(&v, 1, "gpt2", "joyai-llm", -1, &t, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "right part"));
    /* a missing byte token */
    free(v.merge[0]);
    v.merge[0] = strdup("h i");
    free(v.tok['q']);
    v.tok['q'] = strdup("qq-not-a-byte");
    assert_int_equal(load_from(&v, 1, "gpt2", "joyai-llm", -1, &t, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "0x71"));
    vocab_free(&v);
}

static void test_no_token_types(void **state) {
    (void)state;
    /* without token_type the §6 texts and non-alphabet spellings are special */
    vocab v;
    int ids[6];
    dsii_tokenizer_free(special_vocab(&v, ids));
    dsii_tokenizer *t = build(&v, 0);
    assert_true(dsii_tokenizer_is_special(t, ids[2]));
    assert_true(dsii_tokenizer_is_special(t, ids[4]));
    dsi_token out[64];
    size_t n = tokenize(t, "<think>", 7, DSI_TOKENIZE_PARSE_SPECIAL, out, 64);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], ids[4]);
    n = tokenize(t, "<think>", 7, 0, out, 64); /* pieces "<think" ">", and "hi" merges */
    assert_int_equal(n, 6);
    assert_int_equal(out[2], 256 + 6);
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

/* Random bytes (biased towards UTF-8 lead/continuation bytes, specials and whitespace):
 * never an error, always a byte-exact round trip, and the incremental decoder fed in random
 * chunks agrees with a single push and only ever emits well-formed UTF-8. */
static void test_random_roundtrip(void **state) {
    (void)state;
    vocab v;
    int ids[6];
    dsii_tokenizer *t = special_vocab(&v, ids);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    static const char *const frags[] = {"<think>", S_USER, "\xe4\xb8\xad", "\xf0\x9f\x98\x80", " ", "\n",
                                        "\r\n", "12345", "hi", "\xcc\x81", "\xe2\x80\x8d"};
    char buf[512];
    dsi_token out[1024];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0;
        while (n < 400) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            if ((x & 3) == 0) {
                const char *f = frags[(x >> 8) % (sizeof frags / sizeof frags[0])];
                size_t fl = strlen(f);
                if (n + fl > sizeof buf) break;
                memcpy(buf + n, f, fl);
                n += fl;
            } else {
                buf[n++] = (char)(x >> 24);
            }
            if (((x >> 40) & 31) == 0) break;
        }
        uint32_t fl = (iter & 1) ? DSI_TOKENIZE_PARSE_SPECIAL : 0;
        size_t nt = tokenize(t, buf, n, fl, out, 1024);
        char back[2048];
        size_t bn = 0;
        for (size_t i = 0; i < nt; i++) {
            size_t l;
            const uint8_t *p = dsii_tokenizer_token_bytes(t, out[i], &l);
            assert_non_null(p);
            if (!fl) assert_false(dsii_tokenizer_is_special(t, out[i]));
            memcpy(back + bn, p, l);
            bn += l;
        }
        assert_int_equal(bn, n);
        assert_memory_equal(back, buf, n);
        /* incremental decoding in chunks == one push */
        dsii_utf8_stream a = {{0}, 0}, b = {{0}, 0}, nx;
        uint8_t o1[2048], o2[2048];
        size_t l1 = dsii_utf8_stream_push(&a, (const uint8_t *)buf, n, o1, &nx);
        l1 += dsii_utf8_stream_flush(&nx, o1 + l1);
        size_t l2 = 0, pos = 0;
        while (pos < n) {
            size_t step = 1 + (size_t)((x >> (pos % 50)) % 5);
            if (pos + step > n) step = n - pos;
            l2 += dsii_utf8_stream_push(&b, (const uint8_t *)buf + pos, step, o2 + l2, &nx);
            b = nx;
            pos += step;
        }
        l2 += dsii_utf8_stream_flush(&b, o2 + l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(o1, o2, l1);
        for (size_t k = 0; k < l1;) {
            int r = dsii_utf8_check(o1 + k, l1 - k);
            assert_true(r > 0);
            k += (size_t)r;
        }
    }
    dsii_tokenizer_free(t);
    vocab_free(&v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unicode_classes),
        cmocka_unit_test(test_unicode_tables_fresh),
        cmocka_unit_test(test_utf8_decoder),
        cmocka_unit_test(test_pretokenizer),
        cmocka_unit_test(test_bpe_merges),
        cmocka_unit_test(test_long_input_linear),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_two_call_and_flags),
        cmocka_unit_test(test_invalid_utf8_bytewise),
        cmocka_unit_test(test_utf8_stream),
        cmocka_unit_test(test_gguf_load),
        cmocka_unit_test(test_no_token_types),
        cmocka_unit_test(test_random_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
