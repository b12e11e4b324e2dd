/* Engram n-gram hashing and prime layout (model-spec §4.6). Pure functions. */
#include "engram/engram.h"

#include <string.h>

uint64_t dsii_engram_multiplier_bound(int64_t compressed_vocab) {
    if (compressed_vocab <= 0) return 0;
    return ((uint64_t)INT64_MAX / (uint64_t)compressed_vocab) / 2u;
}

/* (a * b) mod m without 128-bit types (portable C11). */
static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
    uint64_t r = 0;
    a %= m;
    while (b) {
        if (b & 1u) r = (r >= m - a) ? r - (m - a) : r + a;
        b >>= 1;
        a = (a >= m - a) ? a - (m - a) : a + a;
    }
    return r;
}

static uint64_t powmod(uint64_t b, uint64_t e, uint64_t m) {
    uint64_t r = 1 % m;
    b %= m;
    while (e) {
        if (e & 1u) r = mulmod(r, b, m);
        b = mulmod(b, b, m);
        e >>= 1;
    }
    return r;
}

int dsii_engram_is_prime(uint64_t n) {
    static const uint64_t small[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (n < 2) return 0;
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        if (n == small[i]) return 1;
        if (n % small[i] == 0) return 0;
    }
    if (n < 41u * 41u) return 1;
    /* Miller-Rabin with the first 12 primes as bases: deterministic for n < 3.3e24. */
    uint64_t d = n - 1;
    int s = 0;
    while ((d & 1u) == 0) {
        d >>= 1;
        s++;
    }
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        uint64_t x = powmod(small[i], d, n);
        if (x == 1 || x == n - 1) continue;
        int comp = 1;
        for (int r = 1; r < s; r++) {
            x = mulmod(x, x, n);
            if (x == n - 1) {
                comp = 0;
                break;
            }
        }
        if (comp) return 0;
    }
    return 1;
}

int dsii_engram_find_primes(uint64_t vocab_size, int32_t n_layers, int32_t max_ngram,
                            int32_t n_heads, uint64_t *out) {
    if (!out || vocab_size < 1 || n_layers < 1 || max_ngram < 2 ||
        max_ngram > DSII_ENGRAM_MAX_NGRAM || n_heads < 1 || n_heads > DSII_ENGRAM_MAX_HEADS)
        return 0;
    size_t n_found = 0;
    for (int32_t L = 0; L < n_layers; L++) {
        for (int32_t n = 2; n <= max_ngram; n++) {
            uint64_t start = vocab_size - 1; /* the search restarts for every n-gram size */
            for (int32_t h = 0; h < n_heads; h++) {
                uint64_t c = start + 1;
                for (;;) {
                    if (c == 0) return 0; /* wrapped */
                    if (dsii_engram_is_prime(c)) {
                        int seen = 0; /* one global set across layers and sizes */
                        for (size_t i = 0; i < n_found; i++)
                            if (out[i] == c) {
                                seen = 1;
                                break;
                            }
                        if (!seen) break;
                    }
                    c++;
                }
                out[n_found++] = c;
                start = c;
            }
        }
    }
    return 1;
}

