/*
 * CPU backend ops used by the V4 forward pass, against expectations computed here from the
 * definitions in model-spec (not from the op code): top-k ties (§10.2), the three §10.1
 * fake-quant recipes incl. ties and the no-round switch, Hadamard, RoPE inverse, Sinkhorn
 * (§3.3), MoE routing ties / hash routing / weights (§3.5), the compressor's overlapping
 * lanes (§3.4), and the ring-vs-step split of sink attention (§10.4). Ops run on a CPU stream;
 * positions and state slots come from step rows (backends/backend.h, DSIB_ROW_*).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/common/filter.h"
#include "tests/common/skip.h"

#include "backends/backend.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/kernels/kernels.h"
#include "quant/fp.h"
#include "quant/statepack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const dsib_backend *be;
static dsib_instance *inst;
static dsib_stream *strm;
static const dsib_ops *ops;
static int32_t g_rows[64 * DSIB_ROW_WORDS]; /* step rows (rows_at) */
static dsib_buffer *g_rows_buf;

static int setup(void **state) {
    (void)state;
    be = dsib_cpu_backend();
    ops = be->ops;
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
    d.max_positions = 1024;
    d.max_heads = 8;
    d.max_head_dim = 128;
    d.max_topk = 16;
    d.max_experts = 16;
    d.max_experts_used = 4;
    d.max_width = 1024;
    return be->stream_create(inst, &d, &strm, &err) == DSI_OK ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    if (g_rows_buf) be->buffer_free(inst, g_rows_buf);
    be->stream_destroy(strm);
    be->destroy(inst);
    return 0;
}

/* Wrapped host memory (freed with unwrap). */
static dsib_view wrap(void *p, size_t bytes) {
    dsib_buffer *b = NULL;
    dsib_error err;
    assert_int_equal(be->buffer_wrap_host(inst, p, bytes, DSIB_BUFFER_SCRATCH, &b, &err), DSI_OK);
    dsib_view v = {b, 0};
    return v;
}
static void unwrap(dsib_view v) { be->buffer_free(inst, v.buf); }

/* Step rows of one sequence (slot 0) at positions pos0 .. pos0+n-1, in `store` (n <= 64). */

static dsib_view rows_at(int32_t pos0, uint32_t n) {
    for (uint32_t t = 0; t < n; t++) {
        int32_t *r = g_rows + t * DSIB_ROW_WORDS;
        r[DSIB_ROW_POS] = pos0 + (int32_t)t;
        r[DSIB_ROW_SLOT] = 0;
        r[DSIB_ROW_FIRST] = 0;
        r[DSIB_ROW_COUNT] = (int32_t)n;
    }
    if (!g_rows_buf) g_rows_buf = wrap(g_rows, sizeof g_rows).buf;
    dsib_view v = {g_rows_buf, 0};
    return v;
}

/* One slot of state over a wrapped array: `rows` rows of `ld` floats. */
static dsib_state state_of(dsib_view v, uint32_t rows, uint32_t ld) {
    dsib_state s = {v.buf, v.offset, 1, rows, ld, DSIB_STATE_F32, 0, 0, 0, 0};
    return s;
}

static dsib_weight wf32(dsib_view v, int64_t ne0, int64_t ne1) {
    dsib_weight w;
    memset(&w, 0, sizeof w);
    w.buf = v.buf;
    w.type = DSI_TYPE_F32;
    w.ne[0] = ne0;
    w.ne[1] = ne1;
    w.ne[2] = 1;
    w.nb1 = (uint64_t)ne0 * 4;
    w.nb2 = w.nb1 * (uint64_t)ne1;
    return w;
}

static uint32_t rng = 777u;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}

/* ---- indexer top-k (§10.2) ------------------------------------------------------------- */

static void test_indexer_ties(void **state) {
    (void)state;
    /* 2 heads, hd 8, keys crafted so that many scores are exactly 0 (relu) or equal */
    enum { H = 2, HD = 8, ROWS = 20, TOPK = 5 };
    float q[H * HD] = {0}, w[H] = {1.0f, 0.5f}, keys[ROWS * HD] = {0};
    q[0] = 1.0f;      /* head 0 looks at dim 0 */
    q[HD + 1] = 1.0f; /* head 1 looks at dim 1 */
    /* scores: row c: relu(k[c][0]) * 1 + relu(k[c][1]) * 0.5 */
    const float k0[ROWS] = {0, -1, 2, 0, 2, 0, 1, 1, 0, 3, 0, 0, 2, -2, 0, 1, 0, 0, 0, 0};
    for (int c = 0; c < ROWS; c++) keys[c * HD] = k0[c];
    keys[7 * HD + 1] = 2.0f; /* row 7: 1 + 1 = 2, ties with rows 2, 4, 12 */
    int32_t idx[3 * TOPK];
    dsib_view vq = wrap(q, sizeof q), vw = wrap(w, sizeof w), vk = wrap(keys, sizeof keys),
              vi = wrap(idx, sizeof idx);
    dsib_state sk = state_of(vk, ROWS, HD);
    /* tokens at p = 7 (nvis 2 with ratio 4 -> all rows, padded), p = 79 (nvis 20), and
     * p = 35 (nvis 9) */
    assert_int_equal(ops->indexer_topk(strm, vq, 0, vw, 0, &sk, H, HD, rows_at(7, 1), 1, 4, TOPK, vi), DSI_OK);
    const int32_t want0[TOPK] = {0, 1, -1, -1, -1};
    assert_memory_equal(idx, want0, sizeof want0);
    assert_int_equal(ops->indexer_topk(strm, vq, 0, vw, 0, &sk, H, HD, rows_at(79, 1), 1, 4, TOPK, vi), DSI_OK);
    /* ranking: 9 (3), then 2, 4, 7, 12 (2; lowest positions first) -> {2,4,7,9,12} */
    const int32_t want1[TOPK] = {2, 4, 7, 9, 12};
    assert_memory_equal(idx, want1, sizeof want1);
    assert_int_equal(ops->indexer_topk(strm, vq, 0, vw, 0, &sk, H, HD, rows_at(35, 1), 1, 4, TOPK, vi), DSI_OK);
    /* rows 0..8: 2 (2), 4 (2), 7 (2), 6 (1), then the 0-score rows 0, 3, 5, 8 and row 1
     * (relu(-1) = 0): the lowest, row 0 */
    const int32_t want2[TOPK] = {0, 2, 4, 6, 7};
    assert_memory_equal(idx, want2, sizeof want2);
    unwrap(vq);
    unwrap(vw);
    unwrap(vk);
    unwrap(vi);
}

/* Few rows over many keys: one-row calls (fewer rows than threads: the scan is split in
 * chunks over the threads) select exactly what one multi-row call (one task per row)
 * selects; positions at and around the chunk edges, ties across them (identical keys). */
