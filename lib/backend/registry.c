/*
 * Backend registry (see registry.h): the built-in CPU backend and run-time loaded
 * modules. The only environment variable read here is DSINFER_BACKEND_DIR (documented in
 * docs/backends.md).
 */
#define _GNU_SOURCE /* dladdr, RTLD_NODELETE */

#include "backend/registry.h"
#include "base/context_impl.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

/* Modules known to the core, in enumeration order. */
static const char *const k_modules[] = {"vulkan", "cuda"};
#define N_MODULES (sizeof k_modules / sizeof k_modules[0])

/* ---- host services handed to backends --------------------------------------------------- */

static void *host_malloc(void *alloc_ctx, size_t size) {
    return dsii_malloc((const dsi_context *)alloc_ctx, size);
}
static void host_free(void *alloc_ctx, void *ptr) {
    dsii_free((const dsi_context *)alloc_ctx, ptr);
}
static void host_log(void *log_ctx, int32_t level, const char *message) {
    dsii_log((const dsi_context *)log_ctx, level, "%s", message ? message : "");
}

void dsii_backend_host_init(dsi_context *ctx, dsib_host *host, int32_t device_index) {
    memset(host, 0, sizeof *host);
    host->struct_size = (uint32_t)sizeof *host;
    host->malloc_fn = host_malloc;
    host->free_fn = host_free;
    host->alloc_ctx = ctx;
    host->log_fn = host_log;
    host->log_ctx = ctx;
    host->n_threads = ctx ? ctx->n_threads : 1;
    if (host->n_threads < 1) host->n_threads = dsii_cpu_count();
    host->device_index = device_index;
}

/* ---- module search path ---------------------------------------------------------------- */

/* Run-time "<dir of the object holding this code>/dsinfer": $libdir/dsinfer for an
 * installed libdsinfer.so, wherever it was installed. When the static library is linked
 * into an executable (dsinfer-bench, dsinfer-mkmodel, applications), the object is the
 * program: its directory comes from /proc/self/exe (dladdr would give argv[0], which has no
 * directory when the program was found through PATH), and `exe_modules` also receives
 * "<bindir>/DSI_MODULE_FROM_BINDIR" ($prefix/bin/../lib/dsinfer: the modules of the tree the
 * program was installed in, wherever it landed); otherwise exe_modules is "". */
static int self_module_dir(char *buf, size_t cap, char *exe_modules, size_t exe_cap) {
    exe_modules[0] = 0;
    Dl_info info;
    if (!dladdr((void *)&self_module_dir, &info) || !info.dli_fname) return 0;
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)info.dli_fbase;
    uintptr_t phdr = (uintptr_t)getauxval(AT_PHDR);
    int in_program = eh && phdr && phdr == (uintptr_t)eh + (uintptr_t)eh->e_phoff;
    char exe[1024];
    const char *name = info.dli_fname;
    if (in_program) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return 0;
        exe[n] = 0;
        name = exe;
    }
    const char *slash = strrchr(name, '/');
    if (!slash) return 0;
    size_t n = (size_t)(slash - name);
    if (n + sizeof "/dsinfer" > cap) return 0;
    memcpy(buf, name, n);
    memcpy(buf + n, "/dsinfer", sizeof "/dsinfer");
#ifdef DSI_MODULE_FROM_BINDIR
    if (in_program &&
        snprintf(exe_modules, exe_cap, "%.*s/%s", (int)n, name, DSI_MODULE_FROM_BINDIR) >= (int)exe_cap)
        exe_modules[0] = 0;
#else
    (void)exe_cap;
#endif
    return 1;
}

/* Tries one candidate file. Returns DSI_OK with the table loaded, NOT_FOUND if the file does
 * not exist / cannot be opened, or a hard error (bad module) recorded in err. */
