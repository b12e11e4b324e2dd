/*
 * Q8_0 weights × DSIB_ACT_Q8_32 activations (default path; kernels.h).
 *
 * Canonical order (every ISA, bit-identical): the block-sum order. For output (o, t),
 * acc = 0, then for every 32-element block b in order, with weight scale dw_b (f16) and
 * activation scale dx_b:
 *
 *   I_b = Σ_{k<32} w[32b + k] · q[32b + k]      (exact int32)
 *   s_b = dw_b · dx_b                            (one f32 rounding)
 *   acc = fmaf(s_b, (float)I_b, acc)
 *
 * and y = acc: one serial chain per output, no lanes, no final reduction. Until 2026-12 the
 * order was the lane order of the other 32-element types (dsib_q8_32_step_scalar: sixteen
 * lanes of four products per block pair, a fmaf per lane and block); the AMX path already
 * used this one. With one output per lane, the vector kernels put sixteen (AVX-512) or eight
 * (AVX2) ROWS in a register: the float work (convert, scale product, fmaf) is one
 * instruction per block for all of them instead of one per row, and the tile path reuses one
 * transposed weight block for eight tokens (docs/performance.md 4.000000000000000000000).
 * The other 32-element types (iq4.c, mxfp4.c, q4_1_q5.c) keep the lane order.
 *
 * Integer sums are exact in any grouping, so only the chain matters: every ISA, every row
 * and token split of a call, one token or many, gives the same bits (test_cpukernels
 * test_q8_0_blocksum writes the order in plain C).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>
#include <string.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float q8_0_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const float s = dsib_ld_f16(blk) * x->d[b];
        const int8_t *wq = (const int8_t *)(blk + 2), *xq = x->q + 32 * b;
        int32_t I = 0;
        for (int k = 0; k < 32; k++) I += (int32_t)wq[k] * (int32_t)xq[k];
        acc = fmaf(s, (float)I, acc);
    }
    return acc;
}

DSIB_QROWS_SCALAR(q8_0_rows_scalar, q8_0_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2: eight rows per register (lanes = rows) ----------------------------------------
 * Per block and token, each row's 32 products go into eight int32 lanes (maddubs of |w|
 * against q with w's sign, then madd); a tree of horizontal adds (exact int32) turns the
 * eight rows' vectors into their sums I_b, row order; then one chain step for the eight rows.
 * Rows past the group's end repeat the group's first row and are not stored. Tried and
 * dropped (one token from memory, this Intel guest): four-row groups (no faster), the rows
 * read eight blocks at a time each with a transpose of the block sums (no faster cold, 20 %
 * slower from cache), scalar scale loads instead of the gather (no change). */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* The f16 scales of eight rows' block at sb + ridx[m] → f32 lanes. */
DSIB_AI __m256 q8_0_dw8_avx2(__m256i ridx, const uint8_t *sb) {
    const __m256i g = _mm256_i32gather_epi32((const int *)(const void *)sb, ridx, 1);
    const __m256i lo16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i pk = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, lo16), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(pk));
}

