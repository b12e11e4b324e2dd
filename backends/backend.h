/*
 * backends/backend.h — the internal backend interface, version 2 (NOT part of the public ABI).
 *
 * A backend is a table of functions. The CPU backend is built into libdsinfer; GPU backends
 * (Vulkan, CUDA) are modules (libdsinfer-vulkan.so, libdsinfer-cuda.so) loaded at run time
 * that export one symbol, DSIB_ENTRY_SYMBOL, returning their table. This header is the only
 * core header a backend may include (plus dsinfer.h for dsi_status codes and
 * backends/types.h for tensor-type geometry; the built-in CPU backend may also use the pure
 * conversion helpers of lib/quant/).
 *
 * Versioning: DSIB_API_VERSION changes whenever this file changes incompatibly; every table
 * and struct starts with struct_size so fields can be appended compatibly. The loader
 * refuses a module whose api_version differs. docs/backend-interface.md is the long form of
 * the contract below (execution model, streams, events, capture, step rows, state views).
 *
 * Execution model (v2):
 *  - Instances: a backend bound to one device. A context holds the CPU instance plus the
 *    GPU instance(s) it opened; one step may use several instances (events order them).
 *  - Streams: every op is recorded on an explicit stream (first argument). Work on one
 *    stream runs in recording order. A stream is used by one thread at a time; different
 *    streams (of one or several instances) may be used by different threads at once.
 *    `submit` hands recorded work to the device without waiting; `sync` waits for all of it
 *    and reports the first failure since the previous sync. The CPU backend runs each op
 *    at once on the calling thread (and its pool).
 *  - Events: `event_record` marks the end of the work recorded so far on a stream;
 *    `stream_wait` makes later work on another stream of the SAME instance wait for it;
 *    `event_query` / `event_sync` observe it from the host. Between instances the core
 *    waits on the host (lib/backend: dsii_stream_wait).
 *  - Asynchronous download: an op (`copy`, or any op's output) may write into a buffer
 *    allocated with DSIB_BUFFER_HOST_VISIBLE; after a sync (or a completed event) the host
 *    reads it through buffer_host_ptr. Step inputs (rows, token ids, Engram rows) are
 *    written by the host into such buffers while the stream is idle and read by the ops.
 *  - Capture (optional): between capture_begin and capture_end, ops recorded on a stream
 *    are captured into a graph instead of running; graph_launch appends the same work
 *    (same buffers, same arguments; buffer contents as they are at execution time) to a
 *    stream. Vulkan: reusable command buffers; CUDA: CUDA graphs.
 *  - No allocation in ops: a stream's workspace is sized at stream creation from its
 *    dsib_stream_desc (the largest shapes its ops will see); an op exceeding it fails with
 *    DSI_ERR_INVALID_ARGUMENT. Backends may build per-instance constant tables once.
 *  - Position independence: ops never take positions as arguments. Each step row carries
 *    (position, state slot, its sequence's first row and row count) in a small int32
 *    "step rows" buffer (DSIB_ROW_*); per-sequence state is addressed through dsib_state
 *    views of a state pool. So the op sequence and arguments of a decode step are the same
 *    at every position and for any mix of sequences: a captured step replays.
 *  - Subsets: an op table entry may be NULL (not implemented), and `supports_op` may
 *    decline an op for a weight type; the core composes what it can from other ops
 *    (lib/backend/compose.c) and reports the rest as DSI_ERR_UNSUPPORTED at session
 *    creation, never mid-step.
 *
 * Ownership: the module/device/buffer/stream part is fixed by the lead; the op table
 * (struct dsib_ops) is owned by the forward-pass engineers and grows with the forward passes.
 */
#ifndef DSI_BACKEND_H
#define DSI_BACKEND_H

#include "dsinfer.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DSIB_API_VERSION 2
#define DSIB_ENTRY_SYMBOL "dsi_backend_module_entry"

/* Log function handed to a backend by the core (routes to the context's log callback). */
typedef void (*dsib_log_fn)(void *log_ctx, int32_t level, const char *message);

/* Host services the core hands to a backend at creation (allocator + log). */
typedef struct dsib_host {
    uint32_t struct_size;
    uint32_t flags;              /* DSIB_HOST_* (was reserved: 0 = defaults) */
    void *(*malloc_fn)(void *alloc_ctx, size_t size);
    void (*free_fn)(void *alloc_ctx, void *ptr);
    void *alloc_ctx;
    dsib_log_fn log_fn;
    void *log_ctx;
    int32_t n_threads;           /* CPU threads the backend may use for host work */
    int32_t device_index;        /* requested device; -1 = best */
} dsib_host;

/* dsib_host.flags. DSIB_HOST_EXACT_MATMUL: weight matmuls use f32 activations for every
 * weight type (DSI_CONTEXT_FLAG_EXACT_MATMUL); backends that always do may ignore it. */
#define DSIB_HOST_EXACT_MATMUL (1u << 0)

/* An error message a backend fills when a call fails. */
typedef struct dsib_error {
    char msg[512];
} dsib_error;

