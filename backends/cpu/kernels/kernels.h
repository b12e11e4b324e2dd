/*
 * backends/cpu/kernels/kernels.h — CPU weight-matmul kernels.
 *
 *   y[t][o] = sum_i W[o][i] * x[t][i]     o in [0, n_out), t in [0, n_tok), i in [0, n_in)
 *
 * W is a row-major weight of any supported storage type (row o starts at w + o*w_row_bytes;
 * a row holds n_in elements in the type's block layout: ggml's for the ggml types,
 * docs/tensor-types.md for the FP8 block types). x and y are f32 with element strides
 * x_stride / y_stride between tokens (>= n_in / n_out). Weights are used in place and
 * decoded in registers.
 *
 * ---- Two activation paths (docs/performance.md §2) ------------------------------------
 *
 * DEFAULT (flags = 0): for the integer-coded weight types (Q8_0, Q4_K, Q2_K, MXFP4 and every
 * further ggml type: the K-quants, Q4_0 … Q5_1, IQ4_*, IQ3_*, IQ2_*, IQ1_*) each token's x
 * row is quantised ONCE per call
 * to signed 8-bit blocks with an f32 scale (dsib_kern_act_quantize: d = amax/127, q =
 * round-to-nearest-even(x * 127/amax), plus int16 block sums), in the block structure of
 * the weight type (an activation format, DSIB_ACT_*). The dot products are then exact
 * integer sums (AVX2 maddubs/madd, AVX-512 VNNI dpbusd/dpwssd) over fixed groups of four
 * elements ("lanes"), scaled and accumulated in f32 in a fixed order (the type's
 * canonical order, documented in its file; Q8_0 sums each 32-element block whole and keeps
 * one chain per output, the "block-sum order", so its kernels hold rows in the lanes). Because the integer part is exact and the float
 * part is the same sequence on every ISA, the scalar, AVX2 and AVX-512 paths give
 * BIT-IDENTICAL results for these types. Float weight types (F32/F16/BF16) and the FP8
 * block types keep f32 activations on this path (act format DSIB_ACT_F32).
 *
 * EXACT (flags & DSIB_MM_EXACT): f32 activations for every type (the weights decoded to f32
 * in registers, f32 FMA accumulation). Used for tight comparisons against the NumPy
 * reference (the context flag DSI_CONTEXT_FLAG_EXACT_MATMUL selects it for a context).
 *
 * ---- Invariance contract (model-spec §10.4), both paths ---------------------------------
 * Every y[t][o] is computed by one thread with one fixed sequence of floating-point
 * operations that depends only on (type, n_in, path, and for the exact path the ISA chosen
 * for the process) — never on n_tok, the token or row tile, the thread count or the row
 * chunking; activation quantisation depends on the token's own x row only. So a GEMM row
 * equals the GEMV dot product bit for bit, and chunked prefill, whole-prompt prefill and
 * token-by-token decode agree exactly. Work is split over output rows only, never over the
 * reduction dimension.
 *
 * ---- ISA paths ------------------------------------------------------------------------
 * scalar (portable C, always), AVX2+FMA+F16C, AVX-512 (F/BW/VL/DQ) and AVX-512 + VNNI on
 * x86-64, chosen once per process by CPU detection (the first call fixes it); AMX (Q8_0's
 * tiles, same bits; other types use the VNNI kernels) only with DSINFER_CPU_AMX=1
 * (kernels.c says why). Inside the
 * AVX-512 VNNI path the IQ grid types take AVX512_VBMI variants and Q2_K / Q4_K / Q5_K
 * AVX512_VBMI2 ones where the CPU has them (same bits; dsib_kern_iq2_vbmi and
 * dsib_kern_kq_vbmi2 below select the plain ones for tests). The SIMD
 * code is compiled per function for its target, so the library runs on any x86-64. Tests
 * reach a specific path through dsib_kern_table_for().
 *
 * ---- Adding a weight type to the default path (one new file + one table entry) ----------
 *  1. Write backends/cpu/kernels/<type>.c (mxfp4.c / iq4.c for 32-element blocks, q4_k.c /
 *     q2_k.c for 256-element super-blocks are the templates) defining
 *       const dsib_kern_qtype dsib_kq_<type> = { .type, .act, .qrows = {scalar, avx2,
 *                                                 avx512, avx512vnni} };
 *     qrows[ISA] computes rows [o0, o1) for n tokens from quantised activations
 *     (dsib_qrow). A NULL entry falls back to the next lower ISA (the scalar entry is
 *     required). Choose the activation format whose 32-element group order matches the
 *     weight's packing (DSIB_ACT_Q8_32 for 32-element blocks, DSIB_ACT_Q8_K / _P4 / _P2 for
 *     256-element super-blocks) — or add a format in act.c. Keep the float part of each
 *     output the same sequence on every ISA (integer sums are exact, so only the lane
 *     structure and the order of the f32 scale-and-accumulate steps matter) and document it.
 *     The shared templates do most of it: a 32-element-block type on Q8_32 activations
 *     supplies its block decode to DSIB_Q8_32_TILE_AVX2 / DSIB_Q8_32_TILE_AVX512 (simd_*.h)
 *     and dsib_q8_32_step_scalar; a K-quant whose sub-block scales apply per int16 lane
 *     supplies a super-block decode (weights, scale vectors, mins, d/dmin) to
 *     DSIB_KQ_TILE_AVX2 / DSIB_KQ_TILE_AVX512; DSIB_QROWS_DEFINE* / DSIB_QROWS_SCALAR
 *     make the row kernels.
 *  2. Add one line to kern_types[] in kernels.c (geometry + the descriptor), and the file to
 *     the CMakeLists.txt / meson.build beside this one.
 *  The exact path then works automatically (weights dequantised through lib/quant in the
 *  scalar exact kernel) unless the type also gets SIMD exact kernels.
 *  tests/unit/cpukernels checks every type of the table on every ISA against a
 *  double-precision reference (add the type's decoder there).
 *
 * None of these functions print, abort or keep state. The default path allocates one
 * scratch buffer per call for the quantised activations (the pool's allocator; rows of
 * <= 12 KiB for one token live on the stack); everything else is stack only.
 */
