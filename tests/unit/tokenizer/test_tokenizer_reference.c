/*
 * Cross-check of lib/tokenizer against the independent Python reference
 * (tests/reference/tokenizer.py): a corpus of hard strings is tokenized by both, with and
 * without DSI_TOKENIZE_PARSE_SPECIAL, and the ids must be identical; every string must also
 * round-trip through tokenize / detokenize byte-exactly.
 *
 * Vocabularies: (1) one built here — the 256 byte tokens, DeepSeek special tokens as control
 * tokens, and 600 merges learned from the corpus by a plain pair-count BPE trainer (so the
 * merges reach across CJK, emoji, digits, whitespace and punctuation); (2) the build's
 * tiny-v41.gguf from dsinfer-mkmodel, when it exists.
 * Skips (77) when /usr/bin/python3 or its `regex` module is missing.
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
#include <sys/wait.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tests/common/skip.h"

typedef struct { const char *s; size_t n; } str;
#define L(x) {x, sizeof(x) - 1}

static const str corpus[] = {
    L("Hello world"), L("Hello, World! How are you?\n"), L("  leading spaces"),
    L("trailing spaces   "), L("tabs\tand\t\ttabs"), L("crlf\r\nline\r\n\r\nend"),
    L("mixed \t \n \r\n  whitespace\n\n\n"), L("\n"), L(" "), L("  "), L("\t"),
    L("1"), L("12"), L("123"), L("1234"), L("12345"), L("123456"), L("1234567"),
    L("12345678"), L("123456789"), L("1234567890"), L("12345678901"), L("123456789012"),
    L("pi = 3.14159, e = 2.71828; 1,000,000 and 10^9."), L("x1y22z333w4444"),
    L("\xe4\xb8\xad\xe6\x96\x87\xe6\xb5\x8b\xe8\xaf\x95"),                       /* 中文测试 */
    L("\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81"), /* 你好，世界！ */
    L("\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf\xe3\x80\x81\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a\xe3\x83\xbb\xe3\x83\x86\xe3\x82\xb9\xe3\x83\x88"),
    L("abc\xe4\xb8\xad\xe6\x96\x87" "def 123\xe5\xb9\xb4"),
    L("\xe3\x82\xac\xe3\x82\x99\xe3\x83\xbc\xe3\x83\xab"),                        /* kana + combining */
    L("\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8c\xec\x8a\xa4\xed\x8a\xb8"), /* Korean */
    L("\xf0\x9f\x98\x80\xf0\x9f\x98\x83 smile \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd"),
    L("\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7\xe2\x80\x8d\xf0\x9f\x91\xa6 family"),
    L("\xf0\x9f\x8f\xb3\xef\xb8\x8f\xe2\x80\x8d\xf0\x9f\x8c\x88 flag"),
    L("e\xcc\x81t\xc3\xa9 cafe\xcc\x81 na\xc3\xafve r\xc3\xa9sum\xc3\xa9"),        /* combining vs composed */
    L(" \xcc\x81\xcc\x82 marks alone"), L("\xc3\x85ngstr\xc3\xb6m \xc3\x98re \xc5\x81\xc3\xb3" "d\xc5\xba"),
    L("\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80!"), /* Привет, мир! */
    L("\xce\x9a\xce\xb1\xce\xbb\xce\xb7\xce\xbc\xce\xad\xcf\x81\xce\xb1"),
    L("\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd9\xa1\xd9\xa2\xd9\xa3"),        /* Arabic + digits */
    L("\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87"), /* Devanagari */
    L("\xc2\xab" "quoted\xc2\xbb \xe2\x80\x94" "dash \xe2\x80\x9c" "smart\xe2\x80\x9d"),
    L("\xc2\xb2\xc2\xb3 \xe2\x85\xa7 \xe3\x80\x87 \xc2\xbd"),                     /* No, Nl */
    L("$100 + 200\xe2\x82\xac = ???"), L("a+b=c; if(x){y();}\n"),
    L("int main(void) {\n    return 0;\n}\n"), L("#include <stdio.h>\n\n"),
    L("end.\n\n\nNew paragraph."), L(";;;\n\n"), L("!!!???\r\n"), L("(...)\n  "),
    L("don't can't I'm we'll they've"), L("'quoted' \"double\" `back`"),
    L("http://example.com/path?q=1&r=2#frag"), L("snake_case camelCase PascalCase"),
    L("\xe3\x80\x80\xe3\x80\x80ideographic spaces\xe3\x80\x80"),
    L("nbsp\xc2\xa0here\xe2\x80\x80" "en quad\xe2\x80\xa8line sep"),
    L("\x1c\x1d\x1e\x1f control"), L("a\0b\0"), L("\x7f" "del"),
    L("\xff\xfe invalid"), L("\x80\x80 lone continuation"), L("\xc0\xaf overlong"),
    L("\xe0\x80\xaf overlong3"), L("\xed\xa0\x80 surrogate"), L("\xf4\x90\x80\x80 too big"),
    L("trunc\xe4\xb8"), L("\xe4\xb8" "a mid"), L("\xf0\x9f\x98"), L("\xffword"),
    L("<\xef\xbd\x9cUser\xef\xbd\x9c>hello<\xef\xbd\x9c" "Assistant\xef\xbd\x9c></think>Hi<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    L("<think>reasoning</think>answer"), L("<thinking> not special </thinking>"),
    L("<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>"),
    L("x<think>y</think>z<think"), L("<<think>>"),
    L("   \n   \n\t\t\n"), L("word\n\n  indented"), L("a  1  b"), L("UPPER lower MiXeD"),
};
#define N_CORPUS (sizeof corpus / sizeof corpus[0])

