/*
 * lib/backend/context_backend.c — a context's devices (the CPU always, plus the GPU
 * instance(s) its options name), and the device helpers of device.h: op checks,
 * compositions of ops a backend leaves out, waits across instances.
 */
#include "backend/device.h"
#include "backend/registry.h"
#include "base/base.h"
#include "base/context_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- devices of a context --------------------------------------------------------------- */

static dsi_status add_device(dsi_context *ctx, dsii_device *d, dsii_error *err) {
    for (uint32_t i = 0; i < ctx->n_dev; i++)
        if (ctx->dev[i]->be == d->be && ctx->dev[i]->device_index == d->device_index) {
            dsii_backend_close(ctx, d); /* listed twice: keep the first */
            return DSI_OK;
        }
    if (ctx->n_dev >= DSII_MAX_DEVICES) {
        dsii_backend_close(ctx, d);
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "too many devices (at most %d)",
                         DSII_MAX_DEVICES);
    }
    ctx->dev[ctx->n_dev++] = d;
    return DSI_OK;
}

/* Parses "name" or "name:index" (one entry of the devices list). */
static dsi_status parse_entry(const char *p, size_t len, char *name, size_t cap, int32_t *index,
                              dsii_error *err) {
    *index = -1;
    const char *colon = memchr(p, ':', len);
    size_t nl = colon ? (size_t)(colon - p) : len;
    if (nl == 0 || nl >= cap)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_context_options.devices: bad entry '%.*s'", (int)len, p);
    memcpy(name, p, nl);
    name[nl] = 0;
    if (colon) {
        const char *d = colon + 1;
        size_t dl = len - nl - 1;
        long v = 0;
        if (dl == 0 || dl > 4) goto bad;
        for (size_t i = 0; i < dl; i++) {
            if (d[i] < '0' || d[i] > '9') goto bad;
            v = v * 10 + (d[i] - '0');
        }
        *index = (int32_t)v;
    }
    return DSI_OK;
bad:
    return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                     "dsi_context_options.devices: bad device index in '%.*s'", (int)len, p);
}

dsi_status dsii_context_open_backend(dsi_context *ctx, const char *name, int32_t device_index,
                                     const char *devices, dsii_error *err) {
    ctx->n_dev = 0;
    ctx->compute = 0;
    dsii_device *cpu = NULL;
    dsi_status st = dsii_backend_open(ctx, "cpu", -1, &cpu, err);
    if (st != DSI_OK) return st;
    ctx->dev[ctx->n_dev++] = cpu;
    if (devices) {
        const char *p = devices;
        while (st == DSI_OK && *p) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            char nm[16];
            int32_t idx;
            st = parse_entry(p, len, nm, sizeof nm, &idx, err);
            if (st == DSI_OK && strcmp(nm, "cpu") != 0) {
                dsii_device *d = NULL;
                st = dsii_backend_open(ctx, nm, idx, &d, err);
                if (st == DSI_OK && d->be == cpu->be) dsii_backend_close(ctx, d); /* auto → cpu */
                else if (st == DSI_OK) st = add_device(ctx, d, err);
            }
            p += len;
            if (*p == ',') p++;
        }
    } else if (name && strcmp(name, "cpu") != 0) {
        dsii_device *d = NULL;
        st = dsii_backend_open(ctx, name, device_index, &d, err);
        if (st == DSI_OK && d->be == cpu->be) dsii_backend_close(ctx, d); /* auto fell back */
        else if (st == DSI_OK) st = add_device(ctx, d, err);
    } else if (name && device_index > 0) {
        st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                       "backend 'cpu' has one device; device_index %d is out of range",
                       (int)device_index);
    }
    if (st != DSI_OK) {
        dsii_context_close_backend(ctx);
        return st;
    }
    ctx->compute = ctx->n_dev > 1 ? 1 : 0;
    snprintf(ctx->backend_name, sizeof ctx->backend_name, "%s", ctx->dev[ctx->compute]->name);
    return DSI_OK;
}

void dsii_context_close_backend(dsi_context *ctx) {
    if (!ctx) return;
    /* GPU instances first, the CPU last */
    while (ctx->n_dev > 0) {
        dsii_device *d = ctx->dev[--ctx->n_dev];
        ctx->dev[ctx->n_dev] = NULL;
        dsii_backend_close(ctx, d);
    }
}

dsi_status dsii_context_list_devices(dsi_context *ctx, dsi_device_info *out, int32_t cap,
                                     int32_t *count, dsii_error *err) {
    return dsii_backend_list_devices(ctx, out, cap, count, err);
}

dsii_device *dsii_context_compute(const dsi_context *ctx) {
    return ctx && ctx->n_dev ? ctx->dev[ctx->compute] : NULL;
}
dsii_device *dsii_context_cpu(const dsi_context *ctx) {
    return ctx && ctx->n_dev ? ctx->dev[0] : NULL;
}
uint32_t dsii_context_n_devices(const dsi_context *ctx) { return ctx ? ctx->n_dev : 0; }
dsii_device *dsii_context_device(const dsi_context *ctx, uint32_t i) {
    return ctx && i < ctx->n_dev ? ctx->dev[i] : NULL;
}

/* ---- op checks and compositions -------------------------------------------------------- */

