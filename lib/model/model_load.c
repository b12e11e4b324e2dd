/*
 * Model loading: GGUF header → hyperparameters → tensor binding (names, shapes, types per
 * docs/model-files.md §3–§5) → tokenizer → weight residency (mmap in place, or pread into
 * one library-owned buffer) → statistics and fingerprint.
 *
 * mmap mode never touches weight pages at load (only the tiny tid2eid tables are read to
 * validate them), so loading costs about the header parse and RSS grows only as weights are
 * used.
 */
#include "model/model.h"
#include "place/place.h"

#include "base/context_impl.h"
#include "engram/engram.h"
#include "model/layout.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x)                                  \
    do {                                        \
        dsi_status st_ = (x);                   \
        if (st_ != DSI_OK) return st_;          \
    } while (0)

/* Type classes of docs/model-files.md ("Type classes"). */
enum { C_VEC, C_FVEC, C_SMALL, C_MAT, C_EMBD, C_I32, C_TABLE };

static const char *class_types(int cls) {
    switch (cls) {
    case C_VEC: return "f32";
    case C_FVEC:
    case C_SMALL:
    case C_MAT:
    case C_EMBD: return "f32, f16, bf16 or a quantized weight type of docs/tensor-types.md";
    case C_I32: return "i32";
    case C_TABLE: return "fp8_e4m3_r32, f32, f16, bf16";
    }
    return "?";
}

/* Quantized weight types with CPU and Vulkan kernels (matmul, get_rows, MoE): every type
 * lib/quant decodes except the Engram-table row type (docs/tensor-types.md). */
static int weight_type(int32_t t) {
    const dsii_type_traits *tr = dsii_type_get(t);
    return tr && tr->supported && tr->is_quantized && t != DSI_TYPE_FP8_E4M3_R32;
}

static int class_allows(int cls, int32_t t) {
    const int fl = t == DSI_TYPE_F32 || t == DSI_TYPE_F16 || t == DSI_TYPE_BF16;
    switch (cls) {
    case C_VEC: return t == DSI_TYPE_F32;
    /* llama.cpp's quantizer also quantizes the small matrices (mHC fn, compressor, indexer,
     * ape) of community files: they take the matrix types */
    case C_FVEC:
    case C_SMALL:
    case C_MAT:
        return fl || weight_type(t);
    case C_EMBD: return fl || weight_type(t); /* rows are gathered and dequantized (llama.cpp's
                                                 quantizer quantizes token_embd too) */
    case C_I32: return t == DSI_TYPE_I32;
    case C_TABLE: return fl || t == DSI_TYPE_FP8_E4M3_R32;
    }
    return 0;
}

typedef struct binder {
    dsi_model *m;
    const dsii_gguf *g;    /* the file tensors are bound from now (model or draft file) */
    dsii_error *err;
    dsii_tensor *t;        /* m->tensors */
    int32_t *parent;       /* per bound tensor: parent index for views, else -1 */
    const dsii_gguf_tensor **src; /* per bound tensor: its GGUF tensor (parent's for views) */
    const dsii_gguf **srcg;       /* per bound tensor: the file of `src` */
    int ds4v41;            /* ds4 deepseek41 tensor spellings accepted (layout.h) */
    int row264;            /* Engram tables are ds4 I8 [264, rows] rows */
    uint32_t n, cap;
    const char **claimed;  /* GGUF names consumed (bound or deliberately ignored) */
    uint32_t n_claimed, cap_claimed;
} binder;

static void claim(binder *b, const char *name) {
    if (b->n_claimed < b->cap_claimed) b->claimed[b->n_claimed++] = name;
}

