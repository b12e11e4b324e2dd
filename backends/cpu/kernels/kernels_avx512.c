/*
 * AVX-512 (F/BW/VL/DQ) row kernels. Compiled for that target function by function, so the
 * library still runs on any x86-64; selected at run time (kernels.c).
 *
 * Per-token operation order (fixed for a given type and n_in, for every token tile size
 * T = 1..4, model-spec §10.4): four 16-lane accumulators acc[0..3] per token;
 *   F32/F16/BF16  element vector v (16 elements) → acc[v % 4] += w*x (FMA); masked tail.
 *   Q8_0          block b: p = q0*x0; p = fma(q1, x1, p); acc[b % 4] = fma(d, p, acc).
 *   Q4_K          64-element chunk: its 4 vectors → acc[0..3]; w = fmsub(d*sc, q, dmin*m)
 *                 looked up from a 16-entry table per sub-block (vpermps).
 *   Q2_K          32-element group s of a 128-half: vectors → acc[2s % 4], acc[(2s+1) % 4].
 *   MXFP4         block b: p = w0*x0; p = fma(w1, x1, p); acc[b % 4] = fma(scale, p, acc).
 *   FP8 B128      block b: p0/p1 = even/odd vectors (mul then fma), acc[b % 4] =
 *                 fma(scale, p0 + p1, acc); B32: p = w0*x0 + w1*x1 (one chain), acc[b % 4] =
 *                 fma(scale, p, acc); partial last block masked.
 * Result: ((acc0 + acc1) + (acc2 + acc3)) reduced by _mm512_reduce_add_ps.
 */
#include "backends/cpu/kernels/kernels_impl.h"
#include "backends/cpu/kernels/kernels_ggml.h"

#ifdef DSIB_KERN_X86

#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

#define AI static inline __attribute__((always_inline))
#define TMAX 4
#define UNR _Pragma("GCC unroll 16")

typedef void (*dotfn)(const uint8_t *w, int64_t n, const float *const *xp, float *out);

AI float hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    return _mm512_reduce_add_ps(s);
}

AI float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AI __mmask16 tail_mask(int64_t r) {
    return r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << r) - 1u);
}

#define ACC_DECL                                                                          \
    __m512 acc[TMAX][4];                                                                  \
    UNR for (int t = 0; t < T; t++) UNR for (int k = 0; k < 4; k++) acc[t][k] =           \
        _mm512_setzero_ps();
#define ACC_OUT UNR for (int t = 0; t < T; t++) out[t] = hsum4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);

/* ---- F32 / F16 / BF16 ------------------------------------------------------------------ */

