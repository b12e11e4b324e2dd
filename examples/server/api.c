/*
 * The OpenAI request schema (jansson): a request body becomes a validated job, and jobs
 * become response objects (docs/server.md lists every field).
 *
 * Validation is strict, as OpenAI's own API is: an unknown field, a wrong type, a value
 * out of range, an unsupported option (n > 1, tools, logprobs, …) is a 400 naming the
 * parameter; the body must be one JSON object in valid UTF-8 without duplicate keys.
 */
#define _POSIX_C_SOURCE 200809L
#include "server.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_MESSAGES 4096
#define MAX_STOPS 4

static int fail(api_error *err, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int fail(api_error *err, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->http_status = status;
    err->type = status >= 500 ? "server_error" : "invalid_request_error";
    err->param = param;
    err->code = code;
    return status;
}

/* ---- fields ---------------------------------------------------------------------------- */

enum { F_CHAT = 1, F_COMPL = 2, F_BOTH = 3 };
static const struct {
    const char *name;
    int kinds;
} known_fields[] = {
    {"model", F_BOTH}, {"messages", F_CHAT}, {"prompt", F_COMPL}, {"stream", F_BOTH},
    {"stream_options", F_BOTH}, {"temperature", F_BOTH}, {"top_p", F_BOTH}, {"n", F_BOTH},
    {"max_tokens", F_BOTH}, {"max_completion_tokens", F_CHAT}, {"stop", F_BOTH},
    {"seed", F_BOTH}, {"frequency_penalty", F_BOTH}, {"presence_penalty", F_BOTH},
    {"logit_bias", F_BOTH}, {"user", F_BOTH}, {"logprobs", F_BOTH}, {"top_logprobs", F_CHAT},
    {"echo", F_COMPL}, {"suffix", F_COMPL}, {"best_of", F_COMPL},
    {"response_format", F_CHAT}, {"tools", F_CHAT}, {"tool_choice", F_CHAT},
    {"parallel_tool_calls", F_CHAT}, {"functions", F_CHAT}, {"function_call", F_CHAT},
    {"metadata", F_CHAT}, {"store", F_CHAT}, {"service_tier", F_BOTH},
    /* extensions (documented in docs/server.md) */
    {"top_k", F_BOTH}, {"min_p", F_BOTH}, {"repetition_penalty", F_BOTH},
};

static const char *const param_names[] = {
    "model", "messages", "prompt", "stream", "stream_options", "temperature", "top_p", "n",
    "max_tokens", "max_completion_tokens", "stop", "seed", "frequency_penalty",
    "presence_penalty", "logit_bias", "user", "logprobs", "top_logprobs", "echo", "suffix",
    "best_of", "response_format", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "metadata", "store", "service_tier", "top_k", "min_p",
    "repetition_penalty", "messages[].role", "messages[].content",
};

/* A static copy of a parameter name for api_error.param (which outlives the JSON). */
static const char *pname(const char *key) {
    for (size_t i = 0; i < sizeof param_names / sizeof *param_names; i++)
        if (!strcmp(param_names[i], key)) return param_names[i];
    return NULL;
}

static int check_fields(json_t *root, int kind, api_error *err) {
    const char *key;
    json_t *v;
    int bit = kind == JOB_CHAT ? F_CHAT : F_COMPL;
    json_object_foreach(root, key, v) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known_fields / sizeof *known_fields; i++)
            if (!strcmp(known_fields[i].name, key)) ok = (known_fields[i].kinds & bit) != 0;
        if (!ok) {
            /* the name is user data: print it escaped and bounded */
            char shown[64];
            size_t n = 0;
            for (const unsigned char *p = (const unsigned char *)key; *p && n + 5 < sizeof shown; p++) {
                if (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\') shown[n++] = (char)*p;
                else n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", *p);
            }
            shown[n] = 0;
            return fail(err, 400, NULL, "unknown_parameter", "Unrecognized request argument supplied: %s", shown);
        }
    }
    return 0;
}

static int get_number(json_t *root, const char *key, double lo, double hi, int lo_open,
                      double *out, api_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return fail(err, 400, pname(key), "invalid_type", "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        return fail(err, 400, pname(key), "invalid_value", "'%s' = %g is out of range: expected a number in %s%g, %g]",
                    key, x, lo_open ? "(" : "[", lo, hi);
    *out = x;
    return 0;
}

