/*
 * Shared helpers of the model tests (tests/model/): locating the tiny models, running the
 * NumPy reference (tests/reference/dsref.py, used only through its CLI), sessions with all
 * logits, comparisons.
 */
#ifndef DSI_MODEL_TEST_UTIL_H
#define DSI_MODEL_TEST_UTIL_H

#include "dsinfer.h"

#include <stddef.h>
#include <stdint.h>


/* Path of a model in $DSI_MODELS_DIR (or the override env var `override`, for local runs);
 * NULL if the file does not exist. Static buffer. */
const char *mt_model_path(const char *file, const char *override);

/* Generates a model with $DSI_MKMODEL --config <config> --type <type> -o <out> (out in
 * $DSI_BUILD_DIR/tests/model/). Returns the path (static buffer) or NULL (reason printed;
 * *absent set to 1 when there is no dsinfer-mkmodel in this build, 0 when it failed). */
const char *mt_mkmodel(const char *config, const char *type, const char *out_name,
                       int *absent);

/* The reference CLI: 0 if it can run; -1 if dsref.py is missing from the source tree
 * ($DSI_SOURCE_DIR, a failure); 1 if $DSI_PYTHON with NumPy is absent (a skip). */
int mt_reference_status(void);
const char *mt_python(void);

/* Runs the reference on `tokens` and returns its logits [n][n_vocab] (caller frees), or
 * NULL (message printed). qtrace: file for --trace-quant (tests/common/fq_trace.h), or NULL. */
float *mt_reference(const char *model, const dsi_token *tokens, size_t n, int32_t n_vocab,
                    int no_fake_quant, const char *qtrace);

/* Deterministic pseudo-random tokens in [0, n_vocab). */
void mt_tokens(dsi_token *out, size_t n, int32_t n_vocab, uint32_t seed);

/* Opens a CPU context (n_threads) and loads the model; returns 0 on success. mt_open_traced
 * wraps the context's op table first (fqt_wrap_context; mt_close unwraps). */
int mt_open(const char *path, int32_t n_threads, dsi_context **ctx, dsi_model **model);
int mt_open_traced(const char *path, int32_t n_threads, dsi_context **ctx, dsi_model **model);
void mt_close(dsi_context *ctx, dsi_model *model);

/* New session; n_ctx, n_batch, flags. NULL on failure (message printed). */
dsi_session *mt_session(dsi_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t flags);

/* Appends tokens to a fresh session of chunk size n_batch and returns all logits [n][V]. */
float *mt_all_logits(dsi_model *m, const dsi_token *tokens, size_t n, uint32_t n_batch,
                     uint32_t flags, uint32_t n_ctx);

typedef struct mt_cmp {
    size_t n_argmax_diff;      /* positions whose argmax differs */
    long first_argmax_diff;    /* -1 if none */
    double max_abs;            /* max |Δlogit| over everything */
    double max_rel;            /* max over positions of max|Δ| / (max - min of reference row) */
    long worst_pos;
    long first_over;           /* first position whose rel. error exceeds `tol_rel`, or -1 */
} mt_cmp;

mt_cmp mt_compare(const float *a, const float *ref, size_t n, int32_t V, double tol_rel);
size_t mt_argmax(const float *row, int32_t V);

#endif
