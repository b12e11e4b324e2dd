/*
 * Strict safetensors reading for dsinfer-convert (docs/converting.md "Input checks").
 *
 * A file: u64 little-endian header length N, N bytes of JSON (an object: tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
 * strings), then the data section; offsets are relative to it. Everything is checked before
 * any tensor is used: N within the file and at most 256 MiB, strict JSON (jansson: UTF-8
 * validated, duplicate keys refused, error positions reported), known dtypes, shapes of at
 * most 8 non-negative dims whose byte size matches end - begin, offsets inside the data
 * section, no two tensors overlapping. Messages name the file and the tensor.
 *
 * A checkpoint directory: model.safetensors.index.json (weight_map: tensor -> shard file) or a
 * single model.safetensors; every shard must exist and hold exactly the tensors the index
 * assigns to it. Tensor data is read with pread, never mapped or held whole.
 */
#ifndef DSI_TOOLS_SAFETENSORS_H
#define DSI_TOOLS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (256ull << 20)

enum st_dtype {
    ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
    ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0, ST_N_DTYPES
};

const char *st_dtype_name(int dtype);
size_t st_dtype_size(int dtype);

typedef struct st_tensor {
    char *name;
    int dtype;
    uint32_t n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;       /* relative to the data section */
    int shard;                 /* index into st_set.files */
} st_tensor;

/* One parsed header. */
typedef struct st_header {
    st_tensor *t;
    size_t n;
    uint64_t data_start;       /* absolute offset of the data section (8 + N) */
} st_header;

/* Parses a header from memory: `json` of `len` bytes, `data_size` = bytes after it in the file.
 * `file` names the file in messages. Returns 0, or -1 with a message in err. Pure: no I/O
 * (the libFuzzer target calls it directly). */
int st_parse_header(const char *json, size_t len, uint64_t data_size, const char *file,
                    st_header *out, char *err, size_t errcap);
void st_header_free(st_header *h);

/* A whole checkpoint: every shard's header, tensors sorted by name. */
typedef struct st_set {
    char *dir;
    char **files;              /* shard paths */
    int *fds;
    size_t n_files;
    st_tensor *t;              /* all tensors (names owned) */
    size_t n;
} st_set;

/* Opens `dir` (index or single file). Returns 0, or -1 with a message. */
int st_open_dir(const char *dir, st_set *s, char *err, size_t errcap);
void st_close(st_set *s);
/* Tensor by name, or NULL. */
const st_tensor *st_find(const st_set *s, const char *name);
/* Reads `len` bytes at byte `off` of tensor t into dst (pread). 0 or -1 + message. */
int st_read(const st_set *s, const st_tensor *t, uint64_t off, uint64_t len, void *dst, char *err,
            size_t errcap);
/* Element count of a tensor. */
uint64_t st_numel(const st_tensor *t);
/* "[a, b]" into buf. */
const char *st_shape_str(const st_tensor *t, char *buf, size_t cap);

#endif
