/*
 * GGUF reader (strict) and writer (tools and tests only). docs/gguf.md describes the
 * accepted format, every validation rule and limit, and the messages.
 *
 * Reader: the whole header (metadata + tensor infos) is parsed and validated at open; after
 * a successful open every lookup below is infallible except for type mismatches. Tensor data
 * is never read at open: in MMAP / MEMORY mode dsii_gguf_tensor_data() points into the
 * mapping; in PREAD / READER mode the caller reads with dsii_gguf_tensor_read().
 * A dsii_gguf is immutable after open: all const lookups are [thread-safe].
 *
 * Strings returned by the reader are NUL-terminated copies owned by the dsii_gguf (a GGUF
 * string may contain NUL bytes: the *_len variants give the real length).
 */
#ifndef DSI_GGUF_GGUF_H
#define DSI_GGUF_GGUF_H

#include "base/base.h"
#include "base/file.h"

#include <stdint.h>
#include <stdio.h>

#define DSII_GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define DSII_GGUF_DEFAULT_ALIGNMENT 32u
#define DSII_GGUF_MAX_DIMS 4

/* Limits (docs/gguf.md): a file beyond them is rejected with DSI_ERR_BAD_FORMAT. */
#define DSII_GGUF_MAX_KV (1u << 20)              /* metadata entries */
#define DSII_GGUF_MAX_TENSORS (1u << 20)         /* tensor infos */
#define DSII_GGUF_MAX_KEY_LEN 65535u             /* key / tensor name bytes */
#define DSII_GGUF_MAX_STRING_LEN (64u << 20)     /* one string value */
#define DSII_GGUF_MAX_ARRAY_LEN (1ull << 32)     /* elements of one array */
#define DSII_GGUF_MAX_ARRAY_DEPTH 4              /* nesting of arrays in arrays */
#define DSII_GGUF_MAX_HEADER_BYTES (512ull << 20) /* magic .. end of tensor infos */
#define DSII_GGUF_MAX_ALIGNMENT (1u << 20)

/* GGUF metadata value types (the on-disk ids). */
enum {
    DSII_GGUF_U8 = 0,
    DSII_GGUF_I8 = 1,
    DSII_GGUF_U16 = 2,
    DSII_GGUF_I16 = 3,
    DSII_GGUF_U32 = 4,
    DSII_GGUF_I32 = 5,
    DSII_GGUF_F32 = 6,
    DSII_GGUF_BOOL = 7,
    DSII_GGUF_STRING = 8,
    DSII_GGUF_ARRAY = 9,
    DSII_GGUF_U64 = 10,
    DSII_GGUF_I64 = 11,
    DSII_GGUF_F64 = 12,
    DSII_GGUF_N_TYPES = 13
};

/* "u8", "i8", …, "string", "array", "f64"; "?" for an unknown id. */
const char *dsii_gguf_value_type_name(uint32_t vtype);

typedef struct dsii_gguf dsii_gguf;

typedef struct dsii_gguf_tensor {
    const char *name;     /* NUL-terminated, owned by the dsii_gguf */
    int32_t type;         /* DSI_TYPE_* (known to dsii_type_get; maybe not supported) */
    uint32_t n_dims;      /* 1..4 */
    int64_t ne[4];        /* ne[0] = row length (fastest); unused dims are 1 */
    uint64_t n_elements;
    uint64_t nbytes;      /* bytes as stored */
    uint64_t offset;      /* absolute file offset of the data (aligned) */
    uint64_t rel_offset;  /* offset relative to the data section, as in the file */
} dsii_gguf_tensor;

/* ---- opening -------------------------------------------------------------------------- */

/* Parses and validates the GGUF in `f`. Takes ownership of `f` in every case (closes it on
 * failure; dsii_gguf_close closes it otherwise). Status: BAD_FORMAT (message names the key
 * or tensor and the offending value), IO (read failure), UNSUPPORTED (big-endian GGUF,
 * unknown version > 3, unknown tensor type id — message names the tensor and the id),
 * OUT_OF_HOST_MEMORY. On failure *out is NULL. */
dsi_status dsii_gguf_open(dsii_file *f, dsii_gguf **out, dsii_error *err);

