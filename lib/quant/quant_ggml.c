/*
 * Reference decoders and writer quantizers of the further ggml weight types (see
 * quant_ggml.h; layouts in docs/tensor-types.md). Bytes are read with explicit
 * little-endian loads. Each decoder evaluates the same float expressions in the same order
 * as ggml's dequantize_row_* so that values are bit-identical to llama.cpp's.
 */
#include "quant/quant_ggml.h"

#include "quant/fp.h"
#include "quant/ggml_tables.h"

#include <math.h>
#include <string.h>

static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}
static inline float h2f(const uint8_t *p) { return dsii_f16_to_f32(ld16(p)); }
/* Byte j of a packed grid entry. */
static inline int gb64(uint64_t g, int j) { return (int)((g >> (8 * j)) & 0xFF); }
static inline int gb32(uint32_t g, int j) { return (int)((g >> (8 * j)) & 0xFF); }

/* ======================================================================================== */
/* Decoders                                                                                  */
/* ======================================================================================== */

/* q4_0: f16 d; qs[16]. x[j] = (lo(qs[j]) - 8) d, x[j+16] = (hi(qs[j]) - 8) d */
void dsii_blk_q4_0(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

/* q4_1: f16 d; f16 m; qs[16]. x = q d + m */
void dsii_blk_q4_1(const uint8_t *b, float *y) {
    const float d = h2f(b), m = h2f(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 0xF) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

/* q5_0: f16 d; qh (u32: bit i = 5th bit of element i); qs[16]. x = (q - 16) d */
void dsii_blk_q5_0(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint32_t qh = ld32(b + 2);
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
        int x1 = (int)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

/* q5_1: f16 d; f16 m; qh; qs[16]. x = q d + m */
void dsii_blk_q5_1(const uint8_t *b, float *y) {
    const float d = h2f(b), m = h2f(b + 2);
    const uint32_t qh = ld32(b + 4);
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((b[8 + j] & 0xF) | (((qh >> j) & 1) << 4));
        int x1 = (int)((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* q3_k: hmask[32]; qs[64]; scales[12] (16 × 6 bits); f16 d. Element e = 128h + 32j + l:
 * q = (qs[32h + l] >> 2j) & 3, minus 4 unless bit 4h + j of hmask[l] is set; sub-block
 * s = e / 16 with 6-bit scale (low nibble | 2 high bits) - 32. x = (d (sc - 32)) q */
static int q3k_scale(const uint8_t *sc, int s) {
    int lo = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;
    int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}
void dsii_blk_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    const float d = h2f(b + 108);
    for (int e0 = 0; e0 < 256; e0 += 16) { /* one sub-block of 16 */
        const float dl = d * (float)q3k_scale(sc, e0 >> 4);
        const int h = e0 >> 7, j = (e0 >> 5) & 3;
        for (int e = e0; e < e0 + 16; e++) {
            const int l = e & 31;
            int q = (qs[32 * h + l] >> (2 * j)) & 3;
            if (!(hm[l] & (1u << (4 * h + j)))) q -= 4;
            y[e] = dl * (float)q;
        }
    }
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j (ggml get_scale_min_k4). */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* q5_k: f16 d; f16 dmin; scales[12] (as q4_k); qh[32]; qs[128]. Element e = 64c + 32u + l:
 * q = nibble u of qs[32c + l] | bit (2c + u) of qh[l] << 4; x = (d sc) q - dmin m */
void dsii_blk_q5_k(const uint8_t *b, float *y) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    for (int c = 0; c < 4; c++) {
        for (int u = 0; u < 2; u++) {
            int s, m;
            k4_scale_min(2 * c + u, sc, &s, &m);
            const float d1 = d * (float)s, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int q = (u ? ql[32 * c + l] >> 4 : ql[32 * c + l] & 0xF) +
                        ((qh[l] >> (2 * c + u)) & 1 ? 16 : 0);
                y[64 * c + 32 * u + l] = d1 * (float)q - m1;
            }
        }
    }
}

/* q6_k: ql[128]; qh[64]; int8 scales[16]; f16 d. Element e = 128h + 32k + l (k 0..3):
 * low 4 bits = nibble (k >> 1) of ql[64h + 32(k & 1) + l], high 2 bits = bits 2k..2k+1 of
 * qh[32h + l]; q - 32; sub-block e / 16. x = (d sc) q */
void dsii_blk_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = h2f(b + 208);
    for (int e0 = 0; e0 < 256; e0 += 16) {
        const float ds = d * (float)sc[e0 >> 4];
        const int h = e0 >> 7, k = (e0 >> 5) & 3;
        for (int e = e0; e < e0 + 16; e++) {
            const int l = e & 31;
            int lo = ql[64 * h + 32 * (k & 1) + l];
            lo = (k >> 1) ? lo >> 4 : lo & 0xF;
            const int q = (lo | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
            y[e] = ds * (float)q;
        }
    }
}

/* iq4_nl: f16 d; qs[16]. x[j] = d kvalues[lo(qs[j])], x[j+16] = d kvalues[hi(qs[j])] */
void dsii_blk_iq4_nl(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)dsii_kvalues_iq4nl[b[2 + j] & 0xF];
        y[j + 16] = d * (float)dsii_kvalues_iq4nl[b[2 + j] >> 4];
    }
}

/* iq4_xs: f16 d; u16 scales_h; scales_l[4]; qs[128]. Sub-block s (32 elements): 6-bit
 * ls = nibble (s & 1) of scales_l[s / 2] | bits 2s..2s+1 of scales_h << 4;
 * x = (d (ls - 32)) kvalues[q], nibbles as iq4_nl over qs[16s .. 16s + 16) */
void dsii_blk_iq4_xs(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint16_t sh = ld16(b + 2);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < 8; s++) {
        int ls = ((sl[s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
        const float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            y[32 * s + j] = dl * (float)dsii_kvalues_iq4nl[qs[16 * s + j] & 0xF];
            y[32 * s + 16 + j] = dl * (float)dsii_kvalues_iq4nl[qs[16 * s + j] >> 4];
        }
    }
}

static inline float sgn(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.0f : 1.0f; }

/* iq2_xxs: f16 d; 8 × (4 grid bytes, u32 w). Sub-block s: bytes 2+8s..: grid indices
 * g0..g3, then w: scale w >> 28, sign index of group l = (w >> 7l) & 127.
 * x = ((d (0.5 + scale)) 0.25) grid[g_l][j] (−1 if bit j of ksigns[...]) */
void dsii_blk_iq2_xxs(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint8_t *q = b + 2 + 8 * s;
        const uint32_t w = ld32(q + 4);
        const float db = d * (0.5f + (float)(w >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const uint64_t g = dsii_iq2xxs_grid[q[l]];
            const uint8_t signs = dsii_ksigns_iq2xs[(w >> (7 * l)) & 127];
            for (int j = 0; j < 8; j++) y[32 * s + 8 * l + j] = db * (float)gb64(g, j) * sgn(signs, j);
        }
    }
}

/* iq2_xs: f16 d; u16 qs[32] (9-bit grid index | 7-bit sign index << 9); scales[8] (two
 * 4-bit scales per 32: low nibble for groups 0-1, high for 2-3) */
void dsii_blk_iq2_xs(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint8_t sc = b[66 + s];
        const float db0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
        const float db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const uint16_t q = ld16(b + 2 + 2 * (4 * s + l));
            const uint64_t g = dsii_iq2xs_grid[q & 511];
            const uint8_t signs = dsii_ksigns_iq2xs[q >> 9];
            const float db = l < 2 ? db0 : db1;
            for (int j = 0; j < 8; j++) y[32 * s + 8 * l + j] = db * (float)gb64(g, j) * sgn(signs, j);
        }
    }
}

/* iq2_s: f16 d; qs[32] grid index low bits; signs[32] (8 explicit sign bits per group);
 * qh[8] (bits 2l..2l+1 of qh[s] = index bits 8..9 of group l); scales[8] as iq2_xs */
void dsii_blk_iq2_s(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *scales = b + 74;
    for (int s = 0; s < 8; s++) {
        const float db0 = d * (0.5f + (float)(scales[s] & 0xF)) * 0.25f;
        const float db1 = d * (0.5f + (float)(scales[s] >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const int idx = qs[4 * s + l] | (((qh[s] >> (2 * l)) & 3) << 8);
            const uint64_t g = dsii_iq2s_grid[idx];
            const float dl = l < 2 ? db0 : db1;
            for (int j = 0; j < 8; j++)
                y[32 * s + 8 * l + j] = dl * (float)gb64(g, j) * sgn(signs[4 * s + l], j);
        }
    }
}

/* iq3_xxs: f16 d; qs[64] (grid indices, 8 per sub-block, 4 values each); u32 w[8]:
 * scale w >> 28, sign index of group l (8 values = two grid entries) (w >> 7l) & 127.
 * x = ((d (0.5 + scale)) 0.5) grid[..][j] ± */
void dsii_blk_iq3_xxs(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int s = 0; s < 8; s++) {
        const uint32_t w = ld32(b + 66 + 4 * s);
        const float db = d * (0.5f + (float)(w >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = dsii_ksigns_iq2xs[(w >> (7 * l)) & 127];
            const uint32_t g1 = dsii_iq3xxs_grid[qs[8 * s + 2 * l]];
            const uint32_t g2 = dsii_iq3xxs_grid[qs[8 * s + 2 * l + 1]];
            for (int j = 0; j < 4; j++) {
                y[32 * s + 8 * l + j] = db * (float)gb32(g1, j) * sgn(signs, j);
                y[32 * s + 8 * l + 4 + j] = db * (float)gb32(g2, j) * sgn(signs, j + 4);
            }
        }
    }
}

/* iq3_s: f16 d; qs[64] (low 8 bits of 9-bit grid indices); qh[8] (bit k of qh[s] = bit 8
 * of index k of sub-block s); signs[32] (8 explicit bits per group); scales[4] (4-bit per
 * sub-block: low nibble even s, high odd s). x = (d (1 + 2 scale)) grid[..][j] ± */
void dsii_blk_iq3_s(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *scales = b + 106;
    for (int s = 0; s < 8; s++) {
        const int sc = (scales[s / 2] >> (4 * (s & 1))) & 0xF;
        const float db = d * (float)(1 + 2 * sc);
        for (int l = 0; l < 4; l++) {
            const int i1 = qs[8 * s + 2 * l] | (((qh[s] >> (2 * l)) & 1) << 8);
            const int i2 = qs[8 * s + 2 * l + 1] | (((qh[s] >> (2 * l + 1)) & 1) << 8);
            const uint32_t g1 = dsii_iq3s_grid[i1], g2 = dsii_iq3s_grid[i2];
            const uint8_t sg = signs[4 * s + l];
            for (int j = 0; j < 4; j++) {
                y[32 * s + 8 * l + j] = db * (float)gb32(g1, j) * sgn(sg, j);
                y[32 * s + 8 * l + 4 + j] = db * (float)gb32(g2, j) * sgn(sg, j + 4);
            }
        }
    }
}

#define IQ1_DELTA 0.125f /* ggml IQ1S_DELTA / IQ1M_DELTA */

/* iq1_s: f16 d; qs[32] (low 8 bits of 11-bit grid indices); u16 qh[8]: bits 3l..3l+2 =
 * index bits 8..10 of group l, bits 12..14 = 3-bit scale, bit 15 = delta sign.
 * x = (d (2 scale + 1)) (grid[..][j] + delta), delta = ±0.125 */
void dsii_blk_iq1_s(const uint8_t *b, float *y) {
    const float d = h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint16_t qh = ld16(b + 34 + 2 * s);
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
        for (int l = 0; l < 4; l++) {
            const uint64_t g = dsii_iq1s_grid[b[2 + 4 * s + l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; j++) y[32 * s + 8 * l + j] = dl * ((float)(int8_t)gb64(g, j) + delta);
        }
    }
}

/* iq1_m: qs[32]; qh[16] (per group pair: low 3 bits / bits 4..6 = index bits 8..10 of
 * groups 2k / 2k+1, bit 3 / bit 7 = their delta signs); scales[8] as u16 sc[4]: bits
 * 6(s&1)..+2 and +3..+5 of sc[s/2] = 3-bit scales of the two 16-element halves of
 * sub-block s; bits 12..15 of sc[0..3] = the f16 d, nibble by nibble. */
void dsii_blk_iq1_m(const uint8_t *b, float *y) {
    const uint8_t *qs = b, *qh = b + 32;
    uint16_t sc[4];
    for (int k = 0; k < 4; k++) sc[k] = ld16(b + 48 + 2 * k);
    const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) |
                                   ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
    const float d = dsii_f16_to_f32(dh);
    for (int s = 0; s < 8; s++) {
        const float dl1 = d * (float)(2 * ((sc[s / 2] >> (6 * (s % 2))) & 7) + 1);
        const float dl2 = d * (float)(2 * ((sc[s / 2] >> (6 * (s % 2) + 3)) & 7) + 1);
        for (int l = 0; l < 4; l++) {
            const uint8_t h = qh[2 * s + l / 2];
            const int shift = 4 * (l & 1);
            const int idx = qs[4 * s + l] | (((h >> shift) & 7) << 8);
            const float delta = (h >> shift) & 8 ? -IQ1_DELTA : IQ1_DELTA;
            const uint64_t g = dsii_iq1s_grid[idx];
            const float dl = l < 2 ? dl1 : dl2;
            for (int j = 0; j < 8; j++) y[32 * s + 8 * l + j] = dl * ((float)(int8_t)gb64(g, j) + delta);
        }
    }
}

/* ======================================================================================== */
/* Quantizers (libdsinfer's own; docs/tensor-types.md "Writer quantizers")                  */
/* ======================================================================================== */

static inline int iround(float v) { return (int)lrintf(v); } /* ties to even, deterministic */
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Squared-error weights of one super-block (or block) of n values: importance (1 without an
 * importance matrix) times sqrt(sigma2 + x^2), sigma2 = 2 mean(x^2), so that large values
 * and a block's typical magnitude both count. Blocks whose importance is all zero fall back
 * to importance 1. */
static void err_weights(const float *x, const float *imat, int n, float *w) {
    float s2 = 0.0f;
    for (int i = 0; i < n; i++) s2 += x[i] * x[i];
    const float sigma2 = 2.0f * s2 / (float)n;
    float tot = 0.0f;
    for (int i = 0; i < n; i++) {
        w[i] = (imat ? imat[i] : 1.0f) * sqrtf(sigma2 + x[i] * x[i]);
        tot += w[i];
    }
    if (!(tot > 0.0f))
        for (int i = 0; i < n; i++) w[i] = sqrtf(sigma2 + x[i] * x[i]) + 1e-30f;
}

/* Symmetric integer fit of n values to q in [qmin, qmax] (x ≈ scale q): tries scales that map
 * the largest-magnitude value to qmin + t/8 (t = -4..4, `nmax` = |qmin|), refits each scale by
 * weighted least squares for its rounding, keeps the smallest weighted error. Writes q (not
 * clamped again later); returns the scale (0 for an all-zero input). */
static float sym_fit(const float *x, const float *w, int n, int qmin, int qmax, int *q) {
    float amax = 0.0f, mx = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
    if (amax == 0.0f) {
        for (int i = 0; i < n; i++) q[i] = 0;
        return 0.0f;
    }
    float best_err = INFINITY, best = 0.0f;
    int tmp[256];
    for (int t = -4; t <= 4; t++) {
        const float iscale = ((float)qmin + 0.125f * (float)t) / mx;
        float sxq = 0.0f, sqq = 0.0f;
        for (int i = 0; i < n; i++) {
            tmp[i] = clampi(iround(x[i] * iscale), qmin, qmax);
            sxq += w[i] * x[i] * (float)tmp[i];
            sqq += w[i] * (float)tmp[i] * (float)tmp[i];
        }
        if (!(sqq > 0.0f)) continue;
        const float sc = sxq / sqq;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float e = x[i] - sc * (float)tmp[i];
            err += w[i] * e * e;
        }
        if (err < best_err) {
            best_err = err;
            best = sc;
            memcpy(q, tmp, sizeof(int) * (size_t)n);
        }
    }
    return best;
}

