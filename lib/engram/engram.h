/*
 * Engram (DeepSeek V4.1, model-spec §4.6): n-gram hashing and table access.
 *
 * Two halves:
 *   - hashing: pure functions from token ids to table row ids. The layout (compressed token
 *     map, odd multipliers, prime moduli, offsets) comes from the model file; the prime search
 *     that produced the release values is here too so that tests (and the model writer) can
 *     recompute them from engram_vocab_size.
 *   - table access: a small interface that gathers rows from wherever the table lives and
 *     returns them dequantized and rounded to bf16. Placements: host memory used in place
 *     (mmapped file, CPU backend) and pread from the model file; device / pinned-host
 *     placements plug in behind the same call later.
 *
 * See docs/engram.md.
 */
#ifndef DSI_ENGRAM_ENGRAM_H
#define DSI_ENGRAM_ENGRAM_H

#include <pthread.h>
#include <stdatomic.h>
#include "base/base.h"
#include "base/file.h"

#include <stddef.h>
#include <stdint.h>

#define DSII_ENGRAM_MAX_NGRAM 8   /* release: 4 */
#define DSII_ENGRAM_MAX_HEADS 64  /* release: 8 */
#define DSII_ENGRAM_MAX_COLS ((DSII_ENGRAM_MAX_NGRAM - 1) * DSII_ENGRAM_MAX_HEADS)

/* Hash layout of one Engram layer. `cmap` is borrowed (the model owns it). */
typedef struct dsii_engram_layout {
    int32_t n_heads;                  /* hash heads per n-gram size */
    int32_t max_ngram;                /* largest n (n-grams 2..max_ngram) */
    int32_t n_cols;                   /* (max_ngram - 1) * n_heads; col = (n-2)*n_heads + head */
    int32_t pad_cid;                  /* COMPRESSED id used beyond the sequence start
                                         (= cmap[pad token]; the file stores it, model-files.md §2.4) */
    int64_t compressed_vocab;         /* number of distinct compressed ids */
    int64_t n_vocab;                  /* entries of cmap */
    const int32_t *cmap;              /* raw token id -> compressed id */
    uint64_t n_rows;                  /* rows of the layer's table */
    uint64_t multipliers[DSII_ENGRAM_MAX_NGRAM]; /* one per look-back k = 0..max_ngram-1 */
    uint64_t primes[DSII_ENGRAM_MAX_COLS];
    uint64_t offsets[DSII_ENGRAM_MAX_COLS];
} dsii_engram_layout;

/* Validates a layout read from a file (BAD_FORMAT naming `what` and the offending value):
 * sizes within the limits above, n_cols consistent, every cmap entry in
 * [0, compressed_vocab), pad_cid in [0, compressed_vocab), multipliers odd with
 * multiplier * (compressed_vocab - 1) representable in int64 (§4.6 "no overflow by
 * construction"), primes >= 2, every column range [offset, offset + prime) inside n_rows,
 * n_rows <= UINT32_MAX (row ids are 32-bit on every backend). */
dsi_status dsii_engram_layout_check(const dsii_engram_layout *l, const char *what,
                                    dsii_error *err);

/* Multiplier bound of §4.6: (INT64_MAX / compressed_vocab) / 2. Release: 46539438283891. */
uint64_t dsii_engram_multiplier_bound(int64_t compressed_vocab);

/* Deterministic primality test for n < 2^64. */
int dsii_engram_is_prime(uint64_t n);

/* The prime layout of §4.6 for `n_layers` Engram layers (in layer order): for each layer,
 * for each n-gram size 2..max_ngram, the search restarts at vocab_size - 1 and, for each
 * head, takes the next prime above the previous one that no earlier column of any layer
 * used. Writes n_layers * (max_ngram - 1) * n_heads primes to `out` (layer-major, then
 * column order). Returns 0 on bad arguments, 1 on success. */
int dsii_engram_find_primes(uint64_t vocab_size, int32_t n_layers, int32_t max_ngram,
                            int32_t n_heads, uint64_t *out);

