/*
 * AVX2 + FMA + F16C row kernels (selected at run time, compiled per function for that
 * target so the library runs on any x86-64).
 *
 * Per-token operation order (fixed for a given type and n_in, for every tile size T = 1..2,
 * model-spec §10.4): four 8-lane accumulators acc[0..3] per token;
 *   F32/F16/BF16  element vector v (8 elements) → acc[v % 4] += w*x (FMA); masked tail.
 *   Q8_0          block b: p0 = q0*x0, p1 = q1*x1, p0 = fma(q2,x2,p0), p1 = fma(q3,x3,p1);
 *                 acc[b % 4] = fma(d, p0 + p1, acc).
 *   Q4_K          64-element chunk, byte group u (8 bytes): low nibbles then high nibbles
 *                 → acc[u]; w = fmsub(d*sc, q, dmin*m) (same value as the scalar path).
 *   Q2_K          32-element group s, byte group g (8 bytes) → acc[g].
 *   MXFP4         block b: p0/p1 as Q8_0 over the 4 vectors, acc[b % 4] = fma(s, p0+p1, acc).
 *   FP8 B128/B32  block b: even/odd vectors into p0/p1 (mul then fma), acc[b % 4] =
 *                 fma(scale, p0 + p1, acc); the partial last block is zero-padded.
 * Result: (acc0 + acc1) + (acc2 + acc3), then 8 → 4 → 2 → 1 lanes by pairwise halves.
 */
#include "backends/cpu/kernels/kernels_impl.h"
#include "backends/cpu/kernels/kernels_ggml.h"

#ifdef DSIB_KERN_X86

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define AI static inline __attribute__((always_inline))
#define TMAX 2
#define UNR _Pragma("GCC unroll 16")

typedef void (*dotfn)(const uint8_t *w, int64_t n, const float *const *xp, float *out);

AI float hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

AI float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AI __m256i tail_mask8(int64_t r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(r > 8 ? 8 : r)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AI __m256 ld8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
AI __m256i ldu8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

#define ACC_DECL                                                                          \
    __m256 acc[TMAX][4];                                                                  \
    UNR for (int t = 0; t < T; t++) UNR for (int k = 0; k < 4; k++) acc[t][k] =           \
        _mm256_setzero_ps();
#define ACC_OUT UNR for (int t = 0; t < T; t++) out[t] = hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);

/* ---- F32 / F16 / BF16 ------------------------------------------------------------------ */

AI __m256 w_f32(const uint8_t *w, int64_t i) { return _mm256_loadu_ps((const float *)w + i); }
AI __m256 w_f16(const uint8_t *w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
}
AI __m256 w_bf16(const uint8_t *w, int64_t i) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Tail (< 8 elements): the weight is copied into a zero-padded vector; x is masked. */
AI __m256 w_tail(int32_t type, const uint8_t *w, int64_t i, int64_t r) {
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < r; j++) {
        uint16_t h;
        if (type == DSI_TYPE_F32) {
            memcpy(&tmp[j], w + 4 * (i + j), 4);
            continue;
        }
        memcpy(&h, w + 2 * (i + j), 2);
        tmp[j] = type == DSI_TYPE_F16 ? _cvtsh_ss(h) : dsib_bf16_to_f32(h);
    }
    return _mm256_loadu_ps(tmp);
}

#define DEF_PLAIN(NAME, LD, TYPE)                                                          \
    AI void NAME(const uint8_t *w, int64_t n, const float *const *xp, float *out,         \
                 const int T) {                                                            \
        ACC_DECL                                                                           \
        int64_t i = 0;                                                                     \
        for (; i + 32 <= n; i += 32) {                                                     \
            DSIB_PF((T) == 1, w + (TYPE == DSI_TYPE_F32 ? 4 : 2) * i, 32 * (TYPE == DSI_TYPE_F32 ? 4 : 2)); \
            UNR for (int k = 0; k < 4; k++) {                                              \
                __m256 wv = LD(w, i + 8 * k);                                              \
                UNR for (int t = 0; t < T; t++) acc[t][k] = _mm256_fmadd_ps(               \
                    wv, _mm256_loadu_ps(xp[t] + i + 8 * k), acc[t][k]);                    \
            }                                                                              \
        }                                                                                  \
        UNR for (int k = 0; k < 4; k++) {                                                  \
            int64_t r = n - i - 8 * k;                                                     \
            if (r <= 0) break;                                                             \
            if (r >= 8) {                                                                  \
                __m256 wv = LD(w, i + 8 * k);                                              \
                UNR for (int t = 0; t < T; t++) acc[t][k] = _mm256_fmadd_ps(               \
                    wv, _mm256_loadu_ps(xp[t] + i + 8 * k), acc[t][k]);                    \
            } else {                                                                       \
                __m256i m = tail_mask8(r);                                                 \
                __m256 wv = w_tail(TYPE, w, i + 8 * k, r);                                 \
                UNR for (int t = 0; t < T; t++) acc[t][k] = _mm256_fmadd_ps(               \
                    wv, _mm256_maskload_ps(xp[t] + i + 8 * k, m), acc[t][k]);              \
            }                                                                              \
        }                                                                                  \
        ACC_OUT                                                                            \
    }