static void test_indexer_split(void **state) {
    (void)state;
    enum { H = 4, HD = 64, ROWS = 5000, N = 5, TOPK = 16 };
    float *keys = malloc(sizeof(float) * ROWS * HD);
    static float q[N][H * HD], w[N][H];
    assert_non_null(keys);
    for (int i = 0; i < ROWS * HD; i++) keys[i] = frand();
    for (int c = 1020; c < 1030; c++) memcpy(keys + c * HD, keys + 1019 * HD, sizeof(float) * HD);
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < H * HD; i++) q[t][i] = frand();
        for (int h = 0; h < H; h++) w[t][h] = frand();
    }
    memcpy(q[4], q[0], sizeof q[0]); /* row 4 scores key 1019 highly: its copies tie */
    for (int i = 0; i < H * HD; i++) q[4][i] = keys[1019 * HD + i % HD];
    for (int h = 0; h < H; h++) w[4][h] = 1.0f;
    dsib_stream *st2 = NULL;
    dsib_stream_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_rows = 64;
    d.max_positions = ROWS + 8;
    d.max_heads = H;
    d.max_head_dim = HD;
    d.max_topk = TOPK;
    d.max_width = 1024;
    dsib_error err;
    assert_int_equal(be->stream_create(inst, &d, &st2, &err), DSI_OK);
    const int32_t pos[N] = {ROWS - 1, 2048, 2049, 3071, 4000};
    static int32_t rows[N][DSIB_ROW_WORDS], row1[N][DSIB_ROW_WORDS], idx[N][TOPK], idx1[N][TOPK];
    for (int t = 0; t < N; t++) {
        rows[t][DSIB_ROW_POS] = pos[t], rows[t][DSIB_ROW_SLOT] = 0;
        rows[t][DSIB_ROW_FIRST] = t, rows[t][DSIB_ROW_COUNT] = 1;
        memcpy(row1[t], rows[t], sizeof rows[t]);
        row1[t][DSIB_ROW_FIRST] = 0;
    }
    dsib_view vq = wrap(q, sizeof q), vw = wrap(w, sizeof w), vk = wrap(keys, sizeof(float) * ROWS * HD);
    dsib_view vr = wrap(rows, sizeof rows), vr1 = wrap(row1, sizeof row1);
    dsib_view vi = wrap(idx, sizeof idx), vi1 = wrap(idx1, sizeof idx1);
    dsib_state sk = state_of(vk, ROWS, HD);
    assert_int_equal(ops->indexer_topk(st2, vq, H * HD, vw, H, &sk, H, HD, vr, N, 1, TOPK, vi), DSI_OK);
    for (int t = 0; t < N; t++) {
        dsib_view q1 = {vq.buf, (uint64_t)t * sizeof q[0]}, w1 = {vw.buf, (uint64_t)t * sizeof w[0]};
        dsib_view r1 = {vr1.buf, (uint64_t)t * sizeof row1[0]}, i1 = {vi1.buf, (uint64_t)t * sizeof idx1[0]};
        assert_int_equal(ops->indexer_topk(st2, q1, H * HD, w1, H, &sk, H, HD, r1, 1, 1, TOPK, i1), DSI_OK);
        assert_memory_equal(idx[t], idx1[t], sizeof idx[t]);
        for (int i = 0; i < TOPK; i++) assert_true(idx[t][i] >= 0 && idx[t][i] <= pos[t]);
    }
    for (int c = 1019; c < 1030; c++) { /* the tied copies (the best scores) are all chosen */
        int found = 0;
        for (int i = 0; i < TOPK; i++) found |= idx[4][i] == c;
        assert_true(found);
    }
    unwrap(vq);
    unwrap(vw);
    unwrap(vk);
    unwrap(vr);
    unwrap(vr1);
    unwrap(vi);
    unwrap(vi1);
    be->stream_destroy(st2);
    free(keys);
}

/* V4's index keys packed (E2M1 values, UE8M0 scales per 32, as the forward pass stores
 * them): the AVX-512 scan gives the scalar path's scores bit for bit (tails of 1..15 keys,
 * -0 / NaN-free random data with some 2^-127 scales), and both are within 1e-5 of the
 * formula in double. */
static void packed_scan_shape(const uint32_t HD, const uint32_t BLK, const uint32_t ROWS) {
    enum { H = 5 };
    const uint32_t rb = dsii_sp_row_bytes(DSIB_STATE_E2M1_UE8M0, HD, HD, BLK);
    uint8_t *packed = malloc((size_t)ROWS * rb);
    float *keys = malloc(sizeof(float) * ROWS * HD), *s_def = malloc(sizeof(float) * ROWS),
          *s_sc = malloc(sizeof(float) * ROWS);
    static float q[H * 576], w[H];
    assert_true(packed && keys && s_def && s_sc && HD <= 576);
    for (uint32_t r = 0; r < ROWS; r++) {
        uint8_t *row = packed + (size_t)r * rb;
        for (uint32_t i = 0; i < HD / 2; i++) row[i] = (uint8_t)((rng = rng * 1664525u + 1013904223u) >> 24);
        for (uint32_t b = 0; b < HD / BLK; b++) row[HD / 2 + b] = (uint8_t)(120 + (rng >> 28));
        if (r % 89 == 3) row[HD / 2 + 1] = 0;
        dsii_sp_unpack_row(DSIB_STATE_E2M1_UE8M0, HD, HD, BLK, row, keys + (size_t)r * HD);
    }
    for (uint32_t i = 0; i < H * HD; i++) q[i] = frand();
    for (int h = 0; h < H; h++) w[h] = frand();
    dsib_view vk = wrap(packed, (size_t)ROWS * rb);
    dsib_state sk = {vk.buf, 0, 1, ROWS, HD, DSIB_STATE_E2M1_UE8M0, rb, HD, BLK, 0};
    const int64_t ranges[][2] = {{0, ROWS}, {2, 3}, {7, 22}, {100, 131}, {ROWS - 13, ROWS}};
    assert_true(ROWS >= 131);
    /* every SIMD scan the CPU can run (AVX2; AVX-512 too where present) against the scalar
     * one, bit for bit */
    const int32_t native = dsib_cpu_ops_isa();
    const int32_t isas[2] = {DSIB_ISA_AVX2, DSIB_ISA_AVX512};
    const int n_isa = native >= DSIB_ISA_AVX512 ? 2 : native >= DSIB_ISA_AVX2 ? 1 : 0;
    for (int ii = 0; ii < (n_isa ? n_isa : 1); ii++)
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        const int64_t c0 = ranges[k][0], c1 = ranges[k][1];
        memset(s_def, 0xff, sizeof(float) * ROWS);
        memset(s_sc, 0xff, sizeof(float) * ROWS);
        dsib_cpu_ops_force_isa(n_isa ? isas[ii] : -1);
        dsib_cpu_indexer_v4_scores(q, w, &sk, H, HD, c0, c1, s_def);
        dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR);
        dsib_cpu_indexer_v4_scores(q, w, &sk, H, HD, c0, c1, s_sc);
        dsib_cpu_ops_force_isa(-1);
        assert_memory_equal(s_def, s_sc, sizeof(float) * ROWS);
        for (int64_t c = c0; c < c1; c++) {
            double sd = 0.0, mag = 0.0;
            for (int h = 0; h < H; h++) {
                double d = 0.0;
                for (uint32_t i = 0; i < HD; i++) {
                    d += (double)q[h * HD + i] * keys[c * HD + i];
                    mag += fabs((double)q[h * HD + i] * keys[c * HD + i] * w[h]);
                }
                sd += (d > 0 ? d : 0) * w[h];
            }
            assert_true(fabs(s_def[c] - sd) <= 1e-5 * (mag + 1e-30));
        }
    }
    if (n_isa == 0)
        print_message("note: no AVX2 here; the scan comparison ran the scalar path twice\n");
    else if (n_isa == 1)
        print_message("note: no AVX-512 here; only the AVX2 scan was compared\n");
    unwrap(vk);
    free(packed);
    free(keys);
    free(s_def);
    free(s_sc);
}

/* The shapes the AVX2 tile decode takes apart: 64-dim transposed groups and 8-dim remainders,
 * scales per 8 / 16 / 32 / 64 dims, and a key too wide for two tiles (eight keys a step). */
static void test_indexer_packed_scan(void **state) {
    (void)state;
    packed_scan_shape(128, 32, 3000);
    packed_scan_shape(96, 8, 300);
    packed_scan_shape(256, 64, 300);
    packed_scan_shape(576, 16, 300);
}

/* ---- fake quant (§10.1) ------------------------------------------------------------------ */

static void fq(float *x, uint32_t n, uint32_t block, int32_t recipe, uint32_t flags) {
    dsib_view v = wrap(x, sizeof(float) * n);
    assert_int_equal(ops->fake_quant(strm, v, n, 1, 0, n, block, recipe, flags), DSI_OK);
    unwrap(v);
}

