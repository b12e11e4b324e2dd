/*
 * Cross-backend op tests (design.md "Backends", in the style of llama.cpp's test-backend-ops):
 * every op of struct dsib_ops that the GPU module implements runs on random inputs on the
 * CPU backend (the reference) and on the module; outputs are compared by normalised mean
 * squared error with a per-op threshold, checked for NaN / Inf, and the guard bytes around
 * every buffer must be unchanged. An op the module leaves NULL fails its test (the model
 * needs every op; a missing one is a defect of the module, not absent hardware). Several shapes per op, including sizes that are not a multiple of the work
 * group size, and (test_large_*) weights above 128 MiB / split over binding windows and
 * allocation chunks.
 *
 * Without a Vulkan device the program exits 77 (skip) with a reason, unless
 * DSI_REQUIRE_VULKAN=1 (then it fails). With DSINFER_VULKAN_VALIDATION=1 a last test
 * fails if the validation layer is missing or reported any error.
 */
#define _GNU_SOURCE /* setenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/common/filter.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_test_util.h"
#include "quant/quant.h"
#include "quant/statepack.h"
#include "tests/common/vk_validation.h"

static bt_side g_s[2];

/* ---- helpers -------------------------------------------------------------------------------- */

/* Records `call` on each side's stream and syncs it; `S` is the side index inside `call`.
 * Stores each side's status in st[S]. */
#define RUN_BOTH(st, call)                                                                     \
    do {                                                                                       \
        for (int S = 0; S < 2; S++) {                                                          \
            bt_side *sd = &g_s[S];                                                             \
            dsib_error e_;                                                                     \
            memset(&e_, 0, sizeof e_);                                                         \
            dsi_status r_ = (call);                                                            \
            dsi_status r2_ = sd->be->sync(sd->strm, &e_);                                      \
            st[S] = r_ != DSI_OK ? r_ : r2_;                                                   \
            if (st[S] != DSI_OK) printf("  %s: status %d: %s\n", sd->be->name, st[S], e_.msg); \
        }                                                                                      \
    } while (0)

#define V(b) bt_view(&(b), S, 0)
/* One sequence in slot `slot` at positions pos0 .. pos0+n-1. */
static bt_buf rows1(int32_t slot, int32_t pos0, int32_t n) {
    bt_buf b;
    assert_int_equal(bt_rows_new(g_s, &b, 1, &slot, &pos0, &n), n);
    return b;
}
#define OPS(S) (g_s[S].be->ops)

/* Fails (with the reason) when either side lacks the op: every op of the table is needed
 * by the forward passes, so a missing one is a defect, never a skip. */
#define NEED_OP(op_)                                                                          \
    do {                                                                                       \
        if (!g_s[0].be->ops || !g_s[0].be->ops->op_)                                          \
            fail_msg("%s: the CPU backend does not implement it", #op_);                      \
        if (!g_s[1].be->ops || g_s[1].be->ops->struct_size < DSII_OPS_END(op_) ||             \
            !g_s[1].be->ops->op_)                                                             \
            fail_msg("%s: not implemented by the %s backend", #op_, g_s[1].be->name);         \
    } while (0)
#define DSII_OPS_END(f) (offsetof(dsib_ops, f) + sizeof(((dsib_ops *)0)->f))

static float *falloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    assert_non_null(p);
    return p;
}

/* Compares float output `b` (n floats at the start of the payload) between the sides. */
static void check_f32(const char *what, const bt_buf *b, size_t n, double tol) {
    float *ref = falloc(b->bytes / 4 + 1), *got = falloc(b->bytes / 4 + 1);
    uint64_t g0 = bt_buf_read(g_s, b, 0, ref);
    uint64_t g1 = bt_buf_read(g_s, b, 1, got);
    size_t bad = 0;
    double e = bt_nmse(got, ref, n, &bad);
    printf("  %-40s nmse %.3e (tol %.0e)%s\n", what, e, tol, bad ? "  NaN/Inf MISMATCH" : "");
    if (g0 || g1) printf("  %s: guard bytes changed: cpu %llu, gpu %llu\n", what,
                         (unsigned long long)g0, (unsigned long long)g1);
    /* The rest of the payload (beyond n) must be equal too (untouched or identical). */
    assert_int_equal(g0, 0);
    assert_int_equal(g1, 0);
    assert_int_equal(bad, 0);
    assert_true(e <= tol);
    free(ref);
    free(got);
}

static void check_i32(const char *what, const bt_buf *b, size_t n) {
    int32_t *ref = calloc(b->bytes / 4 + 1, 4), *got = calloc(b->bytes / 4 + 1, 4);
    assert_int_equal(bt_buf_read(g_s, b, 0, ref), 0);
    assert_int_equal(bt_buf_read(g_s, b, 1, got), 0);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += ref[i] != got[i];
    printf("  %-40s %zu of %zu ints differ\n", what, diff, n);
    assert_int_equal(diff, 0);
    free(ref);
    free(got);
}

static bt_buf fbuf(const float *data, size_t n) {
    bt_buf b;
    assert_true(bt_buf_new(g_s, &b, data, (uint64_t)n * 4));
    return b;
}

static bt_buf rbuf(size_t n, float lo, float hi) {
    float *x = falloc(n);
    bt_fill(x, n, lo, hi);
    bt_buf b = fbuf(x, n);
    free(x);
    return b;
}

static bt_buf ibuf(const int32_t *data, size_t n) {
    bt_buf b;
    assert_true(bt_buf_new(g_s, &b, data, (uint64_t)n * 4));
    return b;
}

/* A weight [ne2][ne1][ne0] of `type` from random values in [-r, r]. */
typedef struct tw {
    bt_buf b;
    dsib_weight w[2];
} tw;

static tw mkweight(int32_t type, int64_t ne0, int64_t ne1, int64_t ne2, float r) {
    tw t;
    uint64_t rb = 0;
    assert_true(dsii_type_row_size(type, ne0, &rb));
    uint64_t bytes = rb * (uint64_t)ne1 * (uint64_t)ne2;
    uint8_t *q = calloc(bytes + 4, 1);
    float *row = falloc((size_t)ne0);
    assert_non_null(q);
    for (int64_t i = 0; i < ne1 * ne2; i++) {
        bt_fill(row, (size_t)ne0, -r, r);
        if (type == DSI_TYPE_I32) {
            for (int64_t j = 0; j < ne0; j++) ((int32_t *)(q + i * rb))[j] = (int32_t)fabsf(row[j] * 1000);
        } else {
            dsii_error e;
            assert_int_equal(dsii_quantize_row(type, row, q + (uint64_t)i * rb, ne0, &e), DSI_OK);
        }
    }
    assert_true(bt_buf_new(g_s, &t.b, q, (bytes + 3) & ~3ull));
    for (int s = 0; s < 2; s++) {
        memset(&t.w[s], 0, sizeof t.w[s]);
        t.w[s].buf = t.b.b[s];
        t.w[s].offset = BT_GUARD;
        t.w[s].type = type;
        t.w[s].ne[0] = ne0;
        t.w[s].ne[1] = ne1;
        t.w[s].ne[2] = ne2;
        t.w[s].nb1 = rb;
        t.w[s].nb2 = rb * (uint64_t)ne1;
    }
    free(q);
    free(row);
    return t;
}

static tw mkweight_f32(const float *v, int64_t n) {
    tw t;
    assert_true(bt_buf_new(g_s, &t.b, v, (uint64_t)n * 4));
    for (int s = 0; s < 2; s++) {
        memset(&t.w[s], 0, sizeof t.w[s]);
        t.w[s].buf = t.b.b[s];
        t.w[s].offset = BT_GUARD;
        t.w[s].type = DSI_TYPE_F32;
        t.w[s].ne[0] = n;
        t.w[s].ne[1] = 1;
        t.w[s].ne[2] = 1;
        t.w[s].nb1 = (uint64_t)n * 4;
        t.w[s].nb2 = (uint64_t)n * 4;
    }
    return t;
}

static void st_ok(const dsi_status st[2]) {
    assert_int_equal(st[0], DSI_OK);
    assert_int_equal(st[1], DSI_OK);
}

/* The GPU backend declines op `op` for weight type `type` through supports_op (backend.h:
 * the core then reports the model as unsupported at session creation); such a case has
 * nothing to compare. The Vulkan module must run every type below: for it, never. */
static int gpu_declines(uint32_t op, int32_t type) {
    const dsib_backend *be = g_s[1].be;
    if (strcmp(be->name, "vulkan") == 0) return 0;
    if (!be->supports_op || be->supports_op(g_s[1].inst, op, type)) return 0;
    printf("  %s: op %u declined for type %s (supports_op)\n", be->name, op, dsi_type_name(type));
    return 1;
}

/* ---- generic ops -------------------------------------------------------------------------- */

static const int32_t k_types[] = {DSI_TYPE_F32, DSI_TYPE_F16, DSI_TYPE_BF16, DSI_TYPE_Q8_0,
                                  DSI_TYPE_Q4_K, DSI_TYPE_Q2_K, DSI_TYPE_MXFP4,
                                  DSI_TYPE_FP8_E4M3_B128, DSI_TYPE_FP8_E4M3_B32,
                                  DSI_TYPE_FP8_E4M3_R32,
                                  /* the further ggml types (docs/tensor-types.md) */
                                  2, 3, 6, 7, 11, 13, 14, 20, 23, 18, 21, 16, 17, 22, 19, 29};

static void test_matmul(void **state) {
    (void)state;
    NEED_OP(matmul);
    static const struct { int64_t K, N; uint32_t n; } shapes[] = {
        {256, 64, 1}, {512, 37, 5}, {768, 130, 3}, {256, 1, 9}};
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int32_t type = k_types[ti];
            if (gpu_declines(DSIB_OP_MATMUL, type)) continue;
            int64_t K = shapes[si].K, N = shapes[si].N;
            uint32_t n = shapes[si].n, ldx = (uint32_t)K + 3, ldy = (uint32_t)N + 1;
            tw w = mkweight(type, K, N, 2, 1.0f);
            bt_buf x = rbuf((size_t)n * ldx, -1, 1), y = rbuf((size_t)n * ldy, 0, 0);
            dsi_status st[2];
            RUN_BOTH(st, OPS(S)->matmul(g_s[S].strm, &w.w[S], 1, V(x), ldx, V(y), ldy, n));
            if (st[0] == DSI_ERR_UNSUPPORTED) {
                /* no reference: the CPU backend has no matmul for this type (e.g. fp8_e4m3_r32,
                 * an Engram-table type that is only gathered) */
                printf("  matmul %s: skipped, the CPU backend does not support it\n", dsi_type_name(type));
                bt_buf_free(g_s, &w.b);
                bt_buf_free(g_s, &x);
                bt_buf_free(g_s, &y);
                continue;
            }
            st_ok(st);
            char what[96];
            snprintf(what, sizeof what, "matmul %s K%lld N%lld n%u", dsi_type_name(type),
                     (long long)K, (long long)N, n);
            check_f32(what, &y, y.bytes / 4, 1e-9);
            bt_buf_free(g_s, &w.b);
            bt_buf_free(g_s, &x);
            bt_buf_free(g_s, &y);
        }
}

