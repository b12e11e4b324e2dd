/*
 * Activation quantisation for the default matmul path (kernels.h "Two activation paths").
 *
 * A token row of n_in f32 values becomes blocks of B = 32 (DSIB_ACT_Q8_32) or 256 (the
 * DSIB_ACT_Q8_K formats) values. For each block:
 *
 *   amax = max |x_i|, taken over the IEEE bit patterns with the sign cleared (so a NaN wins
 *          over Inf over any finite value, on every ISA);
 *   non-finite amax           → d = NaN, q_i = 0 (the outputs that use the block are NaN);
 *   amax < 2^-96 (incl. 0)    → d = 0,   q_i = 0 (a block of tiny values counts as zero);
 *   otherwise                 → d = amax / 127, q_i = RNE(x_i · (127 / amax)) (|q_i| <= 127;
 *                               one f32 division each, rounding to nearest even, independent
 *                               of the FPU rounding mode);
 *   sums                      → s = Σ q_i per block (Q8_32) or per 16 natural elements (Q8_K*);
 *   lane corrections (Q8_32)  → c[j] = -128 · Σ_{k<4} q[4j+k]: a kernel that offsets its
 *                               signed weights w to the unsigned w + 128 (for u8 × s8 dot
 *                               products, AVX-512 VNNI dpbusd) starts each 4-element lane's
 *                               sum at c[j] and gets Σ w·q exactly;
 *   pair scales (Q8_32)       → e[16p + j] = d[2p + j/8] (0 past the last block): the scales
 *                               of block pair p as one 16-lane vector.
 *
 * So x_i = d·q_i + e_i with |e_i| <= d/2 · (1 + 2^-22) (the rounding of 127/amax and of the
 * product shift q by at most one unit only where x·id sits within 2^-17 of a midpoint).
 *
 * Row storage (dsib_kern_act_view): q[n_in] (64-byte aligned; for the _P4 / _P2 formats
 * the eight 32-element groups of each block in the format's order), then d[n_in / B] f32,
 * then s[] int16, then (Q8_32) c[n_in / 4] int32 and e[16 · pairs] f32, each part starting
 * on a 64-byte boundary.
 * Every ISA writes the same bytes.
 */
#include "backends/cpu/kernels/kernels_impl.h"

