/*
 * Byte-level BPE vocabulary learner for dsinfer-mkmodel (model-spec §6): pre-split the
 * built-in corpus roughly like the joyai-llm pre-tokenizer, start from the 256 byte tokens,
 * merge the most frequent adjacent pair until the vocabulary is full (ties: the pair with
 * the smallest (left id, right id)), spell tokens with GPT-2's byte-to-unicode map, append
 * the DeepSeek special tokens. Pure integer work: the result is identical on every platform.
 */
#include "mkmodel.h"

#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 and character classes ---------------------------------------------------- */

static uint32_t utf8_next(const uint8_t *s, size_t n, size_t *len) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    int k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (k == 0 || (size_t)k > n) {
        *len = 1;
        return 0xFFFD;
    }
    uint32_t cp = c & (0x7F >> k);
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = (size_t)k;
    return cp;
}

enum { K_DIGIT, K_CJK, K_LETTER, K_PUNCT, K_SPACE, K_NEWLINE };

static int klass(uint32_t c) {
    if (c == '\n' || c == '\r') return K_NEWLINE;
    if (c == ' ' || c == '\t' || c == 0x0B || c == 0x0C || c == 0x3000) return K_SPACE;
    if (c >= '0' && c <= '9') return K_DIGIT;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return K_LETTER;
    if (c < 0x80) return K_PUNCT;
    if ((c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF)) return K_CJK;
    if ((c >= 0xA1 && c <= 0xBF) || c == 0xD7 || c == 0xF7 || (c >= 0x2000 && c <= 0x2BFF) ||
        (c >= 0x3000 && c <= 0x303F) || (c >= 0xFF01 && c <= 0xFF0F) ||
        (c >= 0xFF1A && c <= 0xFF20) || c >= 0x1F000 || (c >= 0xFE00 && c <= 0xFE0F))
        return K_PUNCT;
    return K_LETTER;
}

typedef struct piece {
    const uint8_t *p;
    size_t n;
} piece;

/* Splits text into pieces (approximation of the §6 regex alternation, in its order). */
static size_t presplit(const uint8_t *s, size_t n, piece *out) {
    size_t np = 0, i = 0;
#define CP(pos, kk, ll)                                   \
    do {                                                  \
        size_t l_;                                        \
        uint32_t c_ = utf8_next(s + (pos), n - (pos), &l_); \
        kk = klass(c_);                                   \
        ll = l_;                                          \
    } while (0)
    while (i < n) {
        int k;
        size_t l;
        CP(i, k, l);
        size_t j = i + l;
        int k2 = -1;
        size_t l2 = 0;
        if (j < n) CP(j, k2, l2);
        if (k == K_DIGIT) { /* \p{N}{1,3} */
            int c = 1;
            while (j < n && c < 3 && s[j] >= '0' && s[j] <= '9') j++, c++;
        } else if (k == K_CJK) {
            while (j < n) {
                int kk; size_t ll;
                CP(j, kk, ll);
                if (kk != K_CJK) break;
                j += ll;
            }
        } else if (k == K_PUNCT && k2 == K_LETTER && s[j] < 0x80) { /* [\p{P}\p{S}][A-Za-z]+ */
            while (j < n && ((s[j] | 0x20) >= 'a' && (s[j] | 0x20) <= 'z')) j++;
        } else if (k == K_LETTER || (k == K_SPACE && k2 == K_LETTER)) {
            if (k == K_SPACE) j += l2;
            while (j < n) {
                int kk; size_t ll;
                CP(j, kk, ll);
                if (kk != K_LETTER) break;
                j += ll;
            }
        } else if (k == K_PUNCT || (s[i] == ' ' && k2 == K_PUNCT)) { /* ` ?[\p{P}\p{S}]+[\r\n]*` */
            if (k != K_PUNCT) j += l2;
            while (j < n) {
                int kk; size_t ll;
                CP(j, kk, ll);
                if (kk != K_PUNCT) break;
                j += ll;
            }
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        } else { /* whitespace */
            size_t e = i;
            size_t last_nl = 0;
            int has_nl = 0;
            while (e < n) {
                int kk; size_t ll;
                CP(e, kk, ll);
                if (kk != K_SPACE && kk != K_NEWLINE) break;
                if (kk == K_NEWLINE) has_nl = 1, last_nl = e + ll;
                e += ll;
            }
            if (has_nl)
                j = last_nl; /* \s*[\r\n]+ */
            else if (e == n || e - i == 1)
                j = e; /* \s+(?!\S) at the end, or a single \s+ */
            else
                j = e - 1; /* \s+(?!\S): leave one space for the next piece */
        }
        out[np].p = s + i;
        out[np].n = j - i;
        np++;
        i = j;
    }
#undef CP
    return np;
}

/* ---- GPT-2 byte-to-unicode ------------------------------------------------------------ */

static void byte_map(uint32_t map[256]) {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
            map[b] = b;
        else
            map[b] = 256 + extra++;
    }
}

static size_t utf8_put(uint32_t c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    o[0] = (char)(0xE0 | (c >> 12));
    o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (char)(0x80 | (c & 0x3F));
    return 3;
}

