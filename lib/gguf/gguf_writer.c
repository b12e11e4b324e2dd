/*
 * GGUF v3 writer (see gguf.h). Used by tools (dsinfer-mkmodel) and tests only; the library
 * never writes model files at run time.
 *
 * Determinism: output depends only on the sequence of calls — entries in insertion order,
 * tensor data in insertion order at aligned offsets, all padding zero bytes.
 */
#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif

#include "gguf/gguf.h"

#include "quant/quant.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if !defined(_WIN32)
#include <unistd.h>
#endif

enum { T_COPY, T_REF, T_FN, T_ROWS };

/* Bytes handed to one fill_rows call (whole rows; at least one row). */
#define W_CHUNK_BYTES (8u << 20)

typedef struct w_kv {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t *payload;
    size_t len;
} w_kv;

typedef struct w_tensor {
    char *name;
    size_t name_len;
    int32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    uint64_t nbytes;
    uint64_t rel_off;
    int kind;
    const void *data;   /* T_COPY (owned) / T_REF (borrowed) */
    dsii_gguf_fill_fn fill;
    dsii_gguf_fill_rows_fn fill_rows;
    uint32_t row_align;
    void *user;
} w_tensor;

struct dsii_gguf_writer {
    const dsi_context *ctx;
    uint32_t alignment;
    int oom;
    w_kv *kvs;
    size_t n_kv, cap_kv;
    w_tensor *tensors;
    size_t n_tensors, cap_tensors;
    uint64_t data_end;  /* end of the last tensor's data, relative to the data section */
    /* name sets (open addressing; stores index + 1) */
    uint32_t *kv_set;
    size_t kv_set_cap;
    uint32_t *t_set;
    size_t t_set_cap;
    dsii_gguf_progress_fn progress;
    void *progress_user;
};

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

dsii_gguf_writer *dsii_gguf_writer_create(const dsi_context *ctx) {
    dsii_gguf_writer *w = dsii_calloc(ctx, 1, sizeof *w);
    if (!w) return NULL;
    w->ctx = ctx;
    w->alignment = DSII_GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void dsii_gguf_writer_free(dsii_gguf_writer *w) {
    if (!w) return;
    const dsi_context *ctx = w->ctx;
    for (size_t i = 0; i < w->n_kv; i++) {
        dsii_free(ctx, w->kvs[i].key);
        dsii_free(ctx, w->kvs[i].payload);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        dsii_free(ctx, w->tensors[i].name);
        if (w->tensors[i].kind == T_COPY) dsii_free(ctx, (void *)(uintptr_t)w->tensors[i].data);
    }
    dsii_free(ctx, w->kvs);
    dsii_free(ctx, w->tensors);
    dsii_free(ctx, w->kv_set);
    dsii_free(ctx, w->t_set);
    dsii_free(ctx, w);
}

static int grow(const dsi_context *ctx, void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need) n *= 2;
    size_t bytes;
    if (!dsii_mul_size(n, elem, &bytes)) return 0;
    void *q = dsii_realloc(ctx, *p, bytes);
    if (!q) return 0;
    *p = q;
    *cap = n;
    return 1;
}

/* Name sets: lookup returns 1 if (s, n) is present. `get(i)` gives item i's name. */
typedef const char *(*name_of_fn)(const dsii_gguf_writer *w, uint32_t i, size_t *len);
static const char *kv_name_of(const dsii_gguf_writer *w, uint32_t i, size_t *len) {
    *len = w->kvs[i].key_len;
    return w->kvs[i].key;
}
static const char *t_name_of(const dsii_gguf_writer *w, uint32_t i, size_t *len) {
    *len = w->tensors[i].name_len;
    return w->tensors[i].name;
}

static int set_has(const dsii_gguf_writer *w, const uint32_t *set, size_t cap, name_of_fn get,
                   const char *s, size_t n) {
    if (!set) return 0;
    for (size_t h = (size_t)fnv(s, n) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        if (!set[h]) return 0;
        size_t l;
        const char *o = get(w, set[h] - 1, &l);
        if (l == n && memcmp(o, s, n) == 0) return 1;
    }
}

