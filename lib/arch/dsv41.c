/*
 * lib/arch/dsv41.c — the DeepSeek V4.1 Flash forward pass ("deepseek41"), model-spec §4.
 *
 * Streaming form (§3.10): one step runs n rows — of one or several sequences, each at its
 * own positions — through every layer with backend ops only; per-sequence state (window
 * rings, shared compressed KV, index keys, compressor partial groups) lives in a slot of a
 * state pool (lib/kv); the Engram n-gram history is each sequence's own timeline (the step
 * receives tokens[0 .. pos+n) per sequence). The structure:
 *
 *   X = hc_expand(embed(ids))                        §4.1
 *   for every layer i:
 *     if Engram layer: X += gate · value             §4.6 (rows hashed on the host before the
 *                                                    step and gathered into the io block —
 *                                                    on the CPU with disk-tier tables by the
 *                                                    lane's helper while the first layers
 *                                                    run, see v41_prepare)
 *     lagged mHC around attention and MoE            §4.2
 *   logits = head · RMSNorm(Σ_h f_pre[h] X[h])       §4.1 (last layer's FFN pre mix), for the
 *                                                    output rows, in one pass, into the io block
 *
 * Attention (§4.3, CSA2): window KV FP8-simulated over the whole head in blocks of 32;
 * KV sources compress (ratio 2 gated / ratio 1 plain) into a shared compressed cache (FP4,
 * E4M3 scales, blocks of 16) and own the index keys (FP4, UE8M0, blocks of 32); index sources
 * score against their key source (§10.3: always the owner's own key cache, prefill and
 * decode alike); the candidate source publishes candidate blocks that later (non-KV) index
 * sources are masked to; every other compressed layer reuses the latest index source's
 * top-k. docs/v41-forward.md has the long form. Nothing recorded depends on positions: the
 * compressor processes every row (rows completing a group store the group's row), so one
 * recorded step replays at every position.
 */
#include "arch/arch.h"

#include "backend/device.h"
#include "backends/backend.h"
#include "base/context_impl.h"
#include "engram/engram.h"
#include "kv/kv.h"
#include "model/model.h"
#include "moe/moe.h"
#include "place/place.h"

#include <math.h>
#include <string.h>

typedef struct v41_lw {
    dsib_weight attn_norm, q_a, q_a_norm, q_b, kv, kv_norm, sinks, out_a, out_b;
    dsib_weight hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    dsib_weight comp_kv, comp_gate, comp_norm, idx_k, idx_k_norm, idx_q_b, idx_proj;
    dsib_weight ffn_norm;
    dsii_moe_weights moe;              /* lib/moe (shared with V4): §4.4 settings */
    dsib_weight eng_wkv, eng_q, eng_k;
    dsib_rope rope;
    /* state components (lib/kv; the same ids for every n_ctx) */
    uint32_t c_ring;                   /* window ring [window + margin][hd] */
    uint32_t c_comp, c_keys;           /* KV source: compressed rows [hd], keys [ID] */
    uint32_t c_ckv, c_csc;             /* KV source, ratio > 1: token rows [ratio + margin][hd] */
} v41_lw;

struct dsii_arch_model {
    dsi_model *m;
    const dsii_hparams *hp;
    dsii_device *dev;
    dsib_weight tok_embd, out_norm, output;
    v41_lw *lw;                         /* [n_layer] */
    uint32_t max_ratio, max_F;
    dsii_engram_layout elay[DSII_MAX_ENGRAM_LAYERS];
    dsii_engram_table etab[DSII_MAX_ENGRAM_LAYERS];
    dsii_engram_readers *ereaders;      /* disk-tier tables: parallel readers (issue 17), or NULL */
    int32_t overlap;                    /* Engram gathers overlap the step's first layers (issue
                                           17): CPU backend and a table in the disk tier */
    /* DSpark draft stages (§4.5): window-only lagged-mHC blocks with their own rings */
    uint32_t n_stage;
    v41_lw *dl;                         /* [n_stage] */
    dsib_weight main_proj, main_norm, draft_norm;
};

/* Lane data: scratch offsets (bytes) for max_rows rows, Engram host staging. */
typedef struct v41_lane {
    uint64_t o_e, o_X, o_ca, o_cf, o_x, o_xn, o_qr, o_q, o_kv, o_att, o_low, o_aout;
    uint64_t o_ckv, o_csc, o_pool, o_keys, o_iq, o_iw, o_cand, o_lg, o_sel, o_wts, o_mout;
    uint64_t o_shg, o_shu, o_sh, o_ekv, o_Xo, o_Co;
    uint64_t o_taps;                    /* DSII_LANE_TAPS: [rows][T·D] DSpark target inputs */
    uint64_t o_idx[DSII_MAX_LAYERS];    /* index sources: top-k [rows][topk] */
    uint64_t io_eng[DSII_MAX_ENGRAM_LAYERS]; /* io block: Engram rows [rows][C·K] */
    uint32_t *erows;                    /* host row ids [max_rows][C]; with overlap one such
                                           array per Engram layer (the helper reads them) */
    dsii_engram_async *async;           /* overlap: the lane's gather helper, or NULL */
    int32_t pending;                    /* overlap: prepare hashed a step, record gathers it */
    uint32_t pending_rows;
    int32_t gather_inline;              /* overlap lanes: gather on the step thread (fast rows) */
    uint32_t fast_batches;              /* overlapped batches in a row within the budget */
    uint64_t last_step_ns;              /* overlap lanes: the last step's wall time */
} v41_lane;

/* ---- helpers ------------------------------------------------------------------------------ */

static dsi_status be_fail(dsii_error *e, dsi_status s, const char *what, int layer) {
    if (s == DSI_OK) return DSI_OK;
    return dsii_fail(e, s, "deepseek41: backend op %s failed (layer %d): %s", what, layer,
                     dsi_status_string(s));
}
#define CK(expr, what, layer)                                                               \
    do {                                                                                    \
        DSII_PROF_BEGIN();                                                                  \
        dsi_status s_ = (expr);                                                             \
        DSII_PROF_END(what);                                                                \
        if (s_ != DSI_OK) return be_fail(e, s_, what, layer);                               \
    } while (0)

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

/* ---- per model ------------------------------------------------------------------------------ */

static void v41_model_free(dsi_model *m, dsii_arch_model *am) {
    if (!am) return;
    dsii_engram_readers_free(am->ereaders);
    dsii_free(m->ctx, am->lw);
    dsii_free(m->ctx, am->dl);
    dsii_free(m->ctx, am);
}

static const uint32_t k_v41_ops[] = {
    DSIB_OP_MATMUL, DSIB_OP_MATMUL_GROUPED, DSIB_OP_GET_ROWS, DSIB_OP_RMS_NORM, DSIB_OP_ADD,
    DSIB_OP_SCALE, DSIB_OP_COPY, DSIB_OP_COPY_ROWS, DSIB_OP_GATHER_ROWS, DSIB_OP_ROPE_TAIL,
    DSIB_OP_STORE_ROWS, DSIB_OP_FAKE_QUANT, DSIB_OP_HC_EXPAND, DSIB_OP_HC_MIX,
    DSIB_OP_HC_COLLAPSE, DSIB_OP_HC_POST, DSIB_OP_COMPRESS_POOL, DSIB_OP_ATTN_SINK,
    DSIB_OP_MOE_ROUTE, DSIB_OP_MOE_EXPERTS, DSIB_OP_SWIGLU, DSIB_OP_INDEXER_TOPK_V41,
    DSIB_OP_ENGRAM_GATE};

