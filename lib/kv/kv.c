/* lib/kv/kv.c — state layouts and the state pool (see kv.h). */
#define _POSIX_C_SOURCE 200809L /* pthread_rwlock_t */
#include "kv/kv.h"

#include "backend/device.h"
#include "backends/backend.h"
#include "quant/statepack.h"

#include <pthread.h>
#include <string.h>

/* ---- layout ---------------------------------------------------------------------------- */

void dsii_kv_layout_init(dsii_kv_layout *l, const dsi_context *ctx, uint32_t margin) {
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->margin = margin;
}

void dsii_kv_layout_free(dsii_kv_layout *l) {
    if (!l) return;
    dsii_free(l->ctx, l->c);
    l->c = NULL;
    l->n = l->cap = 0;
}

uint32_t dsii_kv_add(dsii_kv_layout *l, uint32_t kind, uint32_t rows, uint32_t ld) {
    if (l->status != DSI_OK) return 0;
    if (l->n == l->cap) {
        uint32_t nc = l->cap ? 2 * l->cap : 64;
        dsii_kv_comp *c = dsii_realloc(l->ctx, l->c, sizeof *c * nc);
        if (!c) {
            l->status = DSI_ERR_OUT_OF_HOST_MEMORY;
            return 0;
        }
        l->c = c;
        l->cap = nc;
    }
    dsii_kv_comp *c = &l->c[l->n];
    c->kind = kind;
    c->rows = rows ? rows : 1;
    c->ld = ld ? ld : 1;
    c->ratio = 0;
    c->format = DSIB_STATE_F32;
    c->qcols = c->block = 0;
    c->row_bytes = c->ld * (uint32_t)sizeof(float);
    c->decl_format = DSIB_STATE_F32;
    c->decl_qcols = c->decl_block = 0;
    /* 64-byte aligned component regions: keep every slot's part a multiple of 64 bytes */
    uint64_t b = (uint64_t)c->rows * c->row_bytes;
    l->slot_bytes += (b + 63) & ~(uint64_t)63;
    return l->n++;
}

void dsii_kv_set_format(dsii_kv_layout *l, uint32_t id, int32_t format, uint32_t qcols,
                        uint32_t block) {
    if (l->status != DSI_OK || id >= l->n) return;
    dsii_kv_comp *c = &l->c[id];
    if (!dsii_sp_valid(format, c->ld, qcols, block)) {
        l->status = DSI_ERR_INTERNAL;
        return;
    }
    c->decl_format = format;
    c->decl_qcols = qcols;
    c->decl_block = block;
    /* packed rows start on 4-byte boundaries (GPU ops address state in 32-bit words): a
     * form whose row is not a multiple of 4 bytes stays f32 (no model shape has one) */
    if (!l->packed || dsii_sp_row_bytes(format, c->ld, qcols, block) % 4) return;
    uint64_t b = (uint64_t)c->rows * c->row_bytes;
    l->slot_bytes -= (b + 63) & ~(uint64_t)63;
    c->format = format;
    c->qcols = qcols;
    c->block = block;
    c->row_bytes = dsii_sp_row_bytes(format, c->ld, qcols, block);
    b = (uint64_t)c->rows * c->row_bytes;
    l->slot_bytes += (b + 63) & ~(uint64_t)63;
}

double dsii_kv_bytes_per_token(const dsii_kv_layout *l) {
    double b = 0.0;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->c[i].kind == DSII_KV_ROWS && l->c[i].ratio)
            b += (double)l->c[i].row_bytes / l->c[i].ratio;
    return b;
}

uint64_t dsii_kv_ring_bytes(const dsii_kv_layout *l) {
    uint64_t b = 0;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->c[i].kind == DSII_KV_RING) b += (uint64_t)l->c[i].rows * l->c[i].row_bytes;
    return b;
}

uint64_t dsii_kv_device_slot_bytes(const dsii_kv_layout *l) {
    if (!l->offload) return l->slot_bytes;
    uint64_t b = 0;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->c[i].kind != DSII_KV_ROWS)
            b += ((uint64_t)l->c[i].rows * l->c[i].row_bytes + 63) & ~(uint64_t)63;
    return b;
}

void dsii_kv_set_ratio(dsii_kv_layout *l, uint32_t id, uint32_t ratio) {
    if (l->status == DSI_OK && id < l->n && l->c[id].kind == DSII_KV_ROWS) l->c[id].ratio = ratio;
}