/* Adds item `count-1` (already stored) to the set, rehashing at half load. */
static int set_add(dsii_gguf_writer *w, uint32_t **set, size_t *cap, name_of_fn get,
                   size_t count) {
    if (2 * count > *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        while (2 * count > nc) nc *= 2;
        uint32_t *ns = dsii_calloc(w->ctx, nc, sizeof *ns);
        if (!ns) return 0;
        dsii_free(w->ctx, *set);
        *set = ns;
        *cap = nc;
        for (size_t i = 0; i + 1 < count; i++) {
            size_t l;
            const char *s = get(w, (uint32_t)i, &l);
            size_t h = (size_t)fnv(s, l) & (nc - 1);
            while (ns[h]) h = (h + 1) & (nc - 1);
            ns[h] = (uint32_t)i + 1;
        }
    }
    size_t l;
    const char *s = get(w, (uint32_t)(count - 1), &l);
    size_t h = (size_t)fnv(s, l) & (*cap - 1);
    while ((*set)[h]) h = (h + 1) & (*cap - 1);
    (*set)[h] = (uint32_t)count;
    return 1;
}

static dsi_status w_oom(dsii_gguf_writer *w, dsii_error *err) {
    w->oom = 1;
    return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "GGUF writer: out of memory");
}

static dsi_status check_name(dsii_gguf_writer *w, const char *name, const char *what,
                             dsii_error *err) {
    if (!w || !name) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    if (w->oom) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "GGUF writer: out of memory earlier");
    size_t n = strlen(name);
    if (n == 0 || n > DSII_GGUF_MAX_KEY_LEN)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: %s name of length %zu", what, n);
    return DSI_OK;
}

static dsi_status add_kv_payload(dsii_gguf_writer *w, const char *key, uint32_t type,
                                 uint8_t *payload, size_t len, dsii_error *err) {
    /* takes ownership of payload */
    dsi_status st = check_name(w, key, "key", err);
    if (st == DSI_OK && set_has(w, w->kv_set, w->kv_set_cap, kv_name_of, key, strlen(key)))
        st = dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: duplicate key '%s'", key);
    if (st != DSI_OK) {
        dsii_free(w ? w->ctx : NULL, payload);
        return st;
    }
    char *k = dsii_strdup(w->ctx, key);
    if (!k || !grow(w->ctx, (void **)&w->kvs, &w->cap_kv, w->n_kv + 1, sizeof *w->kvs)) {
        dsii_free(w->ctx, k);
        dsii_free(w->ctx, payload);
        return w_oom(w, err);
    }
    w_kv *e = &w->kvs[w->n_kv++];
    e->key = k;
    e->key_len = strlen(key);
    e->type = type;
    e->payload = payload;
    e->len = len;
    if (!set_add(w, &w->kv_set, &w->kv_set_cap, kv_name_of, w->n_kv)) {
        w->n_kv--;
        dsii_free(w->ctx, k);
        dsii_free(w->ctx, payload);
        return w_oom(w, err);
    }
    return DSI_OK;
}

static void put_le(uint8_t *p, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static dsi_status add_scalar(dsii_gguf_writer *w, const char *key, uint32_t type, uint64_t bits,
                             unsigned size, dsii_error *err) {
    uint8_t *p = dsii_malloc(w ? w->ctx : NULL, size);
    if (!p) return w ? w_oom(w, err) : dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "NULL writer");
    put_le(p, bits, size);
    return add_kv_payload(w, key, type, p, size, err);
}

dsi_status dsii_gguf_writer_add_u8(dsii_gguf_writer *w, const char *key, uint8_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_U8, v, 1, err);
}
dsi_status dsii_gguf_writer_add_i8(dsii_gguf_writer *w, const char *key, int8_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_I8, (uint8_t)v, 1, err);
}
dsi_status dsii_gguf_writer_add_u16(dsii_gguf_writer *w, const char *key, uint16_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_U16, v, 2, err);
}
dsi_status dsii_gguf_writer_add_i16(dsii_gguf_writer *w, const char *key, int16_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_I16, (uint16_t)v, 2, err);
}
dsi_status dsii_gguf_writer_add_u32(dsii_gguf_writer *w, const char *key, uint32_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_U32, v, 4, err);
}
dsi_status dsii_gguf_writer_add_i32(dsii_gguf_writer *w, const char *key, int32_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_I32, (uint32_t)v, 4, err);
}
dsi_status dsii_gguf_writer_add_u64(dsii_gguf_writer *w, const char *key, uint64_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_U64, v, 8, err);
}
dsi_status dsii_gguf_writer_add_i64(dsii_gguf_writer *w, const char *key, int64_t v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_I64, (uint64_t)v, 8, err);
}
dsi_status dsii_gguf_writer_add_f32(dsii_gguf_writer *w, const char *key, float v, dsii_error *err) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return add_scalar(w, key, DSII_GGUF_F32, u, 4, err);
}
dsi_status dsii_gguf_writer_add_f64(dsii_gguf_writer *w, const char *key, double v, dsii_error *err) {
    uint64_t u;
    memcpy(&u, &v, 8);
    return add_scalar(w, key, DSII_GGUF_F64, u, 8, err);
}
dsi_status dsii_gguf_writer_add_bool(dsii_gguf_writer *w, const char *key, int v, dsii_error *err) {
    return add_scalar(w, key, DSII_GGUF_BOOL, v ? 1 : 0, 1, err);
}

