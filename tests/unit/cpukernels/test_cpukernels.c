/*
 * backends/cpu/kernels: every type × ISA path × activation path × odd shapes against a
 * double-precision reference computed here from weights decoded by this test's own decoders
 * (written from the block definitions and checked against hand-computed blocks):
 *
 *   exact path (f32 activations): |y - Σ w·x| <= (n_in/4 + 16)·2^-23·Σ|w·x|;
 *   default path (8-bit activations): the activations are quantised by this test's own
 *     quantiser (kernels.h / act.c definition) and |y - Σ w·d·q| <= (n_in/16 + 16)·2^-23·
 *     Σ mag(w)·|d·q| (mag = |w|, or |d·sc·q| + |dmin·m| for the K-quants); the quantiser's
 *     bytes must equal the library's on every ISA, and every ISA's default-path result must
 *     equal the scalar one bit for bit;
 *
 * plus bit-identity of y across n_tok (GEMV vs GEMM rows), row chunking, thread counts and
 * the MoE gather path, on both paths (model-spec §10.4).
 *
 * No arguments: the cross-ISA / threading / API tests. "--isa NAME": that ISA's type and
 * invariance tests on both paths (exit 77 = skipped where the CPU / build cannot run it).
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/threadpool.h"
#include "quant/quant.h"
#include "tests/common/skip.h"
#include "../quant/ggml_ref.h"

#define DSI_TYPE_Q4_0 2 /* ggml's ids (not named in dsinfer.h) */
#define DSI_TYPE_Q4_1 3
#define DSI_TYPE_Q5_0 6
#define DSI_TYPE_Q5_1 7
#define DSI_TYPE_Q3_K 11
#define DSI_TYPE_IQ2_XS 17
#define DSI_TYPE_IQ3_XXS 18
#define DSI_TYPE_IQ1_S 19
#define DSI_TYPE_IQ1_M 29
#define DSI_TYPE_IQ4_NL 20
#define DSI_TYPE_IQ3_S 21
#define DSI_TYPE_IQ2_S 22
#define DSI_TYPE_IQ4_XS 23
#define DSI_TYPE_Q5_K 13
#define DSI_TYPE_Q6_K 14

/* ---- random numbers -------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rndu(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static unsigned rndi(unsigned n) { return (unsigned)(rnd() % n); }

/* ---- independent decoders (double) ------------------------------------------------------ */

static double dec_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}
static double dec_bf16(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : ldexp(1.0 + m / 128.0, e - 127);
    return s ? -v : v;
}
static double dec_e8m0(uint8_t e) { return ldexp(1.0, (int)e - 127); }
static double dec_e4m3(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}
static double dec_e2m1(uint8_t n) {
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (n & 8) ? -mag[n & 7] : mag[n & 7];
}
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* Decodes one row of n elements of `type` from `row` into dst (double). `mag` (may be NULL)
 * receives the magnitude each element contributes before cancellation: |w| for most types,
 * |d·sc·q| + |dmin·m| for the K-quants (whose kernels sum the two parts separately). */
static void decode_row_mag(int32_t type, const uint8_t *row, int64_t n, double *dst, double *mag) {
    switch (type) {
    case DSI_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, row + 4 * i, 4);
            dst[i] = f;
        }
        break;
    case DSI_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = dec_f16(rd16(row + 2 * i));
        break;
    case DSI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = dec_bf16(rd16(row + 2 * i));
        break;
    case DSI_TYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + 34 * b;
            for (int j = 0; j < 32; j++) dst[32 * b + j] = dec_f16(rd16(blk)) * (int8_t)blk[2 + j];
        }
        break;
    case DSI_TYPE_Q4_K:
        /* ggml block_q4_K: d, dmin, scales[12] (6-bit packed), qs[128]; sub-block j of 32:
         * value = d*sc_j*q - dmin*m_j; 64-element group g uses qs[32g..32g+32): low
         * nibbles for its first 32 elements, high nibbles for the next 32. */
        for (int64_t b = 0; b < n / 256; b++) {
            const uint8_t *blk = row + 144 * b, *sc = blk + 4, *qs = blk + 16;
            double d = dec_f16(rd16(blk)), dmin = dec_f16(rd16(blk + 2));
            for (int j = 0; j < 8; j++) {
                int s, m;
                if (j < 4) {
                    s = sc[j] & 63;
                    m = sc[j + 4] & 63;
                } else {
                    s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
                    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                }
                for (int l = 0; l < 32; l++) {
                    uint8_t byte = qs[32 * (j / 2) + l];
                    int q = (j & 1) ? byte >> 4 : byte & 15;
                    dst[256 * b + 32 * j + l] = d * s * q - dmin * m;
                    if (mag) mag[256 * b + 32 * j + l] = fabs(d * s * q) + fabs(dmin * m);
                }
            }
        }
        break;
    case DSI_TYPE_Q2_K:
        /* ggml block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin;
         * element e = 128h + 32s + 16p + l: 2-bit field s of qs[32h + 16p + l], sub-block
         * 8h + 2s + p. */
        for (int64_t b = 0; b < n / 256; b++) {
            const uint8_t *blk = row + 84 * b, *sc = blk, *qs = blk + 16;
            double d = dec_f16(rd16(blk + 80)), dmin = dec_f16(rd16(blk + 82));
            for (int e = 0; e < 256; e++) {
                int h = e / 128, s = (e / 32) % 4, p = (e / 16) % 2, l = e % 16;
                int q = (qs[32 * h + 16 * p + l] >> (2 * s)) & 3;
                int is = 8 * h + 2 * s + p;
                dst[256 * b + e] = d * (sc[is] & 15) * q - dmin * (sc[is] >> 4);
                if (mag) mag[256 * b + e] = fabs(d * (sc[is] & 15) * q) + fabs(dmin * (sc[is] >> 4));
            }
        }
        break;
    case DSI_TYPE_MXFP4:
        /* ggml block_mxfp4: e (E8M0), qs[16]; element j < 16 low nibble of qs[j], element
         * j + 16 high nibble; value e2m1 * 2^(e-127). */
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + 17 * b;
            for (int j = 0; j < 16; j++) {
                dst[32 * b + j] = dec_e2m1(blk[1 + j] & 15) * dec_e8m0(blk[0]);
                dst[32 * b + 16 + j] = dec_e2m1(blk[1 + j] >> 4) * dec_e8m0(blk[0]);
            }
        }
        break;
    case DSI_TYPE_FP8_E4M3_B128:
    case DSI_TYPE_FP8_E4M3_B32: {
        int bs = type == DSI_TYPE_FP8_E4M3_B128 ? 128 : 32;
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *blk = row + (bs + 1) * (i / bs);
            dst[i] = dec_e4m3(blk[1 + i % bs]) * dec_e8m0(blk[0]);
        }
        break;
    }
    /* the further ggml types: tests/unit/quant/ggml_ref.c, element by element from the block
     * definitions (docs/tensor-types.md; its own sign parity rule for the IQ grids); its mag is
     * |w| for the symmetric types, |d·sc·q| + |dmin·m| for Q5_K as for the K-quants above,
     * |d·q| + |m| for Q4_1 / Q5_1 (whose kernels sum the min term separately too) */
    case DSI_TYPE_IQ2_XXS:
    case DSI_TYPE_Q6_K:
    case DSI_TYPE_Q3_K:
    case DSI_TYPE_Q4_0:
    case DSI_TYPE_IQ4_NL:
    case DSI_TYPE_IQ4_XS:
    case DSI_TYPE_IQ3_XXS:
    case DSI_TYPE_Q4_1:
    case DSI_TYPE_Q5_0:
    case DSI_TYPE_Q5_1:
    case DSI_TYPE_IQ2_XS:
    case DSI_TYPE_IQ2_S:
    case DSI_TYPE_IQ3_S:
    case DSI_TYPE_IQ1_S:
    case DSI_TYPE_IQ1_M:
    case DSI_TYPE_Q5_K:
        gref_decode(type, row, n, dst, mag);
        break;
    default:
        fail_msg("decode_row: type %d", (int)type);
    }
    if (mag && type != DSI_TYPE_Q4_K && type != DSI_TYPE_Q2_K && type != DSI_TYPE_Q5_K &&
        type != DSI_TYPE_Q4_1 && type != DSI_TYPE_Q5_1)
        for (int64_t i = 0; i < n; i++) mag[i] = fabs(dst[i]);
}

static void decode_row(int32_t type, const uint8_t *row, int64_t n, double *dst) {
    decode_row_mag(type, row, n, dst, NULL);
}

/* ---- the default path's activation quantisation, from its definition (act.c) ------------ */

