/*
 * Internal file access (see file.h): mmap, pread, reader callbacks, borrowed memory.
 */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#endif

#include "base/file.h"

#include <errno.h>
#include <string.h>

#if !defined(_WIN32)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

struct dsii_file {
    const dsi_context *ctx;
    int32_t mode;
    uint64_t size;
    int fd;                 /* PREAD / MMAP (closed right after mapping in MMAP mode) */
    const uint8_t *base;    /* MMAP / MEMORY */
    size_t map_len;         /* MMAP: length passed to munmap */
    dsi_reader reader;      /* READER */
    char *name;             /* owned path copy, or NULL for the fixed names */
    int verify;             /* DSII_FILE_VERIFY: compare with the stat below (fd kept open) */
    int released;           /* dsii_file_release was called */
    uint64_t v_size;        /* st_size at open */
    int64_t v_mtime_s, v_mtime_ns; /* st_mtim at open */
};

const char *dsii_file_name(const dsii_file *f) {
    if (!f) return "<null>";
    if (f->name) return f->name;
    return f->mode == DSII_FILE_READER ? "<reader>" : "<memory>";
}

static dsii_file *file_new(const dsi_context *ctx, int32_t mode) {
    dsii_file *f = dsii_calloc(ctx, 1, sizeof *f);
    if (!f) return NULL;
    f->ctx = ctx;
    f->mode = mode;
    f->fd = -1;
    return f;
}

#if !defined(_WIN32)
static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    return "a special file";
}
#endif

dsi_status dsii_file_open(const dsi_context *ctx, const char *path, int32_t mode,
                          dsii_file **out, dsii_error *err) {
    return dsii_file_open_ex(ctx, path, mode, 0, out, err);
}

#if defined(_WIN32)
dsi_status dsii_file_open_ex(const dsi_context *ctx, const char *path, int32_t mode,
                             uint32_t flags, dsii_file **out, dsii_error *err) {
    (void)ctx;
    (void)mode;
    (void)flags;
    if (out) *out = NULL;
    return dsii_fail(err, DSI_ERR_UNSUPPORTED, "cannot open '%s': path access not built",
                     path ? path : "(null)");
}
#else
dsi_status dsii_file_open_ex(const dsi_context *ctx, const char *path, int32_t mode,
                             uint32_t flags, dsii_file **out, dsii_error *err) {
    if (!out) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsii_file_open: out is NULL");
    *out = NULL;
    if (!path) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "model path is NULL");
    if (mode != DSII_FILE_MMAP && mode != DSII_FILE_PREAD)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "bad file access mode %d", (int)mode);

    /* No path may block the caller: a FIFO (or a device) blocks in open(2) until a writer
     * appears. So stat first and refuse anything but a regular file or a block device, then
     * open with O_NONBLOCK (if the path was swapped for a FIFO in between, the open still
     * returns at once) and check that the descriptor is the file that was stat'ed. */
    struct stat st;
    if (stat(path, &st) != 0)
        return dsii_fail(err, DSI_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
        return dsii_fail(err, DSI_ERR_IO, "'%s' is not a regular file (%s)", path, file_kind(st.st_mode));
    int fd;
    do {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return dsii_fail(err, DSI_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st2;
    if (fstat(fd, &st2) != 0) {
        int e = errno;
        close(fd);
        return dsii_fail(err, DSI_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if ((!S_ISREG(st2.st_mode) && !S_ISBLK(st2.st_mode)) || st2.st_dev != st.st_dev ||
        st2.st_ino != st.st_ino) {
        close(fd);
        return dsii_fail(err, DSI_ERR_IO, "'%s' was replaced while it was being opened", path);
    }
    st = st2;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* plain blocking reads from here */
    uint64_t size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    if (S_ISBLK(st.st_mode)) {
        off_t end = lseek(fd, 0, SEEK_END);
        size = end > 0 ? (uint64_t)end : 0;
    }

    dsii_file *f = file_new(ctx, mode);
    char *name = f ? dsii_strdup(ctx, path) : NULL;
    if (!f || !name) {
        dsii_free(ctx, f);
        close(fd);
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory opening '%s'", path);
    }
    f->name = name;
    f->size = size;
    if (flags & DSII_FILE_VERIFY) {
        f->verify = 1;
        f->v_size = (uint64_t)st.st_size;
        f->v_mtime_s = (int64_t)st.st_mtim.tv_sec;
        f->v_mtime_ns = (int64_t)st.st_mtim.tv_nsec;
    }

    if (mode == DSII_FILE_MMAP && size > 0) {
        if (size > (uint64_t)SIZE_MAX) {
            dsii_free(ctx, name);
            dsii_free(ctx, f);
            close(fd);
            return dsii_fail(err, DSI_ERR_IO, "'%s' (%llu bytes) is too large to map", path,
                             (unsigned long long)size);
        }
        void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            dsii_free(ctx, name);
            dsii_free(ctx, f);
            close(fd);
            return dsii_fail(err, DSI_ERR_IO, "cannot map '%s': %s", path, strerror(e));
        }
        f->base = p;
        f->map_len = (size_t)size;
        if (!f->verify) {
            close(fd); /* the mapping keeps the file alive */
            fd = -1;
        }
    }
    f->fd = fd;
    *out = f;
    return DSI_OK;
}
#endif

dsi_status dsii_file_open_reader(const dsi_context *ctx, const dsi_reader *reader,
                                 dsii_file **out, dsii_error *err) {
    if (out) *out = NULL;
    if (!reader) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "reader is NULL");
    /* Copy what struct_size covers; everything we need lives in the v1 layout. */
    dsi_reader r;
    memset(&r, 0, sizeof r);
    size_t have = reader->struct_size;
    if (have > sizeof r) have = sizeof r;
    memcpy(&r, reader, have);
    int complete = have >= DSII_FIELD_END(dsi_reader, user_data);
    dsi_status st = DSI_OK;
    if (!complete)
        st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                       "reader struct_size %u is too small (use dsi_reader_init)",
                       (unsigned)reader->struct_size);
    else if (!r.pread_fn)
        st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "reader has no pread_fn");
    else if (!out)
        st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsii_file_open_reader: out is NULL");
    dsii_file *f = NULL;
    if (st == DSI_OK && !(f = file_new(ctx, DSII_FILE_READER)))
        st = dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory opening a reader");
    if (st != DSI_OK) {
        /* ownership passed to us: the reader is closed even though opening failed */
        if (complete && r.close_fn) r.close_fn(r.user_data);
        return st;
    }
    f->reader = r;
    f->size = r.size;
    *out = f;
    return DSI_OK;
}

