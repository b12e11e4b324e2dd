/*
 * Q4_K weights × DSIB_ACT_Q8_K_P4 activations (default path; kernels.h).
 *
 * The activation row stores each 256-block's 32-element groups in the order
 * P = (0,2,1,3,4,6,5,7), which is how Q4_K packs nibbles: 64-byte vector v (v < 4) of the
 * block's quants is the low (v even) or high (v odd) nibbles of qs[64·(v/2) ..+64), i.e.
 * natural sub-blocks P[2v] (bytes 0-31) and P[2v+1] (bytes 32-63) — the same 64 bytes of
 * the activation row. P is its own inverse: natural sub-block j sits at position P[j].
 *
 * Canonical order (every ISA, bit-identical): the block-sum order, as Q8_0's (q8_0.c). For
 * output (o, t), acc = 0, then for each super-block b in order, with sc_j, m_j its 6-bit
 * scales / mins, d, dmin its f16 scales, dx the activation scale and bs[g] the activation
 * sums per 16 natural elements:
 *
 *   I_j = Σ_{k<32} q[32j + k] · x[32j + k]       natural sub-block j < 8 (exact)
 *   S_b = Σ_j sc_j · I_j                          (exact int32, |S_b| < 2^25)
 *   M_b = Σ_j m_j · (bs[2j] + bs[2j+1])           (exact int32, |M_b| < 2^21)
 *   acc = fmaf(-(dmin·dx), (float)M_b, acc)
 *   acc = fmaf(d·dx, (float)S_b, acc)
 *
 * and y = acc: one serial chain per output. (float)S_b rounds to nearest even where
 * |S_b| > 2^24, the same on every ISA. Until 2026-12-07 Q4_K kept two sets of sixteen lanes
 * (S[j] of four products per lane, a fmaf per lane and super-block, a 32 → 1 reduction at
 * the end). With one chain per output, the AVX-512 kernel puts sixteen ROWS in a register:
 * the rows' quant bytes are transposed once per super-block (lane m = row m) and every token
 * then runs vpdpbusd against its own activation bytes broadcast, the scales applied per
 * sub-block with one vpdpwssd for all sixteen rows, the float work one convert and one fmaf
 * per super-block for all of them (docs/performance.md 4.0000000000000000000000). Integer
 * sums are exact in any grouping, so every ISA, row and token split of a call gives the same
 * bits (test_cpukernels test_q4_k_blocksum writes the order in plain C).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>
#ifndef Q4PF
#define Q4PF 5
#endif
#include <stdatomic.h>

/* kernels.h: defined on every architecture (tests set it), used on x86-64 */
int32_t dsib_kern_kq_vbmi2 = 1;

static const uint8_t q4k_perm[8] = {0, 2, 1, 3, 4, 6, 5, 7};

/* ---- scalar ---------------------------------------------------------------------------- */

static float q4_k_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / 256; b++) {
        const uint8_t *blk = row + 144 * b, *qs = blk + 16;
        const int8_t *xq = x->q + 256 * b;
        const int16_t *bs = x->s + 16 * b;
        uint8_t sm[16];
        dsib_q4k_unpack_scales(blk + 4, sm);
        int32_t S = 0, M = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *qj = qs + 32 * (j / 2);
            const int8_t *xj = xq + 32 * q4k_perm[j];
            const int sh = (j & 1) ? 4 : 0;
            int32_t I = 0;
            for (int k = 0; k < 32; k++) I += ((qj[k] >> sh) & 15) * xj[k];
            S += sm[j] * I;
            M += sm[8 + j] * (bs[2 * j] + bs[2 * j + 1]);
        }
        const float dd = dsib_ld_f16(blk) * x->d[b], dm = dsib_ld_f16(blk + 2) * x->d[b];
        acc = fmaf(-dm, (float)M, acc);
        acc = fmaf(dd, (float)S, acc);
    }
    return acc;
}

DSIB_QROWS_SCALAR(q4_k_rows_scalar, q4_k_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------
 * One row at a time, up to four tokens per tile (rows of up to DSIB_T1_ROWS_MAX_IN columns
 * four at a time, one token): per super-block, row and token the exact integer lanes of
 * DSIB_KQ_SUMS_AVX2_ (position p: the low (p & 2 clear) or high nibbles of qs[32c..32c+32),
 * c = 2 (p / 4) + (p & 1), times the scale of sub-block P[p]; their sixteen lanes add up to
 * S_b) and of the mins against the activation sums (adding up to M_b), through
 * DSIB_KQ_BS_TILE_AVX2 (simd_avx2.h). */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

#define Q4_K_PREP_AVX2(blk) dsib_kq4_prep_avx2((blk) + 4)
DSIB_AI void q4_k_pos_avx2(const uint8_t *blk, __m256i smv, int p, __m256i *wq, __m256i *sc) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * (2 * (p >> 2) + (p & 1))));
    *wq = _mm256_and_si256((p & 2) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
    *sc = dsib_kq4_sc_avx2(smv, p);
}

