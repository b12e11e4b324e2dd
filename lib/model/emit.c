/* GGUF writing in the native, llama.cpp and ds4 layouts (emit.h, docs/model-files.md §7). */
#include "model/emit.h"

#include "engram/engram.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x)                                  \
    do {                                        \
        dsi_status st_ = (x);                   \
        if (st_ != DSI_OK) return st_;          \
    } while (0)

/* ------------------------------------------------------------------------------------ */
/* Hyperparameter keys                                                                   */
/* ------------------------------------------------------------------------------------ */

typedef struct kw {
    dsii_gguf_writer *w;
    const char *arch;
    char key[192];
    dsii_error *err;
} kw;

static const char *K(kw *k, const char *suffix) {
    snprintf(k->key, sizeof k->key, "%s.%s", k->arch, suffix);
    return k->key;
}

#define U32(s, v) TRY(dsii_gguf_writer_add_u32(k->w, K(k, s), (uint32_t)(v), k->err))
#define F32(s, v) TRY(dsii_gguf_writer_add_f32(k->w, K(k, s), (float)(v), k->err))
#define STR(s, v) TRY(dsii_gguf_writer_add_string(k->w, K(k, s), v, k->err))
#define ARR(s, t, p, n) TRY(dsii_gguf_writer_add_array(k->w, K(k, s), t, p, n, k->err))

/* ds4's deepseek41 dialect (antirez/ds4 gguf-tools/deepseek41_metadata.py): HF config
 * names, a scalar SwiGLU limit, rope_scaling.* as f32, Engram without the derivable keys. */
