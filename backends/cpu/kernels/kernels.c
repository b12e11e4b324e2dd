/*
 * CPU matmul kernels: type table, argument checks, ISA dispatch, activation quantisation
 * scratch, threading over output rows, and the portable scalar exact path. See kernels.h
 * for the contract.
 */
#define _DEFAULT_SOURCE /* syscall() for the AMX permission */
#include "backends/cpu/kernels/kernels_impl.h"
#include "backends/cpu/kernels/kernels_ggml.h"
#include "backends/types.h"

#include "quant/quant.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DSIB_KERN_X86
#include <cpuid.h>
#endif
#if defined(DSIB_KERN_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---- type table -------------------------------------------------------------------------
 * The types with kernels: geometry from the shared table (backends/types.h), and the
 * default-path kernels (quantised activations) or NULL when the type keeps f32 activations
 * on both paths. Adding a type: one line here (kernels.h "Adding a weight type"). */

typedef struct kern_type {
    int32_t type;
    const dsib_kern_qtype *q;
} kern_type;

static const kern_type kern_types[] = {
    {DSI_TYPE_F32, NULL},
    {DSI_TYPE_F16, NULL},
    {DSI_TYPE_BF16, NULL},
    {DSI_TYPE_Q8_0, &dsib_kq_q8_0},
    {DSI_TYPE_Q4_K, &dsib_kq_q4_k},
    {DSI_TYPE_Q2_K, &dsib_kq_q2_k},
    {DSI_TYPE_MXFP4, &dsib_kq_mxfp4},
    {DSI_TYPE_FP8_E4M3_B128, NULL},
    {DSI_TYPE_FP8_E4M3_B32, NULL},
    /* ggml types of kernels_ggml*.c (ids as ggml's): their exact path; IQ2_XXS (the routed
     * experts of ds4's 2-bit files), IQ3_XXS, IQ2_XS, IQ2_S, IQ3_S, IQ1_S, IQ1_M (the
     * community's low-bit mixes), Q6_K, Q5_K, Q3_K (the llama.cpp K-quant mixes), Q4_0,
     * IQ4_NL, IQ4_XS, Q4_1, Q5_0 and Q5_1 — every ggml weight type — also have default-path
     * kernels (iq2_xxs.c, iq3_xxs.c, iq2_xs.c, iq2_s.c, iq3_s.c, iq1.c, q6_k.c, q5_k.c,
     * q3_k.c, iq4.c, q4_1_q5.c) */
    {DSI_TYPE_IQ2_XXS, &dsib_kq_iq2_xxs},
    {DSIB_TYPE_Q6_K, &dsib_kq_q6_k},
    {DSIB_TYPE_Q5_K, &dsib_kq_q5_k},
    {DSIB_TYPE_Q3_K, &dsib_kq_q3_k},
    {DSIB_TYPE_Q4_0, &dsib_kq_q4_0},
    {DSIB_TYPE_IQ4_NL, &dsib_kq_iq4_nl},
    {DSIB_TYPE_IQ4_XS, &dsib_kq_iq4_xs},
    {DSIB_TYPE_IQ3_XXS, &dsib_kq_iq3_xxs},
    {DSIB_TYPE_Q4_1, &dsib_kq_q4_1},
    {DSIB_TYPE_Q5_0, &dsib_kq_q5_0},
    {DSIB_TYPE_Q5_1, &dsib_kq_q5_1},
    {DSIB_TYPE_IQ2_XS, &dsib_kq_iq2_xs},
    {DSIB_TYPE_IQ2_S, &dsib_kq_iq2_s},
    {DSIB_TYPE_IQ3_S, &dsib_kq_iq3_s},
    {DSIB_TYPE_IQ1_S, &dsib_kq_iq1_s},
    {DSIB_TYPE_IQ1_M, &dsib_kq_iq1_m},
};

static const kern_type *kern_type_get(int32_t type) {
    for (size_t i = 0; i < sizeof kern_types / sizeof kern_types[0]; i++)
        if (kern_types[i].type == type && dsib_type_info_get(type)) return &kern_types[i];
    return NULL;
}

int dsib_kern_type_supported(int32_t type) { return kern_type_get(type) != NULL; }

int64_t dsib_kern_block_elems(int32_t type) {
    return kern_type_get(type) ? (int64_t)dsib_type_info_get(type)->blck : 0;
}

size_t dsib_kern_row_bytes(int32_t type, int64_t n_in) {
    if (!kern_type_get(type) || n_in > ((int64_t)1 << 40)) return 0;
    return (size_t)dsib_type_row_bytes(type, n_in);
}

int32_t dsib_kern_act_format(int32_t type, uint32_t flags) {
    const kern_type *t = kern_type_get(type);
    if (!t || !t->q || (flags & DSIB_MM_EXACT)) return DSIB_ACT_F32;
    return t->q->act;
}

dsi_status dsib_kern_check(int32_t type, int64_t n_in, int64_t n_out, size_t w_row_bytes,
                           int64_t x_stride, int64_t y_stride, char *msg, size_t msg_size) {
    const kern_type *t = kern_type_get(type);
    if (!t) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "cpu matmul: tensor type %d has no CPU kernel", (int)type);
        return DSI_ERR_UNSUPPORTED;
    }
    size_t rb = dsib_kern_row_bytes(type, n_in);
    if (n_in < 0 || n_out < 0 || (n_in > 0 && rb == 0)) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "cpu matmul: bad shape n_in=%lld n_out=%lld for %s",
                     (long long)n_in, (long long)n_out, dsib_type_info_get(type)->name);
        return DSI_ERR_INVALID_ARGUMENT;
    }
    if (w_row_bytes < rb || x_stride < n_in || y_stride < n_out) {
        if (msg && msg_size)
            snprintf(msg, msg_size,
                     "cpu matmul: stride too small (row bytes %zu < %zu, x stride %lld, "
                     "y stride %lld)",
                     w_row_bytes, rb, (long long)x_stride, (long long)y_stride);
        return DSI_ERR_INVALID_ARGUMENT;
    }
    return DSI_OK;
}

