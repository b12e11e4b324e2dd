/*
 * Model tests of the DeepSeek V4 forward pass on the CPU backend (tiny-v4, model-spec §7.1):
 *
 *   - against the independent NumPy reference (tests/reference/dsref.py, CLI only) over a
 *     300-token sequence that crosses the window (16) ± 1, every multiple of the compression
 *     ratios (4, 16) ± 1 and the indexer top-k saturation (8 rows = position 32):
 *       f32 weights, rounding off on both sides (DSI_SESSION_FLAG_NO_FAKE_QUANT /
 *       --no-fake-quant): argmax equal everywhere, max |Δ| <= 1e-3 × logit range;
 *       f32 weights, rounding on (§10.4), two sequences: every quantiser call of libdsinfer
 *       (recorded through a wrapped op table, tests/common/fq_trace.h) rounds its own inputs
 *       as §10.1 says and its inputs agree with the reference's (--trace-quant) within
 *       FQT_INPUT_ULPS float32 ulps; where the two round a value to different sides of a
 *       midpoint (both correct, inputs within that bound) the library is re-run with the
 *       reference's decision there; at most MAX_FLIPS flips, then within 1e-5 × range and
 *       argmax equal at every position;
 *       q8_0 weights (generated with dsinfer-mkmodel at test time), rounding off;
 *   - invariances (bit-exact, rounding on): chunk sizes 1 / 7 / 64 / whole prompt;
 *     prefill-then-decode == decode all the way; sync with a shared prefix (exact rewind and
 *     rebuild) == fresh session; two sessions on two threads == serial runs;
 *   - errors: out-of-vocabulary and context-full leave the session unchanged; cancellation
 *     leaves a valid prefix that continues correctly.
 *
 * Skips (exit 77, tests/common/skip.h) only when the tiny model / dsinfer-mkmodel is absent
 * from this build, or Python with NumPy for the reference; dsinfer-mkmodel or the reference
 * failing is a failure. Local runs may point DSI_TEST_TINY_V4 / DSI_TEST_TINY_V4_Q8 at model
 * files.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/common/filter.h"

#include "api/session_impl.h"
#include "model_test_util.h"
#include "tests/common/fq_trace.h"
#include "tests/common/skip.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N_TOK 300
#define N_CTX 512
#define TOL_REL 1e-3 /* × logit range of the reference row */
#ifndef MT_SEED
#define MT_SEED 1234
#endif

static const char *g_path;
static dsi_context *g_ctx;
static dsi_model *g_model;
static int32_t g_V;
static dsi_token g_tok[N_TOK];
static float *g_whole_fq;   /* all logits, whole prompt, rounding on */
static float *g_whole_nofq; /* all logits, whole prompt, rounding off */

static int group_setup(void **state) {
    (void)state;
    g_path = mt_model_path("tiny-v4.gguf", "DSI_TEST_TINY_V4");
    if (!g_path) return 0;
    if (mt_open_traced(g_path, 2, &g_ctx, &g_model) != 0) return -1;
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(g_model, &info);
    g_V = info.n_vocab;
    mt_tokens(g_tok, N_TOK, g_V, MT_SEED);
    g_whole_fq = mt_all_logits(g_model, g_tok, N_TOK, N_TOK, 0, N_CTX);
    g_whole_nofq = mt_all_logits(g_model, g_tok, N_TOK, N_TOK, DSI_SESSION_FLAG_NO_FAKE_QUANT,
                                 N_CTX);
    return g_whole_fq && g_whole_nofq ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    free(g_whole_fq);
    free(g_whole_nofq);
    if (g_model) mt_close(g_ctx, g_model);
    return 0;
}

#define NEED_MODEL()                                                                        \
    do {                                                                                    \
        if (!g_model) DSIT_SKIP_TEST("MODELS", "tiny-v4.gguf not found in $DSI_MODELS_DIR"); \
    } while (0)

