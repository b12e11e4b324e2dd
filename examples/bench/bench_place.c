/*
 * dsinfer-bench --place: decode speed and bytes moved per token for each placement of the
 * routed experts (docs/placement.md), in one run:
 *
 *   - the disk's sequential read bandwidth, measured first on the model file itself (8 MiB
 *     preads after POSIX_FADV_DONTNEED, which drops its clean pages where the kernel
 *     allows; the report says whether the page cache was really cold: a second pass that
 *     is not faster means it was);
 *   - then, per placement — all resident (mapped), and experts streamed (pread) with 100 %,
 *     50 %, 25 %, 10 % and 0 % (k slots) of them cached, LRU and LFU —, a prompt of -p
 *     tokens and -n decode steps: decode tokens/s, expert bytes read from the file per
 *     token, cache hit rate, read-ahead hits per token, and the bytes read per second of the
 *     decode (wall clock, compute included: a lower bound on the tier's read rate) against
 *     the sequential bandwidth (O_DIRECT rows: against the O_DIRECT sequential figure). Each
 *     placement starts with the file's pages dropped; the tier's reads are buffered preads,
 *     so re-reads of an expert within a placement may come from the page cache.
 *
 * --place-csv FILE writes one CSV row per placement (tools/plot_placement.py draws it).
 *
 * With --backend vulkan / cuda: hybrid steps instead (docs/placement.md "Hybrid steps"): all
 * resident on the GPU; the experts in host RAM cached on the GPU (DSI_HYBRID_UPLOAD, 100 / 10 %
 * of them); computed by the CPU instance (DSI_HYBRID_CPU, none on the GPU); split by expert id
 * (half of every layer's experts on the GPU), and the split's two parts measured alone (a
 * benchmark hook: the other part adds nothing) — the overlap figure is the split step's time
 * over the longer part's.
 */
#define _GNU_SOURCE /* O_DIRECT */
#define DSI_EXPERIMENTAL
#include "dsinfer.h"
#include "place/place.h" /* dsii_xtier_part_test */

#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int run_place(const char *path, int threads, int p, int n, const char *csv, const char *backend);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sequential read bandwidth of `path` (bytes/s), one pass; *dropped: the fadvise returned 0.
 * direct: O_DIRECT (no page cache), 8 MiB aligned reads. */
static double seq_read(const char *path, int drop, int *dropped, int direct) {
    int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0) return 0.0;
    *dropped = drop ? posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 : 0;
    const size_t chunk = (size_t)8 << 20;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, chunk) != 0) buf = NULL;
    double t0 = now_s();
    uint64_t total = 0;
    for (off_t off = 0; buf;) {
        ssize_t r = pread(fd, buf, chunk, off);
        if (r <= 0) break;
        total += (uint64_t)r;
        off += r;
    }
    double dt = now_s() - t0;
    free(buf);
    close(fd);
    return dt > 0 ? (double)total / dt : 0.0;
}

typedef struct pcase {
    const char *name;
    int32_t access;
    uint32_t policy, cache;
    double frac; /* < 0: all resident */
    uint32_t flags;
} pcase;

/* Loads `path` with the plan `po` (access mode `access`), reads its plan and model facts, frees
 * it. 0 on success; else the message is printed. */
static int plan_facts(dsi_context *ctx, const char *path, int32_t access, const dsi_place_options *po,
                      dsi_place_info *pi, dsi_model_info *info) {
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.access = access;
    mo.place = po;
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, path, &mo, &m) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: %s: %s\n", path, dsi_last_error());
        return -1;
    }
    dsi_place_info_init(pi);
    dsi_model_place_info(m, pi);
    dsi_model_info_init(info);
    dsi_model_get_info(m, info);
    dsi_model_free(m);
    return 0;
}

typedef struct hcase {
    const char *name;
    uint32_t policy, hybrid;
    double frac;     /* UPLOAD: the cached fraction */
    int split;       /* device experts: half of each layer's */
    int part;        /* dsii_xtier_part_test */
} hcase;

/* One placement: `path` loaded with `po` (access mode `access`), a prompt of p tokens, then n
 * decode steps timed (*dt, seconds); *a / *b: the plan's counters before and after the
 * decode. 0, or -1 with the message in dsi_last_error(). */
static int decode_run(dsi_context *ctx, const char *path, int32_t access, const dsi_place_options *po,
                      const dsi_token *toks, int p, int n, double *dt, dsi_place_info *a, dsi_place_info *b) {
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.access = access;
    mo.place = po;
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, path, &mo, &m) != DSI_OK) return -1;
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = (uint32_t)(p + n + 8);
    dsi_session *s = NULL;
    dsi_status st = dsi_session_create(m, &so, &s);
    if (st == DSI_OK) st = dsi_session_append(s, toks, (size_t)p);
    dsi_place_info_init(a);
    dsi_place_info_init(b);
    dsi_model_place_info(m, a);
    double t0 = now_s();
    for (int i = 0; st == DSI_OK && i < n; i++) st = dsi_session_append(s, toks + p + i, 1);
    *dt = now_s() - t0;
    dsi_model_place_info(m, b);
    dsi_session_free(s);
    dsi_model_free(m);
    return st == DSI_OK ? 0 : -1;
}

