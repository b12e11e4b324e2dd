/*
 * Tensor types (lib/quant/quant.h): traits, hand-built blocks dequantized and dotted against
 * values computed here from the format definitions (docs/tensor-types.md), and
 * quantize → dequantize error bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

/* ---- independent decoders written from the format definitions ------------------------- */

static double f16_def(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1.0 + m / 1024.0, e - 15);
    return (h & 0x8000) ? -v : v;
}
static double e8m0_def(uint8_t e) {
    if (e == 255) return NAN;
    return ldexp(1.0, e - 127);
}
static double e4m3_def(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp(m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return (b & 0x80) ? -v : v;
}
static const double k_e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Compares got (f32) to expected (computed in double, rounded once to f32 as the kernels do
 * their arithmetic in f32: allow a few ulps). NaN must match NaN. */
static void expect_close(const float *got, const double *want, int n, double rel) {
    for (int i = 0; i < n; i++) {
        if (isnan(want[i])) {
            if (!isnan(got[i])) fail_msg("element %d: expected NaN, got %g", i, (double)got[i]);
            continue;
        }
        if (isinf(want[i])) {
            if (got[i] != want[i]) fail_msg("element %d: expected %g, got %g", i, want[i], (double)got[i]);
            continue;
        }
        double tol = rel * fabs(want[i]) + 1e-45;
        if (fabs((double)got[i] - want[i]) > tol)
            fail_msg("element %d: expected %.9g, got %.9g", i, want[i], (double)got[i]);
    }
}

static void check_dot(int32_t type, const void *blk, const double *want, int n) {
    float y[512];
    double ref = 0, mag = 0;
    for (int i = 0; i < n; i++) {
        y[i] = (float)(((i * 37) % 17) - 8) / 8.0f;
        ref += want[i] * y[i];
        mag += fabs(want[i] * y[i]);
    }
    float got = 0;
    assert_int_equal(dsii_dot_row(type, blk, y, n, &got, NULL), DSI_OK);
    if (fabs((double)got - ref) > 1e-5 * mag + 1e-30)
        fail_msg("dot type %d: expected %.9g got %.9g", (int)type, ref, (double)got);
}

/* ---- traits ----------------------------------------------------------------------------- */

static void test_traits(void **state) {
    (void)state;
    struct { int32_t id; const char *name; uint32_t blck, size; int rm, sup; } t[] = {
        {DSI_TYPE_F32, "f32", 1, 4, 1, 1},         {DSI_TYPE_F16, "f16", 1, 2, 1, 1},
        {DSI_TYPE_BF16, "bf16", 1, 2, 1, 1},       {DSI_TYPE_Q8_0, "q8_0", 32, 34, 1, 1},
        {DSI_TYPE_Q4_K, "q4_k", 256, 144, 1, 1},   {DSI_TYPE_Q2_K, "q2_k", 256, 84, 1, 1},
        {DSI_TYPE_MXFP4, "mxfp4", 32, 17, 1, 1},   {DSI_TYPE_IQ2_XXS, "iq2_xxs", 256, 66, 1, 1},
        {DSI_TYPE_I32, "i32", 1, 4, 1, 1},         {DSI_TYPE_FP8_E4M3_B128, "fp8_e4m3_b128", 128, 129, 0, 1},
        {DSI_TYPE_FP8_E4M3_B32, "fp8_e4m3_b32", 32, 33, 0, 1},
        {DSI_TYPE_FP8_E4M3_R32, "fp8_e4m3_r32", 32, 33, 0, 1},
        {14, "q6_k", 256, 210, 1, 1},              {2, "q4_0", 32, 18, 1, 1},
        {15, "q8_k", 256, 292, 1, 0},              {34, "tq1_0", 256, 54, 1, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const dsii_type_traits *tr = dsii_type_get(t[i].id);
        assert_non_null(tr);
        assert_string_equal(tr->name, t[i].name);
        assert_string_equal(dsi_type_name(t[i].id), t[i].name);
        assert_int_equal(tr->blck, t[i].blck);
        assert_int_equal(tr->type_size, t[i].size);
        assert_int_equal(tr->row_multiple, t[i].rm);
        assert_int_equal(tr->supported, t[i].sup);
    }
    assert_null(dsii_type_get(4)); /* removed Q4_2 */
    assert_null(dsii_type_get(40));
    assert_null(dsi_type_name(77));
    assert_null(dsi_type_name(-1));

    uint64_t b = 0;
    assert_true(dsii_type_row_size(DSI_TYPE_Q4_K, 4096, &b));
    assert_int_equal(b, 16 * 144);
    assert_false(dsii_type_row_size(DSI_TYPE_Q8_0, 33, &b));
    assert_true(dsii_type_row_size(DSI_TYPE_FP8_E4M3_B128, 200, &b));
    assert_int_equal(b, 2 * 129);
    assert_true(dsii_type_row_size(DSI_TYPE_FP8_E4M3_R32, 256, &b));
    assert_int_equal(b, 264); /* Engram row: 256 values + 8 scales */
    int64_t ne[4] = {64, 3, 2, 5};
    assert_true(dsii_type_nbytes(DSI_TYPE_Q8_0, ne, 4, &b));
    assert_int_equal(b, 2 * 34 * 30);
    int64_t huge[4] = {INT64_MAX, INT64_MAX, 1, 1};
    assert_false(dsii_type_nbytes(DSI_TYPE_F32, huge, 2, &b));
    assert_false(dsii_type_nbytes(DSI_TYPE_F32, ne, 0, &b));
    assert_false(dsii_type_nbytes(DSI_TYPE_F32, ne, 5, &b));
    assert_false(dsii_type_nbytes(9999, ne, 1, &b));
}

static void test_unsupported(void **state) {
    (void)state;
    uint8_t blk[66] = {0};
    float out[256];
    dsii_error e;
    dsii_error_clear(&e);
    assert_int_equal(dsii_dequantize_row(35, blk, out, 256, &e), DSI_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "tq2_0"));
    assert_int_equal(dsii_dequantize_row(1234, blk, out, 256, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_Q8_0, blk, out, 31, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsii_quantize_row(DSI_TYPE_I32, out, blk, 4, &e), DSI_ERR_UNSUPPORTED);
}

/* ---- hand-built blocks -------------------------------------------------------------------- */

static void test_q8_0(void **state) {
    (void)state;
    uint16_t ds[4] = {0x3800 /* 0.5 */, 0x0001 /* 2^-24 subnormal */, 0x0000, 0x7E00 /* NaN */};
    for (int k = 0; k < 4; k++) {
        uint8_t b[34];
        double want[32];
        put16(b, ds[k]);
        for (int j = 0; j < 32; j++) {
            int8_t q = (int8_t)(j * 9 - 128); /* covers -128 .. 151→wrap */
            if (j == 31) q = 127;
            b[2 + j] = (uint8_t)q;
            want[j] = f16_def(ds[k]) * q;
        }
        float got[32];
        assert_int_equal(dsii_dequantize_row(DSI_TYPE_Q8_0, b, got, 32, NULL), DSI_OK);
        expect_close(got, want, 32, 1e-7);
        if (k != 3) check_dot(DSI_TYPE_Q8_0, b, want, 32);
    }
}

static void test_q4_k(void **state) {
    (void)state;
    /* (d, dmin): normal; zero d; subnormal d with zero dmin; negative dmin; NaN d */
    static const uint16_t dd[5][2] = {{0x3C00, 0x3400}, {0x0000, 0x3400}, {0x0001, 0x0000},
                                      {0x3C00, 0xB400}, {0x7E00, 0x3400}};
    for (int k = 0; k < 5; k++) {
        uint8_t b[144];
        memset(b, 0, sizeof b);
        put16(b, dd[k][0]);
        put16(b + 2, dd[k][1]);
        int ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = (j * 11 + 1) & 63; /* j >= 4 exercises the high 2 bits */
            lm[j] = (j * 13 + 40) & 63;
        }
        uint8_t *sc = b + 4;
        /* 12-byte packing (ggml get_scale_min_k4): bytes 0..3 hold scales 0..3 (low 6 bits),
         * bytes 4..7 mins 0..3; bytes 8..11 hold the low 4 bits of scale j (low nibble) and min j
         * (high nibble) for j = 4..7, whose high 2 bits sit in the top bits of bytes j-4 (scale)
         * and j (min). */
        for (int j = 0; j < 4; j++) {
            sc[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
            sc[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
            sc[j + 8] = (uint8_t)((ls[j + 4] & 15) | ((lm[j + 4] & 15) << 4));
        }
        double want[256];
        for (int e = 0; e < 256; e++) {
            int sub = e / 32, q = (e * 7 + 3) % 16;
            int c = sub / 2, l = e % 32;
            b[16 + 32 * c + l] |= (uint8_t)((sub & 1) ? q << 4 : q);
            want[e] = f16_def(dd[k][0]) * ls[sub] * q - f16_def(dd[k][1]) * lm[sub];
        }
        float got[256];
        assert_int_equal(dsii_dequantize_row(DSI_TYPE_Q4_K, b, got, 256, NULL), DSI_OK);
        expect_close(got, want, 256, 1e-6);
        if (k != 4) check_dot(DSI_TYPE_Q4_K, b, want, 256);
    }
}

static void test_q2_k(void **state) {
    (void)state;
    static const uint16_t dd[4][2] = {{0x3400, 0x2E00}, {0x0000, 0x2E00}, {0x0001, 0x8000},
                                      {0x3400, 0x7C00}};
    for (int k = 0; k < 4; k++) {
        uint8_t b[84];
        memset(b, 0, sizeof b);
        for (int s = 0; s < 16; s++) b[s] = (uint8_t)((s & 15) | ((15 - s) << 4));
        put16(b + 80, dd[k][0]);
        put16(b + 82, dd[k][1]);
        double want[256];
        for (int e = 0; e < 256; e++) {
            int q = (e * 3 + e / 7) % 4;
            /* element e = 128h + 32j + l is bits 2j of qs[32h + l]; scale byte e/16 */
            b[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e / 32) % 4)));
            int s = e / 16;
            /* 0 · inf (min 0 with dmin = inf) is NaN, as the formula gives in IEEE arithmetic */
            want[e] = f16_def(dd[k][0]) * (s & 15) * q - f16_def(dd[k][1]) * (15 - s);
        }
        float got[256];
        assert_int_equal(dsii_dequantize_row(DSI_TYPE_Q2_K, b, got, 256, NULL), DSI_OK);
        expect_close(got, want, 256, 1e-6);
        if (k != 3) check_dot(DSI_TYPE_Q2_K, b, want, 256);
    }
}

