/*
 * Compares what libdsinfer binds from two files of the same weights in different layouts
 * (docs/model-files.md §7): every bound tensor of the backbone, the head and the draft blocks,
 * dequantized row by row, must be bit-identical — whatever the tensor names, row encodings
 * (ds4 row264 Engram tables), fused tensors (llama.cpp's eh_proj) or second files (MTP).
 *
 *   dsi_layout_cmp A.gguf [--draft A-mtp.gguf] B.gguf [--draft B-mtp.gguf] [--allow-hc-trunk]
 *                  [--no-draft]
 *
 * --allow-hc-trunk: B is a llama.cpp file with the MTP inside, whose MTP head is the trunk's
 * (model-files.md §4.1): the MTP hc_head tensors are then not compared.
 * --no-draft: B has no draft blocks by design (ds4's deepseek41 text GGUF): drafts not compared.
 * Prints the number of tensors and values compared; exit 0 when everything matches.
 */
#define _POSIX_C_SOURCE 200809L
#include "dsinfer.h"
#include "engram/engram.h"
#include "model/model.h"
#include "quant/fp.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_tensors, g_values;

static int row_f32(const dsii_tensor *t, const uint8_t *p, float *dst) {
    if (t->type == DSII_TYPE_ENGRAM_ROW264) {
        const int64_t k = t->ne[0];
        for (int64_t j = 0; j < k; j++) dst[j] = dsii_e4m3_to_f32(p[j]) * dsii_e8m0_to_f32(p[k + j / 32]);
        return 0;
    }
    if (t->type == DSI_TYPE_I32) {
        for (int64_t j = 0; j < t->ne[0]; j++) {
            int32_t v;
            memcpy(&v, p + 4 * j, 4);
            dst[j] = (float)v;
        }
        return 0;
    }
    return dsii_dequantize_row(t->type, p, dst, t->ne[0], NULL) != DSI_OK;
}

static int cmp_tensor(const char *what, const dsii_tensor *a, const dsii_tensor *b) {
    if (!a && !b) return 0;
    if (!a || !b) {
        fprintf(stderr, "MISMATCH %s: bound in %s only\n", what, a ? "A" : "B");
        return 1;
    }
    for (int i = 0; i < 4; i++)
        if (a->ne[i] != b->ne[i]) {
            fprintf(stderr, "MISMATCH %s: shape differs ('%s' vs '%s')\n", what, a->name, b->name);
            return 1;
        }
    const int64_t n0 = a->ne[0], rows = a->ne[1] * a->ne[2] * a->ne[3];
    float *ra = malloc(sizeof(float) * (size_t)n0), *rb = malloc(sizeof(float) * (size_t)n0);
    int bad = !ra || !rb;
    for (int64_t r = 0; r < rows && !bad; r++) {
        const uint8_t *pa = (const uint8_t *)a->data + (uint64_t)r * a->row_stride;
        const uint8_t *pb = (const uint8_t *)b->data + (uint64_t)r * b->row_stride;
        if (row_f32(a, pa, ra) || row_f32(b, pb, rb)) {
            fprintf(stderr, "MISMATCH %s: cannot dequantize ('%s' %d / '%s' %d)\n", what, a->name, a->type, b->name,
                    b->type);
            bad = 1;
        } else if (memcmp(ra, rb, sizeof(float) * (size_t)n0) != 0) {
            fprintf(stderr, "MISMATCH %s: row %" PRId64 " differs ('%s' vs '%s')\n", what, r, a->name, b->name);
            bad = 1;
        }
    }
    free(ra);
    free(rb);
    g_tensors++;
    g_values += (uint64_t)(n0 * rows);
    return bad;
}

/* Structs of tensor pointers compared slot by slot. */
static int cmp_slots(const char *what, const void *a, const void *b, size_t bytes, size_t skip_from, size_t skip_to) {
    const dsii_tensor *const *pa = a, *const *pb = b;
    int bad = 0;
    for (size_t i = 0; i < bytes / sizeof(void *); i++) {
        if (i >= skip_from && i < skip_to) continue;
        char w[96];
        snprintf(w, sizeof w, "%s[slot %zu]", what, i);
        bad |= cmp_tensor(w, pa[i], pb[i]);
    }
    return bad;
}

