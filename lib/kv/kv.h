/*
 * lib/kv — layout and position rules of the per-session attention state (model-spec §3.4,
 * §3.8; docs/internals.md "Session state").
 *
 * Everything lives in ONE backend buffer per session (DSIB_BUFFER_STATE), carved into:
 *   - rings: the last `len` token rows of some width, slot = position mod len (window KV,
 *     compressor token rows kv/score);
 *   - row arrays: append-only rows indexed by group (compressed KV rows, index keys).
 * Rings are sized span + rewind margin: `span` is what the forward pass reads behind the
 * first token of a step, the margin lets a timeline be truncated by up to `margin` tokens
 * without losing a row that re-evaluation would read (exact rewinds, arch.h).
 *
 * The host decides everything position-dependent from positions alone (which groups a step
 * completes, where a row goes); the data never comes back to the host.
 */
#ifndef DSI_KV_H
#define DSI_KV_H

#include <stdint.h>

typedef struct dsii_kv_ring {
    uint64_t off;      /* byte offset in the state buffer */
    uint32_t len;      /* slots */
    uint32_t width;    /* floats per slot (slot stride) */
} dsii_kv_ring;

typedef struct dsii_kv_rows {
    uint64_t off;
    uint32_t cap;      /* rows */
    uint32_t width;    /* floats per row */
} dsii_kv_rows;

/* A bump allocator over the state buffer (64-byte aligned pieces). */
typedef struct dsii_kv_plan {
    uint64_t size;
} dsii_kv_plan;

void dsii_kv_plan_ring(dsii_kv_plan *p, uint32_t len, uint32_t width, dsii_kv_ring *out);
void dsii_kv_plan_rows(dsii_kv_plan *p, uint32_t cap, uint32_t width, dsii_kv_rows *out);

/* Token-row compressor state for ratio r (§3.4): overlapping (CSA, r = 4, coff = 2) reads
 * the previous group as well, so the ring spans 2r positions, otherwise r. */
typedef struct dsii_kv_compressor {
    uint32_t ratio, overlap, hd;   /* hd: output row width; token rows are (1+overlap)·hd */
    dsii_kv_ring kv, sc;           /* token rows (projection, score incl. ape) */
    dsii_kv_rows out;              /* compressed rows, one per completed group */
} dsii_kv_compressor;

void dsii_kv_plan_compressor(dsii_kv_plan *p, uint32_t ratio, int overlap, uint32_t hd,
                             uint32_t n_ctx, uint32_t margin, dsii_kv_compressor *out);

/* Groups a step [pos0, pos0+n) completes: w in [*w0, *w0 + *ng). A group w completes at
 * position (w+1)·r − 1. */
static inline void dsii_kv_groups_in_step(int64_t pos0, uint32_t n, uint32_t ratio, int64_t *w0,
                                          uint32_t *ng) {
    int64_t a = pos0 / ratio, b = (pos0 + (int64_t)n) / ratio;
    *w0 = a;
    *ng = (uint32_t)(b - a);
}

#endif /* DSI_KV_H */
