/*
 * backends/cuda/attention.cu — sink attention (model-spec §3.4) and the indexers (§3.4, §4.3,
 * §10.2).
 *
 * attn_sink: one block per (row, head). The visible rows are enumerated in the canonical
 * order (selected compressed rows ascending, then the window ascending); each score is one
 * thread's dot product in the CPU's 8-lane order (cuda_math.h dot8); the maximum is exact in
 * any order; then, chunk by chunk, thread 0 adds the exponentials to the denominator in row
 * order and thread k adds e·v[k] in row order — the CPU's sequence of operations.
 *
 * indexer_topk / indexer_topk_v41: one block per row; scores into the stream workspace (one
 * thread per compressed row, the CPU's dot order: 8 lanes for V4, index order for V4.1), then
 * an exact block top-k: a radix select on order-preserving keys finds the k-th best score,
 * ties go to the lowest positions, and a block scan writes the selection in ascending order.
 * Index outputs therefore equal the CPU's whenever the scores do.
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

/* ---- block scan and exact top-k --------------------------------------------------------- */

struct TopkShared {
    uint32_t hist[256];
    int32_t scan[33];
    uint32_t prefix, mask, need, cnt;
};

/* Exclusive prefix sum of one int per thread (thread order); *total = the block's sum. */
__device__ __forceinline__ int32_t block_excl_scan(int32_t v, TopkShared &sh, int32_t *total) {
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int32_t x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if ((int)lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh.scan[w] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t a = 0;
        for (uint32_t i = 0; i < nw; i++) {
            const int32_t s = sh.scan[i];
            sh.scan[i] = a;
            a += s;
        }
        sh.scan[32] = a;
    }
    __syncthreads();
    const int32_t r = x - v + sh.scan[w];
    *total = sh.scan[32];
    __syncthreads();
    return r;
}

/* out[0:k] = the min(k, eligible) best of keys[0:m] (key 0: not eligible; higher key first,
 * ties: lower index first) in ascending index order, then −1. */
__device__ void block_topk(const uint32_t *keys, uint32_t m, uint32_t k, int32_t *out,
                           TopkShared &sh) {
    if (threadIdx.x == 0) sh.cnt = 0;
    __syncthreads();
    uint32_t mine = 0;
    for (uint32_t c = threadIdx.x; c < m; c += blockDim.x) mine += keys[c] != 0;
    atomicAdd(&sh.cnt, mine);
    __syncthreads();
    const uint32_t kk = sh.cnt < k ? sh.cnt : k;
    for (uint32_t i = kk + threadIdx.x; i < k; i += blockDim.x) out[i] = -1;
    if (kk == 0) return;
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.mask = 0;
        sh.need = kk;
    }
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint32_t b = threadIdx.x; b < 256; b += blockDim.x) sh.hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = sh.prefix, mask = sh.mask;
        for (uint32_t c = threadIdx.x; c < m; c += blockDim.x) {
            const uint32_t key = keys[c];
            if (key != 0 && (key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t cum = 0, need = sh.need;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + sh.hist[b] >= need) break;
                cum += sh.hist[b];
            }
            sh.need = need - cum;
            sh.prefix = prefix | ((uint32_t)b << shift);
            sh.mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const uint32_t T = sh.prefix;
    const int32_t need = (int32_t)sh.need;
    int32_t base_sel = 0, base_eq = 0;
    for (uint32_t c0 = 0; c0 < m; c0 += blockDim.x) {
        const uint32_t c = c0 + threadIdx.x;
        const uint32_t key = c < m ? keys[c] : 0u;
        const int32_t gt = key != 0 && key > T, eq = key != 0 && key == T;
        int32_t teq, tsel;
        const int32_t req = base_eq + block_excl_scan(eq, sh, &teq);
        const int32_t sel = gt || (eq && req < need);
        const int32_t pos = base_sel + block_excl_scan(sel, sh, &tsel);
        if (sel) out[pos] = (int32_t)c;
        base_eq += teq;
        base_sel += tsel;
    }
}

/* ---- indexers ---------------------------------------------------------------------------- */