/* I_b of the eight rows whose block quants start at q[m], against the token's block xv. */
DSIB_AI __m256i q8_0_isum8_avx2(const uint8_t *const *q, __m256i xv) {
    __m256i p[8];
    for (int m = 0; m < 8; m++)
        p[m] = dsib_dot_s8s8_avx2(_mm256_loadu_si256((const __m256i *)(const void *)q[m]), xv);
    const __m256i h0 = _mm256_hadd_epi32(p[0], p[1]), h1 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i h2 = _mm256_hadd_epi32(p[4], p[5]), h3 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i q0 = _mm256_hadd_epi32(h0, h1), q1 = _mm256_hadd_epi32(h2, h3);
    /* q0 = [rows 0-3: lanes 0-3 | rows 0-3: lanes 4-7], q1 the same for rows 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31));
}

/* T tokens (1..4) over a group of eight rows (row offsets ro from wg, M of them real), nb
 * blocks: y[t][0..M). Prefetch (speed only): the next group's pf_next bytes in order, an equal
 * share per block step, and with pf_ahead each row that far ahead in itself (the call's first
 * group). A row is only 17 lines at 1024 columns, too short a stream for the hardware
 * prefetchers; the in-order spread measured better than prefetching each row's blocks in the
 * next group as they are read (one thread, 2048 × 1024 from memory: 10.5 → 11.3 GB/s), though
 * still below the lane order's one row at a time (12.5–13.2; docs/performance.md
 * 4.000000000000000000000). */
DSIB_AI void q8_0_group8_avx2(const uint8_t *wg, const int32_t *ro, __m256i ridx, __m256i smask,
                              int64_t nb, const dsib_qrow *x, float *const *y, size_t pf_next,
                              int32_t pf_ahead, const int T) {
    __m256 acc[4];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    /* the next group's bytes, in order, an equal share per block step */
    const size_t pf_share = pf_next ? ((pf_next + (size_t)nb - 1) / (size_t)nb + 63) & ~(size_t)63 : 0;
    const char *pf_at = (const char *)wg + pf_next;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q[8];
        for (size_t k = 0; k < pf_share; k += 64) __builtin_prefetch(pf_at + k, 0, 3);
        pf_at += pf_share;
        for (int m = 0; m < 8; m++) {
            q[m] = wg + (size_t)ro[m] + 34 * b + 2;
            if (pf_ahead && !(b & 1)) __builtin_prefetch(q[m] + pf_ahead, 0, 3);
        }
        const __m256 dw = q8_0_dw8_avx2(ridx, wg + 34 * b);
        for (int t = 0; t < T; t++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(x[t].q + 32 * b));
            const __m256i I = q8_0_isum8_avx2(q, xv);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x[t].d[b])),
                                     _mm256_cvtepi32_ps(I), acc[t]);
        }
    }
    for (int t = 0; t < T; t++) _mm256_maskstore_ps(y[t], smask, acc[t]);
}

#define Q8_0_GROUP8_T(TT)                                                                  \
    static void q8_0_group8_avx2_##TT(const uint8_t *wg, const int32_t *ro, __m256i ridx,  \
                                      __m256i smask, int64_t nb, const dsib_qrow *x,       \
                                      float *const *y, size_t pf_next, int32_t pf_ahead) { \
        q8_0_group8_avx2(wg, ro, ridx, smask, nb, x, y, pf_next, pf_ahead, TT);            \
    }
Q8_0_GROUP8_T(1)
Q8_0_GROUP8_T(2)
Q8_0_GROUP8_T(3)
Q8_0_GROUP8_T(4)

