/*
 * MXFP4 weights × DSIB_ACT_Q8_32 activations (default path; kernels.h).
 *
 * Each E2M1 nibble becomes the exact int8 2·e2m1 (dsib_e2m1x2_tab: 0, ±1, ±2, ±3, ±4, ±6,
 * ±8, ±12) and the block scale is halved, sw_b = 2^(e-128) (exact, dsib_e8m0_half_to_f32).
 * Element order inside a block is natural (i < 16: low nibble of qs[i]; i >= 16: high
 * nibble of qs[i - 16]).
 *
 * Canonical order (every ISA, bit-identical): exactly Q8_0's (q8_0.c) with these weights
 * and scales (pair p = b / 2 goes to set p mod 2):
 *
 *   I_b[j] = Σ_{k<4} w[32b + 4j + k] · q[32b + 4j + k]        j < 8 (exact)
 *   acc[p mod 2][8·(b mod 2) + j] = fmaf(sw_b · dx_b, (float)I_b[j], acc[p mod 2][8·(b mod 2) + j])
 *
 * then y = dsib_reduce32(acc).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* dsib_e8m0_half_to_f32 of every scale byte, as f32 bit patterns (the SIMD paths load it). */
#define H(e) ((e) == 255 ? 0x7fc00000u : (e) == 0 ? 0x00200000u : (e) == 1 ? 0x00400000u : ((uint32_t)(e) - 1u) << 23)
static const uint32_t e8m0_half_bits[256] = {
    H(0), H(1), H(2), H(3), H(4), H(5), H(6), H(7), H(8), H(9), H(10), H(11), H(12), H(13), H(14), H(15),
    H(16), H(17), H(18), H(19), H(20), H(21), H(22), H(23), H(24), H(25), H(26), H(27), H(28), H(29), H(30), H(31),
    H(32), H(33), H(34), H(35), H(36), H(37), H(38), H(39), H(40), H(41), H(42), H(43), H(44), H(45), H(46), H(47),
    H(48), H(49), H(50), H(51), H(52), H(53), H(54), H(55), H(56), H(57), H(58), H(59), H(60), H(61), H(62), H(63),
    H(64), H(65), H(66), H(67), H(68), H(69), H(70), H(71), H(72), H(73), H(74), H(75), H(76), H(77), H(78), H(79),
    H(80), H(81), H(82), H(83), H(84), H(85), H(86), H(87), H(88), H(89), H(90), H(91), H(92), H(93), H(94), H(95),
    H(96), H(97), H(98), H(99), H(100), H(101), H(102), H(103), H(104), H(105), H(106), H(107), H(108), H(109), H(110), H(111),
    H(112), H(113), H(114), H(115), H(116), H(117), H(118), H(119), H(120), H(121), H(122), H(123), H(124), H(125), H(126), H(127),
    H(128), H(129), H(130), H(131), H(132), H(133), H(134), H(135), H(136), H(137), H(138), H(139), H(140), H(141), H(142), H(143),
    H(144), H(145), H(146), H(147), H(148), H(149), H(150), H(151), H(152), H(153), H(154), H(155), H(156), H(157), H(158), H(159),
    H(160), H(161), H(162), H(163), H(164), H(165), H(166), H(167), H(168), H(169), H(170), H(171), H(172), H(173), H(174), H(175),
    H(176), H(177), H(178), H(179), H(180), H(181), H(182), H(183), H(184), H(185), H(186), H(187), H(188), H(189), H(190), H(191),
    H(192), H(193), H(194), H(195), H(196), H(197), H(198), H(199), H(200), H(201), H(202), H(203), H(204), H(205), H(206), H(207),
    H(208), H(209), H(210), H(211), H(212), H(213), H(214), H(215), H(216), H(217), H(218), H(219), H(220), H(221), H(222), H(223),
    H(224), H(225), H(226), H(227), H(228), H(229), H(230), H(231), H(232), H(233), H(234), H(235), H(236), H(237), H(238), H(239),
    H(240), H(241), H(242), H(243), H(244), H(245), H(246), H(247), H(248), H(249), H(250), H(251), H(252), H(253), H(254), H(255),
};
#undef H

