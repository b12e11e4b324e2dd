/*
 * backends/cpu/cpu_impl.h — private definitions of the built-in CPU backend, shared by its
 * files (cpu_backend.c, ops.c, ops_v41.c). Never included by core code.
 */
#ifndef DSIB_CPU_IMPL_H
#define DSIB_CPU_IMPL_H

#include "backends/backend.h"
#include "backends/cpu/threadpool.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct dsib_instance {
    dsib_host host;
    dsib_threadpool *pool;
    atomic_ullong mem_used;      /* bytes of buffers allocated (not wrapped) */
    /* Statistics (dsinfer-bench reads them through this header): routed-expert weight
     * bytes moe_experts read (each selected expert once per call) and its calls; the
     * floating-point operations of attn_sink's products, 4 · hd per (query, head, attended
     * row): q·k and the e·v accumulation, one multiply and one add per element each. */
    atomic_ullong stat_expert_bytes, stat_expert_calls, stat_attn_flops;
};

struct dsib_buffer {
    uint8_t *ptr;
    uint64_t size;
    uint32_t flags;
    int32_t owned;               /* 1: allocated by buffer_alloc (freed with it) */
};

/* rope_tail's tables, remembered on the stream (ops.c): the §3.9 frequencies of the last
 * two RoPE parameter sets, and cos / sin rows of (parameter set, position) pairs in
 * DSIB_CPU_ROPE_ROWS entries, direct-mapped by the position and the set. A decode step
 * rotates every layer's q, kv and output at the same position (one per sequence of a batch)
 * with one of two parameter sets, which recomputed 32 pow and 32 cos / sin in double per
 * call; the remembered values are the same numbers. Calls of more than DSIB_CPU_ROPE_ROWS_N
 * rows (prefill) and rotations of more than 2 · DSIB_CPU_ROPE_ROW_HALF dimensions compute
 * their rows without them. valid = 0: empty (the stream is zeroed at creation). */
#define DSIB_CPU_ROPE_MAX_HALF 256
#define DSIB_CPU_ROPE_ROW_HALF 64
#define DSIB_CPU_ROPE_ROWS 32
#define DSIB_CPU_ROPE_ROWS_N 16
typedef struct dsib_cpu_rope_freqs {
    int32_t valid;
    dsib_rope key;
    double f[DSIB_CPU_ROPE_MAX_HALF];
} dsib_cpu_rope_freqs;
typedef struct dsib_cpu_rope_row {
    int32_t valid;
    int64_t pos; /* entry r holds rope_f[r % 2]'s rows */
    float cs[DSIB_CPU_ROPE_ROW_HALF], sn[DSIB_CPU_ROPE_ROW_HALF];
} dsib_cpu_rope_row;

/* A CPU stream: ops run at once on the calling thread (and the instance's pool); the stream
 * holds the workspace its ops use (sized from the desc at creation) and the first failure
 * since the last sync. */
struct dsib_stream {
    dsib_instance *inst;
    dsib_stream_desc desc;
    uint8_t *ws;                 /* 64-byte aligned workspace */
    size_t ws_size;
    void *ws_raw;
    dsi_status status;
    dsib_cpu_rope_freqs rope_f[2];
    dsib_cpu_rope_row rope_r[DSIB_CPU_ROPE_ROWS];
    uint32_t rope_f_next; /* the rope_f entry replaced next (round robin) */
};

/* CPU work completes when its op returns: events are always complete. */
struct dsib_event {
    int32_t recorded;
};

/* Host pointer of a view (CPU buffers are host memory). */
static inline float *dsib_cpu_f32(dsib_view v) { return (float *)(void *)(v.buf->ptr + v.offset); }
static inline int32_t *dsib_cpu_i32(dsib_view v) {
    return (int32_t *)(void *)(v.buf->ptr + v.offset);
}
static inline const uint8_t *dsib_cpu_wptr(const dsib_weight *w) { return w->buf->ptr + w->offset; }

/* Workspace of a stream: `bytes` at the start of it, or NULL when the stream was created for
 * smaller shapes (the op then fails with DSI_ERR_INVALID_ARGUMENT). */
static inline void *dsib_cpu_ws(dsib_stream *s, size_t bytes) {
    return bytes <= s->ws_size ? s->ws : NULL;
}
/* Records the first failure on the stream (reported again by sync) and returns st. */
static inline dsi_status dsib_cpu_ret(dsib_stream *s, dsi_status st) {
    if (st != DSI_OK && s->status == DSI_OK) s->status = st;
    return st;
}
/* Row t of step rows (int32 [n][DSIB_ROW_WORDS]). */
static inline const int32_t *dsib_cpu_row(dsib_view rows, uint32_t t) {
    return dsib_cpu_i32(rows) + (size_t)t * DSIB_ROW_WORDS;
}
/* Checks step rows against n and a slot count (0: not checked): positions >= 0, each
 * sequence's rows contiguous at consecutive positions. DSI_OK or INVALID_ARGUMENT. */