static const uint8_t perm_p4[8] = {0, 2, 1, 3, 4, 6, 5, 7};
static const uint8_t perm_p2[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int64_t dsib_act_block(int32_t fmt) {
    switch (fmt) {
    case DSIB_ACT_Q8_32: return 32;
    case DSIB_ACT_Q8_K:
    case DSIB_ACT_Q8_K_P4:
    case DSIB_ACT_Q8_K_P2: return 256;
    default: return 0;
    }
}

const uint8_t *dsib_act_perm(int32_t fmt) {
    return fmt == DSIB_ACT_Q8_K_P4 ? perm_p4 : fmt == DSIB_ACT_Q8_K_P2 ? perm_p2 : NULL;
}

static size_t round64(size_t v) { return (v + 63) & ~(size_t)63; }

/* Byte offsets of the parts of a row (q at 0) and the row size. */
typedef struct act_lay {
    size_t d, s, c, e, size;
} act_lay;

static int act_layout(int32_t fmt, int64_t n_in, act_lay *l) {
    const int64_t B = dsib_act_block(fmt);
    if (B == 0 || n_in < 0 || n_in % B || n_in > ((int64_t)1 << 40)) return 0;
    const size_t nb = (size_t)(n_in / B);
    const size_t ns = B == 32 ? nb : (size_t)n_in / 16;
    const size_t nc = B == 32 ? (size_t)n_in / 4 : 0;
    l->d = round64((size_t)n_in);
    l->s = l->d + round64(nb * sizeof(float));
    l->c = l->s + round64(ns * sizeof(int16_t));
    l->e = l->c + round64(nc * sizeof(int32_t));
    l->size = l->e + round64(B == 32 ? 8 * (nb + 1) * sizeof(float) : 0);
    return 1;
}

size_t dsib_kern_act_row_bytes(int32_t fmt, int64_t n_in) {
    act_lay l;
    return act_layout(fmt, n_in, &l) ? l.size : 0;
}

/* Writable views of a row (the layout was validated by the caller's row size). */
typedef struct act_out {
    int8_t *q;
    float *d;
    int16_t *s;
    int32_t *c;
    float *e;
} act_out;

static act_out act_row_ptrs(int32_t fmt, uint8_t *row, int64_t n_in) {
    act_lay l = {0, 0, 0, 0, 0};
    act_layout(fmt, n_in, &l);
    act_out o = {(int8_t *)row, (float *)(void *)(row + l.d), (int16_t *)(void *)(row + l.s),
                 (int32_t *)(void *)(row + l.c), (float *)(void *)(row + l.e)};
    return o;
}

/* Q8_32: the pair scales e[16p + j] = d[2p + j / 8] (0 past the last block). */
static void act_pair_scales(act_out o, int64_t nb) {
    for (int64_t p = 0; 2 * p < nb; p++)
        for (int j = 0; j < 16; j++) o.e[16 * p + j] = 2 * p + j / 8 < nb ? o.d[2 * p + j / 8] : 0.0f;
}

dsib_qrow dsib_kern_act_view(int32_t fmt, const void *row, int64_t n_in) {
    dsib_qrow v = {NULL, NULL, NULL, NULL, NULL};
    act_lay l;
    if (!act_layout(fmt, n_in, &l)) return v;
    const uint8_t *p = row;
    v.q = (const int8_t *)p;
    v.d = (const float *)(const void *)(p + l.d);
    v.s = (const int16_t *)(const void *)(p + l.s);
    v.c = dsib_act_block(fmt) == 32 ? (const int32_t *)(const void *)(p + l.c) : NULL;
    v.e = dsib_act_block(fmt) == 32 ? (const float *)(const void *)(p + l.e) : NULL;
    return v;
}

/* ---- scalar (the definition) ----------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round to nearest, ties to even, for |v| < 2^30, independent of the rounding mode. */
static int32_t rne_i32(float v) {
    int32_t i = (int32_t)v; /* toward zero */
    const float f = v - (float)i; /* exact */
    if (f > 0.5f || (f == 0.5f && (i & 1))) i++;
    else if (f < -0.5f || (f == -0.5f && (i & 1))) i--;
    return i;
}

#define ACT_TINY 0x1p-96f

/* Scale and inverse scale of a block from its amax bit pattern; returns 0 if q must be 0. */
static int block_scale(uint32_t amax_bits, float *d, float *id) {
    if (amax_bits >= 0x7f800000u) {
        *d = dsib_u32_as_f32(0x7fc00000u);
        return 0;
    }
    const float amax = dsib_u32_as_f32(amax_bits);
    if (amax < ACT_TINY) {
        *d = 0.0f;
        return 0;
    }
    *d = amax / 127.0f;
    *id = 127.0f / amax;
    return 1;
}

/* A block quantiser: one block of B (32 or 256) natural elements → q in natural order at
 * nat, the sums at s16 (one for B = 32, sixteen per 16 for B = 256), for B = 32 the lane
 * corrections at c; returns d. One per ISA, all writing the same values. */
typedef float (*block_fn)(const float *x, int B, int8_t *nat, int16_t *s16, int32_t *c);

static float quant_block_scalar(const float *x, int B, int8_t *q, int16_t *s16, int32_t *c) {
    uint32_t mx = 0;
    for (int i = 0; i < B; i++) {
        const uint32_t a = f32_bits(x[i]) & 0x7fffffffu;
        mx = a > mx ? a : mx;
    }
    float d, id;
    if (!block_scale(mx, &d, &id)) {
        memset(q, 0, B == 32 ? 32 : 256);
    } else {
        for (int i = 0; i < B; i++) {
            int32_t v = rne_i32(x[i] * id);
            q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
    const int S = B == 32 ? 32 : 16;
    for (int g = 0; g < B / S; g++) {
        int32_t sum = 0;
        for (int i = 0; i < S; i++) sum += q[S * g + i];
        s16[g] = (int16_t)sum;
    }
    for (int j = 0; c && j < 8; j++) c[j] = -128 * (q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
    return d;
}

/* Rows of the format with one ISA's block quantiser. */
static void act_rows(block_fn qb, int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                     int64_t n_tok, void *act, size_t act_stride) {
    const int B = (int)dsib_act_block(fmt);
    const uint8_t *perm = dsib_act_perm(fmt);
    int8_t nat[256];
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xr = x + t * xs;
        act_out o = act_row_ptrs(fmt, (uint8_t *)act + (size_t)t * act_stride, n_in);
        for (int64_t b = 0; b < n_in / B; b++) {
            if (B == 32) {
                o.d[b] = qb(xr + 32 * b, 32, o.q + 32 * b, o.s + b, o.c + 8 * b);
                continue;
            }
            o.d[b] = qb(xr + 256 * b, 256, perm ? nat : o.q + 256 * b, o.s + 16 * b, NULL);
            if (perm)
                for (int p = 0; p < 8; p++) memcpy(o.q + 256 * b + 32 * p, nat + 32 * perm[p], 32);
        }
        if (B == 32) act_pair_scales(o, n_in / 32);
    }
}

void dsib_act_quantize_scalar(int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                              int64_t n_tok, void *act, size_t act_stride) {
    act_rows(quant_block_scalar, fmt, x, xs, n_in, n_tok, act, act_stride);
}

#ifdef DSIB_KERN_X86
#include <immintrin.h>

/* ---- AVX2 ------------------------------------------------------------------------------------ */
DSIB_TARGET_PUSH(DSIB_TGT_AVX2)

DSIB_AI int32_t hsum_epi32_avx2(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* c[j] = -128 · Σ_{k<4} q[4j+k] for the 32 values at q (the Q8_32 lane corrections). */
DSIB_AI void lane_corr_avx2(const int8_t *q, int32_t *c) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8((char)0x80),
                                           _mm256_loadu_si256((const __m256i *)q));
    _mm256_storeu_si256((__m256i *)c, _mm256_madd_epi16(p, _mm256_set1_epi16(-1)));
}

static float quant_block_avx2_q(const float *x, int B, int8_t *nat, int16_t *s16) {
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    __m256i mx = _mm256_setzero_si256();
    for (int i = 0; i < B; i += 8)
        mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), absm));
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    float d, id;
    if (!block_scale((uint32_t)_mm_cvtsi128_si32(m), &d, &id)) {
        memset(nat, 0, (size_t)B);
        for (int g = 0; g < (B == 32 ? 1 : B / 16); g++) s16[g] = 0;
        return d;
    }
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    __m256i bsum = _mm256_setzero_si256();
    for (int i = 0; i < B; i += 16) {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * h), vid);
            const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[h] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(r), lim), nlim);
        }
        const __m256i s = _mm256_add_epi32(q[0], q[1]);
        if (B == 32) bsum = _mm256_add_epi32(bsum, s);
        else s16[i / 16] = (int16_t)hsum_epi32_avx2(s);
        /* 16 int32 → 16 int8 in order */
        __m256i p16 = _mm256_packs_epi32(q[0], q[1]);          /* lanes interleaved */
        p16 = _mm256_permute4x64_epi64(p16, 0xD8);              /* 0..7, 8..15 */
        __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
        _mm_storeu_si128((__m128i *)(nat + i), p8);
    }
    if (B == 32) s16[0] = (int16_t)hsum_epi32_avx2(bsum);
    return d;
}

