/*
 * lib/arch/exec.c — the model's execution side (arch.h): weight table, state pools, lanes
 * and the step driver shared by both forward passes.
 */
#include "arch/arch.h"

#include "backend/device.h"
#include "base/context_impl.h"
#include "model/model.h"
#include "place/place.h"

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

/* ---- weight table ------------------------------------------------------------------------- */

static void fill_weight(const dsii_tensor *t, dsib_buffer *buf, uint32_t id, dsib_weight *out) {
    out->buf = buf;
    out->offset = 0;
    out->type = t->type;
    out->id = id;
    out->ne[0] = t->ne[0];
    out->ne[1] = t->ne[1];
    out->ne[2] = t->ne[2];
    out->nb1 = t->row_stride;
    out->nb2 = (uint64_t)t->ne[1] * t->row_stride;
}

dsi_status dsii_wtable_bind(dsii_wtable *wt, const dsii_tensor *t, dsib_weight *out,
                            dsii_error *e) {
    memset(out, 0, sizeof *out);
    if (!t) return DSI_OK;
    dsi_model *m = wt->model;
    if (!m || t < m->tensors || t >= m->tensors + m->n_tensors)
        return dsii_fail(e, DSI_ERR_INTERNAL, "tensor '%s' does not belong to the model",
                         t->name ? t->name : "?");
    if (!t->data)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "tensor '%s' is not resident (lazy)",
                         t->name ? t->name : "?");
    uint32_t i = (uint32_t)(t - m->tensors);
    if (!wt->bufs) {
        wt->bufs = dsii_calloc(wt->ctx, m->n_tensors ? m->n_tensors : 1, sizeof *wt->bufs);
        if (!wt->bufs) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    if (!wt->bufs[i]) {
        const dsib_backend *be = wt->dev->be;
        dsib_error be_err = {{0}};
        dsib_buffer *buf = NULL;
        dsi_status st;
        if (be->buffer_wrap_host) {
            /* CPU: the mmapped (or library-owned) bytes, used in place */
            st = be->buffer_wrap_host(wt->dev->inst, (void *)(uintptr_t)t->data, t->nbytes,
                                      DSIB_BUFFER_WEIGHTS, &buf, &be_err);
        } else {
            /* GPU: one device copy per model; rows never straddle the backend's allocation
             * pieces (tensors above 2 GiB) */
            if (be->buffer_alloc_rows)
                st = be->buffer_alloc_rows(wt->dev->inst, t->nbytes, t->row_stride,
                                           DSIB_BUFFER_WEIGHTS, &buf, &be_err);
            else
                st = be->buffer_alloc(wt->dev->inst, t->nbytes, DSIB_BUFFER_WEIGHTS, &buf, &be_err);
            if (st == DSI_OK) {
                st = be->upload(wt->dev->inst, buf, 0, t->data, t->nbytes, &be_err);
                if (st != DSI_OK) {
                    be->buffer_free(wt->dev->inst, buf);
                    buf = NULL;
                }
            }
            if (st == DSI_OK) wt->bytes += t->nbytes;
        }
        if (st != DSI_OK)
            return dsii_fail(e, st, "binding tensor '%s' on %s: %s", t->name ? t->name : "?",
                             wt->dev->name, be_err.msg);
        wt->bufs[i] = buf;
    }
    fill_weight(t, wt->bufs[i], i + 1, out);
    return DSI_OK;
}

static void wtable_free(dsii_wtable *wt) {
    if (wt->bufs && wt->model)
        for (uint32_t i = 0; i < wt->model->n_tensors; i++)
            if (wt->bufs[i]) wt->dev->be->buffer_free(wt->dev->inst, wt->bufs[i]);
    dsii_free(wt->ctx, wt->bufs);
    wt->bufs = NULL;
}

/* ---- exec ------------------------------------------------------------------------------------- */

void dsii_sched_free(struct dsii_sched *s); /* lib/sched */

static void exec_free(dsi_model *m) {
    dsii_exec *ex = m->exec;
    if (!ex) return;
    const dsi_context *ctx = ex->ctx;
    if (ex->sched) dsii_sched_free(ex->sched);
    for (uint32_t i = 0; i < ex->n_pools; i++) dsii_kv_pool_free(ex->pools[i]);
    dsii_free(ctx, ex->pools);
    if (ex->am) ex->arch->model_free(m, ex->am);
    dsii_place_exec_fini(m);
    wtable_free(&ex->wt);
    pthread_mutex_destroy(&ex->lock);
    dsii_free(ctx, ex);
    m->exec = NULL;
}

