/*
 * IQ2_XS weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ2_XXS's scheme
 * (iq2_xxs.c) with a 512-entry grid and a scale per 16 elements:
 *
 * Block (74 bytes, 256 elements; lib/quant/quant_ggml.c dsii_blk_iq2_xs): d (f16) at 0;
 * u16 q_k at 2 + 2k for the group k < 32 of eight elements 8k .. 8k+7 (grid index q & 511,
 * sign index q >> 9); scale bytes at 66 + σ (sub-block σ of 32: ls of its 16-element half
 * h = nibble h, low first). Element e = 32σ + 8l + j (k = 4σ + l, h = l / 2) is
 *
 *   x_e = d · (2·ls_{σ,h} + 1) / 8 · grid[q_k & 511][j] · (-1 if bit j of ksigns[q_k >> 9])
 *
 * — ggml's d·(0.5 + ls)·0.25 as an odd integer over 8; the grid bytes (8, 25, 43) are the
 * unsigned operand of dpbusd / maddubs, the sign moves to the activation byte.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), which lie in sub-block
 * σ = 2v + j/8 and its half h = (j mod 8)/4 (scale nibble n = 2σ + h):
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 21844)
 *   S[j]   = Σ_{v<4} (2·ls_n + 1) · I_v[j]                     (exact; |S| < 2^22)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = 0.125f · dsib_reduce32(acc) (the /8, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* The eight sign bits of group k (bit j: element 8k + j negative). */
static inline uint32_t iq2_xs_signs8(uint16_t q) { return dsii_ksigns_iq2xs[q >> 9]; }

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq2_xs_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 74 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8, h = (j % 8) / 4;
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (j % 8) + k; /* element within the sub-block */
                    const uint16_t q = dsib_ld16(blk + 2 + 2 * (4 * s + e / 8));
                    const int g = (int)((dsii_iq2xs_grid[q & 511] >> (8 * (e % 8))) & 0xFF);
                    I += ((iq2_xs_signs8(q) >> (e % 8)) & 1 ? -g : g) * xq[64 * v + 4 * j + k];
                }
                S[j] += (int32_t)(2 * ((blk[66 + s] >> (4 * h)) & 15) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.125f * dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq2_xs_rows_scalar, iq2_xs_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s for DSIB_IQ_TILE_AVX2: its four grid rows, its signs as ±1 bytes, its two
 * odd scales (words 0-7: elements 0-15, words 8-15: 16-31). */
DSIB_AI void iq2_xs_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *p = blk + 2 + 8 * s;
    const uint16_t q0 = dsib_ld16(p), q1 = dsib_ld16(p + 2), q2 = dsib_ld16(p + 4), q3 = dsib_ld16(p + 6);
    const uint64_t *G = dsii_iq2xs_grid;
    *g = _mm256_set_epi64x((long long)G[q3 & 511], (long long)G[q2 & 511], (long long)G[q1 & 511],
                           (long long)G[q0 & 511]);
    *sg = dsib_iq_signs4_avx2(q0 >> 9, q1 >> 9, q2 >> 9, q3 >> 9);
    *sc = dsib_iq_scales16_avx2(blk[66 + s]);
}

DSIB_IQ_TILE_AVX2(iq2_xs_tile_avx2, 74, iq2_xs_sub_avx2, 0.125f)

DSIB_QROWS_DEFINE_T(iq2_xs_rows_avx2, iq2_xs_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* For DSIB_IQ_TILE_AVX512: vector v = groups 8v .. 8v+7, their 64 grid bytes from scalar
 * row loads (an eight-lane vpgatherdq measured slower: one Zen 5 core hot 4.5-4.9 against
 * 8.1-8.8 GB/s; the VBMI variant below looks the rows up in registers). */
DSIB_AI void iq2_xs_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint64_t *G = dsii_iq2xs_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *p = blk + 2 + 16 * v;
        g[v] = _mm512_set_epi64((long long)G[dsib_ld16(p + 14) & 511], (long long)G[dsib_ld16(p + 12) & 511],
                                (long long)G[dsib_ld16(p + 10) & 511], (long long)G[dsib_ld16(p + 8) & 511],
                                (long long)G[dsib_ld16(p + 6) & 511], (long long)G[dsib_ld16(p + 4) & 511],
                                (long long)G[dsib_ld16(p + 2) & 511], (long long)G[dsib_ld16(p) & 511]);
    }
}

