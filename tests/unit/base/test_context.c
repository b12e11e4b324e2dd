#define _POSIX_C_SOURCE 200809L
/* Contexts, options handling, status strings, last errors, logging, allocator hooks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsinfer.h"

/* ---- capture of everything written to fd 1 and 2 while library code runs -------------- */
typedef struct capture {
    int saved_out, saved_err;
    FILE *tmp;
} capture;

static void capture_begin(capture *c) {
    fflush(stdout);
    fflush(stderr);
    c->tmp = tmpfile();
    assert_non_null(c->tmp);
    c->saved_out = dup(1);
    c->saved_err = dup(2);
    dup2(fileno(c->tmp), 1);
    dup2(fileno(c->tmp), 2);
}

static long capture_end(capture *c) {
    fflush(stdout);
    fflush(stderr);
    dup2(c->saved_out, 1);
    dup2(c->saved_err, 2);
    close(c->saved_out);
    close(c->saved_err);
    long n = ftell(c->tmp);
    fseek(c->tmp, 0, SEEK_END);
    n = ftell(c->tmp);
    fclose(c->tmp);
    return n;
}

static void test_versions(void **state) {
    (void)state;
    uint32_t ma = 99, mi = 99, pa = 99;
    dsi_version(&ma, &mi, &pa);
    assert_int_equal(ma, DSI_VERSION_MAJOR);
    assert_int_equal(mi, DSI_VERSION_MINOR);
    assert_int_equal(pa, DSI_VERSION_PATCH);
    char expect[32];
    snprintf(expect, sizeof expect, "%u.%u.%u", ma, mi, pa);
    assert_string_equal(dsi_version_string(), expect);
    assert_string_equal(dsi_version_string(), DSI_VERSION_STRING);
    assert_int_equal(dsi_abi_version(), DSI_ABI_VERSION);
    dsi_version(NULL, NULL, NULL); /* must not crash */
}

static void test_status_strings(void **state) {
    (void)state;
    const dsi_status codes[] = {
        DSI_OK, DSI_ERR_INVALID_ARGUMENT, DSI_ERR_OUT_OF_HOST_MEMORY, DSI_ERR_OUT_OF_DEVICE_MEMORY,
        DSI_ERR_IO, DSI_ERR_BAD_FORMAT, DSI_ERR_UNSUPPORTED, DSI_ERR_BACKEND, DSI_ERR_CANCELLED,
        DSI_ERR_CONTEXT_FULL, DSI_ERR_STATE_MISMATCH, DSI_ERR_ABI_MISMATCH, DSI_ERR_BUSY,
        DSI_ERR_NOT_FOUND, DSI_ERR_INTERNAL};
    const size_t n = sizeof codes / sizeof codes[0];
    assert_int_equal(n, 15);
    for (size_t i = 0; i < n; i++) {
        const char *s = dsi_status_string(codes[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        assert_string_not_equal(s, "unknown status");
        for (size_t j = 0; j < i; j++) assert_string_not_equal(s, dsi_status_string(codes[j]));
    }
    assert_string_equal(dsi_status_string(-12345), "unknown status");
    assert_string_equal(dsi_status_string(7), "unknown status");
    assert_string_equal(dsi_status_string(DSI_OK), "ok");
}

static void test_defaults(void **state) {
    (void)state;
    dsi_context_options o;
    memset(&o, 0xab, sizeof o);
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    assert_int_equal(o.struct_size, sizeof o);
    assert_int_equal(o.abi_version, DSI_ABI_VERSION);
    assert_null(o.log_fn);
    assert_int_equal(o.log_level, DSI_LOG_INFO);
    assert_int_equal(o.n_threads, 0);
    assert_null(o.malloc_fn);
    assert_null(o.backend);
    assert_int_equal(o.device_index, -1);
    assert_int_equal(o.flags, 0);
    dsi_context_options_init(NULL, DSI_ABI_VERSION); /* no crash */

    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_OK);
    assert_non_null(ctx);
    assert_string_equal(dsi_context_backend(ctx), "cpu");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(dsi_context_n_threads(ctx), ncpu < 1 ? 1 : ncpu);
    assert_string_equal(dsi_context_last_error(ctx), "");
    assert_int_equal(dsi_context_free(ctx), DSI_OK);

    /* NULL options mean all defaults. */
    ctx = NULL;
    assert_int_equal(dsi_context_create(NULL, &ctx), DSI_OK);
    assert_non_null(ctx);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
    assert_int_equal(dsi_context_free(NULL), DSI_OK);
}

/* An application built against an older, shorter header: only the fields before
 * n_threads existed. Whatever follows in memory must be ignored. */
static void test_smaller_struct_size(void **state) {
    (void)state;
    unsigned char raw[sizeof(dsi_context_options)];
    memset(raw, 0xff, sizeof raw); /* garbage beyond the old struct's end */
    dsi_context_options *o = (dsi_context_options *)(void *)raw;
    o->struct_size = (uint32_t)offsetof(dsi_context_options, n_threads);
    o->abi_version = DSI_ABI_VERSION;
    o->log_fn = NULL;
    o->log_user_data = NULL;
    o->log_level = DSI_LOG_WARN;
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(o, &ctx), DSI_OK);
    assert_non_null(ctx);
    /* n_threads (garbage 0xffffffff = -1 in the caller's memory) fell back to the default. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(dsi_context_n_threads(ctx), ncpu < 1 ? 1 : ncpu);
    assert_string_equal(dsi_context_backend(ctx), "cpu");
    dsi_context_free(ctx);

    /* Older still: only struct_size (no abi_version field) is accepted as "older ABI". */
    memset(raw, 0xff, sizeof raw);
    o->struct_size = (uint32_t)sizeof(uint32_t);
    ctx = NULL;
    assert_int_equal(dsi_context_create(o, &ctx), DSI_OK);
    dsi_context_free(ctx);
}

