/*
 * The host-side logic of the CUDA backend, run on the CPU in CI (no device, no nvcc needed):
 * backends/cuda/cuda_math.h (the numeric building blocks every kernel calls — compiled here
 * as plain C++) and backends/cuda/cuda_plan.h (launch geometry, workspace layout, the op /
 * type table). Each check compares against the reference the CUDA kernels must reproduce:
 *  - weight decoding (dq_elem, and chunk_elem: the matmul kernels' lane / chunk addressing)
 *    against lib/quant's dequantizer, bit for bit, for every type the module supports;
 *  - the fake-quant rounding (e4m3 / e2m1 RNE, the E8M0 ceiling, the three recipes) against
 *    lib/quant and the CPU backend's fake_quant op, bit for bit;
 *  - hc_mix's coefficient math (RMS factor, sigmoids, Sinkhorn) and the Engram gate against
 *    the CPU backend's ops, bit for bit;
 *  - the order-preserving top-k keys; step-row validation against the CPU's rows check;
 *  - the plans: grids cover every row / token, workspace regions fit and do not overlap.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "backend/registry.h"
#include "backends/backend.h"
#include "backends/types.h"
#include "quant/fp.h"
#include "quant/quant.h"
dsi_status dsib_cpu_rows_check(dsib_view rows, uint32_t n, uint32_t slots);
}
#include "backends/cuda/cuda_math.h"
#include "backends/cuda/cuda_plan.h"

static int failures = 0;
static int checks = 0;
#define CHECK(c, ...)                                                   \
    do {                                                                \
        checks++;                                                       \
        if (!(c)) {                                                     \
            if (failures < 30) {                                        \
                printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);     \
                printf(__VA_ARGS__);                                    \
                printf("\n");                                           \
            }                                                           \
            failures++;                                                 \
        }                                                               \
    } while (0)

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float frand(float lo, float hi) {
    return (float)(lo + (hi - lo) * ((double)(rnd() >> 11) / 9007199254740992.0));
}
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* bit-equal, or both NaN */
static bool same(float a, float b) { return bits(a) == bits(b) || (a != a && b != b); }

/* ---- weight decoding ------------------------------------------------------------------- */

template <int32_t T>
static void check_chunks(const uint8_t *row, int64_t K, const float *ref, const char *name) {
    const uint32_t cb = dsic::chunk_bytes(T);
    int bad = 0;
    for (int64_t c = 0; c * dsic::MM_CHUNK < K; c++)
        for (uint32_t j = 0; j < dsic::MM_LANE_ELEMS; j++)
            for (uint32_t l = 0; l < 32; l++) {
                int64_t e = c * dsic::MM_CHUNK + l + 32 * j;
                if (e >= K) continue;
                float v = dsic::chunk_elem<T>(row + (uint64_t)c * cb, l, j);
                if (!same(v, ref[e]) && bad++ < 3)
                    printf("  %s chunk %lld lane %u j %u: %g vs %g\n", name, (long long)c, l, j,
                           (double)v, (double)ref[e]);
            }
    CHECK(bad == 0, "%s: %d chunk elements differ from lib/quant", name, bad);
}