DEF_PLAIN(dot_f32, w_f32, DSI_TYPE_F32)
DEF_PLAIN(dot_f16, w_f16, DSI_TYPE_F16)
DEF_PLAIN(dot_bf16, w_bf16, DSI_TYPE_BF16)

/* ---- Q8_0 ------------------------------------------------------------------------------ */

AI void dot_q8_0(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                 const int T) {
    ACC_DECL
    const int64_t nb = n / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        UNR for (int k = 0; k < 4; k++) {
            const int64_t b = b0 + k;
            if (b >= nb) break;
            const uint8_t *blk = w + b * 34;
            const __m256 d = _mm256_set1_ps(ld_f16(blk));
            const __m256 q0 = ld8(blk + 2), q1 = ld8(blk + 10), q2 = ld8(blk + 18),
                         q3 = ld8(blk + 26);
            UNR for (int t = 0; t < T; t++) {
                const float *x = xp[t] + 32 * b;
                __m256 p0 = _mm256_mul_ps(q0, _mm256_loadu_ps(x));
                __m256 p1 = _mm256_mul_ps(q1, _mm256_loadu_ps(x + 8));
                p0 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x + 16), p0);
                p1 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(x + 24), p1);
                acc[t][k] = _mm256_fmadd_ps(d, _mm256_add_ps(p0, p1), acc[t][k]);
            }
        }
    }
    ACC_OUT
}

/* ---- Q4_K ------------------------------------------------------------------------------ */

AI void dot_q4_k(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                 const int T) {
    ACC_DECL
    const __m256i m15 = _mm256_set1_epi32(15);
    const int64_t nb = n / 256;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 144;
        const uint8_t *q = blk + 16;
        /* dl[j] = d * sc_j, ml[j] = dmin * m_j (exact products), all 8 sub-blocks at once */
        uint8_t sm[16];
        dsib_q4k_unpack_scales(blk + 4, sm);
        float dm[16];
        _mm256_storeu_ps(dm, _mm256_mul_ps(_mm256_cvtepi32_ps(ldu8(sm)), _mm256_set1_ps(ld_f16(blk))));
        _mm256_storeu_ps(dm + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(ldu8(sm + 8)),
                                               _mm256_set1_ps(ld_f16(blk + 2))));
        __asm__ volatile("" ::: "memory"); /* broadcast from memory, not by shuffles */
        UNR for (int c = 0; c < 4; c++) {
            const __m256 dl0 = _mm256_set1_ps(dm[2 * c]), ml0 = _mm256_set1_ps(dm[8 + 2 * c]);
            const __m256 dl1 = _mm256_set1_ps(dm[2 * c + 1]), ml1 = _mm256_set1_ps(dm[9 + 2 * c]);
            UNR for (int u = 0; u < 4; u++) {
                const __m256i i = ldu8(q + 32 * c + 8 * u);
                const __m256 lo = _mm256_fmsub_ps(dl0, _mm256_cvtepi32_ps(_mm256_and_si256(i, m15)), ml0);
                const __m256 hi = _mm256_fmsub_ps(dl1, _mm256_cvtepi32_ps(_mm256_srli_epi32(i, 4)), ml1);
                UNR for (int t = 0; t < T; t++) {
                    const float *x = xp[t] + 256 * b + 64 * c + 8 * u;
                    acc[t][u] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), acc[t][u]);
                    acc[t][u] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 32), acc[t][u]);
                }
            }
        }
    }
    ACC_OUT
}

/* ---- Q2_K ------------------------------------------------------------------------------ */

