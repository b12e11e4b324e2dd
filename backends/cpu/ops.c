/*
 * backends/cpu/ops.c — the CPU implementation of struct dsib_ops (backends/backend.h).
 *
 * Every op computes each output row with a fixed sequence of f32 operations that does not
 * depend on the number of rows in the call (model-spec §10.4): weight matmuls go through
 * backends/cpu/kernels (same guarantee), reductions here run in index order, and parallel
 * work is split over output rows only. Ops keep no state in the instance, so several
 * sessions may call them at once.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/rope.h"
#include "quant/fp.h"
#include "quant/quant.h"
#include "quant/statepack.h"

#if defined(__has_include)
#if __has_include("backends/cpu/ops_v41.h")
#include "backends/cpu/ops_v41.h"
#endif
#endif
#ifndef DSIB_CPU_OPS_V41_INIT
#define DSIB_CPU_OPS_V41_INIT
#endif

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSIB_OPS_SIMD_OK 1
#else
#define DSIB_OPS_SIMD_OK 0
#endif

/* ---- helpers ----------------------------------------------------------------------------- */

/* Rows of the row-wise ops (norms, SwiGLU, state stores, mHC, fake-quant, …) go over the pool
 * only when there are enough of them to pay for the hand-off (prefill, batched steps of 8+
 * sequences); a decoded token runs on the caller. Rows are independent: the split never
 * changes a result. */
#define OPS_PAR_ROWS 8

/* ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of eight lanes. */
static inline float tree8(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* Dot product with a fixed, vectorisable order: 8 lane accumulators (element i goes to lane
 * i mod 8), the tail added to lane 0 in order, lanes combined as a fixed tree. The order
 * depends only on n, never on the caller's batch, which is all the determinism contract
 * needs (§10.4). */
static inline float dot_fixed(const float *a, const float *b, uint32_t n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (uint32_t j = 0; j < 8; j++) l[j] += a[i + j] * b[i + j];
    for (; i < n; i++) l[0] += a[i] * b[i];
    return tree8(l);
}

/* Attention's dot product: dot_fixed's lanes, tail and tree, each product added with one
 * rounding (fmaf), as the AVX2 / AVX-512 head paths' fused multiply-adds do in the same
 * lanes — so every ISA path gives the same bits. */
static inline float dot_fma(const float *a, const float *b, uint32_t n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (uint32_t j = 0; j < 8; j++) l[j] = fmaf(a[i + j], b[i + j], l[j]);
    for (; i < n; i++) l[0] = fmaf(a[i], b[i], l[0]);
    return tree8(l);
}

/* dot_fma over a packed state row (lib/quant/statepack.h): the row's values are decoded 8 at
 * a time into registers and enter the very same lanes in the same order, so the result is
 * bit-identical to dot_fma over the unpacked row. n % 8 == 0. */
static inline float dot_fma_packed(const float *a, const uint8_t *row, const dsib_state *st,
                                   uint32_t n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float b[8];
    for (uint32_t i = 0; i + 8 <= n; i += 8) {
        dsii_sp_decode8(st->format, st->qcols, st->block, row, i, b);
        for (uint32_t j = 0; j < 8; j++) l[j] = fmaf(a[i + j], b[j], l[j]);
    }
    return tree8(l);
}

/* ---- weight access --------------------------------------------------------------------- */

dsi_status dsib_cpu_weight_row(const dsib_weight *w, int32_t expert, int64_t row, float *dst) {
    const uint8_t *p = dsib_cpu_wptr(w) + (uint64_t)expert * w->nb2 + (uint64_t)row * w->nb1;
    int64_t n = w->ne[0];
    switch (w->type) {
    case DSI_TYPE_F32: memcpy(dst, p, (size_t)n * sizeof(float)); return DSI_OK;
    case DSI_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = dsii_f16_to_f32(h);
        }
        return DSI_OK;
    case DSI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = dsii_bf16_to_f32(h);
        }
        return DSI_OK;
    case DSI_TYPE_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = (float)v;
        }
        return DSI_OK;
    default: return dsii_dequantize_row(w->type, p, dst, n, NULL);
    }
}

float dsib_cpu_weight_f32(const dsib_weight *w, int64_t i) {
    const uint8_t *p = dsib_cpu_wptr(w);
    uint16_t h;
    float f;
    switch (w->type) {
    case DSI_TYPE_F16: memcpy(&h, p + 2 * i, 2); return dsii_f16_to_f32(h);
    case DSI_TYPE_BF16: memcpy(&h, p + 2 * i, 2); return dsii_bf16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* ---- generic ----------------------------------------------------------------------------- */

/* Matmul path of the instance: the default (8-bit activations for the integer-coded weight
 * types) or the exact one (DSIB_HOST_EXACT_MATMUL; backends/cpu/kernels/kernels.h). */
static uint32_t mm_flags(const dsib_instance *inst) {
    return (inst->host.flags & DSIB_HOST_EXACT_MATMUL) ? DSIB_MM_EXACT : 0u;
}

static dsi_status op_matmul(dsib_stream *strm, const dsib_weight *w, int32_t expert,
                            dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n) {
    dsib_instance *inst = strm->inst;
    if (n == 0) return DSI_OK;
    return dsib_cpu_ret(strm, dsib_matmul(inst->pool, mm_flags(inst), w->type,
                                          dsib_cpu_wptr(w) + (uint64_t)expert * w->nb2,
                                          (size_t)w->nb1, w->ne[0], w->ne[1], dsib_cpu_f32(x),
                                          ldx, dsib_cpu_f32(y), ldy, n));
}

static dsi_status op_matmul_grouped(dsib_stream *strm, const dsib_weight *w, uint32_t groups,
                                    dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy,
                                    uint32_t n) {
    dsib_instance *inst = strm->inst;
    if (n == 0 || groups == 0) return DSI_OK;
    int64_t R = w->ne[1] / groups, K = w->ne[0];
    /* all groups in one job (one barrier) */
    dsib_matmul_desc d[64];
    char msg[256];
    for (uint32_t g0 = 0; g0 < groups; g0 += 64) {
        int32_t nd = groups - g0 < 64 ? (int32_t)(groups - g0) : 64;
        for (int32_t i = 0; i < nd; i++) {
            const uint32_t g = g0 + (uint32_t)i;
            d[i] = (dsib_matmul_desc){w->type, dsib_cpu_wptr(w) + (uint64_t)g * (uint64_t)R * w->nb1,
                                      (size_t)w->nb1, K, R, dsib_cpu_f32(x) + (size_t)g * K, ldx,
                                      dsib_cpu_f32(y) + (size_t)g * R, ldy, n};
        }
        dsi_status st = dsib_matmul_batch(inst->pool, mm_flags(inst), d, nd, msg, sizeof msg);
        if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    }
    return DSI_OK;
}

static dsi_status op_matmul_multi(dsib_stream *strm, const dsib_mm *mm, uint32_t count) {
    dsib_instance *inst = strm->inst;
    dsib_matmul_desc d[16];
    char msg[256];
    for (uint32_t i0 = 0; i0 < count; i0 += 16) {
        int32_t nd = count - i0 < 16 ? (int32_t)(count - i0) : 16;
        for (int32_t i = 0; i < nd; i++) {
            const dsib_mm *m = &mm[i0 + (uint32_t)i];
            const dsib_weight *w = m->w;
            d[i] = (dsib_matmul_desc){w->type, dsib_cpu_wptr(w) + (uint64_t)m->expert * w->nb2,
                                      (size_t)w->nb1, w->ne[0], w->ne[1], dsib_cpu_f32(m->x),
                                      m->ldx, dsib_cpu_f32(m->y), m->ldy, m->n};
        }
        dsi_status st = dsib_matmul_batch(inst->pool, mm_flags(inst), d, nd, msg, sizeof msg);
        if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    }
    return DSI_OK;
}

static dsi_status op_get_rows(dsib_stream *strm, const dsib_weight *table, dsib_view ids,
                              dsib_view y, uint32_t ldy, uint32_t n) {
    const int32_t *id = dsib_cpu_i32(ids);
    float *out = dsib_cpu_f32(y);
    for (uint32_t t = 0; t < n; t++) {
        if (id[t] < 0 || id[t] >= table->ne[1]) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
        dsi_status st = dsib_cpu_weight_row(table, 0, id[t], out + (size_t)t * ldy);
        if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    }
    return DSI_OK;
}

typedef struct rms_job {
    const float *xs;
    float *ys;
    const dsib_weight *w;
    uint32_t ldx, ldy, width;
    float eps;
} rms_job;

static void rms_norm_task(void *arg, int64_t r, int32_t slot) {
    (void)slot;
    const rms_job *j = arg;
    const dsib_weight *w = j->w;
    const uint32_t width = j->width;
    const float *wf = w && w->type == DSI_TYPE_F32 ? (const float *)(const void *)dsib_cpu_wptr(w) : NULL;
    const float *a = j->xs + (size_t)r * j->ldx;
    float *b = j->ys + (size_t)r * j->ldy;
    /* dot_fixed's lanes: a serial sum was one dependent add per element (D of them) */
    float ss = dot_fixed(a, a, width);
    float sc = 1.0f / sqrtf(ss / (float)width + j->eps);
    if (wf)
        for (uint32_t i = 0; i < width; i++) b[i] = (a[i] * sc) * wf[i];
    else if (w)
        for (uint32_t i = 0; i < width; i++) b[i] = (a[i] * sc) * dsib_cpu_weight_f32(w, i);
    else
        for (uint32_t i = 0; i < width; i++) b[i] = a[i] * sc;
}

static dsi_status op_rms_norm(dsib_stream *strm, dsib_view x, uint32_t ldx, dsib_view y,
                              uint32_t ldy, uint32_t rows, uint32_t width, const dsib_weight *w,
                              float eps) {
    rms_job j = {dsib_cpu_f32(x), dsib_cpu_f32(y), w, ldx, ldy, width, eps};
    if (rows >= OPS_PAR_ROWS)
        dsib_parallel_for(strm->inst->pool, rows, rms_norm_task, &j);
    else
        for (uint32_t r = 0; r < rows; r++) rms_norm_task(&j, r, 0);
    return DSI_OK;
}

static dsi_status op_add(dsib_stream *strm, dsib_view a, uint32_t lda, dsib_view b,
                         uint32_t ldb, dsib_view y, uint32_t ldy, uint32_t rows,
                         uint32_t width) {
    (void)strm;
    const float *pa = dsib_cpu_f32(a), *pb = dsib_cpu_f32(b);
    float *py = dsib_cpu_f32(y);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < width; i++)
            py[(size_t)r * ldy + i] = pa[(size_t)r * lda + i] + pb[(size_t)r * ldb + i];
    return DSI_OK;
}

static dsi_status op_scale(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                           uint32_t width, float s) {
    (void)strm;
    float *p = dsib_cpu_f32(x);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < width; i++) p[(size_t)r * ldx + i] *= s;
    return DSI_OK;
}

static dsi_status op_copy(dsib_stream *strm, dsib_view src, dsib_view dst, uint64_t bytes) {
    (void)strm;
    if (bytes) memcpy(dst.buf->ptr + dst.offset, src.buf->ptr + src.offset, (size_t)bytes);
    return DSI_OK;
}

static dsi_status op_copy_rows(dsib_stream *strm, dsib_view src, uint32_t lds, dsib_view dst,
                               uint32_t ldd, uint32_t rows, uint32_t width) {
    (void)strm;
    const float *s = dsib_cpu_f32(src);
    float *d = dsib_cpu_f32(dst);
    for (uint32_t r = 0; r < rows; r++)
        memmove(d + (size_t)r * ldd, s + (size_t)r * lds, (size_t)width * sizeof(float));
    return DSI_OK;
}

static dsi_status op_gather_rows(dsib_stream *strm, dsib_view src, uint32_t lds, dsib_view idx,
                                 dsib_view dst, uint32_t ldd, uint32_t n, uint32_t width) {
    const float *s = dsib_cpu_f32(src);
    const int32_t *ix = dsib_cpu_i32(idx);
    float *d = dsib_cpu_f32(dst);
    for (uint32_t t = 0; t < n; t++) {
        if (ix[t] < 0) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
        memmove(d + (size_t)t * ldd, s + (size_t)ix[t] * lds, (size_t)width * sizeof(float));
    }
    return DSI_OK;
}

/* ---- step rows and state ---------------------------------------------------------------- */

dsi_status dsib_cpu_rows_check(dsib_view rows, uint32_t n, uint32_t slots) {
    if (n == 0) return DSI_OK;
    if (!rows.buf) return DSI_ERR_INVALID_ARGUMENT;
    for (uint32_t t = 0; t < n; t++) {
        const int32_t *r = dsib_cpu_row(rows, t);
        if (r[DSIB_ROW_POS] < 0 || r[DSIB_ROW_SLOT] < 0 ||
            (slots && (uint32_t)r[DSIB_ROW_SLOT] >= slots) || r[DSIB_ROW_FIRST] < 0 ||
            (uint32_t)r[DSIB_ROW_FIRST] > t || r[DSIB_ROW_COUNT] < 1 ||
            (uint64_t)r[DSIB_ROW_FIRST] + (uint64_t)r[DSIB_ROW_COUNT] <= t ||
            (uint64_t)r[DSIB_ROW_FIRST] + (uint64_t)r[DSIB_ROW_COUNT] > n)
            return DSI_ERR_INVALID_ARGUMENT;
        const int32_t *f = dsib_cpu_row(rows, (uint32_t)r[DSIB_ROW_FIRST]);
        if (f[DSIB_ROW_SLOT] != r[DSIB_ROW_SLOT] ||
            (int64_t)f[DSIB_ROW_POS] + (t - (uint32_t)r[DSIB_ROW_FIRST]) != r[DSIB_ROW_POS])
            return DSI_ERR_INVALID_ARGUMENT;
    }
    return DSI_OK;
}

static dsi_status state_check(const dsib_state *st, uint32_t width, int packed_ok) {
    if (!st || !st->buf || st->rows == 0 || st->slots == 0 || st->ld < width)
        return DSI_ERR_INVALID_ARGUMENT;
    if (st->format != DSIB_STATE_F32) {
        if (!packed_ok || st->format < 0 || st->format > DSIB_STATE_E2M1_E4M3)
            return DSI_ERR_UNSUPPORTED;
        if (st->ld != width || !dsii_sp_valid(st->format, st->ld, st->qcols, st->block) ||
            st->row_bytes != dsii_sp_row_bytes(st->format, st->ld, st->qcols, st->block))
            return DSI_ERR_INVALID_ARGUMENT;
    } else if (st->row_bytes != 0 && st->row_bytes != (uint64_t)st->ld * 4u) {
        return DSI_ERR_INVALID_ARGUMENT;
    }
    uint64_t bytes = (uint64_t)st->slots * st->rows * dsib_cpu_state_rb(st);
    if (st->offset > st->buf->size || bytes > st->buf->size - st->offset)
        return DSI_ERR_INVALID_ARGUMENT;
    return DSI_OK;
}

