/*
 * Q8_0 weights × DSIB_ACT_Q8_32 activations (default path; kernels.h).
 *
 * Canonical order (every ISA, bit-identical): two sets of 16 f32 lanes acc[2][16], zero at
 * the start. Block b (32 elements) with weight scale dw_b (f16) and activation scale dx_b
 * belongs to the pair (step) p = b / 2:
 *
 *   I_b[j] = Σ_{k<4} w[32b + 4j + k] · q[32b + 4j + k]        j < 8 (exact int32)
 *   s_b    = dw_b · dx_b                                       (one f32 rounding)
 *   acc[p mod 2][8·(b mod 2) + j] = fmaf(s_b, (float)I_b[j], acc[p mod 2][8·(b mod 2) + j])
 *
 * in block order, then y = dsib_reduce32(acc). AVX2 holds a set's lanes 0-7 / 8-15 in two
 * ymm (one block each); AVX-512 holds a block pair in one zmm (dpbusd of w + 128 against the signed
 * activations, each lane starting at the activation row's correction -128·Σq).
 *
 * This file is also the template for a new 32-element-block type: decode the weight block
 * to int8 in registers, reuse it for every token of the tile, keep the lanes above.
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>
#include <string.h>

/* ---- scalar ---------------------------------------------------------------------------- */

static float q8_0_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const float s = dsib_ld_f16(blk) * x->d[b];
        const int8_t *wq = (const int8_t *)(blk + 2), *xq = x->q + 32 * b;
        dsib_q8_32_step_scalar(acc, b, s, wq, xq);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q8_0_rows_scalar, q8_0_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

#define Q8_0_WBLK(blk) _mm256_loadu_si256((const __m256i *)((blk) + 2))
#define Q8_0_SBLK(blk) dsib_f16_hw(blk)
DSIB_Q8_32_TILE_AVX2(q8_0_tile_avx2, 34, Q8_0_WBLK, Q8_0_SBLK)

DSIB_QROWS_DEFINE_T(q8_0_rows_avx2, q8_0_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* The weights of a block pair (the second block's zero when half), + 128 when u. */
DSIB_AI __m512i q8_0_pair_avx512(const uint8_t *blk, int half, int u) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m512i v = half ? _mm512_zextsi256_si512(a)
                           : _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                                _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
    return u ? _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)) : v;
}
#define Q8_0_WPAIR(blk, half, u) q8_0_pair_avx512(blk, half, u)
#define Q8_0_SPAIR(blk, half)                                                              \
    ((half) ? _mm512_maskz_mov_ps(0x00FF, dsib_pair_f16(blk, blk)) : dsib_pair_f16(blk, (blk) + 34))
DSIB_Q8_32_TILE_AVX512(q8_0_tile_avx512, 34, Q8_0_WPAIR, Q8_0_SPAIR)

DSIB_QROWS_DEFINE_RT8(q8_0_rows_avx512, q8_0_tile_avx512, 2)

DSIB_TARGET_POP

/* ---- AMX (AVX-512 + VNNI + AMX-TILE + AMX-INT8) ----------------------------------------
 *
 * Its own canonical order (the "block-sum order"; docs/performance.md 4.000000), because an AMX
 * dot product sums a whole 32-element block: for output (o, t), acc = 0 and for every block
 * b in order
 *
 *   I_b = Σ_{k<32} w[32b + k] · q[32b + k]      (exact int32)
 *   s_b = dw_b · dx_b                            (one f32 rounding)
 *   acc = fmaf(s_b, (float)I_b, acc)
 *
 * y = acc. One serial chain per output: no lanes, no final reduction. When the process
 * uses this path, every Q8_0 call takes it (n_tok = 1 included), so the invariance contract
 * holds as on the other ISAs (test_cpukernels test_amx_blocksum writes the order in plain C
 * and compares bit for bit). Opt-in (DSINFER_CPU_AMX=1, kernels.c; docs/performance.md
 * 4.000000: prefill +56 %, decode as fast as the AVX-512 path, other last bits).
 *
 * Tiles: C (tiles 0-3) = M weight rows × T tokens of int32, A (tiles 4, 5) = M rows × 32
 * bytes of one block's weights, read in place with the row stride, B (tiles 6, 7) = the
 * block's 32 activation bytes of T tokens in the VNNI layout (8 rows of T × 4 bytes),
 * transposed into a small stack buffer once per (super-tile of 128 rows, token group of
 * 16, chunk of 16 blocks); four blocks in flight. The float stage runs 16 tokens per zmm
 * (one row per register). Up to Q8_AMX_FEW tokens: no tiles (q8_0_bs_token). */
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

/* One token, in the block-sum order without tiles (a tile op per block of 16 rows was
 * slower than memory for one token): 16 rows per register, lanes = rows. Per block pair and
 * row, one vpdpbusd gives 16 lanes of four products (w + 128 against q, each lane starting at
 * the token's correction c); a transpose-add tree of exact int32 additions turns the 16
 * rows' vectors into the two blocks' sums I_b, I_b+1 of the 16 rows, in row order; then
 * the two steps of the chain, block b first. */
