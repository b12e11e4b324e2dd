/*
 * AVX2 + FMA + F16C kernels of the further ggml weight types: kernels_ggml_simd.h with
 * 8-lane vectors (operation order documented there).
 */
#include "backends/cpu/kernels/kernels_ggml.h"
#include "backends/cpu/kernels/kernels_impl.h"

#ifdef DSIB_KERN_X86

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define VW 8
#define VEC __m256
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_load_ps(p)
#define VLOADU(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define KG_ROWS dsib_kern_rows_ggml_avx2

static inline __attribute__((always_inline)) float kg_hsum8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#define VHSUM(v) kg_hsum8(v)

#include "backends/cpu/kernels/kernels_ggml_simd.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else /* not x86-64: never called (kernels.c only dispatches SIMD paths on x86-64) */

int dsib_kern_rows_ggml_avx2(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                             int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                             int n) {
    (void)type, (void)w, (void)w_row_bytes, (void)n_in, (void)o0, (void)o1, (void)xp, (void)yp, (void)n;
    return 0;
}

#endif