static char *spell(const uint32_t map[256], const uint8_t *b, size_t n) {
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += utf8_put(map[b[i]], s + o);
    s[o] = '\0';
    return s;
}

/* ---- BPE ------------------------------------------------------------------------------ */

typedef struct word {
    const uint8_t *p;
    size_t n;
    uint32_t count;
    int32_t *sym;
    size_t n_sym;
} word;

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, m);
    if (c) return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

#define HBITS 17
#define HSIZE (1u << HBITS)

static const char *const k_special_text[MK_N_SPECIAL] = {
    "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence" "\xEF\xBD\x9C>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence" "\xEF\xBD\x9C>",
    "<\xEF\xBD\x9C\xE2\x96\x81pad\xE2\x96\x81\xEF\xBD\x9C>",
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>",
    "<\xEF\xBD\x9C" "Assistant" "\xEF\xBD\x9C>",
    "<think>",
    "</think>",
};

int mk_vocab_build(uint32_t n_vocab, mk_vocab *v) {
    memset(v, 0, sizeof *v);
    if (n_vocab < 256 + MK_N_SPECIAL) return -1;
    const uint32_t n_learn = n_vocab - MK_N_SPECIAL;
    uint32_t map[256];
    byte_map(map);

    const uint8_t *text = (const uint8_t *)mk_corpus;
    size_t n = mk_corpus_len;
    piece *pcs = malloc(sizeof *pcs * (n + 1));
    size_t np = presplit(text, n, pcs);
    qsort(pcs, np, sizeof *pcs, cmp_piece);
    word *w = calloc(np, sizeof *w);
    size_t nw = 0;
    for (size_t i = 0; i < np; i++) {
        if (nw && cmp_piece(&pcs[i], &(piece){w[nw - 1].p, w[nw - 1].n}) == 0) {
            w[nw - 1].count++;
            continue;
        }
        w[nw].p = pcs[i].p;
        w[nw].n = pcs[i].n;
        w[nw].count = 1;
        w[nw].sym = malloc(sizeof(int32_t) * pcs[i].n);
        for (size_t k = 0; k < pcs[i].n; k++) w[nw].sym[k] = pcs[i].p[k];
        w[nw].n_sym = pcs[i].n;
        nw++;
    }
    free(pcs);

    v->n = n_vocab;
    v->text = calloc(n_vocab, sizeof *v->text);
    v->bytes = calloc(n_vocab, sizeof *v->bytes);
    v->n_bytes = calloc(n_vocab, sizeof *v->n_bytes);
    v->type = calloc(n_vocab, sizeof *v->type);
    v->merges = calloc(n_vocab, sizeof *v->merges);
    for (uint32_t b = 0; b < 256; b++) {
        v->bytes[b] = malloc(1);
        v->bytes[b][0] = (uint8_t)b;
        v->n_bytes[b] = 1;
    }
    uint64_t *hkey = malloc(sizeof *hkey * HSIZE);
    uint64_t *hcnt = malloc(sizeof *hcnt * HSIZE);
    uint64_t *forbidden = NULL;
    size_t n_forbidden = 0;
    uint32_t nt = 256;
    int rc = 0;
    while (nt < n_learn) {
        memset(hkey, 0xFF, sizeof *hkey * HSIZE);
        memset(hcnt, 0, sizeof *hcnt * HSIZE);
        for (size_t i = 0; i < nw; i++)
            for (size_t k = 0; k + 1 < w[i].n_sym; k++) {
                uint64_t key = ((uint64_t)(uint32_t)w[i].sym[k] << 32) | (uint32_t)w[i].sym[k + 1];
                uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> (64 - HBITS);
                while (hkey[h] != UINT64_MAX && hkey[h] != key) h = (h + 1) & (HSIZE - 1);
                hkey[h] = key;
                hcnt[h] += w[i].count;
            }
        uint64_t best = UINT64_MAX, best_cnt = 0;
        for (uint32_t h = 0; h < HSIZE; h++) {
            if (hkey[h] == UINT64_MAX) continue;
            int forb = 0;
            for (size_t f = 0; f < n_forbidden; f++)
                if (forbidden[f] == hkey[h]) forb = 1;
            if (forb) continue;
            if (hcnt[h] > best_cnt || (hcnt[h] == best_cnt && hkey[h] < best)) {
                best = hkey[h];
                best_cnt = hcnt[h];
            }
        }
        if (best_cnt == 0) {
            rc = -2; /* corpus too small for this vocabulary */
            break;
        }
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xFFFFFFFFu);
        size_t nb = v->n_bytes[a] + v->n_bytes[b];
        uint8_t *nbuf = malloc(nb);
        memcpy(nbuf, v->bytes[a], v->n_bytes[a]);
        memcpy(nbuf + v->n_bytes[a], v->bytes[b], v->n_bytes[b]);
        int dup = 0;
        for (uint32_t t = 0; t < nt && !dup; t++)
            if (v->n_bytes[t] == nb && memcmp(v->bytes[t], nbuf, nb) == 0) dup = 1;
        if (dup) {
            /* another merge order already made these bytes: keep tokens unique */
            free(nbuf);
            forbidden = realloc(forbidden, sizeof *forbidden * (n_forbidden + 1));
            forbidden[n_forbidden++] = best;
            continue;
        }
        v->bytes[nt] = nbuf;
        v->n_bytes[nt] = nb;
        char *sa = spell(map, v->bytes[a], v->n_bytes[a]);
        char *sb = spell(map, v->bytes[b], v->n_bytes[b]);
        size_t la = strlen(sa), lb = strlen(sb);
        char *m = malloc(la + lb + 2);
        memcpy(m, sa, la);
        m[la] = ' ';
        memcpy(m + la + 1, sb, lb + 1);
        free(sa);
        free(sb);
        v->merges[v->n_merges++] = m;
        for (size_t i = 0; i < nw; i++) {
            size_t o = 0;
            for (size_t k = 0; k < w[i].n_sym; k++) {
                if (k + 1 < w[i].n_sym && w[i].sym[k] == a && w[i].sym[k + 1] == b) {
                    w[i].sym[o++] = (int32_t)nt;
                    k++;
                } else {
                    w[i].sym[o++] = w[i].sym[k];
                }
            }
            w[i].n_sym = o;
        }
        nt++;
    }
    free(hkey);
    free(hcnt);
    free(forbidden);
    for (size_t i = 0; i < nw; i++) free(w[i].sym);
    free(w);
    if (rc != 0) {
        v->n = nt;
        mk_vocab_free(v);
        return rc;
    }
    for (uint32_t t = 0; t < n_learn; t++) {
        v->text[t] = spell(map, v->bytes[t], v->n_bytes[t]);
        v->type[t] = 1;
    }
    for (uint32_t s = 0; s < MK_N_SPECIAL; s++) {
        uint32_t id = n_learn + s;
        size_t l = strlen(k_special_text[s]);
        v->text[id] = malloc(l + 1);
        memcpy(v->text[id], k_special_text[s], l + 1);
        v->bytes[id] = malloc(l);
        memcpy(v->bytes[id], k_special_text[s], l);
        v->n_bytes[id] = l;
        v->type[id] = 3;
        v->special[s] = (int32_t)id;
    }
    return 0;
}

