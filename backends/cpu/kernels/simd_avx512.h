/*
 * AVX-512 (+VNNI) helpers of the default-path kernels. Include INSIDE a
 * DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI) region (the functions take that region's target).
 */
#ifndef DSIB_SIMD_AVX512_H
#define DSIB_SIMD_AVX512_H

#include <immintrin.h>

#include "backends/cpu/kernels/simd_avx2.h" /* dsib_f16_hw, dsib_q4k_scales_sse */

/* dsib_reduce16 over the 16 lanes of a: same additions, same order. */
DSIB_AI float dsib_reduce16_avx512(__m512 a) {
    const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

/* dsib_reduce32 over two sets. */
DSIB_AI float dsib_reduce32_avx512(__m512 a0, __m512 a1) {
    return dsib_reduce16_avx512(_mm512_add_ps(a0, a1));
}

/* dsib_reduce32 of four outputs at once (a tile's four tokens): out[t] = the reduction of
 * a[t][0] + a[t][1], with every addition of dsib_reduce16 between the same two values (float
 * addition commutes exactly), only four outputs' additions share each vector instruction:
 * 19 instructions for four outputs instead of 44. */
DSIB_AI void dsib_reduce32x4_avx512(const __m512 a[4][2], float *out) {
    const __m512 s0 = _mm512_add_ps(a[0][0], a[0][1]), s1 = _mm512_add_ps(a[1][0], a[1][1]);
    const __m512 s2 = _mm512_add_ps(a[2][0], a[2][1]), s3 = _mm512_add_ps(a[3][0], a[3][1]);
    /* h8[i] = s[i] + s[i + 8]: [s0.h8 | s1.h8], [s2.h8 | s3.h8] */
    const __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(s0, s1, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(s0, s1, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(s2, s3, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(s2, s3, _MM_SHUFFLE(3, 2, 3, 2)));
    /* h4[i] = h8[i] + h8[i + 4]: one 128-bit quarter per output */
    const __m512 h4 = _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(h01, h23, _MM_SHUFFLE(3, 1, 3, 1)));
    /* h0 = h4[0] + h4[2], h1 = h4[1] + h4[3] in lanes 0, 1 of each quarter; then h0 + h1 */
    const __m512 h2 = _mm512_add_ps(h4, _mm512_permute_ps(h4, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 r = _mm512_add_ps(h2, _mm512_movehdup_ps(h2));
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, r)));
}

/* The one-token tile of four rows (R = 4, T = 1: the short-row decode tiles of
 * DSIB_QROWS_DEFINE_RT4) reduces its four rows' outputs together, like four tokens. */
#define DSIB_REDUCE_R4T1_AVX512_(acc, out)                                                 \
    do {                                                                                   \
        if (R == 4 && T == 1) {                                                            \
            const __m512 a4_[4][2] = {{acc[0][0][0], acc[0][0][1]}, {acc[1][0][0], acc[1][0][1]}, \
                                      {acc[2][0][0], acc[2][0][1]}, {acc[3][0][0], acc[3][0][1]}}; \
            dsib_reduce32x4_avx512(a4_, out);                                              \
            return;                                                                        \
        }                                                                                  \
    } while (0)

/* A tile's outputs out[r * T + t] from its accumulators acc[row][token][set]: four rows of
 * one token, or four tokens at a time, reduced together (the same additions). */
#define DSIB_TILE_REDUCE_AVX512_(acc, out)                                                 \
    do {                                                                                   \
        DSIB_REDUCE_R4T1_AVX512_(acc, out);                                                \
        for (int r = 0; r < R; r++) {                                                      \
            if (T == 4 || T == 8) {                                                        \
                for (int t4 = 0; t4 < T; t4 += 4)                                          \
                    dsib_reduce32x4_avx512((const __m512(*)[2])acc[r][t4], out + r * T + t4); \
                continue;                                                                  \
            }                                                                              \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);         \
        }                                                                                  \
    } while (0)

/* 16 lanes: lanes 0-7 = a, lanes 8-15 = b (two broadcast loads and one insert). */
DSIB_AI __m512 dsib_pair_ps(const float *a, const float *b) {
    return _mm512_insertf32x8(_mm512_set1_ps(*a), _mm256_set1_ps(*b), 1);
}

/* Two f16 scales as 16 lanes (a × 8, b × 8). */
DSIB_AI __m512 dsib_pair_f16(const uint8_t *a, const uint8_t *b) {
    short ha, hb;
    memcpy(&ha, a, 2);
    memcpy(&hb, b, 2);
    return _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(ha)), _mm_set1_epi16(hb), 1));
}

/* K-quant super-block epilogue (q5_k.c, DSIB_KQ4_TILE_AVX512): acc + (d·dx)·S over 16 lanes, then
 * minus (dmin·dx)·M over lanes 0-7; dm holds (d, dmin) of super-block h in lanes 2h, 2h + 1
 * (the pair tiles decode two super-blocks' scales at once; h = 0 elsewhere). The two products
 * go through memory so that each FMA takes its scale as an embedded broadcast from the load
 * ports: the broadcasts from a register, and the shuffle of dmin to lane 0, were three
 * shuffle-port operations per token and super-block (Emerald Rapids, one core, Q4_K 2048 x
 * 1024 from the caches: one token 18.97 -> 19.42 GB/s, four tokens 7.6 -> 8.1). Same
 * products, same FMAs, same bits. */
DSIB_AI __m512 dsib_kq_acc_avx512(__m512 acc, __m512i S, __m256i M, __m128 dm, int h, float dx) {
    float pr[4];
    _mm_storeu_ps(pr, _mm_mul_ps(dm, _mm_set1_ps(dx)));
    __asm__("" : "+m"(pr)); /* keeps the compiler from forwarding them back into registers */
    acc = _mm512_fmadd_ps(_mm512_set1_ps(pr[2 * h]), _mm512_cvtepi32_ps(S), acc);
    return _mm512_fnmadd_ps(_mm512_set1_ps(pr[2 * h + 1]),
                            _mm512_cvtepi32_ps(_mm512_zextsi256_si512(M)), acc);
}

/* S of one token and K-quant super-block b: the exact lane sums of the four 64-byte vectors
 * (dpbusd, 4 products per int32 lane; |.| < 2^15) paired into words — vector 0 low, vector 1
 * high; vectors 2, 3 likewise — and multiplied by the pairs' scales sc[0], sc[1] (int32 lane
 * j: the scale of the first vector's lane j in the low word, the second's in the high word)
 * with one dpwssd per pair: S[j] = Σ_v sc_v[j] · (wv_v · q_v)[j] exactly; the tiles add
 * M = mins · sums and the epilogue above (DSIB_KQ_TOKEN_AVX512_). (Pairing the scales halves the scale shuffles and the
 * multiply-port work of maddubs + dpwssd per vector: +5-17 % decode per core, docs/performance.md.) */
