/* Sampling chain; see sampler.h and docs/tokenizer.md "Sampling". */
#include "sampler/sampler.h"

#include <math.h>   /* isnan / isinf / INFINITY only: classification, no computation */
#include <string.h>

/* Keep a*b+c as two roundings on every compiler: clang contracts to FMA by default (gcc
 * does not under -std=c11 and does not know the pragma). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

void dsii_rng_seed(uint64_t s[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        s[i] = z ^ (z >> 31);
    }
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dsii_rng_next(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double dsii_rng_uniform(uint64_t s[4]) {
    return (double)(dsii_rng_next(s) >> 11) * 0x1.0p-53;
}

/* exp(x) = 2^k · exp(r), k = nearest integer to x/ln2, r = x − k·ln2 (two-part ln2, Cody–
 * Waite), |r| <= ln2/2; exp(r) by its Taylor series to degree 13 (error < 1e-17 relative);
 * 2^k is assembled from the exponent bits. Only +, −, × and comparisons: reproducible. */
double dsii_exp(double x) {
    if (x != x) return x;
    if (x > 709.0) return INFINITY;
    if (x < -745.2) return 0.0;
    const double inv_ln2 = 1.4426950408889634074, ln2_hi = 6.93147180369123816490e-01,
                 ln2_lo = 1.90821492927058770002e-10;
    double t = x * inv_ln2;
    int64_t k = (int64_t)(t < 0 ? t - 0.5 : t + 0.5);
    double r = (x - (double)k * ln2_hi) - (double)k * ln2_lo;
    double p = 1.0 / 6227020800.0; /* 1/13! */
    static const double inv_fact[13] = {
        1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
        1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0,
        1.0 / 2.0, 1.0, 1.0};
    for (int i = 0; i < 13; i++) p = p * r + inv_fact[i];
    /* scale by 2^k in at most two exact steps (k may be below the normal range) */
    while (k < -1000) {
        p *= 0x1.0p-1000;
        k += 1000;
    }
    while (k > 1000) {
        p *= 0x1.0p+1000;
        k -= 1000;
    }
    union { double d; uint64_t u; } sc;
    sc.u = (uint64_t)(k + 1023) << 52;
    return p * sc.d;
}

static int bad_float(float f) { return isnan(f) || isinf(f); }

void dsii_sampler_options_defaults(dsi_sampler_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
    opt->temperature = 1.0f;
    opt->top_k = 0;
    opt->top_p = 1.0f;
    opt->min_p = 0.0f;
    opt->repetition_penalty = 1.0f;
    opt->penalty_last_n = 64;
    opt->seed = 0;
}

dsi_status dsii_sampler_check_options(const dsi_sampler_options *opt, dsi_sampler_options *o,
                                      dsii_error *err) {
    dsii_sampler_options_defaults(o);
    dsi_status st = dsii_read_options(o, sizeof *o, opt, "dsi_sampler_options", err);
    if (st != DSI_OK) return st;
    if (isnan(o->temperature) || o->temperature < 0 || isinf(o->temperature))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_sampler_options.temperature = %g: must be a finite value >= 0", (double)o->temperature);
    if (o->top_k < 0)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.top_k = %d: must be >= 0", (int)o->top_k);
    if (isnan(o->top_p) || !(o->top_p > 0.0f && o->top_p <= 1.0f))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.top_p = %g: must be in (0, 1]", (double)o->top_p);
    if (isnan(o->min_p) || !(o->min_p >= 0.0f && o->min_p < 1.0f))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.min_p = %g: must be in [0, 1)", (double)o->min_p);
    if (isnan(o->repetition_penalty) || !(o->repetition_penalty > 0.0f) || isinf(o->repetition_penalty))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "dsi_sampler_options.repetition_penalty = %g: must be a finite value > 0", (double)o->repetition_penalty);
    if (bad_float(o->frequency_penalty))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.frequency_penalty = %g: must be finite", (double)o->frequency_penalty);
    if (bad_float(o->presence_penalty))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.presence_penalty = %g: must be finite", (double)o->presence_penalty);
    if (o->penalty_last_n < 0)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.penalty_last_n = %d: must be >= 0", (int)o->penalty_last_n);
    if (o->reserved != 0)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.reserved = %u: must be 0", (unsigned)o->reserved);
    if (o->n_logit_bias > 0 && !o->logit_bias)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.logit_bias is NULL but n_logit_bias is %zu", o->n_logit_bias);
    if (o->n_logit_bias > (1u << 24))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.n_logit_bias = %zu: too many", o->n_logit_bias);
    for (size_t i = 0; i < o->n_logit_bias; i++) {
        if (o->logit_bias[i].token < 0)
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsi_sampler_options.logit_bias[%zu].token = %d: must be >= 0",
                             i, (int)o->logit_bias[i].token);
        float b = o->logit_bias[i].bias;
        if (isnan(b) || (isinf(b) && b > 0))
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                             "dsi_sampler_options.logit_bias[%zu].bias = %g: must be finite or -infinity", i, (double)b);
    }
    return DSI_OK;
}