/* One device as a backend enumerates it (mirrors dsi_device_info). */
typedef struct dsib_device_desc {
    uint32_t struct_size;
    int32_t type;                /* DSI_DEVICE_* */
    char name[256];
    uint64_t memory_total;
    uint64_t memory_free;
    uint64_t max_buffer_size;    /* largest single binding (e.g. maxStorageBufferRange) */
    uint64_t max_allocation_size;
    uint32_t features;           /* DSI_DEVICE_FEATURE_* */
    uint32_t subgroup_size;
} dsib_device_desc;

typedef struct dsib_instance dsib_instance; /* a backend bound to one device */
typedef struct dsib_buffer dsib_buffer;     /* opaque device buffer */
typedef struct dsib_stream dsib_stream;     /* an ordered queue of work on one instance */
typedef struct dsib_event dsib_event;       /* a point in a stream's work */
typedef struct dsib_graph dsib_graph;       /* captured work, replayable (optional) */
typedef struct dsib_ops dsib_ops;           /* fused model-level ops (below) */

enum {
    DSIB_BUFFER_WEIGHTS = 1u << 0,   /* written once (upload), read by ops */
    DSIB_BUFFER_STATE = 1u << 1,     /* KV / compressor state, persistent per sequence */
    DSIB_BUFFER_SCRATCH = 1u << 2,   /* activations */
    DSIB_BUFFER_HOST_VISIBLE = 1u << 3, /* host reads/writes it through buffer_host_ptr while
                                           no stream uses it: step inputs, readback */
    DSIB_BUFFER_HOST_MEMORY = 1u << 4   /* (with STATE) read by the device's ops but kept in
                                           host RAM where the device can: state offloaded
                                           because the device budget cannot hold it. Backends
                                           without such memory use their usual memory. */
};

/* The largest shapes the ops recorded on a stream will see; the backend sizes the stream's
 * workspace from it at creation (ops allocate nothing). Zero fields mean "not used". */
typedef struct dsib_stream_desc {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    uint32_t max_rows;           /* rows (tokens) of one op call */
    uint32_t max_positions;      /* every row's position is < max_positions */
    uint32_t max_heads;          /* attention / indexer heads */
    uint32_t max_head_dim;       /* attention / indexer head dims */
    uint32_t max_topk;           /* indexer top-k, candidate blocks */
    uint32_t max_experts;        /* routed experts E */
    uint32_t max_experts_used;   /* k */
    uint32_t max_width;          /* widest row handed to moe_experts / engram_gate (D, F,
                                    n_hc·D) */
} dsib_stream_desc;

