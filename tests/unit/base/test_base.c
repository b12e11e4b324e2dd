/* Internal base helpers: error records, overflow-safe arithmetic, aligned allocation,
 * options reading. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/context_impl.h"

static void test_fail_records(void **state) {
    (void)state;
    dsii_error e;
    dsii_error_clear(&e);
    assert_int_equal(e.status, DSI_OK);
    assert_string_equal(e.msg, "");
    assert_int_equal(dsii_fail(&e, DSI_ERR_BAD_FORMAT, "key %s has value %d", "x.y", 42),
                     DSI_ERR_BAD_FORMAT);
    assert_int_equal(e.status, DSI_ERR_BAD_FORMAT);
    assert_string_equal(e.msg, "key x.y has value 42");
    assert_int_equal(dsii_fail(NULL, DSI_ERR_IO, "ignored"), DSI_ERR_IO);
    /* Long messages are truncated, never overflow. */
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    dsii_fail(&e, DSI_ERR_INTERNAL, "%s", big);
    assert_int_equal(strlen(e.msg), DSII_ERROR_MSG_MAX - 1);
}

static void test_overflow_helpers(void **state) {
    (void)state;
    size_t s;
    uint64_t u;
    assert_true(dsii_mul_size(3, 5, &s));
    assert_int_equal(s, 15);
    assert_false(dsii_mul_size(SIZE_MAX / 2 + 1, 2, &s));
    assert_true(dsii_mul_size(0, SIZE_MAX, &s));
    assert_int_equal(s, 0);
    assert_false(dsii_add_size(SIZE_MAX, 1, &s));
    assert_true(dsii_add_size(SIZE_MAX - 1, 1, &s));
    assert_false(dsii_mul_u64(UINT64_MAX / 3 + 1, 3, &u));
    assert_false(dsii_add_u64(UINT64_MAX, 1, &u));
    assert_true(dsii_add_u64(1, 2, &u));
    assert_int_equal(u, 3);
    assert_null(dsii_calloc(NULL, SIZE_MAX / 2, 4));
}

static void test_aligned(void **state) {
    (void)state;
    for (size_t a = 1; a <= 4096; a *= 2) {
        unsigned char *p = dsii_malloc_aligned(NULL, 100, a);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % (a < sizeof(void *) ? sizeof(void *) : a), 0);
        memset(p, 1, 100);
        dsii_free_aligned(NULL, p);
    }
    assert_null(dsii_malloc_aligned(NULL, 10, 3));
    assert_null(dsii_malloc_aligned(NULL, 10, 8192));
    assert_null(dsii_malloc_aligned(NULL, SIZE_MAX - 8, 64));
    dsii_free_aligned(NULL, NULL);
}

/* ---- dsii_bigbuf ---- */

static size_t g_hook_bytes;
static int g_hook_calls;
static void *hook_malloc(size_t n, void *ud) {
    (void)ud;
    g_hook_calls++;
    g_hook_bytes += n;
    return malloc(n);
}
static void *hook_realloc(void *p, size_t n, void *ud) {
    (void)ud;
    return realloc(p, n);
}
static void hook_free(void *p, void *ud) {
    (void)ud;
    free(p);
}

#if DSII_BIGBUF_MAPS
/* The VmFlags line of the mapping that contains p (/proc/self/smaps): 1 found, 0 not found
 * (smaps lists VmFlags but no mapping holds p), -1 smaps unreadable or without VmFlags. */
static int vma_flags(const void *p, char *flags, size_t cap) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = 0, any_flags = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3) {
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (strncmp(line, "VmFlags:", 8) == 0) {
            any_flags = 1;
            if (inside) {
                snprintf(flags, cap, "%s", line + 8);
                found = 1;
                break;
            }
        }
    }
    fclose(f);
    return found ? 1 : any_flags ? 0 : -1;
}
#endif

static void test_bigbuf(void **state) {
    (void)state;
    dsii_bigbuf b;
    /* small: the aligned allocator */
    assert_true(dsii_bigbuf_alloc(NULL, 1000, 64, &b));
    assert_non_null(b.p);
    assert_int_equal(b.map_size, 0);
    assert_int_equal((uintptr_t)b.p % 64, 0);
    memset(b.p, 1, 1000);
    dsii_bigbuf_free(NULL, &b);
    assert_null(b.p);
    dsii_bigbuf_free(NULL, &b); /* twice: nothing */
    dsii_bigbuf_free(NULL, NULL);

    /* large, with the C library's allocator: 2 MiB-aligned, whole huge pages, writable to
     * the last byte (on Linux; elsewhere the aligned allocator) */
    const size_t n = 5 * DSII_BIGBUF_HUGE + 12345;
    assert_true(dsii_bigbuf_alloc(NULL, n, 4096, &b));
    assert_non_null(b.p);
    assert_int_equal((uintptr_t)b.p % 4096, 0);
#if DSII_BIGBUF_MAPS
    assert_int_equal((uintptr_t)b.p % DSII_BIGBUF_HUGE, 0);
    assert_int_equal(b.map_size, 6 * DSII_BIGBUF_HUGE);
#else
    assert_int_equal(b.map_size, 0);
#endif
    memset(b.p, 7, n);
    assert_int_equal(((unsigned char *)b.p)[n - 1], 7);
    dsii_bigbuf_free(NULL, &b);
    assert_null(b.p);
    assert_int_equal(b.map_size, 0);

    /* a context with its own allocator hooks: every byte from the hooks, no mapping */
    dsi_context c;
    memset(&c, 0, sizeof c);
    c.opt.malloc_fn = hook_malloc;
    c.opt.realloc_fn = hook_realloc;
    c.opt.free_fn = hook_free;
    g_hook_calls = 0;
    g_hook_bytes = 0;
    assert_true(dsii_bigbuf_alloc(&c, n, 4096, &b));
    assert_int_equal(b.map_size, 0);
    assert_int_equal(g_hook_calls, 1);
    assert_true(g_hook_bytes >= n);
    memset(b.p, 3, n);
    dsii_bigbuf_free(&c, &b);

    /* sizes that cannot be had fail cleanly */
    assert_false(dsii_bigbuf_alloc(NULL, SIZE_MAX - 8, 64, &b));
    assert_null(b.p);
}

