/*
 * Internal file access: one read-only byte source behind three modes.
 *
 *   DSII_FILE_MMAP    read-only mapping of a path; data is used in place, never copied
 *                     (dsii_file_map returns pointers into the mapping).
 *   DSII_FILE_PREAD   buffered pread(2) of a path into memory the caller (library) owns;
 *                     dsii_file_map returns NULL, use dsii_file_read.
 *   DSII_FILE_READER  the application's dsi_reader callbacks (asset packs); like PREAD.
 *   DSII_FILE_MEMORY  a caller-owned buffer (tests, fuzzing, embedded blobs); behaves like
 *                     MMAP (map returns pointers into the buffer, which must outlive the file).
 *
 * Every read is range-checked with overflow-safe arithmetic against the file size. The
 * handle allocates through dsii_malloc with the context given at open (may be NULL).
 * Thread-safety: dsii_file_read and dsii_file_map may be called from several threads at
 * once (pread has no shared file position); for READER mode only as far as the
 * application's pread_fn allows. Opening and closing are [per-handle].
 */
#ifndef DSI_BASE_FILE_H
#define DSI_BASE_FILE_H

#include "base/base.h"

#include <stddef.h>
#include <stdint.h>

/* Mode values equal the public DSI_ACCESS_* values where those exist. */
enum {
    DSII_FILE_MMAP = DSI_ACCESS_MMAP,
    DSII_FILE_PREAD = DSI_ACCESS_PREAD,
    DSII_FILE_READER = DSI_ACCESS_READER,
    DSII_FILE_MEMORY = 3
};

typedef struct dsii_file dsii_file;

/* Opens `path` in mode DSII_FILE_MMAP or DSII_FILE_PREAD. IO (message names the path and
 * the OS error) if it cannot be opened, stat'ed or mapped, or is not a regular file or
 * block device (checked before the open, which never blocks); INVALID_ARGUMENT for a bad
 * mode. An empty file opens fine in both modes (size 0, nothing mappable). On failure
 * *out is NULL. */
dsi_status dsii_file_open(const dsi_context *ctx, const char *path, int32_t mode,
                          dsii_file **out, dsii_error *err);

/* dsii_file_open with flags. DSII_FILE_VERIFY remembers the file's size and modification
 * time and keeps the descriptor open (also in MMAP mode) so that dsii_file_check can tell
 * whether the file was truncated or rewritten in place since; PREAD-mode reads check first.
 * (A file replaced by rename is not "changed": the descriptor and mapping keep the old one.) */
#define DSII_FILE_VERIFY 1u
dsi_status dsii_file_open_ex(const dsi_context *ctx, const char *path, int32_t mode,
                             uint32_t flags, dsii_file **out, dsii_error *err);

/* DSI_OK, or IO if the file was opened with DSII_FILE_VERIFY and its size or modification
 * time differ from those at open. Always DSI_OK without the flag. [thread-safe] */
dsi_status dsii_file_check(const dsii_file *f, dsii_error *err);

/* Gives up the data source once everything needed is in memory: closes the descriptor
 * (PREAD) or calls the reader's close_fn (READER) now rather than at dsii_file_close; later
 * reads fail with IO. No effect in MMAP / MEMORY mode. [per-handle] */
void dsii_file_release(dsii_file *f);

/* Wraps reader callbacks (copied; struct_size honoured). Ownership of the reader passes to
 * the file in every case: reader->close_fn (if any) is called exactly once — by
 * dsii_file_close, or before this function returns if it fails. INVALID_ARGUMENT if
 * pread_fn is NULL or struct_size is too small. */
dsi_status dsii_file_open_reader(const dsi_context *ctx, const dsi_reader *reader,
                                 dsii_file **out, dsii_error *err);

/* Wraps `size` bytes at `data` (borrowed; must outlive the file). `data` may be NULL only
 * when size is 0. */
dsi_status dsii_file_open_memory(const dsi_context *ctx, const void *data, size_t size,
                                 dsii_file **out, dsii_error *err);

/* Unmaps / closes / calls close_fn, frees the handle. NULL accepted. */
void dsii_file_close(dsii_file *f);

uint64_t dsii_file_size(const dsii_file *f);
int32_t dsii_file_mode(const dsii_file *f);
/* For messages: the path, "<reader>" or "<memory>". Never NULL. */
const char *dsii_file_name(const dsii_file *f);
/* The context given at open (may be NULL). */
const dsi_context *dsii_file_context(const dsii_file *f);

/* True (1) iff [offset, offset+len) lies inside the file, computed without overflow. */
int dsii_file_range_ok(const dsii_file *f, uint64_t offset, uint64_t len);

/* Copies `len` bytes at `offset` into `dst` (any mode). BAD_FORMAT if the range is outside
 * the file ("read of N bytes at offset O beyond end of file (size S)"); IO if the OS or the
 * reader callback fails. len == 0 always succeeds (dst may then be NULL). */
dsi_status dsii_file_read(const dsii_file *f, uint64_t offset, uint64_t len, void *dst,
                          dsii_error *err);

/* A pointer to `len` bytes at `offset` inside the mapping (MMAP and MEMORY modes); NULL in
 * PREAD / READER modes or when the range is outside the file — callers then use
 * dsii_file_read into their own buffer. Valid until dsii_file_close. */
const void *dsii_file_map(const dsii_file *f, uint64_t offset, uint64_t len);

/* True (1) iff dsii_file_map can succeed in this mode (MMAP with size > 0, MEMORY). */
int dsii_file_is_mapped(const dsii_file *f);

/* Access-pattern hints (best effort, never fail): MMAP mode uses posix_madvise on the
 * page-rounded range, PREAD mode posix_fadvise; other modes ignore them. E.g. RANDOM for
 * Engram tables read row by row, WILLNEED before streaming weights to a device. */
enum {
    DSII_ADVISE_NORMAL = 0,
    DSII_ADVISE_RANDOM = 1,
    DSII_ADVISE_SEQUENTIAL = 2,
    DSII_ADVISE_WILLNEED = 3,
    DSII_ADVISE_DONTNEED = 4
};
void dsii_file_advise(const dsii_file *f, uint64_t offset, uint64_t len, int32_t advice);

#endif /* DSI_BASE_FILE_H */
