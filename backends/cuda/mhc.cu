/*
 * backends/cuda/mhc.cu — manifold-constrained hyper-connections (model-spec §3.1, §3.3, §3.6):
 * hc_expand, hc_mix (projection via the weight matmul, then per row: RMS factor, sigmoids and
 * the Sinkhorn normalisation of cuda_math.h hc_coef_row — the CPU's sequence of operations),
 * hc_collapse and hc_post (the CPU's order over streams).
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

__global__ void k_hc_expand(const float *e, uint64_t lde, float *X, uint32_t n, uint32_t n_hc,
                            uint32_t D) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, N = (uint64_t)n * n_hc * D;
         i < N; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t t = i / ((uint64_t)n_hc * D), d = i % D;
        X[i] = e[t * lde + d];
    }
}

/* One block per row: coef[t][0:n_mix] holds fn·flat(X[t]) on entry. */
__global__ void k_hc_coef(const float *X, uint32_t n_hc, uint32_t D, float *coef, uint64_t ldc,
                          int32_t sct, const uint8_t *scp, int32_t bst, const uint8_t *bsp,
                          float rms_eps, float hc_eps, uint32_t iters, int head) {
    __shared__ float sh[32];
    const uint64_t W = (uint64_t)n_hc * D;
    const float *fl = X + (uint64_t)blockIdx.x * W;
    const float ss = block_sum_fn(W, [&](uint64_t j) { return fl[j] * fl[j]; }, sh);
    if (threadIdx.x != 0) return;
    const float rs = 1.0f / sqrtf(ss / (float)W + rms_eps);
    const uint32_t n_mix = head ? n_hc : n_hc * (2 + n_hc);
    float sc[3], bs[16 * 18];
    for (uint32_t i = 0; i < (head ? 1u : 3u); i++) sc[i] = dq_elem(sct, scp, i);
    for (uint32_t i = 0; i < n_mix; i++) bs[i] = dq_elem(bst, bsp, i);
    hc_coef_row(coef + (uint64_t)blockIdx.x * ldc, n_hc, rs, sc, bs, hc_eps, iters, head);
}

__global__ void k_hc_collapse(const float *X, const float *coef, uint64_t ldc, float *y,
                              uint64_t ldy, uint32_t n, uint32_t n_hc, uint32_t D) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, N = (uint64_t)n * D; i < N;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t t = i / D, d = i % D;
        const float *pre = coef + t * ldc, *x = X + t * n_hc * (uint64_t)D;
        float a = pre[0] * x[d];
        for (uint32_t h = 1; h < n_hc; h++) a = a + pre[h] * x[(uint64_t)h * D + d];
        y[t * ldy + d] = a;
    }
}

__global__ void k_hc_post(const float *f, uint64_t ldf, const float *R, const float *coef,
                          uint64_t ldc, float *Xo, uint32_t n, uint32_t n_hc, uint32_t D) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, N = (uint64_t)n * D; i < N;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t t = i / D, d = i % D;
        const float *post = coef + t * ldc + n_hc, *C = post + n_hc;
        const float *rt = R + t * n_hc * (uint64_t)D;
        float *ot = Xo + t * n_hc * (uint64_t)D;
        const float fd = f[t * ldf + d];
        float r[16];
        for (uint32_t h = 0; h < n_hc; h++) r[h] = rt[(uint64_t)h * D + d];
        for (uint32_t j = 0; j < n_hc; j++) {
            float a = post[j] * fd;
            for (uint32_t h = 0; h < n_hc; h++) a = a + C[h * n_hc + j] * r[h];
            ot[(uint64_t)j * D + d] = a;
        }
    }
}

} // namespace

dsi_status op_hc_expand(dsib_stream *st, dsib_view e, uint32_t lde, dsib_view X, uint32_t n,
                        uint32_t n_hc, uint32_t D) {
    Stream *s = S(st);
    if (n == 0 || n_hc == 0 || D == 0) return DSI_OK;
    const float *ep;
    float *xp;
    dsi_status r = vp(s, e, span(n, lde, D), "hc_expand", "e", &ep);
    if (r == DSI_OK) r = vp(s, X, 4ull * n * n_hc * D, "hc_expand", "X", &xp);
    if (r != DSI_OK) return r;
    k_hc_expand<<<ew_blocks((uint64_t)n * n_hc * D), EW_THREADS, 0, s->s>>>(ep, lde, xp, n, n_hc, D);
    return launched(s, "hc_expand");
}