DSIB_AI __m512i dsib_kq_s_avx512(const __m512i wv[4], const __m512i sc[2], const int8_t *xq) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i i0 = _mm512_dpbusd_epi32(z, wv[0], _mm512_loadu_si512(xq));
    const __m512i i1 = _mm512_dpbusd_epi32(z, wv[1], _mm512_loadu_si512(xq + 64));
    const __m512i i2 = _mm512_dpbusd_epi32(z, wv[2], _mm512_loadu_si512(xq + 128));
    const __m512i i3 = _mm512_dpbusd_epi32(z, wv[3], _mm512_loadu_si512(xq + 192));
    __m512i S = _mm512_dpwssd_epi32(z, _mm512_mask_blend_epi16(0xAAAAAAAAu, i0, _mm512_slli_epi32(i1, 16)), sc[0]);
    return _mm512_dpwssd_epi32(S, _mm512_mask_blend_epi16(0xAAAAAAAAu, i2, _mm512_slli_epi32(i3, 16)), sc[1]);
}

/*
 * The same S with AVX512_VBMI2 (Ice Lake and later, Zen 4; not every AVX-512 VNNI CPU:
 * Cascade Lake lacks it), used by the K-quant tiles' VB2 variants. The two sums of a pair go
 * into one int32 lane without a blend: vpshldd shifts hi's sums into the high word and puts
 * a bias B = 2^14 in the low word, then lo's products are accumulated on top, giving
 * 2^16·hi + (B + lo). vpdpwssd reads that lane as the signed words (B + lo, hi) exactly when
 * 0 <= B + lo < 2^15 — |lo| <= 15748 for Q2_K, Q4_K and Q5_K (codes below 32, |q| <= 127,
 * four products) — so the pair's dpwssd gives sc_lo·(lo + B) + sc_hi·hi, and S starts at
 * S0 = −B·(sc0_lo + sc1_lo), once per row and super-block (DSIB_KQ_S0_VB2_). The integers
 * are those of the blend form; without the bias the low word's sign borrows from the high
 * word (hi − 1 whenever lo < 0: docs/performance.md 4.00000000000000000000). One blend and
 * one zeroed register fewer per pair and token.
 */
#define DSIB_KQ_VB2_BIAS 16384
#define DSIB_KQ_P_VB2_(wlo, xlo, whi, xhi)                                                 \
    _mm512_dpbusd_epi32(                                                                   \
        _mm512_shldi_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), (whi), _mm512_loadu_si512(xhi)), \
                           _mm512_set1_epi32(DSIB_KQ_VB2_BIAS << 16), 16),                 \
        (wlo), _mm512_loadu_si512(xlo))
#define DSIB_KQ_S0_VB2_(sc)                                                                \
    _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(0xFFFF & -DSIB_KQ_VB2_BIAS), \
                                            (sc)[0]),                                      \
                        _mm512_set1_epi32(0xFFFF & -DSIB_KQ_VB2_BIAS), (sc)[1])
#define DSIB_KQ_S_VB2_(S0, wv, sc, xq)                                                     \
    _mm512_dpwssd_epi32(_mm512_dpwssd_epi32((S0), DSIB_KQ_P_VB2_((wv)[0], (xq), (wv)[1], (xq) + 64), (sc)[0]), \
                        DSIB_KQ_P_VB2_((wv)[2], (xq) + 128, (wv)[3], (xq) + 192), (sc)[1])
/* S of token t in the tiles: VB = 0 the blend form, 1 the VBMI2 form (S0 from the row). */
#define DSIB_KQ_S0_AVX512_0(sc) _mm512_setzero_si512()
#define DSIB_KQ_S0_AVX512_1(sc) DSIB_KQ_S0_VB2_(sc)
#define DSIB_KQ_S_AVX512_0(S0, wv, sc, xq) dsib_kq_s_avx512(wv, sc, xq)
#define DSIB_KQ_S_AVX512_1(S0, wv, sc, xq) DSIB_KQ_S_VB2_(S0, wv, sc, xq)
#define DSIB_KQ_TOKEN_AVX512_(VB, acc, wv, sc, S0, mn, dm, h, xq, xs, dx)                   \
    dsib_kq_acc_avx512((acc), DSIB_KQ_S_AVX512_##VB(S0, wv, sc, xq),                       \
                       _mm256_madd_epi16((mn), _mm256_loadu_si256((const __m256i *)(const void *)(xs))), \
                       (dm), (h), (dx))

/* The accumulators of an AVX-512 tile of R rows and T tokens, zeroed: two sets per
 * (row, token), the canonical order's step parity. */
#define DSIB_TILE_ACC_AVX512_()                                                            \
    __m512 acc[4][8][2]; /* [row][token][set] */                                           \
    for (int r = 0; r < R; r++)                                                            \
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps()

/* Where token t's quants, sums per 16 and scale of super-block b are (K-quant tiles): one
 * base pointer per token, the sums and scales at the row layout's fixed offsets from the
 * quants (act.c) — with three pointers per token, eight tokens left the 16 general
 * registers short and the compiler moved them through vector registers on every token.
 * The same addresses as the views'. */
#define DSIB_KQ_XQ_(t, b) ((const int8_t *)(xb_[t] + 256 * (b)))
#define DSIB_KQ_XS_(t, b) ((const int16_t *)(const void *)(xb_[t] + os_ + 32 * (b)))
#define DSIB_KQ_XD_(t, b) dsib_ldf_(xb_[t] + od_ + 4 * (b))
DSIB_AI float dsib_ldf_(const char *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}
#define DSIB_KQ_XBASE_()                                                                   \
    const char *xb_[8];                                                                    \
    for (int t = 0; t < T; t++) xb_[t] = (const char *)x[t].q;                             \
    const ptrdiff_t os_ = (const char *)x[0].s - xb_[0];                                   \
    const ptrdiff_t od_ = (const char *)x[0].d - xb_[0]

