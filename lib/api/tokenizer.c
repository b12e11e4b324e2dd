/* Public tokenizer functions (include/dsinfer.h "Tokenizer"): argument checks around
 * lib/tokenizer. Errors are recorded on the model (dsi_model_last_error) and the thread. */
#include "base/base.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

struct dsi_detokenizer {
    const dsi_model *model;
    dsii_utf8_stream utf8;
};

static dsi_status model_fail(const dsi_model *m, dsii_error *e) {
    /* The model's error slot is guarded by its own lock, so recording from a const
     * (thread-safe) query is allowed. */
    return dsii_model_fail((dsi_model *)(uintptr_t)m, e);
}

static dsi_status get_tok(const dsi_model *m, const char *fn, const dsii_tokenizer **t) {
    if (!m) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    if (!m->tokenizer) {
        dsii_error e;
        dsii_fail(&e, DSI_ERR_UNSUPPORTED, "%s: the model has no tokenizer", fn);
        return model_fail(m, &e);
    }
    *t = m->tokenizer;
    return DSI_OK;
}

DSI_API dsi_status dsi_tokenize(const dsi_model *model, const char *text, size_t len,
                                uint32_t flags, dsi_token *tokens, size_t cap,
                                size_t *n_needed) {
    const dsii_tokenizer *t = NULL;
    dsi_status st = get_tok(model, "dsi_tokenize", &t);
    if (st != DSI_OK) return st;
    dsii_error e;
    dsii_error_clear(&e);
    if (!n_needed) dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_tokenize: n_needed is NULL");
    else if (!text && len > 0) dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_tokenize: text is NULL but len is %zu", len);
    else if (!tokens && cap > 0) dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_tokenize: tokens is NULL but cap is %zu", cap);
    if (e.status != DSI_OK) return model_fail(model, &e);
    st = dsii_tokenize(t, text, len, flags, tokens, cap, n_needed, &e);
    return st == DSI_OK ? DSI_OK : model_fail(model, &e);
}

DSI_API dsi_status dsi_token_to_bytes(const dsi_model *model, dsi_token token, char *buf,
                                      size_t cap, size_t *n_needed) {
    const dsii_tokenizer *t = NULL;
    dsi_status st = get_tok(model, "dsi_token_to_bytes", &t);
    if (st != DSI_OK) return st;
    dsii_error e;
    if (!n_needed || (!buf && cap > 0)) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_token_to_bytes: %s is NULL",
                  !n_needed ? "n_needed" : "buf (with cap > 0)");
        return model_fail(model, &e);
    }
    size_t len;
    const uint8_t *p = dsii_tokenizer_token_bytes(t, token, &len);
    if (!p) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_token_to_bytes: token %d outside the vocabulary (0 .. %d)",
                  (int)token, (int)dsii_tokenizer_n_vocab(t) - 1);
        return model_fail(model, &e);
    }
    *n_needed = len;
    if (len > cap) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_token_to_bytes: %zu bytes do not fit in cap %zu", len, cap);
        return model_fail(model, &e);
    }
    if (len) memcpy(buf, p, len);
    return DSI_OK;
}

DSI_API dsi_status dsi_detokenize(const dsi_model *model, const dsi_token *tokens, size_t n,
                                  char *buf, size_t cap, size_t *n_needed) {
    const dsii_tokenizer *t = NULL;
    dsi_status st = get_tok(model, "dsi_detokenize", &t);
    if (st != DSI_OK) return st;
    dsii_error e;
    if (!n_needed || (!tokens && n > 0) || (!buf && cap > 0)) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenize: %s is NULL",
                  !n_needed ? "n_needed" : (!tokens && n > 0) ? "tokens (with n > 0)" : "buf (with cap > 0)");
        return model_fail(model, &e);
    }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        if (!dsii_tokenizer_token_bytes(t, tokens[i], &l)) {
            dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenize: tokens[%zu] = %d outside the vocabulary (0 .. %d)",
                      i, (int)tokens[i], (int)dsii_tokenizer_n_vocab(t) - 1);
            return model_fail(model, &e);
        }
        total += l;
    }
    *n_needed = total;
    if (total > cap) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenize: %zu bytes do not fit in cap %zu", total, cap);
        return model_fail(model, &e);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *p = dsii_tokenizer_token_bytes(t, tokens[i], &l);
        if (l) memcpy(buf + o, p, l);
        o += l;
    }
    return DSI_OK;
}

