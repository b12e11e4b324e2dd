/*
 * dsinfer-convert: a DeepSeek V4 Flash / V4.1 Flash Hugging Face checkpoint directory ->
 * one GGUF (plus the MTP file in the llama.cpp and ds4 layouts). docs/converting.md.
 *
 *   dsinfer-convert HF_DIR -o OUT.gguf [--layout llama.cpp|ds4|native] [--type T]
 *                   [--type-CLASS T ...] [--no-mtp] [--mtp-out FILE] [--name NAME] [--quiet]
 *
 * Streams tensor by tensor and row run by row run (no tensor is ever whole in memory; peak
 * memory is a few tens of MiB whatever the checkpoint's size), reads with pread, writes
 * deterministically, and carries FP8 (E4M3 + E8M0 block scales) and FP4 (E2M1 + E8M0 per 32)
 * weights over without requantization where the layout has their types.
 */
#define _POSIX_C_SOURCE 200809L
#include "convert.h"
#include "engram_norm.h"
#include "npy_rng.h"
#include "safetensors.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "model/emit.h"
#include "quant/fp.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------ */
/* errors                                                                                 */
/* ------------------------------------------------------------------------------------ */

static char g_err[2048];

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

/* ------------------------------------------------------------------------------------ */
/* tensor classes and types                                                              */
/* ------------------------------------------------------------------------------------ */

enum cls {
    CL_VEC,     /* norms, biases, sinks, mHC base / scale: always f32 */
    CL_APE,     /* compressor ape */
    CL_SMALL,   /* mHC fn, compressor, indexer, router, Engram q/k, DSpark confidence */
    CL_ATTN,    /* attention projections */
    CL_SHEXP,   /* shared expert */
    CL_EXPERTS, /* routed experts */
    CL_HEAD,    /* output head */
    CL_EMBD,    /* token embedding, DSpark markov embedding */
    CL_ENGRAM,  /* Engram wkv */
    CL_DRAFT,   /* MTP e_proj / h_proj, DSpark main_proj / markov_head */
    CL_TABLE,   /* Engram tables */
    CL_I32,     /* tid2eid */
    CL_COUNT
};
static const char *const k_cls_name[CL_COUNT] = {"vec", "ape", "small", "attn", "shexp", "experts",
                                                  "head", "embd", "engram", "draft", "table", "i32"};

static const struct {
    const char *name;
    int32_t type;
} k_types[] = {
    {"auto", -1}, {"f32", DSI_TYPE_F32}, {"f16", DSI_TYPE_F16}, {"bf16", DSI_TYPE_BF16},
    {"q8_0", DSI_TYPE_Q8_0}, {"q4_k", DSI_TYPE_Q4_K}, {"q2_k", DSI_TYPE_Q2_K},
    {"iq2_xxs", DSI_TYPE_IQ2_XXS}, {"mxfp4", DSI_TYPE_MXFP4},
};

static int parse_type(const char *s, int32_t *t) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (!strcmp(s, k_types[i].name)) {
            *t = k_types[i].type;
            return 0;
        }
    /* any further type lib/quant can write (q4_0 ... iq1_m) */
    const dsii_type_traits *tr = dsii_type_get(dsii_type_by_name(s));
    if (tr && tr->is_quantized && tr->quantize_row && tr->type < 1024) {
        *t = tr->type;
        return 0;
    }
    return -1;
}

/* ------------------------------------------------------------------------------------ */
/* sources                                                                               */
/* ------------------------------------------------------------------------------------ */

enum kind {
    K_PLAIN,   /* one tensor: F32 / BF16 / F16 (or I64 / I32 for tid2eid) */
    K_FP8,     /* F8_E4M3 [out, in] + .scale F8_E8M0 [ceil(out/B), ceil(in/B)] */
    K_TABLE,   /* F8_E4M3 [rows, K] + .scale F8_E8M0 [rows, K/32] (Engram) */
    K_FP4,     /* experts: E x (I8 [out, in/2] + .scale F8_E8M0 [out, in/32]) */
};

typedef struct otensor {
    char name[96];         /* native GGUF name */
    int cls;
    int kind;
    int32_t type;          /* output type */
    uint32_t n_dims;
    int64_t ne[4];
    int64_t in, out;       /* row length; rows per expert (K_FP4) */
    uint32_t n_exp;
    uint32_t blk;          /* K_FP8 tile size */
    const st_tensor *w, *s;
    const st_tensor **ew, **es; /* K_FP4 */
    const st_set *set;
} otensor;

/* An expected tensor's shape check against the checkpoint. */
static int check_shape(const st_set *set, const st_tensor *t, uint32_t nd, const int64_t *want, const char *why) {
    int ok = t->n_dims == nd;
    for (uint32_t i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
    if (ok) return 0;
    char a[96], b[96];
    st_tensor w = {.n_dims = nd};
    for (uint32_t i = 0; i < nd; i++) w.shape[i] = want[i];
    return fail("%s: tensor '%s' is %s %s, config.json says %s (%s)", set->files[t->shard], t->name,
                st_dtype_name(t->dtype), st_shape_str(t, a, sizeof a), st_shape_str(&w, b, sizeof b), why);
}

/* ------------------------------------------------------------------------------------ */
/* row fills                                                                             */
/* ------------------------------------------------------------------------------------ */

static const float k_e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};

static int rd(const otensor *o, const st_tensor *t, uint64_t off, uint64_t len, void *dst) {
    char e[512];
    if (st_read(o->set, t, off, len, dst, e, sizeof e) != 0) {
        fail("%s", e);
        return -1;
    }
    return 0;
}

/* Rows [r0, r0+n) of a source as f32. */
static int rows_f32(const otensor *o, uint64_t r0, uint64_t n, float *dst) {
    const int64_t in = o->in;
    switch (o->kind) {
    case K_PLAIN: {
        const size_t es = st_dtype_size(o->w->dtype);
        uint8_t *b = malloc((size_t)(n * (uint64_t)in * es));
        if (!b || rd(o, o->w, r0 * (uint64_t)in * es, n * (uint64_t)in * es, b)) {
            free(b);
            return -1;
        }
        for (uint64_t i = 0; i < n * (uint64_t)in; i++) {
            const uint8_t *p = b + i * es;
            switch (o->w->dtype) {
            case ST_F32: memcpy(&dst[i], p, 4); break;
            case ST_BF16: dst[i] = dsii_bf16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
            case ST_F16: dst[i] = dsii_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); break;
            case ST_I64: {
                int64_t v;
                memcpy(&v, p, 8);
                dst[i] = (float)v;
                break;
            }
            case ST_I32: {
                int32_t v;
                memcpy(&v, p, 4);
                dst[i] = (float)v;
                break;
            }
            default: free(b); return fail("tensor '%s': dtype %s cannot be converted", o->w->name, st_dtype_name(o->w->dtype));
            }
        }
        free(b);
        return 0;
    }
    case K_FP8:
    case K_TABLE: {
        const uint64_t B = o->kind == K_FP8 ? o->blk : 32;
        const uint64_t nbc = ((uint64_t)in + B - 1) / B;
        const uint64_t t0 = o->kind == K_FP8 ? r0 / B : r0, t1 = o->kind == K_FP8 ? (r0 + n - 1) / B : r0 + n - 1;
        uint8_t *c = malloc((size_t)(n * (uint64_t)in)), *s = malloc((size_t)((t1 - t0 + 1) * nbc));
        if (!c || !s || rd(o, o->w, r0 * (uint64_t)in, n * (uint64_t)in, c) ||
            rd(o, o->s, t0 * nbc, (t1 - t0 + 1) * nbc, s)) {
            free(c);
            free(s);
            return -1;
        }
        for (uint64_t r = 0; r < n; r++) {
            const uint64_t tr = (o->kind == K_FP8 ? (r0 + r) / B : r0 + r) - t0;
            for (int64_t j = 0; j < in; j++)
                dst[r * (uint64_t)in + (uint64_t)j] =
                    dsii_e4m3_to_f32(c[r * (uint64_t)in + (uint64_t)j]) * dsii_e8m0_to_f32(s[tr * nbc + (uint64_t)j / B]);
        }
        free(c);
        free(s);
        return 0;
    }
    case K_FP4: {
        uint8_t *c = malloc((size_t)in / 2), *s = malloc((size_t)in / 32);
        int rc = !c || !s;
        for (uint64_t r = 0; !rc && r < n; r++) {
            const uint64_t R = r0 + r, e = R / (uint64_t)o->out, row = R % (uint64_t)o->out;
            rc = rd(o, o->ew[e], row * (uint64_t)in / 2, (uint64_t)in / 2, c) ||
                 rd(o, o->es[e], row * (uint64_t)in / 32, (uint64_t)in / 32, s);
            for (int64_t j = 0; !rc && j < in; j++) {
                const uint8_t q = j & 1 ? c[j / 2] >> 4 : c[j / 2] & 15; /* element 2j: low nibble */
                dst[r * (uint64_t)in + (uint64_t)j] = k_e2m1[q] * dsii_e8m0_to_f32(s[j / 32]);
            }
        }
        free(c);
        free(s);
        return rc ? -1 : 0;
    }
    }
    return fail("internal: source kind");
}

