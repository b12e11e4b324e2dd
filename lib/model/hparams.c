/*
 * Hyperparameters of deepseek4 / deepseek41 from GGUF metadata (docs/model-files.md §2),
 * with every consistency check that does not need tensor data. Tensor shapes are checked
 * by the binder (model_load.c) against what is derived here.
 */
#include "model/model.h"
#include "model/layout.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Sanity limits: far above the releases, low enough that products of them cannot overflow
 * 64-bit arithmetic in the shape checks. */
#define LIM_EMBD (1u << 16)
#define LIM_VOCAB (1u << 24)
#define LIM_HEADS 4096u
#define LIM_HEAD_DIM 8192u
#define LIM_RANK (1u << 16)
#define LIM_EXPERTS 65536u
#define LIM_FF (1u << 18)
#define LIM_RATIO (1u << 20)
#define LIM_ENGRAM_HEADS 256u
#define LIM_ENGRAM_NGRAM 16u

#define TRY_(x)                                 \
    do {                                        \
        dsi_status st_ = (x);                   \
        if (st_ != DSI_OK) return st_;          \
    } while (0)

typedef struct keyctx {
    const dsii_gguf *g;
    const char *arch;
    int ds4v41;        /* ds4's deepseek41 spellings (layout.h): HF config key names */
    int via_alias;     /* the last resolve() found the ds4 spelling */
    char key[256];
} keyctx;

static const char *mk(keyctx *k, const char *suffix) {
    snprintf(k->key, sizeof k->key, "%s.%s", k->arch, suffix);
    return k->key;
}

/* The key actually present for canonical `suffix`: the canonical spelling, else `alt` (an
 * alternative suffix of other converters, may be NULL), else ds4's deepseek41 spelling.
 * Returns the full key (in k->key) or NULL when none is present; k->key then holds the
 * canonical spelling (for messages). */
static const char *resolve(keyctx *k, const char *suffix, const char *alt) {
    k->via_alias = 0;
    if (alt) {
        mk(k, alt);
        if (dsii_gguf_find_key(k->g, k->key) >= 0) return k->key;
    }
    if (k->ds4v41) {
        const char *a = dsii_layout_ds4v41_key(suffix);
        if (a) {
            mk(k, a);
            if (dsii_gguf_find_key(k->g, k->key) >= 0) {
                k->via_alias = 1;
                return k->key;
            }
        }
    }
    mk(k, suffix);
    return dsii_gguf_find_key(k->g, k->key) >= 0 ? k->key : NULL;
}

/* Converts the reader's NOT_FOUND into BAD_FORMAT for required keys. */
static dsi_status req_status(dsi_status st, const char *key, dsii_error *err) {
    if (st == DSI_ERR_NOT_FOUND)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing required key '%s'", key);
    return st;
}

/* ds4 writes some integers as f32 (rope_scaling.original_max_position_embeddings) and some
 * floats as u32 (rope_theta): through the ds4 spelling any numeric scalar is accepted
 * (integers must be integral); the canonical spellings keep the strict GGUF types. */
static dsi_status alias_number(keyctx *k, const char *key, double *out, dsii_error *err) {
    const int64_t i = dsii_gguf_find_key(k->g, key);
    const dsii_gguf_value *v = dsii_gguf_kv_val(k->g, i);
    if (!v || !dsii_gguf_val_as_f64(v, out))
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' has type %s, expected a number", key,
                         dsii_gguf_value_type_name(dsii_gguf_kv_type(k->g, i)));
    return DSI_OK;
}

/* u32 key: required (def ignored) or optional with default. `alt` is an alternative suffix
 * accepted when the primary is absent (or NULL). Range [lo, hi]. */
static dsi_status get_u32(keyctx *k, const char *suffix, const char *alt, int required,
                          uint32_t def, uint32_t lo, uint32_t hi, uint32_t *out,
                          dsii_error *err) {
    const char *key = resolve(k, suffix, alt);
    if (!key) {
        if (!required) {
            *out = def;
            return DSI_OK;
        }
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing required key '%s'", k->key);
    }
    uint64_t v = 0;
    const uint32_t vt = dsii_gguf_kv_type(k->g, dsii_gguf_find_key(k->g, key));
    if (k->via_alias && (vt == DSII_GGUF_F32 || vt == DSII_GGUF_F64)) {
        double d = 0;
        TRY_(alias_number(k, key, &d, err));
        if (!(d >= 0 && d <= 18446744073709549568.0) || d != (double)(uint64_t)d)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' value %g is not a non-negative integer", key, d);
        v = (uint64_t)d;
    } else {
        dsi_status st = dsii_gguf_get_u64(k->g, key, &v, err);
        /* the reader's message names the key; a negative value reads as out of range */
        if (st != DSI_OK) return req_status(st, key, err);
    }
    if (v < lo || v > hi)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' value %" PRIu64 " out of range [%u, %u]",
                         key, v, lo, hi);
    *out = (uint32_t)v;
    return DSI_OK;
}

static dsi_status get_f32(keyctx *k, const char *suffix, int required, float def, float lo,
                          float hi, float *out, dsii_error *err) {
    const char *key = resolve(k, suffix, NULL);
    if (!key) {
        if (!required) {
            *out = def;
            return DSI_OK;
        }
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing required key '%s'", k->key);
    }
    double v = 0;
    if (k->via_alias) {
        TRY_(alias_number(k, key, &v, err));
    } else {
        dsi_status st = dsii_gguf_get_f64(k->g, key, &v, err);
        if (st != DSI_OK) return req_status(st, key, err);
    }
    if (!(v >= lo && v <= hi))
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' value %g out of range [%g, %g]", key,
                         v, (double)lo, (double)hi);
    *out = (float)v;
    return DSI_OK;
}

/* Optional boolean-ish flag (bool or integer). */
static dsi_status get_flag(keyctx *k, const char *suffix, int def, int *out, dsii_error *err) {
    const char *key = resolve(k, suffix, NULL);
    if (!key) {
        *out = def;
        return DSI_OK;
    }
    int64_t kv = dsii_gguf_find_key(k->g, key);
    if (dsii_gguf_kv_type(k->g, kv) == DSII_GGUF_BOOL) return dsii_gguf_get_bool(k->g, key, out, err);
    uint64_t v;
    dsi_status st = dsii_gguf_get_u64(k->g, key, &v, err);
    if (st != DSI_OK) return st;
    *out = v != 0;
    return DSI_OK;
}

