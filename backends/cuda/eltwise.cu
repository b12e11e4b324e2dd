/*
 * backends/cuda/eltwise.cu — the row-wise and elementwise ops: get_rows, rms_norm, add, scale,
 * copy, copy_rows, gather_rows, rope_tail, store_rows, add_rows_periodic, swiglu. Each output
 * element is computed with the CPU backend's operations in the CPU's order (backends/cpu/
 * ops.c); rms_norm's sum of squares uses the fixed block order of cuda_dev.cuh.
 */
#include "backends/cuda/cuda_dev.cuh"
#include "backends/rope.h"

namespace dsic {
namespace {

/* Grid-stride loop over rows × width elements. */
#define EW_LOOP(rows, width)                                                             \
    for (uint64_t _i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,                  \
                  _n = (uint64_t)(rows) * (width);                                       \
         _i < _n; _i += (uint64_t)gridDim.x * blockDim.x)

__global__ void k_get_rows(int32_t type, const uint8_t *tab, uint64_t nb1, int64_t V, int64_t W,
                           const int32_t *ids, float *y, uint64_t ldy, uint32_t n, int *err) {
    EW_LOOP(n, W) {
        const uint64_t t = _i / (uint64_t)W, i = _i % (uint64_t)W;
        const int32_t id = ids[t];
        if (id < 0 || id >= V) {
            if (i == 0) derr(err, DERR_ARG);
            continue;
        }
        y[t * ldy + i] = dq_elem(type, tab + (uint64_t)id * nb1, (int64_t)i);
    }
}

__global__ void k_rms_norm(const float *x, uint64_t ldx, float *y, uint64_t ldy, uint32_t width,
                           int32_t wtype, const uint8_t *w, float eps) {
    __shared__ float sh[32];
    const float *a = x + (uint64_t)blockIdx.x * ldx;
    float *b = y + (uint64_t)blockIdx.x * ldy;
    const float ss = block_sum_fn(width, [&](uint64_t j) { return a[j] * a[j]; }, sh);
    const float sc = 1.0f / sqrtf(ss / (float)width + eps);
    for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = a[i] * sc;
        b[i] = w ? v * dq_elem(wtype, w, i) : v;
    }
}

__global__ void k_add(const float *a, uint64_t lda, const float *b, uint64_t ldb, float *y,
                      uint64_t ldy, uint32_t rows, uint32_t width) {
    EW_LOOP(rows, width) {
        const uint64_t r = _i / width, i = _i % width;
        y[r * ldy + i] = a[r * lda + i] + b[r * ldb + i];
    }
}

__global__ void k_scale(float *x, uint64_t ldx, uint32_t rows, uint32_t width, float f) {
    EW_LOOP(rows, width) {
        const uint64_t r = _i / width, i = _i % width;
        x[r * ldx + i] = x[r * ldx + i] * f;
    }
}

__global__ void k_copy_rows(const float *s, uint64_t lds, float *d, uint64_t ldd, uint32_t rows,
                            uint32_t width) {
    EW_LOOP(rows, width) {
        const uint64_t r = _i / width, i = _i % width;
        d[r * ldd + i] = s[r * lds + i];
    }
}

__global__ void k_gather_rows(const float *s, uint64_t lds, const int32_t *idx, float *d,
                              uint64_t ldd, uint32_t n, uint32_t width, int *err) {
    EW_LOOP(n, width) {
        const uint64_t t = _i / width, i = _i % width;
        const int32_t r = idx[t];
        if (r < 0) {
            if (i == 0) derr(err, DERR_ARG);
            continue;
        }
        d[t * ldd + i] = s[(uint64_t)r * lds + i];
    }
}

struct RopeFreqs {
    double f[256];
};

__global__ void k_rope(float *x, uint64_t ldx, uint32_t n, uint32_t heads, uint32_t hd,
                       const int32_t *rows, int32_t delta, RopeFreqs fr, uint32_t n_rot,
                       int32_t inverse, int *err) {
    const uint32_t half = n_rot / 2;
    EW_LOOP((uint64_t)n * heads, half) {
        const uint64_t th_ = _i / half;
        const uint32_t i = (uint32_t)(_i % half);
        const uint32_t t = (uint32_t)(th_ / heads), h = (uint32_t)(th_ % heads);
        Row r;
        if (!load_row(rows, t, n, 0, &r)) {
            if (i == 0 && h == 0) derr(err, DERR_ARG);
            continue;
        }
        const int64_t q = (int64_t)r.pos + delta;
        float c, sn;
        rope_cs((double)(q > 0 ? q : 0), fr.f[i], inverse, &c, &sn);
        float *v = x + (uint64_t)t * ldx + (uint64_t)h * hd + (hd - n_rot);
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * sn;
        v[2 * i + 1] = x0 * sn + x1 * c;
    }
}

/* store_rows: every block first checks every row (nothing is written when one is bad or a
 * completed group does not fit), then block t copies row t. */
__global__ void k_store_rows(const float *src, uint64_t lds, uint32_t n, const int32_t *rows,
                             float *dst, uint32_t slots, uint32_t drows, uint32_t ld,
                             uint32_t width, uint32_t ratio, int ring, int *err) {
    int bad = 0;
    for (uint32_t t = threadIdx.x; t < n; t += blockDim.x) {
        Row r;
        if (!load_row(rows, t, n, slots, &r)) bad = 1;
        else if (!ring && ((int64_t)r.pos + 1) % ratio == 0 &&
                 (uint64_t)(((int64_t)r.pos + 1) / ratio - 1) >= drows)
            bad = 1;
    }
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0 && blockIdx.x == 0) derr(err, DERR_ARG);
        return;
    }
    for (uint32_t t = blockIdx.x; t < n; t += gridDim.x) {
        Row r;
        load_row(rows, t, n, slots, &r);
        const int64_t p = r.pos;
        uint64_t row;
        if (ring) {
            const int64_t last = (int64_t)r.pos0 + r.count - 1;
            if (p <= last - (int64_t)drows) continue;
            row = (uint64_t)p % drows;
        } else {
            if ((p + 1) % ratio != 0) continue;
            row = (uint64_t)((p + 1) / ratio - 1);
        }
        float *d = dst + ((uint64_t)r.slot * drows + row) * ld;
        const float *s = src + (uint64_t)t * lds;
        for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
    }
}

