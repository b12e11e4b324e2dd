/*
 * Strict GGUF v2/v3 reader (see gguf.h, docs/gguf.md).
 *
 * Safety model: every length or count read from the file is checked against the bytes that
 * remain in the file (and the DSII_GGUF_MAX_* limits) BEFORE anything sized by it is
 * allocated; all offset arithmetic is overflow-checked; growable tables grow only as entries
 * are actually parsed, so memory stays proportional to bytes that really exist. Every failure
 * frees everything and reports which key or tensor was being read.
 */
#include "gguf/gguf.h"

#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dsii_gguf_value {
    uint32_t type;
    uint32_t arr_type;     /* UINT32_MAX unless type == ARRAY */
    uint64_t n;            /* array: element count; string: byte length */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } s;                   /* widened scalar */
    uint64_t off;          /* arena offset (string bytes / numeric data / string index
                              table of {off,len} u64 pairs); arrays of arrays: index of the
                              first child in vals */
};

typedef struct name_ref {
    uint64_t off;          /* arena offset of the NUL-terminated name */
    uint64_t len;
} name_ref;

struct dsii_gguf {
    const dsi_context *ctx;
    dsii_file *f;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;

    uint8_t *arena;
    size_t arena_len, arena_cap;

    name_ref *kv_name;
    uint64_t *kv_val;      /* index into vals */
    size_t n_kv, cap_kv;
    dsii_gguf_value *vals;
    size_t n_vals, cap_vals;

    dsii_gguf_tensor *tensors;
    name_ref *t_name;
    size_t n_tensors, cap_tensors;

    uint32_t *kv_hash;     /* open addressing, stores index + 1 */
    size_t kv_hash_cap;
    uint32_t *t_hash;
    size_t t_hash_cap;
};

/* ---- small helpers -------------------------------------------------------------------- */

static const char *const k_vtype_names[DSII_GGUF_N_TYPES] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
static const uint8_t k_vtype_size[DSII_GGUF_N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *dsii_gguf_value_type_name(uint32_t vtype) {
    return vtype < DSII_GGUF_N_TYPES ? k_vtype_names[vtype] : "?";
}

static int is_int_type(uint32_t t) {
    return t <= DSII_GGUF_I32 || t == DSII_GGUF_U64 || t == DSII_GGUF_I64;
}
static int is_signed_type(uint32_t t) {
    return t == DSII_GGUF_I8 || t == DSII_GGUF_I16 || t == DSII_GGUF_I32 || t == DSII_GGUF_I64;
}

static uint64_t ld_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Printable, bounded rendering of a name from the file for error messages. */
static void safe_name(char out[100], const char *s, size_t len) {
    size_t o = 0, i = 0;
    for (; i < len && o < 90; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out[o++] = (char)c;
        } else {
            o += (size_t)snprintf(out + o, 100 - o, "\\x%02x", c);
        }
    }
    if (i < len) { /* cut: o <= 93 here, so the marker fits */
        memcpy(out + o, "...", 4);
        return;
    }
    out[o] = '\0';
}

static uint64_t hash_bytes(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---- parse state ---------------------------------------------------------------------- */

#define RDBUF_SIZE 65536

typedef struct cursor {
    dsii_gguf *g;
    dsii_file *f;
    uint64_t size;          /* file size */
    uint64_t pos;
    const uint8_t *map;     /* whole file when mapped, else NULL */
    uint8_t *buf;           /* read buffer (unmapped modes) */
    uint64_t buf_off;
    size_t buf_len;
    dsii_error *err;
    char what[160];         /* what is being parsed, for messages */
} cursor;

static dsi_status oom(cursor *c) {
    return dsii_fail(c->err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory reading GGUF header (%s)",
                     c->what);
}

static dsi_status cur_read(cursor *c, void *dst, uint64_t len) {
    if (len > c->size || c->pos > c->size - len)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "%s: truncated file: needs %llu bytes at offset %llu, file has %llu",
                         c->what, (unsigned long long)len, (unsigned long long)c->pos,
                         (unsigned long long)c->size);
    if (c->pos + len > DSII_GGUF_MAX_HEADER_BYTES)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "%s: GGUF header exceeds the limit of %llu bytes", c->what,
                         (unsigned long long)DSII_GGUF_MAX_HEADER_BYTES);
    uint8_t *d = dst;
    if (c->map) {
        memcpy(d, c->map + c->pos, (size_t)len);
        c->pos += len;
        return DSI_OK;
    }
    while (len > 0) {
        if (c->pos >= c->buf_off && c->pos < c->buf_off + c->buf_len) {
            size_t in = (size_t)(c->buf_off + c->buf_len - c->pos);
            size_t take = len < in ? (size_t)len : in;
            memcpy(d, c->buf + (c->pos - c->buf_off), take);
            d += take;
            c->pos += take;
            len -= take;
            continue;
        }
        if (len >= RDBUF_SIZE) { /* large: read straight into the destination */
            dsi_status st = dsii_file_read(c->f, c->pos, len, d, c->err);
            if (st != DSI_OK) return st;
            c->pos += len;
            return DSI_OK;
        }
        uint64_t avail = c->size - c->pos;
        size_t fill = avail < RDBUF_SIZE ? (size_t)avail : RDBUF_SIZE;
        dsi_status st = dsii_file_read(c->f, c->pos, fill, c->buf, c->err);
        if (st != DSI_OK) return st;
        c->buf_off = c->pos;
        c->buf_len = fill;
    }
    return DSI_OK;
}

static dsi_status cur_u32(cursor *c, uint32_t *v) {
    uint8_t b[4];
    dsi_status st = cur_read(c, b, 4);
    if (st == DSI_OK) *v = (uint32_t)ld_le(b, 4);
    return st;
}
static dsi_status cur_u64(cursor *c, uint64_t *v) {
    uint8_t b[8];
    dsi_status st = cur_read(c, b, 8);
    if (st == DSI_OK) *v = ld_le(b, 8);
    return st;
}

static uint64_t remaining(const cursor *c) { return c->pos <= c->size ? c->size - c->pos : 0; }

/* Arena: grows geometrically; returns the offset of `len` fresh bytes aligned to `al`. */
static int arena_alloc(cursor *c, uint64_t len, size_t al, uint64_t *off) {
    dsii_gguf *g = c->g;
    size_t start = (g->arena_len + (al - 1)) & ~(al - 1);
    size_t end;
    if (start < g->arena_len || len > SIZE_MAX || !dsii_add_size(start, (size_t)len, &end))
        return 0;
    if (end > g->arena_cap) {
        size_t cap = g->arena_cap ? g->arena_cap : 4096;
        while (cap < end) {
            if (cap > SIZE_MAX / 2) {
                cap = end;
                break;
            }
            cap *= 2;
        }
        uint8_t *p = dsii_realloc(g->ctx, g->arena, cap);
        if (!p) return 0;
        g->arena = p;
        g->arena_cap = cap;
    }
    memset(g->arena + g->arena_len, 0, end - g->arena_len);
    g->arena_len = end;
    *off = start;
    return 1;
}