static void test_decode(void) {
    const int32_t types[] = {DSI_TYPE_F32, DSI_TYPE_F16, DSI_TYPE_BF16, DSI_TYPE_Q8_0,
                             DSI_TYPE_Q4_K, DSI_TYPE_Q2_K, DSI_TYPE_MXFP4,
                             DSI_TYPE_FP8_E4M3_B128, DSI_TYPE_FP8_E4M3_B32, DSI_TYPE_FP8_E4M3_R32,
                             DSI_TYPE_IQ2_XXS};
    for (int32_t t : types) {
        for (int64_t K : {256ll, 512ll, 1024ll, 96ll, 160ll, 200ll}) {
            uint64_t rb = dsic::row_bytes(t, K);
            const dsib_type_info *ti = dsib_type_info_get(t);
            uint64_t ref_rb = dsib_type_row_bytes(t, K);
            CHECK(rb == ref_rb, "type %d K %lld: row bytes %llu vs %llu", (int)t, (long long)K,
                  (unsigned long long)rb, (unsigned long long)ref_rb);
            if (rb == 0) continue;
            CHECK(dsic::type_blck(t) == ti->blck && dsic::type_bytes(t) == ti->type_size,
                  "type %d geometry", (int)t);
            std::vector<uint8_t> row(rb + 64);
            for (auto &b : row) b = (uint8_t)rnd();
            if (t == DSI_TYPE_F32) /* finite floats mostly, plus the random bit patterns */
                for (int64_t i = 0; i < K; i += 2) {
                    float f = frand(-4, 4);
                    memcpy(&row[4 * i], &f, 4);
                }
            std::vector<float> ref(K);
            dsi_status st;
            if (t == DSI_TYPE_F32 || t == DSI_TYPE_F16 || t == DSI_TYPE_BF16) {
                for (int64_t i = 0; i < K; i++) {
                    uint16_t h;
                    memcpy(&h, &row[2 * i], 2);
                    if (t == DSI_TYPE_F32) memcpy(&ref[i], &row[4 * i], 4);
                    else ref[i] = t == DSI_TYPE_F16 ? dsii_f16_to_f32(h) : dsii_bf16_to_f32(h);
                }
                st = DSI_OK;
            } else {
                st = dsii_dequantize_row(t, row.data(), ref.data(), K, NULL);
            }
            CHECK(st == DSI_OK, "lib/quant dequantize type %d", (int)t);
            int bad = 0;
            for (int64_t i = 0; i < K; i++)
                if (!same(dsic::dq_elem(t, row.data(), i), ref[i]) && bad++ < 3)
                    printf("  type %d elem %lld: %g vs %g\n", (int)t, (long long)i,
                           (double)dsic::dq_elem(t, row.data(), i), (double)ref[i]);
            CHECK(bad == 0, "type %d K %lld: %d elements of dq_elem differ from lib/quant", (int)t,
                  (long long)K, bad);
            switch (t) {
            case DSI_TYPE_F32: check_chunks<DSI_TYPE_F32>(row.data(), K, ref.data(), "f32"); break;
            case DSI_TYPE_F16: check_chunks<DSI_TYPE_F16>(row.data(), K, ref.data(), "f16"); break;
            case DSI_TYPE_BF16: check_chunks<DSI_TYPE_BF16>(row.data(), K, ref.data(), "bf16"); break;
            case DSI_TYPE_Q8_0: check_chunks<DSI_TYPE_Q8_0>(row.data(), K, ref.data(), "q8_0"); break;
            case DSI_TYPE_Q4_K: check_chunks<DSI_TYPE_Q4_K>(row.data(), K, ref.data(), "q4_k"); break;
            case DSI_TYPE_Q2_K: check_chunks<DSI_TYPE_Q2_K>(row.data(), K, ref.data(), "q2_k"); break;
            case DSI_TYPE_MXFP4: check_chunks<DSI_TYPE_MXFP4>(row.data(), K, ref.data(), "mxfp4"); break;
            case DSI_TYPE_IQ2_XXS: check_chunks<DSI_TYPE_IQ2_XXS>(row.data(), K, ref.data(), "iq2_xxs"); break;
            case DSI_TYPE_FP8_E4M3_B128:
                check_chunks<DSI_TYPE_FP8_E4M3_B128>(row.data(), K, ref.data(), "fp8_b128");
                break;
            default: check_chunks<DSI_TYPE_FP8_E4M3_B32>(row.data(), K, ref.data(), "fp8_b32/r32"); break;
            }
        }
    }
    printf("decode: every supported type, dq_elem and chunk_elem vs lib/quant\n");
}

/* ---- scalar rounding ------------------------------------------------------------------- */

