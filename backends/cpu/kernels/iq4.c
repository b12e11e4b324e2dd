/*
 * 4-bit table types × DSIB_ACT_Q8_32 activations (default path; kernels.h): Q4_0, IQ4_NL
 * and IQ4_XS. Each nibble is an exact int8 — nibble − 8 (Q4_0) or kvalues_iq4nl[nibble]
 * (IQ4_NL, IQ4_XS: −127 … 113) — looked up with one pshufb, and every 32-element block has
 * one f32 scale sw_b:
 *
 *   Q4_0, IQ4_NL (18-byte blocks: d f16, qs[16]): sw_b = d;
 *   IQ4_XS (136-byte super-blocks of 8 blocks: d f16, scales_h u16, scales_l[4], qs[128]):
 *     sw_b = d · (ls_b − 32), ls_b = nibble (b mod 2) of scales_l[b / 2] | 2 bits (2b..) of
 *     scales_h << 4 (exact in f32: an 11-bit mantissa times a 6-bit integer).
 *
 * Element order inside a block is natural (i < 16: low nibble of qs[i]; i >= 16: high
 * nibble of qs[i − 16]; IQ4_XS block b's qs at 8 + 16b of its super-block).
 *
 * Canonical order (every ISA, bit-identical): the Q8_32 lane order (kernels_impl.h) with these weights
 * and scales (pair p = b / 2 goes to set p mod 2):
 *
 *   I_b[j] = Σ_{k<4} w[32b + 4j + k] · q[32b + 4j + k]        j < 8 (exact)
 *   acc[p mod 2][8·(b mod 2) + j] = fmaf(sw_b · dx_b, (float)I_b[j], acc[p mod 2][8·(b mod 2) + j])
 *
 * then y = dsib_reduce32(acc).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include "quant/ggml_tables.h"

#include <math.h>

static const int8_t q4_0_tab[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

/* IQ4_XS: the eight block scales of a super-block (ls − 32, exact integers). */
static inline void iq4_xs_scales(const uint8_t *sb, int32_t ls[8]) {
    const uint32_t h = (uint32_t)sb[2] | (uint32_t)sb[3] << 8;
    for (int b = 0; b < 8; b++)
        ls[b] = (int32_t)(((sb[4 + b / 2] >> (4 * (b & 1))) & 15) | (((h >> (2 * b)) & 3) << 4)) - 32;
}

/* ---- scalar ---------------------------------------------------------------------------- */

static inline void nib_block(const int8_t *tab, const uint8_t *qs, int8_t wq[32]) {
    for (int i = 0; i < 16; i++) {
        wq[i] = tab[qs[i] & 15];
        wq[16 + i] = tab[qs[i] >> 4];
    }
}

/* Q4_0 / IQ4_NL: 18-byte blocks (d f16, qs[16]) through the 16-entry table tab. */
static inline float nib18_dot_scalar(const int8_t *tab, const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        int8_t wq[32];
        nib_block(tab, row + 18 * b + 2, wq);
        dsib_q8_32_step_scalar(acc, b, dsib_ld_f16(row + 18 * b) * x->d[b], wq, x->q + 32 * b);
    }
    return dsib_reduce32(acc);
}

static float q4_0_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    return nib18_dot_scalar(q4_0_tab, row, n_in, x);
}

static float iq4_nl_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    return nib18_dot_scalar(dsii_kvalues_iq4nl, row, n_in, x);
}

static float iq4_xs_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t B = 0; B < n_in / 256; B++) {
        const uint8_t *sb = row + 136 * B;
        const float d = dsib_ld_f16(sb);
        int32_t ls[8];
        iq4_xs_scales(sb, ls);
        for (int i = 0; i < 8; i++) {
            const int64_t b = 8 * B + i;
            int8_t wq[32];
            nib_block(dsii_kvalues_iq4nl, sb + 8 + 16 * i, wq);
            dsib_q8_32_step_scalar(acc, b, (d * (float)ls[i]) * x->d[b], wq, x->q + 32 * b);
        }
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q4_0_rows_scalar, q4_0_dot_scalar)
DSIB_QROWS_SCALAR(iq4_nl_rows_scalar, iq4_nl_dot_scalar)
DSIB_QROWS_SCALAR(iq4_xs_rows_scalar, iq4_xs_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* 32 nibbles at qs → 32 int8 through the 16-entry table, in element order */
DSIB_AI __m256i nib_block_avx2(const int8_t *tab, const uint8_t *qs) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tab));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i n = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)),
                                       _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(lut, n);
}
#define Q4_0_WBLK(blk) nib_block_avx2(q4_0_tab, (blk) + 2)
#define IQ4_NL_WBLK(blk) nib_block_avx2(dsii_kvalues_iq4nl, (blk) + 2)
#define F16_SBLK(blk) dsib_f16_hw(blk)
DSIB_Q8_32_TILE_AVX2(q4_0_tile_avx2, 18, Q4_0_WBLK, F16_SBLK)
DSIB_Q8_32_TILE_AVX2(iq4_nl_tile_avx2, 18, IQ4_NL_WBLK, F16_SBLK)
DSIB_QROWS_DEFINE_T(q4_0_rows_avx2, q4_0_tile_avx2, 4)
DSIB_QROWS_DEFINE_T(iq4_nl_rows_avx2, iq4_nl_tile_avx2, 4)

