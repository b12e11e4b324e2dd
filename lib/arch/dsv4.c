/*
 * lib/arch/dsv4.c — the DeepSeek V4 Flash forward pass (GGUF arch `deepseek4`,
 * model-spec §3), issued as backend ops only (backends/backend.h).
 *
 * One eval call runs a step of n tokens at positions pos0 .. pos0+n-1 through every layer:
 *   mHC pre (§3.3) → attention (§3.4: q low-rank + per-head RMSNorm, single K=V head, tail
 *   RoPE/YaRN, FP8 KV simulation, compressors, indexer, sink attention, inverse RoPE,
 *   grouped output projection) → mHC post → mHC pre → MoE (§3.5) → mHC post,
 * then the HC head and the f32 logits (§3.6).
 *
 * Streaming form (§3.10): every step reads the state of earlier positions from rings and
 * append-only row arrays (lib/kv) and its own rows from step scratch, so a whole prompt, any
 * chunking of it and token-by-token decode run the same per-row operations in the same
 * order (§10.4) — the logits agree bit for bit. Which compressor groups a step completes is
 * decided here from positions alone; top-k rows and experts stay in device index buffers.
 */
#include "arch/arch.h"
#include "backends/backend.h"
#include "base/context_impl.h"
#include "kv/kv.h"
#include "model/model.h"
#include "moe/moe.h"

#include <math.h>
#include <string.h>

#define V4_DEFAULT_MARGIN 256u   /* exact-rewind margin (tokens), docs/internals.md */
#define V4_HEAD_ROWS 16u         /* rows per head pass when all logits are wanted */
#define V4_KV_FQ_BLOCK 64u       /* §3.4: FP8 simulation of the nope dims, blocks of 64 */
#define V4_IDX_FQ_BLOCK 32u      /* §3.4 / §10.1: FP4 simulation, blocks of 32 */

typedef struct v4_layer {
    dsib_weight attn_norm, q_a, q_a_norm, q_b, kv, kv_norm, sinks, out_a, out_b;
    dsib_weight hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    dsib_weight comp_ape, comp_kv, comp_gate, comp_norm;
    dsib_weight idx_q_b, idx_proj, idx_ape, idx_kv, idx_gate, idx_norm;
    dsib_weight ffn_norm;
    dsii_moe_weights moe;
    dsib_rope rope;
    uint32_t ratio;
    int32_t has_idx;
    dsii_kv_ring win;            /* window KV ring */
    dsii_kv_compressor comp;     /* main KV compressor (ratio > 0) */
    dsii_kv_compressor icomp;    /* indexer key compressor (ratio 4) */
} v4_layer;

typedef struct v4_scratch {
    uint64_t ids, X, coef, xin, xn, qa, q, kv, o, low, a, ckv, csc, ikv, isc, iq, iw, idx;
    uint64_t mlog, msel, mwts, mrout, msg, msu, msout, logits;
    uint64_t size;
} v4_scratch;

struct dsii_arch_state {
    dsi_model *m;
    const dsii_hparams *hp;
    const dsi_context *ctx;
    const dsib_backend *be;
    dsib_instance *inst;
    const dsib_ops *ops;
    dsii_arch_params p;
    uint32_t margin;
    uint32_t fq;                 /* DSIB_FQ_NO_ROUND or 0 */
    dsii_wset ws;
    dsib_weight tok_embd, out_norm, output, out_hc_fn, out_hc_base, out_hc_scale;
    v4_layer *L;
    dsib_buffer *state, *scratch;
    v4_scratch so;
    uint32_t head_rows;          /* rows of the logits scratch */
    uint32_t max_F_shared, max_E, max_k;
};

/* ---- setup ---------------------------------------------------------------------------- */

static uint64_t sc_take(v4_scratch *s, uint64_t bytes) {
    s->size = (s->size + 63) & ~(uint64_t)63;
    uint64_t off = s->size;
    s->size += bytes;
    return off;
}

