/*
 * dsinfer-bench — llama-bench-style throughput plus the limits it should be judged by
 * (design.md "Performance method"): decode tokens/s is turned into effective bandwidth (bytes
 * of weights actually read per token × t/s) next to the machine's read bandwidth measured in
 * the same run; prefill into GFLOP/s next to a measured FMA peak.
 *
 *   dsinfer-bench -m FILE [-p 512] [-n 128] [-r 5] [-t THREADS] [--backend NAME] [--json]
 *   dsinfer-bench -m FILE --sessions 1,2,4,8 [-n 32] [-r 3] [-t THREADS]
 *   dsinfer-bench --kernels [-t THREADS] [-r 5] [--type NAME] [--json]
 *   dsinfer-bench -m FILE --spec [-n 128] [-r 3] [--prompt TEXT] [--draft-max N]
 *
 * --spec: speculative decoding (lib/spec) against plain decoding in the same run: greedy
 * dsi_session_generate of -n tokens from a text prompt (several prompts, r repetitions),
 * speculation off, on and auto in turn; reported: tokens/s of each, mean accepted drafts per
 * verify step and tokens per step (measured), the output identity, and where the time goes
 * — one-token step, verify step of 1 + k rows, draft call — each timed alone.
 *   dsinfer-bench -m FILE --ttft 4096 [--cache-dir DIR] [-r 3] [-t THREADS]
 *
 * Model runs use the public session API (dsi_session_sync for pp, dsi_session_append one
 * token at a time for tg); the byte and FLOP counts come from the model's bound tensors
 * (lib/model internals; this tool links the static library). --sessions is the serving
 * frontier: for each batch size B, B sessions decode together through the experimental
 * dsi_session_append_batch (one shared step per token of every session); reported per B:
 * aggregate and per-session t/s, ms per step, the weight bytes one step reads (shared
 * tensors once + the routed experts the batch selected, each once — counted by the CPU
 * backend), the speed-up those bytes allow over B = 1 and the effective bandwidth.
 * --ttft N is persistence (docs/snapshots.md): time to first token (logits of the last
 * prompt token available) for an N-token prompt cold, with the prefix cached on disk by the
 * prompt cache (restore + the rest evaluated), and with the session restored from a
 * snapshot file — one run, same session settings.
 */
#define _POSIX_C_SOURCE 200809L

#define DSI_EXPERIMENTAL
#include "dsinfer.h"

#include "backend/device.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/threadpool.h"
#include "backends/types.h"
#include "bench_hw.h"
#include "api/session_impl.h"
#include "arch/arch.h"
#include "model/model.h"
#include "quant/quant.h"
#include "quant/statepack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "bench_git.h" /* DSI_BENCH_GIT: git describe of the tree, refreshed at every build */

typedef struct opts {
    const char *model;
    int p, n, r, t;
    const char *backend;
    int json;
    int kernels;
    const char *type;
    const char *isa;
    int bw_mib;
    int bw_mib_given;      /* --bw-mib given: that buffer exactly, not raised to 8 x the LLC */
    int cold_mib;          /* --cold-mib: the --kernels cold set (0: 256 MiB or 8 x the LLC) */
    int no_limits;
    int exact;
    int no_mmap;           /* --no-mmap: DSI_ACCESS_PREAD (weights read into library memory) */
    int resident;          /* --resident: --no-mmap and DSI_MODEL_FLAG_RESIDENT (Engram too) */
    const char *sessions;
    int n_given, p_given;
    int spec;
    const char *prompt;
    int draft_max;
    int spec_steps;        /* --spec-steps: only the step costs (no generation runs) */
    long long shape_out, shape_in; /* --kernels --shape OUTxIN (default 2048x4096) */
    int ttft;
    const char *cache_dir;
    const char *ops_isa; /* --ops-isa: force the CPU ops' SIMD path (A/B in one run) */
    int no_fuse;         /* --no-fuse: one job per matmul (A/B of matmul_multi / moe2) */
    int prefetch;        /* --prefetch N: weight prefetch distance in bytes (-1: default) */
    int prefetch2;       /* --prefetch2 N: its far (L2) level in bytes (-1: default) */
    int rows16_gather;   /* --rows16-gather 0|1: the sixteen-row tiles' scale reads (-1: default) */
    int q8_rows8;        /* --q8-rows8 0|1: Q8_0's one-token tiles on long rows (-1: default) */
    const char *depths;    /* -d 0,4096,...: decode / prefill at context depths */
    int real_depth;        /* -d: prefill the depth for real instead of synthetic state */
    int place;
    const char *place_csv;
} opts;

int run_place(const char *path, int threads, int p, int n, const char *csv, const char *backend); /* bench_place.c */

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsinfer-bench -m FILE [-p 512] [-n 128] [-r 5] [-t THREADS] [--backend NAME]\n"
            "                     [--json] [--bw-mib 1024] [--no-limits] [--exact]\n"
            "       dsinfer-bench --kernels [-t THREADS] [-r 5] [--type NAME] [--isa NAME] [--exact]\n"
            "                     [--shape OUTxIN] [--json]\n"
            "  -p N         prompt tokens of the pp test (0: skip)\n"
            "  -n N         generated tokens of the tg test (0: skip)\n"
            "  -r N         repetitions (mean +- sd)\n"
            "  -t N         threads (default: online CPUs)\n"
            "  --backend    cpu | vulkan | cuda | auto (default cpu)\n"
            "  --json       one JSON object on stdout instead of the table\n"
            "  --kernels    matvec/matmul micro-benchmarks per weight type (expert-sized)\n"
            "  --type NAME  only this type (q4_k, q8_0, q2_k, mxfp4, fp8_e4m3_b128, ...)\n"
            "  --shape OxI  --kernels matrix shape, rows x columns (default 2048x4096; a multiple\n"
            "               of 256 columns)\n"
            "  --isa NAME   --kernels with this ISA path (scalar, avx2, avx512, avx512vnni)\n"
            "               instead of the one the library picked\n"
            "  --cold-mib N --kernels: the matrices the cold figures cycle through, N MiB in all\n"
            "               (default 256 or 8 x the last-level cache, the larger; below 8 x the\n"
            "               LLC the cold figures partly come from the cache)\n"
            "  --no-fuse    one pool job per matmul (no matmul_multi, experts' gate and up apart) -- A/B\n"
            "  --prefetch N the CPU kernels' weight prefetch, N bytes ahead (0: off; default 4096) -- A/B\n"
            "  --prefetch2 N its far level, to L2 only, N bytes ahead (0: off; default 16384) -- A/B\n"
            "  --rows16-gather 0|1  the sixteen-row tiles (Q8_0, Q4_K, Q2_K, AVX-512) read the rows'\n"
            "               scales with gathers (1) or loads and a transpose (0; default: 0 on AMD,\n"
            "               1 elsewhere) -- A/B\n"
            "  --q8-rows8 0|1  Q8_0's one-token calls on rows of 2048+ columns (AVX-512 VNNI): tiles\n"
            "               of eight rows (1) or sixteen (0; default: 1 on AMD, 0 elsewhere) -- A/B\n"
            "  --ops-isa N  the CPU ops' SIMD path (scalar, avx2, ...; default: the CPU's) -- A/B\n"
            "  --exact      the exact matmul path (f32 activations for every weight type;\n"
            "               DSI_CONTEXT_FLAG_EXACT_MATMUL) instead of the default one\n"
            "  --no-mmap    read the weights into library-owned memory (DSI_ACCESS_PREAD: huge\n"
            "               pages where the kernel allows) instead of mapping the file; the\n"
            "               Engram tables stay in the file, their rows read on demand\n"
            "  --resident   --no-mmap with the Engram tables read in too (DSI_MODEL_FLAG_RESIDENT)\n"
            "  --bw-mib N   buffer of the read-bandwidth measurement (default 1024, raised to\n"
            "               8 x the last-level cache; a given N is used as it is)\n"
            "  --no-limits  skip the bandwidth / FMA-peak measurements\n"
            "  --sessions L batch sizes of the serving frontier, e.g. 1,2,4,8 (-n decode steps,\n"
            "               default 32 here; prompts of 16 tokens)\n"
            "  --spec       speculative vs plain greedy decoding (models with draft blocks)\n"
            "  --prompt T   --spec: the first prompt (four built-in ones follow)\n"
            "  --draft-max N --spec: drafts per step (default: the block's)\n"
            "  --spec-steps --spec without the generation runs: only the step costs and bytes\n"
            "  --ttft N     time to first token of an N-token prompt: cold, from the disk\n"
            "               prompt cache, from a snapshot file (-r repetitions of the warm ones)\n"
            "  --cache-dir  directory for --ttft's cache and snapshot (default: a new /tmp dir)\n"
            "  -d LIST      context depths, e.g. 0,4096,16384,65536 (llama-bench's -d): decode\n"
            "               (-n, default 32) and prefill (-p, default 128; each at most 255) tokens/s\n"
            "               at each depth, decode time split (indexer scan / attention / rest),\n"
            "               state bytes per token; the depth's state is synthetic (random rows\n"
            "               on the FP8/FP4 grids, nothing evaluated) unless --real-depth\n"
            "  --real-depth -d: prefill each depth for real (slow: the whole prompt)\n"
            "  --place      memory tiers (docs/placement.md): decode t/s, expert bytes read per\n"
            "               token and hit rate per placement (resident; experts streamed with\n"
            "               100/50/25/10/0 %% cached, LRU / LFU), and the disk's sequential read\n"
            "               bandwidth, in one run (-p default 32, -n default 32 here)\n"
            "  --place-csv F  --place, and one CSV row per placement into F\n"
            "               (tools/plot_placement.py draws PNG plots from it)\n");
}

static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->p = 512;
    o->n = 128;
    o->r = 5;
    o->t = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (o->t < 1) o->t = 1;
    o->bw_mib = 1024;
    o->shape_out = 2048;
    o->shape_in = 4096;
    o->prefetch = -1;
    o->prefetch2 = -1;
    o->rows16_gather = -1;
    o->q8_rows8 = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV                                                                             \
    do {                                                                                  \
        if (!v) {                                                                         \
            fprintf(stderr, "dsinfer-bench: %s needs a value\n", a);                      \
            return -1;                                                                    \
        }                                                                                 \
        i++;                                                                              \
    } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { NEEDV; o->model = v; }
        else if (!strcmp(a, "-p")) { NEEDV; o->p = atoi(v); o->p_given = 1; }
        else if (!strcmp(a, "--place")) o->place = 1;
        else if (!strcmp(a, "--place-csv")) { NEEDV; o->place = 1; o->place_csv = v; }
        else if (!strcmp(a, "-n")) { NEEDV; o->n = atoi(v); o->n_given = 1; }
        else if (!strcmp(a, "-r")) { NEEDV; o->r = atoi(v); }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { NEEDV; o->t = atoi(v); }
        else if (!strcmp(a, "--backend")) { NEEDV; o->backend = v; }
        else if (!strcmp(a, "--type")) { NEEDV; o->type = v; }
        else if (!strcmp(a, "--isa")) { NEEDV; o->isa = v; }
        else if (!strcmp(a, "--shape")) {
            NEEDV;
            if (sscanf(v, "%lldx%lld", &o->shape_out, &o->shape_in) != 2 || o->shape_out < 1 ||
                o->shape_out > (1 << 20) || o->shape_in < 256 || o->shape_in > (1 << 20) ||
                o->shape_in % 256) {
                fprintf(stderr, "dsinfer-bench: --shape wants OUTxIN, IN a multiple of 256\n");
                return -1;
            }
        }
        else if (!strcmp(a, "--bw-mib")) { NEEDV; o->bw_mib = atoi(v); o->bw_mib_given = 1; }
        else if (!strcmp(a, "--cold-mib")) {
            NEEDV;
            o->cold_mib = atoi(v);
            if (o->cold_mib < 1 || o->cold_mib > (1 << 20)) {
                fprintf(stderr, "dsinfer-bench: --cold-mib wants 1 .. 1048576 (MiB)\n");
                return -1;
            }
        }
        else if (!strcmp(a, "--sessions")) { NEEDV; o->sessions = v; }
        else if (!strcmp(a, "--ttft")) { NEEDV; o->ttft = atoi(v); }
        else if (!strcmp(a, "--cache-dir")) { NEEDV; o->cache_dir = v; }
        else if (!strcmp(a, "-d") || !strcmp(a, "--depth")) { NEEDV; o->depths = v; }
        else if (!strcmp(a, "--real-depth")) o->real_depth = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--spec")) o->spec = 1;
        else if (!strcmp(a, "--prompt")) { NEEDV; o->prompt = v; }
        else if (!strcmp(a, "--draft-max")) { NEEDV; o->draft_max = atoi(v); }
        else if (!strcmp(a, "--spec-steps")) { o->spec = 1; o->spec_steps = 1; }
        else if (!strcmp(a, "--kernels")) o->kernels = 1;
        else if (!strcmp(a, "--no-limits")) o->no_limits = 1;
        else if (!strcmp(a, "--exact")) o->exact = 1;
        else if (!strcmp(a, "--no-mmap")) o->no_mmap = 1;
        else if (!strcmp(a, "--resident")) o->no_mmap = o->resident = 1;
        else if (!strcmp(a, "--no-fuse")) o->no_fuse = 1;
        else if (!strcmp(a, "--prefetch")) { NEEDV; o->prefetch = atoi(v); }
        else if (!strcmp(a, "--prefetch2")) {
            NEEDV;
            o->prefetch2 = atoi(v);
            if (o->prefetch2 < 0 || o->prefetch2 > (1 << 20)) {
                fprintf(stderr, "dsinfer-bench: --prefetch2 wants 0 .. 1048576 (bytes)\n");
                return -1;
            }
        }
        else if (!strcmp(a, "--rows16-gather")) {
            NEEDV;
            if (strcmp(v, "0") && strcmp(v, "1")) {
                fprintf(stderr, "dsinfer-bench: --rows16-gather wants 0 or 1\n");
                return -1;
            }
            o->rows16_gather = atoi(v);
        }
        else if (!strcmp(a, "--q8-rows8")) {
            NEEDV;
            if (strcmp(v, "0") && strcmp(v, "1")) {
                fprintf(stderr, "dsinfer-bench: --q8-rows8 wants 0 or 1\n");
                return -1;
            }
            o->q8_rows8 = atoi(v);
        }
        else if (!strcmp(a, "--ops-isa") && i + 1 < argc) o->ops_isa = argv[++i];
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else {
            fprintf(stderr, "dsinfer-bench: unknown argument %s\n", a);
            return -1;
        }
