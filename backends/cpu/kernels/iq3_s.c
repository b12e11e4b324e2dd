/*
 * IQ3_S weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ3_XXS's scheme
 * (iq3_xxs.c) with a 512-entry grid, explicit sign bytes and integer scales:
 *
 * Block (110 bytes, 256 elements; lib/quant/quant_ggml.c dsii_blk_iq3_s): d (f16) at 0;
 * qs[64] at 2 (low 8 bits of the grid index of row i < 64 = elements 4i .. 4i+3); qh[8] at
 * 66 (bit i mod 8 of qh[i / 8] = index bit 8 of row i, i.e. bit i of the u64 at 66); sign
 * bytes at 74 (bit e mod 8 of byte e / 8: element e negative, i.e. bit e mod 32 of the u32
 * at 74 + 4σ for sub-block σ = e / 32); scales[4] at 106 (ls_σ = nibble σ mod 2 of
 * scales[σ / 2], low first). Element e = 4i + j is
 *
 *   x_e = d · (2·ls_σ + 1) · grid[qs[i] | bit i of qh << 8][j] · (-1 if sign bit e)
 *
 * — ggml's d·(1 + 2·ls), already an odd integer; the grid bytes (1, 3, … 15) are the
 * unsigned operand of dpbusd / maddubs, the sign moves to the activation byte.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4: grid row 16v + j), which lie
 * in sub-block σ = 2v + j/8:
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 7620)
 *   S[j]   = Σ_{v<4} (2·ls_σ + 1) · I_v[j]                     (exact; |S| < 2^20)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = dsib_reduce32(acc) (nothing left to divide by).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* Grid row i of the super-block at blk. */
static inline uint32_t iq3_s_row(const uint8_t *blk, int i) {
    return dsii_iq3s_grid[blk[2 + i] | ((blk[66 + i / 8] >> (i % 8)) & 1) << 8];
}

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq3_s_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 110 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8;
                const uint32_t g4 = iq3_s_row(blk, 16 * v + j);
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 64 * v + 4 * j + k;
                    const int g = (int)((g4 >> (8 * k)) & 0xFF);
                    I += ((blk[74 + e / 8] >> (e % 8)) & 1 ? -g : g) * xq[e];
                }
                S[j] += (int32_t)(2 * ((blk[106 + s / 2] >> (4 * (s % 2))) & 15) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq3_s_rows_scalar, iq3_s_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s for DSIB_IQ_TILE_AVX2: its eight grid rows, its sign bytes as ±1 bytes, its
 * odd scale in every int16. */
DSIB_AI void iq3_s_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *q = blk + 2 + 8 * s;
    const uint32_t h = blk[66 + s];
    const uint32_t *G = dsii_iq3s_grid;
    *g = _mm256_set_epi32((int)G[q[7] | (h << 1 & 256)], (int)G[q[6] | (h << 2 & 256)],
                          (int)G[q[5] | (h << 3 & 256)], (int)G[q[4] | (h << 4 & 256)],
                          (int)G[q[3] | (h << 5 & 256)], (int)G[q[2] | (h << 6 & 256)],
                          (int)G[q[1] | (h << 7 & 256)], (int)G[q[0] | (h << 8 & 256)]);
    *sg = dsib_iq_signs_avx2(dsib_ld32(blk + 74 + 4 * s));
    *sc = _mm256_set1_epi16((short)(2 * ((blk[106 + s / 2] >> (4 * (s % 2))) & 15) + 1));
}

DSIB_IQ_TILE_AVX2(iq3_s_tile_avx2, 110, iq3_s_sub_avx2, 1.0f)

DSIB_QROWS_DEFINE_T(iq3_s_rows_avx2, iq3_s_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* For DSIB_IQ_TILE_AVX512: vector v = grid rows 16v .. 16v+15 (index bit 8 of row 16v + i:
 * bit i of the u16 at qh + 2v), 64 grid bytes from scalar row loads. */
DSIB_AI void iq3_s_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint32_t *G = dsii_iq3s_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *q = blk + 2 + 16 * v;
        const uint32_t h = dsib_ld16(blk + 66 + 2 * v);
        g[v] = _mm512_set_epi32(
            (int)G[q[15] | (h >> 7 & 256)], (int)G[q[14] | (h >> 6 & 256)], (int)G[q[13] | (h >> 5 & 256)],
            (int)G[q[12] | (h >> 4 & 256)], (int)G[q[11] | (h >> 3 & 256)], (int)G[q[10] | (h >> 2 & 256)],
            (int)G[q[9] | (h >> 1 & 256)], (int)G[q[8] | (h & 256)], (int)G[q[7] | (h << 1 & 256)],
            (int)G[q[6] | (h << 2 & 256)], (int)G[q[5] | (h << 3 & 256)], (int)G[q[4] | (h << 4 & 256)],
            (int)G[q[3] | (h << 5 & 256)], (int)G[q[2] | (h << 6 & 256)], (int)G[q[1] | (h << 7 & 256)],
            (int)G[q[0] | (h << 8 & 256)]);
    }
}

/* The sign bytes as they are (vector v's mask: the qword at 74 + 8v); the odd scales of
 * the eight sub-blocks as the scale pairs of DSIB_IQ_TILE_AVX512 (dword j of sc[0]:
 * sub-blocks (j/8, j/8 + 2), of sc[1]: (j/8 + 4, j/8 + 6)), one pshufb each from the eight
 * scale bytes in every 128-bit lane L (j/8 = L/2). */
DSIB_AI void iq3_s_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    for (int v = 0; v < 4; v++) ng[v] = _cvtu64_mask64(dsib_ld64(blk + 74 + 8 * v));
    const __m128i b = _mm_cvtsi32_si128((int)dsib_ld32(blk + 106)), m = _mm_set1_epi8(15);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    const __m512i o = _mm512_broadcast_i32x4(_mm_or_si128(_mm_add_epi8(n, n), _mm_set1_epi8(1)));
#define IQ3S_SC_(a) (int)(0x80008000u | (a) | ((a) + 2) << 16)
#define IQ3S_SC_L_(a) IQ3S_SC_(a), IQ3S_SC_(a), IQ3S_SC_(a), IQ3S_SC_(a)
    sc[0] = _mm512_shuffle_epi8(o, _mm512_set_epi32(IQ3S_SC_L_(1), IQ3S_SC_L_(1), IQ3S_SC_L_(0), IQ3S_SC_L_(0)));
    sc[1] = _mm512_shuffle_epi8(o, _mm512_set_epi32(IQ3S_SC_L_(5), IQ3S_SC_L_(5), IQ3S_SC_L_(4), IQ3S_SC_L_(4)));
#undef IQ3S_SC_L_
#undef IQ3S_SC_
}

DSIB_IQ_TILE_AVX512(iq3_s_tile_avx512, 110, iq3_s_grid_avx512, iq3_s_signs_avx512, 1.0f)

DSIB_QROWS_DEFINE_R(iq3_s_rows_avx512, iq3_s_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_iq3_s = {
    DSIB_TYPE_IQ3_S, DSIB_ACT_Q8_K, {iq3_s_rows_scalar, iq3_s_rows_avx2, NULL, iq3_s_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_iq3_s = {DSIB_TYPE_IQ3_S, DSIB_ACT_Q8_K, {iq3_s_rows_scalar}};

#endif
