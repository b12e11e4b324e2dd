/*
 * dsinfer-quantize: a deepseek4 / deepseek41 GGUF (any layout libdsinfer reads) -> a GGUF with
 * other types per tensor class, in any layout (docs/converting.md "Requantizing").
 *
 *   dsinfer-quantize IN.gguf -o OUT.gguf [--draft IN-mtp.gguf] [--layout L] [--type T]
 *                    [--type-CLASS T ...] [--imatrix FILE.dat | --imatrix-text FILE.txt
 *                    [--imatrix-ctx N] [--imatrix-chunks N] [--imatrix-out F.dat] |
 *                    --imatrix-energy] [--no-mtp] [--mtp-out FILE] [-t N] [--quiet]
 *
 * The input is loaded with the library (so every layout, draft file and type it reads is
 * accepted) and written through the layout writer (lib/model/emit.h) row run by row run.
 * An importance matrix weights the error the K-quant encoders minimize: computed here by
 * libdsinfer's forward pass over a text (--imatrix-text, imatrix.c), or read from llama.cpp's
 * imatrix .dat (per tensor, one importance per input column, routed experts as E consecutive
 * vectors); --imatrix-energy uses the weights' own column energy instead (ds4's bootstrap).
 */
#define _POSIX_C_SOURCE 200809L
#include "imatrix.h"
#include "weighted.h"

#include "dsinfer.h"
#include "base/base.h"
#include "engram/engram.h"
#include "model/emit.h"
#include "model/model.h"
#include "quant/fp.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_err[1024];

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Tensor classes, as dsinfer-convert's (docs/converting.md "Types"). */
enum { CL_VEC, CL_APE, CL_SMALL, CL_ATTN, CL_SHEXP, CL_EXPERTS, CL_HEAD, CL_EMBD, CL_ENGRAM, CL_DRAFT,
       CL_TABLE, CL_I32, CL_COUNT };
static const char *const k_cls[CL_COUNT] = {"vec", "ape", "small", "attn", "shexp", "experts",
                                            "head", "embd", "engram", "draft", "table", "i32"};

/* Slots of dsii_layer_tensors: offset, native suffix, class. */
#define LS(f, s, c) {offsetof(dsii_layer_tensors, f), s, c}
static const struct {
    size_t off;
    const char *suffix;
    int cls;
} k_layer[] = {
    LS(attn_norm, "attn_norm.weight", CL_VEC), LS(attn_q_a, "attn_q_a.weight", CL_ATTN),
    LS(attn_q_a_norm, "attn_q_a_norm.weight", CL_VEC), LS(attn_q_b, "attn_q_b.weight", CL_ATTN),
    LS(attn_kv, "attn_kv.weight", CL_ATTN), LS(attn_kv_norm, "attn_kv_a_norm.weight", CL_VEC),
    LS(attn_sinks, "attn_sinks.weight", CL_VEC), LS(attn_out_a, "attn_output_a.weight", CL_ATTN),
    LS(attn_out_b, "attn_output_b.weight", CL_ATTN), LS(hc_attn_fn, "hc_attn_fn.weight", CL_SMALL),
    LS(hc_attn_base, "hc_attn_base.weight", CL_VEC), LS(hc_attn_scale, "hc_attn_scale.weight", CL_VEC),
    LS(hc_ffn_fn, "hc_ffn_fn.weight", CL_SMALL), LS(hc_ffn_base, "hc_ffn_base.weight", CL_VEC),
    LS(hc_ffn_scale, "hc_ffn_scale.weight", CL_VEC), LS(comp_ape, "attn_compressor_ape.weight", CL_APE),
    LS(comp_kv, "attn_compressor_kv.weight", CL_SMALL), LS(comp_gate, "attn_compressor_gate.weight", CL_SMALL),
    LS(comp_norm, "attn_compressor_norm.weight", CL_VEC), LS(idx_q_b, "indexer.attn_q_b.weight", CL_SMALL),
    LS(idx_proj, "indexer.proj.weight", CL_SMALL), LS(idx_comp_ape, "indexer_compressor_ape.weight", CL_APE),
    LS(idx_comp_kv, "indexer_compressor_kv.weight", CL_SMALL),
    LS(idx_comp_gate, "indexer_compressor_gate.weight", CL_SMALL),
    LS(idx_comp_norm, "indexer_compressor_norm.weight", CL_VEC), LS(idx_k, "indexer.attn_k.weight", CL_SMALL),
    LS(idx_k_norm, "indexer.k_norm.weight", CL_VEC), LS(ffn_norm, "ffn_norm.weight", CL_VEC),
    LS(ffn_gate_inp, "ffn_gate_inp.weight", CL_SMALL), LS(exp_probs_b, "exp_probs_b.bias", CL_VEC),
    LS(exp_probs_b_vl, "exp_probs_b_vl.bias", CL_VEC), LS(tid2eid, "ffn_gate_tid2eid.weight", CL_I32),
    LS(ffn_gate_exps, "ffn_gate_exps.weight", CL_EXPERTS), LS(ffn_up_exps, "ffn_up_exps.weight", CL_EXPERTS),
    LS(ffn_down_exps, "ffn_down_exps.weight", CL_EXPERTS), LS(ffn_gate_shexp, "ffn_gate_shexp.weight", CL_SHEXP),
    LS(ffn_up_shexp, "ffn_up_shexp.weight", CL_SHEXP), LS(ffn_down_shexp, "ffn_down_shexp.weight", CL_SHEXP),
    LS(engram_embd, "engram.embd.weight", CL_TABLE), LS(engram_wkv, "engram.wkv.weight", CL_ENGRAM),
    LS(engram_q, "engram.q.weight", CL_SMALL), LS(engram_k, "engram.k.weight", CL_SMALL),
};
#define DS(f, s, c) {offsetof(dsii_draft_tensors, f), s, c}
static const struct {
    size_t off;
    const char *suffix;
    int cls;
} k_draft[] = {
    DS(e_proj, "e_proj.weight", CL_DRAFT), DS(h_proj, "h_proj.weight", CL_DRAFT), DS(enorm, "enorm.weight", CL_VEC),
    DS(hnorm, "hnorm.weight", CL_VEC), DS(norm, "norm.weight", CL_VEC), DS(hc_head_fn, "hc_head_fn.weight", CL_SMALL),
    DS(hc_head_base, "hc_head_base.weight", CL_VEC), DS(hc_head_scale, "hc_head_scale.weight", CL_VEC),
    DS(main_proj, "main_proj.weight", CL_DRAFT), DS(main_norm, "main_norm.weight", CL_VEC),
    DS(markov_embd, "markov_embd.weight", CL_EMBD), DS(markov_head, "markov_head.weight", CL_DRAFT),
    DS(confidence, "confidence_proj.weight", CL_SMALL),
};

