/*
 * Q3_K weights × DSIB_ACT_Q8_K_P2 activations (default path; kernels.h).
 *
 * Block (110 bytes, 256 elements; ggml block_q3_K, docs/tensor-types.md): hmask[32] at 0,
 * qs[64] at 32, the twelve bytes of 6-bit scales at 96, d (f16) at 108. Element
 * e = 128h + 32j + l (h < 2, j < 4, l < 32) has the 3-bit code
 *
 *   u_e = 2-bit field j of qs[32h + l]  +  4 · bit (4h + j) of hmask[l]
 *
 * and the value d · s_{e/16} · (u_e − 4), s_g = the 6-bit scale of sub-block g minus 32
 * (lo = low / high nibble of scales[g mod 8], hi = bits 2(g/4).. of scales[8 + g mod 4]).
 * Q2_K's 2-bit packing (q2_k.c), so the same activation order P = (0,4,1,5,2,6,3,7) and
 * vectors: vector s = field s of qs[0..64), its 16-byte quarters the sub-blocks
 * g(s, c) = 2s, 2s+1, 8+2s, 9+2s. The codes are the unsigned operand of dpbusd / maddubs,
 * the −4 goes through the activation sums per 16, both with the scale d, so the two
 * integer parts are combined before the one float step.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2):
 *
 *   S[j] = Σ_{s<4} s_{g(s, j/4)} · Σ_{k<4} u_s[4j+k] · x_s[4j+k]      j < 16 (exact)
 *   M[j] = s_{2j} · bs[2j] + s_{2j+1} · bs[2j+1]   j < 8, 0 above       (exact; bs = the
 *          activation sums per 16 natural elements)
 *   acc[u][j] = fmaf(d·dx, (float)(S[j] − 4·M[j]), acc[u][j])   (d·dx one f32 rounding)
 *
 * then y = dsib_reduce32(acc). (|S| < 2^19, |4·M| < 2^19: the conversion is exact.)
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* The 16 scales s_g = 6-bit value − 32 (ggml's unpacking of the twelve bytes). */
static inline void q3_k_scales(const uint8_t *sc12, int8_t out[16]) {
    uint32_t a[4];
    memcpy(a, sc12, 12);
    const uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
    a[3] = ((a[1] >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
    a[0] = (a[0] & 0x0f0f0f0fu) | (((t >> 0) & 0x03030303u) << 4);
    a[1] = (a[1] & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
    uint8_t u[16];
    memcpy(u, a, 16);
    for (int g = 0; g < 16; g++) out[g] = (int8_t)(u[g] - 32);
}

/* ---- scalar ---------------------------------------------------------------------------- */

static float q3_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    static const int gq[4] = {0, 1, 8, 9};
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 110 * b, *hm = blk, *qs = blk + 32;
        const int8_t *xq = x->q + 256 * b;
        const int16_t *bs = x->s + 16 * b;
        int8_t sc[16];
        q3_k_scales(blk + 96, sc);
        int32_t S[16] = {0};
        for (int s = 0; s < 4; s++)
            for (int j = 0; j < 16; j++) {
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int by = 4 * j + k, h = by / 32, l = by % 32; /* byte of vector s */
                    const int u = ((qs[32 * h + l] >> (2 * s)) & 3) + 4 * ((hm[l] >> (4 * h + s)) & 1);
                    I += u * xq[64 * s + by];
                }
                S[j] += sc[2 * s + gq[j / 4]] * I;
            }
        for (int j = 0; j < 8; j++) S[j] -= 4 * (sc[2 * j] * bs[2 * j] + sc[2 * j + 1] * bs[2 * j + 1]);
        const float dd = dsib_ld_f16(blk + 108) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q3_k_rows_scalar, q3_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* q3_k_scales in registers: the 16 scales as int8 (natural order). Reads the 12 bytes only
 * (a block's last one may end its buffer). */
DSIB_AI __m128i q3_k_scales_sse(const uint8_t *sc12) {
    const __m128i lo8 = _mm_loadl_epi64((const __m128i *)sc12);
    uint32_t h;
    memcpy(&h, sc12 + 8, 4);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    /* low parts: low nibbles of bytes 0-7 (scales 0-7), high nibbles (8-15) */
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(lo8, m4), _mm_and_si128(_mm_srli_epi16(lo8, 4), m4));
    /* high parts: scale 4k + i has bits 2k.. of byte 8 + i: dword k = (h >> 2k) & 0x03030303 */
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* Super-block decode for DSIB_KQO_TILE_AVX2: position p = 2s + h is field s of
 * qs[32h..32h+32) plus bit 4h + s of hmask, sub-blocks 8h + 2s (bytes 0-15) and 8h + 2s + 1
 * (bytes 16-31); PREP = the 16 scales as int8 in both lanes. */
DSIB_AI __m256i q3_k_prep_avx2(const uint8_t *blk) {
    return _mm256_broadcastsi128_si256(q3_k_scales_sse(blk + 96));
}
DSIB_AI void q3_k_pos_avx2(const uint8_t *blk, __m256i sv, int p, __m256i *wq, __m256i *sc) {
    const int s = p >> 1, h = p & 1, bit = 4 * h + s;
    const __m256i hm = _mm256_loadu_si256((const __m256i *)blk);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * h));
    const __m256i hb = bit <= 2 ? _mm256_slli_epi16(hm, 2 - bit) : _mm256_srli_epi16(hm, bit - 2);
    *wq = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), _mm256_set1_epi8(3)),
                          _mm256_and_si256(hb, _mm256_set1_epi8(4)));
    *sc = dsib_s8_pair_words_avx2(sv, 8 * h + 2 * s, 8 * h + 2 * s + 1);
}
DSIB_AI void q3_k_tail_avx2(const uint8_t *blk, __m256i sv, __m256i *scw) {
    (void)blk;
    *scw = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(sv));
}