/* Expected activation block (0: f32 activations) and format of each weight type. */
static int act_block_of(int32_t type) {
    switch (type) {
    case DSI_TYPE_Q8_0:
    case DSI_TYPE_MXFP4:
    case DSI_TYPE_Q4_0:
    case DSI_TYPE_IQ4_NL:
    case DSI_TYPE_IQ4_XS:
    case DSI_TYPE_Q4_1:
    case DSI_TYPE_Q5_0:
    case DSI_TYPE_Q5_1: return 32;
    case DSI_TYPE_Q4_K:
    case DSI_TYPE_Q2_K:
    case DSI_TYPE_IQ2_XXS:
    case DSI_TYPE_Q6_K:
    case DSI_TYPE_Q3_K:
    case DSI_TYPE_IQ3_XXS:
    case DSI_TYPE_IQ2_XS:
    case DSI_TYPE_IQ2_S:
    case DSI_TYPE_IQ3_S:
    case DSI_TYPE_IQ1_S:
    case DSI_TYPE_IQ1_M:
    case DSI_TYPE_Q5_K: return 256;
    default: return 0;
    }
}
static int32_t act_fmt_of(int32_t type) {
    switch (type) {
    case DSI_TYPE_Q8_0:
    case DSI_TYPE_MXFP4:
    case DSI_TYPE_Q4_0:
    case DSI_TYPE_IQ4_NL:
    case DSI_TYPE_IQ4_XS:
    case DSI_TYPE_Q4_1:
    case DSI_TYPE_Q5_0:
    case DSI_TYPE_Q5_1: return DSIB_ACT_Q8_32;
    case DSI_TYPE_Q4_K:
    case DSI_TYPE_Q5_K: return DSIB_ACT_Q8_K_P4;
    case DSI_TYPE_Q2_K:
    case DSI_TYPE_Q3_K: return DSIB_ACT_Q8_K_P2;
    case DSI_TYPE_IQ2_XXS:
    case DSI_TYPE_IQ3_XXS:
    case DSI_TYPE_IQ2_XS:
    case DSI_TYPE_IQ2_S:
    case DSI_TYPE_IQ3_S:
    case DSI_TYPE_IQ1_S:
    case DSI_TYPE_IQ1_M:
    case DSI_TYPE_Q6_K: return DSIB_ACT_Q8_K;
    default: return DSIB_ACT_F32;
    }
}
/* Natural 32-element group stored at position p of a 256-block (kernels.h). */
static int act_group_at(int32_t fmt, int p) {
    static const int p4[8] = {0, 2, 1, 3, 4, 6, 5, 7}, p2[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    return fmt == DSIB_ACT_Q8_K_P4 ? p4[p] : fmt == DSIB_ACT_Q8_K_P2 ? p2[p] : p;
}

/* q (natural order) and d per block of B: d = amax/127, q = RNE(x·(127/amax)); non-finite
 * block → d NaN, q 0; amax < 2^-96 → d 0, q 0. */
static void ref_quantize(const float *x, int64_t n, int B, int8_t *q, float *d) {
    for (int64_t b = 0; b < n / B; b++) {
        float amax = 0;
        int bad = 0;
        for (int i = 0; i < B; i++) {
            float a = fabsf(x[b * B + i]);
            if (!isfinite(a)) bad = 1;
            else if (a > amax) amax = a;
        }
        if (bad || amax < 0x1p-96f) {
            d[b] = bad ? NAN : 0.0f;
            memset(q + b * B, 0, (size_t)B);
            continue;
        }
        volatile float dv = amax / 127.0f, idv = 127.0f / amax;
        d[b] = dv;
        for (int i = 0; i < B; i++) {
            volatile float p = x[b * B + i] * idv;
            float r = rintf(p);
            q[b * B + i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
    }
}

/* ---- hand-computed blocks ---------------------------------------------------------------- */

/* Runs one row of every ISA on both paths with x = 127 at element i, 0 elsewhere (so the
 * 8-bit activation is exact: d = 1, q = 127): y must be exactly 127 × the decoded weight
 * (the values here are exact). */
static void check_kernel_element(int32_t type, const uint8_t *row, int64_t n_in, int64_t i,
                                 double want) {
    float *x = calloc((size_t)n_in, sizeof(float));
    void *act = NULL;
    assert_non_null(x);
    assert_int_equal(posix_memalign(&act, 64, 65536), 0);
    x[i] = 127.0f;
    const int32_t fmt = dsib_kern_act_format(type, 0);
    for (int32_t isa = 0; isa < DSIB_ISA_COUNT; isa++) {
        const dsib_kern_table *kt = dsib_kern_table_for(isa);
        if (!kt) continue;
        for (int path = 0; path < 2; path++) {
            float y = -12345.0f;
            const size_t rb = dsib_kern_row_bytes(type, n_in);
            if (path == 0 || fmt == DSIB_ACT_F32) {
                kt->matmul_rows(type, row, rb, n_in, 0, 1, x, n_in, &y, 1, 1);
            } else {
                const size_t as = dsib_kern_act_row_bytes(fmt, n_in);
                assert_true(as > 0 && as <= 65536);
                kt->act_quantize(fmt, x, n_in, n_in, 1, act, as);
                kt->qmatmul_rows(type, row, rb, n_in, 0, 1, act, as, &y, 1, 1);
            }
            if ((double)y != 127.0 * want)
                fail_msg("type %d isa %s path %s element %lld: kernel %.9g, hand value 127 × %.9g",
                         (int)type, kt->name, path ? "default" : "exact", (long long)i,
                         (double)y, want);
        }
    }
    free(x);
    free(act);
}

static void test_hand_blocks(void **state) {
    (void)state;
    double d[256];
    {   /* F16 / BF16 */
        uint8_t r[6] = {0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00}; /* 1, -2, 2^-24 */
        decode_row(DSI_TYPE_F16, r, 3, d);
        assert_true(d[0] == 1.0 && d[1] == -2.0 && d[2] == ldexp(1, -24));
        check_kernel_element(DSI_TYPE_F16, r, 3, 1, -2.0);
        check_kernel_element(DSI_TYPE_F16, r, 3, 2, ldexp(1, -24));
        uint8_t b[4] = {0x80, 0x3F, 0x40, 0xC0}; /* 1, -3 */
        decode_row(DSI_TYPE_BF16, b, 2, d);
        assert_true(d[0] == 1.0 && d[1] == -3.0);
        check_kernel_element(DSI_TYPE_BF16, b, 2, 1, -3.0);
    }
    {   /* Q8_0: d = 0.5 */
        uint8_t blk[34] = {0x00, 0x38};
        blk[2] = 4;
        blk[33] = 0x80; /* -128 */
        decode_row(DSI_TYPE_Q8_0, blk, 32, d);
        assert_true(d[0] == 2.0 && d[31] == -64.0 && d[5] == 0.0);
        check_kernel_element(DSI_TYPE_Q8_0, blk, 32, 0, 2.0);
        check_kernel_element(DSI_TYPE_Q8_0, blk, 32, 31, -64.0);
    }
    {   /* Q4_K: d = 1, dmin = 0.5; sub-block 0: sc 3, m 2; sub-block 5: sc 17, m 34 */
        uint8_t blk[144] = {0x00, 0x3C, 0x00, 0x38};
        uint8_t *sc = blk + 4, *qs = blk + 16;
        sc[0] = 3;
        sc[4] = 2;
        sc[9] = 0x21;  /* sub-block 5: sc low 1, m low 2 */
        sc[1] |= 0x40; /* sc high bits 1 → +16 */
        sc[5] |= 0x80; /* m high bits 2 → +32 */
        qs[0] = 0x5A;  /* element 0: low nibble 10 */
        qs[64] = 0x70; /* element 160 (sub-block 5, high nibbles of qs[64..96)): 7 */
        decode_row(DSI_TYPE_Q4_K, blk, 256, d);
        assert_true(d[0] == 3.0 * 10 - 0.5 * 2);     /* 29 */
        assert_true(d[160] == 17.0 * 7 - 0.5 * 34); /* 102 */
        assert_true(d[161] == -17.0);
        check_kernel_element(DSI_TYPE_Q4_K, blk, 256, 0, 29.0);
        check_kernel_element(DSI_TYPE_Q4_K, blk, 256, 160, 102.0);
        check_kernel_element(DSI_TYPE_Q4_K, blk, 256, 161, -17.0);
    }
    {   /* Q2_K: d = 1, dmin = 0.5 */
        uint8_t blk[84] = {0};
        blk[80] = 0x00;
        blk[81] = 0x3C;
        blk[82] = 0x00;
        blk[83] = 0x38;
        blk[0] = 0x21;  /* sub-block 0: scale 1, min 2 */
        blk[2] = 0x12;  /* sub-block 2: scale 2, min 1 */
        blk[4] = 0x03;  /* sub-block 4: scale 3, min 0 */
        blk[6] = 0xF1;  /* sub-block 6: scale 1, min 15 */
        blk[16] = 0xE4; /* fields 0,1,2,3 → elements 0, 32, 64, 96 */
        decode_row(DSI_TYPE_Q2_K, blk, 256, d);
        assert_true(d[0] == -1.0 && d[32] == 1.5 && d[64] == 6.0 && d[96] == -4.5);
        check_kernel_element(DSI_TYPE_Q2_K, blk, 256, 0, -1.0);
        check_kernel_element(DSI_TYPE_Q2_K, blk, 256, 32, 1.5);
        check_kernel_element(DSI_TYPE_Q2_K, blk, 256, 64, 6.0);
        check_kernel_element(DSI_TYPE_Q2_K, blk, 256, 96, -4.5);
    }
    {   /* MXFP4: scale 2 */
        uint8_t blk[17] = {128, 0xF3};
        decode_row(DSI_TYPE_MXFP4, blk, 32, d);
        assert_true(d[0] == 3.0 && d[16] == -12.0);
        check_kernel_element(DSI_TYPE_MXFP4, blk, 32, 0, 3.0);
        check_kernel_element(DSI_TYPE_MXFP4, blk, 32, 16, -12.0);
    }
    {   /* Q4_1: d = 0.5, m = -2 */
        uint8_t blk[20] = {0x00, 0x38, 0x00, 0xC0};
        blk[4] = 0xA3; /* element 0: 3, element 16: 10 */
        decode_row(DSI_TYPE_Q4_1, blk, 32, d);
        assert_true(d[0] == -0.5 && d[16] == 3.0 && d[5] == -2.0);
        check_kernel_element(DSI_TYPE_Q4_1, blk, 32, 0, -0.5);
        check_kernel_element(DSI_TYPE_Q4_1, blk, 32, 16, 3.0);
        check_kernel_element(DSI_TYPE_Q4_1, blk, 32, 5, -2.0);
    }
    {   /* Q5_0: d = 0.25; fifth bits 1 and 17 set (qh = 0x00020002) */
        uint8_t blk[22] = {0x00, 0x34, 0x02, 0x00, 0x02, 0x00};
        blk[6 + 1] = 0x5C; /* element 1: 12 | 16, element 17: 5 | 16 */
        blk[6 + 2] = 0x0F; /* element 2: 15 */
        decode_row(DSI_TYPE_Q5_0, blk, 32, d);
        assert_true(d[1] == 3.0 && d[17] == 1.25 && d[2] == -0.25 && d[0] == -4.0);
        check_kernel_element(DSI_TYPE_Q5_0, blk, 32, 1, 3.0);
        check_kernel_element(DSI_TYPE_Q5_0, blk, 32, 17, 1.25);
        check_kernel_element(DSI_TYPE_Q5_0, blk, 32, 2, -0.25);
        check_kernel_element(DSI_TYPE_Q5_0, blk, 32, 18, -4.0);
    }
    {   /* Q5_1: d = 1, m = 0.5; fifth bits 0 and 31 set (qh = 0x80000001) */
        uint8_t blk[24] = {0x00, 0x3C, 0x00, 0x38, 0x01, 0x00, 0x00, 0x80};
        blk[8 + 0] = 0x09;  /* element 0: 9 | 16 */
        blk[8 + 15] = 0x70; /* element 31: 7 | 16, element 15: 0 */
        decode_row(DSI_TYPE_Q5_1, blk, 32, d);
        assert_true(d[0] == 25.5 && d[31] == 23.5 && d[15] == 0.5 && d[16] == 0.5);
        check_kernel_element(DSI_TYPE_Q5_1, blk, 32, 0, 25.5);
        check_kernel_element(DSI_TYPE_Q5_1, blk, 32, 31, 23.5);
        check_kernel_element(DSI_TYPE_Q5_1, blk, 32, 15, 0.5);
    }
    {   /* FP8 B128, partial row of 3 values: scale 0.5 */
        uint8_t blk[129] = {126, 0x38, 0x01, 0xFE};
        decode_row(DSI_TYPE_FP8_E4M3_B128, blk, 3, d);
        assert_true(d[0] == 0.5 && d[1] == ldexp(1, -10) && d[2] == -224.0);
        check_kernel_element(DSI_TYPE_FP8_E4M3_B128, blk, 3, 0, 0.5);
        check_kernel_element(DSI_TYPE_FP8_E4M3_B128, blk, 3, 1, ldexp(1, -10));
        check_kernel_element(DSI_TYPE_FP8_E4M3_B128, blk, 3, 2, -224.0);
        uint8_t b32[33] = {0, 0x38}; /* e = 0 → scale 2^-127 */
        decode_row(DSI_TYPE_FP8_E4M3_B32, b32, 1, d);
        assert_true(d[0] == ldexp(1, -127));
    }
}

/* ---- random weights ---------------------------------------------------------------------- */

static uint16_t rnd_f16(int emin, int emax) {
    return (uint16_t)((rndi(2) << 15) | ((unsigned)(emin + (int)rndi((unsigned)(emax - emin + 1))) << 10) |
                      rndi(1024));
}

static void fill_row(int32_t type, uint8_t *row, int64_t n) {
    size_t rb = dsib_kern_row_bytes(type, n);
    for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)rnd();
    switch (type) {
    case DSI_TYPE_F32:
        for (int64_t i = 0; i < n; i++) {
            float f = (float)(rndu() * 2 - 1);
            memcpy(row + 4 * i, &f, 4);
        }
        break;
    case DSI_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = rndi(50) ? rnd_f16(8, 17) : (uint16_t)rndi(1024); /* some subnormals */
            memcpy(row + 2 * i, &h, 2);
        }
        break;
    case DSI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)((rndi(2) << 15) | ((120 + rndi(12)) << 7) | rndi(128));
            memcpy(row + 2 * i, &h, 2);
        }
        break;
    case DSI_TYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            uint16_t h = rnd_f16(5, 10) & 0x7fff;
            memcpy(row + 34 * b, &h, 2);
        }
        break;
    case DSI_TYPE_Q4_K:
        for (int64_t b = 0; b < n / 256; b++) {
            uint16_t h = rnd_f16(5, 10) & 0x7fff, h2 = rnd_f16(5, 10) & 0x7fff;
            memcpy(row + 144 * b, &h, 2);
            memcpy(row + 144 * b + 2, &h2, 2);
        }
        break;
    case DSI_TYPE_Q2_K:
        for (int64_t b = 0; b < n / 256; b++) {
            uint16_t h = rnd_f16(5, 10) & 0x7fff, h2 = rnd_f16(5, 10) & 0x7fff;
            memcpy(row + 84 * b + 80, &h, 2);
            memcpy(row + 84 * b + 82, &h2, 2);
        }
        break;
    case DSI_TYPE_MXFP4:
        for (int64_t b = 0; b < n / 32; b++) row[17 * b] = (uint8_t)(120 + rndi(12));
        break;
    case DSI_TYPE_IQ2_XXS: /* random indices, signs, scales; d finite */
    case DSI_TYPE_Q6_K:    /* random codes and int8 scales; d finite */
    case DSI_TYPE_Q5_K:    /* random codes, scales, mins; d, dmin finite */
    case DSI_TYPE_Q3_K:    /* random codes, high bits and scales; d finite */
    case DSI_TYPE_IQ3_XXS:
    case DSI_TYPE_IQ2_XS:  /* random indices, sign bytes / indices, high index bits, scales */
    case DSI_TYPE_IQ2_S:
    case DSI_TYPE_IQ3_S:
    case DSI_TYPE_IQ1_S:   /* random indices, delta signs, scales; d finite (IQ1_M: in the */
    case DSI_TYPE_IQ1_M:   /* scale words' top nibbles) */
    case DSI_TYPE_Q4_0:
    case DSI_TYPE_IQ4_NL:
    case DSI_TYPE_IQ4_XS:
    case DSI_TYPE_Q4_1: /* random codes (and fifth bits); d (and m) finite */
    case DSI_TYPE_Q5_0:
    case DSI_TYPE_Q5_1:
        gref_random_row(type, row, n, rnd);
        break;
    case DSI_TYPE_FP8_E4M3_B128:
    case DSI_TYPE_FP8_E4M3_B32: {
        int bs = type == DSI_TYPE_FP8_E4M3_B128 ? 128 : 32;
        for (size_t b = 0; b < rb / (size_t)(bs + 1); b++) {
            uint8_t *blk = row + (size_t)(bs + 1) * b;
            blk[0] = (uint8_t)(115 + rndi(20));
            for (int j = 0; j < bs; j++)
                if ((blk[1 + j] & 0x7f) == 0x7f) blk[1 + j] ^= 1; /* no NaN codes */
        }
        break;
    }
    }
}

