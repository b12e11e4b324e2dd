/*
 * libdsinfer-cuda.so — the CUDA backend module (backends/backend.h v2).
 *
 * This file: device enumeration, instances bound to one device, device buffers with
 * accounting (zeroed, padded: cuda_plan.h alloc_bytes), pinned host-visible buffers (the
 * asynchronous download and the step inputs), blocking uploads / downloads, streams (one
 * cudaStream_t each, with the workspace planned from its dsib_stream_desc by cuda_plan.h
 * ws_plan and a mapped error word that kernels set when they meet bad data on the device),
 * events (cudaEvent_t), capture / replay as CUDA graphs, the op helpers of cuda_impl.h and
 * the op table. The ops live in the kernel files (matmul.cu, eltwise.cu, fakequant.cu,
 * mhc.cu, compressor.cu, attention.cu, moe.cu, engram.cu); docs/cuda.md lists them.
 *
 * Without a driver or a device, enumerate/create decline with DSI_ERR_UNSUPPORTED and a
 * message naming the CUDA error; nothing is printed, nothing aborts. The module links the
 * static CUDA runtime only (never libcuda), so it loads on machines without a driver.
 */
#include "backends/cuda/cuda_impl.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

namespace dsic {

dsi_status fail(Stream *s, dsi_status st, const char *fmt, ...) {
    if (s->status == DSI_OK) {
        s->status = st;
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(s->msg, sizeof s->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

dsi_status launched(Stream *s, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return DSI_OK;
    return fail(s, DSI_ERR_BACKEND, "cuda: %s: kernel launch failed: %s", what, cudaGetErrorString(e));
}

dsi_status vptr(Stream *s, dsib_view v, uint64_t need, const char *op, const char *what,
                char **out) {
    *out = nullptr;
    const Buffer *b = B(v.buf);
    if (!b) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: %s: no buffer", op, what);
    if (v.offset > b->size || need > b->size - v.offset || (v.offset & 3))
        return fail(s, DSI_ERR_INVALID_ARGUMENT,
                    "cuda: %s: %s: %llu bytes at offset %llu outside a %llu-byte buffer (or unaligned)",
                    op, what, (unsigned long long)need, (unsigned long long)v.offset,
                    (unsigned long long)b->size);
    *out = b->ptr + v.offset;
    return DSI_OK;
}

dsi_status sptr(Stream *s, const dsib_state *st, uint32_t width, const char *op,
                const char *what, float **out) {
    *out = nullptr;
    if (!st || !st->buf || st->rows == 0 || st->slots == 0 || st->ld < width)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: %s: bad state view", op, what);
    if (st->format != DSIB_STATE_F32)
        return fail(s, DSI_ERR_UNSUPPORTED, "cuda: %s: %s: state format %d not supported", op,
                    what, (int)st->format);
    dsib_view v = {st->buf, st->offset};
    char *p = nullptr;
    dsi_status r = vptr(s, v, (uint64_t)st->slots * st->rows * st->ld * 4, op, what, &p);
    *out = reinterpret_cast<float *>(p);
    return r;
}

dsi_status wptr(Stream *s, const dsib_weight *w, const char *op, const char *what,
                const uint8_t **out) {
    *out = nullptr;
    if (!w || !w->buf) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: %s: no weight", op, what);
    if (!type_supported(w->type) && w->type != DSI_TYPE_I32)
        return fail(s, DSI_ERR_UNSUPPORTED, "cuda: %s: %s: weight type %d not supported", op,
                    what, (int)w->type);
    int64_t ne2 = w->ne[2] < 1 ? 1 : w->ne[2];
    uint64_t rb = w->type == DSI_TYPE_I32 ? 4 * (uint64_t)w->ne[0] : row_bytes(w->type, w->ne[0]);
    if (w->ne[0] < 0 || w->ne[1] < 0 || (w->ne[0] > 0 && rb == 0))
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: %s: bad weight shape", op, what);
    uint64_t need = 0;
    if (w->ne[1] > 0 && w->ne[0] > 0)
        need = (uint64_t)(ne2 - 1) * w->nb2 + (uint64_t)(w->ne[1] - 1) * w->nb1 + rb;
    const Buffer *b = B(w->buf);
    if (w->offset > b->size || need > b->size - w->offset)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: %s: weight rows outside its buffer",
                    op, what);
    *out = reinterpret_cast<const uint8_t *>(b->ptr + w->offset);
    return DSI_OK;
}

namespace {

dsi_status efail(dsib_error *err, dsi_status st, const char *what, cudaError_t e) {
    if (err) std::snprintf(err->msg, sizeof err->msg, "cuda: %s: %s", what, cudaGetErrorString(e));
    return st;
}

void describe(int dev, const cudaDeviceProp &p, dsib_device_desc *d) {
    std::memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->type = p.integrated ? DSI_DEVICE_INTEGRATED_GPU : DSI_DEVICE_DISCRETE_GPU;
    std::snprintf(d->name, sizeof d->name, "%.200s (sm_%d%d)", p.name, p.major % 100, p.minor % 100);
    d->memory_total = p.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    int prev = 0;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(dev) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        d->memory_free = free_b;
    cudaSetDevice(prev);
    d->max_buffer_size = p.totalGlobalMem;
    d->max_allocation_size = p.totalGlobalMem;
    d->features = DSI_DEVICE_FEATURE_FP16 | DSI_DEVICE_FEATURE_STORAGE_16 |
                  DSI_DEVICE_FEATURE_STORAGE_8 | DSI_DEVICE_FEATURE_SUBGROUPS |
                  DSI_DEVICE_FEATURE_INT_DOT;
    if (p.major >= 8) d->features |= DSI_DEVICE_FEATURE_BF16;
    if (p.major >= 7) d->features |= DSI_DEVICE_FEATURE_COOPMAT;
    d->subgroup_size = (uint32_t)p.warpSize;
}

dsi_status enumerate(const dsib_host *, dsib_device_desc *out, int32_t cap, int32_t *count,
                     dsib_error *err) {
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return efail(err, DSI_ERR_UNSUPPORTED, "no usable CUDA driver or device", e);
    if (n == 0) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: no CUDA device");
        return DSI_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < n && i < cap && out; i++) {
        cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess) return efail(err, DSI_ERR_BACKEND, "cudaGetDeviceProperties", e);
        describe(i, p, &out[i]);
    }
    *count = n;
    return DSI_OK;
}

dsi_status create(const dsib_host *host, dsib_instance **out, dsib_error *err) {
    *out = nullptr;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return efail(err, DSI_ERR_UNSUPPORTED, "no usable CUDA driver or device", e);
    int dev = host->device_index < 0 ? 0 : host->device_index;
    if (dev >= n) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: device index %d out of range (%d devices)", dev, n);
        return DSI_ERR_NOT_FOUND;
    }
    void *mem = host->malloc_fn(host->alloc_ctx, sizeof(Instance));
    if (!mem) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    Instance *inst = new (mem) Instance();
    inst->host = *host;
    inst->device = dev;
    cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess ||
        (e = cudaSetDevice(dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&inst->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        host->free_fn(host->alloc_ctx, inst);
        return efail(err, DSI_ERR_BACKEND, "device initialisation", e);
    }
    describe(dev, p, &inst->desc);
    inst->cc = p.major * 10 + p.minor;
    inst->n_sm = p.multiProcessorCount;
    *out = reinterpret_cast<dsib_instance *>(inst);
    return DSI_OK;
}


void destroy(dsib_instance *i) {
    if (!i) return;
    Instance *inst = I(i);
    cudaSetDevice(inst->device);
    cudaStreamDestroy(inst->stream);
    dsib_host h = inst->host;
    inst->~Instance();
    h.free_fn(h.alloc_ctx, inst);
}

dsi_status device(dsib_instance *i, dsib_device_desc *out) {
    *out = I(i)->desc;
    return DSI_OK;
}

dsi_status buffer_alloc(dsib_instance *i, uint64_t size, uint32_t flags, dsib_buffer **out,
                        dsib_error *err) {
    Instance *inst = I(i);
    *out = nullptr;
    Buffer *b = static_cast<Buffer *>(inst->host.malloc_fn(inst->host.alloc_ctx, sizeof(Buffer)));
    if (!b) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    cudaSetDevice(inst->device);
    b->flags = flags;
    b->host = nullptr;
    b->ptr = nullptr;
    /* host-visible buffers and offloaded state (DSIB_BUFFER_HOST_MEMORY) are mapped pinned
     * host memory: the kernels read it through its device pointer over the bus */
    const int pinned = (flags & (DSIB_BUFFER_HOST_VISIBLE | DSIB_BUFFER_HOST_MEMORY)) != 0;
    const uint64_t bytes = alloc_bytes(size); /* padded (cuda_plan.h) */
    void *p = nullptr;
    cudaError_t e = bytes < size ? cudaErrorMemoryAllocation
                    : pinned    ? cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable)
                                : cudaMalloc(&p, bytes);
    if (e == cudaSuccess && pinned) {
        void *dp = nullptr;
        e = cudaHostGetDevicePointer(&dp, p, 0);
        if (e == cudaSuccess) {
            b->host = static_cast<char *>(p);
            b->ptr = static_cast<char *>(dp);
            std::memset(p, 0, bytes); /* everything but weights starts zeroed (backend.h) */
        } else {
            cudaFreeHost(p);
        }
    } else if (e == cudaSuccess) {
        b->ptr = static_cast<char *>(p);
        /* everything but weights starts zeroed (backend.h); the padding of weights too */
        if (!(flags & DSIB_BUFFER_WEIGHTS)) e = cudaMemset(p, 0, bytes);
        else e = cudaMemset(b->ptr + size, 0, bytes - size);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) cudaFree(p);
    }
    if (e != cudaSuccess) {
        inst->host.free_fn(inst->host.alloc_ctx, b);
        cudaGetLastError(); /* clear the error state of the runtime */
        std::snprintf(err->msg, sizeof err->msg,
                      "cuda: allocating %llu bytes of device memory failed: %s",
                      (unsigned long long)size, cudaGetErrorString(e));
        return DSI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    b->size = size;
    if (!(flags & DSIB_BUFFER_HOST_MEMORY)) inst->used += size; /* device memory only */
    *out = reinterpret_cast<dsib_buffer *>(b);
    return DSI_OK;
}

void buffer_free(dsib_instance *i, dsib_buffer *buf) {
    if (!buf) return;
    Instance *inst = I(i);
    Buffer *b = B(buf);
    cudaSetDevice(inst->device);
    if (b->host) cudaFreeHost(b->host);
    else cudaFree(b->ptr);
    if (!(b->flags & DSIB_BUFFER_HOST_MEMORY)) inst->used -= b->size;
    inst->host.free_fn(inst->host.alloc_ctx, b);
}

bool in_range(const Buffer *b, uint64_t off, uint64_t n) { return off <= b->size && n <= b->size - off; }

dsi_status upload(dsib_instance *i, dsib_buffer *dst, uint64_t off, const void *src, uint64_t n,
                  dsib_error *err) {
    Instance *inst = I(i);
    Buffer *b = reinterpret_cast<Buffer *>(dst);
    if (!in_range(b, off, n)) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: upload of %llu bytes at %llu outside a %llu-byte buffer",
                      (unsigned long long)n, (unsigned long long)off, (unsigned long long)b->size);
        return DSI_ERR_INVALID_ARGUMENT;
    }
    cudaSetDevice(inst->device);
    cudaError_t e = cudaMemcpyAsync(b->ptr + off, src, n, cudaMemcpyDefault, inst->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(inst->stream);
    return e == cudaSuccess ? DSI_OK : efail(err, DSI_ERR_BACKEND, "upload", e);
}