/* Native bytes without requantization: FP8 -> fp8_e4m3_b{B} / _r32, FP4 -> mxfp4, and a plain
 * tensor into its own dtype. Returns 1 when done, 0 when this output type needs the f32 path. */
static int rows_native(const otensor *o, uint64_t r0, uint64_t n, uint8_t *dst) {
    const int64_t in = o->in;
    if (o->kind == K_PLAIN) {
        const int same = (o->w->dtype == ST_F32 && o->type == DSI_TYPE_F32) ||
                         (o->w->dtype == ST_BF16 && o->type == DSI_TYPE_BF16) ||
                         (o->w->dtype == ST_F16 && o->type == DSI_TYPE_F16);
        if (!same) return 0;
        const size_t es = st_dtype_size(o->w->dtype);
        return rd(o, o->w, r0 * (uint64_t)in * es, n * (uint64_t)in * es, dst) ? -1 : 1;
    }
    if ((o->kind == K_FP8 && (o->type == DSI_TYPE_FP8_E4M3_B128 || o->type == DSI_TYPE_FP8_E4M3_B32)) ||
        (o->kind == K_TABLE && o->type == DSI_TYPE_FP8_E4M3_R32)) {
        const uint64_t B = o->kind == K_FP8 ? o->blk : 32, OB = o->type == DSI_TYPE_FP8_E4M3_B128 ? 128 : 32;
        if (o->kind == K_FP8 && B != OB) return 0; /* tile and block sizes differ: requantize */
        const uint64_t nbc = ((uint64_t)in + B - 1) / B;
        const uint64_t t0 = o->kind == K_FP8 ? r0 / B : r0, t1 = o->kind == K_FP8 ? (r0 + n - 1) / B : r0 + n - 1;
        uint8_t *c = malloc((size_t)(n * (uint64_t)in)), *s = malloc((size_t)((t1 - t0 + 1) * nbc));
        int rc = !c || !s || rd(o, o->w, r0 * (uint64_t)in, n * (uint64_t)in, c) ||
                 rd(o, o->s, t0 * nbc, (t1 - t0 + 1) * nbc, s);
        const uint64_t rowb = nbc * (OB + 1);
        for (uint64_t r = 0; !rc && r < n; r++) {
            const uint64_t tr = (o->kind == K_FP8 ? (r0 + r) / B : r0 + r) - t0;
            uint8_t *d = dst + r * rowb;
            for (uint64_t k = 0; k < nbc; k++) {
                /* the tile scale repeated in every row's block (docs/tensor-types.md) */
                d[k * (OB + 1)] = s[tr * nbc + k];
                const uint64_t j0 = k * OB, m = (uint64_t)in - j0 < OB ? (uint64_t)in - j0 : OB;
                memcpy(d + k * (OB + 1) + 1, c + r * (uint64_t)in + j0, (size_t)m);
            }
        }
        free(c);
        free(s);
        return rc ? -1 : 1;
    }
    if (o->kind == K_FP4 && o->type == DSI_TYPE_MXFP4) {
        /* checkpoint: element 2j = low nibble of byte j; mxfp4 block: qs[j] = n[j] | n[j+16] << 4 */
        uint8_t *c = malloc((size_t)in / 2), *s = malloc((size_t)in / 32);
        int rc = !c || !s;
        for (uint64_t r = 0; !rc && r < n; r++) {
            const uint64_t R = r0 + r, e = R / (uint64_t)o->out, row = R % (uint64_t)o->out;
            rc = rd(o, o->ew[e], row * (uint64_t)in / 2, (uint64_t)in / 2, c) ||
                 rd(o, o->es[e], row * (uint64_t)in / 32, (uint64_t)in / 32, s);
            uint8_t *d = dst + r * (uint64_t)in / 32 * 17;
            for (int64_t b = 0; !rc && b < in / 32; b++) {
                uint8_t nib[32];
                for (int j = 0; j < 32; j++) {
                    const int64_t x = b * 32 + j;
                    nib[j] = x & 1 ? c[x / 2] >> 4 : c[x / 2] & 15;
                }
                d[b * 17] = s[b];
                for (int j = 0; j < 16; j++) d[b * 17 + 1 + j] = (uint8_t)(nib[j] | nib[j + 16] << 4);
            }
        }
        free(c);
        free(s);
        return rc ? -1 : 1;
    }
    return 0;
}

static int fill_rows_run(const otensor *o, uint64_t r0, uint64_t n, void *dst);

/* The writer hands runs of ~8 MiB of output; the f32 staging of a requantized run would be up
 * to 8x that, so runs are cut into pieces of at most 2 MiB of f32 (memory stays bounded by a
 * constant, docs/converting.md "Memory"). */
static int fill_rows(void *user, uint64_t r0, uint64_t n, void *dst) {
    const otensor *o = user;
    uint64_t rb = 0;
    dsii_type_row_size(o->type, o->in, &rb);
    uint64_t per = (2u << 20) / (4 * (uint64_t)o->in);
    if (per < 1) per = 1;
    if (o->kind == K_FP8 && per % o->blk) per = per < o->blk ? o->blk : per / o->blk * o->blk;
    for (uint64_t i = 0; i < n; i += per) {
        const uint64_t m = n - i < per ? n - i : per;
        if (fill_rows_run(o, r0 + i, m, (uint8_t *)dst + i * rb)) return 1;
    }
    return 0;
}

static int fill_rows_run(const otensor *o, uint64_t r0, uint64_t n, void *dst) {
    int rc = rows_native(o, r0, n, dst);
    if (rc) return rc < 0;
    if (o->type == DSI_TYPE_I32) {
        float *f = malloc(sizeof(float) * (size_t)(n * (uint64_t)o->in));
        if (!f || rows_f32(o, r0, n, f)) {
            free(f);
            return 1;
        }
        for (uint64_t i = 0; i < n * (uint64_t)o->in; i++) {
            int32_t v = (int32_t)f[i];
            memcpy((uint8_t *)dst + 4 * i, &v, 4);
        }
        free(f);
        return 0;
    }
    float *f = malloc(sizeof(float) * (size_t)(n * (uint64_t)o->in));
    if (!f || rows_f32(o, r0, n, f)) {
        free(f);
        return 1;
    }
    uint64_t rb = 0;
    dsii_type_row_size(o->type, o->in, &rb);
    for (uint64_t r = 0; r < n && !rc; r++) {
        dsii_error e;
        if (dsii_quantize_row(o->type, f + r * (uint64_t)o->in, (uint8_t *)dst + r * rb, o->in, &e) != DSI_OK)
            rc = fail("tensor '%s': %s", o->name, e.msg);
    }
    free(f);
    return rc != 0;
}

/* ------------------------------------------------------------------------------------ */
/* the plan                                                                              */
/* ------------------------------------------------------------------------------------ */

typedef struct conv {
    st_set set;
    json_t *cfg, *text;        /* config.json and its text_config (V4.1) or itself (V4) */
    int v41;
    dsii_hparams hp;
    uint32_t fp8_block;        /* 128 (V4) / 32 (V4.1) */
    int layout;
    int32_t cls_type[CL_COUNT];
    otensor *t;
    size_t n, cap;
    uint8_t *used;             /* per checkpoint tensor: consumed */
    int no_mtp;
    /* Engram constants (owned) */
    uint64_t *primes, *offsets, *mults;
    int32_t *tmap;
    hf_vocab vocab;
    int32_t bos, eos, pad;
    char *config_text;         /* config.json verbatim (ds4 layout copies it) */
    dsii_emitter *em;
} conv;

static json_t *cfg_get(const conv *c, const char *key) {
    json_t *v = c->text ? json_object_get(c->text, key) : NULL;
    return v ? v : json_object_get(c->cfg, key);
}

