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
    *sg = dsib_iq_signs4_avx2(w & 127, (w >> 7) & 127, (w >> 14) & 127, (w >> 21) & 127);
    *sc = _mm256_set1_epi16((short)(2 * (w >> 28) + 1));
}

DSIB_IQ_TILE_AVX2(iq2_xxs_tile_avx2, 66, iq2_xxs_sub_avx2, 0.125f)

DSIB_QROWS_DEFINE_T(iq2_xxs_rows_avx2, iq2_xxs_tile_avx2, 4)

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
 * bits 2j of a 16-bit code), split into its low byte (iq2_xxs_clo: elements 0-3) and high
 * byte (iq2_xxs_chi: elements 4-7); generated from dsii_iq2xxs_grid by a throwaway program
 * (each grid byte's level, code |= level << 2j), and every entry is exercised by the kernel
 * tests' random indices. The 64 bytes after d (qword s: sub-block s's four index bytes, then
 * its w) look both up at once in these two 256-byte tables held in eight registers
 * (vpermi2b on 128 entries, one blend by index bit 7; the w bytes' lookups go unused). Per
 * vector, one vpermt2b puts each row's two code bytes into its qword, vpmultishiftqb cuts
 * each level out into its byte and vpermb (on its low six bits, a level table of period 4)
 * turns levels into grid bytes. The same integers as the scalar loads, so the same results;
 * used where the CPU has AVX512_VBMI (Zen 4 and later, Ice Lake and later). */
static const uint8_t iq2_xxs_clo[256] __attribute__((aligned(64))) = {
    0x00, 0x02, 0x05, 0x08, 0x0a, 0x11, 0x14, 0x20, 0x22, 0x28, 0x2a, 0x41, 0x44, 0x50, 0x58, 0x61,
    0x64, 0x80, 0x82, 0x8a, 0xa2, 0x01, 0x04, 0x10, 0x15, 0x40, 0x84, 0x98, 0x00, 0x02, 0x22, 0x82,
    0x01, 0x04, 0x10, 0x21, 0x24, 0x40, 0x42, 0x48, 0x60, 0x81, 0x84, 0x90, 0xa4, 0x00, 0x02, 0x08,
    0x20, 0x46, 0x69, 0x80, 0x91, 0x09, 0x10, 0x40, 0x84, 0xa4, 0x00, 0x05, 0x08, 0x14, 0x28, 0x41,
    0x44, 0x50, 0x52, 0x88, 0x04, 0x40, 0x02, 0x14, 0x01, 0x04, 0x10, 0x21, 0x40, 0x60, 0x84, 0x90,
    0x95, 0x00, 0x08, 0x20, 0x50, 0x5a, 0x80, 0x24, 0x45, 0x00, 0x08, 0x20, 0x25, 0x49, 0x80, 0x18,
    0x62, 0x00, 0x16, 0x01, 0x04, 0x10, 0x40, 0x81, 0x00, 0x05, 0xa0, 0x51, 0x00, 0x02, 0x0a, 0x44,
    0x61, 0x80, 0x82, 0x29, 0x48, 0x00, 0x02, 0x01, 0x04, 0x10, 0x40, 0x56, 0x00, 0x41, 0x64, 0x90,
    0x08, 0x20, 0x94, 0x44, 0x01, 0x04, 0x10, 0x18, 0x21, 0x24, 0x40, 0x48, 0x56, 0x60, 0x81, 0x84,
    0x90, 0x00, 0x20, 0x61, 0x80, 0x85, 0x01, 0x10, 0x48, 0x56, 0x68, 0x00, 0x08, 0x20, 0x80, 0x99,
    0x12, 0x24, 0x00, 0x01, 0x04, 0x10, 0x40, 0x45, 0x00, 0x58, 0x61, 0x82, 0x45, 0x90, 0x00, 0x08,
    0x11, 0x19, 0x20, 0x80, 0x88, 0x04, 0x42, 0xa4, 0x91, 0x90, 0x92, 0x0a, 0x01, 0x54, 0x00, 0x11,
    0x19, 0x64, 0x40, 0x08, 0x04, 0x10, 0x40, 0x68, 0x00, 0x55, 0x18, 0x60, 0x00, 0x05, 0x10, 0x12,
    0x84, 0x42, 0x00, 0x02, 0x0a, 0x41, 0x82, 0x04, 0x18, 0x40, 0x11, 0x01, 0x04, 0x10, 0x15, 0x40,
    0x60, 0x00, 0x46, 0x94, 0x09, 0x40, 0x60, 0x02, 0x04, 0x11, 0x04, 0x10, 0x24, 0x40, 0xa1, 0x16,
    0x80, 0x45, 0x00, 0x22, 0x44, 0x51, 0x81, 0x20, 0x02, 0x50, 0x85, 0x09, 0x00, 0x18, 0x50, 0x04,
};
static const uint8_t iq2_xxs_chi[256] __attribute__((aligned(64))) = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x02, 0x02, 0x02, 0x02,
    0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x05, 0x05, 0x05,
    0x05, 0x05, 0x05, 0x05, 0x05, 0x06, 0x06, 0x06, 0x06, 0x06, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08,
    0x08, 0x08, 0x08, 0x08, 0x09, 0x09, 0x0a, 0x0a, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
    0x10, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x12, 0x12, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x15,
    0x15, 0x16, 0x16, 0x18, 0x18, 0x18, 0x18, 0x18, 0x19, 0x19, 0x19, 0x1a, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x21, 0x21, 0x22, 0x22, 0x24, 0x24, 0x24, 0x24, 0x24, 0x25, 0x25, 0x25, 0x26,
    0x28, 0x28, 0x28, 0x2a, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x42, 0x42, 0x42, 0x42, 0x42, 0x44, 0x44, 0x44, 0x44, 0x44,
    0x45, 0x45, 0x46, 0x48, 0x48, 0x48, 0x48, 0x48, 0x49, 0x49, 0x49, 0x49, 0x4a, 0x4a, 0x50, 0x50,
    0x50, 0x50, 0x50, 0x50, 0x50, 0x51, 0x51, 0x51, 0x52, 0x54, 0x54, 0x55, 0x56, 0x56, 0x58, 0x58,
    0x58, 0x58, 0x59, 0x5a, 0x60, 0x60, 0x60, 0x60, 0x61, 0x61, 0x62, 0x62, 0x64, 0x64, 0x65, 0x65,
    0x65, 0x68, 0x80, 0x80, 0x80, 0x80, 0x80, 0x81, 0x81, 0x81, 0x82, 0x84, 0x84, 0x84, 0x84, 0x84,
    0x84, 0x85, 0x85, 0x85, 0x86, 0x86, 0x86, 0x88, 0x89, 0x8a, 0x90, 0x90, 0x90, 0x90, 0x90, 0x91,
    0x91, 0x92, 0x94, 0x94, 0x94, 0x95, 0x98, 0x99, 0xa0, 0xa0, 0xa0, 0xa1, 0xa2, 0xa4, 0xa8, 0xa9,
};

DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI)

DSIB_AI void iq2_xxs_grid_vbmi(const uint8_t *blk, __m512i g[4]) {
    /* byte 8s + l (l < 4): the grid index of row 4s + l; bytes 8s + 4 .. 8s + 7: w_s */
    const __m512i ix = _mm512_loadu_si512(blk + 2);
    const __mmask64 b7 = _mm512_movepi8_mask(ix);
    const __m512i lo = DSIB_LUT256_VBMI(iq2_xxs_clo, ix, b7), hi = DSIB_LUT256_VBMI(iq2_xxs_chi, ix, b7);
    /* qword k of vector v (row 8v + k, index byte 16v + 8(k / 4) + k % 4): bytes lo, hi of
     * that row (vpermt2b bytes 64 + i: hi[i]); the code at bits 0 .. 15, element j at 2j */
#define IQ2XXS_ROW_(k) (long long)((uint64_t)(8 * ((k) / 4) + (k) % 4) | (uint64_t)(64 + 8 * ((k) / 4) + (k) % 4) << 8)
    const __m512i row = _mm512_set_epi64(IQ2XXS_ROW_(7), IQ2XXS_ROW_(6), IQ2XXS_ROW_(5), IQ2XXS_ROW_(4),
                                         IQ2XXS_ROW_(3), IQ2XXS_ROW_(2), IQ2XXS_ROW_(1), IQ2XXS_ROW_(0));
#undef IQ2XXS_ROW_
    const __m512i shifts = _mm512_set1_epi64(0x0e0c0a0806040200ll); /* byte j: bits 2j.. */
    /* byte e of the level table: level e mod 4 (vpermb reads six index bits) */
    const __m512i lv = _mm512_set1_epi32(0x002b1908);
    for (int v = 0; v < 4; v++) {
        const __m512i q = _mm512_permutex2var_epi8(lo, _mm512_add_epi8(row, _mm512_set1_epi8((char)(16 * v))), hi);
        g[v] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shifts, q), lv);
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
DSIB_QROWS_DEFINE_R(iq2_xxs_rows_vbmi, iq2_xxs_tile_vbmi, 1)

DSIB_TARGET_POP

/* The AVX-512 VNNI entry: the VBMI variant where the CPU has it and dsib_kern_iq2_vbmi is
 * set (kernels.h; tests and benchmarks clear it to run the other one). The flag and the CPU
 * check serve the VBMI variants of iq2_xs.c, iq2_s.c, iq3_xxs.c and iq3_s.c too. */
int32_t dsib_kern_iq2_vbmi = 1;

DSIB_CPU_FEATURE_FN(dsib_kern_cpu_vbmi, "avx512vbmi")

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
