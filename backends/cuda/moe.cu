/*
 * backends/cuda/moe.cu — MoE routing and the routed experts (model-spec §3.5).
 *
 * moe_route: one block per row; the k best of sqrt(softplus(l)) + bias are chosen by k
 * block arg-max passes under the CPU's total order (higher first, ties: lower expert id),
 * so the selection equals the CPU's whenever the scores do; thread 0 forms the weights in k
 * order as the CPU does. Selection stays on the device.
 *
 * moe_experts: the (row, k) slots are grouped by expert on the device (experts ascending,
 * slots ascending; one small kernel), then each of the three projections is ONE launch over
 * all groups (grid.x = group, grid.y = output rows): every selected expert's weights are read
 * once per call for all the rows that chose it, with no host loop over experts. A slot's
 * result uses the warp matmul order of cuda_dev.cuh, which does not depend on the grouping.
 * Then the clamped SwiGLU times the route weight, and the sum over k in k order (the CPU's).
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

enum { ROUTE_MAX_K = 64 };

/* a better than b: higher score, ties lower id. */
__device__ __forceinline__ bool better(float a, int32_t ia, float b, int32_t ib) {
    return a > b || (a == b && ia < ib);
}

__global__ void __launch_bounds__(RED_THREADS)
k_moe_route(const float *l, uint64_t ldl, uint32_t E, uint32_t k, int32_t bias_t,
            const uint8_t *bias, const uint8_t *tid, uint64_t tid_nb1, int64_t tid_rows,
            const int32_t *ids, float norm_add, float route_scale, int32_t *sel, float *wts,
            int *err) {
    __shared__ int32_t chosen[ROUTE_MAX_K];
    __shared__ float bv[32];
    __shared__ int32_t bi[32];
    __shared__ int bad;
    const uint32_t t = blockIdx.x;
    const float *lt = l + (uint64_t)t * ldl;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    if (tid) {
        if (threadIdx.x == 0) {
            const int32_t id = ids[t];
            if (id < 0 || id >= tid_rows) {
                bad = DERR_ARG;
            } else {
                const uint8_t *row = tid + (uint64_t)id * tid_nb1;
                for (uint32_t i = 0; i < k; i++) {
                    const int32_t v = (int32_t)rd32(row + 4 * i);
                    if (v < 0 || (uint32_t)v >= E) {
                        bad = DERR_FORMAT;
                        break;
                    }
                    chosen[i] = v;
                }
            }
        }
        __syncthreads();
    } else {
        for (uint32_t i = 0; i < k; i++) {
            float best = -INFINITY;
            int32_t bid = 0x7FFFFFFF;
            for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
                bool taken = false;
                for (uint32_t j = 0; j < i; j++) taken |= chosen[j] == (int32_t)e;
                if (taken) continue;
                const float s0 = sqrtf(softplusf_(lt[e]));
                const float sb = bias ? s0 + dq_elem(bias_t, bias, e) : s0;
                if (bid == 0x7FFFFFFF || better(sb, (int32_t)e, best, bid)) {
                    best = sb;
                    bid = (int32_t)e;
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xFFFFFFFFu, best, o);
                const int32_t oi = __shfl_xor_sync(0xFFFFFFFFu, bid, o);
                if (oi != 0x7FFFFFFF && (bid == 0x7FFFFFFF || better(ov, oi, best, bid))) {
                    best = ov;
                    bid = oi;
                }
            }
            if ((threadIdx.x & 31) == 0) {
                bv[threadIdx.x >> 5] = best;
                bi[threadIdx.x >> 5] = bid;
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                float b = bv[0];
                int32_t id = bi[0];
                for (uint32_t w = 1; w < (blockDim.x >> 5); w++)
                    if (bi[w] != 0x7FFFFFFF && (id == 0x7FFFFFFF || better(bv[w], bi[w], b, id))) {
                        b = bv[w];
                        id = bi[w];
                    }
                chosen[i] = id;
            }
            __syncthreads();
        }
    }
    if (threadIdx.x != 0) return;
    int32_t *o = sel + (uint64_t)t * k;
    float *w = wts + (uint64_t)t * k;
    if (bad) {
        derr(err, bad);
        for (uint32_t i = 0; i < k; i++) {
            o[i] = 0;
            w[i] = 0.0f;
        }
        return;
    }
    float sum = 0.0f;
    for (uint32_t i = 0; i < k; i++) {
        o[i] = chosen[i];
        sum = sum + sqrtf(softplusf_(lt[chosen[i]]));
    }
    sum = sum + norm_add;
    for (uint32_t i = 0; i < k; i++) w[i] = sqrtf(softplusf_(lt[chosen[i]])) / sum * route_scale;
}

