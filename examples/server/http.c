/*
 * libmicrohttpd glue (server.h): one thread per connection; routing, bodies and their
 * limit, JSON responses, server-sent events, and client-disconnect detection (a closed
 * client cancels its job).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct srv_http {
    struct MHD_Daemon *d;
    const srv_config *cfg;
    srv_engine *e;
    long long started;
    int live;                 /* requests not yet freed (atomic) */
};

enum { R_NONE, R_HEALTH, R_MODELS, R_MODEL_ID, R_CHAT, R_COMPLETIONS };

typedef struct req {
    srv_http *h;
    struct MHD_Connection *conn;
    int route;
    char method[16];
    char url[160];
    char *body;
    size_t body_n, body_cap;
    int reject;               /* status to answer once the body is read (413) */
    srv_job *job;
    /* server-sent events */
    char *pend;               /* the event being written */
    size_t pend_n, pend_off;
    int stage;                /* 0 opening chunk, 1 tokens, 2 [DONE] next, 3 end */
    long long last_write_ms;
    int status;               /* for the access log; nonzero once a response is queued */
    long long t0_ms;
    int refs;                 /* the request + a streaming response */
} req;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void req_unref(req *r) {
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    __atomic_sub_fetch(&r->h->live, 1, __ATOMIC_ACQ_REL);
    free(r->body);
    free(r->pend);
    job_release(r->job);
    free(r);
}

/* True when the peer has closed its side of the connection. */
static int client_gone(req *r) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    if (p.revents & POLLIN) {
        char b;
        return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return 0;
}

/* ---- responses ---------------------------------------------------------------------------- */

static enum MHD_Result respond(req *r, int status, char *json, const char *allow) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    struct MHD_Response *resp;
    if (json) {
        resp = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    } else {
        status = 500;
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    }
    if (!resp) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    r->status = status;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result respond_error(req *r, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static enum MHD_Result respond_error(req *r, int status, const char *param, const char *code, const char *fmt, ...) {
    api_error e;
    memset(&e, 0, sizeof e);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    e.http_status = status;
    e.type = status >= 500 ? "server_error" : "invalid_request_error";
    e.param = param;
    e.code = code;
    const char *allow = NULL;
    if (status == 405) allow = r->route == R_CHAT || r->route == R_COMPLETIONS ? "POST" : "GET";
    return respond(r, status, api_error_json(&e), allow);
}

/* ---- routing ------------------------------------------------------------------------------- */

static int route_of(const char *url, const char **model_id) {
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/health")) return R_HEALTH;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *model_id = url + 11;
        return R_MODEL_ID;
    }
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    return R_NONE;
}

static int authorized(req *r) {
    const char *key = r->h->cfg->api_key;
    if (!key) return 1;
    const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return a && !strncmp(a, "Bearer ", 7) && !strcmp(a + 7, key);
}

/* ---- generation requests ---------------------------------------------------------------------- */

static void take_event(req *r, char *json, const char *prefix) {
    free(r->pend);
    r->pend = NULL;
    r->pend_n = r->pend_off = 0;
    if (!json) return;
    size_t n = strlen(json), pn = strlen(prefix);
    r->pend = malloc(pn + n + 3);
    if (r->pend) {
        memcpy(r->pend, prefix, pn);
        memcpy(r->pend + pn, json, n);
        memcpy(r->pend + pn + n, "\n\n", 2);
        r->pend_n = pn + n + 2;
    }
    free(json);
}

static void set_text_event(req *r, const char *text) {
    char *copy = strdup(text);
    take_event(r, copy, "");
}

#define WAIT_STEP_MS 50
#define KEEPALIVE_MS 15000

/* Waits (in steps, watching the client) until the job has new text or is done. Returns 0,
 * or -1 when the client went away (the job is then cancelled). Called with j->mu held. */