static const char *const k_op_names[DSIB_OP_COUNT] = {
    "matmul", "matmul_grouped", "get_rows", "rms_norm", "add", "scale", "copy", "copy_rows",
    "gather_rows", "rope_tail", "store_rows", "fake_quant", "hadamard", "hc_expand", "hc_mix",
    "hc_collapse", "hc_post", "compress_pool", "indexer_topk", "attn_sink", "add_rows_periodic",
    "moe_route", "moe_experts", "swiglu", "indexer_topk_v41", "engram_gate", "matmul_multi"};

/* Ops the core can compose from others (op → the ops the composition needs). */
static int composable(const dsib_ops *o, uint32_t op) {
    switch (op) {
    case DSIB_OP_MATMUL_GROUPED: return dsib_ops_has(o, DSIB_OP_MATMUL);
    case DSIB_OP_COPY_ROWS: return dsib_ops_has(o, DSIB_OP_COPY);
    case DSIB_OP_MATMUL_MULTI: return dsib_ops_has(o, DSIB_OP_MATMUL);
    default: return 0;
    }
}

dsi_status dsii_device_check_ops(const dsii_device *d, const uint32_t *needed, uint32_t n,
                                 dsii_error *e) {
    const dsib_ops *o = d->be->ops;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t op = needed[i];
        if (op < DSIB_OP_COUNT && (dsib_ops_has(o, op) || composable(o, op))) continue;
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "backend '%s' does not implement the op %s",
                         d->name, op < DSIB_OP_COUNT ? k_op_names[op] : "?");
    }
    return DSI_OK;
}

dsi_status dsii_device_check_type(const dsii_device *d, uint32_t op, int32_t type,
                                  const char *what, dsii_error *e) {
    if (!d->be->supports_op || d->be->supports_op(d->inst, op, type)) return DSI_OK;
    return dsii_fail(e, DSI_ERR_UNSUPPORTED, "backend '%s': %s of type %d is not supported by %s",
                     d->name, what ? what : "tensor", (int)type,
                     op < DSIB_OP_COUNT ? k_op_names[op] : "?");
}

dsi_status dsii_op_matmul_grouped(const dsii_device *d, dsib_stream *s, const dsib_weight *w,
                                  uint32_t groups, dsib_view x, uint32_t ldx, dsib_view y,
                                  uint32_t ldy, uint32_t n) {
    const dsib_ops *o = d->be->ops;
    if (dsib_ops_has(o, DSIB_OP_MATMUL_GROUPED))
        return o->matmul_grouped(s, w, groups, x, ldx, y, ldy, n);
    /* group g: rows [g·R, (g+1)·R) of W applied to columns [g·K, (g+1)·K) of x */
    if (groups == 0 || w->ne[1] % groups) return DSI_ERR_INVALID_ARGUMENT;
    int64_t R = w->ne[1] / groups, K = w->ne[0];
    for (uint32_t g = 0; g < groups; g++) {
        dsib_weight wg = *w;
        wg.offset += (uint64_t)g * (uint64_t)R * w->nb1;
        wg.ne[1] = R;
        wg.ne[2] = 1;
        dsib_view xg = {x.buf, x.offset + (uint64_t)g * (uint64_t)K * sizeof(float)};
        dsib_view yg = {y.buf, y.offset + (uint64_t)g * (uint64_t)R * sizeof(float)};
        dsi_status st = o->matmul(s, &wg, 0, xg, ldx, yg, ldy, n);
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

int dsii_op_multi_off; /* dsinfer-bench --no-fuse (A/B): always one matmul per entry */

dsi_status dsii_op_matmul_multi(const dsii_device *d, dsib_stream *s, const dsib_mm *mm,
                                uint32_t count) {
    const dsib_ops *o = d->be->ops;
    if (!dsii_op_multi_off && dsib_ops_has(o, DSIB_OP_MATMUL_MULTI))
        return o->matmul_multi(s, mm, count);
    for (uint32_t i = 0; i < count; i++) {
        dsi_status st = o->matmul(s, mm[i].w, mm[i].expert, mm[i].x, mm[i].ldx, mm[i].y,
                                  mm[i].ldy, mm[i].n);
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

dsi_status dsii_op_copy_rows(const dsii_device *d, dsib_stream *s, dsib_view src, uint32_t lds,
                             dsib_view dst, uint32_t ldd, uint32_t rows, uint32_t width) {
    const dsib_ops *o = d->be->ops;
    if (dsib_ops_has(o, DSIB_OP_COPY_ROWS)) return o->copy_rows(s, src, lds, dst, ldd, rows, width);
    if (lds == width && ldd == width)
        return o->copy(s, src, dst, (uint64_t)rows * width * sizeof(float));
    for (uint32_t t = 0; t < rows; t++) {
        dsib_view a = {src.buf, src.offset + (uint64_t)t * lds * sizeof(float)};
        dsib_view b = {dst.buf, dst.offset + (uint64_t)t * ldd * sizeof(float)};
        dsi_status st = o->copy(s, a, b, (uint64_t)width * sizeof(float));
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

dsi_status dsii_stream_wait(const dsii_device *d, dsib_stream *s, const dsii_device *ev_dev,
                            dsib_event *ev, dsii_error *e) {
    dsib_error be = {{0}};
    dsi_status st;
    if (ev_dev->inst == d->inst) {
        st = d->be->stream_wait(s, ev, &be);
    } else {
        /* different instances share no device-side primitive: the host waits for the
         * producer; the consumer's later work is recorded after that */
        st = ev_dev->be->event_sync(ev_dev->inst, ev, &be);
    }
    if (st != DSI_OK) return dsii_fail(e, st, "waiting for an event: %s", be.msg);
    return DSI_OK;
}
