/*
 * Byte-level BPE tokenizer of DeepSeek V4 / V4.1 (model-spec.md §6; docs/tokenizer.md).
 *
 * Pipeline for plain text (each step documented where it is implemented):
 *   1. optional special-token split (DSI_TOKENIZE_PARSE_SPECIAL): leftmost-longest literal
 *      match of control / user-defined token texts; the text between is tokenized alone;
 *   2. the "joyai-llm" pre-tokenizer: three regex splits applied in sequence, each keeping
 *      matches and the text between them as separate pieces (HF `Split`, behavior
 *      Isolated; llama.cpp's DEEPSEEK3_LLM regex set, which llama.cpp also uses for
 *      "joyai-llm"), with real Unicode classes (unicode_tables.c):
 *        a. \p{N}{1,3}
 *        b. [\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+
 *        c. [!-/:-@\[-`{-~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 *            ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *   3. GPT-2 byte-level BPE on each piece: pieces start as one symbol per byte, the
 *      adjacent pair with the lowest merge rank is merged first (leftmost on ties) until
 *      no pair has a merge. A heap + linked list keeps this O(n log n) per piece.
 * Invalid UTF-8 bytes are code points of class "other" for the pre-tokenizer and plain
 * bytes for BPE (every byte has a token), so no input is rejected.
 */
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#include <string.h>

#define TF_SPECIAL 1u   /* matched literally with DSI_TOKENIZE_PARSE_SPECIAL */
#define TF_BYTELEVEL 2u /* spelled in the GPT-2 byte alphabet (reachable by BPE) */

#define DSII_TOKENIZER_MAX_VOCAB (1u << 26)
#define DSII_TOKENIZER_MAX_MERGES (1u << 26)

struct dsii_tokenizer {
    const dsi_context *ctx;
    int32_t n_vocab;
    uint8_t *blob;          /* token bytes, concatenated */
    uint32_t *off;          /* n_vocab + 1 offsets into blob */
    uint8_t *flags;         /* TF_* per token */
    int32_t byte_token[256];
    /* merge table: open addressing on (left << 32 | right) */
    uint64_t *mkey;
    uint32_t *mrank;
    int32_t *mres;
    size_t mcap;            /* power of two; 0 if no merges */
    /* special tokens for PARSE_SPECIAL, grouped by first byte, longest first */
    int32_t *spec;
    uint32_t spec_start[257];
    dsi_token special[7];
};

/* ---- GPT-2 byte <-> unicode alphabet ---------------------------------------------------- */

/* byte_cp[b]: the code point GPT-2 spells byte b with. Printable Latin-1 bytes stand for
 * themselves; the others are mapped in ascending order to U+0100.. (bytes_to_unicode). */
static void gpt2_alphabet(uint32_t byte_cp[256], int16_t inv[324]) {
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        byte_cp[b] = printable ? (uint32_t)b : 256u + n++;
    }
    for (int i = 0; i < 324; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[byte_cp[b]] = (int16_t)b;
}

/* ---- hashing ------------------------------------------------------------------------- */

static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Spelling -> id map used while building (keys point into the caller's strings). */
typedef struct {
    int32_t *slot;
    size_t cap;
    const char *const *str;
    const size_t *len;
} strmap;

static size_t spelling_len(const dsii_tokenizer_desc *d, size_t i) {
    return d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
}

static int32_t strmap_find(const strmap *m, const char *s, size_t n) {
    size_t i = (size_t)fnv1a(s, n) & (m->cap - 1);
    for (;;) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (m->len[id] == n && memcmp(m->str[id], s, n) == 0) return id;
        i = (i + 1) & (m->cap - 1);
    }
}

/* ---- merge table ------------------------------------------------------------------------ */

static int merge_find(const dsii_tokenizer *t, int32_t a, int32_t b, uint32_t *rank,
                      int32_t *res) {
    if (t->mcap == 0) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)mix64(key) & (t->mcap - 1);
    for (;;) {
        if (t->mres[i] < 0) return 0;
        if (t->mkey[i] == key) {
            *rank = t->mrank[i];
            *res = t->mres[i];
            return 1;
        }
        i = (i + 1) & (t->mcap - 1);
    }
}

static void merge_insert(dsii_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t res) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)mix64(key) & (t->mcap - 1);
    for (;;) {
        if (t->mres[i] < 0) {
            t->mkey[i] = key;
            t->mrank[i] = rank;
            t->mres[i] = res;
            return;
        }
        if (t->mkey[i] == key) return; /* a repeated pair keeps its first (lowest) rank */
        i = (i + 1) & (t->mcap - 1);
    }
}

/* ---- building --------------------------------------------------------------------------- */

static const char *const special_text[7] = {
    "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", /* BOS */
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",   /* EOS */
    "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>",                 /* PAD */
    "<\xef\xbd\x9cUser\xef\xbd\x9c>",                                        /* USER */
    "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>",                                /* ASSISTANT */
    "<think>",                                                              /* THINK_BEGIN */
    "</think>",                                                             /* THINK_END */
};

