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

#endif