#define NEED_REF()                                                                          \
    do {                                                                                    \
        int rs_ = mt_reference_status();                                                    \
        if (rs_ < 0) fail_msg("tests/reference/dsref.py not found ($DSI_SOURCE_DIR)");      \
        if (rs_ > 0)                                                                        \
            DSIT_SKIP_TEST("PYTHON", "%s with NumPy is needed by the NumPy reference",      \
                           mt_python());                                                    \
    } while (0)

static void report(const char *what, mt_cmp c) {
    printf("# %s: max|d| %.3g, max rel %.3g (pos %ld), argmax diffs %zu (first %ld)\n", what,
           c.max_abs, c.max_rel, c.worst_pos, c.n_argmax_diff, c.first_argmax_diff);
}

/* ---- against the reference ------------------------------------------------------------ */

static void test_ref_f32_no_fake_quant(void **state) {
    (void)state;
    NEED_MODEL();
    NEED_REF();
    float *ref = mt_reference(g_path, g_tok, N_TOK, g_V, 1, NULL);
    assert_non_null(ref);
    mt_cmp c = mt_compare(g_whole_nofq, ref, N_TOK, g_V, TOL_REL);
    report("f32, rounding off, vs reference", c);
    assert_int_equal(c.n_argmax_diff, 0);
    assert_true(c.max_rel <= TOL_REL);
    free(ref);
}

/* Rounding on (§10.4): the library, token by token (one position per quantiser call), with
 * its quantiser calls recorded, against the reference's own record of every call
 * (tests/common/fq_trace.h): each midpoint flip is explained (both round correctly, inputs
 * agree within FQT_INPUT_ULPS) and aligned by a re-run with the reference's decision, then
 * every position must agree within FQ_TIGHT × range with the same argmax. */
#define FQ_TIGHT 1e-5
/* Flips allowed over N_TOK positions (measured: 3 on each sequence; each costs a re-run of
 * the library, ~0.2 s). */
#define MAX_FLIPS 24

typedef struct traced_run {
    const dsi_token *tok;
} traced_run;

static int run_traced(void *user, float *lg) {
    const traced_run *tr = user;
    dsi_session *s = mt_session(g_model, N_CTX, 1, 0);
    if (!s) return -1;
    dsii_session_begin_call(s);
    for (size_t p = 0; p < N_TOK; p++) {
        fqt_set_pos((int64_t)p);
        if (dsii_session_append_all_logits(s, tr->tok + p, 1, lg + p * (size_t)g_V) != DSI_OK) {
            printf("# append at %zu: %s\n", p, dsi_session_last_error(s));
            dsi_session_free(s);
            return -1;
        }
    }
    dsi_session_free(s);
    return 0;
}

static void fq_check(const dsi_token *tok, const char *what) {
    char qf[] = "/tmp/dsi_mt_quantXXXXXX";
    int fd = mkstemp(qf);
    assert_true(fd >= 0);
    close(fd);
    float *ref = mt_reference(g_path, tok, N_TOK, g_V, 0, qf);
    if (!ref) fail_msg("the reference failed (see above)");
    fqt_trace rt;
    assert_int_equal(fqt_read_reference(qf, &rt), 0);
    unlink(qf);
    assert_true(rt.n > 0);
    assert_int_equal(fqt_check_self(&rt, "reference", 0.0, NULL, 0), 0);
    float *ours = malloc(sizeof(float) * N_TOK * (size_t)g_V);
    assert_non_null(ours);
    traced_run tr = {tok};
    fqt_result r = fqt_converge(run_traced, &tr, ours, &rt, FQT_PAIR_POSITION, MAX_FLIPS,
                                "libdsinfer", "reference");
    printf("# %s: %zu quantiser calls of the reference paired (%zu more in the library); "
           "inputs within %.3g float32 ulps of their block (bound %g, at %s); %zu midpoint "
           "flips in %zu calls (first at position %lld, limit %d), %zu runs\n",
           what, rt.n, r.n_unpaired, r.worst_ulps, FQT_INPUT_ULPS, r.worst_at, r.n_flips,
           r.n_flip_calls, (long long)r.first_flip_pos, MAX_FLIPS, r.runs);
    assert_true(r.ok);
    mt_cmp c = mt_compare(ours, ref, N_TOK, g_V, FQ_TIGHT);
    report("  every flip aligned", c);
    assert_int_equal(c.n_argmax_diff, 0);
    assert_true(c.max_rel <= FQ_TIGHT);
    fqt_free(&rt);
    free(ours);
    free(ref);
}

