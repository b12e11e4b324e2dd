/*
 * IQ1_S and IQ1_M weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ2_XXS's
 * scheme (iq2_xxs.c) with the 1.6-bit grid: each value times 8 is a small odd integer.
 *
 * Blocks (256 elements; docs/tensor-types.md, lib/quant/quant_ggml.c). Group k < 32 = the
 * eight elements 8k .. 8k+7 = one row of dsii_iq1s_grid (bytes -1, 0, +1) with an 11-bit
 * index; every value is  x_e = d · (2·ls + 1) · (grid_e + s_e / 8),  s_e = ±1 the sign of
 * ggml's delta ±0.125 of the element's group:
 *
 *   IQ1_S (50 bytes): d (f16) at 0; qs[32] at 2 (index low bytes, group k at 2 + k); u16
 *     qh_σ at 34 + 2σ per sub-block σ of 32 (groups 4σ + l): index bits 8..10 of group l at
 *     bits 3l .. 3l+2, ls at bits 12..14, s = -1 if bit 15;
 *   IQ1_M (56 bytes): qs[32] at 0; qh[16] at 32 (nibble k of these 128 bits — byte k/2,
 *     low nibble for even k — is group k's: index bits 8..10 in its bits 0..2, s = -1 if
 *     bit 3); u16 sc_i at 48 + 2i (i < 4): the 3-bit ls of the 16-element half h < 16 at
 *     bits 3(h mod 4) of sc_{h/4}, and d (f16) = the top nibbles of sc_0 .. sc_3 (sc_i's
 *     bits 12..15 are d's bits 4i .. 4i+3).
 *
 * So with w_e = 8·grid_e + s_e ∈ {±1, ±7, ±9} every product below is an integer: |w_e| is
 * the unsigned operand of dpbusd / maddubs and the sign of w_e moves to the activation byte
 * (as IQ2_XXS's grid signs). (Σ w·q is also 8·Σ (grid + 1)·q + (s - 8)·Σ q with grid + 1
 * ∈ {0, 1, 2} unsigned — the same integers — but that needs sums of q per 8 or 32 that the
 * Q8_K rows do not carry, and each lane sum here holds only its own elements' products.)
 * The SIMD paths get w_e from the grid bytes by one pshufb of (grid & 3) | (4 if s = -1),
 * and compute the 11-bit grid indices in vectors one super-block ahead (IQ1_TILE_AVX512).
 *
 * Canonical order (both types, every ISA, bit-identical): two sets of 16 f32 lanes
 * acc[2][16], zero at the start. For each super-block b in order (set u = b mod 2), vector
 * v < 4 = elements 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4):
 *
 *   I_v[j] = Σ_{k<4} w_e · q_e                                 (exact; |I| <= 4572)
 *   S[j]   = Σ_{v<4} (2·ls + 1) · I_v[j]                       (exact; |S| < 2^19)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * with ls the scale of the lane's elements (IQ1_S: sub-block σ = 2v + j/8; IQ1_M: half
 * h = 4v + j/4) and d the f16 as f32 (exact; IQ1_M's assembled from the nibbles), then
 * y = 0.125f · dsib_reduce32(acc) (the /8, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

static inline unsigned iq1_ld16(const uint8_t *p) { return (unsigned)(p[0] | (p[1] << 8)); }

/* IQ1_M's d: the top nibbles of the four scale words at 48 */
static inline uint16_t iq1_m_dh(const uint8_t *blk) {
    uint64_t u;
    memcpy(&u, blk + 48, 8);
    return (uint16_t)(((u >> 12) & 0xF) | ((u >> 24) & 0xF0) | ((u >> 36) & 0xF00) | ((u >> 48) & 0xF000));
}

/* ---- scalar (the definition) --------------------------------------------------------- */

/* A super-block's w_e = 8·grid_e + s_e and the odd scale 2·ls + 1 of each four-element
 * lane L = e / 4 (= 16v + j). */
