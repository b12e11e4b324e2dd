/*
 * CPU worker pool (see threadpool.h).
 *
 * Jobs live on the submitter's stack and are linked into the pool's list of open jobs
 * while they still have unclaimed tasks. A worker takes a reference on a job under the
 * pool mutex, claims tasks with atomic counters (one per range of tasks), and drops the
 * reference under the mutex again; the submitter unlinks its job once every task is
 * claimed and returns only when all tasks are done and no worker holds a reference, so the
 * stack job is never touched after it returns.
 */
#define _POSIX_C_SOURCE 200809L

#include "backends/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DSIB_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define DSIB_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define DSIB_CPU_RELAX() ((void)0)
#endif

/* How long an idle worker spins before sleeping, and how long a submitter spins waiting
 * for helpers before sleeping. The decode loop submits a job every few microseconds. After
 * the first DSIB_POOL_HOT_NS the spin yields the CPU on every round (sched_yield returns at
 * once when nothing else wants the core): on a machine with more runnable threads than
 * cores a hot spin would steal the time slice of the very thread it waits for. */
#define DSIB_POOL_SPIN_NS 200000ull
#define DSIB_POOL_HOT_NS 20000ull

/* The tasks of a job are split into contiguous ranges, one per thread (at most
 * DSIB_POOL_RANGES): slot s claims the tasks of range s mod n_ranges in order, then those
 * left in the other ranges. A thread's consecutive tasks are then consecutive output rows,
 * so its weight stream runs on from one task into the next (the kernels' prefetch reaches
 * past a task's end) instead of restarting at every task, as it did when all threads
 * claimed from one counter and their tasks interleaved. Which thread runs a task never
 * changes a result. */
#define DSIB_POOL_RANGES 8

typedef struct dsib_range {
    _Alignas(64) atomic_llong next; /* next unclaimed task of the range */
    long long end;
} dsib_range;

typedef struct dsib_job {
    dsib_task_fn fn;
    void *arg;
    int64_t n_tasks;
    int32_t n_ranges;
    dsib_range rg[DSIB_POOL_RANGES];
    atomic_llong done;   /* finished tasks */
    atomic_int slots;    /* next slot id for a helper (the submitter is 0) */
    uint64_t t_submit;   /* statistics on: submission time, else 0 */
    atomic_int picked;   /* statistics: a helper has started on it */
    atomic_int refs;     /* helpers inside the job: + under the pool mutex (when picked), -
                            without it; the job's memory is the submitter's again at 0 */
    int linked;          /* in the open list (pool mutex) */
    struct dsib_job *prev, *nextj;
} dsib_job;

struct dsib_threadpool {
    int32_t n_threads;
    int32_t n_workers;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    dsib_job *head;       /* open jobs (pool mutex) */
    atomic_uint epoch;    /* bumped by every submission (pool mutex held): idle workers spin
                             on it without the mutex, so a job whose tasks are all claimed
                             does not make them re-lock the mutex over and over */
    int n_sleeping;       /* workers in cv_wait (pool mutex) */
    atomic_int done_waiters; /* submitters asleep on cv_done (changed under the pool mutex) */
    int stop;             /* (pool mutex) */
    dsib_pool_alloc alloc;
    atomic_int stats_on;
    atomic_ullong st_jobs, st_inline, st_tasks, st_helper_tasks, st_wait_ns, st_pickup_ns,
        st_pickups, st_sleeps, st_caller_ns, st_caller_task_ns, st_worker_task_ns;
};

static uint64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *pool_malloc(const dsib_pool_alloc *a, size_t n) {
    return a->malloc_fn ? a->malloc_fn(a->alloc_ctx, n) : malloc(n);
}
static void pool_free(const dsib_pool_alloc *a, void *p) {
    if (a->free_fn)
        a->free_fn(a->alloc_ctx, p);
    else
        free(p);
}

static void set_msg(char *msg, size_t msg_size, const char *text) {
    if (msg && msg_size) snprintf(msg, msg_size, "%s", text);
}

/* 1 while some range of `j` has an unclaimed task. */
static int job_open(dsib_job *j) {
    for (int32_t r = 0; r < j->n_ranges; r++)
        if (atomic_load_explicit(&j->rg[r].next, memory_order_relaxed) < j->rg[r].end) return 1;
    return 0;
}

/* Runs tasks of `j` until none are left to claim: its own range first, then the others';
 * returns how many it ran. */