/* Convenience: dsii_file_open(path, mode) + dsii_gguf_open. */
dsi_status dsii_gguf_open_path(const dsi_context *ctx, const char *path, int32_t mode,
                               dsii_gguf **out, dsii_error *err);
/* Convenience: dsii_file_open_reader + dsii_gguf_open (reader ownership as there). */
dsi_status dsii_gguf_open_reader(const dsi_context *ctx, const dsi_reader *reader,
                                 dsii_gguf **out, dsii_error *err);
/* Convenience: dsii_file_open_memory + dsii_gguf_open (buffer borrowed). */
dsi_status dsii_gguf_open_memory(const dsi_context *ctx, const void *data, size_t size,
                                 dsii_gguf **out, dsii_error *err);

/* NULL accepted. */
void dsii_gguf_close(dsii_gguf *g);

uint32_t dsii_gguf_version(const dsii_gguf *g);
uint32_t dsii_gguf_alignment(const dsii_gguf *g);
uint64_t dsii_gguf_data_offset(const dsii_gguf *g);  /* absolute, aligned */
dsii_file *dsii_gguf_file(const dsii_gguf *g);       /* owned by g */

/* ---- metadata ------------------------------------------------------------------------- */

int64_t dsii_gguf_n_kv(const dsii_gguf *g);
/* Index of `key`, or -1 if absent (hash lookup). */
int64_t dsii_gguf_find_key(const dsii_gguf *g, const char *key);
/* Key / value type of entry i (0 <= i < n_kv; out-of-range i gives NULL / UINT32_MAX). */
const char *dsii_gguf_kv_key(const dsii_gguf *g, int64_t i);
uint32_t dsii_gguf_kv_type(const dsii_gguf *g, int64_t i);

/* Typed getters by key. Status: OK; NOT_FOUND ("key X not found") if absent; BAD_FORMAT
 * "key X has type T, expected U" on a type mismatch, or "key X value V out of range for U".
 * Integer getters accept any integer type (u8…i64) and bool (0/1) whose value fits the
 * target; get_f32 / get_f64 accept f32 and f64 (f64 → f32 rounds); get_bool accepts bool
 * and integers equal to 0 or 1; get_string only string. Nothing is stored on failure. */
dsi_status dsii_gguf_get_u32(const dsii_gguf *g, const char *key, uint32_t *out,
                             dsii_error *err);
dsi_status dsii_gguf_get_i32(const dsii_gguf *g, const char *key, int32_t *out,
                             dsii_error *err);
dsi_status dsii_gguf_get_u64(const dsii_gguf *g, const char *key, uint64_t *out,
                             dsii_error *err);
dsi_status dsii_gguf_get_i64(const dsii_gguf *g, const char *key, int64_t *out,
                             dsii_error *err);
dsi_status dsii_gguf_get_f32(const dsii_gguf *g, const char *key, float *out,
                             dsii_error *err);
dsi_status dsii_gguf_get_f64(const dsii_gguf *g, const char *key, double *out,
                             dsii_error *err);
dsi_status dsii_gguf_get_bool(const dsii_gguf *g, const char *key, int *out,
                              dsii_error *err);
/* *out points to a NUL-terminated copy owned by g; *len (may be NULL) gets the length. */
dsi_status dsii_gguf_get_string(const dsii_gguf *g, const char *key, const char **out,
                                size_t *len, dsii_error *err);

/* Arrays. get_array: NOT_FOUND / BAD_FORMAT ("key X has type T, expected array") like the
 * scalar getters; on success *elem_type (may be NULL) and *n (may be NULL) are set. */
dsi_status dsii_gguf_get_array(const dsii_gguf *g, const char *key, uint32_t *elem_type,
                               uint64_t *n, dsii_error *err);
/* Copies a whole numeric array, converting each element with the scalar getter's rules
 * ("key X[i] value V out of range for u32"). `cap` elements fit in `dst`; *n (may be NULL)
 * always receives the array length; INVALID_ARGUMENT ("key X has N elements, buffer holds
 * C") when cap is too small (nothing written). */