void dsii_kv_add_compressor(dsii_kv_layout *l, uint32_t ratio, int overlap, uint32_t hd,
                            uint32_t n_ctx, dsii_kv_compressor *out) {
    out->ratio = ratio;
    out->overlap = overlap ? 1 : 0;
    out->hd = hd;
    uint32_t span = overlap ? 2 * ratio : ratio;
    uint32_t w = (1 + out->overlap) * hd;
    out->kv = dsii_kv_add(l, DSII_KV_RING, span + l->margin, w);
    out->sc = dsii_kv_add(l, DSII_KV_RING, span + l->margin, w);
    out->out = dsii_kv_add(l, DSII_KV_ROWS, n_ctx / ratio + 1, hd);
    dsii_kv_set_ratio(l, out->out, ratio);
}

/* ---- pool ------------------------------------------------------------------------------ */

struct dsii_kv_pool {
    dsii_device *dev;
    dsii_kv_layout layout;
    uint64_t key;
    pthread_rwlock_t rw;        /* steps: shared; growth: exclusive */
    pthread_mutex_t slots_lock; /* used[] */
    dsib_buffer **bufs;         /* [n_bufs] the arenas (see plan) */
    uint32_t n_bufs;
    uint32_t *arena;            /* [n comps] the arena holding each component region */
    uint64_t *base;             /* [n comps] byte offset of each region in its arena */
    uint32_t *arows;            /* [n comps] rows per slot allocated now (<= layout rows) */
    uint64_t pcap;              /* positions every slot's row arrays can hold now */
    uint64_t bytes;             /* size of all arenas */
    uint64_t host_bytes;        /* of those in host RAM */
    uint32_t cap;               /* slots */
    uint32_t generation;
    uint8_t *used;
};

/* Rows per slot of component c when the row arrays hold `pcap` positions: row arrays with a
 * ratio grow with the timeline (lazy state: a long-context session pays for the positions it
 * uses), rings and ratio-less arrays are allocated whole. */
static uint32_t alloc_rows(const dsii_kv_comp *c, uint64_t pcap) {
    if (c->kind != DSII_KV_ROWS || c->ratio == 0) return c->rows;
    uint64_t r = pcap / c->ratio + 2;
    return r < c->rows ? (uint32_t)r : c->rows;
}

static uint64_t region_bytes(const dsii_kv_comp *c, uint32_t rows, uint32_t slots) {
    uint64_t b = (uint64_t)slots * rows * c->row_bytes;
    return (b + 255) & ~(uint64_t)255;
}

/* The pool's buffers ("arenas"): component regions in order, a new arena whenever the next
 * region would take the current one past `cap` — the largest buffer one op binding can
 * address on the device (Vulkan: the binding window inside one allocation chunk; CPU:
 * unlimited, one arena). So a pool of any size works as long as each component region fits
 * one binding; a region that does not is refused (the relayout fails, the pool unchanged).
 * With l->offload the row arrays go to arenas of their own in host RAM (hosted[k] = 1).
 * Fills base, rows, arena (per component), sizes and hosted (per arena, cap l->n + 1);
 * returns the arena count (0: a region alone exceeds cap, *big = its component). */
static int hosted_comp(const dsii_kv_layout *l, uint32_t i) {
    return l->offload && l->c[i].kind == DSII_KV_ROWS;
}
static uint32_t plan(const dsii_kv_layout *l, uint32_t slots, uint64_t pcap, uint64_t cap,
                     uint64_t *base, uint32_t *rows, uint32_t *arena, uint64_t *sizes,
                     uint8_t *hosted, uint32_t *big) {
    uint32_t na = 0;
    for (int h = 0; h < 2; h++) {
        uint64_t off = 0;
        uint32_t first = na;
        for (uint32_t i = 0; i < l->n; i++) {
            if (hosted_comp(l, i) != h) continue;
            rows[i] = alloc_rows(&l->c[i], pcap);
            uint64_t r = region_bytes(&l->c[i], rows[i], slots);
            if (cap && r > cap) {
                *big = i;
                return 0;
            }
            if (na == first || (cap && off + r > cap)) {
                if (na > first) sizes[na - 1] = off ? off : 256;
                hosted[na] = (uint8_t)h;
                na++;
                off = 0;
            }
            arena[i] = na - 1;
            base[i] = off;
            off += r;
        }
        if (na > first) sizes[na - 1] = off ? off : 256;
    }
    if (na == 0) {
        sizes[0] = 256;
        hosted[0] = 0;
        na = 1;
    }
    return na;
}

