/*
 * lib/quant, the further ggml types (quant_ggml.c): hand-decoded blocks, the library's
 * decoder and dot product against this test's double-precision decoders (ggml_ref.c, from
 * docs/tensor-types.md) with a stated bound, the codebook tables' structure and a few
 * literal entries of ggml-common.h, and the writer quantizers' error (plain and with
 * importance weights). The comparison with the real llama.cpp is test_ggml_interop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_ref.h"
#include "quant/ggml_tables.h"
#include "quant/fp.h"
#include "quant/quant.h"

static const int32_t k_new[] = {2, 3, 6, 7, 11, 13, 14, 20, 23, 18, 21, 16, 17, 22, 19, 29};
#define N_NEW (sizeof k_new / sizeof k_new[0])

static uint64_t rs = 0x6A09E667F3BCC909ull;
static uint64_t rnd(void) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rndu(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static float gauss(void) {
    double u = rndu(), v = rndu();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

static void deq(int32_t type, const uint8_t *b, int64_t n, float *y) {
    assert_int_equal(dsii_dequantize_row(type, b, y, n, NULL), DSI_OK);
}
static void st16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void st32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}
/* Element i: library value, test decoder value and the hand value must all be equal. */
static void expect(int32_t type, const uint8_t *blk, int64_t n, int i, double want) {
    float y[256];
    double r[256];
    deq(type, blk, n, y);
    gref_decode(type, blk, n, r, NULL);
    if ((double)y[i] != want || r[i] != want)
        fail_msg("%s element %d: library %.9g, test decoder %.9g, hand value %.9g",
                 dsi_type_name(type), i, (double)y[i], r[i], want);
}

/* ---- hand-decoded blocks ------------------------------------------------------------------ */

static void test_hand_iq2_xxs(void **state) {
    (void)state;
    /* The entries used here, quoted from ggml-common.h (byte j = element j of the group):
     *   iq2xxs_grid[0]   = 0x0808080808080808  (all 8)
     *   iq2xxs_grid[1]   = 0x080808080808082b  (byte 0 = 43, others 8)
     *   iq2xxs_grid[2]   = 0x0808080808081919  (bytes 0, 1 = 25)
     *   iq2xxs_grid[255] = 0x2b2b2b1908081908  (bytes 1, 4 = 25; 5, 6, 7 = 43; 0, 2, 3 = 8) */
    assert_true(dsii_iq2xxs_grid[0] == 0x0808080808080808ull);
    assert_true(dsii_iq2xxs_grid[1] == 0x080808080808082bull);
    assert_true(dsii_iq2xxs_grid[2] == 0x0808080808081919ull);
    assert_true(dsii_iq2xxs_grid[255] == 0x2b2b2b1908081908ull);
    uint8_t b[66] = {0};
    st16(b, 0x3800); /* d = 0.5 */
    /* sub-block 0: groups use grid 1, 0, 2, 255; scale 3 → db = 0.5 (0.5 + 3) / 4 = 0.4375;
     * signs: group 0 stored 0b0000001 (element 0 negative; parity odd → element 7
     * negative too), group 1 0, group 2 0b0000011 (elements 0, 1; parity even), group 3 0 */
    b[2] = 1, b[3] = 0, b[4] = 2, b[5] = 255;
    st32(b + 6, (3u << 28) | (0x01u << 0) | (0x03u << 14));
    expect(16, b, 256, 0, -43 * 0.4375);  /* -18.8125 */
    expect(16, b, 256, 1, 8 * 0.4375);    /* 3.5 */
    expect(16, b, 256, 7, -8 * 0.4375);   /* -3.5: the implied eighth sign bit */
    expect(16, b, 256, 8, 8 * 0.4375);    /* group 1: all 8 */
    expect(16, b, 256, 16, -25 * 0.4375); /* group 2, element 0 */
    expect(16, b, 256, 17, -25 * 0.4375);
    expect(16, b, 256, 18, 8 * 0.4375);
    expect(16, b, 256, 28, 25 * 0.4375);  /* group 3, element 4 */
    expect(16, b, 256, 29, 43 * 0.4375);
    expect(16, b, 256, 26, 8 * 0.4375);
    /* sub-block 7: scale 15 → db = 0.5 * 15.5 / 4 = 1.9375; group 0 grid 1, stored signs
     * 0b1111111 (parity odd → all eight negative) */
    b[2 + 56] = 1;
    st32(b + 2 + 56 + 4, (15u << 28) | 0x7Fu);
    expect(16, b, 256, 224, -43 * 1.9375);
    expect(16, b, 256, 231, -8 * 1.9375);
    /* a whole row of two blocks: the second block's d = -2 flips every sign and scales by 4 */
    uint8_t row[132];
    memcpy(row, b, 66);
    memcpy(row + 66, b, 66);
    st16(row + 66, 0xC000);
    float y[512];
    deq(16, row, 512, y);
    assert_true(y[256] == 43 * 1.75f);
    assert_true(y[256 + 231] == 8 * 7.75f);
}