void dsii_tokenizer_free(dsii_tokenizer *t) {
    if (!t) return;
    const dsi_context *ctx = t->ctx;
    dsii_free(ctx, t->blob);
    dsii_free(ctx, t->off);
    dsii_free(ctx, t->flags);
    dsii_free(ctx, t->mkey);
    dsii_free(ctx, t->mrank);
    dsii_free(ctx, t->mres);
    dsii_free(ctx, t->spec);
    dsii_free(ctx, t);
}

static const uint8_t *tok_bytes(const dsii_tokenizer *t, int32_t id, size_t *len) {
    *len = t->off[id + 1] - t->off[id];
    return t->blob + t->off[id];
}

/* Sort key for the special list: first byte ascending, then length descending, then id. */
static int spec_less(const dsii_tokenizer *t, int32_t a, int32_t b) {
    size_t la, lb;
    const uint8_t *pa = tok_bytes(t, a, &la), *pb = tok_bytes(t, b, &lb);
    if (pa[0] != pb[0]) return pa[0] < pb[0];
    if (la != lb) return la > lb;
    return a < b;
}

static void spec_sort(const dsii_tokenizer *t, int32_t *v, size_t n, int32_t *tmp) {
    /* merge sort: deterministic and O(n log n) without recursion depth issues */
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = spec_less(t, v[j], v[i]) ? v[j++] : v[i++];
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
}

