/*
 * lib/arch/dsv41.c — the DeepSeek V4.1 Flash forward pass ("deepseek41"), model-spec §4.
 *
 * Streaming form (§3.10): one eval call runs n tokens at positions pos .. pos+n-1 through
 * every layer with backend ops only; per-session state (window rings, shared compressed KV,
 * index keys, compressor partial groups) lives in backend buffers, the Engram n-gram history
 * is the session's own timeline (eval receives tokens[0 .. pos+n)). The structure:
 *
 *   X = hc_expand(embed(ids))                        §4.1
 *   for every layer i:
 *     if Engram layer: X += gate · value             §4.6 (rows gathered on the host)
 *     lagged mHC around attention and MoE            §4.2
 *   logits = head · RMSNorm(Σ_h f_pre[h] X[h])       §4.1 (last layer's FFN pre mix)
 *
 * Attention (§4.3, CSA2): window KV FP8-simulated over the whole head in blocks of 32;
 * KV sources compress (ratio 2 gated / ratio 1 plain) into a shared compressed cache (FP4,
 * E4M3 scales, blocks of 16) and own the index keys (FP4, UE8M0, blocks of 32); index sources
 * score against their key source (§10.3: always the owner's own key cache, prefill and
 * decode alike); the candidate source publishes candidate blocks that later (non-KV) index
 * sources are masked to; every other compressed layer reuses the latest index source's
 * top-k. docs/v41-forward.md has the long form.
 */
#include "arch/arch.h"

#include "backends/backend.h"
#include "base/context_impl.h"
#include "engram/engram.h"
#include "kv/kv.h"
#include "model/model.h"
#include "moe/moe.h"

#include <math.h>
#include <string.h>

#define V41_DEFAULT_MARGIN 256u /* exact-rewind margin (tokens), as dsv4.c */
#define V41_LOGIT_ROWS 16u      /* output-head rows per slice (logits scratch) */

typedef struct v41_lw {
    dsib_weight attn_norm, q_a, q_a_norm, q_b, kv, kv_norm, sinks, out_a, out_b;
    dsib_weight hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    dsib_weight comp_kv, comp_gate, comp_norm, idx_k, idx_k_norm, idx_q_b, idx_proj;
    dsib_weight ffn_norm;
    dsii_moe_weights moe;              /* lib/moe (shared with V4): §4.4 settings */
    dsib_weight eng_wkv, eng_q, eng_k;
    /* state offsets (bytes in st->state) */
    uint64_t off_ring;                 /* window ring [ring_w][hd] */
    uint64_t off_comp, off_keys;       /* KV source: compressed rows [n_comp][hd], keys [n_comp][ID] */
    uint64_t off_ckv_ring, off_csc_ring; /* KV source, ratio > 1: token rows [ring_c][hd] */
    uint64_t off_idx;                  /* index source: top-k [n_batch][topk] (scratch) */
} v41_lw;

struct dsii_arch_state {
    dsi_model *model;
    const dsii_hparams *hp;
    const dsi_context *ctx;
    const dsib_backend *be;
    dsib_instance *inst;
    const dsib_ops *ops;
    dsii_arch_params p;
    uint32_t margin, ring_w, ring_c, n_comp_rows;
    uint32_t fq_flags;

    dsib_weight tok_embd, out_norm, output;
    v41_lw *lw;                         /* [n_layer] */
    dsii_wset ws;                       /* weight bindings (lib/arch/arch.c) */

    dsii_engram_layout elay[DSII_MAX_ENGRAM_LAYERS];
    dsii_engram_table etab[DSII_MAX_ENGRAM_LAYERS];
    uint32_t *erows;                    /* host [n_batch][C] */
    float *ehost;                       /* host [n_batch][C*K] */

    dsib_buffer *state, *scratch;
    /* scratch offsets (bytes) */
    uint64_t o_ids, o_e, o_X, o_ca, o_cf, o_x, o_xn, o_qr, o_q, o_kv, o_att, o_low, o_aout;
    uint64_t o_ckv, o_csc, o_pool, o_iq, o_iw, o_cand, o_lg, o_sel, o_wts, o_mout, o_shg,
        o_shu, o_sh, o_logits, o_eE[DSII_MAX_ENGRAM_LAYERS], o_ekv;

    uint32_t n_tokens;                  /* evaluated positions the state holds */
};

/* ---- helpers ------------------------------------------------------------------------------ */

static dsib_view SV(dsii_arch_state *st, uint64_t off) {
    dsib_view v = {st->scratch, off};
    return v;
}
static dsib_view STV(dsii_arch_state *st, uint64_t off) {
    dsib_view v = {st->state, off};
    return v;
}
static const dsib_view NOVIEW = {NULL, 0};

static dsi_status be_fail(dsii_error *e, dsi_status s, const char *what, int layer) {
    if (s == DSI_OK) return DSI_OK;
    return dsii_fail(e, s, "deepseek41: backend op %s failed (layer %d): %s", what, layer,
                     dsi_status_string(s));
}
#define CK(expr, what, layer)                                                               \
    do {                                                                                    \
        dsi_status s_ = (expr);                                                             \
        if (s_ != DSI_OK) return be_fail(e, s_, what, layer);                               \
    } while (0)