static dsi_model *load(dsi_context *ctx, const char *path, const char *draft) {
    dsi_model_options o;
    dsi_model_options_init(&o);
    o.draft_path = draft;
    dsi_model *m = NULL;
    if (dsi_model_load(ctx, path, &o, &m) != DSI_OK) {
        fprintf(stderr, "dsi_layout_cmp: %s: %s\n", path, dsi_last_error());
        return NULL;
    }
    return m;
}

int main(int argc, char **argv) {
    const char *f[2] = {NULL, NULL}, *d[2] = {NULL, NULL};
    int nf = 0, hc_trunk = 0, no_draft = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--draft") && i + 1 < argc && nf > 0) d[nf - 1] = argv[++i];
        else if (!strcmp(argv[i], "--allow-hc-trunk")) hc_trunk = 1;
        else if (!strcmp(argv[i], "--no-draft")) no_draft = 1;
        else if (nf < 2) f[nf++] = argv[i];
        else return 2;
    }
    if (nf != 2) {
        fprintf(stderr, "usage: dsi_layout_cmp A.gguf [--draft F] B.gguf [--draft F] [--allow-hc-trunk]\n");
        return 2;
    }
    dsi_context *ctx = NULL;
    if (dsi_context_create(NULL, &ctx) != DSI_OK) return 1;
    dsi_model *a = load(ctx, f[0], d[0]), *b = a ? load(ctx, f[1], d[1]) : NULL;
    if (!a || !b) return 1;
    const dsii_hparams *ha = &a->hp, *hb = &b->hp;
    int bad = 0;
    if (ha->arch != hb->arch || ha->n_layer != hb->n_layer || (!no_draft && ha->n_draft != hb->n_draft) ||
        ha->has_engram != hb->has_engram || ha->n_hash_layer != hb->n_hash_layer) {
        fprintf(stderr, "MISMATCH hparams: arch %d/%d layers %u/%u drafts %u/%u engram %d/%d\n", ha->arch, hb->arch,
                ha->n_layer, hb->n_layer, ha->n_draft, hb->n_draft, ha->has_engram, hb->has_engram);
        bad = 1;
    }
    for (uint32_t i = 0; !bad && i < ha->n_layer; i++) {
        const dsii_layer_hparams *x = &ha->layer[i], *y = &hb->layer[i];
        if (x->compress_ratio != y->compress_ratio || x->swiglu_limit != y->swiglu_limit ||
            x->is_kv_source != y->is_kv_source || x->is_index_source != y->is_index_source ||
            x->kv_src != y->kv_src || x->topk_src != y->topk_src || x->engram_index != y->engram_index) {
            fprintf(stderr, "MISMATCH layer %u hparams\n", i);
            bad = 1;
        }
    }
    if (!bad && memcmp(&a->hp.rope_base, &b->hp.rope_base, sizeof(float)) != 0) bad = 1;
    if (!bad) {
        bad |= cmp_slots("head", &a->w.token_embd, &b->w.token_embd, 6 * sizeof(void *), 0, 0);
        for (uint32_t i = 0; i < ha->n_layer; i++) {
            char w[32];
            snprintf(w, sizeof w, "blk.%u", i);
            bad |= cmp_slots(w, &a->w.layer[i], &b->w.layer[i], sizeof(dsii_layer_tensors), 0, 0);
        }
        for (uint32_t i = 0; !no_draft && i < ha->n_draft; i++) {
            char w[32];
            snprintf(w, sizeof w, "draft.%u", i);
            bad |= cmp_slots(w, &a->w.draft[i].blk, &b->w.draft[i].blk, sizeof(dsii_layer_tensors), 0, 0);
            /* e_proj h_proj enorm hnorm norm hc_head_fn hc_head_base hc_head_scale main_proj … */
            const size_t first = offsetof(dsii_draft_tensors, e_proj) / sizeof(void *);
            const size_t hc0 = offsetof(dsii_draft_tensors, hc_head_fn) / sizeof(void *) - first;
            bad |= cmp_slots(w, &a->w.draft[i].e_proj, &b->w.draft[i].e_proj,
                             sizeof(dsii_draft_tensors) - offsetof(dsii_draft_tensors, e_proj), hc_trunk ? hc0 : 0,
                             hc_trunk ? hc0 + 3 : 0);
        }
    }
    printf("%s: %" PRIu64 " tensors, %" PRIu64 " values compared between %s and %s\n", bad ? "MISMATCH" : "identical",
           g_tensors, g_values, f[0], f[1]);
    dsi_model_free(a);
    dsi_model_free(b);
    dsi_context_free(ctx);
    return bad;
}
