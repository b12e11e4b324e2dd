/*
 * Tensor type table and reference kernels (see quant.h, docs/tensor-types.md).
 *
 * Byte layouts are read with explicit little-endian loads (never by casting to a struct),
 * so the kernels are independent of host endianness, alignment and struct padding.
 */
#include "quant/quant.h"

#include "quant/fp.h"
#include "backends/types.h"
#include "quant/quant_ggml.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

/* ---- plain types ---------------------------------------------------------------------- */

static void deq_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static float dot_f32(const void *src, const float *y, int64_t n) {
    const uint8_t *p = src;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        s += v * y[i];
    }
    return s;
}
static size_t q_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return (size_t)n * 4;
}

static void deq_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = dsii_f16_to_f32(ld16(p + 2 * i));
}
static float dot_f16(const void *src, const float *y, int64_t n) {
    const uint8_t *p = src;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += dsii_f16_to_f32(ld16(p + 2 * i)) * y[i];
    return s;
}
static size_t q_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) st16(p + 2 * i, dsii_f32_to_f16(src[i]));
    return (size_t)n * 2;
}

static void deq_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = dsii_bf16_to_f32(ld16(p + 2 * i));
}
static float dot_bf16(const void *src, const float *y, int64_t n) {
    const uint8_t *p = src;
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += dsii_bf16_to_f32(ld16(p + 2 * i)) * y[i];
    return s;
}
static size_t q_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) st16(p + 2 * i, dsii_f32_to_bf16(src[i]));
    return (size_t)n * 2;
}

/* Integer and f64 tensors (e.g. ffn_gate_tid2eid, I32): converted to f32 exactly where
 * representable, otherwise rounded by the C conversion. */
#define INT_TYPE(NAME, CT, SZ)                                                          \
    static void deq_##NAME(const void *src, float *dst, int64_t n) {                    \
        const uint8_t *p = src;                                                         \
        for (int64_t i = 0; i < n; i++) {                                               \
            CT v;                                                                       \
            memcpy(&v, p + (SZ) * i, SZ);                                               \
            dst[i] = (float)v;                                                          \
        }                                                                               \
    }                                                                                   \
    static float dot_##NAME(const void *src, const float *y, int64_t n) {               \
        const uint8_t *p = src;                                                         \
        float s = 0.0f;                                                                 \
        for (int64_t i = 0; i < n; i++) {                                               \
            CT v;                                                                       \
            memcpy(&v, p + (SZ) * i, SZ);                                               \
            s += (float)v * y[i];                                                       \
        }                                                                               \
        return s;                                                                       \
    }
INT_TYPE(i8, int8_t, 1)
INT_TYPE(i16, int16_t, 2)
INT_TYPE(i32, int32_t, 4)
INT_TYPE(i64, int64_t, 8)
INT_TYPE(f64, double, 8)

/* ---- generic block dot: dequantize one block at a time ---------------------------------- */

typedef void (*block_deq_fn)(const uint8_t *blk, float *out);

static float dot_blocks(const void *src, const float *y, int64_t n, uint32_t blck,
                        uint32_t bytes, block_deq_fn deq) {
    const uint8_t *p = src;
    float tmp[DSII_QK_K];
    float s = 0.0f;
    for (int64_t i = 0; i < n; i += blck) {
        deq(p, tmp);
        int64_t m = n - i < (int64_t)blck ? n - i : (int64_t)blck;
        for (int64_t j = 0; j < m; j++) s += tmp[j] * y[i + j];
        p += bytes;
    }
    return s;
}

static void deq_blocks(const void *src, float *dst, int64_t n, uint32_t blck, uint32_t bytes,
                       block_deq_fn deq) {
    const uint8_t *p = src;
    float tmp[DSII_QK_K];
    for (int64_t i = 0; i < n; i += blck) {
        int64_t m = n - i < (int64_t)blck ? n - i : (int64_t)blck;
        if (m == (int64_t)blck) {
            deq(p, dst + i);
        } else { /* padded last block (FP8 types) */
            deq(p, tmp);
            memcpy(dst + i, tmp, (size_t)m * sizeof(float));
        }
        p += bytes;
    }
}

