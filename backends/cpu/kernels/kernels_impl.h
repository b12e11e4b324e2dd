/*
 * Internal to backends/cpu/kernels: the per-ISA row kernels behind kernels.h.
 *
 * Exact path (f32 activations): each ISA file provides one function that computes rows
 * [o0, o1) of y = W x for up to DSIB_KERN_GROUP tokens given as pointer arrays (xp[t] =
 * token t's x row, yp[t] = token t's y row). Tokens are processed in tiles whose size is
 * private to the ISA; every tile size runs the identical per-token operation sequence
 * (model-spec §10.4).
 *
 * Default path (quantised activations): one dsib_kern_qtype per weight type (its own file),
 * with a row kernel per ISA taking dsib_qrow views of the quantised token rows.
 */
#ifndef DSIB_CPU_KERNELS_IMPL_H
#define DSIB_CPU_KERNELS_IMPL_H

#include "backends/cpu/kernels/kernels.h"
#include "quant/ggml_tables.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define DSIB_KERN_GROUP 64

/* Software prefetch of the weight stream (speed only, never changes a result): in decode
 * tiles (T = 1 token: memory-bound) the kernels prefetch the lines [p + D, p + D + n) of the
 * weight bytes they are about to decode, D = dsib_kern_prefetch bytes ahead
 * (DSIB_PREFETCH_BYTES by default; 0: off, dsinfer-bench --prefetch). A task's rows are
 * contiguous, so D bytes ahead is the stream's next bytes; the hardware prefetchers stop at
 * every 4 KiB page. DSIB_PF(on, p, n) prefetches when `on`: the default path sets it for the
 * first token tile of a call (the one that reads the weights cold: decode, and the batched
 * decode of a few sessions, where it measured +34 % at 4 tokens on Zen 5) and not for the
 * later tiles of a prefill, which re-read the rows from L2 (prefetching there cost 6 %). */
/* 4096: on the Zen 5 guest (2 threads, 32 matrices of 2048 x 4096 cycled, best of 40 rounds,
 * distances alternated within a run) 4096 was never slower than 2048 and mostly 2-7 % faster
 * (Q8_0 T = 1 / 2: 51.1 / 41.3 against 49.4 / 39.0 GB/s; Q4_K 55.4 against 51.9; Q2_K 43.2
 * against 42.2), 8192 and 16384 no better; in the model (bench-v41-q8 --no-mmap tg32) 50.3 /
 * 52.2 / 52.1 against 49.9 / 47.8 / 47.4 t/s. docs/performance.md 4.000000000. */
#ifndef DSIB_PREFETCH_BYTES
#define DSIB_PREFETCH_BYTES 4096
#endif
/* The far level (dsib_kern_prefetch2): with `on`, DSIB_PF and DSIB_PF_ROWS also prefetch the
 * same lines DSIB_PREFETCH2_BYTES ahead into L2 only (prefetcht2), so the near prefetch above
 * (to L1) finds them in L2 and holds a line-fill buffer for an L2 hit instead of a trip to
 * memory. With the near level alone the core's few L1 fill buffers bound the bytes in flight:
 * on Emerald Rapids (2 vCPUs) a synthetic stream with compute at half its memory time ran at
 * 26.2 GB/s (2 threads) with prefetcht0 4 KiB ahead and 32.3 with this pair (read bandwidth
 * 34); Q4_K one-token calls from memory 24.7 -> 27.7 GB/s at 2048 x 1024 (8192 and 32768
 * within noise of 16384). docs/performance.md 4.000000000000000000000000. 0: off. */
#ifndef DSIB_PREFETCH2_BYTES
#define DSIB_PREFETCH2_BYTES 16384
#endif
/* Sixteen-row groups (dsib_pf16): the near level, bytes ahead in each row, for the groups
 * after a call's first (whose rows go DSIB_PREFETCH_BYTES / 2 ahead) in calls of at most
 * eight tokens; their far level is the next group (prefetcht2). */
#define DSIB_PF16_NEAR 256
/* The far level of DSIB_PF / DSIB_PF_ROWS: the lines [p + D2, p + D2 + n) into L2 only. */
#define DSIB_PF_FAR(p, n)                                                                  \
    do {                                                                                   \
        const int32_t pfd2_ = dsib_kern_prefetch2;                                         \
        if (pfd2_ > 0) {                                                                   \
            const char *pfr_ = (const char *)(p) + pfd2_;                                  \
            for (int pfk_ = 0; pfk_ < (int)(n); pfk_ += 64) __builtin_prefetch(pfr_ + pfk_, 0, 1); \
        }                                                                                  \
    } while (0)