struct IdxArgs {
    const float *q, *w;
    uint64_t ldq, ldw;
    const float *keys;           /* slot 0 row 0 */
    uint32_t krows, kld, slots;
    uint32_t heads, hd;
    const int32_t *rows;
    uint32_t n, t0, ratio, topk;
    int32_t *idx;
    const int32_t *cand_in;
    int32_t *cand_out;
    uint32_t cand_block, cand_k;
    float *scores;               /* workspace [idx_rows][P] */
    uint32_t *skeys;             /* workspace [idx_rows][P] */
    uint32_t P;
    int *err;
};

template <bool V41>
__global__ void __launch_bounds__(RED_THREADS) k_indexer(IdxArgs a) {
    __shared__ TopkShared sh;
    const uint32_t t = a.t0 + blockIdx.x;
    int32_t *out = a.idx + (uint64_t)t * a.topk;
    int32_t *cout = V41 && a.cand_out ? a.cand_out + (uint64_t)t * a.cand_k : nullptr;
    for (uint32_t i = threadIdx.x; i < a.topk; i += blockDim.x) out[i] = -1;
    if (cout)
        for (uint32_t i = threadIdx.x; i < a.cand_k; i += blockDim.x) cout[i] = -1;
    Row r;
    if (!load_row(a.rows, t, a.n, a.slots, &r)) {
        if (threadIdx.x == 0) derr(a.err, DERR_ARG);
        return;
    }
    const uint32_t nvis = (uint32_t)(((int64_t)r.pos + 1) / a.ratio);
    __syncthreads();
    if (nvis == 0) return;
    if (nvis > a.krows || nvis > a.P) {
        if (threadIdx.x == 0) derr(a.err, DERR_ARG);
        return;
    }
    if (!V41 && nvis <= a.topk) {
        for (uint32_t i = threadIdx.x; i < nvis; i += blockDim.x) out[i] = (int32_t)i;
        return;
    }
    float *sc = a.scores + (uint64_t)blockIdx.x * a.P;
    uint32_t *ky = a.skeys + (uint64_t)blockIdx.x * a.P;
    const float *q = a.q + (uint64_t)t * a.ldq, *wt = a.w + (uint64_t)t * a.ldw;
    const float *kb = a.keys + (uint64_t)r.slot * a.krows * a.kld;
    for (uint32_t c = threadIdx.x; c < nvis; c += blockDim.x) {
        const float *k = kb + (uint64_t)c * a.kld;
        float s = 0.0f;
        for (uint32_t h = 0; h < a.heads; h++) {
            const float *qh = q + (uint64_t)h * a.hd;
            float d;
            if (V41) {
                d = 0.0f;
                for (uint32_t i = 0; i < a.hd; i++) d = d + qh[i] * k[i];
                s = s + (d > 0.0f ? d : 0.0f) * wt[h];
            } else {
                d = dot8(qh, k, a.hd);
                if (d < 0.0f) d = 0.0f;
                s = s + d * wt[h];
            }
        }
        sc[c] = s;
    }
    __syncthreads();
    if (V41 && cout) {
        const uint32_t cb = a.cand_block, nb = (nvis + cb - 1) / cb;
        for (uint32_t b = threadIdx.x; b < nb; b += blockDim.x) {
            float m = -INFINITY;
            const uint32_t end = (b + 1) * cb < nvis ? (b + 1) * cb : nvis;
            for (uint32_t c = b * cb; c < end; c++) m = sc[c] > m ? sc[c] : m;
            if (b == nb - 1) m = INFINITY;
            ky[b] = m > -INFINITY ? score_key(m) : 0u;
        }
        __syncthreads();
        block_topk(ky, nb, a.cand_k, cout, sh);
        __syncthreads();
    }
    const int32_t *cin = V41 && a.cand_in ? a.cand_in + (uint64_t)t * a.cand_k : nullptr;
    for (uint32_t c = threadIdx.x; c < nvis; c += blockDim.x) {
        int ok = 1;
        if (cin) {
            const int32_t b = (int32_t)(c / a.cand_block);
            ok = 0;
            for (uint32_t j = 0; j < a.cand_k && cin[j] >= 0; j++)
                if (cin[j] == b) {
                    ok = 1;
                    break;
                }
        }
        ky[c] = ok ? score_key(sc[c]) : 0u;
    }
    __syncthreads();
    block_topk(ky, nvis, a.topk, out, sh);
}

