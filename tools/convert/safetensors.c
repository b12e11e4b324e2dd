/* Strict safetensors reading (safetensors.h). JSON through jansson. */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} k_dtypes[ST_N_DTYPES] = {
    [ST_F64] = {"F64", 8},       [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},     [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},       [ST_I8] = {"I8", 1},     [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},     [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_F8_E8M0] = {"F8_E8M0", 1},
};

const char *st_dtype_name(int d) { return d >= 0 && d < ST_N_DTYPES ? k_dtypes[d].name : "?"; }
size_t st_dtype_size(int d) { return d >= 0 && d < ST_N_DTYPES ? k_dtypes[d].size : 0; }

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && cap) vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

uint64_t st_numel(const st_tensor *t) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) n *= (uint64_t)t->shape[i];
    return n;
}

const char *st_shape_str(const st_tensor *t, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < t->n_dims && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

/* Names are printed with control bytes escaped and cut at 120 characters. */
static const char *safe(const char *s, char *buf, size_t cap) {
    size_t o = 0;
    for (; *s && o + 5 < cap && o < 120; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

void st_header_free(st_header *h) {
    if (!h) return;
    for (size_t i = 0; i < h->n; i++) free(h->t[i].name);
    free(h->t);
    memset(h, 0, sizeof *h);
}

int st_parse_header(const char *json, size_t len, uint64_t data_size, const char *file,
                    st_header *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    char nb[160];
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fail(err, errcap, "%s: safetensors header is not valid JSON: %s (line %d, column %d, byte %d)", file,
                    je.text, je.line, je.column, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return fail(err, errcap, "%s: safetensors header is not a JSON object", file);
    }
    size_t cap = json_object_size(root);
    out->t = calloc(cap ? cap : 1, sizeof *out->t);
    if (!out->t) {
        json_decref(root);
        return fail(err, errcap, "%s: out of memory", file);
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                rc = fail(err, errcap, "%s: __metadata__ is not an object", file);
                break;
            }
            continue;
        }
        safe(key, nb, sizeof nb);
        if (!*key || strlen(key) > 4096) {
            rc = fail(err, errcap, "%s: tensor name '%s' is empty or too long", file, nb);
            break;
        }
        if (!json_is_object(v)) {
            rc = fail(err, errcap, "%s: tensor '%s': entry is not an object", file, nb);
            break;
        }
        json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
               *of = json_object_get(v, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(of)) {
            rc = fail(err, errcap, "%s: tensor '%s': needs \"dtype\" (string), \"shape\" and \"data_offsets\" (arrays)",
                      file, nb);
            break;
        }
        st_tensor *t = &out->t[out->n];
        t->dtype = -1;
        for (int d = 0; d < ST_N_DTYPES; d++)
            if (!strcmp(json_string_value(dt), k_dtypes[d].name)) t->dtype = d;
        if (t->dtype < 0) {
            char db[64];
            rc = fail(err, errcap, "%s: tensor '%s': unknown dtype '%s'", file, nb,
                      safe(json_string_value(dt), db, sizeof db));
            break;
        }
        if (json_array_size(sh) > ST_MAX_DIMS) {
            rc = fail(err, errcap, "%s: tensor '%s': %zu dims (at most %d)", file, nb, json_array_size(sh), ST_MAX_DIMS);
            break;
        }
        t->n_dims = (uint32_t)json_array_size(sh);
        uint64_t numel = 1;
        int bad = 0;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            json_t *x = json_array_get(sh, d);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1ll << 40)) {
                bad = 1;
                break;
            }
            t->shape[d] = json_integer_value(x);
            if (t->shape[d] && numel > UINT64_MAX / (uint64_t)t->shape[d]) {
                bad = 1;
                break;
            }
            numel *= (uint64_t)t->shape[d];
        }
        if (bad) {
            rc = fail(err, errcap, "%s: tensor '%s': bad shape (dims must be integers in 0..2^40)", file, nb);
            break;
        }
        json_t *b = json_array_get(of, 0), *e = json_array_get(of, 1);
        if (json_array_size(of) != 2 || !json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b)) {
            rc = fail(err, errcap, "%s: tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end", file, nb);
            break;
        }
        t->begin = (uint64_t)json_integer_value(b);
        t->end = (uint64_t)json_integer_value(e);
        if (t->end > data_size) {
            rc = fail(err, errcap,
                      "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] beyond the data section (%" PRIu64 " bytes)",
                      file, nb, t->begin, t->end, data_size);
            break;
        }
        const uint64_t es = k_dtypes[t->dtype].size;
        if (numel > UINT64_MAX / es || t->end - t->begin != numel * es) {
            char sb[128];
            rc = fail(err, errcap, "%s: tensor '%s': %s %s needs %" PRIu64 " bytes, data_offsets give %" PRIu64, file, nb,
                      k_dtypes[t->dtype].name, st_shape_str(t, sb, sizeof sb), numel * es, t->end - t->begin);
            break;
        }
        t->name = strdup(key);
        if (!t->name) {
            rc = fail(err, errcap, "%s: out of memory", file);
            break;
        }
        out->n++;
    }
    json_decref(root);
    if (rc == 0 && out->n > 1) {
        st_tensor **o = malloc(sizeof *o * out->n);
        if (!o) rc = fail(err, errcap, "%s: out of memory", file);
        for (size_t i = 0; rc == 0 && i < out->n; i++) o[i] = &out->t[i];
        if (rc == 0) qsort(o, out->n, sizeof *o, cmp_begin);
        for (size_t i = 1; rc == 0 && i < out->n; i++)
            if (o[i]->begin < o[i - 1]->end && o[i]->end > o[i]->begin) {
                char n2[160];
                rc = fail(err, errcap, "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
                          file, safe(o[i - 1]->name, nb, sizeof nb), o[i - 1]->begin, o[i - 1]->end,
                          safe(o[i]->name, n2, sizeof n2), o[i]->begin, o[i]->end);
            }
        free(o);
    }
    if (rc != 0) st_header_free(out);
    return rc;
}