dsi_status dsii_gguf_writer_add_string_n(dsii_gguf_writer *w, const char *key, const char *s,
                                         size_t len, dsii_error *err) {
    if (!w || (!s && len)) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    if (len > SIZE_MAX - 8) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "string too long");
    uint8_t *p = dsii_malloc(w->ctx, 8 + len);
    if (!p) return w_oom(w, err);
    put_le(p, len, 8);
    if (len) memcpy(p + 8, s, len);
    return add_kv_payload(w, key, DSII_GGUF_STRING, p, 8 + len, err);
}

dsi_status dsii_gguf_writer_add_string(dsii_gguf_writer *w, const char *key, const char *s,
                                       dsii_error *err) {
    if (!s) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL string for '%s'",
                             key ? key : "(null)");
    return dsii_gguf_writer_add_string_n(w, key, s, strlen(s), err);
}

static const uint8_t k_elem_size[DSII_GGUF_N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

dsi_status dsii_gguf_writer_add_array(dsii_gguf_writer *w, const char *key, uint32_t elem_type,
                                      const void *data, uint64_t n, dsii_error *err) {
    if (!w || (!data && n)) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    if (elem_type >= DSII_GGUF_N_TYPES || elem_type == DSII_GGUF_STRING ||
        elem_type == DSII_GGUF_ARRAY)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "GGUF writer: bad element type %u for numeric array '%s'",
                         (unsigned)elem_type, key ? key : "(null)");
    unsigned sz = k_elem_size[elem_type];
    size_t bytes, total;
    if (n > SIZE_MAX || !dsii_mul_size((size_t)n, sz, &bytes) || !dsii_add_size(bytes, 12, &total))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: array '%s' too large",
                         key ? key : "(null)");
    uint8_t *p = dsii_malloc(w->ctx, total);
    if (!p) return w_oom(w, err);
    put_le(p, elem_type, 4);
    put_le(p + 4, n, 8);
    const uint8_t *src = data;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = 0;
        switch (sz) {
        case 1: v = src[i]; break;
        case 2: { uint16_t x; memcpy(&x, src + 2 * i, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, src + 4 * i, 4); v = x; break; }
        default: memcpy(&v, src + 8 * i, 8); break;
        }
        if (elem_type == DSII_GGUF_BOOL) v = v ? 1 : 0;
        put_le(p + 12 + (size_t)i * sz, v, sz);
    }
    return add_kv_payload(w, key, DSII_GGUF_ARRAY, p, total, err);
}

dsi_status dsii_gguf_writer_add_string_array(dsii_gguf_writer *w, const char *key,
                                             const char *const *strs, const size_t *lens,
                                             uint64_t n, dsii_error *err) {
    if (!w || (!strs && n)) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i] && (!lens || lens[i]))
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: '%s'[%llu] is NULL",
                             key ? key : "(null)", (unsigned long long)i);
        size_t l = lens ? lens[i] : strlen(strs[i]);
        if (!dsii_add_size(total, 8, &total) || !dsii_add_size(total, l, &total))
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: array '%s' too large",
                             key ? key : "(null)");
    }
    uint8_t *p = dsii_malloc(w->ctx, total);
    if (!p) return w_oom(w, err);
    put_le(p, DSII_GGUF_STRING, 4);
    put_le(p + 4, n, 8);
    size_t o = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : strlen(strs[i]);
        put_le(p + o, l, 8);
        if (l) memcpy(p + o + 8, strs[i], l);
        o += 8 + l;
    }
    return add_kv_payload(w, key, DSII_GGUF_ARRAY, p, total, err);
}