static void test_hand_others(void **state) {
    (void)state;
    { /* q4_0: d = 0.25, qs[0] = 0x3F → element 0: (15-8)/4, element 16: (3-8)/4 */
        uint8_t b[18] = {0};
        st16(b, 0x3400);
        b[2] = 0x3F;
        expect(2, b, 32, 0, 1.75);
        expect(2, b, 32, 16, -1.25);
        expect(2, b, 32, 1, -2.0);
    }
    { /* q5_1: d = 0.5, m = -1, qh bit 17 set, qs[1] = 0x2A → element 17: (2 | 16) 0.5 - 1 = 8 */
        uint8_t b[24] = {0};
        st16(b, 0x3800);
        st16(b + 2, 0xBC00);
        st32(b + 4, 1u << 17);
        b[9] = 0x2A;
        expect(7, b, 32, 17, 8.0);
        expect(7, b, 32, 1, 4.0); /* 10 * 0.5 - 1 */
    }
    { /* q3_k: d = 2; sub-block 5 scale code 40 → 8; element 80 (h 0, j 2, l 16):
       * qs[16] bits 4..5 = 1, hmask[16] bit 2 clear → q = 1 - 4 = -3 → -48 */
        uint8_t b[110] = {0};
        st16(b + 108, 0x4000);
        b[96 + 5] = 40 & 15;               /* low nibble of code 40 = 8 */
        b[96 + 8 + 1] = (uint8_t)(2 << 2); /* high bits of code 40 = 2, at bits 2(5/4) of sc[8 + 5%4] */
        b[32 + 16] = 1 << 4;
        expect(11, b, 256, 80, -48.0);
        b[16] = 1 << 2; /* hmask bit 4h + j = 2 set → q = 1 */
        expect(11, b, 256, 80, 16.0);
    }
    { /* q6_k: d = 0.5, scale[9] = -3; element 144 (h 1, k 0, l 16): ql[64 + 16] low nibble 5,
       * qh[32 + 16] bits 0..1 = 2 → q = 5 | 32 - 32 = 5 → 0.5 (-3) 5 = -7.5 */
        uint8_t b[210] = {0};
        st16(b + 208, 0x3800);
        b[192 + 9] = (uint8_t)-3;
        b[64 + 16] = 0x05;
        b[128 + 32 + 16] = 2;
        expect(14, b, 256, 144, -7.5);
        expect(14, b, 256, 145, 0.5 * -3 * -32);
    }
    { /* iq4_xs: d = 1; sub-block 3: ls = nibble 1 of scales_l[1] = 5 | bits 6..7 of scales_h
       * = 2 → 37 → 5; qs[48] = 0xF0: element 96 kvalues[0] = -127, element 112 kvalues[15] = 113 */
        uint8_t b[136] = {0};
        st16(b, 0x3C00);
        st16(b + 2, 2u << 6);
        b[4 + 1] = 5 << 4;
        b[8 + 48] = 0xF0;
        expect(23, b, 256, 96, 5 * -127.0);
        expect(23, b, 256, 112, 5 * 113.0);
    }
    { /* iq3_s: d = 0.5, sub-block 1 scale 2 → 0.5 * 5 = 2.5; group 0 entries 256 + 0 (qh[1]
       * bit 0) and 1; signs[4] = 0x81. ggml-common.h: iq3s_grid[256] = 0x05090507,
       * iq3s_grid[1] = 0x01010103. */
        uint8_t b[110] = {0};
        st16(b, 0x3800);
        b[106] = 2 << 4;
        b[66 + 1] = 1;
        b[2 + 8] = 0;
        b[2 + 9] = 1;
        b[74 + 4] = 0x81;
        assert_true(dsii_iq3s_grid[256] == 0x05090507u && dsii_iq3s_grid[1] == 0x01010103u);
        expect(21, b, 256, 32, -2.5 * 7);
        expect(21, b, 256, 33, 2.5 * 5);
        expect(21, b, 256, 36, 2.5 * 3); /* byte 0 of g1 = 3 */
        expect(21, b, 256, 39, -2.5 * 1);
    }
    { /* iq1_s: d = 0.25; sub-block 2: qh = scale 3 (<< 12), delta negative, group 1 index
       * bits 8..10 = 7; qs[9] = 255 → iq1s_grid[2047] = 0x0101010101010101 → 0.25 7 (1 - 1/8) */
        uint8_t b[50] = {0};
        st16(b, 0x3400);
        st16(b + 34 + 4, (3u << 12) | 0x8000u | (7u << 3));
        b[2 + 9] = 255;
        assert_true(dsii_iq1s_grid[2047] == 0x0101010101010101ull);
        assert_true(dsii_iq1s_grid[0] == 0xffffffffffffffffull);
        expect(19, b, 256, 72, 0.25 * 7 * 0.875);
        expect(19, b, 256, 64, 0.25 * 7 * (-1 - 0.125)); /* group 0: index 0, all -1 */
    }
}