/* Integer array into dst (cap entries); *n receives the length. Absent: *n = 0 and
 * *present = 0 (if present != NULL, else BAD_FORMAT). */
static dsi_status get_arr_u32(keyctx *k, const char *suffix, uint32_t *dst, size_t cap,
                              uint64_t *n, int *present, dsii_error *err) {
    const char *key = resolve(k, suffix, NULL);
    if (!key) {
        key = k->key;
        *n = 0;
        if (present) {
            *present = 0;
            return DSI_OK;
        }
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing required key '%s'", key);
    }
    if (present) *present = 1;
    uint64_t len = 0;
    uint32_t et = 0;
    dsi_status st = dsii_gguf_get_array(k->g, key, &et, &len, err);
    if (st != DSI_OK) return st;
    if (len > cap)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s' has %" PRIu64 " entries, at most %zu supported",
                         key, len, cap);
    st = dsii_gguf_get_arr_u32(k->g, key, dst, cap, n, err);
    return st;
}

/* Float scalar-or-array per layer. Fills out[0..n_out) (entries past the array repeat the
 * last backbone value). */
static dsi_status get_layer_floats(keyctx *k, const char *suffix, int required, float def,
                                   uint32_t n_layer, uint32_t n_total, float *out,
                                   dsii_error *err) {
    const char *key = resolve(k, suffix, NULL);
    int64_t kv = key ? dsii_gguf_find_key(k->g, key) : -1;
    if (kv < 0) {
        if (required) return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing required key '%s'", k->key);
        for (uint32_t i = 0; i < n_total; i++) out[i] = def;
        return DSI_OK;
    }
    if (dsii_gguf_kv_type(k->g, kv) != DSII_GGUF_ARRAY) {
        float v;
        dsi_status st = get_f32(k, suffix, 1, 0, 0.0f, 1e30f, &v, err);
        if (st != DSI_OK) return st;
        for (uint32_t i = 0; i < n_total; i++) out[i] = v;
        return DSI_OK;
    }
    float tmp[DSII_MAX_LAYERS + DSII_MAX_DRAFT];
    uint64_t n = 0;
    uint64_t len = 0;
    dsi_status st = dsii_gguf_get_array(k->g, key, NULL, &len, err);
    if (st != DSI_OK) return st;
    if (len < n_layer || len > DSII_MAX_LAYERS + DSII_MAX_DRAFT)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' has %" PRIu64 " entries, expected %u (block_count)%s",
                         key, len, n_layer, n_total > n_layer ? " or more" : "");
    st = dsii_gguf_get_arr_f32(k->g, key, tmp, DSII_MAX_LAYERS + DSII_MAX_DRAFT, &n, err);
    if (st != DSI_OK) return st;
    for (uint32_t i = 0; i < n_total; i++) {
        float v = i < n ? tmp[i] : tmp[n_layer - 1];
        if (!(v >= 0.0f && v < 1e30f))
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s'[%u] value %g must be finite and >= 0",
                             key, i, (double)v);
        out[i] = v;
    }
    return DSI_OK;
}

#define TRY(x) TRY_(x)

static int tensor_exists(const dsii_gguf *g, const char *fmt, ...) DSII_PRINTF(2, 3);
static int tensor_exists(const dsii_gguf *g, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return dsii_gguf_find_tensor(g, name) != NULL;
}

static int in_list(const uint32_t *a, uint64_t n, uint32_t v) {
    for (uint64_t i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

static dsi_status check_increasing(const char *key, const uint32_t *a, uint64_t n,
                                   uint32_t n_layer, dsii_error *err) {
    for (uint64_t i = 0; i < n; i++) {
        if (a[i] >= n_layer)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s'[%" PRIu64 "] value %u: no such layer (block_count %u)",
                             key, i, a[i], n_layer);
        if (i > 0 && a[i] <= a[i - 1])
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' must be strictly increasing ([%" PRIu64 "] = %u after %u)",
                             key, i, a[i], a[i - 1]);
    }
    return DSI_OK;
}

