/*
 * lib/spec — drafting for speculative decoding (spec.h; model-spec §3.7, §4.5).
 */
#include "spec/spec.h"

#include "model/model.h"
#include "quant/quant.h"

#include <math.h>
#include <string.h>

struct dsii_spec {
    const dsi_context *ctx;
    dsii_exec *ex;
    uint32_t block;              /* rows of one draft call */
    int dspark;
    uint32_t V, D, rank;
    float *membd;                /* DSpark Markov embedding [V][rank] */
    float *mhead;                /* DSpark Markov head [V][rank] */
    float *conf;                 /* DSpark confidence [D + rank] */
    float *row;                  /* [V] scratch */
    uint32_t mtp_valid;          /* V4: MTP ring rows valid for positions < mtp_valid */
    dsii_spec_oracle_fn oracle;  /* test hook */
    void *oracle_user;
};

void dsii_spec_set_oracle(dsii_spec *sp, dsii_spec_oracle_fn fn, void *user) {
    if (!sp) return;
    sp->oracle = fn;
    sp->oracle_user = user;
}

/* Host f32 copy of a (resident) tensor's rows. */
static dsi_status host_rows(const dsi_context *ctx, const dsii_tensor *t, uint64_t rows,
                            uint64_t cols, float **out, dsii_error *e) {
    *out = NULL;
    if (!t || !t->data || t->lazy || (uint64_t)t->ne[0] != cols || (uint64_t)t->ne[1] != rows)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "speculative decoding: tensor %s missing or of an unexpected shape",
                         t && t->name ? t->name : "(draft head)");
    float *p = dsii_malloc(ctx, (size_t)(rows * cols) * sizeof(float));
    if (!p) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "speculative decoding: out of host memory");
    for (uint64_t r = 0; r < rows; r++) {
        dsi_status st = dsii_dequantize_row(t->type, (const uint8_t *)t->data + r * t->row_stride,
                                            p + r * cols, (int64_t)cols, e);
        if (st != DSI_OK) {
            dsii_free(ctx, p);
            return st;
        }
    }
    *out = p;
    return DSI_OK;
}

void dsii_spec_free(dsii_spec *sp) {
    if (!sp) return;
    const dsi_context *ctx = sp->ctx;
    dsii_free(ctx, sp->membd);
    dsii_free(ctx, sp->mhead);
    dsii_free(ctx, sp->conf);
    dsii_free(ctx, sp->row);
    dsii_free(ctx, sp);
}

dsi_status dsii_spec_create(dsi_model *m, dsii_spec **out, dsii_error *e) {
    *out = NULL;
    dsii_exec *ex = m->exec;
    if (!ex || !ex->am || !ex->arch->draft || !ex->arch->draft_rows ||
        ex->arch->draft_rows(ex->am) == 0)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED,
                         "speculative decoding: the model has no usable draft blocks (V4 MTP / V4.1 DSpark)");
    dsii_spec *sp = dsii_calloc(m->ctx, 1, sizeof *sp);
    if (!sp) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "speculative decoding: out of host memory");
    sp->ctx = m->ctx;
    sp->ex = ex;
    sp->block = ex->arch->draft_rows(ex->am);
    sp->V = m->hp.n_vocab;
    sp->D = m->hp.n_embd;
    sp->dspark = m->hp.has_dspark;
    dsi_status st = DSI_OK;
    sp->row = dsii_malloc(m->ctx, (size_t)sp->V * sizeof(float));
    if (!sp->row) st = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "speculative decoding: out of host memory");
    if (st == DSI_OK && sp->dspark) {
        /* §4.5 last stage: markov_head.embed / .head [rank, V], confidence [D + rank, 1] */
        const dsii_draft_tensors *d = &m->w.draft[m->hp.n_draft - 1];
        sp->rank = m->hp.dspark.markov_rank;
        st = host_rows(m->ctx, d->markov_embd, sp->V, sp->rank, &sp->membd, e);
        if (st == DSI_OK) st = host_rows(m->ctx, d->markov_head, sp->V, sp->rank, &sp->mhead, e);
        if (st == DSI_OK) st = host_rows(m->ctx, d->confidence, 1, (uint64_t)sp->D + sp->rank, &sp->conf, e);
    }
    if (st != DSI_OK) {
        dsii_spec_free(sp);
        return st;
    }
    *out = sp;
    return DSI_OK;
}

