/*
 * DeepSeek V4 chat encoding (model-spec.md §6; docs/tokenizer.md "Chat rendering").
 * Pure text: independent of the vocabulary, so tests call it without a model.
 */
#ifndef DSI_TOKENIZER_CHAT_H
#define DSI_TOKENIZER_CHAT_H

#include "base/base.h"

/* The fixed "Think Max" instruction (antirez/ds4 ds4.c DS4_REASONING_EFFORT_MAX_PREFIX,
 * identical to REASONING_EFFORT_MAX of the official encoding_dsv4.py). */
extern const char dsii_chat_think_max_prefix[];

/* The defaults of dsi_chat_message (dsi_chat_message_init calls this). NULL: no-op. */
void dsii_chat_message_defaults(dsi_chat_message *msg);

/* Renders `n` messages (each read honouring its struct_size) with options `opt` (already
 * validated, full layout). On success *out is a NUL-terminated string from dsii_malloc(ctx)
 * and *len its length. INVALID_ARGUMENT (message names the index and field) for a NULL
 * message, a bad struct_size or an unknown role. */
dsi_status dsii_chat_render(const dsi_context *ctx, const dsi_chat_message *const *messages,
                            size_t n, const dsi_chat_options *opt, char **out, size_t *len,
                            dsii_error *err);

/* Same, and *template_mask (from dsii_malloc(ctx), *len bytes; free with dsii_free) marks
 * the bytes the template wrote (1) apart from those copied from a message's content or
 * reasoning (0): special tokens may be parsed only in the former (dsii_tokenize_masked). */
dsi_status dsii_chat_render_masked(const dsi_context *ctx,
                                   const dsi_chat_message *const *messages, size_t n,
                                   const dsi_chat_options *opt, char **out, size_t *len,
                                   uint8_t **template_mask, dsii_error *err);

#endif
