/* Helpers of the public-API contract tests (api_util.h). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700
#include "api_util.h"
#include "tests/common/skip.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *apiu_model_path(const char *name) {
    static char path[4096];
    const char *dir = getenv("DSI_MODELS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "models", name);
    if (access(path, R_OK) != 0) {
        printf("note: %s not built (dsinfer-mkmodel writes it)\n", path);
        return NULL;
    }
    return path;
}

int apiu_open_tiny(int32_t n_threads, dsi_context **ctx, dsi_model **model, const char **path) {
    const char *p = apiu_model_path("tiny-v41.gguf");
    if (path) *path = p;
    if (!p) {
        return dsit_absent("MODELS", "the tiny model tiny-v41.gguf is not built (DSI_MODELS_DIR)");
    }
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.n_threads = n_threads;
    if (dsi_context_create(&o, ctx) != DSI_OK || dsi_model_load(*ctx, p, NULL, model) != DSI_OK) {
        printf("cannot load %s: %s\n", p, dsi_last_error());
        return 1;
    }
    return 0;
}

#define HDR 16 /* keeps 16-byte alignment of the returned block */

void *apiu_malloc(size_t size, void *user) {
    apiu_alloc_stats *s = user;
    unsigned char *p = malloc(size + HDR);
    if (!p) return NULL;
    memcpy(p, &size, sizeof size);
    atomic_fetch_add(&s->live, 1);
    atomic_fetch_add(&s->calls, 1);
    return p + HDR;
}

void *apiu_realloc(void *ptr, size_t size, void *user) {
    apiu_alloc_stats *s = user;
    if (!ptr) return apiu_malloc(size, user);
    unsigned char *p = realloc((unsigned char *)ptr - HDR, size + HDR);
    if (!p) return NULL;
    memcpy(p, &size, sizeof size);
    atomic_fetch_add(&s->calls, 1);
    return p + HDR;
}

void apiu_free(void *ptr, void *user) {
    apiu_alloc_stats *s = user;
    if (!ptr) return;
    atomic_fetch_sub(&s->live, 1);
    atomic_fetch_add(&s->frees, 1);
    free((unsigned char *)ptr - HDR);
}

void apiu_hooked_options(dsi_context_options *opt, apiu_alloc_stats *stats) {
    atomic_store(&stats->live, 0);
    atomic_store(&stats->calls, 0);
    atomic_store(&stats->frees, 0);
    dsi_context_options_init(opt, DSI_ABI_VERSION);
    opt->malloc_fn = apiu_malloc;
    opt->realloc_fn = apiu_realloc;
    opt->free_fn = apiu_free;
    opt->alloc_user_data = stats;
    opt->n_threads = 2;
}

int apiu_run_child(int (*fn)(void *arg), void *arg, double timeout_s) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -2;
    if (pid == 0) _exit(fn(arg));
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int status = 0;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (r < 0 && errno != EINTR) return -2;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (el > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        struct timespec nap = {0, 10 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

int apiu_copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = in < 0 || out < 0;
    char buf[1 << 16];
    ssize_t n;
    while (!rc && (n = read(in, buf, sizeof buf)) != 0) {
        if (n < 0 || write(out, buf, (size_t)n) != n) rc = 1;
    }
    if (in >= 0) close(in);
    if (out >= 0 && close(out) != 0) rc = 1;
    return rc;
}

const char *apiu_tmpdir(void) {
    static char dir[4096];
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/dsi-api-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(dir) ? dir : NULL;
}

void apiu_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4200];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
