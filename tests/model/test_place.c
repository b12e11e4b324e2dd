/*
 * Memory tiers (lib/place, docs/placement.md) on the CPU backend:
 *
 *  1. identity: for tiny-v4 and tiny-v41, all logits of a prompt (prefill in chunks, then
 *     decode steps) are bit-identical between the default all-resident load and the
 *     routed experts streamed from the file with 100 %, 50 %, 10 % and 0 % (the minimum: k
 *     slots) of them cached — LRU and LFU, read-ahead on and off, pread and mmap access;
 *     and a per-layer override (only layers 1–3 streamed); tiny-v41's Engram tables in the
 *     file with a row cache, and made resident by an override in pread mode. The plan and the counters agree
 *     with the placement (slots, streamed experts, hits + misses, bytes read);
 *  2. bad options: each gives its dsi_status and a message naming the problem, no model;
 *  3. budget: tiny-moe (routed experts ~85 % of its bytes), loaded with a host budget
 *     several times smaller than the model: the library's live host allocations (context
 *     allocator hooks) never exceed the budget plus what the same session costs on a
 *     mapped all-resident load (which owns no weights), measured in the same run;
 *  4. faults: a read error (reader callback) and a truncated file (pread mode) under
 *     streaming fail the step that needed the read with DSI_ERR_IO; the session keeps its
 *     position, and after the source is repaired the same append gives the reference
 *     logits bit for bit;
 *  5. cancel: a slow reader (every read sleeps) and a one-step prefill: dsi_session_cancel
 *     from another thread stops the step inside its reads (CANCELLED, not the completed
 *     step), promptly, with the timeline at 0; the prompt then evaluates to the reference;
 *  6. threads: four sessions on four threads share one streamed model (k slots: they wait
 *     for each other's pinned slots; and 10 %), each bit-identical to its resident run.
 *  overlap, overlap_bench: Engram gathers overlapped with the first layers (the section's own
 *     comment, "7. Engram gathers overlapped ...").
 *
 * With argv[1] "vulkan" (test_place_vulkan): hybrid steps, a Vulkan compute device with the
 * CPU instance beside it —
 *  7. hybrid_upload: the routed experts in the disk tier (pread) and in the host tier (mmap,
 *     pread) served by an expert cache on the GPU (DSI_HYBRID_UPLOAD) with 100 %, 50 %, 10 %
 *     and 0 % (k slots) of them cached, LRU / LFU, read-ahead on and off: logits bit-identical
 *     to the all-resident Vulkan run; the device's weight bytes never above the device
 *     budget; tiny-moe with a device budget several times smaller than the model;
 *  8. hybrid_cpu: the same tiers computed by the CPU instance (DSI_HYBRID_CPU): bit-identical
 *     to each other (host tier mmap / pread, disk tier with 10 % cached, a per-layer
 *     override), and within the CPU–Vulkan bound of test_backend_model (rounding off: max
 *     |Δlogit| <= 2e-3, argmax equal at every position) of the all-resident Vulkan run;
 *  9. hybrid_split: DSI_HYBRID_CPU with device experts (experts 0 .. E/2-1 of every tiered
 *     layer on the GPU, the rest on the CPU, one step's entries split by expert id): within
 *     the same bound of all-resident Vulkan; host tier and disk tier bit-identical to each
 *     other; prefill chunks of 7 and of 3 bit-identical (the split depends on expert ids
 *     only); DSI_DEVICE_EXPERTS_AUTO under a budget for E/4 experts per layer takes E/4;
 * 10. hybrid_bad: option and budget errors of hybrid plans;
 * 11. engram_tiers_gpu: tiny-v41's Engram tables on disk (row cache), host and device next
 *     to the GPU: bit-identical to all-resident.
 *
 * Skips (77) only without the tiny models / dsinfer-mkmodel / (argv vulkan) a Vulkan device.
 */
#define _GNU_SOURCE /* O_DIRECT */
#define DSI_EXPERIMENTAL
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dsinfer.h"
#include "api/session_impl.h"
#include "engram/engram.h"
#include "model/model.h"
#include "model_test_util.h"
#include "tests/common/filter.h"
#include "tests/common/skip.h"
#include "tests/common/vk_validation.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#define NTOK 24
#define NCTX 256

static const char *g_models[2];
static const char *g_backend; /* argv[1]: the compute device (NULL: cpu) */

/* ---- helpers ------------------------------------------------------------------------------ */

static dsi_context *new_ctx(dsi_context_options *co_in) {
    dsi_context_options co;
    if (co_in) co = *co_in;
    else dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    if (g_backend) co.backend = g_backend;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&co, &ctx) != DSI_OK) {
        printf("# context: %s\n", dsi_last_error());
        return NULL;
    }
    return ctx;
}

static dsi_model *load(dsi_context *ctx, const char *path, int32_t access, const dsi_place_options *po,
                       dsi_status *st_out) {
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.access = access;
    mo.place = po;
    dsi_model *m = NULL;
    dsi_status st = dsi_model_load(ctx, path, &mo, &m);
    if (st_out) *st_out = st;
    if (st != DSI_OK && !st_out) printf("# load %s: %s\n", path, dsi_last_error());
    return m;
}

static uint32_t pos_of(const dsi_session *s) {
    uint32_t p = 0;
    assert_int_equal(dsi_session_position(s, &p), DSI_OK);
    return p;
}

static int32_t n_vocab(dsi_model *m) {
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(m, &info);
    return info.n_vocab;
}

static void info_of(dsi_model *m, dsi_place_info *pi) {
    dsi_place_info_init(pi);
    assert_int_equal(dsi_model_place_info(m, pi), DSI_OK);
}

/* Prefill `P` tokens (one append: chunks of the session's n_batch), then one step per token
 * up to NTOK: all logits. After the prefill the place info and the routing counts are read
 * into pi_mid / counts_mid (the caller's n_counts entries), at the end into pi_end (each may
 * be NULL). */
static float *run_steps(dsi_model *m, const dsi_token *toks, int32_t V, uint32_t flags, uint32_t n_batch, int P,
                        dsi_place_info *pi_mid, uint64_t *counts_mid, uint64_t n_counts, dsi_place_info *pi_end) {
    dsi_session *s = mt_session(m, NCTX, n_batch, flags);
    if (!s) return NULL;
    float *all = malloc(sizeof(float) * NTOK * (size_t)V);
    dsi_status st = DSI_OK;
    if (P > 0) {
        dsii_session_begin_call(s);
        st = dsii_session_append_all_logits(s, toks, (uint32_t)P, all);
    }
    if (st == DSI_OK && pi_mid) info_of(m, pi_mid);
    if (st == DSI_OK && counts_mid)
        assert_int_equal(dsi_model_expert_counts(m, counts_mid, n_counts, NULL, NULL, NULL), DSI_OK);
    for (int i = P; st == DSI_OK && i < NTOK; i++) {
        dsii_session_begin_call(s);
        st = dsii_session_append_all_logits(s, toks + i, 1, all + (size_t)i * (size_t)V);
    }
    if (st == DSI_OK && pi_end) info_of(m, pi_end);
    if (st != DSI_OK) {
        printf("# run: %s\n", dsi_session_last_error(s));
        free(all);
        all = NULL;
    }
    dsi_session_free(s);
    return all;
}

/* Prefill NTOK-4 tokens in chunks of n_batch, then 4 decode steps: all logits. */
static float *run_batch(dsi_model *m, const dsi_token *toks, int32_t V, uint32_t flags, uint32_t n_batch) {
    return run_steps(m, toks, V, flags, n_batch, NTOK - 4, NULL, NULL, 0, NULL);
}

static float *run_flags(dsi_model *m, const dsi_token *toks, int32_t V, uint32_t flags) {
    return run_batch(m, toks, V, flags, 7);
}
static float *run(dsi_model *m, const dsi_token *toks, int32_t V) { return run_flags(m, toks, V, 0); }

/* Plan facts from a streamed load with an unlimited budget: owned resident bytes, the slot
 * size, streamed experts, k. */
typedef struct plan_facts {
    uint64_t owned, unit;
    uint32_t n_streamed;
} plan_facts;

static void facts_access(dsi_context *ctx, const char *path, int32_t access, plan_facts *f) {
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_EXPERTS_STREAMED;
    po.host_budget = (uint64_t)1 << 40;
    po.flags = DSI_PLACE_FLAG_NO_PREFETCH;
    dsi_model *m = load(ctx, path, access, &po, NULL);
    assert_non_null(m);
    dsi_place_info pi;
    info_of(m, &pi);
    assert_int_equal(pi.policy, DSI_PLACE_EXPERTS_STREAMED);
    assert_true(pi.n_experts_streamed > 0);
    assert_int_equal(pi.expert_cache_slots, pi.n_experts_streamed); /* everything fits */
    f->unit = pi.expert_cache_bytes / pi.expert_cache_slots;
    f->owned = pi.host_bytes - pi.expert_cache_bytes;
    f->n_streamed = pi.n_experts_streamed;
    /* the experts class is in the disk tier, the others are not */
    int seen = 0;
    for (uint32_t c = 0; c < pi.n_classes; c++) {
        if (strcmp(pi.classes[c].name, "experts") == 0) {
            seen = 1;
            assert_int_equal(pi.classes[c].tier, DSI_TIER_DISK);
            assert_true(pi.classes[c].disk_bytes > 0);
        } else if (strcmp(pi.classes[c].name, "attention") == 0) {
            assert_int_equal(pi.classes[c].tier, DSI_TIER_DEVICE);
        }
    }
    assert_true(seen);
    dsi_model_free(m);
}

static void facts(dsi_context *ctx, const char *path, plan_facts *f) {
    facts_access(ctx, path, DSI_ACCESS_PREAD, f);
}

static uint64_t budget_for(const plan_facts *f, double frac, uint32_t k) {
    uint64_t slots = (uint64_t)(frac * f->n_streamed);
    if (slots < k) slots = k;
    return f->owned + slots * f->unit;
}

/* ---- 1. identity ---------------------------------------------------------------------------- */