void mk_vocab_free(mk_vocab *v) {
    for (uint32_t t = 0; t < v->n; t++) {
        if (v->text) free(v->text[t]);
        if (v->bytes) free(v->bytes[t]);
    }
    for (uint32_t m = 0; m < v->n_merges; m++) free(v->merges[m]);
    free(v->text);
    free(v->bytes);
    free(v->n_bytes);
    free(v->type);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

static int valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t l;
        uint32_t c = utf8_next(s + i, n - i, &l);
        if (c == 0xFFFD && !(l == 3 && s[i] == 0xEF)) return 0;
        i += l;
    }
    return 1;
}

int32_t *mk_token_map(const mk_vocab *v, uint32_t *n_compressed) {
    int32_t *map = malloc(sizeof *map * v->n);
    char **keys = calloc(v->n, sizeof *keys);
    uint32_t nk = 0;
    for (uint32_t t = 0; t < v->n; t++) {
        const uint8_t *b = v->bytes[t];
        size_t n = v->n_bytes[t];
        char *key = malloc(n + strlen(v->text[t]) + 3);
        size_t o = 0;
        if (v->type[t] == 3 || !valid_utf8(b, n)) {
            /* special tokens and partial characters keep their raw spelling (§4.6 uses the
             * token string when the decoded text has U+FFFD) */
            key[o++] = '\x01';
            memcpy(key + o, v->text[t], strlen(v->text[t]));
            o += strlen(v->text[t]);
        } else {
            /* NFKC/NFD/StripAccents are identity-ish here; Lowercase (ASCII), collapse
             * [ \t\r\n]+ to one space, keep a lone " ", else strip */
            int in_ws = 0;
            for (size_t i = 0; i < n; i++) {
                uint8_t c = b[i];
                if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
                    if (!in_ws) key[o++] = ' ';
                    in_ws = 1;
                    continue;
                }
                in_ws = 0;
                key[o++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            }
            if (!(o == 1 && key[0] == ' ')) {
                size_t s0 = 0, e = o;
                while (s0 < e && key[s0] == ' ') s0++;
                while (e > s0 && key[e - 1] == ' ') e--;
                if (e > s0) {
                    memmove(key, key + s0, e - s0);
                    o = e - s0;
                } else {
                    memcpy(key, b, n);
                    o = n;
                }
            }
        }
        key[o] = '\0';
        int32_t id = -1;
        for (uint32_t k = 0; k < nk && id < 0; k++)
            if (strcmp(keys[k], key) == 0) id = (int32_t)k;
        if (id < 0) {
            keys[nk] = key;
            id = (int32_t)nk++;
        } else {
            free(key);
        }
        map[t] = id;
    }
    for (uint32_t k = 0; k < nk; k++) free(keys[k]);
    free(keys);
    *n_compressed = nk;
    return map;
}
