/*
 * libdsinfer-cuda.so — the CUDA backend module (first stage).
 *
 * Implemented (backend.h v2): device enumeration (name, memory, compute capability),
 * instances bound to one device, device buffers with accounting (zeroed), pinned
 * host-visible buffers, blocking uploads and downloads, streams (cudaStream_t, ops record
 * onto them), events (cudaEvent_t: record / wait / query / sync), and capture / replay with
 * CUDA graphs (cudaStreamBeginCapture → cudaGraphInstantiate → cudaGraphLaunch). Not
 * implemented yet: the fused model ops — every entry of the op table is NULL, so a context on
 * "cuda" opens, lists its device and moves data, while the model's forward pass reports
 * DSI_ERR_UNSUPPORTED ("backend 'cuda' does not implement the op matmul") at session
 * creation instead of computing anything wrong.
 *
 * Without a driver or a device, enumerate/create decline with DSI_ERR_UNSUPPORTED and a
 * message naming the CUDA error; nothing is printed, nothing aborts.
 */
#include "backends/backend.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>

namespace {

struct Instance {
    dsib_host host;
    int device;
    cudaStream_t stream;         /* blocking uploads / downloads */
    std::atomic<uint64_t> used{0};
    dsib_device_desc desc;
};

struct Buffer {
    void *ptr;
    uint64_t size;
    uint32_t flags;
    int pinned;                  /* host-visible: cudaMallocHost */
};

struct Stream {
    Instance *inst;
    cudaStream_t s;
    cudaGraph_t capture;         /* non-null between capture_end's end-capture and instantiate */
    int capturing;
    dsi_status status;
};

struct Event {
    cudaEvent_t e;
};

struct Graph {
    cudaGraphExec_t exec;
};

dsi_status fail(dsib_error *err, dsi_status st, const char *what, cudaError_t e) {
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
    if (e != cudaSuccess) return fail(err, DSI_ERR_UNSUPPORTED, "no usable CUDA driver or device", e);
    if (n == 0) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: no CUDA device");
        return DSI_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < n && i < cap && out; i++) {
        cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess) return fail(err, DSI_ERR_BACKEND, "cudaGetDeviceProperties", e);
        describe(i, p, &out[i]);
    }
    *count = n;
    return DSI_OK;
}

dsi_status create(const dsib_host *host, dsib_instance **out, dsib_error *err) {
    *out = nullptr;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return fail(err, DSI_ERR_UNSUPPORTED, "no usable CUDA driver or device", e);
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
        return fail(err, DSI_ERR_BACKEND, "device initialisation", e);
    }
    describe(dev, p, &inst->desc);
    *out = reinterpret_cast<dsib_instance *>(inst);
    return DSI_OK;
}

Instance *I(dsib_instance *i) { return reinterpret_cast<Instance *>(i); }

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
    b->pinned = (flags & DSIB_BUFFER_HOST_VISIBLE) != 0;
    cudaError_t e = b->pinned ? cudaMallocHost(&b->ptr, size ? size : 1)
                              : cudaMalloc(&b->ptr, size ? size : 1);
    if (e == cudaSuccess && !(flags & DSIB_BUFFER_WEIGHTS)) {
        /* everything but weights starts zeroed (backend.h) */
        if (b->pinned) std::memset(b->ptr, 0, size ? size : 1);
        else e = cudaMemset(b->ptr, 0, size ? size : 1);
        if (e != cudaSuccess) (b->pinned ? cudaFreeHost(b->ptr) : cudaFree(b->ptr));
    }
    if (e != cudaSuccess) {
        inst->host.free_fn(inst->host.alloc_ctx, b);
        cudaGetLastError(); /* clear the sticky-free error state of the runtime */
        std::snprintf(err->msg, sizeof err->msg,
                      "cuda: allocating %llu bytes of device memory failed: %s",
                      (unsigned long long)size, cudaGetErrorString(e));
        return DSI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    b->size = size;
    inst->used += size;
    *out = reinterpret_cast<dsib_buffer *>(b);
    return DSI_OK;
}