/* DSIB_PF in a tile of R rows (rb bytes apart): with R > 1 the lines of the same blocks in
 * the next tile, R * rb bytes on (the distance of DSIB_PF from inside the tile would land on
 * rows being read now). */
#define DSIB_PF_ROWS(on, p, n, R, rb)                                                      \
    do {                                                                                   \
        if ((R) == 1) {                                                                    \
            DSIB_PF(on, p, n);                                                             \
        } else if ((on) && dsib_kern_prefetch > 0) {                                       \
            const char *pfq_ = (const char *)(p) + (size_t)(R) * (rb);                     \
            for (int pfk_ = 0; pfk_ < (int)(n); pfk_ += 64) __builtin_prefetch(pfq_ + pfk_, 0, 3); \
            DSIB_PF_FAR(p, n);                                                             \
        }                                                                                  \
    } while (0)
#define DSIB_PF(on, p, n)                                                                  \
    do {                                                                                   \
        const int32_t pfd_ = dsib_kern_prefetch;                                           \
        if ((on) && pfd_ > 0) {                                                            \
            const char *pfq_ = (const char *)(p) + pfd_;                                   \
            for (int pfk_ = 0; pfk_ < (int)(n); pfk_ += 64) __builtin_prefetch(pfq_ + pfk_, 0, 3); \
            DSIB_PF_FAR(p, n);                                                             \
        }                                                                                  \
    } while (0)

typedef void (*dsib_rows_ptr_fn)(int32_t type, const uint8_t *w, size_t w_row_bytes,
                                 int64_t n_in, int64_t o0, int64_t o1,
                                 const float *const *xp, float *const *yp, int n);

void dsib_kern_rows_scalar(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                           int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                           int n);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSIB_KERN_X86 1
/* Return 0 (and write nothing) for a type they have no kernel for. */
int dsib_kern_rows_avx2(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                        int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                        int n);
int dsib_kern_rows_avx512(int32_t type, const uint8_t *w, size_t w_row_bytes, int64_t n_in,
                          int64_t o0, int64_t o1, const float *const *xp, float *const *yp,
                          int n);
#endif

/* ---- default path: quantised activations ----------------------------------------------- */

/* Rows [o0, o1) (w = row 0 of the matrix) for n <= DSIB_KERN_GROUP tokens: x[t] is token
 * t's quantised row, yp[t][o] receives the result. */
typedef void (*dsib_qrows_fn)(const uint8_t *w, size_t w_row_bytes, int64_t n_in, int64_t o0,
                              int64_t o1, const dsib_qrow *x, float *const *yp, int n);

typedef struct dsib_kern_qtype {
    int32_t type;                         /* DSI_TYPE_* */
    int32_t act;                          /* DSIB_ACT_* (never DSIB_ACT_F32) */
    dsib_qrows_fn qrows[DSIB_ISA_COUNT];  /* NULL: the next lower ISA's entry; [0] required */
} dsib_kern_qtype;

/* ggml type ids of the types with default-path kernels that dsinfer.h does not name */
#define DSIB_TYPE_Q4_0 2
#define DSIB_TYPE_Q4_1 3
#define DSIB_TYPE_Q5_0 6
#define DSIB_TYPE_Q5_1 7
#define DSIB_TYPE_Q3_K 11
#define DSIB_TYPE_IQ3_XXS 18
#define DSIB_TYPE_IQ1_S 19
#define DSIB_TYPE_IQ4_NL 20
#define DSIB_TYPE_IQ4_XS 23
#define DSIB_TYPE_Q5_K 13
#define DSIB_TYPE_Q6_K 14
#define DSIB_TYPE_IQ2_XS 17
#define DSIB_TYPE_IQ3_S 21
#define DSIB_TYPE_IQ2_S 22
#define DSIB_TYPE_IQ1_M 29

