/* The CPU backend's V4.1 ops (backends/backend.h "V4.1 ops") against independent
 * implementations written here: a brute-force sort for the two-level indexer (model-spec
 * §4.3, ties §10.2) and a double-precision Engram gate (§4.6). Also checks that results do
 * not depend on how many tokens one call carries (§10.4). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/common/filter.h"

#include "backends/backend.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/ops_v41.h"
#include "quant/statepack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define IDX_TEST_CHUNK 2048 /* ops_v41.c IDX_CHUNK: rows at its multiples test the chunk edges */

static const dsib_backend *be;
static dsib_instance *inst;
static dsib_stream *strm;

static int setup(void **state) {
    (void)state;
    be = dsib_cpu_backend();
    dsib_host host;
    memset(&host, 0, sizeof host);
    host.struct_size = sizeof host;
    host.n_threads = 2;
    host.device_index = -1;
    dsib_error err;
    if (be->create(&host, &inst, &err) != DSI_OK) return -1;
    dsib_stream_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_rows = 64;
    d.max_positions = 256;
    d.max_heads = 4;
    d.max_head_dim = 16;
    d.max_topk = 16;
    d.max_width = 256;
    return be->stream_create(inst, &d, &strm, &err) == DSI_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    be->stream_destroy(strm);
    be->destroy(inst);
    return 0;
}

static dsib_buffer *wrap(void *p, size_t bytes) {
    dsib_buffer *b = NULL;
    dsib_error err;
    assert_int_equal(be->buffer_wrap_host(inst, p, bytes, DSIB_BUFFER_SCRATCH, &b, &err), DSI_OK);
    return b;
}