#undef NEEDV
    }
    if (o->r < 1 || o->t < 1 || o->p < 0 || o->n < 0 || o->bw_mib < 16) {
        fprintf(stderr, "dsinfer-bench: bad -r/-t/-p/-n/--bw-mib value\n");
        return -1;
    }
    if (!o->kernels && !o->model) {
        usage(stderr);
        return -1;
    }
    return 0;
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static void print_build_json(FILE *f) {
    fprintf(f, "\"build\": {\"version\": \"%s\", \"git\": \"%s\"}", dsi_version_string(),
            DSI_BENCH_GIT);
}

typedef struct limits {
    double read_gbs, fma_gflops;
    double read_gbs_cpu, fma_gflops_cpu; /* per CPU time (bench_hw.h) */
    size_t bw_bytes;
} limits;

static void measure_limits(const opts *o, dsib_threadpool *pool, limits *l) {
    memset(l, 0, sizeof *l);
    if (o->no_limits) return;
    l->bw_bytes = (size_t)o->bw_mib << 20;
    size_t llc = bench_llc_bytes();
    if (!o->bw_mib_given && l->bw_bytes < 8 * llc) l->bw_bytes = 8 * llc;
    l->read_gbs = bench_read_bandwidth(pool, l->bw_bytes, 5, &l->read_gbs_cpu);
    l->fma_gflops = bench_fma_peak(pool, 3, &l->fma_gflops_cpu);
}

/* ---- --kernels ------------------------------------------------------------------------------ */

static const struct { int32_t type; const char *name; } ktypes[] = {
    {DSI_TYPE_Q4_K, "q4_k"},   {DSI_TYPE_Q8_0, "q8_0"},
    {DSI_TYPE_Q2_K, "q2_k"},   {DSI_TYPE_MXFP4, "mxfp4"},
    {DSI_TYPE_IQ2_XXS, "iq2_xxs"}, {14 /* ggml's */, "q6_k"},
    {13 /* ggml's */, "q5_k"},   {11 /* ggml's */, "q3_k"},
    {2 /* ggml's */, "q4_0"},    {20 /* ggml's */, "iq4_nl"}, {23 /* ggml's */, "iq4_xs"},
    {18 /* ggml's */, "iq3_xxs"}, {17 /* ggml's */, "iq2_xs"},  {22 /* ggml's */, "iq2_s"},
    {21 /* ggml's */, "iq3_s"},   {19 /* ggml's */, "iq1_s"},   {29 /* ggml's */, "iq1_m"},
    {3 /* ggml's */, "q4_1"},    {6 /* ggml's */, "q5_0"},    {7 /* ggml's */, "q5_1"},
    {DSI_TYPE_FP8_E4M3_B128, "fp8_e4m3_b128"}, {DSI_TYPE_FP8_E4M3_B32, "fp8_e4m3_b32"},
    {DSI_TYPE_BF16, "bf16"},   {DSI_TYPE_F16, "f16"},
    {DSI_TYPE_F32, "f32"},
};

/* dsib_matmul for the process's ISA; another ISA (--isa) through its row kernels, split the
 * same way (16-row tasks), the activations quantised once per call on the caller as
 * dsib_matmul does. */
typedef struct kjob {
    const dsib_kern_table *kt;
    int32_t type, fmt;
    const uint8_t *w;
    size_t rb;
    int64_t n_in, n_out, n_tok;
    const float *x;
    float *y;
    void *act;
    size_t act_stride;
} kjob;

static void ktask(void *arg, int64_t task, int32_t slot) {
    (void)slot;
    const kjob *j = arg;
    int64_t o0 = task * 16, o1 = o0 + 16 < j->n_out ? o0 + 16 : j->n_out;
    if (j->fmt == DSIB_ACT_F32)
        j->kt->matmul_rows(j->type, j->w, j->rb, j->n_in, o0, o1, j->x, j->n_in, j->y,
                           j->n_out, j->n_tok);
    else
        j->kt->qmatmul_rows(j->type, j->w, j->rb, j->n_in, o0, o1, j->act, j->act_stride,
                            j->y, j->n_out, j->n_tok);
}

/* act: scratch of n_tok quantised rows (kernels path only). */
static void kmatmul(dsib_threadpool *pool, const dsib_kern_table *kt, uint32_t flags,
                    int32_t type, const uint8_t *w, size_t rb, int64_t n_in, int64_t n_out,
                    const float *x, float *y, int64_t n_tok, void *act) {
    if (!kt) {
        dsib_matmul(pool, flags, type, w, rb, n_in, n_out, x, n_in, y, n_out, n_tok);
        return;
    }
    const int32_t fmt = dsib_kern_act_format(type, flags);
    kjob j = {kt, type, fmt, w, rb, n_in, n_out, n_tok, x, y, act,
              dsib_kern_act_row_bytes(fmt, n_in)};
    if (fmt != DSIB_ACT_F32) kt->act_quantize(fmt, x, n_in, n_in, n_tok, act, j.act_stride);
    dsib_parallel_for(pool, (n_out + 15) / 16, ktask, &j);
}