static void test_mxfp4(void **state) {
    (void)state;
    uint8_t es[5] = {128, 0, 127 + 20, 254, 255};
    for (int k = 0; k < 5; k++) {
        uint8_t b[17];
        b[0] = es[k];
        double want[32];
        for (int j = 0; j < 16; j++) {
            int lo = j, hi = (j * 5 + 3) & 15;
            if (es[k] == 254) hi &= 0xA; /* keep |v| <= 1... */
            b[1 + j] = (uint8_t)(lo | (hi << 4));
            /* element j is the low nibble of byte j, element j + 16 the high nibble */
            want[j] = k_e2m1[lo] * e8m0_def(es[k]);
            want[j + 16] = k_e2m1[hi] * e8m0_def(es[k]);
        }
        for (int j = 0; j < 32; j++) /* results beyond f32 range are inf (6·2^127 > FLT_MAX) */
            if (!isnan(want[j]) && fabs(want[j]) > 3.4028234663852886e38) want[j] = want[j] > 0 ? INFINITY : -INFINITY;
        float got[32];
        assert_int_equal(dsii_dequantize_row(DSI_TYPE_MXFP4, b, got, 32, NULL), DSI_OK);
        expect_close(got, want, 32, 0);
        if (es[k] != 255 && es[k] != 254) check_dot(DSI_TYPE_MXFP4, b, want, 32);
    }
}

