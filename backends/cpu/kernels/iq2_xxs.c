/*
 * IQ2_XXS weights × DSIB_ACT_Q8_K activations (default path; kernels.h).
 *
 * Block (66 bytes, 256 elements; docs/tensor-types.md): d (f16) at 0; sub-block s < 8 (32
 * elements) at 2 + 8s: four grid index bytes g[l], then a u32 w (sign index of group l =
 * (w >> 7l) & 127, scale ls = w >> 28). Element e = 32s + 8l + j is
 *
 *   x_e = d · (2·ls + 1) / 8 · grid[g[l]][j] · (-1 if bit j of ksigns[(w >> 7l) & 127])
 *
 * — ggml's d·(0.5 + ls)·0.25 written as an odd integer over 8, so every product below is an
 * integer: the grid values (8, 25, 43) are the unsigned bytes of dpbusd / maddubs and the
 * sign moves to the activation byte (|q| <= 127, so -q never overflows).
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), which lie in sub-block
 * σ = 2v + j/8:
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 21844)
 *   S[j]   = Σ_{v<4} (2·ls_σ + 1) · I_v[j]                     (exact; |S| < 2^22)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = 0.125f · dsib_reduce32(acc) (the /8, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>
#include <stdatomic.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq2_xxs_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 66 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const uint8_t *sb = blk + 2 + 8 * (2 * v + j / 8);
                const uint32_t w = dsib_ld32(sb + 4), sg = dsib_iq_signs32(w);
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (j % 8) + k; /* element within the sub-block */
                    const int g = (int)((dsii_iq2xxs_grid[sb[e / 8]] >> (8 * (e % 8))) & 0xFF);
                    I += ((sg >> e) & 1 ? -g : g) * xq[64 * v + 4 * j + k];
                }
                S[j] += (int32_t)(2 * (w >> 28) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.125f * dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq2_xxs_rows_scalar, iq2_xxs_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s of the super-block at blk for DSIB_IQ_TILE_AVX2: its 32 grid bytes, its signs
 * as ±1 bytes, its odd scale 2·ls + 1 in every int16. */
DSIB_AI void iq2_xxs_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *sb = blk + 2 + 8 * s;
    const uint32_t w = dsib_ld32(sb + 4);
    *g = _mm256_set_epi64x((long long)dsii_iq2xxs_grid[sb[3]], (long long)dsii_iq2xxs_grid[sb[2]],
                           (long long)dsii_iq2xxs_grid[sb[1]], (long long)dsii_iq2xxs_grid[sb[0]]);
    *sg = dsib_iq_signs_avx2(dsib_iq_signs32(w));
    *sc = _mm256_set1_epi16((short)(2 * (w >> 28) + 1));
}

DSIB_IQ_TILE_AVX2(iq2_xxs_tile_avx2, 66, iq2_xxs_sub_avx2, 0.125f)

DSIB_QROWS_DEFINE_T(iq2_xxs_rows_avx2, iq2_xxs_tile_avx2, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* For DSIB_IQ_TILE_AVX512 (simd_avx512.h): vector v = sub-blocks 2v, 2v+1, its 64 grid bytes
 * from scalar row loads (a gather measured slower; the VBMI variant below looks them up in
 * registers); the signs and scales of the eight sub-blocks in one vector
 * (dsib_iq_signs_avx512). */
DSIB_AI void iq2_xxs_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    for (int v = 0; v < 4; v++) {
        const uint8_t *p = blk + 2 + 16 * v;
        g[v] = _mm512_set_epi64(
            (long long)dsii_iq2xxs_grid[p[11]], (long long)dsii_iq2xxs_grid[p[10]],
            (long long)dsii_iq2xxs_grid[p[9]], (long long)dsii_iq2xxs_grid[p[8]],
            (long long)dsii_iq2xxs_grid[p[3]], (long long)dsii_iq2xxs_grid[p[2]],
            (long long)dsii_iq2xxs_grid[p[1]], (long long)dsii_iq2xxs_grid[p[0]]);
    }
}

/* The 64 bytes after d: qword s = sub-block s (index bytes low, w high). */
DSIB_AI void iq2_xxs_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    dsib_iq_signs_avx512(_mm512_srli_epi64(_mm512_loadu_si512(blk + 2), 32), ng, sc);
}

DSIB_IQ_TILE_AVX512(iq2_xxs_tile_avx512, 66, iq2_xxs_grid_avx512, iq2_xxs_signs_avx512, 0.125f)