/* Rounds q = x / scale into [qmin, qmax] (scale 0 → 0). */
static void requant(const float *x, int n, float scale, int qmin, int qmax, int *q) {
    const float id = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int i = 0; i < n; i++) q[i] = clampi(iround(x[i] * id), qmin, qmax);
}

/* ---- legacy 32-element types ------------------------------------------------------------ */

size_t dsii_q_q4_0(const float *src, void *dst, int64_t n, const float *imat) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 18) {
        float w[32];
        int q[32];
        err_weights(src + i, imat ? imat + i : NULL, 32, w);
        float d = sym_fit(src + i, w, 32, -8, 7, q);
        uint16_t dh = dsii_f32_to_f16(d);
        requant(src + i, 32, dsii_f16_to_f32(dh), -8, 7, q);
        st16(p, dh);
        for (int j = 0; j < 16; j++) p[2 + j] = (uint8_t)((q[j] + 8) | ((q[j + 16] + 8) << 4));
    }
    return (size_t)(n / 32) * 18;
}

size_t dsii_q_q5_0(const float *src, void *dst, int64_t n, const float *imat) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 22) {
        float w[32];
        int q[32];
        err_weights(src + i, imat ? imat + i : NULL, 32, w);
        float d = sym_fit(src + i, w, 32, -16, 15, q);
        uint16_t dh = dsii_f32_to_f16(d);
        requant(src + i, 32, dsii_f16_to_f32(dh), -16, 15, q);
        st16(p, dh);
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)(((q[j] + 16) >> 4) & 1) << j;
        for (int k = 0; k < 4; k++) p[2 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < 16; j++)
            p[6 + j] = (uint8_t)(((q[j] + 16) & 0xF) | (((q[j + 16] + 16) & 0xF) << 4));
    }
    return (size_t)(n / 32) * 22;
}

