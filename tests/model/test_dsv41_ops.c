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

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

int main(void) {
    dsit_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indexer_ratio2), cmocka_unit_test(test_indexer_ratio1),
        cmocka_unit_test(test_indexer_ties),   cmocka_unit_test(test_indexer_wide),
        cmocka_unit_test(test_engram_gate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
