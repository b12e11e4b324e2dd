/*
 * IQ3_S weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ3_XXS's scheme
 * (iq3_xxs.c) with a 512-entry grid, explicit sign bytes and integer scales:
 *
 * Block (110 bytes, 256 elements; lib/quant/quant_ggml.c dsii_blk_iq3_s): d (f16) at 0;
 * qs[64] at 2 (low 8 bits of the grid index of row i < 64 = elements 4i .. 4i+3); qh[8] at
 * 66 (bit i mod 8 of qh[i / 8] = index bit 8 of row i, i.e. bit i of the u64 at 66); sign
 * bytes at 74 (bit e mod 8 of byte e / 8: element e negative, i.e. bit e mod 32 of the u32
 * at 74 + 4σ for sub-block σ = e / 32); scales[4] at 106 (ls_σ = nibble σ mod 2 of
 * scales[σ / 2], low first). Element e = 4i + j is
 *
 *   x_e = d · (2·ls_σ + 1) · grid[qs[i] | bit i of qh << 8][j] · (-1 if sign bit e)
 *
 * — ggml's d·(1 + 2·ls), already an odd integer; the grid bytes (1, 3, … 15) are the
 * unsigned operand of dpbusd / maddubs, the sign moves to the activation byte.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4: grid row 16v + j), which lie
 * in sub-block σ = 2v + j/8:
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 7620)
 *   S[j]   = Σ_{v<4} (2·ls_σ + 1) · I_v[j]                     (exact; |S| < 2^20)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = dsib_reduce32(acc) (nothing left to divide by).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* Grid row i of the super-block at blk. */
static inline uint32_t iq3_s_row(const uint8_t *blk, int i) {
    return dsii_iq3s_grid[blk[2 + i] | ((blk[66 + i / 8] >> (i % 8)) & 1) << 8];
}

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq3_s_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 110 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8;
                const uint32_t g4 = iq3_s_row(blk, 16 * v + j);
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 64 * v + 4 * j + k;
                    const int g = (int)((g4 >> (8 * k)) & 0xFF);
                    I += ((blk[74 + e / 8] >> (e % 8)) & 1 ? -g : g) * xq[e];
                }
                S[j] += (int32_t)(2 * ((blk[106 + s / 2] >> (4 * (s % 2))) & 15) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq3_s_rows_scalar, iq3_s_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s for DSIB_IQ_TILE_AVX2: its eight grid rows, its sign bytes as ±1 bytes, its
 * odd scale in every int16. */
DSIB_AI void iq3_s_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *q = blk + 2 + 8 * s;
    const uint32_t h = blk[66 + s];
    const uint32_t *G = dsii_iq3s_grid;
    *g = _mm256_set_epi32((int)G[q[7] | (h << 1 & 256)], (int)G[q[6] | (h << 2 & 256)],
                          (int)G[q[5] | (h << 3 & 256)], (int)G[q[4] | (h << 4 & 256)],
                          (int)G[q[3] | (h << 5 & 256)], (int)G[q[2] | (h << 6 & 256)],
                          (int)G[q[1] | (h << 7 & 256)], (int)G[q[0] | (h << 8 & 256)]);
    *sg = dsib_iq_signs_avx2(dsib_ld32(blk + 74 + 4 * s));
    *sc = _mm256_set1_epi16((short)(2 * ((blk[106 + s / 2] >> (4 * (s % 2))) & 15) + 1));
}

DSIB_IQ_TILE_AVX2(iq3_s_tile_avx2, 110, iq3_s_sub_avx2, 1.0f)

DSIB_QROWS_DEFINE_T(iq3_s_rows_avx2, iq3_s_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* For DSIB_IQ_TILE_AVX512: vector v = grid rows 16v .. 16v+15, gathered (vpgatherdd) at
 * their 9-bit indices (bit 8 of row 16v + i: bit i of the u16 at qh + 2v, a merge mask).
 * The gather measured faster here than sixteen scalar row loads with their bit-8 arithmetic
 * (one Zen 5 core hot: 4.6-4.9 against 3.7-4.0 GB/s; iq3_xxs.c, without the ninth bit, found
 * the opposite); the VBMI variant below looks the rows up in registers. */
DSIB_AI void iq3_s_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint64_t qh = dsib_ld64(blk + 66);
    for (int v = 0; v < 4; v++) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + 16 * v)));
        idx = _mm512_mask_or_epi32(idx, (__mmask16)(qh >> (16 * v)), idx, _mm512_set1_epi32(256));
        g[v] = _mm512_i32gather_epi32(idx, (const void *)dsii_iq3s_grid, 4);
    }
}