/* ---- vocabulary: bytes + specials + trained merges ------------------------------------- */

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

#define MAXV 2048
typedef struct {
    char *tok[MAXV];
    int32_t type[MAXV];
    int n;
    char *merge[MAXV];
    int nm;
} vocab;

static int add_tok(vocab *v, const char *s, int32_t type) {
    v->tok[v->n] = strdup(s);
    v->type[v->n] = type;
    return v->n++;
}

static void train(vocab *v, int n_merges) {
    /* sequences of token ids, one per corpus string */
    int *seq[N_CORPUS];
    size_t len[N_CORPUS];
    for (size_t c = 0; c < N_CORPUS; c++) {
        seq[c] = malloc((corpus[c].n + 1) * sizeof(int));
        len[c] = corpus[c].n;
        for (size_t i = 0; i < corpus[c].n; i++) seq[c][i] = (unsigned char)corpus[c].s[i];
    }
    for (int m = 0; m < n_merges; m++) {
        /* count pairs (open addressing on the pair; 1 << 14 slots >> distinct pairs) */
        enum { HS = 1 << 14 };
        static int pa[HS], pb[HS], pc[HS];
        for (int k = 0; k < HS; k++) pc[k] = 0;
        for (size_t c = 0; c < N_CORPUS; c++)
            for (size_t i = 0; i + 1 < len[c]; i++) {
                int a = seq[c][i], b = seq[c][i + 1];
                unsigned h = ((unsigned)a * 2654435761u ^ (unsigned)b * 40503u) & (HS - 1);
                while (pc[h] && (pa[h] != a || pb[h] != b)) h = (h + 1) & (HS - 1);
                pa[h] = a;
                pb[h] = b;
                pc[h]++;
            }
        int best = -1;
        for (int k = 0; k < HS; k++)
            if (pc[k] >= 2 && (best < 0 || pc[k] > pc[best] ||
                               (pc[k] == pc[best] && (pa[k] < pa[best] || (pa[k] == pa[best] && pb[k] < pb[best])))))
                best = k;
        if (best < 0) break;
        int a = pa[best], b = pb[best];
        char *cat = malloc(strlen(v->tok[a]) + strlen(v->tok[b]) + 2);
        sprintf(cat, "%s %s", v->tok[a], v->tok[b]);
        v->merge[v->nm++] = cat;
        char *joined = malloc(strlen(cat) + 1);
        sprintf(joined, "%s%s", v->tok[a], v->tok[b]);
        int id = add_tok(v, joined, 1);
        free(joined);
        for (size_t c = 0; c < N_CORPUS; c++) {
            size_t o = 0;
            for (size_t i = 0; i < len[c]; i++) {
                if (i + 1 < len[c] && seq[c][i] == a && seq[c][i + 1] == b) { seq[c][o++] = id; i++; }
                else seq[c][o++] = seq[c][i];
            }
            len[c] = o;
        }
    }
    for (size_t c = 0; c < N_CORPUS; c++) free(seq[c]);
}

static void build_vocab(vocab *v) {
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        char s[3];
        spell_byte(b, s);
        add_tok(v, s, 1);
    }
    train(v, 600);
    static const char *const specials[] = {
        "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>", "<\xef\xbd\x9cUser\xef\xbd\x9c>",
        "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", "<think>", "</think>",
        "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>",
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) add_tok(v, specials[i], 3);
}

static void vocab_free(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    for (int i = 0; i < v->nm; i++) free(v->merge[i]);
}

static void write_gguf(vocab *v, const char *path) {
    dsii_error e;
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    assert_non_null(w);
    assert_int_equal(dsii_gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2", &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_string(w, "tokenizer.ggml.pre", "joyai-llm", &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens",
                     (const char *const *)v->tok, NULL, (uint64_t)v->n, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_array(w, "tokenizer.ggml.token_type", DSII_GGUF_I32,
                     v->type, (uint64_t)v->n, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.merges",
                     (const char *const *)v->merge, NULL, (uint64_t)v->nm, &e), DSI_OK);
    if (dsii_gguf_writer_write_path(w, path, &e) != DSI_OK) fail_msg("write %s: %s", path, e.msg);
    dsii_gguf_writer_free(w);
}

/* ---- comparison ------------------------------------------------------------------------ */

