/*
 * backends/cpu/kernels, the further ggml weight types (kernels_ggml*.c): every type × ISA
 * path (scalar, AVX2, AVX-512) × odd shapes against a double-precision dot computed from
 * tests/unit/quant/ggml_ref.c's decoders (docs/tensor-types.md), the decoded weight of a
 * one-hot input exact on every path, bit-identity across n_tok / row chunks / thread counts
 * / the MoE gather path (model-spec §10.4), and the paths against each other.
 *
 * Bound (same as test_cpukernels): |y - ref| <= (n_in/4 + 16) 2^-23 sum|w x| — each lane
 * chain adds at most n_in/4 terms; decoded weights are exact on every path.
 * "--isa NAME" runs one path and exits 77 (skip) where this CPU / build cannot run it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/common/skip.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../quant/ggml_ref.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/threadpool.h"
#include "quant/quant.h"

static const int32_t k_types[] = {2, 3, 6, 7, 11, 13, 14, 20, 23, 18, 21, 16, 17, 22, 19, 29};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static uint64_t rs = 0xBB67AE8584CAA73Bull;
static uint64_t rnd(void) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rndu(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

typedef struct problem {
    int32_t type;
    int64_t n_in, n_out, n_tok, xs;
    size_t rb;
    uint8_t *w;
    float *x;
    double *ref, *mag;
} problem;

static void problem_make(problem *p, int32_t type, int64_t n_in, int64_t n_out, int64_t n_tok) {
    p->type = type;
    p->n_in = n_in;
    p->n_out = n_out;
    p->n_tok = n_tok;
    p->rb = dsib_kern_row_bytes(type, n_in);
    assert_true(p->rb > 0);
    p->xs = n_in + 3;
    p->w = malloc(p->rb * (size_t)n_out);
    p->x = malloc(sizeof(float) * (size_t)(p->xs * n_tok));
    p->ref = malloc(sizeof(double) * (size_t)(n_out * n_tok));
    p->mag = malloc(sizeof(double) * (size_t)(n_out * n_tok));
    double *wd = malloc(sizeof(double) * (size_t)n_in);
    assert_non_null(p->w);
    assert_non_null(wd);
    for (int64_t i = 0; i < p->xs * n_tok; i++) p->x[i] = (float)(rndu() * 2 - 1);
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *row = p->w + p->rb * (size_t)o;
        gref_random_row(type, row, n_in, rnd);
        gref_decode(type, row, n_in, wd, NULL);
        for (int64_t t = 0; t < n_tok; t++) {
            double s = 0, m = 0;
            for (int64_t i = 0; i < n_in; i++) {
                s += wd[i] * (double)p->x[t * p->xs + i];
                m += fabs(wd[i] * (double)p->x[t * p->xs + i]);
            }
            p->ref[t * n_out + o] = s;
            p->mag[t * n_out + o] = m;
        }
    }
    free(wd);
}

static void problem_free(problem *p) {
    free(p->w);
    free(p->x);
    free(p->ref);
    free(p->mag);
}

static double tolerance(const problem *p, int64_t idx) {
    return ((double)p->n_in / 4.0 + 16.0) * ldexp(1.0, -23) * p->mag[idx] + 1e-37;
}

static int64_t blck(int32_t type) { return dsib_kern_block_elems(type); }

/* n_in sizes per type: one block, a few blocks, and > 1024 ending off a 256 boundary where
 * the block allows it */
static void sizes(int32_t type, int64_t out[3]) {
    if (blck(type) == 32) {
        out[0] = 32, out[1] = 160, out[2] = 2080;
    } else {
        out[0] = 256, out[1] = 768, out[2] = 2304;
    }
}

/* ---- one-hot inputs: the exact decoded weight on every path -------------------------- */