/* Asymmetric: m = min x (f16), d = (max - m) / qmax (f16), q = round((x - m) / d). */
static void asym_block(const float *x, int qmax, uint16_t *dh, uint16_t *mh, int *q) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    *mh = dsii_f32_to_f16(mn);
    const float m = dsii_f16_to_f32(*mh);
    *dh = dsii_f32_to_f16((mx - m) / (float)qmax);
    const float d = dsii_f16_to_f32(*dh);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) q[j] = clampi(iround((x[j] - m) * id), 0, qmax);
}

size_t dsii_q_q4_1(const float *src, void *dst, int64_t n, const float *imat) {
    (void)imat;
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 20) {
        int q[32];
        uint16_t dh, mh;
        asym_block(src + i, 15, &dh, &mh, q);
        st16(p, dh);
        st16(p + 2, mh);
        for (int j = 0; j < 16; j++) p[4 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
    return (size_t)(n / 32) * 20;
}

size_t dsii_q_q5_1(const float *src, void *dst, int64_t n, const float *imat) {
    (void)imat;
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 24) {
        int q[32];
        uint16_t dh, mh;
        asym_block(src + i, 31, &dh, &mh, q);
        st16(p, dh);
        st16(p + 2, mh);
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        for (int k = 0; k < 4; k++) p[4 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < 16; j++) p[8 + j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    }
    return (size_t)(n / 32) * 24;
}

/* ---- K types ------------------------------------------------------------------------------ */

/* Symmetric super-block with 16 sub-blocks of 16 values and integer sub-block scales:
 * fits each sub-block (sym_fit), quantizes the sub-block scales against d = smax / lmin (the
 * largest-magnitude scale maps to the code lmin; codes clamped to [lmin, lmax]), then
 * requantizes every value with its final scale d * l. */
static uint16_t ksym_block(const float *x, const float *imat, int qmin, int qmax, int lmin,
                           int lmax, int *ls, int *q) {
    float w[256], sc[16];
    err_weights(x, imat, 256, w);
    float smax = 0.0f, sm = 0.0f;
    for (int s = 0; s < 16; s++) {
        sc[s] = sym_fit(x + 16 * s, w + 16 * s, 16, qmin, qmax, q + 16 * s);
        if (fabsf(sc[s]) > smax) smax = fabsf(sc[s]), sm = sc[s];
    }
    const uint16_t dh = dsii_f32_to_f16(smax > 0.0f ? sm / (float)lmin : 0.0f);
    const float d = dsii_f16_to_f32(dh);
    for (int s = 0; s < 16; s++) {
        ls[s] = d != 0.0f ? clampi(iround(sc[s] / d), lmin, lmax) : 0;
        requant(x + 16 * s, 16, d * (float)ls[s], qmin, qmax, q + 16 * s);
    }
    return dh;
}

size_t dsii_q_q3_k(const float *src, void *dst, int64_t n, const float *imat) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 110) {
        int ls[16], q[256];
        const uint16_t dh = ksym_block(src + i, imat ? imat + i : NULL, -4, 3, -32, 31, ls, q);
        memset(p, 0, 110);
        uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        for (int s = 0; s < 16; s++) {
            const int v = ls[s] + 32; /* 6 bits */
            if (s < 8) sc[s] |= (uint8_t)(v & 0xF);
            else sc[s - 8] |= (uint8_t)((v & 0xF) << 4);
            sc[8 + (s & 3)] |= (uint8_t)((v >> 4) << (2 * (s >> 2)));
        }
        for (int e = 0; e < 256; e++) {
            const int h = e >> 7, j = (e >> 5) & 3, l = e & 31, u = q[e] + 4;
            qs[32 * h + l] |= (uint8_t)((u & 3) << (2 * j));
            if (u & 4) hm[l] |= (uint8_t)(1u << (4 * h + j));
        }
        st16(p + 108, dh);
    }
    return (size_t)(n / 256) * 110;
}

