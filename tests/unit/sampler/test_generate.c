/*
 * dsi_session_generate on the build's tiny models: finish reasons, stop tokens / strings
 * across token boundaries, callback stop, prompt reuse, and cancellation from another
 * thread followed by a continuation that must equal an uninterrupted greedy run.
 * Exits 77 (skip, tests/common/skip.h) only when no tiny model was built (DSI_MODELS_DIR);
 * a model that does not load or run a session is a failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsinfer.h"
#include "tests/common/skip.h"

#define N_GEN 16
static char model_path[4096];
static dsi_context *ctx;
static dsi_model *model;
static dsi_token prompt[64];
static size_t n_prompt;
static dsi_token ref[N_GEN];   /* uninterrupted greedy continuation */
static size_t n_ref;

typedef struct {
    dsi_token tok[256];
    size_t n;
    char text[4096];
    size_t tn;
    int stop_after;            /* return 0 after this many tokens (0 = never) */
    /* cancellation handshake */
    int cancel_at;             /* ask the canceller at this many tokens (0 = never) */
    dsi_session *session;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int asked, done;
} collect;

static int32_t on_token(dsi_token t, const char *text, size_t len, void *user) {
    collect *c = user;
    if (t >= 0) c->tok[c->n++] = t;
    memcpy(c->text + c->tn, text, len);
    c->tn += len;
    c->text[c->tn] = 0;
    if (c->cancel_at && t >= 0 && (int)c->n == c->cancel_at) {
        pthread_mutex_lock(&c->mu);
        c->asked = 1;
        pthread_cond_broadcast(&c->cv);
        while (!c->done) pthread_cond_wait(&c->cv, &c->mu); /* the cancel has been issued */
        pthread_mutex_unlock(&c->mu);
    }
    if (c->stop_after && (int)c->n >= c->stop_after) return 0;
    return 1;
}

static void *canceller(void *arg) {
    collect *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->asked) pthread_cond_wait(&c->cv, &c->mu);
    dsi_session_cancel(c->session);
    c->done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static dsi_sampler *greedy(void) {
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    o.temperature = 0.0f;
    dsi_sampler *s = NULL;
    assert_int_equal(dsi_sampler_create(&o, &s), DSI_OK);
    return s;
}

static dsi_session *new_session(void) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 256;
    so.n_batch = 8; /* several prefill chunks */
    dsi_session *s = NULL;
    assert_int_equal(dsi_session_create(model, &so, &s), DSI_OK);
    return s;
}

static int run_gen(dsi_session *s, dsi_generate_options *go, collect *c, dsi_generate_result *r) {
    go->on_token = on_token;
    go->user_data = c;
    dsi_generate_result_init(r);
    dsi_sampler *smp = greedy();
    dsi_status st = dsi_session_generate(s, smp, go, r);
    dsi_sampler_free(smp);
    return st;
}

static void test_uninterrupted_and_reasons(void **state) {
    (void)state;
    dsi_session *s = new_session();
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = N_GEN;
    static collect c;
    memset(&c, 0, sizeof c);
    dsi_generate_result r;
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(r.n_prompt, n_prompt);
    assert_int_equal(r.n_reused, 0);
    assert_true(r.finish_reason == DSI_FINISH_LENGTH || r.finish_reason == DSI_FINISH_EOS);
    assert_true(r.prefill_ms >= 0 && r.decode_ms >= 0);
    memcpy(ref, c.tok, c.n * sizeof *ref);
    n_ref = c.n;
    assert_true(n_ref >= 4);
    uint32_t pos;
    assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
    assert_int_equal(pos, n_prompt + n_ref);
    /* the callback text is the detokenized stream */
    char text[4096];
    size_t tl;
    assert_int_equal(dsi_detokenize(model, ref, n_ref, text, sizeof text, &tl), DSI_OK);
    /* (valid UTF-8 in the tiny vocab's output is not guaranteed: compare only when equal
     * lengths, i.e. no U+FFFD substitution happened) */
    if (tl == c.tn) assert_memory_equal(text, c.text, tl);

    /* the same prompt again: everything reused, same tokens */
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = 3;
    memset(&c, 0, sizeof c);
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    /* the timeline holds prompt + generated; the last prompt token is re-evaluated for its
     * logits unless the session kept them, so n-1 or n tokens are reused */
    assert_true(r.n_reused + 1 >= n_prompt && r.n_reused <= n_prompt);
    assert_int_equal(r.finish_reason, DSI_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 3);
    assert_memory_equal(c.tok, ref, 3 * sizeof *ref);

    /* a stop token: the 3rd reference token ends the call, unseen by the callback */
    dsi_token stop = ref[2];
    size_t first = 0;
    while (ref[first] != stop) first++;
    go.max_tokens = N_GEN;
    go.stop_tokens = &stop;
    go.n_stop_tokens = 1;
    memset(&c, 0, sizeof c);
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(r.finish_reason, DSI_FINISH_STOP_TOKEN);
    assert_int_equal(c.n, first);
    assert_int_equal(r.n_generated, first + 1);
    go.stop_tokens = NULL;
    go.n_stop_tokens = 0;

    /* callback stop after 2 tokens */
    memset(&c, 0, sizeof c);
    c.stop_after = 2;
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(r.finish_reason, DSI_FINISH_CALLBACK);
    assert_int_equal(c.n, 2);
    assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
    assert_int_equal(pos, n_prompt + 2);

    /* max_tokens 0: only the prompt */
    go.max_tokens = 0;
    memset(&c, 0, sizeof c);
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(r.finish_reason, DSI_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 0);
    dsi_session_free(s);
}

