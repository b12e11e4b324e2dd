/*
 * lib/place/xtier.c — the expert tier (place.h): routed experts of streamed layers read from
 * the model file into a bounded cache of expert slots, shared by every session of the model.
 *
 * One slot holds one expert's three slices (gate | up | down, each 64-byte aligned) of any
 * streamed layer. A step's MoE call (lib/moe) hands the tier the routing of its rows; the
 * tier takes the rows in chunks whose distinct experts fit the free slots, pins them (hits),
 * reads the missing ones (pread of whole slices through the model's file, in 1 MiB pieces so
 * that a cancel request stops a long read), rewrites the chunk's selection ids to slot ids
 * and runs the backend's moe_experts on the cache buffer — the same operations on the same
 * bytes per row as the resident path, so logits do not change with the placement.
 *
 * Replacement: LRU (last use) or LFU (uses since the load, kept per expert across
 * evictions; ties: last use). Read-ahead: after a streamed layer, the next streamed layer's
 * router is applied to this layer's input (hash layers: the token ids route exactly) and the
 * predicted experts are queued on the tier's reader thread, which reads them while the
 * shared expert and the next layer's attention run; a slot a read-ahead filled is not
 * evicted by another read-ahead of the same prediction.
 *
 * Locking: one mutex + condition variable; reads run outside the lock on slots marked
 * LOADING (nobody else evicts or reads them); a slot in use by a step is pinned.
 *
 * Next to a GPU (hybrid steps, docs/placement.md) the tiered layers are the disk tier and the
 * host tier (experts in host RAM: the mapping or the loader's owned copy). The routing of a
 * step is downloaded after moe_route (the step's one extra host sync per tiered layer), then:
 *   - DSII_HYBRID_UPLOAD: the cache lives on the GPU; a miss is uploaded (host-tier bytes in
 *     place, disk reads through host staging pieces); the rewritten selection ids are
 *     uploaded and the GPU's moe_experts runs on the cache: the bytes of the resident path;
 *   - DSII_HYBRID_CPU: the context's CPU instance computes the layer's routed experts — host
 *     tier from the weights in place, disk tier through a host cache as on the CPU device —
 *     from the downloaded input rows on a CPU stream of the tier's own (one per concurrent
 *     step, kept for reuse); the result rows are uploaded into the GPU's routed output, where
 *     the shared expert is added as usual.
 * Steps with tiered layers read the routing mid-step, so their lanes do not capture graphs.
 */
#define _GNU_SOURCE /* O_DIRECT */
#include "place/place.h"

#include "arch/arch.h"
#include "engram/engram.h"
#include "model/model.h"
#include "moe/moe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { SLOT_EMPTY = 0, SLOT_LOADING = 1, SLOT_READY = 2 };

typedef struct xslot {
    int32_t layer, expert;
    uint32_t pins;
    uint8_t state;
    uint8_t prefetched;   /* filled by a read-ahead, not used since */
    uint64_t last;        /* clock of the last use */
    uint64_t gen;         /* prediction generation of a read-ahead */
} xslot;

typedef struct xlayer {
    int32_t streamed;
    const dsii_tensor *t[3];  /* gate, up, down */
    uint64_t slice[3];        /* bytes of one expert's slice */
    uint64_t part[3];         /* offset of each slice in a slot */
    uint32_t E;
    int32_t *map;             /* [E]: slot or -1 */
    uint32_t *freq;           /* [E]: uses since the load (LFU) */
    const dsii_moe_weights *mw; /* the layer's MoE weights (router for read-ahead) */
    int32_t next;             /* next streamed layer, or -1 */
    int32_t host;             /* host tier (t->data in host RAM) */
    dsib_buffer *hb[3];       /* hybrid CPU, host tier: the tensors wrapped on the CPU instance */
    dsib_weight hw[3];
    dsib_buffer *gb[3];       /* hybrid CPU with device experts: m experts on the GPU */
    dsib_weight gw[3];
    int32_t *gmap;            /* [E] with device experts: expert -> its index in gb, or -1 */
} xlayer;

#define QCAP 1024
#define CHUNK_MAX 256
#define READ_PIECE DSII_XTIER_PIECE
#define NWORK 8

/* A CPU stream and host buffers for one hybrid-CPU call: x [cap][ldx], sel / wts [cap][k],
 * y [cap][D]. */
typedef struct cpuw {
    dsib_stream *s;
    dsib_buffer *b;
    uint8_t *p;
    uint32_t cap, ldx;
    uint64_t ox, osel, owts, oy, osg, owg; /* osg / owg: the GPU part's ids and weights */
    int busy;
    /* on the GPU (the compute device): an event after the routing, the CPU part's rows */
    dsib_event *ev;
    dsib_buffer *gb;
    uint32_t gcap;
} cpuw;

struct dsii_xtier {
    dsi_model *m;
    const dsi_context *ctx;
    dsii_place *pl;
    dsii_device *dev;         /* the compute device */
    dsii_device *cdev;        /* where the cache lives and the tiered experts are computed */
    int dcache;               /* the cache is GPU memory (hybrid UPLOAD): uploads, no `mem` */
    int hcpu;                 /* hybrid CPU: cdev is the CPU instance next to a GPU */
    int autoh;                /* hybrid AUTO: a GPU cache (cdev = dev) and, for steps whose
                                 experts serve fewer than up_rows rows each (host-tier
                                 layers), the hybrid CPU path */
    uint32_t up_rows;
    dsii_device *hdev;        /* the CPU instance of the hybrid CPU path (hcpu: cdev) */
    uint8_t *mem;             /* host cache (cdev = the CPU): mem_buf.p */
    dsii_bigbuf mem_buf;      /* its allocation (huge pages where the kernel gives them) */
    dsib_buffer *buf;         /* the cache as a buffer of cdev */
    uint8_t *stage[DSII_XTIER_STAGES]; /* PIECE + 2 DIO_ALIGN bytes, DIO_ALIGN-aligned */
    int stage_busy[DSII_XTIER_STAGES];
    int dio_fd;               /* DSII_PLACE_FLAG_DIRECT_IO: the model file opened O_DIRECT, or -1 */
    cpuw W[NWORK];
    uint32_t dev_experts;     /* hybrid CPU: experts of each tiered layer on the GPU (m) */
    int tier_counted;         /* tier_bytes added to the host use */
    uint32_t max_D, max_F, max_E, max_k;
    uint32_t n_slots;
    uint64_t slot_bytes;
    uint32_t n_layer;
    xlayer L[128];
    xslot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t clock;
    /* reader thread (read-ahead) */
    pthread_t th;
    int th_on, stop;
    pthread_cond_t qcv;
    int32_t q[QCAP][2];
    uint32_t qhead, qn;
    uint64_t gen;
};

atomic_int dsii_xtier_part_test;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void host_add(dsii_place *pl, uint64_t b) {
    unsigned long long u = atomic_fetch_add(&pl->host_used, b) + b;
    unsigned long long p = atomic_load(&pl->host_peak);
    while (u > p && !atomic_compare_exchange_weak(&pl->host_peak, &p, u)) {
    }
}

/* Reads expert `ex` of layer `l` into slot `s` (outside the lock). */
static int stage_take(dsii_xtier *xt) {
    pthread_mutex_lock(&xt->mu);
    for (;;) {
        for (int i = 0; i < (int)DSII_XTIER_STAGES; i++)
            if (!xt->stage_busy[i]) {
                xt->stage_busy[i] = 1;
                pthread_mutex_unlock(&xt->mu);
                return i;
            }
        pthread_cond_wait(&xt->cv, &xt->mu);
    }
}

static void stage_give(dsii_xtier *xt, int i) {
    pthread_mutex_lock(&xt->mu);
    xt->stage_busy[i] = 0;
    pthread_cond_broadcast(&xt->cv);
    pthread_mutex_unlock(&xt->mu);
}

/* O_DIRECT: bytes [off, off + n) of tensor t (n <= READ_PIECE) through a staging piece read
 * at aligned offsets; *src points at them inside the piece. */
