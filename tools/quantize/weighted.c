/*
 * Importance-weighted encoding of q4_k and q2_k blocks (layouts: docs/tensor-types.md).
 * lib/quant's round-to-nearest encoder gives a valid block; for each sub-block the 6-bit (q4_k)
 * or 4-bit (q2_k) scale and min codes are then searched in a small window around it, with the
 * quants re-derived for each candidate, keeping the pair with the least importance-weighted
 * squared error. d and dmin stay the encoder's. With all importances equal this minimizes the
 * plain squared error, so it never does worse than the encoder on its own objective.
 */
#include "weighted.h"

#include "base/base.h"
#include "quant/fp.h"
#include "quant/quant.h"

#include <math.h>
#include <string.h>

int dsii_weighted_supported(int32_t type) { return type == DSI_TYPE_Q4_K || type == DSI_TYPE_Q2_K; }

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Best quant for x given scale a = d*ls and offset b = dmin*lm: x ~ a*q - b, q in [0, qmax]. */
static int qbest(float x, float a, float b, int qmax) {
    if (a <= 0) return 0;
    int q = (int)lrintf((x + b) / a);
    return q < 0 ? 0 : q > qmax ? qmax : q;
}

/* Searches ls / lm for `len` values starting at x: returns the error and stores the codes. */
static float search(const float *x, const float *w, int len, float d, float dmin, int lmax, int qmax, int *ls,
                    int *lm) {
    float best = INFINITY;
    int bl = *ls, bm = *lm;
    for (int dl = -2; dl <= 2; dl++)
        for (int dm = -2; dm <= 2; dm++) {
            const int l = *ls + dl, m = *lm + dm;
            if (l < 0 || l > lmax || m < 0 || m > lmax) continue;
            const float a = d * (float)l, b = dmin * (float)m;
            float e = 0;
            for (int i = 0; i < len; i++) {
                const float v = a * (float)qbest(x[i], a, b, qmax) - b - x[i];
                e += w[i] * v * v;
            }
            if (e < best) best = e, bl = l, bm = m;
        }
    *ls = bl;
    *lm = bm;
    return best;
}

static void q4k_block(const float *x, const float *w, uint8_t *blk) {
    const float d = dsii_f16_to_f32(rd16(blk)), dmin = dsii_f16_to_f32(rd16(blk + 2));
    uint8_t *sc = blk + 4, *qs = blk + 16;
    int ls[8], lm[8];
    for (int s = 0; s < 8; s++) {
        if (s < 4) ls[s] = sc[s] & 63, lm[s] = sc[s + 4] & 63;
        else ls[s] = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4), lm[s] = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        search(x + 32 * s, w + 32 * s, 32, d, dmin, 63, 15, &ls[s], &lm[s]);
    }
    for (int j = 0; j < 4; j++) {
        sc[j] = (uint8_t)((ls[j] & 63) | ((ls[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)((lm[j] & 63) | ((lm[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((ls[j + 4] & 15) | ((lm[j + 4] & 15) << 4));
    }
    memset(qs, 0, 128);
    for (int e = 0; e < 256; e++) {
        const int s = e / 32, c = e / 64, l = e % 32;
        const int q = qbest(x[e], d * (float)ls[s], dmin * (float)lm[s], 15);
        qs[32 * c + l] |= (uint8_t)(s & 1 ? q << 4 : q);
    }
}

static void q2k_block(const float *x, const float *w, uint8_t *blk) {
    uint8_t *sc = blk, *qs = blk + 16;
    const float d = dsii_f16_to_f32(rd16(blk + 80)), dmin = dsii_f16_to_f32(rd16(blk + 82));
    int ls[16], lm[16];
    for (int s = 0; s < 16; s++) {
        ls[s] = sc[s] & 15;
        lm[s] = sc[s] >> 4;
        search(x + 16 * s, w + 16 * s, 16, d, dmin, 15, 3, &ls[s], &lm[s]);
        sc[s] = (uint8_t)(ls[s] | lm[s] << 4);
    }
    memset(qs, 0, 64);
    for (int e = 0; e < 256; e++) {
        const int s = e / 16;
        const int q = qbest(x[e], d * (float)ls[s], dmin * (float)lm[s], 3);
        qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e / 32) % 4)));
    }
}

int dsii_quantize_row_weighted(int32_t type, const float *x, const float *imp, void *dst, int64_t n) {
    if (!dsii_weighted_supported(type) || n % 256) return -1;
    if (dsii_quantize_row(type, x, dst, n, NULL) != DSI_OK) return -1;
    const int bs = type == DSI_TYPE_Q4_K ? 144 : 84;
    for (int64_t b = 0; b < n / 256; b++) {
        uint8_t *blk = (uint8_t *)dst + b * bs;
        if (type == DSI_TYPE_Q4_K) q4k_block(x + 256 * b, imp + 256 * b, blk);
        else q2k_block(x + 256 * b, imp + 256 * b, blk);
    }
    return 0;
}