dsi_status dsii_tokenizer_create(const dsi_context *ctx, const dsii_tokenizer_desc *d,
                                 dsii_tokenizer **out, dsii_error *err) {
    if (out) *out = NULL;
    if (!d || !out || (d->n_tokens > 0 && !d->tokens) || (d->n_merges > 0 && !d->merges))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    if (d->n_tokens < 256 || d->n_tokens > DSII_TOKENIZER_MAX_VOCAB)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                         "tokenizer.ggml.tokens: %zu tokens (need 256 .. %u for byte-level BPE)",
                         d->n_tokens, DSII_TOKENIZER_MAX_VOCAB);
    if (d->n_merges > DSII_TOKENIZER_MAX_MERGES)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.merges: %zu merges (limit %u)",
                         d->n_merges, DSII_TOKENIZER_MAX_MERGES);

    const size_t n = d->n_tokens;
    dsi_status st = DSI_OK;
    size_t *lens = NULL;
    strmap map = {0};
    int32_t *tmp = NULL;
    dsii_tokenizer *t = dsii_calloc(ctx, 1, sizeof *t);
    if (!t) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "tokenizer: out of memory");
    t->ctx = ctx;
    t->n_vocab = (int32_t)n;

    uint32_t byte_cp[256];
    int16_t inv[324];
    gpt2_alphabet(byte_cp, inv);

    lens = dsii_malloc(ctx, n * sizeof *lens);
    t->off = dsii_malloc(ctx, (n + 1) * sizeof *t->off);
    t->flags = dsii_calloc(ctx, n, 1);
    if (!lens || !t->off || !t->flags) goto oom;

    /* Token bytes: a spelling made only of alphabet code points decodes to those bytes;
     * any other spelling (special tokens such as <｜User｜>) stands for its own UTF-8. Decoded
     * bytes are never longer than the spelling, so the spelling lengths bound the blob. */
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!d->tokens[i])
            { st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.tokens[%zu] is NULL", i); goto fail; }
        lens[i] = spelling_len(d, i);
        if (lens[i] == 0)
            { st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.tokens[%zu] is empty", i); goto fail; }
        total += lens[i];
    }
    if (total > UINT32_MAX)
        { st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.tokens: %llu bytes of text (limit 4 GiB)", (unsigned long long)total); goto fail; }
    t->blob = dsii_malloc(ctx, (size_t)total + 1);
    if (!t->blob) goto oom;
    uint32_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)d->tokens[i];
        size_t L = lens[i], k = 0;
        uint32_t start = pos;
        int bytelevel = 1;
        while (k < L) {
            uint32_t cp;
            k += dsii_utf8_decode(s + k, L - k, &cp);
            if (cp >= 324 || inv[cp] < 0) { bytelevel = 0; break; }
            t->blob[pos++] = (uint8_t)inv[cp];
        }
        if (!bytelevel) {
            pos = start;
            memcpy(t->blob + pos, s, L);
            pos += (uint32_t)L;
        }
        t->off[i] = start;
        int32_t type = d->token_types ? d->token_types[i] : 1;
        uint8_t f = bytelevel ? TF_BYTELEVEL : 0;
        if (type == 3 || type == 4) f = TF_SPECIAL;
        else if (!d->token_types && !bytelevel) f = TF_SPECIAL;
        t->flags[i] = f;
    }
    t->off[n] = pos;

    /* Spellings of the byte-level (non-special) tokens, for the merges. */
    map.cap = pow2_at_least(2 * n);
    map.slot = dsii_malloc(ctx, map.cap * sizeof *map.slot);
    map.str = d->tokens;
    map.len = lens;
    if (!map.slot) goto oom;
    for (size_t i = 0; i < map.cap; i++) map.slot[i] = -1;
    for (size_t i = 0; i < n; i++) {
        if (!(t->flags[i] & TF_BYTELEVEL)) continue;
        size_t h = (size_t)fnv1a(d->tokens[i], lens[i]) & (map.cap - 1);
        for (;;) {
            int32_t id = map.slot[h];
            if (id < 0) { map.slot[h] = (int32_t)i; break; }
            if (lens[id] == lens[i] && memcmp(d->tokens[id], d->tokens[i], lens[i]) == 0)
                break; /* duplicate spelling: the lower id wins */
            h = (h + 1) & (map.cap - 1);
        }
    }

    for (int b = 0; b < 256; b++) {
        char sp[3];
        size_t sl;
        uint32_t cp = byte_cp[b];
        if (cp < 0x80) { sp[0] = (char)cp; sl = 1; }
        else { sp[0] = (char)(0xC0 | (cp >> 6)); sp[1] = (char)(0x80 | (cp & 0x3F)); sl = 2; }
        int32_t id = strmap_find(&map, sp, sl);
        if (id < 0)
            { st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.tokens: no token for byte 0x%02X (spelled U+%04X)", b, (unsigned)cp); goto fail; }
        t->byte_token[b] = id;
    }

    /* Merges, as (left id, right id) -> (rank, result id). */
    if (d->n_merges > 0) {
        t->mcap = pow2_at_least(2 * d->n_merges);
        t->mkey = dsii_malloc(ctx, t->mcap * sizeof *t->mkey);
        t->mrank = dsii_malloc(ctx, t->mcap * sizeof *t->mrank);
        t->mres = dsii_malloc(ctx, t->mcap * sizeof *t->mres);
        if (!t->mkey || !t->mrank || !t->mres) goto oom;
        for (size_t i = 0; i < t->mcap; i++) t->mres[i] = -1;
        char *cat = NULL;
        size_t cat_cap = 0;
        for (size_t r = 0; r < d->n_merges; r++) {
            const char *m = d->merges[r];
            if (!m) { st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.merges[%zu] is NULL", r); break; }
            size_t ml = d->merge_lens ? d->merge_lens[r] : strlen(m);
            const char *sp = memchr(m, ' ', ml);
            if (!sp || sp == m || sp == m + ml - 1 || memchr(sp + 1, ' ', (size_t)(m + ml - sp - 1))) {
                st = dsii_fail(err, DSI_ERR_BAD_FORMAT,
                               "tokenizer.ggml.merges[%zu] '%.*s' is not two tokens separated by one space",
                               r, (int)(ml > 64 ? 64 : ml), m);
                break;
            }
            size_t la = (size_t)(sp - m), lb = ml - la - 1;
            int32_t a = strmap_find(&map, m, la), b = strmap_find(&map, sp + 1, lb);
            if (la + lb > cat_cap) {
                char *nc = dsii_realloc(ctx, cat, la + lb);
                if (!nc) { dsii_free(ctx, cat); goto oom; }
                cat = nc;
                cat_cap = la + lb;
            }
            memcpy(cat, m, la);
            memcpy(cat + la, sp + 1, lb);
            int32_t res = strmap_find(&map, cat, la + lb);
            if (a < 0 || b < 0 || res < 0) {
                st = dsii_fail(err, DSI_ERR_BAD_FORMAT,
                               "tokenizer.ggml.merges[%zu] '%.*s': %s '%.*s' is not a byte-level token",
                               r, (int)(ml > 64 ? 64 : ml), m,
                               a < 0 ? "left part" : b < 0 ? "right part" : "result",
                               (int)(a < 0 ? la : b < 0 ? lb : (la + lb > 64 ? 64 : la + lb)),
                               a < 0 ? m : b < 0 ? sp + 1 : cat);
                break;
            }
            merge_insert(t, a, b, (uint32_t)r, res);
        }
        dsii_free(ctx, cat);
        if (st != DSI_OK) goto fail;
    }

    /* Special ids: the tokenizer.ggml.*_token_id keys where given, else by text (§6). */
    const int64_t given[3] = {d->bos_id, d->eos_id, d->pad_id};
    static const char *const given_key[3] = {"tokenizer.ggml.bos_token_id",
                                             "tokenizer.ggml.eos_token_id",
                                             "tokenizer.ggml.padding_token_id"};
    for (int w = 0; w < 7; w++) {
        t->special[w] = -1;
        if (w < 3 && given[w] >= 0) {
            if (given[w] >= (int64_t)n)
                { st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s = %lld is outside the vocabulary (%zu tokens)", given_key[w], (long long)given[w], n); goto fail; }
            t->special[w] = (dsi_token)given[w];
            continue;
        }
        size_t tl = strlen(special_text[w]);
        for (size_t i = 0; i < n; i++) {
            size_t bl;
            const uint8_t *bp = tok_bytes(t, (int32_t)i, &bl);
            if (bl == tl && memcmp(bp, special_text[w], tl) == 0) {
                if (t->special[w] < 0 || ((t->flags[i] & TF_SPECIAL) && !(t->flags[t->special[w]] & TF_SPECIAL)))
                    t->special[w] = (dsi_token)i;
            }
        }
    }
    /* Without token types, the §6 texts are special even when spelled in the alphabet. */
    if (!d->token_types)
        for (int w = 0; w < 7; w++)
            if (t->special[w] >= 0) t->flags[t->special[w]] = TF_SPECIAL;

    /* Special list for literal matching. */
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) ns += (t->flags[i] & TF_SPECIAL) ? 1 : 0;
    t->spec = dsii_malloc(ctx, (ns ? ns : 1) * sizeof *t->spec);
    tmp = dsii_malloc(ctx, (ns ? ns : 1) * sizeof *tmp);
    if (!t->spec || !tmp) goto oom;
    ns = 0;
    for (size_t i = 0; i < n; i++)
        if (t->flags[i] & TF_SPECIAL) t->spec[ns++] = (int32_t)i;
    spec_sort(t, t->spec, ns, tmp);
    {
        size_t k = 0;
        for (int b = 0; b < 256; b++) {
            t->spec_start[b] = (uint32_t)k;
            while (k < ns && t->blob[t->off[t->spec[k]]] == b) k++;
        }
        t->spec_start[256] = (uint32_t)ns;
    }

    dsii_free(ctx, tmp);
    dsii_free(ctx, map.slot);
    dsii_free(ctx, lens);
    *out = t;
    return DSI_OK;

oom:
    st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "tokenizer: out of memory");
fail:
    dsii_free(ctx, tmp);
    dsii_free(ctx, map.slot);
    dsii_free(ctx, lens);
    dsii_tokenizer_free(t);
    return st;
}