static int grow(const dsi_context *ctx, void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2) return 0;
        n *= 2;
    }
    size_t bytes;
    if (!dsii_mul_size(n, elem, &bytes)) return 0;
    void *q = dsii_realloc(ctx, *p, bytes);
    if (!q) return 0;
    *p = q;
    *cap = n;
    return 1;
}

/* Reads a GGUF string (u64 length + bytes) into the arena (NUL-terminated). */
static dsi_status read_string(cursor *c, uint64_t max_len, const char *kind, uint64_t *off,
                              uint64_t *len) {
    uint64_t n;
    dsi_status st = cur_u64(c, &n);
    if (st != DSI_OK) return st;
    if (n > max_len)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "%s: %s length %llu exceeds the limit %llu",
                         c->what, kind, (unsigned long long)n, (unsigned long long)max_len);
    if (n > remaining(c))
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "%s: %s length %llu exceeds the %llu bytes left in the file", c->what,
                         kind, (unsigned long long)n, (unsigned long long)remaining(c));
    if (!arena_alloc(c, n + 1, 1, off)) return oom(c);
    st = cur_read(c, c->g->arena + *off, n);
    if (st != DSI_OK) return st;
    c->g->arena[*off + n] = 0;
    *len = n;
    return DSI_OK;
}

static dsi_status new_vals(cursor *c, uint64_t count, uint64_t *first) {
    dsii_gguf *g = c->g;
    size_t need;
    if (count > SIZE_MAX || !dsii_add_size(g->n_vals, (size_t)count, &need)) return oom(c);
    if (!grow(g->ctx, (void **)&g->vals, &g->cap_vals, need, sizeof *g->vals)) return oom(c);
    memset(g->vals + g->n_vals, 0, (size_t)count * sizeof *g->vals);
    *first = g->n_vals;
    g->n_vals = need;
    return DSI_OK;
}

static dsi_status read_value(cursor *c, uint32_t type, uint64_t vi, int depth);

static dsi_status read_array(cursor *c, uint64_t vi, int depth) {
    uint32_t et;
    uint64_t n;
    dsi_status st = cur_u32(c, &et);
    if (st == DSI_OK) st = cur_u64(c, &n);
    if (st != DSI_OK) return st;
    if (et >= DSII_GGUF_N_TYPES)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "%s: array has unknown element type %u",
                         c->what, (unsigned)et);
    if (et == DSII_GGUF_ARRAY && depth + 1 >= DSII_GGUF_MAX_ARRAY_DEPTH)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "%s: arrays nested deeper than %d levels", c->what,
                         DSII_GGUF_MAX_ARRAY_DEPTH);
    /* Minimum bytes each element occupies in the file: bounds n before any allocation. */
    uint64_t min_el = et == DSII_GGUF_STRING ? 8 : et == DSII_GGUF_ARRAY ? 12 : k_vtype_size[et];
    if (n > DSII_GGUF_MAX_ARRAY_LEN || n > remaining(c) / min_el)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "%s: array of %llu %s elements exceeds the %llu bytes left in the file",
                         c->what, (unsigned long long)n, k_vtype_names[et],
                         (unsigned long long)remaining(c));
    dsii_gguf *g = c->g;
    g->vals[vi].type = DSII_GGUF_ARRAY;
    g->vals[vi].arr_type = et;
    g->vals[vi].n = n;
    if (et == DSII_GGUF_STRING) {
        uint64_t tab;
        if (!arena_alloc(c, n * 16, 8, &tab)) return oom(c);
        g->vals[vi].off = tab;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t so, sl;
            st = read_string(c, DSII_GGUF_MAX_STRING_LEN, "string element", &so, &sl);
            if (st != DSI_OK) return st;
            memcpy(g->arena + tab + 16 * i, &so, 8);
            memcpy(g->arena + tab + 16 * i + 8, &sl, 8);
        }
        return DSI_OK;
    }
    if (et == DSII_GGUF_ARRAY) {
        uint64_t first;
        st = new_vals(c, n, &first);
        if (st != DSI_OK) return st;
        g->vals[vi].off = first;
        for (uint64_t i = 0; i < n; i++) {
            st = read_value(c, DSII_GGUF_ARRAY, first + i, depth + 1);
            if (st != DSI_OK) return st;
        }
        return DSI_OK;
    }
    uint64_t bytes = n * k_vtype_size[et]; /* <= remaining: no overflow */
    uint64_t off;
    if (!arena_alloc(c, bytes, 8, &off)) return oom(c);
    g->vals[vi].off = off;
    st = cur_read(c, g->arena + off, bytes);
    if (st != DSI_OK) return st;
    if (et == DSII_GGUF_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (g->arena[off + i] > 1)
                return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                                 "%s: bool array element %llu has invalid value %u", c->what,
                                 (unsigned long long)i, (unsigned)g->arena[off + i]);
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    /* keep arena data in host order so dsii_gguf_arr_data is directly usable */
    unsigned sz = k_vtype_size[et];
    for (uint64_t i = 0; i < n && sz > 1; i++) {
        uint8_t *p = g->arena + off + i * sz;
        for (unsigned a = 0, b = sz - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
    }
#endif
    return DSI_OK;
}

static dsi_status read_value(cursor *c, uint32_t type, uint64_t vi, int depth) {
    dsii_gguf *g = c->g;
    g->vals[vi].type = type;
    g->vals[vi].arr_type = UINT32_MAX;
    if (type == DSII_GGUF_ARRAY) return read_array(c, vi, depth);
    if (type == DSII_GGUF_STRING) {
        uint64_t off, len;
        dsi_status st = read_string(c, DSII_GGUF_MAX_STRING_LEN, "string value", &off, &len);
        if (st != DSI_OK) return st;
        g->vals[vi].off = off;
        g->vals[vi].n = len;
        return DSI_OK;
    }
    uint8_t b[8];
    unsigned sz = k_vtype_size[type];
    dsi_status st = cur_read(c, b, sz);
    if (st != DSI_OK) return st;
    uint64_t raw = ld_le(b, sz);
    dsii_gguf_value *v = &g->vals[vi];
    switch (type) {
    case DSII_GGUF_U8: case DSII_GGUF_U16: case DSII_GGUF_U32: case DSII_GGUF_U64:
        v->s.u = raw;
        break;
    case DSII_GGUF_I8: v->s.i = (int8_t)(uint8_t)raw; break;
    case DSII_GGUF_I16: v->s.i = (int16_t)(uint16_t)raw; break;
    case DSII_GGUF_I32: v->s.i = (int32_t)(uint32_t)raw; break;
    case DSII_GGUF_I64: v->s.i = (int64_t)raw; break;
    case DSII_GGUF_F32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        v->s.f = f;
        break;
    }
    case DSII_GGUF_F64: {
        double d;
        memcpy(&d, &raw, 8);
        v->s.f = d;
        break;
    }
    case DSII_GGUF_BOOL:
        if (raw > 1)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "%s: invalid bool value %u", c->what,
                             (unsigned)raw);
        v->s.u = raw;
        break;
    default:
        break;
    }
    return DSI_OK;
}