dsi_status dsib_cpu_state_check(const dsib_state *st, uint32_t width) {
    return state_check(st, width, 0);
}

dsi_status dsib_cpu_state_check_packed(const dsib_state *st, uint32_t width) {
    return state_check(st, width, 1);
}

/* ---- positions --------------------------------------------------------------------------- */

/* The §3.9 frequencies of `rope` (dsib_rope_freqs), from the stream's memory when it holds
 * them (cpu_impl.h dsib_cpu_rope_freqs); *set: their entry. Replacing an entry empties the
 * cos / sin rows made from it. */
static const double *rope_freqs_of(dsib_stream *strm, const dsib_rope *rope, int *set) {
    for (int k = 0; k < 2; k++)
        if (strm->rope_f[k].valid && memcmp(&strm->rope_f[k].key, rope, sizeof *rope) == 0) {
            *set = k;
            return strm->rope_f[k].f;
        }
    const int k = (int)(strm->rope_f_next++ % 2);
    dsib_cpu_rope_freqs *e = &strm->rope_f[k];
    for (int r = k; r < DSIB_CPU_ROPE_ROWS; r += 2) strm->rope_r[r].valid = 0; /* set k's rows */
    dsib_rope_freqs(rope, e->f);
    e->key = *rope;
    e->valid = 1;
    *set = k;
    return e->f;
}

/* cos / sin (as f32) of pos · f[i], i < half, into cs / sn. */
static void rope_row_make(const double *f, int32_t half, int64_t pos, float *cs, float *sn) {
    for (int32_t i = 0; i < half; i++) {
        double th = (double)pos * f[i];
        cs[i] = (float)cos(th);
        sn[i] = (float)sin(th);
    }
}

/* The same from the stream's memory (half <= DSIB_CPU_ROPE_ROW_HALF): direct-mapped, set
 * `set`'s rows at the entries of its parity. */
static const dsib_cpu_rope_row *rope_row_of(dsib_stream *strm, int set, const double *f,
                                            int32_t half, int64_t pos) {
    dsib_cpu_rope_row *e =
        &strm->rope_r[(uint64_t)(pos % (DSIB_CPU_ROPE_ROWS / 2)) * 2 + (uint64_t)set];
    if (e->valid && e->pos == pos) return e;
    rope_row_make(f, half, pos, e->cs, e->sn);
    e->pos = pos;
    e->valid = 1;
    return e;
}

/* Row t of rope_tail: its heads' last n_rot dimensions rotated by cs / sn (sn negated for
 * the inverse rotation: −(float)sin, exact). */
static void rope_rotate_row(float *row, uint32_t heads, uint32_t head_dim, int32_t n_rot,
                            const float *cs, const float *sn, int32_t inverse) {
    const int32_t half = n_rot / 2;
    float sn_inv[DSIB_CPU_ROPE_MAX_HALF];
    if (inverse) {
        for (int32_t i = 0; i < half; i++) sn_inv[i] = -sn[i];
        sn = sn_inv;
    }
    for (uint32_t h = 0; h < heads; h++) {
        float *v = row + (size_t)h * head_dim + (head_dim - (uint32_t)n_rot);
        for (int32_t i = 0; i < half; i++) {
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cs[i] - x1 * sn[i];
            v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* Calls of more rows than the stream remembers (prefill): each row makes its own cos / sin
 * row, so the rows go over the pool. */
typedef struct rope_job {
    float *p;
    const double *f;
    dsib_view rows;
    uint32_t ldx, heads, head_dim;
    int32_t pos_delta, n_rot, inverse;
} rope_job;

static void rope_row_task(void *arg, int64_t tt, int32_t slot) {
    (void)slot;
    const rope_job *j = arg;
    const uint32_t t = (uint32_t)tt;
    float cs[DSIB_CPU_ROPE_MAX_HALF], sn[DSIB_CPU_ROPE_MAX_HALF];
    int64_t q = (int64_t)dsib_cpu_row(j->rows, t)[DSIB_ROW_POS] + j->pos_delta;
    rope_row_make(j->f, j->n_rot / 2, q > 0 ? q : 0, cs, sn);
    rope_rotate_row(j->p + (size_t)t * j->ldx, j->heads, j->head_dim, j->n_rot, cs, sn, j->inverse);
}

static dsi_status op_rope_tail(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t n,
                               uint32_t heads, uint32_t head_dim, dsib_view rows,
                               int32_t pos_delta, const dsib_rope *rope, int32_t inverse) {
    if (!rope || rope->n_rot <= 0 || rope->n_rot > 2 * DSIB_CPU_ROPE_MAX_HALF ||
        (uint32_t)rope->n_rot > head_dim || (rope->n_rot & 1) ||
        dsib_cpu_rows_check(rows, n, 0) != DSI_OK)
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    int set;
    const double *f = rope_freqs_of(strm, rope, &set);
    const int32_t half = rope->n_rot / 2;
    float *p = dsib_cpu_f32(x);
    if (half > DSIB_CPU_ROPE_ROW_HALF || n > DSIB_CPU_ROPE_ROWS_N) {
        rope_job j = {p, f, rows, ldx, heads, head_dim, pos_delta, rope->n_rot, inverse};
        if (n >= OPS_PAR_ROWS)
            dsib_parallel_for(strm->inst->pool, n, rope_row_task, &j);
        else
            for (uint32_t t = 0; t < n; t++) rope_row_task(&j, t, 0);
        return DSI_OK;
    }
    for (uint32_t t = 0; t < n; t++) {
        int64_t q = (int64_t)dsib_cpu_row(rows, t)[DSIB_ROW_POS] + pos_delta;
        const dsib_cpu_rope_row *e = rope_row_of(strm, set, f, half, q > 0 ? q : 0);
        rope_rotate_row(p + (size_t)t * ldx, heads, head_dim, rope->n_rot, e->cs, e->sn, inverse);
    }
    return DSI_OK;
}

/* One row of store_rows: rows write distinct state rows (a ring row a later row of the same
 * sequence takes is skipped; sequences have slots of their own), so they run in any order
 * and on any thread. */
typedef struct store_job {
    const float *s;
    uint32_t lds;
    dsib_view rows;
    const dsib_state *dst;
    uint32_t width, ratio;
    int ring;
} store_job;

static void store_row_task(void *arg, int64_t tt, int32_t slot) {
    (void)slot;
    const store_job *j = arg;
    const uint32_t t = (uint32_t)tt;
    const dsib_state *dst = j->dst;
    const int32_t *r = dsib_cpu_row(j->rows, t);
    int64_t p = r[DSIB_ROW_POS];
    uint64_t row;
    if (j->ring) {
        int64_t last = dsib_cpu_row(j->rows, (uint32_t)r[DSIB_ROW_FIRST])[DSIB_ROW_POS] +
                       r[DSIB_ROW_COUNT] - 1;
        if (p <= last - (int64_t)dst->rows) return; /* a later row takes its ring row */
        row = (uint64_t)p % dst->rows;
    } else {
        if ((p + 1) % j->ratio != 0) return;
        row = (uint64_t)((p + 1) / j->ratio - 1);
    }
    if (dst->format == DSIB_STATE_F32)
        memcpy(dsib_cpu_state_row(dst, (uint32_t)r[DSIB_ROW_SLOT], row), j->s + (size_t)t * j->lds,
               (size_t)j->width * sizeof(float));
    else /* packed: exact for rows on the grid (fake-quant output), statepack.h */
        (void)dsii_sp_pack_row(dst->format, dst->ld, dst->qcols, dst->block, j->s + (size_t)t * j->lds,
                               dsib_cpu_state_bytes(dst, (uint32_t)r[DSIB_ROW_SLOT], row));
}

static dsi_status op_store_rows(dsib_stream *strm, dsib_view src, uint32_t lds, uint32_t n,
                                dsib_view rows, const dsib_state *dst, uint32_t width,
                                uint32_t ratio, uint32_t flags) {
    if (n == 0) return DSI_OK;
    int ring = (flags & DSIB_STORE_RING) != 0;
    dsi_status st = dsib_cpu_state_check_packed(dst, width);
    if (st == DSI_OK && (ratio == 0 || (ring && ratio != 1) || (flags & ~DSIB_STORE_RING)))
        st = DSI_ERR_INVALID_ARGUMENT;
    if (st == DSI_OK) st = dsib_cpu_rows_check(rows, n, dst->slots);
    if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    const float *s = dsib_cpu_f32(src);
    /* capacity first: nothing is written when a row does not fit */
    for (uint32_t t = 0; t < n && !ring; t++) {
        int64_t p = dsib_cpu_row(rows, t)[DSIB_ROW_POS];
        if ((p + 1) % ratio == 0 && (uint64_t)((p + 1) / ratio - 1) >= dst->rows)
            return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    }
    store_job j = {s, lds, rows, dst, width, ratio, ring};
    if (n >= OPS_PAR_ROWS)
        dsib_parallel_for(strm->inst->pool, n, store_row_task, &j);
    else
        for (uint32_t t = 0; t < n; t++) store_row_task(&j, t, 0);
    return DSI_OK;
}

/* ---- quantisation simulation ------------------------------------------------------------- */

/* The block scale s and the clamp limit of a recipe from the block's amax (§10.1);
 * 0 for an unknown recipe. */
static int fq_scale(float amax, int32_t recipe, float *s, float *lim) {
    switch (recipe) {
    case DSIB_FQ_E4M3_UE8M0:
        if (amax < 1e-4f) amax = 1e-4f;
        *s = dsii_e8m0_to_f32(dsii_e8m0_ceil(amax * (1.0f / 448.0f)));
        *lim = 448.0f;
        return 1;
    case DSIB_FQ_E2M1_UE8M0:
        if (amax < 6.0f * 0x1p-126f) amax = 6.0f * 0x1p-126f;
        *s = dsii_e8m0_to_f32(dsii_e8m0_ceil(amax * (1.0f / 6.0f)));
        *lim = 6.0f;
        return 1;
    case DSIB_FQ_E2M1_E4M3:
        if (amax < 6.0f * 0x1p-9f) amax = 6.0f * 0x1p-9f;
        *s = dsii_e4m3_rne(amax / 6.0f);
        *lim = 6.0f;
        return 1;
    default: return 0;
    }
}

typedef struct fq_job {
    float *p;
    uint32_t ldx, col0, ncols, block;
    int32_t recipe;
    int round, simd;
} fq_job;

static void fq_block_scalar(float *v, uint32_t block, int32_t recipe, int round) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < block; i++) {
        float a = fabsf(v[i]);
        if (a > amax) amax = a;
    }
    float s = 1.0f, lim = 0.0f; /* set by fq_scale (the recipe was checked by the op) */
    (void)fq_scale(amax, recipe, &s, &lim);
    int e4m3 = recipe == DSIB_FQ_E4M3_UE8M0;
    for (uint32_t i = 0; i < block; i++) {
        float q = v[i] / s;
        if (q > lim) q = lim;
        if (q < -lim) q = -lim;
        if (round) q = e4m3 ? dsii_e4m3_rne(q) : dsii_e2m1_rne(q);
        v[i] = q * s;
    }
}

static int32_t ops_isa_now(void);

static dsi_status op_hadamard(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                              uint32_t chunks, uint32_t size) {
    if (size == 0 || (size & (size - 1))) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    float sc = 1.0f / sqrtf((float)size);
    float *p = dsib_cpu_f32(x);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < chunks; c++) {
            float *v = p + (size_t)r * ldx + (size_t)c * size;
            for (uint32_t h = 1; h < size; h <<= 1)
                for (uint32_t i = 0; i < size; i += 2 * h)
                    for (uint32_t j = i; j < i + h; j++) {
                        float a = v[j], b = v[j + h];
                        v[j] = a + b;
                        v[j + h] = a - b;
                    }
            for (uint32_t i = 0; i < size; i++) v[i] *= sc;
        }
    return DSI_OK;
}

/* ---- mHC --------------------------------------------------------------------------------- */

static dsi_status op_hc_expand(dsib_stream *strm, dsib_view e, uint32_t lde, dsib_view X,
                               uint32_t n, uint32_t n_hc, uint32_t D) {
    (void)strm;
    const float *s = dsib_cpu_f32(e);
    float *d = dsib_cpu_f32(X);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < n_hc; h++)
            memcpy(d + ((size_t)t * n_hc + h) * D, s + (size_t)t * lde, (size_t)D * sizeof(float));
    return DSI_OK;
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

typedef struct hcmix_job {
    const float *xs;
    float *cf;
    uint32_t ldc, n_hc, D, n_mix, iters;
    int32_t mode;
    float rms_eps, hc_eps, sc[3], bs[16 * 18];
} hcmix_job;

/* One token's coefficients from its raw mixes (§3.3): RMS scale, sigmoids, row softmax and
 * the Sinkhorn iterations. Tokens are independent. */
