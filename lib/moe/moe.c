/* lib/moe/moe.c — see moe.h. */
#include "moe/moe.h"

#include "place/place.h"

#include <string.h>

#define CK(call, what)                                                                      \
    do {                                                                                    \
        DSII_PROF_BEGIN();                                                                  \
        dsi_status st_ = (call);                                                            \
        DSII_PROF_END(what);                                                                \
        if (st_ != DSI_OK) return dsii_fail(e, st_, "moe: %s failed", what);                \
    } while (0)

/* The shared expert's SwiGLU and down projection (its gate / up ran with the router). */
typedef struct shared_rec {
    const dsii_device *dev;
    dsib_stream *strm;
    const dsii_moe_weights *w;
    const dsii_moe_scratch *s;
    uint32_t n, D;
} shared_rec;

static dsi_status record_shared(void *ctx, dsii_error *e) {
    const shared_rec *r = ctx;
    const dsib_ops *ops = r->dev->be->ops;
    const dsii_moe_weights *w = r->w;
    const dsii_moe_scratch *s = r->s;
    uint32_t F = (uint32_t)w->sh_gate.ne[1], n = r->n, D = r->D;
    dsib_stream *strm = r->strm;
    CK(ops->swiglu(strm, s->sh_g, F, s->sh_u, F, s->sh_g, F, n, F, w->limit_shared), "swiglu");
    CK(ops->matmul(strm, &w->sh_down, 0, s->sh_g, F, s->sh_out, D, n), "shared down");
    return DSI_OK;
}

void dsii_moe_count(_Atomic uint64_t *counts, uint32_t E, const int32_t *ids, uint64_t nk) {
    if (!counts) return;
    for (uint64_t i = 0; i < nk; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < E) atomic_fetch_add_explicit(&counts[ids[i]], 1, memory_order_relaxed);
}

dsi_status dsii_moe_forward(const dsii_device *dev, dsib_stream *strm, const dsii_moe_weights *w,
                            const dsii_moe_scratch *s, dsib_view x, uint32_t ldx, dsib_view ids,
                            uint32_t n, uint32_t D, dsib_view out, uint32_t ldo, dsii_error *e) {
    const dsib_ops *ops = dev->be->ops;
    uint32_t E = w->n_expert, k = w->k;
    const int shared = w->sh_gate.buf != NULL;
    const uint32_t SF = shared ? (uint32_t)w->sh_gate.ne[1] : 0;
    /* the router and the shared expert's gate and up all read x: one call (one parallel job
     * on the CPU; the same results as one matmul each) */
    dsib_mm mm[3] = {{&w->gate_inp, 0, x, ldx, s->logits, E, n},
                     {&w->sh_gate, 0, x, ldx, s->sh_g, SF, n},
                     {&w->sh_up, 0, x, ldx, s->sh_u, SF, n}};
    CK(dsii_op_matmul_multi(dev, strm, mm, shared ? 3u : 1u), "router + shared gate/up matmuls");
    CK(ops->moe_route(strm, s->logits, E, E, k, w->bias.buf ? &w->bias : NULL,
                      w->tid2eid.buf ? &w->tid2eid : NULL, ids, w->norm_add, w->route_scale, n,
                      s->sel, s->wts),
       "routing");
    if (w->counts && strcmp(dev->name, "cpu") == 0) {
        /* the CPU runs each op at once: the ids are there (a GPU's are counted by the tier
         * where it downloads them) */
        const uint8_t *base = dev->be->buffer_host_ptr ? dev->be->buffer_host_ptr(dev->inst, s->sel.buf) : NULL;
        if (base) dsii_moe_count(w->counts, E, (const int32_t *)(const void *)(base + s->sel.offset), (uint64_t)n * k);
    }
    shared_rec sr = {dev, strm, w, s, n, D};
    dsii_xtier_shared sh = {record_shared, &sr};
    if (w->xt) {
        /* experts from the tier (lib/place): bit-identical to the resident path on the device
         * that computes them; the tier records the shared expert (next to a GPU computing on
         * the CPU: while the CPU works) */
        dsi_status st = dsii_xtier_experts(w->xt, dev, strm, w, x, ldx, s->sel, s->wts, n,
                                           s->routed, D, s->cancel, shared ? &sh : NULL, e);
        if (st != DSI_OK) return st;
        dsii_xtier_predict(w->xt, dev, strm, w->xt_layer, x, ldx, ids, n, s->logits, s->sel, s->wts);
    } else {
        CK(ops->moe_experts(strm, x, ldx, s->sel, s->wts, k, &w->w1, &w->w3, &w->w2, w->limit, n,
                            s->routed, D),
           "routed experts");
    }
    if (!w->sh_gate.buf) {
        CK(dsii_op_copy_rows(dev, strm, s->routed, D, out, ldo, n, D), "moe copy");
        return DSI_OK;
    }
    if (!w->xt) {
        dsi_status st = record_shared(&sr, e);
        if (st != DSI_OK) return st;
    }
    CK(ops->add(strm, s->routed, D, s->sh_out, D, out, ldo, n, D), "add");
    return DSI_OK;
}