dsi_status dsii_gguf_writer_add_kv_raw(dsii_gguf_writer *w, const char *key, uint32_t vtype,
                                       const void *payload, size_t len, dsii_error *err) {
    if (!w || (!payload && len)) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    uint8_t *p = dsii_malloc(w->ctx, len);
    if (!p) return w_oom(w, err);
    if (len) memcpy(p, payload, len);
    return add_kv_payload(w, key, vtype, p, len, err);
}

dsi_status dsii_gguf_writer_set_alignment(dsii_gguf_writer *w, uint32_t alignment,
                                          dsii_error *err) {
    if (!w) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    if (alignment == 0 || (alignment & (alignment - 1)) || alignment > DSII_GGUF_MAX_ALIGNMENT)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "GGUF writer: alignment %u is not a power of two in 1..%u",
                         (unsigned)alignment, (unsigned)DSII_GGUF_MAX_ALIGNMENT);
    if (w->n_tensors)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "GGUF writer: alignment must be set before the first tensor");
    if (alignment != DSII_GGUF_DEFAULT_ALIGNMENT) {
        dsi_status st = dsii_gguf_writer_add_u32(w, "general.alignment", alignment, err);
        if (st != DSI_OK) return st;
    }
    w->alignment = alignment;
    return DSI_OK;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static dsi_status add_tensor_common(dsii_gguf_writer *w, const char *name, int32_t type,
                                    uint32_t n_dims, const int64_t *ne, int kind,
                                    const void *data, uint64_t nbytes, int check_bytes,
                                    dsii_gguf_fill_fn fill, dsii_gguf_fill_rows_fn fill_rows,
                                    uint32_t row_align, void *user, dsii_error *err) {
    dsi_status st = check_name(w, name, "tensor", err);
    if (st != DSI_OK) return st;
    if (!ne || n_dims < 1 || n_dims > 4)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' has %u dims",
                         name, (unsigned)n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] < 1)
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                             "GGUF writer: tensor '%s' has ne[%u] = %lld", name, (unsigned)d,
                             (long long)ne[d]);
    const dsii_type_traits *tt = dsii_type_get(type);
    if (!tt)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' has unknown type %d",
                         name, (int)type);
    uint64_t want;
    if (!dsii_type_nbytes(type, ne, n_dims, &want))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "GGUF writer: tensor '%s' shape does not fit type %s (ne[0] = %lld, "
                         "block %u)",
                         name, tt->name, (long long)ne[0], (unsigned)tt->blck);
    if (check_bytes && nbytes != want)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "GGUF writer: tensor '%s' has %llu bytes, type %s needs %llu", name,
                         (unsigned long long)nbytes, tt->name, (unsigned long long)want);
    if ((kind == T_COPY || kind == T_REF) && !data)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' data is NULL", name);
    if ((kind == T_FN && !fill) || (kind == T_ROWS && !fill_rows))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' fill is NULL", name);
    if (set_has(w, w->t_set, w->t_set_cap, t_name_of, name, strlen(name)))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: duplicate tensor '%s'", name);
    uint64_t off = align_up(w->data_end, w->alignment), end;
    if (off < w->data_end || !dsii_add_u64(off, want, &end))
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: data section too large");

    char *nm = dsii_strdup(w->ctx, name);
    void *copy = NULL;
    if (nm && kind == T_COPY) {
        if (want > SIZE_MAX) {
            dsii_free(w->ctx, nm);
            return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: tensor '%s' too large", name);
        }
        copy = dsii_malloc(w->ctx, (size_t)want);
        if (copy) memcpy(copy, data, (size_t)want);
    }
    if (!nm || (kind == T_COPY && !copy) ||
        !grow(w->ctx, (void **)&w->tensors, &w->cap_tensors, w->n_tensors + 1, sizeof *w->tensors)) {
        dsii_free(w->ctx, nm);
        dsii_free(w->ctx, copy);
        return w_oom(w, err);
    }
    w_tensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->name_len = strlen(nm);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    t->nbytes = want;
    t->rel_off = off;
    t->kind = kind;
    t->data = kind == T_COPY ? copy : data;
    t->fill = fill;
    t->fill_rows = fill_rows;
    t->row_align = row_align ? row_align : 1;
    t->user = user;
    if (!set_add(w, &w->t_set, &w->t_set_cap, t_name_of, w->n_tensors)) {
        w->n_tensors--;
        dsii_free(w->ctx, nm);
        dsii_free(w->ctx, copy);
        return w_oom(w, err);
    }
    w->data_end = end;
    return DSI_OK;
}