/* IQ4_XS: DSIB_Q8_32_TILE_AVX2's per-block step over the eight blocks of each super-block. */
DSIB_AI void iq4_xs_tile_avx2(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                              float *out, const int R, const int T, const int PF) {
    __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] = _mm256_setzero_ps();
    for (int64_t B = 0; B < n_in / 256; B++)
        for (int r = 0; r < R; r++) {
            const uint8_t *sb = w + (size_t)r * rb + 136 * B;
            DSIB_PF(PF, sb, 136);
            const float d = dsib_f16_hw(sb);
            int32_t ls[8];
            iq4_xs_scales(sb, ls);
            for (int i = 0; i < 8; i++) {
                const int64_t b = 8 * B + i;
                const __m256i wq = nib_block_avx2(dsii_kvalues_iq4nl, sb + 8 + 16 * i);
                const float sw = d * (float)ls[i];
                for (int t = 0; t < T; t++) {
                    const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + 32 * b));
                    acc[r][t][(i >> 1) & 1][i & 1] =
                        _mm256_fmadd_ps(_mm256_set1_ps(sw * x[t].d[b]), _mm256_cvtepi32_ps(dsib_dot_s8s8_avx2(wq, xq)),
                                        acc[r][t][(i >> 1) & 1][i & 1]);
                }
            }
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1], acc[r][t][1][0],
                                                acc[r][t][1][1]);
}
DSIB_QROWS_DEFINE_T(iq4_xs_rows_avx2, iq4_xs_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* The 64 int8 weights of two blocks whose 16 nibble bytes are at qa and qb (qb ignored when
 * half: that block's bytes are then the table's entry 0, cancelled by its zero activations),
 * + 128 when u. */
DSIB_AI __m512i nib_pair_avx512(const int8_t *tab, const uint8_t *qa, const uint8_t *qb, int half, int u) {
    const __m512i lut_s = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tab));
    const __m512i lut = u ? _mm512_add_epi8(lut_s, _mm512_set1_epi8((char)0x80)) : lut_s;
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa));
    const __m512i v = half ? _mm512_zextsi256_si512(a)
                           : _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb)), 1);
    const __m512i n = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                                       _mm512_set1_epi8(0x0F));
    return _mm512_shuffle_epi8(lut, n);
}
#define Q4_0_WPAIR(blk, half, u) nib_pair_avx512(q4_0_tab, (blk) + 2, (blk) + 20, half, u)
#define IQ4_NL_WPAIR(blk, half, u) nib_pair_avx512(dsii_kvalues_iq4nl, (blk) + 2, (blk) + 20, half, u)
#define F16_SPAIR(blk, half)                                                               \
    ((half) ? _mm512_maskz_mov_ps(0x00FF, dsib_pair_f16(blk, blk)) : dsib_pair_f16(blk, (blk) + 18))
DSIB_Q8_32_TILE_AVX512(q4_0_tile_avx512, 18, Q4_0_WPAIR, F16_SPAIR)
DSIB_Q8_32_TILE_AVX512(iq4_nl_tile_avx512, 18, IQ4_NL_WPAIR, F16_SPAIR)
DSIB_QROWS_DEFINE_RT8(q4_0_rows_avx512, q4_0_tile_avx512, 2)
DSIB_QROWS_DEFINE_RT8(iq4_nl_rows_avx512, iq4_nl_tile_avx512, 2)

/* IQ4_XS: the eight block scales of the super-block at sb, d · (ls − 32) in lanes 0-7
 * (exact, as iq4_xs_scales then the product): scales_l's nibble b is bits 4b.. of its u32,
 * scales_h's pair b bits 2b.. of its u16. */