static void test_rounding(void) {
    int bad_e4 = 0, bad_e2 = 0, bad_e8 = 0;
    for (int i = 0; i < 400000; i++) {
        float f;
        if (i & 1) {
            uint32_t u = (uint32_t)rnd();
            memcpy(&f, &u, 4);
        } else {
            f = frand(-500, 500) * (float)std::ldexp(1.0, (int)(rnd() % 40) - 20);
        }
        if (!same(dsic::e4m3_rne(f), dsii_e4m3_rne(f))) bad_e4++;
        if (!same(dsic::e2m1_rne(f), dsii_e2m1_rne(f))) bad_e2++;
        if (dsic::e8m0_ceil(f) != dsii_e8m0_ceil(f)) bad_e8++;
    }
    for (uint32_t e = 0; e < 256; e++)
        CHECK(same(dsic::e8m0_to_f32(e), dsii_e8m0_to_f32((uint8_t)e)), "e8m0 %u", e);
    for (uint32_t b = 0; b < 256; b++)
        CHECK(same(dsic::e4m3_to_f32(b), dsii_e4m3_to_f32((uint8_t)b)), "e4m3 %u", b);
    for (uint32_t b = 0; b < 16; b++)
        CHECK(same(dsic::e2m1_to_f32(b), dsii_e2m1_to_f32((uint8_t)b)), "e2m1 %u", b);
    for (uint32_t h = 0; h < 65536; h += 7)
        CHECK(same(dsic::f16_to_f32(h), dsii_f16_to_f32((uint16_t)h)), "f16 %u", h);
    CHECK(bad_e4 == 0, "e4m3_rne: %d of 400000 differ", bad_e4);
    CHECK(bad_e2 == 0, "e2m1_rne: %d of 400000 differ", bad_e2);
    CHECK(bad_e8 == 0, "e8m0_ceil: %d of 400000 differ", bad_e8);
    printf("rounding: e4m3 / e2m1 RNE, E8M0 ceiling, scalar decoders vs lib/quant\n");
}

/* ---- the CPU backend as the reference of the fused math ------------------------------------ */

struct Cpu {
    const dsib_backend *be;
    dsib_instance *inst;
    dsib_stream *s;
};

static bool cpu_open(Cpu *c) {
    c->be = dsib_cpu_backend();
    dsib_host h;
    dsii_backend_host_init(NULL, &h, -1);
    h.n_threads = 1;
    h.flags |= DSIB_HOST_EXACT_MATMUL;
    dsib_error e;
    memset(&e, 0, sizeof e);
    if (c->be->create(&h, &c->inst, &e) != DSI_OK) return false;
    dsib_stream_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_rows = 64;
    d.max_positions = 4096;
    d.max_heads = 8;
    d.max_head_dim = 512;
    d.max_width = 4096;
    return c->be->stream_create(c->inst, &d, &c->s, &e) == DSI_OK;
}
static void cpu_close(Cpu *c) {
    c->be->stream_destroy(c->s);
    c->be->destroy(c->inst);
}
static dsib_buffer *cpu_buf(Cpu *c, const void *init, size_t bytes, float **p) {
    dsib_buffer *b = NULL;
    dsib_error e;
    *p = NULL;
    if (c->be->buffer_alloc(c->inst, bytes, DSIB_BUFFER_SCRATCH, &b, &e) != DSI_OK) return NULL;
    *p = (float *)c->be->buffer_host_ptr(c->inst, b);
    if (init) memcpy(*p, init, bytes);
    return b;
}

