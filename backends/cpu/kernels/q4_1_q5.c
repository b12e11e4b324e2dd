/*
 * The legacy ggml 32-element types with a min or a fifth bit × DSIB_ACT_Q8_32 activations
 * (default path; kernels.h): Q4_1, Q5_0 and Q5_1. Blocks (ggml block_q4_1 / _q5_0 / _q5_1,
 * docs/tensor-types.md), element i < 32 with code u_i:
 *
 *   Q4_1 (20 bytes: d f16, m f16, qs[16]):          u_i = nibble,          value d·u_i + m;
 *   Q5_0 (22 bytes: d f16, qh u32, qs[16]):         u_i = nibble | h_i<<4, value d·(u_i − 16);
 *   Q5_1 (24 bytes: d f16, m f16, qh u32, qs[16]):  u_i = nibble | h_i<<4, value d·u_i + m;
 *
 * nibble = low nibble of qs[i] (i < 16) / high nibble of qs[i − 16] (i >= 16), h_i = bit i
 * of qh (little-endian). The codes are exact int8 (Q5_0: u − 16 in −16 … 15, the −16 folded
 * into the integer: I = S − 16·Σq per lane of four, exact; Q4_1 / Q5_1: u in 0 … 31, the
 * unsigned operand of maddubs / dpbusd). The min m does not share the scale d, so it gets
 * its own float step with the exact activation block sum Σq_b (the row's s[b]).
 *
 * Canonical order (every ISA, bit-identical): the Q8_32 lane order (kernels_impl.h) — two sets of 16 f32 lanes
 * acc[2][16], zero at the start, block b in order (pair p = b / 2 → set p mod 2, h = b mod 2,
 * lanes 8h .. 8h+7; dx_b the activation scale, q its int8 values):
 *
 *   I_b[j] = Σ_{k<4} w[32b + 4j + k] · q[32b + 4j + k]          j < 8 (exact int32;
 *            w = u − 16 for Q5_0, u for Q4_1 / Q5_1)
 *   acc[p mod 2][8h + j] = fmaf(d_b·dx_b, (float)I_b[j], acc[p mod 2][8h + j])     j < 8
 *
 * and, for Q4_1 / Q5_1 only, after those eight, into one lane (lane h of the block's
 * eight, i.e. lane 0 for even b and lane 9 for odd b):
 *
 *   acc[p mod 2][9h] = fmaf(m_b, dx_b·(float)Σq_b, acc[p mod 2][9h])
 *
 * (d_b·dx_b and dx_b·Σq_b one f32 rounding each — the latter is the token's, computed once
 * for all rows; |I| <= 4·31·127 and |Σq_b| <= 32·127 are exact in f32), then
 * y = dsib_reduce32(acc). Q5_0 is therefore exactly Q4_0's scheme
 * (iq4.c) with five-bit codes and runs on the shared Q8_32 tiles; Q4_1 / Q5_1 have their
 * own tiles below (the same lanes plus the min step: a blend of lane h on AVX2, a masked
 * fma on lanes 0 / 9 on AVX-512).
 */
#include "backends/cpu/kernels/kernels_impl.h"

#include <math.h>

/* ---- scalar ---------------------------------------------------------------------------- */

/* The 32 codes of a block: nibbles at qs, fifth bits from qh (NULL: none), minus off. */
static inline void q_block(const uint8_t *qs, const uint8_t *qh, int off, int8_t wq[32]) {
    const uint32_t h = qh ? dsib_ld32(qh) : 0;
    for (int i = 0; i < 16; i++) {
        wq[i] = (int8_t)((int)((qs[i] & 15) | ((h >> i) & 1) << 4) - off);
        wq[16 + i] = (int8_t)((int)((qs[i] >> 4) | ((h >> (16 + i)) & 1) << 4) - off);
    }
}