dsi_status run_indexer(Stream *s, const char *op, bool v41, dsib_view q, uint32_t ldq, dsib_view w,
                       uint32_t ldw, const dsib_state *keys, uint32_t heads, uint32_t hd,
                       dsib_view rows, uint32_t n, uint32_t ratio, uint32_t topk, dsib_view idx,
                       dsib_view cand_in, dsib_view cand_out, uint32_t cand_block, uint32_t cand_k) {
    if (n == 0) return DSI_OK;
    const bool cand = v41 && (cand_in.buf || cand_out.buf);
    if (ratio == 0 || topk == 0 || (cand && (cand_block == 0 || cand_k == 0)))
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: ratio %u, topk %u, cand_block %u, cand_k %u",
                    op, ratio, topk, cand_block, cand_k);
    IdxArgs a;
    std::memset(&a, 0, sizeof a);
    float *kp;
    dsi_status r = sptr(s, keys, hd, op, "keys", &kp);
    if (r == DSI_OK) r = vp(s, q, span(n, ldq, (uint64_t)heads * hd), op, "q", &a.q);
    if (r == DSI_OK) r = vp(s, w, span(n, ldw, heads), op, "w", &a.w);
    if (r == DSI_OK) r = vp(s, rows, 16ull * n, op, "rows", &a.rows);
    if (r == DSI_OK) r = vp(s, idx, 4ull * n * topk, op, "idx", &a.idx);
    if (r == DSI_OK && cand && cand_in.buf) r = vp(s, cand_in, 4ull * n * cand_k, op, "cand_in", &a.cand_in);
    if (r == DSI_OK && cand && cand_out.buf) r = vp(s, cand_out, 4ull * n * cand_k, op, "cand_out", &a.cand_out);
    if (r != DSI_OK) return r;
    const WsPlan plan = ws_plan(&s->desc);
    a.keys = kp;
    a.krows = keys->rows;
    a.kld = keys->ld;
    a.slots = keys->slots;
    a.ldq = ldq;
    a.ldw = ldw;
    a.heads = heads;
    a.hd = hd;
    a.n = n;
    a.ratio = ratio;
    a.topk = topk;
    a.cand_block = cand_block;
    a.cand_k = cand ? cand_k : 0;
    a.P = s->desc.max_positions ? s->desc.max_positions : 1;
    a.scores = reinterpret_cast<float *>(s->ws + plan.idx_scores);
    a.skeys = reinterpret_cast<uint32_t *>(s->ws + plan.idx_keys);
    a.err = s->err_dev;
    if (plan.idx_bytes > s->ws_size)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: %s: workspace too small", op);
    for (uint32_t t0 = 0; t0 < n; t0 += plan.idx_rows) {
        a.t0 = t0;
        const uint32_t nb = n - t0 < plan.idx_rows ? n - t0 : plan.idx_rows;
        if (v41) k_indexer<true><<<nb, RED_THREADS, 0, s->s>>>(a);
        else k_indexer<false><<<nb, RED_THREADS, 0, s->s>>>(a);
        r = launched(s, op);
        if (r != DSI_OK) return r;
    }
    return DSI_OK;
}

/* ---- sink attention -------------------------------------------------------------------- */

enum { ATT_MAX_HD = 512, ATT_PER_THREAD = ATT_MAX_HD / ATT_THREADS };

struct AttnArgs {
    const float *q;
    uint64_t ldq;
    uint32_t H, hd;
    const int32_t *rows;
    uint32_t n, window;
    const float *ring;
    uint32_t ring_rows, ring_ld, slots;
    const float *kv;
    uint64_t ldkv;
    uint32_t comp_ratio;
    const float *comp;
    uint32_t comp_rows, comp_ld;
    const int32_t *idx;
    uint32_t topk;
    int32_t sink_type;
    const uint8_t *sinks;
    float scale;
    float *out;
    uint64_t ldo;
    int *err;
};

/* Visible row i of (row r, with nc compressed entries first, then the window from w0), or
 * NULL for an empty (−1) index entry; *bad set for an entry outside the state. */