/* An integer (a real with an integral value is accepted too). */
static int get_int(json_t *root, const char *key, long long lo, long long hi, long long *out,
                   int *present, api_error *err) {
    json_t *v = json_object_get(root, key);
    if (present) *present = 0;
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9.0e15) {
        x = (long long)json_real_value(v);
    } else {
        return fail(err, 400, pname(key), "invalid_type", "'%s' must be an integer", key);
    }
    if (x < lo || x > hi)
        return fail(err, 400, pname(key), "invalid_value", "'%s' = %lld is out of range: expected an integer in %lld .. %lld",
                    key, x, lo, hi);
    *out = x;
    if (present) *present = 1;
    return 0;
}

static int get_bool(json_t *root, const char *key, int *out, api_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(err, 400, pname(key), "invalid_type", "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* Fields accepted only with their neutral value. */
static int only_neutral(json_t *root, api_error *err) {
    json_t *v;
    if ((v = json_object_get(root, "logprobs")) && !json_is_null(v) && !json_is_false(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 0))
        return fail(err, 400, "logprobs", "unsupported_parameter", "'logprobs' is not supported by this server");
    if ((v = json_object_get(root, "top_logprobs")) && !json_is_null(v))
        return fail(err, 400, "top_logprobs", "unsupported_parameter", "'top_logprobs' is not supported by this server");
    if ((v = json_object_get(root, "echo")) && !json_is_null(v) && !json_is_false(v))
        return fail(err, 400, "echo", "unsupported_parameter", "'echo' is not supported by this server");
    if ((v = json_object_get(root, "suffix")) && !json_is_null(v))
        return fail(err, 400, "suffix", "unsupported_parameter", "'suffix' is not supported by this server");
    if ((v = json_object_get(root, "best_of")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        return fail(err, 400, "best_of", "unsupported_parameter", "'best_of' must be 1");
    const char *const tools[] = {"tools", "functions"};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(root, tools[i])) && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            return fail(err, 400, pname(tools[i]), "unsupported_parameter", "'%s' (tool calling) is not supported by this server", tools[i]);
    const char *const choice[] = {"tool_choice", "function_call"};
    for (int i = 0; i < 2; i++)
        if ((v = json_object_get(root, choice[i])) && !json_is_null(v) &&
            !(json_is_string(v) && (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))))
            return fail(err, 400, pname(choice[i]), "unsupported_parameter", "'%s' is not supported by this server", choice[i]);
    if ((v = json_object_get(root, "parallel_tool_calls")) && !json_is_null(v) && !json_is_boolean(v))
        return fail(err, 400, "parallel_tool_calls", "invalid_type", "'parallel_tool_calls' must be a boolean");
    if ((v = json_object_get(root, "response_format")) && !json_is_null(v)) {
        json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!t || !json_is_string(t) || strcmp(json_string_value(t), "text"))
            return fail(err, 400, "response_format", "unsupported_parameter", "only response_format {\"type\": \"text\"} is supported");
    }
    if ((v = json_object_get(root, "user")) && !json_is_null(v) && !json_is_string(v))
        return fail(err, 400, "user", "invalid_type", "'user' must be a string");
    if ((v = json_object_get(root, "metadata")) && !json_is_null(v) && !json_is_object(v))
        return fail(err, 400, "metadata", "invalid_type", "'metadata' must be an object");
    if ((v = json_object_get(root, "store")) && !json_is_null(v) && !json_is_boolean(v))
        return fail(err, 400, "store", "invalid_type", "'store' must be a boolean");
    if ((v = json_object_get(root, "service_tier")) && !json_is_null(v) && !json_is_string(v))
        return fail(err, 400, "service_tier", "invalid_type", "'service_tier' must be a string");
    return 0;
}

/* ---- prompts ---------------------------------------------------------------------------- */

static dsi_token *tokenize(dsi_model *m, const char *text, size_t len, uint32_t flags, size_t *n,
                           api_error *err) {
    size_t need = 0;
    dsi_status st = dsi_tokenize(m, text, len, flags, NULL, 0, &need);
    if (st != DSI_OK && need == 0) {
        fail(err, 400, NULL, NULL, "cannot tokenize the prompt: %s", dsi_last_error());
        return NULL;
    }
    dsi_token *t = malloc((need ? need : 1) * sizeof *t);
    if (!t) {
        fail(err, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    if (dsi_tokenize(m, text, len, flags, t, need, n) != DSI_OK) {
        fail(err, 400, NULL, NULL, "cannot tokenize the prompt: %s", dsi_last_error());
        free(t);
        return NULL;
    }
    return t;
}

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) return 0;
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

/* The content of one message: a string, null, or an array of {"type":"text"} parts. */
static int message_text(json_t *c, size_t i, int allow_null, sbuf *out, api_error *err) {
    if (!c || json_is_null(c)) {
        if (!allow_null)
            return fail(err, 400, "messages[].content", "invalid_value", "messages[%zu].content is missing", i);
        return 0;
    }
    if (json_is_string(c)) return sb_add(out, json_string_value(c), json_string_length(c)) ? 0 : fail(err, 500, NULL, NULL, "out of memory");
    if (!json_is_array(c))
        return fail(err, 400, "messages[].content", "invalid_type", "messages[%zu].content must be a string or an array of text parts", i);
    size_t k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!type || !json_is_string(type) || strcmp(json_string_value(type), "text"))
            return fail(err, 400, "messages[].content", "unsupported_parameter",
                        "messages[%zu].content[%zu]: only parts of type \"text\" are supported", i, k);
        if (!text || !json_is_string(text))
            return fail(err, 400, "messages[].content", "invalid_type", "messages[%zu].content[%zu].text must be a string", i, k);
        if (!sb_add(out, json_string_value(text), json_string_length(text))) return fail(err, 500, NULL, NULL, "out of memory");
    }
    return 0;
}