size_t dsii_q_q6_k(const float *src, void *dst, int64_t n, const float *imat) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 210) {
        int ls[16], q[256];
        const uint16_t dh = ksym_block(src + i, imat ? imat + i : NULL, -32, 31, -127, 127, ls, q);
        memset(p, 0, 210);
        uint8_t *ql = p, *qh = p + 128;
        for (int s = 0; s < 16; s++) p[192 + s] = (uint8_t)(int8_t)ls[s];
        for (int e = 0; e < 256; e++) {
            const int h = e >> 7, k = (e >> 5) & 3, l = e & 31, u = q[e] + 32;
            ql[64 * h + 32 * (k & 1) + l] |= (uint8_t)((u & 0xF) << (4 * (k >> 1)));
            qh[32 * h + l] |= (uint8_t)((u >> 4) << (2 * k));
        }
        st16(p + 208, dh);
    }
    return (size_t)(n / 256) * 210;
}

size_t dsii_q_q5_k(const float *src, void *dst, int64_t n, const float *imat) {
    (void)imat;
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 176) {
        uint8_t ls[16], lm[16], q[256];
        uint16_t dh, dminh;
        dsii_kquant_block(src + i, 8, 32, 31, 63, ls, lm, &dh, &dminh, q);
        st16(p, dh);
        st16(p + 2, dminh);
        dsii_k4_pack_scales(ls, lm, p + 4);
        uint8_t *qh = p + 16, *ql = p + 48;
        memset(qh, 0, 32 + 128);
        for (int e = 0; e < 256; e++) {
            const int c = e >> 6, u = (e >> 5) & 1, l = e & 31;
            ql[32 * c + l] |= (uint8_t)((q[e] & 0xF) << (4 * u));
            qh[l] |= (uint8_t)(((q[e] >> 4) & 1) << (2 * c + u));
        }
    }
    return (size_t)(n / 256) * 176;
}

/* ---- IQ4_NL / IQ4_XS: non-linear 16-value codebook ---------------------------------------- */

static int nearest_kv(float v) {
    int best = 0;
    float be = fabsf(v - (float)dsii_kvalues_iq4nl[0]);
    for (int k = 1; k < 16; k++) {
        float e = fabsf(v - (float)dsii_kvalues_iq4nl[k]);
        if (e < be) be = e, best = k;
    }
    return best;
}

/* Best float scale for 32 values against the codebook: candidates map the largest-magnitude
 * value to kvalues[0] + t (t = -7..7), each refitted by weighted least squares for its
 * assignment; returns the scale with the smallest weighted error (0 for zeros). */
static float nl_fit(const float *x, const float *w) {
    float amax = 0.0f, mx = 0.0f;
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
    if (amax == 0.0f) return 0.0f;
    float best = 0.0f, best_err = INFINITY;
    for (int t = -7; t <= 7; t++) {
        const float id = ((float)dsii_kvalues_iq4nl[0] + (float)t) / mx;
        float sxk = 0.0f, skk = 0.0f;
        int k[32];
        for (int i = 0; i < 32; i++) {
            k[i] = nearest_kv(x[i] * id);
            const float v = (float)dsii_kvalues_iq4nl[k[i]];
            sxk += w[i] * x[i] * v;
            skk += w[i] * v * v;
        }
        if (!(skk > 0.0f)) continue;
        const float d = sxk / skk;
        float err = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float e = x[i] - d * (float)dsii_kvalues_iq4nl[k[i]];
            err += w[i] * e * e;
        }
        if (err < best_err) best_err = err, best = d;
    }
    return best;
}

