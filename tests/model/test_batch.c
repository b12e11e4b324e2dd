/*
 * Multi-sequence steps (lib/arch, lib/sched; include/dsinfer.h "Experimental API"):
 *
 *  1. batch invariance, both tiny models: 8 sessions with different prompts, prompt
 *     lengths, chunk sizes and decode lengths, advanced by dsi_session_append_batch in
 *     rounds — all together, joining and leaving mid-way, prompts (several shared steps
 *     for the small-n_batch sessions) mixed with decode tokens, the session order shuffled
 *     every round — give logits bit-identical to each session run alone;
 *  2. the batch call's per-session errors: an out-of-vocabulary token and a context-full
 *     session fail alone and leave their own timelines and every other session's results
 *     unchanged; a cancelled session keeps a valid prefix;
 *  3. coalescing (DSI_MODEL_FLAG_COALESCE): 8 threads generating greedily on their own
 *     sessions produce exactly the tokens of 8 serial runs, in shared steps (the scheduler
 *     ran steps with several rows); a cancel in one thread (mid-generation, between its
 *     steps) and a context-full in another leave the other threads' tokens unchanged;
 *  4. capture (on backends that replay, i.e. Vulkan): a decode step recorded once and
 *     replayed for >= 300 positions gives logits identical to the same session without
 *     capture;
 *  5. state slots (lib/kv): a slot exported after a prompt and imported into another
 *     session's slot (with the timeline) continues exactly like the original — the basis of
 *     session snapshots and forks.
 *
 * argv[1]: backend ("cpu" default, "vulkan"); argv[2], optional: a part of the cases
 * (threads / nothreads / capture / nocapture, see main). Skips (77, tests/common/skip.h) only without
 * the tiny models (unless DSI_REQUIRE_MODELS=1) or, for vulkan, without a device (unless
 * DSI_REQUIRE_VULKAN=1); a model that is there and does not load is a failure. Under
 * DSINFER_VULKAN_VALIDATION=1 the sizes shrink (that run is about validation errors) and the layer must have counted no
 * error.
 */
#define _POSIX_C_SOURCE 200809L
#define DSI_EXPERIMENTAL
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dsinfer.h"
#include "api/session_impl.h"
#include "model/model.h"
#include "model_test_util.h"
#include "sched/sched.h"
#include "tests/common/filter.h"
#include "tests/common/skip.h"
#include "tests/common/vk_validation.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NSEQ 8
#define MAX_STEPS 64

static const char *g_backend = "cpu";
static int g_small; /* validation-layer run: fewer tokens */

typedef struct fx {
    const char *file;
    dsi_context *ctx;
    dsi_model *m;      /* coalescing off */
    dsi_model *mc;     /* coalescing on */
    int32_t V;
} fx;

static fx g_fx[2] = {{"tiny-v4.gguf", 0, 0, 0, 0}, {"tiny-v41.gguf", 0, 0, 0, 0}};

static int setup(void **state) {
    fx *f = *state;
    const char *path = mt_model_path(f->file, NULL);
    if (!path) return 0;
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    co.backend = g_backend;
    /* main() opened this backend once: failing now is a failure, not an absence */
    if (dsi_context_create(&co, &f->ctx) != DSI_OK) {
        printf("FAIL: context '%s': %s\n", g_backend, dsi_last_error());
        return -1;
    }
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    if (dsi_model_load(f->ctx, path, &mo, &f->m) != DSI_OK) {
        printf("FAIL: load %s on %s: %s\n", path, g_backend, dsi_last_error());
        return -1;
    }
    mo.flags = DSI_MODEL_FLAG_COALESCE;
    if (dsi_model_load(f->ctx, path, &mo, &f->mc) != DSI_OK) {
        printf("FAIL: load %s (coalescing) on %s: %s\n", path, g_backend, dsi_last_error());
        return -1;
    }
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(f->m, &info);
    f->V = info.n_vocab;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    if (f->m) dsi_model_free(f->m);
    if (f->mc) dsi_model_free(f->mc);
    if (f->ctx) dsi_context_free(f->ctx);
    f->m = f->mc = NULL;
    f->ctx = NULL;
    return 0;
}