uint32_t dsii_spec_block(const dsii_spec *sp) { return sp ? sp->block : 0; }

void dsii_spec_rewound(dsii_spec *sp, uint32_t keep) {
    if (!sp) return;
    /* MTP row q pairs X_main[q] with tokens[q+1]: valid while q + 1 < keep */
    uint32_t lim = keep > 0 ? keep - 1 : 0;
    if (sp->mtp_valid > lim) sp->mtp_valid = lim;
}

/* Index of the largest value (lowest index on ties, NaN never wins). */
static int32_t argmax(const float *v, uint32_t n) {
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best] || (v[best] != v[best] && v[i] == v[i])) best = (int32_t)i;
    return best;
}

dsi_status dsii_spec_propose(dsii_spec *sp, dsii_lane *lane, dsii_kv_pool *pool, uint32_t slot,
                             const dsi_token *tokens, uint32_t n_tokens, dsi_token next,
                             uint32_t kmax, float conf_min, dsi_token *ids, float *logits,
                             float *conf, uint32_t *k, dsii_error *e) {
    *k = 0;
    if (kmax == 0) return DSI_OK;
    if (kmax > sp->block) kmax = sp->block;
    dsii_draft_io io;
    memset(&io, 0, sizeof io);
    io.tokens = tokens;
    io.n_tokens = n_tokens;
    io.slot = slot;
    io.next = next;
    io.mtp_valid = &sp->mtp_valid;
    dsi_status st = sp->ex->arch->draft(sp->ex->am, lane, pool, &io, e);
    if (st != DSI_OK) return st;
    const uint32_t V = sp->V, D = sp->D, r = sp->rank;
    if (!sp->dspark) { /* V4 MTP: one greedy draft */
        ids[0] = argmax(io.logits, V);
        if (logits) memcpy(logits, io.logits, sizeof(float) * V);
        if (conf) conf[0] = 1.0f;
        *k = 1;
        if (sp->oracle) sp->oracle(sp->oracle_user, tokens, n_tokens, next, ids, k, kmax);
        return DSI_OK;
    }
    /* §4.5: logits[i] += markov_head · markov_embed[out_ids[i]] sequentially (out_ids[0] =
     * next, out_ids[i+1] = the draft of slot i); conf_i = proj · concat(y_i, markov_embed_i) */
    dsi_token prev = next;
    uint32_t n = 0;
    for (uint32_t i = 0; i < kmax && i < io.n_rows; i++) {
        const float *me = sp->membd + (size_t)prev * r;
        const float *y = io.hidden + (size_t)i * D;
        double c = 0;
        for (uint32_t j = 0; j < D; j++) c += (double)sp->conf[j] * y[j];
        for (uint32_t j = 0; j < r; j++) c += (double)sp->conf[D + j] * me[j];
        float cf = (float)(1.0 / (1.0 + exp(-c)));
        if (conf_min > 0.0f && cf < conf_min) break;
        const float *base = io.logits + (size_t)i * V;
        for (uint32_t v = 0; v < V; v++) {
            const float *h = sp->mhead + (size_t)v * r;
            float b = 0.0f;
            for (uint32_t j = 0; j < r; j++) b += h[j] * me[j];
            sp->row[v] = base[v] + b;
        }
        ids[i] = argmax(sp->row, V);
        if (logits) memcpy(logits + (size_t)i * V, sp->row, sizeof(float) * V);
        if (conf) conf[i] = cf;
        prev = ids[i];
        n++;
    }
    *k = n;
    if (sp->oracle) sp->oracle(sp->oracle_user, tokens, n_tokens, next, ids, k, kmax);
    return DSI_OK;
}
