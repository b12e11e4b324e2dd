/*
 * lib/arch/dsv4.c — the DeepSeek V4 Flash forward pass (GGUF arch `deepseek4`,
 * model-spec §3), issued as backend ops only (backends/backend.h).
 *
 * One step runs n rows — of one or several sequences, each at its own positions — through
 * every layer:
 *   mHC pre (§3.3) → attention (§3.4: q low-rank + per-head RMSNorm, single K=V head, tail
 *   RoPE/YaRN, FP8 KV simulation, compressors, indexer, sink attention, inverse RoPE,
 *   grouped output projection) → mHC post → mHC pre → MoE (§3.5) → mHC post,
 * then the HC head on the output rows and the f32 logits (§3.6), written straight into the
 * lane's host-visible io block.
 *
 * Streaming form (§3.10): every step reads the state of earlier positions from rings and
 * append-only row arrays (lib/kv, one slot per sequence) and its own rows from step
 * scratch, so a whole prompt, any chunking of it, token-by-token decode and any batch of
 * sequences run the same per-row operations in the same order (§10.4) — the logits agree
 * bit for bit. Nothing here depends on positions: the step rows (positions, slots) live in
 * the io block, and the compressors process every row (a row that completes a group
 * produces the group's row, stored by store_rows), so one recorded step replays at every
 * position.
 */
#include "arch/arch.h"
#include "backend/device.h"
#include "backends/backend.h"
#include "base/context_impl.h"
#include "kv/kv.h"
#include "model/model.h"
#include "moe/moe.h"
#include "place/place.h"

#include <math.h>
#include <string.h>

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
    /* state components (lib/kv; the same ids for every n_ctx) */
    uint32_t c_win;              /* window KV ring */
    dsii_kv_compressor comp;     /* main KV compressor (ratio > 0) */
    dsii_kv_compressor icomp;    /* indexer key compressor (ratio 4) */
} v4_layer;

struct dsii_arch_model {
    dsi_model *m;
    const dsii_hparams *hp;
    dsii_device *dev;
    dsib_weight tok_embd, out_norm, output, out_hc_fn, out_hc_base, out_hc_scale;
    v4_layer *L;                 /* [n_layer + 1]: the MTP block at n_layer (§3.7) */
    uint32_t max_F_shared, max_E, max_k, max_F;
    /* V4 MTP (§3.7) */
    int32_t has_mtp;
    dsib_weight e_proj, h_proj, enorm, hnorm, mtp_norm, mtp_hc_fn, mtp_hc_base, mtp_hc_scale;
    uint32_t c_xring;            /* the target's final HC state per position (for the MTP) */
};

/* Step scratch offsets (bytes) of a lane, sized for its max_rows rows. */
typedef struct v4_scratch {
    uint64_t X, coef, xin, xn, qa, q, kv, o, low, a, ckv, csc, ikv, isc, pool, iq, iw, idx;
    uint64_t mlog, msel, mwts, mrout, msg, msu, msout, Xo;
    uint64_t hp;                 /* DSII_LANE_TAPS with MTP: h_proj rows [rows][hc·D] */
} v4_scratch;

/* ---- per model ------------------------------------------------------------------------ */

static void v4_model_free(dsi_model *m, dsii_arch_model *am) {
    if (!am) return;
    dsii_free(m->ctx, am->L);
    dsii_free(m->ctx, am);
}

/* The ops the V4 step records. */
static const uint32_t k_v4_ops[] = {
    DSIB_OP_MATMUL, DSIB_OP_MATMUL_GROUPED, DSIB_OP_GET_ROWS, DSIB_OP_RMS_NORM, DSIB_OP_ADD,
    DSIB_OP_SCALE, DSIB_OP_COPY, DSIB_OP_COPY_ROWS, DSIB_OP_GATHER_ROWS, DSIB_OP_ROPE_TAIL,
    DSIB_OP_STORE_ROWS, DSIB_OP_FAKE_QUANT, DSIB_OP_HADAMARD, DSIB_OP_HC_EXPAND, DSIB_OP_HC_MIX,
    DSIB_OP_HC_COLLAPSE, DSIB_OP_HC_POST, DSIB_OP_COMPRESS_POOL, DSIB_OP_INDEXER_TOPK,
    DSIB_OP_ATTN_SINK, DSIB_OP_ADD_ROWS_PERIODIC, DSIB_OP_MOE_ROUTE, DSIB_OP_MOE_EXPERTS,
    DSIB_OP_SWIGLU};

#define BIND(dst, t)                                                                        \
    do {                                                                                    \
        dsi_status s_ = dsii_wtable_bind(wt, (t), &(dst), e);                               \
        if (s_ != DSI_OK) goto fail;                                                        \
    } while (0)

/* Binds one block's weights (backbone layer or the MTP block) and sets its MoE / RoPE
 * settings. */