AI __m512 w_f32(const uint8_t *w, int64_t i) { return _mm512_loadu_ps((const float *)w + i); }
AI __m512 w_f32_m(const uint8_t *w, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)w + i);
}
AI __m512 w_f16(const uint8_t *w, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
}
AI __m512 w_f16_m(const uint8_t *w, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
}
AI __m512 w_bf16(const uint8_t *w, int64_t i) {
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
AI __m512 w_bf16_m(const uint8_t *w, int64_t i, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Every dot function below runs elements [k0, k1) of n (k0 a multiple of KBLOCK, or 0) with
 * its accumulators starting from zero (k0 = 0) or from st, and ends by reducing them into
 * out (k1 = n) or by saving them to st: the K-blocked prefill tiles (dsib_kern_rows_avx512)
 * split a row into chunks without changing a single operation. */
#define ACC_LOAD                                                                          \
    if (k0 > 0)                                                                           \
        UNR for (int t = 0; t < T; t++) UNR for (int k = 0; k < 4; k++) acc[t][k] = st[4 * t + k];
#define ACC_END                                                                           \
    if (k1 < n) {                                                                         \
        UNR for (int t = 0; t < T; t++) UNR for (int k = 0; k < 4; k++) st[4 * t + k] = acc[t][k]; \
    } else {                                                                              \
        ACC_OUT                                                                           \
    }
#define KARGS int64_t k0, int64_t k1, int64_t n, const float *const *xp, float *out, __m512 *st

#define DEF_PLAIN(NAME, LD, LDM, ESZ)                                                      \
    AI void NAME(const uint8_t *w, KARGS, const int T) {                                   \
        ACC_DECL                                                                           \
        ACC_LOAD                                                                           \
        int64_t i = k0;                                                                    \
        for (; i + 64 <= k1; i += 64) {                                                     \
            DSIB_PF((T) == 1, w + (ESZ) * i, 64 * (ESZ));                                  \
            UNR for (int k = 0; k < 4; k++) {                                              \
                __m512 wv = LD(w, i + 16 * k);                                             \
                UNR for (int t = 0; t < T; t++) acc[t][k] = _mm512_fmadd_ps(               \
                    wv, _mm512_loadu_ps(xp[t] + i + 16 * k), acc[t][k]);                   \
            }                                                                              \
        }                                                                                  \
        UNR for (int k = 0; k < 4; k++) {                                                  \
            int64_t r = k1 - i - 16 * k;                                                   \
            if (r <= 0) break;                                                             \
            __mmask16 m = tail_mask(r);                                                    \
            __m512 wv = LDM(w, i + 16 * k, m);                                             \
            UNR for (int t = 0; t < T; t++) acc[t][k] = _mm512_fmadd_ps(                   \
                wv, _mm512_maskz_loadu_ps(m, xp[t] + i + 16 * k), acc[t][k]);              \
        }                                                                                  \
        ACC_END                                                                            \
    }

DEF_PLAIN(dot_f32, w_f32, w_f32_m, 4)
DEF_PLAIN(dot_f16, w_f16, w_f16_m, 2)
DEF_PLAIN(dot_bf16, w_bf16, w_bf16_m, 2)

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
            const __m512 d = _mm512_set1_ps(ld_f16(blk));
            const __m512 q0 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
            const __m512 q1 = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
            UNR for (int t = 0; t < T; t++) {
                const float *x = xp[t] + 32 * b;
                __m512 p = _mm512_mul_ps(q0, _mm512_loadu_ps(x));
                p = _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 16), p);
                acc[t][k] = _mm512_fmadd_ps(d, p, acc[t][k]);
            }
        }
    }
    ACC_OUT
}

/* ---- Q4_K ------------------------------------------------------------------------------ */

AI void dot_q4_k(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                 const int T) {
    ACC_DECL
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int64_t nb = n / 256;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 144;
        const uint8_t *q = blk + 16;
        /* dl[j] = d * sc_j, ml[j] = dmin * m_j (exact products), all 8 sub-blocks at once */
        uint8_t sm[16];
        dsib_q4k_unpack_scales(blk + 4, sm);
        const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(ld_f16(blk)),
                                             _mm256_set1_ps(ld_f16(blk + 2)), 1);
        float dm[16];
        _mm512_storeu_ps(dm, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                               _mm_loadu_si128((const __m128i *)sm))),
                                           dd));
        /* reload the scales as memory broadcasts (load ports) instead of register shuffles */
        __asm__ volatile("" ::: "memory");
        UNR for (int c = 0; c < 4; c++) {
            const __m512 dl0 = _mm512_set1_ps(dm[2 * c]), ml0 = _mm512_set1_ps(dm[8 + 2 * c]);
            const __m512 dl1 = _mm512_set1_ps(dm[2 * c + 1]), ml1 = _mm512_set1_ps(dm[9 + 2 * c]);
            const __m512i i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * c)));
            const __m512i i1 =
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * c + 16)));
            const __m512 t0 = _mm512_fmsub_ps(dl0, iota, ml0);
            const __m512 t1 = _mm512_fmsub_ps(dl1, iota, ml1);
            const __m512 w0 = _mm512_permutexvar_ps(i0, t0);
            const __m512 w1 = _mm512_permutexvar_ps(i1, t0);
            const __m512 w2 = _mm512_permutexvar_ps(_mm512_srli_epi32(i0, 4), t1);
            const __m512 w3 = _mm512_permutexvar_ps(_mm512_srli_epi32(i1, 4), t1);
            UNR for (int t = 0; t < T; t++) {
                const float *x = xp[t] + 256 * b + 64 * c;
                acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc[t][1]);
                acc[t][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x + 32), acc[t][2]);
                acc[t][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x + 48), acc[t][3]);
            }
        }
    }
    ACC_OUT
}