static float iq1_s_decode(const uint8_t *blk, int8_t w[256], int32_t c[64]) {
    for (int s = 0; s < 8; s++) {
        const unsigned qh = iq1_ld16(blk + 34 + 2 * s);
        const int sg = qh & 0x8000 ? -1 : 1;
        for (int l = 0; l < 4; l++) {
            const uint64_t g = dsii_iq1s_grid[blk[2 + 4 * s + l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; j++) w[32 * s + 8 * l + j] = (int8_t)(8 * (int8_t)(g >> (8 * j)) + sg);
        }
        for (int L = 0; L < 8; L++) c[8 * s + L] = (int32_t)(2 * ((qh >> 12) & 7) + 1);
    }
    return dsib_ld_f16(blk);
}

static float iq1_m_decode(const uint8_t *blk, int8_t w[256], int32_t c[64]) {
    for (int k = 0; k < 32; k++) {
        const unsigned h = (blk[32 + k / 2] >> (4 * (k & 1))) & 0xF;
        const uint64_t g = dsii_iq1s_grid[blk[k] | ((h & 7) << 8)];
        for (int j = 0; j < 8; j++) w[8 * k + j] = (int8_t)(8 * (int8_t)(g >> (8 * j)) + (h & 8 ? -1 : 1));
    }
    for (int h = 0; h < 16; h++) {
        const unsigned sc = iq1_ld16(blk + 48 + 2 * (h / 4));
        for (int L = 0; L < 4; L++) c[4 * h + L] = (int32_t)(2 * ((sc >> (3 * (h % 4))) & 7) + 1);
    }
    return dsib_f16_to_f32(iq1_m_dh(blk));
}

typedef float (*iq1_decode_fn)(const uint8_t *blk, int8_t w[256], int32_t c[64]);

static float iq1_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x, size_t bytes,
                            iq1_decode_fn decode) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        int8_t w[256];
        int32_t c[64];
        const float d = decode(row + bytes * (size_t)b, w, c);
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                int32_t I = 0;
                for (int k = 0; k < 4; k++) I += w[64 * v + 4 * j + k] * xq[64 * v + 4 * j + k];
                S[j] += c[16 * v + j] * I;
            }
        const float dd = d * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.125f * dsib_reduce32(acc);
}

static float iq1_s_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    return iq1_dot_scalar(row, n_in, x, 50, iq1_s_decode);
}
static float iq1_m_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    return iq1_dot_scalar(row, n_in, x, 56, iq1_m_decode);
}

DSIB_QROWS_SCALAR(iq1_s_rows_scalar, iq1_s_dot_scalar)
DSIB_QROWS_SCALAR(iq1_m_rows_scalar, iq1_m_dot_scalar)

#ifdef DSIB_KERN_X86

/* w_e by index (grid & 3) | (4 if s = -1): grid 0, 1, -1 at 0, 1, 3 */
#define IQ1_W_LUT 1, 9, 0, -7, -1, 7, 0, -9, 0, 0, 0, 0, 0, 0, 0, 0

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* The w_e of four grid rows (raw: their bytes -1 / 0 / 1) with n: 4 in the bytes of groups
 * with s = -1, else 0. */
DSIB_AI __m256i iq1_w_avx2(__m256i raw, __m256i n) {
    const __m256i lut = _mm256_setr_epi8(IQ1_W_LUT, IQ1_W_LUT);
    return _mm256_shuffle_epi8(lut, _mm256_or_si256(_mm256_and_si256(raw, _mm256_set1_epi8(3)), n));
}

/* The 32 grid indices of a super-block (word k: group k) into ix: the index bits 8..10 put
 * in place by 16-bit multiplies (x·2^n mod 2^16 is x << n, the high half of x·2^15 is
 * x >> 1). IQ1_S: group k's are bits 3(k mod 4) of qh_{k/4}; IQ1_M: nibble k of qh. */
