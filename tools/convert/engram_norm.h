/*
 * The Engram token map of DeepSeek V4.1 (model-spec §4.6): every token id is mapped to a
 * "compressed" id shared by the tokens whose normalized text is equal. The normalization is
 * DeepSeek's (inference/engram.py, as ds4's gguf-tools/deepseek41_metadata.py runs it):
 * NFKC, NFD, StripAccents (drop General_Category Mn), Lowercase, [ \t\r\n]+ -> " ", a lone
 * " " kept as " ", then Strip. The text of a token is its decoded bytes (byte-level BPE);
 * a token whose bytes are not valid UTF-8 (decoding would produce U+FFFD) keys on its
 * token string instead, and an empty normalization keys on the decoded text.
 */
#ifndef DSI_TOOLS_ENGRAM_NORM_H
#define DSI_TOOLS_ENGRAM_NORM_H

#include <stddef.h>
#include <stdint.h>

typedef struct en_map {
    uint32_t cp, off, n;
} en_map;
typedef struct en_ccc {
    uint32_t cp, ccc;
} en_ccc;

extern const uint32_t k_en_decomp_pool[];
extern const en_map k_en_decomp[];
extern const uint32_t k_en_n_decomp;
extern const uint32_t k_en_lower_pool[];
extern const en_map k_en_lower[];
extern const uint32_t k_en_n_lower;
extern const en_ccc k_en_ccc[];
extern const uint32_t k_en_n_ccc;
extern const uint32_t k_en_mn[][2];
extern const uint32_t k_en_n_mn;

/* Normalizes UTF-8 `s` (valid UTF-8) into a malloc'ed UTF-8 string (*out, *out_len).
 * Returns 0, or -1 on allocation failure. */
int en_normalize(const char *s, size_t len, char **out, size_t *out_len);

/* The compressed map: tokens[i] (token string, GPT-2 byte-level spelling, or the literal
 * text of a special / added token when is_literal[i]) -> map[i]; *n_compressed distinct keys,
 * numbered in order of first appearance. Returns 0, or -1 on allocation failure. */
int en_token_map(const char *const *tokens, const size_t *lens, const uint8_t *is_literal, uint32_t n,
                 int32_t *map, uint32_t *n_compressed);

#endif