/* ---- Q2_K ------------------------------------------------------------------------------ */

/* One 16-entry table serves four sub-blocks: entry 4k + q = dl_k * q - ml_k. A vector of
 * 16 elements is one sub-block, so its index is (2-bit field) | 4k. */
AI void dot_q2_k(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                 const int T) {
    ACC_DECL
    const __m512 iota4 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512i rep4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i three = _mm512_set1_epi32(3);
    const int64_t nb = n / 256;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 84;
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk));
        const __m512 dl = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15))),
                                        _mm512_set1_ps(ld_f16(blk + 80)));
        const __m512 ml = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)),
                                        _mm512_set1_ps(ld_f16(blk + 82)));
        UNR for (int h = 0; h < 2; h++) {
            const uint8_t *q = blk + 16 + 32 * h;
            __m512i ia = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
            __m512i ib = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
            UNR for (int g = 0; g < 2; g++) {
                /* sub-blocks 8h + 4g + k, k = 0..3 */
                const __m512i sel = _mm512_add_epi32(rep4, _mm512_set1_epi32(8 * h + 4 * g));
                const __m512 tab = _mm512_fmsub_ps(_mm512_permutexvar_ps(sel, dl), iota4,
                                                   _mm512_permutexvar_ps(sel, ml));
                UNR for (int ss = 0; ss < 2; ss++) {
                    const int s = 2 * g + ss; /* 2-bit field */
                    const __m512 wa = _mm512_permutexvar_ps(
                        _mm512_ternarylogic_epi32(ia, three, _mm512_set1_epi32(4 * (2 * ss)), 0xEA), tab);
                    const __m512 wb = _mm512_permutexvar_ps(
                        _mm512_ternarylogic_epi32(ib, three, _mm512_set1_epi32(4 * (2 * ss + 1)), 0xEA), tab);
                    ia = _mm512_srli_epi32(ia, 2);
                    ib = _mm512_srli_epi32(ib, 2);
                    UNR for (int t = 0; t < T; t++) {
                        const float *x = xp[t] + 256 * b + 128 * h + 32 * s;
                        acc[t][(2 * s) & 3] =
                            _mm512_fmadd_ps(wa, _mm512_loadu_ps(x), acc[t][(2 * s) & 3]);
                        acc[t][(2 * s + 1) & 3] = _mm512_fmadd_ps(wb, _mm512_loadu_ps(x + 16),
                                                                  acc[t][(2 * s + 1) & 3]);
                    }
                }
            }
        }
    }
    ACC_OUT
}

/* ---- MXFP4 ----------------------------------------------------------------------------- */

AI void dot_mxfp4(const uint8_t *w, int64_t n, const float *const *xp, float *out,
                  const int T) {
    ACC_DECL
    const __m512 tab = _mm512_loadu_ps(dsib_e2m1_tab);
    const int64_t nb = n / 32;
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        UNR for (int k = 0; k < 4; k++) {
            const int64_t b = b0 + k;
            if (b >= nb) break;
            const uint8_t *blk = w + b * 17;
            const __m512 s = _mm512_set1_ps(dsib_e8m0_to_f32(blk[0]));
            const __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 1)));
            const __m512 w0 = _mm512_permutexvar_ps(i, tab);
            const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(i, 4), tab);
            UNR for (int t = 0; t < T; t++) {
                const float *x = xp[t] + 32 * b;
                __m512 p = _mm512_mul_ps(w0, _mm512_loadu_ps(x));
                p = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), p);
                acc[t][k] = _mm512_fmadd_ps(s, p, acc[t][k]);
            }
        }
    }
    ACC_OUT
}

/* ---- FP8 E4M3 with E8M0 block scales ---------------------------------------------------- */

/* E4M3 → f16 bit patterns worth e4m3 · 2^-8, exactly: the sign goes to bit 15 and the 7
 * magnitude bits to bits 13..7, so a normal E4M3 (1 + m/8)·2^(e-7) becomes the f16 normal
 * (1 + m/8)·2^(e-15) and a subnormal m·2^-9 the f16 subnormal m·2^-17 (vcvtph2ps converts
 * both exactly; NaN codes give ±480·2^-8). The 2^8 goes into the block scale. 32 codes per
 * call: b << 7, then the sign bit (now at 14) is moved to 15 by adding it to itself. */