DSIB_AI void iq1_s_idx_avx2(const uint8_t *blk, uint16_t *ix) {
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 34)));
    const __m256i mul = _mm256_setr_epi16(256, 32, 4, -32768, 256, 32, 4, -32768, 256, 32, 4, -32768, 256, 32, 4,
                                          -32768);
    for (int h = 0; h < 2; h++) { /* groups 16h .. 16h+15: qh words 4h .. 4h+3 */
        const __m256i w = _mm256_shuffle_epi8(
            qh, _mm256_add_epi8(_mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4,
                                                 5, 6, 7, 6, 7, 6, 7, 6, 7),
                                _mm256_set1_epi8((char)(8 * h))));
        const __m256i hi = _mm256_blend_epi16(_mm256_mullo_epi16(w, mul), _mm256_mulhi_epu16(w, mul), 0x88);
        const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * h)));
        _mm256_store_si256((__m256i *)(ix + 16 * h),
                           _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi16(0x700))));
    }
}

DSIB_AI void iq1_m_idx_avx2(const uint8_t *blk, uint16_t *ix) {
    const __m256i qh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 32)));
    const __m256i mul = _mm256_setr_epi16(256, 16, 256, 16, 256, 16, 256, 16, 256, 16, 256, 16, 256, 16, 256, 16);
    for (int h = 0; h < 2; h++) { /* groups 16h .. 16h+15: qh bytes 8h .. 8h+7, byte k/2 in word k */
        const __m256i w = _mm256_shuffle_epi8(
            qh, _mm256_add_epi8(_mm256_setr_epi8(0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3, -128,
                                                 4, -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7, -128),
                                _mm256_set1_epi16((short)(8 * h))));
        const __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
        _mm256_store_si256((__m256i *)(ix + 16 * h),
                           _mm256_or_si256(lo, _mm256_and_si256(_mm256_mullo_epi16(w, mul), _mm256_set1_epi16(0x700))));
    }
}

/* Sub-block s (groups 4s .. 4s+3) for IQ1_TILE_AVX2: |w| as the unsigned bytes, w itself
 * for vpsignb on the activations (never 0), the odd scales in the int16 words (words 0-7:
 * elements 0-15, 8-15: elements 16-31). */
DSIB_AI void iq1_s_sub_avx2(const uint8_t *blk, const uint16_t *ix, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint16_t *p = ix + 4 * s;
    const unsigned qh = iq1_ld16(blk + 34 + 2 * s);
    const uint64_t *G = dsii_iq1s_grid;
    const __m256i raw = _mm256_set_epi64x((long long)G[p[3]], (long long)G[p[2]], (long long)G[p[1]], (long long)G[p[0]]);
    const __m256i w = iq1_w_avx2(raw, _mm256_set1_epi8((char)((qh >> 13) & 4)));
    *g = _mm256_abs_epi8(w);
    *sg = w;
    *sc = _mm256_set1_epi16((short)(((qh >> 11) & 0xE) | 1));
}

DSIB_AI void iq1_m_sub_avx2(const uint8_t *blk, const uint16_t *ix, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint16_t *p = ix + 4 * s;
    const unsigned h = iq1_ld16(blk + 32 + 2 * s); /* nibble l: group 4s + l */
    const uint64_t *G = dsii_iq1s_grid;
    const __m256i raw = _mm256_set_epi64x((long long)G[p[3]], (long long)G[p[2]], (long long)G[p[1]], (long long)G[p[0]]);
    /* group l's s bit: bit 3 (even l) / 7 (odd l) of byte l / 2 of h */
    const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi16((short)h),
                                           _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1,
                                                            1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m256i bit = _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128, 8, 8,
                                         8, 8, 8, 8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128);
    const __m256i n = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), _mm256_set1_epi8(4));
    const __m256i w = iq1_w_avx2(raw, n);
    *g = _mm256_abs_epi8(w);
    *sg = w;
    const unsigned scw = iq1_ld16(blk + 48 + 2 * (s / 2)) >> (6 * (s & 1));
    *sc = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)(2 * (scw & 7) + 1))),
                                  _mm_set1_epi16((short)(2 * ((scw >> 3) & 7) + 1)), 1);
}