/* ---- scalar path ------------------------------------------------------------------------
 * Weights are decoded exactly as the SIMD paths decode them (same formulas, one rounding:
 * Q8_0 d*q; Q4_K / Q2_K (d*sc)*q - dmin*m with (d*sc)*q exact; MXFP4 / FP8 s*v), into a
 * chunk of at most 256 values; each token then accumulates into 4 lanes by element index
 * (lane = i % 4) and the lanes are summed as (l0 + l1) + (l2 + l3).                        */

#define SCALAR_CHUNK 256
/* Weight bytes a matmul task should stream at least (only speed depends on it): 32 KiB tasks
 * measured 14.3 / 25.2 GB/s (Q4_K / Q8_0, 2 threads, cold) against 16.0 / 28.1 GB/s for
 * 256 KiB — every new task restarts the hardware prefetcher's stream. */
int32_t dsib_kern_prefetch = DSIB_PREFETCH_BYTES;
int32_t dsib_kern_prefetch2 = DSIB_PREFETCH2_BYTES;
int32_t dsib_kern_rows16_gather = -1;
int32_t dsib_kern_q8_rows8 = -1;

/* 1 on AMD and Hygon cores (CPUID leaf 0's vendor string), read once. */
static int cpu_vendor_amd(void) {
    static atomic_int amd = -1;
    int v = atomic_load_explicit(&amd, memory_order_relaxed);
    if (v < 0) {
        v = 0;
#ifdef DSIB_KERN_X86
        unsigned a = 0, b = 0, c = 0, d = 0;
        char s[13] = {0};
        if (__get_cpuid(0, &a, &b, &c, &d)) {
            memcpy(s, &b, 4);
            memcpy(s + 4, &d, 4);
            memcpy(s + 8, &c, 4);
            v = !strcmp(s, "AuthenticAMD") || !strcmp(s, "HygonGenuine");
        }
#endif
        atomic_store_explicit(&amd, v, memory_order_relaxed);
    }
    return v;
}

int dsib_kern_rows16_gather_on(void) {
    const int32_t g = dsib_kern_rows16_gather;
    return g >= 0 ? g != 0 : !cpu_vendor_amd();
}

int dsib_kern_q8_rows8_on(void) {
    const int32_t r = dsib_kern_q8_rows8;
    return r >= 0 ? r != 0 : cpu_vendor_amd();
}

/* dsib_ksigns64 (kernels_impl.h), from the definition of ksigns: bit 7 is the parity of the
 * seven index bits. */
#define DSIB_KS_(i) ((uint64_t)(i) | (uint64_t)(((i) ^ (i) >> 1 ^ (i) >> 2 ^ (i) >> 3 ^ (i) >> 4 ^ (i) >> 5 ^ (i) >> 6) & 1) << 7)
#define DSIB_KSB_(i, j) ((DSIB_KS_(i) >> (j) & 1 ? UINT64_C(0xFF) : UINT64_C(0x01)) << (8 * (j)))
#define DSIB_KS64_(i)                                                                      \
    (DSIB_KSB_(i, 0) | DSIB_KSB_(i, 1) | DSIB_KSB_(i, 2) | DSIB_KSB_(i, 3) | DSIB_KSB_(i, 4) | \
     DSIB_KSB_(i, 5) | DSIB_KSB_(i, 6) | DSIB_KSB_(i, 7))
#define DSIB_KS64_4_(i) DSIB_KS64_(i), DSIB_KS64_((i) + 1), DSIB_KS64_((i) + 2), DSIB_KS64_((i) + 3)
#define DSIB_KS64_16_(i) DSIB_KS64_4_(i), DSIB_KS64_4_((i) + 4), DSIB_KS64_4_((i) + 8), DSIB_KS64_4_((i) + 12)
const uint64_t dsib_ksigns64[128] = {DSIB_KS64_16_(0),  DSIB_KS64_16_(16), DSIB_KS64_16_(32),
                                     DSIB_KS64_16_(48), DSIB_KS64_16_(64), DSIB_KS64_16_(80),
                                     DSIB_KS64_16_(96), DSIB_KS64_16_(112)};

#ifndef DSIB_TASK_BYTES
#define DSIB_TASK_BYTES 262144
#endif

/* Decodes elements [i0, i0 + n) of a row (i0 is a multiple of the block size; n is a
 * multiple of it too except at the end of an FP8 row) into `dst`. */
