/*
 * backends/backend.h — the internal backend interface (NOT part of the public ABI).
 *
 * A backend is a table of functions. The CPU backend is built into libdsinfer; GPU backends
 * (Vulkan, CUDA) are modules (libdsinfer-vulkan.so, libdsinfer-cuda.so) loaded at run time
 * that export one symbol, DSIB_ENTRY_SYMBOL, returning their table. This header is the only
 * core header a backend may include (plus dsinfer.h for dsi_status codes; the built-in CPU
 * backend may also use the pure conversion helpers of lib/quant/).
 *
 * Versioning: DSIB_API_VERSION changes whenever this file changes incompatibly; every table
 * and struct starts with struct_size so fields can be appended compatibly. The loader
 * refuses a module whose api_version differs.
 *
 * Shape of the interface (design.md "Backends"): opaque device buffers, explicit
 * upload/download, command recording and submission, and fused model-level ops. Weights are
 * uploaded once; activations, KV and scratch stay on the device for a whole prefill/decode;
 * the CPU backend works on mmapped weights in place (buffers may wrap host memory without a
 * copy).
 *
 * Ownership: the module/device/buffer/command part below is fixed by the lead; the op table
 * (struct dsib_ops) is owned by the forward-pass engineer and grows with the forward passes.
 */
#ifndef DSI_BACKEND_H
#define DSI_BACKEND_H

#include "dsinfer.h"

#include <stddef.h>
#include <stdint.h>

#define DSIB_API_VERSION 1
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
typedef struct dsib_ops dsib_ops;           /* fused model-level ops (below) */

enum {
    DSIB_BUFFER_WEIGHTS = 1u << 0,   /* written once (upload), read by ops */
    DSIB_BUFFER_STATE = 1u << 1,     /* KV / compressor state, persistent per session */
    DSIB_BUFFER_SCRATCH = 1u << 2,   /* activations */
    DSIB_BUFFER_HOST_VISIBLE = 1u << 3 /* staging / readback */
};

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
     * memory, not copied (CPU backend: mmapped weights used in place). */
    dsi_status (*buffer_alloc)(dsib_instance *inst, uint64_t size, uint32_t flags,
                               dsib_buffer **out, dsib_error *err);
    dsi_status (*buffer_wrap_host)(dsib_instance *inst, void *ptr, uint64_t size,
                                   uint32_t flags, dsib_buffer **out, dsib_error *err);
    void (*buffer_free)(dsib_instance *inst, dsib_buffer *buf);
    dsi_status (*upload)(dsib_instance *inst, dsib_buffer *dst, uint64_t offset,
                         const void *src, uint64_t size, dsib_error *err);
    dsi_status (*download)(dsib_instance *inst, const dsib_buffer *src, uint64_t offset,
                           void *dst, uint64_t size, dsib_error *err);
    /* Host pointer of a buffer if it is host-addressable (CPU backend), else NULL. */
    void *(*buffer_host_ptr)(dsib_instance *inst, dsib_buffer *buf);

    /* Command recording: ops between begin and submit are recorded (GPU) or run (CPU);
     * submit executes and waits. A failure anywhere is reported by submit. */
    dsi_status (*begin)(dsib_instance *inst, dsib_error *err);
    dsi_status (*submit)(dsib_instance *inst, dsib_error *err);

    /* Memory accounting: bytes currently allocated on the device. */
    uint64_t (*memory_used)(dsib_instance *inst);

    /* The fused ops (see struct dsib_ops). */
    const dsib_ops *ops;

    /* ---- appended fields: optional; check struct_size covers them before use ---------- */

    /* Like buffer_alloc, for a buffer read as rows of `row_bytes` bytes from offset 0 (a
     * weight tensor, expert stacks included). A backend that splits large buffers into
     * several allocations keeps every row inside one of them, so no row straddles a split
     * (Vulkan: maxMemoryAllocationSize pieces). May be NULL. */
    dsi_status (*buffer_alloc_rows)(dsib_instance *inst, uint64_t size, uint64_t row_bytes,
                                    uint32_t flags, dsib_buffer **out, dsib_error *err);
} dsib_backend;

/* Entry point exported by a backend module (and the CPU backend's built-in equivalent). */
typedef const dsib_backend *(*dsib_entry_fn)(void);

/* The built-in CPU backend. */
const dsib_backend *dsib_cpu_backend(void);