typedef struct dsib_backend {
    uint32_t struct_size;
    uint32_t api_version;        /* DSIB_API_VERSION */
    const char *name;            /* "cpu", "vulkan", "cuda" */

    /* Enumerates devices without creating an instance. Returns DSI_ERR_UNSUPPORTED with a
     * message (no loader, no driver, no device) when the backend cannot run here. */
    dsi_status (*enumerate)(const dsib_host *host, dsib_device_desc *out, int32_t cap,
                            int32_t *count, dsib_error *err);

    /* Creates an instance on host->device_index (-1: best device). */
    dsi_status (*create)(const dsib_host *host, dsib_instance **out, dsib_error *err);
    void (*destroy)(dsib_instance *inst);

    /* Describes the instance's device. */
    dsi_status (*device)(dsib_instance *inst, dsib_device_desc *out);

    /* Buffers. `wrap_host` (may be NULL in GPU backends): a buffer over caller-owned host
     * memory, not copied (CPU backend: mmapped weights used in place). `alloc_rows` (may be
     * NULL): a buffer read as rows of `row_bytes` from offset 0 (a weight tensor); a backend
     * that splits large buffers keeps every row inside one piece. Buffers start zeroed. */
    dsi_status (*buffer_alloc)(dsib_instance *inst, uint64_t size, uint32_t flags,
                               dsib_buffer **out, dsib_error *err);
    dsi_status (*buffer_alloc_rows)(dsib_instance *inst, uint64_t size, uint64_t row_bytes,
                                    uint32_t flags, dsib_buffer **out, dsib_error *err);
    dsi_status (*buffer_wrap_host)(dsib_instance *inst, void *ptr, uint64_t size,
                                   uint32_t flags, dsib_buffer **out, dsib_error *err);
    void (*buffer_free)(dsib_instance *inst, dsib_buffer *buf);
    /* Host pointer of a DSIB_BUFFER_HOST_VISIBLE buffer (every backend) or of any buffer of
     * a host-memory backend (CPU); NULL otherwise. Valid until the buffer is freed. */
    void *(*buffer_host_ptr)(dsib_instance *inst, dsib_buffer *buf);

    /* Blocking host <-> buffer copies (weights at load, tests, snapshots). They do not order
     * against streams: the caller makes sure no stream uses the range meanwhile. */
    dsi_status (*upload)(dsib_instance *inst, dsib_buffer *dst, uint64_t offset,
                         const void *src, uint64_t size, dsib_error *err);
    dsi_status (*download)(dsib_instance *inst, const dsib_buffer *src, uint64_t offset,
                           void *dst, uint64_t size, dsib_error *err);

    /* Memory accounting: bytes currently allocated on the device. */
    uint64_t (*memory_used)(dsib_instance *inst);

    /* ---- streams -------------------------------------------------------------------- */
    dsi_status (*stream_create)(dsib_instance *inst, const dsib_stream_desc *desc,
                                dsib_stream **out, dsib_error *err);
    /* Waits for the stream's work, then frees it. NULL accepted. */
    void (*stream_destroy)(dsib_stream *s);
    /* Hands the work recorded so far to the device; does not wait. */
    dsi_status (*submit)(dsib_stream *s, dsib_error *err);
    /* Submits, waits for every piece of work of the stream, and returns the first failure
     * recorded since the previous sync (then clears it). */
    dsi_status (*sync)(dsib_stream *s, dsib_error *err);

    /* ---- events --------------------------------------------------------------------- */
    dsi_status (*event_create)(dsib_instance *inst, dsib_event **out, dsib_error *err);
    void (*event_destroy)(dsib_instance *inst, dsib_event *ev);
    /* `ev` completes when the work recorded on `s` before this call has completed (a
     * backend may submit that work here). Re-recording an event moves it. */
    dsi_status (*event_record)(dsib_stream *s, dsib_event *ev, dsib_error *err);
    /* Work recorded on `s` after this call waits for `ev` (recorded on a stream of the same
     * instance; a never-recorded event is complete). */
    dsi_status (*stream_wait)(dsib_stream *s, dsib_event *ev, dsib_error *err);
    /* DSI_OK: complete; DSI_ERR_BUSY: not yet; another status: its work failed. Any thread. */
    dsi_status (*event_query)(dsib_instance *inst, dsib_event *ev);
    /* Host wait for `ev`. Any thread. */
    dsi_status (*event_sync)(dsib_instance *inst, dsib_event *ev, dsib_error *err);

    /* ---- capture / replay (all four NULL when unsupported) -------------------------- */
    /* Starts capturing: ops recorded on `s` until capture_end do not run. submit / sync /
     * events on `s` are refused while capturing. */
    dsi_status (*capture_begin)(dsib_stream *s, dsib_error *err);
    /* Ends the capture; *out is the graph (NULL and an error if any op failed). */
    dsi_status (*capture_end)(dsib_stream *s, dsib_graph **out, dsib_error *err);
    /* Appends the captured work to `s` (a stream of the graph's instance). A graph is
     * launched again only after the previous launch completed (the stream was synced). */
    dsi_status (*graph_launch)(dsib_stream *s, dsib_graph *g, dsib_error *err);
    void (*graph_destroy)(dsib_instance *inst, dsib_graph *g);

    /* Optional (NULL: every non-NULL op accepts every weight type the model loader
     * accepts): nonzero when op `op` (DSIB_OP_*) runs with weight type `type` (-1: any) on
     * this instance. The core checks it when a model is bound, not per call. */
    int32_t (*supports_op)(dsib_instance *inst, uint32_t op, int32_t type);

    /* The fused ops (see struct dsib_ops). */
    const dsib_ops *ops;
} dsib_backend;

/* Entry point exported by a backend module (and the CPU backend's built-in equivalent). */
typedef const dsib_backend *(*dsib_entry_fn)(void);

/* The built-in CPU backend. */
const dsib_backend *dsib_cpu_backend(void);

/* ------------------------------------------------------------------------------------ */
/* Fused model-level ops — owned by the forward-pass engineers.                          */
/* ------------------------------------------------------------------------------------ */
/*
 * Conventions (docs/backend-interface.md has the long form):
 *
 *  - Every op takes its stream first and returns a dsi_status. Argument errors are
 *    returned at once; a recording backend may return DSI_OK and report an execution
 *    failure at sync. Ops keep no mutable state in the instance and allocate nothing.
 *  - Data is addressed only through (buffer, byte offset) views; no op argument points at
 *    host data. Small parameter structs (dsib_weight, dsib_rope, dsib_state) are passed by
 *    pointer and are read during the call only.
 *  - Activations are f32, row-major, [rows][width] with an explicit row stride counted in
 *    floats ("ld"); index buffers are int32. Shapes in the comments use
 *    n = rows (tokens) in the call, D = model width, H = heads, hd = head dim.
 *  - Step rows (`rows`: int32 [n][DSIB_ROW_WORDS]): row t is at position rows[t].pos of the
 *    sequence whose state is slot rows[t].slot; the rows of one sequence are contiguous,
 *    at consecutive positions, starting at step row rows[t].first with rows[t].count rows.
 *    So pos0 = the position of its first row; positions < pos0 are read from the state,
 *    positions >= pos0 from the step's own rows (row first + (q − pos0)).
 *  - Determinism contract (model-spec §10.4): every op computes each output row with the
 *    same sequence of floating-point operations whatever n, the other rows, their
 *    sequences or their order are, and reductions run in the fixed order documented per
 *    op, so chunked prefill, whole-prompt prefill, token-by-token decode and any batch of
 *    sequences agree bit for bit.
 */