dsi_status download(dsib_instance *i, const dsib_buffer *src, uint64_t off, void *dst, uint64_t n,
                    dsib_error *err) {
    Instance *inst = I(i);
    const Buffer *b = reinterpret_cast<const Buffer *>(src);
    if (!in_range(b, off, n)) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: download of %llu bytes at %llu outside a %llu-byte buffer",
                      (unsigned long long)n, (unsigned long long)off, (unsigned long long)b->size);
        return DSI_ERR_INVALID_ARGUMENT;
    }
    cudaSetDevice(inst->device);
    cudaError_t e = cudaMemcpyAsync(dst, b->ptr + off, n, cudaMemcpyDefault, inst->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(inst->stream);
    return e == cudaSuccess ? DSI_OK : efail(err, DSI_ERR_BACKEND, "download", e);
}

void *buffer_host_ptr(dsib_instance *, dsib_buffer *buf) {
    Buffer *b = B(buf);
    return b ? b->host : nullptr;
}

/* ---- streams ---------------------------------------------------------------------------- */


dsi_status stream_create(dsib_instance *i, const dsib_stream_desc *desc, dsib_stream **out,
                         dsib_error *err) {
    Instance *inst = I(i);
    *out = nullptr;
    void *mem = inst->host.malloc_fn(inst->host.alloc_ctx, sizeof(Stream));
    if (!mem) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: out of host memory (stream)");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    Stream *s = new (mem) Stream();
    s->inst = inst;
    std::memset(&s->desc, 0, sizeof s->desc);
    if (desc) std::memcpy(&s->desc, desc, desc->struct_size < sizeof s->desc && desc->struct_size ? desc->struct_size : sizeof s->desc);
    s->desc.struct_size = sizeof s->desc;
    cudaSetDevice(inst->device);
    const WsPlan plan = ws_plan(&s->desc);
    void *w = nullptr, *eh = nullptr, *ed = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    const char *what = "cudaStreamCreate";
    if (e == cudaSuccess) {
        what = "workspace";
        e = cudaMalloc(&w, plan.total);
        if (e == cudaSuccess) {
            what = "error word";
            e = cudaHostAlloc(&eh, 64, cudaHostAllocMapped | cudaHostAllocPortable);
            if (e == cudaSuccess) e = cudaHostGetDevicePointer(&ed, eh, 0);
        }
    }
    if (e != cudaSuccess) {
        if (eh) cudaFreeHost(eh);
        if (w) cudaFree(w);
        if (s->s) cudaStreamDestroy(s->s);
        cudaGetLastError();
        inst->host.free_fn(inst->host.alloc_ctx, s);
        return efail(err, e == cudaErrorMemoryAllocation ? DSI_ERR_OUT_OF_DEVICE_MEMORY : DSI_ERR_BACKEND, what, e);
    }
    std::memset(eh, 0, 64);
    s->ws = static_cast<char *>(w);
    s->ws_size = plan.total;
    s->err_host = static_cast<int *>(eh);
    s->err_dev = static_cast<int *>(ed);
    inst->used += plan.total;
    *out = reinterpret_cast<dsib_stream *>(s);
    return DSI_OK;
}