static void shape_str(char *buf, size_t cap, uint32_t nd, const int64_t *ne) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (uint32_t i = 0; i < nd && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, i ? ", " : "", ne[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Binds tensor `name` (printf format) of class `cls` and expected shape ne0..ne2 (nd dims).
 * Absent: NULL if !required, else BAD_FORMAT. */
static dsi_status bind(binder *b, const dsii_tensor **dst, int required, int cls, uint32_t nd,
                       int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...)
    DSII_PRINTF(9, 10);
static dsi_status bind(binder *b, const dsii_tensor **dst, int required, int cls, uint32_t nd,
                       int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *dst = NULL;
    const dsii_gguf_tensor *gt = dsii_gguf_find_tensor(b->g, name);
    if (!gt && b->ds4v41 && strncmp(name, "blk.", 4) == 0) {
        /* ds4's deepseek41 Engram tensor names (layout.h) */
        const char *dot = strchr(name + 4, '.');
        const char *alias = dot ? dsii_layout_ds4v41_tensor(dot + 1) : NULL;
        if (alias) {
            char an[256];
            snprintf(an, sizeof an, "%.*s%s", (int)(dot + 1 - name), name, alias);
            gt = dsii_gguf_find_tensor(b->g, an);
        }
    }
    if (!gt) {
        if (required) return dsii_fail(b->err, DSI_ERR_BAD_FORMAT, "missing tensor '%s'", name);
        return DSI_OK;
    }
    /* ds4 Engram tables: raw I8 rows of K E4M3 values then K/32 E8M0 scales; bound as the
     * internal row type with the logical row length K */
    const int row264 = cls == C_TABLE && b->row264;
    if (row264) {
        if (gt->type != DSI_TYPE_I8)
            return dsii_fail(b->err, DSI_ERR_UNSUPPORTED, "tensor '%s' has type %s, expected i8 (%s rows)",
                             gt->name, dsii_type_get(gt->type) ? dsii_type_get(gt->type)->name : "unknown",
                             DSII_ENGRAM_ROW264_ENCODING);
        ne0 = ne0 / 32 * 33;
    }
    const dsii_type_traits *tr = dsii_type_get(gt->type);
    if (!tr || !tr->supported)
        return dsii_fail(b->err, DSI_ERR_UNSUPPORTED, "tensor '%s' has unsupported type %s (%d)", name,
                         tr ? tr->name : "unknown", gt->type);
    if (!row264 && !class_allows(cls, gt->type))
        return dsii_fail(b->err, DSI_ERR_UNSUPPORTED, "tensor '%s' has type %s, not supported for this tensor (allowed: %s)",
                         name, tr->name, class_types(cls));
    const int64_t want[4] = {ne0, ne1, ne2, 1};
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        int64_t have = i < (int)gt->n_dims ? gt->ne[i] : 1;
        int64_t w = i < (int)nd ? want[i] : 1;
        if (have != w) ok = 0;
    }
    if (!ok) {
        char hs[96], ws[96];
        shape_str(hs, sizeof hs, gt->n_dims, gt->ne);
        shape_str(ws, sizeof ws, nd, want);
        return dsii_fail(b->err, DSI_ERR_BAD_FORMAT, "tensor '%s' has shape %s, expected %s", name, hs, ws);
    }
    uint64_t rb = 0;
    if (!dsii_type_row_size(gt->type, gt->ne[0], &rb))
        return dsii_fail(b->err, DSI_ERR_BAD_FORMAT, "tensor '%s': row of %" PRId64 " elements is not a whole number of %s blocks",
                         name, gt->ne[0], tr->name);
    if (b->n >= b->cap) return dsii_fail(b->err, DSI_ERR_INTERNAL, "tensor table overflow at '%s'", name);
    dsii_tensor *t = &b->t[b->n];
    memset(t, 0, sizeof *t);
    t->name = gt->name;
    t->type = gt->type;
    t->n_dims = gt->n_dims;
    for (int i = 0; i < 4; i++) t->ne[i] = gt->ne[i];
    t->n_elements = gt->n_elements;
    t->row_bytes = rb;
    t->row_stride = rb;
    t->nbytes = gt->nbytes;
    t->file_offset = gt->offset;
    /* Engram tables stay in the file in pread / reader mode, unless asked to be resident */
    t->lazy = cls == C_TABLE && b->m->access != DSI_ACCESS_MMAP &&
              !(b->m->load_flags & DSI_MODEL_FLAG_RESIDENT);
    if (row264) {
        t->type = DSII_TYPE_ENGRAM_ROW264;
        t->ne[0] = ne0 / 33 * 32;
        t->n_elements = (uint64_t)t->ne[0] * (uint64_t)gt->ne[1];
    }
    b->parent[b->n] = -1;
    b->src[b->n] = gt;
    b->srcg[b->n] = b->g;
    b->n++;
    claim(b, gt->name);
    *dst = t;
    return DSI_OK;
}

/* A strided column view (cols [c0, c0+ncols)) of a bound 2-D tensor (docs §4.1). */
static dsi_status bind_view(binder *b, const dsii_tensor **dst, const dsii_tensor *parent,
                            int64_t c0, int64_t ncols) {
    uint64_t off = 0, rb = 0;
    if (!dsii_type_row_size(parent->type, c0, &off) || !dsii_type_row_size(parent->type, ncols, &rb))
        return dsii_fail(b->err, DSI_ERR_UNSUPPORTED,
                         "tensor '%s': cannot split a %s row at column %" PRId64 " (not a block boundary)",
                         parent->name, dsii_type_get(parent->type)->name, c0);
    if (b->n >= b->cap) return dsii_fail(b->err, DSI_ERR_INTERNAL, "tensor table overflow");
    dsii_tensor *t = &b->t[b->n];
    *t = *parent;
    t->ne[0] = ncols;
    t->n_elements = (uint64_t)ncols * (uint64_t)parent->ne[1];
    t->row_bytes = rb;
    t->row_stride = parent->row_stride;
    t->file_offset = parent->file_offset + off;
    t->nbytes = parent->nbytes - off;
    t->is_view = 1;
    b->parent[b->n] = (int32_t)(parent - b->t);
    b->src[b->n] = b->src[parent - b->t];
    b->srcg[b->n] = b->srcg[parent - b->t];
    b->n++;
    *dst = t;
    return DSI_OK;
}

/* Per-layer tensors (docs §3.2–§3.4). `pfx` is "blk.N." or "mtp.i."; draft blocks are
 * window-only layers. */
static dsi_status bind_layer(binder *b, const dsii_hparams *hp, const dsii_layer_hparams *lh,
                             dsii_layer_tensors *lt, const char *pfx) {
    const int64_t D = hp->n_embd, Q = hp->q_lora_rank, H = hp->n_head, hd = hp->head_dim;
    const int64_t G = hp->o_groups, R = hp->o_lora_rank, hc = hp->hc_mult, M = hp->hc_mix;
    const int64_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const int64_t E = lh->n_expert, k = lh->n_expert_used, F = hp->expert_ff;
    const int64_t SF = (int64_t)hp->n_expert_shared * F, V = hp->n_vocab;
    const int v41 = hp->arch == DSI_ARCH_DEEPSEEK41;
    const int64_t r = lh->compress_ratio;

    TRY(bind(b, &lt->attn_norm, 1, C_VEC, 1, D, 0, 0, "%sattn_norm.weight", pfx));
    TRY(bind(b, &lt->attn_q_a, 1, C_MAT, 2, D, Q, 0, "%sattn_q_a.weight", pfx));
    TRY(bind(b, &lt->attn_q_a_norm, 1, C_VEC, 1, Q, 0, 0, "%sattn_q_a_norm.weight", pfx));
    TRY(bind(b, &lt->attn_q_b, 1, C_MAT, 2, Q, H * hd, 0, "%sattn_q_b.weight", pfx));
    TRY(bind(b, &lt->attn_kv, 1, C_MAT, 2, D, hd, 0, "%sattn_kv.weight", pfx));
    TRY(bind(b, &lt->attn_kv_norm, 1, C_VEC, 1, hd, 0, 0, "%sattn_kv_a_norm.weight", pfx));
    TRY(bind(b, &lt->attn_sinks, 1, C_VEC, 1, H, 0, 0, "%sattn_sinks.weight", pfx));
    TRY(bind(b, &lt->attn_out_a, 1, C_MAT, 2, H * hd / G, G * R, 0, "%sattn_output_a.weight", pfx));
    TRY(bind(b, &lt->attn_out_b, 1, C_MAT, 2, G * R, D, 0, "%sattn_output_b.weight", pfx));
    TRY(bind(b, &lt->hc_attn_fn, 1, C_SMALL, 2, hc * D, M, 0, "%shc_attn_fn.weight", pfx));
    TRY(bind(b, &lt->hc_attn_base, 1, C_VEC, 1, M, 0, 0, "%shc_attn_base.weight", pfx));
    TRY(bind(b, &lt->hc_attn_scale, 1, C_VEC, 1, 3, 0, 0, "%shc_attn_scale.weight", pfx));
    TRY(bind(b, &lt->hc_ffn_fn, 1, C_SMALL, 2, hc * D, M, 0, "%shc_ffn_fn.weight", pfx));
    TRY(bind(b, &lt->hc_ffn_base, 1, C_VEC, 1, M, 0, 0, "%shc_ffn_base.weight", pfx));
    TRY(bind(b, &lt->hc_ffn_scale, 1, C_VEC, 1, 3, 0, 0, "%shc_ffn_scale.weight", pfx));

    if (!v41 && r > 0) {
        const int64_t co = lh->coff;
        TRY(bind(b, &lt->comp_ape, 1, C_FVEC, 2, co * hd, r, 0, "%sattn_compressor_ape.weight", pfx));
        TRY(bind(b, &lt->comp_kv, 1, C_SMALL, 2, D, co * hd, 0, "%sattn_compressor_kv.weight", pfx));
        TRY(bind(b, &lt->comp_gate, 1, C_SMALL, 2, D, co * hd, 0, "%sattn_compressor_gate.weight", pfx));
        TRY(bind(b, &lt->comp_norm, 1, C_VEC, 1, hd, 0, 0, "%sattn_compressor_norm.weight", pfx));
        if (r == 4) {
            TRY(bind(b, &lt->idx_q_b, 1, C_SMALL, 2, Q, IH * ID, 0, "%sindexer.attn_q_b.weight", pfx));
            TRY(bind(b, &lt->idx_proj, 1, C_SMALL, 2, D, IH, 0, "%sindexer.proj.weight", pfx));
            TRY(bind(b, &lt->idx_comp_ape, 1, C_FVEC, 2, 2 * ID, 4, 0, "%sindexer_compressor_ape.weight", pfx));
            TRY(bind(b, &lt->idx_comp_kv, 1, C_SMALL, 2, D, 2 * ID, 0, "%sindexer_compressor_kv.weight", pfx));
            TRY(bind(b, &lt->idx_comp_gate, 1, C_SMALL, 2, D, 2 * ID, 0, "%sindexer_compressor_gate.weight", pfx));
            TRY(bind(b, &lt->idx_comp_norm, 1, C_VEC, 1, ID, 0, 0, "%sindexer_compressor_norm.weight", pfx));
        }
    }
    if (v41 && lh->is_kv_source) {
        TRY(bind(b, &lt->comp_kv, 1, C_SMALL, 2, D, hd, 0, "%sattn_compressor_kv.weight", pfx));
        if (r > 1) TRY(bind(b, &lt->comp_gate, 1, C_SMALL, 2, D, hd, 0, "%sattn_compressor_gate.weight", pfx));
        TRY(bind(b, &lt->comp_norm, 1, C_VEC, 1, hd, 0, 0, "%sattn_compressor_norm.weight", pfx));
        TRY(bind(b, &lt->idx_k, 1, C_SMALL, 2, hd, ID, 0, "%sindexer.attn_k.weight", pfx));
        TRY(bind(b, &lt->idx_k_norm, 1, C_VEC, 1, ID, 0, 0, "%sindexer.k_norm.weight", pfx));
    }
    if (v41 && lh->is_index_source) {
        TRY(bind(b, &lt->idx_q_b, 1, C_SMALL, 2, Q, IH * ID, 0, "%sindexer.attn_q_b.weight", pfx));
        TRY(bind(b, &lt->idx_proj, 1, C_SMALL, 2, D, IH, 0, "%sindexer.proj.weight", pfx));
    }

    TRY(bind(b, &lt->ffn_norm, 1, C_VEC, 1, D, 0, 0, "%sffn_norm.weight", pfx));
    TRY(bind(b, &lt->ffn_gate_inp, 1, C_SMALL, 2, D, E, 0, "%sffn_gate_inp.weight", pfx));
    if (lh->is_hash)
        TRY(bind(b, &lt->tid2eid, 1, C_I32, 2, k, V, 0, "%sffn_gate_tid2eid.weight", pfx));
    else
        TRY(bind(b, &lt->exp_probs_b, 1, C_VEC, 1, E, 0, 0, "%sexp_probs_b.bias", pfx));
    if (v41) TRY(bind(b, &lt->exp_probs_b_vl, 0, C_VEC, 1, E, 0, 0, "%sexp_probs_b_vl.bias", pfx));
    TRY(bind(b, &lt->ffn_gate_exps, 1, C_MAT, 3, D, F, E, "%sffn_gate_exps.weight", pfx));
    TRY(bind(b, &lt->ffn_up_exps, 1, C_MAT, 3, D, F, E, "%sffn_up_exps.weight", pfx));
    TRY(bind(b, &lt->ffn_down_exps, 1, C_MAT, 3, F, D, E, "%sffn_down_exps.weight", pfx));
    TRY(bind(b, &lt->ffn_gate_shexp, 1, C_MAT, 2, D, SF, 0, "%sffn_gate_shexp.weight", pfx));
    TRY(bind(b, &lt->ffn_up_shexp, 1, C_MAT, 2, D, SF, 0, "%sffn_up_shexp.weight", pfx));
    TRY(bind(b, &lt->ffn_down_shexp, 1, C_MAT, 2, SF, D, 0, "%sffn_down_shexp.weight", pfx));

    if (lh->engram_index >= 0) {
        const dsii_engram_hparams *e = &hp->engram;
        const int64_t K = e->key_length, C = e->n_cols;
        const uint64_t rows = e->rows[lh->engram_index];
        if (rows > (uint64_t)INT64_MAX) return dsii_fail(b->err, DSI_ERR_BAD_FORMAT, "engram rows overflow");
        TRY(bind(b, &lt->engram_embd, 1, C_TABLE, 2, K, (int64_t)rows, 0, "%sengram.embd.weight", pfx));
        TRY(bind(b, &lt->engram_wkv, 1, C_MAT, 2, C * K, (hc + 1) * D, 0, "%sengram.wkv.weight", pfx));
        TRY(bind(b, &lt->engram_q, 1, C_SMALL, 2, D, hc, 0, "%sengram.q.weight", pfx));
        TRY(bind(b, &lt->engram_k, 1, C_SMALL, 2, D, hc, 0, "%sengram.k.weight", pfx));
    }
    return DSI_OK;
}

static int is_vision_name(const char *n) {
    return strncmp(n, "v.", 2) == 0 || strncmp(n, "vision.", 7) == 0 || strncmp(n, "mm.", 3) == 0 ||
           strncmp(n, "aligner.", 8) == 0 || strncmp(n, "image_", 6) == 0;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(const char *const *)a, y = (uintptr_t)*(const char *const *)b;
    return x < y ? -1 : x > y;
}

static int cmp_ptr_r(const void *a, const void *b, void *user) {
    (void)user;
    return cmp_ptr(a, b);
}

static dsi_status bind_all(binder *b, const dsii_hparams *hp) {
    dsi_model *m = b->m;
    dsii_model_tensors *w = &m->w;
    const int64_t D = hp->n_embd, V = hp->n_vocab, hc = hp->hc_mult;
    const int v41 = hp->arch == DSI_ARCH_DEEPSEEK41;

    TRY(bind(b, &w->token_embd, 1, C_EMBD, 2, D, V, 0, "token_embd.weight"));
    TRY(bind(b, &w->output_norm, 1, C_VEC, 1, D, 0, 0, "output_norm.weight"));
    TRY(bind(b, &w->output, 1, C_MAT, 2, D, V, 0, "output.weight"));
    if (!v41) {
        TRY(bind(b, &w->output_hc_fn, 1, C_SMALL, 2, hc * D, hc, 0, "output_hc_fn.weight"));
        TRY(bind(b, &w->output_hc_base, 1, C_VEC, 1, hc, 0, 0, "output_hc_base.weight"));
        TRY(bind(b, &w->output_hc_scale, 1, C_VEC, 1, 1, 0, 0, "output_hc_scale.weight"));
    } else {
        static const char *const hcn[3] = {"output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight"};
        int n = 0;
        for (int i = 0; i < 3; i++) {
            const dsii_gguf_tensor *gt = dsii_gguf_find_tensor(b->g, hcn[i]);
            if (gt) {
                claim(b, gt->name);
                n++;
            }
        }
        if (n) dsii_log(m->ctx, DSI_LOG_INFO, "deepseek41 has no HC head (model-spec 4.2): ignoring %d output_hc_* tensors", n);
    }
    char pfx[32];
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        snprintf(pfx, sizeof pfx, "blk.%u.", i);
        TRY(bind_layer(b, hp, &hp->layer[i], &w->layer[i], pfx));
    }
    const dsii_gguf *main_g = b->g;
    if (hp->draft_file) b->g = m->draft_gguf; /* the draft blocks live in the second file */
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        dsii_draft_tensors *dt = &w->draft[d];
        const dsii_layer_hparams *lh = &hp->draft_layer[d];
        if (hp->mtp_from_nextn) {
            /* llama.cpp nextn convention (docs §4.1) */
            const uint32_t L = hp->n_layer;
            snprintf(pfx, sizeof pfx, "blk.%u.", L);
            TRY(bind_layer(b, hp, lh, &dt->blk, pfx));
            const dsii_tensor *eh = NULL;
            TRY(bind(b, &eh, 1, C_MAT, 2, 2 * D, D, 0, "blk.%u.nextn.eh_proj.weight", L));
            TRY(bind_view(b, &dt->e_proj, eh, 0, D));
            TRY(bind_view(b, &dt->h_proj, eh, D, D));
            TRY(bind(b, &dt->enorm, 1, C_VEC, 1, D, 0, 0, "blk.%u.nextn.enorm.weight", L));
            TRY(bind(b, &dt->hnorm, 1, C_VEC, 1, D, 0, 0, "blk.%u.nextn.hnorm.weight", L));
            /* optional in llama.cpp: absent means the trunk's output_norm */
            TRY(bind(b, &dt->norm, 0, C_VEC, 1, D, 0, 0, "blk.%u.nextn.shared_head_norm.weight", L));
            if (!dt->norm) dt->norm = w->output_norm;
            if (hp->draft_file) {
                /* llama.cpp's MTP file: the MTP block's own HC head is the file's root
                 * output_hc_*; its root token_embd / output / output_norm copy the trunk's */
                TRY(bind(b, &dt->hc_head_fn, 1, C_SMALL, 2, hc * D, hc, 0, "output_hc_fn.weight"));
                TRY(bind(b, &dt->hc_head_base, 1, C_VEC, 1, hc, 0, 0, "output_hc_base.weight"));
                TRY(bind(b, &dt->hc_head_scale, 1, C_VEC, 1, 1, 0, 0, "output_hc_scale.weight"));
                static const char *const copies[3] = {"token_embd.weight", "output.weight", "output_norm.weight"};
                for (int i = 0; i < 3; i++) {
                    const dsii_gguf_tensor *gt = dsii_gguf_find_tensor(b->g, copies[i]);
                    if (gt) claim(b, gt->name);
                }
            } else {
                /* MTP inside a llama.cpp file: llama.cpp runs the MTP head with the trunk's
                 * output_hc_* (the file has no place for the MTP block's own) — so do we */
                dt->hc_head_fn = w->output_hc_fn;
                dt->hc_head_base = w->output_hc_base;
                dt->hc_head_scale = w->output_hc_scale;
                m->hp.mtp_hc_from_trunk = 1;
                dsii_log(m->ctx, DSI_LOG_WARN,
                         "MTP block inside a llama.cpp-layout file: its HC head is the trunk's output_hc_* "
                         "(llama.cpp's semantics; the released MTP has its own, see docs/model-files.md 4.1)");
            }
            /* optional copies of the shared embedding / head: not used (shared with main) */
            char nm[96];
            snprintf(nm, sizeof nm, "blk.%u.nextn.embed_tokens.weight", L);
            const dsii_gguf_tensor *gt = dsii_gguf_find_tensor(b->g, nm);
            if (gt) claim(b, gt->name);
            snprintf(nm, sizeof nm, "blk.%u.nextn.shared_head_head.weight", L);
            gt = dsii_gguf_find_tensor(b->g, nm);
            if (gt) claim(b, gt->name);
            continue;
        }
        snprintf(pfx, sizeof pfx, "mtp.%u.", d);
        TRY(bind_layer(b, hp, lh, &dt->blk, pfx));
        if (!v41) {
            TRY(bind(b, &dt->e_proj, 1, C_MAT, 2, D, D, 0, "mtp.0.e_proj.weight"));
            TRY(bind(b, &dt->h_proj, 1, C_MAT, 2, D, D, 0, "mtp.0.h_proj.weight"));
            TRY(bind(b, &dt->enorm, 1, C_VEC, 1, D, 0, 0, "mtp.0.enorm.weight"));
            TRY(bind(b, &dt->hnorm, 1, C_VEC, 1, D, 0, 0, "mtp.0.hnorm.weight"));
            TRY(bind(b, &dt->norm, 1, C_VEC, 1, D, 0, 0, "mtp.0.norm.weight"));
            TRY(bind(b, &dt->hc_head_fn, 1, C_SMALL, 2, hc * D, hc, 0, "mtp.0.hc_head_fn.weight"));
            TRY(bind(b, &dt->hc_head_base, 1, C_VEC, 1, hc, 0, 0, "mtp.0.hc_head_base.weight"));
            TRY(bind(b, &dt->hc_head_scale, 1, C_VEC, 1, 1, 0, 0, "mtp.0.hc_head_scale.weight"));
        } else {
            const dsii_dspark_hparams *ds = &hp->dspark;
            const int64_t rank = ds->markov_rank;
            if (d == 0) {
                TRY(bind(b, &dt->main_proj, 1, C_MAT, 2, (int64_t)ds->n_target * D, D, 0, "mtp.0.main_proj.weight"));
                TRY(bind(b, &dt->main_norm, 1, C_VEC, 1, D, 0, 0, "mtp.0.main_norm.weight"));
            }
            if (d + 1 == hp->n_draft) {
                TRY(bind(b, &dt->norm, 1, C_VEC, 1, D, 0, 0, "mtp.%u.norm.weight", d));
                TRY(bind(b, &dt->markov_embd, 1, C_EMBD, 2, rank, V, 0, "mtp.%u.markov_embd.weight", d));
                TRY(bind(b, &dt->markov_head, 1, C_MAT, 2, rank, V, 0, "mtp.%u.markov_head.weight", d));
                TRY(bind(b, &dt->confidence, 1, C_SMALL, 2, D + rank, 1, 0, "mtp.%u.confidence_proj.weight", d));
            }
        }
    }
    b->g = main_g;

    /* vision tensors: skipped with one log line; anything else unclaimed is an error */
    const int64_t nt = dsii_gguf_n_tensors(b->g);
    uint64_t vis_bytes = 0;
    for (int64_t i = 0; i < nt; i++) {
        const dsii_gguf_tensor *gt = dsii_gguf_tensor_at(b->g, i);
        if (is_vision_name(gt->name)) {
            claim(b, gt->name);
            m->n_ignored++;
            vis_bytes += gt->nbytes;
        }
    }
    if (m->n_ignored)
        dsii_log(m->ctx, DSI_LOG_INFO, "ignoring %u vision tensors (%" PRIu64 " bytes): libdsinfer is text-only",
                 m->n_ignored, vis_bytes);
    dsii_sort(b->claimed, b->n_claimed, sizeof *b->claimed, cmp_ptr_r, NULL); /* no malloc */
    for (int f = 0; f < 2; f++) {
        const dsii_gguf *g = f ? m->draft_gguf : b->g;
        if (!g) continue;
        const int64_t n = dsii_gguf_n_tensors(g);
        for (int64_t i = 0; i < n; i++) {
            const dsii_gguf_tensor *gt = dsii_gguf_tensor_at(g, i);
            const char *key = gt->name;
            if (!bsearch(&key, b->claimed, b->n_claimed, sizeof *b->claimed, cmp_ptr))
                return dsii_fail(b->err, DSI_ERR_BAD_FORMAT,
                                 "unexpected tensor '%s'%s: not part of this %s configuration (see docs/model-files.md)",
                                 gt->name, f ? " in the draft file" : "", v41 ? "deepseek41" : "deepseek4");
        }
    }
    return DSI_OK;
}

