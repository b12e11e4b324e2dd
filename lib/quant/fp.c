/*
 * Scalar float format conversions (see fp.h). All encoders work on the f32 bit pattern
 * with integer arithmetic so that the result is exactly round-to-nearest-even regardless
 * of the FPU rounding mode or FTZ/DAZ settings.
 */
#include "quant/fp.h"

#include <math.h>

/* ---- f16 ------------------------------------------------------------------------------ */

float dsii_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    if (e == 0x1F) return dsii_bits_f32(sign | 0x7F800000u | (m << 13)); /* inf / NaN */
    if (e == 0) {
        /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return dsii_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t dsii_f32_to_f16(float f) {
    uint32_t x = dsii_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    /* 65520 = halfway between 65504 (max, odd mantissa) and 65536: ties to even → inf */
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
    if (ax >= 0x38800000u) { /* normal f16 range, >= 2^-14 */
        uint32_t odd = (ax >> 13) & 1u;
        ax += 0x0FFFu + odd;
        return (uint16_t)(sign | ((ax - 0x38000000u) >> 13));
    }
    uint32_t e = ax >> 23;
    if (e < 102) return sign; /* < 2^-25: rounds to zero (2^-25 itself is handled below) */
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e; /* value in units of 2^-24 is m >> shift */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q); /* q == 0x400 is the smallest normal: still correct */
}

/* ---- bf16 ----------------------------------------------------------------------------- */

uint16_t dsii_f32_to_bf16(float f) {
    uint32_t x = dsii_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- E8M0 ----------------------------------------------------------------------------- */

float dsii_e8m0_to_f32(uint8_t e) {
    if (e == 0xFF) return dsii_bits_f32(0x7FC00000u);
    if (e == 0) return dsii_bits_f32(0x00400000u); /* 2^-127 (subnormal) */
    return dsii_bits_f32((uint32_t)e << 23);
}

uint8_t dsii_e8m0_ceil(float x) {
    if (!(x > 0.0f)) return 127; /* zero, negative, NaN: scale 1 */
    if (isinf(x)) return 254;
    int ex;
    float fr = frexpf(x, &ex); /* x = fr * 2^ex, fr in [0.5, 1) */
    int c = (fr == 0.5f) ? ex - 1 : ex; /* ceil(log2 x) */
    int b = c + 127;
    if (b < 0) b = 0;
    if (b > 254) b = 254;
    return (uint8_t)b;
}

uint8_t dsii_f32_to_e8m0(float x) {
    if (isnan(x) || x < 0.0f) return 255;
    if (x == 0.0f) return 0;
    if (isinf(x)) return 254;
    int ex;
    float fr = frexpf(x, &ex); /* x = fr * 2^ex, fr in [0.5, 1); candidates 2^(ex-1), 2^ex */
    int lo = ex - 1 + 127, b;
    if (fr < 0.75f) b = lo;
    else if (fr > 0.75f) b = lo + 1;
    else b = (lo & 1) ? lo + 1 : lo;
    if (b < 0) b = 0;
    if (b > 254) b = 254;
    return (uint8_t)b;
}

/* ---- E4M3FN --------------------------------------------------------------------------- */

float dsii_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xFu;
    uint32_t m = b & 7u;
    if (e == 0xF && m == 7) return dsii_bits_f32(sign | 0x7FC00000u);
    if (e == 0) {
        float v = (float)m * 0x1p-9f;
        return sign ? -v : v;
    }
    return dsii_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

uint8_t dsii_f32_to_e4m3(float f) {
    uint32_t x = dsii_f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);
    /* >= 448 (incl. inf): every value in [448, 464] rounds to 448 under RNE, larger ones
     * would overflow; we saturate (fp.h). */
    if (ax >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu);
    uint32_t e = ax >> 23;
    if (e >= 121) { /* >= 2^-6: normal e4m3; round 23 → 3 mantissa bits */
        uint32_t odd = (ax >> 20) & 1u;
        uint32_t r = ax + 0x7FFFFu + odd;
        uint32_t ee = (r >> 23) - 120u; /* 1..15; cannot reach the NaN code below 448 */
        uint32_t mm = (r >> 20) & 7u;
        return (uint8_t)(sign | (ee << 3) | mm);
    }
    if (e < 117) return sign; /* < 2^-10 = half the subnormal step: rounds to zero */
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 141u - e; /* value in units of 2^-9 is m >> shift (21..24) */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q); /* q == 8 encodes 2^-6 (e=1, m=0): still correct */
}

float dsii_e4m3_rne(float f) { return dsii_e4m3_to_f32(dsii_f32_to_e4m3(f)); }

/* ---- E2M1 ----------------------------------------------------------------------------- */

float dsii_e2m1_to_f32(uint8_t n) {
    static const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float a = v[n & 7u];
    return (n & 8u) ? -a : a;
}

uint8_t dsii_f32_to_e2m1(float f) {
    if (isnan(f)) return 0;
    uint8_t sign = signbit(f) ? 8u : 0u;
    float a = fabsf(f);
    /* Grid 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0..7). At a midpoint the even code wins, so the
     * interval of an even code is closed and that of an odd code open (all bounds exact). */
    uint8_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7; /* saturate (incl. inf) */
    return (uint8_t)(sign | c);
}

float dsii_e2m1_rne(float f) { return dsii_e2m1_to_f32(dsii_f32_to_e2m1(f)); }