static void test_fake_quant_e4m3(void **state) {
    (void)state;
    /* amax 448 -> scale exactly 1 (a power of two maps to itself) */
    float x[8] = {448.0f, 1.0625f, 1.1875f, 304.0f, -0.0f, 0x1p-10f, 3.0f * 0x1p-10f, -7.0f};
    /* e4m3 grid: [1,2) step 1/8, [256,448] step 32, subnormal step 2^-9 */
    const float want[8] = {448.0f, 1.0f, 1.25f, 320.0f, -0.0f, 0.0f, 0x1p-8f, -7.0f};
    float y[8];
    memcpy(y, x, sizeof x);
    fq(y, 8, 8, DSIB_FQ_E4M3_UE8M0, 0);
    assert_memory_equal(y, want, sizeof want);
    /* no-round: clamp + rescale only (scale 1, nothing clamped) -> unchanged */
    memcpy(y, x, sizeof x);
    fq(y, 8, 8, DSIB_FQ_E4M3_UE8M0, DSIB_FQ_NO_ROUND);
    assert_memory_equal(y, x, sizeof x);
    /* amax 1000 -> s = 2^ceil(log2(1000/448)) = 4; -1000/4 = -250 -> -256 -> -1024;
     * 10/4 = 2.5 -> 2.5 (on the grid: step 1/4 in [2,4)) */
    float z[4] = {-1000.0f, 10.0f, 0.0f, 1.0f};
    fq(z, 4, 4, DSIB_FQ_E4M3_UE8M0, 0);
    assert_true(z[0] == -1024.0f && z[1] == 10.0f && z[2] == 0.0f && z[3] == 1.0f);
    /* two blocks scale independently: block 2 all tiny -> amax floor 1e-4 */
    float b2[4] = {448.0f, 1.0625f, 1e-6f, 0.0f};
    fq(b2, 4, 2, DSIB_FQ_E4M3_UE8M0, 0);
    /* block 2: s = 2^ceil(log2(1e-4/448)) = 2^-22; 1e-6/2^-22 = 4.194 -> e4m3 4.0 -> 4·2^-22 */
    assert_true(b2[0] == 448.0f && b2[1] == 1.0f && b2[2] == 4.0f * 0x1p-22f && b2[3] == 0.0f);
}

static void test_fake_quant_e2m1(void **state) {
    (void)state;
    /* UE8M0 scale, amax 6 -> s = 1; §10.1 ties */
    float x[8] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float want[8] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
    fq(x, 8, 8, DSIB_FQ_E2M1_UE8M0, 0);
    assert_memory_equal(x, want, sizeof want);
    /* E4M3 scale (V4.1 compressed KV): amax 3 -> s = e4m3(0.5) = 0.5; 1.25/0.5 = 2.5 -> 2 */
    float y[4] = {3.0f, 1.25f, -0.3f, 0.0f};
    fq(y, 4, 4, DSIB_FQ_E2M1_E4M3, 0);
    /* -0.3/0.5 = -0.6 -> -0.5 -> -0.25 */
    assert_true(y[0] == 3.0f && y[1] == 1.0f && y[2] == -0.25f && y[3] == 0.0f);
    /* amax/6 off the e4m3 grid, so the scale's own rounding shows: amax 5 -> 5/6 = 0.833 ->
     * s = e4m3 = 13/16 = 0.8125; 5/s = 6.15 -> clamped 6 -> 4.875; 2/s = 2.46 -> 2 -> 1.625;
     * -1/s = -1.23 -> -1 -> -0.8125 (an unrounded scale would give 5, 1.667, -0.833) */
    float u[4] = {5.0f, 2.0f, 0.0f, -1.0f};
    fq(u, 4, 4, DSIB_FQ_E2M1_E4M3, 0);
    assert_true(u[0] == 4.875f && u[1] == 1.625f && u[2] == 0.0f && u[3] == -0.8125f);
    /* no-round keeps the values (nothing beyond ±6·s) */
    float z[4] = {3.0f, 1.25f, -0.3f, 0.1f};
    fq(z, 4, 4, DSIB_FQ_E2M1_E4M3, DSIB_FQ_NO_ROUND);
    assert_true(fabsf(z[1] - 1.25f) < 1e-7f && fabsf(z[2] + 0.3f) < 1e-7f);
}

/* The AVX2 fake quant against the scalar one, bit for bit: every recipe, rounding on and
 * off, on the rounding boundaries of both grids (scale 1: a block led by its amax), on
 * random blocks over 60 binades, and on NaN / inf / ±0 / subnormal inputs; then the
 * row-parallel call (>= 8 rows) against the rows one at a time. */
static void test_fake_quant_simd(void **state) {
    (void)state;
    if (dsib_cpu_ops_isa() < DSIB_ISA_AVX2)
        DSIT_SKIP_TEST("ISA", "this CPU has no AVX2 (the SIMD path cannot run)");
    enum { BLK = 32, NMAX = 1 << 16 };
    float *src = malloc(sizeof(float) * NMAX), *a = malloc(sizeof(float) * NMAX),
          *b = malloc(sizeof(float) * NMAX);
    assert_true(src && a && b);
    const int32_t recipes[3] = {DSIB_FQ_E4M3_UE8M0, DSIB_FQ_E2M1_UE8M0, DSIB_FQ_E2M1_E4M3};
    for (int ri = 0; ri < 3; ri++) {
        const int e4m3 = recipes[ri] == DSIB_FQ_E4M3_UE8M0;
        const float amax = e4m3 ? 448.0f : 6.0f; /* -> scale exactly 1 */
        uint32_t n = 0;
        /* 1. boundaries, in blocks led by amax */
        float cand[4096];
        uint32_t nc = 0;
        if (e4m3) {
            static const uint32_t low[8] = {0, 1, 0x7FFFE, 0x7FFFF, 0x80000, 0x80001, 0xFFFFE, 0xFFFFF};
            for (uint32_t e = 110; e <= 135; e++)
                for (uint32_t m3 = 0; m3 < 8; m3++)
                    for (int k = 0; k < 8; k++) cand[nc++] = dsii_bits_f32((e << 23) | (m3 << 20) | low[k]);
            for (int k = 0; k <= 64; k++) { /* the subnormal grid's midpoints, ± 1 ulp */
                const float m = (float)k * 0x1p-10f;
                cand[nc++] = m;
                cand[nc++] = nextafterf(m, 0.0f);
                cand[nc++] = nextafterf(m, 1.0f);
            }
        } else {
            for (int k = 0; k <= 28; k++) { /* quarter steps: every midpoint and grid point */
                const float m = (float)k * 0.25f;
                cand[nc++] = m;
                cand[nc++] = nextafterf(m, 0.0f);
                cand[nc++] = nextafterf(m, 10.0f);
            }
        }
        for (uint32_t c = 0; c < nc; c++) {
            if (n % BLK == 0) src[n++] = amax;
            src[n++] = (c & 1) ? -cand[c] : cand[c];
            if (n % BLK == 0) continue;
            src[n++] = (c & 1) ? cand[c] : -cand[c];
        }
        while (n % BLK) src[n++] = 0.0f;
        /* 2. random blocks, each with its own magnitude */
        for (int blk = 0; blk < 512; blk++) {
            const float mag = ldexpf(1.0f, (int)(frand() * 30.0f));
            for (int i = 0; i < BLK; i++) src[n++] = frand() * mag;
        }
        /* 3. specials */
        const float sp[8] = {NAN, -NAN, INFINITY, -INFINITY, -0.0f, 0x1p-140f, -0x1p-149f, 1.0f};
        for (int blk = 0; blk < 16; blk++)
            for (int i = 0; i < BLK; i++)
                src[n++] = (i + blk) % 5 == 0 ? sp[(i + blk) % 8] : frand() * ldexpf(1.0f, blk - 8);
        while (n % (2 * BLK)) src[n++] = 1.0f; /* whole rows of two blocks */
        assert_true(n <= NMAX);
        for (int round = 0; round < 2; round++) {
            const uint32_t fl = round ? 0 : DSIB_FQ_NO_ROUND;
            memcpy(a, src, sizeof(float) * n);
            memcpy(b, src, sizeof(float) * n);
            dsib_view va = wrap(a, sizeof(float) * n), vb = wrap(b, sizeof(float) * n);
            dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR);
            for (uint32_t r = 0; r < n / BLK; r++) /* one row per call: the serial path */
                assert_int_equal(ops->fake_quant(strm, (dsib_view){va.buf, (uint64_t)r * BLK * 4},
                                                 BLK, 1, 0, BLK, BLK, recipes[ri], fl),
                                 DSI_OK);
            dsib_cpu_ops_force_isa(DSIB_ISA_AVX2);
            /* all rows in one call (the pool), two blocks per row */
            assert_int_equal(ops->fake_quant(strm, vb, 2 * BLK, n / (2 * BLK), 0, 2 * BLK, BLK,
                                             recipes[ri], fl),
                             DSI_OK);
            dsib_cpu_ops_force_isa(-1);
            for (uint32_t i = 0; i < n; i++)
                if (dsii_f32_bits(a[i]) != dsii_f32_bits(b[i]))
                    fail_msg("recipe %d round %d: element %u (input %a): scalar %a (0x%08x), "
                             "avx2 %a (0x%08x)", (int)recipes[ri], round, i, (double)src[i],
                             (double)a[i], dsii_f32_bits(a[i]), (double)b[i], dsii_f32_bits(b[i]));
            unwrap(va);
            unwrap(vb);
        }
    }
    free(src);
    free(a);
    free(b);
}