DSIB_QROWS_DEFINE_R(iq2_xxs_rows_avx512, iq2_xxs_tile_avx512, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI + VBMI: the grid looked up in registers ------------------------------
 *
 * Each grid row as eight 2-bit level codes (level 0, 1, 2 = byte 8, 25, 43; element j at
 * bits 2j; generated from dsii_iq2xxs_grid, and every entry is exercised by the kernel
 * tests' random indices): the 32 indices of a super-block look their codes up in this
 * 512-byte table held in eight registers (vpermi2w on 64 entries, two blends by index bits
 * 6 and 7), vpmultishiftqb spreads each code to eight bytes and vpshufb turns levels into
 * grid bytes. The same integers as the scalar loads, so the same results; used where the CPU
 * has AVX512_VBMI (Zen 4 and later, Ice Lake and later). */
static const uint16_t iq2_xxs_codes[256] __attribute__((aligned(64))) = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0020, 0x0022, 0x0028, 0x002a, 0x0041,
    0x0044, 0x0050, 0x0058, 0x0061, 0x0064, 0x0080, 0x0082, 0x008a, 0x00a2, 0x0101, 0x0104, 0x0110,
    0x0115, 0x0140, 0x0184, 0x0198, 0x0200, 0x0202, 0x0222, 0x0282, 0x0401, 0x0404, 0x0410, 0x0421,
    0x0424, 0x0440, 0x0442, 0x0448, 0x0460, 0x0481, 0x0484, 0x0490, 0x04a4, 0x0500, 0x0502, 0x0508,
    0x0520, 0x0546, 0x0569, 0x0580, 0x0591, 0x0609, 0x0610, 0x0640, 0x0684, 0x06a4, 0x0800, 0x0805,
    0x0808, 0x0814, 0x0828, 0x0841, 0x0844, 0x0850, 0x0852, 0x0888, 0x0904, 0x0940, 0x0a02, 0x0a14,
    0x1001, 0x1004, 0x1010, 0x1021, 0x1040, 0x1060, 0x1084, 0x1090, 0x1095, 0x1100, 0x1108, 0x1120,
    0x1150, 0x115a, 0x1180, 0x1224, 0x1245, 0x1400, 0x1408, 0x1420, 0x1425, 0x1449, 0x1480, 0x1518,
    0x1562, 0x1600, 0x1616, 0x1801, 0x1804, 0x1810, 0x1840, 0x1881, 0x1900, 0x1905, 0x19a0, 0x1a51,
    0x2000, 0x2002, 0x200a, 0x2044, 0x2061, 0x2080, 0x2082, 0x2129, 0x2148, 0x2200, 0x2202, 0x2401,
    0x2404, 0x2410, 0x2440, 0x2456, 0x2500, 0x2541, 0x2564, 0x2690, 0x2808, 0x2820, 0x2894, 0x2a44,
    0x4001, 0x4004, 0x4010, 0x4018, 0x4021, 0x4024, 0x4040, 0x4048, 0x4056, 0x4060, 0x4081, 0x4084,
    0x4090, 0x4100, 0x4120, 0x4161, 0x4180, 0x4185, 0x4201, 0x4210, 0x4248, 0x4256, 0x4268, 0x4400,
    0x4408, 0x4420, 0x4480, 0x4499, 0x4512, 0x4524, 0x4600, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845,
    0x4900, 0x4958, 0x4961, 0x4982, 0x4a45, 0x4a90, 0x5000, 0x5008, 0x5011, 0x5019, 0x5020, 0x5080,
    0x5088, 0x5104, 0x5142, 0x51a4, 0x5291, 0x5490, 0x5492, 0x550a, 0x5601, 0x5654, 0x5800, 0x5811,
    0x5819, 0x5864, 0x5940, 0x5a08, 0x6004, 0x6010, 0x6040, 0x6068, 0x6100, 0x6155, 0x6218, 0x6260,
    0x6400, 0x6405, 0x6510, 0x6512, 0x6584, 0x6842, 0x8000, 0x8002, 0x800a, 0x8041, 0x8082, 0x8104,
    0x8118, 0x8140, 0x8211, 0x8401, 0x8404, 0x8410, 0x8415, 0x8440, 0x8460, 0x8500, 0x8546, 0x8594,
    0x8609, 0x8640, 0x8660, 0x8802, 0x8904, 0x8a11, 0x9004, 0x9010, 0x9024, 0x9040, 0x90a1, 0x9116,
    0x9180, 0x9245, 0x9400, 0x9422, 0x9444, 0x9551, 0x9881, 0x9920, 0xa002, 0xa050, 0xa085, 0xa109,
    0xa200, 0xa418, 0xa850, 0xa904,
};

DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI)

