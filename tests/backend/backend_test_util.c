#define _GNU_SOURCE
#include "backend_test_util.h"

#include "backend/registry.h"
#include "tests/common/skip.h"
#include "tests/common/vk_validation.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

void bt_seed(uint64_t s) { g_rng = s ? s : 1; }

static uint64_t next_u64(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

float bt_uniform(float lo, float hi) {
    double u = (double)(next_u64() >> 11) / 9007199254740992.0;
    return (float)(lo + (hi - lo) * u);
}

void bt_fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = bt_uniform(lo, hi);
}

void bt_stream_desc(dsib_stream_desc *d) {
    memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->max_rows = 64;
    d->max_positions = 8192;
    d->max_heads = 8;
    d->max_head_dim = 512;
    d->max_topk = 512;
    d->max_experts = 16;
    d->max_experts_used = 6;
    d->max_width = 1280;
}

static int create_side(bt_side *s, const char *what) {
    dsib_error e;
    memset(&e, 0, sizeof e);
    dsii_backend_host_init(NULL, &s->host, -1);
    s->host.n_threads = 2;
    /* the CPU side is the reference: its exact matmul path (f32 activations, as the GPU
     * backends compute) */
    s->host.flags |= DSIB_HOST_EXACT_MATMUL;
    dsi_status st = s->be->create(&s->host, &s->inst, &e);
    if (st != DSI_OK) {
        printf("%s: create failed: %s (%s)\n", what, e.msg, dsi_status_string(st));
        return 0;
    }
    dsib_stream_desc d;
    bt_stream_desc(&d);
    st = s->be->stream_create(s->inst, &d, &s->strm, &e);
    if (st != DSI_OK) {
        printf("%s: stream_create failed: %s (%s)\n", what, e.msg, dsi_status_string(st));
        s->be->destroy(s->inst);
        s->inst = NULL;
        return 0;
    }
    return 1;
}

int bt_rows_new(bt_side sides[2], bt_buf *pb, uint32_t nseq, const int32_t *slots,
                const int32_t *pos0, const int32_t *count) {
    int32_t n = 0;
    for (uint32_t i = 0; i < nseq; i++) n += count[i];
    int32_t *r = calloc((size_t)(n ? n : 1) * DSIB_ROW_WORDS, 4);
    if (!r) return -1;
    int32_t t = 0;
    for (uint32_t i = 0; i < nseq; i++) {
        int32_t first = t;
        for (int32_t j = 0; j < count[i]; j++, t++) {
            r[t * DSIB_ROW_WORDS + DSIB_ROW_POS] = pos0[i] + j;
            r[t * DSIB_ROW_WORDS + DSIB_ROW_SLOT] = slots[i];
            r[t * DSIB_ROW_WORDS + DSIB_ROW_FIRST] = first;
            r[t * DSIB_ROW_WORDS + DSIB_ROW_COUNT] = count[i];
        }
    }
    int ok = bt_buf_new(sides, pb, r, (uint64_t)(n ? n : 1) * DSIB_ROW_WORDS * 4);
    free(r);
    return ok ? n : -1;
}

int bt_open(bt_side sides[2], const char *name) {
    memset(sides, 0, 2 * sizeof *sides);
    sides[0].be = dsib_cpu_backend();
    if (!create_side(&sides[0], "cpu")) return 1;
    dsii_error err;
    dsii_error_clear(&err);
    char path[512];
    if (dsii_backend_module_load(NULL, name, &sides[1].be, &sides[1].dl, path, sizeof path, &err) !=
        DSI_OK) {
        bt_close(sides);
        return dsit_absent(dsit_gpu_what(name, 1),
                           "%s backend module not available: %s", name, err.msg);
    }
    dsib_device_desc d[8];
    int32_t n = 0;
    dsib_error e;
    memset(&e, 0, sizeof e);
    if (sides[1].be->enumerate(&sides[0].host, d, 8, &n, &e) != DSI_OK || n < 1) {
        bt_close(sides);
        return dsit_absent(dsit_gpu_what(name, 0), "no %s device: %s",
                           name, e.msg);
    }
    printf("%s module %s: device 0 = %s (type %d, features 0x%x, subgroup %u, max binding %llu)\n",
           name, path, d[0].name, (int)d[0].type, d[0].features, d[0].subgroup_size,
           (unsigned long long)d[0].max_buffer_size);
    if (!create_side(&sides[1], name)) { /* a device was listed: failing to use it is a failure */
        bt_close(sides);
        return 1;
    }
    return 0;
}