/* Step-row words (int32). */
enum {
    DSIB_ROW_POS = 0,     /* position of the row in its sequence */
    DSIB_ROW_SLOT = 1,    /* the sequence's state slot */
    DSIB_ROW_FIRST = 2,   /* step row index of the sequence's first row in this step */
    DSIB_ROW_COUNT = 3,   /* rows of the sequence in this step */
    DSIB_ROW_WORDS = 4
};

/* A (buffer, byte offset) reference to device memory. */
typedef struct dsib_view {
    dsib_buffer *buf;
    uint64_t offset;              /* bytes */
} dsib_view;

/* A weight tensor view in GGUF orientation: ne[0] = inputs (row length, elements),
 * ne[1] = output rows, ne[2] = expert count (1 for plain matrices). Rows are nb1 bytes
 * apart, experts nb2 bytes apart; `offset` is the byte offset of row 0 of expert 0.
 * Sub-views (a row range, one expert) are made by moving `offset` and shrinking ne.
 * `id` is the weight's stable id within its model (1-based tensor index; 0 = none): the
 * bytes at (id, offset, expert) never change while the model lives, so a backend may key
 * caches (repacked layouts, residency) on it. */
typedef struct dsib_weight {
    dsib_buffer *buf;
    uint64_t offset;
    int32_t type;                 /* DSI_TYPE_* */
    uint32_t id;
    int64_t ne[3];
    uint64_t nb1, nb2;
} dsib_weight;

/* Per-sequence state in a pool (lib/kv): slot s, row r is at
 *   buf + offset + ((uint64)s · rows + r) · row_bytes
 * — a ring (row = position mod rows) or an array of rows (e.g. row = compressed group).
 * A row holds `ld` values:
 *  - DSIB_STATE_F32: ld f32 values (row_bytes = ld · 4; 0 is read as ld · 4);
 *  - packed formats (lib/quant/statepack.h has the byte layout): the first `qcols` values
 *    quantised in blocks of `block` (codes, then one scale byte per block), then the
 *    ld − qcols remaining values as f32. Values decode exactly to the f32 numbers the
 *    fake-quant recipe of the same grid produced (model-spec §10.1), so ops reading a packed
 *    row compute with the same numbers as from an f32 row; store_rows packs.
 * A backend that does not implement a format declines it with DSI_ERR_UNSUPPORTED. */
enum {
    DSIB_STATE_F32 = 0,
    DSIB_STATE_E4M3_UE8M0 = 1,  /* FP8 E4M3 + UE8M0 scales (window KV, V4 compressed KV) */
    DSIB_STATE_E2M1_UE8M0 = 2,  /* FP4 E2M1 + UE8M0 scales (index keys) */
    DSIB_STATE_E2M1_E4M3 = 3    /* FP4 E2M1 + E4M3 scales (V4.1 compressed KV) */
};
typedef struct dsib_state {
    dsib_buffer *buf;
    uint64_t offset;              /* bytes: slot 0, row 0 */
    uint32_t slots;               /* slots in the pool: step rows name slots < slots */
    uint32_t rows;                /* rows per slot (ring length or capacity) */
    uint32_t ld;                  /* values per row */
    int32_t format;               /* DSIB_STATE_* */
    uint32_t row_bytes;           /* bytes per row (F32: ld · 4, or 0 meaning that) */
    uint32_t qcols;               /* packed: quantised values at the start of a row */
    uint32_t block;               /* packed: values per scale */
    uint32_t reserved;
} dsib_state;

/* Tail RoPE parameters (model-spec §3.9). The rotated slice is the LAST n_rot dims of each
 * head; pairs are interleaved (2i, 2i+1). freq_i = base^(-2i/n_rot); with yarn_factor > 1
 * the YaRN ramp of §3.9 is applied (no magnitude/mscale factor). */
typedef struct dsib_rope {
    float freq_base;
    float yarn_factor;            /* <= 1: no YaRN */
    float yarn_orig_ctx;          /* original context (e.g. 65536) */
    float yarn_beta_fast;         /* 32 */
    float yarn_beta_slow;         /* 1 */
    int32_t n_rot;                /* rotated dims (64) */
} dsib_rope;

/* Fake-quant recipes (model-spec §10.1). */
enum {
    DSIB_FQ_E4M3_UE8M0 = 0,  /* amax>=1e-4, s=2^ceil(log2(amax*f32(1/448))), e4m3 RNE */
    DSIB_FQ_E2M1_UE8M0 = 1,  /* amax>=6*2^-126, s=2^ceil(log2(amax*f32(1/6))), e2m1 RNE */
    DSIB_FQ_E2M1_E4M3 = 2    /* amax>=6*2^-9, s=e4m3_rne(amax/6), e2m1 RNE (V4.1 comp. KV) */
};
#define DSIB_FQ_NO_ROUND (1u << 0) /* clamp + rescale only (DSI_SESSION_FLAG_NO_FAKE_QUANT) */

