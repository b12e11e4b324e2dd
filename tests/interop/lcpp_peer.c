/*
 * The llama.cpp side of the interop tests (tests/interop/README.md): a small program built at
 * test time against the libllama.so that npm's node-llama-cpp bundles (headers taken from the
 * same package's source bundle, so they match the binary). It never links libdsinfer.
 *
 *   lcpp_peer logits   MODEL TOKENS.bin OUT.f32 [threads]    all-position logits, f32 [n][V]
 *   lcpp_peer quantize IN OUT FTYPE [threads] [pure]         llama_model_quantize (FTYPE: id;
 *                                                            pure: every matrix the ftype's type)
 *   lcpp_peer bench    MODEL n_prompt n_gen [threads]        prefill / decode tokens per second
 *   lcpp_peer load     MODEL                                 load only (exit 0 if llama.cpp accepts it)
 *
 * Environment: LCPP_BACKEND_DIR (folder with libggml-cpu-*.so, required), LCPP_CPU_VARIANT
 * (a file name there, e.g. libggml-cpu-haswell.so, to force one CPU variant instead of
 * ggml's choice; see README.md), LCPP_VERBOSE=1 (llama.cpp's own log).
 * TOKENS.bin: int32 little-endian token ids.
 */
#define _POSIX_C_SOURCE 200809L
#include "llama.h"
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_verbose;

static void log_cb(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (g_verbose || level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int load_backends(void) {
    const char *dir = getenv("LCPP_BACKEND_DIR");
    if (!dir) {
        fprintf(stderr, "lcpp_peer: LCPP_BACKEND_DIR is not set\n");
        return 1;
    }
    const char *variant = getenv("LCPP_CPU_VARIANT");
    if (variant && *variant) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, variant);
        if (!ggml_backend_load(path)) {
            fprintf(stderr, "lcpp_peer: cannot load CPU variant %s\n", path);
            return 1;
        }
        fprintf(stderr, "lcpp_peer: CPU variant %s (forced)\n", variant);
    } else {
        ggml_backend_load_all_from_path(dir);
    }
    if (ggml_backend_dev_count() == 0) {
        fprintf(stderr, "lcpp_peer: no ggml backend found in %s\n", dir);
        return 1;
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        fprintf(stderr, "lcpp_peer: device %zu: %s (%s)\n", i, ggml_backend_dev_name(d),
                ggml_backend_dev_description(d));
    }
    return 0;
}

static struct llama_model *load_model(const char *path, int mtp) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mtp = mtp != 0; /* also create (and so check) the MTP block's tensors */
    /* No repacked weight copies ("extra buffer types": ggml's AMX / repack CPU layouts): the
     * comparison is with llama.cpp's plain CPU kernels, and on a CPU with AMX this build's
     * scheduler aborted on several types with them (GGML_ASSERT(*cur_backend_id != -1) in
     * ggml_backend_sched_split_graph: Q4_K_M, q6_k, iq4_xs, seen 3 December 2026). */
    mp.use_extra_bufts = false;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "lcpp_peer: llama.cpp refused %s (see the log above)\n", path);
    return m;
}

static struct llama_context *new_ctx(struct llama_model *m, int n_ctx, int n_batch, int threads) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_batch;
    cp.n_ubatch = (uint32_t)n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = 1;
    if (!getenv("LCPP_DEFAULTS")) {
        /* llama.cpp's defaults round attention through f16 (flash attention on the CPU, f16 KV
         * cache); f32 everywhere makes the comparison one of the two graphs, not of f16 */
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    }
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) fprintf(stderr, "lcpp_peer: llama_init_from_model failed\n");
    return c;
}

static int32_t *read_tokens(const char *path, int *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    int32_t *t = malloc((size_t)sz + 4);
    *n = (int)(sz / 4);
    if (!t || fread(t, 4, (size_t)*n, f) != (size_t)*n) {
        fclose(f);
        free(t);
        return NULL;
    }
    fclose(f);
    return t;
}