dsi_status dsii_tokenizer_load(const dsi_context *ctx, const dsii_gguf *g, dsii_tokenizer **out,
                               dsii_error *err) {
    if (out) *out = NULL;
    if (!g || !out) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "tokenizer: NULL argument");
    const char *model = NULL, *pre = NULL;
    dsi_status st = dsii_gguf_get_string(g, "tokenizer.ggml.model", &model, NULL, err);
    if (st == DSI_ERR_NOT_FOUND)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key tokenizer.ggml.model not found (need \"gpt2\")");
    if (st != DSI_OK) return st;
    if (strcmp(model, "gpt2") != 0)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED,
                         "tokenizer.ggml.model = \"%.64s\": only \"gpt2\" (byte-level BPE) is supported", model);
    st = dsii_gguf_get_string(g, "tokenizer.ggml.pre", &pre, NULL, err);
    if (st == DSI_ERR_NOT_FOUND)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key tokenizer.ggml.pre not found (need \"joyai-llm\")");
    if (st != DSI_OK) return st;
    /* llama.cpp runs "deepseek-v3" and "joyai-llm" with the same regex set (§6). */
    if (strcmp(pre, "joyai-llm") != 0 && strcmp(pre, "deepseek-v3") != 0)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED,
                         "tokenizer.ggml.pre = \"%.64s\": only \"joyai-llm\" (DeepSeek V4) is supported", pre);

    int64_t kt = dsii_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t km = dsii_gguf_find_key(g, "tokenizer.ggml.merges");
    if (kt < 0) return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key tokenizer.ggml.tokens not found");
    if (km < 0) return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key tokenizer.ggml.merges not found");
    if (dsii_gguf_arr_type(g, kt) != DSII_GGUF_STRING)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key tokenizer.ggml.tokens is not an array of strings");
    if (dsii_gguf_arr_type(g, km) != DSII_GGUF_STRING)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key tokenizer.ggml.merges is not an array of strings");
    uint64_t nt = dsii_gguf_arr_len(g, kt), nm = dsii_gguf_arr_len(g, km);
    if (nt < 256 || nt > DSII_TOKENIZER_MAX_VOCAB)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.tokens: %llu tokens (need 256 .. %u)",
                         (unsigned long long)nt, DSII_TOKENIZER_MAX_VOCAB);
    if (nm > DSII_TOKENIZER_MAX_MERGES)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.merges: %llu merges (limit %u)",
                         (unsigned long long)nm, DSII_TOKENIZER_MAX_MERGES);

    dsii_tokenizer_desc d;
    memset(&d, 0, sizeof d);
    d.n_tokens = (size_t)nt;
    d.n_merges = (size_t)nm;
    d.bos_id = d.eos_id = d.pad_id = -1;
    const char **toks = dsii_malloc(ctx, (size_t)nt * sizeof *toks);
    size_t *tlens = dsii_malloc(ctx, (size_t)nt * sizeof *tlens);
    const char **merges = dsii_malloc(ctx, (size_t)(nm ? nm : 1) * sizeof *merges);
    size_t *mlens = dsii_malloc(ctx, (size_t)(nm ? nm : 1) * sizeof *mlens);
    int32_t *types = NULL;
    if (!toks || !tlens || !merges || !mlens) {
        st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "tokenizer: out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < nt; i++) toks[i] = dsii_gguf_arr_str(g, kt, i, &tlens[i]);
    for (uint64_t i = 0; i < nm; i++) merges[i] = dsii_gguf_arr_str(g, km, i, &mlens[i]);
    d.tokens = toks;
    d.token_lens = tlens;
    d.merges = merges;
    d.merge_lens = mlens;

    if (dsii_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        uint64_t ntt = 0;
        types = dsii_malloc(ctx, (size_t)nt * sizeof *types);
        if (!types) { st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "tokenizer: out of memory"); goto done; }
        st = dsii_gguf_get_arr_i32(g, "tokenizer.ggml.token_type", types, (size_t)nt, &ntt, err);
        if (st == DSI_OK && ntt != nt)
            st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.token_type has %llu entries, tokens has %llu",
                           (unsigned long long)ntt, (unsigned long long)nt);
        if (st == DSI_ERR_INVALID_ARGUMENT)
            st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "tokenizer.ggml.token_type has more entries than tokens (%llu)",
                           (unsigned long long)nt);
        if (st != DSI_OK) goto done;
        d.token_types = types;
    }
    static const char *const idkeys[3] = {"tokenizer.ggml.bos_token_id",
                                          "tokenizer.ggml.eos_token_id",
                                          "tokenizer.ggml.padding_token_id"};
    int64_t *ids[3] = {&d.bos_id, &d.eos_id, &d.pad_id};
    for (int w = 0; w < 3; w++) {
        int64_t v;
        st = dsii_gguf_get_i64(g, idkeys[w], &v, err);
        if (st == DSI_ERR_NOT_FOUND) { st = DSI_OK; continue; }
        if (st != DSI_OK) goto done;
        if (v < 0 || (uint64_t)v >= nt) {
            st = dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s = %lld is outside the vocabulary (%llu tokens)",
                           idkeys[w], (long long)v, (unsigned long long)nt);
            goto done;
        }
        *ids[w] = v;
    }
    st = dsii_tokenizer_create(ctx, &d, out, err);
