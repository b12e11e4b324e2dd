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

    atomic_int cancel;           /* set by dsi_session_cancel */
    dsii_error last_error;
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

/* Records `st`/message on the session (and the thread error); returns st. */
dsi_status dsii_session_fail(dsi_session *s, dsi_status st, const char *fmt, ...)
    DSII_PRINTF(3, 4);

#endif /* DSI_SESSION_IMPL_H */