/* Two sequences: the main one, and one (seed 2) with flips of its own. */
static void test_ref_f32_fake_quant(void **state) {
    (void)state;
    NEED_MODEL();
    NEED_REF();
    fq_check(g_tok, "f32, rounding on, vs reference");
    dsi_token t2[N_TOK];
    mt_tokens(t2, N_TOK, g_V, 2);
    fq_check(t2, "f32, rounding on, second sequence, vs reference");
}

static void test_ref_q8_0(void **state) {
    (void)state;
    NEED_MODEL();
    NEED_REF();
    const char *q8 = mt_model_path("", "DSI_TEST_TINY_V4_Q8");
    int absent = 0;
    if (!q8 || !getenv("DSI_TEST_TINY_V4_Q8"))
        q8 = mt_mkmodel("tiny-v4", "q8_0", "tiny-v4-q8_0.gguf", &absent);
    if (!q8 && absent) DSIT_SKIP_TEST("MODELS", "no dsinfer-mkmodel to write the q8_0 model");
    if (!q8) fail_msg("dsinfer-mkmodel failed to write the q8_0 model (see above)");
    char path[4096];
    snprintf(path, sizeof path, "%s", q8);
    dsi_context *ctx;
    dsi_model *m;
    assert_int_equal(mt_open(path, 2, &ctx, &m), 0);
    float *ours = mt_all_logits(m, g_tok, N_TOK, 64, DSI_SESSION_FLAG_NO_FAKE_QUANT, N_CTX);
    assert_non_null(ours);
    float *ref = mt_reference(path, g_tok, N_TOK, g_V, 1, NULL);
    assert_non_null(ref);
    mt_cmp c = mt_compare(ours, ref, N_TOK, g_V, TOL_REL);
    const char *base = strrchr(path, '/');
    char what[600];
    snprintf(what, sizeof what, "%.500s, rounding off, vs reference", base ? base + 1 : path);
    report(what, c);
    assert_int_equal(c.n_argmax_diff, 0);
    assert_true(c.max_rel <= TOL_REL);
    free(ref);
    free(ours);
    mt_close(ctx, m);
}

/* ---- invariances ----------------------------------------------------------------------- */

static void test_chunk_invariance(void **state) {
    (void)state;
    NEED_MODEL();
    const uint32_t chunks[] = {1, 7, 64};
    for (size_t i = 0; i < 3; i++) {
        float *a = mt_all_logits(g_model, g_tok, N_TOK, chunks[i], 0, N_CTX);
        assert_non_null(a);
        mt_cmp c = mt_compare(a, g_whole_fq, N_TOK, g_V, 0.0);
        printf("# chunk %u vs whole prompt (rounding on): max|d| %g\n", chunks[i], c.max_abs);
        assert_memory_equal(a, g_whole_fq, sizeof(float) * N_TOK * (size_t)g_V);
        free(a);
    }
    float *b = mt_all_logits(g_model, g_tok, N_TOK, 7, DSI_SESSION_FLAG_NO_FAKE_QUANT, N_CTX);
    assert_non_null(b);
    assert_memory_equal(b, g_whole_nofq, sizeof(float) * N_TOK * (size_t)g_V);
    free(b);
}

