/*
 * dsinfer-cli — text in, text out, through the public libdsinfer API only (docs/cli.md).
 *
 *   one-shot:  dsinfer-cli [-m FILE] -p "text" [-n N] …   streams the completion to stdout
 *   chat:      dsinfer-cli [-m FILE] --chat [--think]      interactive, multi-turn
 *
 * Without -m the default model is used, and stderr says which file: the installed one next
 * to this executable (<bindir>/<DSI_CLI_EXE_MODEL>, i.e. $prefix/share/dsinfer/models/…,
 * wherever the tree was installed), else the build's own (path baked in at build time), else
 * the configured install location.
 */
#define _POSIX_C_SOURCE 200809L
#define DSI_EXPERIMENTAL /* speculative decoding (docs/spec.md), snapshots and the prompt cache (docs/snapshots.md) */
#include "dsinfer.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DSI_CLI_BUILD_MODEL
#define DSI_CLI_BUILD_MODEL ""
#endif
#ifndef DSI_CLI_INSTALL_MODEL
#define DSI_CLI_INSTALL_MODEL "/usr/local/share/dsinfer/models/kjv-v41.gguf"
#endif
#ifndef DSI_CLI_EXE_MODEL
#define DSI_CLI_EXE_MODEL "../share/dsinfer/models/kjv-v41.gguf"
#endif

static const char *prog = "dsinfer-cli";

/* ---- options ------------------------------------------------------------------------- */

typedef struct {
    const char *model;
    const char *prompt;
    const char *prompt_file;
    int32_t n_predict;
    float temp, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
    int32_t threads;
    const char *backend;
    int chat;
    int think;       /* -1 default (off), 0 off, 1 on */
    uint32_t n_ctx;
    int list_devices, version, help, verbose;
    uint32_t spec;          /* DSI_SPEC_* */
    uint32_t draft_max;
    float draft_conf;
    const char *prompt_cache;  /* --prompt-cache DIR */
    const char *session_save;  /* --session-save FILE */
    const char *session_load;  /* --session-load FILE */
    /* memory tiers (docs/placement.md) */
    int place;                 /* 0: no plan; else DSI_PLACE_* + 1 */
    const char *overrides;     /* -ot */
    int hybrid;                /* -1: default; DSI_HYBRID_* */
    uint32_t device_experts;   /* --device-experts (DSI_DEVICE_EXPERTS_AUTO: auto) */
    uint32_t hybrid_rows;      /* --hybrid-rows (0: the library's default) */
    uint64_t device_budget, host_budget;
    int no_mmap;
    int resident; /* --resident: --no-mmap, Engram tables read in too */
    int direct_io;             /* --direct-io */
    const char *expert_counts; /* --expert-counts FILE (a routing profile) */
    const char *save_counts;   /* --save-expert-counts FILE */
} cli_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s [-m FILE] [-p PROMPT | -f FILE] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
            "       [--min-p P] [--seed S] [-t THREADS] [--backend NAME] [--chat] [--think|--no-think]\n"
            "       [--ctx N] [--list-devices] [--version] [-v] [-h]\n"
            "\n"
            "  -m FILE          model (GGUF); default: the built-in trained kjv-v41 model\n"
            "  -p PROMPT        prompt text (one-shot: raw completion, no chat template)\n"
            "  -f FILE          read the prompt from FILE\n"
            "  -n N             tokens to generate (default 128; in --chat per answer 512)\n"
            "  --temp T         temperature, 0 = greedy (default 1.0)\n"
            "  --top-k K        keep the K most likely tokens (default 0 = off)\n"
            "  --top-p P        nucleus sampling, 0 < P <= 1 (default 1.0 = off)\n"
            "  --min-p P        drop tokens below P x the top probability (default 0 = off)\n"
            "  --seed S         sampling seed (default 0)\n"
            "  -t THREADS       CPU threads (default: all online CPUs)\n"
            "  --backend NAME   cpu, vulkan, cuda or auto (default cpu)\n"
            "  --chat           interactive multi-turn chat (/reset, /quit; Ctrl+C stops an answer)\n"
            "  --prompt-cache DIR  reuse evaluated prompt prefixes from / save them to DIR (between\n"
            "                   turns and runs; shared by processes)\n"
            "  --session-load FILE  start from a saved session (snapshot)\n"
            "  --session-save FILE  save the session at the end (one-shot) or on exit (chat)\n"
            "  --think          chat with thinking on; --no-think: off (default)\n"
            "  --ctx N          context length in tokens (default: min(4096, trained))\n"
            "  --spec MODE      speculative decoding with the model's draft blocks: off (default),\n"
            "                   on, auto (same output; -v prints accepted drafts per step)\n"
            "  --draft-max N    drafts per step (default: the draft block's, DSpark 5, MTP 1)\n"
            "  --draft-confidence C  DSpark: end a proposal below confidence C (0..1, default 0)\n"
            "  --place POLICY   where the weights live: auto, resident, experts-host, experts-streamed\n"
            "                   (docs/placement.md; -v prints the plan and its counters)\n"
            "  -ot PATTERN=TIER[,...]  per-tensor tiers (device, host, disk), e.g.\n"
            "                   'blk.*.ffn_*_exps.weight=host'; implies --place auto if not given\n"
            "  --hybrid MODE    GPU backends: cpu (the CPU computes experts outside the GPU, default),\n"
            "                   upload (they are cached on the GPU) or auto (per step: a step whose\n"
            "                   experts serve --hybrid-rows rows each on average uploads, else the CPU)\n"
            "  --hybrid-rows N  with --hybrid auto: rows per routed expert from which a step\n"
            "                   uploads (default 16)\n"
            "  --device-experts N|auto  with --hybrid cpu: N experts of every layer kept on the GPU,\n"
            "                   computed there while the CPU computes the rest (auto: what fits);\n"
            "                   experts 0..N-1, or the most often routed of --expert-counts\n"
            "  --save-expert-counts FILE  write how often each expert was routed (a routing profile)\n"
            "  --expert-counts FILE  a routing profile written by --save-expert-counts for this model\n"
            "  --device-budget B, --host-budget B  bytes for weights and caches (K, M, G suffixes;\n"
            "                   default: the device's free memory / half the RAM)\n"
            "  --no-mmap        read the model into library-owned memory (pread) instead of mapping it\n"
            "                   (the Engram tables stay in the file, their rows read on demand)\n"
            "  --resident       --no-mmap with the Engram tables read in too; the file is closed\n"
            "                   after the load\n"
            "  --direct-io      streamed experts read with O_DIRECT, bypassing the page cache (implies\n"
            "                   --no-mmap; with --place experts-streamed)\n"
            "  --list-devices   list the devices of the chosen backend(s) and exit\n"
            "  --version        print the library version and exit\n"
            "  -v               verbose: per-turn token counts\n"
            "  -h, --help       this text\n",
            prog);
}

