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

#include "quant/ggml_tables.h"

#include <math.h>

static inline uint32_t iq2_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The 32 sign bits of a sub-block (bit 8l + j: element 8l + j negative). */
static inline uint32_t iq3_xxs_signs32(uint32_t w) {
    return (uint32_t)dsii_ksigns_iq2xs[w & 127] | (uint32_t)dsii_ksigns_iq2xs[(w >> 7) & 127] << 8 |
           (uint32_t)dsii_ksigns_iq2xs[(w >> 14) & 127] << 16 |
           (uint32_t)dsii_ksigns_iq2xs[(w >> 21) & 127] << 24;
}

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
                const uint32_t w = iq2_ld32(blk + 66 + 4 * s), sg = iq3_xxs_signs32(w);
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

/* Sub-block at qs / w: its 32 grid bytes (the four-byte rows by scalar loads), its
 * signs as ±1 bytes, its odd scale 2·ls + 1 in every int16. */
DSIB_AI void iq3_xxs_sub_avx2(const uint8_t *qs, uint32_t w, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint32_t *G = dsii_iq3xxs_grid;
    *g = _mm256_set_epi32((int)G[qs[7]], (int)G[qs[6]], (int)G[qs[5]], (int)G[qs[4]], (int)G[qs[3]], (int)G[qs[2]],
                          (int)G[qs[1]], (int)G[qs[0]]);
    /* byte e of the sign mask: bit e % 8 of mask byte e / 8 */
    const __m256i bits = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)iq3_xxs_signs32(w)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                         3, 3, 3, 3, 3, 3));
    const __m256i pat = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    *sg = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, pat), pat), _mm256_set1_epi8(1));
    *sc = _mm256_set1_epi16((short)(2 * (w >> 28) + 1));
}

DSIB_AI void iq3_xxs_tile_avx2(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                               float *out, const int R, const int T, const int PF) {
    __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] = _mm256_setzero_ps();
    const int64_t nb = n_in / 256;
    for (int64_t b2 = 0; b2 < nb; b2 += 2)
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
            const int64_t b = b2 + u;
            if (b >= nb) break;
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = w + (size_t)r * rb + 98 * b;
                DSIB_PF(PF, blk, 98);
                __m256i g[8], sg[8], sc[8];
                for (int s = 0; s < 8; s++)
                    iq3_xxs_sub_avx2(blk + 2 + 8 * s, iq2_ld32(blk + 66 + 4 * s), &g[s], &sg[s], &sc[s]);
                const float d = dsib_f16_hw(blk);
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[t].q + 256 * b;
                    __m256i S[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                    for (int s = 0; s < 8; s++) {
                        const __m256i q = _mm256_loadu_si256((const __m256i *)(xq + 32 * s));
                        const __m256i pr = _mm256_maddubs_epi16(g[s], _mm256_sign_epi8(q, sg[s]));
                        S[s & 1] = _mm256_add_epi32(S[s & 1], _mm256_madd_epi16(pr, sc[s]));
                    }
                    const __m256 dd = _mm256_set1_ps(d * x[t].d[b]);
                    acc[r][t][u][0] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[0]), acc[r][t][u][0]);
                    acc[r][t][u][1] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[1]), acc[r][t][u][1]);
                }
            }
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = 0.25f * dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1],
                                                         acc[r][t][1][0], acc[r][t][1][1]);
}

DSIB_QROWS_DEFINE_T(iq3_xxs_rows_avx2, iq3_xxs_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Super-block decode: vector v = sub-blocks 2v, 2v+1 (their 64 grid bytes: the sixteen
 * four-byte rows by scalar loads — a 16-lane gather measured 3.6 against 5.9 GB/s), its 64
 * sign bits as a mask and the scale pairs, as
 * iq2_xxs.c's plain AVX-512 variant (signs and scales of the eight sub-blocks in one
 * vector). */
DSIB_AI void iq3_xxs_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint32_t *G = dsii_iq3xxs_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *p = blk + 2 + 16 * v;
        g[v] = _mm512_set_epi32((int)G[p[15]], (int)G[p[14]], (int)G[p[13]], (int)G[p[12]], (int)G[p[11]],
                                (int)G[p[10]], (int)G[p[9]], (int)G[p[8]], (int)G[p[7]], (int)G[p[6]], (int)G[p[5]],
                                (int)G[p[4]], (int)G[p[3]], (int)G[p[2]], (int)G[p[1]], (int)G[p[0]]);
    }
}

