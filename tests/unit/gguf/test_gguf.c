/*
 * GGUF reader / writer (lib/gguf/gguf.h) and file access (lib/base/file.h).
 *
 * 1. writer → reader round trip of every value type (incl. nested arrays, strings with NUL
 *    bytes) and of tensors of several types, in all four access modes (memory, mmap, pread,
 *    reader callbacks); deterministic output.
 * 2. a corpus of malformed files built byte by byte here: every one must give the right
 *    status and a message naming the culprit, in every access mode, without leaks.
 * 3. truncation of a valid file at every byte.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

/* ---- byte builder ---------------------------------------------------------------------- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_raw(bb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        b->p = realloc(b->p, c);
        assert_non_null(b->p);
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void bb_le(bb *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    bb_raw(b, t, (size_t)n);
}
static void bb_u32(bb *b, uint32_t v) { bb_le(b, v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_le(b, v, 8); }
static void bb_str(bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_raw(b, s, strlen(s));
}
static void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_raw(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, DSII_GGUF_U32);
    bb_u32(b, v);
}
static void bb_tensor(bb *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                      uint64_t off) {
    bb_str(b, name);
    bb_u32(b, nd);
    for (uint32_t d = 0; d < nd; d++) bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, off);
}
static void bb_pad(bb *b, size_t align) {
    while (b->n % align) bb_le(b, 0, 1);
}
static void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_le(b, 0, 1);
}

/* ---- opening in every mode ------------------------------------------------------------- */

enum { M_MEMORY, M_READER, M_PREAD, M_MMAP, M_COUNT };
static const char *const k_mode_names[M_COUNT] = {"memory", "reader", "pread", "mmap"};

typedef struct mem_reader {
    const uint8_t *data;
    uint64_t size;
    int closes;
    int fail_reads; /* make pread_fn fail */
} mem_reader;

static int32_t mr_pread(void *user, void *buf, uint64_t size, uint64_t offset) {
    mem_reader *m = user;
    if (m->fail_reads) return -1;
    if (offset > m->size || size > m->size - offset) return -1;
    memcpy(buf, m->data + offset, (size_t)size);
    return 0;
}
static void mr_close(void *user) { ((mem_reader *)user)->closes++; }

static char g_tmpdir[512];

static int setup_tmp(void **state) {
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/dsi_gguf_XXXXXX", t && *t ? t : "/tmp");
    int fd = mkstemp(g_tmpdir);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}
static int teardown_tmp(void **state) {
    (void)state;
    unlink(g_tmpdir);
    return 0;
}