static void identity(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
        assert_non_null(m);
        int32_t V = n_vocab(m);
        dsi_token toks[NTOK];
        mt_tokens(toks, NTOK, V, 1234u + (uint32_t)mi);
        float *ref = run(m, toks, V);
        assert_non_null(ref);
        dsi_place_info pi;
        info_of(m, &pi); /* no plan asked: all resident */
        assert_int_equal(pi.n_experts_streamed, 0);
        dsi_model_free(m);
        plan_facts f, fm;
        facts(ctx, path, &f);
        facts_access(ctx, path, DSI_ACCESS_MMAP, &fm); /* owns no weights: bookkeeping only */
        printf("# %s: owned %llu bytes, %u streamed experts of %llu bytes\n", path,
               (unsigned long long)f.owned, f.n_streamed, (unsigned long long)f.unit);
        struct {
            double frac;
            uint32_t cache, flags;
            int32_t access;
        } cases[] = {
            {1.0, DSI_CACHE_LRU, 0, DSI_ACCESS_PREAD},
            {0.5, DSI_CACHE_LRU, 0, DSI_ACCESS_PREAD},
            {0.1, DSI_CACHE_LFU, 0, DSI_ACCESS_PREAD},
            {0.1, DSI_CACHE_LRU, DSI_PLACE_FLAG_NO_PREFETCH, DSI_ACCESS_MMAP},
            {0.0, DSI_CACHE_LRU, 0, DSI_ACCESS_PREAD},
            {0.0, DSI_CACHE_LFU, DSI_PLACE_FLAG_NO_PREFETCH, DSI_ACCESS_PREAD},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = DSI_PLACE_EXPERTS_STREAMED;
            po.cache_policy = cases[c].cache;
            po.flags = cases[c].flags;
            po.host_budget = budget_for(&f, cases[c].frac, 2);
            if (cases[c].access == DSI_ACCESS_MMAP) po.host_budget = budget_for(&fm, cases[c].frac, 2);
            m = load(ctx, path, cases[c].access, &po, NULL);
            assert_non_null(m);
            float *got = run(m, toks, V);
            assert_non_null(got);
            info_of(m, &pi);
            uint64_t want_slots = (uint64_t)(cases[c].frac * f.n_streamed);
            if (want_slots < 2) want_slots = 2;
            printf("# %s: %.0f %% cached (%u slots, %s%s%s): hits %llu misses %llu prefetches %llu "
                   "(used %llu) read %llu bytes, %llu steps, %llu cpu experts\n",
                   path, cases[c].frac * 100, pi.expert_cache_slots,
                   cases[c].cache == DSI_CACHE_LFU ? "LFU" : "LRU",
                   cases[c].flags ? ", no read-ahead" : "",
                   cases[c].access == DSI_ACCESS_MMAP ? ", mmap" : "",
                   (unsigned long long)pi.cache_hits, (unsigned long long)pi.cache_misses,
                   (unsigned long long)pi.prefetches, (unsigned long long)pi.prefetch_hits,
                   (unsigned long long)pi.bytes_read, (unsigned long long)pi.steps,
                   (unsigned long long)pi.cpu_experts);
            assert_int_equal(pi.expert_cache_slots, want_slots);
            assert_int_equal(pi.n_experts_streamed, f.n_streamed);
            assert_true(pi.host_peak <= po.host_budget);
            assert_true(pi.cache_misses > 0);
            assert_true(pi.bytes_read >= f.unit / 2);
            assert_true(pi.steps >= 4);
            if (cases[c].frac == 1.0) {
                /* every expert is read at most once (demand + read-ahead) */
                assert_true(pi.bytes_read <= (uint64_t)f.n_streamed * f.unit);
                assert_true(pi.cache_hits > 0);
            }
            if (cases[c].flags) assert_int_equal(pi.prefetches, 0);
            if (memcmp(got, ref, sizeof(float) * NTOK * (size_t)V) != 0) {
                mt_cmp cm = mt_compare(got, ref, NTOK, V, 0.0);
                printf("FAIL: %s case %zu: logits differ (max |d| %g at %ld)\n", path, c, cm.max_abs,
                       cm.worst_pos);
                fail();
            }
            free(got);
            dsi_model_free(m);
        }
        /* per-layer override: only layers 1-3 streamed */
        {
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = DSI_PLACE_ALL_RESIDENT;
            po.overrides = "blk.[1-3].ffn_*_exps.weight=disk";
            po.host_budget = f.owned + f.n_streamed * f.unit; /* generous */
            m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
            assert_non_null(m);
            info_of(m, &pi);
            uint32_t per_layer = f.n_streamed / (mi == 0 ? 6u : 10u);
            assert_int_equal(pi.n_experts_streamed, 3 * per_layer);
            float *got = run(m, toks, V);
            assert_non_null(got);
            assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
            free(got);
            dsi_model_free(m);
        }
        /* Engram tiers (tiny-v41): tables in the file with a row cache (alongside streamed
         * experts), and tables resident through an override in pread mode */
        if (mi == 1) {
            /* a repeating prompt: its n-grams recur, so the row cache has hits */
            dsi_token rt[NTOK];
            for (int i = 0; i < NTOK; i++) rt[i] = toks[i % 5];
            m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
            assert_non_null(m);
            float *rref = run(m, rt, V);
            assert_non_null(rref);
            dsi_model_free(m);
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = DSI_PLACE_EXPERTS_STREAMED;
            po.engram_cache_bytes = 64 * 1024;
            po.host_budget = budget_for(&f, 0.5, 2) + po.engram_cache_bytes;
            /* parallel readers (issue 17): the default (DSII_ENGRAM_READERS threads), 8, and
             * the serial path (1): same logits as the resident tables, same counters */
            const int readers[3] = {1, 0, 8};
            uint64_t ser[3] = {0, 0, 0};
            float *got = NULL;
            for (int ri = 0; ri < 3; ri++) {
                atomic_store(&dsii_engram_readers_test, readers[ri]);
                m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
                atomic_store(&dsii_engram_readers_test, 0);
                assert_non_null(m);
                got = run(m, rt, V);
                assert_non_null(got);
                info_of(m, &pi);
                printf("# %s: Engram on disk, %llu-byte row cache, readers %d: hits %llu misses %llu read %llu "
                       "bytes\n", path, (unsigned long long)pi.engram_cache_bytes, readers[ri],
                       (unsigned long long)pi.engram_hits, (unsigned long long)pi.engram_misses,
                       (unsigned long long)pi.engram_bytes_read);
                assert_int_equal(pi.engram_cache_bytes, po.engram_cache_bytes);
                assert_true(pi.engram_misses > 0);
                assert_true(pi.engram_hits > 0); /* prefill + decode re-read rows */
                assert_true(pi.host_peak <= po.host_budget);
                if (ri == 0) {
                    ser[0] = pi.engram_hits;
                    ser[1] = pi.engram_misses;
                    ser[2] = pi.engram_bytes_read;
                } else {
                    assert_int_equal(pi.engram_hits, ser[0]);
                    assert_int_equal(pi.engram_misses, ser[1]);
                    assert_int_equal(pi.engram_bytes_read, ser[2]);
                }
                for (uint32_t c = 0; c < pi.n_classes; c++)
                    if (strcmp(pi.classes[c].name, "engram") == 0) assert_true(pi.classes[c].disk_bytes > 0);
                assert_memory_equal(got, rref, sizeof(float) * NTOK * (size_t)V);
                free(got);
                dsi_model_free(m);
            }
            dsi_place_options_init(&po);
            po.policy = DSI_PLACE_ALL_RESIDENT;
            po.overrides = "*engram*=device";
            po.host_budget = (uint64_t)1 << 40;
            m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
            assert_non_null(m);
            info_of(m, &pi);
            for (uint32_t c = 0; c < pi.n_classes; c++)
                if (strcmp(pi.classes[c].name, "engram") == 0) {
                    assert_int_equal(pi.classes[c].disk_bytes, 0);
                    assert_int_equal(pi.classes[c].tier, DSI_TIER_DEVICE);
                }
            got = run(m, rt, V);
            assert_non_null(got);
            assert_memory_equal(got, rref, sizeof(float) * NTOK * (size_t)V);
            free(got);
            dsi_model_free(m);
            free(rref);
        }
        free(ref);
        dsi_context_free(ctx);
    }
}

/* ---- 2. bad options ------------------------------------------------------------------------- */

/* ---- routing counts and profiles (dsi_model_expert_counts, dsi_place_options.expert_counts) */

/* A context, the model loaded resident (mmap), its shape and NTOK tokens of `seed`. */
typedef struct tcase {
    dsi_context *ctx;
    dsi_model *m;
    int32_t V;
    uint32_t E, k, nl;
    dsi_token toks[NTOK];
} tcase;