typedef struct item {
    char name[96];          /* native name */
    const dsii_tensor *t;
    int cls;
    int32_t type;           /* output type */
    const float *imp;       /* importance per input column (per expert: E vectors), or NULL */
    uint64_t n_imp;
} item;

typedef struct qctx {
    item *it;
    size_t n, cap;
    int32_t cls_type[CL_COUNT];
    int layout;
    /* imatrix */
    char **imp_names;
    float **imp_vals;
    uint64_t *imp_n;
    size_t n_imp, cap_imp;
    int energy;
    uint64_t weighted_rows, plain_rows;
    int threads; /* -t: threads that encode a tensor's rows */
} qctx;

static int add(qctx *q, const char *name, const dsii_tensor *t, int cls) {
    if (!t) return 0;
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 512;
        item *p = realloc(q->it, sizeof *p * q->cap);
        if (!p) return fail("out of memory");
        q->it = p;
    }
    item *i = &q->it[q->n++];
    memset(i, 0, sizeof *i);
    snprintf(i->name, sizeof i->name, "%s", name);
    i->t = t;
    i->cls = cls;
    return 0;
}

static int collect(qctx *q, const dsi_model *m) {
    const dsii_model_tensors *w = &m->w;
    const dsii_hparams *hp = &m->hp;
    if (add(q, "token_embd.weight", w->token_embd, CL_EMBD)) return -1;
    char nm[96];
    for (uint32_t l = 0; l < hp->n_layer; l++)
        for (size_t k = 0; k < sizeof k_layer / sizeof k_layer[0]; k++) {
            snprintf(nm, sizeof nm, "blk.%u.%s", l, k_layer[k].suffix);
            if (add(q, nm, *(const dsii_tensor *const *)((const char *)&w->layer[l] + k_layer[k].off), k_layer[k].cls))
                return -1;
        }
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        for (size_t k = 0; k < sizeof k_layer / sizeof k_layer[0]; k++) {
            snprintf(nm, sizeof nm, "mtp.%u.%s", d, k_layer[k].suffix);
            if (add(q, nm, *(const dsii_tensor *const *)((const char *)&w->draft[d].blk + k_layer[k].off),
                    k_layer[k].cls))
                return -1;
        }
        for (size_t k = 0; k < sizeof k_draft / sizeof k_draft[0]; k++) {
            /* (a llama.cpp file with the MTP inside binds the trunk's HC head here: written as the
             * MTP's, the output computes what llama.cpp computes from the input) */
            const dsii_tensor *t = *(const dsii_tensor *const *)((const char *)&w->draft[d] + k_draft[k].off);
            snprintf(nm, sizeof nm, "mtp.%u.%s", d, k_draft[k].suffix);
            if (add(q, nm, t, k_draft[k].cls)) return -1;
        }
    }
    return add(q, "output_norm.weight", w->output_norm, CL_VEC) || add(q, "output.weight", w->output, CL_HEAD) ||
           add(q, "output_hc_fn.weight", w->output_hc_fn, CL_SMALL) ||
           add(q, "output_hc_base.weight", w->output_hc_base, CL_VEC) ||
           add(q, "output_hc_scale.weight", w->output_hc_scale, CL_VEC);
}

