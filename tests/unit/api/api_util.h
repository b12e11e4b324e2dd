/*
 * Shared helpers of the public-API contract tests in tests/unit/api (public API only):
 * the build's tiny model, counting allocator hooks and bounded child processes.
 */
#ifndef DSI_TESTS_API_UTIL_H
#define DSI_TESTS_API_UTIL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsinfer.h"

/* Path of a model the build generates ($DSI_MODELS_DIR/<name>) in a static buffer, or NULL
 * (with a note on stdout) when it was not built. */
const char *apiu_model_path(const char *name);

/* Opens the tiny model on a new context with `n_threads` CPU threads (0 = default); *path
 * (may be NULL) receives its path. Returns 0, or the exit status for main: 77 (skip, with a
 * note) when the model is not built, 1 (with the message) when it does not load. */
int apiu_open_tiny(int32_t n_threads, dsi_context **ctx, dsi_model **model, const char **path);

/* Allocator hooks that count: every block carries a header with its size; `live` and
 * `bytes` follow the blocks currently allocated, `calls` every malloc/realloc. */
typedef struct apiu_alloc_stats {
    atomic_long live;
    atomic_long calls;
    atomic_long frees;
} apiu_alloc_stats;
void *apiu_malloc(size_t size, void *user);
void *apiu_realloc(void *p, size_t size, void *user);
void apiu_free(void *p, void *user);
/* Context options with the counting hooks installed (stats zeroed). */
void apiu_hooked_options(dsi_context_options *opt, apiu_alloc_stats *stats);

/* Runs fn(arg) in a forked child (which exits with fn's return value) and waits at most
 * `timeout_s` seconds. Returns the wait status, or -1 if the child had to be killed because
 * it did not finish in time. Call it only while the process has a single thread (no context
 * alive): the child creates its own. */
int apiu_run_child(int (*fn)(void *arg), void *arg, double timeout_s);

/* Copies a file (for tests that modify their model). 0 on success. */
int apiu_copy_file(const char *from, const char *to);

/* A fresh directory under $TMPDIR (or /tmp), removed by apiu_rmdir. Static buffer. */
const char *apiu_tmpdir(void);
void apiu_rmdir(const char *dir);

#endif
