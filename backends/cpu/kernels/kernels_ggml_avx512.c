/*
 * AVX-512 (F/BW/VL/DQ) kernels of the further ggml weight types: kernels_ggml_simd.h with
 * 16-lane vectors (operation order documented there; the block decoders use 256-bit AVX2
 * operations, which every AVX-512 CPU has).
 */
#include "backends/cpu/kernels/kernels_ggml.h"
#include "backends/cpu/kernels/kernels_impl.h"

#ifdef DSIB_KERN_X86

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#define VW 16
#define VEC __m512
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_load_ps(p)
#define VLOADU(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define KG_ROWS dsib_kern_rows_ggml_avx512

static inline __attribute__((always_inline)) float kg_hsum16(__m512 v) {
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#define VHSUM(v) kg_hsum16(v)

#include "backends/cpu/kernels/kernels_ggml_simd.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else

int dsib_kern_rows_ggml_avx512(int32_t type, const uint8_t *w, size_t w_row_bytes,
                               int64_t n_in, int64_t o0, int64_t o1, const float *const *xp,
                               float *const *yp, int n) {
    (void)type, (void)w, (void)w_row_bytes, (void)n_in, (void)o0, (void)o1, (void)xp, (void)yp, (void)n;
    return 0;
}

#endif