dsi_status dsii_exec_create(dsi_model *m, dsii_error *e) {
    m->exec = NULL;
    const dsii_arch *arch = dsii_arch_for_model(m);
    if (!arch) return DSI_OK;
    dsii_device *dev = dsii_context_compute(m->ctx);
    if (!dev) return dsii_fail(e, DSI_ERR_INTERNAL, "the model's context has no device");
    dsii_exec *ex = dsii_calloc(m->ctx, 1, sizeof *ex);
    if (!ex) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    ex->model = m;
    ex->ctx = m->ctx;
    ex->arch = arch;
    ex->dev = dev;
    ex->n_vocab = (int32_t)m->hp.n_vocab;
    ex->wt.dev = dev;
    ex->wt.ctx = m->ctx;
    ex->wt.model = m;
    pthread_mutex_init(&ex->lock, NULL);
    m->exec = ex;
    m->exec_free = exec_free;
    /* memory tiers: the expert cache on the compute device, before the layers bind to it */
    dsi_status st = dsii_place_exec_init(m, dev, e);
    if (st != DSI_OK) {
        exec_free(m);
        m->exec_free = NULL;
        return st;
    }
    st = arch->model_create(m, &ex->wt, &ex->am, e);
    if (st != DSI_OK) {
        /* a backend that cannot run the model: the model still loads (tokenizer, metadata);
         * sessions report why they cannot be created */
        if (st == DSI_ERR_UNSUPPORTED) {
            dsii_log(m->ctx, DSI_LOG_INFO, "%s", e ? e->msg : "model ops unsupported");
            ex->am = NULL;
            wtable_free(&ex->wt);
            return DSI_OK;
        }
        exec_free(m);
        m->exec_free = NULL;
        return st;
    }
    return DSI_OK;
}

static uint64_t pool_key(const dsii_arch_params *p) {
    uint32_t margin = p->rewind_margin ? p->rewind_margin : DSII_DEFAULT_MARGIN;
    /* key bits 48: NO_FAKE_QUANT, 49: F32_STATE */
    uint64_t flags = ((p->flags & DSI_SESSION_FLAG_NO_FAKE_QUANT) ? 1u : 0u) |
                     ((p->flags & DSII_SESSION_FLAG_F32_STATE) ? 2u : 0u);
    return (uint64_t)p->n_ctx | ((uint64_t)(margin & 0xFFFF) << 32) | (flags << 48);
}

void dsii_exec_pool_params(const dsii_kv_pool *pool, dsii_arch_params *p) {
    uint64_t k = dsii_kv_pool_key(pool);
    memset(p, 0, sizeof *p);
    p->n_ctx = (uint32_t)k;
    p->rewind_margin = (uint32_t)(k >> 32) & 0xFFFF;
    p->flags = (((k >> 48) & 1u) ? DSI_SESSION_FLAG_NO_FAKE_QUANT : 0u) |
               (((k >> 48) & 2u) ? DSII_SESSION_FLAG_F32_STATE : 0u);
}