static void write_tmp(const uint8_t *d, size_t n) {
    FILE *f = fopen(g_tmpdir, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(d, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Opens (d, n) in `mode`; for M_READER, *mr must outlive the returned gguf. */
static dsi_status open_mode(int mode, const uint8_t *d, size_t n, mem_reader *mr, dsii_gguf **g,
                            dsii_error *e) {
    dsii_error_clear(e);
    memset(mr, 0, sizeof *mr);
    switch (mode) {
    case M_MEMORY:
        return dsii_gguf_open_memory(NULL, d, n, g, e);
    case M_READER: {
        mr->data = d;
        mr->size = n;
        mr->closes = 0;
        dsi_reader r;
        dsi_reader_init(&r);
        r.size = n;
        r.pread_fn = mr_pread;
        r.close_fn = mr_close;
        r.user_data = mr;
        return dsii_gguf_open_reader(NULL, &r, g, e);
    }
    default:
        write_tmp(d, n);
        return dsii_gguf_open_path(NULL, g_tmpdir, mode == M_PREAD ? DSII_FILE_PREAD : DSII_FILE_MMAP,
                                   g, e);
    }
}

static void expect_bad(const uint8_t *d, size_t n, dsi_status want, const char *what) {
    for (int m = 0; m < M_COUNT; m++) {
        dsii_gguf *g = (dsii_gguf *)(uintptr_t)1;
        dsii_error e;
        mem_reader mr;
        dsi_status st = open_mode(m, d, n, &mr, &g, &e);
        if (st != want)
            fail_msg("[%s] expected status %d, got %d (%s)", k_mode_names[m], (int)want, (int)st,
                     e.msg);
        assert_null(g);
        assert_int_equal(e.status, want);
        if (!strstr(e.msg, what))
            fail_msg("[%s] message \"%s\" does not contain \"%s\"", k_mode_names[m], e.msg, what);
        if (m == M_READER) assert_int_equal(mr.closes, 1);
    }
}

static void expect_bad_bb(bb *b, dsi_status want, const char *what) {
    expect_bad(b->p, b->n, want, what);
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- the reference file ---------------------------------------------------------------- */

static const float k_f32_data[15] = {1, -2, 3.5f, 0, -0.25f, 1e-20f, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const int32_t k_i32_data[6] = {-1, 0, 1, 2147483647, -2147483647 - 1, 42};

static int fill_pattern(void *user, void *dst, uint64_t n) {
    (void)user;
    for (uint64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(i * 7 + 1);
    return 0;
}

static dsii_gguf_writer *build_reference(uint32_t alignment) {
    dsii_error e;
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    assert_non_null(w);
#define OK(x) do { dsi_status s_ = (x); if (s_ != DSI_OK) fail_msg("%s: %s", #x, e.msg); } while (0)
    OK(dsii_gguf_writer_set_alignment(w, alignment, &e));
    OK(dsii_gguf_writer_add_string(w, "general.architecture", "deepseek4", &e));
    OK(dsii_gguf_writer_add_u8(w, "t.u8", 200, &e));
    OK(dsii_gguf_writer_add_i8(w, "t.i8", -100, &e));
    OK(dsii_gguf_writer_add_u16(w, "t.u16", 65535, &e));
    OK(dsii_gguf_writer_add_i16(w, "t.i16", -32768, &e));
    OK(dsii_gguf_writer_add_u32(w, "t.u32", 4000000000u, &e));
    OK(dsii_gguf_writer_add_i32(w, "t.i32", -7, &e));
    OK(dsii_gguf_writer_add_f32(w, "t.f32", 0.5f, &e));
    OK(dsii_gguf_writer_add_bool(w, "t.bool", 1, &e));
    OK(dsii_gguf_writer_add_u64(w, "t.u64", UINT64_MAX, &e));
    OK(dsii_gguf_writer_add_i64(w, "t.i64", INT64_MIN, &e));
    OK(dsii_gguf_writer_add_f64(w, "t.f64", 1e300, &e));
    OK(dsii_gguf_writer_add_string_n(w, "t.nul", "a\0b", 3, &e));
    OK(dsii_gguf_writer_add_string(w, "t.empty", "", &e));
    uint8_t u8a[100];
    for (int i = 0; i < 100; i++) u8a[i] = (uint8_t)i;
    OK(dsii_gguf_writer_add_array(w, "a.u8", DSII_GGUF_U8, u8a, 100, &e));
    int8_t i8a[3] = {-1, 0, 1};
    OK(dsii_gguf_writer_add_array(w, "a.i8", DSII_GGUF_I8, i8a, 3, &e));
    uint16_t u16a[2] = {1, 65535};
    OK(dsii_gguf_writer_add_array(w, "a.u16", DSII_GGUF_U16, u16a, 2, &e));
    int16_t i16a[2] = {-32768, 5};
    OK(dsii_gguf_writer_add_array(w, "a.i16", DSII_GGUF_I16, i16a, 2, &e));
    uint32_t u32a[3] = {1, 2, 3};
    OK(dsii_gguf_writer_add_array(w, "a.u32", DSII_GGUF_U32, u32a, 3, &e));
    OK(dsii_gguf_writer_add_array(w, "a.i32", DSII_GGUF_I32, k_i32_data, 6, &e));
    float f32a[2] = {0.25f, -1e-3f};
    OK(dsii_gguf_writer_add_array(w, "a.f32", DSII_GGUF_F32, f32a, 2, &e));
    uint8_t boola[3] = {1, 0, 1};
    OK(dsii_gguf_writer_add_array(w, "a.bool", DSII_GGUF_BOOL, boola, 3, &e));
    uint64_t u64a[2] = {UINT64_MAX, 76632096046245ull};
    OK(dsii_gguf_writer_add_array(w, "a.u64", DSII_GGUF_U64, u64a, 2, &e));
    int64_t i64a[2] = {INT64_MIN, -5};
    OK(dsii_gguf_writer_add_array(w, "a.i64", DSII_GGUF_I64, i64a, 2, &e));
    double f64a[1] = {-2.5};
    OK(dsii_gguf_writer_add_array(w, "a.f64", DSII_GGUF_F64, f64a, 1, &e));
    OK(dsii_gguf_writer_add_array(w, "a.empty", DSII_GGUF_U32, NULL, 0, &e));
    const char *toks[4] = {"<s>", "", "hello", "\xE2\x96\x81world"};
    OK(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", toks, NULL, 4, &e));
    /* nested: [[1, 2, 3], ["a", "bc"]] */
    bb n = {0};
    bb_u32(&n, DSII_GGUF_ARRAY);
    bb_u64(&n, 2);
    bb_u32(&n, DSII_GGUF_U32);
    bb_u64(&n, 3);
    bb_u32(&n, 1);
    bb_u32(&n, 2);
    bb_u32(&n, 3);
    bb_u32(&n, DSII_GGUF_STRING);
    bb_u64(&n, 2);
    bb_str(&n, "a");
    bb_str(&n, "bc");
    OK(dsii_gguf_writer_add_kv_raw(w, "a.nested", DSII_GGUF_ARRAY, n.p, n.n, &e));
    free(n.p);

    int64_t ne_f32[2] = {5, 3};
    OK(dsii_gguf_writer_add_tensor(w, "t.f32", DSI_TYPE_F32, 2, ne_f32, k_f32_data,
                                   sizeof k_f32_data, &e));
    float src[64 * 2];
    for (int i = 0; i < 128; i++) src[i] = (float)(i - 64) / 16.0f;
    int64_t ne_q8[2] = {64, 2};
    OK(dsii_gguf_writer_add_tensor_f32(w, "t.q8_0", DSI_TYPE_Q8_0, 2, ne_q8, src, &e));
    int64_t ne_fp8[2] = {130, 1};
    float src2[130];
    for (int i = 0; i < 130; i++) src2[i] = (float)i * 0.125f;
    OK(dsii_gguf_writer_add_tensor_f32(w, "t.fp8", DSI_TYPE_FP8_E4M3_B128, 2, ne_fp8, src2, &e));
    int64_t ne_i32[1] = {6};
    OK(dsii_gguf_writer_add_tensor_ref(w, "t.i32", DSI_TYPE_I32, 1, ne_i32, k_i32_data,
                                       sizeof k_i32_data, &e));
    int64_t ne_fn[4] = {3, 1, 2, 2};
    OK(dsii_gguf_writer_add_tensor_fn(w, "t.fn", DSI_TYPE_BF16, 4, ne_fn, fill_pattern, NULL, &e));
#undef OK
    return w;
}

static void check_reference(dsii_gguf *g, uint32_t alignment, int mode) {
    dsii_error e;
    dsii_error_clear(&e);
    assert_int_equal(dsii_gguf_version(g), 3);
    assert_int_equal(dsii_gguf_alignment(g), alignment);
    assert_int_equal(dsii_gguf_data_offset(g) % alignment, 0);
    const char *s = NULL;
    size_t len = 0;
    assert_int_equal(dsii_gguf_get_string(g, "general.architecture", &s, &len, &e), DSI_OK);
    assert_string_equal(s, "deepseek4");
    assert_int_equal(len, 9);
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    int b;
    assert_int_equal(dsii_gguf_get_u32(g, "t.u8", &u32, &e), DSI_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(dsii_gguf_get_i32(g, "t.i8", &i32, &e), DSI_OK);
    assert_int_equal(i32, -100);
    assert_int_equal(dsii_gguf_get_u32(g, "t.u16", &u32, &e), DSI_OK);
    assert_int_equal(u32, 65535);
    assert_int_equal(dsii_gguf_get_i64(g, "t.i16", &i64, &e), DSI_OK);
    assert_int_equal(i64, -32768);
    assert_int_equal(dsii_gguf_get_u32(g, "t.u32", &u32, &e), DSI_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(dsii_gguf_get_i32(g, "t.i32", &i32, &e), DSI_OK);
    assert_int_equal(i32, -7);
    assert_int_equal(dsii_gguf_get_f32(g, "t.f32", &f32, &e), DSI_OK);
    assert_true(f32 == 0.5f);
    assert_int_equal(dsii_gguf_get_bool(g, "t.bool", &b, &e), DSI_OK);
    assert_int_equal(b, 1);
    assert_int_equal(dsii_gguf_get_u64(g, "t.u64", &u64, &e), DSI_OK);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(dsii_gguf_get_i64(g, "t.i64", &i64, &e), DSI_OK);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(dsii_gguf_get_f64(g, "t.f64", &f64, &e), DSI_OK);
    assert_true(f64 == 1e300);
    assert_int_equal(dsii_gguf_get_string(g, "t.nul", &s, &len, &e), DSI_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "a\0b", 4);
    assert_int_equal(dsii_gguf_get_string(g, "t.empty", &s, &len, &e), DSI_OK);
    assert_int_equal(len, 0);
    assert_string_equal(s, "");

    /* arrays */
    uint32_t et;
    uint64_t n;
    assert_int_equal(dsii_gguf_get_array(g, "a.u8", &et, &n, &e), DSI_OK);
    assert_int_equal(et, DSII_GGUF_U8);
    assert_int_equal(n, 100);
    int64_t k = dsii_gguf_find_key(g, "a.u8");
    assert_true(k >= 0);
    const uint8_t *u8p = dsii_gguf_arr_data(g, k);
    for (int i = 0; i < 100; i++) assert_int_equal(u8p[i], i);
    int32_t i32a[6];
    assert_int_equal(dsii_gguf_get_arr_i32(g, "a.i32", i32a, 6, &n, &e), DSI_OK);
    assert_memory_equal(i32a, k_i32_data, sizeof i32a);
    uint32_t u32a[3];
    assert_int_equal(dsii_gguf_get_arr_u32(g, "a.u32", u32a, 3, &n, &e), DSI_OK);
    assert_int_equal(u32a[2], 3);
    assert_int_equal(dsii_gguf_get_arr_u32(g, "a.u16", u32a, 3, &n, &e), DSI_OK);
    assert_int_equal(u32a[1], 65535);
    assert_int_equal(dsii_gguf_get_arr_u32(g, "a.bool", u32a, 3, &n, &e), DSI_OK);
    assert_int_equal(u32a[0], 1);
    int64_t i64a[2];
    assert_int_equal(dsii_gguf_get_arr_i64(g, "a.i64", i64a, 2, &n, &e), DSI_OK);
    assert_true(i64a[0] == INT64_MIN && i64a[1] == -5);
    assert_int_equal(dsii_gguf_get_arr_i64(g, "a.i16", i64a, 2, &n, &e), DSI_OK);
    assert_true(i64a[0] == -32768 && i64a[1] == 5);
    assert_int_equal(dsii_gguf_get_arr_i64(g, "a.i8", i64a, 2, &n, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(n, 3);
    uint64_t u64a[2];
    assert_int_equal(dsii_gguf_get_arr_u64(g, "a.u64", u64a, 2, &n, &e), DSI_OK);
    assert_true(u64a[0] == UINT64_MAX && u64a[1] == 76632096046245ull);
    float fa[2];
    assert_int_equal(dsii_gguf_get_arr_f32(g, "a.f32", fa, 2, &n, &e), DSI_OK);
    assert_true(fa[0] == 0.25f && fa[1] == -1e-3f);
    assert_int_equal(dsii_gguf_get_arr_f32(g, "a.f64", fa, 2, &n, &e), DSI_OK);
    assert_true(fa[0] == -2.5f && n == 1);
    assert_int_equal(dsii_gguf_get_array(g, "a.empty", &et, &n, &e), DSI_OK);
    assert_int_equal(n, 0);
    k = dsii_gguf_find_key(g, "tokenizer.ggml.tokens");
    assert_int_equal(dsii_gguf_arr_type(g, k), DSII_GGUF_STRING);
    assert_int_equal(dsii_gguf_arr_len(g, k), 4);
    assert_string_equal(dsii_gguf_arr_str(g, k, 0, &len), "<s>");
    assert_string_equal(dsii_gguf_arr_str(g, k, 1, &len), "");
    assert_int_equal(len, 0);
    assert_string_equal(dsii_gguf_arr_str(g, k, 3, &len), "\xE2\x96\x81world");
    assert_null(dsii_gguf_arr_str(g, k, 4, &len));
    assert_null(dsii_gguf_arr_data(g, k));
    /* nested */
    k = dsii_gguf_find_key(g, "a.nested");
    const dsii_gguf_value *v = dsii_gguf_kv_val(g, k);
    assert_int_equal(dsii_gguf_val_arr_type(v), DSII_GGUF_ARRAY);
    assert_int_equal(dsii_gguf_val_arr_len(v), 2);
    const dsii_gguf_value *c0 = dsii_gguf_val_arr_elem(g, v, 0);
    assert_int_equal(dsii_gguf_val_arr_type(c0), DSII_GGUF_U32);
    assert_int_equal(dsii_gguf_val_arr_len(c0), 3);
    assert_null(dsii_gguf_val_arr_elem(g, v, 2));
    char buf[256];
    size_t need;
    assert_true(dsii_gguf_kv_render(g, k, buf, sizeof buf, &need));
    assert_string_equal(buf, "[[1, 2, 3], [a, bc]]");
    assert_int_equal(need, strlen(buf));

    /* tensors */
    assert_int_equal(dsii_gguf_n_tensors(g), 5);
    const dsii_gguf_tensor *t = dsii_gguf_find_tensor(g, "t.f32");
    assert_non_null(t);
    assert_int_equal(t->type, DSI_TYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_true(t->ne[0] == 5 && t->ne[1] == 3 && t->ne[2] == 1 && t->ne[3] == 1);
    assert_int_equal(t->nbytes, 60);
    assert_int_equal(t->n_elements, 15);
    assert_int_equal(t->offset % alignment, 0);
    float fb[15];
    assert_int_equal(dsii_gguf_tensor_read(g, t, 0, 60, fb, &e), DSI_OK);
    assert_memory_equal(fb, k_f32_data, 60);
    const void *p = dsii_gguf_tensor_data(g, t);
    if (mode == M_MEMORY || mode == M_MMAP) {
        assert_non_null(p);
        assert_memory_equal(p, k_f32_data, 60);
    } else {
        assert_null(p);
    }
    assert_int_equal(dsii_gguf_tensor_read(g, t, 1, 60, fb, &e), DSI_ERR_INVALID_ARGUMENT);
    t = dsii_gguf_find_tensor(g, "t.q8_0");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 4 * 34);
    uint8_t q[68];
    float deq[64];
    assert_int_equal(dsii_gguf_tensor_read(g, t, 34, 34, q, &e), DSI_OK);
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_Q8_0, q, deq, 32, &e), DSI_OK);
    assert_true(fabsf(deq[5] - (float)(37 - 64) / 16.0f) < 0.02f); /* block 1 = elements 32.. */
    t = dsii_gguf_find_tensor(g, "t.fp8");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 2 * 129);
    uint8_t f8[258];
    float d8[130];
    assert_int_equal(dsii_gguf_tensor_read(g, t, 0, 258, f8, &e), DSI_OK);
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_FP8_E4M3_B128, f8, d8, 130, &e), DSI_OK);
    assert_true(d8[129] == 16.0f); /* see test_fp8_value_in_file */
    assert_true(d8[1] == 0.125f);
    t = dsii_gguf_find_tensor(g, "t.fn");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->nbytes, 3 * 1 * 2 * 2 * 2);
    uint8_t fnb[24];
    assert_int_equal(dsii_gguf_tensor_read(g, t, 0, 24, fnb, &e), DSI_OK);
    for (int i = 0; i < 24; i++) assert_int_equal(fnb[i], (uint8_t)(i * 7 + 1));
    assert_null(dsii_gguf_find_tensor(g, "nope"));
    assert_null(dsii_gguf_tensor_at(g, 5));
    assert_string_equal(dsii_gguf_tensor_at(g, 4)->name, "t.fn");
    assert_int_equal(dsii_gguf_find_key(g, "nope"), -1);
}

static void test_roundtrip(void **state) {
    (void)state;
    uint32_t aligns[3] = {32, 64, 1};
    for (int a = 0; a < 3; a++) {
        dsii_gguf_writer *w = build_reference(aligns[a]);
        void *data;
        size_t size;
        dsii_error e;
        assert_int_equal(dsii_gguf_writer_write_memory(w, &data, &size, &e), DSI_OK);
        assert_int_equal(size, dsii_gguf_writer_size(w));
        for (int m = 0; m < M_COUNT; m++) {
            dsii_gguf *g = NULL;
            mem_reader mr;
            dsi_status st = open_mode(m, data, size, &mr, &g, &e);
            if (st != DSI_OK) fail_msg("[%s] %s", k_mode_names[m], e.msg);
            check_reference(g, aligns[a], m);
            dsii_gguf_close(g);
            if (m == M_READER) assert_int_equal(mr.closes, 1);
        }
        dsii_free(NULL, data);
        dsii_gguf_writer_free(w);
    }
}

static void test_fp8_value_in_file(void **state) {
    (void)state;
    /* 129 * 0.125 = 16.125: block 2 holds only that value, amax 16.125 → s = 2^-4,
     * 16.125 / s = 258 → e4m3 RNE (step 32 in [256, 448)) → 256 → 16.0. Then values in
     * block 1 (0 .. 15.875) use s = 2^-4 as well. This checks the writer used quantize_row. */
    float x = 16.125f;
    uint8_t blk[129];
    assert_int_equal(dsii_quantize_row(DSI_TYPE_FP8_E4M3_B128, &x, blk, 1, NULL), DSI_OK);
    float y;
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_FP8_E4M3_B128, blk, &y, 1, NULL), DSI_OK);
    assert_true(y == 16.0f);
}

static void test_deterministic(void **state) {
    (void)state;
    dsii_gguf_writer *w1 = build_reference(64), *w2 = build_reference(64);
    void *d1, *d2, *d3;
    size_t s1, s2, s3;
    dsii_error e;
    assert_int_equal(dsii_gguf_writer_write_memory(w1, &d1, &s1, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_write_memory(w2, &d2, &s2, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_write_memory(w1, &d3, &s3, &e), DSI_OK);
    assert_int_equal(s1, s2);
    assert_memory_equal(d1, d2, s1);
    assert_memory_equal(d1, d3, s1);
    /* file / fd output is the same bytes; all padding is zero */
    assert_int_equal(dsii_gguf_writer_write_path(w1, g_tmpdir, &e), DSI_OK);
    FILE *f = fopen(g_tmpdir, "rb");
    assert_non_null(f);
    uint8_t *fb = malloc(s1 + 1);
    assert_int_equal(fread(fb, 1, s1 + 1, f), s1);
    fclose(f);
    assert_memory_equal(fb, d1, s1);
    int fd = open(g_tmpdir, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(dsii_gguf_writer_write_fd(w2, fd, &e), DSI_OK);
    close(fd);
    f = fopen(g_tmpdir, "rb");
    assert_int_equal(fread(fb, 1, s1 + 1, f), s1);
    fclose(f);
    assert_memory_equal(fb, d1, s1);
    free(fb);
    /* bytes between the header end and the data, and between tensors, are zero */
    dsii_gguf *g;
    assert_int_equal(dsii_gguf_open_memory(NULL, d1, s1, &g, &e), DSI_OK);
    const uint8_t *p = d1;
    uint64_t prev_end = 0;
    for (int64_t i = 0; i < dsii_gguf_n_tensors(g); i++) {
        const dsii_gguf_tensor *t = dsii_gguf_tensor_at(g, i);
        uint64_t start = prev_end ? prev_end : t->offset;
        for (uint64_t o = start; o < t->offset; o++) assert_int_equal(p[o], 0);
        prev_end = t->offset + t->nbytes;
    }
    for (uint64_t o = prev_end; o < s1; o++) assert_int_equal(p[o], 0);
    assert_int_equal(s1 % 64, 0);
    dsii_gguf_close(g);
    dsii_free(NULL, d1);
    dsii_free(NULL, d2);
    dsii_free(NULL, d3);
    dsii_gguf_writer_free(w1);
    dsii_gguf_writer_free(w2);
}

static void test_getter_errors(void **state) {
    (void)state;
    dsii_gguf_writer *w = build_reference(32);
    void *d;
    size_t s;
    dsii_error e;
    assert_int_equal(dsii_gguf_writer_write_memory(w, &d, &s, &e), DSI_OK);
    dsii_gguf *g;
    assert_int_equal(dsii_gguf_open_memory(NULL, d, s, &g, &e), DSI_OK);
    uint32_t u32 = 99;
    int32_t i32;
    float f;
    const char *str;
    int b;
    assert_int_equal(dsii_gguf_get_u32(g, "general.architecture", &u32, &e), DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key general.architecture has type string, expected u32");
    assert_int_equal(u32, 99);
    assert_int_equal(dsii_gguf_get_u32(g, "missing.key", &u32, &e), DSI_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "missing.key"));
    assert_int_equal(dsii_gguf_get_u32(g, "t.i32", &u32, &e), DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key t.i32 value -7 out of range for u32");
    assert_int_equal(dsii_gguf_get_i32(g, "t.u32", &i32, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "4000000000 out of range for i32"));
    assert_int_equal(dsii_gguf_get_f32(g, "t.u32", &f, &e), DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key t.u32 has type u32, expected f32");
    assert_int_equal(dsii_gguf_get_string(g, "t.f32", &str, NULL, &e), DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key t.f32 has type f32, expected string");
    assert_int_equal(dsii_gguf_get_bool(g, "t.u8", &b, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "out of range for bool"));
    assert_int_equal(dsii_gguf_get_u32(g, "t.bool", &u32, &e), DSI_OK);
    assert_int_equal(u32, 1);
    assert_int_equal(dsii_gguf_get_array(g, "t.u8", NULL, NULL, &e), DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key t.u8 has type u8, expected array");
    uint32_t arr[8];
    assert_int_equal(dsii_gguf_get_arr_u32(g, "a.i64", arr, 8, NULL, &e), DSI_ERR_BAD_FORMAT);
    assert_non_null(strstr(e.msg, "a.i64[0]"));
    assert_int_equal(dsii_gguf_get_arr_u32(g, "a.f32", arr, 8, NULL, &e), DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key a.f32 has type f32 array, expected u32 array");
    assert_int_equal(dsii_gguf_get_arr_f32(g, "tokenizer.ggml.tokens", &f, 1, NULL, &e), DSI_ERR_BAD_FORMAT);
    /* rendering */
    char buf[512];
    size_t need;
    struct { const char *key, *text; } r[] = {
        {"t.u32", "4000000000"}, {"t.i8", "-100"}, {"t.bool", "true"}, {"t.f32", "0.5"},
        {"t.f64", "1.0000000000000001e+300"}, {"a.i32", "[-1, 0, 1, 2147483647, -2147483648, 42]"},
        {"a.bool", "[true, false, true]"}, {"tokenizer.ggml.tokens", "[<s>, , hello, \xE2\x96\x81world]"},
        {"a.empty", "[]"}, {"general.architecture", "deepseek4"}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        assert_true(dsii_gguf_kv_render(g, dsii_gguf_find_key(g, r[i].key), buf, sizeof buf, &need));
        assert_string_equal(buf, r[i].text);
        assert_int_equal(need, strlen(r[i].text));
    }
    assert_true(dsii_gguf_kv_render(g, dsii_gguf_find_key(g, "a.u8"), buf, sizeof buf, &need));
    assert_int_equal(strncmp(buf, "[0, 1, 2, ", 10), 0);
    assert_non_null(strstr(buf, ", 63, \xE2\x80\xA6]"));
    assert_null(strstr(buf, "64"));
    char small[6];
    assert_true(dsii_gguf_kv_render(g, dsii_gguf_find_key(g, "a.i32"), small, sizeof small, &need));
    assert_string_equal(small, "[-1, ");
    assert_int_equal(need, strlen("[-1, 0, 1, 2147483647, -2147483648, 42]"));
    assert_true(dsii_gguf_kv_render(g, 0, NULL, 0, &need));
    assert_int_equal(need, 9);
    assert_false(dsii_gguf_kv_render(g, 999, buf, sizeof buf, &need));
    /* every key reachable by index and by name */
    for (int64_t i = 0; i < dsii_gguf_n_kv(g); i++)
        assert_int_equal(dsii_gguf_find_key(g, dsii_gguf_kv_key(g, i)), i);
    dsii_gguf_close(g);
    dsii_free(NULL, d);
    dsii_gguf_writer_free(w);
}

/* Row-streamed tensors: the bytes equal a whole-buffer fill, the writer calls the callback
 * in order for runs of whole rows that are multiples of row_align (except the last), never
 * more than ~8 MiB at once, and a failing callback fails the write with IO naming the rows. */
typedef struct rows_log {
    uint64_t next, calls, max_rows, bad_align;
    uint32_t align;
    int fail_at;
} rows_log;

static int fill_rows_pattern(void *user, uint64_t row0, uint64_t n, void *dst) {
    rows_log *l = user;
    if (row0 != l->next) return 1;
    if (l->fail_at >= 0 && (uint64_t)l->fail_at >= row0 && (uint64_t)l->fail_at < row0 + n) return 1;
    l->calls++;
    if (n > l->max_rows) l->max_rows = n;
    if (n % l->align && row0 + n != 4096) l->bad_align++;
    for (uint64_t r = 0; r < n; r++)
        for (int j = 0; j < 1024; j++) ((float *)dst)[r * 1024 + j] = (float)((row0 + r) * 1024 + (uint64_t)j);
    l->next = row0 + n;
    return 0;
}

static int fill_whole_pattern(void *user, void *dst, uint64_t nbytes) {
    (void)user;
    for (uint64_t i = 0; i < nbytes / 4; i++) ((float *)dst)[i] = (float)i;
    return 0;
}

static void test_writer_rows(void **state) {
    (void)state;
    dsii_error e;
    int64_t ne[2] = {1024, 4096}; /* 16 MiB of f32: at least two runs */
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    rows_log log = {.align = 3, .fail_at = -1};
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    assert_int_equal(dsii_gguf_writer_add_tensor_rows(w, "t", DSI_TYPE_F32, 2, ne, 3, fill_rows_pattern, &log, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_write_memory(w, &a, &na, &e), DSI_OK);
    assert_true(log.calls >= 2);
    assert_int_equal(log.next, 4096);
    assert_int_equal(log.bad_align, 0);
    assert_true(log.max_rows * 1024 * 4 <= (8u << 20));
    dsii_gguf_writer_free(w);
    w = dsii_gguf_writer_create(NULL);
    assert_int_equal(dsii_gguf_writer_add_tensor_fn(w, "t", DSI_TYPE_F32, 2, ne, fill_whole_pattern, NULL, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_write_memory(w, &b, &nb, &e), DSI_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    dsii_gguf_writer_free(w);
    dsii_free(NULL, b);
    /* a failing callback */
    rows_log bad = {.align = 1, .fail_at = 3000};
    w = dsii_gguf_writer_create(NULL);
    assert_int_equal(dsii_gguf_writer_add_tensor_rows(w, "t", DSI_TYPE_F32, 2, ne, 0, fill_rows_pattern, &bad, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_write_memory(w, &b, &nb, &e), DSI_ERR_IO);
    assert_non_null(strstr(e.msg, "'t'"));
    assert_non_null(strstr(e.msg, "rows"));
    dsii_gguf_writer_free(w);
    dsii_free(NULL, a);
}

static void test_writer_rejects(void **state) {
    (void)state;
    dsii_error e;
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    assert_int_equal(dsii_gguf_writer_add_u32(w, "k", 1, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_u32(w, "k", 1, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "duplicate key 'k'"));
    assert_int_equal(dsii_gguf_writer_add_u32(w, "", 1, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsii_gguf_writer_set_alignment(w, 48, &e), DSI_ERR_INVALID_ARGUMENT);
    int64_t ne[2] = {33, 1};
    float x[33] = {0};
    assert_int_equal(dsii_gguf_writer_add_tensor_f32(w, "q", DSI_TYPE_Q8_0, 2, ne, x, &e),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsii_gguf_writer_add_tensor(w, "f", DSI_TYPE_F32, 2, ne, x, 100, &e),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "'f'"));
    assert_int_equal(dsii_gguf_writer_add_tensor(w, "f", DSI_TYPE_F32, 2, ne, x, 132, &e), DSI_OK);
    assert_int_equal(dsii_gguf_writer_add_tensor(w, "f", DSI_TYPE_F32, 2, ne, x, 132, &e),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "duplicate tensor 'f'"));
    int64_t bad[2] = {0, 1};
    assert_int_equal(dsii_gguf_writer_add_tensor(w, "z", DSI_TYPE_F32, 2, bad, x, 0, &e),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsii_gguf_writer_add_tensor(w, "z", 77, 2, ne, x, 0, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsii_gguf_writer_set_alignment(w, 64, &e), DSI_ERR_INVALID_ARGUMENT);
    int32_t iv[33] = {0};
    assert_int_equal(dsii_gguf_writer_add_tensor_f32(w, "iq", 34 /* tq1_0 */, 1, ne, (float *)iv, &e),
                     DSI_ERR_UNSUPPORTED);
    /* many keys and tensors: the name sets rehash correctly */
    char name[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "many.%d", i);
        assert_int_equal(dsii_gguf_writer_add_u32(w, name, (uint32_t)i, &e), DSI_OK);
        int64_t one[1] = {1};
        assert_int_equal(dsii_gguf_writer_add_tensor(w, name, DSI_TYPE_F32, 1, one, x, 4, &e), DSI_OK);
    }
    assert_int_equal(dsii_gguf_writer_add_u32(w, "many.1234", 0, &e), DSI_ERR_INVALID_ARGUMENT);
    void *d;
    size_t s;
    assert_int_equal(dsii_gguf_writer_write_memory(w, &d, &s, &e), DSI_OK);
    dsii_gguf *g;
    assert_int_equal(dsii_gguf_open_memory(NULL, d, s, &g, &e), DSI_OK);
    assert_int_equal(dsii_gguf_n_tensors(g), 3001);
    uint32_t u;
    assert_int_equal(dsii_gguf_get_u32(g, "many.2999", &u, &e), DSI_OK);
    assert_int_equal(u, 2999);
    assert_non_null(dsii_gguf_find_tensor(g, "many.1500"));
    dsii_gguf_close(g);
    dsii_free(NULL, d);
    dsii_gguf_writer_free(w);
}

/* ---- malformed corpus ------------------------------------------------------------------ */

static void test_bad_header(void **state) {
    (void)state;
    bb b = {0};
    expect_bad(NULL, 0, DSI_ERR_BAD_FORMAT, "empty");
    const char *text = "hello, this is a text file and not a model\n";
    expect_bad((const uint8_t *)text, strlen(text), DSI_ERR_BAD_FORMAT, "not a GGUF file");
    expect_bad((const uint8_t *)"GG", 2, DSI_ERR_BAD_FORMAT, "too small");
    bb_raw(&b, "GGUX", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "magic is \"GGUX\"");
    bb_header(&b, 1, 0, 0);
    expect_bad_bb(&b, DSI_ERR_UNSUPPORTED, "version 1");
    bb_header(&b, 7, 0, 0);
    expect_bad_bb(&b, DSI_ERR_UNSUPPORTED, "version 7");
    bb_header(&b, 0, 0, 0);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "version 0");
    bb_header(&b, 0x03000000u, 0, 0);
    expect_bad_bb(&b, DSI_ERR_UNSUPPORTED, "big-endian");
    bb_raw(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u32(&b, 0);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "header tensor count: truncated");
    bb_header(&b, 3, 0, 1ull << 60);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "metadata count 1152921504606846976");
    bb_header(&b, 3, 1ull << 60, 0);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor count 1152921504606846976");
    bb_header(&b, 3, 0, 3); /* counts fit no entry */
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "metadata count 3");
    /* minimal valid files: v3 and v2, no KV, no tensors */
    for (uint32_t v = 2; v <= 3; v++) {
        bb_header(&b, v, 0, 0);
        dsii_gguf *g;
        dsii_error e;
        assert_int_equal(dsii_gguf_open_memory(NULL, b.p, b.n, &g, &e), DSI_OK);
        assert_int_equal(dsii_gguf_version(g), v);
        assert_int_equal(dsii_gguf_n_kv(g), 0);
        assert_null(dsii_gguf_find_tensor(g, "x"));
        dsii_gguf_close(g);
        free(b.p);
        memset(&b, 0, sizeof b);
    }
}

static void test_bad_metadata(void **state) {
    (void)state;
    bb b = {0};
    /* key length absurd / beyond the file */
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 40);
    bb_zeros(&b, 16);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key length 1099511627776 exceeds the limit");
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1000);
    bb_raw(&b, "abcdefgh", 8);
    bb_zeros(&b, 8);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key length 1000 exceeds the 16 bytes left");
    /* empty key, key with a NUL byte */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "");
    bb_u32(&b, DSII_GGUF_U32);
    bb_u32(&b, 1);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "empty key");
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 3);
    bb_raw(&b, "a\0b", 3);
    bb_u32(&b, DSII_GGUF_U32);
    bb_u32(&b, 1);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'a\\x00b' contains a NUL byte");
    /* string value longer than the file */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "my.string");
    bb_u32(&b, DSII_GGUF_STRING);
    bb_u64(&b, 1ull << 40);
    bb_zeros(&b, 10);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'my.string': string value length 1099511627776");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "my.string");
    bb_u32(&b, DSII_GGUF_STRING);
    bb_u64(&b, 100);
    bb_zeros(&b, 10);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'my.string': string value length 100 exceeds the 10");
    /* arrays of 2^60 elements (numeric and string) */
    uint32_t ets[3] = {DSII_GGUF_U8, DSII_GGUF_STRING, DSII_GGUF_ARRAY};
    for (int i = 0; i < 3; i++) {
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "my.array");
        bb_u32(&b, DSII_GGUF_ARRAY);
        bb_u32(&b, ets[i]);
        bb_u64(&b, 1ull << 60);
        bb_zeros(&b, 64);
        expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'my.array': array of 1152921504606846976");
    }
    /* long names are cut in messages */
    {
        char longkey[201];
        memset(longkey, 'k', 200);
        longkey[200] = 0;
        bb_header(&b, 3, 0, 1);
        bb_str(&b, longkey);
        bb_u32(&b, 13);
        bb_u32(&b, 0);
        char want[160];
        snprintf(want, sizeof want, "key '%.90s...' has unknown value type 13", longkey);
        expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, want);
    }
    /* unknown value type, unknown element type */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "my.key");
    bb_u32(&b, 13);
    bb_u32(&b, 0);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'my.key' has unknown value type 13");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "my.key");
    bb_u32(&b, DSII_GGUF_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 0);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'my.key': array has unknown element type 99");
    /* nesting: 4 levels are fine, 5 are not */
    for (int depth = 4; depth <= 5; depth++) {
        bb_header(&b, 3, 0, 1);
        bb_str(&b, "deep");
        bb_u32(&b, DSII_GGUF_ARRAY);
        for (int d = 1; d < depth; d++) {
            bb_u32(&b, DSII_GGUF_ARRAY);
            bb_u64(&b, 1);
        }
        bb_u32(&b, DSII_GGUF_U8);
        bb_u64(&b, 1);
        bb_le(&b, 7, 1);
        if (depth == 5) {
            expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'deep': arrays nested deeper than 4");
        } else {
            dsii_gguf *g;
            dsii_error e;
            assert_int_equal(dsii_gguf_open_memory(NULL, b.p, b.n, &g, &e), DSI_OK);
            const dsii_gguf_value *v = dsii_gguf_kv_val(g, 0);
            for (int d = 1; d < depth; d++) v = dsii_gguf_val_arr_elem(g, v, 0);
            assert_int_equal(dsii_gguf_val_arr_type(v), DSII_GGUF_U8);
            char buf[64];
            assert_true(dsii_gguf_kv_render(g, 0, buf, sizeof buf, NULL));
            assert_string_equal(buf, "[[[[7]]]]");
            dsii_gguf_close(g);
            free(b.p);
            memset(&b, 0, sizeof b);
        }
    }
    /* bools other than 0 / 1 */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "flag");
    bb_u32(&b, DSII_GGUF_BOOL);
    bb_le(&b, 2, 1);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'flag': invalid bool value 2");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "flags");
    bb_u32(&b, DSII_GGUF_ARRAY);
    bb_u32(&b, DSII_GGUF_BOOL);
    bb_u64(&b, 2);
    bb_le(&b, 1, 1);
    bb_le(&b, 9, 1);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'flags': bool array element 1 has invalid value 9");
    /* duplicate key */
    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "dup.key", 1);
    bb_kv_u32(&b, "other", 1);
    bb_kv_u32(&b, "dup.key", 2);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "duplicate key 'dup.key'");
    /* truncated inside an array of strings */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tokenizer.ggml.tokens");
    bb_u32(&b, DSII_GGUF_ARRAY);
    bb_u32(&b, DSII_GGUF_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "a");
    bb_str(&b, "b");
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "key 'tokenizer.ggml.tokens'");
}