static void test_fp8(void **state) {
    (void)state;
    /* B128: two blocks cover all 256 codes (incl. NaN 0x7F/0xFF, -0, subnormals) */
    uint8_t b[2 * 129];
    uint8_t sc[2] = {127 - 3, 127 + 5};
    double want[256];
    for (int k = 0; k < 2; k++) {
        b[k * 129] = sc[k];
        for (int j = 0; j < 128; j++) {
            uint8_t code = (uint8_t)(k * 128 + j);
            b[k * 129 + 1 + j] = code;
            want[k * 128 + j] = e4m3_def(code) * e8m0_def(sc[k]);
        }
    }
    float got[256];
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_FP8_E4M3_B128, b, got, 256, NULL), DSI_OK);
    expect_close(got, want, 256, 0);

    /* B32 / R32 with extreme scales: 0 (2^-127), 254 (2^127), 255 (NaN); padded last block */
    uint8_t es[4] = {0, 254, 255, 127};
    for (int t = 0; t < 2; t++) {
        int32_t type = t ? DSI_TYPE_FP8_E4M3_R32 : DSI_TYPE_FP8_E4M3_B32;
        uint8_t r[4 * 33];
        double w2[4 * 32];
        int n = 3 * 32 + 5; /* last block: 5 valid elements + 27 padding bytes */
        for (int k = 0; k < 4; k++) {
            r[k * 33] = es[k];
            for (int j = 0; j < 32; j++) {
                uint8_t code = (uint8_t)((j * 29 + k * 7) & 0xFF);
                if (k == 1) code &= 0x8F; /* small magnitudes so 2^127 scale stays finite */
                if (k == 3 && j >= 5) code = 0;
                r[k * 33 + 1 + j] = code;
                w2[k * 32 + j] = e4m3_def(code) * e8m0_def(es[k]);
            }
        }
        for (int j = 0; j < 4 * 32; j++)
            if (!isnan(w2[j]) && fabs(w2[j]) > 3.4028234663852886e38) w2[j] = w2[j] > 0 ? INFINITY : -INFINITY;
        float g2[4 * 32];
        for (int j = 0; j < 4 * 32; j++) g2[j] = 12345.0f;
        assert_int_equal(dsii_dequantize_row(type, r, g2, n, NULL), DSI_OK);
        expect_close(g2, w2, n, 0);
        for (int j = n; j < 4 * 32; j++) assert_true(g2[j] == 12345.0f); /* padding not written */
        /* dot over the finite first block (2^-127 scale: subnormal products) and last */
        double wd[32];
        for (int j = 0; j < 32; j++) wd[j] = w2[j];
        check_dot(type, r, wd, 32);
        check_dot(type, r + 3 * 33, w2 + 96, 5);
    }
}