static void test_fake_quant(Cpu *c) {
    const uint32_t rows = 6, cols = 512;
    std::vector<float> x(rows * cols);
    for (auto &v : x) v = frand(-3, 3) * (float)std::ldexp(1.0, (int)(rnd() % 24) - 12);
    for (uint32_t j = 0; j < 40; j++) x[j] = frand(-1, 1) * 1e-5f; /* the amax floors */
    for (uint32_t j = 128; j < 256; j++) x[j] = frand(-1, 1) * 1e-38f;
    for (int32_t recipe = 0; recipe < 3; recipe++)
        for (uint32_t fl = 0; fl < 2; fl++)
            for (uint32_t block : {32u, 64u, 128u}) {
                float *p = NULL;
                dsib_buffer *b = cpu_buf(c, x.data(), x.size() * 4, &p);
                if (!b || !p) {
                    CHECK(0, "cpu buffer");
                    return;
                }
                dsib_view v = {b, 0};
                CHECK(c->be->ops->fake_quant(c->s, v, cols, rows, 0, cols, block, recipe,
                                             fl ? DSIB_FQ_NO_ROUND : 0) == DSI_OK, "cpu fake_quant");
                int bad = 0;
                for (uint32_t r = 0; r < rows; r++)
                    for (uint32_t b0 = 0; b0 < cols; b0 += block) {
                        const float *in = &x[r * cols + b0];
                        float amax = 0.0f;
                        for (uint32_t i = 0; i < block; i++)
                            amax = std::fabs(in[i]) > amax ? std::fabs(in[i]) : amax;
                        float s, lim;
                        dsic::fq_scale(amax, recipe, &s, &lim);
                        for (uint32_t i = 0; i < block; i++)
                            if (!same(dsic::fq_elem(in[i], s, lim, recipe, !fl), p[r * cols + b0 + i])) bad++;
                    }
                CHECK(bad == 0, "fake_quant recipe %d block %u flags %u: %d differ", (int)recipe,
                      block, fl, bad);
                c->be->buffer_free(c->inst, b);
            }
    printf("fake_quant: fq_scale / fq_elem vs the CPU op, 3 recipes x 3 blocks x rounding\n");
}

static void test_hc_mix(Cpu *c) {
    for (int head = 0; head < 2; head++) {
        const uint32_t n = 5, n_hc = 4, D = 96, W = n_hc * D;
        const uint32_t n_mix = head ? n_hc : n_hc * (2 + n_hc), ldc = 32;
        std::vector<float> X(n * W), fn(n_mix * W), sc(3), bs(n_mix);
        for (auto &v : X) v = frand(-1, 1);
        for (auto &v : fn) v = frand(-0.2f, 0.2f);
        for (auto &v : sc) v = frand(0.5f, 2);
        for (auto &v : bs) v = frand(-1, 1);
        float *px = NULL, *pf = NULL, *ps = NULL, *pb = NULL, *pc = NULL, *pm = NULL;
        dsib_buffer *bx = cpu_buf(c, X.data(), X.size() * 4, &px);
        dsib_buffer *bf = cpu_buf(c, fn.data(), fn.size() * 4, &pf);
        dsib_buffer *bsc = cpu_buf(c, sc.data(), 12, &ps);
        dsib_buffer *bb = cpu_buf(c, bs.data(), bs.size() * 4, &pb);
        dsib_buffer *bc = cpu_buf(c, NULL, n * ldc * 4, &pc);
        dsib_buffer *bm = cpu_buf(c, NULL, n * ldc * 4, &pm);
        if (!px || !pf || !ps || !pb || !pc || !pm) {
            CHECK(0, "cpu buffers");
            return;
        }
        dsib_weight wf = {bf, 0, DSI_TYPE_F32, 1, {W, n_mix, 1}, W * 4ull, W * 4ull * n_mix};
        dsib_weight ws = {bsc, 0, DSI_TYPE_F32, 2, {3, 1, 1}, 12, 12};
        dsib_weight wb = {bb, 0, DSI_TYPE_F32, 3, {n_mix, 1, 1}, n_mix * 4ull, n_mix * 4ull};
        dsib_view vx = {bx, 0}, vc = {bc, 0}, vm = {bm, 0};
        CHECK(c->be->ops->hc_mix(c->s, vx, n, n_hc, D, &wf, &ws, &wb, 1e-6f, 1e-6f, 20,
                                 head ? DSIB_HC_HEAD : DSIB_HC_BLOCK, vc, ldc) == DSI_OK, "cpu hc_mix");
        CHECK(c->be->ops->matmul(c->s, &wf, 0, vx, W, vm, ldc, n) == DSI_OK, "cpu matmul");
        int bad = 0;
        for (uint32_t t = 0; t < n; t++) {
            /* the CPU op's sum of squares: eight lanes (element i to lane i mod 8), the tail
             * into lane 0, the lanes as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) */
            float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            uint32_t i8 = 0;
            for (; i8 + 8 <= W; i8 += 8)
                for (uint32_t k = 0; k < 8; k++) l[k] += X[t * W + i8 + k] * X[t * W + i8 + k];
            for (; i8 < W; i8++) l[0] += X[t * W + i8] * X[t * W + i8];
            const float ss = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
            float rs = 1.0f / sqrtf(ss / (float)W + 1e-6f);
            float m[16 * 18];
            memcpy(m, pm + t * ldc, n_mix * 4);
            dsic::hc_coef_row(m, n_hc, rs, sc.data(), bs.data(), 1e-6f, 20, head);
            for (uint32_t i = 0; i < n_mix; i++)
                if (!same(m[i], pc[t * ldc + i])) bad++;
        }
        CHECK(bad == 0, "hc_mix %s: %d coefficients differ from the CPU op", head ? "head" : "block", bad);
        for (dsib_buffer *b : {bx, bf, bsc, bb, bc, bm}) c->be->buffer_free(c->inst, b);
    }
    printf("hc_mix: hc_coef_row (RMS factor, sigmoids, Sinkhorn 20) vs the CPU op\n");
}

