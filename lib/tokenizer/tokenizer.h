/*
 * Byte-level BPE tokenizer of DeepSeek V4 / V4.1 (model-spec.md §6), built from the GGUF
 * vocabulary (docs/model-files.md §2.6). docs/tokenizer.md describes the algorithm.
 *
 * Ownership: the model loader calls dsii_tokenizer_load() once with the open GGUF reader
 * and keeps the result in the model (freed with dsii_tokenizer_free). The tokenizer copies
 * everything it needs, so the dsii_gguf may be closed afterwards. A loaded tokenizer is
 * immutable: every const function here is [thread-safe].
 */
#ifndef DSI_TOKENIZER_TOKENIZER_H
#define DSI_TOKENIZER_TOKENIZER_H

#include "base/base.h"
#include "gguf/gguf.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dsii_tokenizer dsii_tokenizer;

/* Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,*_token_id} from `g`.
 * Status: BAD_FORMAT (message names the key / entry and the value: missing tokens or
 * merges, model != "gpt2", a merge that is not "a b" or names an unknown token, a token
 * spelling that is not in the GPT-2 byte alphabet, a *_token_id out of range, …),
 * UNSUPPORTED (a pre-tokenizer other than "joyai-llm" / absent / "deepseek-v3" family,
 * see docs/tokenizer.md), OUT_OF_HOST_MEMORY. `ctx` may be NULL (C allocator). On failure
 * *out is NULL. */
dsi_status dsii_tokenizer_load(const dsi_context *ctx, const dsii_gguf *g,
                               dsii_tokenizer **out, dsii_error *err);

/* NULL accepted. */
void dsii_tokenizer_free(dsii_tokenizer *tok);

/* Number of tokens in the vocabulary. */
int32_t dsii_tokenizer_n_vocab(const dsii_tokenizer *tok);

/* Tokenizes `len` bytes (any bytes). flags: DSI_TOKENIZE_*. Two-call pattern exactly as
 * dsi_tokenize: *n_needed always set on OK / too-small; INVALID_ARGUMENT when cap is too
 * small (nothing written); OUT_OF_HOST_MEMORY. */
dsi_status dsii_tokenize(const dsii_tokenizer *tok, const char *text, size_t len,
                         uint32_t flags, dsi_token *tokens, size_t cap, size_t *n_needed,
                         dsii_error *err);

/* Like dsii_tokenize with DSI_TOKENIZE_PARSE_SPECIAL, but a special token's text is matched
 * only where `special_ok` (one byte per text byte; nonzero = allowed) allows every byte of
 * it; everything else is plain text. Chat templating (dsi_chat_tokenize) marks only the
 * template's own bytes, so message content never becomes a special token. `flags` may add
 * DSI_TOKENIZE_ADD_BOS. */
dsi_status dsii_tokenize_masked(const dsii_tokenizer *tok, const char *text, size_t len,
                                const uint8_t *special_ok, uint32_t flags, dsi_token *tokens,
                                size_t cap, size_t *n_needed, dsii_error *err);

/* Raw bytes of token `id` (NULL if out of range); *len receives the byte count. The
 * pointer is owned by the tokenizer. Special (control) tokens decode to their text. */
const uint8_t *dsii_tokenizer_token_bytes(const dsii_tokenizer *tok, dsi_token id,
                                          size_t *len);

/* Id of a special token (DSI_SPECIAL_*), or -1 if the vocabulary lacks it. */
dsi_token dsii_tokenizer_special(const dsii_tokenizer *tok, int32_t which);

/* 1 if `id` is a control / user-defined (special) token, else 0. */
int dsii_tokenizer_is_special(const dsii_tokenizer *tok, dsi_token id);

/* Runs only the pre-tokenizer (no vocabulary needed) and reports each piece as a byte range
 * of `text`, in order (tests and docs/tokenizer.md examples). Silently stops on OOM. */
void dsii_pretokenize(const char *text, size_t len,
                      void (*fn)(void *user, size_t off, size_t len), void *user);

/* ---- building from arrays (the GGUF loader and tests use this) ------------------------ */

typedef struct dsii_tokenizer_desc {
    size_t n_tokens;
    const char *const *tokens;     /* GPT-2 byte-to-unicode spellings (UTF-8) */
    const size_t *token_lens;      /* may be NULL: NUL-terminated */
    const int32_t *token_types;    /* may be NULL (all normal); 1 normal, 3 control, 4 user */
    size_t n_merges;
    const char *const *merges;     /* "a b" in rank order */
    const size_t *merge_lens;      /* may be NULL */
    int64_t bos_id, eos_id, pad_id; /* -1: find by text (model-spec §6) */
} dsii_tokenizer_desc;

/* Builds a tokenizer (everything copied). Errors as dsii_tokenizer_load. */
dsi_status dsii_tokenizer_create(const dsi_context *ctx, const dsii_tokenizer_desc *d,
                                 dsii_tokenizer **out, dsii_error *err);

/* ---- incremental UTF-8 (detokenizer and generation callbacks) -------------------------- */

/* Holds back the bytes of an unfinished UTF-8 character between pushes. */
typedef struct dsii_utf8_stream {
    uint8_t pending[4];
    uint32_t n_pending;
} dsii_utf8_stream;

/* Appends `n` bytes to the stream and writes the text that became complete to `out`
 * (capacity must be >= dsii_utf8_stream_bound(s, n)); invalid sequences become U+FFFD (one
 * per maximal invalid subpart). `*next` receives the state after the push; `s` itself is
 * not modified, so a caller can drop the result. Returns the bytes written. */
size_t dsii_utf8_stream_bound(const dsii_utf8_stream *s, size_t n);
size_t dsii_utf8_stream_push(const dsii_utf8_stream *s, const uint8_t *bytes, size_t n,
                             uint8_t *out, dsii_utf8_stream *next);
/* Emits held-back bytes as one U+FFFD (0 or 3 bytes into out[>= 3]) and clears `s`. */
size_t dsii_utf8_stream_flush(dsii_utf8_stream *s, uint8_t *out);

#endif /* DSI_TOKENIZER_TOKENIZER_H */