static void v4_free(dsii_arch_state *st) {
    if (!st) return;
    const dsi_context *ctx = st->ctx;
    if (st->be) {
        if (st->state) st->be->buffer_free(st->inst, st->state);
        if (st->scratch) st->be->buffer_free(st->inst, st->scratch);
        dsii_wset_free(&st->ws);
    }
    dsii_free(ctx, st->L);
    dsii_free(ctx, st);
}

#define BIND(dst, t)                                                                        \
    do {                                                                                    \
        dsi_status s_ = dsii_wset_bind(&st->ws, (t), &(dst), e);                            \
        if (s_ != DSI_OK) goto fail;                                                        \
    } while (0)

static dsi_status v4_create(dsi_model *m, const dsii_arch_params *p, dsii_arch_state **out,
                            dsii_error *e) {
    *out = NULL;
    const dsii_hparams *hp = &m->hp;
    if (hp->arch != DSI_ARCH_DEEPSEEK4)
        return dsii_fail(e, DSI_ERR_INTERNAL, "dsv4: not a deepseek4 model");
    if (hp->hc_mult == 0 || hp->hc_mult > 16 || hp->rope_dim > hp->head_dim ||
        (hp->rope_dim & 1) || hp->nope_dim % V4_KV_FQ_BLOCK ||
        hp->o_groups == 0 || (hp->n_head * hp->head_dim) % hp->o_groups)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED,
                         "dsv4: unsupported shape (hc %u, head_dim %u, rope %u, groups %u)",
                         hp->hc_mult, hp->head_dim, hp->rope_dim, hp->o_groups);
    dsii_arch_state *st = dsii_calloc(m->ctx, 1, sizeof *st);
    if (!st) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    st->m = m;
    st->hp = hp;
    st->ctx = m->ctx;
    st->p = *p;
    st->margin = p->rewind_margin ? p->rewind_margin : V4_DEFAULT_MARGIN;
    st->fq = (p->flags & DSI_SESSION_FLAG_NO_FAKE_QUANT) ? DSIB_FQ_NO_ROUND : 0;
    dsi_status rc = dsii_arch_backend(m, &st->be, &st->inst, e);
    if (rc != DSI_OK) {
        dsii_free(m->ctx, st);
        return rc;
    }
    st->ops = st->be->ops;
    st->ws.be = st->be;
    st->ws.inst = st->inst;
    st->ws.ctx = m->ctx;
    st->ws.model = m;
    st->L = dsii_calloc(m->ctx, hp->n_layer, sizeof *st->L);
    if (!st->L) {
        dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        goto fail;
    }
    const dsii_model_tensors *w = &m->w;
    BIND(st->tok_embd, w->token_embd);
    BIND(st->out_norm, w->output_norm);
    BIND(st->output, w->output);
    BIND(st->out_hc_fn, w->output_hc_fn);
    BIND(st->out_hc_base, w->output_hc_base);
    BIND(st->out_hc_scale, w->output_hc_scale);
    if (!st->out_hc_fn.buf) {
        dsii_fail(e, DSI_ERR_BAD_FORMAT, "dsv4: output_hc_fn is missing");
        goto fail;
    }

    dsii_kv_plan plan = {0};
    uint32_t n_ctx = p->n_ctx, B = p->n_batch;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        v4_layer *L = &st->L[il];
        const dsii_layer_tensors *t = &w->layer[il];
        const dsii_layer_hparams *lh = &hp->layer[il];
        BIND(L->attn_norm, t->attn_norm);
        BIND(L->q_a, t->attn_q_a);
        BIND(L->q_a_norm, t->attn_q_a_norm);
        BIND(L->q_b, t->attn_q_b);
        BIND(L->kv, t->attn_kv);
        BIND(L->kv_norm, t->attn_kv_norm);
        BIND(L->sinks, t->attn_sinks);
        BIND(L->out_a, t->attn_out_a);
        BIND(L->out_b, t->attn_out_b);
        BIND(L->hc_attn_fn, t->hc_attn_fn);
        BIND(L->hc_attn_base, t->hc_attn_base);
        BIND(L->hc_attn_scale, t->hc_attn_scale);
        BIND(L->hc_ffn_fn, t->hc_ffn_fn);
        BIND(L->hc_ffn_base, t->hc_ffn_base);
        BIND(L->hc_ffn_scale, t->hc_ffn_scale);
        BIND(L->comp_ape, t->comp_ape);
        BIND(L->comp_kv, t->comp_kv);
        BIND(L->comp_gate, t->comp_gate);
        BIND(L->comp_norm, t->comp_norm);
        BIND(L->idx_q_b, t->idx_q_b);
        BIND(L->idx_proj, t->idx_proj);
        BIND(L->idx_ape, t->idx_comp_ape);
        BIND(L->idx_kv, t->idx_comp_kv);
        BIND(L->idx_gate, t->idx_comp_gate);
        BIND(L->idx_norm, t->idx_comp_norm);
        BIND(L->ffn_norm, t->ffn_norm);
        dsii_moe_weights *mw = &L->moe;
        BIND(mw->gate_inp, t->ffn_gate_inp);
        BIND(mw->bias, t->exp_probs_b);
        BIND(mw->tid2eid, lh->is_hash ? t->tid2eid : NULL);
        BIND(mw->w1, t->ffn_gate_exps);
        BIND(mw->w3, t->ffn_up_exps);
        BIND(mw->w2, t->ffn_down_exps);
        BIND(mw->sh_gate, t->ffn_gate_shexp);
        BIND(mw->sh_up, t->ffn_up_shexp);
        BIND(mw->sh_down, t->ffn_down_shexp);
        mw->n_expert = lh->n_expert;
        mw->k = lh->n_expert_used;
        mw->limit = lh->swiglu_limit;
        mw->limit_shared = lh->swiglu_limit_shexp;
        mw->route_scale = hp->route_scale;
        mw->norm_add = 0.0f; /* §3.5: plain normalisation (sqrt-softplus scores are > 0) */
        if (mw->n_expert > st->max_E) st->max_E = mw->n_expert;
        if (mw->k > st->max_k) st->max_k = mw->k;
        if (mw->sh_gate.buf && (uint32_t)mw->sh_gate.ne[1] > st->max_F_shared)
            st->max_F_shared = (uint32_t)mw->sh_gate.ne[1];

        L->rope.freq_base = lh->rope_base;
        L->rope.yarn_factor = lh->yarn ? hp->yarn_factor : 1.0f;
        L->rope.yarn_orig_ctx = (float)hp->yarn_orig_ctx;
        L->rope.yarn_beta_fast = hp->yarn_beta_fast;
        L->rope.yarn_beta_slow = hp->yarn_beta_slow;
        L->rope.n_rot = (int32_t)hp->rope_dim;
        L->ratio = lh->compress_ratio;
        L->has_idx = L->ratio == 4 && L->idx_q_b.buf != NULL;
        if (L->ratio == 4 && !L->has_idx) {
            dsii_fail(e, DSI_ERR_BAD_FORMAT, "dsv4: layer %u has ratio 4 but no indexer", il);
            goto fail;
        }
        if (L->ratio > 0 && (!L->comp_kv.buf || !L->comp_gate.buf || !L->comp_norm.buf ||
                             !L->comp_ape.buf)) {
            dsii_fail(e, DSI_ERR_BAD_FORMAT, "dsv4: layer %u compressor tensors missing", il);
            goto fail;
        }
        if (L->has_idx && (hp->idx_head_dim & (hp->idx_head_dim - 1) ||
                           hp->idx_head_dim % V4_IDX_FQ_BLOCK || hp->idx_head_dim < hp->rope_dim)) {
            dsii_fail(e, DSI_ERR_UNSUPPORTED, "dsv4: indexer head dim %u unsupported",
                      hp->idx_head_dim);
            goto fail;
        }
        dsii_kv_plan_ring(&plan, hp->window + st->margin, hp->head_dim, &L->win);
        if (L->ratio > 0)
            dsii_kv_plan_compressor(&plan, L->ratio, L->ratio == 4, hp->head_dim, n_ctx,
                                    st->margin, &L->comp);
        if (L->has_idx)
            dsii_kv_plan_compressor(&plan, 4, 1, hp->idx_head_dim, n_ctx, st->margin,
                                    &L->icomp);
    }

    /* step scratch, sized for n_batch tokens */
    v4_scratch *s = &st->so;
    uint32_t D = hp->n_embd, hc = hp->hc_mult, H = hp->n_head, hd = hp->head_dim;
    uint32_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const size_t f = sizeof(float);
    st->head_rows = B < V4_HEAD_ROWS ? B : V4_HEAD_ROWS;
    s->ids = sc_take(s, (uint64_t)B * 4);
    s->X = sc_take(s, (uint64_t)B * hc * D * f);
    s->coef = sc_take(s, (uint64_t)B * DSIB_HC_COEF(hc) * f);
    s->xin = sc_take(s, (uint64_t)B * D * f);
    s->xn = sc_take(s, (uint64_t)B * D * f);
    s->qa = sc_take(s, (uint64_t)B * hp->q_lora_rank * f);
    s->q = sc_take(s, (uint64_t)B * H * hd * f);
    s->kv = sc_take(s, (uint64_t)B * hd * f);
    s->o = sc_take(s, (uint64_t)B * H * hd * f);
    s->low = sc_take(s, (uint64_t)B * hp->o_groups * hp->o_lora_rank * f);
    s->a = sc_take(s, (uint64_t)B * D * f);
    s->ckv = sc_take(s, (uint64_t)B * 2 * hd * f);
    s->csc = sc_take(s, (uint64_t)B * 2 * hd * f);
    s->ikv = sc_take(s, (uint64_t)B * 2 * ID * f);
    s->isc = sc_take(s, (uint64_t)B * 2 * ID * f);
    s->iq = sc_take(s, (uint64_t)B * IH * ID * f);
    s->iw = sc_take(s, (uint64_t)B * IH * f);
    s->idx = sc_take(s, (uint64_t)B * (hp->idx_topk ? hp->idx_topk : 1) * 4);
    s->mlog = sc_take(s, (uint64_t)B * st->max_E * f);
    s->msel = sc_take(s, (uint64_t)B * st->max_k * 4);
    s->mwts = sc_take(s, (uint64_t)B * st->max_k * f);
    s->mrout = sc_take(s, (uint64_t)B * D * f);
    s->msg = sc_take(s, (uint64_t)B * (st->max_F_shared ? st->max_F_shared : 1) * f);
    s->msu = sc_take(s, (uint64_t)B * (st->max_F_shared ? st->max_F_shared : 1) * f);
    s->msout = sc_take(s, (uint64_t)B * D * f);
    s->logits = sc_take(s, (uint64_t)st->head_rows * hp->n_vocab * f);

    dsib_error be = {{0}};
    rc = st->be->buffer_alloc(st->inst, plan.size ? plan.size : 64, DSIB_BUFFER_STATE,
                              &st->state, &be);
    if (rc == DSI_OK)
        rc = st->be->buffer_alloc(st->inst, s->size, DSIB_BUFFER_SCRATCH, &st->scratch, &be);
    if (rc != DSI_OK) {
        dsii_fail(e, rc, "dsv4: allocating session buffers (%llu + %llu bytes): %s",
                  (unsigned long long)plan.size, (unsigned long long)s->size, be.msg);
        goto fail;
    }
    *out = st;
    return DSI_OK;