static int cfg_int(const conv *c, const char *key, int required, int64_t def, int64_t *out) {
    json_t *v = cfg_get(c, key);
    if (!v) {
        if (required) return fail("config.json: missing \"%s\"", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return fail("config.json: \"%s\" is not an integer", key);
    *out = json_integer_value(v);
    return 0;
}

static int cfg_u32(const conv *c, const char *key, int required, uint32_t def, uint32_t *out) {
    int64_t v = 0;
    if (cfg_int(c, key, required, def, &v)) return -1;
    if (v < 0 || v > UINT32_MAX) return fail("config.json: \"%s\" value %lld out of range", key, (long long)v);
    *out = (uint32_t)v;
    return 0;
}

static int cfg_f32(const conv *c, json_t *obj, const char *key, int required, float def, float *out) {
    json_t *v = obj ? json_object_get(obj, key) : cfg_get(c, key);
    if (!v) {
        if (required) return fail("config.json: missing \"%s\"", key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return fail("config.json: \"%s\" is not a number", key);
    *out = (float)json_number_value(v);
    return 0;
}

static int cfg_arr(const conv *c, const char *key, uint32_t *dst, uint32_t cap, uint32_t *n, int required) {
    json_t *v = cfg_get(c, key);
    *n = 0;
    if (!v) return required ? fail("config.json: missing \"%s\"", key) : 0;
    if (!json_is_array(v) || json_array_size(v) > cap) return fail("config.json: \"%s\" is not an array of at most %u", key, cap);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0) return fail("config.json: \"%s\"[%zu] is not a non-negative integer", key, i);
        dst[(*n)++] = (uint32_t)json_integer_value(x);
    }
    return 0;
}

static int cfg_str(const conv *c, const char *key, const char *want) {
    json_t *v = cfg_get(c, key);
    if (!v) return 0;
    if (!json_is_string(v) || strcmp(json_string_value(v), want) != 0)
        return fail("config.json: \"%s\" is %s, libdsinfer implements only \"%s\"", key,
                    json_is_string(v) ? json_string_value(v) : "not a string", want);
    return 0;
}

static int is_prime(uint64_t n) {
    if (n < 2) return 0;
    for (uint64_t d = 2; d * d <= n; d++)
        if (n % d == 0) return 0;
    return 1;
}

/* config.json -> hparams (model-spec §1.2; the release values are checked only for sanity). */
static int read_config(conv *c) {
    dsii_hparams *hp = &c->hp;
    memset(hp, 0, sizeof *hp);
    const char *mt = json_string_value(json_object_get(c->cfg, "model_type"));
    json_t *tc = json_object_get(c->cfg, "text_config");
    c->v41 = (mt && !strcmp(mt, "deepseek_v41")) || json_is_object(tc);
    if (!c->v41 && mt && strcmp(mt, "deepseek_v4") != 0)
        return fail("config.json: model_type \"%s\" is neither deepseek_v4 nor deepseek_v41", mt);
    c->text = c->v41 ? tc : NULL;
    if (c->v41 && !json_is_object(tc)) return fail("config.json: deepseek_v41 without \"text_config\"");
    hp->arch = c->v41 ? DSI_ARCH_DEEPSEEK41 : DSI_ARCH_DEEPSEEK4;
    uint32_t nkv = 0, dense = 0;
    if (cfg_u32(c, "num_hidden_layers", 1, 0, &hp->n_layer) || cfg_u32(c, "hidden_size", 1, 0, &hp->n_embd) ||
        cfg_u32(c, "vocab_size", 1, 0, &hp->n_vocab) ||
        cfg_u32(c, "max_position_embeddings", 0, 1048576, &hp->n_ctx_train) ||
        cfg_u32(c, "num_attention_heads", 1, 0, &hp->n_head) || cfg_u32(c, "num_key_value_heads", 0, 1, &nkv) ||
        cfg_u32(c, "head_dim", 1, 0, &hp->head_dim) || cfg_u32(c, "qk_rope_head_dim", 1, 0, &hp->rope_dim) ||
        cfg_u32(c, "q_lora_rank", 1, 0, &hp->q_lora_rank) || cfg_u32(c, "o_lora_rank", 1, 0, &hp->o_lora_rank) ||
        cfg_u32(c, "o_groups", 1, 0, &hp->o_groups) || cfg_u32(c, "sliding_window", 1, 0, &hp->window) ||
        cfg_u32(c, "index_n_heads", 1, 0, &hp->idx_n_head) || cfg_u32(c, "index_head_dim", 1, 0, &hp->idx_head_dim) ||
        cfg_u32(c, "index_topk", 1, 0, &hp->idx_topk) || cfg_u32(c, "n_routed_experts", 1, 0, &hp->n_expert) ||
        cfg_u32(c, "num_experts_per_tok", 1, 0, &hp->n_expert_used) ||
        cfg_u32(c, "moe_intermediate_size", 1, 0, &hp->expert_ff) ||
        cfg_u32(c, "n_shared_experts", 1, 0, &hp->n_expert_shared) ||
        cfg_u32(c, "num_hash_layers", !c->v41, 0, &hp->n_hash_layer) || cfg_u32(c, "hc_mult", 1, 0, &hp->hc_mult) ||
        cfg_u32(c, "hc_sinkhorn_iters", 1, 0, &hp->hc_sinkhorn_iters) ||
        cfg_u32(c, "first_k_dense_replace", 0, 0, &dense))
        return -1;
    if (nkv != 1) return fail("config.json: num_key_value_heads %u (the architecture has one shared latent)", nkv);
    if (dense) return fail("config.json: first_k_dense_replace %u: dense FFN layers are not part of V4 / V4.1", dense);
    if (!hp->n_layer || hp->n_layer > DSII_MAX_LAYERS || !hp->o_groups || hp->n_head % hp->o_groups ||
        hp->rope_dim > hp->head_dim || hp->hc_mult > DSII_MAX_HC)
        return fail("config.json: inconsistent shape (num_hidden_layers %u, heads %u / o_groups %u, rope %u / head_dim %u)",
                    hp->n_layer, hp->n_head, hp->o_groups, hp->rope_dim, hp->head_dim);
    hp->nope_dim = hp->head_dim - hp->rope_dim;
    hp->hc_mix = (2 + hp->hc_mult) * hp->hc_mult;
    hp->hc_lagged = c->v41;
    if (cfg_str(c, "scoring_func", "sqrtsoftplus") || cfg_str(c, "topk_method", "noaux_tc") ||
        cfg_str(c, "hidden_act", "silu"))
        return -1;
    json_t *ntp = cfg_get(c, "norm_topk_prob");
    if (ntp && !json_is_true(ntp)) return fail("config.json: norm_topk_prob false is not supported");
    float swiglu = 0;
    if (cfg_f32(c, NULL, "rms_norm_eps", 1, 0, &hp->rms_eps) || cfg_f32(c, NULL, "rope_theta", 0, 10000, &hp->rope_base) ||
        cfg_f32(c, NULL, "compress_rope_theta", 1, 0, &hp->rope_base_compress) ||
        cfg_f32(c, NULL, "hc_eps", 1, 0, &hp->hc_eps) || cfg_f32(c, NULL, "swiglu_limit", 0, 0, &swiglu) ||
        cfg_f32(c, NULL, "routed_scaling_factor", 1, 0, &hp->route_scale))
        return -1;
    json_t *rs = cfg_get(c, "rope_scaling");
    if (!json_is_object(rs)) return fail("config.json: missing \"rope_scaling\" (the releases use YaRN)");
    const char *rt = json_string_value(json_object_get(rs, "type"));
    if (!rt) rt = json_string_value(json_object_get(rs, "rope_type"));
    if (!rt || strcmp(rt, "yarn") != 0) return fail("config.json: rope_scaling type \"%s\", only yarn is implemented", rt ? rt : "?");
    float oc = 0;
    if (cfg_f32(c, rs, "factor", 1, 0, &hp->yarn_factor) || cfg_f32(c, rs, "original_max_position_embeddings", 1, 0, &oc) ||
        cfg_f32(c, rs, "beta_fast", 0, 32, &hp->yarn_beta_fast) || cfg_f32(c, rs, "beta_slow", 0, 1, &hp->yarn_beta_slow))
        return -1;
    hp->yarn_orig_ctx = (uint32_t)oc;
    json_t *m = json_object_get(c->cfg, "quantization_config");
    if (!m && c->text) m = json_object_get(c->text, "quantization_config");
    json_t *wb = m ? json_object_get(m, "weight_block_size") : NULL;
    c->fp8_block = c->v41 ? 32 : 128;
    if (wb) {
        if (!json_is_array(wb) || json_array_size(wb) != 2 || json_integer_value(json_array_get(wb, 0)) !=
                                                                     json_integer_value(json_array_get(wb, 1)))
            return fail("config.json: quantization_config.weight_block_size must be [B, B]");
        c->fp8_block = (uint32_t)json_integer_value(json_array_get(wb, 0));
        if (c->fp8_block != 128 && c->fp8_block != 32)
            return fail("config.json: weight_block_size %u: libdsinfer's FP8 types have blocks of 128 or 32", c->fp8_block);
    }
    uint32_t ratios[DSII_MAX_LAYERS + 8], nr = 0;
    if (cfg_arr(c, "compress_ratios", ratios, DSII_MAX_LAYERS + 8, &nr, 1)) return -1;
    if (nr < hp->n_layer) return fail("config.json: compress_ratios has %u entries for %u layers", nr, hp->n_layer);
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        dsii_layer_hparams *l = &hp->layer[i];
        l->compress_ratio = ratios[i];
        l->coff = !c->v41 && ratios[i] == 4 ? 2 : 1;
        l->swiglu_limit = l->swiglu_limit_shexp = swiglu;
        l->n_expert = hp->n_expert;
        l->n_expert_used = hp->n_expert_used;
        l->engram_index = -1;
        l->is_hash = !c->v41 && i < hp->n_hash_layer;
    }
    uint32_t ndraft = 0;
    if (cfg_u32(c, "num_nextn_predict_layers", 0, 0, &ndraft)) return -1;
    hp->n_draft = ndraft > DSII_MAX_DRAFT ? DSII_MAX_DRAFT : ndraft;
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        dsii_layer_hparams *l = &hp->draft_layer[d];
        l->swiglu_limit = l->swiglu_limit_shexp = swiglu;
        l->n_expert = hp->n_expert;
        l->n_expert_used = hp->n_expert_used;
        l->engram_index = -1;
    }
    if (!c->v41) {
        hp->has_mtp = hp->n_draft > 0;
        if (hp->n_draft > 1) return fail("config.json: num_nextn_predict_layers %u: V4 has one MTP block", ndraft);
        return 0;
    }
    /* V4.1: attention roles, candidates, DSpark */
    uint32_t kvs[DSII_MAX_LAYERS], ixs[DSII_MAX_LAYERS], nk = 0, ni = 0;
    if (cfg_arr(c, "kv_source_layer_ids", kvs, DSII_MAX_LAYERS, &nk, 1) ||
        cfg_arr(c, "index_source_layer_ids", ixs, DSII_MAX_LAYERS, &ni, 1))
        return -1;
    for (uint32_t i = 0; i < nk; i++)
        if (kvs[i] < hp->n_layer) hp->layer[kvs[i]].is_kv_source = 1;
    for (uint32_t i = 0; i < ni; i++)
        if (ixs[i] < hp->n_layer) hp->layer[ixs[i]].is_index_source = 1;
    int64_t cs = -1;
    if (cfg_int(c, "candidate_source_layer_id", 0, -1, &cs)) return -1;
    hp->candidate_source = (int32_t)cs;
    if (cs >= 0 && (cfg_u32(c, "candidate_topk_blocks", 1, 0, &hp->candidate_topk_blocks) ||
                    cfg_u32(c, "candidate_block_size", 1, 0, &hp->candidate_block_size)))
        return -1;
    if (hp->n_draft) {
        dsii_dspark_hparams *ds = &hp->dspark;
        uint32_t noise = 0;
        if (cfg_u32(c, "dspark_block_size", 1, 0, &ds->block_size) ||
            cfg_u32(c, "dspark_noise_token_id", 1, 0, &noise) ||
            cfg_arr(c, "dspark_target_layer_ids", ds->target_layer_ids, DSII_MAX_DSPARK_TARGETS, &ds->n_target, 1) ||
            cfg_u32(c, "dspark_markov_rank", 1, 0, &ds->markov_rank) ||
            cfg_u32(c, "dspark_n_routed_experts", 1, 0, &ds->n_expert) ||
            cfg_u32(c, "dspark_num_experts_per_tok", 1, 0, &ds->n_expert_used))
            return -1;
        ds->noise_token = (int32_t)noise;
        hp->has_dspark = 1;
        for (uint32_t d = 0; d < hp->n_draft; d++) {
            hp->draft_layer[d].n_expert = ds->n_expert;
            hp->draft_layer[d].n_expert_used = ds->n_expert_used;
        }
    }
    return 0;
}

