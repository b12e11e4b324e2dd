/*
 * Sampler: distributions computed by hand in the test (with libm here; the library has its
 * own exp), option validation, determinism, the RNG against its published definition, and
 * a chi-square frequency test of temperature-1 sampling with a fixed seed (deterministic).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dsinfer.h"
#include "sampler/sampler.h"

static dsi_sampler *make(float temp, int32_t top_k, float top_p, float min_p, uint64_t seed) {
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    o.temperature = temp;
    o.top_k = top_k;
    o.top_p = top_p;
    o.min_p = min_p;
    o.seed = seed;
    dsi_sampler *s = NULL;
    assert_int_equal(dsi_sampler_create(&o, &s), DSI_OK);
    return s;
}

static const float *probs_of(dsi_sampler *s, const float *logits, int32_t n) {
    dsi_token t;
    assert_int_equal(dsi_sampler_sample(s, logits, n, &t), DSI_OK);
    const float *p;
    int32_t nv;
    assert_int_equal(dsi_sampler_probs(s, &p, &nv), DSI_OK);
    assert_int_equal(nv, n);
    assert_true(p[t] > 0.0f);
    return p;
}

static void expect_probs(const float *got, const double *want, int n) {
    for (int i = 0; i < n; i++)
        if (fabs((double)got[i] - want[i]) > 1e-6)
            fail_msg("p[%d] = %.9f, expected %.9f", i, (double)got[i], want[i]);
}

/* logits log(1), log(2), log(3), log(4): softmax 0.1 0.2 0.3 0.4 */
static float L4[4];

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < 4; i++) L4[i] = (float)log((double)(i + 1));
    return 0;
}

static void test_greedy(void **state) {
    (void)state;
    dsi_sampler *s = make(0.0f, 0, 1.0f, 0.0f, 1);
    float l[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
    const float *p = probs_of(s, l, 5);
    double want[5] = {0, 1, 0, 0, 0}; /* tie 1 vs 3: the lower id */
    expect_probs(p, want, 5);
    dsi_token t;
    assert_int_equal(dsi_sampler_sample(s, l, 5, &t), DSI_OK);
    assert_int_equal(t, 1);
    dsi_sampler_free(s);
}

static void test_temperature_and_filters(void **state) {
    (void)state;
    dsi_sampler *s = make(1.0f, 0, 1.0f, 0.0f, 1);
    double w1[4] = {0.1, 0.2, 0.3, 0.4};
    expect_probs(probs_of(s, L4, 4), w1, 4);
    dsi_sampler_free(s);

    s = make(2.0f, 0, 1.0f, 0.0f, 1); /* p ∝ sqrt(i+1) */
    double z = 1 + sqrt(2) + sqrt(3) + 2;
    double w2[4] = {1 / z, sqrt(2) / z, sqrt(3) / z, 2 / z};
    expect_probs(probs_of(s, L4, 4), w2, 4);
    dsi_sampler_free(s);

    s = make(1.0f, 2, 1.0f, 0.0f, 1); /* top-k 2: 0.3, 0.4 renormalized */
    double w3[4] = {0, 0, 0.3 / 0.7, 0.4 / 0.7};
    expect_probs(probs_of(s, L4, 4), w3, 4);
    dsi_sampler_free(s);

    s = make(1.0f, 0, 0.6f, 0.0f, 1); /* top-p 0.6: 0.4 + 0.3 = 0.7 >= 0.6 */
    expect_probs(probs_of(s, L4, 4), w3, 4);
    dsi_sampler_free(s);

    s = make(1.0f, 0, 0.35f, 0.0f, 1); /* top-p 0.35: 0.4 alone reaches it */
    double w4[4] = {0, 0, 0, 1};
    expect_probs(probs_of(s, L4, 4), w4, 4);
    dsi_sampler_free(s);

    s = make(1.0f, 0, 1.0f, 0.45f, 1); /* min-p 0.45: keep p >= 0.18 */
    double w5[4] = {0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9};
    expect_probs(probs_of(s, L4, 4), w5, 4);
    dsi_sampler_free(s);

    s = make(1.0f, 3, 0.8f, 0.3f, 1); /* k=3 {.2,.3,.4}/.9; p=.8 keeps all three (.444+.333=.778 < .8);
                                        min-p .3 × .444 = .133 keeps all */
    double w6[4] = {0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9};
    expect_probs(probs_of(s, L4, 4), w6, 4);
    dsi_sampler_free(s);

    /* -inf logits are never candidates */
    s = make(1.0f, 0, 1.0f, 0.0f, 1);
    float l[3] = {-INFINITY, 0.0f, 0.0f};
    double w7[3] = {0, 0.5, 0.5};
    expect_probs(probs_of(s, l, 3), w7, 3);
    dsi_sampler_free(s);
}

static void test_penalties_and_bias(void **state) {
    (void)state;
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    o.repetition_penalty = 2.0f;
    o.frequency_penalty = 0.5f;
    o.presence_penalty = 1.0f;
    o.penalty_last_n = 3;
    dsi_sampler *s = NULL;
    assert_int_equal(dsi_sampler_create(&o, &s), DSI_OK);
    /* history (window 3): 0 0 1 2 -> the window keeps 0 1 2 ... after one more 1: 1 2 1 */
    dsi_sampler_accept(s, 0);
    dsi_sampler_accept(s, 0);
    dsi_sampler_accept(s, 1);
    dsi_sampler_accept(s, 2);
    dsi_sampler_accept(s, 1);
    float l[4] = {1.0f, 4.0f, -2.0f, 0.0f};
    /* token 1: count 2: 4/2 - 2*0.5 - 1 = 0; token 2: count 1: -2*2 - 0.5 - 1 = -5.5;
     * token 0 is outside the window: 1; token 3: 0 */
    double e0 = exp(1.0), e1 = exp(0.0), e2 = exp(-5.5), e3 = exp(0.0), z = e0 + e1 + e2 + e3;
    double w[4] = {e0 / z, e1 / z, e2 / z, e3 / z};
    expect_probs(probs_of(s, l, 4), w, 4);
    dsi_sampler_free(s);

    /* logit bias: -inf bans the argmax under greedy; +2 lifts token 0 */
    dsi_logit_bias b[2] = {{1, -INFINITY}, {0, 2.0f}};
    dsi_sampler_options_init(&o);
    o.temperature = 0.0f;
    o.logit_bias = b;
    o.n_logit_bias = 2;
    assert_int_equal(dsi_sampler_create(&o, &s), DSI_OK);
    b[0].token = 3; /* copied at creation: later changes do not matter */
    float l2[4] = {1.5f, 9.0f, 3.0f, 0.0f};
    dsi_token t;
    assert_int_equal(dsi_sampler_sample(s, l2, 4, &t), DSI_OK);
    assert_int_equal(t, 0); /* 1.5 + 2 = 3.5 > 3.0 */
    /* a bias token outside the vocabulary is caught at sample time */
    assert_int_equal(dsi_sampler_sample(s, l2, 1, &t), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_sampler_last_error(s), "logit_bias[0].token"));
    dsi_sampler_free(s);
}