/* hc_mix modes. */
enum {
    DSIB_HC_BLOCK = 0,   /* n_hc*(2+n_hc) mixes -> pre, post, Sinkhorn comb (§3.3) */
    DSIB_HC_HEAD = 1     /* n_hc mixes -> pre only (output head, §3.6) */
};

/* store_rows flags. */
#define DSIB_STORE_RING (1u << 0)

/* Layout of one token's hc coefficients (DSIB_HC_COEF floats for n_hc = 4):
 * [0,n_hc) pre, [n_hc,2n_hc) post, [2n_hc, 2n_hc+n_hc²) comb C[i][j] at 2n_hc + i·n_hc + j
 * (i = source stream, j = destination stream). HEAD mode writes pre only. */
#define DSIB_HC_COEF(n_hc) ((n_hc) * (2 + (n_hc)))

/* One entry of matmul_multi: the arguments of one matmul call. */
typedef struct dsib_mm {
    const dsib_weight *w;
    int32_t expert;
    dsib_view x;
    uint32_t ldx;
    dsib_view y;
    uint32_t ldy;
    uint32_t n;
} dsib_mm;

struct dsib_ops {
    uint32_t struct_size;
    uint32_t reserved;

    /* ---- generic -------------------------------------------------------------------- */

    /* y[t][o] = Σ_i W[o][i]·x[t][i], t < n, o < W.ne[1], i < W.ne[0]; `expert` selects
     * W's expert slice (0 for plain matrices). Every weight type the model loader accepts.
     * The dot product order per output element is independent of n. y must not alias x. */
    dsi_status (*matmul)(dsib_stream *s, const dsib_weight *w, int32_t expert, dsib_view x,
                         uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n);

    /* Grouped matmul (grouped output projection, §3.4): W's rows split into `groups` equal
     * blocks of R = W.ne[1]/groups rows; x's rows split into groups of K = W.ne[0] columns:
     * y[t][g·R + r] = Σ_i W[g·R + r][i]·x[t][g·K + i]. */
    dsi_status (*matmul_grouped)(dsib_stream *s, const dsib_weight *w, uint32_t groups,
                                 dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy,
                                 uint32_t n);

    /* Embedding rows: y[t][:] = dequant(table row ids[t]); ids int32 [n] (validated
     * against the vocabulary by the host). */
    dsi_status (*get_rows)(dsib_stream *s, const dsib_weight *table, dsib_view ids,
                           dsib_view y, uint32_t ldy, uint32_t n);

    /* RMSNorm over `rows` rows of `width`: y = x·rsqrt(mean(x²)+eps)·w (w may be NULL:
     * weight-less). Sum of squares accumulated in index order in f32. y may equal x. */
    dsi_status (*rms_norm)(dsib_stream *s, dsib_view x, uint32_t ldx, dsib_view y,
                           uint32_t ldy, uint32_t rows, uint32_t width, const dsib_weight *w,
                           float eps);

    /* y = a + b over `rows` rows of `width` (any of them may alias). */
    dsi_status (*add)(dsib_stream *s, dsib_view a, uint32_t lda, dsib_view b, uint32_t ldb,
                      dsib_view y, uint32_t ldy, uint32_t rows, uint32_t width);
    /* x *= f in place over rows×width. */
    dsi_status (*scale)(dsib_stream *s, dsib_view x, uint32_t ldx, uint32_t rows,
                        uint32_t width, float f);
    /* Plain byte copy (non-overlapping). Into a HOST_VISIBLE buffer this is the
     * asynchronous download. */
    dsi_status (*copy)(dsib_stream *s, dsib_view src, dsib_view dst, uint64_t bytes);
    /* Strided row copy: dst[t][0:width] = src[t][0:width], t < rows. */
    dsi_status (*copy_rows)(dsib_stream *s, dsib_view src, uint32_t lds, dsib_view dst,
                            uint32_t ldd, uint32_t rows, uint32_t width);
    /* Row gather: dst[t][0:width] = src[idx[t]][0:width], t < n (idx int32 [n], >= 0). */
    dsi_status (*gather_rows)(dsib_stream *s, dsib_view src, uint32_t lds, dsib_view idx,
                              dsib_view dst, uint32_t ldd, uint32_t n, uint32_t width);

    /* ---- positions and state -------------------------------------------------------- */

    /* Tail RoPE in place on x viewed as [n][heads][head_dim] (head h of row t at
     * x + t·ldx + h·head_dim); rotates dims [head_dim − n_rot, head_dim) of every head at
     * position max(0, rows[t].pos + pos_delta). inverse != 0 rotates by −θ. */
    dsi_status (*rope_tail)(dsib_stream *s, dsib_view x, uint32_t ldx, uint32_t n,
                            uint32_t heads, uint32_t head_dim, dsib_view rows,
                            int32_t pos_delta, const dsib_rope *rope, int32_t inverse);