/* ---- fingerprint: 4 lanes of FNV-1a 64 with distinct bases, finalized by a splitmix mix */

typedef struct fp_state {
    uint64_t h[4];
} fp_state;

static void fp_init(fp_state *s) {
    s->h[0] = 0xcbf29ce484222325ull;
    s->h[1] = 0x84222325cbf29ce4ull;
    s->h[2] = 0x9e3779b97f4a7c15ull;
    s->h[3] = 0xd6e8feb86659fd93ull;
}
static void fp_bytes(fp_state *s, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        for (int l = 0; l < 4; l++) {
            s->h[l] ^= (uint64_t)(b[i] + l * 0x55u);
            s->h[l] *= 0x100000001b3ull;
        }
}
static void fp_u64(fp_state *s, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    fp_bytes(s, b, 8);
}
static void fp_f32(fp_state *s, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    fp_u64(s, u);
}
static void fp_str(fp_state *s, const char *str) {
    size_t n = strlen(str);
    fp_u64(s, n);
    fp_bytes(s, str, n);
}
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fp_layer(fp_state *s, const dsii_layer_hparams *l) {
    fp_u64(s, l->compress_ratio);
    fp_u64(s, l->coff);
    fp_u64(s, (uint64_t)(int64_t)l->yarn);
    fp_f32(s, l->rope_base);
    fp_f32(s, l->swiglu_limit);
    fp_f32(s, l->swiglu_limit_shexp);
    fp_u64(s, l->n_expert);
    fp_u64(s, l->n_expert_used);
    const int32_t iv[10] = {l->is_hash, l->has_indexer, l->engram_index, l->is_kv_source,
                            l->is_index_source, l->is_candidate_source, l->cand_masked,
                            l->kv_src, l->key_src, l->topk_src};
    for (int i = 0; i < 10; i++) fp_u64(s, (uint64_t)(int64_t)iv[i]);
    fp_u64(s, (uint64_t)(int64_t)l->cand_src);
}