static uint32_t rng = 12345u;
static float frand(void) { /* xorshift, uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

/* ---- brute-force reference indexer --------------------------------------------------- */

typedef struct scored {
    float s;
    int32_t i;
} scored;
static int cmp_best_first(const void *a, const void *b) {
    const scored *x = (const scored *)a, *y = (const scored *)b;
    if (x->s > y->s) return -1;
    if (x->s < y->s) return 1;
    return x->i < y->i ? -1 : (x->i > y->i);
}
static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Same score formula as the contract (h ascending, dot in index order, f32) so that equal
 * inputs give equal scores; selection, blocks and masks done by sorting. */
static void ref_indexer(const float *q, const float *w, const float *keys, uint32_t H,
                        uint32_t hd, int64_t p, uint32_t ratio, uint32_t topk,
                        const int32_t *cand_in, int32_t *cand_out, uint32_t cb, uint32_t ck,
                        int32_t *idx) {
    uint32_t nvis = (uint32_t)((p + 1) / ratio);
    scored *sc = calloc(nvis + 1, sizeof *sc);
    for (uint32_t c = 0; c < nvis; c++) {
        float s = 0.0f;
        for (uint32_t h = 0; h < H; h++) {
            float d = 0.0f;
            for (uint32_t i = 0; i < hd; i++) d += q[h * hd + i] * keys[c * hd + i];
            s += (d > 0.0f ? d : 0.0f) * w[h];
        }
        sc[c].s = s;
        sc[c].i = (int32_t)c;
    }
    if (cand_out) {
        for (uint32_t i = 0; i < ck; i++) cand_out[i] = -1;
        uint32_t nb = (nvis + cb - 1) / cb;
        scored *bs = calloc(nb + 1, sizeof *bs);
        for (uint32_t b = 0; b < nb; b++) {
            float m = -INFINITY;
            for (uint32_t c = b * cb; c < nvis && c < (b + 1) * cb; c++) m = fmaxf(m, sc[c].s);
            bs[b].s = (b == nb - 1) ? INFINITY : m;
            bs[b].i = (int32_t)b;
        }
        qsort(bs, nb, sizeof *bs, cmp_best_first);
        uint32_t keep = nb < ck ? nb : ck;
        for (uint32_t i = 0; i < keep; i++) cand_out[i] = bs[i].i;
        qsort(cand_out, keep, sizeof *cand_out, cmp_i32);
        free(bs);
    }
    uint32_t na = 0;
    for (uint32_t c = 0; c < nvis; c++) {
        int ok = 1;
        if (cand_in) {
            ok = 0;
            for (uint32_t j = 0; j < ck; j++)
                if (cand_in[j] == (int32_t)(c / cb)) ok = 1;
        }
        if (ok) sc[na++] = sc[c];
    }
    qsort(sc, na, sizeof *sc, cmp_best_first);
    for (uint32_t i = 0; i < topk; i++) idx[i] = -1;
    uint32_t keep = na < topk ? na : topk;
    for (uint32_t i = 0; i < keep; i++) idx[i] = sc[i].i;
    qsort(idx, keep, sizeof *idx, cmp_i32);
    free(sc);
}

static void run_indexer_case(uint32_t ratio, uint32_t topk, uint32_t cb, uint32_t ck,
                             int with_ties) {
    enum { H = 3, HD = 8, N = 40, ROWS = 64 };
    static float q[N][H * HD], w[N][H], keys[ROWS][HD];
    static int32_t idx[N][16], idx1[N][16], cand[N][16], cand1[N][16], midx[N][16];
    static int32_t ref_idx[16], ref_cand[16];
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < H * HD; i++) q[t][i] = frand();
        for (int h = 0; h < H; h++) w[t][h] = frand();
    }
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < HD; i++) keys[r][i] = frand();
    if (with_ties) /* rows 3..9 identical: equal scores, lower position must win */
        for (int r = 4; r < 10; r++) memcpy(keys[r], keys[3], sizeof keys[3]);
    if (with_ties == 2) /* every score 0 (relu of negative dots): pure tie-breaking */
        for (int t = 0; t < N; t++)
            for (int i = 0; i < H * HD; i++) q[t][i] = 0.0f;

    dsib_buffer *bq = wrap(q, sizeof q), *bw = wrap(w, sizeof w), *bk = wrap(keys, sizeof keys);
    dsib_buffer *bi = wrap(idx, sizeof idx), *bc = wrap(cand, sizeof cand);
    dsib_buffer *bi1 = wrap(idx1, sizeof idx1), *bc1 = wrap(cand1, sizeof cand1);
    dsib_buffer *bm = wrap(midx, sizeof midx);
    const dsib_ops *o = be->ops;
    const dsib_view none = {NULL, 0};
    const int32_t pos0 = 3;
    /* step rows: one sequence (slot 0) at positions pos0 .. pos0+N-1, and single rows */
    static int32_t rows[N][DSIB_ROW_WORDS], row1[N][DSIB_ROW_WORDS];
    for (int t = 0; t < N; t++) {
        rows[t][DSIB_ROW_POS] = pos0 + t, rows[t][DSIB_ROW_SLOT] = 0;
        rows[t][DSIB_ROW_FIRST] = 0, rows[t][DSIB_ROW_COUNT] = N;
        row1[t][DSIB_ROW_POS] = pos0 + t, row1[t][DSIB_ROW_SLOT] = 0;
        row1[t][DSIB_ROW_FIRST] = 0, row1[t][DSIB_ROW_COUNT] = 1;
    }
    dsib_buffer *br = wrap(rows, sizeof rows), *br1 = wrap(row1, sizeof row1);
    dsib_state sk = {bk, 0, 1, ROWS, HD, DSIB_STATE_F32, 0, 0, 0, 0};
    /* candidate source: whole step at once … */
    dsib_view vq = {bq, 0}, vw = {bw, 0}, vi = {bi, 0}, vc = {bc, 0}, vr = {br, 0};
    assert_int_equal(o->indexer_topk_v41(strm, vq, H * HD, vw, H, &sk, H, HD, vr, N, ratio,
                                         topk, vi, none, vc, cb, ck),
                     DSI_OK);
    /* … and token by token: identical */
    for (int t = 0; t < N; t++) {
        dsib_view q1 = {bq, (uint64_t)t * sizeof q[0]}, w1 = {bw, (uint64_t)t * sizeof w[0]};
        dsib_view i1 = {bi1, (uint64_t)t * topk * 4}, c1 = {bc1, (uint64_t)t * ck * 4};
        dsib_view r1 = {br1, (uint64_t)t * sizeof row1[0]};
        assert_int_equal(o->indexer_topk_v41(strm, q1, H * HD, w1, H, &sk, H, HD, r1, 1,
                                             ratio, topk, i1, none, c1, cb, ck),
                         DSI_OK);
    }
    /* masked source reading those candidates */
    dsib_view vm = {bm, 0};
    assert_int_equal(o->indexer_topk_v41(strm, vq, H * HD, vw, H, &sk, H, HD, vr, N, ratio,
                                         topk, vm, vc, none, cb, ck),
                     DSI_OK);
    const int32_t *I = &idx[0][0], *I1 = &idx1[0][0], *Cc = &cand[0][0], *C1 = &cand1[0][0];
    const int32_t *Mi = &midx[0][0];
    for (int t = 0; t < N; t++) {
        ref_indexer(q[t], w[t], &keys[0][0], H, HD, pos0 + t, ratio, topk, NULL, ref_cand, cb,
                    ck, ref_idx);
        for (uint32_t i = 0; i < topk; i++) {
            assert_int_equal(I[t * topk + i], ref_idx[i]);
            assert_int_equal(I1[t * topk + i], ref_idx[i]);
        }
        for (uint32_t i = 0; i < ck; i++) {
            assert_int_equal(Cc[t * ck + i], ref_cand[i]);
            assert_int_equal(C1[t * ck + i], ref_cand[i]);
        }
        ref_indexer(q[t], w[t], &keys[0][0], H, HD, pos0 + t, ratio, topk, ref_cand, NULL, cb,
                    ck, ref_idx);
        for (uint32_t i = 0; i < topk; i++) assert_int_equal(Mi[t * topk + i], ref_idx[i]);
    }
    dsib_buffer *all[] = {bq, bw, bk, bi, bc, bi1, bc1, bm, br, br1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->buffer_free(inst, all[i]);
}

