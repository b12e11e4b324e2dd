/*
 * dsi_session_generate and cancellation contracts (docs/api.md "Cancellation"):
 *   - a first token that does not complete a UTF-8 character is held back without undefined
 *     behaviour (the old code called memmove(NULL, NULL, 0): an abort under UBSan
 *     no-recover, which the sanitizer stage runs);
 *   - opt == NULL means the defaults;
 *   - cancellation is sticky: a request made while no call runs cancels the next sync /
 *     append / generate before it changes the session, is consumed by it, survives calls
 *     that are not cancellable (reset), and dsi_session_cancel_clear withdraws it; one
 *     request cancels one call, however often it was pressed during that call;
 *   - a "stop button" thread pressing at random moments against a generating thread, and the
 *     documented way to free a session another thread may cancel (run under TSan in CI);
 *   - the library's worker threads block asynchronous signals, so a host's handler that
 *     cancels runs on a host thread (the old pool left them open: checked via /proc).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <time.h>

#include "api_util.h"

static dsi_context *ctx;
static dsi_model *model;
static int32_t n_vocab;
static dsi_token prompt[64];
static size_t n_prompt;

static dsi_session *new_session(uint32_t n_ctx) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = n_ctx;
    so.n_batch = 4;
    dsi_session *s = NULL;
    assert_int_equal(dsi_session_create(model, &so, &s), DSI_OK);
    return s;
}

static dsi_sampler *greedy(const dsi_logit_bias *bias, size_t n_bias) {
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    o.temperature = 0.0f;
    o.logit_bias = bias;
    o.n_logit_bias = n_bias;
    dsi_sampler *smp = NULL;
    assert_int_equal(dsi_sampler_create(&o, &smp), DSI_OK);
    return smp;
}

static uint32_t position(dsi_session *s) {
    uint32_t p = 0;
    assert_int_equal(dsi_session_position(s, &p), DSI_OK);
    return p;
}

/* ---- item 4: the first token is an unfinished UTF-8 character ------------------------ */

typedef struct {
    int calls;
    dsi_token tok[8];
    size_t len[8];
    char text[64];
    size_t tn;
} seen;

static int32_t record(dsi_token t, const char *text, size_t len, void *user) {
    seen *c = user;
    if (c->calls < 8) {
        c->tok[c->calls] = t;
        c->len[c->calls] = len;
    }
    c->calls++;
    if (c->tn + len < sizeof c->text) {
        memcpy(c->text + c->tn, text, len);
        c->tn += len;
    }
    return 1;
}

static void test_first_token_unfinished_utf8(void **state) {
    (void)state;
    dsi_token lead = -1;
    for (dsi_token t = 0; t < n_vocab && lead < 0; t++) {
        char b[16];
        size_t n = 0;
        if (dsi_token_to_bytes(model, t, b, sizeof b, &n) == DSI_OK && n == 1 &&
            (unsigned char)b[0] >= 0xC2 && (unsigned char)b[0] <= 0xF4)
            lead = t;
    }
    if (lead < 0) {
        fail_msg("the tiny model's vocabulary has no single-byte UTF-8 lead token");
    }
    dsi_logit_bias bias = {lead, 1e30f}; /* forces the first (greedy) token */
    dsi_sampler *smp = greedy(&bias, 1);
    dsi_session *s = new_session(64);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = 1;
    go.on_token = record;
    static seen c;
    memset(&c, 0, sizeof c);
    go.user_data = &c;
    assert_int_equal(dsi_session_generate(s, smp, &go, NULL), DSI_OK);
    /* the token arrives with no text (held back), then the flush delivers U+FFFD */
    assert_int_equal(c.calls, 2);
    assert_int_equal(c.tok[0], lead);
    assert_int_equal(c.len[0], 0);
    assert_int_equal(c.tok[1], -1);
    assert_int_equal(c.tn, 3);
    assert_memory_equal(c.text, "\xEF\xBF\xBD", 3);
    dsi_session_free(s);
    dsi_sampler_free(smp);
}

/* ---- item 9: opt == NULL ----------------------------------------------------------------- */

