/* Quantiser traces for the rounding-on comparisons: see fq_trace.h. */
#define _GNU_SOURCE
#include "fq_trace.h"

#include "backend/device.h"
#include "backend/registry.h"
#include "backends/backend.h"
#include "base/context_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the trace --------------------------------------------------------------------------- */

void fqt_free(fqt_trace *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->c[i].x);
        free(t->c[i].out);
    }
    free(t->c);
    memset(t, 0, sizeof *t);
}

static fqt_call *new_call(fqt_trace *t, uint32_t n) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        fqt_call *c = realloc(t->c, cap * sizeof *c);
        if (!c) return NULL;
        t->c = c;
        t->cap = cap;
    }
    fqt_call *c = &t->c[t->n];
    memset(c, 0, sizeof *c);
    c->x = malloc((size_t)n * sizeof(float));
    c->out = malloc((size_t)n * sizeof(float));
    if (!c->x || !c->out) {
        free(c->x);
        free(c->out);
        return NULL;
    }
    c->n = n;
    c->layer = c->site = -1;
    t->n++;
    return c;
}

/* ---- the wrapped op table ------------------------------------------------------------------- */

/* Backend interface v2 (backends/backend.h): ops are recorded on streams; work is complete
 * after `sync`. The wrapped table maps each stream created through it to its slot, records
 * fake_quant calls (host-addressable buffers at once, device buffers through a copy
 * downloaded at the stream's next sync) and disables capture / replay on the wrapped device
 * (a replayed graph would not call the wrapper). */

typedef struct pending {
    dsib_buffer *buf;
    float *dst;
    uint64_t bytes;
} pending;

typedef struct wrap_slot wrap_slot;

typedef struct stream_ent {
    dsib_stream *s;
    wrap_slot *slot;
    pending *pend;
    size_t n_pend, cap_pend;
} stream_ent;

struct wrap_slot {
    dsi_context *ctx;
    dsii_device *dev;
    const dsib_backend *orig;
    int32_t orig_can_capture;
    dsib_backend be;
    dsib_ops ops;
    int failed;
};

/* Sessions of one context may create, use and destroy streams on several threads at once
 * (test_model_v4's two threads; the state pool's growth copies on a stream of its own), so
 * the stream registry and the recording state are guarded by one lock. A stream's own entry
 * (its pending copies) is used only by the thread that drives that stream. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static wrap_slot g_slot[2];
static stream_ent g_streams[64];
static fqt_trace *g_rec;
static int64_t g_pos = -1;
static uint32_t g_ordinal;
static fqt_force *g_forces;
static size_t g_n_forces;

/* The entry of stream st, or NULL. Called with g_lock held. */
static stream_ent *stream_of_locked(dsib_stream *st) {
    for (size_t i = 0; i < sizeof g_streams / sizeof g_streams[0]; i++)
        if (g_streams[i].s && g_streams[i].s == st) return &g_streams[i];
    return NULL;
}

static stream_ent *stream_of(dsib_stream *st) {
    pthread_mutex_lock(&g_lock);
    stream_ent *se = stream_of_locked(st);
    pthread_mutex_unlock(&g_lock);
    return se;
}

static void drop_pending(stream_ent *se) {
    for (size_t i = 0; i < se->n_pend; i++)
        se->slot->orig->buffer_free(se->slot->dev->inst, se->pend[i].buf);
    se->n_pend = 0;
}

/* Copies rows × ncols floats at x (+col0, stride ldx) into dst: at once on a host-addressable
 * backend, else through a device copy downloaded at the stream's next sync. */