void stream_destroy(dsib_stream *st) {
    if (!st) return;
    Stream *s = S(st);
    Instance *inst = s->inst;
    cudaSetDevice(inst->device);
    cudaStreamSynchronize(s->s);
    cudaStreamDestroy(s->s);
    cudaFree(s->ws);
    cudaFreeHost(s->err_host);
    inst->used -= s->ws_size;
    s->~Stream();
    inst->host.free_fn(inst->host.alloc_ctx, s);
}

dsi_status submit(dsib_stream *st, dsib_error *err) {
    if (S(st)->capturing) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: submit while capturing");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    return DSI_OK; /* work on a CUDA stream starts as it is recorded */
}

dsi_status sync(dsib_stream *st, dsib_error *err) {
    Stream *s = S(st);
    if (s->capturing) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: sync while capturing");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    cudaSetDevice(s->inst->device);
    cudaError_t e = cudaStreamSynchronize(s->s);
    dsi_status r = s->status;
    if (r != DSI_OK) std::snprintf(err->msg, sizeof err->msg, "%s", s->msg);
    s->status = DSI_OK;
    s->msg[0] = 0;
    if (e != cudaSuccess) return efail(err, DSI_ERR_BACKEND, "stream", e);
    /* a kernel that met bad data on the device (a step row, token id, expert index) */
    const int derr = *(volatile int *)s->err_host;
    if (derr != DERR_NONE) {
        *(volatile int *)s->err_host = DERR_NONE;
        if (r == DSI_OK) {
            r = derr == DERR_FORMAT ? DSI_ERR_BAD_FORMAT
              : derr == DERR_ARG    ? DSI_ERR_INVALID_ARGUMENT
                                    : DSI_ERR_INTERNAL;
            std::snprintf(err->msg, sizeof err->msg,
                          "cuda: a kernel met invalid data on the device (step rows, ids or "
                          "expert indices; code %d); the rows concerned were skipped", derr);
        }
    }
    return r;
}

