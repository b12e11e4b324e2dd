/* Internal base layer: errors, thread-local last error, allocation hooks, logging. */
#define _GNU_SOURCE
#include "base/base.h"
#include "base/context_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* ---- errors -------------------------------------------------------------------------- */

dsi_status dsii_fail(dsii_error *e, dsi_status status, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        e->status = status;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

void dsii_error_clear(dsii_error *e) {
    if (e) {
        e->status = DSI_OK;
        e->msg[0] = '\0';
    }
}

static _Thread_local char g_thread_error[DSII_ERROR_MSG_MAX];

void dsii_set_thread_error(const char *msg) {
    snprintf(g_thread_error, sizeof g_thread_error, "%s", msg ? msg : "");
}

dsi_status dsii_thread_fail(dsi_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_thread_error, sizeof g_thread_error, fmt, ap);
    va_end(ap);
    return status;
}

/* Status strings live in lib/base so every module can use them without including lib/api. */
DSI_API const char *dsi_status_string(dsi_status status) {
    switch (status) {
    case DSI_OK: return "ok";
    case DSI_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DSI_ERR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case DSI_ERR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case DSI_ERR_IO: return "input/output error";
    case DSI_ERR_BAD_FORMAT: return "bad file format";
    case DSI_ERR_UNSUPPORTED: return "unsupported";
    case DSI_ERR_BACKEND: return "backend failure";
    case DSI_ERR_CANCELLED: return "cancelled";
    case DSI_ERR_CONTEXT_FULL: return "context full";
    case DSI_ERR_STATE_MISMATCH: return "state mismatch";
    case DSI_ERR_ABI_MISMATCH: return "ABI mismatch";
    case DSI_ERR_BUSY: return "busy";
    case DSI_ERR_NOT_FOUND: return "not found";
    case DSI_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

DSI_API const char *dsi_last_error(void) { return g_thread_error; }

/* ---- allocation ---------------------------------------------------------------------- */

void *dsii_malloc(const dsi_context *ctx, size_t size) {
    if (size == 0) size = 1;
    if (ctx && ctx->opt.malloc_fn) return ctx->opt.malloc_fn(size, ctx->opt.alloc_user_data);
    return malloc(size);
}

void *dsii_calloc(const dsi_context *ctx, size_t n, size_t size) {
    size_t total;
    if (!dsii_mul_size(n, size, &total)) return NULL;
    void *p = dsii_malloc(ctx, total);
    if (p) memset(p, 0, total ? total : 1);
    return p;
}

void *dsii_realloc(const dsi_context *ctx, void *ptr, size_t size) {
    if (size == 0) size = 1;
    if (ctx && ctx->opt.realloc_fn) return ctx->opt.realloc_fn(ptr, size, ctx->opt.alloc_user_data);
    return realloc(ptr, size);
}

void dsii_free(const dsi_context *ctx, void *ptr) {
    if (!ptr) return;
    if (ctx && ctx->opt.free_fn) {
        ctx->opt.free_fn(ptr, ctx->opt.alloc_user_data);
        return;
    }
    free(ptr);
}

/* Aligned blocks are carved out of a larger plain allocation; the original pointer is kept
 * just below the aligned address. */
void *dsii_malloc_aligned(const dsi_context *ctx, size_t size, size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096) return NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    size_t total;
    if (!dsii_add_size(size, alignment + sizeof(void *), &total)) return NULL;
    unsigned char *raw = dsii_malloc(ctx, total);
    if (!raw) return NULL;
    uintptr_t p = (uintptr_t)(raw + sizeof(void *));
    p = (p + alignment - 1) & ~(uintptr_t)(alignment - 1);
    memcpy((void *)(p - sizeof(void *)), &raw, sizeof raw);
    return (void *)p;
}

void dsii_free_aligned(const dsi_context *ctx, void *ptr) {
    if (!ptr) return;
    void *raw;
    memcpy(&raw, (unsigned char *)ptr - sizeof(void *), sizeof raw);
    dsii_free(ctx, raw);
}

/* ---- large buffers (base.h) ----------------------------------------------------------- */

int dsii_bigbuf_alloc(const dsi_context *ctx, size_t size, size_t alignment, dsii_bigbuf *b) {
    b->p = NULL;
    b->map_size = 0;
#if DSII_BIGBUF_MAPS && defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
    const int own_alloc = ctx && ctx->opt.malloc_fn;
    if (!own_alloc && size >= DSII_BIGBUF_HUGE && alignment <= DSII_BIGBUF_HUGE) {
        /* round up to whole huge pages, map one more to align the start, trim both ends */
        const size_t hp = DSII_BIGBUF_HUGE;
        size_t len, over;
        if (dsii_add_size(size, hp - 1, &len) && dsii_add_size(len & ~(hp - 1), hp, &over)) {
            len &= ~(hp - 1);
            uint8_t *raw = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (raw != MAP_FAILED) {
                uint8_t *p = (uint8_t *)(((uintptr_t)raw + hp - 1) & ~(uintptr_t)(hp - 1));
                const size_t head = (size_t)(p - raw), tail = over - head - len;
                if (head) munmap(raw, head);
                if (tail) munmap(p + len, tail);
                /* advice only: a kernel without THP refuses it and the pages stay 4 KiB */
                (void)madvise(p, len, MADV_HUGEPAGE);
                b->p = p;
                b->map_size = len;
                return 1;
            }
        }
        /* no mapping: the allocator below */
    }
#endif
    b->p = dsii_malloc_aligned(ctx, size, alignment);
    return b->p != NULL;
}

void dsii_bigbuf_free(const dsi_context *ctx, dsii_bigbuf *b) {
    if (!b || !b->p) return;
#if DSII_BIGBUF_MAPS && defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
    if (b->map_size) munmap(b->p, b->map_size);
    else
#endif
        dsii_free_aligned(ctx, b->p);
    b->p = NULL;
    b->map_size = 0;
}

char *dsii_strdup(const dsi_context *ctx, const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = dsii_malloc(ctx, n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- sorting ------------------------------------------------------------------------- */

static void swap_bytes(unsigned char *a, unsigned char *b, size_t size) {
    while (size--) {
        unsigned char t = *a;
        *a++ = *b;
        *b++ = t;
    }
}

/* Restores the max-heap property below `root` in base[0..n). */
static void sift_down(unsigned char *base, size_t root, size_t n, size_t size,
                      int (*cmp)(const void *, const void *, void *), void *user) {
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && cmp(base + child * size, base + (child + 1) * size, user) < 0) child++;
        if (cmp(base + root * size, base + child * size, user) >= 0) return;
        swap_bytes(base + root * size, base + child * size, size);
        root = child;
    }
}

void dsii_sort(void *base, size_t n, size_t size,
               int (*cmp)(const void *a, const void *b, void *user), void *user) {
    if (n < 2 || size == 0) return;
    unsigned char *b = base;
    for (size_t start = n / 2; start-- > 0;) sift_down(b, start, n, size, cmp, user);
    for (size_t end = n - 1; end > 0; end--) {
        swap_bytes(b, b + end * size, size);
        sift_down(b, 0, end, size, cmp, user);
    }
}

/* ---- logging ------------------------------------------------------------------------- */

void dsii_logv(const dsi_context *ctx, int32_t level, const char *fmt, va_list ap) {
    if (!ctx || !ctx->opt.log_fn || level < ctx->opt.log_level) return;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n > 0 && buf[n - 1] == '\n') buf[--n] = '\0';
    ctx->opt.log_fn(level, buf, ctx->opt.log_user_data);
}

