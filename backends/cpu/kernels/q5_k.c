/*
 * Q5_K weights × DSIB_ACT_Q8_K_P4 activations (default path; kernels.h).
 *
 * Block (176 bytes, 256 elements; ggml block_q5_K, docs/tensor-types.md): d, dmin (f16) at
 * 0, 2; the twelve bytes of 6-bit scales / mins at 4 (packed as Q4_K's); qh[32] at 16;
 * qs[128] at 48. Element e = 64c + 32u + l (c < 4, u < 2, l < 32) has the 5-bit code
 * nibble u of qs[32c + l] + 16 · bit (2c + u) of qh[l], sub-block 2c + u: Q4_K's packing
 * (q4_k.c) plus a fifth bit, so the same activation order P = (0,2,1,3,4,6,5,7) and the same
 * vectors as Q4_K, and the lane order Q4_K had until 2026-12-07 (Q4_K now has the block-sum
 * order, q4_k.c), with the codes < 32:
 *
 *   S[j] = Σ_{v<4} sc_{P[2v + (j>=8)]} · Σ_{k<4} q_v[4j+k] · x_v[4j+k]   j < 16 (exact)
 *   M[j] = m_j · (bs[2j] + bs[2j+1])                                     j < 8  (exact)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            j < 16
 *   acc[u][j] = fmaf(-(dmin·dx), (float)M[j], acc[u][j])      j < 8
 *
 * then y = dsib_reduce32(acc). (|S| < 2^22, |M| < 2^18: the conversions are exact.)
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

static const uint8_t q5k_perm[8] = {0, 2, 1, 3, 4, 6, 5, 7};

/* ---- scalar ---------------------------------------------------------------------------- */

static float q5_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        float *a = acc[b & 1];
        const uint8_t *blk = row + 176 * b, *qh = blk + 16, *qs = blk + 48;
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
                for (int k = 0; k < 4; k++) {
                    /* byte 4j + k of chunk c = 2(v/2) + (j >= 8), nibble u = v & 1 */
                    const int l = (4 * j + k) & 31, c = 2 * (v / 2) + (j >= 8), u = v & 1;
                    const int q = ((qv[4 * j + k] >> sh) & 15) | (((qh[l] >> (2 * c + u)) & 1) << 4);
                    I += q * xq[64 * v + 4 * j + k];
                }
                S[j] += sm[q5k_perm[2 * v + (j >= 8)]] * I;
            }
        }
        for (int j = 0; j < 8; j++) M[j] = sm[8 + j] * (bs[2 * j] + bs[2 * j + 1]);
        const float dd = dsib_ld_f16(blk) * x->d[b], dm = dsib_ld_f16(blk + 2) * x->d[b];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
        for (int j = 0; j < 8; j++) a[j] = fmaf(-dm, (float)M[j], a[j]);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q5_k_rows_scalar, q5_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Super-block decode for DSIB_KQ_TILE_AVX2: position p is the low (p & 2 clear) or high
 * nibbles of qs[32c..32c+32), c = 2 (p / 4) + (p & 1), plus bit 2c (low) / 2c + 1 (high) of
 * qh[l] as bit 4, with the scale of sub-block P[p] (dsib_kq4_sc_avx2). */
#define Q5_K_PREP_AVX2(blk) dsib_kq4_prep_avx2((blk) + 4)
DSIB_AI void q5_k_pos_avx2(const uint8_t *blk, __m256i smv, int p, __m256i *wq, __m256i *sc) {
    const int c = 2 * (p >> 2) + (p & 1), bit = 2 * c + ((p >> 1) & 1);
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * c));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
    const __m256i h = bit <= 4 ? _mm256_slli_epi16(qh, 4 - bit) : _mm256_srli_epi16(qh, bit - 4);
    *wq = _mm256_or_si256(_mm256_and_si256((p & 2) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F)),
                          _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
    *sc = dsib_kq4_sc_avx2(smv, p);
}
DSIB_AI void q5_k_tail_avx2(const uint8_t *blk, __m256i smv, __m256i *mn, __m128 *dmw) {
    *mn = dsib_kq4_mins_avx2(smv);
    *dmw = dsib_f16x2_hw(blk); /* d, dmin */
}
DSIB_KQ_TILE_AVX2(q5_k_tile_avx2, 176, Q5_K_PREP_AVX2, q5_k_pos_avx2, q5_k_tail_avx2)