static void tcase_open(tcase *c, const char *path, uint32_t seed) {
    c->ctx = new_ctx(NULL);
    assert_non_null(c->ctx);
    c->m = load(c->ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
    assert_non_null(c->m);
    c->V = n_vocab(c->m);
    dsi_model_info info;
    dsi_model_info_init(&info);
    assert_int_equal(dsi_model_get_info(c->m, &info), DSI_OK);
    c->E = (uint32_t)info.n_experts;
    c->k = (uint32_t)info.n_experts_used;
    c->nl = (uint32_t)info.n_layers;
    mt_tokens(c->toks, NTOK, c->V, seed);
}

/* The model's counts (n_layers x n_experts, checked against its info); malloc'ed. */
static uint64_t *counts_of(dsi_model *m, uint32_t *nl_out, uint32_t *ne_out) {
    dsi_model_info mi;
    dsi_model_info_init(&mi);
    assert_int_equal(dsi_model_get_info(m, &mi), DSI_OK);
    uint64_t need = 0;
    uint32_t nl = 0, ne = 0;
    assert_int_equal(dsi_model_expert_counts(m, NULL, 0, &need, &nl, &ne), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(nl, (uint32_t)mi.n_layers);
    assert_int_equal(ne, (uint32_t)mi.n_experts);
    assert_int_equal(need, (uint64_t)nl * ne);
    uint64_t *c = malloc(sizeof *c * (need + 1));
    assert_non_null(c);
    c[need] = 0xC0FFEEull;
    assert_int_equal(dsi_model_expert_counts(m, c, need, NULL, NULL, NULL), DSI_OK);
    assert_int_equal(c[need], 0xC0FFEEull); /* nothing written past n_layers x n_experts */
    *nl_out = nl;
    *ne_out = ne;
    return c;
}

/* All NTOK tokens one step each (every step one row): the logits. */
static float *run_single(dsi_model *m, const dsi_token *toks, int32_t V) {
    return run_steps(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT, 1, 0, NULL, NULL, 0, NULL);
}

/* Every layer routed each of `rows` rows to k distinct experts: row sums rows * k, entries at
 * most rows. */
static void check_count_sums(const uint64_t *c, uint32_t nl, uint32_t ne, uint64_t rows, uint32_t k) {
    for (uint32_t l = 0; l < nl; l++) {
        uint64_t sum = 0;
        for (uint32_t x = 0; x < ne; x++) {
            assert_true(c[(uint64_t)l * ne + x] <= rows);
            sum += c[(uint64_t)l * ne + x];
        }
        if (sum != rows * k) printf("# layer %u: %llu routed, expected %llu\n", l, (unsigned long long)sum,
                                    (unsigned long long)(rows * k));
        assert_int_equal(sum, rows * k);
    }
}

/* Routing counts on the CPU: zero after the load; after NTOK rows every layer's counts sum to
 * NTOK x k (each entry <= NTOK); a V4 hash layer's counts are exactly what its tid2eid table
 * gives for the tokens (read from the file here); a second run adds the same counts again; a
 * tiered (disk) placement counts the same (not twice); the two-call pattern and bad
 * arguments; a routing profile of the wrong size is refused, a right one changes nothing on
 * the CPU. */
static void expert_counts(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        tcase tc;
        tcase_open(&tc, path, 5u + (uint32_t)mi);
        dsi_context *ctx = tc.ctx;
        dsi_model *m = tc.m;
        const int32_t V = tc.V;
        const uint32_t k = tc.k;
        const dsi_token *toks = tc.toks;
        uint32_t nl = 0, ne = 0;
        uint64_t *c0 = counts_of(m, &nl, &ne);
        for (uint64_t i = 0; i < (uint64_t)nl * ne; i++) assert_int_equal(c0[i], 0);
        /* bad arguments */
        uint64_t need = 0, one = 7;
        assert_int_equal(dsi_model_expert_counts(NULL, c0, 1, &need, NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsi_model_expert_counts(m, NULL, 4, &need, NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsi_model_expert_counts(m, &one, 1, &need, NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
        assert_int_equal(one, 7); /* too small: nothing written */
        assert_int_equal(need, (uint64_t)nl * ne);
        printf("# %s\n", dsi_last_error());

        float *ref = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
        assert_non_null(ref);
        uint64_t *c1 = counts_of(m, &nl, &ne);
        check_count_sums(c1, nl, ne, NTOK, k);
        /* hash layers (V4): tid2eid [V][k] decides */
        uint32_t n_hash = 0;
        for (uint32_t l = 0; l < nl; l++) {
            if (!m->hp.layer[l].is_hash) continue;
            const dsii_tensor *t = m->w.layer[l].tid2eid;
            assert_non_null(t);
            assert_non_null(t->data);
            const int32_t *tab = t->data;
            uint64_t want[256] = {0};
            assert_true(ne <= 256);
            for (int i = 0; i < NTOK; i++)
                for (uint32_t j = 0; j < k; j++) want[tab[(size_t)toks[i] * k + j]]++;
            for (uint32_t x = 0; x < ne; x++) assert_int_equal(c1[(uint64_t)l * ne + x], want[x]);
            n_hash++;
        }
        printf("# %s: %u layers x %u experts, k %u; %u hash layers checked against tid2eid\n", path, nl, ne, k, n_hash);
        if (mi == 0) assert_true(n_hash > 0); /* tiny-v4 has hash layers */
        /* a second run: the same routing again */
        float *again = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
        assert_non_null(again);
        uint64_t *c2 = counts_of(m, &nl, &ne);
        for (uint64_t i = 0; i < (uint64_t)nl * ne; i++) assert_int_equal(c2[i], 2 * c1[i]);
        dsi_model_free(m);

        /* the disk tier (the CPU computes from its cache): the same counts, once */
        plan_facts f;
        facts_access(ctx, path, DSI_ACCESS_PREAD, &f);
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_EXPERTS_STREAMED;
        po.host_budget = budget_for(&f, 0.5, 2);
        m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
        assert_non_null(m);
        float *got = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
        assert_non_null(got);
        assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
        uint64_t *ct = counts_of(m, &nl, &ne);
        assert_memory_equal(ct, c1, sizeof *ct * nl * ne);
        dsi_model_free(m);
        free(got);

        /* the profile pre-loads the expert cache (every expert fits; no read-ahead): the
         * run that missed each routed expert once now misses none, the same uses hit, the
         * same logits */
        po.host_budget = (uint64_t)1 << 40;
        po.flags = DSI_PLACE_FLAG_NO_PREFETCH;
        dsi_place_info pa, pb;
        for (int withp = 0; withp < 2; withp++) {
            po.expert_counts = withp ? c1 : NULL;
            po.n_expert_counts = withp ? (uint64_t)nl * ne : 0;
            m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
            assert_non_null(m);
            got = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
            assert_non_null(got);
            assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
            info_of(m, withp ? &pb : &pa);
            dsi_model_free(m);
            free(got);
        }
        uint64_t used = 0;
        for (uint64_t i = 0; i < (uint64_t)nl * ne; i++) used += c1[i] > 0;
        printf("# %s: cache of %u slots, disk tier: without a profile %llu misses + %llu hits; pre-loaded from the "
               "profile %llu + %llu (%llu experts routed)\n",
               path, pb.expert_cache_slots, (unsigned long long)pa.cache_misses, (unsigned long long)pa.cache_hits,
               (unsigned long long)pb.cache_misses, (unsigned long long)pb.cache_hits, (unsigned long long)used);
        assert_int_equal(pa.cache_misses, used);
        assert_int_equal(pb.cache_misses, 0);
        assert_int_equal(pb.cache_hits, pa.cache_hits + pa.cache_misses);
        po.flags = 0;
        /* a routing profile: the wrong size is refused with a clear message; the right one
         * is taken (and changes nothing on the CPU) */
        dsi_status st;
        po.policy = DSI_PLACE_AUTO;
        po.host_budget = 0;
        po.expert_counts = c1;
        po.n_expert_counts = (uint64_t)nl * ne - 1;
        assert_null(load(ctx, path, DSI_ACCESS_MMAP, &po, &st));
        assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(dsi_last_error(), "n_expert_counts"));
        printf("# %s\n", dsi_last_error());
        po.expert_counts = NULL;
        po.n_expert_counts = (uint64_t)nl * ne;
        assert_null(load(ctx, path, DSI_ACCESS_MMAP, &po, &st));
        assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        po.expert_counts = c1;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        got = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
        assert_non_null(got);
        assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
        dsi_model_free(m);
        free(got);
        free(again);
        free(ref);
        free(c0);
        free(c1);
        free(c2);
        free(ct);
        dsi_context_free(ctx);
    }
}

static void bad_options(void **state) {
    (void)state;
    const char *path = g_models[0] ? g_models[0] : g_models[1];
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    plan_facts f;
    facts(ctx, path, &f);
    struct {
        uint32_t policy, cache, flags, struct_size;
        uint64_t host;
        const char *ovr;
        uint32_t model_flags;
        dsi_status want;
        const char *needle;
    } cases[] = {
        {9, 0, 0, 0, 0, NULL, 0, DSI_ERR_INVALID_ARGUMENT, "policy 9"},
        {0, 7, 0, 0, 0, NULL, 0, DSI_ERR_INVALID_ARGUMENT, "cache_policy 7"},
        {0, 0, 0x10, 0, 0, NULL, 0, DSI_ERR_INVALID_ARGUMENT, "unknown bits"},
        {0, 0, 0, 2, 0, NULL, 0, DSI_ERR_INVALID_ARGUMENT, "struct_size"},
        {0, 0, 0, 0, 0, "blk.*.attn_q_a.weight=disk", 0, DSI_ERR_INVALID_ARGUMENT, "attn_q_a"},
        {0, 0, 0, 0, 0, "blk.0.ffn_*", 0, DSI_ERR_INVALID_ARGUMENT, "PATTERN=TIER"},
        {0, 0, 0, 0, 0, "blk.0.ffn_*=ram", 0, DSI_ERR_INVALID_ARGUMENT, "'ram'"},
        {0, 0, 0, 0, 0, "blk.[0.ffn_*=disk", 0, DSI_ERR_INVALID_ARGUMENT, "unterminated"},
        {1, 0, 0, 0, 0, "blk.0.ffn_gate_exps.weight=disk", 0, DSI_ERR_INVALID_ARGUMENT, "share one tier"},
        {3, 0, 0, 0, 1000, NULL, 0, DSI_ERR_OUT_OF_HOST_MEMORY, "host budget"},
        {3, 0, 0, 0, 0, NULL, 0, DSI_ERR_OUT_OF_HOST_MEMORY, "at least"}, /* owned + 1 slot */
        {3, 0, 0, 0, 0, NULL, DSI_MODEL_FLAG_RESIDENT, DSI_ERR_INVALID_ARGUMENT, "RESIDENT"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = cases[c].policy;
        po.cache_policy = cases[c].cache;
        po.flags = cases[c].flags;
        if (cases[c].struct_size) po.struct_size = cases[c].struct_size;
        po.host_budget = cases[c].host;
        if (c == 10) po.host_budget = f.owned + f.unit; /* one slot short of k = 2 */
        po.overrides = cases[c].ovr;
        dsi_model_options mo;
        dsi_model_options_init(&mo);
        mo.access = DSI_ACCESS_PREAD;
        mo.flags = cases[c].model_flags;
        mo.place = &po;
        dsi_model *m = NULL;
        dsi_status st = dsi_model_load(ctx, path, &mo, &m);
        const char *msg = dsi_last_error();
        printf("# case %zu: %s: %s\n", c, dsi_status_string(st), msg);
        assert_int_equal(st, cases[c].want);
        assert_null(m);
        assert_non_null(strstr(msg, cases[c].needle));
    }
    dsi_context_free(ctx);
}

/* ---- 3. budget --------------------------------------------------------------------------------- */

typedef struct acct {
    pthread_mutex_t mu;
    uint64_t live, peak;
} acct_t;

/* Each block carries its size in a 64-byte header (keeps the library's alignment). */
static void *a_malloc(size_t n, void *ud) {
    acct_t *a = ud;
    uint8_t *p = malloc(n + 64);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    pthread_mutex_lock(&a->mu);
    a->live += n;
    if (a->live > a->peak) a->peak = a->live;
    pthread_mutex_unlock(&a->mu);
    return p + 64;
}
static void a_free(void *ptr, void *ud) {
    acct_t *a = ud;
    if (!ptr) return;
    uint8_t *p = (uint8_t *)ptr - 64;
    size_t n;
    memcpy(&n, p, sizeof n);
    pthread_mutex_lock(&a->mu);
    a->live -= n;
    pthread_mutex_unlock(&a->mu);
    free(p);
}
static void *a_realloc(void *ptr, size_t n, void *ud) {
    if (!ptr) return a_malloc(n, ud);
    uint8_t *q = a_malloc(n, ud);
    if (!q) return NULL;
    size_t old;
    memcpy(&old, (uint8_t *)ptr - 64, sizeof old);
    memcpy(q, ptr, old < n ? old : n);
    a_free(ptr, ud);
    return q;
}

static uint64_t peak_of(const char *path, int32_t access, const dsi_place_options *po, const dsi_token *toks,
                        float **logits, uint64_t *file_bytes) {
    acct_t a = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.malloc_fn = a_malloc;
    co.realloc_fn = a_realloc;
    co.free_fn = a_free;
    co.alloc_user_data = &a;
    dsi_context *ctx = new_ctx(&co);
    assert_non_null(ctx);
    dsi_model *m = load(ctx, path, access, po, NULL);
    assert_non_null(m);
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(m, &info);
    if (file_bytes) *file_bytes = info.weight_bytes;
    *logits = run(m, toks, info.n_vocab);
    assert_non_null(*logits);
    dsi_model_free(m);
    dsi_context_free(ctx);
    return a.peak;
}

static void budget(void **state) {
    (void)state;
    int absent = 0;
    const char *path = mt_mkmodel("tiny-moe", "q8_0", "tiny-moe-q8_0.gguf", &absent);
    if (!path) {
        if (absent) DSIT_SKIP_TEST("MODELS", "no dsinfer-mkmodel for tiny-moe");
        fail_msg("dsinfer-mkmodel failed for tiny-moe");
    }
    dsi_token toks[NTOK];
    mt_tokens(toks, NTOK, 1024, 99u);
    float *ref = NULL, *got = NULL;
    uint64_t file_bytes = 0;
    /* the whole model resident in owned memory (pread): its peak minus its owned weights is
     * what the context, the model's tables and the session cost at the peak */
    dsi_place_options pa;
    dsi_place_options_init(&pa);
    pa.policy = DSI_PLACE_ALL_RESIDENT;
    pa.host_budget = (uint64_t)1 << 40;
    uint64_t peak_all = peak_of(path, DSI_ACCESS_PREAD, &pa, toks, &ref, &file_bytes);
    dsi_context *ctx = new_ctx(NULL);
    plan_facts f;
    facts(ctx, path, &f);
    dsi_model *m = load(ctx, path, DSI_ACCESS_PREAD, &pa, NULL);
    assert_non_null(m);
    dsi_place_info pi;
    info_of(m, &pi);
    uint64_t owned_all = pi.host_bytes;
    dsi_model_free(m);
    dsi_context_free(ctx);
    assert_true(peak_all > owned_all);
    uint64_t base = peak_all - owned_all;
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_AUTO; /* the budget forces streaming */
    po.host_budget = f.owned + 8 * f.unit;
    uint64_t peak = peak_of(path, DSI_ACCESS_PREAD, &po, toks, &got, NULL);
    printf("# tiny-moe: weights %llu bytes, host budget %llu (%.1fx smaller), peak %llu, other allocations %llu "
           "(all resident: peak %llu, owned weights %llu)\n",
           (unsigned long long)file_bytes, (unsigned long long)po.host_budget,
           (double)file_bytes / (double)po.host_budget, (unsigned long long)peak, (unsigned long long)base,
           (unsigned long long)peak_all, (unsigned long long)owned_all);
    assert_true(file_bytes >= 3 * po.host_budget);
    assert_true(peak <= po.host_budget + base);
    assert_true(peak_all > po.host_budget + base); /* the bound can fail */
    assert_memory_equal(got, ref, sizeof(float) * NTOK * 1024);
    free(got);
    free(ref);
}

/* ---- 4. faults, 5. cancel ----------------------------------------------------------------------- */

typedef struct mem_reader {
    uint8_t *data;
    uint64_t size;
    atomic_int fail, slow;
    atomic_int calls;
    /* 7. overlap: with `gate` set, a read waits until the step has started (its layer 0 was
     * reached, g_gate.started) or 1 s, then sleeps `late_us` and fails if `fail_late` */
    atomic_int gate, late_us, fail_late;
    atomic_int released, timeouts;
    /* 7b. adaptive overlap: with `track` set, reads on thread `step_th` (the one calling the
     * API: a gather on the step thread) and on any other (the overlap helper) are counted */
    atomic_int track, on_step, off_step;
    pthread_t step_th;
} mem_reader;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started;
} g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void gate_probe(uint32_t layer) {
    if (layer != 0) return;
    pthread_mutex_lock(&g_gate.mu);
    g_gate.started = 1;
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
}

static void gate_reset(void) {
    pthread_mutex_lock(&g_gate.mu);
    g_gate.started = 0;
    pthread_mutex_unlock(&g_gate.mu);
}

static void gate_wait(mem_reader *r) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 1;
    pthread_mutex_lock(&g_gate.mu);
    int rc = 0;
    while (!g_gate.started && rc == 0) rc = pthread_cond_timedwait(&g_gate.cv, &g_gate.mu, &dl);
    if (g_gate.started) {
        atomic_fetch_add(&r->released, 1);
    } else {
        /* read before the step started: the gathers were not overlapped; stop gating */
        atomic_fetch_add(&r->timeouts, 1);
        atomic_store(&r->gate, 0);
    }
    pthread_mutex_unlock(&g_gate.mu);
    int us = atomic_load(&r->late_us);
    if (us > 0) {
        struct timespec ts = {0, (long)us * 1000};
        nanosleep(&ts, NULL);
    }
}

static int32_t mr_pread(void *ud, void *buf, uint64_t size, uint64_t off) {
    mem_reader *r = ud;
    atomic_fetch_add(&r->calls, 1);
    if (atomic_load(&r->track)) atomic_fetch_add(pthread_equal(pthread_self(), r->step_th) ? &r->on_step : &r->off_step, 1);
    if (atomic_load(&r->gate)) {
        gate_wait(r);
        if (atomic_load(&r->fail_late)) return -1;
    }
    if (atomic_load(&r->slow)) { /* 1: 20 ms; more: that many ms */
        const int ms = atomic_load(&r->slow) > 1 ? atomic_load(&r->slow) : 20;
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (atomic_load(&r->fail)) return -1;
    memcpy(buf, r->data + off, size);
    return 0;
}

static uint8_t *slurp(const char *path, uint64_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)n);
    if (d && fread(d, 1, (size_t)n, fp) != (size_t)n) {
        free(d);
        d = NULL;
    }
    fclose(fp);
    *size = (uint64_t)n;
    return d;
}

static dsi_model *load_reader(dsi_context *ctx, mem_reader *r, const dsi_place_options *po) {
    dsi_reader rd;
    dsi_reader_init(&rd);
    rd.size = r->size;
    rd.pread_fn = mr_pread;
    rd.user_data = r;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.place = po;
    dsi_model *m = NULL;
    if (dsi_model_load_from_reader(ctx, &rd, &mo, &m) != DSI_OK) printf("# reader load: %s\n", dsi_last_error());
    return m;
}

static void faults(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        plan_facts f;
        facts(ctx, path, &f);
        dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
        assert_non_null(m);
        int32_t V = n_vocab(m);
        dsi_token toks[NTOK];
        mt_tokens(toks, NTOK, V, 777u);
        float *ref = run(m, toks, V);
        assert_non_null(ref);
        dsi_model_free(m);
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_EXPERTS_STREAMED;
        po.flags = DSI_PLACE_FLAG_NO_PREFETCH;
        po.host_budget = budget_for(&f, 0.0, 2);
        const float *lg = NULL;
        /* (a) read error through a reader */
        mem_reader r;
        memset(&r, 0, sizeof r);
        r.data = slurp(path, &r.size);
        assert_non_null(r.data);
        m = load_reader(ctx, &r, &po);
        assert_non_null(m);
        dsi_session *s = mt_session(m, NCTX, 8, 0);
        assert_non_null(s);
        assert_int_equal(dsi_session_append(s, toks, 8), DSI_OK);
        atomic_store(&r.fail, 1);
        dsi_status st = dsi_session_append(s, toks + 8, 1);
        printf("# read error: %s: %s\n", dsi_status_string(st), dsi_session_last_error(s));
        assert_int_equal(st, DSI_ERR_IO);
        /* V4.1: its Engram rows are read through the same reader first */
        assert_non_null(strstr(dsi_session_last_error(s), mi == 0 ? "expert" : "engram gather: row"));
        assert_int_equal(pos_of(s), 8);
        atomic_store(&r.fail, 0);
        assert_int_equal(dsi_session_append(s, toks + 8, 1), DSI_OK);
        int32_t nl = 0;
        assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
        assert_memory_equal(lg, ref + (size_t)8 * (size_t)V, sizeof(float) * (size_t)V);
        dsi_session_free(s);
        dsi_model_free(m);
        /* (b) truncated file (pread) */
        char tmp[] = "/tmp/dsi-place-XXXXXX";
        int fd = mkstemp(tmp);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, r.data, (size_t)r.size), (ssize_t)r.size);
        m = load(ctx, tmp, DSI_ACCESS_PREAD, &po, NULL);
        assert_non_null(m);
        s = mt_session(m, NCTX, 8, 0);
        assert_non_null(s);
        assert_int_equal(dsi_session_append(s, toks, 8), DSI_OK);
        assert_int_equal(ftruncate(fd, 4096), 0);
        st = dsi_session_append(s, toks + 8, 1);
        printf("# truncated: %s: %s\n", dsi_status_string(st), dsi_session_last_error(s));
        assert_int_equal(st, DSI_ERR_IO);
        if (mi == 1) assert_non_null(strstr(dsi_session_last_error(s), "engram gather: row"));
        assert_int_equal(pos_of(s), 8);
        assert_int_equal(pwrite(fd, r.data, (size_t)r.size, 0), (ssize_t)r.size);
        assert_int_equal(dsi_session_append(s, toks + 8, 1), DSI_OK);
        assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
        assert_memory_equal(lg, ref + (size_t)8 * (size_t)V, sizeof(float) * (size_t)V);
        dsi_session_free(s);
        dsi_model_free(m);
        close(fd);
        unlink(tmp);
        free(r.data);
        free(ref);
        dsi_context_free(ctx);
    }
}

