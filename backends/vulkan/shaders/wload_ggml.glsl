// Element access for the further ggml weight types (docs/tensor-types.md): Q4_0 2, Q4_1 3,
// Q5_0 6, Q5_1 7, Q3_K 11, Q5_K 13, Q6_K 14, IQ2_XXS 16, IQ2_XS 17, IQ3_XXS 18, IQ1_S 19,
// IQ4_NL 20, IQ3_S 21, IQ2_S 22, IQ4_XS 23, IQ1_M 29. dq_ggml(rb, i) = element i of the row
// at byte rb, computed with the float operations of lib/quant/quant_ggml.c in the same order.
// Included by wload.glsl (which defines wbyte / wu16 / wf16); the codebooks come from
// ggml_grids.glsl (generated from ggml-common.h), the grids as packed level indices in
// shared memory that matmul.comp's main() fills first (DQ_INIT). Blocks start at even byte
// offsets (every block size here is even and weight rows / tensors are at least 2-aligned).
#if WTYPE == 2 || WTYPE == 3 || WTYPE == 6 || WTYPE == 7 || WTYPE == 11 || WTYPE == 13 || \
    WTYPE == 14 || WTYPE == 16 || WTYPE == 17 || WTYPE == 18 || WTYPE == 19 || WTYPE == 20 || \
    WTYPE == 21 || WTYPE == 22 || WTYPE == 23 || WTYPE == 29
#define DQ_GGML 1
#include "ggml_grids.glsl"

uint wu32(uint b) { return wu16(b) | (wu16(b + 2u) << 16); }
#ifdef GGML_GRID_BITS
#define DQ_INIT ggml_grid_init
// level index of value j of grid entry idx
uint glev(uint idx, uint j) {
    uint code = (g_grid[idx >> 1] >> (16u * (idx & 1u))) & 0xFFFFu;
    return (code >> (uint(GGML_GRID_BITS) * j)) & ((1u << GGML_GRID_BITS) - 1u);
}
// grid values (ggml-common.h): iq2 {8, 25, 43}; iq3xxs {4, 12, …, 52, 62}; iq3s {1, 3, …, 15};
// iq1 {-1, 0, 1}
uint gval_iq2(uint lv) { return lv == 0u ? 8u : (lv == 1u ? 25u : 43u); }
#endif
// the eighth sign bit of IQ2_XXS / IQ2_XS / IQ3_XXS makes the number of negatives even
uint signs8(uint s7) { return s7 | ((uint(bitCount(s7)) & 1u) << 7); }
float sgnv(float v, uint signs, uint j) { return ((signs >> j) & 1u) != 0u ? -v : v; }

