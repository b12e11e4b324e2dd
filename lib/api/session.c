/*
 * Public session functions (include/dsinfer.h "Session") and the internal hooks of
 * session_impl.h. The session owns the token timeline, prefill chunking, cancellation and
 * the last logits; the per-architecture state and the forward pass are lib/arch/.
 *
 * Mutating calls validate every argument before touching anything, so INVALID_ARGUMENT and
 * CONTEXT_FULL leave the session exactly as it was. Rewinds (sync to a shorter or diverging
 * timeline) are exact when they go back at most the architecture's rewind limit (its ring
 * margin, arch.h); otherwise the state is rebuilt by re-evaluating the kept prefix.
 */
#include "api/session_impl.h"
#include "base/context_impl.h"
#include "model/model.h"
#include "quant/statepack.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DSII_SESSION_DEFAULT_CTX 4096u
#define DSII_SESSION_DEFAULT_BATCH 256u

dsi_status dsii_session_fail(dsi_session *s, dsi_status st, const char *fmt, ...) {
    char msg[DSII_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s) dsii_fail(&s->last_error, st, "%s", msg);
    dsii_set_thread_error(msg);
    return st;
}

static dsi_status session_fail_e(dsi_session *s, const dsii_error *e) {
    s->last_error = *e;
    dsii_set_thread_error(e->msg);
    return e->status;
}

DSI_API void dsi_session_options_init(dsi_session_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
}