dsi_status dsib_cpu_rows_check(dsib_view rows, uint32_t n, uint32_t slots);
/* Widest packed index key the indexers decode on the stack (released shapes: 128). */
#define DSIB_CPU_MAX_KEY 1024u

/* Bytes per row of a state view (row_bytes 0 = ld f32 values). */
static inline uint64_t dsib_cpu_state_rb(const dsib_state *st) {
    return st->row_bytes ? st->row_bytes : (uint64_t)st->ld * 4u;
}
/* First byte of row r of slot `slot` of a state view (any format). */
static inline uint8_t *dsib_cpu_state_bytes(const dsib_state *st, uint32_t slot, uint64_t r) {
    return st->buf->ptr + st->offset + ((uint64_t)slot * st->rows + r) * dsib_cpu_state_rb(st);
}
/* Row r of slot `slot` of an f32 state view. */
static inline float *dsib_cpu_state_row(const dsib_state *st, uint32_t slot, uint64_t r) {
    return (float *)(void *)dsib_cpu_state_bytes(st, slot, r);
}
/* INVALID_ARGUMENT / UNSUPPORTED for a state view the CPU cannot use: f32 rows of at least
 * `width` values. */
dsi_status dsib_cpu_state_check(const dsib_state *st, uint32_t width);
/* The same for ops that read / write packed rows too (lib/quant/statepack.h): f32 rows of
 * at least `width` values, or packed rows of exactly `width` values. */
dsi_status dsib_cpu_state_check_packed(const dsib_state *st, uint32_t width);

/* Host allocation through the instance's allocator (size 0 → 1 byte). */
void *dsib_cpu_malloc(dsib_instance *inst, size_t size);
void dsib_cpu_free(dsib_instance *inst, void *p);

/* Dequantises one row of a weight (`row` within expert `expert`) into dst (ne[0] floats).
 * Supports F32, F16, BF16, I32 (converted), and every type lib/quant implements. */
dsi_status dsib_cpu_weight_row(const dsib_weight *w, int32_t expert, int64_t row, float *dst);
/* Reads element i of a 1-D f32 weight (vec class: F32; F16/BF16 converted). */
float dsib_cpu_weight_f32(const dsib_weight *w, int64_t i);

/* The ISA path of the ops that have SIMD variants (ops.c; the sink attention): the
 * kernels' process ISA (DSIB_ISA_*), unless forced. Every path gives the same bits (the
 * SIMD code performs the scalar code's operations in the scalar code's order). */
int32_t dsib_cpu_ops_isa(void);
/* Forces the ops' ISA path (tests, benchmarks): DSIB_ISA_SCALAR .. or −1 for detection.
 * Not while ops run. */
void dsib_cpu_ops_force_isa(int32_t isa);

/* Nonzero: moe_experts runs the routed experts' gate and up as two jobs instead of one
 * (benchmark A/B only; set while no op runs). */
extern int dsib_cpu_moe_split;

/* The op table (ops.c). The V4.1 ops plug in without editing ops.c: if
 * backends/cpu/ops_v41.h exists, ops.c includes it and expands its macro
 * DSIB_CPU_OPS_V41_INIT (designated initializers, e.g. `.engram_gate = dsib_cpu_engram_gate,`)
 * at the end of the table; ops_v41.h declares those functions (defined in ops_v41.c). */
extern const dsib_ops dsib_cpu_ops;

/* Tests (ops.c): attention's exp (the scalar code; the SIMD paths give the same bits). */
float dsib_cpu_attn_exp(float x);

/* Tests (ops.c): V4's indexer scores of keys [c0, c1) of slot 0 by the op's own path. */
void dsib_cpu_indexer_v4_scores(const float *q, const float *w, const dsib_state *keys,
                                uint32_t heads, uint32_t hd, int64_t c0, int64_t c1, float *score);

/* Tests (ops.c): one packed state row decoded by attention's isa path (DSIB_ISA_AVX2 or
 * DSIB_ISA_AVX512): 1, or 0 where this build or CPU lacks it. */
int dsib_cpu_attn_unpack_row(int32_t isa, int32_t format, uint32_t width, uint32_t qcols,
                             uint32_t block, const uint8_t *src, float *dst);

#endif /* DSIB_CPU_IMPL_H */