/* ------------------------------------------------------------------------------------ */
/* Fused model-level ops — owned by the forward-pass engineer.                           */
/* ------------------------------------------------------------------------------------ */
/*
 * Conventions (docs/backend-interface.md has the long form):
 *
 *  - Every op takes the instance first and returns a dsi_status. A recording (GPU) backend
 *    may return DSI_OK and report a failure at submit; the CPU backend runs the op at once.
 *    Ops must be callable concurrently from several threads on one instance (several
 *    sessions of one model run at once); an op keeps no mutable state in the instance.
 *  - Data is addressed only through (buffer, byte offset) views; no op argument points at
 *    host data. Small parameter structs (dsib_weight, dsib_rope) are passed by pointer and
 *    are read during the call only.
 *  - Activations are f32, row-major, [rows][width] with an explicit row stride counted in
 *    floats ("ld"); index buffers are int32. Shapes in the comments use
 *    n = tokens in the step, D = model width, H = heads, hd = head dim.
 *  - Determinism contract (model-spec §10.4): every op computes each output row with the
 *    same sequence of floating-point operations whatever n (the number of rows in the call)
 *    is, and reductions run in the fixed order documented per op, so chunked prefill,
 *    whole-prompt prefill and token-by-token decode agree bit for bit.
 *  - Positions are host-known: ops that need them take (pos0, pos_step) — row t is at
 *    position pos0 + t·pos_step. Data-dependent choices (top-k rows, experts) stay in device
 *    index buffers written by one op and read by a later one.
 */

/* A (buffer, byte offset) reference to device memory. */
typedef struct dsib_view {
    dsib_buffer *buf;
    uint64_t offset;              /* bytes */
} dsib_view;

/* A weight tensor view in GGUF orientation: ne[0] = inputs (row length, elements),
 * ne[1] = output rows, ne[2] = expert count (1 for plain matrices). Rows are nb1 bytes
 * apart, experts nb2 bytes apart; `offset` is the byte offset of row 0 of expert 0.
 * Sub-views (a row range, one expert) are made by moving `offset` and shrinking ne. */
typedef struct dsib_weight {
    dsib_buffer *buf;
    uint64_t offset;
    int32_t type;                 /* DSI_TYPE_* */
    int32_t reserved;
    int64_t ne[3];
    uint64_t nb1, nb2;
} dsib_weight;

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

/* Layout of one token's hc coefficients (DSIB_HC_COEF floats for n_hc = 4):
 * [0,n_hc) pre, [n_hc,2n_hc) post, [2n_hc, 2n_hc+n_hc²) comb C[i][j] at 2n_hc + i·n_hc + j
 * (i = source stream, j = destination stream). HEAD mode writes pre only. */
#define DSIB_HC_COEF(n_hc) ((n_hc) * (2 + (n_hc)))

struct dsib_ops {
    uint32_t struct_size;
    uint32_t reserved;

    /* ---- generic -------------------------------------------------------------------- */

    /* y[t][o] = Σ_i W[o][i]·x[t][i], t < n, o < W.ne[1], i < W.ne[0]; `expert` selects
     * W's expert slice (0 for plain matrices). Every weight type the model loader accepts.
     * The dot product order per output element is independent of n. y must not alias x. */
    dsi_status (*matmul)(dsib_instance *inst, const dsib_weight *w, int32_t expert,
                         dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n);

    /* Grouped matmul (grouped output projection, §3.4): W's rows split into `groups` equal
     * blocks of R = W.ne[1]/groups rows; x's rows split into groups of K = W.ne[0] columns:
     * y[t][g·R + r] = Σ_i W[g·R + r][i]·x[t][g·K + i]. */
    dsi_status (*matmul_grouped)(dsib_instance *inst, const dsib_weight *w, uint32_t groups,
                                 dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy,
                                 uint32_t n);

    /* Embedding rows: y[t][:] = dequant(table row ids[t]); ids int32 [n]. Ids were validated
     * against the vocabulary by the host. */
    dsi_status (*get_rows)(dsib_instance *inst, const dsib_weight *table, dsib_view ids,
                           dsib_view y, uint32_t ldy, uint32_t n);

    /* RMSNorm over `rows` rows of `width`: y = x·rsqrt(mean(x²)+eps)·w (w may be NULL:
     * weight-less). Sum of squares accumulated in index order in f32. y may equal x. */
    dsi_status (*rms_norm)(dsib_instance *inst, dsib_view x, uint32_t ldx, dsib_view y,
                           uint32_t ldy, uint32_t rows, uint32_t width, const dsib_weight *w,
                           float eps);

