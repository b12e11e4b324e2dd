/*
 * MXFP4 weights × DSIB_ACT_Q8_32 activations (default path; kernels.h).
 *
 * Each E2M1 nibble becomes the exact int8 2·e2m1 (dsib_e2m1x2_tab: 0, ±1, ±2, ±3, ±4, ±6,
 * ±8, ±12) and the block scale is halved, sw_b = 2^(e-128) (exact, dsib_e8m0_half_to_f32).
 * Element order inside a block is natural (i < 16: low nibble of qs[i]; i >= 16: high
 * nibble of qs[i - 16]).
 *
 * Canonical order (every ISA, bit-identical): the Q8_32 lane order (kernels_impl.h) with these weights
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
        dsib_q8_32_step_scalar(acc, b, s, wq, xq);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(mxfp4_rows_scalar, mxfp4_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* 32 nibbles of one block → 32 int8 (2·e2m1) in element order */
DSIB_AI __m256i mxfp4_block_avx2(const uint8_t *qs) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)dsib_e2m1x2_tab));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i n = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)),
                                       _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(lut, n);
}
#define MXFP4_WBLK(blk) mxfp4_block_avx2((blk) + 1)
#define MXFP4_SBLK(blk) dsib_u32_as_f32(e8m0_half_bits[(blk)[0]])
DSIB_Q8_32_TILE_AVX2(mxfp4_tile_avx2, 17, MXFP4_WBLK, MXFP4_SBLK)

DSIB_QROWS_DEFINE_T4(mxfp4_rows_avx2, mxfp4_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* The weights of a block pair (the second block's zero when half) as 2·e2m1, + 128 when u
 * (straight from the table). */
DSIB_AI __m512i mxfp4_pair_avx512(const uint8_t *blk, int half, int u) {
    const __m512i lut_s = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dsib_e2m1x2_tab));
    const __m512i lut = u ? _mm512_add_epi8(lut_s, _mm512_set1_epi8((char)0x80)) : lut_s;
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 1)));
    const __m512i v =
        half ? _mm512_zextsi256_si512(a)
             : _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                  _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 18))), 1);
    const __m512i n = _mm512_and_si512(
        _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
    return _mm512_shuffle_epi8(lut, n); /* a zero upper half looks up lut[0] (0 or 128), which
                                          the zero activations of that half cancel */
}
#define MXFP4_WPAIR(blk, half, u) mxfp4_pair_avx512(blk, half, u)
#define MXFP4_SPAIR(blk, half)                                                             \
    ((half) ? _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(dsib_u32_as_f32(e8m0_half_bits[(blk)[0]]))) \
            : dsib_pair_ps((const float *)(const void *)&e8m0_half_bits[(blk)[0]],          \
                           (const float *)(const void *)&e8m0_half_bits[(blk)[17]]))
DSIB_Q8_32_TILE_AVX512(mxfp4_tile_avx512, 17, MXFP4_WPAIR, MXFP4_SPAIR)

DSIB_QROWS_DEFINE_RT8(mxfp4_rows_avx512, mxfp4_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_mxfp4 = {
    DSI_TYPE_MXFP4, DSIB_ACT_Q8_32, {mxfp4_rows_scalar, mxfp4_rows_avx2, NULL, mxfp4_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_mxfp4 = {DSI_TYPE_MXFP4, DSIB_ACT_Q8_32, {mxfp4_rows_scalar}};

#endif