DSIB_AI float iq1_s_d_hw(const uint8_t *blk) { return dsib_f16_hw(blk); }
DSIB_AI float iq1_m_d_hw(const uint8_t *blk) { return _cvtsh_ss(iq1_m_dh(blk)); }

/* DSIB_IQ_TILE_AVX2 with the scale d from DF(blk) (IQ1_M's is not at byte 0) and the grid
 * indices of each row's next super-block computed one step ahead (IQ1_TILE_AVX512). */
#define IQ1_TILE_AVX2(NAME, BLK, IDX, SUB, DF)                                             \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */                  \
        uint16_t ixb[4][2][32] __attribute__((aligned(32)));                               \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =    \
                    _mm256_setzero_ps();                                                   \
        const int64_t nb = n_in / 256;                                                     \
        for (int r = 0; r < R && nb > 0; r++) IDX(w + (size_t)r * rb, ixb[r][0]);          \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk = w + (size_t)r * rb + (BLK) * b;                       \
                DSIB_PF(PF, blk, BLK);                                                     \
                __m256i g[8], sg[8], sc[8];                                                \
                if (b + 1 < nb) IDX(blk + (BLK), ixb[r][u ^ 1]);                           \
                __asm__("" : "+m"(ixb));                                                   \
                for (int s = 0; s < 8; s++) SUB(blk, ixb[r][u], s, &g[s], &sg[s], &sc[s]); \
                const float d = DF(blk);                                                   \
                for (int t = 0; t < T; t++) {                                              \
                    const int8_t *xq = x[t].q + 256 * b;                                   \
                    __m256i S[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};       \
                    for (int s = 0; s < 8; s++) {                                          \
                        const __m256i q = _mm256_loadu_si256((const __m256i *)(xq + 32 * s)); \
                        const __m256i pr = _mm256_maddubs_epi16(g[s], _mm256_sign_epi8(q, sg[s])); \
                        S[s & 1] = _mm256_add_epi32(S[s & 1], _mm256_madd_epi16(pr, sc[s])); \
                    }                                                                      \
                    const __m256 dd = _mm256_set1_ps(d * x[t].d[b]);                       \
                    acc[r][t][u][0] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[0]), acc[r][t][u][0]); \
                    acc[r][t][u][1] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[1]), acc[r][t][u][1]); \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = 0.125f * dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1], \
                                                             acc[r][t][1][0], acc[r][t][1][1]); \
    }

IQ1_TILE_AVX2(iq1_s_tile_avx2, 50, iq1_s_idx_avx2, iq1_s_sub_avx2, iq1_s_d_hw)
IQ1_TILE_AVX2(iq1_m_tile_avx2, 56, iq1_m_idx_avx2, iq1_m_sub_avx2, iq1_m_d_hw)

DSIB_QROWS_DEFINE_T(iq1_s_rows_avx2, iq1_s_tile_avx2, 4)
DSIB_QROWS_DEFINE_T(iq1_m_rows_avx2, iq1_m_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Vector v's w_e from its eight grid rows and the mask of its bytes with s = -1: |w| as
 * the unsigned bytes, the mask of w < 0 for the activations. */
DSIB_AI void iq1_w_avx512(__m512i raw, __mmask64 sneg, __m512i *g, __mmask64 *ng) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(IQ1_W_LUT));
    const __m512i i3 = _mm512_and_si512(raw, _mm512_set1_epi8(3));
    const __m512i w = _mm512_shuffle_epi8(lut, _mm512_mask_add_epi8(i3, sneg, i3, _mm512_set1_epi8(4)));
    *g = _mm512_abs_epi8(w);
    *ng = _mm512_movepi8_mask(w);
}

/* Word k < 32: k / 4 (IQ1_S's qh word of group k), 3·(k mod 4) (its index bits), k / 2
 * (IQ1_M's qh byte of group k), 4·(k mod 2) (its nibble). */