static void scalar_decode(int32_t type, const uint8_t *row, int64_t i0, int64_t n,
                          float *dst) {
    switch (type) {
    case DSI_TYPE_F32:
        memcpy(dst, row + 4 * i0, (size_t)n * 4);
        return;
    case DSI_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * (i0 + i), 2);
            dst[i] = dsib_f16_to_f32(h);
        }
        return;
    case DSI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * (i0 + i), 2);
            dst[i] = dsib_bf16_to_f32(h);
        }
        return;
    case DSI_TYPE_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + (size_t)(i0 / 32 + b) * 34;
            uint16_t h;
            memcpy(&h, blk, 2);
            float d = dsib_f16_to_f32(h);
            for (int j = 0; j < 32; j++) dst[32 * b + j] = d * (float)(int8_t)blk[2 + j];
        }
        return;
    case DSI_TYPE_Q4_K: {
        const uint8_t *blk = row + (size_t)(i0 / 256) * 144;
        uint16_t h;
        memcpy(&h, blk, 2);
        float d = dsib_f16_to_f32(h);
        memcpy(&h, blk + 2, 2);
        float dmin = dsib_f16_to_f32(h);
        const uint8_t *sc = blk + 4, *q = blk + 16;
        for (int c = 0; c < 4; c++) {
            uint8_t s0, m0, s1, m1;
            dsib_q4k_scale_min(2 * c, sc, &s0, &m0);
            dsib_q4k_scale_min(2 * c + 1, sc, &s1, &m1);
            float dl0 = d * (float)s0, ml0 = dmin * (float)m0;
            float dl1 = d * (float)s1, ml1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                float p0 = dl0 * (float)(q[32 * c + l] & 0xF);
                float p1 = dl1 * (float)(q[32 * c + l] >> 4);
                dst[64 * c + l] = p0 - ml0;
                dst[64 * c + 32 + l] = p1 - ml1;
            }
        }
        return;
    }
    case DSI_TYPE_Q2_K: {
        const uint8_t *blk = row + (size_t)(i0 / 256) * 84;
        uint16_t h;
        memcpy(&h, blk + 80, 2);
        float d = dsib_f16_to_f32(h);
        memcpy(&h, blk + 82, 2);
        float dmin = dsib_f16_to_f32(h);
        const uint8_t *sc = blk, *qs = blk + 16;
        int is = 0;
        for (int half = 0; half < 2; half++) {
            const uint8_t *q = qs + 32 * half;
            for (int s = 0; s < 4; s++) {
                for (int part = 0; part < 2; part++, is++) {
                    float dl = d * (float)(sc[is] & 0xF), ml = dmin * (float)(sc[is] >> 4);
                    for (int l = 0; l < 16; l++) {
                        float p = dl * (float)((q[16 * part + l] >> (2 * s)) & 3);
                        dst[128 * half + 32 * s + 16 * part + l] = p - ml;
                    }
                }
            }
        }
        return;
    }
    case DSI_TYPE_MXFP4:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + (size_t)(i0 / 32 + b) * 17;
            float s = dsib_e8m0_to_f32(blk[0]);
            for (int j = 0; j < 16; j++) {
                dst[32 * b + j] = s * dsib_e2m1_tab[blk[1 + j] & 0xF];
                dst[32 * b + 16 + j] = s * dsib_e2m1_tab[blk[1 + j] >> 4];
            }
        }
        return;
    case DSI_TYPE_FP8_E4M3_B128:
    case DSI_TYPE_FP8_E4M3_B32: {
        int64_t bs = type == DSI_TYPE_FP8_E4M3_B128 ? 128 : 32;
        for (int64_t b = 0; b * bs < n; b++) {
            const uint8_t *blk = row + (size_t)(i0 / bs + b) * (size_t)(bs + 1);
            float s = dsib_e8m0_to_f32(blk[0]);
            int64_t m = n - b * bs < bs ? n - b * bs : bs;
            for (int64_t j = 0; j < m; j++) dst[bs * b + j] = s * dsib_e4m3_to_f32(blk[1 + j]);
        }
        return;
    }
    default: {
        /* the further ggml types (kernels_ggml.c: the values of lib/quant = llama.cpp's) */
        dsib_kern_decode_ggml(type, row, i0, n, dst);
        return;
    }
    }
}

void dsib_kern_rows_scalar(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                           int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                           int n) {
    float buf[SCALAR_CHUNK];
    float acc[DSIB_KERN_GROUP][4];
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = w + (size_t)o * w_row_bytes;
        for (int t = 0; t < n; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        for (int64_t i0 = 0; i0 < n_in; i0 += SCALAR_CHUNK) {
            int64_t m = n_in - i0 < SCALAR_CHUNK ? n_in - i0 : SCALAR_CHUNK;
            scalar_decode(type, row, i0, m, buf);
            for (int t = 0; t < n; t++) {
                const float *x = xp[t] + i0;
                float a0 = acc[t][0], a1 = acc[t][1], a2 = acc[t][2], a3 = acc[t][3];
                int64_t i = 0;
                for (; i + 4 <= m; i += 4) {
                    float p0 = buf[i] * x[i], p1 = buf[i + 1] * x[i + 1];
                    float p2 = buf[i + 2] * x[i + 2], p3 = buf[i + 3] * x[i + 3];
                    a0 = a0 + p0;
                    a1 = a1 + p1;
                    a2 = a2 + p2;
                    a3 = a3 + p3;
                }
                /* i0 is a multiple of 4, so lane = i % 4 continues across chunks */
                if (i < m) { float p = buf[i] * x[i]; a0 = a0 + p; i++; }
                if (i < m) { float p = buf[i] * x[i]; a1 = a1 + p; i++; }
                if (i < m) { float p = buf[i] * x[i]; a2 = a2 + p; i++; }
                acc[t][0] = a0;
                acc[t][1] = a1;
                acc[t][2] = a2;
                acc[t][3] = a3;
            }
        }
        for (int t = 0; t < n; t++) {
            float s01 = acc[t][0] + acc[t][1], s23 = acc[t][2] + acc[t][3];
            yp[t][o] = s01 + s23;
        }
    }
}

/* ---- dispatch -------------------------------------------------------------------------- */

#ifdef DSIB_KERN_X86
/* AMX needs the CPU's AMX-TILE + AMX-INT8 (CPUID 7.0 EDX bits 24, 25) and, on Linux, the
 * process's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA:
 * granted once for the whole process, the kernel then saves the tile state of the threads
 * that use it; docs/performance.md 4.000000). Asked only when the AMX path is wanted: by the
 * process (amx_wanted) or by a test / benchmark through dsib_kern_table_for. Linux only. */
static int amx_usable(void) {
    static atomic_int state = -1;
    int v = atomic_load_explicit(&state, memory_order_acquire);
    if (v >= 0) return v;
    int ok = 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1))
        ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                     18 /* XFEATURE_XTILEDATA */) == 0;
#endif
    atomic_store_explicit(&state, ok, memory_order_release);
    return ok;
}
#endif

/* The AMX path is opt-in (DSINFER_CPU_AMX=1, read when the process's path is fixed): its
 * prefill is faster and its decode as fast as the AVX-512 path's on the machine it was
 * measured on, and its Q8_0 results are the other ISAs' (the block-sum order, q8_0.c), but
 * using it asks the kernel for tile data for the whole process (arch_prctl above), which
 * enlarges every signal frame of the host's threads: a library does not do that unasked. */
static int amx_wanted(void) {
    const char *v = getenv("DSINFER_CPU_AMX");
    return v && v[0] && strcmp(v, "0") != 0;
}

static int cpu_has_isa(int32_t isa) {
    if (isa == DSIB_ISA_SCALAR) return 1;
#ifdef DSIB_KERN_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* F16C has no __builtin_cpu_supports name in gcc 12; every AVX2 CPU ships it. */
    if (isa == DSIB_ISA_AVX2) return avx2;
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512dq");
    if (isa == DSIB_ISA_AVX512) return avx512;
    if (isa == DSIB_ISA_AVX512VNNI) return avx512 && __builtin_cpu_supports("avx512vnni");
    if (isa == DSIB_ISA_AMX) return avx512 && __builtin_cpu_supports("avx512vnni") && amx_usable();
#endif
    return 0;
}