static dsi_status try_module_file(const char *file, const char *name, const dsib_backend **table,
                                  void **handle, dsii_error *err) {
    /* stat, not a probing open: a FIFO under the module's name must not block (and fopen
     * would allocate outside the context's hooks) */
    struct stat st;
    if (stat(file, &st) != 0) return DSI_ERR_NOT_FOUND;
    if (!S_ISREG(st.st_mode))
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "backend module %s is not a regular file", file);
    /* RTLD_NODELETE: GPU driver stacks (libvulkan + ICDs, libcuda) do not all survive being
     * unmapped and reloaded; keeping the code mapped after dlclose is the safe choice. */
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *why = dlerror();
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "backend module %s cannot be loaded: %s", file,
                         why ? why : "unknown dlopen error");
    }
    dsib_entry_fn entry;
    void *sym = dlsym(h, DSIB_ENTRY_SYMBOL);
    if (!sym) {
        dlclose(h);
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "backend module %s does not export %s", file,
                         DSIB_ENTRY_SYMBOL);
    }
    memcpy(&entry, &sym, sizeof entry); /* object → function pointer without a cast warning */
    const dsib_backend *t = entry();
    if (!t) {
        dlclose(h);
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "backend module %s returned no table", file);
    }
    if (t->api_version != DSIB_API_VERSION) {
        uint32_t v = t->api_version;
        dlclose(h);
        return dsii_fail(err, DSI_ERR_ABI_MISMATCH,
                         "backend module %s implements backend API %u, this library needs %u",
                         file, (unsigned)v, (unsigned)DSIB_API_VERSION);
    }
    if (t->struct_size < DSII_FIELD_END(dsib_backend, ops)) {
        uint32_t s = t->struct_size;
        dlclose(h);
        return dsii_fail(err, DSI_ERR_ABI_MISMATCH,
                         "backend module %s: table struct_size %u < %u required", file,
                         (unsigned)s, (unsigned)DSII_FIELD_END(dsib_backend, ops));
    }
    if (!t->name || strcmp(t->name, name) != 0 || !t->enumerate || !t->create || !t->destroy ||
        !t->device || !t->buffer_alloc || !t->buffer_free || !t->buffer_host_ptr ||
        !t->upload || !t->download || !t->stream_create || !t->stream_destroy || !t->submit ||
        !t->sync || !t->event_create || !t->event_destroy || !t->event_record ||
        !t->stream_wait || !t->event_query || !t->event_sync) {
        dlclose(h);
        return dsii_fail(err, DSI_ERR_UNSUPPORTED,
                         "backend module %s is not a complete '%s' backend", file, name);
    }
    *table = t;
    *handle = h;
    return DSI_OK;
}

dsi_status dsii_backend_module_load(dsi_context *ctx, const char *name,
                                    const dsib_backend **table, void **dl_handle, char *path,
                                    size_t path_cap, dsii_error *err) {
    *table = NULL;
    *dl_handle = NULL;
    if (!name || !*name || strlen(name) > 15 || strchr(name, '/'))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "bad backend module name");

    enum { N_DIRS = 8 };
    const char *dirs[N_DIRS];
    int nd = 0;
    char build_dir[512], self_dir[512], exe_dir[1024];
    if (ctx && ctx->backend_dir && *ctx->backend_dir) dirs[nd++] = ctx->backend_dir;
    const char *env = getenv("DSINFER_BACKEND_DIR");
    if (env && *env) dirs[nd++] = env;
#ifdef DSI_MODULE_BUILD_DIR
    /* The build tree: CMake puts modules in DSI_MODULE_BUILD_DIR (<build>/lib/dsinfer);
     * Meson cannot, its modules stay in <build>/backends/<name>/. */
    dirs[nd++] = DSI_MODULE_BUILD_DIR;
    {
        const char *bd = DSI_MODULE_BUILD_DIR;
        size_t bl = strlen(bd), sl = strlen("/lib/dsinfer");
        if (bl > sl && strcmp(bd + bl - sl, "/lib/dsinfer") == 0 &&
            snprintf(build_dir, sizeof build_dir, "%.*s/backends/%s", (int)(bl - sl), bd,
                     name) < (int)sizeof build_dir)
            dirs[nd++] = build_dir;
    }
#else
    build_dir[0] = 0;
    (void)build_dir;
#endif
#ifdef DSI_MODULE_INSTALL_DIR
    dirs[nd++] = DSI_MODULE_INSTALL_DIR;