static void nl_assign(const float *x, float d, uint8_t *qs) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(nearest_kv(x[j] * id) | (nearest_kv(x[j + 16] * id) << 4));
}

size_t dsii_q_iq4_nl(const float *src, void *dst, int64_t n, const float *imat) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 32, p += 18) {
        float w[32];
        err_weights(src + i, imat ? imat + i : NULL, 32, w);
        const uint16_t dh = dsii_f32_to_f16(nl_fit(src + i, w));
        st16(p, dh);
        nl_assign(src + i, dsii_f16_to_f32(dh), p + 2);
    }
    return (size_t)(n / 32) * 18;
}

size_t dsii_q_iq4_xs(const float *src, void *dst, int64_t n, const float *imat) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 136) {
        float w[256], sc[8], smax = 0.0f, sm = 0.0f;
        err_weights(src + i, imat ? imat + i : NULL, 256, w);
        for (int s = 0; s < 8; s++) {
            sc[s] = nl_fit(src + i + 32 * s, w + 32 * s);
            if (fabsf(sc[s]) > smax) smax = fabsf(sc[s]), sm = sc[s];
        }
        const uint16_t dh = dsii_f32_to_f16(smax > 0.0f ? sm / -32.0f : 0.0f);
        const float d = dsii_f16_to_f32(dh);
        memset(p, 0, 136);
        st16(p, dh);
        uint16_t sh = 0;
        for (int s = 0; s < 8; s++) {
            const int l = d != 0.0f ? clampi(iround(sc[s] / d), -32, 31) : 0;
            const int v = l + 32;
            p[4 + s / 2] |= (uint8_t)((v & 0xF) << (4 * (s & 1)));
            sh |= (uint16_t)((v >> 4) << (2 * s));
            nl_assign(src + i + 32 * s, d * (float)l, p + 8 + 16 * s);
        }
        st16(p + 2, sh);
    }
    return (size_t)(n / 256) * 136;
}

/* ---- IQ grid types ------------------------------------------------------------------------
 * Values are quantized in groups of G = 8 (iq2, iq1) or 4 (iq3) against a grid of allowed
 * G-tuples (ggml_tables.h). A "unit" (16 or 32 values) shares one scale S; the super-block
 * stores d and a few bits per unit. For a unit: signs are taken from x (for the types that
 * store 7 sign bits per 8 values, the parity bit is implied, so when x has an odd number of
 * negatives the value with the smallest w|x| gets the wrong sign: its target becomes
 * -|x|); then scale candidates S = c_k * max|a| / gmax are tried, each with the best grid
 * entry per group (exhaustive over the grid, by per-coordinate cost tables) and a weighted
 * least-squares refit of S; the best S wins. After d is chosen from the largest unit scale,
 * every unit is assigned again with its quantized scale. Exhaustive, so slow for very large
 * models (docs/tensor-types.md gives the cost); deterministic. */

#define IQ_MAX_PAT 81
typedef struct iqgrid {
    int G, n, nlev;
    int has_delta;      /* iq1: every value is level + delta, delta = ±IQ1_DELTA */
    float lv[8];        /* level values in grid units (ascending) */
    float gmax;         /* largest |level| (+ delta for iq1) */
    int npat;           /* patterns of one half-entry (nlev^(G/2)) */
    uint16_t lo[2048];  /* pattern id of the first G/2 values of each entry */
    uint16_t hi[2048];  /* pattern id of the last G/2 values */
    uint16_t ord[2048]; /* entries ordered by lo id (stable) ... */
    uint16_t ohi[2048]; /* ... and their hi ids in that order */
    uint16_t lstart[IQ_MAX_PAT + 1]; /* ... entries with lo id p: ord[lstart[p] .. lstart[p + 1]) */
} iqgrid;

static void iqgrid_init(iqgrid *g, int G, int n, const uint64_t *g64, const uint32_t *g32,
                        const int *levels, int nlev, int has_delta) {
    int rev[256];
    g->has_delta = has_delta;
    g->G = G;
    g->n = n;
    g->nlev = nlev;
    for (int k = 0; k < 256; k++) rev[k] = 0;
    g->gmax = 0.0f;
    for (int l = 0; l < nlev; l++) {
        g->lv[l] = (float)levels[l];
        rev[levels[l] & 0xFF] = l;
        g->gmax = fmaxf(g->gmax, fabsf(g->lv[l]));
    }
    /* each entry = two halves of G/2 values; a half's id is its level indices in base nlev
     * (81 patterns for 8-wide 3-level grids, 64 for 4-wide 8-level grids) */
    const int h = G / 2;
    g->npat = 1;
    for (int j = 0; j < h; j++) g->npat *= nlev;
    for (int e = 0; e < n; e++) {
        int a = 0, b = 0;
        for (int j = h - 1; j >= 0; j--) {
            const int bl = G == 8 ? gb64(g64[e], j) : gb32(g32[e], j);
            const int bh = G == 8 ? gb64(g64[e], j + h) : gb32(g32[e], j + h);
            a = a * nlev + rev[bl];
            b = b * nlev + rev[bh];
        }
        g->lo[e] = (uint16_t)a;
        g->hi[e] = (uint16_t)b;
    }
    int cnt[IQ_MAX_PAT + 1] = {0}; /* counting sort of the entries by lo id */
    for (int e = 0; e < n; e++) cnt[g->lo[e] + 1]++;
    for (int p = 0; p < g->npat; p++) cnt[p + 1] += cnt[p];
    for (int p = 0; p <= g->npat; p++) g->lstart[p] = (uint16_t)cnt[p];
    for (int e = 0; e < n; e++) g->ord[cnt[g->lo[e]]++] = (uint16_t)e;
    for (int r = 0; r < n; r++) g->ohi[r] = g->hi[g->ord[r]];
}

/* Ascending order of v[0..n) (n <= 9) as indices: insertion sort, ties in index order. */
static void iq_order(const float *v, int n, int *ix) {
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && v[ix[j - 1]] > v[i]) {
            ix[j] = ix[j - 1];
            j--;
        }
        ix[j] = i;
    }
}

