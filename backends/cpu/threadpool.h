/*
 * backends/cpu/threadpool.h — the CPU backend's worker pool.
 *
 * One pool per CPU backend instance (created with the context's thread count). Work is
 * submitted as "run fn(arg, task, ...) for task in [0, n_tasks)"; the submitting thread
 * takes part, so a pool of n threads owns n - 1 worker threads.
 *
 * Concurrency: several threads (e.g. different sessions of one context) may submit at once.
 * Each submission is its own job with its own task counter; idle workers help whichever
 * jobs are open. There is no global state: everything lives in the pool object. A call
 * returns when every task of ITS job has finished.
 *
 * Tasks are handed out dynamically (an atomic counter), so which thread runs a task is not
 * deterministic — callers must make results independent of that (the matmul kernels do:
 * every output element is computed by exactly one task with a fixed operation order).
 *
 * Workers spin briefly after finishing a job before sleeping on a condition variable, so
 * the hundreds of small jobs of one decoded token do not each pay a wake-up.
 *
 * The pool never prints, never aborts. Memory comes from the allocator given at creation.
 */
#ifndef DSIB_CPU_THREADPOOL_H
#define DSIB_CPU_THREADPOOL_H

#include "dsinfer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dsib_threadpool dsib_threadpool;

/* One task. `task` in [0, n_tasks). `slot` in [0, dsib_threadpool_n_threads(pool)) is
 * unique among the threads working on the same job at the same time (the submitter is
 * slot 0), so it can index per-thread scratch that the caller sized for n_threads. */
typedef void (*dsib_task_fn)(void *arg, int64_t task, int32_t slot);

/* Allocator (both or neither; NULL = malloc/free). */
typedef struct dsib_pool_alloc {
    void *(*malloc_fn)(void *alloc_ctx, size_t size);
    void (*free_fn)(void *alloc_ctx, void *ptr);
    void *alloc_ctx;
} dsib_pool_alloc;

/* Creates a pool for `n_threads` threads in total (>= 1; 1 = no worker threads, all work
 * runs on the caller). `alloc` may be NULL. INVALID_ARGUMENT for n_threads < 1 or > 1024,
 * OUT_OF_HOST_MEMORY, INTERNAL if a thread cannot be started (all started threads are
 * joined again). On failure *out is NULL; `msg` (may be NULL, >= 128 bytes) says why. */
dsi_status dsib_threadpool_create(int32_t n_threads, const dsib_pool_alloc *alloc,
                                  dsib_threadpool **out, char *msg, size_t msg_size);

/* Joins the workers and frees the pool. No job may be running. NULL accepted. */
void dsib_threadpool_free(dsib_threadpool *pool);

/* Threads in total (workers + the submitting thread). */
int32_t dsib_threadpool_n_threads(const dsib_threadpool *pool);

/* Scratch memory from the pool's allocator (malloc / free for a NULL pool); NULL when out
 * of memory. [thread-safe] */
void *dsib_threadpool_alloc(dsib_threadpool *pool, size_t size);
void dsib_threadpool_dealloc(dsib_threadpool *pool, void *ptr);

/* Runs fn(arg, task, slot) for every task in [0, n_tasks) and returns when all have
 * finished. n_tasks <= 0 returns at once. n_tasks == 1 (or a NULL pool) runs inline on
 * the caller with slot 0. Order: the tasks are split into contiguous ranges, one per
 * thread (at most 8); a thread runs its own range's tasks in increasing order, then helps
 * with what is left of the others' (also in increasing order), so a thread's consecutive
 * tasks are usually consecutive task ids. [thread-safe]: may be called from several threads
 * at once; must not be called from inside a task (no nesting). */
void dsib_parallel_for(dsib_threadpool *pool, int64_t n_tasks, dsib_task_fn fn, void *arg);

/* Statistics (dsinfer-bench's profile), counted only while enabled:
 *   jobs          submissions that went to the workers (n_tasks > 1, workers present)
 *   inline_jobs   submissions run on the caller alone (n_tasks <= 1 or no workers)
 *   tasks         tasks of the worker jobs; helper_tasks: those the workers ran
 *   wait_ns       time submitters waited, after their own last task, for helpers' tasks
 *                 (the barrier at the end of each job)
 *   pickup_ns     time from a submission to the first helper starting on it (summed over
 *                 the jobs a helper joined: `pickups`)
 *   sleeps        times a worker went to sleep on the condition variable (each costs a
 *                 wake-up later)
 *   caller_ns     time submitters spent inside dsib_parallel_for (inline jobs included)
 *   caller_task_ns  of that, running tasks (their own and the helpers' left-overs, inline
 *                 jobs' tasks too); the rest is the submission, the barrier and its wake-ups
 *   worker_task_ns  time the workers spent running tasks, summed over the workers (their
 *                 visits to jobs whose tasks were all claimed already count as idle)
 * With one submitting thread, (wall − caller_ns) is its time outside the pool (the serial
 * code between jobs) and (n_workers · wall − worker_task_ns) the workers' idle time. */
typedef struct dsib_pool_stats {
    uint64_t jobs, inline_jobs, tasks, helper_tasks, wait_ns, pickup_ns, pickups, sleeps;
    uint64_t caller_ns, caller_task_ns, worker_task_ns;
} dsib_pool_stats;

/* Enables (1) or disables (0) the statistics and resets them. [thread-safe] */
void dsib_threadpool_stats_enable(dsib_threadpool *pool, int on);
/* Current statistics (zeros for a NULL pool). [thread-safe] */
void dsib_threadpool_stats_get(dsib_threadpool *pool, dsib_pool_stats *out);

#endif /* DSIB_CPU_THREADPOOL_H */
