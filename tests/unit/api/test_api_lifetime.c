/*
 * Lifetime rules (docs/api.md "Lifetimes"): every object that points at a model or a
 * context is counted, and freeing the model / context while one is alive returns
 * DSI_ERR_BUSY and frees nothing — the dependant keeps working. Run under ASan in CI: the
 * old behaviour (dsi_model_free returning DSI_OK under a live detokenizer) is a
 * use-after-free there, and the BUSY assertion fails everywhere. Every run uses counting
 * allocator hooks and ends with zero live blocks.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tests/common/skip.h"

#include <stdio.h>
#include <string.h>

#include "api_util.h"

static const char *model_path;

typedef struct {
    apiu_alloc_stats stats;
    dsi_context *ctx;
    dsi_model *model;
} fixture;

static void open_fixture(fixture *f) {
    memset(f, 0, sizeof *f);
    dsi_context_options o;
    apiu_hooked_options(&o, &f->stats);
    assert_int_equal(dsi_context_create(&o, &f->ctx), DSI_OK);
    assert_int_equal(dsi_model_load(f->ctx, model_path, NULL, &f->model), DSI_OK);
}

static void close_fixture(fixture *f) {
    assert_int_equal(dsi_model_free(f->model), DSI_OK);
    assert_int_equal(dsi_context_free(f->ctx), DSI_OK);
    assert_int_equal(atomic_load(&f->stats.live), 0); /* nothing leaked, nothing double-freed */
}

static void test_detokenizer_keeps_model(void **state) {
    (void)state;
    static fixture f;
    open_fixture(&f);
    dsi_detokenizer *d = NULL;
    assert_int_equal(dsi_detokenizer_create(f.model, &d), DSI_OK);
    char buf[64];
    size_t n = 0;
    dsi_token t = 'a'; /* any id inside the vocabulary */
    assert_int_equal(dsi_detokenizer_feed(d, t, buf, sizeof buf, &n), DSI_OK);
    /* the model cannot go while the detokenizer points at it */
    assert_int_equal(dsi_model_free(f.model), DSI_ERR_BUSY);
    assert_non_null(strstr(dsi_model_last_error(f.model), "detokenizer"));
    assert_int_equal(dsi_context_free(f.ctx), DSI_ERR_BUSY);
    /* ... and everything still works (the old code freed the model here: use after free) */
    assert_int_equal(dsi_detokenizer_feed(d, t, buf, sizeof buf, &n), DSI_OK);
    assert_int_equal(dsi_detokenizer_flush(d, buf, sizeof buf, &n), DSI_OK);
    dsi_detokenizer *d2 = NULL;
    assert_int_equal(dsi_detokenizer_create(f.model, &d2), DSI_OK);
    dsi_detokenizer_free(d);
    assert_int_equal(dsi_model_free(f.model), DSI_ERR_BUSY); /* d2 still counts */
    dsi_detokenizer_free(d2);
    close_fixture(&f);
}

static void test_session_keeps_model(void **state) {
    (void)state;
    static fixture f;
    open_fixture(&f);
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 32;
    dsi_session *s = NULL;
    assert_int_equal(dsi_session_create(f.model, &so, &s), DSI_OK);
    assert_int_equal(dsi_model_free(f.model), DSI_ERR_BUSY);
    assert_non_null(strstr(dsi_model_last_error(f.model), "session"));
    dsi_token t = 1;
    assert_int_equal(dsi_session_append(s, &t, 1), DSI_OK);
    dsi_session_free(s);
    close_fixture(&f);
}

static void test_context_keeps_models(void **state) {
    (void)state;
    static fixture f;
    open_fixture(&f);
    assert_int_equal(dsi_context_free(f.ctx), DSI_ERR_BUSY);
    assert_non_null(strstr(dsi_context_last_error(f.ctx), "model"));
    /* a second model of the same context counts too */
    dsi_model *m2 = NULL;
    assert_int_equal(dsi_model_load(f.ctx, model_path, NULL, &m2), DSI_OK);
    assert_int_equal(dsi_model_free(f.model), DSI_OK);
    assert_int_equal(dsi_context_free(f.ctx), DSI_ERR_BUSY);
    f.model = m2;
    close_fixture(&f);
}

/* A sampler created with a context allocates through its hooks and counts on it. */
static void test_sampler_keeps_context(void **state) {
    (void)state;
    static fixture f;
    open_fixture(&f);
    long before = atomic_load(&f.stats.live);
    dsi_sampler *smp = NULL;
    assert_int_equal(dsi_sampler_create_with_context(f.ctx, NULL, &smp), DSI_OK);
    assert_true(atomic_load(&f.stats.live) > before); /* the sampler is in the hooks' books */
    assert_int_equal(dsi_model_free(f.model), DSI_OK);
    f.model = NULL;
    assert_int_equal(dsi_context_free(f.ctx), DSI_ERR_BUSY);
    assert_non_null(strstr(dsi_context_last_error(f.ctx), "sampler"));
    float logits[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    dsi_token t = -1;
    assert_int_equal(dsi_sampler_sample(smp, logits, 8, &t), DSI_OK);
    dsi_sampler_free(smp);
    /* a plain sampler points at nothing */
    assert_int_equal(dsi_sampler_create_with_context(NULL, NULL, &smp), DSI_OK);
    assert_int_equal(dsi_context_free(f.ctx), DSI_OK);
    assert_int_equal(atomic_load(&f.stats.live), 0);
    assert_int_equal(dsi_sampler_sample(smp, logits, 8, &t), DSI_OK);
    dsi_sampler_free(smp);
}

int main(void) {
    model_path = apiu_model_path("tiny-v41.gguf");
    if (!model_path) {
        return dsit_absent("MODELS", "the tiny model tiny-v41.gguf is not built (DSI_MODELS_DIR)");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detokenizer_keeps_model),
        cmocka_unit_test(test_session_keeps_model),
        cmocka_unit_test(test_context_keeps_models),
        cmocka_unit_test(test_sampler_keeps_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
