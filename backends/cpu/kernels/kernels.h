/*
 * backends/cpu/kernels/kernels.h — CPU weight-matmul kernels.
 *
 *   y[t][o] = sum_i W[o][i] * x[t][i]     o in [0, n_out), t in [0, n_tok), i in [0, n_in)
 *
 * W is a row-major weight of any supported storage type (row o starts at w + o*w_row_bytes;
 * a row holds n_in elements in the type's block layout: ggml's for the ggml types,
 * docs/model-files.md / lib/quant/quant.h for the FP8 block types). x and y are f32 with
 * element strides x_stride / y_stride between tokens (>= n_in / n_out). Weights are
 * decoded on the fly in registers; activations stay f32 (no activation quantisation);
 * accumulation is f32.
 *
 * Invariance contract (model-spec §10.4): every y[t][o] is computed by one thread with one
 * fixed sequence of floating-point operations that depends only on (type, n_in, the ISA
 * path chosen for the process) — never on n_tok, the token tile, the thread count or the
 * row chunking. So a GEMM row equals the GEMV dot product bit for bit, and chunked prefill,
 * whole-prompt prefill and token-by-token decode agree exactly. Work is split over output
 * rows only, never over the reduction dimension.
 *
 * ISA paths: scalar (portable C, always), AVX2+FMA(+F16C) and AVX-512 (F/BW/VL/DQ) on
 * x86-64, chosen once per process by CPU detection (the first call fixes it; it never
 * changes afterwards). Different ISA paths sum in different lane orders, so their results
 * differ in the last bits (tolerances: docs/performance.md); within a process all calls
 * use the same path. Tests reach a specific path through dsib_kern_table_for().
 *
 * Supported types (dsib_kern_type_supported): F32, F16, BF16, Q8_0, Q4_K, Q2_K, MXFP4,
 * FP8_E4M3_B128, FP8_E4M3_B32. ggml types need n_in % block == 0; the FP8 block types
 * allow any n_in (the last block of a row is padded; padding is never read as data).
 * FP8 decoding assumes finite values (E4M3 NaN codes 0x7F/0xFF decode as ±480, not NaN).
 *
 * None of these functions print, allocate (beyond a few KiB of stack) or abort.
 */
#ifndef DSIB_CPU_KERNELS_H
#define DSIB_CPU_KERNELS_H

#include "dsinfer.h"
#include "backends/cpu/threadpool.h"

#include <stddef.h>
#include <stdint.h>

enum {
    DSIB_ISA_SCALAR = 0,
    DSIB_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    DSIB_ISA_AVX512 = 2, /* AVX-512 F + BW + VL + DQ */
    DSIB_ISA_COUNT = 3
};

/* Single-threaded row range: computes y[t][o] for o in [o_begin, o_end), all t. The
 * pointers are the same as for the whole matrix (w = row 0, y = column 0). Use this to fuse
 * several matmuls into one parallel_for of your own; results are identical to dsib_matmul.
 * Arguments are not checked (call dsib_kern_check / dsib_kern_type_supported first). */
typedef void (*dsib_matmul_rows_fn)(int32_t type, const void *w, size_t w_row_bytes,
                                    int64_t n_in, int64_t o_begin, int64_t o_end,
                                    const float *x, int64_t x_stride, float *y,
                                    int64_t y_stride, int64_t n_tok);

typedef struct dsib_kern_table {
    int32_t isa;                 /* DSIB_ISA_* */
    const char *name;            /* "scalar", "avx2", "avx512" */
    dsib_matmul_rows_fn matmul_rows;
} dsib_kern_table;

/* The table the process uses (chosen on first call by CPU detection; [thread-safe]). */
const dsib_kern_table *dsib_kern_table_get(void);
/* The table of one ISA, or NULL when this build or this CPU cannot run it (tests). */
const dsib_kern_table *dsib_kern_table_for(int32_t isa);
/* Name of the process's path ("scalar", "avx2", "avx512"). */
const char *dsib_kern_isa_name(void);

/* 1 if `type` (DSI_TYPE_*) has matmul kernels. */
int dsib_kern_type_supported(int32_t type);
/* Elements per block of a supported type (1 for F32/F16/BF16), 0 otherwise. */
int64_t dsib_kern_block_elems(int32_t type);
/* Bytes of one row of n_in elements of `type` (0 if unsupported or n_in is invalid for
 * the type: negative, or not a multiple of the block for ggml types). */