static void test_prefill_then_decode(void **state) {
    (void)state;
    NEED_MODEL();
    const size_t P = 150;
    dsi_session *s = mt_session(g_model, N_CTX, 64, 0);
    assert_non_null(s);
    size_t reused = 99;
    assert_int_equal(dsi_session_sync(s, g_tok, P, &reused), DSI_OK);
    assert_int_equal(reused, 0);
    const float *lg;
    int32_t nv;
    assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
    assert_int_equal(nv, g_V);
    assert_memory_equal(lg, g_whole_fq + (P - 1) * (size_t)g_V, sizeof(float) * (size_t)g_V);
    for (size_t p = P; p < N_TOK; p++) {
        assert_int_equal(dsi_session_append(s, &g_tok[p], 1), DSI_OK);
        assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
        assert_memory_equal(lg, g_whole_fq + p * (size_t)g_V, sizeof(float) * (size_t)g_V);
    }
    uint32_t pos;
    assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
    assert_int_equal(pos, N_TOK);
    dsi_session_free(s);
}

/* Logits of the last token of tokens[0..n) in a fresh session (rounding on). */
static float *fresh_last(const dsi_token *t, size_t n) {
    dsi_session *s = mt_session(g_model, N_CTX, 64, 0);
    if (!s) return NULL;
    float *r = NULL;
    const float *lg;
    int32_t nv;
    if (dsi_session_sync(s, t, n, NULL) == DSI_OK && dsi_session_logits(s, &lg, &nv) == DSI_OK) {
        r = malloc(sizeof(float) * (size_t)nv);
        memcpy(r, lg, sizeof(float) * (size_t)nv);
    }
    dsi_session_free(s);
    return r;
}

static void sync_and_check(dsi_session *s, const dsi_token *t, size_t n, size_t want_reused) {
    size_t reused = 12345;
    assert_int_equal(dsi_session_sync(s, t, n, &reused), DSI_OK);
    printf("# sync to %zu tokens: reused %zu\n", n, reused);
    assert_int_equal(reused, want_reused);
    const float *lg;
    int32_t nv;
    assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
    float *f = fresh_last(t, n);
    assert_non_null(f);
    assert_memory_equal(lg, f, sizeof(float) * (size_t)g_V);
    free(f);
    size_t nn = 0;
    dsi_token *cp = malloc(sizeof(dsi_token) * n);
    assert_int_equal(dsi_session_tokens(s, cp, n, &nn), DSI_OK);
    assert_int_equal(nn, n);
    assert_memory_equal(cp, t, sizeof(dsi_token) * n);
    free(cp);
}

static void test_sync_prefix(void **state) {
    (void)state;
    NEED_MODEL();
    dsi_token b[N_TOK];
    dsi_session *s = mt_session(g_model, N_CTX, 64, 0);
    assert_non_null(s);
    sync_and_check(s, g_tok, 200, 0);
    /* identical timeline: nothing to do */
    sync_and_check(s, g_tok, 200, 200);
    /* diverge 23 tokens back (exact rewind, inside the ring margin) and run 40 more */
    memcpy(b, g_tok, sizeof b);
    mt_tokens(b + 177, 63, g_V, 99);
    sync_and_check(s, b, 240, 177);
    /* a strict prefix: the last token is re-evaluated to get its logits */
    sync_and_check(s, b, 180, 179);
    /* extend again */
    sync_and_check(s, g_tok, N_TOK, 177);
    /* diverge 290 tokens back: beyond the margin → rebuilt from scratch */
    memcpy(b, g_tok, sizeof b);
    mt_tokens(b + 10, N_TOK - 10, g_V, 7);
    sync_and_check(s, b, N_TOK, 0);
    /* reset then sync */
    assert_int_equal(dsi_session_reset(s), DSI_OK);
    const float *lg;
    int32_t nv;
    assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_ERR_NOT_FOUND);
    sync_and_check(s, g_tok, 50, 0);
    dsi_session_free(s);
}

typedef struct thr_arg {
    const dsi_token *tok;
    size_t n;
    uint32_t batch;
    float *out;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    a->out = mt_all_logits(g_model, a->tok, a->n, a->batch, 0, N_CTX);
    return NULL;
}