/* The prompt of a chat request as token ids, through dsi_chat_tokenize: the template's
 * structure becomes special tokens and every message's content is tokenized as plain
 * text, so a client cannot forge turns by typing special-token text. */
static int chat_prompt(dsi_model *m, json_t *msgs, srv_job *job, api_error *err) {
    if (!json_is_array(msgs))
        return fail(err, 400, "messages", "invalid_type", "'messages' must be an array");
    size_t n = json_array_size(msgs);
    if (n == 0) return fail(err, 400, "messages", "invalid_value", "'messages' must contain at least one message");
    if (n > MAX_MESSAGES) return fail(err, 400, "messages", "invalid_value", "too many messages (%zu; at most %d)", n, MAX_MESSAGES);
    dsi_chat_message *cm = calloc(n, sizeof *cm);
    const dsi_chat_message **ptrs = calloc(n, sizeof *ptrs);
    sbuf *texts = calloc(n, sizeof *texts);
    int rc = 0;
    if (!cm || !ptrs || !texts) {
        rc = fail(err, 500, NULL, NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *msg = json_array_get(msgs, i);
        if (!json_is_object(msg)) {
            rc = fail(err, 400, "messages", "invalid_type", "messages[%zu] must be an object", i);
            break;
        }
        const char *key;
        json_t *v;
        json_object_foreach(msg, key, v) {
            if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name") &&
                strcmp(key, "tool_call_id") && strcmp(key, "reasoning_content") && strcmp(key, "tool_calls") &&
                strcmp(key, "refusal")) {
                rc = fail(err, 400, "messages", "unknown_parameter", "messages[%zu]: unrecognized field", i);
                break;
            }
            if ((!strcmp(key, "name") || !strcmp(key, "tool_call_id")) && !json_is_string(v) && !json_is_null(v)) {
                rc = fail(err, 400, "messages", "invalid_type", "messages[%zu].%s must be a string", i,
                          !strcmp(key, "name") ? "name" : "tool_call_id");
                break;
            }
        }
        if (rc) break;
        json_t *role = json_object_get(msg, "role");
        const char *r = role && json_is_string(role) ? json_string_value(role) : NULL;
        dsi_chat_message_init(&cm[i]);
        if (!r) {
            rc = fail(err, 400, "messages[].role", "invalid_type", "messages[%zu].role must be a string", i);
        } else if (!strcmp(r, "system") || !strcmp(r, "developer")) {
            cm[i].role = DSI_ROLE_SYSTEM;
        } else if (!strcmp(r, "user")) {
            cm[i].role = DSI_ROLE_USER;
        } else if (!strcmp(r, "assistant")) {
            cm[i].role = DSI_ROLE_ASSISTANT;
        } else if (!strcmp(r, "tool")) {
            cm[i].role = DSI_ROLE_TOOL;
        } else {
            rc = fail(err, 400, "messages[].role", "invalid_value",
                      "messages[%zu].role must be one of system, developer, user, assistant, tool", i);
        }
        if (rc) break;
        json_t *calls = json_object_get(msg, "tool_calls");
        if (calls && !json_is_null(calls) && !(json_is_array(calls) && json_array_size(calls) == 0)) {
            rc = fail(err, 400, "messages", "unsupported_parameter", "messages[%zu].tool_calls: tool calling is not supported by this server", i);
            break;
        }
        rc = message_text(json_object_get(msg, "content"), i, cm[i].role == DSI_ROLE_ASSISTANT, &texts[i], err);
        if (rc) break;
        cm[i].content = texts[i].p ? texts[i].p : "";
        json_t *rs = json_object_get(msg, "reasoning_content");
        if (rs && !json_is_null(rs)) {
            if (!json_is_string(rs) || cm[i].role != DSI_ROLE_ASSISTANT) {
                rc = fail(err, 400, "messages", "invalid_value", "messages[%zu].reasoning_content must be a string, on an assistant message", i);
                break;
            }
            cm[i].reasoning = json_string_value(rs);
        }
        ptrs[i] = &cm[i];
    }
    if (rc) goto out;
    size_t need = 0;
    dsi_chat_options co;
    dsi_chat_options_init(&co);
    if (dsi_chat_tokenize(m, ptrs, n, &co, NULL, 0, &need) != DSI_OK && need == 0) {
        rc = fail(err, 400, "messages", NULL, "%s", dsi_last_error());
        goto out;
    }
    job->prompt = malloc((need ? need : 1) * sizeof *job->prompt);
    if (!job->prompt) {
        rc = fail(err, 500, NULL, NULL, "out of memory");
        goto out;
    }
    if (dsi_chat_tokenize(m, ptrs, n, &co, job->prompt, need, &job->n_prompt) != DSI_OK)
        rc = fail(err, 400, "messages", NULL, "%s", dsi_last_error());
out:
    if (texts)
        for (size_t i = 0; i < n; i++) free(texts[i].p);
    free(texts);
    free(ptrs);
    free(cm);
    return rc;
}

