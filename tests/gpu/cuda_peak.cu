/*
 * cuda_peak — the device limits the CUDA backend's speed is compared with, measured in the same
 * run as dsinfer-bench (tests/gpu/run-gpu-checks.sh; not part of the library):
 *  - copy bandwidth: cudaMemcpyAsync device→device of a 1 GiB buffer, best of 5, reported as
 *    bytes read + written per second (copy_gbs) and bytes read per second (read_gbs = half);
 *  - bf16 tensor throughput: cublasGemmEx 8192³ bf16 × bf16 → f32 accumulate, best of 5;
 *  - FP8 tensor throughput (sm_89+): cublasLtMatmul 8192³ e4m3 × e4m3 → bf16, best of 5.
 * Prints one JSON object. Build: nvcc -O2 -arch=native cuda_peak.cu -lcublasLt -lcublas.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

static float best_ms(cudaStream_t s, int reps, void (*fn)(void *), void *arg) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    fn(arg); /* warm-up */
    cudaStreamSynchronize(s);
    float best = 1e30f;
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(a, s);
        fn(arg);
        cudaEventRecord(b, s);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (ms < best) best = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

struct CopyArg {
    void *dst, *src;
    size_t bytes;
    cudaStream_t s;
};
static void do_copy(void *p) {
    CopyArg *c = static_cast<CopyArg *>(p);
    cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, c->s);
}

struct GemmArg {
    cublasHandle_t h;
    const void *A, *B;
    void *C;
    int n;
};
static void do_bf16(void *p) {
    GemmArg *g = static_cast<GemmArg *>(p);
    const float one = 1.0f, zero = 0.0f;
    cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->A, CUDA_R_16BF, g->n,
                 g->B, CUDA_R_16BF, g->n, &zero, g->C, CUDA_R_32F, g->n, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
}

struct LtArg {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    const void *A, *B;
    void *C;
    void *ws;
    size_t ws_bytes;
    cudaStream_t s;
    cublasStatus_t st;
};
static void do_fp8(void *p) {
    LtArg *g = static_cast<LtArg *>(p);
    const float one = 1.0f, zero = 0.0f;
    g->st = cublasLtMatmul(g->h, g->op, &one, g->A, g->la, g->B, g->lb, &zero, g->C, g->lc, g->C,
                           g->lc, nullptr, g->ws, g->ws_bytes, g->s);
}

int main() {
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        printf("{\"error\": \"no CUDA device\"}\n");
        return 1;
    }
    cudaSetDevice(dev);
    cudaStream_t s;
    cudaStreamCreate(&s);
    double copy_gbs = 0, bf16_tflops = 0, fp8_tflops = 0;
    const char *fp8_note = "";
    {
        CopyArg c;
        c.bytes = (size_t)1 << 30;
        c.s = s;
        if (cudaMalloc(&c.src, c.bytes) == cudaSuccess && cudaMalloc(&c.dst, c.bytes) == cudaSuccess) {
            cudaMemset(c.src, 1, c.bytes);
            float ms = best_ms(s, 5, do_copy, &c);
            copy_gbs = 2.0 * (double)c.bytes / (ms * 1e-3) / 1e9;
        }
        cudaFree(c.src);
        cudaFree(c.dst);
    }
    const int n = 8192;
    void *A = nullptr, *B = nullptr, *C = nullptr;
    cudaMalloc(&A, (size_t)n * n * 2);
    cudaMalloc(&B, (size_t)n * n * 2);
    cudaMalloc(&C, (size_t)n * n * 4);
    cudaMemset(A, 0, (size_t)n * n * 2);
    cudaMemset(B, 0, (size_t)n * n * 2);
    {
        GemmArg g;
        cublasCreate(&g.h);
        cublasSetStream(g.h, s);
        g.A = A;
        g.B = B;
        g.C = C;
        g.n = n;
        float ms = best_ms(s, 5, do_bf16, &g);
        bf16_tflops = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
        cublasDestroy(g.h);
    }
    if (prop.major * 10 + prop.minor >= 89) {
        LtArg g;
        std::memset(&g, 0, sizeof g);
        cublasLtCreate(&g.h);
        cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        cublasLtMatrixLayoutCreate(&g.la, CUDA_R_8F_E4M3, n, n, n);
        cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_8F_E4M3, n, n, n);
        cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16BF, n, n, n);
        g.A = A;
        g.B = B;
        g.C = C;
        g.ws_bytes = (size_t)64 << 20;
        cudaMalloc(&g.ws, g.ws_bytes);
        g.s = s;
        float ms = best_ms(s, 5, do_fp8, &g);
        if (g.st == CUBLAS_STATUS_SUCCESS) fp8_tflops = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
        else fp8_note = "cublasLtMatmul e4m3 failed";
        cudaFree(g.ws);
        cublasLtMatrixLayoutDestroy(g.la);
        cublasLtMatrixLayoutDestroy(g.lb);
        cublasLtMatrixLayoutDestroy(g.lc);
        cublasLtMatmulDescDestroy(g.op);
        cublasLtDestroy(g.h);
    } else {
        fp8_note = "no FP8 tensor cores before sm_89";
    }
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaError_t e = cudaDeviceSynchronize();
    printf("{\"device\": \"%s\", \"sm\": %d, \"copy_gbs\": %.1f, \"read_gbs\": %.1f, "
           "\"bf16_tflops\": %.1f, \"fp8_tflops\": %.1f, \"fp8_note\": \"%s\", \"cuda_error\": \"%s\"}\n",
           prop.name, prop.major * 10 + prop.minor, copy_gbs, copy_gbs / 2, bf16_tflops, fp8_tflops,
           fp8_note, cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
