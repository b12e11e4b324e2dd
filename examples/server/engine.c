/*
 * Slots, the job queue and the worker threads (server.h).
 *
 * Each slot owns one dsi_session and one worker thread. A job goes to the idle slot whose
 * last timeline shares the longest prefix with the job's prompt (dsi_session_sync then
 * re-evaluates only the rest: a multi-turn chat keeps its KV cache), or waits in a FIFO
 * queue until a slot is free. Workers call dsi_session_generate concurrently on sessions
 * of one model, and the execution core's scheduler merges them into shared batched steps
 * (DSI_MODEL_FLAG_COALESCE, engine_open; --no-batch turns it off).
 */
#define _POSIX_C_SOURCE 200809L
#include "server.h"

#include <stdlib.h>
#include <string.h>

struct srv_slot {
    int index;
    dsi_session *session;
    pthread_t thread;
    srv_engine *engine;
    srv_job *assigned;        /* engine mutex */
    srv_job *running;         /* the job the worker runs (engine mutex) */
    int busy;                 /* engine mutex */
    dsi_token *cached;        /* the session's timeline after its last job (engine mutex) */
    size_t n_cached;
};

struct srv_engine {
    dsi_context *ctx;
    dsi_model *model;
    uint32_t n_ctx;
    int n_slots;
    srv_slot *slots;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job *q_head, *q_tail;
    int q_len, max_queue;
    int stopping;
};

/* ---- jobs ------------------------------------------------------------------------------ */

srv_job *job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->state = JOB_QUEUED;
    return j;
}

