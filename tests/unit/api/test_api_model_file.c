/*
 * The file-stability and reader-callback contracts (docs/api.md "Model files", "Reader
 * callbacks"; dsinfer.h DSI_ACCESS_*, DSI_MODEL_FLAG_*, dsi_reader).
 *
 * Files changed under a loaded model — each case in a child process (a SIGBUS must not take
 * the test down), bounded in time, on a private copy of the tiny model:
 *   - MMAP, no flag, truncated: the process dies (SIGBUS) at the next evaluation — the
 *     documented hazard;
 *   - MMAP + VERIFY_FILE, truncated or rewritten in place: DSI_ERR_IO, session unchanged;
 *   - PREAD, truncated: the Engram rows read lazily fail with DSI_ERR_IO (no crash);
 *   - PREAD + VERIFY_FILE, truncated or rewritten in place: DSI_ERR_IO;
 *   - PREAD + RESIDENT, truncated to 0 and unlinked: the model goes on with identical logits.
 * (The flags are new: the old library refused them with INVALID_ARGUMENT.) The reader
 * callbacks' side of the contract is test_api_reader.c.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tests/common/skip.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api_util.h"

#define BOUND_S 300.0
#define RETURNED 42 /* child exit code: the call after the change returned */

static const char *model_src;
static char dir[4096];
static int n_case;

enum { CH_TRUNC_HALF, CH_TRUNC_SMALL, CH_OVERWRITE, CH_TRUNC_ZERO_UNLINK };

typedef struct {
    int32_t access;
    uint32_t flags;
    int change;
    dsi_status expect;    /* status of the append after the change */
    int compare_logits;   /* RESIDENT: a fresh session gives the same logits as before */
    char path[4300];
} file_case;

static void tokens_of(dsi_model *m, dsi_token *t, size_t *n) {
    const char *text = "Files must be replaced atomically, never rewritten in place.";
    if (dsi_tokenize(m, text, strlen(text), DSI_TOKENIZE_ADD_BOS, t, 64, n) != DSI_OK) *n = 0;
}

static int child_file_case(void *arg) {
    file_case *c = arg;
    signal(SIGBUS, SIG_DFL); /* not cmocka's handler: the parent looks at how the child ended */
    signal(SIGSEGV, SIG_DFL);
    if (apiu_copy_file(model_src, c->path) != 0) return 10;
    /* an old modification time, so that an in-place rewrite surely changes it */
    struct timespec old[2] = {{978307200, 0}, {978307200, 0}};
    if (utimensat(AT_FDCWD, c->path, old, 0) != 0) return 11;
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    dsi_context *ctx = NULL;
    dsi_model *m = NULL;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.access = c->access;
    mo.flags = c->flags;
    if (dsi_context_create(&co, &ctx) != DSI_OK) return 12;
    if (dsi_model_load(ctx, c->path, &mo, &m) != DSI_OK) {
        printf("child: load: %s\n", dsi_last_error());
        return 13;
    }
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 96;
    dsi_session *s = NULL;
    dsi_token t[64];
    size_t n = 0;
    tokens_of(m, t, &n);
    if (n < 4 || dsi_session_create(m, &so, &s) != DSI_OK) return 14;
    if (dsi_session_sync(s, t, n, NULL) != DSI_OK) return 15;
    const float *lg = NULL;
    int32_t nv = 0;
    if (dsi_session_logits(s, &lg, &nv) != DSI_OK) return 16;
    float *before = malloc((size_t)nv * sizeof *before);
    if (!before) return 17;
    memcpy(before, lg, (size_t)nv * sizeof *before);

    struct stat st;
    if (stat(c->path, &st) != 0) return 18;
    switch (c->change) {
    case CH_TRUNC_HALF: if (truncate(c->path, st.st_size / 2) != 0) return 19; break;
    case CH_TRUNC_SMALL: if (truncate(c->path, 4096) != 0) return 19; break;
    case CH_TRUNC_ZERO_UNLINK:
        if (truncate(c->path, 0) != 0 || unlink(c->path) != 0) return 19;
        break;
    case CH_OVERWRITE: {
        /* same size, bytes changed in place in the second half (weights, Engram tables) */
        int fd = open(c->path, O_WRONLY);
        static char junk[1 << 16];
        memset(junk, 0x7F, sizeof junk);
        int ok = fd >= 0;
        for (off_t o = st.st_size / 2; ok && o + (off_t)sizeof junk <= st.st_size; o += 4 * (off_t)sizeof junk)
            ok = pwrite(fd, junk, sizeof junk, o) == (ssize_t)sizeof junk;
        if (fd >= 0) close(fd);
        if (!ok) return 19;
        break;
    }
    }
    uint32_t pos0 = 0, pos1 = 0;
    dsi_session_position(s, &pos0);
    dsi_status r = dsi_session_append(s, &t[1], 1);
    dsi_session_position(s, &pos1);
    if (r != c->expect) {
        printf("child: append returned %d (%s), expected %d\n", (int)r, dsi_session_last_error(s), (int)c->expect);
        return RETURNED;
    }
    /* VERIFY_FILE fails before the step: the session is unchanged. A read failing inside a
     * one-token step (no verification) leaves the prefix before it: the step wrote one row,
     * within the rewind margin, so the state before it is intact (lib/api/session.c
     * dsii_session_step_failed) — never half-updated state past it. */
    int verify = (c->flags & DSI_MODEL_FLAG_VERIFY_FILE) != 0;
    if (r == DSI_ERR_IO && (pos1 != pos0 ||
                            (verify && !strstr(dsi_session_last_error(s), "since it was loaded")))) {
        printf("child: after IO: position %u -> %u, message '%s'\n", pos0, pos1, dsi_session_last_error(s));
        return 21;
    }
    if (c->compare_logits) {
        dsi_session *s2 = NULL;
        if (dsi_session_create(m, &so, &s2) != DSI_OK || dsi_session_sync(s2, t, n, NULL) != DSI_OK ||
            dsi_session_logits(s2, &lg, &nv) != DSI_OK)
            return 22;
        if (memcmp(before, lg, (size_t)nv * sizeof *before) != 0) return 23;
        dsi_session_free(s2);
    }
    free(before);
    dsi_session_free(s);
    dsi_model_free(m);
    dsi_context_free(ctx);
    unlink(c->path);
    return 0;
}