static atomic_int kern_isa = -1;

static int32_t process_isa(void) {
    int v = atomic_load_explicit(&kern_isa, memory_order_acquire);
    if (v >= 0) return v;
    int best = DSIB_ISA_SCALAR;
    for (int32_t isa = 1; isa < DSIB_ISA_COUNT; isa++)
        if ((isa != DSIB_ISA_AMX || amx_wanted()) && cpu_has_isa(isa)) best = isa;
    int expected = -1;
    /* The first caller fixes the path; everyone agrees on the stored value. */
    atomic_compare_exchange_strong(&kern_isa, &expected, best);
    return atomic_load_explicit(&kern_isa, memory_order_acquire);
}

/* Exact path of one ISA for one call (types without SIMD exact kernels use the scalar one). */
static void exact_rows(int32_t isa, int32_t type, const uint8_t *w, size_t rb, int64_t n_in,
                       int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                       int n) {
#ifdef DSIB_KERN_X86
    if (isa >= DSIB_ISA_AVX512) {
        if (dsib_kern_rows_avx512(type, w, rb, n_in, o0, o1, xp, yp, n)) return;
    } else if (isa == DSIB_ISA_AVX2) {
        if (dsib_kern_rows_avx2(type, w, rb, n_in, o0, o1, xp, yp, n)) return;
    }
#else
    (void)isa;
#endif
    dsib_kern_rows_scalar(type, w, rb, n_in, o0, o1, xp, yp, n);
}

/* Default-path row kernel of a type for an ISA (the nearest lower ISA that has one). */
static dsib_qrows_fn qrows_for(const kern_type *kt, int32_t isa) {
    for (int32_t i = isa; i >= 0; i--)
        if (kt->q->qrows[i]) return kt->q->qrows[i];
    return NULL;
}

static dsib_act_quantize_fn quantizer_for(int32_t isa) {
#ifdef DSIB_KERN_X86
    if (isa >= DSIB_ISA_AVX512) return dsib_act_quantize_avx512;
    if (isa == DSIB_ISA_AVX2) return dsib_act_quantize_avx2;
#else
    (void)isa;
#endif
    return dsib_act_quantize_scalar;
}

/* Strided x/y → pointer arrays, DSIB_KERN_GROUP tokens at a time (exact path). */
static void rows_strided(int32_t isa, int32_t type, const void *w, size_t rb, int64_t n_in,
                         int64_t o0, int64_t o1, const float *x, int64_t x_stride, float *y,
                         int64_t y_stride, int64_t n_tok) {
    const float *xp[DSIB_KERN_GROUP];
    float *yp[DSIB_KERN_GROUP];
    for (int64_t t0 = 0; t0 < n_tok; t0 += DSIB_KERN_GROUP) {
        int n = (int)(n_tok - t0 < DSIB_KERN_GROUP ? n_tok - t0 : DSIB_KERN_GROUP);
        for (int t = 0; t < n; t++) {
            xp[t] = x + (t0 + t) * x_stride;
            yp[t] = y + (t0 + t) * y_stride;
        }
        exact_rows(isa, type, (const uint8_t *)w, rb, n_in, o0, o1, xp, yp, n);
    }
}

/* Quantised activation rows: row r at base + r * stride. */
typedef struct act_rows {
    int32_t fmt;
    int64_t n_in;
    const uint8_t *base;
    size_t stride;
} act_rows;

static dsib_qrow act_row(const act_rows *a, int64_t r) {
    return dsib_kern_act_view(a->fmt, a->base + (size_t)r * a->stride, a->n_in);
}

/* Default path from quantised rows, DSIB_KERN_GROUP tokens at a time; token t uses
 * activation row xr ? xr[t] : t and writes y + (yr ? yr[t] : t) * y_stride. */
static void qrows_strided(dsib_qrows_fn fn, const void *w, size_t rb, int64_t n_in,
                          int64_t o0, int64_t o1, const act_rows *a, const int64_t *xr,
                          float *y, int64_t y_stride, const int64_t *yr, int64_t n_tok) {
    dsib_qrow xq[DSIB_KERN_GROUP];
    float *yp[DSIB_KERN_GROUP];
    for (int64_t t0 = 0; t0 < n_tok; t0 += DSIB_KERN_GROUP) {
        int n = (int)(n_tok - t0 < DSIB_KERN_GROUP ? n_tok - t0 : DSIB_KERN_GROUP);
        for (int t = 0; t < n; t++) {
            xq[t] = act_row(a, xr ? xr[t0 + t] : t0 + t);
            yp[t] = y + (yr ? yr[t0 + t] : t0 + t) * y_stride;
        }
        fn((const uint8_t *)w, rb, n_in, o0, o1, xq, yp, n);
    }
}

/* Public per-ISA tables. */
#define MATMUL_ROWS_ISA(ISA, ID)                                                          \
    static void matmul_rows_##ISA(int32_t type, const void *w, size_t rb, int64_t n_in,  \
                                  int64_t o0, int64_t o1, const float *x, int64_t xs,    \
                                  float *y, int64_t ys, int64_t n_tok) {                 \
        rows_strided(ID, type, w, rb, n_in, o0, o1, x, xs, y, ys, n_tok);                 \
    }                                                                                     \
    static void act_quantize_##ISA(int32_t fmt, const float *x, int64_t xs, int64_t n_in, \
                                   int64_t n_tok, void *act, size_t stride) {            \
        quantizer_for(ID)(fmt, x, xs, n_in, n_tok, act, stride);                          \
    }                                                                                     \
    static void qmatmul_rows_##ISA(int32_t type, const void *w, size_t rb, int64_t n_in, \
                                   int64_t o0, int64_t o1, const void *act,              \
                                   size_t act_stride, float *y, int64_t ys,              \
                                   int64_t n_tok) {                                      \
        const kern_type *kt = kern_type_get(type);                                        \
        if (!kt || !kt->q) return;                                                        \
        act_rows a = {kt->q->act, n_in, (const uint8_t *)act, act_stride};                \
        qrows_strided(qrows_for(kt, ID), w, rb, n_in, o0, o1, &a, NULL, y, ys, NULL,     \
                      n_tok);                                                             \
    }