/* The prompt of a completion request: a string, one string in an array, an array of
 * token ids, or one such array in an array. Text gets BOS, as dsinfer-cli does. */
static int completion_prompt(dsi_model *m, json_t *p, int32_t n_vocab, srv_job *job, api_error *err) {
    if (!p || json_is_null(p)) return fail(err, 400, "prompt", "invalid_value", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        job->prompt = tokenize(m, json_string_value(p), json_string_length(p), DSI_TOKENIZE_ADD_BOS, &job->n_prompt, err);
        return job->prompt ? 0 : err->http_status;
    }
    if (!json_is_array(p))
        return fail(err, 400, "prompt", "invalid_type", "'prompt' must be a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0) return fail(err, 400, "prompt", "invalid_value", "'prompt' is empty");
    job->prompt = malloc(n * sizeof *job->prompt);
    if (!job->prompt) return fail(err, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, i);
        if (json_is_string(t) || json_is_array(t))
            return fail(err, 400, "prompt", "unsupported_parameter", "only one prompt per request is supported");
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return fail(err, 400, "prompt", "invalid_value", "prompt[%zu] is not a token id in 0 .. %d", i, (int)n_vocab - 1);
        job->prompt[i] = (dsi_token)json_integer_value(t);
    }
    job->n_prompt = n;
    return 0;
}