static dsi_status bind_layer(dsii_wtable *wt, const dsii_hparams *hp, const dsii_layer_tensors *T,
                             const dsii_layer_hparams *lh, v41_lw *w, dsii_error *e) {
    /* §4.4: MoE as V4 without hash routing; weights / (Σ + 1e-20) · route scale */
    w->moe.n_expert = lh->n_expert;
    w->moe.k = lh->n_expert_used;
    w->moe.limit = lh->swiglu_limit;
    w->moe.limit_shared = lh->swiglu_limit_shexp;
    w->moe.route_scale = hp->route_scale;
    w->moe.norm_add = 1e-20f;
    w->rope = layer_rope(hp, lh);
    const dsii_tensor *const src[] = {
        T->attn_norm, T->attn_q_a, T->attn_q_a_norm, T->attn_q_b, T->attn_kv, T->attn_kv_norm,
        T->attn_sinks, T->attn_out_a, T->attn_out_b, T->hc_attn_fn, T->hc_attn_base,
        T->hc_attn_scale, T->hc_ffn_fn, T->hc_ffn_base, T->hc_ffn_scale, T->comp_kv,
        T->comp_gate, T->comp_norm, T->idx_k, T->idx_k_norm, T->idx_q_b, T->idx_proj,
        T->ffn_norm, T->ffn_gate_inp, T->exp_probs_b, NULL, NULL,
        NULL, T->ffn_gate_shexp, T->ffn_up_shexp, T->ffn_down_shexp,
        T->engram_wkv, T->engram_q, T->engram_k};
    dsib_weight *const dst[] = {
        &w->attn_norm, &w->q_a, &w->q_a_norm, &w->q_b, &w->kv, &w->kv_norm, &w->sinks,
        &w->out_a, &w->out_b, &w->hc_attn_fn, &w->hc_attn_base, &w->hc_attn_scale,
        &w->hc_ffn_fn, &w->hc_ffn_base, &w->hc_ffn_scale, &w->comp_kv, &w->comp_gate,
        &w->comp_norm, &w->idx_k, &w->idx_k_norm, &w->idx_q_b, &w->idx_proj, &w->ffn_norm,
        &w->moe.gate_inp, &w->moe.bias, &w->moe.w1, &w->moe.w3, &w->moe.w2, &w->moe.sh_gate,
        &w->moe.sh_up, &w->moe.sh_down, &w->eng_wkv, &w->eng_q, &w->eng_k};
    for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
        dsi_status s = dsii_wtable_bind(wt, src[i], dst[i], e);
        if (s != DSI_OK) return s;
    }
    /* routed experts: resident, or served by the expert tier (lib/place) */
    int32_t li = T >= wt->model->w.layer && T < wt->model->w.layer + hp->n_layer
                     ? (int32_t)(T - wt->model->w.layer) : -1;
    dsi_status s = dsii_place_bind_experts(wt, li, T->ffn_gate_exps, T->ffn_up_exps,
                                           T->ffn_down_exps, &w->moe, e);
    if (s != DSI_OK) return s;
    return dsii_device_check_type(wt->dev, DSIB_OP_MOE_EXPERTS, w->moe.w1.type, "routed experts", e);
}

/* Adds one sequence's components in the fixed order (ids do not depend on n_ctx). */
static void add_components(dsii_arch_model *am, dsii_kv_layout *l, uint32_t n_ctx,
                           v41_lw *set_ids, int check, int *mismatch) {
    const dsii_hparams *hp = am->hp;
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        const dsii_layer_hparams *lh = &hp->layer[i];
        uint32_t ids[5] = {0, 0, 0, 0, 0};
        ids[0] = dsii_kv_add(l, DSII_KV_RING, hp->window + l->margin, hp->head_dim);
        /* quantised forms (§4.3, §4.8, §10.1): window KV FP8 over the whole row (blocks of 32,
         * UE8M0), compressed KV FP4 with E4M3 scales (blocks of 16), index keys FP4 (blocks
         * of 32, UE8M0) */
        dsii_kv_set_format(l, ids[0], DSIB_STATE_E4M3_UE8M0, hp->head_dim, 32);
        if (lh->compress_ratio > 0 && lh->is_kv_source) {
            uint32_t rows = (n_ctx + 1) / lh->compress_ratio + 1;
            ids[1] = dsii_kv_add(l, DSII_KV_ROWS, rows, hp->head_dim);
            ids[2] = dsii_kv_add(l, DSII_KV_ROWS, rows, hp->idx_head_dim);
            dsii_kv_set_format(l, ids[1], DSIB_STATE_E2M1_E4M3, hp->head_dim, 16);
            dsii_kv_set_format(l, ids[2], DSIB_STATE_E2M1_UE8M0, hp->idx_head_dim, 32);
            /* one compressed row / index key per completed group (store_rows ratio) */
            dsii_kv_set_ratio(l, ids[1], lh->compress_ratio);
            dsii_kv_set_ratio(l, ids[2], lh->compress_ratio);
            if (lh->compress_ratio > 1) {
                ids[3] = dsii_kv_add(l, DSII_KV_RING, am->max_ratio + l->margin, hp->head_dim);
                ids[4] = dsii_kv_add(l, DSII_KV_RING, am->max_ratio + l->margin, hp->head_dim);
            }
        }
        if (set_ids) {
            v41_lw *w = &set_ids[i];
            w->c_ring = ids[0], w->c_comp = ids[1], w->c_keys = ids[2], w->c_ckv = ids[3],
            w->c_csc = ids[4];
        }
        if (check) {
            const v41_lw *w = &am->lw[i];
            if (w->c_ring != ids[0] || w->c_comp != ids[1] || w->c_keys != ids[2] ||
                w->c_ckv != ids[3] || w->c_csc != ids[4])
                *mismatch = 1;
        }
    }
    /* DSpark stages (§4.5): one window ring each, fed with main_kv rows of the target's
     * positions and, during a draft, the block's own keys at the 5 positions after the end
     * (position-addressed, so rollback needs nothing: rows past the frontier are rewritten
     * before they are read). */
    for (uint32_t st = 0; st < am->n_stage; st++) {
        uint32_t id = dsii_kv_add(l, DSII_KV_RING, hp->window + DSII_DRAFT_RING_EXTRA + l->margin,
                                  hp->head_dim);
        dsii_kv_set_format(l, id, DSIB_STATE_E4M3_UE8M0, hp->head_dim, 32);
        if (set_ids) am->dl[st].c_ring = id;
        if (check && am->dl[st].c_ring != id) *mismatch = 1;
    }
}

