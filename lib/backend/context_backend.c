/* Backend glue between contexts and the backend registry (lib/api/backend_loader.c). */
#include "backend/registry.h"
#include "base/base.h"
#include "base/context_impl.h"

#include <stdio.h>
#include <string.h>

dsi_status dsii_context_open_backend(dsi_context *ctx, const char *name, int32_t device_index,
                                     dsii_error *err) {
    dsii_backend_slot *slot = NULL;
    dsi_status st = dsii_backend_open(ctx, name, device_index, &slot, err);
    if (st != DSI_OK) return st;
    ctx->backend = slot;
    snprintf(ctx->backend_name, sizeof ctx->backend_name, "%s", slot->name);
    return DSI_OK;
}

void dsii_context_close_backend(dsi_context *ctx) {
    if (!ctx || !ctx->backend) return;
    dsii_backend_close(ctx, ctx->backend);
    ctx->backend = NULL;
}

dsi_status dsii_context_list_devices(dsi_context *ctx, dsi_device_info *out, int32_t cap,
                                     int32_t *count, dsii_error *err) {
    return dsii_backend_list_devices(ctx, out, cap, count, err);
}
