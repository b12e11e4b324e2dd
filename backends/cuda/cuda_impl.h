/*
 * backends/cuda/cuda_impl.h — private definitions of the CUDA backend module shared by its
 * .cu files: instance, buffer, stream (with its workspace and device error word), the op
 * helpers (view checks, failure recording, launch checks) and the entry points of each
 * kernel file. Never included outside backends/cuda/ (the CPU test program
 * tests/gpu/test_cuda_host.cc includes cuda_math.h and cuda_plan.h only).
 */
#ifndef DSIC_CUDA_IMPL_H
#define DSIC_CUDA_IMPL_H

#include "backends/backend.h"
#include "backends/cuda/cuda_math.h"
#include "backends/cuda/cuda_plan.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace dsic {

struct Instance {
    dsib_host host;
    int device;
    cudaStream_t stream;         /* blocking uploads / downloads */
    std::atomic<uint64_t> used{0};
    dsib_device_desc desc;
    int cc;                      /* compute capability major·10 + minor */
    int n_sm;
};

struct Buffer {
    char *ptr;                   /* device address (pinned buffers: the mapped address) */
    char *host;                  /* host address of a pinned (host-visible) buffer, else NULL */
    uint64_t size;               /* requested bytes (the allocation is padded, cuda_plan.h) */
    uint32_t flags;
};

/* Device-side error codes (a kernel that meets bad data it cannot refuse up front — a step
 * row, token id or expert index read on the device — stores one of these into the stream's
 * mapped error word and skips the row; sync reports it). */
enum { DERR_NONE = 0, DERR_ARG = 1, DERR_FORMAT = 2, DERR_INTERNAL = 3 };

struct Stream {
    Instance *inst;
    cudaStream_t s;
    dsib_stream_desc desc;
    char *ws;                    /* device workspace (cuda_plan.h ws_plan) */
    uint64_t ws_size;
    int *err_host, *err_dev;     /* mapped pinned word written by kernels */
    int capturing;
    dsi_status status;           /* first failure since the last sync */
    char msg[400];               /* its message */
};

struct Event {
    cudaEvent_t e;
};

struct Graph {
    cudaGraphExec_t exec;
};

inline Instance *I(dsib_instance *i) { return reinterpret_cast<Instance *>(i); }
/* The stream of an op, with its device made current on the calling thread (sessions may run
 * on any thread; a launch on another device's stream would fail). */
inline Stream *S(dsib_stream *st) {
    Stream *s = reinterpret_cast<Stream *>(st);
    cudaSetDevice(s->inst->device);
    return s;
}
inline Buffer *B(dsib_buffer *b) { return reinterpret_cast<Buffer *>(b); }
inline const Buffer *B(const dsib_buffer *b) { return reinterpret_cast<const Buffer *>(b); }