#ifndef DSIB_CPU_KERNELS_H
#define DSIB_CPU_KERNELS_H

#include "dsinfer.h"
#include "backends/cpu/threadpool.h"

#include <stddef.h>
#include <stdint.h>

enum {
    DSIB_ISA_SCALAR = 0,
    DSIB_ISA_AVX2 = 1,       /* AVX2 + FMA + F16C */
    DSIB_ISA_AVX512 = 2,     /* AVX-512 F + BW + VL + DQ */
    DSIB_ISA_AVX512VNNI = 3, /* the above + AVX512_VNNI */
    DSIB_ISA_AMX = 4,        /* the above + AMX-TILE + AMX-INT8, tile data granted by the OS */
    DSIB_ISA_COUNT = 5
};

/* Matmul flags. */
#define DSIB_MM_EXACT (1u << 0) /* f32 activations for every type (the exact path) */

/* Activation formats (what a token row becomes before the dot products). */
enum {
    DSIB_ACT_F32 = 0,     /* f32 as given: float weight types, FP8, and the exact path */
    DSIB_ACT_Q8_32 = 1,   /* 32-element blocks: q natural order, d per block, s = sum q */
    DSIB_ACT_Q8_K = 2,    /* 256-element blocks: q natural order, d per block, s per 16 */
    DSIB_ACT_Q8_K_P4 = 3, /* as Q8_K, the eight 32-element groups of a block stored in the
                           * order 0,2,1,3,4,6,5,7 (Q4_K / Q5_K nibble packing) */
    DSIB_ACT_Q8_K_P2 = 4, /* as Q8_K, groups stored 0,4,1,5,2,6,3,7 (Q2_K / Q3_K packing) */
    DSIB_ACT_COUNT = 5
};

/* One token's quantised activation row (views into a buffer written by the act_quantize
 * function of a kernel table). q[] holds n_in values in the format's storage order; d[k] is
 * the scale of block k (32 or 256 elements; x ≈ d·q); s[] holds int16 sums of q: one per
 * block for Q8_32, one per 16 NATURAL elements for the Q8_K formats (element order before
 * the group permutation); c[] (Q8_32 only, else NULL) holds c[j] = -128·Σ_{k<4} q[4j+k],
 * the start value of lane j for kernels that multiply w + 128 (unsigned) by q; e[] (Q8_32
 * only) the scales of block pair p as 16 lanes, e[16p + j] = d[2p + j/8] (0 past the end). */