static dsi_status direct_read(dsii_xtier *xt, const dsii_tensor *t, uint64_t off, uint64_t n, int *stage,
                              const uint8_t **src, dsii_error *e) {
    const uint64_t A = DSII_XTIER_DIO_ALIGN;
    uint64_t a = t->file_offset + off, a0 = a & ~(A - 1), a1 = (a + n + A - 1) & ~(A - 1);
    if (*stage < 0) *stage = stage_take(xt);
    uint8_t *b = xt->stage[*stage];
    uint64_t want = a1 - a0, got = 0;
    while (got < want) {
        ssize_t r = pread(xt->dio_fd, b + got, (size_t)(want - got), (off_t)(a0 + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return dsii_fail(e, DSI_ERR_IO, "%s: O_DIRECT read of %llu bytes at offset %llu: %s",
                             dsii_file_name(dsii_gguf_file(xt->m->gguf)), (unsigned long long)want,
                             (unsigned long long)a0, strerror(errno));
        }
        if (r == 0) break;
        got += (uint64_t)r;
    }
    if (got < a - a0 + n)
        return dsii_fail(e, DSI_ERR_IO, "%s: short read: %llu of %llu bytes at offset %llu (was the file truncated?)",
                         dsii_file_name(dsii_gguf_file(xt->m->gguf)), (unsigned long long)(got > a - a0 ? got - (a - a0) : 0),
                         (unsigned long long)n, (unsigned long long)a);
    *src = b + (a - a0);
    return DSI_OK;
}

/* One piece of an expert slice into slot bytes [at, at + n) of the cache: host cache: read
 * in place (O_DIRECT: through a staging piece); GPU cache: upload from the host tier's bytes,
 * or read into a staging piece and upload that. */
static dsi_status put_piece(dsii_xtier *xt, const dsii_tensor *t, uint64_t off, uint64_t n,
                            uint64_t at, int *stage, dsii_error *e) {
    const uint8_t *src = t->data ? (const uint8_t *)t->data + off : NULL;
    if (!src && xt->dio_fd >= 0) {
        dsi_status st = direct_read(xt, t, off, n, stage, &src, e);
        if (st != DSI_OK) return st;
        if (!xt->dcache) {
            memcpy(xt->mem + at, src, (size_t)n);
            return DSI_OK;
        }
    }
    if (!xt->dcache) return dsii_model_tensor_read(xt->m, t, off, n, xt->mem + at, e);
    if (!src) {
        if (*stage < 0) *stage = stage_take(xt);
        dsi_status st = dsii_model_tensor_read(xt->m, t, off, n, xt->stage[*stage], e);
        if (st != DSI_OK) return st;
        src = xt->stage[*stage];
    }
    dsib_error be_err = {{0}};
    dsi_status st = xt->cdev->be->upload(xt->cdev->inst, xt->buf, at, src, n, &be_err);
    if (st != DSI_OK) return dsii_fail(e, st, "%s: upload failed: %s", xt->cdev->name, be_err.msg);
    atomic_fetch_add_explicit(&xt->pl->bytes_uploaded, n, memory_order_relaxed);
    return DSI_OK;
}

static dsi_status read_slot(dsii_xtier *xt, int32_t l, int32_t ex, uint32_t s,
                            const atomic_int *cancel, dsii_error *e) {
    const xlayer *L = &xt->L[l];
    const uint64_t dst = (uint64_t)s * xt->slot_bytes;
    uint64_t t0 = now_ns(), from_file = 0;
    int stage = -1;
    dsi_status st = DSI_OK;
    for (int j = 0; j < 3 && st == DSI_OK; j++) {
        uint64_t off = (uint64_t)ex * L->slice[j];
        for (uint64_t done = 0; done < L->slice[j];) {
            if (cancel && atomic_load_explicit(cancel, memory_order_acquire)) {
                st = dsii_fail(e, DSI_ERR_CANCELLED, "cancelled while reading expert %d of layer %d", ex, l);
                break;
            }
            uint64_t n = L->slice[j] - done < READ_PIECE ? L->slice[j] - done : READ_PIECE;
            st = put_piece(xt, L->t[j], off + done, n, dst + L->part[j] + done, &stage, e);
            if (st != DSI_OK) {
                /* keep the OS / file message, name the expert */
                char msg[DSII_ERROR_MSG_MAX];
                memcpy(msg, e->msg, sizeof msg);
                msg[sizeof msg - 1] = '\0';
                if (st == DSI_ERR_BAD_FORMAT) st = DSI_ERR_IO; /* the file shrank under us */
                dsii_fail(e, st, "expert tier: reading expert %d of layer %d ('%s'): %.400s", ex, l,
                          L->t[j]->name, msg);
                break;
            }
            done += n;
            if (!L->host) from_file += n; /* the host tier is not read from the file */
        }
    }
    if (stage >= 0) stage_give(xt, stage);
    atomic_fetch_add_explicit(&xt->pl->bytes_read, from_file, memory_order_relaxed);
    atomic_fetch_add_explicit(&xt->pl->read_ns, now_ns() - t0, memory_order_relaxed);
    return st;
}

/* A slot to (re)use, or -1 when every slot is pinned or loading. Empty slots first, then
 * anything but the current prediction's unused read-aheads, by the replacement policy. */
static int32_t pick_victim(dsii_xtier *xt, int for_prefetch) {
    int32_t best = -1;
    int best_cls = 0;
    uint64_t best_a = 0, best_b = 0;
    for (uint32_t s = 0; s < xt->n_slots; s++) {
        const xslot *x = &xt->slots[s];
        if (x->pins || x->state == SLOT_LOADING) continue;
        if (x->state == SLOT_EMPTY) return (int32_t)s;
        int cls = x->prefetched && x->gen == xt->gen;
        if (for_prefetch && cls) continue;
        uint64_t a = xt->pl->cache_policy == DSII_CACHE_LFU ? xt->L[x->layer].freq[x->expert] : x->last;
        uint64_t b = x->last;
        if (best < 0 || cls < best_cls || (cls == best_cls && (a < best_a || (a == best_a && b < best_b)))) {
            best = (int32_t)s;
            best_cls = cls;
            best_a = a;
            best_b = b;
        }
    }
    return best;
}

static void slot_assign(dsii_xtier *xt, uint32_t s, int32_t l, int32_t ex) {
    xslot *x = &xt->slots[s];
    if (x->state != SLOT_EMPTY && x->layer >= 0) xt->L[x->layer].map[x->expert] = -1;
    x->layer = l;
    x->expert = ex;
    x->state = SLOT_LOADING;
    x->prefetched = 0;
    xt->L[l].map[ex] = (int32_t)s;
}

static void slot_reset(dsii_xtier *xt, uint32_t s) {
    xslot *x = &xt->slots[s];
    if (x->layer >= 0 && xt->L[x->layer].map[x->expert] == (int32_t)s) xt->L[x->layer].map[x->expert] = -1;
    x->state = SLOT_EMPTY;
    x->layer = -1;
    x->expert = -1;
    x->prefetched = 0;
}

/* ---- the routing profile's pre-load ---------------------------------------------------------- */

typedef struct hot_pair {
    uint64_t c;
    int32_t l, ex;
} hot_pair;

static int hot_cmp(const void *a, const void *b) {
    const hot_pair *x = a, *y = b;
    if (x->c != y->c) return x->c > y->c ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return x->ex < y->ex ? -1 : x->ex > y->ex;
}

/* With a routing profile, the cache starts with the profile's most often routed experts of
 * the layers that use it (never-routed ones not), as many as there are slots: read at the
 * load, so the first steps hit. Replacement then works as usual. */
static dsi_status preload(dsii_xtier *xt, dsii_error *e) {
    const dsii_place *pl = xt->pl;
    if (!pl->profile || !xt->n_slots) return DSI_OK;
    uint64_t nc = 0;
    for (uint32_t l = 0; l < xt->n_layer; l++)
        if (xt->L[l].streamed && !(xt->hcpu && xt->L[l].host)) nc += xt->L[l].E;
    hot_pair *h = dsii_malloc(xt->ctx, (size_t)(nc ? nc : 1) * sizeof *h);
    if (!h) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "expert tier: out of host memory");
    uint64_t n = 0;
    for (uint32_t l = 0; l < xt->n_layer; l++) {
        const xlayer *L = &xt->L[l];
        if (!L->streamed || (xt->hcpu && L->host)) continue;
        for (uint32_t x = 0; x < L->E && x < pl->profile_stride; x++) {
            uint64_t c = pl->profile[(uint64_t)l * pl->profile_stride + x];
            if (c) h[n++] = (hot_pair){c, (int32_t)l, (int32_t)x};
        }
    }
    qsort(h, (size_t)n, sizeof *h, hot_cmp);
    dsi_status st = DSI_OK;
    for (uint64_t i = 0; i < n && i < xt->n_slots && st == DSI_OK; i++) {
        slot_assign(xt, (uint32_t)i, h[i].l, h[i].ex);
        st = read_slot(xt, h[i].l, h[i].ex, (uint32_t)i, NULL, e);
        if (st != DSI_OK) {
            slot_reset(xt, (uint32_t)i);
            break;
        }
        xt->slots[i].state = SLOT_READY;
        xt->slots[i].last = ++xt->clock;
    }
    dsii_free(xt->ctx, h);
    return st;
}

/* ---- read-ahead thread --------------------------------------------------------------------- */

