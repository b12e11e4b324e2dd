/*
 * Internal definition of dsi_session (lib/api/session.c) and the hooks generate.c uses.
 *
 * Cancellation (sticky, docs/api.md "Cancellation"): dsi_session_cancel only sets `cancel`
 * (atomic, async-signal-safe) and nothing clears it but the call that honours it:
 * dsii_session_take_cancel() (an atomic exchange) at each check point — after argument
 * checks in sync / append / generate, before each prefill chunk and before each generated
 * token. A request made while no call runs is therefore honoured by the next call, before it
 * changes anything. dsii_session_end_call() drops requests that arrived while a call was
 * already returning DSI_ERR_CANCELLED (one stop, one cancelled call), and
 * dsi_session_cancel_clear() drops a pending request on the application's behalf.
 */
#ifndef DSI_SESSION_IMPL_H
#define DSI_SESSION_IMPL_H

#include "base/base.h"
#include "arch/arch.h"
#include "sched/sched.h"
#include "spec/spec.h"

#include <stdatomic.h>
#include <stdint.h>

struct dsi_session {
    dsi_model *model;
    const dsi_context *ctx;
    dsii_exec *ex;               /* the model's execution side (lib/arch) */
    dsii_seq seq;                /* its slot in a state pool + the lane of its own steps
                                    (lib/sched); seq.tokens = tokens, seq.cancel = &cancel */
    dsii_arch_params params;     /* effective n_ctx, n_batch, flags, rewind margin */
    uint32_t margin;             /* exact-rewind limit of its state (tokens) */
    int32_t n_vocab;

    dsi_token *tokens;           /* timeline, capacity params.n_ctx */
    uint32_t n_tokens;           /* evaluated tokens (state matches tokens[0..n_tokens)) */

    float *logits;               /* n_vocab floats: logits of tokens[n_tokens-1] */
    int32_t has_logits;

    uint32_t exact_from;         /* exact rewinds keep at least this many tokens (0 normally;
                                    after a snapshot restore the rings hold only the
                                    positions the snapshot had, lib/kv/snapshot.h) */
    struct dsii_pcache *pcache;  /* disk prefix cache (lib/api/persist.c), NULL = off */

    atomic_int cancel;           /* set by dsi_session_cancel */
    dsii_error last_error;

    /* speculative decoding (lib/spec; NULL when off) */
    dsii_spec *spec;
    uint32_t spec_mode;          /* DSII_SPEC_* */
    uint32_t draft_max;          /* effective drafts per step (1 .. block) */
    float draft_confidence;
};

/* Rows of the session's own steps, and the rows whose logits one of its steps produces
 * (all-logits evaluation goes in chunks of at most this many rows). */
#define DSII_SESSION_MAX_OUT 16u

/* Experimental session flag (dsinfer.h DSI_SESSION_FLAG_NO_CAPTURE): never capture / replay
 * steps. Defined here too so the core builds without the experimental section. */
#define DSII_SESSION_FLAG_NO_CAPTURE (1u << 16)

/* After a failed step of `n` rows from `pos`: keeps the prefix when the state before `pos`
 * is intact (n <= margin), else forgets the timeline. */
void dsii_session_step_failed(dsi_session *s, uint32_t pos, uint32_t n);

/* The checks of dsi_session_append (tokens in the vocabulary, n > 0, room in the context),
 * recorded on the session; DSI_OK when the append may proceed. */
dsi_status dsii_session_check_append(dsi_session *s, const dsi_token *tokens, size_t n,
                                     const char *fn);

/* Drops a pending cancel request (dsi_session_cancel_clear; tests call it before internal
 * calls). */
void dsii_session_begin_call(dsi_session *s);
/* True while a cancel request is pending (does not consume it). */
int dsii_session_cancel_requested(const dsi_session *s);
/* Consumes a pending cancel request: true if there was one. */
int dsii_session_take_cancel(dsi_session *s);
/* End of a public call: a call that returns DSI_ERR_CANCELLED also absorbs the requests that
 * arrived meanwhile. Returns `st`. */
dsi_status dsii_session_end_call(dsi_session *s, dsi_status st);

/* Non-clearing variants of dsi_session_sync / dsi_session_append (same contracts, errors
 * recorded in s->last_error). */
dsi_status dsii_session_sync_nc(dsi_session *s, const dsi_token *tokens, size_t n,
                                size_t *n_reused);
dsi_status dsii_session_append_nc(dsi_session *s, const dsi_token *tokens, size_t n);

/* Test hook: like append_nc but also copies the logits of EVERY appended token into
 * all_logits (n × n_vocab floats). Chunking follows n_batch as usual. */
dsi_status dsii_session_append_all_logits(dsi_session *s, const dsi_token *tokens, size_t n,
                                          float *all_logits);

/* Truncates the timeline to `keep` tokens (exact within the rewind margin, else forgetting
 * it: the caller re-evaluates); the logits are gone afterwards. Returns the kept length. */
uint32_t dsii_session_rewind(dsi_session *s, uint32_t keep);
/* Disk prefix cache hooks (lib/api/persist.c), called by dsi_session_sync when s->pcache
 * is set. restore: after the in-memory reuse of `keep` tokens, restores the longest cached
 * prefix of tokens[0 .. n−1) longer than keep (the session's timeline becomes that prefix)
 * and returns the new keep. store: saves the prefix at the last chunk boundary of the
 * timeline unless the cache already has it. Failures never fail the sync. */
uint32_t dsii_pcache_restore(dsi_session *s, const dsi_token *tokens, uint32_t n, uint32_t keep);
void dsii_pcache_store(dsi_session *s);
void dsii_pcache_free(dsi_session *s);

/* Records `st`/message on the session (and the thread error); returns st. */
dsi_status dsii_session_fail(dsi_session *s, dsi_status st, const char *fmt, ...)
    DSII_PRINTF(3, 4);

/* The session's state layout and what its pool holds now (tests, dsinfer-bench;
 * docs/internals.md "State layout"). */
typedef struct dsii_state_info {
    int32_t packed;            /* 1: some components store FP8 / FP4 rows */
    double bytes_per_token;    /* row arrays: bytes per position of context (grows) */
    uint64_t ring_bytes;       /* rings: fixed per session */
    uint64_t full_bytes;       /* one slot at n_ctx (what creation checks against the budget) */
    uint64_t pool_bytes;       /* the pool's buffer now (all its slots) */
    uint64_t pool_positions;   /* positions its row arrays hold now */
    uint32_t pool_slots;
    uint32_t pool_buffers;     /* the buffers its components are spread over (lib/kv plan) */
    int32_t offload;           /* 1: its row arrays are in host RAM (lib/arch/exec.c) */
    uint64_t pool_host_bytes;  /* of pool_bytes, those in host RAM */
    uint64_t device_full_bytes; /* of full_bytes, what device memory holds */
} dsii_state_info;
void dsii_session_state_info(dsi_session *s, dsii_state_info *out);

/* dsinfer-bench -d: puts the session at depth D without evaluating: the timeline becomes
 * tok[0 .. D), every state row a prefix of D tokens holds gets pseudo-random values (packed
 * rows on their grids), no logits. The next steps then cost what they cost at depth D (the
 * indexer scans D / ratio rows of varied scores); their numbers mean nothing. */
dsi_status dsii_session_fill_synthetic(dsi_session *s, const dsi_token *tok, uint32_t D,
                                       uint64_t seed, dsii_error *e);

#endif /* DSI_SESSION_IMPL_H */