static void test_bad_alignment(void **state) {
    (void)state;
    bb b = {0};
    uint32_t vals[4] = {0, 48, 1u << 21, 3};
    for (int i = 0; i < 4; i++) {
        bb_header(&b, 3, 0, 1);
        bb_kv_u32(&b, "general.alignment", vals[i]);
        char want[96];
        snprintf(want, sizeof want, "key 'general.alignment' has value %u, expected a power of two",
                 (unsigned)vals[i]);
        expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, want);
    }
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, DSII_GGUF_STRING);
    bb_str(&b, "32");
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "general.alignment' has value of type string");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, DSII_GGUF_I32);
    bb_u32(&b, (uint32_t)-32);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "general.alignment' has value -32");
}

/* A file with one KV-less header and the given tensor infos + `data` zero bytes. */
static void one_tensor(bb *b, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off,
                       size_t data) {
    bb_header(b, 3, 1, 0);
    bb_tensor(b, "blk.0.attn_q_a.weight", nd, ne, type, off);
    bb_pad(b, 32);
    bb_zeros(b, data);
}

static void test_bad_tensors(void **state) {
    (void)state;
    bb b = {0};
    uint64_t ne1[1] = {16};
    /* the valid base case */
    one_tensor(&b, 1, ne1, DSI_TYPE_F32, 0, 64);
    {
        dsii_gguf *g;
        dsii_error e;
        assert_int_equal(dsii_gguf_open_memory(NULL, b.p, b.n, &g, &e), DSI_OK);
        dsii_gguf_close(g);
        free(b.p);
        memset(&b, 0, sizeof b);
    }
    one_tensor(&b, 0, ne1, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor 'blk.0.attn_q_a.weight' has 0 dimensions");
    uint64_t ne5[5] = {1, 1, 1, 1, 16};
    one_tensor(&b, 5, ne5, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor 'blk.0.attn_q_a.weight' has 5 dimensions");
    uint64_t ne0[2] = {16, 0};
    one_tensor(&b, 2, ne0, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "invalid size 0 in dimension 1");
    uint64_t neh[1] = {1ull << 63};
    one_tensor(&b, 1, neh, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "invalid size 9223372036854775808 in dimension 0");
    uint64_t neo[3] = {1ull << 40, 1ull << 40, 1};
    one_tensor(&b, 3, neo, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "element count overflows");
    uint64_t neb[1] = {1ull << 62};
    one_tensor(&b, 1, neb, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor 'blk.0.attn_q_a.weight' byte size overflows");
    uint64_t nebig[2] = {1ull << 20, 1ull << 20};
    one_tensor(&b, 2, nebig, DSI_TYPE_F32, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "lies outside the file");
    one_tensor(&b, 1, ne1, 77, 0, 64);
    expect_bad_bb(&b, DSI_ERR_UNSUPPORTED, "tensor 'blk.0.attn_q_a.weight' has unsupported type 77");
    one_tensor(&b, 1, ne1, 0xFFFFFFFFu, 0, 64);
    expect_bad_bb(&b, DSI_ERR_UNSUPPORTED, "unsupported type 4294967295");
    uint64_t ne33[1] = {33};
    one_tensor(&b, 1, ne33, DSI_TYPE_Q8_0, 0, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "ne[0] = 33, not a multiple of the q8_0 block size 32");
    one_tensor(&b, 1, ne1, DSI_TYPE_F32, 1, 96);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "offset 1 is not a multiple of the alignment 32");
    one_tensor(&b, 1, ne1, DSI_TYPE_F32, 1ull << 40, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor 'blk.0.attn_q_a.weight' data (64 bytes at data offset 1099511627776) lies outside");
    one_tensor(&b, 1, ne1, DSI_TYPE_F32, UINT64_MAX - 31, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "lies outside the file");
    one_tensor(&b, 1, ne1, DSI_TYPE_F32, 0, 63);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "lies outside the file");
    /* overlapping, duplicate names */
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "a", 1, ne1, DSI_TYPE_F32, 32);
    uint64_t ne32[1] = {32};
    bb_tensor(&b, "b", 1, ne32, DSI_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensors 'b' (data offset 0, 128 bytes) and 'a' (data offset 32) overlap");
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "same", 1, ne1, DSI_TYPE_F32, 0);
    bb_tensor(&b, "same", 1, ne1, DSI_TYPE_F32, 64);
    bb_pad(&b, 32);
    bb_zeros(&b, 256);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "duplicate tensor name 'same'");
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "", 1, ne1, DSI_TYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor info 0 has an empty name");
    /* truncated tensor info */
    bb_header(&b, 3, 1, 0);
    bb_str(&b, "blk.9.some_long_tensor_name.weight");
    bb_u32(&b, 2);
    bb_u64(&b, 16);
    bb_zeros(&b, 4);
    expect_bad_bb(&b, DSI_ERR_BAD_FORMAT, "tensor 'blk.9.some_long_tensor_name.weight': truncated file");
    /* custom alignment applies to offsets; data section starts at the aligned position */
    bb_header(&b, 3, 2, 1);
    bb_kv_u32(&b, "general.alignment", 256);
    bb_tensor(&b, "a", 1, ne1, DSI_TYPE_F32, 0);
    bb_tensor(&b, "b", 1, ne1, DSI_TYPE_F32, 128);
    expect_bad(b.p, b.n, DSI_ERR_BAD_FORMAT, "offset 128 is not a multiple of the alignment 256");
    free(b.p);
    memset(&b, 0, sizeof b);
    /* a TQ2_0 tensor loads (type known); the type table says it is not supported */
    uint64_t ne256[2] = {256, 2};
    one_tensor(&b, 2, ne256, 35 /* tq2_0 */, 0, 132);
    {
        dsii_gguf *g;
        dsii_error e;
        assert_int_equal(dsii_gguf_open_memory(NULL, b.p, b.n, &g, &e), DSI_OK);
        const dsii_gguf_tensor *t = dsii_gguf_tensor_at(g, 0);
        assert_int_equal(t->nbytes, 132);
        const dsii_type_traits *tt = dsii_type_get(t->type);
        assert_false(tt->supported);
        assert_string_equal(tt->name, "tq2_0");
        dsii_gguf_close(g);
    }
    free(b.p);
}