typedef struct shape {
    int32_t type;
    int64_t n_in[3];
} shape;

/* The third size of every type ends in a partial block / tail where the type allows it, and
 * has an odd number of 32-blocks where it is a 32-block type (the lone last block). */
static const shape shapes[] = {
    {DSI_TYPE_F32, {1, 77, 2100}},
    {DSI_TYPE_F16, {7, 64, 1333}},
    {DSI_TYPE_BF16, {5, 96, 1500}},
    {DSI_TYPE_Q8_0, {32, 224, 2080}},
    {DSI_TYPE_Q4_K, {256, 512, 2304}},
    {DSI_TYPE_Q2_K, {256, 768, 1280}},
    {DSI_TYPE_MXFP4, {32, 160, 2080}},
    {DSI_TYPE_IQ2_XXS, {256, 768, 2304}},
    {DSI_TYPE_Q6_K, {256, 512, 1792}},
    {DSI_TYPE_Q5_K, {256, 768, 1792}}, /* 1792: four super-blocks, a pair, one (DSIB_KQ4_TILE_AVX512) */
    {DSI_TYPE_Q3_K, {256, 512, 2304}},
    {DSI_TYPE_Q4_0, {32, 160, 2080}},
    {DSI_TYPE_IQ4_NL, {32, 224, 1056}},
    {DSI_TYPE_IQ4_XS, {256, 512, 2048}},
    {DSI_TYPE_IQ3_XXS, {256, 768, 1792}},
    {DSI_TYPE_Q4_1, {32, 192, 2080}},
    {DSI_TYPE_Q5_0, {32, 224, 1056}},
    {DSI_TYPE_Q5_1, {32, 160, 2144}},
    {DSI_TYPE_IQ2_XS, {256, 512, 2304}},
    {DSI_TYPE_IQ2_S, {256, 768, 2048}},
    {DSI_TYPE_IQ3_S, {256, 512, 1792}},
    {DSI_TYPE_IQ1_S, {256, 512, 2304}},
    {DSI_TYPE_IQ1_M, {256, 768, 1792}},
    {DSI_TYPE_FP8_E4M3_B128, {128, 300, 2100}},
    {DSI_TYPE_FP8_E4M3_B32, {45, 64, 1100}},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

enum { PATH_EXACT = 0, PATH_DEFAULT = 1 };
static const char *path_name(int path) { return path ? "default" : "exact"; }
static uint32_t path_flags(int path) { return path ? 0u : DSIB_MM_EXACT; }

typedef struct problem {
    int32_t type, fmt;
    int64_t n_in, n_out, n_tok;
    size_t rb;
    uint8_t *w;
    float *x;      /* [n_tok][n_in + 3] (stride larger than n_in) */
    int64_t xs;
    double *ref;   /* [n_tok][n_out] Σ w·x */
    double *mag;   /* Σ|w·x| */
    double *refq;  /* Σ w·d·q (default path, quantised by this test) */
    double *magq;  /* Σ mag(w)·|d·q| */
} problem;

/* Dequantised activations of token t as this test quantises them (default path). */
static void ref_act(const problem *p, int64_t t, double *xq) {
    const int B = act_block_of(p->type);
    if (!B) {
        for (int64_t i = 0; i < p->n_in; i++) xq[i] = p->x[t * p->xs + i];
        return;
    }
    int8_t *q = malloc((size_t)p->n_in);
    float *d = malloc(sizeof(float) * (size_t)(p->n_in / B + 1));
    assert_non_null(q);
    assert_non_null(d);
    ref_quantize(p->x + t * p->xs, p->n_in, B, q, d);
    for (int64_t i = 0; i < p->n_in; i++) xq[i] = (double)d[i / B] * q[i];
    free(q);
    free(d);
}

static void problem_make(problem *p, int32_t type, int64_t n_in, int64_t n_out, int64_t n_tok) {
    p->type = type;
    p->fmt = act_fmt_of(type);
    p->n_in = n_in;
    p->n_out = n_out;
    p->n_tok = n_tok;
    p->rb = dsib_kern_row_bytes(type, n_in);
    assert_true(p->rb > 0);
    assert_int_equal(dsib_kern_act_format(type, 0), p->fmt);
    assert_int_equal(dsib_kern_act_format(type, DSIB_MM_EXACT), DSIB_ACT_F32);
    p->w = malloc(p->rb * (size_t)n_out);
    p->xs = n_in + 3;
    const size_t ny = (size_t)(n_out * n_tok);
    p->x = malloc(sizeof(float) * (size_t)(p->xs * n_tok));
    p->ref = malloc(sizeof(double) * ny);
    p->mag = malloc(sizeof(double) * ny);
    p->refq = malloc(sizeof(double) * ny);
    p->magq = malloc(sizeof(double) * ny);
    double *wd = malloc(sizeof(double) * (size_t)n_in), *wm = malloc(sizeof(double) * (size_t)n_in);
    double *xq = malloc(sizeof(double) * (size_t)(n_in * n_tok));
    assert_true(p->w && p->x && p->ref && p->mag && p->refq && p->magq && wd && wm && xq);
    for (int64_t i = 0; i < p->xs * n_tok; i++) p->x[i] = (float)(rndu() * 2 - 1);
    for (int64_t t = 0; t < n_tok; t++) ref_act(p, t, xq + t * n_in);
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *row = p->w + p->rb * (size_t)o;
        fill_row(type, row, n_in);
        decode_row_mag(type, row, n_in, wd, wm);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0, m = 0, sq = 0, mq = 0;
            for (int64_t i = 0; i < n_in; i++) {
                const double xv = p->x[t * p->xs + i], qv = xq[t * n_in + i];
                s += wd[i] * xv;
                m += fabs(wd[i] * xv);
                sq += wd[i] * qv;
                mq += wm[i] * fabs(qv);
            }
            p->ref[t * n_out + o] = s;
            p->mag[t * n_out + o] = m;
            p->refq[t * n_out + o] = sq;
            p->magq[t * n_out + o] = mq;
        }
    }
    free(wd);
    free(wm);
    free(xq);
}

