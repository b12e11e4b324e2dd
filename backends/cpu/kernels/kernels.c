/*
 * CPU matmul kernels: type table, argument checks, ISA dispatch, threading over output
 * rows, and the portable scalar path. See kernels.h for the contract.
 */
#include "backends/cpu/kernels/kernels_impl.h"
#include "backends/cpu/kernels/kernels_ggml.h"
#include "backends/types.h"

#include <stdatomic.h>
#include <stdio.h>

/* ---- type geometry --------------------------------------------------------------------- */

/* Geometry from the shared table (backends/types.h); this list says which types have kernels. */
static const int32_t kern_types[] = {
    DSI_TYPE_F32,  DSI_TYPE_F16,   DSI_TYPE_BF16,          DSI_TYPE_Q8_0,        DSI_TYPE_Q4_K,
    DSI_TYPE_Q2_K, DSI_TYPE_MXFP4, DSI_TYPE_FP8_E4M3_B128, DSI_TYPE_FP8_E4M3_B32,
    /* ggml types of kernels_ggml*.c (ids as ggml's) */
    2, 3, 6, 7, 11, 13, 14, 20, 23, 18, 21, 16, 17, 22, 19, 29,
};

static const dsib_type_info *kern_type_get(int32_t type) {
    for (size_t i = 0; i < sizeof kern_types / sizeof kern_types[0]; i++)
        if (kern_types[i] == type) return dsib_type_info_get(type);
    return NULL;
}

int dsib_kern_type_supported(int32_t type) { return kern_type_get(type) != NULL; }

int64_t dsib_kern_block_elems(int32_t type) {
    const dsib_type_info *t = kern_type_get(type);
    return t ? (int64_t)t->blck : 0;
}

size_t dsib_kern_row_bytes(int32_t type, int64_t n_in) {
    if (!kern_type_get(type) || n_in > ((int64_t)1 << 40)) return 0;
    return (size_t)dsib_type_row_bytes(type, n_in);
}

static const char *type_name(int32_t type) {
    const dsib_type_info *t = kern_type_get(type);
    return t ? t->name : "unknown";
}

dsi_status dsib_kern_check(int32_t type, int64_t n_in, int64_t n_out, size_t w_row_bytes,
                           int64_t x_stride, int64_t y_stride, char *msg, size_t msg_size) {
    const dsib_type_info *t = kern_type_get(type);
    if (!t) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "cpu matmul: tensor type %d has no CPU kernel", (int)type);
        return DSI_ERR_UNSUPPORTED;
    }
    size_t rb = dsib_kern_row_bytes(type, n_in);
    if (n_in < 0 || n_out < 0 || (n_in > 0 && rb == 0)) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "cpu matmul: bad shape n_in=%lld n_out=%lld for %s",
                     (long long)n_in, (long long)n_out, type_name(type));
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
    default:
        dsib_kern_decode_ggml(type, row, i0, n, dst);
        return;
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

static dsib_rows_ptr_fn rows_fn_for(int32_t isa) {
    switch (isa) {
    case DSIB_ISA_SCALAR: return dsib_kern_rows_scalar;
#ifdef DSIB_KERN_X86
    case DSIB_ISA_AVX2: return dsib_kern_rows_avx2;
    case DSIB_ISA_AVX512: return dsib_kern_rows_avx512;
#endif
    default: return NULL;
    }
}