/* Best grid entry for targets a[0..G) and weights w: minimizes sum w (a - S (level + delta))^2.
 * Ties go to the lower index.
 *
 * An entry's cost is lo(entry) + hi(entry), the costs of its two halves; a half's cost is
 * A[i] + B[k], the costs of its two quarters (G = 8: two values of 3 levels each, i, k in
 * 0..8; G = 4: one value of 8 levels, i, k in 0..7), lo pattern p = i + na k. The search
 * visits the lo patterns quarter by quarter in ascending A, then ascending B, and skips the
 * rest of a row (and all later rows) as soon as A[i] + B[k] plus the cheapest hi half cannot
 * beat the best cost so far; within a pattern, every entry is tried. Each cost is computed as
 * fl(fl(A[i] + B[k]) + fl(hi)) whatever the order, and rounding is monotone, so a skipped
 * entry costs more than the best so far: the result is that of the exhaustive search
 * (lowest cost, then lowest index). Costs with a NaN (NaN inputs) take the exhaustive loop:
 * the pruning's comparisons need ordered values (infinite costs are ordered: they keep it). */
static int iqgrid_best(const iqgrid *g, const float *a, const float *w, float S, float delta,
                       float *err_out) {
    float c[8][8];
    int finite = 1;
    for (int j = 0; j < g->G; j++)
        for (int l = 0; l < g->nlev; l++) {
            const float e = a[j] - S * (g->lv[l] + delta);
            c[j][l] = w[j] * e * e;
            finite &= c[j][l] == c[j][l];
        }
    /* quarter costs A (lo half's first quarter), B (its second); hi half costs chi[h] */
    float A[9], B[9], chi[IQ_MAX_PAT];
    int na;
    if (g->G == 8) { /* 3 levels: quarter id = v0 + 3 v1, pattern id = q0 + 9 q1 */
        float b01[9], b23[9];
        na = 9;
        for (int q = 0; q < 9; q++) {
            A[q] = c[0][q % 3] + c[1][q / 3];
            B[q] = c[2][q % 3] + c[3][q / 3];
            b01[q] = c[4][q % 3] + c[5][q / 3];
            b23[q] = c[6][q % 3] + c[7][q / 3];
        }
        for (int k = 0; k < 9; k++)
            for (int i = 0; i < 9; i++) chi[i + 9 * k] = b01[i] + b23[k];
    } else { /* 8 levels: pattern id = v0 + 8 v1 */
        na = 8;
        for (int q = 0; q < 8; q++) {
            A[q] = c[0][q];
            B[q] = c[1][q];
        }
        for (int k = 0; k < 8; k++)
            for (int i = 0; i < 8; i++) chi[i + 8 * k] = c[2][i] + c[3][k];
    }
    int best = 0;
    float be = INFINITY;
    if (!finite) {
        for (int e = 0; e < g->n; e++) {
            const int p = g->lo[e];
            const float v = (A[p % na] + B[p / na]) + chi[g->hi[e]];
            if (v < be) be = v, best = e;
        }
        *err_out = be;
        return best;
    }
    float mhi = chi[0];
    for (int p = 1; p < g->npat; p++) mhi = chi[p] < mhi ? chi[p] : mhi;
    int ia[9], ib[9];
    iq_order(A, na, ia);
    iq_order(B, na, ib);
    for (int x = 0; x < na; x++) {
        const int i = ia[x];
        if ((A[i] + B[ib[0]]) + mhi > be) break; /* this row and every later one */
        for (int y = 0; y < na; y++) {
            const int k = ib[y];
            const float lo = A[i] + B[k];
            if (lo + mhi > be) break; /* the rest of the row */
            const int p = i + na * k;
            for (int r = g->lstart[p]; r < g->lstart[p + 1]; r++) {
                const float v = lo + chi[g->ohi[r]];
                const int e = g->ord[r];
                if (v < be || (v == be && e < best)) be = v, best = e;
            }
        }
    }
    *err_out = be;
    return best;
}

/* Level value of element j of entry e. */
static float iqgrid_val(const iqgrid *g, int e, int j) {
    const int h = g->G / 2;
    int id = j < h ? g->lo[e] : g->hi[e];
    for (int k = 0; k < j % h; k++) id /= g->nlev;
    return g->lv[id % g->nlev];
}

/* Delta modes (iq1 only): none, one delta for the whole unit, or one per group. */
enum { DELTA_NONE = 0, DELTA_UNIT = 1, DELTA_GROUP = 2 };
#define IQ_MAX_UNIT 32

typedef struct unit_fit {
    int idx[IQ_MAX_UNIT / 4];   /* grid entry per group */
    int neg[IQ_MAX_UNIT / 4];   /* iq1: 1 if the group's delta is negative */
    float err;
} unit_fit;

/* Assigns every group of a unit of U targets for a fixed scale S. */
static void unit_assign(const iqgrid *g, const float *a, const float *w, int U, float S,
                        int dmode, unit_fit *f) {
    const int ng = U / g->G;
    f->err = 0.0f;
    if (dmode == DELTA_NONE) {
        for (int k = 0; k < ng; k++) {
            float e;
            f->idx[k] = iqgrid_best(g, a + g->G * k, w + g->G * k, S, 0.0f, &e);
            f->neg[k] = 0;
            f->err += e;
        }
        return;
    }
    if (dmode == DELTA_GROUP) {
        for (int k = 0; k < ng; k++) {
            float ep, en;
            const int ip = iqgrid_best(g, a + g->G * k, w + g->G * k, S, IQ1_DELTA, &ep);
            const int in = iqgrid_best(g, a + g->G * k, w + g->G * k, S, -IQ1_DELTA, &en);
            f->idx[k] = en < ep ? in : ip;
            f->neg[k] = en < ep;
            f->err += en < ep ? en : ep;
        }
        return;
    }
    unit_fit alt;
    alt.err = 0.0f;
    for (int k = 0; k < ng; k++) {
        float ep, en;
        f->idx[k] = iqgrid_best(g, a + g->G * k, w + g->G * k, S, IQ1_DELTA, &ep);
        alt.idx[k] = iqgrid_best(g, a + g->G * k, w + g->G * k, S, -IQ1_DELTA, &en);
        f->neg[k] = 0;
        alt.neg[k] = 1;
        f->err += ep;
        alt.err += en;
    }
    if (alt.err < f->err) *f = alt;
}

/* Value (grid units) of element i of a unit under assignment f. */
static float unit_val(const iqgrid *g, const unit_fit *f, int i) {
    const int k = i / g->G;
    const float v = iqgrid_val(g, f->idx[k], i % g->G);
    return g->has_delta ? v + (f->neg[k] ? -IQ1_DELTA : IQ1_DELTA) : v;
}

