/*
 * SIMD row kernels of the further ggml weight types (kernels_ggml.h), written once and
 * compiled twice: kernels_ggml_avx2.c (VW = 8, 256-bit FMA) and kernels_ggml_avx512.c
 * (VW = 16, 512-bit FMA), each under its own target pragma. Included only by those files,
 * which define VW, KG_ROWS (the exported function name) and the vector macros below.
 *
 * Decoding: one block at a time into f32 with AVX2 integer / shuffle operations. Every
 * weight value is computed with the same float operations, in the same order, as
 * lib/quant/quant_ggml.c (products of small integers and f16 scales, an explicit multiply
 * and add where the reference has one — never a fused multiply-add), so the decoded values
 * are bit-identical to the scalar path's and to llama.cpp's.
 *
 * Dot products, per token (model-spec §10.4: one fixed operation sequence per (type, n_in,
 * ISA), independent of the number of tokens or rows): the row is walked in chunks of at most
 * 256 elements; element vector v (VW elements, v counted from the start of the row) is
 * accumulated as acc[v % 4] = fma(w_v, x_v, acc[v % 4]); the result is
 * (acc0 + acc1) + (acc2 + acc3), reduced lane-wise by halves (VW → … → 1). Tokens are
 * processed in groups of KG_TOK sharing each decoded chunk.
 */

#include <immintrin.h>
#include <string.h>

#include "quant/fp.h"
#include "quant/ggml_tables.h"

#define AI static inline __attribute__((always_inline))
#define KG_TOK 16

static inline uint16_t kg_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
AI float kg_h2f(const uint8_t *p) { return _cvtsh_ss(kg_ld16(p)); }

/* 8 unsigned / signed bytes → 8 floats (exact) */
AI __m256 kg_u8x8(uint64_t bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes)));
}
AI __m256 kg_s8x8(uint64_t bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128((long long)bytes)));
}
/* negates lane j where bit j of s is set (exactly v * -1) */
AI __m256 kg_sign8(__m256 v, unsigned s) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)s), bit), bit);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(m, 31)));
}
/* lanes j where bit (j0 + j) of m is set → `val`, else 0 (int32 lanes) */
AI __m256i kg_bits8(uint32_t m, int j0, int val) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i hit = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)((m >> j0) & 0xFF)), bit), bit);
    return _mm256_and_si256(hit, _mm256_set1_epi32(val));
}
AI __m256i kg_ld8u(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* ---- 32-element legacy blocks ---------------------------------------------------------- */

/* nibbles of qs[0..16): j < 16 low, j >= 16 high, as int32 lanes for elements j0..j0+7 */
AI __m256i kg_nib8(const uint8_t *qs, int j0) {
    const __m256i q = kg_ld8u(qs + (j0 & 15));
    return j0 < 16 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
}

AI void kg_dec_q4_0(const uint8_t *b, float *y) {
    const __m256 d = _mm256_set1_ps(kg_h2f(b));
    for (int j0 = 0; j0 < 32; j0 += 8) {
        const __m256i q = _mm256_sub_epi32(kg_nib8(b + 2, j0), _mm256_set1_epi32(8));
        _mm256_storeu_ps(y + j0, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }
}
AI void kg_dec_q4_1(const uint8_t *b, float *y) {
    const __m256 d = _mm256_set1_ps(kg_h2f(b)), m = _mm256_set1_ps(kg_h2f(b + 2));
    for (int j0 = 0; j0 < 32; j0 += 8)
        _mm256_storeu_ps(y + j0, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(kg_nib8(b + 4, j0)), d), m));
}
AI void kg_dec_q5_0(const uint8_t *b, float *y) {
    const __m256 d = _mm256_set1_ps(kg_h2f(b));
    const uint32_t qh = dsib_ld32(b + 2);
    for (int j0 = 0; j0 < 32; j0 += 8) {
        __m256i q = _mm256_or_si256(kg_nib8(b + 6, j0), kg_bits8(qh, j0, 16));
        q = _mm256_sub_epi32(q, _mm256_set1_epi32(16));
        _mm256_storeu_ps(y + j0, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
    }
}
AI void kg_dec_q5_1(const uint8_t *b, float *y) {
    const __m256 d = _mm256_set1_ps(kg_h2f(b)), m = _mm256_set1_ps(kg_h2f(b + 2));
    const uint32_t qh = dsib_ld32(b + 4);
    for (int j0 = 0; j0 < 32; j0 += 8) {
        const __m256i q = _mm256_or_si256(kg_nib8(b + 8, j0), kg_bits8(qh, j0, 16));
        _mm256_storeu_ps(y + j0, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m));
    }
}
/* IQ4_NL codebook lookup of 16 bytes of nibbles: y[0..16) low nibbles, y[16..32) high */
AI void kg_kv32(const uint8_t *qs, float dl, float *y) {
    const __m128i tbl = _mm_loadu_si128((const __m128i *)dsii_kvalues_iq4nl);
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
    const __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    const __m256 d = _mm256_set1_ps(dl);
    _mm256_storeu_ps(y, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}
AI void kg_dec_iq4_nl(const uint8_t *b, float *y) { kg_kv32(b + 2, kg_h2f(b), y); }

/* ---- 256-element blocks ------------------------------------------------------------------ */

AI void kg_dec_iq4_xs(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    const uint16_t sh = kg_ld16(b + 2);
    for (int s = 0; s < 8; s++) {
        const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
        kg_kv32(b + 8 + 16 * s, d * (float)(ls - 32), y + 32 * s);
    }
}

AI int kg_q3k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;
    const int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}