static void test_engram(Cpu *c) {
    const uint32_t n = 3, n_hc = 4, D = 64, ldkv = (n_hc + 1) * D;
    std::vector<float> X(n * n_hc * D), kv(n * ldkv), qw(n_hc * D), kw(n_hc * D);
    for (auto &v : X) v = frand(-1, 1);
    for (auto &v : kv) v = frand(-1, 1);
    for (auto &v : qw) v = frand(0.5f, 1.5f);
    for (auto &v : kw) v = frand(0.5f, 1.5f);
    float *px = NULL, *pk = NULL, *pq = NULL, *pw = NULL;
    dsib_buffer *bx = cpu_buf(c, X.data(), X.size() * 4, &px);
    dsib_buffer *bk = cpu_buf(c, kv.data(), kv.size() * 4, &pk);
    dsib_buffer *bq = cpu_buf(c, qw.data(), qw.size() * 4, &pq);
    dsib_buffer *bw = cpu_buf(c, kw.data(), kw.size() * 4, &pw);
    dsib_weight wq = {bq, 0, DSI_TYPE_F32, 1, {D, n_hc, 1}, D * 4ull, D * 4ull * n_hc};
    dsib_weight wk = {bw, 0, DSI_TYPE_F32, 2, {D, n_hc, 1}, D * 4ull, D * 4ull * n_hc};
    dsib_view vx = {bx, 0}, vk = {bk, 0};
    CHECK(c->be->ops->engram_gate(c->s, vx, n, n_hc, D, vk, ldkv, &wq, &wk, 1e-6f) == DSI_OK, "cpu engram");
    const float inv = 1.0f / sqrtf((float)D);
    int bad = 0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < n_hc; h++) {
            const float *x = &X[(t * n_hc + h) * D], *key = &kv[t * ldkv + h * D];
            const float *val = &kv[t * ldkv + n_hc * D];
            float sx = 0, sk = 0, cc = 0;
            for (uint32_t d = 0; d < D; d++) {
                sx += x[d] * x[d];
                sk += key[d] * key[d];
                cc += x[d] * (qw[h * D + d] * kw[h * D + d]) * key[d];
            }
            float g = dsic::engram_g(sx, sk, cc, (float)D, 1e-6f, inv);
            for (uint32_t d = 0; d < D; d++)
                if (!same(x[d] + g * val[d], px[(t * n_hc + h) * D + d])) bad++;
        }
    CHECK(bad == 0, "engram_gate: %d values differ from the CPU op", bad);
    for (dsib_buffer *b : {bx, bk, bq, bw}) c->be->buffer_free(c->inst, b);
    printf("engram_gate: engram_g vs the CPU op\n");
}