/* ---- Q8_0: f16 d; int8 qs[32]; x = d * q -------------------------------------------------- */

static void blk_q8_0(const uint8_t *b, float *y) {
    float d = dsii_f16_to_f32(ld16(b));
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}
static void deq_q8_0(const void *s, float *d, int64_t n) { deq_blocks(s, d, n, 32, 34, blk_q8_0); }
static float dot_q8_0(const void *s, const float *y, int64_t n) {
    return dot_blocks(s, y, n, 32, 34, blk_q8_0);
}
static size_t q_q8_0(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(src[i + j]));
        float d = amax / 127.0f;
        float id = d > 0.0f ? 1.0f / d : 0.0f;
        st16(p, dsii_f32_to_f16(d));
        for (int j = 0; j < 32; j++) {
            float v = roundf(src[i + j] * id);
            if (v > 127.0f) v = 127.0f;
            if (v < -127.0f) v = -127.0f;
            p[2 + j] = (uint8_t)(int8_t)v;
        }
    }
    return (size_t)(n / 32) * 34;
}

/* ---- Q4_K: f16 d; f16 dmin; scales[12] (8 × 6-bit scale, 8 × 6-bit min); qs[128] ------- */

static void q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void blk_q4_k(const uint8_t *b, float *y) {
    float d = dsii_f16_to_f32(ld16(b));
    float dmin = dsii_f16_to_f32(ld16(b + 2));
    const uint8_t *sc = b + 4;
    const uint8_t *q = b + 16;
    for (int c = 0; c < 4; c++) { /* 64 elements per chunk: sub-blocks 2c (low), 2c+1 (high) */
        uint8_t s0, m0, s1, m1;
        q4k_scale_min(2 * c, sc, &s0, &m0);
        q4k_scale_min(2 * c + 1, sc, &s1, &m1);
        float d0 = d * s0, mm0 = dmin * m0, d1 = d * s1, mm1 = dmin * m1;
        for (int l = 0; l < 32; l++) y[64 * c + l] = d0 * (float)(q[32 * c + l] & 0xF) - mm0;
        for (int l = 0; l < 32; l++) y[64 * c + 32 + l] = d1 * (float)(q[32 * c + l] >> 4) - mm1;
    }
}
static void deq_q4_k(const void *s, float *d, int64_t n) { deq_blocks(s, d, n, 256, 144, blk_q4_k); }
static float dot_q4_k(const void *s, const float *y, int64_t n) {
    return dot_blocks(s, y, n, 256, 144, blk_q4_k);
}

static uint8_t clamp_u(float v, int hi) {
    if (!(v > 0.0f)) return 0;
    if (v > (float)hi) return (uint8_t)hi;
    return (uint8_t)v;
}

/* Asymmetric round-to-nearest for k-quant sub-blocks: x ≈ d_eff * q - m_eff with q in
 * [0, qmax]. Sub-block scale (max-min)/qmax and min -min(0,x) are themselves quantized to
 * `sbits` bits against the super-block d / dmin (f16). */