static int bad_value(const char *opt, const char *val, const char *why) {
    fprintf(stderr, "%s: invalid value '%s' for %s: %s\n", prog, val, opt, why);
    return 0;
}

static int parse_i64(const char *opt, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char why[96];
        snprintf(why, sizeof why, "expected an integer in %lld .. %lld", lo, hi);
        return bad_value(opt, s, why);
    }
    *out = v;
    return 1;
}

static int parse_f(const char *opt, const char *s, double lo, double hi, int lo_open, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v || v < lo || v > hi || (lo_open && v == lo)) {
        char why[96];
        snprintf(why, sizeof why, "expected a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
        return bad_value(opt, s, why);
    }
    *out = (float)v;
    return 1;
}

static int parse_bytes(const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (end != s && *end && !end[1]) {
        if (*end == 'K' || *end == 'k') mul = 1ull << 10;
        else if (*end == 'M' || *end == 'm') mul = 1ull << 20;
        else if (*end == 'G' || *end == 'g') mul = 1ull << 30;
        else mul = 0;
        if (mul) end++;
    }
    if (errno || end == s || *end || s[0] == '-' || v == 0 || mul == 0 || v > UINT64_MAX / mul)
        return bad_value(opt, s, "expected a positive byte count (K, M, G suffixes allowed)");
    *out = (uint64_t)v * mul;
    return 1;
}