extern const dsib_kern_qtype dsib_kq_q8_0;
extern const dsib_kern_qtype dsib_kq_q4_k;
extern const dsib_kern_qtype dsib_kq_q2_k;
extern const dsib_kern_qtype dsib_kq_mxfp4;
extern const dsib_kern_qtype dsib_kq_iq2_xxs;
extern const dsib_kern_qtype dsib_kq_q6_k;
extern const dsib_kern_qtype dsib_kq_q5_k;
extern const dsib_kern_qtype dsib_kq_q3_k;
extern const dsib_kern_qtype dsib_kq_q4_0;
extern const dsib_kern_qtype dsib_kq_iq4_nl;
extern const dsib_kern_qtype dsib_kq_iq4_xs;
extern const dsib_kern_qtype dsib_kq_iq3_xxs;
extern const dsib_kern_qtype dsib_kq_q4_1;
extern const dsib_kern_qtype dsib_kq_q5_0;
extern const dsib_kern_qtype dsib_kq_q5_1;
extern const dsib_kern_qtype dsib_kq_iq2_xs;
extern const dsib_kern_qtype dsib_kq_iq2_s;
extern const dsib_kern_qtype dsib_kq_iq3_s;

#ifdef DSIB_KERN_X86
/* 1 if the CPU has AVX512_VBMI (iq2_xxs.c; the IQ types' VBMI variants run where it is
 * set and dsib_kern_iq2_vbmi is). */
int dsib_kern_cpu_vbmi(void);
/* 1 if the CPU has AVX512_VBMI2 (q4_k.c; the Q5_K VB2 tiles run where it is
 * set and dsib_kern_kq_vbmi2 is). */
int dsib_kern_cpu_vbmi2(void);
#endif
extern const dsib_kern_qtype dsib_kq_iq1_s;
extern const dsib_kern_qtype dsib_kq_iq1_m;

/* Activation quantisers (act.c), one per ISA; identical output bytes. */
void dsib_act_quantize_scalar(int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                              int64_t n_tok, void *act, size_t act_stride);
#ifdef DSIB_KERN_X86
void dsib_act_quantize_avx2(int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                            int64_t n_tok, void *act, size_t act_stride);
void dsib_act_quantize_avx512(int32_t fmt, const float *x, int64_t xs, int64_t n_in,
                              int64_t n_tok, void *act, size_t act_stride);
#endif

/* Block size (32 or 256) and, for the permuted K formats, the natural 32-element group
 * stored at position p of a block (perm[p]); NULL = natural order. */
int64_t dsib_act_block(int32_t fmt);
const uint8_t *dsib_act_perm(int32_t fmt);

/* ---- target regions for the SIMD code ------------------------------------------------------
 * DSIB_TARGET_PUSH(DSIB_TGT_AVX2) ... DSIB_TARGET_POP compiles the functions in between for
 * that target (gcc pragmas / clang attribute push), so no per-file compiler flags. */
#define DSIB_PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define DSIB_TARGET_PUSH(T) \
    DSIB_PRAGMA(clang attribute push(__attribute__((target(T))), apply_to = function))
#define DSIB_TARGET_POP DSIB_PRAGMA(clang attribute pop)
#else
#define DSIB_TARGET_PUSH(T) DSIB_PRAGMA(GCC push_options) DSIB_PRAGMA(GCC target(T))
#define DSIB_TARGET_POP DSIB_PRAGMA(GCC pop_options)
#endif
#define DSIB_TGT_AVX2 "avx2,fma,f16c"
#define DSIB_TGT_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define DSIB_TGT_AVX512VNNI "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define DSIB_TGT_AVX512VBMI "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx2,fma,f16c"
#define DSIB_TGT_AVX512VBMI2 "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi2,avx2,fma,f16c"
#define DSIB_TGT_AMX                                                                       \
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8"
#define DSIB_AI static inline __attribute__((always_inline))

/* ---- shared scalar helpers (exact decoders; no libm) ---------------------------------- */

static inline float dsib_u32_as_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float dsib_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        /* zero / subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * dsib_u32_as_f32(0x33800000u); /* 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return dsib_u32_as_f32(sign | 0x7f800000u | (m << 13));
    return dsib_u32_as_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline float dsib_ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return dsib_f16_to_f32(h);
}

static inline uint32_t dsib_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t dsib_ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint64_t dsib_ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ggml's ksigns table (ksigns[i] = i | parity(i) << 7) as ±1 bytes, byte j = -1 where bit j of
 * ksigns[i] is set, else +1: the AVX2 IQ kernels build a sub-block's sign vector from four of
 * these qwords (kernels.c; the same bytes as dsib_iq_signs_avx2 of dsib_iq_signs32). */