dsi_status op_hc_mix(dsib_stream *st, dsib_view X, uint32_t n, uint32_t n_hc, uint32_t D,
                     const dsib_weight *fn, const dsib_weight *scale, const dsib_weight *base,
                     float rms_eps, float hc_eps, uint32_t iters, int32_t mode, dsib_view coef,
                     uint32_t ldc) {
    Stream *s = S(st);
    if (n_hc == 0 || n_hc > 16 || (mode != DSIB_HC_BLOCK && mode != DSIB_HC_HEAD))
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: hc_mix: n_hc %u / mode %d", n_hc, (int)mode);
    const int head = mode == DSIB_HC_HEAD;
    const uint32_t n_mix = head ? n_hc : n_hc * (2 + n_hc);
    if (!fn || !scale || !base || fn->ne[1] != (int64_t)n_mix || fn->ne[0] != (int64_t)n_hc * D ||
        ldc < n_mix || welems(scale) < (head ? 1 : 3) || welems(base) < (int64_t)n_mix)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: hc_mix: weight shapes");
    if (n == 0) return DSI_OK;
    const uint8_t *fp, *scp, *bsp;
    const float *xp;
    float *cp;
    dsi_status r = wptr(s, fn, "hc_mix", "fn", &fp);
    if (r == DSI_OK) r = wptr(s, scale, "hc_mix", "scale", &scp);
    if (r == DSI_OK) r = wptr(s, base, "hc_mix", "base", &bsp);
    if (r == DSI_OK) r = vp(s, X, 4ull * n * n_hc * D, "hc_mix", "X", &xp);
    if (r == DSI_OK) r = vp(s, coef, span(n, ldc, n_mix), "hc_mix", "coef", &cp);
    if (r != DSI_OK) return r;
    r = mm_run(s, fn->type, fp, fn->nb1, fn->ne[0], n_mix, 1, 0, xp, (uint64_t)n_hc * D, cp, ldc, n);
    if (r != DSI_OK) return r;
    k_hc_coef<<<n, RED_THREADS, 0, s->s>>>(xp, n_hc, D, cp, ldc, scale->type, scp, base->type, bsp,
                                            rms_eps, hc_eps, iters, head);
    return launched(s, "hc_mix");
}

dsi_status op_hc_collapse(dsib_stream *st, dsib_view X, dsib_view coef, uint32_t ldc, dsib_view y,
                          uint32_t ldy, uint32_t n, uint32_t n_hc, uint32_t D) {
    Stream *s = S(st);
    if (n == 0 || D == 0) return DSI_OK;
    if (n_hc == 0 || n_hc > 16) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: hc_collapse: n_hc %u", n_hc);
    const float *xp, *cp;
    float *yp;
    dsi_status r = vp(s, X, 4ull * n * n_hc * D, "hc_collapse", "X", &xp);
    if (r == DSI_OK) r = vp(s, coef, span(n, ldc, n_hc), "hc_collapse", "coef", &cp);
    if (r == DSI_OK) r = vp(s, y, span(n, ldy, D), "hc_collapse", "y", &yp);
    if (r != DSI_OK) return r;
    k_hc_collapse<<<ew_blocks((uint64_t)n * D), EW_THREADS, 0, s->s>>>(xp, cp, ldc, yp, ldy, n, n_hc, D);
    return launched(s, "hc_collapse");
}

dsi_status op_hc_post(dsib_stream *st, dsib_view f, uint32_t ldf, dsib_view R, dsib_view coef,
                      uint32_t ldc, dsib_view Xo, uint32_t n, uint32_t n_hc, uint32_t D) {
    Stream *s = S(st);
    if (n_hc == 0 || n_hc > 16) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: hc_post: n_hc %u", n_hc);
    if (n == 0 || D == 0) return DSI_OK;
    const float *fp, *rp, *cp;
    float *op;
    dsi_status r = vp(s, f, span(n, ldf, D), "hc_post", "f", &fp);
    if (r == DSI_OK) r = vp(s, R, 4ull * n * n_hc * D, "hc_post", "R", &rp);
    if (r == DSI_OK) r = vp(s, coef, span(n, ldc, DSIB_HC_COEF(n_hc)), "hc_post", "coef", &cp);
    if (r == DSI_OK) r = vp(s, Xo, 4ull * n * n_hc * D, "hc_post", "Xo", &op);
    if (r != DSI_OK) return r;
    k_hc_post<<<ew_blocks((uint64_t)n * D), EW_THREADS, 0, s->s>>>(fp, ldf, rp, cp, ldc, op, n, n_hc, D);
    return launched(s, "hc_post");
}

} // namespace dsic