dsi_status dsii_file_open_memory(const dsi_context *ctx, const void *data, size_t size,
                                 dsii_file **out, dsii_error *err) {
    if (!out) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsii_file_open_memory: out is NULL");
    *out = NULL;
    if (!data && size)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "memory buffer is NULL");
    dsii_file *f = file_new(ctx, DSII_FILE_MEMORY);
    if (!f) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    f->base = data;
    f->size = size;
    *out = f;
    return DSI_OK;
}

dsi_status dsii_file_check(const dsii_file *f, dsii_error *err) {
    if (!f || !f->verify || f->released) return DSI_OK;
#if !defined(_WIN32)
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0)
        return dsii_fail(err, DSI_ERR_IO, "%s: cannot check the model file: %s", dsii_file_name(f),
                         f->fd < 0 ? "not open" : strerror(errno));
    if ((uint64_t)st.st_size != f->v_size)
        return dsii_fail(err, DSI_ERR_IO,
                         "%s: the model file changed since it was loaded (size %llu, was %llu); "
                         "replace model files atomically (docs/api.md \"Model files\")",
                         dsii_file_name(f), (unsigned long long)st.st_size,
                         (unsigned long long)f->v_size);
    if ((int64_t)st.st_mtim.tv_sec != f->v_mtime_s || (int64_t)st.st_mtim.tv_nsec != f->v_mtime_ns)
        return dsii_fail(err, DSI_ERR_IO,
                         "%s: the model file was modified since it was loaded; replace model "
                         "files atomically (docs/api.md \"Model files\")", dsii_file_name(f));
#endif
    return DSI_OK;
}

void dsii_file_release(dsii_file *f) {
    if (!f || f->released) return;
    if (f->mode == DSII_FILE_PREAD) {
#if !defined(_WIN32)
        if (f->fd >= 0) close(f->fd);
#endif
        f->fd = -1;
        f->released = 1;
    } else if (f->mode == DSII_FILE_READER) {
        if (f->reader.close_fn) f->reader.close_fn(f->reader.user_data);
        f->released = 1;
    }
}

void dsii_file_close(dsii_file *f) {
    if (!f) return;
#if !defined(_WIN32)
    if (f->mode == DSII_FILE_MMAP && f->base) munmap((void *)(uintptr_t)f->base, f->map_len);
    if (f->fd >= 0) close(f->fd);
#endif
    if (f->mode == DSII_FILE_READER && f->reader.close_fn && !f->released)
        f->reader.close_fn(f->reader.user_data);
    const dsi_context *ctx = f->ctx;
    dsii_free(ctx, f->name);
    dsii_free(ctx, f);
}

uint64_t dsii_file_size(const dsii_file *f) { return f ? f->size : 0; }
int32_t dsii_file_mode(const dsii_file *f) { return f ? f->mode : -1; }
const dsi_context *dsii_file_context(const dsii_file *f) { return f ? f->ctx : NULL; }