/* Evaluates tokens[0..n) in chunks of `chunk`, logits for every position. */
static int eval(struct llama_context *c, const int32_t *tok, int n, int chunk, float *out, int n_vocab) {
    struct llama_batch b = llama_batch_init(chunk, 0, 1);
    for (int p0 = 0; p0 < n; p0 += chunk) {
        int m = n - p0 < chunk ? n - p0 : chunk;
        b.n_tokens = m;
        for (int i = 0; i < m; i++) {
            b.token[i] = tok[p0 + i];
            b.pos[i] = p0 + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = out != NULL;
        }
        int rc = llama_decode(c, b);
        if (rc != 0) {
            fprintf(stderr, "lcpp_peer: llama_decode failed (%d) at position %d\n", rc, p0);
            llama_batch_free(b);
            return 1;
        }
        for (int i = 0; out && i < m; i++) {
            const float *l = llama_get_logits_ith(c, i);
            if (!l) {
                llama_batch_free(b);
                return 1;
            }
            memcpy(out + (size_t)(p0 + i) * n_vocab, l, sizeof(float) * (size_t)n_vocab);
        }
    }
    llama_batch_free(b);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: lcpp_peer logits|quantize|bench|load ...\n");
        return 2;
    }
    g_verbose = getenv("LCPP_VERBOSE") && atoi(getenv("LCPP_VERBOSE"));
    llama_log_set(log_cb, NULL);
    if (load_backends()) return 1;
    llama_backend_init();
    const char *cmd = argv[1];
    int rc = 1;
    if (!strcmp(cmd, "load")) {
        struct llama_model *m = load_model(argv[2], 1);
        if (m) {
            printf("ok %s: %d layers, %llu params\n", argv[2], llama_model_n_layer(m),
                   (unsigned long long)llama_model_n_params(m));
            llama_model_free(m);
            rc = 0;
        }
    } else if (!strcmp(cmd, "logits") && argc >= 5) {
        int threads = argc > 5 ? atoi(argv[5]) : 2, n = 0;
        int32_t *tok = read_tokens(argv[3], &n);
        struct llama_model *m = tok ? load_model(argv[2], 0) : NULL;
        struct llama_context *c = m ? new_ctx(m, n + 16, 64, threads) : NULL;
        if (c) {
            const int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
            float *out = malloc(sizeof(float) * (size_t)n * (size_t)nv);
            if (out && !eval(c, tok, n, 64, out, nv)) {
                FILE *f = fopen(argv[4], "wb");
                if (f && fwrite(out, sizeof(float) * (size_t)nv, (size_t)n, f) == (size_t)n) rc = 0;
                if (f) fclose(f);
            }
            free(out);
            llama_free(c);
        }
        if (m) llama_model_free(m);
        free(tok);
    } else if (!strcmp(cmd, "quantize") && argc >= 5) {
        struct llama_model_quantize_params qp = llama_model_quantize_default_params();
        qp.ftype = (enum llama_ftype)atoi(argv[4]);
        qp.nthread = argc > 5 ? atoi(argv[5]) : 2;
        qp.pure = argc > 6 && !strcmp(argv[6], "pure");
        qp.allow_requantize = 1; /* FTYPE 0 (all f32) from a quantized file: ggml's dequantizer */
        /* "imatrix": a uniform importance matrix (all ones) for every matrix of the input —
         * llama.cpp refuses the lowest-bit IQ types without one */
        struct llama_model_imatrix_data *im = NULL;
        float *ones = NULL;
        struct gguf_context *g = NULL;
        struct ggml_context *gctx = NULL;
        if (argc > 7 && !strcmp(argv[7], "imatrix")) {
            struct gguf_init_params gp = {1, &gctx};
            g = gguf_init_from_file(argv[2], gp);
            if (!g) {
                fprintf(stderr, "lcpp_peer: cannot read %s\n", argv[2]);
                return 1;
            }
            const int64_t nt = gguf_get_n_tensors(g);
            im = calloc((size_t)nt + 1, sizeof *im);
            size_t maxn = 0, k = 0;
            for (int64_t i = 0; i < nt; i++) {
                const struct ggml_tensor *t = ggml_get_tensor(gctx, gguf_get_tensor_name(g, i));
                if (!t || ggml_n_dims(t) < 2) continue;
                const size_t n = (size_t)t->ne[0] * (size_t)t->ne[2];
                if (n > maxn) maxn = n;
                im[k].name = gguf_get_tensor_name(g, i);
                im[k].size = n;
                k++;
            }
            ones = malloc(sizeof(float) * (maxn ? maxn : 1));
            for (size_t i = 0; i < maxn; i++) ones[i] = 1.0f;
            for (size_t i = 0; i < k; i++) im[i].data = ones;
            qp.imatrix = im;
        }
        uint32_t r = llama_model_quantize(argv[2], argv[3], &qp);
        free(im);
        free(ones);
        if (g) gguf_free(g);
        if (gctx) ggml_free(gctx);
        if (r != 0) fprintf(stderr, "lcpp_peer: llama_model_quantize failed (%u)\n", r);
        rc = r != 0;
    } else if (!strcmp(cmd, "bench") && argc >= 5) {
        int np = atoi(argv[3]), ng = atoi(argv[4]), threads = argc > 5 ? atoi(argv[5]) : 2;
        struct llama_model *m = load_model(argv[2], 0);
        struct llama_context *c = m ? new_ctx(m, np + ng + 16, np, threads) : NULL;
        if (c) {
            const int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
            int32_t *tok = malloc(sizeof(int32_t) * (size_t)(np + ng));
            for (int i = 0; i < np + ng; i++) tok[i] = (int32_t)((i * 7919u + 13u) % (unsigned)nv);
            double t0 = now_s();
            int bad = eval(c, tok, np, np, NULL, nv);
            double t1 = now_s();
            struct llama_batch b = llama_batch_init(1, 0, 1);
            for (int i = 0; i < ng && !bad; i++) {
                b.n_tokens = 1;
                b.token[0] = tok[np + i];
                b.pos[0] = np + i;
                b.n_seq_id[0] = 1;
                b.seq_id[0][0] = 0;
                b.logits[0] = 1;
                bad = llama_decode(c, b) != 0;
            }
            double t2 = now_s();
            llama_batch_free(b);
            if (!bad) {
                printf("prefill %d tokens %.3f s %.2f tok/s; decode %d tokens %.3f s %.2f tok/s\n", np, t1 - t0,
                       np / (t1 - t0), ng, t2 - t1, ng / (t2 - t1));
                rc = 0;
            }
            free(tok);
            llama_free(c);
        }
        if (m) llama_model_free(m);
    } else {
        fprintf(stderr, "lcpp_peer: bad command\n");
        rc = 2;
    }
    llama_backend_free();
    return rc;
}
