/*
 * backends/cuda/cuda_dev.cuh — device helpers shared by the kernel files: the device error
 * word, step-row access, fixed-order block reductions, and the warp matmul core that decodes
 * weight blocks in registers (every weight type, cuda_math.h chunk_elem).
 *
 * Determinism (model-spec §10.4): every reduction here has an order that depends only on the
 * reduced length and the block size, never on the number of rows in the call, so chunked
 * prefill, whole prefill and decode agree bit for bit on one device. The module is compiled
 * with --fmad=false, so a·b + c is rounded twice as on the CPU.
 */
#ifndef DSIC_CUDA_DEV_CUH
#define DSIC_CUDA_DEV_CUH

#include "backends/cuda/cuda_impl.h"

namespace dsic {

/* Stores a device error code into the stream's mapped (pinned host) error word; sync reports
 * it. A plain store: atomics on mapped host memory are not portable over PCIe, and any one of
 * several codes stored at once is a correct report. */
__device__ __forceinline__ void derr(int *e, int code) { *(volatile int *)e = code; }

/* Row t of the step rows, validated (cuda_math.h row_ok); 0 when unusable. */
struct Row {
    int32_t pos, slot, first, count, pos0;
};
__device__ __forceinline__ int load_row(const int32_t *rows, uint32_t t, uint32_t n,
                                        uint32_t slots, Row *r) {
    if (!row_ok(rows, t, n, slots)) return 0;
    const int32_t *p = rows + 4 * (uint64_t)t;
    r->pos = p[0];
    r->slot = p[1];
    r->first = p[2];
    r->count = p[3];
    r->pos0 = rows[4 * (uint64_t)r->first];
    return 1;
}

/* Sum of one value per thread of a block of blockDim.x (a multiple of 32, <= 1024) threads,
 * in a fixed order: xor butterfly inside each warp, then warp sums added in warp order by
 * thread 0. `sh` holds 32 floats. Every thread gets the result. */
__device__ __forceinline__ float block_sum(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = v + __shfl_xor_sync(0xFFFFFFFFu, v, o);
    const unsigned w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = sh[0];
        for (unsigned i = 1; i < nw; i++) a = a + sh[i];
        sh[0] = a;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

/* Maximum (exact in any order; NaN-free inputs). */
__device__ __forceinline__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    const unsigned w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = sh[0];
        for (unsigned i = 1; i < nw; i++) a = fmaxf(a, sh[i]);
        sh[0] = a;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

/* Strided partial sums of a row in a fixed order: thread i adds elements i, i + B, i + 2B …
 * of f(j) (B = blockDim.x), then block_sum. */
template <typename F>
__device__ __forceinline__ float block_sum_fn(uint64_t len, F f, float *sh) {
    float a = 0.0f;
    for (uint64_t j = threadIdx.x; j < len; j += blockDim.x) a = a + f(j);
    return block_sum(a, sh);
}

/* ---- the warp matmul core --------------------------------------------------------------
 * One warp computes one output row for up to MM_NT input rows (tokens): the weight row is
 * streamed in chunks of MM_CHUNK elements (whole blocks of every type); lane l decodes
 * elements l + 32·j (j < 8) of each chunk and adds w·x to its accumulator per token, chunks
 * in order; the 32 lane sums are combined by a fixed xor butterfly. The order depends only on
 * K: a token's result is the same whatever the other tokens of the tile are. */
template <int32_t T>
__device__ __forceinline__ void warp_dot_row(const uint8_t *row, int64_t K, const float *const *xs,
                                             int nt, float *acc) {
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t cb = chunk_bytes(T);
    const int64_t nch = (K + MM_CHUNK - 1) / MM_CHUNK;
#pragma unroll
    for (int t = 0; t < MM_NT; t++) acc[t] = 0.0f;
    for (int64_t c = 0; c < nch; c++) {
        const uint8_t *cp = row + (uint64_t)c * cb;
        const int64_t base = c * MM_CHUNK;
#pragma unroll
        for (uint32_t j = 0; j < MM_LANE_ELEMS; j++) {
            const int64_t e = base + lane + 32 * j;
            if (e < K) {
                const float wv = chunk_elem<T>(cp, lane, j);
#pragma unroll
                for (int t = 0; t < MM_NT; t++)
                    if (t < nt) acc[t] = acc[t] + wv * __ldg(xs[t] + e);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MM_NT; t++)
        for (int o = 16; o > 0; o >>= 1) acc[t] = acc[t] + __shfl_xor_sync(0xFFFFFFFFu, acc[t], o);
}

/* Calls f.template operator()<T>() for the runtime weight type (a type_supported one). */
#define DSIC_TYPE_SWITCH(type, F)                                                  \
    switch (type) {                                                                \
    case DSI_TYPE_F32: F(DSI_TYPE_F32); break;                                     \
    case DSI_TYPE_F16: F(DSI_TYPE_F16); break;                                     \
    case DSI_TYPE_BF16: F(DSI_TYPE_BF16); break;                                   \
    case DSI_TYPE_Q8_0: F(DSI_TYPE_Q8_0); break;                                   \
    case DSI_TYPE_Q4_K: F(DSI_TYPE_Q4_K); break;                                   \
    case DSI_TYPE_Q2_K: F(DSI_TYPE_Q2_K); break;                                   \
    case DSI_TYPE_IQ2_XXS: F(DSI_TYPE_IQ2_XXS); break;                             \
    case DSI_TYPE_MXFP4: F(DSI_TYPE_MXFP4); break;                                 \
    case DSI_TYPE_FP8_E4M3_B128: F(DSI_TYPE_FP8_E4M3_B128); break;                 \
    case DSI_TYPE_FP8_E4M3_B32: case DSI_TYPE_FP8_E4M3_R32: F(DSI_TYPE_FP8_E4M3_B32); break; \
    default: break;                                                                \
    }

} // namespace dsic

#endif /* DSIC_CUDA_DEV_CUH */