DSIB_AI void q4_k_tail_avx2(const uint8_t *blk, __m256i smv, __m256i *mn, __m128 *dmw) {
    *mn = dsib_kq4_mins_avx2(smv);
    *dmw = dsib_f16x2_hw(blk); /* d, dmin */
}
DSIB_KQ_BS_TILE_AVX2(q4_k_tile_avx2, 144, Q4_K_PREP_AVX2, q4_k_pos_avx2, q4_k_tail_avx2)

DSIB_QROWS_DEFINE_T4(q4_k_rows_avx2, q4_k_tile_avx2, 4)

DSIB_TARGET_POP

/* 1 if the CPU has AVX512_VBMI2: the Q5_K VB2 tiles run where it is set and
 * dsib_kern_kq_vbmi2 is (simd_avx512.h DSIB_KQ_S_VB2_). */
DSIB_CPU_FEATURE_FN(dsib_kern_cpu_vbmi2, "avx512vbmi2")

/* ---- AVX-512 + VNNI: sixteen rows per register (lanes = rows) ----------------------------
 * Per super-block, a group of 16 rows: the (d, dmin) and scale dwords of the rows are read
 * into the lanes (dsib_rows16_dwords_avx512) and the 6-bit scales and mins unpacked in the
 * lanes (dsib_q4k_unpack_scales' operations per lane), then per token M_b of the 16 rows
 * (one vpdpwssd per sub-block: the min twice as words against the activation's two sums per
 * 16) and its chain step. Then per
 * 64-element chunk c (qs bytes 32c..32c+32 of each row), the rows' 32 bytes are transposed
 * once into eight registers W_k (lane m = bytes 4k..4k+3 of row m; q8_0.c's transpose); the
 * low nibbles are sub-block 2c, the high ones 2c+1. Per token and sub-block, two chains of
 * four vpdpbusd against the activation's dwords broadcast give the two 16-element halves
 * (|.| <= 16·15·127 < 2^15), which one blend packs into word pairs and one vpdpwssd
 * multiplies by the scale (as a word pair) into S_b. Then the S_b step of the chain for the
 * 16 rows. The transpose and the scale work are shared by the tile's tokens (1..8). */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* Prefetch: dsib_pf16 (simd_avx512.h); three lines cover a row's 144 bytes (super-blocks
 * start 16-byte aligned), into L2 (prefetcht1: 12.5 against 12.0 GB/s from memory at one
 * token in these groups). */

/* T tokens (1..8) over a group of 16 rows (row offsets ridx / ro from wg, M of them real),
 * nb super-blocks: y[t][0..M). */