static void test_two_threads(void **state) {
    (void)state;
    NEED_MODEL();
    dsi_token other[N_TOK];
    mt_tokens(other, N_TOK, g_V, 4321);
    float *serial_other = mt_all_logits(g_model, other, N_TOK, 16, 0, N_CTX);
    assert_non_null(serial_other);
    thr_arg a = {g_tok, N_TOK, 5, NULL}, b = {other, N_TOK, 16, NULL};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, thr_main, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, thr_main, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_non_null(a.out);
    assert_non_null(b.out);
    assert_memory_equal(a.out, g_whole_fq, sizeof(float) * N_TOK * (size_t)g_V);
    assert_memory_equal(b.out, serial_other, sizeof(float) * N_TOK * (size_t)g_V);
    free(a.out);
    free(b.out);
    free(serial_other);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void check_unchanged(dsi_session *s, uint32_t want_pos, const float *want_logits) {
    uint32_t pos;
    assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
    assert_int_equal(pos, want_pos);
    const float *lg;
    int32_t nv;
    assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
    assert_memory_equal(lg, want_logits, sizeof(float) * (size_t)g_V);
}

static void test_errors_leave_state(void **state) {
    (void)state;
    NEED_MODEL();
    const uint32_t n_ctx = 64;
    dsi_session *s = mt_session(g_model, n_ctx, 16, 0);
    assert_non_null(s);
    assert_int_equal(dsi_session_sync(s, g_tok, 50, NULL), DSI_OK);
    float *keep = malloc(sizeof(float) * (size_t)g_V);
    const float *lg;
    int32_t nv;
    assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
    memcpy(keep, lg, sizeof(float) * (size_t)g_V);

    dsi_token bad[3] = {g_tok[50], g_V, g_tok[52]};
    assert_int_equal(dsi_session_append(s, bad, 3), DSI_ERR_INVALID_ARGUMENT);
    check_unchanged(s, 50, keep);
    bad[1] = -1;
    assert_int_equal(dsi_session_append(s, bad, 3), DSI_ERR_INVALID_ARGUMENT);
    check_unchanged(s, 50, keep);
    assert_int_equal(dsi_session_append(s, g_tok + 50, 0), DSI_ERR_INVALID_ARGUMENT);
    check_unchanged(s, 50, keep);
    assert_int_equal(dsi_session_append(s, g_tok + 50, 15), DSI_ERR_CONTEXT_FULL);
    check_unchanged(s, 50, keep);
    assert_int_equal(dsi_session_sync(s, g_tok, 65, NULL), DSI_ERR_CONTEXT_FULL);
    check_unchanged(s, 50, keep);
    dsi_token t2[60];
    memcpy(t2, g_tok, sizeof t2);
    t2[55] = g_V + 7;
    assert_int_equal(dsi_session_sync(s, t2, 60, NULL), DSI_ERR_INVALID_ARGUMENT);
    check_unchanged(s, 50, keep);
    assert_true(strlen(dsi_session_last_error(s)) > 0);

    /* the untouched session continues exactly like a fresh one */
    assert_int_equal(dsi_session_append(s, g_tok + 50, 14), DSI_OK);
    assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
    assert_memory_equal(lg, g_whole_fq + 63 * (size_t)g_V, sizeof(float) * (size_t)g_V);
    assert_int_equal(dsi_session_append(s, g_tok + 64, 1), DSI_ERR_CONTEXT_FULL);
    free(keep);
    dsi_session_free(s);
}

typedef struct cancel_arg {
    dsi_session *s;
    int delay_us;
} cancel_arg;

static void *cancel_main(void *p) {
    cancel_arg *a = p;
    struct timespec ts = {0, (long)a->delay_us * 1000L};
    nanosleep(&ts, NULL);
    dsi_session_cancel(a->s);
    return NULL;
}

static void test_cancel(void **state) {
    (void)state;
    NEED_MODEL();
    dsi_session *s = mt_session(g_model, N_CTX, 4, 0);
    assert_non_null(s);
    dsi_session_cancel(NULL); /* accepted */

    /* a cancel request is sticky: pending until a call honours it (before changing the
     * session), then consumed — one request, one cancelled call (docs/api.md) */
    dsii_session_begin_call(s);
    dsi_session_cancel(s);
    assert_true(dsii_session_cancel_requested(s));
    assert_int_equal(dsii_session_sync_nc(s, g_tok, 40, NULL), DSI_ERR_CANCELLED);
    assert_false(dsii_session_cancel_requested(s));
    dsi_session_cancel(s);
    assert_int_equal(dsii_session_append_nc(s, g_tok, 4), DSI_ERR_CANCELLED);
    uint32_t pos = 1;
    assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
    assert_int_equal(pos, 0);
    /* the request was consumed: the next public call runs */
    assert_int_equal(dsi_session_sync(s, g_tok, 12, NULL), DSI_OK);

    /* cancel from another thread during a long prefill (chunks of 4): wherever it lands,
     * the session holds a valid prefix and continues exactly */
    int delays[] = {0, 2000, 20000};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dsi_session_reset(s), DSI_OK);
        cancel_arg ca = {s, delays[i]};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, cancel_main, &ca), 0);
        dsi_status st = dsi_session_sync(s, g_tok, N_TOK, NULL);
        pthread_join(th, NULL);
        assert_true(st == DSI_OK || st == DSI_ERR_CANCELLED);
        assert_int_equal(dsi_session_position(s, &pos), DSI_OK);
        printf("# cancel after %d us: %s at position %u\n", delays[i],
               st == DSI_OK ? "finished" : "cancelled", pos);
        size_t nn = 0;
        dsi_token cp[N_TOK];
        assert_int_equal(dsi_session_tokens(s, cp, N_TOK, &nn), DSI_OK);
        assert_int_equal(nn, pos);
        assert_memory_equal(cp, g_tok, sizeof(dsi_token) * nn);
        size_t reused = 0;
        assert_int_equal(dsi_session_sync(s, g_tok, N_TOK, &reused), DSI_OK);
        assert_true(reused + 1 >= pos);
        const float *lg;
        int32_t nv;
        assert_int_equal(dsi_session_logits(s, &lg, &nv), DSI_OK);
        assert_memory_equal(lg, g_whole_fq + (N_TOK - 1) * (size_t)g_V,
                            sizeof(float) * (size_t)g_V);
    }
    dsi_session_free(s);
}

