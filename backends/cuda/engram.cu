/*
 * backends/cuda/engram.cu — the Engram gate (model-spec §4.6 steps 3–5, docs/v41-forward.md):
 * one block per (row, stream); the three sums in the fixed block order of cuda_dev.cuh, the
 * gate by cuda_math.h engram_g (the CPU's operations), then X += g·value.
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

__global__ void __launch_bounds__(RED_THREADS)
k_engram_gate(float *X, uint32_t n_hc, uint32_t D, const float *kv, uint64_t ldkv, int32_t qt,
              const uint8_t *qw, uint64_t qnb1, int32_t kt, const uint8_t *kw, uint64_t knb1,
              float eps, float inv_sqrt_d) {
    __shared__ float sh[32];
    const uint32_t t = blockIdx.x / n_hc, h = blockIdx.x % n_hc;
    float *x = X + ((uint64_t)t * n_hc + h) * D;
    const float *key = kv + (uint64_t)t * ldkv + (uint64_t)h * D;
    const float *value = kv + (uint64_t)t * ldkv + (uint64_t)n_hc * D;
    const uint8_t *qr = qw + (uint64_t)h * qnb1, *kr = kw + (uint64_t)h * knb1;
    const float sx = block_sum_fn(D, [&](uint64_t d) { return x[d] * x[d]; }, sh);
    const float sk = block_sum_fn(D, [&](uint64_t d) { return key[d] * key[d]; }, sh);
    const float c = block_sum_fn(D, [&](uint64_t d) {
        const float w = dq_elem(qt, qr, (int64_t)d) * dq_elem(kt, kr, (int64_t)d);
        return x[d] * w * key[d];
    }, sh);
    const float g = engram_g(sx, sk, c, (float)D, eps, inv_sqrt_d);
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) x[d] = x[d] + g * value[d];
}

} // namespace

dsi_status op_engram_gate(dsib_stream *st, dsib_view X, uint32_t n, uint32_t n_hc, uint32_t D,
                          dsib_view kv, uint32_t ldkv, const dsib_weight *qw, const dsib_weight *kw,
                          float eps) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    if (!qw || !kw || n_hc == 0 || D == 0 || ldkv < (n_hc + 1) * D || qw->ne[0] != (int64_t)D ||
        kw->ne[0] != (int64_t)D || qw->ne[1] < (int64_t)n_hc || kw->ne[1] < (int64_t)n_hc)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: engram_gate: shapes");
    float *xp;
    const float *kp;
    const uint8_t *qp, *kwp;
    dsi_status r = vp(s, X, 4ull * n * n_hc * D, "engram_gate", "X", &xp);
    if (r == DSI_OK) r = vp(s, kv, span(n, ldkv, (uint64_t)(n_hc + 1) * D), "engram_gate", "kv", &kp);
    if (r == DSI_OK) r = wptr(s, qw, "engram_gate", "q_weight", &qp);
    if (r == DSI_OK) r = wptr(s, kw, "engram_gate", "k_weight", &kwp);
    if (r != DSI_OK) return r;
    if ((uint64_t)n * n_hc > 0x7FFFFFFFull) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: engram_gate: too many rows");
    const float inv_sqrt_d = 1.0f / sqrtf((float)D); /* as the CPU */
    k_engram_gate<<<n * n_hc, RED_THREADS, 0, s->s>>>(xp, n_hc, D, kp, ldkv, qw->type, qp, qw->nb1,
                                                       kw->type, kwp, kw->nb1, eps, inv_sqrt_d);
    return launched(s, "engram_gate");
}

} // namespace dsic
