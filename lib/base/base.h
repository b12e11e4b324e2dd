/*
 * Internal base layer: error records, logging, allocation through the context's hooks.
 * Every internal module uses these; none of it is exported (symbols use the dsii_ prefix
 * and hidden visibility).
 */
#ifndef DSI_BASE_H
#define DSI_BASE_H

#include "dsinfer.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define DSII_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DSII_PRINTF(a, b)
#endif

#define DSII_ERROR_MSG_MAX 512

/* An error record filled by internal functions and copied into a handle's last error by
 * the API layer. Functions that fail return the status they store here. */
typedef struct dsii_error {
    dsi_status status;
    char msg[DSII_ERROR_MSG_MAX];
} dsii_error;

/* Records status + formatted message in `e` (may be NULL) and returns `status`. */
dsi_status dsii_fail(dsii_error *e, dsi_status status, const char *fmt, ...) DSII_PRINTF(3, 4);
/* Clears `e` (status DSI_OK, empty message). */
void dsii_error_clear(dsii_error *e);

/* Thread-local last error (dsi_last_error()). */
void dsii_set_thread_error(const char *msg);
dsi_status dsii_thread_fail(dsi_status status, const char *fmt, ...) DSII_PRINTF(2, 3);

/* ---- allocation ---------------------------------------------------------------------- */
/* All host memory the library owns goes through these. `ctx` may be NULL (tools, unit
 * tests): then the C library allocator is used. Sizes of 0 return a unique non-NULL
 * pointer-like allocation of 1 byte. */
void *dsii_malloc(const dsi_context *ctx, size_t size);
void *dsii_calloc(const dsi_context *ctx, size_t n, size_t size); /* overflow-checked */
void *dsii_realloc(const dsi_context *ctx, void *ptr, size_t size);
void dsii_free(const dsi_context *ctx, void *ptr);
/* Aligned allocation (alignment a power of two, <= 4096), freed with dsii_free_aligned. */
void *dsii_malloc_aligned(const dsi_context *ctx, size_t size, size_t alignment);
void dsii_free_aligned(const dsi_context *ctx, void *ptr);
char *dsii_strdup(const dsi_context *ctx, const char *s);

/* Large long-lived buffers (the resident weights of a PREAD / reader model, the expert
 * cache of lib/place). With the C library's allocator on Linux, a buffer of at least
 * DSII_BIGBUF_HUGE bytes is an anonymous mapping aligned to 2 MiB with MADV_HUGEPAGE, so
 * the kernel backs it with transparent huge pages where its policy allows ("always" or
 * "madvise" in /sys/kernel/mm/transparent_hugepage/enabled): the CPU kernels then stream
 * weights without a page walk every 4 KiB (docs/performance.md 4.000000000: the routed
 * experts of bench-v41-q8 decode ≈ 25 % faster). With the context's own allocator hooks,
 * or smaller, or elsewhere (DSII_BIGBUF_MAPS 0): dsii_malloc_aligned (alignment <= 4096). Freed with
 * dsii_bigbuf_free (b->p NULL: nothing). */
#define DSII_BIGBUF_HUGE ((size_t)2 << 20)
/* 1 where large buffers are mappings: Linux, except AddressSanitizer builds, which keep
 * them in the allocator so that an out-of-bounds weight read is still reported. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DSII_ASAN_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define DSII_ASAN_BUILD 1
#endif
#if defined(__linux__) && !defined(DSII_ASAN_BUILD)
#define DSII_BIGBUF_MAPS 1
#else
#define DSII_BIGBUF_MAPS 0
#endif
typedef struct dsii_bigbuf {
    void *p;
    size_t map_size; /* > 0: p is an mmap of this many bytes; 0: from dsii_malloc_aligned */
} dsii_bigbuf;
/* Returns 0 (b->p NULL) when the memory cannot be had. */
int dsii_bigbuf_alloc(const dsi_context *ctx, size_t size, size_t alignment, dsii_bigbuf *b);
void dsii_bigbuf_free(const dsi_context *ctx, dsii_bigbuf *b);

