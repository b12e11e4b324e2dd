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
 *   base_c + ((s · rows_c) + r) · ld_c floats,
 * which is exactly the dsib_state view the ops take (backends/backend.h), so one op call
 * serves rows of any number of sequences. Slots are acquired per sequence (a session) and
 * released when it ends; a full pool doubles its capacity (new buffer, device-side copy of
 * every component, a new `generation` — captured graphs keyed on the old one are dropped by
 * their owners). Steps hold the pool's shared lock while they use its buffer; growth takes
 * it exclusively.
 *
 * Later users plug in here:
 *   - packed state (FP8 / FP4 rows, §3.8 deployment layout): a component gets a format
 *     (dsib_state.format) and a byte row size; ops that read it dequantise on the fly;
 *   - million-token contexts: components get paged (slot → page table), so a slot grows
 *     as its sequence grows; the layout/pool API below (acquire, reserve, state views) stays;
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
    uint32_t ld;       /* floats per row */
} dsii_kv_comp;

typedef struct dsii_kv_layout {
    dsii_kv_comp *c;
    uint32_t n, cap;
    uint32_t margin;       /* exact-rewind margin (tokens) the rings were sized with */
    uint64_t slot_bytes;   /* bytes of one slot (all components) */
    const dsi_context *ctx;
    dsi_status status;     /* first failure of an add (out of host memory) */
} dsii_kv_layout;

void dsii_kv_layout_init(dsii_kv_layout *l, const dsi_context *ctx, uint32_t margin);
void dsii_kv_layout_free(dsii_kv_layout *l);
/* Adds a component; returns its id (check l->status once at the end). */
uint32_t dsii_kv_add(dsii_kv_layout *l, uint32_t kind, uint32_t rows, uint32_t ld);

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

/* Steps: hold the shared lock while recording and running work on the pool's buffer.
 * The views stay valid (same generation) until the lock is released. */
void dsii_kv_pool_lock(dsii_kv_pool *p);
void dsii_kv_pool_unlock(dsii_kv_pool *p);
uint32_t dsii_kv_pool_generation(const dsii_kv_pool *p); /* under the lock */
uint32_t dsii_kv_pool_slots(const dsii_kv_pool *p);      /* capacity, under the lock */

/* The dsib_state view of component `comp` (under the lock). */
struct dsib_state;
void dsii_kv_pool_state(const dsii_kv_pool *p, uint32_t comp, struct dsib_state *out);

/* Bytes of one slot; export / import every component of a slot to / from host memory of
 * that size (snapshots; blocking; the slot's sequence must not be running). */
uint64_t dsii_kv_slot_bytes(const dsii_kv_pool *p);
dsi_status dsii_kv_slot_export(dsii_kv_pool *p, uint32_t slot, void *dst, dsii_error *e);
dsi_status dsii_kv_slot_import(dsii_kv_pool *p, uint32_t slot, const void *src, dsii_error *e);

#endif /* DSI_KV_H */
