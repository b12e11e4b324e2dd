/*
 * Scalar path of the further ggml weight types (kernels_ggml.h): the weights are decoded by
 * lib/quant's reference decoders (bit-identical to llama.cpp's dequantization, checked by
 * tests/unit/quant), then dotted by the scalar kernel of kernels.c in its usual lane order.
 */
#include "backends/cpu/kernels/kernels_ggml.h"

#include "quant/quant.h"

void dsib_kern_decode_ggml(int32_t type, const uint8_t *row, int64_t i0, int64_t n, float *dst) {
    const dsii_type_traits *t = dsii_type_get(type);
    if (!t || !t->dequantize_row) return;
    t->dequantize_row(row + (size_t)(i0 / t->blck) * t->type_size, dst, n);
}
