/*
 * dsi_session_generate (include/dsinfer.h "Generation"): prompt sync, then sample → check
 * stop conditions → stream text → append, one token at a time.
 *
 * Rules (docs/tokenizer.md "Generation"):
 * - Cancellation is sticky (session_impl.h): a request pending when the call starts (after
 *   the argument checks) cancels it before anything changes; one that arrives later is seen
 *   at the next prefill chunk or token. The internal sync / append calls are the *_nc
 *   variants, which check but never clear on their own.
 * - EOS and stop tokens end the call without being appended to the session or passed to
 *   on_token (they count in n_generated). Every other sampled token is first appended
 *   (evaluated), then passed to on_token: a token is delivered iff it is in the session, so
 *   after a cancellation a later call continues exactly after the last delivered token.
 * - Text: token bytes go through an incremental UTF-8 decoder (unfinished characters held
 *   back, invalid bytes → U+FFFD). With stop strings, the longest tail that could still
 *   begin a stop string is held back too; when the text contains a stop string, the text
 *   before it is delivered and generation stops (the stop string is never delivered).
 * - When generation ends for any reason but a stop string or cancellation, the text still
 *   held back is delivered in one last on_token call with token = -1.
 */
#include "base/base.h"
#include "api/session_impl.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "spec/spec.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

DSI_API void dsi_generate_options_init(dsi_generate_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->max_tokens = 256;
}

DSI_API void dsi_generate_result_init(dsi_generate_result *result) {
    if (!result) return;
    memset(result, 0, sizeof *result);
    result->struct_size = sizeof *result;
}

typedef struct {
    const dsi_context *ctx;
    char *p;
    size_t n, cap;
} gbuf;

static int gbuf_add(gbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        char *np = dsii_realloc(b->ctx, b->p, c);
        if (!np) return 0;
        b->p = np;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
    return 1;
}

static void gbuf_drop_front(gbuf *b, size_t n) {
    if (n == 0) return; /* b->p may still be NULL: memmove(NULL, NULL, 0) is undefined */
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
}

/* Earliest occurrence of any stop string in t[0..n): its offset, or SIZE_MAX. */
static size_t find_stop(const char *t, size_t n, const char *const *stops, size_t ns) {
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < ns; k++) {
        size_t l = strlen(stops[k]);
        for (size_t i = 0; i + l <= n && i < best; i++)
            if (memcmp(t + i, stops[k], l) == 0) { best = i; break; }
    }
    return best;
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of some stop string. */
static size_t stop_hold(const char *t, size_t n, const char *const *stops, size_t ns) {
    size_t hold = 0;
    for (size_t k = 0; k < ns; k++) {
        size_t l = strlen(stops[k]);
        size_t m = l - 1 < n ? l - 1 : n;
        for (size_t h = m; h > hold; h--)
            if (memcmp(t + n - h, stops[k], h) == 0) { hold = h; break; }
    }
    return hold;
}

static double ms_since(uint64_t t0) { return (double)(dsii_time_ns() - t0) / 1e6; }

