/*
 * Scalar float format conversions: f16 (IEEE binary16), bf16, FP8 E4M3FN, FP4 E2M1 and the
 * UE8M0 scale byte (model-spec §2.1). Decoders are exact. Encoders round to nearest, ties to
 * even (RNE), handle subnormals, and do not depend on the FPU rounding mode.
 *
 * Saturation (documented per function): the f16 / bf16 encoders follow IEEE (overflow →
 * ±inf, NaN stays NaN). The e4m3 / e2m1 encoders SATURATE to the largest finite value
 * (±448 / ±6) — OCP "satfinite" — because every caller clamps first (model-spec §10.1) and a
 * weight converter must never produce NaN from a finite input; NaN input gives the NaN
 * encoding for e4m3 (0x7F, sign kept) and +0 for e2m1 (which has no NaN).
 */
#ifndef DSI_QUANT_FP_H
#define DSI_QUANT_FP_H

#include <stdint.h>
#include <string.h>

static inline float dsii_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint32_t dsii_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- f16 ------------------------------------------------------------------------------ */
float dsii_f16_to_f32(uint16_t h);           /* exact, incl. subnormals, inf, NaN */
uint16_t dsii_f32_to_f16(float f);           /* RNE; overflow → inf; NaN → quiet NaN */

/* ---- bf16 ----------------------------------------------------------------------------- */
static inline float dsii_bf16_to_f32(uint16_t h) { return dsii_bits_f32((uint32_t)h << 16); }
uint16_t dsii_f32_to_bf16(float f);          /* RNE; NaN → quiet NaN (sign kept) */
/* f32 rounded to the nearest bf16 value (RNE), returned as f32. */
static inline float dsii_bf16_rne(float f);

/* ---- E8M0 (UE8M0 scale byte) ------------------------------------------------------------ */
/* 2^(e-127); e = 0 gives 2^-127 (bit pattern 0x00400000, as ds4's e8m0_to_f32);
 * e = 255 gives NaN (OCP MX). */
float dsii_e8m0_to_f32(uint8_t e);
/* The E8M0 byte of the smallest power of two >= x (x > 0, finite): ceil(log2 x) + 127,
 * clamped to [0, 254]. x <= 0 or NaN → 127 (scale 1). Used for the model-spec §10.1 scale
 * rule s = 2^ceil(log2(amax / max_code)). */
uint8_t dsii_e8m0_ceil(float x);
/* Nearest E8M0 byte (RNE in the linear domain: x = 1.5·2^k is a tie, the even byte wins),
 * clamped to [0, 254] (2^-127 … 2^127); inf → 254; zero → 0 (the smallest scale); negative
 * or NaN → 255 (NaN). */
uint8_t dsii_f32_to_e8m0(float x);

/* ---- FP8 E4M3FN ------------------------------------------------------------------------ */
/* Bias 7, no infinities, 0x7F / 0xFF = NaN, max finite 448, subnormal step 2^-9. Exact. */
float dsii_e4m3_to_f32(uint8_t b);
/* RNE to the e4m3 grid, saturating to ±448; NaN → 0x7F | sign; -0 → 0x80. */
uint8_t dsii_f32_to_e4m3(float f);
/* f32 rounded to the e4m3 grid (value of dsii_f32_to_e4m3), returned as f32 — the
 * fake-quant rounding of model-spec §10.1. Ties to even, exact for subnormals. */
float dsii_e4m3_rne(float f);

/* ---- FP4 E2M1 ------------------------------------------------------------------------- */
/* Nibble (low 4 bits of `n`) → value: [0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, …, -6]. */
float dsii_e2m1_to_f32(uint8_t n);
/* RNE to the e2m1 grid, saturating to ±6; NaN → 0. Returns the 4-bit code. */
uint8_t dsii_f32_to_e2m1(float f);
/* f32 rounded to the e2m1 grid (model-spec §10.1 ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2,
 * 2.5→2, 3.5→4, 5→4). */
float dsii_e2m1_rne(float f);

static inline float dsii_bf16_rne(float f) { return dsii_bf16_to_f32(dsii_f32_to_bf16(f)); }

#endif /* DSI_QUANT_FP_H */