AI __m512i e4m3x32_f16(__m256i bytes) {
    const __m512i t = _mm512_slli_epi16(_mm512_cvtepu8_epi16(bytes), 7);
    return _mm512_add_epi16(t, _mm512_and_si512(t, _mm512_set1_epi16(0x4000)));
}

/* One FP8 block of BS values, `valid` of them real (valid == BS except for a row's last
 * block), accumulated into acc[.][k]. Per 32 values: 16-element vectors 2g (low half) and
 * 2g+1 (high half), so vector v still goes to the partial sum p[v & 1]. */
#define FP8_BLOCK(BS, blkp, xoff, valid, K)                                               \
    do {                                                                                  \
        const uint8_t *bp_ = (blkp);                                                      \
        const __m512 s_ = _mm512_set1_ps(dsib_e8m0_to_f32(bp_[0]) * 256.0f);              \
        __m512 p_[TMAX][2];                                                               \
        UNR for (int g = 0; g < (BS) / 32; g++) {                                         \
            const int64_t rg_ = (valid) - 32 * g;                                         \
            const __mmask32 mg_ = rg_ >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << (rg_ > 0 ? rg_ : 0)) - 1u); \
            const __m512i h_ = e4m3x32_f16(_mm256_maskz_loadu_epi8(mg_, bp_ + 1 + 32 * g)); \
            UNR for (int hh = 0; hh < 2; hh++) {                                          \
                const int v = 2 * g + hh;                                                 \
                const int64_t r_ = (valid) - 16 * v;                                      \
                const __mmask16 m_ = tail_mask(r_ > 0 ? r_ : 0);                          \
                const __m512 wv_ = _mm512_cvtph_ps(hh ? _mm512_extracti64x4_epi64(h_, 1)  \
                                                      : _mm512_castsi512_si256(h_));      \
                UNR for (int t = 0; t < T; t++) {                                         \
                    const __m512 xv_ = _mm512_maskz_loadu_ps(m_, xp[t] + (xoff) + 16 * v); \
                    if ((BS) == 32 && v == 1) /* B32: one chain p = w0*x0 + w1*x1 */      \
                        p_[t][0] = _mm512_fmadd_ps(wv_, xv_, p_[t][0]);                   \
                    else if (v < 2)                                                       \
                        p_[t][v] = _mm512_mul_ps(wv_, xv_);                               \
                    else                                                                  \
                        p_[t][v & 1] = _mm512_fmadd_ps(wv_, xv_, p_[t][v & 1]);           \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        UNR for (int t = 0; t < T; t++) acc[t][K] = _mm512_fmadd_ps(                      \
            s_, (BS) == 32 ? p_[t][0] : _mm512_add_ps(p_[t][0], p_[t][1]), acc[t][K]);    \
    } while (0)

#define DEF_FP8(NAME, BS)                                                                 \
    AI void NAME(const uint8_t *w, KARGS, const int T) {                                  \
        ACC_DECL                                                                          \
        ACC_LOAD                                                                          \
        const int64_t nb = (k1 + (BS)-1) / (BS);                                          \
        const int64_t nfull = n / (BS);                                                   \
        for (int64_t b0 = k0 / (BS); b0 < nb; b0 += 4) {                                          \
            UNR for (int k = 0; k < 4; k++) {                                             \
                const int64_t b = b0 + k;                                                 \
                if (b >= nb) break;                                                       \
                if (b < nfull)                                                            \
                    FP8_BLOCK(BS, w + b * ((BS) + 1), b *(BS), (BS), k);                  \
                else                                                                      \
                    FP8_BLOCK(BS, w + b * ((BS) + 1), b *(BS), n - b * (BS), k);          \
            }                                                                             \
        }                                                                                 \
        ACC_END                                                                           \
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
    static void NAME##_3(const uint8_t *w, int64_t n, const float *const *xp, float *o) { \
        NAME(w, n, xp, o, 3);                                                             \
    }                                                                                     \
    static void NAME##_4(const uint8_t *w, int64_t n, const float *const *xp, float *o) { \
        NAME(w, n, xp, o, 4);                                                             \
    }                                                                                     \
    static const dotfn NAME##_tab[TMAX + 1] = {NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4};