dsi_status dsii_exec_pool(dsii_exec *ex, const dsii_arch_params *p, dsii_kv_pool **out,
                          dsii_error *e) {
    *out = NULL;
    if (!ex->am) return dsii_fail(e, DSI_ERR_UNSUPPORTED, "no forward pass on this device");
    uint32_t margin = p->rewind_margin ? p->rewind_margin : DSII_DEFAULT_MARGIN;
    if (margin > 0xFFFF) return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT, "rewind margin too large");
    uint64_t key = pool_key(p);
    pthread_mutex_lock(&ex->lock);
    for (uint32_t i = 0; i < ex->n_pools; i++)
        if (dsii_kv_pool_key(ex->pools[i]) == key) {
            *out = ex->pools[i];
            pthread_mutex_unlock(&ex->lock);
            return DSI_OK;
        }
    dsi_status st = DSI_OK;
    if (ex->n_pools == ex->cap_pools) {
        uint32_t nc = ex->cap_pools ? 2 * ex->cap_pools : 4;
        dsii_kv_pool **np = dsii_realloc(ex->ctx, ex->pools, sizeof *np * nc);
        if (!np) st = dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        else {
            ex->pools = np;
            ex->cap_pools = nc;
        }
    }
    dsii_kv_layout l;
    dsii_kv_layout_init(&l, ex->ctx, margin);
    /* Packed state (FP8 / FP4 rows, docs/internals.md "State layout"): only with the
     * rounding on (the stored rows are then on the grids, so packing is exact) and on a
     * device whose ops read packed rows (the CPU and Vulkan backends; CUDA keeps f32 rows). */
    l.packed = !(p->flags & (DSI_SESSION_FLAG_NO_FAKE_QUANT | DSII_SESSION_FLAG_F32_STATE)) &&
               (strcmp(ex->dev->name, "cpu") == 0 || strcmp(ex->dev->name, "vulkan") == 0);
    if (st == DSI_OK) st = ex->arch->state_layout(ex->am, p->n_ctx, &l, e);
    /* Host offload (issue 19): a GPU session whose state at full n_ctx exceeds the device
     * budget keeps its row arrays (compressed KV rows, index keys: what grows with the
     * context) in host RAM the device reads; the sparse attention then reads only the
     * indexer-selected rows from there. The rings stay in device memory. On the CPU both
     * are the same memory: no offload. */
    uint64_t budget = ex->state_budget ? ex->state_budget : ex->dev->desc.memory_total;
    if (st == DSI_OK && budget && l.slot_bytes > budget && strcmp(ex->dev->name, "cpu") != 0)
        l.offload = 1;
    dsii_kv_pool *pool = NULL;
    if (st == DSI_OK) st = dsii_kv_pool_create(ex->dev, &l, key, &pool, e);
    else dsii_kv_layout_free(&l);
    if (st == DSI_OK) ex->pools[ex->n_pools++] = pool;
    pthread_mutex_unlock(&ex->lock);
    *out = pool;
    return st;
}

dsi_status dsii_exec_state_check(const dsii_exec *ex, const dsii_kv_pool *pool, dsii_error *e) {
    const dsii_kv_layout *l = dsii_kv_pool_layout(pool);
    dsii_arch_params pp;
    dsii_exec_pool_params(pool, &pp);
    /* every row array at n_ctx (unless offloaded to host RAM), every ring */
    uint64_t need = dsii_kv_device_slot_bytes(l);
    uint64_t budget = ex->state_budget ? ex->state_budget : ex->dev->desc.memory_total;
    if (budget && need > budget && l->offload)
        return dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                         "session state for n_ctx %u needs %llu bytes of device memory for its "
                         "rings (its compressed rows, %.1f bytes/token, are in host RAM), the "
                         "%s budget is %llu bytes",
                         pp.n_ctx, (unsigned long long)need, dsii_kv_bytes_per_token(l),
                         ex->dev->name, (unsigned long long)budget);
    if (budget && need > budget)
        return dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                         "session state for n_ctx %u needs %llu bytes (%.1f bytes/token of "
                         "compressed rows + %llu bytes of rings), the %s budget is %llu bytes",
                         pp.n_ctx, (unsigned long long)need, dsii_kv_bytes_per_token(l),
                         (unsigned long long)dsii_kv_ring_bytes(l), ex->dev->name,
                         (unsigned long long)budget);
    uint64_t maxb = ex->dev->desc.max_buffer_size;
    for (uint32_t i = 0; maxb && i < l->n; i++) {
        uint64_t b = (uint64_t)l->c[i].rows * l->c[i].row_bytes;
        if (b > maxb)
            return dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY,
                             "session state for n_ctx %u: component %u needs %llu bytes in one "
                             "binding, the %s device allows %llu",
                             pp.n_ctx, i, (unsigned long long)b, ex->dev->name,
                             (unsigned long long)maxb);
    }
    return DSI_OK;
}

/* ---- lanes ------------------------------------------------------------------------------------- */