/* ---- importance matrix (llama.cpp's legacy imatrix .dat) -------------------------------- */

static int load_imatrix(qctx *q, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail("%s: cannot open", path);
    int32_t n = 0;
    int rc = 0;
    if (fread(&n, 4, 1, f) != 1 || n < 1 || n > 1000000) rc = fail("%s: bad entry count", path);
    if (!rc) {
        q->imp_names = calloc((size_t)n, sizeof *q->imp_names);
        q->imp_vals = calloc((size_t)n, sizeof *q->imp_vals);
        q->imp_n = calloc((size_t)n, sizeof *q->imp_n);
        if (!q->imp_names || !q->imp_vals || !q->imp_n) rc = fail("out of memory");
        else q->cap_imp = (size_t)n;
    }
    for (int32_t i = 0; !rc && i < n; i++) {
        int32_t len = 0, ncall = 0, nval = 0;
        if (fread(&len, 4, 1, f) != 1 || len < 1 || len > 4096) {
            rc = fail("%s: entry %d: bad name length", path, i);
            break;
        }
        q->imp_names[i] = calloc((size_t)len + 1, 1);
        if (!q->imp_names[i] || fread(q->imp_names[i], 1, (size_t)len, f) != (size_t)len ||
            fread(&ncall, 4, 1, f) != 1 || fread(&nval, 4, 1, f) != 1 || nval < 1 || nval > (1 << 28)) {
            rc = fail("%s: entry %d: truncated or bad value count", path, i);
            break;
        }
        q->imp_vals[i] = malloc(sizeof(float) * (size_t)nval);
        if (!q->imp_vals[i] || fread(q->imp_vals[i], 4, (size_t)nval, f) != (size_t)nval) {
            rc = fail("%s: entry '%s': truncated values", path, q->imp_names[i]);
            break;
        }
        for (int32_t k = 0; k < nval; k++)
            if (!(q->imp_vals[i][k] >= 0.0f && q->imp_vals[i][k] < 1e30f)) {
                rc = fail("%s: entry '%s': importance [%d] = %g is not a finite non-negative number", path,
                          q->imp_names[i], k, (double)q->imp_vals[i][k]);
                break;
            }
        q->imp_n[i] = (uint64_t)nval;
        q->n_imp++;
    }
    fclose(f);
    return rc;
}

static void attach_imatrix(qctx *q, const dsi_model *m) {
    for (size_t i = 0; i < q->n; i++) {
        item *it = &q->it[i];
        const char *fname = it->t->name; /* the input file's spelling */
        for (size_t k = 0; k < q->n_imp; k++)
            if (!strcmp(q->imp_names[k], it->name) || !strcmp(q->imp_names[k], fname)) {
                it->imp = q->imp_vals[k];
                it->n_imp = q->imp_n[k];
            }
    }
    (void)m;
}