/* V4.1 roles (docs/model-files.md §2.3, model-spec §4.3). */
static dsi_status derive_v41_roles(keyctx *k, dsii_hparams *hp, dsii_error *err) {
    uint32_t kvs[DSII_MAX_LAYERS], ixs[DSII_MAX_LAYERS];
    uint64_t n_kv = 0, n_ix = 0;
    int has_kv = 0, has_ix = 0;
    TRY(get_arr_u32(k, "kv_source_layer_ids", kvs, DSII_MAX_LAYERS, &n_kv, &has_kv, err));
    TRY(get_arr_u32(k, "index_source_layer_ids", ixs, DSII_MAX_LAYERS, &n_ix, &has_ix, err));
    /* llama.cpp files: the tensors say which layer plays which role */
    if (!has_kv)
        for (uint32_t i = 0; i < hp->n_layer; i++)
            if (tensor_exists(k->g, "blk.%u.attn_compressor_kv.weight", i)) kvs[n_kv++] = i;
    if (!has_ix)
        for (uint32_t i = 0; i < hp->n_layer; i++)
            if (tensor_exists(k->g, "blk.%u.indexer.attn_q_b.weight", i)) ixs[n_ix++] = i;
    char kkey[128], ikey[128];
    snprintf(kkey, sizeof kkey, "%s.kv_source_layer_ids", k->arch);
    snprintf(ikey, sizeof ikey, "%s.index_source_layer_ids", k->arch);
    TRY(check_increasing(kkey, kvs, n_kv, hp->n_layer, err));
    TRY(check_increasing(ikey, ixs, n_ix, hp->n_layer, err));
    for (uint64_t i = 0; i < n_kv; i++) {
        if (hp->layer[kvs[i]].compress_ratio == 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' names layer %u, whose compress ratio is 0",
                             kkey, kvs[i]);
        if (!in_list(ixs, n_ix, kvs[i]))
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "KV source layer %u (key '%s') is not an index source (key '%s'): a KV source owns the index keys of its latent",
                             kvs[i], kkey, ikey);
    }
    for (uint64_t i = 0; i < n_ix; i++)
        if (hp->layer[ixs[i]].compress_ratio == 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' names layer %u, whose compress ratio is 0",
                             ikey, ixs[i]);

    /* candidate source */
    uint32_t cand = UINT32_MAX;
    TRY(get_u32(k, "attention.candidate_source_layer_id", NULL, 0, UINT32_MAX, 0, UINT32_MAX, &cand, err));
    hp->candidate_source = -1;
    if (cand != UINT32_MAX) {
        if (cand >= hp->n_layer || !in_list(kvs, n_kv, cand) || !in_list(ixs, n_ix, cand))
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "key '%s.attention.candidate_source_layer_id' value %u must be a KV source and an index source",
                             k->arch, cand);
        hp->candidate_source = (int32_t)cand;
        TRY(get_u32(k, "attention.candidate_topk_blocks", NULL, 1, 0, 1, UINT32_MAX, &hp->candidate_topk_blocks, err));
        TRY(get_u32(k, "attention.candidate_block_size", NULL, 1, 0, 1, 1u << 20, &hp->candidate_block_size, err));
    }

    int32_t last_kv = -1, last_ix = -1;
    for (uint32_t i = 0; i < hp->n_layer; i++) {
        dsii_layer_hparams *l = &hp->layer[i];
        l->is_kv_source = in_list(kvs, n_kv, i);
        l->is_index_source = in_list(ixs, n_ix, i);
        l->is_candidate_source = (int32_t)i == hp->candidate_source;
        l->has_indexer = l->is_index_source;
        if (l->is_kv_source) last_kv = (int32_t)i;
        if (l->is_index_source) last_ix = (int32_t)i;
        l->kv_src = l->key_src = l->topk_src = l->cand_src = -1;
        l->cand_masked = 0;
        if (l->compress_ratio == 0) continue;
        if (last_kv < 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "layer %u has compress ratio %u but no KV source precedes it (key '%s')", i,
                             l->compress_ratio, kkey);
        if (hp->layer[last_kv].compress_ratio != l->compress_ratio)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "layer %u has compress ratio %u but reads KV source layer %d with ratio %u",
                             i, l->compress_ratio, last_kv, hp->layer[last_kv].compress_ratio);
        if (last_ix < 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "layer %u reads a top-k before any index source (key '%s')",
                             i, ikey);
        l->kv_src = last_kv;
        l->key_src = last_kv;
        l->topk_src = last_ix;
        if (l->is_index_source && !l->is_kv_source && hp->candidate_source >= 0 &&
            (int32_t)i > hp->candidate_source) {
            l->cand_masked = 1;
            l->cand_src = hp->candidate_source;
        }
    }
    return DSI_OK;
}

static int is_prime_u64(uint64_t n) {
    if (n < 2) return 0;
    if (n % 2 == 0) return n == 2;
    for (uint64_t d = 3; d <= n / d; d += 2)
        if (n % d == 0) return 0;
    return 1;
}