static int64_t job_run(dsib_job *j, int32_t slot) {
    int64_t ran = 0;
    const int32_t nr = j->n_ranges, r0 = slot % nr;
    for (int32_t k = 0; k < nr; k++) {
        dsib_range *g = &j->rg[(r0 + k) % nr];
        while (atomic_load_explicit(&g->next, memory_order_relaxed) < g->end) {
            long long t = atomic_fetch_add_explicit(&g->next, 1, memory_order_relaxed);
            if (t >= g->end) break;
            j->fn(j->arg, (int64_t)t, slot);
            atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
            ran++;
        }
    }
    return ran;
}

#define STAT_ADD(p, field, v) atomic_fetch_add_explicit(&(p)->field, (unsigned long long)(v), memory_order_relaxed)

void dsib_threadpool_stats_enable(dsib_threadpool *p, int on) {
    if (!p) return;
    atomic_store(&p->stats_on, 0);
    atomic_store(&p->st_jobs, 0);
    atomic_store(&p->st_inline, 0);
    atomic_store(&p->st_tasks, 0);
    atomic_store(&p->st_helper_tasks, 0);
    atomic_store(&p->st_wait_ns, 0);
    atomic_store(&p->st_pickup_ns, 0);
    atomic_store(&p->st_pickups, 0);
    atomic_store(&p->st_sleeps, 0);
    atomic_store(&p->st_caller_ns, 0);
    atomic_store(&p->st_caller_task_ns, 0);
    atomic_store(&p->st_worker_task_ns, 0);
    atomic_store(&p->stats_on, on ? 1 : 0);
}

void dsib_threadpool_stats_get(dsib_threadpool *p, dsib_pool_stats *out) {
    memset(out, 0, sizeof *out);
    if (!p) return;
    out->jobs = atomic_load(&p->st_jobs);
    out->inline_jobs = atomic_load(&p->st_inline);
    out->tasks = atomic_load(&p->st_tasks);
    out->helper_tasks = atomic_load(&p->st_helper_tasks);
    out->wait_ns = atomic_load(&p->st_wait_ns);
    out->pickup_ns = atomic_load(&p->st_pickup_ns);
    out->pickups = atomic_load(&p->st_pickups);
    out->sleeps = atomic_load(&p->st_sleeps);
    out->caller_ns = atomic_load(&p->st_caller_ns);
    out->caller_task_ns = atomic_load(&p->st_caller_task_ns);
    out->worker_task_ns = atomic_load(&p->st_worker_task_ns);
}

/* An open job with unclaimed tasks, or NULL (pool mutex held). */
static dsib_job *pool_pick(dsib_threadpool *p) {
    for (dsib_job *j = p->head; j; j = j->nextj) {
        if (job_open(j)) return j;
    }
    return NULL;
}

static void pool_unlink(dsib_threadpool *p, dsib_job *j) {
    if (!j->linked) return;
    if (j->prev)
        j->prev->nextj = j->nextj;
    else
        p->head = j->nextj;
    if (j->nextj) j->nextj->prev = j->prev;
    j->prev = j->nextj = NULL;
    j->linked = 0;
}

/* Spins (then yields) until the epoch moves from `seen_epoch` or DSIB_POOL_SPIN_NS pass,
 * outside the mutex; 1 when it moved. */
static int pool_spin_epoch(dsib_threadpool *p, unsigned seen_epoch) {
    uint64_t t0 = pool_now_ns();
    int polite = 0;
    for (unsigned it = 0;; it++) {
        if (atomic_load_explicit(&p->epoch, memory_order_acquire) != seen_epoch) return 1;
        if (polite)
            sched_yield();
        else
            DSIB_CPU_RELAX();
        if ((it & 63u) == 63u) {
            uint64_t dt = pool_now_ns() - t0;
            if (dt > DSIB_POOL_SPIN_NS) return 0;
            polite = dt > DSIB_POOL_HOT_NS;
        }
    }
}

/* A worker takes the mutex only to pick a job (and to sleep): it leaves a job without it
 * (refs, done_waiters) and waits for the next one spinning on the epoch, so on the decode
 * path — a job every few microseconds — neither side ever finds the mutex held by the
 * other, which on a contended glibc mutex costs a futex wait and wake per job. */