extern const uint64_t dsib_ksigns64[128];

/* IQ2_XXS / IQ3_XXS: the 32 sign bits of a sub-block (bit 8l + j: element 8l + j negative)
 * from its w (sign index of group l = (w >> 7l) & 127, through ggml's ksigns table). */
static inline uint32_t dsib_iq_signs32(uint32_t w) {
    return (uint32_t)dsii_ksigns_iq2xs[w & 127] | (uint32_t)dsii_ksigns_iq2xs[(w >> 7) & 127] << 8 |
           (uint32_t)dsii_ksigns_iq2xs[(w >> 14) & 127] << 16 |
           (uint32_t)dsii_ksigns_iq2xs[(w >> 21) & 127] << 24;
}

static inline float dsib_bf16_to_f32(uint16_t h) { return dsib_u32_as_f32((uint32_t)h << 16); }

/* UE8M0 scale 2^(e-127); e = 0 → 2^-127 (bit pattern 0x00400000, model-spec §2.1). */
static inline float dsib_e8m0_to_f32(uint8_t e) {
    return dsib_u32_as_f32(e == 0 ? 0x00400000u : (uint32_t)e << 23);
}

/* Half of the UE8M0 scale, 2^(e-128) (the default MXFP4 path uses doubled E2M1 values):
 * exact for every e < 255 (e = 0, 1 give the subnormals 2^-128, 2^-127); e = 255 → NaN. */
static inline float dsib_e8m0_half_to_f32(uint8_t e) {
    if (e == 255) return dsib_u32_as_f32(0x7fc00000u);
    if (e < 2) return dsib_u32_as_f32(0x00200000u << e);
    return dsib_u32_as_f32((uint32_t)(e - 1) << 23);
}

/* E4M3FN → f32 by placing the 7 magnitude bits at f32 bit 20 and scaling by 2^120: exact
 * for normals and subnormals (the f32 subnormal times 2^120 is exact). NaN codes give
 * ±480 (weights are finite). The SIMD paths use the same construction. */
static inline float dsib_e4m3_to_f32(uint8_t b) {
    float v = dsib_u32_as_f32((uint32_t)(b & 0x7f) << 20) * dsib_u32_as_f32(0x7b800000u);
    return (b & 0x80) ? -v : v;
}

