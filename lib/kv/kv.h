/*
 * lib/kv — per-sequence model state: its layout and the state pool that holds the state of
 * many sequences (model-spec §3.4, §3.8; docs/internals.md "State pool").
 *
 * Layout. An architecture describes the state of one sequence as a list of components,
 * each `rows` rows of `ld` floats:
 *   - rings: the last `rows` token rows of some width, row = position mod rows (window KV,
 *     compressor token rows kv/score). Rings are sized span + rewind margin: `span` is what
 *     the forward pass reads behind the first row of a step; the margin lets a timeline be
 *     truncated by up to `margin` tokens without losing a row a re-evaluation would read
 *     (exact rewinds: speculative rollback is such a rewind);
 *   - row arrays: append-only rows indexed by group (compressed KV rows, index keys), row w
 *     depends only on tokens < (w+1)·ratio.
 * Everything is position-addressed: truncating a sequence to a prefix (within the margin)
 * needs no device work — the caller's frontier (its token count) just moves.
 *
 * Pool. A pool holds the state of up to `cap` sequences ("slots") of one layout in ONE
 * backend buffer, component-major: component c of slot s, row r is at
 *   base_c + ((s · arows_c) + r) · row_bytes_c bytes (arows_c: rows allocated per slot now),
 * which is exactly the dsib_state view the ops take (backends/backend.h), so one op call
 * serves rows of any number of sequences. Slots are acquired per sequence (a session) and
 * released when it ends; a full pool doubles its capacity (new buffer, device-side copy of
 * every component, a new `generation` — captured graphs keyed on the old one are dropped by
 * their owners). Steps hold the pool's shared lock while they use its buffer; growth takes
 * it exclusively.
 *
 * Packed state (issue 19): a component declares its rows' quantised form
 * (dsii_kv_set_format); a layout with `packed` set stores them as FP8 / FP4 codes + block
 * scales (dsib_state.format, row_bytes; lib/quant/statepack.h), which the ops read in place.
 * Lazy state: row arrays are allocated for the positions the pool's sequences reach
 * (dsii_kv_pool_reserve), not for n_ctx. Other users:
 *   - snapshots: dsii_kv_slot_export / import copy one slot's rows (every component);
 *   - speculative rollback: the frontier moves back (within the margin, no device work);
 *   - forks (beam / prefix sharing): dsii_kv_slot_copy.
 */
#ifndef DSI_KV_H
#define DSI_KV_H

#include "base/base.h"

#include <stdint.h>

struct dsii_device; /* lib/backend/device.h */

enum { DSII_KV_RING = 0, DSII_KV_ROWS = 1 };

typedef struct dsii_kv_comp {
    uint32_t kind;     /* DSII_KV_RING / DSII_KV_ROWS */
    uint32_t rows;     /* rows per slot */
    uint32_t ld;       /* values per row */
    int32_t format;    /* DSIB_STATE_* (lib/quant/statepack.h): F32 unless the layout packs */
    uint32_t qcols, block; /* packed formats: quantised values per row, values per scale */
    uint32_t row_bytes;    /* bytes per row (F32: ld · 4) */
    int32_t decl_format;   /* the declared quantised form (even when stored f32) */
    uint32_t decl_qcols, decl_block;
    uint32_t ratio;    /* DSII_KV_ROWS: positions per row (row w is written by position
                          (w+1)·ratio − 1, so a prefix of P tokens has P / ratio valid rows);
                          0 = unknown (snapshots then keep every row). Rings: 0. */
} dsii_kv_comp;

typedef struct dsii_kv_layout {
    dsii_kv_comp *c;
    uint32_t n, cap;
    uint32_t margin;       /* exact-rewind margin (tokens) the rings were sized with */
    int packed;            /* set before the architecture fills the layout: components whose
                              format it declares (dsii_kv_set_format) are stored packed */
    int offload;           /* row arrays (compressed rows, index keys) in host RAM the device
                              reads (DSIB_BUFFER_HOST_MEMORY): the state the device budget
                              cannot hold; rings stay in device memory */
    uint64_t slot_bytes;   /* bytes of one slot (all components) */
    const dsi_context *ctx;
    dsi_status status;     /* first failure of an add (out of host memory) */
} dsii_kv_layout;

void dsii_kv_layout_init(dsii_kv_layout *l, const dsi_context *ctx, uint32_t margin);
void dsii_kv_layout_free(dsii_kv_layout *l);
/* Adds a component; returns its id (check l->status once at the end). */
uint32_t dsii_kv_add(dsii_kv_layout *l, uint32_t kind, uint32_t rows, uint32_t ld);

/* Declares that row-array component `id` holds one row per `ratio` positions (snapshots
 * keep only a prefix's valid rows). */
void dsii_kv_set_ratio(dsii_kv_layout *l, uint32_t id, uint32_t ratio);

/* Declares the quantised form of a component's rows: every row stored into it is the
 * output of the fake-quant recipe of `format`'s grid on its first `qcols` values in blocks
 * of `block` (model-spec §10.1). With l->packed the component is stored packed (FP8 / FP4
 * codes + scales, lib/quant/statepack.h; bit-exact; rows a multiple of 4 bytes); otherwise
 * it stays f32 (the declaration is still recorded in `decl_*` so snapshots can pack). */
void dsii_kv_set_format(dsii_kv_layout *l, uint32_t id, int32_t format, uint32_t qcols,
                        uint32_t block);

/* Token-row compressor state for ratio r (§3.4): the overlapping compressor (CSA, r = 4,
 * coff = 2) reads the previous group as well, so its rings span 2r positions, otherwise r.
 * Compressed rows: n_ctx / r + 1. */