/* Engram constants (model-spec §4.6, DeepSeek's engram.py as ds4's deepseek41_metadata.py
 * runs it): primes per layer / n-gram size / head from a shared "seen" set, multipliers from
 * NumPy's default_rng(10007 * layer), the compressed token map from the tokenizer. */
static int engram_constants(conv *c) {
    dsii_hparams *hp = &c->hp;
    dsii_engram_hparams *e = &hp->engram;
    uint32_t n = 0, rows[DSII_MAX_ENGRAM_LAYERS], nrows = 0;
    if (cfg_arr(c, "engram_layer_ids", e->layer_ids, DSII_MAX_ENGRAM_LAYERS, &n, 0)) return -1;
    if (n == 0) return 0;
    uint32_t vocab = 0, padtok = 0, want_comp = 0;
    if (cfg_u32(c, "engram_n_heads", 1, 0, &e->n_head) || cfg_u32(c, "engram_head_dim", 1, 0, &e->key_length) ||
        cfg_u32(c, "engram_max_ngram_size", 1, 0, &e->max_ngram) || cfg_u32(c, "engram_vocab_size", 1, 0, &vocab) ||
        cfg_u32(c, "engram_pad_token_id", 1, 0, &padtok) ||
        cfg_u32(c, "engram_compressed_vocab_size", 0, 0, &want_comp) ||
        cfg_arr(c, "engram_num_embeddings", rows, DSII_MAX_ENGRAM_LAYERS, &nrows, 0))
        return -1;
    if (e->max_ngram < 2 || !e->n_head || e->key_length % 32 || vocab < 2 || padtok >= hp->n_vocab)
        return fail("config.json: engram shape (heads %u, head_dim %u, max n-gram %u, vocab %u, pad %u) is not usable",
                    e->n_head, e->key_length, e->max_ngram, vocab, padtok);
    e->n_layer = n;
    e->n_cols = (e->max_ngram - 1) * e->n_head;
    const uint64_t np = (uint64_t)n * e->n_cols;
    c->primes = calloc(np, sizeof *c->primes);
    c->offsets = calloc(np, sizeof *c->offsets);
    c->mults = calloc((size_t)n * e->max_ngram, sizeof *c->mults);
    c->tmap = calloc(hp->n_vocab, sizeof *c->tmap);
    if (!c->primes || !c->offsets || !c->mults || !c->tmap) return fail("out of memory");
    uint64_t *seen = calloc(np, sizeof *seen);
    if (!seen) return fail("out of memory");
    uint64_t ns = 0, o = 0;
    for (uint32_t l = 0; l < n; l++) {
        uint64_t acc = 0;
        for (uint32_t g = 0; g + 1 < e->max_ngram; g++) {
            uint64_t cur = vocab - 1;
            for (uint32_t h = 0; h < e->n_head; h++) {
                for (;;) { /* nextprime(current), then again while already used */
                    cur++;
                    if (!is_prime(cur)) continue;
                    int dup = 0;
                    for (uint64_t k = 0; k < ns; k++) dup |= seen[k] == cur;
                    if (!dup) break;
                }
                seen[ns++] = cur;
                c->primes[o] = cur;
                c->offsets[o] = acc;
                acc += cur;
                o++;
            }
        }
        e->rows[l] = acc;
        if (nrows && (l >= nrows || rows[l] != acc)) {
            free(seen);
            return fail("config.json: engram_num_embeddings[%u] = %u, the hash buckets give %" PRIu64 " rows", l,
                        l < nrows ? rows[l] : 0, acc);
        }
        hp->layer[e->layer_ids[l]].engram_index = (int32_t)l;
    }
    free(seen);
    /* the token map */
    const char **tok = malloc(sizeof *tok * c->vocab.n);
    if (!tok) return fail("out of memory");
    for (uint32_t i = 0; i < c->vocab.n; i++) tok[i] = c->vocab.text[i];
    uint32_t ncomp = 0;
    int rc = en_token_map(tok, c->vocab.len, c->vocab.literal, c->vocab.n, c->tmap, &ncomp);
    free(tok);
    if (rc) return fail("out of memory (engram token map)");
    if (want_comp && ncomp != want_comp)
        return fail("config.json: engram_compressed_vocab_size %u, the tokenizer's normalized texts give %u "
                    "(docs/converting.md: Engram token map)", want_comp, ncomp);
    e->compressed_vocab = ncomp;
    e->pad_id = (uint32_t)c->tmap[padtok];
    e->n_token_map = hp->n_vocab;
    const uint64_t bound = ((uint64_t)INT64_MAX / ncomp) / 2;
    for (uint32_t l = 0; l < n; l++) {
        int64_t v[16];
        if (e->max_ngram > 16 || npy_rng_integers(10007ull * e->layer_ids[l], bound, e->max_ngram, v))
            return fail("engram: multiplier bound %" PRIu64 " outside the generator's range", bound);
        for (uint32_t j = 0; j < e->max_ngram; j++) c->mults[l * e->max_ngram + j] = (uint64_t)v[j] * 2 + 1;
    }
    e->multipliers = c->mults;
    e->primes = c->primes;
    e->offsets = c->offsets;
    e->token_map = c->tmap;
    hp->has_engram = 1;
    return 0;
}