DSIB_AI __m512 iq4_xs_scales_avx512(const uint8_t *sb) {
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)dsib_ld32(sb + 4)),
                                                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(15));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)(sb[2] | sb[3] << 8)),
                                                          _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    return _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(dsib_f16_hw(sb)), _mm256_cvtepi32_ps(ls)));
}

/* IQ4_XS: DSIB_Q8_32_TILE_AVX512's pair step over the four block pairs of each super-block
 * (pair p = 4B + i, set i mod 2; 256-element super-blocks have no lone last block). */
DSIB_AI void iq4_xs_tile_avx512(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,
                                float *out, const int R, const int T, const int PF) {
    __m512 acc[4][4][2]; /* [row][token][set] */
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    for (int64_t B = 0; B < n_in / 256; B++) {
        __m512 dw[4]; /* per row: the eight block scales d·(ls − 32) in lanes 0-7 */
        for (int r = 0; r < R; r++) dw[r] = iq4_xs_scales_avx512(w + (size_t)r * rb + 136 * B);
        for (int i = 0; i < 4; i++) {
            const int64_t p = 4 * B + i;
            /* the pair's two scales: lanes 0-7 block 2i, 8-15 block 2i + 1 */
            const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi32(2 * i), _mm256_set1_epi32(2 * i + 1), 1);
            __m512 dx[4];
            __m512i xq[4];
            for (int t = 0; t < T; t++) {
                dx[t] = _mm512_loadu_ps(x[t].e + 16 * p);
                xq[t] = _mm512_loadu_si512(x[t].q + 64 * p);
                if (T > 1) xq[t] = _mm512_xor_si512(xq[t], c128);
            }
            for (int r = 0; r < R; r++) {
                const uint8_t *sb = w + (size_t)r * rb + 136 * B;
                if (i == 0) DSIB_PF(PF, sb, 136);
                const __m512 sw = _mm512_permutexvar_ps(pick, dw[r]);
                const uint8_t *qs = sb + 8 + 32 * i;
                if (T == 1) {
                    const __m512i I = _mm512_dpbusd_epi32(_mm512_loadu_si512(x[0].c + 16 * p),
                                                          nib_pair_avx512(dsii_kvalues_iq4nl, qs, qs + 16, 0, 1), xq[0]);
                    acc[r][0][i & 1] = _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[0]), _mm512_cvtepi32_ps(I), acc[r][0][i & 1]);
                } else {
                    const __m512i wq = nib_pair_avx512(dsii_kvalues_iq4nl, qs, qs + 16, 0, 0);
                    const __m512i neg =
                        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, wq));
                    for (int t = 0; t < T; t++) {
                        const __m512i I = _mm512_dpbusd_epi32(neg, xq[t], wq);
                        acc[r][t][i & 1] =
                            _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[t]), _mm512_cvtepi32_ps(I), acc[r][t][i & 1]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < R; r++) {
        if (T == 4) {
            dsib_reduce32x4_avx512((const __m512(*)[2])acc[r], out + r * 4);
            continue;
        }
        for (int t = 0; t < T; t++) out[r * T + t] = dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);
    }
}
DSIB_QROWS_DEFINE_R(iq4_xs_rows_avx512, iq4_xs_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q4_0 = {
    DSIB_TYPE_Q4_0, DSIB_ACT_Q8_32, {q4_0_rows_scalar, q4_0_rows_avx2, NULL, q4_0_rows_avx512}};
const dsib_kern_qtype dsib_kq_iq4_nl = {
    DSIB_TYPE_IQ4_NL, DSIB_ACT_Q8_32, {iq4_nl_rows_scalar, iq4_nl_rows_avx2, NULL, iq4_nl_rows_avx512}};
const dsib_kern_qtype dsib_kq_iq4_xs = {
    DSIB_TYPE_IQ4_XS, DSIB_ACT_Q8_32, {iq4_xs_rows_scalar, iq4_xs_rows_avx2, NULL, iq4_xs_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q4_0 = {DSIB_TYPE_Q4_0, DSIB_ACT_Q8_32, {q4_0_rows_scalar}};
const dsib_kern_qtype dsib_kq_iq4_nl = {DSIB_TYPE_IQ4_NL, DSIB_ACT_Q8_32, {iq4_nl_rows_scalar}};
const dsib_kern_qtype dsib_kq_iq4_xs = {DSIB_TYPE_IQ4_XS, DSIB_ACT_Q8_32, {iq4_xs_rows_scalar}};

#endif
