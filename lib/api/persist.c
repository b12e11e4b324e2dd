/*
 * Persistence (include/dsinfer.h "Experimental: snapshots and the prompt cache";
 * docs/snapshots.md): session snapshots to a writer / buffer / file and back, and the disk
 * prefix cache dsi_session_sync consults.
 *
 * Snapshot loads are validate-then-apply (lib/kv/snapshot.h): the whole image is read into
 * host memory and checked — checksums, model fingerprint, flags, layout, sizes, token ids —
 * before the session is touched; any failure leaves the session exactly as it was. Only a
 * device failure while the rows are written can lose the timeline (it is then forgotten,
 * never half-used).
 *
 * Prefix cache: one file per cached prefix, `<32 hex digits>.dsic` (a snapshot without
 * logits), named by XXH3-128 of the model identity and the prefix's token ids; prefixes are
 * cached at multiples of chunk_tokens. Writes go to a private temporary name in the same
 * directory, are fsynced, renamed into place and the directory fsynced: a reader sees a
 * complete file or none. Every read is fully validated anyway (a torn or corrupt file is
 * deleted and ignored). Sharing between processes is lock-free by construction: names are
 * unique per writer until the atomic rename, two writers of one prefix write equal content,
 * a reader keeps an evicted file's inode open, and every unlink tolerates ENOENT. LRU: a hit
 * touches the file's mtime; after a write the oldest files go until the directory is under
 * max_bytes. Temporary files of dead writers (pid gone, or older than an hour) are removed.
 */
#define _GNU_SOURCE /* O_CLOEXEC, utimensat, gettid-free pid naming */
#define DSI_EXPERIMENTAL
#include "api/session_impl.h"
#include "base/context_impl.h"
#include "kv/snapshot.h"
#include "model/model.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define DSII_PCACHE_DEFAULT_CHUNK 256u
#define DSII_PCACHE_DEFAULT_MAX (4ull << 30)
#define DSII_PCACHE_EXT ".dsic"
#define DSII_PCACHE_TMP ".dsic-tmp-"

/* ---- identity ------------------------------------------------------------------------------- */

static void model_fingerprint(const dsi_model *m, uint8_t out[16]) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    static const char tag[] = "libdsinfer-snapshot-fingerprint-v1";
    XXH3_128bits_update(&st, tag, sizeof tag);
    XXH3_128bits_update(&st, m->fingerprint, sizeof m->fingerprint);
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const dsii_tensor *t = &m->tensors[i];
        uint64_t d[2] = {t->file_offset, t->nbytes};
        XXH3_128bits_update(&st, d, sizeof d);
        if (t->data && t->nbytes && !t->is_view) {
            size_t k = t->nbytes < 64 ? (size_t)t->nbytes : 64;
            XXH3_128bits_update(&st, t->data, k);
            XXH3_128bits_update(&st, (const uint8_t *)t->data + t->nbytes - k, k);
        }
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(h.low64 >> (8 * i));
        out[8 + i] = (uint8_t)(h.high64 >> (8 * i));
    }
}

static void session_ident(const dsi_session *s, dsii_snap_ident *id) {
    memset(id, 0, sizeof *id);
    model_fingerprint(s->model, id->fingerprint);
    id->arch = (uint32_t)s->model->hp.arch;
    id->n_vocab = (uint32_t)s->n_vocab;
    id->state_flags = s->params.flags & DSI_SESSION_FLAG_NO_FAKE_QUANT;
}

static void session_target(const dsi_session *s, dsii_snap_target *t) {
    session_ident(s, &t->id);
    t->n_ctx = s->params.n_ctx;
    t->layout = dsii_kv_pool_layout(s->seq.pool);
}

/* The snapshot source for the prefix of L tokens of s (L <= n_tokens, within the margin). */
static void session_src(const dsi_session *s, uint32_t L, dsii_snap_src *src) {
    memset(src, 0, sizeof *src);
    session_ident(s, &src->id);
    src->margin = dsii_kv_pool_layout(s->seq.pool)->margin;
    src->backend = dsi_context_backend(s->model->ctx);
    src->tokens = s->tokens;
    src->n_tokens = L;
    src->logits = (L == s->n_tokens && s->has_logits) ? s->logits : NULL;
    src->pool = s->seq.pool;
    src->slot = s->seq.slot;
    src->cur = s->n_tokens;
}