struct Groups {
    int32_t *n_groups, *g_expert, *g_off, *slot_at, *cnt;
};

/* Groups the slots by expert (thread 0; slots and experts are few). */
__global__ void k_moe_group(const int32_t *sel, uint32_t ns, uint32_t E, Groups g, int *err) {
    if (threadIdx.x != 0) return;
    for (uint32_t e = 0; e < E; e++) g.cnt[e] = 0;
    for (uint32_t s = 0; s < ns; s++) {
        const int32_t e = sel[s];
        if (e < 0 || (uint32_t)e >= E) {
            derr(err, DERR_INTERNAL);
            *g.n_groups = 0;
            return;
        }
        g.cnt[e]++;
    }
    int32_t ng = 0, acc = 0;
    for (uint32_t e = 0; e < E; e++) {
        if (!g.cnt[e]) continue;
        g.g_expert[ng] = (int32_t)e;
        g.g_off[ng] = acc;
        acc += g.cnt[e];
        g.cnt[e] = g.g_off[ng];
        ng++;
    }
    g.g_off[ng] = acc;
    *g.n_groups = ng;
    for (uint32_t s = 0; s < ns; s++) g.slot_at[g.cnt[sel[s]]++] = (int32_t)s;
}

/* One projection over every group: Y[s][o] = W_e[o] · X[s / xdiv], o < R. */
template <int32_t T>
__global__ void __launch_bounds__(MM_THREADS)
k_moe_mm(const uint8_t *w, uint64_t nb1, uint64_t nb2, int64_t K, uint32_t R, Groups g,
         const float *x, uint64_t ldx, uint32_t xdiv, float *y, uint64_t ldy) {
    const int32_t gi = (int32_t)blockIdx.x;
    if (gi >= *g.n_groups) return;
    const uint32_t o = blockIdx.y * MM_WARPS + (threadIdx.x >> 5);
    if (o >= R) return; /* whole warp */
    const int32_t e = g.g_expert[gi], s0 = g.g_off[gi], s1 = g.g_off[gi + 1];
    const uint8_t *row = w + (uint64_t)e * nb2 + (uint64_t)o * nb1;
    for (int32_t b = s0; b < s1; b += MM_NT) {
        const int nt = s1 - b < MM_NT ? s1 - b : MM_NT;
        const float *xs[MM_NT];
#pragma unroll
        for (int t = 0; t < MM_NT; t++)
            xs[t] = x + (uint64_t)(g.slot_at[b + (t < nt ? t : 0)] / xdiv) * ldx;
        float acc[MM_NT];
        warp_dot_row<T>(row, K, xs, nt, acc);
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int t = 0; t < MM_NT; t++)
                if (t < nt) y[(uint64_t)g.slot_at[b + t] * ldy + o] = acc[t];
        }
    }
}

__global__ void k_moe_act(float *G, const float *U, uint64_t ld, uint32_t ns, uint32_t F,
                          const float *wts, float lim) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, N = (uint64_t)ns * F; i < N;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t s = i / F, c = i % F;
        G[s * ld + c] = swiglu1(G[s * ld + c], U[s * ld + c], lim) * wts[s];
    }
}

__global__ void k_moe_sum(const float *Y, uint64_t ld, uint32_t n, uint32_t k, uint32_t D, float *y,
                          uint64_t ldy) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, N = (uint64_t)n * D; i < N;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t t = i / D, d = i % D;
        const float *r = Y + t * k * ld + d;
        float a = r[0];
        for (uint32_t j = 1; j < k; j++) a = a + r[(uint64_t)j * ld];
        y[t * ldy + d] = a;
    }
}

