/*
 * lib/spec — speculative decoding inside the library (model-spec §3.7, §4.5; docs/spec.md).
 *
 * Drafting: the architecture's draft block(s) run on the session's own lane right after the
 * verified tokens (arch.h dsii_arch.draft): V4.1 DSpark — three stages over the 5-token block
 * [next, noise × 4] attending their own window rings (seeded by every target step from the
 * mean HC inputs of the target layers, inside the recorded step) plus the whole block
 * (non-causal), the shared head, then here on the host the rank-r Markov bigram bias applied
 * sequentially with the greedy draft of the previous slot and the confidence head; V4 MTP —
 * one block pairing the target's final HC state of position q with the embedding of token
 * q+1 (one draft).
 *
 * Verification and acceptance (lib/api/generate.c): the target evaluates [next, drafts…] in
 * ONE step with the logits of every row; draft i is accepted with probability
 * min(1, p_i(d_i) / q_i(d_i)) where p_i is the sampler's distribution at that row (penalties,
 * bias, temperature, top-k/p, min-p applied with the history of the tokens accepted so far)
 * and q_i the drafter's proposal distribution — drafts are the drafter's greedy picks, so q_i
 * is one-hot and the rule is "accept with probability p_i(d_i)"; on the first rejection the
 * next token is drawn from the normalised residual max(0, p_i − q_i) (p_i without d_i);
 * when all are accepted the next call samples the bonus token from the last row. At
 * temperature 0 p_i is one-hot, so a draft is accepted iff it is the target's argmax and
 * the output is identical to decoding without speculation. The session then rewinds to the
 * accepted prefix: every piece of state is position-addressed (lib/kv), so this only moves
 * the frontier — window rings, compressor rows, compressed rows, index keys, draft rings —
 * and the Engram history is the timeline itself.
 */
#ifndef DSI_SPEC_H
#define DSI_SPEC_H

#include "arch/arch.h"
#include "base/base.h"

#include <stdint.h>

typedef struct dsii_spec dsii_spec;

/* Session-level settings (dsi_session_options, experimental fields). */
enum { DSII_SPEC_OFF = 0, DSII_SPEC_ON = 1, DSII_SPEC_AUTO = 2 };

/* Drafting state for a session of `model` (whose exec has a draft-capable architecture).
 * UNSUPPORTED (with a message) when the model has no usable draft blocks. */
dsi_status dsii_spec_create(dsi_model *model, dsii_spec **out, dsii_error *e);
void dsii_spec_free(dsii_spec *sp);

/* Drafts per call of the model's block (DSpark: block size, MTP: 1). */
uint32_t dsii_spec_block(const dsii_spec *sp);

/* The session's timeline was truncated to `keep` tokens (rewind, failure, reset). */
void dsii_spec_rewound(dsii_spec *sp, uint32_t keep);

/* Proposes up to `kmax` drafts after tokens[0 .. n_tokens) + `next` (the lane must be the
 * session's DSII_LANE_TAPS lane and every timeline token evaluated on it). conf_min > 0 stops
 * the proposal at the first slot whose confidence (sigmoid of the DSpark confidence head) is
 * below it. ids: kmax entries; logits (may be NULL): kmax × n_vocab, the draft distribution's
 * logits (Markov bias included) of each proposed slot; conf (may be NULL): kmax floats
 * (MTP: 1). *k receives the number of drafts (0 .. kmax). */
dsi_status dsii_spec_propose(dsii_spec *sp, dsii_lane *lane, dsii_kv_pool *pool, uint32_t slot,
                             const dsi_token *tokens, uint32_t n_tokens, dsi_token next,
                             uint32_t kmax, float conf_min, dsi_token *ids, float *logits,
                             float *conf, uint32_t *k, dsii_error *e);

/* Test hook: after the drafter ran, `fn` may replace the proposal (ids[0 .. *k), at most
 * kmax) — tests force long accepted runs, rejections at chosen depths, end tokens inside an
 * accepted run. NULL removes it. */
typedef void (*dsii_spec_oracle_fn)(void *user, const dsi_token *tokens, uint32_t n_tokens,
                                    dsi_token next, dsi_token *ids, uint32_t *k, uint32_t kmax);
void dsii_spec_set_oracle(dsii_spec *sp, dsii_spec_oracle_fn fn, void *user);

#endif /* DSI_SPEC_H */