__global__ void k_add_rows_periodic(float *x, uint64_t ldx, uint32_t n, uint32_t width,
                                    int32_t type, const uint8_t *tab, uint64_t nb1,
                                    const int32_t *rows, uint32_t period, int *err) {
    EW_LOOP(n, width) {
        const uint32_t t = (uint32_t)(_i / width), i = (uint32_t)(_i % width);
        Row r;
        if (!load_row(rows, t, n, 0, &r)) {
            if (i == 0) derr(err, DERR_ARG);
            continue;
        }
        const uint64_t pr = (uint64_t)r.pos % period;
        float *v = x + (uint64_t)t * ldx + i;
        *v = *v + dq_elem(type, tab + pr * nb1, i);
    }
}

__global__ void k_swiglu(const float *g, uint64_t ldg, const float *u, uint64_t ldu, float *y,
                         uint64_t ldy, uint32_t rows, uint32_t width, float lim) {
    EW_LOOP(rows, width) {
        const uint64_t r = _i / width, i = _i % width;
        y[r * ldy + i] = swiglu1(g[r * ldg + i], u[r * ldu + i], lim);
    }
}

inline dim3 ew(uint64_t elems) { return dim3(ew_blocks(elems)); }

} // namespace

dsi_status op_get_rows(dsib_stream *st, const dsib_weight *table, dsib_view ids, dsib_view y,
                       uint32_t ldy, uint32_t n) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    const uint8_t *tp;
    const int32_t *ip;
    float *yp;
    dsi_status r = wptr(s, table, "get_rows", "table", &tp);
    if (r == DSI_OK) r = vp(s, ids, 4ull * n, "get_rows", "ids", &ip);
    if (r == DSI_OK) r = vp(s, y, span(n, ldy, (uint64_t)table->ne[0]), "get_rows", "y", &yp);
    if (r != DSI_OK) return r;
    const uint64_t W = (uint64_t)table->ne[0];
    k_get_rows<<<ew(n * W), EW_THREADS, 0, s->s>>>(table->type, tp, table->nb1, table->ne[1],
                                                   (int64_t)W, ip, yp, ldy, n, s->err_dev);
    return launched(s, "get_rows");
}

dsi_status op_rms_norm(dsib_stream *st, dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy,
                       uint32_t rows, uint32_t width, const dsib_weight *w, float eps) {
    Stream *s = S(st);
    if (rows == 0 || width == 0) return DSI_OK;
    const float *xp;
    float *yp;
    const uint8_t *wp = nullptr;
    dsi_status r = vp(s, x, span(rows, ldx, width), "rms_norm", "x", &xp);
    if (r == DSI_OK) r = vp(s, y, span(rows, ldy, width), "rms_norm", "y", &yp);
    if (r == DSI_OK && w) {
        r = wptr(s, w, "rms_norm", "w", &wp);
        if (r == DSI_OK && w->ne[0] < (int64_t)width)
            r = fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: rms_norm: weight shorter than the row");
    }
    if (r != DSI_OK) return r;
    if (rows > 0x7FFFFFFFu) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: rms_norm: too many rows");
    k_rms_norm<<<rows, RED_THREADS, 0, s->s>>>(xp, ldx, yp, ldy, width, w ? w->type : 0, wp, eps);
    return launched(s, "rms_norm");
}

