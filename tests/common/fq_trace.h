/*
 * Quantiser traces for the rounding-on comparisons (model-spec §10.1, §10.4).
 *
 * With the §10.1 rounding on, two correct implementations that differ only in float32
 * summation order (or float32 vs float64) agree until a quantiser input lands within their
 * difference of a rounding midpoint; then the two round it to neighbouring grid points and
 * everything downstream legitimately moves. These helpers make that situation checkable
 * instead of excusable:
 *
 *  - fqt_wrap_context() wraps the backend op table of a context (test code only: a copy of
 *    the table whose fake_quant records every call's float32 inputs and outputs, and on a
 *    host-addressable backend can force chosen output elements). Install it before
 *    dsi_model_load, remove it before freeing the context.
 *  - fqt_read_reference() reads the same record written by the NumPy reference
 *    (tests/reference/dsref.py --trace-quant).
 *  - fqt_check_self() checks that every recorded call rounded its own inputs exactly as
 *    §10.1 says (scale and grid, round-to-nearest-even).
 *  - fqt_walk_traces() walks two traces call by call (paired by position or by call order),
 *    requires every quantiser input to agree within FQT_INPUT_ULPS float32 ulps of its
 *    block's largest input, and collects the elements whose rounding decisions differ —
 *    each one a legitimate midpoint flip: both sides rounded their own input correctly and
 *    the inputs agree within that bound, so the midpoint lies between them.
 *  - fqt_converge() re-runs the forced side with the other side's decisions there (fqt_force)
 *    and walks again until nothing differs, so the caller can compare every position tightly.
 */
#ifndef DSI_TEST_FQ_TRACE_H
#define DSI_TEST_FQ_TRACE_H

#include "dsinfer.h"

#include <stddef.h>
#include <stdint.h>

/* Bound on |x_a − x_b| for one quantiser input, in float32 ulps of the largest |x| of its
 * block. Why the block and not the element: the quantiser sees x/s with s a power of two (or
 * an e4m3 value) taken from that largest input, and the inputs come out of float32
 * matmuls / norms / RoPE whose rounding errors scale with the magnitude of the vector, not
 * of each element — a small element of a block carries the block's absolute error (measured:
 * flips of elements 10^-3 of their block's largest, 0.06 e4m3 grid steps apart, with inputs
 * within 20 block ulps). Measured over every quantiser input of 300 positions (docs/
 * CONTRIBUTING.md "Rounding-on comparisons"): libdsinfer's CPU backend vs the NumPy
 * reference (float64, rounded to float32 at the quantiser) 19 ulps for tiny-v41 f32, 75 for
 * tiny-v41 q8_0, 23 for tiny-v4; CPU vs Vulkan (lavapipe) 24. The bound leaves a factor 3
 * over the largest: a float32-resolution difference, about 2^-7 e4m3 grid steps at the top
 * of a block. */
#define FQT_INPUT_ULPS 256.0

/* Sites named by the reference (dsref.py QSITES); the library's calls have site -1. */
enum { FQT_SITE_WINDOW_KV = 0, FQT_SITE_COMPRESSED_KV = 1, FQT_SITE_INDEX_KEY = 2,
       FQT_SITE_INDEX_Q = 3 };

typedef struct fqt_call {
    int64_t pos;       /* position (fqt_set_pos / reference), -1 if unknown */
    int32_t layer;     /* reference only; -1 for the library */
    int32_t site;      /* reference only; -1 for the library */
    int32_t recipe;    /* DSIB_FQ_* */
    uint32_t block;
    uint32_t n;        /* elements (rows × ncols of the call) */
    uint32_t ncols;    /* elements per row (library calls; the reference's have one row) */
    uint32_t ordinal;  /* call number since fqt_record() */
    float *x, *out;    /* inputs before, outputs after the call */
} fqt_call;

typedef struct fqt_trace {
    fqt_call *c;
    size_t n, cap;
} fqt_trace;

void fqt_free(fqt_trace *t);

/* A forced decision: output element `elem` of call `ordinal` is set to `value`. */
typedef struct fqt_force {
    uint32_t ordinal, elem;
    float value;
} fqt_force;