/* DSIB_KQ_TILE_AVX512 for the types whose super-blocks start with (d, dmin) as f16 and the 12
 * packed 6-bit scale bytes of Q4_K (Q5_K; Q4_K until its block-sum order): the scales and (d, dmin) of a pair of
 * super-blocks b, b + 1 are decoded together, one per 128-bit lane (dsib_kq4_pair_avx512),
 * and WDECODE(blk, wv) gives the four weight vectors of one super-block; an odd last
 * super-block goes alone; four super-blocks at a time first (dsib_kq4_quad_avx512, the same
 * values). Per row and pair: one scale decode and one f16 conversion where
 * each super-block had its own (Emerald Rapids, one core, 2048 x 1024 from the caches, with
 * the epilogue's memory broadcasts: Q4_K one token 18.98 -> 20.78 GB/s, four tokens 7.61 ->
 * 8.55; Q5_K 18.30 -> 19.95 / 8.50 -> 9.11; docs/performance.md 4.00000000000000000000).
 * Every value and every floating-point operation of a (row, token) is the same: same bits
 * (test_cpukernels: Q4_K at 256 / 512 / 2304 columns, Q5_K at 256 / 768 / 1792, odd
 * super-block counts included). */
#define DSIB_KQ4_TILE_AVX512(NAME, BLK, WDECODE, VB)                                       \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        DSIB_TILE_ACC_AVX512_();                                                           \
        const int64_t nb = n_in / 256;                                                     \
        DSIB_KQ_XBASE_();                                                                  \
        int64_t b2 = 0;                                                                    \
        for (; b2 + 3 < nb; b2 += 4) /* four super-blocks' scales at once */               \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk0 = w + (size_t)r * rb + (BLK) * b2;                     \
                __m512i s16, s16b;                                                         \
                __m256 dm4;                                                                \
                dsib_kq4_quad_avx512(blk0, BLK, &s16, &s16b, &dm4);                        \
                {                                                                          \
                    const __m128 dm = _mm256_castps256_ps128(dm4);                         \
                    DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0, b2, 0, VB);                    \
                    DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0 + (BLK), b2 + 1, 1, VB);        \
                }                                                                          \
                s16 = s16b;                                                                \
                {                                                                          \
                    const __m128 dm = _mm256_extractf128_ps(dm4, 1);                       \
                    DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0 + 2 * (BLK), b2 + 2, 0, VB);    \
                    DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0 + 3 * (BLK), b2 + 3, 1, VB);    \
                }                                                                          \
            }                                                                              \
        for (; b2 + 1 < nb; b2 += 2)                                                       \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk0 = w + (size_t)r * rb + (BLK) * b2;                     \
                __m512i s16;                                                               \
                __m128 dm;                                                                 \
                dsib_kq4_pair_avx512(blk0, BLK, 1, &s16, &dm);                             \
                DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0, b2, 0, VB);                        \
                DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0 + (BLK), b2 + 1, 1, VB);            \
            }                                                                              \
        if (b2 < nb)                                                                       \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk0 = w + (size_t)r * rb + (BLK) * b2;                     \
                __m512i s16;                                                               \
                __m128 dm;                                                                 \
                dsib_kq4_pair_avx512(blk0, BLK, 0, &s16, &dm);                             \
                DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk0, b2, 0, VB);                        \
            }                                                                              \
        DSIB_TILE_REDUCE_AVX512_(acc, out);                                                \
    }
/* Super-block b = half h of the pair at row r of DSIB_KQ4_TILE_AVX512, into set h. */
#define DSIB_KQ4_SB_AVX512_(BLK, WDECODE, blk, b, h, VB)                                   \
    do {                                                                                   \
        DSIB_PF(PF, blk, BLK);                                                             \
        __m512i wv[4], sc[2];                                                              \
        __m256i mn;                                                                        \
        WDECODE(blk, wv);                                                                  \
        dsib_kq4_scales_pair_avx512(s16, h, sc, &mn);                                      \
        const __m512i S0 = DSIB_KQ_S0_AVX512_##VB(sc);                                     \
        (void)S0;                                                                          \
        for (int t = 0; t < T; t++)                                                        \
            acc[r][t][h] = DSIB_KQ_TOKEN_AVX512_(VB, acc[r][t][h], wv, sc, S0, mn, dm, h,  \
                                                 DSIB_KQ_XQ_(t, b), DSIB_KQ_XS_(t, b),     \
                                                 DSIB_KQ_XD_(t, b));                       \
    } while (0)

/*
 * The whole AVX-512 tile of a type with 32-element blocks on DSIB_ACT_Q8_32 activations
 * (iq4.c, mxfp4.c, q4_1_q5.c; the Q8_32 lane order of kernels_impl.h). The type supplies
 *   WPAIR(blk, half, u): the 64 weight bytes of the block pair at blk (the second block's
 *                        bytes zero when half) as int8, plus 128 (unsigned) when u;
 *   SPAIR(blk, half):    the two weight scales as 16 lanes (a × 8, b × 8; b = 0 when half);
 *   BLK:                 bytes per block.
 * Block pair p, or the lone last block when `half` (its lanes 8-15 then add +0, which never
 * changes an accumulator: acc is never -0). dpbusd multiplies unsigned by signed bytes, so
 * the weights are offset by 128 (once per row) against q, each lane starting at the
 * activation row's -128·Σq (c): the integers Σ w·q exactly. (Tiles of several tokens offset
 * q instead, once per token, with lanes starting at -128·Σw once per row, until 6 December:
 * the same integers, with a xor per token and a dpbusd and a subtraction per row more.)
 * Token t's c[] and e[] are read at their fixed offsets from its quants (act.c's layout), one
 * base pointer per token: with eight tokens' three pointers each the compiler ran out of
 * general registers and moved them through vector registers on every token (Emerald Rapids,
 * one core, Q8_0 2048 x 1024 at 128 tokens: 106 -> 121 GFLOP/s). Tiles take up to eight
 * tokens (DSIB_QROWS_DEFINE_RT8).
 */
#define DSIB_Q8_32_TILE_AVX512(NAME, BLK, WPAIR, SPAIR)                                    \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        DSIB_TILE_ACC_AVX512_();                                                           \
        const int64_t nb = n_in / 32;                                                      \
        const int8_t *xq_[8];                                                              \
        for (int t = 0; t < T; t++) xq_[t] = x[t].q;                                       \
        const ptrdiff_t oc_ = (const char *)x[0].c - (const char *)x[0].q;                 \
        const ptrdiff_t oe_ = (const char *)x[0].e - (const char *)x[0].q;                 \
        DSIB_PAIR_LOOP(nb, DSIB_Q8_32_PAIR_AVX512_, BLK, WPAIR, SPAIR);                    \
        DSIB_TILE_REDUCE_AVX512_(acc, out);                                                \
    }