    /* Writes step rows into per-sequence state (src row t, width floats, into slot
     * rows[t].slot of dst):
     *  - DSIB_STORE_RING (ratio 1): to ring row pos mod dst->rows, only for rows not
     *    overwritten by a later row of the same sequence in this step (pos > last − rows);
     *  - otherwise: rows completing a group of `ratio` positions ((pos+1) mod ratio == 0)
     *    go to row (pos+1)/ratio − 1 (< dst->rows); other rows write nothing. */
    dsi_status (*store_rows)(dsib_stream *s, dsib_view src, uint32_t lds, uint32_t n,
                             dsib_view rows, const dsib_state *dst, uint32_t width,
                             uint32_t ratio, uint32_t flags);

    /* ---- quantisation simulation ---------------------------------------------------- */

    /* Fake quant in place (§10.1) on columns [col0, col0+ncols) of `rows` rows, in blocks of
     * `block` consecutive columns (ncols % block == 0); `recipe` DSIB_FQ_*; flags
     * DSIB_FQ_NO_ROUND skips the grid rounding (clamp + rescale). */
    dsi_status (*fake_quant)(dsib_stream *s, dsib_view x, uint32_t ldx, uint32_t rows,
                             uint32_t col0, uint32_t ncols, uint32_t block, int32_t recipe,
                             uint32_t flags);

    /* Normalised Walsh–Hadamard transform (scale 1/√size) in place on every `size`-chunk of
     * rows×(chunks·size) (chunk c of row t at x + t·ldx + c·size). size a power of two. */
    dsi_status (*hadamard)(dsib_stream *s, dsib_view x, uint32_t ldx, uint32_t rows,
                           uint32_t chunks, uint32_t size);

    /* ---- mHC (§3.3, §3.6) ------------------------------------------------------------ */

    /* HC state X: [n][n_hc][D] (row stride n_hc·D). X[t][h] = e[t] for every stream. */
    dsi_status (*hc_expand)(dsib_stream *s, dsib_view e, uint32_t lde, dsib_view X,
                            uint32_t n, uint32_t n_hc, uint32_t D);

    /* Coefficients: mix = (fn · flat(X[t])) · rsqrt(mean(flat²) + rms_eps) with fn a weight
     * [n_mix rows][n_hc·D]; then (BLOCK) pre = sigmoid(mix·scale0 + base) + hc_eps,
     * post = 2·sigmoid(mix·scale1 + base), comb = Sinkhorn(mix·scale2 + base; iters, hc_eps);
     * (HEAD) pre = sigmoid(mix·scale0 + base) + hc_eps. scale/base: f32 weights.
     * coef: [n][DSIB_HC_COEF(n_hc)] floats (ld = ldc). */
    dsi_status (*hc_mix)(dsib_stream *s, dsib_view X, uint32_t n, uint32_t n_hc, uint32_t D,
                         const dsib_weight *fn, const dsib_weight *scale,
                         const dsib_weight *base, float rms_eps, float hc_eps,
                         uint32_t sinkhorn_iters, int32_t mode, dsib_view coef, uint32_t ldc);

    /* Collapse: y[t][d] = Σ_h pre[t][h]·X[t][h][d] (h ascending), pre = coef[t][0:n_hc]. */
    dsi_status (*hc_collapse)(dsib_stream *s, dsib_view X, dsib_view coef, uint32_t ldc,
                              dsib_view y, uint32_t ldy, uint32_t n, uint32_t n_hc,
                              uint32_t D);

    /* Post: Xo[t][j][d] = post[t][j]·f[t][d] + Σ_i comb[t][i][j]·R[t][i][d] (i ascending).
     * Xo may equal R. */
    dsi_status (*hc_post)(dsib_stream *s, dsib_view f, uint32_t ldf, dsib_view R,
                          dsib_view coef, uint32_t ldc, dsib_view Xo, uint32_t n,
                          uint32_t n_hc, uint32_t D);

    /* ---- compressed attention (§3.4) ------------------------------------------------- */

    /* Compressor pooling, one output row per step row: a row at position p completing
     * group w = (p+1)/ratio − 1 ((p+1) mod ratio == 0) gets the pooled row of group w in
     * out[t][0:hd]; every other row gets zeros. Token rows (kv and score, width_in =
     * (1+overlap)·hd floats) at position q: q < pos0 from the rings (ring row q mod
     * ring->rows of the row's slot), q >= pos0 from the step (row first + (q − pos0),
     * stride ldc). overlap = 0: candidates are the ratio tokens of group w, all hd dims.
     * overlap = 1 (CSA, ratio 4): lane A = dims [0,hd) of the tokens of group w−1 (absent
     * for w = 0), then lane B = dims [hd,2hd) of the tokens of group w. Per channel: softmax
     * over candidates (order: lane A tokens ascending, then lane B ascending; max, then
     * Σexp, then Σ p·kv in that order). */
    dsi_status (*compress_pool)(dsib_stream *s, const dsib_state *ring_kv,
                                const dsib_state *ring_sc, dsib_view kv, dsib_view sc,
                                uint32_t ldc, dsib_view rows, uint32_t n, uint32_t ratio,
                                int32_t overlap, uint32_t hd, dsib_view out, uint32_t ldo);