static void test_indexer_ratio2(void **state) {
    (void)state;
    run_indexer_case(2, 4, 2, 2, 0); /* tiny-v41 shape: block 2, 2 blocks, top-4 */
}
static void test_indexer_ratio1(void **state) {
    (void)state;
    run_indexer_case(1, 5, 3, 3, 0);
}
static void test_indexer_ties(void **state) {
    (void)state;
    run_indexer_case(1, 4, 2, 2, 1);
    run_indexer_case(2, 4, 2, 2, 2);
}
static void test_indexer_wide(void **state) {
    (void)state;
    run_indexer_case(1, 16, 4, 16, 0); /* topk and candidates not saturated */
}

/* ---- Engram gate ---------------------------------------------------------------------- */

static void test_engram_gate(void **state) {
    (void)state;
    enum { N = 5, HC = 4, D = 24 };
    static float X[N][HC][D], X0[N][HC][D], kv[N][(HC + 1) * D], qw[HC][D], kw[HC][D];
    for (int t = 0; t < N; t++) {
        for (int h = 0; h < HC; h++)
            for (int d = 0; d < D; d++) X[t][h][d] = frand() * 3.0f;
        for (int i = 0; i < (HC + 1) * D; i++) kv[t][i] = frand();
    }
    for (int h = 0; h < HC; h++)
        for (int d = 0; d < D; d++) {
            qw[h][d] = frand();
            kw[h][d] = frand();
        }
    /* token 2 stream 1: key orthogonal-ish to make |dot| tiny (the 1e-6 floor) */
    for (int d = 0; d < D; d++) kv[2][1 * D + d] = 0.0f;
    memcpy(X0, X, sizeof X);
    dsib_buffer *bx = wrap(X, sizeof X), *bkv = wrap(kv, sizeof kv);
    dsib_buffer *bq = wrap(qw, sizeof qw), *bk = wrap(kw, sizeof kw);
    dsib_weight wq = {bq, 0, DSI_TYPE_F32, 0, {D, HC, 1}, D * 4, (uint64_t)D * HC * 4};
    dsib_weight wk = {bk, 0, DSI_TYPE_F32, 0, {D, HC, 1}, D * 4, (uint64_t)D * HC * 4};
    dsib_view vx = {bx, 0}, vkv = {bkv, 0};
    const float eps = 1e-20f;
    assert_int_equal(be->ops->engram_gate(strm, vx, N, HC, D, vkv, (HC + 1) * D, &wq, &wk, eps),
                     DSI_OK);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < HC; h++) {
            double sx = 0, sk = 0, c = 0;
            for (int d = 0; d < D; d++) {
                sx += (double)X0[t][h][d] * X0[t][h][d];
                sk += (double)kv[t][h * D + d] * kv[t][h * D + d];
                c += (double)X0[t][h][d] * qw[h][d] * kw[h][d] * kv[t][h * D + d];
            }
            double dot = c / sqrt(sx / D + eps) / sqrt(sk / D + eps) / sqrt((double)D);
            double mag = sqrt(fmax(fabs(dot), 1e-6));
            double g = 1.0 / (1.0 + exp(-(dot > 0 ? mag : dot < 0 ? -mag : 0.0)));
            if (t == 2 && h == 1) assert_true(fabs(g - 0.5) < 1e-12); /* key 0: sign 0 */
            for (int d = 0; d < D; d++) {
                double want = X0[t][h][d] + g * kv[t][HC * D + d];
                assert_true(fabs(X[t][h][d] - want) <= 1e-5 * (1.0 + fabs(want)));
            }
        }
    /* one call per token gives the same bits */
    static float Y[N][HC][D];
    memcpy(Y, X0, sizeof Y);
    dsib_buffer *by = wrap(Y, sizeof Y);
    for (int t = 0; t < N; t++) {
        dsib_view vy = {by, (uint64_t)t * sizeof Y[0]}, vk1 = {bkv, (uint64_t)t * sizeof kv[0]};
        assert_int_equal(be->ops->engram_gate(strm, vy, 1, HC, D, vk1, (HC + 1) * D, &wq, &wk, eps),
                         DSI_OK);
    }
    assert_memory_equal(X, Y, sizeof X);
    dsib_buffer *all[] = {bx, bkv, bq, bk, by};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->buffer_free(inst, all[i]);
}

