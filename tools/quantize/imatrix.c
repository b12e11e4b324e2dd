/*
 * Importance matrix over a text, computed by libdsinfer's own forward pass (imatrix.h).
 *
 * The model runs on the CPU backend; its ops table is wrapped for the duration (the wrapper
 * lives here, in the tool: the library is unchanged). Every matrix product reports its input
 * rows before running: matmul (plain and per-expert), matmul_multi (each of its entries),
 * matmul_grouped (the grouped output
 * projection: all groups accumulate into the weight's columns, as ds4 aggregates them) and the
 * routed experts, whose gate / up inputs are the token rows sent to each expert and whose down
 * input (silu(min(g, lim)) * clamp(u, ±lim) * routing weight) is recomputed here from the
 * expert's rows. Importance of column j = mean of x_j² over the rows that met the weight —
 * llama.cpp's imatrix definition.
 */
#define _POSIX_C_SOURCE 200809L
#include "imatrix.h"

#include "backend/device.h"
#include "backends/backend.h"
#include "backends/cpu/cpu_impl.h"
#include "base/context_impl.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stat_t {
    const dsii_tensor *t;
    double *sum;       /* [n_exp][ne0] */
    uint64_t *count;   /* [n_exp] */
    uint32_t n_exp;
} stat_t;

static struct {
    stat_t *s;
    size_t n;
    const dsib_ops *orig;
    dsib_ops ops;
    dsib_backend be;
    int failed;
} g;

static stat_t *find(const uint8_t *p) {
    for (size_t i = 0; i < g.n; i++) {
        const dsii_tensor *t = g.s[i].t;
        const uint8_t *d = t->data;
        if (p >= d && p < d + t->nbytes) return &g.s[i];
    }
    return NULL;
}

static void acc(stat_t *s, uint32_t e, const float *x, uint64_t n0) {
    if (!s || e >= s->n_exp || n0 != (uint64_t)s->t->ne[0]) return;
    double *d = s->sum + (uint64_t)e * n0;
    for (uint64_t j = 0; j < n0; j++) d[j] += (double)x[j] * (double)x[j];
    s->count[e]++;
}

static uint32_t expert_of(const stat_t *s, const uint8_t *p) {
    const uint64_t per = (uint64_t)s->t->ne[1] * s->t->row_stride;
    return (uint32_t)((uint64_t)(p - (const uint8_t *)s->t->data) / per);
}

static dsi_status w_matmul(dsib_stream *st, const dsib_weight *w, int32_t expert, dsib_view x, uint32_t ldx,
                           dsib_view y, uint32_t ldy, uint32_t n) {
    const uint8_t *p = dsib_cpu_wptr(w) + (uint64_t)expert * w->nb2;
    stat_t *s = find(p);
    if (s) {
        const float *xs = dsib_cpu_f32(x);
        for (uint32_t t = 0; t < n; t++) acc(s, expert_of(s, p), xs + (uint64_t)t * ldx, (uint64_t)w->ne[0]);
    }
    return g.orig->matmul(st, w, expert, x, ldx, y, ldy, n);
}

/* Several matmuls in one call (the projections of one input: q_a / kv / compressor /
 * indexer, the router with the shared expert's gate and up): each entry as w_matmul. */
static dsi_status w_multi(dsib_stream *st, const dsib_mm *mm, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) {
        const dsib_weight *w = mm[i].w;
        const uint8_t *p = dsib_cpu_wptr(w) + (uint64_t)mm[i].expert * w->nb2;
        stat_t *s = find(p);
        if (!s) continue;
        const float *xs = dsib_cpu_f32(mm[i].x);
        for (uint32_t t = 0; t < mm[i].n; t++)
            acc(s, expert_of(s, p), xs + (uint64_t)t * mm[i].ldx, (uint64_t)w->ne[0]);
    }
    return g.orig->matmul_multi(st, mm, count);
}

static dsi_status w_grouped(dsib_stream *st, const dsib_weight *w, uint32_t groups, dsib_view x, uint32_t ldx,
                            dsib_view y, uint32_t ldy, uint32_t n) {
    stat_t *s = find(dsib_cpu_wptr(w));
    if (s) {
        const float *xs = dsib_cpu_f32(x);
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t gi = 0; gi < groups; gi++)
                acc(s, 0, xs + (uint64_t)t * ldx + (uint64_t)gi * (uint64_t)w->ne[0], (uint64_t)w->ne[0]);
    }
    return g.orig->matmul_grouped(st, w, groups, x, ldx, y, ldy, n);
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

