/* Engram disk tier: a small pool of reader threads for dsii_engram_gather (issue 17 "Memory
 * tiers", docs/placement.md). Generic over the work: a caller hands in n items and a function;
 * the pool's threads and the caller itself claim items with one atomic counter until none is
 * left or one item asks to stop; the call returns when every thread that joined has left. */
#include "engram/engram.h"

atomic_int dsii_engram_readers_test;

typedef struct rd_batch {
    struct rd_batch *next;
    int (*fn)(void *arg, size_t k);
    void *arg;
    size_t n;
    atomic_size_t next_k;
    atomic_int stop;
    int helpers;      /* pool threads inside (under mu) */
    int max_helpers;
    int queued;       /* in the pool's queue (under mu) */
} rd_batch;

struct dsii_engram_readers {
    const dsi_context *ctx;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    rd_batch *head;
    int stop;
    int32_t n_threads;
    atomic_ullong wakes; /* batches handed to the threads (a read proved slow) */
    pthread_t th[DSII_ENGRAM_MAX_READERS];
};

static void batch_work(rd_batch *b) {
    while (!atomic_load_explicit(&b->stop, memory_order_relaxed)) {
        size_t k = atomic_fetch_add_explicit(&b->next_k, 1, memory_order_relaxed);
        if (k >= b->n) break;
        if (b->fn(b->arg, k)) atomic_store_explicit(&b->stop, 1, memory_order_relaxed);
    }
}

/* Unlinks b from the queue (under mu). */
static void batch_unqueue(dsii_engram_readers *r, rd_batch *b) {
    for (rd_batch **p = &r->head; *p; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            break;
        }
    b->queued = 0;
}

static void *reader_main(void *arg) {
    dsii_engram_readers *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && !r->head) pthread_cond_wait(&r->work_cv, &r->mu);
        if (r->stop) break;
        rd_batch *b = r->head;
        if (++b->helpers >= b->max_helpers) batch_unqueue(r, b);
        pthread_mutex_unlock(&r->mu);
        batch_work(b);
        pthread_mutex_lock(&r->mu);
        if (--b->helpers == 0) pthread_cond_broadcast(&r->done_cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

dsi_status dsii_engram_readers_create(const dsi_context *ctx, int32_t n_threads,
                                      dsii_engram_readers **out, dsii_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > DSII_ENGRAM_MAX_READERS)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "engram readers: %d threads", (int)n_threads);
    dsii_engram_readers *r = dsii_calloc(ctx, 1, sizeof *r);
    if (!r) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "engram readers: out of host memory");
    r->ctx = ctx;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work_cv, NULL);
    pthread_cond_init(&r->done_cv, NULL);
    for (int32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&r->th[i], NULL, reader_main, r) != 0) break;
        r->n_threads++;
    }
    if (r->n_threads == 0) {
        /* no thread: the gathers stay serial, which is correct, only slower */
        dsii_log(ctx, DSI_LOG_WARN, "engram readers: no reader thread; Engram reads stay serial");
        dsii_engram_readers_free(r);
        return DSI_OK;
    }
    *out = r;
    return DSI_OK;
}

void dsii_engram_readers_free(dsii_engram_readers *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->work_cv);
    pthread_mutex_unlock(&r->mu);
    for (int32_t i = 0; i < r->n_threads; i++) pthread_join(r->th[i], NULL);
    pthread_cond_destroy(&r->work_cv);
    pthread_cond_destroy(&r->done_cv);
    pthread_mutex_destroy(&r->mu);
    dsii_free(r->ctx, r);
}

int32_t dsii_engram_readers_count(const dsii_engram_readers *r) { return r ? r->n_threads : 0; }

uint64_t dsii_engram_readers_wakes(const dsii_engram_readers *r) {
    return r ? atomic_load_explicit(&r->wakes, memory_order_relaxed) : 0;
}