float dq_ggml(uint rb, uint i) {
#if WTYPE == 2 // q4_0: f16 d; qs[16]
    uint bb = rb + (i >> 5) * 18u, j = i & 31u;
    uint q = wbyte(bb + 2u + (j & 15u));
    q = j < 16u ? (q & 15u) : (q >> 4);
    return float(int(q) - 8) * wf16(bb);
#elif WTYPE == 3 // q4_1: f16 d; f16 m; qs[16]
    uint bb = rb + (i >> 5) * 20u, j = i & 31u;
    uint q = wbyte(bb + 4u + (j & 15u));
    q = j < 16u ? (q & 15u) : (q >> 4);
    return float(q) * wf16(bb) + wf16(bb + 2u);
#elif WTYPE == 6 // q5_0: f16 d; qh u32; qs[16]
    uint bb = rb + (i >> 5) * 22u, j = i & 31u;
    uint q = wbyte(bb + 6u + (j & 15u));
    q = (j < 16u ? (q & 15u) : (q >> 4)) | (((wu32(bb + 2u) >> j) & 1u) << 4);
    return float(int(q) - 16) * wf16(bb);
#elif WTYPE == 7 // q5_1: f16 d; f16 m; qh u32; qs[16]
    uint bb = rb + (i >> 5) * 24u, j = i & 31u;
    uint q = wbyte(bb + 8u + (j & 15u));
    q = (j < 16u ? (q & 15u) : (q >> 4)) | (((wu32(bb + 4u) >> j) & 1u) << 4);
    return float(q) * wf16(bb) + wf16(bb + 2u);
#elif WTYPE == 11 // q3_k: hmask[32]; qs[64]; scales[12]; f16 d
    uint bb = rb + (i >> 8) * 110u, e = i & 255u;
    uint h = e >> 7, j = (e >> 5) & 3u, l = e & 31u, s = e >> 4;
    int q = int((wbyte(bb + 32u + 32u * h + l) >> (2u * j)) & 3u);
    if ((wbyte(bb + l) & (1u << (4u * h + j))) == 0u) q -= 4;
    uint lo = s < 8u ? (wbyte(bb + 96u + s) & 15u) : (wbyte(bb + 96u + s - 8u) >> 4);
    uint hi = (wbyte(bb + 104u + (s & 3u)) >> (2u * (s >> 2))) & 3u;
    float dl = wf16(bb + 108u) * float(int(lo | (hi << 4)) - 32);
    return dl * float(q);
#elif WTYPE == 13 // q5_k: f16 d; f16 dmin; scales[12]; qh[32]; qs[128]
    uint bb = rb + (i >> 8) * 176u, e = i & 255u;
    uint c = e >> 6, u = (e >> 5) & 1u, l = e & 31u, is = 2u * c + u;
    uint sc, mn;
    if (is < 4u) {
        sc = wbyte(bb + 4u + is) & 63u;
        mn = wbyte(bb + 8u + is) & 63u;
    } else {
        sc = (wbyte(bb + 8u + is) & 15u) | ((wbyte(bb + is) >> 6) << 4);
        mn = (wbyte(bb + 8u + is) >> 4) | ((wbyte(bb + 4u + is) >> 6) << 4);
    }
    uint q = wbyte(bb + 48u + 32u * c + l);
    q = (u != 0u ? (q >> 4) : (q & 15u)) + (((wbyte(bb + 16u + l) >> is) & 1u) << 4);
    return wf16(bb) * float(sc) * float(q) - wf16(bb + 2u) * float(mn);
#elif WTYPE == 14 // q6_k: ql[128]; qh[64]; int8 scales[16]; f16 d
    uint bb = rb + (i >> 8) * 210u, e = i & 255u;
    uint h = e >> 7, k = (e >> 5) & 3u, l = e & 31u;
    uint lo = wbyte(bb + 64u * h + 32u * (k & 1u) + l);
    lo = (k >> 1) != 0u ? (lo >> 4) : (lo & 15u);
    int q = int(lo | (((wbyte(bb + 128u + 32u * h + l) >> (2u * k)) & 3u) << 4)) - 32;
    int sc = int(wbyte(bb + 192u + (e >> 4)) << 24) >> 24;
    return wf16(bb + 208u) * float(sc) * float(q);
#elif WTYPE == 20 // iq4_nl: f16 d; qs[16]
    uint bb = rb + (i >> 5) * 18u, j = i & 31u;
    uint q = wbyte(bb + 2u + (j & 15u));
    return wf16(bb) * float(k_kvalues_iq4nl[j < 16u ? (q & 15u) : (q >> 4)]);
#elif WTYPE == 23 // iq4_xs: f16 d; u16 scales_h; scales_l[4]; qs[128]
    uint bb = rb + (i >> 8) * 136u, e = i & 255u, s = e >> 5, j = e & 31u;
    uint ls = ((wbyte(bb + 4u + (s >> 1)) >> (4u * (s & 1u))) & 15u) | (((wu16(bb + 2u) >> (2u * s)) & 3u) << 4);
    uint q = wbyte(bb + 8u + 16u * s + (j & 15u));
    float dl = wf16(bb) * float(int(ls) - 32);
    return dl * float(k_kvalues_iq4nl[j < 16u ? (q & 15u) : (q >> 4)]);
#elif WTYPE == 16 // iq2_xxs: f16 d; per 32: 4 grid bytes, u32 (4 x 7 sign bits, scale << 28)
    uint bb = rb + (i >> 8) * 66u, e = i & 255u, s = e >> 5, l = (e >> 3) & 3u, j = e & 7u;
    uint w = wu32(bb + 6u + 8u * s);
    float db = wf16(bb) * (0.5 + float(w >> 28)) * 0.25;
    float v = db * float(gval_iq2(glev(wbyte(bb + 2u + 8u * s + l), j)));
    return sgnv(v, signs8((w >> (7u * l)) & 127u), j);
#elif WTYPE == 17 // iq2_xs: f16 d; u16 qs[32] (index 9 bits | signs 7 bits); scales[8]
    uint bb = rb + (i >> 8) * 74u, e = i & 255u, s = e >> 5, g = e >> 3, j = e & 7u;
    uint q = wu16(bb + 2u + 2u * g);
    uint sc = wbyte(bb + 66u + s);
    float db = wf16(bb) * (0.5 + float(((g & 3u) < 2u) ? (sc & 15u) : (sc >> 4))) * 0.25;
    float v = db * float(gval_iq2(glev(q & 511u, j)));
    return sgnv(v, signs8(q >> 9), j);
#elif WTYPE == 22 // iq2_s: f16 d; qs[32]; signs[32]; qh[8]; scales[8]
    uint bb = rb + (i >> 8) * 82u, e = i & 255u, s = e >> 5, g = e >> 3, l = g & 3u, j = e & 7u;
    uint idx = wbyte(bb + 2u + g) | (((wbyte(bb + 66u + s) >> (2u * l)) & 3u) << 8);
    uint sc = wbyte(bb + 74u + s);
    float db = wf16(bb) * (0.5 + float(l < 2u ? (sc & 15u) : (sc >> 4))) * 0.25;
    float v = db * float(gval_iq2(glev(idx, j)));
    return sgnv(v, wbyte(bb + 34u + g), j);
#elif WTYPE == 18 // iq3_xxs: f16 d; qs[64]; u32 per 32 (signs, scale << 28)
    uint bb = rb + (i >> 8) * 98u, e = i & 255u, s = e >> 5, l = (e >> 3) & 3u, j = e & 7u;
    uint w = wu32(bb + 66u + 4u * s);
    float db = wf16(bb) * (0.5 + float(w >> 28)) * 0.5;
    uint idx = wbyte(bb + 2u + 8u * s + 2u * l + (j >> 2));
    uint lv = glev(idx, j & 3u);
    float v = db * float(lv == 7u ? 62u : 4u + 8u * lv);
    return sgnv(v, signs8((w >> (7u * l)) & 127u), j);
#elif WTYPE == 21 // iq3_s: f16 d; qs[64]; qh[8]; signs[32]; scales[4]
    uint bb = rb + (i >> 8) * 110u, e = i & 255u, s = e >> 5, l = (e >> 3) & 3u, j = e & 7u;
    uint k = 2u * l + (j >> 2);
    uint idx = wbyte(bb + 2u + 8u * s + k) | (((wbyte(bb + 66u + s) >> k) & 1u) << 8);
    uint sc = (wbyte(bb + 106u + (s >> 1)) >> (4u * (s & 1u))) & 15u;
    float db = wf16(bb) * float(1u + 2u * sc);
    float v = db * float(1u + 2u * glev(idx, j & 3u));
    return sgnv(v, wbyte(bb + 74u + 4u * s + l), j);
#elif WTYPE == 19 // iq1_s: f16 d; qs[32]; u16 qh[8]
    uint bb = rb + (i >> 8) * 50u, e = i & 255u, s = e >> 5, l = (e >> 3) & 3u, j = e & 7u;
    uint qh = wu16(bb + 34u + 2u * s);
    uint idx = wbyte(bb + 2u + 4u * s + l) | (((qh >> (3u * l)) & 7u) << 8);
    float dl = wf16(bb) * float(2u * ((qh >> 12) & 7u) + 1u);
    float delta = (qh & 0x8000u) != 0u ? -0.125 : 0.125;
    float g = float(int(glev(idx, j)) - 1);
    return dl * (g + delta);
#elif WTYPE == 29 // iq1_m: qs[32]; qh[16]; scales[8] = u16 sc[4] (3-bit scales, d in top nibbles)
    uint bb = rb + (i >> 8) * 56u, e = i & 255u, s = e >> 5, l = (e >> 3) & 3u, j = e & 7u;
    uint dh = (wu16(bb + 48u) >> 12) | ((wu16(bb + 50u) >> 8) & 0xF0u) |
              ((wu16(bb + 52u) >> 4) & 0xF00u) | (wu16(bb + 54u) & 0xF000u);
    float d = unpackHalf2x16(dh).x;
    uint sc = wu16(bb + 48u + 2u * (s >> 1));
    float dl = d * float(2u * ((sc >> (6u * (s & 1u) + 3u * (l >> 1))) & 7u) + 1u);
    uint hq = (wbyte(bb + 32u + 2u * s + (l >> 1)) >> (4u * (l & 1u))) & 15u;
    uint idx = wbyte(bb + 4u * s + l) | ((hq & 7u) << 8);
    float delta = (hq & 8u) != 0u ? -0.125 : 0.125;
    float g = float(int(glev(idx, j)) - 1);
    return dl * (g + delta);
#else
#error unknown WTYPE
#endif
}
#endif // DQ_GGML