/* ---- Hadamard, RoPE --------------------------------------------------------------------- */

static void test_hadamard_rope(void **state) {
    (void)state;
    enum { N = 128 };
    float x[2 * N], y[2 * N];
    for (int i = 0; i < 2 * N; i++) x[i] = frand();
    memcpy(y, x, sizeof x);
    dsib_view v = wrap(y, sizeof y);
    /* H/√n is symmetric and orthogonal: applying it twice is the identity */
    assert_int_equal(ops->hadamard(strm, v, N, 2, 1, N), DSI_OK);
    assert_int_equal(ops->hadamard(strm, v, N, 2, 1, N), DSI_OK);
    for (int i = 0; i < 2 * N; i++) assert_true(fabsf(y[i] - x[i]) < 1e-5f);
    /* e_0 -> every entry 1/√128 */
    memset(y, 0, sizeof y);
    y[0] = 1.0f;
    assert_int_equal(ops->hadamard(strm, v, N, 1, 1, N), DSI_OK);
    for (int i = 0; i < N; i++) assert_true(fabsf(y[i] - 1.0f / sqrtf(128.0f)) < 1e-7f);

    /* RoPE: only the last 64 dims of each head move; inverse undoes it; pair 0 rotates by
     * p·1 (freq 1 for pair 0 with or without YaRN, as 0 < low) */
    dsib_rope r = {160000.0f, 16.0f, 64.0f, 32.0f, 1.0f, 64};
    memcpy(y, x, sizeof x);
    assert_int_equal(ops->rope_tail(strm, v, N, 2, 1, N, rows_at(37, 2), 0, &r, 0), DSI_OK);
    for (int i = 0; i < 64; i++) assert_true(y[i] == x[i]);
    double c = cos(37.0), s = sin(37.0);
    assert_true(fabs(y[64] - (x[64] * c - x[65] * s)) < 1e-5);
    assert_true(fabs(y[65] - (x[64] * s + x[65] * c)) < 1e-5);
    /* row 1 is at position 38 */
    c = cos(38.0), s = sin(38.0);
    assert_true(fabs(y[N + 64] - (x[N + 64] * c - x[N + 65] * s)) < 1e-5);
    assert_int_equal(ops->rope_tail(strm, v, N, 2, 1, N, rows_at(37, 2), 0, &r, 1), DSI_OK);
    for (int i = 0; i < 2 * N; i++) assert_true(fabsf(y[i] - x[i]) < 1e-5f);
    /* YaRN: the last pair (i = 31 > high) uses freq/16; base 160000 (row at 1001, delta −1:
     * position 1000) */
    double f31 = pow(160000.0, -62.0 / 64.0) / 16.0;
    memcpy(y, x, sizeof x);
    assert_int_equal(ops->rope_tail(strm, v, N, 1, 1, N, rows_at(1001, 1), -1, &r, 0), DSI_OK);
    c = cos(1000.0 * f31), s = sin(1000.0 * f31);
    assert_true(fabs(y[126] - (x[126] * c - x[127] * s)) < 1e-5);
    unwrap(v);
}

/* rope_tail remembers its frequencies and cos / sin rows on the stream (two parameter sets;
 * rows direct-mapped by position and set, bypassed for calls of more than 16 rows and for
 * rotations of more than 128 dimensions): an interleaved sequence of calls — parameter
 * sets that differ in one field, three of them in turn (each new one evicting the oldest
 * set's rows), positions that repeat and positions that share an entry (5, 21), inverse and
 * forward, one to seventeen rows, 32 to 160 rotated dimensions — gives on the long-lived
 * stream the bits of a fresh stream per call (which holds nothing), and each result is the
 * independent rotation to 1e-5. */
static void test_rope_memo(void **state) {
    (void)state;
    enum { N = 192, T = 17 };
    dsib_rope ra = {10000.0f, 1.0f, 4096.0f, 32.0f, 1.0f, 64};
    dsib_rope rb = {160000.0f, 16.0f, 4096.0f, 32.0f, 1.0f, 64};
    dsib_rope rc = rb, rd = rb, re = ra;
    rc.yarn_beta_slow = 2.0f; /* rb but for one field: another table */
    rd.n_rot = 32;
    re.n_rot = 160;
    const dsib_rope *rs[] = {&ra, &rb, &ra, &rc, &rb, &rd, &ra, &rb, &rc, &ra, &rd, &rb,
                             &ra, &ra, &ra, &re, &re, &ra, &rb, &ra};
    const int32_t pos[] = {5, 5, 5, 5, 6, 5, 9, 7, 5, 5, 6, 5, 21, 5, 21, 5, 5, 3, 5, 5};
    const int32_t nrow[] = {1, 1, 3, 1, 2, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 2, 17, 16, 1};
    dsib_stream_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_rows = 64;
    d.max_width = 1024;
    dsib_error err;
    for (int k = 0; k < (int)(sizeof pos / sizeof pos[0]); k++)
        for (int inv = 0; inv < 2; inv++) {
            float x[T * N], y[T * N], z[T * N];
            for (int i = 0; i < T * N; i++) x[i] = frand();
            memcpy(y, x, sizeof x);
            memcpy(z, x, sizeof x);
            dsib_view vy = wrap(y, sizeof y), vz = wrap(z, sizeof z);
            dsib_stream *fresh = NULL;
            assert_int_equal(be->stream_create(inst, &d, &fresh, &err), DSI_OK);
            assert_int_equal(ops->rope_tail(strm, vy, N, (uint32_t)nrow[k], 1, N, rows_at(pos[k], (uint32_t)nrow[k]),
                                            0, rs[k], inv),
                             DSI_OK);
            assert_int_equal(ops->rope_tail(fresh, vz, N, (uint32_t)nrow[k], 1, N, rows_at(pos[k], (uint32_t)nrow[k]),
                                            0, rs[k], inv),
                             DSI_OK);
            be->stream_destroy(fresh);
            unwrap(vy);
            unwrap(vz);
            assert_memory_equal(y, z, sizeof y);
            /* the last pair against the spec's angle (§3.9, dsib_rope_freqs' formula) */
            const int n_rot = rs[k]->n_rot, i = n_rot / 2 - 1;
            double f = pow((double)rs[k]->freq_base, -2.0 * i / n_rot);
            if (rs[k]->yarn_factor > 1.0f) {
                const double two_pi = 6.283185307179586476925286766559;
                const double lnb = 2.0 * log((double)rs[k]->freq_base);
                double lo = floor(n_rot * log(rs[k]->yarn_orig_ctx / (rs[k]->yarn_beta_fast * two_pi)) / lnb);
                double hi = ceil(n_rot * log(rs[k]->yarn_orig_ctx / (rs[k]->yarn_beta_slow * two_pi)) / lnb);
                if (lo < 0) lo = 0;
                if (hi > n_rot - 1) hi = n_rot - 1;
                if (hi == lo) hi += 0.001;
                double ramp = (i - lo) / (hi - lo);
                ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
                f = f / rs[k]->yarn_factor * ramp + f * (1.0 - ramp);
            }
            for (int t = 0; t < nrow[k]; t++) {
                const double th = (double)(pos[k] + t) * f, c = cos(th), sn = inv ? -sin(th) : sin(th);
                const float *a = x + t * N + N - 2, *b = y + t * N + N - 2;
                assert_true(fabs(b[0] - (a[0] * c - a[1] * sn)) < 1e-5);
                assert_true(fabs(b[1] - (a[0] * sn + a[1] * c)) < 1e-5);
            }
        }
}