static int wait_job(req *r, srv_job *j, int need_text) {
    while (j->state != JOB_DONE && !(need_text && j->out_n > 0)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WAIT_STEP_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->state != JOB_DONE && client_gone(r)) {
            pthread_mutex_unlock(&j->mu);
            job_cancel(j, JOB_CANCEL_CLIENT);
            pthread_mutex_lock(&j->mu);
            return -1;
        }
        if (need_text && now_ms() - r->last_write_ms > KEEPALIVE_MS) return 0; /* keep-alive */
    }
    return 0;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    req *r = cls;
    srv_job *j = r->job;
    const srv_config *cfg = r->h->cfg;
    for (;;) {
        if (r->pend_off < r->pend_n) {
            size_t n = r->pend_n - r->pend_off;
            if (n > max) n = max;
            memcpy(buf, r->pend + r->pend_off, n);
            r->pend_off += n;
            r->last_write_ms = now_ms();
            return (ssize_t)n;
        }
        if (r->stage == 0) {
            r->stage = 1;
            if (j->kind == JOB_CHAT) take_event(r, api_chunk_json(cfg, j, NULL, 0, 1, 0), "data: ");
            continue;
        }
        if (r->stage == 2) {
            set_text_event(r, "data: [DONE]");
            r->stage = 3;
            continue;
        }
        if (r->stage == 3) return MHD_CONTENT_READER_END_OF_STREAM;

        pthread_mutex_lock(&j->mu);
        if (wait_job(r, j, 1) < 0) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (j->out_n > 0) {
            char *ev = api_chunk_json(cfg, j, j->out, j->out_n, 0, 0);
            j->out_n = 0; /* streamed text is not kept */
            pthread_mutex_unlock(&j->mu);
            take_event(r, ev, "data: ");
            if (!ev) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        if (j->state != JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            set_text_event(r, ": keep-alive"); /* an SSE comment during a long prefill */
            continue;
        }
        dsi_status st = j->status;
        int cancelled = j->cancelled;
        pthread_mutex_unlock(&j->mu);
        if (st == DSI_OK) {
            char *fin = api_chunk_json(cfg, j, NULL, 0, 0, 1);
            if (j->include_usage && fin) {
                char *u = api_usage_chunk_json(cfg, j);
                size_t a = strlen(fin), b = u ? strlen(u) : 0;
                char *both = u ? malloc(a + b + 9) : NULL;
                if (both) {
                    memcpy(both, fin, a);
                    memcpy(both + a, "\n\ndata: ", 8);
                    memcpy(both + a + 8, u, b + 1);
                }
                free(u);
                free(fin);
                fin = both;
            }
            take_event(r, fin, "data: ");
        } else if (cancelled == JOB_CANCEL_CLIENT) {
            return MHD_CONTENT_READER_END_WITH_ERROR; /* nobody is listening */
        } else if (cancelled) {
            take_event(r, api_shutdown_error_json(), "data: ");
        } else {
            take_event(r, api_stream_error_json(j), "data: ");
        }
        r->stage = 2;
    }
}

static void sse_free(void *cls) { req_unref(cls); }

static enum MHD_Result run_generation(req *r, int kind) {
    srv_http *h = r->h;
    srv_job *j = job_new();
    if (!j) return respond_error(r, 500, NULL, NULL, "out of memory");
    api_error err;
    memset(&err, 0, sizeof err);
    int rc = api_parse_request(h->e, h->cfg, kind, r->body ? r->body : "", r->body_n, j, &err);
    if (rc) {
        job_release(j);
        return respond(r, rc, api_error_json(&err), NULL);
    }
    rc = engine_submit(h->e, j);
    if (rc == 429) {
        job_release(j);
        return respond_error(r, 429, NULL, "server_busy", "too many requests are waiting for a slot; retry later");
    }
    if (rc) {
        job_release(j);
        return respond_error(r, 503, NULL, "shutting_down", "the server is shutting down");
    }
    r->job = j;
    if (j->stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, r, sse_free);
        if (!resp) {
            job_cancel(j, JOB_CANCEL_CLIENT);
            return MHD_NO;
        }
        __atomic_add_fetch(&r->refs, 1, __ATOMIC_ACQ_REL);
        r->last_write_ms = now_ms();
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        r->status = 200;
        enum MHD_Result ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    pthread_mutex_lock(&j->mu);
    if (wait_job(r, j, 0) < 0) {
        pthread_mutex_unlock(&j->mu);
        r->status = 499; /* nobody to answer */
        return MHD_NO;
    }
    dsi_status st = j->status;
    int cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (st == DSI_OK) return respond(r, 200, api_final_json(h->cfg, j, j->out, j->out_n), NULL);
    if (cancelled) return respond_error(r, 503, NULL, "shutting_down", "the server is shutting down");
    return respond_error(r, 500, NULL, NULL, "generation failed: %s", j->error);
}