dsi_status moe_mm(Stream *s, const dsib_weight *w, const uint8_t *wp, uint32_t max_groups,
                  const Groups &g, const float *x, uint64_t ldx, uint32_t xdiv, float *y,
                  uint64_t ldy) {
    const Dim3 gd = moe_grid(max_groups, max_groups, (uint32_t)w->ne[1]);
    const dim3 grid(gd.x, gd.y, 1);
#define DSIC_MOE_LAUNCH(TT)                                                                  \
    k_moe_mm<TT><<<grid, MM_THREADS, 0, s->s>>>(wp, w->nb1, w->nb2, w->ne[0], (uint32_t)w->ne[1], \
                                                g, x, ldx, xdiv, y, ldy)
    DSIC_TYPE_SWITCH(w->type, DSIC_MOE_LAUNCH)
#undef DSIC_MOE_LAUNCH
    return launched(s, "moe_experts");
}

} // namespace

dsi_status op_moe_route(dsib_stream *st, dsib_view logits, uint32_t ldl, uint32_t E, uint32_t k,
                        const dsib_weight *bias, const dsib_weight *tid2eid, dsib_view ids,
                        float norm_add, float route_scale, uint32_t n, dsib_view sel,
                        dsib_view wts) {
    Stream *s = S(st);
    if (k == 0 || k > E || E > 65536 || k > ROUTE_MAX_K)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: moe_route: E %u, k %u", E, k);
    if (n == 0) return DSI_OK;
    const float *lp;
    int32_t *sp;
    float *wp;
    const int32_t *ip = nullptr;
    const uint8_t *bp = nullptr, *tp = nullptr;
    dsi_status r = vp(s, logits, span(n, ldl, E), "moe_route", "logits", &lp);
    if (r == DSI_OK) r = vp(s, sel, 4ull * n * k, "moe_route", "sel", &sp);
    if (r == DSI_OK) r = vp(s, wts, 4ull * n * k, "moe_route", "wts", &wp);
    if (r == DSI_OK && tid2eid) {
        r = wptr(s, tid2eid, "moe_route", "tid2eid", &tp);
        if (r == DSI_OK && tid2eid->ne[0] < (int64_t)k)
            r = fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: moe_route: tid2eid rows shorter than k");
        if (r == DSI_OK) r = vp(s, ids, 4ull * n, "moe_route", "ids", &ip);
    } else if (r == DSI_OK && bias) {
        r = wptr(s, bias, "moe_route", "bias", &bp);
        if (r == DSI_OK && welems(bias) < (int64_t)E)
            r = fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: moe_route: bias shorter than E");
    }
    if (r != DSI_OK) return r;
    k_moe_route<<<n, RED_THREADS, 0, s->s>>>(lp, ldl, E, k, bias ? bias->type : 0, bp, tp,
                                              tid2eid ? tid2eid->nb1 : 0, tid2eid ? tid2eid->ne[1] : 0,
                                              ip, norm_add, route_scale, sp, wp, s->err_dev);
    return launched(s, "moe_route");
}