/* A context on `backend` (NULL: the CPU) with `threads` threads, or NULL (message printed). */
static dsi_context *bench_ctx(int threads, const char *backend) {
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = threads;
    co.backend = backend;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&co, &ctx) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: context: %s\n", dsi_last_error());
        return NULL;
    }
    return ctx;
}

/* p + n pseudo-random token ids below n_vocab (the same for every placement), or NULL. */
static dsi_token *bench_tokens(int count, int32_t n_vocab) {
    dsi_token *toks = malloc(sizeof(dsi_token) * (size_t)count);
    uint32_t seed = 12345u;
    for (int i = 0; toks && i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        toks[i] = (dsi_token)(seed % (uint32_t)n_vocab);
    }
    return toks;
}

static int run_place_gpu(const char *path, int threads, int p, int n, const char *backend) {
    dsi_context *ctx = bench_ctx(threads, backend);
    if (!ctx) return 1;
    /* plan facts: the resident part on the device and the slot size (an unlimited GPU cache) */
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_EXPERTS_HOST;
    po.hybrid = DSI_HYBRID_UPLOAD;
    po.device_budget = (uint64_t)1 << 46;
    dsi_place_info pi;
    dsi_model_info info;
    if (plan_facts(ctx, path, DSI_ACCESS_MMAP, &po, &pi, &info) != 0) {
        dsi_context_free(ctx);
        return 1;
    }
    const uint64_t n_tiered = pi.expert_cache_slots;
    const uint64_t unit = n_tiered ? pi.expert_cache_bytes / n_tiered : 0;
    const uint64_t resident = pi.device_bytes;
    const uint32_t k = info.n_experts_used ? info.n_experts_used : 1, E = (uint32_t)info.n_experts;
    if (!n_tiered || E < 2) {
        fprintf(stderr, "dsinfer-bench: %s has no routed experts to place\n", path);
        dsi_context_free(ctx);
        return 1;
    }
    const hcase cases[] = {
        {"gpu-resident", DSI_PLACE_ALL_RESIDENT, 0, 0, 0, 0},
        {"upload-100%", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_UPLOAD, 1.0, 0, 0},
        {"upload-10%", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_UPLOAD, 0.1, 0, 0},
        {"cpu-all", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_CPU, 0, 0, 0},
        {"split-50%", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_CPU, 0, 1, 0},
        {"split-gpu-part-alone", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_CPU, 0, 1, 1},
        {"split-cpu-part-alone", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_CPU, 0, 1, 2},
        {"split-neither-part", DSI_PLACE_EXPERTS_HOST, DSI_HYBRID_CPU, 0, 1, 3},
    };
    printf("model %s on %s + the cpu instance: %u layers, %llu tiered experts of %.2f MiB, resident part %.1f "
           "MiB; %d cpu threads, prompt %d, decode %d tokens\n",
           path, backend, info.n_layers, (unsigned long long)n_tiered, unit / 1048576.0, resident / 1048576.0,
           threads, p, n);
    printf("| placement | decode t/s | ms / token | uploaded MiB / token | cpu experts ms / token | then waiting for "
           "the gpu ms / token |\n");
    printf("| --------- | ---------: | ---------: | -------------------: | ---------------------: | "
           "-----------------------------: |\n");
    dsi_token *toks = bench_tokens(p + n, info.n_vocab);
    int fail = !toks;
    double ms[8] = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && toks; c++) {
        dsi_place_options o2;
        dsi_place_options_init(&o2);
        o2.policy = cases[c].policy;
        o2.hybrid = cases[c].hybrid;
        if (cases[c].hybrid == DSI_HYBRID_UPLOAD) {
            uint64_t slots = (uint64_t)(cases[c].frac * (double)n_tiered);
            if (slots < k) slots = k;
            o2.device_budget = resident + slots * unit;
        }
        if (cases[c].split) o2.device_experts = E / 2;
        atomic_store(&dsii_xtier_part_test, cases[c].part);
        double dt = 0;
        dsi_place_info a, b;
        int rc = decode_run(ctx, path, DSI_ACCESS_MMAP, &o2, toks, p, n, &dt, &a, &b);
        atomic_store(&dsii_xtier_part_test, 0);
        if (rc != 0) {
            fprintf(stderr, "dsinfer-bench: %s: %s\n", cases[c].name, dsi_last_error());
            fail = 1;
            continue;
        }
        double tps = n / dt, up = (double)(b.bytes_uploaded - a.bytes_uploaded) / n;
        double cms = (double)(b.overlap_cpu_ns - a.overlap_cpu_ns) / 1e6 / n;
        double wms = (double)(b.overlap_wait_ns - a.overlap_wait_ns) / 1e6 / n;
        ms[c] = 1e3 / tps;
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", cases[c].name, tps, ms[c], up / 1048576.0, cms, wms);
    }
    if (ms[4] > 0 && ms[5] > 0 && ms[6] > 0 && ms[7] > 0) {
        double longer = ms[5] > ms[6] ? ms[5] : ms[6];
        double g = ms[5] - ms[7], c = ms[6] - ms[7], sp = ms[4] - ms[7], lx = g > c ? g : c;
        printf("overlap: the split step takes %.2f ms, its parts alone %.2f (gpu) and %.2f (cpu) ms: %.2fx the longer "
               "(aim <= 1.2)\n",
               ms[4], ms[5], ms[6], ms[4] / longer);
        printf("routed experts alone (each step minus the step computing neither part, %.2f ms): gpu %.2f, cpu %.2f, "
               "split %.2f ms per token: %.2fx the longer part, %.2fx their sum\n",
               ms[7], g, c, sp, lx > 0 ? sp / lx : 0.0, g + c > 0 ? sp / (g + c) : 0.0);
    }
    free(toks);
    dsi_context_free(ctx);
    return fail;
}