/* Row ids for `n` consecutive positions (§4.6 "Hash per position").
 * `hist` holds the n_hist raw tokens immediately before tokens[0], oldest first
 * (n_hist <= max_ngram - 1; fewer than max_ngram - 1 means the sequence starts there, so
 * farther look-backs are pad_cid). Tokens must be valid ids (< n_vocab; the caller
 * checked them). Writes rows[i * n_cols + col]. */
void dsii_engram_hash(const dsii_engram_layout *l, const int32_t *hist, int32_t n_hist,
                      const int32_t *tokens, int64_t n, uint32_t *rows);

/* The n-gram history a session carries across calls: the last (max_ngram - 1) raw tokens of
 * the timeline, oldest first. */
typedef struct dsii_engram_history {
    int32_t n;                                 /* valid entries */
    int32_t tok[DSII_ENGRAM_MAX_NGRAM - 1];
} dsii_engram_history;

/* Rebuilds the history from the last tokens of a timeline tokens[0..n). */
void dsii_engram_history_set(dsii_engram_history *h, int32_t max_ngram, const int32_t *tokens,
                             int64_t n);
/* Appends tokens (keeps the last max_ngram - 1). */
void dsii_engram_history_push(dsii_engram_history *h, int32_t max_ngram,
                              const int32_t *tokens, int64_t n);

/* ---- table access --------------------------------------------------------------------- */

enum {
    DSII_ENGRAM_PLACE_HOST = 0,  /* rows readable in place (mmap / memory) */
    DSII_ENGRAM_PLACE_PREAD = 1  /* rows read from the file on demand */
};

/* Internal storage type of ds4's Engram rows (model-spec §5.2, encoding
 * "e4m3_e8m0_32_row264"): per row, K E4M3FN bytes, then K/32 E8M0 scales (scale j covers
 * values 32j … 32j+31). Stored in the file as I8 [K + K/32, rows]; the loader binds it with
 * this id and ne[0] = K. Far above ggml's and libdsinfer's public ids; never in a file. */
#define DSII_TYPE_ENGRAM_ROW264 2048

/* A row cache for a table read from the file (lib/place, docs/placement.md): direct-mapped,
 * `n_rows` raw rows, row r in slot r mod n_rows; one lock per cache. Counters may be NULL. */
typedef struct dsii_engram_cache {
    pthread_mutex_t mu;
    uint64_t n_rows;
    uint64_t *tag;         /* row id + 1 per slot, 0 = empty */
    uint8_t *data;         /* n_rows × row_bytes */
    atomic_ullong *hits, *misses, *bytes_read;
} dsii_engram_cache;

/* Parallel readers for the disk tier (issue 17, docs/placement.md): a pool of threads that a
 * gather with two or more rows to read from the file hands the rest of its reads to once one
 * read proves slow (dsii_engram_readers_run; the calling thread reads too). One pool per model, shared by its tables and sessions; several gathers may use
 * it at once. DSII_ENGRAM_READERS threads by default: Engram gathers are small (release
 * decode: 24 rows of 264 bytes per table per step), so a few reads in flight cover an NVMe
 * drive's latency while idle threads cost nothing but their stacks. */
#define DSII_ENGRAM_READERS 4
#define DSII_ENGRAM_MAX_READERS 16
typedef struct dsii_engram_readers dsii_engram_readers;

/* Starts n_threads (1..DSII_ENGRAM_MAX_READERS) threads. If none can be started, logs a
 * warning and returns DSI_OK with *out NULL (gathers stay serial). */
dsi_status dsii_engram_readers_create(const dsi_context *ctx, int32_t n_threads,
                                      dsii_engram_readers **out, dsii_error *err);
/* Stops and joins the threads (no gather may be running). NULL accepted. */
void dsii_engram_readers_free(dsii_engram_readers *r);
int32_t dsii_engram_readers_count(const dsii_engram_readers *r);
/* How many batches dsii_engram_readers_run handed to the threads (a read proved slow). */
uint64_t dsii_engram_readers_wakes(const dsii_engram_readers *r);
/* Runs fn(arg, k) for k in [0, n) on the calling thread and up to min(n - 1, threads) pool
 * threads; items are claimed in increasing k; once an fn returns nonzero no further item is
 * claimed. Returns when every item claimed is done and no pool thread holds the batch.
 * r may be NULL (all on the caller). [thread-safe]
 * The caller starts alone and wakes the pool only when one item took longer than
 * DSII_ENGRAM_SLOW_READ_NS with items left: a read that waited for a device (NVMe: 50-100
 * us and more) lets the rest overlap, while rows from the page cache (a few microseconds
 * each) are read with no hand-over — on a machine whose cores all run the compute pool,
 * waking reader threads and waiting for them to leave cost milliseconds (scheduler ticks),
 * far more than the reads (docs/placement.md "Parallel readers"). */