void dsii_sampler_accept(dsi_sampler *s, dsi_token token) {
    size_t cap = (size_t)s->opt.penalty_last_n;
    if (cap == 0) return;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % cap;
    if (s->hist_n < cap) s->hist_n++;
}

/* Total order: larger value first, then smaller token id. */
static int cand_before(const struct dsii_cand *a, const struct dsii_cand *b) {
    if (a->v != b->v) return a->v > b->v;
    return a->id < b->id;
}

static void sift_down(struct dsii_cand *h, size_t n, size_t i) {
    /* min-heap under cand_before's reverse, i.e. the root is the LAST in sampling order */
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && cand_before(&h[c], &h[c + 1])) c++;
        if (!cand_before(&h[i], &h[c])) return;
        struct dsii_cand t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

/* Sorts c[0..n) in sampling order (heap sort: O(n log n), no recursion, deterministic). */
static void cand_sort(struct dsii_cand *c, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift_down(c, n, i);
    for (size_t end = n; end > 1; end--) {
        struct dsii_cand t = c[0];
        c[0] = c[end - 1];
        c[end - 1] = t;
        sift_down(c, end - 1, 0);
    }
}

dsi_status dsii_sampler_sample(dsi_sampler *s, const float *logits, int32_t n_vocab,
                               dsi_token *token, dsii_error *err) {
    const dsi_sampler_options *o = &s->opt;
    for (size_t i = 0; i < o->n_logit_bias; i++)
        if (o->logit_bias[i].token >= n_vocab)
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                             "dsi_sampler_sample: logit_bias[%zu].token = %d is outside the vocabulary (n_vocab %d)",
                             i, (int)o->logit_bias[i].token, (int)n_vocab);
    if (n_vocab != s->n_vocab) {
        dsii_free(s->ctx, s->probs);
        dsii_free(s->ctx, s->cand);
        dsii_free(s->ctx, s->counts);
        s->n_vocab = 0;
        s->has_probs = 0;
        s->probs = dsii_malloc(s->ctx, (size_t)n_vocab * sizeof *s->probs);
        s->cand = dsii_malloc(s->ctx, (size_t)n_vocab * sizeof *s->cand);
        s->counts = dsii_calloc(s->ctx, (size_t)n_vocab, sizeof *s->counts);
        if (!s->probs || !s->cand || !s->counts) {
            dsii_free(s->ctx, s->probs);
            dsii_free(s->ctx, s->cand);
            dsii_free(s->ctx, s->counts);
            s->probs = NULL;
            s->cand = NULL;
            s->counts = NULL;
            return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_sampler_sample: out of memory (n_vocab %d)", (int)n_vocab);
        }
        s->n_vocab = n_vocab;
    }
    s->has_probs = 0;
    struct dsii_cand *c = s->cand;
    /* 1. raw logits (NaN counts as -inf: never sampled) */
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        c[i].v = isnan(l) ? -INFINITY : (double)l;
        c[i].id = i;
    }
    /* 2. penalties over the window: repetition (CTRL: divide positive logits, multiply
     * negative ones, once per distinct token), then frequency (× count) and presence. */
    if (s->hist_n > 0 && (o->repetition_penalty != 1.0f || o->frequency_penalty != 0.0f ||
                          o->presence_penalty != 0.0f)) {
        for (size_t k = 0; k < s->hist_n; k++)
            if (s->hist[k] >= 0 && s->hist[k] < n_vocab) s->counts[s->hist[k]]++;
        for (size_t k = 0; k < s->hist_n; k++) {
            dsi_token t = s->hist[k];
            if (t < 0 || t >= n_vocab || s->counts[t] == 0) continue;
            double v = c[t].v;
            if (o->repetition_penalty != 1.0f)
                v = v > 0 ? v / (double)o->repetition_penalty : v * (double)o->repetition_penalty;
            v -= (double)s->counts[t] * (double)o->frequency_penalty + (double)o->presence_penalty;
            c[t].v = v;
            s->counts[t] = 0; /* applied once; also restores the zeroed scratch */
        }
    }
    /* 3. logit bias */
    for (size_t i = 0; i < o->n_logit_bias; i++) c[o->logit_bias[i].token].v += (double)o->logit_bias[i].bias;

    memset(s->probs, 0, (size_t)n_vocab * sizeof *s->probs);
    /* 4. greedy */
    if (o->temperature == 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < n_vocab; i++)
            if (c[i].v > c[best].v) best = i;
        s->probs[best] = 1.0f;
        s->has_probs = 1;
        *token = best;
        dsii_sampler_accept(s, best);
        return DSI_OK;
    }
    /* 5. candidates with a finite logit, temperature-scaled, in sampling order */
    size_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++)
        if (c[i].v > -INFINITY && c[i].v < INFINITY) c[n++] = (struct dsii_cand){c[i].v / (double)o->temperature, i};
        else if (c[i].v == INFINITY) c[n++] = (struct dsii_cand){1e308, i};
    if (n == 0) {
        /* every logit is -inf/NaN: fall back to the lowest id, as greedy would */
        s->probs[0] = 1.0f;
        s->has_probs = 1;
        *token = 0;
        dsii_sampler_accept(s, 0);
        return DSI_OK;
    }
    cand_sort(c, n);
    /* 6. top-k */
    if (o->top_k > 0 && (size_t)o->top_k < n) n = (size_t)o->top_k;
    /* 7. softmax: c[i].v becomes the unnormalized probability */
    double mx = c[0].v, sum = 0;
    for (size_t i = 0; i < n; i++) {
        c[i].v = dsii_exp(c[i].v - mx);
        sum += c[i].v;
    }
    /* 8. top-p: smallest prefix whose mass reaches top_p */
    if (o->top_p < 1.0f) {
        double cum = 0, lim = (double)o->top_p * sum;
        size_t k = 0;
        while (k < n) {
            cum += c[k].v;
            k++;
            if (cum >= lim) break;
        }
        n = k;
    }
    /* 9. min-p: drop tokens below min_p × the top probability */
    if (o->min_p > 0.0f) {
        double lim = (double)o->min_p * c[0].v;
        size_t k = 1;
        while (k < n && c[k].v >= lim) k++;
        n = k;
    }
    sum = 0;
    for (size_t i = 0; i < n; i++) sum += c[i].v;
    /* 10. draw */
    double u = dsii_rng_uniform(s->rng) * sum, cum = 0;
    size_t pick = n - 1;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].v;
        if (u < cum) { pick = i; break; }
    }
    for (size_t i = 0; i < n; i++) s->probs[c[i].id] = (float)(c[i].v / sum);
    s->has_probs = 1;
    *token = c[pick].id;
    dsii_sampler_accept(s, *token);
    return DSI_OK;
}