static void hc_mix_task(void *arg, int64_t t, int32_t slot) {
    (void)slot;
    const hcmix_job *j = arg;
    const uint32_t n_hc = j->n_hc, n_mix = j->n_mix;
    const float *sc = j->sc, *bs = j->bs, hc_eps = j->hc_eps;
    const float *fl = j->xs + (size_t)t * n_hc * j->D;
    /* dot_fixed's lanes: the serial sum was n_hc · D dependent adds (4096 at D = 1024) */
    float ss = dot_fixed(fl, fl, n_hc * j->D);
    float rs = 1.0f / sqrtf(ss / (float)((size_t)n_hc * j->D) + j->rms_eps);
    float *m = j->cf + (size_t)t * j->ldc;
    for (uint32_t i = 0; i < n_mix; i++) m[i] *= rs;
    if (j->mode == DSIB_HC_HEAD) {
        for (uint32_t h = 0; h < n_hc; h++) m[h] = sigmoidf_(m[h] * sc[0] + bs[h]) + hc_eps;
        return;
    }
    for (uint32_t h = 0; h < n_hc; h++) {
        m[h] = sigmoidf_(m[h] * sc[0] + bs[h]) + hc_eps;
        m[n_hc + h] = 2.0f * sigmoidf_(m[n_hc + h] * sc[1] + bs[n_hc + h]);
    }
    float *C = m + 2 * n_hc;
    for (uint32_t i = 0; i < n_hc * n_hc; i++) C[i] = C[i] * sc[2] + bs[2 * n_hc + i];
    /* row softmax + eps */
    for (uint32_t i = 0; i < n_hc; i++) {
        float *row = C + i * n_hc, mx = row[0], s = 0.0f;
        for (uint32_t k = 1; k < n_hc; k++) mx = row[k] > mx ? row[k] : mx;
        for (uint32_t k = 0; k < n_hc; k++) {
            row[k] = expf(row[k] - mx);
            s += row[k];
        }
        for (uint32_t k = 0; k < n_hc; k++) row[k] = row[k] / s + hc_eps;
    }
    for (uint32_t it = 0; it < j->iters; it++) {
        if (it > 0)
            for (uint32_t i = 0; i < n_hc; i++) {
                float s = 0.0f;
                for (uint32_t k = 0; k < n_hc; k++) s += C[i * n_hc + k];
                s += hc_eps;
                for (uint32_t k = 0; k < n_hc; k++) C[i * n_hc + k] /= s;
            }
        for (uint32_t k = 0; k < n_hc; k++) {
            float s = 0.0f;
            for (uint32_t i = 0; i < n_hc; i++) s += C[i * n_hc + k];
            s += hc_eps;
            for (uint32_t i = 0; i < n_hc; i++) C[i * n_hc + k] /= s;
        }
    }
}

static dsi_status op_hc_mix(dsib_stream *strm, dsib_view X, uint32_t n, uint32_t n_hc,
                            uint32_t D, const dsib_weight *fn, const dsib_weight *scale,
                            const dsib_weight *base, float rms_eps, float hc_eps,
                            uint32_t iters, int32_t mode, dsib_view coef, uint32_t ldc) {
    if (n_hc == 0 || n_hc > 16) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    uint32_t n_mix = mode == DSIB_HC_HEAD ? n_hc : n_hc * (2 + n_hc);
    if (fn->ne[1] != (int64_t)n_mix || fn->ne[0] != (int64_t)n_hc * D || ldc < n_mix)
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    dsi_status st = op_matmul(strm, fn, 0, X, n_hc * D, coef, ldc, n);
    if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    hcmix_job j = {.xs = dsib_cpu_f32(X), .cf = dsib_cpu_f32(coef), .ldc = ldc, .n_hc = n_hc,
                   .D = D, .n_mix = n_mix, .iters = iters, .mode = mode, .rms_eps = rms_eps,
                   .hc_eps = hc_eps};
    for (uint32_t i = 0; i < (mode == DSIB_HC_HEAD ? 1u : 3u); i++) j.sc[i] = dsib_cpu_weight_f32(scale, i);
    for (uint32_t i = 0; i < n_mix; i++) j.bs[i] = dsib_cpu_weight_f32(base, i);
    /* a token's few microseconds (the serial sum of squares, Sinkhorn) pay for the barrier
     * from two tokens on */
    if (n >= 2)
        dsib_parallel_for(strm->inst->pool, n, hc_mix_task, &j);
    else
        for (uint32_t t = 0; t < n; t++) hc_mix_task(&j, t, 0);
    return DSI_OK;
}

/* One row of hc_collapse: o[d] = pre[0]·x0[d] + pre[1]·x1[d] + … (streams in order). */
static void hc_collapse_row(const float *pre, const float *x, float *o, uint32_t n_hc,
                            uint32_t D) {
    for (uint32_t d = 0; d < D; d++) {
        float a = pre[0] * x[d];
        for (uint32_t h = 1; h < n_hc; h++) a += pre[h] * x[(size_t)h * D + d];
        o[d] = a;
    }
}

/* One row of hc_post (in place allowed: every column's inputs are read before its outputs
 * are written): o_j[d] = post[j]·f[d] + Σ_i C[i][j]·r_i[d] (i ascending). */
static void hc_post_row(const float *post, const float *C, const float *ft, const float *rt,
                        float *ot, uint32_t n_hc, uint32_t D) {
    float r[16];
    for (uint32_t d = 0; d < D; d++) {
        for (uint32_t i = 0; i < n_hc; i++) r[i] = rt[(size_t)i * D + d];
        for (uint32_t j = 0; j < n_hc; j++) {
            float a = post[j] * ft[d];
            for (uint32_t i = 0; i < n_hc; i++) a += C[i * n_hc + j] * r[i];
            ot[(size_t)j * D + d] = a;
        }
    }
}

#if DSIB_OPS_SIMD_OK
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#pragma GCC optimize("fp-contract=off")
#endif
#include <immintrin.h>
/* fq_block_scalar, 8 elements at a time (block % 8 == 0), the same values bit for bit
 * (test_v4_ops test_fake_quant_simd): amax is a maximum (order-free; a NaN element is
 * skipped as `a > amax` skips it), the division and the product are the same IEEE
 * operations, and the two roundings are written as exact float / integer steps:
 *   E4M3 (dsii_e4m3_rne): normal (|q| >= 2^-6): round-half-even of the mantissa to 3 bits
 *     on the bit pattern, as dsii_f32_to_e4m3 does; subnormal: round-half-even of |q|·2^9
 *     (exact scaling) times 2^-9; |q| >= 448 -> 448; NaN -> quiet NaN with the sign.
 *   E2M1 (dsii_e2m1_rne): the grid has step 1/2 below 2, 1 below 4, 2 up to 6, so the
 *     nearest-even grid point is round-half-even of |q|·2, |q| or |q|/2, scaled back
 *     (exact; the grid's even codes are exactly the points where that integer is even);
 *     above 6 -> 6; NaN -> +0. */
static void fq_block_avx2(float *v, uint32_t block, int32_t recipe, int round) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 am = _mm256_setzero_ps();
    for (uint32_t i = 0; i < block; i += 8)
        am = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + i), absm), am); /* NaN: keeps am */
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float s = 1.0f, lim = 0.0f; /* set by fq_scale (the recipe was checked by the op) */
    (void)fq_scale(_mm_cvtss_f32(m4), recipe, &s, &lim);
    const __m256 sv = _mm256_set1_ps(s), lv = _mm256_set1_ps(lim), nlv = _mm256_set1_ps(-lim);
    const __m256i sgn = _mm256_set1_epi32((int)0x80000000u), one = _mm256_set1_epi32(1);
    const int e4m3 = recipe == DSIB_FQ_E4M3_UE8M0;
    for (uint32_t i = 0; i < block; i += 8) {
        __m256 q = _mm256_div_ps(_mm256_loadu_ps(v + i), sv);
        q = _mm256_min_ps(lv, q);  /* (lim < q) ? lim : q; NaN stays */
        q = _mm256_max_ps(nlv, q); /* (-lim > q) ? -lim : q */
        if (round) {
            const __m256i x = _mm256_castps_si256(q);
            const __m256i sign = _mm256_and_si256(x, sgn);
            const __m256i ax = _mm256_andnot_si256(sgn, x);
            const __m256 a = _mm256_castsi256_ps(ax);
            const __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7F800000));
            __m256i r;
            if (e4m3) {
                const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ax, 20), one);
                const __m256i rn = _mm256_and_si256(
                    _mm256_add_epi32(_mm256_add_epi32(ax, _mm256_set1_epi32(0x7FFFF)), odd),
                    _mm256_set1_epi32(0x7FF00000));
                const __m256i rs = _mm256_castps_si256(_mm256_mul_ps(
                    _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    _mm256_set1_ps(0x1p-9f)));
                const __m256i normal = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x3C7FFFFF));
                const __m256i sat = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x43DFFFFF));
                r = _mm256_blendv_epi8(rs, rn, normal);
                r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x43E00000), sat);
                r = _mm256_or_si256(sign, _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), nan));
            } else {
                const __m256 a6 = _mm256_min_ps(a, _mm256_set1_ps(6.0f));
                /* a macro: the rounding mode must be an integer constant expression (clang) */
#define FQ_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                const __m256 r1 = _mm256_mul_ps(
                    _mm256_round_ps(_mm256_mul_ps(a6, _mm256_set1_ps(2.0f)), FQ_RN), _mm256_set1_ps(0.5f));
                const __m256 r2 = _mm256_round_ps(a6, FQ_RN);
                const __m256 r3 = _mm256_mul_ps(
                    _mm256_round_ps(_mm256_mul_ps(a6, _mm256_set1_ps(0.5f)), FQ_RN), _mm256_set1_ps(2.0f));
                __m256 rr = _mm256_blendv_ps(r3, r2, _mm256_cmp_ps(a6, _mm256_set1_ps(4.0f), _CMP_LT_OQ));
                rr = _mm256_blendv_ps(rr, r1, _mm256_cmp_ps(a6, _mm256_set1_ps(2.0f), _CMP_LT_OQ));
                r = _mm256_andnot_si256(nan, _mm256_or_si256(sign, _mm256_castps_si256(rr)));
