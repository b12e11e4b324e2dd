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
#include "quant/fp.h"
#include "quant/quant.h"

#if defined(__has_include)
#if __has_include("backends/cpu/ops_v41.h")
#include "backends/cpu/ops_v41.h"
#endif
#endif
#ifndef DSIB_CPU_OPS_V41_INIT
#define DSIB_CPU_OPS_V41_INIT
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------------------- */

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
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
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

static dsi_status op_matmul(dsib_instance *inst, const dsib_weight *w, int32_t expert,
                            dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n) {
    if (n == 0) return DSI_OK;
    return dsib_matmul(inst->pool, mm_flags(inst), w->type,
                       dsib_cpu_wptr(w) + (uint64_t)expert * w->nb2, (size_t)w->nb1, w->ne[0],
                       w->ne[1], dsib_cpu_f32(x), ldx, dsib_cpu_f32(y), ldy, n);
}

static dsi_status op_matmul_grouped(dsib_instance *inst, const dsib_weight *w, uint32_t groups,
                                    dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy,
                                    uint32_t n) {
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
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

static dsi_status op_get_rows(dsib_instance *inst, const dsib_weight *table, dsib_view ids,
                              dsib_view y, uint32_t ldy, uint32_t n) {
    (void)inst;
    const int32_t *id = dsib_cpu_i32(ids);
    float *out = dsib_cpu_f32(y);
    for (uint32_t t = 0; t < n; t++) {
        if (id[t] < 0 || id[t] >= table->ne[1]) return DSI_ERR_INVALID_ARGUMENT;
        dsi_status st = dsib_cpu_weight_row(table, 0, id[t], out + (size_t)t * ldy);
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

static dsi_status op_rms_norm(dsib_instance *inst, dsib_view x, uint32_t ldx, dsib_view y,
                              uint32_t ldy, uint32_t rows, uint32_t width, const dsib_weight *w,
                              float eps) {
    (void)inst;
    const float *xs = dsib_cpu_f32(x);
    float *ys = dsib_cpu_f32(y);
    float *wv = NULL;
    if (w) {
        wv = dsib_cpu_malloc(inst, (size_t)width * sizeof(float));
        if (!wv) return DSI_ERR_OUT_OF_HOST_MEMORY;
        for (uint32_t i = 0; i < width; i++) wv[i] = dsib_cpu_weight_f32(w, i);
    }
    for (uint32_t r = 0; r < rows; r++) {
        const float *a = xs + (size_t)r * ldx;
        float *b = ys + (size_t)r * ldy;
        float ss = 0.0f;
        for (uint32_t i = 0; i < width; i++) ss += a[i] * a[i];
        float sc = 1.0f / sqrtf(ss / (float)width + eps);
        if (wv)
            for (uint32_t i = 0; i < width; i++) b[i] = (a[i] * sc) * wv[i];
        else
            for (uint32_t i = 0; i < width; i++) b[i] = a[i] * sc;
    }
    dsib_cpu_free(inst, wv);
    return DSI_OK;
}

static dsi_status op_add(dsib_instance *inst, dsib_view a, uint32_t lda, dsib_view b,
                         uint32_t ldb, dsib_view y, uint32_t ldy, uint32_t rows,
                         uint32_t width) {
    (void)inst;
    const float *pa = dsib_cpu_f32(a), *pb = dsib_cpu_f32(b);
    float *py = dsib_cpu_f32(y);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < width; i++)
            py[(size_t)r * ldy + i] = pa[(size_t)r * lda + i] + pb[(size_t)r * ldb + i];
    return DSI_OK;
}

static dsi_status op_scale(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                           uint32_t width, float s) {
    (void)inst;
    float *p = dsib_cpu_f32(x);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < width; i++) p[(size_t)r * ldx + i] *= s;
    return DSI_OK;
}

static dsi_status op_copy(dsib_instance *inst, dsib_view src, dsib_view dst, uint64_t bytes) {
    (void)inst;
    if (bytes) memcpy(dst.buf->ptr + dst.offset, src.buf->ptr + src.offset, (size_t)bytes);
    return DSI_OK;
}

static dsi_status op_copy_rows(dsib_instance *inst, dsib_view src, uint32_t lds, dsib_view dst,
                               uint32_t ldd, uint32_t rows, uint32_t width) {
    (void)inst;
    const float *s = dsib_cpu_f32(src);
    float *d = dsib_cpu_f32(dst);
    for (uint32_t r = 0; r < rows; r++)
        memmove(d + (size_t)r * ldd, s + (size_t)r * lds, (size_t)width * sizeof(float));
    return DSI_OK;
}

/* ---- positions --------------------------------------------------------------------------- */

/* Frequencies of §3.9 in double precision (the angle p·f is formed in double as well, so the
 * only f32 rounding is the final cos/sin and the rotation itself). */
static void rope_freqs(const dsib_rope *r, double *f) {
    int32_t half = r->n_rot / 2;
    for (int32_t i = 0; i < half; i++) f[i] = pow((double)r->freq_base, -2.0 * i / r->n_rot);
    if (r->yarn_factor > 1.0f) {
        const double two_pi = 6.283185307179586476925286766559;
        double lnb = 2.0 * log((double)r->freq_base);
        double cf = r->n_rot * log(r->yarn_orig_ctx / (r->yarn_beta_fast * two_pi)) / lnb;
        double cs = r->n_rot * log(r->yarn_orig_ctx / (r->yarn_beta_slow * two_pi)) / lnb;
        double low = floor(cf), high = ceil(cs);
        if (low < 0) low = 0;
        if (high > r->n_rot - 1) high = r->n_rot - 1;
        if (high == low) high += 0.001;
        for (int32_t i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            f[i] = f[i] / r->yarn_factor * ramp + f[i] * (1.0 - ramp);
        }
    }
}

static dsi_status op_rope_tail(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                               uint32_t heads, uint32_t head_dim, int64_t pos0,
                               int64_t pos_step, const dsib_rope *rope, int32_t inverse) {
    (void)inst;
    double f[256];
    if (rope->n_rot <= 0 || rope->n_rot > 512 || (uint32_t)rope->n_rot > head_dim ||
        (rope->n_rot & 1))
        return DSI_ERR_INVALID_ARGUMENT;
    rope_freqs(rope, f);
    int32_t half = rope->n_rot / 2;
    float cs[256], sn[256];
    float *p = dsib_cpu_f32(x);
    for (uint32_t t = 0; t < rows; t++) {
        double pos = (double)(pos0 + (int64_t)t * pos_step);
        for (int32_t i = 0; i < half; i++) {
            double th = pos * f[i];
            cs[i] = (float)cos(th);
            sn[i] = inverse ? -(float)sin(th) : (float)sin(th);
        }
        for (uint32_t h = 0; h < heads; h++) {
            float *v = p + (size_t)t * ldx + (size_t)h * head_dim + (head_dim - rope->n_rot);
            for (int32_t i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * cs[i] - x1 * sn[i];
                v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
    return DSI_OK;
}

static dsi_status op_ring_write(dsib_instance *inst, dsib_view src, uint32_t lds, uint32_t n,
                                int64_t pos0, dsib_view ring, uint32_t ldr, uint32_t ring_len,
                                uint32_t width) {
    (void)inst;
    const float *s = dsib_cpu_f32(src);
    float *r = dsib_cpu_f32(ring);
    uint32_t first = n > ring_len ? n - ring_len : 0;
    for (uint32_t t = first; t < n; t++) {
        uint64_t slot = (uint64_t)(pos0 + t) % ring_len;
        memcpy(r + slot * ldr, s + (size_t)t * lds, (size_t)width * sizeof(float));
    }
    return DSI_OK;
}

/* ---- quantisation simulation ------------------------------------------------------------- */

static dsi_status op_fake_quant(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                                uint32_t col0, uint32_t ncols, uint32_t block, int32_t recipe,
                                uint32_t flags) {
    (void)inst;
    if (block == 0 || ncols % block) return DSI_ERR_INVALID_ARGUMENT;
    int round = !(flags & DSIB_FQ_NO_ROUND);
    float *p = dsib_cpu_f32(x);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t b0 = 0; b0 < ncols; b0 += block) {
            float *v = p + (size_t)r * ldx + col0 + b0;
            float amax = 0.0f;
            for (uint32_t i = 0; i < block; i++) {
                float a = fabsf(v[i]);
                if (a > amax) amax = a;
            }
            float s, lim;
            switch (recipe) {
            case DSIB_FQ_E4M3_UE8M0:
                if (amax < 1e-4f) amax = 1e-4f;
                s = dsii_e8m0_to_f32(dsii_e8m0_ceil(amax * (1.0f / 448.0f)));
                lim = 448.0f;
                break;
            case DSIB_FQ_E2M1_UE8M0:
                if (amax < 6.0f * 0x1p-126f) amax = 6.0f * 0x1p-126f;
                s = dsii_e8m0_to_f32(dsii_e8m0_ceil(amax * (1.0f / 6.0f)));
                lim = 6.0f;
                break;
            case DSIB_FQ_E2M1_E4M3:
                if (amax < 6.0f * 0x1p-9f) amax = 6.0f * 0x1p-9f;
                s = dsii_e4m3_rne(amax / 6.0f);
                lim = 6.0f;
                break;
            default: return DSI_ERR_INVALID_ARGUMENT;
            }
            int e4m3 = recipe == DSIB_FQ_E4M3_UE8M0;
            for (uint32_t i = 0; i < block; i++) {
                float q = v[i] / s;
                if (q > lim) q = lim;
                if (q < -lim) q = -lim;
                if (round) q = e4m3 ? dsii_e4m3_rne(q) : dsii_e2m1_rne(q);
                v[i] = q * s;
            }
        }
    }
    return DSI_OK;
}

static dsi_status op_hadamard(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                              uint32_t chunks, uint32_t size) {
    (void)inst;
    if (size == 0 || (size & (size - 1))) return DSI_ERR_INVALID_ARGUMENT;
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

static dsi_status op_hc_expand(dsib_instance *inst, dsib_view e, uint32_t lde, dsib_view X,
                               uint32_t n, uint32_t n_hc, uint32_t D) {
    (void)inst;
    const float *s = dsib_cpu_f32(e);
    float *d = dsib_cpu_f32(X);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < n_hc; h++)
            memcpy(d + ((size_t)t * n_hc + h) * D, s + (size_t)t * lde, (size_t)D * sizeof(float));
    return DSI_OK;
}

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

static dsi_status op_hc_mix(dsib_instance *inst, dsib_view X, uint32_t n, uint32_t n_hc,
                            uint32_t D, const dsib_weight *fn, const dsib_weight *scale,
                            const dsib_weight *base, float rms_eps, float hc_eps,
                            uint32_t iters, int32_t mode, dsib_view coef, uint32_t ldc) {
    if (n_hc == 0 || n_hc > 16) return DSI_ERR_INVALID_ARGUMENT;
    uint32_t n_mix = mode == DSIB_HC_HEAD ? n_hc : n_hc * (2 + n_hc);
    if (fn->ne[1] != (int64_t)n_mix || fn->ne[0] != (int64_t)n_hc * D || ldc < n_mix)
        return DSI_ERR_INVALID_ARGUMENT;
    dsi_status st = op_matmul(inst, fn, 0, X, n_hc * D, coef, ldc, n);
    if (st != DSI_OK) return st;
    const float *xs = dsib_cpu_f32(X);
    float *cf = dsib_cpu_f32(coef);
    float sc[3], bs[16 * 18];
    for (uint32_t i = 0; i < (mode == DSIB_HC_HEAD ? 1u : 3u); i++) sc[i] = dsib_cpu_weight_f32(scale, i);
    for (uint32_t i = 0; i < n_mix; i++) bs[i] = dsib_cpu_weight_f32(base, i);
    for (uint32_t t = 0; t < n; t++) {
        const float *fl = xs + (size_t)t * n_hc * D;
        float ss = 0.0f;
        for (size_t i = 0; i < (size_t)n_hc * D; i++) ss += fl[i] * fl[i];
        float rs = 1.0f / sqrtf(ss / (float)((size_t)n_hc * D) + rms_eps);
        float *m = cf + (size_t)t * ldc;
        for (uint32_t i = 0; i < n_mix; i++) m[i] *= rs;
        if (mode == DSIB_HC_HEAD) {
            for (uint32_t h = 0; h < n_hc; h++) m[h] = sigmoidf_(m[h] * sc[0] + bs[h]) + hc_eps;
            continue;
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
            for (uint32_t j = 1; j < n_hc; j++) mx = row[j] > mx ? row[j] : mx;
            for (uint32_t j = 0; j < n_hc; j++) {
                row[j] = expf(row[j] - mx);
                s += row[j];
            }
            for (uint32_t j = 0; j < n_hc; j++) row[j] = row[j] / s + hc_eps;
        }
        for (uint32_t it = 0; it < iters; it++) {
            if (it > 0)
                for (uint32_t i = 0; i < n_hc; i++) {
                    float s = 0.0f;
                    for (uint32_t j = 0; j < n_hc; j++) s += C[i * n_hc + j];
                    s += hc_eps;
                    for (uint32_t j = 0; j < n_hc; j++) C[i * n_hc + j] /= s;
                }
            for (uint32_t j = 0; j < n_hc; j++) {
                float s = 0.0f;
                for (uint32_t i = 0; i < n_hc; i++) s += C[i * n_hc + j];
                s += hc_eps;
                for (uint32_t i = 0; i < n_hc; i++) C[i * n_hc + j] /= s;
            }
        }
    }
    return DSI_OK;
}

static dsi_status op_hc_collapse(dsib_instance *inst, dsib_view X, dsib_view coef, uint32_t ldc,
                                 dsib_view y, uint32_t ldy, uint32_t n, uint32_t n_hc,
                                 uint32_t D) {
    (void)inst;
    const float *xs = dsib_cpu_f32(X), *cf = dsib_cpu_f32(coef);
    float *ys = dsib_cpu_f32(y);
    for (uint32_t t = 0; t < n; t++) {
        const float *pre = cf + (size_t)t * ldc, *x = xs + (size_t)t * n_hc * D;
        float *o = ys + (size_t)t * ldy;
        for (uint32_t d = 0; d < D; d++) {
            float a = pre[0] * x[d];
            for (uint32_t h = 1; h < n_hc; h++) a += pre[h] * x[(size_t)h * D + d];
            o[d] = a;
        }
    }
    return DSI_OK;
}

static dsi_status op_hc_post(dsib_instance *inst, dsib_view f, uint32_t ldf, dsib_view R,
                             dsib_view coef, uint32_t ldc, dsib_view Xo, uint32_t n,
                             uint32_t n_hc, uint32_t D) {
    (void)inst;
    if (n_hc > 16) return DSI_ERR_INVALID_ARGUMENT;
    const float *fs = dsib_cpu_f32(f), *rs = dsib_cpu_f32(R), *cf = dsib_cpu_f32(coef);
    float *xo = dsib_cpu_f32(Xo);
    for (uint32_t t = 0; t < n; t++) {
        const float *post = cf + (size_t)t * ldc + n_hc, *C = post + n_hc;
        const float *ft = fs + (size_t)t * ldf, *rt = rs + (size_t)t * n_hc * D;
        float *ot = xo + (size_t)t * n_hc * D;
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
    return DSI_OK;
}

/* ---- compressed attention ---------------------------------------------------------------- */

static dsi_status op_compress_pool(dsib_instance *inst, dsib_view ring_kv, dsib_view ring_sc,
                                   uint32_t ldr, uint32_t ring_len, dsib_view kv, dsib_view sc,
                                   uint32_t ldc, int64_t pos0, uint32_t n, uint32_t ratio,
                                   int32_t overlap, uint32_t hd, int64_t w0, uint32_t n_groups,
                                   dsib_view out, uint32_t ldo) {
    (void)inst;
    if (ratio == 0 || ratio > 4096) return DSI_ERR_INVALID_ARGUMENT;
    const float *rk = dsib_cpu_f32(ring_kv), *rsc = dsib_cpu_f32(ring_sc);
    const float *ck = dsib_cpu_f32(kv), *csc = dsib_cpu_f32(sc);
    float *o = dsib_cpu_f32(out);
    uint32_t maxc = 2 * ratio;
    const float **kp = dsib_cpu_malloc(inst, sizeof(float *) * maxc * 2);
    float *e = dsib_cpu_malloc(inst, sizeof(float) * maxc);
    if (!kp || !e) {
        dsib_cpu_free(inst, kp);
        dsib_cpu_free(inst, e);
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    const float **sp = kp + maxc;
    for (uint32_t g = 0; g < n_groups; g++) {
        int64_t w = w0 + g;
        uint32_t nc = 0;
        for (int lane = overlap ? 0 : 1; lane < 2; lane++) {
            int64_t grp = overlap && lane == 0 ? w - 1 : w;
            if (grp < 0) continue;
            uint32_t off = overlap && lane == 1 ? hd : 0;
            for (uint32_t s = 0; s < ratio; s++) {
                int64_t q = grp * ratio + s;
                const float *krow, *srow;
                if (q < pos0) {
                    if (pos0 - q > ring_len) goto bad;
                    uint64_t slot = (uint64_t)q % ring_len;
                    krow = rk + slot * ldr;
                    srow = rsc + slot * ldr;
                } else {
                    if (q - pos0 >= n) goto bad;
                    krow = ck + (size_t)(q - pos0) * ldc;
                    srow = csc + (size_t)(q - pos0) * ldc;
                }
                kp[nc] = krow + off;
                sp[nc] = srow + off;
                nc++;
            }
        }
        float *og = o + (size_t)g * ldo;
        for (uint32_t j = 0; j < hd; j++) {
            float mx = sp[0][j];
            for (uint32_t c = 1; c < nc; c++) mx = sp[c][j] > mx ? sp[c][j] : mx;
            float z = 0.0f;
            for (uint32_t c = 0; c < nc; c++) {
                e[c] = expf(sp[c][j] - mx);
                z += e[c];
            }
            float a = 0.0f;
            for (uint32_t c = 0; c < nc; c++) a += (e[c] / z) * kp[c][j];
            og[j] = a;
        }
    }
    dsib_cpu_free(inst, kp);
    dsib_cpu_free(inst, e);
    return DSI_OK;
bad:
    dsib_cpu_free(inst, kp);
    dsib_cpu_free(inst, e);
    return DSI_ERR_INTERNAL;
}

static dsi_status op_add_rows_periodic(dsib_instance *inst, dsib_view x, uint32_t ldx,
                                       uint32_t n, uint32_t width, const dsib_weight *table,
                                       int64_t pos0, uint32_t period) {
    if (period == 0 || table->ne[0] < (int64_t)width) return DSI_ERR_INVALID_ARGUMENT;
    float *row = dsib_cpu_malloc(inst, (size_t)table->ne[0] * sizeof(float));
    if (!row) return DSI_ERR_OUT_OF_HOST_MEMORY;
    float *p = dsib_cpu_f32(x);
    for (uint32_t t = 0; t < n; t++) {
        dsi_status st = dsib_cpu_weight_row(table, 0, (pos0 + t) % period, row);
        if (st != DSI_OK) {
            dsib_cpu_free(inst, row);
            return st;
        }
        float *v = p + (size_t)t * ldx;
        for (uint32_t i = 0; i < width; i++) v[i] += row[i];
    }
    dsib_cpu_free(inst, row);
    return DSI_OK;
}

/* -- indexer -- */

typedef struct idx_job {
    const float *q, *w, *keys;
    uint32_t ldq, ldw, heads, hd, ratio, topk, n;
    int64_t pos0;
    int32_t *idx;
    float *scratch;      /* [threads][max_rows] scores */
    int32_t *iscratch;   /* [threads][max_rows] order */
    int64_t max_rows;
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
static int cmp_i32(const void *a, const void *b) {
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
    qsort(heap, k, sizeof(int32_t), cmp_i32);
}

static void idx_task(void *arg, int64_t t, int32_t slot) {
    idx_job *j = arg;
    int64_t p = j->pos0 + t;
    int64_t nvis = (p + 1) / j->ratio;
    int32_t *out = j->idx + (size_t)t * j->topk;
    if (nvis <= (int64_t)j->topk) {
        for (uint32_t i = 0; i < j->topk; i++) out[i] = i < nvis ? (int32_t)i : -1;
        return;
    }
    float *sc = j->scratch + (size_t)slot * j->max_rows;
    const float *q = j->q + (size_t)t * j->ldq, *w = j->w + (size_t)t * j->ldw;
    for (int64_t c = 0; c < nvis; c++) {
        const float *k = j->keys + (size_t)c * j->hd;
        float s = 0.0f;
        for (uint32_t h = 0; h < j->heads; h++) {
            const float *qh = q + (size_t)h * j->hd;
            float d = dot_fixed(qh, k, j->hd);
            if (d < 0.0f) d = 0.0f;
            s += d * w[h];
        }
        sc[c] = s;
    }
    topk_select(sc, nvis, j->topk, out);
}

static dsi_status op_indexer_topk(dsib_instance *inst, dsib_view q, uint32_t ldq, dsib_view w,
                                  uint32_t ldw, dsib_view keys, uint32_t heads, uint32_t hd,
                                  int64_t pos0, uint32_t n, uint32_t ratio, uint32_t topk,
                                  dsib_view idx) {
    if (n == 0) return DSI_OK;
    if (ratio == 0 || topk == 0) return DSI_ERR_INVALID_ARGUMENT;
    idx_job j = {dsib_cpu_f32(q), dsib_cpu_f32(w), dsib_cpu_f32(keys), ldq, ldw, heads, hd,
                 ratio, topk, n, pos0, dsib_cpu_i32(idx), NULL, NULL, 0};
    j.max_rows = (pos0 + n) / ratio + 1;
    int32_t nt = dsib_threadpool_n_threads(inst->pool);
    j.scratch = dsib_cpu_malloc(inst, sizeof(float) * (size_t)j.max_rows * (size_t)nt);
    if (!j.scratch) return DSI_ERR_OUT_OF_HOST_MEMORY;
    dsib_parallel_for(inst->pool, n, idx_task, &j);
    dsib_cpu_free(inst, j.scratch);
    return DSI_OK;
}

/* -- sink attention -- */

typedef struct attn_job {
    const float *q, *ring, *kv, *comp, *sinks;
    const int32_t *idx;
    float *out, *zs;
    const float **ps;
    uint32_t ldq, H, hd, window, ring_len, ldkv, comp_ratio, topk, ldo;
    int64_t pos0, max_rows;
    float scale;
} attn_job;

static void attn_task(void *arg, int64_t task, int32_t slot) {
    attn_job *j = arg;
    uint32_t t = (uint32_t)(task / j->H), h = (uint32_t)(task % j->H);
    int64_t p = j->pos0 + t;
    const float *q = j->q + (size_t)t * j->ldq + (size_t)h * j->hd;
    float *z = j->zs + (size_t)slot * j->max_rows;
    const float **rp = j->ps + (size_t)slot * j->max_rows;
    /* The visible rows in canonical order: compressed (ascending), then window (ascending). */
    int64_t nr = 0;
    if (j->comp_ratio > 0) {
        if (j->idx) {
            const int32_t *ix = j->idx + (size_t)t * j->topk;
            for (uint32_t k = 0; k < j->topk; k++)
                if (ix[k] >= 0) rp[nr++] = j->comp + (size_t)ix[k] * j->hd;
        } else {
            int64_t nv = (p + 1) / j->comp_ratio;
            for (int64_t c = 0; c < nv; c++) rp[nr++] = j->comp + (size_t)c * j->hd;
        }
    }
    int64_t w0 = p - (int64_t)j->window + 1;
    if (w0 < 0) w0 = 0;
    for (int64_t qp = w0; qp <= p; qp++) {
        if (qp < j->pos0) rp[nr++] = j->ring + (size_t)((uint64_t)qp % j->ring_len) * j->hd;
        else rp[nr++] = j->kv + (size_t)(qp - j->pos0) * j->ldkv;
    }
    float sink = j->sinks[h];
    float m = sink;
    for (int64_t r = 0; r < nr; r++) {
        float d = dot_fixed(q, rp[r], j->hd) * j->scale;
        z[r] = d;
        if (d > m) m = d;
    }
    float den = expf(sink - m);
    float *o = j->out + (size_t)t * j->ldo + (size_t)h * j->hd;
    for (uint32_t i = 0; i < j->hd; i++) o[i] = 0.0f;
    for (int64_t r = 0; r < nr; r++) {
        float e = expf(z[r] - m);
        den += e;
        const float *v = rp[r];
        for (uint32_t i = 0; i < j->hd; i++) o[i] += e * v[i];
    }
    for (uint32_t i = 0; i < j->hd; i++) o[i] /= den;
}

static dsi_status op_attn_sink(dsib_instance *inst, dsib_view q, uint32_t ldq, uint32_t H,
                               uint32_t hd, int64_t pos0, uint32_t n, uint32_t window,
                               dsib_view ring, uint32_t ring_len, dsib_view kv, uint32_t ldkv,
                               uint32_t comp_ratio, dsib_view comp, dsib_view idx,
                               uint32_t topk, const dsib_weight *sinks, float scale,
                               dsib_view out, uint32_t ldo) {
    if (n == 0) return DSI_OK;
    if (ring_len < window) return DSI_ERR_INVALID_ARGUMENT;
    attn_job j;
    memset(&j, 0, sizeof j);
    j.q = dsib_cpu_f32(q);
    j.ring = dsib_cpu_f32(ring);
    j.kv = dsib_cpu_f32(kv);
    j.comp = comp_ratio ? dsib_cpu_f32(comp) : NULL;
    j.idx = idx.buf ? dsib_cpu_i32(idx) : NULL;
    j.out = dsib_cpu_f32(out);
    j.ldq = ldq;
    j.H = H;
    j.hd = hd;
    j.window = window;
    j.ring_len = ring_len;
    j.ldkv = ldkv;
    j.comp_ratio = comp_ratio;
    j.topk = topk;
    j.ldo = ldo;
    j.pos0 = pos0;
    j.scale = scale;
    int64_t maxc = 0;
    if (comp_ratio) maxc = j.idx ? topk : (pos0 + n) / comp_ratio;
    j.max_rows = maxc + window + 1;
    int32_t nt = dsib_threadpool_n_threads(inst->pool);
    float *sk = dsib_cpu_malloc(inst, sizeof(float) * H);
    j.zs = dsib_cpu_malloc(inst, sizeof(float) * (size_t)j.max_rows * (size_t)nt);
    j.ps = dsib_cpu_malloc(inst, sizeof(float *) * (size_t)j.max_rows * (size_t)nt);
    if (!sk || !j.zs || !j.ps) {
        dsib_cpu_free(inst, sk);
        dsib_cpu_free(inst, j.zs);
        dsib_cpu_free(inst, (void *)j.ps);
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t h = 0; h < H; h++) sk[h] = dsib_cpu_weight_f32(sinks, h);
    j.sinks = sk;
    dsib_parallel_for(inst->pool, (int64_t)n * H, attn_task, &j);
    dsib_cpu_free(inst, sk);
    dsib_cpu_free(inst, j.zs);
    dsib_cpu_free(inst, (void *)j.ps);
    return DSI_OK;
}

/* ---- MoE --------------------------------------------------------------------------------- */

static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static dsi_status op_moe_route(dsib_instance *inst, dsib_view logits, uint32_t ldl, uint32_t E,
                               uint32_t k, const dsib_weight *bias, const dsib_weight *tid2eid,
                               dsib_view ids, float norm_add, float route_scale, uint32_t n,
                               dsib_view sel, dsib_view wts) {
    if (k == 0 || k > E || E > 65536) return DSI_ERR_INVALID_ARGUMENT;
    const float *l = dsib_cpu_f32(logits);
    int32_t *sl = dsib_cpu_i32(sel);
    float *wt = dsib_cpu_f32(wts);
    const int32_t *tok = tid2eid ? dsib_cpu_i32(ids) : NULL;
    float *s = dsib_cpu_malloc(inst, sizeof(float) * E * 2);
    int32_t *heap = dsib_cpu_malloc(inst, sizeof(int32_t) * k);
    if (!s || !heap) {
        dsib_cpu_free(inst, s);
        dsib_cpu_free(inst, heap);
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
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
    dsib_cpu_free(inst, s);
    dsib_cpu_free(inst, heap);
    return st;
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

static dsi_status op_swiglu(dsib_instance *inst, dsib_view g, uint32_t ldg, dsib_view u,
                            uint32_t ldu, dsib_view y, uint32_t ldy, uint32_t rows,
                            uint32_t width, float limit) {
    (void)inst;
    const float *pg = dsib_cpu_f32(g), *pu = dsib_cpu_f32(u);
    float *py = dsib_cpu_f32(y);
    for (uint32_t r = 0; r < rows; r++)
        swiglu_row(pg + (size_t)r * ldg, pu + (size_t)r * ldu, py + (size_t)r * ldy, width, limit);
    return DSI_OK;
}

static dsi_status op_moe_experts(dsib_instance *inst, dsib_view x, uint32_t ldx, dsib_view sel,
                                 dsib_view wts, uint32_t k, const dsib_weight *w1,
                                 const dsib_weight *w3, const dsib_weight *w2, float limit,
                                 uint32_t n, dsib_view y, uint32_t ldy) {
    if (n == 0) return DSI_OK;
    int64_t D = w1->ne[0], F = w1->ne[1], E = w1->ne[2];
    if (w2->ne[0] != F || w2->ne[1] != D || w3->ne[0] != D || w3->ne[1] != F)
        return DSI_ERR_INVALID_ARGUMENT;
    size_t ns = (size_t)n * k;
    const int32_t *sl = dsib_cpu_i32(sel);
    const float *wt = dsib_cpu_f32(wts);
    /* Group the (token, slot) pairs by expert, experts ascending, slots ascending. */
    int64_t *cnt = dsib_cpu_malloc(inst, sizeof(int64_t) * ((size_t)E + 1));
    int64_t *offs = dsib_cpu_malloc(inst, sizeof(int64_t) * ((size_t)E + 1));
    int32_t *ex = dsib_cpu_malloc(inst, sizeof(int32_t) * (size_t)E);
    int64_t *xr = dsib_cpu_malloc(inst, sizeof(int64_t) * ns);
    int64_t *yr = dsib_cpu_malloc(inst, sizeof(int64_t) * ns);
    float *G = dsib_cpu_malloc(inst, sizeof(float) * ns * (size_t)F);
    float *U = dsib_cpu_malloc(inst, sizeof(float) * ns * (size_t)F);
    float *Y = dsib_cpu_malloc(inst, sizeof(float) * ns * (size_t)D);
    dsi_status st = DSI_OK;
    if (!cnt || !offs || !ex || !xr || !yr || !G || !U || !Y) {
        st = DSI_ERR_OUT_OF_HOST_MEMORY;
        goto done;
    }
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
    for (size_t s = 0; s < ns; s++) {
        int64_t pos = cnt[sl[s]]++;
        xr[pos] = (int64_t)(s / k);
        yr[pos] = (int64_t)s;
    }
    char msg[256];
    dsib_moe_matmul m = {w1->type, dsib_cpu_wptr(w1), (size_t)w1->nb2, (size_t)w1->nb1, D, F,
                         (int32_t)E, ng, ex, offs, xr, yr, dsib_cpu_f32(x), ldx, G, F,
                         mm_flags(inst)};
    st = dsib_matmul_moe(inst->pool, &m, msg, sizeof msg);
    if (st != DSI_OK) goto done;
    m.type = w3->type;
    m.w_base = dsib_cpu_wptr(w3);
    m.expert_stride = (size_t)w3->nb2;
    m.w_row_bytes = (size_t)w3->nb1;
    m.y = U;
    st = dsib_matmul_moe(inst->pool, &m, msg, sizeof msg);
    if (st != DSI_OK) goto done;
    for (size_t s = 0; s < ns; s++) {
        float *gs = G + s * (size_t)F;
        swiglu_row(gs, U + s * (size_t)F, gs, (uint32_t)F, limit);
        for (int64_t i = 0; i < F; i++) gs[i] *= wt[s];
    }
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
    float *py = dsib_cpu_f32(y);
    for (uint32_t t = 0; t < n; t++) {
        float *o = py + (size_t)t * ldy;
        const float *r0 = Y + (size_t)t * k * (size_t)D;
        memcpy(o, r0, sizeof(float) * (size_t)D);
        for (uint32_t kk = 1; kk < k; kk++) {
            const float *r = r0 + (size_t)kk * D;
            for (int64_t i = 0; i < D; i++) o[i] += r[i];
        }
    }
done:
    dsib_cpu_free(inst, cnt);
    dsib_cpu_free(inst, offs);
    dsib_cpu_free(inst, ex);
    dsib_cpu_free(inst, xr);
    dsib_cpu_free(inst, yr);
    dsib_cpu_free(inst, G);
    dsib_cpu_free(inst, U);
    dsib_cpu_free(inst, Y);
    return st;
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
    .rope_tail = op_rope_tail,
    .ring_write = op_ring_write,
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
};