dsi_status dsii_engram_layout_check(const dsii_engram_layout *l, const char *what,
                                    dsii_error *err) {
    if (!what) what = "engram";
    if (!l) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "%s: no layout", what);
    if (l->max_ngram < 2 || l->max_ngram > DSII_ENGRAM_MAX_NGRAM)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s: max_ngram_size %d outside [2, %d]", what,
                         (int)l->max_ngram, DSII_ENGRAM_MAX_NGRAM);
    if (l->n_heads < 1 || l->n_heads > DSII_ENGRAM_MAX_HEADS)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s: head_count %d outside [1, %d]", what,
                         (int)l->n_heads, DSII_ENGRAM_MAX_HEADS);
    if (l->n_cols != (l->max_ngram - 1) * l->n_heads)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                         "%s: %d hash columns, expected (max_ngram_size - 1) * heads = %d", what,
                         (int)l->n_cols, (int)((l->max_ngram - 1) * l->n_heads));
    if (l->compressed_vocab < 1 || l->n_vocab < 1 || !l->cmap)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s: empty token map", what);
    if (l->pad_cid < 0 || (int64_t)l->pad_cid >= l->compressed_vocab)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s: pad_id %d outside [0, %lld)", what,
                         (int)l->pad_cid, (long long)l->compressed_vocab);
    for (int64_t i = 0; i < l->n_vocab; i++)
        if (l->cmap[i] < 0 || (int64_t)l->cmap[i] >= l->compressed_vocab)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "%s: token_map[%lld] = %d outside [0, %lld)", what, (long long)i,
                             (int)l->cmap[i], (long long)l->compressed_vocab);
    const uint64_t mmax = (uint64_t)INT64_MAX / (uint64_t)l->compressed_vocab;
    for (int32_t k = 0; k < l->max_ngram; k++) {
        uint64_t m = l->multipliers[k];
        if ((m & 1u) == 0 || m > mmax)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "%s: multiplier[%d] = %llu must be odd and <= %llu", what, (int)k,
                             (unsigned long long)m, (unsigned long long)mmax);
    }
    if (l->n_rows > UINT32_MAX)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "%s: %llu table rows exceed 2^32 - 1", what,
                         (unsigned long long)l->n_rows);
    for (int32_t c = 0; c < l->n_cols; c++) {
        uint64_t p = l->primes[c], o = l->offsets[c];
        if (p < 2 || o > l->n_rows || p > l->n_rows - o)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                             "%s: column %d (prime %llu, offset %llu) outside the table of %llu "
                             "rows",
                             what, (int)c, (unsigned long long)p, (unsigned long long)o,
                             (unsigned long long)l->n_rows);
    }
    return DSI_OK;
}

void dsii_engram_hash(const dsii_engram_layout *l, const int32_t *hist, int32_t n_hist,
                      const int32_t *tokens, int64_t n, uint32_t *rows) {
    const int32_t K = l->max_ngram; /* look-backs 0..K-1 */
    const int32_t H = l->n_heads;
    const uint64_t pad = (uint64_t)l->pad_cid;
    if (n_hist > K - 1) { /* only the last K-1 matter */
        hist += n_hist - (K - 1);
        n_hist = K - 1;
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t tok[DSII_ENGRAM_MAX_NGRAM];
        for (int32_t k = 0; k < K; k++) {
            /* token at timeline offset i - k relative to tokens[0]; history before it */
            int64_t j = i - k;
            if (j >= 0)
                tok[k] = (uint64_t)l->cmap[tokens[j]];
            else if (-j <= n_hist)
                tok[k] = (uint64_t)l->cmap[hist[n_hist + j]];
            else
                tok[k] = pad; /* crossed the sequence start: this and all farther pad */
        }
        /* prod[k] = tok[k] * m[k] < 2^63 by the layout check; r = XOR of the first k+1. */
        uint64_t r = tok[0] * l->multipliers[0];
        uint32_t *out = rows + i * (int64_t)l->n_cols;
        for (int32_t k = 1; k < K; k++) {
            r ^= tok[k] * l->multipliers[k];
            for (int32_t h = 0; h < H; h++) {
                int32_t c = (k - 1) * H + h;
                out[c] = (uint32_t)(r % l->primes[c] + l->offsets[c]);
            }
        }
    }
}

void dsii_engram_history_set(dsii_engram_history *h, int32_t max_ngram, const int32_t *tokens,
                             int64_t n) {
    h->n = 0;
    dsii_engram_history_push(h, max_ngram, tokens, n);
}

void dsii_engram_history_push(dsii_engram_history *h, int32_t max_ngram,
                              const int32_t *tokens, int64_t n) {
    int32_t cap = max_ngram - 1;
    if (cap < 0) cap = 0;
    if (cap > DSII_ENGRAM_MAX_NGRAM - 1) cap = DSII_ENGRAM_MAX_NGRAM - 1;
    if (n >= cap) {
        for (int32_t k = 0; k < cap; k++) h->tok[k] = tokens[n - cap + k];
        h->n = cap;
        return;
    }
    int32_t keep = h->n + (int32_t)n > cap ? cap - (int32_t)n : h->n;
    memmove(h->tok, h->tok + (h->n - keep), (size_t)keep * sizeof h->tok[0]);
    for (int64_t k = 0; k < n; k++) h->tok[keep + k] = tokens[k];
    h->n = keep + (int32_t)n;
}