dsi_status dsii_gguf_writer_add_tensor(dsii_gguf_writer *w, const char *name, int32_t type,
                                       uint32_t n_dims, const int64_t *ne, const void *data,
                                       uint64_t nbytes, dsii_error *err) {
    return add_tensor_common(w, name, type, n_dims, ne, T_COPY, data, nbytes, 1, NULL, NULL, 0, NULL, err);
}

dsi_status dsii_gguf_writer_add_tensor_ref(dsii_gguf_writer *w, const char *name, int32_t type,
                                           uint32_t n_dims, const int64_t *ne, const void *data,
                                           uint64_t nbytes, dsii_error *err) {
    return add_tensor_common(w, name, type, n_dims, ne, T_REF, data, nbytes, 1, NULL, NULL, 0, NULL, err);
}

dsi_status dsii_gguf_writer_add_tensor_fn(dsii_gguf_writer *w, const char *name, int32_t type,
                                          uint32_t n_dims, const int64_t *ne,
                                          dsii_gguf_fill_fn fill, void *user, dsii_error *err) {
    return add_tensor_common(w, name, type, n_dims, ne, T_FN, NULL, 0, 0, fill, NULL, 0, user, err);
}

dsi_status dsii_gguf_writer_add_tensor_rows(dsii_gguf_writer *w, const char *name, int32_t type,
                                            uint32_t n_dims, const int64_t *ne, uint32_t row_align,
                                            dsii_gguf_fill_rows_fn fill, void *user,
                                            dsii_error *err) {
    return add_tensor_common(w, name, type, n_dims, ne, T_ROWS, NULL, 0, 0, NULL, fill, row_align, user, err);
}

void dsii_gguf_writer_set_progress(dsii_gguf_writer *w, dsii_gguf_progress_fn fn, void *user) {
    if (!w) return;
    w->progress = fn;
    w->progress_user = user;
}

dsi_status dsii_gguf_writer_add_tensor_f32(dsii_gguf_writer *w, const char *name, int32_t type,
                                           uint32_t n_dims, const int64_t *ne, const float *data,
                                           dsii_error *err) {
    if (!w || !ne || !data || n_dims < 1 || n_dims > 4)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: bad arguments for tensor '%s'",
                         name ? name : "(null)");
    const dsii_type_traits *tt = dsii_type_get(type);
    if (!tt || !tt->quantize_row)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "GGUF writer: cannot quantize tensor '%s' to %s",
                         name ? name : "(null)", tt ? tt->name : "an unknown type");
    uint64_t nbytes, row_bytes;
    if (!dsii_type_nbytes(type, ne, n_dims, &nbytes) || !dsii_type_row_size(type, ne[0], &row_bytes) ||
        nbytes > SIZE_MAX)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "GGUF writer: tensor '%s' shape does not fit type %s", name ? name : "(null)",
                         tt->name);
    uint8_t *buf = dsii_malloc(w->ctx, (size_t)nbytes);
    if (!buf) return w_oom(w, err);
    uint64_t rows = nbytes / (row_bytes ? row_bytes : 1);
    for (uint64_t r = 0; r < rows; r++)
        tt->quantize_row(data + r * (uint64_t)ne[0], buf + r * row_bytes, ne[0]);
    dsi_status st = add_tensor_common(w, name, type, n_dims, ne, T_REF, buf, nbytes, 1, NULL,
                                      NULL, 0, NULL, err);
    if (st != DSI_OK) {
        dsii_free(w->ctx, buf);
        return st;
    }
    w->tensors[w->n_tensors - 1].kind = T_COPY; /* the writer owns buf */
    return DSI_OK;
}

/* ---- output --------------------------------------------------------------------------- */

static uint64_t header_size(const dsii_gguf_writer *w) {
    uint64_t n = 24;
    for (size_t i = 0; i < w->n_kv; i++) n += 8 + w->kvs[i].key_len + 4 + w->kvs[i].len;
    for (size_t i = 0; i < w->n_tensors; i++)
        n += 8 + w->tensors[i].name_len + 4 + 8ull * w->tensors[i].n_dims + 4 + 8;
    return n;
}

