/* dsinfer-mkmodel internals: built-in corpus, BPE vocabulary learner, Engram token map. */
#ifndef DSI_MKMODEL_H
#define DSI_MKMODEL_H

#include <stddef.h>
#include <stdint.h>

extern const char mk_corpus[];
extern const unsigned long mk_corpus_len;

/* Special tokens (model-spec §6), in the order they are appended after the learned tokens. */
enum { MK_SP_BOS, MK_SP_EOS, MK_SP_PAD, MK_SP_USER, MK_SP_ASSISTANT, MK_SP_THINK,
       MK_SP_THINK_END, MK_N_SPECIAL };

typedef struct mk_vocab {
    uint32_t n;            /* tokens */
    char **text;           /* token strings as stored in GGUF (GPT-2 byte-to-unicode spelling;
                              special tokens verbatim), NUL-terminated */
    uint8_t **bytes;       /* raw bytes of each token */
    size_t *n_bytes;
    int32_t *type;         /* 1 normal, 3 control */
    char **merges;         /* "a b" in rank order */
    uint32_t n_merges;
    int32_t special[MK_N_SPECIAL];
} mk_vocab;

/* Learns a byte-level BPE vocabulary of exactly n_vocab tokens (256 bytes + merges +
 * MK_N_SPECIAL specials) from mk_corpus. Deterministic. Returns 0 on success. */
int mk_vocab_build(uint32_t n_vocab, mk_vocab *v);
void mk_vocab_free(mk_vocab *v);

/* Engram compressed-token map (model-spec §4.6, ASCII approximation of the normalizer):
 * returns n entries, *n_compressed receives the number of distinct keys. */
int32_t *mk_token_map(const mk_vocab *v, uint32_t *n_compressed);

/* --import: writes a GGUF from a weights dump (import.c, tools/train/export.py); also may be
 * NULL. Returns 0 on success. */
int mk_import(const char *dump, const char *out, const char *also);

#endif