static int hash_build(const dsi_context *ctx, uint32_t **tab, size_t *cap, size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    *tab = dsii_calloc(ctx, c, sizeof **tab);
    if (!*tab) return 0;
    *cap = c;
    return 1;
}

/* Inserts item `idx` (name names[idx]); returns the index of an existing equal name, or -1. */
static int64_t hash_insert(uint32_t *tab, size_t cap, const uint8_t *arena, const name_ref *names,
                           uint32_t idx) {
    const char *s = (const char *)arena + names[idx].off;
    size_t len = (size_t)names[idx].len;
    size_t h = (size_t)hash_bytes(s, len) & (cap - 1);
    for (;;) {
        uint32_t e = tab[h];
        if (!e) {
            tab[h] = idx + 1;
            return -1;
        }
        uint32_t o = e - 1;
        if ((size_t)names[o].len == len && memcmp(arena + names[o].off, s, len) == 0) return o;
        h = (h + 1) & (cap - 1);
    }
}

static int64_t hash_find(const uint32_t *tab, size_t cap, const uint8_t *arena,
                         const name_ref *names, const char *s) {
    if (!tab || !s) return -1;
    size_t len = strlen(s);
    size_t h = (size_t)hash_bytes(s, len) & (cap - 1);
    for (;;) {
        uint32_t e = tab[h];
        if (!e) return -1;
        uint32_t o = e - 1;
        if ((size_t)names[o].len == len && memcmp(arena + names[o].off, s, len) == 0) return o;
        h = (h + 1) & (cap - 1);
    }
}