/* The sign bytes as they are (vector v's mask: the qword at 74 + 8v); the odd scales of
 * the eight sub-blocks as the scale pairs of DSIB_IQ_TILE_AVX512 (dword j of sc[0]:
 * sub-blocks (j/8, j/8 + 2), of sc[1]: (j/8 + 4, j/8 + 6)), one pshufb each from the eight
 * scale bytes in every 128-bit lane L (j/8 = L/2). */
DSIB_AI void iq3_s_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    for (int v = 0; v < 4; v++) ng[v] = _cvtu64_mask64(dsib_ld64(blk + 74 + 8 * v));
    const __m128i b = _mm_cvtsi32_si128((int)dsib_ld32(blk + 106)), m = _mm_set1_epi8(15);
    const __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    const __m512i o = _mm512_broadcast_i32x4(_mm_or_si128(_mm_add_epi8(n, n), _mm_set1_epi8(1)));
#define IQ3S_SC_(a) (int)(0x80008000u | (a) | ((a) + 2) << 16)
#define IQ3S_SC_L_(a) IQ3S_SC_(a), IQ3S_SC_(a), IQ3S_SC_(a), IQ3S_SC_(a)
    sc[0] = _mm512_shuffle_epi8(o, _mm512_set_epi32(IQ3S_SC_L_(1), IQ3S_SC_L_(1), IQ3S_SC_L_(0), IQ3S_SC_L_(0)));
    sc[1] = _mm512_shuffle_epi8(o, _mm512_set_epi32(IQ3S_SC_L_(5), IQ3S_SC_L_(5), IQ3S_SC_L_(4), IQ3S_SC_L_(4)));
#undef IQ3S_SC_L_
#undef IQ3S_SC_
}

DSIB_IQ_TILE_AVX512(iq3_s_tile_avx512, 110, iq3_s_grid_avx512, iq3_s_signs_avx512, 1.0f)