dsi_status dsii_gguf_get_arr_u32(const dsii_gguf *g, const char *key, uint32_t *dst,
                                 size_t cap, uint64_t *n, dsii_error *err);
dsi_status dsii_gguf_get_arr_i32(const dsii_gguf *g, const char *key, int32_t *dst,
                                 size_t cap, uint64_t *n, dsii_error *err);
dsi_status dsii_gguf_get_arr_u64(const dsii_gguf *g, const char *key, uint64_t *dst,
                                 size_t cap, uint64_t *n, dsii_error *err);
dsi_status dsii_gguf_get_arr_i64(const dsii_gguf *g, const char *key, int64_t *dst,
                                 size_t cap, uint64_t *n, dsii_error *err);
dsi_status dsii_gguf_get_arr_f32(const dsii_gguf *g, const char *key, float *dst,
                                 size_t cap, uint64_t *n, dsii_error *err);

/* Index-based element access for hot loops (tokenizer: 129k strings). `kv` is an index
 * from dsii_gguf_find_key. Out-of-range or wrong-type access returns NULL / 0 / NaN — check
 * the type once with dsii_gguf_kv_type / dsii_gguf_arr_type first. */
uint32_t dsii_gguf_arr_type(const dsii_gguf *g, int64_t kv);  /* UINT32_MAX if no array */
uint64_t dsii_gguf_arr_len(const dsii_gguf *g, int64_t kv);
/* Element i of a string array: NUL-terminated copy owned by g; *len (may be NULL). */
const char *dsii_gguf_arr_str(const dsii_gguf *g, int64_t kv, uint64_t i, size_t *len);
/* Raw little-endian element bytes of a numeric (or bool) array, `arr_len * elem size`
 * bytes, owned by g and suitably aligned for the element type. NULL for string / nested
 * arrays. */
const void *dsii_gguf_arr_data(const dsii_gguf *g, int64_t kv);
/* Nested arrays: element i of an array of arrays, as a read-only sub-view. The returned
 * pointer is an opaque value handle valid as long as g; use the dsii_gguf_val_* accessors.
 * Top-level entries are reachable the same way through dsii_gguf_kv_val. */
typedef struct dsii_gguf_value dsii_gguf_value;
const dsii_gguf_value *dsii_gguf_kv_val(const dsii_gguf *g, int64_t kv);
uint32_t dsii_gguf_val_type(const dsii_gguf_value *v);
uint32_t dsii_gguf_val_arr_type(const dsii_gguf_value *v);   /* UINT32_MAX if no array */
uint64_t dsii_gguf_val_arr_len(const dsii_gguf_value *v);    /* 0 if no array */
const dsii_gguf_value *dsii_gguf_val_arr_elem(const dsii_gguf *g, const dsii_gguf_value *v,
                                              uint64_t i);   /* arrays of arrays only */
/* Raw scalar of a non-array, non-string value, widened: ints to int64/uint64 (check sign
 * with the type), floats to double, bool to 0/1. Return 0 if v is not such a scalar. */
int dsii_gguf_val_as_i64(const dsii_gguf_value *v, int64_t *out);
int dsii_gguf_val_as_u64(const dsii_gguf_value *v, uint64_t *out);
int dsii_gguf_val_as_f64(const dsii_gguf_value *v, double *out);

/* Renders entry i as text for dsi_model_meta_value: numbers in decimal (floats with %.9g /
 * %.17g), bool as true/false, strings verbatim, arrays as "[a, b, …]" with at most 64
 * elements then ", …]"; nested arrays recursively. Two-call pattern: *needed (may be NULL)
 * gets the full length without the NUL; at most cap-1 bytes + NUL are written when buf is
 * non-NULL and cap > 0. Returns 0 for a bad index, 1 otherwise. */
int dsii_gguf_kv_render(const dsii_gguf *g, int64_t i, char *buf, size_t cap,
                        size_t *needed);

/* ---- tensors -------------------------------------------------------------------------- */