static int cmp_by_offset(const void *a, const void *b, void *user) {
    const dsii_gguf_tensor *t = user;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (t[x].offset != t[y].offset) return t[x].offset < t[y].offset ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* qsort has no context argument in C11 (and may allocate): the base heap sort instead. */
static void sort_by_offset(uint32_t *idx, size_t n, const dsii_gguf_tensor *t) {
    dsii_sort(idx, n, sizeof *idx, cmp_by_offset, (void *)(uintptr_t)t);
}

static int val_to_u64(const dsii_gguf_value *v, uint64_t *out);

static dsi_status parse(cursor *c) {
    dsii_gguf *g = c->g;
    dsi_status st;
    char nm[100];

    snprintf(c->what, sizeof c->what, "header");
    if (c->size == 0) return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "file is empty (0 bytes)");
    if (c->size < 4)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "file of %llu bytes is too small for GGUF",
                         (unsigned long long)c->size);
    uint32_t magic, version;
    if ((st = cur_u32(c, &magic)) != DSI_OK) return st;
    if (magic != DSII_GGUF_MAGIC) {
        uint8_t m[4] = {(uint8_t)magic, (uint8_t)(magic >> 8), (uint8_t)(magic >> 16),
                        (uint8_t)(magic >> 24)};
        safe_name(nm, (const char *)m, 4);
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "not a GGUF file: magic is \"%s\" (0x%08x), expected \"GGUF\"", nm,
                         (unsigned)magic);
    }
    snprintf(c->what, sizeof c->what, "header version");
    if ((st = cur_u32(c, &version)) != DSI_OK) return st;
    if (version == 0)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "invalid GGUF version 0");
    if ((version & 0xFFFFu) == 0 && (version >> 16) != 0)
        return dsii_fail(c->err, DSI_ERR_UNSUPPORTED,
                         "big-endian GGUF (version field 0x%08x) is not supported",
                         (unsigned)version);
    if (version == 1)
        return dsii_fail(c->err, DSI_ERR_UNSUPPORTED,
                         "GGUF version 1 is not supported (only 2 and 3)");
    if (version > 3)
        return dsii_fail(c->err, DSI_ERR_UNSUPPORTED,
                         "GGUF version %u is not supported (only 2 and 3)", (unsigned)version);
    g->version = version;

    uint64_t n_tensors, n_kv;
    snprintf(c->what, sizeof c->what, "header tensor count");
    if ((st = cur_u64(c, &n_tensors)) != DSI_OK) return st;
    snprintf(c->what, sizeof c->what, "header metadata count");
    if ((st = cur_u64(c, &n_kv)) != DSI_OK) return st;
    /* minimum encoded sizes: kv = 8 (key length) + 1 (key) + 4 (type) + 1 (value);
     * tensor info = 8 + 1 + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) */
    if (n_kv > DSII_GGUF_MAX_KV || n_kv > remaining(c) / 14)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "header: metadata count %llu is impossible for the %llu bytes left "
                         "(limit %u)",
                         (unsigned long long)n_kv, (unsigned long long)remaining(c),
                         (unsigned)DSII_GGUF_MAX_KV);
    if (n_tensors > DSII_GGUF_MAX_TENSORS ||
        n_tensors > (remaining(c) - n_kv * 14) / 33)
        return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                         "header: tensor count %llu is impossible for the %llu bytes left "
                         "(limit %u)",
                         (unsigned long long)n_tensors, (unsigned long long)remaining(c),
                         (unsigned)DSII_GGUF_MAX_TENSORS);

    /* ---- metadata ---- */
    uint64_t align = DSII_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        snprintf(c->what, sizeof c->what, "metadata entry %llu key", (unsigned long long)i);
        uint64_t ko, kl;
        if ((st = read_string(c, DSII_GGUF_MAX_KEY_LEN, "key", &ko, &kl)) != DSI_OK) return st;
        const char *key = (const char *)g->arena + ko;
        safe_name(nm, key, (size_t)kl);
        if (kl == 0)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "metadata entry %llu has an empty key",
                             (unsigned long long)i);
        if (memchr(key, 0, (size_t)kl))
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "key '%s' contains a NUL byte", nm);
        snprintf(c->what, sizeof c->what, "key '%s'", nm);
        uint32_t type;
        if ((st = cur_u32(c, &type)) != DSI_OK) return st;
        if (type >= DSII_GGUF_N_TYPES)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "key '%s' has unknown value type %u", nm,
                             (unsigned)type);
        size_t cap2 = g->cap_kv;
        if (!grow(g->ctx, (void **)&g->kv_name, &g->cap_kv, g->n_kv + 1, sizeof *g->kv_name) ||
            !grow(g->ctx, (void **)&g->kv_val, &cap2, g->n_kv + 1, sizeof *g->kv_val))
            return oom(c);
        uint64_t vi;
        if ((st = new_vals(c, 1, &vi)) != DSI_OK) return st;
        g->kv_name[g->n_kv].off = ko;
        g->kv_name[g->n_kv].len = kl;
        g->kv_val[g->n_kv] = vi;
        g->n_kv++;
        if ((st = read_value(c, type, vi, 0)) != DSI_OK) return st;
    }
    if (!hash_build(g->ctx, &g->kv_hash, &g->kv_hash_cap, g->n_kv)) return oom(c);
    for (size_t i = 0; i < g->n_kv; i++) {
        int64_t dup = hash_insert(g->kv_hash, g->kv_hash_cap, g->arena, g->kv_name, (uint32_t)i);
        if (dup >= 0) {
            safe_name(nm, (const char *)g->arena + g->kv_name[i].off, (size_t)g->kv_name[i].len);
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                             "duplicate key '%s' (metadata entries %lld and %zu)", nm,
                             (long long)dup, i);
        }
    }
    int64_t ai = dsii_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        const dsii_gguf_value *v = &g->vals[g->kv_val[ai]];
        uint64_t a = 0;
        if (!val_to_u64(v, &a) || a == 0 || (a & (a - 1)) != 0 || a > DSII_GGUF_MAX_ALIGNMENT) {
            char vb[64];
            if (v->type == DSII_GGUF_STRING || v->type == DSII_GGUF_ARRAY)
                snprintf(vb, sizeof vb, "of type %s", k_vtype_names[v->type]);
            else if (is_signed_type(v->type))
                snprintf(vb, sizeof vb, "%lld", (long long)v->s.i);
            else if (v->type == DSII_GGUF_F32 || v->type == DSII_GGUF_F64)
                snprintf(vb, sizeof vb, "%g", v->s.f);
            else
                snprintf(vb, sizeof vb, "%llu", (unsigned long long)v->s.u);
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                             "key 'general.alignment' has value %s, expected a power of two in "
                             "1..%u",
                             vb, (unsigned)DSII_GGUF_MAX_ALIGNMENT);
        }
        align = a;
    }
    g->alignment = (uint32_t)align;

    /* ---- tensor infos ---- */
    for (uint64_t i = 0; i < n_tensors; i++) {
        snprintf(c->what, sizeof c->what, "tensor info %llu name", (unsigned long long)i);
        uint64_t no, nl;
        if ((st = read_string(c, DSII_GGUF_MAX_KEY_LEN, "tensor name", &no, &nl)) != DSI_OK)
            return st;
        const char *name = (const char *)g->arena + no;
        safe_name(nm, name, (size_t)nl);
        if (nl == 0)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "tensor info %llu has an empty name",
                             (unsigned long long)i);
        if (memchr(name, 0, (size_t)nl))
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "tensor '%s' name contains a NUL byte",
                             nm);
        snprintf(c->what, sizeof c->what, "tensor '%s'", nm);
        size_t need = g->n_tensors + 1, cap2 = g->cap_tensors;
        if (!grow(g->ctx, (void **)&g->tensors, &g->cap_tensors, need, sizeof *g->tensors) ||
            !grow(g->ctx, (void **)&g->t_name, &cap2, need, sizeof *g->t_name))
            return oom(c);
        dsii_gguf_tensor *t = &g->tensors[g->n_tensors];
        memset(t, 0, sizeof *t);
        g->t_name[g->n_tensors].off = no;
        g->t_name[g->n_tensors].len = nl;
        g->n_tensors++;

        uint32_t nd;
        if ((st = cur_u32(c, &nd)) != DSI_OK) return st;
        if (nd < 1 || nd > DSII_GGUF_MAX_DIMS)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                             "tensor '%s' has %u dimensions, expected 1..%d", nm, (unsigned)nd,
                             DSII_GGUF_MAX_DIMS);
        t->n_dims = nd;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        uint64_t nel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            if ((st = cur_u64(c, &v)) != DSI_OK) return st;
            if (v == 0 || v > (uint64_t)INT64_MAX)
                return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                                 "tensor '%s' has invalid size %llu in dimension %u", nm,
                                 (unsigned long long)v, (unsigned)d);
            if (!dsii_mul_u64(nel, v, &nel) || nel > (uint64_t)INT64_MAX)
                return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                                 "tensor '%s' element count overflows (dimension %u = %llu)", nm,
                                 (unsigned)d, (unsigned long long)v);
            t->ne[d] = (int64_t)v;
        }
        t->n_elements = nel;
        uint32_t type;
        if ((st = cur_u32(c, &type)) != DSI_OK) return st;
        const dsii_type_traits *tt = dsii_type_get((int32_t)type);
        if (type > INT32_MAX || !tt)
            return dsii_fail(c->err, DSI_ERR_UNSUPPORTED, "tensor '%s' has unsupported type %u",
                             nm, (unsigned)type);
        t->type = (int32_t)type;
        if (tt->row_multiple && (uint64_t)t->ne[0] % tt->blck != 0)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                             "tensor '%s' has ne[0] = %lld, not a multiple of the %s block size %u",
                             nm, (long long)t->ne[0], tt->name, (unsigned)tt->blck);
        if (!dsii_type_nbytes(t->type, t->ne, nd, &t->nbytes))
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT, "tensor '%s' byte size overflows", nm);
        if ((st = cur_u64(c, &t->rel_offset)) != DSI_OK) return st;
        if (t->rel_offset % align != 0)
            return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                             "tensor '%s' offset %llu is not a multiple of the alignment %llu", nm,
                             (unsigned long long)t->rel_offset, (unsigned long long)align);
    }

    /* ---- data section ---- */
    uint64_t data = c->pos;
    if (data % align) data += align - data % align; /* pos <= header limit: no overflow */
    g->data_offset = data;

    if (g->n_tensors > 0) {
        for (size_t i = 0; i < g->n_tensors; i++)
            g->tensors[i].name = (const char *)g->arena + g->t_name[i].off;
        if (!hash_build(g->ctx, &g->t_hash, &g->t_hash_cap, g->n_tensors)) return oom(c);
        for (size_t i = 0; i < g->n_tensors; i++) {
            int64_t dup = hash_insert(g->t_hash, g->t_hash_cap, g->arena, g->t_name, (uint32_t)i);
            if (dup >= 0) {
                safe_name(nm, g->tensors[i].name, (size_t)g->t_name[i].len);
                return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                                 "duplicate tensor name '%s' (tensor infos %lld and %zu)", nm,
                                 (long long)dup, i);
            }
        }
        for (size_t i = 0; i < g->n_tensors; i++) {
            dsii_gguf_tensor *t = &g->tensors[i];
            safe_name(nm, t->name, (size_t)g->t_name[i].len);
            if (!dsii_add_u64(data, t->rel_offset, &t->offset) ||
                !dsii_file_range_ok(c->f, t->offset, t->nbytes))
                return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                                 "tensor '%s' data (%llu bytes at data offset %llu) lies outside "
                                 "the file (data section %llu..%llu)",
                                 nm, (unsigned long long)t->nbytes,
                                 (unsigned long long)t->rel_offset, (unsigned long long)data,
                                 (unsigned long long)c->size);
        }
        uint32_t *idx = dsii_malloc(g->ctx, g->n_tensors * sizeof *idx);
        if (!idx) return oom(c);
        for (size_t i = 0; i < g->n_tensors; i++) idx[i] = (uint32_t)i;
        sort_by_offset(idx, g->n_tensors, g->tensors);
        for (size_t k = 1; k < g->n_tensors; k++) {
            const dsii_gguf_tensor *a = &g->tensors[idx[k - 1]], *b = &g->tensors[idx[k]];
            if (b->offset < a->offset + a->nbytes) {
                char nb2[100];
                safe_name(nm, a->name, (size_t)g->t_name[idx[k - 1]].len);
                safe_name(nb2, b->name, (size_t)g->t_name[idx[k]].len);
                dsii_free(g->ctx, idx);
                return dsii_fail(c->err, DSI_ERR_BAD_FORMAT,
                                 "tensors '%s' (data offset %llu, %llu bytes) and '%s' (data "
                                 "offset %llu) overlap",
                                 nm, (unsigned long long)a->rel_offset,
                                 (unsigned long long)a->nbytes, nb2,
                                 (unsigned long long)b->rel_offset);
            }
        }
        dsii_free(g->ctx, idx);
    }
    return DSI_OK;
}