static void problem_free(problem *p) {
    free(p->w);
    free(p->x);
    free(p->ref);
    free(p->mag);
    free(p->refq);
    free(p->magq);
}

/* Exact path: f32 accumulation, each lane chain has at most n_in/4 additions (plus the
 * decode rounding and the final lane sums). Default path: per lane at most n_in/16 fma
 * steps (one per block pair / two per super-block), the scale product and the 4-level
 * reduction. docs/performance.md §2. */
static double tol_exact(const problem *p, int64_t idx) {
    return ((double)p->n_in / 4.0 + 16.0) * ldexp(1.0, -23) * p->mag[idx] + 1e-37;
}
static double tol_default(const problem *p, int64_t idx) {
    return ((double)p->n_in / 16.0 + 16.0) * ldexp(1.0, -23) * p->magq[idx] + 1e-37;
}

/* Quantised activation rows of p for table kt (64-aligned; free() it). */
static void *quantize_all(const dsib_kern_table *kt, const problem *p, size_t *stride) {
    *stride = dsib_kern_act_row_bytes(p->fmt, p->n_in);
    assert_true(*stride > 0);
    void *act = NULL;
    assert_int_equal(posix_memalign(&act, 64, *stride * (size_t)p->n_tok), 0);
    kt->act_quantize(p->fmt, p->x, p->xs, p->n_in, p->n_tok, act, *stride);
    return act;
}

/* y rows [o0, o1) of tokens [t0, t0 + n) through table kt on `path` (single-threaded). */
static void run_rows(const dsib_kern_table *kt, int path, const problem *p, const void *act,
                     size_t as, int64_t o0, int64_t o1, int64_t t0, int64_t n, float *y,
                     int64_t ys) {
    if (path == PATH_EXACT || p->fmt == DSIB_ACT_F32)
        kt->matmul_rows(p->type, p->w, p->rb, p->n_in, o0, o1, p->x + t0 * p->xs, p->xs,
                        y + t0 * ys, ys, n);
    else
        kt->qmatmul_rows(p->type, p->w, p->rb, p->n_in, o0, o1, (const uint8_t *)act + t0 * as,
                         as, y + t0 * ys, ys, n);
}

static void run_types(int32_t isa, int path) {
    const dsib_kern_table *kt = dsib_kern_table_for(isa);
    if (!kt) DSIT_SKIP_TEST("ISA", "ISA path %d not available on this CPU/build", (int)isa);
    static const int64_t n_outs[] = {1, 5, 37};
    static const int64_t n_toks[] = {1, 3, 17};
    int checked = 0;
    double worst = 0, worst_t[N_SHAPES] = {0};
    for (size_t si = 0; si < N_SHAPES; si++) {
        for (int ni = 0; ni < 3; ni++) {
            for (int oi = 0; oi < 3; oi++) {
                for (int ti = 0; ti < 3; ti++) {
                    problem p;
                    problem_make(&p, shapes[si].type, shapes[si].n_in[ni], n_outs[oi],
                                 n_toks[ti]);
                    const int quantised = path == PATH_DEFAULT && p.fmt != DSIB_ACT_F32;
                    size_t as = 0;
                    void *act = quantised ? quantize_all(kt, &p, &as) : NULL;
                    int64_t ys = p.n_out + 2;
                    float *y = malloc(sizeof(float) * (size_t)(ys * p.n_tok));
                    assert_non_null(y);
                    for (int64_t i = 0; i < ys * p.n_tok; i++) y[i] = 777.0f;
                    run_rows(kt, path, &p, act, as, 0, p.n_out, 0, p.n_tok, y, ys);
                    for (int64_t t = 0; t < p.n_tok; t++) {
                        for (int64_t o = 0; o < p.n_out; o++) {
                            const int64_t k = t * p.n_out + o;
                            double got = y[t * ys + o];
                            double want = quantised ? p.refq[k] : p.ref[k];
                            double tol = quantised ? tol_default(&p, k) : tol_exact(&p, k);
                            double mg = quantised ? p.magq[k] : p.mag[k];
                            double err = fabs(got - want);
                            if (!(err <= tol))
                                fail_msg("%s %s type %d n_in %lld n_out %lld n_tok %lld: y[%lld][%lld]"
                                         " = %.9g, want %.9g (err %.3g > tol %.3g)",
                                         kt->name, path_name(path), (int)p.type, (long long)p.n_in,
                                         (long long)p.n_out, (long long)p.n_tok, (long long)t,
                                         (long long)o, got, want, err, tol);
                            if (mg > 0) worst = fmax(worst, err / mg);
                            if (mg > 0) worst_t[si] = fmax(worst_t[si], err / mg);
                            checked++;
                        }
                        /* padding between rows untouched */
                        assert_true(y[t * ys + p.n_out] == 777.0f);
                    }
                    free(y);
                    free(act);
                    problem_free(&p);
                }
            }
        }
    }
    print_message("%s, %s path: %d outputs checked, worst |err| / magnitude = %.3g; per type:", kt->name,
                  path_name(path), checked, worst);
    for (size_t si = 0; si < N_SHAPES; si++) print_message(" %d:%.2g", (int)shapes[si].type, worst_t[si]);
    print_message("\n");
}

/* ---- invariance ------------------------------------------------------------------------- */

static void run_invariance(int32_t isa, int path) {
    const dsib_kern_table *kt = dsib_kern_table_for(isa);
    if (!kt) DSIT_SKIP_TEST("ISA", "ISA path %d not available on this CPU/build", (int)isa);
    for (size_t si = 0; si < N_SHAPES; si++) {
        problem p;
        problem_make(&p, shapes[si].type, shapes[si].n_in[2], 37, 17);
        size_t as = 0;
        void *act = path == PATH_DEFAULT && p.fmt != DSIB_ACT_F32 ? quantize_all(kt, &p, &as) : NULL;
        size_t ny = (size_t)(p.n_out * p.n_tok);
        float *yb = malloc(ny * sizeof(float)), *y1 = malloc(ny * sizeof(float)),
              *yc = malloc(ny * sizeof(float));
        assert_non_null(yb);
        assert_non_null(y1);
        assert_non_null(yc);
        /* batched */
        run_rows(kt, path, &p, act, as, 0, p.n_out, 0, p.n_tok, yb, p.n_out);
        /* token by token (GEMV) */
        for (int64_t t = 0; t < p.n_tok; t++) run_rows(kt, path, &p, act, as, 0, p.n_out, t, 1, y1, p.n_out);
        assert_memory_equal(yb, y1, ny * sizeof(float));
        /* odd row chunks and token groups: rows [0,5) [5,6) [6,37); tokens 0..4, 5..16 */
        int64_t cuts[] = {0, 5, 6, 37};
        for (int c = 0; c < 3; c++) {
            run_rows(kt, path, &p, act, as, cuts[c], cuts[c + 1], 0, 5, yc, p.n_out);
            run_rows(kt, path, &p, act, as, cuts[c], cuts[c + 1], 5, 12, yc, p.n_out);
        }
        assert_memory_equal(yb, yc, ny * sizeof(float));
        free(yb);
        free(y1);
        free(yc);
        free(act);
        problem_free(&p);
    }
}

static int32_t g_isa; /* the --isa of this run */
static void test_types_exact(void **state) { (void)state; run_types(g_isa, PATH_EXACT); }
static void test_types_default(void **state) { (void)state; run_types(g_isa, PATH_DEFAULT); }
static void test_invariance_exact(void **state) { (void)state; run_invariance(g_isa, PATH_EXACT); }
static void test_invariance_default(void **state) { (void)state; run_invariance(g_isa, PATH_DEFAULT); }

/* ---- activation quantisation ---------------------------------------------------------------- */

/* Every ISA's quantiser writes exactly this test's bytes (q in the format's storage order,
 * d, the sums), on rows with zero, tiny, huge, non-finite and tie-valued blocks; and
 * |x - d·q| <= d/2 · (1 + 2^-20) for finite blocks. */