static int capture(stream_ent *se, dsib_view x, uint32_t ldx, uint32_t rows, uint32_t col0,
                   uint32_t ncols, float *dst) {
    wrap_slot *s = se->slot;
    const dsib_backend *b = s->orig;
    dsib_instance *inst = s->dev->inst;
    uint8_t *host = b->buffer_host_ptr ? b->buffer_host_ptr(inst, x.buf) : NULL;
    if (host) {
        const float *p = (const float *)(const void *)(host + x.offset) + col0;
        for (uint32_t r = 0; r < rows; r++)
            memcpy(dst + (size_t)r * ncols, p + (size_t)r * ldx, (size_t)ncols * sizeof(float));
        return 0;
    }
    if (se->n_pend == se->cap_pend) {
        size_t cap = se->cap_pend ? 2 * se->cap_pend : 64;
        pending *p = realloc(se->pend, cap * sizeof *p);
        if (!p) return -1;
        se->pend = p;
        se->cap_pend = cap;
    }
    pending *p = &se->pend[se->n_pend];
    p->bytes = (uint64_t)rows * ncols * sizeof(float);
    p->dst = dst;
    dsib_error e;
    memset(&e, 0, sizeof e);
    if (b->buffer_alloc(inst, p->bytes, DSIB_BUFFER_SCRATCH, &p->buf, &e) != DSI_OK) {
        printf("fq_trace: capture buffer: %s\n", e.msg);
        return -1;
    }
    dsib_view src = {x.buf, x.offset + (uint64_t)col0 * sizeof(float)}, dv = {p->buf, 0};
    if (b->ops->copy_rows(se->s, src, ldx, dv, ncols, rows, ncols) != DSI_OK) {
        b->buffer_free(inst, p->buf);
        return -1;
    }
    se->n_pend++;
    return 0;
}

static dsi_status w_fake_quant(dsib_stream *st, dsib_view x, uint32_t ldx, uint32_t rows,
                               uint32_t col0, uint32_t ncols, uint32_t block, int32_t recipe,
                               uint32_t flags) {
    pthread_mutex_lock(&g_lock);
    stream_ent *se = stream_of_locked(st);
    if (!se) { /* a stream not created through the wrapped table */
        pthread_mutex_unlock(&g_lock);
        return DSI_ERR_INTERNAL;
    }
    wrap_slot *s = se->slot;
    const dsib_ops *o = s->orig->ops;
    if (!g_rec || rows == 0 || ncols == 0) {
        pthread_mutex_unlock(&g_lock);
        return o->fake_quant(st, x, ldx, rows, col0, ncols, block, recipe, flags);
    }
    /* recording: one call at a time, so ordinals and the trace stay in call order */
    fqt_call *c = new_call(g_rec, rows * ncols);
    if (!c) {
        s->failed = 1;
        pthread_mutex_unlock(&g_lock);
        return o->fake_quant(st, x, ldx, rows, col0, ncols, block, recipe, flags);
    }
    c->pos = g_pos;
    c->recipe = recipe;
    c->block = block;
    c->ncols = ncols;
    c->ordinal = g_ordinal++;
    if (capture(se, x, ldx, rows, col0, ncols, c->x) != 0) s->failed = 1;
    dsi_status r = o->fake_quant(st, x, ldx, rows, col0, ncols, block, recipe, flags);
    if (g_n_forces) {
        uint8_t *host = s->orig->buffer_host_ptr ? s->orig->buffer_host_ptr(s->dev->inst, x.buf)
                                                 : NULL;
        for (size_t i = 0; i < g_n_forces; i++) {
            if (g_forces[i].ordinal != c->ordinal) continue;
            if (!host || g_forces[i].elem >= c->n) {
                s->failed = 1;
                continue;
            }
            uint32_t rr = g_forces[i].elem / ncols, k = g_forces[i].elem % ncols;
            float *p = (float *)(void *)(host + x.offset) + (size_t)rr * ldx + col0 + k;
            *p = g_forces[i].value;
        }
    }
    if (capture(se, x, ldx, rows, col0, ncols, c->out) != 0) s->failed = 1;
    pthread_mutex_unlock(&g_lock);
    return r;
}