static void test_matmul_grouped(void **state) {
    (void)state;
    NEED_OP(matmul_grouped);
    static const struct { int64_t K, R; uint32_t G, n; } shapes[] = {{64, 32, 2, 3}, {128, 33, 4, 1}};
    for (size_t si = 0; si < 2; si++) {
        int64_t K = shapes[si].K, R = shapes[si].R;
        uint32_t G = shapes[si].G, n = shapes[si].n, ldx = (uint32_t)(K * G), ldy = (uint32_t)(R * G);
        tw w = mkweight(DSI_TYPE_Q8_0, K, R * G, 1, 1.0f);
        bt_buf x = rbuf((size_t)n * ldx, -1, 1), y = rbuf((size_t)n * ldy, 0, 0);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->matmul_grouped(g_s[S].strm, &w.w[S], G, V(x), ldx, V(y), ldy, n));
        st_ok(st);
        check_f32("matmul_grouped q8_0", &y, y.bytes / 4, 1e-9);
        bt_buf_free(g_s, &w.b);
        bt_buf_free(g_s, &x);
        bt_buf_free(g_s, &y);
    }
}

static void test_get_rows(void **state) {
    (void)state;
    NEED_OP(get_rows);
    for (size_t ti = 0; ti < sizeof k_types / sizeof k_types[0]; ti++) {
        if (gpu_declines(DSIB_OP_GET_ROWS, k_types[ti])) continue;
        int64_t K = k_types[ti] == DSI_TYPE_FP8_E4M3_B128 ? 384 : 256, V_ = 77;
        tw w = mkweight(k_types[ti], K, V_, 1, 2.0f);
        int32_t ids[7] = {0, 76, 5, 5, 40, 1, 13};
        bt_buf id = ibuf(ids, 7), y = rbuf(7 * (size_t)(K + 2), 0, 0);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->get_rows(g_s[S].strm, &w.w[S], V(id), V(y), (uint32_t)K + 2, 7));
        st_ok(st);
        char what[64];
        snprintf(what, sizeof what, "get_rows %s", dsi_type_name(k_types[ti]));
        check_f32(what, &y, y.bytes / 4, 0);
        bt_buf_free(g_s, &w.b);
        bt_buf_free(g_s, &id);
        bt_buf_free(g_s, &y);
    }
}

static void test_add_rows_periodic(void **state) {
    (void)state;
    NEED_OP(add_rows_periodic);
    tw w = mkweight(DSI_TYPE_F32, 100, 4, 1, 1.0f);
    bt_buf x = rbuf(9 * 101, -1, 1);
    /* two sequences: 5 rows from position 7, 4 rows from position 2 */
    int32_t sl[2] = {0, 1}, p0[2] = {7, 2}, cnt[2] = {5, 4};
    bt_buf rw;
    assert_int_equal(bt_rows_new(g_s, &rw, 2, sl, p0, cnt), 9);
    dsi_status st[2];
    RUN_BOTH(st, OPS(S)->add_rows_periodic(g_s[S].strm, V(x), 101, 9, 100, &w.w[S], V(rw), 4));
    st_ok(st);
    check_f32("add_rows_periodic", &x, x.bytes / 4, 0);
    bt_buf_free(g_s, &w.b);
    bt_buf_free(g_s, &x);
    bt_buf_free(g_s, &rw);
}

static void test_rms_norm(void **state) {
    (void)state;
    NEED_OP(rms_norm);
    static const uint32_t widths[] = {64, 100, 512, 1000};
    for (int wi = 0; wi < 4; wi++)
        for (int weighted = 0; weighted < 2; weighted++) {
            uint32_t W = widths[wi], rows = 5, ld = W + 7;
            float *wv = falloc(W);
            bt_fill(wv, W, 0.5f, 1.5f);
            tw w = mkweight_f32(wv, W);
            bt_buf x = rbuf(rows * ld, -2, 2), y = rbuf(rows * ld, 0, 0);
            dsi_status st[2];
            RUN_BOTH(st, OPS(S)->rms_norm(g_s[S].strm, V(x), ld, V(y), ld, rows, W,
                                          weighted ? &w.w[S] : NULL, 1e-6f));
            st_ok(st);
            check_f32(weighted ? "rms_norm weighted" : "rms_norm", &y, y.bytes / 4, 1e-11);
            /* in place */
            RUN_BOTH(st, OPS(S)->rms_norm(g_s[S].strm, V(x), ld, V(x), ld, rows, W, &w.w[S], 1e-20f));
            st_ok(st);
            check_f32("rms_norm in place", &x, x.bytes / 4, 1e-11);
            free(wv);
            bt_buf_free(g_s, &w.b);
            bt_buf_free(g_s, &x);
            bt_buf_free(g_s, &y);
        }
}