#undef FQ_RN
            }
            q = _mm256_castsi256_ps(r);
        }
        _mm256_storeu_ps(v + i, _mm256_mul_ps(q, sv));
    }
}
/* The same operations, 8 columns at a time (n_hc = 4, D % 8 == 0). */
static void hc_collapse_row4_avx2(const float *pre, const float *x, float *o, uint32_t D) {
    const __m256 p0 = _mm256_set1_ps(pre[0]), p1 = _mm256_set1_ps(pre[1]);
    const __m256 p2 = _mm256_set1_ps(pre[2]), p3 = _mm256_set1_ps(pre[3]);
    for (uint32_t d = 0; d < D; d += 8) {
        __m256 a = _mm256_mul_ps(p0, _mm256_loadu_ps(x + d));
        a = _mm256_add_ps(a, _mm256_mul_ps(p1, _mm256_loadu_ps(x + D + d)));
        a = _mm256_add_ps(a, _mm256_mul_ps(p2, _mm256_loadu_ps(x + 2 * (size_t)D + d)));
        a = _mm256_add_ps(a, _mm256_mul_ps(p3, _mm256_loadu_ps(x + 3 * (size_t)D + d)));
        _mm256_storeu_ps(o + d, a);
    }
}
static void hc_post_row4_avx2(const float *post, const float *C, const float *ft,
                              const float *rt, float *ot, uint32_t D) {
    __m256 c[16], pj[4];
    for (int i = 0; i < 16; i++) c[i] = _mm256_set1_ps(C[i]);
    for (int j = 0; j < 4; j++) pj[j] = _mm256_set1_ps(post[j]);
    for (uint32_t d = 0; d < D; d += 8) {
        const __m256 f = _mm256_loadu_ps(ft + d);
        const __m256 r0 = _mm256_loadu_ps(rt + d), r1 = _mm256_loadu_ps(rt + D + d);
        const __m256 r2 = _mm256_loadu_ps(rt + 2 * (size_t)D + d);
        const __m256 r3 = _mm256_loadu_ps(rt + 3 * (size_t)D + d);
        __m256 o[4];
        for (int j = 0; j < 4; j++) {
            __m256 a = _mm256_mul_ps(pj[j], f);
            a = _mm256_add_ps(a, _mm256_mul_ps(c[0 * 4 + j], r0));
            a = _mm256_add_ps(a, _mm256_mul_ps(c[1 * 4 + j], r1));
            a = _mm256_add_ps(a, _mm256_mul_ps(c[2 * 4 + j], r2));
            a = _mm256_add_ps(a, _mm256_mul_ps(c[3 * 4 + j], r3));
            o[j] = a;
        }
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(ot + (size_t)j * D + d, o[j]);
    }
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

static void fq_task(void *arg, int64_t r, int32_t slot) {
    (void)slot;
    const fq_job *j = arg;
    for (uint32_t b0 = 0; b0 < j->ncols; b0 += j->block) {
        float *v = j->p + (size_t)r * j->ldx + j->col0 + b0;
#if DSIB_OPS_SIMD_OK
        if (j->simd) {
            fq_block_avx2(v, j->block, j->recipe, j->round);
            continue;
        }
#endif
        fq_block_scalar(v, j->block, j->recipe, j->round);
    }
}

static dsi_status op_fake_quant(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                                uint32_t col0, uint32_t ncols, uint32_t block, int32_t recipe,
                                uint32_t flags) {
    float s_, l_;
    if (block == 0 || ncols % block || !fq_scale(1.0f, recipe, &s_, &l_))
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    fq_job j = {dsib_cpu_f32(x), ldx, col0, ncols, block, recipe, !(flags & DSIB_FQ_NO_ROUND), 0};
    j.simd = block % 8 == 0 && ops_isa_now() >= DSIB_ISA_AVX2;
    if (rows >= OPS_PAR_ROWS)
        dsib_parallel_for(strm->inst->pool, rows, fq_task, &j);
    else
        for (uint32_t r = 0; r < rows; r++) fq_task(&j, r, 0);
    return DSI_OK;
}

typedef struct hc_job {
    const float *a, *b, *cf;
    float *o;
    uint32_t lda, ldb, ldc, ldo, n_hc, D;
    int simd;
} hc_job;

static void hc_collapse_task(void *arg, int64_t t, int32_t slot) {
    (void)slot;
    const hc_job *j = arg;
    const float *pre = j->cf + (size_t)t * j->ldc, *x = j->a + (size_t)t * j->lda;
    float *o = j->o + (size_t)t * j->ldo;
#if DSIB_OPS_SIMD_OK
    if (j->simd) {
        hc_collapse_row4_avx2(pre, x, o, j->D);
        return;
    }
#endif
    hc_collapse_row(pre, x, o, j->n_hc, j->D);
}

static void hc_post_task(void *arg, int64_t t, int32_t slot) {
    (void)slot;
    const hc_job *j = arg;
    const float *post = j->cf + (size_t)t * j->ldc + j->n_hc, *C = post + j->n_hc;
    const float *ft = j->b + (size_t)t * j->ldb, *rt = j->a + (size_t)t * j->lda;
    float *ot = j->o + (size_t)t * j->ldo;
#if DSIB_OPS_SIMD_OK
    if (j->simd) {
        hc_post_row4_avx2(post, C, ft, rt, ot, j->D);
        return;
    }
#endif
    hc_post_row(post, C, ft, rt, ot, j->n_hc, j->D);
}

static dsi_status op_hc_collapse(dsib_stream *strm, dsib_view X, dsib_view coef, uint32_t ldc,
                                 dsib_view y, uint32_t ldy, uint32_t n, uint32_t n_hc,
                                 uint32_t D) {
    hc_job j = {dsib_cpu_f32(X), NULL, dsib_cpu_f32(coef), dsib_cpu_f32(y), n_hc * D, 0, ldc,
                ldy, n_hc, D, 0};
    j.simd = n_hc == 4 && D % 8 == 0 && ops_isa_now() >= DSIB_ISA_AVX2;
    if (n >= OPS_PAR_ROWS)
        dsib_parallel_for(strm->inst->pool, n, hc_collapse_task, &j);
    else
        for (uint32_t t = 0; t < n; t++) hc_collapse_task(&j, t, 0);
    return DSI_OK;
}

static dsi_status op_hc_post(dsib_stream *strm, dsib_view f, uint32_t ldf, dsib_view R,
                             dsib_view coef, uint32_t ldc, dsib_view Xo, uint32_t n,
                             uint32_t n_hc, uint32_t D) {
    if (n_hc > 16) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    hc_job j = {dsib_cpu_f32(R), dsib_cpu_f32(f), dsib_cpu_f32(coef), dsib_cpu_f32(Xo),
                n_hc * D, ldf, ldc, n_hc * D, n_hc, D, 0};
    j.simd = n_hc == 4 && D % 8 == 0 && ops_isa_now() >= DSIB_ISA_AVX2;
    if (n >= OPS_PAR_ROWS)
        dsib_parallel_for(strm->inst->pool, n, hc_post_task, &j);
    else
        for (uint32_t t = 0; t < n; t++) hc_post_task(&j, t, 0);
    return DSI_OK;
}

/* ---- compressed attention ---------------------------------------------------------------- */

/* Pointer to candidate c's kv (or score) row for a row at position p of group w; NULL when
 * the position is outside what the state and the step hold. */
typedef struct pool_src {
    const dsib_state *rk, *rs;
    const float *ck, *cs;
    uint32_t ldc, slot, ratio, hd;
    int32_t overlap;
    int64_t pos0, first, count;
} pool_src;

static int pool_cand(const pool_src *P, int64_t w, uint32_t c, const float **k, const float **sc) {
    int lane_a = P->overlap && w > 0 && c < P->ratio;
    int64_t grp = lane_a ? w - 1 : w;
    uint32_t s = lane_a ? c : (P->overlap && w > 0 ? c - P->ratio : c);
    uint32_t off = P->overlap && !lane_a ? P->hd : 0;
    int64_t q = grp * P->ratio + s;
    if (q < P->pos0) {
        if (P->pos0 - q > (int64_t)P->rk->rows) return 0;
        uint64_t r = (uint64_t)q % P->rk->rows;
        *k = dsib_cpu_state_row(P->rk, P->slot, r) + off;
        *sc = dsib_cpu_state_row(P->rs, P->slot, r) + off;
    } else {
        if (q - P->pos0 >= P->count) return 0;
        *k = P->ck + (size_t)(P->first + q - P->pos0) * P->ldc + off;
        *sc = P->cs + (size_t)(P->first + q - P->pos0) * P->ldc + off;
    }
    return 1;
}

static dsi_status op_compress_pool(dsib_stream *strm, const dsib_state *ring_kv,
                                   const dsib_state *ring_sc, dsib_view kv, dsib_view sc,
                                   uint32_t ldc, dsib_view rows, uint32_t n, uint32_t ratio,
                                   int32_t overlap, uint32_t hd, dsib_view out, uint32_t ldo) {
    if (n == 0) return DSI_OK;
    uint32_t wi = (overlap ? 2u : 1u) * hd;
    dsi_status st = ratio == 0 || ratio > 4096 ? DSI_ERR_INVALID_ARGUMENT : DSI_OK;
    if (st == DSI_OK) st = dsib_cpu_state_check(ring_kv, wi);
    if (st == DSI_OK) st = dsib_cpu_state_check(ring_sc, wi);
    if (st == DSI_OK && (ring_kv->rows != ring_sc->rows || ring_kv->slots != ring_sc->slots))
        st = DSI_ERR_INVALID_ARGUMENT;
    if (st == DSI_OK) st = dsib_cpu_rows_check(rows, n, ring_kv->slots);
    if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    float *o = dsib_cpu_f32(out);
    for (uint32_t t = 0; t < n; t++) {
        const int32_t *r = dsib_cpu_row(rows, t);
        int64_t p = r[DSIB_ROW_POS];
        float *og = o + (size_t)t * ldo;
        if ((p + 1) % ratio != 0) {
            memset(og, 0, (size_t)hd * sizeof(float));
            continue;
        }
        int64_t w = (p + 1) / ratio - 1;
        pool_src P = {ring_kv, ring_sc, dsib_cpu_f32(kv), dsib_cpu_f32(sc), ldc,
                      (uint32_t)r[DSIB_ROW_SLOT], ratio, hd, overlap,
                      dsib_cpu_row(rows, (uint32_t)r[DSIB_ROW_FIRST])[DSIB_ROW_POS],
                      r[DSIB_ROW_FIRST], r[DSIB_ROW_COUNT]};
        uint32_t nc = overlap && w > 0 ? 2 * ratio : ratio;
        const float *k0, *s0;
        for (uint32_t c = 0; c < nc; c++)
            if (!pool_cand(&P, w, c, &k0, &s0)) return dsib_cpu_ret(strm, DSI_ERR_INTERNAL);
        /* per channel: max, then Σexp, then Σ p·kv over candidates in order (recomputing the
         * same exponentials gives the same values) */
        for (uint32_t j = 0; j < hd; j++) {
            pool_cand(&P, w, 0, &k0, &s0);
            float mx = s0[j];
            for (uint32_t c = 1; c < nc; c++) {
                pool_cand(&P, w, c, &k0, &s0);
                mx = s0[j] > mx ? s0[j] : mx;
            }
            float z = 0.0f;
            for (uint32_t c = 0; c < nc; c++) {
                pool_cand(&P, w, c, &k0, &s0);
                z += expf(s0[j] - mx);
            }
            float a = 0.0f;
            for (uint32_t c = 0; c < nc; c++) {
                pool_cand(&P, w, c, &k0, &s0);
                a += (expf(s0[j] - mx) / z) * k0[j];
            }
            og[j] = a;
        }
    }
    return DSI_OK;
}

static dsi_status op_add_rows_periodic(dsib_stream *strm, dsib_view x, uint32_t ldx,
                                       uint32_t n, uint32_t width, const dsib_weight *table,
                                       dsib_view rows, uint32_t period) {
    if (n == 0) return DSI_OK;
    if (period == 0 || table->ne[0] < (int64_t)width || dsib_cpu_rows_check(rows, n, 0) != DSI_OK)
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    /* ws: one dequantized table row */
    float *row = dsib_cpu_ws(strm, (size_t)table->ne[0] * sizeof(float));
    if (!row) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    float *p = dsib_cpu_f32(x);
    for (uint32_t t = 0; t < n; t++) {
        int64_t pos = dsib_cpu_row(rows, t)[DSIB_ROW_POS];
        dsi_status st = dsib_cpu_weight_row(table, 0, pos % period, row);
        if (st != DSI_OK) return dsib_cpu_ret(strm, st);
        float *v = p + (size_t)t * ldx;
        for (uint32_t i = 0; i < width; i++) v[i] += row[i];
    }
    return DSI_OK;
}

/* -- indexer -- */

typedef struct idx_job {
    const float *q, *w;
    const dsib_state *keys;
    const int32_t *rows;
    uint32_t ldq, ldw, heads, hd, ratio, topk, n;
    int32_t *idx;
    float *scratch;      /* [threads][max_rows] scores (chunked: [rows][max_rows]) */
    int64_t max_rows;
    int64_t n_chunks;    /* chunked scan: IDX4_CHUNK-key chunks per row */
} idx_job;

/* Selects the k best of sc[0..m) (higher score first, ties: lower index first) into out[],
 * then sorts out[] ascending. A binary heap of the current k best keyed by (score, -index):
 * the root is the worst kept candidate. */
static int better(float a, int32_t ia, float b, int32_t ib) {
    return a > b || (a == b && ia < ib);
}
static void heap_down(int32_t *h, uint32_t k, const float *sc, uint32_t i) {
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < k && better(sc[h[m]], h[m], sc[h[l]], h[l])) m = l;
        if (r < k && better(sc[h[m]], h[m], sc[h[r]], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}
static int cmp_i32(const void *a, const void *b, void *user) {
    (void)user;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
static void topk_select(const float *sc, int64_t m, uint32_t k, int32_t *heap) {
    for (uint32_t i = 0; i < k; i++) heap[i] = (int32_t)i;
    for (int32_t i = (int32_t)k / 2 - 1; i >= 0; i--) heap_down(heap, k, sc, (uint32_t)i);
    for (int64_t c = k; c < m; c++) {
        if (better(sc[c], (int32_t)c, sc[heap[0]], heap[0])) {
            heap[0] = (int32_t)c;
            heap_down(heap, k, sc, 0);
        }
    }
    dsii_sort(heap, k, sizeof(int32_t), cmp_i32, NULL); /* qsort may malloc outside the hooks */
}

/* Keys row t sees. */
static int64_t idx_nvis(const idx_job *j, int64_t t) {
    return (j->rows[(size_t)t * DSIB_ROW_WORDS + DSIB_ROW_POS] + 1) / j->ratio;
}

/* Scores of row t's keys [c0, c1) (c1 clamped to the visible ones) into sc[]. */
static void idx_scores(const idx_job *j, int64_t t, int64_t c0, int64_t c1, float *sc) {
    const int32_t *r = j->rows + (size_t)t * DSIB_ROW_WORDS;
    const int64_t nvis = idx_nvis(j, t);
    if (c1 > nvis) c1 = nvis;
    const float *q = j->q + (size_t)t * j->ldq, *w = j->w + (size_t)t * j->ldw;
    const uint8_t *keys = dsib_cpu_state_bytes(j->keys, (uint32_t)r[DSIB_ROW_SLOT], 0);
    const uint64_t krb = dsib_cpu_state_rb(j->keys);
    const int packed = j->keys->format != DSIB_STATE_F32;
    if (c0 < c1 && dsib_cpu_indexer_v4_scan(j->keys, j->heads, j->hd, q, w, keys, (uint32_t)c0,
                                            (uint32_t)c1, sc))
        return; /* AVX-512, packed E2M1 keys: the same bits */
    float kbuf[DSIB_CPU_MAX_KEY];
    for (int64_t c = c0; c < c1; c++) {
        const float *k = (const float *)(const void *)(keys + (uint64_t)c * krb);
        if (packed) { /* one key, decoded once for every head (statepack.h: exact) */
            dsii_sp_unpack_row(j->keys->format, j->hd, j->keys->qcols, j->keys->block,
                               keys + (uint64_t)c * krb, kbuf);
            k = kbuf;
        }
        float s = 0.0f;
        for (uint32_t h = 0; h < j->heads; h++) {
            const float *qh = q + (size_t)h * j->hd;
            float d = dot_fixed(qh, k, j->hd);
            if (d < 0.0f) d = 0.0f;
            s += d * w[h];
        }
        sc[c] = s;
    }
}

/* Tests: V4's indexer scores of keys [c0, c1) at position p of slot 0, by the path the op
 * takes (ops_v41.h dsib_cpu_indexer_v4_scan where it can run). */
void dsib_cpu_indexer_v4_scores(const float *q, const float *w, const dsib_state *keys,
                                uint32_t heads, uint32_t hd, int64_t c0, int64_t c1, float *score) {
    int32_t row[DSIB_ROW_WORDS] = {0};
    row[DSIB_ROW_POS] = (int32_t)c1 - 1;
    row[DSIB_ROW_COUNT] = 1;
    idx_job j;
    memset(&j, 0, sizeof j);
    j.q = q, j.w = w, j.keys = keys, j.rows = row, j.heads = heads, j.hd = hd, j.ratio = 1;
    idx_scores(&j, 0, c0, c1, score);
}

/* Row t's top-k: every visible key when there are no more than k. */
static int idx_few(const idx_job *j, int64_t t) {
    const int64_t nvis = idx_nvis(j, t);
    int32_t *out = j->idx + (size_t)t * j->topk;
    if (nvis > (int64_t)j->topk) return 0;
    for (uint32_t i = 0; i < j->topk; i++) out[i] = i < nvis ? (int32_t)i : -1;
    return 1;
}

static void idx_task(void *arg, int64_t t, int32_t slot) {
    idx_job *j = arg;
    if (idx_few(j, t)) return;
    float *sc = j->scratch + (size_t)slot * j->max_rows;
    idx_scores(j, t, 0, INT64_MAX, sc);
    topk_select(sc, idx_nvis(j, t), j->topk, j->idx + (size_t)t * j->topk);
}

/* Steps with fewer rows than threads over many keys (decode): the scan in IDX4_CHUNK-key
 * chunks over the threads, scores per row (scratch row t), then one selection per row. A
 * key's score does not depend on the chunk that computed it. */
#define IDX4_CHUNK 1024
static void idx_chunk_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    idx_job *j = arg;
    const int64_t t = task / j->n_chunks, c0 = (task % j->n_chunks) * IDX4_CHUNK;
    if (idx_nvis(j, t) <= (int64_t)j->topk) return; /* idx_select_task's */
    idx_scores(j, t, c0, c0 + IDX4_CHUNK, j->scratch + (size_t)t * j->max_rows);
}
static void idx_select_task(void *arg, int64_t t, int32_t slot) {
    (void)slot;
    idx_job *j = arg;
    if (idx_few(j, t)) return;
    topk_select(j->scratch + (size_t)t * j->max_rows, idx_nvis(j, t), j->topk,
                j->idx + (size_t)t * j->topk);
}

/* Largest position + 1 of the step rows (rows already checked). */
static int64_t rows_max_pos(dsib_view rows, uint32_t n) {
    int64_t m = 0;
    for (uint32_t t = 0; t < n; t++) {
        int64_t p = dsib_cpu_row(rows, t)[DSIB_ROW_POS] + 1;
        if (p > m) m = p;
    }
    return m;
}

static dsi_status op_indexer_topk(dsib_stream *strm, dsib_view q, uint32_t ldq, dsib_view w,
                                  uint32_t ldw, const dsib_state *keys, uint32_t heads,
                                  uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                                  uint32_t topk, dsib_view idx) {
    dsib_instance *inst = strm->inst;
    if (n == 0) return DSI_OK;
    dsi_status st = ratio == 0 || topk == 0 ? DSI_ERR_INVALID_ARGUMENT : DSI_OK;
    if (st == DSI_OK) st = dsib_cpu_state_check_packed(keys, hd);
    if (st == DSI_OK && keys->format != DSIB_STATE_F32 && hd > DSIB_CPU_MAX_KEY)
        st = DSI_ERR_UNSUPPORTED;
    if (st == DSI_OK) st = dsib_cpu_rows_check(rows, n, keys->slots);
    if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    int64_t maxp = rows_max_pos(rows, n);
    if (maxp / ratio > (int64_t)keys->rows) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    idx_job j = {dsib_cpu_f32(q), dsib_cpu_f32(w), keys, dsib_cpu_i32(rows), ldq, ldw, heads, hd,
                 ratio, topk, n, dsib_cpu_i32(idx), NULL, 0, 0};
    j.max_rows = maxp / ratio + 1;
    int32_t nt = dsib_threadpool_n_threads(inst->pool);
    /* ws: per thread max_rows scores */
    j.scratch = dsib_cpu_ws(strm, sizeof(float) * (size_t)j.max_rows * (size_t)nt);
    if (!j.scratch) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    if (nt > 1 && (int32_t)n < nt && j.max_rows > 2 * IDX4_CHUNK) {
        j.n_chunks = (j.max_rows + IDX4_CHUNK - 1) / IDX4_CHUNK;
        dsib_parallel_for(inst->pool, (int64_t)n * j.n_chunks, idx_chunk_task, &j);
        dsib_parallel_for(inst->pool, n, idx_select_task, &j);
        return DSI_OK;
    }
    dsib_parallel_for(inst->pool, n, idx_task, &j);
    return DSI_OK;
}

/* -- sink attention -- */

typedef struct attn_job {
    const float *q, *kv, *sinks;
    const dsib_state *ring, *comp;
    const int32_t *rows, *idx;
    float *zs;                       /* per slot: 8 × max_rows scores */
    const float **ps;                /* per slot: max_rows row pointers */
    float *out;
    uint8_t *fs;         /* per slot: max_rows row formats: 0 f32, 1 packed ring, 2 packed comp */
    float *dec;          /* multi-row steps with packed state, where the workspace holds it: per
                            slot max_rows × hd decoded rows (else NULL: heads read in place) */
    uint32_t ldq, H, hd, window, ldkv, comp_ratio, topk, ldo;
    uint32_t hg;                     /* heads per task (a multiple of 4, or 1) */
    int simd;                        /* the AVX2 head-group path (hd % 8 == 0) */
    int simd512;                     /* the AVX-512 eight-head path (hd % 32 == 0, <= 512) */
    int unpack512;                   /* packed rows decoded by attn_unpack_row_avx512 */
    int unpack256;                   /* else by attn_unpack_row_avx2 */
    int64_t max_rows;
    float scale;
    atomic_ullong *flops;            /* the instance's stat_attn_flops */
} attn_job;

/* The visible rows of step row t in canonical order: compressed (ascending), then window
 * (ascending); fm[i]: 0 f32 row, 1 packed ring row, 2 packed compressed row. */
static int64_t attn_rows(const attn_job *j, uint32_t t, const float **rp, uint8_t *fm) {
    const int32_t *r = j->rows + (size_t)t * DSIB_ROW_WORDS;
    int64_t p = r[DSIB_ROW_POS];
    uint32_t sl = (uint32_t)r[DSIB_ROW_SLOT];
    int64_t first = r[DSIB_ROW_FIRST];
    int64_t pos0 = j->rows[(size_t)first * DSIB_ROW_WORDS + DSIB_ROW_POS];
    int64_t nr = 0;
    if (j->comp_ratio > 0) {
        const uint8_t *comp = dsib_cpu_state_bytes(j->comp, sl, 0);
        const uint64_t crb = dsib_cpu_state_rb(j->comp);
        const uint8_t cf = j->comp->format != DSIB_STATE_F32 ? 2 : 0;
        if (j->idx) {
            const int32_t *ix = j->idx + (size_t)t * j->topk;
            for (uint32_t k = 0; k < j->topk; k++)
                if (ix[k] >= 0) {
                    fm[nr] = cf;
                    rp[nr++] = (const float *)(const void *)(comp + (uint64_t)ix[k] * crb);
                }
        } else {
            int64_t nv = (p + 1) / j->comp_ratio;
            for (int64_t c = 0; c < nv; c++) {
                fm[nr] = cf;
                rp[nr++] = (const float *)(const void *)(comp + (uint64_t)c * crb);
            }
        }
    }
    int64_t w0 = p - (int64_t)j->window + 1;
    if (w0 < 0) w0 = 0;
    const uint8_t rf = j->ring->format != DSIB_STATE_F32 ? 1 : 0;
    for (int64_t qp = w0; qp <= p; qp++) {
        if (qp < pos0) {
            fm[nr] = rf;
            rp[nr++] = (const float *)(const void *)dsib_cpu_state_bytes(
                j->ring, sl, (uint64_t)qp % j->ring->rows);
        } else {
            fm[nr] = 0;
            rp[nr++] = j->kv + (size_t)(first + qp - pos0) * j->ldkv;
        }
    }
    return nr;
}

/* Attention's exp, vectorisable with the same bits in every ISA path (libm's expf is not): x = n·ln2 + r with
 * n = rint(x·log2 e) (round to nearest even), r by two fused multiply-adds with ln 2 split in
 * a 9-bit head and its tail, e^r by the degree-7 Taylor polynomial in Horner form (fused
 * multiply-adds; truncation below 5e-9 on |r| <= ln2/2), times 2^n built in the exponent
 * field. Below -87 (where 2^n would leave the normal range) the result is 0, above 88 it is
 * e^88, for NaN 0: softmax arguments are <= 0. Within 2 ulp of e^x elsewhere (test_v4_ops:
 * 0.87 at worst on a 1/1024 grid). The vector
 * versions in the AVX2 / AVX-512 regions perform these operations lane by lane. */
#define ATTN_EXP_LO -87.0f
#define ATTN_EXP_HI 88.0f
#define ATTN_LOG2E 1.44269504088896341f
#define ATTN_LN2_HI 0.693359375f
#define ATTN_LN2_LO -2.12194440e-4f
static const float attn_exp_c[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                    1.0f / 6,    0.5f,       1.0f,       1.0f};
static inline float attn_exp(float x) {
    if (!(x >= ATTN_EXP_LO)) return 0.0f; /* and NaN */
    if (x > ATTN_EXP_HI) x = ATTN_EXP_HI;
    const float n = rintf(x * ATTN_LOG2E);
    float r = fmaf(n, -ATTN_LN2_HI, x);
    r = fmaf(n, -ATTN_LN2_LO, r);
    float p = attn_exp_c[0];
    for (int k = 1; k < 8; k++) p = fmaf(p, r, attn_exp_c[k]);
    const int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}

/* Tests: attn_exp as the CPU backend computes it (the scalar code). */
float dsib_cpu_attn_exp(float x) { return attn_exp(x); }

/* Softmax weights of heads h .. h+G-1, scores z[g·nr + r]: m = max(sink, scores),
 * z ← attn_exp(z − m), den[g] = attn_exp(sink − m) + the lane tree of eight lanes, lane l
 * summing the rows r ≡ l (mod 8) in row order — the operations of the vector versions. */
static void attn_softmax_heads(const attn_job *j, uint32_t h, int G, float *z, int64_t nr,
                               float *den) {
    for (int g = 0; g < G; g++) {
        float *zg = z + (size_t)g * nr, mg = j->sinks[h + (uint32_t)g];
        for (int64_t r = 0; r < nr; r++)
            if (zg[r] > mg) mg = zg[r];
        float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t r = 0; r < nr; r++) {
            const float e = attn_exp(zg[r] - mg);
            l[r & 7] += e;
            zg[r] = e;
        }
        den[g] = attn_exp(j->sinks[h + (uint32_t)g] - mg) + tree8(l);
    }
}

/* One head, the reference order: scores dot_fma · scale, softmax weights
 * (attn_softmax_heads), o = (Σ_i e_i v_i in row order, one fused multiply-add per term) / den. */
static void attn_head_scalar(const attn_job *j, uint32_t t, uint32_t h, const float *const *rp,
                             int64_t nr, float *z) {
    const float *q = j->q + (size_t)t * j->ldq + (size_t)h * j->hd;
    for (int64_t i = 0; i < nr; i++) z[i] = dot_fma(q, rp[i], j->hd) * j->scale;
    float den;
    attn_softmax_heads(j, h, 1, z, nr, &den);
    float *o = j->out + (size_t)t * j->ldo + (size_t)h * j->hd;
    for (uint32_t i = 0; i < j->hd; i++) o[i] = 0.0f;
    for (int64_t i = 0; i < nr; i++) {
        const float e = z[i], *v = rp[i];
        for (uint32_t k = 0; k < j->hd; k++) o[k] = fmaf(e, v[k], o[k]);
    }
    for (uint32_t i = 0; i < j->hd; i++) o[i] /= den;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSIB_OPS_X86 1
/* AVX2 + FMA (the kernels' AVX2 level requires FMA): the fused multiply-adds of the scalar
 * code's fmaf, in the same lanes and order; no other contraction (fp-contract off) */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("fp-contract=off")
#endif
#include <immintrin.h>

/* ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): dot_fixed's lane tree. */
static inline float attn_tree8(__m256 a) {
    __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
    __m128 p = _mm_hadd_ps(lo, hi);   /* l0+l1, l2+l3, l4+l5, l6+l7 */
    __m128 q = _mm_hadd_ps(p, p);     /* (l0+l1)+(l2+l3), (l4+l5)+(l6+l7), ... */
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

/* attn_exp on eight lanes: the scalar code's operations lane by lane (NaN and x < -87: 0). */
static inline __m256 attn_exp8(__m256 x) {
    const __m256 zero = _mm256_cmp_ps(x, _mm256_set1_ps(ATTN_EXP_LO), _CMP_NGE_UQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(ATTN_EXP_HI));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ATTN_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ATTN_LN2_LO), r);
    __m256 p = _mm256_set1_ps(attn_exp_c[0]);
    for (int k = 1; k < 8; k++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(attn_exp_c[k]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Lanes l < k set (k in 0..8). */
static inline __m256i attn_mask8(int64_t k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* attn_softmax_heads eight rows at a time: the same maximum, the same attn_exp values, the
 * same eight lanes (rows r ≡ l mod 8 in row order; the last partial group adds +0 to the
 * lanes it does not reach) and the same tree. */
static void attn_softmax_heads_avx2(const attn_job *j, uint32_t h, int G, float *z, int64_t nr,
                                    float *den) {
    for (int g = 0; g < G; g++) {
        float *zg = z + (size_t)g * nr;
        const float sink = j->sinks[h + (uint32_t)g];
        __m256 mv = _mm256_set1_ps(sink);
        int64_t r = 0;
        for (; r + 8 <= nr; r += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(zg + r));
        float l[8], mg;
        _mm256_storeu_ps(l, mv);
        mg = l[0];
        for (int k = 1; k < 8; k++)
            if (l[k] > mg) mg = l[k];
        for (; r < nr; r++)
            if (zg[r] > mg) mg = zg[r];
        const __m256 mb = _mm256_set1_ps(mg);
        __m256 acc = _mm256_setzero_ps();
        for (r = 0; r + 8 <= nr; r += 8) {
            const __m256 e = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(zg + r), mb));
            _mm256_storeu_ps(zg + r, e);
            acc = _mm256_add_ps(acc, e);
        }
        if (r < nr) {
            const __m256i mk = attn_mask8(nr - r);
            const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(mk),
                                           attn_exp8(_mm256_sub_ps(_mm256_maskload_ps(zg + r, mk), mb)));
            _mm256_maskstore_ps(zg + r, mk, e);
            acc = _mm256_add_ps(acc, e);
        }
        _mm256_storeu_ps(l, acc);
        den[g] = attn_exp(sink - mg) + tree8(l);
    }
}

/* Four heads h .. h+3 of step row t with the same operations per head as attn_head_scalar
 * (hd a multiple of 8: dot_fixed's lanes are the 8 lanes of one vector). z: 4 × nr. */
static void attn_heads4_avx2(const attn_job *j, uint32_t t, uint32_t h, const float *const *rp,
                             int64_t nr, float *z) {
    const uint32_t hd = j->hd;
    const float *q0 = j->q + (size_t)t * j->ldq + (size_t)h * hd;
    const float *q1 = q0 + hd, *q2 = q1 + hd, *q3 = q2 + hd;
    float *z0 = z, *z1 = z + nr, *z2 = z + 2 * nr, *z3 = z + 3 * nr;
    int64_t i = 0;
    for (; i + 2 <= nr; i += 2) { /* two rows × four heads: eight independent chains */
        const float *ka = rp[i], *kb = rp[i + 1];
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (uint32_t c = 0; c < hd; c += 8) {
            const __m256 x0 = _mm256_loadu_ps(q0 + c), x1 = _mm256_loadu_ps(q1 + c);
            const __m256 x2 = _mm256_loadu_ps(q2 + c), x3 = _mm256_loadu_ps(q3 + c);
            const __m256 ya = _mm256_loadu_ps(ka + c), yb = _mm256_loadu_ps(kb + c);
            a0 = _mm256_fmadd_ps(x0, ya, a0);
            a1 = _mm256_fmadd_ps(x1, ya, a1);
            a2 = _mm256_fmadd_ps(x2, ya, a2);
            a3 = _mm256_fmadd_ps(x3, ya, a3);
            b0 = _mm256_fmadd_ps(x0, yb, b0);
            b1 = _mm256_fmadd_ps(x1, yb, b1);
            b2 = _mm256_fmadd_ps(x2, yb, b2);
            b3 = _mm256_fmadd_ps(x3, yb, b3);
        }
        z0[i] = attn_tree8(a0) * j->scale;
        z1[i] = attn_tree8(a1) * j->scale;
        z2[i] = attn_tree8(a2) * j->scale;
        z3[i] = attn_tree8(a3) * j->scale;
        z0[i + 1] = attn_tree8(b0) * j->scale;
        z1[i + 1] = attn_tree8(b1) * j->scale;
        z2[i + 1] = attn_tree8(b2) * j->scale;
        z3[i + 1] = attn_tree8(b3) * j->scale;
    }
    for (; i < nr; i++) {
        const float *ka = rp[i];
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t c = 0; c < hd; c += 8) {
            const __m256 ya = _mm256_loadu_ps(ka + c);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + c), ya, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + c), ya, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + c), ya, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + c), ya, a3);
        }
        z0[i] = attn_tree8(a0) * j->scale;
        z1[i] = attn_tree8(a1) * j->scale;
        z2[i] = attn_tree8(a2) * j->scale;
        z3[i] = attn_tree8(a3) * j->scale;
    }
    float den[4];
    attn_softmax_heads_avx2(j, h, 4, z, nr, den);
    /* o_g = (Σ_r e_g,r · v_r) / den_g: 16 columns × 4 heads in registers per pass */
    float *o0 = j->out + (size_t)t * j->ldo + (size_t)h * hd;
    for (uint32_t c = 0; c < hd; c += 16) {
        __m256 s00 = _mm256_setzero_ps(), s01 = s00, s10 = s00, s11 = s00;
        __m256 s20 = s00, s21 = s00, s30 = s00, s31 = s00;
        for (int64_t r = 0; r < nr; r++) {
            const float *v = rp[r] + c;
            const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
            const __m256 e0 = _mm256_broadcast_ss(z0 + r), e1 = _mm256_broadcast_ss(z1 + r);
            const __m256 e2 = _mm256_broadcast_ss(z2 + r), e3 = _mm256_broadcast_ss(z3 + r);
            s00 = _mm256_fmadd_ps(e0, v0, s00);
            s01 = _mm256_fmadd_ps(e0, v1, s01);
            s10 = _mm256_fmadd_ps(e1, v0, s10);
            s11 = _mm256_fmadd_ps(e1, v1, s11);
            s20 = _mm256_fmadd_ps(e2, v0, s20);
            s21 = _mm256_fmadd_ps(e2, v1, s21);
            s30 = _mm256_fmadd_ps(e3, v0, s30);
            s31 = _mm256_fmadd_ps(e3, v1, s31);
        }
        const __m256 d0 = _mm256_set1_ps(den[0]), d1 = _mm256_set1_ps(den[1]);
        const __m256 d2 = _mm256_set1_ps(den[2]), d3 = _mm256_set1_ps(den[3]);
        float *o1 = o0 + hd, *o2 = o1 + hd, *o3 = o2 + hd;
        _mm256_storeu_ps(o0 + c, _mm256_div_ps(s00, d0));
        _mm256_storeu_ps(o0 + c + 8, _mm256_div_ps(s01, d0));
        _mm256_storeu_ps(o1 + c, _mm256_div_ps(s10, d1));
        _mm256_storeu_ps(o1 + c + 8, _mm256_div_ps(s11, d1));
        _mm256_storeu_ps(o2 + c, _mm256_div_ps(s20, d2));
        _mm256_storeu_ps(o2 + c + 8, _mm256_div_ps(s21, d2));
        _mm256_storeu_ps(o3 + c, _mm256_div_ps(s30, d3));
        _mm256_storeu_ps(o3 + c + 8, _mm256_div_ps(s31, d3));
    }
}