static void q8_0_rows_avx2(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                           const dsib_qrow *x, float *const *yp, int n) {
    typedef void (*group_fn)(const uint8_t *, const int32_t *, __m256i, __m256i, int64_t,
                             const dsib_qrow *, float *const *, size_t, int32_t);
    static const group_fn groups[5] = {NULL, q8_0_group8_avx2_1, q8_0_group8_avx2_2,
                                       q8_0_group8_avx2_3, q8_0_group8_avx2_4};
    const int64_t nb = n_in / 32;
    for (int64_t r0 = o0; r0 < o1; r0 += 8) {
        const int M = o1 - r0 < 8 ? (int)(o1 - r0) : 8;
        int32_t ro[8], mk[8];
        for (int m = 0; m < 8; m++) {
            ro[m] = m < M ? (int32_t)((size_t)m * rb) : 0;
            mk[m] = m < M ? -1 : 0;
        }
        const __m256i ridx = _mm256_loadu_si256((const __m256i *)(const void *)ro);
        const __m256i smask = _mm256_loadu_si256((const __m256i *)(const void *)mk);
        const uint8_t *wg = w + (size_t)r0 * rb;
        for (int t0 = 0; t0 < n; t0 += 4) {
            const int T = n - t0 < 4 ? n - t0 : 4;
            /* prefetch in the first token tile (the one that reads the weights cold); the
             * next group's bytes may run past o1 (prefetches do not fault) */
            const int pf_on = t0 == 0 && dsib_kern_prefetch > 0;
            float *yt[4];
            for (int t = 0; t < T; t++) yt[t] = yp[t0 + t] + r0;
            groups[T](wg, ro, ridx, smask, nb, x + t0, yt, pf_on && o1 > r0 + 8 ? 8 * rb : 0,
                      pf_on && r0 == o0 ? dsib_kern_prefetch / 2 : 0);
        }
    }
}

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI: sixteen rows per register (lanes = rows) ----------------------------
 * Both paths run the sixteen rows of a group (rows past the group's end repeat its first
 * row and are not stored) and take the weights as w + 128 (unsigned) against the signed
 * activations, so each lane starts at the token's correction −128·Σq.
 *
 * One token (q8_0_bs_token16): per block pair and row, one vpdpbusd gives 16 lanes of four
 * products; a transpose-add tree of exact int32 additions turns the 16 rows' vectors into the
 * two blocks' sums I_b, I_b+1 of the 16 rows, row order; then the two chain steps.
 *
 * Two to eight tokens (q8_0_bs_tile): per block, the 16 rows' 32 bytes are transposed once
 * into eight registers W_c whose lane m holds bytes 4c..4c+3 of row m; then per token eight
 * vpdpbusd against the token's four bytes broadcast give I_b of all 16 rows, and one
 * convert, one product and one fmaf advance the 16 chains. The transpose (32 shuffles) is
 * shared by the tile's tokens; the dot products are all the integer unit does. */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* The f16 scales of sixteen rows' block at sb + ro[m] → f32 lanes (the low word of each
 * row's first dword, dsib_rows16_dwords_avx512). */
DSIB_AI __m512 q8_0_dw16(const uint8_t *sb, const int32_t *ro, __m512i ridx, int gather) {
    __m512i d[4];
    dsib_rows16_dwords_avx512(sb, ro, ridx, gather, 1, d);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d[0]));
}

DSIB_AI __m512i q8_0_bs_pair(__m512i a, __m512i b) { /* [a0+a2, b0+b2, a1+a3, b1+b3] per 128 */
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
DSIB_AI __m512i q8_0_bs_quad(__m512i a, __m512i b) { /* 4 rows' 4-lane sums per 128 */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* The block sums of sixteen lanes' block pairs: z[m] = 16 dpbusd lanes of lane m's two blocks
 * (eight each) -> i0 lane m = the first block's sum, i1 lane m = the second's. */
DSIB_AI void q8_0_bs_sums16(const __m512i z[16], __m512i *i0, __m512i *i1) {
    __m512i s2[8], s4[4];
    for (int k = 0; k < 8; k++) s2[k] = q8_0_bs_pair(z[2 * k], z[2 * k + 1]);
    for (int k = 0; k < 4; k++) s4[k] = q8_0_bs_quad(s2[2 * k], s2[2 * k + 1]);
    /* s4[k] = [first block: lanes 4k.., half 0 | half 1 | second block: half 0 | half 1] */
    const __m512i w0 = _mm512_add_epi32(_mm512_shuffle_i32x4(s4[0], s4[1], 0x88),
                                        _mm512_shuffle_i32x4(s4[0], s4[1], 0xDD));
    const __m512i w1 = _mm512_add_epi32(_mm512_shuffle_i32x4(s4[2], s4[3], 0x88),
                                        _mm512_shuffle_i32x4(s4[2], s4[3], 0xDD));
    *i0 = _mm512_shuffle_i32x4(w0, w1, 0x88);
    *i1 = _mm512_shuffle_i32x4(w0, w1, 0xDD);
}

/* Prefetch (dsib_pf16, simd_avx512.h): each row's blocks in the next group as they are read
 * here measured better than spreading the next group's bytes evenly over this group's steps
 * (one core, 2048 × 1024 from memory: one token 13.6 → 14.5 GB/s, four tokens 11.0 → 12.4,
 * eight 9.0 → 9.8), and the first group's rows half the one-row distance ahead 512 × 2048
 * 10.3 → 11.1 GB/s on the AMX machine. The next group goes to L2 only and the rows
 * DSIB_PF16_NEAR ahead to L1 (kernels_impl.h, the two levels): two threads from memory, one
 * token 25.0-26.2 -> 27.2-28.2 GB/s, four 22.3 -> 24.1, eight 18.5 -> 19.1 (Emerald Rapids). */

/* One lane of the one-token tiles: the 16 dpbusd lanes of the block pair at blk (its first
 * block only when half) against the activation pair xq with its lane corrections c (the
 * codes read as unsigned, + 128: c = −128 · the activation sums), prefetching per pf. */
DSIB_AI __m512i q8_0_bs_lane(const uint8_t *blk, dsib_pf16 pf, int half, __m512i c, __m512i xq) {
    if (pf.ahead > 0) __builtin_prefetch(blk + pf.ahead, 0, 3);
    if (pf.next) __builtin_prefetch(blk + pf.next, 0, 1);
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
    const __m512i v = half ? _mm512_zextsi256_si512(lo)
                           : _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                                _mm256_loadu_si256((const __m256i *)(const void *)(blk + 36)), 1);
    return _mm512_dpbusd_epi32(c, _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)), xq);
}

