/*
 * Writes the seed corpus for fuzz_gguf into a directory (created if missing): small but
 * representative GGUFs made with the library's writer — every metadata value type, nested
 * arrays, a ds4-like header (deepseek4 keys, tokenizer arrays) and tensors of every type the
 * writer can produce, with default and custom alignment — plus a few hand-made edge cases.
 *
 * Usage: fuzz_gguf_seeds DIR
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

static int g_fail;

static void chk(dsi_status st, const dsii_error *e, const char *what) {
    if (st != DSI_OK) {
        fprintf(stderr, "fuzz_gguf_seeds: %s: %s\n", what, e->msg);
        g_fail = 1;
    }
}

static void save(const char *dir, const char *name, dsii_gguf_writer *w) {
    char path[4096];
    dsii_error e;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    chk(dsii_gguf_writer_write_path(w, path, &e), &e, path);
    dsii_gguf_writer_free(w);
}

static void save_raw(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "fuzz_gguf_seeds: cannot write %s\n", path);
        g_fail = 1;
    }
}

static void all_values(const char *dir) {
    dsii_error e;
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    chk(dsii_gguf_writer_add_u8(w, "v.u8", 1, &e), &e, "u8");
    chk(dsii_gguf_writer_add_i8(w, "v.i8", -1, &e), &e, "i8");
    chk(dsii_gguf_writer_add_u16(w, "v.u16", 2, &e), &e, "u16");
    chk(dsii_gguf_writer_add_i16(w, "v.i16", -2, &e), &e, "i16");
    chk(dsii_gguf_writer_add_u32(w, "v.u32", 3, &e), &e, "u32");
    chk(dsii_gguf_writer_add_i32(w, "v.i32", -3, &e), &e, "i32");
    chk(dsii_gguf_writer_add_f32(w, "v.f32", 0.5f, &e), &e, "f32");
    chk(dsii_gguf_writer_add_bool(w, "v.bool", 1, &e), &e, "bool");
    chk(dsii_gguf_writer_add_string(w, "v.str", "text", &e), &e, "str");
    chk(dsii_gguf_writer_add_u64(w, "v.u64", 4, &e), &e, "u64");
    chk(dsii_gguf_writer_add_i64(w, "v.i64", -4, &e), &e, "i64");
    chk(dsii_gguf_writer_add_f64(w, "v.f64", 0.25, &e), &e, "f64");
    uint32_t a[4] = {0, 4, 128, 4};
    chk(dsii_gguf_writer_add_array(w, "v.arr", DSII_GGUF_U32, a, 4, &e), &e, "arr");
    const char *s[3] = {"a", "", "xyz"};
    chk(dsii_gguf_writer_add_string_array(w, "v.strs", s, NULL, 3, &e), &e, "strs");
    /* [[1, 2], ["q"]] */
    uint8_t nested[] = {9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
                        4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
                        8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'q'};
    chk(dsii_gguf_writer_add_kv_raw(w, "v.nested", DSII_GGUF_ARRAY, nested, sizeof nested, &e),
        &e, "nested");
    save(dir, "all_values.gguf", w);
}

static void all_types(const char *dir, uint32_t alignment, const char *name) {
    dsii_error e;
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    chk(dsii_gguf_writer_set_alignment(w, alignment, &e), &e, "alignment");
    chk(dsii_gguf_writer_add_string(w, "general.architecture", "deepseek4", &e), &e, "arch");
    chk(dsii_gguf_writer_add_u32(w, "deepseek4.block_count", 2, &e), &e, "blocks");
    chk(dsii_gguf_writer_add_f32(w, "deepseek4.rope.freq_base", 10000.0f, &e), &e, "rope");
    const char *toks[4] = {"<s>", "</s>", "a", "b"};
    chk(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", toks, NULL, 4, &e), &e, "tok");
    const char *merges[1] = {"a b"};
    chk(dsii_gguf_writer_add_string_array(w, "tokenizer.ggml.merges", merges, NULL, 1, &e), &e, "merges");
    static float x[512 * 2];
    for (int i = 0; i < 1024; i++) x[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    struct { int32_t type; int64_t ne0; const char *name; } t[] = {
        {DSI_TYPE_F32, 8, "t.f32"},          {DSI_TYPE_F16, 8, "t.f16"},
        {DSI_TYPE_BF16, 8, "t.bf16"},        {DSI_TYPE_Q8_0, 32, "t.q8_0"},
        {DSI_TYPE_Q4_K, 256, "t.q4_k"},      {DSI_TYPE_Q2_K, 256, "t.q2_k"},
        {DSI_TYPE_MXFP4, 32, "t.mxfp4"},     {DSI_TYPE_FP8_E4M3_B128, 130, "t.fp8_b128"},
        {DSI_TYPE_FP8_E4M3_B32, 40, "t.fp8_b32"}, {DSI_TYPE_FP8_E4M3_R32, 64, "t.fp8_r32"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int64_t ne[2] = {t[i].ne0, 2};
        chk(dsii_gguf_writer_add_tensor_f32(w, t[i].name, t[i].type, 2, ne, x, &e), &e, t[i].name);
    }
    int32_t ids[6] = {0, 1, 2, 3, 4, 5};
    int64_t ne1[2] = {3, 2};
    chk(dsii_gguf_writer_add_tensor(w, "blk.0.ffn_gate_tid2eid.weight", DSI_TYPE_I32, 2, ne1, ids,
                                    sizeof ids, &e), &e, "i32");
    save(dir, name, w);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    mkdir(argv[1], 0777);
    all_values(argv[1]);
    all_types(argv[1], 32, "all_types.gguf");
    all_types(argv[1], 64, "all_types_align64.gguf");
    dsii_gguf_writer *w = dsii_gguf_writer_create(NULL);
    save(argv[1], "empty_header.gguf", w);
    save_raw(argv[1], "not_gguf.txt", "hello, not a model\n", 19);
    return g_fail;
}