/* One context and the two loads per model for all the cases of its group (cmocka group
 * setup): every case creates and frees its own sessions and reads scheduler counters as
 * differences, so the cases do not depend on each other; loading once spares the group
 * four context creations (on Vulkan: every pipeline compiled again) and eight model loads. */
static int g_cur; /* index into g_fx of the group being run */

/* Per case: the process CPU time it took, printed (where CI time goes; nothing asserted). */
static double g_cpu0;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int case_start(void **state) {
    (void)state;
    g_cpu0 = cpu_seconds();
    return 0;
}

static int case_end(void **state) {
    (void)state;
    printf("  (case: %.1f s CPU)\n", cpu_seconds() - g_cpu0);
    return 0;
}

static int group_setup(void **state) {
    *state = &g_fx[g_cur];
    return setup(state);
}

static int group_teardown(void **state) {
    *state = &g_fx[g_cur];
    return teardown(state);
}

static void need(fx *f) {
    /* setup fails unless the model is absent (mt_model_path NULL) */
    if (!f->m || !f->mc) DSIT_SKIP_TEST("MODELS", "%s not found in $DSI_MODELS_DIR", f->file);
}

static dsi_session *session(dsi_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t flags) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = n_ctx;
    so.n_batch = n_batch;
    so.flags = flags;
    dsi_session *s = NULL;
    assert_int_equal(dsi_session_create(m, &so, &s), DSI_OK);
    return s;
}

/* ---- 1. batch invariance ------------------------------------------------------------------ */

typedef struct spec {
    uint32_t prompt, n_batch, start, n_dec; /* prompt length, chunk size, round of the prompt, decode rounds */
    uint32_t seed;
} spec;

/* The session alone: prompt (its own chunking), then greedy decode; logits of every step
 * (step 0 = after the prompt) and the tokens. */
static void solo(dsi_model *m, int32_t V, const spec *sp, const dsi_token *prompt, float *lg,
                 dsi_token *toks) {
    dsi_session *s = session(m, 512, sp->n_batch, 0);
    assert_int_equal(dsi_session_append(s, prompt, sp->prompt), DSI_OK);
    for (uint32_t d = 0; d <= sp->n_dec; d++) {
        const float *l;
        int32_t nv;
        assert_int_equal(dsi_session_logits(s, &l, &nv), DSI_OK);
        memcpy(lg + (size_t)d * V, l, sizeof(float) * (size_t)V);
        if (d == sp->n_dec) break;
        toks[d] = (dsi_token)mt_argmax(l, V);
        assert_int_equal(dsi_session_append(s, &toks[d], 1), DSI_OK);
    }
    dsi_session_free(s);
}

