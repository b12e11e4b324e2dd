/*
 * Skips of the test programs (docs/CONTRIBUTING.md "Skips and requirements").
 *
 * A skip means only: hardware or software this test needs is absent here. Anything else
 * that goes wrong — the code under test, a helper program (dsinfer-mkmodel), the NumPy
 * reference failing to run — is a failure. dsit_absent() is the one way to skip:
 *   - it prints "SKIP: <reason>" and appends a line to $DSI_SKIP_LOG (if set), so
 *     scripts/test-all.sh counts and lists every skip, including skips of single cmocka tests
 *     inside a program that otherwise passed;
 *   - where the environment says the thing is present (DSI_REQUIRE_<WHAT>=1, set by CI after
 *     scripts/setup-deps.sh installed it), the absence is a failure instead.
 * WHAT is one of:
 *   VULKAN        a Vulkan driver + device and the libdsinfer-vulkan module
 *   PYTHON        /usr/bin/python3 with NumPy and regex (the references in tests/reference)
 *   UNICODE_DATA  Debian unicode-data (/usr/share/unicode)
 *   MODELS        the example programs (dsinfer-mkmodel, dsinfer-cli) and the tiny models the
 *                 build writes with them (DSI_BUILD_EXAMPLES)
 *   CUDA_TOOLKIT  the CUDA module, built where nvcc is found
 *   CUDA_DEVICE   an NVIDIA GPU with its driver
 *   ISA           a CPU instruction set (AVX2, AVX-512) a kernel path needs
 *   O_DIRECT      a file system that accepts O_DIRECT where the tiny models are (tmpfs does not)
 *   TRAIN         python3-torch and bible-kjv (tools/train; Python tests, tests/common/skip.py)
 * The Python test programs skip through tests/common/skip.py, the same contract.
 * Header only; include it after <cmocka.h> to use DSIT_SKIP_TEST.
 */
#ifndef DSI_TEST_SKIP_H
#define DSI_TEST_SKIP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSIT_SKIP_CODE 77 /* ctest SKIP_RETURN_CODE / meson's skip code */

/* 1 if DSI_REQUIRE_<what>=1. */
static inline int dsit_required(const char *what) {
    char name[64];
    snprintf(name, sizeof name, "DSI_REQUIRE_%s", what);
    const char *v = getenv(name);
    return v && v[0] == '1' && v[1] == 0;
}

/* The WHAT of a GPU backend test's absence: "VULKAN" for vulkan (driver, device and module are
 * one requirement); for cuda, "CUDA_TOOLKIT" when the module itself is missing, else
 * "CUDA_DEVICE". */
static inline const char *dsit_gpu_what(const char *backend, int module_missing) {
    if (strcmp(backend, "vulkan") == 0) return "VULKAN";
    return module_missing ? "CUDA_TOOLKIT" : "CUDA_DEVICE";
}

/* The name skip log lines give the program: $DSI_TEST_NAME where the build system runs one
 * program under several test names, else argv[0]'s base name. */
static inline const char *dsit_program(void) {
    const char *tn = getenv("DSI_TEST_NAME");
    if (tn && *tn) return tn;
    static char buf[256];
    if (!buf[0]) { /* argv[0], from /proc (standard C only: tests build with -std=c11) */
        FILE *f = fopen("/proc/self/cmdline", "rb");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        if (!buf[0]) snprintf(buf, sizeof buf, "?");
    }
    const char *s = strrchr(buf, '/');
    return s ? s + 1 : buf;
}

/* Reports the absence of `what`: prints the reason and, unless DSI_REQUIRE_<what>=1, appends
 * "<kind>\t<program>\t<reason>" to $DSI_SKIP_LOG (kind "program": the whole program exits
 * 77; "test": one test inside a program that goes on). Returns DSIT_SKIP_CODE or 1. */
static inline int dsit_absent_va(const char *what, const char *where, const char *fmt,
                                 va_list ap) {
    char reason[768];
    vsnprintf(reason, sizeof reason, fmt, ap);
    if (dsit_required(what)) {
        printf("FAIL: %s%s%s — but DSI_REQUIRE_%s=1 says it is present here\n",
               where ? where : "", where ? ": " : "", reason, what);
        fflush(stdout);
        return 1;
    }
    printf("SKIP: %s%s%s\n", where ? where : "", where ? ": " : "", reason);
    fflush(stdout);
    const char *log = getenv("DSI_SKIP_LOG");
    if (log && *log) {
        FILE *f = fopen(log, "a");
        if (f) {
            fprintf(f, "%s\t%s%s%s\t%s\n", where ? "test" : "program", dsit_program(),
                    where ? "/" : "", where ? where : "", reason);
            fclose(f);
        }
    }
    return DSIT_SKIP_CODE;
}

/* The whole program: `return dsit_absent(...)` from main (77, or 1 when required). */
static inline int dsit_absent(const char *what, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static inline int dsit_absent(const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = dsit_absent_va(what, NULL, fmt, ap);
    va_end(ap);
    return rc;
}

/* One test of a program (see DSIT_SKIP_TEST); `where` names it. */
static inline int dsit_absent_test(const char *what, const char *where, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline int dsit_absent_test(const char *what, const char *where, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = dsit_absent_va(what, where, fmt, ap);
    va_end(ap);
    return rc;
}

/* 1 if `python` runs and imports every module of `modules` (space separated). */
static inline int dsit_python_has(const char *python, const char *modules) {
    char cmd[1024], imports[512] = "";
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", modules);
    for (char *m = strtok(tmp, " "); m; m = strtok(NULL, " ")) {
        size_t l = strlen(imports);
        snprintf(imports + l, sizeof imports - l, "%simport %s", l ? "; " : "", m);
    }
    snprintf(cmd, sizeof cmd, "'%s' -c '%s' >/dev/null 2>&1", python, imports);
    return system(cmd) == 0;
}

/* Inside a cmocka test: skip it (absent) or fail it (required). */
#define DSIT_SKIP_TEST(what, ...)                                                \
    do {                                                                         \
        if (dsit_absent_test((what), __func__, __VA_ARGS__) == DSIT_SKIP_CODE) { \
            skip();                                                              \
        } else {                                                                 \
            fail();                                                              \
        }                                                                        \
    } while (0)

#endif