/* Returns 1 on success, 0 on a bad command line (message printed). */
static int parse_args(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->temp = 1.0f;
    o->top_p = 1.0f;
    o->think = -1;
    o->hybrid = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT()                                                                         \
    do {                                                                               \
        if (i + 1 >= argc) {                                                           \
            fprintf(stderr, "%s: option %s needs a value (see -h)\n", prog, a);        \
            return 0;                                                                  \
        }                                                                              \
        i++;                                                                           \
    } while (0)
        long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) o->help = 1;
        else if (!strcmp(a, "--version")) o->version = 1;
        else if (!strcmp(a, "--list-devices")) o->list_devices = 1;
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--think")) o->think = 1;
        else if (!strcmp(a, "--no-think")) o->think = 0;
        else if (!strcmp(a, "-v")) o->verbose = 1;
        else if (!strcmp(a, "-m")) { NEXT(); o->model = argv[i]; }
        else if (!strcmp(a, "-p")) { NEXT(); o->prompt = argv[i]; }
        else if (!strcmp(a, "-f")) { NEXT(); o->prompt_file = argv[i]; }
        else if (!strcmp(a, "--backend")) { NEXT(); o->backend = argv[i]; }
        else if (!strcmp(a, "--prompt-cache")) { NEXT(); o->prompt_cache = argv[i]; }
        else if (!strcmp(a, "--session-save")) { NEXT(); o->session_save = argv[i]; }
        else if (!strcmp(a, "--session-load")) { NEXT(); o->session_load = argv[i]; }
        else if (!strcmp(a, "-n")) { NEXT(); if (!parse_i64(a, argv[i], 0, INT32_MAX, &v)) return 0; o->n_predict = (int32_t)v; }
        else if (!strcmp(a, "--top-k")) { NEXT(); if (!parse_i64(a, argv[i], 0, INT32_MAX, &v)) return 0; o->top_k = (int32_t)v; }
        else if (!strcmp(a, "-t")) { NEXT(); if (!parse_i64(a, argv[i], 1, 1024, &v)) return 0; o->threads = (int32_t)v; }
        else if (!strcmp(a, "--ctx")) { NEXT(); if (!parse_i64(a, argv[i], 1, UINT32_MAX, &v)) return 0; o->n_ctx = (uint32_t)v; }
        else if (!strcmp(a, "--seed")) {
            NEXT();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(argv[i], &end, 10);
            if (errno || end == argv[i] || *end || argv[i][0] == '-') return bad_value(a, argv[i], "expected an unsigned 64-bit integer");
            o->seed = s;
        }
        else if (!strcmp(a, "--spec")) {
            NEXT();
            if (!strcmp(argv[i], "off")) o->spec = DSI_SPEC_OFF;
            else if (!strcmp(argv[i], "on")) o->spec = DSI_SPEC_ON;
            else if (!strcmp(argv[i], "auto")) o->spec = DSI_SPEC_AUTO;
            else return bad_value(a, argv[i], "expected off, on or auto");
        }
        else if (!strcmp(a, "--place")) {
            NEXT();
            if (!strcmp(argv[i], "auto")) o->place = 1 + DSI_PLACE_AUTO;
            else if (!strcmp(argv[i], "resident")) o->place = 1 + DSI_PLACE_ALL_RESIDENT;
            else if (!strcmp(argv[i], "experts-host")) o->place = 1 + DSI_PLACE_EXPERTS_HOST;
            else if (!strcmp(argv[i], "experts-streamed")) o->place = 1 + DSI_PLACE_EXPERTS_STREAMED;
            else return bad_value(a, argv[i], "expected auto, resident, experts-host or experts-streamed");
        }
        else if (!strcmp(a, "-ot") || !strcmp(a, "--override-tensor")) { NEXT(); o->overrides = argv[i]; }
        else if (!strcmp(a, "--hybrid")) {
            NEXT();
            if (!strcmp(argv[i], "cpu")) o->hybrid = DSI_HYBRID_CPU;
            else if (!strcmp(argv[i], "upload")) o->hybrid = DSI_HYBRID_UPLOAD;
            else if (!strcmp(argv[i], "auto")) o->hybrid = DSI_HYBRID_AUTO;
            else return bad_value(a, argv[i], "expected cpu, upload or auto");
        }
        else if (!strcmp(a, "--hybrid-rows")) {
            NEXT();
            if (!parse_i64(a, argv[i], 1, 1 << 20, &v)) return 0;
            o->hybrid_rows = (uint32_t)v;
        }
        else if (!strcmp(a, "--device-experts")) {
            NEXT();
            if (!strcmp(argv[i], "auto")) o->device_experts = DSI_DEVICE_EXPERTS_AUTO;
            else if (!parse_i64(a, argv[i], 0, 1 << 20, &v)) return 0;
            else o->device_experts = (uint32_t)v;
        }
        else if (!strcmp(a, "--device-budget")) { NEXT(); if (!parse_bytes(a, argv[i], &o->device_budget)) return 0; }
        else if (!strcmp(a, "--host-budget")) { NEXT(); if (!parse_bytes(a, argv[i], &o->host_budget)) return 0; }
        else if (!strcmp(a, "--no-mmap")) o->no_mmap = 1;
        else if (!strcmp(a, "--resident")) o->resident = o->no_mmap = 1;
        else if (!strcmp(a, "--direct-io")) o->direct_io = o->no_mmap = 1;
        else if (!strcmp(a, "--expert-counts")) { NEXT(); o->expert_counts = argv[i]; }
        else if (!strcmp(a, "--save-expert-counts")) { NEXT(); o->save_counts = argv[i]; }
        else if (!strcmp(a, "--draft-max")) { NEXT(); if (!parse_i64(a, argv[i], 1, 16, &v)) return 0; o->draft_max = (uint32_t)v; }
        else if (!strcmp(a, "--draft-confidence")) { NEXT(); if (!parse_f(a, argv[i], 0, 1, 0, &o->draft_conf)) return 0; }
        else if (!strcmp(a, "--temp")) { NEXT(); if (!parse_f(a, argv[i], 0, 1e6, 0, &o->temp)) return 0; }
        else if (!strcmp(a, "--top-p")) { NEXT(); if (!parse_f(a, argv[i], 0, 1, 1, &o->top_p)) return 0; }
        else if (!strcmp(a, "--min-p")) {
            NEXT();
            if (!parse_f(a, argv[i], 0, 1, 0, &o->min_p)) return 0;
            if (o->min_p >= 1.0f) return bad_value(a, argv[i], "expected a number in [0, 1)");
        }
        else {
            fprintf(stderr, "%s: unknown option '%s' (see -h)\n", prog, a);
            return 0;
        }