/* Wraps ctx's backend op table (before dsi_model_load). Returns 0 on success. At most two
 * contexts at once. */
int fqt_wrap_context(dsi_context *ctx);
void fqt_unwrap_context(dsi_context *ctx);
/* Starts recording into t (NULL: stops); resets the call counter. */
void fqt_record(fqt_trace *t);
/* Position of the calls that follow. */
void fqt_set_pos(int64_t pos);
/* 1 if a capture failed since fqt_record (out of memory, device copy or download). */
int fqt_capture_failed(void);
/* Decisions forced from now on (host-addressable backends only; the list is copied). */
void fqt_set_forces(const fqt_force *f, size_t n);

/* Reads a dsref.py --trace-quant file; 0 on success (message printed otherwise). */
int fqt_read_reference(const char *path, fqt_trace *t);

/* Checks every call of t against §10.1 applied to its own inputs. Elements forced by
 * `forced` (may be NULL) are exempt. own_ulps: how far (float32 ulps of x/s) from a midpoint
 * a side may round the other way (0: exactly as specified). Returns the number of wrong
 * elements (the first few printed, prefixed by `who`). */
size_t fqt_check_self(const fqt_trace *t, const char *who, double own_ulps,
                      const fqt_force *forced, size_t n_forced);

/* Pairs the calls of a with those of b. FQT_PAIR_ORDER: call i with call i (same code
 * path, e.g. two backends); FQT_PAIR_POSITION: within each position, every call of b with
 * the unused call of a of the same recipe / block / size whose inputs are closest. pair[i]
 * receives b's index for a's call i, or -1 (a call b does not make). Returns 0 if every call
 * of b found a partner (else prints why and returns -1). */
enum { FQT_PAIR_ORDER = 0, FQT_PAIR_POSITION = 1 };
int fqt_pair(const fqt_trace *a, const fqt_trace *b, int mode, long *pair);

typedef struct fqt_walk {
    fqt_force *flips;       /* b's decisions where a's differ (malloc'd; caller frees) */
    size_t n_flips, cap;
    size_t n_flip_calls;    /* 1 if there are any (they are in one call) */
    int64_t first_pos;      /* their position, -1 if none */
    long beyond;            /* first call of a whose inputs differ beyond FQT_INPUT_ULPS (the
                               walk stops there), -1 if none */
    char beyond_msg[512];
    double worst_ulps;      /* largest |x_a − x_b| seen (FQT units) */
    char worst_at[96];      /* where: "position P layer L site S" */
    size_t n_unpaired;      /* calls of a without a partner in b */
} fqt_walk;

/* Walks a and b (paired) in a's order up to the first call whose decisions differ, and
 * returns that call's differing decisions (printed), or stops at the first call whose inputs
 * differ beyond the bound. */
fqt_walk fqt_walk_traces(const fqt_trace *a, const fqt_trace *b, const long *pair,
                         const char *name_a, const char *name_b);

typedef struct fqt_result {
    int ok;                 /* converged: no unexplained difference, flips within the limit */
    size_t n_flips;         /* elements forced to b's decision */
    size_t n_flip_calls;    /* quantiser calls that held them (one re-run each) */
    size_t runs;            /* runs of side a */
    size_t n_unpaired;      /* calls of a that b does not make */
    int64_t first_flip_pos; /* -1: none */
    double worst_ulps;      /* largest input difference seen (FQT units) */
    char worst_at[96];
} fqt_result;

/* The whole procedure: runs side a through run(user, logits) (which sets positions with
 * fqt_set_pos and writes all logits), checks its quantiser calls against §10.1, pairs them
 * with b's (already checked by the caller), and while their decisions differ somewhere —
 * each difference explained as above — re-runs a with b's decisions forced there. On
 * success `logits` holds a's logits of the last run (with every flip forced), which the
 * caller compares tightly with b's at every position. */
fqt_result fqt_converge(int (*run)(void *user, float *logits), void *user, float *logits,
                        const fqt_trace *b, int pair_mode, size_t max_flips,
                        const char *name_a, const char *name_b);

#endif