typedef struct dsib_qrow {
    const int8_t *q;
    const float *d;
    const int16_t *s;
    const int32_t *c;
    const float *e;
} dsib_qrow;

/* Bytes of one quantised activation row of n_in elements (a multiple of 64; 0 for
 * DSIB_ACT_F32 or an invalid n_in: the Q8 formats need n_in % block == 0). */
size_t dsib_kern_act_row_bytes(int32_t fmt, int64_t n_in);
/* Activation format a matmul of `type` uses with `flags` (DSIB_ACT_F32 on the exact path). */
int32_t dsib_kern_act_format(int32_t type, uint32_t flags);
/* The views of a row written at `row` (aligned to 64) for n_in elements. */
dsib_qrow dsib_kern_act_view(int32_t fmt, const void *row, int64_t n_in);

/* Single-threaded exact-path row range: computes y[t][o] for o in [o_begin, o_end), all t.
 * The pointers are the same as for the whole matrix (w = row 0, y = column 0). Arguments
 * are not checked (call dsib_kern_check first). Results equal dsib_matmul with
 * DSIB_MM_EXACT. */
typedef void (*dsib_matmul_rows_fn)(int32_t type, const void *w, size_t w_row_bytes,
                                    int64_t n_in, int64_t o_begin, int64_t o_end,
                                    const float *x, int64_t x_stride, float *y,
                                    int64_t y_stride, int64_t n_tok);

/* Quantises n_tok rows of x (x_stride floats apart) into act (act_stride bytes apart,
 * >= dsib_kern_act_row_bytes(fmt, n_in), act 64-byte aligned). Every ISA writes the same
 * bytes. */
typedef void (*dsib_act_quantize_fn)(int32_t fmt, const float *x, int64_t x_stride,
                                     int64_t n_in, int64_t n_tok, void *act,
                                     size_t act_stride);

/* Single-threaded default-path row range from quantised activations (format
 * dsib_kern_act_format(type, 0), rows act_stride bytes apart). Results equal dsib_matmul
 * with flags 0. For types whose format is DSIB_ACT_F32 use matmul_rows. */
typedef void (*dsib_qmatmul_rows_fn)(int32_t type, const void *w, size_t w_row_bytes,
                                     int64_t n_in, int64_t o_begin, int64_t o_end,
                                     const void *act, size_t act_stride, float *y,
                                     int64_t y_stride, int64_t n_tok);

typedef struct dsib_kern_table {
    int32_t isa;                 /* DSIB_ISA_* */
    const char *name;            /* "scalar", "avx2", "avx512", "avx512vnni", "amx" */
    dsib_matmul_rows_fn matmul_rows;
    dsib_act_quantize_fn act_quantize;
    dsib_qmatmul_rows_fn qmatmul_rows;
} dsib_kern_table;

/* The table the process uses (chosen on first call by CPU detection; [thread-safe]). */
const dsib_kern_table *dsib_kern_table_get(void);
/* The table of one ISA, or NULL when this build or this CPU cannot run it (tests). */
const dsib_kern_table *dsib_kern_table_for(int32_t isa);
/* Name of the process's path. */
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
 * on the caller). `flags`: DSIB_MM_*. Checks its arguments with dsib_kern_check.
 * OUT_OF_HOST_MEMORY if the activation scratch cannot be allocated. [thread-safe] */
dsi_status dsib_matmul(dsib_threadpool *pool, uint32_t flags, int32_t type, const void *w,
                       size_t w_row_bytes, int64_t n_in, int64_t n_out, const float *x,
                       int64_t x_stride, float *y, int64_t y_stride, int64_t n_tok);

/* Same for one expert of a stacked MoE weight: W = w_base + expert * expert_stride bytes
 * (expert_stride >= n_out * w_row_bytes). */
dsi_status dsib_matmul_expert(dsib_threadpool *pool, uint32_t flags, int32_t type,
                              const void *w_base, size_t expert_stride, int32_t expert,
                              size_t w_row_bytes, int64_t n_in, int64_t n_out,
                              const float *x, int64_t x_stride, float *y, int64_t y_stride,
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
 * are checked against n_experts. On the default path every x row that some slot uses is
 * quantised once.
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
    uint32_t flags;              /* DSIB_MM_* */
} dsib_moe_matmul;

