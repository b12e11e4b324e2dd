/* Weights larger than one device allocation: with weight allocation pieces forced down to
 * 64 KiB (DSINFER_VULKAN_WEIGHT_CHUNK), a q8_0 model whose rows (272 B, 816 B) do not divide
 * the piece size still
 * runs on Vulkan — every weight row stays inside one piece (buffer_alloc_rows) — and gives
 * the CPU backend's logits. This is the real-model case of V4.1 expert stacks above 2 GiB.
 * Skips (77, tests/common/skip.h) without a Vulkan device unless DSI_REQUIRE_VULKAN=1, or
 * without dsinfer-mkmodel unless DSI_REQUIRE_MODELS=1. With DSINFER_VULKAN_VALIDATION=1 the
 * validation layer must have counted no error (this is the binding-window path where
 * descriptor errors would show). */
#define _POSIX_C_SOURCE 200809L
#include "dsinfer.h"
#include "tests/common/skip.h"
#include "tests/common/vk_validation.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int run(dsi_context *ctx, const char *path, const dsi_token *toks, size_t n, float *out,
               int32_t *nv) {
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, path, NULL, &m) != DSI_OK) {
        printf("FAIL: load on %s: %s\n", dsi_context_backend(ctx), dsi_last_error());
        return 1;
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 128;
    so.flags = DSI_SESSION_FLAG_NO_FAKE_QUANT; /* tight comparison (model-spec §10.4) */
    dsi_session *s = NULL;
    int rc = 1;
    if (dsi_session_create(m, &so, &s) != DSI_OK) {
        printf("FAIL: session on %s: %s\n", dsi_context_backend(ctx), dsi_last_error());
    } else if (dsi_session_sync(s, toks, n, NULL) != DSI_OK) {
        printf("FAIL: sync on %s: %s\n", dsi_context_backend(ctx), dsi_session_last_error(s));
    } else {
        const float *l = NULL;
        if (dsi_session_logits(s, &l, nv) == DSI_OK) {
            memcpy(out, l, sizeof(float) * (size_t)*nv);
            rc = 0;
        }
    }
    dsi_session_free(s);
    dsi_model_free(m);
    return rc;
}

int main(void) {
    const char *mk = getenv("DSI_MKMODEL");
    if (!mk || access(mk, X_OK) != 0)
        return dsit_absent("MODELS", "dsinfer-mkmodel not available (DSI_MKMODEL)");
    char path[256];
    snprintf(path, sizeof path, "/tmp/dsi-chunked-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --config tiny-v41 --type q8_0 --layout native -o '%s' >/dev/null", mk, path);
    if (system(cmd) != 0) {
        printf("FAIL: %s\n", cmd);
        return 1;
    }
    setenv("DSINFER_VULKAN_WEIGHT_CHUNK", "65536", 1);
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.backend = "vulkan";
    o.n_threads = 2;
    dsi_context *vk = NULL;
    if (dsi_context_create(&o, &vk) != DSI_OK) {
        unlink(path);
        return dsit_absent("VULKAN", "no Vulkan device: %s", dsi_last_error());
    }
    o.backend = "cpu";
    o.flags = DSI_CONTEXT_FLAG_EXACT_MATMUL; /* f32 activations, as the GPU computes */
    dsi_context *cpu = NULL;
    if (dsi_context_create(&o, &cpu) != DSI_OK) return 1;

    dsi_token toks[48];
    for (int i = 0; i < 48; i++) toks[i] = (dsi_token)((i * 37 + 11) % 1000);
    static float a[1 << 16], b[1 << 16];
    int32_t na = 0, nb = 0;
    int rc = run(cpu, path, toks, 48, a, &na);
    rc |= run(vk, path, toks, 48, b, &nb);
    if (rc == 0) {
        if (na != nb || na <= 0) {
            printf("FAIL: vocab %d vs %d\n", na, nb);
            rc = 1;
        } else {
            float maxd = 0, lo = a[0], hi = a[0];
            int am = 0, bm = 0;
            for (int i = 0; i < na; i++) {
                float d = fabsf(a[i] - b[i]);
                if (!(d <= maxd)) maxd = d; /* NaN propagates as a failure */
                if (a[i] > a[am]) am = i;
                if (b[i] > b[bm]) bm = i;
                if (a[i] < lo) lo = a[i];
                if (a[i] > hi) hi = a[i];
            }
            printf("q8_0 tiny-v41 in 64 KiB pieces: max |dlogit| %.3g (range %.3g), argmax %d / %d\n",
                   maxd, hi - lo, am, bm);
            if (!(maxd <= 2e-3f) || am != bm) rc = 1;
        }
    }
    if (dsit_vk_validation_check("test_backend_chunked_weights") != 0) rc = 1;
    dsi_context_free(cpu);
    dsi_context_free(vk);
    unlink(path);
    printf("%s\n", rc ? "FAILED" : "ok");
    return rc;
}