static void free_bufs(dsii_kv_pool *p, dsib_buffer **bufs, uint32_t n) {
    for (uint32_t i = 0; bufs && i < n; i++)
        if (bufs[i]) p->dev->be->buffer_free(p->dev->inst, bufs[i]);
    dsii_free(p->layout.ctx, bufs);
}

dsi_status dsii_kv_pool_create(dsii_device *dev, dsii_kv_layout *layout, uint64_t key,
                               dsii_kv_pool **out, dsii_error *e) {
    *out = NULL;
    const dsi_context *ctx = layout->ctx;
    if (layout->status != DSI_OK) {
        dsii_kv_layout_free(layout);
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "state layout: out of host memory");
    }
    dsii_kv_pool *p = dsii_calloc(ctx, 1, sizeof *p);
    uint64_t *base = dsii_calloc(ctx, layout->n ? layout->n : 1, sizeof *base);
    uint32_t *arows = dsii_calloc(ctx, layout->n ? layout->n : 1, sizeof *arows);
    if (!p || !base || !arows) {
        dsii_free(ctx, p);
        dsii_free(ctx, base);
        dsii_free(ctx, arows);
        dsii_kv_layout_free(layout);
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "state pool: out of host memory");
    }
    p->dev = dev;
    p->layout = *layout;
    memset(layout, 0, sizeof *layout);
    p->key = key;
    p->base = base;
    p->arows = arows;
    p->pcap = DSII_KV_INITIAL_POSITIONS;
    pthread_rwlock_init(&p->rw, NULL);
    pthread_mutex_init(&p->slots_lock, NULL);
    *out = p;
    return DSI_OK;
}

void dsii_kv_pool_free(dsii_kv_pool *p) {
    if (!p) return;
    const dsi_context *ctx = p->layout.ctx;
    free_bufs(p, p->bufs, p->n_bufs);
    dsii_free(ctx, p->arena);
    dsii_free(ctx, p->base);
    dsii_free(ctx, p->arows);
    dsii_free(ctx, p->used);
    pthread_rwlock_destroy(&p->rw);
    pthread_mutex_destroy(&p->slots_lock);
    dsii_kv_layout_free(&p->layout);
    dsii_free(ctx, p);
}

uint64_t dsii_kv_pool_key(const dsii_kv_pool *p) { return p->key; }
const dsii_kv_layout *dsii_kv_pool_layout(const dsii_kv_pool *p) { return &p->layout; }

/* Re-lays the pool out for `ncap` slots and row arrays of `npcap` positions: new arenas,
 * every component region copied on the device (slot by slot when its rows per slot change),
 * a new generation. Called with the exclusive lock held. */
