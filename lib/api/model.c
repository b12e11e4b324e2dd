/*
 * Public model functions (include/dsinfer.h "Model"): argument checks, options, handles.
 * The work is in lib/model/.
 */
#include "base/base.h"
#include "base/context_impl.h"
#include "base/file.h"
#include "arch/arch.h"
#include "model/model.h"
#include "sched/sched.h"

#include <stdio.h>
#include <string.h>

DSI_API void dsi_model_options_init(dsi_model_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->access = DSI_ACCESS_MMAP;
}

DSI_API void dsi_reader_init(dsi_reader *reader) {
    if (!reader) return;
    memset(reader, 0, sizeof *reader);
    reader->struct_size = sizeof *reader;
}

DSI_API void dsi_model_info_init(dsi_model_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

/* Failure of a constructor: message on the context (if any) and the thread. */
static dsi_status ctor_fail(dsi_context *ctx, const dsii_error *e) {
    if (ctx) return dsii_context_fail(ctx, e);
    dsii_set_thread_error(e->msg);
    return e->status;
}

_Static_assert((DSII_MODEL_FLAG_COALESCE & (DSI_MODEL_FLAG_VERIFY_FILE | DSI_MODEL_FLAG_RESIDENT)) == 0,
               "the experimental and stable dsi_model_options.flags bits must be distinct");

static dsi_status read_model_options(const dsi_model_options *user, dsi_model_options *opt,
                                     int reader, dsii_error *err) {
    dsi_model_options_init(opt);
    dsi_status st = dsii_read_options(opt, sizeof *opt, user, "dsi_model_options", err);
    if (st != DSI_OK) return st;
    const uint32_t known =
        (uint32_t)DSII_MODEL_FLAG_COALESCE | DSI_MODEL_FLAG_VERIFY_FILE | DSI_MODEL_FLAG_RESIDENT;
    if (opt->flags & ~known)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_model_options.flags has unknown bits 0x%x",
                         opt->flags & ~known);
    if (!reader && opt->access != DSI_ACCESS_MMAP && opt->access != DSI_ACCESS_PREAD)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_model_options.access %d is not DSI_ACCESS_MMAP or DSI_ACCESS_PREAD", opt->access);
    if (reader && (opt->flags & DSI_MODEL_FLAG_VERIFY_FILE))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "DSI_MODEL_FLAG_VERIFY_FILE needs a model file (dsi_model_load), not a reader");
    if (!reader && (opt->flags & DSI_MODEL_FLAG_RESIDENT) && opt->access != DSI_ACCESS_PREAD)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "DSI_MODEL_FLAG_RESIDENT needs DSI_ACCESS_PREAD (a mapping is not owned memory)");
    return DSI_OK;
}

/* The last load stages: the weights go to a GPU backend once per model (a no-op on the
 * CPU), then DONE. A failure or a cancel frees the model. */
static dsi_status finish_load(dsi_context *ctx, const dsi_model_options *opt, dsi_model **out,
                              dsii_error *err) {
    dsi_model *m = *out;
    dsi_status st = DSI_OK;
    const char *stage = "upload";
    if (opt->progress_fn && opt->progress_fn(DSI_LOAD_STAGE_UPLOAD, 0, 1, opt->progress_user_data) == 0)
        st = DSI_ERR_CANCELLED;
    if (st == DSI_OK) st = dsii_exec_create(m, err);
    if (st == DSI_OK && (opt->flags & DSII_MODEL_FLAG_COALESCE) && m->exec)
        st = dsii_sched_enable(m->exec, err);
    if (st == DSI_OK && opt->progress_fn &&
        opt->progress_fn(DSI_LOAD_STAGE_UPLOAD, 1, 1, opt->progress_user_data) == 0)
        st = DSI_ERR_CANCELLED;
    if (st == DSI_OK && opt->progress_fn) {
        stage = "done";
        if (opt->progress_fn(DSI_LOAD_STAGE_DONE, 1, 1, opt->progress_user_data) == 0)
            st = DSI_ERR_CANCELLED;
    }
    if (st == DSI_OK) return DSI_OK;
    if (st == DSI_ERR_CANCELLED)
        dsii_fail(err, st, "model loading cancelled by the progress callback (stage %s)", stage);
    dsii_model_destroy(m);
    atomic_fetch_sub(&ctx->n_models, 1);
    *out = NULL;
    return st;
}

