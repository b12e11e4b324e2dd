/* Internal base helpers: error records, overflow-safe arithmetic, aligned allocation,
 * options reading. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/base.h"

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
        cmocka_unit_test(test_read_options),
        cmocka_unit_test(test_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
