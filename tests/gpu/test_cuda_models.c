/*
 * Whole models on the CUDA backend against the CPU backend (tests/gpu/run-gpu-checks.sh):
 *   test_cuda_models [--tol X] [--tokens N] MODEL.gguf …
 * For each model: N tokens (default 320: N − 64 in prefill chunks of 64, then 64 decoded one
 * by one) with fake-quant rounding off (DSI_SESSION_FLAG_NO_FAKE_QUANT: the rounding grid
 * turns an ulp of difference into a step, which is compared in test_backend_model), on a
 * "cpu" and a "cuda" context (both f32 activations). Asserted: every position's argmax equal
 * (or the CPU's top two logits within the tolerance of each other: a near tie), max |Δlogit|
 * <= tol (default 5e-3); then the same tokens again on CUDA as one whole prefill and as a
 * decode of every token must give bit-identical logits (the determinism contract, §10.4).
 * Prints one line per model "MODEL name argmax_equal=… max_abs=… invariant=…".
 * Skips (77) without the module or a device (CUDA_TOOLKIT / CUDA_DEVICE).
 */
#define _POSIX_C_SOURCE 200809L
#include "dsinfer.h"
#include "api/session_impl.h"
#include "tests/common/skip.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int open_ctx(const char *backend, dsi_context **ctx) {
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.backend = backend;
    co.n_threads = 4;
    co.flags = DSI_CONTEXT_FLAG_EXACT_MATMUL;
    if (dsi_context_create(&co, ctx) != DSI_OK) {
        printf("# context '%s': %s\n", backend, dsi_last_error());
        return 0;
    }
    return 1;
}

/* Logits of every position; rows [0, split) in chunks of `chunk`, the rest one by one. */
static float *run(dsi_model *m, const dsi_token *tok, size_t n, size_t split, uint32_t chunk,
                  int32_t V) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = (uint32_t)(n + 16);
    so.n_batch = chunk > 1 ? chunk : 1;
    so.flags = DSI_SESSION_FLAG_NO_FAKE_QUANT;
    dsi_session *s = NULL;
    if (dsi_session_create(m, &so, &s) != DSI_OK) {
        printf("# session: %s\n", dsi_last_error());
        return NULL;
    }
    float *all = malloc(sizeof(float) * n * (size_t)V);
    dsii_session_begin_call(s);
    dsi_status st = all ? DSI_OK : DSI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t p = 0; p < n && st == DSI_OK;) {
        size_t k = p < split ? (split - p < chunk ? split - p : chunk) : 1;
        st = dsii_session_append_all_logits(s, tok + p, k, all + p * (size_t)V);
        p += k;
    }
    if (st != DSI_OK) {
        printf("# append: %s\n", dsi_session_last_error(s));
        free(all);
        all = NULL;
    }
    dsi_session_free(s);
    return all;
}

int main(int argc, char **argv) {
    double tol = 5e-3;
    size_t n = 320;
    int first = 1;
    while (first < argc && argv[first][0] == '-') {
        if (!strcmp(argv[first], "--tol") && first + 1 < argc) tol = atof(argv[++first]);
        else if (!strcmp(argv[first], "--tokens") && first + 1 < argc) n = (size_t)atol(argv[++first]);
        else {
            printf("usage: %s [--tol X] [--tokens N] MODEL.gguf ...\n", argv[0]);
            return 2;
        }
        first++;
    }
    if (n < 65) n = 65;
    dsi_context *cpu = NULL, *gpu = NULL;
    if (!open_ctx("cpu", &cpu)) return 1;
    if (!open_ctx("cuda", &gpu)) {
        dsi_context_free(cpu);
        return dsit_absent("CUDA_DEVICE", "no cuda context: %s", dsi_last_error());
    }
    int failures = 0;
    for (int a = first; a < argc; a++) {
        dsi_model *mc = NULL, *mg = NULL;
        if (dsi_model_load(cpu, argv[a], NULL, &mc) != DSI_OK ||
            dsi_model_load(gpu, argv[a], NULL, &mg) != DSI_OK) {
            printf("MODEL %s FAIL load: %s\n", argv[a], dsi_last_error());
            failures++;
            if (mc) dsi_model_free(mc);
            continue;
        }
        dsi_model_info info;
        dsi_model_info_init(&info);
        dsi_model_get_info(mc, &info);
        const int32_t V = info.n_vocab;
        dsi_token *tok = malloc(sizeof(dsi_token) * n);
        uint64_t r = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < n; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            tok[i] = (dsi_token)(r % (uint64_t)V);
        }
        const size_t split = n - 64;
        float *c = run(mc, tok, n, split, 64, V), *g = run(mg, tok, n, split, 64, V);
        float *gw = g ? run(mg, tok, n, n, (uint32_t)n, V) : NULL; /* whole prefill */
        float *gd = g ? run(mg, tok, n, 0, 1, V) : NULL;            /* every token decoded */
        size_t eq = 0, ties = 0;
        double max_abs = 0;
        int inv = gw && gd && memcmp(g, gw, sizeof(float) * n * V) == 0 &&
                  memcmp(g, gd, sizeof(float) * n * V) == 0;
        if (c && g) {
            for (size_t p = 0; p < n; p++) {
                const float *cr = c + p * V, *gr = g + p * V;
                size_t bc = 0, bg = 0, b2 = (size_t)-1;
                for (int32_t i = 0; i < V; i++) {
                    double d = fabs((double)cr[i] - gr[i]);
                    if (!(d <= max_abs)) max_abs = d; /* NaN propagates */
                    if (cr[i] > cr[bc]) bc = (size_t)i;
                    if (gr[i] > gr[bg]) bg = (size_t)i;
                }
                for (int32_t i = 0; i < V; i++)
                    if ((size_t)i != bc && (b2 == (size_t)-1 || cr[i] > cr[b2])) b2 = (size_t)i;
                if (bc == bg) eq++;
                else if (b2 == bg && cr[bc] - cr[b2] <= tol) ties++;
            }
        }
        int ok = c && g && eq + ties == n && max_abs <= tol && inv;
        printf("MODEL %s %s positions=%zu argmax_equal=%zu near_ties=%zu max_abs=%.3e tol=%.1e "
               "invariant=%d\n", argv[a], ok ? "ok" : "FAIL", n, eq, ties, max_abs, tol, inv);
        failures += !ok;
        free(c);
        free(g);
        free(gw);
        free(gd);
        free(tok);
        dsi_model_free(mc);
        dsi_model_free(mg);
    }
    dsi_context_free(cpu);
    dsi_context_free(gpu);
    return failures ? 1 : 0;
}