/* ---- mHC Sinkhorn (§3.3) ----------------------------------------------------------------- */

static void test_hc_mix(void **state) {
    (void)state;
    enum { HC = 4, D = 8, M = 24 };
    float X[HC * D], fn[M * HC * D], scale[3] = {0.5f, 0.7f, 1.3f}, base[M], coef[M];
    for (int i = 0; i < HC * D; i++) X[i] = frand();
    for (int i = 0; i < M * HC * D; i++) fn[i] = frand();
    for (int i = 0; i < M; i++) base[i] = frand();
    dsib_view vX = wrap(X, sizeof X), vfn = wrap(fn, sizeof fn), vs = wrap(scale, sizeof scale),
              vb = wrap(base, sizeof base), vc = wrap(coef, sizeof coef);
    dsib_weight wfn = wf32(vfn, HC * D, M), ws = wf32(vs, 3, 1), wb = wf32(vb, M, 1);
    assert_int_equal(ops->hc_mix(strm, vX, 1, HC, D, &wfn, &ws, &wb, 1e-6f, 1e-6f, 20,
                                 DSIB_HC_BLOCK, vc, M),
                     DSI_OK);
    /* independent double-precision computation of the spec */
    double ss = 0, mix[M];
    for (int i = 0; i < HC * D; i++) ss += (double)X[i] * X[i];
    double rs = 1.0 / sqrt(ss / (HC * D) + 1e-6);
    for (int m = 0; m < M; m++) {
        double a = 0;
        for (int i = 0; i < HC * D; i++) a += (double)fn[m * HC * D + i] * X[i];
        mix[m] = a * rs;
    }
    for (int h = 0; h < HC; h++) {
        double pre = 1.0 / (1.0 + exp(-(mix[h] * scale[0] + base[h]))) + 1e-6;
        double post = 2.0 / (1.0 + exp(-(mix[HC + h] * scale[1] + base[HC + h])));
        assert_true(fabs(coef[h] - pre) < 1e-5);
        assert_true(fabs(coef[HC + h] - post) < 1e-5);
    }
    double C[HC][HC];
    for (int i = 0; i < HC; i++) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < HC; j++) {
            C[i][j] = mix[8 + 4 * i + j] * scale[2] + base[8 + 4 * i + j];
            if (C[i][j] > mx) mx = C[i][j];
        }
        for (int j = 0; j < HC; j++) sum += exp(C[i][j] - mx);
        for (int j = 0; j < HC; j++) C[i][j] = exp(C[i][j] - mx) / sum + 1e-6;
    }
    for (int it = 0; it < 20; it++) {
        if (it)
            for (int i = 0; i < HC; i++) {
                double s = 1e-6;
                for (int j = 0; j < HC; j++) s += C[i][j];
                for (int j = 0; j < HC; j++) C[i][j] /= s;
            }
        for (int j = 0; j < HC; j++) {
            double s = 1e-6;
            for (int i = 0; i < HC; i++) s += C[i][j];
            for (int i = 0; i < HC; i++) C[i][j] /= s;
        }
    }
    for (int i = 0; i < HC; i++)
        for (int j = 0; j < HC; j++) assert_true(fabs(coef[8 + 4 * i + j] - C[i][j]) < 1e-5);
    unwrap(vX);
    unwrap(vfn);
    unwrap(vs);
    unwrap(vb);
    unwrap(vc);
}

/* ---- MoE routing (§3.5) ------------------------------------------------------------------ */

static void test_moe_route(void **state) {
    (void)state;
    enum { E = 6, K = 2 };
    /* token 0: logits tie between experts 1, 3 and 4 -> 1, 3; token 1: the bias decides
     * (selection only: weights use unbiased scores) */
    float lg[2 * E] = {0.0f, 2.0f, -1.0f, 2.0f, 2.0f, 0.5f, 1.0f, 1.0f, 1.0f, 1.0f, 3.0f, 1.0f};
    float bias[E] = {0, 0, 0, 0, 0, 0};
    int32_t ids[2] = {0, 1}, sel[2 * K];
    float wts[2 * K];
    dsib_view vl = wrap(lg, sizeof lg), vb = wrap(bias, sizeof bias), vi = wrap(ids, sizeof ids),
              vs = wrap(sel, sizeof sel), vw = wrap(wts, sizeof wts);
    dsib_weight wb = wf32(vb, E, 1);
    bias[5] = 10.0f; /* token 1: expert 5 first (biased), then expert 4 */
    assert_int_equal(ops->moe_route(strm, vl, E, E, K, &wb, NULL, vi, 0.0f, 1.5f, 2, vs, vw),
                     DSI_OK);
    assert_int_equal(sel[0], 5); /* the bias applies to token 0 too: 5 beats the ties */
    assert_int_equal(sel[1], 1);
    assert_int_equal(sel[2], 5);
    assert_int_equal(sel[3], 4);
    double s[2 * E];
    for (int i = 0; i < 2 * E; i++) s[i] = sqrt(log1p(exp((double)lg[i])));
    assert_true(fabs(wts[0] - s[5] / (s[5] + s[1]) * 1.5) < 1e-6);
    assert_true(fabs(wts[3] - s[E + 4] / (s[E + 5] + s[E + 4]) * 1.5) < 1e-6);
    /* without bias: ties at 2.0 between 1, 3, 4 -> 1, 3 */
    assert_int_equal(ops->moe_route(strm, vl, E, E, K, NULL, NULL, vi, 0.0f, 1.5f, 1, vs, vw),
                     DSI_OK);
    assert_int_equal(sel[0], 1);
    assert_int_equal(sel[1], 3);
    assert_true(fabs(wts[0] - 0.75) < 1e-6 && fabs(wts[1] - 0.75) < 1e-6);
    /* hash routing: tid2eid rows by token id */
    int32_t tid[3 * K] = {4, 0, 2, 5, 1, 3};
    int32_t ids2[2] = {2, 0};
    dsib_view vt = wrap(tid, sizeof tid), vi2 = wrap(ids2, sizeof ids2);
    dsib_weight wt;
    memset(&wt, 0, sizeof wt);
    wt.buf = vt.buf;
    wt.type = DSI_TYPE_I32;
    wt.ne[0] = K;
    wt.ne[1] = 3;
    wt.ne[2] = 1;
    wt.nb1 = K * 4;
    wt.nb2 = 3 * K * 4;
    assert_int_equal(ops->moe_route(strm, vl, E, E, K, NULL, &wt, vi2, 0.0f, 1.5f, 2, vs, vw),
                     DSI_OK);
    assert_true(sel[0] == 1 && sel[1] == 3 && sel[2] == 4 && sel[3] == 0);
    assert_true(fabs(wts[2] - s[E + 4] / (s[E + 4] + s[E + 0]) * 1.5) < 1e-6);
    unwrap(vl);
    unwrap(vb);
    unwrap(vi);
    unwrap(vs);
    unwrap(vw);
    unwrap(vt);
    unwrap(vi2);
}

