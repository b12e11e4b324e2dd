/* Engram table access (§4.6 step 1): host and pread placements give the same rows,
 * dequantised from FP8 E4M3 with per-32 UE8M0 scales and rounded to bf16. Expected values
 * are worked out by hand from the format definitions (model-spec §2.1). */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engram/engram.h"

#include <stdio.h>
#include <stdlib.h>

#include <string.h>
#include <time.h>

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

/* ---- parallel readers (issue 17) -------------------------------------------------------------
 * A 97-row fp8 table read through a reader callback that sleeps a little per read (so reads
 * overlap when they run on several threads) and can fail at one offset. The same gathers —
 * duplicates, rows sharing a direct-mapped cache slot, hits on rows the gather itself reads —
 * run on a serial table and a table with 4 readers, each with its own 7-row cache: outputs,
 * cache tags and bytes, and hits / misses / bytes read are identical, gather after gather. */
#define PR_ROWS 97
#define PR_ELEMS 64
#define PR_RB 66

typedef struct pr_src {
    uint8_t data[PR_ROWS * PR_RB];
    atomic_int in_flight, max_in_flight, calls;
    atomic_llong fail_off; /* -1: none */
    atomic_int fast;       /* no sleep (rows as from the page cache); reads by a thread other
                              than `caller` are counted in `elsewhere` */
    atomic_int elsewhere;
    pthread_t caller;
} pr_src;

static int32_t pr_pread(void *ud, void *buf, uint64_t size, uint64_t off) {
    pr_src *s = ud;
    atomic_fetch_add(&s->calls, 1);
    int f = atomic_fetch_add(&s->in_flight, 1) + 1;
    int m = atomic_load(&s->max_in_flight);
    while (f > m && !atomic_compare_exchange_weak(&s->max_in_flight, &m, f)) {}
    struct timespec ts = {0, 200 * 1000};
    if (atomic_load(&s->fast)) {
        if (!pthread_equal(pthread_self(), s->caller)) atomic_fetch_add(&s->elsewhere, 1);
    } else {
        nanosleep(&ts, NULL);
    }
    int32_t rc = 0;
    if ((long long)off <= atomic_load(&s->fail_off) &&
        atomic_load(&s->fail_off) < (long long)(off + size))
        rc = -1;
    else
        memcpy(buf, s->data + off, size);
    atomic_fetch_sub(&s->in_flight, 1);
    return rc;
}

typedef struct pr_side {
    dsii_file *f;
    dsii_engram_table t;
    dsii_engram_cache c;
    atomic_ullong hits, misses, bytes;
} pr_side;

static void pr_open(pr_side *p, pr_src *src, dsii_engram_readers *rd, uint64_t cache_rows) {
    memset(p, 0, sizeof *p);
    dsi_reader r;
    dsi_reader_init(&r);
    r.size = sizeof src->data;
    r.pread_fn = pr_pread;
    r.user_data = src;
    dsii_error e;
    assert_int_equal(dsii_file_open_reader(NULL, &r, &p->f, &e), DSI_OK);
    assert_int_equal(dsii_engram_table_file(&p->t, DSI_TYPE_FP8_E4M3_R32, PR_ELEMS, PR_ROWS, p->f, 0, &e),
                     DSI_OK);
    p->t.readers = rd;
    if (cache_rows) {
        pthread_mutex_init(&p->c.mu, NULL);
        p->c.n_rows = cache_rows;
        p->c.tag = calloc(cache_rows, sizeof *p->c.tag);
        p->c.data = calloc(cache_rows, PR_RB);
        p->c.hits = &p->hits;
        p->c.misses = &p->misses;
        p->c.bytes_read = &p->bytes;
        p->t.cache = &p->c;
    }
}

static void pr_close(pr_side *p) {
    if (p->t.cache) {
        pthread_mutex_destroy(&p->c.mu);
        free(p->c.tag);
        free(p->c.data);
    }
    dsii_file_close(p->f);
}

static void pr_same_cache(const pr_side *a, const pr_side *b) {
    assert_int_equal(atomic_load(&a->hits), atomic_load(&b->hits));
    assert_int_equal(atomic_load(&a->misses), atomic_load(&b->misses));
    assert_int_equal(atomic_load(&a->bytes), atomic_load(&b->bytes));
    if (!a->t.cache) return;
    assert_memory_equal(a->c.tag, b->c.tag, a->c.n_rows * sizeof *a->c.tag);
    for (uint64_t s = 0; s < a->c.n_rows; s++)
        if (a->c.tag[s]) assert_memory_equal(a->c.data + s * PR_RB, b->c.data + s * PR_RB, PR_RB);
}

static pr_src g_src;