static void test_bad_options(void **state) {
    (void)state;
    dsi_context_options o;
    dsi_context *ctx = (dsi_context *)(uintptr_t)1;

    assert_int_equal(dsi_context_create(NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_true(strlen(dsi_last_error()) > 0);

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.struct_size = 0;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(dsi_last_error(), "struct_size"));

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.struct_size = (uint32_t)sizeof o + 8;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "struct_size"));

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.log_level = 17;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "log_level"));

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.n_threads = -3;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "n_threads"));

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "metal";
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "metal"));

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.device_index = -7;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "device_index"));

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.flags = 4;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "flags"));
    /* the one defined flag is accepted */
    o.flags = DSI_CONTEXT_FLAG_EXACT_MATMUL;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_OK);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
    ctx = NULL;

    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.malloc_fn = (dsi_malloc_fn)(uintptr_t)malloc; /* only one of three hooks */
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "allocator"));

    dsi_context_options_init(&o, 0);
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "abi_version"));

    /* A caller compiled against a newer ABI than this library. */
    dsi_context_options_init(&o, DSI_ABI_VERSION + 1);
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_ABI_MISMATCH);
    assert_null(ctx);
    assert_non_null(strstr(dsi_last_error(), "ABI"));

    /* Older ABIs are accepted. */
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_OK);
    dsi_context_free(ctx);
}

static void test_last_error_is_thread_local(void **state);

typedef struct log_rec {
    int count;
    int min_level_seen;
    int saw_context_line;
    char last[256];
} log_rec;

static void on_log(int32_t level, const char *msg, void *ud) {
    log_rec *r = ud;
    r->count++;
    if (level < r->min_level_seen) r->min_level_seen = level;
    snprintf(r->last, sizeof r->last, "%s", msg);
    if (strstr(msg, "context on backend")) r->saw_context_line = 1;
    assert_true(strlen(msg) == 0 || msg[strlen(msg) - 1] != '\n');
}

static void test_log_callback_and_silence(void **state) {
    (void)state;
    log_rec rec = {0, 99, 0, ""};
    capture cap;
    capture_begin(&cap);

    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.log_fn = on_log;
    o.log_user_data = &rec;
    o.log_level = DSI_LOG_DEBUG;
    dsi_context *ctx = NULL;
    dsi_status st = dsi_context_create(&o, &ctx);
    int32_t n = 0;
    dsi_status st2 = dsi_context_device_count(ctx, &n);
    dsi_context_free(ctx);

    /* Without a callback nothing is printed anywhere, even on errors. */
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "nonsense";
    dsi_context *bad = NULL;
    dsi_status st3 = dsi_context_create(&o, &bad);
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "cuda";
    dsi_status st4 = dsi_context_create(&o, &bad);
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "auto";
    dsi_status st5 = dsi_context_create(&o, &bad);
    dsi_context_free(bad);

    long printed = capture_end(&cap);
    assert_int_equal(st, DSI_OK);
    assert_int_equal(st2, DSI_OK);
    assert_int_equal(st3, DSI_ERR_INVALID_ARGUMENT);
    assert_true(st4 == DSI_ERR_UNSUPPORTED || st4 == DSI_ERR_BACKEND || st4 == DSI_OK);
    assert_int_equal(st5, DSI_OK);
    assert_int_equal(printed, 0);
    assert_true(rec.count >= 1);
    assert_int_equal(rec.saw_context_line, 1);
    assert_true(rec.min_level_seen >= DSI_LOG_DEBUG);

    /* The minimum level filters. */
    log_rec quiet = {0, 99, 0, ""};
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.log_fn = on_log;
    o.log_user_data = &quiet;
    o.log_level = DSI_LOG_ERROR;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_OK);
    dsi_context_free(ctx);
    assert_int_equal(quiet.count, 0);
}