static void test_stop_string(void **state) {
    (void)state;
    /* a stop string spanning the boundary between two reference tokens (the last byte of one,
     * the first of the next): the first boundary past the first token where both bytes are
     * ASCII (a multi-byte character would be cut by a two-byte stop string) */
    char stop[8] = "";
    for (size_t k = 1; k + 1 < n_ref && !stop[0]; k++) {
        char b1[64], b2[64];
        size_t l1, l2;
        assert_int_equal(dsi_token_to_bytes(model, ref[k], b1, sizeof b1, &l1), DSI_OK);
        assert_int_equal(dsi_token_to_bytes(model, ref[k + 1], b2, sizeof b2, &l2), DSI_OK);
        if (l1 && l2 && b1[l1 - 1] > 0 && b2[0] > 0) { /* char: ASCII is 1..127 */
            stop[0] = b1[l1 - 1];
            stop[1] = b2[0];
            stop[2] = 0;
        }
    }
    if (!stop[0]) fail_msg("no ASCII token boundary in the %zu reference tokens", n_ref);
    char all[4096];
    size_t al;
    assert_int_equal(dsi_detokenize(model, ref, n_ref, all, sizeof all, &al), DSI_OK);
    all[al] = 0;
    size_t at = (size_t)(strstr(all, stop) - all);
    dsi_session *s = new_session();
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = N_GEN;
    const char *stops[1] = {stop};
    go.stop_strings = stops;
    go.n_stop_strings = 1;
    static collect c;
    memset(&c, 0, sizeof c);
    dsi_generate_result r;
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(r.finish_reason, DSI_FINISH_STOP_STRING);
    assert_int_equal(c.tn, at);                /* text up to, not including, the stop */
    assert_memory_equal(c.text, all, at);
    dsi_session_free(s);
}

static void test_cancel_and_continue(void **state) {
    (void)state;
    for (int k = 1; k <= 3; k++) {
        dsi_session *s = new_session();
        static collect c;
        memset(&c, 0, sizeof c);
        pthread_mutex_init(&c.mu, NULL);
        pthread_cond_init(&c.cv, NULL);
        c.cancel_at = k;
        c.session = s;
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, canceller, &c), 0);
        dsi_generate_options go;
        dsi_generate_options_init(&go);
        go.prompt = prompt;
        go.n_prompt = n_prompt;
        go.max_tokens = (int32_t)n_ref;
        dsi_generate_result r;
        dsi_status st = run_gen(s, &go, &c, &r);
        pthread_join(th, NULL);
        assert_int_equal(st, DSI_ERR_CANCELLED);
        assert_int_equal(r.finish_reason, DSI_FINISH_CANCELLED);
        assert_int_equal(c.n, (size_t)k);
        assert_true(strlen(dsi_session_last_error(s)) > 0);
        uint32_t pos;
        assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
        assert_int_equal(pos, n_prompt + (size_t)k);
        /* continue without a prompt: the same tokens as the uninterrupted run */
        static collect c2;
        memset(&c2, 0, sizeof c2);
        dsi_generate_options_init(&go);
        go.max_tokens = (int32_t)(n_ref - (size_t)k);
        assert_int_equal(run_gen(s, &go, &c2, &r), DSI_OK);
        assert_int_equal(c.n + c2.n, n_ref);
        assert_memory_equal(c.tok, ref, c.n * sizeof *ref);
        assert_memory_equal(c2.tok, ref + c.n, c2.n * sizeof *ref);
        pthread_mutex_destroy(&c.mu);
        pthread_cond_destroy(&c.cv);
        dsi_session_free(s);
    }
}

