/*
 * AVX2 helpers of the default-path kernels. Include INSIDE a DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
 * region (the functions take that region's target).
 */
#ifndef DSIB_SIMD_AVX2_H
#define DSIB_SIMD_AVX2_H

#include <immintrin.h>

/* dsib_reduce16 over lanes 0-7 (lo) and 8-15 (hi): same additions, same order. */
DSIB_AI float dsib_reduce16_avx2(__m256 lo, __m256 hi) {
    const __m256 h8 = _mm256_add_ps(lo, hi);
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

/* dsib_reduce32 over two sets of lanes 0-7 / 8-15. */
DSIB_AI float dsib_reduce32_avx2(__m256 lo0, __m256 hi0, __m256 lo1, __m256 hi1) {
    return dsib_reduce16_avx2(_mm256_add_ps(lo0, lo1), _mm256_add_ps(hi0, hi1));
}

/* Σ over groups of four of a[i]·b[i] (a unsigned, b signed; |a·b| <= 255·127 — no int16
 * saturation as long as a <= 128 or |b| <= 64): 8 int32 lanes, lane j = bytes 4j..4j+3. */
DSIB_AI __m256i dsib_dot_u8s8_avx2(__m256i a, __m256i b) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* Signed × signed: lane j = Σ_{k<4} a[4j+k]·b[4j+k] (a != -128 or |b| <= 127). */
DSIB_AI __m256i dsib_dot_s8s8_avx2(__m256i a, __m256i b) {
    return dsib_dot_u8s8_avx2(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

/* f16 → f32 in hardware (exact, as dsib_f16_to_f32). */
DSIB_AI float dsib_f16_hw(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Two consecutive f16 (e.g. Q4_K d, dmin) → lanes 0, 1. */
DSIB_AI __m128 dsib_f16x2_hw(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

/* Q4_K: the 12 packed scale bytes at p (16 bytes are read) → bytes 0-7 the sub-block scales,
 * 8-15 the mins: the same values as dsib_q4k_unpack_scales, in registers. */
DSIB_AI __m128i dsib_q4k_scales_sse(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i p1 = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i lo = _mm_and_si128(p1, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i hn = _mm_and_si128(_mm_srli_epi16(p1, 4),
                                     _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i p2 = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i hi = _mm_srli_epi16(_mm_and_si128(p2, _mm_set1_epi8((char)0xC0)), 2);
    return _mm_or_si128(_mm_or_si128(lo, hn), hi);
}

/* K-quant super-block epilogue (DSIB_KQ_TILE_AVX2: q5_k.c), lanes 0-7 in a[0], 8-15 in a[1]. */
DSIB_AI void dsib_kq_acc_avx2(__m256 a[2], __m256i S0, __m256i S1, __m256i M, __m128 dmw,
                              float dx) {
    const __m128 pr2 = _mm_mul_ps(dmw, _mm_set1_ps(dx));
    const __m256 dd = _mm256_broadcastss_ps(pr2);
    a[0] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S0), a[0]);
    a[1] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S1), a[1]);
    a[0] = _mm256_fnmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(pr2)), _mm256_cvtepi32_ps(M), a[0]);
}

/* Position p of a K-quant super-block b for T <= 4 tokens: S[t][p & 1] += madd(maddubs(wq,
 * x_t at p), sc) with the position's 32 weight codes wq (lanes 0-7 for even p, 8-15 for odd
 * p) and int16 scale words sc. The empty asm after each add keeps every sum a chain (exact
 * int32 sums, so the order changes no result): without it the compiler rebuilt the sums into
 * trees whose temporaries spilled to the stack, and the Zen 3 two-token tile spent its time
 * on vector loads (docs/performance.md 4.000000000000000). */
DSIB_AI void dsib_kq_pos_avx2(__m256i S[][2], int T, __m256i wq, __m256i sc, const dsib_qrow *x,
                              int64_t b, int p) {
    for (int t = 0; t < T; t++) {
        const __m256i pr = _mm256_maddubs_epi16(
            wq, _mm256_loadu_si256((const __m256i *)(x[t].q + 256 * b + 32 * p)));
        S[t][p & 1] = _mm256_add_epi32(S[t][p & 1], _mm256_madd_epi16(pr, sc));
        __asm__("" : "+x"(S[t][p & 1]));
    }
}

/* In a K-quant tile (T tokens, super-block b, activations x): st = PREP(blk) and the integer
 * sums S[t][0..1] of the super-block at blk, one position at a time (POS as below). */
#define DSIB_KQ_SUMS_AVX2_(S, st, blk, PREP, POS)                                          \
    const __m256i st = PREP(blk);                                                          \
    __m256i S[4][2];                                                                       \
    for (int t = 0; t < T; t++) S[t][0] = S[t][1] = _mm256_setzero_si256();                \
    _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {                                  \
        __m256i wq, sc;                                                                    \
        POS(blk, st, p, &wq, &sc);                                                         \
        dsib_kq_pos_avx2(S, T, wq, sc, x, b, p);                                           \
    }

/* In a K-quant tile, row r's super-block b: blk, its prefetch, the integer sums S[t][0..1]
 * (DSIB_KQ_SUMS_AVX2_), the mins mn and (d, dmin) dmw from TAIL. */
#define DSIB_KQ_ROW_SB_AVX2_(BLK, PREP, POS, TAIL)                                         \
    const uint8_t *blk = w + (size_t)r * rb + (BLK) * b;                                   \
    DSIB_PF_ROWS(PF, blk, BLK, R, rb);                                                     \
    DSIB_KQ_SUMS_AVX2_(S, st, blk, PREP, POS);                                             \
    __m256i mn;                                                                            \
    __m128 dmw;                                                                            \
    TAIL(blk, st, &mn, &dmw)

/* The whole AVX2 tile of a K-quant, decoding each super-block one position at a time:
 * st = PREP(blk) (a vector of per-super-block state, e.g. the unpacked scales),
 * POS(blk, st, p, &wq, &sc) (position p's 32 codes and int16 scale words; p is a constant
 * after unrolling) and TAIL(blk, st, &mn, &dmw) (the mins as int16 words doubled up to match
 * the activation sums per 16, and d, dmin). Decoding all eight positions first kept 16
 * vectors live next to the sums and accumulators, and the compiler spilled them. */
#define DSIB_KQ_TILE_AVX2(NAME, BLK, PREP, POS, TAIL)                                      \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =    \
                    _mm256_setzero_ps();                                                   \
        const int64_t nb = n_in / 256;                                                     \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                DSIB_KQ_ROW_SB_AVX2_(BLK, PREP, POS, TAIL);                                \
                for (int t = 0; t < T; t++) {                                              \
                    const __m256i M = _mm256_madd_epi16(                                   \
                        mn, _mm256_loadu_si256((const __m256i *)(x[t].s + 16 * b)));       \
                    dsib_kq_acc_avx2(acc[r][t][u], S[t][0], S[t][1], M, dmw, x[t].d[b]);   \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1],      \
                                                    acc[r][t][1][0], acc[r][t][1][1]);     \
    }