/* attn_unpack_row_avx512's AVX2 form: every value the product of its code's value and its
 * block's scale, rounded once, like dsii_sp_unpack_row, so the bits equal its but for the
 * sign of a zero (below).
 *  - E4M3: a code's seven low bits shifted into a half float's exponent and mantissa, the
 *    sign moved up, are the code's value / 256 exactly (normal and subnormal codes alike:
 *    E4M3's bias is 7, the half's 15); 0x7F / 0xFF (NaN, read as ±448) become ±1.75.
 *    F16C converts 8 at a time; the product with 256 · scale (exact while the scale's
 *    exponent byte is at most 246, else two products, the first exact) is the value × scale.
 *  - E2M1: a byte shuffle maps each nibble to twice its value (an integer in −12..12); that
 *    times half the scale (exact: E4M3 scales and powers of two, 2^-127's half included).
 *    Code 8 (−0) gives +0, which no attention sum can see: they all start at +0, and
 *    x + (±0) = x for every x but +0, where it is +0 either way (test_v4_ops
 *    test_attn_unpack_simd checks every code and scale against dsii_sp_unpack_row).
 * On the Zen 3 guest (one core, 256 rows of 512 hot): E4M3 with 32-wide blocks 69 ns a
 * row, E2M1 with 16-wide ones 77, against 102 and 110 with the earlier per-8 arithmetic
 * decode and table permutes (and 226 / 257 for dsii_sp_unpack_row). Block sizes that are
 * not a multiple of 16 take dsii_sp_unpack_row. */
