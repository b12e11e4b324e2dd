#define _POSIX_C_SOURCE 200809L
/* backends/cpu/threadpool: every task runs exactly once, slots stay in range, concurrent
 * submitters from several threads each get their own complete job, zero / one task. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/cpu/threadpool.h"
#include "tests/common/filter.h"

typedef struct counts {
    int64_t n;
    atomic_int *hits;
    atomic_int bad_slot;
    int32_t n_threads;
} counts;

static void count_task(void *arg, int64_t task, int32_t slot) {
    counts *c = arg;
    if (task < 0 || task >= c->n) {
        atomic_fetch_add(&c->bad_slot, 1000);
        return;
    }
    if (slot < 0 || slot >= c->n_threads) atomic_fetch_add(&c->bad_slot, 1);
    atomic_fetch_add(&c->hits[task], 1);
}

static void run_counted(dsib_threadpool *pool, int32_t nt, int64_t n) {
    counts c;
    c.n = n;
    c.n_threads = nt;
    atomic_init(&c.bad_slot, 0);
    c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
    assert_non_null(c.hits);
    dsib_parallel_for(pool, n, count_task, &c);
    for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&c.hits[i]), 1);
    assert_int_equal(atomic_load(&c.bad_slot), 0);
    free(c.hits);
}

static void test_many_tasks(void **state) {
    (void)state;
    /* 12 threads: more than the pool's 8 task ranges, so slots share ranges */
    static const int32_t nts[] = {1, 2, 3, 4, 5, 12};
    for (size_t k = 0; k < sizeof nts / sizeof nts[0]; k++) {
        const int32_t nt = nts[k];
        dsib_threadpool *pool = NULL;
        assert_int_equal(dsib_threadpool_create(nt, NULL, &pool, NULL, 0), DSI_OK);
        assert_int_equal(dsib_threadpool_n_threads(pool), nt);
        run_counted(pool, nt, 100000);
        for (int rep = 0; rep < 200; rep++) run_counted(pool, nt, 1 + rep % 17);
        dsib_threadpool_free(pool);
    }
}

static void never_task(void *arg, int64_t task, int32_t slot) {
    (void)task;
    (void)slot;
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_zero_and_one_task(void **state) {
    (void)state;
    dsib_threadpool *pool = NULL;
    assert_int_equal(dsib_threadpool_create(3, NULL, &pool, NULL, 0), DSI_OK);
    atomic_int calls;
    atomic_init(&calls, 0);
    dsib_parallel_for(pool, 0, never_task, &calls);
    dsib_parallel_for(pool, -5, never_task, &calls);
    assert_int_equal(atomic_load(&calls), 0);
    dsib_parallel_for(pool, 1, never_task, &calls);
    assert_int_equal(atomic_load(&calls), 1);
    /* a NULL pool runs inline */
    dsib_parallel_for(NULL, 7, never_task, &calls);
    assert_int_equal(atomic_load(&calls), 8);
    dsib_threadpool_free(pool);
    dsib_threadpool_free(NULL);
}

typedef struct submitter {
    dsib_threadpool *pool;
    int32_t nt;
    int id;
    int ok;
} submitter;

typedef struct sum_job {
    int64_t n;
    int64_t *out; /* out[task] = task * id */
    int id;
} sum_job;

static void sum_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    sum_job *j = arg;
    j->out[task] = task * j->id + 1;
}

static void *submitter_main(void *arg) {
    submitter *s = arg;
    s->ok = 1;
    for (int rep = 0; rep < 300; rep++) {
        int64_t n = 1 + (rep * 37 + s->id * 11) % 700;
        sum_job j = {n, calloc((size_t)n, sizeof(int64_t)), s->id + 2};
        if (!j.out) {
            s->ok = 0;
            return NULL;
        }
        dsib_parallel_for(s->pool, n, sum_task, &j);
        for (int64_t i = 0; i < n; i++)
            if (j.out[i] != i * j.id + 1) s->ok = 0;
        free(j.out);
    }
    return NULL;
}

