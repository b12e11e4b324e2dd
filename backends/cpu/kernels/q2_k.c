/*
 * Q2_K weights × DSIB_ACT_Q8_K_P2 activations (default path; kernels.h).
 *
 * The activation row stores each 256-block's 32-element groups in the order
 * P = (0,4,1,5,2,6,3,7), which is how Q2_K packs its 2-bit fields: 64-byte vector s (s < 4)
 * = field s of qs[0..64), i.e. natural groups s (bytes 0-31) and 4+s (bytes 32-63) — the
 * same 64 bytes of the activation row. Its 16-byte quarters are the 16-element sub-blocks
 * g(s, 0..3) = 2s, 2s+1, 8+2s, 9+2s (scale = low nibble, min = high nibble of sc[g]).
 *
 * Canonical order (every ISA, bit-identical): the block-sum order, as Q4_K's (q4_k.c). For
 * output (o, t), acc = 0, then for each super-block b in order, with sc_g, m_g the low / high
 * nibbles of scales[g] (16-element sub-block g < 16, natural order), d, dmin its f16 scales,
 * dx the activation scale and bs[g] the activation sums per 16 natural elements:
 *
 *   I_g = Σ_{k<16} q[16g + k] · x[16g + k]       (exact)
 *   S_b = Σ_g sc_g · I_g                          (exact int32, |S_b| < 2^21)
 *   M_b = Σ_g m_g · bs[g]                         (exact int32, |M_b| < 2^20)
 *   acc = fmaf(-(dmin·dx), (float)M_b, acc)
 *   acc = fmaf(d·dx, (float)S_b, acc)
 *
 * and y = acc (the conversions are exact). Until 2026-12-07 Q2_K kept two sets of sixteen
 * lanes (S[j] of four products per lane, a fmaf per lane and super-block, a 32 → 1 reduction).
 * The AVX-512 token tiles put sixteen rows in a register (q4_k.c's scheme: the rows' quant
 * bytes transposed once per 32-byte chunk, the 2-bit fields split, per token and sub-block
 * pair two chains of four vpdpbusd packed into word pairs and one vpdpwssd with the two
 * scales), one-token calls included (DSIB_KQ_BS_ROWS16_AVX512: Q2_K's 84-byte super-blocks
 * made the rows-one-at-a-time lanes' reduction dearer than sixteen row streams); AVX2 uses
 * DSIB_KQ_BS_TILE_AVX2 (docs/performance.md 4.0000000000000000000000 and
 * 4.00000000000000000000000). test_cpukernels test_q2_k_blocksum writes the order in plain C.
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float q2_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 84 * b, *sc = blk, *qs = blk + 16;
        const int8_t *xq = x->q + 256 * b;
        const int16_t *bs = x->s + 16 * b;
        int32_t S = 0, M = 0;
        for (int g = 0; g < 16; g++) {
            /* natural elements 16g.. = 128h + 32s + l, l = 16 (g & 1) + k: field s of qs[32h + l],
             * activation position 2s + h */
            const int h = g / 8, s2 = (g / 2) % 4, l0 = 16 * (g & 1);
            const int8_t *xg = xq + 32 * (2 * s2 + h) + l0;
            int32_t I = 0;
            for (int k = 0; k < 16; k++) I += ((qs[32 * h + l0 + k] >> (2 * s2)) & 3) * xg[k];
            S += (sc[g] & 15) * I;
            M += (sc[g] >> 4) * bs[g];
        }
        const float dd = dsib_ld_f16(blk + 80) * x->d[b], dm = dsib_ld_f16(blk + 82) * x->d[b];
        acc = fmaf(-dm, (float)M, acc);
        acc = fmaf(dd, (float)S, acc);
    }
    return acc;
}