fail:
    v4_free(st);
    return e && e->status != DSI_OK ? e->status : DSI_ERR_INTERNAL;
}

/* ---- eval ----------------------------------------------------------------------------- */

#define CK(call, what)                                                                      \
    do {                                                                                    \
        dsi_status s_ = (call);                                                             \
        if (s_ != DSI_OK) return dsii_fail(e, s_, "dsv4: layer %u: %s failed", il, what);   \
    } while (0)

static inline dsib_view SV(const dsii_arch_state *st, uint64_t off) {
    dsib_view v = {st->scratch, off};
    return v;
}
static inline dsib_view SVf(const dsii_arch_state *st, uint64_t off, uint64_t floats) {
    dsib_view v = {st->scratch, off + floats * sizeof(float)};
    return v;
}
static inline dsib_view KV(const dsii_arch_state *st, uint64_t off) {
    dsib_view v = {st->state, off};
    return v;
}

/* Compressor step (§3.4): token rows → pooled groups completed in this step → RMSNorm →
 * RoPE at the group's first position → simulation; then the step's token rows go into the
 * compressor rings. `kvw`/`gw`/`ape`/`norm`: the compressor's weights; rows written to
 * c->out. `index_keys` selects the indexer-key post-processing (Hadamard + FP4) instead of
 * the main KV one (FP8 of the nope dims). */