static int run_case(int32_t access, uint32_t flags, int change, dsi_status expect, int cmp) {
    static file_case c;
    memset(&c, 0, sizeof c);
    c.access = access;
    c.flags = flags;
    c.change = change;
    c.expect = expect;
    c.compare_logits = cmp;
    snprintf(c.path, sizeof c.path, "%s/model-%d.gguf", dir, n_case++);
    int status = apiu_run_child(child_file_case, &c, BOUND_S);
    unlink(c.path);
    if (status == -1) fail_msg("the child did not finish within %.0f s", BOUND_S);
    return status;
}

static void expect_ok_child(int status) {
    if (WIFSIGNALED(status)) fail_msg("the child died of signal %d", WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_mmap_truncated_is_fatal(void **state) {
    (void)state;
    /* the documented hazard: the mapping loses its pages (SIGBUS; under a sanitizer its
     * report and abort) — anything but the call returning */
    int status = run_case(DSI_ACCESS_MMAP, 0, CH_TRUNC_HALF, DSI_OK, 0);
    assert_false(WIFEXITED(status) && (WEXITSTATUS(status) == RETURNED || WEXITSTATUS(status) == 0));
    assert_false(WIFEXITED(status) && WEXITSTATUS(status) >= 10 && WEXITSTATUS(status) < 20);
    if (WIFSIGNALED(status)) print_message("child ended by signal %d (SIGBUS is %d)\n", WTERMSIG(status), SIGBUS);
}

static void test_mmap_verify(void **state) {
    (void)state;
    expect_ok_child(run_case(DSI_ACCESS_MMAP, DSI_MODEL_FLAG_VERIFY_FILE, CH_TRUNC_HALF, DSI_ERR_IO, 0));
    expect_ok_child(run_case(DSI_ACCESS_MMAP, DSI_MODEL_FLAG_VERIFY_FILE, CH_OVERWRITE, DSI_ERR_IO, 0));
}

static void test_pread_lazy_rows(void **state) {
    (void)state;
    /* without verification the lazily read Engram rows meet the end of the file */
    expect_ok_child(run_case(DSI_ACCESS_PREAD, 0, CH_TRUNC_SMALL, DSI_ERR_IO, 0));
}

static void test_pread_verify(void **state) {
    (void)state;
    expect_ok_child(run_case(DSI_ACCESS_PREAD, DSI_MODEL_FLAG_VERIFY_FILE, CH_TRUNC_HALF, DSI_ERR_IO, 0));
    expect_ok_child(run_case(DSI_ACCESS_PREAD, DSI_MODEL_FLAG_VERIFY_FILE, CH_OVERWRITE, DSI_ERR_IO, 0));
}

static void test_pread_resident(void **state) {
    (void)state;
    expect_ok_child(run_case(DSI_ACCESS_PREAD, DSI_MODEL_FLAG_RESIDENT, CH_TRUNC_ZERO_UNLINK, DSI_OK, 1));
    expect_ok_child(run_case(DSI_ACCESS_PREAD, DSI_MODEL_FLAG_RESIDENT | DSI_MODEL_FLAG_VERIFY_FILE,
                             CH_OVERWRITE, DSI_OK, 1));
}

static void test_flag_combinations(void **state) {
    (void)state;
    dsi_context *ctx = NULL;
    assert_int_equal(dsi_context_create(NULL, &ctx), DSI_OK);
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    dsi_model *m = NULL;
    mo.flags = DSI_MODEL_FLAG_RESIDENT; /* with MMAP: a mapping is not owned memory */
    assert_int_equal(dsi_model_load(ctx, model_src, &mo, &m), DSI_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsi_last_error(), "DSI_ACCESS_PREAD"));
    mo.flags = 1u << 9;
    assert_int_equal(dsi_model_load(ctx, model_src, &mo, &m), DSI_ERR_INVALID_ARGUMENT);
    dsi_reader r;
    dsi_reader_init(&r);
    mo.flags = DSI_MODEL_FLAG_VERIFY_FILE; /* a reader has no file to verify */
    assert_int_equal(dsi_model_load_from_reader(ctx, &r, &mo, &m), DSI_ERR_INVALID_ARGUMENT);
    assert_null(m);
    dsi_context_free(ctx);
}

int main(void) {
    model_src = apiu_model_path("tiny-v41.gguf");
    if (!model_src) {
        return dsit_absent("MODELS", "the tiny model tiny-v41.gguf is not built (DSI_MODELS_DIR)");
    }
    const char *d = apiu_tmpdir();
    if (!d) return 1;
    snprintf(dir, sizeof dir, "%s", d);
    /* every case forks: this process never starts threads of its own */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mmap_truncated_is_fatal),
        cmocka_unit_test(test_mmap_verify),
        cmocka_unit_test(test_pread_lazy_rows),
        cmocka_unit_test(test_pread_verify),
        cmocka_unit_test(test_pread_resident),
        cmocka_unit_test(test_flag_combinations),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    apiu_rmdir(dir);
    return rc;
}