DSI_API dsi_status dsi_session_generate(dsi_session *s, dsi_sampler *smp,
                                        const dsi_generate_options *opt,
                                        dsi_generate_result *result) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_generate: session is NULL");
    if (!smp) return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_generate: sampler is NULL");
    dsii_error e;
    dsii_error_clear(&e);
    dsi_generate_options o;
    dsi_generate_options_init(&o);
    if (dsii_read_options(&o, sizeof o, opt, "dsi_generate_options", &e) != DSI_OK)
        return dsii_session_fail(s, e.status, "%s", e.msg);
    if (result && (result->struct_size < sizeof(uint32_t) || result->struct_size > sizeof *result))
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_generate_result.struct_size = %u (expected 4 .. %zu; use dsi_generate_result_init)",
                                 (unsigned)result->struct_size, sizeof *result);
    if (o.max_tokens < 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.max_tokens = %d: must be >= 0", (int)o.max_tokens);
    if (o.prompt == NULL && o.n_prompt > 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.prompt is NULL but n_prompt is %zu", o.n_prompt);
    if (o.prompt != NULL && o.n_prompt == 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.n_prompt is 0 with a non-NULL prompt");
    if (o.stop_tokens == NULL && o.n_stop_tokens > 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.stop_tokens is NULL but n_stop_tokens is %zu", o.n_stop_tokens);
    if (o.stop_strings == NULL && o.n_stop_strings > 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.stop_strings is NULL but n_stop_strings is %zu", o.n_stop_strings);
    for (size_t k = 0; k < o.n_stop_strings; k++)
        if (!o.stop_strings[k] || !o.stop_strings[k][0])
            return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.stop_strings[%zu] is %s", k,
                                     o.stop_strings[k] ? "empty" : "NULL");
    if (o.flags != 0 || o.reserved != 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_generate_options.%s must be 0",
                                 o.flags ? "flags" : "reserved");
    const dsii_tokenizer *tok = s->model ? s->model->tokenizer : NULL;
    if (!tok && (o.on_token || o.n_stop_strings))
        return dsii_session_fail(s, DSI_ERR_UNSUPPORTED, "dsi_session_generate: the model has no tokenizer (needed for text)");
    const dsi_token eos = tok ? dsii_tokenizer_special(tok, DSI_SPECIAL_EOS) : -1;

    dsi_generate_result r;
    dsi_generate_result_init(&r);
    dsi_status st = DSI_OK;
    gbuf text = {s->ctx, NULL, 0, 0};
    uint8_t *piece = NULL;
    size_t piece_cap = 0;
    dsii_utf8_stream utf8 = {{0}, 0};
    int deliver_rest = 1;

    uint64_t t0 = dsii_time_ns();
    if (dsii_session_take_cancel(s)) {
        st = dsii_session_fail(s, DSI_ERR_CANCELLED, "dsi_session_generate: cancelled before it "
                               "started (the session is unchanged)");
        r.finish_reason = DSI_FINISH_CANCELLED;
        deliver_rest = 0;
        goto out;
    }
    if (o.prompt) {
        size_t reused = 0;
        r.n_prompt = o.n_prompt;
        st = dsii_session_sync_nc(s, o.prompt, o.n_prompt, &reused);
        r.n_reused = reused;
        r.prefill_ms = ms_since(t0);
        if (st == DSI_ERR_CANCELLED) { r.finish_reason = DSI_FINISH_CANCELLED; goto out; }
        if (st != DSI_OK) goto out;
    } else if (!s->has_logits || s->n_tokens == 0) {
        st = dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT,
                               "dsi_session_generate: no prompt given and the session has no logits yet");
        goto out;
    }

    uint64_t t1 = dsii_time_ns();
    /* speculative decoding (lib/spec/spec.h): verify buffers for 1 + draft_max rows */
    const uint32_t kspec = s->spec ? s->draft_max : 0;
    float *allL = NULL;
    dsi_token run[1 + 16];
    dsi_token pending = -1;          /* next token drawn from a residual (rejection) */
    double ema = kspec;              /* accepted drafts per verify step (adaptive length) */
    int spec_on = kspec > 0;
    /* AUTO: speculate only while it is faster, measured in this call (the output does not
     * depend on it: every path is exact). Phases of loop iterations: 0 spec probe (4), 1
     * plain probe (4) — then the faster mode runs: 2 spec run (64) or 3 plain run (64,
     * doubled each time speculation loses again, at most 1024) — 2 → 1 (measure plain
     * again), 3 → 0 (try speculation again). Rates are tokens per nanosecond of whole
     * iterations (draft + verify + acceptance + delivery, or one plain step + delivery). */
    const int autom = spec_on && s->spec_mode == DSII_SPEC_AUTO;
    int aphase = 0, alow = 0;
    uint32_t aleft = 4, aback = 64;
    double a_ns[2] = {0, 0}, a_tok[2] = {0, 0}; /* [0] plain, [1] speculative iterations */
    if (spec_on) {
        allL = dsii_malloc(s->ctx, (size_t)(kspec + 1) * (size_t)s->n_vocab * sizeof(float));
        if (!allL) {
            st = dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_generate: out of memory");
            goto out;
        }
    }
    for (;;) {
        const uint64_t it0 = dsii_time_ns();
        if (r.n_generated >= (uint64_t)o.max_tokens) { r.finish_reason = DSI_FINISH_LENGTH; break; }
        if (dsii_session_take_cancel(s)) {
            st = dsii_session_fail(s, DSI_ERR_CANCELLED, "dsi_session_generate: cancelled after %llu tokens",
                                   (unsigned long long)r.n_generated);
            r.finish_reason = DSI_FINISH_CANCELLED;
            deliver_rest = 0;
            break;
        }
        if (s->n_tokens >= s->params.n_ctx) { r.finish_reason = DSI_FINISH_CONTEXT_FULL; break; }
        dsi_token t;
        if (pending >= 0) {
            t = pending; /* drawn (and added to the sampler's history) by the last rejection */
            pending = -1;
        } else {
            st = dsii_sampler_sample(smp, s->logits, s->n_vocab, &t, &e);
            if (st != DSI_OK) {
                smp->last_error = e;
                st = dsii_session_fail(s, e.status, "%s", e.msg);
                deliver_rest = 0;
                break;
            }
        }
        if (t == eos) { r.n_generated++; r.finish_reason = DSI_FINISH_EOS; break; }
        int is_stop = 0;
        for (size_t k = 0; k < o.n_stop_tokens; k++) is_stop |= o.stop_tokens[k] == t;
        if (is_stop) { r.n_generated++; r.finish_reason = DSI_FINISH_STOP_TOKEN; break; }

        /* Evaluate first, deliver second: a token reaches on_token only once it is part of
         * the session, so a cancelled call leaves exactly the delivered tokens behind. With
         * speculation the step evaluates [t, drafts…] and keeps the accepted prefix. */
        const uint32_t n0 = s->n_tokens;
        uint32_t n_run = 1;
        run[0] = t;
        uint32_t kmax = 0;
        if (spec_on) {
            uint64_t left = (uint64_t)o.max_tokens - r.n_generated - 1; /* after t */
            uint32_t room = s->params.n_ctx - n0;                     /* t + drafts */
            uint32_t B = dsii_spec_block(s->spec);
            uint32_t adapt = (uint32_t)(ema + 1.5);                   /* accepted + 1, rounded */
            kmax = kspec < adapt ? kspec : adapt;
            if (kmax > left) kmax = (uint32_t)left;
            /* the draft block (B positions after t) and the verify rows must fit */
            if ((uint64_t)n0 + 1 + B + 1 > s->params.n_ctx || room < 2) kmax = 0;
            else if (kmax > room - 1) kmax = room - 1;
        }
        uint32_t k = 0;
        dsi_token drafts[16];
        if (kmax > 0) {
            st = dsii_spec_propose(s->spec, s->seq.lane, s->seq.pool, s->seq.slot, s->tokens, n0, t,
                                   kmax, s->draft_confidence, drafts, NULL, NULL, &k, &e);
            if (st != DSI_OK) {
                st = dsii_session_fail(s, e.status, "%s", e.msg);
                deliver_rest = 0;
                break;
            }
        }
        if (k > 0) {
            run[0] = t;
            memcpy(run + 1, drafts, sizeof(dsi_token) * k);
            st = dsii_session_append_all_logits(s, run, k + 1, allL);
        } else {
            st = dsii_session_append_nc(s, &t, 1);
        }
        if (st == DSI_ERR_CANCELLED) {
            r.finish_reason = DSI_FINISH_CANCELLED;
            deliver_rest = 0;
            break;
        }
        if (st == DSI_ERR_CONTEXT_FULL) { st = DSI_OK; r.finish_reason = DSI_FINISH_CONTEXT_FULL; break; }
        if (st != DSI_OK) { deliver_rest = 0; break; }
        if (k > 0) {
            /* exact acceptance, draft by draft: p_i = the sampler's distribution at row i−1 */
            uint32_t a = 0;
            for (uint32_t i = 1; i <= k; i++) {
                const float *p;
                st = dsii_sampler_dist(smp, allL + (size_t)(i - 1) * (size_t)s->n_vocab, s->n_vocab, &p, &e);
                if (st != DSI_OK) break;
                dsi_token d = run[i];
                if (dsii_sampler_accept_draft(smp, p, d)) {
                    dsii_sampler_accept(smp, d);
                    a = i;
                    int ends = d == eos;
                    for (size_t q = 0; q < o.n_stop_tokens; q++) ends |= o.stop_tokens[q] == d;
                    if (ends) break; /* nothing after an end token is part of the output */
                } else {
                    pending = dsii_sampler_draw_residual(smp, p, s->n_vocab, d);
                    break;
                }
            }
            if (st != DSI_OK) {
                smp->last_error = e;
                st = dsii_session_fail(s, e.status, "%s", e.msg);
                dsii_session_rewind(s, n0);
                deliver_rest = 0;
                break;
            }
            r.n_spec_steps++;
            r.n_drafted += k;
            r.n_accepted += a;
            ema = 0.7 * ema + 0.3 * (double)a;
            /* rollback to the accepted prefix: t, d1 .. da (a frontier move, lib/kv) */
            dsii_session_rewind(s, n0 + 1 + a);
            memcpy(s->logits, allL + (size_t)a * (size_t)s->n_vocab, sizeof(float) * (size_t)s->n_vocab);
            s->has_logits = 1;
            n_run = 1 + a;
            if (s->spec_mode == DSII_SPEC_AUTO && r.n_spec_steps >= 8 &&
                (double)r.n_accepted < 0.25 * (double)r.n_spec_steps)
                spec_on = 0, alow = 1; /* drafts rarely accepted: plain decoding for the rest */
        }

        int done = 0;
        for (uint32_t j = 0; j < n_run && !done; j++) {
            dsi_token x = run[j];
            if (j > 0) {
                /* tokens after the first come from the accepted run: same rules as if each
                 * had been sampled on its own */
                if (dsii_session_cancel_requested(s)) {
                    dsii_session_rewind(s, n0 + j);
                    memcpy(s->logits, allL + (size_t)(j - 1) * (size_t)s->n_vocab, sizeof(float) * (size_t)s->n_vocab);
                    s->has_logits = 1;
                    pending = -1;
                    st = dsii_session_fail(s, DSI_ERR_CANCELLED, "dsi_session_generate: cancelled after %llu tokens",
                                           (unsigned long long)r.n_generated);
                    r.finish_reason = DSI_FINISH_CANCELLED;
                    deliver_rest = 0;
                    done = 1;
                    break;
                }
                int ends = x == eos ? DSI_FINISH_EOS : 0;
                for (size_t q = 0; q < o.n_stop_tokens && !ends; q++)
                    if (o.stop_tokens[q] == x) ends = DSI_FINISH_STOP_TOKEN;
                if (ends) {
                    dsii_session_rewind(s, n0 + j); /* end tokens are never appended */
                    memcpy(s->logits, allL + (size_t)(j - 1) * (size_t)s->n_vocab, sizeof(float) * (size_t)s->n_vocab);
                    s->has_logits = 1;
                    pending = -1;
                    r.n_generated++;
                    r.finish_reason = ends;
                    done = 1;
                    break;
                }
            }
            r.n_generated++;
            if (tok && (o.on_token || o.n_stop_strings)) {
                size_t bl;
                const uint8_t *bp = dsii_tokenizer_token_bytes(tok, x, &bl);
                size_t need = dsii_utf8_stream_bound(&utf8, bl);
                if (need > piece_cap) {
                    uint8_t *np = dsii_realloc(s->ctx, piece, need);
                    if (!np) { st = dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_generate: out of memory"); deliver_rest = 0; done = 1; break; }
                    piece = np;
                    piece_cap = need;
                }
                dsii_utf8_stream next;
                size_t pn = dsii_utf8_stream_push(&utf8, bp ? bp : (const uint8_t *)"", bp ? bl : 0, piece, &next);
                utf8 = next;
                if (!gbuf_add(&text, piece, pn)) { st = dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_generate: out of memory"); deliver_rest = 0; done = 1; break; }
                size_t emit = text.n;
                int stop_now = 0;
                size_t at = o.n_stop_strings ? find_stop(text.p, text.n, o.stop_strings, o.n_stop_strings) : SIZE_MAX;
                if (at != SIZE_MAX) {
                    emit = at;
                    stop_now = 1;
                    r.finish_reason = DSI_FINISH_STOP_STRING;
                } else if (o.n_stop_strings) {
                    emit = text.n - stop_hold(text.p, text.n, o.stop_strings, o.n_stop_strings);
                }
                if (o.on_token) {
                    int32_t go = o.on_token(x, text.p ? text.p : "", emit, o.user_data);
                    if (!go && !stop_now) { stop_now = 1; r.finish_reason = DSI_FINISH_CALLBACK; }
                }
                if (r.finish_reason == DSI_FINISH_STOP_STRING) {
                    text.n = 0; /* the stop string and anything after it are dropped */
                    deliver_rest = 0;
                } else {
                    gbuf_drop_front(&text, emit);
                }
                if (stop_now) {
                    if (j + 1 < n_run) { /* the token that stopped stays; the rest go */
                        dsii_session_rewind(s, n0 + j + 1);
                        memcpy(s->logits, allL + (size_t)j * (size_t)s->n_vocab, sizeof(float) * (size_t)s->n_vocab);
                        s->has_logits = 1;
                    }
                    pending = -1;
                    done = 1;
                    break;
                }
            }
        }
        if (done) break;
        if (autom && !alow) {
            const int sp = k > 0;
            a_ns[sp] += (double)(dsii_time_ns() - it0);
            a_tok[sp] += (double)n_run;
            if (--aleft == 0) {
                if (aphase == 0 || aphase == 2) { /* measure plain decoding */
                    aphase = 1, aleft = 4, spec_on = 0;
                    a_ns[0] = a_tok[0] = 0;
                } else if (aphase == 3) { /* try speculation again */
                    aphase = 0, aleft = 4, spec_on = 1;
                    a_ns[1] = a_tok[1] = 0;
                } else { /* the faster mode for the next 64 iterations */
                    const int spec_faster = a_tok[1] > 0 && a_ns[0] > 0 &&
                                            a_tok[1] * a_ns[0] > a_tok[0] * a_ns[1];
                    aphase = spec_faster ? 2 : 3, spec_on = spec_faster;
                    aleft = spec_faster ? 64u : aback;
                    aback = spec_faster ? 64u : aback < 1024u ? 2 * aback : 1024u;
                    if (spec_faster) a_ns[1] = a_tok[1] = 0;
                }
            }
        }
    }
    dsii_free(s->ctx, allL);
    r.decode_ms = ms_since(t1);

    if (deliver_rest && o.on_token) {
        uint8_t tail[3];
        size_t tn = dsii_utf8_stream_flush(&utf8, tail);
        if (gbuf_add(&text, tail, tn) && text.n > 0) (void)o.on_token(-1, text.p, text.n, o.user_data);
    }
out:
    if (result) {
        uint32_t sz = result->struct_size;
        r.struct_size = sz;
        memcpy(result, &r, sz);
    }
    dsii_free(s->ctx, text.p);
    dsii_free(s->ctx, piece);
    return dsii_session_end_call(s, st);
}