static void compute_fingerprint(dsi_model *m) {
    const dsii_hparams *hp = &m->hp;
    fp_state s;
    fp_init(&s);
    fp_str(&s, "libdsinfer-model-fingerprint-v1");
    fp_u64(&s, (uint64_t)hp->arch);
    const uint32_t u[] = {hp->n_layer, hp->n_embd, hp->n_vocab, hp->n_ctx_train, hp->n_head,
                          hp->head_dim, hp->rope_dim, hp->q_lora_rank, hp->o_lora_rank,
                          hp->o_groups, hp->window, hp->idx_n_head, hp->idx_head_dim,
                          hp->idx_topk, (uint32_t)hp->candidate_source,
                          hp->candidate_topk_blocks, hp->candidate_block_size, hp->n_expert,
                          hp->n_expert_used, hp->expert_ff, hp->n_expert_shared,
                          hp->n_hash_layer, hp->yarn_orig_ctx, hp->hc_mult,
                          hp->hc_sinkhorn_iters, (uint32_t)hp->hc_lagged, hp->n_draft,
                          (uint32_t)hp->has_mtp, (uint32_t)hp->has_dspark,
                          (uint32_t)hp->has_engram};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) fp_u64(&s, u[i]);
    const float f[] = {hp->route_scale, hp->rope_base, hp->rope_base_compress, hp->yarn_factor,
                       hp->yarn_beta_fast, hp->yarn_beta_slow, hp->rms_eps, hp->hc_eps};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) fp_f32(&s, f[i]);
    for (uint32_t i = 0; i < hp->n_layer; i++) fp_layer(&s, &hp->layer[i]);
    for (uint32_t i = 0; i < hp->n_draft; i++) fp_layer(&s, &hp->draft_layer[i]);
    if (hp->has_dspark) {
        const dsii_dspark_hparams *d = &hp->dspark;
        fp_u64(&s, d->block_size);
        fp_u64(&s, (uint64_t)(int64_t)d->noise_token);
        fp_u64(&s, d->n_target);
        for (uint32_t i = 0; i < d->n_target; i++) fp_u64(&s, d->target_layer_ids[i]);
        fp_u64(&s, d->markov_rank);
        fp_u64(&s, d->n_expert);
        fp_u64(&s, d->n_expert_used);
    }
    if (hp->has_engram) {
        const dsii_engram_hparams *e = &hp->engram;
        fp_u64(&s, e->n_layer);
        for (uint32_t i = 0; i < e->n_layer; i++) fp_u64(&s, e->layer_ids[i]);
        fp_u64(&s, e->n_head);
        fp_u64(&s, e->key_length);
        fp_u64(&s, e->max_ngram);
        fp_u64(&s, e->compressed_vocab);
        fp_u64(&s, e->pad_id);
        for (uint64_t i = 0; i < (uint64_t)e->n_layer * e->max_ngram; i++) fp_u64(&s, e->multipliers[i]);
        for (uint64_t i = 0; i < (uint64_t)e->n_layer * e->n_cols; i++) {
            fp_u64(&s, e->primes[i]);
            fp_u64(&s, e->offsets[i]);
        }
        /* the token map changes which rows a token reads, so it keys saved state too */
        fp_bytes(&s, e->token_map, (size_t)e->n_token_map * sizeof(int32_t));
    }
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dsii_tensor *t = &m->tensors[i];
        fp_str(&s, t->name);
        fp_u64(&s, (uint64_t)(int64_t)t->type);
        fp_u64(&s, t->n_dims);
        for (int d = 0; d < 4; d++) fp_u64(&s, (uint64_t)t->ne[d]);
        fp_u64(&s, (uint64_t)t->is_view);
    }
    for (int l = 0; l < 4; l++) {
        uint64_t v = mix64(s.h[l] ^ mix64(s.h[(l + 1) & 3] + (uint64_t)l));
        for (int i = 0; i < 8; i++) m->fingerprint[8 * l + i] = (uint8_t)(v >> (8 * i));
    }
}