static void gguf_free(dsii_gguf *g) {
    if (!g) return;
    const dsi_context *ctx = g->ctx;
    dsii_free(ctx, g->arena);
    dsii_free(ctx, g->kv_name);
    dsii_free(ctx, g->kv_val);
    dsii_free(ctx, g->vals);
    dsii_free(ctx, g->tensors);
    dsii_free(ctx, g->t_name);
    dsii_free(ctx, g->kv_hash);
    dsii_free(ctx, g->t_hash);
    dsii_file_close(g->f);
    dsii_free(ctx, g);
}

dsi_status dsii_gguf_open(dsii_file *f, dsii_gguf **out, dsii_error *err) {
    if (out) *out = NULL;
    if (!f || !out) {
        dsii_file_close(f);
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "dsii_gguf_open: NULL argument");
    }
    const dsi_context *ctx = dsii_file_context(f);
    dsii_gguf *g = dsii_calloc(ctx, 1, sizeof *g);
    if (!g) {
        dsii_file_close(f);
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory opening GGUF");
    }
    g->ctx = ctx;
    g->f = f;
    g->alignment = DSII_GGUF_DEFAULT_ALIGNMENT;

    cursor c;
    memset(&c, 0, sizeof c);
    c.g = g;
    c.f = f;
    c.size = dsii_file_size(f);
    c.err = err;
    c.map = dsii_file_map(f, 0, c.size);
    if (!c.map && c.size > 0) {
        c.buf = dsii_malloc(ctx, RDBUF_SIZE);
        if (!c.buf) {
            gguf_free(g);
            return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "out of memory opening GGUF");
        }
    }
    dsi_status st = parse(&c);
    dsii_free(ctx, c.buf);
    if (st != DSI_OK) {
        gguf_free(g);
        return st;
    }
    *out = g;
    return DSI_OK;
}

dsi_status dsii_gguf_open_path(const dsi_context *ctx, const char *path, int32_t mode,
                               dsii_gguf **out, dsii_error *err) {
    dsii_file *f;
    if (out) *out = NULL;
    dsi_status st = dsii_file_open(ctx, path, mode, &f, err);
    if (st != DSI_OK) return st;
    return dsii_gguf_open(f, out, err);
}

dsi_status dsii_gguf_open_reader(const dsi_context *ctx, const dsi_reader *reader,
                                 dsii_gguf **out, dsii_error *err) {
    dsii_file *f;
    if (out) *out = NULL;
    dsi_status st = dsii_file_open_reader(ctx, reader, &f, err);
    if (st != DSI_OK) return st;
    return dsii_gguf_open(f, out, err);
}

dsi_status dsii_gguf_open_memory(const dsi_context *ctx, const void *data, size_t size,
                                 dsii_gguf **out, dsii_error *err) {
    dsii_file *f;
    if (out) *out = NULL;
    dsi_status st = dsii_file_open_memory(ctx, data, size, &f, err);
    if (st != DSI_OK) return st;
    return dsii_gguf_open(f, out, err);
}

void dsii_gguf_close(dsii_gguf *g) { gguf_free(g); }

uint32_t dsii_gguf_version(const dsii_gguf *g) { return g ? g->version : 0; }
uint32_t dsii_gguf_alignment(const dsii_gguf *g) { return g ? g->alignment : 0; }
uint64_t dsii_gguf_data_offset(const dsii_gguf *g) { return g ? g->data_offset : 0; }
dsii_file *dsii_gguf_file(const dsii_gguf *g) { return g ? g->f : NULL; }

/* ---- metadata lookups ----------------------------------------------------------------- */

int64_t dsii_gguf_n_kv(const dsii_gguf *g) { return g ? (int64_t)g->n_kv : 0; }

int64_t dsii_gguf_find_key(const dsii_gguf *g, const char *key) {
    if (!g || !g->kv_hash) return -1;
    return hash_find(g->kv_hash, g->kv_hash_cap, g->arena, g->kv_name, key);
}

static const dsii_gguf_value *kv_value(const dsii_gguf *g, int64_t i) {
    if (!g || i < 0 || (uint64_t)i >= g->n_kv) return NULL;
    return &g->vals[g->kv_val[i]];
}

const char *dsii_gguf_kv_key(const dsii_gguf *g, int64_t i) {
    if (!kv_value(g, i)) return NULL;
    return (const char *)g->arena + g->kv_name[i].off;
}

uint32_t dsii_gguf_kv_type(const dsii_gguf *g, int64_t i) {
    const dsii_gguf_value *v = kv_value(g, i);
    return v ? v->type : UINT32_MAX;
}