/* A test's reference: `path` all resident (mapped) on the context's device; toks[NTOK] from
 * `seed`; the logits of run_flags(flags). *V: the vocabulary. */
static float *reference(dsi_context *ctx, const char *path, uint32_t seed, uint32_t flags, dsi_token *toks,
                        int32_t *V) {
    dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
    assert_non_null(m);
    *V = n_vocab(m);
    mt_tokens(toks, NTOK, *V, seed);
    float *ref = run_flags(m, toks, *V, flags);
    assert_non_null(ref);
    dsi_model_free(m);
    return ref;
}

/* ---- 4b. O_DIRECT reads of the disk tier -------------------------------------------------
 * DSI_PLACE_FLAG_DIRECT_IO: the expert tier reads through aligned staging pieces with O_DIRECT
 * (no page cache): logits bit-identical to the resident run at 10 % and 0 % cached; a file
 * truncated under a session fails the step with IO, keeps the position, and after the repair
 * the same append gives the reference logits; mmap access is refused. Skips only where the
 * file system of the models refuses O_DIRECT. */
static void direct_io(void **state) {
    (void)state;
    const char *p0 = g_models[0] ? g_models[0] : g_models[1];
#if defined(O_DIRECT)
    int probe = open(p0, O_RDONLY | O_DIRECT);
    if (probe < 0) DSIT_SKIP_TEST("O_DIRECT", "the file system of %s refuses O_DIRECT: %s", p0, strerror(errno));
    close(probe);
#else
    DSIT_SKIP_TEST("O_DIRECT", "no O_DIRECT on this system");
#endif
    const uint64_t bounce = 4 * ((1u << 20) + 2 * 4096u); /* the tier's aligned staging pieces */
    for (int mi = 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        int32_t V = 0;
        dsi_token toks[NTOK];
        float *ref = reference(ctx, path, 555u + (uint32_t)mi, 0, toks, &V);
        dsi_model *m = NULL;
        plan_facts f;
        facts(ctx, path, &f);
        const double fr[2] = {0.1, 0.0};
        for (int c = 0; c < 2; c++) {
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = DSI_PLACE_EXPERTS_STREAMED;
            po.flags = DSI_PLACE_FLAG_DIRECT_IO | (c ? DSI_PLACE_FLAG_NO_PREFETCH : 0u);
            po.host_budget = budget_for(&f, fr[c], 2) + bounce;
            m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
            assert_non_null(m);
            float *got = run(m, toks, V);
            assert_non_null(got);
            dsi_place_info pi;
            info_of(m, &pi);
            printf("# %s: O_DIRECT, %.0f %% cached (%u slots): read %llu bytes, hits %llu misses %llu, host peak %llu "
                   "of %llu\n",
                   path, fr[c] * 100, pi.expert_cache_slots, (unsigned long long)pi.bytes_read,
                   (unsigned long long)pi.cache_hits, (unsigned long long)pi.cache_misses,
                   (unsigned long long)pi.host_peak, (unsigned long long)po.host_budget);
            assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
            assert_true(pi.bytes_read > 0);
            assert_true(pi.host_peak <= po.host_budget);
            uint64_t want = (uint64_t)(fr[c] * f.n_streamed);
            assert_int_equal(pi.expert_cache_slots, want < 2 ? 2 : want);
            free(got);
            dsi_model_free(m);
        }
        /* mmap access: refused */
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_EXPERTS_STREAMED;
        po.flags = DSI_PLACE_FLAG_DIRECT_IO;
        dsi_status st;
        assert_null(load(ctx, path, DSI_ACCESS_MMAP, &po, &st));
        assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(dsi_last_error(), "DSI_PLACE_FLAG_DIRECT_IO"));
        /* a file truncated under the session (a copy beside the model: the same file system) */
        uint64_t size = 0;
        uint8_t *data = slurp(path, &size);
        assert_non_null(data);
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.direct-XXXXXX", path);
        int fd = mkstemp(tmp);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, data, (size_t)size), (ssize_t)size);
        fsync(fd);
        po.host_budget = budget_for(&f, 0.0, 2) + bounce;
        po.flags = DSI_PLACE_FLAG_DIRECT_IO | DSI_PLACE_FLAG_NO_PREFETCH;
        m = load(ctx, tmp, DSI_ACCESS_PREAD, &po, NULL);
        assert_non_null(m);
        dsi_session *s = mt_session(m, NCTX, 8, 0);
        assert_non_null(s);
        assert_int_equal(dsi_session_append(s, toks, 8), DSI_OK);
        assert_int_equal(ftruncate(fd, 4096), 0);
        st = dsi_session_append(s, toks + 8, 1);
        printf("# O_DIRECT, truncated: %s: %s\n", dsi_status_string(st), dsi_session_last_error(s));
        assert_int_equal(st, DSI_ERR_IO);
        assert_int_equal(pos_of(s), 8);
        assert_int_equal(pwrite(fd, data, (size_t)size, 0), (ssize_t)size);
        fsync(fd);
        assert_int_equal(dsi_session_append(s, toks + 8, 1), DSI_OK);
        const float *lg = NULL;
        int32_t nl = 0;
        assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
        assert_memory_equal(lg, ref + (size_t)8 * (size_t)V, sizeof(float) * (size_t)V);
        dsi_session_free(s);
        dsi_model_free(m);
        close(fd);
        unlink(tmp);
        free(data);
        free(ref);
        dsi_context_free(ctx);
    }
}

typedef struct canceller {
    dsi_session *s;
    double at;
} canceller;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *cancel_main(void *arg) {
    canceller *c = arg;
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    c->at = now_s();
    dsi_session_cancel(c->s);
    return NULL;
}

static void cancel(void **state) {
    (void)state;
    const char *path = g_models[0] ? g_models[0] : g_models[1];
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    plan_facts f;
    facts(ctx, path, &f);
    mem_reader r;
    memset(&r, 0, sizeof r);
    r.data = slurp(path, &r.size);
    assert_non_null(r.data);
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_EXPERTS_STREAMED;
    po.flags = DSI_PLACE_FLAG_NO_PREFETCH;
    po.host_budget = budget_for(&f, 0.0, 2);
    dsi_model *m = load_reader(ctx, &r, &po);
    assert_non_null(m);
    int32_t V = n_vocab(m);
    dsi_token toks[16];
    mt_tokens(toks, 16, V, 4242u);
    dsi_session *s = mt_session(m, NCTX, 16, 0);
    assert_non_null(s);
    /* one step of 16 rows with 2 slots: >= 16 x layers x 3 slow reads (20 ms each), i.e.
     * seconds; the cancel comes after 200 ms */
    atomic_store(&r.slow, 1);
    atomic_store(&r.calls, 0);
    canceller c = {s, 0.0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cancel_main, &c), 0);
    dsi_status st = dsi_session_append(s, toks, 16);
    double done = now_s();
    pthread_join(th, NULL);
    int calls = atomic_load(&r.calls);
    printf("# cancel: %s after %d slow reads, %.3f s after the request\n", dsi_status_string(st), calls,
           done - c.at);
    assert_int_equal(st, DSI_ERR_CANCELLED);
    assert_int_equal(pos_of(s), 0);
    /* at most the read in flight (20 ms) and one chunk's compute after the request */
    assert_true(done - c.at < 1.0);
    atomic_store(&r.slow, 0);
    assert_int_equal(dsi_session_append(s, toks, 16), DSI_OK);
    const float *lg = NULL;
    int32_t nl = 0;
    assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
    float *got = malloc(sizeof(float) * (size_t)V);
    assert_non_null(got);
    memcpy(got, lg, sizeof(float) * (size_t)V);
    dsi_session_free(s);
    dsi_model_free(m);
    /* reference: resident */
    m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
    assert_non_null(m);
    s = mt_session(m, NCTX, 16, 0);
    assert_non_null(s);
    assert_int_equal(dsi_session_append(s, toks, 16), DSI_OK);
    const float *rl = NULL;
    assert_int_equal(dsi_session_logits(s, &rl, &nl), DSI_OK);
    assert_memory_equal(got, rl, sizeof(float) * (size_t)V);
    free(got);
    dsi_session_free(s);
    dsi_model_free(m);
    free(r.data);
    dsi_context_free(ctx);
}

/* ---- 6. several sessions on threads share one cache ------------------------------------------ */

typedef struct tjob {
    dsi_model *m;
    const dsi_token *toks;
    int32_t V;
    float *out;
} tjob;

static void *tjob_main(void *arg) {
    tjob *j = arg;
    j->out = run(j->m, j->toks, j->V);
    return NULL;
}

static void threads(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        plan_facts f;
        facts(ctx, path, &f);
        dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
        assert_non_null(m);
        int32_t V = n_vocab(m);
        enum { NT = 4 };
        dsi_token toks[NT][NTOK];
        float *ref[NT];
        for (int t = 0; t < NT; t++) {
            mt_tokens(toks[t], NTOK, V, 31u * (uint32_t)t + 5u);
            ref[t] = run(m, toks[t], V);
            assert_non_null(ref[t]);
        }
        dsi_model_free(m);
        /* k slots for 4 concurrent sessions (they wait for each other's slots), and 10 % */
        const double fr[2] = {0.0, 0.1};
        for (int c = 0; c < 2; c++) {
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = DSI_PLACE_EXPERTS_STREAMED;
            po.host_budget = budget_for(&f, fr[c], 2);
            po.cache_policy = c ? DSI_CACHE_LFU : DSI_CACHE_LRU;
            m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
            assert_non_null(m);
            pthread_t th[NT];
            tjob jobs[NT];
            for (int t = 0; t < NT; t++) {
                jobs[t] = (tjob){m, toks[t], V, NULL};
                assert_int_equal(pthread_create(&th[t], NULL, tjob_main, &jobs[t]), 0);
            }
            for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
            for (int t = 0; t < NT; t++) {
                assert_non_null(jobs[t].out);
                assert_memory_equal(jobs[t].out, ref[t], sizeof(float) * NTOK * (size_t)V);
                free(jobs[t].out);
            }
            dsi_model_free(m);
        }
        for (int t = 0; t < NT; t++) free(ref[t]);
        dsi_context_free(ctx);
    }
}

/* ---- 7.–9. hybrid steps (argv[1] = vulkan) ---------------------------------------------- */

/* Facts of a GPU plan with an unlimited device budget, hybrid UPLOAD: the resident weights on
 * the device, the slot size, the tiered experts (every one fits: slots = experts). */
typedef struct gpu_facts {
    uint64_t dev_resident, unit;
    uint32_t n_tiered;
} gpu_facts;

static void gpu_facts_of(dsi_context *ctx, const char *path, uint32_t policy, int32_t access, gpu_facts *g) {
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = policy;
    po.hybrid = DSI_HYBRID_UPLOAD;
    po.device_budget = (uint64_t)1 << 40;
    po.host_budget = (uint64_t)1 << 40;
    po.flags = DSI_PLACE_FLAG_NO_PREFETCH;
    dsi_model *m = load(ctx, path, access, &po, NULL);
    assert_non_null(m);
    dsi_place_info pi;
    info_of(m, &pi);
    assert_int_equal(pi.policy, policy);
    assert_int_equal(pi.hybrid, DSI_HYBRID_UPLOAD);
    assert_int_equal(pi.expert_cache_tier, DSI_TIER_DEVICE);
    assert_true(pi.expert_cache_slots > 0);
    g->dev_resident = pi.device_bytes;
    g->unit = pi.expert_cache_bytes / pi.expert_cache_slots;
    g->n_tiered = pi.expert_cache_slots;
    /* the plan counts every resident tensor on the device; some are used on the host only
     * (Engram tables: rows are gathered there), so the device holds at most that */
    assert_true(pi.device_weight_bytes <= g->dev_resident + pi.expert_cache_bytes);
    assert_true(pi.device_weight_bytes > pi.expert_cache_bytes);
    dsi_model_free(m);
}