static void test_act_quantize(void **state) {
    (void)state;
    const int64_t n = 1024;
    const int ntok = 3;
    float *x = malloc(sizeof(float) * (size_t)(n * ntok));
    int8_t *q = malloc((size_t)n);
    float *d = malloc(sizeof(float) * (size_t)n);
    assert_true(x && q && d);
    for (int64_t i = 0; i < n * ntok; i++) x[i] = (float)((rndu() * 2 - 1) * ldexp(1, (int)rndi(20) - 10));
    for (int i = 0; i < 32; i++) x[i] = 0.0f;                       /* zero block */
    for (int i = 32; i < 64; i++) x[i] = (float)ldexp(rndu(), -100); /* tiny block */
    x[70] = INFINITY;                                               /* non-finite blocks */
    x[300] = NAN;
    for (int i = 96; i < 128; i++) x[i] = (float)(i - 112) * 0.5f;  /* ties: amax 7.5 → ×127/7.5 */
    x[600] = 1e30f;
    x[n + 5] = -3e-38f;
    static const int32_t fmts[] = {DSIB_ACT_Q8_32, DSIB_ACT_Q8_K, DSIB_ACT_Q8_K_P4, DSIB_ACT_Q8_K_P2};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const int32_t fmt = fmts[fi];
        const int B = fmt == DSIB_ACT_Q8_32 ? 32 : 256;
        const size_t as = dsib_kern_act_row_bytes(fmt, n);
        assert_true(as >= (size_t)n + 4 * (size_t)(n / B) && as % 64 == 0);
        assert_int_equal(dsib_kern_act_row_bytes(fmt, n + B / 2), 0); /* not whole blocks */
        for (int32_t isa = 0; isa < DSIB_ISA_COUNT; isa++) {
            const dsib_kern_table *kt = dsib_kern_table_for(isa);
            if (!kt) continue;
            uint8_t *act = NULL;
            assert_int_equal(posix_memalign((void **)&act, 64, as * ntok), 0);
            kt->act_quantize(fmt, x, n, n, ntok, act, as);
            for (int t = 0; t < ntok; t++) {
                const float *xr = x + (size_t)t * n;
                dsib_qrow v = dsib_kern_act_view(fmt, act + as * t, n);
                ref_quantize(xr, n, B, q, d);
                for (int64_t b = 0; b < n / B; b++) {
                    if (isnan(d[b])) assert_true(isnan(v.d[b]));
                    else if (d[b] != v.d[b])
                        fail_msg("%s fmt %d token %d block %lld: d %.9g, want %.9g", kt->name,
                                 (int)fmt, t, (long long)b, (double)v.d[b], (double)d[b]);
                    for (int p = 0; p < B / 32; p++) {
                        const int g = act_group_at(fmt, p);
                        for (int i = 0; i < 32; i++)
                            if (v.q[b * B + 32 * p + i] != q[b * B + 32 * g + i])
                                fail_msg("%s fmt %d token %d block %lld pos %d: q %d, want %d",
                                         kt->name, (int)fmt, t, (long long)b, p,
                                         v.q[b * B + 32 * p + i], q[b * B + 32 * g + i]);
                    }
                    const int S = B == 32 ? 32 : 16;
                    for (int g = 0; g < B / S; g++) {
                        int sum = 0;
                        for (int i = 0; i < S; i++) sum += q[b * B + g * S + i];
                        assert_int_equal(v.s[b * (B / S) + g], sum);
                    }
                    /* Q8_32 lane corrections -128·Σ of each four, pair scales */
                    assert_true((B == 32) == (v.c != NULL));
                    assert_true((B == 32) == (v.e != NULL));
                    for (int j = 0; B == 32 && j < 8; j++) {
                        const float e = v.e[16 * (b / 2) + 8 * (b % 2) + j];
                        assert_true(isnan(d[b]) ? isnan(e) : e == d[b]);
                        if (b == n / B - 1 && b % 2 == 0) /* past the last block */
                            assert_true(v.e[16 * (b / 2) + 8 + j] == 0.0f);
                    }
                    for (int j = 0; B == 32 && j < 8; j++) {
                        const int8_t *qj = q + b * B + 4 * j;
                        assert_int_equal(v.c[8 * b + j], -128 * (qj[0] + qj[1] + qj[2] + qj[3]));
                    }
                    if (!isfinite(d[b])) continue;
                    for (int i = 0; i < B; i++) {
                        const double e = fabs((double)xr[b * B + i] - (double)d[b] * q[b * B + i]);
                        const double lim = d[b] > 0 ? 0.5 * d[b] * (1 + ldexp(1, -20))
                                                    : ldexp(1, -96);
                        if (!(e <= lim))
                            fail_msg("fmt %d block %lld element %d: |x - dq| %.3g > %.3g", (int)fmt,
                                     (long long)b, i, e, lim);
                    }
                }
            }
            free(act);
        }
    }
    free(x);
    free(q);
    free(d);
}

/* ---- across ISAs -------------------------------------------------------------------------- */

/* The default path gives the same bits on every ISA (its integer sums are exact and its
 * float part is one fixed sequence); the exact path's ISAs agree within their tolerances.
 * Six tokens (tiles of four and two) and nine (eight and one), 16 rows. */
static void test_cross_isa(void **state) {
    (void)state;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    print_message("IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S on AVX-512 VNNI: %s\n",
                  __builtin_cpu_supports("avx512vbmi") ? "the VBMI and the plain variants"
                                                       : "the plain variants (no AVX512_VBMI here)");
    print_message("Q2_K, Q4_K, Q5_K on AVX-512 VNNI: %s\n",
                  __builtin_cpu_supports("avx512vbmi2") ? "the VBMI2 and the plain variants"
                                                        : "the plain variants (no AVX512_VBMI2 here)");
#endif
    const dsib_kern_table *sc = dsib_kern_table_for(DSIB_ISA_SCALAR);
    int others = 0;
    for (int32_t isa = 1; isa < DSIB_ISA_COUNT; isa++) others += dsib_kern_table_for(isa) != NULL;
    if (!others) DSIT_SKIP_TEST("ISA", "no SIMD path on this CPU/build");
    for (size_t si = 0; si < N_SHAPES; si++) {
        for (int nti = 0; nti < 2 * 3; nti++) {
            const int ni = nti % 3, nt = nti < 3 ? 6 : 9, ny = 16 * nt;
            problem p;
            problem_make(&p, shapes[si].type, shapes[si].n_in[ni], 16, nt);
            size_t as = 0;
            void *act = p.fmt != DSIB_ACT_F32 ? quantize_all(sc, &p, &as) : NULL;
            float ys[2][144], yv[144];
            run_rows(sc, PATH_EXACT, &p, act, as, 0, 16, 0, nt, ys[0], 16);
            run_rows(sc, PATH_DEFAULT, &p, act, as, 0, 16, 0, nt, ys[1], 16);
            for (int32_t isa = 1; isa < DSIB_ISA_COUNT; isa++) {
                const dsib_kern_table *kt = dsib_kern_table_for(isa);
                if (!kt) continue;
                run_rows(kt, PATH_EXACT, &p, act, as, 0, 16, 0, nt, yv, 16);
                for (int i = 0; i < ny; i++)
                    assert_true(fabs((double)ys[0][i] - yv[i]) <= 2 * tol_exact(&p, i));
                if (p.fmt == DSIB_ACT_F32) continue;
                void *a2 = quantize_all(kt, &p, &as);
                /* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S on AVX-512 VNNI: the VBMI variant
                 * (where the CPU has it) and the plain one (dsib_kern_iq2_vbmi) */
                const int has_vbmi = p.type == DSI_TYPE_IQ2_XXS || p.type == DSI_TYPE_IQ2_XS ||
                                     p.type == DSI_TYPE_IQ2_S || p.type == DSI_TYPE_IQ3_XXS ||
                                     p.type == DSI_TYPE_IQ3_S;
                /* Q2_K, Q4_K, Q5_K on AVX-512 VNNI: the VBMI2 variant (where the CPU has it)
                 * and the plain one (dsib_kern_kq_vbmi2) */
                const int has_vbmi2 = p.type == DSI_TYPE_Q2_K || p.type == DSI_TYPE_Q4_K ||
                                      p.type == DSI_TYPE_Q5_K;
                const int variants = (has_vbmi || has_vbmi2) && isa >= DSIB_ISA_AVX512VNNI ? 2 : 1;
                for (int v = 0; v < variants; v++) {
                    dsib_kern_iq2_vbmi = dsib_kern_kq_vbmi2 = v == 0;
                    run_rows(kt, PATH_DEFAULT, &p, a2, as, 0, 16, 0, nt, yv, 16);
                    if (memcmp(ys[1], yv, sizeof(float) * (size_t)ny))
                        fail_msg("type %d n_in %lld n_tok %d: default path on %s%s differs from scalar",
                                 (int)p.type, (long long)p.n_in, nt, kt->name,
                                 variants == 2 && v == 1 ? (has_vbmi ? " (no VBMI)" : " (no VBMI2)") : "");
                }
                dsib_kern_iq2_vbmi = dsib_kern_kq_vbmi2 = 1;
                free(a2);
            }
            free(act);
            problem_free(&p);
        }
    }
}

/* The short rows the tile drivers give code of their own (kernels_impl.h
 * DSIB_QTILE_ROWS_BY_N_: 512 and 1024 columns, the models' LoRA ranks and expert widths),
 * and 2048 next to them on the general code, give the scalar path's bits on every ISA, for
 * every default-path type: one token at a time (the AVX2 four-row one-token tiles and the
 * rows left over), and batched (a four-token tile that prefetches, then later tiles that do
 * not), over 23 rows. */
static void test_short_rows(void **state) {
    (void)state;
    const dsib_kern_table *sc = dsib_kern_table_for(DSIB_ISA_SCALAR);
    int others = 0;
    for (int32_t isa = 1; isa < DSIB_ISA_COUNT; isa++) others += dsib_kern_table_for(isa) != NULL;
    if (!others) DSIT_SKIP_TEST("ISA", "no SIMD path on this CPU/build");
    static const int64_t n_ins[] = {512, 1024, 2048};
    enum { NO = 23, NT = 9 };
    int compared = 0;
    for (size_t si = 0; si < N_SHAPES; si++) {
        for (int ni = 0; ni < 3; ni++) {
            problem p;
            problem_make(&p, shapes[si].type, n_ins[ni], NO, NT);
            if (p.fmt == DSIB_ACT_F32) { /* exact-path types: test_cross_isa */
                problem_free(&p);
                continue;
            }
            size_t as = 0;
            void *act = quantize_all(sc, &p, &as);
            float ys[NO * NT], yb[NO * NT], y1[NO * NT];
            run_rows(sc, PATH_DEFAULT, &p, act, as, 0, NO, 0, NT, ys, NO);
            for (int32_t isa = 1; isa < DSIB_ISA_COUNT; isa++) {
                const dsib_kern_table *kt = dsib_kern_table_for(isa);
                if (!kt) continue;
                void *a2 = quantize_all(kt, &p, &as);
                run_rows(kt, PATH_DEFAULT, &p, a2, as, 0, NO, 0, NT, yb, NO);
                for (int64_t t = 0; t < NT; t++) run_rows(kt, PATH_DEFAULT, &p, a2, as, 0, NO, t, 1, y1, NO);
                if (memcmp(ys, yb, sizeof ys) || memcmp(ys, y1, sizeof ys))
                    fail_msg("type %d n_in %lld on %s: %s differs from scalar", (int)p.type,
                             (long long)p.n_in, kt->name,
                             memcmp(ys, yb, sizeof ys) ? "the batched call" : "one token at a time");
                compared++;
                free(a2);
            }
            free(act);
            problem_free(&p);
        }
    }
    assert_true(compared > 0);
}