#define DSIB_Q8_32_PAIR_AVX512_(p, half, set, BLK, WPAIR, SPAIR)                           \
    do {                                                                                   \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + 2 * (BLK) * (p);                     \
            DSIB_PF(PF, blk, 2 * (BLK));                                                   \
            const __m512 sw = SPAIR(blk, half);                                            \
            const __m512i wq = WPAIR(blk, half, 1);                                        \
            for (int t = 0; t < T; t++) {                                                  \
                const char *xb = (const char *)xq_[t] + 64 * (p);                          \
                const __m512i I = _mm512_dpbusd_epi32(                                     \
                    (half) ? _mm512_maskz_loadu_epi32(0x00FF, xb + oc_)                    \
                           : _mm512_loadu_si512(xb + oc_),                                 \
                    wq,                                                                    \
                    (half) ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xb)                    \
                           : _mm512_loadu_si512(xb));                                      \
                acc[r][t][set] = _mm512_fmadd_ps(                                          \
                    _mm512_mul_ps(sw, _mm512_loadu_ps((const float *)(const void *)(xb + oe_))), \
                    _mm512_cvtepi32_ps(I), acc[r][t][set]);                                \
            }                                                                              \
        }                                                                                  \
    } while (0)

/* Block pairs of nb blocks in order with their accumulator set (pair parity) and the lone
 * last block: PAIR(p, half, set, args...). */
#define DSIB_PAIR_LOOP(nb, PAIR, ...)                                                      \
    do {                                                                                   \
        int64_t p_ = 0;                                                                    \
        for (; 2 * p_ + 4 <= (nb); p_ += 2) {                                              \
            PAIR(p_, 0, 0, __VA_ARGS__);                                                   \
            PAIR(p_ + 1, 0, 1, __VA_ARGS__);                                               \
        }                                                                                  \
        if (2 * p_ + 2 <= (nb)) { /* p_ even: set 0 */                                     \
            PAIR(p_, 0, 0, __VA_ARGS__);                                                   \
            p_++;                                                                          \
        }                                                                                  \
        if (2 * p_ < (nb)) {                                                               \
            if (p_ & 1)                                                                    \
                PAIR(p_, 1, 1, __VA_ARGS__);                                               \
            else                                                                           \
                PAIR(p_, 1, 0, __VA_ARGS__);                                               \
        }                                                                                  \
    } while (0)

/* ---- shared by the further 256-element types (q4_k.c / q5_k.c, q6_k.c / q3_k.c,
 * iq2_xxs.c / iq3_xxs.c / iq2_xs.c / iq2_s.c / iq3_s.c) ----------------------------------------- */

/* The scales, mins and (d, dmin) of the N (1, 2 or 4) super-blocks at blk + BLK q, one per
 * 128-bit lane (lanes past N zero), laid out for dsib_kq4_scales_pair_avx512: s16a holds the
 * 16 unpacked words of the first in words 0-15 and of the second in words 16-31, s16b those
 * of the third and fourth — in each lane the operations of dsib_q4k_scales_sse (simd_avx2.h)
 * on that super-block's bytes, so the same values; dm = (d, dmin) of each in order (zero past
 * N). dsib_kq4_pair_avx512: the first two (the second when two). */
DSIB_AI void dsib_kq4_scales_avx512(const uint8_t *blk, size_t BLK, const int N, __m512i *s16a, __m512i *s16b,
                                    __m256 *dm) {
    __m512i v = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(blk + 4)));
    for (int q = 1; q < N; q++)
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(blk + BLK * (size_t)q + 4)), q);
    const __m512i p1 = _mm512_shuffle_epi8(
        v, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)));
    const __m512i lo = _mm512_and_si512(
        p1, _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)));
    const __m512i hn = _mm512_and_si512(
        _mm512_srli_epi16(p1, 4),
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    const __m512i p2 = _mm512_shuffle_epi8(
        v, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7)));
    const __m512i hi = _mm512_srli_epi16(_mm512_and_si512(p2, _mm512_set1_epi8((char)0xC0)), 2);
    const __m512i r = _mm512_or_si512(_mm512_or_si512(lo, hn), hi);
    *s16a = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r));
    *s16b = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(r, 1));
    int32_t hd[4] = {0, 0, 0, 0};
    for (int q = 0; q < N; q++) memcpy(&hd[q], blk + BLK * (size_t)q, 4);
    *dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)hd));
}
DSIB_AI void dsib_kq4_pair_avx512(const uint8_t *blk, size_t BLK, int two, __m512i *s16, __m128 *dm) {
    __m512i s16b;
    __m256 dm4;
    if (two)
        dsib_kq4_scales_avx512(blk, BLK, 2, s16, &s16b, &dm4);
    else
        dsib_kq4_scales_avx512(blk, BLK, 1, s16, &s16b, &dm4);
    *dm = _mm256_castps256_ps128(dm4);
}

/* All four: one decode for four super-blocks instead of two, which was about a fifth of
 * the Q4_K one-token tile's time from the caches (Zen 5, one core, from L2: Q4_K 33.5 -> 35.7
 * GB/s at 4096 columns, 33.5 -> 36.7 at 1024; docs/performance.md
 * 4.0000000000000000000000000). */
DSIB_AI void dsib_kq4_quad_avx512(const uint8_t *blk, size_t BLK, __m512i *s16a, __m512i *s16b, __m256 *dm) {
    dsib_kq4_scales_avx512(blk, BLK, 4, s16a, s16b, dm);
}

/* Super-block h (0, 1) of a pair from dsib_kq4_pair_avx512's s16 (activation order P =
 * 0,2,1,3,4,6,5,7): the scale pairs and mins of
 * dsib_kq_s_avx512 — lanes 0-7 / 8-15 of vectors 0, 1: sub-blocks P[0], P[2] / P[1], P[3];
 * of vectors 2, 3: P[4], P[6] / P[5], P[7] (vpermw over the 16 unpacked words: scales 0-7,
 * mins 8-15) — and the mins doubled up to match the activation sums per 16; the second
 * super-block's words are 16 further. */