dsi_status op_add(dsib_stream *st, dsib_view a, uint32_t lda, dsib_view b, uint32_t ldb,
                  dsib_view y, uint32_t ldy, uint32_t rows, uint32_t width) {
    Stream *s = S(st);
    if (rows == 0 || width == 0) return DSI_OK;
    const float *ap, *bp;
    float *yp;
    dsi_status r = vp(s, a, span(rows, lda, width), "add", "a", &ap);
    if (r == DSI_OK) r = vp(s, b, span(rows, ldb, width), "add", "b", &bp);
    if (r == DSI_OK) r = vp(s, y, span(rows, ldy, width), "add", "y", &yp);
    if (r != DSI_OK) return r;
    k_add<<<ew((uint64_t)rows * width), EW_THREADS, 0, s->s>>>(ap, lda, bp, ldb, yp, ldy, rows, width);
    return launched(s, "add");
}

dsi_status op_scale(dsib_stream *st, dsib_view x, uint32_t ldx, uint32_t rows, uint32_t width,
                    float f) {
    Stream *s = S(st);
    if (rows == 0 || width == 0) return DSI_OK;
    float *xp;
    dsi_status r = vp(s, x, span(rows, ldx, width), "scale", "x", &xp);
    if (r != DSI_OK) return r;
    k_scale<<<ew((uint64_t)rows * width), EW_THREADS, 0, s->s>>>(xp, ldx, rows, width, f);
    return launched(s, "scale");
}

dsi_status op_copy(dsib_stream *st, dsib_view src, dsib_view dst, uint64_t bytes) {
    Stream *s = S(st);
    if (bytes == 0) return DSI_OK;
    const Buffer *sb = B(src.buf), *db = B(dst.buf);
    if (!sb || !db || src.offset > sb->size || bytes > sb->size - src.offset ||
        dst.offset > db->size || bytes > db->size - dst.offset)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: copy: %llu bytes outside a buffer",
                    (unsigned long long)bytes);
    cudaError_t e = cudaMemcpyAsync(db->ptr + dst.offset, sb->ptr + src.offset, bytes,
                                    cudaMemcpyDefault, s->s);
    if (e != cudaSuccess)
        return fail(s, DSI_ERR_BACKEND, "cuda: copy: %s", cudaGetErrorString(e));
    return DSI_OK;
}

dsi_status op_copy_rows(dsib_stream *st, dsib_view src, uint32_t lds, dsib_view dst, uint32_t ldd,
                        uint32_t rows, uint32_t width) {
    Stream *s = S(st);
    if (rows == 0 || width == 0) return DSI_OK;
    const float *sp;
    float *dp;
    dsi_status r = vp(s, src, span(rows, lds, width), "copy_rows", "src", &sp);
    if (r == DSI_OK) r = vp(s, dst, span(rows, ldd, width), "copy_rows", "dst", &dp);
    if (r != DSI_OK) return r;
    k_copy_rows<<<ew((uint64_t)rows * width), EW_THREADS, 0, s->s>>>(sp, lds, dp, ldd, rows, width);
    return launched(s, "copy_rows");
}

dsi_status op_gather_rows(dsib_stream *st, dsib_view src, uint32_t lds, dsib_view idx,
                          dsib_view dst, uint32_t ldd, uint32_t n, uint32_t width) {
    Stream *s = S(st);
    if (n == 0 || width == 0) return DSI_OK;
    const float *sp;
    const int32_t *ip;
    float *dp;
    /* the source extent is known only on the device: the whole buffer from the view */
    const Buffer *sb = B(src.buf);
    if (!sb || src.offset > sb->size)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: gather_rows: bad source view");
    dsi_status r = vp(s, src, width * 4ull, "gather_rows", "src", &sp);
    if (r == DSI_OK) r = vp(s, idx, 4ull * n, "gather_rows", "idx", &ip);
    if (r == DSI_OK) r = vp(s, dst, span(n, ldd, width), "gather_rows", "dst", &dp);
    if (r != DSI_OK) return r;
    k_gather_rows<<<ew((uint64_t)n * width), EW_THREADS, 0, s->s>>>(sp, lds, ip, dp, ldd, n, width,
                                                                     s->err_dev);
    return launched(s, "gather_rows");
}