static void test_plain(void **state) {
    (void)state;
    uint8_t b[8 * 2];
    uint16_t h[8] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x8000, 0x3555, 0x0400, 0x7C00};
    double want[8];
    for (int i = 0; i < 8; i++) {
        put16(b + 2 * i, h[i]);
        want[i] = f16_def(h[i]);
    }
    float got[8];
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_F16, b, got, 8, NULL), DSI_OK);
    expect_close(got, want, 8, 0);
    check_dot(DSI_TYPE_F16, b, want, 7);
    for (int i = 0; i < 8; i++) {
        put16(b + 2 * i, (uint16_t)(0x3F80 + i * 0x111));
        uint32_t u = (uint32_t)(0x3F80 + i * 0x111) << 16;
        float f;
        memcpy(&f, &u, 4);
        want[i] = f;
    }
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_BF16, b, got, 8, NULL), DSI_OK);
    expect_close(got, want, 8, 0);
    int32_t iv[4] = {-5, 0, 7, 1 << 20};
    float fo[4];
    assert_int_equal(dsii_dequantize_row(DSI_TYPE_I32, iv, fo, 4, NULL), DSI_OK);
    assert_true(fo[0] == -5.0f && fo[3] == (float)(1 << 20));
}

/* ---- quantize → dequantize error bounds ------------------------------------------------ */

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static void roundtrip(int32_t type, const float *x, int n, float *y) {
    uint64_t bytes;
    assert_true(dsii_type_row_size(type, n, &bytes));
    uint8_t *q = malloc((size_t)bytes);
    assert_non_null(q);
    assert_int_equal(dsii_quantize_row(type, x, q, n, NULL), DSI_OK);
    assert_int_equal(dsii_dequantize_row(type, q, y, n, NULL), DSI_OK);
    /* the quantized row's dot equals the dot of its dequantized values */
    float d = 0;
    double ref = 0, mag = 0;
    assert_int_equal(dsii_dot_row(type, q, x, n, &d, NULL), DSI_OK);
    for (int i = 0; i < n; i++) {
        ref += (double)y[i] * x[i];
        mag += fabs((double)y[i] * x[i]);
    }
    assert_true(fabs(d - ref) <= 1e-5 * mag + 1e-30);
    free(q);
}

