/*
 * Sampling chain (docs/tokenizer.md "Sampling"): penalties → logit bias → greedy, or
 * temperature → top-k → softmax → top-p → min-p → draw. Deterministic on every platform:
 * own RNG (xoshiro256**), own exp(), a total order on candidates (logit, then token id) and
 * double accumulation in that order; no libm call decides anything.
 */
#ifndef DSI_SAMPLER_SAMPLER_H
#define DSI_SAMPLER_SAMPLER_H

#include "base/base.h"

struct dsi_sampler {
    dsi_context *ctx;            /* allocator hooks (counted in ctx->n_samplers); NULL: libc */
    dsi_sampler_options opt;     /* effective options; opt.logit_bias points at `bias` */
    dsi_logit_bias *bias;
    uint64_t rng[4];
    dsi_token *hist;             /* ring of the last penalty_last_n tokens */
    size_t hist_n, hist_pos;
    int32_t n_vocab;             /* size of the scratch below (0 before the first sample) */
    float *probs;                /* distribution of the last sample */
    int32_t has_probs;
    struct dsii_cand { double v; int32_t id; } *cand;
    int32_t *counts;
    dsii_error last_error;
};

/* Validates `opt` (NULL: defaults) into `out` (full layout; logit_bias still the caller's
 * pointer). INVALID_ARGUMENT naming the field. */
/* The defaults of dsi_sampler_options (dsi_sampler_options_init calls this). NULL: no-op. */
void dsii_sampler_options_defaults(dsi_sampler_options *opt);

dsi_status dsii_sampler_check_options(const dsi_sampler_options *opt, dsi_sampler_options *out,
                                      dsii_error *err);

/* Seeds xoshiro256** from a 64-bit seed through splitmix64. */
void dsii_rng_seed(uint64_t s[4], uint64_t seed);
uint64_t dsii_rng_next(uint64_t s[4]);
/* Uniform double in [0, 1): the top 53 bits times 2^-53 (exact). */
double dsii_rng_uniform(uint64_t s[4]);

/* exp(x) for any double, computed without libm (same bits on every IEEE-754 platform). */
double dsii_exp(double x);

/* One sample (the API layer has checked the arguments). */
dsi_status dsii_sampler_sample(dsi_sampler *s, const float *logits, int32_t n_vocab,
                               dsi_token *token, dsii_error *err);
void dsii_sampler_accept(dsi_sampler *s, dsi_token token);

#endif
