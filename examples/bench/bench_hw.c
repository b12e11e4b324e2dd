/*
 * dsinfer-bench: the limits a result is compared against, measured by the same program in
 * the same run (design.md "Performance method"): memory read bandwidth (decode is bound by
 * the bytes of weights read per token) and FMA peak (prefill is bound by arithmetic).
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_hw.h"

#include "backends/cpu/kernels/kernels.h"
#include "base/base.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_X86 1
#endif

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- read bandwidth ---------------------------------------------------------------------- */

#define BW_CHUNK (1u << 20) /* buffer granularity */

/* Two task sizes are tried and the best kept: 1 MiB (long streams) and 32 KiB (about what a
 * matmul task reads; several prefetch streams in flight), so the limit is not set by one
 * access pattern the kernels do not share. */
typedef struct bw_job {
    const uint8_t *buf;
    size_t bytes;
    size_t chunk;
    int isa;
    int cpu_clock;       /* this round reads the tasks' CPU clocks (and is not timed) */
    atomic_llong cpu_ns; /* the tasks' own thread CPU time */
    uint64_t sink[1024];
} bw_job;

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 8 <= n / 8; i += 8) {
        a ^= q[i] ^ q[i + 4];
        b ^= q[i + 1] ^ q[i + 5];
        c ^= q[i + 2] ^ q[i + 6];
        d ^= q[i + 3] ^ q[i + 7];
    }
    return a ^ b ^ c ^ d;
}

#ifdef BENCH_X86
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)o, a);
    return o[0] ^ o[1] ^ o[2] ^ o[3];
}
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512((const void *)(p + i + 64)));
        c = _mm512_xor_si512(c, _mm512_load_si512((const void *)(p + i + 128)));
        d = _mm512_xor_si512(d, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    uint64_t o[8];
    _mm512_storeu_si512((void *)o, a);
    return o[0] ^ o[1] ^ o[2] ^ o[3] ^ o[4] ^ o[5] ^ o[6] ^ o[7];
}
#endif

/* This thread's CPU time in ns: exact for the calling thread (getrusage's sum over the
 * process can lag by a tick for threads running on other CPUs, which inflated the
 * millisecond probes' per-CPU-time rates up to twofold). */
static long long thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void bw_task(void *arg, int64_t task, int32_t slot) {
    bw_job *j = arg;
    const long long c0 = j->cpu_clock ? thread_cpu_ns() : 0;
    size_t off = (size_t)task * j->chunk;
    size_t n = j->bytes - off < j->chunk ? j->bytes - off : j->chunk;
    uint64_t v;
#ifdef BENCH_X86
    if (j->isa == DSIB_ISA_AVX512)
        v = read_avx512(j->buf + off, n);
    else if (j->isa == DSIB_ISA_AVX2)
        v = read_avx2(j->buf + off, n);
    else
#endif
        v = read_scalar(j->buf + off, n);
    j->sink[slot & 1023] ^= v;
    if (j->cpu_clock) atomic_fetch_add_explicit(&j->cpu_ns, thread_cpu_ns() - c0, memory_order_relaxed);
}

/* The probes' vector width: the kernels' ISA, with AVX-512 VNNI and AMX probed as AVX-512
 * (they add integer dot products only; the f32 FMA and load widths are AVX-512's). */
static int probe_isa(void) {
    int isa = dsib_kern_table_get()->isa;
    return isa >= DSIB_ISA_AVX512VNNI ? DSIB_ISA_AVX512 : isa;
}

