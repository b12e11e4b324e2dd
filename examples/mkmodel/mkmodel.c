/*
 * dsinfer-mkmodel: writes deterministic synthetic DeepSeek V4 / V4.1 GGUF models
 * (docs/synthetic-models.md; file contract docs/model-files.md).
 *
 *   dsinfer-mkmodel --config NAME [--seed N] [--type T] -o FILE.gguf
 *   dsinfer-mkmodel --import DUMP -o FILE.gguf   (trained weights, import.c)
 *   dsinfer-mkmodel --list
 *
 * Same config + seed + type → byte-identical file on every platform: weights come from a
 * splitmix64 stream per tensor (seeded by the seed and the tensor name), integer → float by
 * exact scaling, one IEEE multiply by a per-tensor scale (computed with sqrt, which IEEE
 * rounds exactly), then the lib/quant encoders (integer / RNE logic). No libc rand, no
 * transcendental libm calls. Tensors are generated while the file is written, one at a time,
 * so multi-GB bench models never sit in memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "mkmodel.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/emit.h"
#include "quant/fp.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------------------------ */
/* Configurations                                                                        */
/* ------------------------------------------------------------------------------------ */

#define MAXL 64

typedef struct mk_config {
    const char *name;
    const char *desc;
    int v41;
    uint32_t n_vocab;
    uint32_t n_layer, n_embd, n_head, head_dim, rope_dim, q_lora, o_groups, o_lora, window;
    uint32_t ctx;
    uint32_t ratios[MAXL];
    uint32_t idx_heads, idx_dim, idx_topk;
    uint32_t n_expert, n_used, n_shared, ff;
    uint32_t n_hash;
    uint32_t hc, sinkhorn;
    float rope_base, rope_base_c, yarn_factor, beta_fast, beta_slow, eps, hc_eps, swiglu, route;
    uint32_t yarn_orig;
    uint32_t n_mtp; /* V4 */
    /* V4.1 */
    uint32_t n_kv_src, kv_src[MAXL], n_idx_src, idx_src[MAXL];
    int32_t cand_src;
    uint32_t cand_topk_blocks, cand_block;
    uint32_t n_engram, engram_layers[8], engram_heads, engram_dim, engram_ngram, engram_vocab;
    uint32_t n_dspark, dspark_block, n_targets, targets[8], markov_rank, dspark_experts, dspark_used;
    int32_t default_type;
} mk_config;