DSI_API dsi_status dsi_session_create(dsi_model *model, const dsi_session_options *user_opt,
                                      dsi_session **out) {
    dsii_error e;
    dsii_error_clear(&e);
    if (out) *out = NULL;
    if (!model || !out)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_create: %s is NULL",
                                !model ? "model" : "out");
    dsi_session_options opt;
    dsi_session_options_init(&opt);
    if (dsii_read_options(&opt, sizeof opt, user_opt, "dsi_session_options", &e) != DSI_OK)
        return dsii_thread_fail(e.status, "%s", e.msg);
    if (opt.flags & ~(uint32_t)(DSI_SESSION_FLAG_NO_FAKE_QUANT | DSII_SESSION_FLAG_NO_CAPTURE |
                                DSII_SESSION_FLAG_F32_STATE))
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_options.flags has unknown bits 0x%x", opt.flags);
    if (opt.spec > DSII_SPEC_AUTO)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_options.spec = %u: expected DSI_SPEC_OFF (0), DSI_SPEC_ON (1) or DSI_SPEC_AUTO (2)",
                                opt.spec);
    if (!(opt.draft_confidence >= 0.0f && opt.draft_confidence <= 1.0f))
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_options.draft_confidence = %g: must be within [0, 1]",
                                (double)opt.draft_confidence);
    if (opt.draft_max > 16)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_options.draft_max = %u: at most 16", opt.draft_max);
    if (opt.spec_reserved != 0)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_options.spec_reserved must be 0");
    if (opt.spec == DSII_SPEC_OFF && (opt.draft_max != 0 || opt.draft_confidence != 0.0f))
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_options.%s is set but spec is DSI_SPEC_OFF",
                                opt.draft_max ? "draft_max" : "draft_confidence");
    const dsii_hparams *hp = &model->hp;
    uint32_t train = hp->n_ctx_train ? hp->n_ctx_train : DSII_SESSION_DEFAULT_CTX;
    uint32_t n_ctx = opt.n_ctx ? opt.n_ctx
                               : (train < DSII_SESSION_DEFAULT_CTX ? train : DSII_SESSION_DEFAULT_CTX);
    if (n_ctx > train)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_options.n_ctx %u exceeds the trained context %u",
                                n_ctx, train);
    uint32_t n_batch = opt.n_batch ? opt.n_batch : DSII_SESSION_DEFAULT_BATCH;
    if (n_batch > n_ctx) n_batch = n_ctx;
    if (!dsii_arch_for_model(model))
        return dsii_thread_fail(DSI_ERR_UNSUPPORTED,
                                "dsi_session_create: no forward pass for this architecture in "
                                "this build");
    dsii_exec *ex = model->exec;
    if (!ex || !ex->am)
        return dsii_thread_fail(DSI_ERR_UNSUPPORTED,
                                "dsi_session_create: backend '%s' cannot run this model "
                                "(it lacks ops or weight types the model needs)",
                                dsi_context_backend(model->ctx));
    const dsi_context *ctx = model->ctx;
    /* speculative decoding: the drafter first (ON fails cleanly without draft blocks) */
    dsii_spec *spec = NULL;
    if (opt.spec != DSII_SPEC_OFF) {
        dsi_status ss = dsii_spec_create(model, &spec, &e);
        if (ss != DSI_OK && (opt.spec == DSII_SPEC_ON || ss != DSI_ERR_UNSUPPORTED))
            return dsii_thread_fail(ss, "dsi_session_create: %s", e.msg);
        dsii_error_clear(&e);
        uint32_t B = dsii_spec_block(spec);
        /* room for a draft block and a verify step before the end of the context */
        if (spec && n_ctx < hp->window + 2 * B + 2) {
            dsii_spec_free(spec);
            if (opt.spec == DSII_SPEC_ON)
                return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                        "dsi_session_options.n_ctx %u is too small for speculative decoding (>= %u)",
                                        n_ctx, hp->window + 2 * B + 2);
            spec = NULL;
        }
    }
    dsi_session *s = dsii_calloc(ctx, 1, sizeof *s);
    if (!s) {
        dsii_spec_free(spec);
        return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    s->spec = spec;
    s->spec_mode = spec ? opt.spec : DSII_SPEC_OFF;
    if (spec) {
        uint32_t B = dsii_spec_block(spec);
        s->draft_max = opt.draft_max && opt.draft_max < B ? opt.draft_max : B;
        s->draft_confidence = opt.draft_confidence;
    }
    s->model = model;
    s->ctx = ctx;
    s->ex = ex;
    s->params.n_ctx = n_ctx;
    s->params.n_batch = n_batch;
    s->params.flags = opt.flags & (DSI_SESSION_FLAG_NO_FAKE_QUANT | DSII_SESSION_FLAG_F32_STATE);
    s->params.rewind_margin = DSII_DEFAULT_MARGIN;
    s->margin = DSII_DEFAULT_MARGIN;
    s->n_vocab = (int32_t)hp->n_vocab;
    atomic_init(&s->cancel, 0);
    dsii_error_clear(&s->last_error);
    s->tokens = dsii_calloc(ctx, n_ctx, sizeof(dsi_token));
    s->logits = dsii_calloc(ctx, hp->n_vocab ? hp->n_vocab : 1, sizeof(float));
    dsi_status st = DSI_OK;
    if (!s->tokens || !s->logits) st = dsii_fail(&e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    s->seq.ex = ex;
    s->seq.n_batch = n_batch;
    s->seq.tokens = s->tokens;
    s->seq.cancel = &s->cancel;
    if (st == DSI_OK) st = dsii_exec_pool(ex, &s->params, &s->seq.pool, &e);
    if (st == DSI_OK) st = dsii_exec_state_check(ex, s->seq.pool, &e);
    if (st != DSI_OK) s->seq.pool = NULL;
    if (st == DSI_OK) st = dsii_kv_pool_acquire(s->seq.pool, &s->seq.slot, &e);
    if (st != DSI_OK) s->seq.pool = NULL;
    if (st == DSI_OK) {
        /* with speculation the lane also runs draft blocks (2 × block rows) and verify steps
         * (up to 1 + 16 rows, every row's logits) */
        uint32_t rows = n_batch;
        if (spec && rows < 2 * DSII_SESSION_MAX_OUT + 2) rows = 2 * DSII_SESSION_MAX_OUT + 2;
        if (rows > n_ctx) rows = n_ctx;
        uint32_t max_out = rows < DSII_SESSION_MAX_OUT + 1 ? rows : DSII_SESSION_MAX_OUT + 1;
        if (!spec && max_out > DSII_SESSION_MAX_OUT) max_out = DSII_SESSION_MAX_OUT;
        uint32_t lf = (opt.flags & DSII_SESSION_FLAG_NO_CAPTURE) ? DSII_LANE_NO_CAPTURE : 0;
        if (spec) lf |= DSII_LANE_TAPS;
        st = dsii_lane_create(ex, rows, max_out, n_ctx, lf, &s->seq.lane, &e);
        /* shared (coalesced, batched) steps that carry it run on a tapped batch lane */
        if (spec) s->seq.taps = 1;
    }
    if (st != DSI_OK) {
        if (s->seq.pool) dsii_kv_pool_release(s->seq.pool, s->seq.slot);
        dsii_spec_free(s->spec);
        dsii_free(ctx, s->tokens);
        dsii_free(ctx, s->logits);
        dsii_free(ctx, s);
        return dsii_thread_fail(st, "%s", e.msg);
    }
    dsii_model_session_acquire(model);
    *out = s;
    return DSI_OK;
}

DSI_API void dsi_session_free(dsi_session *s) {
    if (!s) return;
    const dsi_context *ctx = s->ctx;
    dsii_pcache_free(s);
    dsii_lane_free(s->seq.lane);
    dsii_kv_pool_release(s->seq.pool, s->seq.slot);
    dsii_model_session_release(s->model);
    dsii_spec_free(s->spec);
    dsii_free(ctx, s->tokens);
    dsii_free(ctx, s->logits);
    dsii_free(ctx, s);
}

DSI_API const char *dsi_session_last_error(const dsi_session *s) {
    return s ? s->last_error.msg : "";
}

void dsii_session_begin_call(dsi_session *s) {
    if (s) atomic_store_explicit(&s->cancel, 0, memory_order_release);
}

int dsii_session_cancel_requested(const dsi_session *s) {
    return s && atomic_load_explicit(&((dsi_session *)(uintptr_t)s)->cancel,
                                     memory_order_acquire) != 0;
}

int dsii_session_take_cancel(dsi_session *s) {
    return s && atomic_exchange_explicit(&s->cancel, 0, memory_order_acq_rel) != 0;
}

dsi_status dsii_session_end_call(dsi_session *s, dsi_status st) {
    if (s && st == DSI_ERR_CANCELLED) atomic_store_explicit(&s->cancel, 0, memory_order_release);
    return st;
}

DSI_API void dsi_session_cancel(dsi_session *s) {
    /* Only a lock-free atomic store: async-signal-safe. Sticky until a call honours it. */
    if (s) atomic_store_explicit(&s->cancel, 1, memory_order_release);
}

DSI_API void dsi_session_cancel_clear(dsi_session *s) {
    if (s) atomic_store_explicit(&s->cancel, 0, memory_order_release);
}

/* ---- evaluation ------------------------------------------------------------------------ */

static dsi_status check_tokens(dsi_session *s, const dsi_token *tokens, size_t n,
                               const char *fn) {
    if (!tokens || n == 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "%s: %s", fn,
                                 !tokens ? "tokens is NULL" : "n is 0");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->n_vocab)
            return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT,
                                     "%s: token %d at index %zu is outside the vocabulary (%d)",
                                     fn, tokens[i], i, s->n_vocab);
    return DSI_OK;
}