done:
    dsii_free(ctx, toks);
    dsii_free(ctx, tlens);
    dsii_free(ctx, merges);
    dsii_free(ctx, mlens);
    dsii_free(ctx, types);
    return st;
}

int32_t dsii_tokenizer_n_vocab(const dsii_tokenizer *t) { return t ? t->n_vocab : 0; }

const uint8_t *dsii_tokenizer_token_bytes(const dsii_tokenizer *t, dsi_token id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    size_t l;
    const uint8_t *p = tok_bytes(t, id, &l);
    if (len) *len = l;
    return p;
}

dsi_token dsii_tokenizer_special(const dsii_tokenizer *t, int32_t which) {
    if (!t || which < 0 || which > 6) return -1;
    return t->special[which];
}

int dsii_tokenizer_is_special(const dsii_tokenizer *t, dsi_token id) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    return (t->flags[id] & TF_SPECIAL) ? 1 : 0;
}

/* ---- tokenizing ------------------------------------------------------------------------- */

typedef struct {
    const dsii_tokenizer *t;
    const dsi_context *ctx;
    dsi_token *v;
    size_t n, cap;
    /* segment code points */
    uint32_t *cp;
    uint8_t *cat;
    size_t *boff;       /* byte offset of code point i within the segment; boff[ncp] = len */
    size_t seg_cap;
    const uint8_t *seg;
    /* BPE scratch */
    int32_t *sid, *prv, *nxt;
    struct heap_ent { uint32_t rank; uint32_t pos; int32_t a, b; } *heap;
    size_t bpe_cap, heap_cap;
    int oom;
    void (*piece_fn)(void *user, size_t off, size_t len); /* tests: see the pieces */
    void *piece_user;
    size_t seg_base;
} tkz;

static void push_tok(tkz *z, dsi_token id) {
    if (z->oom) return;
    if (z->n == z->cap) {
        size_t nc = z->cap ? z->cap * 2 : 256;
        dsi_token *nv = dsii_realloc(z->ctx, z->v, nc * sizeof *nv);
        if (!nv) { z->oom = 1; return; }
        z->v = nv;
        z->cap = nc;
    }
    z->v[z->n++] = id;
}

static int heap_less(const struct heap_ent *x, const struct heap_ent *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(tkz *z, size_t *hn, struct heap_ent e) {
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &z->heap[p])) break;
        z->heap[i] = z->heap[p];
        i = p;
    }
    z->heap[i] = e;
}

static struct heap_ent heap_pop(tkz *z, size_t *hn) {
    struct heap_ent top = z->heap[0], last = z->heap[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&z->heap[c + 1], &z->heap[c])) c++;
        if (!heap_less(&z->heap[c], &last)) break;
        z->heap[i] = z->heap[c];
        i = c;
    }
    if (n > 0) z->heap[i] = last;
    return top;
}

static void try_pair(tkz *z, size_t *hn, int32_t pos) {
    int32_t q = z->nxt[pos];
    if (q < 0) return;
    uint32_t rank = 0;
    int32_t res = -1;
    if (merge_find(z->t, z->sid[pos], z->sid[q], &rank, &res)) {
        struct heap_ent e = {rank, (uint32_t)pos, z->sid[pos], z->sid[q]};
        heap_push(z, hn, e);
    }
}

