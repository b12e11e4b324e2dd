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
};

struct dsib_buffer {
    uint8_t *ptr;
    uint64_t size;
    uint32_t flags;
    int32_t owned;               /* 1: allocated by buffer_alloc (freed with it) */
};

/* Host pointer of a view (CPU buffers are host memory). */
static inline float *dsib_cpu_f32(dsib_view v) { return (float *)(void *)(v.buf->ptr + v.offset); }
static inline int32_t *dsib_cpu_i32(dsib_view v) {
    return (int32_t *)(void *)(v.buf->ptr + v.offset);
}
static inline const uint8_t *dsib_cpu_wptr(const dsib_weight *w) { return w->buf->ptr + w->offset; }

/* Host allocation through the instance's allocator (size 0 → 1 byte). */
void *dsib_cpu_malloc(dsib_instance *inst, size_t size);
void dsib_cpu_free(dsib_instance *inst, void *p);

/* Dequantises one row of a weight (`row` within expert `expert`) into dst (ne[0] floats).
 * Supports F32, F16, BF16, I32 (converted), and every type lib/quant implements. */
dsi_status dsib_cpu_weight_row(const dsib_weight *w, int32_t expert, int64_t row, float *dst);
/* Reads element i of a 1-D f32 weight (vec class: F32; F16/BF16 converted). */
float dsib_cpu_weight_f32(const dsib_weight *w, int64_t i);

/* The op table (ops.c). The V4.1 ops plug in without editing ops.c: if
 * backends/cpu/ops_v41.h exists, ops.c includes it and expands its macro
 * DSIB_CPU_OPS_V41_INIT (designated initializers, e.g. `.engram_gate = dsib_cpu_engram_gate,`)
 * at the end of the table; ops_v41.h declares those functions (defined in ops_v41.c). */
extern const dsib_ops dsib_cpu_ops;

#endif /* DSIB_CPU_IMPL_H */