typedef struct dsii_kv_compressor {
    uint32_t ratio, overlap, hd;   /* hd: output row width; token rows are (1+overlap)·hd */
    uint32_t kv, sc;               /* rings of token rows (projection, score incl. ape) */
    uint32_t out;                  /* compressed rows, one per completed group */
} dsii_kv_compressor;

void dsii_kv_add_compressor(dsii_kv_layout *l, uint32_t ratio, int overlap, uint32_t hd,
                            uint32_t n_ctx, dsii_kv_compressor *out);

/* ---- the pool ------------------------------------------------------------------------ */

typedef struct dsii_kv_pool dsii_kv_pool;

/* Creates an empty pool (no slot yet) for `layout` (taken over, freed with the pool) on
 * device `dev`. `key` identifies the layout for lookups (dsii_kv_pool_key). */
dsi_status dsii_kv_pool_create(struct dsii_device *dev, dsii_kv_layout *layout, uint64_t key,
                               dsii_kv_pool **out, dsii_error *e);
void dsii_kv_pool_free(dsii_kv_pool *p);

uint64_t dsii_kv_pool_key(const dsii_kv_pool *p);
const dsii_kv_layout *dsii_kv_pool_layout(const dsii_kv_pool *p);

/* A free slot (the pool grows when full; its contents are zeroed rows or stale rows of a
 * released sequence — every row is written before it is read). [thread-safe] */
dsi_status dsii_kv_pool_acquire(dsii_kv_pool *p, uint32_t *slot, dsii_error *e);
void dsii_kv_pool_release(dsii_kv_pool *p, uint32_t slot);

/* Lazy state: row arrays are allocated for the positions the pool's sequences reach, not
 * for n_ctx. Before a step that writes or reads positions < n_pos, the pool must hold them:
 * dsii_kv_pool_reserve grows every slot's row arrays (exclusive lock, device copy, new
 * generation) by at least 1/8 (and DSII_KV_GROW_MIN positions), so a sequence at depth D
 * holds at most bytes/token · (1.125 · D + DSII_KV_GROW_MIN + slack) + rings. [thread-safe;
 * not while the caller holds the shared lock] */
#define DSII_KV_INITIAL_POSITIONS 1024u
#define DSII_KV_GROW_MIN 1024u
#define DSII_KV_RESERVE_SLACK 256u /* drafts read / write a few positions past a step */
dsi_status dsii_kv_pool_reserve(dsii_kv_pool *p, uint64_t n_pos, dsii_error *e);
/* Bytes of the pool's buffers now (0 before the first slot; host: those of them in host RAM,
 * layout.offload), positions its arrays hold. */
uint64_t dsii_kv_pool_bytes(dsii_kv_pool *p);
uint64_t dsii_kv_pool_host_bytes(dsii_kv_pool *p);
uint64_t dsii_kv_pool_positions(dsii_kv_pool *p);

/* Steps: hold the shared lock while recording and running work on the pool's buffer.
 * The views stay valid (same generation) until the lock is released. */
void dsii_kv_pool_lock(dsii_kv_pool *p);
void dsii_kv_pool_unlock(dsii_kv_pool *p);
uint32_t dsii_kv_pool_generation(const dsii_kv_pool *p); /* under the lock */
uint32_t dsii_kv_pool_slots(const dsii_kv_pool *p);      /* capacity, under the lock */
uint32_t dsii_kv_pool_buffers(const dsii_kv_pool *p);    /* its buffers, under the lock */

/* The dsib_state view of component `comp` (under the lock). */
struct dsib_state;
void dsii_kv_pool_state(const dsii_kv_pool *p, uint32_t comp, struct dsib_state *out);

/* State bytes per token of context of a layout: the row arrays' bytes per position
 * (Σ row_bytes / ratio) — what grows with the context; rings are a constant. */
double dsii_kv_bytes_per_token(const dsii_kv_layout *l);
/* Bytes of the rings of one slot (independent of n_ctx). */
uint64_t dsii_kv_ring_bytes(const dsii_kv_layout *l);
/* Bytes of one slot at full n_ctx kept in device memory: all of slot_bytes, or without the
 * row arrays when l->offload puts them in host RAM. */
uint64_t dsii_kv_device_slot_bytes(const dsii_kv_layout *l);

/* Bytes of one slot; export / import every component of a slot to / from host memory of
 * that size (snapshots; blocking; the slot's sequence must not be running). */
uint64_t dsii_kv_slot_bytes(const dsii_kv_pool *p);
dsi_status dsii_kv_slot_export(dsii_kv_pool *p, uint32_t slot, void *dst, dsii_error *e);
dsi_status dsii_kv_slot_import(dsii_kv_pool *p, uint32_t slot, const void *src, dsii_error *e);

/* Rows [row0, row0 + n) of component `comp` of `slot` to / from host memory (n · row_bytes
 * bytes, the component's stored form;
 * blocking; the slot's sequence must not be running). Snapshots (lib/kv/snapshot.h) copy
 * only the rows a prefix needs with these. INVALID_ARGUMENT when the range is outside. */
dsi_status dsii_kv_rows_read(dsii_kv_pool *p, uint32_t slot, uint32_t comp, uint32_t row0,
                             uint32_t n, void *dst, dsii_error *e);
dsi_status dsii_kv_rows_write(dsii_kv_pool *p, uint32_t slot, uint32_t comp, uint32_t row0,
                              uint32_t n, const void *src, dsii_error *e);

#endif /* DSI_KV_H */
