/*
 * IQ2_S weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ2_XS's scheme
 * (iq2_xs.c) with a 1024-entry grid and explicit sign bytes:
 *
 * Block (82 bytes, 256 elements; lib/quant/quant_ggml.c dsii_blk_iq2_s): d (f16) at 0;
 * qs[32] at 2 (low 8 bits of the grid index of group k < 32 = elements 8k .. 8k+7); sign
 * bytes at 34 + k (bit j: element 8k + j negative); qh[8] at 66 (bits 2l, 2l+1 of qh[σ] =
 * index bits 8, 9 of group 4σ + l); scale bytes at 74 + σ (ls of the 16-element half h of
 * sub-block σ = nibble h, low first). Element e = 32σ + 8l + j (k = 4σ + l, h = l / 2) is
 *
 *   x_e = d · (2·ls_{σ,h} + 1) / 8 · grid[qs[k] | ((qh[σ] >> 2l) & 3) << 8][j] · (-1 if bit j of signs[k])
 *
 * — ggml's d·(0.5 + ls)·0.25 as an odd integer over 8; the grid bytes (8, 25, 43) are the
 * unsigned operand of dpbusd / maddubs, the sign moves to the activation byte.
 *
 * Canonical order (every ISA, bit-identical): IQ2_XS's (iq2_xs.c): two sets of 16 f32
 * lanes acc[2][16], zero at the start. For each super-block b in order (set u = b mod 2),
 * vector v < 4 = elements 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), in
 * sub-block σ = 2v + j/8, half h = (j mod 8)/4 (scale nibble n = 2σ + h):
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 21844)
 *   S[j]   = Σ_{v<4} (2·ls_n + 1) · I_v[j]                     (exact; |S| < 2^22)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = 0.125f · dsib_reduce32(acc) (the /8, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* Grid row of group k: its index from qs[k] and the two bits of qh. */
static inline uint64_t iq2_s_row(const uint8_t *blk, int k) {
    return dsii_iq2s_grid[blk[2 + k] | ((blk[66 + k / 4] >> (2 * (k % 4))) & 3) << 8];
}

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq2_s_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 82 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8, h = (j % 8) / 4;
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (j % 8) + k, grp = 4 * s + e / 8; /* e within the sub-block */
                    const int g = (int)((iq2_s_row(blk, grp) >> (8 * (e % 8))) & 0xFF);
                    I += ((blk[34 + grp] >> (e % 8)) & 1 ? -g : g) * xq[64 * v + 4 * j + k];
                }
                S[j] += (int32_t)(2 * ((blk[74 + s] >> (4 * h)) & 15) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.125f * dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq2_s_rows_scalar, iq2_s_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s for DSIB_IQ_TILE_AVX2: its four grid rows, its sign bytes as ±1 bytes, its
 * two odd scales (words 0-7: elements 0-15, words 8-15: 16-31). */
DSIB_AI void iq2_s_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *q = blk + 2 + 4 * s;
    const uint32_t h = blk[66 + s];
    const uint64_t *G = dsii_iq2s_grid;
    *g = _mm256_set_epi64x((long long)G[q[3] | (h << 2 & 0x300)], (long long)G[q[2] | (h << 4 & 0x300)],
                           (long long)G[q[1] | (h << 6 & 0x300)], (long long)G[q[0] | (h << 8 & 0x300)]);
    *sg = dsib_iq_signs_avx2(dsib_ld32(blk + 34 + 4 * s));
    *sc = dsib_iq_scales16_avx2(blk[74 + s]);
}

DSIB_IQ_TILE_AVX2(iq2_s_tile_avx2, 82, iq2_s_sub_avx2, 0.125f)

DSIB_QROWS_DEFINE_T(iq2_s_rows_avx2, iq2_s_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* For DSIB_IQ_TILE_AVX512: vector v = groups 8v .. 8v+7 (their high index bits: bits
 * 2i, 2i+1 of the u16 at qh + 2v for group 8v + i), 64 grid bytes from scalar row loads. */
DSIB_AI void iq2_s_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint64_t *G = dsii_iq2s_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *q = blk + 2 + 8 * v;
        const uint32_t h = dsib_ld16(blk + 66 + 2 * v);
        g[v] = _mm512_set_epi64(
            (long long)G[q[7] | (h >> 6 & 0x300)], (long long)G[q[6] | (h >> 4 & 0x300)],
            (long long)G[q[5] | (h >> 2 & 0x300)], (long long)G[q[4] | (h & 0x300)],
            (long long)G[q[3] | (h << 2 & 0x300)], (long long)G[q[2] | (h << 4 & 0x300)],
            (long long)G[q[1] | (h << 6 & 0x300)], (long long)G[q[0] | (h << 8 & 0x300)]);
    }
}

/* The sign bytes as they are: vector v's mask is the qword at 34 + 8v. */
DSIB_AI void iq2_s_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    for (int v = 0; v < 4; v++) ng[v] = _cvtu64_mask64(dsib_ld64(blk + 34 + 8 * v));
    dsib_iq_scales16_avx512(blk + 74, sc);
}

DSIB_IQ_TILE_AVX512(iq2_s_tile_avx512, 82, iq2_s_grid_avx512, iq2_s_signs_avx512, 0.125f)

DSIB_QROWS_DEFINE_R(iq2_s_rows_avx512, iq2_s_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_iq2_s = {
    DSIB_TYPE_IQ2_S, DSIB_ACT_Q8_K, {iq2_s_rows_scalar, iq2_s_rows_avx2, NULL, iq2_s_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_iq2_s = {DSIB_TYPE_IQ2_S, DSIB_ACT_Q8_K, {iq2_s_rows_scalar}};

#endif
