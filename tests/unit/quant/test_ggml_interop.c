/*
 * lib/quant against the real llama.cpp: the ggml library bundled in npm's node-llama-cpp
 * (scripts/setup-llama-cpp.sh installs it; DSI_LLAMA_CPP_LIBDIR names the directory holding
 * libggml-base.so). For every ggml weight type libdsinfer decodes:
 *   - grid sweep: rows whose groups enumerate every index of the type's grid / codebook
 *     (with random scales and signs) dequantize bit-identically with llama.cpp's
 *     dequantize_row_* — so every number carried over into ggml_tables.c is checked;
 *   - random blocks (random bytes, finite scales) dequantize bit-identically;
 *   - blocks quantized by llama.cpp's own quantizer (ggml_quantize_chunk, with an
 *     importance matrix where ggml requires one) dequantize bit-identically;
 *   - blocks written by libdsinfer's quantizer dequantize identically in llama.cpp (our
 *     writer's layout read by the other side), and the squared error of our quantizer is
 *     reported next to llama.cpp's on the same data, with a stated bound.
 *
 * Without the library the test is skipped (exit 77) with the reason, unless
 * DSI_REQUIRE_LLAMA_CPP=1 (CI, after setup) — then that is a failure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/common/skip.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/fp.h"
#include "quant/quant.h"

typedef size_t (*ggml_quantize_chunk_fn)(int type, const float *src, void *dst, int64_t start,
                                         int64_t nrows, int64_t n_per_row, const float *imatrix);
typedef _Bool (*ggml_requires_imatrix_fn)(int type);
typedef void (*ggml_dequant_fn)(const void *x, float *y, int64_t k);

static void *g_lib;
static ggml_quantize_chunk_fn g_quantize;
static ggml_requires_imatrix_fn g_requires_imatrix;

typedef struct ty {
    int32_t id;
    const char *ggml_name; /* suffix of dequantize_row_<name> */
    int grid;              /* entries of the index space the sweep enumerates (0: none) */
    double nmse_bound;     /* our quantizer's NMSE on N(0,1) data must stay below this */
} ty;

/* NMSE bounds: this quantizer's measured NMSE on the test's N(0,1) data (docs/tensor-types.md
 * "Writer quantizers") plus ~25%; besides, it must stay within 1.5x of llama.cpp's own
 * quantizer on the same data (K_REL). `grid` is set for the IQ grid types only. */
static const ty k_types[] = {
    {2, "q4_0", 0, 8.5e-3},      {3, "q4_1", 0, 7.6e-3},      {6, "q5_0", 0, 2.1e-3},
    {7, "q5_1", 0, 1.8e-3},      {11, "q3_K", 0, 2.6e-2},     {13, "q5_K", 0, 1.9e-3},
    {14, "q6_K", 0, 4.1e-4},     {20, "iq4_nl", 0, 7.1e-3},   {23, "iq4_xs", 0, 7.2e-3},
    {18, "iq3_xxs", 256, 4e-2},  {21, "iq3_s", 512, 2.15e-2}, {16, "iq2_xxs", 256, 1.36e-1},
    {17, "iq2_xs", 512, 1.03e-1}, {22, "iq2_s", 1024, 7.2e-2}, {19, "iq1_s", 2048, 2.54e-1},
    {29, "iq1_m", 2048, 2.18e-1}, {8, "q8_0", 0, 3.6e-5},     {10, "q2_K", 0, 1.5e-1},
    {12, "q4_K", 0, 7.8e-3},     {39, "mxfp4", 0, 1.7e-2},
};
#define K_REL 1.5
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* ---- random numbers ------------------------------------------------------------------- */

static uint64_t rs = 0x243F6A8885A308D3ull;
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

static ggml_dequant_fn ggml_deq(const ty *t) {
    char name[64];
    snprintf(name, sizeof name, "dequantize_row_%s", t->ggml_name);
    ggml_dequant_fn f = (ggml_dequant_fn)dlsym(g_lib, name);
    if (!f) fail_msg("libggml-base.so has no %s", name);
    return f;
}

static void st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A random finite f16 with magnitude in [2^e0, 2^(e0 + span)). */
static uint16_t rnd_f16(int e0, int span, int allow_neg) {
    uint16_t e = (uint16_t)(15 + e0 + (int)(rnd() % (uint64_t)span));
    uint16_t h = (uint16_t)((e << 10) | (rnd() & 1023));
    if (allow_neg && (rnd() & 1)) h |= 0x8000;
    return h;
}

/* Gives every f16 scale field of a row of random bytes a finite moderate value (the other
 * bytes stay random: every bit pattern is a valid block). */