DSI_API dsi_status dsi_model_load(dsi_context *ctx, const char *path, const dsi_model_options *user_opt,
                                  dsi_model **out) {
    dsii_error err;
    dsii_error_clear(&err);
    if (out) *out = NULL;
    if (!ctx || !path || !out) {
        dsii_fail(&err, DSI_ERR_INVALID_ARGUMENT, "dsi_model_load: %s is NULL",
                  !ctx ? "ctx" : !path ? "path" : "out");
        return ctor_fail(ctx, &err);
    }
    dsi_model_options opt;
    if (read_model_options(user_opt, &opt, 0, &err) != DSI_OK) return ctor_fail(ctx, &err);
    dsii_file *f = NULL;
    uint32_t fflags = (opt.flags & DSI_MODEL_FLAG_VERIFY_FILE) ? DSII_FILE_VERIFY : 0;
    if (dsii_file_open_ex(ctx, path, opt.access, fflags, &f, &err) != DSI_OK) return ctor_fail(ctx, &err);
    if (dsii_model_load_file(ctx, f, &opt, out, &err) != DSI_OK) return ctor_fail(ctx, &err);
    if (finish_load(ctx, &opt, out, &err) != DSI_OK) return ctor_fail(ctx, &err);
    dsii_log(ctx, DSI_LOG_INFO, "loaded %s model '%s' from %s: %u layers, %llu params, %llu bytes",
             (*out)->hp.arch == DSI_ARCH_DEEPSEEK41 ? "deepseek41" : "deepseek4", (*out)->name, path,
             (*out)->hp.n_layer, (unsigned long long)(*out)->n_params,
             (unsigned long long)(*out)->weight_bytes);
    return DSI_OK;
}

DSI_API dsi_status dsi_model_load_from_reader(dsi_context *ctx, const dsi_reader *reader,
                                              const dsi_model_options *user_opt, dsi_model **out) {
    dsii_error err;
    dsii_error_clear(&err);
    if (out) *out = NULL;
    if (!ctx || !reader || !out) {
        /* the reader is ours to close even on failure (dsinfer.h) */
        if (reader && reader->struct_size >= DSII_FIELD_END(dsi_reader, user_data) && reader->close_fn)
            reader->close_fn(reader->user_data);
        dsii_fail(&err, DSI_ERR_INVALID_ARGUMENT, "dsi_model_load_from_reader: %s is NULL",
                  !ctx ? "ctx" : !reader ? "reader" : "out");
        return ctor_fail(ctx, &err);
    }
    dsi_model_options opt;
    if (read_model_options(user_opt, &opt, 1, &err) != DSI_OK) {
        if (reader->struct_size >= DSII_FIELD_END(dsi_reader, user_data) && reader->close_fn)
            reader->close_fn(reader->user_data);
        return ctor_fail(ctx, &err);
    }
    opt.access = DSI_ACCESS_READER;
    dsii_file *f = NULL;
    if (dsii_file_open_reader(ctx, reader, &f, &err) != DSI_OK) return ctor_fail(ctx, &err);
    if (dsii_model_load_file(ctx, f, &opt, out, &err) != DSI_OK) return ctor_fail(ctx, &err);
    if (finish_load(ctx, &opt, out, &err) != DSI_OK) return ctor_fail(ctx, &err);
    return DSI_OK;
}

DSI_API dsi_status dsi_model_free(dsi_model *model) {
    if (!model) return DSI_OK;
    int n_s = atomic_load(&model->n_sessions), n_d = atomic_load(&model->n_detokenizers);
    if (n_s > 0 || n_d > 0) {
        dsii_error e;
        dsii_fail(&e, DSI_ERR_BUSY,
                  "dsi_model_free: %d session(s) and %d detokenizer(s) of this model are still "
                  "alive; free them first", n_s, n_d);
        return dsii_model_fail(model, &e);
    }
    dsi_context *ctx = model->ctx;
    dsii_model_destroy(model);
    if (ctx) atomic_fetch_sub(&ctx->n_models, 1);
    return DSI_OK;
}

DSI_API const char *dsi_model_last_error(const dsi_model *model) {
    /* a copy taken under the model's error lock, in storage this thread owns */
    static _Thread_local char copy[DSII_ERROR_MSG_MAX];
    if (!model) return "";
    dsii_model_error_copy(model, copy);
    return copy;
}

/* Records an argument error on a (const) model: last_error is the one mutable field and
 * is written under its lock. */
static dsi_status model_arg_fail(const dsi_model *model, dsi_status st, const char *fmt, ...)
    DSII_PRINTF(3, 4);
static dsi_status model_arg_fail(const dsi_model *model, dsi_status st, const char *fmt, ...) {
    dsii_error e;
    va_list ap;
    va_start(ap, fmt);
    e.status = st;
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    return dsii_model_fail((dsi_model *)model, &e);
}

