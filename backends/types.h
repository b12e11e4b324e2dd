/*
 * backends/types.h — the one table of tensor-type geometry (block elements, block bytes, the
 * ggml row rule), shared by the core (lib/quant adds reference kernels to it) and by every
 * backend (CPU kernels, Vulkan shaders, CUDA). Header-only, so a backend module uses it
 * without linking the core. docs/tensor-types.md is the normative description of the
 * layouts; ids are ggml's (DSI_TYPE_* in dsinfer.h) plus the libdsinfer FP8 extensions.
 *
 * To add a type: one line in DSIB_TYPE_TABLE below; lib/quant then reports it as known
 * (supported once it has a reference dequantizer), and a backend supports it once its
 * kernels do.
 */
#ifndef DSIB_TYPES_H
#define DSIB_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef struct dsib_type_info {
    int32_t type;          /* DSI_TYPE_* / ggml type id */
    const char *name;      /* "f32", "q4_k", "fp8_e4m3_b128", … (static) */
    uint32_t blck;         /* elements per block (1 for plain scalar types) */
    uint32_t type_size;    /* bytes per block */
    uint8_t row_multiple;  /* 1: a row's length must be a multiple of blck (ggml rule); 0: the
                              last block of each row is padded (libdsinfer FP8 block types) */
    uint8_t is_quantized;  /* 0 for plain scalar types (f32, f16, bf16, i8 … f64) */
} dsib_type_info;

/* X(id, name, blck, type_size, row_multiple, is_quantized) — every ggml id up to MXFP4 (39)
 * that GGUF files may carry (so any well-formed file can be sized), plus the FP8 ids. */
#define DSIB_TYPE_TABLE(X)                                                                 \
    X(0, "f32", 1, 4, 1, 0)                                                               \
    X(1, "f16", 1, 2, 1, 0)                                                               \
    X(2, "q4_0", 32, 18, 1, 1)                                                            \
    X(3, "q4_1", 32, 20, 1, 1)                                                            \
    X(6, "q5_0", 32, 22, 1, 1)                                                            \
    X(7, "q5_1", 32, 24, 1, 1)                                                            \
    X(8, "q8_0", 32, 34, 1, 1)                                                            \
    X(9, "q8_1", 32, 36, 1, 1)                                                            \
    X(10, "q2_k", 256, 84, 1, 1)                                                          \
    X(11, "q3_k", 256, 110, 1, 1)                                                         \
    X(12, "q4_k", 256, 144, 1, 1)                                                         \
    X(13, "q5_k", 256, 176, 1, 1)                                                         \
    X(14, "q6_k", 256, 210, 1, 1)                                                         \
    X(15, "q8_k", 256, 292, 1, 1)                                                         \
    X(16, "iq2_xxs", 256, 66, 1, 1)                                                       \
    X(17, "iq2_xs", 256, 74, 1, 1)                                                        \
    X(18, "iq3_xxs", 256, 98, 1, 1)                                                       \
    X(19, "iq1_s", 256, 50, 1, 1)                                                         \
    X(20, "iq4_nl", 32, 18, 1, 1)                                                         \
    X(21, "iq3_s", 256, 110, 1, 1)                                                        \
    X(22, "iq2_s", 256, 82, 1, 1)                                                         \
    X(23, "iq4_xs", 256, 136, 1, 1)                                                       \
    X(24, "i8", 1, 1, 1, 0)                                                               \
    X(25, "i16", 1, 2, 1, 0)                                                              \
    X(26, "i32", 1, 4, 1, 0)                                                              \
    X(27, "i64", 1, 8, 1, 0)                                                              \
    X(28, "f64", 1, 8, 1, 0)                                                              \
    X(29, "iq1_m", 256, 56, 1, 1)                                                         \
    X(30, "bf16", 1, 2, 1, 0)                                                             \
    X(34, "tq1_0", 256, 54, 1, 1)                                                         \
    X(35, "tq2_0", 256, 66, 1, 1)                                                         \
    X(39, "mxfp4", 32, 17, 1, 1)                                                          \
    X(1024, "fp8_e4m3_b128", 128, 129, 0, 1)                                              \
    X(1025, "fp8_e4m3_b32", 32, 33, 0, 1)                                                 \
    X(1026, "fp8_e4m3_r32", 32, 33, 0, 1)

#define DSIB_TYPE_ENTRY_(id, nm, b, sz, rm, q) {id, nm, b, sz, rm, q},

/* Geometry of a type id, or NULL for an id the table does not know. */
static inline const dsib_type_info *dsib_type_info_get(int32_t type) {
    static const dsib_type_info table[] = {DSIB_TYPE_TABLE(DSIB_TYPE_ENTRY_)};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].type == type) return &table[i];
    return NULL;
}

/* Bytes of one row of `ne0` elements: ceil(ne0 / blck) · type_size, or exactly
 * ne0 / blck · type_size for row_multiple types. 0 for an unknown type, ne0 < 0, a length
 * the type does not allow, or a result beyond 2^62. */
static inline uint64_t dsib_type_row_bytes(int32_t type, int64_t ne0) {
    const dsib_type_info *t = dsib_type_info_get(type);
    if (!t || ne0 < 0 || ne0 > ((int64_t)1 << 50)) return 0;
    uint64_t n = (uint64_t)ne0;
    if (t->row_multiple && n % t->blck) return 0;
    return (n / t->blck + (n % t->blck != 0)) * t->type_size;
}

#endif /* DSIB_TYPES_H */