static dsi_status bind(dsii_arch_state *st, const dsii_tensor *t, dsib_weight *w,
                       dsii_error *e) {
    return dsii_wset_bind(&st->ws, t, w, e);
}

static dsib_rope layer_rope(const dsii_hparams *hp, const dsii_layer_hparams *L) {
    dsib_rope r;
    memset(&r, 0, sizeof r);
    r.freq_base = L->rope_base;
    r.yarn_factor = L->yarn ? hp->yarn_factor : 1.0f;
    r.yarn_orig_ctx = (float)hp->yarn_orig_ctx;
    r.yarn_beta_fast = hp->yarn_beta_fast;
    r.yarn_beta_slow = hp->yarn_beta_slow;
    r.n_rot = (int32_t)hp->rope_dim;
    return r;
}

/* ---- state -------------------------------------------------------------------------------- */

static void v41_state_free(dsii_arch_state *st) {
    if (!st) return;
    if (st->be) {
        if (st->state) st->be->buffer_free(st->inst, st->state);
        if (st->scratch) st->be->buffer_free(st->inst, st->scratch);
        dsii_wset_free(&st->ws);
    }
    dsii_free(st->ctx, st->lw);
    dsii_free(st->ctx, st->erows);
    dsii_free(st->ctx, st->ehost);
    dsii_free(st->ctx, st);
}

/* Reserves `bytes` (rounded up to 256) at *cursor; returns the offset. */
static uint64_t take(uint64_t *cursor, uint64_t bytes) {
    uint64_t o = *cursor;
    *cursor += (bytes + 255u) & ~(uint64_t)255u;
    return o;
}

static dsi_status bind_layer(dsii_arch_state *st, const dsii_layer_tensors *T,
                             const dsii_layer_hparams *lh, v41_lw *w, dsii_error *e) {
    /* §4.4: MoE as V4 without hash routing; weights / (Σ + 1e-20) · route scale */
    w->moe.n_expert = lh->n_expert;
    w->moe.k = lh->n_expert_used;
    w->moe.limit = lh->swiglu_limit;
    w->moe.limit_shared = lh->swiglu_limit_shexp;
    w->moe.route_scale = st->hp->route_scale;
    w->moe.norm_add = 1e-20f;
    const dsii_tensor *const src[] = {
        T->attn_norm, T->attn_q_a, T->attn_q_a_norm, T->attn_q_b, T->attn_kv, T->attn_kv_norm,
        T->attn_sinks, T->attn_out_a, T->attn_out_b, T->hc_attn_fn, T->hc_attn_base,
        T->hc_attn_scale, T->hc_ffn_fn, T->hc_ffn_base, T->hc_ffn_scale, T->comp_kv,
        T->comp_gate, T->comp_norm, T->idx_k, T->idx_k_norm, T->idx_q_b, T->idx_proj,
        T->ffn_norm, T->ffn_gate_inp, T->exp_probs_b, T->ffn_gate_exps, T->ffn_up_exps,
        T->ffn_down_exps, T->ffn_gate_shexp, T->ffn_up_shexp, T->ffn_down_shexp,
        T->engram_wkv, T->engram_q, T->engram_k};
    dsib_weight *const dst[] = {
        &w->attn_norm, &w->q_a, &w->q_a_norm, &w->q_b, &w->kv, &w->kv_norm, &w->sinks,
        &w->out_a, &w->out_b, &w->hc_attn_fn, &w->hc_attn_base, &w->hc_attn_scale,
        &w->hc_ffn_fn, &w->hc_ffn_base, &w->hc_ffn_scale, &w->comp_kv, &w->comp_gate,
        &w->comp_norm, &w->idx_k, &w->idx_k_norm, &w->idx_q_b, &w->idx_proj, &w->ffn_norm,
        &w->moe.gate_inp, &w->moe.bias, &w->moe.w1, &w->moe.w3, &w->moe.w2, &w->moe.sh_gate,
        &w->moe.sh_up, &w->moe.sh_down, &w->eng_wkv, &w->eng_q, &w->eng_k};
    for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
        dsi_status s = bind(st, src[i], dst[i], e);
        if (s != DSI_OK) return s;
    }
    return DSI_OK;
}