static void pr_fill(pr_src *s) {
    uint32_t x = 12345u;
    for (size_t i = 0; i < sizeof s->data; i++) {
        x = x * 1664525u + 1013904223u;
        uint8_t v = (uint8_t)(x >> 24);
        if ((i % 33) == 0) v = (uint8_t)(120 + v % 16);   /* scale 2^-7 .. 2^8 */
        else if ((v & 0x7F) == 0x7F) v ^= 0x01;           /* no E4M3 NaN */
        s->data[i] = v;
    }
    atomic_store(&s->fail_off, -1);
}

static void test_parallel_readers(void **state) {
    (void)state;
    pr_fill(&g_src);
    dsii_error e;
    dsii_engram_readers *rd = NULL;
    assert_int_equal(dsii_engram_readers_create(NULL, 4, &rd, &e), DSI_OK);
    assert_non_null(rd);
    assert_int_equal(dsii_engram_readers_count(rd), 4);
    /* resident reference */
    dsii_engram_table th;
    assert_int_equal(dsii_engram_table_host(&th, DSI_TYPE_FP8_E4M3_R32, PR_ELEMS, PR_ROWS, g_src.data, &e),
                     DSI_OK);
    for (int cached = 0; cached < 2; cached++) {
        pr_side ser, par;
        pr_open(&ser, &g_src, NULL, cached ? 7 : 0);
        pr_open(&par, &g_src, rd, cached ? 7 : 0);
        uint32_t x = 99u;
        for (int g = 0; g < 12; g++) {
            uint32_t rows[40];
            size_t n = g == 0 ? 2 : (size_t)(5 + g * 3);
            for (size_t i = 0; i < n; i++) {
                x = x * 1664525u + 1013904223u;
                rows[i] = (x >> 8) % 23;            /* few rows: repeats and slot clashes */
                if (i % 4 == 3) rows[i] = rows[i - 1] + 7; /* the next row of the same slot */
                if (i % 5 == 4) rows[i] = rows[i - 3];     /* a repeat */
            }
            float a[40 * PR_ELEMS], b[40 * PR_ELEMS], h[40 * PR_ELEMS];
            memset(b, 0xA5, sizeof b);
            assert_int_equal(dsii_engram_gather(NULL, &ser.t, rows, n, a, &e), DSI_OK);
            assert_int_equal(dsii_engram_gather(NULL, &par.t, rows, n, b, &e), DSI_OK);
            assert_int_equal(dsii_engram_gather(NULL, &th, rows, n, h, &e), DSI_OK);
            assert_memory_equal(a, h, n * PR_ELEMS * sizeof(float));
            assert_memory_equal(b, h, n * PR_ELEMS * sizeof(float));
            pr_same_cache(&ser, &par);
        }
        if (cached) assert_true(atomic_load(&par.hits) > 0);
        pr_close(&ser);
        pr_close(&par);
    }
    /* the reads did overlap (200 us reads wake the readers) */
    assert_true(dsii_engram_readers_wakes(rd) > 0);
    printf("# most reads in flight: %d\n", atomic_load(&g_src.max_in_flight));
    assert_true(atomic_load(&g_src.max_in_flight) > 1);
    /* a gather of one row, or all hits, runs on the caller alone: nothing in flight twice */
    pr_side p;
    pr_open(&p, &g_src, rd, 7);
    const uint32_t one[1] = {5}, same[3] = {5, 5, 5};
    float o[3 * PR_ELEMS];
    assert_int_equal(dsii_engram_gather(NULL, &p.t, one, 1, o, &e), DSI_OK);
    atomic_store(&g_src.max_in_flight, 0);
    atomic_store(&g_src.calls, 0);
    assert_int_equal(dsii_engram_gather(NULL, &p.t, same, 3, o, &e), DSI_OK);
    assert_int_equal(atomic_load(&g_src.calls), 0);
    assert_int_equal(atomic_load(&p.hits), 3);
    pr_close(&p);
    /* fast reads (engram.h DSII_ENGRAM_SLOW_READ_NS): the caller reads every row alone, no
     * reader thread is woken; the rows are right */
    pr_open(&p, &g_src, rd, 0);
    uint32_t many[40];
    for (int i = 0; i < 40; i++) many[i] = (uint32_t)(i * 7 % PR_ROWS);
    float fo[40 * PR_ELEMS], fh[40 * PR_ELEMS];
    g_src.caller = pthread_self();
    atomic_store(&g_src.elsewhere, 0);
    atomic_store(&g_src.calls, 0);
    atomic_store(&g_src.fast, 1);
    const uint64_t w0 = dsii_engram_readers_wakes(rd);
    for (int rep = 0; rep < 20; rep++)
        assert_int_equal(dsii_engram_gather(NULL, &p.t, many, 40, fo, &e), DSI_OK);
    atomic_store(&g_src.fast, 0);
    const uint64_t woken = dsii_engram_readers_wakes(rd) - w0;
    printf("# fast reads: %d of %d by a reader thread; %llu of 20 gathers woke the readers\n",
           atomic_load(&g_src.elsewhere), atomic_load(&g_src.calls), (unsigned long long)woken);
    assert_int_equal(atomic_load(&g_src.calls), 20 * 40);
    /* a read slower than 40 us on a loaded machine (a preemption) may wake them now and then:
     * rarely; woken for every gather, and most reads by reader threads, is the bug */
    assert_true(woken <= 4);
    assert_true(atomic_load(&g_src.elsewhere) * 10 < atomic_load(&g_src.calls));
    assert_int_equal(dsii_engram_gather(NULL, &th, many, 40, fh, &e), DSI_OK);
    assert_memory_equal(fo, fh, sizeof fo);
    pr_close(&p);
    dsii_engram_readers_free(rd);
}