void dsii_log(const dsi_context *ctx, int32_t level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dsii_logv(ctx, level, fmt, ap);
    va_end(ap);
}

/* ---- misc ---------------------------------------------------------------------------- */

uint64_t dsii_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

_Thread_local dsii_prof *dsii_prof_cur;

void dsii_prof_end(uint64_t t0, const char *name) {
    dsii_prof *p = dsii_prof_cur;
    if (!t0 || !p) return;
    uint64_t dt = dsii_time_ns() - t0;
    uint32_t i = 0;
    for (; i < p->n; i++)
        if (p->e[i].name == name) break;
    if (i == p->n)
        for (i = 0; i < p->n; i++)
            if (strcmp(p->e[i].name, name) == 0) break;
    if (i == p->n) {
        if (p->n == DSII_PROF_MAX) {
            p->dropped++;
            return;
        }
        p->e[p->n].name = name;
        p->e[p->n].ns = 0;
        p->e[p->n].calls = 0;
        p->n++;
    }
    p->e[i].ns += dt;
    p->e[i].calls++;
}

int32_t dsii_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 1024) n = 1024;
    return (int32_t)n;
}

dsi_status dsii_read_options(void *defaults_and_out, size_t full_size, const void *src,
                             const char *what, dsii_error *e) {
    if (!src) return DSI_OK;
    uint32_t declared;
    memcpy(&declared, src, sizeof declared);
    if (declared < sizeof(uint32_t) || declared > full_size) {
        return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                         "%s.struct_size is %u; expected between %zu and %zu "
                         "(initialise the struct with its *_init function)",
                         what, declared, sizeof(uint32_t), full_size);
    }
    memcpy(defaults_and_out, src, declared);
    /* The effective struct describes the full current layout. */
    uint32_t full = (uint32_t)full_size;
    memcpy(defaults_and_out, &full, sizeof full);
    return DSI_OK;
}
