/*
 * backends/vulkan/vk_backend.c — the Vulkan backend module: loader, instance and device,
 * memory and buffers, upload / download, per-thread command recording, pipelines and
 * descriptors. The fused ops live in vk_ops.c, the embedded SPIR-V in vk_shaders.c.
 *
 * Environment variables (documented in docs/vulkan.md): DSINFER_VULKAN_VALIDATION=1 turns
 * on VK_LAYER_KHRONOS_validation with a messenger that counts errors;
 * DSINFER_VULKAN_MAX_BINDING / DSINFER_VULKAN_CHUNK (bytes) shrink the binding window and
 * the allocation chunk below the device limits (tests of the large-tensor paths);
 * DSINFER_VULKAN_WEIGHT_CHUNK (bytes) shrinks only the pieces of weight buffers
 * (DSIB_BUFFER_WEIGHTS; with buffer_alloc_rows every piece holds whole rows);
 * DSINFER_VULKAN_BASELINE=1 uses only the baseline shader variants;
 * DSINFER_VULKAN_FORCE_STAGING=1 never maps device buffers (tests the staging path).
 */
#define _GNU_SOURCE
#include "backends/vulkan/vk_impl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSIB_VK_EXPORT __attribute__((visibility("default")))

/* ---- small helpers ----------------------------------------------------------------------- */

void *dsib_vk_malloc(const dsib_host *host, size_t size) {
    if (size == 0) size = 1;
    if (host && host->malloc_fn) return host->malloc_fn(host->alloc_ctx, size);
    return malloc(size);
}

void dsib_vk_free(const dsib_host *host, void *p) {
    if (!p) return;
    if (host && host->free_fn) {
        host->free_fn(host->alloc_ctx, p);
        return;
    }
    free(p);
}

void dsib_vk_log(const dsib_host *host, int32_t level, const char *fmt, ...) {
    if (!host || !host->log_fn) return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    host->log_fn(host->log_ctx, level, buf);
}

static dsi_status set_err(dsib_error *err, dsi_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static dsi_status set_err(dsib_error *err, dsi_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

static uint64_t env_u64(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    return (end && *end == 0) ? (uint64_t)x : 0;
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && v[0] == '1' && v[1] == 0;
}

/* ---- validation messenger (module-global counters, read by tests) ------------------------ */

static pthread_mutex_t g_dbg_lock = PTHREAD_MUTEX_INITIALIZER;
static dsib_vk_debug_stats g_dbg;

static VKAPI_ATTR VkBool32 VKAPI_CALL debug_cb(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                               VkDebugUtilsMessageTypeFlagsEXT types,
                                               const VkDebugUtilsMessengerCallbackDataEXT *data,
                                               void *user) {
    (void)types;
    dsib_instance *inst = user;
    const char *msg = data && data->pMessage ? data->pMessage : "(no message)";
    pthread_mutex_lock(&g_dbg_lock);
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        g_dbg.validation_errors++;
        snprintf(g_dbg.last_error, sizeof g_dbg.last_error, "%s", msg);
    } else if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        g_dbg.validation_warnings++;
    }
    pthread_mutex_unlock(&g_dbg_lock);
    if (inst && (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT))
        dsib_vk_log(&inst->host, DSI_LOG_ERROR, "vulkan validation: %.600s", msg);
    return VK_FALSE;
}

DSIB_VK_EXPORT void dsib_vulkan_debug_stats(dsib_vk_debug_stats *out) {
    if (!out) return;
    pthread_mutex_lock(&g_dbg_lock);
    *out = g_dbg;
    pthread_mutex_unlock(&g_dbg_lock);
    out->struct_size = (uint32_t)sizeof *out;
}

/* ---- loader and instance ----------------------------------------------------------------- */

static dsi_status load_vulkan(dsib_vk_fns *vk, void **handle, dsib_error *err) {
    memset(vk, 0, sizeof *vk);
    void *h = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return set_err(err, DSI_ERR_UNSUPPORTED,
                       "vulkan: no Vulkan loader (libvulkan.so.1 not found; install the Vulkan "
                       "loader and a driver, e.g. libvulkan1 + mesa-vulkan-drivers)");
    void *sym = dlsym(h, "vkGetInstanceProcAddr");
    if (!sym) {
        dlclose(h);
        return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: libvulkan has no vkGetInstanceProcAddr");
    }
    memcpy(&vk->vkGetInstanceProcAddr, &sym, sizeof sym);
#define LOAD_G(name)                                                                           \
    vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(VK_NULL_HANDLE, #name);                 \
    if (!vk->name) {                                                                           \
        dlclose(h);                                                                            \
        return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: loader lacks %s", #name);            \
    }
    DSIB_VK_GLOBAL_FNS(LOAD_G)
#undef LOAD_G
    *handle = h;
    return DSI_OK;
}

static int has_layer(dsib_vk_fns *vk, const char *name) {
    uint32_t n = 0;
    if (vk->vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) return 0;
    VkLayerProperties props[64];
    if (n > 64) n = 64;
    if (vk->vkEnumerateInstanceLayerProperties(&n, props) < 0) return 0;
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(props[i].layerName, name) == 0) return 1;
    return 0;
}

static int has_instance_ext(dsib_vk_fns *vk, const char *layer, const char *name) {
    uint32_t n = 0;
    if (vk->vkEnumerateInstanceExtensionProperties(layer, &n, NULL) != VK_SUCCESS) return 0;
    VkExtensionProperties props[128];
    if (n > 128) n = 128;
    if (vk->vkEnumerateInstanceExtensionProperties(layer, &n, props) < 0) return 0;
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(props[i].extensionName, name) == 0) return 1;
    return 0;
}

/* Creates the VkInstance (Vulkan 1.1) and, when validation is requested, the layer and the
 * messenger. `inst` receives instance, messenger and the instance-level functions. */
