/* The CUDA backend module: loads, declines politely without a device, and on a GPU moves
 * data exactly, accounts memory, survives an impossible allocation, runs streams, events,
 * pinned host-visible buffers and capture / replay (backend.h v2), implements every op, and
 * opens sessions on the tiny model (the numbers are compared with the CPU by test_backend_ops
 * cuda, test_backend_model cuda and test_cuda_models). Skips (exit 77,
 * tests/common/skip.h) with the reason when the module was not built (a failure with
 * DSI_REQUIRE_CUDA_TOOLKIT=1: nvcc was found, so the module must exist) or no CUDA device
 * is present (a failure with DSI_REQUIRE_CUDA_DEVICE=1, tests/gpu/run-gpu-checks.sh). */
#define _POSIX_C_SOURCE 200809L
#include "backend/registry.h"
#include "base/context_impl.h"
#include "tests/common/skip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(c)                                                               \
    do {                                                                       \
        if (!(c)) {                                                            \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                \
            failures++;                                                        \
        }                                                                      \
    } while (0)

int main(void) {
    dsi_context *ctx = NULL;
    if (dsi_context_create(NULL, &ctx) != DSI_OK) {
        printf("FAIL: context: %s\n", dsi_last_error());
        return 1;
    }
    const dsib_backend *be = NULL;
    void *dl = NULL;
    char path[512] = "";
    dsii_error err;
    dsi_status st = dsii_backend_module_load(ctx, "cuda", &be, &dl, path, sizeof path, &err);
    if (st != DSI_OK) {
        dsi_context_free(ctx);
        return dsit_absent("CUDA_TOOLKIT", "CUDA backend module not available: %s", err.msg);
    }
    printf("module: %s\n", path);
    CHECK(be->api_version == DSIB_API_VERSION);
    CHECK(strcmp(be->name, "cuda") == 0);

    dsib_host host;
    dsii_backend_host_init(ctx, &host, -1);
    dsib_device_desc descs[16];
    int32_t n = 0;
    dsib_error berr = {{0}};
    st = be->enumerate(&host, descs, 16, &n, &berr);
    if (st != DSI_OK) {
        /* No driver / device: a polite refusal with a message, and the public API agrees. */
        CHECK(st == DSI_ERR_UNSUPPORTED);
        CHECK(strlen(berr.msg) > 0);
        dsi_context_options o;
        dsi_context_options_init(&o, DSI_ABI_VERSION);
        o.backend = "cuda";
        dsi_context *c2 = NULL;
        dsi_status st2 = dsi_context_create(&o, &c2);
        CHECK(st2 == DSI_ERR_UNSUPPORTED || st2 == DSI_ERR_BACKEND);
        CHECK(c2 == NULL);
        dsii_backend_module_unload(dl);
        dsi_context_free(ctx);
        if (failures) return 1;
        return dsit_absent("CUDA_DEVICE", "no CUDA device: %s", berr.msg);
    }
    CHECK(n >= 1);
    for (int32_t i = 0; i < n && i < 16; i++)
        printf("device %d: %s, %.1f GiB\n", i, descs[i].name, descs[i].memory_total / 1073741824.0);

    dsib_instance *inst = NULL;
    st = be->create(&host, &inst, &berr);
    CHECK(st == DSI_OK);
    if (st == DSI_OK) {
        const uint64_t size = 64ull << 20;
        unsigned char *src = malloc(size), *dst = malloc(size);
        for (uint64_t i = 0; i < size; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
        uint64_t before = be->memory_used(inst);
        dsib_buffer *buf = NULL;
        CHECK(be->buffer_alloc(inst, size, DSIB_BUFFER_SCRATCH, &buf, &berr) == DSI_OK);
        CHECK(be->memory_used(inst) == before + size);
        CHECK(be->upload(inst, buf, 0, src, size, &berr) == DSI_OK);
        memset(dst, 0, size);
        CHECK(be->download(inst, buf, 0, dst, size, &berr) == DSI_OK);
        CHECK(memcmp(src, dst, size) == 0);
        /* Partial transfer at an offset, and an out-of-range one refused. */
        CHECK(be->download(inst, buf, 4096, dst, 100, &berr) == DSI_OK);
        CHECK(memcmp(src + 4096, dst, 100) == 0);
        CHECK(be->download(inst, buf, size - 10, dst, 100, &berr) == DSI_ERR_INVALID_ARGUMENT);
        /* An impossible allocation fails cleanly and the instance stays usable. */
        dsib_buffer *huge = NULL;
        st = be->buffer_alloc(inst, 1ull << 50, DSIB_BUFFER_SCRATCH, &huge, &berr);
        CHECK(st == DSI_ERR_OUT_OF_DEVICE_MEMORY);
        CHECK(strstr(berr.msg, "1125899906842624") != NULL);
        CHECK(be->download(inst, buf, 0, dst, size, &berr) == DSI_OK);
        CHECK(memcmp(src, dst, size) == 0);
        be->buffer_free(inst, buf);
        CHECK(be->memory_used(inst) == before);
        /* backend.h v2: streams, events, host-visible (pinned) buffers, capture / replay */
        dsib_stream_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.struct_size = sizeof sd;
        dsib_stream *s = NULL;
        CHECK(be->stream_create(inst, &sd, &s, &berr) == DSI_OK);
        dsib_event *ev = NULL;
        CHECK(be->event_create(inst, &ev, &berr) == DSI_OK);
        if (s && ev) {
            CHECK(be->event_record(s, ev, &berr) == DSI_OK);
            CHECK(be->event_sync(inst, ev, &berr) == DSI_OK);
            CHECK(be->event_query(inst, ev) == DSI_OK);
            CHECK(be->stream_wait(s, ev, &berr) == DSI_OK);
            CHECK(be->sync(s, &berr) == DSI_OK);
            dsib_buffer *hv = NULL;
            CHECK(be->buffer_alloc(inst, 4096, DSIB_BUFFER_HOST_VISIBLE, &hv, &berr) == DSI_OK);
            unsigned char *hp = hv ? be->buffer_host_ptr(inst, hv) : NULL;
            CHECK(hp != NULL);
            if (hp) CHECK(hp[0] == 0 && hp[4095] == 0); /* starts zeroed */
            if (hv) be->buffer_free(inst, hv);
            dsib_graph *g = NULL;
            CHECK(be->capture_begin(s, &berr) == DSI_OK);
            CHECK(be->sync(s, &berr) == DSI_ERR_INVALID_ARGUMENT); /* refused while capturing */
            CHECK(be->capture_end(s, &g, &berr) == DSI_OK);
            if (g) {
                CHECK(be->graph_launch(s, g, &berr) == DSI_OK);
                CHECK(be->sync(s, &berr) == DSI_OK);
                be->graph_destroy(inst, g);
            }
        }
        if (ev) be->event_destroy(inst, ev);
        be->stream_destroy(s);
        be->destroy(inst);
        free(src);
        free(dst);
    }
    dsii_backend_module_unload(dl);

    /* Through the public API: a "cuda" context opens and lists the GPU. */
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "cuda";
    dsi_context *gctx = NULL;
    CHECK(dsi_context_create(&o, &gctx) == DSI_OK);
    if (gctx) {
        CHECK(strcmp(dsi_context_backend(gctx), "cuda") == 0);
        /* every op is implemented: a session on the tiny model opens */
        const char *dir = getenv("DSI_MODELS_DIR");
        char mp[1024];
        snprintf(mp, sizeof mp, "%s/tiny-v4.gguf", dir ? dir : "models");
        dsi_model *m = NULL;
        if (dsi_model_load(gctx, mp, NULL, &m) == DSI_OK) {
            dsi_session *ss = NULL;
            dsi_status sst = dsi_session_create(m, NULL, &ss);
            if (sst != DSI_OK) printf("session on cuda: %s\n", dsi_last_error());
            CHECK(sst == DSI_OK);
            if (ss) dsi_session_free(ss);
            dsi_model_free(m);
        }
        dsi_context_free(gctx);
    }
    dsi_context_free(ctx);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
