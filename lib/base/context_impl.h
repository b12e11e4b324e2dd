/* Internal definition of dsi_context, shared by the core modules (never by backends). */
#ifndef DSI_CONTEXT_IMPL_H
#define DSI_CONTEXT_IMPL_H

#include "base/base.h"

#include <pthread.h>
#include <stdatomic.h>

struct dsi_context {
    dsi_context_options opt;    /* effective options (full current layout) */
    char backend_name[16];      /* effective backend */
    int32_t n_threads;          /* effective */
    atomic_int n_models;        /* live models; dsi_context_free refuses while > 0 */
    atomic_int n_samplers;      /* live samplers created with this context; likewise */
    /* Opened backend instances (lib/backend/device.h): dev[0] is always the CPU; the
     * forward pass runs on dev[compute] (the first GPU opened, else the CPU). */
    struct dsii_device *dev[8];
    uint32_t n_dev;
    uint32_t compute;
    char *backend_dir;          /* owned copy of opt.backend_dir */
    char *devices;              /* owned copy of opt.devices */
    pthread_mutex_t error_lock; /* guards last_error: failing [thread-safe] calls write it */
    dsii_error last_error;
};

/* Records `e` as the context's last error (and the thread's). Returns e->status. */
dsi_status dsii_context_fail(dsi_context *ctx, const dsii_error *e);

/* Backend glue (lib/backend/context_backend.c): opens the context's devices — the CPU
 * always, plus the named backend ("cpu", "vulkan", "cuda", "auto") on `device_index`, or,
 * when `devices` is non-NULL, every "backend[:index]" entry of that comma-separated list —
 * closes them, and lists every device the context can see (out may be NULL with cap 0 to
 * count). */
dsi_status dsii_context_open_backend(dsi_context *ctx, const char *name, int32_t device_index,
                                     const char *devices, dsii_error *err);
void dsii_context_close_backend(dsi_context *ctx);
dsi_status dsii_context_list_devices(dsi_context *ctx, dsi_device_info *out, int32_t cap,
                                     int32_t *count, dsii_error *err);

#endif