static const mk_config k_configs[] = {
    {
        .name = "tiny-v4",
        .desc = "model-spec 7.1: 6 layers (window, CSA ratio 4 + indexer, HCA ratio 16), hash layers, MTP",
        .v41 = 0, .n_vocab = 1024,
        .n_layer = 6, .n_embd = 256, .n_head = 4, .head_dim = 128, .rope_dim = 64, .q_lora = 64,
        .o_groups = 2, .o_lora = 32, .window = 16, .ctx = 4096,
        .ratios = {0, 0, 4, 16, 4, 16},
        .idx_heads = 4, .idx_dim = 128, .idx_topk = 8,
        .n_expert = 8, .n_used = 2, .n_shared = 1, .ff = 64, .n_hash = 3,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-6f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 64, .n_mtp = 1, .cand_src = -1,
        .default_type = DSI_TYPE_F32,
    },
    {
        .name = "tiny-moe",
        .desc = "tiny-v4 with 32 experts of width 128 and no MTP: routed experts are ~85 % of its bytes (memory-tier tests, docs/placement.md)",
        .v41 = 0, .n_vocab = 1024,
        .n_layer = 6, .n_embd = 256, .n_head = 4, .head_dim = 128, .rope_dim = 64, .q_lora = 64,
        .o_groups = 2, .o_lora = 32, .window = 16, .ctx = 4096,
        .ratios = {0, 0, 4, 16, 4, 16},
        .idx_heads = 4, .idx_dim = 128, .idx_topk = 8,
        .n_expert = 32, .n_used = 2, .n_shared = 1, .ff = 128, .n_hash = 3,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-6f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 64, .n_mtp = 0, .cand_src = -1,
        .default_type = DSI_TYPE_Q8_0,
    },
    {
        .name = "tiny-v4-lcpp",
        .desc = "V4 for interop tests: ratios 4 and 128 only (llama.cpp's deepseek4 loader), every matrix row a multiple of 256 (K-quants), 16 indexer heads",
        .v41 = 0, .n_vocab = 1024,
        .n_layer = 6, .n_embd = 256, .n_head = 4, .head_dim = 256, .rope_dim = 64, .q_lora = 256,
        .o_groups = 2, .o_lora = 128, .window = 16, .ctx = 4096,
        .ratios = {0, 0, 4, 128, 4, 128},
        .idx_heads = 16, .idx_dim = 128, .idx_topk = 8,
        .n_expert = 8, .n_used = 2, .n_shared = 1, .ff = 256, .n_hash = 3,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-6f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 64, .n_mtp = 1, .cand_src = -1,
        .default_type = DSI_TYPE_F32,
    },
    {
        .name = "tiny-v41",
        .desc = "model-spec 7.2: 10 layers (ratio 2 / 1 roles, shared KV, candidates), Engram, 3 DSpark blocks",
        .v41 = 1, .n_vocab = 1024,
        .n_layer = 10, .n_embd = 256, .n_head = 4, .head_dim = 128, .rope_dim = 64, .q_lora = 64,
        .o_groups = 2, .o_lora = 32, .window = 16, .ctx = 4096,
        .ratios = {0, 0, 2, 2, 2, 1, 1, 1, 1, 1},
        .idx_heads = 4, .idx_dim = 128, .idx_topk = 4,
        .n_expert = 8, .n_used = 2, .n_shared = 1, .ff = 64, .n_hash = 0,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-20f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 64,
        .n_kv_src = 2, .kv_src = {2, 5}, .n_idx_src = 3, .idx_src = {2, 5, 7},
        .cand_src = 5, .cand_topk_blocks = 2, .cand_block = 2,
        .n_engram = 2, .engram_layers = {1, 3}, .engram_heads = 2, .engram_dim = 32,
        .engram_ngram = 3, .engram_vocab = 1000,
        .n_dspark = 3, .dspark_block = 5, .n_targets = 3, .targets = {7, 8, 9},
        .markov_rank = 16, .dspark_experts = 4, .dspark_used = 1,
        .default_type = DSI_TYPE_F32,
    },
    {
        .name = "bench-v41",
        .desc = "V4.1-shaped bench model, 1.7 GiB with Q4_K (head_dim 512, 64 experts, Engram, DSpark)",
        .v41 = 1, .n_vocab = 2048,
        .n_layer = 24, .n_embd = 1024, .n_head = 16, .head_dim = 512, .rope_dim = 64, .q_lora = 512,
        .o_groups = 4, .o_lora = 256, .window = 128, .ctx = 65536,
        .ratios = {0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
        .idx_heads = 8, .idx_dim = 128, .idx_topk = 128,
        .n_expert = 64, .n_used = 6, .n_shared = 1, .ff = 512, .n_hash = 0,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-20f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 4096,
        .n_kv_src = 4, .kv_src = {2, 6, 10, 12}, .n_idx_src = 7, .idx_src = {2, 6, 10, 12, 15, 18, 21},
        .cand_src = 12, .cand_topk_blocks = 64, .cand_block = 8,
        .n_engram = 2, .engram_layers = {1, 8}, .engram_heads = 4, .engram_dim = 128,
        .engram_ngram = 3, .engram_vocab = 100000,
        .n_dspark = 3, .dspark_block = 5, .n_targets = 3, .targets = {21, 22, 23},
        .markov_rank = 64, .dspark_experts = 16, .dspark_used = 2,
        .default_type = DSI_TYPE_Q4_K,
    },
    {
        .name = "bench-v41-q8",
        .desc = "bench-v41 with Q8_0 matrices (3.0 GiB)",
        .v41 = 1, .n_vocab = 2048,
        .n_layer = 24, .n_embd = 1024, .n_head = 16, .head_dim = 512, .rope_dim = 64, .q_lora = 512,
        .o_groups = 4, .o_lora = 256, .window = 128, .ctx = 65536,
        .ratios = {0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
        .idx_heads = 8, .idx_dim = 128, .idx_topk = 128,
        .n_expert = 64, .n_used = 6, .n_shared = 1, .ff = 512, .n_hash = 0,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-20f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 4096,
        .n_kv_src = 4, .kv_src = {2, 6, 10, 12}, .n_idx_src = 7, .idx_src = {2, 6, 10, 12, 15, 18, 21},
        .cand_src = 12, .cand_topk_blocks = 64, .cand_block = 8,
        .n_engram = 2, .engram_layers = {1, 8}, .engram_heads = 4, .engram_dim = 128,
        .engram_ngram = 3, .engram_vocab = 100000,
        .n_dspark = 3, .dspark_block = 5, .n_targets = 3, .targets = {21, 22, 23},
        .markov_rank = 64, .dspark_experts = 16, .dspark_used = 2,
        .default_type = DSI_TYPE_Q8_0,
    },
    {
        .name = "bench-v4",
        .desc = "V4-shaped bench model, 0.9 GiB (head_dim 512, ratios 4/128, 64 experts, hash layers, MTP)",
        .v41 = 0, .n_vocab = 2048,
        .n_layer = 12, .n_embd = 1024, .n_head = 16, .head_dim = 512, .rope_dim = 64, .q_lora = 512,
        .o_groups = 4, .o_lora = 256, .window = 128, .ctx = 65536,
        .ratios = {0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128},
        .idx_heads = 16, .idx_dim = 128, .idx_topk = 128,
        .n_expert = 64, .n_used = 6, .n_shared = 1, .ff = 512, .n_hash = 3,
        .hc = 4, .sinkhorn = 20,
        .rope_base = 10000.0f, .rope_base_c = 160000.0f, .yarn_factor = 16.0f, .beta_fast = 32.0f,
        .beta_slow = 1.0f, .eps = 1e-6f, .hc_eps = 1e-6f, .swiglu = 10.0f, .route = 1.5f,
        .yarn_orig = 4096, .n_mtp = 1, .cand_src = -1,
        .default_type = DSI_TYPE_Q4_K,
    },
};
#define N_CONFIGS (sizeof k_configs / sizeof k_configs[0])

/* Engram multipliers (model-spec §4.6): numpy.random.default_rng(10007·L).integers(0, bound,
 * size=max_ngram)·2+1 with bound = (INT64_MAX // compressed_vocab) // 2, computed once with
 * numpy 1.24 for the compressed vocabularies the built-in corpus yields (mkmodel checks
 * that it still does). */
typedef struct mult_entry {
    uint32_t layer, compressed_vocab, n;
    uint64_t m[4];
} mult_entry;
static const mult_entry k_mults[] = {
#include "multipliers.inc"
};

/* ------------------------------------------------------------------------------------ */
/* Deterministic generation                                                              */
/* ------------------------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Exact uniform in [-1, 1): a 24-bit integer scaled by 2^-23. */
static float unif(uint64_t *s) {
    int32_t v = (int32_t)(splitmix(s) >> 40) - (1 << 23);
    return (float)v * (1.0f / 8388608.0f);
}

enum {
    G_LINEAR,   /* uniform ±gain·sqrt(3/ne0): unit-variance outputs for unit-RMS inputs */
    G_UNIFORM,  /* uniform ±a */
    G_NORM,     /* 1 ± a */
    G_HC_BASE,  /* mHC base: pre/post ±a, comb: identity bias +1 on the diagonal */
    G_HC_SCALE, /* mHC scale [3] (or [1] for heads) */
    G_TID2EID,  /* k distinct experts per token */
};

typedef struct spec {
    char name[96];
    int32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    int gen;
    float a;          /* gain / amplitude */
    uint32_t hc;      /* G_HC_BASE */
    uint32_t n_expert;/* G_TID2EID */
    uint64_t seed;
} spec;

typedef struct plan {
    spec *s;
    uint32_t n, cap;
    uint64_t seed;
    int32_t mat_type;  /* type of the large matrices */
    int32_t embd_type;
} plan;

static int type_fits(int32_t type, int64_t ne0) {
    uint64_t b;
    return dsii_type_row_size(type, ne0, &b);
}

static spec *add(plan *p, int32_t type, uint32_t nd, int64_t ne0, int64_t ne1, int64_t ne2, int gen,
                 float a, const char *fmt, ...) DSII_PRINTF(9, 10);
static spec *add(plan *p, int32_t type, uint32_t nd, int64_t ne0, int64_t ne1, int64_t ne2, int gen,
                 float a, const char *fmt, ...) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->s = realloc(p->s, sizeof *p->s * p->cap);
        if (!p->s) {
            fprintf(stderr, "dsinfer-mkmodel: out of memory\n");
            exit(1);
        }
    }
    spec *s = &p->s[p->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    /* a row length the type cannot hold falls back to q8_0, then f16 (docs/synthetic-models.md) */
    if (!type_fits(type, ne0)) type = type_fits(DSI_TYPE_Q8_0, ne0) ? DSI_TYPE_Q8_0 : DSI_TYPE_F16;
    s->type = type;
    s->n_dims = nd;
    s->ne[0] = ne0;
    s->ne[1] = ne1;
    s->ne[2] = ne2;
    s->ne[3] = 1;
    s->gen = gen;
    s->a = a;
    s->seed = p->seed ^ fnv1a(s->name);
    return s;
}

#define F32 DSI_TYPE_F32
#define MAT(p) ((p)->mat_type)

static void add_layer(plan *p, const mk_config *c, const char *pfx, uint32_t ratio, int draft,
                      int kv_src, int idx_src, int is_hash, int engram, uint32_t E, uint32_t k) {
    const int64_t D = c->n_embd, Q = c->q_lora, H = c->n_head, hd = c->head_dim, G = c->o_groups;
    const int64_t R = c->o_lora, hc = c->hc, M = (2 + hc) * hc, IH = c->idx_heads, ID = c->idx_dim;
    const int64_t F = c->ff, SF = (int64_t)c->n_shared * F, V = c->n_vocab;
    add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "%sattn_norm.weight", pfx);
    add(p, MAT(p), 2, D, Q, 1, G_LINEAR, 1.0f, "%sattn_q_a.weight", pfx);
    add(p, F32, 1, Q, 1, 1, G_NORM, 0.1f, "%sattn_q_a_norm.weight", pfx);
    add(p, MAT(p), 2, Q, H * hd, 1, G_LINEAR, 1.0f, "%sattn_q_b.weight", pfx);
    add(p, MAT(p), 2, D, hd, 1, G_LINEAR, 1.0f, "%sattn_kv.weight", pfx);
    add(p, F32, 1, hd, 1, 1, G_NORM, 0.1f, "%sattn_kv_a_norm.weight", pfx);
    add(p, F32, 1, H, 1, 1, G_UNIFORM, 1.0f, "%sattn_sinks.weight", pfx);
    add(p, MAT(p), 2, H * hd / G, G * R, 1, G_LINEAR, 1.0f, "%sattn_output_a.weight", pfx);
    add(p, MAT(p), 2, G * R, D, 1, G_LINEAR, 0.5f, "%sattn_output_b.weight", pfx);
    for (int f = 0; f < 2; f++) {
        const char *w = f ? "ffn" : "attn";
        add(p, F32, 2, hc * D, M, 1, G_LINEAR, 1.0f, "%shc_%s_fn.weight", pfx, w);
        spec *b = add(p, F32, 1, M, 1, 1, G_HC_BASE, 0.5f, "%shc_%s_base.weight", pfx, w);
        b->hc = (uint32_t)hc;
        add(p, F32, 1, 3, 1, 1, G_HC_SCALE, 0.0f, "%shc_%s_scale.weight", pfx, w);
    }
    (void)draft;
    if (!c->v41 && ratio > 0) {
        const int64_t co = ratio == 4 ? 2 : 1;
        add(p, F32, 2, co * hd, ratio, 1, G_UNIFORM, 0.5f, "%sattn_compressor_ape.weight", pfx);
        add(p, F32, 2, D, co * hd, 1, G_LINEAR, 1.0f, "%sattn_compressor_kv.weight", pfx);
        add(p, F32, 2, D, co * hd, 1, G_LINEAR, 1.0f, "%sattn_compressor_gate.weight", pfx);
        add(p, F32, 1, hd, 1, 1, G_NORM, 0.1f, "%sattn_compressor_norm.weight", pfx);
        if (ratio == 4) {
            add(p, F32, 2, Q, IH * ID, 1, G_LINEAR, 1.0f, "%sindexer.attn_q_b.weight", pfx);
            add(p, F32, 2, D, IH, 1, G_LINEAR, 1.0f, "%sindexer.proj.weight", pfx);
            add(p, F32, 2, 2 * ID, 4, 1, G_UNIFORM, 0.5f, "%sindexer_compressor_ape.weight", pfx);
            add(p, F32, 2, D, 2 * ID, 1, G_LINEAR, 1.0f, "%sindexer_compressor_kv.weight", pfx);
            add(p, F32, 2, D, 2 * ID, 1, G_LINEAR, 1.0f, "%sindexer_compressor_gate.weight", pfx);
            add(p, F32, 1, ID, 1, 1, G_NORM, 0.1f, "%sindexer_compressor_norm.weight", pfx);
        }
    }
    if (c->v41 && kv_src) {
        add(p, F32, 2, D, hd, 1, G_LINEAR, 1.0f, "%sattn_compressor_kv.weight", pfx);
        if (ratio > 1) add(p, F32, 2, D, hd, 1, G_LINEAR, 1.0f, "%sattn_compressor_gate.weight", pfx);
        add(p, F32, 1, hd, 1, 1, G_NORM, 0.1f, "%sattn_compressor_norm.weight", pfx);
        add(p, F32, 2, hd, ID, 1, G_LINEAR, 1.0f, "%sindexer.attn_k.weight", pfx);
        add(p, F32, 1, ID, 1, 1, G_NORM, 0.1f, "%sindexer.k_norm.weight", pfx);
    }
    if (c->v41 && idx_src) {
        add(p, F32, 2, Q, IH * ID, 1, G_LINEAR, 1.0f, "%sindexer.attn_q_b.weight", pfx);
        add(p, F32, 2, D, IH, 1, G_LINEAR, 1.0f, "%sindexer.proj.weight", pfx);
    }
    add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "%sffn_norm.weight", pfx);
    add(p, F32, 2, D, E, 1, G_LINEAR, 2.0f, "%sffn_gate_inp.weight", pfx);
    if (is_hash) {
        spec *t = add(p, DSI_TYPE_I32, 2, k, V, 1, G_TID2EID, 0.0f, "%sffn_gate_tid2eid.weight", pfx);
        t->n_expert = E;
    } else {
        add(p, F32, 1, E, 1, 1, G_UNIFORM, 0.1f, "%sexp_probs_b.bias", pfx);
    }
    add(p, MAT(p), 3, D, F, E, G_LINEAR, 1.0f, "%sffn_gate_exps.weight", pfx);
    add(p, MAT(p), 3, D, F, E, G_LINEAR, 1.0f, "%sffn_up_exps.weight", pfx);
    add(p, MAT(p), 3, F, D, E, G_LINEAR, 0.5f, "%sffn_down_exps.weight", pfx);
    add(p, MAT(p), 2, D, SF, 1, G_LINEAR, 1.0f, "%sffn_gate_shexp.weight", pfx);
    add(p, MAT(p), 2, D, SF, 1, G_LINEAR, 1.0f, "%sffn_up_shexp.weight", pfx);
    add(p, MAT(p), 2, SF, D, 1, G_LINEAR, 0.5f, "%sffn_down_shexp.weight", pfx);
    (void)engram;
}