static const uint16_t iq1_sel_tab[4][32] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
    {0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9},
    {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15},
    {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4},
};

/* The grid rows of a super-block from its 32 indices stored at ix (vector v = groups
 * 8v .. 8v+7) by scalar loads (an 8-lane qword gather measured slower: 2.8 against 3.2
 * GB/s). */
DSIB_AI void iq1_grid_avx512(const uint16_t *ix, __m512i raw[4]) {
    const uint64_t *G = dsii_iq1s_grid;
    for (int v = 0; v < 4; v++) {
        const uint16_t *p = ix + 8 * v;
        raw[v] = _mm512_set_epi64((long long)G[p[7]], (long long)G[p[6]], (long long)G[p[5]], (long long)G[p[4]],
                                  (long long)G[p[3]], (long long)G[p[2]], (long long)G[p[1]], (long long)G[p[0]]);
    }
}

/* IQ1_S for IQ1_TILE_AVX512: the 32 grid indices of the super-block at blk (word k: group
 * k); its decode from them (vector v = sub-blocks 2v, 2v+1), the odd scales as the scale
 * pairs of dsib_kq_s_avx512 (dword j of sc[0]: sub-blocks j/8, 2 + j/8; of sc[1]:
 * 4 + j/8, 6 + j/8). */
DSIB_AI __m512i iq1_s_idx_avx512(const uint8_t *blk) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)(blk + 34));
    const __m512i *tab = (const __m512i *)(const void *)iq1_sel_tab;
    /* index k = qs[k] | ((qh_{k/4} >> 3(k mod 4)) & 7) << 8 */
    const __m512i hi = _mm512_srlv_epi16(_mm512_permutexvar_epi16(tab[0], _mm512_castsi128_si512(qh)), tab[1]);
    return _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                           _mm512_slli_epi16(_mm512_and_si512(hi, _mm512_set1_epi16(7)), 8));
}

DSIB_AI void iq1_s_dec_avx512(const uint8_t *blk, const uint16_t *ix, __m512i g[4], __mmask64 ng[4],
                              __m512i sc[2]) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)(blk + 34));
    __m512i raw[4];
    iq1_grid_avx512(ix, raw);
    const __m512i bq = _mm512_broadcast_i32x4(qh);
    for (int v = 0; v < 4; v++) {
        /* s bits: bit 7 of qh byte 4v + 1 (sub-block 2v, lanes 0-1) and 4v + 3 (2v+1, lanes 2-3) */
        const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi32((4 * v + 1) * 0x01010101),
                                                _mm256_set1_epi32((4 * v + 3) * 0x01010101), 1);
        iq1_w_avx512(raw[v], _mm512_movepi8_mask(_mm512_shuffle_epi8(bq, pick)), &g[v], &ng[v]);
    }
    const __m128i c = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(0xE)), _mm_set1_epi16(1));
    const __m512i cz = _mm512_castsi128_si512(c);
    sc[0] = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi32(0 | (2 << 16)), _mm256_set1_epi32(1 | (3 << 16)), 1), cz);
    sc[1] = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi32(4 | (6 << 16)), _mm256_set1_epi32(5 | (7 << 16)), 1), cz);
}

/* IQ1_M: vector v = groups 8v .. 8v+7 (qh bytes 4v .. 4v+3); the odd scales of the halves
 * h < 16 as scale pairs (dword j of sc[0]: halves j/4, 4 + j/4; of sc[1]: 8 + j/4, 12 + j/4). */
DSIB_AI __m512i iq1_m_idx_avx512(const uint8_t *blk) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)(blk + 32));
    const __m512i *tab = (const __m512i *)(const void *)iq1_sel_tab;
    /* index k = qs[k] | (nibble k of qh & 7) << 8 */
    const __m512i hi = _mm512_srlv_epi16(
        _mm512_permutexvar_epi16(tab[2], _mm512_castsi256_si512(_mm256_cvtepu8_epi16(qh))), tab[3]);
    return _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)blk)),
                           _mm512_slli_epi16(_mm512_and_si512(hi, _mm512_set1_epi16(7)), 8));
}