DSIB_AI void iq3_xxs_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    /* w_s (the 32 bytes at 66) in qword s */
    const __m512i w = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(blk + 66)));
    const __m512i m7 = _mm512_set1_epi64(0x7F);
    __m512i sg = _mm512_or_si512(
        _mm512_or_si512(_mm512_and_si512(w, m7), _mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(w, 7), m7), 8)),
        _mm512_or_si512(_mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(w, 14), m7), 16),
                        _mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(w, 21), m7), 24)));
    __m512i par = _mm512_xor_si512(sg, _mm512_srli_epi64(sg, 4));
    par = _mm512_xor_si512(par, _mm512_srli_epi64(par, 2));
    par = _mm512_xor_si512(par, _mm512_srli_epi64(par, 1));
    sg = _mm512_or_si512(sg, _mm512_slli_epi64(_mm512_and_si512(par, _mm512_set1_epi64(0x01010101)), 7));
    /* vector v: sub-block 2v's four sign bytes in 128-bit lanes 0, 1, 2v+1's in lanes 2, 3;
     * byte e of a lane picks sign byte e / 8 (+ 2 in the lane's second half of 32) */
    const __m512i pick = _mm512_set_epi64(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0,
                                          0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0);
    const __m512i pat = _mm512_set1_epi64((long long)0x8040201008040201ull);
    for (int v = 0; v < 4; v++) {
        const __m512i sel = _mm512_set_epi32(4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 2, 4 * v + 2,
                                             4 * v + 2, 4 * v + 2, 4 * v, 4 * v, 4 * v, 4 * v, 4 * v, 4 * v,
                                             4 * v, 4 * v);
        ng[v] = _mm512_test_epi8_mask(_mm512_shuffle_epi8(_mm512_permutexvar_epi32(sel, sg), pick), pat);
    }
    /* odd scales 2·(w >> 28) + 1 in the even dwords (sub-block s at dword 2s); the pairs
     * (s, s + 2) in one dword: s = 0, 1 → sc[0], s = 4, 5 → sc[1] */
    const __m512i o = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(w, 28), 1), _mm512_set1_epi64(1));
    const __m512i pr = _mm512_or_si512(o, _mm512_slli_epi64(_mm512_alignr_epi32(o, o, 4), 16));
    sc[0] = _mm512_permutexvar_epi32(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), pr);
    sc[1] = _mm512_permutexvar_epi32(_mm512_set_epi32(10, 10, 10, 10, 10, 10, 10, 10, 8, 8, 8, 8, 8, 8, 8, 8), pr);
}

/* One token of super-block b: the exact S lanes (scale pairs as in dsib_kq_token_avx512). */
DSIB_AI __m512i iq3_xxs_token_avx512(const __m512i g[4], const __mmask64 ng[4], const __m512i sc[2],
                                     const int8_t *xq) {
    const __m512i z = _mm512_setzero_si512();
    __m512i I[4];
    for (int v = 0; v < 4; v++) {
        const __m512i q = _mm512_loadu_si512(xq + 64 * v);
        I[v] = _mm512_dpbusd_epi32(z, g[v], _mm512_mask_sub_epi8(q, ng[v], z, q));
    }
    __m512i S = _mm512_dpwssd_epi32(z, _mm512_mask_blend_epi16(0xAAAAAAAAu, I[0], _mm512_slli_epi32(I[1], 16)), sc[0]);
    return _mm512_dpwssd_epi32(S, _mm512_mask_blend_epi16(0xAAAAAAAAu, I[2], _mm512_slli_epi32(I[3], 16)), sc[1]);
}

/* The AVX-512 tile; GRID(blk, g) gives the four grid vectors of the super-block at blk,
 * SIGNS(blk, ng, sc) its sign masks and scale pairs. */
#define IQ3_XXS_TILE_AVX512(NAME, GRID, SIGNS)                                                  \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m512 acc[4][4][2]; /* [row][token][set] */                                       \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();  \
        const int64_t nb = n_in / 256;                                                     \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk = w + (size_t)r * rb + 98 * b;                          \
                DSIB_PF(PF, blk, 98);                                                      \
                __m512i g[4], sc[2];                                                       \
                __mmask64 ng[4];                                                           \
                GRID(blk, g);                                                              \
                SIGNS(blk, ng, sc);                                                        \
                const float d = dsib_f16_hw(blk);                                          \
                for (int t = 0; t < T; t++) {                                              \
                    const __m512i S = iq3_xxs_token_avx512(g, ng, sc, x[t].q + 256 * b);   \
                    acc[r][t][u] = _mm512_fmadd_ps(_mm512_set1_ps(d * x[t].d[b]),          \
                                                   _mm512_cvtepi32_ps(S), acc[r][t][u]);   \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = 0.25f * dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);  \
    }

IQ3_XXS_TILE_AVX512(iq3_xxs_tile_avx512, iq3_xxs_grid_avx512, iq3_xxs_signs_avx512)

DSIB_QROWS_DEFINE_R(iq3_xxs_rows_avx512, iq3_xxs_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_iq3_xxs = {
    DSIB_TYPE_IQ3_XXS, DSIB_ACT_Q8_K, {iq3_xxs_rows_scalar, iq3_xxs_rows_avx2, NULL, iq3_xxs_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_iq3_xxs = {DSIB_TYPE_IQ3_XXS, DSIB_ACT_Q8_K, {iq3_xxs_rows_scalar}};

#endif