typedef void (*kdotfn)(const uint8_t *w, KARGS);
#define SPECIALIZE_K(NAME)                                                                \
    static void NAME##_1(const uint8_t *w, KARGS) { NAME(w, k0, k1, n, xp, out, st, 1); } \
    static void NAME##_2(const uint8_t *w, KARGS) { NAME(w, k0, k1, n, xp, out, st, 2); } \
    static void NAME##_3(const uint8_t *w, KARGS) { NAME(w, k0, k1, n, xp, out, st, 3); } \
    static void NAME##_4(const uint8_t *w, KARGS) { NAME(w, k0, k1, n, xp, out, st, 4); } \
    static const kdotfn NAME##_tab[TMAX + 1] = {NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4};

SPECIALIZE_K(dot_f32)
SPECIALIZE_K(dot_f16)
SPECIALIZE_K(dot_bf16)
SPECIALIZE(dot_q8_0)
SPECIALIZE(dot_q4_k)
SPECIALIZE(dot_q2_k)
SPECIALIZE(dot_mxfp4)
SPECIALIZE_K(dot_fp8_b128)
SPECIALIZE_K(dot_fp8_b32)

/* Prefill tiles of the K-blocked types: KROWS rows × TMAX tokens advance together through
 * chunks of KBLOCK elements, so the tokens' x chunk (16 KiB for f32) stays in L1 while the
 * rows stream past; the accumulators wait in st between chunks. */
#ifndef KBLOCK
#define KBLOCK 1024
#endif
#ifndef KROWS
#define KROWS 16
#endif

int dsib_kern_rows_avx512(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                           int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                           int n) {
    const dotfn *tab = NULL;
    const kdotfn *ktab = NULL;
    switch (type) {
    case DSI_TYPE_F32: ktab = dot_f32_tab; break;
    case DSI_TYPE_F16: ktab = dot_f16_tab; break;
    case DSI_TYPE_BF16: ktab = dot_bf16_tab; break;
    case DSI_TYPE_Q8_0: tab = dot_q8_0_tab; break;
    case DSI_TYPE_Q4_K: tab = dot_q4_k_tab; break;
    case DSI_TYPE_Q2_K: tab = dot_q2_k_tab; break;
    case DSI_TYPE_MXFP4: tab = dot_mxfp4_tab; break;
    case DSI_TYPE_FP8_E4M3_B128: ktab = dot_fp8_b128_tab; break;
    case DSI_TYPE_FP8_E4M3_B32: ktab = dot_fp8_b32_tab; break;
    default: return dsib_kern_rows_ggml_avx512(type, w, w_row_bytes, n_in, o0, o1, xp, yp, n);
    }
    for (int t0 = 0; t0 < n; t0 += TMAX) {
        const int T = n - t0 < TMAX ? n - t0 : TMAX;
        float out[KROWS][TMAX];
        if (tab || T == 1 || n_in <= KBLOCK) {
            for (int64_t o = o0; o < o1; o++) {
                if (tab)
                    tab[T](w + (size_t)o * w_row_bytes, n_in, xp + t0, out[0]);
                else
                    ktab[T](w + (size_t)o * w_row_bytes, 0, n_in, n_in, xp + t0, out[0], NULL);
                for (int t = 0; t < T; t++) yp[t0 + t][o] = out[0][t];
            }
            continue;
        }
        __m512 st[KROWS][TMAX * 4];
        for (int64_t og = o0; og < o1; og += KROWS) {
            const int64_t og1 = o1 - og < KROWS ? o1 : og + KROWS;
            for (int64_t k0 = 0; k0 < n_in; k0 += KBLOCK) {
                const int64_t k1 = n_in - k0 < KBLOCK ? n_in : k0 + KBLOCK;
                for (int64_t o = og; o < og1; o++)
                    ktab[T](w + (size_t)o * w_row_bytes, k0, k1, n_in, xp + t0, out[o - og],
                            st[o - og]);
            }
            for (int64_t o = og; o < og1; o++)
                for (int t = 0; t < T; t++) yp[t0 + t][o] = out[o - og][t];
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
typedef int dsib_kern_avx512_tu;