/* E2M1 code → value (model-spec §2.1). */
static const float dsib_e2m1_tab[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
/* Twice the E2M1 value as an int8 (the default MXFP4 path). */
static const int8_t dsib_e2m1x2_tab[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Q4_K 6-bit scale / min of sub-block j (ggml get_scale_min_k4). */
static inline void dsib_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Q4_K: all eight 6-bit scales and mins at once (ggml's utmp unpacking): on return the
 * bytes out[0..8) are the scales of sub-blocks 0..7 and out[8..16) their mins — the same
 * values as dsib_q4k_scale_min. */
static inline void dsib_q4k_unpack_scales(const uint8_t *sc12, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, sc12, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t aux = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = aux;
    u[0] &= 0x3f3f3f3fu;
    memcpy(out, u, 16);
}

/* ---- the default path's canonical float part --------------------------------------------
 * Every default-path type accumulates into two sets of 16 f32 lanes acc[2][16] (zero at
 * the start; "step" s of its file — a block pair or a super-block — goes to set s mod 2,
 * so a single row has two independent fma chains) with fmaf steps documented in its file,
 * and ends with dsib_reduce32: the sets added lane by lane, then this fixed 16 → 1
 * reduction. The SIMD paths hold a set in one zmm (AVX-512) or two ymm (AVX2: lanes 0-7,
 * 8-15) and reduce in the same order. */
static inline float dsib_reduce16(const float a[16]) {
    float h8[8], h4[4];
    for (int i = 0; i < 8; i++) h8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) h4[i] = h8[i] + h8[i + 4];
    const float h0 = h4[0] + h4[2], h1 = h4[1] + h4[3];
    return h0 + h1;
}

static inline float dsib_reduce32(const float a[2][16]) {
    float s[16];
    for (int i = 0; i < 16; i++) s[i] = a[0][i] + a[1][i];
    return dsib_reduce16(s);
}

/* Tile driver shared by the default-path kernels: TILE(w, rb, n_in, x, out, R, T) computes
 * out[r * T + t] for rows r < R (w = the first row) and tokens t < T. Rows go one at a time
 * (R = 1): the weights then stream from memory as one sequential read, which measured
 * 2-2.5x faster cold than interleaving 2 or 4 rows (the two accumulator sets of the
 * canonical order give a single row its instruction-level parallelism); prefill tiles
 * serve up to TT = 4 tokens from one decoded weight block (on AVX2 too since the K-quant
 * and IQ tiles decode one position at a time: their float accumulators live in memory,
 * touched once per block; four tokens measured 5-70 % faster than two on Zen 3,
 * docs/performance.md 4.000000000000000), 8 in most AVX-512 kernels
 * (DSIB_QROWS_DEFINE_RT8). Every tile runs the same per-(row, token) sequence, so results do not
 * depend on it. (Exceptions: the AVX2 kernels that are compute-bound on short rows take four
 * rows per one-token tile, prefetching one tile ahead: DSIB_QROWS_DEFINE_T4 below, and so
 * do the AVX-512 kernels on rows of at most 1024 columns, DSIB_QROWS_DEFINE_RT4; the
 * AVX-512 kernels use two-row tiles for the later token tiles of a call: DSIB_QTILE_FN_R
 * below.) */
/* RR rows per tile in the later multi-token tiles of a call (T >= 2, pf = 0: rows re-read
 * from L2; the last odd row alone): the token rows' activations are loaded once per RR
 * rows. The first tile (cold weights, prefetching) and long one-token rows keep R = 1: from
 * memory, R = 2 measured slower (Zen 5, q8_0, 4 tokens: 18.2-18.9 against 19.8-22.2 GB/s),
 * from L2 faster (128 tokens: 250-265 against 237-244 GFLOP/s). RR = 1: one row at a time. */
#define DSIB_QTILE_FN_R(NAME, TILE, T, RR) DSIB_QTILE_FN_RS_(NAME, TILE, T, RR, 0)
#define DSIB_QTILE_FN_RS_(NAME, TILE, T, RR, SPEC)                                         \
    static void NAME##_t##T(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0,         \
                            int64_t o1, const dsib_qrow *x, float *const *yp, int pf) {    \
        int64_t o = o0;                                                                    \
        if (!pf && (RR) > 1)                                                               \
            DSIB_QTILE_ROWS_BY_N_(SPEC, TILE, n_in, RR, T, 0, o + (RR) <= o1, 1);          \
        DSIB_QTILE_ROWS_BY_N_(SPEC, TILE, n_in, 1, T, pf, o < o1, 1);                      \
    }
/* Tiles of RR rows, T tokens while COND holds (o the next row). With SPEC, n_in is replaced
 * by a constant where it is one of the short rows of the models' projections (512 and 1024
 * columns: LoRA ranks, expert widths, q_b's input): with the super-block count known the
 * compiler unrolls a row's blocks and keeps the R = 4 one-token tile's sixteen accumulators
 * in registers instead of spilling them. Only code generation changes, not one operation of
 * the canonical order. Used by the AVX2 K-quant-like types (DSIB_QROWS_DEFINE_T4), whose
 * code it doubles; Q8_0 and the IQ types measured no faster one-token, and 2048 columns gained
 * nothing measurable. Zen 3, two threads, 8192 x 512, hot: Q4_K 26.8 -> 30.7 GB/s, Q2_K
 * 17.5 -> 21.2, Q6_K 29.9 -> 35.2; Q4_K at four tokens 10.4 -> 12.7 GB/s
 * (docs/performance.md 4.00000000000000000). */
#define DSIB_QTILE_ROWS_AT_(TILE, NIN, RR, T, PF, COND)                                    \
    for (; COND; o += (RR)) {                                                              \
        float out[(RR) * (T)];                                                             \
        TILE(w + (size_t)o * rb, rb, NIN, x, out, RR, T, PF);                              \
        for (int r = 0; r < (RR); r++)                                                     \
            for (int t = 0; t < (T); t++) yp[t][o + r] = out[r * (T) + t];                \
    }
#define DSIB_QTILE_ROWS_BY_N_(SPEC, TILE, n_in, RR, T, PF, COND, ANY)                      \
    do {                                                                                   \
        if ((SPEC) && (n_in) == 512)                                                       \
            DSIB_QTILE_ROWS_AT_(TILE, 512, RR, T, PF, COND)                                \
        else if ((SPEC) && (n_in) == 1024)                                                 \
            DSIB_QTILE_ROWS_AT_(TILE, 1024, RR, T, PF, COND)                               \
        else if (ANY)                                                                      \
            DSIB_QTILE_ROWS_AT_(TILE, n_in, RR, T, PF, COND)                               \
    } while (0)
#define DSIB_QTILE_FN(NAME, TILE, T) DSIB_QTILE_FN_R(NAME, TILE, T, 1)
/* One-token (decode) tiles of RR rows for the AVX2 kernels that are compute-bound on short
 * rows (DSIB_QROWS_DEFINE_T4): while n_in <= DSIB_T1_ROWS_MAX_IN the rows go RR at a time,
 * block b of each row in turn, so that the independent rows overlap the latency of a row's
 * last blocks and of its final reduction (with n_in = 1024 a row has only 4 super-blocks);
 * their weights are prefetched one tile ahead (DSIB_PF_ROWS). Longer rows keep R = 1. Zen 3,
 * one thread, cold 64-128 MiB matrices, R = 1 -> 4 (docs/performance.md 4.00000000000000):
 * Q4_K 512 / 1024 / 2048 / 4096 columns 11.6 -> 13.1, 13.2 -> 13.7, 14.9 -> 15.4,
 * 16.2 -> 15.3 GB/s; Q2_K 5.4 -> 7.9, 7.5 -> 8.8, 9.4 -> 9.5, 10.4 -> 10.1. Q8_0, which is
 * memory-bound there, measured 19.6 -> 12.9 GB/s (1024 columns): the memory-bound types
 * keep DSIB_QROWS_DEFINE_T. Results are the same: every row runs its own sequence.
 * The AVX-512 kernels of Q3_K-Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 take the
 * same four-row one-token tiles (DSIB_QROWS_DEFINE_RT4; Q4_K for its one-token calls only;
 * Q8_0 and Q2_K have moved to the sixteen-row tiles of the block-sum order, simd_avx512.h;
 * not the grid-bound IQ types, whose
 * +3-10 % did not pay for doubling their code, nor IQ4_XS and the IQ1 types) up to
 * DSIB_T1_ROWS_MAX_IN_AVX512 columns, with the widths as constants in the multi-token
 * tiles too, and reduce the four rows' outputs
 * together (DSIB_REDUCE_R4T1_AVX512_); their prefetch stays DSIB_PF's distance ahead of
 * each row (the four rows are adjacent: one tile ahead measured 20 % slower cold at 512
 * columns). Intel Emerald Rapids, one thread, 512 / 1024 columns, cold, R = 1 -> 4
 * (docs/performance.md 4.000000000000000000): Q4_K 12.9 -> 13.0 / 13.3 -> 13.2 GB/s (hot
 * 14.5 -> 17.0 / 16.6 -> 18.0), Q2_K 8.6 -> 10.8 / 10.4 -> 11.4, Q6_K 13.7 -> 14.0 (hot
 * 20.4 -> 24.9), Q8_0 13.5 -> 14.3 (hot 23.6 -> 28.8); at 2048 columns R = 4 was slower
 * cold for Q8_0 (13.9 -> 10.9), Q6_K and Q4_K, hence the lower bound. */
#define DSIB_T1_ROWS_MAX_IN 2048
#define DSIB_T1_ROWS_MAX_IN_AVX512 1024
#define DSIB_QTILE_FN_T1(NAME, TILE, RR, MAXIN)                                            \
    static void NAME##_t1(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0,           \
                          int64_t o1, const dsib_qrow *x, float *const *yp, int pf) {      \
        int64_t o = o0;                                                                    \
        DSIB_QTILE_ROWS_BY_N_(1, TILE, n_in, RR, 1, pf, o + (RR) <= o1, n_in <= (MAXIN));  \
        DSIB_QTILE_ROWS_AT_(TILE, n_in, 1, 1, pf, o < o1)                                  \
    }
