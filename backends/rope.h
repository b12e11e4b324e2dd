/*
 * backends/rope.h — the §3.9 RoPE / YaRN frequencies in double precision, shared by every
 * backend (the CPU forms p·f in double and rounds cos / sin to f32; the Vulkan module builds
 * its per-instance tables from the same frequencies), so all of them rotate by the same
 * angles. Header-only, like backends/types.h.
 */
#ifndef DSIB_ROPE_H
#define DSIB_ROPE_H

#include "backends/backend.h"

#include <math.h>

/* f[i] for i < n_rot / 2: base^(−2i/n_rot), blended with f / yarn_factor over the YaRN ramp
 * between the beta_fast and beta_slow dimensions when yarn_factor > 1. */
static inline void dsib_rope_freqs(const dsib_rope *r, double *f) {
    int32_t half = r->n_rot / 2;
    for (int32_t i = 0; i < half; i++) f[i] = pow((double)r->freq_base, -2.0 * i / r->n_rot);
    if (r->yarn_factor > 1.0f) {
        const double two_pi = 6.283185307179586476925286766559;
        double lnb = 2.0 * log((double)r->freq_base);
        double cf = r->n_rot * log(r->yarn_orig_ctx / (r->yarn_beta_fast * two_pi)) / lnb;
        double cs = r->n_rot * log(r->yarn_orig_ctx / (r->yarn_beta_slow * two_pi)) / lnb;
        double low = floor(cf), high = ceil(cs);
        if (low < 0) low = 0;
        if (high > r->n_rot - 1) high = r->n_rot - 1;
        if (high == low) high += 0.001;
        for (int32_t i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            f[i] = f[i] / r->yarn_factor * ramp + f[i] * (1.0 - ramp);
        }
    }
}

#endif