__device__ __forceinline__ const float *vis_row(const AttnArgs &a, const Row &r, uint32_t t,
                                                int64_t i, int64_t nc, int64_t w0, int *bad) {
    if (i < nc) {
        int64_t c = i;
        if (a.idx) {
            c = a.idx[(uint64_t)t * a.topk + (uint64_t)i];
            if (c < 0) return nullptr;
        }
        if (c >= (int64_t)a.comp_rows) {
            *bad = 1;
            return nullptr;
        }
        return a.comp + ((uint64_t)r.slot * a.comp_rows + (uint64_t)c) * a.comp_ld;
    }
    const int64_t qp = w0 + (i - nc);
    if (qp < r.pos0) return a.ring + ((uint64_t)r.slot * a.ring_rows + (uint64_t)qp % a.ring_rows) * a.ring_ld;
    return a.kv + (uint64_t)(r.first + (qp - r.pos0)) * a.ldkv;
}

__global__ void __launch_bounds__(ATT_THREADS) k_attn_sink(AttnArgs a) {
    __shared__ float sh[32];
    __shared__ float es[ATT_CHUNK];
    __shared__ const float *ps[ATT_CHUNK];
    __shared__ float den_s;
    const uint32_t t = blockIdx.x / a.H, h = blockIdx.x % a.H;
    float *o = a.out + (uint64_t)t * a.ldo + (uint64_t)h * a.hd;
    Row r;
    if (!load_row(a.rows, t, a.n, a.slots, &r)) {
        if (threadIdx.x == 0) derr(a.err, DERR_ARG);
        return;
    }
    const int64_t p = r.pos;
    int64_t nc = 0;
    if (a.comp_ratio > 0) nc = a.idx ? (int64_t)a.topk : (p + 1) / a.comp_ratio;
    int64_t w0 = p - (int64_t)a.window + 1;
    if (w0 < 0) w0 = 0;
    const int64_t nr = nc + (p - w0 + 1);
    const float *q = a.q + (uint64_t)t * a.ldq + (uint64_t)h * a.hd;
    const float sink = dq_elem(a.sink_type, a.sinks, h);
    int bad = 0;
    /* pass 1: the maximum */
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < nr; i += blockDim.x) {
        const float *row = vis_row(a, r, t, i, nc, w0, &bad);
        if (!row) continue;
        const float d = dot8(q, row, a.hd) * a.scale;
        m = d > m ? d : m;
    }
    m = block_max(m, sh);
    m = sink > m ? sink : m;
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) derr(a.err, DERR_ARG);
        for (uint32_t k = threadIdx.x; k < a.hd; k += blockDim.x) o[k] = 0.0f;
        return;
    }
    /* pass 2: Σ e and Σ e·v in row order */
    float acc[ATT_PER_THREAD];
#pragma unroll
    for (int j = 0; j < ATT_PER_THREAD; j++) acc[j] = 0.0f;
    if (threadIdx.x == 0) den_s = expf(sink - m);
    for (int64_t c0 = 0; c0 < nr; c0 += ATT_CHUNK) {
        const int64_t i = c0 + threadIdx.x;
        const float *row = i < nr ? vis_row(a, r, t, i, nc, w0, &bad) : nullptr;
        es[threadIdx.x] = row ? expf(dot8(q, row, a.hd) * a.scale - m) : 0.0f;
        ps[threadIdx.x] = row;
        __syncthreads();
        const int64_t cn = nr - c0 < ATT_CHUNK ? nr - c0 : ATT_CHUNK;
        if (threadIdx.x == 0) {
            float d = den_s;
            for (int64_t j = 0; j < cn; j++)
                if (ps[j]) d = d + es[j];
            den_s = d;
        }
#pragma unroll
        for (int j = 0; j < ATT_PER_THREAD; j++) {
            const uint32_t k = threadIdx.x + j * ATT_THREADS;
            if (k < a.hd) {
                float v = acc[j];
                for (int64_t e = 0; e < cn; e++)
                    if (ps[e]) v = v + es[e] * ps[e][k];
                acc[j] = v;
            }
        }
        __syncthreads();
    }
    const float den = den_s;
#pragma unroll
    for (int j = 0; j < ATT_PER_THREAD; j++) {
        const uint32_t k = threadIdx.x + j * ATT_THREADS;
        if (k < a.hd) o[k] = acc[j] / den;
    }
}

} // namespace