DSIB_AI void iq2_xxs_grid_vbmi(const uint8_t *blk, __m512i g[4]) {
    const __m512i *tab = (const __m512i *)(const void *)iq2_xxs_codes;
    /* word k = grid index k of the super-block (sub-block k / 4, group k % 4) */
    const __m512i iw = _mm512_cvtepu8_epi16(_mm512_cvtepi64_epi32(_mm512_loadu_si512(blk + 2)));
    const __mmask32 b6 = _mm512_test_epi16_mask(iw, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(iw, _mm512_set1_epi16(128));
    const __m512i lo = _mm512_mask_blend_epi16(b6, _mm512_permutex2var_epi16(tab[0], iw, tab[1]),
                                               _mm512_permutex2var_epi16(tab[2], iw, tab[3]));
    const __m512i hi = _mm512_mask_blend_epi16(b6, _mm512_permutex2var_epi16(tab[4], iw, tab[5]),
                                               _mm512_permutex2var_epi16(tab[6], iw, tab[7]));
    const __m512i c = _mm512_mask_blend_epi16(b7, lo, hi);
    const __m512i shifts = _mm512_set1_epi64(0x0e0c0a0806040200ll); /* byte j: bits 2j.. */
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i lv = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    /* vector v: code 8v + k in qword k (vpermw), spread to bytes, levels to grid bytes */
    for (int v = 0; v < 4; v++) {
        const __m512i q = _mm512_permutexvar_epi16(
            _mm512_set_epi64(8 * v + 7, 8 * v + 6, 8 * v + 5, 8 * v + 4, 8 * v + 3, 8 * v + 2, 8 * v + 1, 8 * v), c);
        g[v] = _mm512_shuffle_epi8(lv, _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, q), m3));
    }
}

/* Signs and scales as iq2_xxs_signs_avx512, with VBMI: vpmultishiftqb cuts the four 7-bit
 * sign indices of each sub-block out of its w into bytes, vpermi2b looks them up in
 * ksigns (128 bytes, two registers: the parity bit added), and the eight sub-blocks' 32-bit
 * masks, truncated from their qwords, are the four vectors' 64-bit masks. */
DSIB_AI void iq2_xxs_signs_vbmi(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    const __m512i raw = _mm512_loadu_si512(blk + 2); /* qword s: index bytes, then w */
    const __m512i ks0 = _mm512_loadu_si512(dsii_ksigns_iq2xs), ks1 = _mm512_loadu_si512(dsii_ksigns_iq2xs + 64);
    /* byte l < 4 of qword s: bits 32 + 7l .. of it (the sign index of group l, bit 7 unused) */
    const __m512i idx = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x00000000352e2720ll), raw);
    const __m256i m = _mm512_cvtepi64_epi32(_mm512_permutex2var_epi8(ks0, idx, ks1));
    dsib_iq_masks_avx512(m, ng);
    dsib_iq_scales_avx512(_mm512_srli_epi64(raw, 32), sc);
}

DSIB_IQ_TILE_AVX512(iq2_xxs_tile_vbmi, 66, iq2_xxs_grid_vbmi, iq2_xxs_signs_vbmi, 0.125f)
DSIB_QROWS_DEFINE_R(iq2_xxs_rows_vbmi, iq2_xxs_tile_vbmi, 2)

DSIB_TARGET_POP

/* The AVX-512 VNNI entry: the VBMI variant where the CPU has it and dsib_kern_iq2_vbmi is
 * set (kernels.h; tests and benchmarks clear it to run the other one). The flag and the CPU
 * check serve the VBMI variants of iq2_xs.c, iq2_s.c, iq3_xxs.c and iq3_s.c too. */
int32_t dsib_kern_iq2_vbmi = 1;

int dsib_kern_cpu_vbmi(void) {
    static atomic_int has = -1;
    int v = atomic_load_explicit(&has, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx512vbmi") ? 1 : 0;
        atomic_store_explicit(&has, v, memory_order_relaxed);
    }
    return v;
}

static void iq2_xxs_rows_avx512_any(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                                    const dsib_qrow *x, float *const *yp, int n) {
    if (dsib_kern_iq2_vbmi && dsib_kern_cpu_vbmi())
        iq2_xxs_rows_vbmi(w, rb, n_in, o0, o1, x, yp, n);
    else
        iq2_xxs_rows_avx512(w, rb, n_in, o0, o1, x, yp, n);
}

const dsib_kern_qtype dsib_kq_iq2_xxs = {
    DSI_TYPE_IQ2_XXS, DSIB_ACT_Q8_K, {iq2_xxs_rows_scalar, iq2_xxs_rows_avx2, NULL, iq2_xxs_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_iq2_xxs = {DSI_TYPE_IQ2_XXS, DSIB_ACT_Q8_K, {iq2_xxs_rows_scalar}};

#endif
