/*
 * NumPy's default_rng(seed).integers(0, bound, size=n, dtype=int64) for a non-negative
 * integer seed, reproduced exactly: SeedSequence (pool of 4 uint32, hashmix / mix),
 * PCG64 (128-bit LCG, XSL-RR output) seeded from generate_state(4, uint64), and Lemire's
 * bounded integers (numpy's Generator default) for ranges above 2^32. DeepSeek's engram.py
 * draws the Engram hash multipliers this way (model-spec §4.6); tests compare with NumPy.
 * Only the behaviour of the algorithm is reproduced here, from its published definition.
 */
#include "npy_rng.h"

#include <string.h>

typedef unsigned __int128 u128;

#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u
#define XSHIFT 16

static uint32_t hashmix(uint32_t v, uint32_t *hc) {
    v ^= *hc;
    *hc *= MULT_A;
    v *= *hc;
    v ^= v >> XSHIFT;
    return v;
}

static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = MIX_MULT_L * x - MIX_MULT_R * y;
    return r ^ (r >> XSHIFT);
}

typedef struct pcg64 {
    u128 state, inc;
} pcg64;

static const u128 PCG_MULT = ((u128)2549297995355413924ull << 64) | 4865540595714422341ull;

static void pcg_step(pcg64 *r) { r->state = r->state * PCG_MULT + r->inc; }

static uint64_t pcg_next(pcg64 *r) {
    pcg_step(r);
    uint64_t x = (uint64_t)(r->state >> 64) ^ (uint64_t)r->state;
    unsigned rot = (unsigned)(r->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

static void seed_pcg(pcg64 *r, uint64_t seed) {
    /* SeedSequence(seed): the integer as little-endian uint32 words (at least one) */
    uint32_t ent[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const int n_ent = ent[1] ? 2 : 1;
    uint32_t pool[4];
    uint32_t hc = INIT_A;
    for (int i = 0; i < 4; i++) pool[i] = hashmix(i < n_ent ? ent[i] : 0, &hc);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], &hc));
    /* generate_state(4, uint64): 8 uint32 words cycling over the pool */
    uint32_t w[8];
    uint32_t hb = INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4];
        v ^= hb;
        hb *= MULT_B;
        v *= hb;
        v ^= v >> XSHIFT;
        w[i] = v;
    }
    uint64_t v64[4];
    for (int i = 0; i < 4; i++) v64[i] = (uint64_t)w[2 * i] | (uint64_t)w[2 * i + 1] << 32;
    /* pcg64_set_seed: state = (v64[0] << 64) | v64[1], inc = (v64[2] << 64) | v64[3] */
    const u128 init_state = ((u128)v64[0] << 64) | v64[1];
    const u128 init_seq = ((u128)v64[2] << 64) | v64[3];
    r->state = 0;
    r->inc = (init_seq << 1) | 1;
    pcg_step(r);
    r->state += init_state;
    pcg_step(r);
}

int npy_rng_integers(uint64_t seed, uint64_t bound, uint64_t n, int64_t *out) {
    if (bound <= (1ull << 32) || bound > (1ull << 63)) return -1; /* only the 64-bit Lemire path */
    pcg64 r;
    seed_pcg(&r, seed);
    const uint64_t rng = bound - 1, excl = bound;
    for (uint64_t i = 0; i < n; i++) {
        u128 m = (u128)pcg_next(&r) * excl;
        uint64_t left = (uint64_t)m;
        if (left < excl) {
            const uint64_t threshold = (UINT64_MAX - rng) % excl;
            while (left < threshold) {
                m = (u128)pcg_next(&r) * excl;
                left = (uint64_t)m;
            }
        }
        out[i] = (int64_t)(m >> 64);
    }
    return 0;
}