    /* y = a + b over `rows` rows of `width` (any of them may alias). */
    dsi_status (*add)(dsib_instance *inst, dsib_view a, uint32_t lda, dsib_view b,
                      uint32_t ldb, dsib_view y, uint32_t ldy, uint32_t rows, uint32_t width);
    /* x *= s in place over rows×width. */
    dsi_status (*scale)(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                        uint32_t width, float s);
    /* Plain byte copy (non-overlapping). */
    dsi_status (*copy)(dsib_instance *inst, dsib_view src, dsib_view dst, uint64_t bytes);
    /* Strided row copy: dst[t][0:width] = src[t][0:width], t < rows. */
    dsi_status (*copy_rows)(dsib_instance *inst, dsib_view src, uint32_t lds, dsib_view dst,
                            uint32_t ldd, uint32_t rows, uint32_t width);

    /* ---- positions -------------------------------------------------------------------- */

    /* Tail RoPE in place on x viewed as [rows][heads][head_dim] (head h of row t at
     * x + t·ldx + h·head_dim); rotates dims [head_dim - n_rot, head_dim) of every head at
     * position pos0 + t·pos_step. inverse != 0 rotates by −θ (output un-rotation). */
    dsi_status (*rope_tail)(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                            uint32_t heads, uint32_t head_dim, int64_t pos0, int64_t pos_step,
                            const dsib_rope *rope, int32_t inverse);

    /* Ring write: source row t (position pos0 + t, t < n, row stride lds) goes to ring slot
     * (pos0 + t) mod ring_len (slot stride ldr floats, first `width` floats). Only the last
     * min(n, ring_len) rows are written (earlier ones would be overwritten anyway). */
    dsi_status (*ring_write)(dsib_instance *inst, dsib_view src, uint32_t lds, uint32_t n,
                             int64_t pos0, dsib_view ring, uint32_t ldr, uint32_t ring_len,
                             uint32_t width);

    /* ---- quantisation simulation ---------------------------------------------------- */

    /* Fake quant in place (§10.1) on columns [col0, col0+ncols) of `rows` rows, in blocks of
     * `block` consecutive columns (ncols % block == 0); `recipe` DSIB_FQ_*; flags
     * DSIB_FQ_NO_ROUND skips the grid rounding (clamp + rescale). */
    dsi_status (*fake_quant)(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                             uint32_t col0, uint32_t ncols, uint32_t block, int32_t recipe,
                             uint32_t flags);

    /* Normalised Walsh–Hadamard transform (scale 1/√size) in place on every `size`-chunk of
     * rows×(chunks·size) (chunk c of row t at x + t·ldx + c·size). size a power of two. */
    dsi_status (*hadamard)(dsib_instance *inst, dsib_view x, uint32_t ldx, uint32_t rows,
                           uint32_t chunks, uint32_t size);

    /* ---- mHC (§3.3, §3.6) ------------------------------------------------------------ */

    /* HC state X: [n][n_hc][D] (row stride n_hc·D). X[t][h] = e[t] for every stream. */
    dsi_status (*hc_expand)(dsib_instance *inst, dsib_view e, uint32_t lde, dsib_view X,
                            uint32_t n, uint32_t n_hc, uint32_t D);

    /* Coefficients: mix = (fn · flat(X[t])) · rsqrt(mean(flat²) + rms_eps) with fn a weight
     * [n_mix rows][n_hc·D]; then (BLOCK) pre = sigmoid(mix·scale0 + base) + hc_eps,
     * post = 2·sigmoid(mix·scale1 + base), comb = Sinkhorn(mix·scale2 + base; iters, hc_eps);
     * (HEAD) pre = sigmoid(mix·scale0 + base) + hc_eps. scale/base: f32 weights.
     * coef: [n][DSIB_HC_COEF(n_hc)] floats (ld = ldc). */
    dsi_status (*hc_mix)(dsib_instance *inst, dsib_view X, uint32_t n, uint32_t n_hc,
                         uint32_t D, const dsib_weight *fn, const dsib_weight *scale,
                         const dsib_weight *base, float rms_eps, float hc_eps,
                         uint32_t sinkhorn_iters, int32_t mode, dsib_view coef, uint32_t ldc);

    /* Collapse: y[t][d] = Σ_h pre[t][h]·X[t][h][d] (h ascending), pre = coef[t][0:n_hc]. */
    dsi_status (*hc_collapse)(dsib_instance *inst, dsib_view X, dsib_view coef, uint32_t ldc,
                              dsib_view y, uint32_t ldy, uint32_t n, uint32_t n_hc,
                              uint32_t D);

    /* Post: Xo[t][j][d] = post[t][j]·f[t][d] + Σ_i comb[t][i][j]·R[t][i][d] (i ascending).
     * Xo may equal R. */
    dsi_status (*hc_post)(dsib_instance *inst, dsib_view f, uint32_t ldf, dsib_view R,
                          dsib_view coef, uint32_t ldc, dsib_view Xo, uint32_t n,
                          uint32_t n_hc, uint32_t D);