static int run_kernels(const opts *o) {
    const dsib_kern_table *kt = NULL;
    if (o->isa) {
        int32_t isa = !strcmp(o->isa, "scalar") ? DSIB_ISA_SCALAR
                      : !strcmp(o->isa, "avx2") ? DSIB_ISA_AVX2
                      : !strcmp(o->isa, "avx512") ? DSIB_ISA_AVX512
                      : !strcmp(o->isa, "avx512vnni") ? DSIB_ISA_AVX512VNNI
                      : !strcmp(o->isa, "amx")        ? DSIB_ISA_AMX : -1;
        kt = isa >= 0 ? dsib_kern_table_for(isa) : NULL;
        if (!kt) {
            fprintf(stderr, "dsinfer-bench: ISA path '%s' is not available here\n", o->isa);
            return 1;
        }
    }
    const char *isa_name = kt ? kt->name : dsib_kern_isa_name();
    const uint32_t flags = o->exact ? DSIB_MM_EXACT : 0u;
    const char *path = o->exact ? "exact" : "default";
    dsib_threadpool *pool = NULL;
    char msg[256];
    if (dsib_threadpool_create(o->t, NULL, &pool, msg, sizeof msg) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: %s\n", msg);
        return 1;
    }
    limits l;
    measure_limits(o, pool, &l);
    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    /* default: one V4 routed expert's gate/up matrix */
    const int64_t n_in = (int64_t)o->shape_in, n_out = (int64_t)o->shape_out;
    const int64_t pp_tok = 128;
    size_t llc = bench_llc_bytes();
    size_t target = (size_t)256 << 20;
    if (target < 8 * llc) target = 8 * llc;
    if (o->cold_mib > 0) target = (size_t)o->cold_mib << 20; /* --cold-mib */

    if (o->json) {
        printf("{");
        print_build_json(stdout);
        printf(", \"cpu\": \"%s\", \"isa\": \"%s\", \"path\": \"%s\", \"threads\": %d, "
               "\"mem_read_gbs\": %.3f, \"fma_peak_gflops\": %.3f, \"shape\": [%lld, %lld], "
               "\"cold_mib\": %zu, \"prefetch_bytes\": [%d, %d], \"rows16_gather\": %s, \"q8_rows8\": %s, "
               "\"kernels\": [",
               cpu, isa_name, path, o->t, l.read_gbs, l.fma_gflops, (long long)n_out,
               (long long)n_in, target >> 20, (int)dsib_kern_prefetch, (int)dsib_kern_prefetch2,
               dsib_kern_rows16_gather_on() ? "true" : "false", dsib_kern_q8_rows8_on() ? "true" : "false");
    } else {
        printf("cpu: %s, kernels: %s, path: %s, threads: %d, sixteen-row tiles' scales: %s, Q8_0 "
               "one token on long rows: %s rows per tile\n",
               cpu, isa_name, path, o->t, dsib_kern_rows16_gather_on() ? "gathers" : "loads",
               dsib_kern_q8_rows8_on() ? "eight" : "sixteen");
        if (!o->no_limits)
            printf("memory read bandwidth: %.2f GB/s (best of 5, %zu MiB buffer)\n"
                   "FMA peak: %.1f GFLOP/s\n",
                   l.read_gbs, l.bw_bytes >> 20, l.fma_gflops);
        printf("matrix: %lld x %lld (out x in), matvec over distinct matrices totalling >= %zu "
               "MiB (cold weights)\n\n",
               (long long)n_out, (long long)n_in, target >> 20);
        printf("read BW* = read bandwidth measured again right before the row (best of 3, "
               "%zu MiB): on a shared machine the fraction uses it\n\n",
               target >> 20);
        printf("hot GB/s = the same matvec on one LLC-resident matrix (the kernel's compute "
               "ceiling)\n\n");
        printf("FMA peak* = f32 FMA peak measured again right after the row (best of 5); %% FMA "
               "peak uses the larger of it and the run's. The default path's integer dot "
               "products can exceed the f32 FMA peak (VNNI: 4 multiply-adds per 32-bit lane)\n\n");
        printf("(cpu) columns: the same rates per CPU time of this process (work x threads / "
               "CPU seconds, limits too), i.e. as if its threads had cores of their own\n\n");
        printf("| type          | MiB/matrix | tg GB/s (n_tok=1) | read BW* | %% read BW | hot GB/s | "
               "n_tok=4 GB/s | n_tok=8 GB/s | pp GFLOP/s (n_tok=%lld) | FMA peak* | %% FMA peak | "
               "%% BW (cpu) | hot (cpu) | %% FMA (cpu) |\n",
               (long long)pp_tok);
        printf("| ------------- | ---------: | ----------------: | -------: | --------: | -------: | "
               "-----------: | -----------: | ---------------------: | --------: | ---------: | ---------: | "
               "--------: | ----------: |\n");
    }
    int first = 1;
    uint64_t rng = 42;
    for (size_t ti = 0; ti < sizeof ktypes / sizeof ktypes[0]; ti++) {
        if (o->type && strcmp(o->type, ktypes[ti].name)) continue;
        int32_t type = ktypes[ti].type;
        size_t rb = dsib_kern_row_bytes(type, n_in), mb = rb * (size_t)n_out;
        size_t nm = (target + mb - 1) / mb;
        if (nm < 2) nm = 2;
        /* huge pages where the kernel gives them, like the library's PREAD weights */
        dsii_bigbuf wbuf;
        if (!dsii_bigbuf_alloc(NULL, mb * nm, 4096, &wbuf)) {
            fprintf(stderr, "dsinfer-bench: out of memory\n");
            return 1;
        }
        uint8_t *w = wbuf.p;
        for (size_t r = 0; r < (size_t)n_out * nm; r++) bench_fill_row(type, w + r * rb, n_in, &rng);
        float *x = malloc(sizeof(float) * (size_t)(n_in * pp_tok));
        float *y = malloc(sizeof(float) * (size_t)(n_out * pp_tok));
        void *act = NULL;
        /* rows of the type's own activation format, the one kmatmul quantises into (sized
         * for Q8_K alone, --isa runs of the Q8_32 types wrote past the end: their rows carry
         * lane corrections and pair scales, about 2.4x Q8_K's); F32 needs none */
        const size_t act_row = dsib_kern_act_row_bytes(dsib_kern_act_format(type, flags), n_in);
        size_t act_bytes = (act_row ? act_row : 64) * (size_t)pp_tok;
        if (!x || !y || posix_memalign(&act, 64, act_bytes) != 0) return 1;
        for (int64_t i = 0; i < n_in * pp_tok; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;

        double best1 = 0, best4 = 0, best8 = 0, bestpp = 0, best1_cpu = 0, besthot_cpu = 0, bestpp_cpu = 0;
        const double nth = (double)o->t;
        double near_bw_cpu = 0, near_pk_cpu = 0;
        double near_bw = o->no_limits ? 0 : bench_read_bandwidth(pool, target, 3, &near_bw_cpu);
        dsib_threadpool_stats_enable(pool, 1);
        static const int ntoks[] = {1, 4, 8}; /* decode, then 4 and 8 tokens (verify, batches) */
        for (int ni = 0; ni < 3; ni++) {
            const int ntok = ntoks[ni];
            if (ntok == 4) { /* the pool's figures of the cold matvecs (n_tok = 1) */
                dsib_pool_stats ps;
                dsib_threadpool_stats_get(pool, &ps);
                dsib_threadpool_stats_enable(pool, 0);
                if (!o->json)
                    fprintf(stderr, "%s cold matvec: %.1f%% of the tasks run by the workers, "
                            "barrier wait %.1f us per job, helper pickup %.2f us\n",
                            dsib_type_info_get(type) ? dsib_type_info_get(type)->name : "?",
                            ps.tasks ? 100.0 * ps.helper_tasks / ps.tasks : 0.0,
                            ps.jobs ? ps.wait_ns * 1e-3 / ps.jobs : 0.0,
                            ps.pickups ? ps.pickup_ns * 1e-3 / ps.pickups : 0.0);
            }
            for (int rep = 0; rep < o->r + 1; rep++) {
                double t0 = bench_now(), c0 = bench_cpu_seconds();
                for (size_t m = 0; m < nm; m++)
                    kmatmul(pool, kt, flags, type, w + m * mb, rb, n_in, n_out, x, y, ntok, act);
                double gbs = (double)(mb * nm) / (bench_now() - t0) * 1e-9;
                double dc = bench_cpu_seconds() - c0;
                if (rep == 0) continue; /* warm-up */
                if (ntok == 1 && gbs > best1) best1 = gbs;
                if (ntok == 1 && dc > 0 && (double)(mb * nm) * nth / dc * 1e-9 > best1_cpu)
                    best1_cpu = (double)(mb * nm) * nth / dc * 1e-9;
                if (ntok == 4 && gbs > best4) best4 = gbs;
                if (ntok == 8 && gbs > best8) best8 = gbs;
            }
        }
        /* compute ceiling: the same matrix again and again (it stays in the LLC) */
        double besthot = 0;
        for (int rep = 0; rep < 4 * o->r + 1; rep++) {
            double t0 = bench_now(), c0 = bench_cpu_seconds();
            for (int k = 0; k < 4; k++)
                kmatmul(pool, kt, flags, type, w, rb, n_in, n_out, x, y, 1, act);
            double gbs = 4.0 * (double)mb / (bench_now() - t0) * 1e-9;
            double dc = bench_cpu_seconds() - c0;
            if (rep > 0 && gbs > besthot) besthot = gbs;
            if (rep > 0 && dc > 0 && 4.0 * (double)mb * nth / dc * 1e-9 > besthot_cpu)
                besthot_cpu = 4.0 * (double)mb * nth / dc * 1e-9;
        }
        for (int rep = 0; rep < o->r + 1; rep++) {
            double t0 = bench_now(), c0 = bench_cpu_seconds();
            kmatmul(pool, kt, flags, type, w, rb, n_in, n_out, x, y, pp_tok, act);
            const double fl = 2.0 * (double)n_in * (double)n_out * (double)pp_tok;
            double g = fl / (bench_now() - t0) * 1e-9;
            double dc = bench_cpu_seconds() - c0;
            if (rep > 0 && g > bestpp) bestpp = g;
            if (rep > 0 && dc > 0 && fl * nth / dc * 1e-9 > bestpp_cpu) bestpp_cpu = fl * nth / dc * 1e-9;
        }
        /* the FMA peak measured again right after the row; the fraction uses the larger */
        double near_pk = o->no_limits ? 0 : bench_fma_peak(pool, 5, &near_pk_cpu);
        if (l.fma_gflops_cpu > near_pk_cpu) near_pk_cpu = l.fma_gflops_cpu;
        double pk = near_pk > l.fma_gflops ? near_pk : l.fma_gflops;
        double fbw = near_bw > 0 ? 100.0 * best1 / near_bw : 0;
        double fpk = pk > 0 ? 100.0 * bestpp / pk : 0;
        /* the same fractions per CPU time (bench_hw.h): robust to other processes' load */
        double fbw_cpu = near_bw_cpu > 0 ? 100.0 * best1_cpu / near_bw_cpu : 0;
        double fpk_cpu = near_pk_cpu > 0 ? 100.0 * bestpp_cpu / near_pk_cpu : 0;
        if (o->json) {
            printf("%s{\"type\": \"%s\", \"matrix_bytes\": %zu, \"matrices\": %zu, "
                   "\"tg_gbs\": %.3f, \"read_gbs_adjacent\": %.3f, \"tg_frac_read_bw\": %.4f, "
                   "\"hot_gbs\": %.3f, \"ntok4_gbs\": %.3f, \"ntok8_gbs\": %.3f, \"pp_gflops\": %.3f, "
                   "\"fma_peak_gflops_adjacent\": %.3f, \"pp_frac_fma_peak\": %.4f, "
                   "\"per_cpu_time\": {\"tg_gbs\": %.3f, \"read_gbs_adjacent\": %.3f, "
                   "\"tg_frac_read_bw\": %.4f, \"hot_gbs\": %.3f, \"pp_gflops\": %.3f, "
                   "\"fma_peak_gflops\": %.3f, \"pp_frac_fma_peak\": %.4f}}",
                   first ? "" : ", ", ktypes[ti].name, mb, nm, best1, near_bw, fbw / 100, besthot,
                   best4, best8, bestpp, near_pk, fpk / 100, best1_cpu, near_bw_cpu, fbw_cpu / 100,
                   besthot_cpu, bestpp_cpu, near_pk_cpu, fpk_cpu / 100);
        } else {
            printf("| %-13s | %10.2f | %17.2f | %8.2f | %8.1f%% | %8.2f | %12.2f | %12.2f | %22.1f | "
                   "%9.1f | %9.1f%% | %7.1f%% | %8.2f | %7.1f%% |\n",
                   ktypes[ti].name, (double)mb / 1048576.0, best1, near_bw, fbw, besthot, best4,
                   best8, bestpp, near_pk, fpk, fbw_cpu, besthot_cpu, fpk_cpu);
        }
        fflush(stdout);
        first = 0;
        dsii_bigbuf_free(NULL, &wbuf);
        free(x);
        free(y);
        free(act);
    }
    if (o->json) printf("]}\n");
    dsib_threadpool_free(pool);
    return 0;
}

/* ---- model runs ----------------------------------------------------------------------------- */

/* Bytes of weights read and matmul FLOPs per decoded token, from the bound tensors: every
 * tensor of the main path in full, except routed experts (the k used of E, as stored), the
 * token embedding (one row), V4 hash-routing tables (one row) and Engram tables (one row
 * per column). Draft blocks (MTP / DSpark) are not part of plain decoding. */
enum { C_ATTN, C_ROUTED, C_SHARED, C_ROUTER, C_ENGRAM, C_HEAD, C_COUNT };
static const char *const cat_names[C_COUNT] = {"attention+mHC+norms", "routed experts",
                                               "shared expert", "router", "engram", "embd+head"};

static int cat_of(const dsii_tensor *t) {
    const char *n = t->name ? t->name : "";
    if (strstr(n, "_exps")) return C_ROUTED;
    if (strstr(n, "shexp")) return C_SHARED;
    if (strstr(n, "gate_inp") || strstr(n, "exp_probs") || strstr(n, "tid2eid")) return C_ROUTER;
    if (strstr(n, "engram")) return C_ENGRAM;
    if (!strncmp(n, "output", 6) || !strncmp(n, "token_embd", 10)) return C_HEAD;
    return C_ATTN;
}

/* Bytes of weights read and matmul FLOPs per decoded token, by part and by storage type. */
typedef struct tok_cost {
    double bytes, flops, cat[C_COUNT];
    int n_types;
    int32_t type[16];
    double type_bytes[16];
} tok_cost;

static void add_cost(tok_cost *c, const dsii_tensor *t, double bytes, double flops) {
    c->bytes += bytes;
    c->flops += flops;
    c->cat[cat_of(t)] += bytes;
    int i = 0;
    while (i < c->n_types && c->type[i] != t->type) i++;
    if (i == c->n_types) {
        if (c->n_types == 16) return;
        c->type[c->n_types] = t->type;
        c->type_bytes[c->n_types++] = 0;
    }
    c->type_bytes[i] += bytes;
}

/* `per_row`: the part of `bytes` that every row of a step reads again (its embedding row,
 * hash-routing row, Engram rows); the rest is read once per step whatever its rows. */
static double g_per_row_bytes;
static void per_token_cost(const dsi_model *m, tok_cost *c) {
    memset(c, 0, sizeof *c);
    const dsii_model_tensors *w = &m->w;
    g_per_row_bytes = 0;
    if (w->token_embd) {
        add_cost(c, w->token_embd, (double)w->token_embd->row_bytes, 0);
        g_per_row_bytes += (double)w->token_embd->row_bytes;
    }
    const dsii_tensor *top[] = {w->output_norm, w->output, w->output_hc_fn, w->output_hc_base,
                                w->output_hc_scale};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
        if (!top[i]) continue;
        add_cost(c, top[i], (double)top[i]->nbytes,
                 top[i]->ne[1] > 1 ? 2.0 * (double)top[i]->n_elements : 0);
    }
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const dsii_layer_tensors *L = &w->layer[il];
        const dsii_tensor *const *fld = (const dsii_tensor *const *)(const void *)L;
        size_t nf = sizeof *L / sizeof(const dsii_tensor *);
        double k = m->hp.layer[il].n_expert_used;
        for (size_t i = 0; i < nf; i++) {
            const dsii_tensor *t = fld[i];
            if (!t || t->is_view) continue;
            if (t == L->ffn_gate_exps || t == L->ffn_up_exps || t == L->ffn_down_exps) {
                double e = (double)(t->ne[2] > 0 ? t->ne[2] : 1);
                add_cost(c, t, (double)t->nbytes * k / e, 2.0 * (double)t->n_elements * k / e);
            } else if (t == L->tid2eid) {
                add_cost(c, t, (double)t->row_bytes, 0);
                g_per_row_bytes += (double)t->row_bytes;
            } else if (t == L->engram_embd) {
                add_cost(c, t, (double)m->hp.engram.n_cols * (double)t->row_bytes, 0);
                g_per_row_bytes += (double)m->hp.engram.n_cols * (double)t->row_bytes;
            } else {
                add_cost(c, t, (double)t->nbytes, t->ne[1] > 1 ? 2.0 * (double)t->n_elements : 0);
            }
        }
    }
}

/* Name of the storage type holding most of the bytes read per token. */
static const char *main_type(const tok_cost *c) {
    int best = -1;
    for (int i = 0; i < c->n_types; i++)
        if (best < 0 || c->type_bytes[i] > c->type_bytes[best]) best = i;
    const dsii_type_traits *tr = best >= 0 ? dsii_type_get(c->type[best]) : NULL;
    return tr ? tr->name : "?";
}

static const char *type_name_of(int32_t type) {
    const dsii_type_traits *tr = dsii_type_get(type);
    return tr ? tr->name : "?";
}

/* The decode step's compute ceiling on the CPU: each weight type's matvec rate (n_tok = 1)
 * on a matrix that stays in the caches (1 MiB, rows of n_in columns, `pool`'s threads),
 * combined over the step's bytes by type — the time the step's matvecs would take if no
 * byte came from memory. With the read bandwidth it bounds decode from above:
 * time per token >= max(bytes / read BW, sum over types of bytes_t / hot_t). hot[i] = 0
 * for a type that has no CPU matmul (its bytes are left out of `covered`). */
typedef struct hot_ceiling {
    double hot[16];
    double gbs;     /* the step's bytes (covered) / their time at the hot rates */
    double covered; /* bytes per token of the measured types */
    int64_t n_in;
} hot_ceiling;

static void measure_hot_ceiling(dsib_threadpool *pool, uint32_t flags, const tok_cost *c,
                                int64_t n_embd, hot_ceiling *h) {
    memset(h, 0, sizeof *h);
    h->n_in = n_embd / 256 * 256;
    if (h->n_in < 256) h->n_in = 256;
    double t_sum = 0;
    uint64_t rng = 7;
    for (int i = 0; i < c->n_types; i++) {
        const int32_t type = c->type[i];
        if (c->type_bytes[i] <= 0) continue;
        const size_t rb = dsib_kern_row_bytes(type, h->n_in);
        if (rb == 0 || dsib_kern_check(type, h->n_in, 1, rb, h->n_in, 1, NULL, 0) != DSI_OK)
            continue;
        int64_t n_out = (int64_t)(((size_t)1 << 20) / rb);
        if (n_out < 64) n_out = 64;
        uint8_t *w = malloc(rb * (size_t)n_out);
        float *x = malloc(sizeof(float) * (size_t)h->n_in), *y = malloc(sizeof(float) * (size_t)n_out);
        if (!w || !x || !y) {
            free(w), free(x), free(y);
            continue;
        }
        for (int64_t r = 0; r < n_out; r++) bench_fill_row(type, w + (size_t)r * rb, h->n_in, &rng);
        for (int64_t k = 0; k < h->n_in; k++) x[k] = (float)((k * 7919) % 2001 - 1000) * 1e-3f;
        double best = 0;
        for (int rep = 0; rep < 9; rep++) {
            double t0 = bench_now();
            for (int k = 0; k < 16; k++)
                dsib_matmul(pool, flags, type, w, rb, h->n_in, n_out, x, h->n_in, y, n_out, 1);
            double gbs = 16.0 * (double)rb * (double)n_out / (bench_now() - t0) * 1e-9;
            if (rep > 0 && gbs > best) best = gbs; /* rep 0 warms the caches */
        }
        free(w), free(x), free(y);
        if (best <= 0) continue;
        h->hot[i] = best;
        h->covered += c->type_bytes[i];
        t_sum += c->type_bytes[i] / (best * 1e9);
    }
    h->gbs = t_sum > 0 ? h->covered / t_sum * 1e-9 : 0;
}