/* Forgets the whole timeline (the state needs no device work: it is position-addressed). */
static void session_clear(dsi_session *s) {
    s->n_tokens = 0;
    s->has_logits = 0;
    dsii_spec_rewound(s->spec, 0);
    s->exact_from = 0;
}

/* After a failed step that evaluated `n` rows from `pos`: the state before `pos` is intact
 * when the step wrote at most `margin` rows (ring rows it overwrote belong to positions a
 * re-evaluation never reads), so the timeline keeps that prefix; otherwise it is forgotten. */
void dsii_session_step_failed(dsi_session *s, uint32_t pos, uint32_t n) {
    s->n_tokens = n <= s->margin && pos >= s->exact_from ? pos : 0;
    if (s->n_tokens == 0) s->exact_from = 0;
    s->has_logits = 0;
    dsii_spec_rewound(s->spec, s->n_tokens);
}

/* Evaluates s->tokens[s->n_tokens .. end) in chunks of n_batch (all-logits: chunks of at
 * most the lane's output rows). `all` (may be NULL) receives the logits of every evaluated
 * token. Stops before a chunk when cancel is requested. */
static dsi_status eval_to(dsi_session *s, uint32_t end, float *all) {
    dsii_error e;
    dsii_error_clear(&e);
    uint32_t start = s->n_tokens;
    while (s->n_tokens < end) {
        if (dsii_session_take_cancel(s))
            return dsii_session_fail(s, DSI_ERR_CANCELLED,
                                     "cancelled after %u of %u tokens (timeline holds %u)",
                                     s->n_tokens - start, end - start, s->n_tokens);
        /* DSI_MODEL_FLAG_VERIFY_FILE: a truncated / rewritten file is an error here, not a
         * SIGBUS or wrong numbers inside the step (the session is unchanged) */
        if (dsii_model_check_file(s->model, &e) != DSI_OK) return session_fail_e(s, &e);
        uint32_t n = end - s->n_tokens;
        uint32_t cap = all ? s->seq.lane->max_out : s->params.n_batch;
        if (n > cap) n = cap;
        int last = s->n_tokens + n == end;
        int32_t which = all ? DSII_LOGITS_ALL : last ? DSII_LOGITS_LAST : DSII_LOGITS_NONE;
        float *dst = all ? all + (size_t)(s->n_tokens - start) * (size_t)s->n_vocab : s->logits;
        s->has_logits = 0;
        dsi_status st = dsii_sched_eval(&s->seq, s->n_tokens, n, which, dst, &e);
        if (st != DSI_OK) {
            if (st == DSI_ERR_CANCELLED && s->seq.lane->cancelled_in_step) {
                /* stopped inside the step (a long expert read): the step failed, the
                 * request is honoured */
                s->seq.lane->cancelled_in_step = 0;
                dsii_session_step_failed(s, s->n_tokens, n);
                (void)dsii_session_take_cancel(s);
            }
            if (st == DSI_ERR_CANCELLED)
                return dsii_session_fail(s, st, "cancelled after %u of %u tokens (timeline holds %u)",
                                         s->n_tokens - start, end - start, s->n_tokens);
            dsii_session_step_failed(s, s->n_tokens, n);
            return session_fail_e(s, &e);
        }
        s->n_tokens += n;
        if (all && last)
            memcpy(s->logits, dst + (size_t)(n - 1) * (size_t)s->n_vocab,
                   sizeof(float) * (size_t)s->n_vocab);
        if (last) s->has_logits = 1;
    }
    return DSI_OK;
}