/* Lane i of the result: the sum of the eight lanes of v[i] (exact). */
DSIB_AI __m128i dsib_hsum4x8_avx2(const __m256i v[4]) {
    const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i c = _mm256_hadd_epi32(a, b); /* per 128: v0 v1 v2 v3 partial */
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* The AVX2 tile of a K-quant in the block-sum order (q4_k.c, q2_k.c): rows one at a time, up
 * to four (row, token) items (R·T <= 4). Per super-block, row and token the exact lanes of
 * DSIB_KQ_SUMS_AVX2_ (PREP / POS as for DSIB_KQ_TILE_AVX2; their sixteen lanes add up to S_b)
 * and of the mins against the activation sums (TAIL's mn; adding up to M_b); the items are
 * summed across lanes together by one horizontal-add tree, and their chain steps
 * acc = fmaf(-(dmin·dx), M_b, acc), acc = fmaf(d·dx, S_b, acc) are two vector fmas (a tree per
 * item measured 20-25 % slower at 128 tokens, Q4_K). */
#define DSIB_KQ_BS_TILE_AVX2(NAME, BLK, PREP, POS, TAIL)                                   \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m128 acc = _mm_setzero_ps(); /* lane r·T + t */                                  \
        const int64_t nb = n_in / 256;                                                     \
        for (int64_t b = 0; b < nb; b++) {                                                 \
            __m256i v[4], m[4];                                                            \
            float dd[4] = {0, 0, 0, 0}, dm[4] = {0, 0, 0, 0};                              \
            for (int r = 0; r < R; r++) {                                                  \
                DSIB_KQ_ROW_SB_AVX2_(BLK, PREP, POS, TAIL);                                \
                const float d = _mm_cvtss_f32(dmw), dmin = _mm_cvtss_f32(_mm_movehdup_ps(dmw)); \
                for (int t = 0; t < T; t++) {                                              \
                    const int i = r * T + t;                                               \
                    v[i] = _mm256_add_epi32(S[t][0], S[t][1]);                             \
                    m[i] = _mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i *)(x[t].s + 16 * b))); \
                    dd[i] = d * x[t].d[b];                                                 \
                    dm[i] = dmin * x[t].d[b];                                              \
                }                                                                          \
            }                                                                              \
            __m128i Si, Mi;                                                                \
            if (R * T == 1) {                                                              \
                const __m256i h = _mm256_hadd_epi32(v[0], m[0]); /* s01 s23 m01 m23 | ... */ \
                const __m256i h2 = _mm256_hadd_epi32(h, h);      /* s0-3 m0-3 . . | ... */ \
                Si = _mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1)); \
                Mi = _mm_shuffle_epi32(Si, 0x55);                                          \
            } else {                                                                       \
                for (int i = R * T; i < 4; i++) v[i] = m[i] = _mm256_setzero_si256();      \
                Si = dsib_hsum4x8_avx2(v);                                                 \
                Mi = dsib_hsum4x8_avx2(m);                                                 \
            }                                                                              \
            acc = _mm_fnmadd_ps(_mm_loadu_ps(dm), _mm_cvtepi32_ps(Mi), acc);               \
            acc = _mm_fmadd_ps(_mm_loadu_ps(dd), _mm_cvtepi32_ps(Si), acc);                \
        }                                                                                  \
        float o_[4];                                                                       \
        _mm_storeu_ps(o_, acc);                                                            \
        for (int i = 0; i < R * T; i++) out[i] = o_[i];                                    \
    }