dsi_status dsii_lane_create(dsii_exec *ex, uint32_t max_rows, uint32_t max_out, uint32_t n_ctx,
                            uint32_t flags, dsii_lane **out, dsii_error *e) {
    *out = NULL;
    if (!ex->am) return dsii_fail(e, DSI_ERR_UNSUPPORTED, "no forward pass on this device");
    if (max_rows == 0 || max_out == 0 || max_out > max_rows)
        return dsii_fail(e, DSI_ERR_INTERNAL, "lane: bad shape (%u rows, %u out)", max_rows, max_out);
    dsii_lane *l = dsii_calloc(ex->ctx, 1, sizeof *l);
    if (!l) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    l->ex = ex;
    l->dev = ex->dev;
    l->max_rows = max_rows;
    l->max_out = max_out;
    l->n_ctx = n_ctx;
    l->flags = flags;
    l->desc.struct_size = sizeof l->desc;
    l->desc.max_rows = max_rows;
    l->desc.max_positions = n_ctx;
    dsi_status st = ex->arch->lane_init(ex->am, l, e);
    if (st != DSI_OK) {
        dsii_free(ex->ctx, l);
        return st;
    }
    /* the expert tier runs moe_experts on its cache: "experts" = cache slots */
    uint32_t slots = dsii_xtier_slots(ex->model);
    if (slots > l->desc.max_experts) l->desc.max_experts = slots;
    const dsib_backend *be = l->dev->be;
    dsib_error be_err = {{0}};
    /* io block: rows, ids, output rows, arch extra, logits (64-byte aligned parts) */
    uint64_t o = 0;
#define IO_TAKE(field, bytes)                                                                \
    do {                                                                                     \
        l->field = o;                                                                        \
        o += ((uint64_t)(bytes) + 63) & ~(uint64_t)63;                                       \
    } while (0)
    IO_TAKE(io_rows, (uint64_t)max_rows * DSIB_ROW_WORDS * 4);
    IO_TAKE(io_ids, (uint64_t)max_rows * 4);
    IO_TAKE(io_out, (uint64_t)max_out * 4);
    IO_TAKE(io_extra, l->io_extra_bytes);
    IO_TAKE(io_spec, l->io_spec_bytes);
    IO_TAKE(io_logits, (uint64_t)max_out * (uint64_t)ex->n_vocab * 4);
#undef IO_TAKE
    l->io_bytes = o;
    st = be->stream_create(l->dev->inst, &l->desc, &l->stream, &be_err);
    if (st == DSI_OK)
        st = be->buffer_alloc(l->dev->inst, l->scratch_bytes ? l->scratch_bytes : 64,
                              DSIB_BUFFER_SCRATCH, &l->scratch, &be_err);
    if (st == DSI_OK)
        st = be->buffer_alloc(l->dev->inst, l->io_bytes, DSIB_BUFFER_HOST_VISIBLE, &l->io, &be_err);
    if (st == DSI_OK) {
        l->io_host = be->buffer_host_ptr(l->dev->inst, l->io);
        if (!l->io_host) {
            st = DSI_ERR_BACKEND;
            snprintf(be_err.msg, sizeof be_err.msg, "host-visible buffer has no host pointer");
        }
    }
    if (st != DSI_OK) {
        dsii_fail(e, st, "%s: step buffers for %u rows (%llu + %llu bytes): %s", l->dev->name,
                  max_rows, (unsigned long long)l->scratch_bytes,
                  (unsigned long long)l->io_bytes, be_err.msg);
        dsii_lane_free(l);
        return st;
    }
    *out = l;
    return DSI_OK;
}

static void drop_graphs(dsii_lane *l) {
    for (int i = 0; i < DSII_LANE_GRAPHS; i++) {
        if (l->graphs[i].g) l->dev->be->graph_destroy(l->dev->inst, l->graphs[i].g);
        memset(&l->graphs[i], 0, sizeof l->graphs[i]);
    }
}

void dsii_lane_free(dsii_lane *l) {
    if (!l) return;
    const dsib_backend *be = l->dev->be;
    if (l->stream) {
        dsib_error e;
        be->sync(l->stream, &e);
    }
    drop_graphs(l);
    if (l->stream) be->stream_destroy(l->stream);
    if (l->scratch) be->buffer_free(l->dev->inst, l->scratch);
    if (l->io) be->buffer_free(l->dev->inst, l->io);
    if (l->ex && l->ex->arch->lane_fini) l->ex->arch->lane_fini(l);
    dsii_free(l->ex->ctx, l);
}

/* ---- the step -------------------------------------------------------------------------------- */

/* Records the step directly, or launches (capturing first when the shape was seen before)
 * a graph on backends that replay. */