static void test_one_hot(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int32_t type = k_types[ti];
        const int64_t n = 2 * 256;
        uint8_t row[1024];
        double wd[512];
        float x[512];
        gref_random_row(type, row, n, rnd);
        gref_decode(type, row, n, wd, NULL);
        for (int k = 0; k < 24; k++) {
            const int64_t i = k < 8 ? k * 37 % n : (int64_t)(rnd() % (uint64_t)n);
            memset(x, 0, sizeof x);
            x[i] = 1.0f;
            for (int32_t isa = 0; isa < DSIB_ISA_COUNT; isa++) {
                const dsib_kern_table *kt = dsib_kern_table_for(isa);
                if (!kt) continue;
                float y = -12345.0f;
                kt->matmul_rows(type, row, dsib_kern_row_bytes(type, n), n, 0, 1, x, n, &y, 1, 1);
                if ((double)y != wd[i])
                    fail_msg("%s isa %s element %lld: kernel %.9g, reference %.17g", dsi_type_name(type),
                             kt->name, (long long)i, (double)y, wd[i]);
            }
        }
    }
}

/* ---- types × shapes against the double reference -------------------------------------- */

static void run_types(int32_t isa) {
    const dsib_kern_table *kt = dsib_kern_table_for(isa);
    if (!kt) DSIT_SKIP_TEST("ISA", "ISA path %d not available on this CPU/build", (int)isa);
    static const int64_t n_outs[] = {1, 7};
    static const int64_t n_toks[] = {1, 3, 19};
    int checked = 0;
    double worst = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        int64_t ns[3];
        sizes(k_types[ti], ns);
        for (int ni = 0; ni < 3; ni++)
            for (int oi = 0; oi < 2; oi++)
                for (int tk = 0; tk < 3; tk++) {
                    problem p;
                    problem_make(&p, k_types[ti], ns[ni], n_outs[oi], n_toks[tk]);
                    const int64_t ys = p.n_out + 2;
                    float *y = malloc(sizeof(float) * (size_t)(ys * p.n_tok));
                    assert_non_null(y);
                    for (int64_t i = 0; i < ys * p.n_tok; i++) y[i] = 777.0f;
                    kt->matmul_rows(p.type, p.w, p.rb, p.n_in, 0, p.n_out, p.x, p.xs, y, ys, p.n_tok);
                    for (int64_t t = 0; t < p.n_tok; t++) {
                        for (int64_t o = 0; o < p.n_out; o++) {
                            const int64_t idx = t * p.n_out + o;
                            const double err = fabs((double)y[t * ys + o] - p.ref[idx]);
                            if (!(err <= tolerance(&p, idx)))
                                fail_msg("%s %s n_in %lld n_tok %lld: y[%lld][%lld] = %.9g, want %.9g",
                                         kt->name, dsi_type_name(p.type), (long long)p.n_in,
                                         (long long)p.n_tok, (long long)t, (long long)o,
                                         (double)y[t * ys + o], p.ref[idx]);
                            if (p.mag[idx] > 0) worst = fmax(worst, err / p.mag[idx]);
                            checked++;
                        }
                        assert_true(y[t * ys + p.n_out] == 777.0f);
                    }
                    free(y);
                    problem_free(&p);
                }
    }
    print_message("%s: %d outputs checked (16 types), worst |err| / sum|w x| = %.3g\n", kt->name,
                  checked, worst);
}
static void test_types_scalar(void **state) { (void)state; run_types(DSIB_ISA_SCALAR); }
static void test_types_avx2(void **state) { (void)state; run_types(DSIB_ISA_AVX2); }
static void test_types_avx512(void **state) { (void)state; run_types(DSIB_ISA_AVX512); }

/* ---- invariance: batched = token by token = odd row chunks / token groups ------------------ */