#endif
    if (self_module_dir(self_dir, sizeof self_dir, exe_dir, sizeof exe_dir)) {
        dirs[nd++] = self_dir;
        if (exe_dir[0]) dirs[nd++] = exe_dir;
    }

    dsii_error first_bad;
    dsii_error_clear(&first_bad);
    char tried[384];
    size_t tl = 0;
    tried[0] = 0;
    for (int i = 0; i < nd; i++) {
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) dup = strcmp(dirs[i], dirs[j]) == 0;
        if (dup) continue;
        char file[1024];
        int n = snprintf(file, sizeof file, "%s/libdsinfer-%s.so", dirs[i], name);
        if (n < 0 || (size_t)n >= sizeof file) continue;
        dsii_error e;
        dsii_error_clear(&e);
        dsi_status st = try_module_file(file, name, table, dl_handle, &e);
        if (st == DSI_OK) {
            if (path && path_cap) snprintf(path, path_cap, "%s", file);
            dsii_log(ctx, DSI_LOG_DEBUG, "backend '%s': loaded %s", name, file);
            return DSI_OK;
        }
        if (st != DSI_ERR_NOT_FOUND) {
            /* A broken or mismatched module: remember the first such reason, keep looking
             * (a later directory may hold a good build). */
            dsii_log(ctx, DSI_LOG_DEBUG, "%s", e.msg);
            if (first_bad.status == DSI_OK) first_bad = e;
        }
        if (tl < sizeof tried - 1) {
            int w = snprintf(tried + tl, sizeof tried - tl, "%s%s", tl ? ", " : "", dirs[i]);
            if (w > 0) tl += (size_t)w;
            if (tl >= sizeof tried) tl = sizeof tried - 1;
        }
    }
    if (first_bad.status != DSI_OK) {
        if (err) *err = first_bad;
        return first_bad.status;
    }
    return dsii_fail(err, DSI_ERR_UNSUPPORTED,
                     "backend '%s' is not available: libdsinfer-%s.so not found (searched: %s; "
                     "set backend_dir or DSINFER_BACKEND_DIR)",
                     name, name, tl ? tried : "no directories");
}

dsi_status dsii_backend_module_load_file(const char *path, const char *name,
                                         const dsib_backend **table, void **dl_handle,
                                         dsii_error *err) {
    *table = NULL;
    *dl_handle = NULL;
    if (!path || !name) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "bad arguments");
    dsi_status st = try_module_file(path, name, table, dl_handle, err);
    if (st == DSI_ERR_NOT_FOUND) dsii_fail(err, st, "%s does not exist", path);
    return st;
}

void dsii_backend_module_unload(void *dl_handle) {
    if (dl_handle) dlclose(dl_handle);
}

/* ---- devices ----------------------------------------------------------------------------- */

static void desc_to_info(const dsib_device_desc *d, const char *backend, int32_t index,
                         dsi_device_info *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = (uint32_t)sizeof *out;
    out->type = d->type;
    snprintf(out->backend, sizeof out->backend, "%s", backend);
    memcpy(out->name, d->name, sizeof out->name < sizeof d->name ? sizeof out->name : sizeof d->name);
    out->name[sizeof out->name - 1] = 0;
    out->memory_total = d->memory_total;
    out->memory_free = d->memory_free;
    out->max_buffer_size = d->max_buffer_size;
    out->features = d->features;
    out->subgroup_size = d->subgroup_size;
    out->index = index;
}

#define MAX_DEVS 16

/* Enumerates one backend's devices into `descs` (cap MAX_DEVS); returns the count or -1. */
static int32_t enumerate_backend(dsi_context *ctx, const dsib_backend *t, dsib_device_desc *descs,
                                 dsii_error *err) {
    dsib_host host;
    dsii_backend_host_init(ctx, &host, -1);
    for (int i = 0; i < MAX_DEVS; i++) {
        memset(&descs[i], 0, sizeof descs[i]);
        descs[i].struct_size = (uint32_t)sizeof descs[i];
    }
    int32_t count = 0;
    dsib_error be;
    be.msg[0] = 0;
    dsi_status st = t->enumerate(&host, descs, MAX_DEVS, &count, &be);
    if (st != DSI_OK) {
        be.msg[sizeof be.msg - 1] = 0;
        dsii_fail(err, st, "%s: %s", t->name, be.msg[0] ? be.msg : dsi_status_string(st));
        return -1;
    }
    if (count < 0) count = 0;
    return count > MAX_DEVS ? MAX_DEVS : count;
}