static dsi_status bind_v4_layer(dsii_arch_model *am, dsii_wtable *wt, const dsii_hparams *hp,
                                const dsii_layer_tensors *t, const dsii_layer_hparams *lh,
                                v4_layer *L, dsii_error *e) {
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
    {
        /* resident, or served by the expert tier (lib/place) */
        int32_t li = t >= wt->model->w.layer && t < wt->model->w.layer + hp->n_layer
                         ? (int32_t)(t - wt->model->w.layer) : -1;
        dsi_status s_ = dsii_place_bind_experts(wt, li, t->ffn_gate_exps, t->ffn_up_exps,
                                                t->ffn_down_exps, mw, e);
        if (s_ != DSI_OK) goto fail;
    }
    BIND(mw->sh_gate, t->ffn_gate_shexp);
    BIND(mw->sh_up, t->ffn_up_shexp);
    BIND(mw->sh_down, t->ffn_down_shexp);
    mw->n_expert = lh->n_expert;
    mw->k = lh->n_expert_used;
    mw->limit = lh->swiglu_limit;
    mw->limit_shared = lh->swiglu_limit_shexp;
    mw->route_scale = hp->route_scale;
    mw->norm_add = 0.0f; /* §3.5: plain normalisation (sqrt-softplus scores are > 0) */
    if (mw->n_expert > am->max_E) am->max_E = mw->n_expert;
    if (mw->k > am->max_k) am->max_k = mw->k;
    if (mw->w1.buf && (uint32_t)mw->w1.ne[1] > am->max_F) am->max_F = (uint32_t)mw->w1.ne[1];
    if (mw->sh_gate.buf && (uint32_t)mw->sh_gate.ne[1] > am->max_F_shared)
        am->max_F_shared = (uint32_t)mw->sh_gate.ne[1];
    dsi_status rc = dsii_device_check_type(wt->dev, DSIB_OP_MOE_EXPERTS, mw->w1.type, "routed experts", e);
    if (rc != DSI_OK) goto fail;

    L->rope.freq_base = lh->rope_base;
    L->rope.yarn_factor = lh->yarn ? hp->yarn_factor : 1.0f;
    L->rope.yarn_orig_ctx = (float)hp->yarn_orig_ctx;
    L->rope.yarn_beta_fast = hp->yarn_beta_fast;
    L->rope.yarn_beta_slow = hp->yarn_beta_slow;
    L->rope.n_rot = (int32_t)hp->rope_dim;
    L->ratio = lh->compress_ratio;
    L->has_idx = L->ratio == 4 && L->idx_q_b.buf != NULL;
    return DSI_OK;
fail:
    return e && e->status != DSI_OK ? e->status : DSI_ERR_INTERNAL;
}

static dsi_status v4_model_create(dsi_model *m, dsii_wtable *wt, dsii_arch_model **out,
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
    dsi_status rc = dsii_device_check_ops(wt->dev, k_v4_ops, sizeof k_v4_ops / sizeof k_v4_ops[0], e);
    if (rc != DSI_OK) return rc;
    dsii_arch_model *am = dsii_calloc(m->ctx, 1, sizeof *am);
    if (!am) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    am->m = m;
    am->hp = hp;
    am->dev = wt->dev;
    am->L = dsii_calloc(m->ctx, hp->n_layer + 1, sizeof *am->L);
    if (!am->L) {
        dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        goto fail;
    }
    const dsii_model_tensors *w = &m->w;
    BIND(am->tok_embd, w->token_embd);
    BIND(am->out_norm, w->output_norm);
    BIND(am->output, w->output);
    BIND(am->out_hc_fn, w->output_hc_fn);
    BIND(am->out_hc_base, w->output_hc_base);
    BIND(am->out_hc_scale, w->output_hc_scale);
    if (!am->out_hc_fn.buf) {
        dsii_fail(e, DSI_ERR_BAD_FORMAT, "dsv4: output_hc_fn is missing");
        goto fail;
    }
    /* component ids: the same walk as v4_state_layout */
    dsii_kv_layout ids;
    dsii_kv_layout_init(&ids, m->ctx, DSII_DEFAULT_MARGIN);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        v4_layer *L = &am->L[il];
        const dsii_layer_tensors *t = &w->layer[il];
        const dsii_layer_hparams *lh = &hp->layer[il];
        if (bind_v4_layer(am, wt, hp, t, lh, L, e) != DSI_OK) goto fail;
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
        L->c_win = dsii_kv_add(&ids, DSII_KV_RING, 1, 1);
        if (L->ratio > 0)
            dsii_kv_add_compressor(&ids, L->ratio, L->ratio == 4, hp->head_dim, 1, &L->comp);
        if (L->has_idx) dsii_kv_add_compressor(&ids, 4, 1, hp->idx_head_dim, 1, &L->icomp);
    }
    if (hp->has_mtp && hp->n_draft == 1) { /* §3.7: a window-only block, its own ring */
        const dsii_draft_tensors *d = &w->draft[0];
        v4_layer *L = &am->L[hp->n_layer];
        if (bind_v4_layer(am, wt, hp, &d->blk, &hp->draft_layer[0], L, e) != DSI_OK) goto fail;
        BIND(am->e_proj, d->e_proj);
        BIND(am->h_proj, d->h_proj);
        BIND(am->enorm, d->enorm);
        BIND(am->hnorm, d->hnorm);
        BIND(am->mtp_norm, d->norm);
        BIND(am->mtp_hc_fn, d->hc_head_fn);
        BIND(am->mtp_hc_base, d->hc_head_base);
        BIND(am->mtp_hc_scale, d->hc_head_scale);
        am->has_mtp = L->ratio == 0 && am->e_proj.buf && am->h_proj.buf && am->enorm.buf &&
                      am->hnorm.buf && am->mtp_norm.buf && am->mtp_hc_fn.buf &&
                      am->mtp_hc_base.buf && am->mtp_hc_scale.buf && L->attn_norm.buf;
        if (am->has_mtp) {
            L->c_win = dsii_kv_add(&ids, DSII_KV_RING, 1, 1);
            am->c_xring = dsii_kv_add(&ids, DSII_KV_RING, 1, 1);
        }
    }
    rc = ids.status;
    dsii_kv_layout_free(&ids);
    if (rc != DSI_OK) {
        dsii_fail(e, rc, "out of host memory");
        goto fail;
    }
    *out = am;
    return DSI_OK;