static void sane_scales(int32_t type, uint8_t *row, int64_t nb, size_t bs) {
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = row + (size_t)b * bs;
        switch (type) {
        case 2: case 6: case 8: case 16: case 17: case 18: case 19: case 20: case 21:
        case 22: case 23:
            st16(p, rnd_f16(-6, 4, 1));
            break;
        case 3: case 7: case 12: case 13:
            st16(p, rnd_f16(-6, 4, 1));
            st16(p + 2, rnd_f16(-6, 4, 1));
            break;
        case 10:
            st16(p + 80, rnd_f16(-6, 4, 1));
            st16(p + 82, rnd_f16(-6, 4, 1));
            break;
        case 11: st16(p + 108, rnd_f16(-6, 4, 1)); break;
        case 14: st16(p + 208, rnd_f16(-6, 4, 1)); break;
        case 29: { /* f16 d spread over the top nibbles of four u16 */
            uint16_t d = rnd_f16(-6, 4, 1);
            for (int k = 0; k < 4; k++) {
                uint8_t *q = p + 48 + 2 * k;
                q[1] = (uint8_t)((q[1] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4));
            }
            break;
        }
        case 39: p[0] = (uint8_t)(120 + rnd() % 12); break;
        default: break;
        }
    }
}

/* Writes grid index `idx` into group g (of 8 values) of a block of the given type. Used by
 * the sweep; the other bytes of the block stay as they are. */
static void put_index(int32_t type, uint8_t *blk, int g, int idx) {
    const int s = g / 4, l = g % 4;
    switch (type) {
    case 16: blk[2 + 8 * s + l] = (uint8_t)idx; break;
    case 17: {
        uint16_t v = (uint16_t)(blk[2 + 2 * g] | (blk[3 + 2 * g] << 8));
        v = (uint16_t)((v & 0xFE00) | idx);
        st16(blk + 2 + 2 * g, v);
        break;
    }
    case 22:
        blk[2 + g] = (uint8_t)idx;
        blk[66 + s] = (uint8_t)((blk[66 + s] & ~(3u << (2 * l))) | ((unsigned)(idx >> 8) << (2 * l)));
        break;
    case 18: /* two 4-value entries per group: the sweep puts idx into the first, idx ^ 1 into the second */
        blk[2 + 8 * s + 2 * l] = (uint8_t)idx;
        blk[2 + 8 * s + 2 * l + 1] = (uint8_t)(idx ^ 0x55);
        break;
    case 21: {
        const int k0 = 2 * l, k1 = 2 * l + 1, i1 = (idx + 256) & 511;
        blk[2 + 8 * s + k0] = (uint8_t)idx;
        blk[2 + 8 * s + k1] = (uint8_t)i1;
        blk[66 + s] = (uint8_t)((blk[66 + s] & ~(3u << k0)) | ((unsigned)(idx >> 8) << k0) |
                                ((unsigned)(i1 >> 8) << k1));
        break;
    }
    case 19: {
        blk[2 + 4 * s + l] = (uint8_t)idx;
        uint16_t qh = (uint16_t)(blk[34 + 2 * s] | (blk[35 + 2 * s] << 8));
        qh = (uint16_t)((qh & ~(7u << (3 * l))) | ((unsigned)(idx >> 8) << (3 * l)));
        st16(blk + 34 + 2 * s, qh);
        break;
    }
    case 29: {
        blk[4 * s + l] = (uint8_t)idx;
        uint8_t *h = blk + 32 + 2 * s + l / 2;
        const int sh = 4 * (l & 1);
        *h = (uint8_t)((*h & ~(7u << sh)) | ((unsigned)(idx >> 8) << sh));
        break;
    }
    default: { /* nibble / small-code types: set both nibbles of a byte of the group to idx */
        break;
    }
    }
}

/* Bit-identical, except that MXFP4's code 8 is -0 in libdsinfer (E2M1 sign bit) and +0 in
 * ggml (its doubled int8 table): zeros of either sign are equal. */
static void compare_rows(const char *what, const ty *t, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t ua, ub;
        memcpy(&ua, &a[i], 4);
        memcpy(&ub, &b[i], 4);
        if (ua != ub && !(t->id == DSI_TYPE_MXFP4 && ((ua | ub) & 0x7FFFFFFFu) == 0))
            fail_msg("%s %s: element %lld: llama.cpp %.9g (0x%08x), libdsinfer %.9g (0x%08x)", t->ggml_name,
                     what, (long long)i, (double)a[i], ua, (double)b[i], ub);
    }
}

