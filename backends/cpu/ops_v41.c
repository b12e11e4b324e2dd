/*
 * backends/cpu/ops_v41.c — CPU implementations of the V4.1 ops (backends/backend.h,
 * "V4.1 ops" sub-section; model-spec §4.3, §4.6).
 *
 * Determinism: every output row (token) is computed by one task with a fixed operation
 * order that does not depend on how many tokens the call carries, so chunked prefill,
 * whole-prompt prefill and decode agree bit for bit (§10.4).
 */
#include "backends/cpu/ops_v41.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/kernels/kernels.h"
#include "quant/statepack.h"

#include <math.h>
#include <string.h>

/* ---- top-k with "lower position first" ties (§10.2) ---------------------------------- */

/* a is better than b: higher score, or equal score and lower index. */
static inline int better(float sa, int32_t a, float sb, int32_t b) {
    return sa > sb || (sa == sb && a < b);
}

/* Min-heap of the k best (root = worst kept). */
typedef struct topk_heap {
    int32_t *id;
    float *sc;
    uint32_t n, cap;
} topk_heap;

static void heap_sift_down(topk_heap *h, uint32_t i) {
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        /* the worst of (i, l, r) goes up */
        if (l < h->n && better(h->sc[m], h->id[m], h->sc[l], h->id[l])) m = l;
        if (r < h->n && better(h->sc[m], h->id[m], h->sc[r], h->id[r])) m = r;
        if (m == i) return;
        int32_t ti = h->id[i];
        float ts = h->sc[i];
        h->id[i] = h->id[m];
        h->sc[i] = h->sc[m];
        h->id[m] = ti;
        h->sc[m] = ts;
        i = m;
    }
}

static void heap_offer(topk_heap *h, int32_t id, float sc) {
    if (h->cap == 0) return;
    if (h->n < h->cap) {
        uint32_t i = h->n++;
        h->id[i] = id;
        h->sc[i] = sc;
        while (i > 0) { /* sift up: the worse goes up */
            uint32_t p = (i - 1) / 2;
            if (!better(h->sc[p], h->id[p], h->sc[i], h->id[i])) break;
            int32_t ti = h->id[i];
            float ts = h->sc[i];
            h->id[i] = h->id[p];
            h->sc[i] = h->sc[p];
            h->id[p] = ti;
            h->sc[p] = ts;
            i = p;
        }
        return;
    }
    if (better(sc, id, h->sc[0], h->id[0])) {
        h->id[0] = id;
        h->sc[0] = sc;
        heap_sift_down(h, 0);
    }
}