static dsi_status w_stream_create(dsib_instance *inst, const dsib_stream_desc *desc,
                                  dsib_stream **out, dsib_error *err) {
    pthread_mutex_lock(&g_lock);
    wrap_slot *s = NULL;
    for (int i = 0; i < 2 && !s; i++)
        if (g_slot[i].ctx && g_slot[i].dev->inst == inst) s = &g_slot[i];
    stream_ent *se = NULL; /* a free entry */
    for (size_t i = 0; s && i < sizeof g_streams / sizeof g_streams[0] && !se; i++)
        if (!g_streams[i].s) se = &g_streams[i];
    dsi_status st = DSI_ERR_INTERNAL;
    if (!s) {
        snprintf(err->msg, sizeof err->msg, "fq_trace: instance not wrapped");
    } else if (!se) {
        snprintf(err->msg, sizeof err->msg, "fq_trace: more than %zu streams",
                 sizeof g_streams / sizeof g_streams[0]);
        st = DSI_ERR_OUT_OF_HOST_MEMORY;
    } else {
        st = s->orig->stream_create(inst, desc, out, err);
        if (st == DSI_OK) {
            memset(se, 0, sizeof *se);
            se->s = *out;
            se->slot = s;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

static void w_stream_destroy(dsib_stream *st) {
    /* the entry is released before the stream is (the backend may hand the same address to
     * another thread's next stream), its pending copies after the stream's work is done */
    pthread_mutex_lock(&g_lock);
    stream_ent *found = st ? stream_of_locked(st) : NULL;
    stream_ent se;
    if (found) {
        se = *found;
        memset(found, 0, sizeof *found);
    }
    pthread_mutex_unlock(&g_lock);
    if (!found) return;
    se.slot->orig->stream_destroy(st); /* waits for the stream's work */
    drop_pending(&se);
    free(se.pend);
}

static dsi_status w_sync(dsib_stream *st, dsib_error *err) {
    stream_ent *se = stream_of(st);
    if (!se) return DSI_ERR_INTERNAL;
    wrap_slot *s = se->slot;
    dsi_status r = s->orig->sync(st, err);
    for (size_t i = 0; i < se->n_pend; i++) {
        pending *p = &se->pend[i];
        dsib_error e;
        memset(&e, 0, sizeof e);
        if (r == DSI_OK && s->orig->download(s->dev->inst, p->buf, 0, p->dst, p->bytes, &e) != DSI_OK) {
            printf("fq_trace: download: %s\n", e.msg);
            s->failed = 1;
        }
    }
    drop_pending(se);
    return r;
}

static int wrap_locked(dsi_context *ctx) {
    wrap_slot *s = NULL;
    for (int i = 0; i < 2 && !s; i++)
        if (!g_slot[i].ctx) s = &g_slot[i];
    dsii_device *d = ctx ? dsii_context_compute(ctx) : NULL;
    if (!s || !d || !d->be || !d->be->ops) return -1;
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->dev = d;
    s->orig = d->be;
    s->orig_can_capture = d->can_capture;
    s->be = *s->orig;
    size_t osz = s->orig->ops->struct_size < sizeof s->ops ? s->orig->ops->struct_size : sizeof s->ops;
    memcpy(&s->ops, s->orig->ops, osz);
    if (!s->ops.fake_quant || !s->ops.copy_rows) {
        memset(s, 0, sizeof *s);
        return -1;
    }
    s->ops.fake_quant = w_fake_quant;
    s->be.ops = &s->ops;
    s->be.stream_create = w_stream_create;
    s->be.stream_destroy = w_stream_destroy;
    s->be.sync = w_sync;
    d->be = &s->be;
    d->can_capture = 0;
    return 0;
}

int fqt_wrap_context(dsi_context *ctx) {
    pthread_mutex_lock(&g_lock);
    int r = wrap_locked(ctx);
    pthread_mutex_unlock(&g_lock);
    return r;
}

void fqt_unwrap_context(dsi_context *ctx) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < 2; i++) {
        wrap_slot *s = &g_slot[i];
        if (!ctx || s->ctx != ctx) continue;
        for (size_t k = 0; k < sizeof g_streams / sizeof g_streams[0]; k++) {
            if (g_streams[k].slot != s) continue;
            /* streams still open (sessions outliving the wrap): keep them usable */
            drop_pending(&g_streams[k]);
            free(g_streams[k].pend);
            memset(&g_streams[k], 0, sizeof g_streams[k]);
        }
        s->dev->be = s->orig;
        s->dev->can_capture = s->orig_can_capture;
        memset(s, 0, sizeof *s);
    }
    pthread_mutex_unlock(&g_lock);
}

void fqt_record(fqt_trace *t) {
    pthread_mutex_lock(&g_lock);
    g_rec = t;
    g_ordinal = 0;
    g_pos = -1;
    for (int i = 0; i < 2; i++) g_slot[i].failed = 0;
    pthread_mutex_unlock(&g_lock);
}

void fqt_set_pos(int64_t pos) {
    pthread_mutex_lock(&g_lock);
    g_pos = pos;
    pthread_mutex_unlock(&g_lock);
}

void fqt_set_forces(const fqt_force *f, size_t n) {
    pthread_mutex_lock(&g_lock);
    free(g_forces);
    g_forces = NULL;
    g_n_forces = 0;
    if (n) {
        g_forces = malloc(n * sizeof *f);
        if (g_forces) {
            memcpy(g_forces, f, n * sizeof *f);
            g_n_forces = n;
        }
    }
    pthread_mutex_unlock(&g_lock);
}

int fqt_capture_failed(void) { return g_slot[0].failed || g_slot[1].failed; }

/* ---- the reference's record --------------------------------------------------------------- */

int fqt_read_reference(const char *path, fqt_trace *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("fq_trace: cannot open %s\n", path);
        return -1;
    }
    int32_t h[6];
    uint32_t ord = 0;
    while (fread(h, sizeof h, 1, f) == 1) {
        if (h[5] <= 0 || h[4] <= 0 || h[5] % h[4]) {
            printf("fq_trace: %s: bad record header\n", path);
            break;
        }
        fqt_call *c = new_call(t, (uint32_t)h[5]);
        if (!c) break;
        c->pos = h[0];
        c->layer = h[1];
        c->site = h[2];
        c->recipe = h[3];
        c->block = (uint32_t)h[4];
        c->ncols = c->n;
        c->ordinal = ord++;
        if (fread(c->x, sizeof(float), c->n, f) != c->n ||
            fread(c->out, sizeof(float), c->n, f) != c->n) {
            printf("fq_trace: %s: short record\n", path);
            fclose(f);
            fqt_free(t);
            return -1;
        }
    }
    int bad = !feof(f);
    fclose(f);
    if (bad) {
        fqt_free(t);
        return -1;
    }
    return 0;
}