/* One token over a group of 16 rows (row offsets ridx / ro from wg), nb blocks: y[0..M). */
static void q8_0_bs_token16(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                            const dsib_qrow *x, float *y, dsib_pf16 pf) {
    const int gather = dsib_kern_rows16_gather_on();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const int half = b + 1 == nb;
        const int64_t p = b / 2;
        const __m512i xq = half ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, x->q + 32 * b)
                                : _mm512_loadu_si512(x->q + 32 * b);
        const __m512i c = half ? _mm512_maskz_loadu_epi32(0x00FF, x->c + 16 * p)
                               : _mm512_loadu_si512(x->c + 16 * p);
        __m512i z[16];
        for (int m = 0; m < 16; m++) z[m] = q8_0_bs_lane(wg + (size_t)ro[m] + 34 * b, pf, half, c, xq);
        __m512i i0, i1;
        q8_0_bs_sums16(z, &i0, &i1); /* I_b, I_b+1 of rows 0..15 */
        acc = _mm512_fmadd_ps(_mm512_mul_ps(q8_0_dw16(wg + 34 * b, ro, ridx, gather), _mm512_set1_ps(x->d[b])),
                              _mm512_cvtepi32_ps(i0), acc);
        if (!half) {
            acc = _mm512_fmadd_ps(_mm512_mul_ps(q8_0_dw16(wg + 34 * (b + 1), ro, ridx, gather), _mm512_set1_ps(x->d[b + 1])),
                                  _mm512_cvtepi32_ps(i1), acc);
        }
    }
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << M) - 1), acc);
}

/* One token over a group of eight rows, nb blocks (nb a multiple of 4), for long rows on
 * cores whose hardware prefetchers lose pace over sixteen streams (dsib_kern_q8_rows8_on):
 * lane m reads row m & 7, blocks 4k + 2e and 4k + 2e + 1 with e = m >> 3 (ro[m] = row offset
 * + 68e), so each row is read 136 contiguous bytes per step — eight streams instead of
 * sixteen — and the lanes of token16 above give I of blocks 4k (lanes 0-7) and 4k + 2 (lanes
 * 8-15) in i0, 4k + 1 and 4k + 3 in i1. Each row's four chain steps then go in block order
 * over the eight-lane halves: the same products, the same fmaf sequence, the same bits.
 * Zen 5, two threads, from memory, six alternated rounds: 2048 x 4096 41.8-44.1 -> 45.4-49.1
 * GB/s, 4096 x 2048 45.0-51.9 -> 50.4-55.9; at 1024 columns sixteen rows are one stream
 * already and a timing probe of this tile lost there (docs/performance.md
 * 4.00000000000000000000000000). Rows of M < 8 read row 0 again. */