static int in_u32(const uint32_t *a, uint32_t n, uint32_t v) {
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

static int is_prime(uint64_t n) {
    if (n < 2) return 0;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return 0;
    return 1;
}

/* Engram primes (model-spec §4.6): per layer, per n-gram size, per head, the next unused
 * prime above engram_vocab-1 (the search restarts per n-gram size; primes never repeat). */
static void engram_primes(const mk_config *c, uint64_t *primes, uint64_t *offsets, uint64_t *rows) {
    uint64_t seen[256];
    uint32_t n_seen = 0, o = 0;
    for (uint32_t l = 0; l < c->n_engram; l++) {
        uint64_t acc = 0;
        for (uint32_t ng = 2; ng <= c->engram_ngram; ng++) {
            uint64_t cur = c->engram_vocab - 1;
            for (uint32_t h = 0; h < c->engram_heads; h++) {
                for (;;) {
                    cur++;
                    if (!is_prime(cur)) continue;
                    int dup = 0;
                    for (uint32_t s = 0; s < n_seen; s++)
                        if (seen[s] == cur) dup = 1;
                    if (!dup) break;
                }
                seen[n_seen++] = cur;
                primes[o] = cur;
                offsets[o] = acc;
                acc += cur;
                o++;
            }
        }
        rows[l] = acc;
    }
}

static void build_plan(plan *p, const mk_config *c, const uint64_t *engram_rows) {
    const int64_t D = c->n_embd, V = c->n_vocab, hc = c->hc;
    add(p, p->embd_type, 2, D, V, 1, G_UNIFORM, 1.7320508f, "token_embd.weight");
    for (uint32_t i = 0; i < c->n_layer; i++) {
        char pfx[32];
        snprintf(pfx, sizeof pfx, "blk.%u.", i);
        int eg = -1;
        for (uint32_t e = 0; e < c->n_engram; e++)
            if (c->engram_layers[e] == i) eg = (int)e;
        add_layer(p, c, pfx, c->ratios[i], 0, in_u32(c->kv_src, c->n_kv_src, i),
                  in_u32(c->idx_src, c->n_idx_src, i), !c->v41 && i < c->n_hash, eg >= 0,
                  c->n_expert, c->n_used);
        if (eg >= 0) {
            const int64_t K = c->engram_dim, C = (int64_t)(c->engram_ngram - 1) * c->engram_heads;
            add(p, DSI_TYPE_FP8_E4M3_R32, 2, K, (int64_t)engram_rows[eg], 1, G_UNIFORM, 1.7320508f,
                "%sengram.embd.weight", pfx);
            add(p, MAT(p), 2, C * K, (hc + 1) * D, 1, G_LINEAR, 0.5f, "%sengram.wkv.weight", pfx);
            add(p, F32, 2, D, hc, 1, G_NORM, 0.5f, "%sengram.q.weight", pfx);
            add(p, F32, 2, D, hc, 1, G_NORM, 0.5f, "%sengram.k.weight", pfx);
        }
    }
    if (c->n_mtp) {
        add_layer(p, c, "mtp.0.", 0, 1, 0, 0, 0, 0, c->n_expert, c->n_used);
        add(p, MAT(p), 2, D, D, 1, G_LINEAR, 0.7f, "mtp.0.e_proj.weight");
        add(p, MAT(p), 2, D, D, 1, G_LINEAR, 0.7f, "mtp.0.h_proj.weight");
        add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "mtp.0.enorm.weight");
        add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "mtp.0.hnorm.weight");
        add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "mtp.0.norm.weight");
        add(p, F32, 2, hc * D, hc, 1, G_LINEAR, 1.0f, "mtp.0.hc_head_fn.weight");
        add(p, F32, 1, hc, 1, 1, G_UNIFORM, 0.5f, "mtp.0.hc_head_base.weight");
        add(p, F32, 1, 1, 1, 1, G_HC_SCALE, 0.0f, "mtp.0.hc_head_scale.weight");
    }
    for (uint32_t d = 0; d < c->n_dspark; d++) {
        char pfx[32];
        snprintf(pfx, sizeof pfx, "mtp.%u.", d);
        add_layer(p, c, pfx, 0, 1, 0, 0, 0, 0, c->dspark_experts, c->dspark_used);
        if (d == 0) {
            add(p, MAT(p), 2, (int64_t)c->n_targets * D, D, 1, G_LINEAR, 1.0f, "mtp.0.main_proj.weight");
            add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "mtp.0.main_norm.weight");
        }
        if (d + 1 == c->n_dspark) {
            const int64_t r = c->markov_rank;
            add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "mtp.%u.norm.weight", d);
            add(p, p->embd_type, 2, r, V, 1, G_UNIFORM, 1.7320508f, "mtp.%u.markov_embd.weight", d);
            add(p, MAT(p), 2, r, V, 1, G_LINEAR, 0.5f, "mtp.%u.markov_head.weight", d);
            add(p, F32, 2, D + r, 1, 1, G_LINEAR, 1.0f, "mtp.%u.confidence_proj.weight", d);
        }
    }
    add(p, F32, 1, D, 1, 1, G_NORM, 0.1f, "output_norm.weight");
    add(p, MAT(p), 2, D, V, 1, G_LINEAR, 3.0f, "output.weight");
    if (!c->v41) {
        add(p, F32, 2, hc * D, hc, 1, G_LINEAR, 1.0f, "output_hc_fn.weight");
        add(p, F32, 1, hc, 1, 1, G_UNIFORM, 0.5f, "output_hc_base.weight");
        add(p, F32, 1, 1, 1, 1, G_HC_SCALE, 0.0f, "output_hc_scale.weight");
    }
}

