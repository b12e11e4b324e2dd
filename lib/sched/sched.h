/*
 * lib/sched — forms steps from sequences that are ready to run (docs/internals.md
 * "Scheduler").
 *
 * A sequence (dsii_seq, embedded in a session) is a slot in a state pool plus the lane its
 * own steps run on. Three ways to run it:
 *   - alone: dsii_sched_eval on its own lane (the default);
 *   - coalesced: when the model was loaded with coalescing on, dsii_sched_eval hands the
 *     rows to the model's scheduler, and concurrent calls from other threads (other
 *     sessions of the same model) are merged into shared steps. No thread is started: the
 *     first waiting caller runs a step for everything queued for its pool (flat combining),
 *     the others wait and get their logits; cancellation is checked per request before a
 *     step takes it, so a cancelled session never enters a shared step;
 *   - explicitly batched: dsii_sched_step runs one step over given sequences of one pool
 *     (the experimental dsi_session_append_batch).
 * Shared steps run on a per-pool batch lane; results are bit-identical to running alone
 * (arch.h, "Determinism").
 */
#ifndef DSI_SCHED_H
#define DSI_SCHED_H

#include "arch/arch.h"
#include "base/base.h"

#include <stdatomic.h>
#include <stdint.h>

typedef struct dsii_seq {
    dsii_exec *ex;
    dsii_kv_pool *pool;
    uint32_t slot;
    uint32_t n_batch;            /* rows of one of its own steps */
    dsii_lane *lane;             /* its own steps */
    const dsi_token *tokens;     /* its timeline */
    atomic_int *cancel;          /* nonzero: stop before the next step */
    int32_t own_steps;           /* 1: never coalesced */
    int32_t taps;                /* 1: its steps feed the draft blocks (lib/spec): its own lane
                                    is a DSII_LANE_TAPS lane, and shared steps that carry it
                                    run on the pool's tapped batch lane */
} dsii_seq;

typedef struct dsii_sched dsii_sched;

/* Experimental model flag (dsinfer.h DSI_MODEL_FLAG_COALESCE), defined here too so the
 * core builds without the experimental section. */
#define DSII_MODEL_FLAG_COALESCE (1u << 0)

/* Rows of a shared step and sequences per shared step (batch lanes). */
#define DSII_SCHED_ROWS 256u
#define DSII_SCHED_SEQS 64u

/* Turns coalescing on for a model (idempotent). */
dsi_status dsii_sched_enable(dsii_exec *ex, dsii_error *e);
void dsii_sched_free(dsii_sched *s);

/* Evaluates rows [pos, pos+n) of `q` (n <= q->n_batch; all-logits: n <= its lane's max_out)
 * and writes the requested logits to dst. Alone or coalesced (see above). CANCELLED (state
 * untouched) when the sequence was cancelled before its rows entered a step. */
dsi_status dsii_sched_eval(dsii_seq *q, uint32_t pos, uint32_t n, int32_t which, float *dst,
                           dsii_error *e);

/* One step over `n_seqs` sequences of `pool` (rows and outputs may exceed one batch lane:
 * the call then runs several steps). taps: one of them speculates (its rows must feed the
 * draft blocks' rings: the pool's tapped batch lane is used). */
dsi_status dsii_sched_step(dsii_exec *ex, dsii_kv_pool *pool, const dsii_seq_step *seqs,
                           uint32_t n_seqs, int taps, dsii_error *e);

/* Counters of the model's scheduler (tests, bench): shared steps run and the rows they
 * carried. Zeros when coalescing is off. */
void dsii_sched_stats(const dsii_exec *ex, uint64_t *steps, uint64_t *rows);

#endif /* DSI_SCHED_H */