static void *reader_main(void *arg) {
    dsii_xtier *xt = arg;
    dsii_error e;
    pthread_mutex_lock(&xt->mu);
    for (;;) {
        while (!xt->stop && xt->qn == 0) pthread_cond_wait(&xt->qcv, &xt->mu);
        if (xt->stop) break;
        int32_t l = xt->q[xt->qhead][0], ex = xt->q[xt->qhead][1];
        xt->qhead = (xt->qhead + 1) % QCAP;
        xt->qn--;
        if (xt->L[l].map[ex] >= 0) continue;
        int32_t s = pick_victim(xt, 1);
        if (s < 0) continue;
        slot_assign(xt, (uint32_t)s, l, ex);
        xt->slots[s].gen = xt->gen;
        pthread_mutex_unlock(&xt->mu);
        dsii_error_clear(&e);
        dsi_status st = read_slot(xt, l, ex, (uint32_t)s, NULL, &e);
        pthread_mutex_lock(&xt->mu);
        if (st == DSI_OK) {
            xt->slots[s].state = SLOT_READY;
            xt->slots[s].prefetched = 1;
            xt->slots[s].last = ++xt->clock;
            atomic_fetch_add_explicit(&xt->pl->prefetches, 1, memory_order_relaxed);
        } else {
            slot_reset(xt, (uint32_t)s); /* the step that needs it reads it and reports */
        }
        pthread_cond_broadcast(&xt->cv);
    }
    pthread_mutex_unlock(&xt->mu);
    return NULL;
}

/* The `count` int32 routing ids of `sel` (device `dev`, its stream synced) on the host: in
 * place when the buffer is host memory, else downloaded into *tmp (allocated; the caller
 * frees it). NULL on failure (message in be_err). */
static int32_t *routing_host(const dsii_xtier *xt, const dsii_device *dev, dsib_view sel,
                             uint64_t count, int32_t **tmp, dsib_error *be_err) {
    *tmp = NULL;
    uint8_t *base = dev->be->buffer_host_ptr(dev->inst, sel.buf);
    if (base) return (int32_t *)(void *)(base + sel.offset);
    int32_t *h = dsii_malloc(xt->ctx, (size_t)(count ? count : 1) * 4);
    if (!h) {
        snprintf(be_err->msg, sizeof be_err->msg, "out of host memory");
        return NULL;
    }
    if (dev->be->download(dev->inst, sel.buf, sel.offset, h, count * 4, be_err) != DSI_OK) {
        dsii_free(xt->ctx, h);
        return NULL;
    }
    *tmp = h;
    return h;
}

static uint64_t count_distinct(const int32_t *sl, const float *wt, uint64_t count);

void dsii_xtier_predict(dsii_xtier *xt, const dsii_device *dev, dsib_stream *strm, int32_t layer,
                        dsib_view x, uint32_t ldx, dsib_view ids, uint32_t n, dsib_view logits,
                        dsib_view sel, dsib_view wts) {
    if (!xt || !xt->th_on || layer < 0 || (uint32_t)layer >= xt->n_layer) return;
    int32_t l2 = xt->L[layer].next;
    /* hybrid CPU (and AUTO's CPU steps): host-tier layers do not use the cache */
    if (l2 < 0 || ((xt->hcpu || (xt->autoh && n < xt->up_rows)) && xt->L[l2].host)) return;
    const dsii_moe_weights *w = xt->L[l2].mw;
    if (!w || !w->gate_inp.buf) return;
    const dsib_ops *ops = dev->be->ops;
    uint32_t E = w->n_expert, k = w->k;
    dsib_error be_err;
    if (ops->matmul(strm, &w->gate_inp, 0, x, ldx, logits, E, n) != DSI_OK ||
        ops->moe_route(strm, logits, E, E, k, w->bias.buf ? &w->bias : NULL,
                       w->tid2eid.buf ? &w->tid2eid : NULL, ids, w->norm_add, w->route_scale, n, sel,
                       wts) != DSI_OK) {
        dev->be->sync(strm, &be_err);
        return;
    }
    if (dev->be->sync(strm, &be_err) != DSI_OK) return;
    int32_t *tmp = NULL;
    const int32_t *sl = routing_host(xt, dev, sel, (uint64_t)n * k, &tmp, &be_err);
    if (!sl) return;
    if (xt->autoh && xt->L[l2].host && (uint64_t)n * k < (uint64_t)xt->up_rows * count_distinct(sl, NULL, (uint64_t)n * k)) {
        dsii_free(xt->ctx, tmp); /* hybrid AUTO: that step will run on the CPU */
        return;
    }
    pthread_mutex_lock(&xt->mu);
    xt->gen++;
    xt->qhead = 0;
    xt->qn = 0;
    for (uint64_t i = 0; i < (uint64_t)n * k && xt->qn < QCAP; i++) {
        int32_t ex = sl[i];
        if (ex < 0 || (uint32_t)ex >= xt->L[l2].E || xt->L[l2].map[ex] >= 0) continue;
        int dup = 0;
        for (uint32_t j = 0; j < xt->qn && !dup; j++) dup = xt->q[j][1] == ex;
        if (dup) continue;
        xt->q[xt->qn][0] = l2;
        xt->q[xt->qn][1] = ex;
        xt->qn++;
    }
    if (xt->qn) pthread_cond_signal(&xt->qcv);
    pthread_mutex_unlock(&xt->mu);
    dsii_free(xt->ctx, tmp);
}

/* ---- the routed experts of a step ----------------------------------------------------------- */

static int in_list(const int32_t *a, uint32_t n, int32_t v) {
    for (uint32_t i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

/* A chunk's missing experts, read by the calling thread and up to READERS - 1 helpers (a
 * deeper queue for the disk; the reads are independent slots). ok[i]: slot to_load[i] was
 * read. On failure the first failure's status and message (the others stop claiming). */
#define READERS 4
typedef struct rjob {
    dsii_xtier *xt;
    const int32_t *to_load;
    uint32_t n;
    atomic_uint next;
    atomic_int failed;
    const atomic_int *cancel;
    uint8_t *ok;
    pthread_mutex_t mu;
    dsii_error err;
} rjob;

static void rjob_run(rjob *j) {
    for (;;) {
        if (atomic_load_explicit(&j->failed, memory_order_acquire)) return;
        uint32_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n) return;
        const xslot *xs = &j->xt->slots[j->to_load[i]];
        dsii_error e;
        dsii_error_clear(&e);
        if (read_slot(j->xt, xs->layer, xs->expert, (uint32_t)j->to_load[i], j->cancel, &e) == DSI_OK) {
            j->ok[i] = 1;
        } else {
            pthread_mutex_lock(&j->mu);
            if (!atomic_load(&j->failed)) j->err = e;
            atomic_store_explicit(&j->failed, 1, memory_order_release);
            pthread_mutex_unlock(&j->mu);
        }
    }
}

static void *rjob_main(void *arg) {
    rjob_run(arg);
    return NULL;
}

static dsi_status read_misses(dsii_xtier *xt, const int32_t *to_load, uint32_t n, const atomic_int *cancel,
                              uint8_t *ok, dsii_error *e) {
    memset(ok, 0, n ? n : 1);
    if (n == 0) return DSI_OK;
    rjob j;
    memset(&j, 0, sizeof j);
    j.xt = xt;
    j.to_load = to_load;
    j.n = n;
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, 0);
    j.cancel = cancel;
    j.ok = ok;
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th[READERS - 1];
    int nth = 0;
    for (uint32_t h = 1; h < n && h < READERS; h++)
        if (pthread_create(&th[nth], NULL, rjob_main, &j) == 0) nth++;
    rjob_run(&j);
    for (int h = 0; h < nth; h++) pthread_join(th[h], NULL);
    pthread_mutex_destroy(&j.mu);
    if (atomic_load(&j.failed)) {
        *e = j.err;
        return j.err.status != DSI_OK ? j.err.status : DSI_ERR_IO;
    }
    return DSI_OK;
}

/* The rows of a tiered layer through the cache on xt->cdev: chunks whose distinct experts
 * fit slots that can be pinned; misses read (or uploaded); the chunk's ids in `sl` (host
 * memory) rewritten to slot ids — and uploaded into `sel` when sel_up (a GPU cache), else
 * `sl` is sel's own memory —; moe_experts on stream `cs` of cdev over the cache. x, sel,
 * wts, y: views of cdev. */