/* The block-sum tests' checks of one problem on table kt: want (the order in plain C) against
 * the whole call, rows [0,7) [7,300) × tokens [0,2) [2,5) [5,40), and one token per call. */
static void check_blocksum_calls(const dsib_kern_table *kt, const problem *p, const float *want, float *got) {
    const size_t ny = (size_t)(p->n_out * p->n_tok);
    size_t as = 0;
    void *act = quantize_all(kt, p, &as);
    memset(got, 0, sizeof(float) * ny);
    run_rows(kt, PATH_DEFAULT, p, act, as, 0, p->n_out, 0, p->n_tok, got, p->n_out);
    for (int64_t i = 0; i < p->n_out * p->n_tok; i++)
        if (memcmp(&want[i], &got[i], sizeof(float)))
            fail_msg("type %d n_in %lld: %s row %lld token %lld = %.9g, block-sum order %.9g", (int)p->type,
                     (long long)p->n_in, kt->name, (long long)(i % p->n_out), (long long)(i / p->n_out), got[i],
                     want[i]);
    memset(got, 0, sizeof(float) * ny);
    const int64_t rc[] = {0, 7, 300}, tc[] = {0, 2, 5, 40};
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++)
            run_rows(kt, PATH_DEFAULT, p, act, as, rc[r], rc[r + 1], tc[c], tc[c + 1] - tc[c], got, p->n_out);
    assert_memory_equal(want, got, sizeof(float) * ny);
    memset(got, 0, sizeof(float) * ny);
    for (int64_t t = 0; t < p->n_tok; t++) run_rows(kt, PATH_DEFAULT, p, act, as, 0, p->n_out, t, 1, got, p->n_out);
    assert_memory_equal(want, got, sizeof(float) * ny);
    free(act);
}

/* Q8_0's canonical block-sum order (q8_0.c), written here from its definition with this
 * test's own quantiser: acc = 0; per block b in order, I = Σ_{k<32} w·q (exact),
 * s = f16(dw)·d (f32), acc = fmaf(s, (float)I, acc). Every ISA's kernel (scalar, AVX2's
 * eight-row groups, AVX-512's sixteen-row groups and token tiles, AMX's tiles) must give
 * these bits for every row and token, across its row groups, token tiles, block pairs and
 * their tails, whatever the row / token split of the call, and one token at a time. */
/* One output of Q8_0's order (q are the token's quants, d its scales per block). */
static float q8_0_ref_row(const uint8_t *row, int64_t n_in, const int8_t *q, const float *d, int *rounded) {
    (void)rounded;
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        int32_t I = 0;
        for (int k = 0; k < 32; k++) I += (int8_t)blk[2 + k] * q[32 * b + k];
        const float s = (float)dec_f16(rd16(blk)) * d[b];
        acc = fmaf(s, (float)I, acc);
    }
    return acc;
}

typedef float (*blocksum_ref_fn)(const uint8_t *row, int64_t n_in, const int8_t *q, const float *d,
                                 int *rounded);

/* A block-sum order's test over every ISA: 300 rows × 40 tokens of `type` at each of n_ins
 * columns (activation blocks of B), prep (if any) making row 0 × token 0 a case whose
 * conversion to f32 rounds (ref then says so), want from ref, check_blocksum_calls. */
static void run_blocksum(int32_t type, int B, const int64_t *n_ins, int n_n, void (*prep)(problem *),
                         blocksum_ref_fn ref) {
    int checked = 0;
    /* every ISA, and on AVX-512 VNNI both ways the sixteen-row tiles read the rows' scales
     * (dsib_kern_rows16_gather: gathers, loads and a transpose), each with Q8_0's one-token
     * calls on long rows in tiles of sixteen rows and of eight (dsib_kern_q8_rows8) */
    for (int32_t isa = 0; isa < DSIB_ISA_COUNT; isa++)
        for (int g = 0; g < (isa == DSIB_ISA_AVX512VNNI ? 4 : 1); g++) {
            const dsib_kern_table *kt = dsib_kern_table_for(isa);
            if (!kt) continue;
            checked++;
            dsib_kern_rows16_gather = isa == DSIB_ISA_AVX512VNNI ? (g & 1) : -1;
            dsib_kern_q8_rows8 = isa == DSIB_ISA_AVX512VNNI ? (g >> 1) : -1;
            for (int ni = 0; ni < n_n; ni++) {
                problem p;
                problem_make(&p, type, n_ins[ni], 300, 40);
                if (prep) prep(&p);
                int8_t *q = malloc((size_t)p.n_in);
                float *d = malloc(sizeof(float) * (size_t)(p.n_in / B));
                float *want = malloc(sizeof(float) * (size_t)(p.n_out * p.n_tok));
                float *got = malloc(sizeof(float) * (size_t)(p.n_out * p.n_tok));
                assert_true(q && d && want && got);
                int rounded = 0;
                for (int64_t t = 0; t < p.n_tok; t++) {
                    ref_quantize(p.x + t * p.xs, p.n_in, B, q, d);
                    for (int64_t o = 0; o < p.n_out; o++)
                        want[t * p.n_out + o] = ref(p.w + (size_t)o * p.rb, p.n_in, q, d, &rounded);
                }
                if (prep) assert_true(rounded);
                check_blocksum_calls(kt, &p, want, got);
                free(q);
                free(d);
                free(want);
                free(got);
                problem_free(&p);
            }
            dsib_kern_rows16_gather = -1;
            dsib_kern_q8_rows8 = -1;
        }
    assert_true(checked > 0);
}

static void test_q8_0_blocksum(void **state) {
    (void)state;
    /* 2048 and 4224 columns (64 and 132 blocks): one token in tiles of eight rows where
     * dsib_kern_q8_rows8 asks for them (four blocks a step; 300 rows end with four); 2080
     * (65 blocks) stays on the sixteen-row tiles either way */
    static const int64_t n_ins[] = {32, 544, 2048, 2080, 4224};
    run_blocksum(DSI_TYPE_Q8_0, 32, n_ins, 5, NULL, q8_0_ref_row);
}

/* Q4_K's canonical order (q4_k.c), written here in plain C on this test's own quantised
 * activations: per super-block S_b = Σ_j sc_j · I_j and M_b = Σ_j m_j · Σ_{32 of j} q (exact
 * integers), then acc = fmaf(-(dmin·dx), M_b, acc), acc = fmaf(d·dx, S_b, acc). Every ISA
 * (scalar, AVX2's rows one at a time, AVX-512's one-row decode kernel and its sixteen-row
 * token tiles) must give these bits for every row and token, whatever the row / token split
 * of the call, and one token at a time. Row 0 against token 0 is the extreme super-block
 * (every scale and min 63, every code 15, x = 127 but one 126): S_b is odd and above 2^24, so
 * its conversion to f32 rounds. */
static int32_t q4k_ref_scale(const uint8_t *sc, int j, int min) {
    if (j < 4) return (min ? sc[j + 4] : sc[j]) & 63;
    return min ? (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4) : (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
}

/* Row 0's super-blocks at their extremes, token 0's activation all 127 but one 126. */
static void q4_k_extreme(problem *p) {
    for (int64_t b = 0; b < p->n_in / 256; b++) {
        uint8_t *blk = p->w + 144 * b;
        blk[0] = 0x00, blk[1] = 0x3C; /* d = 1 */
        blk[2] = 0x00, blk[3] = 0x38; /* dmin = 0.5 */
        memset(blk + 4, 0xFF, 140);
    }
    for (int64_t i = 0; i < p->n_in; i++) p->x[i] = 1.0f;
    p->x[5] = 126.0f / 127.0f;
}

static float q4_k_ref_row(const uint8_t *row, int64_t n_in, const int8_t *q, const float *d, int *rounded) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 144 * b, *qs = blk + 16;
        const int8_t *xb = q + 256 * b;
        int32_t S = 0, M = 0;
        for (int j = 0; j < 8; j++) {
            int32_t I = 0, X = 0;
            for (int k = 0; k < 32; k++) {
                const int code = (qs[32 * (j / 2) + k] >> (4 * (j & 1))) & 15;
                I += code * xb[32 * j + k];
                X += xb[32 * j + k];
            }
            S += q4k_ref_scale(blk + 4, j, 0) * I;
            M += q4k_ref_scale(blk + 4, j, 1) * X;
        }
        if ((S > (1 << 24) || S < -(1 << 24)) && (S & 1)) *rounded = 1;
        const float dd = (float)dec_f16(rd16(blk)) * d[b];
        const float dm = (float)dec_f16(rd16(blk + 2)) * d[b];
        acc = fmaf(-dm, (float)M, acc);
        acc = fmaf(dd, (float)S, acc);
    }
    return acc;
}

static void test_q4_k_blocksum(void **state) {
    (void)state;
    /* one-token calls on AVX-512: 1 and 2 super-blocks on the sixteen-row tiles (at most 512
     * columns, simd_avx512.h DSIB_KQ_BS_ROWS_AVX512), 3 and 4 on the four-row tiles (a pair
     * and one, a group of four), 5, 7 and 9 on rows one at a time — the row kernel's groups of
     * four super-blocks, then a pair, then one (q4_k.c Q4_K_ROW_TILE_AVX512) */
    static const int64_t n_ins[] = {256, 512, 768, 1024, 1280, 1792, 2304};
    run_blocksum(DSI_TYPE_Q4_K, 256, n_ins, 7, q4_k_extreme, q4_k_ref_row);
}

/* Q2_K's block-sum order (q2_k.c) in plain C: natural element e = 128h + 32s + l has the code
 * (qs[32h + l] >> 2s) & 3 and sub-block g = e / 16, whose scale / min are the low / high nibble
 * of scales[g]; S_b = Σ_g sc_g · I_g and M_b = Σ_g m_g · Σ_{16 of g} q, then the two steps.
 * (|S_b| < 2^21: no conversion rounds.) */