/* Byte-level BPE of one piece (model-spec §6). */
static void bpe_piece(tkz *z, const uint8_t *s, size_t n) {
    const dsii_tokenizer *t = z->t;
    if (n == 1) { push_tok(z, t->byte_token[s[0]]); return; }
    if (n > z->bpe_cap) {
        size_t c = n;
        dsii_free(z->ctx, z->sid); dsii_free(z->ctx, z->prv); dsii_free(z->ctx, z->nxt);
        dsii_free(z->ctx, z->heap);
        z->sid = dsii_malloc(z->ctx, c * sizeof *z->sid);
        z->prv = dsii_malloc(z->ctx, c * sizeof *z->prv);
        z->nxt = dsii_malloc(z->ctx, c * sizeof *z->nxt);
        /* n-1 initial pairs + at most 2 new pairs per merge (n-1 merges) */
        z->heap_cap = 3 * c;
        z->heap = dsii_malloc(z->ctx, z->heap_cap * sizeof *z->heap);
        if (!z->sid || !z->prv || !z->nxt || !z->heap) { z->oom = 1; z->bpe_cap = 0; return; }
        z->bpe_cap = c;
    }
    for (size_t i = 0; i < n; i++) {
        z->sid[i] = t->byte_token[s[i]];
        z->prv[i] = (int32_t)i - 1;
        z->nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(z, &hn, (int32_t)i);
    while (hn > 0) {
        struct heap_ent e = heap_pop(z, &hn);
        int32_t p = (int32_t)e.pos, q = z->nxt[p];
        /* stale entry: the symbol was merged away or a neighbour changed */
        if (z->sid[p] != e.a || q < 0 || z->sid[q] != e.b) continue;
        uint32_t rank = 0;
        int32_t res = -1;
        if (!merge_find(t, e.a, e.b, &rank, &res)) continue; /* cannot happen: pushed pairs merge */
        z->sid[p] = res;
        z->sid[q] = -1; /* dead */
        z->nxt[p] = z->nxt[q];
        if (z->nxt[q] >= 0) z->prv[z->nxt[q]] = p;
        if (z->prv[p] >= 0) try_pair(z, &hn, z->prv[p]);
        try_pair(z, &hn, p);
    }
    for (int32_t i = 0; i >= 0; i = z->nxt[i]) push_tok(z, z->sid[i]);
}

static void emit_piece(tkz *z, size_t a, size_t b) {
    if (a >= b) return;
    if (z->piece_fn) {
        z->piece_fn(z->piece_user, z->seg_base + z->boff[a], z->boff[b] - z->boff[a]);
        return;
    }
    bpe_piece(z, z->seg + z->boff[a], z->boff[b] - z->boff[a]);
}

static int is_ascii_punct(uint32_t c) {
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
           (c >= '{' && c <= '~');
}
static int is_ascii_alpha(uint32_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* Split c: the end of the match starting at i within [i, b), or i if none. */
static size_t match_c(const tkz *z, size_t i, size_t b) {
    const uint32_t *cp = z->cp;
    const uint8_t *ct = z->cat;
    /* [!-/:-@\[-`{-~][A-Za-z]+ */
    if (is_ascii_punct(cp[i]) && i + 1 < b && is_ascii_alpha(cp[i + 1])) {
        size_t j = i + 1;
        while (j < b && is_ascii_alpha(cp[j])) j++;
        return j;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ */
    {
        size_t j = i;
        int pre_ok = !is_nl(cp[i]) && ct[i] != DSII_UCAT_L && ct[i] != DSII_UCAT_P && ct[i] != DSII_UCAT_S;
        if (pre_ok && i + 1 < b && (ct[i + 1] == DSII_UCAT_L || ct[i + 1] == DSII_UCAT_M)) j = i + 1;
        if (ct[j] == DSII_UCAT_L || ct[j] == DSII_UCAT_M) {
            while (j < b && (ct[j] == DSII_UCAT_L || ct[j] == DSII_UCAT_M)) j++;
            return j;
        }
    }
    /*  ?[\p{P}\p{S}]+[\r\n]* */
    {
        size_t j = i;
        if (cp[i] == ' ' && i + 1 < b && (ct[i + 1] == DSII_UCAT_P || ct[i + 1] == DSII_UCAT_S)) j = i + 1;
        if (ct[j] == DSII_UCAT_P || ct[j] == DSII_UCAT_S) {
            while (j < b && (ct[j] == DSII_UCAT_P || ct[j] == DSII_UCAT_S)) j++;
            while (j < b && is_nl(cp[j])) j++;
            return j;
        }
    }
    if (ct[i] != DSII_UCAT_WS) return i;
    size_t j = i;
    size_t last_nl = SIZE_MAX;
    while (j < b && ct[j] == DSII_UCAT_WS) {
        if (is_nl(cp[j])) last_nl = j;
        j++;
    }
    /* \s*[\r\n]+ : greedy \s* backs off to the last newline of the run */
    if (last_nl != SIZE_MAX) return last_nl + 1;
    /* \s+(?!\S) : the whole run at the end of the piece, else all but its last char */
    if (j == b) return j;
    if (j - i >= 2) return j - 1;
    /* \s+ */
    return j;
}

static void split_c(tkz *z, size_t a, size_t b) {
    size_t gap = a, i = a;
    while (i < b) {
        size_t m = match_c(z, i, b);
        if (m > i) {
            emit_piece(z, gap, i);
            emit_piece(z, i, m);
            i = gap = m;
        } else {
            i++;
        }
    }
    emit_piece(z, gap, b);
}

static int is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) ||
           (c >= 0x30A0 && c <= 0x30FF);
}

static void split_b(tkz *z, size_t a, size_t b) {
    size_t i = a, gap = a;
    while (i < b) {
        if (is_cjk(z->cp[i])) {
            size_t j = i;
            while (j < b && is_cjk(z->cp[j])) j++;
            split_c(z, gap, i);
            split_c(z, i, j);
            i = gap = j;
        } else {
            i++;
        }
    }
    split_c(z, gap, b);
}

static void split_a(tkz *z, size_t ncp) {
    size_t i = 0, gap = 0;
    while (i < ncp) {
        if (z->cat[i] == DSII_UCAT_N) {
            split_b(z, gap, i);
            size_t j = i;
            while (j < ncp && z->cat[j] == DSII_UCAT_N && j - i < 3) j++;
            split_b(z, i, j);
            i = gap = j;
        } else {
            i++;
        }
    }
    split_b(z, gap, ncp);
}

static void tokenize_plain(tkz *z, const uint8_t *s, size_t len) {
    if (len == 0 || z->oom) return;
    if (len + 1 > z->seg_cap) {
        dsii_free(z->ctx, z->cp); dsii_free(z->ctx, z->cat); dsii_free(z->ctx, z->boff);
        z->cp = dsii_malloc(z->ctx, len * sizeof *z->cp);
        z->cat = dsii_malloc(z->ctx, len + 1);
        z->boff = dsii_malloc(z->ctx, (len + 1) * sizeof *z->boff);
        if (!z->cp || !z->cat || !z->boff) { z->oom = 1; z->seg_cap = 0; return; }
        z->seg_cap = len + 1;
    }
    size_t ncp = 0, k = 0;
    while (k < len) {
        uint32_t c;
        size_t adv = dsii_utf8_decode(s + k, len - k, &c);
        z->cp[ncp] = c;
        z->cat[ncp] = (uint8_t)dsii_ucat(c);
        z->boff[ncp] = k;
        ncp++;
        k += adv;
    }
    z->boff[ncp] = len;
    z->cat[ncp] = DSII_UCAT_OTHER;
    z->seg = s;
    split_a(z, ncp);
}

/* Leftmost-longest literal match of a special token at s[0..len), or -1. */
static int32_t match_special(const dsii_tokenizer *t, const uint8_t *s, size_t len,
                             size_t *mlen) {
    for (uint32_t k = t->spec_start[s[0]]; k < t->spec_start[s[0] + 1]; k++) {
        size_t l;
        const uint8_t *p = tok_bytes(t, t->spec[k], &l);
        if (l <= len && memcmp(p, s, l) == 0) {
            *mlen = l;
            return t->spec[k];
        }
    }
    return -1;
}

static int all_allowed(const uint8_t *ok, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!ok[i]) return 0;
    return 1;
}