int64_t dsii_gguf_n_tensors(const dsii_gguf *g);
/* Tensor i in file order, or NULL if out of range. */
const dsii_gguf_tensor *dsii_gguf_tensor_at(const dsii_gguf *g, int64_t i);
/* Tensor by name (hash lookup), or NULL. */
const dsii_gguf_tensor *dsii_gguf_find_tensor(const dsii_gguf *g, const char *name);
/* Pointer to the tensor's bytes in the mapping (MMAP / MEMORY mode), else NULL. */
const void *dsii_gguf_tensor_data(const dsii_gguf *g, const dsii_gguf_tensor *t);
/* Copies `len` bytes at `offset` within the tensor's data into dst (any mode).
 * INVALID_ARGUMENT if the range exceeds the tensor; IO on read failure. */
dsi_status dsii_gguf_tensor_read(const dsii_gguf *g, const dsii_gguf_tensor *t,
                                 uint64_t offset, uint64_t len, void *dst, dsii_error *err);

/* ---- writer --------------------------------------------------------------------------- */
/*
 * Builds a GGUF v3 file. Output is deterministic: KVs and tensors in insertion order,
 * tensor data in insertion order, each tensor's data at the next multiple of the alignment,
 * padding bytes zero. The writer rejects duplicate keys / tensor names, bad dims and sizes
 * that do not match the type (INVALID_ARGUMENT, message names the culprit) — malformed files
 * for tests must be made some other way (or with dsii_gguf_writer_add_kv_raw).
 * [per-handle]. All functions return INVALID_ARGUMENT for NULL arguments, and a writer that
 * failed to allocate keeps returning OUT_OF_HOST_MEMORY.
 */
typedef struct dsii_gguf_writer dsii_gguf_writer;

/* NULL on allocation failure. */
dsii_gguf_writer *dsii_gguf_writer_create(const dsi_context *ctx);
void dsii_gguf_writer_free(dsii_gguf_writer *w);

/* Sets the data alignment (power of two, 1..DSII_GGUF_MAX_ALIGNMENT) and, unless it is the
 * default 32, records it as the u32 key general.alignment (inserted at the point of the
 * call; call it first for conventional files). Must precede the first add_tensor. */
dsi_status dsii_gguf_writer_set_alignment(dsii_gguf_writer *w, uint32_t alignment,
                                          dsii_error *err);

