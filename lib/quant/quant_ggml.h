/*
 * Reference block decoders and writer quantizers of the ggml weight types that llama.cpp's
 * quantizer writes besides the ones quant.c implements itself: Q4_0, Q4_1, Q5_0, Q5_1,
 * Q3_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M.
 * Layouts are ggml's, byte for byte (docs/tensor-types.md is the normative description).
 *
 * Decoders compute every value with the same float operations in the same order as ggml's
 * dequantize_row_* (ggml-quants.c), so the dequantized f32 values are bit-identical to
 * llama.cpp's (tests/unit/quant/test_ggml_interop.c checks that against the real library).
 *
 * Quantizers are libdsinfer's own (deterministic, documented in docs/tensor-types.md), not
 * ggml's search; `imat` (per-element importance, may be NULL) weights the squared error of
 * the types that search a scale or a grid (Q4_0, Q5_0, Q3_K, Q6_K, IQ4_*, IQ3_*, IQ2_*,
 * IQ1_*); Q4_1, Q5_1 and Q5_K round to nearest and ignore it.
 */
#ifndef DSI_QUANT_QUANT_GGML_H
#define DSI_QUANT_QUANT_GGML_H

#include <stddef.h>
#include <stdint.h>

/* One block of `blck` elements from its bytes. */
typedef void (*dsii_block_deq_fn)(const uint8_t *blk, float *out);

void dsii_blk_q4_0(const uint8_t *b, float *y);
void dsii_blk_q4_1(const uint8_t *b, float *y);
void dsii_blk_q5_0(const uint8_t *b, float *y);
void dsii_blk_q5_1(const uint8_t *b, float *y);
void dsii_blk_q3_k(const uint8_t *b, float *y);
void dsii_blk_q5_k(const uint8_t *b, float *y);
void dsii_blk_q6_k(const uint8_t *b, float *y);
void dsii_blk_iq4_nl(const uint8_t *b, float *y);
void dsii_blk_iq4_xs(const uint8_t *b, float *y);
void dsii_blk_iq3_xxs(const uint8_t *b, float *y);
void dsii_blk_iq3_s(const uint8_t *b, float *y);
void dsii_blk_iq2_xxs(const uint8_t *b, float *y);
void dsii_blk_iq2_xs(const uint8_t *b, float *y);
void dsii_blk_iq2_s(const uint8_t *b, float *y);
void dsii_blk_iq1_s(const uint8_t *b, float *y);
void dsii_blk_iq1_m(const uint8_t *b, float *y);

/* Quantizers: n elements (a multiple of the block) from src into dst; returns the bytes
 * written. imat: NULL or n importance weights (>= 0) for the squared error. */
size_t dsii_q_q4_0(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_q4_1(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_q5_0(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_q5_1(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_q3_k(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_q5_k(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_q6_k(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq4_nl(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq4_xs(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq3_xxs(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq3_s(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq2_xxs(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq2_xs(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq2_s(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq1_s(const float *src, void *dst, int64_t n, const float *imat);
size_t dsii_q_iq1_m(const float *src, void *dst, int64_t n, const float *imat);

/* Shared with quant.c (Q4_K / Q2_K writers): asymmetric k-quant of one super-block of
 * nsub sub-blocks of sublen values, q in [0, qmax], sub-block scales / mins quantized to
 * [0, smax] against f16 d / dmin. */
void dsii_kquant_block(const float *x, int nsub, int sublen, int qmax, int smax, uint8_t *ls,
                       uint8_t *lm, uint16_t *dh, uint16_t *dminh, uint8_t *q);
/* Packs eight 6-bit scales and mins into the 12 bytes of Q4_K / Q5_K. */
void dsii_k4_pack_scales(const uint8_t *ls, const uint8_t *lm, uint8_t *sc12);

#endif /* DSI_QUANT_QUANT_GGML_H */