static void run_invariance(int32_t isa) {
    const dsib_kern_table *kt = dsib_kern_table_for(isa);
    if (!kt) DSIT_SKIP_TEST("ISA", "ISA path %d not available on this CPU/build", (int)isa);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        int64_t ns[3];
        sizes(k_types[ti], ns);
        problem p;
        problem_make(&p, k_types[ti], ns[2], 37, 21);
        const size_t ny = (size_t)(p.n_out * p.n_tok);
        float *yb = malloc(ny * sizeof(float)), *y1 = malloc(ny * sizeof(float)), *yc = malloc(ny * sizeof(float));
        kt->matmul_rows(p.type, p.w, p.rb, p.n_in, 0, p.n_out, p.x, p.xs, yb, p.n_out, p.n_tok);
        for (int64_t t = 0; t < p.n_tok; t++)
            kt->matmul_rows(p.type, p.w, p.rb, p.n_in, 0, p.n_out, p.x + t * p.xs, p.xs, y1 + t * p.n_out,
                            p.n_out, 1);
        assert_memory_equal(yb, y1, ny * sizeof(float));
        const int64_t cuts[] = {0, 5, 6, 37};
        for (int c = 0; c < 3; c++) {
            kt->matmul_rows(p.type, p.w, p.rb, p.n_in, cuts[c], cuts[c + 1], p.x, p.xs, yc, p.n_out, 5);
            kt->matmul_rows(p.type, p.w, p.rb, p.n_in, cuts[c], cuts[c + 1], p.x + 5 * p.xs, p.xs,
                            yc + 5 * p.n_out, p.n_out, 16);
        }
        assert_memory_equal(yb, yc, ny * sizeof(float));
        free(yb);
        free(y1);
        free(yc);
        problem_free(&p);
    }
}
static void test_invariance_scalar(void **state) { (void)state; run_invariance(DSIB_ISA_SCALAR); }
static void test_invariance_avx2(void **state) { (void)state; run_invariance(DSIB_ISA_AVX2); }
static void test_invariance_avx512(void **state) { (void)state; run_invariance(DSIB_ISA_AVX512); }

/* ---- threads and the MoE gather path (process ISA) -------------------------------------------- */

static void test_threads_and_moe(void **state) {
    (void)state;
    const dsib_kern_table *kt = dsib_kern_table_get();
    dsib_threadpool *pool;
    assert_int_equal(dsib_threadpool_create(3, NULL, &pool, NULL, 0), DSI_OK);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int32_t type = k_types[ti];
        const int64_t n_in = 512, n_out = 45, n_exp = 4, n_tok = 6;
        problem p;
        problem_make(&p, type, n_in, n_out * n_exp, n_tok);
        const size_t ny = (size_t)(p.n_out * p.n_tok);
        float *ya = malloc(ny * sizeof(float)), *yb = malloc(ny * sizeof(float));
        kt->matmul_rows(type, p.w, p.rb, n_in, 0, p.n_out, p.x, p.xs, ya, p.n_out, n_tok);
        /* this file's path is the exact one (the default path of the types that have one: test_cpukernels.c) */
        assert_int_equal(dsib_matmul(pool, DSIB_MM_EXACT, type, p.w, p.rb, n_in, p.n_out, p.x, p.xs, yb,
                                     p.n_out, n_tok),
                         DSI_OK);
        assert_memory_equal(ya, yb, ny * sizeof(float));
        /* MoE: token t → experts t % 4 and (t + 1) % 4, grouped by expert */
        const size_t estride = p.rb * (size_t)n_out;
        int32_t experts[4] = {2, 0, 3, 1};
        int64_t offs[5], xrows[12], yrows[12], ns = 0;
        for (int g = 0; g < 4; g++) {
            offs[g] = ns;
            for (int64_t t = 0; t < n_tok; t++) {
                const int k = t % 4 == experts[g] ? 0 : (t + 1) % 4 == experts[g] ? 1 : -1;
                if (k < 0) continue;
                xrows[ns] = t;
                yrows[ns++] = 2 * t + k;
            }
        }
        offs[4] = ns;
        float *y = calloc((size_t)(n_tok * 2 * n_out), sizeof(float)), yr[45];
        dsib_moe_matmul m = {type, p.w, estride, p.rb, n_in, n_out, 4, 4, experts, offs, xrows, yrows,
                             p.x, p.xs, y, n_out, DSIB_MM_EXACT};
        char msg[256];
        assert_int_equal(dsib_matmul_moe(pool, &m, msg, sizeof msg), DSI_OK);
        for (int64_t s = 0; s < ns; s++) {
            int32_t e = -1;
            for (int g = 0; g < 4; g++)
                if (s >= offs[g] && s < offs[g + 1]) e = experts[g];
            assert_int_equal(dsib_matmul_expert(NULL, DSIB_MM_EXACT, type, p.w, estride, e, p.rb, n_in, n_out,
                                                p.x + xrows[s] * p.xs, p.xs, yr, n_out, 1), DSI_OK);
            assert_memory_equal(yr, y + yrows[s] * n_out, (size_t)n_out * sizeof(float));
            for (int64_t o = 0; o < n_out; o++) {
                const int64_t idx = xrows[s] * p.n_out + e * n_out + o;
                assert_true(fabs(yr[o] - p.ref[idx]) <= tolerance(&p, idx));
            }
        }
        free(y);
        free(ya);
        free(yb);
        problem_free(&p);
    }
    dsib_threadpool_free(pool);
}