static dsi_status relayout(dsii_kv_pool *p, uint32_t ncap, uint64_t npcap, dsii_error *e) {
    const dsi_context *ctx = p->layout.ctx;
    const dsib_backend *be = p->dev->be;
    uint32_t nc = p->layout.n ? p->layout.n : 1;
    uint64_t *nb = dsii_calloc(ctx, nc, sizeof *nb), *sizes = dsii_calloc(ctx, nc + 1, sizeof *sizes);
    uint32_t *nr = dsii_calloc(ctx, nc, sizeof *nr), *na = dsii_calloc(ctx, nc, sizeof *na);
    uint8_t *nu = dsii_calloc(ctx, ncap, 1);
    dsib_buffer **bufs = dsii_calloc(ctx, nc + 1, sizeof *bufs);
    uint8_t *hosted = dsii_calloc(ctx, nc + 1, 1);
    dsi_status st = DSI_OK;
    if (!nb || !nu || !nr || !na || !sizes || !bufs || !hosted)
        st = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "state pool: out of host memory");
    uint64_t cap = p->dev->desc.max_buffer_size;
    if (p->dev->desc.max_allocation_size && (!cap || p->dev->desc.max_allocation_size < cap))
        cap = p->dev->desc.max_allocation_size;
    if (cap == UINT64_MAX) cap = 0;
    uint32_t n_bufs = 0, big = 0;
    if (st == DSI_OK) {
        n_bufs = plan(&p->layout, ncap, npcap, cap, nb, nr, na, sizes, hosted, &big);
        if (n_bufs == 0) {
            const dsii_kv_comp *c = &p->layout.c[big];
            st = dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                           "state pool: component %u of %u slots x %u rows x %u bytes does not "
                           "fit one %s binding of %llu bytes",
                           big, ncap, alloc_rows(c, npcap), c->row_bytes, p->dev->name,
                           (unsigned long long)cap);
        }
    }
    uint64_t size = 0, hsize = 0;
    dsib_error be_err = {{0}};
    for (uint32_t k = 0; st == DSI_OK && k < n_bufs; k++) {
        uint32_t fl = DSIB_BUFFER_STATE | (hosted[k] ? DSIB_BUFFER_HOST_MEMORY : 0u);
        st = be->buffer_alloc(p->dev->inst, sizes[k], fl, &bufs[k], &be_err);
        if (st != DSI_OK)
            st = dsii_fail(e, st, "state pool: allocating %u slots of %llu positions (buffer %u "
                           "of %u, %llu bytes%s): %s", ncap, (unsigned long long)npcap, k + 1,
                           n_bufs, (unsigned long long)sizes[k], hosted[k] ? ", host RAM" : "",
                           be_err.msg);
        size += sizes[k];
        if (hosted[k]) hsize += sizes[k];
    }
    if (st == DSI_OK && p->bufs && p->cap) {
        /* the old slots keep their indices (slot-major inside a region) */
        dsib_stream *s = NULL;
        dsib_stream_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.struct_size = sizeof sd;
        st = be->stream_create(p->dev->inst, &sd, &s, &be_err);
        for (uint32_t i = 0; st == DSI_OK && i < p->layout.n; i++) {
            const dsii_kv_comp *c = &p->layout.c[i];
            dsib_buffer *from = p->bufs[p->arena[i]], *to = bufs[na[i]];
            uint32_t keep = p->arows[i] < nr[i] ? p->arows[i] : nr[i];
            if (nr[i] == p->arows[i]) {
                uint64_t bytes = (uint64_t)p->cap * p->arows[i] * c->row_bytes;
                dsib_view src = {from, p->base[i]}, dst = {to, nb[i]};
                st = be->ops->copy(s, src, dst, bytes);
            } else {
                for (uint32_t k = 0; st == DSI_OK && k < p->cap; k++) {
                    dsib_view src = {from, p->base[i] + (uint64_t)k * p->arows[i] * c->row_bytes};
                    dsib_view dst = {to, nb[i] + (uint64_t)k * nr[i] * c->row_bytes};
                    st = be->ops->copy(s, src, dst, (uint64_t)keep * c->row_bytes);
                }
            }
        }
        if (st == DSI_OK) st = be->sync(s, &be_err);
        if (s) be->stream_destroy(s);
        if (st != DSI_OK) st = dsii_fail(e, st, "state pool: copying %u slots: %s", p->cap, be_err.msg);
    }
    if (st != DSI_OK) {
        free_bufs(p, bufs, n_bufs);
        dsii_free(ctx, hosted);
        dsii_free(ctx, nb);
        dsii_free(ctx, nr);
        dsii_free(ctx, na);
        dsii_free(ctx, nu);
        dsii_free(ctx, sizes);
        return st;
    }
    if (p->cap) memcpy(nu, p->used, p->cap < ncap ? p->cap : ncap);
    free_bufs(p, p->bufs, p->n_bufs);
    dsii_free(ctx, hosted);
    dsii_free(ctx, p->base);
    dsii_free(ctx, p->arows);
    dsii_free(ctx, p->arena);
    dsii_free(ctx, p->used);
    dsii_free(ctx, sizes);
    p->bufs = bufs;
    p->n_bufs = n_bufs;
    p->base = nb;
    p->arows = nr;
    p->arena = na;
    p->used = nu;
    p->cap = ncap;
    p->pcap = npcap;
    p->bytes = size;
    p->host_bytes = hsize;
    p->generation++;
    return DSI_OK;
}

static dsi_status grow(dsii_kv_pool *p, uint32_t ncap, dsii_error *e) {
    return relayout(p, ncap, p->pcap, e);
}

/* Largest position count any row array of the layout can hold (n_ctx). */
static uint64_t full_positions(const dsii_kv_layout *l) {
    uint64_t m = 0;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->c[i].kind == DSII_KV_ROWS && l->c[i].ratio) {
            uint64_t q = (uint64_t)l->c[i].rows * l->c[i].ratio;
            if (q > m) m = q;
        }
    return m;
}