DSI_API dsi_status dsi_model_special_token(const dsi_model *model, int32_t which,
                                           dsi_token *token) {
    const dsii_tokenizer *t = NULL;
    dsi_status st = get_tok(model, "dsi_model_special_token", &t);
    if (st != DSI_OK) return st;
    dsii_error e;
    if (!token) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_model_special_token: token is NULL");
        return model_fail(model, &e);
    }
    if (which < DSI_SPECIAL_BOS || which > DSI_SPECIAL_THINK_END) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_model_special_token: unknown DSI_SPECIAL_* value %d", (int)which);
        return model_fail(model, &e);
    }
    dsi_token id = dsii_tokenizer_special(t, which);
    if (id < 0) {
        static const char *const names[7] = {"BOS", "EOS", "PAD", "User", "Assistant", "<think>", "</think>"};
        dsii_fail(&e, DSI_ERR_NOT_FOUND, "dsi_model_special_token: the vocabulary has no %s token", names[which]);
        return model_fail(model, &e);
    }
    *token = id;
    return DSI_OK;
}

DSI_API dsi_status dsi_detokenizer_create(const dsi_model *model, dsi_detokenizer **out) {
    if (out) *out = NULL;
    if (!out) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_create: out is NULL");
    const dsii_tokenizer *t = NULL;
    dsi_status st = get_tok(model, "dsi_detokenizer_create", &t);
    if (st != DSI_OK) return st;
    dsi_detokenizer *d = dsii_calloc(model->ctx, 1, sizeof *d);
    if (!d) return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_detokenizer_create: out of memory");
    d->model = model;
    /* counted: dsi_model_free is BUSY while a detokenizer still points at the model */
    atomic_fetch_add_explicit(&((dsi_model *)(uintptr_t)model)->n_detokenizers, 1,
                              memory_order_acq_rel);
    *out = d;
    return DSI_OK;
}

DSI_API dsi_status dsi_detokenizer_feed(dsi_detokenizer *d, dsi_token token, char *buf,
                                        size_t cap, size_t *n_needed) {
    if (!d) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_feed: detokenizer is NULL");
    dsii_error e;
    if (!n_needed || (!buf && cap > 0)) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_feed: %s is NULL",
                  !n_needed ? "n_needed" : "buf (with cap > 0)");
        return model_fail(d->model, &e);
    }
    size_t l;
    const uint8_t *p = dsii_tokenizer_token_bytes(d->model->tokenizer, token, &l);
    if (!p) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_feed: token %d outside the vocabulary", (int)token);
        return model_fail(d->model, &e);
    }
    uint8_t small[64];
    size_t bound = dsii_utf8_stream_bound(&d->utf8, l);
    uint8_t *tmp = bound <= sizeof small ? small : dsii_malloc(d->model->ctx, bound);
    if (!tmp) return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_detokenizer_feed: out of memory");
    dsii_utf8_stream next;
    size_t o = dsii_utf8_stream_push(&d->utf8, p, l, tmp, &next);
    *n_needed = o;
    dsi_status st = DSI_OK;
    if (o > cap) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_feed: %zu bytes do not fit in cap %zu", o, cap);
        st = model_fail(d->model, &e);
    } else {
        if (o) memcpy(buf, tmp, o);
        d->utf8 = next;
    }
    if (tmp != small) dsii_free(d->model->ctx, tmp);
    return st;
}

DSI_API dsi_status dsi_detokenizer_flush(dsi_detokenizer *d, char *buf, size_t cap,
                                         size_t *n_needed) {
    if (!d) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_flush: detokenizer is NULL");
    dsii_error e;
    if (!n_needed || (!buf && cap > 0)) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_flush: %s is NULL",
                  !n_needed ? "n_needed" : "buf (with cap > 0)");
        return model_fail(d->model, &e);
    }
    size_t o = d->utf8.n_pending ? 3 : 0;
    *n_needed = o;
    if (o > cap) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_detokenizer_flush: %zu bytes do not fit in cap %zu", o, cap);
        return model_fail(d->model, &e);
    }
    uint8_t tmp[3];
    o = dsii_utf8_stream_flush(&d->utf8, tmp);
    if (o) memcpy(buf, tmp, o);
    return DSI_OK;
}

DSI_API void dsi_detokenizer_free(dsi_detokenizer *d) {
    if (!d) return;
    dsi_model *m = (dsi_model *)(uintptr_t)d->model;
    dsii_free(m->ctx, d);
    atomic_fetch_sub_explicit(&m->n_detokenizers, 1, memory_order_acq_rel); /* last touch */
}