DSIB_AI void dsib_kq4_scales_pair_avx512(__m512i s16, int h, __m512i sc[2], __m256i *mn) {
    const int o = 16 * h;
    sc[0] = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi32((o + 0) | ((o + 1) << 16)), _mm256_set1_epi32((o + 2) | ((o + 3) << 16)), 1),
        s16);
    sc[1] = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi32((o + 4) | ((o + 5) << 16)), _mm256_set1_epi32((o + 6) | ((o + 7) << 16)), 1),
        s16);
    *mn = _mm512_castsi512_si256(_mm512_permutexvar_epi16(
        _mm512_castsi256_si512(_mm256_setr_epi16(o + 8, o + 8, o + 9, o + 9, o + 10, o + 10, o + 11, o + 11, o + 12,
                                                 o + 12, o + 13, o + 13, o + 14, o + 14, o + 15, o + 15)),
        s16));
}

/* The whole AVX-512 tile of a 256-element type whose codes sit at an offset sharing the
 * scale d (Q6_K: q − 32, Q3_K: u − 4): DECODE(blk, wv, sc, &scw) gives the four code vectors
 * (unsigned), the scale pairs of dsib_kq_s_avx512 and the 16 signed scales as int16; the
 * offset 2^SH goes through the activation sums per 16, so S − (M << SH) is one exact integer
 * and each super-block one fmaf per lane with d (f16 at byte DOFF) · dx. */
#define DSIB_KQO_TILE_AVX512(NAME, BLK, DECODE, DOFF, SH)                                  \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        DSIB_TILE_ACC_AVX512_();                                                           \
        const int64_t nb = n_in / 256;                                                     \
        const __m512i z = _mm512_setzero_si512();                                          \
        DSIB_KQ_XBASE_();                                                                  \
        for (int64_t b2 = 0; b2 < nb; b2 += 2)                                             \
        _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {                              \
            const int64_t b = b2 + u;                                                      \
            if (b >= nb) break;                                                            \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk = w + (size_t)r * rb + (BLK) * b;                       \
                DSIB_PF(PF, blk, BLK);                                                     \
                __m512i wv[4], sc[2];                                                      \
                __m256i scw;                                                               \
                DECODE(blk, wv, sc, &scw);                                                 \
                const float d = dsib_f16_hw(blk + (DOFF));                                 \
                for (int t = 0; t < T; t++) {                                              \
                    const int8_t *xq = DSIB_KQ_XQ_(t, b);                                  \
                    __m512i I[4];                                                          \
                    for (int v = 0; v < 4; v++)                                            \
                        I[v] = _mm512_dpbusd_epi32(z, wv[v], _mm512_loadu_si512(xq + 64 * v)); \
                    __m512i S = _mm512_dpwssd_epi32(                                       \
                        z, _mm512_mask_blend_epi16(0xAAAAAAAAu, I[0], _mm512_slli_epi32(I[1], 16)), sc[0]); \
                    S = _mm512_dpwssd_epi32(                                               \
                        S, _mm512_mask_blend_epi16(0xAAAAAAAAu, I[2], _mm512_slli_epi32(I[3], 16)), sc[1]); \
                    const __m256i M =                                                      \
                        _mm256_madd_epi16(scw, _mm256_loadu_si256((const __m256i *)(const void *)DSIB_KQ_XS_(t, b))); \
                    S = _mm512_sub_epi32(S, _mm512_zextsi256_si512(_mm256_slli_epi32(M, SH))); \
                    acc[r][t][u] = _mm512_fmadd_ps(_mm512_set1_ps(d * DSIB_KQ_XD_(t, b)),  \
                                                   _mm512_cvtepi32_ps(S), acc[r][t][u]);   \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        DSIB_TILE_REDUCE_AVX512_(acc, out);                                                \
    }

/* The odd scales 2·(w >> 28) + 1 of dsib_iq_signs_avx512 (sub-block s at dword 2s); the
 * pairs (s, s + 2) in one dword: s = 0, 1 → sc[0], s = 4, 5 → sc[1]. */
DSIB_AI void dsib_iq_scales_avx512(__m512i w, __m512i sc[2]) {
    const __m512i o = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(w, 28), 1), _mm512_set1_epi64(1));
    const __m512i pr = _mm512_or_si512(o, _mm512_slli_epi64(_mm512_alignr_epi32(o, o, 4), 16));
    sc[0] = _mm512_permutexvar_epi32(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), pr);
    sc[1] = _mm512_permutexvar_epi32(_mm512_set_epi32(10, 10, 10, 10, 10, 10, 10, 10, 8, 8, 8, 8, 8, 8, 8, 8), pr);
}

/* IQ2_XS / IQ2_S: the 16 odd scales 2·ls + 1 of the eight scale bytes at p (ls of the
 * 16-element group n = nibble n mod 2 of p[n / 2]) as the scale pairs of
 * DSIB_IQ_TILE_AVX512: lane j of vector v lies in group 4v + j/4, so dword j of sc[0] holds
 * groups (j/4, j/4 + 4), of sc[1] groups (j/4 + 8, j/4 + 12) — one pshufb each from the
 * 16 scale bytes in every 128-bit lane (j/4 is the lane). */
DSIB_AI void dsib_iq_scales16_avx512(const uint8_t *p, __m512i sc[2]) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p), m = _mm_set1_epi8(15);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    const __m512i o = _mm512_broadcast_i32x4(_mm_or_si128(_mm_add_epi8(n, n), _mm_set1_epi8(1)));
#define DSIB_SC16_(a) (int)(0x80008000u | (a) | ((a) + 4) << 16)
#define DSIB_SC16_L_(a) DSIB_SC16_(a), DSIB_SC16_(a), DSIB_SC16_(a), DSIB_SC16_(a)
    sc[0] = _mm512_shuffle_epi8(
        o, _mm512_set_epi32(DSIB_SC16_L_(3), DSIB_SC16_L_(2), DSIB_SC16_L_(1), DSIB_SC16_L_(0)));
    sc[1] = _mm512_shuffle_epi8(
        o, _mm512_set_epi32(DSIB_SC16_L_(11), DSIB_SC16_L_(10), DSIB_SC16_L_(9), DSIB_SC16_L_(8)));
#undef DSIB_SC16_L_
#undef DSIB_SC16_
}

/* Byte ix[i] of a 256-byte table (a 64-byte-aligned uint8_t[256], looked at as four
 * registers): vpermi2b on 128 entries twice, one blend by index bit 7 (b7 =
 * _mm512_movepi8_mask(ix), shared when several tables are looked up with the same ix).
 * AVX512_VBMI: a macro, so that it expands inside the caller's VBMI target region (this
 * header is compiled under the VNNI target). iq2_xxs.c, iq3_xxs.c. */
