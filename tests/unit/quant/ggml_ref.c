/* See ggml_ref.h. Every formula below is the one of docs/tensor-types.md for element e of a
 * block (0 <= e < block size). */
#include "ggml_ref.h"

#include <math.h>
#include <string.h>

#include "quant/ggml_tables.h"

static double f16(const uint8_t *p) {
    const unsigned h = (unsigned)(p[0] | (p[1] << 8));
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}
static unsigned u16(const uint8_t *p) { return (unsigned)(p[0] | (p[1] << 8)); }
static uint32_t u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static int nib(uint8_t b, int hi) { return hi ? b >> 4 : b & 15; }
static int byte_of(uint64_t v, int j) { return (int)((v >> (8 * j)) & 255); }
/* Sign of element j (0..7) of a group whose 7 stored sign bits are s7: bit 7 makes the
 * number of negatives even. */
static int neg_parity(unsigned s7, int j) {
    unsigned s = s7 & 127;
    unsigned par = 0;
    for (int k = 0; k < 7; k++) par ^= (s >> k) & 1;
    s |= par << 7;
    return (s >> j) & 1;
}
static double kq_scale(const uint8_t *sc, int j, int want_min) { /* Q4_K / Q5_K */
    int s, m;
    if (j < 4) {
        s = sc[j] & 63;
        m = sc[j + 4] & 63;
    } else {
        s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
        m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
    return want_min ? m : s;
}

typedef struct geo {
    int32_t type;
    int blck, bytes;
} geo;
static const geo k_geo[] = {{2, 32, 18},    {3, 32, 20},    {6, 32, 22},    {7, 32, 24},
                            {11, 256, 110}, {13, 256, 176}, {14, 256, 210}, {16, 256, 66},
                            {17, 256, 74},  {18, 256, 98},  {19, 256, 50},  {20, 32, 18},
                            {21, 256, 110}, {22, 256, 82},  {23, 256, 136}, {29, 256, 56}};

static const geo *geo_of(int32_t type) {
    for (size_t i = 0; i < sizeof k_geo / sizeof k_geo[0]; i++)
        if (k_geo[i].type == type) return &k_geo[i];
    return NULL;
}

int gref_known(int32_t type) { return geo_of(type) != NULL; }

/* value of element e of block b; *m = magnitude scale */
static double elem(int32_t type, const uint8_t *b, int e, double *m) {
    switch (type) {
    case 2: { /* q4_0 */
        double v = (nib(b[2 + e % 16], e >= 16) - 8) * f16(b);
        *m = fabs(v);
        return v;
    }
    case 3: { /* q4_1 */
        double a = nib(b[4 + e % 16], e >= 16) * f16(b), mn = f16(b + 2);
        *m = fabs(a) + fabs(mn);
        return a + mn;
    }
    case 6: { /* q5_0 */
        int q = nib(b[6 + e % 16], e >= 16) | (int)(((u32(b + 2) >> e) & 1) << 4);
        double v = (q - 16) * f16(b);
        *m = fabs(v);
        return v;
    }
    case 7: { /* q5_1 */
        int q = nib(b[8 + e % 16], e >= 16) | (int)(((u32(b + 4) >> e) & 1) << 4);
        double a = q * f16(b), mn = f16(b + 2);
        *m = fabs(a) + fabs(mn);
        return a + mn;
    }
    case 11: { /* q3_k: hmask[32] qs[64] scales[12] d */
        int h = e / 128, j = (e / 32) % 4, l = e % 32, s = e / 16;
        int q = (b[32 + 32 * h + l] >> (2 * j)) & 3;
        if (!((b[l] >> (4 * h + j)) & 1)) q -= 4;
        int lo = s < 8 ? b[96 + s] & 15 : b[96 + s - 8] >> 4;
        int hi = (b[96 + 8 + s % 4] >> (2 * (s / 4))) & 3;
        double v = f16(b + 108) * ((lo | (hi << 4)) - 32) * q;
        *m = fabs(v);
        return v;
    }
    case 13: { /* q5_k: d dmin scales[12] qh[32] qs[128] */
        int c = e / 64, u = (e / 32) % 2, l = e % 32;
        int q = nib(b[48 + 32 * c + l], u) + (((b[16 + l] >> (2 * c + u)) & 1) << 4);
        double a = f16(b) * kq_scale(b + 4, 2 * c + u, 0) * q;
        double mn = f16(b + 2) * kq_scale(b + 4, 2 * c + u, 1);
        *m = fabs(a) + fabs(mn);
        return a - mn;
    }
    case 14: { /* q6_k: ql[128] qh[64] scales[16] d */
        int h = e / 128, k = (e / 32) % 4, l = e % 32;
        int lo = nib(b[64 * h + 32 * (k % 2) + l], k / 2);
        int q = (lo | (((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
        double v = f16(b + 208) * (int8_t)b[192 + e / 16] * q;
        *m = fabs(v);
        return v;
    }
    case 20: { /* iq4_nl */
        double v = f16(b) * dsii_kvalues_iq4nl[nib(b[2 + e % 16], e >= 16)];
        *m = fabs(v);
        return v;
    }
    case 23: { /* iq4_xs: d scales_h scales_l[4] qs[128] */
        int s = e / 32, j = e % 32;
        int ls = nib(b[4 + s / 2], s % 2) | (((u16(b + 2) >> (2 * s)) & 3) << 4);
        double v = f16(b) * (ls - 32) * dsii_kvalues_iq4nl[nib(b[8 + 16 * s + j % 16], j >= 16)];
        *m = fabs(v);
        return v;
    }
    case 16: { /* iq2_xxs: d; per 32: 4 index bytes, u32 (signs 4 x 7 bits, scale 4 bits) */
        int s = e / 32, l = (e / 8) % 4, j = e % 8;
        uint32_t w = u32(b + 2 + 8 * s + 4);
        double g = byte_of(dsii_iq2xxs_grid[b[2 + 8 * s + l]], j);
        double v = f16(b) * (0.5 + (w >> 28)) / 4 * g * (neg_parity(w >> (7 * l), j) ? -1 : 1);
        *m = fabs(v);
        return v;
    }
    case 17: { /* iq2_xs: d; u16 qs[32] = index 9 bits | sign7 << 9; scales[8] */
        int s = e / 32, l = (e / 8) % 4, j = e % 8;
        unsigned q = u16(b + 2 + 2 * (4 * s + l));
        double g = byte_of(dsii_iq2xs_grid[q & 511], j);
        double v = f16(b) * (0.5 + nib(b[66 + s], l >= 2)) / 4 * g * (neg_parity(q >> 9, j) ? -1 : 1);
        *m = fabs(v);
        return v;
    }
    case 22: { /* iq2_s: d; qs[32]; signs[32]; qh[8]; scales[8] */
        int s = e / 32, l = (e / 8) % 4, j = e % 8, k = 4 * s + l;
        int idx = b[2 + k] | (((b[66 + s] >> (2 * l)) & 3) << 8);
        double g = byte_of(dsii_iq2s_grid[idx], j);
        double v = f16(b) * (0.5 + nib(b[74 + s], l >= 2)) / 4 * g * (((b[34 + k] >> j) & 1) ? -1 : 1);
        *m = fabs(v);
        return v;
    }
    case 18: { /* iq3_xxs: d; qs[64]; u32 per 32 */
        int s = e / 32, l = (e / 8) % 4, j = e % 8;
        uint32_t w = u32(b + 66 + 4 * s);
        int idx = b[2 + 8 * s + 2 * l + j / 4];
        double g = byte_of(dsii_iq3xxs_grid[idx], j % 4);
        double v = f16(b) * (0.5 + (w >> 28)) / 2 * g * (neg_parity(w >> (7 * l), j) ? -1 : 1);
        *m = fabs(v);
        return v;
    }
    case 21: { /* iq3_s: d; qs[64]; qh[8]; signs[32]; scales[4] */
        int s = e / 32, l = (e / 8) % 4, j = e % 8, k = 2 * l + j / 4;
        int idx = b[2 + 8 * s + k] | (((b[66 + s] >> k) & 1) << 8);
        double g = byte_of(dsii_iq3s_grid[idx], j % 4);
        double v = f16(b) * (1 + 2 * nib(b[106 + s / 2], s % 2)) * g *
                   (((b[74 + 4 * s + l] >> j) & 1) ? -1 : 1);
        *m = fabs(v);
        return v;
    }
    case 19: { /* iq1_s: d; qs[32]; u16 qh[8] */
        int s = e / 32, l = (e / 8) % 4, j = e % 8;
        unsigned qh = u16(b + 34 + 2 * s);
        int idx = b[2 + 4 * s + l] | (int)(((qh >> (3 * l)) & 7) << 8);
        double g = (int8_t)byte_of(dsii_iq1s_grid[idx], j);
        double delta = (qh & 0x8000) ? -0.125 : 0.125;
        double v = f16(b) * (2 * ((qh >> 12) & 7) + 1) * (g + delta);
        *m = fabs(v);
        return v;
    }
    case 29: { /* iq1_m: qs[32]; qh[16]; scales[8] (4 u16, d in the top nibbles) */
        int s = e / 32, l = (e / 8) % 4, j = e % 8;
        unsigned sc[4], dh = 0;
        for (int k = 0; k < 4; k++) {
            sc[k] = u16(b + 48 + 2 * k);
            dh |= (sc[k] >> 12) << (4 * k);
        }
        uint8_t dd[2] = {(uint8_t)dh, (uint8_t)(dh >> 8)};
        int half = l / 2; /* 16-value half of the sub-block */
        int s3 = (sc[s / 2] >> (6 * (s % 2) + 3 * half)) & 7;
        int hq = nib(b[32 + 2 * s + l / 2], l % 2);
        int idx = b[4 * s + l] | ((hq & 7) << 8);
        double g = (int8_t)byte_of(dsii_iq1s_grid[idx], j);
        double delta = (hq & 8) ? -0.125 : 0.125;
        double v = f16(dd) * (2 * s3 + 1) * (g + delta);
        *m = fabs(v);
        return v;
    }
    default: *m = 0; return NAN;
    }
}

void gref_decode(int32_t type, const uint8_t *row, int64_t n, double *dst, double *mag) {
    const geo *g = geo_of(type);
    for (int64_t i = 0; i < n; i++) {
        double m;
        dst[i] = g ? elem(type, row + (size_t)(i / g->blck) * (size_t)g->bytes, (int)(i % g->blck), &m) : NAN;
        if (mag) mag[i] = m;
    }
}

static void put_f16(uint8_t *p, uint64_t r) {
    /* exponent 9..13 (2^-6 .. 2^-2), random mantissa and sign */
    unsigned h = (unsigned)((((r >> 20) & 1) << 15) | ((9 + (r >> 21) % 5) << 10) | (r & 1023));
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

void gref_random_row(int32_t type, uint8_t *row, int64_t n, uint64_t (*rnd)(void)) {
    const geo *g = geo_of(type);
    if (!g) return;
    const int64_t nb = n / g->blck;
    for (int64_t i = 0; i < nb * g->bytes; i++) row[i] = (uint8_t)rnd();
    for (int64_t k = 0; k < nb; k++) {
        uint8_t *b = row + k * g->bytes;
        switch (type) {
        case 3: case 7: case 13: put_f16(b, rnd()); put_f16(b + 2, rnd()); break;
        case 11: put_f16(b + 108, rnd()); break;
        case 14: put_f16(b + 208, rnd()); break;
        case 29: {
            uint8_t d[2];
            put_f16(d, rnd());
            unsigned dh = (unsigned)(d[0] | (d[1] << 8));
            for (int q = 0; q < 4; q++)
                b[49 + 2 * q] = (uint8_t)((b[49 + 2 * q] & 15) | (((dh >> (4 * q)) & 15) << 4));
            break;
        }
        default: put_f16(b, rnd()); break;
        }
    }
}