typedef struct alloc_counter {
    long mallocs, reallocs, frees;
    long live;
} alloc_counter;

static void *my_malloc(size_t n, void *ud) {
    alloc_counter *c = ud;
    c->mallocs++;
    c->live++;
    return malloc(n);
}
static void *my_realloc(void *p, size_t n, void *ud) {
    alloc_counter *c = ud;
    c->reallocs++;
    if (!p) c->live++;
    return realloc(p, n);
}
static void my_free(void *p, void *ud) {
    alloc_counter *c = ud;
    if (p) {
        c->frees++;
        c->live--;
    }
    free(p);
}

static void test_allocator_hooks(void **state) {
    (void)state;
    alloc_counter c = {0, 0, 0, 0};
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.malloc_fn = my_malloc;
    o.realloc_fn = my_realloc;
    o.free_fn = my_free;
    o.alloc_user_data = &c;
    o.backend_dir = "/nonexistent/dir"; /* copied through the hooks */
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_OK);
    assert_true(c.mallocs >= 2);
    assert_true(c.live >= 2);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
    assert_int_equal(c.live, 0);
    assert_int_equal(c.frees, c.mallocs);
}

static void test_devices(void **state) {
    (void)state;
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(NULL, &ctx), DSI_OK);
    int32_t n = -1;
    assert_int_equal(dsi_context_device_count(ctx, &n), DSI_OK);
    assert_true(n >= 1);
    dsi_device_info info;
    dsi_device_info_init(&info);
    assert_int_equal(info.struct_size, sizeof info);
    assert_int_equal(dsi_context_device_info(ctx, 0, &info), DSI_OK);
    assert_int_equal(info.type, DSI_DEVICE_CPU);
    assert_string_equal(info.backend, "cpu");
    assert_true(strlen(info.name) > 0);
    assert_true(info.memory_total > 0);
    assert_int_equal(dsi_context_device_info(ctx, n, &info), DSI_ERR_NOT_FOUND);
    assert_true(strlen(dsi_context_last_error(ctx)) > 0);
    assert_int_equal(dsi_context_device_info(ctx, -1, &info), DSI_ERR_NOT_FOUND);
    info.struct_size = 0;
    assert_int_equal(dsi_context_device_info(ctx, 0, &info), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_context_device_count(ctx, NULL), DSI_ERR_INVALID_ARGUMENT);
    /* A short (older) info struct gets only the fields it covers. */
    unsigned char raw[sizeof(dsi_device_info)];
    memset(raw, 0x5a, sizeof raw);
    dsi_device_info *small = (dsi_device_info *)(void *)raw;
    small->struct_size = (uint32_t)offsetof(dsi_device_info, memory_total);
    assert_int_equal(dsi_context_device_info(ctx, 0, small), DSI_OK);
    assert_string_equal(small->backend, "cpu");
    for (size_t i = offsetof(dsi_device_info, memory_total); i < sizeof raw; i++)
        assert_int_equal(raw[i], 0x5a);
    dsi_context_free(ctx);
}

#include <pthread.h>
static void *thread_fail(void *arg) {
    (void)arg;
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "other-thread-backend";
    dsi_context *ctx = NULL;
    dsi_context_create(&o, &ctx);
    return NULL;
}

static void test_last_error_is_thread_local(void **state) {
    (void)state;
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "main-thread-backend";
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_ERR_INVALID_ARGUMENT);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thread_fail, NULL), 0);
    pthread_join(t, NULL);
    assert_non_null(strstr(dsi_last_error(), "main-thread-backend"));
    assert_null(strstr(dsi_last_error(), "other-thread-backend"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_smaller_struct_size),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_log_callback_and_silence),
        cmocka_unit_test(test_allocator_hooks),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_last_error_is_thread_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
