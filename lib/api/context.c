/* Public API: versions, status strings, contexts and device listing. */
#define _GNU_SOURCE
#include "base/base.h"
#include "base/context_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

DSI_API const char *dsi_version_string(void) { return DSI_VERSION_STRING; }

DSI_API void dsi_version(uint32_t *major, uint32_t *minor, uint32_t *patch) {
    if (major) *major = DSI_VERSION_MAJOR;
    if (minor) *minor = DSI_VERSION_MINOR;
    if (patch) *patch = DSI_VERSION_PATCH;
}

DSI_API uint32_t dsi_abi_version(void) { return DSI_ABI_VERSION; }

DSI_API void dsi_context_options_init(dsi_context_options *opt, uint32_t abi_version) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = (uint32_t)sizeof *opt;
    opt->abi_version = abi_version;
    opt->log_level = DSI_LOG_INFO;
    opt->n_threads = 0;
    opt->backend = NULL;
    opt->device_index = -1;
}

static const char *const k_backends[] = {"cpu", "vulkan", "cuda", "auto"};

dsi_status dsii_context_fail(dsi_context *ctx, const dsii_error *e) {
    if (ctx) {
        pthread_mutex_lock(&ctx->error_lock);
        ctx->last_error = *e;
        pthread_mutex_unlock(&ctx->error_lock);
    }
    dsii_set_thread_error(e->msg);
    return e->status;
}

DSI_API dsi_status dsi_context_create(const dsi_context_options *user_opt, dsi_context **out) {
    dsii_error err;
    dsii_error_clear(&err);
    if (!out) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_context_create: out is NULL");
    *out = NULL;

    dsi_context_options opt;
    dsi_context_options_init(&opt, DSI_ABI_VERSION);
    if (dsii_read_options(&opt, sizeof opt, user_opt, "dsi_context_options", &err) != DSI_OK) {
        dsii_set_thread_error(err.msg);
        return err.status;
    }
    /* An application built against an older header that did not know abi_version would
     * have a struct_size not covering it: then it is by definition older than us. */
    if (user_opt && user_opt->struct_size >= DSII_FIELD_END(dsi_context_options, abi_version)) {
        if (opt.abi_version == 0) {
            return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                    "dsi_context_options.abi_version is 0; pass DSI_ABI_VERSION "
                                    "to dsi_context_options_init");
        }
        if (opt.abi_version > DSI_ABI_VERSION) {
            return dsii_thread_fail(DSI_ERR_ABI_MISMATCH,
                                    "the application was built against ABI %u but this "
                                    "libdsinfer (%s) implements ABI %u",
                                    opt.abi_version, DSI_VERSION_STRING, DSI_ABI_VERSION);
        }
    }
    if (opt.log_level < DSI_LOG_DEBUG || opt.log_level > DSI_LOG_NONE) {
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_context_options.log_level is %d; expected %d..%d",
                                opt.log_level, DSI_LOG_DEBUG, DSI_LOG_NONE);
    }
    if (opt.n_threads < 0 || opt.n_threads > 1024) {
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_context_options.n_threads is %d; expected 0..1024",
                                opt.n_threads);
    }
    int hooks = (opt.malloc_fn != NULL) + (opt.realloc_fn != NULL) + (opt.free_fn != NULL);
    if (hooks != 0 && hooks != 3) {
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_context_options: allocator hooks malloc_fn, realloc_fn and "
                                "free_fn must be set together (%d of 3 set)", hooks);
    }
    if (opt.device_index < -1) {
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_context_options.device_index is %d; expected -1 or >= 0",
                                opt.device_index);
    }
    if (opt.flags != 0) {
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_context_options.flags is 0x%x; no flags are defined",
                                opt.flags);
    }
    const char *backend = opt.backend ? opt.backend : "cpu";
    int known = 0;
    for (size_t i = 0; i < sizeof k_backends / sizeof k_backends[0]; i++)
        if (strcmp(backend, k_backends[i]) == 0) known = 1;
    if (!known) {
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_context_options.backend is \"%.64s\"; expected \"cpu\", "
                                "\"vulkan\", \"cuda\" or \"auto\"", backend);
    }

    /* Allocate the context itself through the caller's hooks. */
    dsi_context tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.opt = opt;
    dsi_context *ctx = dsii_calloc(&tmp, 1, sizeof *ctx);
    if (!ctx) return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_context_create: out of memory");
    ctx->opt = opt;
    pthread_mutex_init(&ctx->error_lock, NULL);
    ctx->opt.backend = NULL;
    ctx->opt.backend_dir = NULL;
    ctx->opt.devices = NULL;
    atomic_init(&ctx->n_models, 0);
    atomic_init(&ctx->n_samplers, 0);
    ctx->n_threads = opt.n_threads > 0 ? opt.n_threads : dsii_cpu_count();
    if (opt.backend_dir) {
        ctx->backend_dir = dsii_strdup(ctx, opt.backend_dir);
        if (!ctx->backend_dir) {
            pthread_mutex_destroy(&ctx->error_lock);
            dsii_free(ctx, ctx);
            return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_context_create: out of memory");
        }
        ctx->opt.backend_dir = ctx->backend_dir;
    }

    if (opt.devices) {
        ctx->devices = dsii_strdup(ctx, opt.devices);
        if (!ctx->devices) {
            dsii_free(ctx, ctx->backend_dir);
            pthread_mutex_destroy(&ctx->error_lock);
            dsii_free(ctx, ctx);
            return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_context_create: out of memory");
        }
        ctx->opt.devices = ctx->devices;
    }
    dsi_status st = dsii_context_open_backend(ctx, backend, opt.device_index, ctx->devices, &err);
    if (st != DSI_OK) {
        dsii_free(ctx, ctx->devices);
        dsii_free(ctx, ctx->backend_dir);
        pthread_mutex_destroy(&ctx->error_lock);
        dsii_free(ctx, ctx);
        dsii_set_thread_error(err.msg);
        return st;
    }
    dsii_log(ctx, DSI_LOG_INFO, "libdsinfer %s: context on backend %s, %d CPU threads",
             DSI_VERSION_STRING, ctx->backend_name, ctx->n_threads);
    *out = ctx;
    return DSI_OK;
}

