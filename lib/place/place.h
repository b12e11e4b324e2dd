/*
 * lib/place — memory tiers (docs/placement.md): the planner that decides at dsi_model_load
 * where every tensor lives (the compute device, host RAM, or the model file read on demand)
 * from a policy, a device budget, a host budget and per-tensor overrides, and the expert
 * tier that serves routed experts streamed from the file through a bounded cache.
 *
 * The plan is made once, before the weights are read (lib/model/model_load.c): tensors in
 * the disk tier are marked lazy there, so no byte of them is read at load. The expert tier
 * is created with the model's execution side (lib/arch/exec.c) and used by lib/moe: after
 * the router, the selected experts of a layer are looked up in the cache (a miss reads the
 * expert's three slices with pread), the step's selection ids are rewritten to cache slots
 * and the backend's moe_experts runs on the cache buffer. Each row's result is the same
 * sequence of operations on the same bytes as with resident experts (the op sums a row's k
 * experts in k order; grouping is by expert), so logits are bit-identical across
 * placements (tests/model/test_place.c).
 *
 * Thread-safety: the plan is immutable after the load; the expert tier is shared by every
 * session of the model (one lock; slots in use are pinned), its counters are atomics.
 */
#ifndef DSI_PLACE_H
#define DSI_PLACE_H

#include "backend/device.h"
#include "backends/backend.h"
#include "base/base.h"

#include <stdatomic.h>
#include <stdint.h>

struct dsii_tensor;
struct dsii_moe_weights;

/* Tiers: the public DSI_TIER_* values. */
enum { DSII_TIER_DEVICE = 0, DSII_TIER_HOST = 1, DSII_TIER_DISK = 2 };

/* Tensor classes of a plan. */
enum {
    DSII_PC_EMBED = 0,   /* token_embd, output */
    DSII_PC_ATTN,        /* attention, compressors, indexer, mHC */
    DSII_PC_ROUTER,      /* ffn_gate_inp, selection bias, tid2eid */
    DSII_PC_EXPERTS,     /* routed experts of the backbone layers */
    DSII_PC_SHARED,      /* shared experts */
    DSII_PC_ENGRAM,      /* Engram tables and projections */
    DSII_PC_DRAFT,       /* MTP / DSpark blocks */
    DSII_PC_OTHER,       /* norms and the rest */
    DSII_PC_COUNT
};

/* Policies and cache policies: the public values (dsinfer.h experimental section). */
enum {
    DSII_PLACE_AUTO = 0,
    DSII_PLACE_ALL_RESIDENT = 1,
    DSII_PLACE_EXPERTS_HOST = 2,
    DSII_PLACE_EXPERTS_STREAMED = 3
};
enum { DSII_CACHE_LRU = 0, DSII_CACHE_LFU = 1 };
/* How a GPU compute device runs the routed experts of tiered layers (public DSI_HYBRID_*). */
enum { DSII_HYBRID_CPU = 0, DSII_HYBRID_UPLOAD = 1, DSII_HYBRID_AUTO = 2 };
#define DSII_PLACE_FLAG_NO_PREFETCH (1u << 0)
#define DSII_PLACE_FLAG_DIRECT_IO (1u << 1)
/* O_DIRECT reads: offsets, lengths and buffers aligned to this */
#define DSII_XTIER_DIO_ALIGN 4096u

typedef struct dsii_xtier dsii_xtier;

/* Disk reads into a GPU expert cache, and O_DIRECT reads, go through host staging pieces of
 * DSII_XTIER_PIECE (+ alignment) bytes, at most DSII_XTIER_STAGES at once (counted in the
 * host budget); a step reads its missing experts with up to 4 threads. */
#define DSII_XTIER_PIECE (1u << 20)
#define DSII_XTIER_STAGES 4u