void dsii_kquant_block(const float *x, int nsub, int sublen, int qmax, int smax, uint8_t *ls,
                       uint8_t *lm, uint16_t *dh, uint16_t *dminh, uint8_t *q) {
    float scale[16], minv[16];
    float maxs = 0.0f, maxm = 0.0f;
    for (int s = 0; s < nsub; s++) {
        float mn = 0.0f, mx = 0.0f;
        for (int l = 0; l < sublen; l++) {
            float v = x[s * sublen + l];
            if (v < mn) mn = v;
            if (v > mx) mx = v;
        }
        scale[s] = (mx - mn) / (float)qmax;
        minv[s] = -mn;
        maxs = fmaxf(maxs, scale[s]);
        maxm = fmaxf(maxm, minv[s]);
    }
    *dh = dsii_f32_to_f16(maxs / (float)smax);
    *dminh = dsii_f32_to_f16(maxm / (float)smax);
    float d = dsii_f16_to_f32(*dh), dmin = dsii_f16_to_f32(*dminh);
    for (int s = 0; s < nsub; s++) {
        /* Round the scale up so that the sub-block's range still fits qmax steps; the min
         * rounds to nearest. */
        ls[s] = d > 0.0f ? clamp_u(ceilf(scale[s] / d), smax) : 0;
        lm[s] = dmin > 0.0f ? clamp_u(roundf(minv[s] / dmin), smax) : 0;
        float de = d * ls[s], me = dmin * lm[s];
        for (int l = 0; l < sublen; l++) {
            float v = x[s * sublen + l];
            q[s * sublen + l] = de > 0.0f ? clamp_u(roundf((v + me) / de), qmax) : 0;
        }
    }
}

void dsii_k4_pack_scales(const uint8_t *ls, const uint8_t *lm, uint8_t *sc) {
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] |= ls[j] & 63;
            sc[j + 4] |= lm[j] & 63;
        } else {
            sc[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

static size_t q_q4_k(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 144) {
        uint8_t ls[16], lm[16], q[256];
        uint16_t dh, dminh;
        dsii_kquant_block(src + i, 8, 32, 15, 63, ls, lm, &dh, &dminh, q);
        st16(p, dh);
        st16(p + 2, dminh);
        dsii_k4_pack_scales(ls, lm, p + 4);
        uint8_t *qs = p + 16;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
    return (size_t)(n / 256) * 144;
}

/* ---- Q2_K: scales[16] (4-bit scale | 4-bit min << 4); qs[64]; f16 d; f16 dmin ------------- */

static void blk_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b;
    const uint8_t *q = b + 16;
    float d = dsii_f16_to_f32(ld16(b + 80));
    float dmin = dsii_f16_to_f32(ld16(b + 82));
    /* element e = 128*h + 32*j + l (h 0..1, j 0..3, l 0..31) is bits 2j..2j+1 of
     * qs[32*h + l]; its sub-block (scale index) is e / 16. */
    for (int e = 0; e < 256; e++) {
        int h = e >> 7, j = (e >> 5) & 3, l = e & 31;
        int qv = (q[32 * h + l] >> (2 * j)) & 3;
        uint8_t s = sc[e >> 4];
        y[e] = d * (float)(s & 0xF) * (float)qv - dmin * (float)(s >> 4);
    }
}
static void deq_q2_k(const void *s, float *d, int64_t n) { deq_blocks(s, d, n, 256, 84, blk_q2_k); }
static float dot_q2_k(const void *s, const float *y, int64_t n) {
    return dot_blocks(s, y, n, 256, 84, blk_q2_k);
}
static size_t q_q2_k(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 84) {
        uint8_t ls[16], lm[16], q[256];
        uint16_t dh, dminh;
        dsii_kquant_block(src + i, 16, 16, 3, 15, ls, lm, &dh, &dminh, q);
        for (int s = 0; s < 16; s++) p[s] = (uint8_t)(ls[s] | (lm[s] << 4));
        uint8_t *qs = p + 16;
        memset(qs, 0, 64);
        for (int e = 0; e < 256; e++) {
            int h = e >> 7, j = (e >> 5) & 3, l = e & 31;
            qs[32 * h + l] |= (uint8_t)(q[e] << (2 * j));
        }
        st16(p + 80, dh);
        st16(p + 82, dminh);
    }
    return (size_t)(n / 256) * 84;
}

/* ---- MXFP4 (ggml): u8 e (E8M0); qs[16]; element j = low nibble of qs[j], element j+16 =
 * high nibble of qs[j]; x = e2m1(nibble) * 2^(e-127) ------------------------------------- */

