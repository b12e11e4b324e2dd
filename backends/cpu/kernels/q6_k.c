/*
 * Q6_K weights × DSIB_ACT_Q8_K activations (default path; kernels.h).
 *
 * Block (210 bytes, 256 elements; ggml block_q6_K, docs/tensor-types.md): ql[128] at 0,
 * qh[64] at 128, int8 scales[16] at 192, d (f16) at 208. Element e = 128h + 32k + l
 * (h < 2, k < 4, l < 32) has the 6-bit code
 *
 *   q_e = nibble (k >> 1) of ql[64h + 32(k & 1) + l]  |  ((qh[32h + l] >> 2k) & 3) << 4
 *
 * and the value d · sc[e / 16] · (q_e − 32). The codes are the unsigned operand of
 * dpbusd / maddubs; the −32 goes through the activation sums per 16 (the Q8_K format's),
 * both with the same scale d, so the two integer parts are combined before the one float
 * step.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), in sub-block 4v + j/4:
 *
 *   S[j] = Σ_{v<4} sc[4v + j/4] · Σ_{k<4} q_e · x_e                                (exact)
 *   M[j] = sc[2j] · bs[2j] + sc[2j+1] · bs[2j+1]  for j < 8, 0 above       (exact; bs =
 *          the activation sums per 16 natural elements)
 *   acc[u][j] = fmaf(d·dx, (float)(S[j] − 32·M[j]), acc[u][j])   (d·dx one f32 rounding)
 *
 * then y = dsib_reduce32(acc). |S|, |32·M| < 2^24 each, so the int32 difference is exact;
 * its conversion to float rounds to nearest (the same on every ISA).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static inline int q6_k_code(const uint8_t *blk, int e) {
    const int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const uint8_t lo = blk[64 * h + 32 * (k & 1) + l];
    return ((k >> 1) ? lo >> 4 : lo & 0xF) | (((blk[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
}

static float q6_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 210 * b;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const int8_t *xq = x->q + 256 * b;
        const int16_t *bs = x->s + 16 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 64 * v + 4 * j + k;
                    I += q6_k_code(blk, e) * xq[e];
                }
                S[j] += sc[4 * v + j / 4] * I;
            }
        for (int j = 0; j < 8; j++) S[j] -= 32 * (sc[2 * j] * bs[2 * j] + sc[2 * j + 1] * bs[2 * j + 1]);
        const float dd = dsib_ld_f16(blk + 208) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q6_k_rows_scalar, q6_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Super-block decode for DSIB_KQO_TILE_AVX2: position p = 4h + k holds the codes of elements
 * 32p .. 32p+31 (the low (k < 2) or high nibbles of ql[64h + 32 (k & 1) ..], with their two
 * bits of qh[32h ..] as bits 4-5) and the scales of its sub-blocks 2p, 2p + 1; PREP = the 16
 * scale bytes in both lanes. */
DSIB_AI __m256i q6_k_prep_avx2(const uint8_t *blk) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 192)));
}
DSIB_AI void q6_k_pos_avx2(const uint8_t *blk, __m256i sv, int p, __m256i *wq, __m256i *sc) {
    const int h = p >> 2, k = p & 3;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (k & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    const __m256i hb = k == 0 ? _mm256_slli_epi16(qh, 4)
                       : k == 1 ? _mm256_slli_epi16(qh, 2)
                       : k == 2 ? qh
                                : _mm256_srli_epi16(qh, 2);
    *wq = _mm256_or_si256(_mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(0x0F)),
                          _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    *sc = dsib_s8_pair_words_avx2(sv, 2 * p, 2 * p + 1);
}
DSIB_AI void q6_k_tail_avx2(const uint8_t *blk, __m256i sv, __m256i *scw) {
    (void)blk;
    *scw = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(sv));
}

DSIB_KQO_TILE_AVX2(q6_k_tile_avx2, 210, q6_k_prep_avx2, q6_k_pos_avx2, q6_k_tail_avx2, 208, 5)

DSIB_QROWS_DEFINE_T4(q6_k_rows_avx2, q6_k_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Super-block decode: wv[v] = the codes of elements 64v .. 64v+63 (v = 2h: k = 0, 1; v =
 * 2h + 1: k = 2, 3 — qh broadcast to both halves, shifted per half by a variable word
 * shift), the scale pairs of dsib_kq_s_avx512's layout (vectors 0 / 1, 2 / 3: int32 lane
 * j = the scale of the first vector's lane j in the low word, the second's in the high
 * word), and all 16 scales as int16 for M. */
DSIB_AI void q6_k_decode_avx512(const uint8_t *blk, __m512i wv[4], __m512i sc[2], __m256i *scw) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* word shifts: 4 / 2 (left) for k = 0 / 1, 0 / 2 (right) for k = 2 / 3 */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(blk + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
        wv[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
        wv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                        _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
    }
    *scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    const __m512i s32 = _mm512_zextsi256_si512(*scw);
    /* pair p: word 2j = scale 8p + j/4, word 2j+1 = scale 8p + 4 + j/4 */
    sc[0] = _mm512_permutexvar_epi16(
        _mm512_set_epi16(7, 3, 7, 3, 7, 3, 7, 3, 6, 2, 6, 2, 6, 2, 6, 2, 5, 1, 5, 1, 5, 1, 5, 1, 4, 0, 4, 0, 4, 0, 4, 0), s32);
    sc[1] = _mm512_permutexvar_epi16(
        _mm512_set_epi16(15, 11, 15, 11, 15, 11, 15, 11, 14, 10, 14, 10, 14, 10, 14, 10, 13, 9, 13, 9, 13, 9, 13, 9, 12,
                         8, 12, 8, 12, 8, 12, 8),
        s32);
}

DSIB_KQO_TILE_AVX512(q6_k_tile_avx512, 210, q6_k_decode_avx512, 208, 5)

DSIB_QROWS_DEFINE_RT8(q6_k_rows_avx512, q6_k_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q6_k = {
    DSIB_TYPE_Q6_K, DSIB_ACT_Q8_K, {q6_k_rows_scalar, q6_k_rows_avx2, NULL, q6_k_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q6_k = {DSIB_TYPE_Q6_K, DSIB_ACT_Q8_K, {q6_k_rows_scalar}};

#endif