static void sort_i32(int32_t *a, uint32_t n) { /* insertion sort; n <= topk (small) */
    for (uint32_t i = 1; i < n; i++) {
        int32_t v = a[i];
        uint32_t j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

static void sort_i32_big(int32_t *a, uint32_t n) { /* heap sort for larger outputs */
    if (n < 64) {
        sort_i32(a, n);
        return;
    }
    for (uint32_t s = n / 2; s-- > 0;) {
        uint32_t i = s;
        for (;;) {
            uint32_t l = 2 * i + 1, r = l + 1, m = i;
            if (l < n && a[l] > a[m]) m = l;
            if (r < n && a[r] > a[m]) m = r;
            if (m == i) break;
            int32_t t = a[i]; a[i] = a[m]; a[m] = t;
            i = m;
        }
    }
    for (uint32_t e = n; e-- > 1;) {
        int32_t t = a[0]; a[0] = a[e]; a[e] = t;
        uint32_t i = 0;
        for (;;) {
            uint32_t l = 2 * i + 1, r = l + 1, m = i;
            if (l < e && a[l] > a[m]) m = l;
            if (r < e && a[r] > a[m]) m = r;
            if (m == i) break;
            int32_t u = a[i]; a[i] = a[m]; a[m] = u;
            i = m;
        }
    }
}

/* ---- indexer_topk_v41 ------------------------------------------------------------------ */

typedef struct idx_args {
    const float *q, *w;
    const dsib_state *keys;
    const int32_t *rows;
    uint32_t ldq, ldw, heads, hd, ratio, topk, cand_block, cand_k;
    int32_t *idx;
    const int32_t *cand_in;
    int32_t *cand_out;
    uint8_t *ws;             /* per thread slot: ws_per bytes (or the chunked layout) */
    size_t ws_per;
    uint32_t nv1;            /* score entries per row: max visible keys + 1 */
    int simd;                /* idx_simd_ok: score_keys_avx512 (2), score_keys_avx2 (1) */
    int64_t n_chunks;        /* chunked scan: IDX_CHUNK-key chunks per row */
    size_t heap_off, heap_per;
} idx_args;

/* score[c] for c in [c0, c1): Σ_h relu(q[h]·k_c)·w[h] (h ascending; each dot in index
 * order, f32). Eight keys at a time, transposed into a tile so the eight independent dots
 * run side by side (vectorisable) — each key's own operation sequence is unchanged. Packed
 * keys (statepack.h) are decoded into the tile exactly. */
static void score_keys_scalar(const idx_args *a, const float *q, const float *wt,
                              const uint8_t *keys, uint32_t c0, uint32_t c1, float *score) {
    const uint32_t hd = a->hd;
    const uint64_t krb = dsib_cpu_state_rb(a->keys);
    const int packed = a->keys->format != DSIB_STATE_F32;
    float kt[DSIB_CPU_MAX_KEY * 8], kb[DSIB_CPU_MAX_KEY];
    for (uint32_t c = c0; c < c1; c += 8) {
        uint32_t m = c1 - c < 8 ? c1 - c : 8;
        for (uint32_t l = 0; l < 8; l++) {
            if (l >= m) {
                for (uint32_t i = 0; i < hd; i++) kt[i * 8 + l] = 0.0f;
                continue;
            }
            const uint8_t *kr = keys + (uint64_t)(c + l) * krb;
            const float *k = (const float *)(const void *)kr;
            if (packed) {
                dsii_sp_unpack_row(a->keys->format, hd, a->keys->qcols, a->keys->block, kr, kb);
                k = kb;
            }
            for (uint32_t i = 0; i < hd; i++) kt[i * 8 + l] = k[i];
        }
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (uint32_t hh = 0; hh < a->heads; hh++) {
            const float *qh = q + (size_t)hh * hd;
            float d[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (uint32_t i = 0; i < hd; i++) {
                const float qi = qh[i];
                const float *kr = kt + (size_t)i * 8;
                for (uint32_t l = 0; l < 8; l++) d[l] += qi * kr[l];
            }
            for (uint32_t l = 0; l < 8; l++) s[l] += (d[l] > 0.0f ? d[l] : 0.0f) * wt[hh];
        }
        for (uint32_t l = 0; l < m; l++) score[c + l] = s[l];
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define IDX_SIMD 1
/* Included outside the target regions: inside the AVX-512 one, gcc gave the intrinsics that
 * region's target, and the AVX2 region below could not inline them. */
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#pragma GCC optimize("fp-contract=off")
#endif

/* The AVX-512 path of score_keys for E2M1 / UE8M0 keys (V4.1's index keys, §4.3): sixteen
 * keys per tile, one per lane, the same operations as the scalar path lane by lane
 * (products rounded before their sums — no FMA —, dims ascending, heads ascending; relu as
 * max(d, +0), which gives +0 for -0 and NaN like the scalar d > 0 ? d : 0). The tile is
 * decoded straight from the packed rows: one dword gather gives 8 dims' codes of the 16
 * keys, the E2M1 value comes from a 16-entry table (vpermps) times the block's power of two
 * (exact, the same product as dsii_sp_decode8). */
#define IDX_AI static inline __attribute__((always_inline))

IDX_AI __m512 idx_ue8m0_ps(__m512i e) {
    /* 2^(e−127): e << 23; e = 0: 2^-127 = 0x00400000 */
    const __m512i b = _mm512_slli_epi32(e, 23);
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(
        b, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000)));
}

IDX_AI void idx_heads_avx512(const float *q, uint32_t hd, const float *kt, const float *wt,
                             __m512 *s, const int NH) {
    __m512 d[8];
    for (int h = 0; h < NH; h++) d[h] = _mm512_setzero_ps();
    for (uint32_t i = 0; i < hd; i++) {
        const __m512 k = _mm512_load_ps(kt + 16 * (size_t)i);
        for (int h = 0; h < NH; h++)
            d[h] = _mm512_add_ps(d[h], _mm512_mul_ps(_mm512_set1_ps(q[(size_t)h * hd + i]), k));
    }
    for (int h = 0; h < NH; h++)
        *s = _mm512_add_ps(*s, _mm512_mul_ps(_mm512_max_ps(d[h], _mm512_setzero_ps()),
                                             _mm512_set1_ps(wt[h])));
}

/* One head of V4's indexer score (backends/cpu/ops.c dot_fixed: dim i into lane i mod 8 of
 * its key's accumulators, the lanes combined as ((0+1)+(2+3))+((4+5)+(6+7)); relu as
 * d < 0 ? 0 : d, which keeps -0 and NaN), lane by lane over 16 keys. hd % 8 == 0. */
IDX_AI void idx_head_v4_avx512(const float *q, uint32_t hd, const float *kt, float wh,
                               __m512 *s) {
    __m512 l[8];
    for (int j = 0; j < 8; j++) l[j] = _mm512_setzero_ps();
    for (uint32_t i = 0; i < hd; i += 8)
        for (int j = 0; j < 8; j++)
            l[j] = _mm512_add_ps(l[j], _mm512_mul_ps(_mm512_set1_ps(q[i + (uint32_t)j]),
                                                     _mm512_load_ps(kt + 16 * (size_t)(i + (uint32_t)j))));
    __m512 d = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(l[0], l[1]), _mm512_add_ps(l[2], l[3])),
                             _mm512_add_ps(_mm512_add_ps(l[4], l[5]), _mm512_add_ps(l[6], l[7])));
    d = _mm512_mask_mov_ps(d, _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_LT_OQ),
                           _mm512_setzero_ps());
    *s = _mm512_add_ps(*s, _mm512_mul_ps(d, _mm512_set1_ps(wh)));
}

