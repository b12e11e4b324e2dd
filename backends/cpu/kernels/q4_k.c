/*
 * Q4_K weights × DSIB_ACT_Q8_K_P4 activations (default path; kernels.h).
 *
 * The activation row stores each 256-block's 32-element groups in the order
 * P = (0,2,1,3,4,6,5,7), which is how Q4_K packs nibbles: 64-byte vector v (v < 4) of the
 * block's quants is the low (v even) or high (v odd) nibbles of qs[64·(v/2) ..+64), i.e.
 * natural sub-blocks P[2v] (bytes 0-31) and P[2v+1] (bytes 32-63) — the same 64 bytes of
 * the activation row.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), with sc_j, m_j its 6-bit scales / mins, d, dmin its f16
 * scales, dx the activation scale and bs[g] the activation sums per 16 natural elements:
 *
 *   S[j] = Σ_{v<4} sc_{P[2v + (j>=8)]} · Σ_{k<4} q_v[4j+k] · x_v[4j+k]   j < 16 (exact)
 *   M[j] = m_j · (bs[2j] + bs[2j+1])                                     j < 8  (exact)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            j < 16
 *   acc[u][j] = fmaf(-(dmin·dx), (float)M[j], acc[u][j])      j < 8
 *
 * then y = dsib_reduce32(acc). (|S| < 2^21, |M| < 2^18: the conversions are exact.)
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

static const uint8_t q4k_perm[8] = {0, 2, 1, 3, 4, 6, 5, 7};

/* ---- scalar ---------------------------------------------------------------------------- */

static float q4_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        float *a = acc[b & 1];
        const uint8_t *blk = row + 144 * b, *qs = blk + 16;
        const int8_t *xq = x->q + 256 * b;
        const int16_t *bs = x->s + 16 * b;
        uint8_t sm[16];
        dsib_q4k_unpack_scales(blk + 4, sm);
        int32_t S[16] = {0}, M[8];
        for (int v = 0; v < 4; v++) {
            const uint8_t *qv = qs + 64 * (v / 2);
            const int sh = (v & 1) ? 4 : 0;
            for (int j = 0; j < 16; j++) {
                int32_t I = 0;
                for (int k = 0; k < 4; k++) I += ((qv[4 * j + k] >> sh) & 15) * xq[64 * v + 4 * j + k];
                S[j] += sm[q4k_perm[2 * v + (j >= 8)]] * I;
            }
        }
        for (int j = 0; j < 8; j++) M[j] = sm[8 + j] * (bs[2 * j] + bs[2 * j + 1]);
        const float dd = dsib_ld_f16(blk) * x->d[b], dm = dsib_ld_f16(blk + 2) * x->d[b];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
        for (int j = 0; j < 8; j++) a[j] = fmaf(-dm, (float)M[j], a[j]);
    }
    return dsib_reduce32(acc);
}

static void q4_k_rows_scalar(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                             const dsib_qrow *x, float *const *yp, int n) {
    for (int64_t o = o0; o < o1; o++)
        for (int t = 0; t < n; t++) yp[t][o] = q4_k_dot_scalar(w + (size_t)o * rb, n_in, &x[t]);
}

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* pshufb index making 16 words equal to byte `i` of the (broadcast) scale vector */
#define Q4K_SEL(i) _mm256_set1_epi16((short)(0x8000 | (i)))