AI void dot_q2_k(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                 const int T) {
    ACC_DECL
    const __m256i three = _mm256_set1_epi32(3);
    const int64_t nb = n / 256;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 84;
        /* dl[j] = d * (sc_j & 15), ml[j] = dmin * (sc_j >> 4), all 16 sub-blocks at once */
        float dl[16], ml[16];
        {
            const __m256 d = _mm256_set1_ps(ld_f16(blk + 80)), dmin = _mm256_set1_ps(ld_f16(blk + 82));
            const __m256i m15 = _mm256_set1_epi32(15);
            UNR for (int hh = 0; hh < 2; hh++) {
                const __m256i sc = ldu8(blk + 8 * hh);
                _mm256_storeu_ps(dl + 8 * hh, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(sc, m15)), d));
                _mm256_storeu_ps(ml + 8 * hh, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(sc, 4)), dmin));
            }
        }
        __asm__ volatile("" ::: "memory");
        UNR for (int h = 0; h < 2; h++) {
            const uint8_t *q = blk + 16 + 32 * h;
            __m256i ig[4];
            UNR for (int g = 0; g < 4; g++) ig[g] = ldu8(q + 8 * g);
            UNR for (int s = 0; s < 4; s++) {
                const int is = 8 * h + 2 * s;
                const __m256 dla = _mm256_set1_ps(dl[is]), mla = _mm256_set1_ps(ml[is]);
                const __m256 dlb = _mm256_set1_ps(dl[is + 1]), mlb = _mm256_set1_ps(ml[is + 1]);
                UNR for (int g = 0; g < 4; g++) {
                    const __m256 qf = _mm256_cvtepi32_ps(_mm256_and_si256(ig[g], three));
                    const __m256 wv = g < 2 ? _mm256_fmsub_ps(dla, qf, mla)
                                            : _mm256_fmsub_ps(dlb, qf, mlb);
                    ig[g] = _mm256_srli_epi32(ig[g], 2);
                    UNR for (int t = 0; t < T; t++) {
                        const float *x = xp[t] + 256 * b + 128 * h + 32 * s + 8 * g;
                        acc[t][g] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[t][g]);
                    }
                }
            }
        }
    }
    ACC_OUT
}

/* ---- MXFP4 ----------------------------------------------------------------------------- */

AI __m256 e2m1x8(__m256i nib, __m256 mag) {
    /* low 3 bits → magnitude (vpermps uses them), bit 3 → sign */
    __m256 v = _mm256_permutevar8x32_ps(mag, nib);
    __m256i sg = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(sg));
}

AI void dot_mxfp4(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                  const int T) {
    ACC_DECL
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i m15 = _mm256_set1_epi32(15);
    const int64_t nb = n / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        UNR for (int k = 0; k < 4; k++) {
            const int64_t b = b0 + k;
            if (b >= nb) break;
            const uint8_t *blk = w + b * 17;
            const __m256 s = _mm256_set1_ps(dsib_e8m0_to_f32(blk[0]));
            const __m256i ia = ldu8(blk + 1), ib = ldu8(blk + 9);
            const __m256 w0 = e2m1x8(_mm256_and_si256(ia, m15), mag);
            const __m256 w1 = e2m1x8(_mm256_and_si256(ib, m15), mag);
            const __m256 w2 = e2m1x8(_mm256_srli_epi32(ia, 4), mag);
            const __m256 w3 = e2m1x8(_mm256_srli_epi32(ib, 4), mag);
            UNR for (int t = 0; t < T; t++) {
                const float *x = xp[t] + 32 * b;
                __m256 p0 = _mm256_mul_ps(w0, _mm256_loadu_ps(x));
                __m256 p1 = _mm256_mul_ps(w1, _mm256_loadu_ps(x + 8));
                p0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16), p0);
                p1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 24), p1);
                acc[t][k] = _mm256_fmadd_ps(s, _mm256_add_ps(p0, p1), acc[t][k]);
            }
        }
    }
    ACC_OUT
}

/* ---- FP8 E4M3 with E8M0 block scales ---------------------------------------------------- */

/* E4M3 → f16 bit patterns worth e4m3 · 2^-8, exactly (see the AVX-512 file): 16 codes →
 * b << 7 with the sign bit moved from 14 to 15; the 2^8 goes into the block scale. */
AI __m256i e4m3x16_f16(__m128i bytes) {
    const __m256i t = _mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 7);
    return _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
}