static dsi_status write_ds4v41(kw *k, const dsii_hparams *hp) {
    const uint32_t L = hp->n_layer;
    uint32_t ratios[DSII_MAX_LAYERS], kvs[DSII_MAX_LAYERS], ixs[DSII_MAX_LAYERS], nk = 0, ni = 0;
    for (uint32_t i = 0; i < L; i++) {
        ratios[i] = hp->layer[i].compress_ratio;
        if (hp->layer[i].is_kv_source) kvs[nk++] = i;
        if (hp->layer[i].is_index_source) ixs[ni++] = i;
    }
    U32("vocab_size", hp->n_vocab);
    U32("hidden_size", hp->n_embd);
    U32("moe_intermediate_size", hp->expert_ff);
    U32("num_hidden_layers", L);
    U32("num_attention_heads", hp->n_head);
    U32("num_key_value_heads", 1);
    U32("head_dim", hp->head_dim);
    U32("qk_rope_head_dim", hp->rope_dim);
    U32("q_lora_rank", hp->q_lora_rank);
    U32("o_lora_rank", hp->o_lora_rank);
    U32("o_groups", hp->o_groups);
    U32("n_routed_experts", hp->n_expert);
    U32("n_shared_experts", hp->n_expert_shared);
    U32("num_experts_per_tok", hp->n_expert_used);
    U32("max_position_embeddings", hp->n_ctx_train);
    U32("sliding_window", hp->window);
    U32("index_n_heads", hp->idx_n_head);
    U32("index_head_dim", hp->idx_head_dim);
    U32("index_topk", hp->idx_topk);
    if (hp->candidate_source >= 0) {
        U32("candidate_source_layer_id", hp->candidate_source);
        U32("candidate_topk_blocks", hp->candidate_topk_blocks);
        U32("candidate_block_size", hp->candidate_block_size);
    }
    U32("hc_mult", hp->hc_mult);
    U32("hc_sinkhorn_iters", hp->hc_sinkhorn_iters);
    if (hp->rope_base != (float)(uint32_t)hp->rope_base || hp->rope_base_compress != (float)(uint32_t)hp->rope_base_compress)
        return dsii_fail(k->err, DSI_ERR_INVALID_ARGUMENT, "ds4 layout: RoPE bases must be integers (ds4 stores them as u32)");
    U32("rope_theta", hp->rope_base);
    U32("compress_rope_theta", hp->rope_base_compress);
    F32("rms_norm_eps", hp->rms_eps);
    F32("hc_eps", hp->hc_eps);
    F32("swiglu_limit", hp->layer[0].swiglu_limit);
    F32("routed_scaling_factor", hp->route_scale);
    STR("scoring_func", "sqrtsoftplus");
    STR("hidden_act", "silu");
    STR("topk_method", "noaux_tc");
    TRY(dsii_gguf_writer_add_bool(k->w, K(k, "norm_topk_prob"), 1, k->err));
    ARR("compress_ratios", DSII_GGUF_U32, ratios, L);
    ARR("kv_source_layer_ids", DSII_GGUF_U32, kvs, nk);
    ARR("index_source_layer_ids", DSII_GGUF_U32, ixs, ni);
    F32("rope_scaling.factor", hp->yarn_factor);
    F32("rope_scaling.beta_fast", hp->yarn_beta_fast);
    F32("rope_scaling.beta_slow", hp->yarn_beta_slow);
    F32("rope_scaling.original_max_position_embeddings", hp->yarn_orig_ctx);
    if (hp->has_engram) {
        const dsii_engram_hparams *e = &hp->engram;
        const uint64_t np = (uint64_t)e->n_layer * e->n_cols, nm = (uint64_t)e->n_layer * e->max_ngram;
        uint32_t rows[DSII_MAX_ENGRAM_LAYERS];
        for (uint32_t l = 0; l < e->n_layer; l++) {
            if (e->rows[l] > UINT32_MAX)
                return dsii_fail(k->err, DSI_ERR_INVALID_ARGUMENT, "ds4 layout: engram rows above 2^32");
            rows[l] = (uint32_t)e->rows[l];
        }
        uint32_t *p32 = malloc(sizeof *p32 * (size_t)(np + e->n_token_map + 1));
        if (!p32) return dsii_fail(k->err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
        for (uint64_t i = 0; i < np; i++) p32[i] = (uint32_t)e->primes[i];
        uint32_t *map = p32 + np;
        for (uint32_t i = 0; i < e->n_token_map; i++) map[i] = (uint32_t)e->token_map[i];
        dsi_status st = DSI_OK;
#define T_(x) \
    if (st == DSI_OK) st = (x)
        T_(dsii_gguf_writer_add_string(k->w, K(k, "engram.encoding"), DSII_ENGRAM_ROW264_ENCODING, k->err));
        T_(dsii_gguf_writer_add_array(k->w, K(k, "engram.layer_ids"), DSII_GGUF_U32, e->layer_ids, e->n_layer, k->err));
        T_(dsii_gguf_writer_add_array(k->w, K(k, "engram.rows"), DSII_GGUF_U32, rows, e->n_layer, k->err));
        T_(dsii_gguf_writer_add_u32(k->w, K(k, "engram.compressed_vocab_size"), e->compressed_vocab, k->err));
        T_(dsii_gguf_writer_add_u32(k->w, K(k, "engram.pad_id"), e->pad_id, k->err));
        T_(dsii_gguf_writer_add_array(k->w, K(k, "engram.token_map"), DSII_GGUF_U32, map, e->n_token_map, k->err));
        T_(dsii_gguf_writer_add_array(k->w, K(k, "engram.primes"), DSII_GGUF_U32, p32, np, k->err));
        T_(dsii_gguf_writer_add_array(k->w, K(k, "engram.multipliers"), DSII_GGUF_U64, e->multipliers, nm, k->err));
#undef T_
        free(p32);
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

dsi_status dsii_layout_write_hparams(dsii_gguf_writer *w, const dsii_hparams *hp, int layout,
                                     int part, int n_draft, dsii_error *err) {
    const int v41 = hp->arch == DSI_ARCH_DEEPSEEK41;
    kw kk = {.w = w, .arch = v41 ? "deepseek41" : "deepseek4", .err = err};
    kw *k = &kk;
    if (v41 && layout == DSII_LAYOUT_DS4) return write_ds4v41(k, hp);

    const uint32_t L = hp->n_layer;
    /* llama.cpp's MTP file counts the MTP block in block_count; its per-layer arrays are
     * exactly block_count long (llama_model_loader::get_key_or_arr) */
    const int lcpp_mtp = layout == DSII_LAYOUT_LLAMACPP && part == DSII_EMIT_DRAFT && !v41;
    const uint32_t n_arr = L + (uint32_t)n_draft;
    U32("block_count", lcpp_mtp ? L + 1 : L);
    U32("context_length", hp->n_ctx_train);
    U32("embedding_length", hp->n_embd);
    if (layout == DSII_LAYOUT_LLAMACPP && !v41) U32("embedding_length_out", hp->n_embd * hp->hc_mult);
    U32("vocab_size", hp->n_vocab);
    U32("attention.head_count", hp->n_head);
    U32("attention.head_count_kv", 1);
    U32("attention.key_length", hp->head_dim);
    U32("attention.value_length", hp->head_dim);
    U32("rope.dimension_count", hp->rope_dim);
    U32("attention.q_lora_rank", hp->q_lora_rank);
    U32("attention.output_lora_rank", hp->o_lora_rank);
    U32("attention.output_group_count", hp->o_groups);
    U32("attention.sliding_window", hp->window);
    U32("attention.indexer.head_count", hp->idx_n_head);
    U32("attention.indexer.key_length", hp->idx_head_dim);
    U32("attention.indexer.top_k", hp->idx_topk);
    uint32_t ratios[DSII_MAX_LAYERS + DSII_MAX_DRAFT];
    float clamp[DSII_MAX_LAYERS + DSII_MAX_DRAFT], clamp_sh[DSII_MAX_LAYERS + DSII_MAX_DRAFT];
    int sh_differs = 0;
    for (uint32_t i = 0; i < n_arr; i++) {
        const dsii_layer_hparams *l = i < L ? &hp->layer[i] : &hp->draft_layer[i - L];
        ratios[i] = i < L ? l->compress_ratio : 0;
        clamp[i] = l->swiglu_limit;
        clamp_sh[i] = l->swiglu_limit_shexp;
        if (clamp_sh[i] != clamp[i]) sh_differs = 1;
    }
    ARR("attention.compress_ratios", DSII_GGUF_U32, ratios, n_arr);
    F32("attention.compress_rope_freq_base", hp->rope_base_compress);
    F32("rope.freq_base", hp->rope_base);
    /* llama.cpp reads a missing type as linear scaling (docs/model-files.md §2.7) */
    STR("rope.scaling.type", hp->yarn_factor > 1.0f ? "yarn" : "none");
    F32("rope.scaling.factor", hp->yarn_factor);
    U32("rope.scaling.original_context_length", hp->yarn_orig_ctx);
    F32("rope.scaling.yarn_beta_fast", hp->yarn_beta_fast);
    F32("rope.scaling.yarn_beta_slow", hp->yarn_beta_slow);
    F32("attention.layer_norm_rms_epsilon", hp->rms_eps);
    U32("expert_count", hp->n_expert);
    U32("expert_used_count", hp->n_expert_used);
    U32("expert_feed_forward_length", hp->expert_ff);
    U32("expert_shared_count", hp->n_expert_shared);
    F32("expert_weights_scale", hp->route_scale);
    TRY(dsii_gguf_writer_add_bool(w, K(k, "expert_weights_norm"), 1, err));
    U32("expert_gating_func", 4); /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS */
    U32("hash_layer_count", hp->n_hash_layer);
    ARR("swiglu_clamp_exp", DSII_GGUF_F32, clamp, n_arr);
    if (sh_differs || layout == DSII_LAYOUT_LLAMACPP) ARR("swiglu_clamp_shexp", DSII_GGUF_F32, clamp_sh, n_arr);
    U32("hyper_connection.count", hp->hc_mult);
    U32("hyper_connection.sinkhorn_iterations", hp->hc_sinkhorn_iters);
    F32("hyper_connection.epsilon", hp->hc_eps);
    if (n_draft > 0) U32("nextn_predict_layers", n_draft);
    if (v41) {
        uint32_t kvs[DSII_MAX_LAYERS], ixs[DSII_MAX_LAYERS], nk = 0, ni = 0;
        for (uint32_t i = 0; i < L; i++) {
            if (hp->layer[i].is_kv_source) kvs[nk++] = i;
            if (hp->layer[i].is_index_source) ixs[ni++] = i;
        }
        ARR("kv_source_layer_ids", DSII_GGUF_U32, kvs, nk);
        ARR("index_source_layer_ids", DSII_GGUF_U32, ixs, ni);
        if (hp->candidate_source >= 0) {
            U32("attention.candidate_source_layer_id", hp->candidate_source);
            U32("attention.candidate_topk_blocks", hp->candidate_topk_blocks);
            U32("attention.candidate_block_size", hp->candidate_block_size);
        }
        if (hp->has_engram) {
            const dsii_engram_hparams *e = &hp->engram;
            const uint64_t np = (uint64_t)e->n_layer * e->n_cols, nm = (uint64_t)e->n_layer * e->max_ngram;
            /* outside the native layout the tables are ds4's I8 row264 rows (emitter) */
            if (layout != DSII_LAYOUT_NATIVE) STR("engram.encoding", DSII_ENGRAM_ROW264_ENCODING);
            ARR("engram.layer_ids", DSII_GGUF_U32, e->layer_ids, e->n_layer);
            U32("engram.head_count", e->n_head);
            U32("engram.key_length", e->key_length);
            U32("engram.max_ngram_size", e->max_ngram);
            ARR("engram.multipliers", DSII_GGUF_U64, e->multipliers, nm);
            ARR("engram.primes", DSII_GGUF_U64, e->primes, np);
            ARR("engram.offsets", DSII_GGUF_U64, e->offsets, np);
            ARR("engram.token_map", DSII_GGUF_I32, e->token_map, e->n_token_map);
            U32("engram.pad_id", e->pad_id);
            U32("engram.compressed_vocab_size", e->compressed_vocab);
        }
        if (n_draft > 0 && hp->has_dspark) {
            const dsii_dspark_hparams *d = &hp->dspark;
            ARR("dspark_target_layer_ids", DSII_GGUF_U32, d->target_layer_ids, d->n_target);
            U32("dspark_block_size", d->block_size);
            U32("dspark_noise_token_id", d->noise_token);
            U32("dspark_markov_rank", d->markov_rank);
            U32("dspark_expert_count", d->n_expert);
            U32("dspark_expert_used_count", d->n_expert_used);
        }
    }
    return DSI_OK;
}

/* ------------------------------------------------------------------------------------ */
/* Tensors                                                                               */
/* ------------------------------------------------------------------------------------ */

/* A source tensor: filled whole (`fill`) or a run of rows at a time (`fill_rows`). */
typedef struct src_t {
    int32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    uint64_t nbytes;
    dsii_gguf_fill_fn fill;
    dsii_gguf_fill_rows_fn fill_rows;
    uint32_t row_align;
    void *user;
    uint8_t *cache;    /* whole sources read through src_rows: the tensor, while in use */
} src_t;

static uint64_t src_nrows(const src_t *s) { return (uint64_t)s->ne[1] * (uint64_t)s->ne[2] * (uint64_t)s->ne[3]; }

/* Rows [row0, row0 + n) of a source into dst. */
static int src_rows(src_t *s, uint64_t row0, uint64_t n, uint8_t *dst) {
    if (s->fill_rows) return s->fill_rows(s->user, row0, n, dst);
    const uint64_t rows = src_nrows(s), rb = s->nbytes / rows;
    if (!s->cache) {
        s->cache = malloc((size_t)s->nbytes);
        if (!s->cache || s->fill(s->user, s->cache, s->nbytes) != 0) {
            free(s->cache);
            s->cache = NULL;
            return 1;
        }
    }
    memcpy(dst, s->cache + row0 * rb, (size_t)(n * rb));
    if (row0 + n == rows) {
        free(s->cache);
        s->cache = NULL;
    }
    return 0;
}

/* Transform closures (owned by the emitter). */
typedef struct xform {
    int kind;          /* X_ROW264, X_EH_PROJ */
    src_t a, b;        /* row264: a = the R32 table; eh_proj: a = e_proj, b = h_proj */
    uint64_t row_a, row_b, rows;
} xform;
enum { X_ROW264 = 1, X_EH_PROJ = 2 };

typedef struct pending {
    char name[96];
    src_t s;
    int part;
} pending;

struct dsii_emitter {
    const dsii_hparams *hp;
    int layout, v41, drop_draft;
    int has_part[DSII_EMIT_PARTS];
    dsii_gguf_writer *w[DSII_EMIT_PARTS];
    xform **xf;
    uint32_t n_xf, cap_xf;
    pending *tail;      /* tensors written last (ds4 Engram extent) */
    uint32_t n_tail, cap_tail;
    int have_e, have_h; /* llama.cpp MTP: e_proj / h_proj seen */
    src_t e_proj, h_proj;
    int started;
};

static int fill_xform(void *user, uint64_t row0, uint64_t n, void *dst) {
    xform *x = user;
    uint8_t *o = dst;
    uint8_t *a = malloc((size_t)(n * x->row_a));
    if (!a) return 1;
    int rc = src_rows(&x->a, row0, n, a);
    if (!rc && x->kind == X_ROW264) {
        /* [e][32 values] x K/32  ->  [K values][K/32 scales] per row (lossless) */
        const uint64_t K = (uint64_t)x->a.ne[0], nb = K / 32;
        for (uint64_t r = 0; r < n; r++) {
            const uint8_t *s = a + r * x->row_a;
            uint8_t *d = o + r * (K + nb);
            for (uint64_t j = 0; j < nb; j++) {
                d[K + j] = s[j * 33];
                memcpy(d + 32 * j, s + j * 33 + 1, 32);
            }
        }
    } else if (!rc) {
        /* eh_proj row r = [e_proj row r ; h_proj row r] (llama.cpp concatenates along the input) */
        uint8_t *b = malloc((size_t)(n * x->row_b));
        rc = !b || src_rows(&x->b, row0, n, b);
        for (uint64_t r = 0; !rc && r < n; r++) {
            memcpy(o + r * (x->row_a + x->row_b), a + r * x->row_a, (size_t)x->row_a);
            memcpy(o + r * (x->row_a + x->row_b) + x->row_a, b + r * x->row_b, (size_t)x->row_b);
        }
        free(b);
    }
    free(a);
    return rc;
}

static xform *new_xform(dsii_emitter *e, dsii_error *err) {
    if (e->n_xf == e->cap_xf) {
        uint32_t cap = e->cap_xf ? 2 * e->cap_xf : 8;
        xform **p = realloc(e->xf, sizeof *p * cap);
        if (!p) return NULL;
        e->xf = p;
        e->cap_xf = cap;
    }
    xform *x = calloc(1, sizeof *x);
    if (!x) {
        dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
        return NULL;
    }
    e->xf[e->n_xf++] = x;
    return x;
}

dsi_status dsii_emitter_create(const dsii_hparams *hp, int layout, const char *name,
                               int drop_draft, dsii_emitter **out, dsii_error *err) {
    *out = NULL;
    if (!hp || layout < 0 || layout >= DSII_LAYOUT_COUNT)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "emitter: bad arguments");
    const int v41 = hp->arch == DSI_ARCH_DEEPSEEK41;
    if (v41 && layout == DSII_LAYOUT_DS4) {
        for (uint32_t i = 1; i < hp->n_layer; i++)
            if (hp->layer[i].swiglu_limit != hp->layer[0].swiglu_limit ||
                hp->layer[i].swiglu_limit_shexp != hp->layer[0].swiglu_limit)
                return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                                 "ds4 layout: deepseek41 stores one SwiGLU limit (swiglu_limit); layer %u differs", i);
    }
    dsii_emitter *e = calloc(1, sizeof *e);
    if (!e) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    e->hp = hp;
    e->layout = layout;
    e->v41 = v41;
    e->drop_draft = drop_draft || hp->n_draft == 0 || (v41 && layout == DSII_LAYOUT_DS4);
    e->has_part[DSII_EMIT_MAIN] = 1;
    /* V4 MTP: a second file in the llama.cpp and ds4 layouts */
    e->has_part[DSII_EMIT_DRAFT] = !e->drop_draft && !v41 && layout != DSII_LAYOUT_NATIVE;
    dsi_status st = DSI_OK;
    for (int p = 0; p < DSII_EMIT_PARTS && st == DSI_OK; p++) {
        if (!e->has_part[p]) continue;
        dsii_gguf_writer *w = e->w[p] = dsii_gguf_writer_create(NULL);
        if (!w) {
            st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
            break;
        }
        st = dsii_gguf_writer_add_string(w, "general.architecture", v41 ? "deepseek41" : "deepseek4", err);
        if (st == DSI_OK && name) st = dsii_gguf_writer_add_string(w, "general.name", name, err);
        if (st == DSI_OK && v41 && layout == DSII_LAYOUT_DS4)
            st = dsii_gguf_writer_set_alignment(w, DSII_DS4_V41_ALIGNMENT, err);
        /* the draft blocks written into this part (native keeps them in the model file) */
        int n_draft = 0;
        if (!e->drop_draft) n_draft = layout == DSII_LAYOUT_NATIVE || v41 ? (p == DSII_EMIT_MAIN ? (int)hp->n_draft : 0)
                                                                          : (p == DSII_EMIT_DRAFT ? 1 : 0);
        if (st == DSI_OK) st = dsii_layout_write_hparams(w, hp, layout, p, n_draft, err);
    }
    if (st != DSI_OK) {
        dsii_emitter_free(e);
        return st;
    }
    *out = e;
    return DSI_OK;
}

void dsii_emitter_free(dsii_emitter *e) {
    if (!e) return;
    for (int p = 0; p < DSII_EMIT_PARTS; p++) dsii_gguf_writer_free(e->w[p]);
    for (uint32_t i = 0; i < e->n_xf; i++) {
        free(e->xf[i]->a.cache);
        free(e->xf[i]->b.cache);
        free(e->xf[i]);
    }
    free(e->xf);
    free(e->tail);
    free(e);
}

int dsii_emitter_has_part(const dsii_emitter *e, int part) {
    return e && part >= 0 && part < DSII_EMIT_PARTS && e->has_part[part];
}

dsii_gguf_writer *dsii_emitter_writer(dsii_emitter *e, int part) {
    return dsii_emitter_has_part(e, part) ? e->w[part] : NULL;
}

static int is_fp8_type(int32_t t) {
    return t == DSI_TYPE_FP8_E4M3_B128 || t == DSI_TYPE_FP8_E4M3_B32 || t == DSI_TYPE_FP8_E4M3_R32;
}

static dsi_status put(dsii_emitter *e, int part, const char *name, const src_t *s, dsii_error *err) {
    e->started = 1;
    if (s->fill_rows)
        return dsii_gguf_writer_add_tensor_rows(e->w[part], name, s->type, s->n_dims, s->ne, s->row_align,
                                                s->fill_rows, s->user, err);
    return dsii_gguf_writer_add_tensor_fn(e->w[part], name, s->type, s->n_dims, s->ne, s->fill, s->user, err);
}

static dsi_status add_src(dsii_emitter *e, const char *name, src_t s, dsii_error *err);

dsi_status dsii_emitter_add(dsii_emitter *e, const char *name, int32_t type, uint32_t n_dims,
                            const int64_t *ne, dsii_gguf_fill_fn fill, void *user,
                            dsii_error *err) {
    if (!e || !name || !ne || !fill || n_dims < 1 || n_dims > 4)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "emitter: bad tensor arguments");
    src_t s = {.type = type, .n_dims = n_dims, .fill = fill, .user = user};
    for (int i = 0; i < 4; i++) s.ne[i] = i < (int)n_dims ? ne[i] : 1;
    return add_src(e, name, s, err);
}