dsi_status op_rope_tail(dsib_stream *st, dsib_view x, uint32_t ldx, uint32_t n, uint32_t heads,
                        uint32_t head_dim, dsib_view rows, int32_t pos_delta, const dsib_rope *rope,
                        int32_t inverse) {
    Stream *s = S(st);
    if (!rope || rope->n_rot <= 0 || rope->n_rot > 512 || (uint32_t)rope->n_rot > head_dim ||
        (rope->n_rot & 1))
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: rope_tail: bad n_rot");
    if (n == 0 || heads == 0) return DSI_OK;
    float *xp;
    const int32_t *rp;
    dsi_status r = vp(s, x, span(n, ldx, (uint64_t)heads * head_dim), "rope_tail", "x", &xp);
    if (r == DSI_OK) r = vp(s, rows, 16ull * n, "rope_tail", "rows", &rp);
    if (r != DSI_OK) return r;
    RopeFreqs fr;
    std::memset(&fr, 0, sizeof fr);
    dsib_rope_freqs(rope, fr.f);
    const uint32_t half = (uint32_t)rope->n_rot / 2;
    k_rope<<<ew((uint64_t)n * heads * half), EW_THREADS, 0, s->s>>>(
        xp, ldx, n, heads, head_dim, rp, pos_delta, fr, (uint32_t)rope->n_rot, inverse, s->err_dev);
    return launched(s, "rope_tail");
}

dsi_status op_store_rows(dsib_stream *st, dsib_view src, uint32_t lds, uint32_t n, dsib_view rows,
                         const dsib_state *dst, uint32_t width, uint32_t ratio, uint32_t flags) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    const int ring = (flags & DSIB_STORE_RING) != 0;
    if (ratio == 0 || (ring && ratio != 1) || (flags & ~DSIB_STORE_RING))
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: store_rows: bad ratio %u / flags %u", ratio, flags);
    float *dp;
    const float *sp;
    const int32_t *rp;
    dsi_status r = sptr(s, dst, width, "store_rows", "dst", &dp);
    if (r == DSI_OK) r = vp(s, src, span(n, lds, width), "store_rows", "src", &sp);
    if (r == DSI_OK) r = vp(s, rows, 16ull * n, "store_rows", "rows", &rp);
    if (r != DSI_OK) return r;
    const uint32_t blocks = n < 4096 ? n : 4096;
    k_store_rows<<<blocks, EW_THREADS, 0, s->s>>>(sp, lds, n, rp, dp, dst->slots, dst->rows, dst->ld,
                                                  width, ratio, ring, s->err_dev);
    return launched(s, "store_rows");
}

dsi_status op_add_rows_periodic(dsib_stream *st, dsib_view x, uint32_t ldx, uint32_t n,
                                uint32_t width, const dsib_weight *table, dsib_view rows,
                                uint32_t period) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    const uint8_t *tp;
    float *xp;
    const int32_t *rp;
    dsi_status r = wptr(s, table, "add_rows_periodic", "table", &tp);
    if (r != DSI_OK) return r;
    if (period == 0 || table->ne[0] < (int64_t)width || table->ne[1] < (int64_t)period)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: add_rows_periodic: period %u / width %u "
                    "outside the table", period, width);
    if ((r = vp(s, x, span(n, ldx, width), "add_rows_periodic", "x", &xp)) != DSI_OK ||
        (r = vp(s, rows, 16ull * n, "add_rows_periodic", "rows", &rp)) != DSI_OK)
        return r;
    if (width == 0) return DSI_OK;
    k_add_rows_periodic<<<ew((uint64_t)n * width), EW_THREADS, 0, s->s>>>(
        xp, ldx, n, width, table->type, tp, table->nb1, rp, period, s->err_dev);
    return launched(s, "add_rows_periodic");
}

dsi_status op_swiglu(dsib_stream *st, dsib_view g, uint32_t ldg, dsib_view u, uint32_t ldu,
                     dsib_view y, uint32_t ldy, uint32_t rows, uint32_t width, float limit) {
    Stream *s = S(st);
    if (rows == 0 || width == 0) return DSI_OK;
    const float *gp, *up;
    float *yp;
    dsi_status r = vp(s, g, span(rows, ldg, width), "swiglu", "g", &gp);
    if (r == DSI_OK) r = vp(s, u, span(rows, ldu, width), "swiglu", "u", &up);
    if (r == DSI_OK) r = vp(s, y, span(rows, ldy, width), "swiglu", "y", &yp);
    if (r != DSI_OK) return r;
    k_swiglu<<<ew((uint64_t)rows * width), EW_THREADS, 0, s->s>>>(gp, ldg, up, ldu, yp, ldy, rows,
                                                                   width, limit);
    return launched(s, "swiglu");
}

} // namespace dsic