static dsi_status v41_model_create(dsi_model *model, dsii_wtable *wt, dsii_arch_model **out,
                                   dsii_error *e) {
    *out = NULL;
    const dsii_hparams *hp = &model->hp;
    if (hp->arch != DSI_ARCH_DEEPSEEK41)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: model is not deepseek41");
    dsi_status s = dsii_device_check_ops(wt->dev, k_v41_ops, sizeof k_v41_ops / sizeof k_v41_ops[0], e);
    if (s != DSI_OK) return s;
    if (hp->n_layer > DSII_MAX_LAYERS)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "deepseek41: too many layers");
    dsii_arch_model *am = dsii_calloc(model->ctx, 1, sizeof *am);
    if (!am) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: model data");
    am->m = model;
    am->hp = hp;
    am->dev = wt->dev;
    const uint32_t L = hp->n_layer;
    am->max_ratio = 1;
    for (uint32_t i = 0; i < L; i++)
        if (hp->layer[i].compress_ratio > am->max_ratio) am->max_ratio = hp->layer[i].compress_ratio;
    am->lw = (v41_lw *)dsii_calloc(model->ctx, L ? L : 1, sizeof *am->lw);
    if (!am->lw) {
        s = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: layer table");
        goto fail;
    }
    if ((s = dsii_wtable_bind(wt, model->w.token_embd, &am->tok_embd, e)) != DSI_OK ||
        (s = dsii_wtable_bind(wt, model->w.output_norm, &am->out_norm, e)) != DSI_OK ||
        (s = dsii_wtable_bind(wt, model->w.output, &am->output, e)) != DSI_OK)
        goto fail;
    for (uint32_t i = 0; i < L; i++) {
        s = bind_layer(wt, hp, &model->w.layer[i], &hp->layer[i], &am->lw[i], e);
        if (s != DSI_OK) goto fail;
        if (am->lw[i].moe.w1.buf && (uint32_t)am->lw[i].moe.w1.ne[1] > am->max_F)
            am->max_F = (uint32_t)am->lw[i].moe.w1.ne[1];
    }
    /* DSpark stages (§4.5) */
    if (hp->has_dspark && hp->n_draft > 0) {
        const dsii_draft_tensors *D0 = &model->w.draft[0], *DL = &model->w.draft[hp->n_draft - 1];
        am->dl = (v41_lw *)dsii_calloc(model->ctx, hp->n_draft, sizeof *am->dl);
        if (!am->dl) {
            s = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: draft table");
            goto fail;
        }
        for (uint32_t d = 0; d < hp->n_draft; d++) {
            s = bind_layer(wt, hp, &model->w.draft[d].blk, &hp->draft_layer[d], &am->dl[d], e);
            if (s != DSI_OK) goto fail;
            if (am->dl[d].moe.w1.buf && (uint32_t)am->dl[d].moe.w1.ne[1] > am->max_F)
                am->max_F = (uint32_t)am->dl[d].moe.w1.ne[1];
        }
        if ((s = dsii_wtable_bind(wt, D0->main_proj, &am->main_proj, e)) != DSI_OK ||
            (s = dsii_wtable_bind(wt, D0->main_norm, &am->main_norm, e)) != DSI_OK ||
            (s = dsii_wtable_bind(wt, DL->norm, &am->draft_norm, e)) != DSI_OK)
            goto fail;
        if (am->main_proj.buf && am->main_norm.buf && am->draft_norm.buf &&
            hp->dspark.n_target > 0 && hp->dspark.block_size > 0 &&
            (uint64_t)am->main_proj.ne[0] == (uint64_t)hp->dspark.n_target * hp->n_embd)
            am->n_stage = hp->n_draft;
    }
    /* component ids */
    dsii_kv_layout ids;
    dsii_kv_layout_init(&ids, model->ctx, DSII_DEFAULT_MARGIN);
    add_components(am, &ids, 1, am->lw, 0, NULL);
    s = ids.status;
    dsii_kv_layout_free(&ids);
    if (s != DSI_OK) {
        dsii_fail(e, s, "deepseek41: out of host memory");
        goto fail;
    }

    /* Engram layouts and tables (§4.6). */
    const dsii_engram_hparams *eh = &hp->engram;
    if (hp->has_engram && eh->n_layer > 0) {
        for (uint32_t j = 0; j < eh->n_layer; j++) {
            dsii_engram_layout *l = &am->elay[j];
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
            if (t->lazy || !t->data) {
                s = dsii_engram_table_file(&am->etab[j], t->type, t->ne[0], (uint64_t)t->ne[1],
                                           dsii_gguf_file(model->gguf), t->file_offset, e);
                /* memory tiers: its row cache, when the plan has one (lib/place) */
                if (s == DSI_OK) s = dsii_place_engram_cache(model, j, &am->etab[j], e);
                /* parallel readers, one pool for the model's tables (dsii_engram_readers_test:
                 * tests only; 1 = the serial path) */
                int32_t nr = atomic_load(&dsii_engram_readers_test);
                if (nr <= 0) nr = DSII_ENGRAM_READERS;
                if (nr > DSII_ENGRAM_MAX_READERS) nr = DSII_ENGRAM_MAX_READERS;
                if (s == DSI_OK && nr > 1 && !am->ereaders)
                    s = dsii_engram_readers_create(model->ctx, nr, &am->ereaders, e);
                am->etab[j].readers = am->ereaders;
            }
            else
                s = dsii_engram_table_host(&am->etab[j], t->type, t->ne[0], (uint64_t)t->ne[1],
                                           t->data, e);
            if (s != DSI_OK) goto fail;
            if (am->etab[j].placement == DSII_ENGRAM_PLACE_PREAD) am->overlap = 1;
        }
        /* Overlap (issue 17, docs/placement.md "Engram overlap"): only where ops run as they
         * are recorded (the CPU backend), so that a host wait right before a layer's Engram op
         * is the whole ordering; and only for tables in the disk tier (a resident gather is a
         * copy, cheaper than the hand-over). dsii_engram_overlap_test 1 (tests, A/B): off. */
        if (strcmp(am->dev->name, "cpu") != 0 || atomic_load(&dsii_engram_overlap_test) == 1)
            am->overlap = 0;
    }
    *out = am;
    return DSI_OK;
fail:
    v41_model_free(model, am);
    return s;
}

static dsi_status v41_state_layout(const dsii_arch_model *am, uint32_t n_ctx, dsii_kv_layout *l,
                                   dsii_error *e) {
    int mismatch = 0;
    add_components((dsii_arch_model *)(uintptr_t)am, l, n_ctx, NULL, 1, &mismatch);
    if (l->status != DSI_OK) return dsii_fail(e, l->status, "deepseek41: state layout: out of host memory");
    if (mismatch) return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: state layout mismatch");
    return DSI_OK;
}

/* ---- lanes ------------------------------------------------------------------------------------- */

/* Reserves `bytes` (rounded up to 256) at *cursor; returns the offset. */
static uint64_t take(uint64_t *cursor, uint64_t bytes) {
    uint64_t o = *cursor;
    *cursor += (bytes + 255u) & ~(uint64_t)255u;
    return o;
}

static dsi_status v41_lane_init(const dsii_arch_model *am, dsii_lane *lane, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    const dsi_context *ctx = am->m->ctx;
    v41_lane *v = dsii_calloc(ctx, 1, sizeof *v);
    if (!v) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: lane");
    const uint32_t L = hp->n_layer, D = hp->n_embd, hc = hp->hc_mult, hd = hp->head_dim;
    const uint32_t ID = hp->idx_head_dim, IH = hp->idx_n_head;
    const uint64_t n = lane->max_rows, no = lane->max_out;
    const uint32_t H = hp->n_head, Q = hp->q_lora_rank, G = hp->o_groups, R = hp->o_lora_rank;
    const uint32_t E = hp->n_expert, kx = hp->n_expert_used;
    const uint32_t SF = hp->n_expert_shared * hp->expert_ff;
    const uint32_t M = DSIB_HC_COEF(hc);
    const dsii_engram_hparams *eh = &hp->engram;
    const uint32_t C = eh->n_cols, K = eh->key_length;
    uint64_t sc = 0;
    v->o_e = take(&sc, n * D * 4);
    v->o_X = take(&sc, n * hc * D * 4);
    v->o_ca = take(&sc, n * M * 4);
    v->o_cf = take(&sc, n * M * 4);
    v->o_x = take(&sc, n * D * 4);
    v->o_xn = take(&sc, n * D * 4);
    v->o_qr = take(&sc, n * Q * 4);
    v->o_q = take(&sc, n * H * hd * 4);
    v->o_kv = take(&sc, n * hd * 4);
    v->o_att = take(&sc, n * H * hd * 4);
    v->o_low = take(&sc, n * G * R * 4);
    v->o_aout = take(&sc, n * D * 4);
    v->o_ckv = take(&sc, n * hd * 4);
    v->o_csc = take(&sc, n * hd * 4);
    v->o_pool = take(&sc, n * hd * 4);
    v->o_keys = take(&sc, n * ID * 4);
    v->o_iq = take(&sc, n * IH * ID * 4);
    v->o_iw = take(&sc, n * IH * 4);
    uint32_t ck = hp->candidate_topk_blocks ? hp->candidate_topk_blocks : 1;
    v->o_cand = take(&sc, n * ck * 4);
    for (uint32_t i = 0; i < L; i++)
        if (hp->layer[i].is_index_source) v->o_idx[i] = take(&sc, n * hp->idx_topk * 4);
    v->o_lg = take(&sc, n * E * 4);
    v->o_sel = take(&sc, n * kx * 4);
    v->o_wts = take(&sc, n * kx * 4);
    v->o_mout = take(&sc, n * D * 4);
    v->o_shg = take(&sc, n * (SF ? SF : 1) * 4);
    v->o_shu = take(&sc, n * (SF ? SF : 1) * 4);
    v->o_sh = take(&sc, n * D * 4);
    v->o_ekv = take(&sc, n * (hc + 1) * D * 4);
    v->o_Xo = take(&sc, no * hc * D * 4);
    v->o_Co = take(&sc, no * M * 4);
    if ((lane->flags & DSII_LANE_TAPS) && am->n_stage) {
        v->o_taps = take(&sc, n * hp->dspark.n_target * D * 4);
        lane->io_spec_bytes = (uint64_t)hp->dspark.block_size * D * 4; /* y rows */
    }
    lane->scratch_bytes = sc;
    /* io extra: Engram rows of every Engram layer */
    uint64_t io = 0;
    if (hp->has_engram)
        for (uint32_t j = 0; j < eh->n_layer; j++) v->io_eng[j] = take(&io, n * C * K * 4);
    lane->io_extra_bytes = io;
    if (hp->has_engram && eh->n_layer > 0) {
        const size_t per = (size_t)n * (C ? C : 1);
        v->erows = (uint32_t *)dsii_calloc(ctx, am->overlap ? per * eh->n_layer : per,
                                           sizeof(uint32_t));
        dsi_status s = v->erows ? DSI_OK
                                : dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "deepseek41: engram staging");
        if (s == DSI_OK && am->overlap && eh->n_layer <= DSII_ENGRAM_ASYNC_MAX)
            s = dsii_engram_async_create(ctx, &v->async, e); /* NULL: gathers before the step */
        if (s != DSI_OK) {
            dsii_free(ctx, v->erows);
            dsii_free(ctx, v);
            return s;
        }
    }
    lane->priv = v;
    dsib_stream_desc *d = &lane->desc;
    d->max_heads = H > IH ? H : IH;
    d->max_head_dim = hd > ID ? hd : ID;
    d->max_topk = hp->idx_topk > ck ? hp->idx_topk : ck;
    d->max_experts = E;
    d->max_experts_used = kx;
    uint32_t W = (hc + 1) * D;
    if (am->max_F > W) W = am->max_F;
    d->max_width = W;
    return DSI_OK;
}