/* order 0: V4.1's score (dims in order); 1: V4's (dot_fixed lanes). */
static void score_keys_avx512(const dsib_state *ks, uint32_t H, uint32_t hd, int order,
                              const float *q, const float *wt, const uint8_t *keys, uint32_t c0,
                              uint32_t c1, float *score) {
    const uint32_t block = ks->block;
    const uint64_t krb = dsib_cpu_state_rb(ks);
    const uint32_t cb = hd / 2; /* code bytes; the scales follow */
    _Alignas(64) float kt[DSIB_CPU_MAX_KEY * 16];
    const __m512 lut = _mm512_loadu_ps(dsii_sp_e2m1_lut);
    const __m512i m4 = _mm512_set1_epi32(15), mff = _mm512_set1_epi32(255);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (uint32_t c = c0; c < c1; c += 16) {
        const uint32_t m = c1 - c < 16 ? c1 - c : 16;
        const __mmask16 km = (__mmask16)(m >= 16 ? 0xFFFFu : (1u << m) - 1u);
        const uint8_t *base = keys + (uint64_t)c * krb;
        const __m512i off = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)krb));
        __m512i sw = _mm512_setzero_si512(); /* four scale bytes of the current dword */
        __m512 sc = _mm512_setzero_ps();
        for (uint32_t i = 0; i < hd; i += 8) {
            const uint32_t b = i / block;
            if (i % block == 0) {
                if (b % 4 == 0)
                    sw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, off,
                                                     base + cb + b, 1);
                sc = idx_ue8m0_ps(_mm512_and_si512(_mm512_srli_epi32(sw, 8 * (int)(b % 4)), mff));
            }
            const __m512i cw =
                _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, off, base + i / 2, 1);
            for (int j = 0; j < 8; j++) {
                const __m512i nib = _mm512_and_si512(_mm512_srli_epi32(cw, 4 * j), m4);
                _mm512_store_ps(kt + 16 * (size_t)(i + (uint32_t)j),
                                _mm512_mul_ps(_mm512_permutexvar_ps(nib, lut), sc));
            }
        }
        __m512 s = _mm512_setzero_ps();
        uint32_t h = 0;
        if (order == 1) {
            for (; h < H; h++) idx_head_v4_avx512(q + (size_t)h * hd, hd, kt, wt[h], &s);
            _mm512_mask_storeu_ps(score + c, km, s);
            continue;
        }
        for (; h + 8 <= H; h += 8) idx_heads_avx512(q + (size_t)h * hd, hd, kt, wt + h, &s, 8);
        for (; h + 4 <= H; h += 4) idx_heads_avx512(q + (size_t)h * hd, hd, kt, wt + h, &s, 4);
        for (; h < H; h++) idx_heads_avx512(q + (size_t)h * hd, hd, kt, wt + h, &s, 1);
        _mm512_mask_storeu_ps(score + c, km, s);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ---- the AVX2 form ----------------------------------------------------------------------- */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC optimize("fp-contract=off")
#endif

/* score_keys_avx512 on eight keys per tile (one per lane), the same operations lane by lane
 * (no FMA: this region has contraction off, and every product is a separate multiply).
 * The decode into the tile (measured on Zen 3, bench of 32K keys, 8 heads of 128: 37 cycles
 * per key, against 118 with one dword load per key and 8 dims, and the whole scan 110
 * against 200): 32 code bytes (64 dims) of each of the eight rows are one load, an 8 × 8
 * dword transpose gives the codes of 8 dims of the eight keys in one register, a byte
 * shuffle maps each nibble to twice its E2M1 value (an integer in −12..12), and that integer
 * times half the block's power of two is the value. Exact: the same real number as
 * dsii_sp_decode8's value × scale, rounded once (half of 2^(e−127) is exact, 2^-128 for
 * e = 0 included). The one difference is the sign of a zero value (code 8, −0 in the table,
 * +0 here), which no score can see: every accumulator starts at +0, and x + (±0) = x for
 * every x but +0, where it is +0 either way. */
IDX_AI __m256 idx_ue8m0_ps256(__m256i e) {
    /* 2^(e−127): e << 23; e = 0: 2^-127 = 0x00400000 */
    return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000),
                                                  _mm256_cmpeq_epi32(e, _mm256_setzero_si256())));
}

/* The dword at byte off of eight rows krb bytes apart. */
IDX_AI __m256i idx_dwords8(const uint8_t *const r[8], uint32_t off) {
    uint32_t v[8];
    for (uint32_t l = 0; l < 8; l++) memcpy(&v[l], r[l] + off, 4);
    return _mm256_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5],
                             (int)v[6], (int)v[7]);
}