static dsi_status w_experts(dsib_stream *st, dsib_view x, uint32_t ldx, dsib_view sel, dsib_view wts, uint32_t k,
                            const dsib_weight *w1, const dsib_weight *w3, const dsib_weight *w2, float limit,
                            uint32_t n, dsib_view y, uint32_t ldy) {
    stat_t *s1 = find(dsib_cpu_wptr(w1)), *s3 = find(dsib_cpu_wptr(w3)), *s2 = find(dsib_cpu_wptr(w2));
    const float *xs = dsib_cpu_f32(x), *ws = dsib_cpu_f32(wts);
    const int32_t *ss = dsib_cpu_i32(sel);
    const uint64_t D = (uint64_t)w1->ne[0], F = (uint64_t)w1->ne[1];
    float *h = s2 ? malloc(sizeof(float) * F) : NULL;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < k; j++) {
            const uint32_t e = (uint32_t)ss[(uint64_t)t * k + j];
            const float *xt = xs + (uint64_t)t * ldx;
            acc(s1, e, xt, D);
            acc(s3, e, xt, D);
            if (!h) continue;
            /* the down projection's input, as the op computes it */
            const uint8_t *r1 = dsib_cpu_wptr(w1) + (uint64_t)e * w1->nb2, *r3 = dsib_cpu_wptr(w3) + (uint64_t)e * w3->nb2;
            for (uint64_t f = 0; f < F; f++) {
                float gv = 0, uv = 0;
                if (dsii_dot_row(w1->type, r1 + f * w1->nb1, xt, (int64_t)D, &gv, NULL) != DSI_OK ||
                    dsii_dot_row(w3->type, r3 + f * w3->nb1, xt, (int64_t)D, &uv, NULL) != DSI_OK)
                    g.failed = 1;
                if (limit > 0) {
                    gv = gv < limit ? gv : limit;
                    uv = uv < -limit ? -limit : uv > limit ? limit : uv;
                }
                h[f] = silu(gv) * uv * ws[(uint64_t)t * k + j];
            }
            acc(s2, e, h, F);
        }
    free(h);
    return g.orig->moe_experts(st, x, ldx, sel, wts, k, w1, w3, w2, limit, n, y, ldy);
}