DSIB_AI __m512i q8_0_bs_pair(__m512i a, __m512i b) { /* [a0+a2, b0+b2, a1+a3, b1+b3] per 128 */
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
DSIB_AI __m512i q8_0_bs_quad(__m512i a, __m512i b) { /* 4 rows' 4-lane sums per 128 */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

static void q8_0_bs_token(const uint8_t *w, size_t rb, int64_t nb, int64_t o0, int64_t o1,
                        const dsib_qrow *x, float *y) {
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    /* Prefetch: the next row tile's bytes (the task's rows are contiguous, so that is the
     * stream's next 16 rows), spread evenly over this tile's block pairs, and in the first
     * tile of the call each row half the one-row kernels' distance ahead (one core, from
     * memory: 512 × 2048 10.3 → 11.1 GB/s with it, 2048 × 4096 the same); off when
     * dsib_kern_prefetch is 0. */
    const int pf_on = dsib_kern_prefetch > 0;
    const int64_t npair = (nb + 1) / 2;
    for (int64_t r0 = o0; r0 < o1; r0 += 16) {
        const int M = o1 - r0 < 16 ? (int)(o1 - r0) : 16;
        const uint8_t *wr[16];
        int32_t ro[16];
        for (int m = 0; m < 16; m++) { /* rows past the end repeat the first (not stored) */
            ro[m] = m < M ? (int32_t)((size_t)m * rb) : 0;
            wr[m] = w + (size_t)r0 * rb + (size_t)ro[m];
        }
        const __m512i ridx = _mm512_loadu_si512(ro);
        const int64_t nx = o1 - (r0 + 16) < 16 ? o1 - (r0 + 16) : 16; /* rows of the next tile */
        const char *pf = (const char *)(w + (size_t)(r0 + 16) * rb);
        const size_t pf_bytes = nx > 0 && pf_on ? (size_t)nx * rb : 0;
        const size_t pf_step = (pf_bytes / (size_t)npair + 63) & ~(size_t)63;
        size_t pf_at = 0;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b += 2) {
            const int half = b + 1 == nb;
            const int64_t p = b / 2;
            const __m512i xq = half ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, x->q + 32 * b)
                                    : _mm512_loadu_si512(x->q + 32 * b);
            const __m512i c = half ? _mm512_maskz_loadu_epi32(0x00FF, x->c + 16 * p)
                                   : _mm512_loadu_si512(x->c + 16 * p);
            for (const size_t e = pf_at + pf_step; pf_at < e && pf_at < pf_bytes; pf_at += 64)
                __builtin_prefetch(pf + pf_at, 0, 3);
            __m512i z[16];
            const int32_t pfr = r0 == o0 ? dsib_kern_prefetch / 2 : 0;
            for (int m = 0; m < 16; m++) {
                const uint8_t *blk = wr[m] + 34 * b;
                if (pfr > 0) __builtin_prefetch(blk + pfr, 0, 3);
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 2));
                const __m512i v = half ? _mm512_zextsi256_si512(lo)
                                       : _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                                            _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
                z[m] = _mm512_dpbusd_epi32(c, _mm512_xor_si512(v, c128), xq);
            }
            __m512i s2[8], s4[4];
            for (int k = 0; k < 8; k++) s2[k] = q8_0_bs_pair(z[2 * k], z[2 * k + 1]);
            for (int k = 0; k < 4; k++) s4[k] = q8_0_bs_quad(s2[2 * k], s2[2 * k + 1]);
            /* s4[k] = [b: rows 4k.., half 0 | half 1 | b+1: half 0 | half 1] */
            const __m512i w0 = _mm512_add_epi32(_mm512_shuffle_i32x4(s4[0], s4[1], 0x88),
                                                _mm512_shuffle_i32x4(s4[0], s4[1], 0xDD));
            const __m512i w1 = _mm512_add_epi32(_mm512_shuffle_i32x4(s4[2], s4[3], 0x88),
                                                _mm512_shuffle_i32x4(s4[2], s4[3], 0xDD));
            const __m512i i0 = _mm512_shuffle_i32x4(w0, w1, 0x88); /* I_b of rows 0..15 */
            const uint8_t *sb = w + (size_t)r0 * rb + 34 * b;
            const __m512 d0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                _mm512_i32gather_epi32(ridx, (const void *)sb, 1)));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(d0, _mm512_set1_ps(x->d[b])),
                                  _mm512_cvtepi32_ps(i0), acc);
            if (!half) {
                const __m512i i1 = _mm512_shuffle_i32x4(w0, w1, 0xDD); /* I_b+1 */
                const __m512 d1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                    _mm512_i32gather_epi32(ridx, (const void *)(sb + 34), 1)));
                acc = _mm512_fmadd_ps(_mm512_mul_ps(d1, _mm512_set1_ps(x->d[b + 1])),
                                      _mm512_cvtepi32_ps(i1), acc);
            }
        }
        _mm512_mask_storeu_ps(y + r0, (__mmask16)((1u << M) - 1), acc);
    }
}

static void q8_0_rows_amx(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,
                          const dsib_qrow *x, float *const *yp, int n) {
    const int64_t nb = n_in / 32;
    if (n <= Q8_AMX_FEW) { /* few tokens (decode, routed experts of a batch): no tiles */
        for (int t = 0; t < n; t++) q8_0_bs_token(w, rb, nb, o0, o1, &x[t], yp[t]);
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
