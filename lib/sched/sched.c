/* lib/sched/sched.c — shared steps of sequences of one model (see sched.h). */
#include "sched/sched.h"

#include "base/context_impl.h"

#include <pthread.h>
#include <string.h>

/* A coalesced request: rows of one sequence waiting for a shared step. */
typedef struct dsii_sched_req {
    dsii_seq *q;
    uint32_t pos, n;
    int32_t which;
    float *dst;
    dsi_status status;
    dsii_error err;
    int done;
    struct dsii_sched_req *next;
} dsii_sched_req;

typedef struct batch_lane {
    dsii_kv_pool *pool;
    int taps;                    /* a DSII_LANE_TAPS lane (steps with speculating sequences) */
    dsii_lane *lane;
    pthread_mutex_t mu;          /* one step at a time on this lane */
} batch_lane;

struct dsii_sched {
    dsii_exec *ex;
    int coalesce;
    pthread_mutex_t mu;          /* queue, busy, lanes list */
    pthread_cond_t cv;
    dsii_sched_req *head, *tail;
    int busy;                    /* a caller is running a shared step */
    batch_lane *lanes[32];
    uint32_t n_lanes;
    uint64_t steps, rows;
};

static dsii_sched *sched_get(dsii_exec *ex, dsii_error *e) {
    pthread_mutex_lock(&ex->lock);
    dsii_sched *s = ex->sched;
    if (!s) {
        s = dsii_calloc(ex->ctx, 1, sizeof *s);
        if (s) {
            s->ex = ex;
            pthread_mutex_init(&s->mu, NULL);
            pthread_cond_init(&s->cv, NULL);
            ex->sched = s;
        }
    }
    pthread_mutex_unlock(&ex->lock);
    if (!s) dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory (scheduler)");
    return s;
}

dsi_status dsii_sched_enable(dsii_exec *ex, dsii_error *e) {
    dsii_sched *s = sched_get(ex, e);
    if (!s) return e->status;
    pthread_mutex_lock(&s->mu);
    s->coalesce = 1;
    pthread_mutex_unlock(&s->mu);
    return DSI_OK;
}

void dsii_sched_free(dsii_sched *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_lanes; i++) {
        dsii_lane_free(s->lanes[i]->lane);
        pthread_mutex_destroy(&s->lanes[i]->mu);
        dsii_free(s->ex->ctx, s->lanes[i]);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    dsii_free(s->ex->ctx, s);
}

void dsii_sched_stats(const dsii_exec *ex, uint64_t *steps, uint64_t *rows) {
    *steps = *rows = 0;
    if (!ex) return;
    pthread_mutex_lock((pthread_mutex_t *)&ex->lock);
    dsii_sched *s = ex->sched;
    pthread_mutex_unlock((pthread_mutex_t *)&ex->lock);
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    *steps = s->steps;
    *rows = s->rows;
    pthread_mutex_unlock(&s->mu);
}

/* The batch lane of a pool (created on first use); `taps`: the lane that also feeds the
 * draft blocks' rings (lib/spec), used for steps that carry a speculating sequence — the
 * taps write only the stepped sequences' own draft-state components, so the other
 * sequences of such a step are unaffected (their rings are just written too). */
static batch_lane *lane_for(dsii_sched *s, dsii_kv_pool *pool, int taps, dsii_error *e) {
    pthread_mutex_lock(&s->mu);
    batch_lane *bl = NULL;
    for (uint32_t i = 0; i < s->n_lanes && !bl; i++)
        if (s->lanes[i]->pool == pool && s->lanes[i]->taps == taps) bl = s->lanes[i];
    if (!bl && s->n_lanes < sizeof s->lanes / sizeof s->lanes[0]) {
        dsii_arch_params pp;
        dsii_exec_pool_params(pool, &pp);
        bl = dsii_calloc(s->ex->ctx, 1, sizeof *bl);
        dsi_status st = bl ? DSI_OK : dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        if (st == DSI_OK)
            st = dsii_lane_create(s->ex, DSII_SCHED_ROWS, DSII_SCHED_SEQS, pp.n_ctx,
                                  taps ? DSII_LANE_TAPS : 0u, &bl->lane, e);
        if (st == DSI_OK) {
            bl->pool = pool;
            bl->taps = taps;
            pthread_mutex_init(&bl->mu, NULL);
            s->lanes[s->n_lanes++] = bl;
        } else {
            dsii_free(s->ex->ctx, bl);
            bl = NULL;
        }
    } else if (!bl) {
        dsii_fail(e, DSI_ERR_UNSUPPORTED, "scheduler: too many state pools");
    }
    pthread_mutex_unlock(&s->mu);
    return bl;
}

static uint32_t out_rows(const dsii_seq_step *q) {
    return q->which == DSII_LOGITS_ALL ? q->n : q->which == DSII_LOGITS_LAST ? 1u : 0u;
}