AI void kg_dec_q3_k(const uint8_t *b, float *y) {
    const float d = kg_h2f(b + 108);
    const __m256i three = _mm256_set1_epi32(3), four = _mm256_set1_epi32(4), zero = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l0 = 0; l0 < 32; l0 += 8) {
                const int e0 = 128 * h + 32 * j + l0;
                const __m256 dl = _mm256_set1_ps(d * (float)kg_q3k_scale(b + 96, e0 >> 4));
                __m256i q = _mm256_and_si256(_mm256_srli_epi32(kg_ld8u(b + 32 + 32 * h + l0), 2 * j), three);
                const __m256i hm = _mm256_and_si256(kg_ld8u(b + l0), _mm256_set1_epi32(1 << (4 * h + j)));
                q = _mm256_sub_epi32(q, _mm256_and_si256(_mm256_cmpeq_epi32(hm, zero), four));
                _mm256_storeu_ps(y + e0, _mm256_mul_ps(dl, _mm256_cvtepi32_ps(q)));
            }
}

AI void kg_k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
AI void kg_dec_q5_k(const uint8_t *b, float *y) {
    const float d = kg_h2f(b), dmin = kg_h2f(b + 2);
    for (int c = 0; c < 4; c++)
        for (int u = 0; u < 2; u++) {
            int s, m;
            kg_k4_scale_min(2 * c + u, b + 4, &s, &m);
            const __m256 d1 = _mm256_set1_ps(d * (float)s), m1 = _mm256_set1_ps(dmin * (float)m);
            for (int l0 = 0; l0 < 32; l0 += 8) {
                __m256i q = kg_ld8u(b + 48 + 32 * c + l0);
                q = u ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(15));
                const __m256i hb = _mm256_and_si256(kg_ld8u(b + 16 + l0), _mm256_set1_epi32(1 << (2 * c + u)));
                q = _mm256_add_epi32(q, _mm256_andnot_si256(_mm256_cmpeq_epi32(hb, _mm256_setzero_si256()),
                                                            _mm256_set1_epi32(16)));
                _mm256_storeu_ps(y + 64 * c + 32 * u + l0,
                                 _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q)), m1));
            }
        }
}

AI void kg_dec_q6_k(const uint8_t *b, float *y) {
    const float d = kg_h2f(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l0 = 0; l0 < 32; l0 += 8) {
                const int e0 = 128 * h + 32 * k + l0;
                const __m256 ds = _mm256_set1_ps(d * (float)sc[e0 >> 4]);
                __m256i lo = kg_ld8u(b + 64 * h + 32 * (k & 1) + l0);
                lo = (k >> 1) ? _mm256_srli_epi32(lo, 4) : _mm256_and_si256(lo, _mm256_set1_epi32(15));
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(kg_ld8u(b + 128 + 32 * h + l0), 2 * k),
                                                    _mm256_set1_epi32(3));
                const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
                _mm256_storeu_ps(y + e0, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q)));
            }
}