/* Truncates the timeline to `keep` tokens, exactly when the state can (within the rewind
 * margin: no device work, the frontier moves), else by forgetting everything (the caller
 * re-evaluates the prefix). Returns the kept length. */
static uint32_t rewind_to(dsi_session *s, uint32_t keep) {
    if (keep >= s->n_tokens) return s->n_tokens;
    uint32_t back = s->n_tokens - keep;
    if (keep > 0 && back <= s->margin && keep >= s->exact_from) {
        s->n_tokens = keep;
        s->has_logits = 0;
        dsii_spec_rewound(s->spec, keep);
        return keep;
    }
    session_clear(s);
    return 0;
}

uint32_t dsii_session_rewind(dsi_session *s, uint32_t keep) { return rewind_to(s, keep); }

dsi_status dsii_session_sync_nc(dsi_session *s, const dsi_token *tokens, size_t n,
                                size_t *n_reused) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_sync: session is NULL");
    dsi_status st = check_tokens(s, tokens, n, "dsi_session_sync");
    if (st != DSI_OK) return st;
    if (n > s->params.n_ctx)
        return dsii_session_fail(s, DSI_ERR_CONTEXT_FULL,
                                 "dsi_session_sync: %zu tokens exceed n_ctx %u", n,
                                 s->params.n_ctx);
    if (dsii_session_take_cancel(s))
        return dsii_session_fail(s, DSI_ERR_CANCELLED, "dsi_session_sync: cancelled before it "
                                 "started (the session is unchanged)");
    /* --- validated; from here on the session may change --- */
    uint32_t c = 0;
    while (c < s->n_tokens && c < n && s->tokens[c] == tokens[c]) c++;
    if (c == n && c == s->n_tokens && s->has_logits) {
        if (n_reused) *n_reused = n;
        return DSI_OK;
    }
    /* the last token must be evaluated to have its logits */
    uint32_t keep = c < n ? c : (uint32_t)n - 1;
    keep = rewind_to(s, keep);
    if (s->pcache) keep = dsii_pcache_restore(s, tokens, (uint32_t)n, keep);
    if (n_reused) *n_reused = keep;
    memcpy(s->tokens + keep, tokens + keep, sizeof(dsi_token) * (n - keep));
    st = eval_to(s, (uint32_t)n, NULL);
    if (st == DSI_OK && s->pcache) dsii_pcache_store(s);
    return st;
}

dsi_status dsii_session_check_append(dsi_session *s, const dsi_token *tokens, size_t n,
                                     const char *fn) {
    dsi_status st = check_tokens(s, tokens, n, fn);
    if (st != DSI_OK) return st;
    if (n > (size_t)(s->params.n_ctx - s->n_tokens))
        return dsii_session_fail(s, DSI_ERR_CONTEXT_FULL, "%s: %u + %zu tokens exceed n_ctx %u",
                                 fn, s->n_tokens, n, s->params.n_ctx);
    return DSI_OK;
}

