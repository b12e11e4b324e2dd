/* Public chat rendering (include/dsinfer.h "Chat rendering"): options and argument checks
 * around lib/tokenizer/chat.c; dsi_chat_tokenize tokenizes the rendering with special tokens
 * parsed only in the template's own bytes. */
#include "base/base.h"
#include "model/model.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

DSI_API void dsi_chat_message_init(dsi_chat_message *msg) { dsii_chat_message_defaults(msg); }

DSI_API void dsi_chat_options_init(dsi_chat_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->thinking = DSI_THINKING_OFF;
    opt->add_generation_prompt = 1;
    opt->add_bos = 1;
}

/* Argument and option checks shared by dsi_chat_render and dsi_chat_tokenize; the effective
 * options land in `o`. Errors are recorded on the model. */
static dsi_status chat_args(const dsi_model *model, const char *fn, const void *buf, size_t cap,
                            const size_t *n_needed, const dsi_chat_options *opt,
                            dsi_chat_options *o) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    dsi_model *mm = (dsi_model *)(uintptr_t)model; /* error slot only (locked) */
    dsii_error e;
    dsii_error_clear(&e);
    if (!n_needed) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "%s: n_needed is NULL", fn);
        return dsii_model_fail(mm, &e);
    }
    if (!buf && cap > 0) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "%s: output buffer is NULL but cap is %zu", fn, cap);
        return dsii_model_fail(mm, &e);
    }
    dsi_chat_options_init(o);
    if (dsii_read_options(o, sizeof *o, opt, "dsi_chat_options", &e) != DSI_OK)
        return dsii_model_fail(mm, &e);
    if (o->thinking < DSI_THINKING_OFF || o->thinking > DSI_THINKING_MAX) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_chat_options.thinking = %d is not a DSI_THINKING_* value", (int)o->thinking);
        return dsii_model_fail(mm, &e);
    }
    if ((o->add_generation_prompt != 0 && o->add_generation_prompt != 1) || (o->add_bos != 0 && o->add_bos != 1)) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_chat_options.%s must be 0 or 1",
                  (o->add_generation_prompt != 0 && o->add_generation_prompt != 1) ? "add_generation_prompt" : "add_bos");
        return dsii_model_fail(mm, &e);
    }
    return DSI_OK;
}

DSI_API dsi_status dsi_chat_render(const dsi_model *model,
                                   const dsi_chat_message *const *messages, size_t n,
                                   const dsi_chat_options *opt, char *buf, size_t cap,
                                   size_t *n_needed) {
    dsi_chat_options o;
    dsi_status st = chat_args(model, "dsi_chat_render", buf, cap, n_needed, opt, &o);
    if (st != DSI_OK) return st;
    dsi_model *mm = (dsi_model *)(uintptr_t)model;
    dsii_error e;
    dsii_error_clear(&e);
    char *text = NULL;
    size_t len = 0;
    if (dsii_chat_render(model->ctx, messages, n, &o, &text, &len, &e) != DSI_OK)
        return dsii_model_fail(mm, &e);
    *n_needed = len;
    if (len > cap) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_chat_render: %zu bytes do not fit in cap %zu", len, cap);
        st = dsii_model_fail(mm, &e);
    } else {
        memcpy(buf, text, len);
        if (cap > len) buf[len] = 0;
    }
    dsii_free(model->ctx, text);
    return st;
}

DSI_API dsi_status dsi_chat_tokenize(const dsi_model *model,
                                     const dsi_chat_message *const *messages, size_t n,
                                     const dsi_chat_options *opt, dsi_token *tokens, size_t cap,
                                     size_t *n_needed) {
    dsi_chat_options o;
    dsi_status st = chat_args(model, "dsi_chat_tokenize", tokens, cap, n_needed, opt, &o);
    if (st != DSI_OK) return st;
    dsi_model *mm = (dsi_model *)(uintptr_t)model;
    dsii_error e;
    dsii_error_clear(&e);
    if (!model->tokenizer) {
        dsii_fail(&e, DSI_ERR_UNSUPPORTED, "dsi_chat_tokenize: the model has no tokenizer");
        return dsii_model_fail(mm, &e);
    }
    char *text = NULL;
    uint8_t *tmpl = NULL;
    size_t len = 0;
    if (dsii_chat_render_masked(model->ctx, messages, n, &o, &text, &len, &tmpl, &e) != DSI_OK)
        return dsii_model_fail(mm, &e);
    /* special tokens only where the template put them: message text stays plain text */
    st = dsii_tokenize_masked(model->tokenizer, text, len, tmpl, 0, tokens, cap, n_needed, &e);
    if (st != DSI_OK) {
        if (st == DSI_ERR_INVALID_ARGUMENT) /* too small: say which call */
            dsii_fail(&e, st, "dsi_chat_tokenize: %zu tokens do not fit in cap %zu", *n_needed, cap);
        st = dsii_model_fail(mm, &e);
    }
    dsii_free(model->ctx, text);
    dsii_free(model->ctx, tmpl);
    return st;
}