/* ---- events ------------------------------------------------------------------------------ */

Event *EV(dsib_event *e) { return reinterpret_cast<Event *>(e); }

dsi_status event_create(dsib_instance *i, dsib_event **out, dsib_error *err) {
    Instance *inst = I(i);
    *out = nullptr;
    void *mem = inst->host.malloc_fn(inst->host.alloc_ctx, sizeof(Event));
    if (!mem) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: out of host memory (event)");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    Event *ev = new (mem) Event();
    cudaSetDevice(inst->device);
    cudaError_t e = cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        inst->host.free_fn(inst->host.alloc_ctx, ev);
        return efail(err, DSI_ERR_BACKEND, "cudaEventCreate", e);
    }
    *out = reinterpret_cast<dsib_event *>(ev);
    return DSI_OK;
}

void event_destroy(dsib_instance *i, dsib_event *ev) {
    if (!ev) return;
    Instance *inst = I(i);
    cudaEventDestroy(EV(ev)->e);
    EV(ev)->~Event();
    inst->host.free_fn(inst->host.alloc_ctx, ev);
}

dsi_status event_record(dsib_stream *st, dsib_event *ev, dsib_error *err) {
    cudaError_t e = cudaEventRecord(EV(ev)->e, S(st)->s);
    return e == cudaSuccess ? DSI_OK : efail(err, DSI_ERR_BACKEND, "cudaEventRecord", e);
}