DSI_API dsi_status dsi_context_free(dsi_context *ctx) {
    if (!ctx) return DSI_OK;
    int n = atomic_load(&ctx->n_models), n_smp = atomic_load(&ctx->n_samplers);
    if (n > 0 || n_smp > 0) {
        dsii_error e;
        dsii_fail(&e, DSI_ERR_BUSY, "dsi_context_free: %d model(s) and %d sampler(s) created "
                  "from this context are still alive; free them first", n, n_smp);
        return dsii_context_fail(ctx, &e);
    }
    dsii_context_close_backend(ctx);
    dsii_free(ctx, ctx->devices);
    dsii_free(ctx, ctx->backend_dir);
    pthread_mutex_destroy(&ctx->error_lock);
    dsii_free(ctx, ctx);
    return DSI_OK;
}

DSI_API const char *dsi_context_last_error(const dsi_context *ctx) {
    /* Another thread may be recording a failure on this context right now: copy the message
     * under the lock into storage this thread owns (valid until its next call here). */
    static _Thread_local char copy[DSII_ERROR_MSG_MAX];
    if (!ctx) return "";
    dsi_context *c = (dsi_context *)(uintptr_t)ctx;
    pthread_mutex_lock(&c->error_lock);
    memcpy(copy, c->last_error.msg, sizeof copy);
    pthread_mutex_unlock(&c->error_lock);
    copy[sizeof copy - 1] = '\0';
    return copy;
}

DSI_API const char *dsi_context_backend(const dsi_context *ctx) {
    return ctx ? ctx->backend_name : "";
}

DSI_API int32_t dsi_context_n_threads(const dsi_context *ctx) { return ctx ? ctx->n_threads : 0; }

DSI_API void dsi_device_info_init(dsi_device_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = (uint32_t)sizeof *info;
}

DSI_API dsi_status dsi_context_device_count(dsi_context *ctx, int32_t *count) {
    dsii_error e;
    if (!ctx || !count) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_context_device_count: NULL argument");
        return ctx ? dsii_context_fail(ctx, &e) : dsii_thread_fail(e.status, "%s", e.msg);
    }
    dsi_status st = dsii_context_list_devices(ctx, NULL, 0, count, &e);
    return st == DSI_OK ? st : dsii_context_fail(ctx, &e);
}

DSI_API dsi_status dsi_context_device_info(dsi_context *ctx, int32_t i, dsi_device_info *info) {
    dsii_error e;
    if (!ctx || !info) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_context_device_info: NULL argument");
        return ctx ? dsii_context_fail(ctx, &e) : dsii_thread_fail(e.status, "%s", e.msg);
    }
    if (info->struct_size < DSII_FIELD_END(dsi_device_info, type) ||
        info->struct_size > sizeof(dsi_device_info)) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT,
                  "dsi_device_info.struct_size is %u; use dsi_device_info_init", info->struct_size);
        return dsii_context_fail(ctx, &e);
    }
    int32_t n = 0;
    dsi_status st = dsii_context_list_devices(ctx, NULL, 0, &n, &e);
    if (st != DSI_OK) return dsii_context_fail(ctx, &e);
    if (i < 0 || i >= n) {
        dsii_fail(&e, DSI_ERR_NOT_FOUND, "dsi_context_device_info: index %d out of range (%d devices)", i, n);
        return dsii_context_fail(ctx, &e);
    }
    dsi_device_info all[64];
    for (int k = 0; k < 64; k++) dsi_device_info_init(&all[k]);
    st = dsii_context_list_devices(ctx, all, 64, &n, &e);
    if (st != DSI_OK) return dsii_context_fail(ctx, &e);
    uint32_t keep = info->struct_size;
    memcpy(info, &all[i], keep);
    info->struct_size = keep;
    return DSI_OK;
}