static dsi_status tokenize_impl(const dsii_tokenizer *t, const char *text, size_t len,
                                uint32_t flags, const uint8_t *special_ok, dsi_token *tokens,
                                size_t cap, size_t *n_needed, dsii_error *err);

dsi_status dsii_tokenize(const dsii_tokenizer *t, const char *text, size_t len, uint32_t flags,
                         dsi_token *tokens, size_t cap, size_t *n_needed, dsii_error *err) {
    return tokenize_impl(t, text, len, flags, NULL, tokens, cap, n_needed, err);
}

dsi_status dsii_tokenize_masked(const dsii_tokenizer *t, const char *text, size_t len,
                                const uint8_t *special_ok, uint32_t flags, dsi_token *tokens,
                                size_t cap, size_t *n_needed, dsii_error *err) {
    if (!special_ok && len > 0)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "tokenize: NULL special-token mask");
    return tokenize_impl(t, text, len, flags | DSI_TOKENIZE_PARSE_SPECIAL, special_ok, tokens,
                         cap, n_needed, err);
}

static dsi_status tokenize_impl(const dsii_tokenizer *t, const char *text, size_t len,
                                uint32_t flags, const uint8_t *special_ok, dsi_token *tokens,
                                size_t cap, size_t *n_needed, dsii_error *err) {
    if (!t || (!text && len > 0) || !n_needed || (!tokens && cap > 0))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "tokenize: NULL %s", !t ? "tokenizer" : (!text && len > 0) ? "text" :
                         !n_needed ? "n_needed" : "tokens with cap > 0");
    if (flags & ~(uint32_t)(DSI_TOKENIZE_PARSE_SPECIAL | DSI_TOKENIZE_ADD_BOS))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "tokenize: unknown flags 0x%x",
                         (unsigned)(flags & ~(uint32_t)(DSI_TOKENIZE_PARSE_SPECIAL | DSI_TOKENIZE_ADD_BOS)));
    if ((flags & DSI_TOKENIZE_ADD_BOS) && t->special[DSI_SPECIAL_BOS] < 0)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "tokenize: DSI_TOKENIZE_ADD_BOS but the vocabulary has no BOS token");
    tkz z;
    memset(&z, 0, sizeof z);
    z.t = t;
    z.ctx = t->ctx;
    if (flags & DSI_TOKENIZE_ADD_BOS) push_tok(&z, t->special[DSI_SPECIAL_BOS]);
    const uint8_t *s = (const uint8_t *)text;
    if (flags & DSI_TOKENIZE_PARSE_SPECIAL) {
        size_t seg = 0, i = 0;
        while (i < len && !z.oom) {
            size_t ml;
            int32_t id = match_special(t, s + i, len - i, &ml);
            if (id >= 0 && (!special_ok || all_allowed(special_ok + i, ml))) {
                tokenize_plain(&z, s + seg, i - seg);
                push_tok(&z, id);
                i += ml;
                seg = i;
            } else {
                i++;
            }
        }
        tokenize_plain(&z, s + seg, len - seg);
    } else {
        tokenize_plain(&z, s, len);
    }
    dsi_status st = DSI_OK;
    if (z.oom) {
        st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "tokenize: out of memory (%zu bytes of text)", len);
    } else {
        *n_needed = z.n;
        if (z.n > cap)
            st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                           "tokenize: %zu tokens do not fit in cap %zu", z.n, cap);
        else if (z.n > 0)
            memcpy(tokens, z.v, z.n * sizeof *tokens);
    }
    dsii_free(z.ctx, z.v);
    dsii_free(z.ctx, z.cp);
    dsii_free(z.ctx, z.cat);
    dsii_free(z.ctx, z.boff);
    dsii_free(z.ctx, z.sid);
    dsii_free(z.ctx, z.prv);
    dsii_free(z.ctx, z.nxt);
    dsii_free(z.ctx, z.heap);
    return st;
}

