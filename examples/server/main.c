/*
 * dsinfer-server: options, logging, signals, start-up and orderly shutdown (docs/server.md).
 *
 * Logs go where the operator says (--log FILE, default stderr; --log-level); the library
 * logs only through this sink (its context's log callback), never on its own.
 * SIGINT / SIGTERM: new requests are refused, running generations cancelled, connections
 * closed, then everything is freed (the ASan stage checks that nothing leaks).
 */
#define _POSIX_C_SOURCE 200809L
#include "server.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *prog = "dsinfer-server";

/* ---- logging ------------------------------------------------------------------------------- */

static FILE *g_log;
static int g_log_level = SLOG_INFO;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

int slog_level(void) { return g_log_level; }

void slog(int level, const char *fmt, ...) {
    if (level < g_log_level || !g_log) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char ts[32];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    pthread_mutex_lock(&g_log_mu);
    fprintf(g_log, "%s.%03ldZ %s ", ts, now.tv_nsec / 1000000, names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(g_log, fmt, ap);
    va_end(ap);
    fputc('\n', g_log);
    fflush(g_log);
    pthread_mutex_unlock(&g_log_mu);
}

/* ---- options ------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s -m FILE [--host ADDR] [--port N] [--port-file FILE] [--name ID]\n"
            "       [--parallel N] [--queue N] [--max-connections N] [--max-body BYTES]\n"
            "       [--max-tokens N] [--ctx N] [-t THREADS] [--backend NAME] [--timeout S]\n"
            "       [--api-key KEY] [--no-batch] [--log FILE|-] [--log-level LEVEL] [-h]\n"
            "\n"
            "  -m FILE            model (GGUF)\n"
            "  --host ADDR        address to listen on (default 127.0.0.1)\n"
            "  --port N           TCP port (default 8080; 0 = any free port)\n"
            "  --port-file FILE   write the port actually bound to FILE once listening\n"
            "  --name ID          model id reported by /v1/models (default: the file name)\n"
            "  --parallel N       requests generating at once, one session each (default 4)\n"
            "  --queue N          requests waiting for a slot before 429 (default 64)\n"
            "  --max-connections N  open connections (default 256)\n"
            "  --max-body BYTES   largest request body (default 1048576; larger: 413)\n"
            "  --max-tokens N     largest max_tokens a request may ask for (default 2048)\n"
            "  --ctx N            context length of each session (default min(4096, trained))\n"
            "  -t THREADS         CPU threads of the library (default: all online CPUs)\n"
            "  --backend NAME     cpu, vulkan, cuda or auto (default cpu)\n"
            "  --timeout S        close idle connections after S seconds (default 120)\n"
            "  --api-key KEY      require 'Authorization: Bearer KEY'\n"
            "  --no-batch         do not merge concurrent requests into batched steps\n"
            "  --log FILE|-       where logs go (default: stderr; '-' = stdout)\n"
            "  --log-level LEVEL  debug, info (default), warn, error or none\n",
            prog);
}

static int parse_ll(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: invalid value '%s' for %s: expected an integer in %lld .. %lld\n", prog, s, opt, lo, hi);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_args(int argc, char **argv, srv_config *c, const char **log_path, int *help) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->parallel = 4;
    c->max_queue = 64;
    c->max_connections = 256;
    c->max_body = 1u << 20;
    c->max_tokens = 2048;
    c->timeout_s = 120;
    *log_path = NULL;
    *help = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            *help = 1;
            continue;
        }
        if (!strcmp(a, "--no-batch")) {
            c->no_batch = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: unknown option or missing value: %s (see -h)\n", prog, a);
            return 0;
        }
        const char *val = argv[++i];
        if (!strcmp(a, "-m")) c->model_path = val;
        else if (!strcmp(a, "--host")) c->host = val;
        else if (!strcmp(a, "--port")) { if (!parse_ll(a, val, 0, 65535, &v)) return 0; c->port = (int)v; }
        else if (!strcmp(a, "--port-file")) c->port_file = val;
        else if (!strcmp(a, "--name")) c->model_name = val;
        else if (!strcmp(a, "--parallel")) { if (!parse_ll(a, val, 1, 256, &v)) return 0; c->parallel = (int)v; }
        else if (!strcmp(a, "--queue")) { if (!parse_ll(a, val, 0, 1 << 20, &v)) return 0; c->max_queue = (int)v; }
        else if (!strcmp(a, "--max-connections")) { if (!parse_ll(a, val, 1, 1 << 16, &v)) return 0; c->max_connections = (int)v; }
        else if (!strcmp(a, "--max-body")) { if (!parse_ll(a, val, 64, 1ll << 32, &v)) return 0; c->max_body = (size_t)v; }
        else if (!strcmp(a, "--max-tokens")) { if (!parse_ll(a, val, 1, INT32_MAX, &v)) return 0; c->max_tokens = (int32_t)v; }
        else if (!strcmp(a, "--ctx")) { if (!parse_ll(a, val, 1, UINT32_MAX, &v)) return 0; c->n_ctx = (uint32_t)v; }
        else if (!strcmp(a, "-t")) { if (!parse_ll(a, val, 1, 1024, &v)) return 0; c->n_threads = (int)v; }
        else if (!strcmp(a, "--backend")) c->backend = val;
        else if (!strcmp(a, "--timeout")) { if (!parse_ll(a, val, 1, 86400, &v)) return 0; c->timeout_s = (int)v; }
        else if (!strcmp(a, "--api-key")) c->api_key = val;
        else if (!strcmp(a, "--log")) *log_path = val;
        else if (!strcmp(a, "--log-level")) {
            static const char *const names[] = {"debug", "info", "warn", "error", "none"};
            int found = 0;
            for (int k = 0; k < 5; k++)
                if (!strcmp(val, names[k])) { g_log_level = k; found = 1; }
            if (!found) {
                fprintf(stderr, "%s: invalid value '%s' for --log-level: debug, info, warn, error or none\n", prog, val);
                return 0;
            }
        } else {
            fprintf(stderr, "%s: unknown option '%s' (see -h)\n", prog, a);
            return 0;
        }
    }
    if (!*help && !c->model_path) {
        fprintf(stderr, "%s: -m FILE is required (see -h)\n", prog);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    srv_config cfg;
    const char *log_path;
    int help;
    if (!parse_args(argc, argv, &cfg, &log_path, &help)) return 2;
    if (help) {
        usage(stdout);
        return 0;
    }
    g_log = stderr;
    if (log_path && !strcmp(log_path, "-")) {
        g_log = stdout;
    } else if (log_path) {
        g_log = fopen(log_path, "a");
        if (!g_log) {
            fprintf(stderr, "%s: cannot open log file '%s': %s\n", prog, log_path, strerror(errno));
            return 1;
        }
    }
    char name[256];
    if (!cfg.model_name) {
        const char *b = strrchr(cfg.model_path, '/');
        snprintf(name, sizeof name, "%s", b ? b + 1 : cfg.model_path);
        char *dot = strrchr(name, '.');
        if (dot && !strcmp(dot, ".gguf")) *dot = 0;
        cfg.model_name = name;
    }

    /* Signals are taken synchronously by this thread (sigwait); every other thread,
     * including the library's and libmicrohttpd's, inherits the blocked mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 0;
    srv_engine *engine = NULL;
    srv_http *http = NULL;
    slog(SLOG_INFO, "libdsinfer %s; loading %s", dsi_version_string(), cfg.model_path);
    if (engine_open(&cfg, &engine) != 0) {
        rc = 1;
        goto done;
    }
    int port = 0;
    if (http_start(&cfg, engine, &http, &port) != 0) {
        rc = 1;
        goto done;
    }
    slog(SLOG_INFO, "serving '%s' on http://%s:%d (%d slots%s, context %u, queue %d, body limit %zu, max_tokens %d)",
         cfg.model_name, cfg.host, port, cfg.parallel, cfg.no_batch ? "" : ", batched steps",
         (unsigned)engine_n_ctx(engine), cfg.max_queue, cfg.max_body, (int)cfg.max_tokens);
    if (cfg.port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", cfg.port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, cfg.port_file) != 0) {
            slog(SLOG_ERROR, "cannot write --port-file '%s'", cfg.port_file);
            rc = 1;
            goto done;
        }
    }
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    slog(SLOG_INFO, "signal %d: shutting down", sig);

done:
    if (engine) engine_stop(engine);  /* refuse new jobs, cancel running ones */
    http_drain(http, 10000);          /* let answers in flight (e.g. 503s) go out */
    http_stop(http);                  /* close connections, join their threads */
    engine_close(engine);             /* join workers, free sessions, model, context */
    slog(SLOG_INFO, "stopped");
    if (g_log && g_log != stderr && g_log != stdout) fclose(g_log);
    return rc;
}