/* The min step of block b (weight min m): lane h = b mod 2 of its eight (lane 9h of the set). */
static inline void min_step_scalar(float acc[2][16], int64_t b, float m, const dsib_qrow *x) {
    float *a = &acc[(b >> 1) & 1][9 * (b & 1)];
    *a = fmaf(m, x->d[b] * (float)x->s[b], *a);
}

static float q4_1_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 20 * b;
        int8_t wq[32];
        q_block(blk + 4, NULL, 0, wq);
        dsib_q8_32_step_scalar(acc, b, dsib_ld_f16(blk) * x->d[b], wq, x->q + 32 * b);
        min_step_scalar(acc, b, dsib_ld_f16(blk + 2), x);
    }
    return dsib_reduce32(acc);
}

static float q5_0_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 22 * b;
        int8_t wq[32];
        q_block(blk + 6, blk + 2, 16, wq);
        dsib_q8_32_step_scalar(acc, b, dsib_ld_f16(blk) * x->d[b], wq, x->q + 32 * b);
    }
    return dsib_reduce32(acc);
}

static float q5_1_dot_scalar(const uint8_t *row, int64_t n_in, const dsib_qrow *x) {
    float acc[2][16] = {{0}};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + 24 * b;
        int8_t wq[32];
        q_block(blk + 8, blk + 4, 0, wq);
        dsib_q8_32_step_scalar(acc, b, dsib_ld_f16(blk) * x->d[b], wq, x->q + 32 * b);
        min_step_scalar(acc, b, dsib_ld_f16(blk + 2), x);
    }
    return dsib_reduce32(acc);
}

DSIB_QROWS_SCALAR(q4_1_rows_scalar, q4_1_dot_scalar)
DSIB_QROWS_SCALAR(q5_0_rows_scalar, q5_0_dot_scalar)
DSIB_QROWS_SCALAR(q5_1_rows_scalar, q5_1_dot_scalar)

#ifdef DSIB_KERN_X86

/* ---- AVX2 ------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)
#include "backends/cpu/kernels/simd_avx2.h"

/* The 32 nibbles at qs in element order (0 … 15). */
DSIB_AI __m256i nib_block_avx2(const uint8_t *qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* Byte i = 0xFF where bit i of the u32 at qh is set, else 0. */
DSIB_AI __m256i qh_bytes_avx2(const uint8_t *qh) {
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)dsib_ld32(qh)),
                                          _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll,
                                                             0x0303030303030303ll));
    return _mm256_cmpeq_epi8(_mm256_or_si256(v, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFEll)),
                             _mm256_set1_epi64x(-1));
}

/* Q5_0: u − 16 = nibble | (h ? 0 : 0xF0) as int8. */
DSIB_AI __m256i q5_0_block_avx2(const uint8_t *blk) {
    return _mm256_or_si256(nib_block_avx2(blk + 6), _mm256_andnot_si256(qh_bytes_avx2(blk + 2), _mm256_set1_epi8((char)0xF0)));
}
#define Q5_0_WBLK(blk) q5_0_block_avx2(blk)
#define F16_SBLK(blk) dsib_f16_hw(blk)
DSIB_Q8_32_TILE_AVX2(q5_0_tile_avx2, 22, Q5_0_WBLK, F16_SBLK)
DSIB_QROWS_DEFINE_T(q5_0_rows_avx2, q5_0_tile_avx2, 4)

/* Q4_1 / Q5_1: the unsigned codes (nibble | h << 4). */
#define Q4_1_UBLK(blk) nib_block_avx2((blk) + 4)
#define Q5_1_UBLK(blk) _mm256_or_si256(nib_block_avx2((blk) + 8), _mm256_and_si256(qh_bytes_avx2((blk) + 4), _mm256_set1_epi8(0x10)))

/* DSIB_Q8_32_TILE_AVX2 with the min step: block b's lanes in acc[..][set][h] (one ymm);
 * the min's fma on all eight lanes, lane h of it blended in (the others keep acc exactly). */