AI void kg_dec_iq2_xxs(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint8_t *q = b + 2 + 8 * s;
        const uint32_t w = dsib_ld32(q + 4);
        const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.25f);
        for (int l = 0; l < 4; l++)
            _mm256_storeu_ps(y + 32 * s + 8 * l, kg_sign8(_mm256_mul_ps(db, kg_u8x8(dsii_iq2xxs_grid[q[l]])),
                                                          dsii_ksigns_iq2xs[(w >> (7 * l)) & 127]));
    }
}
AI void kg_dec_iq2_xs(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint8_t sc = b[66 + s];
        const __m256 db0 = _mm256_set1_ps(d * (0.5f + (float)(sc & 0xF)) * 0.25f);
        const __m256 db1 = _mm256_set1_ps(d * (0.5f + (float)(sc >> 4)) * 0.25f);
        for (int l = 0; l < 4; l++) {
            const uint16_t q = kg_ld16(b + 2 + 2 * (4 * s + l));
            _mm256_storeu_ps(y + 32 * s + 8 * l, kg_sign8(_mm256_mul_ps(l < 2 ? db0 : db1, kg_u8x8(dsii_iq2xs_grid[q & 511])),
                                                          dsii_ksigns_iq2xs[q >> 9]));
        }
    }
}
AI void kg_dec_iq2_s(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint8_t sc = b[74 + s], qh = b[66 + s];
        const __m256 db0 = _mm256_set1_ps(d * (0.5f + (float)(sc & 0xF)) * 0.25f);
        const __m256 db1 = _mm256_set1_ps(d * (0.5f + (float)(sc >> 4)) * 0.25f);
        for (int l = 0; l < 4; l++) {
            const int idx = b[2 + 4 * s + l] | (((qh >> (2 * l)) & 3) << 8);
            _mm256_storeu_ps(y + 32 * s + 8 * l,
                             kg_sign8(_mm256_mul_ps(l < 2 ? db0 : db1, kg_u8x8(dsii_iq2s_grid[idx])), b[34 + 4 * s + l]));
        }
    }
}
AI void kg_dec_iq3_xxs(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint32_t w = dsib_ld32(b + 66 + 4 * s);
        const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.5f);
        for (int l = 0; l < 4; l++) {
            const uint64_t g = dsii_iq3xxs_grid[b[2 + 8 * s + 2 * l]] |
                               ((uint64_t)dsii_iq3xxs_grid[b[2 + 8 * s + 2 * l + 1]] << 32);
            _mm256_storeu_ps(y + 32 * s + 8 * l,
                             kg_sign8(_mm256_mul_ps(db, kg_u8x8(g)), dsii_ksigns_iq2xs[(w >> (7 * l)) & 127]));
        }
    }
}
AI void kg_dec_iq3_s(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    for (int s = 0; s < 8; s++) {
        const int sc = (b[106 + s / 2] >> (4 * (s & 1))) & 0xF;
        const __m256 db = _mm256_set1_ps(d * (float)(1 + 2 * sc));
        const uint8_t qh = b[66 + s];
        for (int l = 0; l < 4; l++) {
            const int i1 = b[2 + 8 * s + 2 * l] | (((qh >> (2 * l)) & 1) << 8);
            const int i2 = b[2 + 8 * s + 2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
            const uint64_t g = dsii_iq3s_grid[i1] | ((uint64_t)dsii_iq3s_grid[i2] << 32);
            _mm256_storeu_ps(y + 32 * s + 8 * l, kg_sign8(_mm256_mul_ps(db, kg_u8x8(g)), b[74 + 4 * s + l]));
        }
    }
}
AI void kg_dec_iq1_s(const uint8_t *b, float *y) {
    const float d = kg_h2f(b);
    for (int s = 0; s < 8; s++) {
        const uint16_t qh = kg_ld16(b + 34 + 2 * s);
        const __m256 dl = _mm256_set1_ps(d * (float)(2 * ((qh >> 12) & 7) + 1));
        const __m256 delta = _mm256_set1_ps(qh & 0x8000 ? -0.125f : 0.125f);
        for (int l = 0; l < 4; l++) {
            const uint64_t g = dsii_iq1s_grid[b[2 + 4 * s + l] | (((qh >> (3 * l)) & 7) << 8)];
            _mm256_storeu_ps(y + 32 * s + 8 * l, _mm256_mul_ps(dl, _mm256_add_ps(kg_s8x8(g), delta)));
        }
    }
}
AI void kg_dec_iq1_m(const uint8_t *b, float *y) {
    uint16_t sc[4];
    for (int k = 0; k < 4; k++) sc[k] = kg_ld16(b + 48 + 2 * k);
    const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                                   (sc[3] & 0xF000));
    const float d = _cvtsh_ss(dh);
    for (int s = 0; s < 8; s++) {
        const float dl1 = d * (float)(2 * ((sc[s / 2] >> (6 * (s % 2))) & 7) + 1);
        const float dl2 = d * (float)(2 * ((sc[s / 2] >> (6 * (s % 2) + 3)) & 7) + 1);
        for (int l = 0; l < 4; l++) {
            const uint8_t h = b[32 + 2 * s + l / 2];
            const int sh = 4 * (l & 1);
            const uint64_t g = dsii_iq1s_grid[b[4 * s + l] | (((h >> sh) & 7) << 8)];
            const __m256 delta = _mm256_set1_ps((h >> sh) & 8 ? -0.125f : 0.125f);
            _mm256_storeu_ps(y + 32 * s + 8 * l,
                             _mm256_mul_ps(_mm256_set1_ps(l < 2 ? dl1 : dl2), _mm256_add_ps(kg_s8x8(g), delta)));
        }
    }
}