const dsii_gguf_value *dsii_gguf_kv_val(const dsii_gguf *g, int64_t kv) { return kv_value(g, kv); }
uint32_t dsii_gguf_val_type(const dsii_gguf_value *v) { return v ? v->type : UINT32_MAX; }
uint32_t dsii_gguf_val_arr_type(const dsii_gguf_value *v) {
    return v && v->type == DSII_GGUF_ARRAY ? v->arr_type : UINT32_MAX;
}
uint64_t dsii_gguf_val_arr_len(const dsii_gguf_value *v) {
    return v && v->type == DSII_GGUF_ARRAY ? v->n : 0;
}
const dsii_gguf_value *dsii_gguf_val_arr_elem(const dsii_gguf *g, const dsii_gguf_value *v,
                                              uint64_t i) {
    if (!g || !v || v->type != DSII_GGUF_ARRAY || v->arr_type != DSII_GGUF_ARRAY || i >= v->n)
        return NULL;
    return &g->vals[v->off + i];
}

int dsii_gguf_val_as_i64(const dsii_gguf_value *v, int64_t *out) {
    if (!v || !out) return 0;
    if (is_signed_type(v->type)) *out = v->s.i;
    else if (is_int_type(v->type) || v->type == DSII_GGUF_BOOL) *out = (int64_t)v->s.u;
    else if (v->type == DSII_GGUF_F32 || v->type == DSII_GGUF_F64) *out = (int64_t)v->s.f;
    else return 0;
    return 1;
}
int dsii_gguf_val_as_u64(const dsii_gguf_value *v, uint64_t *out) {
    if (!v || !out) return 0;
    if (is_signed_type(v->type)) *out = (uint64_t)v->s.i;
    else if (is_int_type(v->type) || v->type == DSII_GGUF_BOOL) *out = v->s.u;
    else if (v->type == DSII_GGUF_F32 || v->type == DSII_GGUF_F64) *out = (uint64_t)v->s.f;
    else return 0;
    return 1;
}
int dsii_gguf_val_as_f64(const dsii_gguf_value *v, double *out) {
    if (!v || !out) return 0;
    if (is_signed_type(v->type)) *out = (double)v->s.i;
    else if (is_int_type(v->type) || v->type == DSII_GGUF_BOOL) *out = (double)v->s.u;
    else if (v->type == DSII_GGUF_F32 || v->type == DSII_GGUF_F64) *out = v->s.f;
    else return 0;
    return 1;
}

/* Integer value of an int/bool value as (negative?, magnitude). */
static int val_int(const dsii_gguf_value *v, int *neg, uint64_t *mag) {
    if (is_signed_type(v->type)) {
        *neg = v->s.i < 0;
        *mag = v->s.i < 0 ? (uint64_t)0 - (uint64_t)v->s.i : (uint64_t)v->s.i;
        return 1;
    }
    if (is_int_type(v->type) || v->type == DSII_GGUF_BOOL) {
        *neg = 0;
        *mag = v->s.u;
        return 1;
    }
    return 0;
}

static int val_to_u64(const dsii_gguf_value *v, uint64_t *out) {
    int neg = 0;
    uint64_t m = 0;
    if (!val_int(v, &neg, &m) || neg) return 0;
    *out = m;
    return 1;
}

static dsi_status find_or_fail(const dsii_gguf *g, const char *key, const dsii_gguf_value **v,
                               dsii_error *err) {
    if (!g || !key) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "NULL GGUF or key");
    int64_t i = dsii_gguf_find_key(g, key);
    if (i < 0) return dsii_fail(err, DSI_ERR_NOT_FOUND, "key %s not found", key);
    *v = &g->vals[g->kv_val[i]];
    return DSI_OK;
}

static void render_scalar(const dsii_gguf_value *v, char *buf, size_t cap) {
    if (is_signed_type(v->type)) snprintf(buf, cap, "%lld", (long long)v->s.i);
    else if (v->type == DSII_GGUF_BOOL) snprintf(buf, cap, "%s", v->s.u ? "true" : "false");
    else if (is_int_type(v->type)) snprintf(buf, cap, "%llu", (unsigned long long)v->s.u);
    else if (v->type == DSII_GGUF_F32) snprintf(buf, cap, "%.9g", v->s.f);
    else if (v->type == DSII_GGUF_F64) snprintf(buf, cap, "%.17g", v->s.f);
    else snprintf(buf, cap, "(%s)", dsii_gguf_value_type_name(v->type));
}

/* Converts an integer/bool value to the range [lo_neg_mag (as -mag), hi]. */
static dsi_status get_int(const dsii_gguf *g, const char *key, const char *tname, int allow_neg,
                          uint64_t neg_max, uint64_t pos_max, int *neg, uint64_t *mag,
                          dsii_error *err) {
    const dsii_gguf_value *v = NULL;
    dsi_status st = find_or_fail(g, key, &v, err);
    if (st != DSI_OK) return st;
    if (!val_int(v, neg, mag))
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s, expected %s", key,
                         dsii_gguf_value_type_name(v->type), tname);
    if ((*neg && (!allow_neg || *mag > neg_max)) || (!*neg && *mag > pos_max)) {
        char vb[48];
        render_scalar(v, vb, sizeof vb);
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s value %s out of range for %s", key, vb,
                         tname);
    }
    return DSI_OK;
}

dsi_status dsii_gguf_get_u32(const dsii_gguf *g, const char *key, uint32_t *out,
                             dsii_error *err) {
    int neg = 0;
    uint64_t m = 0;
    dsi_status st = get_int(g, key, "u32", 0, 0, UINT32_MAX, &neg, &m, err);
    if (st == DSI_OK && out) *out = (uint32_t)m;
    return st;
}
dsi_status dsii_gguf_get_i32(const dsii_gguf *g, const char *key, int32_t *out,
                             dsii_error *err) {
    int neg = 0;
    uint64_t m = 0;
    dsi_status st = get_int(g, key, "i32", 1, (uint64_t)INT32_MAX + 1, INT32_MAX, &neg, &m, err);
    if (st == DSI_OK && out) *out = neg ? (int32_t)(-(int64_t)m) : (int32_t)m;
    return st;
}
dsi_status dsii_gguf_get_u64(const dsii_gguf *g, const char *key, uint64_t *out,
                             dsii_error *err) {
    int neg = 0;
    uint64_t m = 0;
    dsi_status st = get_int(g, key, "u64", 0, 0, UINT64_MAX, &neg, &m, err);
    if (st == DSI_OK && out) *out = m;
    return st;
}
dsi_status dsii_gguf_get_i64(const dsii_gguf *g, const char *key, int64_t *out,
                             dsii_error *err) {
    int neg = 0;
    uint64_t m = 0;
    dsi_status st =
        get_int(g, key, "i64", 1, (uint64_t)INT64_MAX + 1, (uint64_t)INT64_MAX, &neg, &m, err);
    if (st == DSI_OK && out)
        *out = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
    return st;
}