dsi_status dsii_emitter_add_rows(dsii_emitter *e, const char *name, int32_t type, uint32_t n_dims,
                                 const int64_t *ne, uint32_t row_align, dsii_gguf_fill_rows_fn fill,
                                 void *user, dsii_error *err) {
    if (!e || !name || !ne || !fill || n_dims < 1 || n_dims > 4)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "emitter: bad tensor arguments");
    src_t s = {.type = type, .n_dims = n_dims, .fill_rows = fill, .row_align = row_align, .user = user};
    for (int i = 0; i < 4; i++) s.ne[i] = i < (int)n_dims ? ne[i] : 1;
    return add_src(e, name, s, err);
}

static dsi_status add_src(dsii_emitter *e, const char *name, src_t s, dsii_error *err) {
    const int32_t type = s.type;
    const uint32_t n_dims = s.n_dims;
    if (!dsii_type_nbytes(type, s.ne, n_dims, &s.nbytes))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "emitter: tensor '%s' has a bad shape for its type", name);
    const int native = e->layout == DSII_LAYOUT_NATIVE;
    const int is_draft = strncmp(name, "mtp.", 4) == 0;
    const int is_table = strstr(name, ".engram.embd.weight") != NULL;
    if (!native && is_fp8_type(type) && !(is_table && e->v41))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "tensor '%s': type %s exists only in the native layout (choose a ggml type for the %s layout)",
                         name, dsii_type_get(type)->name, dsii_layout_name(e->layout));
    if (is_draft && e->drop_draft) return DSI_OK;

    /* deepseek41 outside the native layout: the Engram table re-encoded to ds4's I8 row264
     * rows (ggml has no FP8 type) and put at the end; ds4 also renames the engram_* tensors */
    if (e->v41 && !native && strncmp(name, "blk.", 4) == 0) {
        const char *dot = strchr(name + 4, '.');
        const char *alias = dot ? dsii_layout_ds4v41_tensor(dot + 1) : NULL;
        if (alias) {
            char nn[96];
            if (e->layout == DSII_LAYOUT_DS4)
                snprintf(nn, sizeof nn, "%.*s%s", (int)(dot + 1 - name), name, alias);
            else
                snprintf(nn, sizeof nn, "%s", name);
            if (!is_table) return put(e, DSII_EMIT_MAIN, nn, &s, err);
            if (type != DSI_TYPE_FP8_E4M3_R32 || n_dims != 2 || s.ne[0] % 32)
                return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                                 "tensor '%s': the ds4 layout needs the Engram table as fp8_e4m3_r32 rows of a multiple of 32",
                                 name);
            xform *x = new_xform(e, err);
            if (!x) return err->status;
            x->kind = X_ROW264;
            x->a = s;
            x->rows = (uint64_t)s.ne[1];
            dsii_type_row_size(type, s.ne[0], &x->row_a);
            if (e->n_tail == e->cap_tail) {
                uint32_t cap = e->cap_tail ? 2 * e->cap_tail : 4;
                pending *p = realloc(e->tail, sizeof *p * cap);
                if (!p) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
                e->tail = p;
                e->cap_tail = cap;
            }
            pending *pd = &e->tail[e->n_tail++];
            snprintf(pd->name, sizeof pd->name, "%s", nn);
            pd->part = DSII_EMIT_MAIN;
            pd->s = (src_t){.type = DSI_TYPE_I8, .n_dims = 2, .ne = {s.ne[0] / 32 * 33, s.ne[1], 1, 1},
                            .fill_rows = fill_xform, .row_align = s.row_align, .user = x};
            pd->s.nbytes = x->rows * (uint64_t)pd->s.ne[0];
            return DSI_OK;
        }
    }
    if (!is_draft || native || e->v41) {
        dsi_status st = put(e, DSII_EMIT_MAIN, name, &s, err);
        /* llama.cpp's MTP file repeats the embedding, the head and its norm */
        if (st == DSI_OK && e->has_part[DSII_EMIT_DRAFT] && e->layout == DSII_LAYOUT_LLAMACPP &&
            (!strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight") || !strcmp(name, "output_norm.weight")))
            st = put(e, DSII_EMIT_DRAFT, name, &s, err);
        return st;
    }
    /* V4 MTP block, second file */
    if (e->layout == DSII_LAYOUT_DS4) return put(e, DSII_EMIT_DRAFT, name, &s, err); /* mtp.0.* as is */
    const uint32_t L = e->hp->n_layer;
    const char *suf = name + strlen("mtp.0.");
    char nn[96];
    if (!strcmp(suf, "e_proj.weight") || !strcmp(suf, "h_proj.weight")) {
        if (suf[0] == 'e') {
            e->e_proj = s;
            e->have_e = 1;
        } else {
            e->h_proj = s;
            e->have_h = 1;
        }
        if (!(e->have_e && e->have_h)) return DSI_OK;
        if (e->e_proj.type != e->h_proj.type || e->e_proj.ne[0] != e->h_proj.ne[0] || e->e_proj.ne[1] != e->h_proj.ne[1])
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "mtp.0.e_proj / h_proj: different types or shapes cannot be fused");
        xform *x = new_xform(e, err);
        if (!x) return err->status;
        x->kind = X_EH_PROJ;
        x->a = e->e_proj;
        x->b = e->h_proj;
        x->rows = (uint64_t)e->e_proj.ne[1];
        if (!dsii_type_row_size(e->e_proj.type, e->e_proj.ne[0], &x->row_a)) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "eh_proj");
        x->row_b = x->row_a;
        src_t m = {.type = e->e_proj.type, .n_dims = 2, .ne = {2 * e->e_proj.ne[0], e->e_proj.ne[1], 1, 1},
                   .fill_rows = fill_xform, .user = x,
                   .row_align = e->e_proj.row_align > e->h_proj.row_align ? e->e_proj.row_align : e->h_proj.row_align};
        snprintf(nn, sizeof nn, "blk.%u.nextn.eh_proj.weight", L);
        return put(e, DSII_EMIT_DRAFT, nn, &m, err);
    }
    static const char *const head[][2] = {
        {"enorm.weight", "blk.%u.nextn.enorm.weight"},
        {"hnorm.weight", "blk.%u.nextn.hnorm.weight"},
        {"norm.weight", "blk.%u.nextn.shared_head_norm.weight"},
        {"hc_head_fn.weight", "output_hc_fn.weight"},
        {"hc_head_base.weight", "output_hc_base.weight"},
        {"hc_head_scale.weight", "output_hc_scale.weight"},
    };
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        if (!strcmp(suf, head[i][0])) {
            snprintf(nn, sizeof nn, head[i][1], L);
            return put(e, DSII_EMIT_DRAFT, nn, &s, err);
        }
    snprintf(nn, sizeof nn, "blk.%u.%s", L, suf);
    return put(e, DSII_EMIT_DRAFT, nn, &s, err);
}