static dsi_status v41_state_create(dsi_model *model, const dsii_arch_params *p,
                                   dsii_arch_state **out, dsii_error *e) {
    *out = NULL;
    const dsii_hparams *hp = &model->hp;
    if (hp->arch != DSI_ARCH_DEEPSEEK41)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: model is not deepseek41");
    const dsib_backend *be_ = NULL;
    dsib_instance *inst_ = NULL;
    dsi_status s0 = dsii_arch_backend(model, &be_, &inst_, e);
    if (s0 != DSI_OK) return s0;
    dsii_arch_state *st = (dsii_arch_state *)dsii_calloc(model->ctx, 1, sizeof *st);
    if (!st) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: session state");
    st->model = model;
    st->hp = hp;
    st->ctx = model->ctx;
    st->be = be_;
    st->inst = inst_;
    st->ops = st->be->ops;
    st->ws.be = be_;
    st->ws.inst = inst_;
    st->ws.ctx = model->ctx;
    st->ws.model = model;
    st->p = *p;
    st->margin = p->rewind_margin ? p->rewind_margin : V41_DEFAULT_MARGIN;
    st->fq_flags = (p->flags & DSI_SESSION_FLAG_NO_FAKE_QUANT) ? DSIB_FQ_NO_ROUND : 0u;
    dsi_status s = DSI_OK;
    if (!st->ops || st->ops->struct_size < offsetof(dsib_ops, engram_gate) + sizeof(void *) ||
        !st->ops->indexer_topk_v41 || !st->ops->engram_gate) {
        s = dsii_fail(e, DSI_ERR_UNSUPPORTED, "deepseek41: backend '%s' lacks the V4.1 ops",
                      st->be->name);
        goto fail;
    }

    const uint32_t L = hp->n_layer, D = hp->n_embd, hc = hp->hc_mult, hd = hp->head_dim;
    const uint32_t nb = p->n_batch, ID = hp->idx_head_dim, IH = hp->idx_n_head;
    uint32_t max_ratio = 1;
    for (uint32_t i = 0; i < L; i++)
        if (hp->layer[i].compress_ratio > max_ratio) max_ratio = hp->layer[i].compress_ratio;
    st->ring_w = hp->window + st->margin;
    st->ring_c = max_ratio + st->margin;
    st->n_comp_rows = p->n_ctx + 1; /* rows c < n_ctx / ratio (ratio >= 1) */

    st->lw = (v41_lw *)dsii_calloc(st->ctx, L ? L : 1, sizeof *st->lw);
    if (!st->lw) {
        s = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: layer table");
        goto fail;
    }
    if ((s = bind(st, model->w.token_embd, &st->tok_embd, e)) != DSI_OK ||
        (s = bind(st, model->w.output_norm, &st->out_norm, e)) != DSI_OK ||
        (s = bind(st, model->w.output, &st->output, e)) != DSI_OK)
        goto fail;
    for (uint32_t i = 0; i < L; i++) {
        s = bind_layer(st, &model->w.layer[i], &hp->layer[i], &st->lw[i], e);
        if (s != DSI_OK) goto fail;
    }

    /* Engram layouts and tables (§4.6). */
    const dsii_engram_hparams *eh = &hp->engram;
    uint32_t C = eh->n_cols, K = eh->key_length;
    if (hp->has_engram && eh->n_layer > 0) {
        for (uint32_t j = 0; j < eh->n_layer; j++) {
            dsii_engram_layout *l = &st->elay[j];
            l->n_heads = (int32_t)eh->n_head;
            l->max_ngram = (int32_t)eh->max_ngram;
            l->n_cols = (int32_t)eh->n_cols;
            l->pad_cid = (int32_t)eh->pad_id;
            l->compressed_vocab = eh->compressed_vocab;
            l->n_vocab = eh->n_token_map;
            l->cmap = eh->token_map;
            l->n_rows = eh->rows[j];
            if (eh->max_ngram > DSII_ENGRAM_MAX_NGRAM || eh->n_cols > DSII_ENGRAM_MAX_COLS) {
                s = dsii_fail(e, DSI_ERR_UNSUPPORTED, "deepseek41: engram layout too large");
                goto fail;
            }
            for (uint32_t k = 0; k < eh->max_ngram; k++)
                l->multipliers[k] = eh->multipliers[j * eh->max_ngram + k];
            for (uint32_t c = 0; c < eh->n_cols; c++) {
                l->primes[c] = eh->primes[j * eh->n_cols + c];
                l->offsets[c] = eh->offsets[j * eh->n_cols + c];
            }
            if ((s = dsii_engram_layout_check(l, "engram", e)) != DSI_OK) goto fail;
            const dsii_tensor *t = model->w.layer[eh->layer_ids[j]].engram_embd;
            if (!t) {
                s = dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: engram table missing");
                goto fail;
            }
            if (t->lazy || !t->data)
                s = dsii_engram_table_file(&st->etab[j], t->type, t->ne[0], (uint64_t)t->ne[1],
                                           dsii_gguf_file(model->gguf), t->file_offset, e);
            else
                s = dsii_engram_table_host(&st->etab[j], t->type, t->ne[0], (uint64_t)t->ne[1],
                                           t->data, e);
            if (s != DSI_OK) goto fail;
        }
        st->erows = (uint32_t *)dsii_calloc(st->ctx, (size_t)nb * C, sizeof(uint32_t));
        st->ehost = (float *)dsii_calloc(st->ctx, (size_t)nb * C * K, sizeof(float));
        if (!st->erows || !st->ehost) {
            s = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: engram staging");
            goto fail;
        }
    }

    /* Persistent state layout. */
    uint64_t cur = 0;
    for (uint32_t i = 0; i < L; i++) {
        const dsii_layer_hparams *lh = &hp->layer[i];
        v41_lw *w = &st->lw[i];
        w->off_ring = take(&cur, (uint64_t)st->ring_w * hd * 4);
        if (lh->compress_ratio > 0 && lh->is_kv_source) {
            uint64_t rows = (uint64_t)st->n_comp_rows / lh->compress_ratio + 1;
            w->off_comp = take(&cur, rows * hd * 4);
            w->off_keys = take(&cur, rows * ID * 4);
            if (lh->compress_ratio > 1) {
                w->off_ckv_ring = take(&cur, (uint64_t)st->ring_c * hd * 4);
                w->off_csc_ring = take(&cur, (uint64_t)st->ring_c * hd * 4);
            }
        }
    }
    /* Scratch layout (n_batch rows of every activation). */
    uint64_t sc = 0;
    const uint64_t n = nb;
    const uint32_t H = hp->n_head, Q = hp->q_lora_rank, G = hp->o_groups, R = hp->o_lora_rank;
    const uint32_t E = hp->n_expert, kx = hp->n_expert_used;
    const uint32_t SF = hp->n_expert_shared * hp->expert_ff;
    const uint32_t M = DSIB_HC_COEF(hc);
    st->o_ids = take(&sc, n * 4);
    st->o_e = take(&sc, n * D * 4);
    st->o_X = take(&sc, n * hc * D * 4);
    st->o_ca = take(&sc, n * M * 4);
    st->o_cf = take(&sc, n * M * 4);
    st->o_x = take(&sc, n * D * 4);
    st->o_xn = take(&sc, n * D * 4);
    st->o_qr = take(&sc, n * Q * 4);
    st->o_q = take(&sc, n * H * hd * 4);
    st->o_kv = take(&sc, n * hd * 4);
    st->o_att = take(&sc, n * H * hd * 4);
    st->o_low = take(&sc, n * G * R * 4);
    st->o_aout = take(&sc, n * D * 4);
    st->o_ckv = take(&sc, n * hd * 4);
    st->o_csc = take(&sc, n * hd * 4);
    st->o_pool = take(&sc, n * hd * 4);
    st->o_iq = take(&sc, n * IH * ID * 4);
    st->o_iw = take(&sc, n * IH * 4);
    uint32_t ck = hp->candidate_topk_blocks ? hp->candidate_topk_blocks : 1;
    st->o_cand = take(&sc, n * ck * 4);
    for (uint32_t i = 0; i < L; i++)
        if (hp->layer[i].is_index_source) st->lw[i].off_idx = take(&sc, n * hp->idx_topk * 4);
    st->o_lg = take(&sc, n * E * 4);
    st->o_sel = take(&sc, n * kx * 4);
    st->o_wts = take(&sc, n * kx * 4);
    st->o_mout = take(&sc, n * D * 4);
    st->o_shg = take(&sc, n * SF * 4);
    st->o_shu = take(&sc, n * SF * 4);
    st->o_sh = take(&sc, n * D * 4);
    st->o_logits = take(&sc, (uint64_t)(nb < V41_LOGIT_ROWS ? nb : V41_LOGIT_ROWS) * hp->n_vocab * 4);
    if (hp->has_engram)
        for (uint32_t j = 0; j < eh->n_layer; j++) st->o_eE[j] = take(&sc, n * C * K * 4);
    st->o_ekv = take(&sc, n * (hc + 1) * D * 4);

    dsib_error be = {{0}};
    s = st->be->buffer_alloc(st->inst, cur ? cur : 256, DSIB_BUFFER_STATE, &st->state, &be);
    if (s == DSI_OK)
        s = st->be->buffer_alloc(st->inst, sc, DSIB_BUFFER_SCRATCH, &st->scratch, &be);
    if (s != DSI_OK) {
        s = dsii_fail(e, s, "deepseek41: session buffers (%llu + %llu bytes): %s",
                      (unsigned long long)cur, (unsigned long long)sc, be.msg);
        goto fail;
    }
    st->n_tokens = 0;
    *out = st;
    return DSI_OK;
fail:
    v41_state_free(st);
    return s;
}

