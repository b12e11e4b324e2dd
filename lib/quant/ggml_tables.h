/*
 * Codebooks and grids of ggml's IQ weight types (docs/tensor-types.md). The numbers are
 * data carried over from ggml/src/ggml-common.h (llama.cpp / ggml, MIT licence) by
 * tools/gen_ggml_tables.py into ggml_tables.c; tests/unit/quant checks every entry against
 * llama.cpp's own dequantizers.
 *
 * Grid entries pack one value per byte, element j of a group in byte j (bits 8j..8j+7):
 *   iq2xxs / iq2xs / iq2s: 8 unsigned magnitudes each in {8, 25, 43}
 *   iq3xxs: 4 magnitudes in {4, 12, …, 52, 62};  iq3s: 4 magnitudes in {1, 3, …, 15}
 *   iq1s:   8 signed values in {-1, 0, 1} (int8)
 * ksigns_iq2xs[i] = i | parity(i) << 7: the 7 stored sign bits of a group of 8 plus the
 * eighth chosen so that the number of negative values is even.
 */
#ifndef DSI_QUANT_GGML_TABLES_H
#define DSI_QUANT_GGML_TABLES_H

#include <stdint.h>

extern const uint8_t dsii_ksigns_iq2xs[128];
extern const int8_t dsii_kvalues_iq4nl[16];
extern const uint64_t dsii_iq2xxs_grid[256];
extern const uint64_t dsii_iq2xs_grid[512];
extern const uint64_t dsii_iq2s_grid[1024];
extern const uint32_t dsii_iq3xxs_grid[256];
extern const uint32_t dsii_iq3s_grid[512];
extern const uint64_t dsii_iq1s_grid[2048];

#endif /* DSI_QUANT_GGML_TABLES_H */