#undef NEXT
    }
    if (o->prompt && o->prompt_file) {
        fprintf(stderr, "%s: -p and -f are mutually exclusive\n", prog);
        return 0;
    }
    if (o->spec == DSI_SPEC_OFF && (o->draft_max || o->draft_conf > 0.0f)) {
        fprintf(stderr, "%s: --draft-max / --draft-confidence need --spec on|auto\n", prog);
        return 0;
    }
    if (o->think >= 0 && !o->chat) {
        fprintf(stderr, "%s: --think / --no-think need --chat\n", prog);
        return 0;
    }
    return 1;
}

/* ---- signals ---------------------------------------------------------------------------- */

static dsi_session *volatile g_session;
static volatile sig_atomic_t g_generating, g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
    if (g_generating && g_session) dsi_session_cancel(g_session); /* async-signal-safe */
}

/* ---- helpers ---------------------------------------------------------------------------- */

/* Routing profiles (--save-expert-counts / --expert-counts): a text file,
 *   dsinfer-expert-counts 1 N_LAYERS N_EXPERTS
 * then N_LAYERS lines of N_EXPERTS counts (dsi_model_expert_counts, layer-major). */
static int save_counts(const dsi_model *model, const char *path) {
    uint64_t n = 0;
    uint32_t nl = 0, ne = 0;
    dsi_status st = dsi_model_expert_counts(model, NULL, 0, &n, &nl, &ne);
    if (st != DSI_OK && st != DSI_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "%s: --save-expert-counts: %s\n", prog, dsi_last_error());
        return 0;
    }
    uint64_t *c = calloc(n ? n : 1, sizeof *c);
    if (!c || dsi_model_expert_counts(model, c, n, NULL, NULL, NULL) != DSI_OK) {
        fprintf(stderr, "%s: --save-expert-counts: %s\n", prog, c ? dsi_last_error() : "out of memory");
        free(c);
        return 0;
    }
    FILE *f = fopen(path, "w");
    int ok = f != NULL;
    if (ok) {
        fprintf(f, "dsinfer-expert-counts 1 %u %u\n", nl, ne);
        for (uint32_t l = 0; l < nl; l++)
            for (uint32_t x = 0; x < ne; x++)
                fprintf(f, "%llu%c", (unsigned long long)c[(uint64_t)l * ne + x], x + 1 < ne ? ' ' : '\n');
        ok = !ferror(f);
        ok = fclose(f) == 0 && ok;
    }
    if (!ok) fprintf(stderr, "%s: --save-expert-counts: cannot write '%s': %s\n", prog, path, strerror(errno));
    free(c);
    return ok;
}

/* Reads a routing profile; NULL (message printed) when the file is missing or malformed. */
static uint64_t *load_counts(const char *path, uint64_t *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: --expert-counts: cannot open '%s': %s\n", prog, path, strerror(errno));
        return NULL;
    }
    unsigned nl = 0, ne = 0, ver = 0;
    uint64_t *c = NULL;
    int ok = fscanf(f, "dsinfer-expert-counts %u %u %u", &ver, &nl, &ne) == 3 && ver == 1 && nl && ne &&
             nl <= 4096 && ne <= 65536;
    uint64_t n = ok ? (uint64_t)nl * ne : 0;
    if (ok) ok = (c = calloc(n, sizeof *c)) != NULL;
    for (uint64_t i = 0; ok && i < n; i++) {
        unsigned long long v;
        ok = fscanf(f, "%llu", &v) == 1;
        if (ok) c[i] = v;
    }
    char extra;
    if (ok && fscanf(f, " %c", &extra) == 1) ok = 0;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "%s: --expert-counts: '%s' is not a routing profile (dsinfer-expert-counts 1 LAYERS EXPERTS "
                        "and LAYERS x EXPERTS counts, as --save-expert-counts writes)\n", prog, path);
        free(c);
        return NULL;
    }
    *n_out = n;
    return c;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open prompt file '%s': %s\n", prog, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int err = 0;
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    if (buf && ferror(f)) err = 1;
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "%s: cannot read prompt file '%s'%s\n", prog, path, buf ? "" : ": out of memory");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static dsi_token *tokenize(dsi_model *m, const char *text, size_t len, uint32_t flags, size_t *n) {
    size_t need = 0;
    dsi_status st = dsi_tokenize(m, text, len, flags, NULL, 0, &need);
    if (st != DSI_OK && st != DSI_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "%s: tokenize: %s\n", prog, dsi_model_last_error(m));
        return NULL;
    }
    dsi_token *t = malloc((need ? need : 1) * sizeof *t);
    if (!t || dsi_tokenize(m, text, len, flags, t, need, n) != DSI_OK) {
        fprintf(stderr, "%s: tokenize: %s\n", prog, t ? dsi_model_last_error(m) : "out of memory");
        free(t);
        return NULL;
    }
    return t;
}

typedef struct {
    char *text;
    size_t n, cap;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 1024;
        while (c < b->n + n + 1) c *= 2;
        char *nt = realloc(b->text, c);
        if (!nt) return;
        b->text = nt;
        b->cap = c;
    }
    memcpy(b->text + b->n, s, n);
    b->n += n;
    b->text[b->n] = 0;
}