/* ---- compressor pooling (§3.4) ---------------------------------------------------------- */

static void test_compress_pool_overlap(void **state) {
    (void)state;
    enum { R = 4, HD = 3, W = 2 * HD, NTOK = 12, RING = 8 };
    float kv[NTOK * W], sc[NTOK * W];
    for (int i = 0; i < NTOK * W; i++) {
        kv[i] = frand();
        sc[i] = 2.0f * frand();
    }
    /* expected group w = 2 (tokens 8..11 lane B, tokens 4..7 lane A), per channel */
    float want[HD];
    for (int j = 0; j < HD; j++) {
        double m = -1e300, z = 0, a = 0;
        double s8[8], v8[8];
        for (int t = 0; t < 4; t++) {
            s8[t] = sc[(4 + t) * W + j];
            v8[t] = kv[(4 + t) * W + j];
            s8[4 + t] = sc[(8 + t) * W + HD + j];
            v8[4 + t] = kv[(8 + t) * W + HD + j];
        }
        for (int c = 0; c < 8; c++) m = s8[c] > m ? s8[c] : m;
        for (int c = 0; c < 8; c++) z += exp(s8[c] - m);
        for (int c = 0; c < 8; c++) a += exp(s8[c] - m) / z * v8[c];
        want[j] = (float)a;
    }
    /* (a) all 12 rows in one step: rows 3, 7, 11 complete groups 0, 1, 2, the others get
     * zeros; (b) tokens < 10 from the ring, rows 10..11 in the step: row 11 equal */
    float out_a[NTOK * HD], out_b[2 * HD], rkv[RING * W], rsc[RING * W];
    dsib_view vk = wrap(kv, sizeof kv), vs = wrap(sc, sizeof sc), vo = wrap(out_a, sizeof out_a),
              vob = wrap(out_b, sizeof out_b), vrk = wrap(rkv, sizeof rkv),
              vrs = wrap(rsc, sizeof rsc);
    dsib_state srk = state_of(vrk, RING, W), srs = state_of(vrs, RING, W);
    assert_int_equal(ops->compress_pool(strm, &srk, &srs, vk, vs, W, rows_at(0, NTOK), NTOK, R, 1,
                                        HD, vo, HD),
                     DSI_OK);
    for (int j = 0; j < HD; j++) assert_true(fabsf(out_a[11 * HD + j] - want[j]) < 1e-5f);
    for (int t = 0; t < NTOK; t++)
        if (t % 4 != 3)
            for (int j = 0; j < HD; j++) assert_true(out_a[t * HD + j] == 0.0f);
    assert_int_equal(ops->store_rows(strm, vk, W, 10, rows_at(0, 10), &srk, W, 1, DSIB_STORE_RING),
                     DSI_OK);
    assert_int_equal(ops->store_rows(strm, vs, W, 10, rows_at(0, 10), &srs, W, 1, DSIB_STORE_RING),
                     DSI_OK);
    dsib_view vk10 = {vk.buf, 10 * W * 4}, vs10 = {vs.buf, 10 * W * 4};
    assert_int_equal(ops->compress_pool(strm, &srk, &srs, vk10, vs10, W, rows_at(10, 2), 2, R, 1,
                                        HD, vob, HD),
                     DSI_OK);
    assert_memory_equal(out_a + 11 * HD, out_b + HD, sizeof(float) * HD);
    /* group 0 has no lane A: only tokens 0..3 lane B (row 3 of step (a)) */
    for (int j = 0; j < HD; j++) {
        double m = -1e300, z = 0, a = 0;
        for (int t = 0; t < 4; t++) m = sc[t * W + HD + j] > m ? sc[t * W + HD + j] : m;
        for (int t = 0; t < 4; t++) z += exp(sc[t * W + HD + j] - m);
        for (int t = 0; t < 4; t++) a += exp(sc[t * W + HD + j] - m) / z * kv[t * W + HD + j];
        assert_true(fabs(out_a[3 * HD + j] - a) < 1e-5);
    }
    unwrap(vk);
    unwrap(vs);
    unwrap(vo);
    unwrap(vob);
    unwrap(vrk);
    unwrap(vrs);
}

/* ---- sink attention (§3.4) ---------------------------------------------------------------- */

static void test_attn_sink(void **state) {
    (void)state;
    enum { H = 2, HD = 16, WIN = 4, N = 6, RING = 8, NC = 3 };
    float q[N * H * HD], kv[N * HD], comp[NC * HD], sinks[H] = {0.3f, -1.0f};
    for (int i = 0; i < N * H * HD; i++) q[i] = frand();
    for (int i = 0; i < N * HD; i++) kv[i] = frand();
    for (int i = 0; i < NC * HD; i++) comp[i] = frand();
    int32_t idx[N * 2];
    for (int t = 0; t < N; t++) {
        idx[2 * t] = t % 2 ? 0 : -1;
        idx[2 * t + 1] = 2;
    }
    float out_a[N * H * HD], out_b[N * H * HD], ring[RING * HD];
    memset(ring, 0, sizeof ring);
    dsib_view vq = wrap(q, sizeof q), vkv = wrap(kv, sizeof kv), vc = wrap(comp, sizeof comp),
              vi = wrap(idx, sizeof idx), va = wrap(out_a, sizeof out_a),
              vb = wrap(out_b, sizeof out_b), vr = wrap(ring, sizeof ring), vsk = wrap(sinks, 8);
    dsib_weight wsk = wf32(vsk, H, 1);
    float sc = 1.0f / 4.0f;
    dsib_state sr = state_of(vr, RING, HD), scomp = state_of(vc, NC, HD);
    /* (a) positions 0..5 in one step */
    const unsigned long long flops0 = atomic_load(&strm->inst->stat_attn_flops);
    assert_int_equal(ops->attn_sink(strm, vq, H * HD, H, HD, rows_at(0, N), N, WIN, &sr, vkv, HD,
                                    4, &scomp, vi, 2, &wsk, sc, va, H * HD),
                     DSI_OK);
    const unsigned long long flops = atomic_load(&strm->inst->stat_attn_flops) - flops0;
    unsigned long long want_flops = 0; /* 4 · HD per (query, head, attended row), below */
    /* expected, double precision, straight from the formula */
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            const float *qq = q + (t * H + h) * HD;
            const float *rows[8];
            int nr = 0;
            for (int k = 0; k < 2; k++)
                if (idx[2 * t + k] >= 0) rows[nr++] = comp + idx[2 * t + k] * HD;
            for (int p = t - WIN + 1; p <= t; p++)
                if (p >= 0) rows[nr++] = kv + p * HD;
            want_flops += 4ull * HD * (unsigned long long)nr;
            double z[8], m = sinks[h], den, o[HD] = {0};
            for (int r = 0; r < nr; r++) {
                double d = 0;
                for (int i = 0; i < HD; i++) d += (double)qq[i] * rows[r][i];
                z[r] = d * sc;
                if (z[r] > m) m = z[r];
            }
            den = exp(sinks[h] - m);
            for (int r = 0; r < nr; r++) {
                den += exp(z[r] - m);
                for (int i = 0; i < HD; i++) o[i] += exp(z[r] - m) * rows[r][i];
            }
            for (int i = 0; i < HD; i++)
                assert_true(fabs(out_a[(t * H + h) * HD + i] - o[i] / den) < 1e-5);
        }
    assert_int_equal(flops, want_flops); /* dsinfer-bench's attention FLOPs */
    /* (b) positions 0..2, ring write, then 3..5 reading 0..2 from the ring: bit-equal */
    assert_int_equal(ops->attn_sink(strm, vq, H * HD, H, HD, rows_at(0, 3), 3, WIN, &sr, vkv, HD,
                                    4, &scomp, vi, 2, &wsk, sc, vb, H * HD),
                     DSI_OK);
    assert_int_equal(ops->store_rows(strm, vkv, HD, 3, rows_at(0, 3), &sr, HD, 1, DSIB_STORE_RING),
                     DSI_OK);
    dsib_view vq3 = {vq.buf, 3 * H * HD * 4}, vkv3 = {vkv.buf, 3 * HD * 4},
              vi3 = {vi.buf, 3 * 2 * 4}, vb3 = {vb.buf, 3 * H * HD * 4};
    assert_int_equal(ops->attn_sink(strm, vq3, H * HD, H, HD, rows_at(3, 3), 3, WIN, &sr, vkv3, HD,
                                    4, &scomp, vi3, 2, &wsk, sc, vb3, H * HD),
                     DSI_OK);
    assert_memory_equal(out_a, out_b, sizeof out_a);
    unwrap(vq);
    unwrap(vkv);
    unwrap(vc);
    unwrap(vi);
    unwrap(va);
    unwrap(vb);
    unwrap(vr);
    unwrap(vsk);
}