/* Weighted least-squares scale for an assignment (S0 when it has none), and its error. */
static float unit_refit(const iqgrid *g, const float *a, const float *w, int U, const unit_fit *f,
                        float S0, float *err) {
    float sav = 0.0f, svv = 0.0f;
    for (int i = 0; i < U; i++) {
        const float v = unit_val(g, f, i);
        sav += w[i] * a[i] * v;
        svv += w[i] * v * v;
    }
    const float S = svv > 0.0f && sav > 0.0f ? sav / svv : S0;
    float e2 = 0.0f;
    for (int i = 0; i < U; i++) {
        const float e = a[i] - S * unit_val(g, f, i);
        e2 += w[i] * e * e;
    }
    *err = e2;
    return S;
}

/* Scale search for one unit (see above); returns the unit's float scale, f its assignment. */
static float unit_search(const iqgrid *g, const float *a, const float *w, int U, int dmode,
                         unit_fit *f) {
    static const float cands[] = {1.2f, 1.05f, 0.92f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f};
    float amax = 0.0f;
    for (int i = 0; i < U; i++) amax = fmaxf(amax, fabsf(a[i]));
    if (amax == 0.0f) {
        unit_assign(g, a, w, U, 0.0f, dmode, f);
        return 0.0f;
    }
    float best_S = 0.0f, best_err = INFINITY;
    for (size_t k = 0; k <= sizeof cands / sizeof cands[0]; k++) {
        /* the last round re-assigns with the best refitted scale so far */
        const float S = k < sizeof cands / sizeof cands[0] ? cands[k] * amax / g->gmax : best_S;
        unit_fit t;
        float err;
        unit_assign(g, a, w, U, S, dmode, &t);
        const float S2 = unit_refit(g, a, w, U, &t, S, &err);
        if (err < best_err) {
            best_err = err;
            best_S = S2;
            *f = t;
        }
    }
    return best_S;
}

/* Signs of groups of 8 values: a = |x| and the sign byte (bit j: x[j] < 0). With `parity`,
 * the byte must have an even number of set bits (the eighth bit is not stored): when it
 * does not, the value with the smallest w |x| is given the wrong sign (a = -|x|). */
static void group_signs(const float *x, const float *w, int parity, float *a, uint8_t *sbyte) {
    uint8_t s = 0;
    int flip = 0;
    float fm = INFINITY;
    for (int j = 0; j < 8; j++) {
        a[j] = fabsf(x[j]);
        if (x[j] < 0.0f) s |= (uint8_t)(1u << j);
        if (w[j] * a[j] < fm) fm = w[j] * a[j], flip = j;
    }
    if (parity && (__builtin_popcount(s) & 1)) {
        s ^= (uint8_t)(1u << flip);
        a[flip] = -a[flip];
    }
    *sbyte = s;
}

/* Per-type parameters of the grid quantizer. */
typedef struct iqtype {
    int U;          /* values per scale unit */
    int sign_mode;  /* 0: signed grid (iq1), 1: 8 free sign bits, 2: 7 bits + parity */
    int dmode;      /* DELTA_* */
    float smax;     /* largest unit scale in units of d (code 15 or 7) */
    int ncode;      /* scale codes 0..ncode-1 */
    int kind;       /* scale code → multiplier: 0: (0.5 + c) * 0.25, 1: (0.5 + c) * 0.5,
                       2: 1 + 2c */
} iqtype;

/* The unit scale of code c, computed exactly as the decoders do. */
static float code_scale(const iqtype *t, float d, int c) {
    switch (t->kind) {
    case 0: return d * (0.5f + (float)c) * 0.25f;
    case 1: return d * (0.5f + (float)c) * 0.5f;
    default: return d * (float)(1 + 2 * c);
    }
}
static int scale_code(const iqtype *t, float d, float S) {
    float m = S / d; /* d > 0 */
    int c;
    switch (t->kind) {
    case 0: c = iround(m * 4.0f - 0.5f); break;
    case 1: c = iround(m * 2.0f - 0.5f); break;
    default: c = iround((m - 1.0f) * 0.5f); break;
    }
    return clampi(c, 0, t->ncode - 1);
}

/* Quantizes one super-block of 256 values: returns d (f16 bits; 0 for an all-zero block) and
 * per unit its scale code, assignment and sign bytes (one per group of 8). */
static uint16_t iq_block(const iqgrid *g, const iqtype *t, const float *x, const float *imat,
                         int *codes, unit_fit *fits, uint8_t *signs) {
    float w[256], a[256];
    err_weights(x, imat, 256, w);
    for (int k = 0; k < 32; k++) {
        if (t->sign_mode == 0) {
            memcpy(a + 8 * k, x + 8 * k, 8 * sizeof(float));
            signs[k] = 0;
        } else {
            group_signs(x + 8 * k, w + 8 * k, t->sign_mode == 2, a + 8 * k, &signs[k]);
        }
    }
    const int nu = 256 / t->U;
    float S[32], smax = 0.0f;
    for (int u = 0; u < nu; u++) {
        S[u] = unit_search(g, a + t->U * u, w + t->U * u, t->U, t->dmode, &fits[u]);
        smax = fmaxf(smax, S[u]);
    }
    const uint16_t dh = dsii_f32_to_f16(smax / t->smax);
    const float d = dsii_f16_to_f32(dh);
    for (int u = 0; u < nu; u++) {
        codes[u] = d > 0.0f ? scale_code(t, d, S[u]) : 0;
        unit_assign(g, a + t->U * u, w + t->U * u, t->U, code_scale(t, d, codes[u]), t->dmode,
                    &fits[u]);
    }
    return d > 0.0f ? dh : 0;
}

static const int k_lv_iq2[3] = {8, 25, 43};
static const int k_lv_iq3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62};
static const int k_lv_iq3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
static const int k_lv_iq1[3] = {-1, 0, 1};

size_t dsii_q_iq2_xxs(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {32, 2, DELTA_NONE, 15.5f * 0.25f, 16, 0};
    iqgrid g;
    iqgrid_init(&g, 8, 256, dsii_iq2xxs_grid, NULL, k_lv_iq2, 3, 0);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 66) {
        int codes[32];
        unit_fit f[32];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        st16(p, dh);
        for (int s = 0; s < 8; s++) {
            uint32_t w = (uint32_t)codes[s] << 28;
            for (int l = 0; l < 4; l++) {
                p[2 + 8 * s + l] = (uint8_t)f[s].idx[l];
                w |= (uint32_t)(sg[4 * s + l] & 127) << (7 * l);
            }
            for (int k = 0; k < 4; k++) p[2 + 8 * s + 4 + k] = (uint8_t)(w >> (8 * k));
        }
    }
    return (size_t)(n / 256) * 66;
}

