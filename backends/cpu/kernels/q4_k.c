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
#include <stdatomic.h>

/* kernels.h: defined on every architecture (tests set it), used on x86-64 */
int32_t dsib_kern_kq_vbmi2 = 1;

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

DSIB_QROWS_SCALAR(q4_k_rows_scalar, q4_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Super-block decode for DSIB_KQ_TILE_AVX2: position p is the low (p & 2 clear) or high
 * nibbles of qs[32c..32c+32), c = 2 (p / 4) + (p & 1) (c = 0: positions 0, 2; 1: 1, 3;
 * 2: 4, 6; 3: 5, 7), with the scale of sub-block P[p] (dsib_kq4_sc_avx2). */
#define Q4_K_PREP_AVX2(blk) dsib_kq4_prep_avx2((blk) + 4)
DSIB_AI void q4_k_pos_avx2(const uint8_t *blk, __m256i smv, int p, __m256i *wq, __m256i *sc) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * (2 * (p >> 2) + (p & 1))));
    *wq = _mm256_and_si256((p & 2) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
    *sc = dsib_kq4_sc_avx2(smv, p);
}
DSIB_AI void q4_k_tail_avx2(const uint8_t *blk, __m256i smv, __m256i *mn, __m128 *dmw) {
    *mn = dsib_kq4_mins_avx2(smv);
    *dmw = dsib_f16x2_hw(blk); /* d, dmin */
}
DSIB_KQ_TILE_AVX2(q4_k_tile_avx2, 144, Q4_K_PREP_AVX2, q4_k_pos_avx2, q4_k_tail_avx2)

DSIB_QROWS_DEFINE_T4(q4_k_rows_avx2, q4_k_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Weight decode for DSIB_KQ4_TILE_AVX512: vector v = low (v even) / high (v odd) nibbles of
 * qs[64·(v/2)..]; its int32 lanes 0-7 use the scale of sub-block P[2v], 8-15 that of
 * P[2v+1], paired per dsib_kq_s_avx512 (dsib_kq4_scales_pair_avx512: vpermw over the 16
 * unpacked words, scales 0-7, mins 8-15); the mins are doubled up to match the activation
 * sums per 16. */
DSIB_AI void q4_k_wdecode_avx512(const uint8_t *blk, __m512i wv[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i q0 = _mm512_loadu_si512(blk + 16), q1 = _mm512_loadu_si512(blk + 80);
    wv[0] = _mm512_and_si512(q0, m4);
    wv[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
    wv[2] = _mm512_and_si512(q1, m4);
    wv[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
}
DSIB_KQ4_TILE_AVX512(q4_k_tile_avx512, 144, q4_k_wdecode_avx512, 0)

DSIB_QROWS_DEFINE_RT8(q4_k_rows_avx512, q4_k_tile_avx512, 2)

DSIB_TARGET_POP

/* AVX512_VBMI2: the pairs of lane sums without a blend (simd_avx512.h DSIB_KQ_S_VB2_). */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI2)
DSIB_KQ4_TILE_AVX512(q4_k_tile_vb2, 144, q4_k_wdecode_avx512, 1)
DSIB_QROWS_DEFINE_RT8(q4_k_rows_vb2, q4_k_tile_vb2, 2)
DSIB_TARGET_POP

DSIB_CPU_FEATURE_FN(dsib_kern_cpu_vbmi2, "avx512vbmi2")

DSIB_QROWS_VARIANT(q4_k_rows_avx512_any, q4_k_rows_vb2, q4_k_rows_avx512,
                   dsib_kern_kq_vbmi2 && dsib_kern_cpu_vbmi2())

const dsib_kern_qtype dsib_kq_q4_k = {
    DSI_TYPE_Q4_K, DSIB_ACT_Q8_K_P4, {q4_k_rows_scalar, q4_k_rows_avx2, NULL, q4_k_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_q4_k = {DSI_TYPE_Q4_K, DSIB_ACT_Q8_K_P4, {q4_k_rows_scalar}};

#endif