static int cpu_has_isa(int32_t isa) {
    if (isa == DSIB_ISA_SCALAR) return 1;
#ifdef DSIB_KERN_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* F16C has no __builtin_cpu_supports name in gcc 12; every AVX2 CPU ships it. */
    if (isa == DSIB_ISA_AVX2) return avx2;
    if (isa == DSIB_ISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
#endif
    return 0;
}

static atomic_int kern_isa = -1;

static int32_t process_isa(void) {
    int v = atomic_load_explicit(&kern_isa, memory_order_acquire);
    if (v >= 0) return v;
    int best = DSIB_ISA_SCALAR;
    if (cpu_has_isa(DSIB_ISA_AVX2)) best = DSIB_ISA_AVX2;
    if (cpu_has_isa(DSIB_ISA_AVX512)) best = DSIB_ISA_AVX512;
    int expected = -1;
    /* The first caller fixes the path; everyone agrees on the stored value. */
    atomic_compare_exchange_strong(&kern_isa, &expected, best);
    return atomic_load_explicit(&kern_isa, memory_order_acquire);
}

/* Public tables carry a matmul_rows entry that routes through the pointer-array kernel. */
static void matmul_rows_scalar(int32_t, const void *, size_t, int64_t, int64_t, int64_t,
                               const float *, int64_t, float *, int64_t, int64_t);
static void matmul_rows_avx2(int32_t, const void *, size_t, int64_t, int64_t, int64_t,
                             const float *, int64_t, float *, int64_t, int64_t);
static void matmul_rows_avx512(int32_t, const void *, size_t, int64_t, int64_t, int64_t,
                               const float *, int64_t, float *, int64_t, int64_t);

static const dsib_kern_table kern_tables_full[DSIB_ISA_COUNT] = {
    {DSIB_ISA_SCALAR, "scalar", matmul_rows_scalar},
    {DSIB_ISA_AVX2, "avx2", matmul_rows_avx2},
    {DSIB_ISA_AVX512, "avx512", matmul_rows_avx512},
};

static const dsib_kern_table *table_checked(int32_t isa) {
    if (isa < 0 || isa >= DSIB_ISA_COUNT) return NULL;
    if (!rows_fn_for(isa) || !cpu_has_isa(isa)) return NULL;
    return &kern_tables_full[isa];
}

const dsib_kern_table *dsib_kern_table_get(void) { return &kern_tables_full[process_isa()]; }
const dsib_kern_table *dsib_kern_table_for(int32_t isa) { return table_checked(isa); }
const char *dsib_kern_isa_name(void) { return kern_tables_full[process_isa()].name; }

/* Strided x/y → pointer arrays, DSIB_KERN_GROUP tokens at a time. */
static void rows_strided(dsib_rows_ptr_fn fn, int32_t type, const void *w, size_t rb,
                         int64_t n_in, int64_t o0, int64_t o1, const float *x,
                         int64_t x_stride, float *y, int64_t y_stride, int64_t n_tok) {
    const float *xp[DSIB_KERN_GROUP];
    float *yp[DSIB_KERN_GROUP];
    for (int64_t t0 = 0; t0 < n_tok; t0 += DSIB_KERN_GROUP) {
        int n = (int)(n_tok - t0 < DSIB_KERN_GROUP ? n_tok - t0 : DSIB_KERN_GROUP);
        for (int t = 0; t < n; t++) {
            xp[t] = x + (t0 + t) * x_stride;
            yp[t] = y + (t0 + t) * y_stride;
        }
        fn(type, (const uint8_t *)w, rb, n_in, o0, o1, xp, yp, n);
    }
}

#define MATMUL_ROWS_ISA(ISA, FN)                                                          \
    static void matmul_rows_##ISA(int32_t type, const void *w, size_t rb, int64_t n_in,  \
                                  int64_t o0, int64_t o1, const float *x, int64_t xs,    \
                                  float *y, int64_t ys, int64_t n_tok) {                 \
        rows_strided(FN, type, w, rb, n_in, o0, o1, x, xs, y, ys, n_tok);                 \
    }
MATMUL_ROWS_ISA(scalar, dsib_kern_rows_scalar)
#ifdef DSIB_KERN_X86
MATMUL_ROWS_ISA(avx2, dsib_kern_rows_avx2)
MATMUL_ROWS_ISA(avx512, dsib_kern_rows_avx512)
#else
MATMUL_ROWS_ISA(avx2, dsib_kern_rows_scalar)
MATMUL_ROWS_ISA(avx512, dsib_kern_rows_scalar)
#endif

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
    dsib_rows_ptr_fn fn;
    int32_t type;
    const uint8_t *w;
    size_t rb;
    int64_t n_in, n_out, rows;
    const float *x;
    int64_t xs;
    float *y;
    int64_t ys, n_tok;
} mm_job;

static void mm_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const mm_job *j = arg;
    int64_t o0 = task * j->rows, o1 = o0 + j->rows;
    if (o1 > j->n_out) o1 = j->n_out;
    rows_strided(j->fn, j->type, j->w, j->rb, j->n_in, o0, o1, j->x, j->xs, j->y, j->ys,
                 j->n_tok);
}

dsi_status dsib_matmul(dsib_threadpool *pool, int32_t type, const void *w,
                       size_t w_row_bytes, int64_t n_in, int64_t n_out, const float *x,
                       int64_t x_stride, float *y, int64_t y_stride, int64_t n_tok) {
    dsi_status st = dsib_kern_check(type, n_in, n_out, w_row_bytes, x_stride, y_stride,
                                    NULL, 0);
    if (st != DSI_OK) return st;
    if (n_tok < 0) return DSI_ERR_INVALID_ARGUMENT;
    if (n_tok == 0 || n_out == 0) return DSI_OK;
    if (!w || !x || !y) return DSI_ERR_INVALID_ARGUMENT;
    mm_job j = {rows_fn_for(process_isa()), type, w, w_row_bytes, n_in, n_out, 0, x,
                x_stride, y, y_stride, n_tok};
    j.rows = rows_per_task(w_row_bytes, n_out, dsib_threadpool_n_threads(pool));
    dsib_parallel_for(pool, (n_out + j.rows - 1) / j.rows, mm_task, &j);
    return DSI_OK;
}