dsi_status dsii_gguf_writer_add_u8(dsii_gguf_writer *w, const char *key, uint8_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_i8(dsii_gguf_writer *w, const char *key, int8_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_u16(dsii_gguf_writer *w, const char *key, uint16_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_i16(dsii_gguf_writer *w, const char *key, int16_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_u32(dsii_gguf_writer *w, const char *key, uint32_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_i32(dsii_gguf_writer *w, const char *key, int32_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_u64(dsii_gguf_writer *w, const char *key, uint64_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_i64(dsii_gguf_writer *w, const char *key, int64_t v, dsii_error *err);
dsi_status dsii_gguf_writer_add_f32(dsii_gguf_writer *w, const char *key, float v, dsii_error *err);
dsi_status dsii_gguf_writer_add_f64(dsii_gguf_writer *w, const char *key, double v, dsii_error *err);
dsi_status dsii_gguf_writer_add_bool(dsii_gguf_writer *w, const char *key, int v, dsii_error *err);
/* NUL-terminated string, or `len` bytes (may contain NUL). */
dsi_status dsii_gguf_writer_add_string(dsii_gguf_writer *w, const char *key, const char *s,
                                       dsii_error *err);
dsi_status dsii_gguf_writer_add_string_n(dsii_gguf_writer *w, const char *key, const char *s,
                                         size_t len, dsii_error *err);
/* Numeric / bool array: `n` elements of `elem_type` (not STRING / ARRAY) in host order at
 * `data` (written little-endian). */
dsi_status dsii_gguf_writer_add_array(dsii_gguf_writer *w, const char *key, uint32_t elem_type,
                                      const void *data, uint64_t n, dsii_error *err);
/* String array; `lens` may be NULL (then strings are NUL-terminated). */
dsi_status dsii_gguf_writer_add_string_array(dsii_gguf_writer *w, const char *key,
                                             const char *const *strs, const size_t *lens,
                                             uint64_t n, dsii_error *err);
/* Any value, already encoded: writes key, `vtype`, then `len` raw payload bytes verbatim
 * (e.g. a nested array: elem type u32, count u64, then the elements). Only the key is
 * checked. For tests and exotic metadata. */
dsi_status dsii_gguf_writer_add_kv_raw(dsii_gguf_writer *w, const char *key, uint32_t vtype,
                                       const void *payload, size_t len, dsii_error *err);

/* Adds a tensor. ne[0..n_dims) >= 1, n_dims 1..4, type known to dsii_type_get and `nbytes`
 * equal to dsii_type_nbytes. add_tensor copies `data`; add_tensor_ref keeps the pointer
 * (the data must stay valid until the last write call); add_tensor_fn calls
 * `fill(user, dst, nbytes)` (dst: a writer-owned buffer of nbytes) during each write call,
 * which must return 0 on success (nonzero fails the write with IO). add_tensor_f32
 * quantizes f32 data (ne[0]*…*ne[3] floats, row-major) with the type's quantize_row. */
dsi_status dsii_gguf_writer_add_tensor(dsii_gguf_writer *w, const char *name, int32_t type,
                                       uint32_t n_dims, const int64_t *ne, const void *data,
                                       uint64_t nbytes, dsii_error *err);
dsi_status dsii_gguf_writer_add_tensor_ref(dsii_gguf_writer *w, const char *name,
                                           int32_t type, uint32_t n_dims, const int64_t *ne,
                                           const void *data, uint64_t nbytes,
                                           dsii_error *err);
typedef int (*dsii_gguf_fill_fn)(void *user, void *dst, uint64_t nbytes);
dsi_status dsii_gguf_writer_add_tensor_fn(dsii_gguf_writer *w, const char *name, int32_t type,
                                          uint32_t n_dims, const int64_t *ne,
                                          dsii_gguf_fill_fn fill, void *user, dsii_error *err);
/* Row-streamed tensor: at write time the writer calls fill(user, row0, n_rows, dst) for
 * consecutive runs of whole rows (a row = ne[0] elements; rows run over ne[1..3]) — about
 * 8 MiB at a time and a multiple of `row_align` rows (0 = 1) except at the end — so no tensor
 * is ever whole in memory (dsinfer-convert: 100 GB Engram tables). Return 0 on success. */
typedef int (*dsii_gguf_fill_rows_fn)(void *user, uint64_t row0, uint64_t n_rows, void *dst);
dsi_status dsii_gguf_writer_add_tensor_rows(dsii_gguf_writer *w, const char *name,
                                            int32_t type, uint32_t n_dims, const int64_t *ne,
                                            uint32_t row_align, dsii_gguf_fill_rows_fn fill,
                                            void *user, dsii_error *err);
/* Called after every chunk of tensor data written: `done` = bytes of the file so far
 * (`total` is 0; dsii_gguf_writer_size gives it). NULL clears. */
typedef void (*dsii_gguf_progress_fn)(void *user, const char *tensor, uint64_t done,
                                      uint64_t total);
void dsii_gguf_writer_set_progress(dsii_gguf_writer *w, dsii_gguf_progress_fn fn, void *user);
dsi_status dsii_gguf_writer_add_tensor_f32(dsii_gguf_writer *w, const char *name,
                                           int32_t type, uint32_t n_dims, const int64_t *ne,
                                           const float *data, dsii_error *err);

/* Total bytes the file will have. */
uint64_t dsii_gguf_writer_size(const dsii_gguf_writer *w);
/* Writes the file (may be called repeatedly; identical output). IO on a write failure. */
dsi_status dsii_gguf_writer_write_file(dsii_gguf_writer *w, FILE *fp, dsii_error *err);
dsi_status dsii_gguf_writer_write_fd(dsii_gguf_writer *w, int fd, dsii_error *err);
dsi_status dsii_gguf_writer_write_path(dsii_gguf_writer *w, const char *path, dsii_error *err);
/* Whole file into a new buffer from dsii_malloc(ctx) (free with dsii_free). */
dsi_status dsii_gguf_writer_write_memory(dsii_gguf_writer *w, void **data, size_t *size,
                                         dsii_error *err);

#endif /* DSI_GGUF_GGUF_H */