DSIB_KQO_TILE_AVX2(q3_k_tile_avx2, 110, q3_k_prep_avx2, q3_k_pos_avx2, q3_k_tail_avx2, 108, 2)

DSIB_QROWS_DEFINE_T4(q3_k_rows_avx2, q3_k_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Super-block decode: vector s = field s of qs[0..64) plus bit s (bytes 0-31) / 4 + s
 * (bytes 32-63) of hmask (broadcast to both halves, a variable word shift per half), the
 * scale pairs of dsib_kq_s_avx512's layout (vectors 0 / 1, 2 / 3; lane j of vector s in
 * sub-block g(s, j/4)), all 16 scales as int16 for M. */
DSIB_AI void q3_k_decode_avx512(const uint8_t *blk, __m512i wv[4], __m512i sc[2], __m256i *scw) {
    const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
    const __m512i q = _mm512_loadu_si512(blk + 32);
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk));
    for (int s = 0; s < 4; s++) {
        /* bit s (low half) / 4 + s (high half) down to bit 0, then to bit 2 */
        const __m512i hb = _mm512_srlv_epi16(hm, _mm512_inserti64x4(_mm512_set1_epi16((short)s),
                                                                    _mm256_set1_epi16((short)(4 + s)), 1));
        wv[s] = _mm512_or_si512(_mm512_and_si512(s ? _mm512_srli_epi16(q, 2 * s) : q, m3),
                                _mm512_and_si512(_mm512_slli_epi16(hb, 2), m4));
    }
    *scw = _mm256_cvtepi8_epi16(q3_k_scales_sse(blk + 96));
    const __m512i s32 = _mm512_zextsi256_si512(*scw);
    /* pair p: word 2j = scale g(2p, j/4), word 2j+1 = scale g(2p + 1, j/4) */
    sc[0] = _mm512_permutexvar_epi16(
        _mm512_set_epi16(11, 9, 11, 9, 11, 9, 11, 9, 10, 8, 10, 8, 10, 8, 10, 8, 3, 1, 3, 1, 3, 1, 3, 1, 2, 0, 2, 0, 2, 0, 2, 0), s32);
    sc[1] = _mm512_permutexvar_epi16(
        _mm512_set_epi16(15, 13, 15, 13, 15, 13, 15, 13, 14, 12, 14, 12, 14, 12, 14, 12, 7, 5, 7, 5, 7, 5, 7, 5, 6, 4, 6,
                         4, 6, 4, 6, 4),
        s32);
}

DSIB_KQO_TILE_AVX512(q3_k_tile_avx512, 110, q3_k_decode_avx512, 108, 2)

DSIB_QROWS_DEFINE_RT8(q3_k_rows_avx512, q3_k_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q3_k = {
    DSIB_TYPE_Q3_K, DSIB_ACT_Q8_K_P2, {q3_k_rows_scalar, q3_k_rows_avx2, NULL, q3_k_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q3_k = {DSIB_TYPE_Q3_K, DSIB_ACT_Q8_K_P2, {q3_k_rows_scalar}};

#endif