static uint64_t dev_budget_for(const gpu_facts *g, double frac, uint32_t k, uint32_t *slots) {
    uint64_t n = (uint64_t)(frac * g->n_tiered);
    if (n < k) n = k;
    *slots = (uint32_t)n;
    return g->dev_resident + n * g->unit;
}

/* Under the Vulkan validation layer (many times slower on lavapipe; that run is about layer
 * errors, the full comparisons run without it): tiny-v4 only, fewer placements. */
static int quick(void) { return dsit_vk_validation_requested(); }

static void hybrid_upload(void **state) {
    (void)state;
    for (int mi = 0; mi < (quick() ? 1 : 2); mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        int32_t V = 0;
        dsi_token toks[NTOK];
        float *ref = reference(ctx, path, 777u + (uint32_t)mi, 0, toks, &V);
        dsi_model *m = NULL;

        struct {
            uint32_t policy;
            int32_t access;
            double frac;
            uint32_t cache, flags;
        } cases[] = {
            {DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, 1.0, DSI_CACHE_LRU, DSI_PLACE_FLAG_NO_PREFETCH},
            {DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, 0.5, DSI_CACHE_LRU, 0},
            {DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, 0.1, DSI_CACHE_LFU, 0},
            {DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, 0.0, DSI_CACHE_LRU, DSI_PLACE_FLAG_NO_PREFETCH},
            {DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_MMAP, 0.1, DSI_CACHE_LRU, 0},
            {DSI_PLACE_EXPERTS_HOST, DSI_ACCESS_MMAP, 0.1, DSI_CACHE_LRU, 0},
            {DSI_PLACE_EXPERTS_HOST, DSI_ACCESS_PREAD, 0.0, DSI_CACHE_LFU, DSI_PLACE_FLAG_NO_PREFETCH},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (quick() && c != 2 && c != 5) continue;
            gpu_facts gf;
            const gpu_facts *g = &gf;
            gpu_facts_of(ctx, path, cases[c].policy, cases[c].access, &gf);
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = cases[c].policy;
            po.hybrid = DSI_HYBRID_UPLOAD;
            po.cache_policy = cases[c].cache;
            po.flags = cases[c].flags;
            po.host_budget = (uint64_t)1 << 40;
            uint32_t slots = 0;
            po.device_budget = dev_budget_for(g, cases[c].frac, 2, &slots);
            m = load(ctx, path, cases[c].access, &po, NULL);
            assert_non_null(m);
            float *got = run(m, toks, V);
            assert_non_null(got);
            dsi_place_info pi;
            info_of(m, &pi);
            printf("# %s: upload, %s %s, %.0f %% cached (%u slots): hits %llu misses %llu prefetches %llu, "
                   "read %llu, uploaded %llu bytes, %llu device experts; device weights %llu of budget %llu\n",
                   path, cases[c].policy == DSI_PLACE_EXPERTS_HOST ? "host" : "disk",
                   cases[c].access == DSI_ACCESS_MMAP ? "mmap" : "pread", cases[c].frac * 100,
                   pi.expert_cache_slots, (unsigned long long)pi.cache_hits, (unsigned long long)pi.cache_misses,
                   (unsigned long long)pi.prefetches, (unsigned long long)pi.bytes_read,
                   (unsigned long long)pi.bytes_uploaded, (unsigned long long)pi.device_experts,
                   (unsigned long long)pi.device_weight_bytes, (unsigned long long)po.device_budget);
            assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
            assert_int_equal(pi.hybrid, DSI_HYBRID_UPLOAD);
            assert_int_equal(pi.expert_cache_tier, DSI_TIER_DEVICE);
            assert_int_equal(pi.expert_cache_slots, slots);
            assert_true(pi.device_weight_bytes <= po.device_budget);
            assert_true(pi.device_experts > 0);
            assert_int_equal(pi.cpu_experts, 0);
            assert_true(pi.bytes_uploaded > 0);
            assert_true(pi.cache_hits + pi.cache_misses > 0);
            if (cases[c].policy == DSI_PLACE_EXPERTS_HOST) assert_int_equal(pi.bytes_read, 0);
            else assert_true(pi.bytes_read > 0);
            if (cases[c].frac == 1.0) assert_true(pi.cache_misses <= slots); /* first uses only */
            free(got);
            dsi_model_free(m);
        }
        free(ref);
        dsi_context_free(ctx);
    }
    /* a model several times larger than the device budget: tiny-moe, experts ~85 % */
    int absent = 0;
    const char *mp = mt_mkmodel("tiny-moe", "q8_0", "tiny-moe-q8_0.gguf", &absent);
    if (!mp) {
        if (absent) DSIT_SKIP_TEST("MODELS", "no dsinfer-mkmodel for tiny-moe");
        fail_msg("dsinfer-mkmodel failed for tiny-moe");
    }
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    dsi_place_options pr;
    dsi_place_options_init(&pr);
    pr.policy = DSI_PLACE_ALL_RESIDENT;
    dsi_model *m = load(ctx, mp, DSI_ACCESS_MMAP, &pr, NULL);
    assert_non_null(m);
    dsi_token toks[NTOK];
    mt_tokens(toks, NTOK, 1024, 99u);
    float *ref = run(m, toks, 1024);
    assert_non_null(ref);
    dsi_place_info pi;
    info_of(m, &pi);
    uint64_t all_dev = pi.device_weight_bytes;
    dsi_model_free(m);
    gpu_facts g;
    gpu_facts_of(ctx, mp, DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, &g);
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_AUTO; /* AUTO next to a GPU: experts leave the device when they must */
    po.hybrid = DSI_HYBRID_UPLOAD;
    uint32_t slots = 0;
    po.device_budget = dev_budget_for(&g, 0.1, 2, &slots);
    m = load(ctx, mp, DSI_ACCESS_PREAD, &po, NULL);
    assert_non_null(m);
    float *got = run(m, toks, 1024);
    assert_non_null(got);
    info_of(m, &pi);
    printf("# tiny-moe: all resident %llu device bytes; budget %llu (%.1fx smaller): policy %u, device weights %llu, "
           "device in use %llu (+ the model's state pool and step buffers), %u slots, uploaded %llu bytes\n",
           (unsigned long long)all_dev, (unsigned long long)po.device_budget, (double)all_dev / (double)po.device_budget,
           pi.policy, (unsigned long long)pi.device_weight_bytes, (unsigned long long)pi.device_used,
           pi.expert_cache_slots, (unsigned long long)pi.bytes_uploaded);
    assert_memory_equal(got, ref, sizeof(float) * NTOK * 1024);
    assert_true(all_dev >= 3 * po.device_budget);
    assert_int_equal(pi.policy, DSI_PLACE_EXPERTS_HOST);
    assert_true(pi.device_weight_bytes <= po.device_budget);
    free(got);
    free(ref);
    dsi_model_free(m);
    dsi_context_free(ctx);
}

static void max_diff(const float *a, const float *b, size_t n_pos, int32_t V, double *md, size_t *argmax_diff) {
    *md = 0;
    *argmax_diff = 0;
    for (size_t p = 0; p < n_pos; p++) {
        const float *x = a + p * (size_t)V, *y = b + p * (size_t)V;
        int32_t ax = 0, ay = 0;
        for (int32_t i = 0; i < V; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            if (!(d <= *md)) *md = d;
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        *argmax_diff += ax != ay;
    }
}

static void hybrid_cpu(void **state) {
    (void)state;
    for (int mi = 0; mi < (quick() ? 1 : 2); mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        int32_t V = 0;
        dsi_token toks[NTOK];
        float *ref = reference(ctx, path, 4242u + (uint32_t)mi, DSI_SESSION_FLAG_NO_FAKE_QUANT, toks, &V);
        dsi_model *m = NULL;
        plan_facts f;
        facts_access(ctx, path, DSI_ACCESS_PREAD, &f);
        struct {
            uint32_t policy;
            int32_t access;
            const char *ovr;
        } cases[] = {
            {DSI_PLACE_EXPERTS_HOST, DSI_ACCESS_MMAP, NULL},
            {DSI_PLACE_EXPERTS_HOST, DSI_ACCESS_PREAD, NULL},
            {DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, NULL},
            {DSI_PLACE_ALL_RESIDENT, DSI_ACCESS_PREAD, "blk.[12].ffn_*_exps.weight=host"},
        };
        float *first = NULL;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (quick() && c != 0 && c != 2) continue;
            /* rounding on too for the first case (and where a test of the CPU run's rounding
             * path would differ: nowhere else) */
            for (int rounding = 0; rounding < (c == 0 ? 2 : 1); rounding++) {
                dsi_place_options po;
                dsi_place_options_init(&po);
                po.policy = cases[c].policy;
                po.hybrid = DSI_HYBRID_CPU;
                po.overrides = cases[c].ovr;
                po.host_budget = cases[c].policy == DSI_PLACE_EXPERTS_STREAMED ? budget_for(&f, 0.1, 2)
                                                                              : (uint64_t)1 << 40;
                m = load(ctx, path, cases[c].access, &po, NULL);
                assert_non_null(m);
                float *got = run_flags(m, toks, V, rounding ? 0 : DSI_SESSION_FLAG_NO_FAKE_QUANT);
                assert_non_null(got);
                dsi_place_info pi;
                info_of(m, &pi);
                double md = 0;
                size_t ad = 0;
                if (!rounding) max_diff(got, ref, NTOK, V, &md, &ad);
                printf("# %s: cpu, %s %s%s%s, rounding %s: %llu cpu experts, %llu device experts, hits %llu misses "
                       "%llu, uploaded %llu%s",
                       path, cases[c].policy == DSI_PLACE_EXPERTS_HOST ? "host" : cases[c].ovr ? "override" : "disk",
                       cases[c].access == DSI_ACCESS_MMAP ? "mmap" : "pread", cases[c].ovr ? " " : "",
                       cases[c].ovr ? cases[c].ovr : "", rounding ? "on" : "off", (unsigned long long)pi.cpu_experts,
                       (unsigned long long)pi.device_experts, (unsigned long long)pi.cache_hits,
                       (unsigned long long)pi.cache_misses, (unsigned long long)pi.bytes_uploaded,
                       rounding ? "\n" : "");
                if (!rounding) printf("; vs all on vulkan: max |dlogit| %.3e, argmax differs at %zu\n", md, ad);
                assert_int_equal(pi.hybrid, DSI_HYBRID_CPU);
                assert_true(pi.cpu_experts > 0);
                assert_int_equal(pi.device_experts, 0);
                assert_int_equal(pi.bytes_uploaded, 0);
                if (!rounding) {
                    assert_int_equal(ad, 0);
                    assert_true(md <= 2e-3);
                }
                if (cases[c].ovr) {
                    /* a mixed plan: other layers' experts on the GPU, so not the bytes of the
                     * all-CPU placements; its own bound holds (above) */
                    assert_int_equal(pi.classes[3].tier, DSI_TIER_DEVICE);
                    assert_true(pi.classes[3].host_bytes > 0);
                    free(got);
                } else if (rounding == 0 && c == 0) {
                    first = got;
                } else if (rounding == 0) {
                    /* the same CPU kernels on the same bytes: identical across tiers */
                    assert_memory_equal(got, first, sizeof(float) * NTOK * (size_t)V);
                    free(got);
                } else {
                    free(got);
                }
                dsi_model_free(m);
            }
        }
        free(first);
        free(ref);
        dsi_context_free(ctx);
    }
}