    /* Indexer (§3.4, §10.2): for the row at position p, with nvis = (p+1)/ratio visible
     * compressed rows (keys rows < nvis of the row's slot): score_c = Σ_h relu(q[t][h]·k_c)
     * ·w[t][h] (h ascending; the dot's order is fixed per length — CPU: 8 lanes, element i
     * in lane i mod 8, lanes summed as a fixed tree); q: [n][heads][hd] (ldq), w:
     * [n][heads] (ldw). idx[t][0:topk] = the min(topk, nvis) best rows (ties: lower
     * position first) in ascending position order, rest −1. */
    dsi_status (*indexer_topk)(dsib_stream *s, dsib_view q, uint32_t ldq, dsib_view w,
                               uint32_t ldw, const dsib_state *keys, uint32_t heads,
                               uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                               uint32_t topk, dsib_view idx);

    /* Sink attention (§3.4) for the row at position p, q: [n][H][hd] (ldq). Visible rows in
     * this fixed order: (1) compressed rows of the row's slot: if comp_ratio > 0, either
     * idx[t][0:topk] (skipping −1; ascending) or, with idx.buf == NULL, every
     * c < (p+1)/comp_ratio; (2) window positions max(0, p−window+1) .. p ascending, q < pos0
     * from the ring (row q mod ring->rows), q >= pos0 from kv row first + (q − pos0)
     * (stride ldkv). K = V = the row. z = (q·k)·scale (dot order as indexer_topk);
     * m = max(sink[h], max z); out = Σ e^{z−m}·v / (e^{sink−m} + Σ e^{z−m}).
     * out: [n][H][hd] (ldo). sinks: f32 [H]. comp may be NULL when comp_ratio is 0. */
    dsi_status (*attn_sink)(dsib_stream *s, dsib_view q, uint32_t ldq, uint32_t H,
                            uint32_t hd, dsib_view rows, uint32_t n, uint32_t window,
                            const dsib_state *ring, dsib_view kv, uint32_t ldkv,
                            uint32_t comp_ratio, const dsib_state *comp, dsib_view idx,
                            uint32_t topk, const dsib_weight *sinks, float scale,
                            dsib_view out, uint32_t ldo);

    /* x[t][0:width] += table row (rows[t].pos mod period) (table: weight [period][width],
     * e.g. the compressor's `ape`, §3.4). */
    dsi_status (*add_rows_periodic)(dsib_stream *s, dsib_view x, uint32_t ldx, uint32_t n,
                                    uint32_t width, const dsib_weight *table, dsib_view rows,
                                    uint32_t period);

    /* ---- MoE (§3.5) ------------------------------------------------------------------- */

    /* Router: logits [n][E] (ldl) → s = sqrt(softplus(l)); selection: tid2eid != NULL:
     * sel = tid2eid row ids[t] (int32 weight [V][k]); else top-k of s + bias (bias f32 [E]
     * or NULL; ties: lower expert id first; order: best first). weights_k =
     * s[sel_k] / (Σ_k s[sel_k] + norm_add) · route_scale (Σ in k order; V4: norm_add 0,
     * V4.1: 1e-20). sel int32 [n][k], wts f32 [n][k] (both row stride k). */
    dsi_status (*moe_route)(dsib_stream *s, dsib_view logits, uint32_t ldl, uint32_t E,
                            uint32_t k, const dsib_weight *bias, const dsib_weight *tid2eid,
                            dsib_view ids, float norm_add, float route_scale, uint32_t n,
                            dsib_view sel, dsib_view wts);

    /* Routed experts: y[t] = Σ_{k ascending} W2_e(silu(min(g,lim))·clamp(u,±lim)·wts[t][k])
     * with e = sel[t][k], g = W1_e x[t], u = W3_e x[t] (W1/W3: [D → F] per expert, W2:
     * [F → D]). x: [n][D] (ldx), y: [n][D] (ldy; must not alias x). lim <= 0: no clamp.
     * Each selected expert's weights are read once per call for all rows that chose it. */
    dsi_status (*moe_experts)(dsib_stream *s, dsib_view x, uint32_t ldx, dsib_view sel,
                              dsib_view wts, uint32_t k, const dsib_weight *w1,
                              const dsib_weight *w3, const dsib_weight *w2, float limit,
                              uint32_t n, dsib_view y, uint32_t ldy);

    /* SwiGLU with clamp (shared expert): y = silu(min(g,lim))·clamp(u,±lim), rows×width;
     * y may alias g. lim <= 0: no clamp. */
    dsi_status (*swiglu)(dsib_stream *s, dsib_view g, uint32_t ldg, dsib_view u,
                         uint32_t ldu, dsib_view y, uint32_t ldy, uint32_t rows,
                         uint32_t width, float limit);

    /* ==== V4.1 ops (DeepSeek V4.1 Flash, model-spec §4) ================================ */

