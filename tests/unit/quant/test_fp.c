/*
 * Scalar format conversions (lib/quant/fp.h). Expected values come from the format
 * definitions written out here (model-spec §2.1, §10.1), or from brute-force nearest-grid
 * searches over grids built independently in this file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/fp.h"

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- f16 ------------------------------------------------------------------------------ */

static void test_f16_known(void **state) {
    (void)state;
    assert_int_equal(dsii_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(dsii_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(dsii_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(dsii_f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(dsii_f32_to_f16(65520.0f), 0x7C00); /* tie to even → inf */
    assert_int_equal(dsii_f32_to_f16(1e10f), 0x7C00);
    assert_int_equal(dsii_f32_to_f16(-INFINITY), 0xFC00);
    assert_int_equal(dsii_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(dsii_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);
    assert_int_equal(dsii_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);        /* tie → even 0 */
    assert_int_equal(dsii_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(dsii_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);        /* 1.5 units → 2 */
    assert_int_equal(dsii_f32_to_f16(ldexpf(5.0f, -25)), 0x0002);        /* 2.5 units → 2 */
    assert_int_equal(dsii_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3C00); /* tie → even */
    assert_int_equal(dsii_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3C02);
    assert_int_equal(dsii_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400);    /* → smallest normal */
    uint16_t n = dsii_f32_to_f16(NAN);
    assert_int_equal(n & 0x7C00, 0x7C00);
    assert_true((n & 0x3FF) != 0);
    assert_true(dsii_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(dsii_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(dsii_f16_to_f32(0xFC00) == -INFINITY);
    assert_true(isnan(dsii_f16_to_f32(0x7E00)));
}

static void test_f16_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t e = (h >> 10) & 31, m = h & 1023;
        double expect;
        if (e == 31) {
            if (m) {
                assert_true(isnan(dsii_f16_to_f32((uint16_t)h)));
                continue;
            }
            expect = INFINITY;
        } else if (e == 0) {
            expect = ldexp((double)m, -24);
        } else {
            expect = ldexp(1.0 + m / 1024.0, (int)e - 15);
        }
        if (h & 0x8000) expect = -expect;
        float got = dsii_f16_to_f32((uint16_t)h);
        assert_true((double)got == expect);
        assert_int_equal(signbit(got) != 0, (h & 0x8000) != 0);
        assert_int_equal(dsii_f32_to_f16(got), h);
    }
}

/* Every midpoint between consecutive finite f16 (and bf16) values rounds to the even code;
 * the floats just beside it round to the nearer neighbour. */
static void test_midpoints(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x7BFF; h++) {
        double lo = (double)dsii_f16_to_f32((uint16_t)h), hi = (double)dsii_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        assert_true((double)mid == (lo + hi) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(dsii_f32_to_f16(mid), even);
        assert_int_equal(dsii_f32_to_f16(-mid), even | 0x8000);
        assert_int_equal(dsii_f32_to_f16(nextafterf(mid, 0.0f)), h);
        assert_int_equal(dsii_f32_to_f16(nextafterf(mid, INFINITY)), h + 1);
    }
    for (uint32_t h = 0; h < 0x7F7F; h++) {
        double lo = (double)dsii_bf16_to_f32((uint16_t)h), hi = (double)dsii_bf16_to_f32((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        assert_true((double)mid == (lo + hi) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(dsii_f32_to_bf16(mid), even);
        assert_int_equal(dsii_f32_to_bf16(nextafterf(mid, 0.0f)), h);
        assert_int_equal(dsii_f32_to_bf16(nextafterf(mid, INFINITY)), h + 1);
    }
}

/* ---- bf16 ----------------------------------------------------------------------------- */

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(dsii_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(dsii_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3F80); /* tie → even */
    assert_int_equal(dsii_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3F82);
    assert_int_equal(dsii_f32_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)), 0x3F81);
    assert_true(isnan(dsii_bf16_to_f32(dsii_f32_to_bf16(NAN))));
    assert_true(dsii_bf16_rne(3.14159265f) == 3.140625f);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dsii_bf16_to_f32((uint16_t)h);
        assert_int_equal(fbits(f), h << 16);
        if (isnan(f)) continue;
        assert_int_equal(dsii_f32_to_bf16(f), h);
    }
}

/* ---- e8m0 ----------------------------------------------------------------------------- */

static void test_e8m0(void **state) {
    (void)state;
    assert_true(dsii_e8m0_to_f32(127) == 1.0f);
    assert_true(dsii_e8m0_to_f32(128) == 2.0f);
    assert_true(dsii_e8m0_to_f32(1) == ldexpf(1.0f, -126));
    assert_int_equal(fbits(dsii_e8m0_to_f32(0)), 0x00400000u); /* 2^-127 */
    assert_true((double)dsii_e8m0_to_f32(0) == ldexp(1.0, -127));
    assert_true((double)dsii_e8m0_to_f32(254) == ldexp(1.0, 127));
    assert_true(isnan(dsii_e8m0_to_f32(255)));
    assert_int_equal(dsii_e8m0_ceil(1.0f), 127);
    assert_int_equal(dsii_e8m0_ceil(1.5f), 128);
    assert_int_equal(dsii_e8m0_ceil(0.75f), 127);
    assert_int_equal(dsii_e8m0_ceil(0.5f), 126);
    assert_int_equal(dsii_e8m0_ceil(0.5000001f), 127);
    assert_int_equal(dsii_e8m0_ceil(ldexpf(1.0f, -130)), 0);   /* clamped */
    assert_int_equal(dsii_e8m0_ceil(ldexpf(1.0f, 127) * 1.5f), 254);
    assert_int_equal(dsii_e8m0_ceil(0.0f), 127);
    assert_int_equal(dsii_e8m0_ceil(NAN), 127);
    assert_int_equal(dsii_f32_to_e8m0(1.0f), 127);
    assert_int_equal(dsii_f32_to_e8m0(1.4f), 127);
    assert_int_equal(dsii_f32_to_e8m0(1.6f), 128);
    assert_int_equal(dsii_f32_to_e8m0(1.5f), 128);  /* tie 1 (127) / 2 (128): even 128 */
    assert_int_equal(dsii_f32_to_e8m0(3.0f), 128);  /* tie 2 (128) / 4 (129): even 128 */
    assert_int_equal(dsii_f32_to_e8m0(0.75f), 126); /* tie .5 (126) / 1 (127): even 126 */
    assert_int_equal(dsii_f32_to_e8m0(ldexpf(1.0f, -140)), 0);
    assert_int_equal(dsii_f32_to_e8m0(0.0f), 0);
    assert_int_equal(dsii_f32_to_e8m0(INFINITY), 254);
    assert_int_equal(dsii_f32_to_e8m0(-1.0f), 255);
    assert_int_equal(dsii_f32_to_e8m0(NAN), 255);
    for (int e = 0; e < 255; e++) assert_int_equal(dsii_f32_to_e8m0(dsii_e8m0_to_f32((uint8_t)e)), e);
    /* model-spec §10.1: s = 2^ceil(log2(amax · f32(1/448))) */
    assert_int_equal(dsii_e8m0_ceil(448.0f * (1.0f / 448.0f)), 127);
    assert_int_equal(dsii_e8m0_ceil(449.0f * (1.0f / 448.0f)), 128);
}

/* ---- e4m3 ----------------------------------------------------------------------------- */

static double e4m3_def(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return s ? -v : v;
}

static void test_e4m3_decode(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        float f = dsii_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7F) == 0x7F) {
            assert_true(isnan(f));
            continue;
        }
        assert_true((double)f == e4m3_def((uint8_t)b));
        assert_int_equal(dsii_f32_to_e4m3(f), b); /* round trip incl. -0 (0x80) */
    }
    assert_true(dsii_e4m3_to_f32(0x7E) == 448.0f);
    assert_true(dsii_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    assert_true(dsii_e4m3_to_f32(0x08) == ldexpf(1.0f, -6));
}

/* Independent oracle: nearest of the 127 non-negative finite grid values, ties to the even
 * code, saturating at 448. */
static double e4m3_oracle(double x) {
    double a = fabs(x);
    if (a >= 448.0) return x < 0 ? -448.0 : 448.0;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7E; c++) {
        double d = fabs(e4m3_def((uint8_t)c) - a);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    double v = e4m3_def((uint8_t)best);
    return x < 0 ? -v : v;
}

static void test_e4m3_rne(void **state) {
    (void)state;
    /* ties between neighbouring grid points go to the even mantissa */
    assert_true(dsii_e4m3_rne(1.0625f) == 1.0f);
    assert_true(dsii_e4m3_rne(1.1875f) == 1.25f);
    assert_true(dsii_e4m3_rne(464.0f) == 448.0f);
    assert_true(dsii_e4m3_rne(470.0f) == 448.0f); /* saturates instead of NaN */
    assert_true(dsii_e4m3_rne(1e30f) == 448.0f);
    assert_true(dsii_e4m3_rne(-INFINITY) == -448.0f);
    assert_true(isnan(dsii_e4m3_rne(NAN)));
    /* subnormals: step 2^-9 */
    assert_true(dsii_e4m3_rne(ldexpf(1.0f, -10)) == 0.0f);             /* 0.5 step → 0 */
    assert_true(dsii_e4m3_rne(ldexpf(1.0f, -10) * 1.01f) == ldexpf(1.0f, -9));
    assert_true(dsii_e4m3_rne(ldexpf(1.5f, -9)) == ldexpf(2.0f, -9));  /* 1.5 → 2 */
    assert_true(dsii_e4m3_rne(ldexpf(2.5f, -9)) == ldexpf(2.0f, -9));  /* 2.5 → 2 */
    assert_true(dsii_e4m3_rne(ldexpf(7.5f, -9)) == ldexpf(1.0f, -6));  /* → min normal */
    assert_true(dsii_e4m3_rne(ldexpf(6.5f, -9)) == ldexpf(6.0f, -9));
    assert_true(signbit(dsii_e4m3_rne(-ldexpf(1.0f, -12))));          /* -0 */
    /* every midpoint between consecutive positive codes, and points just around it */
    for (int c = 0; c < 0x7E; c++) {
        double lo = e4m3_def((uint8_t)c), hi = e4m3_def((uint8_t)(c + 1));
        float mid = (float)((lo + hi) / 2);
        assert_true((double)mid == (lo + hi) / 2);
        double want = (c & 1) ? hi : lo;
        assert_true((double)dsii_e4m3_rne(mid) == want);
        assert_true((double)dsii_e4m3_rne(-mid) == -want);
        assert_true((double)dsii_e4m3_rne(nextafterf(mid, 0.0f)) == lo);
        assert_true((double)dsii_e4m3_rne(nextafterf(mid, 1000.0f)) == hi);
    }
    srand(1234);
    for (int i = 0; i < 20000; i++) {
        double r = (double)rand() / RAND_MAX;
        float x = (float)(ldexp(r, (rand() % 24) - 14) * ((rand() & 1) ? -1 : 1));
        assert_true((double)dsii_e4m3_rne(x) == e4m3_oracle(x));
    }
}

/* ---- e2m1 ----------------------------------------------------------------------------- */

static void test_e2m1(void **state) {
    (void)state;
    static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (int n = 0; n < 16; n++) {
        double want = (n & 8) ? -grid[n & 7] : grid[n & 7];
        float got = dsii_e2m1_to_f32((uint8_t)n);
        assert_true((double)got == want);
        assert_int_equal(signbit(got) != 0, (n & 8) != 0);
        assert_int_equal(dsii_f32_to_e2m1(got), n);
    }
    /* model-spec §10.1 ties */
    struct { float x, y; } ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                                     {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f}};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        assert_true(dsii_e2m1_rne(ties[i].x) == ties[i].y);
        assert_true(dsii_e2m1_rne(-ties[i].x) == -ties[i].y);
    }
    assert_true(dsii_e2m1_rne(0.2500001f) == 0.5f);
    assert_true(dsii_e2m1_rne(4.9999f) == 4.0f);
    assert_true(dsii_e2m1_rne(5.0001f) == 6.0f);
    assert_true(dsii_e2m1_rne(100.0f) == 6.0f);
    assert_true(dsii_e2m1_rne(-INFINITY) == -6.0f);
    assert_true(dsii_e2m1_rne(NAN) == 0.0f);
    assert_true(dsii_e2m1_rne(ldexpf(1.0f, -140)) == 0.0f); /* f32 subnormal input */
    /* brute-force oracle */
    srand(99);
    for (int i = 0; i < 20000; i++) {
        float x = (float)(((double)rand() / RAND_MAX) * 14.0 - 7.0);
        double a = fabs(x), bd = INFINITY, best = 0;
        for (int c = 0; c < 8; c++) {
            double d = fabs(grid[c] - a);
            if (d < bd || (d == bd && (c & 1) == 0)) {
                bd = d;
                best = grid[c];
            }
        }
        if (x < 0) best = -best;
        assert_true((double)dsii_e2m1_rne(x) == best);
    }
}

/* model-spec §10.1 recipe, e4m3 with UE8M0 scale, on a block that exercises saturation. */
static void test_fake_quant_recipe(void **state) {
    (void)state;
    float x[4] = {1000.0f, -3.0f, 0.01f, 2.2f};
    float amax = 1000.0f;
    float s = dsii_e8m0_to_f32(dsii_e8m0_ceil(amax * (1.0f / 448.0f)));
    assert_true(s == 4.0f); /* 1000/448 = 2.23 → 2^2 */
    assert_true(dsii_e4m3_rne(x[0] / s) * s == 1024.0f);     /* 250 → 256 (step 16) */
    assert_true(dsii_e4m3_rne(x[1] / s) * s == -3.0f);       /* 0.75 exact */
    assert_true(dsii_e4m3_rne(x[2] / s) * s == 0.0078125f);  /* 0.0025 → 1.28·2^-9 → 2^-9 */
    assert_true(dsii_e4m3_rne(x[3] / s) * s == 2.25f);       /* 0.55 → 0.5625 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_known),    cmocka_unit_test(test_f16_exhaustive),
        cmocka_unit_test(test_midpoints),
        cmocka_unit_test(test_bf16),         cmocka_unit_test(test_e8m0),
        cmocka_unit_test(test_e4m3_decode),  cmocka_unit_test(test_e4m3_rne),
        cmocka_unit_test(test_e2m1),         cmocka_unit_test(test_fake_quant_recipe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