/* The 1-minute load average (/proc/loadavg), or -1. */
static double loadavg1(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f) {
        if (fscanf(f, "%lf", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

static double human_params(uint64_t n, const char **unit) {
    if (n >= 1000000000ull) { *unit = "B"; return (double)n / 1e9; }
    if (n >= 1000000ull) { *unit = "M"; return (double)n / 1e6; }
    *unit = "K";
    return (double)n / 1e3;
}

typedef struct test_result {
    char name[32];
    int n_prompt, n_gen;
    double samples[64];
    int n_samples;
    double mean, sd;
    double cpu_s, wall_s; /* process CPU time (user + sys) and wall time of the timed reps */
} test_result;

/* cpu_s / (wall_s * threads): the share of the requested cores the run got — on a shared
 * machine the figure to read first. */
static double cpu_share(const test_result *t, int threads) {
    return t->wall_s > 0 ? t->cpu_s / (t->wall_s * threads) : 0.0;
}

static int argmax(const float *v, int32_t n) {
    int best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* ---- where the time goes: per-op step profile and thread-pool statistics ------------------ */

typedef struct test_prof {
    dsii_prof ops;           /* lib/arch step profile of the timed repetitions */
    dsib_pool_stats pool;    /* the CPU instance's pool over the same repetitions */
    int have_pool;
    int pool_workers;        /* the pool's worker threads (threads − 1) */
    double wall_s;           /* wall time of the timed repetitions */
    double tokens;           /* tokens they evaluated */
} test_prof;

static dsib_threadpool *ctx_pool(dsi_context *ctx) {
    dsii_device *d = dsii_context_compute(ctx);
    if (!d || strcmp(d->name, "cpu") != 0 || !d->inst) return NULL;
    return d->inst->pool;
}

static void prof_start(dsi_model *model, dsi_context *ctx, test_prof *tp) {
    if (model->exec) dsii_exec_set_profile(model->exec, &tp->ops);
    dsib_threadpool *p = ctx_pool(ctx);
    if (p) dsib_threadpool_stats_enable(p, 1);
}

static void prof_stop(dsi_model *model, dsi_context *ctx, test_prof *tp) {
    if (model->exec) dsii_exec_set_profile(model->exec, NULL);
    dsib_threadpool *p = ctx_pool(ctx);
    if (p) {
        dsib_pool_stats st;
        dsib_threadpool_stats_get(p, &st);
        dsib_threadpool_stats_enable(p, 0);
        tp->pool.jobs += st.jobs;
        tp->pool.inline_jobs += st.inline_jobs;
        tp->pool.tasks += st.tasks;
        tp->pool.helper_tasks += st.helper_tasks;
        tp->pool.wait_ns += st.wait_ns;
        tp->pool.pickup_ns += st.pickup_ns;
        tp->pool.pickups += st.pickups;
        tp->pool.sleeps += st.sleeps;
        tp->pool.caller_ns += st.caller_ns;
        tp->pool.caller_task_ns += st.caller_task_ns;
        tp->pool.worker_task_ns += st.worker_task_ns;
        tp->pool_workers = dsib_threadpool_n_threads(p) - 1;
        tp->have_pool = 1;
    }
}

static int prof_cmp(const void *a, const void *b) {
    const dsii_prof_entry *x = a, *y = b;
    return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

/* The threads' time over the timed repetitions, as shares of their wall time: the calling
 * thread running tasks, inside the pool without a task (submission, barrier, wake-ups), and
 * outside the pool (the serial code between jobs: the ops that run on the caller, the
 * steps' and the API's own code); each worker running tasks (the rest is idle). */
typedef struct pool_split {
    double caller_tasks, caller_wait, caller_serial, worker_tasks;
} pool_split;

static pool_split pool_split_of(const test_prof *tp) {
    pool_split s = {0, 0, 0, 0};
    const double wall_ns = tp->wall_s * 1e9;
    if (!tp->have_pool || wall_ns <= 0) return s;
    const dsib_pool_stats *ps = &tp->pool;
    s.caller_tasks = (double)ps->caller_task_ns / wall_ns;
    s.caller_wait = (double)(ps->caller_ns - ps->caller_task_ns) / wall_ns;
    s.caller_serial = 1.0 - (double)ps->caller_ns / wall_ns;
    if (s.caller_serial < 0) s.caller_serial = 0;
    s.worker_tasks = tp->pool_workers > 0 ? (double)ps->worker_task_ns / wall_ns / tp->pool_workers : 0;
    return s;
}

/* Prints (or writes as JSON) the profile of one test: per token, the ops sorted by time,
 * the step's own overhead, the time outside steps, and the pool's barriers. */
static void prof_report(const char *test, test_prof *tp, int json, int first) {
    if (tp->tokens <= 0 || tp->wall_s <= 0) return;
    dsii_prof *p = &tp->ops;
    qsort(p->e, p->n, sizeof p->e[0], prof_cmp);
    const double tok = tp->tokens, wall_us = tp->wall_s * 1e6 / tok;
    double ops_us = 0;
    for (uint32_t i = 0; i < p->n; i++) ops_us += p->e[i].ns * 1e-3 / tok;
    const double step_us = p->step_ns * 1e-3 / tok;
    const dsib_pool_stats *ps = &tp->pool;
    const pool_split sp = pool_split_of(tp);
    if (json) {
        printf("%s\"%s\": {\"tokens\": %.0f, \"wall_us_per_token\": %.2f, \"step_us_per_token\": %.2f, "
               "\"ops_us_per_token\": %.2f, \"steps\": %llu, \"ops\": [",
               first ? "" : ", ", test, tok, wall_us, step_us, ops_us, (unsigned long long)p->steps);
        for (uint32_t i = 0; i < p->n; i++)
            printf("%s{\"name\": \"%s\", \"calls_per_token\": %.3f, \"us_per_token\": %.3f, "
                   "\"share\": %.5f}",
                   i ? ", " : "", p->e[i].name, p->e[i].calls / tok, p->e[i].ns * 1e-3 / tok,
                   p->e[i].ns * 1e-3 / tok / wall_us);
        printf("]");
        if (tp->have_pool)
            printf(", \"pool\": {\"jobs_per_token\": %.2f, \"inline_per_token\": %.2f, "
                   "\"tasks_per_job\": %.2f, \"helper_task_share\": %.4f, "
                   "\"barrier_wait_us_per_token\": %.2f, \"pickup_us_per_job\": %.3f, "
                   "\"sleeps_per_token\": %.3f, \"workers\": %d, \"caller_task_share\": %.4f, "
                   "\"caller_wait_share\": %.4f, \"caller_serial_share\": %.4f, "
                   "\"worker_task_share\": %.4f}",
                   ps->jobs / tok, ps->inline_jobs / tok,
                   ps->jobs ? (double)ps->tasks / ps->jobs : 0.0,
                   ps->tasks ? (double)ps->helper_tasks / ps->tasks : 0.0, ps->wait_ns * 1e-3 / tok,
                   ps->pickups ? ps->pickup_ns * 1e-3 / ps->pickups : 0.0, ps->sleeps / tok,
                   tp->pool_workers, sp.caller_tasks, sp.caller_wait, sp.caller_serial,
                   sp.worker_tasks);
        printf("}");
        return;
    }
    printf("\nwhere the time goes (%s, per token, wall time of the timed repetitions): %.1f us per "
           "token; inside steps %.1f us (%.1f%%), of which ops %.1f us\n",
           test, wall_us, step_us, 100.0 * step_us / wall_us, ops_us);
    printf("| op | calls/token | us/token | share |\n| -- | ---: | ---: | ---: |\n");
    double rest = 0;
    int shown = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        double us = p->e[i].ns * 1e-3 / tok;
        if (shown < 24 && us / wall_us >= 0.002) {
            printf("| %s | %.2f | %.1f | %.1f%% |\n", p->e[i].name, p->e[i].calls / tok, us,
                   100.0 * us / wall_us);
            shown++;
        } else {
            rest += us;
        }
    }
    printf("| (other ops) | | %.1f | %.1f%% |\n", rest, 100.0 * rest / wall_us);
    printf("| (step, outside ops: record / sync / io) | | %.1f | %.1f%% |\n", step_us - ops_us,
           100.0 * (step_us - ops_us) / wall_us);
    printf("| (outside steps: API, session, argmax) | | %.1f | %.1f%% |\n", wall_us - step_us,
           100.0 * (wall_us - step_us) / wall_us);
    if (tp->have_pool)
        printf("thread pool: %.1f jobs/token (%.1f tasks each, %.1f%% run by the workers), %.1f "
               "inline; barrier wait %.1f us/token (%.1f%%); helper pickup %.2f us/job; %.2f worker "
               "sleeps/token\n",
               ps->jobs / tok, ps->jobs ? (double)ps->tasks / ps->jobs : 0.0,
               ps->tasks ? 100.0 * ps->helper_tasks / ps->tasks : 0.0, ps->inline_jobs / tok,
               ps->wait_ns * 1e-3 / tok, 100.0 * ps->wait_ns * 1e-3 / tok / wall_us,
               ps->pickups ? ps->pickup_ns * 1e-3 / ps->pickups : 0.0, ps->sleeps / tok);
    if (tp->have_pool && tp->pool_workers > 0)
        printf("threads' time (shares of the wall time): the calling thread ran tasks %.1f%%, "
               "waited in the pool %.1f%% (submissions, barriers), ran serial code outside the "
               "pool %.1f%%; the %s ran tasks %.1f%% (idle %.1f%%)\n",
               100.0 * sp.caller_tasks, 100.0 * sp.caller_wait, 100.0 * sp.caller_serial,
               tp->pool_workers == 1 ? "worker" : "workers, each on average",
               100.0 * sp.worker_tasks, 100.0 * (1.0 - sp.worker_tasks));
}

/* ---- --sessions: the serving frontier --------------------------------------------------- */

static uint64_t cpu_expert_bytes(dsi_context *ctx) {
    dsii_device *d = dsii_context_compute(ctx);
    if (!d || strcmp(d->name, "cpu") != 0) return 0;
    return atomic_load(&d->inst->stat_expert_bytes);
}

/* The attention products' FLOPs the CPU backend counted (cpu_impl.h stat_attn_flops); 0 on
 * other backends. */
static uint64_t cpu_attn_flops(dsi_context *ctx) {
    dsii_device *d = dsii_context_compute(ctx);
    if (!d || strcmp(d->name, "cpu") != 0) return 0;
    return atomic_load(&d->inst->stat_attn_flops);
}

static int run_sessions(const opts *o, dsi_context *ctx, dsi_model *model, const limits *l,
                        double tok_bytes, const double *cat_bytes, int32_t nv) {
    int bs[16], nb = 0;
    for (const char *p = o->sessions; *p && nb < 16;) {
        int v = atoi(p);
        if (v < 1 || v > 64) {
            fprintf(stderr, "dsinfer-bench: bad --sessions entry\n");
            return 1;
        }
        bs[nb++] = v;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    int n = o->n_given && o->n > 0 ? o->n : 32, reps = o->r, P = 16;
    int on_cpu = strcmp(dsi_context_backend(ctx), "cpu") == 0;
    /* read once per step: everything but the routed experts and the per-row parts */
    double shared = tok_bytes - cat_bytes[C_ROUTED] - g_per_row_bytes;
    printf("\nserving frontier: B sessions decode together (dsi_session_append_batch), %d steps x "
           "%d repetitions, prompts of %d tokens; backend %s, %d threads\n",
           n, reps, P, dsi_context_backend(ctx), o->t);
    printf("weights read once per step: %.1f MiB (+ %.3f MiB per row; routed experts: %.2f MiB per "
           "token at k/E)\n\n",
           shared / 1048576.0, g_per_row_bytes / 1048576.0, cat_bytes[C_ROUTED] / 1048576.0);
    printf("| B | agg t/s | t/s per session | ms/step | MiB/step (experts) | bytes bound x | "
           "measured x | eff GB/s | %% read BW |\n");
    printf("| -: | ------: | --------------: | ------: | -----------------: | ------------: | "
           "---------: | -------: | --------: |\n");
    double agg1 = 0, bytes1 = 0;
    int fail = 0;
    static test_prof prof_reports[16];
    static char prof_names[16][32];
    int n_reports = 0;
    for (int bi = 0; bi < nb && !fail; bi++) {
        int B = bs[bi];
        dsi_session *s[64];
        dsi_token *tok = calloc((size_t)B, sizeof *tok);
        const dsi_token *tp[64];
        size_t tn[64];
        dsi_session_options so;
        dsi_session_options_init(&so);
        so.n_ctx = (uint32_t)(P + (reps + 1) * n + 8);
        for (int i = 0; i < B; i++) s[i] = NULL;
        for (int i = 0; i < B && !fail; i++)
            if (dsi_session_create(model, &so, &s[i]) != DSI_OK) {
                fprintf(stderr, "dsinfer-bench: session: %s\n", dsi_last_error());
                fail = 1;
            }
        dsi_token *prompts = calloc((size_t)B * P, sizeof *prompts);
        uint64_t rng = 99;
        for (int i = 0; i < B * P; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i] = (dsi_token)((rng >> 33) % (uint64_t)(nv > 16 ? nv - 16 : nv));
        }
        for (int i = 0; i < B; i++) {
            tp[i] = prompts + (size_t)i * P;
            tn[i] = (size_t)P;
        }
        if (!fail && dsi_session_append_batch((size_t)B, s, tp, tn, NULL) != DSI_OK) {
            fprintf(stderr, "dsinfer-bench: prefill: %s\n", dsi_last_error());
            fail = 1;
        }
        double samples[64];
        int ns = 0;
        uint64_t ebytes = 0;
        static test_prof sprof;
        memset(&sprof, 0, sizeof sprof);
        for (int rep = 0; rep < reps + 1 && !fail; rep++) {
            uint64_t e0 = cpu_expert_bytes(ctx);
            if (rep > 0) prof_start(model, ctx, &sprof);
            double t0 = bench_now();
            for (int step = 0; step < n && !fail; step++) {
                for (int i = 0; i < B; i++) {
                    const float *lg = NULL;
                    int32_t k = 0;
                    tok[i] = dsi_session_logits(s[i], &lg, &k) == DSI_OK ? argmax(lg, k) : 0;
                    tp[i] = &tok[i];
                    tn[i] = 1;
                }
                if (dsi_session_append_batch((size_t)B, s, tp, tn, NULL) != DSI_OK) {
                    fprintf(stderr, "dsinfer-bench: batch step: %s\n", dsi_last_error());
                    fail = 1;
                }
            }
            double dt = bench_now() - t0;
            if (rep == 0) continue; /* warm-up */
            prof_stop(model, ctx, &sprof);
            sprof.wall_s += dt;
            sprof.tokens += (double)n; /* per step */
            samples[ns++] = dt;
            ebytes += cpu_expert_bytes(ctx) - e0;
        }
        if (!fail && ns > 0) {
            double mean, sd;
            mean_sd(samples, ns, &mean, &sd);
            double step_s = mean / n;
            double agg = B / step_s, per = 1.0 / step_s;
            double eb = on_cpu ? (double)ebytes / ((double)ns * n) : (double)B * cat_bytes[C_ROUTED];
            double bytes = shared + B * g_per_row_bytes + eb;
            if (bi == 0 && B == 1) agg1 = agg, bytes1 = bytes;
            double bound = bytes1 > 0 ? B * bytes1 / bytes : 0;
            double meas = agg1 > 0 ? agg / agg1 : 0;
            double eff = bytes / step_s * 1e-9;
            printf("| %d | %.2f | %.2f | %.1f | %.1f (%.1f%s) | %.2f | %.2f | %.2f | %.1f%% |\n", B,
                   agg, per, 1000.0 * step_s, bytes / 1048576.0, eb / 1048576.0,
                   on_cpu ? "" : " est", bound, meas, eff,
                   l->read_gbs > 0 ? 100.0 * eff / l->read_gbs : 0.0);
        }
        if (!fail && ns > 0) {
            char name[32];
            snprintf(name, sizeof name, "B=%d step", B);
            prof_reports[n_reports] = sprof;
            snprintf(prof_names[n_reports], sizeof prof_names[0], "%s", name);
            n_reports++;
        }
        for (int i = 0; i < B; i++) dsi_session_free(s[i]);
        free(tok);
        free(prompts);
    }
    for (int i = 0; i < n_reports; i++) prof_report(prof_names[i], &prof_reports[i], 0, 1);
    if (!o->no_limits)
        printf("\nmemory read bandwidth measured in this run: %.2f GB/s\n", l->read_gbs);
    return fail;
}

/* ---- --spec: speculative decoding vs plain, same run ------------------------------------- */

static dsi_session *spec_session(dsi_model *model, uint32_t n_ctx, uint32_t spec, int draft_max) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = n_ctx;
    so.spec = spec;
    if (spec) so.draft_max = draft_max > 0 ? (uint32_t)draft_max : 0;
    dsi_session *s = NULL;
    if (dsi_session_create(model, &so, &s) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: session: %s\n", dsi_last_error());
        return NULL;
    }
    return s;
}

static int run_spec(const opts *o, dsi_context *ctx, dsi_model *model, int32_t nv, double tok_bytes,
                    const double *cat_bytes) {
    const char *texts[5] = {o->prompt ? o->prompt : "In the beginning God created the heaven and the earth.",
                            "And the LORD spake unto Moses, saying,",
                            "Blessed are the poor in spirit: for theirs is the kingdom of heaven.",
                            "The LORD is my shepherd; I shall not want.",
                            "And it came to pass in those days, that"};
    const int n_prompts = 5, n = o->n_given ? o->n : 128;
    uint32_t n_ctx = 128 + (uint32_t)n + 64;
    dsi_sampler_options sopt;
    dsi_sampler_options_init(&sopt);
    sopt.temperature = 0.0f;
    double ms[3] = {0, 0, 0};
    uint64_t gen[3] = {0, 0, 0}, steps = 0, drafted = 0, accepted = 0, asteps = 0, aacc = 0;
    int identical = 1, fail = 0;
    static dsi_token out[3][4096];
    size_t nout[3] = {0, 0, 0};
    for (int rep = 0; rep < (o->spec_steps ? 0 : o->r + 1) && !fail; rep++) {
        for (int pi = 0; pi < n_prompts && !fail; pi++) {
            dsi_token prompt[256];
            size_t np = 0;
            if (dsi_tokenize(model, texts[pi], strlen(texts[pi]), 0, prompt, 256, &np) != DSI_OK || np == 0) {
                for (np = 0; np < 16; np++) prompt[np] = (dsi_token)((np * 7919u + (size_t)pi) % (size_t)nv);
            }
            for (int mode = 0; mode < 3 && !fail; mode++) { /* off, on, auto */
                dsi_session *s = spec_session(model, n_ctx, mode == 2 ? DSI_SPEC_AUTO : mode ? DSI_SPEC_ON : DSI_SPEC_OFF, o->draft_max);
                if (!s) return 1;
                dsi_sampler *smp = NULL;
                dsi_sampler_create(&sopt, &smp);
                dsi_generate_options go;
                dsi_generate_options_init(&go);
                go.prompt = prompt;
                go.n_prompt = np;
                go.max_tokens = n;
                dsi_generate_result r;
                dsi_generate_result_init(&r);
                if (dsi_session_generate(s, smp, &go, &r) != DSI_OK) {
                    fprintf(stderr, "dsinfer-bench: generate: %s\n", dsi_session_last_error(s));
                    fail = 1;
                }
                dsi_session_tokens(s, out[mode], 4096, &nout[mode]);
                if (rep > 0) { /* the first round warms up */
                    ms[mode] += r.decode_ms;
                    gen[mode] += r.n_generated;
                    if (mode == 2) {
                        asteps += r.n_spec_steps;
                        aacc += r.n_accepted;
                    } else if (mode) {
                        steps += r.n_spec_steps;
                        drafted += r.n_drafted;
                        accepted += r.n_accepted;
                    }
                }
                dsi_sampler_free(smp);
                dsi_session_free(s);
            }
            for (int m = 1; m < 3; m++)
                if (nout[0] != nout[m] || memcmp(out[0], out[m], nout[0] * sizeof(dsi_token)) != 0) identical = 0;
        }
    }
    if (fail) return 1;
    /* where the time goes: one-token step, verify step (1 + k rows), draft call, alone —
     * interleaved, so that the machine's load drifts into all three alike; the routed-expert
     * bytes each step read come from the CPU backend's counter (each selected expert once per
     * step, whatever the rows that chose it) */
    dsi_session *s = spec_session(model, n_ctx, DSI_SPEC_ON, o->draft_max);
    if (!s) return 1;
    dsi_token base[64];
    for (int i = 0; i < 64; i++) base[i] = (dsi_token)((i * 7919) % nv);
    dsi_session_sync(s, base, 48, NULL);
    uint32_t k = (uint32_t)(o->draft_max > 0 ? o->draft_max : (int)s->draft_max);
    const int R = o->spec_steps ? (o->r > 0 ? 4 * o->r : 20) : 20;
    double t_one = 0, t_ver = 0, t_draft = 0;
    uint64_t eb_one = 0, eb_ver = 0, eb_draft = 0;
    float *buf = malloc(sizeof(float) * (size_t)nv * (k + 1));
    dsi_token ids[16];
    size_t nd = 0;
    for (int i = -1; i < R && buf; i++) { /* i = -1 warms up */
        uint64_t e0 = cpu_expert_bytes(ctx);
        double t0 = bench_now();
        dsi_session_append(s, base + 48, 1);
        double d1 = bench_now() - t0;
        uint64_t e1 = cpu_expert_bytes(ctx);
        dsii_session_rewind(s, 48);
        t0 = bench_now();
        dsii_session_append_all_logits(s, base + 48, k + 1, buf);
        double d2 = bench_now() - t0;
        uint64_t e2 = cpu_expert_bytes(ctx);
        dsii_session_rewind(s, 48);
        t0 = bench_now();
        dsi_session_draft(s, base[48], ids, NULL, 16, &nd);
        double d3 = bench_now() - t0;
        uint64_t e3 = cpu_expert_bytes(ctx);
        if (i < 0) continue;
        t_one += d1, t_ver += d2, t_draft += d3;
        eb_one += e1 - e0, eb_ver += e2 - e1, eb_draft += e3 - e2;
    }
    free(buf);
    dsi_session_free(s);
    if (!o->spec_steps) {
        double ts_off = gen[0] / (ms[0] / 1e3), ts_on = gen[1] / (ms[1] / 1e3);
        double acc = steps ? (double)accepted / (double)steps : 0;
        double tps = steps ? (double)gen[1] / (double)steps : 0;
        printf("| mode | tokens | t/s | accepted / step | tokens / step |\n| ---- | ---: | --: | --: | --: |\n");
        printf("| plain | %llu | %.2f | - | 1 |\n", (unsigned long long)gen[0], ts_off);
        printf("| spec (draft max %u) | %llu | %.2f | %.3f (%llu of %llu drafted) | %.3f |\n", k,
               (unsigned long long)gen[1], ts_on, acc, (unsigned long long)accepted,
               (unsigned long long)drafted, tps);
        double ts_auto = gen[2] / (ms[2] / 1e3);
        printf("| auto (speculates while faster) | %llu | %.2f | %llu verify steps, %llu accepted | - |\n",
               (unsigned long long)gen[2], ts_auto, (unsigned long long)asteps, (unsigned long long)aacc);
        printf("\nspeed-up %.3fx (auto %.3fx); output identical to plain decoding: %s (%d prompts x %d "
               "tokens x %d reps)\n", ts_on / ts_off, ts_auto / ts_off, identical ? "yes" : "NO",
               n_prompts, n, o->r);
        printf("bound from the step times below: a spec step costs draft + verify = %.2f ms for %.3f "
               "tokens -> %.1f t/s (plain %.1f t/s at %.2f ms / token)\n",
               1e3 * (t_draft + t_ver) / R, tps, tps / ((t_draft + t_ver) / R), R / t_one,
               1e3 * t_one / R);
    }
    printf("step times (each alone, interleaved, mean of %d): one-token step %.2f ms, verify step of "
           "%u rows %.2f ms (%.2fx), draft call %.2f ms (%.2fx)\n", R, 1e3 * t_one / R, k + 1,
           1e3 * t_ver / R, t_ver / t_one, 1e3 * t_draft / R, t_draft / t_one);
    /* weight bytes: shared tensors once per step, per-row parts per row, the routed experts
     * as counted (CPU); the verify step's bound is the one-token step's time scaled by the
     * bytes ratio (same run, same machine state) */
    int on_cpu = strcmp(dsi_context_backend(ctx), "cpu") == 0;
    double shared = tok_bytes - cat_bytes[C_ROUTED] - g_per_row_bytes;
    double e1 = on_cpu ? (double)eb_one / R : cat_bytes[C_ROUTED];
    double ev = on_cpu ? (double)eb_ver / R : cat_bytes[C_ROUTED] * (k + 1);
    double b1 = shared + g_per_row_bytes + e1, bv = shared + (k + 1) * g_per_row_bytes + ev;
    printf("weights read: one-token step %.1f MiB (routed experts %.1f), verify step %.1f MiB "
           "(routed experts %.1f = %.2fx one token's%s), draft call routed experts %.1f MiB\n",
           b1 / 1048576.0, e1 / 1048576.0, bv / 1048576.0, ev / 1048576.0, e1 > 0 ? ev / e1 : 0.0,
           on_cpu ? "" : ", estimated", (double)eb_draft / R / 1048576.0);
    double bound = b1 > 0 ? bv / b1 : 0;
    printf("verify step: bytes bound %.2fx a one-token step, measured %.2fx -> %.2fx the bound "
           "(target <= 1.15)\n", bound, t_ver / t_one, bound > 0 ? (t_ver / t_one) / bound : 0.0);
    return o->spec_steps || identical ? 0 : 1;
}

/* ---- --ttft: persistence ------------------------------------------------------------------ */

static int run_ttft(const opts *o, dsi_context *ctx, dsi_model *model, int32_t nv) {
    int N = o->ttft;
    char dir[512];
    if (o->cache_dir) {
        snprintf(dir, sizeof dir, "%s", o->cache_dir);
    } else {
        snprintf(dir, sizeof dir, "/tmp/dsinfer-bench-ttft-XXXXXX");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "dsinfer-bench: mkdtemp failed\n");
            return 1;
        }
    }
    dsi_token *prompt = malloc(sizeof(dsi_token) * (size_t)N);
    if (!prompt) return 1;
    uint64_t rng = 4321;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (dsi_token)((rng >> 33) % (uint64_t)(nv > 16 ? nv - 16 : nv));
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = (uint32_t)N + 16;
    dsi_prompt_cache_options pco;
    dsi_prompt_cache_options_init(&pco);
    pco.dir = dir;
    dsi_session *a = NULL;
    int fail = 0;
    if (dsi_session_create(model, &so, &a) != DSI_OK || dsi_session_set_prompt_cache(a, &pco) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: session: %s\n", dsi_last_error());
        free(prompt);
        return 1;
    }
    /* cold (the cache is empty; its one entry is written at the end of this sync) */
    double t0 = bench_now();
    if (dsi_session_sync(a, prompt, (size_t)N, NULL) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: sync: %s\n", dsi_session_last_error(a));
        fail = 1;
    }
    double t_cold_all = bench_now() - t0;
    dsi_prompt_cache_stats st;
    dsi_prompt_cache_stats_init(&st);
    dsi_session_prompt_cache_stats(a, &st);
    double t_write = st.write_ns * 1e-9, t_cold = t_cold_all - t_write;
    uint64_t entry_bytes = st.bytes_written;
    /* snapshot file of the whole prompt (with its logits) */
    char snap[600];
    snprintf(snap, sizeof snap, "%s/ttft.dsis", dir);
    t0 = bench_now();
    if (!fail && dsi_session_save_file(a, snap) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: save: %s\n", dsi_session_last_error(a));
        fail = 1;
    }
    double t_save = bench_now() - t0;
    double cached[64], loaded[64];
    int nr = o->r < 64 ? o->r : 64;
    size_t reused = 0;
    for (int rep = 0; rep < nr && !fail; rep++) {
        dsi_session *b = NULL;
        if (dsi_session_create(model, &so, &b) != DSI_OK || dsi_session_set_prompt_cache(b, &pco) != DSI_OK) {
            fail = 1;
            break;
        }
        t0 = bench_now();
        if (dsi_session_sync(b, prompt, (size_t)N, &reused) != DSI_OK) fail = 1;
        cached[rep] = bench_now() - t0;
        /* the entry of this prefix exists: nothing is written */
        dsi_session_free(b);
        dsi_session *c = NULL;
        if (dsi_session_create(model, &so, &c) != DSI_OK) {
            fail = 1;
            break;
        }
        t0 = bench_now();
        const float *lg = NULL;
        if (dsi_session_load_file(c, snap) != DSI_OK || dsi_session_logits(c, &lg, NULL) != DSI_OK) {
            fprintf(stderr, "dsinfer-bench: load: %s\n", dsi_session_last_error(c));
            fail = 1;
        }
        loaded[rep] = bench_now() - t0;
        dsi_session_free(c);
    }
    long long snap_bytes = 0;
    FILE *fp = fopen(snap, "rb");
    if (fp) {
        fseek(fp, 0, SEEK_END);
        snap_bytes = ftell(fp);
        fclose(fp);
    }
    double mc = 0, sc = 0, ml = 0, sl = 0;
    if (!fail && nr > 0) {
        mean_sd(cached, nr, &mc, &sc);
        mean_sd(loaded, nr, &ml, &sl);
    }
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(model, &info);
    printf("| model | backend | threads | prompt | cold TTFT s | disk-cache TTFT s (reused) | snapshot TTFT s |\n");
    printf("| ----- | ------- | ------: | -----: | ----------: | -------------------------: | --------------: |\n");
    printf("| %s | %s | %d | %d | %.2f | %.3f ± %.3f (%zu) | %.3f ± %.3f |\n",
           info.name[0] ? info.name : info.arch_name, dsi_context_backend(ctx), o->t, N, t_cold,
           mc, sc, reused, ml, sl);
    printf("\ncold: %.1f t/s prefill; cache entry %.1f MiB written in %.3f s (%.0f MiB/s incl. "
           "fsync); snapshot %.1f MiB saved in %.3f s, loaded in %.3f s (%.0f MiB/s incl. "
           "validation); speed-up over cold: disk cache %.1fx, snapshot %.1fx (%d repetitions)\n",
           N / (t_cold > 0 ? t_cold : 1), entry_bytes / 1048576.0, t_write,
           t_write > 0 ? entry_bytes / 1048576.0 / t_write : 0.0, snap_bytes / 1048576.0, t_save,
           ml, ml > 0 ? snap_bytes / 1048576.0 / ml : 0.0, mc > 0 ? t_cold / mc : 0.0,
           ml > 0 ? t_cold / ml : 0.0, nr);
    dsi_session_free(a);
    if (!o->cache_dir) {
        /* our own directory: remove its files */
        unlink(snap);
        DIR *d = opendir(dir);
        struct dirent *de;
        char p[1200];
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, ".."))) continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        if (d) closedir(d);
        rmdir(dir);
    }
    free(prompt);
    return fail;
}