/* ---- §10.1, written here from model-spec.md ---------------------------------------------- */

/* 2^ceil(log2 v), v > 0 (a power of two maps to itself). */
static float pow2_ceil(float v) {
    int e;
    float m = frexpf(v, &e); /* v = m·2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

/* Grid step at |y| for e4m3 (3 mantissa bits, subnormal step 2^-9) or e2m1 (1 bit, 0.5). */
static float grid_step(float y, int e4m3) {
    int e;
    frexpf(y, &e); /* |y| in [2^(e-1), 2^e) */
    return e4m3 ? ldexpf(1.0f, e - 4 < -9 ? -9 : e - 4) : ldexpf(1.0f, e - 2 < -1 ? -1 : e - 2);
}

static float rne_grid(float y, int e4m3) {
    float st = grid_step(y, e4m3);
    return rintf(y / st) * st; /* exact: st is a power of two; rintf rounds half to even */
}

/* Block scale of a recipe from its inputs (§10.1); *lim the clamp of x/s. */
static float block_scale(int32_t recipe, const float *x, uint32_t block, float *lim) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < block; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    switch (recipe) {
    case 0: /* e4m3, UE8M0 scale */
        *lim = 448.0f;
        return pow2_ceil((amax < 1e-4f ? 1e-4f : amax) * (1.0f / 448.0f));
    case 1: /* e2m1, UE8M0 scale */
        *lim = 6.0f;
        return pow2_ceil((amax < 6.0f * 0x1p-126f ? 6.0f * 0x1p-126f : amax) * (1.0f / 6.0f));
    default: { /* e2m1, e4m3 scale */
        *lim = 6.0f;
        float sc = (amax < 6.0f * 0x1p-9f ? 6.0f * 0x1p-9f : amax) / 6.0f;
        return rne_grid(sc > 448.0f ? 448.0f : sc, 1);
    }
    }
}

static float ulp_of(float v) {
    v = fabsf(v);
    if (v < 0x1p-126f) return 0x1p-149f;
    return nextafterf(v, INFINITY) - v;
}

/* Is `got` the §10.1 result for input x (scale s, clamp lim), or — when x/s is within own_ulps
 * float32 ulps of a midpoint — the neighbour on the other side? */