dsi_status dsii_gguf_get_f64(const dsii_gguf *g, const char *key, double *out,
                             dsii_error *err) {
    const dsii_gguf_value *v = NULL;
    dsi_status st = find_or_fail(g, key, &v, err);
    if (st != DSI_OK) return st;
    if (v->type != DSII_GGUF_F32 && v->type != DSII_GGUF_F64)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s, expected f32", key,
                         dsii_gguf_value_type_name(v->type));
    if (out) *out = v->s.f;
    return DSI_OK;
}
dsi_status dsii_gguf_get_f32(const dsii_gguf *g, const char *key, float *out,
                             dsii_error *err) {
    double d = 0;
    dsi_status st = dsii_gguf_get_f64(g, key, &d, err);
    if (st == DSI_OK && out) *out = (float)d;
    return st;
}

dsi_status dsii_gguf_get_bool(const dsii_gguf *g, const char *key, int *out, dsii_error *err) {
    const dsii_gguf_value *v = NULL;
    dsi_status st = find_or_fail(g, key, &v, err);
    if (st != DSI_OK) return st;
    int neg = 0;
    uint64_t m = 0;
    if (!val_int(v, &neg, &m))
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s, expected bool", key,
                         dsii_gguf_value_type_name(v->type));
    if (neg || m > 1) {
        char vb[48];
        render_scalar(v, vb, sizeof vb);
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s value %s out of range for bool", key,
                         vb);
    }
    if (out) *out = (int)m;
    return DSI_OK;
}

dsi_status dsii_gguf_get_string(const dsii_gguf *g, const char *key, const char **out,
                                size_t *len, dsii_error *err) {
    const dsii_gguf_value *v = NULL;
    dsi_status st = find_or_fail(g, key, &v, err);
    if (st != DSI_OK) return st;
    if (v->type != DSII_GGUF_STRING)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s, expected string", key,
                         dsii_gguf_value_type_name(v->type));
    if (out) *out = (const char *)g->arena + v->off;
    if (len) *len = (size_t)v->n;
    return DSI_OK;
}

dsi_status dsii_gguf_get_array(const dsii_gguf *g, const char *key, uint32_t *elem_type,
                               uint64_t *n, dsii_error *err) {
    const dsii_gguf_value *v = NULL;
    dsi_status st = find_or_fail(g, key, &v, err);
    if (st != DSI_OK) return st;
    if (v->type != DSII_GGUF_ARRAY)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s, expected array", key,
                         dsii_gguf_value_type_name(v->type));
    if (elem_type) *elem_type = v->arr_type;
    if (n) *n = v->n;
    return DSI_OK;
}

/* Element i of a numeric array as a value (decoded from the arena). */
static void arr_elem_val(const dsii_gguf *g, const dsii_gguf_value *a, uint64_t i,
                         dsii_gguf_value *e) {
    unsigned sz = k_vtype_size[a->arr_type];
    const uint8_t *p = g->arena + a->off + i * sz;
    memset(e, 0, sizeof *e);
    e->type = a->arr_type;
    e->arr_type = UINT32_MAX;
    switch (a->arr_type) {
    case DSII_GGUF_U8: { uint8_t x; memcpy(&x, p, 1); e->s.u = x; break; }
    case DSII_GGUF_BOOL: { uint8_t x; memcpy(&x, p, 1); e->s.u = x; break; }
    case DSII_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); e->s.u = x; break; }
    case DSII_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); e->s.u = x; break; }
    case DSII_GGUF_U64: { uint64_t x; memcpy(&x, p, 8); e->s.u = x; break; }
    case DSII_GGUF_I8: { int8_t x; memcpy(&x, p, 1); e->s.i = x; break; }
    case DSII_GGUF_I16: { int16_t x; memcpy(&x, p, 2); e->s.i = x; break; }
    case DSII_GGUF_I32: { int32_t x; memcpy(&x, p, 4); e->s.i = x; break; }
    case DSII_GGUF_I64: { int64_t x; memcpy(&x, p, 8); e->s.i = x; break; }
    case DSII_GGUF_F32: { float x; memcpy(&x, p, 4); e->s.f = x; break; }
    case DSII_GGUF_F64: { double x; memcpy(&x, p, 8); e->s.f = x; break; }
    default: break;
    }
}

enum { CV_U32, CV_I32, CV_U64, CV_I64, CV_F32 };

static dsi_status get_arr(const dsii_gguf *g, const char *key, int kind, void *dst, size_t cap,
                          uint64_t *n_out, dsii_error *err) {
    static const char *const names[] = {"u32", "i32", "u64", "i64", "f32"};
    const dsii_gguf_value *v = NULL;
    dsi_status st = find_or_fail(g, key, &v, err);
    if (st != DSI_OK) return st;
    if (v->type != DSII_GGUF_ARRAY)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s, expected %s array", key,
                         dsii_gguf_value_type_name(v->type), names[kind]);
    int want_float = kind == CV_F32;
    int is_float = v->arr_type == DSII_GGUF_F32 || v->arr_type == DSII_GGUF_F64;
    int is_int = is_int_type(v->arr_type) || v->arr_type == DSII_GGUF_BOOL;
    if (want_float ? !is_float : !is_int)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s has type %s array, expected %s array",
                         key, dsii_gguf_value_type_name(v->arr_type), names[kind]);
    if (n_out) *n_out = v->n;
    if (v->n > cap)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "key %s has %llu elements, buffer holds %zu",
                         key, (unsigned long long)v->n, cap);
    /* validate everything first so nothing is written on failure */
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < v->n; i++) {
            dsii_gguf_value e;
            arr_elem_val(g, v, i, &e);
            if (want_float) {
                if (pass) ((float *)dst)[i] = (float)e.s.f;
                continue;
            }
            int neg = 0;
            uint64_t m = 0;
            val_int(&e, &neg, &m);
            uint64_t pmax = kind == CV_U32 ? UINT32_MAX : kind == CV_I32 ? INT32_MAX
                          : kind == CV_U64 ? UINT64_MAX : (uint64_t)INT64_MAX;
            uint64_t nmax = kind == CV_I32 ? (uint64_t)INT32_MAX + 1
                          : kind == CV_I64 ? (uint64_t)INT64_MAX + 1 : 0;
            if ((neg && m > nmax) || (!neg && m > pmax)) {
                char vb[48];
                render_scalar(&e, vb, sizeof vb);
                return dsii_fail(err, DSI_ERR_BAD_FORMAT, "key %s[%llu] value %s out of range for %s",
                                 key, (unsigned long long)i, vb, names[kind]);
            }
            if (!pass) continue;
            switch (kind) {
            case CV_U32: ((uint32_t *)dst)[i] = (uint32_t)m; break;
            case CV_I32: ((int32_t *)dst)[i] = neg ? (int32_t)(-(int64_t)m) : (int32_t)m; break;
            case CV_U64: ((uint64_t *)dst)[i] = m; break;
            default:
                ((int64_t *)dst)[i] =
                    neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
                break;
            }
        }
    }
    return DSI_OK;
}