static void v41_lane_fini(dsii_lane *lane) {
    v41_lane *v = lane->priv;
    if (!v) return;
    dsii_engram_async_free(v->async); /* joins the helper (after any batch it runs) */
    dsii_free(lane->ex->ctx, v->erows);
    dsii_free(lane->ex->ctx, v);
    lane->priv = NULL;
}

/* Engram rows (§4.6): hashes from each sequence's own timeline (so the n-gram history is
 * exact across chunks, decode, batches and rebuilds), rows gathered into the io block.
 *
 * Without overlap the gathers run here, before the step. With overlap (am->overlap and the
 * lane's helper) only the hashes run here, into one row-id array per Engram layer; record()
 * hands the gathers to the helper as its first action and waits for layer j's rows right
 * before layer j's Engram op (on the CPU backend an op runs as it is recorded, so that host
 * wait orders the rows before their use), and finishes the whole batch before it returns,
 * on every path. Starting them in record() rather than here means no gather can outlive
 * the step: exec.c runs record() whenever the step runs at all, and prepare() has nothing
 * to undo when the step fails before that. GPU backends keep the gathers here: their work
 * is submitted (or a captured graph launched) only after the host has written the whole io
 * block, which is the only ordering the backend interface gives for host writes. */
static dsi_status v41_prepare(const dsii_arch_model *am, dsii_lane *lane, const dsii_seq_step *seqs,
                              uint32_t n_seqs, uint32_t n_rows, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    if (!hp->has_engram) return DSI_OK;
    const dsii_engram_hparams *eh = &hp->engram;
    v41_lane *v = lane->priv;
    const uint32_t C = eh->n_cols, nh = eh->max_ngram - 1;
    const int overlap = v->async != NULL;
    v->pending = 0;
    for (uint32_t j = 0; j < eh->n_layer; j++) {
        uint32_t *rows = v->erows + (overlap ? (size_t)j * lane->max_rows * C : 0);
        uint32_t t = 0;
        for (uint32_t i = 0; i < n_seqs; i++) {
            const dsii_seq_step *q = &seqs[i];
            const uint32_t h0 = q->pos > nh ? q->pos - nh : 0;
            dsii_engram_hash(&am->elay[j], q->tokens + h0, (int32_t)(q->pos - h0),
                             q->tokens + q->pos, (int32_t)q->n, rows + (size_t)t * C);
            t += q->n;
        }
        if (overlap) continue;
        float *dst = (float *)(void *)(lane->io_host + lane->io_extra + v->io_eng[j]);
        dsi_status s = dsii_engram_gather(am->m->ctx, &am->etab[j], rows, (size_t)n_rows * C,
                                          dst, e);
        if (s != DSI_OK) return s;
    }
    if (overlap) {
        v->pending = 1;
        v->pending_rows = n_rows;
    }
    return DSI_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

typedef struct v41_step {
    const dsii_arch_model *am;
    const dsii_hparams *hp;
    const dsii_device *dev;
    const dsib_ops *o;
    dsib_stream *S;
    const dsii_lane *lane;
    const v41_lane *v;
    dsii_kv_pool *pool;
    dsib_view rows;
    uint32_t n, fq;
} v41_step;

static inline dsib_view SV(const v41_step *P, uint64_t off) { return dsii_lane_sv(P->lane, off); }
static dsib_state ST(const v41_step *P, uint32_t comp) {
    dsib_state s;
    dsii_kv_pool_state(P->pool, comp, &s);
    return s;
}
static const dsib_view NOVIEW = {NULL, 0};

/* Compressor of a KV source (§4.3), every row of the step: rows completing a group pool it
 * (ratio > 1) or are it (ratio 1); the latent = RMSNorm(pooled) gives the index key
 * (RMSNorm(wk · latent), RoPE at the group's first position, FP4 UE8M0 blocks of 32) and the
 * compressed row (RoPE, FP4 with E4M3 scales in blocks of 16); both are stored for the
 * rows that complete a group; the token rows go into the rings. */
static dsi_status compressor(const v41_step *P, uint32_t il, dsii_error *e) {
    const dsii_hparams *hp = P->hp;
    const dsii_layer_hparams *lh = &hp->layer[il];
    const v41_lw *w = &P->am->lw[il];
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const v41_lane *v = P->v;
    const uint32_t hd = hp->head_dim, ID = hp->idx_head_dim, r = lh->compress_ratio, n = P->n;
    int il_ = (int)il;

    /* comp_kv (and comp_gate) ran with the layer's other projections of xn (attention) */
    dsib_view pooled = SV(P, v->o_ckv); /* ratio 1: one token per group, no gate */
    dsib_state rk, rs, comp = ST(P, w->c_comp), keys = ST(P, w->c_keys);
    if (r > 1) {
        rk = ST(P, w->c_ckv);
        rs = ST(P, w->c_csc);
        CK(o->compress_pool(S, &rk, &rs, SV(P, v->o_ckv), SV(P, v->o_csc), hd, P->rows, n, r, 0,
                            hd, SV(P, v->o_pool), hd),
           "compress_pool", il_);
        pooled = SV(P, v->o_pool);
    }
    dsib_view lat = SV(P, v->o_pool), ky = SV(P, v->o_keys);
    CK(o->rms_norm(S, pooled, hd, lat, hd, n, hd, &w->comp_norm, hp->rms_eps), "rms_norm comp", il_);
    /* index keys from the pre-RoPE latent */
    CK(o->matmul(S, &w->idx_k, 0, lat, hd, ky, ID, n), "matmul idx_k", il_);
    CK(o->rms_norm(S, ky, ID, ky, ID, n, ID, &w->idx_k_norm, hp->rms_eps), "rms_norm idx_k", il_);
    CK(o->rope_tail(S, ky, ID, n, 1, ID, P->rows, 1 - (int32_t)r, &w->rope, 0), "rope keys", il_);
    CK(o->fake_quant(S, ky, ID, n, 0, ID, 32, DSIB_FQ_E2M1_UE8M0, P->fq), "fake_quant keys", il_);
    CK(o->store_rows(S, ky, ID, n, P->rows, &keys, ID, r, 0), "store keys", il_);
    /* compressed KV row: RoPE then FP4 with E4M3 scales in blocks of 16 (§10.1) */
    CK(o->rope_tail(S, lat, hd, n, 1, hd, P->rows, 1 - (int32_t)r, &w->rope, 0), "rope comp", il_);
    CK(o->fake_quant(S, lat, hd, n, 0, hd, 16, DSIB_FQ_E2M1_E4M3, P->fq), "fake_quant comp", il_);
    CK(o->store_rows(S, lat, hd, n, P->rows, &comp, hd, r, 0), "store comp", il_);
    if (r > 1) { /* keep the token rows: partial groups continue in the next step */
        CK(o->store_rows(S, SV(P, v->o_ckv), hd, n, P->rows, &rk, hd, 1, DSIB_STORE_RING),
           "ring ckv", il_);
        CK(o->store_rows(S, SV(P, v->o_csc), hd, n, P->rows, &rs, hd, 1, DSIB_STORE_RING),
           "ring csc", il_);
    }
    return DSI_OK;
}

/* Indexer of an index source (§4.3): q from qr, head weights from x, top-k over the key
 * source's keys, candidate blocks (candidate source) or masking (masked sources). */
static dsi_status indexer(const v41_step *P, uint32_t il, dsii_error *e) {
    const dsii_hparams *hp = P->hp;
    const dsii_layer_hparams *lh = &hp->layer[il];
    const v41_lw *w = &P->am->lw[il];
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const v41_lane *v = P->v;
    const uint32_t IH = hp->idx_n_head, ID = hp->idx_head_dim, n = P->n;
    int il_ = (int)il;
    /* idx_q_b (from qr) and idx_proj (from xn) ran with the attention's projections */
    CK(o->rope_tail(S, SV(P, v->o_iq), IH * ID, n, IH, ID, P->rows, 0, &w->rope, 0), "rope iq", il_);
    CK(o->fake_quant(S, SV(P, v->o_iq), IH * ID, n, 0, IH * ID, 32, DSIB_FQ_E2M1_UE8M0, P->fq),
       "fake_quant iq", il_);
    const float wscale = (float)(1.0 / sqrt((double)ID) / sqrt((double)IH));
    CK(o->scale(S, SV(P, v->o_iw), IH, n, IH, wscale), "scale iw", il_);
    if (lh->key_src < 0 || (uint32_t)lh->key_src >= hp->n_layer ||
        !hp->layer[lh->key_src].is_kv_source)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: layer %u has no index-key owner", il);
    /* §10.3: always the owner's own keys */
    dsib_state keys = ST(P, P->am->lw[lh->key_src].c_keys);
    dsib_view cin = NOVIEW, cout = NOVIEW;
    if (lh->is_candidate_source) cout = SV(P, v->o_cand);
    else if (lh->cand_masked) cin = SV(P, v->o_cand);
    CK(o->indexer_topk_v41(S, SV(P, v->o_iq), IH * ID, SV(P, v->o_iw), IH, &keys, IH, ID,
                           P->rows, n, lh->compress_ratio, hp->idx_topk, SV(P, v->o_idx[il]), cin,
                           cout, hp->candidate_block_size, hp->candidate_topk_blocks),
       "indexer_topk_v41", il_);
    return DSI_OK;
}

static dsi_status attention(const v41_step *P, uint32_t il, dsii_error *e) {
    const dsii_hparams *hp = P->hp;
    const dsii_layer_hparams *lh = &hp->layer[il];
    const v41_lw *w = &P->am->lw[il];
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const v41_lane *v = P->v;
    const uint32_t D = hp->n_embd, H = hp->n_head, hd = hp->head_dim, Q = hp->q_lora_rank;
    const uint32_t n = P->n;
    int il_ = (int)il;

    uint32_t ratio = lh->compress_ratio;
    const int kv_src = ratio > 0 && lh->is_kv_source, idx_src = ratio > 0 && lh->is_index_source;
    /* Every projection of xn at once (one parallel job on the CPU; the same results as one
     * matmul each): wq_a, wkv, and the compressor's (KV source) / the indexer's head weights
     * (index source). */
    dsib_mm mx[5];
    uint32_t nmx = 0;
    mx[nmx++] = (dsib_mm){&w->q_a, 0, SV(P, v->o_xn), D, SV(P, v->o_qr), Q, n};
    mx[nmx++] = (dsib_mm){&w->kv, 0, SV(P, v->o_xn), D, SV(P, v->o_kv), hd, n};
    if (kv_src) {
        mx[nmx++] = (dsib_mm){&w->comp_kv, 0, SV(P, v->o_xn), D, SV(P, v->o_ckv), hd, n};
        if (ratio > 1)
            mx[nmx++] = (dsib_mm){&w->comp_gate, 0, SV(P, v->o_xn), D, SV(P, v->o_csc), hd, n};
    }
    if (idx_src)
        mx[nmx++] = (dsib_mm){&w->idx_proj, 0, SV(P, v->o_xn), D, SV(P, v->o_iw),
                              hp->idx_n_head, n};
    CK(dsii_op_matmul_multi(P->dev, S, mx, nmx), "matmuls of xn (q_a, kv, compressor, idx_proj)",
       il_);
    /* Q: RMSNorm(wq_a x, q_norm) → wq_b → RoPE; no per-head q norm in V4.1 */
    CK(o->rms_norm(S, SV(P, v->o_qr), Q, SV(P, v->o_qr), Q, n, Q, &w->q_a_norm, hp->rms_eps),
       "rms_norm q", il_);
    dsib_mm mq[2];
    uint32_t nmq = 0;
    mq[nmq++] = (dsib_mm){&w->q_b, 0, SV(P, v->o_qr), Q, SV(P, v->o_q), H * hd, n};
    if (idx_src)
        mq[nmq++] = (dsib_mm){&w->idx_q_b, 0, SV(P, v->o_qr), Q, SV(P, v->o_iq),
                              hp->idx_n_head * hp->idx_head_dim, n};
    CK(dsii_op_matmul_multi(P->dev, S, mq, nmq), "matmuls of qr (q_b, idx_q_b)", il_);
    CK(o->rope_tail(S, SV(P, v->o_q), H * hd, n, H, hd, P->rows, 0, &w->rope, 0), "rope q", il_);
    /* window KV: RMSNorm(wkv x), RoPE, FP8 over the whole head in blocks of 32 */
    CK(o->rms_norm(S, SV(P, v->o_kv), hd, SV(P, v->o_kv), hd, n, hd, &w->kv_norm, hp->rms_eps),
       "rms_norm kv", il_);
    CK(o->rope_tail(S, SV(P, v->o_kv), hd, n, 1, hd, P->rows, 0, &w->rope, 0), "rope kv", il_);
    CK(o->fake_quant(S, SV(P, v->o_kv), hd, n, 0, hd, 32, DSIB_FQ_E4M3_UE8M0, P->fq),
       "fake_quant kv", il_);

    if (kv_src) {
        dsi_status s = compressor(P, il, e);
        if (s != DSI_OK) return s;
    }
    if (idx_src) {
        dsi_status s = indexer(P, il, e);
        if (s != DSI_OK) return s;
    }
    dsib_state comp, ring = ST(P, w->c_ring);
    memset(&comp, 0, sizeof comp);
    dsib_view idx = NOVIEW;
    if (ratio > 0) {
        if (lh->kv_src < 0 || (uint32_t)lh->kv_src >= hp->n_layer)
            return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: layer %u has no KV source", il);
        comp = ST(P, P->am->lw[lh->kv_src].c_comp);
        /* no index source at or before the layer (no shipped config): every visible row */
        if (lh->topk_src >= 0 && (uint32_t)lh->topk_src < hp->n_layer)
            idx = SV(P, v->o_idx[lh->topk_src]);
    }
    CK(o->attn_sink(S, SV(P, v->o_q), H * hd, H, hd, P->rows, n, hp->window, &ring,
                    SV(P, v->o_kv), hd, ratio, ratio > 0 ? &comp : NULL, idx, hp->idx_topk,
                    &w->sinks, 1.0f / sqrtf((float)hd), SV(P, v->o_att), H * hd),
       "attn_sink", il_);
    CK(o->store_rows(S, SV(P, v->o_kv), hd, n, P->rows, &ring, hd, 1, DSIB_STORE_RING),
       "ring kv", il_);
    /* V carried the key's rotation: un-rotate the output, then the grouped projection */
    CK(o->rope_tail(S, SV(P, v->o_att), H * hd, n, H, hd, P->rows, 0, &w->rope, 1), "rope out", il_);
    CK(dsii_op_matmul_grouped(P->dev, S, &w->out_a, hp->o_groups, SV(P, v->o_att), H * hd,
                              SV(P, v->o_low), hp->o_groups * hp->o_lora_rank, n),
       "matmul out_a", il_);
    CK(o->matmul(S, &w->out_b, 0, SV(P, v->o_low), hp->o_groups * hp->o_lora_rank,
                 SV(P, v->o_aout), D, n),
       "matmul out_b", il_);
    return DSI_OK;
}

/* ---- DSpark (§4.5) ------------------------------------------------------------------------ */

/* dst[t][0:D] = mean_h X[t][h] (Σ in stream order, then × 1/hc: exact for hc = 4). */
static dsi_status tap_mean(const v41_step *P, dsib_view dst, uint32_t ldd, dsii_error *e) {
    const dsii_hparams *hp = P->hp;
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const uint32_t D = hp->n_embd, hc = hp->hc_mult, n = P->n;
    const uint64_t X = P->v->o_X;
    if (hc == 1) {
        CK(dsii_op_copy_rows(P->dev, S, SV(P, X), D, dst, ldd, n, D), "tap copy", -1);
        return DSI_OK;
    }
    CK(o->add(S, SV(P, X), hc * D, SV(P, X + (uint64_t)D * 4), hc * D, dst, ldd, n, D), "tap add", -1);
    for (uint32_t h = 2; h < hc; h++)
        CK(o->add(S, dst, ldd, SV(P, X + (uint64_t)h * D * 4), hc * D, dst, ldd, n, D), "tap add", -1);
    CK(o->scale(S, dst, ldd, n, D, 1.0f / (float)hc), "tap scale", -1);
    return DSI_OK;
}

/* Seeds every stage's window ring with the step's rows (§4.5 "prefill only seeds this ring"
 * — and every verified row after it): main_x = RMSNorm(main_proj · concat(taps), main_norm),
 * main_kv = kv_norm(wkv · main_x), RoPE at the row's position, FP8 over the whole head. */
static dsi_status dspark_seed(const v41_step *P, dsii_error *e) {
    const dsii_arch_model *am = P->am;
    const dsii_hparams *hp = P->hp;
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const v41_lane *v = P->v;
    const uint32_t D = hp->n_embd, hd = hp->head_dim, n = P->n, T = hp->dspark.n_target;
    CK(o->matmul(S, &am->main_proj, 0, SV(P, v->o_taps), T * D, SV(P, v->o_x), D, n),
       "matmul main_proj", -1);
    CK(o->rms_norm(S, SV(P, v->o_x), D, SV(P, v->o_xn), D, n, D, &am->main_norm, hp->rms_eps),
       "main_norm", -1);
    for (uint32_t st = 0; st < am->n_stage; st++) {
        const v41_lw *w = &am->dl[st];
        dsib_state ring = ST(P, w->c_ring);
        int sl = (int)(hp->n_layer + st);
        CK(o->matmul(S, &w->kv, 0, SV(P, v->o_xn), D, SV(P, v->o_kv), hd, n), "matmul draft kv", sl);
        CK(o->rms_norm(S, SV(P, v->o_kv), hd, SV(P, v->o_kv), hd, n, hd, &w->kv_norm, hp->rms_eps),
           "rms_norm draft kv", sl);
        CK(o->rope_tail(S, SV(P, v->o_kv), hd, n, 1, hd, P->rows, 0, &w->rope, 0), "rope draft kv", sl);
        CK(o->fake_quant(S, SV(P, v->o_kv), hd, n, 0, hd, 32, DSIB_FQ_E4M3_UE8M0, P->fq),
           "fake_quant draft kv", sl);
        CK(o->store_rows(S, SV(P, v->o_kv), hd, n, P->rows, &ring, hd, 1, DSIB_STORE_RING),
           "draft ring", sl);
    }
    return DSI_OK;
}

/* DSparkAttention of stage `st` over the block's n rows (positions p+1 .. p+n in P->rows):
 * the block's keys go into the stage ring at their positions, then every query attends to
 * the ring rows of positions p−window+1 .. p AND all n block keys (non-causal inside the
 * block): attn_sink where every row is a one-row sequence at the block's last position p+n
 * (`arows`), with a window of window + n, so positions p−window+1 .. p+n−1 come from the
 * ring and p+n from the step's own row — the last key for every row (ldkv 0). */
static dsi_status dspark_attention(const v41_step *P, uint32_t st, dsib_view arows, dsii_error *e) {
    const dsii_hparams *hp = P->hp;
    const v41_lw *w = &P->am->dl[st];
    const dsib_ops *o = P->o;
    dsib_stream *S = P->S;
    const v41_lane *v = P->v;
    const uint32_t D = hp->n_embd, H = hp->n_head, hd = hp->head_dim, Q = hp->q_lora_rank;
    const uint32_t n = P->n;
    int il_ = (int)(hp->n_layer + st);
    dsib_state ring = ST(P, w->c_ring);
    CK(o->matmul(S, &w->q_a, 0, SV(P, v->o_xn), D, SV(P, v->o_qr), Q, n), "matmul q_a", il_);
    CK(o->rms_norm(S, SV(P, v->o_qr), Q, SV(P, v->o_qr), Q, n, Q, &w->q_a_norm, hp->rms_eps),
       "rms_norm q", il_);
    CK(o->matmul(S, &w->q_b, 0, SV(P, v->o_qr), Q, SV(P, v->o_q), H * hd, n), "matmul q_b", il_);
    CK(o->rope_tail(S, SV(P, v->o_q), H * hd, n, H, hd, P->rows, 0, &w->rope, 0), "rope q", il_);
    CK(o->matmul(S, &w->kv, 0, SV(P, v->o_xn), D, SV(P, v->o_kv), hd, n), "matmul kv", il_);
    CK(o->rms_norm(S, SV(P, v->o_kv), hd, SV(P, v->o_kv), hd, n, hd, &w->kv_norm, hp->rms_eps),
       "rms_norm kv", il_);
    CK(o->rope_tail(S, SV(P, v->o_kv), hd, n, 1, hd, P->rows, 0, &w->rope, 0), "rope kv", il_);
    CK(o->fake_quant(S, SV(P, v->o_kv), hd, n, 0, hd, 32, DSIB_FQ_E4M3_UE8M0, P->fq),
       "fake_quant kv", il_);
    CK(o->store_rows(S, SV(P, v->o_kv), hd, n, P->rows, &ring, hd, 1, DSIB_STORE_RING),
       "ring kv", il_);
    CK(o->attn_sink(S, SV(P, v->o_q), H * hd, H, hd, arows, n, hp->window + n, &ring,
                    SV(P, v->o_kv + (uint64_t)(n - 1) * hd * 4), 0, 0, NULL, NOVIEW, 0, &w->sinks,
                    1.0f / sqrtf((float)hd), SV(P, v->o_att), H * hd),
       "attn_sink", il_);
    CK(o->rope_tail(S, SV(P, v->o_att), H * hd, n, H, hd, P->rows, 0, &w->rope, 1), "rope out", il_);
    CK(dsii_op_matmul_grouped(P->dev, S, &w->out_a, hp->o_groups, SV(P, v->o_att), H * hd,
                              SV(P, v->o_low), hp->o_groups * hp->o_lora_rank, n),
       "matmul out_a", il_);
    CK(o->matmul(S, &w->out_b, 0, SV(P, v->o_low), hp->o_groups * hp->o_lora_rank,
                 SV(P, v->o_aout), D, n),
       "matmul out_b", il_);
    return DSI_OK;
}

static dsi_status record_step(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                              const dsii_step_shape *sh, int overlapped, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    const v41_lane *v = lane->priv;
    const dsii_engram_probe_fn probe = hp->has_engram ? atomic_load(&dsii_engram_step_probe) : NULL;
    v41_step P = {am, hp, am->dev, am->dev->be->ops, lane->stream, lane, v, pool,
                  dsii_lane_io(lane, lane->io_rows), sh->n, sh->fq_flags};
    const dsib_ops *o = P.o;
    dsib_stream *S = P.S;
    const uint32_t D = hp->n_embd, hc = hp->hc_mult, M = DSIB_HC_COEF(hc), n = sh->n;
    const dsii_engram_hparams *eh = &hp->engram;
    const int taps = (lane->flags & DSII_LANE_TAPS) && am->n_stage > 0;
    dsi_status s;

    CK(o->get_rows(S, &am->tok_embd, dsii_lane_io(lane, lane->io_ids), SV(&P, v->o_e), D, n),
       "get_rows", -1);
    CK(o->hc_expand(S, SV(&P, v->o_e), D, SV(&P, v->o_X), n, hc, D), "hc_expand", -1);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const dsii_layer_hparams *lh = &hp->layer[il];
        const v41_lw *w = &am->lw[il];
        int il_ = (int)il;
        if (probe) probe(il);
        if (lh->engram_index >= 0) { /* §4.6: before the block */
            const uint32_t j = (uint32_t)lh->engram_index, CK_ = eh->n_cols * eh->key_length;
            if (overlapped) { /* the rows this op reads: the helper's job j */
                DSII_PROF_BEGIN();
                s = dsii_engram_async_wait(v->async, j, e);
                DSII_PROF_END("Engram rows (wait for the overlapped gather)");
                if (s != DSI_OK) return s;
            }
            CK(o->matmul(S, &w->eng_wkv, 0, dsii_lane_io(lane, lane->io_extra + v->io_eng[j]), CK_,
                         SV(&P, v->o_ekv), (hc + 1) * D, n),
               "matmul engram wkv", il_);
            CK(o->engram_gate(S, SV(&P, v->o_X), n, hc, D, SV(&P, v->o_ekv), (hc + 1) * D,
                              &w->eng_q, &w->eng_k, hp->rms_eps),
               "engram_gate", il_);
        }
        if (taps) { /* §4.5: main_hidden_i = mean over the HC streams of layer i's input */
            for (uint32_t k = 0; k < hp->dspark.n_target; k++)
                if (hp->dspark.target_layer_ids[k] == il) {
                    s = tap_mean(&P, SV(&P, v->o_taps + (uint64_t)k * D * 4),
                                 hp->dspark.n_target * D, e);
                    if (s != DSI_OK) return s;
                }
        }
        /* attention sublayer: mixes from X, input from the previous sublayer's pre (§4.2) */
        CK(o->hc_mix(S, SV(&P, v->o_X), n, hc, D, &w->hc_attn_fn, &w->hc_attn_scale,
                     &w->hc_attn_base, hp->rms_eps, hp->hc_eps, hp->hc_sinkhorn_iters,
                     DSIB_HC_BLOCK, SV(&P, v->o_ca), M),
           "hc_mix attn", il_);
        if (il == 0) /* make_identity_pre_mix: one-hot stream 0 */
            CK(dsii_op_copy_rows(P.dev, S, SV(&P, v->o_X), hc * D, SV(&P, v->o_x), D, n, D),
               "copy_rows", il_);
        else
            CK(o->hc_collapse(S, SV(&P, v->o_X), SV(&P, v->o_cf), M, SV(&P, v->o_x), D, n, hc, D),
               "hc_collapse attn", il_);
        CK(o->rms_norm(S, SV(&P, v->o_x), D, SV(&P, v->o_xn), D, n, D, &w->attn_norm, hp->rms_eps),
           "attn_norm", il_);
        s = attention(&P, il, e);
        if (s != DSI_OK) return s;
        CK(o->hc_post(S, SV(&P, v->o_aout), D, SV(&P, v->o_X), SV(&P, v->o_ca), M, SV(&P, v->o_X),
                      n, hc, D),
           "hc_post attn", il_);
        /* FFN sublayer: mixes from X, input from this block's attention pre */
        CK(o->hc_mix(S, SV(&P, v->o_X), n, hc, D, &w->hc_ffn_fn, &w->hc_ffn_scale,
                     &w->hc_ffn_base, hp->rms_eps, hp->hc_eps, hp->hc_sinkhorn_iters,
                     DSIB_HC_BLOCK, SV(&P, v->o_cf), M),
           "hc_mix ffn", il_);
        CK(o->hc_collapse(S, SV(&P, v->o_X), SV(&P, v->o_ca), M, SV(&P, v->o_x), D, n, hc, D),
           "hc_collapse ffn", il_);
        CK(o->rms_norm(S, SV(&P, v->o_x), D, SV(&P, v->o_xn), D, n, D, &w->ffn_norm, hp->rms_eps),
           "ffn_norm", il_);
        dsii_moe_scratch ms = {SV(&P, v->o_lg), SV(&P, v->o_sel), SV(&P, v->o_wts),
                               SV(&P, v->o_mout), SV(&P, v->o_shg), SV(&P, v->o_shu),
                               SV(&P, v->o_sh), lane->cancel};
        s = dsii_moe_forward(P.dev, S, &w->moe, &ms, SV(&P, v->o_xn), D,
                             dsii_lane_io(lane, lane->io_ids), n, D, SV(&P, v->o_aout), D, e);
        if (s != DSI_OK) return s;
        CK(o->hc_post(S, SV(&P, v->o_aout), D, SV(&P, v->o_X), SV(&P, v->o_cf), M, SV(&P, v->o_X),
                      n, hc, D),
           "hc_post ffn", il_);
    }
    if (taps) {
        s = dspark_seed(&P, e);
        if (s != DSI_OK) return s;
    }
    if (sh->n_out == 0) return DSI_OK;
    /* §4.1: collapse with the last layer's FFN pre mix (no HC head), norm, head (f32), for
     * the output rows in one pass, logits into the io block */
    const uint32_t no = sh->n_out;
    dsib_view oi = dsii_lane_io(lane, lane->io_out);
    CK(o->gather_rows(S, SV(&P, v->o_X), hc * D, oi, SV(&P, v->o_Xo), hc * D, no, hc * D),
       "head rows", -1);
    CK(o->gather_rows(S, SV(&P, v->o_cf), M, oi, SV(&P, v->o_Co), M, no, M), "head coef", -1);
    CK(o->hc_collapse(S, SV(&P, v->o_Xo), SV(&P, v->o_Co), M, SV(&P, v->o_x), D, no, hc, D),
       "hc_collapse out", -1);
    CK(o->rms_norm(S, SV(&P, v->o_x), D, SV(&P, v->o_xn), D, no, D, &am->out_norm, hp->rms_eps),
       "output_norm", -1);
    CK(o->matmul(S, &am->output, 0, SV(&P, v->o_xn), D, dsii_lane_io(lane, lane->io_logits),
                 hp->n_vocab, no),
       "matmul output", -1);
    return DSI_OK;
}