/* x[d] := the d-th dword of every x[l] (an 8 × 8 dword transpose). */
IDX_AI void idx_transpose8(__m256i x[8]) {
    __m256i t[8], u[8];
    for (int k = 0; k < 4; k++) {
        t[2 * k] = _mm256_unpacklo_epi32(x[2 * k], x[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(x[2 * k], x[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        u[4 * k] = _mm256_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    for (int d = 0; d < 4; d++) {
        x[d] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x20);
        x[d + 4] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x31);
    }
}

/* Eight dims (i .. i+7) of the eight keys into the tile: cw holds each key's four code bytes
 * (dims i+2j in the low nibble of byte j, i+2j+1 in the high one), hs half the scale. */
IDX_AI void idx_decode8_avx2(__m256i cw, __m256 hs, float *kt) {
    const __m256i twice = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                           0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_shuffle_epi8(twice, _mm256_and_si256(cw, m4));
    const __m256i hi = _mm256_shuffle_epi8(twice, _mm256_and_si256(_mm256_srli_epi16(cw, 4), m4));
    for (int j = 0; j < 4; j++) {
        const __m256i a = _mm256_srai_epi32(_mm256_slli_epi32(lo, 24 - 8 * j), 24);
        const __m256i c = _mm256_srai_epi32(_mm256_slli_epi32(hi, 24 - 8 * j), 24);
        _mm256_store_ps(kt + 8 * (2 * j), _mm256_mul_ps(_mm256_cvtepi32_ps(a), hs));
        _mm256_store_ps(kt + 8 * (2 * j + 1), _mm256_mul_ps(_mm256_cvtepi32_ps(c), hs));
    }
}

/* At dim i (a multiple of 8) where a block starts: its half scale into hs (first the dword of
 * four scale bytes that holds it into sw, when it is the dword's first). */
IDX_AI void idx_scale_at(const uint8_t *const r[8], uint32_t cb, uint32_t block, uint32_t i,
                         __m256i *sw, __m256 *hs) {
    if (i % block != 0) return;
    const uint32_t b = i / block;
    if (b % 4 == 0) *sw = idx_dwords8(r, cb + b);
    *hs = _mm256_mul_ps(idx_ue8m0_ps256(_mm256_and_si256(
                            _mm256_srlv_epi32(*sw, _mm256_set1_epi32(8 * (int)(b % 4))),
                            _mm256_set1_epi32(255))),
                        _mm256_set1_ps(0.5f));
}

/* The tile of eight keys (rows r[0..7]; repeated rows past the caller's count are decoded
 * and never stored): kt[8 i + l] = dim i of key l. block % 8 == 0, (hd / block) % 4 == 0.
 * 64 dims at a time by one transpose, a remainder of 8 at a time. */
static void idx_tile_avx2(const uint8_t *const r[8], uint32_t hd, uint32_t block, float *kt) {
    const uint32_t cb = hd / 2; /* code bytes; the scales follow */
    __m256i sw = _mm256_setzero_si256();
    __m256 hs = _mm256_setzero_ps();
    for (uint32_t i = 0; i < hd;) {
        if (i % 64 == 0 && i + 64 <= hd) {
            __m256i x[8];
            for (int l = 0; l < 8; l++) x[l] = _mm256_loadu_si256((const __m256i *)(const void *)(r[l] + i / 2));
            idx_transpose8(x);
            for (int d = 0; d < 8; d++, i += 8) {
                idx_scale_at(r, cb, block, i, &sw, &hs);
                idx_decode8_avx2(x[d], hs, kt + 8 * (size_t)i);
            }
        } else {
            idx_scale_at(r, cb, block, i, &sw, &hs);
            idx_decode8_avx2(idx_dwords8(r, i / 2), hs, kt + 8 * (size_t)i);
            i += 8;
        }
    }
}

IDX_AI void idx_heads_avx2(const float *q, uint32_t hd, const float *kt, const float *wt,
                           __m256 *s, const int NH) {
    __m256 d[8];
    for (int h = 0; h < NH; h++) d[h] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < hd; i++) {
        const __m256 k = _mm256_load_ps(kt + 8 * (size_t)i);
        for (int h = 0; h < NH; h++)
            d[h] = _mm256_add_ps(d[h], _mm256_mul_ps(_mm256_broadcast_ss(q + (size_t)h * hd + i), k));
    }
    for (int h = 0; h < NH; h++)
        *s = _mm256_add_ps(*s, _mm256_mul_ps(_mm256_max_ps(d[h], _mm256_setzero_ps()),
                                             _mm256_set1_ps(wt[h])));
}

/* idx_heads_avx2 on two tiles (sixteen keys) at once: each query broadcast serves both (on
 * Zen 3 the loads, not the arithmetic, bound the one-tile form: 70 against 80 cycles per key). */
IDX_AI void idx_heads2_avx2(const float *q, uint32_t hd, const float *kt, const float *kt2,
                            const float *wt, __m256 *s, __m256 *s2, const int NH) {
    __m256 d[4], e[4];
    for (int h = 0; h < NH; h++) d[h] = e[h] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < hd; i++) {
        const __m256 k = _mm256_load_ps(kt + 8 * (size_t)i), k2 = _mm256_load_ps(kt2 + 8 * (size_t)i);
        for (int h = 0; h < NH; h++) {
            const __m256 qb = _mm256_broadcast_ss(q + (size_t)h * hd + i);
            d[h] = _mm256_add_ps(d[h], _mm256_mul_ps(qb, k));
            e[h] = _mm256_add_ps(e[h], _mm256_mul_ps(qb, k2));
        }
    }
    for (int h = 0; h < NH; h++) {
        const __m256 w = _mm256_set1_ps(wt[h]);
        *s = _mm256_add_ps(*s, _mm256_mul_ps(_mm256_max_ps(d[h], _mm256_setzero_ps()), w));
        *s2 = _mm256_add_ps(*s2, _mm256_mul_ps(_mm256_max_ps(e[h], _mm256_setzero_ps()), w));
    }
}

/* idx_head_v4_avx512 over eight keys. */
IDX_AI void idx_head_v4_avx2(const float *q, uint32_t hd, const float *kt, float wh, __m256 *s) {
    __m256 l[8];
    for (int j = 0; j < 8; j++) l[j] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < hd; i += 8)
        for (int j = 0; j < 8; j++)
            l[j] = _mm256_add_ps(l[j], _mm256_mul_ps(_mm256_broadcast_ss(q + i + (uint32_t)j),
                                                     _mm256_load_ps(kt + 8 * (size_t)(i + (uint32_t)j))));
    __m256 d = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3])),
                             _mm256_add_ps(_mm256_add_ps(l[4], l[5]), _mm256_add_ps(l[6], l[7])));
    d = _mm256_blendv_ps(d, _mm256_setzero_ps(), _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_LT_OQ));
    *s = _mm256_add_ps(*s, _mm256_mul_ps(d, _mm256_set1_ps(wh)));
}

