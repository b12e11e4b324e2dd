/*
 * lib/arch/arch.c — architecture dispatch and the helpers both forward passes share
 * (backend lookup, weight binding).
 */
#include "arch/arch.h"

#include "backend/registry.h"
#include "backends/backend.h"
#include "base/context_impl.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

const dsii_arch *dsii_arch_for_model(const dsi_model *model) {
    if (!model) return NULL;
    switch (model->hp.arch) {
    case DSI_ARCH_DEEPSEEK4: return &dsii_arch_dsv4;
    case DSI_ARCH_DEEPSEEK41: return &dsii_arch_dsv41;
    default: return NULL;
    }
}

dsi_status dsii_arch_backend(const dsi_model *model, const dsib_backend **be,
                             dsib_instance **inst, dsii_error *e) {
    const dsi_context *ctx = model->ctx;
    if (!ctx || !ctx->backend || !ctx->backend->backend || !ctx->backend->inst)
        return dsii_fail(e, DSI_ERR_INTERNAL, "the model's context has no backend instance");
    const dsib_backend *b = ctx->backend->backend;
    if (!b->ops || b->ops->struct_size < sizeof(dsib_ops))
        return dsii_fail(e, DSI_ERR_UNSUPPORTED,
                         "backend '%s' does not implement the model ops of this build",
                         b->name ? b->name : "?");
    *be = b;
    *inst = ctx->backend->inst;
    return DSI_OK;
}

/* ---- weight bindings ---------------------------------------------------------------- */

static void fill_weight(const dsii_tensor *t, dsib_buffer *buf, dsib_weight *out) {
    out->buf = buf;
    out->offset = 0;
    out->type = t->type;
    out->ne[0] = t->ne[0];
    out->ne[1] = t->ne[1];
    out->ne[2] = t->ne[2];
    out->nb1 = t->row_stride;
    out->nb2 = (uint64_t)t->ne[1] * t->row_stride;
}

/* Frees a model's shared device copies (installed as model->dev_release). The model is
 * freed before its context, so the context's backend instance is still alive. */
static void model_release_device(dsi_model *m) {
    const dsi_context *ctx = m->ctx;
    if (m->dev_weights && ctx && ctx->backend && ctx->backend->backend) {
        const dsib_backend *b = ctx->backend->backend;
        for (uint32_t i = 0; i < m->n_tensors; i++)
            if (m->dev_weights[i]) b->buffer_free(ctx->backend->inst, m->dev_weights[i]);
    }
    dsii_free(ctx, m->dev_weights);
    m->dev_weights = NULL;
}

/* The model-owned device copy of tensor `i`, uploading it on first use. Sessions may be
 * created concurrently on several threads: the lock serialises the first upload. */
static dsi_status model_device_copy(dsii_wset *ws, dsi_model *m, uint32_t i, dsib_buffer **out,
                                    dsib_error *be) {
    const dsii_tensor *t = &m->tensors[i];
    dsi_status st = DSI_OK;
    pthread_mutex_lock(&m->dev_lock);
    if (!m->dev_weights) {
        m->dev_weights = dsii_calloc(m->ctx, m->n_tensors ? m->n_tensors : 1, sizeof(void *));
        if (!m->dev_weights) {
            snprintf(be->msg, sizeof be->msg, "out of host memory");
            pthread_mutex_unlock(&m->dev_lock);
            return DSI_ERR_OUT_OF_HOST_MEMORY;
        }
        m->dev_release = model_release_device;
    }
    dsib_buffer *buf = m->dev_weights[i];
    if (!buf) {
        /* rows never straddle a backend's allocation pieces (tensors above 2 GiB) */
        if (ws->be->struct_size >= DSII_FIELD_END(dsib_backend, buffer_alloc_rows) &&
            ws->be->buffer_alloc_rows)
            st = ws->be->buffer_alloc_rows(ws->inst, t->nbytes, t->row_stride, DSIB_BUFFER_WEIGHTS,
                                           &buf, be);
        else
            st = ws->be->buffer_alloc(ws->inst, t->nbytes, DSIB_BUFFER_WEIGHTS, &buf, be);
        if (st == DSI_OK) {
            st = ws->be->upload(ws->inst, buf, 0, t->data, t->nbytes, be);
            if (st != DSI_OK) {
                ws->be->buffer_free(ws->inst, buf);
                buf = NULL;
            }
        }
        if (st == DSI_OK) m->dev_weights[i] = buf;
    }
    pthread_mutex_unlock(&m->dev_lock);
    *out = buf;
    return st;
}

