/* Engram table access (§4.6 step 1): host and pread placements give the same rows,
 * dequantised from FP8 E4M3 with per-32 UE8M0 scales and rounded to bf16. Expected values
 * are worked out by hand from the format definitions (model-spec §2.1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engram/engram.h"

#include <string.h>

/* 3 rows × 64 elements of fp8_e4m3_r32: per block of 32 one E8M0 byte then 32 E4M3 bytes.
 * Row r, block b: scale byte 127 + r (scale 2^r); element j of the block has code
 * 0x38 + (j % 8) (1.0, 1.125, …, 1.875) with the sign bit set for odd blocks. */
static uint8_t table_fp8[3 * 2 * 33];

static void build_fp8(void) {
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 2; b++) {
            uint8_t *p = table_fp8 + (r * 2 + b) * 33;
            p[0] = (uint8_t)(127 + r);
            for (int j = 0; j < 32; j++) p[1 + j] = (uint8_t)((b ? 0x80 : 0) | (0x38 + (j % 8)));
        }
}

static float want_fp8(int r, int e) {
    int b = e / 32, j = e % 32;
    float v = (1.0f + 0.125f * (float)(j % 8)) * (float)(1 << r);
    return b ? -v : v; /* all exactly representable in bf16 (4 significant bits) */
}

static void test_fp8_host_and_pread(void **state) {
    (void)state;
    build_fp8();
    dsii_error e;
    dsii_engram_table th, tp;
    assert_int_equal(dsii_engram_table_host(&th, DSI_TYPE_FP8_E4M3_R32, 64, 3, table_fp8, &e),
                     DSI_OK);
    assert_int_equal(th.row_bytes, 66);
    dsii_file *f = NULL;
    /* the table sits 5 bytes into a "file" */
    static uint8_t file_bytes[5 + sizeof table_fp8];
    memset(file_bytes, 0xEE, 5);
    memcpy(file_bytes + 5, table_fp8, sizeof table_fp8);
    assert_int_equal(dsii_file_open_memory(NULL, file_bytes, sizeof file_bytes, &f, &e), DSI_OK);
    assert_int_equal(dsii_engram_table_file(&tp, DSI_TYPE_FP8_E4M3_R32, 64, 3, f, 5, &e), DSI_OK);
    /* a table that would run past the end of the file is refused */
    dsii_engram_table bad;
    assert_int_equal(dsii_engram_table_file(&bad, DSI_TYPE_FP8_E4M3_R32, 64, 4, f, 5, &e),
                     DSI_ERR_BAD_FORMAT);

    const uint32_t rows[4] = {2, 0, 2, 1};
    float a[4 * 64], b[4 * 64];
    assert_int_equal(dsii_engram_gather(NULL, &th, rows, 4, a, &e), DSI_OK);
    assert_int_equal(dsii_engram_gather(NULL, &tp, rows, 4, b, &e), DSI_OK);
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 64; k++) {
            assert_true(a[i * 64 + k] == want_fp8((int)rows[i], k));
            assert_true(b[i * 64 + k] == a[i * 64 + k]);
        }
    const uint32_t oob = 3;
    assert_int_equal(dsii_engram_gather(NULL, &th, &oob, 1, a, &e), DSI_ERR_INTERNAL);
    assert_int_equal(dsii_engram_gather(NULL, &tp, &oob, 1, a, &e), DSI_ERR_INTERNAL);
    dsii_file_close(f);
}

static void test_debug_tables_as_stored(void **state) {
    (void)state;
    /* F32 / F16 (debug) tables are used as stored: no bf16 rounding (1 + 2^-8 would round
     * to 1.0 in bf16). */
    static float tab[2][4] = {{1.0f + 0.00390625f, 1.0f + 3 * 0.00390625f, -3.0f, 65504.0f},
                              {0.0f, -0.0f, 1e-30f, 0.1f}};
    dsii_error e;
    dsii_engram_table t;
    assert_int_equal(dsii_engram_table_host(&t, DSI_TYPE_F32, 4, 2, tab, &e), DSI_OK);
    const uint32_t rows[2] = {1, 0};
    float out[8];
    assert_int_equal(dsii_engram_gather(NULL, &t, rows, 2, out, &e), DSI_OK);
    assert_memory_equal(out, tab[1], sizeof tab[1]);
    assert_memory_equal(out + 4, tab[0], sizeof tab[0]);
    /* f16 row: 0x3C01 = 1 + 2^-10, kept (bf16 would give 1.0) */
    static uint16_t h[4] = {0x3C01, 0xC000, 0x0000, 0x7BFF};
    assert_int_equal(dsii_engram_table_host(&t, DSI_TYPE_F16, 4, 1, h, &e), DSI_OK);
    const uint32_t r0 = 0;
    assert_int_equal(dsii_engram_gather(NULL, &t, &r0, 1, out, &e), DSI_OK);
    assert_true(out[0] == 1.0f + 0x1p-10f);
    assert_true(out[1] == -2.0f);
    assert_true(out[3] == 65504.0f);
}