static void test_quantize_bounds(void **state) {
    (void)state;
    enum { N = 1024 };
    static float x[N], y[N];
    unsigned seed = 7;
    for (int i = 0; i < N; i++) {
        x[i] = frand(&seed);
        if (i % 97 == 0) x[i] *= 8.0f;  /* outliers */
        if (i % 61 == 0) x[i] *= 1e-3f; /* tiny values */
    }
    /* f16: relative 2^-11 (normal range) */
    roundtrip(DSI_TYPE_F16, x, N, y);
    for (int i = 0; i < N; i++) assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-11f + 0x1p-25f);
    roundtrip(DSI_TYPE_BF16, x, N, y);
    for (int i = 0; i < N; i++) assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    roundtrip(DSI_TYPE_F32, x, N, y);
    assert_memory_equal(x, y, sizeof x);

    /* Q8_0: half a step of amax/127, plus the f16 rounding of d (2^-11 relative, times 127) */
    roundtrip(DSI_TYPE_Q8_0, x, N, y);
    for (int b = 0; b < N; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
        for (int j = 0; j < 32; j++)
            assert_true(fabsf(y[b + j] - x[b + j]) <= amax / 127 * 0.5f + amax * 0x1p-10f);
    }
    /* MXFP4: |err| <= s (half the largest grid gap, 2·s, at the top of the range) and the
     * relative error of grid points >= 1·s is <= 1/4·… : use the absolute bound */
    roundtrip(DSI_TYPE_MXFP4, x, N, y);
    for (int b = 0; b < N; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
        float s = ldexpf(1.0f, (int)ceil(log2((double)amax / 6.0)));
        for (int j = 0; j < 32; j++) assert_true(fabsf(y[b + j] - x[b + j]) <= s * 1.0f);
        /* values on the upper part of the grid are within a quarter (relative) */
        for (int j = 0; j < 32; j++)
            if (fabsf(x[b + j]) >= 2 * s) assert_true(fabsf(y[b + j] - x[b + j]) <= 0.25f * fabsf(x[b + j]));
    }
    /* FP8 (all three ids): relative 2^-4 for normals, half a subnormal step otherwise */
    int32_t fp8[3] = {DSI_TYPE_FP8_E4M3_B128, DSI_TYPE_FP8_E4M3_B32, DSI_TYPE_FP8_E4M3_R32};
    for (int t = 0; t < 3; t++) {
        int n = N - 7; /* not a multiple of the block: padded last block */
        roundtrip(fp8[t], x, n, y);
        uint32_t bs = dsii_type_get(fp8[t])->blck;
        for (int b = 0; b < n; b += (int)bs) {
            float amax = 0;
            for (int j = b; j < n && j < b + (int)bs; j++) amax = fmaxf(amax, fabsf(x[j]));
            float s = ldexpf(1.0f, (int)ceil(log2((double)amax / 448.0)));
            for (int j = b; j < n && j < b + (int)bs; j++)
                assert_true(fabsf(y[j] - x[j]) <= fmaxf(fabsf(x[j]) * 0x1p-4f, s * 0x1p-10f));
        }
    }
    /* K-quants on [-1, 1] data without outliers: bounded by their step sizes */
    for (int i = 0; i < N; i++) x[i] = frand(&seed);
    roundtrip(DSI_TYPE_Q4_K, x, N, y);
    double se = 0;
    for (int i = 0; i < N; i++) {
        assert_true(fabsf(y[i] - x[i]) <= 0.12f); /* step ≈ 2/15, min rounding ≈ 1/126 */
        se += (y[i] - x[i]) * (y[i] - x[i]);
    }
    assert_true(sqrt(se / N) < 0.05);
    roundtrip(DSI_TYPE_Q2_K, x, N, y);
    se = 0;
    for (int i = 0; i < N; i++) {
        assert_true(fabsf(y[i] - x[i]) <= 0.5f); /* step ≈ 2/3 */
        se += (y[i] - x[i]) * (y[i] - x[i]);
    }
    assert_true(sqrt(se / N) < 0.25);
    /* all-zero input stays exactly zero for every quantizable type */
    memset(x, 0, sizeof x);
    int32_t all[] = {DSI_TYPE_F16, DSI_TYPE_BF16, DSI_TYPE_Q8_0, DSI_TYPE_Q4_K, DSI_TYPE_Q2_K,
                     DSI_TYPE_MXFP4, DSI_TYPE_FP8_E4M3_B128, DSI_TYPE_FP8_E4M3_B32};
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) {
        roundtrip(all[t], x, 512, y);
        for (int i = 0; i < 512; i++) assert_true(y[i] == 0.0f);
    }
}