dsi_status dsii_backend_list_devices(dsi_context *ctx, dsi_device_info *out, int32_t cap,
                                     int32_t *count, dsii_error *err) {
    if (!count || cap < 0 || (cap > 0 && !out))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "bad arguments to list_devices");
    int32_t total = 0;
    dsib_device_desc descs[MAX_DEVS];

    const dsib_backend *cpu = dsib_cpu_backend();
    dsii_error e;
    dsii_error_clear(&e);
    int32_t n = cpu ? enumerate_backend(ctx, cpu, descs, &e) : -1;
    if (n < 1) {
        /* The CPU is always device 0, even if its backend could not describe itself. */
        memset(&descs[0], 0, sizeof descs[0]);
        descs[0].type = DSI_DEVICE_CPU;
        snprintf(descs[0].name, sizeof descs[0].name, "CPU");
        n = 1;
    }
    for (int32_t i = 0; i < n; i++, total++)
        if (total < cap) desc_to_info(&descs[i], "cpu", i, &out[total]);

    for (size_t m = 0; m < N_MODULES; m++) {
        const dsib_backend *t;
        void *h;
        dsii_error_clear(&e);
        if (dsii_backend_module_load(ctx, k_modules[m], &t, &h, NULL, 0, &e) != DSI_OK) {
            dsii_log(ctx, DSI_LOG_DEBUG, "device list: %s", e.msg);
            continue;
        }
        dsii_error_clear(&e);
        n = enumerate_backend(ctx, t, descs, &e);
        if (n < 0) dsii_log(ctx, DSI_LOG_DEBUG, "device list: %s", e.msg);
        for (int32_t i = 0; i < n; i++, total++)
            if (total < cap) desc_to_info(&descs[i], k_modules[m], i, &out[total]);
        dsii_backend_module_unload(h);
    }
    *count = total;
    return DSI_OK;
}

/* ---- open / close ------------------------------------------------------------------------ */

static dsi_status create_on(dsi_context *ctx, const dsib_backend *t, void *h, const char *path,
                            int32_t device_index, dsii_device **out, dsii_error *err) {
    dsii_device *s = dsii_calloc(ctx, 1, sizeof *s);
    if (!s) {
        dsii_backend_module_unload(h);
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory (backend device)");
    }
    s->be = t;
    s->dl_handle = h;
    s->can_capture = t->capture_begin && t->capture_end && t->graph_launch && t->graph_destroy;
    snprintf(s->name, sizeof s->name, "%s", t->name);
    snprintf(s->module_path, sizeof s->module_path, "%s", path ? path : "");
    dsii_backend_host_init(ctx, &s->host, device_index);
    dsib_error be;
    be.msg[0] = 0;
    dsi_status st = t->create(&s->host, &s->inst, &be);
    if (st != DSI_OK || !s->inst) {
        if (st == DSI_OK) st = DSI_ERR_BACKEND;
        be.msg[sizeof be.msg - 1] = 0;
        dsii_fail(err, st, "backend '%s': %s", t->name, be.msg[0] ? be.msg : dsi_status_string(st));
        dsii_backend_module_unload(h);
        dsii_free(ctx, s);
        return st;
    }
    memset(&s->desc, 0, sizeof s->desc);
    s->desc.struct_size = (uint32_t)sizeof s->desc;
    if (t->device(s->inst, &s->desc) != DSI_OK) {
        memset(&s->desc, 0, sizeof s->desc);
        s->desc.struct_size = (uint32_t)sizeof s->desc;
    }
    s->device_index = device_index < 0 ? 0 : device_index;
    *out = s;
    return DSI_OK;
}

static int type_rank(int32_t type) {
    switch (type) {
    case DSI_DEVICE_DISCRETE_GPU: return 2;
    case DSI_DEVICE_INTEGRATED_GPU: return 1;
    default: return 0; /* virtual / software / other: the CPU backend is the better choice */
    }
}