static void bad_option(void (*set)(dsi_sampler_options *), const char *field) {
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    set(&o);
    dsi_sampler *s = (dsi_sampler *)&o;
    assert_int_equal(dsi_sampler_create(&o, &s), DSI_ERR_INVALID_ARGUMENT);
    assert_null(s);
    if (!strstr(dsi_last_error(), field)) fail_msg("message '%s' does not name %s", dsi_last_error(), field);
}
static void b_temp(dsi_sampler_options *o) { o->temperature = -0.5f; }
static void b_temp_nan(dsi_sampler_options *o) { o->temperature = NAN; }
static void b_topp0(dsi_sampler_options *o) { o->top_p = 0.0f; }
static void b_topp2(dsi_sampler_options *o) { o->top_p = 1.5f; }
static void b_minp(dsi_sampler_options *o) { o->min_p = 1.0f; }
static void b_minpneg(dsi_sampler_options *o) { o->min_p = -0.1f; }
static void b_topk(dsi_sampler_options *o) { o->top_k = -1; }
static void b_lastn(dsi_sampler_options *o) { o->penalty_last_n = -3; }
static void b_rep(dsi_sampler_options *o) { o->repetition_penalty = 0.0f; }
static void b_size(dsi_sampler_options *o) { o->struct_size = 1; }
static const dsi_logit_bias neg_bias[1] = {{-4, 1.0f}};
static void b_bias(dsi_sampler_options *o) { o->logit_bias = neg_bias; o->n_logit_bias = 1; }
static void b_biasnull(dsi_sampler_options *o) { o->n_logit_bias = 2; }