#define DSII_ENGRAM_SLOW_READ_NS 40000u
/* Tests only (not API): when non-zero, the slow-read threshold in ns instead of
 * DSII_ENGRAM_SLOW_READ_NS (test_place's adaptive-overlap test: an in-memory read preempted
 * for 40 us on a busy machine must not wake the readers there). */
extern _Atomic uint32_t dsii_engram_slow_read_ns_test;
void dsii_engram_readers_run(dsii_engram_readers *r, size_t n, int (*fn)(void *arg, size_t k),
                             void *arg);
/* Tests only (not API): the reader threads of models loaded from now on. 0: the default
 * (DSII_ENGRAM_READERS); 1: no pool, the serial path; n > 1: n threads. */
extern atomic_int dsii_engram_readers_test;

typedef struct dsii_engram_table {
    int32_t placement;     /* DSII_ENGRAM_PLACE_* */
    int32_t type;          /* storage type of a row (DSI_TYPE_*, or DSII_TYPE_ENGRAM_ROW264) */
    int64_t row_elems;     /* elements per row (engram head_dim) */
    uint64_t n_rows;
    uint64_t row_bytes;
    const uint8_t *host;   /* PLACE_HOST: first row */
    const dsii_file *file; /* PLACE_PREAD */
    uint64_t file_offset;
    dsii_engram_cache *cache; /* PLACE_PREAD: a row cache, or NULL */
    dsii_engram_readers *readers; /* PLACE_PREAD: parallel readers (borrowed), or NULL */
} dsii_engram_table;

/* A table whose rows lie in host memory (e.g. the mapped model file). */
dsi_status dsii_engram_table_host(dsii_engram_table *t, int32_t type, int64_t row_elems,
                                  uint64_t n_rows, const void *data, dsii_error *err);
/* A table read from `f` at `offset` with positioned reads (any dsii_file mode). */
dsi_status dsii_engram_table_file(dsii_engram_table *t, int32_t type, int64_t row_elems,
                                  uint64_t n_rows, const dsii_file *f, uint64_t offset,
                                  dsii_error *err);

/* Gathers rows[0..n) into dst[n][row_elems]: each row dequantized to f32; rows of FP8 tables
 * are then rounded to bf16 (RNE), as the reference's bf16 embedding does (§4.6 step 1);
 * F32 / F16 / BF16 tables (debug files) are used as stored. A row id >= n_rows is
 * INTERNAL (the hash never produces one for a checked layout). `ctx` is used for the
 * scratch of the pread placement (may be NULL).
 * Pread placement with `readers` and two or more rows to read from the file (rows not in
 * the cache): the reads run on the readers, with the same results as the serial path —
 * data, cache contents and counters (the row cache's lock is held for the whole gather).
 * A failed read is IO / BAD_FORMAT naming the row and its offset (the first failing row in
 * order); the call returns after every reader is done. On failure the cache slots the
 * gather was filling are left empty and its counters are not added (the serial path counts
 * the rows before the failing one). */
dsi_status dsii_engram_gather(const dsi_context *ctx, const dsii_engram_table *t,
                              const uint32_t *rows, size_t n, float *dst, dsii_error *err);
/* The same, and a read from the file is not started once *cancel is nonzero: the gather
 * then fails with CANCELLED (as a failed read: cache slots it was filling left empty).
 * cancel NULL: dsii_engram_gather. */
dsi_status dsii_engram_gather_c(const dsi_context *ctx, const dsii_engram_table *t,
                                const uint32_t *rows, size_t n, float *dst,
                                const atomic_int *cancel, dsii_error *err);

