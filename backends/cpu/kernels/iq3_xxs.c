/*
 * IQ3_XXS weights × DSIB_ACT_Q8_K activations (default path; kernels.h). IQ3_XXS's scheme
 * (iq3_xxs.c) with four-value grid rows:
 *
 * Block (98 bytes, 256 elements; docs/tensor-types.md): d (f16) at 0; qs[64] at 2 (grid
 * indices: element 32s + 4m + i is byte i of iq3xxs_grid[qs[8s + m]]); u32 w_s at 66 + 4s
 * (sign index of group l of 8 = (w >> 7l) & 127, scale ls = w >> 28). The value is
 *
 *   x_e = d · (2·ls + 1) / 4 · grid_e · (-1 if bit e mod 8 of ksigns[(w >> 7l) & 127])
 *
 * — ggml's d·(0.5 + ls)·0.5 as an odd integer over 4; the grid bytes (4 … 62) are the
 * unsigned operand, the sign goes onto the activation byte.
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. For each super-block b in order (set u = b mod 2), vector v < 4 = elements
 * 64v .. 64v+63, lane j < 16 = elements 64v + 4j + k (k < 4), in sub-block σ = 2v + j/8:
 *
 *   I_v[j] = Σ_{k<4} grid_e · sign_e · q_e                    (exact; |I| <= 31496)
 *   S[j]   = Σ_{v<4} (2·ls_σ + 1) · I_v[j]                     (exact; |S| < 2^22)
 *   acc[u][j] = fmaf(d·dx, (float)S[j], acc[u][j])            (d·dx one f32 rounding)
 *
 * then y = 0.25f · dsib_reduce32(acc) (the /4, exact).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float iq3_xxs_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 98 * b;
        const int8_t *xq = x->q + 256 * b;
        int32_t S[16] = {0};
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 16; j++) {
                const int s = 2 * v + j / 8;
                const uint8_t *qs = blk + 2 + 8 * s;
                const uint32_t w = dsib_ld32(blk + 66 + 4 * s), sg = dsib_iq_signs32(w);
                int32_t I = 0;
                for (int k = 0; k < 4; k++) {
                    const int e = 4 * (j % 8) + k; /* element within the sub-block */
                    const int g = (int)((dsii_iq3xxs_grid[qs[e / 4]] >> (8 * (e % 4))) & 0xFF);
                    I += ((sg >> e) & 1 ? -g : g) * xq[64 * v + 4 * j + k];
                }
                S[j] += (int32_t)(2 * (w >> 28) + 1) * I;
            }
        const float dd = dsib_ld_f16(blk) * x->d[b];
        float *a = acc[b & 1];
        for (int j = 0; j < 16; j++) a[j] = fmaf(dd, (float)S[j], a[j]);
    }
    return 0.25f * dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(iq3_xxs_rows_scalar, iq3_xxs_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Sub-block s of the super-block at blk for DSIB_IQ_TILE_AVX2: its 32 grid bytes (the
 * four-byte rows by scalar loads), its signs as ±1 bytes, its odd scale in every int16. */
DSIB_AI void iq3_xxs_sub_avx2(const uint8_t *blk, int s, __m256i *g, __m256i *sg, __m256i *sc) {
    const uint8_t *qs = blk + 2 + 8 * s;
    const uint32_t w = dsib_ld32(blk + 66 + 4 * s);
    const uint32_t *G = dsii_iq3xxs_grid;
    *g = _mm256_set_epi32((int)G[qs[7]], (int)G[qs[6]], (int)G[qs[5]], (int)G[qs[4]], (int)G[qs[3]], (int)G[qs[2]],
                          (int)G[qs[1]], (int)G[qs[0]]);
    *sg = dsib_iq_signs4_avx2(w & 127, (w >> 7) & 127, (w >> 14) & 127, (w >> 21) & 127);
    *sc = _mm256_set1_epi16((short)(2 * (w >> 28) + 1));
}

DSIB_IQ_TILE_AVX2(iq3_xxs_tile_avx2, 98, iq3_xxs_sub_avx2, 0.25f)

DSIB_QROWS_DEFINE_T(iq3_xxs_rows_avx2, iq3_xxs_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Super-block decode: vector v = sub-blocks 2v, 2v+1 (their 64 grid bytes: the sixteen
 * four-byte rows by scalar loads — a 16-lane gather measured 3.6 against 5.9 GB/s), for
 * DSIB_IQ_TILE_AVX512 with dsib_iq_signs_avx512. */
DSIB_AI void iq3_xxs_grid_avx512(const uint8_t *blk, __m512i g[4]) {
    const uint32_t *G = dsii_iq3xxs_grid;
    for (int v = 0; v < 4; v++) {
        const uint8_t *p = blk + 2 + 16 * v;
        g[v] = _mm512_set_epi32((int)G[p[15]], (int)G[p[14]], (int)G[p[13]], (int)G[p[12]], (int)G[p[11]],
                                (int)G[p[10]], (int)G[p[9]], (int)G[p[8]], (int)G[p[7]], (int)G[p[6]], (int)G[p[5]],
                                (int)G[p[4]], (int)G[p[3]], (int)G[p[2]], (int)G[p[1]], (int)G[p[0]]);
    }
}

/* w_s (the 32 bytes at 66) in qword s */
DSIB_AI void iq3_xxs_signs_avx512(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    dsib_iq_signs_avx512(_mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(blk + 66))), ng, sc);
}

