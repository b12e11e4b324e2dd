/*
 * Q2_K weights × DSIB_ACT_Q8_K_P2 activations (default path; kernels.h).
 *
 * The activation row stores each 256-block's 32-element groups in the order
 * P = (0,4,1,5,2,6,3,7), which is how Q2_K packs its 2-bit fields: 64-byte vector s (s < 4)
 * = field s of qs[0..64), i.e. natural groups s (bytes 0-31) and 4+s (bytes 32-63) — the
 * same 64 bytes of the activation row. Its 16-byte quarters are the 16-element sub-blocks
 * g(s, 0..3) = 2s, 2s+1, 8+2s, 9+2s (scale = low nibble, min = high nibble of sc[g]).
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2) (d, dmin f16; dx activation scale; bs[] activation sums per
 * 16 natural elements):
 *
 *   S[j] = Σ_{s<4} (sc[g(s, j/4)] & 15) · Σ_{k<4} q_s[4j+k] · x_s[4j+k]    j < 16 (exact)
 *   M[j] = (sc[2j] >> 4) · bs[2j] + (sc[2j+1] >> 4) · bs[2j+1]             j < 8  (exact)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            j < 16
 *   acc[u][j] = fmaf(-(dmin·dx), (float)M[j], acc[u][j])      j < 8
 *
 * then y = dsib_reduce32(acc).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float q2_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        float *a = acc[b & 1];
        const uint8_t *blk = row + 84 * b, *sc = blk, *qs = blk + 16;
        const int8_t *xq = x->q + 256 * b;
        const int16_t *bs = x->s + 16 * b;
        int32_t S[16] = {0}, M[8];
        for (int s = 0; s < 4; s++) {
            for (int j = 0; j < 16; j++) {
                static const int gq[4] = {0, 1, 8, 9};
                int32_t I = 0;
                for (int k = 0; k < 4; k++)
                    I += ((qs[4 * j + k] >> (2 * s)) & 3) * xq[64 * s + 4 * j + k];
                S[j] += (sc[2 * s + gq[j / 4]] & 15) * I;
            }
        }
        for (int j = 0; j < 8; j++) M[j] = (sc[2 * j] >> 4) * bs[2 * j] + (sc[2 * j + 1] >> 4) * bs[2 * j + 1];
        const float dd = dsib_ld_f16(blk + 80) * x->d[b], dm = dsib_ld_f16(blk + 82) * x->d[b];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
        for (int j = 0; j < 8; j++) a[j] = fmaf(-dm, (float)M[j], a[j]);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q2_k_rows_scalar, q2_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Super-block decode for DSIB_KQ_TILE_AVX2: position p = 2s + h is field s of
 * qs[32h..32h+32), sub-blocks 8h + 2s (bytes 0-15) and 8h + 2s + 1 (bytes 16-31); PREP = the
 * 16 scale nibbles in both lanes. */
DSIB_AI __m256i q2_k_prep_avx2(const uint8_t *blk) {
    const __m128i scb = _mm_loadu_si128((const __m128i *)blk);
    return _mm256_broadcastsi128_si256(_mm_and_si128(scb, _mm_set1_epi8(0x0F)));
}
DSIB_AI void q2_k_pos_avx2(const uint8_t *blk, __m256i sc4, int p, __m256i *wq, __m256i *sc) {
    const int s = p >> 1, h = p & 1, ga = 8 * h + 2 * s;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
    *wq = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), _mm256_set1_epi8(3));
    *sc = _mm256_shuffle_epi8(sc4, _mm256_inserti128_si256(
                                       _mm256_castsi128_si256(_mm_set1_epi16((short)(0x8000 | ga))),
                                       _mm_set1_epi16((short)(0x8000 | (ga + 1))), 1));
}
DSIB_AI void q2_k_tail_avx2(const uint8_t *blk, __m256i sc4, __m256i *mn, __m128 *dmw) {
    (void)sc4;
    const __m128i scb = _mm_loadu_si128((const __m128i *)blk);
    *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(0x0F)));
    *dmw = dsib_f16x2_hw(blk + 80); /* d, dmin */
}
DSIB_KQ_TILE_AVX2(q2_k_tile_avx2, 84, q2_k_prep_avx2, q2_k_pos_avx2, q2_k_tail_avx2)

