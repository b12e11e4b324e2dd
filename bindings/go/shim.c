#include "shim.h"

#include <string.h>

#include "_cgo_export.h"

/* ---- counting allocator hooks (the library may call them from its worker threads) ---- */

static void *hook_malloc(size_t n, void *ud) {
    void *p = malloc(n);
    if (p) {
        dsigo_alloc_stats *s = ud;
        __atomic_add_fetch(&s->live, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&s->total, 1, __ATOMIC_SEQ_CST);
    }
    return p;
}

static void *hook_realloc(void *old, size_t n, void *ud) {
    void *p = realloc(old, n);
    if (p && !old) {
        dsigo_alloc_stats *s = ud;
        __atomic_add_fetch(&s->live, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&s->total, 1, __ATOMIC_SEQ_CST);
    }
    return p;
}

static void hook_free(void *p, void *ud) {
    if (p) {
        free(p);
        __atomic_sub_fetch(&((dsigo_alloc_stats *)ud)->live, 1, __ATOMIC_SEQ_CST);
    }
}

void dsigo_set_alloc_hooks(dsi_context_options *o, dsigo_alloc_stats *stats) {
    o->malloc_fn = hook_malloc;
    o->realloc_fn = hook_realloc;
    o->free_fn = hook_free;
    o->alloc_user_data = stats;
}

int64_t dsigo_alloc_live(dsigo_alloc_stats *s) { return __atomic_load_n(&s->live, __ATOMIC_SEQ_CST); }
int64_t dsigo_alloc_total(dsigo_alloc_stats *s) { return __atomic_load_n(&s->total, __ATOMIC_SEQ_CST); }

/* ---- callbacks: user_data carries a runtime/cgo.Handle ---------------------------------- */

static void log_tramp(int32_t level, const char *msg, void *ud) {
    goLogCallback(level, (char *)msg, (uintptr_t)ud);
}

static int32_t progress_tramp(int32_t stage, uint64_t done, uint64_t total, void *ud) {
    return goProgressCallback(stage, done, total, (uintptr_t)ud);
}

static int32_t token_tramp(dsi_token token, const char *text, size_t len, void *ud) {
    return goTokenCallback(token, (char *)text, len, (uintptr_t)ud);
}

/* Stream steps only need the token id: no call into Go. */
static int32_t capture_tramp(dsi_token token, const char *text, size_t len, void *ud) {
    (void)text;
    (void)len;
    if (token >= 0) *(dsi_token *)ud = token;
    return 1;
}

void dsigo_set_log(dsi_context_options *o, uintptr_t h) {
    o->log_fn = log_tramp;
    o->log_user_data = (void *)h;
}

void dsigo_set_progress(dsi_model_options *o, uintptr_t h) {
    o->progress_fn = progress_tramp;
    o->progress_user_data = (void *)h;
}

void dsigo_set_on_token(dsi_generate_options *o, uintptr_t h) {
    o->on_token = token_tramp;
    o->user_data = (void *)h;
}

void dsigo_set_capture(dsi_generate_options *o, dsi_token *slot) {
    o->on_token = capture_tramp;
    o->user_data = slot;
}

/* ---- padded init: a newer library's init may write more than our sizeof ----------------- */

#define PADDED_INIT(T, call)                                            \
    void dsigo_##T##_init(dsi_##T *o) {                                 \
        unsigned char *scratch = calloc(1, sizeof *o + 4096);           \
        memset(o, 0, sizeof *o);                                        \
        if (scratch) {                                                  \
            dsi_##T *s = (dsi_##T *)scratch;                            \
            call;                                                       \
            memcpy(o, scratch, sizeof *o);                              \
            free(scratch);                                              \
        }                                                               \
        o->struct_size = sizeof *o;                                     \
    }

PADDED_INIT(context_options, dsi_context_options_init(s, DSI_ABI_VERSION))
PADDED_INIT(model_options, dsi_model_options_init(s))
PADDED_INIT(session_options, dsi_session_options_init(s))
PADDED_INIT(sampler_options, dsi_sampler_options_init(s))
PADDED_INIT(generate_options, dsi_generate_options_init(s))
PADDED_INIT(chat_options, dsi_chat_options_init(s))
PADDED_INIT(chat_message, dsi_chat_message_init(s))
PADDED_INIT(model_info, dsi_model_info_init(s))
PADDED_INIT(device_info, dsi_device_info_init(s))
PADDED_INIT(generate_result, dsi_generate_result_init(s))