/* ---- scalar ---------------------------------------------------------------------------- */

static float mxfp4_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 17 * b;
        const float s = dsib_e8m0_half_to_f32(blk[0]) * x->d[b];
        int8_t wq[32];
        for (int i = 0; i < 16; i++) {
            wq[i] = dsib_e2m1x2_tab[blk[1 + i] & 15];
            wq[16 + i] = dsib_e2m1x2_tab[blk[1 + i] >> 4];
        }
        const int8_t *xq = x->q + 32 * b;
        float *a = acc[(b >> 1) & 1] + 8 * (b & 1);
        for (int j = 0; j < 8; j++) {
            int32_t I = 0;
            for (int k = 0; k < 4; k++) I += wq[4 * j + k] * xq[4 * j + k];
            a[j] = fmaf(s, (float)I, a[j]);
        }
    }
    return dsib_reduce32(acc);
}

static void mxfp4_rows_scalar(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                              const dsib_qrow *x, float *const *yp, int n) {
    for (int64_t o = o0; o < o1; o++)
        for (int t = 0; t < n; t++) yp[t][o] = mxfp4_dot_scalar(w + (size_t)o * rb, n_in, &x[t]);
}

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* 32 nibbles of one block → 32 int8 (2·e2m1) in element order */
DSIB_AI __m256i mxfp4_block_avx2(const uint8_t *qs, __m256i lut) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i n = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)),
                                       _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(lut, n);
}

DSIB_AI void mxfp4_tile_avx2(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                             float *out, const int R, const int T) {
    __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =
                _mm256_setzero_ps();
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dsib_e2m1x2_tab));
    const int64_t nb = n_in / 32;
#define MXFP4_BLOCK_AVX2(b, set, h)                                                        \
    do {                                                                                   \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + 17 * (b);                            \
            const __m256i wq = mxfp4_block_avx2(blk + 1, lut);                             \
            const float sw = dsib_u32_as_f32(e8m0_half_bits[blk[0]]);                      \
            for (int t = 0; t < T; t++) {                                                  \
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + 32 * (b))); \
                const __m256 s = _mm256_set1_ps(sw * x[t].d[b]);                           \
                acc[r][t][set][h] = _mm256_fmadd_ps(                                       \
                    s, _mm256_cvtepi32_ps(dsib_dot_s8s8_avx2(wq, xq)), acc[r][t][set][h]); \
            }                                                                              \
        }                                                                                  \
    } while (0)
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        MXFP4_BLOCK_AVX2(b, 0, 0);
        MXFP4_BLOCK_AVX2(b + 1, 0, 1);
        MXFP4_BLOCK_AVX2(b + 2, 1, 0);
        MXFP4_BLOCK_AVX2(b + 3, 1, 1);
    }
    if (b < nb) MXFP4_BLOCK_AVX2(b, 0, 0);
    if (b + 1 < nb) MXFP4_BLOCK_AVX2(b + 1, 0, 1);
    if (b + 2 < nb) MXFP4_BLOCK_AVX2(b + 2, 1, 0);
#undef MXFP4_BLOCK_AVX2
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1], acc[r][t][1][0],
                                                acc[r][t][1][1]);
}

DSIB_QROWS_DEFINE_T(mxfp4_rows_avx2, mxfp4_tile_avx2, 2, 1)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Blocks A and B (B = NULL: upper half zero) → 64 bytes in element order [A 0-31, B 0-31]:
 * the looked-up values of lut (for each nibble). */