/*
 * The whole AVX2 tile of a type with 32-element blocks on DSIB_ACT_Q8_32 activations
 * (iq4.c, mxfp4.c, q4_1_q5.c; the Q8_32 lane order of kernels_impl.h), one block per ymm. The type supplies
 * WBLK(blk) (the block's 32 weights as int8, not -128 together with |q| = 128), SBLK(blk)
 * (its f32 scale) and BLK (bytes per block).
 */
#define DSIB_Q8_32_TILE_AVX2(NAME, BLK, WBLK, SBLK)                                        \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =    \
                    _mm256_setzero_ps();                                                   \
        const int64_t nb = n_in / 32;                                                      \
        int64_t b = 0;                                                                     \
        for (; b + 4 <= nb; b += 4) {                                                      \
            for (int r = 0; r < R; r++) DSIB_PF_ROWS(PF, w + (size_t)r * rb + (BLK) * b, 4 * (BLK), R, rb); \
            DSIB_Q8_32_BLOCK_AVX2_(b, 0, 0, BLK, WBLK, SBLK);                              \
            DSIB_Q8_32_BLOCK_AVX2_(b + 1, 0, 1, BLK, WBLK, SBLK);                          \
            DSIB_Q8_32_BLOCK_AVX2_(b + 2, 1, 0, BLK, WBLK, SBLK);                          \
            DSIB_Q8_32_BLOCK_AVX2_(b + 3, 1, 1, BLK, WBLK, SBLK);                          \
        }                                                                                  \
        if (b < nb) DSIB_Q8_32_BLOCK_AVX2_(b, 0, 0, BLK, WBLK, SBLK);                      \
        if (b + 1 < nb) DSIB_Q8_32_BLOCK_AVX2_(b + 1, 0, 1, BLK, WBLK, SBLK);              \
        if (b + 2 < nb) DSIB_Q8_32_BLOCK_AVX2_(b + 2, 1, 0, BLK, WBLK, SBLK);              \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1],      \
                                                    acc[r][t][1][0], acc[r][t][1][1]);     \
    }