static void test_add_scale_swiglu(void **state) {
    (void)state;
    NEED_OP(add);
    NEED_OP(scale);
    NEED_OP(swiglu);
    static const uint32_t widths[] = {1, 63, 64, 257};
    for (int wi = 0; wi < 4; wi++) {
        uint32_t W = widths[wi], rows = 3, ld = W + 2;
        bt_buf a = rbuf(rows * ld, -15, 15), b = rbuf(rows * ld, -15, 15), y = rbuf(rows * ld, 0, 0);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->add(g_s[S].strm, V(a), ld, V(b), ld, V(y), ld, rows, W));
        st_ok(st);
        check_f32("add", &y, y.bytes / 4, 0);
        RUN_BOTH(st, OPS(S)->scale(g_s[S].strm, V(a), ld, rows, W, -0.37f));
        st_ok(st);
        check_f32("scale", &a, a.bytes / 4, 0);
        RUN_BOTH(st, OPS(S)->swiglu(g_s[S].strm, V(a), ld, V(b), ld, V(y), ld, rows, W, 10.0f));
        st_ok(st);
        check_f32("swiglu limit 10", &y, y.bytes / 4, 1e-11);
        RUN_BOTH(st, OPS(S)->swiglu(g_s[S].strm, V(a), ld, V(b), ld, V(a), ld, rows, W, 0.0f));
        st_ok(st);
        check_f32("swiglu no limit, in place", &a, a.bytes / 4, 1e-11);
        bt_buf_free(g_s, &a);
        bt_buf_free(g_s, &b);
        bt_buf_free(g_s, &y);
    }
}

/* Packed state rows (lib/quant/statepack.h): store_rows packs rows of values on the FP8 / FP4
 * grids — as the fake-quant recipes leave them — in the three formats; both sides must store
 * the very bytes the host packer writes, and those bytes decode to the stored values bit for
 * bit. The blocks are built to reach every branch of the packers: zeros and −0, the UE8M0
 * scale below the quantiser's (amax far under the grid's top), E4M3 scales whose block
 * maximum is 4·s (the first candidate, amax / 6, is an E4M3 number but leaves some value
 * off the grid) and maxima at 6·s. The reading side (attention, indexer) is checked on the
 * whole model: test_longctx_vulkan. */
static float grid_val(int fmt, uint32_t *st, int max4) {
    static const float e2[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    *st = *st * 1664525u + 1013904223u;
    uint32_t r = *st >> 8;
    float v;
    if (fmt == DSIB_STATE_E4M3_UE8M0) {
        uint8_t c = (uint8_t)(r & 0x7E); /* 0 .. 0x7E (never the NaN code) */
        v = dsii_sp_e4m3_lut[c];
    } else {
        v = e2[max4 ? (r % 7 == 6 ? 1 : r % 7) : r % 8];
    }
    return (r >> 12) & 1 ? -v : v;
}

static void test_packed_state(void **state) {
    (void)state;
    NEED_OP(store_rows);
    static const struct { int32_t fmt; uint32_t width, qcols, block; } F[3] = {
        {DSIB_STATE_E4M3_UE8M0, 96, 64, 32},  /* V4 window / compressed KV: f32 RoPE tail */
        {DSIB_STATE_E2M1_UE8M0, 128, 128, 32}, /* index keys */
        {DSIB_STATE_E2M1_E4M3, 64, 64, 16}};   /* V4.1 compressed KV */
    enum { N = 8 };
    for (int f = 0; f < 3; f++) {
        const uint32_t W = F[f].width, Q = F[f].qcols, B = F[f].block;
        const uint32_t rb = dsii_sp_row_bytes(F[f].fmt, W, Q, B);
        assert_int_equal(rb % 4, 0);
        float *x = falloc((size_t)N * W);
        uint32_t seed = 77u + (uint32_t)f;
        for (uint32_t t = 0; t < N; t++)
            for (uint32_t b = 0; b < Q / B; b++) {
                float *v = x + (size_t)t * W + (size_t)b * B;
                const uint32_t kind = (t * 7 + b) % 5;
                /* scale: a power of two (UE8M0), an E4M3 number (1.5 · 2^k for the max-4
                 * blocks, else any) */
                int k = (int)((t * 3 + b * 5) % 24) - 12;
                float sc = F[f].fmt == DSIB_STATE_E2M1_E4M3
                               ? (kind == 1 ? 1.5f : dsii_sp_e4m3_lut[40 + (t + b) % 40] /
                                                         dsii_sp_e4m3_lut[56]) * ldexpf(1.0f, k / 3)
                               : ldexpf(1.0f, k);
                for (uint32_t i = 0; i < B; i++) v[i] = grid_val(F[f].fmt, &seed, kind == 1) * sc;
                if (kind == 0)
                    for (uint32_t i = 0; i < B; i++) v[i] = (i & 1) ? -0.0f : 0.0f;
                if (kind == 1 && F[f].fmt == DSIB_STATE_E2M1_E4M3) {
                    v[0] = 4.0f * sc;  /* amax = 4 · s: amax / 6 = 2^k is E4M3 ... */
                    v[1] = -0.5f * sc; /* ... but 0.5 · s = 0.75 · 2^k is not on its grid */
                }
                if (kind == 2 && F[f].fmt != DSIB_STATE_E2M1_E4M3)
                    for (uint32_t i = 0; i < B; i++) v[i] *= 0x1p-5f; /* far below the top */
            }
        for (uint32_t t = 0; t < N; t++)
            for (uint32_t i = Q; i < W; i++) x[(size_t)t * W + i] = bt_uniform(-3.0f, 3.0f);
        /* the host packer: exact on these rows */
        uint8_t *want = calloc(N, rb);
        assert_non_null(want);
        for (uint32_t t = 0; t < N; t++)
            assert_int_equal(dsii_sp_pack_row(F[f].fmt, W, Q, B, x + (size_t)t * W, want + (size_t)t * rb), 0);
        bt_buf src = fbuf(x, (size_t)N * W), dst, r = rows1(0, 0, N);
        uint8_t *zero = calloc(N, rb);
        assert_true(bt_buf_new(g_s, &dst, zero, (uint64_t)N * rb));
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->store_rows(g_s[S].strm, V(src), W, N, V(r),
                                        &(dsib_state){dst.b[S], BT_GUARD, 1, N, W, F[f].fmt, rb, Q, B, 0},
                                        W, 1, 0));
        st_ok(st);
        uint8_t *got = malloc((size_t)dst.bytes + 4);
        float *back = falloc(W);
        for (int S = 0; S < 2; S++) {
            assert_int_equal(bt_buf_read(g_s, &dst, S, got), 0);
            size_t diff = 0;
            for (size_t i = 0; i < (size_t)N * rb; i++) diff += got[i] != want[i];
            uint32_t off = 0;
            for (uint32_t t = 0; t < N; t++) {
                dsii_sp_unpack_row(F[f].fmt, W, Q, B, got + (size_t)t * rb, back);
                for (uint32_t i = 0; i < W; i++)
                    off += memcmp(&back[i], &x[(size_t)t * W + i], 4) != 0;
            }
            printf("  store_rows packed format %d on %-6s %zu of %u bytes differ from the host "
                   "packer, %u values off\n", (int)F[f].fmt, g_s[S].be->name, diff, N * rb, off);
            assert_int_equal(diff, 0);
            assert_int_equal(off, 0);
        }
        free(back);
        free(got);
        free(zero);
        free(want);
        free(x);
        bt_buf_free(g_s, &src);
        bt_buf_free(g_s, &dst);
        bt_buf_free(g_s, &r);
    }
}