/* idx_head_v4_avx2 on two tiles: each query broadcast serves both, the lane accumulators in
 * two halves (dims ≡ 0..3 mod 8, then 4..7: each lane's own chain is unchanged), the first
 * half's pair sums ((l0 + l1) + (l2 + l3)) kept while the second runs. */
IDX_AI void idx_head_v4_2_avx2(const float *q, uint32_t hd, const float *kt, const float *kt2,
                               float wh, __m256 *s, __m256 *s2) {
    __m256 lo, lo2;
    {
        __m256 a[4], b[4];
        for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_ps();
        for (uint32_t i = 0; i < hd; i += 8)
            for (int j = 0; j < 4; j++) {
                const __m256 qb = _mm256_broadcast_ss(q + i + (uint32_t)j);
                a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(qb, _mm256_load_ps(kt + 8 * (size_t)(i + (uint32_t)j))));
                b[j] = _mm256_add_ps(b[j], _mm256_mul_ps(qb, _mm256_load_ps(kt2 + 8 * (size_t)(i + (uint32_t)j))));
            }
        lo = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        lo2 = _mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3]));
    }
    __m256 a[4], b[4];
    for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_ps();
    for (uint32_t i = 0; i < hd; i += 8)
        for (int j = 0; j < 4; j++) {
            const __m256 qb = _mm256_broadcast_ss(q + i + 4 + (uint32_t)j);
            a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(qb, _mm256_load_ps(kt + 8 * (size_t)(i + 4 + (uint32_t)j))));
            b[j] = _mm256_add_ps(b[j], _mm256_mul_ps(qb, _mm256_load_ps(kt2 + 8 * (size_t)(i + 4 + (uint32_t)j))));
        }
    __m256 d = _mm256_add_ps(lo, _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    __m256 d2 = _mm256_add_ps(lo2, _mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
    d = _mm256_blendv_ps(d, _mm256_setzero_ps(), _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_LT_OQ));
    d2 = _mm256_blendv_ps(d2, _mm256_setzero_ps(), _mm256_cmp_ps(d2, _mm256_setzero_ps(), _CMP_LT_OQ));
    *s = _mm256_add_ps(*s, _mm256_mul_ps(d, _mm256_set1_ps(wh)));
    *s2 = _mm256_add_ps(*s2, _mm256_mul_ps(d2, _mm256_set1_ps(wh)));
}

/* score[c0 .. c1) from m (<= 8) lanes of s. */
IDX_AI void idx_store_avx2(float *score, __m256 s, uint32_t m) {
    if (m == 8) {
        _mm256_storeu_ps(score, s);
    } else {
        const __m256i km = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(score, km, s);
    }
}

/* order 0: V4.1's score (dims in order); 1: V4's (dot_fixed lanes). Sixteen keys per step
 * (two tiles) where both fit the 32 KiB tile buffer, else eight. */
