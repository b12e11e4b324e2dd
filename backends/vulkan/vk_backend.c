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
#include "backends/rope.h"

#include <dlfcn.h>
#include <math.h>
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
            atomic_fetch_sub(c->in_host ? &inst->host_mem_used : &inst->mem_used, c->size);
        }
    }
}

/* Zeroes a new buffer: mapped chunks by memset, others with vkCmdFillBuffer on the staging
 * command buffer (it exists exactly when device memory is not mappable). */
static void zero_fill(dsib_instance *inst, dsib_buffer *b) {
    if (b->host_mapped) {
        for (uint32_t i = 0; i < b->n_chunks; i++) memset(b->chunks[i].mapped, 0, (size_t)b->chunks[i].size);
        return;
    }
    if (!inst->staging_cb) return;
    pthread_mutex_lock(&inst->staging_lock);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    inst->vk.vkBeginCommandBuffer(inst->staging_cb, &bi);
    for (uint32_t i = 0; i < b->n_chunks; i++)
        inst->vk.vkCmdFillBuffer(inst->staging_cb, b->chunks[i].buf, 0, VK_WHOLE_SIZE, 0);
    inst->vk.vkEndCommandBuffer(inst->staging_cb);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &inst->staging_cb;
    pthread_mutex_lock(&inst->queue_lock);
    VkResult vr = inst->vk.vkQueueSubmit(inst->queue, 1, &si, inst->staging_fence);
    pthread_mutex_unlock(&inst->queue_lock);
    if (vr == VK_SUCCESS) inst->vk.vkWaitForFences(inst->device, 1, &inst->staging_fence, VK_TRUE, UINT64_MAX);
    inst->vk.vkResetFences(inst->device, 1, &inst->staging_fence);
    inst->vk.vkResetCommandPool(inst->device, inst->staging_pool, 0);
    pthread_mutex_unlock(&inst->staging_lock);
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
    /* offloaded state: a host-visible type outside the device-local heaps (system RAM the
     * device reads over the bus), where the device has one; else the usual memory */
    int hostmem = (flags & DSIB_BUFFER_HOST_MEMORY) != 0 && inst->mem_type_offload >= 0;
    uint64_t used = atomic_load(&inst->mem_used);
    if (!hostmem && inst->heap_size && used + size > inst->heap_size) {
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
        if (hostmem && (req.memoryTypeBits & (1u << inst->mem_type_offload)))
            mt = inst->mem_type_offload, c->in_host = 1;
        else if (host)
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
        atomic_fetch_add(c->in_host ? &inst->host_mem_used : &inst->mem_used, c->size);
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
    /* everything but weights (uploaded right away) starts zeroed (backend.h) */
    if (!(flags & DSIB_BUFFER_WEIGHTS)) zero_fill(inst, b);
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

/* ---- recording targets, streams, graphs, events ------------------------------------------- */

#define DSIB_VK_SETS_PER_POOL 512

static void rec_fini(dsib_instance *inst, dsib_vk_rec *r) {
    while (r->dpools) {
        dsib_vk_dpool *d = r->dpools;
        r->dpools = d->next;
        inst->vk.vkDestroyDescriptorPool(inst->device, d->pool, NULL);
        dsib_vk_free(&inst->host, d);
    }
    if (r->pool) inst->vk.vkDestroyCommandPool(inst->device, r->pool, NULL);
    memset(r, 0, sizeof *r);
}

static int rec_init(dsib_instance *inst, dsib_vk_rec *r, int reusable) {
    memset(r, 0, sizeof *r);
    r->inst = inst;
    r->reusable = reusable;
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = reusable ? 0 : VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pi.queueFamilyIndex = inst->queue_family;
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    if (inst->vk.vkCreateCommandPool(inst->device, &pi, NULL, &r->pool) != VK_SUCCESS) {
        r->pool = VK_NULL_HANDLE;
        return 0;
    }
    ai.commandPool = r->pool;
    if (inst->vk.vkAllocateCommandBuffers(inst->device, &ai, &r->cb) != VK_SUCCESS) {
        rec_fini(inst, r);
        return 0;
    }
    return 1;
}

/* Resets a target whose recorded work has completed (or was never submitted). */
static void rec_reset(dsib_instance *inst, dsib_vk_rec *r) {
    if (r->has_cmds && !r->ended) inst->vk.vkEndCommandBuffer(r->cb);
    inst->vk.vkResetCommandPool(inst->device, r->pool, 0);
    for (dsib_vk_dpool *d = r->dpools; d; d = d->next) {
        inst->vk.vkResetDescriptorPool(inst->device, d->pool, 0);
        d->used = 0;
    }
    r->has_cmds = 0;
    r->ended = 0;
    r->status = DSI_OK;
    r->msg[0] = 0;
}

static dsi_status rec_begin(dsib_vk_rec *r) {
    dsib_instance *inst = r->inst;
    if (r->has_cmds) return DSI_OK;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = r->reusable ? 0 : VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (inst->vk.vkBeginCommandBuffer(r->cb, &bi) != VK_SUCCESS)
        return dsib_vk_rec_fail(r, DSI_ERR_BACKEND, "vulkan: vkBeginCommandBuffer failed");
    r->has_cmds = 1;
    return DSI_OK;
}

dsi_status dsib_vk_rec_fail(dsib_vk_rec *r, dsi_status st, const char *fmt, ...) {
    if (r && r->status == DSI_OK) {
        r->status = st;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* A descriptor set from the target's pools (a new pool when they are full: recording never
 * has to stop in the middle of a step). */
static VkDescriptorSet rec_set(dsib_vk_rec *r) {
    dsib_instance *inst = r->inst;
    dsib_vk_dpool *d = r->dpools;
    while (d && d->used >= DSIB_VK_SETS_PER_POOL) d = d->next;
    if (!d) {
        d = dsib_vk_malloc(&inst->host, sizeof *d);
        if (!d) return VK_NULL_HANDLE;
        memset(d, 0, sizeof *d);
        VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                   DSIB_VK_SETS_PER_POOL * DSIB_VK_MAX_BINDINGS};
        VkDescriptorPoolCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
        di.maxSets = DSIB_VK_SETS_PER_POOL;
        di.poolSizeCount = 1;
        di.pPoolSizes = &ps;
        if (inst->vk.vkCreateDescriptorPool(inst->device, &di, NULL, &d->pool) != VK_SUCCESS) {
            dsib_vk_free(&inst->host, d);
            return VK_NULL_HANDLE;
        }
        d->next = r->dpools;
        r->dpools = d;
    }
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = d->pool;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &inst->dsl;
    VkDescriptorSet set;
    if (inst->vk.vkAllocateDescriptorSets(inst->device, &ai, &set) != VK_SUCCESS) return VK_NULL_HANDLE;
    d->used++;
    return set;
}

static dsi_status vk_result_status(VkResult vr) {
    return vr == VK_ERROR_OUT_OF_DEVICE_MEMORY ? DSI_ERR_OUT_OF_DEVICE_MEMORY
           : vr == VK_ERROR_OUT_OF_HOST_MEMORY ? DSI_ERR_OUT_OF_HOST_MEMORY
                                                : DSI_ERR_BACKEND;
}

/* Records the first failure on the stream (reported by sync). Called with s->lock held. */
static void stream_note(dsib_stream *s, dsi_status st, const char *msg) {
    if (st != DSI_OK && s->status == DSI_OK) {
        s->status = st;
        snprintf(s->msg, sizeof s->msg, "%s", msg);
    }
}

/* Waits for frame f's submission and resets it. Called with s->lock held. */
static void frame_retire(dsib_stream *s, dsib_vk_frame *f) {
    dsib_instance *inst = s->inst;
    if (f->submitted) {
        VkResult vr = inst->vk.vkWaitForFences(inst->device, 1, &f->fence, VK_TRUE, UINT64_MAX);
        inst->vk.vkResetFences(inst->device, 1, &f->fence);
        if (vr != VK_SUCCESS)
            stream_note(s, vk_result_status(vr), "vulkan: waiting for a submission failed");
        f->submitted = 0;
        if (f->graph) f->graph->in_flight = 0;
        f->graph = NULL;
        if (f->serial > s->done_serial) s->done_serial = f->serial;
    }
    stream_note(s, f->rec.status, f->rec.msg);
    rec_reset(inst, &f->rec);
}

/* Submits `cb` with frame f's fence. Called with s->lock held. */
static dsi_status frame_submit(dsib_stream *s, dsib_vk_frame *f, VkCommandBuffer cb) {
    dsib_instance *inst = s->inst;
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    pthread_mutex_lock(&inst->queue_lock);
    VkResult vr = inst->vk.vkQueueSubmit(inst->queue, 1, &si, f->fence);
    pthread_mutex_unlock(&inst->queue_lock);
    if (vr != VK_SUCCESS) {
        stream_note(s, vk_result_status(vr), "vulkan: vkQueueSubmit failed");
        return vk_result_status(vr);
    }
    f->submitted = 1;
    f->serial = ++s->serial;
    return DSI_OK;
}

/* The frame the stream records into next (waiting for its previous submission). */
static dsib_vk_frame *frame_cur(dsib_stream *s) {
    dsib_vk_frame *f = &s->frames[s->cur];
    if (f->submitted) frame_retire(s, f);
    return f;
}

/* Submits the current frame's recorded work, if any. Called with s->lock held. */
static dsi_status stream_flush(dsib_stream *s) {
    dsib_instance *inst = s->inst;
    dsib_vk_frame *f = &s->frames[s->cur];
    if (f->submitted || !f->rec.has_cmds) return DSI_OK;
    VkResult vr = inst->vk.vkEndCommandBuffer(f->rec.cb);
    f->rec.ended = 1;
    if (vr != VK_SUCCESS) {
        stream_note(s, vk_result_status(vr), "vulkan: vkEndCommandBuffer failed");
        rec_reset(inst, &f->rec);
        return vk_result_status(vr);
    }
    dsi_status st = frame_submit(s, f, f->rec.cb);
    if (st != DSI_OK) {
        rec_reset(inst, &f->rec);
        return st;
    }
    s->cur = (s->cur + 1) % DSIB_VK_FRAMES;
    return DSI_OK;
}

dsib_vk_rec *dsib_vk_stream_rec(dsib_stream *s) {
    if (s->capturing) return &s->capturing->rec;
    pthread_mutex_lock(&s->lock);
    dsib_vk_frame *f = frame_cur(s);
    pthread_mutex_unlock(&s->lock);
    return &f->rec;
}

static void record_barrier(dsib_instance *inst, dsib_vk_rec *r) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                       VK_ACCESS_HOST_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    inst->vk.vkCmdPipelineBarrier(r->cb,
                                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                                      VK_PIPELINE_STAGE_HOST_BIT,
                                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                                  0, 1, &mb, 0, NULL, 0, NULL);
}

/* Makes host reads of host-visible buffers see everything recorded so far (the end of a
 * step that writes its results into a host-visible buffer). */
static void record_host_barrier(dsib_instance *inst, dsib_vk_rec *r) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    inst->vk.vkCmdPipelineBarrier(r->cb,
                                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                                  VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

dsi_status dsib_vk_dispatch(dsib_instance *inst, dsib_vk_rec *r, uint32_t si,
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
    dsi_status st = rec_begin(r);
    if (st != DSI_OK) return st;
    VkDescriptorSet set = rec_set(r);
    if (!set) return dsib_vk_rec_fail(r, DSI_ERR_BACKEND, "vulkan: descriptor set allocation failed");
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

dsi_status dsib_vk_copy(dsib_instance *inst, dsib_vk_rec *r, const dsib_buffer *src,
                        uint64_t so, dsib_buffer *dst, uint64_t dof, uint64_t bytes) {
    if (r->status != DSI_OK) return r->status;
    if (so > src->size || bytes > src->size - so || dof > dst->size || bytes > dst->size - dof)
        return dsib_vk_rec_fail(r, DSI_ERR_INVALID_ARGUMENT, "vulkan: copy out of range");
    dsi_status st = rec_begin(r);
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

/* Workspace (device) views handed to ops. */
dsib_buffer *dsib_vk_stream_ws(dsib_stream *s, uint64_t need) {
    return s->ws && need <= s->ws->size ? s->ws : NULL;
}

/* Workspace of a stream: the largest of the ops' temporaries for shapes up to `d` (words
 * aligned per piece: the ops bind several pieces of it). */
static uint64_t vk_workspace_bytes(const dsib_instance *inst, const dsib_stream_desc *d) {
    uint64_t a = inst->min_align > 256 ? inst->min_align : 256;
    uint64_t P = (uint64_t)d->max_positions + 2, n = d->max_rows;
    uint64_t idx = n * 4 * P * 4 + a;                                /* indexer scratch */
    uint64_t nr = n * d->max_experts_used, W = d->max_width;
    uint64_t moe = 3 * (nr * W * 4 + a);                             /* G, U, Z */
    uint64_t need = idx > moe ? idx : moe;
    return need > 256 ? need : 256;
}

static void vk_stream_destroy(dsib_stream *s) {
    if (!s) return;
    dsib_instance *inst = s->inst;
    pthread_mutex_lock(&s->lock);
    stream_flush(s);
    for (int i = 0; i < DSIB_VK_FRAMES; i++)
        if (s->frames[i].submitted) frame_retire(s, &s->frames[i]);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < DSIB_VK_FRAMES; i++) {
        rec_fini(inst, &s->frames[i].rec);
        if (s->frames[i].fence) inst->vk.vkDestroyFence(inst->device, s->frames[i].fence, NULL);
    }
    dsib_vk_buffer_destroy(inst, s->ws);
    pthread_mutex_destroy(&s->lock);
    dsib_vk_free(&inst->host, s);
}

static dsi_status vk_stream_create(dsib_instance *inst, const dsib_stream_desc *desc,
                                   dsib_stream **out, dsib_error *err) {
    *out = NULL;
    dsib_stream *s = dsib_vk_malloc(&inst->host, sizeof *s);
    if (!s) return set_err(err, DSI_ERR_OUT_OF_HOST_MEMORY, "vulkan: out of host memory (stream)");
    memset(s, 0, sizeof *s);
    s->inst = inst;
    if (desc) {
        size_t n = desc->struct_size < sizeof s->desc ? desc->struct_size : sizeof s->desc;
        memcpy(&s->desc, desc, n);
    }
    s->desc.struct_size = sizeof s->desc;
    pthread_mutex_init(&s->lock, NULL);
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    int ok = 1;
    for (int i = 0; i < DSIB_VK_FRAMES && ok; i++) {
        ok = rec_init(inst, &s->frames[i].rec, 0);
        if (ok && inst->vk.vkCreateFence(inst->device, &fi, NULL, &s->frames[i].fence) != VK_SUCCESS) {
            s->frames[i].fence = VK_NULL_HANDLE;
            ok = 0;
        }
    }
    char msg[512] = "vulkan: cannot create a command stream";
    dsi_status st = ok ? DSI_OK : DSI_ERR_BACKEND;
    if (st == DSI_OK)
        st = dsib_vk_buffer_create(inst, vk_workspace_bytes(inst, &s->desc), DSIB_BUFFER_SCRATCH,
                                   &s->ws, msg, sizeof msg);
    if (st != DSI_OK) {
        s->ws = NULL;
        vk_stream_destroy(s);
        return set_err(err, st, "%s", msg);
    }
    *out = s;
    return DSI_OK;
}

static dsi_status vk_submit(dsib_stream *s, dsib_error *err) {
    if (s->capturing) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: submit while capturing");
    pthread_mutex_lock(&s->lock);
    dsib_vk_frame *f = &s->frames[s->cur];
    if (f->rec.has_cmds && !f->submitted) record_host_barrier(s->inst, &f->rec);
    dsi_status st = f->rec.status == DSI_OK ? stream_flush(s) : DSI_OK;
    if (f->rec.status != DSI_OK) frame_retire(s, f); /* an op failed: drop the recording */
    pthread_mutex_unlock(&s->lock);
    if (st != DSI_OK) return set_err(err, st, "%s", s->msg);
    return DSI_OK;
}

static dsi_status vk_sync(dsib_stream *s, dsib_error *err) {
    if (s->capturing) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: sync while capturing");
    vk_submit(s, NULL);
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < DSIB_VK_FRAMES; i++) {
        dsib_vk_frame *f = &s->frames[(s->cur + i) % DSIB_VK_FRAMES];
        if (f->submitted || f->rec.status != DSI_OK) frame_retire(s, f);
    }
    dsi_status st = s->status;
    if (st != DSI_OK) set_err(err, st, "%s", s->msg);
    s->status = DSI_OK;
    s->msg[0] = 0;
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- events: a stream and a submission serial ----------------------------------------------- */

static dsi_status vk_event_create(dsib_instance *inst, dsib_event **out, dsib_error *err) {
    *out = dsib_vk_malloc(&inst->host, sizeof **out);
    if (!*out) return set_err(err, DSI_ERR_OUT_OF_HOST_MEMORY, "vulkan: out of host memory (event)");
    memset(*out, 0, sizeof **out);
    return DSI_OK;
}

static void vk_event_destroy(dsib_instance *inst, dsib_event *ev) { dsib_vk_free(&inst->host, ev); }

static dsi_status vk_event_record(dsib_stream *s, dsib_event *ev, dsib_error *err) {
    if (s->capturing) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: event while capturing");
    dsi_status st = vk_submit(s, err);
    pthread_mutex_lock(&s->lock);
    ev->s = s;
    ev->serial = s->serial; /* everything submitted so far */
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* One queue, and every recorded command starts with a full barrier whose first scope is all
 * earlier work in submission order — so work submitted after the event's submission waits
 * for it. The event's work was submitted when it was recorded. */
static dsi_status vk_stream_wait(dsib_stream *s, dsib_event *ev, dsib_error *err) {
    (void)s;
    (void)ev;
    (void)err;
    return DSI_OK;
}

static dsi_status event_state(dsib_event *ev, int wait) {
    dsib_stream *s = ev->s;
    if (!s) return DSI_OK;
    dsib_instance *inst = s->inst;
    pthread_mutex_lock(&s->lock);
    dsi_status st = DSI_OK;
    if (ev->serial > s->done_serial) {
        for (int i = 0; i < DSIB_VK_FRAMES; i++) {
            dsib_vk_frame *f = &s->frames[i];
            if (!f->submitted || f->serial > ev->serial) continue;
            if (wait) {
                frame_retire(s, f);
            } else {
                VkResult vr = inst->vk.vkGetFenceStatus(inst->device, f->fence);
                if (vr == VK_NOT_READY) st = DSI_ERR_BUSY;
                else if (vr != VK_SUCCESS) st = vk_result_status(vr);
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static dsi_status vk_event_query(dsib_instance *inst, dsib_event *ev) {
    (void)inst;
    return event_state(ev, 0);
}

static dsi_status vk_event_sync(dsib_instance *inst, dsib_event *ev, dsib_error *err) {
    (void)inst;
    dsi_status st = event_state(ev, 1);
    if (st != DSI_OK) set_err(err, st, "vulkan: event wait failed");
    return st;
}

/* ---- capture / replay: reusable command buffers ---------------------------------------------- */

static dsi_status vk_capture_begin(dsib_stream *s, dsib_error *err) {
    dsib_instance *inst = s->inst;
    if (s->capturing) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: already capturing");
    dsib_graph *g = dsib_vk_malloc(&inst->host, sizeof *g);
    if (!g) return set_err(err, DSI_ERR_OUT_OF_HOST_MEMORY, "vulkan: out of host memory (graph)");
    memset(g, 0, sizeof *g);
    g->inst = inst;
    if (!rec_init(inst, &g->rec, 1)) {
        dsib_vk_free(&inst->host, g);
        return set_err(err, DSI_ERR_BACKEND, "vulkan: cannot create a command buffer for capture");
    }
    s->capturing = g;
    return DSI_OK;
}

static void vk_graph_destroy(dsib_instance *inst, dsib_graph *g) {
    if (!g) return;
    rec_fini(inst, &g->rec);
    dsib_vk_free(&inst->host, g);
}

static dsi_status vk_capture_end(dsib_stream *s, dsib_graph **out, dsib_error *err) {
    dsib_instance *inst = s->inst;
    *out = NULL;
    dsib_graph *g = s->capturing;
    if (!g) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: not capturing");
    s->capturing = NULL;
    dsi_status st = g->rec.status;
    if (st == DSI_OK && rec_begin(&g->rec) == DSI_OK) {
        record_host_barrier(inst, &g->rec);
        if (inst->vk.vkEndCommandBuffer(g->rec.cb) != VK_SUCCESS)
            dsib_vk_rec_fail(&g->rec, DSI_ERR_BACKEND, "vulkan: vkEndCommandBuffer failed");
        g->rec.ended = 1;
    }
    st = g->rec.status;
    if (st != DSI_OK) {
        set_err(err, st, "%s", g->rec.msg);
        vk_graph_destroy(inst, g);
        return st;
    }
    *out = g;
    return DSI_OK;
}

static dsi_status vk_graph_launch(dsib_stream *s, dsib_graph *g, dsib_error *err) {
    if (s->capturing) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: launch while capturing");
    if (!g || g->inst != s->inst) return set_err(err, DSI_ERR_INVALID_ARGUMENT, "vulkan: bad graph");
    if (g->in_flight) return set_err(err, DSI_ERR_BUSY, "vulkan: the graph's previous launch is still running");
    pthread_mutex_lock(&s->lock);
    dsi_status st = stream_flush(s); /* earlier work first, in submission order */
    dsib_vk_frame *f = frame_cur(s);
    if (st == DSI_OK) st = frame_submit(s, f, g->rec.cb);
    if (st == DSI_OK) {
        f->graph = g;
        g->in_flight = 1;
        s->cur = (s->cur + 1) % DSIB_VK_FRAMES;
    }
    pthread_mutex_unlock(&s->lock);
    if (st != DSI_OK) return set_err(err, st, "vulkan: graph launch failed");
    return DSI_OK;
}

/* ---- rope tables ------------------------------------------------------------------------- */

static int rope_same(const dsib_rope *a, const dsib_rope *b) {
    return a->freq_base == b->freq_base && a->yarn_factor == b->yarn_factor &&
           a->yarn_orig_ctx == b->yarn_orig_ctx && a->yarn_beta_fast == b->yarn_beta_fast &&
           a->yarn_beta_slow == b->yarn_beta_slow && a->n_rot == b->n_rot;
}

/* Positions are split in three 10-bit digits; level l, digit j holds cos/sin of
 * j·2^(10·l)·f_i in double precision (rope.comp multiplies the three). A one-time constant
 * per instance and config, built outside any step. */
dsi_status dsib_vk_rope_table(dsib_instance *inst, const dsib_rope *rope, dsib_buffer **out,
                              char *msg, size_t cap) {
    *out = NULL;
    pthread_mutex_lock(&inst->rope_lock);
    for (uint32_t i = 0; i < inst->n_ropes; i++)
        if (rope_same(&inst->ropes[i].key, rope)) {
            *out = inst->ropes[i].buf;
            pthread_mutex_unlock(&inst->rope_lock);
            return DSI_OK;
        }
    dsi_status st = DSI_OK;
    if (inst->n_ropes >= DSIB_VK_ROPE_TABLES) {
        snprintf(msg, cap, "vulkan rope_tail: too many RoPE configurations");
        st = DSI_ERR_UNSUPPORTED;
    }
    uint32_t half = (uint32_t)rope->n_rot / 2;
    size_t bytes = (size_t)3 * 1024 * half * 2 * sizeof(float);
    float *tab = st == DSI_OK ? dsib_vk_malloc(&inst->host, bytes) : NULL;
    if (st == DSI_OK && !tab) {
        snprintf(msg, cap, "vulkan rope_tail: out of host memory");
        st = DSI_ERR_OUT_OF_HOST_MEMORY;
    }
    dsib_buffer *buf = NULL;
    if (st == DSI_OK) {
        double f[256];
        dsib_rope_freqs(rope, f);
        for (uint32_t l = 0; l < 3; l++)
            for (uint32_t j = 0; j < 1024; j++)
                for (uint32_t i = 0; i < half; i++) {
                    double th = (double)j * ldexp(1.0, 10 * (int)l) * f[i];
                    tab[((l * 1024 + j) * half + i) * 2] = (float)cos(th);
                    tab[((l * 1024 + j) * half + i) * 2 + 1] = (float)sin(th);
                }
        st = dsib_vk_buffer_create(inst, bytes, DSIB_BUFFER_SCRATCH, &buf, msg, cap);
        dsib_error e;
        if (st == DSI_OK) st = dsib_vk_upload(inst, buf, 0, tab, bytes, &e);
        if (st != DSI_OK && buf) {
            snprintf(msg, cap, "vulkan rope_tail: table upload failed");
            dsib_vk_buffer_destroy(inst, buf);
            buf = NULL;
        }
    }
    dsib_vk_free(&inst->host, tab);
    if (st == DSI_OK) {
        inst->ropes[inst->n_ropes].key = *rope;
        inst->ropes[inst->n_ropes].buf = buf;
        inst->n_ropes++;
        *out = buf;
    }
    pthread_mutex_unlock(&inst->rope_lock);
    return st;
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
    pthread_mutex_init(&inst->rope_lock, NULL);
    pthread_mutex_init(&inst->pipe_lock, NULL);
    pthread_mutex_init(&inst->staging_lock, NULL);
    atomic_init(&inst->mem_used, 0);
    atomic_init(&inst->host_mem_used, 0);

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
    /* CPU implementations (lavapipe) run a work group's SIMD slices as coroutines that every
     * barrier() suspends, divergent code under masks: there the matmul and the attention use
     * their NARROW variants (one subgroup per group, no barrier; matmul.comp, attn_sink.comp),
     * 4x prefill and 2.7x decode on tiny-v41 (docs/vulkan.md).
     * DSINFER_VULKAN_NO_NARROW=1 keeps the GPU variants (tests of those on lavapipe). */
    if ((inst->variant_features & DSIB_VK_NEED_SUBGROUP_ARITH) && inst->desc.type == DSI_DEVICE_SOFTWARE &&
        inst->desc.subgroup_size >= 8 && !env_flag("DSINFER_VULKAN_NO_NARROW"))
        inst->variant_features |= DSIB_VK_NEED_NARROW;
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
    /* host RAM the device can read (DSIB_BUFFER_HOST_MEMORY): a host-visible, coherent type
     * of a heap that is not device-local (none on integrated and software devices) */
    inst->mem_type_offload = -1;
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
        if ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) &&
            !(mp.memoryHeaps[mp.memoryTypes[i].heapIndex].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) {
            inst->mem_type_offload = (int)i;
            break;
        }
    }
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
                (inst->variant_features & DSIB_VK_NEED_NARROW) ? ", narrow variants"
                : inst->variant_features ? ", subgroup variants" : ", baseline shaders");
    *out = inst;
    return DSI_OK;
}

static void vk_destroy(dsib_instance *inst) {
    if (!inst) return;
    if (inst->device) {
        inst->vk.vkDeviceWaitIdle(inst->device);
        for (uint32_t i = 0; i < inst->n_ropes; i++) dsib_vk_buffer_destroy(inst, inst->ropes[i].buf);
        inst->n_ropes = 0;
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
    pthread_mutex_destroy(&inst->rope_lock);
    pthread_mutex_destroy(&inst->pipe_lock);
    pthread_mutex_destroy(&inst->staging_lock);
    dsib_host host = inst->host;
    dsib_vk_free(&host, inst);
}

static dsi_status vk_device(dsib_instance *inst, dsib_device_desc *out) {
    if (!inst || !out) return DSI_ERR_INVALID_ARGUMENT;
    *out = inst->desc;
    /* the limits this instance works with (DSINFER_VULKAN_MAX_BINDING / _CHUNK shrink them):
     * the largest binding window, and the allocation chunk no binding crosses (the state
     * pool keeps every component region inside one buffer of at most both, lib/kv) */
    out->max_buffer_size = inst->max_binding;
    out->max_allocation_size = inst->chunk_max;
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
    /* only host-visible buffers are handed out (one mapped chunk) */
    if (!b || !(b->flags & DSIB_BUFFER_HOST_VISIBLE) || !b->host_mapped || b->n_chunks != 1)
        return NULL;
    return b->chunks[0].mapped;
}

static uint64_t vk_memory_used(dsib_instance *inst) {
    return inst ? atomic_load(&inst->mem_used) : 0;
}

static int32_t vk_supports_op(dsib_instance *inst, uint32_t op, int32_t type);

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
    .buffer_host_ptr = vk_host_ptr,
    .upload = dsib_vk_upload,
    .download = vk_download,
    .memory_used = vk_memory_used,
    .stream_create = vk_stream_create,
    .stream_destroy = vk_stream_destroy,
    .submit = vk_submit,
    .sync = vk_sync,
    .event_create = vk_event_create,
    .event_destroy = vk_event_destroy,
    .event_record = vk_event_record,
    .stream_wait = vk_stream_wait,
    .event_query = vk_event_query,
    .event_sync = vk_event_sync,
    .capture_begin = vk_capture_begin,
    .capture_end = vk_capture_end,
    .graph_launch = vk_graph_launch,
    .graph_destroy = vk_graph_destroy,
    .supports_op = vk_supports_op,
    .ops = &dsib_vk_ops,
};

/* Weight types with a matmul shader (vk_ops.c); every op exists. */
int dsib_vk_type_has_matmul(int32_t type);
static int32_t vk_supports_op(dsib_instance *inst, uint32_t op, int32_t type) {
    (void)inst;
    if (type < 0) return 1;
    switch (op) {
    case DSIB_OP_MATMUL:
    case DSIB_OP_MATMUL_GROUPED:
    case DSIB_OP_GET_ROWS:
    case DSIB_OP_MOE_EXPERTS: return dsib_vk_type_has_matmul(type);
    default: return 1;
    }
}

DSIB_VK_EXPORT const dsib_backend *dsi_backend_module_entry(void) { return &vk_backend; }