/* ---- dispatch by type ---------------------------------------------------------------------- */

typedef void (*kg_dec_fn)(const uint8_t *blk, float *y);
typedef struct kg_type {
    int32_t type;
    int blck, bytes;
    kg_dec_fn dec;
} kg_type;

static void kg_q4_0(const uint8_t *b, float *y) { kg_dec_q4_0(b, y); }
static void kg_q4_1(const uint8_t *b, float *y) { kg_dec_q4_1(b, y); }
static void kg_q5_0(const uint8_t *b, float *y) { kg_dec_q5_0(b, y); }
static void kg_q5_1(const uint8_t *b, float *y) { kg_dec_q5_1(b, y); }
static void kg_q3_k(const uint8_t *b, float *y) { kg_dec_q3_k(b, y); }
static void kg_q5_k(const uint8_t *b, float *y) { kg_dec_q5_k(b, y); }
static void kg_q6_k(const uint8_t *b, float *y) { kg_dec_q6_k(b, y); }
static void kg_iq4_nl(const uint8_t *b, float *y) { kg_dec_iq4_nl(b, y); }
static void kg_iq4_xs(const uint8_t *b, float *y) { kg_dec_iq4_xs(b, y); }
static void kg_iq3_xxs(const uint8_t *b, float *y) { kg_dec_iq3_xxs(b, y); }
static void kg_iq3_s(const uint8_t *b, float *y) { kg_dec_iq3_s(b, y); }
static void kg_iq2_xxs(const uint8_t *b, float *y) { kg_dec_iq2_xxs(b, y); }
static void kg_iq2_xs(const uint8_t *b, float *y) { kg_dec_iq2_xs(b, y); }
static void kg_iq2_s(const uint8_t *b, float *y) { kg_dec_iq2_s(b, y); }
static void kg_iq1_s(const uint8_t *b, float *y) { kg_dec_iq1_s(b, y); }
static void kg_iq1_m(const uint8_t *b, float *y) { kg_dec_iq1_m(b, y); }

static const kg_type kg_types[] = {
    {2, 32, 18, kg_q4_0},        {3, 32, 20, kg_q4_1},       {6, 32, 22, kg_q5_0},
    {7, 32, 24, kg_q5_1},        {11, 256, 110, kg_q3_k},    {13, 256, 176, kg_q5_k},
    {14, 256, 210, kg_q6_k},     {20, 32, 18, kg_iq4_nl},    {23, 256, 136, kg_iq4_xs},
    {18, 256, 98, kg_iq3_xxs},   {21, 256, 110, kg_iq3_s},   {16, 256, 66, kg_iq2_xxs},
    {17, 256, 74, kg_iq2_xs},    {22, 256, 82, kg_iq2_s},    {19, 256, 50, kg_iq1_s},
    {29, 256, 56, kg_iq1_m},
};

/* ---- rows ------------------------------------------------------------------------------------ */

int KG_ROWS(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in, int64_t o0,
            int64_t o1, const float *const *xp, float *const *yp, int n) {
    const kg_type *t = NULL;
    for (size_t i = 0; i < sizeof kg_types / sizeof kg_types[0]; i++)
        if (kg_types[i].type == type) t = &kg_types[i];
    if (!t) return 0;
    float buf[256] __attribute__((aligned(64)));
    VEC acc[KG_TOK][4];
    for (int t0 = 0; t0 < n; t0 += KG_TOK) {
        const int T = n - t0 < KG_TOK ? n - t0 : KG_TOK;
        for (int64_t o = o0; o < o1; o++) {
            const uint8_t *row = w + (size_t)o * w_row_bytes;
            for (int tt = 0; tt < T; tt++)
                for (int k = 0; k < 4; k++) acc[tt][k] = VZERO();
            for (int64_t i0 = 0; i0 < n_in; i0 += 256) {
                const int64_t m = n_in - i0 < 256 ? n_in - i0 : 256; /* multiple of 32 */
                for (int64_t j = 0; j < m; j += t->blck)
                    t->dec(row + (size_t)((i0 + j) / t->blck) * (size_t)t->bytes, buf + j);
                for (int tt = 0; tt < T; tt++) {
                    const float *x = xp[t0 + tt] + i0;
                    for (int64_t v = 0; v < m / VW; v++)
                        acc[tt][v & 3] = VFMA(VLOAD(buf + VW * v), VLOADU(x + VW * v), acc[tt][v & 3]);
                }
            }
            for (int tt = 0; tt < T; tt++)
                yp[t0 + tt][o] = VHSUM(VADD(VADD(acc[tt][0], acc[tt][1]), VADD(acc[tt][2], acc[tt][3])));
        }
    }
    return 1;
}