/* ---- tables -------------------------------------------------------------------------------- */

static void test_tables(void **state) {
    (void)state;
    for (int i = 0; i < 128; i++) {
        int par = __builtin_popcount((unsigned)i) & 1;
        assert_int_equal(dsii_ksigns_iq2xs[i], i | (par << 7));
    }
    static const int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    assert_memory_equal(dsii_kvalues_iq4nl, kv, 16);
    /* entries are distinct and their bytes come from the format's level set */
    struct { const uint64_t *g64; const uint32_t *g32; int n, w; const char *levels; } t[] = {
        {dsii_iq2xxs_grid, NULL, 256, 8, "\x08\x19\x2b"}, {dsii_iq2xs_grid, NULL, 512, 8, "\x08\x19\x2b"},
        {dsii_iq2s_grid, NULL, 1024, 8, "\x08\x19\x2b"},
        {NULL, dsii_iq3xxs_grid, 256, 4, "\x04\x0c\x14\x1c\x24\x2c\x34\x3e"},
        {NULL, dsii_iq3s_grid, 512, 4, "\x01\x03\x05\x07\x09\x0b\x0d\x0f"},
        {dsii_iq1s_grid, NULL, 2048, 8, "\xff\x01"}, /* and 0 */
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        for (int e = 0; e < t[k].n; e++) {
            uint64_t v = t[k].g64 ? t[k].g64[e] : t[k].g32[e];
            for (int j = 0; j < t[k].w; j++) {
                int byte = (int)((v >> (8 * j)) & 255);
                if (!(byte == 0 && t[k].g64 == dsii_iq1s_grid) && !strchr(t[k].levels, byte))
                    fail_msg("table %zu entry %d byte %d = 0x%02x", k, e, j, byte);
            }
            for (int o = 0; o < e; o++) /* distinct */
                assert_true(v != (t[k].g64 ? t[k].g64[o] : t[k].g32[o]));
        }
    }
    /* literal entries quoted from ggml-common.h */
    assert_true(dsii_iq2xs_grid[511] == 0x2b2b2b2b2b2b2b2bull);
    assert_true(dsii_iq2s_grid[1023] == 0x2b2b2b2b2b2b2b2bull);
    assert_true(dsii_iq3xxs_grid[0] == 0x04040404u && dsii_iq3xxs_grid[255] == 0x3e341c04u);
    assert_true(dsii_iq3s_grid[511] == 0x0f0f0101u);
}

/* ---- decoder and dot against the double-precision reference --------------------------------- */

/* Bound: every library value is at most 4 float roundings (2^-22 relative, of the terms'
 * magnitudes) away from the exact value; the dot product adds n float additions. */