static void test_rows(Cpu *c) {
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        const uint32_t n = 1 + (uint32_t)(rnd() % 6);
        std::vector<int32_t> r(4 * n);
        /* mostly well-formed sequences, then one random defect half of the time */
        uint32_t t = 0;
        while (t < n) {
            uint32_t cnt = 1 + (uint32_t)(rnd() % (n - t));
            int32_t slot = (int32_t)(rnd() % 3), p0 = (int32_t)(rnd() % 50);
            for (uint32_t j = 0; j < cnt; j++) {
                r[4 * (t + j) + 0] = p0 + (int32_t)j;
                r[4 * (t + j) + 1] = slot;
                r[4 * (t + j) + 2] = (int32_t)t;
                r[4 * (t + j) + 3] = (int32_t)cnt;
            }
            t += cnt;
        }
        if (rnd() & 1) r[rnd() % (4 * n)] += (int32_t)(rnd() % 5) - 2;
        float *p = NULL;
        dsib_buffer *b = cpu_buf(c, r.data(), r.size() * 4, &p);
        if (!b) {
            CHECK(0, "cpu buffer");
            return;
        }
        dsib_view v = {b, 0};
        const uint32_t slots = 1 + (uint32_t)(rnd() % 3);
        int cpu_ok = dsib_cpu_rows_check(v, n, slots) == DSI_OK;
        int all_ok = 1;
        for (uint32_t k = 0; k < n; k++) all_ok &= dsic::row_ok(r.data(), k, n, slots);
        if (cpu_ok != all_ok) bad++;
        c->be->buffer_free(c->inst, b);
    }
    CHECK(bad == 0, "row_ok disagrees with the CPU rows check on %d of 3000 step-row sets", bad);
    printf("step rows: row_ok vs dsib_cpu_rows_check on 3000 sets\n");
}

static void test_keys_and_math(void) {
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float a = frand(-10, 10), b = (rnd() & 3) ? frand(-10, 10) : a;
        if (rnd() % 17 == 0) a = 0.0f;
        if (rnd() % 17 == 0) b = -0.0f;
        uint32_t ka = dsic::score_key(a), kb = dsic::score_key(b);
        if ((a > b) != (ka > kb) || (a == b) != (ka == kb) || ka == 0) bad++;
    }
    CHECK(dsic::score_key(INFINITY) > dsic::score_key(1e30f), "inf key");
    CHECK(dsic::score_key(-INFINITY) != 0, "-inf key is eligible");
    CHECK(bad == 0, "score_key breaks the float order %d times", bad);
    /* dot8: the CPU's 8-lane order equals the sum of its lanes as the kernels combine them */
    for (uint32_t n : {1u, 7u, 8u, 64u, 100u, 512u}) {
        std::vector<float> a(n), b(n);
        for (uint32_t i = 0; i < n; i++) {
            a[i] = frand(-1, 1);
            b[i] = frand(-1, 1);
        }
        float l[8];
        for (uint32_t j = 0; j < 8; j++) l[j] = dsic::dot8_lane(a.data(), b.data(), n, j);
        float tree = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
        CHECK(same(tree, dsic::dot8(a.data(), b.data(), n)), "dot8 lanes n=%u", n);
    }
    printf("top-k keys keep the float order; dot8 lanes\n");
}