static void run_batch_case(fx *f, const spec *sp, const char *what) {
    int32_t V = f->V;
    dsi_token prompts[NSEQ][64], toks[NSEQ][MAX_STEPS];
    float *ref[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        mt_tokens(prompts[i], sp[i].prompt, V, sp[i].seed);
        ref[i] = malloc(sizeof(float) * (size_t)V * (sp[i].n_dec + 1));
        assert_non_null(ref[i]);
        solo(f->m, V, &sp[i], prompts[i], ref[i], toks[i]);
    }
    dsi_session *s[NSEQ];
    for (int i = 0; i < NSEQ; i++) s[i] = session(f->m, 512, sp[i].n_batch, 0);
    uint32_t done[NSEQ] = {0}; /* steps taken (0 = prompt pending) */
    uint32_t rounds = 0;
    for (int i = 0; i < NSEQ; i++)
        if (sp[i].start + sp[i].n_dec + 1 > rounds) rounds = sp[i].start + sp[i].n_dec + 1;
    uint32_t seed = 12345;
    uint64_t steps0, rows0;
    dsii_sched_stats(f->m->exec, &steps0, &rows0);
    for (uint32_t r = 0; r < rounds; r++) {
        dsi_session *bs[NSEQ];
        const dsi_token *bt[NSEQ];
        size_t bn[NSEQ];
        int who[NSEQ];
        size_t k = 0;
        for (int i = 0; i < NSEQ; i++) {
            if (r < sp[i].start || done[i] > sp[i].n_dec) continue;
            who[k] = i;
            bs[k] = s[i];
            if (done[i] == 0) {
                bt[k] = prompts[i];
                bn[k] = sp[i].prompt;
            } else {
                bt[k] = &toks[i][done[i] - 1];
                bn[k] = 1;
            }
            k++;
        }
        /* any order */
        for (size_t a = k; a > 1; a--) {
            seed = seed * 1103515245u + 12345u;
            size_t b = (seed >> 16) % a;
            dsi_session *ts = bs[a - 1];
            bs[a - 1] = bs[b], bs[b] = ts;
            const dsi_token *tt = bt[a - 1];
            bt[a - 1] = bt[b], bt[b] = tt;
            size_t tn = bn[a - 1];
            bn[a - 1] = bn[b], bn[b] = tn;
            int tw = who[a - 1];
            who[a - 1] = who[b], who[b] = tw;
        }
        if (k == 0) continue;
        dsi_status st[NSEQ];
        assert_int_equal(dsi_session_append_batch(k, bs, bt, bn, st), DSI_OK);
        for (size_t j = 0; j < k; j++) {
            int i = who[j];
            const float *l;
            int32_t nv;
            assert_int_equal(st[j], DSI_OK);
            assert_int_equal(dsi_session_logits(s[i], &l, &nv), DSI_OK);
            if (memcmp(l, ref[i] + (size_t)done[i] * V, sizeof(float) * (size_t)V) != 0)
                fail_msg("%s: %s: session %d step %u differs from the session alone", f->file,
                         what, i, done[i]);
            done[i]++;
        }
    }
    uint64_t steps1, rows1;
    dsii_sched_stats(f->m->exec, &steps1, &rows1);
    printf("  %s %s: %u rounds, %llu shared steps carrying %llu rows: bit-identical to alone\n",
           f->file, what, rounds, (unsigned long long)(steps1 - steps0),
           (unsigned long long)(rows1 - rows0));
    assert_true(rows1 - rows0 > steps1 - steps0); /* steps did carry several rows */
    for (int i = 0; i < NSEQ; i++) {
        dsi_session_free(s[i]);
        free(ref[i]);
    }
}

static void test_batch_invariance(void **state) {
    fx *f = *state;
    need(f);
    uint32_t nd = g_small ? 3 : 10;
    /* all together: different prompt lengths and chunk sizes */
    spec all[NSEQ], join[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        all[i] = (spec){(uint32_t)(5 + 7 * i) % (g_small ? 12 : 40) + 1, i % 3 == 0 ? 4u : 256u, 0,
                        nd, 100u + (uint32_t)i};
        /* joining and leaving mid-way; long prompts in small chunks run as several shared
         * steps while others decode (mixed prefill + decode) */
        join[i] = (spec){(uint32_t)(3 + 11 * i) % (g_small ? 12 : 45) + 2, i % 2 ? 5u : 64u,
                         (uint32_t)(i * 3) % (g_small ? 2 : 7), nd - (uint32_t)(i % 4), 200u + (uint32_t)i};
    }
    run_batch_case(f, all, "8 sessions together");
    run_batch_case(f, join, "joining and leaving, prefill mixed with decode");
}

/* ---- 2. per-session failures in a batch ------------------------------------------------ */