/* ---- -d: context depths (issue 19; docs/internals.md "Depth") ----------------------------- */

/* Timing wrappers of the ops whose cost grows with depth (the indexer's scan) or is fixed by
 * it (attention over top-k + window rows). Only meaningful on a backend whose ops run when
 * called (the CPU); elsewhere the split is not reported. */
static const dsib_backend *g_depth_orig;
static dsib_backend g_depth_be;
static struct dsib_ops g_depth_ops;
static double g_t_idx, g_t_attn;

static dsi_status w_indexer_topk(dsib_stream *s, dsib_view q, uint32_t ldq, dsib_view w,
                                 uint32_t ldw, const dsib_state *keys, uint32_t heads,
                                 uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                                 uint32_t topk, dsib_view idx) {
    double t0 = bench_now();
    dsi_status st = g_depth_orig->ops->indexer_topk(s, q, ldq, w, ldw, keys, heads, hd, rows, n,
                                                    ratio, topk, idx);
    g_t_idx += bench_now() - t0;
    return st;
}
static dsi_status w_indexer_topk_v41(dsib_stream *s, dsib_view q, uint32_t ldq, dsib_view w,
                                     uint32_t ldw, const dsib_state *keys, uint32_t heads,
                                     uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                                     uint32_t topk, dsib_view idx, dsib_view cand_in,
                                     dsib_view cand_out, uint32_t cand_block, uint32_t cand_k) {
    double t0 = bench_now();
    dsi_status st = g_depth_orig->ops->indexer_topk_v41(s, q, ldq, w, ldw, keys, heads, hd, rows,
                                                        n, ratio, topk, idx, cand_in, cand_out,
                                                        cand_block, cand_k);
    g_t_idx += bench_now() - t0;
    return st;
}
static dsi_status w_attn_sink(dsib_stream *s, dsib_view q, uint32_t ldq, uint32_t H, uint32_t hd,
                              dsib_view rows, uint32_t n, uint32_t window,
                              const dsib_state *ring, dsib_view kv, uint32_t ldkv,
                              uint32_t comp_ratio, const dsib_state *comp, dsib_view idx,
                              uint32_t topk, const dsib_weight *sinks, float scale,
                              dsib_view out, uint32_t ldo) {
    double t0 = bench_now();
    dsi_status st = g_depth_orig->ops->attn_sink(s, q, ldq, H, hd, rows, n, window, ring, kv,
                                                 ldkv, comp_ratio, comp, idx, topk, sinks, scale,
                                                 out, ldo);
    g_t_attn += bench_now() - t0;
    return st;
}