static dsi_status load_engram(const dsi_context *ctx, keyctx *k, dsii_hparams *hp,
                              void **arrays, dsii_error *err) {
    dsii_engram_hparams *e = &hp->engram;
    uint64_t n = 0;
    int present = 0;
    TRY(get_arr_u32(k, "engram.layer_ids", e->layer_ids, DSII_MAX_ENGRAM_LAYERS, &n, &present, err));
    if (n == 0) return DSI_OK;
    e->n_layer = (uint32_t)n;
    char key[160];
    snprintf(key, sizeof key, "%s.engram.layer_ids", k->arch);
    TRY(check_increasing(key, e->layer_ids, n, hp->n_layer, err));
    /* ds4 (layout.h) names the row encoding and leaves out head_count / key_length /
     * max_ngram_size / offsets: they follow from the array lengths and the table shape */
    {
        const char *ek = resolve(k, "engram.encoding", NULL);
        if (ek) {
            const char *enc = NULL;
            TRY(dsii_gguf_get_string(k->g, ek, &enc, NULL, err));
            if (strcmp(enc, DSII_ENGRAM_ROW264_ENCODING) != 0)
                return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s' value '%s': only %s is supported", ek,
                                 enc, DSII_ENGRAM_ROW264_ENCODING);
            e->row264 = 1;
        }
    }
    const int derive = !resolve(k, "engram.head_count", NULL) && !resolve(k, "engram.max_ngram_size", NULL) &&
                       (k->ds4v41 || e->row264);
    if (derive) {
        uint64_t nm = 0, np = 0;
        const char *mk_ = mk(k, "engram.multipliers");
        TRY(req_status(dsii_gguf_get_array(k->g, mk_, NULL, &nm, err), mk_, err));
        const char *pk = mk(k, "engram.primes");
        TRY(req_status(dsii_gguf_get_array(k->g, pk, NULL, &np, err), pk, err));
        const uint64_t mng = nm / n, cols = np / n;
        if (nm % n || mng < 2 || mng > LIM_ENGRAM_NGRAM || np % n || cols % (mng - 1) ||
            cols / (mng - 1) < 1 || cols / (mng - 1) > LIM_ENGRAM_HEADS)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "keys '%s.engram.multipliers' (%" PRIu64 " entries) and '%s.engram.primes' (%" PRIu64
                             " entries) do not describe %" PRIu64 " layers x (max n-gram, heads)",
                             k->arch, nm, k->arch, np, n);
        e->max_ngram = (uint32_t)mng;
        e->n_head = (uint32_t)(cols / (mng - 1));
        /* key length from the first layer's table: a row264 row holds K values + K/32 scales */
        char tn[96];
        snprintf(tn, sizeof tn, "blk.%u.engram_embd.weight", e->layer_ids[0]);
        const dsii_gguf_tensor *tt = dsii_gguf_find_tensor(k->g, tn);
        if (!tt) {
            snprintf(tn, sizeof tn, "blk.%u.engram.embd.weight", e->layer_ids[0]);
            tt = dsii_gguf_find_tensor(k->g, tn);
        }
        if (!tt) return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing tensor 'blk.%u.engram_embd.weight'", e->layer_ids[0]);
        const int64_t ne0 = tt->ne[0];
        const int64_t K = e->row264 ? ne0 / 33 * 32 : ne0;
        if (K < 32 || K > LIM_HEAD_DIM || (e->row264 && (ne0 % 33 || K % 32)))
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "tensor '%s' row of %" PRId64 " bytes is not a %s row", tn, ne0,
                             e->row264 ? DSII_ENGRAM_ROW264_ENCODING : "table");
        e->key_length = (uint32_t)K;
    } else {
        TRY(get_u32(k, "engram.head_count", NULL, 1, 0, 1, LIM_ENGRAM_HEADS, &e->n_head, err));
        TRY(get_u32(k, "engram.key_length", NULL, 1, 0, 1, LIM_HEAD_DIM, &e->key_length, err));
        TRY(get_u32(k, "engram.max_ngram_size", NULL, 1, 0, 2, LIM_ENGRAM_NGRAM, &e->max_ngram, err));
    }
    e->n_cols = (e->max_ngram - 1) * e->n_head;

    const uint64_t n_mult = (uint64_t)e->n_layer * e->max_ngram;
    const uint64_t n_prime = (uint64_t)e->n_layer * e->n_cols;
    const uint64_t n_map = hp->n_vocab;
    size_t bytes = (size_t)(n_mult + 2 * n_prime) * sizeof(uint64_t) + (size_t)n_map * sizeof(int32_t);
    uint8_t *buf = dsii_malloc(ctx, bytes);
    if (!buf) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory for engram constants");
    *arrays = buf;
    uint64_t *mult = (uint64_t *)buf;
    uint64_t *primes = mult + n_mult;
    uint64_t *offs = primes + n_prime;
    int32_t *map = (int32_t *)(offs + n_prime);
    e->multipliers = mult;
    e->primes = primes;
    e->offsets = offs;
    e->token_map = map;
    e->n_token_map = (uint32_t)n_map;

    struct {
        const char *suffix;
        uint64_t *dst;
        uint64_t want;
    } arr[3] = {{"engram.multipliers", mult, n_mult},
                {"engram.primes", primes, n_prime},
                {"engram.offsets", offs, n_prime}};
    const int offsets_given = resolve(k, "engram.offsets", NULL) != NULL || !derive;
    for (int a = 0; a < (offsets_given ? 3 : 2); a++) {
        const char *kk = mk(k, arr[a].suffix);
        uint64_t len = 0;
        dsi_status st = dsii_gguf_get_array(k->g, kk, NULL, &len, err);
        if (st != DSI_OK) return req_status(st, kk, err);
        if (len != arr[a].want)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "key '%s' has %" PRIu64 " entries, expected %" PRIu64 " (layers x %s)", kk,
                             len, arr[a].want, a == 0 ? "max_ngram_size" : "(max_ngram_size-1) x head_count");
        st = dsii_gguf_get_arr_u64(k->g, kk, arr[a].dst, (size_t)arr[a].want, NULL, err);
        if (st != DSI_OK) return st;
    }
    {
        const char *kk = mk(k, "engram.token_map");
        uint64_t len = 0;
        dsi_status st = dsii_gguf_get_array(k->g, kk, NULL, &len, err);
        if (st != DSI_OK) return req_status(st, kk, err);
        if (len != n_map)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' has %" PRIu64 " entries, expected %" PRIu64 " (vocabulary size)",
                             kk, len, n_map);
        st = dsii_gguf_get_arr_i32(k->g, kk, map, (size_t)n_map, NULL, err);
        if (st != DSI_OK) return st;
    }
    int32_t max_map = -1;
    for (uint64_t i = 0; i < n_map; i++) {
        if (map[i] < 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.engram.token_map'[%" PRIu64 "] value %d is negative",
                             k->arch, i, map[i]);
        if (map[i] > max_map) max_map = map[i];
    }
    TRY(get_u32(k, "engram.compressed_vocab_size", NULL, 0, (uint32_t)max_map + 1, 1, INT32_MAX,
                &e->compressed_vocab, err));
    for (uint64_t i = 0; i < n_map; i++)
        if ((uint32_t)map[i] >= e->compressed_vocab)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "key '%s.engram.token_map'[%" PRIu64 "] value %d >= compressed vocabulary %u",
                             k->arch, i, map[i], e->compressed_vocab);
    TRY(get_u32(k, "engram.pad_id", NULL, 1, 0, 0, e->compressed_vocab - 1, &e->pad_id, err));

    /* §4.6: tok·m must not overflow int64 for any compressed token id */
    const uint64_t bound = (uint64_t)INT64_MAX / e->compressed_vocab;
    for (uint64_t i = 0; i < n_mult; i++) {
        if ((mult[i] & 1u) == 0 || mult[i] >= bound)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "key '%s.engram.multipliers'[%" PRIu64 "] value %" PRIu64
                             " must be odd and < INT64_MAX / %u = %" PRIu64,
                             k->arch, i, mult[i], e->compressed_vocab, bound);
    }
    for (uint32_t l = 0; l < e->n_layer; l++) {
        uint64_t acc = 0;
        for (uint32_t c = 0; c < e->n_cols; c++) {
            uint64_t idx = (uint64_t)l * e->n_cols + c;
            uint64_t p = primes[idx];
            /* primes are ~1.6e7 in the release: trial division is cheap; cap the work for
             * hostile values (a non-prime modulus only weakens the hash, a zero one divides
             * by zero) */
            if (p < 2 || p > (1ull << 40) || (p < (1ull << 34) && !is_prime_u64(p)))
                return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                                 "key '%s.engram.primes'[%" PRIu64 "] value %" PRIu64 " is not a prime",
                                 k->arch, idx, p);
            if (!offsets_given) offs[idx] = acc;
            if (offs[idx] != acc)
                return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                                 "key '%s.engram.offsets'[%" PRIu64 "] value %" PRIu64
                                 " is not the prefix sum of the layer's primes (%" PRIu64 ")",
                                 k->arch, idx, offs[idx], acc);
            acc += p;
        }
        e->rows[l] = acc;
    }
    {
        /* ds4 also states the rows of each table: they must be the sums of the primes */
        const char *rk = resolve(k, "engram.rows", NULL);
        if (rk) {
            uint64_t rows[DSII_MAX_ENGRAM_LAYERS], nr = 0;
            TRY(dsii_gguf_get_arr_u64(k->g, rk, rows, DSII_MAX_ENGRAM_LAYERS, &nr, err));
            if (nr != e->n_layer)
                return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s' has %" PRIu64 " entries, expected %u (engram layers)",
                                 rk, nr, e->n_layer);
            for (uint32_t l = 0; l < e->n_layer; l++)
                if (rows[l] != e->rows[l])
                    return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                                     "key '%s'[%u] value %" PRIu64 " is not the sum of the layer's primes (%" PRIu64 ")",
                                     rk, l, rows[l], e->rows[l]);
        }
    }
    for (uint32_t l = 0; l < e->n_layer; l++) hp->layer[e->layer_ids[l]].engram_index = (int32_t)l;
    hp->has_engram = 1;
    return DSI_OK;
}

