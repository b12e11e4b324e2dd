/*
 * lib/quant/statepack.h — packed session-state rows (docs/internals.md "State layout").
 *
 * The forward pass rounds the window KV, the compressed KV rows and the index keys onto the
 * FP8 / FP4 grids before storing them (model-spec §3.4, §4.3, §10.1), so those rows can be
 * stored in their quantised form without losing a bit. A packed row of `width` values whose
 * first `qcols` are quantised in blocks of `block` (the rest, e.g. V4's RoPE dims, stay f32):
 *
 *   codes   qcols bytes (E4M3) or qcols / 2 bytes (E2M1: element 2i in the low nibble)
 *   scales  qcols / block bytes (UE8M0 exponent byte, or an E4M3 byte for DSIB_STATE_E2M1_E4M3)
 *   pad     to a multiple of 4 bytes (only when an f32 tail follows)
 *   tail    (width − qcols) f32 values
 *
 * Element i < qcols decodes to grid(code_i) · scale(block of i); that product is exact in
 * f32 (the grids have at most 4 significant bits and the scales are powers of two or E4M3
 * values), so a row of values that lie on the grid (fake-quant output) unpacks to the very
 * same f32 bits. The packer does not have to know the scale the quantiser used: for UE8M0
 * it takes the smallest power of two that brings the block's largest magnitude into range
 * (never larger than the quantiser's, so every value stays on the grid); for E4M3 scales it
 * tries the E4M3 numbers amax / g for the grid magnitudes g (the quantiser's scale is one of
 * them) and keeps the first for which every value is representable. A row that is not on
 * any grid (never produced by the forward pass with the rounding on) packs to the nearest
 * values and the packer reports it.
 */
#ifndef DSI_QUANT_STATEPACK_H
#define DSI_QUANT_STATEPACK_H

#include <stdint.h>
#include <string.h>

/* Formats (the same numbers as backends/backend.h DSIB_STATE_*). */
enum {
    DSII_SP_F32 = 0,
    DSII_SP_E4M3_UE8M0 = 1,  /* FP8 E4M3 values, UE8M0 block scales */
    DSII_SP_E2M1_UE8M0 = 2,  /* FP4 E2M1 values, UE8M0 block scales */
    DSII_SP_E2M1_E4M3 = 3    /* FP4 E2M1 values, E4M3 block scales (V4.1 compressed KV) */
};

/* E4M3FN value of every byte (0x7F / 0xFF, the NaN codes, never stored: read as ±448). */
extern const float dsii_sp_e4m3_lut[256];
/* E2M1 value of every 4-bit code. */
extern const float dsii_sp_e2m1_lut[16];

/* Valid (format, width, qcols, block): 1, else 0. F32 needs qcols = 0. (Inline, like the
 * layout helpers below: the backend modules, which do not link the core, use them too.) */
static inline int dsii_sp_valid(int32_t format, uint32_t width, uint32_t qcols, uint32_t block) {
    if (format == DSII_SP_F32) return qcols == 0;
    if (format < DSII_SP_E4M3_UE8M0 || format > DSII_SP_E2M1_E4M3) return 0;
    return width > 0 && width % 8 == 0 && qcols > 0 && qcols <= width && block > 0 &&
           block % 8 == 0 && qcols % block == 0 && width <= (1u << 20);
}
/* Byte offset of the scales and of the f32 tail inside a row. */
static inline uint32_t dsii_sp_codes_bytes(int32_t format, uint32_t qcols) {
    return format == DSII_SP_E4M3_UE8M0 ? qcols : qcols / 2;
}
static inline uint32_t dsii_sp_tail_offset(int32_t format, uint32_t qcols, uint32_t block) {
    return (dsii_sp_codes_bytes(format, qcols) + qcols / block + 3u) & ~3u;
}
/* Bytes of one packed row (F32: width · 4). */
static inline uint32_t dsii_sp_row_bytes(int32_t format, uint32_t width, uint32_t qcols,
                                         uint32_t block) {
    if (format == DSII_SP_F32) return width * 4u;
    uint32_t head = dsii_sp_codes_bytes(format, qcols) + qcols / block;
    if (qcols == width) return head;
    return dsii_sp_tail_offset(format, qcols, block) + (width - qcols) * 4u;
}

/* Packs width f32 values into one row; returns 0 when the row is exact (unpacks to the
 * same bits), 1 when some value was not representable (rounded). */
int dsii_sp_pack_row(int32_t format, uint32_t width, uint32_t qcols, uint32_t block,
                     const float *src, uint8_t *dst);
/* Unpacks one row into width f32 values. */
void dsii_sp_unpack_row(int32_t format, uint32_t width, uint32_t qcols, uint32_t block,
                        const uint8_t *src, float *dst);

/* Scale of block b of a packed row (row = the row's first byte). */
static inline float dsii_sp_scale(int32_t format, uint32_t qcols, const uint8_t *row,
                                  uint32_t b) {
    uint8_t c = row[dsii_sp_codes_bytes(format, qcols) + b];
    if (format == DSII_SP_E2M1_E4M3) return dsii_sp_e4m3_lut[c];
    uint32_t bits = c ? (uint32_t)c << 23 : 0x00400000u; /* 2^(c−127); c = 0: 2^-127 */
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Decodes the 8 values [i, i+8) of a packed row (i a multiple of 8, block a multiple of
 * 8): inside the quantised part from codes and scales, else from the f32 tail. */
static inline void dsii_sp_decode8(int32_t format, uint32_t qcols, uint32_t block,
                                   const uint8_t *row, uint32_t i, float *out) {
    if (i >= qcols) {
        memcpy(out, row + dsii_sp_tail_offset(format, qcols, block) + (size_t)(i - qcols) * 4,
               32);
        return;
    }
    float s = dsii_sp_scale(format, qcols, row, i / block);
    if (format == DSII_SP_E4M3_UE8M0) {
        const uint8_t *c = row + i;
        for (int j = 0; j < 8; j++) out[j] = dsii_sp_e4m3_lut[c[j]] * s;
    } else {
        const uint8_t *c = row + i / 2;
        for (int j = 0; j < 4; j++) {
            out[2 * j] = dsii_sp_e2m1_lut[c[j] & 15u] * s;
            out[2 * j + 1] = dsii_sp_e2m1_lut[c[j] >> 4] * s;
        }
    }
}

#endif /* DSI_QUANT_STATEPACK_H */