static dsi_status open_auto(dsi_context *ctx, int32_t device_index, dsii_device **out,
                            dsii_error *err) {
    /* Best GPU across the modules: discrete > integrated; within a rank, module order
     * (vulkan before cuda — unless device_index names a device explicitly). */
    int best_rank = 0, best_m = -1;
    int32_t best_i = -1;
    char reasons[400];
    size_t rl = 0;
    reasons[0] = 0;
    for (size_t m = 0; m < N_MODULES; m++) {
        const dsib_backend *t;
        void *h;
        dsii_error e;
        dsii_error_clear(&e);
        dsib_device_desc descs[MAX_DEVS];
        int32_t n = -1;
        if (dsii_backend_module_load(ctx, k_modules[m], &t, &h, NULL, 0, &e) == DSI_OK) {
            n = enumerate_backend(ctx, t, descs, &e);
            dsii_backend_module_unload(h);
        }
        const char *why = NULL;
        char whybuf[160];
        if (n < 0) {
            why = e.msg;
        } else {
            int found = 0;
            for (int32_t i = 0; i < n; i++) {
                if (device_index >= 0 && i != device_index) continue;
                int r = type_rank(descs[i].type);
                if (r > best_rank) {
                    best_rank = r;
                    best_m = (int)m;
                    best_i = i;
                }
                if (r > 0) found = 1;
            }
            if (!found) {
                snprintf(whybuf, sizeof whybuf, "%s: no discrete or integrated GPU%s%.100s%s",
                         k_modules[m], n > 0 ? " (" : "", n > 0 ? descs[0].name : "",
                         n > 0 ? (descs[0].type == DSI_DEVICE_SOFTWARE ? " is a software device)"
                                                                       : " is not a GPU)")
                               : "");
                why = whybuf;
            }
        }
        if (why && rl < sizeof reasons - 1) {
            int w = snprintf(reasons + rl, sizeof reasons - rl, "%s%s", rl ? "; " : "", why);
            if (w > 0) rl += (size_t)w;
            if (rl >= sizeof reasons) rl = sizeof reasons - 1;
        }
    }
    if (best_m >= 0) {
        const dsib_backend *t;
        void *h;
        char path[512];
        dsii_error e;
        dsii_error_clear(&e);
        if (dsii_backend_module_load(ctx, k_modules[best_m], &t, &h, path, sizeof path, &e) ==
            DSI_OK) {
            dsi_status st = create_on(ctx, t, h, path, best_i, out, &e);
            if (st == DSI_OK) {
                dsii_log(ctx, DSI_LOG_INFO, "backend auto: using %s device %d (%s)",
                         k_modules[best_m], (int)best_i, (*out)->desc.name);
                return DSI_OK;
            }
        }
        dsii_log(ctx, DSI_LOG_INFO, "backend auto: %s device %d failed (%s); falling back to cpu",
                 k_modules[best_m], (int)best_i, e.msg);
    } else {
        dsii_log(ctx, DSI_LOG_INFO, "backend auto: falling back to cpu (%s)",
                 rl ? reasons : "no GPU backend available");
    }
    const dsib_backend *cpu = dsib_cpu_backend();
    if (!cpu) return dsii_fail(err, DSI_ERR_INTERNAL, "CPU backend missing");
    return create_on(ctx, cpu, NULL, NULL, -1, out, err);
}

dsi_status dsii_backend_open(dsi_context *ctx, const char *name, int32_t device_index,
                             dsii_device **out, dsii_error *err) {
    if (!out) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!name) name = "cpu";
    if (device_index < -1)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "device_index %d is invalid (-1 = best)",
                         (int)device_index);
    if (strcmp(name, "auto") == 0) return open_auto(ctx, device_index, out, err);
    if (strcmp(name, "cpu") == 0) {
        const dsib_backend *cpu = dsib_cpu_backend();
        if (!cpu) return dsii_fail(err, DSI_ERR_INTERNAL, "CPU backend missing");
        if (device_index > 0)
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                             "backend 'cpu' has one device; device_index %d is out of range",
                             (int)device_index);
        return create_on(ctx, cpu, NULL, NULL, device_index, out, err);
    }
    int known = 0;
    for (size_t m = 0; m < N_MODULES; m++) known |= strcmp(name, k_modules[m]) == 0;
    if (!known)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "unknown backend '%.32s' (expected cpu, vulkan, cuda or auto)", name);

    const dsib_backend *t;
    void *h;
    char path[512];
    dsi_status st = dsii_backend_module_load(ctx, name, &t, &h, path, sizeof path, err);
    if (st != DSI_OK) return st;
    if (device_index >= 0) {
        dsib_device_desc descs[MAX_DEVS];
        dsii_error e;
        dsii_error_clear(&e);
        int32_t n = enumerate_backend(ctx, t, descs, &e);
        if (n < 0) {
            dsii_backend_module_unload(h);
            if (err) *err = e;
            return e.status;
        }
        if (device_index >= n) {
            dsii_backend_module_unload(h);
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                             "backend '%s' has %d device(s); device_index %d is out of range",
                             name, (int)n, (int)device_index);
        }
    }
    st = create_on(ctx, t, h, path, device_index, out, err);
    if (st == DSI_OK)
        dsii_log(ctx, DSI_LOG_INFO, "backend %s: device %s (%s)", name, (*out)->desc.name, path);
    return st;
}

void dsii_backend_close(dsi_context *ctx, dsii_device *slot) {
    if (!slot) return;
    if (slot->be && slot->inst) slot->be->destroy(slot->inst);
    void *h = slot->dl_handle;
    dsii_free(ctx, slot);
    dsii_backend_module_unload(h);
}