static void attn_unpack_row_avx2(int32_t format, uint32_t width, uint32_t qcols, uint32_t block,
                                 const uint8_t *src, float *dst) {
    if (format == DSII_SP_F32 || block % 16 != 0) {
        dsii_sp_unpack_row(format, width, qcols, block, src, dst);
        return;
    }
    if (format == DSII_SP_E4M3_UE8M0) {
        const __m256i m7f = _mm256_set1_epi16(0x7F), m8000 = _mm256_set1_epi16((short)0x8000);
        const __m256i nan_h = _mm256_set1_epi16(0x3F00); /* 1.75 = 448 / 256 */
        for (uint32_t b = 0; b < qcols / block; b++) {
            const uint8_t e = src[dsii_sp_codes_bytes(format, qcols) + b];
            const float sc = dsii_sp_scale(format, qcols, src, b);
            const int one = e <= 246; /* 256 · scale exact */
            const __m256 s = _mm256_set1_ps(one ? sc * 256.0f : sc), k256 = _mm256_set1_ps(256.0f);
            for (uint32_t i = b * block; i < (b + 1) * block; i += 16) {
                const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
                const __m256i mag = _mm256_and_si256(w, m7f);
                const __m256i sgn = _mm256_and_si256(_mm256_slli_epi16(w, 8), m8000);
                __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7), sgn);
                h = _mm256_blendv_epi8(h, _mm256_or_si256(sgn, nan_h), _mm256_cmpeq_epi16(mag, m7f));
                __m256 v0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                __m256 v1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
                if (!one) {
                    v0 = _mm256_mul_ps(v0, k256);
                    v1 = _mm256_mul_ps(v1, k256);
                }
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(v0, s));
                _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(v1, s));
            }
        }
    } else {
        const __m128i twice = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m128i lo4 = _mm_set1_epi8(0x0F);
        for (uint32_t b = 0; b < qcols / block; b++) {
            const __m256 hs = _mm256_set1_ps(dsii_sp_scale(format, qcols, src, b) * 0.5f);
            for (uint32_t i = b * block; i < (b + 1) * block; i += 16) {
                const __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(src + i / 2));
                const __m128i lo = _mm_shuffle_epi8(twice, _mm_and_si128(x, lo4));
                const __m128i hi = _mm_shuffle_epi8(twice, _mm_and_si128(_mm_srli_epi16(x, 4), lo4));
                const __m128i v = _mm_unpacklo_epi8(lo, hi); /* 2i low nibble, 2i+1 high */
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), hs));
                _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                                _mm_srli_si128(v, 8))), hs));
            }
        }
    }
    if (qcols < width)
        memcpy(dst + qcols, src + dsii_sp_tail_offset(format, qcols, block), (size_t)(width - qcols) * 4);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* AVX-512 (the same fused multiply-adds): eight heads per call, the same operations per head as
 * attn_head_scalar. Scores: one zmm holds two heads' 8 dot_fixed lanes side by side (the
 * queries interleaved once per call into qx), the K row chunk broadcast to both halves; each
 * half is then dot_fixed's lane tree. Outputs: 32 columns × 8 heads in registers per pass,
 * each column the scalar path's row-order sum. hd % 32 == 0, hd <= ATTN8_MAX_HD. */
#define ATTN8_MAX_HD 512
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl,avx512bw"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512dq,avx512vl,avx512bw")
#pragma GCC optimize("fp-contract=off")
#endif

/* attn_exp on sixteen lanes (attn_exp8's operations). */
static inline __m512 attn_exp16(__m512 x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(ATTN_EXP_LO), _CMP_GE_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(ATTN_EXP_HI));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ATTN_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-ATTN_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-ATTN_LN2_LO), r);
    __m512 p = _mm512_set1_ps(attn_exp_c[0]);
    for (int k = 1; k < 8; k++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(attn_exp_c[k]));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

/* attn_softmax_heads sixteen rows at a time: exps on sixteen lanes, the two halves added to
 * the eight lanes one after the other (rows r ≡ l mod 8 in row order, as the scalar code). */
static void attn_softmax_heads_avx512(const attn_job *j, uint32_t h, int G, float *z, int64_t nr,
                                      float *den) {
    for (int g = 0; g < G; g++) {
        float *zg = z + (size_t)g * nr;
        const float sink = j->sinks[h + (uint32_t)g];
        __m512 mv = _mm512_set1_ps(sink);
        int64_t r = 0;
        for (; r + 16 <= nr; r += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(zg + r));
        if (r < nr) mv = _mm512_mask_max_ps(mv, (__mmask16)((1u << (nr - r)) - 1u), mv,
                                            _mm512_maskz_loadu_ps((__mmask16)((1u << (nr - r)) - 1u), zg + r));
        const float mg = _mm512_reduce_max_ps(mv);
        const __m512 mb = _mm512_set1_ps(mg);
        __m256 acc = _mm256_setzero_ps();
        for (r = 0; r < nr; r += 16) {
            const __mmask16 mk = nr - r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nr - r)) - 1u);
            const __m512 e = _mm512_maskz_mov_ps(mk, attn_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, zg + r), mb)));
            _mm512_mask_storeu_ps(zg + r, mk, e);
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
            acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
        }
        float l[8];
        _mm256_storeu_ps(l, acc);
        den[g] = attn_exp(sink - mg) + tree8(l);
    }
}

static void attn_heads8_avx512(const attn_job *j, uint32_t t, uint32_t h, const float *const *rp,
                               int64_t nr, float *z) {
    const uint32_t hd = j->hd;
    const float *q = j->q + (size_t)t * j->ldq + (size_t)h * hd;
    /* qx[c / 8][p] = heads 2p (low half) and 2p + 1 (high half), elements c .. c + 7 */
    __m512 qx[ATTN8_MAX_HD / 8][4];
    for (uint32_t c = 0; c < hd; c += 8)
        for (int p = 0; p < 4; p++)
            qx[c / 8][p] = _mm512_insertf32x8(
                _mm512_castps256_ps512(_mm256_loadu_ps(q + (size_t)(2 * p) * hd + c)),
                _mm256_loadu_ps(q + (size_t)(2 * p + 1) * hd + c), 1);
    int64_t i = 0;
    for (; i + 2 <= nr; i += 2) { /* two rows × eight heads: eight independent chains */
        const float *ka = rp[i], *kb = rp[i + 1];
        __m512 a[4], b[4];
        for (int p = 0; p < 4; p++) a[p] = b[p] = _mm512_setzero_ps();
        for (uint32_t c = 0; c < hd; c += 8) {
            const __m512 ya = _mm512_broadcast_f32x8(_mm256_loadu_ps(ka + c));
            const __m512 yb = _mm512_broadcast_f32x8(_mm256_loadu_ps(kb + c));
            for (int p = 0; p < 4; p++) {
                a[p] = _mm512_fmadd_ps(qx[c / 8][p], ya, a[p]);
                b[p] = _mm512_fmadd_ps(qx[c / 8][p], yb, b[p]);
            }
        }
        for (int p = 0; p < 4; p++) {
            z[(size_t)(2 * p) * nr + i] = attn_tree8(_mm512_castps512_ps256(a[p])) * j->scale;
            z[(size_t)(2 * p + 1) * nr + i] = attn_tree8(_mm512_extractf32x8_ps(a[p], 1)) * j->scale;
            z[(size_t)(2 * p) * nr + i + 1] = attn_tree8(_mm512_castps512_ps256(b[p])) * j->scale;
            z[(size_t)(2 * p + 1) * nr + i + 1] =
                attn_tree8(_mm512_extractf32x8_ps(b[p], 1)) * j->scale;
        }
    }
    for (; i < nr; i++) {
        const float *ka = rp[i];
        __m512 a[4];
        for (int p = 0; p < 4; p++) a[p] = _mm512_setzero_ps();
        for (uint32_t c = 0; c < hd; c += 8) {
            const __m512 ya = _mm512_broadcast_f32x8(_mm256_loadu_ps(ka + c));
            for (int p = 0; p < 4; p++) a[p] = _mm512_fmadd_ps(qx[c / 8][p], ya, a[p]);
        }
        for (int p = 0; p < 4; p++) {
            z[(size_t)(2 * p) * nr + i] = attn_tree8(_mm512_castps512_ps256(a[p])) * j->scale;
            z[(size_t)(2 * p + 1) * nr + i] = attn_tree8(_mm512_extractf32x8_ps(a[p], 1)) * j->scale;
        }
    }
    float den[8];
    attn_softmax_heads_avx512(j, h, 8, z, nr, den);
    float *o = j->out + (size_t)t * j->ldo + (size_t)h * hd;
    for (uint32_t c = 0; c < hd; c += 32) {
        __m512 s[8][2];
        for (int g = 0; g < 8; g++) s[g][0] = s[g][1] = _mm512_setzero_ps();
        for (int64_t r = 0; r < nr; r++) {
            const __m512 v0 = _mm512_loadu_ps(rp[r] + c), v1 = _mm512_loadu_ps(rp[r] + c + 16);
            for (int g = 0; g < 8; g++) {
                const __m512 e = _mm512_set1_ps(z[(size_t)g * nr + r]);
                s[g][0] = _mm512_fmadd_ps(e, v0, s[g][0]);
                s[g][1] = _mm512_fmadd_ps(e, v1, s[g][1]);
            }
        }
        for (int g = 0; g < 8; g++) {
            const __m512 d = _mm512_set1_ps(den[g]);
            _mm512_storeu_ps(o + (size_t)g * hd + c, _mm512_div_ps(s[g][0], d));
            _mm512_storeu_ps(o + (size_t)g * hd + c + 16, _mm512_div_ps(s[g][1], d));
        }
    }
}

/* One packed state row (statepack.h) into width f32 values, 16 at a time: the codes index
 * the same tables dsii_sp_unpack_row reads (E4M3: a gather from dsii_sp_e4m3_lut; E2M1: a
 * permute of the 16-entry dsii_sp_e2m1_lut) and each value is multiplied by its block's scale,
 * the same exact product, so the bits equal dsii_sp_unpack_row's. Block sizes that are not a
 * multiple of 16 take dsii_sp_unpack_row. */