static void test_copies(void **state) {
    (void)state;
    NEED_OP(copy);
    NEED_OP(copy_rows);
    NEED_OP(store_rows);
    NEED_OP(gather_rows);
    bt_buf a = rbuf(1000, -1, 1), b = rbuf(1000, 0, 0);
    dsi_status st[2];
    RUN_BOTH(st, OPS(S)->copy(g_s[S].strm, bt_view(&a, S, 12), bt_view(&b, S, 40), 2000));
    st_ok(st);
    check_f32("copy", &b, 1000, 0);
    RUN_BOTH(st, OPS(S)->copy_rows(g_s[S].strm, V(a), 100, bt_view(&b, S, 4), 90, 9, 77));
    st_ok(st);
    check_f32("copy_rows", &b, 1000, 0);
    /* rings of 16 rows (ld 60) in 3 slots: one sequence of 19 rows (longer than the ring:
     * only its last 16 are written), then two sequences of 3 and 2 rows in other slots */
    bt_buf ring = rbuf(3 * 16 * 60, 0, 0);
    bt_buf r1 = rows1(1, 13, 19);
    RUN_BOTH(st, OPS(S)->store_rows(g_s[S].strm, V(a), 50, 19, V(r1), &(dsib_state){ring.b[S], BT_GUARD, 3, 16, 60, 0, 0, 0, 0, 0}, 50, 1, DSIB_STORE_RING));
    st_ok(st);
    check_f32("store_rows ring (n > ring)", &ring, ring.bytes / 4, 0);
    int32_t sl[2] = {2, 0}, p0[2] = {40, 7}, cnt[2] = {3, 2};
    bt_buf r2;
    assert_int_equal(bt_rows_new(g_s, &r2, 2, sl, p0, cnt), 5);
    RUN_BOTH(st, OPS(S)->store_rows(g_s[S].strm, V(a), 50, 5, V(r2), &(dsib_state){ring.b[S], BT_GUARD, 3, 16, 60, 0, 0, 0, 0, 0}, 50, 1, DSIB_STORE_RING));
    st_ok(st);
    check_f32("store_rows ring, two sequences", &ring, ring.bytes / 4, 0);
    /* groups of 4: rows at positions 3, 7 (slot 1) and 11 complete groups 0, 1, 2 */
    bt_buf grp = rbuf(2 * 8 * 50, 0, 0), r3 = rows1(1, 2, 10);
    RUN_BOTH(st, OPS(S)->store_rows(g_s[S].strm, V(a), 50, 10, V(r3), &(dsib_state){grp.b[S], BT_GUARD, 2, 8, 50, 0, 0, 0, 0, 0}, 50, 4, 0));
    st_ok(st);
    check_f32("store_rows groups of 4", &grp, grp.bytes / 4, 0);
    int32_t ix[5] = {7, 0, 3, 3, 19};
    bt_buf idx = ibuf(ix, 5), g = rbuf(5 * 40, 0, 0);
    RUN_BOTH(st, OPS(S)->gather_rows(g_s[S].strm, V(a), 50, V(idx), V(g), 40, 5, 33));
    st_ok(st);
    check_f32("gather_rows", &g, g.bytes / 4, 0);
    bt_buf_free(g_s, &a);
    bt_buf_free(g_s, &b);
    bt_buf_free(g_s, &ring);
    bt_buf_free(g_s, &r1);
    bt_buf_free(g_s, &r2);
    bt_buf_free(g_s, &grp);
    bt_buf_free(g_s, &r3);
    bt_buf_free(g_s, &idx);
    bt_buf_free(g_s, &g);
}

static void test_rope(void **state) {
    (void)state;
    NEED_OP(rope_tail);
    dsib_rope ropes[2] = {{10000.0f, 1.0f, 0, 32, 1, 64}, {160000.0f, 16.0f, 65536.0f, 32.0f, 1.0f, 64}};
    /* seven one-row sequences at scattered positions (up to beyond 2^20: all three table
     * levels of the Vulkan module), delta −5 (clamped at 0) */
    int32_t sl[7] = {0, 1, 2, 0, 1, 2, 0}, p0[7] = {100000, 3, 1048577, 2, 777, 65536, 0};
    int32_t cnt[7] = {1, 1, 1, 1, 1, 1, 1};
    bt_buf rw;
    assert_int_equal(bt_rows_new(g_s, &rw, 7, sl, p0, cnt), 7);
    for (int ri = 0; ri < 2; ri++)
        for (int inv = 0; inv < 2; inv++) {
            uint32_t rows = 7, heads = 3, hd = 128, ld = heads * hd + 5;
            bt_buf x = rbuf(rows * ld, -1, 1);
            dsi_status st[2];
            RUN_BOTH(st, OPS(S)->rope_tail(g_s[S].strm, V(x), ld, rows, heads, hd, V(rw), -5,
                                           &ropes[ri], inv));
            st_ok(st);
            check_f32(ri ? "rope_tail yarn" : "rope_tail", &x, x.bytes / 4, 1e-11);
            bt_buf_free(g_s, &x);
        }
    bt_buf_free(g_s, &rw);
}

static void test_fake_quant(void **state) {
    (void)state;
    NEED_OP(fake_quant);
    static const struct { int32_t recipe; uint32_t block, col0, ncols; } cs[] = {
        {DSIB_FQ_E4M3_UE8M0, 64, 0, 448}, {DSIB_FQ_E4M3_UE8M0, 32, 0, 512},
        {DSIB_FQ_E2M1_UE8M0, 32, 0, 128}, {DSIB_FQ_E2M1_E4M3, 16, 0, 512}, {DSIB_FQ_E4M3_UE8M0, 64, 64, 64}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (uint32_t fl = 0; fl < 2; fl++) {
            uint32_t rows = 6, ld = 520;
            float *v = falloc(rows * ld);
            bt_fill(v, rows * ld, -3, 3);
            for (uint32_t j = 0; j < 40; j++) v[j] *= 1e-3f; /* small blocks hit the amax floor */
            v[100] = 300.0f;
            bt_buf x = fbuf(v, rows * ld);
            dsi_status st[2];
            RUN_BOTH(st, OPS(S)->fake_quant(g_s[S].strm, V(x), ld, rows, cs[i].col0, cs[i].ncols,
                                            cs[i].block, cs[i].recipe, fl ? DSIB_FQ_NO_ROUND : 0));
            st_ok(st);
            char what[64];
            snprintf(what, sizeof what, "fake_quant recipe %d block %u%s", cs[i].recipe, cs[i].block,
                     fl ? " no-round" : "");
            check_f32(what, &x, x.bytes / 4, 1e-6);
            free(v);
            bt_buf_free(g_s, &x);
        }
}

static void test_hadamard(void **state) {
    (void)state;
    NEED_OP(hadamard);
    static const uint32_t sizes[] = {2, 128, 256};
    for (int i = 0; i < 3; i++) {
        uint32_t rows = 5, chunks = 3, ld = chunks * sizes[i] + 1;
        bt_buf x = rbuf(rows * ld, -1, 1);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->hadamard(g_s[S].strm, V(x), ld, rows, chunks, sizes[i]));
        st_ok(st);
        check_f32("hadamard", &x, x.bytes / 4, 1e-12);
        bt_buf_free(g_s, &x);
    }
}

static void test_hc(void **state) {
    (void)state;
    NEED_OP(hc_expand);
    NEED_OP(hc_mix);
    NEED_OP(hc_collapse);
    NEED_OP(hc_post);
    static const uint32_t Ds[] = {256, 100};
    for (int di = 0; di < 2; di++) {
        uint32_t D = Ds[di], nh = 4, n = 5, nmix = nh * (2 + nh), ldc = nmix + 2;
        bt_buf e = rbuf(n * D, -1, 1), X = rbuf(n * nh * D, 0, 0), coef = rbuf(n * ldc, 0, 0);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->hc_expand(g_s[S].strm, V(e), D, V(X), n, nh, D));
        st_ok(st);
        check_f32("hc_expand", &X, X.bytes / 4, 0);
        /* perturb the streams so they differ */
        bt_buf d = rbuf(n * nh * D, -0.5f, 0.5f);
        RUN_BOTH(st, OPS(S)->add(g_s[S].strm, V(X), nh * D, V(d), nh * D, V(X), nh * D, n, nh * D));
        st_ok(st);
        tw fn = mkweight(DSI_TYPE_F32, nh * D, nmix, 1, 0.1f);
        float sc[3] = {0.7f, 1.3f, 0.9f}, base[24];
        bt_fill(base, 24, -1, 1);
        tw tsc = mkweight_f32(sc, 3), tb = mkweight_f32(base, 24);
        for (int mode = 0; mode < 2; mode++) {
            RUN_BOTH(st, OPS(S)->hc_mix(g_s[S].strm, V(X), n, nh, D, mode == 0 ? &fn.w[S] : &fn.w[S],
                                        &tsc.w[S], &tb.w[S], 1e-6f, 1e-6f, 20,
                                        DSIB_HC_BLOCK, V(coef), ldc));
            (void)mode;
        }
        st_ok(st);
        check_f32("hc_mix block (Sinkhorn 20)", &coef, coef.bytes / 4, 1e-9);
        bt_buf y = rbuf(n * (D + 3), 0, 0);
        RUN_BOTH(st, OPS(S)->hc_collapse(g_s[S].strm, V(X), V(coef), ldc, V(y), D + 3, n, nh, D));
        st_ok(st);
        check_f32("hc_collapse", &y, y.bytes / 4, 1e-11);
        RUN_BOTH(st, OPS(S)->hc_post(g_s[S].strm, V(y), D + 3, V(X), V(coef), ldc, V(X), n, nh, D));
        st_ok(st);
        check_f32("hc_post (in place)", &X, X.bytes / 4, 1e-10);
        tw fnh = mkweight(DSI_TYPE_BF16, nh * D, nh, 1, 0.1f);
        RUN_BOTH(st, OPS(S)->hc_mix(g_s[S].strm, V(X), n, nh, D, &fnh.w[S], &tsc.w[S], &tb.w[S],
                                    1e-20f, 1e-6f, 20, DSIB_HC_HEAD, V(coef), ldc));
        st_ok(st);
        check_f32("hc_mix head (bf16 fn)", &coef, coef.bytes / 4, 1e-9);
        bt_buf_free(g_s, &e);
        bt_buf_free(g_s, &X);
        bt_buf_free(g_s, &coef);
        bt_buf_free(g_s, &d);
        bt_buf_free(g_s, &y);
        bt_buf_free(g_s, &fn.b);
        bt_buf_free(g_s, &fnh.b);
        bt_buf_free(g_s, &tsc.b);
        bt_buf_free(g_s, &tb.b);
    }
}