static void test_fp8_bf16_edge(void **state) {
    (void)state;
    /* An FP8 row whose value falls below bf16's precision: E4M3 subnormal 0x07 (7·2^-9)
     * times scale 2^-120 = 7·2^-129, an f32 subnormal with mantissa bits below bf16's 16
     * kept bits → bf16 RNE gives 2^-127·... : compute the expectation independently:
     * f32 bits of 7·2^-129 = 7 << 20 (subnormal: value = m·2^-149, m = 7·2^20);
     * bf16 keeps bits 16..31 → m = 0x700000 exactly (low 16 bits are zero) → unchanged.
     * And 0x01 (2^-9) with scale 2^-127 = 2^-136: m = 2^13 → low 16 bits 0x2000 < 0x8000
     * → rounds to 0. */
    static uint8_t row[2][33];
    memset(row, 0, sizeof row);
    row[0][0] = 7;     /* 2^-120 */
    row[0][1] = 0x07;
    row[1][0] = 0;     /* 2^-127 */
    row[1][1] = 0x01;
    dsii_error e;
    dsii_engram_table t;
    assert_int_equal(dsii_engram_table_host(&t, DSI_TYPE_FP8_E4M3_R32, 32, 2, row, &e), DSI_OK);
    const uint32_t rows[2] = {0, 1};
    float out[64];
    assert_int_equal(dsii_engram_gather(NULL, &t, rows, 2, out, &e), DSI_OK);
    assert_true(out[0] == 7.0f * 0x1p-129f);
    assert_true(out[32] == 0.0f);
}

/* ds4's row264 encoding (model-spec §5.2, DSII_TYPE_ENGRAM_ROW264): per row K E4M3 values
 * then K/32 E8M0 scales. Same values as table_fp8 (3 rows × 64), laid out the ds4 way; the
 * scale of the second block is a different byte, so a decoder that reads the wrong scale
 * fails. Host and pread placements. */
static void test_row264(void **state) {
    (void)state;
    build_fp8();
    uint8_t t264[3 * 66];
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 2; b++) {
            const uint8_t *s = table_fp8 + (r * 2 + b) * 33;
            memcpy(t264 + r * 66 + 32 * b, s + 1, 32);
            t264[r * 66 + 64 + b] = s[0];
        }
    t264[1 * 66 + 64 + 1] = 127 + 5; /* row 1, block 1: scale 2^5 instead of 2^1 */
    dsii_error e;
    dsii_engram_table th, tp;
    assert_int_equal(dsii_engram_table_host(&th, DSII_TYPE_ENGRAM_ROW264, 64, 3, t264, &e), DSI_OK);
    assert_int_equal(th.row_bytes, 66);
    dsii_file *f = NULL;
    assert_int_equal(dsii_file_open_memory(NULL, t264, sizeof t264, &f, &e), DSI_OK);
    assert_int_equal(dsii_engram_table_file(&tp, DSII_TYPE_ENGRAM_ROW264, 64, 3, f, 0, &e), DSI_OK);
    const uint32_t rows[3] = {1, 2, 0};
    float a[3 * 64], b[3 * 64];
    assert_int_equal(dsii_engram_gather(NULL, &th, rows, 3, a, &e), DSI_OK);
    assert_int_equal(dsii_engram_gather(NULL, &tp, rows, 3, b, &e), DSI_OK);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 64; k++) {
            float want = want_fp8((int)rows[i], k);
            if (rows[i] == 1 && k >= 32) want *= 16.0f; /* 2^5 / 2^1 */
            assert_true(a[i * 64 + k] == want);
            assert_true(b[i * 64 + k] == want);
        }
    /* a row must be whole blocks of 32 */
    assert_int_equal(dsii_engram_table_host(&th, DSII_TYPE_ENGRAM_ROW264, 48, 3, t264, &e), DSI_ERR_BAD_FORMAT);
    dsii_file_close(f);
}

static void test_bad_tables(void **state) {
    (void)state;
    dsii_error e;
    dsii_engram_table t;
    static uint8_t dummy[64];
    assert_int_equal(dsii_engram_table_host(&t, 12345, 4, 2, dummy, &e), DSI_ERR_UNSUPPORTED);
    assert_int_equal(dsii_engram_table_host(&t, DSI_TYPE_F32, 0, 2, dummy, &e),
                     DSI_ERR_BAD_FORMAT);
    assert_int_equal(dsii_engram_table_host(&t, DSI_TYPE_F32, 4, 0, dummy, &e),
                     DSI_ERR_BAD_FORMAT);
    assert_int_equal(dsii_engram_table_host(&t, DSI_TYPE_F32, 4, 2, NULL, &e),
                     DSI_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_host_and_pread),
        cmocka_unit_test(test_debug_tables_as_stored),
        cmocka_unit_test(test_fp8_bf16_edge),
        cmocka_unit_test(test_row264),
        cmocka_unit_test(test_bad_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