static void blk_mxfp4(const uint8_t *b, float *y) {
    float s = dsii_e8m0_to_f32(b[0]);
    for (int j = 0; j < 16; j++) {
        y[j] = dsii_e2m1_to_f32(b[1 + j] & 0xF) * s;
        y[j + 16] = dsii_e2m1_to_f32(b[1 + j] >> 4) * s;
    }
}
static void deq_mxfp4(const void *s, float *d, int64_t n) { deq_blocks(s, d, n, 32, 17, blk_mxfp4); }
static float dot_mxfp4(const void *s, const float *y, int64_t n) {
    return dot_blocks(s, y, n, 32, 17, blk_mxfp4);
}
static size_t q_mxfp4(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 17) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(src[i + j]));
        /* model-spec §10.1 scale rule for e2m1 with UE8M0 scale */
        uint8_t e = amax > 0.0f ? dsii_e8m0_ceil(amax * (1.0f / 6.0f)) : 127;
        float s = dsii_e8m0_to_f32(e);
        p[0] = e;
        for (int j = 0; j < 16; j++) {
            uint8_t lo = dsii_f32_to_e2m1(src[i + j] / s);
            uint8_t hi = dsii_f32_to_e2m1(src[i + j + 16] / s);
            p[1 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
    return (size_t)(n / 32) * 17;
}

/* ---- FP8 E4M3 with E8M0 block scale (libdsinfer): u8 e; u8 v[B]; x = e4m3(v) * 2^(e-127).
 * Rows need not be a multiple of B: the last block is padded with 0x00 bytes. ------------- */

static void blk_fp8_128(const uint8_t *b, float *y) {
    float s = dsii_e8m0_to_f32(b[0]);
    for (int j = 0; j < 128; j++) y[j] = dsii_e4m3_to_f32(b[1 + j]) * s;
}
static void blk_fp8_32(const uint8_t *b, float *y) {
    float s = dsii_e8m0_to_f32(b[0]);
    for (int j = 0; j < 32; j++) y[j] = dsii_e4m3_to_f32(b[1 + j]) * s;
}
static void deq_fp8_128(const void *s, float *d, int64_t n) {
    deq_blocks(s, d, n, 128, 129, blk_fp8_128);
}
static float dot_fp8_128(const void *s, const float *y, int64_t n) {
    return dot_blocks(s, y, n, 128, 129, blk_fp8_128);
}
static void deq_fp8_32(const void *s, float *d, int64_t n) { deq_blocks(s, d, n, 32, 33, blk_fp8_32); }
static float dot_fp8_32(const void *s, const float *y, int64_t n) {
    return dot_blocks(s, y, n, 32, 33, blk_fp8_32);
}

static uint8_t fp8_scale_for(float amax) {
    /* model-spec §10.1: s = 2^ceil(log2(amax / 448)); an all-zero block gets s = 1 */
    return amax > 0.0f ? dsii_e8m0_ceil(amax * (1.0f / 448.0f)) : 127;
}

static void fp8_encode_block(const float *x, int64_t m, uint32_t blck, uint8_t e, uint8_t *p) {
    float s = dsii_e8m0_to_f32(e);
    p[0] = e;
    for (int64_t j = 0; j < m; j++) p[1 + j] = dsii_f32_to_e4m3(x[j] / s);
    for (int64_t j = m; j < (int64_t)blck; j++) p[1 + j] = 0;
}

static size_t q_fp8(const float *src, void *dst, int64_t n, uint32_t blck) {
    uint8_t *p = dst;
    size_t bytes = 0;
    for (int64_t i = 0; i < n; i += blck) {
        int64_t m = n - i < (int64_t)blck ? n - i : (int64_t)blck;
        float amax = 0.0f;
        for (int64_t j = 0; j < m; j++) amax = fmaxf(amax, fabsf(src[i + j]));
        fp8_encode_block(src + i, m, blck, fp8_scale_for(amax), p);
        p += blck + 1;
        bytes += blck + 1;
    }
    return bytes;
}
static size_t q_fp8_128(const float *s, void *d, int64_t n) { return q_fp8(s, d, n, 128); }
static size_t q_fp8_32(const float *s, void *d, int64_t n) { return q_fp8(s, d, n, 32); }

/* ---- the table -------------------------------------------------------------------------- */

/* ggml types whose decoders / quantizers live in quant_ggml.c. */
#define GGML_TYPE(NAME, B, S)                                                                  \
    static void deq_##NAME(const void *s, float *d, int64_t n) {                               \
        deq_blocks(s, d, n, B, S, dsii_blk_##NAME);                                            \
    }                                                                                          \
    static float dot_##NAME(const void *s, const float *y, int64_t n) {                        \
        return dot_blocks(s, y, n, B, S, dsii_blk_##NAME);                                     \
    }                                                                                          \
    static size_t q_##NAME(const float *src, void *dst, int64_t n) {                           \
        return dsii_q_##NAME(src, dst, n, NULL);                                               \
    }