static void test_compress_pool(void **state) {
    (void)state;
    NEED_OP(compress_pool);
    static const struct { uint32_t ratio; int overlap; int32_t pos0; uint32_t n; } cs[] = {
        {4, 1, 0, 16}, {4, 1, 8, 8}, {16, 0, 16, 16}, {2, 0, 6, 4}, {1, 0, 3, 5}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        uint32_t r = cs[i].ratio, hd = 100, coff = cs[i].overlap ? 2 : 1, width = coff * hd;
        uint32_t ring_len = coff * r, ldr = width + 3, ldc = width + 1, n = cs[i].n;
        /* the sequence in slot 1 of 2; its rows from positions pos0 on, the ring holds the
         * positions before */
        bt_buf rk = rbuf(2 * ring_len * ldr, -1, 1), rs = rbuf(2 * ring_len * ldr, -3, 3);
        bt_buf kv = rbuf(n * ldc, -1, 1), sc = rbuf(n * ldc, -3, 3), out = rbuf(n * (hd + 2) + 1, 7, 7);
        bt_buf rw = rows1(1, cs[i].pos0, (int32_t)n);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->compress_pool(g_s[S].strm, &(dsib_state){rk.b[S], BT_GUARD, 2, ring_len, ldr, 0, 0, 0, 0, 0},
                                           &(dsib_state){rs.b[S], BT_GUARD, 2, ring_len, ldr, 0, 0, 0, 0, 0},
                                           V(kv), V(sc), ldc, V(rw), n, r, cs[i].overlap, hd,
                                           V(out), hd + 2));
        st_ok(st);
        char what[64];
        snprintf(what, sizeof what, "compress_pool r%u%s %u rows", r, cs[i].overlap ? " overlap" : "", n);
        check_f32(what, &out, out.bytes / 4, 1e-11);
        bt_buf_free(g_s, &rk);
        bt_buf_free(g_s, &rs);
        bt_buf_free(g_s, &kv);
        bt_buf_free(g_s, &sc);
        bt_buf_free(g_s, &out);
        bt_buf_free(g_s, &rw);
    }
}

static void test_indexer(void **state) {
    (void)state;
    NEED_OP(indexer_topk);
    static const struct { int64_t pos0; uint32_t n, topk, heads; } cs[] = {
        {0, 40, 8, 4}, {100, 3, 8, 4}, {37, 9, 512, 2}, {300, 2, 20, 1},
        /* one head: about half the rows score exactly 0, so the last slots are filled from
         * tied zeros (lower position first, §10.2) */
        {300, 2, 50, 1},
        /* a longer context: 1000+ visible rows, top 512 */
        {4000, 2, 512, 2}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        uint32_t hd = 128, H = cs[i].heads, n = cs[i].n, topk = cs[i].topk, ratio = 4;
        uint32_t rows = (uint32_t)((cs[i].pos0 + n) / ratio) + 1;
        /* keys of 2 slots; the sequence uses slot 1 */
        bt_buf q = rbuf(n * H * hd, -1, 1), w = rbuf(n * H, -1, 1), k = rbuf(2 * rows * hd, -1, 1);
        int32_t *init = calloc((size_t)n * topk, 4);
        for (size_t j = 0; j < (size_t)n * topk; j++) init[j] = 12345;
        bt_buf idx = ibuf(init, (size_t)n * topk), rw = rows1(1, (int32_t)cs[i].pos0, (int32_t)n);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->indexer_topk(g_s[S].strm, V(q), H * hd, V(w), H,
                                          &(dsib_state){k.b[S], BT_GUARD, 2, rows, hd, 0, 0, 0, 0, 0}, H, hd,
                                          V(rw), n, ratio, topk, V(idx)));
        st_ok(st);
        check_i32("indexer_topk", &idx, (size_t)n * topk);
        free(init);
        bt_buf_free(g_s, &rw);
        bt_buf_free(g_s, &q);
        bt_buf_free(g_s, &w);
        bt_buf_free(g_s, &k);
        bt_buf_free(g_s, &idx);
    }
}

static void test_attn_sink(void **state) {
    (void)state;
    NEED_OP(attn_sink);
    static const struct { int64_t pos0; uint32_t n, ratio; int use_idx; uint32_t hd; } cs[] = {
        {0, 20, 0, 0, 128}, {50, 3, 4, 1, 128}, {40, 9, 16, 0, 64}, {17, 1, 4, 0, 512}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        uint32_t H = 4, hd = cs[i].hd, n = cs[i].n, window = 16, ring_len = 16, topk = 8;
        int64_t pos0 = cs[i].pos0;
        uint32_t ncomp = cs[i].ratio ? (uint32_t)((pos0 + n) / cs[i].ratio) + 1 : 1;
        /* states of 3 slots; the sequence uses slot 2 */
        bt_buf q = rbuf(n * H * hd, -0.3f, 0.3f), ring = rbuf(3 * ring_len * hd, -1, 1);
        bt_buf kv = rbuf(n * (hd + 4), -1, 1), comp = rbuf(3 * ncomp * hd, -1, 1);
        bt_buf rw = rows1(2, (int32_t)pos0, (int32_t)n);
        bt_buf out = rbuf(n * H * hd, 0, 0);
        int32_t *ix = calloc((size_t)n * topk, 4);
        for (uint32_t t = 0; t < n; t++) {
            int64_t nv = cs[i].ratio ? (pos0 + t + 1) / cs[i].ratio : 0;
            for (uint32_t k = 0; k < topk; k++) ix[t * topk + k] = (int64_t)k * 3 < nv ? (int32_t)(k * 3) : -1;
        }
        bt_buf idx = ibuf(ix, (size_t)n * topk);
        float sk[4] = {0.5f, -1.0f, 2.0f, 0.0f};
        tw sinks = mkweight_f32(sk, 4);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->attn_sink(g_s[S].strm, V(q), H * hd, H, hd, V(rw), n, window,
                                       &(dsib_state){ring.b[S], BT_GUARD, 3, ring_len, hd, 0, 0, 0, 0, 0},
                                       V(kv), hd + 4, cs[i].ratio,
                                       &(dsib_state){comp.b[S], BT_GUARD, 3, ncomp, hd, 0, 0, 0, 0, 0},
                                       cs[i].use_idx ? V(idx) : (dsib_view){NULL, 0}, topk,
                                       &sinks.w[S], 1.0f / sqrtf((float)hd), V(out), H * hd));
        st_ok(st);
        check_f32("attn_sink", &out, out.bytes / 4, 1e-10);
        free(ix);
        bt_buf_free(g_s, &rw);
        bt_buf_free(g_s, &q);
        bt_buf_free(g_s, &ring);
        bt_buf_free(g_s, &kv);
        bt_buf_free(g_s, &comp);
        bt_buf_free(g_s, &out);
        bt_buf_free(g_s, &idx);
        bt_buf_free(g_s, &sinks.b);
    }
}