DSIB_QROWS_DEFINE_T4(q2_k_rows_avx2, q2_k_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Super-block decode for DSIB_KQ_TILE_AVX512: vector s = 2-bit field s of qs[0..64); its
 * 16-byte quarters are the sub-blocks 2s, 2s+1, 8+2s, 9+2s, whose scales pshufb spreads
 * over the quarter's 4 int32 lanes, paired per dsib_kq_s_avx512 (vectors 0 / 1, 2 / 3),
 * from the scale bytes broadcast to every 128-bit lane; the mins are in natural order, like
 * the activation sums. */
DSIB_AI void q2_k_decode_avx512(const uint8_t *blk, __m512i wv[4], __m512i sc[2], __m256i *mn,
                                __m128 *dmw) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i scb = _mm_loadu_si128((const __m128i *)blk);
    const __m512i sc4 = _mm512_broadcast_i32x4(_mm_and_si128(scb, m4));
    const __m512i q = _mm512_loadu_si512(blk + 16);
    for (int s = 0; s < 4; s++) wv[s] = _mm512_and_si512(s ? _mm512_srli_epi16(q, 2 * s) : q, m3);
    /* scale pairs (dsib_kq_s_avx512): in quarter c of vectors s, s + 1 (s = 0, 2) the
     * sub-blocks g(s, c), g(s + 1, c), zero-extended to words */
    for (int p = 0; p < 2; p++) {
        const int s0 = 2 * p, s1 = 2 * p + 1;
        const __m512i sel = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_set1_epi32((int)(0x80008000u | (uint32_t)(2 * s0) | ((uint32_t)(2 * s1) << 16)))),
                _mm_set1_epi32((int)(0x80008000u | (uint32_t)(2 * s0 + 1) | ((uint32_t)(2 * s1 + 1) << 16))), 1)),
            _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_set1_epi32((int)(0x80008000u | (uint32_t)(8 + 2 * s0) | ((uint32_t)(8 + 2 * s1) << 16)))),
                _mm_set1_epi32((int)(0x80008000u | (uint32_t)(9 + 2 * s0) | ((uint32_t)(9 + 2 * s1) << 16))), 1),
            1);
        sc[p] = _mm512_shuffle_epi8(sc4, sel);
    }
    *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), m4));
    *dmw = dsib_f16x2_hw(blk + 80); /* d, dmin */
}
DSIB_KQ_TILE_AVX512(q2_k_tile_avx512, 84, q2_k_decode_avx512, 0)

DSIB_QROWS_DEFINE_RT8(q2_k_rows_avx512, q2_k_tile_avx512, 2)

DSIB_TARGET_POP

/* AVX512_VBMI2: the pairs of lane sums without a blend (simd_avx512.h DSIB_KQ_S_VB2_). */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI2)
DSIB_KQ_TILE_AVX512(q2_k_tile_vb2, 84, q2_k_decode_avx512, 1)
DSIB_QROWS_DEFINE_RT8(q2_k_rows_vb2, q2_k_tile_vb2, 2)
DSIB_TARGET_POP

DSIB_QROWS_VARIANT(q2_k_rows_avx512_any, q2_k_rows_vb2, q2_k_rows_avx512,
                   dsib_kern_kq_vbmi2 && dsib_kern_cpu_vbmi2())

const dsib_kern_qtype dsib_kq_q2_k = {
    DSI_TYPE_Q2_K, DSIB_ACT_Q8_K_P2, {q2_k_rows_scalar, q2_k_rows_avx2, NULL, q2_k_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_q2_k = {DSI_TYPE_Q2_K, DSIB_ACT_Q8_K_P2, {q2_k_rows_scalar}};

#endif