GGML_TYPE(q4_0, 32, 18)
GGML_TYPE(q4_1, 32, 20)
GGML_TYPE(q5_0, 32, 22)
GGML_TYPE(q5_1, 32, 24)
GGML_TYPE(q3_k, 256, 110)
GGML_TYPE(q5_k, 256, 176)
GGML_TYPE(q6_k, 256, 210)
GGML_TYPE(iq2_xxs, 256, 66)
GGML_TYPE(iq2_xs, 256, 74)
GGML_TYPE(iq3_xxs, 256, 98)
GGML_TYPE(iq1_s, 256, 50)
GGML_TYPE(iq4_nl, 32, 18)
GGML_TYPE(iq3_s, 256, 110)
GGML_TYPE(iq2_s, 256, 82)
GGML_TYPE(iq4_xs, 256, 136)
GGML_TYPE(iq1_m, 256, 56)

/* Geometry comes from the shared table (backends/types.h); this file adds the reference
 * kernels. A type without an entry here is known (sized, validated) but unsupported. */
typedef struct type_impl {
    int32_t type;
    dsii_dequantize_row_fn deq;
    dsii_dot_fn dot;
    dsii_quantize_row_fn quant;
    dsii_quantize_row_w_fn quant_w; /* importance-weighted quantizer, or NULL */
} type_impl;

/* A ggml type of quant_ggml.c; W: 1 when its quantizer uses importance weights. */
#define T_GGML(ID, NAME, W) {ID, deq_##NAME, dot_##NAME, q_##NAME, (W) ? dsii_q_##NAME : NULL}

static const type_impl k_impl[] = {
    {DSI_TYPE_F32, deq_f32, dot_f32, q_f32, NULL},
    {DSI_TYPE_F16, deq_f16, dot_f16, q_f16, NULL},
    {DSI_TYPE_Q8_0, deq_q8_0, dot_q8_0, q_q8_0, NULL},
    {DSI_TYPE_Q2_K, deq_q2_k, dot_q2_k, q_q2_k, NULL},
    {DSI_TYPE_Q4_K, deq_q4_k, dot_q4_k, q_q4_k, NULL},
    {DSI_TYPE_I8, deq_i8, dot_i8, NULL, NULL},
    {DSI_TYPE_I16, deq_i16, dot_i16, NULL, NULL},
    {DSI_TYPE_I32, deq_i32, dot_i32, NULL, NULL},
    {DSI_TYPE_I64, deq_i64, dot_i64, NULL, NULL},
    {DSI_TYPE_F64, deq_f64, dot_f64, NULL, NULL},
    {DSI_TYPE_BF16, deq_bf16, dot_bf16, q_bf16, NULL},
    {DSI_TYPE_MXFP4, deq_mxfp4, dot_mxfp4, q_mxfp4, NULL},
    {DSI_TYPE_FP8_E4M3_B128, deq_fp8_128, dot_fp8_128, q_fp8_128, NULL},
    {DSI_TYPE_FP8_E4M3_B32, deq_fp8_32, dot_fp8_32, q_fp8_32, NULL},
    {DSI_TYPE_FP8_E4M3_R32, deq_fp8_32, dot_fp8_32, q_fp8_32, NULL},
    T_GGML(2, q4_0, 1),
    T_GGML(3, q4_1, 0),
    T_GGML(6, q5_0, 1),
    T_GGML(7, q5_1, 0),
    T_GGML(11, q3_k, 1),
    T_GGML(13, q5_k, 0),
    T_GGML(14, q6_k, 1),
    T_GGML(DSI_TYPE_IQ2_XXS, iq2_xxs, 1),
    T_GGML(17, iq2_xs, 1),
    T_GGML(18, iq3_xxs, 1),
    T_GGML(19, iq1_s, 1),
    T_GGML(20, iq4_nl, 1),
    T_GGML(21, iq3_s, 1),
    T_GGML(22, iq2_s, 1),
    T_GGML(23, iq4_xs, 1),
    T_GGML(29, iq1_m, 1),
};