static void test_cancel_before_prefill(void **state) {
    (void)state;
    /* a cancel issued before the call is sticky (docs/api.md "Cancellation"): the next call
     * returns CANCELLED before changing the session and consumes it */
    dsi_session *s = new_session();
    dsi_session_cancel(s);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = 2;
    static collect c;
    memset(&c, 0, sizeof c);
    dsi_generate_result r;
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_ERR_CANCELLED);
    assert_int_equal(r.finish_reason, DSI_FINISH_CANCELLED);
    assert_int_equal(c.n, 0);
    uint32_t pos = 1;
    assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
    assert_int_equal(pos, 0);
    memset(&c, 0, sizeof c);
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(c.n, 2);
    /* a request withdrawn with dsi_session_cancel_clear cancels nothing */
    dsi_session_cancel(s);
    dsi_session_cancel_clear(s);
    memset(&c, 0, sizeof c);
    assert_int_equal(run_gen(s, &go, &c, &r), DSI_OK);
    assert_int_equal(c.n, 2);
    dsi_session_free(s);
}

static void test_generate_errors(void **state) {
    (void)state;
    dsi_session *s = new_session();
    dsi_sampler *smp = greedy();
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    /* nothing evaluated and no prompt */
    assert_int_equal(dsi_session_generate(s, smp, &go, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_true(strlen(dsi_session_last_error(s)) > 0);
    assert_int_equal(dsi_session_generate(s, NULL, &go, NULL), DSI_ERR_INVALID_ARGUMENT);
    go.max_tokens = -1;
    assert_int_equal(dsi_session_generate(s, smp, &go, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_session_last_error(s), "max_tokens"));
    dsi_generate_options_init(&go);
    go.n_prompt = 3;
    assert_int_equal(dsi_session_generate(s, smp, &go, NULL), DSI_ERR_INVALID_ARGUMENT);
    dsi_generate_options_init(&go);
    const char *bad[1] = {""};
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.stop_strings = bad;
    go.n_stop_strings = 1;
    assert_int_equal(dsi_session_generate(s, smp, &go, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_session_last_error(s), "stop_strings[0]"));
    dsi_generate_options_init(&go);
    go.struct_size = 2;
    assert_int_equal(dsi_session_generate(s, smp, &go, NULL), DSI_ERR_INVALID_ARGUMENT);
    /* a smaller (older) result struct gets only its fields */
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = 1;
    struct { dsi_generate_result r; uint32_t guard; } small;
    memset(&small, 0xAB, sizeof small);
    small.r.struct_size = (uint32_t)offsetof(dsi_generate_result, n_reused);
    assert_int_equal(dsi_session_generate(s, smp, &go, &small.r), DSI_OK);
    assert_int_equal(small.r.finish_reason, DSI_FINISH_LENGTH);
    assert_int_equal(small.r.n_prompt, n_prompt);
    const unsigned char *tail = (const unsigned char *)&small.r + offsetof(dsi_generate_result, n_reused);
    assert_int_equal(tail[0], 0xAB);
    dsi_sampler_free(smp);
    dsi_session_free(s);
}

/* The first tiny model the build wrote: 1 when it runs a session; 0 when none was built;
 * -1 when one does not load or run (a failure). */
static int open_model(void) {
    const char *dir = getenv("DSI_MODELS_DIR");
    static const char *const names[2] = {"tiny-v41.gguf", "tiny-v4.gguf"};
    if (dsi_context_create(NULL, &ctx) != DSI_OK) return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(model_path, sizeof model_path, "%s/%s", dir ? dir : "models", names[i]);
        if (access(model_path, R_OK) != 0) {
            printf("note: %s not built (dsinfer-mkmodel writes it)\n", model_path);
            continue;
        }
        if (dsi_model_load(ctx, model_path, NULL, &model) != DSI_OK) {
            printf("FAIL: cannot load %s: %s\n", model_path, dsi_last_error());
            return -1;
        }
        dsi_session *s = NULL;
        dsi_session_options so;
        dsi_session_options_init(&so);
        so.n_ctx = 64;
        dsi_token one = 1;
        if (dsi_session_create(model, &so, &s) == DSI_OK && dsi_session_append(s, &one, 1) == DSI_OK) {
            dsi_session_free(s);
            printf("using %s\n", model_path);
            return 1;
        }
        printf("FAIL: a session does not run on %s: %s\n", model_path,
               s ? dsi_session_last_error(s) : dsi_last_error());
        dsi_session_free(s);
        return -1;
    }
    return 0;
}

int main(void) {
    int om = open_model();
    if (om <= 0) {
        dsi_model_free(model);
        dsi_context_free(ctx);
        return om < 0 ? 1 : dsit_absent("MODELS", "no tiny model in $DSI_MODELS_DIR");
    }
    const char *text = "The quick brown fox jumps over the lazy dog.";
    if (dsi_tokenize(model, text, strlen(text), DSI_TOKENIZE_ADD_BOS, prompt, 64, &n_prompt) != DSI_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uninterrupted_and_reasons),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_cancel_and_continue),
        cmocka_unit_test(test_cancel_before_prefill),
        cmocka_unit_test(test_generate_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dsi_model_free(model);
    dsi_context_free(ctx);
    return rc;
}
