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
        dsib_q8_32_step_scalar(acc, b, s, wq, xq);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q8_0_rows_scalar, q8_0_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

#define Q8_0_WBLK(blk) _mm256_loadu_si256((const __m256i *)((blk) + 2))
#define Q8_0_SBLK(blk) dsib_f16_hw(blk)
DSIB_Q8_32_TILE_AVX2(q8_0_tile_avx2, 34, Q8_0_WBLK, Q8_0_SBLK)

DSIB_QROWS_DEFINE_T(q8_0_rows_avx2, q8_0_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* The weights of a block pair (the second block's zero when half), + 128 when u. */
DSIB_AI __m512i q8_0_pair_avx512(const uint8_t *blk, int half, int u) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m512i v = half ? _mm512_zextsi256_si512(a)
                           : _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                                _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
    return u ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v;
}
#define Q8_0_WPAIR(blk, half, u) q8_0_pair_avx512(blk, half, u)
#define Q8_0_SPAIR(blk, half)                                                              \
    ((half) ? _mm512_maskz_mov_ps(0x00FF, dsib_pair_f16(blk, blk)) : dsib_pair_f16(blk, (blk) + 34))
DSIB_Q8_32_TILE_AVX512(q8_0_tile_avx512, 34, Q8_0_WPAIR, Q8_0_SPAIR)

DSIB_QROWS_DEFINE(q8_0_rows_avx512, q8_0_tile_avx512)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q8_0 = {
    DSI_TYPE_Q8_0, DSIB_ACT_Q8_32, {q8_0_rows_scalar, q8_0_rows_avx2, NULL, q8_0_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q8_0 = {DSI_TYPE_Q8_0, DSIB_ACT_Q8_32, {q8_0_rows_scalar}};

#endif