/* ---- the forward pass --------------------------------------------------------------------- */

/* Compressor of a KV source (§4.3): pools completed groups, writes compressed rows and the
 * index keys it owns. x = the layer's attention input (normed). */
static dsi_status compressor(dsii_arch_state *st, uint32_t il, int64_t pos0, uint32_t n,
                             dsii_error *e) {
    const dsii_hparams *hp = st->hp;
    const dsii_layer_hparams *lh = &hp->layer[il];
    v41_lw *w = &st->lw[il];
    const dsib_ops *o = st->ops;
    const uint32_t hd = hp->head_dim, ID = hp->idx_head_dim, r = lh->compress_ratio;
    const dsib_rope rope = layer_rope(hp, lh);
    dsib_instance *I = st->inst;
    int il_ = (int)il;

    CK(o->matmul(I, &w->comp_kv, 0, SV(st, st->o_xn), hp->n_embd, SV(st, st->o_ckv), hd, n),
       "matmul comp_kv", il_);
    if (r > 1)
        CK(o->matmul(I, &w->comp_gate, 0, SV(st, st->o_xn), hp->n_embd, SV(st, st->o_csc), hd,
                     n),
           "matmul comp_gate", il_);
    /* groups whose last token (w+1)r-1 falls in [pos0, pos0+n) */
    int64_t w0;
    uint32_t ng;
    dsii_kv_groups_in_step(pos0, n, r, &w0, &ng);
    if (ng > 0) {
        dsib_view pooled;
        if (r > 1) {
            CK(o->compress_pool(I, STV(st, w->off_ckv_ring), STV(st, w->off_csc_ring), hd,
                                st->ring_c, SV(st, st->o_ckv), SV(st, st->o_csc), hd, pos0, n,
                                r, 0, hd, w0, ng, SV(st, st->o_pool), hd),
               "compress_pool", il_);
            pooled = SV(st, st->o_pool);
        } else {
            pooled = SV(st, st->o_ckv); /* ratio 1: one token per group, no gate */
        }
        dsib_view comp = STV(st, w->off_comp + (uint64_t)w0 * hd * 4);
        dsib_view keys = STV(st, w->off_keys + (uint64_t)w0 * ID * 4);
        /* latent = RMSNorm(pooled, compressor.norm), written straight into the cache */
        CK(o->rms_norm(I, pooled, hd, comp, hd, ng, hd, &w->comp_norm, hp->rms_eps),
           "rms_norm comp", il_);
        /* index keys from the pre-RoPE latent: RMSNorm(wk · latent, k_norm), RoPE at the
         * group's first position, FP4 (UE8M0, blocks of 32) */
        CK(o->matmul(I, &w->idx_k, 0, comp, hd, keys, ID, ng), "matmul idx_k", il_);
        CK(o->rms_norm(I, keys, ID, keys, ID, ng, ID, &w->idx_k_norm, hp->rms_eps),
           "rms_norm idx_k", il_);
        CK(o->rope_tail(I, keys, ID, ng, 1, ID, w0 * (int64_t)r, r, &rope, 0), "rope keys", il_);
        CK(o->fake_quant(I, keys, ID, ng, 0, ID, 32, DSIB_FQ_E2M1_UE8M0, st->fq_flags),
           "fake_quant keys", il_);
        /* compressed KV row: RoPE then FP4 with E4M3 scales in blocks of 16 (§10.1) */
        CK(o->rope_tail(I, comp, hd, ng, 1, hd, w0 * (int64_t)r, r, &rope, 0), "rope comp", il_);
        CK(o->fake_quant(I, comp, hd, ng, 0, hd, 16, DSIB_FQ_E2M1_E4M3, st->fq_flags),
           "fake_quant comp", il_);
    }
    if (r > 1) { /* keep the token rows: partial groups continue in the next call */
        CK(o->ring_write(I, SV(st, st->o_ckv), hd, n, pos0, STV(st, w->off_ckv_ring), hd,
                         st->ring_c, hd),
           "ring_write ckv", il_);
        CK(o->ring_write(I, SV(st, st->o_csc), hd, n, pos0, STV(st, w->off_csc_ring), hd,
                         st->ring_c, hd),
           "ring_write csc", il_);
    }
    return DSI_OK;
}