static void test_plans(void) {
    /* mm grid covers every (row, token) exactly */
    for (uint64_t R : {1ull, 3ull, 4ull, 5ull, 4097ull})
        for (uint32_t n : {1u, 7u, 8u, 9u, 512u}) {
            dsic::Dim3 g = dsic::mm_grid(R, n);
            CHECK((uint64_t)g.x * dsic::MM_WARPS >= R && (uint64_t)(g.x - 1) * dsic::MM_WARPS < R,
                  "mm grid rows R=%llu", (unsigned long long)R);
            CHECK((uint64_t)g.y * dsic::MM_NT >= n && (uint64_t)(g.y - 1) * dsic::MM_NT < n,
                  "mm grid tokens n=%u", n);
        }
    CHECK(dsic::moe_max_groups(256, 8) == 8 && dsic::moe_max_groups(16, 384) == 16, "moe groups");
    dsic::Dim3 mg = dsic::moe_grid(16, 6, 2048);
    CHECK(mg.x == 6 && mg.y == 2048 / dsic::MM_WARPS, "moe grid");
    /* workspace: the test streams' desc and a model-sized one */
    dsib_stream_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_rows = 64;
    d.max_positions = 8192;
    d.max_experts = 16;
    d.max_experts_used = 6;
    d.max_width = 1280;
    for (int k = 0; k < 3; k++) {
        if (k == 1) {
            d.max_rows = 512;
            d.max_positions = 1u << 20;
            d.max_experts = 256;
            d.max_experts_used = 8;
            d.max_width = 4096;
        }
        if (k == 2) memset(&d, 0, sizeof d);
        dsic::WsPlan p = dsic::ws_plan(&d);
        uint64_t P = d.max_positions ? d.max_positions : 1;
        CHECK(p.idx_rows >= 1 && p.idx_rows <= 64, "idx rows %u", p.idx_rows);
        CHECK(p.idx_keys >= 4ull * p.idx_rows * P && p.idx_bytes >= p.idx_keys + 4ull * p.idx_rows * P,
              "indexer regions");
        CHECK(p.idx_bytes <= ((uint64_t)dsic::IDX_WS_BUDGET_MIB << 20) + 512 || p.idx_rows == 1,
              "indexer budget");
        uint64_t slots = (uint64_t)d.max_rows * d.max_experts_used, E = d.max_experts;
        if (E) {
            CHECK(p.moe_h >= 4 * (1 + E + E + 1 + slots + E), "moe group tables fit");
            CHECK(p.moe_y >= p.moe_h + 4 * slots * d.max_width, "moe A fits");
            CHECK(p.moe_bytes >= p.moe_y + 4 * slots * d.max_width, "moe B fits");
        }
        CHECK(p.total >= p.idx_bytes && p.total >= p.moe_bytes && p.total >= 256, "total");
    }
    CHECK(dsic::alloc_bytes(0) >= 256 + 1 && dsic::alloc_bytes(1000) >= 1000 + 256, "padding");
    /* support table: every op, the decoded weight types, nothing else */
    for (uint32_t op = 0; op < DSIB_OP_COUNT; op++) CHECK(dsic::plan_supports_op(op, -1), "op %u", op);
    CHECK(!dsic::plan_supports_op(DSIB_OP_COUNT, -1), "op out of range");
    CHECK(dsic::plan_supports_op(DSIB_OP_MATMUL, DSI_TYPE_Q4_K), "q4_k matmul");
    CHECK(dsic::plan_supports_op(DSIB_OP_MATMUL, DSI_TYPE_IQ2_XXS), "iq2_xxs matmul");
    CHECK(!dsic::plan_supports_op(DSIB_OP_MOE_EXPERTS, 2 /* q4_0 */), "q4_0 declined");
    CHECK(dsic::plan_supports_op(DSIB_OP_MOE_ROUTE, DSI_TYPE_I32), "tid2eid");
    printf("plans: matmul / MoE grids, workspace layout, support table\n");
}

int main(void) {
    test_decode();
    test_rounding();
    test_keys_and_math();
    test_plans();
    Cpu c;
    if (!cpu_open(&c)) {
        printf("FAIL: the CPU backend did not open\n");
        return 1;
    }
    test_fake_quant(&c);
    test_hc_mix(&c);
    test_engram(&c);
    test_rows(&c);
    cpu_close(&c);
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