static dsi_status v4_compress(dsii_arch_state *st, uint32_t il, const v4_layer *L,
                              const dsii_kv_compressor *c, const dsib_weight *kvw,
                              const dsib_weight *gw, const dsib_weight *ape,
                              const dsib_weight *norm, uint64_t kv_off, uint64_t sc_off,
                              int64_t pos0, uint32_t n, int index_keys, dsii_error *e) {
    const dsib_ops *o = st->ops;
    dsib_instance *I = st->inst;
    uint32_t cw = (1 + c->overlap) * c->hd, r = c->ratio;
    dsib_view xn = SV(st, st->so.xn), tk = SV(st, kv_off), ts = SV(st, sc_off);
    CK(o->matmul(I, kvw, 0, xn, st->hp->n_embd, tk, cw, n), "compressor kv");
    CK(o->matmul(I, gw, 0, xn, st->hp->n_embd, ts, cw, n), "compressor gate");
    CK(o->add_rows_periodic(I, ts, cw, n, cw, ape, pos0, r), "compressor ape");
    int64_t w0;
    uint32_t ng;
    dsii_kv_groups_in_step(pos0, n, r, &w0, &ng);
    if (ng) {
        dsib_view rows = KV(st, c->out.off + (uint64_t)w0 * c->hd * sizeof(float));
        CK(o->compress_pool(I, KV(st, c->kv.off), KV(st, c->sc.off), c->kv.width, c->kv.len,
                            tk, ts, cw, pos0, n, r, (int32_t)c->overlap, c->hd, w0, ng, rows,
                            c->hd),
           "compressor pool");
        CK(o->rms_norm(I, rows, c->hd, rows, c->hd, ng, c->hd, norm, st->hp->rms_eps),
           "compressor norm");
        CK(o->rope_tail(I, rows, c->hd, ng, 1, c->hd, w0 * (int64_t)r, r, &L->rope, 0),
           "compressor rope");
        if (index_keys) {
            CK(o->hadamard(I, rows, c->hd, ng, 1, c->hd), "index key hadamard");
            CK(o->fake_quant(I, rows, c->hd, ng, 0, c->hd, V4_IDX_FQ_BLOCK, DSIB_FQ_E2M1_UE8M0,
                             st->fq),
               "index key fp4");
        } else {
            CK(o->fake_quant(I, rows, c->hd, ng, 0, st->hp->nope_dim, V4_KV_FQ_BLOCK,
                             DSIB_FQ_E4M3_UE8M0, st->fq),
               "compressed kv fp8");
        }
    }
    CK(o->ring_write(I, tk, cw, n, pos0, KV(st, c->kv.off), c->kv.width, c->kv.len, cw),
       "compressor ring kv");
    CK(o->ring_write(I, ts, cw, n, pos0, KV(st, c->sc.off), c->sc.width, c->sc.len, cw),
       "compressor ring score");
    return DSI_OK;
}

