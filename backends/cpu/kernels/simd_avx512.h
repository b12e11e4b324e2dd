/*
 * AVX-512 (+VNNI) helpers of the default-path kernels. Include INSIDE a
 * DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI) region (the functions take that region's target).
 */
#ifndef DSIB_SIMD_AVX512_H
#define DSIB_SIMD_AVX512_H

#include <immintrin.h>

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

#endif