void buffer_free(dsib_instance *i, dsib_buffer *buf) {
    if (!buf) return;
    Instance *inst = I(i);
    Buffer *b = reinterpret_cast<Buffer *>(buf);
    cudaSetDevice(inst->device);
    if (b->pinned) cudaFreeHost(b->ptr);
    else cudaFree(b->ptr);
    inst->used -= b->size;
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
    cudaError_t e = cudaMemcpyAsync(static_cast<char *>(b->ptr) + off, src, n, cudaMemcpyDefault, inst->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(inst->stream);
    return e == cudaSuccess ? DSI_OK : fail(err, DSI_ERR_BACKEND, "upload", e);
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
    cudaError_t e = cudaMemcpyAsync(dst, static_cast<const char *>(b->ptr) + off, n, cudaMemcpyDefault, inst->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(inst->stream);
    return e == cudaSuccess ? DSI_OK : fail(err, DSI_ERR_BACKEND, "download", e);
}

void *buffer_host_ptr(dsib_instance *, dsib_buffer *buf) {
    Buffer *b = reinterpret_cast<Buffer *>(buf);
    return b && b->pinned ? b->ptr : nullptr;
}

/* ---- streams ---------------------------------------------------------------------------- */

Stream *S(dsib_stream *s) { return reinterpret_cast<Stream *>(s); }

dsi_status stream_create(dsib_instance *i, const dsib_stream_desc *, dsib_stream **out,
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
    cudaSetDevice(inst->device);
    cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        inst->host.free_fn(inst->host.alloc_ctx, s);
        return fail(err, DSI_ERR_BACKEND, "cudaStreamCreate", e);
    }
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
    s->status = DSI_OK;
    if (e != cudaSuccess) return fail(err, DSI_ERR_BACKEND, "stream", e);
    if (r != DSI_OK) std::snprintf(err->msg, sizeof err->msg, "cuda: an op on this stream failed");
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
        return fail(err, DSI_ERR_BACKEND, "cudaEventCreate", e);
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
    return e == cudaSuccess ? DSI_OK : fail(err, DSI_ERR_BACKEND, "cudaEventRecord", e);
}

dsi_status stream_wait(dsib_stream *st, dsib_event *ev, dsib_error *err) {
    cudaError_t e = cudaStreamWaitEvent(S(st)->s, EV(ev)->e, 0);
    return e == cudaSuccess ? DSI_OK : fail(err, DSI_ERR_BACKEND, "cudaStreamWaitEvent", e);
}

dsi_status event_query(dsib_instance *, dsib_event *ev) {
    cudaError_t e = cudaEventQuery(EV(ev)->e);
    if (e == cudaSuccess) return DSI_OK;
    if (e == cudaErrorNotReady) return DSI_ERR_BUSY;
    return DSI_ERR_BACKEND;
}

dsi_status event_sync(dsib_instance *, dsib_event *ev, dsib_error *err) {
    cudaError_t e = cudaEventSynchronize(EV(ev)->e);
    return e == cudaSuccess ? DSI_OK : fail(err, DSI_ERR_BACKEND, "cudaEventSynchronize", e);
}

/* ---- capture / replay: CUDA graphs ----------------------------------------------------------- */

dsi_status capture_begin(dsib_stream *st, dsib_error *err) {
    Stream *s = S(st);
    if (s->capturing) {
        std::snprintf(err->msg, sizeof err->msg, "cuda: already capturing");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    cudaError_t e = cudaStreamBeginCapture(s->s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return fail(err, DSI_ERR_BACKEND, "cudaStreamBeginCapture", e);
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
    if (e != cudaSuccess) return fail(err, DSI_ERR_BACKEND, "cudaStreamEndCapture", e);
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
        return fail(err, DSI_ERR_BACKEND, "cudaGraphInstantiate", e);
    }
    *out = reinterpret_cast<dsib_graph *>(gr);
    return DSI_OK;
}

dsi_status graph_launch(dsib_stream *st, dsib_graph *g, dsib_error *err) {
    cudaError_t e = cudaGraphLaunch(reinterpret_cast<Graph *>(g)->exec, S(st)->s);
    return e == cudaSuccess ? DSI_OK : fail(err, DSI_ERR_BACKEND, "cudaGraphLaunch", e);
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

/* No fused op yet: every entry NULL (backend.h "Subsets"); the core reports the first op a
 * model needs as unsupported. */
const dsib_ops k_ops = [] {
    dsib_ops o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
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
    b.ops = &k_ops;
    return b;
}();

} // namespace

extern "C" __attribute__((visibility("default"))) const dsib_backend *dsi_backend_module_entry(void) {
    return &k_backend;
}
