/* Importance-weighted K-quant encoding for dsinfer-quantize (weighted.c). */
#ifndef DSI_TOOLS_WEIGHTED_H
#define DSI_TOOLS_WEIGHTED_H
#include <stdint.h>
/* 1 if dsii_quantize_row_weighted handles `type` (q4_k, q2_k). */
int dsii_weighted_supported(int32_t type);
/* Quantizes n values (a multiple of 256) of `x` into `dst`, minimizing sum_i imp[i] *
 * (x[i] - decoded[i])^2 per sub-block: lib/quant's encoder gives the start, then each
 * sub-block's scale and min codes are searched around it. Returns 0 on success. */
int dsii_quantize_row_weighted(int32_t type, const float *x, const float *imp, void *dst, int64_t n);
#endif