DSIB_IQ_TILE_AVX512(iq3_xxs_tile_avx512, 98, iq3_xxs_grid_avx512, iq3_xxs_signs_avx512, 0.25f)

DSIB_QROWS_DEFINE_R(iq3_xxs_rows_avx512, iq3_xxs_tile_avx512, 2)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI + VBMI: the grid looked up in registers ------------------------------
 *
 * Each grid row as four 3-bit level codes (level c = byte 4, 12, 20, 28, 36, 44, 52, 62;
 * element j at bits 3j of a 12-bit code; generated from dsii_iq3xxs_grid, and every entry is
 * exercised by the kernel tests' random indices), split into a low byte (iq3_xxs_clo) and a
 * high nibble (iq3_xxs_chi): the 64 index bytes of a super-block look both up at once in
 * these two 256-byte tables held in eight registers (vpermi2b on 128 entries, one blend by
 * index bit 7). Per vector, one vpermt2b puts each row pair's two codes into a qword,
 * vpmultishiftqb cuts each level code out into its byte and vpermb (on its low six bits)
 * turns levels into grid bytes. The signs: vpermi2b on ksigns as in iq2_xxs.c. The same
 * integers as the scalar row loads, so the same results. */
static const uint8_t iq3_xxs_clo[256] __attribute__((aligned(64))) = {
    0x00, 0x02, 0x04, 0x09, 0x0b, 0x0f, 0x10, 0x12, 0x19, 0x22, 0x3b, 0x3d, 0x41, 0x43, 0x48, 0x4a,
    0x51, 0x55, 0x58, 0x5a, 0x61, 0x6c, 0x78, 0x80, 0x82, 0x84, 0x89, 0x90, 0x92, 0x99, 0x9b, 0x9f,
    0xa9, 0xaf, 0xbd, 0xc1, 0xc7, 0xc8, 0xca, 0xd5, 0xf8, 0x0b, 0x1f, 0x24, 0x2f, 0x3b, 0x3d, 0x41,
    0x47, 0x5a, 0x6a, 0x9d, 0xb4, 0xc8, 0xcc, 0xce, 0xe3, 0xf1, 0x01, 0x03, 0x08, 0x0a, 0x11, 0x13,
    0x18, 0x1a, 0x1c, 0x27, 0x28, 0x40, 0x42, 0x49, 0x50, 0x52, 0x81, 0x83, 0x88, 0x8a, 0x91, 0x98,
    0xba, 0xc0, 0xc2, 0xd0, 0xd9, 0xe6, 0xf6, 0x01, 0x05, 0x28, 0x50, 0x54, 0x66, 0x79, 0x85, 0xd2,
    0xe0, 0x00, 0x02, 0x09, 0x0b, 0x10, 0x12, 0x16, 0x19, 0x22, 0x41, 0x43, 0x45, 0x48, 0x4a, 0x51,
    0x58, 0x73, 0x77, 0x78, 0x80, 0x82, 0x89, 0x8f, 0x90, 0x92, 0x9f, 0xa0, 0xad, 0xc1, 0xc8, 0xcc,
    0xf8, 0xfc, 0x1d, 0x2b, 0x43, 0x57, 0x61, 0x7c, 0xc1, 0xc3, 0xce, 0xe5, 0x01, 0x08, 0x0a, 0x11,
    0x13, 0x28, 0x35, 0x3a, 0x40, 0x42, 0x50, 0x59, 0x64, 0x66, 0x81, 0x83, 0x88, 0x95, 0xaa, 0xba,
    0xc9, 0xdb, 0x18, 0x27, 0x3a, 0x40, 0x46, 0x52, 0x6d, 0x8c, 0x9e, 0xb3, 0xdb, 0xf0, 0x04, 0x0f,
    0x1d, 0x1f, 0x2b, 0x2f, 0x7c, 0x90, 0x9f, 0xa0, 0xb0, 0xb6, 0xc7, 0xe5, 0x04, 0x29, 0x34, 0x55,
    0x63, 0x78, 0xc5, 0xc8, 0xca, 0xd8, 0x0a, 0x21, 0x38, 0x40, 0x46, 0x56, 0x6d, 0x8c, 0x9a, 0xba,
    0xc2, 0xeb, 0x08, 0x13, 0x17, 0x3a, 0x42, 0x59, 0xa8, 0xd4, 0xe2, 0x14, 0x24, 0x26, 0x34, 0x51,
    0x71, 0x8f, 0xb4, 0xd8, 0xde, 0x24, 0x45, 0x6a, 0x9b, 0xc3, 0xd1, 0x03, 0x05, 0x07, 0x08, 0x1a,
    0x2a, 0x56, 0x60, 0x8a, 0xa5, 0xaa, 0xc0, 0xcd, 0xdb, 0xf0, 0x11, 0x21, 0x40, 0x42, 0x54, 0x98,
};
static const uint8_t iq3_xxs_chi[256] __attribute__((aligned(64))) = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01,
    0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02,
    0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02,
    0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x02, 0x03, 0x03, 0x03, 0x03, 0x03, 0x03, 0x03, 0x03, 0x03,
    0x03, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04,
    0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04,
    0x04, 0x04, 0x05, 0x05, 0x05, 0x05, 0x05, 0x05, 0x05, 0x05, 0x05, 0x05, 0x06, 0x06, 0x06, 0x06,
    0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06, 0x06,
    0x06, 0x06, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x08, 0x08,
    0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x08, 0x09, 0x09, 0x09, 0x09,
    0x09, 0x09, 0x09, 0x09, 0x09, 0x09, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a, 0x0a,
    0x0a, 0x0a, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b, 0x0c, 0x0c, 0x0c, 0x0c, 0x0c,
    0x0c, 0x0c, 0x0c, 0x0c, 0x0c, 0x0d, 0x0d, 0x0d, 0x0d, 0x0d, 0x0d, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e,
    0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0f, 0x0f, 0x0f, 0x0f, 0x0f, 0x0f,
};

