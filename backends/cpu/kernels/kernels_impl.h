/*
 * Internal to backends/cpu/kernels: the per-ISA row kernels behind kernels.h.
 *
 * Each ISA file provides one function that computes rows [o0, o1) of y = W x for up to
 * DSIB_KERN_GROUP tokens given as pointer arrays (xp[t] = token t's x row, yp[t] = token
 * t's y row). Tokens are processed in tiles whose size is private to the ISA; every tile
 * size runs the identical per-token operation sequence (model-spec §10.4).
 */
#ifndef DSIB_CPU_KERNELS_IMPL_H
#define DSIB_CPU_KERNELS_IMPL_H

#include "backends/cpu/kernels/kernels.h"

#include <stdint.h>
#include <string.h>

#define DSIB_KERN_GROUP 64

typedef void (*dsib_rows_ptr_fn)(int32_t type, const uint8_t *w, size_t w_row_bytes,
                                 int64_t n_in, int64_t o0, int64_t o1,
                                 const float *const *xp, float *const *yp, int n);

void dsib_kern_rows_scalar(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                           int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                           int n);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSIB_KERN_X86 1
void dsib_kern_rows_avx2(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                         int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                         int n);
void dsib_kern_rows_avx512(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                           int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                           int n);
#endif

/* ---- shared scalar helpers (exact decoders; no libm) ---------------------------------- */

static inline float dsib_u32_as_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float dsib_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        /* zero / subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * dsib_u32_as_f32(0x33800000u); /* 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return dsib_u32_as_f32(sign | 0x7f800000u | (m << 13));
    return dsib_u32_as_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline float dsib_bf16_to_f32(uint16_t h) { return dsib_u32_as_f32((uint32_t)h << 16); }

/* UE8M0 scale 2^(e-127); e = 0 → 2^-127 (bit pattern 0x00400000, model-spec §2.1). */
static inline float dsib_e8m0_to_f32(uint8_t e) {
    return dsib_u32_as_f32(e == 0 ? 0x00400000u : (uint32_t)e << 23);
}

/* E4M3FN → f32 by placing the 7 magnitude bits at f32 bit 20 and scaling by 2^120: exact
 * for normals and subnormals (the f32 subnormal times 2^120 is exact). NaN codes give
 * ±480 (weights are finite). The SIMD paths use the same construction. */
static inline float dsib_e4m3_to_f32(uint8_t b) {
    float v = dsib_u32_as_f32((uint32_t)(b & 0x7f) << 20) * dsib_u32_as_f32(0x7b800000u);
    return (b & 0x80) ? -v : v;
}

/* E2M1 code → value (model-spec §2.1). */
static const float dsib_e2m1_tab[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* Q4_K 6-bit scale / min of sub-block j (ggml get_scale_min_k4). */
static inline void dsib_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Q4_K: all eight 6-bit scales and mins at once (ggml's utmp unpacking): on return the
 * bytes out[0..8) are the scales of sub-blocks 0..7 and out[8..16) their mins — the same
 * values as dsib_q4k_scale_min. */
static inline void dsib_q4k_unpack_scales(const uint8_t *sc12, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, sc12, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t aux = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = aux;
    u[0] &= 0x3f3f3f3fu;
    memcpy(out, u, 16);
}

#endif /* DSIB_CPU_KERNELS_IMPL_H */