static void q8_0_bs_token8(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                           const dsib_qrow *x, float *y, dsib_pf16 pf) {
    const int gather = dsib_kern_rows16_gather_on();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 4) {
        const int64_t p = b / 2; /* pairs p (lanes 0-7) and p + 1 (lanes 8-15) */
        const __m512i xq0 = _mm512_loadu_si512(x->q + 32 * b), xq1 = _mm512_loadu_si512(x->q + 32 * b + 64);
        const __m512i c0 = _mm512_loadu_si512(x->c + 16 * p), c1 = _mm512_loadu_si512(x->c + 16 * p + 16);
        __m512i z[16];
        for (int m = 0; m < 16; m++)
            z[m] = q8_0_bs_lane(wg + (size_t)ro[m] + 34 * b, pf, 0, m < 8 ? c0 : c1, m < 8 ? xq0 : xq1);
        __m512i i0, i1;
        q8_0_bs_sums16(z, &i0, &i1);
        const __m512 f0 = _mm512_cvtepi32_ps(i0); /* I_b | I_b+2 */
        const __m512 f1 = _mm512_cvtepi32_ps(i1); /* I_b+1 | I_b+3 */
        const __m512 s0 = _mm512_mul_ps(q8_0_dw16(wg + 34 * b, ro, ridx, gather), dsib_pair_ps(x->d + b, x->d + b + 2));
        const __m512 s1 = _mm512_mul_ps(q8_0_dw16(wg + 34 * (b + 1), ro, ridx, gather),
                                        dsib_pair_ps(x->d + b + 1, x->d + b + 3));
        acc = _mm256_fmadd_ps(_mm512_castps512_ps256(s0), _mm512_castps512_ps256(f0), acc);
        acc = _mm256_fmadd_ps(_mm512_castps512_ps256(s1), _mm512_castps512_ps256(f1), acc);
        acc = _mm256_fmadd_ps(_mm512_extractf32x8_ps(s0, 1), _mm512_extractf32x8_ps(f0, 1), acc);
        acc = _mm256_fmadd_ps(_mm512_extractf32x8_ps(s1, 1), _mm512_extractf32x8_ps(f1, 1), acc);
    }
    _mm256_mask_storeu_ps(y, (__mmask8)((1u << M) - 1), acc);
}

/* T tokens (2..8) over a group of 16 rows: y[t][0..M). */
DSIB_AI void q8_0_bs_tile(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                          const dsib_qrow *x, float *const *y, dsib_pf16 pf, const int T) {
    const int gather = dsib_kern_rows16_gather_on();
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int pair_start = !(b & 1); /* prefetches per block pair, as one token's */
        /* z[m] = [row m | row m + 8] (w + 128), transposed: W[c] lane m = bytes 4c.. of row m */
        __m512i z[8], W[8];
        for (int m = 0; m < 8; m++) {
            const uint8_t *a = wg + (size_t)ro[m] + 34 * b + 2, *c = wg + (size_t)ro[m + 8] + 34 * b + 2;
            if (pf.ahead > 0 && pair_start) {
                __builtin_prefetch(a + pf.ahead, 0, 3);
                __builtin_prefetch(c + pf.ahead, 0, 3);
            }
            if (pf.next && pair_start) {
                __builtin_prefetch(a + pf.next, 0, 1);
                __builtin_prefetch(c + pf.next, 0, 1);
            }
            z[m] = _mm512_xor_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a)),
                                   _mm256_loadu_si256((const __m256i *)(const void *)c), 1),
                c128);
        }
        dsib_rows16_transpose_avx512(z, W);
        const __m512 dw = q8_0_dw16(wg + 34 * b, ro, ridx, gather);
        for (int t = 0; t < T; t++) {
            const int8_t *xq = x[t].q + 32 * b;
            /* two chains of four: one chain of eight dependent vpdpbusd per token left the
             * tile waiting on their latency (the same integer) */
            __m512i I = _mm512_set1_epi32(-128 * (int32_t)x[t].s[b]), J = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                int32_t xc, xd;
                memcpy(&xc, xq + 4 * c, 4);
                memcpy(&xd, xq + 16 + 4 * c, 4);
                I = _mm512_dpbusd_epi32(I, W[c], _mm512_set1_epi32(xc));
                J = _mm512_dpbusd_epi32(J, W[c + 4], _mm512_set1_epi32(xd));
            }
            I = _mm512_add_epi32(I, J);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(x[t].d[b])), _mm512_cvtepi32_ps(I), acc[t]);
        }
    }
    const __mmask16 km = (__mmask16)((1u << M) - 1);
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y[t], km, acc[t]);
}