/* Routed / shared expert SwiGLU limits of n_total layers (trunk + drafts). */
static dsi_status get_limits(keyctx *k, uint32_t L, uint32_t n_total, float *lim, float *lim_sh,
                             dsii_error *err) {
    TRY(get_layer_floats(k, "swiglu_clamp_exp", 1, 0, L, n_total, lim, err));
    if (resolve(k, "swiglu_clamp_shexp", NULL))
        TRY(get_layer_floats(k, "swiglu_clamp_shexp", 1, 0, L, n_total, lim_sh, err));
    else
        memcpy(lim_sh, lim, sizeof(float) * n_total);
    return DSI_OK;
}

/* Draft blocks are window-only layers with the base RoPE (§3.7, §4.5). */
static void init_draft_layers(dsii_hparams *hp, const float *lim, const float *lim_sh) {
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        dsii_layer_hparams *l = &hp->draft_layer[d];
        memset(l, 0, sizeof *l);
        l->coff = 1;
        l->rope_base = hp->rope_base;
        l->swiglu_limit = lim[d];
        l->swiglu_limit_shexp = lim_sh[d];
        l->n_expert = hp->n_expert;
        l->n_expert_used = hp->n_expert_used;
        l->engram_index = -1;
        l->kv_src = l->key_src = l->topk_src = l->cand_src = -1;
    }
}

/* DSpark keys (§4.5): from the model file, or (draft file) from `alt` when the model file has
 * none. */
static dsi_status load_dspark(keyctx *km, keyctx *alt, dsii_hparams *hp, dsii_error *err) {
    keyctx *k = km;
    if (alt && !resolve(km, "dspark_target_layer_ids", NULL)) k = alt;
    const char *arch = k->arch;
    const uint32_t L = hp->n_layer;
    dsii_dspark_hparams *ds = &hp->dspark;
    uint64_t n = 0;
    TRY(get_arr_u32(k, "dspark_target_layer_ids", ds->target_layer_ids, DSII_MAX_DSPARK_TARGETS, &n, NULL, err));
    if (n == 0)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.dspark_target_layer_ids' is empty", arch);
    ds->n_target = (uint32_t)n;
    char key[160];
    snprintf(key, sizeof key, "%s.dspark_target_layer_ids", arch);
    TRY(check_increasing(key, ds->target_layer_ids, n, L, err));
    TRY(get_u32(k, "dspark_block_size", NULL, 1, 0, 1, 256, &ds->block_size, err));
    uint32_t noise = 0;
    TRY(get_u32(k, "dspark_noise_token_id", NULL, 1, 0, 0, hp->n_vocab - 1, &noise, err));
    ds->noise_token = (int32_t)noise;
    TRY(get_u32(k, "dspark_markov_rank", NULL, 1, 0, 1, LIM_RANK, &ds->markov_rank, err));
    TRY(get_u32(k, "dspark_expert_count", NULL, 1, 0, 1, LIM_EXPERTS, &ds->n_expert, err));
    TRY(get_u32(k, "dspark_expert_used_count", NULL, 1, 0, 1, LIM_EXPERTS, &ds->n_expert_used, err));
    if (ds->n_expert_used > ds->n_expert)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.dspark_expert_used_count' value %u > dspark_expert_count %u",
                         arch, ds->n_expert_used, ds->n_expert);
    for (uint32_t d = 0; d < hp->n_draft; d++) {
        hp->draft_layer[d].n_expert = ds->n_expert;
        hp->draft_layer[d].n_expert_used = ds->n_expert_used;
    }
    return DSI_OK;
}