    /* ---- compressed attention (§3.4) ------------------------------------------------- */

    /* Compressor pooling for groups w = w0 .. w0+n_groups-1 (ratio r). Token rows (kv and
     * score, each `width_in` = coff·hd floats) are looked up by position q: q < pos0 from the
     * state rings (slot q mod ring_len, stride ldr), q >= pos0 from the step's rows
     * (row q − pos0, stride ldc). overlap = 0: candidates are the r tokens of group w, all
     * hd dims. overlap = 1 (coff = 2, CSA r = 4): candidates are lane A = dims [0,hd) of the
     * r tokens of group w−1 (absent for w = 0) then lane B = dims [hd,2hd) of the r tokens
     * of group w. Per channel: softmax over candidates (order: lane A tokens ascending, then
     * lane B ascending; max, then Σexp, then Σ p·kv in that order). out[w−w0][0:hd]. */
    dsi_status (*compress_pool)(dsib_instance *inst, dsib_view ring_kv, dsib_view ring_sc,
                                uint32_t ldr, uint32_t ring_len, dsib_view kv, dsib_view sc,
                                uint32_t ldc, int64_t pos0, uint32_t n, uint32_t ratio,
                                int32_t overlap, uint32_t hd, int64_t w0, uint32_t n_groups,
                                dsib_view out, uint32_t ldo);

    /* Indexer (§3.4, §10.2): for token t at position p = pos0 + t, with nvis = (p+1)/ratio
     * visible compressed rows: score_c = Σ_h relu(q[t][h]·k_c)·w[t][h] (h ascending; the
     * dot's order is fixed per length — CPU: 8 lanes, element i in lane i mod 8, lanes
     * summed as a fixed tree) for c < nvis; q: [n][heads][hd] (ldq), w: [n][heads] (ldw),
     * keys: [rows][hd] contiguous. idx[t][0:topk] = the min(topk, nvis) best rows (ties:
     * lower position first) in ascending position order, rest −1. */
    dsi_status (*indexer_topk)(dsib_instance *inst, dsib_view q, uint32_t ldq, dsib_view w,
                               uint32_t ldw, dsib_view keys, uint32_t heads, uint32_t hd,
                               int64_t pos0, uint32_t n, uint32_t ratio, uint32_t topk,
                               dsib_view idx);

    /* Sink attention (§3.4) for token t at p = pos0 + t, q: [n][H][hd] (ldq). Visible rows
     * in this fixed order: (1) compressed rows: if comp_ratio > 0, either idx[t][0:topk]
     * (skipping −1; ascending) or, with idx.buf == NULL, every c < (p+1)/comp_ratio
     * (rows comp + c·hd); (2) window rows max(0, p−window+1) .. p ascending, position
     * q < pos0 from the ring (slot q mod ring_len, stride hd), q >= pos0 from kv row q−pos0
     * (stride ldkv). K = V = the row. z = (q·k)·scale (dot order as indexer_topk);
     * m = max(sink[h], max z);
     * out = Σ e^{z−m}·v / (e^{sink−m} + Σ e^{z−m}). out: [n][H][hd] (ldo). sinks: f32 [H]. */
    dsi_status (*attn_sink)(dsib_instance *inst, dsib_view q, uint32_t ldq, uint32_t H,
                            uint32_t hd, int64_t pos0, uint32_t n, uint32_t window,
                            dsib_view ring, uint32_t ring_len, dsib_view kv, uint32_t ldkv,
                            uint32_t comp_ratio, dsib_view comp, dsib_view idx, uint32_t topk,
                            const dsib_weight *sinks, float scale, dsib_view out,
                            uint32_t ldo);

    /* x[t][0:width] += table row ((pos0 + t) mod period) (table: weight [period][width],
     * e.g. the compressor's `ape`, §3.4). */
    dsi_status (*add_rows_periodic)(dsib_instance *inst, dsib_view x, uint32_t ldx,
                                    uint32_t n, uint32_t width, const dsib_weight *table,
                                    int64_t pos0, uint32_t period);

    /* ---- MoE (§3.5) ------------------------------------------------------------------- */