/* Bytes per token of context of the compressed rows + index keys at the released shapes
 * (model-spec §3.8, §4.8), stored as libdsinfer stores them (lib/quant/statepack.h). */
static void released_bpt(double *v4_packed, double *v4_f32, double *v41_packed, double *v41_f32) {
    double crow = dsii_sp_row_bytes(DSII_SP_E4M3_UE8M0, 512, 448, 64); /* + 64 RoPE dims f32 */
    double key = dsii_sp_row_bytes(DSII_SP_E2M1_UE8M0, 128, 128, 32);
    *v4_packed = 21.0 * (crow + key) / 4 + 20.0 * crow / 128;
    *v4_f32 = 21.0 * (512 + 128) * 4 / 4 + 20.0 * 512 * 4 / 128;
    double c41 = dsii_sp_row_bytes(DSII_SP_E2M1_E4M3, 512, 512, 16);
    *v41_packed = 3.0 * (c41 + key) / 2 + (c41 + key);
    *v41_f32 = 3.0 * (512 + 128) * 4 / 2 + (512 + 128) * 4;
}

/* Rewinds s to its first D tokens; anything but an exact rewind (which re-evaluates token
 * D-1 at most) would re-prefill the depth for real and time something else: a failure. */
static dsi_status depth_sync(dsi_session *s, const dsi_token *tok, uint32_t D) {
    size_t reused = 0;
    dsi_status st = dsi_session_sync(s, tok, D, &reused);
    if (st == DSI_OK && reused + 1 < D) {
        fprintf(stderr, "dsinfer-bench: -d: the rewind to depth %u was not exact (%zu tokens "
                        "kept)\n", D, reused);
        return DSI_ERR_INTERNAL;
    }
    return st;
}

