/*
 * backends/cuda/cuda_math.h — the numeric building blocks of the CUDA backend, as
 * __host__ __device__ functions: the kernels call them on the device, and the CPU test
 * program tests/gpu/test_cuda_math.cu (compiled by nvcc, run as host code in CI) checks the
 * very same functions against lib/quant and the CPU backend. Nothing here touches CUDA
 * APIs; with a plain C++ compiler the file compiles as ordinary inline host code.
 *
 * Exactness. Where the CPU backend's result is the reference bit for bit (weight decoding,
 * fake quant, Hadamard, RoPE angles, the indexer scores, routing scores), these functions
 * perform the same f32 operations in the same order, and the multiply / add helpers below
 * use the round-to-nearest intrinsics on the device so that nvcc cannot contract a·b + c
 * into an FMA (which rounds once instead of twice). Reductions whose order the GPU kernels
 * choose (matmul lanes, RMSNorm trees) are documented where they are implemented.
 *
 * Section numbers (§) refer to shared/docs/model-spec.md.
 */
#ifndef DSIC_CUDA_MATH_H
#define DSIC_CUDA_MATH_H

#include "backends/backend.h"
#include "backends/cuda/cuda_iq2.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DSIC_HD __host__ __device__ __forceinline__
#else
#define DSIC_HD inline
#endif