int run_place(const char *path, int threads, int p, int n, const char *csv, const char *backend) {
    if (p <= 0) p = 32;
    if (n <= 0) n = 32;
    if (backend && strcmp(backend, "cpu") != 0) {
        (void)csv;
        return run_place_gpu(path, threads, p, n, backend);
    }
    dsi_context *ctx = bench_ctx(threads, NULL);
    if (!ctx) return 1;
    /* plan facts: resident bytes and the slot size from an unlimited streamed plan */
    dsi_place_options po;
    dsi_place_options_init(&po);
    po.policy = DSI_PLACE_EXPERTS_STREAMED;
    po.host_budget = (uint64_t)1 << 46;
    dsi_place_info pi;
    dsi_model_info info;
    if (plan_facts(ctx, path, DSI_ACCESS_PREAD, &po, &pi, &info) != 0) {
        dsi_context_free(ctx);
        return 1;
    }
    const uint64_t n_streamed = pi.n_experts_streamed;
    const uint64_t unit = n_streamed ? pi.expert_cache_bytes / n_streamed : 0;
    const uint64_t fixed = pi.host_bytes - pi.expert_cache_bytes; /* resident + bookkeeping */
    const uint32_t k = info.n_experts_used ? info.n_experts_used : 1;
    if (!n_streamed) {
        fprintf(stderr, "dsinfer-bench: %s has no routed experts to stream\n", path);
        dsi_context_free(ctx);
        return 1;
    }
    int dropped = 0, dropped2 = 0;
    double bw = seq_read(path, 1, &dropped, 0);
    double bw2 = seq_read(path, 1, &dropped2, 0);
    if (bw2 > bw) bw = bw2; /* the better of two cold passes */
    int dd = 0;
    double bwd = seq_read(path, 0, &dd, 1), bwd2 = seq_read(path, 0, &dd, 1);
    if (bwd2 > bwd) bwd = bwd2;
    const pcase cases[] = {
        {"resident", DSI_ACCESS_MMAP, DSI_PLACE_ALL_RESIDENT, 0, -1.0, 0},
        {"100%-lru", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 1.0, 0},
        {"100%-no-read-ahead", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 1.0,
         DSI_PLACE_FLAG_NO_PREFETCH},
        {"50%-lru", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.5, 0},
        {"50%-lfu", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LFU, 0.5, 0},
        {"25%-lru", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.25, 0},
        {"25%-lfu", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LFU, 0.25, 0},
        {"10%-lru", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.1, 0},
        {"10%-lfu", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LFU, 0.1, 0},
        {"0%", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.0, 0},
        {"0%-no-read-ahead", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.0,
         DSI_PLACE_FLAG_NO_PREFETCH},
        {"10%-direct", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.1, DSI_PLACE_FLAG_DIRECT_IO},
        {"0%-direct", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.0, DSI_PLACE_FLAG_DIRECT_IO},
        {"0%-direct-no-read-ahead", DSI_ACCESS_PREAD, DSI_PLACE_EXPERTS_STREAMED, DSI_CACHE_LRU, 0.0,
         DSI_PLACE_FLAG_DIRECT_IO | DSI_PLACE_FLAG_NO_PREFETCH},
    };
    FILE *cf = csv ? fopen(csv, "w") : NULL;
    if (csv && !cf) fprintf(stderr, "dsinfer-bench: cannot write %s\n", csv);
    if (cf)
        fprintf(cf, "placement,cache_policy,resident_fraction,slots,tokens_per_s,bytes_read_per_token,"
                    "hit_rate,prefetch_hits_per_token,read_gbs,seq_read_gbs\n");
    printf("model %s: %u layers, %llu streamable experts of %.2f MiB, resident part %.1f MiB; %d threads, "
           "prompt %d, decode %d tokens\n",
           path, info.n_layers, (unsigned long long)n_streamed, unit / 1048576.0, fixed / 1048576.0,
           threads, p, n);
    printf("disk sequential read: %.2f GB/s (%s)\n", bw * 1e-9,
           dropped ? "page cache dropped with POSIX_FADV_DONTNEED before each pass (may still be cached "
                     "where the kernel keeps dirty or shared pages)"
                   : "could not drop the page cache: a warm-cache figure");
    printf("disk sequential read with O_DIRECT (8 MiB reads, no page cache): %.2f GB/s%s\n", bwd * 1e-9,
           bwd > 0 ? "" : " (O_DIRECT refused here)");
    printf("| placement | slots | decode t/s | expert MiB read / token | hit rate | read-ahead hits / token | "
           "read GB/s (wall) | of sequential |\n");
    printf("| --------- | ----: | ---------: | ----------------------: | -------: | --------------: | "
           "-------------: | -----------: |\n");
    dsi_token *toks = bench_tokens(p + n, info.n_vocab);
    int fail = !toks;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && toks; c++) {
        dsi_place_options o2;
        dsi_place_options_init(&o2);
        o2.policy = cases[c].policy;
        o2.cache_policy = cases[c].cache;
        o2.flags = cases[c].flags;
        if (cases[c].frac >= 0) {
            uint64_t slots = (uint64_t)(cases[c].frac * (double)n_streamed);
            if (slots < k) slots = k;
            o2.host_budget = fixed + slots * unit;
            if (cases[c].flags & DSI_PLACE_FLAG_DIRECT_IO) o2.host_budget += 4 * ((1u << 20) + 2 * 4096u);
        }
        /* every placement starts with the file's pages dropped (where the kernel allows) */
        int dfd = open(path, O_RDONLY);
        if (dfd >= 0) {
            (void)posix_fadvise(dfd, 0, 0, POSIX_FADV_DONTNEED);
            close(dfd);
        }
        double dt = 0;
        dsi_place_info a, b;
        if (decode_run(ctx, path, cases[c].access, &o2, toks, p, n, &dt, &a, &b) != 0) {
            fprintf(stderr, "dsinfer-bench: %s: %s\n", cases[c].name, dsi_last_error());
            fail = 1;
        } else {
            double tps = n / dt;
            double rd = (double)(b.bytes_read - a.bytes_read) / n;
            uint64_t uses = (b.cache_hits - a.cache_hits) + (b.cache_misses - a.cache_misses);
            double hit = uses ? (double)(b.cache_hits - a.cache_hits) / (double)uses : 1.0;
            double pfu = (double)(b.prefetch_hits - a.prefetch_hits) / n; /* per token */
            /* bytes read per second of the decode (wall clock, compute included: a lower bound
             * on what the tier's reads reach; read_ns sums the reading threads' time, which
             * overlaps when a chunk's misses are read by several) */
            double rgbs = dt > 0 ? (double)(b.bytes_read - a.bytes_read) / dt * 1e-9 : 0.0;
            /* O_DIRECT placements against the O_DIRECT sequential figure (no page cache either side) */
            double ref = (cases[c].flags & DSI_PLACE_FLAG_DIRECT_IO) && bwd > 0 ? bwd : bw;
            printf("| %s | %u | %.2f | %.2f | %.1f%% | %.1f | %.2f | %.0f%% |\n", cases[c].name,
                   b.expert_cache_slots, tps, rd / 1048576.0, 100.0 * hit, pfu, rgbs,
                   ref > 0 ? 100.0 * rgbs * 1e9 / ref : 0.0);
            if (cf)
                fprintf(cf, "%s,%s,%.4f,%u,%.4f,%.0f,%.4f,%.4f,%.4f,%.4f\n", cases[c].name,
                        cases[c].frac < 0 ? "-" : cases[c].cache == DSI_CACHE_LFU ? "lfu" : "lru",
                        cases[c].frac < 0 ? 1.0 : (double)b.expert_cache_slots / (double)n_streamed,
                        b.expert_cache_slots, tps, rd, hit, pfu, rgbs, bw * 1e-9);
        }
    }
    double la[1] = {0};
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf", &la[0]) != 1) la[0] = 0;
        fclose(lf);
    }
    printf("load average after the run: %.2f (a shared machine: figures move with it)\n", la[0]);
    if (cf) fclose(cf);
    free(toks);
    dsi_context_free(ctx);
    return fail;
}