/* Indexer of an index source (§4.3): q from qr, head weights from x, top-k over the key
 * source's keys, candidate blocks (candidate source) or masking (masked sources). */
static dsi_status indexer(dsii_arch_state *st, uint32_t il, int64_t pos0, uint32_t n,
                          dsii_error *e) {
    const dsii_hparams *hp = st->hp;
    const dsii_layer_hparams *lh = &hp->layer[il];
    v41_lw *w = &st->lw[il];
    const dsib_ops *o = st->ops;
    dsib_instance *I = st->inst;
    const uint32_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const dsib_rope rope = layer_rope(hp, lh);
    int il_ = (int)il;
    CK(o->matmul(I, &w->idx_q_b, 0, SV(st, st->o_qr), hp->q_lora_rank, SV(st, st->o_iq),
                 IH * ID, n),
       "matmul idx_q_b", il_);
    CK(o->rope_tail(I, SV(st, st->o_iq), IH * ID, n, IH, ID, pos0, 1, &rope, 0), "rope iq", il_);
    CK(o->fake_quant(I, SV(st, st->o_iq), IH * ID, n, 0, IH * ID, 32, DSIB_FQ_E2M1_UE8M0,
                     st->fq_flags),
       "fake_quant iq", il_);
    CK(o->matmul(I, &w->idx_proj, 0, SV(st, st->o_xn), hp->n_embd, SV(st, st->o_iw), IH, n),
       "matmul idx_proj", il_);
    const float wscale = (float)(1.0 / sqrt((double)ID) / sqrt((double)IH));
    CK(o->scale(I, SV(st, st->o_iw), IH, n, IH, wscale), "scale iw", il_);
    if (lh->key_src < 0 || (uint32_t)lh->key_src >= hp->n_layer ||
        !hp->layer[lh->key_src].is_kv_source)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: layer %u has no index-key owner", il);
    const v41_lw *ks = &st->lw[lh->key_src]; /* §10.3: always the owner's own keys */
    dsib_view cin = NOVIEW, cout = NOVIEW;
    if (lh->is_candidate_source) cout = SV(st, st->o_cand);
    else if (lh->cand_masked) cin = SV(st, st->o_cand);
    CK(o->indexer_topk_v41(I, SV(st, st->o_iq), IH * ID, SV(st, st->o_iw), IH,
                           STV(st, ks->off_keys), IH, ID, pos0, n, lh->compress_ratio,
                           hp->idx_topk, SV(st, w->off_idx), cin, cout,
                           hp->candidate_block_size, hp->candidate_topk_blocks),
       "indexer_topk_v41", il_);
    return DSI_OK;
}