static void attn_unpack_row_avx512(int32_t format, uint32_t width, uint32_t qcols, uint32_t block,
                                   const uint8_t *src, float *dst) {
    if (format == DSII_SP_F32 || block % 16 != 0) {
        dsii_sp_unpack_row(format, width, qcols, block, src, dst);
        return;
    }
    if (format == DSII_SP_E4M3_UE8M0) {
        for (uint32_t b = 0; b < qcols / block; b++) {
            const __m512 s = _mm512_set1_ps(dsii_sp_scale(format, qcols, src, b));
            for (uint32_t i = b * block; i < (b + 1) * block; i += 16) {
                const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
                _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_i32gather_ps(c, dsii_sp_e4m3_lut, 4), s));
            }
        }
    } else {
        const __m512 lut = _mm512_loadu_ps(dsii_sp_e2m1_lut);
        const __m128i lo4 = _mm_set1_epi8(0x0F);
        for (uint32_t b = 0; b < qcols / block; b++) {
            const __m512 s = _mm512_set1_ps(dsii_sp_scale(format, qcols, src, b));
            for (uint32_t i = b * block; i < (b + 1) * block; i += 16) {
                const __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(src + i / 2));
                const __m128i lo = _mm_and_si128(x, lo4), hi = _mm_and_si128(_mm_srli_epi16(x, 4), lo4);
                const __m512i c = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)); /* 2i low, 2i+1 high */
                _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_permutexvar_ps(c, lut), s));
            }
        }
    }
    if (qcols < width)
        memcpy(dst + qcols, src + dsii_sp_tail_offset(format, qcols, block), (size_t)(width - qcols) * 4);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* x86 */

/* One head of step row t whose visible rows include packed ones (fm[i] != 0, statepack.h):
 * read in place, decoded 8 values at a time into the lanes the f32 path uses, so the result
 * is bit-identical to attn_head_scalar on f32 storage. */
static void attn_head_packed(const attn_job *j, uint32_t t, uint32_t h, const float *const *rp,
                             const uint8_t *fm, int64_t nr, float *z) {
    const float *q = j->q + (size_t)t * j->ldq + (size_t)h * j->hd;
    const dsib_state *sts[3] = {NULL, j->ring, j->comp};
    for (int64_t i = 0; i < nr; i++) {
        float d = fm[i] ? dot_fma_packed(q, (const uint8_t *)(const void *)rp[i], sts[fm[i]], j->hd)
                        : dot_fma(q, rp[i], j->hd);
        z[i] = d * j->scale;
    }
    float den;
    attn_softmax_heads(j, h, 1, z, nr, &den);
    float *o = j->out + (size_t)t * j->ldo + (size_t)h * j->hd;
    for (uint32_t i = 0; i < j->hd; i++) o[i] = 0.0f;
    for (int64_t i = 0; i < nr; i++) {
        const float e = z[i];
        if (fm[i]) {
            const dsib_state *ps = sts[fm[i]];
            const uint8_t *row = (const uint8_t *)(const void *)rp[i];
            float b[8];
            for (uint32_t k = 0; k < j->hd; k += 8) {
                dsii_sp_decode8(ps->format, ps->qcols, ps->block, row, k, b);
                for (uint32_t u = 0; u < 8; u++) o[k + u] = fmaf(e, b[u], o[k + u]);
            }
        } else {
            const float *v = rp[i];
            for (uint32_t k = 0; k < j->hd; k++) o[k] = fmaf(e, v[k], o[k]);
        }
    }
    for (uint32_t i = 0; i < j->hd; i++) o[i] /= den;
}

/* Tests: one packed row decoded by attention's path for isa (DSIB_ISA_AVX2 / _AVX512), where
 * this build and CPU have it: 1, else 0 (nothing written). */
int dsib_cpu_attn_unpack_row(int32_t isa, int32_t format, uint32_t width, uint32_t qcols,
                             uint32_t block, const uint8_t *src, float *dst) {
#ifdef DSIB_OPS_X86
    if (!DSIB_OPS_SIMD_OK || dsib_kern_table_get()->isa < isa) return 0;
    if (isa == DSIB_ISA_AVX2) {
        attn_unpack_row_avx2(format, width, qcols, block, src, dst);
        return 1;
    }
    if (isa == DSIB_ISA_AVX512) {
        attn_unpack_row_avx512(format, width, qcols, block, src, dst);
        return 1;
    }
#else
    (void)isa, (void)format, (void)width, (void)qcols, (void)block, (void)src, (void)dst;
#endif
    return 0;
}

/* Decodes the packed rows among rp[0..nr) (fm != 0) into dec (nr × hd) and points rp at them:
 * statepack.h decodes exactly the f32 values the unpacked state would hold, so the f32 paths
 * then give the same bits as f32 storage. */
static void attn_unpack(const attn_job *j, const float **rp, uint8_t *fm, int64_t nr, float *dec) {
    const dsib_state *sts[3] = {NULL, j->ring, j->comp};
    for (int64_t i = 0; i < nr; i++) {
        if (!fm[i]) continue;
        const dsib_state *ps = sts[fm[i]];
        float *d = dec + (size_t)i * j->hd;
#ifdef DSIB_OPS_X86
        if (j->unpack512)
            attn_unpack_row_avx512(ps->format, j->hd, ps->qcols, ps->block,
                                   (const uint8_t *)(const void *)rp[i], d);
        else if (j->unpack256)
            attn_unpack_row_avx2(ps->format, j->hd, ps->qcols, ps->block,
                                 (const uint8_t *)(const void *)rp[i], d);
        else
#endif
            dsii_sp_unpack_row(ps->format, j->hd, ps->qcols, ps->block,
                               (const uint8_t *)(const void *)rp[i], d);
        rp[i] = d;
        fm[i] = 0;
    }
}

static void attn_task(void *arg, int64_t task, int32_t slot) {
    attn_job *j = arg;
    const uint32_t groups = (j->H + j->hg - 1) / j->hg;
    uint32_t t = (uint32_t)(task / groups), h0 = (uint32_t)(task % groups) * j->hg;
    uint32_t h1 = h0 + j->hg < j->H ? h0 + j->hg : j->H;
    float *z = j->zs + (size_t)slot * 8 * (size_t)j->max_rows;
    const float **rp = j->ps + (size_t)slot * j->max_rows;
    int64_t nr;
    uint32_t h = h0;
    uint8_t *fm = j->fs + (size_t)slot * j->max_rows;
    nr = attn_rows(j, t, rp, fm);
    atomic_fetch_add_explicit(j->flops, (uint64_t)nr * (h1 - h0) * j->hd * 4u, memory_order_relaxed);
    int any = 0;
    for (int64_t i = 0; i < nr && !any; i++) any = fm[i] != 0;
    if (any && j->dec) {
        /* decoded once per task into this thread's own buffer, then the f32 paths below. In
         * a decode step every task decodes the same rows: measured faster than one shared
         * decode split over the pool, whose rows the head tasks then pulled from the other
         * cores' caches (bench-v41 tg128: attention 1.00-1.10 against 1.48-1.59 ms per token,
         * docs/performance.md 4.0000000000) */
        attn_unpack(j, rp, fm, nr, j->dec + (size_t)slot * (size_t)j->max_rows * j->hd);
    } else if (any) { /* no room to decode: each head reads the packed rows in place */
        for (; h < h1; h++) attn_head_packed(j, t, h, rp, fm, nr, z);
        return;
    }
#ifdef DSIB_OPS_X86
    if (j->simd512)
        for (; h + 8 <= h1; h += 8) attn_heads8_avx512(j, t, h, rp, nr, z);
    if (j->simd)
        for (; h + 4 <= h1; h += 4) attn_heads4_avx2(j, t, h, rp, nr, z);
#endif
    for (; h < h1; h++) attn_head_scalar(j, t, h, rp, nr, z);
}

/* Which path the SIMD-capable ops take: -1 = by CPU detection, else forced (tests). */
static _Atomic int32_t g_ops_isa = -1;

void dsib_cpu_ops_force_isa(int32_t isa) { atomic_store(&g_ops_isa, isa); }

int32_t dsib_cpu_ops_isa(void) {
    int32_t f = atomic_load(&g_ops_isa);
    if (f >= 0) return f;
    return dsib_kern_table_get()->isa;
}

static int32_t ops_isa_now(void) { return DSIB_OPS_SIMD_OK ? dsib_cpu_ops_isa() : 0; }

static dsi_status op_attn_sink(dsib_stream *strm, dsib_view q, uint32_t ldq, uint32_t H,
                               uint32_t hd, dsib_view rows, uint32_t n, uint32_t window,
                               const dsib_state *ring, dsib_view kv, uint32_t ldkv,
                               uint32_t comp_ratio, const dsib_state *comp, dsib_view idx,
                               uint32_t topk, const dsib_weight *sinks, float scale,
                               dsib_view out, uint32_t ldo) {
    dsib_instance *inst = strm->inst;
    if (n == 0) return DSI_OK;
    dsi_status st = dsib_cpu_state_check_packed(ring, hd);
    if (st == DSI_OK && ring->rows < window) st = DSI_ERR_INVALID_ARGUMENT;
    if (st == DSI_OK && comp_ratio) st = dsib_cpu_state_check_packed(comp, hd);
    if (st == DSI_OK && comp_ratio && comp->slots != ring->slots) st = DSI_ERR_INVALID_ARGUMENT;
    if (st == DSI_OK) st = dsib_cpu_rows_check(rows, n, ring->slots);
    if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    int64_t maxp = rows_max_pos(rows, n);
    if (comp_ratio && !idx.buf && maxp / comp_ratio > (int64_t)comp->rows)
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    attn_job j;
    memset(&j, 0, sizeof j);
    j.q = dsib_cpu_f32(q);
    j.ring = ring;
    j.kv = dsib_cpu_f32(kv);
    j.comp = comp_ratio ? comp : NULL;
    j.rows = dsib_cpu_i32(rows);
    j.idx = idx.buf ? dsib_cpu_i32(idx) : NULL;
    j.out = dsib_cpu_f32(out);
    j.ldq = ldq;
    j.H = H;
    j.hd = hd;
    j.window = window;
    j.ldkv = ldkv;
    j.comp_ratio = comp_ratio;
    j.topk = topk;
    j.ldo = ldo;
    j.scale = scale;
    j.flops = &inst->stat_attn_flops;
    int64_t maxc = 0;
    if (comp_ratio) maxc = j.idx ? topk : maxp / comp_ratio;
    j.max_rows = maxc + window + 1;
    size_t nt = (size_t)dsib_threadpool_n_threads(inst->pool);
    /* the head-group path: 4 heads share each K/V row load (same operations per head) */
    j.simd = DSIB_OPS_SIMD_OK && dsib_cpu_ops_isa() >= DSIB_ISA_AVX2 && hd % 8 == 0 && H >= 4;
#ifdef DSIB_OPS_X86
    j.unpack512 = DSIB_OPS_SIMD_OK && dsib_cpu_ops_isa() >= DSIB_ISA_AVX512;
    j.unpack256 = DSIB_OPS_SIMD_OK && dsib_cpu_ops_isa() >= DSIB_ISA_AVX2;
    j.simd512 = j.simd && dsib_cpu_ops_isa() >= DSIB_ISA_AVX512 && hd % 32 == 0 &&
                hd <= ATTN8_MAX_HD && H >= 8;
#endif
    j.hg = 1;
    if (j.simd) {
        /* heads per task: a multiple of 4 (of 8 on the AVX-512 path), below */
        j.hg = j.simd512 ? 8 : 4;
    }
    const int packed = ring->format != DSIB_STATE_F32 ||
                       (comp_ratio && comp->format != DSIB_STATE_F32);
    if (j.simd) {
        /* at least 2 tasks per thread where possible; with packed state one per thread, as
         * every task decodes the rows its step row sees (AVX2, bench-v41 decode at depth
         * 65,000 on two threads: 4 heads a task decoded each row four times; 8 heads
         * took attention from 3.8-4.3 to 3.6 ms per token) */
        const uint64_t per = packed ? nt : 2 * nt;
        while (j.hg * 2 <= H && (uint64_t)n * (H / (j.hg * 2)) >= per) j.hg *= 2;
    }
    /* ws: sinks [H], then per thread scores [8 × max_rows], row pointers [max_rows] and row
     * formats [max_rows]; with packed state, per thread the decoded rows [max_rows × hd] */
    size_t o1 = ((size_t)H * sizeof(float) + 63) & ~(size_t)63;
    size_t o2 = o1 + ((sizeof(float) * 8 * (size_t)j.max_rows * nt + 63) & ~(size_t)63);
    size_t o3 = o2 + ((sizeof(float *) * (size_t)j.max_rows * nt + 63) & ~(size_t)63);
    size_t o4 = o3 + (((size_t)j.max_rows * nt + 63) & ~(size_t)63);
    uint8_t *ws = dsib_cpu_ws(strm, o4);
    if (!ws) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    float *sk = (float *)(void *)ws;
    j.zs = (float *)(void *)(ws + o1);
    j.ps = (const float **)(void *)(ws + o2);
    j.fs = ws + o3;
    if (packed) {
        size_t dec_end = o4 + sizeof(float) * (size_t)j.max_rows * hd * nt;
        if (dsib_cpu_ws(strm, dec_end)) j.dec = (float *)(void *)(ws + o4);
    }
    for (uint32_t h = 0; h < H; h++) sk[h] = dsib_cpu_weight_f32(sinks, h);
    j.sinks = sk;
    dsib_parallel_for(inst->pool, (int64_t)n * ((H + j.hg - 1) / j.hg), attn_task, &j);
    return DSI_OK;
}

/* ---- MoE --------------------------------------------------------------------------------- */