static dsi_status append_impl(dsi_session *s, const dsi_token *tokens, size_t n, float *all,
                              const char *fn) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
    dsi_status st = dsii_session_check_append(s, tokens, n, fn);
    if (st != DSI_OK) return st;
    if (dsii_session_take_cancel(s))
        return dsii_session_fail(s, DSI_ERR_CANCELLED, "%s: cancelled before it started (the "
                                 "session is unchanged)", fn);
    memcpy(s->tokens + s->n_tokens, tokens, sizeof(dsi_token) * n);
    return eval_to(s, s->n_tokens + (uint32_t)n, all);
}

dsi_status dsii_session_append_nc(dsi_session *s, const dsi_token *tokens, size_t n) {
    return append_impl(s, tokens, n, NULL, "dsi_session_append");
}

dsi_status dsii_session_append_all_logits(dsi_session *s, const dsi_token *tokens, size_t n,
                                          float *all_logits) {
    return append_impl(s, tokens, n, all_logits, "dsii_session_append_all_logits");
}

DSI_API dsi_status dsi_session_sync(dsi_session *s, const dsi_token *tokens, size_t n,
                                    size_t *n_reused) {
    return dsii_session_end_call(s, dsii_session_sync_nc(s, tokens, n, n_reused));
}

DSI_API dsi_status dsi_session_append(dsi_session *s, const dsi_token *tokens, size_t n) {
    return dsii_session_end_call(s, dsii_session_append_nc(s, tokens, n));
}

DSI_API dsi_status dsi_session_logits(dsi_session *s, const float **logits, int32_t *n_vocab) {
    if (!s || !logits)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_logits: %s is NULL",
                                 !s ? "session" : "logits");
    /* not a mutating call: leaves a pending cancel alone (generate.c reads logits between
     * its internal sync/append calls) */
    if (!s->has_logits) {
        *logits = NULL;
        if (n_vocab) *n_vocab = 0;
        return dsii_session_fail(s, DSI_ERR_NOT_FOUND,
                                 "dsi_session_logits: no token has been evaluated since the "
                                 "timeline last changed");
    }
    *logits = s->logits;
    if (n_vocab) *n_vocab = s->n_vocab;
    return DSI_OK;
}

DSI_API dsi_status dsi_session_position(const dsi_session *s, uint32_t *pos) {
    if (!s || !pos)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_position: %s is NULL",
                                !s ? "session" : "pos");
    *pos = s->n_tokens;
    return DSI_OK;
}

DSI_API dsi_status dsi_session_tokens(const dsi_session *s, dsi_token *tokens, size_t cap,
                                      size_t *n_needed) {
    if (!s || !n_needed)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_tokens: %s is NULL",
                                !s ? "session" : "n_needed");
    *n_needed = s->n_tokens;
    if (cap < s->n_tokens) {
        if (s->n_tokens == 0) return DSI_OK;
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_tokens: capacity %zu < %u tokens", cap,
                                s->n_tokens);
    }
    if (s->n_tokens) {
        if (!tokens)
            return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_tokens: tokens is NULL");
        memcpy(tokens, s->tokens, sizeof(dsi_token) * s->n_tokens);
    }
    return DSI_OK;
}

DSI_API dsi_status dsi_session_reset(dsi_session *s) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_reset: session is NULL");
    session_clear(s); /* not a cancellable call: a pending cancel stays pending */
    return DSI_OK;
}

DSI_API dsi_status dsi_session_draft(dsi_session *s, dsi_token next, dsi_token *ids,
                                     float *logits, size_t cap, size_t *n_drafts) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_draft: session is NULL");
    dsii_session_begin_call(s);
    if (!ids || !n_drafts || cap == 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_draft: %s",
                                 !ids ? "ids is NULL" : !n_drafts ? "n_drafts is NULL" : "cap is 0");
    *n_drafts = 0;
    if (next < 0 || next >= s->n_vocab)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_session_draft: token %d is outside the vocabulary (%d)", next,
                                 s->n_vocab);
    if (!s->spec)
        return dsii_session_fail(s, DSI_ERR_UNSUPPORTED,
                                 "dsi_session_draft: the session was created without speculative decoding");
    if (s->n_tokens == 0)
        return dsii_session_fail(s, DSI_ERR_NOT_FOUND, "dsi_session_draft: the session holds no token");
    uint32_t B = dsii_spec_block(s->spec);
    if ((uint64_t)s->n_tokens + B + 1 > s->params.n_ctx)
        return dsii_session_fail(s, DSI_ERR_CONTEXT_FULL,
                                 "dsi_session_draft: %u tokens + a block of %u exceed n_ctx %u",
                                 s->n_tokens, B + 1, s->params.n_ctx);
    uint32_t kmax = cap < B ? (uint32_t)cap : B, k = 0;
    dsii_error e;
    dsii_error_clear(&e);
    dsi_status st = dsii_spec_propose(s->spec, s->seq.lane, s->seq.pool, s->seq.slot, s->tokens,
                                      s->n_tokens, next, kmax, s->draft_confidence, ids, logits,
                                      NULL, &k, &e);
    if (st != DSI_OK) return session_fail_e(s, &e);
    *n_drafts = k;
    return DSI_OK;
}