static int run_depth(const opts *o, dsi_context *ctx, dsi_model *model, const dsi_model_info *info) {
    int pp = o->p_given ? o->p : 128, tg = o->n_given ? o->n : 32;
    /* back to depth D after a test re-evaluates token D-1 (its logits), so a test of k
     * tokens rewinds k + 1: within the exact-rewind margin (DSII_DEFAULT_MARGIN, 256) when
     * k <= 255. Beyond it the sync would prefill the whole depth for real. */
    if (pp > 255 || tg > 255) {
        fprintf(stderr, "dsinfer-bench: -d: -p and -n at most 255 (the exact-rewind margin 256 "
                        "less the re-evaluated last token of the depth)\n");
        return 2;
    }
    uint32_t dv[16];
    int nd = 0;
    for (const char *q = o->depths; *q && nd < 16;) {
        char *end = NULL;
        long v = strtol(q, &end, 10);
        if (end == q || v < 0 || v > (1L << 30)) {
            fprintf(stderr, "dsinfer-bench: -d wants a list of depths, e.g. 0,4096,16384\n");
            return 2;
        }
        dv[nd++] = (uint32_t)v;
        q = *end == ',' ? end + 1 : end;
    }
    dsii_device *dev = dsii_context_compute(ctx);
    int split = dev && !strcmp(dev->name, "cpu");
    if (split) {
        g_depth_orig = dev->be;
        g_depth_be = *dev->be;
        memset(&g_depth_ops, 0, sizeof g_depth_ops);
        size_t osz = dev->be->ops->struct_size < sizeof g_depth_ops ? dev->be->ops->struct_size
                                                                    : sizeof g_depth_ops;
        memcpy(&g_depth_ops, dev->be->ops, osz);
        if (g_depth_ops.indexer_topk) g_depth_ops.indexer_topk = w_indexer_topk;
        if (g_depth_ops.indexer_topk_v41) g_depth_ops.indexer_topk_v41 = w_indexer_topk_v41;
        if (g_depth_ops.attn_sink) g_depth_ops.attn_sink = w_attn_sink;
        g_depth_be.ops = &g_depth_ops;
        dev->be = &g_depth_be;
    }
    const int32_t nv = info->n_vocab;
    const uint32_t train = (uint32_t)info->n_ctx_train;
    const char *mname = info->name[0] ? info->name : info->arch_name;
    printf("context depths: %s, %s, %d threads, pp%d and tg%d at each depth (%d repetitions), "
           "depth state %s\n\n",
           mname, dsi_context_backend(ctx), o->t, pp, tg, o->r,
           o->real_depth ? "prefilled" : "synthetic (random rows on the grids)");
    printf("| depth | pp t/s | tg t/s | tg ms/token | indexer ms | attention ms | rest ms | "
           "state B/token | state at depth MiB |\n");
    printf("| ----: | -----: | -----: | ----------: | ---------: | -----------: | ------: | "
           "------------: | -----------------: |\n");
    double tg0 = 0;
    int fail = 0;
    for (int di = 0; di < nd && !fail; di++) {
        uint32_t D = dv[di];
        const uint32_t extra = (uint32_t)pp + (uint32_t)tg + 16;
        uint32_t n_ctx = D + extra;
        if (train && n_ctx > train && D <= train && train > extra) {
            /* the trained context itself: the deepest depth that leaves room for the tests */
            printf("| (%u: %u = the trained context less the %u tested tokens) | | | | | | | | |\n",
                   D, train - extra, extra);
            D = train - extra;
            n_ctx = train;
        }
        if (train && n_ctx > train) {
            printf("| %u | (beyond the trained context %u) | | | | | | | |\n", D, train);
            continue;
        }
        dsi_session_options so;
        dsi_session_options_init(&so);
        so.n_ctx = n_ctx;
        dsi_session *s = NULL;
        if (dsi_session_create(model, &so, &s) != DSI_OK) {
            printf("| %u | session: %s | | | | | | | |\n", D, dsi_last_error());
            continue;
        }
        size_t ntok = (size_t)D + (size_t)pp + (size_t)tg;
        dsi_token *tok = malloc(sizeof *tok * ntok);
        uint64_t rng = 99 + D;
        for (size_t i = 0; i < ntok; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (dsi_token)((rng >> 33) % (uint64_t)(nv > 16 ? nv - 16 : nv));
        }
        dsii_error e;
        dsii_error_clear(&e);
        dsi_status st = o->real_depth ? dsi_session_sync(s, tok, D, NULL)
                                      : dsii_session_fill_synthetic(s, tok, D, 7 + D, &e);
        if (st != DSI_OK) {
            printf("| %u | fill: %s | | | | | | | |\n", D,
                   o->real_depth ? dsi_session_last_error(s) : e.msg);
            fail = 1;
        }
        test_result tp, tt;
        memset(&tp, 0, sizeof tp);
        memset(&tt, 0, sizeof tt);
        double ti = 0, ta = 0;
        for (int rep = 0; rep < o->r + 1 && !fail; rep++) {
            /* back to depth D (an exact rewind: no work but the last token at most) */
            if (D && depth_sync(s, tok, D) != DSI_OK) fail = 1;
            if (!D) dsi_session_reset(s);
            double t0 = bench_now(), dt = 0;
            if (pp > 0) { /* -p 0: no prefill test */
                if (!fail && dsi_session_append(s, tok + D, (size_t)pp) != DSI_OK) fail = 1;
                dt = bench_now() - t0;
                if (rep > 0 && tp.n_samples < 64) tp.samples[tp.n_samples++] = pp / dt;
                if (D && depth_sync(s, tok, D) != DSI_OK) fail = 1;
                if (!D) dsi_session_reset(s);
            }
            g_t_idx = g_t_attn = 0;
            t0 = bench_now();
            for (int i = 0; i < tg && !fail; i++)
                if (dsi_session_append(s, tok + D + i, 1) != DSI_OK) fail = 1;
            dt = bench_now() - t0;
            if (rep > 0 && tg > 0 && tt.n_samples < 64) {
                tt.samples[tt.n_samples++] = tg / dt;
                ti += g_t_idx;
                ta += g_t_attn;
            }
        }
        if (fail) {
            printf("| %u | failed: %s | | | | | | | |\n", D, dsi_session_last_error(s));
        } else {
            mean_sd(tp.samples, tp.n_samples, &tp.mean, &tp.sd);
            mean_sd(tt.samples, tt.n_samples, &tt.mean, &tt.sd);
            if (D == 0) tg0 = tt.mean;
            dsii_state_info si;
            dsii_session_state_info(s, &si);
            double ms = tg > 0 ? 1e3 / tt.mean : 0, nrep = tt.n_samples * (double)tg;
            char sp_i[32] = "n/a", sp_a[32] = "n/a", sp_r[32] = "n/a";
            char c_pp[48] = "-", c_tg[48] = "-", c_ms[32] = "-";
            if (split && tg > 0) {
                snprintf(sp_i, sizeof sp_i, "%.2f", 1e3 * ti / nrep);
                snprintf(sp_a, sizeof sp_a, "%.2f", 1e3 * ta / nrep);
                snprintf(sp_r, sizeof sp_r, "%.2f", ms - 1e3 * (ti + ta) / nrep);
            }
            if (pp > 0) snprintf(c_pp, sizeof c_pp, "%.2f ± %.2f", tp.mean, tp.sd);
            if (tg > 0) {
                snprintf(c_tg, sizeof c_tg, "%.2f ± %.2f", tt.mean, tt.sd);
                snprintf(c_ms, sizeof c_ms, "%.2f", ms);
            }
            printf("| %u | %s | %s | %s | %s | %s | %s | %.1f%s | %.2f |\n", D, c_pp, c_tg, c_ms,
                   sp_i, sp_a, sp_r, si.bytes_per_token, si.packed ? " (packed)" : " (f32)",
                   si.pool_bytes / 1048576.0);
            if (D > 0 && tg0 > 0 && tg > 0)
                printf("|  | | decode depth-0 / depth-%u = %.2fx | | | | | | |\n", D, tg0 / tt.mean);
        }
        dsi_session_free(s);
        free(tok);
    }
    if (split) dev->be = g_depth_orig;
    double a, b, c, d;
    released_bpt(&a, &b, &c, &d);
    printf("\nstate bytes per token of context at the released shapes (compressed KV rows + index "
           "keys; model-spec §3.8, §4.8):\n");
    printf("| model | libdsinfer packed | libdsinfer f32 | deployment / lower bound | vLLM |\n");
    printf("| ----- | ---------------: | -------------: | -----------------------: | ---: |\n");
    printf("| V4 Flash | %.1f | %.0f | 3514 (RoPE dims bf16, §3.8) | - |\n", a, b);
    printf("| V4.1 Flash | %.1f | %.0f | 890 (§4.8) | ~890 |\n", c, d);
    printf("(V4 keeps its 64 RoPE dims in f32: the forward pass never rounds them, so a bf16 copy "
           "would change the numbers)\nthe machine is shared: load average %.2f\n",
           loadavg1());
    return fail;
}