static dsi_status create_vk_instance(dsib_instance *inst, int want_validation, dsib_error *err) {
    dsib_vk_fns *vk = &inst->vk;
    PFN_vkEnumerateInstanceVersion ev =
        (PFN_vkEnumerateInstanceVersion)vk->vkGetInstanceProcAddr(VK_NULL_HANDLE,
                                                                  "vkEnumerateInstanceVersion");
    uint32_t iv = VK_API_VERSION_1_0;
    if (ev) ev(&iv);
    if (iv < VK_API_VERSION_1_1)
        return set_err(err, DSI_ERR_UNSUPPORTED,
                       "vulkan: the loader supports only Vulkan %u.%u; 1.1 is required",
                       VK_API_VERSION_MAJOR(iv), VK_API_VERSION_MINOR(iv));

    const char *layers[1];
    uint32_t n_layers = 0;
    const char *exts[2];
    uint32_t n_exts = 0;
    int validation = 0;
    if (want_validation) {
        if (has_layer(vk, "VK_LAYER_KHRONOS_validation") &&
            (has_instance_ext(vk, NULL, VK_EXT_DEBUG_UTILS_EXTENSION_NAME) ||
             has_instance_ext(vk, "VK_LAYER_KHRONOS_validation",
                              VK_EXT_DEBUG_UTILS_EXTENSION_NAME))) {
            layers[n_layers++] = "VK_LAYER_KHRONOS_validation";
            exts[n_exts++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
            validation = 1;
        } else {
            dsib_vk_log(&inst->host, DSI_LOG_WARN,
                        "vulkan: DSINFER_VULKAN_VALIDATION=1 but VK_LAYER_KHRONOS_validation / "
                        "VK_EXT_debug_utils is not installed; running without validation");
        }
    }
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "libdsinfer";
    app.pEngineName = "libdsinfer";
    app.apiVersion = iv >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_1;
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    ci.enabledLayerCount = n_layers;
    ci.ppEnabledLayerNames = layers;
    ci.enabledExtensionCount = n_exts;
    ci.ppEnabledExtensionNames = exts;
    VkDebugUtilsMessengerCreateInfoEXT mci = {.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mci.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                          VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mci.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                      VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                      VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mci.pfnUserCallback = debug_cb;
    mci.pUserData = inst;
    if (validation) ci.pNext = &mci; /* also catches errors in vkCreate/DestroyInstance */
    VkResult vr = vk->vkCreateInstance(&ci, NULL, &inst->instance);
    if (vr != VK_SUCCESS)
        return set_err(err, DSI_ERR_UNSUPPORTED,
                       "vulkan: vkCreateInstance failed (VkResult %d): no usable driver", (int)vr);
#define LOAD_I(name)                                                                           \
    vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(inst->instance, #name);                 \
    if (!vk->name) return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: driver lacks %s", #name);
    DSIB_VK_INSTANCE_FNS(LOAD_I)
#undef LOAD_I
    if (validation) {
        vk->vkCreateDebugUtilsMessengerEXT = (PFN_vkCreateDebugUtilsMessengerEXT)
            vk->vkGetInstanceProcAddr(inst->instance, "vkCreateDebugUtilsMessengerEXT");
        vk->vkDestroyDebugUtilsMessengerEXT = (PFN_vkDestroyDebugUtilsMessengerEXT)
            vk->vkGetInstanceProcAddr(inst->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (vk->vkCreateDebugUtilsMessengerEXT &&
            vk->vkCreateDebugUtilsMessengerEXT(inst->instance, &mci, NULL, &inst->messenger) ==
                VK_SUCCESS) {
            pthread_mutex_lock(&g_dbg_lock);
            g_dbg.validation_enabled = 1;
            pthread_mutex_unlock(&g_dbg_lock);
        }
    }
    return DSI_OK;
}

/* ---- device description ------------------------------------------------------------------- */

static int has_device_ext(const dsib_vk_fns *vk, VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || !n) return 0;
    VkExtensionProperties *props = malloc(n * sizeof *props);
    if (!props) return 0;
    int found = 0;
    if (vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, props) >= 0)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(props[i].extensionName, name) == 0;
    free(props);
    return found;
}

static int compute_queue_family(const dsib_vk_fns *vk, VkPhysicalDevice pd, uint32_t *family) {
    uint32_t n = 0;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties props[32];
    if (n > 32) n = 32;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, props);
    /* Prefer a compute queue family without graphics (async compute), else any. */
    int best = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (!(props[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || props[i].queueCount == 0) continue;
        if (best < 0 || !(props[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) best = (int)i;
    }
    if (best < 0) return 0;
    *family = (uint32_t)best;
    return 1;
}

/* Describes a physical device. Returns 0 (with `why` filled) when it cannot run the backend. */
static int describe_device(const dsib_vk_fns *vk, VkPhysicalDevice pd, dsib_device_desc *d,
                           uint32_t *vk_features, char *why, size_t why_cap) {
    VkPhysicalDeviceProperties p;
    vk->vkGetPhysicalDeviceProperties(pd, &p);
    memset(d, 0, sizeof *d);
    d->struct_size = (uint32_t)sizeof *d;
    snprintf(d->name, sizeof d->name, "%s", p.deviceName);
    switch (p.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: d->type = DSI_DEVICE_DISCRETE_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: d->type = DSI_DEVICE_INTEGRATED_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: d->type = DSI_DEVICE_VIRTUAL_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: d->type = DSI_DEVICE_SOFTWARE; break; /* lavapipe */
    default: d->type = DSI_DEVICE_OTHER; break;
    }
    VkPhysicalDeviceMemoryProperties mp;
    vk->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            d->memory_total += mp.memoryHeaps[i].size;
    d->max_buffer_size = p.limits.maxStorageBufferRange;

    if (p.apiVersion < VK_API_VERSION_1_1) {
        snprintf(why, why_cap, "%.200s supports Vulkan %u.%u only (1.1 required)", p.deviceName,
                 VK_API_VERSION_MAJOR(p.apiVersion), VK_API_VERSION_MINOR(p.apiVersion));
        return 0;
    }
    uint32_t fam;
    if (!compute_queue_family(vk, pd, &fam)) {
        snprintf(why, why_cap, "%.200s has no compute queue", p.deviceName);
        return 0;
    }

    /* Properties: subgroups, maintenance3 (max allocation), integer dot product. */
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    sg.pNext = &m3;
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &sg;
    vk->vkGetPhysicalDeviceProperties2(pd, &p2);
    d->max_allocation_size = m3.maxMemoryAllocationSize;
    d->subgroup_size = sg.subgroupSize;

    /* Features. 1.1 core: 16-bit storage. 1.2 core (or KHR extensions): fp16/int8
     * arithmetic, 8-bit storage. 1.3 core (or KHR extension): integer dot product. */
    int v12 = p.apiVersion >= VK_API_VERSION_1_2, v13 = p.apiVersion >= VK_API_VERSION_1_3;
    VkPhysicalDevice16BitStorageFeatures s16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDeviceShaderFloat16Int8Features f16 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
    VkPhysicalDevice8BitStorageFeatures s8 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES};
    VkPhysicalDeviceShaderIntegerDotProductFeatures idot = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    void **chain = &f2.pNext;
    *chain = &s16;
    chain = &s16.pNext;
    int has_f16 = v12 || has_device_ext(vk, pd, "VK_KHR_shader_float16_int8");
    int has_s8 = v12 || has_device_ext(vk, pd, "VK_KHR_8bit_storage");
    int has_idot = v13 || has_device_ext(vk, pd, "VK_KHR_shader_integer_dot_product");
    if (has_f16) {
        *chain = &f16;
        chain = &f16.pNext;
    }
    if (has_s8) {
        *chain = &s8;
        chain = &s8.pNext;
    }
    if (has_idot) {
        *chain = &idot;
        chain = &idot.pNext;
    }
    vk->vkGetPhysicalDeviceFeatures2(pd, &f2);
    uint32_t feats = 0, vkf = 0;
    if (has_f16 && f16.shaderFloat16) feats |= DSI_DEVICE_FEATURE_FP16, vkf |= DSIB_VK_NEED_FP16;
    if (s16.storageBuffer16BitAccess)
        feats |= DSI_DEVICE_FEATURE_STORAGE_16, vkf |= DSIB_VK_NEED_STORAGE16;
    if (has_s8 && s8.storageBuffer8BitAccess)
        feats |= DSI_DEVICE_FEATURE_STORAGE_8, vkf |= DSIB_VK_NEED_STORAGE8;
    if ((sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
        (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT))
        feats |= DSI_DEVICE_FEATURE_SUBGROUPS, vkf |= DSIB_VK_NEED_SUBGROUP_ARITH;
    if (has_idot && idot.shaderIntegerDotProduct)
        feats |= DSI_DEVICE_FEATURE_INT_DOT, vkf |= DSIB_VK_NEED_INT_DOT;
    if (has_device_ext(vk, pd, "VK_KHR_cooperative_matrix")) feats |= DSI_DEVICE_FEATURE_COOPMAT;
    d->features = feats;
    if (vk_features) *vk_features = vkf;
    return 1;
}

/* Lists usable physical devices (those describe_device accepts), in driver order. */
static dsi_status list_physical(dsib_instance *tmp, VkPhysicalDevice *pds, dsib_device_desc *descs,
                                uint32_t *vkf, int32_t cap, int32_t *count, dsib_error *err) {
    uint32_t n = 0;
    VkResult vr = tmp->vk.vkEnumeratePhysicalDevices(tmp->instance, &n, NULL);
    if (vr != VK_SUCCESS || n == 0)
        return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: no Vulkan device (driver reports none)");
    VkPhysicalDevice all[16];
    if (n > 16) n = 16;
    vr = tmp->vk.vkEnumeratePhysicalDevices(tmp->instance, &n, all);
    if (vr < 0) return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: vkEnumeratePhysicalDevices failed");
    int32_t k = 0;
    char why[256] = "";
    for (uint32_t i = 0; i < n && k < cap; i++) {
        dsib_device_desc d;
        uint32_t f = 0;
        char w[256];
        if (!describe_device(&tmp->vk, all[i], &d, &f, w, sizeof w)) {
            dsib_vk_log(&tmp->host, DSI_LOG_DEBUG, "vulkan: skipping device: %s", w);
            if (!why[0]) snprintf(why, sizeof why, "%s", w);
            continue;
        }
        if (pds) pds[k] = all[i];
        if (descs) descs[k] = d;
        if (vkf) vkf[k] = f;
        k++;
    }
    if (k == 0)
        return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: no usable device: %s", why);
    *count = k;
    return DSI_OK;
}

static void destroy_vk_instance(dsib_instance *inst) {
    if (inst->instance) {
        if (inst->messenger && inst->vk.vkDestroyDebugUtilsMessengerEXT)
            inst->vk.vkDestroyDebugUtilsMessengerEXT(inst->instance, inst->messenger, NULL);
        inst->messenger = VK_NULL_HANDLE;
        if (inst->vk.vkDestroyInstance) inst->vk.vkDestroyInstance(inst->instance, NULL);
        inst->instance = VK_NULL_HANDLE;
    }
    if (inst->libvulkan) dlclose(inst->libvulkan);
    inst->libvulkan = NULL;
}

static dsi_status vk_enumerate(const dsib_host *host, dsib_device_desc *out, int32_t cap,
                               int32_t *count, dsib_error *err) {
    if (!count) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: count is NULL");
    *count = 0;
    dsib_instance tmp;
    memset(&tmp, 0, sizeof tmp);
    if (host) tmp.host = *host;
    dsi_status st = load_vulkan(&tmp.vk, &tmp.libvulkan, err);
    if (st != DSI_OK) return st;
    /* Enumeration never enables validation: it creates no objects worth checking. */
    st = create_vk_instance(&tmp, 0, err);
    if (st == DSI_OK) {
        dsib_device_desc descs[16];
        int32_t n = 0;
        st = list_physical(&tmp, NULL, descs, NULL, 16, &n, err);
        if (st == DSI_OK) {
            for (int32_t i = 0; i < n && i < cap && out; i++) out[i] = descs[i];
            *count = n;
        }
    }
    destroy_vk_instance(&tmp);
    return st;
}

/* ---- memory types -------------------------------------------------------------------------- */

static int find_mem_type(const VkPhysicalDeviceMemoryProperties *mp, uint32_t bits,
                         VkMemoryPropertyFlags need, VkMemoryPropertyFlags prefer) {
    int fallback = -1;
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++) {
        if (!(bits & (1u << i))) continue;
        VkMemoryPropertyFlags f = mp->memoryTypes[i].propertyFlags;
        if ((f & need) != need) continue;
        if ((f & prefer) == prefer) return (int)i;
        if (fallback < 0) fallback = (int)i;
    }
    return fallback;
}

/* ---- buffers ------------------------------------------------------------------------------- */

static void free_chunks(dsib_instance *inst, dsib_buffer *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        dsib_vk_chunk *c = &b->chunks[i];
        if (c->mapped) inst->vk.vkUnmapMemory(inst->device, c->mem);
        if (c->buf) inst->vk.vkDestroyBuffer(inst->device, c->buf, NULL);
        if (c->mem) {
            inst->vk.vkFreeMemory(inst->device, c->mem, NULL);
            atomic_fetch_sub(&inst->mem_used, c->size);
        }
    }
}

dsi_status dsib_vk_buffer_create(dsib_instance *inst, uint64_t size, uint32_t flags,
                                 dsib_buffer **out, char *msg, size_t msg_cap) {
    return dsib_vk_buffer_create_rows(inst, size, 0, flags, out, msg, msg_cap);
}

dsi_status dsib_vk_buffer_create_rows(dsib_instance *inst, uint64_t size, uint64_t row_bytes,
                                      uint32_t flags, dsib_buffer **out, char *msg,
                                      size_t msg_cap) {
    *out = NULL;
    if (size == 0) size = 4;
    if (size > UINT64_MAX / 2) {
        snprintf(msg, msg_cap, "vulkan: out of device memory: %llu bytes requested",
                 (unsigned long long)size);
        return DSI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    uint64_t asked = size;
    size = (size + 3) & ~(uint64_t)3; /* shaders address 32-bit words */
    uint64_t cs = (flags & DSIB_BUFFER_WEIGHTS) ? inst->weight_chunk_max : inst->chunk_max;
    if (row_bytes > 0) {
        /* chunks of whole rows (and whole 32-bit words): g = lcm(row_bytes, 4) */
        uint64_t g = row_bytes % 4 == 0 ? row_bytes : row_bytes % 2 == 0 ? row_bytes * 2 : row_bytes * 4;
        if (g <= cs) cs = cs / g * g;
    }
    uint64_t n = (size + cs - 1) / cs;
    int host = (flags & DSIB_BUFFER_HOST_VISIBLE) != 0;
    uint64_t used = atomic_load(&inst->mem_used);
    if (inst->heap_size && used + size > inst->heap_size) {
        snprintf(msg, msg_cap,
                 "vulkan: out of device memory: %llu bytes requested, %llu of %llu in use",
                 (unsigned long long)size, (unsigned long long)used,
                 (unsigned long long)inst->heap_size);
        return DSI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    if (n > 1u << 16) {
        snprintf(msg, msg_cap, "vulkan: buffer of %llu bytes needs too many chunks",
                 (unsigned long long)size);
        return DSI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    dsib_buffer *b = dsib_vk_malloc(&inst->host, sizeof *b + (size_t)n * sizeof(dsib_vk_chunk));
    if (!b) {
        snprintf(msg, msg_cap, "vulkan: out of host memory (buffer record)");
        return DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    memset(b, 0, sizeof *b + (size_t)n * sizeof(dsib_vk_chunk));
    b->size = asked;
    b->chunk_size = cs;
    b->n_chunks = (uint32_t)n;
    b->flags = flags;
    b->host_mapped = 1;
    VkPhysicalDeviceMemoryProperties mp;
    inst->vk.vkGetPhysicalDeviceMemoryProperties(inst->phys, &mp);
    for (uint32_t i = 0; i < n; i++) {
        dsib_vk_chunk *c = &b->chunks[i];
        uint64_t csz = (i + 1 < n) ? cs : size - cs * (n - 1);
        VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
        bi.size = csz;
        bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                   VK_BUFFER_USAGE_TRANSFER_DST_BIT;
        bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
        VkResult vr = inst->vk.vkCreateBuffer(inst->device, &bi, NULL, &c->buf);
        if (vr != VK_SUCCESS) {
            snprintf(msg, msg_cap, "vulkan: vkCreateBuffer(%llu bytes) failed (VkResult %d)",
                     (unsigned long long)csz, (int)vr);
            free_chunks(inst, b, i + 1);
            dsib_vk_free(&inst->host, b);
            return vr == VK_ERROR_OUT_OF_HOST_MEMORY ? DSI_ERR_OUT_OF_HOST_MEMORY
                                                     : DSI_ERR_OUT_OF_DEVICE_MEMORY;
        }
        VkMemoryRequirements req;
        inst->vk.vkGetBufferMemoryRequirements(inst->device, c->buf, &req);
        int mt;
        if (host)
            mt = find_mem_type(&mp, req.memoryTypeBits,
                               VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                   VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                               VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
        else
            mt = (req.memoryTypeBits & (1u << inst->mem_type_device))
                     ? (int)inst->mem_type_device
                     : find_mem_type(&mp, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
        if (mt < 0) mt = find_mem_type(&mp, req.memoryTypeBits, 0, 0);
        VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
        ai.allocationSize = req.size;
        ai.memoryTypeIndex = (uint32_t)mt;
        vr = mt < 0 ? VK_ERROR_OUT_OF_DEVICE_MEMORY
                    : inst->vk.vkAllocateMemory(inst->device, &ai, NULL, &c->mem);
        if (vr != VK_SUCCESS) {
            c->mem = VK_NULL_HANDLE;
            snprintf(msg, msg_cap,
                     "vulkan: out of device memory allocating %llu bytes (chunk %u of %u of a "
                     "%llu-byte buffer; %llu bytes in use; VkResult %d)",
                     (unsigned long long)req.size, i + 1, (unsigned)n, (unsigned long long)size,
                     (unsigned long long)atomic_load(&inst->mem_used), (int)vr);
            free_chunks(inst, b, i + 1);
            dsib_vk_free(&inst->host, b);
            return DSI_ERR_OUT_OF_DEVICE_MEMORY;
        }
        /* Accounting counts usable bytes (what callers asked for), so memory_used returns
         * to its old value after every free. */
        c->size = csz;
        atomic_fetch_add(&inst->mem_used, c->size);
        vr = inst->vk.vkBindBufferMemory(inst->device, c->buf, c->mem, 0);
        if (vr != VK_SUCCESS) {
            snprintf(msg, msg_cap, "vulkan: vkBindBufferMemory failed (VkResult %d)", (int)vr);
            free_chunks(inst, b, i + 1);
            dsib_vk_free(&inst->host, b);
            return DSI_ERR_BACKEND;
        }
        VkMemoryPropertyFlags pf = mp.memoryTypes[mt].propertyFlags;
        void *ptr = NULL;
        if ((host || !inst->force_staging) && (pf & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
            (pf & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) &&
            inst->vk.vkMapMemory(inst->device, c->mem, 0, VK_WHOLE_SIZE, 0, &ptr) == VK_SUCCESS)
            c->mapped = ptr;
        else
            b->host_mapped = 0;
    }
    *out = b;
    return DSI_OK;
}

void dsib_vk_buffer_destroy(dsib_instance *inst, dsib_buffer *b) {
    if (!b) return;
    free_chunks(inst, b, b->n_chunks);
    dsib_vk_free(&inst->host, b);
}

dsi_status dsib_vk_resolve(const dsib_instance *inst, const dsib_buffer *b, uint64_t offset,
                           uint64_t need, dsib_vk_bind *out) {
    if (!b || offset >= b->size) return DSI_ERR_INVALID_ARGUMENT;
    uint64_t ci = offset / b->chunk_size;
    const dsib_vk_chunk *c = &b->chunks[ci];
    uint64_t in = offset - ci * b->chunk_size;
    uint64_t base = in - in % inst->min_align;
    uint64_t skew = in - base;
    uint64_t avail = c->size - base;
    if (avail > inst->max_binding) avail = inst->max_binding;
    if (need == 0) need = 4;
    if (skew + need > avail) return DSI_ERR_UNSUPPORTED;
    out->buf = c->buf;
    out->base = base;
    out->range = avail & ~(uint64_t)3;
    out->skew = (uint32_t)skew;
    return DSI_OK;
}

uint64_t dsib_vk_window_avail(const dsib_instance *inst, const dsib_buffer *b, uint64_t offset) {
    if (!b || offset >= b->size) return 0;
    uint64_t ci = offset / b->chunk_size;
    uint64_t in = offset - ci * b->chunk_size;
    uint64_t base = in - in % inst->min_align;
    uint64_t avail = b->chunks[ci].size - base;
    if (avail > inst->max_binding) avail = inst->max_binding;
    return avail - (in - base);
}

/* ---- pipelines ----------------------------------------------------------------------------- */

int dsib_vk_shader_index(const char *name) {
    for (size_t i = 0; i < dsib_vk_n_shaders; i++)
        if (strcmp(dsib_vk_shaders[i].name, name) == 0) return (int)i;
    return -1;
}

static VkPipeline get_pipeline(dsib_instance *inst, uint32_t si, char *msg, size_t cap) {
    dsib_vk_pipeline *p = &inst->pipes[si];
    pthread_mutex_lock(&inst->pipe_lock);
    if (!p->tried) {
        p->tried = 1;
        const dsib_vk_shader *s = &dsib_vk_shaders[si];
        VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
        mi.codeSize = s->size;
        mi.pCode = s->code;
        VkShaderModule mod;
        VkResult vr = inst->vk.vkCreateShaderModule(inst->device, &mi, NULL, &mod);
        if (vr == VK_SUCCESS) {
            VkComputePipelineCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
            ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
            ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
            ci.stage.module = mod;
            ci.stage.pName = "main";
            ci.layout = inst->layout;
            vr = inst->vk.vkCreateComputePipelines(inst->device, inst->cache, 1, &ci, NULL, &p->pipe);
            inst->vk.vkDestroyShaderModule(inst->device, mod, NULL);
        }
        if (vr != VK_SUCCESS) {
            p->pipe = VK_NULL_HANDLE;
            dsib_vk_log(&inst->host, DSI_LOG_ERROR, "vulkan: pipeline %s failed (VkResult %d)",
                        s->name, (int)vr);
        }
    }
    VkPipeline pipe = p->pipe;
    pthread_mutex_unlock(&inst->pipe_lock);
    if (!pipe) snprintf(msg, cap, "vulkan: pipeline %s could not be created", dsib_vk_shaders[si].name);
    return pipe;
}

/* ---- recorders ------------------------------------------------------------------------------ */

#define DSIB_VK_SETS_PER_POOL 512

static dsib_vk_recorder *rec_find(dsib_instance *inst, int create) {
    pthread_t self = pthread_self();
    pthread_mutex_lock(&inst->rec_lock);
    dsib_vk_recorder *r = inst->recorders;
    while (r && !pthread_equal(r->thread, self)) r = r->next;
    if (!r && create) {
        r = dsib_vk_malloc(&inst->host, sizeof *r);
        if (r) {
            memset(r, 0, sizeof *r);
            r->thread = self;
            VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
            pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
            pi.queueFamilyIndex = inst->queue_family;
            VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
            ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
            ai.commandBufferCount = 1;
            VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
            VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       DSIB_VK_SETS_PER_POOL * DSIB_VK_MAX_BINDINGS};
            VkDescriptorPoolCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
            di.maxSets = DSIB_VK_SETS_PER_POOL;
            di.poolSizeCount = 1;
            di.pPoolSizes = &ps;
            int ok = inst->vk.vkCreateCommandPool(inst->device, &pi, NULL, &r->pool) == VK_SUCCESS;
            if (ok) {
                ai.commandPool = r->pool;
                ok = inst->vk.vkAllocateCommandBuffers(inst->device, &ai, &r->cb) == VK_SUCCESS;
            }
            ok = ok && inst->vk.vkCreateFence(inst->device, &fi, NULL, &r->fence) == VK_SUCCESS;
            ok = ok && inst->vk.vkCreateDescriptorPool(inst->device, &di, NULL, &r->dpool) == VK_SUCCESS;
            if (!ok) {
                if (r->dpool) inst->vk.vkDestroyDescriptorPool(inst->device, r->dpool, NULL);
                if (r->fence) inst->vk.vkDestroyFence(inst->device, r->fence, NULL);
                if (r->pool) inst->vk.vkDestroyCommandPool(inst->device, r->pool, NULL);
                dsib_vk_free(&inst->host, r);
                r = NULL;
            } else {
                r->next = inst->recorders;
                inst->recorders = r;
            }
        }
    }
    pthread_mutex_unlock(&inst->rec_lock);
    return r;
}

static void rec_free_temps(dsib_instance *inst, dsib_vk_recorder *r) {
    while (r->temps) {
        dsib_vk_temp *t = r->temps;
        r->temps = t->next;
        dsib_vk_buffer_destroy(inst, t->buf);
        dsib_vk_free(&inst->host, t);
    }
}

/* Ends, submits and waits for the recorded work; resets the pools. Temporary buffers are
 * freed only at the end of a recording (`final`): a flush in the middle of an op (descriptor
 * pool full) must keep the op's temporaries alive for its remaining dispatches. */
static dsi_status rec_flush(dsib_instance *inst, dsib_vk_recorder *r, int final) {
    dsi_status st = DSI_OK;
    if (r->has_cmds) {
        VkResult vr = inst->vk.vkEndCommandBuffer(r->cb);
        if (vr == VK_SUCCESS) {
            VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
            si.commandBufferCount = 1;
            si.pCommandBuffers = &r->cb;
            pthread_mutex_lock(&inst->queue_lock);
            vr = inst->vk.vkQueueSubmit(inst->queue, 1, &si, r->fence);
            pthread_mutex_unlock(&inst->queue_lock);
            if (vr == VK_SUCCESS) {
                vr = inst->vk.vkWaitForFences(inst->device, 1, &r->fence, VK_TRUE, UINT64_MAX);
                inst->vk.vkResetFences(inst->device, 1, &r->fence);
            }
        }
        if (vr != VK_SUCCESS) {
            st = vr == VK_ERROR_DEVICE_LOST ? DSI_ERR_BACKEND
                 : vr == VK_ERROR_OUT_OF_DEVICE_MEMORY ? DSI_ERR_OUT_OF_DEVICE_MEMORY
                                                        : DSI_ERR_BACKEND;
            dsib_vk_rec_fail(r, st, "vulkan: submission failed (VkResult %d)", (int)vr);
        }
        inst->vk.vkResetCommandPool(inst->device, r->pool, 0);
        r->has_cmds = 0;
    }
    inst->vk.vkResetDescriptorPool(inst->device, r->dpool, 0);
    r->sets_used = 0;
    if (final) rec_free_temps(inst, r);
    return st;
}

static dsi_status rec_ensure_begun(dsib_instance *inst, dsib_vk_recorder *r) {
    if (r->has_cmds) return DSI_OK;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (inst->vk.vkBeginCommandBuffer(r->cb, &bi) != VK_SUCCESS)
        return dsib_vk_rec_fail(r, DSI_ERR_BACKEND, "vulkan: vkBeginCommandBuffer failed");
    r->has_cmds = 1;
    return DSI_OK;
}

dsi_status dsib_vk_rec_fail(dsib_vk_recorder *r, dsi_status st, const char *fmt, ...) {
    if (r && r->status == DSI_OK) {
        r->status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

dsib_vk_recorder *dsib_vk_rec_get(dsib_instance *inst, int *implicit) {
    dsib_vk_recorder *r = rec_find(inst, 1);
    *implicit = 0;
    if (r && !r->active) {
        /* An op outside begin/submit runs at once, like the CPU backend's. */
        r->active = 1;
        r->status = DSI_OK;
        r->msg[0] = 0;
        *implicit = 1;
    }
    return r;
}

dsi_status dsib_vk_rec_end_implicit(dsib_instance *inst, dsib_vk_recorder *r, int implicit) {
    if (!implicit) return DSI_OK;
    rec_flush(inst, r, 1);
    r->active = 0;
    dsi_status st = r->status;
    if (st != DSI_OK) dsib_vk_log(&inst->host, DSI_LOG_ERROR, "%s", r->msg);
    return st;
}

dsi_status dsib_vk_rec_temp(dsib_instance *inst, dsib_vk_recorder *r, uint64_t size,
                            dsib_buffer **out) {
    char msg[512];
    dsib_vk_temp *t = dsib_vk_malloc(&inst->host, sizeof *t);
    if (!t) return dsib_vk_rec_fail(r, DSI_ERR_OUT_OF_HOST_MEMORY, "vulkan: out of host memory");
    dsi_status st = dsib_vk_buffer_create(inst, size, DSIB_BUFFER_SCRATCH, out, msg, sizeof msg);
    if (st != DSI_OK) {
        dsib_vk_free(&inst->host, t);
        return dsib_vk_rec_fail(r, st, "%s", msg);
    }
    t->buf = *out;
    t->next = r->temps;
    r->temps = t;
    return DSI_OK;
}

static void record_barrier(dsib_instance *inst, dsib_vk_recorder *r) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    inst->vk.vkCmdPipelineBarrier(r->cb,
                                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                                  0, 1, &mb, 0, NULL, 0, NULL);
}

dsi_status dsib_vk_dispatch(dsib_instance *inst, dsib_vk_recorder *r, uint32_t si,
                            const dsib_vk_bind *binds, uint32_t n_binds, const uint32_t *push,
                            uint32_t n_push, uint32_t gx, uint32_t gy, uint32_t gz) {
    if (r->status != DSI_OK) return r->status;
    if (gx == 0 || gy == 0 || gz == 0) return DSI_OK;
    if (gx > inst->max_groups[0] || gy > inst->max_groups[1] || gz > inst->max_groups[2])
        return dsib_vk_rec_fail(r, DSI_ERR_UNSUPPORTED,
                                "vulkan: %s: dispatch %ux%ux%u exceeds the device's group limits",
                                dsib_vk_shaders[si].name, gx, gy, gz);
    char msg[256];
    VkPipeline pipe = get_pipeline(inst, si, msg, sizeof msg);
    if (!pipe) return dsib_vk_rec_fail(r, DSI_ERR_BACKEND, "%s", msg);
    if (r->sets_used >= DSIB_VK_SETS_PER_POOL) {
        /* Descriptor pool full: run what is recorded so far and continue (same order). */
        dsi_status st = rec_flush(inst, r, 0);
        if (st != DSI_OK) return st;
    }
    dsi_status st = rec_ensure_begun(inst, r);
    if (st != DSI_OK) return st;
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = r->dpool;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &inst->dsl;
    VkDescriptorSet set;
    if (inst->vk.vkAllocateDescriptorSets(inst->device, &ai, &set) != VK_SUCCESS)
        return dsib_vk_rec_fail(r, DSI_ERR_BACKEND, "vulkan: vkAllocateDescriptorSets failed");
    r->sets_used++;
    VkDescriptorBufferInfo bi[DSIB_VK_MAX_BINDINGS];
    VkWriteDescriptorSet wr[DSIB_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < DSIB_VK_MAX_BINDINGS; i++) {
        if (i < n_binds && binds[i].buf) {
            bi[i].buffer = binds[i].buf;
            bi[i].offset = binds[i].base;
            bi[i].range = binds[i].range;
        } else {
            bi[i].buffer = inst->dummy->chunks[0].buf;
            bi[i].offset = 0;
            bi[i].range = inst->dummy->chunks[0].size;
        }
        memset(&wr[i], 0, sizeof wr[i]);
        wr[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        wr[i].dstSet = set;
        wr[i].dstBinding = i;
        wr[i].descriptorCount = 1;
        wr[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        wr[i].pBufferInfo = &bi[i];
    }
    inst->vk.vkUpdateDescriptorSets(inst->device, DSIB_VK_MAX_BINDINGS, wr, 0, NULL);
    record_barrier(inst, r);
    inst->vk.vkCmdBindPipeline(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    inst->vk.vkCmdBindDescriptorSets(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, inst->layout, 0, 1,
                                     &set, 0, NULL);
    uint32_t words[DSIB_VK_PUSH_WORDS];
    memset(words, 0, sizeof words);
    if (n_push > DSIB_VK_PUSH_WORDS) n_push = DSIB_VK_PUSH_WORDS;
    memcpy(words, push, n_push * sizeof(uint32_t));
    inst->vk.vkCmdPushConstants(r->cb, inst->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                sizeof words, words);
    inst->vk.vkCmdDispatch(r->cb, gx, gy, gz);
    return DSI_OK;
}

dsi_status dsib_vk_copy(dsib_instance *inst, dsib_vk_recorder *r, const dsib_buffer *src,
                        uint64_t so, dsib_buffer *dst, uint64_t dof, uint64_t bytes) {
    if (r->status != DSI_OK) return r->status;
    if (so > src->size || bytes > src->size - so || dof > dst->size || bytes > dst->size - dof)
        return dsib_vk_rec_fail(r, DSI_ERR_INVALID_ARGUMENT, "vulkan: copy out of range");
    dsi_status st = rec_ensure_begun(inst, r);
    if (st != DSI_OK) return st;
    record_barrier(inst, r);
    while (bytes) {
        uint64_t sci = so / src->chunk_size, dci = dof / dst->chunk_size;
        uint64_t sin = so - sci * src->chunk_size, din = dof - dci * dst->chunk_size;
        uint64_t piece = bytes;
        if (piece > src->chunks[sci].size - sin) piece = src->chunks[sci].size - sin;
        if (piece > dst->chunks[dci].size - din) piece = dst->chunks[dci].size - din;
        VkBufferCopy reg = {sin, din, piece};
        inst->vk.vkCmdCopyBuffer(r->cb, src->chunks[sci].buf, dst->chunks[dci].buf, 1, &reg);
        so += piece;
        dof += piece;
        bytes -= piece;
    }
    return DSI_OK;
}

/* ---- instance creation -------------------------------------------------------------------- */

static void vk_destroy(dsib_instance *inst);

static dsi_status vk_create(const dsib_host *host, dsib_instance **out, dsib_error *err) {
    if (!out) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: out is NULL");
    *out = NULL;
    dsib_instance *inst = dsib_vk_malloc(host, sizeof *inst);
    if (!inst) return set_err(err, DSI_ERR_OUT_OF_HOST_MEMORY, "vulkan: out of host memory");
    memset(inst, 0, sizeof *inst);
    if (host) inst->host = *host;
    pthread_mutex_init(&inst->queue_lock, NULL);
    pthread_mutex_init(&inst->rec_lock, NULL);
    pthread_mutex_init(&inst->pipe_lock, NULL);
    pthread_mutex_init(&inst->staging_lock, NULL);
    atomic_init(&inst->mem_used, 0);

    dsi_status st = load_vulkan(&inst->vk, &inst->libvulkan, err);
    if (st == DSI_OK) st = create_vk_instance(inst, env_flag("DSINFER_VULKAN_VALIDATION"), err);
    VkPhysicalDevice pds[16];
    dsib_device_desc descs[16];
    uint32_t vkf[16];
    int32_t n = 0;
    if (st == DSI_OK) st = list_physical(inst, pds, descs, vkf, 16, &n, err);
    if (st != DSI_OK) {
        vk_destroy(inst);
        return st;
    }
    int32_t pick = host ? host->device_index : -1;
    if (pick >= n) {
        vk_destroy(inst);
        return set_err(err, DSI_ERR_INVALID_ARGUMENT,
                       "vulkan: device index %d out of range (%d device(s))", (int)pick, (int)n);
    }
    if (pick < 0) {
        static const int rank[] = {[DSI_DEVICE_DISCRETE_GPU] = 5, [DSI_DEVICE_INTEGRATED_GPU] = 4,
                                   [DSI_DEVICE_VIRTUAL_GPU] = 3, [DSI_DEVICE_SOFTWARE] = 2,
                                   [DSI_DEVICE_OTHER] = 1, [DSI_DEVICE_CPU] = 0};
        pick = 0;
        for (int32_t i = 1; i < n; i++)
            if (rank[descs[i].type] > rank[descs[pick].type]) pick = i;
    }
    inst->phys = pds[pick];
    inst->desc = descs[pick];
    inst->vk_features = vkf[pick];
    /* Only subgroup arithmetic is used by variants so far; it needs no enabling at device
     * creation. DSINFER_VULKAN_BASELINE=1 forces the baseline shaders (tests, debugging). */
    inst->variant_features = env_flag("DSINFER_VULKAN_BASELINE") ? 0 : (inst->vk_features & DSIB_VK_NEED_SUBGROUP_ARITH);
    compute_queue_family(&inst->vk, inst->phys, &inst->queue_family);

    VkPhysicalDeviceProperties p;
    inst->vk.vkGetPhysicalDeviceProperties(inst->phys, &p);
    inst->min_align = p.limits.minStorageBufferOffsetAlignment;
    if (inst->min_align < 4) inst->min_align = 4;
    inst->max_binding = p.limits.maxStorageBufferRange;
    if (inst->max_binding > (1ull << 31)) inst->max_binding = 1ull << 31; /* uint32 offsets */
    uint64_t mb = env_u64("DSINFER_VULKAN_MAX_BINDING");
    if (mb >= 4096 && mb < inst->max_binding) inst->max_binding = mb;
    inst->max_binding &= ~((inst->min_align - 1) | 3);
    inst->chunk_max = inst->desc.max_allocation_size ? inst->desc.max_allocation_size : (1ull << 30);
    if (inst->chunk_max > (1ull << 31)) inst->chunk_max = 1ull << 31;
    uint64_t cm = env_u64("DSINFER_VULKAN_CHUNK");
    if (cm >= 4096 && cm < inst->chunk_max) inst->chunk_max = cm;
    inst->chunk_max &= ~(uint64_t)4095;
    inst->weight_chunk_max = inst->chunk_max;
    uint64_t wcm = env_u64("DSINFER_VULKAN_WEIGHT_CHUNK");
    if (wcm >= 4096 && wcm < inst->weight_chunk_max) inst->weight_chunk_max = wcm & ~(uint64_t)4095;
    inst->subgroup_size = inst->desc.subgroup_size;
    for (int i = 0; i < 3; i++) inst->max_groups[i] = p.limits.maxComputeWorkGroupCount[i];

    VkPhysicalDeviceMemoryProperties mp;
    inst->vk.vkGetPhysicalDeviceMemoryProperties(inst->phys, &mp);
    int mt = find_mem_type(&mp, ~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (mt < 0) mt = find_mem_type(&mp, ~0u, 0, 0);
    inst->mem_type_device = (uint32_t)mt;
    VkMemoryPropertyFlags pf = mp.memoryTypes[mt].propertyFlags;
    inst->device_is_mappable = (pf & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
                               (pf & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    inst->heap_size = mp.memoryHeaps[mp.memoryTypes[mt].heapIndex].size;
    /* Test knob: exercise the staging path on devices whose memory is all mappable. */
    inst->force_staging = env_flag("DSINFER_VULKAN_FORCE_STAGING");
    if (inst->force_staging) inst->device_is_mappable = 0;

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = inst->queue_family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &prio;
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    VkResult vr = inst->vk.vkCreateDevice(inst->phys, &di, NULL, &inst->device);
    if (vr != VK_SUCCESS) {
        vk_destroy(inst);
        return set_err(err, vr == VK_ERROR_OUT_OF_DEVICE_MEMORY ? DSI_ERR_OUT_OF_DEVICE_MEMORY
                                                                : DSI_ERR_BACKEND,
                       "vulkan: vkCreateDevice failed on %s (VkResult %d)", inst->desc.name, (int)vr);
    }
#define LOAD_D(name)                                                                           \
    inst->vk.name = (PFN_##name)inst->vk.vkGetDeviceProcAddr(inst->device, #name);           \
    if (!inst->vk.name) {                                                                      \
        vk_destroy(inst);                                                                      \
        return set_err(err, DSI_ERR_UNSUPPORTED, "vulkan: device lacks %s", #name);            \
    }
    DSIB_VK_DEVICE_FNS(LOAD_D)
#undef LOAD_D
    inst->vk.vkGetDeviceQueue(inst->device, inst->queue_family, 0, &inst->queue);

    VkDescriptorSetLayoutBinding lb[DSIB_VK_MAX_BINDINGS];
    for (uint32_t i = 0; i < DSIB_VK_MAX_BINDINGS; i++) {
        memset(&lb[i], 0, sizeof lb[i]);
        lb[i].binding = i;
        lb[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        lb[i].descriptorCount = 1;
        lb[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    li.bindingCount = DSIB_VK_MAX_BINDINGS;
    li.pBindings = lb;
    VkPushConstantRange pr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, DSIB_VK_PUSH_WORDS * 4};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &inst->dsl;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pr;
    VkPipelineCacheCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    vr = inst->vk.vkCreateDescriptorSetLayout(inst->device, &li, NULL, &inst->dsl);
    if (vr == VK_SUCCESS) vr = inst->vk.vkCreatePipelineLayout(inst->device, &pli, NULL, &inst->layout);
    if (vr == VK_SUCCESS) vr = inst->vk.vkCreatePipelineCache(inst->device, &pci, NULL, &inst->cache);
    inst->pipes = dsib_vk_malloc(&inst->host, dsib_vk_n_shaders * sizeof *inst->pipes + 1);
    if (vr != VK_SUCCESS || !inst->pipes) {
        vk_destroy(inst);
        return set_err(err, DSI_ERR_BACKEND, "vulkan: pipeline layout setup failed");
    }
    memset(inst->pipes, 0, dsib_vk_n_shaders * sizeof *inst->pipes);
    char msg[512];
    st = dsib_vk_buffer_create(inst, 256, DSIB_BUFFER_SCRATCH, &inst->dummy, msg, sizeof msg);
    if (st == DSI_OK && !inst->device_is_mappable) {
        st = dsib_vk_buffer_create(inst, 16u << 20, DSIB_BUFFER_HOST_VISIBLE, &inst->staging, msg,
                                   sizeof msg);
        if (st == DSI_OK && !inst->staging->host_mapped) {
            st = DSI_ERR_UNSUPPORTED;
            snprintf(msg, sizeof msg, "vulkan: no host-visible coherent memory for staging");
        }
        VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
        cpi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
        cpi.queueFamilyIndex = inst->queue_family;
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        cai.commandBufferCount = 1;
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        if (st == DSI_OK &&
            (inst->vk.vkCreateCommandPool(inst->device, &cpi, NULL, &inst->staging_pool) != VK_SUCCESS ||
             (cai.commandPool = inst->staging_pool,
              inst->vk.vkAllocateCommandBuffers(inst->device, &cai, &inst->staging_cb) != VK_SUCCESS) ||
             inst->vk.vkCreateFence(inst->device, &fi, NULL, &inst->staging_fence) != VK_SUCCESS)) {
            st = DSI_ERR_BACKEND;
            snprintf(msg, sizeof msg, "vulkan: staging command setup failed");
        }
    }
    if (st != DSI_OK) {
        vk_destroy(inst);
        return set_err(err, st, "%s", msg);
    }
    dsib_vk_log(&inst->host, DSI_LOG_INFO,
                "vulkan: %s (%s), subgroup %u, binding window %llu MiB, chunk %llu MiB, "
                "features 0x%x%s%s",
                inst->desc.name, inst->desc.type == DSI_DEVICE_SOFTWARE ? "software" : "gpu",
                inst->subgroup_size, (unsigned long long)(inst->max_binding >> 20),
                (unsigned long long)(inst->chunk_max >> 20), inst->desc.features,
                inst->messenger ? ", validation on" : "",
                inst->variant_features ? ", subgroup variants" : ", baseline shaders");
    *out = inst;
    return DSI_OK;
}

static void vk_destroy(dsib_instance *inst) {
    if (!inst) return;
    if (inst->device) {
        inst->vk.vkDeviceWaitIdle(inst->device);
        while (inst->recorders) {
            dsib_vk_recorder *r = inst->recorders;
            inst->recorders = r->next;
            rec_free_temps(inst, r);
            inst->vk.vkDestroyDescriptorPool(inst->device, r->dpool, NULL);
            inst->vk.vkDestroyFence(inst->device, r->fence, NULL);
            inst->vk.vkDestroyCommandPool(inst->device, r->pool, NULL);
            dsib_vk_free(&inst->host, r);
        }
        if (inst->pipes)
            for (size_t i = 0; i < dsib_vk_n_shaders; i++)
                if (inst->pipes[i].pipe) inst->vk.vkDestroyPipeline(inst->device, inst->pipes[i].pipe, NULL);
        if (inst->staging_fence) inst->vk.vkDestroyFence(inst->device, inst->staging_fence, NULL);
        if (inst->staging_pool) inst->vk.vkDestroyCommandPool(inst->device, inst->staging_pool, NULL);
        dsib_vk_buffer_destroy(inst, inst->staging);
        dsib_vk_buffer_destroy(inst, inst->dummy);
        if (inst->cache) inst->vk.vkDestroyPipelineCache(inst->device, inst->cache, NULL);
        if (inst->layout) inst->vk.vkDestroyPipelineLayout(inst->device, inst->layout, NULL);
        if (inst->dsl) inst->vk.vkDestroyDescriptorSetLayout(inst->device, inst->dsl, NULL);
        inst->vk.vkDestroyDevice(inst->device, NULL);
    }
    dsib_vk_free(&inst->host, inst->pipes);
    destroy_vk_instance(inst);
    pthread_mutex_destroy(&inst->queue_lock);
    pthread_mutex_destroy(&inst->rec_lock);
    pthread_mutex_destroy(&inst->pipe_lock);
    pthread_mutex_destroy(&inst->staging_lock);
    dsib_host host = inst->host;
    dsib_vk_free(&host, inst);
}

static dsi_status vk_device(dsib_instance *inst, dsib_device_desc *out) {
    if (!inst || !out) return DSI_ERR_INVALID_ARGUMENT;
    *out = inst->desc;
    out->memory_free = inst->heap_size > atomic_load(&inst->mem_used)
                           ? inst->heap_size - atomic_load(&inst->mem_used)
                           : 0;
    return DSI_OK;
}

/* ---- buffer entry points -------------------------------------------------------------------- */

static dsi_status vk_buffer_alloc(dsib_instance *inst, uint64_t size, uint32_t flags,
                                  dsib_buffer **out, dsib_error *err) {
    if (!inst || !out) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: bad arguments");
    char msg[512];
    dsi_status st = dsib_vk_buffer_create(inst, size, flags, out, msg, sizeof msg);
    if (st != DSI_OK) return set_err(err, st, "%s", msg);
    return DSI_OK;
}

static dsi_status vk_buffer_alloc_rows(dsib_instance *inst, uint64_t size, uint64_t row_bytes,
                                       uint32_t flags, dsib_buffer **out, dsib_error *err) {
    if (!inst || !out) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: bad arguments");
    char msg[512];
    dsi_status st = dsib_vk_buffer_create_rows(inst, size, row_bytes, flags, out, msg, sizeof msg);
    if (st != DSI_OK) return set_err(err, st, "%s", msg);
    return DSI_OK;
}

static void vk_buffer_free(dsib_instance *inst, dsib_buffer *b) {
    if (inst && b) dsib_vk_buffer_destroy(inst, b);
}

/* Copies between host memory and a buffer through the staging buffer (device memory that
 * cannot be mapped). dir 0: host → device, 1: device → host. */
static dsi_status staged(dsib_instance *inst, dsib_buffer *b, uint64_t off, uint8_t *host,
                         uint64_t size, int dir, dsib_error *err) {
    pthread_mutex_lock(&inst->staging_lock);
    dsi_status st = DSI_OK;
    uint64_t cap = inst->staging->size;
    while (size && st == DSI_OK) {
        uint64_t ci = off / b->chunk_size, in = off - ci * b->chunk_size;
        uint64_t piece = size < cap ? size : cap;
        if (piece > b->chunks[ci].size - in) piece = b->chunks[ci].size - in;
        if (dir == 0) memcpy(inst->staging->chunks[0].mapped, host, (size_t)piece);
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        inst->vk.vkBeginCommandBuffer(inst->staging_cb, &bi);
        VkBufferCopy reg = {dir == 0 ? 0 : in, dir == 0 ? in : 0, piece};
        if (dir == 0)
            inst->vk.vkCmdCopyBuffer(inst->staging_cb, inst->staging->chunks[0].buf,
                                     b->chunks[ci].buf, 1, &reg);
        else
            inst->vk.vkCmdCopyBuffer(inst->staging_cb, b->chunks[ci].buf,
                                     inst->staging->chunks[0].buf, 1, &reg);
        inst->vk.vkEndCommandBuffer(inst->staging_cb);
        VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
        si.commandBufferCount = 1;
        si.pCommandBuffers = &inst->staging_cb;
        pthread_mutex_lock(&inst->queue_lock);
        VkResult vr = inst->vk.vkQueueSubmit(inst->queue, 1, &si, inst->staging_fence);
        pthread_mutex_unlock(&inst->queue_lock);
        if (vr == VK_SUCCESS)
            vr = inst->vk.vkWaitForFences(inst->device, 1, &inst->staging_fence, VK_TRUE, UINT64_MAX);
        inst->vk.vkResetFences(inst->device, 1, &inst->staging_fence);
        inst->vk.vkResetCommandPool(inst->device, inst->staging_pool, 0);
        if (vr != VK_SUCCESS) {
            st = set_err(err, DSI_ERR_BACKEND, "vulkan: staging transfer failed (VkResult %d)", (int)vr);
            break;
        }
        if (dir == 1) memcpy(host, inst->staging->chunks[0].mapped, (size_t)piece);
        host += piece;
        off += piece;
        size -= piece;
    }
    pthread_mutex_unlock(&inst->staging_lock);
    return st;
}

dsi_status dsib_vk_upload(dsib_instance *inst, dsib_buffer *dst, uint64_t offset, const void *src,
                          uint64_t size, dsib_error *err) {
    if (!inst || !dst || (!src && size))
        return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: bad upload arguments");
    if (offset > dst->size || size > dst->size - offset)
        return set_err(err, DSI_ERR_INVALID_ARGUMENT,
                       "vulkan: upload of %llu bytes at %llu exceeds the %llu-byte buffer",
                       (unsigned long long)size, (unsigned long long)offset,
                       (unsigned long long)dst->size);
    if (!dst->host_mapped) return staged(inst, dst, offset, (uint8_t *)(uintptr_t)src, size, 0, err);
    const uint8_t *s = src;
    while (size) {
        uint64_t ci = offset / dst->chunk_size, in = offset - ci * dst->chunk_size;
        uint64_t piece = dst->chunks[ci].size - in;
        if (piece > size) piece = size;
        memcpy(dst->chunks[ci].mapped + in, s, (size_t)piece);
        s += piece;
        offset += piece;
        size -= piece;
    }
    return DSI_OK;
}

static dsi_status vk_download(dsib_instance *inst, const dsib_buffer *src, uint64_t offset,
                              void *dst, uint64_t size, dsib_error *err) {
    if (!inst || !src || (!dst && size))
        return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: bad download arguments");
    if (offset > src->size || size > src->size - offset)
        return set_err(err, DSI_ERR_INVALID_ARGUMENT,
                       "vulkan: download of %llu bytes at %llu exceeds the %llu-byte buffer",
                       (unsigned long long)size, (unsigned long long)offset,
                       (unsigned long long)src->size);
    if (!src->host_mapped)
        return staged(inst, (dsib_buffer *)(uintptr_t)src, offset, dst, size, 1, err);
    uint8_t *d = dst;
    while (size) {
        uint64_t ci = offset / src->chunk_size, in = offset - ci * src->chunk_size;
        uint64_t piece = src->chunks[ci].size - in;
        if (piece > size) piece = size;
        memcpy(d, src->chunks[ci].mapped + in, (size_t)piece);
        d += piece;
        offset += piece;
        size -= piece;
    }
    return DSI_OK;
}

static void *vk_host_ptr(dsib_instance *inst, dsib_buffer *b) {
    (void)inst;
    (void)b;
    return NULL; /* device memory is never handed out as a host pointer */
}

/* ---- command stream ------------------------------------------------------------------------- */

static dsi_status vk_begin(dsib_instance *inst, dsib_error *err) {
    dsib_vk_recorder *r = inst ? rec_find(inst, 1) : NULL;
    if (!r) return set_err(err, DSI_ERR_BACKEND, "vulkan: cannot create a command recorder");
    if (r->active && r->has_cmds) {
        /* begin twice: keep what was recorded (it runs at the next submit). */
        return DSI_OK;
    }
    r->active = 1;
    r->status = DSI_OK;
    r->msg[0] = 0;
    return DSI_OK;
}

static dsi_status vk_submit(dsib_instance *inst, dsib_error *err) {
    dsib_vk_recorder *r = inst ? rec_find(inst, 0) : NULL;
    if (!r || !r->active) return DSI_OK; /* nothing recorded on this thread */
    rec_flush(inst, r, 1);
    r->active = 0;
    if (r->status != DSI_OK) return set_err(err, r->status, "%s", r->msg);
    return DSI_OK;
}

static uint64_t vk_memory_used(dsib_instance *inst) {
    return inst ? atomic_load(&inst->mem_used) : 0;
}

static const dsib_backend vk_backend = {
    .struct_size = sizeof(dsib_backend),
    .api_version = DSIB_API_VERSION,
    .name = "vulkan",
    .enumerate = vk_enumerate,
    .create = vk_create,
    .destroy = vk_destroy,
    .device = vk_device,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_alloc_rows = vk_buffer_alloc_rows,
    .buffer_wrap_host = NULL,
    .buffer_free = vk_buffer_free,
    .upload = dsib_vk_upload,
    .download = vk_download,
    .buffer_host_ptr = vk_host_ptr,
    .begin = vk_begin,
    .submit = vk_submit,
    .memory_used = vk_memory_used,
    .ops = &dsib_vk_ops,
};

DSIB_VK_EXPORT const dsib_backend *dsi_backend_module_entry(void) { return &vk_backend; }
