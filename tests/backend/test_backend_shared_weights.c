/* GPU backends hold one device copy of each weight per model: dsi_model_load uploads the
 * weights, sessions allocate only their state slots and step buffers, the copies outlive
 * sessions and go with the model (as does the state pool, whose slots later sessions reuse).
 * Runs on the Vulkan module (lavapipe in CI); skips (77, tests/common/skip.h) without a
 * Vulkan device unless DSI_REQUIRE_VULKAN=1, without the tiny model unless
 * DSI_REQUIRE_MODELS=1. A model that does not load is a failure. With
 * DSINFER_VULKAN_VALIDATION=1 the validation layer must have counted no error. */
#define _POSIX_C_SOURCE 200809L
#include "backend/registry.h"
#include "base/context_impl.h"
#include "model/model.h"
#include "backend/device.h"
#include "tests/common/skip.h"
#include "tests/common/vk_validation.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                       \
            failures++;                                                               \
        }                                                                             \
    } while (0)

static uint64_t used(dsi_context *ctx) {
    dsii_device *d = dsii_context_compute(ctx);
    return d->be->memory_used(d->inst);
}

int main(void) {
    const char *dir = getenv("DSI_MODELS_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-v41.gguf", dir ? dir : "models");
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "vulkan";
    o.n_threads = 2;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&o, &ctx) != DSI_OK)
        return dsit_absent("VULKAN", "no Vulkan device: %s", dsi_last_error());
    if (access(path, R_OK) != 0) {
        dsi_context_free(ctx);
        return dsit_absent("MODELS", "%s not built ($DSI_MODELS_DIR)", path);
    }
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, path, NULL, &m) != DSI_OK) {
        printf("FAIL: cannot load %s on vulkan: %s\n", path, dsi_last_error());
        dsi_context_free(ctx);
        return 1;
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 256;
    const dsi_token toks[] = {5, 17, 300, 42, 9, 100, 7, 64};
    const size_t nt = sizeof toks / sizeof toks[0];
    /* warm-up: a first step builds the instance's constant tables (RoPE), which stay with
     * the instance; everything else must come and go with models and sessions */
    dsi_session *w = NULL;
    CHECK(dsi_session_create(m, &so, &w) == DSI_OK);
    if (w) CHECK(dsi_session_sync(w, toks, nt, NULL) == DSI_OK);
    dsi_session_free(w);
    dsi_model_free(m);
    m = NULL;
    uint64_t u_before = used(ctx);
    CHECK(dsi_model_load(ctx, path, NULL, &m) == DSI_OK);

    uint64_t u0 = used(ctx);
    dsi_session *s1 = NULL, *s2 = NULL;
    CHECK(dsi_session_create(m, &so, &s1) == DSI_OK);
    uint64_t u1 = used(ctx);
    CHECK(dsi_session_create(m, &so, &s2) == DSI_OK);
    uint64_t u2 = used(ctx);
    CHECK(s1 && s2);
    if (s1 && s2) {
        const float *l1, *l2;
        int32_t nv1 = 0, nv2 = 0;
        CHECK(dsi_session_sync(s1, toks, nt, NULL) == DSI_OK);
        CHECK(dsi_session_sync(s2, toks, nt, NULL) == DSI_OK);
        CHECK(dsi_session_logits(s1, &l1, &nv1) == DSI_OK);
        CHECK(dsi_session_logits(s2, &l2, &nv2) == DSI_OK);
        CHECK(nv1 == nv2 && nv1 > 0);
        if (nv1 == nv2 && nv1 > 0) CHECK(memcmp(l1, l2, sizeof(float) * (size_t)nv1) == 0);
    }
    dsi_session_free(s1);
    dsi_session_free(s2);
    /* the shared weights stay with the model, and so does the state pool (its slots are
     * reused by later sessions of the same shape) */
    uint64_t u3 = used(ctx);
    CHECK(dsi_session_create(m, &so, &s1) == DSI_OK);
    CHECK(dsi_session_create(m, &so, &s2) == DSI_OK);
    uint64_t u4 = used(ctx);
    dsi_session_free(s1);
    dsi_session_free(s2);
    uint64_t weights = u0 - u_before;
    printf("device bytes: weights uploaded at load %llu, +session1 %llu, +session2 %llu, "
           "sessions freed %llu (pool kept), two new sessions %llu\n",
           (unsigned long long)weights, (unsigned long long)(u1 - u0),
           (unsigned long long)(u2 - u1), (unsigned long long)u3, (unsigned long long)u4);
    CHECK(weights >= m->weight_bytes / 2); /* at least the bound (non-lazy) weights */
    /* sessions pay their state and step buffers only, never weights */
    CHECK(u1 - u0 < weights);
    CHECK(u2 - u1 < weights);
    CHECK(u3 > u0 && u3 < u2); /* lanes freed, pool kept */
    CHECK(u4 == u2);           /* slots reused: no growth, same step buffers */
    dsi_model_free(m);
    CHECK(used(ctx) == u_before);
    CHECK(dsit_vk_validation_check("test_backend_shared_weights") == 0);
    dsi_context_free(ctx);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