typedef struct {
    dsi_model *model;
    strbuf raw; /* exact token bytes (not the display text): re-tokenizing them for the next
                   turn reproduces the generated tokens as far as BPE allows, so the session
                   reuses the previous answer too */
} answer_buf;

static int32_t on_token(dsi_token tok, const char *text, size_t len, void *user) {
    answer_buf *a = user;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (a && tok >= 0) {
        char bytes[256];
        size_t n = 0;
        if (dsi_token_to_bytes(a->model, tok, bytes, sizeof bytes, &n) == DSI_OK) sb_add(&a->raw, bytes, n);
    }
    return 1;
}

static const char *finish_name(int32_t r) {
    switch (r) {
    case DSI_FINISH_LENGTH: return "length";
    case DSI_FINISH_EOS: return "eos";
    case DSI_FINISH_STOP_TOKEN: return "stop token";
    case DSI_FINISH_STOP_STRING: return "stop string";
    case DSI_FINISH_CALLBACK: return "callback";
    case DSI_FINISH_CANCELLED: return "cancelled";
    case DSI_FINISH_CONTEXT_FULL: return "context full";
    default: return "none";
    }
}

static void print_speed(const dsi_generate_result *r) {
    uint64_t pe = r->n_prompt - r->n_reused;
    fprintf(stderr, "\n%s: prompt %llu tokens (%llu reused, %llu evaluated) in %.1f ms",
            prog, (unsigned long long)r->n_prompt, (unsigned long long)r->n_reused,
            (unsigned long long)pe, r->prefill_ms);
    if (pe && r->prefill_ms > 0) fprintf(stderr, " (%.1f tok/s)", 1000.0 * (double)pe / r->prefill_ms);
    fprintf(stderr, "; decode %llu tokens in %.1f ms", (unsigned long long)r->n_generated, r->decode_ms);
    if (r->n_generated && r->decode_ms > 0)
        fprintf(stderr, " (%.1f tok/s)", 1000.0 * (double)r->n_generated / r->decode_ms);
    fprintf(stderr, "; finish: %s\n", finish_name(r->finish_reason));
    if (r->n_spec_steps)
        fprintf(stderr, "%s: speculative: %llu verify steps, %llu drafted, %llu accepted (%.2f per step, %.2f tokens per step)\n",
                prog, (unsigned long long)r->n_spec_steps, (unsigned long long)r->n_drafted,
                (unsigned long long)r->n_accepted, (double)r->n_accepted / (double)r->n_spec_steps,
                (double)r->n_generated / (double)r->n_spec_steps);
}

static int list_devices(dsi_context *ctx) {
    int32_t n = 0;
    if (dsi_context_device_count(ctx, &n) != DSI_OK) {
        fprintf(stderr, "%s: %s\n", prog, dsi_context_last_error(ctx));
        return 1;
    }
    static const char *const types[] = {"cpu", "discrete-gpu", "integrated-gpu", "virtual-gpu", "software", "other"};
    for (int32_t i = 0; i < n; i++) {
        dsi_device_info info;
        dsi_device_info_init(&info);
        if (dsi_context_device_info(ctx, i, &info) != DSI_OK) {
            fprintf(stderr, "%s: device %d: %s\n", prog, (int)i, dsi_context_last_error(ctx));
            return 1;
        }
        printf("%d: %-7s %-14s %s  memory %.1f GiB", (int)i, info.backend,
               info.type >= 0 && info.type <= 5 ? types[info.type] : "?", info.name,
               (double)info.memory_total / (1024.0 * 1024.0 * 1024.0));
        if (info.memory_free) printf(" (%.1f GiB free)", (double)info.memory_free / (1024.0 * 1024.0 * 1024.0));
        if (info.subgroup_size) printf("  subgroup %u", info.subgroup_size);
        printf("\n");
    }
    return 0;
}

/* The default model's path (static storage): relative to this executable first, so that an
 * install tree moved or installed with `cmake --install --prefix` finds its own model. */
static const char *default_model(void) {
    static char path[PATH_MAX + 256];
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            if (snprintf(path, sizeof path, "%s/%s", exe, DSI_CLI_EXE_MODEL) < (int)sizeof path &&
                access(path, R_OK) == 0)
                return path;
        }
    }
    if (DSI_CLI_BUILD_MODEL[0] && access(DSI_CLI_BUILD_MODEL, R_OK) == 0) return DSI_CLI_BUILD_MODEL;
    return DSI_CLI_INSTALL_MODEL;
}

/* ---- chat ------------------------------------------------------------------------------- */

typedef struct {
    dsi_chat_message *m;
    char **owned;      /* content / reasoning strings we allocated */
    size_t n, cap, n_owned, cap_owned;
} convo;

static char *own(convo *c, const char *s, size_t n) {
    if (c->n_owned == c->cap_owned) {
        size_t nc = c->cap_owned ? c->cap_owned * 2 : 16;
        char **no = realloc(c->owned, nc * sizeof *no);
        if (!no) return NULL;
        c->owned = no;
        c->cap_owned = nc;
    }
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    c->owned[c->n_owned++] = p;
    return p;
}