/* Packed index keys (E2M1 values, UE8M0 scales per 32: V4.1's, §4.3), many of them:
 *  - the AVX-512 scan gives the scalar path's bits (scores of every key, tails of 1..15
 *    keys, 13 heads = the 8-, 4- and 1-head groups);
 *  - one-row calls (fewer rows than threads: the scan is split in chunks over the threads)
 *    select exactly what one multi-row call (one task per row) and the brute-force
 *    reference on the unpacked keys select, top-k and candidate blocks. */
static void test_indexer_packed(void **state) {
    (void)state;
    enum { H = 13, HD = 128, BLK = 32, ROWS = 9000, N = 6, TOPK = 16, CB = 64, CK = 8 };
    const uint32_t rb = dsii_sp_row_bytes(DSIB_STATE_E2M1_UE8M0, HD, HD, BLK);
    assert_int_equal(rb, HD / 2 + HD / BLK);
    uint8_t *packed = malloc((size_t)ROWS * rb);
    float *keys = malloc(sizeof(float) * ROWS * HD);
    static float q[N][H * HD], w[N][H];
    assert_non_null(packed);
    assert_non_null(keys);
    for (uint32_t r = 0; r < ROWS; r++) {
        uint8_t *row = packed + (size_t)r * rb;
        for (uint32_t i = 0; i < HD / 2; i++) row[i] = (uint8_t)((rng = rng * 1664525u + 1013904223u) >> 24);
        for (uint32_t b = 0; b < HD / BLK; b++) row[HD / 2 + b] = (uint8_t)(120 + (rng >> 28)); /* 2^-7 .. 2^8 */
        if (r % 97 == 5) row[HD / 2] = 0;                                            /* 2^-127 */
        dsii_sp_unpack_row(DSIB_STATE_E2M1_UE8M0, HD, HD, BLK, row, keys + (size_t)r * HD);
    }
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < H * HD; i++) q[t][i] = frand();
        for (int h = 0; h < H; h++) w[t][h] = frand();
    }
    dsib_buffer *bk = wrap(packed, (size_t)ROWS * rb);
    dsib_state sk = {bk, 0, 1, ROWS, HD, DSIB_STATE_E2M1_UE8M0, rb, HD, BLK, 0};

    /* scores: the process's path against the scalar one, bit for bit */
    float *s_def = malloc(sizeof(float) * ROWS), *s_sc = malloc(sizeof(float) * ROWS);
    assert_non_null(s_def);
    assert_non_null(s_sc);
    const uint32_t ranges[][2] = {{0, ROWS}, {3, 4}, {5, 20}, {17, 48}, {ROWS - 15, ROWS}};
    /* every SIMD scan the CPU can run (AVX2; AVX-512 too where present) */
    const int32_t native = dsib_cpu_ops_isa();
    const int32_t isas[2] = {DSIB_ISA_AVX2, DSIB_ISA_AVX512};
    const int n_isa = native >= DSIB_ISA_AVX512 ? 2 : native >= DSIB_ISA_AVX2 ? 1 : 0;
    for (int ii = 0; ii < (n_isa ? n_isa : 1); ii++)
    for (uint32_t hh = 1; hh <= H; hh += 4)
        for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
            const uint32_t c0 = ranges[k][0], c1 = ranges[k][1];
            memset(s_def, 0xff, sizeof(float) * ROWS);
            memset(s_sc, 0xff, sizeof(float) * ROWS);
            dsib_cpu_ops_force_isa(n_isa ? isas[ii] : -1);
            dsib_cpu_indexer_v41_scores(q[1], w[1], &sk, 0, hh, HD, c0, c1, s_def);
            dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR);
            dsib_cpu_indexer_v41_scores(q[1], w[1], &sk, 0, hh, HD, c0, c1, s_sc);
            dsib_cpu_ops_force_isa(-1);
            assert_memory_equal(s_def, s_sc, sizeof(float) * ROWS);
            for (uint32_t c = c0; c < c1; c++) { /* the formula, in double */
                double sd = 0.0, mag = 0.0;
                for (uint32_t h = 0; h < hh; h++) {
                    double d = 0.0;
                    for (uint32_t i = 0; i < HD; i++) {
                        d += (double)q[1][h * HD + i] * keys[(size_t)c * HD + i];
                        mag += fabs((double)q[1][h * HD + i] * keys[(size_t)c * HD + i]) * fabs(w[1][h]);
                    }
                    sd += (d > 0 ? d : 0) * w[1][h];
                }
                assert_true(fabs(s_def[c] - sd) <= 1e-5 * (mag + 1e-30));
            }
        }
    if (n_isa == 0)
        print_message("note: no AVX2 here; the scan comparison ran the scalar path twice\n");
    else if (n_isa == 1)
        print_message("note: no AVX-512 here; only the AVX2 scan was compared\n");

    /* selection: chunked one-row calls = one multi-row call = the reference */
    dsib_stream *st2 = NULL;
    dsib_stream_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_rows = 64;
    d.max_positions = ROWS + 8;
    d.max_heads = H;
    d.max_head_dim = HD;
    d.max_topk = TOPK;
    d.max_width = 256;
    dsib_error err;
    assert_int_equal(be->stream_create(inst, &d, &st2, &err), DSI_OK);
    static int32_t rows[N][DSIB_ROW_WORDS], row1[N][DSIB_ROW_WORDS], idx[N][TOPK], idx1[N][TOPK], cand[N][CK], cand1[N][CK],
        ref_idx[TOPK], ref_cand[CK];
    const int32_t pos[N] = {ROWS - 1, 4 * IDX_TEST_CHUNK, 4 * IDX_TEST_CHUNK + 1, 7001, 4100, 2 * IDX_TEST_CHUNK + 3};
    for (int t = 0; t < N; t++) {
        rows[t][DSIB_ROW_POS] = pos[t], rows[t][DSIB_ROW_SLOT] = 0;
        rows[t][DSIB_ROW_FIRST] = t, rows[t][DSIB_ROW_COUNT] = 1;
        memcpy(row1[t], rows[t], sizeof rows[t]);
        row1[t][DSIB_ROW_FIRST] = 0;
    }
    dsib_buffer *bq = wrap(q, sizeof q), *bw = wrap(w, sizeof w), *br = wrap(rows, sizeof rows);
    dsib_buffer *br1 = wrap(row1, sizeof row1);
    dsib_buffer *bi = wrap(idx, sizeof idx), *bi1 = wrap(idx1, sizeof idx1);
    dsib_buffer *bc = wrap(cand, sizeof cand), *bc1 = wrap(cand1, sizeof cand1);
    const dsib_view none = {NULL, 0};
    dsib_view vq = {bq, 0}, vw = {bw, 0}, vr = {br, 0}, vi = {bi, 0}, vc = {bc, 0};
    assert_int_equal(be->ops->indexer_topk_v41(st2, vq, H * HD, vw, H, &sk, H, HD, vr, N, 1, TOPK,
                                               vi, none, vc, CB, CK),
                     DSI_OK);
    for (int t = 0; t < N; t++) {
        dsib_view q1 = {bq, (uint64_t)t * sizeof q[0]}, w1 = {bw, (uint64_t)t * sizeof w[0]};
        dsib_view r1 = {br1, (uint64_t)t * sizeof row1[0]};
        dsib_view i1 = {bi1, (uint64_t)t * sizeof idx1[0]}, c1 = {bc1, (uint64_t)t * sizeof cand1[0]};
        assert_int_equal(be->ops->indexer_topk_v41(st2, q1, H * HD, w1, H, &sk, H, HD, r1, 1, 1,
                                                   TOPK, i1, none, c1, CB, CK),
                         DSI_OK);
        ref_indexer(q[t], w[t], keys, H, HD, pos[t], 1, TOPK, NULL, ref_cand, CB, CK, ref_idx);
        assert_memory_equal(idx[t], ref_idx, sizeof ref_idx);
        assert_memory_equal(idx1[t], ref_idx, sizeof ref_idx);
        assert_memory_equal(cand[t], ref_cand, sizeof ref_cand);
        assert_memory_equal(cand1[t], ref_cand, sizeof ref_cand);
    }
    dsib_buffer *all[] = {bk, bq, bw, br, br1, bi, bi1, bc, bc1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->buffer_free(inst, all[i]);
    be->stream_destroy(st2);
    free(packed);
    free(keys);
    free(s_def);
    free(s_sc);
}