/* A failing read under parallel readers: IO naming the first failing row (in gather order)
 * and its offset, every reader done before the call returns (the reader sees no call after),
 * the failed gather's slots empty, and the next gathers identical to the serial path again. */
static void test_parallel_read_error(void **state) {
    (void)state;
    pr_fill(&g_src);
    dsii_error e;
    dsii_engram_readers *rd = NULL;
    assert_int_equal(dsii_engram_readers_create(NULL, 8, &rd, &e), DSI_OK);
    pr_side ser, par;
    pr_open(&ser, &g_src, NULL, 7);
    pr_open(&par, &g_src, rd, 7);
    const uint32_t rows[12] = {1, 2, 3, 40, 5, 6, 41, 8, 9, 10, 11, 12};
    float a[12 * PR_ELEMS], b[12 * PR_ELEMS];
    /* row 40 (and 41, later) fail */
    atomic_store(&g_src.fail_off, 40 * PR_RB + 10);
    dsi_status st = dsii_engram_gather(NULL, &par.t, rows, 12, b, &e);
    printf("# parallel read error: %s\n", e.msg);
    assert_int_equal(st, DSI_ERR_IO);
    assert_non_null(strstr(e.msg, "row 40 at offset 2640"));
    int calls = atomic_load(&g_src.calls);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&g_src.calls), calls); /* nobody still reading */
    assert_int_equal(atomic_load(&g_src.in_flight), 0);
    for (uint64_t s = 0; s < 7; s++) assert_int_equal(par.c.tag[s], 0);
    assert_int_equal(atomic_load(&par.misses), 0);
    /* the serial path names the same row */
    dsii_error es;
    assert_int_equal(dsii_engram_gather(NULL, &ser.t, rows, 12, a, &es), DSI_ERR_IO);
    assert_non_null(strstr(es.msg, "row 40 at offset 2640"));
    /* repaired: both paths agree again (fresh caches on both sides) */
    atomic_store(&g_src.fail_off, -1);
    memset(ser.c.tag, 0, 7 * sizeof *ser.c.tag);
    atomic_store(&ser.hits, 0);
    atomic_store(&ser.misses, 0);
    atomic_store(&ser.bytes, 0);
    assert_int_equal(dsii_engram_gather(NULL, &ser.t, rows, 12, a, &e), DSI_OK);
    assert_int_equal(dsii_engram_gather(NULL, &par.t, rows, 12, b, &e), DSI_OK);
    assert_memory_equal(a, b, sizeof a);
    pr_same_cache(&ser, &par);
    /* an error with several failures at once and no cache: still the first row in order */
    pr_side nc;
    pr_open(&nc, &g_src, rd, 0);
    atomic_store(&g_src.fail_off, 41 * PR_RB);
    const uint32_t rows2[8] = {3, 4, 5, 6, 7, 41, 41, 2};
    assert_int_equal(dsii_engram_gather(NULL, &nc.t, rows2, 8, b, &e), DSI_ERR_IO);
    assert_non_null(strstr(e.msg, "row 41 at offset 2706"));
    atomic_store(&g_src.fail_off, -1);
    pr_close(&nc);
    pr_close(&ser);
    pr_close(&par);
    dsii_engram_readers_free(rd);
    /* bad thread counts */
    assert_int_equal(dsii_engram_readers_create(NULL, 0, &rd, &e), DSI_ERR_INVALID_ARGUMENT);
    assert_null(rd);
    dsii_engram_readers_free(NULL);
}

/* Overlapped gathers (issue 17): the lane helper runs a batch's jobs in order; each job's result
 * is its own (a failing job does not stop the later ones); finish returns the first failing
 * job in job order and returns only when the helper is idle (no read after it); a batch can
 * follow; a cancel request stops a job's reads (CANCELLED, no read); freeing with a batch
 * running joins it. Outputs equal the resident table's. */
