/*
 * backends/cpu/cpu_backend.c — the built-in CPU backend: device description, host-memory
 * buffers (mmapped weights are wrapped in place, never copied), streams whose ops run at once
 * (each stream owns the workspace its ops use), always-complete events, and the op table of
 * ops.c.
 */
#include "backends/cpu/cpu_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *dsib_cpu_malloc(dsib_instance *inst, size_t size) {
    if (size == 0) size = 1;
    if (inst && inst->host.malloc_fn) return inst->host.malloc_fn(inst->host.alloc_ctx, size);
    return malloc(size);
}

void dsib_cpu_free(dsib_instance *inst, void *p) {
    if (!p) return;
    if (inst && inst->host.free_fn) {
        inst->host.free_fn(inst->host.alloc_ctx, p);
        return;
    }
    free(p);
}

static void set_err(dsib_error *err, const char *msg) {
    if (err) snprintf(err->msg, sizeof err->msg, "%s", msg);
}

static void cpu_desc(dsib_device_desc *d) {
    memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->type = DSI_DEVICE_CPU;
    snprintf(d->name, sizeof d->name, "CPU");
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) d->memory_total = (uint64_t)pages * (uint64_t)psz;
#ifdef _SC_AVPHYS_PAGES
    long av = sysconf(_SC_AVPHYS_PAGES);
    if (av > 0 && psz > 0) d->memory_free = (uint64_t)av * (uint64_t)psz;
#endif
    d->max_buffer_size = UINT64_MAX;
    d->max_allocation_size = UINT64_MAX;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) d->features |= DSI_DEVICE_FEATURE_AVX2;
    if (__builtin_cpu_supports("avx512f")) d->features |= DSI_DEVICE_FEATURE_AVX512;
#endif
}

static dsi_status cpu_enumerate(const dsib_host *host, dsib_device_desc *out, int32_t cap,
                                int32_t *count, dsib_error *err) {
    (void)host;
    (void)err;
    if (count) *count = 1;
    if (out && cap > 0) cpu_desc(out);
    return DSI_OK;
}