#define DSIB_LUT256_VBMI(table, ix, b7)                                                       \
    _mm512_mask_blend_epi8((b7),                                                           \
                           _mm512_permutex2var_epi8(((const __m512i *)(const void *)(table))[0], (ix), \
                                                    ((const __m512i *)(const void *)(table))[1]), \
                           _mm512_permutex2var_epi8(((const __m512i *)(const void *)(table))[2], (ix), \
                                                    ((const __m512i *)(const void *)(table))[3]))

/* The 16-bit codes of a 512-entry grid held in sixteen registers (tab[2m], tab[2m + 1]:
 * entries 64m .. 64m + 63) for the 9-bit indices in the 32 words of iw (bits 0-7; bit 8 of
 * word k is bit k of b8, bits above 7 of iw are ignored): vpermi2w on bits 0-5 in each of
 * the eight register pairs, then blends by bits 6, 7 and 8. Plain AVX-512 BW. */
DSIB_AI __m512i dsib_iq_codes512(const __m512i *tab, __m512i iw, __mmask32 b8) {
    const __mmask32 b6 = _mm512_test_epi16_mask(iw, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(iw, _mm512_set1_epi16(128));
    __m512i l[4];
    for (int m = 0; m < 4; m++)
        l[m] = _mm512_mask_blend_epi16(b6, _mm512_permutex2var_epi16(tab[4 * m], iw, tab[4 * m + 1]),
                                       _mm512_permutex2var_epi16(tab[4 * m + 2], iw, tab[4 * m + 3]));
    return _mm512_mask_blend_epi16(b8, _mm512_mask_blend_epi16(b7, l[0], l[1]),
                                   _mm512_mask_blend_epi16(b7, l[2], l[3]));
}

/* dsib_iq_codes512 for a 1024-entry grid (tab[0 .. 32): entries 64m .. 64m + 63 in
 * tab[2m], tab[2m + 1]; index bits 8 and 9 of word k: bit k of b8, b9). */
DSIB_AI __m512i dsib_iq_codes1024(const __m512i *tab, __m512i iw, __mmask32 b8, __mmask32 b9) {
    const __mmask32 b6 = _mm512_test_epi16_mask(iw, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(iw, _mm512_set1_epi16(128));
    __m512i l[8];
    for (int m = 0; m < 8; m++)
        l[m] = _mm512_mask_blend_epi16(b6, _mm512_permutex2var_epi16(tab[4 * m], iw, tab[4 * m + 1]),
                                       _mm512_permutex2var_epi16(tab[4 * m + 2], iw, tab[4 * m + 3]));
    for (int m = 0; m < 4; m++) l[m] = _mm512_mask_blend_epi16(b7, l[2 * m], l[2 * m + 1]);
    return _mm512_mask_blend_epi16(b9, _mm512_mask_blend_epi16(b8, l[0], l[1]),
                                   _mm512_mask_blend_epi16(b8, l[2], l[3]));
}

/* IQ2_XXS / IQ3_XXS signs and scales of a super-block from its eight w (w_s in the low
 * dword of qword s): the four 7-bit sign fields of each w spread to bytes, each byte's bit 7
 * its parity (ksigns's rule), the bytes tested against a bit pattern into the vectors'
 * 64-bit masks (vector v = sub-blocks 2v, 2v+1); the odd scales 2·(w >> 28) + 1 as the
 * scale pairs of dsib_kq_s_avx512's layout (vectors 0 / 1, 2 / 3; lanes 0-7 even
 * sub-blocks, 8-15 odd ones). */
DSIB_AI void dsib_iq_signs_avx512(__m512i w, __mmask64 ng[4], __m512i sc[2]) {
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
    dsib_iq_scales_avx512(w, sc);
}

/* The four 64-bit sign masks of an IQ super-block (vector v's: qword v of m, bit k = byte k
 * of that vector negated) from the 32 sign bytes in m. */
DSIB_AI void dsib_iq_masks_avx512(__m256i m, __mmask64 ng[4]) {
    ng[0] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(_mm256_castsi256_si128(m)));
    ng[1] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(_mm256_castsi256_si128(m), 1));
    ng[2] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(_mm256_extracti128_si256(m, 1)));
    ng[3] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(_mm256_extracti128_si256(m, 1), 1));
}

/* The whole AVX-512 tile of IQ2_XXS / IQ3_XXS (canonical order in iq2_xxs.c): GRID(blk, g)
 * gives the four vectors of unsigned grid bytes, SIGNS(blk, ng, sc) the sign masks and
 * scale pairs; the signs go onto the activation bytes; y = FIN · the reduction. */
#define DSIB_IQ_TILE_AVX512(NAME, BLK, GRID, SIGNS, FIN)                                   \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m512 acc[4][4][2]; /* [row][token][set] */                                       \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();  \
        const int64_t nb = n_in / 256;                                                     \
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
                GRID(blk, g);                                                              \
                SIGNS(blk, ng, sc);                                                        \
                const float d = dsib_f16_hw(blk);                                          \
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
                out[r * T + t] = (FIN) * dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]); \
    }


/* ---- the K-quants' block-sum order, one row at a time (q4_k.c) -------------------------
 * From a super-block's exact lanes against one token — Sv (sixteen int32 lanes adding up to
 * S_b, e.g. dsib_kq_s_avx512) and Mv (eight adding up to M_b, the mins against the sums per
 * 16) — the two chain steps acc = fmaf(-(dmin·dx), M_b, acc), acc = fmaf(d·dx, S_b, acc) in
 * lane 0 of acc. A pair of super-blocks shares one horizontal-add tree (one tree per
 * super-block measured 17.4 against 18.3 GB/s from the caches, Q4_K one core); dmx holds
 * (d0·dx0, dmin0·dx0, d1·dx1, dmin1·dx1), each product one f32 rounding. */