dsi_status dsii_gguf_get_arr_u32(const dsii_gguf *g, const char *key, uint32_t *dst, size_t cap,
                                 uint64_t *n, dsii_error *err) {
    return get_arr(g, key, CV_U32, dst, cap, n, err);
}
dsi_status dsii_gguf_get_arr_i32(const dsii_gguf *g, const char *key, int32_t *dst, size_t cap,
                                 uint64_t *n, dsii_error *err) {
    return get_arr(g, key, CV_I32, dst, cap, n, err);
}
dsi_status dsii_gguf_get_arr_u64(const dsii_gguf *g, const char *key, uint64_t *dst, size_t cap,
                                 uint64_t *n, dsii_error *err) {
    return get_arr(g, key, CV_U64, dst, cap, n, err);
}
dsi_status dsii_gguf_get_arr_i64(const dsii_gguf *g, const char *key, int64_t *dst, size_t cap,
                                 uint64_t *n, dsii_error *err) {
    return get_arr(g, key, CV_I64, dst, cap, n, err);
}
dsi_status dsii_gguf_get_arr_f32(const dsii_gguf *g, const char *key, float *dst, size_t cap,
                                 uint64_t *n, dsii_error *err) {
    return get_arr(g, key, CV_F32, dst, cap, n, err);
}

uint32_t dsii_gguf_arr_type(const dsii_gguf *g, int64_t kv) {
    return dsii_gguf_val_arr_type(kv_value(g, kv));
}
uint64_t dsii_gguf_arr_len(const dsii_gguf *g, int64_t kv) {
    return dsii_gguf_val_arr_len(kv_value(g, kv));
}

static const char *val_arr_str(const dsii_gguf *g, const dsii_gguf_value *v, uint64_t i,
                               size_t *len) {
    if (!v || v->type != DSII_GGUF_ARRAY || v->arr_type != DSII_GGUF_STRING || i >= v->n)
        return NULL;
    uint64_t so, sl;
    memcpy(&so, g->arena + v->off + 16 * i, 8);
    memcpy(&sl, g->arena + v->off + 16 * i + 8, 8);
    if (len) *len = (size_t)sl;
    return (const char *)g->arena + so;
}

const char *dsii_gguf_arr_str(const dsii_gguf *g, int64_t kv, uint64_t i, size_t *len) {
    return val_arr_str(g, kv_value(g, kv), i, len);
}

const void *dsii_gguf_arr_data(const dsii_gguf *g, int64_t kv) {
    const dsii_gguf_value *v = kv_value(g, kv);
    if (!v || v->type != DSII_GGUF_ARRAY || v->arr_type == DSII_GGUF_STRING ||
        v->arr_type == DSII_GGUF_ARRAY)
        return NULL;
    return g->arena + v->off;
}

/* ---- rendering ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *buf;
    size_t cap;
    size_t len; /* full length, even past cap */
} sbuf;

static void sb_put(sbuf *s, const char *p, size_t n) {
    if (s->buf && s->cap > 0 && s->len < s->cap - 1) {
        size_t room = s->cap - 1 - s->len;
        memcpy(s->buf + s->len, p, n < room ? n : room);
    }
    s->len += n;
}
static void sb_str(sbuf *s, const char *p) { sb_put(s, p, strlen(p)); }

#define RENDER_MAX_ELEMS 64

static void render_value(const dsii_gguf *g, const dsii_gguf_value *v, sbuf *s) {
    char tmp[64];
    if (v->type == DSII_GGUF_STRING) {
        sb_put(s, (const char *)g->arena + v->off, (size_t)v->n);
        return;
    }
    if (v->type != DSII_GGUF_ARRAY) {
        render_scalar(v, tmp, sizeof tmp);
        sb_str(s, tmp);
        return;
    }
    sb_str(s, "[");
    uint64_t shown = v->n < RENDER_MAX_ELEMS ? v->n : RENDER_MAX_ELEMS;
    for (uint64_t i = 0; i < shown; i++) {
        if (i) sb_str(s, ", ");
        if (v->arr_type == DSII_GGUF_STRING) {
            size_t len = 0;
            const char *p = val_arr_str(g, v, i, &len);
            sb_put(s, p, len);
        } else if (v->arr_type == DSII_GGUF_ARRAY) {
            render_value(g, &g->vals[v->off + i], s);
        } else {
            dsii_gguf_value e;
            arr_elem_val(g, v, i, &e);
            render_scalar(&e, tmp, sizeof tmp);
            sb_str(s, tmp);
        }
    }
    if (v->n > shown) sb_str(s, ", \xE2\x80\xA6"); /* U+2026 */
    sb_str(s, "]");
}

int dsii_gguf_kv_render(const dsii_gguf *g, int64_t i, char *buf, size_t cap, size_t *needed) {
    const dsii_gguf_value *v = kv_value(g, i);
    if (!v) return 0;
    sbuf s = {buf, cap, 0};
    render_value(g, v, &s);
    if (buf && cap > 0) buf[s.len < cap - 1 ? s.len : cap - 1] = '\0';
    if (needed) *needed = s.len;
    return 1;
}

/* ---- tensors -------------------------------------------------------------------------- */

int64_t dsii_gguf_n_tensors(const dsii_gguf *g) { return g ? (int64_t)g->n_tensors : 0; }

const dsii_gguf_tensor *dsii_gguf_tensor_at(const dsii_gguf *g, int64_t i) {
    if (!g || i < 0 || (uint64_t)i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const dsii_gguf_tensor *dsii_gguf_find_tensor(const dsii_gguf *g, const char *name) {
    if (!g || !g->t_hash || !name) return NULL;
    int64_t i = hash_find(g->t_hash, g->t_hash_cap, g->arena, g->t_name, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

const void *dsii_gguf_tensor_data(const dsii_gguf *g, const dsii_gguf_tensor *t) {
    if (!g || !t) return NULL;
    return dsii_file_map(g->f, t->offset, t->nbytes);
}

dsi_status dsii_gguf_tensor_read(const dsii_gguf *g, const dsii_gguf_tensor *t, uint64_t offset,
                                 uint64_t len, void *dst, dsii_error *err) {
    if (!g || !t) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "NULL GGUF or tensor");
    if (offset > t->nbytes || len > t->nbytes - offset)
        return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT,
                         "read of %llu bytes at offset %llu exceeds tensor '%s' (%llu bytes)",
                         (unsigned long long)len, (unsigned long long)offset, t->name,
                         (unsigned long long)t->nbytes);
    return dsii_file_read(g->f, t->offset + offset, len, dst, err);
}