static void test_vs_double(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_NEW; ti++) {
        const int32_t type = k_new[ti];
        const dsii_type_traits *tr = dsii_type_get(type);
        assert_non_null(tr);
        assert_true(tr->supported && gref_known(type));
        const int64_t n = 8 * 256;
        uint8_t *row = malloc((size_t)(n / tr->blck) * tr->type_size);
        float *y = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * n);
        double *r = malloc(sizeof(double) * n), *m = malloc(sizeof(double) * n);
        for (int round = 0; round < 8; round++) {
            gref_random_row(type, row, n, rnd);
            gref_decode(type, row, n, r, m);
            deq(type, row, n, y);
            double worst = 0, dref = 0, dmag = 0;
            for (int64_t i = 0; i < n; i++) {
                double err = fabs((double)y[i] - r[i]);
                if (!(err <= ldexp(m[i], -22)))
                    fail_msg("%s element %lld: library %.9g, reference %.17g", tr->name, (long long)i,
                             (double)y[i], r[i]);
                if (m[i] > 0) worst = fmax(worst, err / m[i]);
                x[i] = (float)(rndu() * 2 - 1);
                dref += r[i] * x[i];
                dmag += fabs(r[i] * x[i]);
            }
            float dot = 0;
            assert_int_equal(dsii_dot_row(type, row, x, n, &dot, NULL), DSI_OK);
            if (!(fabs((double)dot - dref) <= ((double)n + 8) * ldexp(dmag, -24)))
                fail_msg("%s dot: %.9g, reference %.17g (magnitude %.3g)", tr->name, (double)dot, dref, dmag);
            if (round == 0) printf("  %-8s decode max err %.2g x magnitude (bound 2^-22)\n", tr->name, worst);
        }
        free(row);
        free(y);
        free(x);
        free(r);
        free(m);
    }
}

/* ---- writer quantizers ---------------------------------------------------------------------- */

static double wnmse(const float *x, const float *y, const float *w, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double ww = w ? w[i] : 1.0;
        e += ww * ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        s += ww * (double)x[i] * x[i];
    }
    return e / s;
}

static void test_quantize(void **state) {
    (void)state;
    const int64_t n = 4096;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n);
    float *im = malloc(sizeof(float) * n);
    uint8_t *q = malloc((size_t)n * 2);
    double *r = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = gauss() * 0.02f;
        /* a few input channels matter much more (as in an imatrix) */
        im[i] = (i % 64) < 4 ? 50.0f : 0.5f;
    }
    printf("  %-8s %10s %14s %14s\n", "type", "NMSE", "w-NMSE plain", "w-NMSE imat");
    for (size_t ti = 0; ti < N_NEW; ti++) {
        const int32_t type = k_new[ti];
        const dsii_type_traits *tr = dsii_type_get(type);
        assert_non_null(tr->quantize_row);
        assert_int_equal(dsii_quantize_row(type, x, q, n, NULL), DSI_OK);
        deq(type, q, n, y);
        gref_decode(type, q, n, r, NULL); /* our writer's bytes mean what the reference says */
        for (int64_t i = 0; i < n; i++) assert_true(fabs((double)y[i] - r[i]) <= 1e-6 * fabs(r[i]) + 1e-12);
        const double e = wnmse(x, y, NULL, n), ew = wnmse(x, y, im, n);
        assert_int_equal(dsii_quantize_row_imat(type, x, q, n, im, NULL), DSI_OK);
        deq(type, q, n, y2);
        const double ew2 = wnmse(x, y2, im, n);
        printf("  %-8s %10.3e %14.3e %14.3e%s\n", tr->name, e, ew, ew2, tr->quantize_row_w ? "" : "  (ignores imat)");
        /* 4-bit-or-more types within 2e-2, 3-bit 6e-2, 2-bit 0.15, 1-bit 0.3 (N(0,1) data) */
        const double bound = tr->type_size * 8.0 / tr->blck >= 4.0 ? 2e-2
                           : tr->type_size * 8.0 / tr->blck >= 3.0 ? 6e-2
                           : tr->type_size * 8.0 / tr->blck >= 2.0 ? 0.15 : 0.3;
        assert_true(e <= bound);
        if (tr->quantize_row_w) assert_true(ew2 < ew); /* importance lowers the weighted error */
        else assert_memory_equal(y, y2, sizeof(float) * n);
        /* zeros → zeros, no NaN */
        memset(y, 0, sizeof(float) * n);
        assert_int_equal(dsii_quantize_row(type, y, q, n, NULL), DSI_OK);
        deq(type, q, n, y2);
        for (int64_t i = 0; i < n; i++) assert_true(y2[i] == 0.0f);
    }
    free(x);
    free(y);
    free(y2);
    free(im);
    free(q);
    free(r);
}