/* Random blocks and the grid sweep. */
static void test_decode(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const ty *t = &k_types[ti];
        const dsii_type_traits *tr = dsii_type_get(t->id);
        assert_non_null(tr);
        const int64_t blocks = t->grid > 32 && tr->blck == 256 ? (t->grid + 31) / 32 : 64;
        const int64_t n = blocks * tr->blck;
        uint8_t *row = malloc((size_t)blocks * tr->type_size);
        float *ya = malloc(sizeof(float) * (size_t)n), *yb = malloc(sizeof(float) * (size_t)n);
        assert_non_null(row);
        ggml_dequant_fn deq = ggml_deq(t);
        for (int round = 0; round < 4; round++) {
            for (size_t i = 0; i < (size_t)blocks * tr->type_size; i++) row[i] = (uint8_t)rnd();
            sane_scales(t->id, row, blocks, tr->type_size);
            if (round == 0 && t->grid > 32 && tr->blck == 256)
                for (int64_t b = 0; b < blocks; b++)
                    for (int g = 0; g < 32; g++)
                        put_index(t->id, row + (size_t)b * tr->type_size, g, (int)((32 * b + g) % t->grid));
            deq(row, ya, n);
            assert_int_equal(dsii_dequantize_row(t->id, row, yb, n, NULL), DSI_OK);
            compare_rows(round == 0 ? "grid sweep / random blocks" : "random blocks", t, ya, yb, n);
        }
        printf("  %-8s %lld blocks x 4 rounds: identical to llama.cpp%s\n", t->ggml_name,
               (long long)blocks, t->grid > 32 ? " (every grid index)" : "");
        free(row);
        free(ya);
        free(yb);
    }
}

/* llama.cpp's quantizer → both decoders; our quantizer → both decoders; errors compared. */
static void test_quantizers(void **state) {
    (void)state;
    const int64_t n_per_row = 1024, nrows = 16, n = n_per_row * nrows;
    float *x = malloc(sizeof(float) * (size_t)n), *imat = malloc(sizeof(float) * (size_t)n_per_row);
    float *ya = malloc(sizeof(float) * (size_t)n), *yb = malloc(sizeof(float) * (size_t)n);
    uint8_t *q = malloc((size_t)n * 2);
    assert_non_null(x);
    assert_non_null(q);
    for (int64_t i = 0; i < n; i++) x[i] = gauss();
    for (int64_t i = 0; i < n_per_row; i++) imat[i] = (float)(0.1 + rndu() * rndu() * 4.0);
    double sx2 = 0;
    for (int64_t i = 0; i < n; i++) sx2 += (double)x[i] * x[i];
    printf("  %-8s %12s %12s %10s\n", "type", "llama.cpp", "libdsinfer", "bound");
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const ty *t = &k_types[ti];
        const dsii_type_traits *tr = dsii_type_get(t->id);
        ggml_dequant_fn deq = ggml_deq(t);
        const size_t rb = (size_t)(n_per_row / tr->blck) * tr->type_size;
        /* llama.cpp's quantizer (imatrix where required, as llama-quantize would) */
        const float *im = g_requires_imatrix(t->id) ? imat : NULL;
        size_t got = g_quantize(t->id, x, q, 0, nrows, n_per_row, im);
        assert_int_equal(got, rb * (size_t)nrows);
        deq(q, ya, n);
        assert_int_equal(dsii_dequantize_row(t->id, q, yb, n, NULL), DSI_OK);
        compare_rows("blocks from llama.cpp's quantizer", t, ya, yb, n);
        double e_ggml = 0;
        for (int64_t i = 0; i < n; i++) e_ggml += ((double)ya[i] - x[i]) * ((double)ya[i] - x[i]);
        /* libdsinfer's quantizer */
        for (int64_t r = 0; r < nrows; r++)
            assert_int_equal(dsii_quantize_row(t->id, x + r * n_per_row, q + (size_t)r * rb, n_per_row, NULL),
                             DSI_OK);
        deq(q, ya, n);
        assert_int_equal(dsii_dequantize_row(t->id, q, yb, n, NULL), DSI_OK);
        compare_rows("blocks from libdsinfer's quantizer", t, ya, yb, n);
        double e_ours = 0;
        for (int64_t i = 0; i < n; i++) e_ours += ((double)yb[i] - x[i]) * ((double)yb[i] - x[i]);
        printf("  %-8s %12.3e %12.3e %10.2e  (NMSE)\n", t->ggml_name, e_ggml / sx2, e_ours / sx2, t->nmse_bound);
        assert_true(e_ours / sx2 <= t->nmse_bound);
        assert_true(e_ours <= K_REL * e_ggml);
    }
    free(x);
    free(imat);
    free(ya);
    free(yb);
    free(q);
}

int main(void) {
    const char *dir = getenv("DSI_LLAMA_CPP_LIBDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/libggml-base.so", dir ? dir : "");
    if (!dir || !*dir)
        return dsit_absent("LLAMA_CPP", "DSI_LLAMA_CPP_LIBDIR is not set (scripts/setup-llama-cpp.sh "
                                        "installs llama.cpp and prints it)");
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) return dsit_absent("LLAMA_CPP", "cannot load %s: %s", path, dlerror());
    g_quantize = (ggml_quantize_chunk_fn)dlsym(g_lib, "ggml_quantize_chunk");
    g_requires_imatrix = (ggml_requires_imatrix_fn)dlsym(g_lib, "ggml_quantize_requires_imatrix");
    if (!g_quantize || !g_requires_imatrix) {
        printf("FAIL: %s lacks ggml_quantize_chunk / ggml_quantize_requires_imatrix\n", path);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_quantizers),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dlclose(g_lib);
    return rc;
}