dsi_status dsii_sched_step(dsii_exec *ex, dsii_kv_pool *pool, const dsii_seq_step *seqs,
                           uint32_t n_seqs, int taps, dsii_error *e) {
    dsii_sched *s = sched_get(ex, e);
    if (!s) return e->status;
    batch_lane *bl = lane_for(s, pool, taps != 0, e);
    if (!bl) return e->status;
    dsi_status st = DSI_OK;
    pthread_mutex_lock(&bl->mu);
    /* greedy: as many whole sequences per step as the lane holds */
    uint32_t i = 0;
    while (st == DSI_OK && i < n_seqs) {
        uint32_t j = i, rows = 0, outs = 0;
        while (j < n_seqs && rows + seqs[j].n <= bl->lane->max_rows &&
               outs + out_rows(&seqs[j]) <= bl->lane->max_out) {
            rows += seqs[j].n;
            outs += out_rows(&seqs[j]);
            j++;
        }
        if (j == i) {
            st = dsii_fail(e, DSI_ERR_INTERNAL, "scheduler: %u rows do not fit a shared step",
                           seqs[i].n);
            break;
        }
        st = dsii_exec_step(bl->lane, pool, seqs + i, j - i, e);
        pthread_mutex_lock(&s->mu);
        s->steps++;
        s->rows += rows;
        pthread_mutex_unlock(&s->mu);
        i = j;
    }
    pthread_mutex_unlock(&bl->mu);
    return st;
}

static int cancelled(const dsii_seq *q) {
    return q->cancel && atomic_load_explicit(q->cancel, memory_order_acquire) != 0;
}

/* Leader: takes every queued request of the first request's pool that fits one shared
 * step (cancelled ones are answered without running), runs it, answers the rest. Called
 * with s->mu held and s->busy set; returns with s->mu held. */
static void lead(dsii_sched *s) {
    dsii_seq_step steps[DSII_SCHED_SEQS];
    dsii_sched_req *taken[DSII_SCHED_SEQS];
    uint32_t nt = 0, rows = 0, outs = 0;
    int taps = 0;
    dsii_kv_pool *pool = NULL;
    dsii_sched_req **pp = &s->head, *last = NULL;
    while (*pp) {
        dsii_sched_req *r = *pp;
        if (cancelled(r->q)) {
            *pp = r->next;
            r->status = dsii_fail(&r->err, DSI_ERR_CANCELLED, "cancelled");
            r->done = 1;
            continue;
        }
        if (!pool) pool = r->q->pool;
        dsii_seq_step q = {r->q->tokens, r->q->slot, r->pos, r->n, r->which, r->dst};
        if (r->q->pool == pool && nt < DSII_SCHED_SEQS && rows + r->n <= DSII_SCHED_ROWS &&
            outs + out_rows(&q) <= DSII_SCHED_SEQS) {
            *pp = r->next;
            taken[nt] = r;
            steps[nt] = q;
            taps |= r->q->taps != 0;
            nt++;
            rows += r->n;
            outs += out_rows(&q);
            continue;
        }
        last = r;
        pp = &r->next;
    }
    s->tail = last;
    if (!s->head) s->tail = NULL;
    if (nt == 0) return;
    pthread_mutex_unlock(&s->mu);
    dsii_error err;
    dsii_error_clear(&err);
    dsi_status st = dsii_sched_step(s->ex, pool, steps, nt, taps, &err);
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < nt; i++) {
        taken[i]->status = st;
        taken[i]->err = err;
        taken[i]->done = 1;
    }
}

dsi_status dsii_sched_eval(dsii_seq *q, uint32_t pos, uint32_t n, int32_t which, float *dst,
                           dsii_error *e) {
    pthread_mutex_lock(&q->ex->lock);
    dsii_sched *s = q->ex->sched;
    pthread_mutex_unlock(&q->ex->lock);
    int coalesce = 0;
    if (s) {
        pthread_mutex_lock(&s->mu);
        coalesce = s->coalesce;
        pthread_mutex_unlock(&s->mu);
    }
    uint32_t outs = which == DSII_LOGITS_ALL ? n : which == DSII_LOGITS_LAST ? 1u : 0u;
    if (!coalesce || q->own_steps || n > DSII_SCHED_ROWS || outs > DSII_SCHED_SEQS) {
        if (cancelled(q)) return dsii_fail(e, DSI_ERR_CANCELLED, "cancelled");
        dsii_seq_step st = {q->tokens, q->slot, pos, n, which, dst};
        q->lane->cancel = q->cancel; /* long waits inside the step honour a cancel */
        return dsii_exec_step(q->lane, q->pool, &st, 1, e);
    }
    dsii_sched_req r;
    memset(&r, 0, sizeof r);
    r.q = q;
    r.pos = pos;
    r.n = n;
    r.which = which;
    r.dst = dst;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = &r;
    else s->head = &r;
    s->tail = &r;
    while (!r.done) {
        if (!s->busy) {
            s->busy = 1;
            lead(s);
            s->busy = 0;
            pthread_cond_broadcast(&s->cv);
        } else {
            pthread_cond_wait(&s->cv, &s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (r.status != DSI_OK && e) *e = r.err;
    return r.status;
}