/* A new output tensor from HF `hf` (its shape checked against `shape`, HF order). */
static otensor *add_out(conv *c, const char *name, int cls, const char *hf, uint32_t nd, const int64_t *shape,
                        int required, int *err) {
    const st_tensor *w = st_find(&c->set, hf);
    *err = 0;
    if (!w) {
        if (required) *err = fail("missing tensor '%s' (config.json describes it; %s)", hf, c->set.dir);
        return NULL;
    }
    char why[160];
    snprintf(why, sizeof why, "expected for %s", name);
    if ((*err = check_shape(&c->set, w, nd, shape, why))) return NULL;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 512;
        otensor *p = realloc(c->t, sizeof *p * c->cap);
        if (!p) {
            *err = fail("out of memory");
            return NULL;
        }
        c->t = p;
    }
    otensor *o = &c->t[c->n++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->cls = cls;
    o->set = &c->set;
    o->w = w;
    c->used[w - c->set.t] = 1;
    o->n_dims = nd;
    for (uint32_t i = 0; i < 4; i++) o->ne[i] = i < nd ? shape[nd - 1 - i] : 1;
    o->in = shape[nd - 1];
    o->out = 1;
    for (uint32_t i = 0; i + 1 < nd; i++) o->out *= shape[i];
    switch (w->dtype) {
    case ST_F32: case ST_BF16: case ST_F16: case ST_I64: case ST_I32: o->kind = K_PLAIN; break;
    case ST_F8_E4M3: {
        char sn[300];
        const size_t l = strlen(hf);
        snprintf(sn, sizeof sn, "%.*s.scale", (int)(l > 7 && !strcmp(hf + l - 7, ".weight") ? l - 7 : l), hf);
        const st_tensor *s = st_find(&c->set, sn);
        if (!s) {
            *err = fail("%s: FP8 tensor '%s' has no scale tensor '%s'", c->set.files[w->shard], hf, sn);
            return NULL;
        }
        const int table = cls == CL_TABLE;
        const int64_t B = table ? 32 : c->fp8_block;
        const int64_t want[2] = {table ? o->out : (o->out + B - 1) / B, (o->in + B - 1) / B};
        snprintf(why, sizeof why, "E8M0 scales of %s, %s", hf, table ? "one per 32 values of a row" : "one per tile");
        if (s->dtype != ST_F8_E8M0) {
            *err = fail("%s: scale tensor '%s' is %s, expected F8_E8M0", c->set.files[s->shard], sn, st_dtype_name(s->dtype));
            return NULL;
        }
        if (nd != 2 || (*err = check_shape(&c->set, s, 2, want, why))) {
            if (!*err) *err = fail("%s: FP8 tensor '%s' is not a matrix", c->set.files[w->shard], hf);
            return NULL;
        }
        o->s = s;
        c->used[s - c->set.t] = 1;
        o->kind = table ? K_TABLE : K_FP8;
        o->blk = (uint32_t)B;
        break;
    }
    default:
        *err = fail("%s: tensor '%s' has dtype %s, not expected here (%s)", c->set.files[w->shard], hf,
                    st_dtype_name(w->dtype), name);
        return NULL;
    }
    return o;
}

/* Routed experts: E tensors `pfx.E.wN.weight` (I8 packed FP4) + `.scale`, stacked [in, out, E]. */
static int add_experts(conv *c, const char *name, const char *pfx, const char *wn, uint32_t E, int64_t out,
                       int64_t in) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 512;
        otensor *p = realloc(c->t, sizeof *p * c->cap);
        if (!p) return fail("out of memory");
        c->t = p;
    }
    otensor *o = &c->t[c->n];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->cls = CL_EXPERTS;
    o->kind = K_FP4;
    o->set = &c->set;
    o->n_exp = E;
    o->in = in;
    o->out = out;
    o->n_dims = 3;
    o->ne[0] = in, o->ne[1] = out, o->ne[2] = E, o->ne[3] = 1;
    o->ew = calloc(E, sizeof *o->ew);
    o->es = calloc(E, sizeof *o->es);
    c->n++; /* owned by the plan from here (freed with it on any failure) */
    if (!o->ew || !o->es) return fail("out of memory");
    if (in % 32) return fail("%s: expert input width %lld is not a multiple of 32 (FP4 blocks)", name, (long long)in);
    for (uint32_t e = 0; e < E; e++) {
        char wnm[256], snm[256];
        snprintf(wnm, sizeof wnm, "%s.%u.%s.weight", pfx, e, wn);
        snprintf(snm, sizeof snm, "%s.%u.%s.scale", pfx, e, wn);
        const st_tensor *w = st_find(&c->set, wnm), *s = st_find(&c->set, snm);
        if (!w) return fail("missing tensor '%s' (config.json: %u experts)", wnm, E);
        if (!s) return fail("%s: FP4 tensor '%s' has no scale tensor '%s'", c->set.files[w->shard], wnm, snm);
        if (w->dtype != ST_I8) return fail("%s: tensor '%s' is %s, expected I8 (two FP4 values per byte)",
                                          c->set.files[w->shard], wnm, st_dtype_name(w->dtype));
        if (s->dtype != ST_F8_E8M0) return fail("%s: scale tensor '%s' is %s, expected F8_E8M0", c->set.files[s->shard], snm,
                                               st_dtype_name(s->dtype));
        const int64_t ws[2] = {out, in / 2}, ss[2] = {out, in / 32};
        if (check_shape(&c->set, w, 2, ws, "FP4 expert, two values per byte") ||
            check_shape(&c->set, s, 2, ss, "one E8M0 scale per 32 values"))
            return -1;
        o->ew[e] = w;
        o->es[e] = s;
        c->used[w - c->set.t] = c->used[s - c->set.t] = 1;
    }
    return 0;
}

#define OUT(name, cls, hf, nd, ...)                                                     \
    do {                                                                                \
        const int64_t sh_[] = {__VA_ARGS__};                                            \
        int e_;                                                                         \
        add_out(c, name, cls, hf, nd, sh_, 1, &e_);                                     \
        if (e_) return -1;                                                              \
    } while (0)
#define OUT_OPT(name, cls, hf, nd, ...)                                                 \
    do {                                                                                \
        const int64_t sh_[] = {__VA_ARGS__};                                            \
        int e_;                                                                         \
        add_out(c, name, cls, hf, nd, sh_, 0, &e_);                                     \
        if (e_) return -1;                                                              \
    } while (0)

