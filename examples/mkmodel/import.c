/*
 * dsinfer-mkmodel --import DUMP -o FILE.gguf: writes a GGUF from a typed weights dump (the
 * trained models, tools/train/export.py, docs/trained-models.md). The dump holds metadata
 * values and f32 / i32 tensors; this file quantises the tensors with lib/quant (through the
 * writer's add_tensor_f32) and writes the file with lib/gguf's writer, so the shipped models
 * come out of the same code path as every other file the project writes.
 *
 * Dump format (little-endian): "DSIDUMP1", u32 n_kv, per key: str key, u32 gguf value type
 * (4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array), the value (array: u32 element type, u64 n,
 * elements; str: u64 length + bytes); u32 n_tensors, per tensor: str name, i32 type
 * (DSI_TYPE_*), u32 n_dims, i64 ne[n_dims], then prod(ne) f32 values (i32 for DSI_TYPE_I32).
 */
#define _POSIX_C_SOURCE 200809L
#include "mkmodel.h"

#include "base/base.h"
#include "gguf/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rd {
    const uint8_t *p;
    size_t n, off;
    int bad;
} rd;

static int take(rd *r, void *dst, size_t n) {
    if (r->bad || n > r->n - r->off) {
        r->bad = 1;
        return 0;
    }
    memcpy(dst, r->p + r->off, n);
    r->off += n;
    return 1;
}

static uint32_t u32(rd *r) {
    uint32_t v = 0;
    take(r, &v, 4);
    return v;
}

static uint64_t u64(rd *r) {
    uint64_t v = 0;
    take(r, &v, 8);
    return v;
}

