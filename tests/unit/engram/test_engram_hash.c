/* Engram hashing and prime layout (model-spec §4.6). Expected values are the release lists
 * printed in model-spec §4.6 and hand-worked hashes (arithmetic shown in the comments). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engram/engram.h"

#include <string.h>

/* ---- primes ------------------------------------------------------------------------- */

static const uint64_t release_primes[2][24] = {
    {16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183,
     16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321,
     16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463},
    {16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627,
     16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769,
     16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889}};

static void test_is_prime(void **state) {
    (void)state;
    assert_false(dsii_engram_is_prime(0));
    assert_false(dsii_engram_is_prime(1));
    assert_true(dsii_engram_is_prime(2));
    assert_true(dsii_engram_is_prime(1009));
    assert_false(dsii_engram_is_prime(1001)); /* 7 * 11 * 13 */
    assert_false(dsii_engram_is_prime(15999999));
    assert_true(dsii_engram_is_prime(16000057));
    assert_false(dsii_engram_is_prime(16000057ull * 16000079ull));
    assert_true(dsii_engram_is_prime(18446744073709551557ull)); /* largest 64-bit prime */
    assert_false(dsii_engram_is_prime(3215031751ull));          /* strong pseudoprime 2,3,5,7 */
    /* brute force agreement below 5000 */
    for (uint64_t n = 0; n < 5000; n++) {
        int p = n >= 2;
        for (uint64_t d = 2; d * d <= n; d++)
            if (n % d == 0) {
                p = 0;
                break;
            }
        assert_int_equal(dsii_engram_is_prime(n), p);
    }
}

static void test_release_primes(void **state) {
    (void)state;
    uint64_t got[48];
    assert_true(dsii_engram_find_primes(16000000, 2, 4, 8, got));
    uint64_t sum[2] = {0, 0};
    for (int L = 0; L < 2; L++)
        for (int c = 0; c < 24; c++) {
            assert_int_equal(got[L * 24 + c], release_primes[L][c]);
            sum[L] += got[L * 24 + c];
        }
    /* §4.6 / §8: each layer's 24 primes sum to its engram_num_embeddings */
    assert_int_equal(sum[0], 384006168ull);
    assert_int_equal(sum[1], 384016682ull);
}

static void test_tiny_primes(void **state) {
    (void)state;
    /* tiny-v41 (§7.2): vocab 1000, 2 layers, max_ngram 3, 2 heads → rows 4062 and 4152 */
    uint64_t got[8];
    assert_true(dsii_engram_find_primes(1000, 2, 3, 2, got));
    const uint64_t want[8] = {1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049};
    for (int i = 0; i < 8; i++) assert_int_equal(got[i], want[i]);
    assert_int_equal(got[0] + got[1] + got[2] + got[3], 4062);
    assert_int_equal(got[4] + got[5] + got[6] + got[7], 4152);
    assert_false(dsii_engram_find_primes(1000, 0, 3, 2, got));
    assert_false(dsii_engram_find_primes(1000, 1, 1, 2, got));
}

static void test_release_multipliers(void **state) {
    (void)state;
    /* §4.6: bound = (INT64_MAX // 99092) // 2; m = r*2+1 with r in [0, bound) */
    const uint64_t bound = dsii_engram_multiplier_bound(99092);
    assert_int_equal(bound, 46539438283891ull);
    const uint64_t m[2][4] = {{76632096046245ull, 4839876093313ull, 35959672319349ull,
                               73987337458391ull},
                              {67716810739261ull, 51510806800915ull, 30921347202721ull,
                               82619226485591ull}};
    static int32_t cmap[16];
    dsii_engram_layout l;
    memset(&l, 0, sizeof l);
    l.n_heads = 8;
    l.max_ngram = 4;
    l.n_cols = 24;
    l.compressed_vocab = 99092;
    l.n_vocab = 16;
    l.cmap = cmap;
    l.pad_cid = 2;
    for (int i = 0; i < 16; i++) cmap[i] = i;
    for (int L = 0; L < 2; L++) {
        uint64_t off = 0;
        for (int c = 0; c < 24; c++) {
            l.primes[c] = release_primes[L][c];
            l.offsets[c] = off;
            off += release_primes[L][c];
        }
        l.n_rows = off;
        for (int k = 0; k < 4; k++) {
            assert_true(m[L][k] & 1u);
            assert_true(m[L][k] < 2 * bound + 1);
            l.multipliers[k] = m[L][k];
            /* the largest compressed id times m still fits in int64 */
            assert_true((uint64_t)99091 * m[L][k] <= (uint64_t)INT64_MAX);
        }
        dsii_error e;
        assert_int_equal(dsii_engram_layout_check(&l, "test", &e), DSI_OK);
        /* an even multiplier and a too-large one are rejected */
        l.multipliers[2] += 1;
        assert_int_equal(dsii_engram_layout_check(&l, "test", &e), DSI_ERR_BAD_FORMAT);
        l.multipliers[2] = (uint64_t)INT64_MAX / 99092 + 2 + (((uint64_t)INT64_MAX / 99092) & 1u);
        assert_int_equal(dsii_engram_layout_check(&l, "test", &e), DSI_ERR_BAD_FORMAT);
        l.multipliers[2] = m[L][2];
        /* a column range past the table */
        l.n_rows -= 1;
        assert_int_equal(dsii_engram_layout_check(&l, "test", &e), DSI_ERR_BAD_FORMAT);
        l.n_rows += 1;
        cmap[5] = 99092;
        assert_int_equal(dsii_engram_layout_check(&l, "test", &e), DSI_ERR_BAD_FORMAT);
        cmap[5] = 5;
    }
}