DSIB_QROWS_DEFINE_R(iq3_s_rows_avx512, iq3_s_tile_avx512, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI + VBMI: the grid looked up in registers ------------------------------
 *
 * Each grid row as four 3-bit level codes (level c = byte 2c + 1; element j at bits 3j;
 * generated from dsii_iq3s_grid, and every entry is exercised by the kernel tests' random
 * indices): the 64 indices of a super-block look their codes up in this 1 KiB table held
 * in sixteen registers (dsib_iq_codes512: vpermi2w on 64 entries, blends by index bits 6,
 * 7 and 8), vpmultishiftqb spreads each code to four bytes and vpshufb turns levels into
 * grid bytes. The same integers as the gathered rows, so the same results. */
static const uint16_t iq3_s_codes[512] __attribute__((aligned(64))) = {
    0x0000, 0x0001, 0x0002, 0x0005, 0x0007, 0x0008, 0x0009, 0x000a, 0x000c, 0x000e, 0x0010, 0x0011,
    0x0015, 0x001b, 0x0020, 0x0022, 0x0025, 0x0027, 0x0029, 0x002b, 0x0030, 0x0032, 0x0039, 0x003c,
    0x003f, 0x0040, 0x0041, 0x0042, 0x0044, 0x0048, 0x0049, 0x004d, 0x0050, 0x0053, 0x0057, 0x0059,
    0x005d, 0x0064, 0x0071, 0x0075, 0x007a, 0x0080, 0x0081, 0x0085, 0x0087, 0x0088, 0x008b, 0x008e,
    0x0091, 0x0095, 0x0098, 0x009c, 0x00a2, 0x00a5, 0x00a7, 0x00a9, 0x00ab, 0x00b8, 0x00bb, 0x00c3,
    0x00c9, 0x00cd, 0x00d0, 0x00d2, 0x00d9, 0x00db, 0x00de, 0x00e4, 0x00e8, 0x00ea, 0x00f7, 0x00f9,
    0x00fd, 0x0100, 0x010b, 0x010f, 0x0111, 0x0114, 0x011a, 0x0120, 0x0123, 0x0129, 0x0138, 0x0142,
    0x0144, 0x0150, 0x0152, 0x0156, 0x015b, 0x0161, 0x0165, 0x0167, 0x0176, 0x017b, 0x0186, 0x0189,
    0x018b, 0x0199, 0x01aa, 0x01b9, 0x01c0, 0x01c2, 0x01c4, 0x01d0, 0x01d2, 0x01d6, 0x01db, 0x01e8,
    0x01ec, 0x0200, 0x0201, 0x0202, 0x0204, 0x0208, 0x0209, 0x020b, 0x020d, 0x020f, 0x0210, 0x0212,
    0x0219, 0x021c, 0x021e, 0x022c, 0x022e, 0x0231, 0x023a, 0x0240, 0x0241, 0x0243, 0x0246, 0x0248,
    0x024c, 0x0251, 0x0258, 0x025b, 0x0261, 0x0268, 0x026a, 0x0278, 0x027e, 0x0280, 0x028a, 0x028d,
    0x028f, 0x0290, 0x0294, 0x029a, 0x02a0, 0x02a3, 0x02ad, 0x02b0, 0x02ba, 0x02c1, 0x02c4, 0x02c7,
    0x02c8, 0x02cb, 0x02d1, 0x02d7, 0x02d8, 0x02dc, 0x02e1, 0x02f2, 0x02f8, 0x0303, 0x0305, 0x030a,
    0x030c, 0x0319, 0x031b, 0x0322, 0x0326, 0x0328, 0x032c, 0x0341, 0x0348, 0x034b, 0x0351, 0x0358,
    0x035a, 0x0369, 0x0390, 0x0394, 0x0397, 0x03a4, 0x03a6, 0x03c1, 0x03c3, 0x03c8, 0x03ca, 0x03d1,
    0x03dd, 0x03e1, 0x03f2, 0x03f8, 0x0400, 0x0401, 0x0403, 0x0405, 0x0407, 0x0408, 0x040a, 0x040c,
    0x040e, 0x0411, 0x0413, 0x0417, 0x0418, 0x041a, 0x0421, 0x0423, 0x0425, 0x0428, 0x042a, 0x0437,
    0x0438, 0x043b, 0x043d, 0x0440, 0x0442, 0x0448, 0x044b, 0x044f, 0x0452, 0x0455, 0x0459, 0x045c,
    0x0462, 0x0469, 0x0481, 0x0484, 0x0487, 0x0491, 0x0493, 0x0498, 0x049f, 0x04a1, 0x04ab, 0x04af,
    0x04b9, 0x04bc, 0x04c0, 0x04c2, 0x04c5, 0x04c9, 0x04d2, 0x04d4, 0x04d9, 0x04db, 0x04e2, 0x04e8,
    0x04f6, 0x0501, 0x0507, 0x0510, 0x0513, 0x051a, 0x051d, 0x0521, 0x053a, 0x053d, 0x0544, 0x0549,
    0x0552, 0x055f, 0x0560, 0x056b, 0x0578, 0x0580, 0x0582, 0x0587, 0x0591, 0x05ad, 0x05b1, 0x05c5,
    0x05c9, 0x05d6, 0x05d8, 0x05e3, 0x05e8, 0x0602, 0x0609, 0x060b, 0x060d, 0x060f, 0x0612, 0x0619,
    0x061b, 0x061d, 0x0622, 0x0624, 0x0627, 0x0629, 0x0633, 0x0639, 0x0641, 0x0643, 0x0645, 0x064c,
    0x0651, 0x0653, 0x0660, 0x0670, 0x067a, 0x067e, 0x0680, 0x068a, 0x0690, 0x069a, 0x069c, 0x06a8,
    0x06c1, 0x06c8, 0x06cc, 0x06d1, 0x06d3, 0x06d7, 0x06d8, 0x06e1, 0x06e3, 0x06e7, 0x06ed, 0x06fb,
    0x0703, 0x0709, 0x070e, 0x0712, 0x0719, 0x072a, 0x0730, 0x0734, 0x0741, 0x0748, 0x074a, 0x0755,
    0x075a, 0x0764, 0x076e, 0x077b, 0x078e, 0x07a1, 0x07c1, 0x07c3, 0x07d0, 0x07d2, 0x07dd, 0x0800,
    0x0804, 0x080a, 0x0810, 0x0814, 0x0817, 0x081a, 0x0821, 0x0828, 0x0838, 0x0842, 0x0847, 0x0849,
    0x084b, 0x0852, 0x0858, 0x085d, 0x0863, 0x0869, 0x086d, 0x0881, 0x0883, 0x0888, 0x088d, 0x0891,
    0x089b, 0x08a0, 0x08af, 0x08b2, 0x08b8, 0x08c4, 0x08c9, 0x08cb, 0x08d0, 0x08d2, 0x08d9, 0x08dd,
    0x0900, 0x0902, 0x0914, 0x091f, 0x0920, 0x0939, 0x0945, 0x0947, 0x0951, 0x0972, 0x098b, 0x099c,
    0x09b0, 0x09c8, 0x09cd, 0x09d8, 0x09e3, 0x09e9, 0x0a02, 0x0a08, 0x0a0c, 0x0a12, 0x0a20, 0x0a24,
    0x0a27, 0x0a2a, 0x0a36, 0x0a3c, 0x0a41, 0x0a43, 0x0a45, 0x0a4a, 0x0a51, 0x0a5a, 0x0a7a, 0x0a80,
    0x0a89, 0x0a93, 0x0a98, 0x0a9e, 0x0aab, 0x0ac2, 0x0ac7, 0x0ac8, 0x0ad7, 0x0ae4, 0x0ae9, 0x0af5,
    0x0afb, 0x0b01, 0x0b04, 0x0b10, 0x0b1a, 0x0b26, 0x0b4a, 0x0b56, 0x0b69, 0x0b6b, 0x0ba2, 0x0bc2,
    0x0bc4, 0x0bd2, 0x0c09, 0x0c0b, 0x0c0d, 0x0c19, 0x0c1b, 0x0c30, 0x0c40, 0x0c50, 0x0c57, 0x0c74,
    0x0c8a, 0x0c9c, 0x0ca2, 0x0cad, 0x0cb2, 0x0cb8, 0x0cc0, 0x0ccc, 0x0cd1, 0x0ce0, 0x0d15, 0x0d23,
    0x0d32, 0x0d40, 0x0d43, 0x0d5c, 0x0d70, 0x0d85, 0x0da0, 0x0dc9, 0x0dcb, 0x0e00, 0x0e04, 0x0e07,
    0x0e10, 0x0e12, 0x0e1e, 0x0e20, 0x0e2c, 0x0e32, 0x0e42, 0x0e49, 0x0e54, 0x0e63, 0x0e65, 0x0e81,
    0x0e84, 0x0e88, 0x0e8e, 0x0e91, 0x0e98, 0x0ea9, 0x0ec2, 0x0eda, 0x0edd, 0x0eeb, 0x0f01, 0x0f05,
    0x0f0b, 0x0f10, 0x0f28, 0x0f52, 0x0f62, 0x0f82, 0x0f99, 0x0fc0,
};

DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI)