dsi_status dsii_hparams_load(const dsi_context *ctx, const dsii_gguf *g, dsii_hparams *hp,
                             void **arrays, dsii_error *err) {
    memset(hp, 0, sizeof *hp);
    *arrays = NULL;
    const char *arch = NULL;
    dsi_status st = dsii_gguf_get_string(g, "general.architecture", &arch, NULL, err);
    if (st != DSI_OK) return req_status(st, "general.architecture", err);
    if (strcmp(arch, "deepseek4") == 0)
        hp->arch = DSI_ARCH_DEEPSEEK4;
    else if (strcmp(arch, "deepseek41") == 0)
        hp->arch = DSI_ARCH_DEEPSEEK41;
    else
        return dsii_fail(err, DSI_ERR_UNSUPPORTED,
                         "key 'general.architecture' value '%s' is not supported (deepseek4, deepseek41)",
                         arch);
    const int v41 = hp->arch == DSI_ARCH_DEEPSEEK41;
    keyctx kc = {.g = g, .arch = arch};
    keyctx *k = &kc;
    /* ds4's deepseek41 files spell the hyperparameters with the HF config names (layout.h) */
    kc.ds4v41 = v41 && dsii_gguf_find_key(g, "deepseek41.embedding_length") < 0 &&
                dsii_gguf_find_key(g, "deepseek41.hidden_size") >= 0;
    hp->key_dialect = kc.ds4v41 ? DSII_LAYOUT_DS4 : DSII_LAYOUT_NATIVE;
    if (kc.ds4v41) {
        /* the HF config's activation and routing method, where ds4 records them */
        static const struct {
            const char *suffix, *want;
        } fixed[] = {{"hidden_act", "silu"}, {"topk_method", "noaux_tc"}};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
            const char *kk = mk(k, fixed[i].suffix);
            if (dsii_gguf_find_key(g, kk) < 0) continue;
            const char *v = NULL;
            TRY(dsii_gguf_get_string(g, kk, &v, NULL, err));
            if (strcmp(v, fixed[i].want) != 0)
                return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s' value '%s': only %s is supported", kk, v,
                                 fixed[i].want);
        }
    }

    /* ---- layer count and draft blocks (docs §4) ---- */
    uint32_t block_count = 0;
    TRY(get_u32(k, "block_count", NULL, 1, 0, 1, DSII_MAX_LAYERS + DSII_MAX_DRAFT, &block_count, err));
    uint32_t nextn = 0;
    TRY(get_u32(k, "nextn_predict_layers", NULL, 0, UINT32_MAX, 0, DSII_MAX_DRAFT, &nextn, err));
    const int has_nextn_key = nextn != UINT32_MAX;
    if (!has_nextn_key) nextn = 0;
    hp->n_layer = block_count;
    if (!v41 && nextn > 0 && nextn < block_count &&
        tensor_exists(g, "blk.%u.nextn.eh_proj.weight", block_count - 1)) {
        if (nextn != 1)
            return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s.nextn_predict_layers' value %u: only one V4 MTP block is supported",
                             arch, nextn);
        hp->n_layer = block_count - nextn;
        hp->n_draft = 1;
        hp->has_mtp = 1;
        hp->mtp_from_nextn = 1;
    } else {
        uint32_t n = 0;
        while (n < DSII_MAX_DRAFT && tensor_exists(g, "mtp.%u.attn_norm.weight", n)) n++;
        if (!v41 && n > 1)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "tensor 'mtp.1.attn_norm.weight': V4 has a single MTP block (mtp.0)");
        hp->n_draft = n;
        hp->has_mtp = !v41 && n == 1;
        hp->has_dspark = v41 && n > 0;
        if (has_nextn_key && nextn != 0 && nextn != n && n != 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.nextn_predict_layers' value %u but the file has %u mtp.* blocks",
                             arch, nextn, n);
    }
    if (hp->n_layer > DSII_MAX_LAYERS)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s.block_count' value %u: at most %u layers supported",
                         arch, hp->n_layer, DSII_MAX_LAYERS);
    const uint32_t L = hp->n_layer;

    /* ---- scalar shapes (§1.1) ---- */
    TRY(get_u32(k, "embedding_length", NULL, 1, 0, 1, LIM_EMBD, &hp->n_embd, err));
    TRY(get_u32(k, "context_length", NULL, 0, 1048576, 1, UINT32_MAX, &hp->n_ctx_train, err));
    {
        const dsii_gguf_tensor *te = dsii_gguf_find_tensor(g, "token_embd.weight");
        if (!te) return dsii_fail(err, DSI_ERR_BAD_FORMAT, "missing tensor 'token_embd.weight'");
        if (te->n_dims < 2 || te->ne[1] < 1 || te->ne[1] > (int64_t)LIM_VOCAB)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "tensor 'token_embd.weight' has a bad vocabulary dimension %" PRId64,
                             te->n_dims < 2 ? (int64_t)1 : te->ne[1]);
        uint32_t vk = 0;
        TRY(get_u32(k, "vocab_size", NULL, 0, (uint32_t)te->ne[1], 1, LIM_VOCAB, &vk, err));
        if (vk != (uint32_t)te->ne[1])
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.vocab_size' value %u != token_embd.weight rows %" PRId64,
                             arch, vk, te->ne[1]);
        hp->n_vocab = vk;
    }
    uint32_t n_head_kv = 0, value_len = 0;
    TRY(get_u32(k, "attention.head_count", NULL, 1, 0, 1, LIM_HEADS, &hp->n_head, err));
    TRY(get_u32(k, "attention.head_count_kv", NULL, 1, 0, 1, 1, &n_head_kv, err));
    TRY(get_u32(k, "attention.key_length", NULL, 1, 0, 1, LIM_HEAD_DIM, &hp->head_dim, err));
    TRY(get_u32(k, "attention.value_length", NULL, 1, 0, 1, LIM_HEAD_DIM, &value_len, err));
    if (value_len != hp->head_dim)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.attention.value_length' value %u != key_length %u (K = V)",
                         arch, value_len, hp->head_dim);
    TRY(get_u32(k, "rope.dimension_count", NULL, 1, 0, 2, LIM_HEAD_DIM, &hp->rope_dim, err));
    if (hp->rope_dim % 2 || hp->rope_dim > hp->head_dim)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                         "key '%s.rope.dimension_count' value %u must be even and <= head dim %u", arch,
                         hp->rope_dim, hp->head_dim);
    hp->nope_dim = hp->head_dim - hp->rope_dim;
    TRY(get_u32(k, "attention.q_lora_rank", NULL, 1, 0, 1, LIM_RANK, &hp->q_lora_rank, err));
    TRY(get_u32(k, "attention.output_lora_rank", NULL, 1, 0, 1, LIM_RANK, &hp->o_lora_rank, err));
    TRY(get_u32(k, "attention.output_group_count", NULL, 1, 0, 1, LIM_HEADS, &hp->o_groups, err));
    if (hp->n_head % hp->o_groups)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.attention.output_group_count' value %u does not divide head_count %u",
                         arch, hp->o_groups, hp->n_head);
    TRY(get_u32(k, "attention.sliding_window", NULL, 1, 0, 1, 1u << 24, &hp->window, err));
    TRY(get_u32(k, "attention.indexer.head_count", "indexer.head_count", 1, 0, 1, LIM_HEADS, &hp->idx_n_head, err));
    TRY(get_u32(k, "attention.indexer.key_length", "attention.indexer.head_dim", 1, 0, 1, LIM_HEAD_DIM, &hp->idx_head_dim, err));
    if (hp->idx_head_dim < hp->rope_dim)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.attention.indexer.key_length' value %u < rope dims %u",
                         arch, hp->idx_head_dim, hp->rope_dim);
    TRY(get_u32(k, "attention.indexer.top_k", "indexer.top_k", 1, 0, 1, 1u << 24, &hp->idx_topk, err));

    /* MoE */
    TRY(get_u32(k, "expert_count", NULL, 1, 0, 1, LIM_EXPERTS, &hp->n_expert, err));
    TRY(get_u32(k, "expert_used_count", NULL, 1, 0, 1, LIM_EXPERTS, &hp->n_expert_used, err));
    if (hp->n_expert_used > hp->n_expert)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.expert_used_count' value %u > expert_count %u", arch,
                         hp->n_expert_used, hp->n_expert);
    TRY(get_u32(k, "expert_feed_forward_length", NULL, 1, 0, 1, LIM_FF, &hp->expert_ff, err));
    TRY(get_u32(k, "expert_shared_count", NULL, 1, 0, 1, 64, &hp->n_expert_shared, err));
    TRY(get_f32(k, "expert_weights_scale", 1, 0, 0.0f, 1e6f, &hp->route_scale, err));
    {
        int norm = 1;
        TRY(get_flag(k, "expert_weights_norm", 1, &norm, err));
        if (!norm)
            return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s.expert_weights_norm' value false: only normalized routing weights are supported",
                             arch);
        uint32_t v = 0;
        /* llama.cpp's gating id for sqrt-softplus is not settled across forks (4 in the
         * upstream PR; some converters write the string "sqrtsoftplus"); every V4 / V4.1
         * release scores with sqrt-softplus (§3.5), so an unexpected id only logs */
        const char *gk = resolve(k, "expert_gating_func", NULL);
        if (!gk) gk = k->key;
        int64_t gi = dsii_gguf_find_key(g, gk);
        if (gi >= 0 && dsii_gguf_kv_type(g, gi) == DSII_GGUF_STRING) {
            const char *sv = NULL;
            TRY(dsii_gguf_get_string(g, gk, &sv, NULL, err));
            if (strcmp(sv, "sqrtsoftplus") != 0)
                return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s' value '%s': only sqrtsoftplus is supported",
                                 gk, sv);
        } else {
            TRY(get_u32(k, "expert_gating_func", NULL, 0, 4, 0, UINT32_MAX, &v, err));
            if (v != 4)
                dsii_log(ctx, DSI_LOG_WARN, "key '%s' value %u is not llama.cpp's sqrt-softplus id (4); using sqrt-softplus routing",
                         gk, v);
        }
        TRY(get_u32(k, "expert_group_count", NULL, 0, 0, 0, UINT32_MAX, &v, err));
        if (v != 0)
            return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s.expert_group_count' value %u: group-limited routing is not supported",
                             arch, v);
        TRY(get_u32(k, "expert_group_used_count", NULL, 0, 0, 0, UINT32_MAX, &v, err));
        if (v != 0)
            return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s.expert_group_used_count' value %u: group-limited routing is not supported",
                             arch, v);
        TRY(get_u32(k, "leading_dense_block_count", NULL, 0, 0, 0, UINT32_MAX, &v, err));
        if (v != 0)
            return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s.leading_dense_block_count' value %u: dense FFN layers are not supported",
                             arch, v);
    }
    TRY(get_u32(k, "hash_layer_count", NULL, !v41, 0, 0, L, &hp->n_hash_layer, err));
    if (v41 && hp->n_hash_layer != 0)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.hash_layer_count' value %u: V4.1 has no hash-routed layers",
                         arch, hp->n_hash_layer);

    /* RoPE / YaRN (§3.9) */
    /* Defaults that differ between engines are decided here and listed in
     * docs/model-files.md §2.7; each is either the same as llama.cpp's or logged. */
    TRY(get_f32(k, "rope.freq_base", 0, 10000.0f, 1.0f, 1e12f, &hp->rope_base, err));
    TRY(get_f32(k, "attention.compress_rope_freq_base", 1, 0, 1.0f, 1e12f, &hp->rope_base_compress, err));
    TRY(get_f32(k, "rope.scaling.factor", 1, 0, 1.0f, 1e6f, &hp->yarn_factor, err));
    TRY(get_u32(k, "rope.scaling.original_context_length", NULL, 1, 0, 1, UINT32_MAX, &hp->yarn_orig_ctx, err));
    /* llama.cpp's deepseek4 never reads the beta keys and uses 32 / 1 (the release's values) */
    TRY(get_f32(k, "rope.scaling.yarn_beta_fast", 0, 32.0f, 0.0f, 1e6f, &hp->yarn_beta_fast, err));
    TRY(get_f32(k, "rope.scaling.yarn_beta_slow", 0, 1.0f, 0.0f, 1e6f, &hp->yarn_beta_slow, err));
    {
        const char *kk = mk(k, "rope.scaling.type");
        if (dsii_gguf_find_key(g, kk) >= 0) {
            const char *s = NULL;
            TRY(dsii_gguf_get_string(g, kk, &s, NULL, err));
            if (strcmp(s, "none") == 0) {
                /* llama.cpp: no scaling at all (plain RoPE with the compress base) */
                hp->yarn_factor = 1.0f;
            } else if (strcmp(s, "yarn") != 0) {
                return dsii_fail(err, DSI_ERR_UNSUPPORTED, "key '%s' value '%s': only yarn (or none) is supported", kk,
                                 s);
            }
        } else if (hp->yarn_factor > 1.0f) {
            /* Both releases are defined with YaRN and ds4 writes no type key (it hardcodes
             * YaRN); llama.cpp would read such a file as linear scaling, which is wrong for
             * this architecture. Loaded as YaRN, said so. */
            hp->rope_type_defaulted = 1;
            dsii_log(ctx, DSI_LOG_WARN,
                     "key '%s' is absent: using yarn (the architecture's scaling; llama.cpp would apply linear "
                     "scaling to this file, see docs/model-files.md)",
                     kk);
        }
    }
    TRY(get_f32(k, "attention.layer_norm_rms_epsilon", 1, 0, 0.0f, 1.0f, &hp->rms_eps, err));

    /* mHC (§3.3) */
    TRY(get_u32(k, "hyper_connection.count", NULL, 1, 0, 1, DSII_MAX_HC, &hp->hc_mult, err));
    hp->hc_mix = (2 + hp->hc_mult) * hp->hc_mult;
    TRY(get_u32(k, "hyper_connection.sinkhorn_iterations", "hyper_connection.sinkhorn_iters", 1, 0, 1, 1000,
                &hp->hc_sinkhorn_iters, err));
    TRY(get_f32(k, "hyper_connection.epsilon", 1, 0, 0.0f, 1.0f, &hp->hc_eps, err));
    hp->hc_lagged = v41;

    /* ---- per-layer arrays ---- */
    const uint32_t n_total = L + hp->n_draft;
    {
        uint32_t ratios[DSII_MAX_LAYERS + DSII_MAX_DRAFT];
        uint64_t n = 0;
        TRY(get_arr_u32(k, "attention.compress_ratios", ratios, DSII_MAX_LAYERS + DSII_MAX_DRAFT, &n, NULL, err));
        if (n < L)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "key '%s.attention.compress_ratios' has %" PRIu64 " entries, expected %u (block_count)",
                             arch, n, L);
        for (uint64_t i = L; i < n; i++)
            if (ratios[i] != 0)
                return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                                 "key '%s.attention.compress_ratios'[%" PRIu64 "] value %u: draft blocks are window-only (0)",
                                 arch, i, ratios[i]);
        for (uint32_t i = 0; i < L; i++) {
            uint32_t r = ratios[i];
            if (r > LIM_RATIO || (!v41 && r == 1))
                return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key '%s.attention.compress_ratios'[%u] value %u is not a valid ratio%s",
                                 arch, i, r, v41 ? "" : " for deepseek4 (0, 4 or >= 2)");
            dsii_layer_hparams *l = &hp->layer[i];
            l->compress_ratio = r;
            l->coff = (!v41 && r == 4) ? 2 : 1;
            l->yarn = r > 0;
            l->rope_base = r > 0 ? hp->rope_base_compress : hp->rope_base;
            l->n_expert = hp->n_expert;
            l->n_expert_used = hp->n_expert_used;
            l->engram_index = -1;
            l->is_hash = !v41 && i < hp->n_hash_layer;
            l->kv_src = l->key_src = l->topk_src = l->cand_src = -1;
            if (!v41 && r > 0) {
                l->kv_src = (int32_t)i;
                if (r == 4) {
                    l->has_indexer = 1;
                    l->key_src = l->topk_src = (int32_t)i;
                }
            }
        }
    }
    {
        float lim[DSII_MAX_LAYERS + DSII_MAX_DRAFT], lim_sh[DSII_MAX_LAYERS + DSII_MAX_DRAFT];
        TRY(get_limits(k, L, n_total, lim, lim_sh, err));
        for (uint32_t i = 0; i < L; i++) {
            hp->layer[i].swiglu_limit = lim[i];
            hp->layer[i].swiglu_limit_shexp = lim_sh[i];
        }
        init_draft_layers(hp, lim + L, lim_sh + L);
    }

    if (v41) {
        TRY(derive_v41_roles(k, hp, err));
        if (hp->n_draft > 0) TRY(load_dspark(k, NULL, hp, err));
        TRY(load_engram(ctx, k, hp, arrays, err));
    }
    return DSI_OK;
}

