/*
 * lib/moe — the mixture-of-experts FFN of a block (model-spec §3.5, §4.4), issued as backend
 * ops: router logits → sqrt-softplus scores → selection (hash via tid2eid, or top-k with the
 * selection bias) → normalised weights × route scale (device index/weight buffers) →
 * grouped routed experts with the SwiGLU clamp (router weight before the down projection)
 * → plus the shared expert.
 */
#ifndef DSI_MOE_H
#define DSI_MOE_H

#include "backend/device.h"
#include "backends/backend.h"
#include "base/base.h"

#include <stdatomic.h>

typedef struct dsii_moe_weights {
    dsib_weight gate_inp;        /* router [D → E] */
    dsib_weight bias;            /* selection bias [E] (buf NULL: none) */
    dsib_weight tid2eid;         /* hash routing [V][k] I32 (buf NULL: score routing) */
    dsib_weight w1, w3, w2;      /* routed experts gate / up / down */
    dsib_weight sh_gate, sh_up, sh_down; /* shared expert (sh_gate.buf NULL: none) */
    uint32_t n_expert, k;
    float limit, limit_shared;   /* SwiGLU clamps (0: none) */
    float route_scale;           /* 1.5 */
    float norm_add;              /* V4: 0, V4.1: 1e-20 */
    /* Memory tiers (lib/place): the routed experts of this layer are served by the expert
     * tier (w1 / w3 / w2 carry their geometry only, buf NULL); NULL: resident. */
    struct dsii_xtier *xt;
    int32_t xt_layer;            /* backbone layer index in the tier */
    /* The layer's row of the model's routing counts (dsi_model_expert_counts; n_expert
     * entries), NULL: not counted (draft blocks). Bumped here on the CPU device, by the tier
     * where it brings the ids to the host. */
    _Atomic uint64_t *counts;
} dsii_moe_weights;

/* counts[ids[i]] += 1 for the `nk` routing ids (ids outside [0, E) skipped). */
void dsii_moe_count(_Atomic uint64_t *counts, uint32_t E, const int32_t *ids, uint64_t nk);

/* Scratch views, each sized for n rows: logits [n][E], sel int32 [n][k], wts [n][k],
 * routed [n][D], sh_g / sh_u [n][F_shared], sh_out [n][D]. */
typedef struct dsii_moe_scratch {
    dsib_view logits, sel, wts, routed, sh_g, sh_u, sh_out;
    const atomic_int *cancel;    /* the step's cancel request (expert-tier reads), or NULL */
} dsii_moe_scratch;

/* out[t] = routed(x[t]) + shared(x[t]); x is the ffn-normed input [n][D] (ldx); ids: the
 * step's token ids (int32 [n], for hash routing). out may not alias x. Recorded on stream
 * `strm` of device `dev`. */
dsi_status dsii_moe_forward(const dsii_device *dev, dsib_stream *strm, const dsii_moe_weights *w,
                            const dsii_moe_scratch *s, dsib_view x, uint32_t ldx, dsib_view ids,
                            uint32_t n, uint32_t D, dsib_view out, uint32_t ldo, dsii_error *e);

#endif /* DSI_MOE_H */