/* One block (backbone layer or draft stage): model-spec §2.2 / §2.3 names. */
static int plan_block(conv *c, const char *hp_, const char *gp, const dsii_layer_hparams *lh, int draft) {
    const dsii_hparams *hp = &c->hp;
    const int64_t D = hp->n_embd, Q = hp->q_lora_rank, H = hp->n_head, hd = hp->head_dim, G = hp->o_groups;
    const int64_t R = hp->o_lora_rank, hc = hp->hc_mult, M = hp->hc_mix, IH = hp->idx_n_head, ID = hp->idx_head_dim;
    const int64_t E = lh->n_expert, k = lh->n_expert_used, F = hp->expert_ff, SF = (int64_t)hp->n_expert_shared * F;
    const int64_t V = hp->n_vocab, r = lh->compress_ratio;
    char g[160], h[160];
#define G_(s) (snprintf(g, sizeof g, "%s%s", gp, s), g)
#define H_(s) (snprintf(h, sizeof h, "%s%s", hp_, s), h)
    for (int f = 0; f < 2; f++) {
        const char *w = f ? "ffn" : "attn";
        char a[64];
        snprintf(a, sizeof a, "hc_%s_fn.weight", w);
        char b[64];
        snprintf(b, sizeof b, "hc_%s_fn", w);
        OUT(G_(a), CL_SMALL, H_(b), 2, M, hc * D);
        snprintf(a, sizeof a, "hc_%s_base.weight", w);
        snprintf(b, sizeof b, "hc_%s_base", w);
        OUT(G_(a), CL_VEC, H_(b), 1, M);
        snprintf(a, sizeof a, "hc_%s_scale.weight", w);
        snprintf(b, sizeof b, "hc_%s_scale", w);
        OUT(G_(a), CL_VEC, H_(b), 1, 3);
    }
    OUT(G_("attn_norm.weight"), CL_VEC, H_("attn_norm.weight"), 1, D);
    OUT(G_("ffn_norm.weight"), CL_VEC, H_("ffn_norm.weight"), 1, D);
    OUT(G_("attn_sinks.weight"), CL_VEC, H_("attn.attn_sink"), 1, H);
    OUT(G_("attn_q_a.weight"), CL_ATTN, H_("attn.wq_a.weight"), 2, Q, D);
    OUT(G_("attn_q_a_norm.weight"), CL_VEC, H_("attn.q_norm.weight"), 1, Q);
    OUT(G_("attn_q_b.weight"), CL_ATTN, H_("attn.wq_b.weight"), 2, H * hd, Q);
    OUT(G_("attn_kv.weight"), CL_ATTN, H_("attn.wkv.weight"), 2, hd, D);
    OUT(G_("attn_kv_a_norm.weight"), CL_VEC, H_("attn.kv_norm.weight"), 1, hd);
    OUT(G_("attn_output_a.weight"), CL_ATTN, H_("attn.wo_a.weight"), 2, G * R, H * hd / G);
    OUT(G_("attn_output_b.weight"), CL_ATTN, H_("attn.wo_b.weight"), 2, D, G * R);
    if (!c->v41 && r > 0) {
        const int64_t co = lh->coff;
        OUT(G_("attn_compressor_ape.weight"), CL_APE, H_("attn.compressor.ape"), 2, r, co * hd);
        OUT(G_("attn_compressor_kv.weight"), CL_SMALL, H_("attn.compressor.wkv.weight"), 2, co * hd, D);
        OUT(G_("attn_compressor_gate.weight"), CL_SMALL, H_("attn.compressor.wgate.weight"), 2, co * hd, D);
        OUT(G_("attn_compressor_norm.weight"), CL_VEC, H_("attn.compressor.norm.weight"), 1, hd);
        if (r == 4) {
            OUT(G_("indexer.attn_q_b.weight"), CL_SMALL, H_("attn.indexer.wq_b.weight"), 2, IH * ID, Q);
            OUT(G_("indexer.proj.weight"), CL_SMALL, H_("attn.indexer.weights_proj.weight"), 2, IH, D);
            OUT(G_("indexer_compressor_ape.weight"), CL_APE, H_("attn.indexer.compressor.ape"), 2, 4, 2 * ID);
            OUT(G_("indexer_compressor_kv.weight"), CL_SMALL, H_("attn.indexer.compressor.wkv.weight"), 2, 2 * ID, D);
            OUT(G_("indexer_compressor_gate.weight"), CL_SMALL, H_("attn.indexer.compressor.wgate.weight"), 2, 2 * ID, D);
            OUT(G_("indexer_compressor_norm.weight"), CL_VEC, H_("attn.indexer.compressor.norm.weight"), 1, ID);
        }
    }
    if (c->v41 && lh->is_kv_source) {
        OUT(G_("attn_compressor_kv.weight"), CL_SMALL, H_("attn.compressor.wkv.weight"), 2, hd, D);
        if (r > 1) OUT(G_("attn_compressor_gate.weight"), CL_SMALL, H_("attn.compressor.wgate.weight"), 2, hd, D);
        OUT(G_("attn_compressor_norm.weight"), CL_VEC, H_("attn.compressor.norm.weight"), 1, hd);
        OUT(G_("indexer.attn_k.weight"), CL_SMALL, H_("attn.indexer.wk.weight"), 2, ID, hd);
        OUT(G_("indexer.k_norm.weight"), CL_VEC, H_("attn.indexer.k_norm.weight"), 1, ID);
    }
    if (c->v41 && lh->is_index_source) {
        OUT(G_("indexer.attn_q_b.weight"), CL_SMALL, H_("attn.indexer.wq_b.weight"), 2, IH * ID, Q);
        OUT(G_("indexer.proj.weight"), CL_SMALL, H_("attn.indexer.weights_proj.weight"), 2, IH, D);
    }
    OUT(G_("ffn_gate_inp.weight"), CL_SMALL, H_("ffn.gate.weight"), 2, E, D);
    if (lh->is_hash) {
        OUT(G_("ffn_gate_tid2eid.weight"), CL_I32, H_("ffn.gate.tid2eid"), 2, V, k);
        /* hash layers route text by tid2eid: a selection bias there is unused (as llama.cpp) */
        const st_tensor *b = st_find(&c->set, H_("ffn.gate.bias"));
        if (b) c->used[b - c->set.t] = 1;
    } else {
        OUT(G_("exp_probs_b.bias"), CL_VEC, H_("ffn.gate.bias"), 1, E);
    }
    OUT_OPT(G_("exp_probs_b_vl.bias"), CL_VEC, H_("ffn.gate.bias_vl"), 1, E);
    char ep[160];
    snprintf(ep, sizeof ep, "%sffn.experts", hp_);
    if (add_experts(c, G_("ffn_gate_exps.weight"), ep, "w1", (uint32_t)E, F, D) ||
        add_experts(c, G_("ffn_up_exps.weight"), ep, "w3", (uint32_t)E, F, D) ||
        add_experts(c, G_("ffn_down_exps.weight"), ep, "w2", (uint32_t)E, D, F))
        return -1;
    OUT(G_("ffn_gate_shexp.weight"), CL_SHEXP, H_("ffn.shared_experts.w1.weight"), 2, SF, D);
    OUT(G_("ffn_up_shexp.weight"), CL_SHEXP, H_("ffn.shared_experts.w3.weight"), 2, SF, D);
    OUT(G_("ffn_down_shexp.weight"), CL_SHEXP, H_("ffn.shared_experts.w2.weight"), 2, D, SF);
    if (lh->engram_index >= 0 && !draft) {
        const dsii_engram_hparams *e = &hp->engram;
        const int64_t K = e->key_length, C = e->n_cols;
        OUT(G_("engram.embd.weight"), CL_TABLE, H_("engram.embed.weight"), 2, (int64_t)e->rows[lh->engram_index], K);
        OUT(G_("engram.wkv.weight"), CL_ENGRAM, H_("engram.wkv.weight"), 2, (hc + 1) * D, C * K);
        OUT(G_("engram.q.weight"), CL_SMALL, H_("engram.q_weight"), 2, hc, D);
        OUT(G_("engram.k.weight"), CL_SMALL, H_("engram.k_weight"), 2, hc, D);
    }
#undef G_
#undef H_
    return 0;
}

