/*
 * lib/arch/arch.h — the internal per-architecture interface the session layer calls.
 *
 * One dsii_arch table per GGUF architecture (deepseek4: dsv4.c, deepseek41: dsv41.c). The
 * session layer (lib/api/session.c) owns the token timeline, chunking into prefill steps,
 * cancellation and logits; an architecture owns the per-session model state (window rings,
 * compressed rows, index keys, compressor state, Engram history, ...) which lives in
 * backend buffers, and evaluates tokens by calling backend ops only (backends/backend.h).
 *
 * Rewind rule (docs/internals.md "Rewinds"): all per-session state is either append-only
 * arrays indexed by position (compressed rows, index keys) or rings that keep the last
 * (span + margin) positions (window ring, compressor token rows). Truncating the timeline
 * from `cur` to `len` tokens is exact iff cur − len <= the state's rewind margin; otherwise
 * the session layer resets the state and re-evaluates the kept prefix ("rebuild").
 */
#ifndef DSI_ARCH_H
#define DSI_ARCH_H

#include "base/base.h"

#include <stdint.h>

typedef struct dsii_arch_state dsii_arch_state; /* per-session, defined by each arch */

/* Session-level parameters handed to state_create. */
typedef struct dsii_arch_params {
    uint32_t n_ctx;          /* maximum timeline length */
    uint32_t n_batch;        /* maximum tokens per eval call */
    uint32_t flags;          /* DSI_SESSION_FLAG_* */
    uint32_t rewind_margin;  /* extra ring rows kept for exact rewinds (0 = default) */
} dsii_arch_params;

/* Logits requested from eval. */
enum {
    DSII_LOGITS_NONE = 0,    /* no readback (intermediate prefill chunks) */
    DSII_LOGITS_LAST = 1,    /* the last token's row: n_vocab floats */
    DSII_LOGITS_ALL = 2      /* every evaluated token: n × n_vocab floats */
};

typedef struct dsii_arch {
    const char *name;        /* "deepseek4" / "deepseek41" */

    /* Allocates per-session state (all device buffers sized for p->n_ctx / p->n_batch). */
    dsi_status (*state_create)(dsi_model *model, const dsii_arch_params *p,
                               dsii_arch_state **out, dsii_error *e);
    void (*state_free)(dsii_arch_state *st);

    /* Evaluates tokens[pos .. pos+n) at positions pos .. pos+n-1; tokens[0 .. pos) is the
     * timeline already evaluated (history for Engram hashing). 1 <= n <= n_batch,
     * pos + n <= n_ctx, every token id < n_vocab (the session layer validated all of it).
     * `which` DSII_LOGITS_*; `logits` is host memory of the matching size (NULL for NONE).
     * On failure the state is undefined: the session layer resets it. */
    dsi_status (*eval)(dsii_arch_state *st, const dsi_token *tokens, uint32_t pos,
                       uint32_t n, int32_t which, float *logits, dsii_error *e);

    /* Forgets everything (timeline length 0). Cheap: no device work needed. */
    void (*reset)(dsii_arch_state *st);

    /* Largest exact rewind in tokens: truncating cur -> len is exact iff cur - len <= it
     * (and len > 0). */
    uint32_t (*rewind_limit)(const dsii_arch_state *st);

    /* Truncates the state from `cur` to `len` tokens (cur - len <= rewind_limit). */
    dsi_status (*truncate)(dsii_arch_state *st, uint32_t cur, uint32_t len, dsii_error *e);
} dsii_arch;

/* ---- helpers shared by the architectures (arch.c) --------------------------------------- */

struct dsii_tensor;          /* lib/model/model.h */
struct dsib_backend;         /* backends/backend.h */
struct dsib_instance;
struct dsib_buffer;
struct dsib_weight;

/* The backend a model's sessions run on: the context's backend slot. */
dsi_status dsii_arch_backend(const dsi_model *model, const struct dsib_backend **be,
                             struct dsib_instance **inst, dsii_error *e);

/* Device-side references to model weights. On the CPU backend a binding wraps the
 * (mmapped) host bytes in place — no copy — and belongs to the session's set. A backend
 * without buffer_wrap_host (GPU) gets a device copy owned by the model (`model`
 * dev_weights): uploaded once by the first session that binds the tensor, shared by all
 * later sessions, freed with the model. */
typedef struct dsii_wset {
    const struct dsib_backend *be;
    struct dsib_instance *inst;
    const dsi_context *ctx;
    dsi_model *model;          /* the model whose tensors are bound (owns GPU copies) */
    struct dsib_buffer **bufs;
    uint32_t n, cap;
} dsii_wset;

/* Binds tensor `t` (NULL: *out is zeroed, buf NULL — "absent") as a dsib_weight with
 * ne = t->ne[0..2], nb1 = row_stride, nb2 = ne[1]·row_stride. */
dsi_status dsii_wset_bind(dsii_wset *ws, const struct dsii_tensor *t, struct dsib_weight *out,
                          dsii_error *e);
void dsii_wset_free(dsii_wset *ws);

extern const dsii_arch dsii_arch_dsv4;   /* lib/arch/dsv4.c */
extern const dsii_arch dsii_arch_dsv41;  /* lib/arch/dsv41.c */

/* Uploads, at model load, every weight the model's sessions will bind to a backend that
 * cannot use host memory in place (GPU backends): one device copy per model, shared by all
 * its sessions. A no-op on the CPU backend, for architectures without a forward pass and for
 * backends that do not implement the ops (their sessions are refused later). */
dsi_status dsii_arch_model_prepare(dsi_model *model, dsii_error *e);

/* The table for a loaded model's architecture (lib/arch/arch.c); NULL if unsupported. */
const dsii_arch *dsii_arch_for_model(const dsi_model *model);

#endif /* DSI_ARCH_H */
