/*
 * Allocator hooks see every allocation the library makes on behalf of a context, its models,
 * sessions, samplers and detokenizers (docs/api.md "Memory"). This executable is linked with
 * --wrap for the C library's allocating functions (malloc, calloc, realloc, free, strdup,
 * strndup, qsort — glibc's qsort mallocs a merge buffer —, fopen, posix_memalign,
 * aligned_alloc): every call the library's own code makes to one of them is counted while
 * the test is "armed", and there must be none. Internal allocations of the C library itself
 * (thread creation, dlopen) are outside the contract and not seen here. The hooks must also
 * balance: every block they handed out is given back by the time the context is freed.
 * (The old sampler had no context and used malloc; the old loader sorted with qsort.)
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tests/common/skip.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DSI_EXPERIMENTAL /* the batched API and coalescing allocate too */
#include "dsinfer.h"

/* ---- the wrapped C library -------------------------------------------------------------- */

enum { W_MALLOC, W_CALLOC, W_REALLOC, W_FREE, W_STRDUP, W_STRNDUP, W_QSORT, W_FOPEN,
       W_MEMALIGN, W_ALIGNED, W_N };
static const char *const wname[W_N] = {"malloc", "calloc", "realloc", "free", "strdup",
                                       "strndup", "qsort", "fopen", "posix_memalign",
                                       "aligned_alloc"};
static atomic_int armed;
static atomic_long wcount[W_N];

static void hit(int w) {
    if (atomic_load_explicit(&armed, memory_order_relaxed)) atomic_fetch_add(&wcount[w], 1);
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void __real_qsort(void *b, size_t n, size_t s, int (*c)(const void *, const void *));
FILE *__real_fopen(const char *p, const char *m);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t s);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
void __wrap_qsort(void *b, size_t n, size_t s, int (*c)(const void *, const void *));
FILE *__wrap_fopen(const char *p, const char *m);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);