static void *worker_main(void *arg) {
    dsib_threadpool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->stop) break;
        /* read before the pick: a job linked after this read moves the epoch later */
        const unsigned seen_epoch = atomic_load_explicit(&p->epoch, memory_order_acquire);
        dsib_job *j = pool_pick(p);
        if (j) {
            atomic_fetch_add_explicit(&j->refs, 1, memory_order_relaxed);
            pthread_mutex_unlock(&p->mu);
            int32_t slot = atomic_fetch_add_explicit(&j->slots, 1, memory_order_relaxed);
            if (j->t_submit && atomic_exchange_explicit(&j->picked, 1, memory_order_relaxed) == 0) {
                STAT_ADD(p, st_pickup_ns, pool_now_ns() - j->t_submit);
                STAT_ADD(p, st_pickups, 1);
            }
            const uint64_t t_run = j->t_submit ? pool_now_ns() : 0;
            int64_t ran = job_run(j, slot);
            if (j->t_submit && ran > 0) { /* a job it found all claimed is not task time */
                STAT_ADD(p, st_helper_tasks, ran);
                STAT_ADD(p, st_worker_task_ns, pool_now_ns() - t_run);
            }
            /* j is not touched after this: its submitter may return at once */
            atomic_fetch_sub_explicit(&j->refs, 1, memory_order_seq_cst);
            if (atomic_load_explicit(&p->done_waiters, memory_order_seq_cst) > 0) {
                pthread_mutex_lock(&p->mu);
                pthread_cond_broadcast(&p->cv_done);
                pthread_mutex_unlock(&p->mu);
            }
        } else {
            pthread_mutex_unlock(&p->mu);
        }
        /* new work usually follows at once: spin outside the mutex for a while */
        const int moved = pool_spin_epoch(p, seen_epoch);
        pthread_mutex_lock(&p->mu);
        if (moved || p->stop || pool_pick(p)) continue;
        if (atomic_load_explicit(&p->stats_on, memory_order_relaxed)) STAT_ADD(p, st_sleeps, 1);
        p->n_sleeping++;
        pthread_cond_wait(&p->cv_work, &p->mu);
        p->n_sleeping--;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dsi_status dsib_threadpool_create(int32_t n_threads, const dsib_pool_alloc *alloc,
                                  dsib_threadpool **out, char *msg, size_t msg_size) {
    if (!out) {
        set_msg(msg, msg_size, "threadpool: out is NULL");
        return DSI_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "threadpool: thread count %d outside 1..1024",
                     (int)n_threads);
        return DSI_ERR_INVALID_ARGUMENT;
    }
    dsib_pool_alloc a = {0};
    if (alloc) {
        if ((alloc->malloc_fn == NULL) != (alloc->free_fn == NULL)) {
            set_msg(msg, msg_size, "threadpool: allocator needs both malloc_fn and free_fn");
            return DSI_ERR_INVALID_ARGUMENT;
        }
        a = *alloc;
    }
    dsib_threadpool *p = pool_malloc(&a, sizeof *p);
    if (!p) {
        set_msg(msg, msg_size, "threadpool: out of host memory");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    memset(p, 0, sizeof *p);
    p->alloc = a;
    p->n_threads = n_threads;
    atomic_init(&p->epoch, 0u);
    atomic_init(&p->done_waiters, 0);
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        pool_free(&a, p);
        set_msg(msg, msg_size, "threadpool: pthread_mutex_init failed");
        return DSI_ERR_INTERNAL;
    }
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->threads = pool_malloc(&a, sizeof(pthread_t) * (size_t)(n_threads - 1));
        if (!p->threads) {
            dsib_threadpool_free(p);
            set_msg(msg, msg_size, "threadpool: out of host memory");
            return DSI_ERR_OUT_OF_HOST_MEMORY;
        }
        /* Workers block every asynchronous signal (they inherit the creator's mask): the
         * host's handlers (e.g. one calling dsi_session_cancel) then run on the host's own
         * threads, never on a library thread. Faults (SIGSEGV, SIGBUS, …) stay deliverable. */
        sigset_t block, old;
        sigfillset(&block);
        static const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
        for (size_t k = 0; k < sizeof sync_signals / sizeof sync_signals[0]; k++)
            sigdelset(&block, sync_signals[k]);
        int masked = pthread_sigmask(SIG_SETMASK, &block, &old) == 0;
        int created = 1;
        for (int32_t i = 0; i < n_threads - 1 && created; i++) {
            created = pthread_create(&p->threads[i], NULL, worker_main, p) == 0;
            if (created) p->n_workers++;
        }
        if (masked) pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!created) {
            dsib_threadpool_free(p);
            set_msg(msg, msg_size, "threadpool: pthread_create failed");
            return DSI_ERR_INTERNAL;
        }
    }
    *out = p;
    return DSI_OK;
}

void dsib_threadpool_free(dsib_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    if (p->threads) pool_free(&p->alloc, p->threads);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
    dsib_pool_alloc a = p->alloc;
    pool_free(&a, p);
}

int32_t dsib_threadpool_n_threads(const dsib_threadpool *p) { return p ? p->n_threads : 1; }

void *dsib_threadpool_alloc(dsib_threadpool *p, size_t size) {
    if (!p) return malloc(size ? size : 1);
    return pool_malloc(&p->alloc, size ? size : 1);
}