static void score_keys_avx2(const dsib_state *ks, uint32_t H, uint32_t hd, int order,
                            const float *q, const float *wt, const uint8_t *keys, uint32_t c0,
                            uint32_t c1, float *score) {
    const uint64_t krb = dsib_cpu_state_rb(ks);
    _Alignas(32) float kt[DSIB_CPU_MAX_KEY * 8];
    const uint32_t step = 2 * hd <= DSIB_CPU_MAX_KEY ? 16 : 8;
    float *kt2 = kt + (size_t)8 * hd;
    for (uint32_t c = c0; c < c1; c += step) {
        const uint32_t m = c1 - c < step ? c1 - c : step;
        const uint8_t *r[16];
        for (uint32_t l = 0; l < 16; l++) r[l] = keys + (uint64_t)(c + (l < m ? l : 0)) * krb;
        idx_tile_avx2(r, hd, ks->block, kt);
        __m256 s = _mm256_setzero_ps(), s2 = _mm256_setzero_ps();
        uint32_t h = 0;
        if (m > 8) {
            idx_tile_avx2(r + 8, hd, ks->block, kt2);
            if (order == 1) {
                for (; h < H; h++) idx_head_v4_2_avx2(q + (size_t)h * hd, hd, kt, kt2, wt[h], &s, &s2);
            } else {
                for (; h + 4 <= H; h += 4) idx_heads2_avx2(q + (size_t)h * hd, hd, kt, kt2, wt + h, &s, &s2, 4);
                for (; h < H; h++) idx_heads2_avx2(q + (size_t)h * hd, hd, kt, kt2, wt + h, &s, &s2, 1);
            }
            idx_store_avx2(score + c, s, 8);
            idx_store_avx2(score + c + 8, s2, m - 8);
            continue;
        }
        if (order == 1) {
            for (; h < H; h++) idx_head_v4_avx2(q + (size_t)h * hd, hd, kt, wt[h], &s);
        } else {
            for (; h + 8 <= H; h += 8) idx_heads_avx2(q + (size_t)h * hd, hd, kt, wt + h, &s, 8);
            for (; h + 4 <= H; h += 4) idx_heads_avx2(q + (size_t)h * hd, hd, kt, wt + h, &s, 4);
            for (; h < H; h++) idx_heads_avx2(q + (size_t)h * hd, hd, kt, wt + h, &s, 1);
        }
        idx_store_avx2(score + c, s, m);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
#define IDX_SIMD 0
#endif

/* The SIMD paths take E2M1 / UE8M0 rows without an f32 tail whose scale bytes are whole
 * dwords (every row read stays inside its own bytes): 2 = AVX-512, 1 = AVX2, 0 = none. */
static int idx_simd_ok(const dsib_state *k, uint32_t hd) {
    if (!IDX_SIMD || k->format != DSIB_STATE_E2M1_UE8M0 || k->qcols != hd || hd % 8 != 0 ||
        k->block % 8 != 0 || (hd / k->block) % 4 != 0 || hd > DSIB_CPU_MAX_KEY)
        return 0;
    const int32_t isa = dsib_cpu_ops_isa();
    return isa >= DSIB_ISA_AVX512 ? 2 : isa >= DSIB_ISA_AVX2 ? 1 : 0;
}

int dsib_cpu_indexer_v4_scan(const dsib_state *keys, uint32_t heads, uint32_t hd, const float *q,
                              const float *w, const uint8_t *slot_keys, uint32_t c0, uint32_t c1,
                              float *score) {
#if IDX_SIMD
    const int simd = idx_simd_ok(keys, hd);
    if (!simd) return 0;
    if (simd == 2)
        score_keys_avx512(keys, heads, hd, 1, q, w, slot_keys, c0, c1, score);
    else
        score_keys_avx2(keys, heads, hd, 1, q, w, slot_keys, c0, c1, score);
    return 1;
#else
    (void)keys, (void)heads, (void)hd, (void)q, (void)w, (void)slot_keys, (void)c0, (void)c1,
        (void)score;
    return 0;
#endif
}

static void score_keys(const idx_args *a, const float *q, const float *wt, const uint8_t *keys,
                       uint32_t c0, uint32_t c1, float *score) {
#if IDX_SIMD
    if (a->simd == 2) {
        score_keys_avx512(a->keys, a->heads, a->hd, 0, q, wt, keys, c0, c1, score);
        return;
    }
    if (a->simd == 1) {
        score_keys_avx2(a->keys, a->heads, a->hd, 0, q, wt, keys, c0, c1, score);
        return;
    }
#endif
    score_keys_scalar(a, q, wt, keys, c0, c1, score);
}

/* Scores of row t's visible keys [c0, c1) into score[] (the masked index sources: only their
 * candidate blocks, and only by the task with c0 = 0). */
static void idx_score(const idx_args *a, int64_t t, uint32_t c0, uint32_t c1, float *score) {
    const int32_t *row = a->rows + (size_t)t * DSIB_ROW_WORDS;
    const uint32_t nvis = (uint32_t)((row[DSIB_ROW_POS] + 1) / (int64_t)a->ratio);
    if (c1 > nvis) c1 = nvis;
    const float *q = a->q + (size_t)t * a->ldq;
    const float *wt = a->w + (size_t)t * a->ldw;
    const uint8_t *keys = dsib_cpu_state_bytes(a->keys, (uint32_t)row[DSIB_ROW_SLOT], 0);
    if (a->cand_in && !a->cand_out) {
        /* masked index source: only the positions of its candidate blocks can be chosen, so
         * only they are scored (the others are −inf whatever their keys) — the scan is the
         * candidate blocks' size, not the depth */
        if (c0 > 0) return;
        const int32_t *cin = a->cand_in + (size_t)t * a->cand_k;
        for (uint32_t j = 0; j < a->cand_k && cin[j] >= 0; j++) {
            uint64_t b0 = (uint64_t)cin[j] * a->cand_block, b1 = b0 + a->cand_block;
            if (b0 >= nvis) continue;
            if (b1 > nvis) b1 = nvis;
            score_keys(a, q, wt, keys, (uint32_t)b0, (uint32_t)b1, score);
        }
    } else if (c0 < c1) {
        score_keys(a, q, wt, keys, c0, c1, score);
    }
}

/* Candidate blocks and top-k of row t from its scores. */
static void idx_select(const idx_args *a, int64_t t, const float *score, uint8_t *heap_mem) {
    const int32_t *row = a->rows + (size_t)t * DSIB_ROW_WORDS;
    const int64_t p = row[DSIB_ROW_POS];
    const uint32_t nvis = (uint32_t)((p + 1) / (int64_t)a->ratio);
    int32_t *idx = a->idx + (size_t)t * a->topk;
    int32_t *cout = a->cand_out ? a->cand_out + (size_t)t * a->cand_k : NULL;
    for (uint32_t i = 0; i < a->topk; i++) idx[i] = -1;
    if (cout)
        for (uint32_t i = 0; i < a->cand_k; i++) cout[i] = -1;
    if (nvis == 0) return;
    const uint32_t heap_cap = a->topk > a->cand_k ? a->topk : a->cand_k;
    topk_heap h;
    h.id = (int32_t *)(void *)heap_mem;
    h.sc = (float *)(void *)(heap_mem + (size_t)heap_cap * sizeof(int32_t));

    /* Candidate blocks (§4.3): block max, newest block forced +inf, top cand_k by score
     * (> −inf only), ascending. */
    if (cout) {
        const uint32_t cb = a->cand_block;
        const uint32_t n_blocks = (nvis + cb - 1) / cb;
        h.n = 0;
        h.cap = a->cand_k < n_blocks ? a->cand_k : n_blocks;
        for (uint32_t b = 0; b < n_blocks; b++) {
            float m = -INFINITY;
            uint32_t end = (b + 1) * cb < nvis ? (b + 1) * cb : nvis;
            for (uint32_t c = b * cb; c < end; c++) m = score[c] > m ? score[c] : m;
            if (b == n_blocks - 1) m = INFINITY;
            if (m > -INFINITY) heap_offer(&h, (int32_t)b, m);
        }
        for (uint32_t i = 0; i < h.n; i++) cout[i] = h.id[i];
        sort_i32_big(cout, h.n);
    }

    /* Own top-k over the allowed positions. */
    h.n = 0;
    h.cap = a->topk;
    if (a->cand_in) {
        const int32_t *cin = a->cand_in + (size_t)t * a->cand_k;
        uint32_t j = 0;
        for (uint32_t c = 0; c < nvis; c++) {
            int32_t b = (int32_t)(c / a->cand_block);
            while (j < a->cand_k && cin[j] >= 0 && cin[j] < b) j++;
            if (j >= a->cand_k || cin[j] != b) continue; /* masked out: −inf, never chosen */
            heap_offer(&h, (int32_t)c, score[c]);
        }
    } else {
        for (uint32_t c = 0; c < nvis; c++) heap_offer(&h, (int32_t)c, score[c]);
    }
    for (uint32_t i = 0; i < h.n; i++) idx[i] = h.id[i];
    sort_i32_big(idx, h.n);
}

/* One task per row: its scores in the slot's own workspace, then its selection. */
static void idx_task(void *arg, int64_t t, int32_t slot) {
    idx_args *a = (idx_args *)arg;
    uint8_t *mem = a->ws + (size_t)slot * a->ws_per;
    idx_score(a, t, 0, UINT32_MAX, (float *)(void *)mem);
    idx_select(a, t, (const float *)(void *)mem, mem + (size_t)a->nv1 * sizeof(float));
}

/* Few rows over many keys (decode): the scan is split into chunks of IDX_CHUNK keys over the
 * threads, scores into one array per row; then one selection task per row. A key's score
 * does not depend on the chunk that computed it. */
#define IDX_CHUNK 2048u
static void idx_chunk_task(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    idx_args *a = (idx_args *)arg;
    const int64_t t = task / a->n_chunks;
    const uint32_t c0 = (uint32_t)(task % a->n_chunks) * IDX_CHUNK;
    idx_score(a, t, c0, c0 + IDX_CHUNK, (float *)(void *)(a->ws + (size_t)t * a->nv1 * sizeof(float)));
}
static void idx_select_task(void *arg, int64_t t, int32_t slot) {
    idx_args *a = (idx_args *)arg;
    idx_select(a, t, (const float *)(void *)(a->ws + (size_t)t * a->nv1 * sizeof(float)),
               a->ws + a->heap_off + (size_t)slot * a->heap_per);
}

/* Scores of keys [c0, c1) of one slot (tests: the SIMD and scalar paths give the same bits). */
void dsib_cpu_indexer_v41_scores(const float *q, const float *w, const dsib_state *keys,
                                 uint32_t slot, uint32_t heads, uint32_t hd, uint32_t c0,
                                 uint32_t c1, float *score) {
    idx_args a;
    memset(&a, 0, sizeof a);
    a.keys = keys;
    a.heads = heads;
    a.hd = hd;
    a.simd = idx_simd_ok(keys, hd);
    score_keys(&a, q, w, dsib_cpu_state_bytes(keys, slot, 0), c0, c1, score);
}

dsi_status dsib_cpu_indexer_topk_v41(dsib_stream *strm, dsib_view q, uint32_t ldq,
                                     dsib_view w, uint32_t ldw, const dsib_state *keys,
                                     uint32_t heads, uint32_t hd, dsib_view rows, uint32_t n,
                                     uint32_t ratio, uint32_t topk, dsib_view idx,
                                     dsib_view cand_in, dsib_view cand_out, uint32_t cand_block,
                                     uint32_t cand_k) {
    if (n == 0) return DSI_OK;
    dsib_instance *inst = strm->inst;
    if (!q.buf || !w.buf || !idx.buf || ratio == 0 ||
        ((cand_in.buf || cand_out.buf) && (cand_block == 0 || cand_k == 0)))
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    dsi_status st = dsib_cpu_state_check_packed(keys, hd);
    if (st == DSI_OK && hd > DSIB_CPU_MAX_KEY) st = DSI_ERR_UNSUPPORTED;
    if (st == DSI_OK) st = dsib_cpu_rows_check(rows, n, keys->slots);
    if (st != DSI_OK) return dsib_cpu_ret(strm, st);
    int64_t maxp = 0;
    for (uint32_t t = 0; t < n; t++) {
        int64_t p = dsib_cpu_row(rows, t)[DSIB_ROW_POS] + 1;
        if (p > maxp) maxp = p;
    }
    if (maxp / ratio > (int64_t)keys->rows) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    idx_args a;
    memset(&a, 0, sizeof a);
    a.q = dsib_cpu_f32(q);
    a.w = dsib_cpu_f32(w);
    a.keys = keys;
    a.rows = dsib_cpu_i32(rows);
    a.ldq = ldq;
    a.ldw = ldw;
    a.heads = heads;
    a.hd = hd;
    a.ratio = ratio;
    a.topk = topk;
    a.cand_block = cand_block;
    a.cand_k = (cand_in.buf || cand_out.buf) ? cand_k : 0;
    a.idx = dsib_cpu_i32(idx);
    a.cand_in = cand_in.buf ? dsib_cpu_i32(cand_in) : NULL;
    a.cand_out = cand_out.buf ? dsib_cpu_i32(cand_out) : NULL;
    a.simd = idx_simd_ok(keys, hd);
    /* ws: per thread, scores [maxp/ratio + 1] then a heap of max(topk, cand_k) (id, score);
     * chunked: scores per row, then the heaps per thread */
    uint32_t heap_cap = a.topk > a.cand_k ? a.topk : a.cand_k;
    a.nv1 = (uint32_t)(maxp / ratio + 1);
    size_t nt = (size_t)dsib_threadpool_n_threads(inst->pool);
    const size_t heap_bytes = (size_t)heap_cap * 8;
    if (nt > 1 && (size_t)n < nt && a.nv1 > 2 * IDX_CHUNK && !(a.cand_in && !a.cand_out)) {
        a.n_chunks = (int64_t)((a.nv1 + IDX_CHUNK - 1) / IDX_CHUNK);
        a.heap_off = ((size_t)n * a.nv1 * sizeof(float) + 63) & ~(size_t)63;
        a.heap_per = (heap_bytes + 63) & ~(size_t)63;
        a.ws = dsib_cpu_ws(strm, a.heap_off + a.heap_per * nt);
        if (!a.ws) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
        dsib_parallel_for(inst->pool, (int64_t)n * a.n_chunks, idx_chunk_task, &a);
        dsib_parallel_for(inst->pool, n, idx_select_task, &a);
        return DSI_OK;
    }
    a.ws_per = ((size_t)a.nv1 * sizeof(float) + heap_bytes + 63) & ~(size_t)63;
    a.ws = dsib_cpu_ws(strm, a.ws_per * nt);
    if (!a.ws) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    dsib_parallel_for(inst->pool, n, idx_task, &a);
    return DSI_OK;
}

/* ---- engram_gate ----------------------------------------------------------------------- */

typedef struct gate_args {
    float *X;
    const float *kv;
    uint32_t n_hc, D, ldkv;
    const float *w; /* [n_hc][D] = qw ⊙ kw */
    float eps;
} gate_args;

static void gate_task(void *arg, int64_t t, int32_t slot) {
    (void)slot;
    gate_args *a = (gate_args *)arg;
    const uint32_t D = a->D;
    float *X = a->X + (size_t)t * a->n_hc * D;
    const float *kv = a->kv + (size_t)t * a->ldkv;
    const float *value = kv + (size_t)a->n_hc * D;
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    for (uint32_t h = 0; h < a->n_hc; h++) {
        float *x = X + (size_t)h * D;
        const float *key = kv + (size_t)h * D;
        const float *w = a->w + (size_t)h * D;
        float sx = 0.0f, sk = 0.0f, c = 0.0f;
        for (uint32_t d = 0; d < D; d++) {
            sx += x[d] * x[d];
            sk += key[d] * key[d];
            c += x[d] * w[d] * key[d];
        }
        float rx = 1.0f / sqrtf(sx / (float)D + a->eps);
        float rk = 1.0f / sqrtf(sk / (float)D + a->eps);
        float dot = c * rx * rk * inv_sqrt_d;
        float mag = sqrtf(fabsf(dot) > 1e-6f ? fabsf(dot) : 1e-6f);
        float sgn = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
        float g = 1.0f / (1.0f + expf(-(sgn * mag)));
        for (uint32_t d = 0; d < D; d++) x[d] += g * value[d];
    }
}

dsi_status dsib_cpu_engram_gate(dsib_stream *strm, dsib_view X, uint32_t n, uint32_t n_hc,
                                uint32_t D, dsib_view kv, uint32_t ldkv, const dsib_weight *qw,
                                const dsib_weight *kw, float eps) {
    dsib_instance *inst = strm->inst;
    if (n == 0) return DSI_OK;
    if (!inst || !X.buf || !kv.buf || !qw || !kw || n_hc == 0 || D == 0 ||
        ldkv < (n_hc + 1) * D || qw->ne[0] != (int64_t)D || kw->ne[0] != (int64_t)D ||
        qw->ne[1] < (int64_t)n_hc || kw->ne[1] < (int64_t)n_hc)
        return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    size_t cnt = (size_t)n_hc * D;
    /* ws: qw ⊙ kw [n_hc][D] and one row */
    float *w = (float *)dsib_cpu_ws(strm, 2 * cnt * sizeof(float));
    if (!w) return dsib_cpu_ret(strm, DSI_ERR_INVALID_ARGUMENT);
    float *tmp = w + cnt;
    dsi_status st = DSI_OK;
    for (uint32_t h = 0; h < n_hc && st == DSI_OK; h++) {
        st = dsib_cpu_weight_row(qw, 0, h, w + (size_t)h * D);
        if (st == DSI_OK) st = dsib_cpu_weight_row(kw, 0, h, tmp);
        /* only the product q_weight ⊙ k_weight enters the model (§4.6 step 3) */
        for (uint32_t d = 0; st == DSI_OK && d < D; d++) w[(size_t)h * D + d] *= tmp[d];
    }
    if (st == DSI_OK) {
        gate_args a = {dsib_cpu_f32(X), dsib_cpu_f32(kv), n_hc, D, ldkv, w, eps};
        dsib_parallel_for(inst->pool, n, gate_task, &a);
    }
    return dsib_cpu_ret(strm, st);
}
