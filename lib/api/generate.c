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
    for (;;) {
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
        st = dsii_sampler_sample(smp, s->logits, s->n_vocab, &t, &e);
        if (st != DSI_OK) {
            smp->last_error = e;
            st = dsii_session_fail(s, e.status, "%s", e.msg);
            deliver_rest = 0;
            break;
        }
        if (t == eos) { r.n_generated++; r.finish_reason = DSI_FINISH_EOS; break; }
        int is_stop = 0;
        for (size_t k = 0; k < o.n_stop_tokens; k++) is_stop |= o.stop_tokens[k] == t;
        if (is_stop) { r.n_generated++; r.finish_reason = DSI_FINISH_STOP_TOKEN; break; }

        /* Evaluate first, deliver second: a token reaches on_token only once it is part of
         * the session, so a cancelled call leaves exactly the delivered tokens behind. */
        st = dsii_session_append_nc(s, &t, 1);
        if (st == DSI_ERR_CANCELLED) {
            r.finish_reason = DSI_FINISH_CANCELLED;
            deliver_rest = 0;
            break;
        }
        if (st == DSI_ERR_CONTEXT_FULL) { st = DSI_OK; r.finish_reason = DSI_FINISH_CONTEXT_FULL; break; }
        if (st != DSI_OK) { deliver_rest = 0; break; }
        r.n_generated++;

        if (tok && (o.on_token || o.n_stop_strings)) {
            size_t bl;
            const uint8_t *bp = dsii_tokenizer_token_bytes(tok, t, &bl);
            size_t need = dsii_utf8_stream_bound(&utf8, bl);
            if (need > piece_cap) {
                uint8_t *np = dsii_realloc(s->ctx, piece, need);
                if (!np) { st = dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_generate: out of memory"); deliver_rest = 0; break; }
                piece = np;
                piece_cap = need;
            }
            dsii_utf8_stream next;
            size_t pn = dsii_utf8_stream_push(&utf8, bp ? bp : (const uint8_t *)"", bp ? bl : 0, piece, &next);
            utf8 = next;
            if (!gbuf_add(&text, piece, pn)) { st = dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_generate: out of memory"); deliver_rest = 0; break; }
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
                int32_t go = o.on_token(t, text.p ? text.p : "", emit, o.user_data);
                if (!go && !stop_now) { stop_now = 1; r.finish_reason = DSI_FINISH_CALLBACK; }
            }
            if (r.finish_reason == DSI_FINISH_STOP_STRING) {
                text.n = 0; /* the stop string and anything after it are dropped */
                deliver_rest = 0;
            } else {
                gbuf_drop_front(&text, emit);
            }
            if (stop_now) break;
        }
    }
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