static void test_moe(void **state) {
    (void)state;
    NEED_OP(moe_route);
    NEED_OP(moe_experts);
    static const struct { uint32_t E, k, n; int hash; int32_t type; } cs[] = {
        {8, 2, 5, 0, DSI_TYPE_MXFP4}, {8, 2, 3, 1, DSI_TYPE_Q8_0}, {16, 6, 2, 0, DSI_TYPE_F16},
        {4, 1, 7, 0, DSI_TYPE_FP8_E4M3_B32}, {8, 2, 5, 0, DSI_TYPE_IQ2_XXS}, {8, 2, 3, 0, 19 /* iq1_s */},
        {8, 3, 4, 1, 23 /* iq4_xs */}, {4, 2, 3, 0, 14 /* q6_k */}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        uint32_t E = cs[i].E, k = cs[i].k, n = cs[i].n, D = 256, F = 64, V_ = 50;
        bt_buf lg = rbuf(n * (E + 1), -4, 4);
        float *bias = falloc(E);
        bt_fill(bias, E, -0.2f, 0.2f);
        tw tb = mkweight_f32(bias, E);
        tw tid = mkweight(DSI_TYPE_I32, k, V_, 1, 1.0f);
        /* tid2eid values must be experts: rewrite them */
        {
            int32_t *v = calloc((size_t)V_ * k, 4);
            for (uint32_t j = 0; j < V_ * k; j++) v[j] = (int32_t)((j * 7 + 3) % E);
            for (int s = 0; s < 2; s++) {
                dsib_error e;
                g_s[s].be->upload(g_s[s].inst, tid.b.b[s], BT_GUARD, v, (uint64_t)V_ * k * 4, &e);
            }
            free(v);
        }
        int32_t ids[8] = {3, 49, 0, 17, 17, 8, 22, 1};
        bt_buf idb = ibuf(ids, 8), sel = ibuf(ids, 8 * 0 + (size_t)n * k);
        bt_buf wts = rbuf((size_t)n * k, 0, 0);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->moe_route(g_s[S].strm, V(lg), E + 1, E, k, &tb.w[S],
                                       cs[i].hash ? &tid.w[S] : NULL, V(idb), i == 2 ? 1e-20f : 0.0f,
                                       1.5f, n, V(sel), V(wts)));
        st_ok(st);
        check_i32("moe_route sel", &sel, (size_t)n * k);
        check_f32("moe_route weights", &wts, (size_t)n * k, 1e-11);
        tw w1 = mkweight(cs[i].type, D, F, E, 1.0f), w3 = mkweight(cs[i].type, D, F, E, 1.0f);
        tw w2 = mkweight(cs[i].type == DSI_TYPE_MXFP4 ? DSI_TYPE_MXFP4 : DSI_TYPE_F16, F, D, E, 1.0f);
        bt_buf x = rbuf(n * (D + 1), -1, 1), y = rbuf(n * (D + 5), 0, 0);
        if (!gpu_declines(DSIB_OP_MOE_EXPERTS, cs[i].type)) {
            RUN_BOTH(st, OPS(S)->moe_experts(g_s[S].strm, V(x), D + 1, V(sel), V(wts), k, &w1.w[S],
                                             &w3.w[S], &w2.w[S], 10.0f, n, V(y), D + 5));
            st_ok(st);
            char what[64];
            snprintf(what, sizeof what, "moe_experts %s E%u k%u n%u", dsi_type_name(cs[i].type), E, k, n);
            check_f32(what, &y, y.bytes / 4, 1e-9);
        }
        free(bias);
        bt_buf_free(g_s, &lg);
        bt_buf_free(g_s, &tb.b);
        bt_buf_free(g_s, &tid.b);
        bt_buf_free(g_s, &idb);
        bt_buf_free(g_s, &sel);
        bt_buf_free(g_s, &wts);
        bt_buf_free(g_s, &w1.b);
        bt_buf_free(g_s, &w3.b);
        bt_buf_free(g_s, &w2.b);
        bt_buf_free(g_s, &x);
        bt_buf_free(g_s, &y);
    }
}

/* ---- V4.1 ops (reported, not yet implemented on every backend) --------------------------- */

static void test_indexer_v41(void **state) {
    (void)state;
    NEED_OP(indexer_topk_v41);
    /* modes: 0 plain, 1 candidate source (cand_out), 2 masked by cand_in */
    static const struct { int64_t pos0; uint32_t n, ratio, topk, heads, cb, ck; int mode; } cs[] = {
        {0, 30, 2, 4, 4, 2, 2, 0}, {0, 30, 1, 4, 4, 2, 2, 1}, {0, 30, 1, 4, 4, 2, 2, 2},
        {200, 5, 1, 16, 2, 8, 6, 1}, {200, 5, 1, 16, 2, 8, 6, 2}, {61, 4, 2, 8, 1, 3, 40, 2}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        uint32_t hd = 128, H = cs[i].heads, n = cs[i].n, topk = cs[i].topk, ck = cs[i].ck;
        uint32_t rows = (uint32_t)((cs[i].pos0 + n) / cs[i].ratio) + 1;
        bt_buf q = rbuf(n * H * hd, -1, 1), w = rbuf(n * H, -1, 1), k = rbuf(rows * hd, -1, 1);
        bt_buf rw = rows1(0, (int32_t)cs[i].pos0, (int32_t)n);
        int32_t *init = calloc((size_t)n * (topk + ck), 4);
        for (size_t j = 0; j < (size_t)n * (topk + ck); j++) init[j] = 777;
        bt_buf idx = ibuf(init, (size_t)n * topk), co = ibuf(init, (size_t)n * ck);
        /* cand_in: ascending block lists with −1 padding, made here */
        int32_t *cin = calloc((size_t)n * ck, 4);
        for (uint32_t t = 0; t < n; t++) {
            int64_t nvis = (cs[i].pos0 + t + 1) / cs[i].ratio;
            int64_t nb = (nvis + cs[i].cb - 1) / cs[i].cb;
            uint32_t m = 0;
            for (int64_t b = 0; b < nb && m < ck; b += 2) cin[t * ck + m++] = (int32_t)b;
            for (; m < ck; m++) cin[t * ck + m] = -1;
        }
        bt_buf ci = ibuf(cin, (size_t)n * ck);
        dsib_view none = {NULL, 0};
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->indexer_topk_v41(g_s[S].strm, V(q), H * hd, V(w), H,
                                              &(dsib_state){k.b[S], BT_GUARD, 1, rows, hd, 0, 0, 0, 0, 0}, H,
                                              hd, V(rw), n, cs[i].ratio, topk, V(idx),
                                              cs[i].mode == 2 ? V(ci) : none,
                                              cs[i].mode == 1 ? V(co) : none, cs[i].cb, ck));
        st_ok(st);
        char what[64];
        snprintf(what, sizeof what, "indexer_topk_v41 mode %d", cs[i].mode);
        check_i32(what, &idx, (size_t)n * topk);
        if (cs[i].mode == 1) check_i32("indexer_topk_v41 candidate blocks", &co, (size_t)n * ck);
        free(init);
        bt_buf_free(g_s, &rw);
        free(cin);
        bt_buf_free(g_s, &q);
        bt_buf_free(g_s, &w);
        bt_buf_free(g_s, &k);
        bt_buf_free(g_s, &idx);
        bt_buf_free(g_s, &co);
        bt_buf_free(g_s, &ci);
    }
}