/* The shapes the AVX2 tile decode takes apart (the packed test above is 128 dims, scales per
 * 32): 64-dim transposed groups with 8-dim remainders, scales per 8 / 16 / 64 dims, and keys
 * too wide for two tiles (eight keys a step); the SIMD scans against the scalar one, bit for
 * bit, and within 1e-5 of the formula in double. */
static void test_indexer_scan_shapes(void **state) {
    (void)state;
    enum { H = 13, ROWS = 200, MAXHD = 576 };
    const uint32_t shapes[][2] = {{96, 8}, {256, 64}, {576, 16}, {64, 16}};
    const uint32_t ranges[][2] = {{0, ROWS}, {3, 4}, {5, 20}, {17, 48}, {ROWS - 9, ROWS}};
    static float q[H * MAXHD], w[H], keys[ROWS * MAXHD], s_def[ROWS], s_sc[ROWS];
    static uint8_t packed[ROWS * (MAXHD / 2 + MAXHD / 8)];
    const int32_t native = dsib_cpu_ops_isa();
    const int32_t isas[2] = {DSIB_ISA_AVX2, DSIB_ISA_AVX512};
    const int n_isa = native >= DSIB_ISA_AVX512 ? 2 : native >= DSIB_ISA_AVX2 ? 1 : 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const uint32_t HD = shapes[sh][0], BLK = shapes[sh][1];
        const uint32_t rb = dsii_sp_row_bytes(DSIB_STATE_E2M1_UE8M0, HD, HD, BLK);
        for (uint32_t r = 0; r < ROWS; r++) {
            uint8_t *row = packed + (size_t)r * rb;
            for (uint32_t i = 0; i < HD / 2; i++) row[i] = (uint8_t)((rng = rng * 1664525u + 1013904223u) >> 24);
            for (uint32_t b = 0; b < HD / BLK; b++) row[HD / 2 + b] = (uint8_t)(118 + ((rng >> 12) + 5 * b) % 20);
            if (r % 7 == 2) row[HD / 2 + (r / 7) % (HD / BLK)] = 0; /* 2^-127 */
            dsii_sp_unpack_row(DSIB_STATE_E2M1_UE8M0, HD, HD, BLK, row, keys + (size_t)r * HD);
        }
        for (uint32_t i = 0; i < H * HD; i++) q[i] = frand();
        for (int h = 0; h < H; h++) w[h] = frand();
        dsib_buffer *bk = wrap(packed, (size_t)ROWS * rb);
        dsib_state sk = {bk, 0, 1, ROWS, HD, DSIB_STATE_E2M1_UE8M0, rb, HD, BLK, 0};
        for (int ii = 0; ii < (n_isa ? n_isa : 1); ii++)
            for (uint32_t hh = 1; hh <= H; hh += 4)
                for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
                    const uint32_t c0 = ranges[k][0], c1 = ranges[k][1];
                    memset(s_def, 0xff, sizeof s_def);
                    memset(s_sc, 0xff, sizeof s_sc);
                    dsib_cpu_ops_force_isa(n_isa ? isas[ii] : -1);
                    dsib_cpu_indexer_v41_scores(q, w, &sk, 0, hh, HD, c0, c1, s_def);
                    dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR);
                    dsib_cpu_indexer_v41_scores(q, w, &sk, 0, hh, HD, c0, c1, s_sc);
                    dsib_cpu_ops_force_isa(-1);
                    assert_memory_equal(s_def, s_sc, sizeof s_def);
                    for (uint32_t c = c0; c < c1; c++) {
                        double sd = 0.0, mag = 0.0;
                        for (uint32_t h = 0; h < hh; h++) {
                            double d = 0.0;
                            for (uint32_t i = 0; i < HD; i++) {
                                d += (double)q[h * HD + i] * keys[(size_t)c * HD + i];
                                mag += fabs((double)q[h * HD + i] * keys[(size_t)c * HD + i]) * fabs(w[h]);
                            }
                            sd += (d > 0 ? d : 0) * w[h];
                        }
                        assert_true(fabs(s_def[c] - sd) <= 1e-5 * (mag + 1e-30));
                    }
                }
        be->buffer_free(inst, bk);
    }
}

int main(void) {
    dsit_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indexer_ratio2), cmocka_unit_test(test_indexer_ratio1),
        cmocka_unit_test(test_indexer_ties),   cmocka_unit_test(test_indexer_wide),
        cmocka_unit_test(test_engram_gate),    cmocka_unit_test(test_indexer_packed),
        cmocka_unit_test(test_indexer_scan_shapes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