/* Overlapped gathers (issue 17, docs/placement.md "Engram overlap"): a helper thread that
 * runs a step's gathers, one job after the other in the order given, while the step's first
 * layers run; the step waits for job k right before the first op that reads its rows. Each
 * job is one dsii_engram_gather (so it uses the tables' parallel readers). One helper per
 * lane (execution context): a batch is started, waited for job by job, and finished by the
 * one thread that drives the lane's steps. */
#define DSII_ENGRAM_ASYNC_MAX 16
typedef struct dsii_engram_job {
    const dsii_engram_table *t;
    const uint32_t *rows;  /* [n], read by the helper until the job is done */
    size_t n;
    float *dst;            /* [n][row_elems], written by the helper until the job is done */
    const atomic_int *cancel; /* stops the job's reads (CANCELLED), or NULL */
} dsii_engram_job;
typedef struct dsii_engram_async dsii_engram_async;

/* Starts the helper thread. If it cannot be started, logs a warning and returns DSI_OK with
 * *out NULL (the caller gathers synchronously). */
dsi_status dsii_engram_async_create(const dsi_context *ctx, dsii_engram_async **out,
                                    dsii_error *err);
/* Finishes a running batch (its result is dropped), stops and joins the thread. NULL
 * accepted. */
void dsii_engram_async_free(dsii_engram_async *a);
/* Hands jobs[0..n) (n <= DSII_ENGRAM_ASYNC_MAX; copied) to the helper, which runs them in
 * order with `ctx` for scratch. A batch started must be finished before the next one. */
void dsii_engram_async_start(dsii_engram_async *a, const dsi_context *ctx,
                             const dsii_engram_job *jobs, uint32_t n);
/* Waits until job k of the running batch is done; its status (and message in *err). */
dsi_status dsii_engram_async_wait(dsii_engram_async *a, uint32_t k, dsii_error *err);
/* Waits for every job of the running batch (the helper is idle afterwards) and returns the
 * status of the first failing job in job order, with its message in *err (DSI_OK: none).
 * No-op (DSI_OK) without a running batch. */
dsi_status dsii_engram_async_finish(dsii_engram_async *a, dsii_error *err);
/* Whether a batch is running (started, not finished). */
int dsii_engram_async_running(const dsii_engram_async *a);
/* Wall time (ns) the helper spent on the last finished batch, from taking it to its last job
 * done; 0 before any. [after dsii_engram_async_finish, by the lane's thread] */
uint64_t dsii_engram_async_last_ns(const dsii_engram_async *a);

/* When the overlap pays (docs/placement.md "Engram overlap"): it hides reads that wait for a
 * device, but on a machine whose cores all run the compute pool the helper's hand-over —
 * a wake-up, a time slice taken from a compute thread, a wake-up back — costs more than
 * copying rows from the page cache. So a lane gathers on the step thread itself once
 * DSII_ENGRAM_INLINE_AFTER overlapped batches in a row each took at most the inline budget
 * — max(DSII_ENGRAM_INLINE_NS, 1/32 of the last step's time): what the overlap could hide
 * is then at most ~3 % of a step — and goes back to the overlap as soon as a gather on the
 * step thread takes longer. The rows, and so the logits, are the same either way. */
#define DSII_ENGRAM_INLINE_NS 100000u
#define DSII_ENGRAM_INLINE_AFTER 4u

/* Tests only (not API): when non-zero, the inline budget in ns instead of
 * DSII_ENGRAM_INLINE_NS (test_place's adaptive-overlap test sets a budget far from both its
 * fast, in-memory reads and its 20 ms slow ones, so the verdicts do not depend on how busy
 * the machine or how slow a sanitizer build is). */
extern _Atomic uint32_t dsii_engram_inline_ns_test;
/* Tests only (not API): the overlap of models loaded from now on. 0: the default (overlapped
 * where it applies: CPU backend, tables in the disk tier); 1: off, every gather before the
 * step as before issue 17's overlap (the A/B switch). */
extern atomic_int dsii_engram_overlap_test;
/* Tests only: when set, the V4.1 forward pass calls it at the start of every layer of a step
 * that has Engram layers (on the thread running the step), before that layer's first op. */
typedef void (*dsii_engram_probe_fn)(uint32_t layer);
extern _Atomic(dsii_engram_probe_fn) dsii_engram_step_probe;

#endif /* DSI_ENGRAM_ENGRAM_H */