static dsi_status run_chunks(dsii_xtier *xt, dsib_stream *cs, const dsii_moe_weights *w, int32_t l,
                             dsib_view x, uint32_t ldx, int32_t *sl, dsib_view sel, int sel_up,
                             dsib_view wts, uint32_t n, dsib_view y, uint32_t ldy,
                             const atomic_int *cancel, dsii_error *e) {
    const dsii_device *cdev = xt->cdev;
    const dsib_backend *be = cdev->be;
    dsib_error be_err = {{0}};
    xlayer *L = &xt->L[l];
    const uint32_t k = w->k;
    dsi_status st = DSI_OK;
    if (k == 0 || k > CHUNK_MAX || k > xt->n_slots)
        return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: k %u does not fit %u slots", k, xt->n_slots);
    /* the cache as three expert tensors of n_slots "experts" (no stable id: contents change) */
    dsib_weight cw[3];
    const dsib_weight *src[3] = {&w->w1, &w->w3, &w->w2};
    for (int j = 0; j < 3; j++) {
        cw[j] = *src[j];
        cw[j].buf = xt->buf;
        cw[j].offset = L->part[j];
        cw[j].ne[2] = xt->n_slots;
        cw[j].nb2 = xt->slot_bytes;
        cw[j].id = 0;
    }
    int32_t chunk[CHUNK_MAX], to_load[CHUNK_MAX];
    uint32_t row = 0;
    while (row < n) {
        pthread_mutex_lock(&xt->mu);
        uint32_t r0 = row, nch = 0, nload = 0;
        uint64_t hits = 0, misses = 0, phits = 0;
        for (uint32_t r = row; r < n; r++) {
            uint32_t before = nch, before_load = nload;
            uint64_t h0 = hits, m0 = misses, p0 = phits;
            int ok = 1;
            for (uint32_t j = 0; j < k && ok; j++) {
                int32_t ex = sl[(uint64_t)r * k + j];
                int32_t s = L->map[ex];
                if (s >= 0 && in_list(chunk, nch, s)) continue;
                if (nch >= CHUNK_MAX) {
                    ok = 0;
                    break;
                }
                if (s >= 0) {
                    xslot *xs = &xt->slots[s];
                    xs->pins++;
                    if (xs->state == SLOT_READY) {
                        hits++;
                        if (xs->prefetched) phits++;
                    } else {
                        misses++;
                    }
                    xs->prefetched = 0;
                    chunk[nch++] = s;
                } else {
                    s = pick_victim(xt, 0);
                    if (s < 0) {
                        ok = 0;
                        break;
                    }
                    slot_assign(xt, (uint32_t)s, l, ex);
                    xt->slots[s].pins = 1;
                    chunk[nch++] = s;
                    to_load[nload++] = s;
                    misses++;
                }
            }
            if (!ok) {
                /* this row does not fit now: undo its part, run the rows before it */
                for (uint32_t i = before; i < nch; i++) {
                    xslot *xs = &xt->slots[chunk[i]];
                    if (in_list(to_load + before_load, nload - before_load, chunk[i])) {
                        xs->pins = 0;
                        slot_reset(xt, (uint32_t)chunk[i]);
                    } else {
                        xs->pins--;
                    }
                }
                nch = before;
                nload = before_load;
                hits = h0;
                misses = m0;
                phits = p0;
                break;
            }
            row = r + 1;
        }
        if (row == r0) {
            /* every slot is in use by other steps: wait for one to be released */
            pthread_cond_wait(&xt->cv, &xt->mu);
            pthread_mutex_unlock(&xt->mu);
            continue;
        }
        /* uses: recency and frequency */
        for (uint32_t r = r0; r < row; r++)
            for (uint32_t j = 0; j < k; j++) L->freq[sl[(uint64_t)r * k + j]]++;
        uint64_t tick = ++xt->clock;
        for (uint32_t i = 0; i < nch; i++) xt->slots[chunk[i]].last = tick;
        pthread_mutex_unlock(&xt->mu);
        atomic_fetch_add_explicit(&xt->pl->hits, hits, memory_order_relaxed);
        atomic_fetch_add_explicit(&xt->pl->misses, misses, memory_order_relaxed);
        atomic_fetch_add_explicit(&xt->pl->prefetch_hits, phits, memory_order_relaxed);

        /* read the misses (outside the lock), up to READERS at once */
        uint8_t done_ok[CHUNK_MAX];
        st = read_misses(xt, to_load, nload, cancel, done_ok, e);
        pthread_mutex_lock(&xt->mu);
        for (uint32_t i = 0; i < nload; i++) {
            if (done_ok[i]) xt->slots[to_load[i]].state = SLOT_READY;
            else slot_reset(xt, (uint32_t)to_load[i]);
        }
        pthread_cond_broadcast(&xt->cv);
        /* wait for slots other steps (or the read-ahead) are reading */
        while (st == DSI_OK) {
            int loading = 0, lost = 0;
            for (uint32_t i = 0; i < nch; i++) {
                const xslot *xs = &xt->slots[chunk[i]];
                if (xs->state == SLOT_LOADING) loading = 1;
                else if (xs->state == SLOT_EMPTY) lost = 1;
            }
            if (lost) {
                st = dsii_fail(e, DSI_ERR_IO, "expert tier: an expert of layer %d could not be read "
                                              "(another step's read failed)", l);
                break;
            }
            if (!loading) break;
            pthread_cond_wait(&xt->cv, &xt->mu);
        }
        if (st == DSI_OK)
            for (uint32_t r = r0; r < row; r++)
                for (uint32_t j = 0; j < k; j++) {
                    int32_t *p = &sl[(uint64_t)r * k + j];
                    *p = L->map[*p];
                }
        pthread_mutex_unlock(&xt->mu);
        if (st == DSI_OK) {
            dsib_view xv = {x.buf, x.offset + (uint64_t)r0 * ldx * 4};
            dsib_view sv = {sel.buf, sel.offset + (uint64_t)r0 * k * 4};
            dsib_view wv = {wts.buf, wts.offset + (uint64_t)r0 * k * 4};
            dsib_view yv = {y.buf, y.offset + (uint64_t)r0 * ldy * 4};
            if (sel_up)
                st = be->upload(cdev->inst, sel.buf, sv.offset, sl + (uint64_t)r0 * k,
                                (uint64_t)(row - r0) * k * 4, &be_err);
            if (st == DSI_OK)
                st = be->ops->moe_experts(cs, xv, ldx, sv, wv, k, &cw[0], &cw[1], &cw[2], w->limit,
                                          row - r0, yv, ldy);
            if (st == DSI_OK) st = be->sync(cs, &be_err);
            if (st != DSI_OK) dsii_fail(e, st, "moe: routed experts (expert tier, %s) failed: %s", cdev->name, be_err.msg);
            else atomic_fetch_add_explicit(strcmp(cdev->name, "cpu") == 0 ? &xt->pl->cpu_experts : &xt->pl->device_experts,
                                           nch, memory_order_relaxed);
        }
        pthread_mutex_lock(&xt->mu);
        for (uint32_t i = 0; i < nch; i++)
            if (xt->slots[chunk[i]].pins) xt->slots[chunk[i]].pins--;
        pthread_cond_broadcast(&xt->cv);
        pthread_mutex_unlock(&xt->mu);
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}


/* A CPU worker (hybrid CPU) for n rows of stride ldx; waits while all are busy. */
static cpuw *worker_take(dsii_xtier *xt, uint32_t n, uint32_t ldx, dsii_error *e) {
    const dsib_backend *be = xt->hdev->be;
    dsib_error be_err = {{0}};
    pthread_mutex_lock(&xt->mu);
    for (;;) {
        int fit = -1, any = -1;
        for (int i = 0; i < NWORK; i++) {
            if (xt->W[i].busy) continue;
            if (xt->W[i].s && xt->W[i].cap >= n && xt->W[i].ldx >= ldx) {
                fit = i;
                break;
            }
            if (any < 0 || !xt->W[i].s) any = i;
        }
        int i = fit >= 0 ? fit : any;
        if (i < 0) {
            pthread_cond_wait(&xt->cv, &xt->mu);
            continue;
        }
        cpuw *wk = &xt->W[i];
        wk->busy = 1;
        pthread_mutex_unlock(&xt->mu);
        if (fit >= 0) return wk;
        /* (re)create for at least 64 rows */
        if (wk->s) be->stream_destroy(wk->s);
        if (wk->b) be->buffer_free(xt->hdev->inst, wk->b);
        wk->s = NULL;
        wk->b = NULL;
        uint32_t cap = n > wk->cap ? n : wk->cap;
        if (cap < 64) cap = 64;
        uint32_t lx = ldx > wk->ldx ? ldx : wk->ldx;
        dsib_stream_desc d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.max_rows = cap;
        d.max_positions = 1;
        d.max_experts = xt->max_E > xt->n_slots ? xt->max_E : xt->n_slots;
        d.max_experts_used = xt->max_k;
        d.max_width = xt->max_D > xt->max_F ? xt->max_D : xt->max_F;
        uint64_t o = 0;
        wk->ox = o;
        o += ((uint64_t)cap * lx * 4 + 63) & ~(uint64_t)63;
        wk->osel = o;
        o += ((uint64_t)cap * xt->max_k * 4 + 63) & ~(uint64_t)63;
        wk->owts = o;
        o += ((uint64_t)cap * xt->max_k * 4 + 63) & ~(uint64_t)63;
        wk->oy = o;
        o += ((uint64_t)cap * xt->max_D * 4 + 63) & ~(uint64_t)63;
        wk->osg = o;
        o += ((uint64_t)cap * xt->max_k * 4 + 63) & ~(uint64_t)63;
        wk->owg = o;
        o += (uint64_t)cap * xt->max_k * 4;
        dsi_status st = be->stream_create(xt->hdev->inst, &d, &wk->s, &be_err);
        if (st == DSI_OK) st = be->buffer_alloc(xt->hdev->inst, o, DSIB_BUFFER_SCRATCH, &wk->b, &be_err);
        if (st == DSI_OK && !(wk->p = be->buffer_host_ptr(xt->hdev->inst, wk->b))) {
            st = DSI_ERR_INTERNAL;
            snprintf(be_err.msg, sizeof be_err.msg, "no host pointer");
        }
        if (st != DSI_OK) {
            if (wk->s) be->stream_destroy(wk->s);
            if (wk->b) be->buffer_free(xt->cdev->inst, wk->b);
            wk->s = NULL;
            wk->b = NULL;
            wk->cap = 0;
            pthread_mutex_lock(&xt->mu);
            wk->busy = 0;
            pthread_cond_broadcast(&xt->cv);
            pthread_mutex_unlock(&xt->mu);
            dsii_fail(e, st, "expert tier: a CPU stream for %u rows: %s", cap, be_err.msg);
            return NULL;
        }
        wk->cap = cap;
        wk->ldx = lx;
        /* the GPU side: an event (overlap) and, with device experts, the CPU part's rows */
        const dsib_backend *gbe = xt->dev->be;
        if (!wk->ev && gbe->event_create && gbe->event_record && gbe->event_sync && gbe->submit)
            if (gbe->event_create(xt->dev->inst, &wk->ev, &be_err) != DSI_OK) wk->ev = NULL;
        if (xt->dev_experts && wk->gcap < cap) {
            if (wk->gb) gbe->buffer_free(xt->dev->inst, wk->gb);
            wk->gb = NULL;
            wk->gcap = 0;
            if (gbe->buffer_alloc(xt->dev->inst, (uint64_t)cap * xt->max_D * 4, DSIB_BUFFER_SCRATCH, &wk->gb,
                                  &be_err) != DSI_OK) {
                pthread_mutex_lock(&xt->mu);
                wk->busy = 0;
                pthread_cond_broadcast(&xt->cv);
                pthread_mutex_unlock(&xt->mu);
                dsii_fail(e, DSI_ERR_OUT_OF_DEVICE_MEMORY, "expert tier: %s: rows for %u CPU results: %s",
                          xt->dev->name, cap, be_err.msg);
                return NULL;
            }
            wk->gcap = cap;
        }
        return wk;
    }
}

static void worker_give(dsii_xtier *xt, cpuw *wk) {
    pthread_mutex_lock(&xt->mu);
    wk->busy = 0;
    pthread_cond_broadcast(&xt->cv);
    pthread_mutex_unlock(&xt->mu);
}

static dsi_status check_ids(const xlayer *L, const int32_t *sl, uint64_t count, dsii_error *e) {
    for (uint64_t i = 0; i < count; i++)
        if (sl[i] < 0 || (uint32_t)sl[i] >= L->E)
            return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: routed to expert %d of %u", sl[i], L->E);
    return DSI_OK;
}

/* Distinct experts among `count` entries (entries with router weight 0 are the other side's
 * placeholders when `wt` is given: not counted). Ids are < 65536 (moe_route's limit). */
static uint64_t count_distinct(const int32_t *sl, const float *wt, uint64_t count) {
    uint64_t seen[65536 / 64] = {0}, d = 0;
    for (uint64_t i = 0; i < count; i++) {
        if ((wt && wt[i] == 0.0f) || sl[i] < 0 || sl[i] >= 65536) continue;
        uint64_t bit = 1ull << (sl[i] & 63), *w = &seen[sl[i] >> 6];
        d += !(*w & bit);
        *w |= bit;
    }
    return d;
}

/* Hybrid CPU: the layer's routed experts computed by the CPU instance from the downloaded
 * rows — with device experts (m of each layer on the GPU: 0 .. m-1, or the routing profile's
 * hottest, L->gmap) the GPU computes those entries of
 * the step's rows at the same time — and the shared expert running on the GPU meanwhile.
 *
 * A row's k entries split by expert id: the GPU call gets the row's entries of GPU experts
 * (ids rewritten to their index in the GPU's copy) and,
 * in place of the others, a placeholder (an expert of its side that the call computes anyway)
 * with router weight 0, which adds exactly +0 / -0 to the row; the CPU call the converse.
 * Each side sums its entries in k order; the row's result is GPU part + CPU part (one add on
 * the GPU). The split depends on expert ids only, so a row's result does not depend on the
 * other rows of the step or on chunking. */
static dsi_status hybrid_cpu(dsii_xtier *xt, const dsii_device *dev, dsib_stream *strm,
                             const dsii_moe_weights *w, int32_t l, dsib_view x, uint32_t ldx,
                             dsib_view sel, dsib_view wts, uint32_t n, dsib_view y, uint32_t ldy,
                             const atomic_int *cancel, const dsii_xtier_shared *shared, dsii_error *e) {
    xlayer *L = &xt->L[l];
    const uint32_t k = w->k, D = (uint32_t)w->w1.ne[0], m = xt->dev_experts;
    if (k > xt->max_k || D > xt->max_D || ldx < D)
        return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: layer %d shape exceeds the tier's", l);
    cpuw *wk = worker_take(xt, n, ldx, e);
    if (!wk) return e->status;
    const dsib_backend *gb = dev->be, *cb = xt->hdev->be;
    dsib_error be_err = {{0}};
    dsi_status st = DSI_OK;
    /* the routing on the host; the shared expert recorded behind it keeps the GPU busy */
    if (wk->ev && shared) {
        st = gb->event_record(strm, wk->ev, &be_err);
        if (st == DSI_OK) st = shared->record(shared->ctx, e) == DSI_OK ? DSI_OK : DSI_ERR_BACKEND;
        if (st == DSI_OK) st = gb->submit(strm, &be_err);
        if (st == DSI_OK) st = gb->event_sync(dev->inst, wk->ev, &be_err);
        shared = NULL;
    } else {
        st = gb->sync(strm, &be_err);
    }
    if (st != DSI_OK) {
        worker_give(xt, wk);
        if (st == DSI_ERR_BACKEND && e->status != DSI_OK) return e->status;
        return dsii_fail(e, st, "%s: routing failed: %s", dev->name, be_err.msg);
    }
    st = gb->download(dev->inst, x.buf, x.offset, wk->p + wk->ox, ((uint64_t)(n - 1) * ldx + D) * 4, &be_err);
    if (st == DSI_OK) st = gb->download(dev->inst, sel.buf, sel.offset, wk->p + wk->osel, (uint64_t)n * k * 4, &be_err);
    if (st == DSI_OK) st = gb->download(dev->inst, wts.buf, wts.offset, wk->p + wk->owts, (uint64_t)n * k * 4, &be_err);
    if (st != DSI_OK) {
        worker_give(xt, wk);
        return dsii_fail(e, st, "expert tier: %s: download of the routing failed: %s", dev->name, be_err.msg);
    }
    int32_t *sl = (int32_t *)(void *)(wk->p + wk->osel);
    float *wt = (float *)(void *)(wk->p + wk->owts);
    st = check_ids(L, sl, (uint64_t)n * k, e);
    const uint64_t nk = (uint64_t)n * k;
    if (st == DSI_OK) dsii_moe_count(w->counts, L->E, sl, nk);
    int gpu_part = 0, cpu_part = 1;
    if (st == DSI_OK && m) {
        /* split by expert id (gmap: the GPU's experts, their index there); placeholders: the
         * first entry of the side in the step */
        int32_t *sg = (int32_t *)(void *)(wk->p + wk->osg);
        float *wg = (float *)(void *)(wk->p + wk->owg);
        const int32_t *gm = L->gmap;
        int32_t g0 = -1, c0 = -1;
        for (uint64_t i = 0; i < nk; i++) {
            if (gm[sl[i]] >= 0 && g0 < 0) g0 = gm[sl[i]];
            if (gm[sl[i]] < 0 && c0 < 0) c0 = sl[i];
        }
        const int part = atomic_load_explicit(&dsii_xtier_part_test, memory_order_relaxed);
        gpu_part = g0 >= 0 && part != 2 && part != 3;
        cpu_part = c0 >= 0 && part != 1 && part != 3;
        for (uint64_t i = 0; i < nk; i++) {
            int g = gm[sl[i]] >= 0;
            sg[i] = g ? gm[sl[i]] : g0;
            wg[i] = g ? wt[i] : 0.0f;
            if (g) {
                sl[i] = c0;
                wt[i] = 0.0f;
            }
        }
        if (gpu_part) {
            atomic_fetch_add_explicit(&xt->pl->device_experts, count_distinct(sg, wg, nk), memory_order_relaxed);
            st = gb->upload(dev->inst, sel.buf, sel.offset, sg, nk * 4, &be_err);
            if (st == DSI_OK) st = gb->upload(dev->inst, wts.buf, wts.offset, wg, nk * 4, &be_err);
            if (st == DSI_OK)
                st = gb->ops->moe_experts(strm, x, ldx, sel, wts, k, &L->gw[0], &L->gw[1], &L->gw[2], w->limit, n, y, ldy);
            if (st == DSI_OK) st = gb->submit(strm, &be_err);
            if (st != DSI_OK) dsii_fail(e, st, "moe: routed experts (%s part) failed: %s", dev->name, be_err.msg);
        }
    }
    if (shared && st == DSI_OK) st = shared->record(shared->ctx, e); /* no event support: in order */
    uint64_t t0 = now_ns();
    dsib_view xv = {wk->b, wk->ox}, sv = {wk->b, wk->osel}, wv = {wk->b, wk->owts}, yv = {wk->b, wk->oy};
    if (st == DSI_OK && cpu_part && L->host) {
        /* in place from host RAM: every selected expert, one call */
        st = cb->ops->moe_experts(wk->s, xv, ldx, sv, wv, k, &L->hw[0], &L->hw[1], &L->hw[2], w->limit, n, yv, D);
        if (st == DSI_OK) st = cb->sync(wk->s, &be_err);
        if (st != DSI_OK) dsii_fail(e, st, "moe: routed experts (cpu, host tier) failed: %s", be_err.msg);
        else atomic_fetch_add_explicit(&xt->pl->cpu_experts, count_distinct(sl, m ? wt : NULL, nk), memory_order_relaxed);
    } else if (st == DSI_OK && cpu_part) {
        st = run_chunks(xt, wk->s, w, l, xv, ldx, sl, sv, 0, wv, n, yv, D, cancel, e);
    }
    uint64_t t1 = now_ns();
    if (st == DSI_OK && cpu_part) {
        /* the CPU rows into y (no device experts) or beside the GPU part, added on the GPU */
        const uint8_t *yh = wk->p + wk->oy;
        dsib_buffer *dst = gpu_part ? wk->gb : y.buf;
        uint64_t off = gpu_part ? 0 : y.offset;
        uint32_t ld = gpu_part ? D : ldy;
        if (ld == D) {
            st = gb->upload(dev->inst, dst, off, yh, (uint64_t)n * D * 4, &be_err);
        } else {
            for (uint32_t r = 0; r < n && st == DSI_OK; r++)
                st = gb->upload(dev->inst, dst, off + (uint64_t)r * ld * 4, yh + (uint64_t)r * D * 4,
                                (uint64_t)D * 4, &be_err);
        }
        if (st == DSI_OK && gpu_part) {
            dsib_view gv = {wk->gb, 0};
            st = gb->ops->add(strm, y, ldy, gv, D, y, ldy, n, D);
        }
        if (st != DSI_OK) dsii_fail(e, st, "expert tier: %s: the CPU's routed output: %s", dev->name, be_err.msg);
    }
    /* the worker's GPU rows are read by the add above: keep the worker until it ran */
    uint64_t t2 = now_ns();
    if (gpu_part && cpu_part) {
        dsi_status s2 = gb->sync(strm, &be_err);
        if (st == DSI_OK && s2 != DSI_OK) st = dsii_fail(e, s2, "%s: step failed: %s", dev->name, be_err.msg);
    }
    atomic_fetch_add_explicit(&xt->pl->overlap_cpu_ns, t1 - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(&xt->pl->overlap_wait_ns, now_ns() - t2, memory_order_relaxed);
    worker_give(xt, wk);
    return st;
}

dsi_status dsii_xtier_experts(dsii_xtier *xt, const dsii_device *dev, dsib_stream *strm,
                              const dsii_moe_weights *w, dsib_view x, uint32_t ldx, dsib_view sel,
                              dsib_view wts, uint32_t n, dsib_view y, uint32_t ldy,
                              const atomic_int *cancel, const dsii_xtier_shared *shared,
                              dsii_error *e) {
    const dsib_backend *be = dev->be;
    dsib_error be_err = {{0}};
    int32_t l = w->xt_layer;
    if (l < 0 || (uint32_t)l >= xt->n_layer || !xt->L[l].streamed)
        return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: layer %d is not streamed", l);
    if (n == 0) return shared ? shared->record(shared->ctx, e) : DSI_OK;
    /* hybrid AUTO, the cost model (docs/placement.md): upload when the step's routed experts
     * serve at least up_rows rows each on average (n·k >= up_rows·U), else the CPU computes
     * them from host RAM. An expert serves at most n rows: below up_rows rows no ids needed */
    if (xt->hcpu || (xt->autoh && xt->L[l].host && n < xt->up_rows))
        return hybrid_cpu(xt, dev, strm, w, l, x, ldx, sel, wts, n, y, ldy, cancel, shared, e);
    /* the routing is read on the host: everything recorded so far runs first */
    dsi_status st = be->sync(strm, &be_err);
    if (st != DSI_OK) return dsii_fail(e, st, "%s: routing failed: %s", dev->name, be_err.msg);
    int32_t *tmp = NULL;
    int32_t *sl = routing_host(xt, dev, sel, (uint64_t)n * w->k, &tmp, &be_err);
    if (!sl) return dsii_fail(e, DSI_ERR_BACKEND, "expert tier: %s: reading the routing failed: %s", dev->name, be_err.msg);
    st = check_ids(&xt->L[l], sl, (uint64_t)n * w->k, e);
    if (st == DSI_OK && xt->autoh && xt->L[l].host &&
        (uint64_t)n * w->k < (uint64_t)xt->up_rows * count_distinct(sl, NULL, (uint64_t)n * w->k)) {
        dsii_free(xt->ctx, tmp);
        return hybrid_cpu(xt, dev, strm, w, l, x, ldx, sel, wts, n, y, ldy, cancel, shared, e);
    }
    /* the CPU device's ids were counted by lib/moe */
    if (st == DSI_OK && strcmp(dev->name, "cpu") != 0) dsii_moe_count(w->counts, xt->L[l].E, sl, (uint64_t)n * w->k);
    if (st == DSI_OK) st = run_chunks(xt, strm, w, l, x, ldx, sl, sel, tmp != NULL, wts, n, y, ldy, cancel, e);
    dsii_free(xt->ctx, tmp);
    if (st == DSI_OK && shared) st = shared->record(shared->ctx, e);
    return st;
}

void dsii_xtier_cost(uint64_t total_experts, uint64_t *fixed, uint64_t *per_slot) {
    /* the struct, the per-layer maps and counts, the cache's alignment slack */
    *fixed = sizeof(dsii_xtier) + total_experts * (sizeof(int32_t) + sizeof(uint32_t)) + 4096 + 64 * 128;
    *per_slot = sizeof(xslot);
}

/* ---- creation ------------------------------------------------------------------------------- */

dsi_status dsii_place_exec_init(dsi_model *m, dsii_device *dev, dsii_error *e) {
    dsii_place *pl = m->place;
    if (!pl || !pl->n_tiered_layers || pl->xt) return DSI_OK;
    const int gpu_cache = pl->hybrid == DSII_HYBRID_UPLOAD || pl->hybrid == DSII_HYBRID_AUTO;
    dsii_device *cdev = pl->cpu_compute || gpu_cache ? dev : dsii_context_cpu(m->ctx);
    if (!cdev) return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: the context has no CPU instance");
    const int dcache = !pl->cpu_compute && gpu_cache;
    const int autoh = !pl->cpu_compute && pl->hybrid == DSII_HYBRID_AUTO;
    dsii_device *hdev = autoh ? dsii_context_cpu(m->ctx) : cdev;
    if (!hdev) return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: the context has no CPU instance");
    if (autoh && (!hdev->be->buffer_wrap_host || !hdev->be->buffer_host_ptr))
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "expert tier: %s cannot use host memory in place", hdev->name);
    if (!dcache && (!cdev->be->buffer_wrap_host || !cdev->be->buffer_host_ptr))
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "expert tier: %s cannot use host memory in place", cdev->name);
    if (dcache && !cdev->be->download)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "expert tier: %s cannot download", cdev->name);
    dsii_xtier *xt = dsii_calloc(m->ctx, 1, sizeof *xt);
    if (!xt) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    xt->m = m;
    xt->ctx = m->ctx;
    xt->pl = pl;
    xt->dev = dev;
    xt->cdev = cdev;
    xt->dcache = dcache;
    xt->hcpu = !pl->cpu_compute && pl->hybrid == DSII_HYBRID_CPU;
    xt->autoh = autoh;
    xt->up_rows = pl->hybrid_rows;
    xt->hdev = hdev;
    xt->dio_fd = -1;
    xt->n_slots = pl->cache_slots;
    xt->slot_bytes = pl->expert_unit_bytes;
    xt->n_layer = m->hp.n_layer < 128 ? m->hp.n_layer : 128;
    pthread_mutex_init(&xt->mu, NULL);
    pthread_cond_init(&xt->cv, NULL);
    pthread_cond_init(&xt->qcv, NULL);
    pl->xt = xt;
    for (uint32_t l = 0; l < xt->n_layer; l++) {
        xlayer *L = &xt->L[l];
        L->next = -1;
        if (!pl->layer_streamed[l]) continue;
        const dsii_layer_tensors *T = &m->w.layer[l];
        L->streamed = 1;
        L->host = pl->layer_host[l];
        L->t[0] = T->ffn_gate_exps;
        L->t[1] = T->ffn_up_exps;
        L->t[2] = T->ffn_down_exps;
        if ((uint32_t)L->t[0]->ne[0] > xt->max_D) xt->max_D = (uint32_t)L->t[0]->ne[0];
        if ((uint32_t)L->t[0]->ne[1] > xt->max_F) xt->max_F = (uint32_t)L->t[0]->ne[1];
        if (m->hp.layer[l].n_expert > xt->max_E) xt->max_E = m->hp.layer[l].n_expert;
        if (m->hp.layer[l].n_expert_used > xt->max_k) xt->max_k = m->hp.layer[l].n_expert_used;
        if ((xt->hcpu || xt->autoh) && L->host) {
            /* computed in place by the CPU instance: the host-tier tensors as CPU weights */
            for (int j = 0; j < 3; j++) {
                const dsii_tensor *t = L->t[j];
                if (!t->data) return dsii_fail(e, DSI_ERR_INTERNAL, "expert tier: '%s' is not in host memory", t->name);
                dsib_error be_err = {{0}};
                dsi_status st = hdev->be->buffer_wrap_host(hdev->inst, (void *)(uintptr_t)t->data, t->nbytes,
                                                           DSIB_BUFFER_WEIGHTS, &L->hb[j], &be_err);
                if (st != DSI_OK) return dsii_fail(e, st, "expert tier: %s: %s", hdev->name, be_err.msg);
                dsib_weight *hw = &L->hw[j];
                memset(hw, 0, sizeof *hw);
                hw->buf = L->hb[j];
                hw->type = t->type;
                hw->id = (uint32_t)(t - m->tensors) + 1;
                hw->ne[0] = t->ne[0];
                hw->ne[1] = t->ne[1];
                hw->ne[2] = t->ne[2];
                hw->nb1 = t->row_stride;
                hw->nb2 = (uint64_t)t->ne[1] * t->row_stride;
            }
        }
        uint64_t o = 0;
        for (int j = 0; j < 3; j++) {
            L->slice[j] = (uint64_t)L->t[j]->ne[1] * L->t[j]->row_stride;
            L->part[j] = o;
            o += (L->slice[j] + 63) & ~(uint64_t)63;
        }
        L->E = m->hp.layer[l].n_expert;
        L->map = dsii_malloc(m->ctx, sizeof(int32_t) * (L->E ? L->E : 1));
        L->freq = dsii_calloc(m->ctx, L->E ? L->E : 1, sizeof(uint32_t));
        if (!L->map || !L->freq) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
        for (uint32_t i = 0; i < L->E; i++) L->map[i] = -1;
    }
    for (int32_t l = (int32_t)xt->n_layer - 1, nx = -1; l >= 0; l--) {
        xt->L[l].next = nx;
        if (xt->L[l].streamed) nx = l;
    }
    xt->slots = dsii_calloc(m->ctx, xt->n_slots ? xt->n_slots : 1, sizeof *xt->slots);
    if (!xt->slots) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (uint32_t s = 0; s < xt->n_slots; s++) {
        xt->slots[s].layer = -1;
        xt->slots[s].expert = -1;
    }
    host_add(pl, pl->tier_bytes);
    xt->tier_counted = 1;
    if (xt->n_slots) {
        dsib_error be_err = {{0}};
        dsi_status st;
        if (dcache) {
            /* the cache on the GPU, a slot never straddling an allocation piece; disk reads
             * through host staging pieces (counted in tier_bytes) */
            if (cdev->be->buffer_alloc_rows)
                st = cdev->be->buffer_alloc_rows(cdev->inst, pl->cache_bytes, xt->slot_bytes, DSIB_BUFFER_WEIGHTS,
                                                 &xt->buf, &be_err);
            else
                st = cdev->be->buffer_alloc(cdev->inst, pl->cache_bytes, DSIB_BUFFER_WEIGHTS, &xt->buf, &be_err);
            if (st != DSI_OK)
                return dsii_fail(e, st, "expert tier: the %llu-byte expert cache on %s: %s",
                                 (unsigned long long)pl->cache_bytes, cdev->name, be_err.msg);

        } else {
            if (!dsii_bigbuf_alloc(m->ctx, (size_t)pl->cache_bytes, 4096, &xt->mem_buf))
                return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "expert tier: out of host memory for the %llu-byte cache",
                                 (unsigned long long)pl->cache_bytes);
            xt->mem = xt->mem_buf.p;
            host_add(pl, pl->cache_bytes);
            st = cdev->be->buffer_wrap_host(cdev->inst, xt->mem, pl->cache_bytes, DSIB_BUFFER_WEIGHTS, &xt->buf,
                                            &be_err);
            if (st != DSI_OK) return dsii_fail(e, st, "expert tier: %s: %s", cdev->name, be_err.msg);
        }
    }
    if (pl->n_experts_streamed && (pl->flags & DSII_PLACE_FLAG_DIRECT_IO)) {
        const dsii_file *f = dsii_gguf_file(m->gguf);
        if (dsii_file_mode(f) != DSII_FILE_PREAD)
            return dsii_fail(e, DSI_ERR_INVALID_ARGUMENT,
                             "DSI_PLACE_FLAG_DIRECT_IO needs a model loaded from a path with DSI_ACCESS_PREAD");
#if defined(O_DIRECT)
        xt->dio_fd = open(dsii_file_name(f), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (xt->dio_fd < 0)
            return dsii_fail(e, DSI_ERR_UNSUPPORTED, "DSI_PLACE_FLAG_DIRECT_IO: %s cannot be opened with O_DIRECT: %s",
                             dsii_file_name(f), strerror(errno));
#else
        return dsii_fail(e, DSI_ERR_UNSUPPORTED, "DSI_PLACE_FLAG_DIRECT_IO: no O_DIRECT on this system");
#endif
    }
    if (pl->n_experts_streamed && (dcache || xt->dio_fd >= 0))
        for (uint32_t i = 0; i < DSII_XTIER_STAGES; i++)
            if (!(xt->stage[i] = dsii_malloc_aligned(m->ctx, READ_PIECE + 2 * DSII_XTIER_DIO_ALIGN, DSII_XTIER_DIO_ALIGN)))
                return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "expert tier: out of host memory");
    if (xt->hcpu && pl->dev_experts) {
        /* m experts of every tiered layer on the GPU — 0 .. m-1, or the routing profile's
         * hottest (pl->dev_ids) — copied into one buffer per tensor in ascending id order
         * (hybrid CPU splits a step's entries by expert id through L->gmap) */
        xt->dev_experts = pl->dev_experts;
        uint64_t total = 0;
        uint8_t *piece = NULL;
        for (uint32_t l = 0; l < xt->n_layer; l++) {
            xlayer *L = &xt->L[l];
            if (!L->streamed) continue;
            if (!(L->gmap = dsii_malloc(m->ctx, sizeof(int32_t) * (L->E ? L->E : 1)))) {
                dsii_free(m->ctx, piece);
                return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "expert tier: out of host memory");
            }
            for (uint32_t x = 0; x < L->E; x++) L->gmap[x] = -1;
            const uint32_t *ids = pl->dev_ids ? pl->dev_ids + (size_t)l * xt->dev_experts : NULL;
            for (uint32_t i = 0; i < xt->dev_experts; i++) L->gmap[ids ? ids[i] : i] = (int32_t)i;
            for (int j = 0; j < 3; j++) {
                const dsii_tensor *t = L->t[j];
                uint64_t bytes = (uint64_t)xt->dev_experts * L->slice[j];
                dsib_error be_err = {{0}};
                dsi_status st = dev->be->buffer_alloc_rows
                                    ? dev->be->buffer_alloc_rows(dev->inst, bytes, t->row_stride, DSIB_BUFFER_WEIGHTS,
                                                                 &L->gb[j], &be_err)
                                    : dev->be->buffer_alloc(dev->inst, bytes, DSIB_BUFFER_WEIGHTS, &L->gb[j], &be_err);
                for (uint64_t o = 0; st == DSI_OK && o < bytes;) {
                    /* GPU expert i = expert ids[i] (or i) of the tensor; pieces within a slice */
                    const uint64_t sl = L->slice[j], i = o / sl, in = o % sl;
                    const uint64_t so = (ids ? ids[i] : i) * sl + in;
                    uint64_t nb = sl - in < READ_PIECE ? sl - in : READ_PIECE;
                    const void *src = t->data ? (const uint8_t *)t->data + so : NULL;
                    if (!src) {
                        if (!piece && !(piece = dsii_malloc(m->ctx, READ_PIECE))) {
                            st = DSI_ERR_OUT_OF_HOST_MEMORY;
                            snprintf(be_err.msg, sizeof be_err.msg, "out of host memory");
                            break;
                        }
                        dsii_error re;
                        dsii_error_clear(&re);
                        st = dsii_model_tensor_read(m, t, so, nb, piece, &re);
                        if (st != DSI_OK) {
                            snprintf(be_err.msg, sizeof be_err.msg, "%.200s", re.msg);
                            break;
                        }
                        src = piece;
                    }
                    st = dev->be->upload(dev->inst, L->gb[j], o, src, nb, &be_err);
                    o += nb;
                }
                if (st != DSI_OK) {
                    dsii_free(m->ctx, piece);
                    return dsii_fail(e, st, "expert tier: %u experts of '%s' on %s: %s", xt->dev_experts,
                                     t->name, dev->name, be_err.msg);
                }
                dsib_weight *gw = &L->gw[j];
                memset(gw, 0, sizeof *gw);
                gw->buf = L->gb[j];
                gw->type = t->type;
                gw->ne[0] = t->ne[0];
                gw->ne[1] = t->ne[1];
                gw->ne[2] = xt->dev_experts;
                gw->nb1 = t->row_stride;
                gw->nb2 = L->slice[j];
                total += bytes;
            }
        }
        dsii_free(m->ctx, piece);
        pl->dev_split_bytes = total;
    }
    dsi_status pst = preload(xt, e);
    if (pst != DSI_OK) return pst;
    if (xt->n_slots && !(pl->flags & DSII_PLACE_FLAG_NO_PREFETCH)) {
        if (pthread_create(&xt->th, NULL, reader_main, xt) == 0) xt->th_on = 1;
        else dsii_log(m->ctx, DSI_LOG_WARN, "expert tier: no reader thread; read-ahead off");
    }
    return DSI_OK;
}