/* Attention's SIMD decode of packed state rows (ops.c attn_unpack_row_avx2 / _avx512) against
 * dsii_sp_unpack_row: every code in every block position, every scale byte (2^-127 for 0, the
 * exponents where 256 · scale overflows, 255; E4M3 scales ±0 and the NaN codes read as
 * ±448), f32 tails; the same bits, but for the sign of a zero (the AVX2 E2M1 decode gives +0
 * for code 8, which no attention sum can see). */
static void test_attn_unpack_simd(void **state) {
    (void)state;
    const int32_t native = dsib_cpu_ops_isa();
    if (native < DSIB_ISA_AVX2) DSIT_SKIP_TEST("ISA", "this CPU has no AVX2 (no SIMD decode to compare)");
    const struct { int32_t fmt; uint32_t width, qcols, block; } shapes[] = {
        {DSIB_STATE_E4M3_UE8M0, 512, 512, 32}, {DSIB_STATE_E4M3_UE8M0, 576, 512, 64},
        {DSIB_STATE_E4M3_UE8M0, 256, 256, 16}, {DSIB_STATE_E2M1_E4M3, 512, 512, 16},
        {DSIB_STATE_E2M1_UE8M0, 192, 128, 32}, {DSIB_STATE_E2M1_E4M3, 64, 48, 16},
    };
    const int32_t isas[2] = {DSIB_ISA_AVX2, DSIB_ISA_AVX512};
    static uint8_t row[4096];
    static float want[1024], got[1024];
    int ran = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const uint32_t W = shapes[k].width, Q = shapes[k].qcols, B = shapes[k].block;
        const int32_t f = shapes[k].fmt;
        const uint32_t rb = dsii_sp_row_bytes(f, W, Q, B), cbytes = f == DSIB_STATE_E4M3_UE8M0 ? Q : Q / 2;
        assert_true(rb <= sizeof row);
        /* enough rows for every scale byte in every block position, every code in each */
        for (uint32_t r = 0; r < 256 + Q / B; r++) {
            memset(row, 0, sizeof row);
            for (uint32_t i = 0; i < cbytes; i++) row[i] = (uint8_t)(i * 7 + r * 37 + (i / 256) * 3);
            for (uint32_t b = 0; b < Q / B; b++) row[cbytes + b] = (uint8_t)(r + b * 29);
            for (uint32_t i = Q; i < W; i++) {
                const float t = (float)i * 0.37f - (float)r;
                memcpy(row + dsii_sp_tail_offset(f, Q, B) + 4 * (i - Q), &t, 4);
            }
            dsii_sp_unpack_row(f, W, Q, B, row, want);
            for (int ii = 0; ii < 2; ii++) {
                memset(got, 0xA5, sizeof got);
                if (!dsib_cpu_attn_unpack_row(isas[ii], f, W, Q, B, row, got)) continue;
                ran |= 1 << ii;
                for (uint32_t i = 0; i < W; i++) {
                    if (memcmp(&got[i], &want[i], 4) == 0 || (got[i] == 0.0f && want[i] == 0.0f))
                        continue;
                    print_error("shape %zu isa %d row %u value %u: %a, want %a\n", k, isas[ii], r,
                                i, (double)got[i], (double)want[i]);
                    fail();
                }
            }
        }
    }
    /* every path this CPU has must have run: a hook that declines one is a failure */
    assert_true(ran & 1);
    assert_true(native < DSIB_ISA_AVX512 || (ran & 2));
    if (!(ran & 2)) print_message("note: no AVX-512 here; attention's AVX-512 decode not compared\n");
}

/* Attention's exp (ops.c attn_exp, the same bits in every ISA path): within 2 ulp of e^x on
 * [-87, 88] (every 1/1024 and the ends), exactly 1 at 0, 0 below -87 and for NaN, e^88 above. */
static void test_attn_exp(void **state) {
    (void)state;
    double worst = 0;
    for (int i = -87 * 1024; i <= 88 * 1024; i++) {
        const float x = (float)i / 1024.0f, y = dsib_cpu_attn_exp(x);
        const double e = exp((double)x);
        const double ulp = (double)nextafterf((float)e, INFINITY) - (double)(float)e;
        const double err = fabs((double)y - e) / ulp;
        if (err > worst) worst = err;
        if (err > 2.0) fail_msg("attn_exp(%.6f) = %.9g, e^x = %.9g: %.2f ulp", x, y, e, err);
    }
    print_message("attn_exp: worst %.2f ulp on [-87, 88]\n", worst);
    assert_true(dsib_cpu_attn_exp(0.0f) == 1.0f);
    assert_true(dsib_cpu_attn_exp(-0.0f) == 1.0f);
    assert_true(dsib_cpu_attn_exp(-87.5f) == 0.0f);
    assert_true(dsib_cpu_attn_exp(-INFINITY) == 0.0f);
    assert_true(dsib_cpu_attn_exp(NAN) == 0.0f);
    assert_true(dsib_cpu_attn_exp(1000.0f) == dsib_cpu_attn_exp(88.0f));
}

/* The head-group SIMD paths (AVX2: 4 heads share each K/V row load; AVX-512: 8 heads) perform
 * the scalar path's operations in its order: outputs bit-identical for every head count
 * (groups of 8 and 4 plus a remainder), row count and visible-row count (odd and even: the
 * two-row score tiles), and both within the double-precision formula's bound. The AVX-512
 * path runs where the CPU has it (else only the AVX2 one: said, not skipped). */
