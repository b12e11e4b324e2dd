/*
 * lib/backend/registry.h — the backend registry: the built-in CPU backend plus backend
 * modules (libdsinfer-<name>.so) loaded at run time with dlopen. Used by the context glue
 * (context_backend.c) to open a context's devices and to enumerate devices for
 * dsi_context_device_count / dsi_context_device_info. Lives in lib/backend so the forward
 * passes (lib/arch) never include lib/api.
 *
 * Module search order (first directory holding libdsinfer-<name>.so wins; docs/backends.md):
 *   1. the context's `backend_dir` option,
 *   2. the DSINFER_BACKEND_DIR environment variable (documented in docs/backends.md),
 *   3. the build tree: DSI_MODULE_BUILD_DIR (compile-time define, <build>/lib/dsinfer, where
 *      CMake puts modules) and <build>/backends/<name>/ (where Meson leaves them) — lets
 *      tests and tools run from the build tree without installing,
 *   4. $libdir/dsinfer: DSI_MODULE_INSTALL_DIR (compile-time define) and, at run time,
 *      "<directory of the object that holds libdsinfer>/dsinfer" (relocatable installs).
 *
 * A module is accepted only if it exports DSIB_ENTRY_SYMBOL, its table's api_version equals
 * DSIB_API_VERSION and its struct_size covers every field of struct dsib_backend this core
 * knows. Anything else is declined with a message naming the file and the mismatch.
 */
#ifndef DSI_BACKEND_REGISTRY_H
#define DSI_BACKEND_REGISTRY_H

#include "backend/device.h"
#include "backends/backend.h"
#include "base/base.h"

/* Opens backend `name` ("cpu", "vulkan", "cuda" or "auto"; NULL = "cpu") on device
 * `device_index` of that backend (-1 = best). "auto" prefers a discrete GPU, then an
 * integrated one, else the CPU; the choice (and the reason for falling back to the CPU) is
 * logged through the context at INFO level. The device's `can_capture` says whether its
 * backend implements capture / replay. Status: INVALID_ARGUMENT (unknown name, bad
 * device index), UNSUPPORTED (module not found, declines, no device), ABI_MISMATCH (module
 * built against another backend.h), BACKEND / OUT_OF_DEVICE_MEMORY / OUT_OF_HOST_MEMORY
 * from instance creation. On failure *out is NULL and `err` says why. */
dsi_status dsii_backend_open(dsi_context *ctx, const char *name, int32_t device_index,
                             dsii_device **out, dsii_error *err);

/* Destroys the instance, unloads the module and frees the slot. NULL accepted. */
void dsii_backend_close(dsi_context *ctx, dsii_device *slot);

/* Enumerates devices across all backends that can be loaded: the CPU is always entry 0,
 * then each module's devices in the order vulkan, cuda. Modules that cannot be loaded or
 * decline are skipped (logged at DEBUG). Writes at most `cap` entries (full current
 * dsi_device_info layout, struct_size set) to `out` (may be NULL when cap is 0) and sets
 * *count to the total number of devices. */
dsi_status dsii_backend_list_devices(dsi_context *ctx, dsi_device_info *out, int32_t cap,
                                     int32_t *count, dsii_error *err);

/* Loads module `name` (not "cpu") from the search path without creating an instance; used
 * by dsii_backend_open / list_devices and by tests. On success *table and *dl_handle are
 * set (close the handle with dsii_backend_module_unload) and, if `path` is non-NULL, the
 * file name is copied there (cap `path_cap`). */
dsi_status dsii_backend_module_load(dsi_context *ctx, const char *name,
                                    const dsib_backend **table, void **dl_handle,
                                    char *path, size_t path_cap, dsii_error *err);
void dsii_backend_module_unload(void *dl_handle);

/* Loads one module file and checks it as the search does (tests): DSI_OK, NOT_FOUND (no such
 * file), UNSUPPORTED (not loadable, no entry symbol, incomplete or misnamed table) or
 * ABI_MISMATCH (api_version / struct_size), with the reason in `err`. */
dsi_status dsii_backend_module_load_file(const char *path, const char *name,
                                         const dsib_backend **table, void **dl_handle,
                                         dsii_error *err);

/* Fills `host` for a backend created from `ctx` (allocator + log routed to the context). */
void dsii_backend_host_init(dsi_context *ctx, dsib_host *host, int32_t device_index);

#endif /* DSI_BACKEND_REGISTRY_H */