fail:
    v4_model_free(m, am);
    return e && e->status != DSI_OK ? e->status : DSI_ERR_INTERNAL;
}

static dsi_status v4_state_layout(const dsii_arch_model *am, uint32_t n_ctx, dsii_kv_layout *l,
                                  dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const v4_layer *L = &am->L[il];
        dsii_kv_compressor c;
        if (dsii_kv_add(l, DSII_KV_RING, hp->window + l->margin, hp->head_dim) != L->c_win)
            goto bad;
        /* the rows' quantised forms (§3.4, §3.8, §10.1): window KV and compressed KV rows
         * FP8 on the nope dims (blocks of 64, UE8M0; the RoPE dims stay f32), index keys
         * FP4 (blocks of 32, UE8M0) */
        dsii_kv_set_format(l, L->c_win, DSIB_STATE_E4M3_UE8M0, hp->nope_dim, V4_KV_FQ_BLOCK);
        if (L->ratio > 0) {
            dsii_kv_add_compressor(l, L->ratio, L->ratio == 4, hp->head_dim, n_ctx, &c);
            if (c.kv != L->comp.kv || c.out != L->comp.out) goto bad;
            dsii_kv_set_format(l, c.out, DSIB_STATE_E4M3_UE8M0, hp->nope_dim, V4_KV_FQ_BLOCK);
        }
        if (L->has_idx) {
            dsii_kv_add_compressor(l, 4, 1, hp->idx_head_dim, n_ctx, &c);
            if (c.kv != L->icomp.kv || c.out != L->icomp.out) goto bad;
            dsii_kv_set_format(l, c.out, DSIB_STATE_E2M1_UE8M0, hp->idx_head_dim, V4_IDX_FQ_BLOCK);
        }
    }
    if (am->has_mtp) {
        /* MTP window ring and the target's final HC state per position (lib/spec) */
        uint32_t rows = hp->window + DSII_DRAFT_RING_EXTRA + l->margin;
        if (dsii_kv_add(l, DSII_KV_RING, rows, hp->head_dim) != am->L[hp->n_layer].c_win ||
            dsii_kv_add(l, DSII_KV_RING, rows, hp->hc_mult * hp->n_embd) != am->c_xring)
            goto bad;
    }
    if (l->status != DSI_OK) return dsii_fail(e, l->status, "dsv4: state layout: out of host memory");
    return DSI_OK;
bad:
    return dsii_fail(e, l->status != DSI_OK ? l->status : DSI_ERR_INTERNAL, "dsv4: state layout mismatch");
}

/* ---- lanes ------------------------------------------------------------------------------ */

static uint64_t sc_take(uint64_t *size, uint64_t bytes) {
    *size = (*size + 63) & ~(uint64_t)63;
    uint64_t off = *size;
    *size += bytes;
    return off;
}

