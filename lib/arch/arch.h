/*
 * lib/arch/arch.h — the execution core between the session layer and the backends.
 *
 * Per model (created by dsi_model_load, shared by every session, freed with the model):
 *   - dsii_exec: the compute device, the weight table (every tensor bound once on that
 *     device, with a stable id), the architecture's per-model data (layer weight views,
 *     state component ids), the state pools of the model's sessions and the scheduler.
 * Per sequence (a session):
 *   - a slot in a state pool (lib/kv) of the model; its timeline length is the frontier.
 * Per execution context:
 *   - dsii_lane: a stream on the compute device, the step scratch (activations for
 *     max_rows rows), a host-visible io block (step rows, token ids, output-row indices,
 *     Engram rows, logits) and a cache of captured steps. A session owns one lane for its
 *     own steps; the scheduler owns one for the shared steps of a pool.
 *
 * One step (dsii_exec_step) evaluates rows of one or several sequences of one pool:
 * the host writes the inputs into the lane's io block (it depends only on tokens and
 * positions), the architecture records its ops (position-independent: positions, slots,
 * compressor group completion and ring rows come from the step rows), the stream is
 * submitted and synced once, and the logits are read from the io block. A step whose shape
 * (rows, output rows, pool generation) was seen before is captured once and replayed on
 * backends that can (Vulkan: reusable command buffers; CUDA later: graphs).
 *
 * Determinism: every op computes each row independently of the other rows of the step
 * (backends/backend.h), so a sequence's logits are bit-identical alone or in any batch,
 * chunked or whole, in any order.
 *
 * Rewind rule (docs/internals.md "Rewinds"): all per-sequence state is position-addressed
 * (lib/kv), so truncating a timeline from `cur` to `len` tokens is exact iff
 * cur − len <= the pool's margin; otherwise the session layer re-evaluates the prefix.
 */
#ifndef DSI_ARCH_H
#define DSI_ARCH_H

#include "backend/device.h"
#include "backends/backend.h"
#include "base/base.h"
#include "kv/kv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct dsii_tensor; /* lib/model/model.h */

/* Session-level parameters that shape a sequence's state (a pool key). */
typedef struct dsii_arch_params {
    uint32_t n_ctx;          /* maximum timeline length */
    uint32_t n_batch;        /* maximum tokens per step of the session's own lane */
    uint32_t flags;          /* DSI_SESSION_FLAG_* */
    uint32_t rewind_margin;  /* extra ring rows kept for exact rewinds (0 = default) */
} dsii_arch_params;

#define DSII_DEFAULT_MARGIN 256u /* exact-rewind margin (tokens), docs/internals.md */
/* Draft-block rings (lib/spec) hold window + this + margin rows: a draft writes the block's
 * keys up to 16 positions past the frontier, a verify step up to 16 rows. */
#define DSII_DRAFT_RING_EXTRA 32u

/* Logits requested for a sequence of a step. */
enum {
    DSII_LOGITS_NONE = 0,    /* no readback (intermediate prefill chunks) */
    DSII_LOGITS_LAST = 1,    /* the last row's logits: n_vocab floats */
    DSII_LOGITS_ALL = 2      /* every row: n × n_vocab floats */
};

/* ---- weights ----------------------------------------------------------------------------- */

/* The model's weight table on one device: tensor i (of dsi_model.tensors) bound as a
 * dsib_weight with id i + 1. CPU: the host bytes wrapped in place; GPU: one device copy,
 * uploaded at load. */
typedef struct dsii_wtable {
    dsii_device *dev;
    const dsi_context *ctx;
    dsi_model *model;
    dsib_buffer **bufs;        /* [n_tensors], NULL = not bound */
    uint64_t bytes;            /* bytes bound (uploaded on GPUs) */
} dsii_wtable;

/* Binds tensor `t` (NULL: *out zeroed, buf NULL — "absent"): ne = t->ne[0..2],
 * nb1 = row_stride, nb2 = ne[1]·row_stride, id = index + 1. Binding twice reuses the
 * buffer. */
dsi_status dsii_wtable_bind(dsii_wtable *wt, const struct dsii_tensor *t, dsib_weight *out,
                            dsii_error *e);

/* ---- architectures ------------------------------------------------------------------------ */

typedef struct dsii_arch_model dsii_arch_model; /* per model, defined by each arch */
typedef struct dsii_lane dsii_lane;
typedef struct dsii_exec dsii_exec;

/* One sequence's part of a step: rows at positions pos .. pos+n−1 of the sequence whose
 * state is `slot` of the step's pool. */
typedef struct dsii_seq_step {
    const dsi_token *tokens;   /* its timeline: tokens[0 .. pos+n) (history for Engram) */
    uint32_t slot;
    uint32_t pos, n;
    int32_t which;             /* DSII_LOGITS_* */
    float *logits;             /* host destination (LAST: n_vocab, ALL: n × n_vocab) */
} dsii_seq_step;