#define QM_TILE_AVX2(NAME, BLK, UBLK)                                                      \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m256 acc[4][4][2][2]; /* [row][token][set][lanes 0-7 / 8-15] */                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                acc[r][t][0][0] = acc[r][t][0][1] = acc[r][t][1][0] = acc[r][t][1][1] =    \
                    _mm256_setzero_ps();                                                   \
        const int64_t nb = n_in / 32;                                                      \
        int64_t b = 0;                                                                     \
        for (; b + 4 <= nb; b += 4) {                                                      \
            for (int r = 0; r < R; r++) DSIB_PF_ROWS(PF, w + (size_t)r * rb + (BLK) * b, 4 * (BLK), R, rb); \
            QM_BLOCK_AVX2_(b, 0, 0, BLK, UBLK);                                            \
            QM_BLOCK_AVX2_(b + 1, 0, 1, BLK, UBLK);                                        \
            QM_BLOCK_AVX2_(b + 2, 1, 0, BLK, UBLK);                                        \
            QM_BLOCK_AVX2_(b + 3, 1, 1, BLK, UBLK);                                        \
        }                                                                                  \
        if (b < nb) QM_BLOCK_AVX2_(b, 0, 0, BLK, UBLK);                                    \
        if (b + 1 < nb) QM_BLOCK_AVX2_(b + 1, 0, 1, BLK, UBLK);                            \
        if (b + 2 < nb) QM_BLOCK_AVX2_(b + 2, 1, 0, BLK, UBLK);                            \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = dsib_reduce32_avx2(acc[r][t][0][0], acc[r][t][0][1],      \
                                                    acc[r][t][1][0], acc[r][t][1][1]);     \
    }

#define QM_BLOCK_AVX2_(b, set, h, BLK, UBLK)                                               \
    do {                                                                                   \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + (BLK) * (b);                         \
            const __m256i wq = UBLK(blk);                                                  \
            const __m128 dm = dsib_f16x2_hw(blk); /* d, m */                               \
            const float dw = _mm_cvtss_f32(dm);                                            \
            const __m256 mw = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));                  \
            for (int t = 0; t < T; t++) {                                                  \
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[t].q + 32 * (b))); \
                const float dx = x[t].d[b];                                                \
                const __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx),                  \
                                                 _mm256_cvtepi32_ps(dsib_dot_u8s8_avx2(wq, xq)), \
                                                 acc[r][t][set][h]);                       \
                acc[r][t][set][h] = _mm256_blend_ps(                                       \
                    a, _mm256_fmadd_ps(mw, _mm256_set1_ps(dx * (float)x[t].s[b]), a), 1 << (h)); \
            }                                                                              \
        }                                                                                  \
    } while (0)

QM_TILE_AVX2(q4_1_tile_avx2, 20, Q4_1_UBLK)
QM_TILE_AVX2(q5_1_tile_avx2, 24, Q5_1_UBLK)
DSIB_QROWS_DEFINE_T4(q4_1_rows_avx2, q4_1_tile_avx2, 4)
DSIB_QROWS_DEFINE_T4(q5_1_rows_avx2, q5_1_tile_avx2, 4)

DSIB_TARGET_POP

/* ---- AVX-512 + VNNI -------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512VNNI)
#include "backends/cpu/kernels/simd_avx512.h"

/* The 64 nibbles of two blocks whose 16 qs bytes are at qa and qb, in element order (qb
 * not read when half: those bytes are 0). */
DSIB_AI __m512i nib_pair_avx512(const uint8_t *qa, const uint8_t *qb, int half) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa));
    const __m512i v = half ? _mm512_zextsi256_si512(a)
                           : _mm512_inserti64x4(_mm512_castsi256_si512(a),
                                                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb)), 1);
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
}

/* The fifth bits of two blocks (qh u32 at ha, hb; hb not read when half) as a byte mask. */
DSIB_AI __mmask64 qh_pair_mask(const uint8_t *ha, const uint8_t *hb, int half) {
    return _cvtu64_mask64((uint64_t)dsib_ld32(ha) | (half ? 0 : (uint64_t)dsib_ld32(hb) << 32));
}