/* A valid file truncated at every byte fails cleanly, except inside trailing padding. */
static void test_truncation_every_byte(void **state) {
    (void)state;
    dsii_gguf_writer *w = build_reference(32);
    void *d;
    size_t s;
    dsii_error e;
    assert_int_equal(dsii_gguf_writer_write_memory(w, &d, &s, &e), DSI_OK);
    dsii_gguf *g;
    assert_int_equal(dsii_gguf_open_memory(NULL, d, s, &g, &e), DSI_OK);
    uint64_t need = 0;
    for (int64_t i = 0; i < dsii_gguf_n_tensors(g); i++) {
        const dsii_gguf_tensor *t = dsii_gguf_tensor_at(g, i);
        if (t->offset + t->nbytes > need) need = t->offset + t->nbytes;
    }
    dsii_gguf_close(g);
    for (size_t len = 0; len < s; len++) {
        int modes[2] = {M_MEMORY, M_READER};
        /* pread / mmap (temp file) on a stride to keep the test quick */
        int nm = (len % 13 == 0) ? 4 : 2;
        for (int mi = 0; mi < nm; mi++) {
            int m = mi < 2 ? modes[mi] : mi;
            mem_reader mr;
            dsii_gguf *gg = NULL;
            dsi_status st = open_mode(m, d, len, &mr, &gg, &e);
            if (len >= need) {
                if (st != DSI_OK) fail_msg("len %zu [%s]: %s", len, k_mode_names[m], e.msg);
                dsii_gguf_close(gg);
            } else {
                if (st != DSI_ERR_BAD_FORMAT)
                    fail_msg("len %zu [%s]: status %d (%s)", len, k_mode_names[m], (int)st, e.msg);
                assert_null(gg);
                assert_true(strstr(e.msg, "truncated") || strstr(e.msg, "outside the file") ||
                            strstr(e.msg, "empty") || strstr(e.msg, "too small") ||
                            strstr(e.msg, "exceeds") || strstr(e.msg, "impossible"));
            }
            if (m == M_READER) assert_int_equal(mr.closes, 1);
        }
    }
    dsii_free(NULL, d);
    dsii_gguf_writer_free(w);
}