DSIB_AI void q4_k_bs_tile(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                          const dsib_qrow *x, float *const *y, dsib_pf16 pf, const int T) {
    const int gather = dsib_kern_rows16_gather_on();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x3F), m2 = _mm512_set1_epi8(0x03);
    __m512 acc[8];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sb = wg + 144 * b;
        dsib_pf16_block(sb, ro, pf, 3);
        __m512i hd[4]; /* (d, dmin), then dsib_q4k_unpack_scales' u[0..2] */
        dsib_rows16_dwords_avx512(sb, ro, ridx, gather, 15, hd);
        const __m512i h0 = hd[0], u0 = hd[1], u1 = hd[2], u2 = hd[3];
        const __m512i sc_lo = _mm512_and_si512(u0, m6); /* bytes: sc 0..3 */
        const __m512i mn_lo = _mm512_and_si512(u1, m6); /* m 0..3 */
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(u2, m4),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m2), 4));
        const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m2), 4));
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
        const __m512 dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
        /* pat[j]: byte j of each dword lane as a word pair (vpshufb indexes the 16-byte lane) */
        __m512i pat[4];
        for (int j = 0; j < 4; j++) {
            const __m512i idx = _mm512_add_epi32(_mm512_set4_epi32(12, 8, 4, 0), _mm512_set1_epi32(j));
            pat[j] = _mm512_or_si512(_mm512_or_si512(idx, _mm512_slli_epi32(idx, 16)), _mm512_set1_epi32((int)0x80008000u));
        }
        /* M_b and its step, per token */
        {
            __m512i mw[8];
            for (int j = 0; j < 8; j++) mw[j] = _mm512_shuffle_epi8(j < 4 ? mn_lo : mn_hi, pat[j & 3]);
            for (int t = 0; t < T; t++) {
                const int16_t *bs = x[t].s + 16 * b;
                __m512i Ma = _mm512_setzero_si512(), Mb = _mm512_setzero_si512();
                for (int j = 0; j < 8; j += 2) {
                    Ma = _mm512_dpwssd_epi32(Ma, mw[j], dsib_bcast32_avx512(bs + 2 * j));
                    Mb = _mm512_dpwssd_epi32(Mb, mw[j + 1], dsib_bcast32_avx512(bs + 2 * j + 2));
                }
                const __m512 dm = _mm512_mul_ps(dmw, _mm512_set1_ps(x[t].d[b]));
                acc[t] = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(_mm512_add_epi32(Ma, Mb)), acc[t]);
            }
        }
        __m512i S[8];
        for (int t = 0; t < T; t++) S[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            /* z[m] = [row m | row m + 8] chunk c, transposed: W[k] lane m = bytes 4k.. of row m */
            __m512i z[8], W[8];
            for (int m = 0; m < 8; m++) {
                const uint8_t *a = sb + (size_t)ro[m] + 16 + 32 * c, *e = sb + (size_t)ro[m + 8] + 16 + 32 * c;
                z[m] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a)),
                                          _mm256_loadu_si256((const __m256i *)(const void *)e), 1);
            }
            dsib_rows16_transpose_avx512(z, W);
            for (int h = 0; h < 2; h++) { /* sub-block j = 2c + h: low, then high nibbles */
                const int j = 2 * c + h;
                const __m512i scw = _mm512_shuffle_epi8(j < 4 ? sc_lo : sc_hi, pat[j & 3]);
                __m512i V[8];
                for (int k = 0; k < 8; k++)
                    V[k] = _mm512_and_si512(h ? _mm512_srli_epi16(W[k], 4) : W[k], m4);
                static const int perm[8] = {0, 2, 1, 3, 4, 6, 5, 7};
                for (int t = 0; t < T; t++) {
                    const int8_t *xj = x[t].q + 256 * b + 32 * perm[j];
                    __m512i L = _mm512_setzero_si512(), H = _mm512_setzero_si512();
                    for (int k = 0; k < 4; k++) {
                        L = _mm512_dpbusd_epi32(L, V[k], dsib_bcast32_avx512(xj + 4 * k));
                        H = _mm512_dpbusd_epi32(H, V[k + 4], dsib_bcast32_avx512(xj + 16 + 4 * k));
                    }
                    S[t] = _mm512_dpwssd_epi32(S[t], _mm512_mask_blend_epi16(0xAAAAAAAAu, L, _mm512_slli_epi32(H, 16)),
                                               scw);
                }
            }
        }
        for (int t = 0; t < T; t++) {
            const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(x[t].d[b]));
            acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(S[t]), acc[t]);
        }
    }
    const __mmask16 km = (__mmask16)((1u << M) - 1);
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y[t], km, acc[t]);
}

/* One token, rows one at a time (R = 1; four at a time on rows of at most
 * DSIB_T1_ROWS_MAX_IN_AVX512 columns, DSIB_QTILE_FN_T1; rows of at most 512 columns take
 * the sixteen-row tiles above, simd_avx512.h DSIB_KQ_BS_ROWS_AVX512): the decode path. The
 * weights then stream from memory in order, as one sequential read the hardware prefetchers
 * follow; the sixteen-row groups above read sixteen short streams at once, which measured
 * 12 % slower from memory on one token (Emerald Rapids, one core, 2048 × 1024: 11.8-12.5
 * against 13.2-13.7 GB/s) although faster from the caches. Per super-block and row the exact lanes of
 * dsib_kq_s_avx512 and of the mins against the sums per 16, then the chain steps of a pair of
 * super-blocks (dsib_kq_bs_pair_steps, simd_avx512.h); the scales of four super-blocks are
 * decoded at once (dsib_kq4_quad_avx512, simd_avx512.h; a pair and one super-block at a
 * row's end). (The VBMI2 form of the lane sums, DSIB_KQ_S_VB2_, measured slower here: 16.5
 * against 17.4 GB/s from the caches.) */