static int parse_stop(json_t *root, srv_job *job, api_error *err) {
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s)) return 0;
    size_t n = json_is_string(s) ? 1 : json_is_array(s) ? json_array_size(s) : 0;
    if (!json_is_string(s) && !json_is_array(s))
        return fail(err, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
    if (n > MAX_STOPS) return fail(err, 400, "stop", "invalid_value", "'stop' has %zu entries; at most %d", n, MAX_STOPS);
    job->stops = calloc(n ? n : 1, sizeof *job->stops);
    if (!job->stops) return fail(err, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_string(s) ? s : json_array_get(s, i);
        if (!json_is_string(e)) return fail(err, 400, "stop", "invalid_type", "stop[%zu] must be a string", i);
        size_t l = json_string_length(e);
        if (l == 0) return fail(err, 400, "stop", "invalid_value", "stop[%zu] is empty", i);
        if (memchr(json_string_value(e), 0, l)) return fail(err, 400, "stop", "invalid_value", "stop[%zu] contains a NUL character", i);
        job->stops[i] = strdup(json_string_value(e));
        if (!job->stops[i]) return fail(err, 500, NULL, NULL, "out of memory");
        job->n_stops = i + 1;
    }
    return 0;
}

static uint64_t next_random(void) {
    static uint64_t counter;
    uint64_t c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (c * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31; /* splitmix64 finaliser */
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int api_parse_request(srv_engine *e, const srv_config *cfg, int kind, const char *body, size_t len,
                      srv_job *job, api_error *err) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fail(err, 400, NULL, "invalid_json", "the request body is not valid JSON (line %d, column %d): %s",
                    je.line, je.column, je.text);
    int rc = 0;
    dsi_model *m = engine_model(e);
    dsi_model_info mi;
    dsi_model_info_init(&mi);
    dsi_model_get_info(m, &mi);
    const uint32_t n_ctx = engine_n_ctx(e);
    double temperature = 1.0, top_p = 1.0, fpen = 0, ppen = 0, min_p = 0, rep = 1.0;
    long long n = 1, seed = 0, max_tokens = 0, top_k = 0;
    int has_seed = 0, has_max = 0, has_max2 = 0, include_usage = 0;
    json_t *v;
#define TRY(x) do { if ((rc = (x)) != 0) goto out; } while (0)
    if (!json_is_object(root)) TRY(fail(err, 400, NULL, "invalid_json", "the request body must be a JSON object"));
    TRY(check_fields(root, kind, err));
    v = json_object_get(root, "model");
    if (!v) TRY(fail(err, 400, "model", "missing_required_parameter", "you must provide a model parameter"));
    if (!json_is_string(v)) TRY(fail(err, 400, "model", "invalid_type", "'model' must be a string"));
    TRY(get_bool(root, "stream", &job->stream, err));
    if ((v = json_object_get(root, "stream_options")) && !json_is_null(v)) {
        if (!json_is_object(v)) TRY(fail(err, 400, "stream_options", "invalid_type", "'stream_options' must be an object"));
        if (!job->stream) TRY(fail(err, 400, "stream_options", "invalid_value", "'stream_options' is only allowed with \"stream\": true"));
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            if (strcmp(key, "include_usage"))
                TRY(fail(err, 400, "stream_options", "unknown_parameter", "stream_options: unrecognized field"));
        }
        TRY(get_bool(v, "include_usage", &include_usage, err));
    }
    TRY(get_int(root, "n", 1, 1, &n, NULL, err) ? fail(err, 400, "n", "unsupported_parameter", "'n' must be 1 (one choice per request)") : 0);
    TRY(get_number(root, "temperature", 0, 2, 0, &temperature, err));
    TRY(get_number(root, "top_p", 0, 1, 1, &top_p, err));
    TRY(get_number(root, "frequency_penalty", -2, 2, 0, &fpen, err));
    TRY(get_number(root, "presence_penalty", -2, 2, 0, &ppen, err));
    TRY(get_number(root, "min_p", 0, 0.999999, 0, &min_p, err));
    TRY(get_number(root, "repetition_penalty", 0, 10, 1, &rep, err));
    TRY(get_int(root, "top_k", 0, 1 << 30, &top_k, NULL, err));
    TRY(get_int(root, "seed", INT64_MIN, INT64_MAX, &seed, &has_seed, err));
    TRY(get_int(root, "max_tokens", 1, cfg->max_tokens, &max_tokens, &has_max, err));
    if (kind == JOB_CHAT) {
        long long m2 = 0;
        TRY(get_int(root, "max_completion_tokens", 1, cfg->max_tokens, &m2, &has_max2, err));
        if (has_max2) {
            max_tokens = m2;
            has_max = 1;
        }
    }
    TRY(only_neutral(root, err));
    TRY(parse_stop(root, job, err));

    /* logit_bias: {"token id": bias in [-100, 100]} */
    dsi_logit_bias *bias = NULL;
    size_t n_bias = 0;
    if ((v = json_object_get(root, "logit_bias")) && !json_is_null(v)) {
        if (!json_is_object(v)) TRY(fail(err, 400, "logit_bias", "invalid_type", "'logit_bias' must be an object"));
        bias = calloc(json_object_size(v) + 1, sizeof *bias);
        if (!bias) TRY(fail(err, 500, NULL, NULL, "out of memory"));
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            char *end;
            long t = strtol(key, &end, 10);
            if (!*key || *end || t < 0 || t >= mi.n_vocab || !json_is_number(x) ||
                fabs(json_number_value(x)) > 100) {
                free(bias);
                TRY(fail(err, 400, "logit_bias", "invalid_value",
                         "logit_bias: keys must be token ids in 0 .. %d and values numbers in [-100, 100]", (int)mi.n_vocab - 1));
            }
            bias[n_bias].token = (dsi_token)t;
            bias[n_bias].bias = (float)json_number_value(x);
            n_bias++;
        }
    }

    dsi_sampler_options so;
    dsi_sampler_options_init(&so);
    so.temperature = (float)temperature;
    so.top_p = (float)top_p;
    so.top_k = (int32_t)top_k;
    so.min_p = (float)min_p;
    so.repetition_penalty = (float)rep;
    so.frequency_penalty = (float)fpen;
    so.presence_penalty = (float)ppen;
    so.seed = has_seed ? (uint64_t)seed : next_random();
    so.logit_bias = bias;
    so.n_logit_bias = n_bias;
    dsi_status sst = dsi_sampler_create(&so, &job->sampler);
    free(bias);
    if (sst != DSI_OK) TRY(fail(err, 400, NULL, "invalid_value", "%s", dsi_last_error()));

    if (kind == JOB_CHAT) {
        TRY(chat_prompt(m, json_object_get(root, "messages"), job, err));
        dsi_token user = -1;
        if (dsi_model_special_token(m, DSI_SPECIAL_USER, &user) == DSI_OK) job->stop_tokens[job->n_stop_tokens++] = user;
    } else {
        TRY(completion_prompt(m, json_object_get(root, "prompt"), mi.n_vocab, job, err));
    }
    if (job->n_prompt >= n_ctx)
        TRY(fail(err, 400, "messages", "context_length_exceeded",
                 "This model's maximum context length is %u tokens. However, your prompt has %zu tokens.",
                 (unsigned)n_ctx, job->n_prompt));
    if (has_max && job->n_prompt + (size_t)max_tokens > n_ctx)
        TRY(fail(err, 400, "max_tokens", "context_length_exceeded",
                 "This model's maximum context length is %u tokens. However, you requested %zu tokens "
                 "(%zu in the prompt, %lld in the completion).",
                 (unsigned)n_ctx, job->n_prompt + (size_t)max_tokens, job->n_prompt, max_tokens));
    if (!has_max) {
        long long room = (long long)n_ctx - (long long)job->n_prompt;
        max_tokens = kind == JOB_CHAT ? cfg->max_tokens : 16; /* OpenAI's completions default */
        if (max_tokens > room) max_tokens = room;
    }
    job->max_tokens = (int32_t)max_tokens;
    job->include_usage = include_usage;
    job->kind = kind;
    snprintf(job->id, sizeof job->id, "%s-%016llx%08llx", kind == JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)next_random(), (unsigned long long)(next_random() & 0xffffffffu));
    job->created = (long long)time(NULL);
    if ((v = json_object_get(root, "user")) && json_is_string(v)) {
        size_t k = 0;
        for (const char *p = json_string_value(v); *p && k + 1 < sizeof job->user; p++)
            job->user[k++] = (*p >= 0x21 && *p < 0x7f) ? *p : '_'; /* printable ASCII for the log */
        job->user[k] = 0;
    }