static dsi_status run_recorded(dsii_lane *l, dsii_kv_pool *pool, const dsii_step_shape *sh,
                               dsii_error *e) {
    const dsib_backend *be = l->dev->be;
    dsii_exec *ex = l->ex;
    dsib_error be_err = {{0}};
    dsi_status st;
    /* tiered experts (lib/place) read the routing on the host mid-step: no graphs */
    int replay = l->dev->can_capture && !(l->flags & DSII_LANE_NO_CAPTURE) && !dsii_xtier_active(ex->model);
    uint64_t key = (uint64_t)sh->n | ((uint64_t)sh->n_out << 16) |
                   ((uint64_t)dsii_kv_pool_generation(pool) << 32);
    int gi = -1;
    if (replay) {
        for (int i = 0; i < DSII_LANE_GRAPHS; i++)
            if (l->graphs[i].seen && l->graphs[i].key == key) gi = i;
        if (gi < 0) {
            /* first sighting: remember the shape, run it directly */
            int victim = 0;
            for (int i = 1; i < DSII_LANE_GRAPHS; i++)
                if (l->graphs[i].last_use < l->graphs[victim].last_use) victim = i;
            if (l->graphs[victim].g) be->graph_destroy(l->dev->inst, l->graphs[victim].g);
            memset(&l->graphs[victim], 0, sizeof l->graphs[victim]);
            l->graphs[victim].key = key;
            l->graphs[victim].seen = 1;
            l->graphs[victim].last_use = l->steps;
            replay = 0;
        } else {
            l->graphs[gi].last_use = l->steps;
        }
    }
    if (!replay) {
        st = ex->arch->record(ex->am, l, pool, sh, e);
        if (st != DSI_OK) {
            be->sync(l->stream, &be_err); /* drain what was recorded before the failure */
            return st;
        }
    } else {
        if (!l->graphs[gi].g) {
            st = be->capture_begin(l->stream, &be_err);
            if (st != DSI_OK) return dsii_fail(e, st, "%s: capture: %s", l->dev->name, be_err.msg);
            dsi_status rs = ex->arch->record(ex->am, l, pool, sh, e);
            dsib_graph *g = NULL;
            st = be->capture_end(l->stream, &g, &be_err);
            if (rs != DSI_OK) {
                if (g) be->graph_destroy(l->dev->inst, g);
                return rs;
            }
            if (st != DSI_OK) return dsii_fail(e, st, "%s: capture: %s", l->dev->name, be_err.msg);
            l->graphs[gi].g = g;
            l->captures++;
        } else {
            l->replays++;
        }
        st = be->graph_launch(l->stream, l->graphs[gi].g, &be_err);
        if (st != DSI_OK) return dsii_fail(e, st, "%s: graph launch: %s", l->dev->name, be_err.msg);
    }
    /* the step's only host sync: its results are in the io block afterwards */
    st = be->sync(l->stream, &be_err);
    if (st != DSI_OK) return dsii_fail(e, st, "%s: step failed: %s", l->dev->name, be_err.msg);
    return DSI_OK;
}

void dsii_exec_set_profile(dsii_exec *ex, dsii_prof *prof) {
    if (ex) ex->prof = prof;
}

static dsi_status exec_step(dsii_lane *l, dsii_kv_pool *pool, const dsii_seq_step *seqs,
                            uint32_t n_seqs, dsii_error *e);

dsi_status dsii_exec_step(dsii_lane *l, dsii_kv_pool *pool, const dsii_seq_step *seqs,
                          uint32_t n_seqs, dsii_error *e) {
    dsii_prof *prof = l->ex->prof;
    if (!prof) return exec_step(l, pool, seqs, n_seqs, e);
    dsii_prof *saved = dsii_prof_cur;
    dsii_prof_cur = prof;
    uint64_t t0 = dsii_time_ns();
    dsi_status st = exec_step(l, pool, seqs, n_seqs, e);
    prof->step_ns += dsii_time_ns() - t0;
    prof->steps++;
    for (uint32_t i = 0; i < n_seqs; i++) prof->rows += seqs[i].n;
    dsii_prof_cur = saved;
    return st;
}