static void test_engram_gate(void **state) {
    (void)state;
    NEED_OP(engram_gate);
    static const uint32_t Ds[] = {256, 100};
    for (int di = 0; di < 2; di++) {
        uint32_t D = Ds[di], nh = 4, n = 6, ldkv = (nh + 1) * D + 3;
        bt_buf X = rbuf(n * nh * D, -1, 1), kv = rbuf(n * ldkv, -1, 1);
        tw qw = mkweight(DSI_TYPE_BF16, D, nh, 1, 1.0f), kw = mkweight(DSI_TYPE_F32, D, nh, 1, 1.0f);
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->engram_gate(g_s[S].strm, V(X), n, nh, D, V(kv), ldkv, &qw.w[S],
                                         &kw.w[S], 1e-20f));
        st_ok(st);
        check_f32("engram_gate", &X, X.bytes / 4, 1e-11);
        bt_buf_free(g_s, &X);
        bt_buf_free(g_s, &kv);
        bt_buf_free(g_s, &qw.b);
        bt_buf_free(g_s, &kw.b);
    }
}

/* ---- large tensors -------------------------------------------------------------------------- */

/* A weight above the 128 MiB binding limit of lavapipe: the matmul is split into windows. */
static void test_large_matmul(void **state) {
    (void)state;
    NEED_OP(matmul);
    int64_t K = 4096, N = 8208; /* 4096·8208·4 B = 134.5 MB > 128 MiB */
    tw w = mkweight(DSI_TYPE_F32, K, N, 1, 1.0f);
    printf("  large weight: %llu bytes\n", (unsigned long long)w.b.bytes);
    bt_buf x = rbuf(2 * (size_t)K, -1, 1), y = rbuf(2 * (size_t)N, 0, 0);
    dsi_status st[2];
    RUN_BOTH(st, OPS(S)->matmul(g_s[S].strm, &w.w[S], 0, V(x), (uint32_t)K, V(y), (uint32_t)N, 2));
    st_ok(st);
    check_f32("matmul f32 134 MB weight", &y, y.bytes / 4, 1e-9);
    bt_buf_free(g_s, &w.b);
    bt_buf_free(g_s, &x);
    bt_buf_free(g_s, &y);
}

/* Small binding windows and allocation chunks (DSINFER_VULKAN_MAX_BINDING / _CHUNK): weights
 * and expert stacks split over several windows and chunks. */
static void test_split_windows(void **state) {
    (void)state;
    NEED_OP(matmul);
    NEED_OP(moe_experts);
    NEED_OP(get_rows);
    setenv("DSINFER_VULKAN_MAX_BINDING", "65536", 1);
    setenv("DSINFER_VULKAN_CHUNK", "1048576", 1);
    assert_true(bt_reopen_gpu(&g_s[1]));
    /* f32 [1000 x 700]: 2.8 MB over 3 chunks; a row is 4000 B, windows of 16 rows */
    tw w = mkweight(DSI_TYPE_F32, 1000, 700, 1, 1.0f);
    bt_buf x = rbuf(3 * 1000, -1, 1), y = rbuf(3 * 700, 0, 0);
    dsi_status st[2];
    RUN_BOTH(st, OPS(S)->matmul(g_s[S].strm, &w.w[S], 0, V(x), 1000, V(y), 700, 3));
    /* the weight starts at BT_GUARD: rows straddle the 1 MiB chunk boundaries */
    if (st[1] == DSI_ERR_UNSUPPORTED) printf("  (a row straddling a chunk is reported as unsupported)\n");
    assert_int_equal(st[0], DSI_OK);
    bt_buf_free(g_s, &w.b);
    /* q8_0 rows of 34·32 = 1088 B; 2 experts of 700 rows (761 KB each) */
    tw wq = mkweight(DSI_TYPE_Q8_0, 1024, 700, 1, 1.0f);
    bt_buf x2 = rbuf(3 * 1024, -1, 1);
    RUN_BOTH(st, OPS(S)->matmul(g_s[S].strm, &wq.w[S], 0, V(x2), 1024, V(y), 700, 3));
    st_ok(st);
    check_f32("matmul q8_0 in 64 KiB windows", &y, y.bytes / 4, 1e-9);
    int32_t ids[4] = {699, 0, 350, 64};
    bt_buf id = ibuf(ids, 4), rows = rbuf(4 * 1024, 0, 0);
    RUN_BOTH(st, OPS(S)->get_rows(g_s[S].strm, &wq.w[S], V(id), V(rows), 1024, 4));
    st_ok(st);
    check_f32("get_rows in 64 KiB windows", &rows, rows.bytes / 4, 0);
    /* experts: E = 6 of [256 -> 64] mxfp4 (8704 B each: several experts per window) and the
     * down projection [64 -> 256] f32 (65536 B: one expert per window, row-split) */
    uint32_t E = 6, k = 2, n = 4;
    tw w1 = mkweight(DSI_TYPE_MXFP4, 256, 64, E, 1.0f), w3 = mkweight(DSI_TYPE_MXFP4, 256, 64, E, 1.0f);
    tw w2 = mkweight(DSI_TYPE_F32, 64, 256, E, 1.0f);
    int32_t sv[8] = {5, 0, 2, 3, 5, 1, 4, 4};
    float wv[8] = {0.5f, 1, 0.25f, 0.75f, 1, 1, 0.1f, 0.9f};
    bt_buf sel = ibuf(sv, 8), wts = fbuf(wv, 8), xe = rbuf(n * 256, -1, 1), ye = rbuf(n * 256, 0, 0);
    RUN_BOTH(st, OPS(S)->moe_experts(g_s[S].strm, V(xe), 256, V(sel), V(wts), k, &w1.w[S], &w3.w[S],
                                     &w2.w[S], 10.0f, n, V(ye), 256));
    st_ok(st);
    check_f32("moe_experts over windows", &ye, ye.bytes / 4, 1e-9);
    bt_buf_free(g_s, &wq.b);
    bt_buf_free(g_s, &x);
    bt_buf_free(g_s, &x2);
    bt_buf_free(g_s, &y);
    bt_buf_free(g_s, &id);
    bt_buf_free(g_s, &rows);
    bt_buf_free(g_s, &w1.b);
    bt_buf_free(g_s, &w3.b);
    bt_buf_free(g_s, &w2.b);
    bt_buf_free(g_s, &sel);
    bt_buf_free(g_s, &wts);
    bt_buf_free(g_s, &xe);
    bt_buf_free(g_s, &ye);
    unsetenv("DSINFER_VULKAN_MAX_BINDING");
    unsetenv("DSINFER_VULKAN_CHUNK");
    assert_true(bt_reopen_gpu(&g_s[1]));
}

/* Two threads recording on one instance at once (sessions of one model on several threads):
 * each thread's results must equal the single-threaded ones. */
typedef struct thr_arg {
    const dsib_weight *w;
    dsib_buffer *x, *y;
    int iters;
    dsi_status st;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    const dsib_backend *be = g_s[1].be;
    dsib_error e;
    dsib_stream_desc d;
    bt_stream_desc(&d);
    dsib_stream *s = NULL;
    a->st = be->stream_create(g_s[1].inst, &d, &s, &e); /* one stream per thread */
    for (int i = 0; i < a->iters && a->st == DSI_OK; i++) {
        dsib_view x = {a->x, BT_GUARD}, y = {a->y, BT_GUARD};
        dsi_status st = be->ops->matmul(s, a->w, 0, x, 512, y, 300, 3);
        dsi_status st2 = be->sync(s, &e);
        a->st = st ? st : st2;
    }
    be->stream_destroy(s);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    NEED_OP(matmul);
    tw w = mkweight(DSI_TYPE_Q4_K, 512, 300, 1, 1.0f);
    bt_buf x[2] = {rbuf(3 * 512, -1, 1), rbuf(3 * 512, -1, 1)};
    bt_buf y[2] = {rbuf(3 * 300, 0, 0), rbuf(3 * 300, 0, 0)};
    thr_arg args[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        args[i] = (thr_arg){&w.w[1], x[i].b[1], y[i].b[1], 25, DSI_OK};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].st, DSI_OK);
    }
    for (int i = 0; i < 2; i++) {
        dsi_status st[2];
        RUN_BOTH(st, OPS(S)->matmul(g_s[S].strm, &w.w[S], 0, V(x[i]), 512, S == 0 ? V(y[i]) : bt_view(&y[i], 1, 0), 300, S == 0 ? 3 : 0));
        st_ok(st);
        check_f32("matmul from two threads", &y[i], y[i].bytes / 4, 1e-9);
        bt_buf_free(g_s, &x[i]);
        bt_buf_free(g_s, &y[i]);
    }
    bt_buf_free(g_s, &w.b);
}