void dsib_threadpool_dealloc(dsib_threadpool *p, void *ptr) {
    if (!ptr) return;
    if (!p)
        free(ptr);
    else
        pool_free(&p->alloc, ptr);
}

void dsib_parallel_for(dsib_threadpool *p, int64_t n_tasks, dsib_task_fn fn, void *arg) {
    if (n_tasks <= 0 || !fn) return;
    if (!p || p->n_workers == 0 || n_tasks == 1) {
        const int st_in = p && atomic_load_explicit(&p->stats_on, memory_order_relaxed);
        const uint64_t t_in = st_in ? pool_now_ns() : 0;
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        if (st_in) {
            const uint64_t dt = pool_now_ns() - t_in;
            STAT_ADD(p, st_inline, 1);
            STAT_ADD(p, st_caller_ns, dt);
            STAT_ADD(p, st_caller_task_ns, dt);
        }
        return;
    }
    const int stats = atomic_load_explicit(&p->stats_on, memory_order_relaxed);
    dsib_job j;
    j.fn = fn;
    j.arg = arg;
    j.n_tasks = n_tasks;
    j.n_ranges = p->n_threads < DSIB_POOL_RANGES ? p->n_threads : DSIB_POOL_RANGES;
    if (j.n_ranges > n_tasks) j.n_ranges = (int32_t)n_tasks;
    for (int32_t r = 0; r < j.n_ranges; r++) {
        atomic_init(&j.rg[r].next, n_tasks * r / j.n_ranges);
        j.rg[r].end = n_tasks * (r + 1) / j.n_ranges;
    }
    atomic_init(&j.done, 0);
    atomic_init(&j.slots, 1);
    atomic_init(&j.refs, 0);
    j.prev = NULL;
    j.t_submit = stats ? pool_now_ns() : 0;
    atomic_init(&j.picked, 0);

    pthread_mutex_lock(&p->mu);
    j.nextj = p->head;
    if (p->head) p->head->prev = &j;
    p->head = &j;
    j.linked = 1;
    if (p->n_sleeping > 0) pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    /* after the unlock: a spinning worker that sees it then finds the mutex free */
    atomic_fetch_add_explicit(&p->epoch, 1, memory_order_release);

    const uint64_t t_run = stats ? pool_now_ns() : 0;
    job_run(&j, 0);
    const uint64_t t_own = stats ? pool_now_ns() : 0;

    /* Every task is claimed; wait (spin, then sleep) for the helpers' tasks to finish and
     * for the helpers to leave the job (refs 0: none of them touches j any more). Once
     * done reaches n_tasks no worker can pick the job again (pool_pick), so refs only
     * falls. */
    uint64_t t0 = 0;
    int polite = 0;
    for (unsigned it = 0;; it++) {
        if (atomic_load_explicit(&j.done, memory_order_acquire) >= n_tasks &&
            atomic_load_explicit(&j.refs, memory_order_acquire) == 0)
            break;
        if (polite)
            sched_yield(); /* a helper holding a task may be waiting for this core */
        else
            DSIB_CPU_RELAX();
        if ((it & 63u) == 63u) {
            if (!t0) {
                t0 = pool_now_ns();
            } else {
                uint64_t dt = pool_now_ns() - t0;
                if (dt > DSIB_POOL_SPIN_NS) break;
                polite = dt > DSIB_POOL_HOT_NS;
            }
        }
    }
    pthread_mutex_lock(&p->mu);
    pool_unlink(p, &j);
    if (atomic_load_explicit(&j.done, memory_order_acquire) < n_tasks ||
        atomic_load_explicit(&j.refs, memory_order_acquire) > 0) {
        /* asleep until the last helper leaves: it reads done_waiters after its refs
         * decrement, this thread reads refs after the increment (both seq_cst), so one of
         * the two sees the other and the wake-up is never lost */
        atomic_fetch_add_explicit(&p->done_waiters, 1, memory_order_seq_cst);
        while (atomic_load_explicit(&j.done, memory_order_seq_cst) < n_tasks ||
               atomic_load_explicit(&j.refs, memory_order_seq_cst) > 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_fetch_sub_explicit(&p->done_waiters, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&p->mu);
    if (stats) {
        const uint64_t t_end = pool_now_ns();
        STAT_ADD(p, st_wait_ns, t_end - t_own);
        STAT_ADD(p, st_jobs, 1);
        STAT_ADD(p, st_tasks, n_tasks);
        STAT_ADD(p, st_caller_ns, t_end - j.t_submit);
        STAT_ADD(p, st_caller_task_ns, t_own - t_run);
    }
}