/* ---- the paths against each other, and lib/quant's reference dot ------------------------------ */

static void test_cross_isa(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        int64_t ns[3];
        sizes(k_types[ti], ns);
        problem p;
        problem_make(&p, k_types[ti], ns[2], 8, 2);
        float ys[16], yv[16];
        dsib_kern_table_for(DSIB_ISA_SCALAR)->matmul_rows(p.type, p.w, p.rb, p.n_in, 0, 8, p.x, p.xs, ys, 8, 2);
        for (int32_t isa = 1; isa < DSIB_ISA_COUNT; isa++) {
            const dsib_kern_table *kt = dsib_kern_table_for(isa);
            if (!kt) continue;
            kt->matmul_rows(p.type, p.w, p.rb, p.n_in, 0, 8, p.x, p.xs, yv, 8, 2);
            for (int i = 0; i < 16; i++) assert_true(fabs((double)ys[i] - yv[i]) <= 2 * tolerance(&p, i));
        }
        for (int64_t o = 0; o < 8; o++) { /* lib/quant's reference dot, token 0 */
            float d = 0;
            assert_int_equal(dsii_dot_row(p.type, p.w + p.rb * (size_t)o, p.x, p.n_in, &d, NULL), DSI_OK);
            assert_true(fabs((double)d - p.ref[o]) <= ((double)p.n_in + 16) * ldexp(p.mag[o], -23));
        }
        problem_free(&p);
    }
}

static void test_checks(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const dsii_type_traits *tr = dsii_type_get(k_types[ti]);
        assert_true(dsib_kern_type_supported(k_types[ti]));
        assert_int_equal(dsib_kern_block_elems(k_types[ti]), tr->blck);
        assert_int_equal(dsib_kern_row_bytes(k_types[ti], 4 * 256), 4 * 256 / tr->blck * tr->type_size);
        assert_int_equal(dsib_kern_row_bytes(k_types[ti], tr->blck + 16), 0);
    }
    char msg[160];
    assert_int_equal(dsib_kern_check(34 /* tq1_0 */, 256, 4, 54, 256, 4, msg, sizeof msg), DSI_ERR_UNSUPPORTED);
    assert_int_equal(dsib_kern_check(16, 200, 4, 66, 200, 4, msg, sizeof msg), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "iq2_xxs"));
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--isa")) {
        const int32_t isa = !strcmp(argv[2], "scalar") ? DSIB_ISA_SCALAR
                            : !strcmp(argv[2], "avx2") ? DSIB_ISA_AVX2
                            : !strcmp(argv[2], "avx512") ? DSIB_ISA_AVX512 : -1;
        if (isa < 0) {
            fprintf(stderr, "unknown ISA %s\n", argv[2]);
            return 2;
        }
        if (!dsib_kern_table_for(isa))
            return dsit_absent("ISA", "the %s kernels cannot run on this CPU / build", argv[2]);
        const struct CMUnitTest t_scalar[] = {cmocka_unit_test(test_types_scalar), cmocka_unit_test(test_invariance_scalar)};
        const struct CMUnitTest t_avx2[] = {cmocka_unit_test(test_types_avx2), cmocka_unit_test(test_invariance_avx2)};
        const struct CMUnitTest t_avx512[] = {cmocka_unit_test(test_types_avx512), cmocka_unit_test(test_invariance_avx512)};
        if (isa == DSIB_ISA_SCALAR) return cmocka_run_group_tests(t_scalar, NULL, NULL);
        if (isa == DSIB_ISA_AVX2) return cmocka_run_group_tests(t_avx2, NULL, NULL);
        return cmocka_run_group_tests(t_avx512, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checks),          cmocka_unit_test(test_one_hot),
        cmocka_unit_test(test_threads_and_moe), cmocka_unit_test(test_cross_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
