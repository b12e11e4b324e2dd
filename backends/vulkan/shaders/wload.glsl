// Weight element access: `wb` (binding WBIND) holds the weight window; WTYPE selects the
// storage type (DSI_TYPE_* ids). dq(rb, i): element i of the row starting at byte rb.
uint wbyte(uint b) { return (wb.d[b >> 2] >> ((b & 3u) << 3)) & 0xFFu; }
uint wu16(uint b) { return (wb.d[b >> 2] >> ((b & 2u) << 3)) & 0xFFFFu; }
float wf16(uint b) { return unpackHalf2x16(wu16(b)).x; }

#define T_F32 0
#define T_F16 1
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q4_K 12
#define T_BF16 30
#define T_MXFP4 39
#define T_FP8_B128 1024
#define T_FP8_B32 1025

#include "wload_ggml.glsl"

float dq(uint rb, uint i) {
#if WTYPE == T_F32
    return uintBitsToFloat(wb.d[(rb >> 2) + i]);
#elif WTYPE == T_F16
    return wf16(rb + 2u * i);
#elif WTYPE == T_BF16
    return uintBitsToFloat(wu16(rb + 2u * i) << 16);
#elif WTYPE == T_Q8_0
    // ggml block_q8_0: f16 d; int8 qs[32]
    uint bb = rb + (i >> 5) * 34u;
    int q = int(wbyte(bb + 2u + (i & 31u)) << 24) >> 24;
    return wf16(bb) * float(q);
#elif WTYPE == T_Q4_K
    // ggml block_q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
    uint bb = rb + (i >> 8) * 144u;
    uint r = i & 255u, j = r >> 6, hi = (r >> 5) & 1u, l = r & 31u;
    uint is = 2u * j + hi;
    uint sc, mn;
    if (is < 4u) {
        sc = wbyte(bb + 4u + is) & 63u;
        mn = wbyte(bb + 4u + is + 4u) & 63u;
    } else {
        sc = (wbyte(bb + 4u + is + 4u) & 15u) | ((wbyte(bb + 4u + is - 4u) >> 6) << 4);
        mn = (wbyte(bb + 4u + is + 4u) >> 4) | ((wbyte(bb + 4u + is) >> 6) << 4);
    }
    uint q = wbyte(bb + 16u + j * 32u + l);
    uint nib = hi != 0u ? (q >> 4) : (q & 15u);
    return wf16(bb) * float(sc) * float(nib) - wf16(bb + 2u) * float(mn);
#elif WTYPE == T_Q2_K
    // ggml block_q2_K: u8 scales[16]; u8 qs[64]; f16 d; f16 dmin
    uint bb = rb + (i >> 8) * 84u;
    uint r = i & 255u, n = r >> 7, j = (r >> 5) & 3u, l = r & 31u;
    uint is = n * 8u + j * 2u + (l >> 4);
    uint sc = wbyte(bb + is);
    uint q = (wbyte(bb + 16u + n * 32u + l) >> (2u * j)) & 3u;
    return wf16(bb + 80u) * float(sc & 15u) * float(q) - wf16(bb + 82u) * float(sc >> 4);
#elif WTYPE == T_MXFP4
    // ggml block_mxfp4: u8 e (E8M0); qs[16]: element j low nibble of qs[j], j+16 high nibble
    uint bb = rb + (i >> 5) * 17u;
    uint j = i & 31u;
    uint q = wbyte(bb + 1u + (j & 15u));
    return e2m1_to_f32(j < 16u ? (q & 15u) : (q >> 4)) * e8m0_to_f32(wbyte(bb));
#elif WTYPE == T_FP8_B128
    uint bb = rb + (i >> 7) * 129u;
    return e4m3_to_f32(wbyte(bb + 1u + (i & 127u))) * e8m0_to_f32(wbyte(bb));
#elif WTYPE == T_FP8_B32
    uint bb = rb + (i >> 5) * 33u;
    return e4m3_to_f32(wbyte(bb + 1u + (i & 31u))) * e8m0_to_f32(wbyte(bb));
#elif defined(DQ_GGML)
    return dq_ggml(rb, i);
#else
#error unknown WTYPE
#endif
}