DSIB_QROWS_SCALAR(q2_k_rows_scalar, q2_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* Super-block decode for DSIB_KQ_TILE_AVX2: position p = 2s + h is field s of
 * qs[32h..32h+32), sub-blocks 8h + 2s (bytes 0-15) and 8h + 2s + 1 (bytes 16-31); PREP = the
 * 16 scale nibbles in both lanes. */
DSIB_AI __m256i q2_k_prep_avx2(const uint8_t *blk) {
    const __m128i scb = _mm_loadu_si128((const __m128i *)blk);
    return _mm256_broadcastsi128_si256(_mm_and_si128(scb, _mm_set1_epi8(0x0F)));
}
DSIB_AI void q2_k_pos_avx2(const uint8_t *blk, __m256i sc4, int p, __m256i *wq, __m256i *sc) {
    const int s = p >> 1, h = p & 1, ga = 8 * h + 2 * s;
    const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * h));
    *wq = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), _mm256_set1_epi8(3));
    *sc = _mm256_shuffle_epi8(sc4, _mm256_inserti128_si256(
                                       _mm256_castsi128_si256(_mm_set1_epi16((short)(0x8000 | ga))),
                                       _mm_set1_epi16((short)(0x8000 | (ga + 1))), 1));
}
DSIB_AI void q2_k_tail_avx2(const uint8_t *blk, __m256i sc4, __m256i *mn, __m128 *dmw) {
    (void)sc4;
    const __m128i scb = _mm_loadu_si128((const __m128i *)blk);
    *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(0x0F)));
    *dmw = dsib_f16x2_hw(blk + 80); /* d, dmin */
}
DSIB_KQ_BS_TILE_AVX2(q2_k_tile_avx2, 84, q2_k_prep_avx2, q2_k_pos_avx2, q2_k_tail_avx2)