static int run_model(const opts *o) {
    if (o->no_fuse) dsii_op_multi_off = dsib_cpu_moe_split = 1;
    if (o->ops_isa) {
        static const char *const names[] = {"scalar", "avx2", "avx512", "avx512vnni"};
        int found = 0;
        for (int i = 0; i < 4; i++)
            if (!strcmp(o->ops_isa, names[i])) dsib_cpu_ops_force_isa(i), found = 1;
        if (!found) {
            fprintf(stderr, "dsinfer-bench: --ops-isa: unknown path '%s'\n", o->ops_isa);
            return 2;
        }
    }
    dsib_threadpool *pool = NULL;
    char msg[256];
    limits l;
    memset(&l, 0, sizeof l);
    if (dsib_threadpool_create(o->t, NULL, &pool, msg, sizeof msg) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: %s\n", msg);
        return 1;
    }
    const double load0 = loadavg1();
    limits l0;
    measure_limits(o, pool, &l0); /* again after the tests; the fractions use the larger */

    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = o->t;
    co.backend = o->backend;
    if (o->exact) co.flags = DSI_CONTEXT_FLAG_EXACT_MATMUL;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&co, &ctx) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: context: %s\n", dsi_last_error());
        return 1;
    }
    dsi_model *model = NULL;
    double tl0 = bench_now();
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    if (o->no_mmap) mo.access = DSI_ACCESS_PREAD;
    if (o->resident) mo.flags |= DSI_MODEL_FLAG_RESIDENT;
    if (dsi_model_load(ctx, o->model, &mo, &model) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: %s: %s\n", o->model, dsi_last_error());
        dsi_context_free(ctx);
        return 1;
    }
    double load_s = bench_now() - tl0;
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(model, &info);
    tok_cost cost;
    per_token_cost(model, &cost);
    const double tok_bytes = cost.bytes, tok_flops = cost.flops;
    const double *cat_bytes = cost.cat;
    if (o->spec) {
        int rc = run_spec(o, ctx, model, info.n_vocab, tok_bytes, cat_bytes);
        dsib_threadpool_free(pool);
        dsi_model_free(model);
        dsi_context_free(ctx);
        return rc;
    }
    if (o->ttft > 0) {
        int rc = run_ttft(o, ctx, model, info.n_vocab);
        dsib_threadpool_free(pool);
        dsi_model_free(model);
        dsi_context_free(ctx);
        return rc;
    }
    if (o->depths) {
        int rc = run_depth(o, ctx, model, &info);
        dsib_threadpool_free(pool);
        dsi_model_free(model);
        dsi_context_free(ctx);
        return rc;
    }
    if (o->sessions) {
        int rc = run_sessions(o, ctx, model, &l0, tok_bytes, cat_bytes, info.n_vocab);
        dsib_threadpool_free(pool);
        dsi_model_free(model);
        dsi_context_free(ctx);
        return rc;
    }

    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = (uint32_t)(o->p > o->n ? o->p : o->n) + 16;
    dsi_session *s = NULL;
    if (dsi_session_create(model, &so, &s) != DSI_OK) {
        fprintf(stderr, "dsinfer-bench: session: %s\n", dsi_last_error());
        dsi_model_free(model);
        dsi_context_free(ctx);
        return 1;
    }
    int32_t nv = info.n_vocab;
    int np = o->p > 0 ? o->p : 1;
    dsi_token *prompt = malloc(sizeof(dsi_token) * (size_t)np);
    if (!prompt) return 1;
    uint64_t rng = 1234;
    for (int i = 0; i < np; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (dsi_token)((rng >> 33) % (uint64_t)(nv > 16 ? nv - 16 : nv));
    }

    test_result tests[2];
    static test_prof profs[2];
    memset(profs, 0, sizeof profs);
    int n_tests = 0;
    int fail = 0;
    /* pp: a prompt of p tokens from an empty timeline */
    double attn_flops = 0, attn_tokens = 0; /* the timed pp repetitions' attention FLOPs */
    if (o->p > 0) {
        test_result *t = &tests[n_tests++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "pp%d", o->p);
        t->n_prompt = o->p;
        test_prof *tp = &profs[n_tests - 1];
        for (int rep = 0; rep < o->r + 1 && !fail; rep++) {
            dsi_session_reset(s);
            if (rep > 0) prof_start(model, ctx, tp);
            const uint64_t af0 = cpu_attn_flops(ctx);
            double t0 = bench_now(), c0 = bench_cpu_seconds();
            if (dsi_session_sync(s, prompt, (size_t)o->p, NULL) != DSI_OK) {
                fprintf(stderr, "dsinfer-bench: sync: %s\n", dsi_session_last_error(s));
                fail = 1;
                break;
            }
            double dt = bench_now() - t0;
            if (rep > 0) {
                prof_stop(model, ctx, tp);
                tp->wall_s += dt;
                tp->tokens += o->p;
                attn_flops += (double)(cpu_attn_flops(ctx) - af0);
                attn_tokens += o->p;
            }
            if (rep > 0 && t->n_samples < 64) {
                t->samples[t->n_samples++] = o->p / dt;
                t->wall_s += dt;
                t->cpu_s += bench_cpu_seconds() - c0;
            }
        }
        mean_sd(t->samples, t->n_samples > 0 ? t->n_samples : 1, &t->mean, &t->sd);
    }
    /* tg: n tokens one at a time from an empty timeline, feeding back the argmax */
    if (o->n > 0 && !fail) {
        test_result *t = &tests[n_tests++];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "tg%d", o->n);
        t->n_gen = o->n;
        test_prof *tp = &profs[n_tests - 1];
        for (int rep = 0; rep < o->r + 1 && !fail; rep++) {
            dsi_session_reset(s);
            dsi_token tok = prompt[0];
            if (rep > 0) prof_start(model, ctx, tp);
            double t0 = bench_now(), c0 = bench_cpu_seconds();
            for (int i = 0; i < o->n; i++) {
                if (dsi_session_append(s, &tok, 1) != DSI_OK) {
                    fprintf(stderr, "dsinfer-bench: append: %s\n", dsi_session_last_error(s));
                    fail = 1;
                    break;
                }
                const float *lg = NULL;
                int32_t n = 0;
                if (dsi_session_logits(s, &lg, &n) == DSI_OK && lg) tok = argmax(lg, n);
            }
            double dt = bench_now() - t0;
            if (rep > 0) {
                prof_stop(model, ctx, tp);
                tp->wall_s += dt;
                tp->tokens += o->n;
            }
            if (rep > 0 && !fail && t->n_samples < 64) {
                t->samples[t->n_samples++] = o->n / dt;
                t->wall_s += dt;
                t->cpu_s += bench_cpu_seconds() - c0;
            }
        }
        mean_sd(t->samples, t->n_samples > 0 ? t->n_samples : 1, &t->mean, &t->sd);
    }

    limits l1;
    measure_limits(o, pool, &l1);
    hot_ceiling hc;
    memset(&hc, 0, sizeof hc);
    const int cpu_backend = !strcmp(dsi_context_backend(ctx), "cpu");
    if (!o->no_limits && cpu_backend)
        measure_hot_ceiling(pool, o->exact ? DSIB_MM_EXACT : 0u, &cost, info.n_embd, &hc);
    dsib_threadpool_free(pool);
    const double load1 = loadavg1();
    l = l0;
    if (l1.read_gbs > l.read_gbs) l.read_gbs = l1.read_gbs;
    if (l1.fma_gflops > l.fma_gflops) l.fma_gflops = l1.fma_gflops;
    if (l1.read_gbs_cpu > l.read_gbs_cpu) l.read_gbs_cpu = l1.read_gbs_cpu;
    if (l1.fma_gflops_cpu > l.fma_gflops_cpu) l.fma_gflops_cpu = l1.fma_gflops_cpu;
    const char *path = o->exact ? "exact" : "default";

    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    const char *bname = dsi_context_backend(ctx);
    char backend[64];
    if (!strcmp(bname, "cpu"))
        snprintf(backend, sizeof backend, "cpu (%s)", dsib_kern_isa_name());
    else
        snprintf(backend, sizeof backend, "%s", bname);
    const char *pu;
    double pv = human_params(info.n_params, &pu);
    const char *mname = info.name[0] ? info.name : info.arch_name;
    char fp[65];
    for (int i = 0; i < 32; i++) snprintf(fp + 2 * i, 3, "%02x", info.fingerprint[i]);

    double tg_ts = 0, pp_ts = 0, tg_share = 0, pp_share = 0;
    for (int i = 0; i < n_tests; i++) {
        if (tests[i].n_gen) tg_ts = tests[i].mean, tg_share = cpu_share(&tests[i], o->t);
        if (tests[i].n_prompt) pp_ts = tests[i].mean, pp_share = cpu_share(&tests[i], o->t);
    }
    double eff_gbs = tok_bytes * tg_ts * 1e-9;
    double pp_gflops = tok_flops * pp_ts * 1e-9;
    /* with the attention products (CPU backend only: counted by its attention op) */
    const double tok_attn = attn_tokens > 0 ? attn_flops / attn_tokens : 0;
    const double pp_gflops_attn = (tok_flops + tok_attn) * pp_ts * 1e-9;
    /* per CPU time (bench_hw.h): the rates divided by the share of the cores the test got,
     * against the limits' own per-CPU-time rates */
    double eff_gbs_cpu = tg_share > 0 ? eff_gbs / tg_share : 0;
    double pp_gflops_cpu = pp_share > 0 ? pp_gflops / pp_share : 0;
    double fbw_cpu = l.read_gbs_cpu > 0 ? eff_gbs_cpu / l.read_gbs_cpu : 0;
    double fpk_cpu = l.fma_gflops_cpu > 0 ? pp_gflops_cpu / l.fma_gflops_cpu : 0;

    if (o->json) {
        printf("{");
        print_build_json(stdout);
        printf(", \"cpu\": \"%s\", \"model\": {\"file\": \"%s\", \"name\": \"%s\", \"arch\": \"%s\", "
               "\"fingerprint\": \"%s\", \"size_bytes\": %llu, \"n_params\": %llu, "
               "\"n_layers\": %d, \"n_experts\": %d, \"n_experts_used\": %d, \"load_s\": %.3f}",
               cpu, o->model, mname, info.arch_name, fp, (unsigned long long)info.weight_bytes,
               (unsigned long long)info.n_params, info.n_layers, info.n_experts,
               info.n_experts_used, load_s);
        printf(", \"weights_access\": \"%s\", \"anon_huge_bytes\": %lld",
               o->resident ? "resident" : o->no_mmap ? "pread" : "mmap",
               bench_anon_huge_bytes());
        printf(", \"backend\": \"%s\", \"kernels\": \"%s\", \"matmul_path\": \"%s\", "
               "\"threads\": %d, \"weight_type\": \"%s\", \"loadavg_1min\": [%.2f, %.2f], "
               "\"prefetch_bytes\": [%d, %d], \"rows16_gather\": %s, \"q8_rows8\": %s",
               bname, dsib_kern_isa_name(), path, o->t, main_type(&cost), load0, load1,
               (int)dsib_kern_prefetch, (int)dsib_kern_prefetch2,
               dsib_kern_rows16_gather_on() ? "true" : "false", dsib_kern_q8_rows8_on() ? "true" : "false");
        if (o->no_limits)
            printf(", \"mem_read_gbs\": null, \"fma_peak_gflops\": null");
        else
            printf(", \"mem_read_gbs\": %.3f, \"mem_read_gbs_before_after\": [%.3f, %.3f], "
                   "\"mem_read_buffer_bytes\": %zu, \"fma_peak_gflops\": %.3f, "
                   "\"fma_peak_gflops_before_after\": [%.3f, %.3f], "
                   "\"mem_read_gbs_per_cpu_time\": %.3f, \"fma_peak_gflops_per_cpu_time\": %.3f",
                   l.read_gbs, l0.read_gbs, l1.read_gbs, l.bw_bytes, l.fma_gflops,
                   l0.fma_gflops, l1.fma_gflops, l.read_gbs_cpu, l.fma_gflops_cpu);
        printf(", \"tests\": [");
        for (int i = 0; i < n_tests; i++) {
            int ntok = tests[i].n_prompt + tests[i].n_gen;
            printf("%s{\"test\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"repetitions\": %d, "
                   "\"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"avg_ns\": %.0f, "
                   "\"cpu_share\": %.4f, \"samples_ts\": [",
                   i ? ", " : "", tests[i].name, tests[i].n_prompt, tests[i].n_gen,
                   tests[i].n_samples, tests[i].mean, tests[i].sd,
                   tests[i].mean > 0 ? 1e9 * ntok / tests[i].mean : 0.0,
                   cpu_share(&tests[i], o->t));
            for (int k = 0; k < tests[i].n_samples; k++)
                printf("%s%.4f", k ? ", " : "", tests[i].samples[k]);
            printf("]}");
        }
        printf("]");
        printf(", \"decode\": {\"bytes_per_token\": %.0f, \"bytes_per_token_by_part\": {",
               tok_bytes);
        for (int c = 0; c < C_COUNT; c++)
            printf("%s\"%s\": %.0f", c ? ", " : "", cat_names[c], cat_bytes[c]);
        printf("}, \"bytes_per_token_by_type\": {");
        for (int i = 0; i < cost.n_types; i++)
            printf("%s\"%s\": %.0f", i ? ", " : "", type_name_of(cost.type[i]), cost.type_bytes[i]);
        printf("}, \"effective_gbs\": %.3f, \"frac_read_bw\": ", eff_gbs);
        if (l.read_gbs > 0 && tg_ts > 0)
            printf("%.4f", eff_gbs / l.read_gbs);
        else
            printf("null");
        printf(", \"effective_gbs_per_cpu_time\": %.3f, \"frac_read_bw_per_cpu_time\": %.4f",
               eff_gbs_cpu, fbw_cpu);
        if (hc.gbs > 0) {
            printf(", \"compute_ceiling\": {\"n_in\": %lld, \"hot_gbs_by_type\": {", (long long)hc.n_in);
            int first = 1;
            for (int i = 0; i < cost.n_types; i++) {
                if (hc.hot[i] <= 0) continue;
                printf("%s\"%s\": %.3f", first ? "" : ", ", type_name_of(cost.type[i]), hc.hot[i]);
                first = 0;
            }
            const double bound = l.read_gbs > 0 && l.read_gbs < hc.gbs ? l.read_gbs : hc.gbs;
            printf("}, \"covered_bytes_per_token\": %.0f, \"gbs\": %.3f}, \"frac_bound\": ",
                   hc.covered, hc.gbs);
            if (tg_ts > 0)
                printf("%.4f", eff_gbs / bound);
            else
                printf("null");
        } else {
            printf(", \"compute_ceiling\": null, \"frac_bound\": null");
        }
        printf("}");
        printf(", \"prefill\": {\"flops_per_token\": %.0f, \"gflops\": %.3f, "
               "\"frac_fma_peak\": ",
               tok_flops, pp_gflops);
        if (l.fma_gflops > 0 && pp_ts > 0)
            printf("%.4f", pp_gflops / l.fma_gflops);
        else
            printf("null");
        printf(", \"gflops_per_cpu_time\": %.3f, \"frac_fma_peak_per_cpu_time\": %.4f",
               pp_gflops_cpu, fpk_cpu);
        if (tok_attn > 0 && pp_ts > 0) {
            printf(", \"attn_flops_per_token\": %.0f, \"gflops_with_attn\": %.3f, "
                   "\"frac_fma_peak_with_attn\": ",
                   tok_attn, pp_gflops_attn);
            if (l.fma_gflops > 0)
                printf("%.4f", pp_gflops_attn / l.fma_gflops);
            else
                printf("null");
        } else {
            printf(", \"attn_flops_per_token\": null, \"gflops_with_attn\": null, "
                   "\"frac_fma_peak_with_attn\": null");
        }
        printf("}");
        printf(", \"profile\": {");
        for (int i = 0; i < n_tests; i++) prof_report(tests[i].name, &profs[i], 1, i == 0);
        printf("}");
        printf(", \"ok\": %s}\n", fail ? "false" : "true");
    } else {
        printf("| model | type | size | params | backend | threads | test | t/s | cpu share |\n");
        printf("| ----- | ---- | ---: | -----: | ------- | ------: | ---: | --: | --------: |\n");
        for (int i = 0; i < n_tests; i++)
            printf("| %s %s | %s | %.2f GiB | %.2f %s | %s | %d | %s | %.2f ± %.2f | %.0f%% |\n",
                   mname, info.arch_name, main_type(&cost),
                   (double)info.weight_bytes / 1073741824.0, pv, pu, backend, o->t,
                   tests[i].name, tests[i].mean, tests[i].sd, 100.0 * cpu_share(&tests[i], o->t));
        printf("\nbuild %s (%s), cpu: %s, matmul path: %s, load average %.2f -> %.2f\n",
               dsi_version_string(), DSI_BENCH_GIT, cpu, path, load0, load1);
        {
            const long long hb = bench_anon_huge_bytes();
            printf("weights: %s", o->resident  ? "read into library memory, Engram tables too (--resident)"
                                  : o->no_mmap ? "read into library memory, Engram rows read on demand (--no-mmap)"
                                               : "mapped file");
            if (hb >= 0) printf("; %.1f MiB of this process's memory in transparent huge pages", (double)hb / 1048576.0);
            printf("\n");
        }
        if (!o->no_limits) {
            printf("memory read bandwidth: %.2f GB/s (best of 5, %zu MiB, %d threads; %.2f before, "
                   "%.2f after the tests); FMA peak: %.1f GFLOP/s (%.1f before, %.1f after)\n",
                   l.read_gbs, l.bw_bytes >> 20, o->t, l0.read_gbs, l1.read_gbs, l.fma_gflops,
                   l0.fma_gflops, l1.fma_gflops);
        }
        if (tg_ts > 0) {
            printf("decode: %.1f MiB of weights read per token (", tok_bytes / 1048576.0);
            for (int c = 0; c < C_COUNT; c++)
                printf("%s%s %.1f", c ? ", " : "", cat_names[c], cat_bytes[c] / 1048576.0);
            printf(") -> effective %.2f GB/s", eff_gbs);
            printf(" [by type:");
            for (int i = 0; i < cost.n_types; i++)
                printf(" %s %.1f", type_name_of(cost.type[i]), cost.type_bytes[i] / 1048576.0);
            printf(" MiB]");
            if (l.read_gbs > 0) printf(" = %.1f%% of read bandwidth", 100.0 * eff_gbs / l.read_gbs);
            printf("\n");
            if (hc.gbs > 0) {
                printf("decode compute ceiling (each type's matvec from the caches, %lld columns, %d "
                       "threads):", (long long)hc.n_in, o->t);
                for (int i = 0; i < cost.n_types; i++)
                    if (hc.hot[i] > 0) printf(" %s %.1f", type_name_of(cost.type[i]), hc.hot[i]);
                const double bound = l.read_gbs > 0 && l.read_gbs < hc.gbs ? l.read_gbs : hc.gbs;
                printf(" GB/s -> %.2f GB/s over this step's bytes; decode = %.1f%% of the lower of "
                       "the two limits (%.2f GB/s)\n",
                       hc.gbs, 100.0 * eff_gbs / bound, bound);
            }
        }
        if (pp_ts > 0) {
            printf("prefill: %.3f GFLOP per token (weight matmuls) -> %.1f GFLOP/s",
                   tok_flops * 1e-9, pp_gflops);
            if (l.fma_gflops > 0) printf(" = %.1f%% of FMA peak", 100.0 * pp_gflops / l.fma_gflops);
            printf("\n");
            if (tok_attn > 0) {
                printf("prefill with attention: + %.3f GFLOP per token (q.k and e.v over the rows "
                       "each query attended, counted by the CPU backend) -> %.1f GFLOP/s",
                       tok_attn * 1e-9, pp_gflops_attn);
                if (l.fma_gflops > 0)
                    printf(" = %.1f%% of FMA peak", 100.0 * pp_gflops_attn / l.fma_gflops);
                printf("\n");
            }
        }
        if (!o->no_limits && (tg_share > 0 || pp_share > 0))
            printf("per CPU time (as if the %d threads had cores of their own): read bandwidth "
                   "%.2f GB/s, FMA peak %.1f GFLOP/s; decode %.2f GB/s = %.1f%%; prefill %.1f "
                   "GFLOP/s = %.1f%%\n",
                   o->t, l.read_gbs_cpu, l.fma_gflops_cpu, eff_gbs_cpu, 100.0 * fbw_cpu,
                   pp_gflops_cpu, 100.0 * fpk_cpu);
        for (int i = 0; i < n_tests; i++) prof_report(tests[i].name, &profs[i], 0, 1);
    }
    free(prompt);
    dsi_session_free(s);
    dsi_model_free(model);
    dsi_context_free(ctx);
    return fail;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o) != 0) return 2;
    if (o.prefetch >= 0) dsib_kern_prefetch = o.prefetch;
    if (o.prefetch2 >= 0) dsib_kern_prefetch2 = o.prefetch2;
    if (o.rows16_gather >= 0) dsib_kern_rows16_gather = o.rows16_gather;
    if (o.q8_rows8 >= 0) dsib_kern_q8_rows8 = o.q8_rows8;
    if (o.place) {
        if (!o.model) {
            fprintf(stderr, "dsinfer-bench: --place needs -m FILE\n");
            return 2;
        }
        return run_place(o.model, o.t, o.p_given ? o.p : 32, o.n_given ? o.n : 32, o.place_csv, o.backend);
    }
    return o.kernels ? run_kernels(&o) : run_model(&o);
}