/* ---- types -------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int32_t type;
} k_types[] = {
    {"keep", -1}, {"f32", DSI_TYPE_F32}, {"f16", DSI_TYPE_F16}, {"bf16", DSI_TYPE_BF16}, {"q8_0", DSI_TYPE_Q8_0},
    {"q4_k", DSI_TYPE_Q4_K}, {"q2_k", DSI_TYPE_Q2_K}, {"iq2_xxs", DSI_TYPE_IQ2_XXS}, {"mxfp4", DSI_TYPE_MXFP4},
    {"fp8", -2},
};

static int32_t out_type(const qctx *q, const dsi_model *m, const item *it) {
    const int32_t src = it->t->type;
    if (it->cls == CL_VEC) return DSI_TYPE_F32;
    if (it->cls == CL_I32) return DSI_TYPE_I32;
    if (it->cls == CL_TABLE) {
        /* lossless: the ds4 row encoding back to fp8_e4m3_r32 (the layout writer re-encodes) */
        if (src == DSII_TYPE_ENGRAM_ROW264) return DSI_TYPE_FP8_E4M3_R32;
        return src;
    }
    int32_t t = q->cls_type[it->cls];
    if (t == -1) t = src;
    if (t == -2) t = m->hp.arch == DSI_ARCH_DEEPSEEK41 ? DSI_TYPE_FP8_E4M3_B32 : DSI_TYPE_FP8_E4M3_B128;
    uint64_t rb;
    if (!dsii_type_row_size(t, it->t->ne[0], &rb))
        t = dsii_type_row_size(DSI_TYPE_Q8_0, it->t->ne[0], &rb) ? DSI_TYPE_Q8_0 : DSI_TYPE_F16;
    return t;
}

/* ---- fills ------------------------------------------------------------------------------- */

typedef struct fill_ctx {
    qctx *q;
    const item *it;
} fill_ctx;

static int row_f32(const dsii_tensor *t, const uint8_t *p, float *dst) {
    if (t->type == DSII_TYPE_ENGRAM_ROW264) {
        for (int64_t j = 0; j < t->ne[0]; j++) dst[j] = dsii_e4m3_to_f32(p[j]) * dsii_e8m0_to_f32(p[t->ne[0] + j / 32]);
        return 0;
    }
    if (t->type == DSI_TYPE_I32) {
        for (int64_t j = 0; j < t->ne[0]; j++) {
            int32_t v;
            memcpy(&v, p + 4 * j, 4);
            dst[j] = (float)v;
        }
        return 0;
    }
    return dsii_dequantize_row(t->type, p, dst, t->ne[0], NULL) != DSI_OK;
}

/* One worker's share of a fill call: rows [r0 + a, r0 + b) into dst (whose row 0 is r0).
 * Rows are independent (each is decoded and encoded alone, with deterministic encoders), so
 * the output does not depend on how the rows are split over threads. */
typedef struct fill_work {
    const fill_ctx *fc;
    uint64_t r0, a, b;
    uint8_t *dst;
    uint64_t weighted, plain;
    int rc;
    char err[512];
} fill_work;