DSIB_AI __m128 dsib_kq_bs_pair_steps(__m128 acc, __m512i S0v, __m256i M0v, __m512i S1v, __m256i M1v, __m128 dmx) {
    const __m256i s0 = _mm256_add_epi32(_mm512_castsi512_si256(S0v), _mm512_extracti64x4_epi64(S0v, 1));
    const __m256i s1 = _mm256_add_epi32(_mm512_castsi512_si256(S1v), _mm512_extracti64x4_epi64(S1v, 1));
    const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(M0v, M1v));
    const __m128 f = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1)));
    const __m128 g = _mm_shuffle_ps(dmx, dmx, _MM_SHUFFLE(3, 1, 2, 0)); /* as f: S0 S1 M0 M1 */
    acc = _mm_fnmadd_ss(_mm_movehl_ps(g, g), _mm_movehl_ps(f, f), acc);
    acc = _mm_fmadd_ss(g, f, acc);
    acc = _mm_fnmadd_ss(_mm_shuffle_ps(g, g, 3), _mm_shuffle_ps(f, f, 3), acc);
    return _mm_fmadd_ss(_mm_movehdup_ps(g), _mm_movehdup_ps(f), acc);
}
/* One super-block alone (an odd last one): dmx = (d·dx, dmin·dx, ...). */
DSIB_AI __m128 dsib_kq_bs_steps(__m128 acc, __m512i Sv, __m256i Mv, __m128 dmx) {
    const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(Sv), _mm512_extracti64x4_epi64(Sv, 1));
    const __m256i h = _mm256_hadd_epi32(s8, Mv);
    const __m256i h2 = _mm256_hadd_epi32(h, h);
    const __m128 f = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1)));
    acc = _mm_fnmadd_ss(_mm_movehdup_ps(dmx), _mm_movehdup_ps(f), acc);
    return _mm_fmadd_ss(dmx, f, acc);
}

/* ---- sixteen rows per register (the block-sum order's token tiles: q8_0.c, q4_k.c, q2_k.c) */

/* Dwords k (bit k of NEED set, k < 4) of the first 16 bytes of sixteen rows' block (row m at
 * sb + ro[m], ridx the same offsets as a vector) in the lanes: d[k] lane m = dword k of row m
 * (q8_0.c: the scale; q4_k.c: d, dmin and the scale bytes; q2_k.c: the scale bytes, and d,
 * dmin from bytes 68..83). With `gather` (dsib_kern_rows16_gather_on) one 16-lane gather
 * per dword; without, sixteen 16-byte loads and a transpose: Z_i holds rows i, 4 + i, 8 + i,
 * 12 + i in its 128-bit lanes, so two in-lane unpack steps leave lane 4j + i = row 4j + i.
 * The same values either way. Gathers are slow on AMD cores: Zen 5, one core, from L2, loads
 * against gathers — Q2_K one token 23.2-24.0 -> 29.7-30.7 GB/s, Q4_K four tokens 14.8-16.1
 * -> 15.6-17.5, Q8_0 one token 27.3-31.5 -> 32.8-34.6 (docs/performance.md
 * 4.0000000000000000000000000); on Intel the transpose's inserts and unpacks would add to the
 * shuffle port the tiles' transposes already load, so there the gathers stay (kernels.h). */
DSIB_AI void dsib_rows16_dwords_avx512(const uint8_t *sb, const int32_t *ro, __m512i ridx, int gather,
                                       const int NEED, __m512i d[4]) {
    if (gather) {
        for (int k = 0; k < 4; k++)
            if (NEED >> k & 1) d[k] = _mm512_i32gather_epi32(ridx, (const void *)(sb + 4 * k), 1);
        return;
    }
    __m512i Z[4];
    for (int i = 0; i < 4; i++) {
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(sb + ro[i])));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(const void *)(sb + ro[4 + i])), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(const void *)(sb + ro[8 + i])), 2);
        Z[i] = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(const void *)(sb + ro[12 + i])), 3);
    }
    const __m512i A = _mm512_unpacklo_epi32(Z[0], Z[1]), B = _mm512_unpackhi_epi32(Z[0], Z[1]);
    const __m512i C = _mm512_unpacklo_epi32(Z[2], Z[3]), D = _mm512_unpackhi_epi32(Z[2], Z[3]);
    d[0] = _mm512_unpacklo_epi64(A, C);
    d[1] = _mm512_unpackhi_epi64(A, C);
    d[2] = _mm512_unpacklo_epi64(B, D);
    d[3] = _mm512_unpackhi_epi64(B, D);
}

/* z[m] = [32 bytes of row m | the same 32 bytes of row m + 8] (m < 8) → W[c] whose lane m
 * holds bytes 4c..4c+3 of row m (m < 16): an 8 × 8 dword transpose per 256-bit half, 24
 * shuffles. z is clobbered. */