DSIB_AI void q4_k_wdecode_avx512(const uint8_t *blk, __m512i wv[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i q0 = _mm512_loadu_si512(blk + 16), q1 = _mm512_loadu_si512(blk + 80);
    wv[0] = _mm512_and_si512(q0, m4);
    wv[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
    wv[2] = _mm512_and_si512(q1, m4);
    wv[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
}

/* The exact lanes of super-block b at blk (half h of the pair decoded into s16) against the
 * token: Sv (sixteen lanes adding up to S_b), Mv (eight adding up to M_b). */
#define Q4_K_LANES1_AVX512_(blk, b, h, Sv, Mv)                                             \
    DSIB_PF(PF, blk, 144);                                                                 \
    __m512i Sv;                                                                            \
    __m256i Mv;                                                                            \
    {                                                                                      \
        __m512i wv_[4], sc_[2];                                                            \
        __m256i mn_;                                                                       \
        q4_k_wdecode_avx512(blk, wv_);                                                     \
        dsib_kq4_scales_pair_avx512(s16, h, sc_, &mn_);                                    \
        Sv = dsib_kq_s_avx512(wv_, sc_, x->q + 256 * (b));                                 \
        Mv = _mm256_madd_epi16(mn_, _mm256_loadu_si256((const __m256i *)(const void *)(x->s + 16 * (b)))); \
    }

#define Q4_K_ROW_TILE_AVX512(NAME)                                                         \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        (void)T;                                                                           \
        __m128 acc[4];                                                                     \
        for (int r = 0; r < R; r++) acc[r] = _mm_setzero_ps();                             \
        const int64_t nb = n_in / 256;                                                     \
        int64_t b2 = 0;                                                                    \
        for (; b2 + 3 < nb; b2 += 4) {                                                     \
            const __m128 d4 = _mm_loadu_ps(x->d + b2);                                     \
            const __m256 dxx = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_unpacklo_ps(d4, d4)), \
                                                    _mm_unpackhi_ps(d4, d4), 1);           \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk0 = w + (size_t)r * rb + 144 * b2;                       \
                __m512i s16, s16b;                                                         \
                __m256 dm4;                                                                \
                dsib_kq4_quad_avx512(blk0, 144, &s16, &s16b, &dm4);                        \
                const __m256 dmx4 = _mm256_mul_ps(dm4, dxx);                               \
                {                                                                          \
                    Q4_K_LANES1_AVX512_(blk0, b2, 0, S0v, M0v)                             \
                    Q4_K_LANES1_AVX512_(blk0 + 144, b2 + 1, 1, S1v, M1v)                   \
                    acc[r] = dsib_kq_bs_pair_steps(acc[r], S0v, M0v, S1v, M1v, _mm256_castps256_ps128(dmx4)); \
                }                                                                          \
                s16 = s16b;                                                                \
                {                                                                          \
                    Q4_K_LANES1_AVX512_(blk0 + 288, b2 + 2, 0, S0v, M0v)                   \
                    Q4_K_LANES1_AVX512_(blk0 + 432, b2 + 3, 1, S1v, M1v)                   \
                    acc[r] = dsib_kq_bs_pair_steps(acc[r], S0v, M0v, S1v, M1v, _mm256_extractf128_ps(dmx4, 1)); \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (; b2 + 1 < nb; b2 += 2)                                                       \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk0 = w + (size_t)r * rb + 144 * b2;                       \
                __m512i s16;                                                               \
                __m128 dm;                                                                 \
                dsib_kq4_pair_avx512(blk0, 144, 1, &s16, &dm);                             \
                const __m128 dmx = _mm_mul_ps(dm, _mm_setr_ps(x->d[b2], x->d[b2], x->d[b2 + 1], x->d[b2 + 1])); \
                Q4_K_LANES1_AVX512_(blk0, b2, 0, S0v, M0v)                                 \
                Q4_K_LANES1_AVX512_(blk0 + 144, b2 + 1, 1, S1v, M1v)                       \
                acc[r] = dsib_kq_bs_pair_steps(acc[r], S0v, M0v, S1v, M1v, dmx);           \
            }                                                                              \
        if (b2 < nb)                                                                       \
            for (int r = 0; r < R; r++) {                                                  \
                const uint8_t *blk0 = w + (size_t)r * rb + 144 * b2;                       \
                __m512i s16;                                                               \
                __m128 dm;                                                                 \
                dsib_kq4_pair_avx512(blk0, 144, 0, &s16, &dm);                             \
                const __m128 dmx = _mm_mul_ps(dm, _mm_set1_ps(x->d[b2])); /* d, dmin */    \
                Q4_K_LANES1_AVX512_(blk0, b2, 0, Sv, Mv)                                   \
                acc[r] = dsib_kq_bs_steps(acc[r], Sv, Mv, dmx);                            \
            }                                                                              \
        for (int r = 0; r < R; r++) out[r] = _mm_cvtss_f32(acc[r]);                        \
    }

Q4_K_ROW_TILE_AVX512(q4_k_row_tile_avx512)
DSIB_QTILE_FN_T1(q4_k_row_avx512, q4_k_row_tile_avx512, 4, DSIB_T1_ROWS_MAX_IN_AVX512)

DSIB_KQ_BS_ROWS_AVX512(q4_k_rows_avx512, q4_k_bs_tile, q4_k_row_avx512_t1)

DSIB_TARGET_POP


const dsib_kern_qtype dsib_kq_q4_k = {
    DSI_TYPE_Q4_K, DSIB_ACT_Q8_K_P4, {q4_k_rows_scalar, q4_k_rows_avx2, NULL, q4_k_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q4_k = {DSI_TYPE_Q4_K, DSIB_ACT_Q8_K_P4, {q4_k_rows_scalar}};

#endif