static dsi_status v4_lane_init(const dsii_arch_model *am, dsii_lane *lane, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    v4_scratch *s = dsii_calloc(am->m->ctx, 1, sizeof *s);
    if (!s) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    uint32_t D = hp->n_embd, hc = hp->hc_mult, H = hp->n_head, hd = hp->head_dim;
    uint32_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
    uint64_t B = lane->max_rows, f = sizeof(float), z = 0;
    uint32_t Fs = am->max_F_shared ? am->max_F_shared : 1;
    s->X = sc_take(&z, B * hc * D * f);
    s->coef = sc_take(&z, B * DSIB_HC_COEF(hc) * f);
    s->xin = sc_take(&z, B * D * f);
    s->xn = sc_take(&z, B * D * f);
    s->qa = sc_take(&z, B * hp->q_lora_rank * f);
    s->q = sc_take(&z, B * H * hd * f);
    s->kv = sc_take(&z, B * hd * f);
    s->o = sc_take(&z, B * H * hd * f);
    s->low = sc_take(&z, B * hp->o_groups * hp->o_lora_rank * f);
    s->a = sc_take(&z, B * D * f);
    s->ckv = sc_take(&z, B * 2 * hd * f);
    s->csc = sc_take(&z, B * 2 * hd * f);
    s->ikv = sc_take(&z, B * 2 * ID * f);
    s->isc = sc_take(&z, B * 2 * ID * f);
    s->pool = sc_take(&z, B * (hd > ID ? hd : ID) * f);
    s->iq = sc_take(&z, B * IH * ID * f);
    s->iw = sc_take(&z, B * IH * f);
    s->idx = sc_take(&z, B * (hp->idx_topk ? hp->idx_topk : 1) * 4);
    s->mlog = sc_take(&z, B * am->max_E * f);
    s->msel = sc_take(&z, B * am->max_k * 4);
    s->mwts = sc_take(&z, B * am->max_k * f);
    s->mrout = sc_take(&z, B * D * f);
    s->msg = sc_take(&z, B * Fs * f);
    s->msu = sc_take(&z, B * Fs * f);
    s->msout = sc_take(&z, B * D * f);
    s->Xo = sc_take(&z, (uint64_t)lane->max_out * hc * D * f);
    if ((lane->flags & DSII_LANE_TAPS) && am->has_mtp) s->hp = sc_take(&z, B * hc * D * f);
    lane->scratch_bytes = z;
    lane->io_extra_bytes = 0;
    lane->priv = s;
    dsib_stream_desc *d = &lane->desc;
    d->max_heads = H > IH ? H : IH;
    d->max_head_dim = hd > ID ? hd : ID;
    d->max_topk = hp->idx_topk;
    d->max_experts = am->max_E;
    d->max_experts_used = am->max_k;
    uint32_t W = D;
    if (am->max_F > W) W = am->max_F;
    if (hc * D > W) W = hc * D;
    if (2 * hd > W) W = 2 * hd;
    d->max_width = W;
    return DSI_OK;
}

static void v4_lane_fini(dsii_lane *lane) {
    if (lane->priv) dsii_free(lane->ex->ctx, lane->priv);
    lane->priv = NULL;
}

/* ---- the step --------------------------------------------------------------------------- */

typedef struct v4_step {
    const dsii_arch_model *am;
    const dsii_hparams *hp;
    const dsii_device *dev;
    const dsib_ops *o;
    dsib_stream *S;
    const dsii_lane *lane;
    const v4_scratch *sc;
    dsii_kv_pool *pool;
    dsib_view rows;
    uint32_t n, fq;
} v4_step;

#define CK(call, what)                                                                      \
    do {                                                                                    \
        DSII_PROF_BEGIN();                                                                  \
        dsi_status s_ = (call);                                                             \
        DSII_PROF_END(what);                                                                \
        if (s_ != DSI_OK) return dsii_fail(e, s_, "dsv4: layer %u: %s failed", il, what);   \
    } while (0)

static inline dsib_view SV(const v4_step *P, uint64_t off) { return dsii_lane_sv(P->lane, off); }

static dsib_state ST(const v4_step *P, uint32_t comp) {
    dsib_state s;
    dsii_kv_pool_state(P->pool, comp, &s);
    return s;
}

/* Compressor (§3.4) for every row of the step: token rows (its kv and gate projections of
 * xn, already in kv_off / sc_off) → (rows completing a group) the
 * pooled group → RMSNorm → RoPE at the group's first position → simulation → stored as the
 * group's compressed row; then the step's token rows go into the compressor rings.
 * `index_keys` selects the indexer-key post-processing (Hadamard + FP4) instead of the main
 * KV one (FP8 of the nope dims). */
static dsi_status v4_compress(const v4_step *P, uint32_t il, const v4_layer *L,
                              const dsii_kv_compressor *c, const dsib_weight *ape,
                              const dsib_weight *norm, uint64_t kv_off, uint64_t sc_off,
                              int index_keys, dsii_error *e) {
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    uint32_t n = P->n, cw = (1 + c->overlap) * c->hd, r = c->ratio;
    dsib_view tk = SV(P, kv_off), ts = SV(P, sc_off), pl = SV(P, P->sc->pool);
    dsib_state rk = ST(P, c->kv), rs = ST(P, c->sc), out = ST(P, c->out);
    /* tk / ts (the kv and gate projections of xn) come from v4_layer_step's one job */
    CK(o->add_rows_periodic(S, ts, cw, n, cw, ape, P->rows, r), "compressor ape");
    CK(o->compress_pool(S, &rk, &rs, tk, ts, cw, P->rows, n, r, (int32_t)c->overlap, c->hd, pl,
                        c->hd),
       "compressor pool");
    CK(o->rms_norm(S, pl, c->hd, pl, c->hd, n, c->hd, norm, P->hp->rms_eps), "compressor norm");
    CK(o->rope_tail(S, pl, c->hd, n, 1, c->hd, P->rows, 1 - (int32_t)r, &L->rope, 0),
       "compressor rope");
    if (index_keys) {
        CK(o->hadamard(S, pl, c->hd, n, 1, c->hd), "index key hadamard");
        CK(o->fake_quant(S, pl, c->hd, n, 0, c->hd, V4_IDX_FQ_BLOCK, DSIB_FQ_E2M1_UE8M0, P->fq),
           "index key fp4");
    } else {
        CK(o->fake_quant(S, pl, c->hd, n, 0, P->hp->nope_dim, V4_KV_FQ_BLOCK, DSIB_FQ_E4M3_UE8M0,
                         P->fq),
           "compressed kv fp8");
    }
    CK(o->store_rows(S, pl, c->hd, n, P->rows, &out, c->hd, r, 0), "compressed rows");
    CK(o->store_rows(S, tk, cw, n, P->rows, &rk, cw, 1, DSIB_STORE_RING), "compressor ring kv");
    CK(o->store_rows(S, ts, cw, n, P->rows, &rs, cw, 1, DSIB_STORE_RING), "compressor ring score");
    return DSI_OK;
}