DSIB_TILE16_2TO8(q8_0_bs_tile, q8_0_bs_tile)

static void q8_0_bs_tile1(const uint8_t *wg, const int32_t *ro, __m512i ridx, int64_t nb, int M,
                          const dsib_qrow *x, float *const *y, dsib_pf16 pf) {
    q8_0_bs_token16(wg, ro, ridx, nb, M, x, y[0], pf);
}

static void q8_0_rows_avx512(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                             const dsib_qrow *x, float *const *yp, int n) {
    static const dsib_tile16_fn tiles[9] = {NULL,          q8_0_bs_tile1, q8_0_bs_tile2, q8_0_bs_tile3, q8_0_bs_tile4,
                                            q8_0_bs_tile5, q8_0_bs_tile6, q8_0_bs_tile7, q8_0_bs_tile8};
    const int64_t nb = n_in / 32;
    if (n == 1 && n_in >= DSIB_Q8_ROWS8_MIN_IN && nb % 4 == 0 && dsib_kern_q8_rows8_on()) {
        const int use = dsib_kern_prefetch > 0;
        for (int64_t r0 = o0; r0 < o1; r0 += 8) {
            const int M = o1 - r0 < 8 ? (int)(o1 - r0) : 8;
            int32_t ro[16];
            for (int m = 0; m < 16; m++) ro[m] = ((m & 7) < M ? (int32_t)((size_t)(m & 7) * rb) : 0) + 68 * (m >> 3);
            dsib_pf16 pf;
            pf.next = use && o1 - (r0 + 8) > 0 ? 8 * rb : 0;
            pf.ahead = !use ? 0 : r0 == o0 ? dsib_kern_prefetch / 2 : DSIB_PF16_NEAR;
            q8_0_bs_token8(w + (size_t)r0 * rb, ro, _mm512_loadu_si512(ro), nb, M, x, yp[0] + r0, pf);
        }
        return;
    }
    dsib_rows16_avx512(w, rb, nb, o0, o1, x, yp, n, tiles);
}

DSIB_TARGET_POP

/* ---- AMX (AVX-512 + VNNI + AMX-TILE + AMX-INT8) ----------------------------------------
 *
 * The block-sum order of the file's head, which an AMX dot product computes natively (it
 * sums a whole 32-element block). Every Q8_0 call of the process takes this path when it is
 * on (n_tok = 1 included); its bits are the other ISAs' (test_cpukernels test_q8_0_blocksum,
 * test_cross_isa). Opt-in (DSINFER_CPU_AMX=1, kernels.c): turning it on asks the kernel for
 * tile data for the whole process, which enlarges every signal frame of the host's threads
 * (docs/performance.md 4.000000: prefill +56 % over the lane-order AVX-512 kernels of the
 * time, decode as fast).
 *
 * Tiles: C (tiles 0-3) = M weight rows × T tokens of int32, A (tiles 4, 5) = M rows × 32
 * bytes of one block's weights, read in place with the row stride, B (tiles 6, 7) = the
 * block's 32 activation bytes of T tokens in the VNNI layout (8 rows of T × 4 bytes),
 * transposed into a small stack buffer once per (super-tile of 128 rows, token group of
 * 16, chunk of 16 blocks); four blocks in flight. The float stage runs 16 tokens per zmm
 * (one row per register). Up to Q8_AMX_FEW tokens: no tiles (the AVX-512 VNNI kernels). */