static const char *py(void) {
    const char *p = getenv("DSI_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}

/* Runs the reference on `gguf` for every corpus string × {plain, special}; returns 0 when
 * all ids agree (main() checked that the reference can run). */
static int compare_with_reference(const char *gguf, const char *tag) {
    const char *src = getenv("DSI_SOURCE_DIR"), *bld = getenv("DSI_BUILD_DIR");
    if (!src || !bld) fail_msg("DSI_SOURCE_DIR / DSI_BUILD_DIR not set (run through ctest / meson test)");
    char cases[4096], outp[4096], cmd[16384];
    snprintf(cases, sizeof cases, "%s/tests/tokref_%s_cases.txt", bld, tag);
    snprintf(outp, sizeof outp, "%s/tests/tokref_%s_out.txt", bld, tag);
    FILE *f = fopen(cases, "w");
    assert_non_null(f);
    for (int flags = 0; flags < 2; flags++)
        for (size_t c = 0; c < N_CORPUS; c++) {
            fprintf(f, "%d ", flags);
            for (size_t i = 0; i < corpus[c].n; i++) fprintf(f, "%02x", (unsigned char)corpus[c].s[i]);
            fprintf(f, "\n");
        }
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s/tests/reference/tokenizer.py --gguf %s --cases %s > %s",
             py(), src, gguf, cases, outp);
    int rc = system(cmd);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) fail_msg("the tokenizer reference failed: %s", cmd);

    dsii_gguf *g = NULL;
    dsii_tokenizer *t = NULL;
    dsii_error e;
    if (dsii_gguf_open_path(NULL, gguf, DSII_FILE_MMAP, &g, &e) != DSI_OK) fail_msg("%s", e.msg);
    if (dsii_tokenizer_load(NULL, g, &t, &e) != DSI_OK) fail_msg("%s", e.msg);
    dsii_gguf_close(g);

    FILE *o = fopen(outp, "r");
    assert_non_null(o);
    char *line = NULL;
    size_t cap = 0;
    int mismatches = 0;
    static dsi_token ids[1 << 16], back_ids[1 << 16];
    for (int flags = 0; flags < 2; flags++)
        for (size_t c = 0; c < N_CORPUS; c++) {
            ssize_t r = getline(&line, &cap, o);
            assert_true(r >= 0);
            size_t nref = 0;
            for (char *p = line; *p && *p != '\n';) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                ids[nref++] = (dsi_token)v;
                p = end;
            }
            size_t n = 0;
            uint32_t fl = flags ? DSI_TOKENIZE_PARSE_SPECIAL : 0;
            assert_int_equal(dsii_tokenize(t, corpus[c].s, corpus[c].n, fl, back_ids, 1 << 16, &n, &e), DSI_OK);
            int same = n == nref && memcmp(ids, back_ids, n * sizeof *ids) == 0;
            if (!same) {
                mismatches++;
                fprintf(stderr, "[%s] case %zu flags %d: C gives %zu ids, reference %zu\n  C  :", tag, c, flags, n, nref);
                for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", back_ids[i]);
                fprintf(stderr, "\n  ref:");
                for (size_t i = 0; i < nref && i < 40; i++) fprintf(stderr, " %d", ids[i]);
                fprintf(stderr, "\n");
            }
            /* byte-exact round trip */
            size_t total = 0;
            for (size_t i = 0; i < n; i++) {
                size_t l;
                const uint8_t *p = dsii_tokenizer_token_bytes(t, back_ids[i], &l);
                assert_non_null(p);
                if (total + l > corpus[c].n || memcmp(corpus[c].s + total, p, l) != 0) {
                    fail_msg("[%s] case %zu does not round-trip at byte %zu", tag, c, total);
                }
                total += l;
            }
            assert_int_equal(total, corpus[c].n);
        }
    free(line);
    fclose(o);
    dsii_tokenizer_free(t);
    assert_int_equal(mismatches, 0);
    remove(cases);
    remove(outp);
    return 0;
}

static void test_reference_trained_vocab(void **state) {
    (void)state;
    const char *bld = getenv("DSI_BUILD_DIR");
    if (!bld) fail_msg("DSI_BUILD_DIR not set (run through ctest / meson test)");
    static vocab v;
    build_vocab(&v);
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/tokref_vocab.gguf", bld);
    write_gguf(&v, path);
    int rc = compare_with_reference(path, "trained");
    vocab_free(&v);
    remove(path);
    assert_int_equal(rc, 0);
}

static void test_reference_tiny_model(void **state) {
    (void)state;
    const char *dir = getenv("DSI_MODELS_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny-v41.gguf", dir ? dir : ".");
    if (!dir || access(path, R_OK) != 0)
        DSIT_SKIP_TEST("MODELS", "%s not built (dsinfer-mkmodel)", path);
    assert_int_equal(compare_with_reference(path, "tiny"), 0);
}

int main(void) {
    /* The whole program is a skip when the reference cannot run at all. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s -c 'import regex' 2>/dev/null", py());
    if (access(py(), X_OK) != 0 || system(cmd) != 0)
        return dsit_absent("PYTHON", "%s with the regex module (Debian python3-regex) is needed",
                           py());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_trained_vocab),
        cmocka_unit_test(test_reference_tiny_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