    /* Router: logits [n][E] (ldl) → s = sqrt(softplus(l)); selection: tid2eid != NULL:
     * sel = tid2eid row ids[t] (int32 weight [V][k]); else top-k of s + bias (bias f32 [E]
     * or NULL; ties: lower expert id first; order: best first). weights_k =
     * s[sel_k] / (Σ_k s[sel_k] + norm_add) · route_scale (Σ in k order; V4: norm_add 0,
     * V4.1: 1e-20). sel int32 [n][k], wts f32 [n][k] (both row stride k). */
    dsi_status (*moe_route)(dsib_instance *inst, dsib_view logits, uint32_t ldl, uint32_t E,
                            uint32_t k, const dsib_weight *bias, const dsib_weight *tid2eid,
                            dsib_view ids, float norm_add, float route_scale, uint32_t n,
                            dsib_view sel, dsib_view wts);

    /* Routed experts: y[t] = Σ_{k ascending} W2_e(silu(min(g,lim))·clamp(u,±lim)·wts[t][k])
     * with e = sel[t][k], g = W1_e x[t], u = W3_e x[t] (W1/W3: [D → F] per expert, W2:
     * [F → D]). x: [n][D] (ldx), y: [n][D] (ldy; must not alias x). lim <= 0: no clamp. */
    dsi_status (*moe_experts)(dsib_instance *inst, dsib_view x, uint32_t ldx,
                              dsib_view sel, dsib_view wts, uint32_t k,
                              const dsib_weight *w1, const dsib_weight *w3,
                              const dsib_weight *w2, float limit, uint32_t n, dsib_view y,
                              uint32_t ldy);

    /* SwiGLU with clamp (shared expert): y = silu(min(g,lim))·clamp(u,±lim), rows×width;
     * y may alias g. lim <= 0: no clamp. */
    dsi_status (*swiglu)(dsib_instance *inst, dsib_view g, uint32_t ldg, dsib_view u,
                         uint32_t ldu, dsib_view y, uint32_t ldy, uint32_t rows,
                         uint32_t width, float limit);

    /* (The V4.1 engineer appends the V4.1-specific ops below this line.) */

    /* ==== V4.1 ops (DeepSeek V4.1 Flash, model-spec §4) — owned by the V4.1 engineer ==== */

    /* Two-level indexer top-k (§4.3, §10.2). For token t at p = pos0 + t with
     * nvis = (p+1)/ratio visible compressed positions: score_c = Σ_h relu(q[t][h]·k_c)·w[t][h]
     * (h ascending; dot in index order, f32) for c < nvis; q: [n][heads][hd] (ldq),
     * w: [n][heads] (ldw), keys: [rows][hd] contiguous.
     *  - cand_out.buf != NULL (candidate source): block scores B_b = max of score_c over the
     *    visible c of block b = c / cand_block (unmasked scores); the block holding c = nvis−1
     *    is forced to +inf; the min(cand_k, n_blocks) best blocks (ties: lower block first)
     *    are written ascending to cand_out[t][0:cand_k] (int32, row stride cand_k), rest −1.
     *  - cand_in.buf != NULL (masked index source): only positions whose block c / cand_block
     *    is listed in cand_in[t][0:cand_k] (ascending, −1 padded) can be selected; the others
     *    score −inf and are never selected.
     * idx[t][0:topk] (int32, row stride topk) = the min(topk, n_allowed) best allowed
     * positions (ties: lower position first), in ascending position order; rest −1. */
    dsi_status (*indexer_topk_v41)(dsib_instance *inst, dsib_view q, uint32_t ldq,
                                   dsib_view w, uint32_t ldw, dsib_view keys, uint32_t heads,
                                   uint32_t hd, int64_t pos0, uint32_t n, uint32_t ratio,
                                   uint32_t topk, dsib_view idx, dsib_view cand_in,
                                   dsib_view cand_out, uint32_t cand_block, uint32_t cand_k);

    /* Engram gate (§4.6 steps 3–5), in place on the HC state X: [n][n_hc][D] (row stride
     * n_hc·D). kv: [n][(n_hc+1)·D] (ldkv): key_h = kv[t][h·D, (h+1)·D), value =
     * kv[t][n_hc·D, (n_hc+1)·D). qw, kw: weights ne = [D, n_hc] (q_weight, k_weight).
     * Per stream h (d ascending, f32): a = Σ X[h][d]², b = Σ key_h[d]²,
     * c = Σ X[h][d]·(qw[h][d]·kw[h][d])·key_h[d];
     * dot = c · rsqrt(a/D + eps) · rsqrt(b/D + eps) / √D;
     * g = sigmoid(sign(dot)·sqrt(max(|dot|, 1e-6))); X[h][d] += g·value[d]. */
    dsi_status (*engram_gate)(dsib_instance *inst, dsib_view X, uint32_t n, uint32_t n_hc,
                              uint32_t D, dsib_view kv, uint32_t ldkv, const dsib_weight *qw,
                              const dsib_weight *kw, float eps);
};

#endif /* DSI_BACKEND_H */
