/* lib/kv/kv.c — state layouts and the state pool (see kv.h). */
#define _POSIX_C_SOURCE 200809L /* pthread_rwlock_t */
#include "kv/kv.h"

#include "backend/device.h"
#include "backends/backend.h"

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
    /* 64-byte aligned component regions: keep every slot's part a multiple of 64 bytes */
    uint64_t b = (uint64_t)c->rows * c->ld * sizeof(float);
    l->slot_bytes += (b + 63) & ~(uint64_t)63;
    return l->n++;
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
}

/* ---- pool ------------------------------------------------------------------------------ */

struct dsii_kv_pool {
    dsii_device *dev;
    dsii_kv_layout layout;
    uint64_t key;
    pthread_rwlock_t rw;        /* steps: shared; growth: exclusive */
    pthread_mutex_t slots_lock; /* used[] */
    dsib_buffer *buf;
    uint64_t *base;             /* [n comps] byte offset of each component region */
    uint32_t cap;               /* slots */
    uint32_t generation;
    uint8_t *used;
};

static uint64_t region_bytes(const dsii_kv_comp *c, uint32_t slots) {
    uint64_t b = (uint64_t)slots * c->rows * c->ld * sizeof(float);
    return (b + 255) & ~(uint64_t)255;
}

/* Offsets of every component region for `slots` slots; returns the total size. */
static uint64_t plan(const dsii_kv_layout *l, uint32_t slots, uint64_t *base) {
    uint64_t off = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        base[i] = off;
        off += region_bytes(&l->c[i], slots);
    }
    return off ? off : 256;
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
    if (!p || !base) {
        dsii_free(ctx, p);
        dsii_free(ctx, base);
        dsii_kv_layout_free(layout);
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "state pool: out of host memory");
    }
    p->dev = dev;
    p->layout = *layout;
    memset(layout, 0, sizeof *layout);
    p->key = key;
    p->base = base;
    pthread_rwlock_init(&p->rw, NULL);
    pthread_mutex_init(&p->slots_lock, NULL);
    *out = p;
    return DSI_OK;
}

void dsii_kv_pool_free(dsii_kv_pool *p) {
    if (!p) return;
    const dsi_context *ctx = p->layout.ctx;
    if (p->buf) p->dev->be->buffer_free(p->dev->inst, p->buf);
    dsii_free(ctx, p->base);
    dsii_free(ctx, p->used);
    pthread_rwlock_destroy(&p->rw);
    pthread_mutex_destroy(&p->slots_lock);
    dsii_kv_layout_free(&p->layout);
    dsii_free(ctx, p);
}

uint64_t dsii_kv_pool_key(const dsii_kv_pool *p) { return p->key; }
const dsii_kv_layout *dsii_kv_pool_layout(const dsii_kv_pool *p) { return &p->layout; }

/* Grows to `ncap` slots: a new buffer, every component region copied on the device, a new
 * generation. Called with the exclusive lock held. */
static dsi_status grow(dsii_kv_pool *p, uint32_t ncap, dsii_error *e) {
    const dsi_context *ctx = p->layout.ctx;
    const dsib_backend *be = p->dev->be;
    uint64_t *nb = dsii_calloc(ctx, p->layout.n ? p->layout.n : 1, sizeof *nb);
    uint8_t *nu = dsii_calloc(ctx, ncap, 1);
    if (!nb || !nu) {
        dsii_free(ctx, nb);
        dsii_free(ctx, nu);
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "state pool: out of host memory");
    }
    uint64_t size = plan(&p->layout, ncap, nb);
    dsib_buffer *buf = NULL;
    dsib_error be_err = {{0}};
    dsi_status st = be->buffer_alloc(p->dev->inst, size, DSIB_BUFFER_STATE, &buf, &be_err);
    if (st != DSI_OK) {
        dsii_free(ctx, nb);
        dsii_free(ctx, nu);
        return dsii_fail(e, st, "state pool: allocating %u slots (%llu bytes): %s", ncap,
                         (unsigned long long)size, be_err.msg);
    }
    if (p->buf && p->cap) {
        /* the old slots keep their indices: region i of the new buffer starts with the old
         * region i (slot-major inside a region) */
        dsib_stream *s = NULL;
        dsib_stream_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.struct_size = sizeof sd;
        st = be->stream_create(p->dev->inst, &sd, &s, &be_err);
        for (uint32_t i = 0; st == DSI_OK && i < p->layout.n; i++) {
            const dsii_kv_comp *c = &p->layout.c[i];
            uint64_t bytes = (uint64_t)p->cap * c->rows * c->ld * sizeof(float);
            dsib_view src = {p->buf, p->base[i]}, dst = {buf, nb[i]};
            st = p->dev->be->ops->copy(s, src, dst, bytes);
        }
        if (st == DSI_OK) st = be->sync(s, &be_err);
        be->stream_destroy(s);
        if (st != DSI_OK) {
            be->buffer_free(p->dev->inst, buf);
            dsii_free(ctx, nb);
            dsii_free(ctx, nu);
            return dsii_fail(e, st, "state pool: copying %u slots: %s", p->cap, be_err.msg);
        }
        memcpy(nu, p->used, p->cap);
        be->buffer_free(p->dev->inst, p->buf);
    }
    dsii_free(ctx, p->base);
    dsii_free(ctx, p->used);
    p->buf = buf;
    p->base = nb;
    p->used = nu;
    p->cap = ncap;
    p->generation++;
    return DSI_OK;
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

void dsii_kv_pool_state(const dsii_kv_pool *p, uint32_t comp, dsib_state *out) {
    memset(out, 0, sizeof *out);
    if (comp >= p->layout.n) return;
    const dsii_kv_comp *c = &p->layout.c[comp];
    out->buf = p->buf;
    out->offset = p->base[comp];
    out->slots = p->cap;
    out->rows = c->rows;
    out->ld = c->ld;
    out->format = DSIB_STATE_F32;
}

uint64_t dsii_kv_slot_bytes(const dsii_kv_pool *p) {
    uint64_t b = 0;
    for (uint32_t i = 0; i < p->layout.n; i++)
        b += (uint64_t)p->layout.c[i].rows * p->layout.c[i].ld * sizeof(float);
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
        uint64_t bytes = (uint64_t)c->rows * c->ld * sizeof(float);
        uint64_t off = p->base[i] + (uint64_t)slot * bytes;
        st = out ? p->dev->be->download(p->dev->inst, p->buf, off, host, bytes, &be_err)
                 : p->dev->be->upload(p->dev->inst, p->buf, off, host, bytes, &be_err);
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
