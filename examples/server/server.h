/*
 * dsinfer-server — an OpenAI-compatible HTTP server on libdsinfer (docs/server.md).
 *
 *   main.c    options, logging, signals, start-up and orderly shutdown
 *   http.c    libmicrohttpd glue: routing, request bodies, limits, JSON and SSE responses,
 *             client-disconnect detection
 *   api.c     the OpenAI request schema (jansson): validation into a job, response objects
 *   engine.c  slots (one session each), the job queue, worker threads, cancellation, and
 *             the prompt-cache hook
 *
 * Threads: libmicrohttpd runs one thread per connection; each slot has a worker thread
 * that calls dsi_session_generate. Concurrent requests therefore generate concurrently on
 * sessions of one model, which the execution core's scheduler merges into shared batched
 * steps (DSI_MODEL_FLAG_COALESCE, engine_open).
 */
#ifndef DSINFER_SERVER_H
#define DSINFER_SERVER_H

#define DSI_EXPERIMENTAL /* DSI_MODEL_FLAG_COALESCE: batched steps (docs/api.md) */
#include "dsinfer.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- logging (main.c) ------------------------------------------------------------------ */

enum { SLOG_DEBUG = 0, SLOG_INFO = 1, SLOG_WARN = 2, SLOG_ERROR = 3, SLOG_NONE = 4 };
void slog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int slog_level(void);

/* ---- configuration --------------------------------------------------------------------- */

typedef struct srv_config {
    const char *model_path;
    const char *model_name;   /* id reported by /v1/models; default: the file's base name */
    const char *host;
    int port;
    const char *port_file;
    const char *api_key;
    const char *backend;
    int n_threads;
    uint32_t n_ctx;
    int parallel;             /* slots = requests generating at once */
    int max_queue;            /* requests waiting for a slot before 429 */
    int max_connections;
    size_t max_body;          /* request body limit (bytes) */
    int32_t max_tokens;       /* the most a request may ask for (and the chat default) */
    int timeout_s;            /* idle connection timeout */
    int no_batch;             /* 1: generate without coalescing concurrent requests */
} srv_config;

/* ---- jobs (engine.c) ------------------------------------------------------------------- */

enum { JOB_CHAT = 0, JOB_COMPLETION = 1 };
enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 };
enum { JOB_CANCEL_CLIENT = 1, JOB_CANCEL_SHUTDOWN = 2 };

typedef struct srv_slot srv_slot;

typedef struct srv_job {
    /* the request, set before submission (api.c) */
    int kind;
    int stream;
    int include_usage;
    dsi_token *prompt;
    size_t n_prompt;
    int32_t max_tokens;
    dsi_sampler *sampler;     /* created (and validated) by the connection thread */
    char **stops;
    size_t n_stops;
    dsi_token stop_tokens[2];
    size_t n_stop_tokens;
    char id[64];
    char user[72];            /* the request's "user" (sanitised), for the debug log */
    long long created;

    /* progress, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;                /* JOB_*; DONE only once every result field is final */
    int in_call;              /* the worker is inside dsi_session_generate */
    int cancelled;            /* JOB_CANCEL_*: the client went away or the server stops */
    char *out;                /* text generated and not yet taken by the connection */
    size_t out_n, out_cap;
    int out_failed;           /* out of memory while buffering */
    dsi_status status;        /* of dsi_session_generate */
    char error[256];
    int32_t finish_reason;    /* DSI_FINISH_* */
    uint64_t n_prompt_tokens, n_reused, n_generated;
    double prefill_ms, decode_ms;
    srv_slot *slot;           /* while RUNNING */
    int refs;                 /* connection + engine */
    struct srv_job *next;     /* queue link (engine mutex) */
} srv_job;

srv_job *job_new(void);
void job_release(srv_job *job);
/* Any thread: marks the job cancelled (why: JOB_CANCEL_*) and, while it runs, cancels its
 * session. */
void job_cancel(srv_job *job, int why);

typedef struct srv_engine srv_engine;

/* Loads the model and creates the slots (sessions + worker threads). */
int engine_open(const srv_config *cfg, srv_engine **out);
/* Cancels every job, joins the workers, frees everything. */
void engine_close(srv_engine *e);
dsi_model *engine_model(srv_engine *e);
uint32_t engine_n_ctx(srv_engine *e);
/* Queues a job (takes a reference). 0 on success, 429 when the queue is full, 503 when
 * the server stops. */
int engine_submit(srv_engine *e, srv_job *job);
/* Begins shutdown: new jobs are refused, queued and running ones cancelled. */
void engine_stop(srv_engine *e);
void engine_stats(srv_engine *e, int *busy, int *idle, int *queued);

/* ---- the API (api.c) ----------------------------------------------------------------- */

typedef struct api_error {
    int http_status;
    char message[512];
    const char *type;         /* "invalid_request_error", ... */
    const char *param;        /* may be NULL */
    const char *code;         /* may be NULL */
} api_error;

/* Parses and validates a request body into `job` (prompt tokens, sampler, limits). Returns
 * 0, or the HTTP status with `err` filled. */
int api_parse_request(srv_engine *e, const srv_config *cfg, int kind, const char *body,
                      size_t len, srv_job *job, api_error *err);
/* Response bodies (malloc'd JSON text). */
char *api_error_json(const api_error *err);
char *api_models_json(const srv_config *cfg, long long created, const char *only_id);
char *api_final_json(const srv_config *cfg, const srv_job *job, const char *text, size_t n);
/* One SSE "data:" event for a streamed piece; role_chunk: the opening chat chunk. */
char *api_chunk_json(const srv_config *cfg, const srv_job *job, const char *text, size_t n,
                     int role_chunk, int final_chunk);
char *api_usage_chunk_json(const srv_config *cfg, const srv_job *job);
char *api_stream_error_json(const srv_job *job);
char *api_shutdown_error_json(void);
const char *api_finish_reason(int32_t dsi_finish);

/* ---- HTTP (http.c) -------------------------------------------------------------------- */

typedef struct srv_http srv_http;
int http_start(const srv_config *cfg, srv_engine *e, srv_http **out, int *bound_port);
/* Stops accepting connections and waits (at most timeout_ms) until every request in
 * flight has been answered — after engine_stop, they end quickly. */
void http_drain(srv_http *h, int timeout_ms);
void http_stop(srv_http *h);

#endif