static dsi_status fail_e(dsi_session *s, const dsii_error *e) {
    return dsii_session_fail(s, e->status, "%s", e->msg);
}

/* ---- saving --------------------------------------------------------------------------------- */

static dsi_status check_save(dsi_session *s, const char *fn) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
    if (s->n_tokens == 0)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "%s: the session holds no tokens", fn);
    return DSI_OK;
}

DSI_API dsi_status dsi_session_save(dsi_session *s, dsi_write_fn write, void *user_data,
                                    uint64_t *n_written) {
    if (n_written) *n_written = 0;
    dsi_status st = check_save(s, "dsi_session_save");
    if (st != DSI_OK) return st;
    if (!write) return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_save: write is NULL");
    dsii_snap_src src;
    session_src(s, s->n_tokens, &src);
    dsii_error e;
    dsii_error_clear(&e);
    st = dsii_snap_write(&src, (dsii_snap_write_fn)write, user_data, n_written, &e);
    return st == DSI_OK ? DSI_OK : fail_e(s, &e);
}

typedef struct membuf {
    uint8_t *p;
    size_t cap, n;
} membuf;

static int32_t mem_write(void *ud, const void *data, size_t n) {
    membuf *m = ud;
    if (n > m->cap - m->n) return 1;
    memcpy(m->p + m->n, data, n);
    m->n += n;
    return 0;
}

DSI_API dsi_status dsi_session_save_buffer(dsi_session *s, void *buf, size_t cap,
                                           size_t *n_needed) {
    if (n_needed) *n_needed = 0;
    dsi_status st = check_save(s, "dsi_session_save_buffer");
    if (st != DSI_OK) return st;
    if (!n_needed)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_save_buffer: n_needed is NULL");
    dsii_snap_src src;
    session_src(s, s->n_tokens, &src);
    dsii_error e;
    dsii_error_clear(&e);
    uint64_t total = 0;
    if (dsii_snap_size(&src, &total, &e) != DSI_OK) return fail_e(s, &e);
    if (total > SIZE_MAX)
        return dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "dsi_session_save_buffer: too large");
    *n_needed = (size_t)total;
    if (!buf && cap == 0) return DSI_OK; /* size query */
    if (!buf || cap < total)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_session_save_buffer: %s (%zu bytes needed, capacity %zu)",
                                 !buf ? "buf is NULL" : "buffer too small", (size_t)total, cap);
    membuf m = {buf, cap, 0};
    st = dsii_snap_write(&src, mem_write, &m, NULL, &e);
    return st == DSI_OK ? DSI_OK : fail_e(s, &e);
}

typedef struct fdw {
    int fd;
    int err;
} fdw;