void job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    free(j->prompt);
    dsi_sampler_free(j->sampler);
    for (size_t i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->stops);
    free(j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void job_cancel(srv_job *j, int why) {
    pthread_mutex_lock(&j->mu);
    if (!j->cancelled) j->cancelled = why;
    /* Only while the worker is inside dsi_session_generate (in_call is set before and
     * cleared after the call under this mutex). A cancel that lands before the call
     * starts stays pending (sticky) and cancels the call at once; one that lands as the
     * call ends is dropped by the dsi_session_cancel_clear before the slot's next job. */
    if (j->in_call && j->slot) dsi_session_cancel(j->slot->session);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void job_finish(srv_job *j, dsi_status st, const char *msg) {
    pthread_mutex_lock(&j->mu);
    j->status = st;
    if (msg) snprintf(j->error, sizeof j->error, "%s", msg);
    j->state = JOB_DONE;
    j->slot = NULL;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Runs on the worker thread for every delivered token. */
static int32_t on_token(dsi_token tok, const char *text, size_t len, void *user) {
    (void)tok;
    srv_job *j = user;
    pthread_mutex_lock(&j->mu);
    if (len) {
        if (j->out_n + len > j->out_cap) {
            size_t cap = j->out_cap ? j->out_cap : 256;
            while (cap < j->out_n + len) cap *= 2;
            char *p = realloc(j->out, cap);
            if (!p) {
                j->out_failed = 1;
            } else {
                j->out = p;
                j->out_cap = cap;
            }
        }
        if (!j->out_failed) {
            memcpy(j->out + j->out_n, text, len);
            j->out_n += len;
        }
    }
    int go = !j->cancelled && !j->out_failed;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return go;
}

/* ---- the prompt-cache hook ---------------------------------------------------------------- */

static size_t common_prefix(const dsi_token *a, size_t na, const dsi_token *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Called on the worker before a job runs. Today the slot's own session is the cache: its
 * timeline (kept from the previous job) is synced to the prompt, reusing the longest
 * common prefix. PERSISTENCE HOOK: when the library can save and restore session state
 * (the persistence issue), look the prompt up in a store of saved prefixes here and
 * restore the best one into slot->session when it beats the slot's own prefix; and save
 * the slot's state after the job in slot_remember(). */
static void cache_prepare(srv_slot *slot, const srv_job *j) {
    (void)slot;
    (void)j;
}

static void slot_remember(srv_slot *slot) {
    srv_engine *e = slot->engine;
    size_t need = 0;
    dsi_token *t = NULL;
    (void)dsi_session_tokens(slot->session, NULL, 0, &need);
    if (need) {
        t = malloc(need * sizeof *t);
        if (t && dsi_session_tokens(slot->session, t, need, &need) != DSI_OK) {
            free(t);
            t = NULL;
        }
    }
    pthread_mutex_lock(&e->mu);
    free(slot->cached);
    slot->cached = t;
    slot->n_cached = t ? need : 0;
    pthread_mutex_unlock(&e->mu);
}

/* ---- workers ---------------------------------------------------------------------------- */

static void run_job(srv_slot *slot, srv_job *j) {
    /* A cancel meant for the slot's previous job may have arrived just after that job's
     * call ended and stayed pending (cancellation is sticky): drop it before this job.
     * Cancels for this job come only after in_call is set below. */
    dsi_session_cancel_clear(slot->session);
    pthread_mutex_lock(&j->mu);
    if (j->cancelled) {
        pthread_mutex_unlock(&j->mu);
        srv_engine *e = slot->engine;
        pthread_mutex_lock(&e->mu);
        slot->busy = 0;
        slot->running = NULL;
        job_finish(j, DSI_ERR_CANCELLED, "cancelled before it started");
        pthread_mutex_unlock(&e->mu);
        return;
    }
    j->state = JOB_RUNNING;
    j->in_call = 1;
    j->slot = slot;
    pthread_mutex_unlock(&j->mu);

    cache_prepare(slot, j);
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = j->prompt;
    go.n_prompt = j->n_prompt;
    go.max_tokens = j->max_tokens;
    go.stop_tokens = j->n_stop_tokens ? j->stop_tokens : NULL;
    go.n_stop_tokens = j->n_stop_tokens;
    go.stop_strings = (const char *const *)j->stops;
    go.n_stop_strings = j->n_stops;
    go.on_token = on_token;
    go.user_data = j;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    dsi_status st = dsi_session_generate(slot->session, j->sampler, &go, &r);

    pthread_mutex_lock(&j->mu);
    j->in_call = 0; /* from here on job_cancel no longer touches the session */
    j->finish_reason = r.finish_reason;
    j->n_prompt_tokens = r.n_prompt;
    j->n_reused = r.n_reused;
    j->n_generated = r.n_generated;
    j->prefill_ms = r.prefill_ms;
    j->decode_ms = r.decode_ms;
    if (j->cancelled && st == DSI_OK) st = DSI_ERR_CANCELLED; /* stopped by on_token */
    pthread_mutex_unlock(&j->mu);
    const char *msg = st == DSI_OK ? NULL : dsi_session_last_error(slot->session);
    if (st != DSI_OK && st != DSI_ERR_CANCELLED)
        slog(SLOG_ERROR, "slot %d: generation failed: %s", slot->index, msg);
    slog(SLOG_DEBUG, "slot %d: %s user=%s: prompt %llu (%llu reused), %llu generated, %s%.1f + %.1f ms",
         slot->index, j->id, j->user[0] ? j->user : "-", (unsigned long long)r.n_prompt,
         (unsigned long long)r.n_reused, (unsigned long long)r.n_generated,
         st == DSI_ERR_CANCELLED ? "cancelled, " : "", r.prefill_ms, r.decode_ms);
    if (j->out_failed && st == DSI_OK) {
        st = DSI_ERR_OUT_OF_HOST_MEMORY;
        msg = "out of memory while buffering the output";
    }
    slot_remember(slot);
    /* The slot is free before the client can learn that its job is done: a client that
     * sends its next request at once finds it idle (the queue limit stays exact). */
    srv_engine *e = slot->engine;
    pthread_mutex_lock(&e->mu);
    slot->busy = 0;
    slot->running = NULL;
    job_finish(j, st, msg);
    pthread_mutex_unlock(&e->mu);
}

static void *worker(void *arg) {
    srv_slot *slot = arg;
    srv_engine *e = slot->engine;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stopping && !slot->assigned && !e->q_head) pthread_cond_wait(&e->cv, &e->mu);
        srv_job *j = slot->assigned;
        slot->assigned = NULL;
        if (!j && e->q_head) {
            j = e->q_head;
            e->q_head = j->next;
            if (!e->q_head) e->q_tail = NULL;
            e->q_len--;
        }
        if (!j) break; /* stopping and nothing left */
        slot->busy = 1;
        slot->running = j;
        pthread_mutex_unlock(&e->mu);
        run_job(slot, j); /* marks the slot free (busy = 0) as it finishes the job */
        job_release(j);   /* the engine's reference */
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- the engine ---------------------------------------------------------------------- */

static void on_log(int32_t level, const char *message, void *user) {
    (void)user;
    slog(level, "libdsinfer: %s", message);
}

int engine_open(const srv_config *cfg, srv_engine **out) {
    *out = NULL;
    srv_engine *e = calloc(1, sizeof *e);
    if (!e) return -1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->max_queue = cfg->max_queue;

    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = cfg->n_threads;
    co.backend = cfg->backend;
    co.log_fn = on_log; /* the library logs only through the server's own sink */
    co.log_level = slog_level() < SLOG_NONE ? slog_level() : DSI_LOG_NONE;
    if (dsi_context_create(&co, &e->ctx) != DSI_OK) {
        slog(SLOG_ERROR, "cannot create the context: %s", dsi_last_error());
        engine_close(e);
        return -1;
    }
    /* Batching: the workers generate concurrently on sessions of one model; with
     * DSI_MODEL_FLAG_COALESCE the execution core's scheduler merges their steps into
     * shared batched steps (bit-identical results, per-session cancellation). */
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    if (!cfg->no_batch) mo.flags |= DSI_MODEL_FLAG_COALESCE;
    if (dsi_model_load(e->ctx, cfg->model_path, &mo, &e->model) != DSI_OK) {
        slog(SLOG_ERROR, "cannot load model '%s': %s", cfg->model_path, dsi_last_error());
        engine_close(e);
        return -1;
    }
    e->slots = calloc((size_t)cfg->parallel, sizeof *e->slots);
    if (!e->slots) {
        engine_close(e);
        return -1;
    }
    e->n_slots = cfg->parallel;
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = cfg->n_ctx;
    for (int i = 0; i < e->n_slots; i++) {
        srv_slot *s = &e->slots[i];
        s->index = i;
        s->engine = e;
        if (dsi_session_create(e->model, &so, &s->session) != DSI_OK) {
            slog(SLOG_ERROR, "cannot create session %d: %s", i, dsi_last_error());
            engine_close(e);
            return -1;
        }
    }
    /* the context each session really got (0 = the library's default) */
    {
        dsi_model_info mi;
        dsi_model_info_init(&mi);
        dsi_model_get_info(e->model, &mi);
        e->n_ctx = cfg->n_ctx ? cfg->n_ctx : (uint32_t)(mi.n_ctx_train < 4096 ? mi.n_ctx_train : 4096);
    }
    for (int i = 0; i < e->n_slots; i++) {
        if (pthread_create(&e->slots[i].thread, NULL, worker, &e->slots[i]) != 0) {
            slog(SLOG_ERROR, "cannot start worker %d", i);
            engine_close(e);
            return -1;
        }
        e->n_started++;
    }
    *out = e;
    return 0;
}

dsi_model *engine_model(srv_engine *e) { return e->model; }
uint32_t engine_n_ctx(srv_engine *e) { return e->n_ctx; }

int engine_submit(srv_engine *e, srv_job *j) {
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return 503;
    }
    /* the idle slot whose last timeline shares the longest prefix with the prompt */
    srv_slot *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < e->n_slots; i++) {
        srv_slot *s = &e->slots[i];
        if (s->busy || s->assigned) continue;
        size_t l = common_prefix(s->cached, s->n_cached, j->prompt, j->n_prompt);
        if (!best || l > best_len) {
            best = s;
            best_len = l;
        }
    }
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the engine's reference, released by the worker */
    pthread_mutex_unlock(&j->mu);
    if (best) {
        best->assigned = j;
    } else if (e->q_len >= e->max_queue) {
        pthread_mutex_unlock(&e->mu);
        job_release(j);
        return 429;
    } else {
        j->next = NULL;
        if (e->q_tail) e->q_tail->next = j;
        else e->q_head = j;
        e->q_tail = j;
        e->q_len++;
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void engine_stop(srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    for (srv_job *j = e->q_head; j; j = j->next) job_cancel(j, JOB_CANCEL_SHUTDOWN);
    for (int i = 0; i < e->n_slots; i++) {
        if (e->slots[i].assigned) job_cancel(e->slots[i].assigned, JOB_CANCEL_SHUTDOWN);
        if (e->slots[i].running) job_cancel(e->slots[i].running, JOB_CANCEL_SHUTDOWN);
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_stats(srv_engine *e, int *busy, int *idle, int *queued) {
    pthread_mutex_lock(&e->mu);
    int b = 0;
    for (int i = 0; i < e->n_slots; i++) b += e->slots[i].busy || e->slots[i].assigned;
    *busy = b;
    *idle = e->n_slots - b;
    *queued = e->q_len;
    pthread_mutex_unlock(&e->mu);
}

void engine_close(srv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->n_started; i++) pthread_join(e->slots[i].thread, NULL);
    for (int i = 0; i < e->n_slots; i++) {
        dsi_session_free(e->slots[i].session);
        free(e->slots[i].cached);
    }
    free(e->slots);
    dsi_model_free(e->model);
    dsi_context_free(e->ctx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
