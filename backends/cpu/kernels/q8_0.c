/*
 * Q8_0 weights × DSIB_ACT_Q8_32 activations (default path; kernels.h).
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. Block b (32 elements) with weight scale dw_b (f16) and activation scale dx_b
 * belongs to the pair (step) p = b / 2:
 *
 *   I_b[j] = Σ_{k<4} w[32b + 4j + k] · q[32b + 4j + k]        j < 8 (exact int32)
 *   s_b    = dw_b · dx_b                                       (one f32 rounding)
 *   acc[p mod 2][8·(b mod 2) + j] = fmaf(s_b, (float)I_b[j], acc[p mod 2][8·(b mod 2) + j])
 *
 * in block order, then y = dsib_reduce32(acc). AVX2 holds a set's lanes 0-7 / 8-15 in two
 * ymm (one block each); AVX-512 holds a block pair in one zmm (dpbusd of w + 128 against the signed
 * activations, each lane starting at the activation row's correction -128·Σq).
 *
 * This file is also the template for a new 32-element-block type: decode the weight block
 * to int8 in registers, reuse it for every token of the tile, keep the lanes above.
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float q8_0_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const float s = dsib_ld_f16(blk) * x->d[b];
        const int8_t *wq = (const int8_t *)(blk + 2), *xq = x->q + 32 * b;
        float *a = acc[(b >> 1) & 1] + 8 * (b & 1);
        for (int j = 0; j < 8; j++) {
            int32_t I = 0;
            for (int k = 0; k < 4; k++) I += wq[4 * j + k] * xq[4 * j + k];
            a[j] = fmaf(s, (float)I, a[j]);
        }
    }
    return dsib_reduce32(acc);
}

static void q8_0_rows_scalar(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                             const dsib_qrow *x, float *const *yp, int n) {
    for (int64_t o = o0; o < o1; o++)
        for (int t = 0; t < n; t++) yp[t][o] = q8_0_dot_scalar(w + (size_t)o * rb, n_in, &x[t]);
}

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

DSIB_AI void q8_0_tile_avx2(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                            float *out, const int R, const int T) {
    __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =
                _mm256_setzero_ps();
    const int64_t nb = n_in / 32;
#define Q8_0_BLOCK_AVX2(b, set, h)                                                         \
    do {                                                                                   \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + 34 * (b);                            \
            const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));             \
            const float sw = dsib_f16_hw(blk);                                             \
            for (int t = 0; t < T; t++) {                                                  \
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + 32 * (b))); \
                const __m256 s = _mm256_set1_ps(sw * x[t].d[b]);                           \
                acc[r][t][set][h] = _mm256_fmadd_ps(                                       \
                    s, _mm256_cvtepi32_ps(dsib_dot_s8s8_avx2(wq, xq)), acc[r][t][set][h]); \
            }                                                                              \
        }                                                                                  \
    } while (0)
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        Q8_0_BLOCK_AVX2(b, 0, 0);
        Q8_0_BLOCK_AVX2(b + 1, 0, 1);
        Q8_0_BLOCK_AVX2(b + 2, 1, 0);
        Q8_0_BLOCK_AVX2(b + 3, 1, 1);
    }
    if (b < nb) Q8_0_BLOCK_AVX2(b, 0, 0);
    if (b + 1 < nb) Q8_0_BLOCK_AVX2(b + 1, 0, 1);
    if (b + 2 < nb) Q8_0_BLOCK_AVX2(b + 2, 1, 0);
#undef Q8_0_BLOCK_AVX2
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1], acc[r][t][1][0],
                                                acc[r][t][1][1]);
}

DSIB_QROWS_DEFINE_T(q8_0_rows_avx2, q8_0_tile_avx2, 2, 1)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Block pair p (blocks 2p, 2p+1), or the lone last block when `half`: then the weights,
 * the scales and the activations of lanes 8-15 are zero, their fma adds +0 to acc, which
 * never changes it (acc is never -0). dpbusd multiplies unsigned by signed bytes, so one
 * side is offset by 128 and each lane starts at minus that offset's contribution — the
 * same integers Σ w·q either way:
 *   T = 1 (decode): w + 128 against q, lanes starting at the activation row's -128·Σq;
 *   T > 1 (prefill): q + 128 (once per token) against w, lanes starting at -128·Σw
 *                    (once per row, shared by the tokens). */
DSIB_AI void q8_0_tile_avx512(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                              float *out, const int R, const int T) {
    __m512 acc[4][4][2]; /* [row][token][set] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
    const int64_t nb = n_in / 32;
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
#define Q8_0_PAIR_AVX512(p, half, set)                                                        \
    do {                                                                                   \
        __m512 dx[4];                                                                      \
        __m512i xq[4];                                                                     \
        for (int t = 0; t < T; t++) {                                                      \
            dx[t] = _mm512_loadu_ps(x[t].e + 16 * (p)); /* upper half 0 when half */  \
            xq[t] = half ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, x[t].q + 64 * (p))       \
                         : _mm512_loadu_si512(x[t].q + 64 * (p));                          \
            if (T > 1) xq[t] = _mm512_xor_si512(xq[t], c128);                              \
        }                                                                                  \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + 68 * (p);                            \
            const __m512i wq =                                                             \
                half ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))) \
                     : _mm512_inserti64x4(                                                 \
                           _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))), \
                           _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);           \
            const __m512 sw = half ? _mm512_maskz_mov_ps(0x00FF, dsib_pair_f16(blk, blk))     \
                                   : dsib_pair_f16(blk, blk + 34);                        \
            if (T == 1) {                                                                  \
                const __m512i I = _mm512_dpbusd_epi32(                                     \
                    half ? _mm512_maskz_loadu_epi32(0x00FF, x[0].c + 16 * (p))             \
                         : _mm512_loadu_si512(x[0].c + 16 * (p)),                          \
                    _mm512_xor_si512(wq, c128), xq[0]);                                    \
                acc[r][0][set] = _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[0]),                 \
                                                 _mm512_cvtepi32_ps(I), acc[r][0][set]);   \
            } else {                                                                       \
                const __m512i neg = _mm512_sub_epi32(                                      \
                    _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, wq)); \
                for (int t = 0; t < T; t++) {                                              \
                    const __m512i I = _mm512_dpbusd_epi32(neg, xq[t], wq);                 \
                    acc[r][t][set] = _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[t]),             \
                                                     _mm512_cvtepi32_ps(I), acc[r][t][set]); \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    } while (0)
    int64_t p = 0;
    for (; 2 * p + 4 <= nb; p += 2) {
        Q8_0_PAIR_AVX512(p, 0, 0);
        Q8_0_PAIR_AVX512(p + 1, 0, 1);
    }
    if (2 * p + 2 <= nb) { /* p even: set 0 */
        Q8_0_PAIR_AVX512(p, 0, 0);
        p++;
    }
    if (2 * p < nb) {
        if (p & 1)
            Q8_0_PAIR_AVX512(p, 1, 1);
        else
            Q8_0_PAIR_AVX512(p, 1, 0);
    }
#undef Q8_0_PAIR_AVX512
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);
}

DSIB_QROWS_DEFINE(q8_0_rows_avx512, q8_0_tile_avx512)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q8_0 = {
    DSI_TYPE_Q8_0, DSIB_ACT_Q8_32, {q8_0_rows_scalar, q8_0_rows_avx2, NULL, q8_0_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q8_0 = {DSI_TYPE_Q8_0, DSIB_ACT_Q8_32, {q8_0_rows_scalar}};

#endif