dsi_status stream_wait(dsib_stream *st, dsib_event *ev, dsib_error *err) {
    cudaError_t e = cudaStreamWaitEvent(S(st)->s, EV(ev)->e, 0);
    return e == cudaSuccess ? DSI_OK : efail(err, DSI_ERR_BACKEND, "cudaStreamWaitEvent", e);
}

dsi_status event_query(dsib_instance *, dsib_event *ev) {
    cudaError_t e = cudaEventQuery(EV(ev)->e);
    if (e == cudaSuccess) return DSI_OK;
    if (e == cudaErrorNotReady) return DSI_ERR_BUSY;
    return DSI_ERR_BACKEND;
}

dsi_status event_sync(dsib_instance *, dsib_event *ev, dsib_error *err) {
    cudaError_t e = cudaEventSynchronize(EV(ev)->e);
    return e == cudaSuccess ? DSI_OK : efail(err, DSI_ERR_BACKEND, "cudaEventSynchronize", e);
}

/* ---- capture / replay: CUDA graphs ----------------------------------------------------------- */

dsi_status capture_begin(dsib_stream *st, dsib_error *err) {
    Stream *s = S(st);
    if (s->capturing) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: already capturing");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    cudaError_t e = cudaStreamBeginCapture(s->s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return efail(err, DSI_ERR_BACKEND, "cudaStreamBeginCapture", e);
    s->capturing = 1;
    return DSI_OK;
}

dsi_status capture_end(dsib_stream *st, dsib_graph **out, dsib_error *err) {
    Stream *s = S(st);
    Instance *inst = s->inst;
    *out = nullptr;
    if (!s->capturing) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: not capturing");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    s->capturing = 0;
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s->s, &g);
    if (e != cudaSuccess) return efail(err, DSI_ERR_BACKEND, "cudaStreamEndCapture", e);
    if (s->status != DSI_OK) { /* an op failed while capturing: no graph */
        dsi_status r = s->status;
        std::snprintf(err->msg, sizeof err->msg, "%s", s->msg);
        s->status = DSI_OK;
        s->msg[0] = 0;
        cudaGraphDestroy(g);
        return r;
    }
    void *mem = inst->host.malloc_fn(inst->host.alloc_ctx, sizeof(Graph));
    if (!mem) {
        cudaGraphDestroy(g);
        std::snprintf(err->msg, sizeof err->msg, "cuda: out of host memory (graph)");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    Graph *gr = new (mem) Graph();
    e = cudaGraphInstantiate(&gr->exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        inst->host.free_fn(inst->host.alloc_ctx, gr);
        return efail(err, DSI_ERR_BACKEND, "cudaGraphInstantiate", e);
    }
    *out = reinterpret_cast<dsib_graph *>(gr);
    return DSI_OK;
}