dsi_status op_moe_experts(dsib_stream *st, dsib_view x, uint32_t ldx, dsib_view sel, dsib_view wts,
                          uint32_t k, const dsib_weight *w1, const dsib_weight *w3,
                          const dsib_weight *w2, float limit, uint32_t n, dsib_view y,
                          uint32_t ldy) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    if (!w1 || !w2 || !w3) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: moe_experts: no weights");
    const int64_t D = w1->ne[0], F = w1->ne[1], E = w1->ne[2] < 1 ? 1 : w1->ne[2];
    if (w2->ne[0] != F || w2->ne[1] != D || w3->ne[0] != D || w3->ne[1] != F || k == 0 ||
        (w3->ne[2] < 1 ? 1 : w3->ne[2]) != E || (w2->ne[2] < 1 ? 1 : w2->ne[2]) != E)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: moe_experts: weight shapes");
    if (!type_supported(w1->type) || !type_supported(w2->type) || !type_supported(w3->type))
        return fail(s, DSI_ERR_UNSUPPORTED, "cuda: moe_experts: weight types %d / %d / %d",
                    (int)w1->type, (int)w3->type, (int)w2->type);
    const uint64_t ns = (uint64_t)n * k;
    const dsib_stream_desc &d = s->desc;
    if (ns > (uint64_t)d.max_rows * d.max_experts_used || (uint64_t)E > d.max_experts ||
        (uint64_t)F > d.max_width || (uint64_t)D > d.max_width)
        return fail(s, DSI_ERR_INVALID_ARGUMENT,
                    "cuda: moe_experts: %llu slots, %lld experts, widths %lld / %lld exceed the "
                    "stream's workspace", (unsigned long long)ns, (long long)E, (long long)D,
                    (long long)F);
    const uint8_t *p1, *p2, *p3;
    const float *xp, *wtp;
    const int32_t *slp;
    float *yp;
    dsi_status r = wptr(s, w1, "moe_experts", "w1", &p1);
    if (r == DSI_OK) r = wptr(s, w3, "moe_experts", "w3", &p3);
    if (r == DSI_OK) r = wptr(s, w2, "moe_experts", "w2", &p2);
    if (r == DSI_OK) r = vp(s, x, span(n, ldx, (uint64_t)D), "moe_experts", "x", &xp);
    if (r == DSI_OK) r = vp(s, sel, 4 * ns, "moe_experts", "sel", &slp);
    if (r == DSI_OK) r = vp(s, wts, 4 * ns, "moe_experts", "wts", &wtp);
    if (r == DSI_OK) r = vp(s, y, span(n, ldy, (uint64_t)D), "moe_experts", "y", &yp);
    if (r != DSI_OK) return r;
    const WsPlan plan = ws_plan(&d);
    if (plan.moe_bytes > s->ws_size)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: moe_experts: workspace too small");
    int32_t *gb = reinterpret_cast<int32_t *>(s->ws + plan.moe_groups);
    const uint64_t Em = d.max_experts;
    Groups g;
    g.n_groups = gb;
    g.g_expert = gb + 1;
    g.g_off = gb + 1 + Em;
    g.slot_at = gb + 1 + Em + (Em + 1);
    g.cnt = gb + 1 + Em + (Em + 1) + (uint64_t)d.max_rows * d.max_experts_used;
    float *A = reinterpret_cast<float *>(s->ws + plan.moe_h);
    float *Bm = reinterpret_cast<float *>(s->ws + plan.moe_y);
    const uint64_t ld = d.max_width;
    const uint32_t max_groups = moe_max_groups((uint32_t)E, ns);
    k_moe_group<<<1, 32, 0, s->s>>>(slp, (uint32_t)ns, (uint32_t)E, g, s->err_dev);
    if ((r = launched(s, "moe_experts")) != DSI_OK) return r;
    /* gate rows into A, up rows into B (input row of slot s: s / k) */
    if ((r = moe_mm(s, w1, p1, max_groups, g, xp, ldx, k, A, ld)) != DSI_OK) return r;
    if ((r = moe_mm(s, w3, p3, max_groups, g, xp, ldx, k, Bm, ld)) != DSI_OK) return r;
    k_moe_act<<<ew_blocks(ns * (uint64_t)F), EW_THREADS, 0, s->s>>>(A, Bm, ld, (uint32_t)ns,
                                                                     (uint32_t)F, wtp, limit);
    if ((r = launched(s, "moe_experts")) != DSI_OK) return r;
    /* down projection of every slot into B, then the sum over k */
    if ((r = moe_mm(s, w2, p2, max_groups, g, A, ld, 1, Bm, ld)) != DSI_OK) return r;
    k_moe_sum<<<ew_blocks((uint64_t)n * D), EW_THREADS, 0, s->s>>>(Bm, ld, n, k, (uint32_t)D, yp, ldy);
    return launched(s, "moe_experts");
}

} // namespace dsic