static float q2_k_ref_row(const uint8_t *row, int64_t n_in, const int8_t *q, const float *d, int *rounded) {
    (void)rounded;
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 84 * b;
        const int8_t *xb = q + 256 * b;
        int32_t S = 0, M = 0;
        for (int g = 0; g < 16; g++) {
            int32_t I = 0, X = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                const int code = (blk[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
                I += code * xb[e];
                X += xb[e];
            }
            S += (blk[g] & 15) * I;
            M += (blk[g] >> 4) * X;
        }
        const float dd = (float)dec_f16(rd16(blk + 80)) * d[b];
        const float dm = (float)dec_f16(rd16(blk + 82)) * d[b];
        acc = fmaf(-dm, (float)M, acc);
        acc = fmaf(dd, (float)S, acc);
    }
    return acc;
}

static void test_q2_k_blocksum(void **state) {
    (void)state;
    static const int64_t n_ins[] = {256, 1280, 2304};
    run_blocksum(DSI_TYPE_Q2_K, 256, n_ins, 3, NULL, q2_k_ref_row);
}

/* dsib_kern_rows16_gather: -1 picks loads on AMD / Hygon cores and gathers elsewhere, and
 * dsib_kern_q8_rows8 eight-row tiles there and sixteen-row ones elsewhere (the
 * vendor read here from /proc/cpuinfo where there is one, else from CPUID leaf 0 — the
 * mapping and the switch are under test, not the hardware's answer), 0 and 1 force either. */
static void test_rows16_gather_default(void **state) {
    (void)state;
    int amd = -1;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (amd < 0 && fgets(line, sizeof line, f))
            if (!strncmp(line, "vendor_id", 9))
                amd = strstr(line, "AuthenticAMD") != NULL || strstr(line, "HygonGenuine") != NULL;
        fclose(f);
    }
#if defined(__x86_64__)
    if (amd < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        char v[13] = {0};
        assert_true(__get_cpuid(0, &a, &b, &c, &d));
        memcpy(v, &b, 4);
        memcpy(v + 4, &d, 4);
        memcpy(v + 8, &c, 4);
        amd = !strcmp(v, "AuthenticAMD") || !strcmp(v, "HygonGenuine");
    }
#else
    if (amd < 0) amd = 0; /* off x86: never AMD's x86 cores */
#endif
    assert_int_equal(dsib_kern_rows16_gather, -1);
    assert_int_equal(dsib_kern_rows16_gather_on(), !amd);
    dsib_kern_rows16_gather = 0;
    assert_int_equal(dsib_kern_rows16_gather_on(), 0);
    dsib_kern_rows16_gather = 1;
    assert_int_equal(dsib_kern_rows16_gather_on(), 1);
    dsib_kern_rows16_gather = -1;
    /* dsib_kern_q8_rows8: -1 picks Q8_0's eight-row one-token tiles on AMD / Hygon only */
    assert_int_equal(dsib_kern_q8_rows8, -1);
    assert_int_equal(dsib_kern_q8_rows8_on(), amd);
    dsib_kern_q8_rows8 = 0;
    assert_int_equal(dsib_kern_q8_rows8_on(), 0);
    dsib_kern_q8_rows8 = 1;
    assert_int_equal(dsib_kern_q8_rows8_on(), 1);
    dsib_kern_q8_rows8 = -1;
}

/* ---- threads, flags ------------------------------------------------------------------------- */

/* dsib_matmul over pools of 1..4 threads equals the process path's single-threaded rows, on
 * both paths; the flag really selects the path (the default path differs from the exact
 * one for the integer-coded types and equals it for the others). */
static void test_threads_invariance(void **state) {
    (void)state;
    const dsib_kern_table *kt = dsib_kern_table_get();
    assert_non_null(kt);
    assert_string_equal(dsib_kern_isa_name(), kt->name);
    print_message("process ISA path: %s\n", kt->name);
    dsib_threadpool *pools[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(dsib_threadpool_create(i + 1, NULL, &pools[i], NULL, 0), DSI_OK);
    for (size_t si = 0; si < N_SHAPES; si++) {
        problem p;
        problem_make(&p, shapes[si].type, shapes[si].n_in[1], 301, 9);
        size_t ny = (size_t)(p.n_out * p.n_tok);
        float *ya[2], *yb = malloc(ny * sizeof(float));
        assert_non_null(yb);
        size_t as = 0;
        void *act = p.fmt != DSIB_ACT_F32 ? quantize_all(kt, &p, &as) : NULL;
        for (int path = 0; path < 2; path++) {
            ya[path] = malloc(ny * sizeof(float));
            assert_non_null(ya[path]);
            run_rows(kt, path, &p, act, as, 0, p.n_out, 0, p.n_tok, ya[path], p.n_out);
            for (int i = 0; i < 4; i++) {
                memset(yb, 0, ny * sizeof(float));
                assert_int_equal(dsib_matmul(pools[i], path_flags(path), p.type, p.w, p.rb, p.n_in,
                                             p.n_out, p.x, p.xs, yb, p.n_out, p.n_tok),
                                 DSI_OK);
                assert_memory_equal(ya[path], yb, ny * sizeof(float));
            }
            /* decode-style: one token at a time through the pool */
            for (int64_t t = 0; t < p.n_tok; t++)
                assert_int_equal(dsib_matmul(pools[1], path_flags(path), p.type, p.w, p.rb, p.n_in,
                                             p.n_out, p.x + t * p.xs, p.xs, yb + t * p.n_out,
                                             p.n_out, 1),
                                 DSI_OK);
            assert_memory_equal(ya[path], yb, ny * sizeof(float));
        }
        if (p.fmt == DSIB_ACT_F32)
            assert_memory_equal(ya[0], ya[1], ny * sizeof(float));
        else
            assert_true(memcmp(ya[0], ya[1], ny * sizeof(float)) != 0);
        free(ya[0]);
        free(ya[1]);
        free(yb);
        free(act);
        problem_free(&p);
    }
    for (int i = 0; i < 4; i++) dsib_threadpool_free(pools[i]);
}

/* MoE gather: every slot equals dsib_matmul_expert of its token alone (both paths), and is
 * within the path's bound of the reference. */
static void test_moe_gather(void **state) {
    (void)state;
    dsib_threadpool *pool;
    assert_int_equal(dsib_threadpool_create(3, NULL, &pool, NULL, 0), DSI_OK);
    const int32_t types[] = {DSI_TYPE_Q4_K, DSI_TYPE_Q8_0, DSI_TYPE_Q2_K, DSI_TYPE_MXFP4,
                             DSI_TYPE_IQ2_XXS, DSI_TYPE_Q6_K, DSI_TYPE_Q5_K, DSI_TYPE_Q3_K,
                             DSI_TYPE_Q4_0, DSI_TYPE_IQ4_NL, DSI_TYPE_IQ4_XS, DSI_TYPE_IQ3_XXS,
                             DSI_TYPE_Q4_1, DSI_TYPE_Q5_0, DSI_TYPE_Q5_1, DSI_TYPE_IQ2_XS,
                             DSI_TYPE_IQ2_S, DSI_TYPE_IQ3_S, DSI_TYPE_IQ1_S,
                             DSI_TYPE_IQ1_M, DSI_TYPE_FP8_E4M3_B32};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (int path = 0; path < 2; path++) {
            const int32_t type = types[ti];
            const int64_t n_in = 512, n_out = 45, n_exp = 5, n_tok = 6;
            problem p; /* reuse for w (n_exp stacked experts) and x */
            problem_make(&p, type, n_in, n_out * n_exp, n_tok);
            size_t estride = p.rb * (size_t)n_out;
            /* routing: token t uses experts (t % 5) and ((t * 2 + 1) % 5); grouped by expert */
            int32_t experts[5];
            int64_t offs[6], xrows[12], yrows[12];
            int64_t ns = 0;
            for (int32_t e = 0; e < n_exp; e++) {
                experts[e] = (e * 3) % 5; /* any order */
                offs[e] = ns;
                for (int64_t t = 0; t < n_tok; t++) {
                    int k = (t % 5 == experts[e]) ? 0 : ((t * 2 + 1) % 5 == experts[e]) ? 1 : -1;
                    if (k < 0) continue;
                    xrows[ns] = t;
                    yrows[ns] = t * 2 + k;
                    ns++;
                }
            }
            offs[n_exp] = ns;
            float *y = calloc((size_t)(n_tok * 2 * n_out), sizeof(float));
            float *yr = calloc((size_t)n_out, sizeof(float));
            assert_non_null(y);
            assert_non_null(yr);
            dsib_moe_matmul m = {type, p.w, estride, p.rb, n_in, n_out, (int32_t)n_exp,
                                 (int32_t)n_exp, experts, offs, xrows, yrows, p.x, p.xs, y, n_out,
                                 path_flags(path)};
            char msg[256];
            assert_int_equal(dsib_matmul_moe(pool, &m, msg, sizeof msg), DSI_OK);
            for (int64_t s = 0; s < ns; s++) {
                int32_t e = -1;
                for (int g = 0; g < n_exp; g++)
                    if (s >= offs[g] && s < offs[g + 1]) e = experts[g];
                assert_int_equal(dsib_matmul_expert(NULL, path_flags(path), type, p.w, estride, e,
                                                    p.rb, n_in, n_out, p.x + xrows[s] * p.xs, p.xs,
                                                    yr, n_out, 1),
                                 DSI_OK);
                assert_memory_equal(yr, y + yrows[s] * n_out, (size_t)n_out * sizeof(float));
                for (int64_t o = 0; o < n_out; o++) {
                    int64_t idx = xrows[s] * p.n_out + e * n_out + o;
                    if (path == PATH_DEFAULT && p.fmt != DSIB_ACT_F32)
                        assert_true(fabs(yr[o] - p.refq[idx]) <= tol_default(&p, idx));
                    else
                        assert_true(fabs(yr[o] - p.ref[idx]) <= tol_exact(&p, idx));
                }
            }
            /* a bad expert id is refused */
            experts[0] = 7;
            assert_int_equal(dsib_matmul_moe(pool, &m, msg, sizeof msg), DSI_ERR_INVALID_ARGUMENT);
            free(y);
            free(yr);
            problem_free(&p);
        }
    }
    dsib_threadpool_free(pool);
}

/* Cross-check with lib/quant: same row sizes, this test's decoders give lib/quant's
 * dequantized values, and every ISA path matches its reference dot on both paths. Weights
 * come from lib/quant's quantizers (real scales / mins, not random bytes). */