dsi_status dsib_matmul_expert(dsib_threadpool *pool, int32_t type, const void *w_base,
                              size_t expert_stride, int32_t expert, size_t w_row_bytes,
                              int64_t n_in, int64_t n_out, const float *x,
                              int64_t x_stride, float *y, int64_t y_stride,
                              int64_t n_tok) {
    if (expert < 0 || !w_base) return DSI_ERR_INVALID_ARGUMENT;
    if (n_out > 0 && expert_stride / (size_t)n_out < w_row_bytes)
        return DSI_ERR_INVALID_ARGUMENT;
    return dsib_matmul(pool, type, (const uint8_t *)w_base + (size_t)expert * expert_stride,
                       w_row_bytes, n_in, n_out, x, x_stride, y, y_stride, n_tok);
}

typedef struct moe_job {
    dsib_rows_ptr_fn fn;
    const dsib_moe_matmul *m;
    int64_t rows, chunks;
} moe_job;

static void moe_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const moe_job *j = arg;
    const dsib_moe_matmul *m = j->m;
    int64_t g = task / j->chunks, c = task % j->chunks;
    int64_t s0 = m->slot_offs[g], s1 = m->slot_offs[g + 1];
    if (s1 <= s0) return;
    int64_t o0 = c * j->rows, o1 = o0 + j->rows;
    if (o1 > m->n_out) o1 = m->n_out;
    const uint8_t *w = (const uint8_t *)m->w_base + (size_t)m->experts[g] * m->expert_stride;
    const float *xp[DSIB_KERN_GROUP];
    float *yp[DSIB_KERN_GROUP];
    for (int64_t t0 = s0; t0 < s1; t0 += DSIB_KERN_GROUP) {
        int n = (int)(s1 - t0 < DSIB_KERN_GROUP ? s1 - t0 : DSIB_KERN_GROUP);
        for (int t = 0; t < n; t++) {
            int64_t s = t0 + t;
            xp[t] = m->x + (m->x_rows ? m->x_rows[s] : s) * m->x_stride;
            yp[t] = m->y + (m->y_rows ? m->y_rows[s] : s) * m->y_stride;
        }
        j->fn(m->type, w, m->w_row_bytes, m->n_in, o0, o1, xp, yp, n);
    }
}

dsi_status dsib_matmul_moe(dsib_threadpool *pool, const dsib_moe_matmul *m, char *msg,
                           size_t msg_size) {
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
    moe_job j;
    j.fn = rows_fn_for(process_isa());
    j.m = m;
    /* Tasks are sized for the whole step's work, so many experts × few rows each still
     * balance over the threads. */
    int32_t nt = dsib_threadpool_n_threads(pool);
    j.rows = rows_per_task(m->w_row_bytes, m->n_out * m->n_groups, nt);
    if (j.rows > m->n_out) j.rows = m->n_out;
    j.chunks = (m->n_out + j.rows - 1) / j.rows;
    dsib_parallel_for(pool, j.chunks * m->n_groups, moe_task, &j);
    return DSI_OK;
}

/* ---- batches of independent matmuls ---------------------------------------------------- */

#define BATCH_MAX 64

typedef struct batch_job {
    dsib_rows_ptr_fn fn;
    const dsib_matmul_desc *d;
    int32_t n;
    int64_t rows[BATCH_MAX];
    int64_t first[BATCH_MAX + 1]; /* first task of each descriptor */
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
    rows_strided(j->fn, d->type, d->w, d->w_row_bytes, d->n_in, o0, o1, d->x, d->x_stride, d->y,
                 d->y_stride, d->n_tok);
}

dsi_status dsib_matmul_batch(dsib_threadpool *pool, const dsib_matmul_desc *d, int32_t n,
                             char *msg, size_t msg_size) {
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
    batch_job j;
    j.fn = rows_fn_for(process_isa());
    int32_t nt = dsib_threadpool_n_threads(pool);
    for (int32_t b0 = 0; b0 < n; b0 += BATCH_MAX) {
        j.d = d + b0;
        j.n = n - b0 < BATCH_MAX ? n - b0 : BATCH_MAX;
        int64_t total_out = 0;
        for (int32_t i = 0; i < j.n; i++)
            if (j.d[i].n_tok > 0) total_out += j.d[i].n_out;
        j.first[0] = 0;
        for (int32_t i = 0; i < j.n; i++) {
            const dsib_matmul_desc *di = &j.d[i];
            int64_t tasks = 0;
            j.rows[i] = 1;
            if (di->n_tok > 0 && di->n_out > 0) {
                j.rows[i] = rows_per_task(di->w_row_bytes, total_out, nt);
                if (j.rows[i] > di->n_out) j.rows[i] = di->n_out;
                tasks = (di->n_out + j.rows[i] - 1) / j.rows[i];
            }
            j.first[i + 1] = j.first[i] + tasks;
        }
        if (j.first[j.n] > 0) dsib_parallel_for(pool, j.first[j.n], batch_task, &j);
    }
    return DSI_OK;
}