DSIB_AI void iq1_m_dec_avx512(const uint8_t *blk, const uint16_t *ix, __m512i g[4], __mmask64 ng[4],
                              __m512i sc[2]) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)(blk + 32));
    __m512i raw[4];
    iq1_grid_avx512(ix, raw);
    const __m512i bq = _mm512_broadcast_i32x4(qh);
    /* group i of a vector: bit 3 (even i) / 7 (odd i) of its qh byte */
    const __m512i pat = _mm512_set_epi64((long long)0x8080808080808080ull, 0x0808080808080808ll,
                                         (long long)0x8080808080808080ull, 0x0808080808080808ll,
                                         (long long)0x8080808080808080ull, 0x0808080808080808ll,
                                         (long long)0x8080808080808080ull, 0x0808080808080808ll);
    for (int v = 0; v < 4; v++) {
        /* 128-bit lane L (groups 2L, 2L + 1): qh byte 4v + L */
        const __m512i pick = _mm512_set_epi32(
            (4 * v + 3) * 0x01010101, (4 * v + 3) * 0x01010101, (4 * v + 3) * 0x01010101, (4 * v + 3) * 0x01010101,
            (4 * v + 2) * 0x01010101, (4 * v + 2) * 0x01010101, (4 * v + 2) * 0x01010101, (4 * v + 2) * 0x01010101,
            (4 * v + 1) * 0x01010101, (4 * v + 1) * 0x01010101, (4 * v + 1) * 0x01010101, (4 * v + 1) * 0x01010101,
            (4 * v) * 0x01010101, (4 * v) * 0x01010101, (4 * v) * 0x01010101, (4 * v) * 0x01010101);
        iq1_w_avx512(raw[v], _mm512_test_epi8_mask(_mm512_shuffle_epi8(bq, pick), pat), &g[v], &ng[v]);
    }
    /* word h < 16: 2·((sc_{h/4} >> 3(h mod 4)) & 7) + 1 */
    const __m256i sw = _mm256_permutexvar_epi16(
        _mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(blk + 48))));
    const __m256i t = _mm256_srlv_epi16(sw, _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9));
    const __m256i c = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(t, 1), _mm256_set1_epi16(0xE)),
                                      _mm256_set1_epi16(1));
    const __m512i cz = _mm512_castsi256_si512(c);
    sc[0] = _mm512_permutexvar_epi16(
        _mm512_set_epi32(3 | (7 << 16), 3 | (7 << 16), 3 | (7 << 16), 3 | (7 << 16), 2 | (6 << 16), 2 | (6 << 16),
                         2 | (6 << 16), 2 | (6 << 16), 1 | (5 << 16), 1 | (5 << 16), 1 | (5 << 16), 1 | (5 << 16),
                         0 | (4 << 16), 0 | (4 << 16), 0 | (4 << 16), 0 | (4 << 16)),
        cz);
    sc[1] = _mm512_permutexvar_epi16(
        _mm512_set_epi32(11 | (15 << 16), 11 | (15 << 16), 11 | (15 << 16), 11 | (15 << 16), 10 | (14 << 16),
                         10 | (14 << 16), 10 | (14 << 16), 10 | (14 << 16), 9 | (13 << 16), 9 | (13 << 16),
                         9 | (13 << 16), 9 | (13 << 16), 8 | (12 << 16), 8 | (12 << 16), 8 | (12 << 16),
                         8 | (12 << 16)),
        cz);
}