static void hybrid_split(void **state) {
    (void)state;
    for (int mi = 0; mi < (quick() ? 1 : 2); mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        dsi_context *ctx = new_ctx(NULL);
        assert_non_null(ctx);
        dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
        assert_non_null(m);
        int32_t V = n_vocab(m);
        dsi_model_info mi_;
        dsi_model_info_init(&mi_);
        assert_int_equal(dsi_model_get_info(m, &mi_), DSI_OK);
        const uint32_t E = (uint32_t)mi_.n_experts;
        assert_true(E >= 4);
        dsi_token toks[NTOK];
        mt_tokens(toks, NTOK, V, 99u + (uint32_t)mi);
        float *ref = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
        assert_non_null(ref);
        dsi_model_free(m);
        plan_facts f;
        facts_access(ctx, path, DSI_ACCESS_PREAD, &f);
        float *got[2] = {NULL, NULL};
        for (int c = 0; c < 2; c++) {
            dsi_place_options po;
            dsi_place_options_init(&po);
            po.policy = c == 0 ? DSI_PLACE_EXPERTS_HOST : DSI_PLACE_EXPERTS_STREAMED;
            po.hybrid = DSI_HYBRID_CPU;
            po.device_experts = E / 2;
            po.host_budget = c == 0 ? (uint64_t)1 << 40 : budget_for(&f, 0.1, 2);
            m = load(ctx, path, c == 0 ? DSI_ACCESS_MMAP : DSI_ACCESS_PREAD, &po, NULL);
            assert_non_null(m);
            got[c] = run_flags(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT);
            assert_non_null(got[c]);
            dsi_place_info pi;
            info_of(m, &pi);
            double md = 0;
            size_t ad = 0;
            max_diff(got[c], ref, NTOK, V, &md, &ad);
            printf("# %s: split, %s, experts 0..%u of %u on the GPU: %llu device + %llu cpu experts; cpu %.1f ms, then "
                   "waiting for the GPU %.1f ms; vs all on vulkan: max |dlogit| %.3e, argmax differs at %zu\n",
                   path, c == 0 ? "host mmap" : "disk pread 10 %", pi.device_experts_per_layer - 1, E,
                   (unsigned long long)pi.device_experts, (unsigned long long)pi.cpu_experts,
                   pi.overlap_cpu_ns / 1e6, pi.overlap_wait_ns / 1e6, md, ad);
            assert_int_equal(pi.device_experts_per_layer, E / 2);
            assert_true(pi.device_experts > 0);
            assert_true(pi.cpu_experts > 0);
            assert_true(pi.overlap_cpu_ns > 0);
            assert_int_equal(ad, 0);
            assert_true(md <= 2e-3);
            if (c == 0) {
                /* chunks of 3 instead of 7: the same bytes */
                float *g3 = run_batch(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT, 3);
                assert_non_null(g3);
                assert_memory_equal(g3, got[0], sizeof(float) * NTOK * (size_t)V);
                free(g3);
            }
            dsi_model_free(m);
        }
        /* host and disk tiers: the same kernels on the same bytes on each side */
        assert_memory_equal(got[0], got[1], sizeof(float) * NTOK * (size_t)V);
        /* AUTO: as many per layer as the budget leaves (E/4 here) */
        gpu_facts g;
        gpu_facts_of(ctx, path, DSI_PLACE_EXPERTS_HOST, DSI_ACCESS_PREAD, &g);
        const uint32_t n_layers = g.n_tiered / E;
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_EXPERTS_HOST;
        po.hybrid = DSI_HYBRID_CPU;
        po.device_experts = DSI_DEVICE_EXPERTS_AUTO;
        po.device_budget = g.dev_resident + (uint64_t)(E / 4) * n_layers * g.unit;
        m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
        assert_non_null(m);
        dsi_place_info pi;
        info_of(m, &pi);
        assert_int_equal(pi.device_experts_per_layer, E / 4);
        assert_true(pi.device_weight_bytes <= po.device_budget);
        dsi_model_free(m);
        /* more than the budget holds */
        po.device_experts = E / 2;
        dsi_status st;
        assert_null(load(ctx, path, DSI_ACCESS_PREAD, &po, &st));
        assert_int_equal(st, DSI_ERR_OUT_OF_DEVICE_MEMORY);
        printf("# %s\n", dsi_last_error());
        free(got[0]);
        free(got[1]);
        free(ref);
        dsi_context_free(ctx);
    }
}

/* The m most often routed experts of a row of E counts (ties: the lower id): sel[x] = 1. The
 * test's own selection (the library's is lib/place's pick_hot). */
static void top_m(const uint64_t *c, uint32_t E, uint32_t m, uint8_t *sel) {
    memset(sel, 0, E);
    for (uint32_t i = 0; i < m; i++) {
        int32_t best = -1;
        for (uint32_t x = 0; x < E; x++)
            if (!sel[x] && (best < 0 || c[x] > c[best])) best = (int32_t)x;
        sel[best] = 1;
    }
}

/* Hybrid CPU with a routing profile (dsi_place_options.expert_counts): the counts of a run
 * with every expert on the CPU (the tier counts the ids it downloads: NTOK x k per layer)
 * taken as the profile, half the experts of each layer on the GPU. With one row per step,
 * the device computes exactly the uses of the profile's top half of each layer (counted from
 * this run's own routing, selected by the test) and the CPU the rest — more of them on the
 * GPU than with experts 0 .. E/2-1; logits within the hybrid bound of all-resident Vulkan; a
 * profile whose top half is 0 .. E/2-1 gives the plain split's logits bit for bit. */
static void hybrid_profile(void **state) {
    (void)state;
    for (int mi = quick() ? 1 : 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        tcase tc;
        tcase_open(&tc, path, 41u + (uint32_t)mi);
        dsi_context *ctx = tc.ctx;
        dsi_model *m = tc.m;
        const int32_t V = tc.V;
        const uint32_t E = tc.E, k = tc.k, half = E / 2;
        const dsi_token *toks = tc.toks;
        float *ref = run_single(m, toks, V);
        assert_non_null(ref);
        uint32_t nl = 0, ne = 0;
        uint64_t *cres = counts_of(m, &nl, &ne);
        for (uint64_t i = 0; i < (uint64_t)nl * ne; i++) assert_int_equal(cres[i], 0); /* resident on a GPU: not counted */
        dsi_model_free(m);
        /* every expert on the CPU: the profile */
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_EXPERTS_HOST;
        po.hybrid = DSI_HYBRID_CPU;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        float *all_cpu = run_single(m, toks, V);
        assert_non_null(all_cpu);
        uint64_t *prof = counts_of(m, &nl, &ne);
        check_count_sums(prof, nl, ne, NTOK, k);
        dsi_model_free(m);
        /* the plain split: experts 0 .. E/2-1 on the GPU */
        po.device_experts = half;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        float *plain = run_single(m, toks, V);
        assert_non_null(plain);
        dsi_place_info pi0;
        info_of(m, &pi0);
        dsi_model_free(m);
        /* the profile's split */
        po.expert_counts = prof;
        po.n_expert_counts = (uint64_t)nl * ne;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        float *hot = run_single(m, toks, V);
        assert_non_null(hot);
        dsi_place_info pi;
        info_of(m, &pi);
        uint64_t *c = counts_of(m, &nl, &ne);
        check_count_sums(c, nl, ne, NTOK, k);
        uint64_t want_dev = 0, want_cpu = 0;
        uint8_t sel[256];
        assert_true(ne <= 256);
        for (uint32_t l = 0; l < nl; l++) {
            top_m(prof + (uint64_t)l * ne, ne, half, sel);
            for (uint32_t x = 0; x < ne; x++) *(sel[x] ? &want_dev : &want_cpu) += c[(uint64_t)l * ne + x];
        }
        double md = 0;
        size_t ad = 0;
        max_diff(hot, ref, NTOK, V, &md, &ad);
        printf("# %s: profile split, the hottest %u of %u experts on the GPU: %llu device + %llu cpu expert uses "
               "(experts 0..%u: %llu + %llu); vs all on vulkan: max |dlogit| %.3e, argmax differs at %zu\n",
               path, half, E, (unsigned long long)pi.device_experts, (unsigned long long)pi.cpu_experts, half - 1,
               (unsigned long long)pi0.device_experts, (unsigned long long)pi0.cpu_experts, md, ad);
        assert_int_equal(pi.device_experts_per_layer, half);
        assert_int_equal(pi.device_experts, want_dev);
        assert_int_equal(pi.cpu_experts, want_cpu);
        assert_int_equal(pi.device_experts + pi.cpu_experts, (uint64_t)NTOK * k * nl);
        assert_true(pi.device_experts >= pi0.device_experts);
        assert_int_equal(ad, 0);
        assert_true(md <= 2e-3);
        dsi_model_free(m);
        /* the GPU cache (hybrid UPLOAD, every expert fits, no read-ahead) pre-loaded from
         * the profile: no miss, all-resident logits bit for bit */
        {
            dsi_place_options pu;
            dsi_place_options_init(&pu);
            pu.policy = DSI_PLACE_EXPERTS_HOST;
            pu.hybrid = DSI_HYBRID_UPLOAD;
            pu.flags = DSI_PLACE_FLAG_NO_PREFETCH;
            pu.expert_counts = prof;
            pu.n_expert_counts = (uint64_t)nl * ne;
            m = load(ctx, path, DSI_ACCESS_MMAP, &pu, NULL);
            assert_non_null(m);
            float *up = run_single(m, toks, V);
            assert_non_null(up);
            dsi_place_info pu_i;
            info_of(m, &pu_i);
            printf("# %s: upload, GPU cache of %u slots pre-loaded: %llu misses, %llu hits\n", path,
                   pu_i.expert_cache_slots, (unsigned long long)pu_i.cache_misses, (unsigned long long)pu_i.cache_hits);
            assert_true(pu_i.expert_cache_slots >= nl * ne);
            assert_int_equal(pu_i.cache_misses, 0);
            assert_int_equal(pu_i.cache_hits, (uint64_t)NTOK * k * nl);
            assert_memory_equal(up, ref, sizeof(float) * NTOK * (size_t)V);
            free(up);
            dsi_model_free(m);
        }
        /* a profile whose top half is 0 .. E/2-1: the plain split, bit for bit */
        for (uint32_t l = 0; l < nl; l++)
            for (uint32_t x = 0; x < ne; x++) prof[(uint64_t)l * ne + x] = x < half ? 1 : 0;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        float *same = run_single(m, toks, V);
        assert_non_null(same);
        assert_memory_equal(same, plain, sizeof(float) * NTOK * (size_t)V);
        dsi_model_free(m);
        free(same);
        free(hot);
        free(plain);
        free(all_cpu);
        free(ref);
        free(cres);
        free(prof);
        free(c);
        dsi_context_free(ctx);
    }
}

/* hybrid_auto's runs: a prefill of AUTO_P rows in one step (the executor runs it as one
 * 16-row pass), then single-row steps (run_steps). */
#define AUTO_P 16

/* DSI_HYBRID_AUTO, the per-step choice (experts in host RAM): with hybrid_rows 3 the
 * 16-row prefill (2 x 16 entries over at most 8 experts: >= 4 rows each) uploads its
 * experts into the GPU cache (no CPU work; the GPU computes each layer's distinct experts of
 * the step, counted from the routing; logits bit-identical to all-resident Vulkan) and the
 * single-row steps after it run on the CPU (exactly k experts per layer each, nothing
 * uploaded; within the hybrid bound); with the default (16: not reached by 32 entries over
 * several experts) the prefill runs on the CPU too: the DSI_HYBRID_CPU run bit for bit,
 * nothing uploaded. Bad combinations are refused. */
static void hybrid_auto(void **state) {
    (void)state;
    for (int mi = quick() ? 1 : 0; mi < 2; mi++) {
        const char *path = g_models[mi];
        if (!path) continue;
        tcase tc;
        tcase_open(&tc, path, 77u + (uint32_t)mi);
        dsi_context *ctx = tc.ctx;
        dsi_model *m = tc.m;
        const int32_t V = tc.V;
        const uint32_t k = tc.k, nl = tc.nl, E = tc.E;
        const dsi_token *toks = tc.toks;
        float *ref = run_steps(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT, NTOK, AUTO_P, NULL, NULL, 0, NULL);
        assert_non_null(ref);
        dsi_model_free(m);
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_EXPERTS_HOST;
        po.hybrid = DSI_HYBRID_CPU;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        float *cpu = run_steps(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT, NTOK, AUTO_P, NULL, NULL, 0, NULL);
        assert_non_null(cpu);
        dsi_model_free(m);
        /* steps whose experts serve 3 rows or more each upload */
        po.hybrid = DSI_HYBRID_AUTO;
        po.hybrid_rows = 3;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        dsi_place_info pi1, pi2;
        uint64_t *c1 = malloc(sizeof *c1 * nl * E);
        assert_non_null(c1);
        float *got = run_steps(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT, NTOK, AUTO_P, &pi1, c1, (uint64_t)nl * E, &pi2);
        assert_non_null(got);
        assert_int_equal(pi1.hybrid, DSI_HYBRID_AUTO);
        assert_int_equal(pi1.expert_cache_tier, DSI_TIER_DEVICE);
        assert_true(pi1.expert_cache_slots >= k);
        uint64_t distinct = 0;
        for (uint64_t i = 0; i < (uint64_t)nl * E; i++) distinct += c1[i] > 0;
        double md = 0;
        size_t ad = 0;
        max_diff(got + (size_t)AUTO_P * V, ref + (size_t)AUTO_P * V, NTOK - AUTO_P, V, &md, &ad);
        printf("# %s: auto (3 rows per expert): prefill %llu device experts, %llu bytes uploaded, %llu cpu; decode %llu cpu "
               "experts, %llu bytes uploaded; decode vs all on vulkan: max |dlogit| %.3e, argmax differs at %zu\n",
               path, (unsigned long long)pi1.device_experts, (unsigned long long)pi1.bytes_uploaded,
               (unsigned long long)pi1.cpu_experts, (unsigned long long)(pi2.cpu_experts - pi1.cpu_experts),
               (unsigned long long)(pi2.bytes_uploaded - pi1.bytes_uploaded), md, ad);
        assert_memory_equal(got, ref, sizeof(float) * AUTO_P * (size_t)V);
        assert_int_equal(pi1.cpu_experts, 0);
        assert_int_equal(pi1.device_experts, distinct);
        assert_true(pi1.bytes_uploaded > 0);
        assert_int_equal(pi2.bytes_uploaded, pi1.bytes_uploaded);
        assert_int_equal(pi2.device_experts, pi1.device_experts);
        assert_int_equal(pi2.cpu_experts, (uint64_t)(NTOK - AUTO_P) * k * nl);
        assert_int_equal(ad, 0);
        assert_true(md <= 2e-3);
        dsi_model_free(m);
        free(c1);
        free(got);
        /* the default (16 rows per expert): everything on the CPU */
        po.hybrid_rows = 0;
        m = load(ctx, path, DSI_ACCESS_MMAP, &po, NULL);
        assert_non_null(m);
        got = run_steps(m, toks, V, DSI_SESSION_FLAG_NO_FAKE_QUANT, NTOK, AUTO_P, NULL, NULL, 0, &pi2);
        assert_non_null(got);
        assert_memory_equal(got, cpu, sizeof(float) * NTOK * (size_t)V);
        assert_int_equal(pi2.bytes_uploaded, 0);
        assert_int_equal(pi2.device_experts, 0);
        dsi_model_free(m);
        free(got);
        /* refused */
        dsi_status st;
        po.device_experts = 2;
        assert_null(load(ctx, path, DSI_ACCESS_MMAP, &po, &st));
        assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        printf("# %s\n", dsi_last_error());
        po.device_experts = 0;
        po.hybrid = DSI_HYBRID_AUTO + 1;
        assert_null(load(ctx, path, DSI_ACCESS_MMAP, &po, &st));
        assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
        free(cpu);
        free(ref);
        dsi_context_free(ctx);
    }
}

