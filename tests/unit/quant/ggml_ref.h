/*
 * Test-side double-precision decoders of the ggml weight types of lib/quant/quant_ggml.c,
 * written element by element from docs/tensor-types.md (not from the library's code): each
 * element's value is computed in double from its fields. The sign bit that IQ types do not
 * store is derived from the parity rule here (not from the ksigns table), so the table is
 * checked too. Shared by tests/unit/quant and tests/unit/cpukernels.
 */
#ifndef DSI_TEST_GGML_REF_H
#define DSI_TEST_GGML_REF_H

#include <stdint.h>

/* 1 if gref_decode knows the type. */
int gref_known(int32_t type);
/* Decodes n elements (whole blocks) of `type` from row into dst; mag (may be NULL) receives
 * per element the sum of the magnitudes of the terms (for asymmetric types |q d| + |m|), the
 * scale against which a float decoder's rounding is bounded. */
void gref_decode(int32_t type, const uint8_t *row, int64_t n, double *dst, double *mag);
/* Writes a random valid row of n elements: random bytes with every f16 / scale field set
 * to a finite value of magnitude about 2^-6 .. 2^-2 (rnd: a 64-bit random source). */
void gref_random_row(int32_t type, uint8_t *row, int64_t n, uint64_t (*rnd)(void));

#endif /* DSI_TEST_GGML_REF_H */