/* The IQ writers' grid search (quant_ggml.c iqgrid_best, pruned): in what they write, every
 * group's grid entry must be the best one for its unit's written scale and signs — no other
 * entry of the grid gives a smaller weighted error (the writer's weights: sqrt(2 mean(x^2) +
 * x^2) per value, no importance matrix). Checked for IQ2_XXS (groups of 8 values, 3 levels)
 * and IQ3_XXS (half-groups of 4, 8 levels): the two shapes of the search. The errors are
 * recomputed in double, so near-ties may differ by rounding: 1e-5 relative. */
static double iq_group_err(const float *x, const double *w, int G, double db, const float *y,
                           const uint8_t *lv) {
    double e = 0;
    for (int j = 0; j < G; j++) {
        const double v = lv ? db * lv[j] * (y[j] < 0 ? -1.0 : 1.0) : (double)y[j];
        e += w[j] * ((double)x[j] - v) * ((double)x[j] - v);
    }
    return e;
}
static void test_iq_search_optimal(void **state) {
    (void)state;
    const int64_t n = 256 * 64;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    uint8_t *q = malloc((size_t)n);
    double w[256];
    for (int64_t i = 0; i < n; i++) x[i] = gauss() * 0.02f * (i % 256 < 8 ? 4.0f : 1.0f);
    for (int pass = 0; pass < 2; pass++) {
        const int32_t type = pass == 0 ? DSI_TYPE_IQ2_XXS : 18 /* IQ3_XXS */;
        const int G = pass == 0 ? 8 : 4, ngrid = 256, bsz = pass == 0 ? 66 : 98;
        assert_int_equal(dsii_quantize_row(type, x, q, n, NULL), DSI_OK);
        deq(type, q, n, y);
        int64_t groups = 0, worse = 0;
        for (int64_t b = 0; b < n / 256; b++) {
            const float *xb = x + 256 * b, *yb = y + 256 * b;
            const uint8_t *blk = q + (size_t)bsz * (size_t)b;
            double s2 = 0;
            for (int i = 0; i < 256; i++) s2 += (double)xb[i] * xb[i];
            for (int i = 0; i < 256; i++) w[i] = sqrt(2.0 * s2 / 256 + (double)xb[i] * xb[i]);
            const double d = dsii_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
            for (int u = 0; u < 8; u++) { /* units of 32 values, one scale each */
                const uint8_t *aux = pass == 0 ? blk + 2 + 8 * u + 4 : blk + 66 + 4 * u;
                const uint32_t aw = (uint32_t)aux[0] | (uint32_t)aux[1] << 8 |
                                    (uint32_t)aux[2] << 16 | (uint32_t)aux[3] << 24;
                const double db = d * (0.5 + (double)(aw >> 28)) * (pass == 0 ? 0.25 : 0.5);
                for (int g = 0; g < 32 / G; g++) {
                    const int o = 32 * u + G * g;
                    const double chosen = iq_group_err(xb + o, w + o, G, 0, yb + o, NULL);
                    double best = INFINITY;
                    for (int e = 0; e < ngrid; e++) {
                        uint8_t lv[8];
                        for (int j = 0; j < G; j++)
                            lv[j] = pass == 0 ? (uint8_t)(dsii_iq2xxs_grid[e] >> (8 * j))
                                              : (uint8_t)(dsii_iq3xxs_grid[e] >> (8 * j));
                        best = fmin(best, iq_group_err(xb + o, w + o, G, db, yb + o, lv));
                    }
                    groups++;
                    if (!(chosen <= best * (1 + 1e-5) + 1e-30)) {
                        if (worse++ < 3)
                            printf("  type %d block %lld unit %d group %d: error %.9g, grid best %.9g\n",
                                   (int)type, (long long)b, u, g, chosen, best);
                    }
                }
            }
        }
        printf("  type %d: %lld groups, %lld with a better grid entry\n", (int)type,
               (long long)groups, (long long)worse);
        assert_int_equal(worse, 0);
    }
    free(x);
    free(y);
    free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_iq2_xxs), cmocka_unit_test(test_hand_others),
        cmocka_unit_test(test_tables),       cmocka_unit_test(test_vs_double),
        cmocka_unit_test(test_quantize),     cmocka_unit_test(test_iq_search_optimal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