size_t dsii_q_iq2_xs(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {16, 2, DELTA_NONE, 15.5f * 0.25f, 16, 0};
    iqgrid g;
    iqgrid_init(&g, 8, 512, dsii_iq2xs_grid, NULL, k_lv_iq2, 3, 0);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 74) {
        int codes[32];
        unit_fit f[32];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        st16(p, dh);
        for (int k = 0; k < 32; k++) /* group k = unit k/2, group k%2 in it */
            st16(p + 2 + 2 * k, (uint16_t)(f[k / 2].idx[k % 2] | ((sg[k] & 127) << 9)));
        for (int s = 0; s < 8; s++) p[66 + s] = (uint8_t)(codes[2 * s] | (codes[2 * s + 1] << 4));
    }
    return (size_t)(n / 256) * 74;
}

size_t dsii_q_iq2_s(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {16, 1, DELTA_NONE, 15.5f * 0.25f, 16, 0};
    iqgrid g;
    iqgrid_init(&g, 8, 1024, dsii_iq2s_grid, NULL, k_lv_iq2, 3, 0);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 82) {
        int codes[32];
        unit_fit f[32];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        memset(p, 0, 82);
        st16(p, dh);
        for (int k = 0; k < 32; k++) {
            const int idx = f[k / 2].idx[k % 2], s = k / 4, l = k % 4;
            p[2 + k] = (uint8_t)(idx & 0xFF);
            p[34 + k] = sg[k];
            p[66 + s] |= (uint8_t)((idx >> 8) << (2 * l));
        }
        for (int s = 0; s < 8; s++) p[74 + s] = (uint8_t)(codes[2 * s] | (codes[2 * s + 1] << 4));
    }
    return (size_t)(n / 256) * 82;
}

size_t dsii_q_iq3_xxs(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {32, 2, DELTA_NONE, 15.5f * 0.5f, 16, 1};
    iqgrid g;
    iqgrid_init(&g, 4, 256, NULL, dsii_iq3xxs_grid, k_lv_iq3xxs, 8, 0);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 98) {
        int codes[8];
        unit_fit f[8];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        st16(p, dh);
        for (int s = 0; s < 8; s++) {
            uint32_t w = (uint32_t)codes[s] << 28;
            for (int l = 0; l < 4; l++) w |= (uint32_t)(sg[4 * s + l] & 127) << (7 * l);
            for (int k = 0; k < 8; k++) p[2 + 8 * s + k] = (uint8_t)f[s].idx[k];
            for (int k = 0; k < 4; k++) p[66 + 4 * s + k] = (uint8_t)(w >> (8 * k));
        }
    }
    return (size_t)(n / 256) * 98;
}

size_t dsii_q_iq3_s(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {32, 1, DELTA_NONE, 31.0f, 16, 2};
    iqgrid g;
    iqgrid_init(&g, 4, 512, NULL, dsii_iq3s_grid, k_lv_iq3s, 8, 0);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 110) {
        int codes[8];
        unit_fit f[8];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        memset(p, 0, 110);
        st16(p, dh);
        for (int s = 0; s < 8; s++) {
            for (int k = 0; k < 8; k++) {
                p[2 + 8 * s + k] = (uint8_t)(f[s].idx[k] & 0xFF);
                p[66 + s] |= (uint8_t)((f[s].idx[k] >> 8) << k);
            }
            for (int l = 0; l < 4; l++) p[74 + 4 * s + l] = sg[4 * s + l];
            p[106 + s / 2] |= (uint8_t)(codes[s] << (4 * (s & 1)));
        }
    }
    return (size_t)(n / 256) * 110;
}

size_t dsii_q_iq1_s(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {32, 0, DELTA_UNIT, 15.0f, 8, 2};
    iqgrid g;
    iqgrid_init(&g, 8, 2048, dsii_iq1s_grid, NULL, k_lv_iq1, 3, 1);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 50) {
        int codes[8];
        unit_fit f[8];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        st16(p, dh);
        for (int s = 0; s < 8; s++) {
            uint16_t qh = (uint16_t)((codes[s] << 12) | (f[s].neg[0] ? 0x8000 : 0));
            for (int l = 0; l < 4; l++) {
                p[2 + 4 * s + l] = (uint8_t)(f[s].idx[l] & 0xFF);
                qh |= (uint16_t)(((f[s].idx[l] >> 8) & 7) << (3 * l));
            }
            st16(p + 34 + 2 * s, qh);
        }
    }
    return (size_t)(n / 256) * 50;
}

size_t dsii_q_iq1_m(const float *src, void *dst, int64_t n, const float *imat) {
    static const iqtype t = {16, 0, DELTA_GROUP, 15.0f, 8, 2};
    iqgrid g;
    iqgrid_init(&g, 8, 2048, dsii_iq1s_grid, NULL, k_lv_iq1, 3, 1);
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i += 256, p += 56) {
        int codes[16];
        unit_fit f[16];
        uint8_t sg[32];
        const uint16_t dh = iq_block(&g, &t, src + i, imat ? imat + i : NULL, codes, f, sg);
        memset(p, 0, 56);
        uint16_t sc[4] = {0, 0, 0, 0};
        for (int k = 0; k < 32; k++) { /* group k: unit k/2, sub-block k/4, l = k%4 */
            const int idx = f[k / 2].idx[k % 2], s = k / 4, l = k % 4;
            p[k] = (uint8_t)(idx & 0xFF);
            p[32 + 2 * s + l / 2] |= (uint8_t)((((idx >> 8) & 7) | (f[k / 2].neg[k % 2] << 3)) << (4 * (l & 1)));
        }
        for (int s = 0; s < 8; s++)
            sc[s / 2] |= (uint16_t)((codes[2 * s] | (codes[2 * s + 1] << 3)) << (6 * (s & 1)));
        for (int k = 0; k < 4; k++) {
            sc[k] |= (uint16_t)(((dh >> (4 * k)) & 0xF) << 12);
            st16(p + 48 + 2 * k, sc[k]);
        }
    }
    return (size_t)(n / 256) * 56;
}