/* ---- file layer ------------------------------------------------------------------------- */

static void test_file_modes(void **state) {
    (void)state;
    uint8_t data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 13);
    write_tmp(data, sizeof data);
    dsii_error e;
    int32_t modes[2] = {DSII_FILE_MMAP, DSII_FILE_PREAD};
    for (int m = 0; m < 2; m++) {
        dsii_file *f;
        assert_int_equal(dsii_file_open(NULL, g_tmpdir, modes[m], &f, &e), DSI_OK);
        assert_int_equal(dsii_file_size(f), 1000);
        assert_string_equal(dsii_file_name(f), g_tmpdir);
        uint8_t buf[100];
        assert_int_equal(dsii_file_read(f, 900, 100, buf, &e), DSI_OK);
        assert_memory_equal(buf, data + 900, 100);
        assert_int_equal(dsii_file_read(f, 901, 100, buf, &e), DSI_ERR_BAD_FORMAT);
        assert_non_null(strstr(e.msg, "beyond end of file"));
        assert_int_equal(dsii_file_read(f, UINT64_MAX, 2, buf, &e), DSI_ERR_BAD_FORMAT);
        assert_int_equal(dsii_file_read(f, 5, UINT64_MAX, buf, &e), DSI_ERR_BAD_FORMAT);
        assert_int_equal(dsii_file_read(f, 1000, 0, NULL, &e), DSI_OK);
        assert_false(dsii_file_range_ok(f, 1, 1000));
        assert_true(dsii_file_range_ok(f, 1000, 0));
        for (int32_t adv = -1; adv <= 5; adv++) { /* hints never fail or crash */
            dsii_file_advise(f, 10, 500, adv);
            dsii_file_advise(f, 999, 5, adv);
            dsii_file_advise(f, UINT64_MAX, 5, adv);
        }
        assert_int_equal(dsii_file_read(f, 0, 100, buf, &e), DSI_OK);
        assert_memory_equal(buf, data, 100);
        const uint8_t *p = dsii_file_map(f, 10, 20);
        if (modes[m] == DSII_FILE_MMAP) {
            assert_non_null(p);
            assert_memory_equal(p, data + 10, 20);
            assert_null(dsii_file_map(f, 990, 20));
        } else {
            assert_null(p);
        }
        dsii_file_close(f);
    }
    dsii_file *f;
    assert_int_equal(dsii_file_open(NULL, "/nonexistent/dir/model.gguf", DSII_FILE_MMAP, &f, &e), DSI_ERR_IO);
    assert_non_null(strstr(e.msg, "/nonexistent/dir/model.gguf"));
    assert_null(f);
    assert_int_equal(dsii_file_open(NULL, "/", DSII_FILE_PREAD, &f, &e), DSI_ERR_IO);
    assert_int_equal(dsii_file_open(NULL, g_tmpdir, 7, &f, &e), DSI_ERR_INVALID_ARGUMENT);
    /* empty file in both modes */
    write_tmp(NULL, 0);
    for (int m = 0; m < 2; m++) {
        assert_int_equal(dsii_file_open(NULL, g_tmpdir, modes[m], &f, &e), DSI_OK);
        assert_int_equal(dsii_file_size(f), 0);
        assert_null(dsii_file_map(f, 0, 0));
        dsii_file_close(f);
    }
    dsii_file_close(NULL);
}