MATMUL_ROWS_ISA(scalar, DSIB_ISA_SCALAR)
MATMUL_ROWS_ISA(avx2, DSIB_ISA_AVX2)
MATMUL_ROWS_ISA(avx512, DSIB_ISA_AVX512)
MATMUL_ROWS_ISA(avx512vnni, DSIB_ISA_AVX512VNNI)
MATMUL_ROWS_ISA(amx, DSIB_ISA_AMX)

static const dsib_kern_table kern_tables_full[DSIB_ISA_COUNT] = {
    {DSIB_ISA_SCALAR, "scalar", matmul_rows_scalar, act_quantize_scalar, qmatmul_rows_scalar},
    {DSIB_ISA_AVX2, "avx2", matmul_rows_avx2, act_quantize_avx2, qmatmul_rows_avx2},
    {DSIB_ISA_AVX512, "avx512", matmul_rows_avx512, act_quantize_avx512, qmatmul_rows_avx512},
    {DSIB_ISA_AVX512VNNI, "avx512vnni", matmul_rows_avx512vnni, act_quantize_avx512vnni,
     qmatmul_rows_avx512vnni},
    {DSIB_ISA_AMX, "amx", matmul_rows_amx, act_quantize_amx, qmatmul_rows_amx},
};

const dsib_kern_table *dsib_kern_table_get(void) { return &kern_tables_full[process_isa()]; }
const dsib_kern_table *dsib_kern_table_for(int32_t isa) {
    if (isa < 0 || isa >= DSIB_ISA_COUNT || !cpu_has_isa(isa)) return NULL;
    return &kern_tables_full[isa];
}
const char *dsib_kern_isa_name(void) { return kern_tables_full[process_isa()].name; }

/* ---- activation scratch ------------------------------------------------------------------ */

/* One token of n_in <= ~11k elements is quantised into the caller's stack. */
#define ACT_STACK_BYTES 12288

typedef struct act_scratch {
    dsib_threadpool *pool;
    void *heap;
    _Alignas(64) uint8_t stack[ACT_STACK_BYTES];
} act_scratch;

/* 64-byte aligned scratch of `bytes` (the stack part when it fits). */
static uint8_t *scratch_get(act_scratch *s, size_t bytes) {
    s->heap = NULL;
    if (bytes <= ACT_STACK_BYTES) return s->stack;
    if (bytes > SIZE_MAX - 64) return NULL;
    s->heap = dsib_threadpool_alloc(s->pool, bytes + 64);
    if (!s->heap) return NULL;
    return (uint8_t *)(((uintptr_t)s->heap + 63) & ~(uintptr_t)63);
}

static void scratch_release(act_scratch *s) {
    dsib_threadpool_dealloc(s->pool, s->heap);
    s->heap = NULL;
}

typedef struct quant_job {
    dsib_act_quantize_fn fn;
    const act_rows *a;
    const float *x;
    int64_t xs, rows, per_task;
} quant_job;

static void quant_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const quant_job *j = arg;
    int64_t r0 = task * j->per_task, n = j->rows - r0 < j->per_task ? j->rows - r0 : j->per_task;
    j->fn(j->a->fmt, j->x + r0 * j->xs, j->xs, j->a->n_in, n,
          (uint8_t *)(uintptr_t)j->a->base + (size_t)r0 * j->a->stride, j->a->stride);
}

/* Quantises rows [0, rows) of x into `mem` (laid out by a). Several rows go over the pool. */
static void act_quantize_rows(dsib_threadpool *pool, int32_t isa, const act_rows *a,
                              const float *x, int64_t xs, int64_t rows) {
    quant_job j = {quantizer_for(isa), a, x, xs, rows, 4};
    /* a few rows (decode, a token's routed experts) cost less than waking the pool */
    if (rows <= 2 || rows * a->n_in <= 16384) {
        j.per_task = rows;
        quant_task(&j, 0, 0);
        return;
    }
    dsib_parallel_for(pool, (rows + j.per_task - 1) / j.per_task, quant_task, &j);
}

/* Lays out `rows` quantised rows of format fmt in scratch; NULL if it cannot be had. */
static int act_alloc(act_scratch *s, int32_t fmt, int64_t n_in, int64_t rows, act_rows *a) {
    a->fmt = fmt;
    a->n_in = n_in;
    a->stride = dsib_kern_act_row_bytes(fmt, n_in);
    a->base = NULL;
    if (a->stride == 0 || rows < 0 || (rows > 0 && (size_t)rows > SIZE_MAX / 2 / a->stride))
        return 0;
    a->base = scratch_get(s, a->stride * (size_t)(rows > 0 ? rows : 1));
    return a->base != NULL;
}

/* ---- threading over output rows --------------------------------------------------------- */

/* Rows per task: enough bytes for a long prefetch stream (DSIB_TASK_BYTES, >= 16 rows), few
 * enough that every thread gets several tasks (>= 4 per thread). Only affects speed. */
static int64_t rows_per_task(size_t rb, int64_t n_out, int32_t n_threads) {
    int64_t r = (int64_t)((DSIB_TASK_BYTES + rb - 1) / (rb ? rb : 1));
    if (r < 16) r = 16;
    int64_t cap = (n_out + 4 * n_threads - 1) / (4 * (int64_t)n_threads);
    if (r > cap) r = cap;
    if (r < 1) r = 1;
    return r;
}

typedef struct mm_job {
    int32_t isa;
    dsib_qrows_fn qfn; /* default path, or NULL: exact */
    int32_t type;
    const uint8_t *w;
    size_t rb;
    int64_t n_in, n_out, rows;
    const float *x;
    int64_t xs;
    act_rows act;
    float *y;
    int64_t ys, n_tok;
} mm_job;

static void mm_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const mm_job *j = arg;
    int64_t o0 = task * j->rows, o1 = o0 + j->rows;
    if (o1 > j->n_out) o1 = j->n_out;
    if (j->qfn)
        qrows_strided(j->qfn, j->w, j->rb, j->n_in, o0, o1, &j->act, NULL, j->y, j->ys, NULL,
                      j->n_tok);
    else
        rows_strided(j->isa, j->type, j->w, j->rb, j->n_in, o0, o1, j->x, j->xs, j->y, j->ys,
                     j->n_tok);
}