uint64_t dsii_gguf_writer_size(const dsii_gguf_writer *w) {
    if (!w) return 0;
    uint64_t data = align_up(header_size(w), w->alignment);
    return data + align_up(w->data_end, w->alignment);
}

typedef struct sink {
    FILE *fp;
    int fd;
    uint8_t *mem;
    uint64_t pos;
    dsii_error *err;
} sink;

static dsi_status emit(sink *s, const void *p, uint64_t n) {
    if (n == 0) return DSI_OK;
    if (s->mem) {
        memcpy(s->mem + s->pos, p, (size_t)n);
    } else if (s->fp) {
        if (fwrite(p, 1, (size_t)n, s->fp) != (size_t)n)
            return dsii_fail(s->err, DSI_ERR_IO, "GGUF writer: write failed at offset %llu: %s",
                             (unsigned long long)s->pos, strerror(errno));
    } else {
#if !defined(_WIN32)
        const uint8_t *b = p;
        uint64_t done = 0;
        while (done < n) {
            ssize_t r = write(s->fd, b + done, (size_t)(n - done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                return dsii_fail(s->err, DSI_ERR_IO, "GGUF writer: write failed at offset %llu: %s",
                                 (unsigned long long)(s->pos + done),
                                 r < 0 ? strerror(errno) : "no progress");
            done += (uint64_t)r;
        }
#else
        return dsii_fail(s->err, DSI_ERR_UNSUPPORTED, "GGUF writer: fd output not built");
#endif
    }
    s->pos += n;
    return DSI_OK;
}

static dsi_status emit_le(sink *s, uint64_t v, unsigned n) {
    uint8_t b[8];
    put_le(b, v, n);
    return emit(s, b, n);
}

static dsi_status emit_zeros(sink *s, uint64_t n) {
    static const uint8_t z[256];
    while (n > 0) {
        uint64_t k = n < sizeof z ? n : sizeof z;
        dsi_status st = emit(s, z, k);
        if (st != DSI_OK) return st;
        n -= k;
    }
    return DSI_OK;
}

static dsi_status write_all(dsii_gguf_writer *w, sink *s) {
    dsi_status st;
    if (w->oom) return dsii_fail(s->err, DSI_ERR_OUT_OF_HOST_MEMORY, "GGUF writer: out of memory earlier");
#define E(x) do { if ((st = (x)) != DSI_OK) return st; } while (0)
    E(emit_le(s, DSII_GGUF_MAGIC, 4));
    E(emit_le(s, 3, 4));
    E(emit_le(s, w->n_tensors, 8));
    E(emit_le(s, w->n_kv, 8));
    for (size_t i = 0; i < w->n_kv; i++) {
        const w_kv *k = &w->kvs[i];
        E(emit_le(s, k->key_len, 8));
        E(emit(s, k->key, k->key_len));
        E(emit_le(s, k->type, 4));
        E(emit(s, k->payload, k->len));
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const w_tensor *t = &w->tensors[i];
        E(emit_le(s, t->name_len, 8));
        E(emit(s, t->name, t->name_len));
        E(emit_le(s, t->n_dims, 4));
        for (uint32_t d = 0; d < t->n_dims; d++) E(emit_le(s, (uint64_t)t->ne[d], 8));
        E(emit_le(s, (uint32_t)t->type, 4));
        E(emit_le(s, t->rel_off, 8));
    }
    uint64_t data = align_up(s->pos, w->alignment);
    E(emit_zeros(s, data - s->pos));
    for (size_t i = 0; i < w->n_tensors; i++) {
        const w_tensor *t = &w->tensors[i];
        E(emit_zeros(s, data + t->rel_off - s->pos));
        if (t->kind == T_ROWS) {
            /* whole rows at a time, a multiple of row_align rows per call (the last may be
             * shorter): memory stays bounded whatever the tensor's size */
            const uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
            const uint64_t rb = t->nbytes / rows;
            uint64_t per = rb ? W_CHUNK_BYTES / rb : 1;
            if (per < t->row_align) per = t->row_align;
            per = per / t->row_align * t->row_align;
            if (per > rows) per = rows;
            uint8_t *buf = dsii_malloc(w->ctx, (size_t)(per * rb));
            if (!buf) return dsii_fail(s->err, DSI_ERR_OUT_OF_HOST_MEMORY,
                                       "GGUF writer: out of memory for rows of tensor '%s'", t->name);
            for (uint64_t r = 0; r < rows; r += per) {
                const uint64_t n = rows - r < per ? rows - r : per;
                memset(buf, 0, (size_t)(n * rb));
                if (t->fill_rows(t->user, r, n, buf) != 0) {
                    dsii_free(w->ctx, buf);
                    return dsii_fail(s->err, DSI_ERR_IO, "GGUF writer: fill callback failed for '%s' (rows %llu..%llu)",
                                     t->name, (unsigned long long)r, (unsigned long long)(r + n - 1));
                }
                st = emit(s, buf, n * rb);
                if (st == DSI_OK && w->progress) w->progress(w->progress_user, t->name, s->pos, 0);
                if (st != DSI_OK) {
                    dsii_free(w->ctx, buf);
                    return st;
                }
            }
            dsii_free(w->ctx, buf);
        } else if (t->kind == T_FN) {
            if (t->nbytes > SIZE_MAX) return dsii_fail(s->err, DSI_ERR_IO, "tensor too large");
            void *buf = dsii_malloc(w->ctx, (size_t)t->nbytes);
            if (!buf) return dsii_fail(s->err, DSI_ERR_OUT_OF_HOST_MEMORY,
                                       "GGUF writer: out of memory for tensor '%s'", t->name);
            memset(buf, 0, (size_t)t->nbytes);
            if (t->fill(t->user, buf, t->nbytes) != 0) {
                dsii_free(w->ctx, buf);
                return dsii_fail(s->err, DSI_ERR_IO, "GGUF writer: fill callback failed for '%s'",
                                 t->name);
            }
            st = emit(s, buf, t->nbytes);
            dsii_free(w->ctx, buf);
            if (st != DSI_OK) return st;
            if (w->progress) w->progress(w->progress_user, t->name, s->pos, 0);
        } else {
            E(emit(s, t->data, t->nbytes));
        }
    }
    E(emit_zeros(s, align_up(s->pos - data, w->alignment) - (s->pos - data)));
#undef E
    return DSI_OK;
}

dsi_status dsii_gguf_writer_write_file(dsii_gguf_writer *w, FILE *fp, dsii_error *err) {
    if (!w || !fp) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    sink s = {fp, -1, NULL, 0, err};
    dsi_status st = write_all(w, &s);
    if (st == DSI_OK && fflush(fp) != 0)
        st = dsii_fail(err, DSI_ERR_IO, "GGUF writer: flush failed: %s", strerror(errno));
    return st;
}

dsi_status dsii_gguf_writer_write_fd(dsii_gguf_writer *w, int fd, dsii_error *err) {
    if (!w || fd < 0) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: bad argument");
    sink s = {NULL, fd, NULL, 0, err};
    return write_all(w, &s);
}

dsi_status dsii_gguf_writer_write_path(dsii_gguf_writer *w, const char *path, dsii_error *err) {
    if (!w || !path) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    FILE *fp = fopen(path, "wb");
    if (!fp) return dsii_fail(err, DSI_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    dsi_status st = dsii_gguf_writer_write_file(w, fp, err);
    if (fclose(fp) != 0 && st == DSI_OK)
        st = dsii_fail(err, DSI_ERR_IO, "cannot close '%s': %s", path, strerror(errno));
    return st;
}

dsi_status dsii_gguf_writer_write_memory(dsii_gguf_writer *w, void **data, size_t *size,
                                         dsii_error *err) {
    if (!w || !data || !size) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "GGUF writer: NULL argument");
    *data = NULL;
    *size = 0;
    uint64_t total = dsii_gguf_writer_size(w);
    if (total > SIZE_MAX) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "GGUF too large for memory");
    uint8_t *buf = dsii_malloc(w->ctx, (size_t)total);
    if (!buf) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "GGUF writer: out of memory");
    sink s = {NULL, -1, buf, 0, err};
    dsi_status st = write_all(w, &s);
    if (st != DSI_OK) {
        dsii_free(w->ctx, buf);
        return st;
    }
    *data = buf;
    *size = (size_t)total;
    return DSI_OK;
}