DSIB_TARGET_PUSH(DSIB_TGT_AMX)
#include "backends/cpu/kernels/simd_avx512.h"

typedef struct __attribute__((packed)) amx_tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

/* One f16 scale in all 16 lanes (dsib_pair_f16(p, p) gives the same with an insert more:
 * n_tok = 4 measured 7.4–7.6 GB/s with it, 8.0–8.1 with this). */
DSIB_AI __m512 q8_0_bcast_f16(const uint8_t *p) {
    short h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}

static void q8_0_amx_config(int M, int T) {
    amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 4; i++) c.rows[i] = (uint8_t)M, c.colsb[i] = (uint16_t)(4 * T); /* C */
    for (int i = 4; i < 6; i++) c.rows[i] = (uint8_t)M, c.colsb[i] = 32;               /* A */
    for (int i = 6; i < 8; i++) c.rows[i] = 8, c.colsb[i] = (uint16_t)(4 * T);         /* B */
    _tile_loadconfig(&c);
}

/* Rows per super-tile, blocks per chunk; up to Q8_AMX_FEW tokens a call runs the one-token
 * kernel per token (the rows stay in L2 for the next token) instead of the tiles, whose
 * set-up (activation transposes, tile configuration, accumulators of 128 rows) did not pay
 * for two or three tokens on small matrices (the routed experts of a batched step). */
enum { Q8_AMX_SR = 128, Q8_AMX_CB = 16, Q8_AMX_FEW = 3 };

/* Block i of a group into C tile CI (A tile AI, B tile BI): weights of block ablk + 34·i,
 * activations from the B buffer bt[i] (64-byte rows). */
#define Q8_AMX_DP(CI, AI, BI, i, ablk, bt)                                                 \
    do {                                                                                   \
        _tile_loadd(AI, (ablk) + 34 * (i) + 2, (long)rb);                                  \
        _tile_loadd(BI, (bt)[i], 64);                                                      \
        _tile_zero(CI);                                                                    \
        _tile_dpbssd(CI, AI, BI);                                                          \
    } while (0)

/* Up to four blocks' dot products of one row tile into cb[0..g): four C tiles, two A and
 * two B tiles in turn, so the tile unit overlaps the blocks. */
#define Q8_AMX_GROUP(g, ablk, bt, cb)                                                      \
    do {                                                                                   \
        Q8_AMX_DP(0, 4, 6, 0, ablk, bt);                                                   \
        if ((g) > 1) Q8_AMX_DP(1, 5, 7, 1, ablk, bt);                                      \
        if ((g) > 2) Q8_AMX_DP(2, 4, 6, 2, ablk, bt);                                      \
        if ((g) > 3) Q8_AMX_DP(3, 5, 7, 3, ablk, bt);                                      \
        _tile_stored(0, (cb)[0], 64);                                                      \
        if ((g) > 1) _tile_stored(1, (cb)[1], 64);                                         \
        if ((g) > 2) _tile_stored(2, (cb)[2], 64);                                         \
        if ((g) > 3) _tile_stored(3, (cb)[3], 64);                                         \
    } while (0)