static dsi_status v4_layer_step(const v4_step *P, uint32_t il, dsii_error *e) {
    const dsii_hparams *hp = P->hp;
    const v4_layer *L = &P->am->L[il];
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const v4_scratch *s = P->sc;
    uint32_t n = P->n;
    uint32_t D = hp->n_embd, hc = hp->hc_mult, H = hp->n_head, hd = hp->head_dim;
    uint32_t Q = hp->q_lora_rank, nc = DSIB_HC_COEF(hc);
    float eps = hp->rms_eps;
    dsib_view X = SV(P, s->X), coef = SV(P, s->coef), xin = SV(P, s->xin), xn = SV(P, s->xn),
              qa = SV(P, s->qa), q = SV(P, s->q), kv = SV(P, s->kv), ob = SV(P, s->o),
              low = SV(P, s->low), a = SV(P, s->a);

    /* ---- attention sublayer: mHC pre (§3.3) ---- */
    CK(o->hc_mix(S, X, n, hc, D, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base, eps,
                 hp->hc_eps, hp->hc_sinkhorn_iters, DSIB_HC_BLOCK, coef, nc),
       "hc_mix attn");
    CK(o->hc_collapse(S, X, coef, nc, xin, D, n, hc, D), "hc_collapse attn");
    CK(o->rms_norm(S, xin, D, xn, D, n, D, &L->attn_norm, eps), "attn_norm");

    /* Every projection of xn at once (one parallel job on the CPU, the same results as one
     * matmul each; other backends run them one by one): wq_a, wkv, the compressor's kv and
     * gate, the indexer compressor's kv and gate, and the indexer's head weights. */
    dsib_mm mx[7];
    uint32_t nmx = 0;
    mx[nmx++] = (dsib_mm){&L->q_a, 0, xn, D, qa, Q, n};
    mx[nmx++] = (dsib_mm){&L->kv, 0, xn, D, kv, hd, n};
    if (L->ratio > 0) {
        const uint32_t cw = (1 + L->comp.overlap) * L->comp.hd;
        mx[nmx++] = (dsib_mm){&L->comp_kv, 0, xn, D, SV(P, s->ckv), cw, n};
        mx[nmx++] = (dsib_mm){&L->comp_gate, 0, xn, D, SV(P, s->csc), cw, n};
    }
    if (L->has_idx) {
        const uint32_t cw = (1 + L->icomp.overlap) * L->icomp.hd;
        mx[nmx++] = (dsib_mm){&L->idx_kv, 0, xn, D, SV(P, s->ikv), cw, n};
        mx[nmx++] = (dsib_mm){&L->idx_gate, 0, xn, D, SV(P, s->isc), cw, n};
        mx[nmx++] = (dsib_mm){&L->idx_proj, 0, xn, D, SV(P, s->iw), hp->idx_n_head, n};
    }
    CK(dsii_op_matmul_multi(P->dev, S, mx, nmx), "matmuls of xn (q_a, kv, compressors, idx_proj)");

    /* Q path: low rank, q_norm (qr is reused by the indexer), then wq_b and the indexer's
     * wq_b in one job; per-head RMSNorm, RoPE */
    CK(o->rms_norm(S, qa, Q, qa, Q, n, Q, &L->q_a_norm, eps), "q_norm");
    dsib_mm mq[2];
    uint32_t nmq = 0;
    mq[nmq++] = (dsib_mm){&L->q_b, 0, qa, Q, q, H * hd, n};
    if (L->has_idx)
        mq[nmq++] = (dsib_mm){&L->idx_q_b, 0, qa, Q, SV(P, s->iq), hp->idx_n_head * hp->idx_head_dim, n};
    CK(dsii_op_matmul_multi(P->dev, S, mq, nmq), "matmuls of qa (q_b, idx_q_b)");
    CK(o->rms_norm(S, q, hd, q, hd, n * H, hd, NULL, eps), "q head norm");
    CK(o->rope_tail(S, q, H * hd, n, H, hd, P->rows, 0, &L->rope, 0), "q rope");

    /* window KV: kv_norm, RoPE, FP8 simulation of the nope dims (§3.4, §10.1) */
    CK(o->rms_norm(S, kv, hd, kv, hd, n, hd, &L->kv_norm, eps), "kv_norm");
    CK(o->rope_tail(S, kv, hd, n, 1, hd, P->rows, 0, &L->rope, 0), "kv rope");
    CK(o->fake_quant(S, kv, hd, n, 0, hp->nope_dim, V4_KV_FQ_BLOCK, DSIB_FQ_E4M3_UE8M0, P->fq),
       "kv fp8");

    dsib_state comp, win = ST(P, L->c_win);
    memset(&comp, 0, sizeof comp);
    dsib_view idx = {NULL, 0};
    uint32_t topk = 0;
    if (L->ratio > 0) {
        dsi_status rc = v4_compress(P, il, L, &L->comp, &L->comp_ape,
                                    &L->comp_norm, s->ckv, s->csc, 0, e);
        if (rc != DSI_OK) return rc;
        comp = ST(P, L->comp.out);
    }
    if (L->has_idx) {
        uint32_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
        dsi_status rc = v4_compress(P, il, L, &L->icomp, &L->idx_ape,
                                    &L->idx_norm, s->ikv, s->isc, 1, e);
        if (rc != DSI_OK) return rc;
        dsib_view iq = SV(P, s->iq), iw = SV(P, s->iw);
        dsib_state keys = ST(P, L->icomp.out);
        CK(o->rope_tail(S, iq, IH * ID, n, IH, ID, P->rows, 0, &L->rope, 0), "indexer q rope");
        CK(o->hadamard(S, iq, IH * ID, n, IH, ID), "indexer q hadamard");
        CK(o->fake_quant(S, iq, IH * ID, n, 0, IH * ID, V4_IDX_FQ_BLOCK, DSIB_FQ_E2M1_UE8M0, P->fq),
           "indexer q fp4");
        CK(o->scale(S, iw, IH, n, IH, (1.0f / sqrtf((float)ID)) * (1.0f / sqrtf((float)IH))),
           "indexer weight scale");
        topk = hp->idx_topk;
        idx = SV(P, s->idx);
        CK(o->indexer_topk(S, iq, IH * ID, iw, IH, &keys, IH, ID, P->rows, n, 4, topk, idx),
           "indexer top-k");
    }

    /* sink attention over (selected) compressed rows ∪ window, then un-rotate (§3.4) */
    CK(o->attn_sink(S, q, H * hd, H, hd, P->rows, n, hp->window, &win, kv, hd, L->ratio,
                    L->ratio > 0 ? &comp : NULL, idx, topk, &L->sinks, 1.0f / sqrtf((float)hd), ob,
                    H * hd),
       "attention");
    CK(o->store_rows(S, kv, hd, n, P->rows, &win, hd, 1, DSIB_STORE_RING), "window ring");
    CK(o->rope_tail(S, ob, H * hd, n, H, hd, P->rows, 0, &L->rope, 1), "output inverse rope");
    CK(dsii_op_matmul_grouped(P->dev, S, &L->out_a, hp->o_groups, ob, H * hd, low,
                              hp->o_groups * hp->o_lora_rank, n),
       "wo_a");
    CK(o->matmul(S, &L->out_b, 0, low, hp->o_groups * hp->o_lora_rank, a, D, n), "wo_b");
    CK(o->hc_post(S, a, D, X, coef, nc, X, n, hc, D), "hc_post attn");

    /* ---- FFN sublayer ---- */
    CK(o->hc_mix(S, X, n, hc, D, &L->hc_ffn_fn, &L->hc_ffn_scale, &L->hc_ffn_base, eps,
                 hp->hc_eps, hp->hc_sinkhorn_iters, DSIB_HC_BLOCK, coef, nc),
       "hc_mix ffn");
    CK(o->hc_collapse(S, X, coef, nc, xin, D, n, hc, D), "hc_collapse ffn");
    CK(o->rms_norm(S, xin, D, xn, D, n, D, &L->ffn_norm, eps), "ffn_norm");
    dsii_moe_scratch ms = {SV(P, s->mlog), SV(P, s->msel), SV(P, s->mwts), SV(P, s->mrout),
                           SV(P, s->msg),  SV(P, s->msu),  SV(P, s->msout), P->lane->cancel};
    dsi_status rc = dsii_moe_forward(P->dev, S, &L->moe, &ms, xn, D,
                                     dsii_lane_io(P->lane, P->lane->io_ids), n, D, a, D, e);
    if (rc != DSI_OK) return rc;
    CK(o->hc_post(S, a, D, X, coef, nc, X, n, hc, D), "hc_post ffn");
    return DSI_OK;
}