/* The signs of the 32 groups: each 7-bit sign index (q >> 9) and its parity in bit 7
 * (ksigns's rule) computed in the 32 words, narrowed to bytes (byte k = group k), so
 * vector v's mask is qword v; the scales by dsib_iq_scales16_avx512. */
DSIB_AI void iq2_xs_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    const __m512i i7 = _mm512_srli_epi16(_mm512_loadu_si512(blk + 2), 9);
    __m512i par = _mm512_xor_si512(i7, _mm512_srli_epi16(i7, 4));
    par = _mm512_xor_si512(par, _mm512_srli_epi16(par, 2));
    par = _mm512_xor_si512(par, _mm512_srli_epi16(par, 1));
    const __m256i m = _mm512_cvtepi16_epi8(
        _mm512_or_si512(i7, _mm512_slli_epi16(_mm512_and_si512(par, _mm512_set1_epi16(1)), 7)));
    dsib_iq_masks_avx512(m, ng);
    dsib_iq_scales16_avx512(blk + 66, sc);
}

DSIB_IQ_TILE_AVX512(iq2_xs_tile_avx512, 74, iq2_xs_grid_avx512, iq2_xs_signs_avx512, 0.125f)

DSIB_QROWS_DEFINE_R(iq2_xs_rows_avx512, iq2_xs_tile_avx512, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI + VBMI: the grid looked up in registers ------------------------------
 *
 * Each grid row as eight 2-bit level codes (level 0, 1, 2 = byte 8, 25, 43; element j at
 * bits 2j; generated from dsii_iq2xs_grid, and every entry is exercised by the kernel tests'
 * random indices): the 32 indices of a super-block look their codes up in this 1 KiB table
 * held in sixteen registers (dsib_iq_codes512), vpmultishiftqb spreads each code to eight
 * bytes and vpshufb turns levels into grid bytes (iq2_xxs.c's VBMI variant with twice the
 * entries). The same integers as the scalar loads, so the same results. */
static const uint16_t iq2_xs_codes[512] __attribute__((aligned(64))) = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0016, 0x0019, 0x0020, 0x0022, 0x0025,
    0x0028, 0x0041, 0x0044, 0x0046, 0x0049, 0x0050, 0x0052, 0x0055, 0x0058, 0x0061, 0x0064, 0x0080,
    0x0082, 0x0085, 0x0088, 0x0091, 0x0094, 0x0099, 0x00a0, 0x0101, 0x0104, 0x0106, 0x0109, 0x0110,
    0x0112, 0x0115, 0x0118, 0x011a, 0x0121, 0x0124, 0x0140, 0x0142, 0x0145, 0x0148, 0x0151, 0x0154,
    0x0160, 0x0168, 0x0181, 0x0184, 0x0190, 0x0200, 0x0202, 0x0205, 0x0208, 0x0211, 0x0214, 0x0220,
    0x0241, 0x0244, 0x0250, 0x0255, 0x0280, 0x028a, 0x0401, 0x0404, 0x0406, 0x0409, 0x0410, 0x0412,
    0x0415, 0x0418, 0x0421, 0x0424, 0x0440, 0x0442, 0x0445, 0x0448, 0x0451, 0x0454, 0x0456, 0x0460,
    0x0481, 0x0484, 0x0490, 0x0500, 0x0502, 0x0505, 0x0508, 0x0511, 0x0514, 0x0520, 0x0541, 0x0544,
    0x0550, 0x0561, 0x0580, 0x0601, 0x0604, 0x0610, 0x0626, 0x0640, 0x0642, 0x0684, 0x0800, 0x0802,
    0x0805, 0x0808, 0x080a, 0x0811, 0x0814, 0x0820, 0x0825, 0x0841, 0x0844, 0x0850, 0x0858, 0x0880,
    0x08a0, 0x08aa, 0x0901, 0x0904, 0x0910, 0x0940, 0x0981, 0x0989, 0x0a00, 0x0a20, 0x0a28, 0x0a96,
    0x0aa0, 0x1001, 0x1004, 0x1006, 0x1009, 0x1010, 0x1012, 0x1015, 0x1018, 0x1021, 0x1024, 0x1040,
    0x1042, 0x1045, 0x1048, 0x1051, 0x1054, 0x1060, 0x106a, 0x1081, 0x1084, 0x1090, 0x1100, 0x1102,
    0x1105, 0x1108, 0x1111, 0x1114, 0x1120, 0x1141, 0x1144, 0x1150, 0x1180, 0x1194, 0x1196, 0x1201,
    0x1204, 0x1206, 0x1210, 0x1240, 0x1260, 0x1400, 0x1402, 0x1405, 0x1408, 0x1411, 0x1414, 0x1420,
    0x1441, 0x1444, 0x1449, 0x1450, 0x1464, 0x1480, 0x1501, 0x1504, 0x1510, 0x1540, 0x1600, 0x1614,
    0x1649, 0x1801, 0x1804, 0x1810, 0x1812, 0x1840, 0x1854, 0x1886, 0x1900, 0x1905, 0x1966, 0x1a51,
    0x1aa9, 0x2000, 0x2002, 0x2005, 0x2008, 0x200a, 0x2011, 0x2014, 0x2020, 0x2041, 0x2044, 0x2050,
    0x2080, 0x20a0, 0x2101, 0x2104, 0x2110, 0x2140, 0x2148, 0x2165, 0x2200, 0x2222, 0x2280, 0x22a8,
    0x2401, 0x2404, 0x2410, 0x2429, 0x2440, 0x2500, 0x2541, 0x2552, 0x2599, 0x2601, 0x261a, 0x26a6,
    0x2800, 0x2808, 0x280a, 0x2820, 0x2855, 0x2888, 0x28a2, 0x2968, 0x2990, 0x2a08, 0x2a20, 0x2a82,
    0x2a88, 0x2a8a, 0x4001, 0x4004, 0x4006, 0x4009, 0x4010, 0x4012, 0x4015, 0x4018, 0x4021, 0x4024,
    0x4040, 0x4042, 0x4045, 0x4048, 0x404a, 0x4051, 0x4054, 0x4060, 0x4065, 0x4081, 0x4084, 0x4090,
    0x4100, 0x4102, 0x4105, 0x4108, 0x4111, 0x4114, 0x4120, 0x4141, 0x4144, 0x4150, 0x4180, 0x4185,
    0x41a2, 0x4201, 0x4204, 0x4210, 0x4212, 0x4229, 0x4240, 0x4400, 0x4402, 0x4405, 0x4408, 0x4411,
    0x4414, 0x4419, 0x4420, 0x4441, 0x4444, 0x4450, 0x4480, 0x4494, 0x4501, 0x4504, 0x4510, 0x4524,
    0x4540, 0x459a, 0x4600, 0x460a, 0x4644, 0x4650, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845, 0x4854,
    0x4862, 0x4900, 0x4911, 0x4944, 0x4950, 0x4969, 0x4a04, 0x5000, 0x5002, 0x5005, 0x5008, 0x5011,
    0x5014, 0x5020, 0x5028, 0x5041, 0x5044, 0x5050, 0x5080, 0x5101, 0x5104, 0x5110, 0x5115, 0x5140,
    0x5142, 0x5200, 0x5244, 0x52aa, 0x5401, 0x5404, 0x5410, 0x5421, 0x5440, 0x5460, 0x5481, 0x54a1,
    0x5500, 0x5508, 0x5580, 0x5588, 0x5621, 0x5668, 0x56a1, 0x5800, 0x5814, 0x5841, 0x5850, 0x5899,
    0x591a, 0x5940, 0x5942, 0x5a85, 0x6001, 0x6004, 0x6010, 0x6040, 0x6054, 0x6062, 0x6086, 0x60a9,
    0x6100, 0x6224, 0x624a, 0x6292, 0x6400, 0x6416, 0x6510, 0x6540, 0x6545, 0x65a4, 0x6801, 0x686a,
    0x6925, 0x6a06, 0x6a54, 0x6a62, 0x8000, 0x8002, 0x8005, 0x8008, 0x8011, 0x8014, 0x8020, 0x802a,
    0x8041, 0x8044, 0x8050, 0x8080, 0x8082, 0x80a8, 0x80aa, 0x8101, 0x8104, 0x8106, 0x8110, 0x8140,
    0x8151, 0x8159, 0x8200, 0x8220, 0x8280, 0x8282, 0x82a0, 0x82a8, 0x8401, 0x8404, 0x8410, 0x8412,
    0x8415, 0x8440, 0x8460, 0x8489, 0x8500, 0x8544, 0x85a5, 0x8618, 0x866a, 0x8800, 0x8808, 0x8825,
    0x885a, 0x8880, 0x8882, 0x88a8, 0x8906, 0x8a22, 0x8a80, 0x8a88, 0x8a96, 0x8aa8, 0x9001, 0x9004,
    0x9010, 0x9040, 0x9056, 0x9084, 0x9100, 0x9122, 0x9164, 0x9256, 0x9289, 0x9400, 0x9405, 0x9444,
    0x9450, 0x9458, 0x9529, 0x9590, 0x9592, 0x9641, 0x9851, 0x98a6, 0x9949, 0x9a15, 0x9a60, 0xa000,
    0xa002, 0xa008, 0xa00a, 0xa020, 0xa02a, 0xa0a0, 0xa151, 0xa159, 0xa1a6, 0xa200, 0xa202, 0xa208,
    0xa22a, 0xa280, 0xa2a0, 0xa440, 0xa495, 0xa665, 0xa698, 0xa80a, 0xa820, 0xa822, 0xa828, 0xa8a0,
    0xa8a8, 0xa904, 0xa984, 0xa986, 0xaa28, 0xaa2a, 0xaa91, 0xaaaa,
};

DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI)

DSIB_AI void iq2_xs_grid_vbmi(const uint8_t *blk, __m512i g[4]) {
    const __m512i iw = _mm512_loadu_si512(blk + 2); /* word k: group k's index (bits 0-8) */
    const __m512i c = dsib_iq_codes512((const __m512i *)(const void *)iq2_xs_codes, iw,
                                       _mm512_test_epi16_mask(iw, _mm512_set1_epi16(256)));
    const __m512i shifts = _mm512_set1_epi64(0x0e0c0a0806040200ll); /* byte j: bits 2j.. */
    const __m512i lv = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    for (int v = 0; v < 4; v++) { /* vector v: code 8v + k in qword k, spread to its eight levels */
        const __m512i q = _mm512_permutexvar_epi16(
            _mm512_set_epi64(8 * v + 7, 8 * v + 6, 8 * v + 5, 8 * v + 4, 8 * v + 3, 8 * v + 2, 8 * v + 1, 8 * v), c);
        g[v] = _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, q), _mm512_set1_epi8(3)));
    }
}

/* Signs as iq2_xs_signs_avx512, with VBMI: vpmultishiftqb cuts the 7-bit sign indices of the
 * four words of each qword into its low bytes, vpermi2b looks them up in ksigns (128 bytes,
 * two registers: the parity bit added), vpmovqd packs the 32 sign bytes (byte k = group k). */