DSI_API dsi_status dsi_model_get_info(const dsi_model *model, dsi_model_info *info) {
    if (!model || !info) {
        if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_get_info: model is NULL");
        return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_get_info: info is NULL");
    }
    if (info->struct_size < 8 || info->struct_size > sizeof *info)
        return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT,
                              "dsi_model_info.struct_size %u is invalid (use dsi_model_info_init)", info->struct_size);
    const dsii_hparams *hp = &model->hp;
    dsi_model_info full;
    memset(&full, 0, sizeof full);
    full.struct_size = info->struct_size;
    full.arch = hp->arch;
    snprintf(full.arch_name, sizeof full.arch_name, "%s", hp->arch == DSI_ARCH_DEEPSEEK41 ? "deepseek41" : "deepseek4");
    snprintf(full.name, sizeof full.name, "%s", model->name);
    full.n_layers = (int32_t)hp->n_layer;
    full.n_embd = (int32_t)hp->n_embd;
    full.n_vocab = (int32_t)hp->n_vocab;
    full.n_heads = (int32_t)hp->n_head;
    full.n_ctx_train = hp->n_ctx_train > INT32_MAX ? INT32_MAX : (int32_t)hp->n_ctx_train;
    full.n_experts = (int32_t)hp->n_expert;
    full.n_experts_used = (int32_t)hp->n_expert_used;
    full.n_draft_layers = (int32_t)hp->n_draft;
    full.has_mtp = hp->has_mtp;
    full.has_dspark = hp->has_dspark;
    full.has_engram = hp->has_engram;
    full.n_params = model->n_params;
    full.weight_bytes = model->weight_bytes;
    memcpy(full.fingerprint, model->fingerprint, sizeof full.fingerprint);
    memcpy(info, &full, info->struct_size);
    return DSI_OK;
}

DSI_API dsi_status dsi_model_type_bytes(const dsi_model *model, int32_t type, uint64_t *bytes) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_type_bytes: model is NULL");
    if (!bytes) return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_type_bytes: bytes is NULL");
    int s = dsii_model_type_slot(type);
    *bytes = s >= 0 ? model->type_bytes[s] : 0;
    return DSI_OK;
}

DSI_API dsi_status dsi_model_meta_count(const dsi_model *model, int32_t *count) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_count: model is NULL");
    if (!count) return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_count: count is NULL");
    int64_t n = dsii_gguf_n_kv(model->gguf);
    *count = n > INT32_MAX ? INT32_MAX : (int32_t)n;
    return DSI_OK;
}

/* Two-call string output. */
static void put_str(const char *s, char *buf, size_t cap, size_t *needed) {
    size_t n = strlen(s);
    if (needed) *needed = n;
    if (buf && cap > 0) {
        size_t c = n < cap - 1 ? n : cap - 1;
        memcpy(buf, s, c);
        buf[c] = '\0';
    }
}

DSI_API dsi_status dsi_model_meta_key(const dsi_model *model, int32_t i, char *buf, size_t cap,
                                      size_t *needed) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_key: model is NULL");
    if (!needed && !buf)
        return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_key: buf and needed are both NULL");
    if (i < 0 || i >= dsii_gguf_n_kv(model->gguf))
        return model_arg_fail(model, DSI_ERR_NOT_FOUND, "dsi_model_meta_key: index %d out of range (count %lld)", i,
                              (long long)dsii_gguf_n_kv(model->gguf));
    put_str(dsii_gguf_kv_key(model->gguf, i), buf, cap, needed);
    return DSI_OK;
}

DSI_API dsi_status dsi_model_meta_value(const dsi_model *model, int32_t i, char *buf, size_t cap,
                                        size_t *needed) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_value: model is NULL");
    if (!needed && !buf)
        return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_value: buf and needed are both NULL");
    if (i < 0 || i >= dsii_gguf_n_kv(model->gguf))
        return model_arg_fail(model, DSI_ERR_NOT_FOUND, "dsi_model_meta_value: index %d out of range (count %lld)", i,
                              (long long)dsii_gguf_n_kv(model->gguf));
    size_t n = 0;
    dsii_gguf_kv_render(model->gguf, i, buf, buf ? cap : 0, &n);
    if (needed) *needed = n;
    return DSI_OK;
}

DSI_API dsi_status dsi_model_meta_find(const dsi_model *model, const char *key, char *buf, size_t cap,
                                       size_t *needed) {
    if (!model) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_find: model is NULL");
    if (!key) return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_find: key is NULL");
    if (!needed && !buf)
        return model_arg_fail(model, DSI_ERR_INVALID_ARGUMENT, "dsi_model_meta_find: buf and needed are both NULL");
    int64_t i = dsii_gguf_find_key(model->gguf, key);
    if (i < 0) {
        if (needed) *needed = 0;
        return model_arg_fail(model, DSI_ERR_NOT_FOUND, "metadata key '%.200s' not found", key);
    }
    size_t n = 0;
    dsii_gguf_kv_render(model->gguf, i, buf, buf ? cap : 0, &n);
    if (needed) *needed = n;
    return DSI_OK;
}