static dsi_status attention(dsii_arch_state *st, uint32_t il, int64_t pos0, uint32_t n,
                            dsii_error *e) {
    const dsii_hparams *hp = st->hp;
    const dsii_layer_hparams *lh = &hp->layer[il];
    v41_lw *w = &st->lw[il];
    const dsib_ops *o = st->ops;
    dsib_instance *I = st->inst;
    const uint32_t D = hp->n_embd, H = hp->n_head, hd = hp->head_dim, Q = hp->q_lora_rank;
    const dsib_rope rope = layer_rope(hp, lh);
    int il_ = (int)il;

    /* Q: RMSNorm(wq_a x, q_norm) → wq_b → RoPE; no per-head q norm in V4.1 */
    CK(o->matmul(I, &w->q_a, 0, SV(st, st->o_xn), D, SV(st, st->o_qr), Q, n), "matmul q_a", il_);
    CK(o->rms_norm(I, SV(st, st->o_qr), Q, SV(st, st->o_qr), Q, n, Q, &w->q_a_norm, hp->rms_eps),
       "rms_norm q", il_);
    CK(o->matmul(I, &w->q_b, 0, SV(st, st->o_qr), Q, SV(st, st->o_q), H * hd, n), "matmul q_b",
       il_);
    CK(o->rope_tail(I, SV(st, st->o_q), H * hd, n, H, hd, pos0, 1, &rope, 0), "rope q", il_);
    /* window KV: RMSNorm(wkv x), RoPE, FP8 over the whole head in blocks of 32 */
    CK(o->matmul(I, &w->kv, 0, SV(st, st->o_xn), D, SV(st, st->o_kv), hd, n), "matmul kv", il_);
    CK(o->rms_norm(I, SV(st, st->o_kv), hd, SV(st, st->o_kv), hd, n, hd, &w->kv_norm,
                   hp->rms_eps),
       "rms_norm kv", il_);
    CK(o->rope_tail(I, SV(st, st->o_kv), hd, n, 1, hd, pos0, 1, &rope, 0), "rope kv", il_);
    CK(o->fake_quant(I, SV(st, st->o_kv), hd, n, 0, hd, 32, DSIB_FQ_E4M3_UE8M0, st->fq_flags),
       "fake_quant kv", il_);

    uint32_t ratio = lh->compress_ratio;
    if (ratio > 0 && lh->is_kv_source) {
        dsi_status s = compressor(st, il, pos0, n, e);
        if (s != DSI_OK) return s;
    }
    if (ratio > 0 && lh->is_index_source) {
        dsi_status s = indexer(st, il, pos0, n, e);
        if (s != DSI_OK) return s;
    }
    dsib_view comp = NOVIEW, idx = NOVIEW;
    if (ratio > 0) {
        if (lh->kv_src < 0 || (uint32_t)lh->kv_src >= hp->n_layer)
            return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: layer %u has no KV source", il);
        comp = STV(st, st->lw[lh->kv_src].off_comp);
        /* no index source at or before the layer (no shipped config): every visible row */
        if (lh->topk_src >= 0 && (uint32_t)lh->topk_src < hp->n_layer)
            idx = SV(st, st->lw[lh->topk_src].off_idx);
    }
    CK(o->attn_sink(I, SV(st, st->o_q), H * hd, H, hd, pos0, n, hp->window,
                    STV(st, w->off_ring), st->ring_w, SV(st, st->o_kv), hd, ratio, comp, idx,
                    hp->idx_topk, &w->sinks, 1.0f / sqrtf((float)hd), SV(st, st->o_att),
                    H * hd),
       "attn_sink", il_);
    CK(o->ring_write(I, SV(st, st->o_kv), hd, n, pos0, STV(st, w->off_ring), hd, st->ring_w, hd),
       "ring_write kv", il_);
    /* V carried the key's rotation: un-rotate the output, then the grouped projection */
    CK(o->rope_tail(I, SV(st, st->o_att), H * hd, n, H, hd, pos0, 1, &rope, 1), "rope out", il_);
    CK(o->matmul_grouped(I, &w->out_a, hp->o_groups, SV(st, st->o_att), H * hd,
                         SV(st, st->o_low), hp->o_groups * hp->o_lora_rank, n),
       "matmul out_a", il_);
    CK(o->matmul(I, &w->out_b, 0, SV(st, st->o_low), hp->o_groups * hp->o_lora_rank,
                 SV(st, st->o_aout), D, n),
       "matmul out_b", il_);
    return DSI_OK;
}