#define TRAITS_GEOM_(id, nm, b, sz, rm, q) {id, nm, b, sz, rm, q, 0, 0, NULL, NULL, NULL, NULL},
static dsii_type_traits g_traits[] = {DSIB_TYPE_TABLE(TRAITS_GEOM_)};
#undef TRAITS_GEOM_
static pthread_once_t g_traits_once = PTHREAD_ONCE_INIT;

static void traits_init(void) {
    for (size_t i = 0; i < sizeof g_traits / sizeof g_traits[0]; i++)
        for (size_t k = 0; k < sizeof k_impl / sizeof k_impl[0]; k++)
            if (k_impl[k].type == g_traits[i].type) {
                g_traits[i].supported = 1;
                g_traits[i].dequantize_row = k_impl[k].deq;
                g_traits[i].dot = k_impl[k].dot;
                g_traits[i].quantize_row = k_impl[k].quant;
                g_traits[i].quantize_row_w = k_impl[k].quant_w;
            }
}

int32_t dsii_type_by_name(const char *name) {
    pthread_once(&g_traits_once, traits_init);
    for (size_t i = 0; name && i < sizeof g_traits / sizeof g_traits[0]; i++)
        if (!strcmp(g_traits[i].name, name)) return g_traits[i].type;
    return -1;
}

const dsii_type_traits *dsii_type_get(int32_t type) {
    pthread_once(&g_traits_once, traits_init);
    for (size_t i = 0; i < sizeof g_traits / sizeof g_traits[0]; i++)
        if (g_traits[i].type == type) return &g_traits[i];
    return NULL;
}

DSI_API const char *dsi_type_name(int32_t type) {
    const dsii_type_traits *t = dsii_type_get(type);
    return t ? t->name : NULL;
}

int dsii_type_row_size(int32_t type, int64_t ne0, uint64_t *bytes) {
    const dsii_type_traits *t = dsii_type_get(type);
    if (!t || ne0 < 0) return 0;
    uint64_t n = (uint64_t)ne0;
    if (t->row_multiple && n % t->blck != 0) return 0;
    uint64_t nb = n / t->blck + (n % t->blck != 0);
    uint64_t r;
    if (!dsii_mul_u64(nb, t->type_size, &r)) return 0;
    *bytes = r;
    return 1;
}

int dsii_type_nbytes(int32_t type, const int64_t *ne, uint32_t n_dims, uint64_t *bytes) {
    if (!ne || n_dims < 1 || n_dims > 4) return 0;
    uint64_t r;
    if (!dsii_type_row_size(type, ne[0], &r)) return 0;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (ne[d] < 0 || !dsii_mul_u64(r, (uint64_t)ne[d], &r)) return 0;
    }
    *bytes = r;
    return 1;
}