static int element_ok(float x, float got, float s, float lim, int e4m3, double own_ulps) {
    float y = x / s;
    if (y > lim) y = lim;
    if (y < -lim) y = -lim;
    float want = rne_grid(y, e4m3) * s;
    if (memcmp(&want, &got, sizeof want) == 0 || (want == 0.0f && got == 0.0f)) return 1;
    if (own_ulps <= 0) return 0;
    float lo = y - (float)own_ulps * ulp_of(y), hi = y + (float)own_ulps * ulp_of(y);
    float a = rne_grid(lo, e4m3) * s, b = rne_grid(hi, e4m3) * s;
    return got == a || got == b;
}

static int is_forced(const fqt_force *f, size_t n, uint32_t ord, uint32_t elem) {
    for (size_t i = 0; i < n; i++)
        if (f[i].ordinal == ord && f[i].elem == elem) return 1;
    return 0;
}

size_t fqt_check_self(const fqt_trace *t, const char *who, double own_ulps,
                      const fqt_force *forced, size_t n_forced) {
    size_t bad = 0;
    for (size_t ci = 0; ci < t->n; ci++) {
        const fqt_call *c = &t->c[ci];
        int e4m3 = c->recipe == 0;
        for (uint32_t b0 = 0; b0 + c->block <= c->n; b0 += c->block) {
            float lim, s = block_scale(c->recipe, c->x + b0, c->block, &lim);
            /* a scale within own_ulps of its rounding boundary may go either way on a
             * backend with inexact division: accept the block if every element matches one
             * of the two scales */
            float s2 = s;
            if (own_ulps > 0) {
                float amax = 0;
                for (uint32_t i = 0; i < c->block; i++)
                    if (fabsf(c->x[b0 + i]) > amax) amax = fabsf(c->x[b0 + i]);
                float l2, hi = amax + (float)own_ulps * ulp_of(amax);
                float tmp[1] = {hi};
                s2 = block_scale(c->recipe, tmp, 1, &l2);
                if (s2 == s) {
                    tmp[0] = amax - (float)own_ulps * ulp_of(amax);
                    s2 = block_scale(c->recipe, tmp, 1, &l2);
                }
            }
            for (uint32_t i = 0; i < c->block; i++) {
                uint32_t k = b0 + i;
                if (n_forced && is_forced(forced, n_forced, c->ordinal, k)) continue;
                if (element_ok(c->x[k], c->out[k], s, lim, e4m3, own_ulps)) continue;
                if (s2 != s && element_ok(c->x[k], c->out[k], s2, lim, e4m3, own_ulps)) continue;
                if (bad < 5)
                    printf("  %s: call %zu (pos %lld, recipe %d, block %u) element %u: input "
                           "%.9g gave %.9g, §10.1 gives %.9g (scale %.9g)\n",
                           who, ci, (long long)c->pos, c->recipe, c->block, k, (double)c->x[k],
                           (double)c->out[k], (double)(rne_grid(fminf(fmaxf(c->x[k] / s, -lim), lim), e4m3) * s),
                           (double)s);
                bad++;
            }
        }
    }
    if (bad) printf("  %s: %zu quantiser outputs differ from §10.1 applied to their own inputs\n", who, bad);
    return bad;
}

/* ---- pairing and the walk ---------------------------------------------------------------- */

/* Largest |x_a − x_b| over the call, in FQT units (ulps of each block's largest |x_b|). */
static double input_gap(const fqt_call *a, const fqt_call *b, uint32_t *worst_elem) {
    double worst = 0;
    for (uint32_t b0 = 0; b0 + a->block <= a->n; b0 += a->block) {
        float amax = 0;
        for (uint32_t i = 0; i < a->block; i++)
            if (fabsf(b->x[b0 + i]) > amax) amax = fabsf(b->x[b0 + i]);
        double u = ulp_of(amax);
        for (uint32_t i = 0; i < a->block; i++) {
            double d = fabs((double)a->x[b0 + i] - (double)b->x[b0 + i]) / u;
            if (!(d <= worst)) { /* NaN propagates */
                worst = d;
                if (worst_elem) *worst_elem = b0 + i;
            }
        }
    }
    return worst;
}

static int same_shape(const fqt_call *a, const fqt_call *b) {
    return a->recipe == b->recipe && a->block == b->block && a->n == b->n;
}