static int add_msg(convo *c, int32_t role, const char *content, const char *reasoning) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 16;
        dsi_chat_message *nm = realloc(c->m, nc * sizeof *nm);
        if (!nm) return 0;
        c->m = nm;
        c->cap = nc;
    }
    dsi_chat_message_init(&c->m[c->n]);
    c->m[c->n].role = role;
    c->m[c->n].content = content;
    c->m[c->n].reasoning = reasoning;
    c->n++;
    return 1;
}

static void convo_clear(convo *c) {
    for (size_t i = 0; i < c->n_owned; i++) free(c->owned[i]);
    c->n_owned = 0;
    c->n = 0;
}

static int run_chat(dsi_model *m, dsi_session *s, dsi_sampler *smp, const cli_opts *o) {
    convo c = {0};
    dsi_chat_options co;
    dsi_chat_options_init(&co);
    co.thinking = o->think == 1 ? DSI_THINKING_ON : DSI_THINKING_OFF;
    dsi_token user_tok = -1;
    (void)dsi_model_special_token(m, DSI_SPECIAL_USER, &user_tok);
    char line[65536];
    int rc = 0;
    fprintf(stderr, "%s: chat mode, thinking %s. /reset starts over, /quit (or Ctrl+D) exits, "
                    "Ctrl+C stops an answer.\n", prog, co.thinking ? "on" : "off");
    for (;;) {
        fprintf(stderr, "> ");
        fflush(stderr);
        g_interrupted = 0;
        if (!fgets(line, sizeof line, stdin)) {
            if (ferror(stdin) && errno == EINTR && g_interrupted) { fprintf(stderr, "\n"); break; }
            break; /* EOF */
        }
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            convo_clear(&c);
            dsi_session_reset(s);
            dsi_sampler_reset(smp);
            fprintf(stderr, "%s: conversation cleared\n", prog);
            continue;
        }
        if (len == 0) continue;
        char *content = own(&c, line, len);
        if (!content || !add_msg(&c, DSI_ROLE_USER, content, NULL)) { fprintf(stderr, "%s: out of memory\n", prog); rc = 1; break; }

        const dsi_chat_message **ptrs = malloc(c.n * sizeof *ptrs);
        if (!ptrs) { rc = 1; break; }
        for (size_t i = 0; i < c.n; i++) ptrs[i] = &c.m[i];
        /* token ids straight from the template: what the user typed stays plain text even if
         * it spells a special token (rendering to text and parsing special tokens would let
         * a message forge turns) */
        size_t nt = 0;
        dsi_chat_tokenize(m, ptrs, c.n, &co, NULL, 0, &nt);
        dsi_token *toks = malloc((nt ? nt : 1) * sizeof *toks);
        if (!toks || dsi_chat_tokenize(m, ptrs, c.n, &co, toks, nt, &nt) != DSI_OK) {
            fprintf(stderr, "%s: chat: %s\n", prog, toks ? dsi_last_error() : "out of memory");
            free(toks);
            free(ptrs);
            rc = 1;
            break;
        }
        free(ptrs);

        answer_buf answer = {m, {0}};
        dsi_generate_options go;
        dsi_generate_options_init(&go);
        go.prompt = toks;
        go.n_prompt = nt;
        go.max_tokens = o->n_predict >= 0 ? o->n_predict : 512;
        go.stop_tokens = &user_tok;
        go.n_stop_tokens = user_tok >= 0 ? 1 : 0;
        go.on_token = on_token;
        go.user_data = &answer;
        dsi_generate_result r;
        dsi_generate_result_init(&r);
        /* a new answer: forget a Ctrl+C that came after the previous one had finished, then
         * accept new ones (a press from here on stops this answer, even before it starts) */
        dsi_session_cancel_clear(s);
        g_generating = 1;
        dsi_status st = dsi_session_generate(s, smp, &go, &r);
        g_generating = 0;
        free(toks);
        printf("\n");
        fflush(stdout);
        if (st == DSI_ERR_CANCELLED) {
            fprintf(stderr, "%s: [answer stopped]\n", prog);
        } else if (st != DSI_OK) {
            fprintf(stderr, "%s: generate: %s\n", prog, dsi_session_last_error(s));
            free(answer.raw.text);
            rc = 1;
            break;
        }
        fprintf(stderr, "%s: [turn: %llu prompt tokens, %llu reused from earlier turns, %llu generated, %s]\n",
                prog, (unsigned long long)r.n_prompt, (unsigned long long)r.n_reused,
                (unsigned long long)r.n_generated, finish_name(r.finish_reason));
        if (o->verbose) print_speed(&r);
        if (r.finish_reason == DSI_FINISH_CONTEXT_FULL)
            fprintf(stderr, "%s: the context is full; /reset to start over\n", prog);
        /* keep the answer (what the user saw) in the history; with thinking on, the text
         * before </think> is the reasoning */
        const char *a = answer.raw.text ? answer.raw.text : "";
        const char *reasoning = NULL, *body = a;
        const char *te = co.thinking ? strstr(a, "</think>") : NULL;
        if (te) {
            reasoning = own(&c, a, (size_t)(te - a));
            body = te + strlen("</think>");
        } else if (co.thinking) {
            reasoning = own(&c, a, strlen(a)); /* never left the thinking block */
            body = "";
        }
        char *bcopy = own(&c, body, strlen(body));
        free(answer.raw.text);
        if (!bcopy || !add_msg(&c, DSI_ROLE_ASSISTANT, bcopy, reasoning)) { rc = 1; break; }
    }
    convo_clear(&c);
    free(c.m);
    free(c.owned);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    cli_opts o;
    if (!parse_args(argc, argv, &o)) return 2;
    if (o.help) {
        usage(stdout);
        return 0;
    }
    if (o.version) {
        printf("dsinfer-cli (libdsinfer %s, ABI %u)\n", dsi_version_string(), (unsigned)dsi_abi_version());
        return 0;
    }

    dsi_context_options copt;
    dsi_context_options_init(&copt, DSI_ABI_VERSION);
    copt.n_threads = o.threads;
    copt.backend = o.backend;
    dsi_context *ctx = NULL;
    if (dsi_context_create(&copt, &ctx) != DSI_OK) {
        fprintf(stderr, "%s: cannot create the context: %s\n", prog, dsi_last_error());
        return 1;
    }
    if (o.list_devices) {
        int rc = list_devices(ctx);
        dsi_context_free(ctx);
        return rc;
    }

    const char *path = o.model;
    if (!path) {
        path = default_model();
        fprintf(stderr, "%s: no -m given; using the built-in default model %s\n", prog, path);
    }
    if (!o.prompt && !o.prompt_file && !o.chat) {
        fprintf(stderr, "%s: nothing to do: give -p PROMPT, -f FILE or --chat (see -h)\n", prog);
        dsi_context_free(ctx);
        return 2;
    }

    int rc = 0;
    dsi_model *model = NULL;
    dsi_session *s = NULL;
    dsi_sampler *smp = NULL;
    char *file_text = NULL;
    dsi_token *toks = NULL;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    dsi_place_options po;
    dsi_place_options_init(&po);
    uint64_t *profile = NULL, n_profile = 0;
    if (o.expert_counts && !(profile = load_counts(o.expert_counts, &n_profile))) {
        rc = 1;
        goto done;
    }
    if (o.no_mmap) mo.access = DSI_ACCESS_PREAD;
    if (o.resident) mo.flags |= DSI_MODEL_FLAG_RESIDENT;
    if (o.place || o.overrides || o.hybrid >= 0 || o.device_budget || o.host_budget || o.device_experts ||
        o.direct_io || profile || o.hybrid_rows) {
        po.policy = o.place ? (uint32_t)(o.place - 1) : DSI_PLACE_AUTO;
        po.overrides = o.overrides;
        po.hybrid = o.hybrid >= 0 ? (uint32_t)o.hybrid : DSI_HYBRID_CPU;
        po.device_budget = o.device_budget;
        po.host_budget = o.host_budget;
        po.device_experts = o.device_experts;
        if (o.direct_io) po.flags |= DSI_PLACE_FLAG_DIRECT_IO;
        po.expert_counts = profile;
        po.hybrid_rows = o.hybrid_rows;
        po.n_expert_counts = n_profile;
        mo.place = &po;
    }
    if (dsi_model_load(ctx, path, &mo, &model) != DSI_OK) {
        fprintf(stderr, "%s: cannot load model '%s': %s\n", prog, path, dsi_last_error());
        rc = 1;
        goto done;
    }
    if (o.verbose && mo.place) {
        dsi_place_info pi;
        dsi_place_info_init(&pi);
        if (dsi_model_place_info(model, &pi) == DSI_OK) {
            static const char *const tiers[] = {"device", "host", "disk"};
            fprintf(stderr, "[placement: policy %u, hybrid %s; device %llu bytes (budget %llu), host %llu (budget %llu), "
                            "disk %llu, mapped %llu; expert cache %u slots, %llu bytes in %s; %u experts per layer on the "
                            "device]\n",
                    pi.policy, pi.hybrid == DSI_HYBRID_UPLOAD ? "upload" : pi.hybrid == DSI_HYBRID_AUTO ? "auto" : "cpu",
                    (unsigned long long)pi.device_weight_bytes, (unsigned long long)pi.device_budget,
                    (unsigned long long)pi.host_bytes, (unsigned long long)pi.host_budget,
                    (unsigned long long)pi.disk_bytes, (unsigned long long)pi.mapped_bytes, pi.expert_cache_slots,
                    (unsigned long long)pi.expert_cache_bytes, tiers[pi.expert_cache_tier < 3 ? pi.expert_cache_tier : 0],
                    pi.device_experts_per_layer);
            for (uint32_t c = 0; c < pi.n_classes && c < DSI_PLACE_MAX_CLASSES; c++)
                if (pi.classes[c].bytes)
                    fprintf(stderr, "[  %-14s %-6s %llu bytes]\n", pi.classes[c].name,
                            tiers[pi.classes[c].tier < 3 ? pi.classes[c].tier : 0],
                            (unsigned long long)pi.classes[c].bytes);
        }
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = o.n_ctx;
    so.spec = o.spec;
    so.draft_max = o.draft_max;
    so.draft_confidence = o.draft_conf;
    if (dsi_session_create(model, &so, &s) != DSI_OK) {
        fprintf(stderr, "%s: cannot create a session: %s\n", prog, dsi_last_error());
        rc = 1;
        goto done;
    }
    if (o.prompt_cache) {
        dsi_prompt_cache_options pco;
        dsi_prompt_cache_options_init(&pco);
        pco.dir = o.prompt_cache;
        if (dsi_session_set_prompt_cache(s, &pco) != DSI_OK) {
            fprintf(stderr, "%s: --prompt-cache: %s\n", prog, dsi_session_last_error(s));
            rc = 1;
            goto done;
        }
    }
    if (o.session_load && dsi_session_load_file(s, o.session_load) != DSI_OK) {
        fprintf(stderr, "%s: --session-load: %s\n", prog, dsi_session_last_error(s));
        rc = 1;
        goto done;
    }
    dsi_sampler_options sopt;
    dsi_sampler_options_init(&sopt);
    sopt.temperature = o.temp;
    sopt.top_k = o.top_k;
    sopt.top_p = o.top_p;
    sopt.min_p = o.min_p;
    sopt.seed = o.seed;
    if (dsi_sampler_create(&sopt, &smp) != DSI_OK) {
        fprintf(stderr, "%s: %s\n", prog, dsi_last_error());
        rc = 2;
        goto done;
    }

    g_session = s;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: Ctrl+C at the chat prompt interrupts the read */
    sigaction(SIGINT, &sa, NULL);

    if (o.chat) {
        rc = run_chat(model, s, smp, &o);
        goto save;
    }

    const char *text = o.prompt;
    size_t len = text ? strlen(text) : 0;
    if (o.prompt_file) {
        file_text = read_file(o.prompt_file, &len);
        if (!file_text) { rc = 1; goto done; }
        text = file_text;
    }
    size_t nt = 0;
    toks = tokenize(model, text, len, DSI_TOKENIZE_ADD_BOS, &nt);
    if (!toks) { rc = 1; goto done; }
    dsi_generate_options go;
    dsi_generate_options_init(&go);
    go.prompt = toks;
    go.n_prompt = nt;
    go.max_tokens = o.n_predict >= 0 ? o.n_predict : 128;
    go.on_token = on_token;
    go.user_data = NULL;
    dsi_generate_result r;
    dsi_generate_result_init(&r);
    g_generating = 1;
    dsi_status st = dsi_session_generate(s, smp, &go, &r);
    g_generating = 0;
    printf("\n");
    if (st != DSI_OK && st != DSI_ERR_CANCELLED) {
        fprintf(stderr, "%s: generate: %s\n", prog, dsi_session_last_error(s));
        rc = 1;
        goto done;
    }
    print_speed(&r);
    if (st == DSI_ERR_CANCELLED) rc = 130; /* like a shell's Ctrl+C status */

save:
    if (o.session_save && s) {
        uint32_t pos = 0;
        dsi_session_position(s, &pos);
        if (pos == 0) {
            fprintf(stderr, "%s: --session-save: the session is empty; nothing saved\n", prog);
        } else if (dsi_session_save_file(s, o.session_save) != DSI_OK) {
            fprintf(stderr, "%s: --session-save: %s\n", prog, dsi_session_last_error(s));
            if (rc == 0) rc = 1;
        } else if (o.verbose) {
            fprintf(stderr, "%s: session (%u tokens) saved to %s\n", prog, pos, o.session_save);
        }
    }

done:
    if (model && o.verbose && mo.place) {
        dsi_place_info pi;
        dsi_place_info_init(&pi);
        if (dsi_model_place_info(model, &pi) == DSI_OK && pi.steps)
            fprintf(stderr, "[placement counters: %llu steps, expert cache hits %llu misses %llu, %llu bytes read, "
                            "%llu uploaded; experts computed by the cpu %llu, by the device %llu]\n",
                    (unsigned long long)pi.steps, (unsigned long long)pi.cache_hits,
                    (unsigned long long)pi.cache_misses, (unsigned long long)pi.bytes_read,
                    (unsigned long long)pi.bytes_uploaded, (unsigned long long)pi.cpu_experts,
                    (unsigned long long)pi.device_experts);
    }
    if (model && o.save_counts && !save_counts(model, o.save_counts) && rc == 0) rc = 1;
    free(profile);
    /* the signal handler may cancel g_session: unpublish it before the free (docs/api.md
     * "Cancellation"); the library's threads block SIGINT, so the handler runs on this one */
    g_generating = 0;
    g_session = NULL;
    free(toks);
    free(file_text);
    dsi_sampler_free(smp);
    dsi_session_free(s);
    dsi_model_free(model);
    dsi_context_free(ctx);
    return rc;
}