static dsi_status v4_layer_step(dsii_arch_state *st, uint32_t il, int64_t pos0, uint32_t n,
                                dsii_error *e) {
    const dsii_hparams *hp = st->hp;
    const v4_layer *L = &st->L[il];
    const dsib_ops *o = st->ops;
    dsib_instance *I = st->inst;
    const v4_scratch *s = &st->so;
    uint32_t D = hp->n_embd, hc = hp->hc_mult, H = hp->n_head, hd = hp->head_dim;
    uint32_t Q = hp->q_lora_rank, nc = DSIB_HC_COEF(hc);
    float eps = hp->rms_eps;
    dsib_view X = SV(st, s->X), coef = SV(st, s->coef), xin = SV(st, s->xin),
              xn = SV(st, s->xn), qa = SV(st, s->qa), q = SV(st, s->q), kv = SV(st, s->kv),
              ob = SV(st, s->o), low = SV(st, s->low), a = SV(st, s->a);

    /* ---- attention sublayer: mHC pre (§3.3) ---- */
    CK(o->hc_mix(I, X, n, hc, D, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base, eps,
                 hp->hc_eps, hp->hc_sinkhorn_iters, DSIB_HC_BLOCK, coef, nc),
       "hc_mix attn");
    CK(o->hc_collapse(I, X, coef, nc, xin, D, n, hc, D), "hc_collapse attn");
    CK(o->rms_norm(I, xin, D, xn, D, n, D, &L->attn_norm, eps), "attn_norm");

    /* Q path: low rank, q_norm (qr is reused by the indexer), per-head RMSNorm, RoPE */
    CK(o->matmul(I, &L->q_a, 0, xn, D, qa, Q, n), "q_a");
    CK(o->rms_norm(I, qa, Q, qa, Q, n, Q, &L->q_a_norm, eps), "q_norm");
    CK(o->matmul(I, &L->q_b, 0, qa, Q, q, H * hd, n), "q_b");
    CK(o->rms_norm(I, q, hd, q, hd, n * H, hd, NULL, eps), "q head norm");
    CK(o->rope_tail(I, q, H * hd, n, H, hd, pos0, 1, &L->rope, 0), "q rope");

    /* window KV: kv_norm, RoPE, FP8 simulation of the nope dims (§3.4, §10.1) */
    CK(o->matmul(I, &L->kv, 0, xn, D, kv, hd, n), "kv");
    CK(o->rms_norm(I, kv, hd, kv, hd, n, hd, &L->kv_norm, eps), "kv_norm");
    CK(o->rope_tail(I, kv, hd, n, 1, hd, pos0, 1, &L->rope, 0), "kv rope");
    CK(o->fake_quant(I, kv, hd, n, 0, hp->nope_dim, V4_KV_FQ_BLOCK, DSIB_FQ_E4M3_UE8M0, st->fq),
       "kv fp8");

    dsib_view comp = {NULL, 0}, idx = {NULL, 0};
    uint32_t topk = 0;
    if (L->ratio > 0) {
        dsi_status rc = v4_compress(st, il, L, &L->comp, &L->comp_kv, &L->comp_gate,
                                    &L->comp_ape, &L->comp_norm, s->ckv, s->csc, pos0, n, 0, e);
        if (rc != DSI_OK) return rc;
        comp = KV(st, L->comp.out.off);
    }
    if (L->has_idx) {
        uint32_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
        dsi_status rc = v4_compress(st, il, L, &L->icomp, &L->idx_kv, &L->idx_gate,
                                    &L->idx_ape, &L->idx_norm, s->ikv, s->isc, pos0, n, 1, e);
        if (rc != DSI_OK) return rc;
        dsib_view iq = SV(st, s->iq), iw = SV(st, s->iw);
        CK(o->matmul(I, &L->idx_q_b, 0, qa, Q, iq, IH * ID, n), "indexer q");
        CK(o->rope_tail(I, iq, IH * ID, n, IH, ID, pos0, 1, &L->rope, 0), "indexer q rope");
        CK(o->hadamard(I, iq, IH * ID, n, IH, ID), "indexer q hadamard");
        CK(o->fake_quant(I, iq, IH * ID, n, 0, IH * ID, V4_IDX_FQ_BLOCK, DSIB_FQ_E2M1_UE8M0,
                         st->fq),
           "indexer q fp4");
        CK(o->matmul(I, &L->idx_proj, 0, xn, D, iw, IH, n), "indexer weights");
        CK(o->scale(I, iw, IH, n, IH, (1.0f / sqrtf((float)ID)) * (1.0f / sqrtf((float)IH))),
           "indexer weight scale");
        topk = hp->idx_topk;
        idx = SV(st, s->idx);
        CK(o->indexer_topk(I, iq, IH * ID, iw, IH, KV(st, L->icomp.out.off), IH, ID, pos0, n,
                           4, topk, idx),
           "indexer top-k");
    }

    /* sink attention over (selected) compressed rows ∪ window, then un-rotate (§3.4) */
    CK(o->attn_sink(I, q, H * hd, H, hd, pos0, n, hp->window, KV(st, L->win.off), L->win.len,
                    kv, hd, L->ratio, comp, idx, topk, &L->sinks, 1.0f / sqrtf((float)hd), ob,
                    H * hd),
       "attention");
    CK(o->ring_write(I, kv, hd, n, pos0, KV(st, L->win.off), hd, L->win.len, hd), "window ring");
    CK(o->rope_tail(I, ob, H * hd, n, H, hd, pos0, 1, &L->rope, 1), "output inverse rope");
    CK(o->matmul_grouped(I, &L->out_a, hp->o_groups, ob, H * hd, low,
                         hp->o_groups * hp->o_lora_rank, n),
       "wo_a");
    CK(o->matmul(I, &L->out_b, 0, low, hp->o_groups * hp->o_lora_rank, a, D, n), "wo_b");
    CK(o->hc_post(I, a, D, X, coef, nc, X, n, hc, D), "hc_post attn");

    /* ---- FFN sublayer ---- */
    CK(o->hc_mix(I, X, n, hc, D, &L->hc_ffn_fn, &L->hc_ffn_scale, &L->hc_ffn_base, eps,
                 hp->hc_eps, hp->hc_sinkhorn_iters, DSIB_HC_BLOCK, coef, nc),
       "hc_mix ffn");
    CK(o->hc_collapse(I, X, coef, nc, xin, D, n, hc, D), "hc_collapse ffn");
    CK(o->rms_norm(I, xin, D, xn, D, n, D, &L->ffn_norm, eps), "ffn_norm");
    dsii_moe_scratch ms = {SV(st, s->mlog), SV(st, s->msel), SV(st, s->mwts), SV(st, s->mrout),
                           SV(st, s->msg),  SV(st, s->msu),  SV(st, s->msout)};
    dsi_status rc = dsii_moe_forward(o, I, &L->moe, &ms, xn, D, SV(st, s->ids), n, D, a, D, e);
    if (rc != DSI_OK) return rc;
    CK(o->hc_post(I, a, D, X, coef, nc, X, n, hc, D), "hc_post ffn");
    return DSI_OK;
}