int fqt_pair(const fqt_trace *a, const fqt_trace *b, int mode, long *pair) {
    for (size_t i = 0; i < a->n; i++) pair[i] = -1;
    if (mode == FQT_PAIR_ORDER) {
        if (a->n != b->n) {
            printf("  fq_trace: %zu quantiser calls vs %zu\n", a->n, b->n);
            return -1;
        }
        for (size_t i = 0; i < a->n; i++) {
            if (!same_shape(&a->c[i], &b->c[i])) {
                printf("  fq_trace: call %zu: recipe/block/size %d/%u/%u vs %d/%u/%u\n", i,
                       a->c[i].recipe, a->c[i].block, a->c[i].n, b->c[i].recipe,
                       b->c[i].block, b->c[i].n);
                return -1;
            }
            pair[i] = (long)i;
        }
        return 0;
    }
    /* by position: both traces are in position order */
    size_t ia = 0, n_missing = 0;
    int rc = 0;
    for (size_t jb = 0; jb < b->n;) {
        int64_t p = b->c[jb].pos;
        size_t je = jb;
        while (je < b->n && b->c[je].pos == p) je++;
        while (ia < a->n && a->c[ia].pos < p) ia++;
        size_t ie = ia;
        while (ie < a->n && a->c[ie].pos == p) ie++;
        for (size_t j = jb; j < je; j++) {
            long best = -1;
            double bd = INFINITY;
            for (size_t i = ia; i < ie; i++) {
                if (pair[i] >= 0 || !same_shape(&a->c[i], &b->c[j])) continue;
                double d = input_gap(&a->c[i], &b->c[j], NULL);
                if (best < 0 || d < bd) {
                    best = (long)i;
                    bd = d;
                }
            }
            if (best < 0) {
                if (n_missing++ < 10)
                    printf("  fq_trace: position %lld: the reference's quantiser call (layer "
                           "%d, site %d, recipe %d, %u elements) has no counterpart in the "
                           "library\n", (long long)p, b->c[j].layer, b->c[j].site,
                           b->c[j].recipe, b->c[j].n);
                rc = -1;
            } else {
                pair[best] = (long)j;
            }
        }
        jb = je;
    }
    if (n_missing > 10)
        printf("  fq_trace: ... %zu of the reference's quantiser calls have no counterpart in "
               "the library\n", n_missing);
    return rc;
}

static int decision_differs(float a, float b) {
    return memcmp(&a, &b, sizeof a) != 0 && !(a == 0.0f && b == 0.0f); /* ±0 are one decision */
}

fqt_walk fqt_walk_traces(const fqt_trace *a, const fqt_trace *b, const long *pair,
                         const char *name_a, const char *name_b) {
    fqt_walk w;
    memset(&w, 0, sizeof w);
    w.first_pos = -1;
    w.beyond = -1;
    for (size_t i = 0; i < a->n; i++) {
        if (pair[i] < 0) {
            w.n_unpaired++;
            continue;
        }
        const fqt_call *ca = &a->c[i], *cb = &b->c[pair[i]];
        uint32_t we = 0;
        double g = input_gap(ca, cb, &we);
        if (!(g <= w.worst_ulps)) {
            w.worst_ulps = g;
            snprintf(w.worst_at, sizeof w.worst_at, "position %lld layer %d site %d",
                     (long long)ca->pos, cb->layer, cb->site);
        }
        if (!(g <= FQT_INPUT_ULPS)) {
            snprintf(w.beyond_msg, sizeof w.beyond_msg,
                     "quantiser inputs differ beyond %g float32 ulps of their block: position "
                     "%lld, %s call %zu (layer %d, site %d) element %u: %s %.9g vs %s %.9g "
                     "(%.3g ulps)", FQT_INPUT_ULPS, (long long)ca->pos, name_a, i, cb->layer,
                     cb->site, we, name_a, (double)ca->x[we], name_b, (double)cb->x[we], g);
            w.beyond = (long)i;
            return w;
        }
        int any = 0;
        for (uint32_t k = 0; k < ca->n; k++) {
            if (!decision_differs(ca->out[k], cb->out[k])) continue;
            if (w.n_flips == w.cap) {
                size_t cap = w.cap ? 2 * w.cap : 16;
                fqt_force *f = realloc(w.flips, cap * sizeof *f);
                if (!f) {
                    snprintf(w.beyond_msg, sizeof w.beyond_msg, "out of memory");
                    w.beyond = (long)i;
                    return w;
                }
                w.flips = f;
                w.cap = cap;
            }
            fqt_force f = {ca->ordinal, k, cb->out[k]};
            w.flips[w.n_flips++] = f;
            any = 1;
            if (w.first_pos < 0) w.first_pos = ca->pos;
            float lim, s = block_scale(ca->recipe, ca->x + k / ca->block * ca->block, ca->block, &lim);
            double d = fabs((double)ca->x[k] - (double)cb->x[k]);
            printf("  midpoint flip at position %lld, call %zu (layer %d, site %d, recipe %d) "
                   "row %u element %u: input %s %.9g / %s %.9g (%.3g grid steps apart), output "
                   "%s %.9g / %s %.9g\n",
                   (long long)ca->pos, i, cb->layer, cb->site, ca->recipe,
                   ca->ncols ? k / ca->ncols : 0, ca->ncols ? k % ca->ncols : k, name_a,
                   (double)ca->x[k], name_b, (double)cb->x[k],
                   d / s / grid_step(ca->x[k] / s, ca->recipe == 0), name_a,
                   (double)ca->out[k], name_b, (double)cb->out[k]);
        }
        if (any) {
            /* everything after this call may follow from these decisions: stop here, the
             * caller aligns them and walks again */
            w.n_flip_calls = 1;
            return w;
        }
    }
    return w;
}