static void test_batch_errors(void **state) {
    fx *f = *state;
    need(f);
    int32_t V = f->V;
    dsi_token p[3][8];
    for (int i = 0; i < 3; i++) mt_tokens(p[i], 8, V, 300u + (uint32_t)i);
    /* references: sessions 0 and 2 alone */
    float *r0 = malloc(sizeof(float) * V), *r2 = malloc(sizeof(float) * V);
    for (int i = 0; i < 3; i += 2) {
        dsi_session *s = session(f->m, 64, 256, 0);
        assert_int_equal(dsi_session_append(s, p[i], 8), DSI_OK);
        const float *l;
        assert_int_equal(dsi_session_logits(s, &l, NULL), DSI_OK);
        memcpy(i ? r2 : r0, l, sizeof(float) * V);
        dsi_session_free(s);
    }
    dsi_session *s[3] = {session(f->m, 64, 256, 0), session(f->m, 64, 256, 0), session(f->m, 10, 256, 0)};
    dsi_token bad[8];
    memcpy(bad, p[1], sizeof bad);
    bad[5] = V + 3; /* outside the vocabulary */
    const dsi_token *bt[3] = {p[0], bad, p[2]};
    size_t bn[3] = {8, 8, 8};
    dsi_status st[3];
    /* session 2 has n_ctx 10: first 8 tokens fit */
    assert_int_equal(dsi_session_append_batch(3, s, bt, bn, st), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(st[0], DSI_OK);
    assert_int_equal(st[1], DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(st[2], DSI_OK);
    uint32_t pos;
    assert_int_equal(dsi_session_position(s[1], &pos), DSI_OK);
    assert_int_equal(pos, 0); /* unchanged */
    const float *l;
    assert_int_equal(dsi_session_logits(s[0], &l, NULL), DSI_OK);
    assert_memory_equal(l, r0, sizeof(float) * V);
    assert_int_equal(dsi_session_logits(s[2], &l, NULL), DSI_OK);
    assert_memory_equal(l, r2, sizeof(float) * V);
    /* context-full in session 2 (8 + 8 > 10) alone; session 0 advances */
    const dsi_token *bt2[2] = {p[1], p[1]};
    size_t bn2[2] = {8, 8};
    dsi_session *s2[2] = {s[2], s[0]};
    assert_int_equal(dsi_session_append_batch(2, s2, bt2, bn2, st), DSI_ERR_CONTEXT_FULL);
    assert_int_equal(st[0], DSI_ERR_CONTEXT_FULL);
    assert_int_equal(st[1], DSI_OK);
    assert_int_equal(dsi_session_position(s[2], &pos), DSI_OK);
    assert_int_equal(pos, 8);
    assert_int_equal(dsi_session_logits(s[2], &l, NULL), DSI_OK); /* still there */
    assert_memory_equal(l, r2, sizeof(float) * V);
    /* whole-call errors change nothing */
    dsi_session *dup[2] = {s[0], s[0]};
    assert_int_equal(dsi_session_append_batch(2, dup, bt2, bn2, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_session_position(s[0], &pos), DSI_OK);
    assert_int_equal(pos, 16);
    /* cancelled before the call starts: sticky, like dsi_session_append (docs/api.md
     * "Cancellation"): that session's part is cancelled before it changes the session, the
     * other session runs, and the request is consumed (the next call runs) */
    assert_int_equal(dsi_session_position(s[1], &pos), DSI_OK);
    uint32_t pos1_before = pos;
    dsi_session_cancel(s[1]);
    const dsi_token *bt3[2] = {p[1], p[1]};
    size_t bn3[2] = {8, 1};
    dsi_session *s3[2] = {s[1], s[0]};
    assert_int_equal(dsi_session_append_batch(2, s3, bt3, bn3, st), DSI_ERR_CANCELLED);
    assert_int_equal(st[0], DSI_ERR_CANCELLED);
    assert_int_equal(st[1], DSI_OK);
    assert_int_equal(dsi_session_position(s[1], &pos), DSI_OK);
    assert_int_equal(pos, pos1_before);
    assert_int_equal(dsi_session_position(s[0], &pos), DSI_OK);
    assert_int_equal(pos, 17);
    assert_int_equal(dsi_session_append_batch(1, &s[1], bt3, bn3, st), DSI_OK);
    assert_int_equal(dsi_session_position(s[1], &pos), DSI_OK);
    assert_int_equal(pos, pos1_before + 8);
    for (int i = 0; i < 3; i++) dsi_session_free(s[i]);
    free(r0);
    free(r2);
}

/* ---- 3. coalescing ------------------------------------------------------------------------ */

typedef struct gen_job {
    dsi_model *m;
    dsi_token prompt[16];
    size_t n_prompt;
    uint32_t n_ctx, max;
    int cancel_at;          /* cancel self (from this thread's callback) after this many tokens; -1 never */
    dsi_token out[MAX_STEPS];
    int n_out;
    int32_t finish;
    dsi_status st;
    dsi_session *s;
    pthread_barrier_t *go;
} gen_job;

static int32_t on_tok(dsi_token t, const char *text, size_t len, void *ud) {
    (void)text;
    (void)len;
    gen_job *j = ud;
    if (t < 0) return 1;
    int k = j->n_out;
    if (k < MAX_STEPS) j->out[k] = t;
    j->n_out = k + 1;
    /* the cancel request of this thread's session, between two of its steps */
    if (j->cancel_at >= 0 && j->n_out == j->cancel_at) dsi_session_cancel(j->s);
    return 1;
}

static void *gen_main(void *p) {
    gen_job *j = p;
    dsi_sampler_options so;
    dsi_sampler_options_init(&so);
    so.temperature = 0.0f;
    dsi_sampler *smp = NULL;
    dsi_sampler_create(&so, &smp);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = j->prompt;
    go.n_prompt = j->n_prompt;
    go.max_tokens = (int32_t)j->max;
    go.on_token = on_tok;
    go.user_data = j;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    if (j->go) pthread_barrier_wait(j->go);
    j->st = dsi_session_generate(j->s, smp, &go, &r);
    j->finish = r.finish_reason;
    dsi_sampler_free(smp);
    return NULL;
}

static void test_coalescing(void **state) {
    fx *f = *state;
    need(f);
    int32_t V = f->V;
    uint32_t max = g_small ? 4 : 16;
    gen_job ser[NSEQ], par[NSEQ];
    memset(ser, 0, sizeof ser);
    for (int i = 0; i < NSEQ; i++) {
        ser[i].n_prompt = 3 + (size_t)i;
        mt_tokens(ser[i].prompt, ser[i].n_prompt, V, 700u + (uint32_t)i);
        ser[i].n_ctx = 128;
        ser[i].max = max;
        ser[i].cancel_at = -1;
    }
    /* job 5 hits its context before max tokens: n_ctx = prompt + 5 (prompt + 2 in the
     * validation run, whose max of 4 tokens would otherwise end it by length first) */
    ser[5].n_ctx = (uint32_t)ser[5].n_prompt + (g_small ? 2u : 5u);
    /* serial references on the non-coalescing model */
    for (int i = 0; i < NSEQ; i++) {
        ser[i].m = f->m;
        ser[i].s = session(f->m, ser[i].n_ctx, 256, 0);
        gen_main(&ser[i]);
        assert_int_equal(ser[i].st, DSI_OK);
        dsi_session_free(ser[i].s);
    }
    assert_int_equal(ser[5].finish, DSI_FINISH_CONTEXT_FULL);
    /* 8 threads on the coalescing model; thread 2 cancels its session after half its
     * tokens */
    uint64_t steps0, rows0;
    dsii_sched_stats(f->mc->exec, &steps0, &rows0);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NSEQ);
    pthread_t th[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        par[i] = ser[i];
        par[i].n_out = 0;
        par[i].m = f->mc;
        par[i].go = &bar;
        par[i].s = session(f->mc, par[i].n_ctx, 256, 0);
    }
    par[2].cancel_at = (int)max / 2;
    for (int i = 0; i < NSEQ; i++) assert_int_equal(pthread_create(&th[i], NULL, gen_main, &par[i]), 0);
    for (int i = 0; i < NSEQ; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    uint64_t steps1, rows1;
    dsii_sched_stats(f->mc->exec, &steps1, &rows1);
    printf("  %s: 8 threads, %llu shared steps carrying %llu rows\n", f->file,
           (unsigned long long)(steps1 - steps0), (unsigned long long)(rows1 - rows0));
    assert_true(rows1 - rows0 > steps1 - steps0); /* rows of several sessions shared steps */
    for (int i = 0; i < NSEQ; i++) {
        if (i == 2) {
            /* cancelled after exactly cancel_at tokens: the serial run's first tokens */
            assert_int_equal(par[i].st, DSI_ERR_CANCELLED);
            assert_int_equal(par[i].finish, DSI_FINISH_CANCELLED);
            assert_int_equal(par[i].n_out, par[i].cancel_at);
            for (int k = 0; k < par[i].n_out; k++) assert_int_equal(par[i].out[k], ser[i].out[k]);
            uint32_t pos;
            assert_int_equal(dsi_session_position(par[i].s, &pos), DSI_OK);
            assert_int_equal(pos, (uint32_t)(par[i].n_prompt + (size_t)par[i].n_out));
        } else {
            assert_int_equal(par[i].st, DSI_OK);
            assert_int_equal(par[i].finish, ser[i].finish);
            assert_int_equal(par[i].n_out, ser[i].n_out);
            assert_memory_equal(par[i].out, ser[i].out, sizeof(dsi_token) * (size_t)par[i].n_out);
        }
        dsi_session_free(par[i].s);
    }
}

/* ---- 4. capture / replay ------------------------------------------------------------------ */

static void test_capture(void **state) {
    fx *f = *state;
    need(f);
    dsi_session *a = session(f->m, 512, 256, 0);
    dsi_session *b = session(f->m, 512, 256, DSI_SESSION_FLAG_NO_CAPTURE);
    int32_t V = f->V;
    uint32_t n = g_small ? 8 : 310;
    dsi_token t;
    mt_tokens(&t, 1, V, 4242);
    float *lb = malloc(sizeof(float) * V);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(dsi_session_append(a, &t, 1), DSI_OK);
        assert_int_equal(dsi_session_append(b, &t, 1), DSI_OK);
        const float *la, *lbb;
        assert_int_equal(dsi_session_logits(a, &la, NULL), DSI_OK);
        assert_int_equal(dsi_session_logits(b, &lbb, NULL), DSI_OK);
        memcpy(lb, lbb, sizeof(float) * V);
        if (memcmp(la, lb, sizeof(float) * V) != 0)
            fail_msg("%s: replayed step at position %u differs from the recorded one", f->file, i);
        t = (dsi_token)mt_argmax(la, V);
    }
    dsii_lane *la = a->seq.lane, *lbl = b->seq.lane;
    printf("  %s on %s: %u decode steps; capturing session: %llu captures, %llu replays; "
           "other: %llu replays; logits identical\n",
           f->file, g_backend, n, (unsigned long long)la->captures, (unsigned long long)la->replays,
           (unsigned long long)lbl->replays);
    assert_int_equal(lbl->replays, 0);
    if (la->dev->can_capture) {
        assert_int_equal(la->captures, 1);
        assert_true(la->replays >= (uint64_t)n - 2); /* first step recorded, second captured */
        if (!g_small) assert_true(la->replays >= 300);
    } else {
        printf("  (%s does not capture: both ran the recorded path)\n", g_backend);
    }
    free(lb);
    dsi_session_free(a);
    dsi_session_free(b);
}

/* ---- 5. slot export / import ------------------------------------------------------------- */

static void test_slot_snapshot(void **state) {
    fx *f = *state;
    need(f);
    int32_t V = f->V;
    dsi_token p[24], t[6];
    mt_tokens(p, 24, V, 4711);
    mt_tokens(t, 6, V, 4712);
    dsi_session *a = session(f->m, 256, 256, 0), *b = session(f->m, 256, 256, 0);
    assert_int_equal(dsi_session_append(b, t, 6), DSI_OK); /* b's slot holds other state */
    assert_int_equal(dsi_session_append(a, p, 24), DSI_OK);
    dsii_kv_pool *pool = a->seq.pool;
    assert_ptr_equal(pool, b->seq.pool);
    assert_int_not_equal(a->seq.slot, b->seq.slot);
    uint64_t bytes = dsii_kv_slot_bytes(pool);
    void *snap = malloc(bytes);
    dsii_error e;
    assert_int_equal(dsii_kv_slot_export(pool, a->seq.slot, snap, &e), DSI_OK);
    float *la = malloc(sizeof(float) * V * 6), *lb = malloc(sizeof(float) * V * 6);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(dsi_session_append(a, &t[i], 1), DSI_OK);
        const float *l;
        assert_int_equal(dsi_session_logits(a, &l, NULL), DSI_OK);
        memcpy(la + (size_t)i * V, l, sizeof(float) * V);
    }
    /* b becomes a fork of a at position 24: its slot ← the snapshot, its timeline ← p */
    assert_int_equal(dsii_kv_slot_import(pool, b->seq.slot, snap, &e), DSI_OK);
    memcpy(b->tokens, p, sizeof p);
    b->n_tokens = 24;
    b->has_logits = 0;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(dsi_session_append(b, &t[i], 1), DSI_OK);
        const float *l;
        assert_int_equal(dsi_session_logits(b, &l, NULL), DSI_OK);
        memcpy(lb + (size_t)i * V, l, sizeof(float) * V);
    }
    assert_memory_equal(la, lb, sizeof(float) * V * 6);
    printf("  %s: slot of %llu bytes exported at 24 tokens, imported into another session: the "
           "next 6 steps bit-identical\n", f->file, (unsigned long long)bytes);
    free(snap);
    free(la);
    free(lb);
    dsi_session_free(a);
    dsi_session_free(b);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    dsit_filter();
    if (argc > 1) g_backend = argv[1];
    /* second argument, a part of the cases: "threads" only the test that runs several
     * threads (ctest test_batch_threads, the ThreadSanitizer stage), "nothreads" all the
     * others; "capture" only the capture / replay test (the longest on Vulkan: ctest
     * test_batch_vulkan_capture runs it beside the others), "nocapture" all the others */
    void (*part)(void **) = NULL;
    int only = 0;
    if (argc > 2) {
        const char *a = argv[2];
        int no = strncmp(a, "no", 2) == 0;
        if (no) a += 2;
        if (strcmp(a, "threads") == 0) part = test_coalescing;
        else if (strcmp(a, "capture") == 0) part = test_capture;
        if (!part) {
            printf("FAIL: unknown part '%s' (threads, nothreads, capture, nocapture)\n", argv[2]);
            return 1;
        }
        only = no ? -1 : 1;
    }
    const char *vv = getenv("DSINFER_VULKAN_VALIDATION");
    g_small = vv && strcmp(vv, "1") == 0;
    if (!mt_model_path("tiny-v4.gguf", NULL) && !mt_model_path("tiny-v41.gguf", NULL)) {
        return dsit_absent("MODELS", "no tiny models in $DSI_MODELS_DIR");
    }
    dsi_context *probe = NULL;
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.backend = g_backend;
    if (dsi_context_create(&co, &probe) != DSI_OK) {
        if (strcmp(g_backend, "cpu") == 0) {
            printf("FAIL: no cpu backend: %s\n", dsi_last_error());
            return 1;
        }
        return dsit_absent(dsit_gpu_what(g_backend, 0),
                           "no %s backend: %s", g_backend, dsi_last_error());
    }
    dsi_context_free(probe);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batch_invariance, case_start, case_end),
        cmocka_unit_test_setup_teardown(test_batch_errors, case_start, case_end),
        cmocka_unit_test_setup_teardown(test_coalescing, case_start, case_end),
        cmocka_unit_test_setup_teardown(test_capture, case_start, case_end),
        cmocka_unit_test_setup_teardown(test_slot_snapshot, case_start, case_end),
    };
    int rc = 0;
    for (int m = 0; m < 2; m++) {
        enum { NT = sizeof tests / sizeof tests[0] };
        struct CMUnitTest t[NT];
        size_t nt = 0;
        for (size_t i = 0; i < NT; i++) {
            int in = tests[i].test_func == part;
            if ((only == 1 && !in) || (only == -1 && in)) continue;
            t[nt] = tests[i];
            t[nt++].initial_state = &g_fx[m];
        }
        char name[64];
        snprintf(name, sizeof name, "%s %s", g_fx[m].file, g_backend);
        g_cur = m;
        rc += _cmocka_run_group_tests(name, t, nt, group_setup, group_teardown);
    }
    if (strcmp(g_backend, "vulkan") == 0) {
        /* the counters live in the loaded module: keep a context open while reading them */
        dsi_context *c = NULL;
        if (dsi_context_create(&co, &c) == DSI_OK) {
            if (dsit_vk_validation_check("test_batch vulkan") != 0) rc++;
            dsi_context_free(c);
        }
    }
    return rc;
}
