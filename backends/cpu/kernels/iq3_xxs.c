/*
 * IQ3_XXS weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ3_XXS's scheme
 * (iq3_xxs.c) with four-value grid rows:
 *
 * Block (98 bytes, 256 elements; docs/tensor-types.md): d (f16) at 0; qs[64] at 2 (grid
 * indices: element 32s + 4m + i is byte i of iq3xxs_grid[qs[8s + m]]); u32 w_s at 66 + 4s
 * (sign index of group l of 8 = (w >> 7l) & 127, scale ls = w >> 28). The value is
 *
 *   x_e = d · (2·ls + 1) / 4 · grid_e · (-1 if bit e mod 8 of ksigns[(w >> 7l) & 127])
 *
 * — ggml's d·(0.5 + ls)·0.5 as an odd integer over 4; the grid bytes (4 … 62) are the
 * unsigned operand, the sign goes onto the activation byte.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), in sub-block σ = 2v + j/8:
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 31496)
 *   S[j]   = Σ_{v<4} (2·ls_σ + 1) · I_v[j]                     (exact; |S| < 2^22)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = 0.25f · dsib_reduce32(acc) (the /4, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq3_xxs_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 98 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8;
                const uint8_t *qs = blk + 2 + 8 * s;
                const uint32_t w = dsib_ld32(blk + 66 + 4 * s), sg = dsib_iq_signs32(w);
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (j % 8) + k; /* element within the sub-block */
                    const int g = (int)((dsii_iq3xxs_grid[qs[e / 4]] >> (8 * (e % 4))) & 0xFF);
                    I += ((sg >> e) & 1 ? -g : g) * xq[64 * v + 4 * j + k];
                }
                S[j] += (int32_t)(2 * (w >> 28) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.25f * dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq3_xxs_rows_scalar, iq3_xxs_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s of the super-block at blk for DSIB_IQ_TILE_AVX2: its 32 grid bytes (the
 * four-byte rows by scalar loads), its signs as ±1 bytes, its odd scale in every int16. */
DSIB_AI void iq3_xxs_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *qs = blk + 2 + 8 * s;
    const uint32_t w = dsib_ld32(blk + 66 + 4 * s);
    const uint32_t *G = dsii_iq3xxs_grid;
    *g = _mm256_set_epi32((int)G[qs[7]], (int)G[qs[6]], (int)G[qs[5]], (int)G[qs[4]], (int)G[qs[3]], (int)G[qs[2]],
                          (int)G[qs[1]], (int)G[qs[0]]);
    *sg = dsib_iq_signs_avx2(dsib_iq_signs32(w));
    *sc = _mm256_set1_epi16((short)(2 * (w >> 28) + 1));
}

DSIB_IQ_TILE_AVX2(iq3_xxs_tile_avx2, 98, iq3_xxs_sub_avx2, 0.25f)

DSIB_QROWS_DEFINE_T(iq3_xxs_rows_avx2, iq3_xxs_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Super-block decode: vector v = sub-blocks 2v, 2v+1 (their 64 grid bytes: the sixteen
 * four-byte rows by scalar loads — a 16-lane gather measured 3.6 against 5.9 GB/s), for
 * DSIB_IQ_TILE_AVX512 with dsib_iq_signs_avx512. */
DSIB_AI void iq3_xxs_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint32_t *G = dsii_iq3xxs_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *p = blk + 2 + 16 * v;
        g[v] = _mm512_set_epi32((int)G[p[15]], (int)G[p[14]], (int)G[p[13]], (int)G[p[12]], (int)G[p[11]],
                                (int)G[p[10]], (int)G[p[9]], (int)G[p[8]], (int)G[p[7]], (int)G[p[6]], (int)G[p[5]],
                                (int)G[p[4]], (int)G[p[3]], (int)G[p[2]], (int)G[p[1]], (int)G[p[0]]);
    }
}

/* w_s (the 32 bytes at 66) in qword s */
DSIB_AI void iq3_xxs_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    dsib_iq_signs_avx512(_mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(blk + 66))), ng, sc);
}

DSIB_IQ_TILE_AVX512(iq3_xxs_tile_avx512, 98, iq3_xxs_grid_avx512, iq3_xxs_signs_avx512, 0.25f)

DSIB_QROWS_DEFINE_R(iq3_xxs_rows_avx512, iq3_xxs_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_iq3_xxs = {
    DSIB_TYPE_IQ3_XXS, DSIB_ACT_Q8_K, {iq3_xxs_rows_scalar, iq3_xxs_rows_avx2, NULL, iq3_xxs_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_iq3_xxs = {DSIB_TYPE_IQ3_XXS, DSIB_ACT_Q8_K, {iq3_xxs_rows_scalar}};

#endif