typedef struct dsii_place {
    uint32_t policy;              /* resolved (never AUTO) */
    uint32_t cache_policy;
    uint32_t flags;
    int32_t cpu_compute;          /* the compute device is the CPU */
    uint64_t device_budget, host_budget;
    uint8_t *tier;                /* [n_tensors]: DSII_TIER_* */
    uint8_t *cls;                 /* [n_tensors]: DSII_PC_* */
    int32_t layer_streamed[128];  /* backbone layer l: its routed experts are served by the
                                     expert tier (disk tier; next to a GPU also the host tier) */
    int32_t layer_host[128];      /* ... from host RAM (the host tier next to a GPU: t->data) */
    uint32_t n_tiered_layers;     /* layers with layer_streamed set */
    uint32_t n_experts_tiered;    /* (layer, expert) pairs of those layers */
    uint32_t hybrid;              /* DSII_HYBRID_* (GPU compute device with tiered layers) */
    int32_t cache_on_device;      /* the expert cache is GPU memory (hybrid UPLOAD / AUTO) */
    uint32_t hybrid_rows;         /* hybrid AUTO: rows per routed expert from which a step uploads */
    uint32_t dev_experts;         /* hybrid CPU: experts 0 .. dev_experts-1 of each tiered layer
                                     kept on the GPU */
    uint64_t dev_split_bytes;     /* their device bytes */
    uint64_t *profile;            /* dsi_place_options.expert_counts (copied; NULL: none),
                                     [n_layers][profile_stride] */
    uint32_t profile_stride;
    uint32_t *dev_ids;            /* [128][dev_experts]: with a routing profile
                                     (dsi_place_options.expert_counts), the experts of each
                                     tiered layer kept on the GPU instead (ascending ids);
                                     NULL: experts 0 .. dev_experts-1 */
    uint64_t expert_unit_bytes;   /* largest (gate + up + down) slice of one expert, 64-aligned parts */
    uint32_t n_experts_streamed;
    uint32_t max_k;               /* largest k of the streamed layers */
    uint32_t cache_slots;
    uint64_t cache_bytes;
    uint64_t tier_fixed, tier_bytes; /* the expert tier's bookkeeping (host) */
    uint64_t owned_bytes;         /* pread-owned resident weights (host) */
    uint64_t mapped_bytes;
    uint64_t device_bytes, host_bytes, disk_bytes;
    uint64_t class_bytes[DSII_PC_COUNT][3];
    uint32_t class_tensors[DSII_PC_COUNT];
    dsii_xtier *xt;               /* created with the execution side (NULL: nothing streamed) */
    uint64_t engram_cache_bytes;  /* planned Engram row cache (over the disk-tier tables) */
    uint32_t n_engram_disk;       /* Engram tables in the disk tier */
    struct dsii_engram_cache *ecache[16];
    atomic_ullong engram_hits, engram_misses, engram_bytes_read;
    /* counters */
    atomic_ullong hits, misses, prefetches, prefetch_hits, bytes_read, bytes_uploaded, read_ns,
        steps, cpu_experts, device_experts, host_used, host_peak, overlap_cpu_ns, overlap_wait_ns;
} dsii_place;

/* Plans the model's placement (called by the loader after binding, before any weight is
 * read). `popt` is the caller's dsi_place_options (may be NULL: all resident, nothing
 * else changes). Marks disk-tier tensors lazy. On failure returns the status with a clear
 * message (bad option values: INVALID_ARGUMENT; budgets too small: OUT_OF_HOST_MEMORY /
 * OUT_OF_DEVICE_MEMORY; placements the device cannot run: UNSUPPORTED). */
dsi_status dsii_place_plan(dsi_model *m, const void *popt, dsii_error *e);
void dsii_place_free(dsi_model *m);

/* Creates the expert tier for the compute device (exec creation); DSI_OK and nothing when no
 * layer is tiered. Next to a GPU the tier either keeps its cache on the GPU (hybrid UPLOAD)
 * or runs the experts on the context's CPU instance (hybrid CPU). */
dsi_status dsii_place_exec_init(dsi_model *m, dsii_device *dev, dsii_error *e);
void dsii_place_exec_fini(dsi_model *m);