/* block_fn of this path */
static float quant_block_avx2(const float *x, int B, int8_t *nat, int16_t *s16, int32_t *c) {
    const float d = quant_block_avx2_q(x, B, nat, s16);
    if (c) lane_corr_avx2(nat, c);
    return d;
}

void dsib_act_quantize_avx2(int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                            int64_t n_tok, void *act, size_t act_stride) {
    act_rows(quant_block_avx2, fmt, x, xs, n_in, n_tok, act, act_stride);
}

DSIB_TARGET_POP

/* ---- AVX-512 --------------------------------------------------------------------------------- */
DSIB_TARGET_PUSH(DSIB_TGT_AVX512)

static float quant_block_avx512_q(const float *x, int B, int8_t *nat, int16_t *s16) {
    const __m512i absm = _mm512_set1_epi32(0x7fffffff);
    __m512i mx = _mm512_setzero_si512();
    for (int i = 0; i < B; i += 16)
        mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_loadu_si512(x + i), absm));
    float d, id;
    if (!block_scale((uint32_t)_mm512_reduce_max_epu32(mx), &d, &id)) {
        memset(nat, 0, (size_t)B);
        for (int g = 0; g < (B == 32 ? 1 : B / 16); g++) s16[g] = 0;
        return d;
    }
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    __m512i bsum = _mm512_setzero_si512(), prev = bsum, l1[8];
    for (int i = 0; i < B; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vid);
        __m512i q = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_max_epi32(_mm512_min_epi32(q, lim), nlim);
        _mm_storeu_si128((__m128i *)(nat + i), _mm512_cvtsepi32_epi8(q));
        if (B == 32) {
            bsum = _mm512_add_epi32(bsum, q);
        } else if ((i / 16) & 1) { /* the 16 sums per 16: pairwise transpose-and-add */
            l1[i / 32] = _mm512_add_epi32(_mm512_unpacklo_epi32(prev, q), _mm512_unpackhi_epi32(prev, q));
        } else {
            prev = q;
        }
    }
    if (B == 32) {
        s16[0] = (int16_t)_mm512_reduce_add_epi32(bsum);
        return d;
    }
    __m512i u[4];
    for (int k = 0; k < 4; k++) /* each 128-bit lane: partial sums of groups 4k..4k+3 */
        u[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(l1[2 * k], l1[2 * k + 1]),
                                _mm512_unpackhi_epi64(l1[2 * k], l1[2 * k + 1]));
    const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x44),
                                         _mm512_shuffle_i32x4(u[0], u[1], 0xEE));
    const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x44),
                                         _mm512_shuffle_i32x4(u[2], u[3], 0xEE));
    const __m512i r = _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88),
                                       _mm512_shuffle_i32x4(s01, s23, 0xDD));
    _mm256_storeu_si256((__m256i *)s16, _mm512_cvtepi32_epi16(r));
    return d;
}

/* block_fn of this path */
static float quant_block_avx512(const float *x, int B, int8_t *nat, int16_t *s16, int32_t *c) {
    const float d = quant_block_avx512_q(x, B, nat, s16);
    if (c) lane_corr_avx2(nat, c);
    return d;
}

void dsib_act_quantize_avx512(int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                              int64_t n_tok, void *act, size_t act_stride) {
    act_rows(quant_block_avx512, fmt, x, xs, n_in, n_tok, act, act_stride);
}

DSIB_TARGET_POP
#endif /* DSIB_KERN_X86 */