/* Overflow-safe size arithmetic: return 0 on overflow, 1 on success. */
static inline int dsii_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}
static inline int dsii_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
static inline int dsii_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}
static inline int dsii_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return 0;
    *out = a + b;
    return 1;
}

/* ---- sorting ------------------------------------------------------------------------- */
/* In-place heap sort of n elements of `size` bytes: O(n log n), no recursion and — unlike the
 * C library's qsort, which may malloc a merge buffer — no allocation, so nothing escapes the
 * context's allocator hooks. Not stable: give `cmp` a tie-break where order matters. `cmp`
 * receives `user` as its third argument. */
void dsii_sort(void *base, size_t n, size_t size,
               int (*cmp)(const void *a, const void *b, void *user), void *user);

/* ---- logging ------------------------------------------------------------------------- */
/* Delivers a message to the context's log callback if its level passes; `ctx` may be NULL
 * (then nothing happens). Never prints. */
void dsii_log(const dsi_context *ctx, int32_t level, const char *fmt, ...) DSII_PRINTF(3, 4);
void dsii_logv(const dsi_context *ctx, int32_t level, const char *fmt, va_list ap);

/* ---- misc ---------------------------------------------------------------------------- */
/* Monotonic clock in nanoseconds. */
uint64_t dsii_time_ns(void);
/* Number of online CPUs (>= 1). */
int32_t dsii_cpu_count(void);

/* ---- step profile (dsinfer-bench) ------------------------------------------------------
 * Wall time per named op of a forward step. The forward passes wrap every backend call in
 * DSII_PROF_BEGIN / DSII_PROF_END with the call's static name ("matmul q_a", "attn_sink",
 * ...); the exec installs the model's profile as the stepping thread's current one for the
 * duration of a step (dsii_exec_step) when one is attached (dsii_exec_set_profile). With no
 * profile attached the cost is one thread-local load per op. On the CPU ops run when they
 * are issued, so the figures are the ops' own times; on GPU backends they are record times.
 * A profile is filled by one stepping thread at a time (the caller serialises steps). */
#define DSII_PROF_MAX 160
typedef struct dsii_prof_entry {
    const char *name;      /* static string (pointer compared first, then contents) */
    uint64_t ns, calls;
} dsii_prof_entry;
typedef struct dsii_prof {
    dsii_prof_entry e[DSII_PROF_MAX];
    uint32_t n;
    uint64_t dropped;      /* calls whose name did not fit */
    uint64_t steps, step_ns, rows; /* steps, their wall time, their rows */
} dsii_prof;
#ifdef __cplusplus /* C++ hosts of this header (the CUDA module's host-side tests) */
extern thread_local dsii_prof *dsii_prof_cur;
#else
extern _Thread_local dsii_prof *dsii_prof_cur;
#endif
static inline uint64_t dsii_prof_begin(void) { return dsii_prof_cur ? dsii_time_ns() : 0; }
/* Adds now − t0 to `name` of the current profile (nothing when t0 is 0). */
void dsii_prof_end(uint64_t t0, const char *name);
#define DSII_PROF_BEGIN() uint64_t dsii_prof_t0_ = dsii_prof_begin()
#define DSII_PROF_END(name) dsii_prof_end(dsii_prof_t0_, (name))

/* Reads the options struct a caller passed, honouring its struct_size: copies the covered
 * prefix over `defaults_and_out` (which holds the defaults on entry). Returns
 * DSI_ERR_INVALID_ARGUMENT (recorded in `e`) if `src` is non-NULL and its struct_size is 0,
 * smaller than 4, or larger than `full_size`. `what` names the struct in the message. */
dsi_status dsii_read_options(void *defaults_and_out, size_t full_size, const void *src,
                             const char *what, dsii_error *e);

/* True if a struct of declared size `struct_size` covers the field ending at `field_end`
 * (use DSII_FIELD_END(type, field)). */
#define DSII_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

#endif /* DSI_BASE_H */
