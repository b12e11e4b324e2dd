/*
 * backends/cuda/fakequant.cu — fake_quant (model-spec §10.1) and the normalised Walsh–Hadamard
 * transform. Both are exact: the same f32 operations as backends/cpu/ops.c per element
 * (cuda_math.h fq_scale / fq_elem; the Hadamard butterflies in the CPU's stage order), so
 * the CUDA and CPU results agree bit for bit.
 */
#include "backends/cuda/cuda_dev.cuh"

namespace dsic {
namespace {

/* One thread per (row, block). */
__global__ void k_fake_quant(float *x, uint64_t ldx, uint32_t rows, uint32_t col0, uint32_t nblk,
                             uint32_t block, int32_t recipe, int round) {
    for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x, nb = (uint64_t)rows * nblk;
         b < nb; b += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = b / nblk, c = b % nblk;
        float *v = x + r * ldx + col0 + c * block;
        float amax = 0.0f;
        for (uint32_t i = 0; i < block; i++) {
            const float a = fabsf(v[i]);
            if (a > amax) amax = a;
        }
        float s, lim;
        fq_scale(amax, recipe, &s, &lim);
        for (uint32_t i = 0; i < block; i++) v[i] = fq_elem(v[i], s, lim, recipe, round);
    }
}

/* One block per (row, chunk); the chunk in shared memory. */
__global__ void k_hadamard(float *x, uint64_t ldx, uint32_t chunks, uint32_t size, float sc) {
    extern __shared__ float v[];
    const uint64_t r = blockIdx.x / chunks, c = blockIdx.x % chunks;
    float *p = x + r * ldx + c * size;
    for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) v[i] = p[i];
    __syncthreads();
    for (uint32_t h = 1; h < size; h <<= 1) {
        for (uint32_t q = threadIdx.x; q < size / 2; q += blockDim.x) {
            const uint32_t i = (q / h) * 2 * h + (q % h), j = i + h;
            const float a = v[i], b = v[j];
            v[i] = a + b;
            v[j] = a - b;
        }
        __syncthreads();
    }
    for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) p[i] = v[i] * sc;
}

} // namespace

dsi_status op_fake_quant(dsib_stream *st, dsib_view x, uint32_t ldx, uint32_t rows, uint32_t col0,
                         uint32_t ncols, uint32_t block, int32_t recipe, uint32_t flags) {
    Stream *s = S(st);
    if (block == 0 || ncols % block || recipe < DSIB_FQ_E4M3_UE8M0 || recipe > DSIB_FQ_E2M1_E4M3)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: fake_quant: bad block %u / recipe %d", block,
                    (int)recipe);
    if (rows == 0 || ncols == 0) return DSI_OK;
    float *xp;
    dsi_status r = vp(s, x, span(rows, ldx, (uint64_t)col0 + ncols), "fake_quant", "x", &xp);
    if (r != DSI_OK) return r;
    const uint32_t nblk = ncols / block;
    k_fake_quant<<<ew_blocks((uint64_t)rows * nblk), EW_THREADS, 0, s->s>>>(
        xp, ldx, rows, col0, nblk, block, recipe, !(flags & DSIB_FQ_NO_ROUND));
    return launched(s, "fake_quant");
}

dsi_status op_hadamard(dsib_stream *st, dsib_view x, uint32_t ldx, uint32_t rows, uint32_t chunks,
                       uint32_t size) {
    Stream *s = S(st);
    if (size == 0 || (size & (size - 1)) || size > 8192)
        return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: hadamard: size %u (a power of two <= 8192)", size);
    if (rows == 0 || chunks == 0) return DSI_OK;
    float *xp;
    dsi_status r = vp(s, x, span(rows, ldx, (uint64_t)chunks * size), "hadamard", "x", &xp);
    if (r != DSI_OK) return r;
    const uint64_t blocks = (uint64_t)rows * chunks;
    if (blocks > 0x7FFFFFFFull) return fail(s, DSI_ERR_INVALID_ARGUMENT, "cuda: hadamard: too many chunks");
    const float sc = 1.0f / sqrtf((float)size); /* as the CPU: host sqrtf, f32 division */
    const uint32_t th = size / 2 < 256 ? (size / 2 < 32 ? 32 : size / 2) : 256;
    k_hadamard<<<(unsigned)blocks, th, size * sizeof(float), s->s>>>(xp, ldx, chunks, size, sc);
    return launched(s, "hadamard");
}

} // namespace dsic