static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static dsi_status op_moe_route(dsib_stream *strm, dsib_view logits, uint32_t ldl, uint32_t E,
                               uint32_t k, const dsib_weight *bias, const dsib_weight *tid2eid,
                               dsib_view ids, float norm_add, float route_scale, uint32_t n,
                               dsib_view sel, dsib_view wts) {
    if (k == 0 || k > E || E > 65536) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    const float *l = dsib_cpu_f32(logits);
    int32_t *sl = dsib_cpu_i32(sel);
    float *wt = dsib_cpu_f32(wts);
    const int32_t *tok = tid2eid ? dsib_cpu_i32(ids) : NULL;
    /* ws: scores [2E], heap [k] */
    size_t hoff = ((size_t)E * 2 * sizeof(float) + 63) & ~(size_t)63;
    uint8_t *ws = dsib_cpu_ws(strm, hoff + sizeof(int32_t) * k);
    if (!ws) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    float *s = (float *)(void *)ws;
    int32_t *heap = (int32_t *)(void *)(ws + hoff);
    float *sb = s + E;
    dsi_status st = DSI_OK;
    for (uint32_t t = 0; t < n && st == DSI_OK; t++) {
        const float *lt = l + (size_t)t * ldl;
        for (uint32_t e = 0; e < E; e++) s[e] = sqrtf(softplusf_(lt[e]));
        int32_t *o = sl + (size_t)t * k;
        if (tid2eid) {
            const uint8_t *row = dsib_cpu_wptr(tid2eid) + (uint64_t)tok[t] * tid2eid->nb1;
            for (uint32_t i = 0; i < k; i++) {
                int32_t v;
                memcpy(&v, row + 4 * i, 4);
                if (v < 0 || (uint32_t)v >= E) {
                    st = DSI_ERR_BAD_FORMAT;
                    break;
                }
                o[i] = v;
            }
        } else {
            for (uint32_t e = 0; e < E; e++)
                sb[e] = bias ? s[e] + dsib_cpu_weight_f32(bias, e) : s[e];
            /* k best, best first (ties: lower id) */
            for (uint32_t i = 0; i < k; i++) heap[i] = (int32_t)i;
            for (int32_t i = (int32_t)k / 2 - 1; i >= 0; i--) heap_down(heap, k, sb, (uint32_t)i);
            for (uint32_t c = k; c < E; c++)
                if (better(sb[c], (int32_t)c, sb[heap[0]], heap[0])) {
                    heap[0] = (int32_t)c;
                    heap_down(heap, k, sb, 0);
                }
            /* order best first: simple selection sort on k items */
            for (uint32_t i = 0; i < k; i++) {
                uint32_t b = i;
                for (uint32_t c = i + 1; c < k; c++)
                    if (better(sb[heap[c]], heap[c], sb[heap[b]], heap[b])) b = c;
                int32_t tmp = heap[i];
                heap[i] = heap[b];
                heap[b] = tmp;
                o[i] = heap[i];
            }
        }
        float sum = 0.0f;
        for (uint32_t i = 0; i < k; i++) sum += s[o[i]];
        sum += norm_add;
        float *w = wt + (size_t)t * k;
        for (uint32_t i = 0; i < k; i++) w[i] = s[o[i]] / sum * route_scale;
    }
    return dsib_cpu_ret(strm, st);
}

static float siluf_(float x) { return x / (1.0f + expf(-x)); }

static void swiglu_row(const float *g, const float *u, float *y, uint32_t w, float lim) {
    for (uint32_t i = 0; i < w; i++) {
        float a = g[i], b = u[i];
        if (lim > 0.0f) {
            if (a > lim) a = lim;
            if (b > lim) b = lim;
            if (b < -lim) b = -lim;
        }
        y[i] = siluf_(a) * b;
    }
}

typedef struct swiglu_job {
    const float *g, *u;
    float *y;
    uint32_t ldg, ldu, ldy, width;
    float limit;
} swiglu_job;

static void swiglu_task(void *arg, int64_t r, int32_t slot) {
    (void)slot;
    const swiglu_job *j = arg;
    swiglu_row(j->g + (size_t)r * j->ldg, j->u + (size_t)r * j->ldu, j->y + (size_t)r * j->ldy,
               j->width, j->limit);
}

static dsi_status op_swiglu(dsib_stream *strm, dsib_view g, uint32_t ldg, dsib_view u,
                            uint32_t ldu, dsib_view y, uint32_t ldy, uint32_t rows,
                            uint32_t width, float limit) {
    swiglu_job j = {dsib_cpu_f32(g), dsib_cpu_f32(u), dsib_cpu_f32(y), ldg, ldu, ldy, width, limit};
    if (rows >= OPS_PAR_ROWS)
        dsib_parallel_for(strm->inst->pool, rows, swiglu_task, &j);
    else
        for (uint32_t r = 0; r < rows; r++) swiglu_task(&j, r, 0);
    return DSI_OK;
}

int dsib_cpu_moe_split;

/* The routed experts' element-wise steps between and after the matmuls (the SwiGLU and
 * routing weight of every selected slot, then each token's sum over its slots), split over
 * the pool in tasks of MOE_POST_CHUNK elements: each element goes through the same scalar
 * code, and each output element's sum in slot order, whatever the split — so the results do
 * not depend on it. A decode step's 6 × 512 stays one task on the caller; before, every
 * step below 2^15 elements did, which left the second core idle through the 8-session
 * step's 48 × 512 (bench-v41-q8, 8 sessions, Zen 5, seven alternated rounds: faster in six,
 * by −0.4 to +11 %, docs/performance.md 4.000000000000000000000000000); on one
 * thread these steps took about 4 % of a 512-token prefill on bench-v41 while the other
 * core waited (section 4.0000000000000000000). */
enum { MOE_POST_CHUNK = 4096 };
typedef struct moe_post_job {
    float *G;
    const float *U, *wt, *Y;
    float *y;
    int64_t F, D, ns, n;
    uint32_t k, ldy;
    float limit;
} moe_post_job;

/* G = swiglu(G, U) · wt over the flat elements [task · chunk, +chunk) of the ns × F slot
 * rows */
static void moe_act_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const moe_post_job *j = arg;
    const int64_t total = j->ns * j->F, e0 = task * MOE_POST_CHUNK;
    const int64_t e1 = e0 + MOE_POST_CHUNK < total ? e0 + MOE_POST_CHUNK : total;
    for (int64_t e = e0; e < e1;) {
        const int64_t s = e / j->F, i0 = e - s * j->F;
        const int64_t i1 = e1 - s * j->F < j->F ? e1 - s * j->F : j->F;
        float *gs = j->G + s * j->F;
        swiglu_row(gs + i0, j->U + s * j->F + i0, gs + i0, (uint32_t)(i1 - i0), j->limit);
        for (int64_t i = i0; i < i1; i++) gs[i] *= j->wt[s];
        e = s * j->F + i1;
    }
}

/* y[t] = Σ_kk Y[t·k + kk] in slot order, over the flat elements [task · chunk, +chunk) of
 * the n × D outputs */
static void moe_sum_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const moe_post_job *j = arg;
    const int64_t total = j->n * j->D, e0 = task * MOE_POST_CHUNK;
    const int64_t e1 = e0 + MOE_POST_CHUNK < total ? e0 + MOE_POST_CHUNK : total;
    for (int64_t e = e0; e < e1;) {
        const int64_t t = e / j->D, i0 = e - t * j->D;
        const int64_t i1 = e1 - t * j->D < j->D ? e1 - t * j->D : j->D;
        float *o = j->y + t * (int64_t)j->ldy;
        const float *r0 = j->Y + t * (int64_t)j->k * j->D;
        memcpy(o + i0, r0 + i0, sizeof(float) * (size_t)(i1 - i0));
        for (uint32_t kk = 1; kk < j->k; kk++) {
            const float *r = r0 + (int64_t)kk * j->D;
            for (int64_t i = i0; i < i1; i++) o[i] += r[i];
        }
        e = t * j->D + i1;
    }
}

/* fn over `elems` elements in tasks of MOE_POST_CHUNK (dsib_parallel_for runs one task, or
 * any number without workers, on the caller) */
static void moe_post_run(dsib_threadpool *pool, int64_t elems, dsib_task_fn fn, moe_post_job *j) {
    dsib_parallel_for(pool, (elems + MOE_POST_CHUNK - 1) / MOE_POST_CHUNK, fn, j);
}

static dsi_status op_moe_experts(dsib_stream *strm, dsib_view x, uint32_t ldx, dsib_view sel,
                                 dsib_view wts, uint32_t k, const dsib_weight *w1,
                                 const dsib_weight *w3, const dsib_weight *w2, float limit,
                                 uint32_t n, dsib_view y, uint32_t ldy) {
    dsib_instance *inst = strm->inst;
    if (n == 0) return DSI_OK;
    int64_t D = w1->ne[0], F = w1->ne[1], E = w1->ne[2];
    if (w2->ne[0] != F || w2->ne[1] != D || w3->ne[0] != D || w3->ne[1] != F)
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    size_t ns = (size_t)n * k;
    const int32_t *sl = dsib_cpu_i32(sel);
    const float *wt = dsib_cpu_f32(wts);
    /* Group the (token, slot) pairs by expert, experts ascending, slots ascending, so each
     * selected expert's weights are read once for all the rows that chose it.
     * ws: cnt, offs [E+1], ex [E], xr, yr [ns], G, U [ns][F], Y [ns][D] */
#define AL64(x) (((size_t)(x) + 63) & ~(size_t)63)
    size_t o_offs = AL64(sizeof(int64_t) * ((size_t)E + 1));
    size_t o_ex = o_offs + AL64(sizeof(int64_t) * ((size_t)E + 1));
    size_t o_xr = o_ex + AL64(sizeof(int32_t) * (size_t)E);
    size_t o_yr = o_xr + AL64(sizeof(int64_t) * ns);
    size_t o_G = o_yr + AL64(sizeof(int64_t) * ns);
    size_t o_U = o_G + AL64(sizeof(float) * ns * (size_t)F);
    size_t o_Y = o_U + AL64(sizeof(float) * ns * (size_t)F);
    uint8_t *ws = dsib_cpu_ws(strm, o_Y + sizeof(float) * ns * (size_t)D);
#undef AL64
    if (!ws) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    int64_t *cnt = (int64_t *)(void *)ws, *offs = (int64_t *)(void *)(ws + o_offs);
    int32_t *ex = (int32_t *)(void *)(ws + o_ex);
    int64_t *xr = (int64_t *)(void *)(ws + o_xr), *yr = (int64_t *)(void *)(ws + o_yr);
    float *G = (float *)(void *)(ws + o_G), *U = (float *)(void *)(ws + o_U);
    float *Y = (float *)(void *)(ws + o_Y);
    dsi_status st = DSI_OK;
    memset(cnt, 0, sizeof(int64_t) * ((size_t)E + 1));
    for (size_t s = 0; s < ns; s++) {
        if (sl[s] < 0 || sl[s] >= E) {
            st = DSI_ERR_INTERNAL;
            goto done;
        }
        cnt[sl[s]]++;
    }
    int32_t ng = 0;
    int64_t acc = 0;
    for (int64_t e = 0; e < E; e++) {
        if (!cnt[e]) continue;
        ex[ng] = (int32_t)e;
        offs[ng] = acc;
        acc += cnt[e];
        cnt[e] = offs[ng]; /* becomes the fill cursor */
        ng++;
    }
    offs[ng] = acc;
    /* every selected expert's rows are read once for all the rows that chose it */
    atomic_fetch_add_explicit(&inst->stat_expert_bytes,
                              (uint64_t)ng * ((uint64_t)F * (w1->nb1 + w3->nb1) +
                                              (uint64_t)D * w2->nb1),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&inst->stat_expert_calls, 1, memory_order_relaxed);
    for (size_t s = 0; s < ns; s++) {
        int64_t pos = cnt[sl[s]]++;
        xr[pos] = (int64_t)(s / k);
        yr[pos] = (int64_t)s;
    }
    char msg[256];
    dsib_moe_matmul m = {w1->type, dsib_cpu_wptr(w1), (size_t)w1->nb2, (size_t)w1->nb1, D, F,
                         (int32_t)E, ng, ex, offs, xr, yr, dsib_cpu_f32(x), ldx, G, F,
                         mm_flags(inst)};
    dsib_moe_matmul mu = m; /* up: the same rows, one job with the gate */
    mu.type = w3->type;
    mu.w_base = dsib_cpu_wptr(w3);
    mu.expert_stride = (size_t)w3->nb2;
    mu.w_row_bytes = (size_t)w3->nb1;
    mu.y = U;
    if (dsib_cpu_moe_split) { /* benchmark A/B: the two matmuls as two jobs */
        st = dsib_matmul_moe(inst->pool, &m, msg, sizeof msg);
        if (st == DSI_OK) st = dsib_matmul_moe(inst->pool, &mu, msg, sizeof msg);
    } else {
        st = dsib_matmul_moe2(inst->pool, &m, &mu, msg, sizeof msg);
    }
    if (st != DSI_OK) goto done;
    moe_post_job pj = {G, U, wt, Y, dsib_cpu_f32(y), F, D, (int64_t)ns, (int64_t)n, k, ldy, limit};
    moe_post_run(inst->pool, (int64_t)ns * F, moe_act_task, &pj);
    /* down projection: slot-ordered input rows = yr (the slot itself) */
    m.type = w2->type;
    m.w_base = dsib_cpu_wptr(w2);
    m.expert_stride = (size_t)w2->nb2;
    m.w_row_bytes = (size_t)w2->nb1;
    m.n_in = F;
    m.n_out = D;
    m.x_rows = yr;
    m.x = G;
    m.x_stride = F;
    m.y = Y;
    m.y_stride = D;
    st = dsib_matmul_moe(inst->pool, &m, msg, sizeof msg);
    if (st != DSI_OK) goto done;
    moe_post_run(inst->pool, (int64_t)n * D, moe_sum_task, &pj);
done:
    return dsib_cpu_ret(strm, st);
}

const dsib_ops dsib_cpu_ops = {
    .struct_size = sizeof(dsib_ops),
    .matmul = op_matmul,
    .matmul_grouped = op_matmul_grouped,
    .get_rows = op_get_rows,
    .rms_norm = op_rms_norm,
    .add = op_add,
    .scale = op_scale,
    .copy = op_copy,
    .copy_rows = op_copy_rows,
    .gather_rows = op_gather_rows,
    .rope_tail = op_rope_tail,
    .store_rows = op_store_rows,
    .fake_quant = op_fake_quant,
    .hadamard = op_hadamard,
    .hc_expand = op_hc_expand,
    .hc_mix = op_hc_mix,
    .hc_collapse = op_hc_collapse,
    .hc_post = op_hc_post,
    .compress_pool = op_compress_pool,
    .indexer_topk = op_indexer_topk,
    .attn_sink = op_attn_sink,
    .add_rows_periodic = op_add_rows_periodic,
    .moe_route = op_moe_route,
    .moe_experts = op_moe_experts,
    .swiglu = op_swiglu,
    DSIB_CPU_OPS_V41_INIT
    .matmul_multi = op_matmul_multi,
};