static int plan(conv *c) {
    dsii_hparams *hp = &c->hp;
    const int64_t D = hp->n_embd, V = hp->n_vocab, hc = hp->hc_mult;
    c->used = calloc(c->set.n + 1, 1);
    if (!c->used) return fail("out of memory");
    OUT("token_embd.weight", CL_EMBD, "embed.weight", 2, V, D);
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        char h[32], g[32];
        snprintf(h, sizeof h, "layers.%u.", i);
        snprintf(g, sizeof g, "blk.%u.", i);
        if (plan_block(c, h, g, &hp->layer[i], 0)) return -1;
    }
    /* draft blocks: only those the checkpoint really has */
    uint32_t nd = 0;
    while (nd < hp->n_draft) {
        char p[64];
        snprintf(p, sizeof p, "mtp.%u.attn_norm.weight", nd);
        if (!st_find(&c->set, p)) break;
        nd++;
    }
    if (nd < hp->n_draft) {
        fprintf(stderr, "dsinfer-convert: note: config.json announces %u draft blocks, the checkpoint has %u\n",
                hp->n_draft, nd);
        hp->n_draft = nd;
    }
    if (c->no_mtp) hp->n_draft = 0;
    hp->has_mtp = !c->v41 && hp->n_draft > 0;
    hp->has_dspark = c->v41 && hp->n_draft > 0;
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        char h[32], g[32];
        snprintf(h, sizeof h, "mtp.%u.", d);
        snprintf(g, sizeof g, "mtp.%u.", d);
        if (plan_block(c, h, g, &hp->draft_layer[d], 1)) return -1;
        if (!c->v41) {
            OUT("mtp.0.e_proj.weight", CL_DRAFT, "mtp.0.e_proj.weight", 2, D, D);
            OUT("mtp.0.h_proj.weight", CL_DRAFT, "mtp.0.h_proj.weight", 2, D, D);
            OUT("mtp.0.enorm.weight", CL_VEC, "mtp.0.enorm.weight", 1, D);
            OUT("mtp.0.hnorm.weight", CL_VEC, "mtp.0.hnorm.weight", 1, D);
            OUT("mtp.0.norm.weight", CL_VEC, "mtp.0.norm.weight", 1, D);
            OUT("mtp.0.hc_head_fn.weight", CL_SMALL, "mtp.0.hc_head_fn", 2, hc, hc * D);
            OUT("mtp.0.hc_head_base.weight", CL_VEC, "mtp.0.hc_head_base", 1, hc);
            OUT("mtp.0.hc_head_scale.weight", CL_VEC, "mtp.0.hc_head_scale", 1, 1);
        } else {
            const dsii_dspark_hparams *ds = &hp->dspark;
            const int64_t rk = ds->markov_rank;
            char n1[96], n2[96];
            if (d == 0) {
                OUT("mtp.0.main_proj.weight", CL_DRAFT, "mtp.0.main_proj.weight", 2, D, (int64_t)ds->n_target * D);
                OUT("mtp.0.main_norm.weight", CL_VEC, "mtp.0.main_norm.weight", 1, D);
            }
            if (d + 1 == hp->n_draft) {
                snprintf(n1, sizeof n1, "mtp.%u.norm.weight", d);
                OUT(n1, CL_VEC, n1, 1, D);
                snprintf(n1, sizeof n1, "mtp.%u.markov_embd.weight", d);
                snprintf(n2, sizeof n2, "mtp.%u.markov_head.embed.weight", d);
                OUT(n1, CL_EMBD, n2, 2, V, rk);
                snprintf(n1, sizeof n1, "mtp.%u.markov_head.weight", d);
                snprintf(n2, sizeof n2, "mtp.%u.markov_head.head.weight", d);
                OUT(n1, CL_DRAFT, n2, 2, V, rk);
                snprintf(n1, sizeof n1, "mtp.%u.confidence_proj.weight", d);
                snprintf(n2, sizeof n2, "mtp.%u.confidence_head.proj.weight", d);
                OUT(n1, CL_SMALL, n2, 2, 1, D + rk);
            }
        }
    }
    OUT("output_norm.weight", CL_VEC, "norm.weight", 1, D);
    OUT("output.weight", CL_HEAD, "head.weight", 2, V, D);
    if (!c->v41) {
        OUT("output_hc_fn.weight", CL_SMALL, "hc_head_fn", 2, hc, hc * D);
        OUT("output_hc_base.weight", CL_VEC, "hc_head_base", 1, hc);
        OUT("output_hc_scale.weight", CL_VEC, "hc_head_scale", 1, 1);
    }
    /* every checkpoint tensor is used, skipped on purpose (vision, dropped drafts), or an error */
    uint32_t skipped = 0;
    for (size_t i = 0; i < c->set.n; i++) {
        if (c->used[i]) continue;
        const char *n = c->set.t[i].name;
        if (!strncmp(n, "vision.", 7) || !strncmp(n, "aligner.", 8) || !strncmp(n, "image_", 6) ||
            ((c->no_mtp || !strncmp(n, "mtp.", 4)) && !strncmp(n, "mtp.", 4))) {
            skipped++;
            continue;
        }
        return fail("%s: tensor '%s' is not part of the model config.json describes (a config / checkpoint mismatch)",
                    c->set.files[c->set.t[i].shard], n);
    }
    if (skipped) fprintf(stderr, "dsinfer-convert: note: %u checkpoint tensors not converted (vision, aligner, image "
                                 "delimiters%s)\n", skipped, c->no_mtp ? ", draft blocks" : "");
    return 0;
}

/* Output type of a tensor (docs/converting.md "Types"). */
static int32_t choose_type(const conv *c, const otensor *o) {
    const int native = c->layout == DSII_LAYOUT_NATIVE;
    if (o->cls == CL_VEC) return DSI_TYPE_F32;
    if (o->cls == CL_I32) return DSI_TYPE_I32;
    int32_t t = c->cls_type[o->cls];
    if (t < 0) { /* auto: the checkpoint's own type where the layout has it */
        switch (o->kind) {
        case K_FP8:
            t = native ? (o->blk == 128 ? DSI_TYPE_FP8_E4M3_B128 : DSI_TYPE_FP8_E4M3_B32)
                       : (o->cls == CL_SMALL ? DSI_TYPE_BF16 : DSI_TYPE_Q8_0);
            break;
        case K_TABLE: t = DSI_TYPE_FP8_E4M3_R32; break;
        case K_FP4: t = DSI_TYPE_MXFP4; break;
        default:
            t = o->w->dtype == ST_BF16 ? DSI_TYPE_BF16 : o->w->dtype == ST_F16 ? DSI_TYPE_F16 : DSI_TYPE_F32;
        }
    }
    if (o->cls == CL_TABLE && !native) return DSI_TYPE_FP8_E4M3_R32; /* re-encoded by the layout writer */
    /* a row length the type cannot hold: q8_0, else f16 (as dsinfer-mkmodel does) */
    uint64_t rb;
    if (!dsii_type_row_size(t, o->in, &rb)) t = dsii_type_row_size(DSI_TYPE_Q8_0, o->in, &rb) ? DSI_TYPE_Q8_0 : DSI_TYPE_F16;
    return t;
}

/* ------------------------------------------------------------------------------------ */
/* progress                                                                              */
/* ------------------------------------------------------------------------------------ */

typedef struct prog {
    int quiet, tty;
    uint64_t base, total;
    double t0, last;
    const char *what;
} prog;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_progress(void *user, const char *tensor, uint64_t done, uint64_t total) {
    (void)total;
    prog *p = user;
    if (p->quiet) return;
    const double t = now_s();
    if (t - p->last < (p->tty ? 0.25 : 5.0) && done < p->total) return;
    p->last = t;
    const double el = t - p->t0, frac = p->total ? (double)done / (double)p->total : 1.0;
    const double eta = frac > 0 ? el / frac - el : 0;
    fprintf(stderr, "%sdsinfer-convert: %s %5.1f %% (%.2f of %.2f GiB) %.1f MiB/s, ETA %d:%02d:%02d  %-40.40s%s",
            p->tty ? "\r" : "", p->what, 100.0 * frac, (double)done / 1073741824.0, (double)p->total / 1073741824.0,
            el > 0 ? (double)done / el / 1048576.0 : 0.0, (int)(eta / 3600), (int)(eta / 60) % 60, (int)eta % 60, tensor,
            p->tty ? "" : "\n");
}

/* ------------------------------------------------------------------------------------ */
/* main                                                                                  */
/* ------------------------------------------------------------------------------------ */

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer-convert HF_DIR -o OUT.gguf [--layout llama.cpp|ds4|native] [--type T]\n"
            "                       [--type-CLASS T ...] [--no-mtp] [--mtp-out FILE] [--name NAME] [--quiet]\n"
            "T: auto (default: the checkpoint's FP8 / FP4 / BF16 / F32 where the layout has the type,\n"
            "   else q8_0 for FP8 matrices) f32 f16 bf16 q8_0 q4_k q2_k iq2_xxs mxfp4, or\n"
            "   q4_0 q4_1 q5_0 q5_1 q3_k q5_k q6_k iq4_nl iq4_xs iq3_xxs iq3_s iq2_xs iq2_s iq1_s iq1_m\n"
            "--type sets the matrices (attn shexp experts head engram draft); CLASS is one of\n"
            "   attn shexp experts head engram draft embd small ape, or all (every class)\n"
            "Layout default llama.cpp (docs/model-files.md 7); V4 MTP goes to --mtp-out (OUT-mtp.gguf)\n"
            "outside the native layout. docs/converting.md has the details.\n");
}