/* Engram tables in every tier next to the GPU (tiny-v41): disk (pread, a row cache), host and
 * device (overrides; rows are gathered on the host in every case): logits bit-identical to
 * the mapped all-resident run; the disk tier reads rows, the others none. */
static void engram_tiers_gpu(void **state) {
    (void)state;
    const char *path = g_models[1];
    if (!path) DSIT_SKIP_TEST("MODELS", "no tiny-v41 in $DSI_MODELS_DIR");
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
    assert_non_null(m);
    int32_t V = n_vocab(m);
    dsi_token toks[NTOK];
    for (int i = 0; i < NTOK; i++) toks[i] = (dsi_token)((7 * (i % 5) + 3) % V); /* n-grams recur */
    float *ref = run(m, toks, V);
    assert_non_null(ref);
    dsi_model_free(m);
    const char *ovr[3] = {"*engram?embd*=disk", "*engram?embd*=host", "*engram?embd*=device"};
    for (int c = 0; c < 3; c++) {
        dsi_place_options po;
        dsi_place_options_init(&po);
        po.policy = DSI_PLACE_ALL_RESIDENT;
        po.overrides = ovr[c];
        po.engram_cache_bytes = 64 * 1024; /* planned only over tables in the disk tier */
        m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
        assert_non_null(m);
        float *got = run(m, toks, V);
        assert_non_null(got);
        dsi_place_info pi;
        info_of(m, &pi);
        printf("# %s on %s: Engram %s: hits %llu misses %llu, %llu bytes read\n", path, g_backend, ovr[c],
               (unsigned long long)pi.engram_hits, (unsigned long long)pi.engram_misses,
               (unsigned long long)pi.engram_bytes_read);
        assert_memory_equal(got, ref, sizeof(float) * NTOK * (size_t)V);
        if (c == 0) {
            assert_int_equal(pi.engram_cache_bytes, po.engram_cache_bytes);
            assert_true(pi.engram_misses > 0);
            assert_true(pi.engram_hits > 0);
        } else {
            /* resident: no table in the disk tier, so no row cache and nothing read */
            assert_int_equal(pi.engram_cache_bytes, 0);
            assert_int_equal(pi.engram_misses + pi.engram_hits, 0);
        }
        free(got);
        dsi_model_free(m);
    }
    free(ref);
    dsi_context_free(ctx);
}

static void hybrid_bad(void **state) {
    (void)state;
    const char *path = g_models[0] ? g_models[0] : g_models[1];
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    gpu_facts g;
    gpu_facts_of(ctx, path, DSI_PLACE_EXPERTS_STREAMED, DSI_ACCESS_PREAD, &g);
    dsi_place_options po;
    dsi_status st;
    /* hybrid 7 */
    dsi_place_options_init(&po);
    po.hybrid = 7;
    assert_null(load(ctx, path, DSI_ACCESS_PREAD, &po, &st));
    assert_int_equal(st, DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "hybrid 7"));
    /* an attention tensor in host RAM next to the GPU */
    dsi_place_options_init(&po);
    po.overrides = "blk.*.attn_q_a.weight=host";
    assert_null(load(ctx, path, DSI_ACCESS_PREAD, &po, &st));
    assert_int_equal(st, DSI_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsi_last_error(), "only routed experts and Engram tables"));
    /* a GPU cache below k slots */
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_EXPERTS_STREAMED;
    po.hybrid = DSI_HYBRID_UPLOAD;
    po.device_budget = g.dev_resident + g.unit; /* one slot */
    assert_null(load(ctx, path, DSI_ACCESS_PREAD, &po, &st));
    assert_int_equal(st, DSI_ERR_OUT_OF_DEVICE_MEMORY);
    assert_non_null(strstr(dsi_last_error(), "an expert cache on"));
    printf("# %s\n", dsi_last_error());
    /* everything resident above the budget */
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_ALL_RESIDENT;
    po.device_budget = g.dev_resident;
    assert_null(load(ctx, path, DSI_ACCESS_PREAD, &po, &st));
    assert_int_equal(st, DSI_ERR_OUT_OF_DEVICE_MEMORY);
    assert_non_null(strstr(dsi_last_error(), "DSI_PLACE_EXPERTS_HOST"));
    printf("# %s\n", dsi_last_error());
    /* hybrid CPU needs no device room for experts: the resident part alone fits */
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_EXPERTS_HOST;
    po.device_budget = g.dev_resident;
    dsi_model *m = load(ctx, path, DSI_ACCESS_PREAD, &po, NULL);
    assert_non_null(m);
    dsi_place_info pi;
    info_of(m, &pi);
    assert_int_equal(pi.hybrid, DSI_HYBRID_CPU);
    assert_int_equal(pi.expert_cache_slots, 0);
    assert_true(pi.device_weight_bytes <= po.device_budget);
    dsi_model_free(m);
    dsi_context_free(ctx);
}

/* ---- 7. Engram gathers overlapped with the first layers (issue 17) ------------------------------
 * tiny-v41, its Engram tables in the disk tier (no row cache: every step reads its rows) behind
 * a reader, the rest resident. The reader holds every Engram read until the step has reached
 * its layer 0 (the forward pass's test probe) and then answers it late: with the overlap the
 * reads are released by the step itself (none waits for the 1 s timeout) and the logits of a
 * prefill step and decode steps are the resident reference bit for bit — so the step waited
 * for the late rows before its Engram layers; with the overlap off (dsii_engram_overlap_test,
 * the A/B switch) the reads happen before the step starts (timeouts), same logits. A read
 * failing while overlapped fails the step with IO naming the Engram row, the session keeps
 * its position, and the same append after the repair gives the reference logits. */

/* Everything resident except the Engram tables, which stay in the disk tier (no row cache). */
static void engram_disk_po(dsi_place_options *po) {
    dsi_place_options_init(po);
    po->policy = DSI_PLACE_ALL_RESIDENT;
    po->overrides = "*engram?embd*=disk";
    po->host_budget = (uint64_t)1 << 40;
}

#define OV_PRE 8
#define DSII_MAX_LAYERS_TEST 64
#define OV_DEC 6

/* Prefill OV_PRE tokens in one step, then OV_DEC one-token steps: the last row's logits of each
 * call, (1 + OV_DEC) × V. With a reader r, its gate is armed for each decode call. */
static dsi_status ov_run(dsi_model *m, mem_reader *r, const dsi_token *toks, int32_t V, float *out,
                         dsi_session **keep) {
    dsi_session *s = mt_session(m, NCTX, OV_PRE, 0);
    if (!s) return DSI_ERR_INTERNAL;
    const float *lg = NULL;
    int32_t nl = 0;
    dsi_status st = DSI_OK;
    for (int c = 0; st == DSI_OK && c <= OV_DEC; c++) {
        gate_reset();
        /* decode steps are gated (not the prefill); after a timeout, no more (1 s each) */
        if (r && c > 0 && atomic_load(&r->timeouts) == 0) atomic_store(&r->gate, 1);
        st = c == 0 ? dsi_session_append(s, toks, OV_PRE) : dsi_session_append(s, toks + OV_PRE + c - 1, 1);
        if (st == DSI_OK) st = dsi_session_logits(s, &lg, &nl);
        if (st == DSI_OK) memcpy(out + (size_t)c * (size_t)V, lg, sizeof(float) * (size_t)V);
        else printf("# ov_run: %s\n", dsi_session_last_error(s));
    }
    if (r) atomic_store(&r->gate, 0);
    if (keep) *keep = s;
    else dsi_session_free(s);
    return st;
}

static void overlap(void **state) {
    (void)state;
    const char *path = g_models[1];
    if (!path) skip();
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
    assert_non_null(m);
    const int32_t V = n_vocab(m);
    dsi_token toks[OV_PRE + OV_DEC];
    mt_tokens(toks, OV_PRE + OV_DEC, V, 9001u);
    const size_t nf = (size_t)(1 + OV_DEC) * (size_t)V;
    float *ref = malloc(sizeof(float) * nf), *got = malloc(sizeof(float) * nf);
    assert_non_null(ref);
    assert_non_null(got);
    assert_int_equal(ov_run(m, NULL, toks, V, ref, NULL), DSI_OK);
    dsi_model_free(m);
    mem_reader r;
    memset(&r, 0, sizeof r);
    r.data = slurp(path, &r.size);
    assert_non_null(r.data);
    dsi_place_options po;
    engram_disk_po(&po);
    atomic_store(&dsii_engram_step_probe, gate_probe);
    for (int off = 1; off >= 0; off--) {
        atomic_store(&dsii_engram_overlap_test, off);
        m = load_reader(ctx, &r, &po);
        atomic_store(&dsii_engram_overlap_test, 0);
        assert_non_null(m);
        atomic_store(&r.released, 0);
        atomic_store(&r.timeouts, 0);
        atomic_store(&r.late_us, 3000);
        assert_int_equal(ov_run(m, &r, toks, V, got, NULL), DSI_OK);
        printf("# overlap %s: %d Engram reads released by the step, %d before it\n", off ? "off" : "on",
               atomic_load(&r.released), atomic_load(&r.timeouts));
        if (off) {
            assert_true(atomic_load(&r.timeouts) > 0);
        } else {
            assert_int_equal(atomic_load(&r.timeouts), 0);
            assert_true(atomic_load(&r.released) >= OV_DEC);
        }
        assert_memory_equal(got, ref, sizeof(float) * nf);
        if (!off) {
            /* a read failing while overlapped: prefill, then a decode step whose rows fail */
            dsi_session *s = mt_session(m, NCTX, OV_PRE, 0);
            assert_non_null(s);
            assert_int_equal(dsi_session_append(s, toks, OV_PRE), DSI_OK);
            gate_reset();
            atomic_store(&r.timeouts, 0);
            atomic_store(&r.fail_late, 1);
            atomic_store(&r.gate, 1);
            dsi_status st = dsi_session_append(s, toks + OV_PRE, 1);
            atomic_store(&r.gate, 0);
            atomic_store(&r.fail_late, 0);
            printf("# overlapped read error: %s: %s\n", dsi_status_string(st), dsi_session_last_error(s));
            assert_int_equal(st, DSI_ERR_IO);
            assert_non_null(strstr(dsi_session_last_error(s), "engram gather: row"));
            assert_int_equal(atomic_load(&r.timeouts), 0);
            assert_int_equal(pos_of(s), OV_PRE);
            assert_int_equal(dsi_session_append(s, toks + OV_PRE, 1), DSI_OK);
            const float *lg = NULL;
            int32_t nl = 0;
            assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
            assert_memory_equal(lg, ref + (size_t)V, sizeof(float) * (size_t)V);
            dsi_session_free(s);
            /* cancel while overlapped: every read takes 100 ms (the prefill's gathers: seconds);
             * the cancel 200 ms in stops the step's Engram reads (CANCELLED, promptly, the
             * timeline at 0), then the prompt evaluates to the reference */
            s = mt_session(m, NCTX, OV_PRE, 0);
            assert_non_null(s);
            atomic_store(&r.slow, 100);
            canceller c = {s, 0.0};
            pthread_t th;
            assert_int_equal(pthread_create(&th, NULL, cancel_main, &c), 0);
            st = dsi_session_append(s, toks, OV_PRE);
            const double done = now_s();
            pthread_join(th, NULL);
            atomic_store(&r.slow, 0);
            printf("# overlapped cancel: %s, %.3f s after the request: %s\n", dsi_status_string(st),
                   done - c.at, dsi_session_last_error(s));
            assert_int_equal(st, DSI_ERR_CANCELLED);
            assert_int_equal(pos_of(s), 0);
            assert_true(done - c.at < 0.6);
            assert_int_equal(dsi_session_append(s, toks, OV_PRE), DSI_OK);
            assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
            assert_memory_equal(lg, ref, sizeof(float) * (size_t)V);
            dsi_session_free(s);
        }
        dsi_model_free(m);
    }
    atomic_store(&r.late_us, 0);
    atomic_store(&dsii_engram_step_probe, NULL);
    free(r.data);
    free(ref);
    free(got);
    dsi_context_free(ctx);
}

/* 7b. When the overlap is dropped (engram.h DSII_ENGRAM_INLINE_NS): tiny-v41, Engram tables in
 * the disk tier behind the memory reader (rows in memory: fast reads). Decode steps start
 * overlapped (their reads on the helper thread); after DSII_ENGRAM_INLINE_AFTER fast batches
 * the gathers run on the step thread; reads made slow (20 ms each) make the next step's gather
 * too slow for that, and the step after it is overlapped again. Logits equal the resident
 * model's at every step, whichever thread read the rows. The inline budget is 5 ms here
 * (dsii_engram_inline_ns_test): the default 100 µs judged in-memory gathers slow under ASan
 * on a busy CI machine (a preempted gather), and the verdicts must not depend on that. So is
 * the slow-read threshold that wakes the parallel readers (dsii_engram_slow_read_ns_test;
 * default 40 µs): a preempted in-memory read woke them in the last fast step of a loaded CI
 * run (reads per call ... 1 1 3 2 2 2). */