static void test_attn_sink_simd(void **state) {
    (void)state;
    const int32_t native = dsib_cpu_ops_isa();
    if (native < DSIB_ISA_AVX2) DSIT_SKIP_TEST("ISA", "this CPU has no AVX2 (the SIMD path cannot run)");
    if (native < DSIB_ISA_AVX512)
        print_message("note: no AVX-512 here: only the AVX2 head-group path is compared\n");
    const int32_t isas[2] = {DSIB_ISA_AVX2, DSIB_ISA_AVX512};
    const int n_isa = native >= DSIB_ISA_AVX512 ? 2 : 1;
    /* up to 40 visible rows: the softmax's 8- and 16-row groups, more than two of them, and
     * partial tails */
    enum { HMAX = 16, HD = 64, WIN = 37, NMAX = 7, RING = 64, NC = 6, K = 3 };
    static float q[NMAX * HMAX * HD], kv[NMAX * HD], comp[NC * HD], ring[RING * HD];
    static float out_s[NMAX * HMAX * HD], out_v[NMAX * HMAX * HD];
    float sinks[HMAX];
    for (int i = 0; i < NMAX * HMAX * HD; i++) q[i] = 2.0f * frand();
    for (int i = 0; i < NMAX * HD; i++) kv[i] = frand();
    for (int i = 0; i < NC * HD; i++) comp[i] = frand();
    for (int i = 0; i < RING * HD; i++) ring[i] = frand();
    for (int h = 0; h < HMAX; h++) sinks[h] = frand();
    int32_t idx[NMAX * K];
    for (int t = 0; t < NMAX; t++)
        for (int k = 0; k < K; k++) idx[t * K + k] = (t + k) % 3 == 0 ? -1 : (t * 2 + k) % NC;
    dsib_view vq = wrap(q, sizeof q), vkv = wrap(kv, sizeof kv), vc = wrap(comp, sizeof comp),
              vi = wrap(idx, sizeof idx), vs = wrap(out_s, sizeof out_s),
              vv = wrap(out_v, sizeof out_v), vr = wrap(ring, sizeof ring),
              vsk = wrap(sinks, sizeof sinks);
    dsib_state sr = state_of(vr, RING, HD), scomp = state_of(vc, NC, HD);
    const uint32_t heads[5] = {4, 6, 8, 12, 16};
    const uint32_t ns[3] = {1, 2, NMAX};
    int checked = 0;
    for (int ii = 0; ii < n_isa; ii++)
    for (int hi = 0; hi < 5; hi++)
        for (int ni = 0; ni < 3; ni++)
            for (int pi = 0; pi < 4; pi++) {
                const int pos0 = pi < 3 ? 3 * pi : 36; /* 36: 40 visible rows */
                const uint32_t H = heads[hi], N = ns[ni];
                dsib_weight wsk = wf32(vsk, H, 1);
                memset(out_s, 0, sizeof out_s);
                memset(out_v, 0xff, sizeof out_v);
                dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR);
                assert_int_equal(ops->attn_sink(strm, vq, H * HD, H, HD, rows_at(pos0, N), N, WIN,
                                                &sr, vkv, HD, 2, &scomp, vi, K, &wsk, 0.125f, vs,
                                                H * HD),
                                 DSI_OK);
                dsib_cpu_ops_force_isa(isas[ii]);
                assert_int_equal(ops->attn_sink(strm, vq, H * HD, H, HD, rows_at(pos0, N), N, WIN,
                                                &sr, vkv, HD, 2, &scomp, vi, K, &wsk, 0.125f, vv,
                                                H * HD),
                                 DSI_OK);
                dsib_cpu_ops_force_isa(-1);
                assert_memory_equal(out_s, out_v, sizeof(float) * N * H * HD);
                /* the formula in double precision (ring rows before pos0, step rows after) */
                for (uint32_t t = 0; t < N; t++) {
                    int p = pos0 + (int)t;
                    const float *rws[K + WIN];
                    int nr = 0;
                    for (int k = 0; k < K; k++)
                        if (idx[t * K + k] >= 0) rws[nr++] = comp + idx[t * K + k] * HD;
                    for (int qp = p - WIN + 1; qp <= p; qp++) {
                        if (qp < 0) continue;
                        rws[nr++] = qp < pos0 ? ring + (qp % RING) * HD : kv + (qp - pos0) * HD;
                    }
                    for (uint32_t h = 0; h < H; h++) {
                        const float *qq = q + (t * H + h) * HD;
                        double z[K + WIN], m = sinks[h], den, o[HD] = {0};
                        for (int r = 0; r < nr; r++) {
                            double d = 0;
                            for (int i = 0; i < HD; i++) d += (double)qq[i] * rws[r][i];
                            z[r] = d * 0.125;
                            if (z[r] > m) m = z[r];
                        }
                        den = exp(sinks[h] - m);
                        for (int r = 0; r < nr; r++) den += exp(z[r] - m);
                        for (int r = 0; r < nr; r++)
                            for (int i = 0; i < HD; i++) o[i] += exp(z[r] - m) * rws[r][i];
                        for (int i = 0; i < HD; i++) {
                            double ref = o[i] / den;
                            assert_true(fabs(out_v[(t * H + h) * HD + i] - ref) < 1e-5);
                        }
                        checked++;
                    }
                }
            }
    assert_true(checked > 100 * n_isa);
    unwrap(vq);
    unwrap(vkv);
    unwrap(vc);
    unwrap(vi);
    unwrap(vs);
    unwrap(vv);
    unwrap(vr);
    unwrap(vsk);
}

/* hc_collapse / hc_post: the AVX2 path (8 columns at a time) and the row-parallel prefill
 * path give the scalar path's bits (n = 1 and n = 9 rows; hc_post in place, as the forward
 * pass calls it), and hc_post matches its formula in double precision. */
static void test_hc_simd(void **state) {
    (void)state;
    if (dsib_cpu_ops_isa() < DSIB_ISA_AVX2)
        DSIT_SKIP_TEST("ISA", "this CPU has no AVX2 (the SIMD path cannot run)");
    enum { NHC = 4, D = 64, N = 9, M = NHC * (2 + NHC) };
    static float X[N * NHC * D], Xs[N * NHC * D], Xv[N * NHC * D], f[N * D], cf[N * M];
    static float ys[N * D], yv[N * D];
    for (int i = 0; i < N * NHC * D; i++) X[i] = frand();
    for (int i = 0; i < N * D; i++) f[i] = frand();
    for (int i = 0; i < N * M; i++) cf[i] = frand();
    dsib_view vX = wrap(X, sizeof X), vXs = wrap(Xs, sizeof Xs), vXv = wrap(Xv, sizeof Xv),
              vf = wrap(f, sizeof f), vc = wrap(cf, sizeof cf), vys = wrap(ys, sizeof ys),
              vyv = wrap(yv, sizeof yv);
    const uint32_t ns[2] = {1, N};
    for (int k = 0; k < 2; k++) {
        uint32_t n = ns[k];
        dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR);
        assert_int_equal(ops->hc_collapse(strm, vX, vc, M, vys, D, n, NHC, D), DSI_OK);
        memcpy(Xs, X, sizeof X);
        assert_int_equal(ops->hc_post(strm, vf, D, vXs, vc, M, vXs, n, NHC, D), DSI_OK);
        dsib_cpu_ops_force_isa(DSIB_ISA_AVX2);
        assert_int_equal(ops->hc_collapse(strm, vX, vc, M, vyv, D, n, NHC, D), DSI_OK);
        memcpy(Xv, X, sizeof X);
        assert_int_equal(ops->hc_post(strm, vf, D, vXv, vc, M, vXv, n, NHC, D), DSI_OK);
        dsib_cpu_ops_force_isa(-1);
        assert_memory_equal(ys, yv, sizeof(float) * n * D);
        assert_memory_equal(Xs, Xv, sizeof(float) * n * NHC * D);
        for (uint32_t t = 0; t < n; t++)
            for (int j = 0; j < NHC; j++)
                for (int d = 0; d < D; d++) {
                    const float *c = cf + t * M;
                    double ref = (double)c[NHC + j] * f[t * D + d];
                    for (int i = 0; i < NHC; i++)
                        ref += (double)c[2 * NHC + i * NHC + j] * X[(t * NHC + i) * D + d];
                    assert_true(fabs(Xv[(t * NHC + j) * D + d] - ref) < 1e-5);
                }
    }
    unwrap(vX);
    unwrap(vXs);
    unwrap(vXv);
    unwrap(vf);
    unwrap(vc);
    unwrap(vys);
    unwrap(vyv);
}

int main(void) {
    dsit_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indexer_ties),
        cmocka_unit_test(test_indexer_split),
        cmocka_unit_test(test_indexer_packed_scan), cmocka_unit_test(test_attn_exp),
        cmocka_unit_test(test_attn_unpack_simd),
        cmocka_unit_test(test_fake_quant_e4m3),
        cmocka_unit_test(test_fake_quant_e2m1),
        cmocka_unit_test(test_fake_quant_simd),
        cmocka_unit_test(test_hadamard_rope),
        cmocka_unit_test(test_rope_memo),
        cmocka_unit_test(test_hc_mix),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_compress_pool_overlap),
        cmocka_unit_test(test_attn_sink),
        cmocka_unit_test(test_attn_sink_simd),
        cmocka_unit_test(test_hc_simd),
    };
    return cmocka_run_group_tests_name("v4_ops", tests, setup, teardown);
}