static void test_generate_opt_null(void **state) {
    (void)state;
    dsi_sampler *smp = greedy(NULL, 0);
    dsi_session *s = new_session(64);
    /* no prompt in the defaults: a session without logits is an argument error */
    assert_int_equal(dsi_session_generate(s, smp, NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_session_sync(s, prompt, n_prompt, NULL), DSI_OK);
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    assert_int_equal(dsi_session_generate(s, smp, NULL, &r), DSI_OK);
    assert_true(r.n_generated > 0);
    assert_true(r.finish_reason == DSI_FINISH_CONTEXT_FULL || r.finish_reason == DSI_FINISH_EOS ||
                r.finish_reason == DSI_FINISH_LENGTH);
    assert_true(position(s) > n_prompt);
    dsi_session_free(s);
    dsi_sampler_free(smp);
}

/* ---- item 9: sticky cancellation ------------------------------------------------------- */

static void test_cancel_is_sticky(void **state) {
    (void)state;
    dsi_sampler *smp = greedy(NULL, 0);
    dsi_session *s = new_session(128);
    dsi_token t = prompt[1];
    /* pressed before a sync: the sync is cancelled before it changes anything */
    dsi_session_cancel(s);
    assert_int_equal(dsi_session_sync(s, prompt, n_prompt, NULL), DSI_ERR_CANCELLED);
    assert_int_equal(position(s), 0);
    assert_int_equal(dsi_session_sync(s, prompt, n_prompt, NULL), DSI_OK); /* consumed */
    /* ... an append, likewise; a reset does not consume it */
    dsi_session_cancel(s);
    assert_int_equal(dsi_session_reset(s), DSI_OK);
    assert_int_equal(dsi_session_sync(s, prompt, n_prompt, NULL), DSI_ERR_CANCELLED);
    assert_int_equal(position(s), 0);
    assert_int_equal(dsi_session_sync(s, prompt, n_prompt, NULL), DSI_OK);
    dsi_session_cancel(s);
    const float *lg = NULL;
    assert_int_equal(dsi_session_logits(s, &lg, NULL), DSI_OK); /* not cancellable either */
    assert_int_equal(dsi_session_append(s, &t, 1), DSI_ERR_CANCELLED);
    assert_int_equal(position(s), n_prompt);
    assert_int_equal(dsi_session_append(s, &t, 1), DSI_OK);
    /* ... a generate without a prompt: nothing generated, timeline unchanged */
    dsi_session_cancel(s);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.max_tokens = 4;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    assert_int_equal(dsi_session_generate(s, smp, &go, &r), DSI_ERR_CANCELLED);
    assert_int_equal(r.finish_reason, DSI_FINISH_CANCELLED);
    assert_int_equal(r.n_generated, 0);
    assert_int_equal(position(s), n_prompt + 1);
    assert_int_equal(dsi_session_generate(s, smp, &go, &r), DSI_OK);
    assert_int_equal(r.n_generated, 4);
    /* withdrawn: cancels nothing */
    dsi_session_cancel(s);
    dsi_session_cancel_clear(s);
    assert_int_equal(dsi_session_append(s, &t, 1), DSI_OK);
    dsi_session_cancel_clear(NULL); /* accepted */
    dsi_session_free(s);
    dsi_sampler_free(smp);
}

/* Stop pressed three times during one call: that call is cancelled, the next one runs. */
static int32_t press_thrice(dsi_token t, const char *text, size_t len, void *user) {
    (void)t;
    (void)text;
    (void)len;
    dsi_session *s = user;
    for (int i = 0; i < 3; i++) dsi_session_cancel(s);
    return 1;
}

static void test_one_request_one_cancelled_call(void **state) {
    (void)state;
    dsi_sampler *smp = greedy(NULL, 0);
    dsi_session *s = new_session(128);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = prompt;
    go.n_prompt = n_prompt;
    go.max_tokens = 8;
    go.on_token = press_thrice;
    go.user_data = s;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    assert_int_equal(dsi_session_generate(s, smp, &go, &r), DSI_ERR_CANCELLED);
    assert_int_equal(r.n_generated, 1); /* stopped at the next token */
    go.on_token = NULL;
    go.max_tokens = 2;
    assert_int_equal(dsi_session_generate(s, smp, &go, &r), DSI_OK);
    assert_int_equal(r.n_generated, 2);
    dsi_session_free(s);
    dsi_sampler_free(smp);
}

/* ---- a stop button on another thread; freeing a session another thread may cancel ------ */

typedef struct {
    pthread_mutex_t mu;      /* held around every dsi_session_cancel of the button thread */
    dsi_session *s;          /* published session; NULL once it is being freed */
    atomic_int quit;
    atomic_long presses;
} button;

static void *button_thread(void *arg) {
    button *b = arg;
    uint32_t rng = 99;
    while (!atomic_load(&b->quit)) {
        rng = rng * 1664525u + 1013904223u;
        struct timespec nap = {0, (long)(rng >> 14) * 400}; /* 0 .. ~100 ms */
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&b->mu);
        if (b->s) {
            dsi_session_cancel(b->s);
            atomic_fetch_add(&b->presses, 1);
        }
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

typedef struct {
    dsi_token tok[512];
    size_t n;
} stream;

static int32_t keep(dsi_token t, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    stream *st = user;
    if (t >= 0 && st->n < 512) st->tok[st->n++] = t;
    return 1;
}

static void test_stop_button_thread(void **state) {
    (void)state;
    static button b = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
    dsi_sampler *smp = greedy(NULL, 0);
    dsi_session *s = new_session(256);
    pthread_mutex_lock(&b.mu);
    b.s = s;
    pthread_mutex_unlock(&b.mu);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, button_thread, &b), 0);
    int cancelled = 0, finished = 0;
    for (int round = 0; round < 40; round++) {
        /* a new user request: drop a stop meant for the previous answer, then generate */
        dsi_session_cancel_clear(s);
        static stream st;
        st.n = 0;
        dsi_generate_options go;
        dsi_generate_options_init(&go);
        go.prompt = prompt;
        go.n_prompt = n_prompt;
        go.max_tokens = 6;
        go.on_token = keep;
        go.user_data = &st;
        dsi_generate_result r;
        dsi_generate_result_init(&r);
        dsi_status rc = dsi_session_generate(s, smp, &go, &r);
        assert_true(rc == DSI_OK || rc == DSI_ERR_CANCELLED);
        if (rc == DSI_ERR_CANCELLED) cancelled++;
        else finished++;
        /* whatever happened, the timeline is a prefix of prompt + exactly what was delivered */
        uint32_t pos = position(s);
        size_t n_tok = 0;
        static dsi_token tl[256];
        assert_int_equal(dsi_session_tokens(s, tl, 256, &n_tok), DSI_OK);
        if (pos >= n_prompt) {
            assert_int_equal(pos, n_prompt + st.n);
            assert_memory_equal(tl, prompt, n_prompt * sizeof *prompt);
            assert_memory_equal(tl + n_prompt, st.tok, st.n * sizeof *st.tok);
        } else {
            assert_int_equal(st.n, 0); /* cancelled during the prompt */
            assert_memory_equal(tl, prompt, pos * sizeof *prompt);
        }
    }
    /* the documented way to free a session another thread may cancel: unpublish it under
     * the lock the canceller holds, so no cancel can run during or after the free */
    pthread_mutex_lock(&b.mu);
    b.s = NULL;
    pthread_mutex_unlock(&b.mu);
    dsi_session_free(s);
    atomic_store(&b.quit, 1);
    pthread_join(th, NULL);
    print_message("%d calls finished, %d cancelled, %ld presses\n", finished, cancelled,
                  (long)atomic_load(&b.presses));
    dsi_sampler_free(smp);
}