/* Q5_0 for DSIB_Q8_32_TILE_AVX512: u − 16, + 128 when u_off (u + 112). */
DSIB_AI __m512i q5_0_pair_avx512(const uint8_t *blk, int half, int u_off) {
    const __m512i v = _mm512_add_epi8(nib_pair_avx512(blk + 6, blk + 28, half), _mm512_set1_epi8(u_off ? 112 : -16));
    return _mm512_mask_add_epi8(v, qh_pair_mask(blk + 2, blk + 24, half), v, _mm512_set1_epi8(16));
}
#define Q5_0_WPAIR(blk, half, u) q5_0_pair_avx512(blk, half, u)
#define F16_SPAIR(blk, half)                                                               \
    ((half) ? _mm512_maskz_mov_ps(0x00FF, dsib_pair_f16(blk, blk)) : dsib_pair_f16(blk, (blk) + 22))
DSIB_Q8_32_TILE_AVX512(q5_0_tile_avx512, 22, Q5_0_WPAIR, F16_SPAIR)
DSIB_QROWS_DEFINE_RT4(q5_0_rows_avx512, q5_0_tile_avx512, 2)

/* Q4_1 / Q5_1: the unsigned codes of a block pair. */
#define Q4_1_UPAIR(blk, half) nib_pair_avx512((blk) + 4, (blk) + 24, half)
DSIB_AI __m512i q5_1_pair_avx512(const uint8_t *blk, int half) {
    const __m512i v = nib_pair_avx512(blk + 8, blk + 32, half);
    return _mm512_mask_add_epi8(v, qh_pair_mask(blk + 4, blk + 28, half), v, _mm512_set1_epi8(16));
}
#define Q5_1_UPAIR(blk, half) q5_1_pair_avx512(blk, half)

/* The activation block sums of pair p (the second 0 when half) times the pair scales:
 * dx_b·(float)Σq_b of block 2p in the even lanes (lane 0), of 2p + 1 in the odd ones (lane 9). */
DSIB_AI __m512 sum_pair_avx512(const dsib_qrow *x, int64_t p, int half, __m512 dx) {
    uint32_t s2 = (uint16_t)x->s[2 * p];
    if (!half) memcpy(&s2, x->s + 2 * p, 4);
    return _mm512_mul_ps(dx, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_set1_epi32((int)s2))));
}

/* d_a, m_a, d_b, m_b of the block pair at blk in lanes 0-3 (block b not read, 0, when
 * half; vcvtph2ps reads only the low four words). */
DSIB_AI __m128 dm_pair_avx512(const uint8_t *blk, int blk_bytes, int half) {
    const __m128i a = _mm_cvtsi32_si128((int)dsib_ld32(blk));
    return _mm_cvtph_ps(half ? a : _mm_insert_epi32(a, (int)dsib_ld32(blk + blk_bytes), 1));
}

/* DSIB_Q8_32_TILE_AVX512 for the unsigned codes (dpbusd of the codes against the signed
 * activations directly, no offsets) with the min step: a masked fma on lanes 0 and 9. */
#define QM_TILE_AVX512(NAME, BLK, UPAIR)                                                   \
    DSIB_AI void NAME(const uint8_t *w, size_t rb, int64_t n_in, const dsib_qrow *x,       \
                      float *out, const int R, const int T, const int PF) {                \
        __m512 acc[4][4][2]; /* [row][token][set] */                                       \
        for (int r = 0; r < R; r++)                                                        \
            for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();  \
        const int64_t nb = n_in / 32;                                                      \
        DSIB_PAIR_LOOP(nb, QM_PAIR_AVX512_, BLK, UPAIR);                                   \
        DSIB_REDUCE_R4T1_AVX512_(acc, out);                                                \
        for (int r = 0; r < R; r++) {                                                      \
            if (T == 4) {                                                                  \
                dsib_reduce32x4_avx512((const __m512(*)[2])acc[r], out + r * 4);           \
                continue;                                                                  \
            }                                                                              \
            for (int t = 0; t < T; t++)                                                    \
                out[r * T + t] = dsib_reduce32_avx512(acc[r][t][0], acc[r][t][1]);         \
        }                                                                                  \
    }