static void test_async(void **state) {
    (void)state;
    pr_fill(&g_src);
    dsii_error e;
    dsii_engram_readers *rd = NULL;
    assert_int_equal(dsii_engram_readers_create(NULL, 4, &rd, &e), DSI_OK);
    dsii_engram_table th;
    assert_int_equal(dsii_engram_table_host(&th, DSI_TYPE_FP8_E4M3_R32, PR_ELEMS, PR_ROWS, g_src.data, &e),
                     DSI_OK);
    pr_side p;
    pr_open(&p, &g_src, rd, 0);
    dsii_engram_async *a = NULL;
    assert_int_equal(dsii_engram_async_create(NULL, &a, &e), DSI_OK);
    assert_non_null(a);
    assert_int_equal(dsii_engram_async_finish(a, &e), DSI_OK); /* nothing running */
    static const uint32_t r0[6] = {1, 2, 3, 4, 5, 6}, r1[5] = {7, 40, 8, 41, 9}, r2[4] = {10, 11, 12, 13};
    static float d[3][6 * PR_ELEMS], h[6 * PR_ELEMS];
    dsii_engram_job jobs[3] = {{&p.t, r0, 6, d[0], NULL}, {&p.t, r1, 5, d[1], NULL},
                               {&p.t, r2, 4, d[2], NULL}};
    atomic_store(&g_src.fail_off, 40 * PR_RB + 3); /* job 1 fails */
    dsii_engram_async_start(a, NULL, jobs, 3);
    assert_true(dsii_engram_async_running(a));
    assert_int_equal(dsii_engram_async_wait(a, 0, &e), DSI_OK);
    assert_int_equal(dsii_engram_gather(NULL, &th, r0, 6, h, &e), DSI_OK);
    assert_memory_equal(d[0], h, 6 * PR_ELEMS * sizeof(float));
    assert_int_equal(dsii_engram_async_wait(a, 1, &e), DSI_ERR_IO);
    assert_non_null(strstr(e.msg, "row 40 at offset 2640"));
    dsii_error fe;
    assert_int_equal(dsii_engram_async_finish(a, &fe), DSI_ERR_IO);
    assert_non_null(strstr(fe.msg, "row 40 at offset 2640"));
    assert_false(dsii_engram_async_running(a));
    int calls = atomic_load(&g_src.calls);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&g_src.calls), calls); /* the helper and its readers are done */
    assert_int_equal(atomic_load(&g_src.in_flight), 0);
    assert_int_equal(dsii_engram_gather(NULL, &th, r2, 4, h, &e), DSI_OK); /* job 2 still ran */
    assert_memory_equal(d[2], h, 4 * PR_ELEMS * sizeof(float));
    /* the next batch, repaired */
    atomic_store(&g_src.fail_off, -1);
    memset(d, 0, sizeof d);
    dsii_engram_async_start(a, NULL, jobs, 3);
    assert_int_equal(dsii_engram_async_finish(a, &e), DSI_OK);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(dsii_engram_gather(NULL, &th, jobs[k].rows, jobs[k].n, h, &e), DSI_OK);
        assert_memory_equal(d[k], h, jobs[k].n * PR_ELEMS * sizeof(float));
    }
    /* cancel requested: no read, CANCELLED */
    atomic_int cancel;
    atomic_init(&cancel, 1);
    jobs[0].cancel = &cancel;
    atomic_store(&g_src.calls, 0);
    dsii_engram_async_start(a, NULL, jobs, 1);
    assert_int_equal(dsii_engram_async_wait(a, 0, &e), DSI_ERR_CANCELLED);
    assert_int_equal(dsii_engram_async_finish(a, &e), DSI_ERR_CANCELLED);
    assert_int_equal(atomic_load(&g_src.calls), 0);
    jobs[0].cancel = NULL;
    /* freed while a batch runs: joined */
    dsii_engram_async_start(a, NULL, jobs, 3);
    dsii_engram_async_free(a);
    calls = atomic_load(&g_src.calls);
    nanosleep(&ts, NULL);
    assert_int_equal(atomic_load(&g_src.calls), calls);
    assert_int_equal(atomic_load(&g_src.in_flight), 0);
    dsii_engram_async_free(NULL);
    pr_close(&p);
    dsii_engram_readers_free(rd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_host_and_pread),
        cmocka_unit_test(test_debug_tables_as_stored),
        cmocka_unit_test(test_fp8_bf16_edge),
        cmocka_unit_test(test_row264),
        cmocka_unit_test(test_bad_tables),
        cmocka_unit_test(test_parallel_readers),
        cmocka_unit_test(test_parallel_read_error),
        cmocka_unit_test(test_async),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