static int work_fail(fill_work *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int work_fail(fill_work *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    return -1;
}

static void *fill_range(void *arg) {
    fill_work *w = arg;
    const item *it = w->fc->it;
    const dsii_tensor *t = it->t;
    const int64_t n0 = t->ne[0];
    uint64_t orb = 0;
    dsii_type_row_size(it->type, n0, &orb);
    float *f = malloc(sizeof(float) * (size_t)n0);
    if (!f) {
        w->rc = work_fail(w, "tensor '%s': out of memory", t->name);
        return NULL;
    }
    int rc = 0;
    const uint64_t rows_per_exp = (uint64_t)t->ne[1];
    for (uint64_t r = w->a; r < w->b && !rc; r++) {
        const uint64_t R = w->r0 + r;
        const uint8_t *src = (const uint8_t *)t->data + R * t->row_stride;
        uint8_t *o = w->dst + r * orb;
        if (it->type == t->type) {
            memcpy(o, src, (size_t)orb);
            continue;
        }
        if (t->type == DSII_TYPE_ENGRAM_ROW264 && it->type == DSI_TYPE_FP8_E4M3_R32) {
            for (int64_t b = 0; b < n0 / 32; b++) { /* [K values][K/32 scales] -> [e][32] x K/32 */
                o[b * 33] = src[n0 + b];
                memcpy(o + b * 33 + 1, src + b * 32, 32);
            }
            continue;
        }
        if (row_f32(t, src, f)) {
            rc = work_fail(w, "tensor '%s': cannot decode type %d", t->name, t->type);
            break;
        }
        if (it->type == DSI_TYPE_I32) {
            for (int64_t j = 0; j < n0; j++) {
                int32_t v = (int32_t)f[j];
                memcpy(o + 4 * j, &v, 4);
            }
            continue;
        }
        const float *imp = NULL;
        if (it->imp) {
            const uint64_t e = R / rows_per_exp;
            if (it->n_imp == (uint64_t)n0) imp = it->imp;
            else if (it->n_imp == (uint64_t)n0 * (uint64_t)t->ne[2] && e < (uint64_t)t->ne[2]) imp = it->imp + e * (uint64_t)n0;
        }
        if (imp && dsii_weighted_supported(it->type)) {
            rc = dsii_quantize_row_weighted(it->type, f, imp, o, n0) ? work_fail(w, "tensor '%s': weighted quantization", t->name) : 0;
            w->weighted++;
        } else if (imp && dsii_type_get(it->type)->quantize_row_w) {
            /* the ggml types whose quantizer searches with importance weights (lib/quant) */
            dsii_error e;
            rc = dsii_quantize_row_imat(it->type, f, o, n0, imp, &e) != DSI_OK ? work_fail(w, "tensor '%s': %s", t->name, e.msg) : 0;
            w->weighted++;
        } else {
            dsii_error e;
            rc = dsii_quantize_row(it->type, f, o, n0, &e) != DSI_OK ? work_fail(w, "tensor '%s': %s", t->name, e.msg) : 0;
            w->plain++;
        }
    }
    free(f);
    w->rc = rc;
    return NULL;
}

/* Threads of one fill call (-t): at most this many, and at least this much work per thread
 * (rows x columns) before a call is split at all, so small tensors do not pay thread starts. */
#define FILL_MAX_THREADS 256
#define FILL_MIN_VALUES (1u << 13)

static int fill(void *user, uint64_t r0, uint64_t n, void *dst) {
    fill_ctx *fc = user;
    const item *it = fc->it;
    const uint64_t n0 = (uint64_t)it->t->ne[0];
    uint64_t nt = (uint64_t)fc->q->threads;
    const int converts = it->type != it->t->type; /* copies are memory-bound: one thread */
    if (!converts || nt < 1) nt = 1;
    if (nt > n) nt = n;
    while (nt > 1 && n * n0 / nt < FILL_MIN_VALUES) nt--;
    fill_work w[FILL_MAX_THREADS];
    pthread_t th[FILL_MAX_THREADS];
    int started[FILL_MAX_THREADS] = {0};
    for (uint64_t k = 0; k < nt; k++) {
        w[k] = (fill_work){.fc = fc, .r0 = r0, .a = n * k / nt, .b = n * (k + 1) / nt, .dst = dst};
        w[k].err[0] = 0;
    }
    /* the first share runs on this thread; a thread that cannot start leaves its share to it */
    for (uint64_t k = 1; k < nt; k++) started[k] = pthread_create(&th[k], NULL, fill_range, &w[k]) == 0;
    fill_range(&w[0]);
    for (uint64_t k = 1; k < nt; k++) {
        if (started[k]) pthread_join(th[k], NULL);
        else fill_range(&w[k]);
    }
    int rc = 0;
    for (uint64_t k = 0; k < nt; k++) { /* counters, and the error of the first failing row */
        fc->q->weighted_rows += w[k].weighted;
        fc->q->plain_rows += w[k].plain;
        if (w[k].rc && !rc) {
            rc = fail("%s", w[k].err);
        }
    }
    return rc != 0;
}

/* Importance from the weights' own column energy (sum of squares over the rows of each
 * expert), for --imatrix-energy. */
static float *energy(const dsii_tensor *t, uint64_t *n_out) {
    const int64_t n0 = t->ne[0], rows = t->ne[1], ne2 = t->ne[2];
    float *imp = calloc((size_t)(n0 * ne2), sizeof *imp), *f = malloc(sizeof(float) * (size_t)n0);
    if (!imp || !f) {
        free(imp);
        free(f);
        return NULL;
    }
    for (int64_t e = 0; e < ne2; e++)
        for (int64_t r = 0; r < rows; r++) {
            if (row_f32(t, (const uint8_t *)t->data + (uint64_t)(e * rows + r) * t->row_stride, f)) continue;
            for (int64_t j = 0; j < n0; j++) imp[e * n0 + j] += f[j] * f[j];
        }
    free(f);
    *n_out = (uint64_t)(n0 * ne2);
    return imp;
}

/* ---- tokenizer and other keys -------------------------------------------------------------- */

static int copy_kv(dsii_gguf_writer *w, const dsii_gguf *g, int64_t i) {
    dsii_error e;
    const char *key = dsii_gguf_kv_key(g, i);
    const uint32_t t = dsii_gguf_kv_type(g, i);
    const dsii_gguf_value *v = dsii_gguf_kv_val(g, i);
    dsi_status st = DSI_OK;
    if (t == DSII_GGUF_STRING) {
        const char *s;
        size_t len;
        st = dsii_gguf_get_string(g, key, &s, &len, &e);
        if (st == DSI_OK) st = dsii_gguf_writer_add_string_n(w, key, s, len, &e);
    } else if (t == DSII_GGUF_ARRAY) {
        const uint32_t et = dsii_gguf_arr_type(g, i);
        const uint64_t n = dsii_gguf_arr_len(g, i);
        if (et == DSII_GGUF_STRING) {
            const char **s = malloc(sizeof *s * (size_t)(n + 1));
            size_t *l = malloc(sizeof *l * (size_t)(n + 1));
            if (!s || !l) st = DSI_ERR_OUT_OF_HOST_MEMORY;
            for (uint64_t k = 0; st == DSI_OK && k < n; k++) s[k] = dsii_gguf_arr_str(g, i, k, &l[k]);
            if (st == DSI_OK) st = dsii_gguf_writer_add_string_array(w, key, s, l, n, &e);
            free(s);
            free(l);
        } else if (dsii_gguf_arr_data(g, i)) {
            st = dsii_gguf_writer_add_array(w, key, et, dsii_gguf_arr_data(g, i), n, &e);
        }
    } else if (t == DSII_GGUF_F32 || t == DSII_GGUF_F64) {
        double d = 0;
        dsii_gguf_val_as_f64(v, &d);
        st = t == DSII_GGUF_F32 ? dsii_gguf_writer_add_f32(w, key, (float)d, &e) : dsii_gguf_writer_add_f64(w, key, d, &e);
    } else if (t == DSII_GGUF_BOOL) {
        uint64_t u = 0;
        dsii_gguf_val_as_u64(v, &u);
        st = dsii_gguf_writer_add_bool(w, key, (int)u, &e);
    } else if (t == DSII_GGUF_I8 || t == DSII_GGUF_I16 || t == DSII_GGUF_I32 || t == DSII_GGUF_I64) {
        int64_t s = 0;
        dsii_gguf_val_as_i64(v, &s);
        st = dsii_gguf_writer_add_i64(w, key, s, &e);
    } else {
        uint64_t u = 0;
        dsii_gguf_val_as_u64(v, &u);
        st = u > UINT32_MAX ? dsii_gguf_writer_add_u64(w, key, u, &e) : dsii_gguf_writer_add_u32(w, key, (uint32_t)u, &e);
    }
    return st == DSI_OK ? 0 : fail("copying key '%s' failed", key);
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsinfer-quantize IN.gguf -o OUT.gguf [--draft IN-mtp.gguf] [--layout llama.cpp|ds4|native]\n"
               "                        [--type T] [--type-CLASS T ...] [--imatrix FILE.dat | --imatrix-energy |\n"
               "                         --imatrix-text FILE.txt [--imatrix-ctx 512] [--imatrix-chunks N] [--imatrix-out F]]\n"
               "                        [--no-mtp] [--mtp-out FILE] [-t N] [--quiet]\n"
               "T: keep (default) f32 f16 bf16 q8_0 q4_k q2_k iq2_xxs mxfp4 fp8 (native layout only), or\n"
               "   q4_0 q4_1 q5_0 q5_1 q3_k q5_k q6_k iq4_nl iq4_xs iq3_xxs iq3_s iq2_xs iq2_s iq1_s iq1_m\n"
               "--type sets the matrices (attn shexp experts head engram draft); CLASS: attn shexp experts head\n"
               "engram draft embd small ape, or all. -t N: threads that encode rows (default: every online CPU;\n"
               "the output does not depend on it). docs/converting.md \"Requantizing\".\n");
}