static void test_concurrent_submitters(void **state) {
    (void)state;
    for (int32_t nt = 1; nt <= 4; nt += 3) {
        dsib_threadpool *pool = NULL;
        assert_int_equal(dsib_threadpool_create(nt, NULL, &pool, NULL, 0), DSI_OK);
        pthread_t th[4];
        submitter s[4];
        for (int i = 0; i < 4; i++) {
            s[i] = (submitter){pool, nt, i, 0};
            assert_int_equal(pthread_create(&th[i], NULL, submitter_main, &s[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            assert_true(s[i].ok);
        }
        dsib_threadpool_free(pool);
    }
}

/* Tasks that sleep leave the CPU to others, so even on a busy machine the workers get to
 * run: a job of 200 such tasks must be shared (behaviour, not timing). */
static atomic_int slot_hits[8];
static void sleepy_task(void *arg, int64_t task, int32_t slot) {
    (void)arg;
    (void)task;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    if (slot >= 0 && slot < 8) atomic_fetch_add(&slot_hits[slot], 1);
}

static void test_workers_participate(void **state) {
    (void)state;
    dsib_threadpool *pool = NULL;
    assert_int_equal(dsib_threadpool_create(4, NULL, &pool, NULL, 0), DSI_OK);
    for (int i = 0; i < 8; i++) atomic_init(&slot_hits[i], 0);
    dsib_parallel_for(pool, 200, sleepy_task, NULL);
    int used = 0, total = 0;
    for (int i = 0; i < 8; i++) {
        total += atomic_load(&slot_hits[i]);
        used += atomic_load(&slot_hits[i]) > 0;
    }
    assert_int_equal(total, 200);
    assert_true(used >= 2);
    for (int i = 4; i < 8; i++) assert_int_equal(atomic_load(&slot_hits[i]), 0);
    dsib_threadpool_free(pool);
}

/* A helper still inside its task long after the submitter ran out of tasks: the submitter
 * spins a while, then sleeps until the last helper leaves the job, and the helper must wake
 * it (a lost wake-up hangs here: alarm() ends the test). Repeated, so the helper sometimes
 * leaves while the submitter is between its spin and its sleep. */
static atomic_int slow_claimed;
static void slow_helper_task(void *arg, int64_t task, int32_t slot) {
    (void)task;
    atomic_fetch_add((atomic_int *)arg, 1);
    if (slot != 0 && atomic_exchange(&slow_claimed, 1) == 0) {
        struct timespec ts = {0, 3000000}; /* 3 ms: far beyond the submitter's spin */
        nanosleep(&ts, NULL);
    }
    /* the submitter keeps its first task until a helper holds one (at most ~0.5 s) */
    for (int i = 0; slot == 0 && i < 5000 && !atomic_load(&slow_claimed); i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

static void test_slow_helper_wakes_submitter(void **state) {
    (void)state;
    dsib_threadpool *pool = NULL;
    assert_int_equal(dsib_threadpool_create(3, NULL, &pool, NULL, 0), DSI_OK);
    alarm(20);
    for (int rep = 0; rep < 40; rep++) {
        atomic_int calls;
        atomic_init(&calls, 0);
        atomic_store(&slow_claimed, rep & 1); /* odd reps: no slow task (the spin path) */
        dsib_parallel_for(pool, 64, slow_helper_task, &calls);
        assert_int_equal(atomic_load(&calls), 64);
    }
    alarm(0);
    dsib_threadpool_free(pool);
}

/* The claim order (threadpool.h): each thread runs its own contiguous range of tasks in
 * increasing order before it helps with the others'. Tasks sleep, so the worker gets to
 * run even on a busy machine. Asserted: within each range a thread's tasks increase, and
 * the submitter (slot 0, range [0, 32)) starts with tasks 0, 1, 2, ... — at least the first
 * 16 of them in a row: a helper reaches range 0 only after finishing its own 32 tasks, so
 * this fails only if the submitter ran at under half the helper's pace. Claiming from one
 * shared counter (before) interleaves the two threads' tasks from the start. */
#define ORDER_TASKS 64
static int64_t order_seq[2][ORDER_TASKS];
static atomic_int order_len[2];
static atomic_int order_bad;
static void order_task(void *arg, int64_t task, int32_t slot) {
    (void)arg;
    struct timespec ts = {0, 500000};
    nanosleep(&ts, NULL);
    if (slot < 0 || slot > 1) {
        atomic_fetch_add(&order_bad, 1);
        return;
    }
    int i = atomic_fetch_add(&order_len[slot], 1);
    if (i < ORDER_TASKS) order_seq[slot][i] = task;
}

static void test_claim_order(void **state) {
    (void)state;
    dsib_threadpool *pool = NULL;
    assert_int_equal(dsib_threadpool_create(2, NULL, &pool, NULL, 0), DSI_OK);
    for (int rep = 0; rep < 3; rep++) {
        atomic_init(&order_len[0], 0);
        atomic_init(&order_len[1], 0);
        atomic_init(&order_bad, 0);
        dsib_parallel_for(pool, ORDER_TASKS, order_task, NULL);
        assert_int_equal(atomic_load(&order_bad), 0);
        int n0 = atomic_load(&order_len[0]), n1 = atomic_load(&order_len[1]);
        assert_int_equal(n0 + n1, ORDER_TASKS);
        for (int s = 0; s < 2; s++) {
            int n = s ? n1 : n0;
            for (int i = 1; i < n; i++) {
                int64_t a = order_seq[s][i - 1], b = order_seq[s][i];
                if ((a < ORDER_TASKS / 2) == (b < ORDER_TASKS / 2)) assert_true(b > a);
            }
        }
        int run = 0;
        while (run < n0 && order_seq[0][run] == run) run++;
        assert_true(run >= ORDER_TASKS / 4);
    }
    dsib_threadpool_free(pool);
}

static int n_alloc;
static void *my_malloc(void *ctx, size_t n) {
    (void)ctx;
    n_alloc++;
    return malloc(n);
}
static void my_free(void *ctx, void *p) {
    (void)ctx;
    if (p) n_alloc--;
    free(p);
}

static void test_create_args(void **state) {
    (void)state;
    dsib_threadpool *pool = (dsib_threadpool *)1;
    char msg[128];
    assert_int_equal(dsib_threadpool_create(0, NULL, &pool, msg, sizeof msg),
                     DSI_ERR_INVALID_ARGUMENT);
    assert_null(pool);
    assert_true(strlen(msg) > 0);
    assert_int_equal(dsib_threadpool_create(2000, NULL, &pool, NULL, 0),
                     DSI_ERR_INVALID_ARGUMENT);
    dsib_pool_alloc half = {my_malloc, NULL, NULL};
    assert_int_equal(dsib_threadpool_create(2, &half, &pool, NULL, 0),
                     DSI_ERR_INVALID_ARGUMENT);
    dsib_pool_alloc a = {my_malloc, my_free, NULL};
    assert_int_equal(dsib_threadpool_create(3, &a, &pool, NULL, 0), DSI_OK);
    assert_true(n_alloc > 0);
    run_counted(pool, 3, 1000);
    dsib_threadpool_free(pool);
    assert_int_equal(n_alloc, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_tasks),
        cmocka_unit_test(test_zero_and_one_task),
        cmocka_unit_test(test_concurrent_submitters),
        cmocka_unit_test(test_create_args),
        cmocka_unit_test(test_workers_participate),
        cmocka_unit_test(test_slow_helper_wakes_submitter),
        cmocka_unit_test(test_claim_order),
    };
    dsit_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