fqt_result fqt_converge(int (*run)(void *user, float *logits), void *user, float *logits,
                        const fqt_trace *b, int pair_mode, size_t max_flips,
                        const char *name_a, const char *name_b) {
    fqt_result r;
    memset(&r, 0, sizeof r);
    r.first_flip_pos = -1;
    fqt_force *forces = NULL;
    size_t nf = 0;
    for (;;) {
        fqt_trace a;
        memset(&a, 0, sizeof a);
        fqt_set_forces(forces, nf);
        fqt_record(&a);
        int rc = run(user, logits);
        fqt_record(NULL);
        r.runs++;
        long *pair = malloc((a.n ? a.n : 1) * sizeof *pair);
        int done = 1;
        if (rc != 0 || fqt_capture_failed() || !pair) {
            printf("  %s: the run failed (or its quantiser capture did)\n", name_a);
        } else if (fqt_check_self(&a, name_a, 0.0, forces, nf) != 0) {
            /* printed */
        } else if (fqt_pair(&a, b, pair_mode, pair) != 0) {
            /* printed */
        } else {
            fqt_walk w = fqt_walk_traces(&a, b, pair, name_a, name_b);
            if (w.worst_ulps > r.worst_ulps) {
                r.worst_ulps = w.worst_ulps;
                memcpy(r.worst_at, w.worst_at, sizeof r.worst_at);
            }
            r.n_unpaired = w.n_unpaired;
            if (r.first_flip_pos < 0 || (w.first_pos >= 0 && w.first_pos < r.first_flip_pos))
                r.first_flip_pos = w.first_pos;
            if (w.n_flips == 0) {
                /* nothing left to align: either every input and decision agrees, or an
                 * input differs beyond the bound with every earlier decision equal */
                if (w.beyond >= 0)
                    printf("  %s, with every earlier decision equal\n", w.beyond_msg);
                else
                    r.ok = 1;
            } else if (nf + w.n_flips > max_flips) {
                printf("  more than %zu midpoint flips: %zu aligned, %zu more found\n",
                       max_flips, nf, w.n_flips);
            } else {
                fqt_force *f2 = realloc(forces, (nf + w.n_flips) * sizeof *f2);
                if (f2) {
                    forces = f2;
                    memcpy(forces + nf, w.flips, w.n_flips * sizeof *f2);
                    nf += w.n_flips;
                    r.n_flip_calls += w.n_flip_calls;
                    done = 0; /* re-run with these decisions aligned too */
                }
            }
            free(w.flips);
        }
        free(pair);
        fqt_free(&a);
        if (done) break;
    }
    r.n_flips = nf;
    fqt_set_forces(NULL, 0);
    free(forces);
    return r;
}