dsi_status dsii_place_engram_cache(dsi_model *m, uint32_t j, dsii_engram_table *t, dsii_error *e) {
    dsii_place *pl = m ? m->place : NULL;
    t->cache = NULL;
    if (!pl || !pl->engram_cache_bytes || j >= 16 || !t->row_bytes) return DSI_OK;
    if (pl->ecache[j]) {
        t->cache = pl->ecache[j];
        return DSI_OK;
    }
    uint64_t share = pl->engram_cache_bytes / pl->n_engram_disk;
    uint64_t rows = share / (t->row_bytes + sizeof(uint64_t));
    if (rows > t->n_rows) rows = t->n_rows;
    if (rows == 0) return DSI_OK;
    dsii_engram_cache *c = dsii_calloc(m->ctx, 1, sizeof *c);
    if (!c) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    c->tag = dsii_calloc(m->ctx, (size_t)rows, sizeof *c->tag);
    c->data = dsii_malloc(m->ctx, (size_t)(rows * t->row_bytes));
    if (!c->tag || !c->data) {
        dsii_free(m->ctx, c->tag);
        dsii_free(m->ctx, c->data);
        dsii_free(m->ctx, c);
        return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "Engram row cache: out of host memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->n_rows = rows;
    c->hits = &pl->engram_hits;
    c->misses = &pl->engram_misses;
    c->bytes_read = &pl->engram_bytes_read;
    pl->ecache[j] = c;
    t->cache = c;
    host_add(pl, rows * (t->row_bytes + sizeof(uint64_t)));
    return DSI_OK;
}

static void engram_caches_free(dsi_model *m, dsii_place *pl) {
    for (int j = 0; j < 16; j++) {
        dsii_engram_cache *c = pl->ecache[j];
        if (!c) continue;
        pthread_mutex_destroy(&c->mu);
        dsii_free(m->ctx, c->tag);
        dsii_free(m->ctx, c->data);
        dsii_free(m->ctx, c);
        pl->ecache[j] = NULL;
    }
}

void dsii_place_exec_fini(dsi_model *m) {
    dsii_place *pl = m ? m->place : NULL;
    if (pl) engram_caches_free(m, pl);
    dsii_xtier *xt = pl ? pl->xt : NULL;
    if (!xt) return;
    if (xt->th_on) {
        pthread_mutex_lock(&xt->mu);
        xt->stop = 1;
        pthread_cond_broadcast(&xt->qcv);
        pthread_mutex_unlock(&xt->mu);
        pthread_join(xt->th, NULL);
    }
    const dsib_backend *cb = xt->cdev->be, *gbe = xt->dev->be, *hb = xt->hdev ? xt->hdev->be : cb;
    for (int i = 0; i < NWORK; i++) {
        if (xt->W[i].s) hb->stream_destroy(xt->W[i].s);
        if (xt->W[i].b) hb->buffer_free(xt->hdev->inst, xt->W[i].b);
        if (xt->W[i].ev) gbe->event_destroy(xt->dev->inst, xt->W[i].ev);
        if (xt->W[i].gb) gbe->buffer_free(xt->dev->inst, xt->W[i].gb);
    }
    if (xt->buf) cb->buffer_free(xt->cdev->inst, xt->buf);
    for (uint32_t i = 0; i < DSII_XTIER_STAGES; i++) dsii_free_aligned(m->ctx, xt->stage[i]);
    if (xt->dio_fd >= 0) close(xt->dio_fd);
    if (xt->mem) {
        dsii_bigbuf_free(m->ctx, &xt->mem_buf);
        xt->mem = NULL;
        atomic_fetch_sub(&pl->host_used, pl->cache_bytes);
    }
    if (xt->tier_counted) atomic_fetch_sub(&pl->host_used, pl->tier_bytes);
    for (uint32_t l = 0; l < xt->n_layer; l++) {
        for (int j = 0; j < 3; j++) {
            if (xt->L[l].hb[j]) hb->buffer_free(xt->hdev->inst, xt->L[l].hb[j]);
            if (xt->L[l].gb[j]) gbe->buffer_free(xt->dev->inst, xt->L[l].gb[j]);
        }
        dsii_free(m->ctx, xt->L[l].map);
        dsii_free(m->ctx, xt->L[l].freq);
        dsii_free(m->ctx, xt->L[l].gmap);
    }
    dsii_free(m->ctx, xt->slots);
    pthread_cond_destroy(&xt->qcv);
    pthread_cond_destroy(&xt->cv);
    pthread_mutex_destroy(&xt->mu);
    dsii_free(m->ctx, xt);
    pl->xt = NULL;
}

/* ---- binding (lib/arch) --------------------------------------------------------------------- */

dsi_status dsii_place_bind_experts(dsii_wtable *wt, int32_t layer, const dsii_tensor *gate,
                                   const dsii_tensor *up, const dsii_tensor *down,
                                   dsii_moe_weights *mw, dsii_error *e) {
    dsi_model *m = wt->model;
    dsii_place *pl = m ? m->place : NULL;
    mw->xt = NULL;
    mw->xt_layer = -1;
    mw->counts = m && m->expert_counts && layer >= 0 && (uint32_t)layer < m->counts_layers
                     ? m->expert_counts + (size_t)layer * m->counts_experts : NULL;
    if (!pl || !pl->xt || layer < 0 || layer >= 128 || !pl->layer_streamed[layer]) {
        dsi_status st = dsii_wtable_bind(wt, gate, &mw->w1, e);
        if (st == DSI_OK) st = dsii_wtable_bind(wt, up, &mw->w3, e);
        if (st == DSI_OK) st = dsii_wtable_bind(wt, down, &mw->w2, e);
        return st;
    }
    const dsii_tensor *t[3] = {gate, up, down};
    dsib_weight *out[3] = {&mw->w1, &mw->w3, &mw->w2};
    for (int j = 0; j < 3; j++) {
        memset(out[j], 0, sizeof *out[j]);
        out[j]->type = t[j]->type;
        out[j]->ne[0] = t[j]->ne[0];
        out[j]->ne[1] = t[j]->ne[1];
        out[j]->ne[2] = t[j]->ne[2];
        out[j]->nb1 = t[j]->row_stride;
        out[j]->nb2 = (uint64_t)t[j]->ne[1] * t[j]->row_stride;
    }
    mw->xt = pl->xt;
    mw->xt_layer = layer;
    pl->xt->L[layer].mw = mw;
    return DSI_OK;
}

uint32_t dsii_xtier_slots(const dsi_model *m) {
    return m && m->place && m->place->xt ? m->place->xt->n_slots : 0;
}

int dsii_xtier_active(const dsi_model *m) { return m && m->place && m->place->xt; }