DSIB_AI void dsib_rows16_transpose_avx512(__m512i z[8], __m512i W[8]) {
    /* stage 3: qwords (0,1 of a, 0,1 of b, 4,5 of a, 4,5 of b) and the odd pairs the same */
    const __m512i sel_e = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i sel_o = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512i u[8];
    for (int k = 0; k < 4; k++) {
        u[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
        u[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) { /* rows 4k..4k+3: dwords (0,4), (1,5), (2,6), (3,7) */
        z[4 * k + 0] = _mm512_unpacklo_epi64(u[4 * k], u[4 * k + 2]);
        z[4 * k + 1] = _mm512_unpackhi_epi64(u[4 * k], u[4 * k + 2]);
        z[4 * k + 2] = _mm512_unpacklo_epi64(u[4 * k + 1], u[4 * k + 3]);
        z[4 * k + 3] = _mm512_unpackhi_epi64(u[4 * k + 1], u[4 * k + 3]);
    }
    for (int c = 0; c < 4; c++) {
        W[c] = _mm512_permutex2var_epi64(z[c], sel_e, z[4 + c]);
        W[c + 4] = _mm512_permutex2var_epi64(z[c], sel_o, z[4 + c]);
    }
}

/* Prefetch plan of a sixteen-row group (speed only): with `on` (the call's first token tile,
 * the one that reads the weights cold) each row's block is prefetched in the next group, 16
 * rows on, into L2 as it is read here (the far level), and each row ahead in itself into L1
 * (the near level): half the one-row kernels' distance in the first group of the call, and
 * DSIB_PF16_NEAR in the later groups of calls of at most eight tokens (the cold reads of
 * decode and batched decode; Q8_0, 2 threads, 2048 x 1024 from memory, with the next group
 * to L2: one token 25.0-26.2 -> 27.2-28.2 GB/s, four 22.3 -> 24.1, eight 18.5 -> 19.1;
 * docs/performance.md 4.000000000000000000000000). Later token tiles re-read the group from
 * L1 / L2. */
typedef struct dsib_pf16 {
    size_t next;   /* bytes to the same block of the next group's row; 0: none */
    int32_t ahead; /* bytes ahead in the row itself; 0: none */
} dsib_pf16;

/* The prefetches of one block step of a sixteen-row group (K-quant tiles): the `lines`
 * 64-byte lines from each row's block at sb + ro[m], pf.ahead on in the row (to L1) and in
 * the next group (pf.next, to L2 with prefetcht2 — t1 and t2 act alike on these cores — which
 * measured 12.5 against 12.0 GB/s for Q4_K from memory at one token, to L1). */
DSIB_AI void dsib_pf16_block(const uint8_t *sb, const int32_t *ro, dsib_pf16 pf, int lines) {
    for (int m = 0; m < 16; m++) {
        const uint8_t *blk = sb + (size_t)ro[m];
        for (int l = 0; l < lines; l++) {
            if (pf.ahead > 0) __builtin_prefetch(blk + pf.ahead + 64 * l, 0, 3);
            if (pf.next) __builtin_prefetch(blk + pf.next + 64 * l, 0, 1);
        }
    }
}

/* The int32 at p in every lane. */
DSIB_AI __m512i dsib_bcast32_avx512(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* T tokens over a group of 16 rows (row offsets ridx / ro from wg, M of them real), nb blocks:
 * y[t][0..M). */
typedef void (*dsib_tile16_fn)(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                               const dsib_qrow *x, float *const *y, dsib_pf16 pf);

/* NAME##T (T = 2..8): the dsib_tile16_fn of FN(wg, ro, ridx, nb, M, x, y, pf, T), whose token
 * count is then a constant. */
#define DSIB_TILE16_T_(NAME, FN, TT)                                                       \
    static void NAME##TT(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M, \
                         const dsib_qrow *x, float *const *y, dsib_pf16 pf) {              \
        FN(wg, ro, ridx, nb, M, x, y, pf, TT);                                             \
    }
#define DSIB_TILE16_2TO8(NAME, FN)                                                         \
    DSIB_TILE16_T_(NAME, FN, 2)                                                            \
    DSIB_TILE16_T_(NAME, FN, 3)                                                            \
    DSIB_TILE16_T_(NAME, FN, 4)                                                            \
    DSIB_TILE16_T_(NAME, FN, 5)                                                            \
    DSIB_TILE16_T_(NAME, FN, 6)                                                            \
    DSIB_TILE16_T_(NAME, FN, 7)                                                            \
    DSIB_TILE16_T_(NAME, FN, 8)

/* Rows [o0, o1) of n tokens in groups of 16 rows (the last one short, its missing rows read
 * row 0 of the group and not stored), each group through tiles[T] for the call's tokens
 * eight at a time and then the rest, so the group stays in the caches for its later tiles. */
DSIB_AI void dsib_rows16_avx512(const uint8_t *w, size_t rb, int64_t nb, int64_t o0, int64_t o1,
                                const dsib_qrow *x, float *const *yp, int n, const dsib_tile16_fn tiles[9]) {
    for (int64_t r0 = o0; r0 < o1; r0 += 16) {
        const int M = o1 - r0 < 16 ? (int)(o1 - r0) : 16;
        int32_t ro[16];
        for (int m = 0; m < 16; m++) ro[m] = m < M ? (int32_t)((size_t)m * rb) : 0;
        const __m512i ridx = _mm512_loadu_si512(ro);
        const uint8_t *wg = w + (size_t)r0 * rb;
        for (int t0 = 0; t0 < n;) {
            const int T = n - t0 < 8 ? n - t0 : 8;
            const int use = t0 == 0 && dsib_kern_prefetch > 0;
            dsib_pf16 pf;
            pf.next = use && o1 - (r0 + 16) > 0 ? 16 * rb : 0;
            pf.ahead = !use ? 0 : r0 == o0 ? dsib_kern_prefetch / 2 : n <= 8 ? DSIB_PF16_NEAR : 0;
            float *yt[8];
            for (int t = 0; t < T; t++) yt[t] = yp[t0 + t] + r0;
            tiles[T](wg, ro, ridx, nb, M, x + t0, yt, pf);
            t0 += T;
        }
    }
}

/* The AVX-512 row function NAME of a 256-element type in the block-sum order (q4_k.c,
 * q2_k.c): one-token calls on rows of more than T1_ABOVE columns through ROW_T1 (rows one or
 * four at a time: one sequential stream), all others through the sixteen-row token tiles
 * TILE(wg, ro, ridx, nb, M, x, y, pf, T). */
#define DSIB_KQ_BS_ROWS_AVX512_(NAME, TILE, ROW_T1, T1_ABOVE)                              \
    DSIB_TILE16_T_(TILE, TILE, 1)                                                          \
    DSIB_TILE16_2TO8(TILE, TILE)                                                           \
    static void NAME(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,    \
                     const dsib_qrow *x, float *const *yp, int n) {                        \
        static const dsib_tile16_fn tiles[9] = {NULL,    TILE##1, TILE##2, TILE##3, TILE##4, \
                                                TILE##5, TILE##6, TILE##7, TILE##8};       \
        if (n == 1 && n_in > (T1_ABOVE))                                                   \
            ROW_T1(w, rb, n_in, o0, o1, x, yp, 1);                                         \
        else                                                                               \
            dsib_rows16_avx512(w, rb, n_in / 256, o0, o1, x, yp, n, tiles);                \
    }
DSIB_AI void dsib_kq_no_t1(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                           const dsib_qrow *x, float *const *yp, int pf) {
    (void)w, (void)rb, (void)n_in, (void)o0, (void)o1, (void)x, (void)yp, (void)pf;
}
/* q4_k.c: rows of at most two super-blocks take the sixteen-row tiles on one token too. Their
 * rows four at a time spent about as long per row (scale decode, two super-blocks' lanes, the
 * final steps) as the rows of four super-blocks did (Zen 5, one core, Q4_K from L2: 2048 x 512
 * 19.6-20.6 GB/s against 35 at 1024 columns); the sixteen-row tile measured 36.8 there, and
 * from memory with two threads 8192 x 512 31.3-32.4 -> 34.0-34.9 GB/s. At 1024 columns the
 * four-row tiles stay ahead from memory (512 x 1024, two threads: 27.2-28.4 against
 * 22.2-23.1 GB/s through the sixteen-row tiles; docs/performance.md
 * 4.00000000000000000000000000). */
#define DSIB_KQ_BS_ROWS_AVX512(NAME, TILE, ROW_T1) DSIB_KQ_BS_ROWS_AVX512_(NAME, TILE, ROW_T1, 512)
/* The same with one-token calls through the sixteen-row tiles too (q2_k.c: its super-blocks
 * are short, so the lanes' reduction per row and super-block cost more than sixteen streams). */
#define DSIB_KQ_BS_ROWS16_AVX512(NAME, TILE) DSIB_KQ_BS_ROWS_AVX512_(NAME, TILE, dsib_kq_no_t1, INT64_MAX)

#endif