/* The mapping carries MADV_HUGEPAGE ("hg" in VmFlags), so the kernel may back it with huge
 * pages; whether it does depends on its THP policy and free memory, which a test cannot
 * rely on. */
static void test_bigbuf_hugepage_advice(void **state) {
    (void)state;
#if !DSII_BIGBUF_MAPS
    print_message("skipped: large buffers are not mappings in this build (not Linux, or an "
                  "AddressSanitizer build, which keeps them in the allocator)\n");
    skip();
#else
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!thp) {
        print_message("skipped: this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)\n");
        skip();
    }
    fclose(thp);
    dsii_bigbuf b;
    assert_true(dsii_bigbuf_alloc(NULL, 3 * DSII_BIGBUF_HUGE, 64, &b));
    assert_true(b.map_size > 0);
    memset(b.p, 1, 3 * DSII_BIGBUF_HUGE);
    char flags[512];
    const int found = vma_flags((const char *)b.p + DSII_BIGBUF_HUGE, flags, sizeof flags);
    if (found < 0) {
        dsii_bigbuf_free(NULL, &b);
        print_message("skipped: /proc/self/smaps is not readable or lists no VmFlags here\n");
        skip();
    }
    assert_int_equal(found, 1); /* smaps works: the buffer must be one of its mappings */
    const int advised = strstr(flags, " hg") != NULL;
    dsii_bigbuf_free(NULL, &b);
    assert_true(advised);
#endif
}

typedef struct opts_v2 {
    uint32_t struct_size;
    int32_t a;
    int64_t b;
    int32_t c;
} opts_v2;

static void test_read_options(void **state) {
    (void)state;
    dsii_error e;
    opts_v2 def = {sizeof(opts_v2), 1, 2, 3};
    opts_v2 user = {offsetof(opts_v2, b), 10, 20, 30}; /* old caller: knows only a */
    opts_v2 out = def;
    assert_int_equal(dsii_read_options(&out, sizeof out, &user, "opts", &e), DSI_OK);
    assert_int_equal(out.struct_size, sizeof(opts_v2));
    assert_int_equal(out.a, 10);
    assert_int_equal(out.b, 2);
    assert_int_equal(out.c, 3);
    out = def;
    assert_int_equal(dsii_read_options(&out, sizeof out, NULL, "opts", &e), DSI_OK);
    assert_int_equal(out.a, 1);
    user.struct_size = 0;
    assert_int_equal(dsii_read_options(&out, sizeof out, &user, "opts", &e), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(e.msg, "opts.struct_size"));
    user.struct_size = sizeof(opts_v2) + 4;
    assert_int_equal(dsii_read_options(&out, sizeof out, &user, "opts", &e), DSI_ERR_INVALID_ARGUMENT);
}

static int cmp_int(const void *a, const void *b, void *user) {
    int x = *(const int *)a, y = *(const int *)b;
    if (user) ++*(int *)user;
    return (x > y) - (x < y);
}

typedef struct { unsigned char key, tag, pad; } rec3; /* odd element size */

static int cmp_rec3(const void *a, const void *b, void *user) {
    (void)user;
    const rec3 *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->tag > y->tag) - (x->tag < y->tag);
}

/* dsii_sort: sorted output that is a permutation of the input, for sizes 0..300 (with
 * duplicates), an odd element size, and the user pointer reaching the comparator. */
static void test_sort(void **state) {
    (void)state;
    uint32_t rng = 12345;
    for (size_t n = 0; n <= 300; n += (n < 20 ? 1 : 37)) {
        int v[300], hist[64] = {0}, hist2[64] = {0};
        for (size_t i = 0; i < n; i++) {
            rng = rng * 1664525u + 1013904223u;
            v[i] = (int)(rng >> 26); /* 0..63: many duplicates */
            hist[v[i]]++;
        }
        int calls = 0;
        dsii_sort(v, n, sizeof *v, cmp_int, &calls);
        for (size_t i = 0; i < n; i++) hist2[v[i]]++;
        for (size_t i = 1; i < n; i++) assert_true(v[i - 1] <= v[i]);
        assert_memory_equal(hist, hist2, sizeof hist);
        if (n > 1) assert_true(calls > 0);
    }
    rec3 r[100];
    for (int i = 0; i < 100; i++) {
        r[i].key = (unsigned char)((i * 37) % 10);
        r[i].tag = (unsigned char)i;
        r[i].pad = 0xEE;
    }
    dsii_sort(r, 100, sizeof *r, cmp_rec3, NULL);
    for (int i = 1; i < 100; i++) assert_true(cmp_rec3(&r[i - 1], &r[i], NULL) < 0);
    for (int i = 0; i < 100; i++) assert_int_equal(r[i].pad, 0xEE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_records),
        cmocka_unit_test(test_overflow_helpers),
        cmocka_unit_test(test_aligned),
        cmocka_unit_test(test_bigbuf),
        cmocka_unit_test(test_bigbuf_hugepage_advice),
        cmocka_unit_test(test_read_options),
        cmocka_unit_test(test_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
