/* Backend glue between contexts and the backend registry. */
#define _GNU_SOURCE
#include "base/base.h"
#include "base/context_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Describes the host CPU as device 0. */
static void describe_cpu(dsi_device_info *d) {
    uint32_t keep = d->struct_size;
    memset(d, 0, sizeof *d);
    d->struct_size = keep;
    d->type = DSI_DEVICE_CPU;
    snprintf(d->backend, sizeof d->backend, "cpu");
    snprintf(d->name, sizeof d->name, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c) {
                    c++;
                    while (*c == ' ') c++;
                    snprintf(d->name, sizeof d->name, "%s", c);
                    size_t n = strlen(d->name);
                    while (n > 0 && (d->name[n - 1] == '\n' || d->name[n - 1] == ' ')) d->name[--n] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) d->memory_total = (uint64_t)pages * (uint64_t)psz;
    if (avail > 0 && psz > 0) d->memory_free = (uint64_t)avail * (uint64_t)psz;
    d->max_buffer_size = UINT64_MAX;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) d->features |= DSI_DEVICE_FEATURE_AVX2;
    if (__builtin_cpu_supports("avx512f")) d->features |= DSI_DEVICE_FEATURE_AVX512;
#endif
    d->index = 0;
}

dsi_status dsii_context_open_backend(dsi_context *ctx, const char *name, int32_t device_index,
                                     dsii_error *err) {
    if (strcmp(name, "cpu") == 0 || strcmp(name, "auto") == 0) {
        if (strcmp(name, "cpu") == 0 && device_index > 0)
            return dsii_fail(err, DSI_ERR_NOT_FOUND, "backend \"cpu\" has one device (index 0); "
                             "device_index %d requested", device_index);
        if (strcmp(name, "auto") == 0)
            dsii_log(ctx, DSI_LOG_INFO, "backend \"auto\": no GPU backend module available, using the CPU");
        snprintf(ctx->backend_name, sizeof ctx->backend_name, "cpu");
        ctx->backend = NULL;
        return DSI_OK;
    }
    return dsii_fail(err, DSI_ERR_UNSUPPORTED,
                     "backend \"%s\" is not available in this build (no %s backend module found)",
                     name, name);
}

void dsii_context_close_backend(dsi_context *ctx) { (void)ctx; }

dsi_status dsii_context_list_devices(dsi_context *ctx, dsi_device_info *out, int32_t cap,
                                     int32_t *count, dsii_error *err) {
    (void)ctx;
    (void)err;
    if (out && cap > 0) describe_cpu(&out[0]);
    *count = 1;
    return DSI_OK;
}