static dsi_status v4_eval(dsii_arch_state *st, const dsi_token *tokens, uint32_t pos, uint32_t n,
                          int32_t which, float *logits, dsii_error *e) {
    const dsii_hparams *hp = st->hp;
    const dsib_ops *o = st->ops;
    dsib_instance *I = st->inst;
    const v4_scratch *s = &st->so;
    uint32_t D = hp->n_embd, hc = hp->hc_mult, V = hp->n_vocab, nc = DSIB_HC_COEF(hc);
    uint32_t il = 0;
    if (n == 0 || n > st->p.n_batch || (uint64_t)pos + n > st->p.n_ctx)
        return dsii_fail(e, DSI_ERR_INTERNAL, "dsv4: bad step (pos %u, n %u)", pos, n);
    dsib_error be = {{0}};
    /* token ids go to the device (embedding rows, hash routing) before recording starts */
    dsi_status rc = st->be->upload(I, st->scratch, s->ids, tokens + pos,
                                   (uint64_t)n * sizeof(int32_t), &be);
    if (rc != DSI_OK) return dsii_fail(e, rc, "dsv4: upload ids: %s", be.msg);
    rc = st->be->begin(I, &be);
    if (rc != DSI_OK) return dsii_fail(e, rc, "dsv4: begin: %s", be.msg);

    dsib_view X = SV(st, s->X), xin = SV(st, s->xin), xn = SV(st, s->xn),
              coef = SV(st, s->coef), lg = SV(st, s->logits);
    CK(o->get_rows(I, &st->tok_embd, SV(st, s->ids), xin, D, n), "embedding");
    CK(o->hc_expand(I, xin, D, X, n, hc, D), "hc expand");
    for (il = 0; il < hp->n_layer; il++) {
        rc = v4_layer_step(st, il, pos, n, e);
        if (rc != DSI_OK) return rc;
    }

    /* HC head (§3.6) on the rows whose logits are wanted, V4_HEAD_ROWS at a time */
    uint32_t first = which == DSII_LOGITS_ALL ? 0 : n - 1;
    if (which == DSII_LOGITS_NONE) first = n;
    for (uint32_t r0 = first; r0 < n; r0 += st->head_rows) {
        uint32_t nr = n - r0 < st->head_rows ? n - r0 : st->head_rows;
        dsib_view Xr = SVf(st, s->X, (uint64_t)r0 * hc * D);
        CK(o->hc_mix(I, Xr, nr, hc, D, &st->out_hc_fn, &st->out_hc_scale, &st->out_hc_base,
                     hp->rms_eps, hp->hc_eps, 0, DSIB_HC_HEAD, coef, nc),
           "hc head");
        CK(o->hc_collapse(I, Xr, coef, nc, xin, D, nr, hc, D), "hc head collapse");
        CK(o->rms_norm(I, xin, D, xn, D, nr, D, &st->out_norm, hp->rms_eps), "output norm");
        CK(o->matmul(I, &st->output, 0, xn, D, lg, V, nr), "output head");
        rc = st->be->submit(I, &be);
        if (rc != DSI_OK) return dsii_fail(e, rc, "dsv4: submit: %s", be.msg);
        float *dst = logits + (which == DSII_LOGITS_ALL ? (size_t)r0 * V : 0);
        rc = st->be->download(I, st->scratch, s->logits, dst, (uint64_t)nr * V * sizeof(float),
                              &be);
        if (rc != DSI_OK) return dsii_fail(e, rc, "dsv4: download logits: %s", be.msg);
        if (r0 + nr < n) {
            rc = st->be->begin(I, &be);
            if (rc != DSI_OK) return dsii_fail(e, rc, "dsv4: begin: %s", be.msg);
        }
    }
    if (which == DSII_LOGITS_NONE) {
        rc = st->be->submit(I, &be);
        if (rc != DSI_OK) return dsii_fail(e, rc, "dsv4: submit: %s", be.msg);
    }
    return DSI_OK;
}

/* State is position-addressed (rings + append-only rows), so forgetting or truncating the
 * timeline needs no device work: a later step at position p reads only rows of positions
 * < p that the truncated timeline still owns (see lib/kv/kv.h for why the margin makes
 * that true). */
static void v4_reset(dsii_arch_state *st) { (void)st; }

static uint32_t v4_rewind_limit(const dsii_arch_state *st) { return st->margin; }

static dsi_status v4_truncate(dsii_arch_state *st, uint32_t cur, uint32_t len, dsii_error *e) {
    if (len > cur || cur - len > st->margin)
        return dsii_fail(e, DSI_ERR_INTERNAL, "dsv4: truncate %u -> %u beyond the margin %u",
                         cur, len, st->margin);
    return DSI_OK;
}

const dsii_arch dsii_arch_dsv4 = {
    .name = "deepseek4",
    .state_create = v4_create,
    .state_free = v4_free,
    .eval = v4_eval,
    .reset = v4_reset,
    .rewind_limit = v4_rewind_limit,
    .truncate = v4_truncate,
};