/* ---- checkpoint directories ---------------------------------------------------------------- */

static int read_exact(int fd, void *buf, uint64_t len, uint64_t off) {
    uint8_t *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

static char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int add_file(st_set *s, const char *name, char *err, size_t cap) {
    for (size_t i = 0; i < s->n_files; i++)
        if (!strcmp(s->files[i] + strlen(s->dir) + 1, name)) return (int)i;
    if (strchr(name, '/') || !strcmp(name, "..") || !*name)
        return fail(err, cap, "%s: shard name '%s' is not a file name in the checkpoint folder", s->dir, name);
    char **f = realloc(s->files, sizeof *f * (s->n_files + 1));
    int *fd = realloc(s->fds, sizeof *fd * (s->n_files + 1));
    if (f) s->files = f;
    if (fd) s->fds = fd;
    if (!f || !fd) return fail(err, cap, "out of memory");
    s->files[s->n_files] = path_join(s->dir, name);
    s->fds[s->n_files] = -1;
    if (!s->files[s->n_files]) return fail(err, cap, "out of memory");
    return (int)s->n_files++;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int load_shard(st_set *s, int i, char *err, size_t cap) {
    const char *path = s->files[i];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(err, cap, "%s: cannot open shard: %s", path, strerror(errno));
    s->fds[i] = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return fail(err, cap, "%s: not a regular file", path);
    const uint64_t size = (uint64_t)sb.st_size;
    uint8_t lb[8];
    if (size < 8 || read_exact(fd, lb, 8, 0) != 0)
        return fail(err, cap, "%s: truncated: %" PRIu64 " bytes, a safetensors file starts with an 8-byte length", path,
                    size);
    uint64_t n = 0;
    for (int k = 0; k < 8; k++) n |= (uint64_t)lb[k] << (8 * k);
    if (n > ST_MAX_HEADER || n > size - 8)
        return fail(err, cap, "%s: header length %" PRIu64 " is beyond the file (%" PRIu64 " bytes) or the %llu MiB limit",
                    path, n, size, ST_MAX_HEADER >> 20);
    char *json = malloc((size_t)n + 1);
    if (!json) return fail(err, cap, "%s: out of memory for a %" PRIu64 "-byte header", path, n);
    if (read_exact(fd, json, n, 8) != 0) {
        free(json);
        return fail(err, cap, "%s: read error in the header", path);
    }
    st_header h;
    int rc = st_parse_header(json, (size_t)n, size - 8 - n, path, &h, err, cap);
    free(json);
    if (rc) return rc;
    st_tensor *t = realloc(s->t, sizeof *t * (s->n + h.n + 1));
    if (!t) {
        st_header_free(&h);
        return fail(err, cap, "out of memory");
    }
    s->t = t;
    for (size_t k = 0; k < h.n; k++) {
        h.t[k].shard = i;
        h.t[k].begin += 8 + n; /* absolute from here on */
        h.t[k].end += 8 + n;
        s->t[s->n++] = h.t[k];
    }
    free(h.t);
    return 0;
}

int st_open_dir(const char *dir, st_set *s, char *err, size_t cap) {
    memset(s, 0, sizeof *s);
    s->dir = strdup(dir);
    if (!s->dir) return fail(err, cap, "out of memory");
    char *idx = path_join(dir, "model.safetensors.index.json");
    json_error_t je;
    json_t *root = NULL;
    struct stat sb;
    int rc = 0;
    if (idx && stat(idx, &sb) == 0) {
        root = json_load_file(idx, JSON_REJECT_DUPLICATES, &je);
        if (!root) rc = fail(err, cap, "%s: not valid JSON: %s (line %d, column %d)", idx, je.text, je.line, je.column);
        json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
        if (!rc && !json_is_object(wm)) rc = fail(err, cap, "%s: no \"weight_map\" object", idx);
        const char *key;
        json_t *v;
        if (!rc) json_object_foreach(wm, key, v) {
            if (!json_is_string(v)) {
                rc = fail(err, cap, "%s: weight_map entry '%s' is not a file name", idx, key);
                break;
            }
            if (add_file(s, json_string_value(v), err, cap) < 0) {
                rc = -1;
                break;
            }
        }
        for (size_t i = 0; !rc && i < s->n_files; i++) {
            if (stat(s->files[i], &sb) != 0) {
                /* name a tensor the missing shard should hold */
                const char *who = "?";
                json_object_foreach(wm, key, v) if (!strcmp(json_string_value(v), s->files[i] + strlen(dir) + 1)) {
                    who = key;
                    break;
                }
                rc = fail(err, cap, "%s: missing shard (the index assigns it tensor '%s' and others)", s->files[i], who);
                break;
            }
            rc = load_shard(s, (int)i, err, cap);
        }
        /* every indexed tensor is in the shard the index names, and nothing else is there */
        if (!rc) {
            qsort(s->t, s->n, sizeof *s->t, cmp_name);
            json_object_foreach(wm, key, v) {
                const st_tensor *t = st_find(s, key);
                if (!t) {
                    rc = fail(err, cap, "%s: tensor '%s' (index) is not in the shard", json_string_value(v), key);
                    break;
                }
                if (strcmp(s->files[t->shard] + strlen(dir) + 1, json_string_value(v)) != 0) {
                    rc = fail(err, cap, "%s: tensor '%s' is in shard %s, the index says %s", s->files[t->shard], key,
                              s->files[t->shard], json_string_value(v));
                    break;
                }
            }
            if (!rc && s->n != json_object_size(wm))
                rc = fail(err, cap, "%s: the shards hold %zu tensors, the index lists %zu", idx, s->n,
                          json_object_size(wm));
        }
        json_decref(root);
    } else {
        int i = add_file(s, "model.safetensors", err, cap);
        if (i < 0) rc = -1;
        else if (stat(s->files[i], &sb) != 0)
            rc = fail(err, cap, "%s: no model.safetensors.index.json and no model.safetensors", dir);
        else
            rc = load_shard(s, i, err, cap);
        if (!rc) qsort(s->t, s->n, sizeof *s->t, cmp_name);
    }
    free(idx);
    for (size_t i = 1; !rc && i < s->n; i++)
        if (!strcmp(s->t[i].name, s->t[i - 1].name))
            rc = fail(err, cap, "tensor '%s' appears in two shards (%s, %s)", s->t[i].name, s->files[s->t[i - 1].shard],
                      s->files[s->t[i].shard]);
    if (rc) st_close(s);
    return rc;
}

void st_close(st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) {
        if (s->fds && s->fds[i] >= 0) close(s->fds[i]);
        free(s->files[i]);
    }
    for (size_t i = 0; i < s->n; i++) free(s->t[i].name);
    free(s->files);
    free(s->fds);
    free(s->t);
    free(s->dir);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_find(const st_set *s, const char *name) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(s->t[mid].name, name);
        if (c == 0) return &s->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int st_read(const st_set *s, const st_tensor *t, uint64_t off, uint64_t len, void *dst, char *err, size_t cap) {
    if (off > t->end - t->begin || len > t->end - t->begin - off)
        return fail(err, cap, "%s: read past tensor '%s'", s->files[t->shard], t->name);
    if (read_exact(s->fds[t->shard], dst, len, t->begin + off) != 0)
        return fail(err, cap, "%s: read error in tensor '%s': %s", s->files[t->shard], t->name, strerror(errno));
    return 0;
}