static dsi_status moe(dsii_arch_state *st, uint32_t il, uint32_t n, dsii_error *e) {
    dsii_moe_scratch sc = {SV(st, st->o_lg), SV(st, st->o_sel), SV(st, st->o_wts),
                           SV(st, st->o_mout), SV(st, st->o_shg), SV(st, st->o_shu),
                           SV(st, st->o_sh)};
    return dsii_moe_forward(st->ops, st->inst, &st->lw[il].moe, &sc, SV(st, st->o_xn),
                            st->hp->n_embd, SV(st, st->o_ids), n, st->hp->n_embd,
                            SV(st, st->o_aout), st->hp->n_embd, e);
}

static dsi_status run_step(dsii_arch_state *st, const dsi_token *tokens, uint32_t pos,
                           uint32_t n, int32_t which, float *logits, dsii_error *e) {
    const dsii_hparams *hp = st->hp;
    const dsib_ops *o = st->ops;
    dsib_instance *I = st->inst;
    const uint32_t D = hp->n_embd, hc = hp->hc_mult, M = DSIB_HC_COEF(hc);
    const int64_t pos0 = pos;
    dsib_error be = {{0}};
    dsi_status s;

    /* Host side first (uploads precede recording): token ids, Engram rows (§4.6: hashes
     * from the timeline itself, so the n-gram history is exact across chunks, decode and
     * rebuilds). */
    s = st->be->upload(I, st->scratch, st->o_ids, tokens + pos, (uint64_t)n * 4, &be);
    if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: upload ids: %s", be.msg);
    const dsii_engram_hparams *eh = &hp->engram;
    if (hp->has_engram) {
        const uint32_t C = eh->n_cols, K = eh->key_length;
        const uint32_t nh = eh->max_ngram - 1;
        const uint32_t h0 = pos > nh ? pos - nh : 0;
        for (uint32_t j = 0; j < eh->n_layer; j++) {
            dsii_engram_hash(&st->elay[j], tokens + h0, (int32_t)(pos - h0), tokens + pos, n,
                             st->erows);
            s = dsii_engram_gather(st->ctx, &st->etab[j], st->erows, (size_t)n * C, st->ehost, e);
            if (s != DSI_OK) return s;
            s = st->be->upload(I, st->scratch, st->o_eE[j], st->ehost, (uint64_t)n * C * K * 4,
                               &be);
            if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: upload engram: %s", be.msg);
        }
    }

    s = st->be->begin(I, &be);
    if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: begin: %s", be.msg);

    CK(o->get_rows(I, &st->tok_embd, SV(st, st->o_ids), SV(st, st->o_e), D, n), "get_rows", -1);
    CK(o->hc_expand(I, SV(st, st->o_e), D, SV(st, st->o_X), n, hc, D), "hc_expand", -1);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const dsii_layer_hparams *lh = &hp->layer[il];
        v41_lw *w = &st->lw[il];
        int il_ = (int)il;
        if (lh->engram_index >= 0) { /* §4.6: before the block */
            const uint32_t j = (uint32_t)lh->engram_index, CK_ = eh->n_cols * eh->key_length;
            CK(o->matmul(I, &w->eng_wkv, 0, SV(st, st->o_eE[j]), CK_, SV(st, st->o_ekv),
                         (hc + 1) * D, n),
               "matmul engram wkv", il_);
            CK(o->engram_gate(I, SV(st, st->o_X), n, hc, D, SV(st, st->o_ekv), (hc + 1) * D,
                              &w->eng_q, &w->eng_k, hp->rms_eps),
               "engram_gate", il_);
        }
        /* attention sublayer: mixes from X, input from the previous sublayer's pre (§4.2) */
        CK(o->hc_mix(I, SV(st, st->o_X), n, hc, D, &w->hc_attn_fn, &w->hc_attn_scale,
                     &w->hc_attn_base, hp->rms_eps, hp->hc_eps, hp->hc_sinkhorn_iters,
                     DSIB_HC_BLOCK, SV(st, st->o_ca), M),
           "hc_mix attn", il_);
        if (il == 0) /* make_identity_pre_mix: one-hot stream 0 */
            CK(o->copy_rows(I, SV(st, st->o_X), hc * D, SV(st, st->o_x), D, n, D), "copy_rows",
               il_);
        else
            CK(o->hc_collapse(I, SV(st, st->o_X), SV(st, st->o_cf), M, SV(st, st->o_x), D, n,
                              hc, D),
               "hc_collapse attn", il_);
        CK(o->rms_norm(I, SV(st, st->o_x), D, SV(st, st->o_xn), D, n, D, &w->attn_norm,
                       hp->rms_eps),
           "attn_norm", il_);
        s = attention(st, il, pos0, n, e);
        if (s != DSI_OK) return s;
        CK(o->hc_post(I, SV(st, st->o_aout), D, SV(st, st->o_X), SV(st, st->o_ca), M,
                      SV(st, st->o_X), n, hc, D),
           "hc_post attn", il_);
        /* FFN sublayer: mixes from X, input from this block's attention pre */
        CK(o->hc_mix(I, SV(st, st->o_X), n, hc, D, &w->hc_ffn_fn, &w->hc_ffn_scale,
                     &w->hc_ffn_base, hp->rms_eps, hp->hc_eps, hp->hc_sinkhorn_iters,
                     DSIB_HC_BLOCK, SV(st, st->o_cf), M),
           "hc_mix ffn", il_);
        CK(o->hc_collapse(I, SV(st, st->o_X), SV(st, st->o_ca), M, SV(st, st->o_x), D, n, hc, D),
           "hc_collapse ffn", il_);
        CK(o->rms_norm(I, SV(st, st->o_x), D, SV(st, st->o_xn), D, n, D, &w->ffn_norm,
                       hp->rms_eps),
           "ffn_norm", il_);
        s = moe(st, il, n, e);
        if (s != DSI_OK) return s;
        CK(o->hc_post(I, SV(st, st->o_aout), D, SV(st, st->o_X), SV(st, st->o_cf), M,
                      SV(st, st->o_X), n, hc, D),
           "hc_post ffn", il_);
    }

    s = st->be->submit(I, &be);
    if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: submit: %s", be.msg);

    uint32_t n_out = 0, first = 0;
    if (which == DSII_LOGITS_LAST) {
        n_out = 1;
        first = n - 1;
    } else if (which == DSII_LOGITS_ALL) {
        n_out = n;
    }
    /* §4.1: collapse with the last layer's FFN pre mix (no HC head), norm, head (f32). In
     * slices of V41_LOGIT_ROWS rows so the logits scratch stays small at real vocab sizes;
     * the final logits are the step's only readback. */
    for (uint32_t r0 = 0; r0 < n_out; r0 += V41_LOGIT_ROWS) {
        const uint32_t nr = n_out - r0 < V41_LOGIT_ROWS ? n_out - r0 : V41_LOGIT_ROWS;
        const uint64_t xo = st->o_X + (uint64_t)(first + r0) * hc * D * 4;
        const uint64_t co = st->o_cf + (uint64_t)(first + r0) * M * 4;
        s = st->be->begin(I, &be);
        if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: begin: %s", be.msg);
        CK(o->hc_collapse(I, SV(st, xo), SV(st, co), M, SV(st, st->o_x), D, nr, hc, D),
           "hc_collapse out", -1);
        CK(o->rms_norm(I, SV(st, st->o_x), D, SV(st, st->o_xn), D, nr, D, &st->out_norm,
                       hp->rms_eps),
           "output_norm", -1);
        CK(o->matmul(I, &st->output, 0, SV(st, st->o_xn), D, SV(st, st->o_logits), hp->n_vocab,
                     nr),
           "matmul output", -1);
        s = st->be->submit(I, &be);
        if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: submit: %s", be.msg);
        s = st->be->download(I, st->scratch, st->o_logits, logits + (size_t)r0 * hp->n_vocab,
                             (uint64_t)nr * hp->n_vocab * 4, &be);
        if (s != DSI_OK) return dsii_fail(e, s, "deepseek41: download logits: %s", be.msg);
    }
    return DSI_OK;
}