void dsii_engram_readers_run(dsii_engram_readers *r, size_t n, int (*fn)(void *arg, size_t k),
                             void *arg) {
    rd_batch b;
    b.next = NULL;
    b.fn = fn;
    b.arg = arg;
    b.n = n;
    atomic_init(&b.next_k, 0);
    atomic_init(&b.stop, 0);
    b.helpers = 0;
    /* the caller reads too: at most n - 1 helpers, so none joins only to find nothing left */
    b.max_helpers = r ? (n - 1 < (size_t)r->n_threads ? (int)(n - 1) : r->n_threads) : 0;
    b.queued = 0;
    int woke = 0;
    const uint32_t slow_test = atomic_load_explicit(&dsii_engram_slow_read_ns_test, memory_order_relaxed);
    const uint64_t slow_ns = slow_test ? slow_test : DSII_ENGRAM_SLOW_READ_NS;
    if (b.max_helpers > 0) {
        /* alone first: fast reads (page cache) never pay for waking the pool */
        while (!atomic_load_explicit(&b.stop, memory_order_relaxed)) {
            size_t k = atomic_fetch_add_explicit(&b.next_k, 1, memory_order_relaxed);
            if (k >= b.n) break;
            const uint64_t t0 = dsii_time_ns();
            if (b.fn(b.arg, k)) atomic_store_explicit(&b.stop, 1, memory_order_relaxed);
            else if (k + 1 < b.n && dsii_time_ns() - t0 > slow_ns) {
                woke = 1;
                break;
            }
        }
    }
    if (woke) {
        atomic_fetch_add_explicit(&r->wakes, 1, memory_order_relaxed);
        pthread_mutex_lock(&r->mu);
        rd_batch **p = &r->head;
        while (*p) p = &(*p)->next;
        *p = &b;
        b.queued = 1;
        pthread_cond_broadcast(&r->work_cv);
        pthread_mutex_unlock(&r->mu);
    }
    batch_work(&b);
    if (woke) {
        pthread_mutex_lock(&r->mu);
        if (b.queued) batch_unqueue(r, &b);
        while (b.helpers > 0) pthread_cond_wait(&r->done_cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
    }
}

/* ---- overlapped gathers (issue 17): one helper thread per lane --------------------------------
 * The lane's step thread starts a batch (the step's gathers, in the order the step needs
 * them), waits for each job right before the op that reads its rows, and finishes the batch
 * (waits for all of it) before the step returns. Everything the helper shares with the step
 * thread is under mu: the jobs are copied in at start; a job's rows / dst belong to the helper
 * from start until its `done` is published under mu, which orders its writes before the
 * step thread's reads. */

atomic_int dsii_engram_overlap_test;
_Atomic uint32_t dsii_engram_inline_ns_test;
_Atomic uint32_t dsii_engram_slow_read_ns_test;
_Atomic(dsii_engram_probe_fn) dsii_engram_step_probe;

struct dsii_engram_async {
    const dsi_context *ctx;        /* the helper's own allocations */
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* start, job done, batch done, stop (broadcast) */
    pthread_t th;
    int stop;
    int pending;                   /* a started batch the helper has not taken yet */
    int running;                   /* started and not finished (step thread's view) */
    int busy;                      /* the helper is inside a batch */
    uint64_t last_ns;              /* the last batch's wall time (helper) */
    const dsi_context *job_ctx;
    uint32_t n_jobs, n_done;       /* jobs of the batch; jobs done, in order */
    dsii_engram_job jobs[DSII_ENGRAM_ASYNC_MAX];
    dsi_status st[DSII_ENGRAM_ASYNC_MAX];
    dsii_error err[DSII_ENGRAM_ASYNC_MAX];
};

static void *async_main(void *arg) {
    dsii_engram_async *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && !a->pending) pthread_cond_wait(&a->cv, &a->mu);
        if (!a->pending) break; /* stop, nothing left to run */
        a->pending = 0;
        a->busy = 1;
        const uint64_t t0 = dsii_time_ns();
        const uint32_t n = a->n_jobs;
        for (uint32_t k = 0; k < n; k++) {
            const dsii_engram_job j = a->jobs[k];
            const dsi_context *jctx = a->job_ctx;
            pthread_mutex_unlock(&a->mu);
            dsii_error e;
            e.status = DSI_OK;
            e.msg[0] = 0;
            dsi_status s = dsii_engram_gather_c(jctx, j.t, j.rows, j.n, j.dst, j.cancel, &e);
            pthread_mutex_lock(&a->mu);
            a->st[k] = s;
            a->err[k] = e;
            a->n_done = k + 1;
            pthread_cond_broadcast(&a->cv);
        }
        a->busy = 0;
        a->last_ns = dsii_time_ns() - t0;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

dsi_status dsii_engram_async_create(const dsi_context *ctx, dsii_engram_async **out,
                                    dsii_error *err) {
    *out = NULL;
    dsii_engram_async *a = dsii_calloc(ctx, 1, sizeof *a);
    if (!a) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "engram overlap: out of host memory");
    a->ctx = ctx;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->th, NULL, async_main, a) != 0) {
        /* no helper: the gathers run before the step, which is correct, only slower */
        dsii_log(ctx, DSI_LOG_WARN, "engram overlap: no helper thread; Engram rows are gathered "
                                    "before each step");
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        dsii_free(ctx, a);
        return DSI_OK;
    }
    *out = a;
    return DSI_OK;
}