static dsi_status exec_step(dsii_lane *l, dsii_kv_pool *pool, const dsii_seq_step *seqs,
                            uint32_t n_seqs, dsii_error *e) {
    dsii_exec *ex = l->ex;
    dsii_arch_params pp;
    dsii_exec_pool_params(pool, &pp);
    uint32_t n = 0, n_out = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        const dsii_seq_step *q = &seqs[i];
        if (q->n == 0 || (uint64_t)q->pos + q->n > pp.n_ctx || (uint64_t)q->pos + q->n > l->n_ctx)
            return dsii_fail(e, DSI_ERR_INTERNAL, "step: sequence %u: %u rows at %u (n_ctx %u)", i,
                             q->n, q->pos, pp.n_ctx);
        n += q->n;
        n_out += q->which == DSII_LOGITS_ALL ? q->n : q->which == DSII_LOGITS_LAST ? 1u : 0u;
    }
    if (n == 0 || n > l->max_rows || n_out > l->max_out)
        return dsii_fail(e, DSI_ERR_INTERNAL, "step: %u rows / %u outputs exceed the lane (%u / %u)",
                         n, n_out, l->max_rows, l->max_out);
    /* host inputs: step rows, token ids, output rows (only tokens and positions) */
    int32_t *R = (int32_t *)(void *)(l->io_host + l->io_rows);
    int32_t *ids = (int32_t *)(void *)(l->io_host + l->io_ids);
    int32_t *outi = (int32_t *)(void *)(l->io_host + l->io_out);
    uint32_t t = 0, o = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        const dsii_seq_step *q = &seqs[i];
        uint32_t first = t;
        for (uint32_t j = 0; j < q->n; j++, t++) {
            int32_t *r = R + (size_t)t * DSIB_ROW_WORDS;
            r[DSIB_ROW_POS] = (int32_t)(q->pos + j);
            r[DSIB_ROW_SLOT] = (int32_t)q->slot;
            r[DSIB_ROW_FIRST] = (int32_t)first;
            r[DSIB_ROW_COUNT] = (int32_t)q->n;
            ids[t] = q->tokens[q->pos + j];
            if (q->which == DSII_LOGITS_ALL || (q->which == DSII_LOGITS_LAST && j == q->n - 1))
                outi[o++] = (int32_t)t;
        }
    }
    /* lazy state: the row arrays must hold every position this step touches */
    uint64_t end = 0;
    for (uint32_t i = 0; i < n_seqs; i++)
        if ((uint64_t)seqs[i].pos + seqs[i].n > end) end = (uint64_t)seqs[i].pos + seqs[i].n;
    dsi_status st = dsii_kv_pool_reserve(pool, end, e);
    if (st != DSI_OK) return st;
    if (ex->arch->prepare) {
        DSII_PROF_BEGIN();
        st = ex->arch->prepare(ex->am, l, seqs, n_seqs, n, e);
        DSII_PROF_END("step inputs (host: Engram hashes and rows)");
    }
    if (st != DSI_OK) return st;
    l->cancelled_in_step = 0;
    dsii_step_shape sh = {n, n_out, (pp.flags & DSI_SESSION_FLAG_NO_FAKE_QUANT) ? DSIB_FQ_NO_ROUND : 0u};
    dsii_kv_pool_lock(pool);
    if (dsii_kv_pool_slots(pool) == 0) st = dsii_fail(e, DSI_ERR_INTERNAL, "step: empty pool");
    for (uint32_t i = 0; st == DSI_OK && i < n_seqs; i++)
        if (seqs[i].slot >= dsii_kv_pool_slots(pool))
            st = dsii_fail(e, DSI_ERR_INTERNAL, "step: slot %u out of range", seqs[i].slot);
    if (st == DSI_OK) st = run_recorded(l, pool, &sh, e);
    dsii_kv_pool_unlock(pool);
    l->steps++;
    dsii_place_count_step(ex->model);
    if (st == DSI_ERR_CANCELLED && l->cancel) l->cancelled_in_step = 1;
    if (st != DSI_OK) return st;
    /* logits rows in output order */
    DSII_PROF_BEGIN();
    const float *lg = (const float *)(const void *)(l->io_host + l->io_logits);
    size_t V = (size_t)ex->n_vocab;
    o = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        const dsii_seq_step *q = &seqs[i];
        uint32_t k = q->which == DSII_LOGITS_ALL ? q->n : q->which == DSII_LOGITS_LAST ? 1u : 0u;
        if (k && q->logits) memcpy(q->logits, lg + (size_t)o * V, sizeof(float) * k * V);
        o += k;
    }
    DSII_PROF_END("logits copy-out");
    return DSI_OK;
}