dsi_status dsib_matmul(dsib_threadpool *pool, uint32_t flags, int32_t type, const void *w,
                       size_t w_row_bytes, int64_t n_in, int64_t n_out, const float *x,
                       int64_t x_stride, float *y, int64_t y_stride, int64_t n_tok) {
    dsi_status st = dsib_kern_check(type, n_in, n_out, w_row_bytes, x_stride, y_stride,
                                    NULL, 0);
    if (st != DSI_OK) return st;
    if (n_tok < 0) return DSI_ERR_INVALID_ARGUMENT;
    if (n_tok == 0 || n_out == 0) return DSI_OK;
    if (!w || !x || !y) return DSI_ERR_INVALID_ARGUMENT;
    const kern_type *kt = kern_type_get(type);
    const int32_t isa = process_isa();
    mm_job j = {isa, NULL, type, w, w_row_bytes, n_in, n_out, 0, x, x_stride,
                {0, 0, NULL, 0}, y, y_stride, n_tok};
    j.rows = rows_per_task(w_row_bytes, n_out, dsib_threadpool_n_threads(pool));
    act_scratch s;
    s.pool = pool;
    s.heap = NULL;
    const int32_t fmt = dsib_kern_act_format(type, flags);
    if (fmt != DSIB_ACT_F32 && n_in > 0) {
        if (!act_alloc(&s, fmt, n_in, n_tok, &j.act)) return DSI_ERR_OUT_OF_HOST_MEMORY;
        act_quantize_rows(pool, isa, &j.act, x, x_stride, n_tok);
        j.qfn = qrows_for(kt, isa);
    }
    dsib_parallel_for(pool, (n_out + j.rows - 1) / j.rows, mm_task, &j);
    scratch_release(&s);
    return DSI_OK;
}

dsi_status dsib_matmul_expert(dsib_threadpool *pool, uint32_t flags, int32_t type,
                              const void *w_base, size_t expert_stride, int32_t expert,
                              size_t w_row_bytes, int64_t n_in, int64_t n_out,
                              const float *x, int64_t x_stride, float *y, int64_t y_stride,
                              int64_t n_tok) {
    if (expert < 0 || !w_base) return DSI_ERR_INVALID_ARGUMENT;
    if (n_out > 0 && expert_stride / (size_t)n_out < w_row_bytes)
        return DSI_ERR_INVALID_ARGUMENT;
    return dsib_matmul(pool, flags, type,
                       (const uint8_t *)w_base + (size_t)expert * expert_stride, w_row_bytes,
                       n_in, n_out, x, x_stride, y, y_stride, n_tok);
}

typedef struct moe_job {
    int32_t isa;
    dsib_qrows_fn qfn;
    const dsib_moe_matmul *m;
    int64_t rows, chunks;
    act_rows act;
} moe_job;

/* Several MoE matmuls in one parallel_for: tasks [first[i], first[i+1]) are job i's. */
typedef struct moe_multi {
    const moe_job *jobs;
    int32_t n;
    int64_t first[3];
} moe_multi;

static void moe_task_one(const moe_job *j, int64_t task);

static void moe_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const moe_multi *mm = arg;
    int32_t i = 0;
    while (i + 1 < mm->n && task >= mm->first[i + 1]) i++;
    moe_task_one(&mm->jobs[i], task - mm->first[i]);
}

static void moe_task_one(const moe_job *j, int64_t task) {
    const dsib_moe_matmul *m = j->m;
    int64_t g = task / j->chunks, c = task % j->chunks;
    int64_t s0 = m->slot_offs[g], s1 = m->slot_offs[g + 1];
    if (s1 <= s0) return;
    int64_t o0 = c * j->rows, o1 = o0 + j->rows;
    if (o1 > m->n_out) o1 = m->n_out;
    const uint8_t *w = (const uint8_t *)m->w_base + (size_t)m->experts[g] * m->expert_stride;
    if (j->qfn) {
        int64_t xr[DSIB_KERN_GROUP], yr[DSIB_KERN_GROUP];
        for (int64_t t0 = s0; t0 < s1; t0 += DSIB_KERN_GROUP) {
            int n = (int)(s1 - t0 < DSIB_KERN_GROUP ? s1 - t0 : DSIB_KERN_GROUP);
            for (int t = 0; t < n; t++) {
                xr[t] = m->x_rows ? m->x_rows[t0 + t] : t0 + t;
                yr[t] = m->y_rows ? m->y_rows[t0 + t] : t0 + t;
            }
            qrows_strided(j->qfn, w, m->w_row_bytes, m->n_in, o0, o1, &j->act, xr, m->y,
                          m->y_stride, yr, n);
        }
        return;
    }
    const float *xp[DSIB_KERN_GROUP];
    float *yp[DSIB_KERN_GROUP];
    for (int64_t t0 = s0; t0 < s1; t0 += DSIB_KERN_GROUP) {
        int n = (int)(s1 - t0 < DSIB_KERN_GROUP ? s1 - t0 : DSIB_KERN_GROUP);
        for (int t = 0; t < n; t++) {
            int64_t s = t0 + t;
            xp[t] = m->x + (m->x_rows ? m->x_rows[s] : s) * m->x_stride;
            yp[t] = m->y + (m->y_rows ? m->y_rows[s] : s) * m->y_stride;
        }
        exact_rows(j->isa, m->type, w, m->w_row_bytes, m->n_in, o0, o1, xp, yp, n);
    }
}