static int run(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *draft = NULL, *imat = NULL, *mtp_out = NULL, *itext = NULL, *iout = NULL;
    uint32_t ictx = 512, ichunks = 0;
    qctx q;
    memset(&q, 0, sizeof q);
    q.layout = DSII_LAYOUT_LLAMACPP;
    for (int i = 0; i < CL_COUNT; i++) q.cls_type[i] = -1;
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN); /* default -t: every online CPU */
    q.threads = ncpu < 1 ? 1 : ncpu > FILL_MAX_THREADS ? FILL_MAX_THREADS : (int)ncpu;
    int no_mtp = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(a, "--draft") && i + 1 < argc) draft = argv[++i];
        else if (!strcmp(a, "--imatrix") && i + 1 < argc) imat = argv[++i];
        else if (!strcmp(a, "--imatrix-energy")) q.energy = 1;
        else if (!strcmp(a, "--imatrix-text") && i + 1 < argc) itext = argv[++i];
        else if (!strcmp(a, "--imatrix-out") && i + 1 < argc) iout = argv[++i];
        else if (!strcmp(a, "--imatrix-ctx") && i + 1 < argc) ictx = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--imatrix-chunks") && i + 1 < argc) ichunks = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--mtp-out") && i + 1 < argc) mtp_out = argv[++i];
        else if (!strcmp(a, "--no-mtp")) no_mtp = 1;
        else if ((!strcmp(a, "-t") || !strcmp(a, "--threads")) && i + 1 < argc) {
            char *end = NULL;
            const long v = strtol(argv[++i], &end, 10);
            if (!*argv[i] || *end || v < 1 || v > FILL_MAX_THREADS)
                return fail("%s wants a thread count from 1 to %d, not '%s'", a, FILL_MAX_THREADS, argv[i]);
            q.threads = (int)v;
        }
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--layout") && i + 1 < argc) {
            q.layout = dsii_layout_parse(argv[++i]);
            if (q.layout < 0) return fail("unknown layout '%s'", argv[i]);
        } else if ((!strcmp(a, "--type") || !strncmp(a, "--type-", 7)) && i + 1 < argc) {
            int32_t t = 0;
            int ok = 0;
            for (size_t k = 0; k < sizeof k_types / sizeof k_types[0]; k++)
                if (!strcmp(argv[i + 1], k_types[k].name)) t = k_types[k].type, ok = 1;
            if (!ok) { /* any further type lib/quant can write (q4_0 ... iq1_m) */
                const dsii_type_traits *tr = dsii_type_get(dsii_type_by_name(argv[i + 1]));
                if (tr && tr->is_quantized && tr->quantize_row && tr->type < 1024) t = tr->type, ok = 1;
            }
            if (!ok) return fail("unknown type '%s'", argv[i + 1]);
            i++;
            if (!strcmp(a, "--type")) {
                const int m[] = {CL_ATTN, CL_SHEXP, CL_EXPERTS, CL_HEAD, CL_ENGRAM, CL_DRAFT};
                for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) q.cls_type[m[k]] = t;
            } else {
                int found = 0;
                for (int k = 0; k < CL_COUNT; k++)
                    if (!strcmp(a + 7, "all") ? (k != CL_VEC && k != CL_I32 && k != CL_TABLE) : !strcmp(a + 7, k_cls[k]))
                        q.cls_type[k] = t, found = 1;
                if (!found) return fail("unknown tensor class '%s'", a + 7);
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (a[0] != '-' && !in) in = a;
        else {
            usage(stderr);
            return fail("unexpected argument '%s'", a);
        }
    }
    if (!in || !out) {
        usage(stderr);
        return fail("need IN.gguf and -o OUT.gguf");
    }
    if ((imat != NULL) + (itext != NULL) + q.energy > 1)
        return fail("--imatrix, --imatrix-text and --imatrix-energy exclude each other");
    if (itext && ictx < 2) return fail("--imatrix-ctx must be at least 2");
    dsi_context *ctx = NULL;
    if (dsi_context_create(NULL, &ctx) != DSI_OK) return fail("%s", dsi_last_error());
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.draft_path = draft;
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, in, &mo, &m) != DSI_OK) {
        fail("%s", dsi_last_error());
        dsi_context_free(ctx);
        return -1;
    }
    int rc = collect(&q, m);
    if (!rc && imat) {
        rc = load_imatrix(&q, imat);
        if (!rc) attach_imatrix(&q, m);
    }
    dsii_imatrix im;
    memset(&im, 0, sizeof im);
    if (!rc && itext) {
        char e[512];
        if (dsii_imatrix_collect(ctx, m, itext, ictx, ichunks, &im, e, sizeof e)) {
            rc = fail("%s", e);
        } else {
            if (!quiet)
                fprintf(stderr, "dsinfer-quantize: importance from %" PRIu64 " tokens of %s (%u chunks of <= %u)\n",
                        im.tokens, itext, im.chunks, ictx);
            if (iout && dsii_imatrix_save(&im, iout)) rc = fail("%s: cannot write the imatrix", iout);
            for (size_t i = 0; !rc && i < q.n; i++)
                for (size_t k = 0; k < im.n; k++)
                    if (im.name[k] == q.it[i].t->name && im.n_call[k]) {
                        q.it[i].imp = im.val[k];
                        q.it[i].n_imp = im.n_val[k];
                    }
        }
    }
    for (size_t i = 0; !rc && i < q.n; i++) {
        item *it = &q.it[i];
        it->type = out_type(&q, m, it);
        const dsii_type_traits *tr = dsii_type_get(it->type);
        if (it->type != it->t->type && it->type != DSI_TYPE_I32 && !(it->t->type == DSII_TYPE_ENGRAM_ROW264) &&
            (!tr || !tr->quantize_row))
            rc = fail("tensor '%s': libdsinfer cannot write type %s yet", it->name, tr ? tr->name : "?");
        const int fp8 = it->type == DSI_TYPE_FP8_E4M3_B128 || it->type == DSI_TYPE_FP8_E4M3_B32 ||
                        (it->type == DSI_TYPE_FP8_E4M3_R32 && it->cls != CL_TABLE);
        if (!rc && fp8 && q.layout != DSII_LAYOUT_NATIVE)
            rc = fail("tensor '%s' would be %s, a type of the native layout only (choose a ggml type, e.g. --type-%s q8_0, "
                      "or --layout native)", it->name, tr ? tr->name : "?", k_cls[it->cls]);
        if (!rc && q.energy && it->type != it->t->type && (dsii_weighted_supported(it->type) || (tr && tr->quantize_row_w))) {
            it->imp = energy(it->t, &it->n_imp);
            if (!it->imp) rc = fail("out of memory");
        }
    }
    dsii_emitter *em = NULL;
    dsii_error de;
    if (!rc && dsii_emitter_create(&m->hp, q.layout, m->name[0] ? m->name : NULL, no_mtp, &em, &de) != DSI_OK)
        rc = fail("%s", de.msg);
    const dsii_gguf *g = m->gguf;
    for (int part = 0; !rc && part < DSII_EMIT_PARTS; part++) {
        dsii_gguf_writer *w = dsii_emitter_writer(em, part);
        if (!w) continue;
        for (int64_t k = 0; !rc && k < dsii_gguf_n_kv(g); k++)
            if (!strncmp(dsii_gguf_kv_key(g, k), "tokenizer.", 10)) rc = copy_kv(w, g, k);
        if (!rc && dsii_gguf_writer_add_string(w, "general.quantized_by", "dsinfer-quantize", &de) != DSI_OK)
            rc = fail("%s", de.msg);
    }
    fill_ctx *fcs = calloc(q.n + 1, sizeof *fcs);
    if (!fcs) rc = fail("out of memory");
    for (size_t i = 0; !rc && i < q.n; i++) {
        item *it = &q.it[i];
        fcs[i] = (fill_ctx){&q, it};
        const int64_t *ne = it->t->ne;
        uint32_t nd = it->t->n_dims;
        if (it->t->is_view) nd = 2; /* e_proj / h_proj read out of a fused eh_proj */
        if (dsii_emitter_add_rows(em, it->name, it->type, nd, ne, 0, fill, &fcs[i], &de) != DSI_OK)
            rc = fail("tensor '%s': %s", it->name, de.msg);
    }
    char mtp_path[4096];
    if (mtp_out) snprintf(mtp_path, sizeof mtp_path, "%s", mtp_out);
    else dsii_emit_draft_path(out, mtp_path, sizeof mtp_path);
    for (int part = 0; !rc && part < DSII_EMIT_PARTS; part++) {
        if (!dsii_emitter_has_part(em, part)) continue;
        const char *dst = part == DSII_EMIT_MAIN ? out : mtp_path;
        if (dsii_emitter_write(em, part, dst, &de) != DSI_OK) {
            rc = g_err[0] ? -1 : fail("%s", de.msg);
            remove(dst);
        } else if (!quiet) {
            fprintf(stderr, "dsinfer-quantize: wrote %s (%s layout, %.3f GiB)\n", dst, dsii_layout_name(q.layout),
                    (double)dsii_emitter_size(em, part) / 1073741824.0);
        }
    }
    if (!rc && !quiet && (imat || itext || q.energy))
        fprintf(stderr, "dsinfer-quantize: %" PRIu64 " rows quantized with importance, %" PRIu64 " without\n",
                q.weighted_rows, q.plain_rows);
    dsii_emitter_free(em);
    free(fcs);
    if (q.energy)
        for (size_t i = 0; i < q.n; i++) free((void *)q.it[i].imp);
    for (size_t i = 0; i < q.cap_imp; i++) { /* entries a failed read left half-made too */
        free(q.imp_names[i]);
        free(q.imp_vals[i]);
    }
    free(q.imp_names);
    free(q.imp_vals);
    dsii_imatrix_free(&im);
    free(q.imp_n);
    free(q.it);
    dsi_model_free(m);
    dsi_context_free(ctx);
    return rc;
}

int main(int argc, char **argv) {
    if (run(argc, argv) != 0) {
        fprintf(stderr, "dsinfer-quantize: %s\n", g_err[0] ? g_err : "failed");
        return 1;
    }
    return 0;
}