/* The step: with an overlapped gather pending (prepare()), hands the gathers of every Engram
 * layer to the lane's helper first, records (runs, on the CPU) the layers — each Engram layer
 * waits for its rows — and finishes the batch before returning, whatever happened. A failed
 * gather is the step's error even when an op failed earlier (e.g. an expert read of a
 * layer before the first Engram layer): the first failing layer's message, as when the
 * gathers ran before the step. */
static dsi_status v41_record(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                             const dsii_step_shape *sh, dsii_error *e) {
    v41_lane *v = lane->priv;
    if (!v->pending || !v->async) return record_step(am, lane, pool, sh, 0, e);
    const dsii_engram_hparams *eh = &am->hp->engram;
    const uint32_t C = eh->n_cols;
    dsii_engram_job jobs[DSII_ENGRAM_ASYNC_MAX];
    for (uint32_t j = 0; j < eh->n_layer; j++) {
        jobs[j].t = &am->etab[j];
        jobs[j].rows = v->erows + (size_t)j * lane->max_rows * C;
        jobs[j].n = (size_t)v->pending_rows * C;
        jobs[j].dst = (float *)(void *)(lane->io_host + lane->io_extra + v->io_eng[j]);
        jobs[j].cancel = lane->cancel; /* a cancel stops the reads, as it does expert reads */
    }
    v->pending = 0;
    if (v->pending_rows != sh->n)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: %u Engram rows prepared, step of %u",
                         v->pending_rows, sh->n);
    /* engram.h DSII_ENGRAM_INLINE_NS: the budget a gather on the step thread may take */
    const uint32_t inline_ns = atomic_load_explicit(&dsii_engram_inline_ns_test, memory_order_relaxed);
    const uint64_t floor_ns = inline_ns ? inline_ns : DSII_ENGRAM_INLINE_NS;
    const uint64_t budget = v->last_step_ns / 32 > floor_ns ? v->last_step_ns / 32 : floor_ns;
    const uint64_t t0 = dsii_time_ns();
    if (v->gather_inline) {
        /* the rows came fast (page cache, row cache): gather here, then the step; a slow
         * gather sends the next steps back to the overlap */
        DSII_PROF_BEGIN();
        dsi_status gs = DSI_OK;
        for (uint32_t j = 0; j < eh->n_layer && gs == DSI_OK; j++)
            gs = dsii_engram_gather_c(am->m->ctx, jobs[j].t, jobs[j].rows, jobs[j].n, jobs[j].dst,
                                      jobs[j].cancel, e);
        DSII_PROF_END("Engram rows (gathered on the step thread)");
        if (gs != DSI_OK || dsii_time_ns() - t0 > budget) {
            v->gather_inline = 0;
            v->fast_batches = 0;
        }
        if (gs != DSI_OK) return gs;
        dsi_status s = record_step(am, lane, pool, sh, 0, e);
        v->last_step_ns = dsii_time_ns() - t0;
        return s;
    }
    dsii_engram_async_start(v->async, am->m->ctx, jobs, eh->n_layer);
    dsi_status s = record_step(am, lane, pool, sh, 1, e);
    dsii_error ge;
    dsi_status gs = dsii_engram_async_finish(v->async, &ge);
    v->last_step_ns = dsii_time_ns() - t0;
    if (gs != DSI_OK) {
        v->fast_batches = 0;
        return dsii_fail(e, gs, "%s", ge.msg);
    }
    if (dsii_engram_async_last_ns(v->async) > budget)
        v->fast_batches = 0;
    else if (++v->fast_batches >= DSII_ENGRAM_INLINE_AFTER)
        v->gather_inline = 1;
    return s;
}

