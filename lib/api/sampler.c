/* Public sampler functions (include/dsinfer.h "Sampler") around lib/sampler. */
#include "base/base.h"
#include "base/context_impl.h"
#include "sampler/sampler.h"

#include <string.h>

DSI_API void dsi_sampler_options_init(dsi_sampler_options *opt) { dsii_sampler_options_defaults(opt); }

static dsi_status sampler_create(dsi_context *ctx, const dsi_sampler_options *opt,
                                 dsi_sampler **out, const char *fn) {
    if (out) *out = NULL;
    if (!out) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    dsii_error e;
    dsii_error_clear(&e);
    dsi_sampler_options o;
    if (dsii_sampler_check_options(opt, &o, &e) != DSI_OK) return dsii_thread_fail(e.status, "%s", e.msg);
    dsi_sampler *s = dsii_calloc(ctx, 1, sizeof *s);
    if (!s) return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
    s->ctx = ctx;
    if (ctx) atomic_fetch_add_explicit(&ctx->n_samplers, 1, memory_order_acq_rel);
    s->opt = o;
    if (o.n_logit_bias > 0) {
        s->bias = dsii_malloc(ctx, o.n_logit_bias * sizeof *s->bias);
        if (!s->bias) goto oom;
        memcpy(s->bias, o.logit_bias, o.n_logit_bias * sizeof *s->bias);
    }
    s->opt.logit_bias = s->bias;
    if (o.penalty_last_n > 0) {
        s->hist = dsii_malloc(ctx, (size_t)o.penalty_last_n * sizeof *s->hist);
        if (!s->hist) goto oom;
    }
    dsii_rng_seed(s->rng, o.seed);
    *out = s;
    return DSI_OK;
oom:
    dsi_sampler_free(s);
    return dsii_thread_fail(DSI_ERR_OUT_OF_HOST_MEMORY, "%s: out of memory", fn);
}

DSI_API dsi_status dsi_sampler_create(const dsi_sampler_options *opt, dsi_sampler **out) {
    return sampler_create(NULL, opt, out, "dsi_sampler_create");
}

DSI_API dsi_status dsi_sampler_create_with_context(dsi_context *ctx, const dsi_sampler_options *opt,
                                                   dsi_sampler **out) {
    return sampler_create(ctx, opt, out, "dsi_sampler_create_with_context");
}

DSI_API void dsi_sampler_free(dsi_sampler *s) {
    if (!s) return;
    dsi_context *ctx = s->ctx;
    dsii_free(ctx, s->bias);
    dsii_free(ctx, s->hist);
    dsii_free(ctx, s->probs);
    dsii_free(ctx, s->cand);
    dsii_free(ctx, s->counts);
    dsii_free(ctx, s);
    if (ctx) atomic_fetch_sub_explicit(&ctx->n_samplers, 1, memory_order_acq_rel); /* last touch */
}

DSI_API const char *dsi_sampler_last_error(const dsi_sampler *s) {
    return s ? s->last_error.msg : "";
}

static dsi_status smp_fail(dsi_sampler *s, const dsii_error *e) {
    s->last_error = *e;
    dsii_set_thread_error(e->msg);
    return e->status;
}

DSI_API dsi_status dsi_sampler_sample(dsi_sampler *s, const float *logits, int32_t n_vocab,
                                      dsi_token *token) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_sample: sampler is NULL");
    dsii_error e;
    dsii_error_clear(&e);
    if (!logits || !token) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_sample: %s is NULL", !logits ? "logits" : "token");
        return smp_fail(s, &e);
    }
    if (n_vocab <= 0) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_sample: n_vocab = %d must be > 0", (int)n_vocab);
        return smp_fail(s, &e);
    }
    if (dsii_sampler_sample(s, logits, n_vocab, token, &e) != DSI_OK) return smp_fail(s, &e);
    return DSI_OK;
}

DSI_API dsi_status dsi_sampler_accept(dsi_sampler *s, dsi_token token) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_accept: sampler is NULL");
    if (token < 0) {
        dsii_error e;
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_accept: token %d is negative", (int)token);
        return smp_fail(s, &e);
    }
    dsii_sampler_accept(s, token);
    return DSI_OK;
}

DSI_API dsi_status dsi_sampler_reset(dsi_sampler *s) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_reset: sampler is NULL");
    s->hist_n = s->hist_pos = 0;
    s->has_probs = 0;
    dsii_rng_seed(s->rng, s->opt.seed);
    return DSI_OK;
}

DSI_API dsi_status dsi_sampler_probs(dsi_sampler *s, const float **probs, int32_t *n_vocab) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_probs: sampler is NULL");
    dsii_error e;
    if (!probs || !n_vocab) {
        dsii_fail(&e, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_probs: %s is NULL", !probs ? "probs" : "n_vocab");
        return smp_fail(s, &e);
    }
    if (!s->has_probs) {
        dsii_fail(&e, DSI_ERR_NOT_FOUND, "dsi_sampler_probs: nothing sampled yet");
        return smp_fail(s, &e);
    }
    *probs = s->probs;
    *n_vocab = s->n_vocab;
    return DSI_OK;
}
