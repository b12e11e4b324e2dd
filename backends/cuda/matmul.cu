/*
 * backends/cuda/matmul.cu — weight matmuls: matmul, matmul_grouped, and the projection of
 * hc_mix (mm_run). One kernel template per weight type decodes the blocks in registers
 * (cuda_dev.cuh warp_dot_row); weights are never dequantised to a copy.
 *
 * Decode (n = 1): one warp per output row streams the row once. Prefill: MM_NT tokens share
 * each decoded chunk, so a weight row is read ceil(n / MM_NT) times (from L2 mostly). The
 * order of the dot product depends only on K (cuda_dev.cuh), so every n gives the same bits.
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

template <int32_t T>
__global__ void __launch_bounds__(MM_THREADS)
mm_kernel(const uint8_t *__restrict__ w, uint64_t nb1, int64_t K, uint64_t rows_total,
          uint32_t R, uint64_t xk, const float *__restrict__ x, uint64_t ldx, float *__restrict__ y,
          uint64_t ldy, uint32_t n) {
    const uint64_t row = (uint64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (row >= rows_total) return; /* whole warp */
    const uint32_t t0 = blockIdx.y * MM_NT;
    const int nt = (int)(n - t0 < (uint32_t)MM_NT ? n - t0 : (uint32_t)MM_NT);
    const uint64_t g = row / R;
    const float *xs[MM_NT];
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        xs[t] = x + (uint64_t)(t0 + (t < nt ? t : 0)) * ldx + g * xk;
    float acc[MM_NT];
    warp_dot_row<T>(w + row * nb1, K, xs, nt, acc);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int t = 0; t < MM_NT; t++)
            if (t < nt) y[(uint64_t)(t0 + t) * ldy + row] = acc[t];
    }
}

} // namespace

dsi_status mm_run(Stream *s, int32_t type, const uint8_t *w, uint64_t nb1, int64_t K,
                  uint32_t R, uint32_t groups, uint64_t xk, const float *x, uint64_t ldx,
                  float *y, uint64_t ldy, uint32_t n) {
    if (n == 0 || R == 0 || groups == 0) return DSI_OK;
    const uint64_t rows_total = (uint64_t)R * groups;
    const Dim3 g = mm_grid(rows_total, n);
    if (g.y > 65535u)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: matmul: %u rows in one call (at most %u)",
                    n, 65535u * MM_NT);
    const dim3 grid(g.x, g.y, 1);
#define DSIC_MM_LAUNCH(TT)                                                                     \
    mm_kernel<TT><<<grid, MM_THREADS, 0, s->s>>>(w, nb1, K, rows_total, R, xk, x, ldx, y, ldy, n)
    DSIC_TYPE_SWITCH(type, DSIC_MM_LAUNCH)
#undef DSIC_MM_LAUNCH
    return launched(s, "matmul");
}

dsi_status op_matmul(dsib_stream *st, const dsib_weight *w, int32_t expert, dsib_view x,
                     uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    const uint8_t *wp;
    const float *xp;
    float *yp;
    dsi_status r = wptr(s, w, "matmul", "W", &wp);
    if (r != DSI_OK) return r;
    const int64_t ne2 = w->ne[2] < 1 ? 1 : w->ne[2];
    if (!type_supported(w->type) || expert < 0 || expert >= ne2 || w->ne[1] > 0xFFFFFFFFll)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: matmul: bad expert %d or type %d", (int)expert,
                    (int)w->type);
    if ((r = vp(s, x, span(n, ldx, (uint64_t)w->ne[0]), "matmul", "x", &xp)) != DSI_OK ||
        (r = vp(s, y, span(n, ldy, (uint64_t)w->ne[1]), "matmul", "y", &yp)) != DSI_OK)
        return r;
    return mm_run(s, w->type, wp + (uint64_t)expert * w->nb2, w->nb1, w->ne[0], (uint32_t)w->ne[1], 1, 0,
                  xp, ldx, yp, ldy, n);
}

dsi_status op_matmul_grouped(dsib_stream *st, const dsib_weight *w, uint32_t groups, dsib_view x,
                             uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n) {
    Stream *s = S(st);
    if (n == 0 || groups == 0) return DSI_OK;
    const uint8_t *wp;
    const float *xp;
    float *yp;
    dsi_status r = wptr(s, w, "matmul_grouped", "W", &wp);
    if (r != DSI_OK) return r;
    if (!type_supported(w->type) || w->ne[1] % groups || w->ne[1] > 0xFFFFFFFFll)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: matmul_grouped: %lld rows in %u groups",
                    (long long)w->ne[1], groups);
    const uint64_t K = (uint64_t)w->ne[0];
    if ((r = vp(s, x, span(n, ldx, K * groups), "matmul_grouped", "x", &xp)) != DSI_OK ||
        (r = vp(s, y, span(n, ldy, (uint64_t)w->ne[1]), "matmul_grouped", "y", &yp)) != DSI_OK)
        return r;
    return mm_run(s, w->type, wp, w->nb1, w->ne[0], (uint32_t)(w->ne[1] / groups), groups, K, xp,
                  ldx, yp, ldy, n);
}

} // namespace dsic
