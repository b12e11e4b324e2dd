/* tokenizer.json (Hugging Face tokenizers, byte-level BPE) -> GGUF tokenizer keys (convert.h). */
#define _POSIX_C_SOURCE 200809L
#include "convert.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

void hf_vocab_free(hf_vocab *v) {
    for (uint32_t i = 0; v->text && i < v->n; i++) free(v->text[i]);
    for (uint32_t i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->literal);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

static int set_token(hf_vocab *v, int64_t id, const char *s, size_t n, int type, int literal, const char *path,
                     char *err, size_t cap) {
    if (id < 0 || (uint64_t)id >= v->n)
        return fail(err, cap, "%s: token id %lld outside the vocabulary of %u", path, (long long)id, v->n);
    if (v->text[id]) {
        /* an added token may repeat its own vocab entry (DeepSeek's tokenizer lists the
         * specials in both): then it only sets the type; two different strings is an error */
        if (v->len[id] != n || memcmp(v->text[id], s, n) != 0)
            return fail(err, cap, "%s: token id %lld is given twice ('%.40s' and '%.40s')", path, (long long)id,
                        v->text[id], s);
        v->type[id] = type;
        v->literal[id] = (uint8_t)literal;
        return 0;
    }
    v->text[id] = malloc(n + 1);
    if (!v->text[id]) return fail(err, cap, "out of memory");
    memcpy(v->text[id], s, n);
    v->text[id][n] = '\0';
    v->len[id] = n;
    v->type[id] = type;
    v->literal[id] = (uint8_t)literal;
    return 0;
}

int hf_tokenizer_load(const char *path, uint32_t n_vocab, hf_vocab *v, char *err, size_t cap) {
    memset(v, 0, sizeof *v);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fail(err, cap, "%s: not valid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
    int rc = 0;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || !mtype || strcmp(mtype, "BPE") != 0 || !json_is_object(vocab) ||
        !json_is_array(merges))
        rc = fail(err, cap, "%s: expected a BPE model with \"vocab\" and \"merges\"", path);
    json_t *added = json_object_get(root, "added_tokens");
    if (!rc && added && !json_is_array(added)) rc = fail(err, cap, "%s: \"added_tokens\" is not an array", path);
    /* the vocabulary spans the largest id of either list (the config may ask for more rows) */
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    if (!rc) json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val)) {
            rc = fail(err, cap, "%s: vocab entry '%.40s' has no integer id", path, key);
            break;
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t i;
    json_t *t;
    if (!rc && added) json_array_foreach(added, i, t) {
        json_t *id = json_object_get(t, "id");
        if (!json_is_integer(id) || !json_is_string(json_object_get(t, "content"))) {
            rc = fail(err, cap, "%s: added_tokens[%zu] needs \"id\" and \"content\"", path, i);
            break;
        }
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (!rc && (max_id < 0 || max_id >= (int64_t)(1 << 24)))
        rc = fail(err, cap, "%s: no usable vocabulary (largest id %lld)", path, (long long)max_id);
    if (!rc && n_vocab && (uint64_t)max_id >= n_vocab)
        rc = fail(err, cap, "%s: token id %lld does not fit config.json's vocab_size %u", path, (long long)max_id, n_vocab);
    if (!rc) {
        v->n = n_vocab ? n_vocab : (uint32_t)max_id + 1;
        v->text = calloc(v->n, sizeof *v->text);
        v->len = calloc(v->n, sizeof *v->len);
        v->type = calloc(v->n, sizeof *v->type);
        v->literal = calloc(v->n, sizeof *v->literal);
        if (!v->text || !v->len || !v->type || !v->literal) rc = fail(err, cap, "out of memory");
    }
    if (!rc) json_object_foreach(vocab, key, val) {
        if ((rc = set_token(v, json_integer_value(val), key, strlen(key), 1, 0, path, err, cap))) break;
    }
    if (!rc && added) json_array_foreach(added, i, t) {
        const char *c = json_string_value(json_object_get(t, "content"));
        const int special = json_is_true(json_object_get(t, "special"));
        /* control (3) for special tokens, user-defined (4) for other added tokens */
        if ((rc = set_token(v, json_integer_value(json_object_get(t, "id")), c, strlen(c), special ? 3 : 4, 1, path,
                            err, cap)))
            break;
    }
    /* ids nobody names (the embedding may be larger than the tokenizer): placeholders, type
     * unused (5), as llama.cpp's converter writes them */
    for (uint32_t k = 0; !rc && k < v->n; k++)
        if (!v->text[k]) {
            char b[32];
            snprintf(b, sizeof b, "[PAD%u]", k);
            rc = set_token(v, k, b, strlen(b), 5, 1, path, err, cap);
        }
    if (!rc) {
        v->n_merges = (uint32_t)json_array_size(merges);
        v->merges = calloc(v->n_merges + 1, sizeof *v->merges);
        if (!v->merges) rc = fail(err, cap, "out of memory");
        json_array_foreach(merges, i, t) {
            if (rc) break;
            /* "a b" (older files) or ["a", "b"] (newer) */
            if (json_is_string(t)) {
                v->merges[i] = strdup(json_string_value(t));
            } else if (json_is_array(t) && json_array_size(t) == 2 && json_is_string(json_array_get(t, 0)) &&
                       json_is_string(json_array_get(t, 1))) {
                const char *a = json_string_value(json_array_get(t, 0)), *b = json_string_value(json_array_get(t, 1));
                size_t n = strlen(a) + strlen(b) + 2;
                v->merges[i] = malloc(n);
                if (v->merges[i]) snprintf(v->merges[i], n, "%s %s", a, b);
            } else {
                rc = fail(err, cap, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
                break;
            }
            if (!v->merges[i]) rc = fail(err, cap, "out of memory");
        }
    }
    json_decref(root);
    if (rc) hf_vocab_free(v);
    return rc;
}

int32_t hf_vocab_find(const hf_vocab *v, const char *text) {
    size_t n = strlen(text);
    for (uint32_t i = 0; i < v->n; i++)
        if (v->len[i] == n && !memcmp(v->text[i], text, n)) return (int32_t)i;
    return -1;
}