out:
#undef TRY
    json_decref(root);
    return rc;
}

/* ---- responses -------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s[0..n) (Unicode Table 3-7), 0 if none. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t l;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) l = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        l = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        l = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (n < l || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < l; k++)
        if (s[k] < 0x80 || s[k] > 0xBF) return 0;
    return l;
}

/* A JSON string of generated text. The library delivers valid UTF-8; anything else would
 * be replaced byte by byte with U+FFFD rather than dropped. */
static json_t *text_json(const char *s, size_t n) {
    json_t *j = json_stringn(s ? s : "", n);
    if (j || !s) return j;
    sbuf b = {0};
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k) sb_add(&b, s + i, k);
        else sb_add(&b, "\xEF\xBF\xBD", 3);
        i += k ? k : 1;
    }
    j = json_stringn(b.p ? b.p : "", b.n);
    free(b.p);
    return j;
}

static char *dump(json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

const char *api_finish_reason(int32_t f) {
    return f == DSI_FINISH_LENGTH || f == DSI_FINISH_CONTEXT_FULL ? "length" : "stop";
}

static const char *fingerprint(void) {
    static char fp[48];
    if (!fp[0]) snprintf(fp, sizeof fp, "dsinfer-%s", dsi_version_string());
    return fp;
}

static json_t *usage_json(const srv_job *j) {
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)j->n_prompt_tokens,
                     "completion_tokens", (json_int_t)j->n_generated,
                     "total_tokens", (json_int_t)(j->n_prompt_tokens + j->n_generated));
}