double bench_cpu_seconds(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

double bench_read_bandwidth(dsib_threadpool *pool, size_t bytes, int reps, double *per_cpu) {
    bytes = (bytes + BW_CHUNK - 1) / BW_CHUNK * BW_CHUNK;
    /* huge pages where the kernel gives them: the weights they bound are in such memory */
    dsii_bigbuf bb;
    if (!dsii_bigbuf_alloc(NULL, bytes, 4096, &bb)) return 0;
    uint8_t *buf = bb.p;
    for (size_t i = 0; i < bytes; i += 64) memset(buf + i, (int)(i >> 12), 64);
    bw_job *j = calloc(1, sizeof *j);
    if (!j) {
        dsii_bigbuf_free(NULL, &bb);
        return 0;
    }
    j->buf = buf;
    j->bytes = bytes;
    j->isa = probe_isa();
    double best = 0, best_cpu = 0;
    const int32_t nt = dsib_threadpool_n_threads(pool);
    /* Rounds cycle through: 1 MiB tasks, 32 KiB tasks (both timed by the wall clock), then
     * one of the two with the tasks' CPU clocks read (for the per-CPU-time figure only: a
     * thread CPU clock is a system call, over a microsecond in some guests, which would
     * lower the wall-clock figure by several per cent with 32 KiB tasks). */
    for (int r = 0; r < 3 * (reps + 1); r++) {
        const int kind = r % 3;
        j->cpu_clock = kind == 2;
        j->chunk = kind == 1 || (kind == 2 && (r / 3) % 2) ? (size_t)32768 : (size_t)BW_CHUNK;
        atomic_store(&j->cpu_ns, 0);
        double t0 = bench_now();
        dsib_parallel_for(pool, (int64_t)(bytes / j->chunk), bw_task, j);
        double dt = bench_now() - t0, dc = (double)atomic_load(&j->cpu_ns) * 1e-9;
        double gbs = (double)bytes / dt * 1e-9;
        double gbs_cpu = dc > 0 ? (double)bytes * nt / dc * 1e-9 : 0;
        if (r < 3) continue; /* the first cycle warms up (page tables, clocks) */
        if (!j->cpu_clock && gbs > best) best = gbs;
        if (j->cpu_clock && gbs_cpu > best_cpu) best_cpu = gbs_cpu;
    }
    if (per_cpu) *per_cpu = best_cpu;
    uint64_t s = 0;
    for (int i = 0; i < 1024; i++) s ^= j->sink[i];
    if (s == 0x5555) best += 1e-12; /* keep the reads observable */
    free(j);
    dsii_bigbuf_free(NULL, &bb);
    return best;
}

/* ---- FMA peak ------------------------------------------------------------------------------ */

#define FMA_ITERS 2000000

typedef struct fma_job {
    int isa;
    atomic_llong cpu_ns; /* the tasks' own thread CPU time */
    float sink[1024];
} fma_job;

static float fma_scalar(float seed) {
    float a[8];
    for (int k = 0; k < 8; k++) a[k] = seed + (float)k;
    for (int i = 0; i < FMA_ITERS / 8; i++)
        for (int k = 0; k < 8; k++) a[k] = a[k] * 0.999999f + 1e-7f;
    float s = 0;
    for (int k = 0; k < 8; k++) s += a[k];
    return s;
}

#ifdef BENCH_X86
/* 12 independent chains: enough to cover FMA latency × ports on current cores. */
#define FMA_BODY(V, FMA, SET1, ADD, ZERO)                                                  \
    V acc[12];                                                                             \
    for (int k = 0; k < 12; k++) acc[k] = SET1(seed + (float)k);                           \
    const V m = SET1(0.999999f), c = SET1(1e-7f);                                          \
    for (int i = 0; i < FMA_ITERS; i++) {                                                  \
        acc[0] = FMA(acc[0], m, c);                                                        \
        acc[1] = FMA(acc[1], m, c);                                                        \
        acc[2] = FMA(acc[2], m, c);                                                        \
        acc[3] = FMA(acc[3], m, c);                                                        \
        acc[4] = FMA(acc[4], m, c);                                                        \
        acc[5] = FMA(acc[5], m, c);                                                        \
        acc[6] = FMA(acc[6], m, c);                                                        \
        acc[7] = FMA(acc[7], m, c);                                                        \
        acc[8] = FMA(acc[8], m, c);                                                        \
        acc[9] = FMA(acc[9], m, c);                                                        \
        acc[10] = FMA(acc[10], m, c);                                                      \
        acc[11] = FMA(acc[11], m, c);                                                      \
    }                                                                                      \
    V s = ZERO();                                                                          \
    for (int k = 0; k < 12; k++) s = ADD(s, acc[k]);

__attribute__((target("avx2,fma"))) static float fma_avx2(float seed) {
    FMA_BODY(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_setzero_ps)
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[7];
}
__attribute__((target("avx512f"))) static float fma_avx512(float seed) {
    FMA_BODY(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_setzero_ps)
    float o[16];
    _mm512_storeu_ps(o, s);
    return o[0] + o[15];
}
#endif

static void fma_task(void *arg, int64_t task, int32_t slot) {
    fma_job *j = arg;
    const long long c0 = thread_cpu_ns();
    float v;
#ifdef BENCH_X86
    if (j->isa == DSIB_ISA_AVX512)
        v = fma_avx512((float)task);
    else if (j->isa == DSIB_ISA_AVX2)
        v = fma_avx2((float)task);
    else
#endif
        v = fma_scalar((float)task);
    j->sink[slot & 1023] += v;
    atomic_fetch_add_explicit(&j->cpu_ns, thread_cpu_ns() - c0, memory_order_relaxed);
}

static double fma_flops_per_task(int isa) {
    if (isa == DSIB_ISA_AVX512) return 2.0 * 16 * 12 * FMA_ITERS;
    if (isa == DSIB_ISA_AVX2) return 2.0 * 8 * 12 * FMA_ITERS;
    return 2.0 * FMA_ITERS; /* scalar: mul + add */
}

double bench_fma_peak(dsib_threadpool *pool, int reps, double *per_cpu) {
    fma_job *j = calloc(1, sizeof *j);
    if (!j) return 0;
    j->isa = probe_isa();
    int32_t nt = dsib_threadpool_n_threads(pool);
    double best = 0, best_cpu = 0;
    for (int r = 0; r < reps + 1; r++) {
        atomic_store(&j->cpu_ns, 0);
        double t0 = bench_now();
        dsib_parallel_for(pool, nt, fma_task, j);
        double dt = bench_now() - t0, dc = (double)atomic_load(&j->cpu_ns) * 1e-9;
        double g = fma_flops_per_task(j->isa) * nt / dt * 1e-9;
        double g_cpu = dc > 0 ? fma_flops_per_task(j->isa) * nt * nt / dc * 1e-9 : 0;
        if (r > 0 && g > best) best = g;
        if (r > 0 && g_cpu > best_cpu) best_cpu = g_cpu;
    }
    if (per_cpu) *per_cpu = best_cpu;
    free(j);
    return best;
}

/* ---- random weights ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

void bench_fill_row(int32_t type, uint8_t *row, int64_t n_in, uint64_t *rng) {
    size_t rb = dsib_kern_row_bytes(type, n_in);
    for (size_t i = 0; i + 8 <= rb; i += 8) {
        uint64_t v = rng_next(rng);
        memcpy(row + i, &v, 8);
    }
    for (size_t i = rb & ~(size_t)7; i < rb; i++) row[i] = (uint8_t)rng_next(rng);
    /* small finite values / scales (no NaN, inf or subnormal slow paths) */
    switch (type) {
    case DSI_TYPE_F32:
        for (int64_t i = 0; i < n_in; i++) {
            float f = (float)((int)(rng_next(rng) % 2001) - 1000) * 1e-3f;
            memcpy(row + 4 * i, &f, 4);
        }
        break;
    case DSI_TYPE_F16:
    case DSI_TYPE_BF16:
        for (int64_t i = 0; i < n_in; i++) {
            uint16_t h = (uint16_t)rng_next(rng);
            h = type == DSI_TYPE_F16 ? (uint16_t)((h & 0x83ff) | 0x3000)
                                     : (uint16_t)((h & 0x807f) | 0x3e00);
            put16(row + 2 * i, h);
        }
        break;
    case DSI_TYPE_Q8_0:
        for (int64_t b = 0; b < n_in / 32; b++) put16(row + 34 * b, 0x2000);
        break;
    case DSI_TYPE_Q4_K:
        for (int64_t b = 0; b < n_in / 256; b++) {
            put16(row + 144 * b, 0x2000);
            put16(row + 144 * b + 2, 0x1c00);
        }
        break;
    case DSI_TYPE_Q2_K:
        for (int64_t b = 0; b < n_in / 256; b++) {
            put16(row + 84 * b + 80, 0x2000);
            put16(row + 84 * b + 82, 0x1c00);
        }
        break;
    case DSI_TYPE_IQ2_XXS: /* d; the index, sign and scale bits are all valid as random */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 66 * b, 0x2000);
        break;
    case 13: /* q5_k: d, dmin at 0, 2 */
        for (int64_t b = 0; b < n_in / 256; b++) {
            put16(row + 176 * b, 0x2000);
            put16(row + 176 * b + 2, 0x1c00);
        }
        break;
    case 2:  /* q4_0 */
    case 20: /* iq4_nl: d per 18-byte block */
        for (int64_t b = 0; b < n_in / 32; b++) put16(row + 18 * b, 0x2000);
        break;
    case 3: /* q4_1: d, m per 20-byte block */
    case 7: /* q5_1: d, m per 24-byte block (the fifth bits are valid as random) */
        for (int64_t b = 0; b < n_in / 32; b++) {
            put16(row + (type == 3 ? 20 : 24) * b, 0x2000);
            put16(row + (type == 3 ? 20 : 24) * b + 2, 0x1c00);
        }
        break;
    case 6: /* q5_0: d per 22-byte block */
        for (int64_t b = 0; b < n_in / 32; b++) put16(row + 22 * b, 0x2000);
        break;
    case 23: /* iq4_xs: d per 136-byte super-block (the scale bits are valid as random) */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 136 * b, 0x2000);
        break;
    case 18: /* iq3_xxs: d at 0 (index, sign and scale bits valid as random) */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 98 * b, 0x2000);
        break;
    case 17: /* iq2_xs: d at 0 (index, sign and scale bits valid as random) */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 74 * b, 0x2000);
        break;
    case 22: /* iq2_s: d at 0 (index, high index, sign and scale bits valid as random) */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 82 * b, 0x2000);
        break;
    case 21: /* iq3_s: d at 0 (index, high index, sign and scale bits valid as random) */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 110 * b, 0x2000);
        break;
    case 19: /* iq1_s: d at 0 (index, delta sign and scale bits valid as random) */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 50 * b, 0x2000);
        break;
    case 29: /* iq1_m: d = 0x2000 in the top nibbles of the scale words at 48 */
        for (int64_t b = 0; b < n_in / 256; b++)
            for (int k = 0; k < 4; k++) {
                uint8_t *p = row + 56 * b + 49 + 2 * k;
                *p = (uint8_t)((*p & 0x0F) | (((0x2000 >> (4 * k)) & 0xF) << 4));
            }
        break;
    case 11: /* q3_k: d at 108 */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 110 * b + 108, 0x2000);
        break;
    case 14: /* q6_k: d at 208 */
        for (int64_t b = 0; b < n_in / 256; b++) put16(row + 210 * b + 208, 0x2000);
        break;
    case DSI_TYPE_MXFP4:
        for (int64_t b = 0; b < n_in / 32; b++) row[17 * b] = 122;
        break;
    case DSI_TYPE_FP8_E4M3_B128:
    case DSI_TYPE_FP8_E4M3_B32: {
        size_t bs = type == DSI_TYPE_FP8_E4M3_B128 ? 128 : 32;
        for (size_t b = 0; b < rb / (bs + 1); b++) {
            uint8_t *blk = row + b * (bs + 1);
            blk[0] = 120;
            for (size_t j = 1; j <= bs; j++)
                if ((blk[j] & 0x7f) == 0x7f) blk[j] ^= 1;
        }
        break;
    }
    default:
        break;
    }
}

size_t bench_llc_bytes(void) {
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long v = 0;
        char unit = 0;
        if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
            size_t b = v;
            if (unit == 'K') b = v << 10;
            if (unit == 'M') b = v << 20;
            if (b > best) best = b;
        }
        fclose(f);
    }
    return best ? best : (size_t)32 << 20;
}

void bench_cpu_name(char *buf, size_t size) {
    snprintf(buf, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, size, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

long long bench_anon_huge_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lld kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}