static dsi_status v4_record(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                            const dsii_step_shape *sh, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    v4_step P = {am, hp, am->dev, am->dev->be->ops, lane->stream, lane,
                 (const v4_scratch *)lane->priv, pool, dsii_lane_io(lane, lane->io_rows), sh->n,
                 sh->fq_flags};
    const dsib_ops *o = P.o;
    dsib_stream *S = P.S;
    const v4_scratch *s = P.sc;
    uint32_t D = hp->n_embd, hc = hp->hc_mult, V = hp->n_vocab, nc = DSIB_HC_COEF(hc);
    uint32_t il = 0, n = sh->n;
    dsib_view X = SV(&P, s->X), xin = SV(&P, s->xin), xn = SV(&P, s->xn), coef = SV(&P, s->coef);
    CK(o->get_rows(S, &am->tok_embd, dsii_lane_io(lane, lane->io_ids), xin, D, n), "embedding");
    CK(o->hc_expand(S, xin, D, X, n, hc, D), "hc expand");
    for (il = 0; il < hp->n_layer; il++) {
        dsi_status rc = v4_layer_step(&P, il, e);
        if (rc != DSI_OK) return rc;
    }
    if ((lane->flags & DSII_LANE_TAPS) && am->has_mtp) { /* §3.7: the MTP's X_main */
        dsib_state xr = ST(&P, am->c_xring);
        CK(o->store_rows(S, X, hc * D, n, P.rows, &xr, hc * D, 1, DSIB_STORE_RING), "X ring");
    }
    if (sh->n_out == 0) return DSI_OK;
    /* HC head (§3.6) on the output rows, in one pass, logits into the io block */
    uint32_t no = sh->n_out;
    dsib_view Xo = SV(&P, s->Xo);
    CK(o->gather_rows(S, X, hc * D, dsii_lane_io(lane, lane->io_out), Xo, hc * D, no, hc * D),
       "head rows");
    CK(o->hc_mix(S, Xo, no, hc, D, &am->out_hc_fn, &am->out_hc_scale, &am->out_hc_base,
                 hp->rms_eps, hp->hc_eps, 0, DSIB_HC_HEAD, coef, nc),
       "hc head");
    CK(o->hc_collapse(S, Xo, coef, nc, xin, D, no, hc, D), "hc head collapse");
    CK(o->rms_norm(S, xin, D, xn, D, no, D, &am->out_norm, hp->rms_eps), "output norm");
    CK(o->matmul(S, &am->output, 0, xn, D, dsii_lane_io(lane, lane->io_logits), V, no),
       "output head");
    return DSI_OK;
}