    /* Two-level indexer top-k (§4.3, §10.2). For the row at position p with
     * nvis = (p+1)/ratio visible compressed positions (keys of the row's slot):
     * score_c = Σ_h relu(q[t][h]·k_c)·w[t][h] (h ascending; dot in index order, f32) for
     * c < nvis; q: [n][heads][hd] (ldq), w: [n][heads] (ldw).
     *  - cand_out.buf != NULL (candidate source): block scores B_b = max of score_c over the
     *    visible c of block b = c / cand_block (unmasked scores); the block holding c = nvis−1
     *    is forced to +inf; the min(cand_k, n_blocks) best blocks (ties: lower block first)
     *    are written ascending to cand_out[t][0:cand_k] (int32, row stride cand_k), rest −1.
     *  - cand_in.buf != NULL (masked index source): only positions whose block c / cand_block
     *    is listed in cand_in[t][0:cand_k] (ascending, −1 padded) can be selected; the others
     *    score −inf and are never selected.
     * idx[t][0:topk] (int32, row stride topk) = the min(topk, n_allowed) best allowed
     * positions (ties: lower position first), in ascending position order; rest −1. */
    dsi_status (*indexer_topk_v41)(dsib_stream *s, dsib_view q, uint32_t ldq, dsib_view w,
                                   uint32_t ldw, const dsib_state *keys, uint32_t heads,
                                   uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                                   uint32_t topk, dsib_view idx, dsib_view cand_in,
                                   dsib_view cand_out, uint32_t cand_block, uint32_t cand_k);

    /* Engram gate (§4.6 steps 3–5), in place on the HC state X: [n][n_hc][D] (row stride
     * n_hc·D). kv: [n][(n_hc+1)·D] (ldkv): key_h = kv[t][h·D, (h+1)·D), value =
     * kv[t][n_hc·D, (n_hc+1)·D). qw, kw: weights ne = [D, n_hc] (q_weight, k_weight).
     * Per stream h (d ascending, f32): a = Σ X[h][d]², b = Σ key_h[d]²,
     * c = Σ X[h][d]·(qw[h][d]·kw[h][d])·key_h[d];
     * dot = c · rsqrt(a/D + eps) · rsqrt(b/D + eps) / √D;
     * g = sigmoid(sign(dot)·sqrt(max(|dot|, 1e-6))); X[h][d] += g·value[d]. */
    dsi_status (*engram_gate)(dsib_stream *s, dsib_view X, uint32_t n, uint32_t n_hc,
                              uint32_t D, dsib_view kv, uint32_t ldkv, const dsib_weight *qw,
                              const dsib_weight *kw, float eps);

    /* ---- appended (optional; the core falls back to one matmul per entry) ---------------- */

    /* Several independent matmuls of one step at once (e.g. the projections that read the
     * same normalized input): entry i is exactly matmul(s, mm[i].w, mm[i].expert, mm[i].x,
     * mm[i].ldx, mm[i].y, mm[i].ldy, mm[i].n) — the same result bits. Outputs must not
     * overlap each other or any input. A CPU backend runs them as one parallel job. */
    dsi_status (*matmul_multi)(dsib_stream *s, const dsib_mm *mm, uint32_t count);
};

/* Op ids for supports_op: the index of the entry in struct dsib_ops (after the two header
 * words), in declaration order. */
enum {
    DSIB_OP_MATMUL = 0,
    DSIB_OP_MATMUL_GROUPED,
    DSIB_OP_GET_ROWS,
    DSIB_OP_RMS_NORM,
    DSIB_OP_ADD,
    DSIB_OP_SCALE,
    DSIB_OP_COPY,
    DSIB_OP_COPY_ROWS,
    DSIB_OP_GATHER_ROWS,
    DSIB_OP_ROPE_TAIL,
    DSIB_OP_STORE_ROWS,
    DSIB_OP_FAKE_QUANT,
    DSIB_OP_HADAMARD,
    DSIB_OP_HC_EXPAND,
    DSIB_OP_HC_MIX,
    DSIB_OP_HC_COLLAPSE,
    DSIB_OP_HC_POST,
    DSIB_OP_COMPRESS_POOL,
    DSIB_OP_INDEXER_TOPK,
    DSIB_OP_ATTN_SINK,
    DSIB_OP_ADD_ROWS_PERIODIC,
    DSIB_OP_MOE_ROUTE,
    DSIB_OP_MOE_EXPERTS,
    DSIB_OP_SWIGLU,
    DSIB_OP_INDEXER_TOPK_V41,
    DSIB_OP_ENGRAM_GATE,
    DSIB_OP_MATMUL_MULTI,
    DSIB_OP_COUNT
};

/* Nonzero when table `o` has a non-NULL entry for op `op` (DSIB_OP_*): ops are function
 * pointers laid out in declaration order after the two header words. */
static inline int dsib_ops_has(const dsib_ops *o, uint32_t op) {
    if (!o || op >= DSIB_OP_COUNT) return 0;
    size_t off = offsetof(dsib_ops, matmul) + (size_t)op * sizeof(void (*)(void));
    if (o->struct_size < off + sizeof(void (*)(void))) return 0;
    void (*fn)(void);
    memcpy(&fn, (const char *)o + off, sizeof fn);
    return fn != NULL;
}

#endif /* DSI_BACKEND_H */