dsi_status dsii_kv_pool_reserve(dsii_kv_pool *p, uint64_t n_pos, dsii_error *e) {
    uint64_t need = n_pos + DSII_KV_RESERVE_SLACK;
    pthread_rwlock_rdlock(&p->rw);
    int ok = p->pcap >= need || p->pcap >= full_positions(&p->layout);
    pthread_rwlock_unlock(&p->rw);
    if (ok) return DSI_OK;
    pthread_rwlock_wrlock(&p->rw);
    dsi_status st = DSI_OK;
    if (p->pcap < need && p->pcap < full_positions(&p->layout)) {
        /* geometric growth by 1/8 (at least DSII_KV_GROW_MIN positions): at most 12.5 % +
         * a constant over what the deepest sequence uses, O(total) copying overall */
        uint64_t step = p->pcap / 8 > DSII_KV_GROW_MIN ? p->pcap / 8 : DSII_KV_GROW_MIN;
        uint64_t np = p->pcap + step;
        if (np < need) np = need;
        np = (np + DSII_KV_GROW_MIN - 1) / DSII_KV_GROW_MIN * DSII_KV_GROW_MIN;
        if (p->bufs && p->cap) st = relayout(p, p->cap, np, e);
        else p->pcap = np; /* no buffer yet: the first acquire allocates this size */
    }
    pthread_rwlock_unlock(&p->rw);
    return st;
}

uint64_t dsii_kv_pool_bytes(dsii_kv_pool *p) {
    pthread_rwlock_rdlock(&p->rw);
    uint64_t b = p->bufs ? p->bytes : 0;
    pthread_rwlock_unlock(&p->rw);
    return b;
}

uint64_t dsii_kv_pool_host_bytes(dsii_kv_pool *p) {
    pthread_rwlock_rdlock(&p->rw);
    uint64_t b = p->bufs ? p->host_bytes : 0;
    pthread_rwlock_unlock(&p->rw);
    return b;
}

uint64_t dsii_kv_pool_positions(dsii_kv_pool *p) {
    pthread_rwlock_rdlock(&p->rw);
    uint64_t b = p->pcap;
    pthread_rwlock_unlock(&p->rw);
    return b;
}

dsi_status dsii_kv_pool_acquire(dsii_kv_pool *p, uint32_t *slot, dsii_error *e) {
    pthread_mutex_lock(&p->slots_lock);
    for (uint32_t i = 0; i < p->cap; i++)
        if (!p->used[i]) {
            p->used[i] = 1;
            *slot = i;
            pthread_mutex_unlock(&p->slots_lock);
            return DSI_OK;
        }
    pthread_mutex_unlock(&p->slots_lock);
    /* full: grow (exclusive: no step may use the buffer meanwhile). Lock order: rw, then
     * slots_lock — the same as every other path that takes both. */
    pthread_rwlock_wrlock(&p->rw);
    pthread_mutex_lock(&p->slots_lock);
    dsi_status st = DSI_OK;
    uint32_t i = 0;
    while (i < p->cap && p->used[i]) i++;
    if (i == p->cap) {
        uint32_t ncap = p->cap ? 2 * p->cap : 1;
        if (ncap > 65536) st = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "state pool: too many sequences");
        else st = grow(p, ncap, e);
    }
    if (st == DSI_OK) {
        p->used[i] = 1;
        *slot = i;
    }
    pthread_mutex_unlock(&p->slots_lock);
    pthread_rwlock_unlock(&p->rw);
    return st;
}

void dsii_kv_pool_release(dsii_kv_pool *p, uint32_t slot) {
    pthread_mutex_lock(&p->slots_lock);
    if (slot < p->cap) p->used[slot] = 0;
    pthread_mutex_unlock(&p->slots_lock);
}

void dsii_kv_pool_lock(dsii_kv_pool *p) { pthread_rwlock_rdlock(&p->rw); }
void dsii_kv_pool_unlock(dsii_kv_pool *p) { pthread_rwlock_unlock(&p->rw); }
uint32_t dsii_kv_pool_generation(const dsii_kv_pool *p) { return p->generation; }
uint32_t dsii_kv_pool_slots(const dsii_kv_pool *p) { return p->cap; }
uint32_t dsii_kv_pool_buffers(const dsii_kv_pool *p) { return p->n_bufs; }