size_t dsib_kern_row_bytes(int32_t type, int64_t n_in);

/* Checks a matmul's arguments: supported type, n_in valid for the type, w_row_bytes >=
 * dsib_kern_row_bytes, strides >= n_in / n_out, sizes >= 0. Returns DSI_OK, or
 * UNSUPPORTED / INVALID_ARGUMENT with a message in `msg` (may be NULL). */
dsi_status dsib_kern_check(int32_t type, int64_t n_in, int64_t n_out, size_t w_row_bytes,
                           int64_t x_stride, int64_t y_stride, char *msg, size_t msg_size);

/* y = W x for n_tok tokens, rows split over the pool's threads (pool may be NULL: runs
 * on the caller). Checks its arguments with dsib_kern_check. [thread-safe] */
dsi_status dsib_matmul(dsib_threadpool *pool, int32_t type, const void *w,
                       size_t w_row_bytes, int64_t n_in, int64_t n_out, const float *x,
                       int64_t x_stride, float *y, int64_t y_stride, int64_t n_tok);

/* Same for one expert of a stacked MoE weight: W = w_base + expert * expert_stride bytes
 * (expert_stride >= n_out * w_row_bytes). */
dsi_status dsib_matmul_expert(dsib_threadpool *pool, int32_t type, const void *w_base,
                              size_t expert_stride, int32_t expert, size_t w_row_bytes,
                              int64_t n_in, int64_t n_out, const float *x,
                              int64_t x_stride, float *y, int64_t y_stride,
                              int64_t n_tok);

/*
 * Routed MoE matmul, all experts of a step in ONE parallel_for (no barrier per expert).
 * Group g (0 <= g < n_groups) applies expert experts[g] to "slots" s in
 * [slot_offs[g], slot_offs[g+1]):
 *
 *   y[yrow(s)][o] = sum_i W_e[o][i] * x[xrow(s)][i]
 *
 * with xrow(s) = x_rows ? x_rows[s] : s and yrow(s) = y_rows ? y_rows[s] : s. A typical
 * decode/prefill step groups the (token, k) pairs by expert: x_rows maps each slot to its
 * token's row of the normalized hidden state, and y is a slot-ordered scratch that the
 * caller combines with the routing weights. Each slot's result equals dsib_matmul of that
 * token alone (same operation order). Distinct slots must have distinct y rows. Experts
 * are checked against n_experts.
 */
typedef struct dsib_moe_matmul {
    int32_t type;
    const void *w_base;          /* expert 0, row 0 */
    size_t expert_stride;        /* bytes between experts */
    size_t w_row_bytes;
    int64_t n_in, n_out;
    int32_t n_experts;           /* experts in the stack (bounds check) */
    int32_t n_groups;
    const int32_t *experts;      /* [n_groups] */
    const int64_t *slot_offs;    /* [n_groups + 1], non-decreasing, slot_offs[0] = 0 */
    const int64_t *x_rows;       /* [n_slots] or NULL */
    const int64_t *y_rows;       /* [n_slots] or NULL */
    const float *x;
    int64_t x_stride;
    float *y;
    int64_t y_stride;
} dsib_moe_matmul;

dsi_status dsib_matmul_moe(dsib_threadpool *pool, const dsib_moe_matmul *m, char *msg,
                           size_t msg_size);

/*
 * Several independent matmuls in ONE parallel_for (one barrier instead of n): e.g. the
 * projections that read the same normalized input (q_a and kv), the shared expert's gate
 * and up, or the groups of a grouped projection (x offset per group). Each result equals
 * dsib_matmul of that descriptor alone. Outputs must not overlap. n may be any size
 * (descriptors are run 64 at a time).
 */
typedef struct dsib_matmul_desc {
    int32_t type;
    const void *w;
    size_t w_row_bytes;
    int64_t n_in, n_out;
    const float *x;
    int64_t x_stride;
    float *y;
    int64_t y_stride;
    int64_t n_tok;
} dsib_matmul_desc;

dsi_status dsib_matmul_batch(dsib_threadpool *pool, const dsib_matmul_desc *d, int32_t n,
                             char *msg, size_t msg_size);

#endif /* DSIB_CPU_KERNELS_H */