/* ---- hashing -------------------------------------------------------------------------- */

/* Hand layout: 2 heads, max_ngram 3 (look-backs 0..2, 4 columns), cmap[t] = t mod 10,
 * pad = compressed id 2, multipliers [3, 5, 7], primes [11, 13, 17, 19],
 * offsets [0, 11, 24, 41], 60 rows. */
static int32_t hand_cmap[16];
static void hand_layout(dsii_engram_layout *l) {
    memset(l, 0, sizeof *l);
    for (int i = 0; i < 16; i++) hand_cmap[i] = i % 10;
    l->n_heads = 2;
    l->max_ngram = 3;
    l->n_cols = 4;
    l->pad_cid = 2;
    l->compressed_vocab = 10;
    l->n_vocab = 16;
    l->cmap = hand_cmap;
    l->n_rows = 60;
    const uint64_t m[3] = {3, 5, 7}, p[4] = {11, 13, 17, 19}, o[4] = {0, 11, 24, 41};
    memcpy(l->multipliers, m, sizeof m);
    memcpy(l->primes, p, sizeof p);
    memcpy(l->offsets, o, sizeof o);
}

static void test_hash_hand(void **state) {
    (void)state;
    dsii_engram_layout l;
    hand_layout(&l);
    dsii_error e;
    assert_int_equal(dsii_engram_layout_check(&l, "hand", &e), DSI_OK);

    /* sequence [4, 9, 13] from the start:
     * p0: tok [4, pad 2, pad 2] prod [12, 10, 14]; r = 12^10 = 6 → 6%11+0 = 6, 6%13+11 = 17;
     *     r = 6^14 = 8 → 8%17+24 = 32, 8%19+41 = 49
     * p1: tok [9, 4, 2] prod [27, 20, 14]; r = 27^20 = 15 → 4, 2+11 = 13; r = 15^14 = 1 → 25, 42
     * p2: tok [3, 9, 4] prod [9, 45, 28]; r = 9^45 = 36 → 3, 10+11 = 21; r = 36^28 = 56 →
     *     56%17 = 5 → 29, 56%19 = 18 → 59 */
    const int32_t seq[3] = {4, 9, 13};
    const uint32_t want[12] = {6, 17, 32, 49, 4, 13, 25, 42, 3, 21, 29, 59};
    uint32_t rows[12];
    dsii_engram_hash(&l, NULL, 0, seq, 3, rows);
    for (int i = 0; i < 12; i++) assert_int_equal(rows[i], want[i]);

    /* the same positions split into chunks, history carried: identical rows */
    dsii_engram_history h = {0, {0}};
    for (int i = 0; i < 3; i++) {
        uint32_t r1[4];
        dsii_engram_hash(&l, h.tok, h.n, seq + i, 1, r1);
        for (int c = 0; c < 4; c++) assert_int_equal(r1[c], want[i * 4 + c]);
        dsii_engram_history_push(&h, l.max_ngram, seq + i, 1);
    }
    assert_int_equal(h.n, 2);
    assert_int_equal(h.tok[0], 9);
    assert_int_equal(h.tok[1], 13);

    /* one token of history only (sequence [9, 13]): p1 = tok [3, 9, pad 2] prod [9, 45, 14];
     * r = 36 → 3, 21; r = 36^14 = 42 → 42%17 = 8 → 32, 42%19 = 4 → 45 */
    const int32_t h1[1] = {9};
    uint32_t r2[4];
    dsii_engram_hash(&l, h1, 1, seq + 2, 1, r2);
    const uint32_t want2[4] = {3, 21, 32, 45};
    for (int c = 0; c < 4; c++) assert_int_equal(r2[c], want2[c]);

    /* the raw pad token itself hashes like padding (cmap[2] = 2) */
    const int32_t padseq[2] = {2, 4};
    uint32_t r3[8];
    dsii_engram_hash(&l, NULL, 0, padseq + 1, 1, r3);     /* [4] from the start */
    dsii_engram_hash(&l, padseq, 1, padseq + 1, 1, r3 + 4); /* [2, 4]: p1 = [4, 2, pad] */
    for (int c = 0; c < 4; c++) assert_int_equal(r3[c], r3[4 + c]);

    /* longer history than needed: only the last max_ngram-1 count */
    const int32_t hl[4] = {7, 7, 4, 9};
    dsii_engram_hash(&l, hl, 4, seq + 2, 1, r2);
    for (int c = 0; c < 4; c++) assert_int_equal(r2[c], want[8 + c]);
}