static void test_lib_quant_agreement(void **state) {
    (void)state;
    for (size_t si = 0; si < N_SHAPES; si++) {
        const int32_t type = shapes[si].type;
        const int64_t n = shapes[si].n_in[2];
        const dsii_type_traits *tr = dsii_type_get(type);
        assert_non_null(tr);
        if (!tr->quantize_row) continue;
        uint64_t rb = 0;
        assert_true(dsii_type_row_size(type, n, &rb));
        assert_int_equal(rb, dsib_kern_row_bytes(type, n));
        problem p;
        problem_make(&p, type, n, 1, 1); /* x, shapes; the weights are replaced below */
        float *src = malloc(sizeof(float) * (size_t)n), *deq = malloc(sizeof(float) * (size_t)n);
        double *mine = malloc(sizeof(double) * (size_t)n), *mg = malloc(sizeof(double) * (size_t)n);
        double *xq = malloc(sizeof(double) * (size_t)n);
        assert_true(src && deq && mine && mg && xq);
        for (int64_t i = 0; i < n; i++) src[i] = (float)((rndu() * 2 - 1) * (1 + (i % 7)));
        dsii_error e;
        assert_int_equal(dsii_quantize_row(type, src, p.w, n, &e), DSI_OK);
        assert_int_equal(dsii_dequantize_row(type, p.w, deq, n, &e), DSI_OK);
        decode_row_mag(type, p.w, n, mine, mg);
        ref_act(&p, 0, xq);
        double amax = 0, ref = 0, mag = 0, refq = 0, magq = 0;
        for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(mine[i]));
        for (int64_t i = 0; i < n; i++) {
            /* K-quants round d*sc*q - dmin*m once in f32; the rest are exact */
            if (fabs((double)deq[i] - mine[i]) > ldexp(amax, -23))
                fail_msg("type %d element %lld: lib/quant %.9g, test decoder %.9g", (int)type,
                         (long long)i, (double)deq[i], mine[i]);
            ref += mine[i] * p.x[i];
            mag += fabs(mine[i] * p.x[i]);
            refq += mine[i] * xq[i];
            magq += mg[i] * fabs(xq[i]);
        }
        p.ref[0] = ref;
        p.mag[0] = mag;
        p.refq[0] = refq;
        p.magq[0] = magq;
        float lib_dot = 0;
        assert_int_equal(dsii_dot_row(type, p.w, p.x, n, &lib_dot, &e), DSI_OK);
        assert_true(fabs((double)lib_dot - ref) <= tol_exact(&p, 0));
        for (int32_t isa = 0; isa < DSIB_ISA_COUNT; isa++) {
            const dsib_kern_table *kt = dsib_kern_table_for(isa);
            if (!kt) continue;
            for (int path = 0; path < 2; path++) {
                const int quantised = path == PATH_DEFAULT && p.fmt != DSIB_ACT_F32;
                size_t as = 0;
                void *act = quantised ? quantize_all(kt, &p, &as) : NULL;
                float y = 0;
                run_rows(kt, path, &p, act, as, 0, 1, 0, 1, &y, 1);
                const double want = quantised ? refq : ref;
                const double tol = quantised ? tol_default(&p, 0) : tol_exact(&p, 0);
                if (!(fabs((double)y - want) <= tol))
                    fail_msg("type %d isa %s %s: kernel %.9g, reference %.9g", (int)type, kt->name,
                             path_name(path), (double)y, want);
                free(act);
            }
        }
        free(src);
        free(deq);
        free(mine);
        free(mg);
        free(xq);
        problem_free(&p);
    }
}

/* dsib_matmul_batch: each descriptor equals dsib_matmul alone (both paths); descriptors
 * sharing an input share its quantisation; empty ones are skipped; more than 64
 * descriptors run in several rounds. */
static void test_batch(void **state) {
    (void)state;
    dsib_threadpool *pool;
    assert_int_equal(dsib_threadpool_create(3, NULL, &pool, NULL, 0), DSI_OK);
    problem p[N_SHAPES];
    for (size_t i = 0; i < N_SHAPES; i++) problem_make(&p[i], shapes[i].type, shapes[i].n_in[1], 19, 3);
    enum { ND = 70 };
    dsib_matmul_desc d[ND];
    float *yb[ND], *yr[ND];
    char msg[256];
    for (int path = 0; path < 2; path++) {
        for (int i = 0; i < ND; i++) {
            const problem *q = &p[(size_t)i % N_SHAPES];
            int64_t ntok = i % 5 == 4 ? 0 : 1 + i % 3;
            int64_t nout = 1 + (i * 7) % 19;
            d[i] = (dsib_matmul_desc){q->type, q->w, q->rb, q->n_in, nout, q->x, q->xs, NULL, 20, ntok};
            yb[i] = calloc(60, sizeof(float));
            yr[i] = calloc(60, sizeof(float));
            assert_non_null(yb[i]);
            assert_non_null(yr[i]);
            d[i].y = yb[i];
            assert_int_equal(dsib_matmul(NULL, path_flags(path), q->type, q->w, q->rb, q->n_in,
                                         nout, q->x, q->xs, yr[i], 20, ntok),
                             DSI_OK);
        }
        assert_int_equal(dsib_matmul_batch(pool, path_flags(path), d, ND, msg, sizeof msg), DSI_OK);
        for (int i = 0; i < ND; i++) {
            assert_memory_equal(yb[i], yr[i], 60 * sizeof(float));
            free(yb[i]);
            free(yr[i]);
        }
    }
    assert_int_equal(dsib_matmul_batch(pool, 0, NULL, 0, msg, sizeof msg), DSI_OK);
    d[3].type = DSI_TYPE_I32;
    assert_int_equal(dsib_matmul_batch(pool, 0, d, 5, msg, sizeof msg), DSI_ERR_UNSUPPORTED);
    for (size_t i = 0; i < N_SHAPES; i++) problem_free(&p[i]);
    dsib_threadpool_free(pool);
}

static void test_checks(void **state) {
    (void)state;
    char msg[256];
    assert_int_equal(dsib_kern_check(34 /* tq1_0 */, 256, 4, 54, 256, 4, msg, sizeof msg),
                     DSI_ERR_UNSUPPORTED);
    assert_int_equal(dsib_kern_check(DSI_TYPE_Q4_K, 100, 4, 144, 100, 4, msg, sizeof msg),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsib_kern_check(DSI_TYPE_Q4_K, 256, 4, 143, 256, 4, msg, sizeof msg),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsib_kern_check(DSI_TYPE_Q4_K, 256, 4, 144, 255, 4, msg, sizeof msg),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsib_kern_check(DSI_TYPE_Q4_K, 256, 4, 144, 256, 4, msg, sizeof msg), DSI_OK);
    assert_int_equal(dsib_kern_row_bytes(DSI_TYPE_FP8_E4M3_B128, 129), 2 * 129);
    assert_int_equal(dsib_kern_row_bytes(DSI_TYPE_FP8_E4M3_B32, 33), 2 * 33);
    assert_int_equal(dsib_kern_row_bytes(DSI_TYPE_Q2_K, 512), 2 * 84);
    assert_int_equal(dsib_kern_row_bytes(DSI_TYPE_BF16, 3), 6);
    assert_int_equal(dsib_kern_row_bytes(DSI_TYPE_Q8_0, 33), 0);
    assert_int_equal(dsib_kern_block_elems(DSI_TYPE_MXFP4), 32);
    assert_false(dsib_kern_type_supported(DSI_TYPE_I32));
    assert_int_equal(dsib_kern_act_row_bytes(DSIB_ACT_F32, 256), 0);
    assert_int_equal(dsib_kern_act_format(DSI_TYPE_I32, 0), DSIB_ACT_F32);
    float x[4] = {0}, y[4];
    for (int path = 0; path < 2; path++) {
        assert_int_equal(dsib_matmul(NULL, path_flags(path), DSI_TYPE_F32, x, 16, 4, 1, x, 4, y, 1, -1),
                         DSI_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsib_matmul(NULL, path_flags(path), DSI_TYPE_F32, x, 16, 4, 1, x, 4, y, 1, 0),
                         DSI_OK);
        /* n_in = 0: y = 0 */
        y[0] = 5;
        assert_int_equal(dsib_matmul(NULL, path_flags(path), DSI_TYPE_Q8_0, x, 0, 0, 1, x, 0, y, 1, 1),
                         DSI_OK);
        assert_true(y[0] == 0.0f);
    }
}

static int32_t isa_by_name(const char *s) {
    return !strcmp(s, "scalar") ? DSIB_ISA_SCALAR
           : !strcmp(s, "avx2") ? DSIB_ISA_AVX2
           : !strcmp(s, "avx512") ? DSIB_ISA_AVX512
           : !strcmp(s, "avx512vnni") ? DSIB_ISA_AVX512VNNI
           : !strcmp(s, "amx")        ? DSIB_ISA_AMX
                                        : -1;
}

/* No arguments: the tests that span ISAs. "--isa NAME": that path's type and invariance
 * tests on both activation paths, exit 77 (skipped) when this CPU / build cannot run it —
 * so ctest / meson list each missing ISA as skipped. */
int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--isa")) {
        g_isa = isa_by_name(argv[2]);
        if (g_isa < 0) {
            fprintf(stderr, "unknown ISA %s\n", argv[2]);
            return 2;
        }
        if (!dsib_kern_table_for(g_isa))
            return dsit_absent("ISA", "the %s kernels cannot run on this CPU / build", argv[2]);
        const struct CMUnitTest isa_tests[] = {
            cmocka_unit_test(test_types_exact), cmocka_unit_test(test_types_default),
            cmocka_unit_test(test_invariance_exact), cmocka_unit_test(test_invariance_default)};
        return cmocka_run_group_tests(isa_tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_blocks),
        cmocka_unit_test(test_act_quantize),
        cmocka_unit_test(test_lib_quant_agreement),
        cmocka_unit_test(test_checks),
        cmocka_unit_test(test_cross_isa),
        cmocka_unit_test(test_short_rows),
        cmocka_unit_test(test_q8_0_blocksum),
        cmocka_unit_test(test_q4_k_blocksum),
        cmocka_unit_test(test_q2_k_blocksum),
        cmocka_unit_test(test_rows16_gather_default),
        cmocka_unit_test(test_threads_invariance),
        cmocka_unit_test(test_moe_gather),
        cmocka_unit_test(test_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
