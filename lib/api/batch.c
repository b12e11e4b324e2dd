/*
 * dsi_session_append_batch (include/dsinfer.h "Experimental API"): several sessions of one
 * model advanced together in shared steps (lib/sched dsii_sched_step).
 *
 * Every session is validated on its own first (its failures never touch the others);
 * then rounds run until every session consumed its tokens: per round each remaining
 * session contributes its next chunk (at most its n_batch rows, at most the margin so a
 * failed step leaves each timeline at a valid prefix), cancelled sessions drop out before
 * the round, the chunks of sessions that share a state pool run as shared steps.
 */
#include "api/session_impl.h"
#include "base/base.h"
#include "model/model.h"
#include "sched/sched.h"

#include <string.h>

#define DSII_BATCH_MAX 4096u

/* One participant's progress. */
typedef struct part {
    dsi_session *s;
    uint32_t start, end;   /* timeline positions it evaluates: [start, end) */
    int active;
    dsi_status st;
} part;

DSI_API dsi_status dsi_session_append_batch(size_t n, dsi_session *const *sessions,
                                            const dsi_token *const *tokens,
                                            const size_t *n_tokens, dsi_status *status) {
    if (n == 0) return DSI_OK;
    if (!sessions || !tokens || !n_tokens)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_append_batch: %s is NULL",
                                !sessions ? "sessions" : !tokens ? "tokens" : "n_tokens");
    if (n > DSII_BATCH_MAX)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_append_batch: %zu sessions (at most %u)", n,
                                DSII_BATCH_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!sessions[i])
            return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                    "dsi_session_append_batch: sessions[%zu] is NULL", i);
        if (sessions[i]->model != sessions[0]->model)
            return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                    "dsi_session_append_batch: sessions[%zu] belongs to another "
                                    "model than sessions[0]", i);
        for (size_t j = 0; j < i; j++)
            if (sessions[j] == sessions[i])
                return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                        "dsi_session_append_batch: sessions[%zu] and [%zu] are "
                                        "the same session", j, i);
    }
    const dsi_context *ctx = sessions[0]->ctx;
    part *P = dsii_calloc(ctx, n, sizeof *P);
    dsii_seq_step *steps = dsii_calloc(ctx, n, sizeof *steps);
    uint32_t *idx = dsii_calloc(ctx, n, sizeof *idx);
    uint8_t *taken = dsii_calloc(ctx, n, 1);
    if (!P || !steps || !idx || !taken) {
        dsii_free(ctx, P);
        dsii_free(ctx, steps);
        dsii_free(ctx, idx);
        dsii_free(ctx, taken);
        return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_append_batch: out of memory");
    }
    /* per-session validation, exactly as dsi_session_append; nothing changes on failure */
    for (size_t i = 0; i < n; i++) {
        dsi_session *s = sessions[i];
        P[i].s = s;
        P[i].st = dsii_session_check_append(s, tokens[i], n_tokens[i], "dsi_session_append_batch");
        if (P[i].st != DSI_OK) continue;
        /* sticky cancellation (docs/api.md "Cancellation"): a request made before the call
         * cancels this session's part before it changes the session */
        if (dsii_session_take_cancel(s)) {
            P[i].st = dsii_session_fail(s, DSI_ERR_CANCELLED, "dsi_session_append_batch: "
                                        "cancelled before it started (the session is unchanged)");
            continue;
        }
        memcpy(s->tokens + s->n_tokens, tokens[i], sizeof(dsi_token) * n_tokens[i]);
        P[i].start = s->n_tokens;
        P[i].end = s->n_tokens + (uint32_t)n_tokens[i];
        P[i].active = 1;
        s->has_logits = 0;
    }
    for (;;) {
        /* DSI_MODEL_FLAG_VERIFY_FILE: a truncated / rewritten model file fails the remaining
         * sessions with DSI_ERR_IO before the next round (each keeps a valid prefix) */
        dsii_error fe;
        dsii_error_clear(&fe);
        if (dsii_model_check_file(sessions[0]->model, &fe) != DSI_OK) {
            for (size_t i = 0; i < n; i++) {
                if (!P[i].active) continue;
                P[i].s->has_logits = 0;
                P[i].s->last_error = fe;
                P[i].st = fe.status;
                P[i].active = 0;
            }
            dsii_set_thread_error(fe.msg);
            break;
        }
        /* one round: the next chunk of every active session */
        uint32_t nq = 0;
        for (size_t i = 0; i < n; i++) {
            part *p = &P[i];
            if (!p->active) continue;
            dsi_session *s = p->s;
            if (dsii_session_take_cancel(s)) {
                p->st = dsii_session_fail(s, DSI_ERR_CANCELLED,
                                          "dsi_session_append_batch: cancelled after %u of %u "
                                          "tokens (timeline holds %u)",
                                          s->n_tokens - p->start, p->end - p->start, s->n_tokens);
                p->active = 0;
                continue;
            }
            uint32_t k = p->end - s->n_tokens;
            uint32_t cap = s->params.n_batch < s->margin ? s->params.n_batch : s->margin;
            if (cap > DSII_SCHED_ROWS) cap = DSII_SCHED_ROWS;
            if (k > cap) k = cap;
            int last = s->n_tokens + k == p->end;
            steps[nq] = (dsii_seq_step){s->tokens, s->seq.slot, s->n_tokens, k,
                                        last ? DSII_LOGITS_LAST : DSII_LOGITS_NONE,
                                        last ? s->logits : NULL};
            idx[nq++] = (uint32_t)i;
        }
        if (nq == 0) break;
        memset(taken, 0, nq);
        /* shared steps per state pool, in the sessions' order */
        for (uint32_t a = 0; a < nq; a++) {
            if (taken[a]) continue;
            dsii_kv_pool *pool = P[idx[a]].s->seq.pool;
            dsii_seq_step grp[DSII_SCHED_SEQS];
            uint32_t gi[DSII_SCHED_SEQS] = {idx[a]}, ng = 0;
            int taps = 0;
            for (uint32_t b = a; b < nq && ng < DSII_SCHED_SEQS; b++) {
                if (taken[b] || P[idx[b]].s->seq.pool != pool) continue;
                taps |= P[idx[b]].s->seq.taps != 0;
                grp[ng] = steps[b];
                gi[ng++] = idx[b];
                taken[b] = 1;
            }
            dsii_error e;
            dsii_error_clear(&e);
            dsi_status st = dsii_sched_step(P[gi[0]].s->ex, pool, grp, ng, taps, &e);
            for (uint32_t g = 0; g < ng; g++) {
                part *p = &P[gi[g]];
                dsi_session *s = p->s;
                if (st == DSI_OK) {
                    s->n_tokens += grp[g].n;
                    if (s->n_tokens == p->end) {
                        s->has_logits = 1;
                        p->active = 0;
                    }
                } else {
                    dsii_session_step_failed(s, grp[g].pos, grp[g].n);
                    s->last_error = e;
                    dsii_set_thread_error(e.msg);
                    p->st = st;
                    p->active = 0;
                }
            }
        }
    }
    dsi_status ret = DSI_OK;
    for (size_t i = 0; i < n; i++) {
        dsii_session_end_call(P[i].s, P[i].st);
        if (status) status[i] = P[i].st;
        if (ret == DSI_OK && P[i].st != DSI_OK) ret = P[i].st;
    }
    dsii_free(ctx, P);
    dsii_free(ctx, steps);
    dsii_free(ctx, idx);
    dsii_free(ctx, taken);
    return ret;
}