namespace dsic {

/* ---- bit casts and non-contracting arithmetic ------------------------------------------- */

DSIC_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

DSIC_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

/* a·b, a + b, a − b, a / b rounded once each (never fused). */
DSIC_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
DSIC_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
DSIC_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
DSIC_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* Little-endian loads from any byte address (on the device: one load when the address is
 * aligned, which weight rows of the plain types and block scales normally are). */
DSIC_HD uint32_t rd16(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
    if (((uintptr_t)p & 1u) == 0) return *(const uint16_t *)p;
#endif
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
DSIC_HD uint32_t rd32(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
    if (((uintptr_t)p & 3u) == 0) return *(const uint32_t *)p;
#endif
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* ---- scalar formats (model-spec §2.1; exact, as lib/quant/fp.c) ------------------------ */

DSIC_HD float f16_to_f32(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return bits_f32(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = mul((float)m, bits_f32(0x33800000u)); /* m · 2^-24, exact */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

DSIC_HD float bf16_to_f32(uint32_t h) { return bits_f32((h & 0xFFFFu) << 16); }

/* UE8M0: 2^(e−127); e = 0 → 2^-127 (0x00400000); e = 255 → NaN. */
DSIC_HD float e8m0_to_f32(uint32_t e) {
    e &= 0xFFu;
    if (e == 0xFFu) return bits_f32(0x7FC00000u);
    if (e == 0) return bits_f32(0x00400000u);
    return bits_f32(e << 23);
}

/* E4M3FN: bias 7, subnormal step 2^-9, 0x7F / 0xFF NaN. */
DSIC_HD float e4m3_to_f32(uint32_t b) {
    uint32_t sign = (b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
    if (e == 0xF && m == 7) return bits_f32(sign | 0x7FC00000u);
    if (e == 0) {
        float v = mul((float)m, bits_f32(0x3B000000u)); /* m · 2^-9, exact */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* E2M1 nibble → value: 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives (8 → −0). */
DSIC_HD float e2m1_to_f32(uint32_t n) {
    uint32_t c = n & 7u, sign = (n & 8u) << 28, b;
    if (c == 0) b = 0;
    else if (c == 1) b = 0x3F000000u; /* 0.5 */
    else b = (((c >> 1) + 126u) << 23) | ((c & 1u) << 22);
    return bits_f32(sign | b);
}

/* ---- fake-quant rounding (model-spec §10.1; as lib/quant/fp.c) --------------------------- */

/* f32 → nearest e4m3 value (RNE, saturating to ±448; NaN stays NaN). */
DSIC_HD float e4m3_rne(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7FFFFFFFu, code;
    if (ax > 0x7F800000u) {
        code = sign | 0x7Fu;
    } else if (ax >= 0x43E00000u) {
        code = sign | 0x7Eu;
    } else {
        uint32_t e = ax >> 23;
        if (e >= 121) {
            uint32_t odd = (ax >> 20) & 1u;
            uint32_t r = ax + 0x7FFFFu + odd;
            code = sign | ((((r >> 23) - 120u) << 3) | ((r >> 20) & 7u));
        } else if (e < 117) {
            code = sign;
        } else {
            uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
            uint32_t shift = 141u - e;
            uint32_t q = m >> shift;
            uint32_t rem = m & ((1u << shift) - 1u);
            uint32_t half = 1u << (shift - 1u);
            if (rem > half || (rem == half && (q & 1u))) q++;
            code = sign | q;
        }
    }
    return e4m3_to_f32(code);
}

/* f32 → nearest e2m1 value (ties to the even code, saturating to ±6; NaN → +0). */
DSIC_HD float e2m1_rne(float f) {
    if (f != f) return 0.0f;
    uint32_t sign = (f32_bits(f) >> 31) ? 8u : 0u;
    float a = fabsf(f);
    uint32_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return e2m1_to_f32(sign | c);
}

/* The E8M0 byte of the smallest power of two >= x: ceil(log2 x) + 127 clamped to [0, 254];
 * x <= 0 or NaN → 127; +inf → 254. Integer version of lib/quant's dsii_e8m0_ceil. */
DSIC_HD uint32_t e8m0_ceil(float x) {
    if (!(x > 0.0f)) return 127;
    uint32_t u = f32_bits(x);
    if (u >= 0x7F800000u) return 254;
    uint32_t e = u >> 23, m = u & 0x7FFFFFu;
    int32_t c;
    if (e == 0) { /* subnormal: x = m · 2^-149 */
        int32_t msb = 31;
        while (!((m >> msb) & 1u)) msb--;
        c = msb - 149 + ((m & (m - 1u)) ? 1 : 0);
    } else {
        c = (int32_t)e - 127 + (m ? 1 : 0);
    }
    int32_t b = c + 127;
    if (b < 0) b = 0;
    if (b > 254) b = 254;
    return (uint32_t)b;
}

/* Scale and limit of one fake-quant block from its amax (backends/backend.h DSIB_FQ_*). */
DSIC_HD void fq_scale(float amax, int32_t recipe, float *s, float *lim) {
    switch (recipe) {
    case DSIB_FQ_E4M3_UE8M0:
        if (amax < 1e-4f) amax = 1e-4f;
        *s = e8m0_to_f32(e8m0_ceil(mul(amax, 1.0f / 448.0f)));
        *lim = 448.0f;
        break;
    case DSIB_FQ_E2M1_UE8M0:
        if (amax < 6.0f * 0x1p-126f) amax = 6.0f * 0x1p-126f;
        *s = e8m0_to_f32(e8m0_ceil(mul(amax, 1.0f / 6.0f)));
        *lim = 6.0f;
        break;
    default: /* DSIB_FQ_E2M1_E4M3 */
        if (amax < 6.0f * 0x1p-9f) amax = 6.0f * 0x1p-9f;
        *s = e4m3_rne(div(amax, 6.0f));
        *lim = 6.0f;
        break;
    }
}

/* One element of a fake-quant block: clamp(v / s, ±lim), rounded to the recipe's grid unless
 * `round` is 0, times s. */
DSIC_HD float fq_elem(float v, float s, float lim, int32_t recipe, int round) {
    float q = div(v, s);
    if (q > lim) q = lim;
    if (q < -lim) q = -lim;
    if (round) q = recipe == DSIB_FQ_E4M3_UE8M0 ? e4m3_rne(q) : e2m1_rne(q);
    return mul(q, s);
}

/* ---- IQ2_XXS (ggml block_iq2_xxs: f16 d; 8 × (4 grid indices, u32 signs | scale << 28)) -- */

DSIC_HD uint32_t iq2_sign_byte(uint32_t i) {
#if defined(__CUDA_ARCH__)
    return iq2_ksigns_d[i & 127u];
#else
    return iq2_ksigns_h[i & 127u];
#endif
}
DSIC_HD uint64_t iq2_grid(uint32_t i) {
#if defined(__CUDA_ARCH__)
    return iq2xxs_grid_d[i & 255u];
#else
    return iq2xxs_grid_h[i & 255u];
#endif
}
/* Element 8·l + j of sub-block s of the block at b (lib/quant dsii_blk_iq2_xxs's operations). */
DSIC_HD float iq2xxs_elem(const uint8_t *b, uint32_t s, uint32_t l, uint32_t j) {
    const uint8_t *q = b + 2 + 8 * s;
    const uint32_t w = rd32(q + 4);
    const float db = mul(mul(f16_to_f32(rd16(b)), add(0.5f, (float)(w >> 28))), 0.25f);
    const uint32_t g = (uint32_t)((iq2_grid(q[l]) >> (8 * j)) & 0xFFu);
    const uint32_t signs = iq2_sign_byte((w >> (7 * l)) & 127u);
    return mul(mul(db, (float)g), ((signs >> j) & 1u) ? -1.0f : 1.0f);
}

/* ---- weight types --------------------------------------------------------------------- */

/* The weight types the CUDA kernels decode (matmul, get_rows, moe_experts, tables). */
DSIC_HD int type_supported(int32_t t) {
    switch (t) {
    case DSI_TYPE_F32: case DSI_TYPE_F16: case DSI_TYPE_BF16: case DSI_TYPE_Q8_0:
    case DSI_TYPE_Q4_K: case DSI_TYPE_Q2_K: case DSI_TYPE_MXFP4:
    case DSI_TYPE_FP8_E4M3_B128: case DSI_TYPE_FP8_E4M3_B32: case DSI_TYPE_FP8_E4M3_R32:
    case DSI_TYPE_IQ2_XXS:
        return 1;
    default:
        return 0;
    }
}

/* Elements and bytes of one block (1 element for the plain types). */
DSIC_HD uint32_t type_blck(int32_t t) {
    switch (t) {
    case DSI_TYPE_Q8_0: case DSI_TYPE_MXFP4: case DSI_TYPE_FP8_E4M3_B32:
    case DSI_TYPE_FP8_E4M3_R32: return 32;
    case DSI_TYPE_Q4_K: case DSI_TYPE_Q2_K: case DSI_TYPE_IQ2_XXS: return 256;
    case DSI_TYPE_FP8_E4M3_B128: return 128;
    default: return 1;
    }
}
DSIC_HD uint32_t type_bytes(int32_t t) {
    switch (t) {
    case DSI_TYPE_F32: return 4;
    case DSI_TYPE_F16: case DSI_TYPE_BF16: return 2;
    case DSI_TYPE_Q8_0: return 34;
    case DSI_TYPE_Q4_K: return 144;
    case DSI_TYPE_Q2_K: return 84;
    case DSI_TYPE_IQ2_XXS: return 66;
    case DSI_TYPE_MXFP4: return 17;
    case DSI_TYPE_FP8_E4M3_B128: return 129;
    case DSI_TYPE_FP8_E4M3_B32: case DSI_TYPE_FP8_E4M3_R32: return 33;
    default: return 0;
    }
}

/* Bytes of a row of k elements (FP8 block types pad the last block; ggml types need k to be
 * a multiple of the block: 0 otherwise). */
DSIC_HD uint64_t row_bytes(int32_t t, int64_t k) {
    uint32_t b = type_blck(t), s = type_bytes(t);
    if (!s || k < 0) return 0;
    int pad = t == DSI_TYPE_FP8_E4M3_B128 || t == DSI_TYPE_FP8_E4M3_B32 || t == DSI_TYPE_FP8_E4M3_R32;
    if (!pad && (uint64_t)k % b) return 0;
    return ((uint64_t)k / b + ((uint64_t)k % b != 0)) * s;
}

/* Q4_K: 6-bit scale and min of sub-block j (ggml get_scale_min_k4). */
DSIC_HD void q4k_scale_min(int j, const uint8_t *q, uint32_t *sc, uint32_t *m) {
    if (j < 4) {
        *sc = q[j] & 63u;
        *m = q[j + 4] & 63u;
    } else {
        *sc = (q[j + 4] & 0xFu) | ((uint32_t)(q[j - 4] >> 6) << 4);
        *m = (uint32_t)(q[j + 4] >> 4) | ((uint32_t)(q[j] >> 6) << 4);
    }
}

/* Element i of a row (random access; get_rows, tables, small parameter vectors). The value
 * equals lib/quant's dequantization bit for bit. */
DSIC_HD float dq_elem(int32_t t, const uint8_t *row, int64_t i) {
    switch (t) {
    case DSI_TYPE_F32: return bits_f32(rd32(row + 4 * i));
    case DSI_TYPE_F16: return f16_to_f32(rd16(row + 2 * i));
    case DSI_TYPE_BF16: return bf16_to_f32(rd16(row + 2 * i));
    case DSI_TYPE_I32: return (float)(int32_t)rd32(row + 4 * i);
    case DSI_TYPE_Q8_0: {
        const uint8_t *b = row + (i >> 5) * 34;
        return mul(f16_to_f32(rd16(b)), (float)(int8_t)b[2 + (i & 31)]);
    }
    case DSI_TYPE_Q4_K: {
        const uint8_t *b = row + (i >> 8) * 144;
        uint32_t r = (uint32_t)(i & 255), c = r >> 6, hi = (r >> 5) & 1u, l = r & 31u;
        uint32_t sc, mn;
        q4k_scale_min((int)(2 * c + hi), b + 4, &sc, &mn);
        uint32_t q = b[16 + 32 * c + l];
        q = hi ? q >> 4 : q & 15u;
        float dl = mul(f16_to_f32(rd16(b)), (float)sc), ml = mul(f16_to_f32(rd16(b + 2)), (float)mn);
        return sub(mul(dl, (float)q), ml);
    }
    case DSI_TYPE_Q2_K: {
        const uint8_t *b = row + (i >> 8) * 84;
        uint32_t e = (uint32_t)(i & 255), h = e >> 7, j = (e >> 5) & 3u, l = e & 31u;
        uint32_t q = (b[16 + 32 * h + l] >> (2 * j)) & 3u, s = b[e >> 4];
        float dl = mul(f16_to_f32(rd16(b + 80)), (float)(s & 15u));
        float ml = mul(f16_to_f32(rd16(b + 82)), (float)(s >> 4));
        return sub(mul(dl, (float)q), ml);
    }
    case DSI_TYPE_IQ2_XXS: {
        const uint32_t e = (uint32_t)(i & 255);
        return iq2xxs_elem(row + (i >> 8) * 66, e >> 5, (e >> 3) & 3u, e & 7u);
    }
    case DSI_TYPE_MXFP4: {
        const uint8_t *b = row + (i >> 5) * 17;
        uint32_t j = (uint32_t)(i & 31), q = b[1 + (j & 15u)];
        return mul(e8m0_to_f32(b[0]), e2m1_to_f32(j < 16 ? q & 15u : q >> 4));
    }
    case DSI_TYPE_FP8_E4M3_B128: {
        const uint8_t *b = row + (i >> 7) * 129;
        return mul(e8m0_to_f32(b[0]), e4m3_to_f32(b[1 + (i & 127)]));
    }
    case DSI_TYPE_FP8_E4M3_B32:
    case DSI_TYPE_FP8_E4M3_R32: {
        const uint8_t *b = row + (i >> 5) * 33;
        return mul(e8m0_to_f32(b[0]), e4m3_to_f32(b[1 + (i & 31)]));
    }
    default: return 0.0f;
    }
}

/* ---- matmul chunks ---------------------------------------------------------------------
 * The matmul kernels stream every weight row in chunks of MM_CHUNK = 256 elements (whole
 * blocks of every type: 8 Q8_0 / MXFP4 / FP8_B32 blocks, 2 FP8_B128 blocks, one Q4_K /
 * Q2_K block). Lane l of a warp owns elements l + 32·j (j = 0..7) of each chunk and adds
 * them, in j order and chunk order, to its own accumulator per (row, token); the 32 lane
 * sums are then combined by a fixed xor butterfly. That order depends on the row length
 * only — never on the number of tokens or rows in the call (model-spec §10.4). */

enum { MM_CHUNK = 256, MM_LANE_ELEMS = MM_CHUNK / 32 };

/* Bytes of one full chunk of type t. */
DSIC_HD uint32_t chunk_bytes(int32_t t) { return MM_CHUNK / type_blck(t) * type_bytes(t); }

/* Element e = lane + 32·j of a chunk whose first byte is `cb` (block aligned). Same value
 * as dq_elem of that element. */
template <int32_t T>
DSIC_HD float chunk_elem(const uint8_t *cb, uint32_t lane, uint32_t j) {
    const uint32_t e = lane + 32u * j;
    if (T == DSI_TYPE_F32) return bits_f32(rd32(cb + 4 * e));
    if (T == DSI_TYPE_F16) return f16_to_f32(rd16(cb + 2 * e));
    if (T == DSI_TYPE_BF16) return bf16_to_f32(rd16(cb + 2 * e));
    if (T == DSI_TYPE_Q8_0) {
        const uint8_t *b = cb + 34 * j;
        return mul(f16_to_f32(rd16(b)), (float)(int8_t)b[2 + lane]);
    }
    if (T == DSI_TYPE_Q4_K) { /* sub-block j: chunk c = j / 2, high nibbles for odd j */
        uint32_t sc, mn;
        q4k_scale_min((int)j, cb + 4, &sc, &mn);
        uint32_t q = cb[16 + 32 * (j >> 1) + lane];
        q = (j & 1u) ? q >> 4 : q & 15u;
        float dl = mul(f16_to_f32(rd16(cb)), (float)sc), ml = mul(f16_to_f32(rd16(cb + 2)), (float)mn);
        return sub(mul(dl, (float)q), ml);
    }
    if (T == DSI_TYPE_Q2_K) {
        uint32_t q = (cb[16 + 32 * (j >> 2) + lane] >> (2 * (j & 3u))) & 3u, s = cb[e >> 4];
        float dl = mul(f16_to_f32(rd16(cb + 80)), (float)(s & 15u));
        float ml = mul(f16_to_f32(rd16(cb + 82)), (float)(s >> 4));
        return sub(mul(dl, (float)q), ml);
    }
    if (T == DSI_TYPE_IQ2_XXS) return iq2xxs_elem(cb, j, lane >> 3, lane & 7u);
    if (T == DSI_TYPE_MXFP4) {
        const uint8_t *b = cb + 17 * j;
        uint32_t q = b[1 + (lane & 15u)];
        return mul(e8m0_to_f32(b[0]), e2m1_to_f32(lane < 16 ? q & 15u : q >> 4));
    }
    if (T == DSI_TYPE_FP8_E4M3_B128) {
        const uint8_t *b = cb + 129 * (j >> 2);
        return mul(e8m0_to_f32(b[0]), e4m3_to_f32(b[1 + lane + 32 * (j & 3u)]));
    }
    /* FP8_E4M3_B32 / R32 */
    const uint8_t *b = cb + 33 * j;
    return mul(e8m0_to_f32(b[0]), e4m3_to_f32(b[1 + lane]));
}

/* The word-aligned range a warp loads for chunk c of a row at byte address `row` (rowbytes
 * long): words [w0, w0 + nw) and the chunk's first byte `skew` bytes into them. Reading up to
 * 3 bytes before or after the row stays inside the buffer (allocations are padded). */
struct chunk_span {
    uint64_t w0;      /* first word address (bytes, 4-aligned) */
    uint32_t nw;      /* words */
    uint32_t skew;    /* bytes from w0 to the chunk's first byte */
};
DSIC_HD chunk_span chunk_words(uint64_t row, uint64_t rowbytes, uint32_t cbytes, uint64_t c) {
    uint64_t b0 = row + c * cbytes, b1 = row + rowbytes;
    if (b1 > b0 + cbytes) b1 = b0 + cbytes;
    chunk_span s;
    s.w0 = b0 & ~(uint64_t)3;
    s.skew = (uint32_t)(b0 - s.w0);
    s.nw = (uint32_t)((b1 - s.w0 + 3) >> 2);
    return s;
}

/* ---- small nonlinearities (as the CPU backend) ------------------------------------------- */

DSIC_HD float sigmoidf_(float x) { return div(1.0f, add(1.0f, expf(-x))); }
DSIC_HD float siluf_(float x) { return div(x, add(1.0f, expf(-x))); }
DSIC_HD float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* SwiGLU with clamp (lim <= 0: none): silu(min(g, lim)) · clamp(u, ±lim). */
DSIC_HD float swiglu1(float g, float u, float lim) {
    if (lim > 0.0f) {
        if (g > lim) g = lim;
        if (u > lim) u = lim;
        if (u < -lim) u = -lim;
    }
    return mul(siluf_(g), u);
}

/* ---- top-k keys (model-spec §10.2: higher score first, ties: lower index first) ---------
 * A score maps to an unsigned key whose order is the float order (−0 counts as +0, so the
 * two compare equal as on the CPU); key 0 is reserved for "not a candidate" (it is the
 * key of a NaN with all bits set, which the ops never produce). */
DSIC_HD uint32_t score_key(float s) {
    if (s == 0.0f) s = 0.0f; /* −0 → +0 */
    uint32_t u = f32_bits(s);
    uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return k ? k : 1u;
}

/* ---- RoPE (§3.9): the angle of pair i at position p, in double like the CPU ------------ */
DSIC_HD void rope_cs(double pos, double freq, int inverse, float *c, float *s) {
    double th = pos * freq;
    *c = (float)cos(th);
    float sn = (float)sin(th);
    *s = inverse ? -sn : sn;
}

/* ---- dot products in the CPU backend's order ------------------------------------------- */

/* The CPU backend's dot_fixed (ops.c): 8 lane accumulators (element i in lane i mod 8), the
 * tail added to lane 0, lanes combined ((0+1)+(2+3))+((4+5)+(6+7)). The GPU computes the
 * same lanes in 8 threads and the same tree with shuffles. */
DSIC_HD float dot8(const float *a, const float *b, uint32_t n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (uint32_t j = 0; j < 8; j++) l[j] = add(l[j], mul(a[i + j], b[i + j]));
    for (; i < n; i++) l[0] = add(l[0], mul(a[i], b[i]));
    return add(add(add(l[0], l[1]), add(l[2], l[3])), add(add(l[4], l[5]), add(l[6], l[7])));
}

/* One lane's part of dot8: lane j (0..7) of a, b of length n (the tail goes to lane 0). */
DSIC_HD float dot8_lane(const float *a, const float *b, uint32_t n, uint32_t j) {
    float l = 0.0f;
    uint32_t n8 = n & ~7u, i = j;
    for (; i < n8; i += 8) l = add(l, mul(a[i], b[i]));
    if (j == 0)
        for (i = n8; i < n; i++) l = add(l, mul(a[i], b[i]));
    return l;
}

/* ---- mHC coefficients (§3.3, §3.6): everything of hc_mix after the matmul ------------- *
 * m: the row's n_mix raw mixes (fn · flat X), rs: rsqrt factor already computed from the
 * row's sum of squares; sc: scale [3] (HEAD: [1]), bs: base [n_mix]. In place on m. */
DSIC_HD void hc_coef_row(float *m, uint32_t n_hc, float rs, const float *sc, const float *bs,
                         float hc_eps, uint32_t iters, int head) {
    uint32_t n_mix = head ? n_hc : n_hc * (2 + n_hc);
    for (uint32_t i = 0; i < n_mix; i++) m[i] = mul(m[i], rs);
    if (head) {
        for (uint32_t h = 0; h < n_hc; h++) m[h] = add(sigmoidf_(add(mul(m[h], sc[0]), bs[h])), hc_eps);
        return;
    }
    for (uint32_t h = 0; h < n_hc; h++) {
        m[h] = add(sigmoidf_(add(mul(m[h], sc[0]), bs[h])), hc_eps);
        m[n_hc + h] = mul(2.0f, sigmoidf_(add(mul(m[n_hc + h], sc[1]), bs[n_hc + h])));
    }
    float *C = m + 2 * n_hc;
    for (uint32_t i = 0; i < n_hc * n_hc; i++) C[i] = add(mul(C[i], sc[2]), bs[2 * n_hc + i]);
    for (uint32_t i = 0; i < n_hc; i++) {
        float *row = C + i * n_hc, mx = row[0], s = 0.0f;
        for (uint32_t j = 1; j < n_hc; j++) mx = row[j] > mx ? row[j] : mx;
        for (uint32_t j = 0; j < n_hc; j++) {
            row[j] = expf(sub(row[j], mx));
            s = add(s, row[j]);
        }
        for (uint32_t j = 0; j < n_hc; j++) row[j] = add(div(row[j], s), hc_eps);
    }
    for (uint32_t it = 0; it < iters; it++) {
        if (it > 0)
            for (uint32_t i = 0; i < n_hc; i++) {
                float s = 0.0f;
                for (uint32_t j = 0; j < n_hc; j++) s = add(s, C[i * n_hc + j]);
                s = add(s, hc_eps);
                for (uint32_t j = 0; j < n_hc; j++) C[i * n_hc + j] = div(C[i * n_hc + j], s);
            }
        for (uint32_t j = 0; j < n_hc; j++) {
            float s = 0.0f;
            for (uint32_t i = 0; i < n_hc; i++) s = add(s, C[i * n_hc + j]);
            s = add(s, hc_eps);
            for (uint32_t i = 0; i < n_hc; i++) C[i * n_hc + j] = div(C[i * n_hc + j], s);
        }
    }
}

/* ---- Engram gate (§4.6 step 4): the gate from the three sums of one stream ------------- */
DSIC_HD float engram_g(float sx, float sk, float c, float D, float eps, float inv_sqrt_d) {
    float rx = div(1.0f, sqrtf(add(div(sx, D), eps)));
    float rk = div(1.0f, sqrtf(add(div(sk, D), eps)));
    float dot = mul(mul(mul(c, rx), rk), inv_sqrt_d);
    float ad = fabsf(dot);
    float mag = sqrtf(ad > 1e-6f ? ad : 1e-6f);
    float sgn = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
    return div(1.0f, add(1.0f, expf(-mul(sgn, mag))));
}

/* ---- step rows and state --------------------------------------------------------------- */

/* Step row t of rows [n][4] is usable: position >= 0, slot < slots (0: unchecked), first /
 * count describe a run of the step that contains t and starts at a row of the same slot
 * whose position is pos − (t − first). Ops skip (and report) rows that are not. */
DSIC_HD int row_ok(const int32_t *rows, uint32_t t, uint32_t n, uint32_t slots) {
    const int32_t *r = rows + 4 * (uint64_t)t;
    int32_t pos = r[0], slot = r[1], first = r[2], count = r[3];
    if (pos < 0 || slot < 0 || (slots && (uint32_t)slot >= slots) || first < 0 ||
        (uint32_t)first > t || count < 1 || (uint64_t)first + (uint64_t)count <= t ||
        (uint64_t)first + (uint64_t)count > n)
        return 0;
    const int32_t *f = rows + 4 * (uint64_t)first;
    return f[1] == slot && (int64_t)f[0] + (int64_t)(t - (uint32_t)first) == (int64_t)pos;
}

/* compress_pool candidate c (0 .. nc−1) of group w for a sequence at pos0 (§3.4): position
 * q and the column offset (lane B of the overlapping CSA compressor reads dims [hd, 2hd)). */
DSIC_HD int64_t pool_cand(int64_t w, uint32_t c, uint32_t ratio, int overlap, uint32_t hd,
                          uint32_t *col) {
    int lane_a = overlap && w > 0 && c < ratio;
    int64_t grp = lane_a ? w - 1 : w;
    uint32_t s = lane_a ? c : (overlap && w > 0 ? c - ratio : c);
    *col = overlap && !lane_a ? hd : 0;
    return grp * ratio + s;
}

} // namespace dsic

#endif /* DSIC_CUDA_MATH_H */