void dsii_session_state_info(dsi_session *s, dsii_state_info *out) {
    memset(out, 0, sizeof *out);
    if (!s || !s->seq.pool) return;
    const dsii_kv_layout *l = dsii_kv_pool_layout(s->seq.pool);
    for (uint32_t i = 0; i < l->n; i++)
        if (l->c[i].format != DSIB_STATE_F32) out->packed = 1;
    out->bytes_per_token = dsii_kv_bytes_per_token(l);
    out->ring_bytes = dsii_kv_ring_bytes(l);
    out->full_bytes = l->slot_bytes;
    out->pool_bytes = dsii_kv_pool_bytes(s->seq.pool);
    out->pool_host_bytes = dsii_kv_pool_host_bytes(s->seq.pool);
    out->offload = l->offload;
    out->device_full_bytes = dsii_kv_device_slot_bytes(l);
    out->pool_positions = dsii_kv_pool_positions(s->seq.pool);
    dsii_kv_pool_lock(s->seq.pool);
    out->pool_slots = dsii_kv_pool_slots(s->seq.pool);
    out->pool_buffers = dsii_kv_pool_buffers(s->seq.pool);
    dsii_kv_pool_unlock(s->seq.pool);
}

dsi_status dsii_session_fill_synthetic(dsi_session *s, const dsi_token *tok, uint32_t D,
                                       uint64_t seed, dsii_error *e) {
    if (D > s->params.n_ctx || (D && !tok))
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT, "synthetic depth %u > n_ctx %u", D,
                         s->params.n_ctx);
    dsi_status st = dsii_kv_pool_reserve(s->seq.pool, D, e);
    if (st != DSI_OK) return st;
    const dsii_kv_layout *l = dsii_kv_pool_layout(s->seq.pool);
    uint32_t max_ld = 1, max_rb = 4;
    for (uint32_t i = 0; i < l->n; i++) {
        if (l->c[i].ld > max_ld) max_ld = l->c[i].ld;
        if (l->c[i].row_bytes > max_rb) max_rb = l->c[i].row_bytes;
    }
    const uint32_t chunk = 256;
    float *v = dsii_malloc(s->ctx, (size_t)max_ld * sizeof(float));
    uint8_t *rows = dsii_malloc(s->ctx, (size_t)max_rb * chunk);
    if (!v || !rows) st = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint32_t i = 0; st == DSI_OK && i < l->n; i++) {
        const dsii_kv_comp *c = &l->c[i];
        uint32_t n = c->kind == DSII_KV_RING ? c->rows
                     : c->ratio             ? D / c->ratio
                                            : 0;
        for (uint32_t r0 = 0; st == DSI_OK && r0 < n; r0 += chunk) {
            uint32_t k = n - r0 < chunk ? n - r0 : chunk;
            for (uint32_t r = 0; r < k; r++) {
                for (uint32_t j = 0; j < c->ld; j++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    v[j] = (float)((int64_t)(x >> 40) - (1 << 23)) * 0x1p-23f;
                }
                (void)dsii_sp_pack_row(c->format, c->ld, c->qcols, c->block, v,
                                       rows + (size_t)r * c->row_bytes);
            }
            st = dsii_kv_rows_write(s->seq.pool, s->seq.slot, i, r0, k, rows, e);
        }
    }
    dsii_free(s->ctx, v);
    dsii_free(s->ctx, rows);
    if (st != DSI_OK) return st;
    if (D) memcpy(s->tokens, tok, (size_t)D * sizeof(dsi_token));
    s->n_tokens = D;
    s->has_logits = 0;
    s->exact_from = 0; /* every ring row holds a (synthetic) row: rewinds within the margin
                          stay cheap, so the bench can step back to D */
    if (s->spec) dsii_spec_rewound(s->spec, 0);
    return DSI_OK;
}