int dsii_model_type_slot(int32_t type) {
    if (type >= 0 && type < DSII_TYPE_SLOTS_GGML) return type;
    if (type == DSII_TYPE_ENGRAM_ROW264) return DSI_TYPE_I8; /* stored as i8 rows */
    if (type >= DSI_TYPE_FP8_E4M3_B128 && type <= DSI_TYPE_FP8_E4M3_R32)
        return DSII_TYPE_SLOTS_GGML + (type - DSI_TYPE_FP8_E4M3_B128);
    return -1;
}

/* ---- loading --------------------------------------------------------------------------- */

typedef struct progress {
    dsi_progress_fn fn;
    void *ud;
} progress;

static dsi_status report(const progress *p, int32_t stage, uint64_t done, uint64_t total,
                         dsii_error *err) {
    static const char *const names[] = {"header", "validate", "tensors", "upload", "done"};
    if (p->fn && p->fn(stage, done, total, p->ud) == 0)
        return dsii_fail(err, DSI_ERR_CANCELLED, "model loading cancelled by the progress callback (stage %s)",
                         names[stage]);
    return DSI_OK;
}

void dsii_model_destroy(dsi_model *m) {
    if (!m) return;
    const dsi_context *ctx = m->ctx;
    if (m->exec_free) m->exec_free(m);
    dsii_place_free(m);
    dsii_free(ctx, (void *)m->expert_counts);
    if (m->tokenizer) dsii_tokenizer_free(m->tokenizer);
    dsii_bigbuf_free(ctx, &m->weights_buf);
    dsii_free(ctx, m->hp_arrays);
    dsii_free(ctx, m->tensors);
    dsii_gguf_close(m->draft_gguf);
    dsii_gguf_close(m->gguf);
    dsii_free(ctx, m);
}