static dsi_status moe_check(const dsib_moe_matmul *m, char *msg, size_t msg_size) {
    if (!m) return DSI_ERR_INVALID_ARGUMENT;
    dsi_status st = dsib_kern_check(m->type, m->n_in, m->n_out, m->w_row_bytes, m->x_stride,
                                    m->y_stride, msg, msg_size);
    if (st != DSI_OK) return st;
    if (m->n_groups < 0 || (m->n_groups > 0 && (!m->experts || !m->slot_offs)) ||
        (m->n_out > 0 && m->expert_stride / (size_t)m->n_out < m->w_row_bytes)) {
        if (msg && msg_size) snprintf(msg, msg_size, "cpu moe matmul: bad arguments");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    if (m->n_groups == 0 || m->n_out == 0) return DSI_OK;
    if (m->slot_offs[0] != 0) {
        if (msg && msg_size) snprintf(msg, msg_size, "cpu moe matmul: slot_offs[0] != 0");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    for (int32_t g = 0; g < m->n_groups; g++) {
        if (m->experts[g] < 0 || m->experts[g] >= m->n_experts ||
            m->slot_offs[g + 1] < m->slot_offs[g]) {
            if (msg && msg_size)
                snprintf(msg, msg_size, "cpu moe matmul: group %d: expert %d / slots bad",
                         (int)g, (int)m->experts[g]);
            return DSI_ERR_INVALID_ARGUMENT;
        }
    }
    if (!m->w_base || !m->x || !m->y) return DSI_ERR_INVALID_ARGUMENT;
    const int64_t n_slots = m->slot_offs[m->n_groups];
    for (int64_t sl = 0; sl < n_slots && m->x_rows; sl++)
        if (m->x_rows[sl] < 0) {
            if (msg && msg_size) snprintf(msg, msg_size, "cpu moe matmul: negative x row");
            return DSI_ERR_INVALID_ARGUMENT;
        }
    return DSI_OK;
}

/* Every x row some slot of m reads: rows [0, max + 1). */
static int64_t moe_x_rows(const dsib_moe_matmul *m) {
    const int64_t n_slots = m->slot_offs[m->n_groups];
    int64_t n_rows = 0;
    for (int64_t sl = 0; sl < n_slots; sl++) {
        const int64_t r = m->x_rows ? m->x_rows[sl] : sl;
        if (r + 1 > n_rows) n_rows = r + 1;
    }
    return n_rows;
}

/* Runs ms[0 .. n) (n <= 2, all checked, non-empty) in one parallel_for; descriptors with the
 * same input rows and activation format share one quantisation. */
static dsi_status moe_run(dsib_threadpool *pool, const dsib_moe_matmul *const *ms, int32_t n,
                          char *msg, size_t msg_size) {
    moe_job jobs[2];
    moe_multi mm;
    memset(jobs, 0, sizeof jobs);
    mm.jobs = jobs;
    mm.n = n;
    mm.first[0] = 0;
    int32_t nt = dsib_threadpool_n_threads(pool);
    int64_t total_rows = 0;
    for (int32_t i = 0; i < n; i++) total_rows += ms[i]->n_out * ms[i]->n_groups;
    act_scratch s[2];
    for (int32_t i = 0; i < n; i++) {
        const dsib_moe_matmul *m = ms[i];
        moe_job *j = &jobs[i];
        j->isa = process_isa();
        j->m = m;
        /* Tasks are sized for the whole step's work, so many experts × few rows each still
         * balance over the threads. */
        j->rows = rows_per_task(m->w_row_bytes, total_rows, nt);
        if (j->rows > m->n_out) j->rows = m->n_out;
        j->chunks = (m->n_out + j->rows - 1) / j->rows;
        mm.first[i + 1] = mm.first[i] + j->chunks * m->n_groups;
        s[i].pool = pool;
        s[i].heap = NULL;
        const int32_t fmt = dsib_kern_act_format(m->type, m->flags);
        if (fmt == DSIB_ACT_F32 || m->n_in <= 0) continue;
        j->qfn = qrows_for(kern_type_get(m->type), j->isa);
        if (i > 0 && jobs[0].qfn && jobs[0].act.fmt == fmt && ms[0]->x == m->x &&
            ms[0]->x_stride == m->x_stride && ms[0]->x_rows == m->x_rows &&
            ms[0]->n_in == m->n_in && moe_x_rows(ms[0]) == moe_x_rows(m)) {
            j->act = jobs[0].act; /* the same rows, quantised once */
            continue;
        }
        const int64_t n_rows = moe_x_rows(m);
        if (!act_alloc(&s[i], fmt, m->n_in, n_rows, &j->act)) {
            for (int32_t k = 0; k <= i; k++) scratch_release(&s[k]);
            if (msg && msg_size) snprintf(msg, msg_size, "cpu moe matmul: out of memory");
            return DSI_ERR_OUT_OF_HOST_MEMORY;
        }
        act_quantize_rows(pool, j->isa, &j->act, m->x, m->x_stride, n_rows);
    }
    dsib_parallel_for(pool, mm.first[n], moe_task, &mm);
    for (int32_t i = 0; i < n; i++) scratch_release(&s[i]);
    return DSI_OK;
}

dsi_status dsib_matmul_moe(dsib_threadpool *pool, const dsib_moe_matmul *m, char *msg,
                           size_t msg_size) {
    dsi_status st = moe_check(m, msg, msg_size);
    if (st != DSI_OK) return st;
    if (m->n_groups == 0 || m->n_out == 0) return DSI_OK;
    return moe_run(pool, &m, 1, msg, msg_size);
}

dsi_status dsib_matmul_moe2(dsib_threadpool *pool, const dsib_moe_matmul *a,
                            const dsib_moe_matmul *b, char *msg, size_t msg_size) {
    dsi_status st = moe_check(a, msg, msg_size);
    if (st == DSI_OK) st = moe_check(b, msg, msg_size);
    if (st != DSI_OK) return st;
    const dsib_moe_matmul *ms[2];
    int32_t n = 0;
    if (a->n_groups > 0 && a->n_out > 0) ms[n++] = a;
    if (b->n_groups > 0 && b->n_out > 0) ms[n++] = b;
    if (n == 0) return DSI_OK;
    return moe_run(pool, ms, n, msg, msg_size);
}

/* ---- batches of independent matmuls ---------------------------------------------------- */

#define BATCH_MAX 64

typedef struct batch_job {
    int32_t isa;
    const dsib_matmul_desc *d;
    int32_t n;
    int64_t rows[BATCH_MAX];
    int64_t first[BATCH_MAX + 1]; /* first task of each descriptor */
    dsib_qrows_fn qfn[BATCH_MAX]; /* NULL: exact */
    act_rows act[BATCH_MAX];
} batch_job;

static void batch_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const batch_job *j = arg;
    int32_t lo = 0, hi = j->n - 1;
    while (lo < hi) { /* last descriptor whose first task <= task */
        int32_t mid = (lo + hi + 1) / 2;
        if (j->first[mid] <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    const dsib_matmul_desc *d = &j->d[lo];
    int64_t o0 = (task - j->first[lo]) * j->rows[lo], o1 = o0 + j->rows[lo];
    if (o1 > d->n_out) o1 = d->n_out;
    if (j->qfn[lo])
        qrows_strided(j->qfn[lo], d->w, d->w_row_bytes, d->n_in, o0, o1, &j->act[lo], NULL,
                      d->y, d->y_stride, NULL, d->n_tok);
    else
        rows_strided(j->isa, d->type, d->w, d->w_row_bytes, d->n_in, o0, o1, d->x,
                     d->x_stride, d->y, d->y_stride, d->n_tok);
}

/* Quantised activations of the descriptors of one round: descriptors with the same input
 * (x, stride, n_in, n_tok) and format share them. */
static dsi_status batch_quantize(dsib_threadpool *pool, uint32_t flags, batch_job *j,
                                 act_scratch *s) {
    size_t total = 0;
    int32_t owner[BATCH_MAX];
    for (int32_t i = 0; i < j->n; i++) {
        const dsib_matmul_desc *di = &j->d[i];
        owner[i] = -1;
        j->qfn[i] = NULL;
        const int32_t fmt = dsib_kern_act_format(di->type, flags);
        if (fmt == DSIB_ACT_F32 || di->n_tok == 0 || di->n_out == 0 || di->n_in == 0) continue;
        j->qfn[i] = qrows_for(kern_type_get(di->type), j->isa);
        j->act[i].fmt = fmt;
        j->act[i].n_in = di->n_in;
        j->act[i].stride = dsib_kern_act_row_bytes(fmt, di->n_in);
        owner[i] = i;
        for (int32_t k = 0; k < i; k++) {
            const dsib_matmul_desc *dk = &j->d[k];
            if (owner[k] == k && j->act[k].fmt == fmt && dk->x == di->x &&
                dk->x_stride == di->x_stride && dk->n_in == di->n_in && dk->n_tok == di->n_tok) {
                owner[i] = k;
                break;
            }
        }
        if (owner[i] == i) {
            if ((size_t)di->n_tok > (SIZE_MAX / 4 - total) / j->act[i].stride)
                return DSI_ERR_OUT_OF_HOST_MEMORY;
            total += j->act[i].stride * (size_t)di->n_tok;
        }
    }
    if (total == 0) return DSI_OK;
    uint8_t *mem = scratch_get(s, total);
    if (!mem) return DSI_ERR_OUT_OF_HOST_MEMORY;
    size_t off = 0;
    for (int32_t i = 0; i < j->n; i++) {
        if (owner[i] != i) continue;
        j->act[i].base = mem + off;
        off += j->act[i].stride * (size_t)j->d[i].n_tok;
        act_quantize_rows(pool, j->isa, &j->act[i], j->d[i].x, j->d[i].x_stride, j->d[i].n_tok);
    }
    for (int32_t i = 0; i < j->n; i++)
        if (owner[i] >= 0 && owner[i] != i) j->act[i] = j->act[owner[i]];
    return DSI_OK;
}

dsi_status dsib_matmul_batch(dsib_threadpool *pool, uint32_t flags, const dsib_matmul_desc *d,
                             int32_t n, char *msg, size_t msg_size) {
    if (n < 0 || (n > 0 && !d)) {
        if (msg && msg_size) snprintf(msg, msg_size, "cpu matmul batch: bad descriptor list");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    for (int32_t i = 0; i < n; i++) {
        dsi_status st = dsib_kern_check(d[i].type, d[i].n_in, d[i].n_out, d[i].w_row_bytes,
                                        d[i].x_stride, d[i].y_stride, msg, msg_size);
        if (st != DSI_OK) return st;
        if (d[i].n_tok < 0 || (d[i].n_tok > 0 && d[i].n_out > 0 && (!d[i].w || !d[i].x || !d[i].y))) {
            if (msg && msg_size) snprintf(msg, msg_size, "cpu matmul batch: descriptor %d", (int)i);
            return DSI_ERR_INVALID_ARGUMENT;
        }
    }
    batch_job *j = dsib_threadpool_alloc(pool, sizeof *j);
    if (!j) {
        if (msg && msg_size) snprintf(msg, msg_size, "cpu matmul batch: out of memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    j->isa = process_isa();
    int32_t nt = dsib_threadpool_n_threads(pool);
    dsi_status st = DSI_OK;
    for (int32_t b0 = 0; b0 < n && st == DSI_OK; b0 += BATCH_MAX) {
        j->d = d + b0;
        j->n = n - b0 < BATCH_MAX ? n - b0 : BATCH_MAX;
        int64_t total_out = 0;
        for (int32_t i = 0; i < j->n; i++)
            if (j->d[i].n_tok > 0) total_out += j->d[i].n_out;
        j->first[0] = 0;
        for (int32_t i = 0; i < j->n; i++) {
            const dsib_matmul_desc *di = &j->d[i];
            int64_t tasks = 0;
            j->rows[i] = 1;
            if (di->n_tok > 0 && di->n_out > 0) {
                j->rows[i] = rows_per_task(di->w_row_bytes, total_out, nt);
                if (j->rows[i] > di->n_out) j->rows[i] = di->n_out;
                tasks = (di->n_out + j->rows[i] - 1) / j->rows[i];
            }
            j->first[i + 1] = j->first[i] + tasks;
        }
        act_scratch s;
        s.pool = pool;
        s.heap = NULL;
        st = batch_quantize(pool, flags, j, &s);
        if (st == DSI_OK && j->first[j->n] > 0)
            dsib_parallel_for(pool, j->first[j->n], batch_task, j);
        scratch_release(&s);
        if (st != DSI_OK && msg && msg_size)
            snprintf(msg, msg_size, "cpu matmul batch: out of memory");
    }
    dsib_threadpool_dealloc(pool, j);
    return st;
}