static dsi_status check_type(int32_t type, int64_t n, int need_quant, const dsii_type_traits **out,
                             dsii_error *err) {
    const dsii_type_traits *t = dsii_type_get(type);
    if (!t) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "unknown tensor type id %d", (int)type);
    if (need_quant ? !t->quantize_row : !t->supported)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "tensor type %s is not supported%s", t->name,
                         need_quant ? " for quantization" : "");
    if (n < 0 || (t->row_multiple && n % t->blck != 0))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "%lld elements is not a whole number of %s blocks (%u)", (long long)n,
                         t->name, (unsigned)t->blck);
    *out = t;
    return DSI_OK;
}

dsi_status dsii_dequantize_row(int32_t type, const void *src, float *dst, int64_t n,
                               dsii_error *err) {
    const dsii_type_traits *t;
    dsi_status st = check_type(type, n, 0, &t, err);
    if (st != DSI_OK) return st;
    if (n > 0) t->dequantize_row(src, dst, n);
    return DSI_OK;
}

dsi_status dsii_dot_row(int32_t type, const void *src, const float *y, int64_t n, float *out,
                        dsii_error *err) {
    const dsii_type_traits *t;
    dsi_status st = check_type(type, n, 0, &t, err);
    if (st != DSI_OK) return st;
    *out = n > 0 ? t->dot(src, y, n) : 0.0f;
    return DSI_OK;
}

dsi_status dsii_quantize_row(int32_t type, const float *src, void *dst, int64_t n,
                             dsii_error *err) {
    const dsii_type_traits *t;
    dsi_status st = check_type(type, n, 1, &t, err);
    if (st != DSI_OK) return st;
    if (n > 0) t->quantize_row(src, dst, n);
    return DSI_OK;
}

dsi_status dsii_quantize_row_imat(int32_t type, const float *src, void *dst, int64_t n,
                                  const float *imat, dsii_error *err) {
    const dsii_type_traits *t;
    dsi_status st = check_type(type, n, 1, &t, err);
    if (st != DSI_OK) return st;
    if (n > 0) {
        if (t->quantize_row_w) t->quantize_row_w(src, dst, n, imat);
        else t->quantize_row(src, dst, n);
    }
    return DSI_OK;
}

dsi_status dsii_quantize_fp8_2d(int32_t type, const float *src, int64_t cols, int64_t rows,
                                void *dst, dsii_error *err) {
    uint32_t bs;
    if (type == DSI_TYPE_FP8_E4M3_B128) bs = 128;
    else if (type == DSI_TYPE_FP8_E4M3_B32) bs = 32;
    else if (type == DSI_TYPE_FP8_E4M3_R32) bs = 1; /* per-row scales */
    else
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "type %d is not an FP8 block type",
                         (int)type);
    if (cols < 0 || rows < 0 || !src || (!dst && cols && rows))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "bad FP8 matrix arguments");
    uint32_t blck = type == DSI_TYPE_FP8_E4M3_B128 ? 128 : 32;
    uint64_t row_bytes;
    if (!dsii_type_row_size(type, cols, &row_bytes))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "FP8 row of %lld elements too large",
                         (long long)cols);
    uint8_t *out = dst;
    for (int64_t r0 = 0; r0 < rows; r0 += bs) {
        int64_t nr = rows - r0 < (int64_t)bs ? rows - r0 : (int64_t)bs;
        for (int64_t c0 = 0; c0 < cols; c0 += blck) {
            int64_t nc = cols - c0 < (int64_t)blck ? cols - c0 : (int64_t)blck;
            float amax = 0.0f;
            for (int64_t r = r0; r < r0 + nr; r++)
                for (int64_t c = c0; c < c0 + nc; c++)
                    amax = fmaxf(amax, fabsf(src[r * cols + c]));
            uint8_t e = fp8_scale_for(amax);
            for (int64_t r = r0; r < r0 + nr; r++)
                fp8_encode_block(src + r * cols + c0, nc, blck, e,
                                 out + (uint64_t)r * row_bytes + (uint64_t)(c0 / blck) * (blck + 1));
        }
    }
    return DSI_OK;
}