/* What the architecture's record() needs to know about a step beyond the io block. */
typedef struct dsii_step_shape {
    uint32_t n;                /* rows */
    uint32_t n_out;            /* rows whose logits are produced (io out_idx) */
    uint32_t fq_flags;         /* DSIB_FQ_NO_ROUND or 0 */
} dsii_step_shape;

/* One drafting call (lib/spec): the sequence's timeline holds tokens[0 .. n_tokens) (all
 * evaluated on a DSII_LANE_TAPS lane, so the draft rings hold them), `next` is the token that
 * follows (already chosen, not yet evaluated). */
typedef struct dsii_draft_io {
    const dsi_token *tokens;
    uint32_t n_tokens;          /* >= 1 */
    uint32_t slot;
    dsi_token next;
    uint32_t *mtp_valid;        /* V4: positions < *mtp_valid have MTP ring rows (in/out) */
    /* out: rows of draft logits (host-visible io block, valid until the lane's next step) */
    uint32_t n_rows;            /* DSpark: block size (5); V4 MTP: 1 */
    const float *logits;        /* n_rows × n_vocab (DSpark: before the Markov bias) */
    const float *hidden;        /* DSpark: n_rows × D (y, for the confidence head); or NULL */
} dsii_draft_io;

typedef struct dsii_arch {
    const char *name;        /* "deepseek4" / "deepseek41" */

    /* Per model: binds every weight the forward pass reads through `wt`, checks the
     * device implements the ops it needs (UNSUPPORTED naming the op otherwise). */
    dsi_status (*model_create)(dsi_model *m, dsii_wtable *wt, dsii_arch_model **out,
                               dsii_error *e);
    void (*model_free)(dsi_model *m, dsii_arch_model *am);

    /* The layout of one sequence's state for n_ctx and margin (fills an initialised
     * layout; component ids are the same for every n_ctx). */
    dsi_status (*state_layout)(const dsii_arch_model *am, uint32_t n_ctx,
                               dsii_kv_layout *out, dsii_error *e);

    /* Lanes: sets lane->scratch_bytes, lane->io_extra_bytes and the stream desc shapes the
     * architecture needs (the exec allocates); lane->priv may hold offsets. */
    dsi_status (*lane_init)(const dsii_arch_model *am, dsii_lane *lane, dsii_error *e);
    void (*lane_fini)(dsii_lane *lane);

    /* Host inputs of a step beyond rows / ids / output rows (Engram: hashes from the token
     * ids and the row gather into the io block). May be NULL. */
    dsi_status (*prepare)(const dsii_arch_model *am, dsii_lane *lane, const dsii_seq_step *seqs,
                          uint32_t n_seqs, uint32_t n_rows, dsii_error *e);

    /* Records the step's ops on lane->stream (position-independent). */
    dsi_status (*record)(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                         const dsii_step_shape *sh, dsii_error *e);

    /* Speculative decoding (may be NULL: the model has no draft blocks): runs the draft
     * block(s) at the end of io->tokens on a DSII_LANE_TAPS lane (records, submits, syncs
     * once; takes the pool lock) and fills io's outputs. */
    dsi_status (*draft)(const dsii_arch_model *am, dsii_lane *lane, dsii_kv_pool *pool,
                        dsii_draft_io *io, dsii_error *e);
    /* Draft-block shape: rows of one draft call (0: no draft blocks on this model). */
    uint32_t (*draft_rows)(const dsii_arch_model *am);
} dsii_arch;

extern const dsii_arch dsii_arch_dsv4;   /* lib/arch/dsv4.c */
extern const dsii_arch dsii_arch_dsv41;  /* lib/arch/dsv41.c */

/* The table for a loaded model's architecture; NULL if unsupported. */
const dsii_arch *dsii_arch_for_model(const dsi_model *model);

/* ---- lanes ----------------------------------------------------------------------------------- */

#define DSII_LANE_GRAPHS 8

enum {
    DSII_LANE_NO_CAPTURE = 1u << 0,  /* never capture / replay (tests, debugging) */
    /* Speculative decoding (lib/spec): the lane's steps also feed the model's draft block(s)
     * from the forward pass — V4.1: the mean HC input of the DSpark target layers projected
     * into every DSpark stage's window ring; V4: the final HC state into the MTP's state
     * ring — inside the same recorded step (no extra host sync); draft() runs on it. */
    DSII_LANE_TAPS = 1u << 1
};