#define DEF_FP8(NAME, BS)                                                                 \
    AI void NAME(const uint8_t *w, int64_t n, const float *const *xp, float *out,        \
                 const int T) {                                                           \
        ACC_DECL                                                                          \
        const int64_t nb = (n + (BS)-1) / (BS);                                           \
        for (int64_t b0 = 0; b0 < nb; b0 += 4) {                                          \
            UNR for (int k = 0; k < 4; k++) {                                             \
                const int64_t b = b0 + k;                                                 \
                if (b >= nb) break;                                                       \
                const uint8_t *bp = w + b * ((BS) + 1);                                   \
                const __m256 s = _mm256_set1_ps(dsib_e8m0_to_f32(bp[0]) * 256.0f);        \
                const int64_t valid = n - b * (BS) < (BS) ? n - b * (BS) : (BS);          \
                uint8_t pad[BS];                                                          \
                const uint8_t *vals = bp + 1;                                             \
                if (valid < (BS)) {                                                       \
                    memset(pad, 0, sizeof pad);                                           \
                    memcpy(pad, bp + 1, (size_t)valid);                                   \
                    vals = pad;                                                           \
                }                                                                         \
                __m256 p[TMAX][2];                                                        \
                UNR for (int g = 0; g < (BS) / 16; g++) {                                 \
                    const __m256i h = e4m3x16_f16(_mm_loadu_si128((const __m128i *)(vals + 16 * g))); \
                    UNR for (int hh = 0; hh < 2; hh++) {                                  \
                        const int v = 2 * g + hh;                                         \
                        const __m256 wv = _mm256_cvtph_ps(hh ? _mm256_extracti128_si256(h, 1) \
                                                             : _mm256_castsi256_si128(h)); \
                        UNR for (int t = 0; t < T; t++) {                                 \
                            const float *xv = xp[t] + b * (BS) + 8 * v;                   \
                            const __m256 xx = valid == (BS) ? _mm256_loadu_ps(xv)         \
                                                            : _mm256_maskload_ps(         \
                                                                  xv, tail_mask8(valid - 8 * v)); \
                            if (v < 2)                                                    \
                                p[t][v] = _mm256_mul_ps(wv, xx);                          \
                            else                                                          \
                                p[t][v & 1] = _mm256_fmadd_ps(wv, xx, p[t][v & 1]);       \
                        }                                                                 \
                    }                                                                     \
                }                                                                         \
                UNR for (int t = 0; t < T; t++) acc[t][k] =                               \
                    _mm256_fmadd_ps(s, _mm256_add_ps(p[t][0], p[t][1]), acc[t][k]);       \
            }                                                                             \
        }                                                                                 \
        ACC_OUT                                                                           \
    }

DEF_FP8(dot_fp8_b128, 128)
DEF_FP8(dot_fp8_b32, 32)

/* ---- tiles and rows --------------------------------------------------------------------- */

#define SPECIALIZE(NAME)                                                                  \
    static void NAME##_1(const uint8_t *w, int64_t n, const float *const *xp, float *o) { \
        NAME(w, n, xp, o, 1);                                                             \
    }                                                                                     \
    static void NAME##_2(const uint8_t *w, int64_t n, const float *const *xp, float *o) { \
        NAME(w, n, xp, o, 2);                                                             \
    }                                                                                     \
    static const dotfn NAME##_tab[TMAX + 1] = {NULL, NAME##_1, NAME##_2};

SPECIALIZE(dot_f32)
SPECIALIZE(dot_f16)
SPECIALIZE(dot_bf16)
SPECIALIZE(dot_q8_0)
SPECIALIZE(dot_q4_k)
SPECIALIZE(dot_q2_k)
SPECIALIZE(dot_mxfp4)
SPECIALIZE(dot_fp8_b128)
SPECIALIZE(dot_fp8_b32)

int dsib_kern_rows_avx2(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                         int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                         int n) {
    const dotfn *tab;
    switch (type) {
    case DSI_TYPE_F32: tab = dot_f32_tab; break;
    case DSI_TYPE_F16: tab = dot_f16_tab; break;
    case DSI_TYPE_BF16: tab = dot_bf16_tab; break;
    case DSI_TYPE_Q8_0: tab = dot_q8_0_tab; break;
    case DSI_TYPE_Q4_K: tab = dot_q4_k_tab; break;
    case DSI_TYPE_Q2_K: tab = dot_q2_k_tab; break;
    case DSI_TYPE_MXFP4: tab = dot_mxfp4_tab; break;
    case DSI_TYPE_FP8_E4M3_B128: tab = dot_fp8_b128_tab; break;
    case DSI_TYPE_FP8_E4M3_B32: tab = dot_fp8_b32_tab; break;
    default: return dsib_kern_rows_ggml_avx2(type, w, w_row_bytes, n_in, o0, o1, xp, yp, n);
    }
    for (int t0 = 0; t0 < n; t0 += TMAX) {
        const int T = n - t0 < TMAX ? n - t0 : TMAX;
        const dotfn f = tab[T];
        for (int64_t o = o0; o < o1; o++) {
            float out[TMAX];
            f(w + (size_t)o * w_row_bytes, n_in, xp + t0, out);
            for (int t = 0; t < T; t++) yp[t0 + t][o] = out[t];
        }
    }
    return 1;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* DSIB_KERN_X86 */

/* Keeps the translation unit non-empty on other architectures. */
typedef int dsib_kern_avx2_tu;