static dsi_status v41_eval(dsii_arch_state *st, const dsi_token *tokens, uint32_t pos,
                           uint32_t n, int32_t which, float *logits, dsii_error *e) {
    if (n == 0 || n > st->p.n_batch || pos + n > st->p.n_ctx || pos != st->n_tokens)
        return dsii_fail(e, DSI_ERR_INTERNAL,
                         "deepseek41: eval of %u tokens at %u (state holds %u, batch %u, ctx %u)",
                         n, pos, st->n_tokens, st->p.n_batch, st->p.n_ctx);
    dsi_status s = run_step(st, tokens, pos, n, which, logits, e);
    if (s != DSI_OK) return s;
    st->n_tokens = pos + n;
    return DSI_OK;
}

static void v41_reset(dsii_arch_state *st) { st->n_tokens = 0; }

static uint32_t v41_rewind_limit(const dsii_arch_state *st) { return st->margin; }

/* All state is either append-only by position (compressed rows, index keys: rows past
 * len/ratio are rewritten when regenerated) or rings holding (span + margin) positions, so
 * truncation within the margin only moves the frontier. */
static dsi_status v41_truncate(dsii_arch_state *st, uint32_t cur, uint32_t len, dsii_error *e) {
    if (cur != st->n_tokens || len > cur || cur - len > st->margin)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: truncate %u -> %u (state %u, margin %u)",
                         cur, len, st->n_tokens, st->margin);
    st->n_tokens = len;
    return DSI_OK;
}

const dsii_arch dsii_arch_dsv41 = {
    .name = "deepseek41",
    .state_create = v41_state_create,
    .state_free = v41_state_free,
    .eval = v41_eval,
    .reset = v41_reset,
    .rewind_limit = v41_rewind_limit,
    .truncate = v41_truncate,
};