/* ---- the request handler --------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_http *h = cls;
    req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->h = h;
        r->conn = conn;
        r->refs = 1;
        __atomic_add_fetch(&h->live, 1, __ATOMIC_ACQ_REL);
        r->t0_ms = now_ms();
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->url, sizeof r->url, "%s", url);
        *con_cls = r;
        const char *model_id = NULL;
        r->route = route_of(url, &model_id);
        int is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        if (r->route == R_NONE) return respond_error(r, 404, NULL, "not_found", "no such endpoint: %s %.100s", r->method, r->url);
        if (r->route != R_HEALTH && !authorized(r)) return respond_error(r, 401, NULL, "invalid_api_key", "a valid API key is required (Authorization: Bearer ...)");
        int wants_post = r->route == R_CHAT || r->route == R_COMPLETIONS;
        if (wants_post ? !is_post : !is_get)
            return respond_error(r, 405, NULL, "method_not_allowed", "%s is not allowed on %.100s", r->method, r->url);
        if (r->route == R_HEALTH) {
            int busy, idle, queued;
            engine_stats(h->e, &busy, &idle, &queued);
            char *s = malloc(128);
            if (s) snprintf(s, 128, "{\"status\":\"ok\",\"slots_busy\":%d,\"slots_idle\":%d,\"queued\":%d}", busy, idle, queued);
            return respond(r, 200, s, NULL);
        }
        if (r->route == R_MODELS) return respond(r, 200, api_models_json(h->cfg, h->started, NULL), NULL);
        if (r->route == R_MODEL_ID) {
            if (strcmp(model_id, h->cfg->model_name))
                return respond_error(r, 404, "model", "model_not_found", "the model '%.100s' does not exist", model_id);
            return respond(r, 200, api_models_json(h->cfg, h->started, model_id), NULL);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long v = strtoull(cl, &end, 10);
            if (*end || v > h->cfg->max_body)
                return respond_error(r, 413, NULL, "request_too_large", "the request body is larger than %zu bytes", h->cfg->max_body);
        }
        return MHD_YES; /* the body follows */
    }
    if (r->status) {
        /* answered at the first call (an error): discard whatever body follows */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->reject) return MHD_YES; /* discarding */
        if (r->body_n + n > h->cfg->max_body) {
            r->reject = 413;
            free(r->body);
            r->body = NULL;
            r->body_n = r->body_cap = 0;
            return MHD_YES;
        }
        if (r->body_n + n + 1 > r->body_cap) {
            size_t c = r->body_cap ? r->body_cap : 4096;
            while (c < r->body_n + n + 1) c *= 2;
            char *b = realloc(r->body, c);
            if (!b) return MHD_NO;
            r->body = b;
            r->body_cap = c;
        }
        memcpy(r->body + r->body_n, upload, n);
        r->body_n += n;
        r->body[r->body_n] = 0;
        return MHD_YES;
    }
    if (r->reject == 413)
        return respond_error(r, 413, NULL, "request_too_large", "the request body is larger than %zu bytes", h->cfg->max_body);
    return run_generation(r, r->route == R_CHAT ? JOB_CHAT : JOB_COMPLETION);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (r->job) {
        pthread_mutex_lock(&r->job->mu);
        int running = r->job->state != JOB_DONE;
        pthread_mutex_unlock(&r->job->mu);
        if (running) job_cancel(r->job, JOB_CANCEL_CLIENT); /* the client left mid-stream */
    }
    if (slog_level() <= SLOG_INFO) {
        char extra[160] = "";
        srv_job *j = r->job;
        if (j) {
            pthread_mutex_lock(&j->mu);
            if (j->state == JOB_DONE && j->status == DSI_OK)
                snprintf(extra, sizeof extra, " %s: %llu prompt (%llu reused) + %llu generated tokens, %s", j->id,
                         (unsigned long long)j->n_prompt_tokens, (unsigned long long)j->n_reused,
                         (unsigned long long)j->n_generated, api_finish_reason(j->finish_reason));
            pthread_mutex_unlock(&j->mu);
        }
        slog(SLOG_INFO, "%s %s %d %lld ms%s%s", r->method, r->url, r->status, now_ms() - r->t0_ms, extra,
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
    }
    req_unref(r);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    slog(SLOG_WARN, "http: %s", msg);
}

int http_start(const srv_config *cfg, srv_engine *e, srv_http **out, int *bound_port) {
    *out = NULL;
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return -1;
    h->cfg = cfg;
    h->e = e;
    h->started = (long long)time(NULL);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        slog(SLOG_ERROR, "cannot resolve --host '%s': %s", cfg->host, gai_strerror(gai));
        free(h);
        return -1;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC /* for MHD_quiesce_daemon */;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, /* first: all messages */
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        slog(SLOG_ERROR, "cannot listen on %s:%d", cfg->host, cfg->port);
        free(h);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = di ? di->port : cfg->port;
    *out = h;
    return 0;
}

void http_drain(srv_http *h, int timeout_ms) {
    if (!h) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d); /* no new connections from here on */
    if (fd != MHD_INVALID_SOCKET) close(fd);
    long long t0 = now_ms();
    while (__atomic_load_n(&h->live, __ATOMIC_ACQUIRE) > 0 && now_ms() - t0 < timeout_ms) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void http_stop(srv_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