DSIB_AI __m512i mxfp4_pair_avx512(const uint8_t *qa, const uint8_t *qb, __m512i lut) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa));
    const __m512i v =
        qb ? _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb)), 1)
           : _mm512_zextsi256_si512(a);
    const __m512i n = _mm512_and_si512(
        _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
    return _mm512_shuffle_epi8(lut, n);
}

/* As q8_0.c's AVX-512 kernel (same offsets and lane start values): for T = 1 the table
 * gives 2·e2m1 + 128 (unsigned) directly; for T > 1 the signed values. */
DSIB_AI void mxfp4_tile_avx512(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                               float *out, const int R, const int T) {
    __m512 acc[4][4][2]; /* [row][token][set] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
    const int64_t nb = n_in / 32;
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    const __m512i lut_s = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dsib_e2m1x2_tab));
    const __m512i lut = T == 1 ? _mm512_add_epi8(lut_s, c128) : lut_s;
#define MXFP4_PAIR_AVX512(p, half, set)                                                        \
    do {                                                                                   \
        __m512 dx[4];                                                                      \
        __m512i xq[4];                                                                     \
        for (int t = 0; t < T; t++) {                                                      \
            dx[t] = _mm512_loadu_ps(x[t].e + 16 * (p)); /* upper half 0 when half */  \
            xq[t] = half ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, x[t].q + 64 * (p))       \
                         : _mm512_loadu_si512(x[t].q + 64 * (p));                          \
            if (T > 1) xq[t] = _mm512_xor_si512(xq[t], c128);                              \
        }                                                                                  \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + 34 * (p);                            \
            const __m512i wq = mxfp4_pair_avx512(blk + 1, half ? NULL : blk + 18, lut);    \
            const float *sa = (const float *)(const void *)&e8m0_half_bits[blk[0]];        \
            const __m512 sw = half ? _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(*sa))      \
                                   : dsib_pair_ps(sa, (const float *)(const void *)         \
                                                          &e8m0_half_bits[blk[17]]);      \
            if (T == 1) {                                                                  \
                const __m512i I = _mm512_dpbusd_epi32(                                     \
                    half ? _mm512_maskz_loadu_epi32(0x00FF, x[0].c + 16 * (p))             \
                         : _mm512_loadu_si512(x[0].c + 16 * (p)),                          \
                    wq, xq[0]);                                                            \
                acc[r][0][set] = _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[0]),                 \
                                                 _mm512_cvtepi32_ps(I), acc[r][0][set]);   \
            } else {                                                                       \
                const __m512i neg = _mm512_sub_epi32(                                      \
                    _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, wq)); \
                for (int t = 0; t < T; t++) {                                              \
                    const __m512i I = _mm512_dpbusd_epi32(neg, xq[t], wq);                 \
                    acc[r][t][set] = _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[t]),             \
                                                     _mm512_cvtepi32_ps(I), acc[r][t][set]); \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    } while (0)
    int64_t p = 0;
    for (; 2 * p + 4 <= nb; p += 2) {
        MXFP4_PAIR_AVX512(p, 0, 0);
        MXFP4_PAIR_AVX512(p + 1, 0, 1);
    }
    if (2 * p + 2 <= nb) { /* p even: set 0 */
        MXFP4_PAIR_AVX512(p, 0, 0);
        p++;
    }
    if (2 * p < nb) {
        if (p & 1)
            MXFP4_PAIR_AVX512(p, 1, 1);
        else
            MXFP4_PAIR_AVX512(p, 1, 0);
    }
#undef MXFP4_PAIR_AVX512
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);
}

DSIB_QROWS_DEFINE(mxfp4_rows_avx512, mxfp4_tile_avx512)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_mxfp4 = {
    DSI_TYPE_MXFP4, DSIB_ACT_Q8_32, {mxfp4_rows_scalar, mxfp4_rows_avx2, NULL, mxfp4_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_mxfp4 = {DSI_TYPE_MXFP4, DSIB_ACT_Q8_32, {mxfp4_rows_scalar}};

#endif