/* The one-row tiles of 2, 3 and 4 tokens, and the row function over them (TT tokens at most
 * per tile). */
#define DSIB_QROWS_T234_(NAME, TILE, TT, SPEC)                                             \
    DSIB_QTILE_FN_RS_(NAME, TILE, 2, 1, SPEC)                                              \
    DSIB_QTILE_FN_RS_(NAME, TILE, 3, 1, SPEC)                                              \
    DSIB_QTILE_FN_RS_(NAME, TILE, 4, 1, SPEC)                                              \
    DSIB_QROWS_DISPATCH(NAME, TT)
#define DSIB_QROWS_DEFINE_T4(NAME, TILE, TT)                                               \
    DSIB_QTILE_FN_T1(NAME, TILE, 4, DSIB_T1_ROWS_MAX_IN)                                   \
    DSIB_QROWS_T234_(NAME, TILE, TT, 1)
#define DSIB_QROWS_DEFINE(NAME, TILE) DSIB_QROWS_DEFINE_T(NAME, TILE, 4)
#define DSIB_QROWS_DEFINE_T(NAME, TILE, TT)                                                \
    DSIB_QTILE_FN(NAME, TILE, 1)                                                           \
    DSIB_QROWS_T234_(NAME, TILE, TT, 0)
/* The AVX-512 row function: four-row one-token tiles on short rows (above), RR rows in the
 * later multi-token tiles, the short widths as constants everywhere. */