DSIB_TARGET_PUSH(DSIB_TGT_AVX512VBMI)

DSIB_AI void iq3_xxs_grid_vbmi(const uint8_t *blk, __m512i g[4]) {
    const __m512i ix = _mm512_loadu_si512(blk + 2); /* byte i: the grid index of row i */
    const __mmask64 b7 = _mm512_movepi8_mask(ix);
    const __m512i lo = DSIB_LUT256_VBMI(iq3_xxs_clo, ix, b7), hi = DSIB_LUT256_VBMI(iq3_xxs_chi, ix, b7);
    /* qword p of vector v: bytes lo, hi of row 16v + 2p, then of row 16v + 2p + 1 (vpermt2b
     * bytes 64 + i: hi[i]); the codes at bits 0, 16, element j at + 3j */
#define IQ3XXS_PAIR_(p) \
    (long long)((uint64_t)(2 * (p)) | (uint64_t)(64 + 2 * (p)) << 8 | (uint64_t)(2 * (p) + 1) << 16 | \
                (uint64_t)(65 + 2 * (p)) << 24)
    const __m512i pair = _mm512_set_epi64(IQ3XXS_PAIR_(7), IQ3XXS_PAIR_(6), IQ3XXS_PAIR_(5), IQ3XXS_PAIR_(4),
                                          IQ3XXS_PAIR_(3), IQ3XXS_PAIR_(2), IQ3XXS_PAIR_(1), IQ3XXS_PAIR_(0));
#undef IQ3XXS_PAIR_
    const __m512i shifts = _mm512_set1_epi64(0x1916131009060300ll);
    /* byte e of the level table: level e mod 8 (vpermb reads six index bits) */
    const __m512i lv = _mm512_set1_epi64((long long)0x3e342c241c140c04ull);
    for (int v = 0; v < 4; v++) {
        const __m512i q = _mm512_permutex2var_epi8(lo, _mm512_add_epi8(pair, _mm512_set1_epi8((char)(16 * v))), hi);
        g[v] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shifts, q), lv);
    }
}

