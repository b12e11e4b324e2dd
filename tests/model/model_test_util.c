/* Helpers of the model tests, see model_test_util.h. */
#define _POSIX_C_SOURCE 200809L
#include "model_test_util.h"

#include "api/session_impl.h"
#include "tests/common/fq_trace.h"
#include "tests/common/skip.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int file_exists(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

const char *mt_model_path(const char *file, const char *override) {
    static char buf[4096];
    const char *o = override ? getenv(override) : NULL;
    if (o && *o) {
        snprintf(buf, sizeof buf, "%s", o);
        return file_exists(buf) ? buf : NULL;
    }
    const char *dir = getenv("DSI_MODELS_DIR");
    if (!dir) return NULL;
    snprintf(buf, sizeof buf, "%s/%s", dir, file);
    return file_exists(buf) ? buf : NULL;
}

static int run_cmd(char *const argv[]) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const char *mt_mkmodel(const char *config, const char *type, const char *out_name,
                       int *absent) {
    static char out[4096];
    const char *mk = getenv("DSI_MKMODEL"), *bd = getenv("DSI_BUILD_DIR");
    *absent = 0;
    if (!mk || !file_exists(mk)) {
        printf("# dsinfer-mkmodel not found (DSI_MKMODEL=%s)\n", mk ? mk : "(unset)");
        *absent = 1;
        return NULL;
    }
    /* $DSI_BUILD_DIR/tests/model/<name> (created if needed), else /tmp */
    char dir[2048];
    snprintf(dir, sizeof dir, "%s/tests", bd ? bd : "/tmp");
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/tests/model", bd ? bd : "/tmp");
    mkdir(dir, 0755);
    snprintf(out, sizeof out, "%s/%.1000s", dir, out_name);
    char *argv[] = {(char *)mk, "--config", (char *)config, "--type", (char *)type, "--layout", "native",
                    "-o", out, NULL};
    int rc = run_cmd(argv);
    if (rc != 0 || !file_exists(out)) {
        printf("# %s --config %s --type %s failed (exit %d)\n", mk, config, type, rc);
        return NULL;
    }
    return out;
}

static const char *ref_script(void) {
    static char buf[4096];
    const char *src = getenv("DSI_SOURCE_DIR");
    if (!src) return NULL;
    snprintf(buf, sizeof buf, "%s/tests/reference/dsref.py", src);
    return buf;
}

const char *mt_python(void) {
    const char *py = getenv("DSI_PYTHON");
    return py && *py ? py : "/usr/bin/python3";
}

int mt_reference_status(void) {
    if (!file_exists(ref_script())) return -1;
    return dsit_python_has(mt_python(), "numpy") ? 0 : 1;
}

float *mt_reference(const char *model, const dsi_token *tokens, size_t n, int32_t V,
                    int no_fake_quant, const char *qtrace) {
    char tokf[] = "/tmp/dsi_mt_tokXXXXXX";
    int fd = mkstemp(tokf);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    for (size_t i = 0; i < n; i++) fprintf(f, "%d%c", tokens[i], i + 1 < n ? ' ' : '\n');
    fclose(f);
    char outf[] = "/tmp/dsi_mt_outXXXXXX";
    fd = mkstemp(outf);
    if (fd < 0) {
        unlink(tokf);
        return NULL;
    }
    close(fd);
    const char *py = mt_python();
    char *argv[16];
    int a = 0;
    argv[a++] = (char *)py;
    argv[a++] = (char *)ref_script();
    argv[a++] = "--model";
    argv[a++] = (char *)model;
    argv[a++] = "--tokens-file";
    argv[a++] = tokf;
    argv[a++] = "--out";
    argv[a++] = outf;
    argv[a++] = "--positions";
    argv[a++] = "all";
    if (no_fake_quant) argv[a++] = "--no-fake-quant";
    if (qtrace) {
        argv[a++] = "--trace-quant";
        argv[a++] = (char *)qtrace;
    }
    argv[a] = NULL;
    int rc = run_cmd(argv);
    float *res = NULL;
    if (rc == 0) {
        FILE *in = fopen(outf, "rb");
        if (in) {
            res = malloc(sizeof(float) * n * (size_t)V);
            if (res && fread(res, sizeof(float), n * (size_t)V, in) != n * (size_t)V) {
                printf("# reference output is short\n");
                free(res);
                res = NULL;
            }
            fclose(in);
        }
    } else {
        printf("# reference failed (exit %d)\n", rc);
    }
    unlink(tokf);
    unlink(outf);
    return res;
}

