/*
 * No path may hang the library (docs/api.md "Files"): dsi_model_load on a FIFO, a character
 * device or a directory returns DSI_ERR_IO naming the kind of file, at once, in both access
 * modes — and so does `dsinfer-cli -m FIFO`. Each attempt runs in a child process that is
 * killed after a bounded wait: the old code sat in open(2) on the FIFO forever (the wait
 * then fails the test instead of hanging it).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "tests/common/skip.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api_util.h"

#define BOUND_S 60.0 /* generous for sanitizer builds on a loaded machine; a pass takes ms */

static const char *dir;
static char fifo[4200];

typedef struct {
    const char *path;
    int32_t access;
    const char *expect; /* substring of the message */
} load_case;

/* Child: 0 when the load failed with DSI_ERR_IO and the expected message. */
static int child_load(void *arg) {
    const load_case *c = arg;
    dsi_context *ctx = NULL;
    if (dsi_context_create(NULL, &ctx) != DSI_OK) return 10;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    mo.access = c->access;
    dsi_model *m = NULL;
    dsi_status st = dsi_model_load(ctx, c->path, &mo, &m);
    int rc = 0;
    if (st != DSI_ERR_IO || m != NULL) {
        printf("child: load of %s returned %d\n", c->path, (int)st);
        rc = 11;
    } else if (!strstr(dsi_last_error(), c->expect) ||
               !strstr(dsi_context_last_error(ctx), c->expect)) {
        printf("child: message '%s' lacks '%s'\n", dsi_last_error(), c->expect);
        rc = 12;
    }
    dsi_model_free(m);
    dsi_context_free(ctx);
    return rc;
}

static void expect_refused(const char *path, const char *expect) {
    for (int32_t access = DSI_ACCESS_MMAP; access <= DSI_ACCESS_PREAD; access++) {
        load_case c = {path, access, expect};
        int status = apiu_run_child(child_load, &c, BOUND_S);
        if (status == -1) fail_msg("dsi_model_load(%s, access %d) did not return within %.0f s", path, (int)access, BOUND_S);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

static void test_fifo(void **state) {
    (void)state;
    expect_refused(fifo, "FIFO");
}

static void test_other_special_files(void **state) {
    (void)state;
    expect_refused("/dev/null", "character device");
    expect_refused(dir, "directory");
}

/* The CLI goes through the same load: one line on stderr, exit status 1, no hang. */
static char cli[4200];

static int child_cli(void *arg) {
    (void)arg;
    char errf[4300];
    snprintf(errf, sizeof errf, "%s/cli.err", dir);
    int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int nul = open("/dev/null", O_RDWR);
    if (fd < 0 || nul < 0) return 20;
    dup2(nul, 0);
    dup2(nul, 1);
    dup2(fd, 2);
    char *argv[] = {cli, "-m", fifo, "-p", "hello", "-n", "1", NULL};
    execv(cli, argv);
    return 21;
}

static void test_cli_fifo(void **state) {
    (void)state;
    const char *bld = getenv("DSI_BUILD_DIR");
    snprintf(cli, sizeof cli, "%s/bin/dsinfer-cli", bld ? bld : ".");
    if (access(cli, X_OK) != 0) snprintf(cli, sizeof cli, "%s/examples/cli/dsinfer-cli", bld ? bld : ".");
    if (access(cli, X_OK) != 0) {
        DSIT_SKIP_TEST("MODELS", "dsinfer-cli is not built in this configuration");
    }
    int status = apiu_run_child(child_cli, NULL, BOUND_S);
    if (status == -1) fail_msg("dsinfer-cli -m FIFO did not exit within %.0f s", BOUND_S);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    char errf[4300], text[4096] = {0};
    snprintf(errf, sizeof errf, "%s/cli.err", dir);
    FILE *f = fopen(errf, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    assert_non_null(strstr(text, "FIFO"));
}

int main(void) {
    dir = apiu_tmpdir();
    if (!dir) return 1;
    snprintf(fifo, sizeof fifo, "%s/model.gguf", dir);
    if (mkfifo(fifo, 0600) != 0) {
        perror("mkfifo");
        apiu_rmdir(dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_other_special_files),
        cmocka_unit_test(test_cli_fifo),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    apiu_rmdir(dir);
    return rc;
}
