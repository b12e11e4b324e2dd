/* dsinfer-convert internals (docs/converting.md). */
#ifndef DSI_TOOLS_CONVERT_H
#define DSI_TOOLS_CONVERT_H

#include <stddef.h>
#include <stdint.h>

/* A tokenizer.json vocabulary as GGUF's tokenizer.ggml.* keys want it. */
typedef struct hf_vocab {
    uint32_t n;
    char **text;      /* token strings: byte-level spelling, or the literal added-token text */
    size_t *len;
    int32_t *type;    /* 1 normal, 3 control (special added), 4 user-defined, 5 unused (padding) */
    uint8_t *literal; /* 1: added token (its text is literal, not byte-level) */
    char **merges;    /* "a b" in rank order */
    uint32_t n_merges;
} hf_vocab;

/* Loads `path`; n_vocab = config.json's vocab_size (ids beyond the tokenizer's become
 * placeholder tokens [PADn]); 0 = the tokenizer's own size. 0, or -1 + message. */
int hf_tokenizer_load(const char *path, uint32_t n_vocab, hf_vocab *v, char *err, size_t cap);
void hf_vocab_free(hf_vocab *v);
/* Id of the token whose string is `text`, or -1. */
int32_t hf_vocab_find(const hf_vocab *v, const char *text);

#endif