static void test_hash_large_values(void **state) {
    (void)state;
    /* release-sized numbers: max_ngram 4, one head, compressed vocab 99092, layer-1
     * multipliers, primes of layer 1 col 0/8/16. Expected rows from explicit u64 math. */
    static int32_t cmap[3] = {99091, 50000, 7};
    dsii_engram_layout l;
    memset(&l, 0, sizeof l);
    l.n_heads = 1;
    l.max_ngram = 4;
    l.n_cols = 3;
    l.pad_cid = 7;
    l.compressed_vocab = 99092;
    l.n_vocab = 3;
    l.cmap = cmap;
    const uint64_t m[4] = {76632096046245ull, 4839876093313ull, 35959672319349ull,
                           73987337458391ull};
    memcpy(l.multipliers, m, sizeof m);
    l.primes[0] = 16000057;
    l.primes[1] = 16000189;
    l.primes[2] = 16000339;
    l.offsets[0] = 0;
    l.offsets[1] = 16000057;
    l.offsets[2] = 16000057 + 16000189;
    l.n_rows = 16000057ull + 16000189ull + 16000339ull;
    dsii_error e;
    assert_int_equal(dsii_engram_layout_check(&l, "big", &e), DSI_OK);
    const int32_t seq[2] = {0, 1}; /* compressed [99091, 50000] */
    uint32_t rows[6];
    dsii_engram_hash(&l, NULL, 0, seq, 2, rows);
    /* position 1: tok [50000, 99091, 7, 7] */
    uint64_t r = 50000ull * m[0];
    r ^= 99091ull * m[1];
    assert_int_equal(rows[3], r % 16000057ull);
    r ^= 7ull * m[2];
    assert_int_equal(rows[4], r % 16000189ull + 16000057ull);
    r ^= 7ull * m[3];
    assert_int_equal(rows[5], r % 16000339ull + 16000057ull + 16000189ull);
}

static void test_history(void **state) {
    (void)state;
    dsii_engram_history h = {0, {0}};
    const int32_t t[6] = {10, 11, 12, 13, 14, 15};
    dsii_engram_history_push(&h, 4, t, 1);
    assert_int_equal(h.n, 1);
    dsii_engram_history_push(&h, 4, t + 1, 1);
    assert_int_equal(h.n, 2);
    dsii_engram_history_push(&h, 4, t + 2, 2);
    assert_int_equal(h.n, 3);
    assert_int_equal(h.tok[0], 11);
    assert_int_equal(h.tok[1], 12);
    assert_int_equal(h.tok[2], 13);
    dsii_engram_history_push(&h, 4, t + 4, 2);
    assert_int_equal(h.tok[0], 13);
    assert_int_equal(h.tok[2], 15);
    dsii_engram_history_set(&h, 4, t, 2);
    assert_int_equal(h.n, 2);
    assert_int_equal(h.tok[0], 10);
    assert_int_equal(h.tok[1], 11);
    dsii_engram_history_set(&h, 4, t, 6);
    assert_int_equal(h.n, 3);
    assert_int_equal(h.tok[0], 13);
    dsii_engram_history_set(&h, 4, t, 0);
    assert_int_equal(h.n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_is_prime),           cmocka_unit_test(test_release_primes),
        cmocka_unit_test(test_tiny_primes),        cmocka_unit_test(test_release_multipliers),
        cmocka_unit_test(test_hash_hand),          cmocka_unit_test(test_hash_large_values),
        cmocka_unit_test(test_history),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
