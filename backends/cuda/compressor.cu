/*
 * backends/cuda/compressor.cu — compress_pool (model-spec §3.4): one thread per (row,
 * channel) runs the CPU's per-channel softmax pooling over the group's candidates in the
 * canonical order (lane A tokens ascending, then lane B; max, then Σexp, then Σ p·kv),
 * reading positions before the step from the rings and the others from the step's rows.
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

struct PoolArgs {
    const float *rk, *rs;        /* rings (slot 0, row 0) */
    uint32_t ring_rows, ring_ld;
    const float *ck, *cs;        /* step rows */
    uint64_t ldc;
    const int32_t *rows;
    uint32_t n, slots, ratio, hd;
    int32_t overlap;
    float *out;
    uint64_t ldo;
    int *err;
};

/* Candidate c of group w for row r: kv and score pointers (channel 0 of its lane), or 0. */
__device__ __forceinline__ int cand(const PoolArgs &a, const Row &r, int64_t w, uint32_t c,
                                    const float **k, const float **sc) {
    uint32_t col;
    const int64_t q = pool_cand(w, c, a.ratio, a.overlap, a.hd, &col);
    if (q < r.pos0) {
        if (r.pos0 - q > (int64_t)a.ring_rows) return 0;
        const uint64_t o = ((uint64_t)r.slot * a.ring_rows + (uint64_t)q % a.ring_rows) * a.ring_ld + col;
        *k = a.rk + o;
        *sc = a.rs + o;
    } else {
        if (q - r.pos0 >= r.count) return 0;
        const uint64_t o = (uint64_t)(r.first + (q - r.pos0)) * a.ldc + col;
        *k = a.ck + o;
        *sc = a.cs + o;
    }
    return 1;
}

__global__ void k_compress_pool(PoolArgs a) {
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, N = (uint64_t)a.n * a.hd;
         i < N; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t t = (uint32_t)(i / a.hd), j = (uint32_t)(i % a.hd);
        float *og = a.out + (uint64_t)t * a.ldo;
        Row r;
        if (!load_row(a.rows, t, a.n, a.slots, &r)) {
            if (j == 0) derr(a.err, DERR_ARG);
            continue;
        }
        const int64_t p = r.pos;
        if ((p + 1) % a.ratio != 0) {
            og[j] = 0.0f;
            continue;
        }
        const int64_t w = (p + 1) / a.ratio - 1;
        const uint32_t nc = a.overlap && w > 0 ? 2 * a.ratio : a.ratio;
        const float *k0, *s0;
        int ok = 1;
        for (uint32_t c = 0; c < nc && ok; c++) ok = cand(a, r, w, c, &k0, &s0);
        if (!ok) {
            if (j == 0) derr(a.err, DERR_INTERNAL);
            og[j] = 0.0f;
            continue;
        }
        cand(a, r, w, 0, &k0, &s0);
        float mx = s0[j];
        for (uint32_t c = 1; c < nc; c++) {
            cand(a, r, w, c, &k0, &s0);
            mx = s0[j] > mx ? s0[j] : mx;
        }
        float z = 0.0f;
        for (uint32_t c = 0; c < nc; c++) {
            cand(a, r, w, c, &k0, &s0);
            z = z + expf(s0[j] - mx);
        }
        float acc = 0.0f;
        for (uint32_t c = 0; c < nc; c++) {
            cand(a, r, w, c, &k0, &s0);
            acc = acc + (expf(s0[j] - mx) / z) * k0[j];
        }
        og[j] = acc;
    }
}

} // namespace

dsi_status op_compress_pool(dsib_stream *st, const dsib_state *ring_kv, const dsib_state *ring_sc,
                            dsib_view kv, dsib_view sc, uint32_t ldc, dsib_view rows, uint32_t n,
                            uint32_t ratio, int32_t overlap, uint32_t hd, dsib_view out,
                            uint32_t ldo) {
    Stream *s = S(st);
    if (n == 0) return DSI_OK;
    const uint32_t wi = (overlap ? 2u : 1u) * hd;
    if (ratio == 0 || ratio > 4096 || hd == 0)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: compress_pool: ratio %u", ratio);
    PoolArgs a;
    float *rk, *rs;
    dsi_status r = sptr(s, ring_kv, wi, "compress_pool", "ring_kv", &rk);
    if (r == DSI_OK) r = sptr(s, ring_sc, wi, "compress_pool", "ring_sc", &rs);
    if (r != DSI_OK) return r;
    if (ring_kv->rows != ring_sc->rows || ring_kv->slots != ring_sc->slots || ring_kv->ld != ring_sc->ld)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: compress_pool: the two rings differ");
    if ((r = vp(s, kv, span(n, ldc, wi), "compress_pool", "kv", &a.ck)) != DSI_OK ||
        (r = vp(s, sc, span(n, ldc, wi), "compress_pool", "sc", &a.cs)) != DSI_OK ||
        (r = vp(s, rows, 16ull * n, "compress_pool", "rows", &a.rows)) != DSI_OK ||
        (r = vp(s, out, span(n, ldo, hd), "compress_pool", "out", &a.out)) != DSI_OK)
        return r;
    a.rk = rk;
    a.rs = rs;
    a.ring_rows = ring_kv->rows;
    a.ring_ld = ring_kv->ld;
    a.ldc = ldc;
    a.n = n;
    a.slots = ring_kv->slots;
    a.ratio = ratio;
    a.hd = hd;
    a.overlap = overlap ? 1 : 0;
    a.ldo = ldo;
    a.err = s->err_dev;
    k_compress_pool<<<ew_blocks((uint64_t)n * hd), EW_THREADS, 0, s->s>>>(a);
    return launched(s, "compress_pool");
}

} // namespace dsic