#define DSIB_Q8_32_BLOCK_AVX2_(b, set, h, BLK, WBLK, SBLK)                                 \
    do {                                                                                   \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + (BLK) * (b);                         \
            const __m256i wq = WBLK(blk);                                                  \
            const float sw = SBLK(blk);                                                    \
            for (int t = 0; t < T; t++) {                                                  \
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + 32 * (b))); \
                acc[r][t][set][h] = _mm256_fmadd_ps(                                       \
                    _mm256_set1_ps(sw * x[t].d[b]),                                        \
                    _mm256_cvtepi32_ps(dsib_dot_s8s8_avx2(wq, xq)), acc[r][t][set][h]);    \
            }                                                                              \
        }                                                                                  \
    } while (0)

/* ---- shared by the further 256-element types (q4_k.c / q5_k.c, q6_k.c / q3_k.c,
 * iq2_xxs.c / iq3_xxs.c / iq2_xs.c / iq2_s.c / iq3_s.c) ----------------------------------------- */

/* Q4_K / Q5_K scales for DSIB_KQ_TILE_AVX2: PREP = the unpacked scale bytes (0-7 scales, 8-15
 * mins) in both lanes; activation position p uses the scale of sub-block P[p]
 * (P = 0,2,1,3,4,6,5,7; pshufb into 16 words), the mins doubled up to match the activation
 * sums per 16. */
DSIB_AI __m256i dsib_kq4_prep_avx2(const uint8_t *sc12) {
    return _mm256_broadcastsi128_si256(dsib_q4k_scales_sse(sc12));
}
DSIB_AI __m256i dsib_kq4_sc_avx2(__m256i smv, int p) {
    static const uint8_t perm[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    return _mm256_shuffle_epi8(smv, _mm256_set1_epi16((short)(0x8000 | perm[p])));
}
DSIB_AI __m256i dsib_kq4_mins_avx2(__m256i smv) {
    return _mm256_shuffle_epi8(smv, _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11,
                                                     -128, 11, -128, 12, -128, 12, -128, 13, -128, 13, -128, 14,
                                                     -128, 14, -128, 15, -128, 15, -128));
}

/* Int16 words from a vector holding the same 16 bytes in both lanes: lanes 0-7 the signed
 * byte i0, lanes 8-15 the signed byte i1 (pshufb into the high bytes, arithmetic shift). */
DSIB_AI __m256i dsib_s8_pair_words_avx2(__m256i v, int i0, int i1) {
    const __m256i pat = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_set1_epi16((short)((i0 << 8) | 0x80))),
        _mm_set1_epi16((short)((i1 << 8) | 0x80)), 1);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(v, pat), 8);
}

/* DSIB_KQO_TILE_AVX512's AVX2 form, decoding one position at a time like DSIB_KQ_TILE_AVX2:
 * st = PREP(blk), POS(blk, st, p, &wq, &sc) (position p's 32 codes, lanes 0-7 for even p,
 * 8-15 for odd p, and their int16 scale words), TAIL(blk, st, &scw) (the 16 signed scales as
 * int16, for M, subtracted << SH in lanes 0-7); d is the f16 at DOFF. */
#define DSIB_KQO_TILE_AVX2(NAME, BLK, PREP, POS, TAIL, DOFF, SH)                           \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =    \
                    _mm256_setzero_ps();                                                   \
        const int64_t nb = n_in / 256;                                                     \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk = w + (size_t)r * rb + (BLK) * b;                       \
                DSIB_PF_ROWS(PF, blk, BLK, R, rb);                                         \
                DSIB_KQ_SUMS_AVX2_(S, st, blk, PREP, POS);                                 \
                __m256i scw;                                                               \
                TAIL(blk, st, &scw);                                                       \
                const float d = dsib_f16_hw(blk + (DOFF));                                 \
                for (int t = 0; t < T; t++) {                                              \
                    const __m256i M =                                                      \
                        _mm256_madd_epi16(scw, _mm256_loadu_si256((const __m256i *)(x[t].s + 16 * b))); \
                    S[t][0] = _mm256_sub_epi32(S[t][0], _mm256_slli_epi32(M, SH));         \
                    const __m256 dd = _mm256_set1_ps(d * x[t].d[b]);                       \
                    acc[r][t][u][0] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[t][0]), acc[r][t][u][0]); \
                    acc[r][t][u][1] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[t][1]), acc[r][t][u][1]); \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1],      \
                                                    acc[r][t][1][0], acc[r][t][1][1]);     \
    }