#define READ_CHUNK (8u << 20)

static dsi_status make_resident(dsi_model *m, const int32_t *parent,
                                const dsii_gguf_tensor *const *src, const dsii_gguf *const *srcg,
                                const progress *pg, dsii_error *err) {
    if (m->access == DSI_ACCESS_MMAP) {
        for (uint32_t i = 0; i < m->n_tensors; i++) {
            dsii_tensor *t = &m->tensors[i];
            const uint8_t *base = dsii_gguf_tensor_data(srcg[i], src[i]);
            if (!base)
                return dsii_fail(err, DSI_ERR_INTERNAL, "tensor '%s' is not mapped", t->name);
            t->data = base + (t->file_offset - src[i]->offset);
        }
        return report(pg, DSI_LOAD_STAGE_TENSORS, 1, 1, err);
    }
    /* pread / reader: one aligned buffer for every resident tensor */
    uint64_t total = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dsii_tensor *t = &m->tensors[i];
        if (t->is_view || t->lazy) continue;
        uint64_t a = (t->nbytes + 63) & ~(uint64_t)63;
        if (!dsii_add_u64(total, a, &total) || total > (uint64_t)SIZE_MAX / 2)
            return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "weights too large for host memory");
    }
    if (!dsii_bigbuf_alloc(m->ctx, (size_t)total, 64, &m->weights_buf))
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory for %" PRIu64 " bytes of weights",
                         total);
    m->weights_buf_size = total;
    uint8_t *dst = m->weights_buf.p;
    uint64_t done = 0;
    TRY(report(pg, DSI_LOAD_STAGE_TENSORS, 0, total, err));
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        dsii_tensor *t = &m->tensors[i];
        if (t->is_view || t->lazy) continue;
        for (uint64_t o = 0; o < t->nbytes; o += READ_CHUNK) {
            uint64_t n = t->nbytes - o < READ_CHUNK ? t->nbytes - o : READ_CHUNK;
            TRY(dsii_gguf_tensor_read(srcg[i], src[i], o, n, dst + o, err));
            done += n;
            if (n == READ_CHUNK) TRY(report(pg, DSI_LOAD_STAGE_TENSORS, done, total, err));
        }
        t->data = dst;
        dst += (t->nbytes + 63) & ~(uint64_t)63;
    }
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        dsii_tensor *t = &m->tensors[i];
        if (!t->is_view) continue;
        const dsii_tensor *p = &m->tensors[parent[i]];
        t->lazy = p->lazy;
        t->data = p->data ? (const uint8_t *)p->data + (t->file_offset - p->file_offset) : NULL;
    }
    return report(pg, DSI_LOAD_STAGE_TENSORS, total, total, err);
}

