/*
 * Model loading tests: the generated tiny models report the configuration of model-spec §7
 * (expected values written here from the spec), dsinfer-mkmodel is deterministic, access
 * modes agree, the progress callback can cancel every stage, and a corpus of malformed files
 * (built here with the GGUF writer from a valid tiny model) fails with the right status and
 * a message naming the culprit.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "dsinfer.h"
#include "base/context_impl.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "quant/quant.h"
#include "tests/common/skip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------ */

static char g_tmpdir[256];
static char g_v4[512], g_v41[512];

static char g_log[8192];
static void log_cb(int32_t level, const char *msg, void *ud) {
    (void)level;
    (void)ud;
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", msg);
}

static dsi_context *new_ctx(void) {
    dsi_context_options o;
    dsi_context_options_init(&o, DSI_ABI_VERSION);
    o.log_fn = log_cb;
    o.log_level = DSI_LOG_DEBUG;
    o.n_threads = 1;
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(&o, &ctx), DSI_OK);
    return ctx;
}

static int run_mkmodel(const char *config, const char *seed, const char *out) {
    const char *mk = getenv("DSI_MKMODEL");
    if (!mk || access(mk, X_OK) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        execl(mk, mk, "--config", config, "--seed", seed, "--type", "f32", "--layout", "native", "-o", out, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The build writes $DSI_MODELS_DIR/tiny-*.gguf; fall back to generating them here. */
static int find_model(const char *config, char *path, size_t cap) {
    const char *dir = getenv("DSI_MODELS_DIR");
    if (dir) {
        snprintf(path, cap, "%s/%s.gguf", dir, config);
        if (access(path, R_OK) == 0) return 1;
    }
    snprintf(path, cap, "%s/%s.gguf", g_tmpdir, config);
    return run_mkmodel(config, "1", path) == 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/dsi_test_model_XXXXXX");
    if (!mkdtemp(g_tmpdir)) return -1;
    if (!find_model("tiny-v4", g_v4, sizeof g_v4)) g_v4[0] = '\0';
    if (!find_model("tiny-v41", g_v41, sizeof g_v41)) g_v41[0] = '\0';
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

#define NEED_MODELS()                                                                      \
    do {                                                                                   \
        if (!g_v4[0] || !g_v41[0])                                                         \
            DSIT_SKIP_TEST("MODELS", "tiny models unavailable (DSI_MODELS_DIR / DSI_MKMODEL)"); \
    } while (0)

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)sz + 1);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

typedef struct memrd {
    const uint8_t *p;
    size_t n;
    int closed;
    uint64_t fail_from; /* reads touching bytes at or past this offset fail (0: never) */
} memrd;

static int32_t mem_pread(void *ud, void *buf, uint64_t size, uint64_t off) {
    memrd *m = ud;
    if (off > m->n || size > m->n - off) return 1;
    if (m->fail_from && off + size > m->fail_from) return 1;
    memcpy(buf, m->p + off, (size_t)size);
    return 0;
}
static void mem_close(void *ud) { ((memrd *)ud)->closed++; }

static dsi_status load_mem(dsi_context *ctx, const void *p, size_t n, dsi_model **out) {
    static memrd m;
    m.p = p;
    m.n = n;
    m.closed = 0;
    m.fail_from = 0;
    dsi_reader r;
    dsi_reader_init(&r);
    r.size = n;
    r.pread_fn = mem_pread;
    r.close_fn = mem_close;
    r.user_data = &m;
    dsi_status st = dsi_model_load_from_reader(ctx, &r, NULL, out);
    if (st != DSI_OK) assert_int_equal(m.closed, 1); /* the reader is closed on failure too */
    return st;
}

/* ---- configuration of the generated tiny models (model-spec §7) ---------------------- */

static void test_tiny_v4_config(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    dsi_model *m = NULL;
    assert_int_equal(dsi_model_load(ctx, g_v4, NULL, &m), DSI_OK);
    dsi_model_info info;
    dsi_model_info_init(&info);
    assert_int_equal(dsi_model_get_info(m, &info), DSI_OK);
    assert_int_equal(info.arch, DSI_ARCH_DEEPSEEK4);
    assert_string_equal(info.arch_name, "deepseek4");
    assert_string_equal(info.name, "tiny-v4");
    assert_int_equal(info.n_layers, 6);
    assert_int_equal(info.n_embd, 256);
    assert_int_equal(info.n_heads, 4);
    assert_int_equal(info.n_vocab, 1024);
    assert_int_equal(info.n_experts, 8);
    assert_int_equal(info.n_experts_used, 2);
    assert_int_equal(info.n_draft_layers, 1);
    assert_int_equal(info.has_mtp, 1);
    assert_int_equal(info.has_dspark, 0);
    assert_int_equal(info.has_engram, 0);
    /* §7.1: 4.92M parameters with vocab 1024, MTP 0.75M */
    assert_true(info.n_params > 5640000 && info.n_params < 5700000);

    const dsii_hparams *hp = &m->hp;
    assert_int_equal(hp->head_dim, 128);
    assert_int_equal(hp->rope_dim, 64);
    assert_int_equal(hp->nope_dim, 64);
    assert_int_equal(hp->q_lora_rank, 64);
    assert_int_equal(hp->o_groups, 2);
    assert_int_equal(hp->o_lora_rank, 32);
    assert_int_equal(hp->window, 16);
    assert_int_equal(hp->idx_n_head, 4);
    assert_int_equal(hp->idx_head_dim, 128);
    assert_int_equal(hp->idx_topk, 8);
    assert_int_equal(hp->expert_ff, 64);
    assert_int_equal(hp->n_expert_shared, 1);
    assert_int_equal(hp->n_hash_layer, 3);
    assert_int_equal(hp->hc_mult, 4);
    assert_int_equal(hp->hc_mix, 24);
    assert_int_equal(hp->hc_sinkhorn_iters, 20);
    assert_true(hp->rope_base == 10000.0f && hp->rope_base_compress == 160000.0f);
    assert_true(hp->yarn_factor == 16.0f && hp->yarn_orig_ctx == 64);
    assert_true(hp->route_scale == 1.5f);
    assert_true(hp->rms_eps == 1e-6f);
    assert_int_equal(hp->hc_lagged, 0);
    const uint32_t ratios[6] = {0, 0, 4, 16, 4, 16};
    for (int i = 0; i < 6; i++) {
        const dsii_layer_hparams *l = &hp->layer[i];
        assert_int_equal(l->compress_ratio, ratios[i]);
        assert_int_equal(l->coff, ratios[i] == 4 ? 2 : 1);
        assert_int_equal(l->has_indexer, ratios[i] == 4);
        assert_int_equal(l->is_hash, i < 3);
        assert_int_equal(l->yarn, ratios[i] > 0);
        assert_true(l->rope_base == (ratios[i] ? 160000.0f : 10000.0f));
        assert_true(l->swiglu_limit == 10.0f);
        const dsii_layer_tensors *t = &m->w.layer[i];
        assert_true((t->comp_kv != NULL) == (ratios[i] > 0));
        assert_true((t->idx_q_b != NULL) == (ratios[i] == 4));
        assert_true((t->tid2eid != NULL) == (i < 3));
        assert_true((t->exp_probs_b != NULL) == (i >= 3));
        assert_non_null(t->ffn_gate_exps);
        assert_int_equal(t->ffn_gate_exps->ne[2], 8);
    }
    assert_int_equal(hp->draft_layer[0].compress_ratio, 0);
    assert_non_null(m->w.draft[0].e_proj);
    assert_non_null(m->w.draft[0].hc_head_fn);
    assert_non_null(m->w.output_hc_fn);
    assert_non_null(m->tokenizer);
    assert_int_equal(dsi_model_free(m), DSI_OK);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

static void test_tiny_v41_config(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    dsi_model *m = NULL;
    assert_int_equal(dsi_model_load(ctx, g_v41, NULL, &m), DSI_OK);
    dsi_model_info info;
    dsi_model_info_init(&info);
    assert_int_equal(dsi_model_get_info(m, &info), DSI_OK);
    assert_int_equal(info.arch, DSI_ARCH_DEEPSEEK41);
    assert_string_equal(info.arch_name, "deepseek41");
    assert_int_equal(info.n_layers, 10);
    assert_int_equal(info.n_embd, 256);
    assert_int_equal(info.n_heads, 4);
    assert_int_equal(info.n_experts, 8);
    assert_int_equal(info.n_experts_used, 2);
    assert_int_equal(info.n_draft_layers, 3);
    assert_int_equal(info.has_mtp, 0);
    assert_int_equal(info.has_dspark, 1);
    assert_int_equal(info.has_engram, 1);
    /* §7.2: 7.44M (vocab 1024) + DSpark 1.46M */
    assert_true(info.n_params > 8850000 && info.n_params < 8950000);

    const dsii_hparams *hp = &m->hp;
    assert_true(hp->rms_eps == 1e-20f);
    assert_int_equal(hp->hc_lagged, 1);
    assert_int_equal(hp->idx_n_head, 4);
    assert_int_equal(hp->idx_head_dim, 128);
    assert_int_equal(hp->idx_topk, 4);
    assert_int_equal(hp->candidate_source, 5);
    assert_int_equal(hp->candidate_block_size, 2);
    assert_int_equal(hp->candidate_topk_blocks, 2);
    assert_int_equal(hp->n_hash_layer, 0);
    assert_null(m->w.output_hc_fn);
    /* roles: ratios [0,0,2,2,2,1,1,1,1,1], kv sources [2,5], index sources [2,5,7] (§4.3 rule:
     * most recent source in stack order) */
    const uint32_t ratio[10] = {0, 0, 2, 2, 2, 1, 1, 1, 1, 1};
    const int kvsrc[10] = {-1, -1, 2, 2, 2, 5, 5, 5, 5, 5};
    const int topk[10] = {-1, -1, 2, 2, 2, 5, 5, 7, 7, 7};
    for (int i = 0; i < 10; i++) {
        const dsii_layer_hparams *l = &hp->layer[i];
        const dsii_layer_tensors *t = &m->w.layer[i];
        assert_int_equal(l->compress_ratio, ratio[i]);
        assert_int_equal(l->coff, 1);
        assert_int_equal(l->kv_src, kvsrc[i]);
        assert_int_equal(l->key_src, kvsrc[i]);
        assert_int_equal(l->topk_src, topk[i]);
        assert_int_equal(l->is_kv_source, i == 2 || i == 5);
        assert_int_equal(l->is_index_source, i == 2 || i == 5 || i == 7);
        assert_int_equal(l->is_candidate_source, i == 5);
        assert_int_equal(l->cand_masked, i == 7);
        assert_int_equal(l->engram_index, i == 1 ? 0 : i == 3 ? 1 : -1);
        assert_true((t->comp_kv != NULL) == (i == 2 || i == 5));
        assert_true((t->comp_gate != NULL) == (i == 2)); /* ratio-1 source has no gate */
        assert_true((t->idx_k != NULL) == (i == 2 || i == 5));
        assert_true((t->idx_q_b != NULL) == (i == 2 || i == 5 || i == 7));
        assert_null(t->comp_ape);
        assert_true((t->engram_embd != NULL) == (i == 1 || i == 3));
    }
    /* Engram §4.6 from engram_vocab_size 1000: primes from 1000 up, rows 4062 and 4152 */
    const dsii_engram_hparams *e = &hp->engram;
    assert_int_equal(e->n_layer, 2);
    assert_int_equal(e->layer_ids[0], 1);
    assert_int_equal(e->layer_ids[1], 3);
    assert_int_equal(e->n_head, 2);
    assert_int_equal(e->key_length, 32);
    assert_int_equal(e->max_ngram, 3);
    assert_int_equal(e->n_cols, 4);
    const uint64_t primes[8] = {1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049};
    const uint64_t offs[8] = {0, 1009, 2022, 3041, 0, 1031, 2064, 3103};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(e->primes[i], primes[i]);
        assert_int_equal(e->offsets[i], offs[i]);
    }
    assert_int_equal(e->rows[0], 4062);
    assert_int_equal(e->rows[1], 4152);
    assert_int_equal(m->w.layer[1].engram_embd->ne[1], 4062);
    assert_int_equal(m->w.layer[1].engram_embd->type, DSI_TYPE_FP8_E4M3_R32);
    assert_true(e->compressed_vocab < 1024 && e->compressed_vocab > 1);
    for (uint32_t i = 0; i < 6; i++) {
        assert_int_equal(e->multipliers[i] & 1, 1);
        assert_true(e->multipliers[i] < (uint64_t)INT64_MAX / e->compressed_vocab);
    }
    /* DSpark §7.2 */
    assert_int_equal(hp->dspark.block_size, 5);
    assert_int_equal(hp->dspark.n_target, 3);
    assert_int_equal(hp->dspark.target_layer_ids[0], 7);
    assert_int_equal(hp->dspark.target_layer_ids[2], 9);
    assert_int_equal(hp->dspark.markov_rank, 16);
    assert_int_equal(hp->dspark.n_expert, 4);
    assert_int_equal(hp->dspark.n_expert_used, 1);
    for (int d = 0; d < 3; d++) {
        assert_int_equal(hp->draft_layer[d].n_expert, 4);
        assert_int_equal(hp->draft_layer[d].compress_ratio, 0);
        assert_int_equal(m->w.draft[d].blk.ffn_gate_exps->ne[2], 4);
    }
    assert_non_null(m->w.draft[0].main_proj);
    assert_int_equal(m->w.draft[0].main_proj->ne[0], 3 * 256);
    assert_non_null(m->w.draft[2].markov_head);
    assert_non_null(m->w.draft[2].confidence);
    assert_null(m->w.draft[1].markov_head);
    assert_int_equal(dsi_model_free(m), DSI_OK);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* ---- determinism ------------------------------------------------------------------------ */

static void test_mkmodel_deterministic(void **state) {
    (void)state;
    const char *mk = getenv("DSI_MKMODEL");
    if (!mk || access(mk, X_OK) != 0) DSIT_SKIP_TEST("MODELS", "no dsinfer-mkmodel (DSI_MKMODEL)");
    char a[400], b[400], c[400];
    snprintf(a, sizeof a, "%s/a.gguf", g_tmpdir);
    snprintf(b, sizeof b, "%s/b.gguf", g_tmpdir);
    snprintf(c, sizeof c, "%s/c.gguf", g_tmpdir);
    assert_int_equal(run_mkmodel("tiny-v41", "7", a), 0);
    assert_int_equal(run_mkmodel("tiny-v41", "7", b), 0);
    assert_int_equal(run_mkmodel("tiny-v41", "8", c), 0);
    size_t na, nb, nc;
    uint8_t *pa = read_all(a, &na), *pb = read_all(b, &nb), *pc = read_all(c, &nc);
    assert_non_null(pa);
    assert_non_null(pb);
    assert_non_null(pc);
    assert_int_equal(na, nb);
    assert_memory_equal(pa, pb, na);
    assert_int_equal(na, nc); /* same layout, other weights */
    assert_true(memcmp(pa, pc, na) != 0);
    /* the build's copy (seed 1) equals a fresh run */
    const char *dir = getenv("DSI_MODELS_DIR");
    char built[400];
    if (dir) {
        snprintf(built, sizeof built, "%s/tiny-v41.gguf", dir);
        size_t n1, n2;
        uint8_t *p1 = read_all(built, &n1);
        if (p1) {
            assert_int_equal(run_mkmodel("tiny-v41", "1", a), 0);
            uint8_t *p2 = read_all(a, &n2);
            assert_int_equal(n1, n2);
            assert_memory_equal(p1, p2, n1);
            free(p2);
            free(p1);
        }
    }
    free(pa);
    free(pb);
    free(pc);
    /* same fingerprint for different weights, different for another config */
    dsi_context *ctx = new_ctx();
    dsi_model *m1, *m2, *m3;
    assert_int_equal(dsi_model_load(ctx, b, NULL, &m1), DSI_OK);
    assert_int_equal(dsi_model_load(ctx, c, NULL, &m2), DSI_OK);
    NEED_MODELS();
    assert_int_equal(dsi_model_load(ctx, g_v4, NULL, &m3), DSI_OK);
    assert_memory_equal(m1->fingerprint, m2->fingerprint, 32);
    assert_true(memcmp(m1->fingerprint, m3->fingerprint, 32) != 0);
    dsi_model_free(m1);
    dsi_model_free(m2);
    dsi_model_free(m3);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* ---- access modes ----------------------------------------------------------------------- */

static void compare_models(const dsi_model *a, const dsi_model *b) {
    dsi_model_info ia, ib;
    dsi_model_info_init(&ia);
    dsi_model_info_init(&ib);
    assert_int_equal(dsi_model_get_info(a, &ia), DSI_OK);
    assert_int_equal(dsi_model_get_info(b, &ib), DSI_OK);
    assert_memory_equal(&ia, &ib, sizeof ia);
    assert_int_equal(a->n_tensors, b->n_tensors);
    uint8_t *x = malloc(1 << 20), *y = malloc(1 << 20);
    for (uint32_t i = 0; i < a->n_tensors; i++) {
        const dsii_tensor *ta = &a->tensors[i], *tb = &b->tensors[i];
        assert_string_equal(ta->name, tb->name);
        uint64_t n = ta->nbytes < (1 << 20) ? ta->nbytes : (1 << 20);
        assert_int_equal(dsii_model_tensor_read(a, ta, 0, n, x, NULL), DSI_OK);
        assert_int_equal(dsii_model_tensor_read(b, tb, 0, n, y, NULL), DSI_OK);
        assert_memory_equal(x, y, n);
    }
    free(x);
    free(y);
}

static void test_access_modes(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    const char *paths[2] = {g_v4, g_v41};
    for (int p = 0; p < 2; p++) {
        dsi_model *mm, *mp, *mr;
        dsi_model_options o;
        dsi_model_options_init(&o);
        assert_int_equal(dsi_model_load(ctx, paths[p], &o, &mm), DSI_OK);
        assert_int_equal(mm->access, DSI_ACCESS_MMAP);
        o.access = DSI_ACCESS_PREAD;
        assert_int_equal(dsi_model_load(ctx, paths[p], &o, &mp), DSI_OK);
        assert_int_equal(mp->access, DSI_ACCESS_PREAD);
        size_t n;
        uint8_t *buf = read_all(paths[p], &n);
        assert_non_null(buf);
        assert_int_equal(load_mem(ctx, buf, n, &mr), DSI_OK);
        assert_int_equal(mr->access, DSI_ACCESS_READER);
        compare_models(mm, mp);
        compare_models(mm, mr);
        if (p == 1) { /* Engram tables are never copied outside mmap mode */
            assert_non_null(mm->w.layer[1].engram_embd->data);
            assert_null(mp->w.layer[1].engram_embd->data);
            assert_int_equal(mp->w.layer[1].engram_embd->lazy, 1);
        }
        dsi_model_free(mm);
        dsi_model_free(mp);
        dsi_model_free(mr);
        free(buf);
    }
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* ---- progress / cancel ------------------------------------------------------------------ */

typedef struct prog {
    int cancel_stage;
    int seen[8];
    int last_stage;
    int order_ok;
} prog;

static int32_t prog_cb(int32_t stage, uint64_t done, uint64_t total, void *ud) {
    prog *p = ud;
    if (stage < p->last_stage || done > total) p->order_ok = 0;
    p->last_stage = stage;
    p->seen[stage]++;
    return stage == p->cancel_stage ? 0 : 1;
}

static void test_progress_cancel(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    for (int access = 0; access < 2; access++) {
        for (int s = DSI_LOAD_STAGE_HEADER; s <= DSI_LOAD_STAGE_DONE + 1; s++) {
            prog p = {.cancel_stage = s, .last_stage = 0, .order_ok = 1};
            dsi_model_options o;
            dsi_model_options_init(&o);
            o.access = access;
            o.progress_fn = prog_cb;
            o.progress_user_data = &p;
            dsi_model *m = (dsi_model *)&p; /* must be reset to NULL */
            dsi_status st = dsi_model_load(ctx, g_v41, &o, &m);
            assert_true(p.order_ok);
            if (s <= DSI_LOAD_STAGE_DONE) {
                assert_int_equal(st, DSI_ERR_CANCELLED);
                assert_null(m);
                assert_non_null(strstr(dsi_last_error(), "cancelled"));
            } else {
                assert_int_equal(st, DSI_OK);
                for (int k = DSI_LOAD_STAGE_HEADER; k <= DSI_LOAD_STAGE_DONE; k++) assert_true(p.seen[k] > 0);
                dsi_model_free(m);
            }
        }
    }
    /* nothing left registered on the context */
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* ---- API checks -------------------------------------------------------------------------- */

static void test_api(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    dsi_model *m = (dsi_model *)ctx;
    assert_int_equal(dsi_model_load(NULL, g_v4, NULL, &m), DSI_ERR_INVALID_ARGUMENT);
    assert_null(m);
    assert_int_equal(dsi_model_load(ctx, NULL, NULL, &m), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_model_load(ctx, g_v4, NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
    dsi_model_options o;
    dsi_model_options_init(&o);
    o.struct_size = 2;
    assert_int_equal(dsi_model_load(ctx, g_v4, &o, &m), DSI_ERR_INVALID_ARGUMENT);
    dsi_model_options_init(&o);
    o.access = 7;
    assert_int_equal(dsi_model_load(ctx, g_v4, &o, &m), DSI_ERR_INVALID_ARGUMENT);
    dsi_model_options_init(&o);
    o.flags = 1u << 7; /* an undefined flag bit (0 COALESCE, 1 VERIFY_FILE, 2 RESIDENT) */
    assert_int_equal(dsi_model_load(ctx, g_v4, &o, &m), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_model_load(ctx, "/nonexistent/x.gguf", NULL, &m), DSI_ERR_IO);
    assert_int_equal(dsi_model_load_from_reader(ctx, NULL, NULL, &m), DSI_ERR_INVALID_ARGUMENT);
    /* a shorter (older) options struct is accepted */
    o.struct_size = offsetof(dsi_model_options, progress_fn);
    o.flags = 99; /* not covered: ignored */
    o.access = DSI_ACCESS_PREAD;
    assert_int_equal(dsi_model_load(ctx, g_v4, &o, &m), DSI_OK);
    assert_int_equal(m->access, DSI_ACCESS_PREAD);

    assert_int_equal(dsi_model_get_info(NULL, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_model_get_info(m, NULL), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_model_last_error(m), "info"));
    dsi_model_info info;
    dsi_model_info_init(&info);
    info.struct_size = 0;
    assert_int_equal(dsi_model_get_info(m, &info), DSI_ERR_INVALID_ARGUMENT);
    /* an old, short info struct gets only its prefix */
    memset(&info, 0xAB, sizeof info);
    info.struct_size = offsetof(dsi_model_info, name);
    assert_int_equal(dsi_model_get_info(m, &info), DSI_OK);
    assert_int_equal(info.arch, DSI_ARCH_DEEPSEEK4);
    assert_int_equal((uint8_t)info.name[0], 0xAB);

    /* type bytes: an f32 tiny-v4 stores everything as f32 except the i32 tid2eid tables */
    uint64_t f32b = 0, i32b = 0, q4 = 1;
    dsi_model_info_init(&info);
    assert_int_equal(dsi_model_get_info(m, &info), DSI_OK);
    assert_int_equal(dsi_model_type_bytes(m, DSI_TYPE_F32, &f32b), DSI_OK);
    assert_int_equal(dsi_model_type_bytes(m, DSI_TYPE_I32, &i32b), DSI_OK);
    assert_int_equal(dsi_model_type_bytes(m, DSI_TYPE_Q4_K, &q4), DSI_OK);
    assert_int_equal(q4, 0);
    assert_int_equal(i32b, 3ull * 2 * 1024 * 4); /* 3 hash layers × [k=2, V=1024] × 4 bytes */
    assert_int_equal(f32b + i32b, info.weight_bytes);
    assert_int_equal(dsi_model_type_bytes(m, 12345, &q4), DSI_OK);
    assert_int_equal(q4, 0);
    assert_int_equal(dsi_model_type_bytes(m, DSI_TYPE_F32, NULL), DSI_ERR_INVALID_ARGUMENT);

    /* metadata, two-call pattern */
    int32_t n = 0;
    assert_int_equal(dsi_model_meta_count(m, &n), DSI_OK);
    assert_true(n > 30);
    size_t need = 0;
    char buf[256];
    int found = 0;
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(dsi_model_meta_key(m, i, NULL, 0, &need), DSI_OK);
        assert_true(need < sizeof buf);
        assert_int_equal(dsi_model_meta_key(m, i, buf, sizeof buf, &need), DSI_OK);
        assert_int_equal(strlen(buf), need);
        if (strcmp(buf, "deepseek4.attention.compress_ratios") == 0) {
            found = 1;
            assert_int_equal(dsi_model_meta_value(m, i, buf, sizeof buf, &need), DSI_OK);
            assert_string_equal(buf, "[0, 0, 4, 16, 4, 16, 0]");
        }
    }
    assert_true(found);
    assert_int_equal(dsi_model_meta_key(m, n, buf, sizeof buf, &need), DSI_ERR_NOT_FOUND);
    assert_int_equal(dsi_model_meta_key(m, -1, buf, sizeof buf, &need), DSI_ERR_NOT_FOUND);
    assert_int_equal(dsi_model_meta_find(m, "general.architecture", NULL, 0, &need), DSI_OK);
    assert_int_equal(need, strlen("deepseek4"));
    char small[4];
    assert_int_equal(dsi_model_meta_find(m, "general.architecture", small, sizeof small, &need), DSI_OK);
    assert_string_equal(small, "dee");
    assert_int_equal(dsi_model_meta_find(m, "deepseek4.expert_count", buf, sizeof buf, &need), DSI_OK);
    assert_string_equal(buf, "8");
    assert_int_equal(dsi_model_meta_find(m, "tokenizer.ggml.tokens", NULL, 0, &need), DSI_OK);
    char *big = malloc(need + 1);
    assert_int_equal(dsi_model_meta_find(m, "tokenizer.ggml.tokens", big, need + 1, &need), DSI_OK);
    assert_int_equal(strlen(big), need);
    assert_non_null(strstr(big, "…]")); /* 1024 tokens: at most 64 shown */
    free(big);
    assert_int_equal(dsi_model_meta_find(m, "no.such.key", buf, sizeof buf, &need), DSI_ERR_NOT_FOUND);
    assert_non_null(strstr(dsi_model_last_error(m), "no.such.key"));
    assert_int_equal(dsi_model_meta_find(m, NULL, buf, sizeof buf, &need), DSI_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsi_model_meta_count(NULL, &n), DSI_ERR_INVALID_ARGUMENT);

    /* free refuses while a session holds the model */
    dsii_model_session_acquire(m);
    assert_int_equal(dsi_model_free(m), DSI_ERR_BUSY);
    assert_int_equal(dsi_context_free(ctx), DSI_ERR_BUSY);
    dsii_model_session_release(m);
    assert_int_equal(dsi_model_free(m), DSI_OK);
    assert_int_equal(dsi_model_free(NULL), DSI_OK);
    assert_string_equal(dsi_model_last_error(NULL), "");
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* ---- malformed files ---------------------------------------------------------------------- */

/* A rebuilt copy of a valid model with one change. */
typedef struct edit {
    const char *skip_tensor;       /* drop this tensor */
    const char *shape_tensor;      /* give this tensor ne = shape[] */
    int64_t shape[2];
    const char *type_tensor;       /* store this tensor as `new_type` */
    int32_t new_type;
    const char *key;               /* replace / drop (kind 0) this key */
    int kind;                      /* 0 drop, 1 string, 2 u32, 3 u32 array, 4 u64 array patch */
    const char *sval;
    uint32_t uval;
    const uint32_t *arr;
    uint32_t n_arr;
    uint32_t patch_index;          /* kind 4/5: element to overwrite */
    uint64_t patch_value;
    const char *add_tensor;        /* append a small f32 tensor with this name */
    const char *poke_tensor;       /* overwrite int32 element poke_index with poke_value */
    uint32_t poke_index;
    int32_t poke_value;
    int nextn;                     /* V4: rewrite mtp.0.* in llama.cpp's nextn form (blk.L.*) */
} edit;

/* llama.cpp nextn spelling of a ds4 mtp.0.* tensor (docs/model-files.md §4.1); e_proj and
 * h_proj are fused separately. */
static void nextn_name(const char *name, uint32_t L, char *out, size_t cap) {
    static const char *const head[][2] = {
        {"mtp.0.enorm.weight", "nextn.enorm.weight"},
        {"mtp.0.hnorm.weight", "nextn.hnorm.weight"},
        {"mtp.0.norm.weight", "nextn.shared_head_norm.weight"},
    };
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        if (strcmp(name, head[i][0]) == 0) {
            snprintf(out, cap, "blk.%u.%s", L, head[i][1]);
            return;
        }
    snprintf(out, cap, "blk.%u.%s", L, name + strlen("mtp.0."));
}

static uint8_t *rebuild(const char *src_path, const edit *e, size_t *out_n) {
    dsii_gguf *g = NULL;
    assert_int_equal(dsii_gguf_open_path(NULL, src_path, DSI_ACCESS_MMAP, &g, NULL), DSI_OK);
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    assert_non_null(w);
    dsii_error err;
    void *to_free[16];
    int n_free = 0;
    for (int64_t i = 0; i < dsii_gguf_n_kv(g); i++) {
        const char *key = dsii_gguf_kv_key(g, i);
        uint32_t t = dsii_gguf_kv_type(g, i);
        if (e->nextn && strcmp(key, "deepseek4.block_count") == 0) {
            uint32_t L = 0;
            assert_int_equal(dsii_gguf_get_u32(g, key, &L, NULL), DSI_OK);
            assert_int_equal(dsii_gguf_writer_add_u32(w, key, L + 1, &err), DSI_OK);
            continue;
        }
        if (e->key && strcmp(key, e->key) == 0 && e->kind != 4 && e->kind != 5) {
            if (e->kind == 1) assert_int_equal(dsii_gguf_writer_add_string(w, key, e->sval, &err), DSI_OK);
            if (e->kind == 2) assert_int_equal(dsii_gguf_writer_add_u32(w, key, e->uval, &err), DSI_OK);
            if (e->kind == 3)
                assert_int_equal(dsii_gguf_writer_add_array(w, key, DSII_GGUF_U32, e->arr, e->n_arr, &err), DSI_OK);
            continue;
        }
        const dsii_gguf_value *v = dsii_gguf_kv_val(g, i);
        if (t == DSII_GGUF_STRING) {
            const char *s;
            size_t len;
            assert_int_equal(dsii_gguf_get_string(g, key, &s, &len, NULL), DSI_OK);
            assert_int_equal(dsii_gguf_writer_add_string_n(w, key, s, len, &err), DSI_OK);
        } else if (t == DSII_GGUF_ARRAY) {
            uint32_t et = dsii_gguf_arr_type(g, i);
            uint64_t n = dsii_gguf_arr_len(g, i);
            if (et == DSII_GGUF_STRING) {
                const char **strs = malloc(sizeof *strs * (size_t)n);
                size_t *lens = malloc(sizeof *lens * (size_t)n);
                for (uint64_t k = 0; k < n; k++) strs[k] = dsii_gguf_arr_str(g, i, k, &lens[k]);
                assert_int_equal(dsii_gguf_writer_add_string_array(w, key, strs, lens, n, &err), DSI_OK);
                free(strs);
                free(lens);
            } else {
                const void *data = dsii_gguf_arr_data(g, i);
                if (e->key && strcmp(key, e->key) == 0 && (e->kind == 4 || e->kind == 5)) {
                    size_t es = e->kind == 4 ? 8 : 4;
                    void *copy = malloc((size_t)n * es);
                    memcpy(copy, data, (size_t)n * es);
                    if (e->kind == 4) ((uint64_t *)copy)[e->patch_index] = e->patch_value;
                    else ((int32_t *)copy)[e->patch_index] = (int32_t)e->patch_value;
                    to_free[n_free++] = copy;
                    data = copy;
                }
                assert_int_equal(dsii_gguf_writer_add_array(w, key, et, data, n, &err), DSI_OK);
            }
        } else {
            uint64_t u = 0;
            int64_t s = 0;
            double f = 0;
            if (t == DSII_GGUF_F32 || t == DSII_GGUF_F64) {
                assert_true(dsii_gguf_val_as_f64(v, &f));
                if (t == DSII_GGUF_F32) assert_int_equal(dsii_gguf_writer_add_f32(w, key, (float)f, &err), DSI_OK);
                else assert_int_equal(dsii_gguf_writer_add_f64(w, key, f, &err), DSI_OK);
            } else if (t == DSII_GGUF_BOOL) {
                assert_true(dsii_gguf_val_as_u64(v, &u));
                assert_int_equal(dsii_gguf_writer_add_bool(w, key, (int)u, &err), DSI_OK);
            } else if (t == DSII_GGUF_I32 || t == DSII_GGUF_I64) {
                assert_true(dsii_gguf_val_as_i64(v, &s));
                assert_int_equal(dsii_gguf_writer_add_i64(w, key, s, &err), DSI_OK);
            } else {
                assert_true(dsii_gguf_val_as_u64(v, &u));
                if (t == DSII_GGUF_U64) assert_int_equal(dsii_gguf_writer_add_u64(w, key, u, &err), DSI_OK);
                else assert_int_equal(dsii_gguf_writer_add_u32(w, key, (uint32_t)u, &err), DSI_OK);
            }
        }
    }
    for (int64_t i = 0; i < dsii_gguf_n_tensors(g); i++) {
        const dsii_gguf_tensor *t = dsii_gguf_tensor_at(g, i);
        if (e->skip_tensor && strcmp(t->name, e->skip_tensor) == 0) continue;
        const void *data = dsii_gguf_tensor_data(g, t);
        char nname[128];
        const char *tname = t->name;
        if (e->nextn && strncmp(t->name, "mtp.0.", 6) == 0) {
            uint32_t L = 0;
            assert_int_equal(dsii_gguf_get_u32(g, "deepseek4.block_count", &L, NULL), DSI_OK);
            if (strcmp(t->name, "mtp.0.h_proj.weight") == 0) continue;
            /* llama.cpp's combined file has no place for the MTP's own HC head */
            if (strncmp(t->name, "mtp.0.hc_head_", 14) == 0) continue;
            if (strcmp(t->name, "mtp.0.e_proj.weight") == 0) {
                /* eh_proj [2D, D]: row j = [e_proj row j ; h_proj row j] (f32) */
                const dsii_gguf_tensor *h = dsii_gguf_find_tensor(g, "mtp.0.h_proj.weight");
                assert_int_equal(t->type, DSI_TYPE_F32);
                const float *ed = data, *hd = dsii_gguf_tensor_data(g, h);
                const int64_t D = t->ne[0];
                float *eh = malloc(sizeof(float) * (size_t)(2 * D * D));
                for (int64_t j = 0; j < D; j++) {
                    memcpy(eh + 2 * D * j, ed + D * j, sizeof(float) * (size_t)D);
                    memcpy(eh + 2 * D * j + D, hd + D * j, sizeof(float) * (size_t)D);
                }
                int64_t ne2[2] = {2 * D, D};
                snprintf(nname, sizeof nname, "blk.%u.nextn.eh_proj.weight", L);
                assert_int_equal(dsii_gguf_writer_add_tensor(w, nname, DSI_TYPE_F32, 2, ne2, eh,
                                                             sizeof(float) * (uint64_t)(2 * D * D), &err), DSI_OK);
                to_free[n_free++] = eh;
                continue;
            }
            nextn_name(t->name, L, nname, sizeof nname);
            tname = nname;
        }
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t nd = t->n_dims;
        int32_t type = t->type;
        if (e->shape_tensor && strcmp(t->name, e->shape_tensor) == 0) {
            ne[0] = e->shape[0];
            ne[1] = e->shape[1];
            nd = 2;
        }
        if (e->type_tensor && strcmp(t->name, e->type_tensor) == 0) type = e->new_type;
        uint64_t nb = 0;
        assert_true(dsii_type_nbytes(type, ne, nd, &nb));
        if (nb != t->nbytes || (e->poke_tensor && strcmp(t->name, e->poke_tensor) == 0)) {
            void *copy = calloc(1, (size_t)nb);
            memcpy(copy, data, (size_t)(nb < t->nbytes ? nb : t->nbytes));
            if (e->poke_tensor && strcmp(t->name, e->poke_tensor) == 0)
                ((int32_t *)copy)[e->poke_index] = e->poke_value;
            to_free[n_free++] = copy;
            data = copy;
        }
        assert_int_equal(dsii_gguf_writer_add_tensor(w, tname, type, nd, ne, data, nb, &err), DSI_OK);
    }
    if (e->add_tensor) {
        float z[64] = {0};
        int64_t ne[1] = {64};
        assert_int_equal(dsii_gguf_writer_add_tensor(w, e->add_tensor, DSI_TYPE_F32, 1, ne, z, sizeof z, &err), DSI_OK);
    }
    void *mem = NULL;
    size_t n = 0;
    assert_int_equal(dsii_gguf_writer_write_memory(w, &mem, &n, &err), DSI_OK);
    dsii_gguf_writer_free(w);
    for (int i = 0; i < n_free; i++) free(to_free[i]);
    dsii_gguf_close(g);
    *out_n = n;
    return mem;
}

typedef struct bad_case {
    const char *what;
    int v41;
    edit e;
    dsi_status want;
    const char *msg1, *msg2;
} bad_case;

static const uint32_t k_short_ratios[4] = {0, 0, 4, 16};
static const uint32_t k_bad_kv_src[2] = {3, 5};
static const uint32_t k_bad_engram_layers[2] = {3, 1};

static const bad_case k_bad[] = {
    {"missing tensor", 0, {.skip_tensor = "blk.3.attn_q_b.weight"}, DSI_ERR_BAD_FORMAT, "blk.3.attn_q_b.weight", "missing"},
    {"missing indexer on a ratio-4 layer", 0, {.skip_tensor = "blk.2.indexer.proj.weight"}, DSI_ERR_BAD_FORMAT, "blk.2.indexer.proj.weight", NULL},
    {"missing engram table", 1, {.skip_tensor = "blk.3.engram.embd.weight"}, DSI_ERR_BAD_FORMAT, "blk.3.engram.embd.weight", NULL},
    {"missing DSpark head", 1, {.skip_tensor = "mtp.2.markov_head.weight"}, DSI_ERR_BAD_FORMAT, "mtp.2.markov_head.weight", NULL},
    {"wrong shape", 0, {.shape_tensor = "blk.1.attn_kv.weight", .shape = {256, 64}}, DSI_ERR_BAD_FORMAT, "blk.1.attn_kv.weight", "[256, 128]"},
    {"wrong shape v41", 1, {.shape_tensor = "blk.5.indexer.attn_k.weight", .shape = {128, 64}}, DSI_ERR_BAD_FORMAT, "blk.5.indexer.attn_k.weight", NULL},
    {"norm stored as f16", 0, {.type_tensor = "blk.0.attn_norm.weight", .new_type = DSI_TYPE_F16}, DSI_ERR_UNSUPPORTED, "blk.0.attn_norm.weight", "f16"},
    {"unimplemented type", 0, {.type_tensor = "output.weight", .new_type = 35 /* tq2_0 */}, DSI_ERR_UNSUPPORTED, "output.weight", "tq2_0"},
    {"key of the wrong type", 0, {.key = "deepseek4.expert_count", .kind = 1, .sval = "8"}, DSI_ERR_BAD_FORMAT, "deepseek4.expert_count", NULL},
    {"missing key", 0, {.key = "deepseek4.attention.q_lora_rank", .kind = 0}, DSI_ERR_BAD_FORMAT, "deepseek4.attention.q_lora_rank", NULL},
    /* keys whose default differs between engines (docs/model-files.md §2.7): refused by name */
    {"missing YaRN original context (llama.cpp: context_length)", 0, {.key = "deepseek4.rope.scaling.original_context_length", .kind = 0}, DSI_ERR_BAD_FORMAT, "deepseek4.rope.scaling.original_context_length", "missing"},
    {"missing YaRN factor (llama.cpp: no scaling)", 0, {.key = "deepseek4.rope.scaling.factor", .kind = 0}, DSI_ERR_BAD_FORMAT, "deepseek4.rope.scaling.factor", "missing"},
    {"linear RoPE scaling", 0, {.key = "deepseek4.rope.scaling.type", .kind = 1, .sval = "linear"}, DSI_ERR_UNSUPPORTED, "deepseek4.rope.scaling.type", "linear"},
    {"wrong arch", 0, {.key = "general.architecture", .kind = 1, .sval = "llama"}, DSI_ERR_UNSUPPORTED, "llama", NULL},
    {"no arch", 0, {.key = "general.architecture", .kind = 0}, DSI_ERR_BAD_FORMAT, "general.architecture", NULL},
    {"short layer array", 0, {.key = "deepseek4.attention.compress_ratios", .kind = 3, .arr = k_short_ratios, .n_arr = 4}, DSI_ERR_BAD_FORMAT, "compress_ratios", "4 entries"},
    {"used > experts", 0, {.key = "deepseek4.expert_used_count", .kind = 2, .uval = 9}, DSI_ERR_BAD_FORMAT, "expert_used_count", "9"},
    {"window 0", 0, {.key = "deepseek4.attention.sliding_window", .kind = 2, .uval = 0}, DSI_ERR_BAD_FORMAT, "sliding_window", NULL},
    {"rope dims > head dim", 0, {.key = "deepseek4.rope.dimension_count", .kind = 2, .uval = 256}, DSI_ERR_BAD_FORMAT, "rope.dimension_count", "256"},
    {"hash layers > layers", 0, {.key = "deepseek4.hash_layer_count", .kind = 2, .uval = 7}, DSI_ERR_BAD_FORMAT, "hash_layer_count", "7"},
    {"tid2eid out of range", 0, {.poke_tensor = "blk.1.ffn_gate_tid2eid.weight", .poke_index = 5, .poke_value = 8}, DSI_ERR_BAD_FORMAT, "blk.1.ffn_gate_tid2eid.weight", "8"},
    {"tid2eid negative", 0, {.poke_tensor = "blk.0.ffn_gate_tid2eid.weight", .poke_index = 0, .poke_value = -1}, DSI_ERR_BAD_FORMAT, "tid2eid", "-1"},
    {"unknown tensor", 0, {.add_tensor = "blk.0.foo.weight"}, DSI_ERR_BAD_FORMAT, "blk.0.foo.weight", NULL},
    {"tensor of another role", 1, {.add_tensor = "blk.4.attn_compressor_norm.weight"}, DSI_ERR_BAD_FORMAT, "blk.4.attn_compressor_norm.weight", NULL},
    {"bad engram prime", 1, {.key = "deepseek41.engram.primes", .kind = 4, .patch_index = 1, .patch_value = 1015}, DSI_ERR_BAD_FORMAT, "engram.primes", "1015"},
    {"bad engram offset", 1, {.key = "deepseek41.engram.offsets", .kind = 4, .patch_index = 2, .patch_value = 2023}, DSI_ERR_BAD_FORMAT, "engram.offsets", "2023"},
    {"even multiplier", 1, {.key = "deepseek41.engram.multipliers", .kind = 4, .patch_index = 0, .patch_value = 1000}, DSI_ERR_BAD_FORMAT, "engram.multipliers", "1000"},
    {"multiplier too large", 1, {.key = "deepseek41.engram.multipliers", .kind = 4, .patch_index = 3, .patch_value = 0x7FFFFFFFFFFFFFFFull}, DSI_ERR_BAD_FORMAT, "engram.multipliers", NULL},
    {"token map >= compressed vocab", 1, {.key = "deepseek41.engram.token_map", .kind = 5, .patch_index = 17, .patch_value = 5000}, DSI_ERR_BAD_FORMAT, "engram.token_map", "5000"},
    {"engram layers unordered", 1, {.key = "deepseek41.engram.layer_ids", .kind = 3, .arr = k_bad_engram_layers, .n_arr = 2}, DSI_ERR_BAD_FORMAT, "engram.layer_ids", NULL},
    {"kv source after its reader", 1, {.key = "deepseek41.kv_source_layer_ids", .kind = 3, .arr = k_bad_kv_src, .n_arr = 2}, DSI_ERR_BAD_FORMAT, "kv_source_layer_ids", NULL},
    {"candidate source not a source", 1, {.key = "deepseek41.attention.candidate_source_layer_id", .kind = 2, .uval = 6}, DSI_ERR_BAD_FORMAT, "candidate_source_layer_id", "6"},
    {"hash layers on v41", 1, {.key = "deepseek41.hash_layer_count", .kind = 2, .uval = 1}, DSI_ERR_BAD_FORMAT, "hash_layer_count", NULL},
};

static void test_malformed(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *c = &k_bad[i];
        size_t n = 0;
        uint8_t *p = rebuild(c->v41 ? g_v41 : g_v4, &c->e, &n);
        dsi_model *m = (dsi_model *)ctx;
        dsi_status st = load_mem(ctx, p, n, &m);
        const char *msg = dsi_last_error();
        if (st != c->want || !strstr(msg, c->msg1) || (c->msg2 && !strstr(msg, c->msg2)))
            fail_msg("case '%s': status %d (want %d), message '%s' (want '%s'%s%s)", c->what, st, c->want,
                     msg, c->msg1, c->msg2 ? ", '" : "", c->msg2 ? c->msg2 : "");
        assert_null(m);
        /* the context keeps the message too */
        assert_non_null(strstr(dsi_context_last_error(ctx), c->msg1));
        dsii_free(NULL, p);
    }
    /* truncated file */
    size_t n = 0;
    uint8_t *p = read_all(g_v4, &n);
    dsi_model *m = NULL;
    assert_int_not_equal(load_mem(ctx, p, 1000, &m), DSI_OK);
    assert_null(m);
    assert_int_equal(load_mem(ctx, "NOTAGGUF", 8, &m), DSI_ERR_BAD_FORMAT);
    free(p);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* Keys whose default differs between engines and that load with a documented default
 * (docs/model-files.md §2.7): rope.scaling.type absent -> YaRN, said in the log; the YaRN betas
 * absent -> 32 / 1 (llama.cpp's fixed values); "none" -> scaling off (llama.cpp's meaning). */
static void test_key_defaults(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    dsi_model *base = NULL, *m = NULL;
    assert_int_equal(dsi_model_load(ctx, g_v4, NULL, &base), DSI_OK);
    assert_int_equal(base->hp.rope_type_defaulted, 0);
    {
        edit e = {.key = "deepseek4.rope.scaling.type", .kind = 0};
        size_t n = 0;
        uint8_t *p = rebuild(g_v4, &e, &n);
        g_log[0] = '\0';
        assert_int_equal(load_mem(ctx, p, n, &m), DSI_OK);
        assert_int_equal(m->hp.rope_type_defaulted, 1);
        assert_true(m->hp.yarn_factor == base->hp.yarn_factor && m->hp.yarn_factor > 1.0f);
        assert_non_null(strstr(g_log, "deepseek4.rope.scaling.type"));
        assert_non_null(strstr(g_log, "yarn"));
        dsi_model_free(m);
        dsii_free(NULL, p);
    }
    {
        edit e = {.key = "deepseek4.rope.scaling.yarn_beta_fast", .kind = 0};
        size_t n = 0;
        uint8_t *p = rebuild(g_v4, &e, &n);
        assert_int_equal(load_mem(ctx, p, n, &m), DSI_OK);
        assert_true(m->hp.yarn_beta_fast == 32.0f);
        dsi_model_free(m);
        dsii_free(NULL, p);
    }
    {
        edit e = {.key = "deepseek4.rope.scaling.type", .kind = 1, .sval = "none"};
        size_t n = 0;
        uint8_t *p = rebuild(g_v4, &e, &n);
        assert_int_equal(load_mem(ctx, p, n, &m), DSI_OK);
        assert_true(m->hp.yarn_factor == 1.0f);
        dsi_model_free(m);
        dsii_free(NULL, p);
    }
    dsi_model_free(base);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

static void test_vision_ignored(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    edit e = {.add_tensor = "v.blk.0.attn_q.weight"};
    size_t n = 0;
    uint8_t *p = rebuild(g_v41, &e, &n);
    dsi_model *base = NULL, *m = NULL;
    assert_int_equal(dsi_model_load(ctx, g_v41, NULL, &base), DSI_OK);
    g_log[0] = '\0';
    assert_int_equal(load_mem(ctx, p, n, &m), DSI_OK);
    assert_non_null(strstr(g_log, "vision"));
    assert_int_equal(m->n_ignored, 1);
    assert_int_equal(m->n_params, base->n_params);
    assert_memory_equal(m->fingerprint, base->fingerprint, 32);
    dsi_model_free(m);
    dsi_model_free(base);
    dsii_free(NULL, p);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* a reader that fails while the weights are read: IO, reader closed once, nothing leaked */
static void test_reader_io_error(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    size_t n = 0;
    uint8_t *p = read_all(g_v41, &n);
    assert_non_null(p);
    memrd rd = {.p = p, .n = n, .fail_from = n / 2};
    dsi_reader r;
    dsi_reader_init(&r);
    r.size = n;
    r.pread_fn = mem_pread;
    r.close_fn = mem_close;
    r.user_data = &rd;
    dsi_model *m = (dsi_model *)ctx;
    assert_int_equal(dsi_model_load_from_reader(ctx, &r, NULL, &m), DSI_ERR_IO);
    assert_null(m);
    assert_int_equal(rd.closed, 1);
    /* and a good reader is closed exactly once, at dsi_model_free */
    memrd ok = {.p = p, .n = n};
    r.user_data = &ok;
    assert_int_equal(dsi_model_load_from_reader(ctx, &r, NULL, &m), DSI_OK);
    assert_int_equal(ok.closed, 0);
    assert_int_equal(dsi_model_free(m), DSI_OK);
    assert_int_equal(ok.closed, 1);
    free(p);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* llama.cpp's nextn MTP convention reads into the same binding as ds4's mtp.0.* */
static void test_nextn_mtp(void **state) {
    (void)state;
    NEED_MODELS();
    dsi_context *ctx = new_ctx();
    edit e = {.nextn = 1};
    size_t n = 0;
    uint8_t *p = rebuild(g_v4, &e, &n);
    dsi_model *base = NULL, *m = NULL;
    assert_int_equal(dsi_model_load(ctx, g_v4, NULL, &base), DSI_OK);
    assert_int_equal(load_mem(ctx, p, n, &m), DSI_OK);
    assert_int_equal(m->hp.n_layer, 6);
    assert_int_equal(m->hp.n_draft, 1);
    assert_int_equal(m->hp.has_mtp, 1);
    assert_int_equal(m->hp.mtp_from_nextn, 1);
    /* the MTP's own HC head (hc·D·hc + hc + 1 values) is not in a llama.cpp combined file */
    assert_int_equal(m->n_params, base->n_params - (4 * 256 * 4 + 4 + 1));
    const dsii_draft_tensors *a = &base->w.draft[0], *b = &m->w.draft[0];
    assert_int_equal(b->e_proj->is_view, 1);
    assert_int_equal(b->e_proj->ne[0], 256);
    assert_int_equal(b->e_proj->ne[1], 256);
    assert_int_equal(b->e_proj->row_stride, 2 * 256 * 4);
    for (int64_t r = 0; r < 256; r += 51) {
        assert_memory_equal((const uint8_t *)a->e_proj->data + r * a->e_proj->row_stride,
                            (const uint8_t *)b->e_proj->data + r * b->e_proj->row_stride, 256 * 4);
        assert_memory_equal((const uint8_t *)a->h_proj->data + r * a->h_proj->row_stride,
                            (const uint8_t *)b->h_proj->data + r * b->h_proj->row_stride, 256 * 4);
    }
    assert_memory_equal(a->norm->data, b->norm->data, 256 * 4);
    assert_memory_equal(a->blk.attn_q_b->data, b->blk.attn_q_b->data, a->blk.attn_q_b->nbytes);
    /* llama.cpp's semantics: the MTP head runs with the trunk's output_hc_* */
    assert_int_equal(m->hp.mtp_hc_from_trunk, 1);
    assert_ptr_equal(b->hc_head_fn, m->w.output_hc_fn);
    assert_ptr_equal(b->hc_head_base, m->w.output_hc_base);
    assert_ptr_equal(b->hc_head_scale, m->w.output_hc_scale);
    assert_int_equal(base->hp.mtp_hc_from_trunk, 0);
    dsi_model_free(m);
    dsi_model_free(base);
    dsii_free(NULL, p);
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

/* every --type mkmodel offers loads, and stores its matrices in that type */
static void test_mkmodel_types(void **state) {
    (void)state;
    const char *mk = getenv("DSI_MKMODEL");
    if (!mk || access(mk, X_OK) != 0) DSIT_SKIP_TEST("MODELS", "no dsinfer-mkmodel (DSI_MKMODEL)");
    static const struct {
        const char *name;
        int32_t v4, v41;
    } types[] = {
        {"f16", DSI_TYPE_F16, DSI_TYPE_F16},
        {"bf16", DSI_TYPE_BF16, DSI_TYPE_BF16},
        {"q8_0", DSI_TYPE_Q8_0, DSI_TYPE_Q8_0},
        {"q4_k", DSI_TYPE_Q4_K, DSI_TYPE_Q4_K},
        {"q2_k", DSI_TYPE_Q2_K, DSI_TYPE_Q2_K},
        {"mxfp4", DSI_TYPE_MXFP4, DSI_TYPE_MXFP4},
        {"fp8", DSI_TYPE_FP8_E4M3_B128, DSI_TYPE_FP8_E4M3_B32},
    };
    dsi_context *ctx = new_ctx();
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        for (int v = 0; v < 2; v++) {
            char path[400];
            snprintf(path, sizeof path, "%s/type-%s-%d.gguf", g_tmpdir, types[i].name, v);
            pid_t pid = fork();
            if (pid == 0) {
                execl(mk, mk, "--config", v ? "tiny-v41" : "tiny-v4", "--type", types[i].name, "--layout",
                      "native", "-o", path, (char *)NULL);
                _exit(127);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            dsi_model *m = NULL;
            if (dsi_model_load(ctx, path, NULL, &m) != DSI_OK)
                fail_msg("--type %s: %s", types[i].name, dsi_last_error());
            const int32_t want = v ? types[i].v41 : types[i].v4;
            uint64_t bytes = 0;
            assert_int_equal(dsi_model_type_bytes(m, want, &bytes), DSI_OK);
            assert_true(bytes > 0);
            /* attn_q_a ([256, 64]) rows fit every type's blocks: stored as asked */
            assert_int_equal(m->w.layer[0].attn_q_a->type, want);
            /* norms stay f32 */
            assert_int_equal(m->w.layer[0].attn_norm->type, DSI_TYPE_F32);
            if (v) assert_int_equal(m->w.layer[1].engram_embd->type, DSI_TYPE_FP8_E4M3_R32);
            dsi_model_free(m);
            unlink(path);
        }
    assert_int_equal(dsi_context_free(ctx), DSI_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_v4_config),
        cmocka_unit_test(test_tiny_v41_config),
        cmocka_unit_test(test_mkmodel_deterministic),
        cmocka_unit_test(test_access_modes),
        cmocka_unit_test(test_progress_cancel),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_vision_ignored),
        cmocka_unit_test(test_nextn_mtp),
        cmocka_unit_test(test_key_defaults),
        cmocka_unit_test(test_reader_io_error),
        cmocka_unit_test(test_mkmodel_types),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