/* One row of f32 values for row r of the flattened tensor. */
static void gen_row(const spec *s, uint64_t *st, int64_t r, float *out) {
    const int64_t n = s->ne[0];
    switch (s->gen) {
    case G_LINEAR: {
        const float a = (float)(s->a * sqrt(3.0 / (double)n));
        for (int64_t i = 0; i < n; i++) out[i] = unif(st) * a;
        break;
    }
    case G_UNIFORM:
        for (int64_t i = 0; i < n; i++) out[i] = unif(st) * s->a;
        break;
    case G_NORM:
        for (int64_t i = 0; i < n; i++) out[i] = 1.0f + unif(st) * s->a;
        break;
    case G_HC_BASE: {
        const int64_t hc = s->hc;
        for (int64_t i = 0; i < n; i++) {
            float v = unif(st) * s->a;
            if (i >= 2 * hc) {
                int64_t c = i - 2 * hc; /* comb[i][j] at c = i*hc + j */
                if (c / hc == c % hc) v += 1.0f;
            }
            out[i] = v;
        }
        break;
    }
    case G_HC_SCALE: {
        static const float base[3] = {0.5f, 0.5f, 1.0f};
        for (int64_t i = 0; i < n; i++) out[i] = base[i % 3] + unif(st) * 0.1f;
        break;
    }
    default:
        (void)r;
        for (int64_t i = 0; i < n; i++) out[i] = 0.0f;
    }
}