static dsi_status check_tid2eid(const dsi_model *m, dsii_error *err) {
    const dsii_hparams *hp = &m->hp;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const dsii_tensor *t = m->w.layer[l].tid2eid;
        if (!t) continue;
        const uint8_t *p = t->data;
        for (uint64_t i = 0; i < t->n_elements; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            if (v < 0 || (uint32_t)v >= hp->layer[l].n_expert)
                return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                                 "tensor '%s' entry %" PRIu64 " (token %" PRIu64 ", slot %" PRIu64 ") value %d is not an expert (expert_count %u)",
                                 t->name, i, i / (uint64_t)t->ne[0], i % (uint64_t)t->ne[0], v,
                                 hp->layer[l].n_expert);
        }
    }
    return DSI_OK;
}

static dsi_status load_body(dsi_model *m, const dsi_model_options *opt, dsii_error *err) {
    progress pg = {opt ? opt->progress_fn : NULL, opt ? opt->progress_user_data : NULL};
    TRY(report(&pg, DSI_LOAD_STAGE_HEADER, 1, 1, err));

    TRY(dsii_hparams_load(m->ctx, m->gguf, &m->hp, &m->hp_arrays, err));
    if (opt && opt->struct_size >= DSII_FIELD_END(dsi_model_options, draft_path) && opt->draft_path) {
        /* the draft blocks' file (docs §4.3): same access mode, pread for reader models */
        const int32_t mode = m->access == DSI_ACCESS_MMAP ? DSI_ACCESS_MMAP : DSI_ACCESS_PREAD;
        TRY(dsii_gguf_open_path(m->ctx, opt->draft_path, mode, &m->draft_gguf, err));
        TRY(dsii_hparams_draft_file(m->draft_gguf, opt->draft_path, &m->hp, m->gguf, err));
    }
    {
        const char *name = NULL;
        if (dsii_gguf_find_key(m->gguf, "general.name") >= 0 &&
            dsii_gguf_get_string(m->gguf, "general.name", &name, NULL, NULL) == DSI_OK)
            snprintf(m->name, sizeof m->name, "%s", name);
        dsii_error_clear(err);
    }
    /* token count (docs §2.6) */
    {
        uint64_t n = 0;
        uint32_t et = 0;
        dsi_status st = dsii_gguf_get_array(m->gguf, "tokenizer.ggml.tokens", &et, &n, err);
        if (st == DSI_ERR_NOT_FOUND)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing required key 'tokenizer.ggml.tokens'");
        if (st != DSI_OK) return st;
        if (et != DSII_GGUF_STRING || n != m->hp.n_vocab)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "key 'tokenizer.ggml.tokens' has %" PRIu64 " %s entries, expected %u strings (token_embd rows)",
                             n, dsii_gguf_value_type_name(et), m->hp.n_vocab);
    }

    /* bind */
    const int64_t nt = dsii_gguf_n_tensors(m->gguf) + (m->draft_gguf ? dsii_gguf_n_tensors(m->draft_gguf) : 0);
    binder b = {.m = m, .g = m->gguf, .err = err};
    b.ds4v41 = m->hp.key_dialect == DSII_LAYOUT_DS4;
    b.row264 = m->hp.engram.row264;
    b.cap = (uint32_t)nt + 4;
    b.cap_claimed = (uint32_t)nt + 4;
    m->tensors = dsii_calloc(m->ctx, b.cap, sizeof *m->tensors);
    b.parent = dsii_calloc(m->ctx, b.cap, sizeof *b.parent);
    b.src = dsii_calloc(m->ctx, b.cap, sizeof *b.src);
    b.srcg = dsii_calloc(m->ctx, b.cap, sizeof *b.srcg);
    b.claimed = dsii_calloc(m->ctx, b.cap_claimed, sizeof *b.claimed);
    dsi_status st = DSI_OK;
    if (!m->tensors || !b.parent || !b.src || !b.srcg || !b.claimed)
        st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory binding %" PRId64 " tensors", nt);
    b.t = m->tensors;
    if (st == DSI_OK) st = bind_all(&b, &m->hp);
    m->n_tensors = b.n;
    if (st == DSI_OK) st = report(&pg, DSI_LOAD_STAGE_VALIDATE, 1, 1, err);
    if (st == DSI_OK) {
        st = dsii_tokenizer_load(m->ctx, m->gguf, &m->tokenizer, err);
        if (st == DSI_OK && dsii_tokenizer_n_vocab(m->tokenizer) != (int32_t)m->hp.n_vocab)
            st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer has %d tokens, token_embd.weight has %u rows",
                           dsii_tokenizer_n_vocab(m->tokenizer), m->hp.n_vocab);
    }
    /* routing counts of the backbone's MoE layers (dsi_model_expert_counts; the planner
     * checks a routing profile against their shape) */
    if (st == DSI_OK) {
        uint32_t emax = 0;
        for (uint32_t l = 0; l < m->hp.n_layer && l < DSII_MAX_LAYERS; l++)
            if (m->hp.layer[l].n_expert > emax) emax = m->hp.layer[l].n_expert;
        if (emax) {
            m->expert_counts = dsii_calloc(m->ctx, (size_t)m->hp.n_layer * emax, sizeof *m->expert_counts);
            if (!m->expert_counts) st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
            m->counts_layers = m->hp.n_layer;
            m->counts_experts = emax;
        }
    }
    /* memory tiers (lib/place): decides what stays in the file before anything is read */
    if (st == DSI_OK && opt && opt->struct_size >= DSII_FIELD_END(dsi_model_options, place) && opt->place)
        st = dsii_place_plan(m, opt->place, err);
    if (st == DSI_OK) st = make_resident(m, b.parent, b.src, b.srcg, &pg, err);
    dsii_free(m->ctx, b.parent);
    dsii_free(m->ctx, b.src);
    dsii_free(m->ctx, b.srcg);
    dsii_free(m->ctx, b.claimed);
    if (st != DSI_OK) return st;
    TRY(check_tid2eid(m, err));

    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dsii_tensor *t = &m->tensors[i];
        if (t->is_view) continue;
        m->n_params += t->n_elements;
        m->weight_bytes += t->nbytes;
        int s = dsii_model_type_slot(t->type);
        if (s >= 0) m->type_bytes[s] += t->nbytes;
    }
    compute_fingerprint(m);
    /* DSI_LOAD_STAGE_UPLOAD and DSI_LOAD_STAGE_DONE are reported by the API layer
     * (lib/api/model.c), which uploads the weights to a GPU backend once per model. */
    return DSI_OK;
}