int dsii_file_range_ok(const dsii_file *f, uint64_t offset, uint64_t len) {
    if (!f) return 0;
    return offset <= f->size && len <= f->size - offset;
}

int dsii_file_is_mapped(const dsii_file *f) {
    if (!f) return 0;
    return f->mode == DSII_FILE_MEMORY || (f->mode == DSII_FILE_MMAP && f->base != NULL);
}

const void *dsii_file_map(const dsii_file *f, uint64_t offset, uint64_t len) {
    if (!dsii_file_is_mapped(f) || !dsii_file_range_ok(f, offset, len)) return NULL;
    if (!f->base) return NULL; /* empty memory file */
    return f->base + offset;
}

dsi_status dsii_file_read(const dsii_file *f, uint64_t offset, uint64_t len, void *dst,
                          dsii_error *err) {
    if (!f) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "file is NULL");
    if (len == 0) return DSI_OK;
    if (!dst) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "read destination is NULL");
    if (!dsii_file_range_ok(f, offset, len))
        return dsii_fail(err, DSI_ERR_BAD_FORMAT,
                         "%s: read of %llu bytes at offset %llu beyond end of file (size %llu)",
                         dsii_file_name(f), (unsigned long long)len,
                         (unsigned long long)offset, (unsigned long long)f->size);
    if (f->released)
        return dsii_fail(err, DSI_ERR_IO, "%s: the model's file was released after a resident "
                         "load; nothing more can be read from it", dsii_file_name(f));
    switch (f->mode) {
    case DSII_FILE_MEMORY:
    case DSII_FILE_MMAP:
        if (f->base) {
            memcpy(dst, f->base + offset, (size_t)len);
            return DSI_OK;
        }
        break;
    case DSII_FILE_READER:
        if (f->reader.pread_fn(f->reader.user_data, dst, len, offset) != 0)
            return dsii_fail(err, DSI_ERR_IO, "reader failed to read %llu bytes at offset %llu",
                             (unsigned long long)len, (unsigned long long)offset);
        return DSI_OK;
    default:
        break;
    }
#if !defined(_WIN32)
    if (f->fd >= 0) {
        dsi_status vst = dsii_file_check(f, err); /* PREAD with DSII_FILE_VERIFY */
        if (vst != DSI_OK) return vst;
        uint8_t *p = dst;
        uint64_t done = 0;
        while (done < len) {
            uint64_t chunk = len - done;
            if (chunk > (1u << 30)) chunk = 1u << 30; /* pread caps a single call anyway */
            ssize_t r = pread(f->fd, p + done, (size_t)chunk, (off_t)(offset + done));
            if (r < 0) {
                if (errno == EINTR) continue;
                return dsii_fail(err, DSI_ERR_IO, "%s: read of %llu bytes at offset %llu failed: %s",
                                 dsii_file_name(f), (unsigned long long)len,
                                 (unsigned long long)offset, strerror(errno));
            }
            if (r == 0)
                return dsii_fail(err, DSI_ERR_IO,
                                 "%s: unexpected end of file at offset %llu (file shrank?)",
                                 dsii_file_name(f), (unsigned long long)(offset + done));
            done += (uint64_t)r;
        }
        return DSI_OK;
    }
#endif
    return dsii_fail(err, DSI_ERR_INTERNAL, "%s: file has no data source", dsii_file_name(f));
}

void dsii_file_advise(const dsii_file *f, uint64_t offset, uint64_t len, int32_t advice) {
#if !defined(_WIN32)
    if (!f || !dsii_file_range_ok(f, offset, len) || len == 0) return;
    if (f->mode == DSII_FILE_MMAP && f->base) {
        static const int madv[5] = {POSIX_MADV_NORMAL, POSIX_MADV_RANDOM, POSIX_MADV_SEQUENTIAL,
                                    POSIX_MADV_WILLNEED, POSIX_MADV_DONTNEED};
        if (advice < 0 || advice > 4) return;
        long pg = sysconf(_SC_PAGESIZE);
        uint64_t page = pg > 0 ? (uint64_t)pg : 4096;
        uint64_t start = offset / page * page;
        (void)posix_madvise((void *)(uintptr_t)(f->base + start), (size_t)(offset + len - start),
                            madv[advice]);
    } else if (f->mode == DSII_FILE_PREAD && f->fd >= 0) {
        static const int fadv[5] = {POSIX_FADV_NORMAL, POSIX_FADV_RANDOM, POSIX_FADV_SEQUENTIAL,
                                    POSIX_FADV_WILLNEED, POSIX_FADV_DONTNEED};
        if (advice < 0 || advice > 4) return;
        (void)posix_fadvise(f->fd, (off_t)offset, (off_t)len, fadv[advice]);
    }
#else
    (void)f;
    (void)offset;
    (void)len;
    (void)advice;
#endif
}