void dsii_pretokenize(const char *text, size_t len,
                      void (*fn)(void *user, size_t off, size_t len), void *user) {
    tkz z;
    memset(&z, 0, sizeof z);
    z.piece_fn = fn;
    z.piece_user = user;
    tokenize_plain(&z, (const uint8_t *)text, len);
    dsii_free(NULL, z.cp);
    dsii_free(NULL, z.cat);
    dsii_free(NULL, z.boff);
}

/* ---- incremental UTF-8 ----------------------------------------------------------------- */

size_t dsii_utf8_stream_bound(const dsii_utf8_stream *s, size_t n) {
    return (s->n_pending + n) * 3 + 3;
}

/* Length of the maximal invalid subpart at p (>= 1): the lead byte plus the continuation
 * bytes that still fit its pattern (Unicode "maximal subpart" replacement practice). */
static size_t invalid_len(const uint8_t *p, size_t len) {
    size_t best = 1;
    for (size_t k = 2; k <= 3 && k <= len; k++)
        if (dsii_utf8_check(p, k) == -1) best = k;
    return best;
}

size_t dsii_utf8_stream_push(const dsii_utf8_stream *s, const uint8_t *bytes, size_t n,
                             uint8_t *out, dsii_utf8_stream *next) {
    /* Process pending + bytes as one logical buffer without copying the bulk. */
    uint8_t head[8];
    size_t hn = s->n_pending;
    memcpy(head, s->pending, hn);
    size_t total = hn + n, p = 0, o = 0;
#define AT(i) ((i) < hn ? head[i] : bytes[(i) - hn])
    while (p < total) {
        uint8_t w[4];
        size_t avail = total - p < 4 ? total - p : 4;
        for (size_t k = 0; k < avail; k++) w[k] = AT(p + k);
        int r = dsii_utf8_check(w, avail);
        if (r > 0) {
            if (p >= hn && r == 1) {
                /* fast path: copy an ASCII run */
                size_t q = p;
                while (q < total && bytes[q - hn] < 0x80) out[o++] = bytes[q++ - hn];
                p = q;
                continue;
            }
            for (int k = 0; k < r; k++) out[o++] = w[k];
            p += (size_t)r;
        } else if (r == -1) {
            break; /* unfinished character at the end: hold it back */
        } else {
            size_t bad = invalid_len(w, avail);
            out[o++] = 0xEF; out[o++] = 0xBF; out[o++] = 0xBD;
            p += bad;
        }
    }
    next->n_pending = (uint32_t)(total - p);
    for (size_t k = 0; k < next->n_pending; k++) next->pending[k] = AT(p + k);
#undef AT
    return o;
}

size_t dsii_utf8_stream_flush(dsii_utf8_stream *s, uint8_t *out) {
    size_t o = 0;
    if (s->n_pending > 0) {
        out[0] = 0xEF; out[1] = 0xBF; out[2] = 0xBD;
        o = 3;
    }
    s->n_pending = 0;
    return o;
}
