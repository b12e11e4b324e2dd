/*
 * libFuzzer target for the GGUF reader (lib/gguf/gguf.c) and, through it, lib/base/file.c and
 * the reference dequantizers in lib/quant/. Each input is parsed twice: in memory mode (the
 * mmap code path) and through dsi_reader callbacks (the buffered pread code path); both must
 * agree. A file that opens is then walked completely: every key rendered and looked up with
 * every typed getter, every array element touched, every tensor looked up by name, read, and
 * its first row dequantized.
 *
 * Build: CC=clang cmake -DDSI_FUZZ=ON …; run: tests/fuzz/run.sh BUILD_DIR.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

typedef struct {
    const uint8_t *data;
    uint64_t size;
} fz_reader;

static int32_t fz_pread(void *user, void *buf, uint64_t size, uint64_t offset) {
    fz_reader *r = user;
    if (offset > r->size || size > r->size - offset) return -1;
    memcpy(buf, r->data + offset, (size_t)size);
    return 0;
}

static volatile uint64_t g_sink;

static void walk(dsii_gguf *g) {
    dsii_error e;
    char buf[128];
    size_t need = 0;
    for (int64_t i = 0; i < dsii_gguf_n_kv(g); i++) {
        const char *key = dsii_gguf_kv_key(g, i);
        if (dsii_gguf_find_key(g, key) != i) abort();
        dsii_gguf_kv_render(g, i, buf, sizeof buf, &need);
        dsii_gguf_kv_render(g, i, NULL, 0, &need);
        uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; double d; int b;
        const char *s; size_t len; uint32_t et; uint64_t n;
        dsii_gguf_get_u32(g, key, &u32, &e);
        dsii_gguf_get_i32(g, key, &i32, &e);
        dsii_gguf_get_u64(g, key, &u64, &e);
        dsii_gguf_get_i64(g, key, &i64, &e);
        dsii_gguf_get_f32(g, key, &f, &e);
        dsii_gguf_get_f64(g, key, &d, &e);
        dsii_gguf_get_bool(g, key, &b, &e);
        dsii_gguf_get_string(g, key, &s, &len, &e);
        if (dsii_gguf_get_array(g, key, &et, &n, &e) == DSI_OK) {
            if (et == DSII_GGUF_STRING) {
                for (uint64_t k = 0; k < n; k++) {
                    const char *p = dsii_gguf_arr_str(g, i, k, &len);
                    if (!p) abort();
                    g_sink += len ? (uint8_t)p[len - 1] : 0;
                }
            } else if (n <= 4096) {
                uint64_t tmp[4096];
                dsii_gguf_get_arr_u64(g, key, tmp, 4096, &n, &e);
                dsii_gguf_get_arr_i32(g, key, (int32_t *)tmp, 4096, &n, &e);
                dsii_gguf_get_arr_f32(g, key, (float *)tmp, 4096, &n, &e);
            }
            const dsii_gguf_value *v = dsii_gguf_kv_val(g, i);
            for (uint64_t k = 0; k < dsii_gguf_val_arr_len(v) && k < 64; k++)
                g_sink += dsii_gguf_val_arr_type(dsii_gguf_val_arr_elem(g, v, k));
        }
    }
    for (int64_t i = 0; i < dsii_gguf_n_tensors(g); i++) {
        const dsii_gguf_tensor *t = dsii_gguf_tensor_at(g, i);
        if (dsii_gguf_find_tensor(g, t->name) != t) abort();
        const dsii_type_traits *tt = dsii_type_get(t->type);
        if (!tt) abort(); /* the reader only accepts known types */
        uint8_t head[64];
        uint64_t k = t->nbytes < sizeof head ? t->nbytes : sizeof head;
        if (dsii_gguf_tensor_read(g, t, 0, k, head, &e) != DSI_OK) abort();
        const uint8_t *p = dsii_gguf_tensor_data(g, t);
        if (p && memcmp(p, head, (size_t)k) != 0) abort();
        uint64_t row;
        if (!dsii_type_row_size(t->type, t->ne[0], &row) || row > t->nbytes) abort();
        if (tt->supported && t->ne[0] <= 4096 && row <= 65536) {
            static uint8_t rb[65536];
            static float out[4096];
            if (dsii_gguf_tensor_read(g, t, 0, row, rb, &e) != DSI_OK) abort();
            if (dsii_dequantize_row(t->type, rb, out, t->ne[0], &e) != DSI_OK) abort();
            float dot;
            dsii_dot_row(t->type, rb, out, t->ne[0], &dot, &e);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsii_error e1, e2;
    dsii_gguf *g1 = NULL, *g2 = NULL;
    dsi_status s1 = dsii_gguf_open_memory(NULL, data, size, &g1, &e1);

    fz_reader fr = {data, size};
    dsi_reader r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.size = size;
    r.pread_fn = fz_pread;
    r.user_data = &fr;
    dsi_status s2 = dsii_gguf_open_reader(NULL, &r, &g2, &e2);
    if (s1 != s2 || (s1 != DSI_OK && strcmp(e1.msg, e2.msg) != 0)) abort();
    if (s1 == DSI_OK) {
        if (dsii_gguf_n_kv(g1) != dsii_gguf_n_kv(g2) ||
            dsii_gguf_n_tensors(g1) != dsii_gguf_n_tensors(g2))
            abort();
        walk(g1);
        walk(g2);
    } else if (e1.msg[0] == '\0' || (s1 != DSI_ERR_BAD_FORMAT && s1 != DSI_ERR_UNSUPPORTED)) {
        abort(); /* every failure on in-memory bytes is a format verdict with a message */
    }
    dsii_gguf_close(g1);
    dsii_gguf_close(g2);
    return 0;
}
