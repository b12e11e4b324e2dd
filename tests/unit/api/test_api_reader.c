/*
 * The reader-callback contract (docs/api.md "Reader callbacks"; dsinfer.h dsi_reader): with a
 * reader that checks every call, pread_fn is called after the load (Engram rows, read on
 * demand by the threads running sessions — two at once here), never outside [0, size),
 * never after close_fn, and close_fn exactly once (also when the load fails); the dsi_reader
 * struct itself may be overwritten after the load; DSI_MODEL_FLAG_RESIDENT closes the reader
 * before the load returns and never reads again, with the same tokens as the mapped file.
 * Run under ThreadSanitizer in CI. (RESIDENT is new: the old library refused the flag.)
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tests/common/skip.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_util.h"

static const char *model_src;

static void tokens_of(dsi_model *m, dsi_token *t, size_t *n) {
    const char *text = "Readers must be reentrant and outlive their model.";
    if (dsi_tokenize(m, text, strlen(text), DSI_TOKENIZE_ADD_BOS, t, 64, n) != DSI_OK) *n = 0;
}

typedef struct {
    int fd;
    uint64_t size;
    atomic_int loaded;        /* set by the test when the load returned */
    atomic_int closed;        /* close_fn calls */
    atomic_long calls, after_load, bad, in_flight, max_in_flight;
} probe;

static int32_t probe_pread(void *user, void *buf, uint64_t size, uint64_t offset) {
    probe *p = user;
    if (atomic_load(&p->closed) || offset > p->size || size > p->size - offset) atomic_fetch_add(&p->bad, 1);
    long f = atomic_fetch_add(&p->in_flight, 1) + 1;
    long mx = atomic_load(&p->max_in_flight);
    while (f > mx && !atomic_compare_exchange_weak(&p->max_in_flight, &mx, f)) {
    }
    atomic_fetch_add(&p->calls, 1);
    if (atomic_load(&p->loaded)) atomic_fetch_add(&p->after_load, 1);
    uint64_t done = 0;
    while (done < size) {
        ssize_t r = pread(p->fd, (char *)buf + done, (size_t)(size - done), (off_t)(offset + done));
        if (r <= 0) break;
        done += (uint64_t)r;
    }
    atomic_fetch_sub(&p->in_flight, 1);
    return done == size ? 0 : 1;
}

static void probe_close(void *user) {
    probe *p = user;
    atomic_fetch_add(&p->closed, 1);
}

static void probe_open(probe *p) {
    memset(p, 0, sizeof *p);
    p->fd = open(model_src, O_RDONLY);
    assert_true(p->fd >= 0);
    struct stat st;
    assert_int_equal(fstat(p->fd, &st), 0);
    p->size = (uint64_t)st.st_size;
}

static dsi_model *load_probe(dsi_context *ctx, probe *p, uint32_t flags) {
    dsi_reader r; /* copied by the load: garbage afterwards must not matter */
    dsi_reader_init(&r);
    r.size = p->size;
    r.pread_fn = probe_pread;
    r.close_fn = probe_close;
    r.user_data = p;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.flags = flags;
    dsi_model *m = NULL;
    assert_int_equal(dsi_model_load_from_reader(ctx, &r, &mo, &m), DSI_OK);
    atomic_store(&p->loaded, 1);
    memset(&r, 0xA5, sizeof r);
    return m;
}

typedef struct {
    dsi_model *m;
    dsi_token out[8];
    dsi_status st;
} gen_job;

static void *gen_thread(void *arg) {
    gen_job *j = arg;
    dsi_token t[64];
    size_t n = 0;
    tokens_of(j->m, t, &n);
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 96;
    dsi_session *s = NULL;
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    o.temperature = 0.0f;
    dsi_sampler *smp = NULL;
    j->st = dsi_session_create(j->m, &so, &s);
    if (j->st == DSI_OK) j->st = dsi_sampler_create(&o, &smp);
    for (int k = 0; k < 8 && j->st == DSI_OK; k++) {
        const float *lg;
        int32_t nv;
        j->st = k == 0 ? dsi_session_sync(s, t, n, NULL) : dsi_session_append(s, &j->out[k - 1], 1);
        if (j->st == DSI_OK) j->st = dsi_session_logits(s, &lg, &nv);
        if (j->st == DSI_OK) j->st = dsi_sampler_sample(smp, lg, nv, &j->out[k]);
    }
    dsi_sampler_free(smp);
    dsi_session_free(s);
    return NULL;
}

static void run_two_sessions(dsi_model *m, gen_job jobs[2]) {
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].m = m;
        assert_int_equal(pthread_create(&th[i], NULL, gen_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) assert_int_equal(jobs[i].st, DSI_OK);
    assert_memory_equal(jobs[0].out, jobs[1].out, sizeof jobs[0].out);
}

static void test_reader_contract(void **state) {
    (void)state;
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(&co, &ctx), DSI_OK);
    /* reference tokens from the mapped file */
    dsi_model *ref = NULL;
    assert_int_equal(dsi_model_load(ctx, model_src, NULL, &ref), DSI_OK);
    static gen_job want[2], got[2];
    run_two_sessions(ref, want);
    assert_int_equal(dsi_model_free(ref), DSI_OK);

    /* lazy: the reader is used after the load, by the sessions' threads */
    static probe p;
    probe_open(&p);
    dsi_model *m = load_probe(ctx, &p, 0);
    assert_int_equal(atomic_load(&p.closed), 0);
    long at_load = atomic_load(&p.calls);
    assert_true(at_load > 0);
    run_two_sessions(m, got);
    assert_memory_equal(got[0].out, want[0].out, sizeof want[0].out);
    assert_true(atomic_load(&p.after_load) > 0); /* Engram rows, read on demand */
    print_message("reader: %ld calls during the load, %ld after it, at most %ld at once\n", at_load,
                  (long)atomic_load(&p.after_load), (long)atomic_load(&p.max_in_flight));
    assert_int_equal(atomic_load(&p.closed), 0);
    assert_int_equal(dsi_model_free(m), DSI_OK);
    assert_int_equal(atomic_load(&p.closed), 1);
    assert_int_equal(atomic_load(&p.bad), 0);
    close(p.fd);

    /* resident: closed before the load returns, never read again, same tokens */
    probe_open(&p);
    m = load_probe(ctx, &p, DSI_MODEL_FLAG_RESIDENT);
    assert_int_equal(atomic_load(&p.closed), 1);
    run_two_sessions(m, got);
    assert_memory_equal(got[0].out, want[0].out, sizeof want[0].out);
    assert_int_equal(atomic_load(&p.after_load), 0);
    assert_int_equal(dsi_model_free(m), DSI_OK);
    assert_int_equal(atomic_load(&p.closed), 1);
    assert_int_equal(atomic_load(&p.bad), 0);

    /* a failing load closes exactly once too */
    dsi_reader r;
    dsi_reader_init(&r);
    r.size = 100; /* a truncated container */
    r.pread_fn = probe_pread;
    r.close_fn = probe_close;
    r.user_data = &p;
    atomic_store(&p.closed, 0);
    atomic_store(&p.loaded, 0);
    dsi_model *bad = NULL;
    assert_int_not_equal(dsi_model_load_from_reader(ctx, &r, NULL, &bad), DSI_OK);
    assert_null(bad);
    assert_int_equal(atomic_load(&p.closed), 1);
    close(p.fd);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

int main(void) {
    model_src = apiu_model_path("tiny-v41.gguf");
    if (!model_src) {
        return dsit_absent("MODELS", "the tiny model tiny-v41.gguf is not built (DSI_MODELS_DIR)");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_contract),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