static dsi_status flush_tail(dsii_emitter *e, dsii_error *err) {
    for (uint32_t i = 0; i < e->n_tail; i++)
        TRY(put(e, e->tail[i].part, e->tail[i].name, &e->tail[i].s, err));
    e->n_tail = 0;
    if (e->has_part[DSII_EMIT_DRAFT] && e->layout == DSII_LAYOUT_LLAMACPP && e->have_e != e->have_h)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "mtp.0.%s_proj is missing: the llama.cpp layout fuses e_proj and h_proj",
                         e->have_e ? "h" : "e");
    return DSI_OK;
}

dsi_status dsii_emitter_write(dsii_emitter *e, int part, const char *path, dsii_error *err) {
    if (!dsii_emitter_has_part(e, part) || !path)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "emitter: no such part");
    TRY(flush_tail(e, err));
    return dsii_gguf_writer_write_path(e->w[part], path, err);
}

uint64_t dsii_emitter_size(dsii_emitter *e, int part) {
    if (!dsii_emitter_has_part(e, part)) return 0;
    dsii_error err;
    if (flush_tail(e, &err) != DSI_OK) return 0;
    return dsii_gguf_writer_size(e->w[part]);
}

void dsii_emit_draft_path(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) n -= 5;
    snprintf(out, cap, "%.*s-mtp.gguf", (int)n, path);
}