/* §3.7 MTP drafting, DeepSeek-V3 pairing (the pairing the trained models use: the main HC
 * state of position q with the embedding of token q+1 predicts token q+2). The MTP's window
 * ring needs its own rows for positions q < p, so one call evaluates the block on every
 * position that lacks its row (q >= *mtp_valid, only the last `window`), pairing X_main[q]
 * (the X ring) with tokens[q+1], and on position p with `next`; the logits of the row at p
 * are the draft for position p+2. X0[h] = e_proj·enorm(embed) + h_proj·hnorm(X_main[h]),
 * one window-only block, the MTP's HC head and norm, the shared output head. */
static dsi_status v4_draft(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                           dsii_draft_io *io, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    const v4_scratch *s = lane->priv;
    const uint32_t D = hp->n_embd, hc = hp->hc_mult, V = hp->n_vocab, nc = DSIB_HC_COEF(hc);
    uint32_t il = hp->n_layer;
    if (!am->has_mtp || !(lane->flags & DSII_LANE_TAPS) || io->n_tokens == 0 ||
        io->n_tokens >= lane->n_ctx || !io->mtp_valid)
        return dsii_fail(e, DSI_ERR_INTERNAL, "dsv4: draft: bad lane or position");
    const uint32_t p = io->n_tokens - 1;
    uint32_t q0 = *io->mtp_valid;
    if (p + 1 > hp->window && q0 < p + 1 - hp->window) q0 = p + 1 - hp->window;
    if (q0 > p) q0 = p;
    const dsib_backend *be = am->dev->be;
    dsib_error be_err = {{0}};
    dsi_status st = DSI_OK;
    int32_t *R = (int32_t *)(void *)(lane->io_host + lane->io_rows);
    int32_t *ids = (int32_t *)(void *)(lane->io_host + lane->io_ids);
    int32_t *outi = (int32_t *)(void *)(lane->io_host + lane->io_out);
    dsii_arch_params pp;
    dsii_exec_pool_params(pool, &pp);
    while (q0 <= p && st == DSI_OK) {
        uint32_t m = p + 1 - q0;
        if (m > lane->max_rows) m = lane->max_rows;
        const int last = q0 + m == p + 1;
        for (uint32_t t = 0; t < m; t++) {
            int32_t *r = R + (size_t)t * DSIB_ROW_WORDS;
            r[DSIB_ROW_POS] = (int32_t)(q0 + t);
            r[DSIB_ROW_SLOT] = (int32_t)io->slot;
            r[DSIB_ROW_FIRST] = 0;
            r[DSIB_ROW_COUNT] = (int32_t)m;
            ids[t] = q0 + t < p ? io->tokens[q0 + t + 1] : io->next;
        }
        outi[0] = (int32_t)(m - 1);
        dsii_kv_pool_lock(pool);
        v4_step P = {am, hp, am->dev, be->ops, lane->stream, lane, s, pool,
                     dsii_lane_io(lane, lane->io_rows), m,
                     (pp.flags & DSI_SESSION_FLAG_NO_FAKE_QUANT) ? DSIB_FQ_NO_ROUND : 0u};
        const dsib_ops *o = P.o;
        dsib_stream *S = P.S;
        dsib_view X = SV(&P, s->X), xin = SV(&P, s->xin), xn = SV(&P, s->xn), a = SV(&P, s->a),
                  H = SV(&P, s->hp), coef = SV(&P, s->coef);
        dsib_state xr = ST(&P, am->c_xring);
#define DK(call, what)                                                                      \
    do {                                                                                    \
        st = (call);                                                                        \
        if (st != DSI_OK) { st = dsii_fail(e, st, "dsv4: MTP: %s failed", what); goto done; } \
    } while (0)
        /* X_main rows of positions q0 .. q0+m−1 from the ring (at most two runs) */
        for (uint32_t t = 0; t < m;) {
            uint32_t r0 = (q0 + t) % xr.rows, run = xr.rows - r0;
            if (run > m - t) run = m - t;
            dsib_view src = {xr.buf, xr.offset + ((uint64_t)io->slot * xr.rows + r0) * xr.ld * 4};
            DK(o->copy(S, src, SV(&P, s->X + (uint64_t)t * hc * D * 4), (uint64_t)run * hc * D * 4),
               "X rows");
            t += run;
        }
        DK(o->rms_norm(S, X, D, X, D, m * hc, D, &am->hnorm, hp->rms_eps), "hnorm");
        DK(o->matmul(S, &am->h_proj, 0, X, D, H, D, m * hc), "h_proj");
        DK(o->get_rows(S, &am->tok_embd, dsii_lane_io(lane, lane->io_ids), xin, D, m), "embedding");
        DK(o->rms_norm(S, xin, D, xn, D, m, D, &am->enorm, hp->rms_eps), "enorm");
        DK(o->matmul(S, &am->e_proj, 0, xn, D, a, D, m), "e_proj");
        for (uint32_t h = 0; h < hc; h++)
            DK(o->add(S, a, D, SV(&P, s->hp + (uint64_t)h * D * 4), hc * D,
                      SV(&P, s->X + (uint64_t)h * D * 4), hc * D, m, D), "X0");
        st = v4_layer_step(&P, il, e);
        if (st != DSI_OK) goto done;
        if (last) {
            dsib_view Xo = SV(&P, s->Xo);
            DK(o->gather_rows(S, X, hc * D, dsii_lane_io(lane, lane->io_out), Xo, hc * D, 1, hc * D),
               "head row");
            DK(o->hc_mix(S, Xo, 1, hc, D, &am->mtp_hc_fn, &am->mtp_hc_scale, &am->mtp_hc_base,
                         hp->rms_eps, hp->hc_eps, 0, DSIB_HC_HEAD, coef, nc), "MTP hc head");
            DK(o->hc_collapse(S, Xo, coef, nc, xin, D, 1, hc, D), "MTP hc collapse");
            DK(o->rms_norm(S, xin, D, xn, D, 1, D, &am->mtp_norm, hp->rms_eps), "MTP norm");
            DK(o->matmul(S, &am->output, 0, xn, D, dsii_lane_io(lane, lane->io_logits), V, 1),
               "output head");
        }
#undef DK
    done:
        {
            dsi_status ss = be->sync(lane->stream, &be_err);
            if (st == DSI_OK && ss != DSI_OK)
                st = dsii_fail(e, ss, "%s: MTP step failed: %s", am->dev->name, be_err.msg);
        }
        dsii_kv_pool_unlock(pool);
        q0 += m;
    }
    if (st != DSI_OK) {
        *io->mtp_valid = 0; /* rows may be half written: rebuild them next time */
        return st;
    }
    *io->mtp_valid = p; /* the row of p pairs X_main[p] with `next`: valid once next is in */
    io->n_rows = 1;
    io->logits = (const float *)(const void *)(lane->io_host + lane->io_logits);
    io->hidden = NULL;
    return DSI_OK;
}

static uint32_t v4_draft_rows(const dsii_arch_model *am) { return am->has_mtp ? 1u : 0u; }

const dsii_arch dsii_arch_dsv4 = {
    .name = "deepseek4",
    .model_create = v4_model_create,
    .model_free = v4_model_free,
    .state_layout = v4_state_layout,
    .lane_init = v4_lane_init,
    .lane_fini = v4_lane_fini,
    .prepare = NULL,
    .record = v4_record,
    .draft = v4_draft,
    .draft_rows = v4_draft_rows,
};