#define DSIB_QROWS_DEFINE_RT4(NAME, TILE, RR)                                              \
    DSIB_QTILE_FN_T1(NAME, TILE, 4, DSIB_T1_ROWS_MAX_IN_AVX512)                            \
    DSIB_QTILE_FN_RS_(NAME, TILE, 2, RR, 1)                                                \
    DSIB_QTILE_FN_RS_(NAME, TILE, 3, RR, 1)                                                \
    DSIB_QTILE_FN_RS_(NAME, TILE, 4, RR, 1)                                                \
    DSIB_QROWS_DISPATCH(NAME, 4)
/* RT4 with eight-token tiles of one row: a call's tokens go eight at a time, then a tile
 * of the rest (four at most; five to seven tokens: four, then the others). One decoded
 * weight block then serves eight tokens, the row's decode and scale work is shared by twice
 * as many products, and the sixteen accumulators fill half the vector registers. Every
 * (row, token) still runs its own canonical sequence: the same bits (test_short_rows,
 * test_invariance_default with 9 and 17 tokens). Emerald Rapids, one core, 2048 x 1024,
 * 128 tokens, GFLOP/s, RT4 -> RT8 (docs/performance.md 4.0000000000000000000): Q4_K
 * 108 -> 122, Q8_0 97 -> 121, Q6_K 113 -> 132, Q3_K 100 -> 122, Q2_K 116 -> 127. Not for
 * Q4_1 / Q5_1, whose eight-token tile measured slower (74 -> 71): their per-token min
 * products do not fit beside sixteen accumulators. */
#define DSIB_QROWS_DEFINE_RT8(NAME, TILE, RR)                                              \
    DSIB_QTILE_FN_T1(NAME, TILE, 4, DSIB_T1_ROWS_MAX_IN_AVX512)                            \
    DSIB_QTILE_FN_RS_(NAME, TILE, 2, RR, 1)                                                \
    DSIB_QTILE_FN_RS_(NAME, TILE, 3, RR, 1)                                                \
    DSIB_QTILE_FN_RS_(NAME, TILE, 4, RR, 1)                                                \
    DSIB_QTILE_FN_RS_(NAME, TILE, 8, 1, 1)                                                 \
    DSIB_QROWS_DISPATCH8(NAME)