/* IQ2_XXS / IQ3_XXS: a sub-block's 32 sign bits (bit e: element e negative) as ±1 bytes,
 * for vpsignb on the activations. */
DSIB_AI __m256i dsib_iq_signs_avx2(uint32_t m) {
    const __m256i bits = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)m), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                    2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i pat = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, pat), pat), _mm256_set1_epi8(1));
}

/* The sign vector of four 7-bit ksigns indices (dsib_ksigns64): the same ±1 bytes as
 * dsib_iq_signs_avx2 of their sign bits, by four qword loads instead of four byte loads and
 * the byte spread (about ten operations fewer per sub-block). */
DSIB_AI __m256i dsib_iq_signs4_avx2(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_set_epi64x((long long)dsib_ksigns64[i3], (long long)dsib_ksigns64[i2],
                             (long long)dsib_ksigns64[i1], (long long)dsib_ksigns64[i0]);
}

/* IQ2_XS / IQ2_S: the odd scales 2·ls + 1 of a sub-block's scale byte (ls of its 16-element
 * half h = nibble h) as int16: words 0-7 (elements 0-15) the low nibble's, 8-15 the high's. */
DSIB_AI __m256i dsib_iq_scales16_avx2(uint8_t b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)(2 * (b & 15) + 1))),
                                   _mm_set1_epi16((short)(2 * (b >> 4) + 1)), 1);
}

/* DSIB_IQ_TILE_AVX512's AVX2 form: SUB(blk, s, &g, &sg, &sc) gives sub-block s's 32 grid
 * bytes, its signs as ±1 bytes and its odd scale in every int16 (sub-block s = lanes 0-7
 * for even s, 8-15 for odd s), one sub-block at a time, its sums kept chains
 * (dsib_kq_pos_avx2). */
#define DSIB_IQ_TILE_AVX2(NAME, BLK, SUB, FIN)                                             \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =    \
                    _mm256_setzero_ps();                                                   \
        const int64_t nb = n_in / 256;                                                     \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk = w + (size_t)r * rb + (BLK) * b;                       \
                DSIB_PF_ROWS(PF, blk, BLK, R, rb);                                         \
                __m256i S[4][2];                                                           \
                for (int t = 0; t < T; t++) S[t][0] = S[t][1] = _mm256_setzero_si256();    \
                _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) {                      \
                    __m256i g, sg, sc;                                                     \
                    SUB(blk, s, &g, &sg, &sc);                                             \
                    for (int t = 0; t < T; t++) {                                          \
                        const __m256i q = _mm256_loadu_si256((const __m256i *)(x[t].q + 256 * b + 32 * s)); \
                        const __m256i pr = _mm256_maddubs_epi16(g, _mm256_sign_epi8(q, sg)); \
                        S[t][s & 1] = _mm256_add_epi32(S[t][s & 1], _mm256_madd_epi16(pr, sc)); \
                        __asm__("" : "+x"(S[t][s & 1]));                                   \
                    }                                                                      \
                }                                                                          \
                const float d = dsib_f16_hw(blk);                                          \
                for (int t = 0; t < T; t++) {                                              \
                    const __m256 dd = _mm256_set1_ps(d * x[t].d[b]);                       \
                    acc[r][t][u][0] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[t][0]), acc[r][t][u][0]); \
                    acc[r][t][u][1] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S[t][1]), acc[r][t][u][1]); \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = (FIN) * dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1], \
                                                            acc[r][t][1][0], acc[r][t][1][1]); \
    }

#endif