/* Records the first failure of a stream (reported again by sync) and returns st. */
dsi_status fail(Stream *s, dsi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* After a kernel launch: a launch error becomes DSI_ERR_BACKEND on the stream. */
dsi_status launched(Stream *s, const char *what);

/* Device address of `need` bytes at a view (f32 / int32 data: 4-aligned), or a failure
 * recorded on the stream. */
dsi_status vptr(Stream *s, dsib_view v, uint64_t need, const char *op, const char *what,
                char **out);
template <typename T>
inline dsi_status vp(Stream *s, dsib_view v, uint64_t need, const char *op, const char *what,
                     T **out) {
    char *p = nullptr;
    dsi_status st = vptr(s, v, need, op, what, &p);
    *out = reinterpret_cast<T *>(p);
    return st;
}
/* A state view: every slot, f32 rows of >= width floats. */
dsi_status sptr(Stream *s, const dsib_state *st, uint32_t width, const char *op,
                const char *what, float **out);
/* A weight with decodable rows: type supported, every row of every expert inside the
 * buffer, rows >= 0; returns the address of row 0 of expert 0. */
dsi_status wptr(Stream *s, const dsib_weight *w, const char *op, const char *what,
                const uint8_t **out);

/* Elements of a small parameter weight (a vector stored as [n] or [n][1]…). */
inline int64_t welems(const dsib_weight *w) {
    return w->ne[0] * (w->ne[1] > 1 ? w->ne[1] : 1) * (w->ne[2] > 1 ? w->ne[2] : 1);
}

/* Bytes spanned by `rows` rows of `width` floats with row stride `ld` floats. */
inline uint64_t span(uint64_t rows, uint64_t ld, uint64_t width) {
    if (rows == 0 || width == 0) return 4;
    return ((rows - 1) * ld + width) * 4;
}

/* Workspace of a stream: `bytes` at offset 0, or NULL (the op fails: the stream was created
 * for smaller shapes). */
inline char *ws(Stream *s, uint64_t bytes) { return bytes <= s->ws_size ? s->ws : nullptr; }

inline unsigned cdiv(uint64_t a, uint64_t b) { return (unsigned)((a + b - 1) / b); }

/* ---- op entry points (one group per file) --------------------------------------------- */

/* matmul.cu */
dsi_status op_matmul(dsib_stream *, const dsib_weight *, int32_t, dsib_view, uint32_t,
                     dsib_view, uint32_t, uint32_t);
dsi_status op_matmul_grouped(dsib_stream *, const dsib_weight *, uint32_t, dsib_view,
                             uint32_t, dsib_view, uint32_t, uint32_t);
/* eltwise.cu */
dsi_status op_get_rows(dsib_stream *, const dsib_weight *, dsib_view, dsib_view, uint32_t, uint32_t);
dsi_status op_rms_norm(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t, uint32_t,
                       uint32_t, const dsib_weight *, float);
dsi_status op_add(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t, dsib_view, uint32_t,
                  uint32_t, uint32_t);
dsi_status op_scale(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, float);
dsi_status op_copy(dsib_stream *, dsib_view, dsib_view, uint64_t);
dsi_status op_copy_rows(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t, uint32_t, uint32_t);
dsi_status op_gather_rows(dsib_stream *, dsib_view, uint32_t, dsib_view, dsib_view, uint32_t,
                          uint32_t, uint32_t);
dsi_status op_rope_tail(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, uint32_t,
                        dsib_view, int32_t, const dsib_rope *, int32_t);
dsi_status op_store_rows(dsib_stream *, dsib_view, uint32_t, uint32_t, dsib_view,
                         const dsib_state *, uint32_t, uint32_t, uint32_t);
dsi_status op_add_rows_periodic(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t,
                                const dsib_weight *, dsib_view, uint32_t);
dsi_status op_swiglu(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t, dsib_view,
                     uint32_t, uint32_t, uint32_t, float);

/* fakequant.cu */
dsi_status op_fake_quant(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, uint32_t,
                         uint32_t, int32_t, uint32_t);
dsi_status op_hadamard(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, uint32_t);

/* mhc.cu */
dsi_status op_hc_expand(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t, uint32_t, uint32_t);
dsi_status op_hc_mix(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, const dsib_weight *,
                     const dsib_weight *, const dsib_weight *, float, float, uint32_t, int32_t,
                     dsib_view, uint32_t);
dsi_status op_hc_collapse(dsib_stream *, dsib_view, dsib_view, uint32_t, dsib_view, uint32_t,
                          uint32_t, uint32_t, uint32_t);
dsi_status op_hc_post(dsib_stream *, dsib_view, uint32_t, dsib_view, dsib_view, uint32_t,
                      dsib_view, uint32_t, uint32_t, uint32_t);

/* compressor.cu */
dsi_status op_compress_pool(dsib_stream *, const dsib_state *, const dsib_state *, dsib_view,
                            dsib_view, uint32_t, dsib_view, uint32_t, uint32_t, int32_t, uint32_t,
                            dsib_view, uint32_t);

/* attention.cu */
dsi_status op_indexer_topk(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t,
                           const dsib_state *, uint32_t, uint32_t, dsib_view, uint32_t, uint32_t,
                           uint32_t, dsib_view);
dsi_status op_indexer_topk_v41(dsib_stream *, dsib_view, uint32_t, dsib_view, uint32_t,
                               const dsib_state *, uint32_t, uint32_t, dsib_view, uint32_t,
                               uint32_t, uint32_t, dsib_view, dsib_view, dsib_view, uint32_t,
                               uint32_t);
dsi_status op_attn_sink(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, dsib_view,
                        uint32_t, uint32_t, const dsib_state *, dsib_view, uint32_t, uint32_t,
                        const dsib_state *, dsib_view, uint32_t, const dsib_weight *, float,
                        dsib_view, uint32_t);

/* moe.cu */
dsi_status op_moe_route(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t,
                        const dsib_weight *, const dsib_weight *, dsib_view, float, float,
                        uint32_t, dsib_view, dsib_view);
dsi_status op_moe_experts(dsib_stream *, dsib_view, uint32_t, dsib_view, dsib_view, uint32_t,
                          const dsib_weight *, const dsib_weight *, const dsib_weight *, float,
                          uint32_t, dsib_view, uint32_t);

/* engram.cu */
dsi_status op_engram_gate(dsib_stream *, dsib_view, uint32_t, uint32_t, uint32_t, dsib_view,
                          uint32_t, const dsib_weight *, const dsib_weight *, float);

/* ---- shared helpers of the kernel files ------------------------------------------------ */

/* The weight matmul behind op_matmul, op_matmul_grouped and hc_mix's projection:
 * y[t][g·R + r] = Σ_i W[g·R + r][i]·x[t][g·xk + i] for g < groups (xk = 0: every group reads
 * the same x columns). `w` = row 0 of group 0, `nb1` the row stride, K = W.ne[0]. */
dsi_status mm_run(Stream *s, int32_t type, const uint8_t *w, uint64_t nb1, int64_t K,
                  uint32_t R, uint32_t groups, uint64_t xk, const float *x, uint64_t ldx,
                  float *y, uint64_t ldy, uint32_t n);

} // namespace dsic

#endif /* DSIC_CUDA_IMPL_H */