DSIB_AI void iq2_xs_signs_vbmi(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    const __m512i ks0 = _mm512_loadu_si512(dsii_ksigns_iq2xs), ks1 = _mm512_loadu_si512(dsii_ksigns_iq2xs + 64);
    const __m512i idx = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x39291909ll), _mm512_loadu_si512(blk + 2));
    const __m256i m = _mm512_cvtepi64_epi32(_mm512_permutex2var_epi8(ks0, idx, ks1));
    dsib_iq_masks_avx512(m, ng);
    dsib_iq_scales16_avx512(blk + 66, sc);
}

DSIB_IQ_TILE_AVX512(iq2_xs_tile_vbmi, 74, iq2_xs_grid_vbmi, iq2_xs_signs_vbmi, 0.125f)
/* one row per tile in the later token tiles too: with two rows the table registers and the
 * 2 x 4 accumulators spill (prefill, one Zen 5 core: RR = 1 measured 15-28 % faster) */
DSIB_QROWS_DEFINE_R(iq2_xs_rows_vbmi, iq2_xs_tile_vbmi, 1)

DSIB_TARGET_POP

static void iq2_xs_rows_avx512_any(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                                   const dsib_qrow *x, float *const *yp, int n) {
    if (dsib_kern_iq2_vbmi && dsib_kern_cpu_vbmi())
        iq2_xs_rows_vbmi(w, rb, n_in, o0, o1, x, yp, n);
    else
        iq2_xs_rows_avx512(w, rb, n_in, o0, o1, x, yp, n);
}

const dsib_kern_qtype dsib_kq_iq2_xs = {
    DSIB_TYPE_IQ2_XS, DSIB_ACT_Q8_K, {iq2_xs_rows_scalar, iq2_xs_rows_avx2, NULL, iq2_xs_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_iq2_xs = {DSIB_TYPE_IQ2_XS, DSIB_ACT_Q8_K, {iq2_xs_rows_scalar}};

#endif