static dsi_status cpu_create(const dsib_host *host, dsib_instance **out, dsib_error *err) {
    *out = NULL;
    dsib_instance *inst;
    if (host && host->malloc_fn) inst = host->malloc_fn(host->alloc_ctx, sizeof *inst);
    else inst = malloc(sizeof *inst);
    if (!inst) {
        set_err(err, "cpu backend: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    memset(inst, 0, sizeof *inst);
    if (host) {
        size_t n = host->struct_size < sizeof inst->host ? host->struct_size : sizeof inst->host;
        memcpy(&inst->host, host, n);
    }
    inst->host.struct_size = sizeof inst->host;
    atomic_init(&inst->mem_used, 0);
    atomic_init(&inst->stat_expert_bytes, 0);
    atomic_init(&inst->stat_expert_calls, 0);
    atomic_init(&inst->stat_attn_flops, 0);
    int32_t nt = inst->host.n_threads;
    if (nt < 1) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nt = c > 0 ? (int32_t)c : 1;
    }
    if (nt > 1024) nt = 1024;
    dsib_pool_alloc pa = {inst->host.malloc_fn, inst->host.free_fn, inst->host.alloc_ctx};
    char msg[256] = "";
    dsi_status st = dsib_threadpool_create(nt, inst->host.malloc_fn ? &pa : NULL, &inst->pool,
                                           msg, sizeof msg);
    if (st != DSI_OK) {
        set_err(err, msg[0] ? msg : "cpu backend: cannot create the thread pool");
        dsib_cpu_free(inst, inst);
        return st;
    }
    *out = inst;
    return DSI_OK;
}

static void cpu_destroy(dsib_instance *inst) {
    if (!inst) return;
    dsib_threadpool_free(inst->pool);
    dsib_host h = inst->host;
    if (h.free_fn) h.free_fn(h.alloc_ctx, inst);
    else free(inst);
}

static dsi_status cpu_device(dsib_instance *inst, dsib_device_desc *out) {
    (void)inst;
    cpu_desc(out);
    return DSI_OK;
}

static dsi_status cpu_buffer_alloc(dsib_instance *inst, uint64_t size, uint32_t flags,
                                   dsib_buffer **out, dsib_error *err) {
    *out = NULL;
    if (size > (uint64_t)SIZE_MAX - 64) {
        set_err(err, "cpu backend: buffer too large");
        return DSI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    dsib_buffer *b = dsib_cpu_malloc(inst, sizeof *b);
    if (!b) {
        set_err(err, "cpu backend: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    /* 64-byte alignment for SIMD; keep the raw pointer just before the aligned one. */
    uint8_t *raw = dsib_cpu_malloc(inst, (size_t)size + 64 + sizeof(void *));
    if (!raw) {
        dsib_cpu_free(inst, b);
        set_err(err, "cpu backend: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    uintptr_t a = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    ((void **)a)[-1] = raw;
    b->ptr = (uint8_t *)a;
    b->size = size;
    b->flags = flags;
    b->owned = 1;
    /* Zero-filled: session state starts from a defined value (ring slots never read before
     * they are written, but a sanitizer-clean and deterministic start costs little). */
    memset(b->ptr, 0, (size_t)size);
    atomic_fetch_add(&inst->mem_used, size);
    *out = b;
    return DSI_OK;
}

static dsi_status cpu_buffer_wrap_host(dsib_instance *inst, void *ptr, uint64_t size,
                                       uint32_t flags, dsib_buffer **out, dsib_error *err) {
    *out = NULL;
    dsib_buffer *b = dsib_cpu_malloc(inst, sizeof *b);
    if (!b) {
        set_err(err, "cpu backend: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    b->ptr = ptr;
    b->size = size;
    b->flags = flags;
    b->owned = 0;
    *out = b;
    return DSI_OK;
}

static void cpu_buffer_free(dsib_instance *inst, dsib_buffer *b) {
    if (!b) return;
    if (b->owned) {
        dsib_cpu_free(inst, ((void **)b->ptr)[-1]);
        atomic_fetch_sub(&inst->mem_used, b->size);
    }
    dsib_cpu_free(inst, b);
}

static dsi_status cpu_upload(dsib_instance *inst, dsib_buffer *dst, uint64_t offset,
                             const void *src, uint64_t size, dsib_error *err) {
    (void)inst;
    if (offset > dst->size || size > dst->size - offset) {
        set_err(err, "cpu backend: upload out of range");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    if (size) memcpy(dst->ptr + offset, src, (size_t)size);
    return DSI_OK;
}

static dsi_status cpu_download(dsib_instance *inst, const dsib_buffer *src, uint64_t offset,
                               void *dst, uint64_t size, dsib_error *err) {
    (void)inst;
    if (offset > src->size || size > src->size - offset) {
        set_err(err, "cpu backend: download out of range");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    if (size) memcpy(dst, src->ptr + offset, (size_t)size);
    return DSI_OK;
}

static void *cpu_host_ptr(dsib_instance *inst, dsib_buffer *b) {
    (void)inst;
    return b ? b->ptr : NULL;
}

/* ---- streams and events ---------------------------------------------------------------- */

static size_t al64(size_t x) { return (x + 63) & ~(size_t)63; }

/* The largest workspace any op of ops.c / ops_v41.c takes for shapes up to `d` (their
 * comments say what they carve out of it). */
static size_t workspace_bytes(const dsib_stream_desc *d, int32_t nt) {
    size_t T = (size_t)(nt > 0 ? nt : 1);
    size_t P = (size_t)d->max_positions + 2, H = d->max_heads ? d->max_heads : 1;
    size_t E = d->max_experts, k = d->max_experts_used, W = d->max_width;
    size_t K = d->max_topk;
    size_t ns = (size_t)d->max_rows * k;
    size_t need = 0, v;
    /* attn_sink: sinks [H] + per thread 8 × 2P scores, 2P row pointers and 2P row formats
     * (packed state); a one-row step's decoded rows use what is left, if enough (else its
     * heads read the packed rows in place) */
    v = al64(H * 4) + T * al64(2 * P * (8 * sizeof(float) + sizeof(float *))) +
        T * al64(2 * P) + 64;
    /* + multi-row steps over packed state: per thread the decoded visible rows (top-k +
     * window + the rows of one step, bounded; a layer that sees more reads in place) */
    if (d->max_head_dim) {
        size_t R = (size_t)K + 512 + (size_t)d->max_rows;
        if (R > 2 * P) R = 2 * P;
        v += T * R * (size_t)d->max_head_dim * sizeof(float);
    }
    if (v > need) need = v;
    /* indexer_topk: per thread P scores; indexer_topk_v41: + a heap of 2K (id, score) */
    v = T * al64(P * 4 + 2 * K * 8 + 64);
    if (v > need) need = v;
    /* moe_route: 2E scores + k heap ids */
    v = al64(2 * E * 4) + al64(k * 4 + 4);
    if (v > need) need = v;
    /* moe_experts: per-expert counts/offsets, slot maps, G and U [ns][F], Y [ns][D] */
    v = 2 * al64((E + 1) * 8) + al64(E * 4 + 4) + 2 * al64(ns * 8) + 3 * al64(ns * W * 4);
    if (v > need) need = v;
    /* engram_gate: qw ⊙ kw and a row [n_hc·D] each */
    v = 2 * al64(W * 4);
    if (v > need) need = v;
    return need;
}

static dsi_status cpu_stream_create(dsib_instance *inst, const dsib_stream_desc *desc,
                                    dsib_stream **out, dsib_error *err) {
    *out = NULL;
    dsib_stream *s = dsib_cpu_malloc(inst, sizeof *s);
    if (!s) {
        set_err(err, "cpu backend: out of host memory (stream)");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    memset(s, 0, sizeof *s);
    s->inst = inst;
    if (desc) {
        size_t n = desc->struct_size < sizeof s->desc ? desc->struct_size : sizeof s->desc;
        memcpy(&s->desc, desc, n);
    }
    s->desc.struct_size = sizeof s->desc;
    size_t ws = workspace_bytes(&s->desc, dsib_threadpool_n_threads(inst->pool));
    if (ws) {
        s->ws_raw = dsib_cpu_malloc(inst, ws + 64);
        if (!s->ws_raw) {
            dsib_cpu_free(inst, s);
            set_err(err, "cpu backend: out of host memory (stream workspace)");
            return DSI_ERR_OUT_OF_HOST_MEMORY;
        }
        s->ws = (uint8_t *)(((uintptr_t)s->ws_raw + 63) & ~(uintptr_t)63);
        s->ws_size = ws;
    }
    *out = s;
    return DSI_OK;
}

static void cpu_stream_destroy(dsib_stream *s) {
    if (!s) return;
    dsib_instance *inst = s->inst;
    dsib_cpu_free(inst, s->ws_raw);
    dsib_cpu_free(inst, s);
}

static dsi_status cpu_submit(dsib_stream *s, dsib_error *err) {
    (void)s;
    (void)err;
    return DSI_OK;
}

static dsi_status cpu_sync(dsib_stream *s, dsib_error *err) {
    dsi_status st = s->status;
    s->status = DSI_OK;
    if (st != DSI_OK) set_err(err, "cpu backend: an op on this stream failed");
    return st;
}

static dsi_status cpu_event_create(dsib_instance *inst, dsib_event **out, dsib_error *err) {
    *out = dsib_cpu_malloc(inst, sizeof **out);
    if (!*out) {
        set_err(err, "cpu backend: out of host memory (event)");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    (*out)->recorded = 0;
    return DSI_OK;
}

static void cpu_event_destroy(dsib_instance *inst, dsib_event *ev) { dsib_cpu_free(inst, ev); }

static dsi_status cpu_event_record(dsib_stream *s, dsib_event *ev, dsib_error *err) {
    (void)s;
    (void)err;
    ev->recorded = 1; /* the work before it has already run */
    return DSI_OK;
}

static dsi_status cpu_stream_wait(dsib_stream *s, dsib_event *ev, dsib_error *err) {
    (void)s;
    (void)ev;
    (void)err;
    return DSI_OK;
}

static dsi_status cpu_event_query(dsib_instance *inst, dsib_event *ev) {
    (void)inst;
    (void)ev;
    return DSI_OK;
}

static dsi_status cpu_event_sync(dsib_instance *inst, dsib_event *ev, dsib_error *err) {
    (void)inst;
    (void)ev;
    (void)err;
    return DSI_OK;
}

static uint64_t cpu_memory_used(dsib_instance *inst) { return atomic_load(&inst->mem_used); }

static const dsib_backend cpu_backend = {
    .struct_size = sizeof(dsib_backend),
    .api_version = DSIB_API_VERSION,
    .name = "cpu",
    .enumerate = cpu_enumerate,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .device = cpu_device,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_wrap_host = cpu_buffer_wrap_host,
    .buffer_free = cpu_buffer_free,
    .buffer_host_ptr = cpu_host_ptr,
    .upload = cpu_upload,
    .download = cpu_download,
    .memory_used = cpu_memory_used,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .submit = cpu_submit,
    .sync = cpu_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_query = cpu_event_query,
    .event_sync = cpu_event_sync,
    /* no capture: CPU ops run as they are issued (nothing to replay) */
    .ops = &dsib_cpu_ops,
};

const dsib_backend *dsib_cpu_backend(void) { return &cpu_backend; }
