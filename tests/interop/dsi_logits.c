/*
 * The libdsinfer side of the interop tests (tests/interop/README.md): all-position logits of a
 * token sequence through the public API only.
 *
 *   dsi_logits MODEL TOKENS.bin OUT.f32 [--fake-quant] [--threads N] [--draft FILE] [--pread]
 *   dsi_logits --bench MODEL n_prompt n_gen [--threads N]
 *
 * The fake-quant rounding (model-spec §10.1) is off unless --fake-quant: llama.cpp does not
 * round activations to the FP8/FP4 grids, and comparisons between two implementations are
 * made with it off (§10.4). TOKENS.bin: int32 little-endian ids. OUT.f32: f32 [n][n_vocab].
 */
#define _POSIX_C_SOURCE 200809L
#include "dsinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what) {
    fprintf(stderr, "dsi_logits: %s: %s\n", what, dsi_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *model = NULL, *tok_path = NULL, *out_path = NULL, *draft = NULL;
    int fq = 0, threads = 2, bench = 0, np = 0, ng = 0, pos = 0, pread_ = 0, exact = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fake-quant")) fq = 1;
        else if (!strcmp(argv[i], "--exact")) exact = 1;
        else if (!strcmp(argv[i], "--default-path")) exact = 0;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--draft") && i + 1 < argc) draft = argv[++i];
        else if (!strcmp(argv[i], "--bench")) bench = 1;
        else if (!strcmp(argv[i], "--pread")) pread_ = 1;
        else if (pos == 0) model = argv[i], pos++;
        else if (pos == 1) (bench ? (void)(np = atoi(argv[i])) : (void)(tok_path = argv[i])), pos++;
        else if (pos == 2) (bench ? (void)(ng = atoi(argv[i])) : (void)(out_path = argv[i])), pos++;
        else {
            fprintf(stderr, "dsi_logits: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model || (bench ? np < 1 || ng < 1 : !tok_path || !out_path)) {
        fprintf(stderr, "usage: dsi_logits MODEL TOKENS.bin OUT.f32 [--fake-quant] [--threads N] [--draft F]\n"
                        "       dsi_logits --bench MODEL n_prompt n_gen [--threads N]\n"
                        "  --exact / --default-path: the CPU matmul path (logits: exact by default, the\n"
                        "  comparisons are of the forward pass; --bench: the default path, as applications)\n");
        return 2;
    }
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = threads;
    if (exact < 0) exact = !bench;
    if (exact) co.flags |= DSI_CONTEXT_FLAG_EXACT_MATMUL;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&co, &ctx) != DSI_OK) return fail("context");
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.draft_path = draft;
    if (pread_) mo.access = DSI_ACCESS_PREAD; /* weights read into memory, Engram rows on demand */
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, model, &mo, &m) != DSI_OK) return fail("load");
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(m, &info);
    const int nv = info.n_vocab;
    int32_t *tok = NULL;
    int n = 0;
    if (bench) {
        n = np + ng;
        tok = malloc(sizeof *tok * (size_t)n);
        for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 7919u + 13u) % (unsigned)nv);
    } else {
        FILE *f = fopen(tok_path, "rb");
        if (!f) return fail("tokens");
        fseek(f, 0, SEEK_END);
        n = (int)(ftell(f) / 4);
        fseek(f, 0, SEEK_SET);
        tok = malloc(sizeof *tok * (size_t)n + 4);
        if (!tok || fread(tok, 4, (size_t)n, f) != (size_t)n) return fail("tokens");
        fclose(f);
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = (uint32_t)n + 16;
    so.flags = fq ? 0 : DSI_SESSION_FLAG_NO_FAKE_QUANT;
    dsi_session *s = NULL;
    if (dsi_session_create(m, &so, &s) != DSI_OK) return fail("session");
    int rc = 0;
    if (bench) {
        double t0 = now_s();
        if (dsi_session_append(s, tok, (size_t)np) != DSI_OK) return fail("prefill");
        double t1 = now_s();
        for (int i = 0; i < ng; i++)
            if (dsi_session_append(s, tok + np + i, 1) != DSI_OK) return fail("decode");
        double t2 = now_s();
        printf("prefill %d tokens %.3f s %.2f tok/s; decode %d tokens %.3f s %.2f tok/s\n", np, t1 - t0,
               np / (t1 - t0), ng, t2 - t1, ng / (t2 - t1));
    } else {
        float *out = malloc(sizeof(float) * (size_t)n * (size_t)nv);
        FILE *f = fopen(out_path, "wb");
        if (!out || !f) return fail("output");
        /* token by token: a GEMM row is the same dot product as the GEMV (docs/internals.md), so
         * this equals the prefill's logits and gives every position's */
        for (int i = 0; i < n && !rc; i++) {
            const float *l = NULL;
            int32_t nv2 = 0;
            if (dsi_session_append(s, tok + i, 1) != DSI_OK || dsi_session_logits(s, &l, &nv2) != DSI_OK)
                rc = fail("eval");
            else
                memcpy(out + (size_t)i * (size_t)nv, l, sizeof(float) * (size_t)nv);
        }
        if (!rc && fwrite(out, sizeof(float) * (size_t)nv, (size_t)n, f) != (size_t)n) rc = fail("write");
        fclose(f);
        free(out);
    }
    dsi_session_free(s);
    dsi_model_free(m);
    dsi_context_free(ctx);
    free(tok);
    return rc;
}