/* §4.5 drafting: draft_ids = [next, noise × (B−1)] at positions p+1 .. p+B (p = the last
 * evaluated position), X = embed repeated over the streams, pre_mix one-hot, the stages in
 * order (lagged mHC, DSparkAttention, MoE), then y = Σ pre_mix[h] X[h] and
 * logits = head(RMSNorm(y, norm)) for all B rows. The Markov bias and the confidence head
 * are applied sequentially by lib/spec (they depend on the drafted ids). */
static dsi_status v41_draft(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                            dsii_draft_io *io, dsii_error *e) {
    const dsii_hparams *hp = am->hp;
    const v41_lane *v = lane->priv;
    const uint32_t B = hp->dspark.block_size, D = hp->n_embd, hc = hp->hc_mult;
    const uint32_t M = DSIB_HC_COEF(hc);
    if (!am->n_stage || !(lane->flags & DSII_LANE_TAPS) || lane->max_rows < 2 * B ||
        lane->max_out < B || io->n_tokens == 0 || io->n_tokens + B > lane->n_ctx)
        return dsii_fail(e, DSI_ERR_INTERNAL, "deepseek41: draft: bad lane or position");
    const uint32_t p = io->n_tokens - 1;
    int32_t *R = (int32_t *)(void *)(lane->io_host + lane->io_rows);
    int32_t *ids = (int32_t *)(void *)(lane->io_host + lane->io_ids);
    for (uint32_t t = 0; t < B; t++) {
        int32_t *r = R + (size_t)t * DSIB_ROW_WORDS, *a = R + (size_t)(B + t) * DSIB_ROW_WORDS;
        r[DSIB_ROW_POS] = (int32_t)(p + 1 + t);
        a[DSIB_ROW_POS] = (int32_t)(p + B);
        r[DSIB_ROW_SLOT] = a[DSIB_ROW_SLOT] = (int32_t)io->slot;
        r[DSIB_ROW_FIRST] = 0;
        r[DSIB_ROW_COUNT] = (int32_t)B;
        a[DSIB_ROW_FIRST] = (int32_t)t; /* each attention row its own one-row sequence */
        a[DSIB_ROW_COUNT] = 1;
        ids[t] = t == 0 ? io->next : hp->dspark.noise_token;
    }
    const dsib_backend *be = am->dev->be;
    dsib_error be_err = {{0}};
    dsii_kv_pool_lock(pool);
    v41_step P = {am, hp, am->dev, be->ops, lane->stream, lane, v, pool,
                  dsii_lane_io(lane, lane->io_rows), B, 0};
    dsii_arch_params pp;
    dsii_exec_pool_params(pool, &pp);
    if (pp.flags & DSI_SESSION_FLAG_NO_FAKE_QUANT) P.fq = DSIB_FQ_NO_ROUND;
    const dsib_ops *o = P.o;
    dsib_stream *S = P.S;
    dsib_view arows = dsii_lane_io(lane, lane->io_rows + (uint64_t)B * DSIB_ROW_WORDS * 4);
    dsi_status s = DSI_OK;
#define DK(expr, what)                                                                      \
    do {                                                                                    \
        s = (expr);                                                                         \
        if (s != DSI_OK) { s = be_fail(e, s, what, -1); goto out; }                         \
    } while (0)
    DK(o->get_rows(S, &am->tok_embd, dsii_lane_io(lane, lane->io_ids), SV(&P, v->o_e), D, B), "get_rows");
    DK(o->hc_expand(S, SV(&P, v->o_e), D, SV(&P, v->o_X), B, hc, D), "hc_expand");
    for (uint32_t st = 0; st < am->n_stage; st++) {
        const v41_lw *w = &am->dl[st];
        DK(o->hc_mix(S, SV(&P, v->o_X), B, hc, D, &w->hc_attn_fn, &w->hc_attn_scale,
                     &w->hc_attn_base, hp->rms_eps, hp->hc_eps, hp->hc_sinkhorn_iters,
                     DSIB_HC_BLOCK, SV(&P, v->o_ca), M), "hc_mix attn");
        if (st == 0) /* pre_mix = one-hot stream 0 */
            DK(dsii_op_copy_rows(P.dev, S, SV(&P, v->o_X), hc * D, SV(&P, v->o_x), D, B, D), "copy_rows");
        else
            DK(o->hc_collapse(S, SV(&P, v->o_X), SV(&P, v->o_cf), M, SV(&P, v->o_x), D, B, hc, D),
               "hc_collapse attn");
        DK(o->rms_norm(S, SV(&P, v->o_x), D, SV(&P, v->o_xn), D, B, D, &w->attn_norm, hp->rms_eps),
           "attn_norm");
        s = dspark_attention(&P, st, arows, e);
        if (s != DSI_OK) goto out;
        DK(o->hc_post(S, SV(&P, v->o_aout), D, SV(&P, v->o_X), SV(&P, v->o_ca), M, SV(&P, v->o_X),
                      B, hc, D), "hc_post attn");
        DK(o->hc_mix(S, SV(&P, v->o_X), B, hc, D, &w->hc_ffn_fn, &w->hc_ffn_scale, &w->hc_ffn_base,
                     hp->rms_eps, hp->hc_eps, hp->hc_sinkhorn_iters, DSIB_HC_BLOCK, SV(&P, v->o_cf), M),
           "hc_mix ffn");
        DK(o->hc_collapse(S, SV(&P, v->o_X), SV(&P, v->o_ca), M, SV(&P, v->o_x), D, B, hc, D),
           "hc_collapse ffn");
        DK(o->rms_norm(S, SV(&P, v->o_x), D, SV(&P, v->o_xn), D, B, D, &w->ffn_norm, hp->rms_eps),
           "ffn_norm");
        dsii_moe_scratch ms = {SV(&P, v->o_lg), SV(&P, v->o_sel), SV(&P, v->o_wts),
                               SV(&P, v->o_mout), SV(&P, v->o_shg), SV(&P, v->o_shu),
                               SV(&P, v->o_sh), lane->cancel};
        s = dsii_moe_forward(P.dev, S, &w->moe, &ms, SV(&P, v->o_xn), D,
                             dsii_lane_io(lane, lane->io_ids), B, D, SV(&P, v->o_aout), D, e);
        if (s != DSI_OK) goto out;
        DK(o->hc_post(S, SV(&P, v->o_aout), D, SV(&P, v->o_X), SV(&P, v->o_cf), M, SV(&P, v->o_X),
                      B, hc, D), "hc_post ffn");
    }
    DK(o->hc_collapse(S, SV(&P, v->o_X), SV(&P, v->o_cf), M, SV(&P, v->o_x), D, B, hc, D), "head collapse");
    DK(dsii_op_copy_rows(P.dev, S, SV(&P, v->o_x), D, dsii_lane_io(lane, lane->io_spec), D, B, D), "y rows");
    DK(o->rms_norm(S, SV(&P, v->o_x), D, SV(&P, v->o_xn), D, B, D, &am->draft_norm, hp->rms_eps),
       "draft norm");
    DK(o->matmul(S, &am->output, 0, SV(&P, v->o_xn), D, dsii_lane_io(lane, lane->io_logits),
                 hp->n_vocab, B), "matmul output");
#undef DK
out:
    {
        dsi_status ss = be->sync(lane->stream, &be_err);
        if (s == DSI_OK && ss != DSI_OK)
            s = dsii_fail(e, ss, "%s: draft step failed: %s", am->dev->name, be_err.msg);
    }
    dsii_kv_pool_unlock(pool);
    if (s != DSI_OK) return s;
    io->n_rows = B;
    io->logits = (const float *)(const void *)(lane->io_host + lane->io_logits);
    io->hidden = (const float *)(const void *)(lane->io_host + lane->io_spec);
    return DSI_OK;
}

static uint32_t v41_draft_rows(const dsii_arch_model *am) {
    return am->n_stage ? am->hp->dspark.block_size : 0;
}

const dsii_arch dsii_arch_dsv41 = {
    .name = "deepseek41",
    .model_create = v41_model_create,
    .model_free = v41_model_free,
    .state_layout = v41_state_layout,
    .lane_init = v41_lane_init,
    .lane_fini = v41_lane_fini,
    .prepare = v41_prepare,
    .record = v41_record,
    .draft = v41_draft,
    .draft_rows = v41_draft_rows,
};