DSIB_QROWS_DEFINE_T4(q5_k_rows_avx2, q5_k_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Weight decode for DSIB_KQ4_TILE_AVX512: vector v = low (v even) / high (v odd) nibbles
 * of qs[64·(v/2)..] with their fifth bits; its int32 lanes 0-7 use the scale of sub-block
 * P[2v], 8-15 that of P[2v+1], paired per dsib_kq_s_avx512 (dsib_kq4_scales_pair_avx512:
 * vpermw over the 16 unpacked words, scales 0-7, mins 8-15); the mins are doubled up to
 * match the activation sums per 16. */
DSIB_AI void q5_k_wdecode_avx512(const uint8_t *blk, __m512i wv[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i q0 = _mm512_loadu_si512(blk + 48), q1 = _mm512_loadu_si512(blk + 112);
    /* fifth bits: vector v = 2h + u holds chunks c = 2h (bytes 0-31), 2h + 1 (32-63), nibble
     * u; bit 2c + u of qh[l] (qh in both halves) shifted to bit 4 by a variable word shift */
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
    const __m512i m10 = _mm512_set1_epi8(0x10);
#define Q5K_HB(s0, s1) /* left shifts 4 - bit for the two halves (bits 0..4: left) */        \
    _mm512_and_si512(_mm512_sllv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(s0), _mm256_set1_epi16(s1), 1)), m10)
#define Q5K_HBR(s0, s1) /* right shifts bit - 4 (bits 4..7) */                              \
    _mm512_and_si512(_mm512_srlv_epi16(qh, _mm512_inserti64x4(_mm512_set1_epi16(s0), _mm256_set1_epi16(s1), 1)), m10)
    wv[0] = _mm512_or_si512(_mm512_and_si512(q0, m4), Q5K_HB(4, 2));                     /* bits 0, 2 */
    wv[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), Q5K_HB(3, 1)); /* bits 1, 3 */
    wv[2] = _mm512_or_si512(_mm512_and_si512(q1, m4), Q5K_HBR(0, 2));                    /* bits 4, 6 */
    wv[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), Q5K_HBR(1, 3)); /* bits 5, 7 */
#undef Q5K_HB
#undef Q5K_HBR
}
DSIB_KQ4_TILE_AVX512(q5_k_tile_avx512, 176, q5_k_wdecode_avx512, 0)

DSIB_QROWS_DEFINE_RT8(q5_k_rows_avx512, q5_k_tile_avx512, 2)

DSIB_TARGET_POP

/* AVX512_VBMI2: the pairs of lane sums without a blend (simd_avx512.h DSIB_KQ_S_VB2_). */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI2)
DSIB_KQ4_TILE_AVX512(q5_k_tile_vb2, 176, q5_k_wdecode_avx512, 1)
DSIB_QROWS_DEFINE_RT8(q5_k_rows_vb2, q5_k_tile_vb2, 2)
DSIB_TARGET_POP

DSIB_QROWS_VARIANT(q5_k_rows_avx512_any, q5_k_rows_vb2, q5_k_rows_avx512,
                   dsib_kern_kq_vbmi2 && dsib_kern_cpu_vbmi2())

const dsib_kern_qtype dsib_kq_q5_k = {
    DSIB_TYPE_Q5_K, DSIB_ACT_Q8_K_P4, {q5_k_rows_scalar, q5_k_rows_avx2, NULL, q5_k_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_q5_k = {DSIB_TYPE_Q5_K, DSIB_ACT_Q8_K_P4, {q5_k_rows_scalar}};

#endif
