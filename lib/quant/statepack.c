/* lib/quant/statepack.c — packed session-state rows (see statepack.h). */
#include "quant/statepack.h"

#include "quant/fp.h"

#include <math.h>

const float dsii_sp_e4m3_lut[256] = {
    0x0p+0f, 0x1.0000000000000p-9f, 0x1.0000000000000p-8f, 0x1.8000000000000p-8f, 0x1.0000000000000p-7f, 0x1.4000000000000p-7f, 0x1.8000000000000p-7f, 0x1.c000000000000p-7f,
    0x1.0000000000000p-6f, 0x1.2000000000000p-6f, 0x1.4000000000000p-6f, 0x1.6000000000000p-6f, 0x1.8000000000000p-6f, 0x1.a000000000000p-6f, 0x1.c000000000000p-6f, 0x1.e000000000000p-6f,
    0x1.0000000000000p-5f, 0x1.2000000000000p-5f, 0x1.4000000000000p-5f, 0x1.6000000000000p-5f, 0x1.8000000000000p-5f, 0x1.a000000000000p-5f, 0x1.c000000000000p-5f, 0x1.e000000000000p-5f,
    0x1.0000000000000p-4f, 0x1.2000000000000p-4f, 0x1.4000000000000p-4f, 0x1.6000000000000p-4f, 0x1.8000000000000p-4f, 0x1.a000000000000p-4f, 0x1.c000000000000p-4f, 0x1.e000000000000p-4f,
    0x1.0000000000000p-3f, 0x1.2000000000000p-3f, 0x1.4000000000000p-3f, 0x1.6000000000000p-3f, 0x1.8000000000000p-3f, 0x1.a000000000000p-3f, 0x1.c000000000000p-3f, 0x1.e000000000000p-3f,
    0x1.0000000000000p-2f, 0x1.2000000000000p-2f, 0x1.4000000000000p-2f, 0x1.6000000000000p-2f, 0x1.8000000000000p-2f, 0x1.a000000000000p-2f, 0x1.c000000000000p-2f, 0x1.e000000000000p-2f,
    0x1.0000000000000p-1f, 0x1.2000000000000p-1f, 0x1.4000000000000p-1f, 0x1.6000000000000p-1f, 0x1.8000000000000p-1f, 0x1.a000000000000p-1f, 0x1.c000000000000p-1f, 0x1.e000000000000p-1f,
    0x1.0000000000000p+0f, 0x1.2000000000000p+0f, 0x1.4000000000000p+0f, 0x1.6000000000000p+0f, 0x1.8000000000000p+0f, 0x1.a000000000000p+0f, 0x1.c000000000000p+0f, 0x1.e000000000000p+0f,
    0x1.0000000000000p+1f, 0x1.2000000000000p+1f, 0x1.4000000000000p+1f, 0x1.6000000000000p+1f, 0x1.8000000000000p+1f, 0x1.a000000000000p+1f, 0x1.c000000000000p+1f, 0x1.e000000000000p+1f,
    0x1.0000000000000p+2f, 0x1.2000000000000p+2f, 0x1.4000000000000p+2f, 0x1.6000000000000p+2f, 0x1.8000000000000p+2f, 0x1.a000000000000p+2f, 0x1.c000000000000p+2f, 0x1.e000000000000p+2f,
    0x1.0000000000000p+3f, 0x1.2000000000000p+3f, 0x1.4000000000000p+3f, 0x1.6000000000000p+3f, 0x1.8000000000000p+3f, 0x1.a000000000000p+3f, 0x1.c000000000000p+3f, 0x1.e000000000000p+3f,
    0x1.0000000000000p+4f, 0x1.2000000000000p+4f, 0x1.4000000000000p+4f, 0x1.6000000000000p+4f, 0x1.8000000000000p+4f, 0x1.a000000000000p+4f, 0x1.c000000000000p+4f, 0x1.e000000000000p+4f,
    0x1.0000000000000p+5f, 0x1.2000000000000p+5f, 0x1.4000000000000p+5f, 0x1.6000000000000p+5f, 0x1.8000000000000p+5f, 0x1.a000000000000p+5f, 0x1.c000000000000p+5f, 0x1.e000000000000p+5f,
    0x1.0000000000000p+6f, 0x1.2000000000000p+6f, 0x1.4000000000000p+6f, 0x1.6000000000000p+6f, 0x1.8000000000000p+6f, 0x1.a000000000000p+6f, 0x1.c000000000000p+6f, 0x1.e000000000000p+6f,
    0x1.0000000000000p+7f, 0x1.2000000000000p+7f, 0x1.4000000000000p+7f, 0x1.6000000000000p+7f, 0x1.8000000000000p+7f, 0x1.a000000000000p+7f, 0x1.c000000000000p+7f, 0x1.e000000000000p+7f,
    0x1.0000000000000p+8f, 0x1.2000000000000p+8f, 0x1.4000000000000p+8f, 0x1.6000000000000p+8f, 0x1.8000000000000p+8f, 0x1.a000000000000p+8f, 0x1.c000000000000p+8f, 0x1.c000000000000p+8f,
    -0x0p+0f, -0x1.0000000000000p-9f, -0x1.0000000000000p-8f, -0x1.8000000000000p-8f, -0x1.0000000000000p-7f, -0x1.4000000000000p-7f, -0x1.8000000000000p-7f, -0x1.c000000000000p-7f,
    -0x1.0000000000000p-6f, -0x1.2000000000000p-6f, -0x1.4000000000000p-6f, -0x1.6000000000000p-6f, -0x1.8000000000000p-6f, -0x1.a000000000000p-6f, -0x1.c000000000000p-6f, -0x1.e000000000000p-6f,
    -0x1.0000000000000p-5f, -0x1.2000000000000p-5f, -0x1.4000000000000p-5f, -0x1.6000000000000p-5f, -0x1.8000000000000p-5f, -0x1.a000000000000p-5f, -0x1.c000000000000p-5f, -0x1.e000000000000p-5f,
    -0x1.0000000000000p-4f, -0x1.2000000000000p-4f, -0x1.4000000000000p-4f, -0x1.6000000000000p-4f, -0x1.8000000000000p-4f, -0x1.a000000000000p-4f, -0x1.c000000000000p-4f, -0x1.e000000000000p-4f,
    -0x1.0000000000000p-3f, -0x1.2000000000000p-3f, -0x1.4000000000000p-3f, -0x1.6000000000000p-3f, -0x1.8000000000000p-3f, -0x1.a000000000000p-3f, -0x1.c000000000000p-3f, -0x1.e000000000000p-3f,
    -0x1.0000000000000p-2f, -0x1.2000000000000p-2f, -0x1.4000000000000p-2f, -0x1.6000000000000p-2f, -0x1.8000000000000p-2f, -0x1.a000000000000p-2f, -0x1.c000000000000p-2f, -0x1.e000000000000p-2f,
    -0x1.0000000000000p-1f, -0x1.2000000000000p-1f, -0x1.4000000000000p-1f, -0x1.6000000000000p-1f, -0x1.8000000000000p-1f, -0x1.a000000000000p-1f, -0x1.c000000000000p-1f, -0x1.e000000000000p-1f,
    -0x1.0000000000000p+0f, -0x1.2000000000000p+0f, -0x1.4000000000000p+0f, -0x1.6000000000000p+0f, -0x1.8000000000000p+0f, -0x1.a000000000000p+0f, -0x1.c000000000000p+0f, -0x1.e000000000000p+0f,
    -0x1.0000000000000p+1f, -0x1.2000000000000p+1f, -0x1.4000000000000p+1f, -0x1.6000000000000p+1f, -0x1.8000000000000p+1f, -0x1.a000000000000p+1f, -0x1.c000000000000p+1f, -0x1.e000000000000p+1f,
    -0x1.0000000000000p+2f, -0x1.2000000000000p+2f, -0x1.4000000000000p+2f, -0x1.6000000000000p+2f, -0x1.8000000000000p+2f, -0x1.a000000000000p+2f, -0x1.c000000000000p+2f, -0x1.e000000000000p+2f,
    -0x1.0000000000000p+3f, -0x1.2000000000000p+3f, -0x1.4000000000000p+3f, -0x1.6000000000000p+3f, -0x1.8000000000000p+3f, -0x1.a000000000000p+3f, -0x1.c000000000000p+3f, -0x1.e000000000000p+3f,
    -0x1.0000000000000p+4f, -0x1.2000000000000p+4f, -0x1.4000000000000p+4f, -0x1.6000000000000p+4f, -0x1.8000000000000p+4f, -0x1.a000000000000p+4f, -0x1.c000000000000p+4f, -0x1.e000000000000p+4f,
    -0x1.0000000000000p+5f, -0x1.2000000000000p+5f, -0x1.4000000000000p+5f, -0x1.6000000000000p+5f, -0x1.8000000000000p+5f, -0x1.a000000000000p+5f, -0x1.c000000000000p+5f, -0x1.e000000000000p+5f,
    -0x1.0000000000000p+6f, -0x1.2000000000000p+6f, -0x1.4000000000000p+6f, -0x1.6000000000000p+6f, -0x1.8000000000000p+6f, -0x1.a000000000000p+6f, -0x1.c000000000000p+6f, -0x1.e000000000000p+6f,
    -0x1.0000000000000p+7f, -0x1.2000000000000p+7f, -0x1.4000000000000p+7f, -0x1.6000000000000p+7f, -0x1.8000000000000p+7f, -0x1.a000000000000p+7f, -0x1.c000000000000p+7f, -0x1.e000000000000p+7f,
    -0x1.0000000000000p+8f, -0x1.2000000000000p+8f, -0x1.4000000000000p+8f, -0x1.6000000000000p+8f, -0x1.8000000000000p+8f, -0x1.a000000000000p+8f, -0x1.c000000000000p+8f, -0x1.c000000000000p+8f,};

