/*
 * dsinfer-cli end to end: version, bad options and files (one clear line, non-zero exit),
 * one-shot generation, the default model, and a two-turn chat that reuses the first turn.
 * Exits 77 (skip) when the binary or the tiny model is not built.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsinfer.h"
#include "tests/common/skip.h"

static char cli[4096], model[4096], tmp[4096];
static char out[1 << 16], err[1 << 16];

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

/* Runs `args` (already shell-quoted) with optional stdin text; returns the exit status. */
static int run(const char *args, const char *input) {
    char cmd[32768], o[4200], e[4200], in[4200];
    snprintf(o, sizeof o, "%s.out", tmp);
    snprintf(e, sizeof e, "%s.err", tmp);
    snprintf(in, sizeof in, "%s.in", tmp);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    if (input) fputs(input, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s < %s > %s 2> %s", cli, args, in, o, e);
    int rc = system(cmd);
    slurp(o, out, sizeof out);
    slurp(e, err, sizeof err);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_version_and_help(void **state) {
    (void)state;
    assert_int_equal(run("--version", NULL), 0);
    assert_non_null(strstr(out, DSI_VERSION_STRING));
    assert_int_equal(run("-h", NULL), 0);
    assert_non_null(strstr(out, "--chat"));
}

static void test_errors(void **state) {
    (void)state;
    assert_int_equal(run("--temp abc -p x", NULL), 2);
    assert_non_null(strstr(err, "--temp"));
    assert_int_equal(lines(err), 1);
    assert_int_equal(run("--top-p 0 -p x", NULL), 2);
    assert_non_null(strstr(err, "--top-p"));
    assert_int_equal(run("-n -5 -p x", NULL), 2);
    assert_int_equal(run("--bogus", NULL), 2);
    assert_non_null(strstr(err, "--bogus"));
    assert_int_equal(run("-m /nonexistent/model.gguf -p x", NULL), 1);
    assert_non_null(strstr(err, "cannot load model"));
    assert_int_equal(lines(err), 1);
    /* a file that is not a GGUF */
    char bad[4200], args[8400];
    snprintf(bad, sizeof bad, "%s.bad", tmp);
    FILE *f = fopen(bad, "w");
    fputs("this is not a model\n", f);
    fclose(f);
    snprintf(args, sizeof args, "-m %s -p x", bad);
    assert_int_equal(run(args, NULL), 1);
    assert_non_null(strstr(err, "cannot load model"));
    remove(bad);
    snprintf(args, sizeof args, "-m %s", model);
    assert_int_equal(run(args, NULL), 2); /* nothing to do */
    snprintf(args, sizeof args, "-m %s -p x -f y", model);
    assert_int_equal(run(args, NULL), 2);
}

static void test_one_shot(void **state) {
    (void)state;
    char args[8400];
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 5 --temp 0", model);
    assert_int_equal(run(args, NULL), 0);
    assert_non_null(strstr(err, "decode 5 tokens"));
    assert_true(strlen(out) > 0);
    /* greedy twice: the same text */
    char first[sizeof out];
    strcpy(first, out);
    assert_int_equal(run(args, NULL), 0);
    assert_string_equal(first, out);
    /* sampled with a seed: reproducible too */
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 5 --temp 0.8 --top-k 40 --top-p 0.9 --min-p 0.01 --seed 7 -t 1", model);
    assert_int_equal(run(args, NULL), 0);
    strcpy(first, out);
    assert_int_equal(run(args, NULL), 0);
    assert_string_equal(first, out);
}

/* Memory tiers from the command line (docs/placement.md): bad values are usage errors; the
 * routed experts streamed from the file give the resident run's greedy text, and -v prints
 * the plan and the counters. */
static void test_placement(void **state) {
    (void)state;
    assert_int_equal(run("--hybrid gpu -p x", NULL), 2);
    assert_non_null(strstr(err, "--hybrid"));
    assert_int_equal(run("--device-budget 12X -p x", NULL), 2);
    assert_non_null(strstr(err, "--device-budget"));
    assert_int_equal(run("--host-budget 0 -p x", NULL), 2);
    assert_int_equal(run("--device-experts many -p x", NULL), 2);
    assert_non_null(strstr(err, "--device-experts"));
    assert_int_equal(run("--place nowhere -p x", NULL), 2);
    assert_non_null(strstr(err, "experts-streamed"));
    char args[8400], ref[sizeof out];
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 6 --temp 0", model);
    assert_int_equal(run(args, NULL), 0);
    strcpy(ref, out);
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 6 --temp 0 --place experts-streamed --no-mmap -v", model);
    assert_int_equal(run(args, NULL), 0);
    assert_string_equal(out, ref);
    assert_non_null(strstr(err, "[placement: policy 3"));
    assert_non_null(strstr(err, "experts computed by the cpu"));
    /* --resident: everything read in, Engram tables too; the same text; not with experts
     * streamed from the file it closes */
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 6 --temp 0 --resident", model);
    assert_int_equal(run(args, NULL), 0);
    assert_string_equal(out, ref);
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 6 --temp 0 --resident --place experts-streamed", model);
    assert_int_equal(run(args, NULL), 1);
    assert_non_null(strstr(err, "DSI_MODEL_FLAG_RESIDENT"));
    /* a routing profile: written after the run (the header, one line per layer of counts
     * summing to the evaluated rows x k), read back (the same greedy text on the CPU); a
     * malformed or missing one is an error before the load */
    char prof[4200];
    snprintf(prof, sizeof prof, "%s.prof", tmp);
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 6 --temp 0 --save-expert-counts %s", model, prof);
    assert_int_equal(run(args, NULL), 0);
    assert_string_equal(out, ref);
    FILE *f = fopen(prof, "r");
    assert_non_null(f);
    unsigned ver = 0, nl = 0, ne = 0;
    assert_int_equal(fscanf(f, "dsinfer-expert-counts %u %u %u", &ver, &nl, &ne), 3);
    assert_int_equal(ver, 1);
    assert_true(nl > 0 && ne > 0);
    unsigned long long first = 0;
    for (unsigned l = 0; l < nl; l++) {
        unsigned long long sum = 0, v;
        for (unsigned x = 0; x < ne; x++) {
            assert_int_equal(fscanf(f, "%llu", &v), 1);
            sum += v;
        }
        if (l == 0) first = sum;
        assert_true(sum > 0);
        assert_int_equal(sum, first); /* every layer routed the same rows */
    }
    fclose(f);
    snprintf(args, sizeof args, "-m %s -p 'Hello world' -n 6 --temp 0 --expert-counts %s", model, prof);
    assert_int_equal(run(args, NULL), 0);
    assert_string_equal(out, ref);
    f = fopen(prof, "w");
    assert_non_null(f);
    fputs("dsinfer-expert-counts 1 2 2\n1 2 3\n", f); /* one count short */
    fclose(f);
    assert_int_equal(run(args, NULL), 1);
    assert_non_null(strstr(err, "is not a routing profile"));
    f = fopen(prof, "w");
    assert_non_null(f);
    fputs("dsinfer-expert-counts 1 2 2\n1 2 3 4\n", f); /* well formed, not this model's shape */
    fclose(f);
    assert_int_equal(run(args, NULL), 1);
    assert_non_null(strstr(err, "n_expert_counts 4 is not the model's"));
    remove(prof);
    assert_int_equal(run("--expert-counts /nonexistent/profile -p x", NULL), 1);
    assert_non_null(strstr(err, "cannot open"));
    /* an override that puts an attention tensor on disk is refused at load */
    snprintf(args, sizeof args, "-m %s -p x -ot 'blk.*.attn_q_a.weight=disk'", model);
    assert_int_equal(run(args, NULL), 1);
    assert_non_null(strstr(err, "the disk tier holds routed experts and Engram tables only"));
}

static void test_default_model(void **state) {
    (void)state;
    int rc = run("-p 'Hi' -n 2 --temp 0", NULL);
    assert_non_null(strstr(err, "built-in default model"));
    assert_int_equal(rc, 0);
}

static void test_chat_reuse(void **state) {
    (void)state;
    char args[8400];
    snprintf(args, sizeof args, "-m %s --chat -n 4 --temp 0", model);
    assert_int_equal(run(args, "Hello there\nAnd now?\n/reset\nFresh start\n/quit\n"), 0);
    /* three turns; the second reuses the first (prompt + answer) from the session */
    const char *t1 = strstr(err, "[turn:");
    assert_non_null(t1);
    const char *t2 = strstr(t1 + 1, "[turn:");
    assert_non_null(t2);
    unsigned long long np = 0, reused = 0, gen = 0;
    assert_int_equal(sscanf(t2, "[turn: %llu prompt tokens, %llu reused from earlier turns, %llu generated",
                            &np, &reused, &gen), 3);
    assert_true(reused > 0);
    const char *t3 = strstr(t2 + 1, "[turn:");
    assert_non_null(t3);
    assert_int_equal(sscanf(t3, "[turn: %llu prompt tokens, %llu reused", &np, &reused), 2);
    assert_non_null(strstr(err, "conversation cleared"));
}

int main(void) {
    const char *bld = getenv("DSI_BUILD_DIR"), *dir = getenv("DSI_MODELS_DIR");
    if (!bld) { printf("FAIL: DSI_BUILD_DIR not set (run through ctest / meson test)\n"); return 1; }
    snprintf(cli, sizeof cli, "%s/bin/dsinfer-cli", bld);
    if (access(cli, X_OK) != 0) snprintf(cli, sizeof cli, "%s/examples/cli/dsinfer-cli", bld);
    if (access(cli, X_OK) != 0) return dsit_absent("MODELS", "dsinfer-cli not built");
    snprintf(model, sizeof model, "%s/tiny-v41.gguf", dir ? dir : "models");
    if (access(model, R_OK) != 0) return dsit_absent("MODELS", "%s not built", model);
    snprintf(tmp, sizeof tmp, "%s/tests/cli_test_%d", bld, (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_and_help),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_one_shot),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_default_model),
        cmocka_unit_test(test_chat_reuse),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char p[4200];
    const char *ext[3] = {".out", ".err", ".in"};
    for (int i = 0; i < 3; i++) { snprintf(p, sizeof p, "%s%s", tmp, ext[i]); remove(p); }
    return rc;
}
