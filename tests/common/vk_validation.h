/*
 * Reading the Vulkan module's validation counters from a test (docs/vulkan.md: with
 * DSINFER_VULKAN_VALIDATION=1 the module enables VK_LAYER_KHRONOS_validation and counts the
 * messages it reports, exported as dsib_vulkan_debug_stats). Every Vulkan test calls
 * dsit_vk_validation_check() while one of its Vulkan contexts is still open (the counters
 * live in the loaded module); scripts/test-all.sh runs the `backend` label again with the
 * variable set. Header only; the caller links dsinfer_static (the module loader).
 */
#ifndef DSI_TEST_VK_VALIDATION_H
#define DSI_TEST_VK_VALIDATION_H

#include "backend/registry.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mirror of dsib_vk_debug_stats (backends/vulkan/vk_impl.h; appended fields only). */
typedef struct dsit_vk_stats {
    uint32_t struct_size;
    uint32_t validation_enabled;
    uint64_t validation_errors;
    uint64_t validation_warnings;
    char last_error[512];
} dsit_vk_stats;

static inline int dsit_vk_validation_requested(void) {
    const char *v = getenv("DSINFER_VULKAN_VALIDATION");
    return v && strcmp(v, "1") == 0;
}

/* The counters of the module loaded as `dl`; 0 on success, -1 if it exports none. */
static inline int dsit_vk_stats_of(void *dl, dsit_vk_stats *out) {
    memset(out, 0, sizeof *out);
    void *sym = dl ? dlsym(dl, "dsib_vulkan_debug_stats") : NULL;
    if (!sym) return -1;
    void (*fn)(dsit_vk_stats *);
    memcpy(&fn, &sym, sizeof fn);
    fn(out);
    return 0;
}

/* With DSINFER_VULKAN_VALIDATION=1: the layer must be active and have counted no error in
 * this process so far. Returns 0 (fine, or not requested) or 1 (printed). */
static inline int dsit_vk_validation_check(const char *who) {
    if (!dsit_vk_validation_requested()) return 0;
    const dsib_backend *be = NULL;
    void *dl = NULL;
    dsii_error e;
    dsii_error_clear(&e);
    if (dsii_backend_module_load(NULL, "vulkan", &be, &dl, NULL, 0, &e) != DSI_OK) {
        printf("FAIL %s: validation requested but the Vulkan module does not load: %s\n", who,
               e.msg);
        return 1;
    }
    dsit_vk_stats st;
    int rc = dsit_vk_stats_of(dl, &st);
    dsii_backend_module_unload(dl);
    printf("  %s: validation enabled %u, errors %llu, warnings %llu%s%s\n", who,
           st.validation_enabled, (unsigned long long)st.validation_errors,
           (unsigned long long)st.validation_warnings, st.last_error[0] ? ", last: " : "",
           st.last_error);
    if (rc != 0 || !st.validation_enabled || st.validation_errors != 0) {
        printf("FAIL %s: the validation layer was %s\n", who,
               rc != 0 ? "unreadable (no dsib_vulkan_debug_stats)"
               : !st.validation_enabled ? "not active" : "reporting errors");
        return 1;
    }
    return 0;
}

#endif