/* Draft blocks in a second file (docs/model-files.md §4.3). */
dsi_status dsii_hparams_draft_file(const dsii_gguf *dg, const char *path, dsii_hparams *hp,
                                   const dsii_gguf *g, dsii_error *err) {
    const char *arch = hp->arch == DSI_ARCH_DEEPSEEK41 ? "deepseek41" : "deepseek4";
    const int v41 = hp->arch == DSI_ARCH_DEEPSEEK41;
    {
        const char *da = NULL;
        dsi_status st = dsii_gguf_get_string(dg, "general.architecture", &da, NULL, err);
        if (st != DSI_OK) return req_status(st, "general.architecture", err);
        if (strcmp(da, arch) != 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "draft file %s: key 'general.architecture' value '%s' does not match the model's '%s'",
                             path, da, arch);
    }
    if (hp->n_draft > 0)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                         "the model file already has %u draft blocks; a draft file (%s) is not expected", hp->n_draft,
                         path);
    const uint32_t L = hp->n_layer;
    keyctx dk = {.g = dg, .arch = arch};
    uint32_t n = 0;
    if (!v41 && tensor_exists(dg, "blk.%u.nextn.eh_proj.weight", L)) {
        /* llama.cpp's MTP file (convert_hf_to_gguf --mtp): block_count = L + 1, the MTP block
         * as blk.L.* + blk.L.nextn.*, its HC head as the root output_hc_* */
        uint32_t bc = 0, nx = 0;
        TRY(get_u32(&dk, "block_count", NULL, 1, 0, 1, DSII_MAX_LAYERS + DSII_MAX_DRAFT, &bc, err));
        TRY(get_u32(&dk, "nextn_predict_layers", NULL, 1, 0, 0, DSII_MAX_DRAFT, &nx, err));
        if (nx != 1 || bc != L + 1)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "draft file %s: block_count %u / nextn_predict_layers %u, expected %u / 1 for a model of %u layers",
                             path, bc, nx, L + 1, L);
        hp->mtp_from_nextn = 1;
        n = 1;
    } else {
        while (n < DSII_MAX_DRAFT && tensor_exists(dg, "mtp.%u.attn_norm.weight", n)) n++;
        if (n == 0)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "draft file %s has no draft blocks (tensors mtp.0.* or blk.%u.nextn.*)", path, L);
        if (!v41 && n > 1)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "draft file %s: tensor 'mtp.1.attn_norm.weight': V4 has a single MTP block",
                             path);
    }
    hp->n_draft = n;
    hp->has_mtp = !v41;
    hp->has_dspark = v41;
    hp->draft_file = 1;
    /* the draft block's limits: the draft file's per-layer arrays when they reach past the
     * trunk (llama.cpp writes L + 1 entries), else the trunk's last value */
    float lim[DSII_MAX_LAYERS + DSII_MAX_DRAFT], lim_sh[DSII_MAX_LAYERS + DSII_MAX_DRAFT];
    const uint32_t n_total = L + n;
    if (resolve(&dk, "swiglu_clamp_exp", NULL)) {
        TRY(get_limits(&dk, L, n_total, lim, lim_sh, err));
    } else {
        for (uint32_t i = 0; i < n_total; i++) {
            lim[i] = hp->layer[i < L ? i : L - 1].swiglu_limit;
            lim_sh[i] = hp->layer[i < L ? i : L - 1].swiglu_limit_shexp;
        }
    }
    init_draft_layers(hp, lim + L, lim_sh + L);
    if (v41) {
        keyctx mk_ = {.g = g, .arch = arch};
        TRY(load_dspark(&mk_, &dk, hp, err));
    }
    return DSI_OK;
}