#define DSIB_QROWS_DISPATCH8(NAME)                                                         \
    static void NAME(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,    \
                     const dsib_qrow *x, float *const *yp, int n) {                        \
        typedef void (*tile_fn)(const uint8_t *, size_t, int64_t, int64_t, int64_t,        \
                                const dsib_qrow *, float *const *, int);                   \
        static const tile_fn rows[9] = {NULL,      NAME##_t1, NAME##_t2, NAME##_t3, NAME##_t4, \
                                        NULL,      NULL,      NULL,      NAME##_t8};       \
        for (int t0 = 0; t0 < n;) {                                                        \
            const int T = n - t0 >= 8 ? 8 : n - t0 > 4 ? 4 : n - t0;                       \
            rows[T](w, rb, n_in, o0, o1, x + t0, yp + t0, t0 == 0);                        \
            t0 += T;                                                                       \
        }                                                                                  \
    }
#define DSIB_QROWS_DEFINE_R(NAME, TILE, RR)                                                \
    DSIB_QTILE_FN(NAME, TILE, 1)                                                           \
    DSIB_QTILE_FN_R(NAME, TILE, 2, RR)                                                     \
    DSIB_QTILE_FN_R(NAME, TILE, 3, RR)                                                     \
    DSIB_QTILE_FN_R(NAME, TILE, 4, RR)                                                     \
    DSIB_QROWS_DISPATCH(NAME, 4)
#define DSIB_QROWS_DISPATCH(NAME, TT)                                                      \
    static void NAME(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,    \
                     const dsib_qrow *x, float *const *yp, int n) {                        \
        typedef void (*tile_fn)(const uint8_t *, size_t, int64_t, int64_t, int64_t,        \
                                const dsib_qrow *, float *const *, int);                   \
        static const tile_fn rows[5] = {NULL, NAME##_t1, NAME##_t2, NAME##_t3, NAME##_t4}; \
        for (int t0 = 0; t0 < n; t0 += (TT)) {                                             \
            const int T = n - t0 < (TT) ? n - t0 : (TT);                                   \
            rows[T](w, rb, n_in, o0, o1, x + t0, yp + t0, t0 == 0);                        \
        }                                                                                  \
    }

/* The Q8_32 lane order, the canonical order of the 32-element types on DSIB_ACT_Q8_32
 * activations (iq4.c, mxfp4.c, q4_1_q5.c; Q8_0 has its own, q8_0.c): two sets of 16 f32
 * lanes acc[2][16], zero at the start; block b (pair p = b / 2) with the product s_b of its
 * weight and activation scales (one f32 rounding) in order:
 *
 *   I_b[j] = Σ_{k<4} w[32b + 4j + k] · q[32b + 4j + k]        j < 8 (exact int32)
 *   acc[p mod 2][8·(b mod 2) + j] = fmaf(s_b, (float)I_b[j], acc[p mod 2][8·(b mod 2) + j])
 *
 * then y = dsib_reduce32(acc). AVX2 holds a set's lanes 0-7 / 8-15 in two ymm (one block
 * each); AVX-512 holds a block pair in one zmm (dpbusd of w + 128 against the signed
 * activations, each lane starting at the activation row's correction -128·Σq). One block's
 * step: */
static inline void dsib_q8_32_step_scalar(float acc[2][16], int64_t b, float s, const int8_t *wq,
                                          const int8_t *xq) {
    float *a = acc[(b >> 1) & 1] + 8 * (b & 1);
    for (int j = 0; j < 8; j++) {
        int32_t I = 0;
        for (int k = 0; k < 4; k++) I += wq[4 * j + k] * xq[4 * j + k];
        a[j] = fmaf(s, (float)I, a[j]);
    }
}

/* The scalar row kernel of a type from its one-row, one-token dot function DOT(row, n_in, x). */
#define DSIB_QROWS_SCALAR(NAME, DOT)                                                       \
    static void NAME(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,    \
                     const dsib_qrow *x, float *const *yp, int n) {                        \
        for (int64_t o = o0; o < o1; o++)                                                  \
            for (int t = 0; t < n; t++) yp[t][o] = DOT(w + (size_t)o * rb, n_in, &x[t]);   \
    }

/* int NAME(void): 1 if the CPU has FEAT (a __builtin_cpu_supports name), asked once. */
#define DSIB_CPU_FEATURE_FN(NAME, FEAT)                                                    \
    int NAME(void) {                                                                       \
        static atomic_int has = -1;                                                        \
        int v = atomic_load_explicit(&has, memory_order_relaxed);                          \
        if (v < 0) {                                                                       \
            __builtin_cpu_init();                                                          \
            v = __builtin_cpu_supports(FEAT) ? 1 : 0;                                      \
            atomic_store_explicit(&has, v, memory_order_relaxed);                          \
        }                                                                                  \
        return v;                                                                          \
    }

/* A row function that runs FAST where COND holds (a CPU feature and its test knob, checked
 * per call) and PLAIN elsewhere: the AVX-512 VNNI entries of the types with a VBMI / VBMI2
 * variant (q5_k.c). */
#define DSIB_QROWS_VARIANT(NAME, FAST, PLAIN, COND)                                        \
    static void NAME(const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,    \
                     const dsib_qrow *x, float *const *yp, int n) {                        \
        if (COND)                                                                          \
            FAST(w, rb, n_in, o0, o1, x, yp, n);                                           \
        else                                                                               \
            PLAIN(w, rb, n_in, o0, o1, x, yp, n);                                          \
    }

#endif /* DSIB_CPU_KERNELS_IMPL_H */