static void test_validation(void **state) {
    (void)state;
    bad_option(b_temp, "temperature");
    bad_option(b_temp_nan, "temperature");
    bad_option(b_topp0, "top_p");
    bad_option(b_topp2, "top_p");
    bad_option(b_minp, "min_p");
    bad_option(b_minpneg, "min_p");
    bad_option(b_topk, "top_k");
    bad_option(b_lastn, "penalty_last_n");
    bad_option(b_rep, "repetition_penalty");
    bad_option(b_size, "struct_size");
    bad_option(b_bias, "logit_bias[0].token");
    bad_option(b_biasnull, "logit_bias");
    dsi_sampler *s = NULL;
    assert_int_equal(dsi_sampler_create(NULL, &s), DSI_OK); /* NULL options: defaults */
    float l[2] = {0, 0};
    dsi_token t;
    const float *p;
    int32_t n;
    assert_int_equal(dsi_sampler_probs(s, &p, &n), DSI_ERR_NOT_FOUND);
    assert_int_equal(dsi_sampler_sample(s, l, 0, &t), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_sampler_sample(s, NULL, 2, &t), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_sampler_sample(s, l, 2, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_sampler_accept(s, -1), DSI_ERR_INVALID_ARGUMENT);
    dsi_sampler_free(s);
    /* an older caller's options (up to top_p only): the rest are defaults */
    dsi_sampler_options o;
    dsi_sampler_options_init(&o);
    o.temperature = 0.0f;
    o.struct_size = (uint32_t)(offsetof(dsi_sampler_options, top_p) + sizeof(float));
    assert_int_equal(dsi_sampler_create(&o, &s), DSI_OK);
    dsi_sampler_free(s);
}

static void test_rng_definition(void **state) {
    (void)state;
    /* xoshiro256** from state {1,2,3,4}: next = rotl(2*5, 7) * 9 = 11520, then state
     * {7, 0, 262146, 6<<45} gives rotl(0*5,7)*9 = 0 (worked by hand from the algorithm). */
    uint64_t st[4] = {1, 2, 3, 4};
    assert_true(dsii_rng_next(st) == 11520u);
    assert_true(st[0] == 7 && st[1] == 0 && st[2] == 262146 && st[3] == (6ull << 45));
    assert_true(dsii_rng_next(st) == 0u);
    /* splitmix64 of seed 0 starts with 0xE220A8397B1DCDAF (its published first output) */
    uint64_t s0[4];
    dsii_rng_seed(s0, 0);
    assert_true(s0[0] == 0xE220A8397B1DCDAFull);
    /* uniform: 53 bits, exactly representable, in [0, 1) */
    uint64_t a[4] = {0, 0, 0, 0};
    assert_true(dsii_rng_uniform(a) == 0.0);
    for (int i = 0; i < 1000; i++) {
        double u = dsii_rng_uniform(s0);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(u * 9007199254740992.0 == floor(u * 9007199254740992.0));
    }
}

static void test_exp(void **state) {
    (void)state;
    for (double x = -740; x <= 700; x += 0.37) {
        double a = dsii_exp(x), b = exp(x);
        if (fabs(a - b) > 4e-16 * b && b > 1e-300) fail_msg("exp(%g): %.17g vs %.17g", x, a, b);
    }
    assert_true(dsii_exp(0.0) == 1.0);
    assert_true(dsii_exp(-1e9) == 0.0);
    assert_true(isinf(dsii_exp(1e9)));
}

static void test_determinism(void **state) {
    (void)state;
    float l[16];
    for (int i = 0; i < 16; i++) l[i] = (float)(i % 5) * 0.3f;
    dsi_token a[200], b[200];
    dsi_sampler *s = make(1.0f, 0, 0.95f, 0.01f, 1234);
    for (int i = 0; i < 200; i++) assert_int_equal(dsi_sampler_sample(s, l, 16, &a[i]), DSI_OK);
    assert_int_equal(dsi_sampler_reset(s), DSI_OK);
    for (int i = 0; i < 200; i++) assert_int_equal(dsi_sampler_sample(s, l, 16, &b[i]), DSI_OK);
    assert_memory_equal(a, b, sizeof a);
    dsi_sampler_free(s);
    s = make(1.0f, 0, 0.95f, 0.01f, 1235);
    int diff = 0;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(dsi_sampler_sample(s, l, 16, &b[i]), DSI_OK);
        diff += a[i] != b[i];
    }
    assert_true(diff > 0);
    dsi_sampler_free(s);
}

static void test_chi_square(void **state) {
    (void)state;
    /* 100000 draws from 0.1/0.2/0.3/0.4 with seed 42; chi-square with 3 degrees of freedom
     * must stay below 16.27 (p = 0.001). Fixed seed: the outcome is the same every run. */
    dsi_sampler *s = make(1.0f, 0, 1.0f, 0.0f, 42);
    long cnt[4] = {0, 0, 0, 0};
    const int N = 100000;
    for (int i = 0; i < N; i++) {
        dsi_token t;
        assert_int_equal(dsi_sampler_sample(s, L4, 4, &t), DSI_OK);
        cnt[t]++;
    }
    double chi = 0;
    for (int i = 0; i < 4; i++) {
        double e = N * 0.1 * (i + 1);
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    printf("counts %ld %ld %ld %ld, chi-square %.3f\n", cnt[0], cnt[1], cnt[2], cnt[3], chi);
    assert_true(chi < 16.27);
    dsi_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_temperature_and_filters),
        cmocka_unit_test(test_penalties_and_bias),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_rng_definition),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_chi_square),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