int dsii_imatrix_collect(dsi_context *ctx, dsi_model *m, const char *text_path, uint32_t n_ctx, uint32_t max_chunks,
                         dsii_imatrix *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    dsii_device *slot = dsii_context_compute(ctx);
    if (!slot || strcmp(slot->name, "cpu") != 0) {
        snprintf(err, errcap, "the importance pass runs on the CPU backend");
        return -1;
    }
    FILE *f = fopen(text_path, "rb");
    if (!f) {
        snprintf(err, errcap, "%s: cannot open", text_path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len > 0 ? malloc((size_t)len) : NULL;
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(text);
        snprintf(err, errcap, "%s: empty or unreadable", text_path);
        return -1;
    }
    fclose(f);
    size_t nt = 0;
    dsi_tokenize(m, text, (size_t)len, 0, NULL, 0, &nt);
    dsi_token *tok = malloc(sizeof *tok * (nt + 1));
    if (!tok || dsi_tokenize(m, text, (size_t)len, 0, tok, nt, &nt) != DSI_OK) {
        free(text);
        free(tok);
        snprintf(err, errcap, "%s: tokenization failed: %s", text_path, dsi_last_error());
        return -1;
    }
    free(text);
    /* statistics for every matrix the model binds */
    g.s = calloc(m->n_tensors, sizeof *g.s);
    g.n = 0;
    g.failed = 0;
    for (uint32_t i = 0; g.s && i < m->n_tensors; i++) {
        const dsii_tensor *t = &m->tensors[i];
        if (t->is_view || t->lazy || t->n_dims < 2 || !t->data) continue;
        stat_t *s = &g.s[g.n++];
        s->t = t;
        s->n_exp = (uint32_t)t->ne[2];
        s->sum = calloc((size_t)(t->ne[0] * t->ne[2]), sizeof *s->sum);
        s->count = calloc(s->n_exp, sizeof *s->count);
        if (!s->sum || !s->count) g.failed = 1;
    }
    int rc = 0;
    if (!g.s || g.failed) {
        snprintf(err, errcap, "out of memory for the importance statistics");
        rc = -1;
    }
    /* wrap the backend's ops for the pass */
    const dsib_backend *orig_be = slot->be;
    if (!rc) {
        g.orig = orig_be->ops;
        g.ops = *g.orig;
        g.ops.matmul = w_matmul;
        if (g.orig->matmul_grouped) g.ops.matmul_grouped = w_grouped;
        if (g.orig->matmul_multi) g.ops.matmul_multi = w_multi;
        g.ops.moe_experts = w_experts;
        g.be = *orig_be;
        g.be.ops = &g.ops;
        slot->be = &g.be;
    }
    uint64_t used = 0;
    uint32_t chunks = 0;
    for (size_t p0 = 0; !rc && p0 + 2 <= nt && (!max_chunks || chunks < max_chunks); p0 += n_ctx, chunks++) {
        const size_t cn = nt - p0 < n_ctx ? nt - p0 : n_ctx;
        dsi_session_options so;
        dsi_session_options_init(&so);
        so.n_ctx = (uint32_t)cn;
        so.flags = DSI_SESSION_FLAG_NO_FAKE_QUANT;
        dsi_session *s = NULL;
        if (dsi_session_create(m, &so, &s) != DSI_OK || dsi_session_append(s, tok + p0, cn) != DSI_OK) {
            snprintf(err, errcap, "importance pass, chunk %u: %s", chunks, dsi_last_error());
            rc = -1;
        }
        dsi_session_free(s);
        used += cn;
    }
    slot->be = orig_be;
    free(tok);
    if (!rc && g.failed) {
        snprintf(err, errcap, "importance pass: a weight row could not be decoded");
        rc = -1;
    }
    if (!rc) {
        out->n = g.n;
        out->name = calloc(g.n, sizeof *out->name);
        out->val = calloc(g.n, sizeof *out->val);
        out->n_val = calloc(g.n, sizeof *out->n_val);
        out->n_call = calloc(g.n, sizeof *out->n_call);
        out->tokens = used;
        out->chunks = chunks;
        for (size_t i = 0; out->name && out->val && out->n_val && out->n_call && i < g.n; i++) {
            const stat_t *s = &g.s[i];
            const uint64_t n0 = (uint64_t)s->t->ne[0];
            out->name[i] = s->t->name;
            out->n_val[i] = n0 * s->n_exp;
            out->val[i] = malloc(sizeof(float) * (size_t)out->n_val[i]);
            if (!out->val[i]) break;
            for (uint32_t e = 0; e < s->n_exp; e++) {
                out->n_call[i] += s->count[e];
                for (uint64_t j = 0; j < n0; j++)
                    /* an expert no token reached weighs every column alike */
                    out->val[i][e * n0 + j] = s->count[e] ? (float)(s->sum[e * n0 + j] / (double)s->count[e]) : 1.0f;
            }
        }
    }
    for (size_t i = 0; i < g.n; i++) {
        free(g.s[i].sum);
        free(g.s[i].count);
    }
    free(g.s);
    memset(&g, 0, sizeof g);
    return rc;
}

int dsii_imatrix_save(const dsii_imatrix *im, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int32_t n = 0;
    for (size_t i = 0; i < im->n; i++) n += im->n_call[i] > 0;
    int ok = fwrite(&n, 4, 1, f) == 1;
    for (size_t i = 0; ok && i < im->n; i++) {
        if (!im->n_call[i]) continue;
        const int32_t len = (int32_t)strlen(im->name[i]);
        const int32_t nc = (int32_t)(im->n_call[i] > INT32_MAX ? INT32_MAX : im->n_call[i]), nv = (int32_t)im->n_val[i];
        ok = fwrite(&len, 4, 1, f) == 1 && fwrite(im->name[i], 1, (size_t)len, f) == (size_t)len &&
             fwrite(&nc, 4, 1, f) == 1 && fwrite(&nv, 4, 1, f) == 1 &&
             fwrite(im->val[i], 4, (size_t)nv, f) == (size_t)nv;
    }
    return fclose(f) == 0 && ok ? 0 : -1;
}

void dsii_imatrix_free(dsii_imatrix *im) {
    for (size_t i = 0; im->val && i < im->n; i++) free(im->val[i]);
    free(im->name);
    free(im->val);
    free(im->n_val);
    free(im->n_call);
    memset(im, 0, sizeof *im);
}
