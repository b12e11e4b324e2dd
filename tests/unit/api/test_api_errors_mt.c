/*
 * Thread rules of error messages (docs/api.md "Errors and threads"):
 *   - dsi_last_error() is per thread: after a failing call it holds that call's message,
 *     whatever other threads fail meanwhile;
 *   - dsi_context_last_error / dsi_model_last_error may be read while other threads fail
 *     on the same handle: they return a whole message (never a torn one) copied into
 *     storage owned by the calling thread, which no other thread overwrites.
 * Several threads fail concurrently on one context (dsi_model_load of missing paths) and one
 * model (dsi_model_meta_find of missing keys) while readers check every message they see.
 * Run under ThreadSanitizer in CI (the old unlocked writes and shared getter buffers are
 * data races there); the pointer-stability case fails deterministically on the old code.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api_util.h"

#define N_THREADS 3
#define N_ITER 400

static dsi_context *ctx;
static dsi_model *model;
static atomic_int bad; /* malformed messages seen */

/* "cannot open '/nonexistent/dsi-T<t>-<i>.gguf': No such file or directory" */
static int ctx_msg_ok(const char *m) {
    int t, i, n = 0;
    if (sscanf(m, "cannot open '/nonexistent/dsi-T%d-%d.gguf': No such file or directory%n", &t, &i, &n) != 2)
        return 0;
    return m[n] == '\0' && t >= 0 && t < N_THREADS && i >= 0 && i < N_ITER;
}

/* "metadata key 'dsi.T<t>.<i>' not found" */
static int model_msg_ok(const char *m) {
    int t, i, n = 0;
    if (sscanf(m, "metadata key 'dsi.T%d.%d' not found%n", &t, &i, &n) != 2) return 0;
    return m[n] == '\0' && t >= 0 && t < N_THREADS && i >= 0 && i < N_ITER;
}

static void *ctx_failer(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < N_ITER; i++) {
        char path[128], mine[256];
        snprintf(path, sizeof path, "/nonexistent/dsi-T%d-%d.gguf", t, i);
        dsi_model *m = NULL;
        if (dsi_model_load(ctx, path, NULL, &m) != DSI_ERR_IO || m) atomic_fetch_add(&bad, 1);
        /* this thread's own message, whatever the others did since */
        snprintf(mine, sizeof mine, "cannot open '%s': No such file or directory", path);
        if (strcmp(dsi_last_error(), mine) != 0) atomic_fetch_add(&bad, 1);
        /* the context's: somebody's whole message */
        if (!ctx_msg_ok(dsi_context_last_error(ctx))) atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

static void *model_failer(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < N_ITER; i++) {
        char key[64], mine[128];
        snprintf(key, sizeof key, "dsi.T%d.%d", t, i);
        size_t n = 0;
        if (dsi_model_meta_find(model, key, NULL, 0, &n) != DSI_ERR_NOT_FOUND) atomic_fetch_add(&bad, 1);
        snprintf(mine, sizeof mine, "metadata key '%s' not found", key);
        if (strcmp(dsi_last_error(), mine) != 0) atomic_fetch_add(&bad, 1);
        if (!model_msg_ok(dsi_model_last_error(model))) atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

static void run_threads(void *(*fn)(void *)) {
    pthread_t th[N_THREADS];
    atomic_store(&bad, 0);
    for (int t = 0; t < N_THREADS; t++) assert_int_equal(pthread_create(&th[t], NULL, fn, (void *)(intptr_t)t), 0);
    for (int t = 0; t < N_THREADS; t++) pthread_join(th[t], NULL);
    assert_int_equal(atomic_load(&bad), 0);
}

static void test_context_errors_concurrent(void **state) {
    (void)state;
    run_threads(ctx_failer);
}

static void test_model_errors_concurrent(void **state) {
    (void)state;
    run_threads(model_failer);
}

/* A message pointer one thread holds is not rewritten by another thread's failure. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int step;
} handshake;

static void wait_step(handshake *h, int step) {
    pthread_mutex_lock(&h->mu);
    while (h->step < step) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

static void set_step(handshake *h, int step) {
    pthread_mutex_lock(&h->mu);
    h->step = step;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static handshake hs = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void *other_thread(void *arg) {
    (void)arg;
    wait_step(&hs, 1);
    dsi_model *m = NULL;
    (void)dsi_model_load(ctx, "/nonexistent/dsi-T1-1.gguf", NULL, &m);
    size_t n;
    (void)dsi_model_meta_find(model, "dsi.T1.1", NULL, 0, &n);
    set_step(&hs, 2);
    return NULL;
}

static void test_message_pointer_stays_mine(void **state) {
    (void)state;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, NULL), 0);
    dsi_model *m = NULL;
    size_t n;
    assert_int_equal(dsi_model_load(ctx, "/nonexistent/dsi-T0-0.gguf", NULL, &m), DSI_ERR_IO);
    assert_int_equal(dsi_model_meta_find(model, "dsi.T0.0", NULL, 0, &n), DSI_ERR_NOT_FOUND);
    const char *cm = dsi_context_last_error(ctx), *mm = dsi_model_last_error(model);
    const char *tm = dsi_last_error();
    assert_non_null(strstr(cm, "dsi-T0-0"));
    assert_non_null(strstr(mm, "dsi.T0.0"));
    assert_non_null(strstr(tm, "dsi.T0.0"));
    set_step(&hs, 1);
    wait_step(&hs, 2); /* the other thread has failed on both handles */
    pthread_join(th, NULL);
    assert_non_null(strstr(cm, "dsi-T0-0")); /* still this thread's copy */
    assert_non_null(strstr(mm, "dsi.T0.0"));
    assert_non_null(strstr(tm, "dsi.T0.0"));
    /* asking again shows the handles' newest messages */
    assert_non_null(strstr(dsi_context_last_error(ctx), "dsi-T1-1"));
    assert_non_null(strstr(dsi_model_last_error(model), "dsi.T1.1"));
}

int main(void) {
    int open_rc = apiu_open_tiny(1, &ctx, &model, NULL);
    if (open_rc) return open_rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_errors_concurrent),
        cmocka_unit_test(test_model_errors_concurrent),
        cmocka_unit_test(test_message_pointer_stays_mine),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dsi_model_free(model);
    dsi_context_free(ctx);
    return rc;
}