dsi_status op_indexer_topk(dsib_stream *st, dsib_view q, uint32_t ldq, dsib_view w, uint32_t ldw,
                           const dsib_state *keys, uint32_t heads, uint32_t hd, dsib_view rows,
                           uint32_t n, uint32_t ratio, uint32_t topk, dsib_view idx) {
    dsib_view none = {nullptr, 0};
    return run_indexer(S(st), "indexer_topk", false, q, ldq, w, ldw, keys, heads, hd, rows, n, ratio,
                       topk, idx, none, none, 0, 0);
}

dsi_status op_indexer_topk_v41(dsib_stream *st, dsib_view q, uint32_t ldq, dsib_view w,
                               uint32_t ldw, const dsib_state *keys, uint32_t heads, uint32_t hd,
                               dsib_view rows, uint32_t n, uint32_t ratio, uint32_t topk,
                               dsib_view idx, dsib_view cand_in, dsib_view cand_out,
                               uint32_t cand_block, uint32_t cand_k) {
    return run_indexer(S(st), "indexer_topk_v41", true, q, ldq, w, ldw, keys, heads, hd, rows, n,
                       ratio, topk, idx, cand_in, cand_out, cand_block, cand_k);
}

dsi_status op_attn_sink(dsib_stream *st, dsib_view q, uint32_t ldq, uint32_t H, uint32_t hd,
                        dsib_view rows, uint32_t n, uint32_t window, const dsib_state *ring,
                        dsib_view kv, uint32_t ldkv, uint32_t comp_ratio, const dsib_state *comp,
                        dsib_view idx, uint32_t topk, const dsib_weight *sinks, float scale,
                        dsib_view out, uint32_t ldo) {
    Stream *s = S(st);
    if (n == 0 || H == 0) return DSI_OK;
    if (hd == 0 || hd > ATT_MAX_HD)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: attn_sink: head dim %u (at most %u)", hd,
                    (unsigned)ATT_MAX_HD);
    AttnArgs a;
    std::memset(&a, 0, sizeof a);
    float *rp, *cp = nullptr;
    dsi_status r = sptr(s, ring, hd, "attn_sink", "ring", &rp);
    if (r == DSI_OK && ring->rows < window)
        r = fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: attn_sink: ring of %u rows < window %u", ring->rows, window);
    if (r == DSI_OK && comp_ratio) {
        r = sptr(s, comp, hd, "attn_sink", "comp", &cp);
        if (r == DSI_OK && comp->slots != ring->slots)
            r = fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: attn_sink: comp and ring slots differ");
    }
    if (r == DSI_OK) r = vp(s, q, span(n, ldq, (uint64_t)H * hd), "attn_sink", "q", &a.q);
    if (r == DSI_OK) r = vp(s, rows, 16ull * n, "attn_sink", "rows", &a.rows);
    if (r == DSI_OK) r = vp(s, kv, span(n, ldkv, hd), "attn_sink", "kv", &a.kv);
    if (r == DSI_OK && comp_ratio && idx.buf) r = vp(s, idx, 4ull * n * topk, "attn_sink", "idx", &a.idx);
    if (r == DSI_OK) r = wptr(s, sinks, "attn_sink", "sinks", &a.sinks);
    if (r == DSI_OK && welems(sinks) < (int64_t)H)
        r = fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: attn_sink: %lld sinks for %u heads",
                 (long long)sinks->ne[0], H);
    if (r == DSI_OK) r = vp(s, out, span(n, ldo, (uint64_t)H * hd), "attn_sink", "out", &a.out);
    if (r != DSI_OK) return r;
    if ((uint64_t)n * H > 0x7FFFFFFFull) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: attn_sink: too many rows");
    a.ldq = ldq;
    a.H = H;
    a.hd = hd;
    a.n = n;
    a.window = window;
    a.ring = rp;
    a.ring_rows = ring->rows;
    a.ring_ld = ring->ld;
    a.slots = ring->slots;
    a.ldkv = ldkv;
    a.comp_ratio = comp_ratio;
    a.comp = cp;
    a.comp_rows = comp_ratio ? comp->rows : 0;
    a.comp_ld = comp_ratio ? comp->ld : 0;
    a.topk = topk;
    a.sink_type = sinks->type;
    a.scale = scale;
    a.ldo = ldo;
    a.err = s->err_dev;
    k_attn_sink<<<n * H, ATT_THREADS, 0, s->s>>>(a);
    return launched(s, "attn_sink");
}

} // namespace dsic