DSIB_AI void q4_k_tile_avx2(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                            float *out, const int R, const int T) {
    __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =
                _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i mins_idx = _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10,
                                              -128, 11, -128, 11, -128, 12, -128, 12, -128, 13,
                                              -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128);
    for (int64_t b2 = 0; b2 < n_in / 256; b2 += 2)
    _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
        const int64_t b = b2 + u;
        if (b >= n_in / 256) break;
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * rb + 144 * b, *qs = blk + 16;
            const __m256i smv = _mm256_broadcastsi128_si256(dsib_q4k_scales_sse(blk + 4));
            __m256i wq[8];
            for (int c = 0; c < 4; c++) {
                /* qs[32c..32c+32): low / high nibbles are activation positions
                 * c = 0: 0, 2; c = 1: 1, 3; c = 2: 4, 6; c = 3: 5, 7 */
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                const int p = 4 * (c / 2) + (c & 1);
                wq[p] = _mm256_and_si256(raw, m4);
                wq[p + 2] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            }
            const __m256i mn = _mm256_shuffle_epi8(smv, mins_idx);
            const __m128 dmw = dsib_f16x2_hw(blk); /* d, dmin */
            for (int t = 0; t < T; t++) {
                const int8_t *xq = x[t].q + 256 * b;
                __m256i S[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int p = 0; p < 8; p++) {
                    const __m256i pr = _mm256_maddubs_epi16(
                        wq[p], _mm256_loadu_si256((const __m256i *)(xq + 32 * p)));
                    const __m256i sc = _mm256_shuffle_epi8(smv, Q4K_SEL(q4k_perm[p]));
                    S[p & 1] = _mm256_add_epi32(S[p & 1], _mm256_madd_epi16(pr, sc));
                }
                const __m256i M = _mm256_madd_epi16(
                    mn, _mm256_loadu_si256((const __m256i *)(x[t].s + 16 * b)));
                const __m128 pr2 = _mm_mul_ps(dmw, _mm_set1_ps(x[t].d[b]));
                const __m256 dd = _mm256_broadcastss_ps(pr2);
                const __m256 dm = _mm256_broadcastss_ps(_mm_movehdup_ps(pr2));
                __m256 *a = acc[r][t][u];
                a[0] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[0]), a[0]);
                a[1] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[1]), a[1]);
                a[0] = _mm256_fnmadd_ps(dm, _mm256_cvtepi32_ps(M), a[0]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1], acc[r][t][1][0],
                                                acc[r][t][1][1]);
}

DSIB_QROWS_DEFINE_T(q4_k_rows_avx2, q4_k_tile_avx2, 2, 1)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

DSIB_AI void q4_k_tile_avx512(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                              float *out, const int R, const int T) {
    __m512 acc[4][4][2]; /* [row][token][set] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* vpermw indices over the 16 words (scales 0-7, mins 8-15): vector v uses the scales
     * of sub-blocks P[2v] (words 0-15) and P[2v+1] (words 16-31) */
    __m512i sel[4];
    for (int v = 0; v < 4; v++)
        sel[v] = _mm512_inserti64x4(_mm512_set1_epi16(q4k_perm[2 * v]),
                                    _mm256_set1_epi16(q4k_perm[2 * v + 1]), 1);
    const __m256i mins_idx = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14,
                                               14, 15, 15);
    for (int64_t b2 = 0; b2 < n_in / 256; b2 += 2)
    _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
        const int64_t b = b2 + u;
        if (b >= n_in / 256) break;
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + (size_t)r * rb + 144 * b;
            const __m256i s16 = _mm256_cvtepu8_epi16(dsib_q4k_scales_sse(blk + 4));
            const __m512i s16z = _mm512_castsi256_si512(s16);
            const __m512i q0 = _mm512_loadu_si512(blk + 16), q1 = _mm512_loadu_si512(blk + 80);
            const __m512i wv[4] = {_mm512_and_si512(q0, m4),
                                   _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                                   _mm512_and_si512(q1, m4),
                                   _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
            __m512i sc[4];
            for (int v = 0; v < 4; v++) sc[v] = _mm512_permutexvar_epi16(sel[v], s16z);
            const __m256i mn = _mm256_permutexvar_epi16(mins_idx, s16);
            const __m128 dmw = dsib_f16x2_hw(blk); /* d, dmin */
            for (int t = 0; t < T; t++) {
                const int8_t *xq = x[t].q + 256 * b;
                __m512i S = _mm512_setzero_si512();
                for (int v = 0; v < 4; v++)
                    S = _mm512_dpwssd_epi32(
                        S, _mm512_maddubs_epi16(wv[v], _mm512_loadu_si512(xq + 64 * v)), sc[v]);
                const __m256i M = _mm256_madd_epi16(
                    mn, _mm256_loadu_si256((const __m256i *)(x[t].s + 16 * b)));
                const __m128 pr2 = _mm_mul_ps(dmw, _mm_set1_ps(x[t].d[b]));
                const __m512 dd = _mm512_broadcastss_ps(pr2);
                const __m512 dm = _mm512_broadcastss_ps(_mm_movehdup_ps(pr2));
                acc[r][t][u] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(S), acc[r][t][u]);
                acc[r][t][u] = _mm512_fnmadd_ps(
                    dm, _mm512_cvtepi32_ps(_mm512_zextsi256_si512(M)), acc[r][t][u]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);
}

DSIB_QROWS_DEFINE(q4_k_rows_avx512, q4_k_tile_avx512)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q4_k = {
    DSI_TYPE_Q4_K, DSIB_ACT_Q8_K_P4, {q4_k_rows_scalar, q4_k_rows_avx2, NULL, q4_k_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q4_k = {DSI_TYPE_Q4_K, DSIB_ACT_Q8_K_P4, {q4_k_rows_scalar}};

#endif