#define QM_PAIR_AVX512_(p, half, set, BLK, UPAIR)                                          \
    do {                                                                                   \
        const __mmask16 km = (half) ? 0x0001 : 0x0201;                                     \
        __m512 dx[4], sd[4];                                                               \
        __m512i xq[4];                                                                     \
        for (int t = 0; t < T; t++) {                                                      \
            dx[t] = _mm512_loadu_ps(x[t].e + 16 * (p)); /* upper half 0 when half */      \
            xq[t] = (half) ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, x[t].q + 64 * (p))     \
                           : _mm512_loadu_si512(x[t].q + 64 * (p));                        \
            sd[t] = sum_pair_avx512(&x[t], p, half, dx[t]);                                \
        }                                                                                  \
        for (int r = 0; r < R; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * rb + 2 * (BLK) * (p);                     \
            DSIB_PF(PF, blk, 2 * (BLK));                                                   \
            const __m512 dm = _mm512_castps128_ps512(dm_pair_avx512(blk, BLK, half));      \
            /* d_a in lanes 0-7, d_b in 8-15; m_a in lane 0, m_b in lane 9 */              \
            const __m512 sw = _mm512_permutexvar_ps(                                       \
                _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), dm);      \
            const __m512 mw = _mm512_permutexvar_ps(                                       \
                _mm512_set_epi32(1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1), dm);      \
            const __m512i wq = UPAIR(blk, half);                                           \
            for (int t = 0; t < T; t++) {                                                  \
                const __m512i I = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq[t]);  \
                const __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(sw, dx[t]), _mm512_cvtepi32_ps(I), \
                                                 acc[r][t][set]);                          \
                acc[r][t][set] = _mm512_mask3_fmadd_ps(mw, sd[t], a, km);                  \
            }                                                                              \
        }                                                                                  \
    } while (0)

QM_TILE_AVX512(q4_1_tile_avx512, 20, Q4_1_UPAIR)
QM_TILE_AVX512(q5_1_tile_avx512, 24, Q5_1_UPAIR)
DSIB_QROWS_DEFINE_RT4(q4_1_rows_avx512, q4_1_tile_avx512, 2)
DSIB_QROWS_DEFINE_RT4(q5_1_rows_avx512, q5_1_tile_avx512, 2)

DSIB_TARGET_POP

const dsib_kern_qtype dsib_kq_q4_1 = {
    DSIB_TYPE_Q4_1, DSIB_ACT_Q8_32, {q4_1_rows_scalar, q4_1_rows_avx2, NULL, q4_1_rows_avx512}};
const dsib_kern_qtype dsib_kq_q5_0 = {
    DSIB_TYPE_Q5_0, DSIB_ACT_Q8_32, {q5_0_rows_scalar, q5_0_rows_avx2, NULL, q5_0_rows_avx512}};
const dsib_kern_qtype dsib_kq_q5_1 = {
    DSIB_TYPE_Q5_1, DSIB_ACT_Q8_32, {q5_1_rows_scalar, q5_1_rows_avx2, NULL, q5_1_rows_avx512}};

#else

const dsib_kern_qtype dsib_kq_q4_1 = {DSIB_TYPE_Q4_1, DSIB_ACT_Q8_32, {q4_1_rows_scalar}};
const dsib_kern_qtype dsib_kq_q5_0 = {DSIB_TYPE_Q5_0, DSIB_ACT_Q8_32, {q5_0_rows_scalar}};
const dsib_kern_qtype dsib_kq_q5_1 = {DSIB_TYPE_Q5_1, DSIB_ACT_Q8_32, {q5_1_rows_scalar}};

#endif