/* Values already on the scaled e4m3 grid survive quantization exactly. */
static void test_fp8_exact_and_2d(void **state) {
    (void)state;
    enum { R = 70, C = 300 };
    static float x[R * C], y[C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            /* a grid value times a per-(32-row, 32-col) power of two, block max 448·2^k */
            int code = (r * 31 + c * 17) % 0x7E;
            int k = ((r / 32) * 3 + (c / 32)) % 9 - 4;
            x[r * C + c] = (float)(e4m3_def((uint8_t)code) * ldexp(1.0, k));
            if (c % 32 == 0) x[r * C + c] = (float)ldexp(448.0, k) * ((r & 1) ? -1.0f : 1.0f);
        }
    uint64_t rb;
    assert_true(dsii_type_row_size(DSI_TYPE_FP8_E4M3_B32, C, &rb));
    uint8_t *q = malloc((size_t)(rb * R));
    assert_non_null(q);
    assert_int_equal(dsii_quantize_fp8_2d(DSI_TYPE_FP8_E4M3_B32, x, C, R, q, NULL), DSI_OK);
    for (int r = 0; r < R; r++) {
        assert_int_equal(dsii_dequantize_row(DSI_TYPE_FP8_E4M3_B32, q + r * rb, y, C, NULL), DSI_OK);
        for (int c = 0; c < C; c++) assert_true(y[c] == x[r * C + c]);
        /* the scale of a 32x32 tile is stored in each of its rows */
        for (int cb = 0; cb < (C + 31) / 32; cb++)
            assert_int_equal(q[r * rb + cb * 33], q[(r / 32) * 32 * rb + cb * 33]);
    }
    free(q);
    /* B128 2-D: tile scale from the whole 128x128 tile; bound relative to that scale */
    assert_true(dsii_type_row_size(DSI_TYPE_FP8_E4M3_B128, C, &rb));
    q = malloc((size_t)(rb * R));
    assert_non_null(q);
    assert_int_equal(dsii_quantize_fp8_2d(DSI_TYPE_FP8_E4M3_B128, x, C, R, q, NULL), DSI_OK);
    for (int r = 0; r < R; r++) {
        assert_int_equal(dsii_dequantize_row(DSI_TYPE_FP8_E4M3_B128, q + r * rb, y, C, NULL), DSI_OK);
        for (int c = 0; c < C; c++) {
            float s = (float)e8m0_def(q[r * rb + (c / 128) * 129]);
            assert_true(fabsf(y[c] - x[r * C + c]) <= fmaxf(fabsf(x[r * C + c]) * 0x1p-4f, s * 0x1p-10f));
        }
        for (int cb = 0; cb < 3; cb++) assert_int_equal(q[r * rb + cb * 129], q[cb * 129]);
    }
    free(q);
    assert_int_equal(dsii_quantize_fp8_2d(DSI_TYPE_Q8_0, x, C, R, NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),      cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_q8_0),        cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_q2_k),        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_fp8),         cmocka_unit_test(test_plain),
        cmocka_unit_test(test_quantize_bounds), cmocka_unit_test(test_fp8_exact_and_2d),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