/* One recording longer than a descriptor pool (512 sets): the module chains pools and never
 * stops in the middle of a step; ops with workspace temporaries (moe_experts) across it. */
static void test_long_recording(void **state) {
    (void)state;
    NEED_OP(scale);
    NEED_OP(moe_experts);
    uint32_t E = 4, k = 2, n = 3, D = 256, F = 64;
    tw w1 = mkweight(DSI_TYPE_Q8_0, D, F, E, 1.0f), w3 = mkweight(DSI_TYPE_Q8_0, D, F, E, 1.0f);
    tw w2 = mkweight(DSI_TYPE_Q8_0, F, D, E, 1.0f);
    int32_t sv[6] = {0, 3, 2, 1, 3, 3};
    float wv[6] = {0.5f, 0.5f, 1, 0.25f, 0.75f, 1};
    bt_buf sel = ibuf(sv, 6), wts = fbuf(wv, 6), x = rbuf(n * D, -1, 1), y = rbuf(n * D, 0, 0);
    bt_buf z = rbuf(100, -1, 1);
    dsi_status st[2];
    for (int S = 0; S < 2; S++) {
        bt_side *sd = &g_s[S];
        dsib_error e;
        memset(&e, 0, sizeof e);
        dsi_status r = DSI_OK;
        for (int i = 0; i < 509 && r == DSI_OK; i++) r = OPS(S)->scale(sd->strm, V(z), 100, 1, 100, 1.001f);
        for (int i = 0; i < 3 && r == DSI_OK; i++)
            r = OPS(S)->moe_experts(sd->strm, V(x), D, V(sel), V(wts), k, &w1.w[S], &w3.w[S], &w2.w[S],
                                    10.0f, n, V(y), D);
        for (int i = 0; i < 600 && r == DSI_OK; i++) r = OPS(S)->scale(sd->strm, V(z), 100, 1, 100, 0.999f);
        dsi_status r2 = sd->be->sync(sd->strm, &e);
        st[S] = r ? r : r2;
    }
    st_ok(st);
    check_f32("1100+ ops in one recording: scale chain", &z, 100, 1e-10);
    check_f32("moe_experts across descriptor pools", &y, y.bytes / 4, 1e-9);
    bt_buf_free(g_s, &w1.b);
    bt_buf_free(g_s, &w3.b);
    bt_buf_free(g_s, &w2.b);
    bt_buf_free(g_s, &sel);
    bt_buf_free(g_s, &wts);
    bt_buf_free(g_s, &x);
    bt_buf_free(g_s, &y);
    bt_buf_free(g_s, &z);
}

/* Device memory that cannot be mapped: upload / download through the staging buffer
 * (DSINFER_VULKAN_FORCE_STAGING=1 forces that path on lavapipe, whose memory is mappable),
 * including transfers larger than the 16 MiB staging buffer. */
static void test_staging(void **state) {
    (void)state;
    NEED_OP(matmul);
    setenv("DSINFER_VULKAN_FORCE_STAGING", "1", 1);
    assert_true(bt_reopen_gpu(&g_s[1]));
    tw w = mkweight(DSI_TYPE_F32, 2048, 2100, 1, 1.0f); /* 17.2 MB: two staging pieces */
    bt_buf x = rbuf(2 * 2048, -1, 1), y = rbuf(2 * 2100, 0, 0);
    dsi_status st[2];
    RUN_BOTH(st, OPS(S)->matmul(g_s[S].strm, &w.w[S], 0, V(x), 2048, V(y), 2100, 2));
    st_ok(st);
    check_f32("matmul, staged upload/download", &y, y.bytes / 4, 1e-9);
    float *back = falloc(w.b.bytes / 4), *orig = falloc(w.b.bytes / 4);
    assert_int_equal(bt_buf_read(g_s, &w.b, 1, back), 0);
    assert_int_equal(bt_buf_read(g_s, &w.b, 0, orig), 0);
    assert_memory_equal(back, orig, w.b.bytes);
    free(back);
    free(orig);
    bt_buf_free(g_s, &w.b);
    bt_buf_free(g_s, &x);
    bt_buf_free(g_s, &y);
    unsetenv("DSINFER_VULKAN_FORCE_STAGING");
    assert_true(bt_reopen_gpu(&g_s[1]));
}

/* Allocation failure: OUT_OF_DEVICE_MEMORY naming the size; the instance stays usable. */
static void test_alloc_failure(void **state) {
    (void)state;
    dsib_buffer *b = NULL;
    dsib_error e;
    memset(&e, 0, sizeof e);
    uint64_t huge = 1ull << 50;
    dsi_status st = g_s[1].be->buffer_alloc(g_s[1].inst, huge, DSIB_BUFFER_WEIGHTS, &b, &e);
    printf("  1 PiB allocation: %s (%s)\n", dsi_status_string(st), e.msg);
    assert_int_equal(st, DSI_ERR_OUT_OF_DEVICE_MEMORY);
    assert_null(b);
    assert_non_null(strstr(e.msg, "1125899906842624"));
    uint64_t used = g_s[1].be->memory_used(g_s[1].inst);
    assert_int_equal(g_s[1].be->buffer_alloc(g_s[1].inst, 1000, DSIB_BUFFER_SCRATCH, &b, &e), DSI_OK);
    assert_true(g_s[1].be->memory_used(g_s[1].inst) >= used + 1000);
    float v[250], r[250];
    bt_fill(v, 250, -1, 1);
    assert_int_equal(g_s[1].be->upload(g_s[1].inst, b, 0, v, 1000, &e), DSI_OK);
    assert_int_equal(g_s[1].be->download(g_s[1].inst, b, 0, r, 1000, &e), DSI_OK);
    assert_memory_equal(v, r, 1000);
    g_s[1].be->buffer_free(g_s[1].inst, b);
    assert_int_equal(g_s[1].be->memory_used(g_s[1].inst), used);
}

/* Last, with DSINFER_VULKAN_VALIDATION=1 only: the layer must be active and have counted no
 * error over everything above. */
static void test_validation(void **state) {
    (void)state;
    assert_int_equal(dsit_vk_validation_check("test_backend_ops"), 0);
}

int main(int argc, char **argv) {
    dsit_filter();
    setvbuf(stdout, NULL, _IONBF, 0);
    bt_seed(20261129);
    /* argv[1]: the GPU module compared with the CPU ("vulkan" by default; "cuda", label gpu) */
    int rc = bt_open(g_s, argc > 1 ? argv[1] : "vulkan");
    if (rc) return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),          cmocka_unit_test(test_matmul_grouped),
        cmocka_unit_test(test_get_rows),        cmocka_unit_test(test_add_rows_periodic),
        cmocka_unit_test(test_rms_norm),        cmocka_unit_test(test_add_scale_swiglu),
        cmocka_unit_test(test_copies),          cmocka_unit_test(test_packed_state),          cmocka_unit_test(test_rope),
        cmocka_unit_test(test_fake_quant),      cmocka_unit_test(test_hadamard),
        cmocka_unit_test(test_hc),              cmocka_unit_test(test_compress_pool),
        cmocka_unit_test(test_indexer),         cmocka_unit_test(test_attn_sink),
        cmocka_unit_test(test_moe),             cmocka_unit_test(test_indexer_v41),
        cmocka_unit_test(test_engram_gate),
        cmocka_unit_test(test_large_matmul),    cmocka_unit_test(test_split_windows),
        cmocka_unit_test(test_long_recording),  cmocka_unit_test(test_staging),  cmocka_unit_test(test_threads),         cmocka_unit_test(test_alloc_failure),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (dsit_vk_validation_requested()) {
        const struct CMUnitTest val[] = {cmocka_unit_test(test_validation)};
        rc += cmocka_run_group_tests_name("validation", val, NULL, NULL);
    }
    bt_close(g_s);
    return rc;
}