/* Signs and scales as iq3_xxs_signs_avx512, with VBMI: vpmultishiftqb cuts the four 7-bit
 * sign indices of each sub-block out of its w into bytes, vpermi2b looks them up in ksigns
 * (128 bytes, two registers: the parity bit added), and the eight sub-blocks' 32-bit masks,
 * truncated from their qwords, are the four vectors' 64-bit masks. */
DSIB_AI void iq3_xxs_signs_vbmi(const uint8_t *blk, __mmask64 ng[4], __m512i sc[2]) {
    const __m512i w = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 66)));
    const __m512i ks0 = _mm512_loadu_si512(dsii_ksigns_iq2xs), ks1 = _mm512_loadu_si512(dsii_ksigns_iq2xs + 64);
    /* byte l < 4 of qword s: bits 7l .. of w_s (the sign index of group l, bit 7 unused) */
    const __m512i idx = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x00000000150e0700ll), w);
    dsib_iq_masks_avx512(_mm512_cvtepi64_epi32(_mm512_permutex2var_epi8(ks0, idx, ks1)), ng);
    dsib_iq_scales_avx512(w, sc);
}

DSIB_IQ_TILE_AVX512(iq3_xxs_tile_vbmi, 98, iq3_xxs_grid_vbmi, iq3_xxs_signs_vbmi, 0.25f)
DSIB_QROWS_DEFINE_R(iq3_xxs_rows_vbmi, iq3_xxs_tile_vbmi, 1)

DSIB_TARGET_POP

static void iq3_xxs_rows_avx512_any(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                                    const dsib_qrow *x, float *const *yp, int n) {
    if (dsib_kern_iq2_vbmi && dsib_kern_cpu_vbmi())
        iq3_xxs_rows_vbmi(w, rb, n_in, o0, o1, x, yp, n);
    else
        iq3_xxs_rows_avx512(w, rb, n_in, o0, o1, x, yp, n);
}

const dsib_kern_qtype dsib_kq_iq3_xxs = {
    DSIB_TYPE_IQ3_XXS, DSIB_ACT_Q8_K, {iq3_xxs_rows_scalar, iq3_xxs_rows_avx2, NULL, iq3_xxs_rows_avx512_any}};

#else

const dsib_kern_qtype dsib_kq_iq3_xxs = {DSIB_TYPE_IQ3_XXS, DSIB_ACT_Q8_K, {iq3_xxs_rows_scalar}};

#endif