dsi_status dsii_model_load_file(dsi_context *ctx, dsii_file *file, const dsi_model_options *opt,
                                dsi_model **out, dsii_error *err) {
    *out = NULL;
    dsi_model *m = dsii_calloc(ctx, 1, sizeof *m);
    if (!m) {
        dsii_file_close(file);
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    }
    m->ctx = ctx;
    m->load_flags = opt ? opt->flags : 0;
    m->access = dsii_file_mode(file);
    if (m->access == DSII_FILE_MEMORY) m->access = DSI_ACCESS_MMAP;
    atomic_init(&m->n_sessions, 0);
    atomic_init(&m->n_detokenizers, 0);
    atomic_flag_clear(&m->error_lock);
    dsi_status st = dsii_gguf_open(file, &m->gguf, err); /* owns file from here */
    if (st == DSI_OK) st = load_body(m, opt, err);
    if (st != DSI_OK) {
        dsii_model_destroy(m);
        return st;
    }
    /* Resident: every byte is in library memory now, so the file (or the application's
     * reader) is let go before the load returns and never read again. */
    if (m->load_flags & DSI_MODEL_FLAG_RESIDENT) dsii_file_release(dsii_gguf_file(m->gguf));
    if (ctx) atomic_fetch_add(&ctx->n_models, 1);
    *out = m;
    return DSI_OK;
}

dsi_status dsii_model_check_file(const dsi_model *m, dsii_error *err) {
    return m ? dsii_file_check(dsii_gguf_file(m->gguf), err) : DSI_OK;
}

const dsii_tensor *dsii_model_find_tensor(const dsi_model *m, const char *name) {
    if (!m || !name) return NULL;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0 && !m->tensors[i].is_view) return &m->tensors[i];
    return NULL;
}

dsi_status dsii_model_tensor_read(const dsi_model *m, const dsii_tensor *t, uint64_t offset,
                                  uint64_t len, void *dst, dsii_error *err) {
    if (!m || !t || (!dst && len))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsii_model_tensor_read: NULL argument");
    uint64_t end;
    if (!dsii_add_u64(offset, len, &end) || end > t->nbytes)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "read of %" PRIu64 " bytes at %" PRIu64 " beyond tensor '%s' (%" PRIu64 " bytes)",
                         len, offset, t->name, t->nbytes);
    if (t->data) {
        memcpy(dst, (const uint8_t *)t->data + offset, (size_t)len);
        return DSI_OK;
    }
    return dsii_file_read(dsii_gguf_file(m->gguf), t->file_offset + offset, len, dst, err);
}

static void error_lock(dsi_model *m) {
    while (atomic_flag_test_and_set_explicit(&m->error_lock, memory_order_acquire)) {
    }
}

dsi_status dsii_model_fail(dsi_model *m, const dsii_error *e) {
    dsii_set_thread_error(e->msg);
    if (m) {
        error_lock(m);
        m->last_error = *e;
        atomic_flag_clear_explicit(&m->error_lock, memory_order_release);
    }
    return e->status;
}

void dsii_model_error_copy(const dsi_model *m, char out[DSII_ERROR_MSG_MAX]) {
    dsi_model *mm = (dsi_model *)(uintptr_t)m; /* the lock is the one mutable part */
    error_lock(mm);
    memcpy(out, mm->last_error.msg, DSII_ERROR_MSG_MAX);
    atomic_flag_clear_explicit(&mm->error_lock, memory_order_release);
    out[DSII_ERROR_MSG_MAX - 1] = '\0';
}