static void test_session_args(void **state) {
    (void)state;
    NEED_MODEL();
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.flags = 0x80;
    dsi_session *s = NULL;
    assert_int_equal(dsi_session_create(g_model, &so, &s), DSI_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_int_equal(dsi_session_create(NULL, NULL, &s), DSI_ERR_INVALID_ARGUMENT);
    /* the model cannot be freed while a session lives */
    assert_int_equal(dsi_session_create(g_model, NULL, &s), DSI_OK);
    assert_int_equal(dsi_model_free(g_model), DSI_ERR_BUSY);
    dsi_session_free(s);
    dsi_session_free(NULL);
}

int main(void) {
    dsit_filter();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_f32_no_fake_quant),
        cmocka_unit_test(test_ref_f32_fake_quant),
        cmocka_unit_test(test_ref_q8_0),
        cmocka_unit_test(test_chunk_invariance),
        cmocka_unit_test(test_prefill_then_decode),
        cmocka_unit_test(test_sync_prefix),
        cmocka_unit_test(test_two_threads),
        cmocka_unit_test(test_errors_leave_state),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_session_args),
    };
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mt_model_path("tiny-v4.gguf", "DSI_TEST_TINY_V4"))
        return dsit_absent("MODELS", "tiny-v4.gguf not found in $DSI_MODELS_DIR (%s)",
                           getenv("DSI_MODELS_DIR") ? getenv("DSI_MODELS_DIR") : "unset");
    return cmocka_run_group_tests_name("model_v4", tests, group_setup, group_teardown);
}