dsi_status graph_launch(dsib_stream *st, dsib_graph *g, dsib_error *err) {
    cudaError_t e = cudaGraphLaunch(reinterpret_cast<Graph *>(g)->exec, S(st)->s);
    return e == cudaSuccess ? DSI_OK : efail(err, DSI_ERR_BACKEND, "cudaGraphLaunch", e);
}

void graph_destroy(dsib_instance *i, dsib_graph *g) {
    if (!g) return;
    Instance *inst = I(i);
    Graph *gr = reinterpret_cast<Graph *>(g);
    cudaGraphExecDestroy(gr->exec);
    gr->~Graph();
    inst->host.free_fn(inst->host.alloc_ctx, gr);
}

uint64_t memory_used(dsib_instance *i) { return I(i)->used.load(); }

int32_t supports_op(dsib_instance *, uint32_t op, int32_t type) { return plan_supports_op(op, type); }

const dsib_ops k_ops = [] {
    dsib_ops o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.matmul = op_matmul;
    o.matmul_grouped = op_matmul_grouped;
    o.get_rows = op_get_rows;
    o.rms_norm = op_rms_norm;
    o.add = op_add;
    o.scale = op_scale;
    o.copy = op_copy;
    o.copy_rows = op_copy_rows;
    o.gather_rows = op_gather_rows;
    o.rope_tail = op_rope_tail;
    o.store_rows = op_store_rows;
    o.fake_quant = op_fake_quant;
    o.hadamard = op_hadamard;
    o.hc_expand = op_hc_expand;
    o.hc_mix = op_hc_mix;
    o.hc_collapse = op_hc_collapse;
    o.hc_post = op_hc_post;
    o.compress_pool = op_compress_pool;
    o.indexer_topk = op_indexer_topk;
    o.attn_sink = op_attn_sink;
    o.add_rows_periodic = op_add_rows_periodic;
    o.moe_route = op_moe_route;
    o.moe_experts = op_moe_experts;
    o.swiglu = op_swiglu;
    o.indexer_topk_v41 = op_indexer_topk_v41;
    o.engram_gate = op_engram_gate;
    return o;
}();

const dsib_backend k_backend = [] {
    dsib_backend b;
    std::memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.api_version = DSIB_API_VERSION;
    b.name = "cuda";
    b.enumerate = enumerate;
    b.create = create;
    b.destroy = destroy;
    b.device = device;
    b.buffer_alloc = buffer_alloc;
    b.buffer_wrap_host = nullptr;
    b.buffer_free = buffer_free;
    b.upload = upload;
    b.download = download;
    b.buffer_host_ptr = buffer_host_ptr;
    b.memory_used = memory_used;
    b.stream_create = stream_create;
    b.stream_destroy = stream_destroy;
    b.submit = submit;
    b.sync = sync;
    b.event_create = event_create;
    b.event_destroy = event_destroy;
    b.event_record = event_record;
    b.stream_wait = stream_wait;
    b.event_query = event_query;
    b.event_sync = event_sync;
    b.capture_begin = capture_begin;
    b.capture_end = capture_end;
    b.graph_launch = graph_launch;
    b.graph_destroy = graph_destroy;
    b.supports_op = supports_op;
    b.ops = &k_ops;
    return b;
}();

} // namespace
} // namespace dsic

extern "C" __attribute__((visibility("default"))) const dsib_backend *dsi_backend_module_entry(void) {
    return &dsic::k_backend;
}