/* Fills the tensor bytes (called by the GGUF writer while it writes the file). */
static int fill_tensor(void *user, void *dst, uint64_t nbytes) {
    const spec *s = user;
    uint64_t st = s->seed;
    const int64_t n0 = s->ne[0], rows = s->ne[1] * s->ne[2] * s->ne[3];
    uint8_t *o = dst;
    if (s->gen == G_TID2EID) {
        /* each token gets k distinct experts */
        for (int64_t t = 0; t < rows; t++) {
            int32_t *row = (int32_t *)(void *)(o + (size_t)t * (size_t)n0 * 4);
            for (int64_t j = 0; j < n0; j++) {
                int32_t e;
                int dup;
                do {
                    e = (int32_t)(splitmix(&st) % s->n_expert);
                    dup = 0;
                    for (int64_t q = 0; q < j; q++)
                        if (row[q] == e) dup = 1;
                } while (dup);
                row[j] = e;
            }
        }
        return 0;
    }
    uint64_t rb = 0;
    if (!dsii_type_row_size(s->type, n0, &rb) || rb * (uint64_t)rows != nbytes) return 1;
    const int tile = s->type == DSI_TYPE_FP8_E4M3_B128 ? 128 : s->type == DSI_TYPE_FP8_E4M3_B32 ? 32 : 1;
    float *buf = malloc(sizeof(float) * (size_t)n0 * (size_t)tile);
    if (!buf) return 1;
    int rc = 0;
    for (int64_t r = 0; r < rows && !rc; r += tile) {
        int64_t nr = rows - r < tile ? rows - r : tile;
        for (int64_t q = 0; q < nr; q++) gen_row(s, &st, r + q, buf + q * n0);
        uint8_t *d = o + (size_t)r * rb;
        if (s->type == DSI_TYPE_F32) {
            memcpy(d, buf, (size_t)n0 * 4);
        } else if (s->type == DSI_TYPE_F16) {
            for (int64_t i = 0; i < n0; i++) {
                uint16_t h = dsii_f32_to_f16(buf[i]);
                memcpy(d + 2 * i, &h, 2);
            }
        } else if (s->type == DSI_TYPE_BF16) {
            for (int64_t i = 0; i < n0; i++) {
                uint16_t h = dsii_f32_to_bf16(buf[i]);
                memcpy(d + 2 * i, &h, 2);
            }
        } else if (tile > 1) {
            rc = dsii_quantize_fp8_2d(s->type, buf, n0, nr, d, NULL) != DSI_OK;
        } else {
            rc = dsii_quantize_row(s->type, buf, d, n0, NULL) != DSI_OK;
        }
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Metadata                                                                              */
/* ------------------------------------------------------------------------------------ */

/* The canonical description of a configuration, for the layout writer (lib/model/emit.h). */
static void build_hparams(const mk_config *c, const mk_vocab *v, const int32_t *tmap, uint32_t n_comp,
                          const uint64_t *primes, const uint64_t *offsets, const uint64_t *mults,
                          const uint64_t *rows, dsii_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->arch = c->v41 ? DSI_ARCH_DEEPSEEK41 : DSI_ARCH_DEEPSEEK4;
    hp->n_layer = c->n_layer;
    hp->n_embd = c->n_embd;
    hp->n_vocab = c->n_vocab;
    hp->n_ctx_train = c->ctx;
    hp->n_head = c->n_head;
    hp->head_dim = c->head_dim;
    hp->rope_dim = c->rope_dim;
    hp->nope_dim = c->head_dim - c->rope_dim;
    hp->q_lora_rank = c->q_lora;
    hp->o_lora_rank = c->o_lora;
    hp->o_groups = c->o_groups;
    hp->window = c->window;
    hp->idx_n_head = c->idx_heads;
    hp->idx_head_dim = c->idx_dim;
    hp->idx_topk = c->idx_topk;
    hp->candidate_source = c->cand_src;
    hp->candidate_topk_blocks = c->cand_topk_blocks;
    hp->candidate_block_size = c->cand_block;
    hp->n_expert = c->n_expert;
    hp->n_expert_used = c->n_used;
    hp->expert_ff = c->ff;
    hp->n_expert_shared = c->n_shared;
    hp->n_hash_layer = c->n_hash;
    hp->route_scale = c->route;
    hp->rope_base = c->rope_base;
    hp->rope_base_compress = c->rope_base_c;
    hp->yarn_factor = c->yarn_factor;
    hp->yarn_orig_ctx = c->yarn_orig;
    hp->yarn_beta_fast = c->beta_fast;
    hp->yarn_beta_slow = c->beta_slow;
    hp->rms_eps = c->eps;
    hp->hc_mult = c->hc;
    hp->hc_mix = (2 + c->hc) * c->hc;
    hp->hc_sinkhorn_iters = c->sinkhorn;
    hp->hc_eps = c->hc_eps;
    hp->hc_lagged = c->v41;
    for (uint32_t i = 0; i < c->n_layer; i++) {
        dsii_layer_hparams *l = &hp->layer[i];
        l->compress_ratio = c->ratios[i];
        l->swiglu_limit = l->swiglu_limit_shexp = c->swiglu;
        l->n_expert = c->n_expert;
        l->n_expert_used = c->n_used;
        l->is_kv_source = c->v41 && in_u32(c->kv_src, c->n_kv_src, i);
        l->is_index_source = c->v41 && in_u32(c->idx_src, c->n_idx_src, i);
        l->engram_index = -1;
    }
    hp->n_draft = c->n_mtp + c->n_dspark;
    hp->has_mtp = c->n_mtp > 0;
    hp->has_dspark = c->n_dspark > 0;
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        hp->draft_layer[d].swiglu_limit = hp->draft_layer[d].swiglu_limit_shexp = c->swiglu;
        hp->draft_layer[d].engram_index = -1;
    }
    if (c->n_dspark) {
        dsii_dspark_hparams *d = &hp->dspark;
        d->block_size = c->dspark_block;
        d->noise_token = v->special[MK_SP_PAD];
        d->n_target = c->n_targets;
        memcpy(d->target_layer_ids, c->targets, sizeof(uint32_t) * c->n_targets);
        d->markov_rank = c->markov_rank;
        d->n_expert = c->dspark_experts;
        d->n_expert_used = c->dspark_used;
    }
    if (c->n_engram) {
        dsii_engram_hparams *e = &hp->engram;
        hp->has_engram = 1;
        e->n_layer = c->n_engram;
        memcpy(e->layer_ids, c->engram_layers, sizeof(uint32_t) * c->n_engram);
        e->n_head = c->engram_heads;
        e->key_length = c->engram_dim;
        e->max_ngram = c->engram_ngram;
        e->n_cols = (c->engram_ngram - 1) * c->engram_heads;
        e->compressed_vocab = n_comp;
        e->pad_id = (uint32_t)tmap[v->special[MK_SP_PAD]];
        e->n_token_map = v->n;
        e->multipliers = mults;
        e->primes = primes;
        e->offsets = offsets;
        e->token_map = tmap;
        for (uint32_t l = 0; l < c->n_engram; l++) {
            e->rows[l] = rows[l];
            hp->layer[c->engram_layers[l]].engram_index = (int32_t)l;
        }
    }
}

#define W(x)                                                                  \
    do {                                                                      \
        if ((x) != DSI_OK) {                                                  \
            fprintf(stderr, "dsinfer-mkmodel: %s\n", err.msg);                 \
            return 1;                                                         \
        }                                                                     \
    } while (0)

static int write_tokenizer(dsii_gguf_writer *w, const mk_vocab *v) {
    dsii_error err;
    W(dsii_gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2", &err));
    W(dsii_gguf_writer_add_string(w, "tokenizer.ggml.pre", "joyai-llm", &err));
    W(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", (const char *const *)v->text, NULL, v->n, &err));
    W(dsii_gguf_writer_add_array(w, "tokenizer.ggml.token_type", DSII_GGUF_I32, v->type, v->n, &err));
    W(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL, v->n_merges, &err));
    W(dsii_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->special[MK_SP_BOS], &err));
    W(dsii_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->special[MK_SP_EOS], &err));
    W(dsii_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->special[MK_SP_PAD], &err));
    W(dsii_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1, &err));
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* main                                                                                  */
/* ------------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    int32_t type;
} k_types[] = {
    {"f32", DSI_TYPE_F32}, {"f16", DSI_TYPE_F16}, {"bf16", DSI_TYPE_BF16}, {"q8_0", DSI_TYPE_Q8_0},
    {"q4_k", DSI_TYPE_Q4_K}, {"q2_k", DSI_TYPE_Q2_K}, {"mxfp4", DSI_TYPE_MXFP4}, {"fp8", -1},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer-mkmodel --config NAME [--seed N] [--type T] [--layout L] [--no-mtp]\n"
            "                       -o FILE.gguf [--mtp-out FILE] [--also FILE2]\n"
            "       dsinfer-mkmodel --import DUMP -o FILE.gguf [--also FILE2]\n"
            "       dsinfer-mkmodel --list\n"
            "T: f32 f16 bf16 q8_0 q4_k q2_k mxfp4 fp8 (type of the large matrices; fp8 =\n"
            "   fp8_e4m3_b128 for deepseek4, fp8_e4m3_b32 for deepseek41; native layout only),\n"
            "   or any other type the library can write: q4_0 q4_1 q5_0 q5_1 q3_k q5_k q6_k\n"
            "   iq4_nl iq4_xs iq3_xxs iq3_s iq2_xxs iq2_xs iq2_s iq1_s iq1_m (docs/tensor-types.md)\n"
            "L: llama.cpp (default), ds4, native (docs/model-files.md 7). llama.cpp and ds4 keep\n"
            "   the V4 MTP block in a second file: --mtp-out, default FILE-mtp.gguf.\n");
}

static uint64_t plan_bytes(const plan *p, uint64_t *params) {
    uint64_t total = 0;
    *params = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        uint64_t b = 0;
        dsii_type_nbytes(p->s[i].type, p->s[i].ne, p->s[i].n_dims, &b);
        total += b;
        *params += (uint64_t)p->s[i].ne[0] * (uint64_t)p->s[i].ne[1] * (uint64_t)p->s[i].ne[2];
    }
    return total;
}

static int make_plan(const mk_config *c, int32_t type, uint64_t seed, plan *p,
                     uint64_t *primes, uint64_t *offsets, uint64_t *rows) {
    memset(p, 0, sizeof *p);
    p->seed = splitmix(&seed);
    if (type == -1) type = c->v41 ? DSI_TYPE_FP8_E4M3_B32 : DSI_TYPE_FP8_E4M3_B128;
    p->mat_type = type;
    p->embd_type = type == DSI_TYPE_F32 ? DSI_TYPE_F32 : DSI_TYPE_F16;
    if (c->n_engram) engram_primes(c, primes, offsets, rows);
    build_plan(p, c, rows);
    return 0;
}

int main(int argc, char **argv) {
    const char *config = NULL, *out = NULL, *also = NULL, *import = NULL, *mtp_out = NULL;
    uint64_t seed = 1;
    int32_t type = 0;
    int have_type = 0, list = 0, no_mtp = 0;
    int layout = DSII_LAYOUT_LLAMACPP;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) {
            list = 1;
        } else if (!strcmp(argv[i], "--import") && i + 1 < argc) {
            import = argv[++i]; /* a trained model's weights dump (tools/train/export.py) */
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            config = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *e;
            seed = strtoull(argv[++i], &e, 0);
            if (*e) {
                fprintf(stderr, "dsinfer-mkmodel: bad seed '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            const char *t = argv[++i];
            have_type = 0;
            for (size_t k = 0; k < sizeof k_types / sizeof k_types[0]; k++)
                if (!strcmp(t, k_types[k].name)) type = k_types[k].type, have_type = 1;
            for (int32_t id = 0; id < 64 && !have_type; id++) { /* further ggml types */
                const dsii_type_traits *tr = dsii_type_get(id);
                if (tr && tr->quantize_row && tr->is_quantized && !strcmp(t, tr->name))
                    type = id, have_type = 1;
            }
            if (!have_type) {
                fprintf(stderr, "dsinfer-mkmodel: unknown type '%s'\n", t);
                usage(stderr);
                return 2;
            }
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
            layout = dsii_layout_parse(argv[++i]);
            if (layout < 0) {
                fprintf(stderr, "dsinfer-mkmodel: unknown layout '%s' (llama.cpp, ds4, native)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--mtp-out") && i + 1 < argc) {
            mtp_out = argv[++i];
        } else if (!strcmp(argv[i], "--no-mtp")) {
            no_mtp = 1;
        } else if (!strcmp(argv[i], "--also") && i + 1 < argc) {
            also = argv[++i]; /* a second copy (build systems: $BUILD/models/) */
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "dsinfer-mkmodel: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (list) {
        printf("%-14s %-10s %6s %12s %12s  %s\n", "config", "arch", "type", "params", "bytes", "description");
        for (size_t i = 0; i < N_CONFIGS; i++) {
            const mk_config *c = &k_configs[i];
            uint64_t primes[64], offsets[64], rows[8];
            plan p;
            make_plan(c, c->default_type, 1, &p, primes, offsets, rows);
            uint64_t params = 0, bytes = plan_bytes(&p, &params);
            printf("%-14s %-10s %6s %12" PRIu64 " %12" PRIu64 "  %s (%.1f MiB)\n", c->name,
                   c->v41 ? "deepseek41" : "deepseek4", dsi_type_name(c->default_type), params,
                   bytes, c->desc, (double)bytes / (1024.0 * 1024.0));
            free(p.s);
        }
        return 0;
    }
    if (import && out) return mk_import(import, out, also);
    if (!config || !out) {
        usage(stderr);
        return 2;
    }
    const mk_config *c = NULL;
    for (size_t i = 0; i < N_CONFIGS; i++)
        if (!strcmp(k_configs[i].name, config)) c = &k_configs[i];
    if (!c) {
        fprintf(stderr, "dsinfer-mkmodel: unknown config '%s' (see --list)\n", config);
        return 2;
    }
    if (!have_type) type = c->default_type;

    mk_vocab v;
    int rc = mk_vocab_build(c->n_vocab, &v);
    if (rc) {
        fprintf(stderr, "dsinfer-mkmodel: cannot learn %u tokens from the built-in corpus (%d)\n", c->n_vocab, rc);
        return 1;
    }
    uint32_t n_comp = 0;
    int32_t *tmap = mk_token_map(&v, &n_comp);
    uint64_t primes[64], offsets[64], rows[8], mults[32];
    plan p;
    make_plan(c, type, seed, &p, primes, offsets, rows);
    for (uint32_t l = 0; l < c->n_engram; l++) {
        const mult_entry *me = NULL;
        for (size_t i = 0; i < sizeof k_mults / sizeof k_mults[0]; i++)
            if (k_mults[i].layer == c->engram_layers[l] && k_mults[i].compressed_vocab == n_comp &&
                k_mults[i].n == c->engram_ngram)
                me = &k_mults[i];
        if (me) {
            memcpy(mults + l * c->engram_ngram, me->m, sizeof(uint64_t) * c->engram_ngram);
        } else {
            /* not in the table (the corpus changed): odd values below the §4.6 bound from
             * our own generator — valid, but not numpy's stream */
            fprintf(stderr, "dsinfer-mkmodel: note: no numpy multipliers for layer %u, compressed vocab %u; "
                            "using splitmix values\n", c->engram_layers[l], n_comp);
            uint64_t bound = ((uint64_t)INT64_MAX / n_comp) / 2, s = 10007ull * c->engram_layers[l];
            for (uint32_t j = 0; j < c->engram_ngram; j++)
                mults[l * c->engram_ngram + j] = (splitmix(&s) % bound) * 2 + 1;
        }
    }

    if (layout != DSII_LAYOUT_NATIVE && (type == -1 || p.mat_type >= DSI_TYPE_FP8_E4M3_B128)) {
        fprintf(stderr, "dsinfer-mkmodel: the fp8 types exist only in the native layout (--layout native)\n");
        return 2;
    }
    dsii_hparams hp;
    build_hparams(c, &v, tmap, n_comp, primes, offsets, mults, rows, &hp);
    dsii_error err;
    dsii_emitter *em = NULL;
    if (dsii_emitter_create(&hp, layout, c->name, no_mtp, &em, &err) != DSI_OK) {
        fprintf(stderr, "dsinfer-mkmodel: %s\n", err.msg);
        return 1;
    }
    for (int part = 0; part < DSII_EMIT_PARTS && !rc; part++)
        if (dsii_emitter_has_part(em, part)) rc = write_tokenizer(dsii_emitter_writer(em, part), &v);
    for (uint32_t i = 0; i < p.n && !rc; i++) {
        spec *s = &p.s[i];
        if (dsii_emitter_add(em, s->name, s->type, s->n_dims, s->ne, fill_tensor, s, &err) != DSI_OK) {
            fprintf(stderr, "dsinfer-mkmodel: %s\n", err.msg);
            rc = 1;
        }
    }
    char mtp_path[4096];
    if (mtp_out) snprintf(mtp_path, sizeof mtp_path, "%s", mtp_out);
    else dsii_emit_draft_path(out, mtp_path, sizeof mtp_path);
    for (int part = 0; part < DSII_EMIT_PARTS && !rc; part++) {
        if (!dsii_emitter_has_part(em, part)) continue;
        const char *path = part == DSII_EMIT_MAIN ? out : mtp_path;
        if (dsii_emitter_write(em, part, path, &err) != DSI_OK) {
            fprintf(stderr, "dsinfer-mkmodel: %s\n", err.msg);
            remove(path);
            rc = 1;
        }
    }
    if (!rc && also) {
        /* make the parent folder (one level: $BUILD/models) */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", also);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = '\0';
            mkdir(dir, 0777);
        }
    }
    if (!rc && also && dsii_emitter_write(em, DSII_EMIT_MAIN, also, &err) != DSI_OK) {
        fprintf(stderr, "dsinfer-mkmodel: %s\n", err.msg);
        remove(also);
        rc = 1;
    }
    if (!rc) {
        uint64_t params = 0;
        plan_bytes(&p, &params);
        fprintf(stderr, "dsinfer-mkmodel: wrote %s (%s, %s layout, %u tokens, compressed vocab %u, %" PRIu64
                        " params, %" PRIu64 " bytes)\n",
                out, c->name, dsii_layout_name(layout), v.n, n_comp, params, dsii_emitter_size(em, DSII_EMIT_MAIN));
        if (dsii_emitter_has_part(em, DSII_EMIT_DRAFT))
            fprintf(stderr, "dsinfer-mkmodel: wrote %s (the MTP block, %" PRIu64 " bytes; load it with draft_path)\n",
                    mtp_path, dsii_emitter_size(em, DSII_EMIT_DRAFT));
    }
    dsii_emitter_free(em);
    free(p.s);
    free(tmap);
    mk_vocab_free(&v);
    return rc;
}
