/* lib/kv/kv.c — state buffer planning (see kv.h). */
#include "kv/kv.h"

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

void dsii_kv_plan_ring(dsii_kv_plan *p, uint32_t len, uint32_t width, dsii_kv_ring *out) {
    p->size = align64(p->size);
    out->off = p->size;
    out->len = len;
    out->width = width;
    p->size += (uint64_t)len * width * sizeof(float);
}

void dsii_kv_plan_rows(dsii_kv_plan *p, uint32_t cap, uint32_t width, dsii_kv_rows *out) {
    p->size = align64(p->size);
    out->off = p->size;
    out->cap = cap;
    out->width = width;
    p->size += (uint64_t)cap * width * sizeof(float);
}

void dsii_kv_plan_compressor(dsii_kv_plan *p, uint32_t ratio, int overlap, uint32_t hd,
                             uint32_t n_ctx, uint32_t margin, dsii_kv_compressor *out) {
    out->ratio = ratio;
    out->overlap = overlap ? 1 : 0;
    out->hd = hd;
    uint32_t span = overlap ? 2 * ratio : ratio;
    uint32_t w = (1 + out->overlap) * hd;
    dsii_kv_plan_ring(p, span + margin, w, &out->kv);
    dsii_kv_plan_ring(p, span + margin, w, &out->sc);
    dsii_kv_plan_rows(p, n_ctx / ratio + 1, hd, &out->out);
}