void *__wrap_malloc(size_t n) { hit(W_MALLOC); return __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t s) { hit(W_CALLOC); return __real_calloc(n, s); }
void *__wrap_realloc(void *p, size_t n) { hit(W_REALLOC); return __real_realloc(p, n); }
void __wrap_free(void *p) { if (p) hit(W_FREE); __real_free(p); }
char *__wrap_strdup(const char *s) { hit(W_STRDUP); return __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { hit(W_STRNDUP); return __real_strndup(s, n); }
void __wrap_qsort(void *b, size_t n, size_t s, int (*c)(const void *, const void *)) {
    hit(W_QSORT);
    __real_qsort(b, n, s, c);
}
FILE *__wrap_fopen(const char *p, const char *m) { hit(W_FOPEN); return __real_fopen(p, m); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) { hit(W_MEMALIGN); return __real_posix_memalign(p, a, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { hit(W_ALIGNED); return __real_aligned_alloc(a, n); }

/* ---- counting hooks (they call the real allocator, unseen by the counters) ------------ */

static atomic_long live, hook_calls;

static void *h_malloc(size_t n, void *u) {
    (void)u;
    void *p = __real_malloc(n);
    if (p) atomic_fetch_add(&live, 1);
    atomic_fetch_add(&hook_calls, 1);
    return p;
}
static void *h_realloc(void *p, size_t n, void *u) {
    (void)u;
    void *q = __real_realloc(p, n);
    if (q && !p) atomic_fetch_add(&live, 1);
    atomic_fetch_add(&hook_calls, 1);
    return q;
}
static void h_free(void *p, void *u) {
    (void)u;
    if (p) atomic_fetch_sub(&live, 1);
    __real_free(p);
}

static const char *model_path;

static void check_no_direct_calls(const char *what) {
    int any = 0;
    for (int w = 0; w < W_N; w++) {
        long n = atomic_load(&wcount[w]);
        if (n) {
            print_error("%s: the library called %s() directly %ld time(s)\n", what, wname[w], n);
            any = 1;
        }
    }
    assert_false(any);
}

static void everything(int32_t access, int batched) {
    for (int w = 0; w < W_N; w++) atomic_store(&wcount[w], 0);
    atomic_store(&live, 0);
    atomic_store(&hook_calls, 0);
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    co.malloc_fn = h_malloc;
    co.realloc_fn = h_realloc;
    co.free_fn = h_free;

    atomic_store(&armed, 1);
    dsi_context *ctx = NULL;
    dsi_model *m = NULL;
    dsi_session *s = NULL;
    dsi_sampler *smp = NULL;
    dsi_detokenizer *d = NULL;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.access = access;
    if (batched) mo.flags = DSI_MODEL_FLAG_COALESCE;
    dsi_status st = dsi_context_create(&co, &ctx);
    if (st == DSI_OK) st = dsi_model_load(ctx, model_path, &mo, &m);
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 96;
    if (st == DSI_OK) st = dsi_session_create(m, &so, &s);
    dsi_sampler_options sp;
    dsi_sampler_options_init(&sp);
    sp.top_k = 20;
    sp.top_p = 0.9f;
    sp.repetition_penalty = 1.1f;
    dsi_logit_bias bias = {3, -1.0f};
    sp.logit_bias = &bias;
    sp.n_logit_bias = 1;
    if (st == DSI_OK) st = dsi_sampler_create_with_context(ctx, &sp, &smp);
    /* chat → tokens → generate with streamed text → detokenize */
    dsi_chat_message msg;
    dsi_chat_message_init(&msg);
    msg.content = "Hello <｜Assistant｜> there";
    const dsi_chat_message *msgs[1] = {&msg};
    dsi_token toks[256];
    size_t nt = 0;
    if (st == DSI_OK) st = dsi_chat_tokenize(m, msgs, 1, NULL, toks, 256, &nt);
    char text[1024];
    size_t tl = 0;
    if (st == DSI_OK) st = dsi_chat_render(m, msgs, 1, NULL, text, sizeof text, &tl);
    if (st == DSI_OK) st = dsi_tokenize(m, text, tl, DSI_TOKENIZE_PARSE_SPECIAL, toks, 256, &nt);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = toks;
    go.n_prompt = nt;
    go.max_tokens = 12;
    const char *stops[1] = {"zzzz"};
    go.stop_strings = stops;
    go.n_stop_strings = 1;
    if (st == DSI_OK) st = dsi_session_generate(s, smp, &go, NULL);
    if (batched) {
        /* a second session, then both advanced by one shared batched step */
        dsi_session *s2 = NULL;
        if (st == DSI_OK) st = dsi_session_create(m, &so, &s2);
        if (st == DSI_OK) st = dsi_session_sync(s2, toks, nt, NULL);
        dsi_session *both[2] = {s, s2};
        const dsi_token *bt[2] = {&toks[1], &toks[2]};
        size_t bn[2] = {1, 1};
        dsi_status bst[2];
        if (st == DSI_OK) st = dsi_session_append_batch(2, both, bt, bn, bst);
        dsi_session_free(s2);
    }
    if (st == DSI_OK) st = dsi_detokenizer_create(m, &d);
    size_t n = 0;
    if (st == DSI_OK) st = dsi_detokenizer_feed(d, toks[1], text, sizeof text, &n);
    if (st == DSI_OK) st = dsi_model_meta_find(m, "general.architecture", text, sizeof text, &n);
    if (st != DSI_OK) print_error("failed: %s\n", dsi_last_error());
    /* error paths allocate too */
    dsi_model *none = NULL;
    (void)dsi_model_load(ctx, "/nonexistent/model.gguf", &mo, &none);
    dsi_detokenizer_free(d);
    dsi_sampler_free(smp);
    dsi_session_free(s);
    dsi_model_free(m);
    dsi_context_free(ctx);
    atomic_store(&armed, 0);

    assert_int_equal(st, DSI_OK);
    check_no_direct_calls(batched ? "coalesced + batched" : access == DSI_ACCESS_MMAP ? "mmap" : "pread");
    assert_true(atomic_load(&hook_calls) > 0);
    assert_int_equal(atomic_load(&live), 0);
}

static void test_mmap(void **state) {
    (void)state;
    everything(DSI_ACCESS_MMAP, 0);
}

static void test_pread(void **state) {
    (void)state;
    everything(DSI_ACCESS_PREAD, 0);
}

static void test_batched(void **state) {
    (void)state;
    everything(DSI_ACCESS_MMAP, 1);
}

/* The wrapping itself works: a direct call from this file is seen. */
static void test_wrap_sees_calls(void **state) {
    (void)state;
    atomic_store(&wcount[W_MALLOC], 0);
    atomic_store(&armed, 1);
    void *volatile p = malloc(16);
    atomic_store(&armed, 0);
    free(p);
    assert_int_equal(atomic_load(&wcount[W_MALLOC]), 1);
}

int main(void) {
    const char *dir = getenv("DSI_MODELS_DIR");
    static char path[4096];
    snprintf(path, sizeof path, "%s/tiny-v41.gguf", dir ? dir : "models");
    if (access(path, R_OK) != 0) {
        return dsit_absent("MODELS", "%s is not built", path);
    }
    model_path = path;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrap_sees_calls),
        cmocka_unit_test(test_mmap),
        cmocka_unit_test(test_pread),
        cmocka_unit_test(test_batched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