/* DSIB_IQ_TILE_AVX512 with one decode for the unsigned bytes, the sign masks and the scale
 * pairs (all three come from the grid rows and s), and d from DF(blk). The 11-bit grid
 * indices of each row's next super-block are computed in vectors (IDX) one step ahead and
 * stored, so the scalar loads of the grid rows read them from memory that is no longer in
 * flight: 15.5 -> 11.5 ns per super-block on one Zen 5 core, against 15.5 for the indices
 * computed in scalar code or 16 / 17.8 for vectors taken apart (vpextrw) or stored and read
 * back at once. */
#define IQ1_TILE_AVX512(NAME, BLK, IDX, DECODE, DF)                                        \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m512 acc[4][4][2]; /* [row][token][set] */                                       \
        uint16_t ixb[4][2][32] __attribute__((aligned(64)));                               \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();  \
        const int64_t nb = n_in / 256;                                                     \
        for (int r = 0; r < R && nb > 0; r++)                                              \
            _mm512_store_si512(ixb[r][0], IDX(w + (size_t)r * rb));                        \
        const __m512i z = _mm512_setzero_si512();                                          \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk = w + (size_t)r * rb + (BLK) * b;                       \
                DSIB_PF(PF, blk, BLK);                                                     \
                __m512i g[4], sc[2];                                                       \
                __mmask64 ng[4];                                                           \
                if (b + 1 < nb) _mm512_store_si512(ixb[r][u ^ 1], IDX(blk + (BLK)));       \
                __asm__("" : "+m"(ixb));                                                   \
                DECODE(blk, ixb[r][u], g, ng, sc);                                         \
                const float d = DF(blk);                                                   \
                for (int t = 0; t < T; t++) {                                              \
                    const int8_t *xq = x[t].q + 256 * b;                                   \
                    __m512i I[4];                                                          \
                    for (int v = 0; v < 4; v++) {                                          \
                        const __m512i q = _mm512_loadu_si512(xq + 64 * v);                 \
                        I[v] = _mm512_dpbusd_epi32(z, g[v], _mm512_mask_sub_epi8(q, ng[v], z, q)); \
                    }                                                                      \
                    __m512i S = _mm512_dpwssd_epi32(                                       \
                        z, _mm512_mask_blend_epi16(0xAAAAAAAAu, I[0], _mm512_slli_epi32(I[1], 16)), sc[0]); \
                    S = _mm512_dpwssd_epi32(                                               \
                        S, _mm512_mask_blend_epi16(0xAAAAAAAAu, I[2], _mm512_slli_epi32(I[3], 16)), sc[1]); \
                    acc[r][t][u] = _mm512_fmadd_ps(_mm512_set1_ps(d * x[t].d[b]),          \
                                                   _mm512_cvtepi32_ps(S), acc[r][t][u]);   \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = 0.125f * dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]); \
    }

IQ1_TILE_AVX512(iq1_s_tile_avx512, 50, iq1_s_idx_avx512, iq1_s_dec_avx512, iq1_s_d_hw)
IQ1_TILE_AVX512(iq1_m_tile_avx512, 56, iq1_m_idx_avx512, iq1_m_dec_avx512, iq1_m_d_hw)

DSIB_QROWS_DEFINE_R(iq1_s_rows_avx512, iq1_s_tile_avx512, 2)
DSIB_QROWS_DEFINE_R(iq1_m_rows_avx512, iq1_m_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_iq1_s = {
    DSIB_TYPE_IQ1_S, DSIB_ACT_Q8_K, {iq1_s_rows_scalar, iq1_s_rows_avx2, NULL, iq1_s_rows_avx512}};
const dsib_kern_qtype dsib_kq_iq1_m = {
    DSIB_TYPE_IQ1_M, DSIB_ACT_Q8_K, {iq1_m_rows_scalar, iq1_m_rows_avx2, NULL, iq1_m_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_iq1_s = {DSIB_TYPE_IQ1_S, DSIB_ACT_Q8_K, {iq1_s_rows_scalar}};
const dsib_kern_qtype dsib_kq_iq1_m = {DSIB_TYPE_IQ1_M, DSIB_ACT_Q8_K, {iq1_m_rows_scalar}};

#endif