#define OA_PRE 8
#define OA_FAST 16
#define OA_SLOW 3
static void overlap_adaptive(void **state) {
    (void)state;
    const char *path = g_models[1];
    if (!path) {
        print_message("skipped: no tiny-v41.gguf in $DSI_MODELS_DIR (the build writes it)\n");
        skip();
    }
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    const int n_dec = OA_FAST + OA_SLOW;
    dsi_token toks[OA_PRE + OA_FAST + OA_SLOW];
    dsi_model *m = load(ctx, path, DSI_ACCESS_MMAP, NULL, NULL);
    assert_non_null(m);
    const int32_t V = n_vocab(m);
    mt_tokens(toks, OA_PRE + n_dec, V, 4242u);
    float *ref = malloc(sizeof(float) * (size_t)(n_dec + 1) * (size_t)V);
    assert_non_null(ref);
    const float *lg = NULL;
    int32_t nl = 0;
    dsi_session *s = mt_session(m, NCTX, OA_PRE, 0);
    assert_non_null(s);
    for (int c = 0; c <= n_dec; c++) {
        assert_int_equal(c == 0 ? dsi_session_append(s, toks, OA_PRE) : dsi_session_append(s, toks + OA_PRE + c - 1, 1),
                         DSI_OK);
        assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
        memcpy(ref + (size_t)c * (size_t)V, lg, sizeof(float) * (size_t)V);
    }
    dsi_session_free(s);
    dsi_model_free(m);

    mem_reader r;
    memset(&r, 0, sizeof r);
    r.data = slurp(path, &r.size);
    assert_non_null(r.data);
    r.step_th = pthread_self();
    dsi_place_options po;
    engram_disk_po(&po);
    m = load_reader(ctx, &r, &po);
    assert_non_null(m);
    s = mt_session(m, NCTX, OA_PRE, 0);
    assert_non_null(s);
    int where[OA_FAST + OA_SLOW + 1]; /* per call: 1 the step thread read, 2 others, 3 both */
    atomic_store(&dsii_engram_inline_ns_test, 5000000u);
    atomic_store(&dsii_engram_slow_read_ns_test, 5000000u);
    atomic_store(&r.track, 1);
    for (int c = 0; c <= n_dec; c++) {
        if (c == OA_FAST + 1) atomic_store(&r.slow, 1); /* 20 ms per read from here on */
        atomic_store(&r.on_step, 0);
        atomic_store(&r.off_step, 0);
        assert_int_equal(c == 0 ? dsi_session_append(s, toks, OA_PRE) : dsi_session_append(s, toks + OA_PRE + c - 1, 1),
                         DSI_OK);
        where[c] = (atomic_load(&r.on_step) > 0) | (atomic_load(&r.off_step) > 0) << 1;
        assert_int_equal(dsi_session_logits(s, &lg, &nl), DSI_OK);
        if (memcmp(lg, ref + (size_t)c * (size_t)V, sizeof(float) * (size_t)V))
            fail_msg("adaptive overlap: logits differ from the resident model's at call %d", c);
    }
    atomic_store(&r.track, 0);
    atomic_store(&r.slow, 0);
    atomic_store(&dsii_engram_inline_ns_test, 0u);
    atomic_store(&dsii_engram_slow_read_ns_test, 0u);
    printf("# adaptive overlap, reads per call (1 step thread, 2 other threads, 3 both):");
    for (int c = 0; c <= n_dec; c++) printf(" %d", where[c]);
    printf("\n");
    /* the prefill and the first decode steps are overlapped: every read on the helper */
    for (int c = 0; c < (int)DSII_ENGRAM_INLINE_AFTER; c++) assert_int_equal(where[c], 2);
    /* fast rows: some later step gathered on the step thread, and the fast steps' last did */
    int first_inline = -1;
    for (int c = 0; c <= OA_FAST && first_inline < 0; c++)
        if (where[c] == 1) first_inline = c;
    assert_true(first_inline >= (int)DSII_ENGRAM_INLINE_AFTER);
    assert_int_equal(where[OA_FAST], 1);
    /* the first slow step still gathered on the step thread (it could not know; its slow
     * reads woke the parallel readers too), the next ones are overlapped again */
    assert_true(where[OA_FAST + 1] & 1);
    for (int c = OA_FAST + 2; c <= n_dec; c++) assert_int_equal(where[c], 2);
    dsi_session_free(s);
    dsi_model_free(m);
    free(r.data);
    free(ref);
    dsi_context_free(ctx);
}

/* Measurement (not run by default): DSI_ENGRAM_OVERLAP_BENCH=N times N decode steps of tiny-v41
 * with its Engram tables in the disk tier (pread of a private copy of the file, no row cache),
 * the overlap off and on (two models, steps interleaved, the order alternating), "cold" (the
 * file's pages dropped with posix_fadvise(DONTNEED) before each step, so the rows come from the
 * disk) and "warm" (page cache). Prints mean / median / p10 / p90 per case, and the time the
 * step takes from its layer 0 to each Engram layer (what the overlap can hide). */
static double g_lt[DSII_MAX_LAYERS_TEST];
static void bench_probe(uint32_t layer) {
    if (layer < DSII_MAX_LAYERS_TEST) g_lt[layer] = now_s();
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void overlap_bench(void **state) {
    (void)state;
    const char *env = getenv("DSI_ENGRAM_OVERLAP_BENCH");
    const char *path = g_models[1];
    if (!env || !path) return;
    const int N = atoi(env) > 0 ? atoi(env) : 100;
    uint64_t size = 0;
    uint8_t *data = slurp(path, &size);
    assert_non_null(data);
    char tmp[] = "/tmp/dsi-ovbench-XXXXXX";
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, (size_t)size), (ssize_t)size);
    fsync(fd);
    free(data);
    dsi_context *ctx = new_ctx(NULL);
    assert_non_null(ctx);
    dsi_place_options po;
    engram_disk_po(&po);
    dsi_model *m[2];
    dsi_session *s[2];
    /* DSI_ENGRAM_OVERLAP_READERS: the tables' parallel readers (1: serial gathers) */
    const char *rd = getenv("DSI_ENGRAM_OVERLAP_READERS");
    for (int k = 0; k < 2; k++) { /* k = 0: overlap off, 1: on */
        atomic_store(&dsii_engram_overlap_test, k ? 0 : 1);
        atomic_store(&dsii_engram_readers_test, rd ? atoi(rd) : 0);
        m[k] = load(ctx, tmp, DSI_ACCESS_PREAD, &po, NULL);
        atomic_store(&dsii_engram_overlap_test, 0);
        atomic_store(&dsii_engram_readers_test, 0);
        assert_non_null(m[k]);
        s[k] = mt_session(m[k], (uint32_t)(2 * N + 64), 8, 0);
        assert_non_null(s[k]);
    }
    const int32_t V = n_vocab(m[0]);
    dsi_token *toks = malloc(sizeof(dsi_token) * (size_t)(2 * N + 8));
    assert_non_null(toks);
    mt_tokens(toks, (size_t)(2 * N + 8), V, 4711u);
    /* rows never repeat within a decode step's gathers here (no row cache anyway) */
    for (int k = 0; k < 2; k++) assert_int_equal(dsi_session_append(s[k], toks, 8), DSI_OK);
    double *t = malloc(sizeof(double) * (size_t)N * 4), *to_l = calloc(DSII_MAX_LAYERS_TEST, sizeof(double));
    assert_non_null(t);
    assert_non_null(to_l);
    atomic_store(&dsii_engram_step_probe, bench_probe);
    /* steps alternate cold / warm and, within each, which model goes first: drift of the
     * shared machine's load spreads over all four cases */
    int cnt[4] = {0, 0, 0, 0};
    for (int i = 0; i < 2 * N; i++) {
        const int cold = i & 1;
        for (int q = 0; q < 2; q++) {
            const int k = ((i >> 1) + q) & 1;
            if (cold) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            for (int l = 0; l < DSII_MAX_LAYERS_TEST; l++) g_lt[l] = 0;
            const double t0 = now_s();
            assert_int_equal(dsi_session_append(s[k], toks + 8 + i, 1), DSI_OK);
            const double t1 = now_s();
            const int c = cold * 2 + k;
            t[(size_t)c * (size_t)N + (size_t)cnt[c]++] = (t1 - t0) * 1e3;
            if (!cold && k == 1)
                for (int l = 1; l < DSII_MAX_LAYERS_TEST; l++)
                    if (g_lt[l] > 0) to_l[l] += (g_lt[l] - g_lt[0]) * 1e3 / N;
        }
    }
    atomic_store(&dsii_engram_step_probe, NULL);
    for (int c = 0; c < 4; c++) {
        double *x = t + (size_t)c * (size_t)N, mean = 0;
        for (int i = 0; i < N; i++) mean += x[i] / N;
        qsort(x, (size_t)N, sizeof *x, cmp_d);
        printf("# bench: readers %s, %s, overlap %s: decode step mean %.3f ms, median %.3f, p10 %.3f, "
               "p90 %.3f (%d steps)\n", rd ? rd : "default", c >= 2 ? "cold (DONTNEED)" : "warm",
               (c & 1) ? "on " : "off", mean, x[N / 2], x[N / 10], x[N * 9 / 10], N);
    }
    printf("# bench: warm, overlap on: mean time from layer 0 to layer l:");
    for (int l = 1; l < DSII_MAX_LAYERS_TEST; l++)
        if (to_l[l] > 0) printf(" %d: %.3f ms", l, to_l[l]);
    printf("\n");
    for (int k = 0; k < 2; k++) {
        dsi_session_free(s[k]);
        dsi_model_free(m[k]);
    }
    free(t);
    free(to_l);
    free(toks);
    dsi_context_free(ctx);
    close(fd);
    unlink(tmp);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    dsit_filter();
    /* argv[1] "threads": the threaded cases only (test_place_threads, label concurrency: the
     * ThreadSanitizer stage; no tiny-moe, which that build does not write) */
    const int threads_only = argc > 1 && strcmp(argv[1], "threads") == 0;
    if (argc > 1 && strcmp(argv[1], "cpu") != 0 && !threads_only) g_backend = argv[1];
    const char *p0 = mt_model_path("tiny-v4.gguf", NULL); /* a static buffer */
    g_models[0] = p0 ? strdup(p0) : NULL;
    const char *p1 = mt_model_path("tiny-v41.gguf", NULL);
    g_models[1] = p1 ? strdup(p1) : NULL;
    if (!g_models[0] && !g_models[1]) return dsit_absent("MODELS", "no tiny models in $DSI_MODELS_DIR");
    if (g_backend) {
        dsi_context *probe = new_ctx(NULL);
        if (!probe)
            return dsit_absent(strcmp(g_backend, "cuda") == 0 ? "CUDA_DEVICE" : "VULKAN", "no %s backend: %s",
                               g_backend, dsi_last_error());
        const struct CMUnitTest gpu_tests[] = {
            cmocka_unit_test(hybrid_bad),
            cmocka_unit_test(hybrid_upload),
            cmocka_unit_test(hybrid_cpu),
            cmocka_unit_test(hybrid_split),
            cmocka_unit_test(engram_tiers_gpu),
            cmocka_unit_test(hybrid_profile),
            cmocka_unit_test(hybrid_auto),
        };
        /* Under the validation layer (a second run of the same tests) the profile and AUTO
         * cases are left to the plain run: they make the Vulkan calls of hybrid_split,
         * hybrid_upload and hybrid_cpu again, only with other expert ids and step sizes. */
        size_t n_gpu = sizeof gpu_tests / sizeof gpu_tests[0];
        if (quick()) {
            n_gpu -= 2;
            printf("# validation run: hybrid_profile and hybrid_auto run in the plain run only\n");
        }
        int rc = _cmocka_run_group_tests("test_place_gpu", gpu_tests, n_gpu, NULL, NULL);
        /* the validation counters live in the loaded module: read them with a context open */
        if (strcmp(g_backend, "vulkan") == 0 && dsit_vk_validation_check("test_place vulkan") != 0) rc++;
        dsi_context_free(probe);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_options), cmocka_unit_test(identity), cmocka_unit_test(faults),
        cmocka_unit_test(cancel),      cmocka_unit_test(budget),   cmocka_unit_test(threads),
        cmocka_unit_test(overlap),     cmocka_unit_test(overlap_adaptive),
        cmocka_unit_test(direct_io),   cmocka_unit_test(expert_counts),
    };
    if (threads_only) {
        const struct CMUnitTest th[] = {
            cmocka_unit_test(threads), cmocka_unit_test(faults), cmocka_unit_test(cancel),
            cmocka_unit_test(overlap), cmocka_unit_test(direct_io),
        };
        return cmocka_run_group_tests_name("test_place_threads", th, NULL, NULL);
    }
    if (getenv("DSI_ENGRAM_OVERLAP_BENCH")) {
        /* a measurement, not a test: only when asked for (docs/placement.md) */
        const struct CMUnitTest bench[] = {cmocka_unit_test(overlap_bench)};
        return cmocka_run_group_tests_name("engram_overlap_bench", bench, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