const float dsii_sp_e2m1_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

int dsii_sp_valid(int32_t format, uint32_t width, uint32_t qcols, uint32_t block) {
    if (format == DSII_SP_F32) return qcols == 0;
    if (format < DSII_SP_E4M3_UE8M0 || format > DSII_SP_E2M1_E4M3) return 0;
    return width > 0 && width % 8 == 0 && qcols > 0 && qcols <= width && block > 0 &&
           block % 8 == 0 && qcols % block == 0 && width <= (1u << 20);
}

uint32_t dsii_sp_row_bytes(int32_t format, uint32_t width, uint32_t qcols, uint32_t block) {
    if (format == DSII_SP_F32) return width * 4u;
    uint32_t head = dsii_sp_codes_bytes(format, qcols) + qcols / block;
    if (qcols == width) return head;
    return dsii_sp_tail_offset(format, qcols, block) + (width - qcols) * 4u;
}

static int same_bits(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

/* UE8M0 block: the smallest exponent e (−127 ≤ e ≤ 127) with amax ≤ gmax · 2^e. */
static uint8_t ue8m0_for(float amax, float gmax) {
    if (!(amax > 0.0f)) return 0; /* zeros (or NaN): any scale */
    int e = ilogbf(amax) - ilogbf(gmax) - 1;
    if (e < -127) e = -127;
    while (e < 127 && amax > ldexpf(gmax, e)) e++;
    return (uint8_t)(e + 127);
}

int dsii_sp_pack_row(int32_t format, uint32_t width, uint32_t qcols, uint32_t block,
                     const float *src, uint8_t *dst) {
    if (format == DSII_SP_F32) {
        memcpy(dst, src, (size_t)width * 4);
        return 0;
    }
    int lossy = 0;
    const uint32_t cb = dsii_sp_codes_bytes(format, qcols);
    uint8_t *codes = dst, *scales = dst + cb;
    const int fp8 = format == DSII_SP_E4M3_UE8M0;
    for (uint32_t b = 0; b < qcols / block; b++) {
        const float *v = src + (size_t)b * block;
        float amax = 0.0f;
        for (uint32_t i = 0; i < block; i++) {
            float a = fabsf(v[i]);
            if (a > amax) amax = a;
        }
        uint8_t sc;
        if (format == DSII_SP_E2M1_E4M3) {
            /* the quantiser's scale s has amax = g · s for a grid magnitude g */
            static const float g[7] = {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f};
            sc = 0;
            int found = !(amax > 0.0f);
            for (int k = 0; k < 7 && !found; k++) {
                float s = amax / g[k];
                uint8_t c = dsii_f32_to_e4m3(s);
                if (c == 0 || (c & 0x7F) == 0x7F || !same_bits(dsii_sp_e4m3_lut[c], s)) continue;
                int ok = 1;
                for (uint32_t i = 0; i < block && ok; i++)
                    ok = same_bits(dsii_e2m1_to_f32(dsii_f32_to_e2m1(v[i] / s)) * s, v[i]);
                if (ok) {
                    sc = c;
                    found = 1;
                }
            }
            if (!found) { /* off the grid: the quantiser's own recipe (§10.1) */
                float a = amax < 6.0f * 0x1p-9f ? 6.0f * 0x1p-9f : amax;
                sc = dsii_f32_to_e4m3(a / 6.0f);
                lossy = 1;
            }
        } else {
            sc = ue8m0_for(amax, fp8 ? 448.0f : 6.0f);
        }
        scales[b] = sc;
        float s = dsii_sp_scale(format, qcols, dst, b);
        for (uint32_t i = 0; i < block; i++) {
            uint32_t k = b * block + i;
            float x = s > 0.0f ? v[i] / s : 0.0f;
            uint8_t c = fp8 ? dsii_f32_to_e4m3(x) : dsii_f32_to_e2m1(x);
            if (s == 0.0f && signbit(v[i])) c = fp8 ? 0x80 : 0x8;
            float back = (fp8 ? dsii_sp_e4m3_lut[c] : dsii_sp_e2m1_lut[c]) * s;
            if (!same_bits(back, v[i])) lossy = 1;
            if (fp8) codes[k] = c;
            else if (k & 1) codes[k / 2] = (uint8_t)(codes[k / 2] | (c << 4));
            else codes[k / 2] = c;
        }
    }
    if (qcols < width) {
        uint32_t to = dsii_sp_tail_offset(format, qcols, block);
        for (uint32_t i = cb + qcols / block; i < to; i++) dst[i] = 0;
        memcpy(dst + to, src + qcols, (size_t)(width - qcols) * 4);
    }
    return lossy;
}

void dsii_sp_unpack_row(int32_t format, uint32_t width, uint32_t qcols, uint32_t block,
                        const uint8_t *src, float *dst) {
    if (format == DSII_SP_F32) {
        memcpy(dst, src, (size_t)width * 4);
        return;
    }
    for (uint32_t i = 0; i < width; i += 8) dsii_sp_decode8(format, qcols, block, src, i, dst + i);
}