dsi_status dsii_arch_model_prepare(dsi_model *m, dsii_error *e) {
    const dsi_context *ctx = m->ctx;
    if (!ctx || !ctx->backend || !ctx->backend->backend) return DSI_OK;
    const dsib_backend *b = ctx->backend->backend;
    if (b->buffer_wrap_host) return DSI_OK; /* weights are used in place */
    if (!b->ops || b->ops->struct_size < sizeof(dsib_ops)) return DSI_OK;
    const dsii_arch *a = dsii_arch_for_model(m);
    if (!a) return DSI_OK;
    /* A minimal session state binds exactly the tensors real sessions bind; binding uploads
     * them into the model's shared copies, which outlive this state. */
    dsii_arch_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = 256;
    p.n_batch = 1;
    dsii_arch_state *st = NULL;
    dsi_status rc = a->state_create(m, &p, &st, e);
    if (rc != DSI_OK) return rc;
    a->state_free(st);
    return DSI_OK;
}

dsi_status dsii_wset_bind(dsii_wset *ws, const dsii_tensor *t, dsib_weight *out, dsii_error *e) {
    memset(out, 0, sizeof *out);
    if (!t) return DSI_OK;
    if (!t->data)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "tensor '%s' is not resident (lazy)",
                         t->name ? t->name : "?");
    dsi_model *m = ws->model;
    if (!m || t < m->tensors || t >= m->tensors + m->n_tensors)
        return dsii_fail(e, DSI_ERR_INTERNAL, "tensor '%s' does not belong to the session's model",
                         t->name ? t->name : "?");
    dsib_error be = {{0}};
    dsib_buffer *buf = NULL;
    dsi_status st;
    if (!ws->be->buffer_wrap_host) {
        /* GPU backends: the model's shared device copy (uploaded at load). */
        st = model_device_copy(ws, m, (uint32_t)(t - m->tensors), &buf, &be);
        if (st != DSI_OK)
            return dsii_fail(e, st, "uploading tensor '%s': %s", t->name ? t->name : "?", be.msg);
        fill_weight(t, buf, out);
        return DSI_OK;
    }
    /* CPU backend: wrap the host bytes in place; the wrapper belongs to the session. */
    if (ws->n == ws->cap) {
        uint32_t nc = ws->cap ? ws->cap * 2 : 256;
        dsib_buffer **nb = dsii_realloc(ws->ctx, ws->bufs, sizeof *nb * nc);
        if (!nb) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        ws->bufs = nb;
        ws->cap = nc;
    }
    st = ws->be->buffer_wrap_host(ws->inst, (void *)(uintptr_t)t->data, t->nbytes,
                                  DSIB_BUFFER_WEIGHTS, &buf, &be);
    if (st != DSI_OK)
        return dsii_fail(e, st, "binding tensor '%s': %s", t->name ? t->name : "?", be.msg);
    ws->bufs[ws->n++] = buf;
    fill_weight(t, buf, out);
    return DSI_OK;
}

void dsii_wset_free(dsii_wset *ws) {
    if (!ws) return;
    for (uint32_t i = 0; i < ws->n; i++) ws->be->buffer_free(ws->inst, ws->bufs[i]);
    dsii_free(ws->ctx, ws->bufs);
    ws->bufs = NULL;
    ws->n = ws->cap = 0;
}