void dsii_engram_async_free(dsii_engram_async *a) {
    if (!a) return;
    dsii_error e;
    dsii_engram_async_finish(a, &e);
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->th, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    dsii_free(a->ctx, a);
}

void dsii_engram_async_start(dsii_engram_async *a, const dsi_context *ctx,
                             const dsii_engram_job *jobs, uint32_t n) {
    if (n > DSII_ENGRAM_ASYNC_MAX) n = DSII_ENGRAM_ASYNC_MAX; /* callers check */
    pthread_mutex_lock(&a->mu);
    for (uint32_t k = 0; k < n; k++) {
        a->jobs[k] = jobs[k];
        a->st[k] = DSI_OK;
    }
    a->job_ctx = ctx;
    a->n_jobs = n;
    a->n_done = 0;
    a->running = 1;
    a->pending = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

dsi_status dsii_engram_async_wait(dsii_engram_async *a, uint32_t k, dsii_error *err) {
    pthread_mutex_lock(&a->mu);
    if (!a->running || k >= a->n_jobs) {
        pthread_mutex_unlock(&a->mu);
        return dsii_fail(err, DSI_ERR_INTERNAL, "engram overlap: no job %u running", (unsigned)k);
    }
    while (a->n_done <= k) pthread_cond_wait(&a->cv, &a->mu);
    dsi_status s = a->st[k];
    if (s != DSI_OK) dsii_fail(err, s, "%s", a->err[k].msg);
    pthread_mutex_unlock(&a->mu);
    return s;
}

dsi_status dsii_engram_async_finish(dsii_engram_async *a, dsii_error *err) {
    pthread_mutex_lock(&a->mu);
    if (!a->running) {
        pthread_mutex_unlock(&a->mu);
        return DSI_OK;
    }
    while (a->pending || a->busy) pthread_cond_wait(&a->cv, &a->mu);
    a->running = 0;
    dsi_status s = DSI_OK;
    for (uint32_t k = 0; k < a->n_jobs && s == DSI_OK; k++)
        if (a->st[k] != DSI_OK) {
            s = a->st[k];
            dsii_fail(err, s, "%s", a->err[k].msg);
        }
    pthread_mutex_unlock(&a->mu);
    return s;
}

uint64_t dsii_engram_async_last_ns(const dsii_engram_async *a) {
    if (!a) return 0;
    pthread_mutex_lock((pthread_mutex_t *)(uintptr_t)&a->mu);
    const uint64_t ns = a->last_ns;
    pthread_mutex_unlock((pthread_mutex_t *)(uintptr_t)&a->mu);
    return ns;
}

int dsii_engram_async_running(const dsii_engram_async *a) {
    if (!a) return 0;
    pthread_mutex_lock((pthread_mutex_t *)(uintptr_t)&a->mu);
    int r = a->running;
    pthread_mutex_unlock((pthread_mutex_t *)(uintptr_t)&a->mu);
    return r;
}
