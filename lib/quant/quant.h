/*
 * Tensor storage types: traits, reference dequantize / dot / quantize per type.
 * Layouts are ggml's wherever ggml has the type (same ids, same block bytes); the FP8 block
 * types are libdsinfer extensions. docs/tensor-types.md is the normative description of
 * every layout.
 *
 * Vocabulary: a tensor's row is its ne[0] elements. A row is stored as
 * ceil(ne[0] / blck) blocks of `type_size` bytes. For types with `row_multiple` set (all
 * ggml types) ne[0] must be a multiple of blck; the FP8 block types allow any ne[0] and pad
 * the last block of each row (see docs/tensor-types.md).
 *
 * The reference kernels here are plain C, portable and exact to the format definition; the
 * CPU backend has its own fast kernels and is tested against these.
 */
#ifndef DSI_QUANT_QUANT_H
#define DSI_QUANT_QUANT_H

#include "base/base.h"

#include <stddef.h>
#include <stdint.h>

/* Block sizes (elements) of the supported formats. */
#define DSII_QK8_0 32
#define DSII_QK_K 256
#define DSII_QK_MXFP4 32
#define DSII_QK_FP8_B128 128
#define DSII_QK_FP8_B32 32

/* Bytes per block. */
#define DSII_Q8_0_BYTES 34      /* f16 d; int8 qs[32] */
#define DSII_Q4_K_BYTES 144     /* f16 d; f16 dmin; u8 scales[12]; u8 qs[128] */
#define DSII_Q2_K_BYTES 84      /* u8 scales[16]; u8 qs[64]; f16 d; f16 dmin */
#define DSII_MXFP4_BYTES 17     /* u8 e (E8M0); u8 qs[16] */
#define DSII_IQ2_XXS_BYTES 66   /* f16 d; u16 qs[32] */
#define DSII_FP8_B128_BYTES 129 /* u8 e (E8M0); u8 e4m3[128] */
#define DSII_FP8_B32_BYTES 33   /* u8 e (E8M0); u8 e4m3[32] */

/* Dequantizes `n` elements (a whole number of blocks, or a whole padded row for FP8 types:
 * then the padding elements are not written) from `src` into `dst`. */
typedef void (*dsii_dequantize_row_fn)(const void *src, float *dst, int64_t n);
/* Dot product of `n` quantized elements with f32 `y` (f32 accumulation, in element order
 * block by block). */
typedef float (*dsii_dot_fn)(const void *src, const float *y, int64_t n);
/* Quantizes `n` f32 elements into `dst` (round to nearest); returns bytes written
 * (= dsii_type_row_size for n). */
typedef size_t (*dsii_quantize_row_fn)(const float *src, void *dst, int64_t n);
/* Same with per-element importance weights `imat` (n values >= 0, or NULL) for the squared
 * error the quantizer minimizes (llama.cpp's imatrix; docs/tensor-types.md). */
typedef size_t (*dsii_quantize_row_w_fn)(const float *src, void *dst, int64_t n,
                                         const float *imat);

typedef struct dsii_type_traits {
    int32_t type;          /* DSI_TYPE_* / ggml type id */
    const char *name;      /* "f32", "q4_k", "fp8_e4m3_b128", … (static) */
    uint32_t blck;         /* elements per block */
    uint32_t type_size;    /* bytes per block */
    uint8_t row_multiple;  /* 1: ne[0] must be a multiple of blck (ggml rule) */
    uint8_t is_quantized;  /* 0 for plain scalar types (f32, f16, bf16, i8…f64) */
    uint8_t supported;     /* 1: dequantize_row and dot are available */
    uint8_t reserved;
    dsii_dequantize_row_fn dequantize_row; /* NULL when !supported */
    dsii_dot_fn dot;                       /* NULL when !supported */
    dsii_quantize_row_fn quantize_row;     /* NULL when the writer cannot produce the type */
    dsii_quantize_row_w_fn quantize_row_w; /* with importance weights; NULL where the type's
                                              quantizer has no use for them */
} dsii_type_traits;

/* Traits of a type id, or NULL for an id the table does not know. The geometry (name,
 * block, bytes, row rule) is the shared table of backends/types.h — one table for the core
 * and every backend; this module adds the reference kernels. It knows every
 * ggml type id up to MXFP4 (39) with its block geometry — so that any well-formed GGUF can
 * be validated and its tensors sized — plus the libdsinfer FP8 ids. Types known but not
 * implemented (Q8_1, Q8_K, TQ1_0, TQ2_0) have supported = 0: a model using them should fail
 * with DSI_ERR_UNSUPPORTED naming dsii_type_traits.name. */
const dsii_type_traits *dsii_type_get(int32_t type);

/* The type id named `name` ("q4_0", "iq2_xxs", "fp8_e4m3_b128", … as dsii_type_traits.name),
 * or -1 for a name the table does not know. */
int32_t dsii_type_by_name(const char *name);

/* Bytes of one row of `ne0` elements: ceil(ne0/blck) * type_size (or exactly ne0/blck *
 * type_size for row_multiple types). Returns 0 (and stores nothing) for an unknown type,
 * ne0 < 0, ne0 not a multiple of blck where required, or overflow; 1 on success. */
int dsii_type_row_size(int32_t type, int64_t ne0, uint64_t *bytes);

/* Bytes of a tensor of shape ne[0..n_dims) (n_dims 1..4; all ne >= 1): row size times the
 * product of the other dims. Same failure rules as dsii_type_row_size, plus overflow of
 * the product. */
int dsii_type_nbytes(int32_t type, const int64_t *ne, uint32_t n_dims, uint64_t *bytes);

/* Convenience wrappers that check the type: INVALID_ARGUMENT for unknown types or a bad n,
 * UNSUPPORTED ("tensor type iq2_xxs is not supported") for known-but-unimplemented ones. */
dsi_status dsii_dequantize_row(int32_t type, const void *src, float *dst, int64_t n,
                               dsii_error *err);
dsi_status dsii_dot_row(int32_t type, const void *src, const float *y, int64_t n,
                        float *out, dsii_error *err);
dsi_status dsii_quantize_row(int32_t type, const float *src, void *dst, int64_t n,
                             dsii_error *err);
/* dsii_quantize_row with importance weights (imat: n values, or NULL = uniform); types whose
 * quantizer ignores importance quantize as dsii_quantize_row does. */
dsi_status dsii_quantize_row_imat(int32_t type, const float *src, void *dst, int64_t n,
                                  const float *imat, dsii_error *err);

/* FP8 block-scaled 2-D quantization the way the official checkpoints are made
 * (model-spec §2.1): one E8M0 scale per `bs`×`bs` tile of a [rows, cols] row-major matrix
 * (bs = 128 for DSI_TYPE_FP8_E4M3_B128, 32 for DSI_TYPE_FP8_E4M3_B32); the scale of each
 * tile is written into every row's block of that tile, so the output is an ordinary tensor
 * of the given type with cols = ne[0], rows = ne[1]. For DSI_TYPE_FP8_E4M3_R32 (per-row
 * scales) this is quantize_row applied per row. Scale rule: s = 2^ceil(log2(amax/448)),
 * e4m3 RNE of x/s (amax 0 → s = 1). Output size: rows * dsii_type_row_size(type, cols). */
dsi_status dsii_quantize_fp8_2d(int32_t type, const float *src, int64_t cols, int64_t rows,
                                void *dst, dsii_error *err);

#endif /* DSI_QUANT_QUANT_H */
