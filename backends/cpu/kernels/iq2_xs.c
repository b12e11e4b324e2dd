/*
 * IQ2_XS weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ2_XXS's scheme
 * (iq2_xxs.c) with a 512-entry grid and a scale per 16 elements:
 *
 * Block (74 bytes, 256 elements; lib/quant/quant_ggml.c dsii_blk_iq2_xs): d (f16) at 0;
 * u16 q_k at 2 + 2k for the group k < 32 of eight elements 8k .. 8k+7 (grid index q & 511,
 * sign index q >> 9); scale bytes at 66 + σ (sub-block σ of 32: ls of its 16-element half
 * h = nibble h, low first). Element e = 32σ + 8l + j (k = 4σ + l, h = l / 2) is
 *
 *   x_e = d · (2·ls_{σ,h} + 1) / 8 · grid[q_k & 511][j] · (-1 if bit j of ksigns[q_k >> 9])
 *
 * — ggml's d·(0.5 + ls)·0.25 as an odd integer over 8; the grid bytes (8, 25, 43) are the
 * unsigned operand of dpbusd / maddubs, the sign moves to the activation byte.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), which lie in sub-block
 * σ = 2v + j/8 and its half h = (j mod 8)/4 (scale nibble n = 2σ + h):
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 21844)
 *   S[j]   = Σ_{v<4} (2·ls_n + 1) · I_v[j]                     (exact; |S| < 2^22)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = 0.125f · dsib_reduce32(acc) (the /8, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* The eight sign bits of group k (bit j: element 8k + j negative). */
static inline uint32_t iq2_xs_signs8(uint16_t q) { return dsii_ksigns_iq2xs[q >> 9]; }

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq2_xs_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 74 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8, h = (j % 8) / 4;
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (j % 8) + k; /* element within the sub-block */
                    const uint16_t q = dsib_ld16(blk + 2 + 2 * (4 * s + e / 8));
                    const int g = (int)((dsii_iq2xs_grid[q & 511] >> (8 * (e % 8))) & 0xFF);
                    I += ((iq2_xs_signs8(q) >> (e % 8)) & 1 ? -g : g) * xq[64 * v + 4 * j + k];
                }
                S[j] += (int32_t)(2 * ((blk[66 + s] >> (4 * h)) & 15) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.125f * dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq2_xs_rows_scalar, iq2_xs_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s for DSIB_IQ_TILE_AVX2: its four grid rows, its signs as ±1 bytes, its two
 * odd scales (words 0-7: elements 0-15, words 8-15: 16-31). */
DSIB_AI void iq2_xs_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *p = blk + 2 + 8 * s;
    const uint16_t q0 = dsib_ld16(p), q1 = dsib_ld16(p + 2), q2 = dsib_ld16(p + 4), q3 = dsib_ld16(p + 6);
    const uint64_t *G = dsii_iq2xs_grid;
    *g = _mm256_set_epi64x((long long)G[q3 & 511], (long long)G[q2 & 511], (long long)G[q1 & 511],
                           (long long)G[q0 & 511]);
    *sg = dsib_iq_signs_avx2(iq2_xs_signs8(q0) | iq2_xs_signs8(q1) << 8 | iq2_xs_signs8(q2) << 16 |
                             iq2_xs_signs8(q3) << 24);
    *sc = dsib_iq_scales16_avx2(blk[66 + s]);
}

DSIB_IQ_TILE_AVX2(iq2_xs_tile_avx2, 74, iq2_xs_sub_avx2, 0.125f)

DSIB_QROWS_DEFINE_T(iq2_xs_rows_avx2, iq2_xs_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* For DSIB_IQ_TILE_AVX512: vector v = groups 8v .. 8v+7, their 64 grid bytes from scalar
 * row loads. */
DSIB_AI void iq2_xs_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint64_t *G = dsii_iq2xs_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *p = blk + 2 + 16 * v;
        g[v] = _mm512_set_epi64((long long)G[dsib_ld16(p + 14) & 511], (long long)G[dsib_ld16(p + 12) & 511],
                                (long long)G[dsib_ld16(p + 10) & 511], (long long)G[dsib_ld16(p + 8) & 511],
                                (long long)G[dsib_ld16(p + 6) & 511], (long long)G[dsib_ld16(p + 4) & 511],
                                (long long)G[dsib_ld16(p + 2) & 511], (long long)G[dsib_ld16(p) & 511]);
    }
}

/* The signs of the 32 groups: each 7-bit sign index (q >> 9) and its parity in bit 7
 * (ksigns's rule) computed in the 32 words, narrowed to bytes (byte k = group k), so
 * vector v's mask is qword v; the scales by dsib_iq_scales16_avx512. */
DSIB_AI void iq2_xs_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    const __m512i i7 = _mm512_srli_epi16(_mm512_loadu_si512(blk + 2), 9);
    __m512i par = _mm512_xor_si512(i7, _mm512_srli_epi16(i7, 4));
    par = _mm512_xor_si512(par, _mm512_srli_epi16(par, 2));
    par = _mm512_xor_si512(par, _mm512_srli_epi16(par, 1));
    const __m256i m = _mm512_cvtepi16_epi8(
        _mm512_or_si512(i7, _mm512_slli_epi16(_mm512_and_si512(par, _mm512_set1_epi16(1)), 7)));
    ng[0] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(_mm256_castsi256_si128(m)));
    ng[1] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(_mm256_castsi256_si128(m), 1));
    ng[2] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(_mm256_extracti128_si256(m, 1)));
    ng[3] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(_mm256_extracti128_si256(m, 1), 1));
    dsib_iq_scales16_avx512(blk + 66, sc);
}

DSIB_IQ_TILE_AVX512(iq2_xs_tile_avx512, 74, iq2_xs_grid_avx512, iq2_xs_signs_avx512, 0.125f)

DSIB_QROWS_DEFINE_R(iq2_xs_rows_avx512, iq2_xs_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_iq2_xs = {
    DSIB_TYPE_IQ2_XS, DSIB_ACT_Q8_K, {iq2_xs_rows_scalar, iq2_xs_rows_avx2, NULL, iq2_xs_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_iq2_xs = {DSIB_TYPE_IQ2_XS, DSIB_ACT_Q8_K, {iq2_xs_rows_scalar}};

#endif