DSIB_QROWS_DEFINE_T4(q2_k_rows_avx2, q2_k_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* T tokens (1..8) over a group of 16 rows (dsib_tile16_fn): per super-block the rows' scale
 * bytes (four dwords, dsib_rows16_dwords_avx512: byte g of the row's scales is byte g mod 4
 * of dword g / 4) and (d, dmin); per 32-byte chunk h of the codes the rows' bytes
 * transposed (lane m = row m), field s of dword k giving elements 128h + 32s + 4k..
 * (sub-block 8h + 2s for k < 4, the next for k >= 4; activation position 2s + h). */
DSIB_AI void q2_k_bs_tile(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                          const dsib_qrow *x, float *const *y, dsib_pf16 pf, const int T) {
    const int gather = dsib_kern_rows16_gather_on();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* word pair (byte o, byte o + 1) of each dword lane, o = 0, 2 (vpshufb counts in the 16-byte lane) */
    __m512i pat[2];
    for (int o = 0; o < 2; o++) {
        const __m512i idx = _mm512_add_epi32(_mm512_set4_epi32(12, 8, 4, 0), _mm512_set1_epi32(2 * o));
        pat[o] = _mm512_or_si512(_mm512_or_si512(idx, _mm512_slli_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(1)), 16)),
                                 _mm512_set1_epi32((int)0x80008000u));
    }
    __m512 acc[8];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = wg + 84 * b;
        dsib_pf16_block(sb, ro, pf, 2);
        __m512i scv[4], mnv[4], u[4];
        dsib_rows16_dwords_avx512(sb, ro, ridx, gather, 15, u);
        for (int q = 0; q < 4; q++) {
            scv[q] = _mm512_and_si512(u[q], m4);
            mnv[q] = _mm512_and_si512(_mm512_srli_epi32(u[q], 4), m4);
        }
        __m512i hd[4]; /* (d, dmin): dword 3 of bytes 68..83 */
        dsib_rows16_dwords_avx512(sb + 68, ro, ridx, gather, 8, hd);
        const __m512i h0 = hd[3];
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
        const __m512 dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
        for (int t = 0; t < T; t++) { /* M_b and its step */
            const int16_t *bs = x[t].s + 16 * b;
            __m512i Ma = _mm512_setzero_si512(), Mb = _mm512_setzero_si512();
            for (int i = 0; i < 8; i += 2) {
                Ma = _mm512_dpwssd_epi32(Ma, _mm512_shuffle_epi8(mnv[i / 2], pat[0]), dsib_bcast32_avx512(bs + 2 * i));
                Mb = _mm512_dpwssd_epi32(Mb, _mm512_shuffle_epi8(mnv[i / 2], pat[1]), dsib_bcast32_avx512(bs + 2 * i + 2));
            }
            acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmw, _mm512_set1_ps(x[t].d[b])),
                                      _mm512_cvtepi32_ps(_mm512_add_epi32(Ma, Mb)), acc[t]);
        }
        __m512i S[8];
        for (int t = 0; t < T; t++) S[t] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i z[8], W[8];
            for (int m = 0; m < 8; m++) {
                const uint8_t *a = sb + (size_t)ro[m] + 16 + 32 * h, *e = sb + (size_t)ro[m + 8] + 16 + 32 * h;
                z[m] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a)),
                                          _mm256_loadu_si256((const __m256i *)(const void *)e), 1);
            }
            dsib_rows16_transpose_avx512(z, W);
            for (int s = 0; s < 4; s++) {
                const int g = 8 * h + 2 * s; /* sub-blocks g (k < 4), g + 1 (k >= 4) */
                const __m512i scw = _mm512_shuffle_epi8(scv[g / 4], pat[(g % 4) / 2]);
                /* Up to four tokens field s stays in place (and with 3·4^s): code·4^s <= 192,
                 * still an unsigned byte, so L and H are 4^s times the sub-block sums and one
                 * shift per token brings each back exactly — eight shifts fewer per field than
                 * shifting the codes down, which longer tiles keep (in place measured 9 %
                 * slower at eight tokens: docs/performance.md 4.00000000000000000000000). */
                __m512i V[8];
                const int ip = T <= 4;
                for (int k = 0; k < 8; k++)
                    V[k] = ip ? _mm512_and_si512(W[k], _mm512_set1_epi8((char)(3 << (2 * s))))
                              : _mm512_and_si512(_mm512_srli_epi16(W[k], 2 * s), _mm512_set1_epi8(3));
                for (int t = 0; t < T; t++) {
                    const int8_t *xs = x[t].q + 256 * b + 32 * (2 * s + h);
                    __m512i L = _mm512_setzero_si512(), H = _mm512_setzero_si512();
                    for (int k = 0; k < 4; k++) {
                        L = _mm512_dpbusd_epi32(L, V[k], dsib_bcast32_avx512(xs + 4 * k));
                        H = _mm512_dpbusd_epi32(H, V[k + 4], dsib_bcast32_avx512(xs + 16 + 4 * k));
                    }
                    /* in place: L·4^s >> 2s = L (|L| < 2^13: a word), (H·4^s) << (16 − 2s) = H·2^16 */
                    const __m512i Lw = ip ? _mm512_srai_epi32(L, 2 * s) : L;
                    const __m512i Hw = _mm512_slli_epi32(H, ip ? 16 - 2 * s : 16);
                    S[t] = _mm512_dpwssd_epi32(S[t], _mm512_mask_blend_epi16(0xAAAAAAAAu, Lw, Hw), scw);
                }
            }
        }
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(x[t].d[b])), _mm512_cvtepi32_ps(S[t]), acc[t]);
    }
    const __mmask16 km = (__mmask16)((1u << M) - 1);
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y[t], km, acc[t]);
}

DSIB_KQ_BS_ROWS16_AVX512(q2_k_rows_avx512, q2_k_bs_tile)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q2_k = {
    DSI_TYPE_Q2_K, DSIB_ACT_Q8_K_P2, {q2_k_rows_scalar, q2_k_rows_avx2, NULL, q2_k_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q2_k = {DSI_TYPE_Q2_K, DSIB_ACT_Q8_K_P2, {q2_k_rows_scalar}};

#endif