static void q8_0_rows_amx(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                          const dsib_qrow *x, float *const *yp, int n) {
    const int64_t nb = n_in / 32;
    if (n <= Q8_AMX_FEW) { /* few tokens (decode, routed experts of a batch): no tiles */
        q8_0_rows_avx512(w, rb, n_in, o0, o1, x, yp, n);
        return;
    }
    int cfg_m = -1, cfg_t = -1;
    _Alignas(64) float acc[Q8_AMX_SR][16];
    _Alignas(64) int32_t bt[Q8_AMX_CB][8][16]; /* B tiles of a chunk */
    _Alignas(64) float dx[Q8_AMX_CB][16];      /* activation scales, [block][token] */
    _Alignas(64) int32_t cb[4][16][16];        /* C of a group of blocks */
    for (int64_t s0 = o0; s0 < o1; s0 += Q8_AMX_SR) {
        const int64_t s1 = o1 - s0 < Q8_AMX_SR ? o1 : s0 + Q8_AMX_SR;
        for (int t0 = 0; t0 < n; t0 += 16) {
            const int T = n - t0 < 16 ? n - t0 : 16;
            const __mmask16 tm = (__mmask16)((1u << T) - 1);
            for (int r = 0; r < Q8_AMX_SR; r++) _mm512_store_ps(acc[r], _mm512_setzero_ps());
            for (int64_t b0 = 0; b0 < nb; b0 += Q8_AMX_CB) {
                const int nc = nb - b0 < Q8_AMX_CB ? (int)(nb - b0) : Q8_AMX_CB;
                for (int c = 0; c < nc; c++) {
                    for (int t = 0; t < T; t++) {
                        const int32_t *src = (const int32_t *)(x[t0 + t].q + 32 * (b0 + c));
                        for (int k = 0; k < 8; k++) bt[c][k][t] = src[k];
                        dx[c][t] = x[t0 + t].d[b0 + c];
                    }
                }
                for (int64_t r0 = s0; r0 < s1; r0 += 16) {
                    const int M = s1 - r0 < 16 ? (int)(s1 - r0) : 16;
                    if (M != cfg_m || T != cfg_t) q8_0_amx_config(M, T), cfg_m = M, cfg_t = T;
                    const uint8_t *wr = w + (size_t)r0 * rb;
                    __m512 a[16];
                    for (int m = 0; m < 16; m++) a[m] = _mm512_load_ps(acc[r0 - s0 + m]);
                    for (int c = 0; c < nc; c += 4) {
                        const int g = nc - c < 4 ? nc - c : 4;
                        const uint8_t *blk = wr + 34 * (b0 + c);
                        Q8_AMX_GROUP(g, blk, bt + c, cb);
                        for (int i = 0; i < g; i++) {
                            const __m512 dxv = _mm512_maskz_load_ps(tm, dx[c + i]);
                            for (int m = 0; m < 16; m++)
                                if (m < M)
                                    a[m] = _mm512_fmadd_ps(
                                        _mm512_mul_ps(dxv, q8_0_bcast_f16(blk + 34 * i + (size_t)m * rb)),
                                        _mm512_cvtepi32_ps(_mm512_maskz_load_epi32(tm, cb[i][m])),
                                        a[m]);
                        }
                    }
                    for (int m = 0; m < 16; m++)
                        if (m < M) _mm512_store_ps(acc[r0 - s0 + m], a[m]);
                }
            }
            for (int t = 0; t < T; t++)
                for (int64_t r = 0; r < s1 - s0; r++) yp[t0 + t][s0 + r] = acc[r][t];
        }
    }
    _tile_release();
}

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q8_0 = {
    DSI_TYPE_Q8_0,
    DSIB_ACT_Q8_32,
    {q8_0_rows_scalar, q8_0_rows_avx2, NULL, q8_0_rows_avx512, q8_0_rows_amx}};

#else

const dsib_kern_qtype dsib_kq_q8_0 = {DSI_TYPE_Q8_0, DSIB_ACT_Q8_32, {q8_0_rows_scalar}};

#endif