void mt_tokens(dsi_token *out, size_t n, int32_t V, uint32_t seed) {
    uint64_t s = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        out[i] = (dsi_token)((s >> 33) % (uint64_t)V);
    }
}

static int open_model(const char *path, int32_t n_threads, int traced, uint32_t ctx_flags,
                      dsi_context **ctx, dsi_model **model) {
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = n_threads;
    co.flags = ctx_flags;
    if (dsi_context_create(&co, ctx) != DSI_OK) {
        printf("# context: %s\n", dsi_last_error());
        return -1;
    }
    if (traced && fqt_wrap_context(*ctx) != 0) {
        printf("# cannot wrap the CPU backend's op table\n");
        dsi_context_free(*ctx);
        return -1;
    }
    if (dsi_model_load(*ctx, path, NULL, model) != DSI_OK) {
        printf("# load %s: %s\n", path, dsi_context_last_error(*ctx));
        fqt_unwrap_context(*ctx);
        dsi_context_free(*ctx);
        return -1;
    }
    return 0;
}

int mt_open(const char *path, int32_t n_threads, dsi_context **ctx, dsi_model **model) {
    return open_model(path, n_threads, 0, 0, ctx, model);
}

int mt_open_flags(const char *path, int32_t n_threads, uint32_t ctx_flags, dsi_context **ctx,
                  dsi_model **model) {
    return open_model(path, n_threads, 0, ctx_flags, ctx, model);
}

int mt_open_traced(const char *path, int32_t n_threads, dsi_context **ctx, dsi_model **model) {
    return open_model(path, n_threads, 1, 0, ctx, model);
}

void mt_close(dsi_context *ctx, dsi_model *model) {
    dsi_model_free(model);
    fqt_unwrap_context(ctx);
    dsi_context_free(ctx);
}

dsi_session *mt_session(dsi_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t flags) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = n_ctx;
    so.n_batch = n_batch;
    so.flags = flags;
    dsi_session *s = NULL;
    if (dsi_session_create(m, &so, &s) != DSI_OK) printf("# session: %s\n", dsi_last_error());
    return s;
}

float *mt_all_logits(dsi_model *m, const dsi_token *tokens, size_t n, uint32_t n_batch,
                     uint32_t flags, uint32_t n_ctx) {
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(m, &info);
    dsi_session *s = mt_session(m, n_ctx, n_batch, flags);
    if (!s) return NULL;
    float *all = malloc(sizeof(float) * n * (size_t)info.n_vocab);
    dsii_session_begin_call(s);
    if (!all || dsii_session_append_all_logits(s, tokens, n, all) != DSI_OK) {
        printf("# append: %s\n", dsi_session_last_error(s));
        free(all);
        all = NULL;
    }
    dsi_session_free(s);
    return all;
}

size_t mt_argmax(const float *row, int32_t V) {
    size_t b = 0;
    for (int32_t i = 1; i < V; i++)
        if (row[i] > row[b]) b = (size_t)i;
    return b;
}

mt_cmp mt_compare(const float *a, const float *ref, size_t n, int32_t V, double tol_rel) {
    mt_cmp c = {0, -1, 0.0, 0.0, -1, -1};
    for (size_t p = 0; p < n; p++) {
        const float *x = a + p * (size_t)V, *r = ref + p * (size_t)V;
        float lo = r[0], hi = r[0];
        double md = 0.0;
        for (int32_t i = 0; i < V; i++) {
            if (r[i] < lo) lo = r[i];
            if (r[i] > hi) hi = r[i];
            double d = fabs((double)x[i] - (double)r[i]);
            if (!(d <= md)) md = d; /* NaN propagates */
        }
        double range = (double)hi - (double)lo;
        double rel = range > 0 ? md / range : md;
        if (!(md <= c.max_abs)) c.max_abs = md;
        if (!(rel <= c.max_rel)) {
            c.max_rel = rel;
            c.worst_pos = (long)p;
        }
        if (c.first_over < 0 && !(rel <= tol_rel)) c.first_over = (long)p;
        if (mt_argmax(x, V) != mt_argmax(r, V)) {
            if (c.first_argmax_diff < 0) c.first_argmax_diff = (long)p;
            c.n_argmax_diff++;
        }
    }
    return c;
}