void dsii_kv_pool_state(const dsii_kv_pool *p, uint32_t comp, dsib_state *out) {
    memset(out, 0, sizeof *out);
    if (comp >= p->layout.n) return;
    const dsii_kv_comp *c = &p->layout.c[comp];
    out->buf = p->bufs ? p->bufs[p->arena[comp]] : NULL;
    out->offset = p->base[comp];
    out->slots = p->cap;
    out->rows = p->arows[comp];
    out->ld = c->ld;
    out->format = c->format;
    out->row_bytes = c->row_bytes;
    out->qcols = c->qcols;
    out->block = c->block;
}

uint64_t dsii_kv_slot_bytes(const dsii_kv_pool *p) {
    uint64_t b = 0;
    for (uint32_t i = 0; i < p->layout.n; i++) b += (uint64_t)p->arows[i] * p->layout.c[i].row_bytes;
    return b;
}

static dsi_status slot_io(dsii_kv_pool *p, uint32_t slot, uint8_t *host, int out,
                          dsii_error *e) {
    dsii_kv_pool_lock(p);
    dsi_status st = DSI_OK;
    dsib_error be_err = {{0}};
    if (slot >= p->cap) st = dsii_fail(e, DSI_ERR_INVALID_ARGUMENT, "state pool: no slot %u", slot);
    for (uint32_t i = 0; st == DSI_OK && i < p->layout.n; i++) {
        const dsii_kv_comp *c = &p->layout.c[i];
        uint64_t bytes = (uint64_t)p->arows[i] * c->row_bytes;
        uint64_t off = p->base[i] + (uint64_t)slot * bytes;
        dsib_buffer *b = p->bufs[p->arena[i]];
        st = out ? p->dev->be->download(p->dev->inst, b, off, host, bytes, &be_err)
                 : p->dev->be->upload(p->dev->inst, b, off, host, bytes, &be_err);
        if (st != DSI_OK) st = dsii_fail(e, st, "state pool: slot copy: %s", be_err.msg);
        host += bytes;
    }
    dsii_kv_pool_unlock(p);
    return st;
}

dsi_status dsii_kv_slot_export(dsii_kv_pool *p, uint32_t slot, void *dst, dsii_error *e) {
    return slot_io(p, slot, dst, 1, e);
}

dsi_status dsii_kv_slot_import(dsii_kv_pool *p, uint32_t slot, const void *src, dsii_error *e) {
    return slot_io(p, slot, (uint8_t *)(uintptr_t)src, 0, e);
}

static dsi_status rows_io(dsii_kv_pool *p, uint32_t slot, uint32_t comp, uint32_t row0,
                          uint32_t n, uint8_t *host, int out, dsii_error *e) {
    if (n == 0) return DSI_OK;
    dsii_kv_pool_lock(p);
    dsi_status st = DSI_OK;
    dsib_error be_err = {{0}};
    if (slot >= p->cap || comp >= p->layout.n || row0 > p->arows[comp] ||
        n > p->arows[comp] - row0) {
        st = dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                       "state pool: rows %u+%u of component %u slot %u out of range", row0, n,
                       comp, slot);
    } else {
        const dsii_kv_comp *c = &p->layout.c[comp];
        uint64_t rb = c->row_bytes;
        uint64_t off = p->base[comp] + ((uint64_t)slot * p->arows[comp] + row0) * rb;
        uint64_t bytes = (uint64_t)n * rb;
        dsib_buffer *b = p->bufs[p->arena[comp]];
        st = out ? p->dev->be->download(p->dev->inst, b, off, host, bytes, &be_err)
                 : p->dev->be->upload(p->dev->inst, b, off, host, bytes, &be_err);
        if (st != DSI_OK) st = dsii_fail(e, st, "state pool: row copy: %s", be_err.msg);
    }
    dsii_kv_pool_unlock(p);
    return st;
}

dsi_status dsii_kv_rows_read(dsii_kv_pool *p, uint32_t slot, uint32_t comp, uint32_t row0,
                             uint32_t n, void *dst, dsii_error *e) {
    return rows_io(p, slot, comp, row0, n, (uint8_t *)dst, 1, e);
}

dsi_status dsii_kv_rows_write(dsii_kv_pool *p, uint32_t slot, uint32_t comp, uint32_t row0,
                              uint32_t n, const void *src, dsii_error *e) {
    return rows_io(p, slot, comp, row0, n, (uint8_t *)(uintptr_t)src, 0, e);
}