static int32_t fd_write(void *ud, const void *data, size_t n) {
    fdw *w = ud;
    const uint8_t *p = data;
    while (n) {
        ssize_t k = write(w->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            w->err = k < 0 ? errno : ENOSPC;
            return 1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Directory part of path into dir (".", when none). */
static void dir_of(const char *path, char *dir, size_t cap) {
    const char *sl = strrchr(path, '/');
    if (!sl) {
        snprintf(dir, cap, ".");
        return;
    }
    size_t n = (size_t)(sl - path);
    if (n == 0) n = 1; /* "/file" */
    if (n >= cap) n = cap - 1;
    memcpy(dir, path, n);
    dir[n] = 0;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static atomic_uint g_tmp_counter;

/* Writes the snapshot of the first L tokens of s to `path` atomically: a temporary file
 * beside it, fsync, rename, fsync of the directory. On failure nothing is left behind and
 * an existing file at `path` is unchanged. Test hook: the crash test kills the process in
 * the middle of this. */
static dsi_status write_atomic(dsi_session *s, uint32_t L, const char *path, uint64_t *bytes,
                               dsii_error *e) {
    char dir[4096], tmp[4200];
    dir_of(path, dir, sizeof dir);
    unsigned c = atomic_fetch_add(&g_tmp_counter, 1u);
    snprintf(tmp, sizeof tmp, "%s/" DSII_PCACHE_TMP "%ld-%u-%lx", dir, (long)getpid(), c,
             (unsigned long)time(NULL));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return dsii_fail(e, DSI_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    dsii_snap_src src;
    session_src(s, L, &src);
    fdw w = {fd, 0};
    dsi_status st = dsii_snap_write(&src, fd_write, &w, bytes, e);
    if (st == DSI_OK && fsync(fd) != 0)
        st = dsii_fail(e, DSI_ERR_IO, "fsync '%s': %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == DSI_OK)
        st = dsii_fail(e, DSI_ERR_IO, "close '%s': %s", tmp, strerror(errno));
    if (st == DSI_OK && rename(tmp, path) != 0)
        st = dsii_fail(e, DSI_ERR_IO, "rename to '%s': %s", path, strerror(errno));
    if (st != DSI_OK) {
        if (w.err && e->status == DSI_ERR_IO)
            dsii_fail(e, DSI_ERR_IO, "writing '%s': %s", path, strerror(w.err));
        unlink(tmp);
        return st;
    }
    fsync_dir(dir);
    return DSI_OK;
}

DSI_API dsi_status dsi_session_save_file(dsi_session *s, const char *path) {
    dsi_status st = check_save(s, "dsi_session_save_file");
    if (st != DSI_OK) return st;
    if (!path || !path[0])
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_save_file: path is %s",
                                 !path ? "NULL" : "empty");
    dsii_error e;
    dsii_error_clear(&e);
    st = write_atomic(s, s->n_tokens, path, NULL, &e);
    return st == DSI_OK ? DSI_OK : fail_e(s, &e);
}

/* ---- loading -------------------------------------------------------------------------------- */

/* Applies a complete image; on any validation failure the session is unchanged. When
 * `want` is not NULL the image's tokens must equal want[0 .. n_tokens) (prefix cache). */
static dsi_status load_image(dsi_session *s, const uint8_t *buf, size_t n, const dsi_token *want,
                             uint32_t want_n, dsii_error *e) {
    dsii_snap_target t;
    session_target(s, &t);
    dsii_snap_view v;
    dsi_status st = dsii_snap_validate(buf, n, &t, s->n_vocab, &v, e);
    if (st != DSI_OK) return st;
    if (want) {
        if (v.n_tokens != want_n) return dsii_fail(e, DSI_ERR_STATE_MISMATCH, "cache entry length differs");
        for (uint32_t i = 0; i < want_n; i++)
            if ((int32_t)((uint32_t)v.tokens[4 * i] | (uint32_t)v.tokens[4 * i + 1] << 8 |
                          (uint32_t)v.tokens[4 * i + 2] << 16 | (uint32_t)v.tokens[4 * i + 3] << 24) !=
                want[i])
                return dsii_fail(e, DSI_ERR_STATE_MISMATCH, "cache entry holds other tokens");
    }
    /* lazy state (lib/kv): room for the image's rows before anything is written */
    st = dsii_kv_pool_reserve(s->seq.pool, v.n_tokens, e);
    if (st != DSI_OK) return st;
    /* --- validated: from here on the session changes --- */
    uint32_t ef = 0;
    st = dsii_snap_apply(&v, s->seq.pool, s->seq.slot, &ef, e);
    if (st != DSI_OK) {
        /* a device failure half-way: the state no longer matches any timeline */
        s->n_tokens = 0;
        s->has_logits = 0;
        s->exact_from = 0;
        dsii_spec_rewound(s->spec, 0);
        return st;
    }
    dsii_snap_tokens(&v, s->tokens);
    s->n_tokens = v.n_tokens;
    s->exact_from = ef;
    /* the drafter's host-side bookkeeping (V4: which MTP ring rows are valid) describes the
     * old timeline: rebuild its rows from the restored state when it next drafts */
    dsii_spec_rewound(s->spec, 0);
    if (v.has_logits) {
        dsii_snap_logits(&v, (uint32_t)s->n_vocab, s->logits);
        s->has_logits = 1;
    } else {
        s->has_logits = 0;
    }
    return DSI_OK;
}

static dsi_status check_load(dsi_session *s, const char *fn) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
    dsii_session_begin_call(s);
    return DSI_OK;
}

DSI_API dsi_status dsi_session_load_buffer(dsi_session *s, const void *buf, size_t size) {
    dsi_status st = check_load(s, "dsi_session_load_buffer");
    if (st != DSI_OK) return st;
    if (!buf)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_load_buffer: buf is NULL");
    dsii_error e;
    dsii_error_clear(&e);
    st = load_image(s, buf, size, NULL, 0, &e);
    return st == DSI_OK ? DSI_OK : fail_e(s, &e);
}

/* Reads a whole snapshot through `rd` (exact reads): the header first, its size checked
 * against what the session can take, then the rest. */
typedef int32_t (*read_exact_fn)(void *ud, void *data, size_t n);

static dsi_status read_image(dsi_session *s, read_exact_fn rd, void *ud, uint8_t **out,
                             size_t *out_n, dsii_error *e) {
    *out = NULL;
    *out_n = 0;
    uint8_t h[DSII_SNAP_HEADER_BYTES];
    if (rd(ud, h, 12) != 0)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot truncated: shorter than 12 bytes");
    dsii_snap_target t;
    session_target(s, &t);
    uint64_t total = 0;
    /* magic and version first (a future version may have another header) */
    dsi_status st = dsii_snap_check_header(h, 12, &t, &total, e);
    if (st != DSI_OK && !(st == DSI_ERR_BAD_FORMAT && memcmp(h, "DSISNAP", 7) == 0)) return st;
    if (rd(ud, h + 12, sizeof h - 12) != 0)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot truncated inside its header");
    st = dsii_snap_check_header(h, sizeof h, &t, &total, e);
    if (st != DSI_OK) return st;
    if (total > SIZE_MAX) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "snapshot too large");
    uint8_t *b = dsii_malloc(s->ctx, (size_t)total);
    if (!b) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "snapshot: out of host memory (%llu bytes)",
                             (unsigned long long)total);
    memcpy(b, h, sizeof h);
    if (rd(ud, b + sizeof h, (size_t)total - sizeof h) != 0) {
        dsii_free(s->ctx, b);
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot truncated: fewer than the %llu bytes its header names",
                         (unsigned long long)total);
    }
    *out = b;
    *out_n = (size_t)total;
    return DSI_OK;
}

typedef struct cbr {
    dsi_read_fn fn;
    void *ud;
} cbr;

static int32_t cb_read(void *ud, void *data, size_t n) {
    cbr *c = ud;
    return n ? c->fn(c->ud, data, n) : 0;
}

DSI_API dsi_status dsi_session_load(dsi_session *s, dsi_read_fn read, void *user_data) {
    dsi_status st = check_load(s, "dsi_session_load");
    if (st != DSI_OK) return st;
    if (!read) return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_load: read is NULL");
    dsii_error e;
    dsii_error_clear(&e);
    uint8_t *b = NULL;
    size_t n = 0;
    cbr c = {read, user_data};
    st = read_image(s, cb_read, &c, &b, &n, &e);
    if (st == DSI_OK) st = load_image(s, b, n, NULL, 0, &e);
    dsii_free(s->ctx, b);
    return st == DSI_OK ? DSI_OK : fail_e(s, &e);
}

typedef struct fdr {
    int fd;
} fdr;

static int32_t fd_read(void *ud, void *data, size_t n) {
    fdr *r = ud;
    uint8_t *p = data;
    while (n) {
        ssize_t k = read(r->fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads the file at path into a buffer; also checks nothing follows the snapshot. */
static dsi_status read_file_image(dsi_session *s, const char *path, uint8_t **b, size_t *n,
                                  dsii_error *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsii_fail(e, errno == ENOENT ? DSI_ERR_NOT_FOUND : DSI_ERR_IO, "cannot open '%s': %s",
                         path, strerror(errno));
    struct stat sb;
    dsi_status st = DSI_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = dsii_fail(e, DSI_ERR_IO, "'%s' is not a regular file", path);
    fdr r = {fd};
    if (st == DSI_OK) st = read_image(s, fd_read, &r, b, n, e);
    if (st == DSI_OK && (uint64_t)sb.st_size != (uint64_t)*n) {
        st = dsii_fail(e, DSI_ERR_BAD_FORMAT, "'%s': %lld bytes, the snapshot in it has %zu",
                       path, (long long)sb.st_size, *n);
        dsii_free(s->ctx, *b);
        *b = NULL;
    }
    close(fd);
    if (st != DSI_OK && e->status != DSI_ERR_NOT_FOUND && e->status != DSI_ERR_IO) {
        char m[DSII_ERROR_MSG_MAX];
        snprintf(m, sizeof m, "%s", e->msg);
        dsii_fail(e, st, "'%s': %s", path, m);
    }
    return st;
}

DSI_API dsi_status dsi_session_load_file(dsi_session *s, const char *path) {
    dsi_status st = check_load(s, "dsi_session_load_file");
    if (st != DSI_OK) return st;
    if (!path || !path[0])
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_load_file: path is %s",
                                 !path ? "NULL" : "empty");
    dsii_error e;
    dsii_error_clear(&e);
    uint8_t *b = NULL;
    size_t n = 0;
    st = read_file_image(s, path, &b, &n, &e);
    if (st == DSI_OK) st = load_image(s, b, n, NULL, 0, &e);
    dsii_free(s->ctx, b);
    return st == DSI_OK ? DSI_OK : fail_e(s, &e);
}

/* ---- the prefix cache ----------------------------------------------------------------------- */

struct dsii_pcache {
    char *dir;
    uint32_t chunk, min_tokens, flags;
    uint64_t max_bytes;
    dsi_prompt_cache_stats stats;
};

DSI_API void dsi_prompt_cache_options_init(dsi_prompt_cache_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = sizeof *opt;
}

DSI_API void dsi_prompt_cache_stats_init(dsi_prompt_cache_stats *st) {
    if (!st) return;
    memset(st, 0, sizeof *st);
    st->struct_size = sizeof *st;
}

void dsii_pcache_free(dsi_session *s) {
    if (!s || !s->pcache) return;
    dsii_free(s->ctx, s->pcache->dir);
    dsii_free(s->ctx, s->pcache);
    s->pcache = NULL;
}

DSI_API dsi_status dsi_session_set_prompt_cache(dsi_session *s, const dsi_prompt_cache_options *user) {
    if (!s) return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_set_prompt_cache: session is NULL");
    dsii_error e;
    dsii_error_clear(&e);
    dsi_prompt_cache_options o;
    dsi_prompt_cache_options_init(&o);
    if (user && dsii_read_options(&o, sizeof o, user, "dsi_prompt_cache_options", &e) != DSI_OK)
        return fail_e(s, &e);
    if (!o.dir) {
        dsii_pcache_free(s);
        return DSI_OK;
    }
    if (o.flags & ~(uint32_t)(DSI_PROMPT_CACHE_NO_WRITE | DSI_PROMPT_CACHE_NO_READ))
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT,
                                 "dsi_prompt_cache_options.flags has unknown bits 0x%x", o.flags);
    struct stat sb;
    if (!o.dir[0] || stat(o.dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dsii_session_fail(s, DSI_ERR_IO, "dsi_session_set_prompt_cache: '%s' is not a directory",
                                 o.dir);
    size_t dl = strlen(o.dir);
    if (dl > 3000)
        return dsii_session_fail(s, DSI_ERR_INVALID_ARGUMENT, "dsi_session_set_prompt_cache: path too long");
    struct dsii_pcache *pc = dsii_calloc(s->ctx, 1, sizeof *pc);
    char *dir = dsii_malloc(s->ctx, dl + 1);
    if (!pc || !dir) {
        dsii_free(s->ctx, pc);
        dsii_free(s->ctx, dir);
        return dsii_session_fail(s, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    memcpy(dir, o.dir, dl + 1);
    pc->dir = dir;
    pc->chunk = o.chunk_tokens ? o.chunk_tokens : DSII_PCACHE_DEFAULT_CHUNK;
    pc->min_tokens = o.min_tokens ? o.min_tokens : pc->chunk;
    pc->max_bytes = o.max_bytes ? o.max_bytes : DSII_PCACHE_DEFAULT_MAX;
    pc->flags = o.flags;
    dsi_prompt_cache_stats_init(&pc->stats);
    dsii_pcache_free(s);
    s->pcache = pc;
    return DSI_OK;
}

DSI_API dsi_status dsi_session_prompt_cache_stats(const dsi_session *s, dsi_prompt_cache_stats *out) {
    if (!s || !out)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT, "dsi_session_prompt_cache_stats: %s is NULL",
                                !s ? "session" : "out");
    if (out->struct_size < 8)
        return dsii_thread_fail(DSI_ERR_INVALID_ARGUMENT,
                                "dsi_session_prompt_cache_stats: struct_size %u too small", out->struct_size);
    dsi_prompt_cache_stats z;
    dsi_prompt_cache_stats_init(&z);
    const dsi_prompt_cache_stats *src = s->pcache ? &s->pcache->stats : &z;
    uint32_t n = out->struct_size < sizeof z ? out->struct_size : (uint32_t)sizeof z;
    uint32_t keep = out->struct_size;
    memcpy(out, src, n);
    out->struct_size = keep;
    return DSI_OK;
}

/* Entry path for the prefix tokens[0 .. B) whose hash state is `h` (fed the identity and
 * those tokens). */
static void entry_path(const struct dsii_pcache *pc, XXH3_state_t *h, char *out, size_t cap) {
    XXH128_hash_t d = XXH3_128bits_digest(h);
    snprintf(out, cap, "%s/%016llx%016llx" DSII_PCACHE_EXT, pc->dir, (unsigned long long)d.high64,
             (unsigned long long)d.low64);
}

static void hash_ident(XXH3_state_t *h, const dsi_session *s) {
    dsii_snap_ident id;
    session_ident(s, &id);
    static const char tag[] = "libdsinfer-prompt-cache-v1";
    uint32_t v = DSII_SNAP_VERSION;
    XXH3_128bits_reset(h);
    XXH3_128bits_update(h, tag, sizeof tag);
    XXH3_128bits_update(h, &v, sizeof v);
    XXH3_128bits_update(h, &id, sizeof id);
}

uint32_t dsii_pcache_restore(dsi_session *s, const dsi_token *tokens, uint32_t n, uint32_t keep) {
    struct dsii_pcache *pc = s->pcache;
    if (!pc || (pc->flags & DSI_PROMPT_CACHE_NO_READ) || n < 2) return keep;
    uint32_t top = ((n - 1) / pc->chunk) * pc->chunk; /* the last token is always evaluated */
    if (top <= keep || top < pc->min_tokens) return keep;
    uint32_t nb = top / pc->chunk;
    uint64_t t0 = now_ns();
    /* one pass over the tokens: the hash state at every boundary */
    XXH3_state_t *states = dsii_malloc(s->ctx, sizeof(XXH3_state_t) * (size_t)nb + 64);
    if (!states) return keep;
    XXH3_state_t *al = (XXH3_state_t *)(((uintptr_t)states + 63) & ~(uintptr_t)63);
    XXH3_state_t h;
    hash_ident(&h, s);
    for (uint32_t b = 0; b < nb; b++) {
        XXH3_128bits_update(&h, tokens + (size_t)b * pc->chunk, sizeof(dsi_token) * pc->chunk);
        memcpy(&al[b], &h, sizeof h);
    }
    uint32_t result = keep;
    int tried = 0;
    for (uint32_t b = nb; b-- > 0;) {
        uint32_t B = (b + 1) * pc->chunk;
        if (B <= keep || B < pc->min_tokens) break;
        char path[4200];
        entry_path(pc, &al[b], path, sizeof path);
        if (access(path, F_OK) != 0) continue;
        tried = 1;
        dsii_error e;
        dsii_error_clear(&e);
        uint8_t *buf = NULL;
        size_t len = 0;
        dsi_status st = read_file_image(s, path, &buf, &len, &e);
        if (st == DSI_OK) st = load_image(s, buf, len, tokens, B, &e);
        dsii_free(s->ctx, buf);
        if (st == DSI_OK) {
            utimensat(AT_FDCWD, path, NULL, 0); /* LRU: a hit is a use */
            pc->stats.hits++;
            pc->stats.tokens_restored += B - keep;
            result = B;
            break;
        }
        if (st == DSI_ERR_BAD_FORMAT) {
            /* corrupt or torn: never used, and removed so nobody reads it again */
            if (unlink(path) == 0) pc->stats.corrupt_removed++;
            dsii_log(s->ctx, DSI_LOG_WARN, "prompt cache: removed corrupt entry: %s", e.msg);
        } else if (s->n_tokens < keep) {
            /* a device failure while applying: the session forgot its timeline */
            result = 0;
            break;
        }
    }
    if (result == keep) pc->stats.misses++;
    (void)tried;
    dsii_free(s->ctx, states);
    pc->stats.read_ns += now_ns() - t0;
    return result;
}

typedef struct ent {
    char name[48];
    uint64_t size;
    struct timespec mtime;
} ent;

static int ent_older(const void *a, const void *b) {
    const ent *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Removes temporary files of dead writers and evicts the least recently used entries
 * until the directory holds at most max_bytes (the entry just written, `keep_name`, last). */
static void evict(dsi_session *s, const char *keep_name) {
    struct dsii_pcache *pc = s->pcache;
    DIR *d = opendir(pc->dir);
    if (!d) return;
    ent *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    struct dirent *de;
    char path[4200];
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        if (strncmp(nm, DSII_PCACHE_TMP, sizeof DSII_PCACHE_TMP - 1) == 0) {
            long pid = strtol(nm + sizeof DSII_PCACHE_TMP - 1, NULL, 10);
            snprintf(path, sizeof path, "%s/%s", pc->dir, nm);
            struct stat sb;
            int dead = pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
            if (dead || (stat(path, &sb) == 0 && now - sb.st_mtime > 3600)) unlink(path);
            continue;
        }
        if (l != 32 + sizeof DSII_PCACHE_EXT - 1 || strcmp(nm + 32, DSII_PCACHE_EXT) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", pc->dir, nm);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            ent *nv = dsii_realloc(s->ctx, v, sizeof *nv * nc);
            if (!nv) break;
            v = nv;
            cap = nc;
        }
        snprintf(v[n].name, sizeof v[n].name, "%s", nm);
        v[n].size = (uint64_t)sb.st_size;
        v[n].mtime = sb.st_mtim;
        if (keep_name && strcmp(nm, keep_name) == 0) v[n].mtime.tv_sec = (time_t)INT64_MAX / 2;
        total += v[n].size;
        n++;
    }
    closedir(d);
    if (total > pc->max_bytes && n) {
        qsort(v, n, sizeof *v, ent_older);
        for (size_t i = 0; i < n && total > pc->max_bytes; i++) {
            snprintf(path, sizeof path, "%s/%s", pc->dir, v[i].name);
            if (unlink(path) == 0) pc->stats.evictions++;
            total -= v[i].size; /* gone either way (another process may have removed it) */
        }
    }
    dsii_free(s->ctx, v);
}

void dsii_pcache_store(dsi_session *s) {
    struct dsii_pcache *pc = s->pcache;
    if (!pc || (pc->flags & DSI_PROMPT_CACHE_NO_WRITE)) return;
    /* the boundary a lookup of this very timeline (or any extension of it) uses: the last
     * token is always evaluated, so that is the last boundary <= n_tokens − 1 */
    if (s->n_tokens < 2) return;
    uint32_t B = ((s->n_tokens - 1) / pc->chunk) * pc->chunk;
    if (B == 0 || B < pc->min_tokens) return;
    /* the state at B is still exact when the timeline went at most the margin past it */
    if (s->n_tokens - B > s->margin || B < s->exact_from) return;
    XXH3_state_t h;
    hash_ident(&h, s);
    XXH3_128bits_update(&h, s->tokens, sizeof(dsi_token) * B);
    char path[4200];
    entry_path(pc, &h, path, sizeof path);
    if (access(path, F_OK) == 0) {
        utimensat(AT_FDCWD, path, NULL, 0);
        return;
    }
    dsii_error e;
    dsii_error_clear(&e);
    uint64_t bytes = 0, t0 = now_ns();
    if (write_atomic(s, B, path, &bytes, &e) != DSI_OK) {
        pc->stats.write_errors++;
        pc->stats.write_ns += now_ns() - t0;
        dsii_log(s->ctx, DSI_LOG_WARN, "prompt cache: %s", e.msg);
        return;
    }
    pc->stats.writes++;
    pc->stats.bytes_written += bytes;
    evict(s, strrchr(path, '/') + 1);
    pc->stats.write_ns += now_ns() - t0;
}