/* Binds the routed experts of backbone layer `layer` into `mw` (w1 / w3 / w2): through the
 * weight table when resident, else as the expert tier's (geometry only; mw->xt set). */
struct dsii_wtable;
dsi_status dsii_place_bind_experts(struct dsii_wtable *wt, int32_t layer,
                                   const struct dsii_tensor *gate, const struct dsii_tensor *up,
                                   const struct dsii_tensor *down, struct dsii_moe_weights *mw,
                                   dsii_error *e);

/* The routed experts of a tiered layer (lib/moe): sel / wts as moe_route wrote them on
 * stream `strm` of the compute device `dev`; y[t] as moe_experts gives with resident experts
 * on the device that computes them (the CPU device, or a GPU with hybrid UPLOAD: the same
 * bytes; hybrid CPU next to a GPU: the CPU instance's results, uploaded into y). Syncs `strm`
 * (the routing is read on the host). `cancel` (may be NULL): a nonzero value stops a long
 * read with CANCELLED. */
/* `shared` (may be NULL): records the layer's shared expert on `strm`; hybrid CPU records it
 * right after the routing and lets it run on the GPU while the CPU computes (the caller then
 * records only the final add); else the tier calls it after the routed experts. */
typedef struct dsii_xtier_shared {
    dsi_status (*record)(void *ctx, dsii_error *e);
    void *ctx;
} dsii_xtier_shared;
dsi_status dsii_xtier_experts(dsii_xtier *xt, const dsii_device *dev, dsib_stream *strm,
                              const struct dsii_moe_weights *w, dsib_view x, uint32_t ldx,
                              dsib_view sel, dsib_view wts, uint32_t n, dsib_view y,
                              uint32_t ldy, const atomic_int *cancel,
                              const dsii_xtier_shared *shared, dsii_error *e);

/* Read-ahead (after layer `layer`'s routed experts, before its shared expert): predicts the
 * next streamed layer's experts from this layer's input `x` with that layer's router (hash
 * layers: exactly, from the token ids) and queues their reads on the tier's reader thread.
 * Uses logits / sel / wts as scratch. Never fails (a prediction is only a hint). */
void dsii_xtier_predict(dsii_xtier *xt, const dsii_device *dev, dsib_stream *strm, int32_t layer,
                        dsib_view x, uint32_t ldx, dsib_view ids, uint32_t n, dsib_view logits,
                        dsib_view sel, dsib_view wts);

/* Host bytes of the tier's own bookkeeping beside the cache: `fixed` plus `per_slot` per
 * slot, for `total_experts` streamed (layer, expert) pairs (counted in the host budget). */
void dsii_xtier_cost(uint64_t total_experts, uint64_t *fixed, uint64_t *per_slot);

/* Slots of the model's expert cache (0: none); lanes size their workspace for them. */
uint32_t dsii_xtier_slots(const dsi_model *m);
/* Benchmark hook (dsinfer-bench --place on a GPU; never set by the library): 1 = hybrid-CPU
 * split steps compute only the GPU's part, 2 = only the CPU's part (the other adds nothing:
 * wrong logits, the time of one part alone). Set while no step runs. */
extern atomic_int dsii_xtier_part_test; /* (3: neither part) */

/* Nonzero when the model's steps read routing on the host mid-step (tiered layers): such
 * steps cannot be captured and replayed. */
int dsii_xtier_active(const dsi_model *m);

/* Attaches the plan's row cache to Engram table `j` (a disk-tier table; lib/arch/dsv41.c);
 * nothing when the plan has none. */
struct dsii_engram_table;
dsi_status dsii_place_engram_cache(dsi_model *m, uint32_t j, struct dsii_engram_table *t,
                                   dsii_error *e);

/* Counts one evaluation step (lib/arch/exec.c). */
void dsii_place_count_step(dsi_model *m);

#endif /* DSI_PLACE_H */