int bt_reopen_gpu(bt_side *s) {
    if (s->strm) s->be->stream_destroy(s->strm);
    s->strm = NULL;
    if (s->inst) s->be->destroy(s->inst);
    s->inst = NULL;
    return create_side(s, s->be->name);
}

void bt_close(bt_side sides[2]) {
    for (int i = 0; i < 2; i++) {
        if (sides[i].strm) sides[i].be->stream_destroy(sides[i].strm);
        sides[i].strm = NULL;
        if (sides[i].inst) sides[i].be->destroy(sides[i].inst);
        sides[i].inst = NULL;
    }
    if (sides[1].dl) dsii_backend_module_unload(sides[1].dl);
    sides[1].dl = NULL;
}

int bt_buf_new(bt_side sides[2], bt_buf *pb, const void *init, uint64_t bytes) {
    memset(pb, 0, sizeof *pb);
    pb->bytes = bytes;
    uint64_t total = bytes + 2 * BT_GUARD;
    uint8_t *tmp = malloc(total);
    if (!tmp) return 0;
    memset(tmp, BT_GUARD_BYTE, total);
    if (init) memcpy(tmp + BT_GUARD, init, bytes);
    for (int s = 0; s < 2; s++) {
        dsib_error e;
        memset(&e, 0, sizeof e);
        if (sides[s].be->buffer_alloc(sides[s].inst, total, DSIB_BUFFER_SCRATCH, &pb->b[s], &e) != DSI_OK ||
            sides[s].be->upload(sides[s].inst, pb->b[s], 0, tmp, total, &e) != DSI_OK) {
            printf("buffer of %llu bytes on %s: %s\n", (unsigned long long)total, sides[s].be->name, e.msg);
            free(tmp);
            return 0;
        }
    }
    free(tmp);
    return 1;
}

void bt_buf_free(bt_side sides[2], bt_buf *pb) {
    for (int s = 0; s < 2; s++)
        if (pb->b[s]) sides[s].be->buffer_free(sides[s].inst, pb->b[s]);
    memset(pb, 0, sizeof *pb);
}

uint64_t bt_buf_read(bt_side sides[2], const bt_buf *pb, int side, void *out) {
    uint64_t total = pb->bytes + 2 * BT_GUARD;
    uint8_t *tmp = malloc(total);
    if (!tmp) return UINT64_MAX;
    dsib_error e;
    memset(&e, 0, sizeof e);
    if (sides[side].be->download(sides[side].inst, pb->b[side], 0, tmp, total, &e) != DSI_OK) {
        free(tmp);
        return UINT64_MAX;
    }
    uint64_t bad = 0;
    for (uint64_t i = 0; i < BT_GUARD; i++) {
        bad += tmp[i] != BT_GUARD_BYTE;
        bad += tmp[BT_GUARD + pb->bytes + i] != BT_GUARD_BYTE;
    }
    memcpy(out, tmp + BT_GUARD, pb->bytes);
    free(tmp);
    return bad;
}

double bt_nmse(const float *a, const float *ref, size_t n, size_t *bad) {
    double num = 0, den = 0;
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        int fa = isfinite(a[i]), fr = isfinite(ref[i]);
        if (fa != fr) {
            nb++;
            continue;
        }
        if (!fa) {
            if (isnan(a[i]) != isnan(ref[i]) || (isinf(a[i]) && a[i] != ref[i])) nb++;
            continue;
        }
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (bad) *bad = nb;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return num / den;
}

long long bt_validation_errors(const bt_side *gpu, char *last, size_t cap, int *enabled) {
    if (enabled) *enabled = 0;
    dsit_vk_stats d;
    if (dsit_vk_stats_of(gpu->dl, &d) != 0) return -1;
    if (enabled) *enabled = (int)d.validation_enabled;
    if (last && cap) snprintf(last, cap, "%s", d.last_error);
    return (long long)d.validation_errors;
}