/* A string view into the dump (not NUL-terminated); NULL on a short read. */
static const char *str(rd *r, size_t *len) {
    uint64_t n = u64(r);
    if (r->bad || n > r->n - r->off) {
        r->bad = 1;
        return NULL;
    }
    const char *s = (const char *)(r->p + r->off);
    r->off += (size_t)n;
    *len = (size_t)n;
    return s;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static size_t elem_size(uint32_t t) {
    switch (t) {
    case DSII_GGUF_U32: case DSII_GGUF_I32: case DSII_GGUF_F32: return 4;
    case DSII_GGUF_U64: return 8;
    default: return 0;
    }
}

static int import_kv(rd *r, dsii_gguf_writer *w) {
    dsii_error err;
    size_t kl;
    const char *k = str(r, &kl);
    uint32_t t = u32(r);
    if (r->bad) return 1;
    char *key = dup_n(k, kl);
    if (!key) return 1;
    dsi_status st = DSI_OK;
    if (t == DSII_GGUF_U32) {
        st = dsii_gguf_writer_add_u32(w, key, u32(r), &err);
    } else if (t == DSII_GGUF_I32) {
        st = dsii_gguf_writer_add_i32(w, key, (int32_t)u32(r), &err);
    } else if (t == DSII_GGUF_F32) {
        float f = 0.0f;
        take(r, &f, 4);
        st = dsii_gguf_writer_add_f32(w, key, f, &err);
    } else if (t == DSII_GGUF_BOOL) {
        uint8_t b = 0;
        take(r, &b, 1);
        st = dsii_gguf_writer_add_bool(w, key, b, &err);
    } else if (t == DSII_GGUF_STRING) {
        size_t n;
        const char *s = str(r, &n);
        if (s) st = dsii_gguf_writer_add_string_n(w, key, s, n, &err);
    } else if (t == DSII_GGUF_ARRAY) {
        uint32_t et = u32(r);
        uint64_t n = u64(r);
        if (r->bad || n > r->n) {
            r->bad = 1;
        } else if (et == DSII_GGUF_STRING) {
            const char **s = malloc(sizeof *s * (size_t)(n ? n : 1));
            size_t *l = malloc(sizeof *l * (size_t)(n ? n : 1));
            if (!s || !l) r->bad = 1;
            for (uint64_t i = 0; i < n && !r->bad; i++) s[i] = str(r, &l[i]);
            if (!r->bad) st = dsii_gguf_writer_add_string_array(w, key, s, l, n, &err);
            free(s);
            free(l);
        } else if (elem_size(et) && n <= (r->n - r->off) / elem_size(et)) {
            st = dsii_gguf_writer_add_array(w, key, et, r->p + r->off, n, &err);
            r->off += (size_t)n * elem_size(et);
        } else {
            r->bad = 1;
        }
    } else {
        fprintf(stderr, "dsinfer-mkmodel: --import: key '%s' has unsupported type %u\n", key, t);
        free(key);
        return 1;
    }
    if (st != DSI_OK) fprintf(stderr, "dsinfer-mkmodel: --import: %s\n", err.msg);
    free(key);
    return r->bad || st != DSI_OK;
}

static int import_tensor(rd *r, dsii_gguf_writer *w) {
    dsii_error err;
    size_t nl;
    const char *nm = str(r, &nl);
    int32_t type = (int32_t)u32(r);
    uint32_t nd = u32(r);
    int64_t ne[4] = {1, 1, 1, 1};
    if (r->bad || nd < 1 || nd > 4) return 1;
    uint64_t count = 1;
    for (uint32_t i = 0; i < nd; i++) {
        ne[i] = (int64_t)u64(r);
        if (ne[i] < 1 || ne[i] > (int64_t)1 << 32) r->bad = 1;
        else count *= (uint64_t)ne[i];
    }
    if (r->bad || count > (r->n - r->off) / 4) return 1;
    char *name = dup_n(nm, nl);
    if (!name) return 1;
    const void *data = r->p + r->off;
    r->off += (size_t)count * 4;
    dsi_status st;
    if (type == DSI_TYPE_I32) {
        st = dsii_gguf_writer_add_tensor(w, name, type, nd, ne, data, count * 4, &err);
    } else {
        /* the dump is not necessarily 4-byte aligned in memory: copy the floats */
        float *f = malloc((size_t)count * sizeof *f);
        if (!f) {
            free(name);
            return 1;
        }
        memcpy(f, data, (size_t)count * 4);
        st = dsii_gguf_writer_add_tensor_f32(w, name, type, nd, ne, f, &err);
        free(f);
    }
    if (st != DSI_OK) fprintf(stderr, "dsinfer-mkmodel: --import: tensor '%s': %s\n", name, err.msg);
    free(name);
    return st != DSI_OK;
}

int mk_import(const char *dump, const char *out, const char *also) {
    FILE *f = fopen(dump, "rb");
    if (!f) {
        fprintf(stderr, "dsinfer-mkmodel: cannot open %s\n", dump);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : (size_t)1 << 20;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return 1;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    rd r = {buf, n, 0, 0};
    char magic[8];
    int rc = 0;
    if (!take(&r, magic, 8) || memcmp(magic, "DSIDUMP1", 8)) {
        fprintf(stderr, "dsinfer-mkmodel: %s is not a weights dump\n", dump);
        free(buf);
        return 1;
    }
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    if (!w) {
        free(buf);
        return 1;
    }
    uint32_t nkv = u32(&r);
    for (uint32_t i = 0; i < nkv && !rc; i++) rc = import_kv(&r, w);
    uint32_t nt = rc ? 0 : u32(&r);
    for (uint32_t i = 0; i < nt && !rc; i++) rc = import_tensor(&r, w);
    if (!rc && (r.bad || r.off != r.n)) rc = 1;
    if (rc) fprintf(stderr, "dsinfer-mkmodel: %s: malformed dump (at byte %zu of %zu)\n", dump, r.off, r.n);
    dsii_error err;
    for (int k = 0; k < 2 && !rc; k++) {
        const char *path = k ? also : out;
        if (!path) continue;
        if (dsii_gguf_writer_write_path(w, path, &err) != DSI_OK) {
            fprintf(stderr, "dsinfer-mkmodel: %s\n", err.msg);
            remove(path);
            rc = 1;
        }
    }
    if (!rc)
        fprintf(stderr, "dsinfer-mkmodel: wrote %s (%u keys, %u tensors, %" PRIu64 " bytes) from %s\n", out, nkv,
                nt, dsii_gguf_writer_size(w), dump);
    dsii_gguf_writer_free(w);
    free(buf);
    return rc;
}