/* Every thread but this one belongs to the library (its CPU pool) or to a sanitizer's
 * runtime: each blocks SIGINT, SIGTERM and SIGUSR1 (Linux /proc/self/task/<tid>/status
 * "SigBlk"); the pool's workers leave faults such as SIGSEGV deliverable. */
static void test_workers_block_signals(void **state) {
    (void)state;
    DIR *d = opendir("/proc/self/task");
    if (!d) {
        fail_msg("no /proc/self/task (Linux only)");
    }
    int workers = 0, faults_open = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == (int)getpid()) continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* the thread just ended */
        unsigned long long blk = 0;
        int found = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blk) == 1) found = 1;
        fclose(f);
        assert_true(found);
        workers++;
        assert_true(blk & (1ull << (SIGINT - 1)));
        assert_true(blk & (1ull << (SIGTERM - 1)));
        assert_true(blk & (1ull << (SIGUSR1 - 1)));
        faults_open += !(blk & (1ull << (SIGSEGV - 1)));
    }
    closedir(d);
    assert_true(workers >= 1); /* n_threads = 2: one worker besides the caller */
    assert_true(faults_open >= 1);
}

int main(void) {
    int open_rc = apiu_open_tiny(2, &ctx, &model, NULL);
    if (open_rc) return open_rc;
    dsi_model_info info;
    dsi_model_info_init(&info);
    if (dsi_model_get_info(model, &info) != DSI_OK) return 1;
    n_vocab = info.n_vocab;
    const char *text = "The quick brown fox jumps over the lazy dog.";
    if (dsi_tokenize(model, text, strlen(text), DSI_TOKENIZE_ADD_BOS, prompt, 64, &n_prompt) != DSI_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_token_unfinished_utf8),
        cmocka_unit_test(test_generate_opt_null),
        cmocka_unit_test(test_cancel_is_sticky),
        cmocka_unit_test(test_one_request_one_cancelled_call),
        cmocka_unit_test(test_stop_button_thread),
        cmocka_unit_test(test_workers_block_signals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dsi_model_free(model);
    dsi_context_free(ctx);
    return rc;
}