dsi_status dsib_matmul_moe(dsib_threadpool *pool, const dsib_moe_matmul *m, char *msg,
                           size_t msg_size);
/* Two MoE matmuls (e.g. the experts' gate and up) in ONE parallel_for (one barrier); when
 * both read the same x rows in the same activation format they are quantised once. Each
 * result equals dsib_matmul_moe of that descriptor alone. Outputs must not overlap. */
dsi_status dsib_matmul_moe2(dsib_threadpool *pool, const dsib_moe_matmul *a,
                            const dsib_moe_matmul *b, char *msg, size_t msg_size);

/*
 * Several independent matmuls in ONE parallel_for (one barrier instead of n): e.g. the
 * projections that read the same normalized input (q_a and kv), the shared expert's gate
 * and up, or the groups of a grouped projection (x offset per group). Each result equals
 * dsib_matmul of that descriptor alone (with the same flags). Outputs must not overlap.
 * n may be any size (descriptors are run 64 at a time).
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

dsi_status dsib_matmul_batch(dsib_threadpool *pool, uint32_t flags, const dsib_matmul_desc *d,
                             int32_t n, char *msg, size_t msg_size);

/* Bytes of software prefetch ahead of the weight stream (kernels_impl.h DSIB_PF; default
 * DSIB_PREFETCH_BYTES, 0: off). Speed only; set before any matmul runs (dsinfer-bench
 * --prefetch, for A/B). */
extern int32_t dsib_kern_prefetch;
/* Bytes ahead of the far, L2-only level of the same prefetch (kernels_impl.h
 * DSIB_PREFETCH2_BYTES, 0: off; nothing is prefetched while dsib_kern_prefetch is 0). Speed
 * only; set before any matmul runs (dsinfer-bench --prefetch2). */
extern int32_t dsib_kern_prefetch2;
/* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S on the AVX-512 VNNI path: 1 (default) = their
 * AVX512_VBMI variants (grid codes looked up in registers) where the CPU has it, 0 = the
 * plain AVX-512 ones. Same results; for tests and A/B benchmarks, set before any matmul
 * runs. */
extern int32_t dsib_kern_iq2_vbmi;
/* Q2_K, Q4_K and Q5_K on the AVX-512 VNNI path: 1 (default) = their AVX512_VBMI2 tiles (the
 * pairs of lane sums without a blend, simd_avx512.h DSIB_KQ_S_VB2_) where the CPU has it,
 * 0 = the plain ones. Same results; for tests and A/B benchmarks, set before any matmul
 * runs. */
extern int32_t dsib_kern_kq_vbmi2;
/* The sixteen-row tiles of the block-sum order (Q8_0, Q4_K, Q2_K on the AVX-512 VNNI path)
 * read their rows' scale dwords with 16-lane gathers (1) or with sixteen loads and a
 * transpose (0); -1 (default): by the CPU's vendor — loads on AMD and Hygon cores, whose
 * gathers are slow, gathers elsewhere (simd_avx512.h dsib_rows16_dwords_avx512). Same
 * results; for tests and A/B benchmarks (dsinfer-bench --rows16-gather), set before any
 * matmul runs. dsib_kern_rows16_gather_on() is the choice in effect. */
extern int32_t dsib_kern_rows16_gather;
int dsib_kern_rows16_gather_on(void);
/* Q8_0's one-token calls on rows of at least DSIB_Q8_ROWS8_MIN_IN columns (a multiple of 128)
 * on the AVX-512 VNNI path: 1 = tiles of eight rows, each row read 136 contiguous bytes per
 * step (eight streams per thread), 0 = the sixteen-row tiles (sixteen streams); -1
 * (default): by the CPU's vendor — eight rows on AMD and Hygon cores, whose prefetchers lose
 * pace over sixteen long streams (q8_0.c q8_0_bs_token8), sixteen elsewhere. Same results;
 * for tests and A/B benchmarks (dsinfer-bench --q8-rows8), set before any matmul runs.
 * dsib_kern_q8_rows8_on() is the choice in effect. */
#define DSIB_Q8_ROWS8_MIN_IN 2048
extern int32_t dsib_kern_q8_rows8;
int dsib_kern_q8_rows8_on(void);

#endif /* DSIB_CPU_KERNELS_H */