DSIB_AI void iq3_s_grid_vbmi(const uint8_t *blk, __m512i g[4]) {
    const __m512i *tab = (const __m512i *)(const void *)iq3_s_codes;
    const uint64_t qh = dsib_ld64(blk + 66);
    __m512i c[2];
    for (int h = 0; h < 2; h++) { /* word k of c[h]: the code of row 32h + k */
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2 + 32 * h));
        c[h] = dsib_iq_codes512(tab, _mm512_cvtepu8_epi16(qs), (__mmask32)(qh >> (32 * h)));
    }
    const __m512i shifts = _mm512_set1_epi64(0x2926232009060300ll); /* byte 4i + j: bits 32i + 3j */
    const __m512i lv = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0));
    /* the four 16-code halves (immediate extracts: a loop index is no immediate at -O0) */
    const __m256i half[4] = {_mm512_castsi512_si256(c[0]), _mm512_extracti64x4_epi64(c[0], 1),
                             _mm512_castsi512_si256(c[1]), _mm512_extracti64x4_epi64(c[1], 1)};
    for (int v = 0; v < 4; v++) { /* dword i: the code of row 16v + i, spread to its four levels */
        const __m512i q = _mm512_cvtepu16_epi32(half[v]);
        g[v] = _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, q), _mm512_set1_epi8(7)));
    }
}

DSIB_IQ_TILE_AVX512(iq3_s_tile_vbmi, 110, iq3_s_grid_vbmi, iq3_s_signs_avx512, 1.0f)
/* one row per tile in the later token tiles too: with two rows the table registers and the
 * 2 x 4 accumulators spill (prefill, one Zen 5 core: RR = 1 measured 15-28 % faster) */
DSIB_QROWS_DEFINE_R(iq3_s_rows_vbmi, iq3_s_tile_vbmi, 1)

DSIB_TARGET_POP

static void iq3_s_rows_avx512_any(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                                  const dsib_qrow *x, float *const *yp, int n) {
    if (dsib_kern_iq2_vbmi && dsib_kern_cpu_vbmi())
        iq3_s_rows_vbmi(w, rb, n_in, o0, o1, x, yp, n);
    else
        iq3_s_rows_avx512(w, rb, n_in, o0, o1, x, yp, n);
}

const dsib_kern_qtype dsib_kq_iq3_s = {
    DSIB_TYPE_IQ3_S, DSIB_ACT_Q8_K, {iq3_s_rows_scalar, iq3_s_rows_avx2, NULL, iq3_s_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_iq3_s = {DSIB_TYPE_IQ3_S, DSIB_ACT_Q8_K, {iq3_s_rows_scalar}};

#endif