char *api_error_json(const api_error *e) {
    return dump(json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", e->message, "type",
                          e->type ? e->type : "invalid_request_error", "param", e->param, "code", e->code));
}

char *api_models_json(const srv_config *cfg, long long created, const char *only_id) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", cfg->model_name, "object", "model", "created",
                          (json_int_t)created, "owned_by", "dsinfer");
    if (only_id) return dump(m);
    return dump(json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

char *api_final_json(const srv_config *cfg, const srv_job *j, const char *text, size_t n) {
    json_t *choice;
    if (j->kind == JOB_CHAT)
        choice = json_pack("{s:i,s:{s:s,s:o},s:n,s:s}", "index", 0, "message", "role", "assistant", "content",
                           text_json(text, n), "logprobs", "finish_reason", api_finish_reason(j->finish_reason));
    else
        choice = json_pack("{s:o,s:i,s:n,s:s}", "text", text_json(text, n), "index", 0, "logprobs",
                           "finish_reason", api_finish_reason(j->finish_reason));
    return dump(json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o}", "id", j->id, "object",
                          j->kind == JOB_CHAT ? "chat.completion" : "text_completion", "created",
                          (json_int_t)j->created, "model", cfg->model_name, "system_fingerprint",
                          fingerprint(), "choices", choice, "usage", usage_json(j)));
}

char *api_chunk_json(const srv_config *cfg, const srv_job *j, const char *text, size_t n, int role_chunk,
                     int final_chunk) {
    json_t *fr = final_chunk ? json_string(api_finish_reason(j->finish_reason)) : json_null();
    json_t *choice;
    if (j->kind == JOB_CHAT) {
        json_t *delta = role_chunk ? json_pack("{s:s,s:s}", "role", "assistant", "content", "")
                        : final_chunk ? json_object()
                                      : json_pack("{s:o}", "content", text_json(text, n));
        choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs", "finish_reason", fr);
    } else {
        choice = json_pack("{s:o,s:i,s:n,s:o}", "text", text_json(final_chunk ? "" : text, final_chunk ? 0 : n),
                           "index", 0, "logprobs", "finish_reason", fr);
    }
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o]}", "id", j->id, "object",
                          j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", cfg->model_name, "system_fingerprint",
                          fingerprint(), "choices", choice);
    if (c && j->include_usage) json_object_set_new(c, "usage", json_null());
    return dump(c);
}

char *api_usage_chunk_json(const srv_config *cfg, const srv_job *j) {
    return dump(json_pack("{s:s,s:s,s:I,s:s,s:s,s:[],s:o}", "id", j->id, "object",
                          j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", cfg->model_name, "system_fingerprint",
                          fingerprint(), "choices", "usage", usage_json(j)));
}

char *api_shutdown_error_json(void) {
    return dump(json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", "the server is shutting down", "type",
                          "server_error", "param", "code", "shutting_down"));
}

char *api_stream_error_json(const srv_job *j) {
    char msg[300];
    snprintf(msg, sizeof msg, "generation failed: %s", j->error[0] ? j->error : dsi_status_string(j->status));
    return dump(json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type", "server_error", "param", "code"));
}