struct dsii_lane {
    dsii_exec *ex;
    dsii_device *dev;
    dsib_stream *stream;
    dsib_stream_desc desc;       /* shapes (arch fills heads … width; exec rows/positions) */
    uint32_t max_rows, max_out;  /* rows of a step; rows whose logits one step produces */
    uint32_t n_ctx;              /* positions of the pool it serves */
    uint32_t flags;              /* DSII_LANE_* */
    /* step scratch (device): the arch's activations */
    dsib_buffer *scratch;
    uint64_t scratch_bytes;
    /* io block (host-visible): rows [max_rows][4], ids [max_rows], out_idx [max_out],
     * extra (arch: Engram rows), logits [max_out][n_vocab] */
    dsib_buffer *io;
    uint8_t *io_host;
    uint64_t io_rows, io_ids, io_out, io_extra, io_logits, io_bytes;
    uint64_t io_extra_bytes;
    uint64_t io_spec, io_spec_bytes; /* io block: draft outputs (arch, DSII_LANE_TAPS) */
    void *priv;                  /* architecture data (scratch offsets) */
    atomic_int *cancel;          /* the owner's cancel request, read inside a step by long
                                    waits (expert-tier reads); NULL: none (shared lanes) */
    int32_t cancelled_in_step;   /* set when a step stopped on `cancel` (CANCELLED) */
    struct {
        uint64_t key;
        dsib_graph *g;
        uint32_t seen;
        uint64_t last_use;
    } graphs[DSII_LANE_GRAPHS];
    uint64_t steps, replays, captures; /* counters (tests, bench) */
};

/* Views of the lane's scratch and io block. */
static inline dsib_view dsii_lane_sv(const dsii_lane *l, uint64_t off) {
    dsib_view v = {l->scratch, off};
    return v;
}
static inline dsib_view dsii_lane_io(const dsii_lane *l, uint64_t off) {
    dsib_view v = {l->io, off};
    return v;
}

/* A lane for steps of up to max_rows rows (and max_out output rows) over sequences of at
 * most n_ctx positions. */
dsi_status dsii_lane_create(dsii_exec *ex, uint32_t max_rows, uint32_t max_out, uint32_t n_ctx,
                            uint32_t flags, dsii_lane **out, dsii_error *e);
void dsii_lane_free(dsii_lane *l);

/* ---- the model's execution side ------------------------------------------------------------- */

/* Experimental session flag (dsinfer.h DSI_SESSION_FLAG_F32_STATE): keep the state as f32
 * rows even where the device stores it packed. Defined here too so the core builds without
 * the experimental section. Part of the pool key. */
#define DSII_SESSION_FLAG_F32_STATE (1u << 17)

struct dsii_exec {
    dsi_model *model;
    const dsi_context *ctx;
    const dsii_arch *arch;
    dsii_device *dev;            /* the compute device */
    dsii_wtable wt;
    dsii_arch_model *am;
    pthread_mutex_t lock;        /* pools */
    dsii_kv_pool **pools;
    uint32_t n_pools, cap_pools;
    struct dsii_sched *sched;    /* lib/sched, NULL unless coalescing is on */
    int32_t n_vocab;
    dsii_prof *prof;             /* step profile (dsinfer-bench), NULL = off */
    uint64_t state_budget;       /* bytes one session's state may take; 0 = the compute
                                    device's memory (tests set it lower) */
};

/* Attaches a step profile (base.h) to the model's execution side, or detaches it (NULL):
 * every following step adds its ops' times, its own wall time and rows to it. Only while
 * no step runs; steps must then be serialised by the caller. */
void dsii_exec_set_profile(dsii_exec *ex, dsii_prof *prof);

/* Creates the execution side of a loaded model (weights bound/uploaded now): installs
 * model->exec. A no-op (DSI_OK, exec NULL) for architectures without a forward pass.
 * Failures are reported (and the caller frees the model). */
dsi_status dsii_exec_create(dsi_model *m, dsii_error *e);

/* The pool for sequences of these parameters (created on first use; shared by every
 * session with the same n_ctx, margin and flags). */
dsi_status dsii_exec_pool(dsii_exec *ex, const dsii_arch_params *p, dsii_kv_pool **out,
                          dsii_error *e);
/* Whether one session of `pool` can hold its state at full n_ctx: OUT_OF_DEVICE_MEMORY
 * naming the bytes needed and the budget (ex->state_budget, else the compute device's
 * memory), or the largest component region against the device's largest binding. */
dsi_status dsii_exec_state_check(const dsii_exec *ex, const dsii_kv_pool *pool, dsii_error *e);
/* Parameters a pool was created for. */
void dsii_exec_pool_params(const dsii_kv_pool *pool, dsii_arch_params *p);

/* Runs one step over `n_seqs` sequences of `pool` on `lane`: 1 <= total rows <= max_rows,
 * output rows <= max_out, positions + rows <= the pool's n_ctx, tokens < n_vocab (the
 * callers validated all of it). On failure the states of the step's sequences are
 * undefined from their `pos` on (their callers truncate their timelines to `pos`). */
dsi_status dsii_exec_step(dsii_lane *lane, dsii_kv_pool *pool, const dsii_seq_step *seqs,
                          uint32_t n_seqs, dsii_error *e);

#endif /* DSI_ARCH_H */
