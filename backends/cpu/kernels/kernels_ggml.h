/*
 * Internal to backends/cpu/kernels: the further ggml weight types (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q3_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M;
 * layouts in docs/tensor-types.md), plugged into the type table and ISA dispatch of
 * kernels.c with one entry per type. Their weights decode to exactly the values of
 * lib/quant (= llama.cpp's) on every path; activations are f32 (the exact path).
 */
#ifndef DSIB_CPU_KERNELS_GGML_H
#define DSIB_CPU_KERNELS_GGML_H

#include <stddef.h>
#include <stdint.h>

/* Scalar decode of elements [i0, i0 + n) of a row (i0 and n multiples of the block). */
void dsib_kern_decode_ggml(int32_t type, const uint8_t *row, int64_t i0, int64_t n, float *dst);

/* Row kernels of the SIMD paths for these types (same contract as dsib_kern_rows_avx2 /
 * _avx512 in kernels_impl.h); 0 if `type` is not one of them (nothing written). */
int dsib_kern_rows_ggml_avx2(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                             int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                             int n);
int dsib_kern_rows_ggml_avx512(int32_t type, const uint8_t *w, size_t w_row_bytes,
                               int64_t n_in, int64_t o0, int64_t o1, const float *const *xp,
                               float *const *yp, int n);

#endif /* DSIB_CPU_KERNELS_GGML_H */