static void test_reader_ownership(void **state) {
    (void)state;
    dsii_gguf_writer *w = build_reference(32);
    void *d;
    size_t s;
    dsii_error e;
    assert_int_equal(dsii_gguf_writer_write_memory(w, &d, &s, &e), DSI_OK);
    mem_reader mr = {d, s, 0, 1};
    dsi_reader r;
    dsi_reader_init(&r);
    r.size = s;
    r.pread_fn = mr_pread;
    r.close_fn = mr_close;
    r.user_data = &mr;
    dsii_gguf *g = NULL;
    assert_int_equal(dsii_gguf_open_reader(NULL, &r, &g, &e), DSI_ERR_IO);
    assert_non_null(strstr(e.msg, "reader failed"));
    assert_int_equal(mr.closes, 1);
    /* bad reader structs still close */
    mr.closes = 0;
    r.pread_fn = NULL;
    assert_int_equal(dsii_gguf_open_reader(NULL, &r, &g, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(mr.closes, 1);
    r.pread_fn = mr_pread;
    r.struct_size = 4;
    assert_int_equal(dsii_gguf_open_reader(NULL, &r, &g, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "struct_size"));
    /* a reader that claims more bytes than it can deliver → IO, closed once */
    r.struct_size = sizeof r;
    mr.fail_reads = 0;
    mr.closes = 0;
    mr.size = s / 2;
    assert_int_equal(dsii_gguf_open_reader(NULL, &r, &g, &e), DSI_ERR_IO);
    assert_int_equal(mr.closes, 1);
    dsii_free(NULL, d);
    dsii_gguf_writer_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_fp8_value_in_file),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_writer_rows),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_truncation_every_byte),
        cmocka_unit_test(test_file_modes),
        cmocka_unit_test(test_reader_ownership),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