static int write_tokenizer(dsii_gguf_writer *w, const conv *c) {
    dsii_error e;
    const hf_vocab *v = &c->vocab;
    const char **s = malloc(sizeof *s * v->n);
    if (!s) return fail("out of memory");
    for (uint32_t i = 0; i < v->n; i++) s[i] = v->text[i];
    int rc = dsii_gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2", &e) ||
             dsii_gguf_writer_add_string(w, "tokenizer.ggml.pre", "joyai-llm", &e) ||
             dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", s, v->len, v->n, &e) ||
             dsii_gguf_writer_add_array(w, "tokenizer.ggml.token_type", DSII_GGUF_I32, v->type, v->n, &e) ||
             dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL,
                                               v->n_merges, &e);
    if (!rc && c->bos >= 0) rc = dsii_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos, &e);
    if (!rc && c->eos >= 0) rc = dsii_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos, &e);
    if (!rc && c->pad >= 0) rc = dsii_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)c->pad, &e);
    if (!rc) rc = dsii_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1, &e);
    free(s);
    return rc ? fail("%s", e.msg) : 0;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static void conv_free(conv *c) {
    dsii_emitter_free(c->em);
    for (size_t i = 0; i < c->n; i++) {
        free(c->t[i].ew);
        free(c->t[i].es);
    }
    free(c->t);
    free(c->used);
    free(c->primes);
    free(c->offsets);
    free(c->mults);
    free(c->tmap);
    free(c->config_text);
    hf_vocab_free(&c->vocab);
    st_close(&c->set);
    json_decref(c->cfg);
    memset(c, 0, sizeof *c);
}

static int run(conv *c, int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *mtp_out = NULL, *name = NULL;
    c->layout = DSII_LAYOUT_LLAMACPP;
    for (int i = 0; i < CL_COUNT; i++) c->cls_type[i] = -1;
    int quiet = 0, stats = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(a, "--layout") && i + 1 < argc) {
            c->layout = dsii_layout_parse(argv[++i]);
            if (c->layout < 0) return fail("unknown layout '%s' (llama.cpp, ds4, native)", argv[i]);
        } else if (!strcmp(a, "--mtp-out") && i + 1 < argc) mtp_out = argv[++i];
        else if (!strcmp(a, "--no-mtp")) c->no_mtp = 1;
        else if (!strcmp(a, "--name") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (!strcmp(a, "--type") && i + 1 < argc) {
            int32_t t;
            if (parse_type(argv[++i], &t)) return fail("unknown type '%s'", argv[i]);
            const int m[] = {CL_ATTN, CL_SHEXP, CL_EXPERTS, CL_HEAD, CL_ENGRAM, CL_DRAFT};
            for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) c->cls_type[m[k]] = t;
        } else if (!strncmp(a, "--type-", 7) && i + 1 < argc) {
            int32_t t;
            if (parse_type(argv[++i], &t)) return fail("unknown type '%s'", argv[i]);
            int found = 0;
            for (int k = 0; k < CL_COUNT; k++)
                if (!strcmp(a + 7, "all") ? (k != CL_VEC && k != CL_I32 && k != CL_TABLE) : !strcmp(a + 7, k_cls_name[k]))
                    c->cls_type[k] = t, found = 1;
            if (!found) return fail("unknown tensor class '%s' (attn shexp experts head engram draft embd small ape all)", a + 7);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (a[0] != '-' && !dir) dir = a;
        else {
            usage(stderr);
            return fail("unexpected argument '%s'", a);
        }
    }
    if (!dir || !out) {
        usage(stderr);
        return fail("need HF_DIR and -o OUT.gguf");
    }
    /* config.json */
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    c->config_text = read_text(path);
    if (!c->config_text) return fail("%s: cannot read", path);
    json_error_t je;
    c->cfg = json_loads(c->config_text, JSON_REJECT_DUPLICATES, &je);
    if (!c->cfg) return fail("%s: not valid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
    if (read_config(c)) return -1;
    /* shards */
    char err[2048];
    if (st_open_dir(dir, &c->set, err, sizeof err)) return fail("%s", err);
    /* tokenizer */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (hf_tokenizer_load(path, c->hp.n_vocab, &c->vocab, err, sizeof err)) return fail("%s", err);
    int64_t b = -1, e = -1, p = -1;
    if (cfg_int(c, "bos_token_id", 0, hf_vocab_find(&c->vocab, "<｜begin▁of▁sentence｜>"), &b) ||
        cfg_int(c, "eos_token_id", 0, hf_vocab_find(&c->vocab, "<｜end▁of▁sentence｜>"), &e) ||
        cfg_int(c, "pad_token_id", 0, hf_vocab_find(&c->vocab, "<｜▁pad▁｜>"), &p))
        return -1;
    c->bos = (int32_t)b, c->eos = (int32_t)e, c->pad = (int32_t)p;
    if (c->v41 && engram_constants(c)) return -1;
    if (plan(c)) return -1;
    for (size_t i = 0; i < c->n; i++) {
        c->t[i].type = choose_type(c, &c->t[i]);
        const dsii_type_traits *tr = dsii_type_get(c->t[i].type);
        if (tr && c->t[i].type != DSI_TYPE_I32 && !tr->quantize_row &&
            !((c->t[i].kind == K_FP8 || c->t[i].kind == K_TABLE) && tr->type >= DSI_TYPE_FP8_E4M3_B128) &&
            !(c->t[i].kind == K_FP4 && c->t[i].type == DSI_TYPE_MXFP4))
            return fail("tensor '%s': libdsinfer cannot write type %s yet", c->t[i].name, tr->name);
    }
    /* write */
    dsii_error de;
    dsii_emitter *em = NULL;
    const char *gname = name ? name : c->v41 ? "DeepSeek V4.1 Flash" : "DeepSeek V4 Flash";
    if (dsii_emitter_create(&c->hp, c->layout, gname, c->no_mtp, &em, &de) != DSI_OK) return fail("%s", de.msg);
    c->em = em;
    int rc = 0;
    for (int part = 0; part < DSII_EMIT_PARTS && !rc; part++) {
        dsii_gguf_writer *w = dsii_emitter_writer(em, part);
        if (!w) continue;
        rc = write_tokenizer(w, c);
        if (!rc && c->v41 && c->layout == DSII_LAYOUT_DS4 &&
            dsii_gguf_writer_add_string(w, "deepseek41.config", c->config_text, &de) != DSI_OK)
            rc = fail("%s", de.msg);
    }
    for (size_t i = 0; i < c->n && !rc; i++) {
        otensor *o = &c->t[i];
        /* FP8 tiles span B rows: runs of whole tiles keep the scale reads aligned */
        const uint32_t align = o->kind == K_FP8 ? o->blk : 1;
        if (dsii_emitter_add_rows(em, o->name, o->type, o->n_dims, o->ne, align, fill_rows, o, &de) != DSI_OK)
            rc = fail("%s", de.msg);
    }
    char mtp_path[4096];
    if (mtp_out) snprintf(mtp_path, sizeof mtp_path, "%s", mtp_out);
    else dsii_emit_draft_path(out, mtp_path, sizeof mtp_path);
    prog pg = {.quiet = quiet, .tty = isatty(2), .t0 = now_s()};
    for (int part = 0; part < DSII_EMIT_PARTS && !rc; part++) {
        if (!dsii_emitter_has_part(em, part)) continue;
        const char *dst = part == DSII_EMIT_MAIN ? out : mtp_path;
        pg.total = dsii_emitter_size(em, part);
        pg.what = part == DSII_EMIT_MAIN ? "model" : "MTP";
        pg.t0 = now_s();
        dsii_gguf_writer_set_progress(dsii_emitter_writer(em, part), on_progress, &pg);
        if (dsii_emitter_write(em, part, dst, &de) != DSI_OK) {
            rc = g_err[0] ? -1 : fail("%s", de.msg);
            remove(dst);
        } else if (!quiet) {
            fprintf(stderr, "%sdsinfer-convert: wrote %s (%s layout, %.3f GiB, %.1f s)\n", pg.tty ? "\n" : "", dst,
                    dsii_layout_name(c->layout), (double)pg.total / 1073741824.0, now_s() - pg.t0);
        }
    }
    if (!rc && stats) {
        /* VmHWM: this process image's peak RSS (getrusage's ru_maxrss would include the RSS
         * of the parent at fork time, which Linux carries across exec) */
        long kib = -1;
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "VmHWM:", 6)) kib = strtol(line + 6, NULL, 10);
        if (f) fclose(f);
        if (kib < 0) {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            kib = ru.ru_maxrss;
        }
        printf("peak_rss_kib %ld\n", kib);
    }
    return rc;
}

int main(int argc, char **argv) {
    conv c;
    memset(&c, 0, sizeof c);
    const int rc = run(&c, argc, argv);
    conv_free(&c);
    if (rc != 0) {
        fprintf(stderr, "dsinfer-convert: %s\n", g_err[0] ? g_err : "failed");
        return 1;
    }
    return 0;
}
