/*
 * backends/vulkan/vk_ops.c — struct dsib_ops on Vulkan compute shaders.
 *
 * Each op resolves its views to binding windows (vk_backend.c), fills the shader's push
 * words and records dispatches on its stream (the stream's current frame, or its capture).
 * Positions, slots and sequence boundaries are read by the shaders from the step rows, so
 * push words never hold a position: a recorded step replays at any position. Temporaries
 * live in the stream's workspace. Weight reads are split into windows of rows / experts
 * that fit one storage binding (docs/vulkan.md "Large tensors").
 */
#include "backends/vulkan/vk_impl.h"
#include "backends/types.h"
#include "lib/quant/statepack.h"

#include <math.h>
#include <string.h>

/* ---- tensor types -------------------------------------------------------------------------- */

/* Geometry from the shared table (backends/types.h); here only the matmul shader of each
 * type this module has kernels for. */
typedef struct vk_type {
    int32_t type;
    uint32_t blck, bytes;
    const char *shader; /* matmul variant */
} vk_type;

static const struct {
    int32_t type;
    const char *shader;
} k_shaders[] = {
    {DSI_TYPE_F32, "matmul_f32"},
    {DSI_TYPE_F16, "matmul_f16"},
    {DSI_TYPE_BF16, "matmul_bf16"},
    {DSI_TYPE_Q8_0, "matmul_q8_0"},
    {DSI_TYPE_Q4_K, "matmul_q4_k"},
    {DSI_TYPE_Q2_K, "matmul_q2_k"},
    {DSI_TYPE_MXFP4, "matmul_mxfp4"},
    {DSI_TYPE_FP8_E4M3_B128, "matmul_fp8_b128"},
    {DSI_TYPE_FP8_E4M3_B32, "matmul_fp8_b32"},
    {DSI_TYPE_FP8_E4M3_R32, "matmul_fp8_b32"}, /* same bytes as B32 (tensor-types.md) */
    /* ggml types of shaders/wload_ggml.glsl (ids as ggml's) */
    {2, "matmul_q4_0"},      {3, "matmul_q4_1"},    {6, "matmul_q5_0"},    {7, "matmul_q5_1"},
    {11, "matmul_q3_k"},     {13, "matmul_q5_k"},   {14, "matmul_q6_k"},   {20, "matmul_iq4_nl"},
    {23, "matmul_iq4_xs"},   {18, "matmul_iq3_xxs"}, {21, "matmul_iq3_s"},  {16, "matmul_iq2_xxs"},
    {17, "matmul_iq2_xs"},   {22, "matmul_iq2_s"},  {19, "matmul_iq1_s"},  {29, "matmul_iq1_m"},
};

/* Fills *out for a type with a matmul shader and returns out; NULL otherwise. */
static const vk_type *type_info(int32_t type, vk_type *out) {
    for (size_t i = 0; i < sizeof k_shaders / sizeof k_shaders[0]; i++) {
        if (k_shaders[i].type != type) continue;
        const dsib_type_info *g = dsib_type_info_get(type);
        if (!g) return NULL;
        out->type = type;
        out->blck = g->blck;
        out->bytes = g->type_size;
        out->shader = k_shaders[i].shader;
        return out;
    }
    return NULL;
}

static uint64_t row_bytes(const vk_type *t, int64_t ne0) {
    return (uint64_t)((ne0 + t->blck - 1) / t->blck) * t->bytes;
}

/* ---- op context ------------------------------------------------------------------------------ */

typedef struct opc {
    dsib_instance *inst;
    dsib_stream *s;
    dsib_vk_rec *r;
    const char *name;
} opc;

static dsi_status op_start(dsib_stream *s, opc *c, const char *name) {
    c->s = s;
    c->inst = s ? s->inst : NULL;
    c->name = name;
    c->r = s ? dsib_vk_stream_rec(s) : NULL;
    return c->r ? DSI_OK : DSI_ERR_BACKEND;
}

/* An op's status: its own, or the first failure recorded on the target (reported again by
 * sync / capture_end). */
static dsi_status op_end(opc *c, dsi_status st) {
    if (st == DSI_OK && c->r->status != DSI_OK) st = c->r->status;
    return st;
}

#define FAIL(c, st, ...) dsib_vk_rec_fail((c)->r, (st), __VA_ARGS__)

/* Resolves an f32 / int32 view of `need` bytes; *off receives the word offset the shader adds. */
static dsi_status bind_words(opc *c, dsib_view v, uint64_t need, dsib_vk_bind *b, uint32_t *off,
                             const char *what) {
    if (!v.buf) return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: %s buffer is NULL", c->name, what);
    if (v.offset & 3)
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: %s offset %llu is not 4-aligned",
                    c->name, what, (unsigned long long)v.offset);
    if (need == 0) need = 4;
    if (v.offset > v.buf->size || need > v.buf->size - v.offset)
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT,
                    "vulkan %s: %s view (%llu bytes at %llu) exceeds its %llu-byte buffer",
                    c->name, what, (unsigned long long)need, (unsigned long long)v.offset,
                    (unsigned long long)v.buf->size);
    dsi_status st = dsib_vk_resolve(c->inst, v.buf, v.offset, need, b);
    if (st != DSI_OK)
        return FAIL(c, DSI_ERR_UNSUPPORTED,
                    "vulkan %s: %s view of %llu bytes does not fit one binding window "
                    "(%llu bytes) inside one allocation chunk",
                    c->name, what, (unsigned long long)need,
                    (unsigned long long)c->inst->max_binding);
    *off = b->skew / 4;
    return DSI_OK;
}

/* Bytes spanned by `rows` rows of `width` words with row stride `ld` words. */
static uint64_t span(uint32_t rows, uint32_t ld, uint64_t width) {
    if (rows == 0 || width == 0) return 4;
    return ((uint64_t)(rows - 1) * ld + width) * 4;
}

/* Small parameter tensors (f32 / f16 / bf16): binding + (type code, skew). */
static dsi_status bind_param(opc *c, const dsib_weight *w, uint64_t count, dsib_vk_bind *b,
                             uint32_t *type_code, uint32_t *skew, const char *what) {
    uint32_t es;
    switch (w->type) {
    case DSI_TYPE_F32: *type_code = 0, es = 4; break;
    case DSI_TYPE_F16: *type_code = 1, es = 2; break;
    case DSI_TYPE_BF16: *type_code = 2, es = 2; break;
    default:
        return FAIL(c, DSI_ERR_UNSUPPORTED, "vulkan %s: %s of type %d is not supported", c->name,
                    what, (int)w->type);
    }
    if (w->offset & (es - 1))
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: %s is misaligned", c->name, what);
    if (dsib_vk_resolve(c->inst, w->buf, w->offset, count * es, b) != DSI_OK)
        return FAIL(c, DSI_ERR_UNSUPPORTED, "vulkan %s: %s does not fit one binding", c->name, what);
    *skew = b->skew;
    return DSI_OK;
}

static int shader(const char *name) { return dsib_vk_shader_index(name); }

/* The best variant of a shader for this device: of the "<name>_<variant>" entries whose needs
 * the device meets, the one that needs most ("_nw" on a CPU device, then "_sg" where the
 * device has subgroup arithmetic; DSINFER_VULKAN_BASELINE / _NO_NARROW drop them), else the
 * baseline "<name>". */
static int pick(const dsib_instance *inst, const char *name) {
    int best = -1;
    size_t n = strlen(name);
    for (size_t i = 0; i < dsib_vk_n_shaders; i++) {
        const dsib_vk_shader *s = &dsib_vk_shaders[i];
        if (!s->needs || (s->needs & ~inst->variant_features)) continue;
        if (strncmp(s->name, name, n) == 0 && s->name[n] == '_' &&
            (best < 0 || s->needs > dsib_vk_shaders[best].needs))
            best = (int)i;
    }
    return best >= 0 ? best : dsib_vk_shader_index(name);
}

/* Dispatches with gy split into chunks of at most 65535 rows; push word `base_word` carries
 * the chunk's first row. */
static dsi_status dispatch_rows(opc *c, int si, const dsib_vk_bind *b, uint32_t nb, uint32_t *push,
                                uint32_t np, uint32_t gx, uint32_t rows, uint32_t gz,
                                uint32_t base_word, int rows_in_x) {
    uint32_t lim = rows_in_x ? c->inst->max_groups[0] : c->inst->max_groups[1];
    if (lim > 65535) lim = 65535;
    for (uint32_t r0 = 0; r0 < rows; r0 += lim) {
        uint32_t cnt = rows - r0 < lim ? rows - r0 : lim;
        push[base_word] = r0;
        dsi_status st = rows_in_x ? dsib_vk_dispatch(c->inst, c->r, (uint32_t)si, b, nb, push, np, cnt, gx, gz)
                                  : dsib_vk_dispatch(c->inst, c->r, (uint32_t)si, b, nb, push, np, gx, cnt, gz);
        if (st != DSI_OK) return st;
    }
    return DSI_OK;
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- matmul family ------------------------------------------------------------------------- */

enum { MM_PLAIN = 0, MM_IDS = 1, MM_ROWS = 2, MM_ROWS_ADD = 3 };

/* One weight window: experts [e0, e0+ne) × rows [r0, r0+nr) resolved to a binding. */
typedef struct mm_win {
    uint32_t e0, ne, r0, nr;
    dsib_vk_bind b;
} mm_win;

/* Iterates the windows of `w` (experts [e_first, e_last), all rows) in order; calls fn. */
typedef dsi_status (*win_fn)(opc *c, const dsib_weight *w, const mm_win *win, void *ud);

static dsi_status for_windows(opc *c, const dsib_weight *w, uint32_t e_first, uint32_t e_last,
                              win_fn fn, void *ud) {
    vk_type tv_;
    const vk_type *t = type_info(w->type, &tv_);
    if (!t)
        return FAIL(c, DSI_ERR_UNSUPPORTED, "vulkan %s: weight type %d is not supported", c->name,
                    (int)w->type);
    if (!w->buf) return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: weight buffer is NULL", c->name);
    uint64_t rb = row_bytes(t, w->ne[0]);
    uint32_t ne1 = (uint32_t)w->ne[1];
    uint64_t ebytes = (uint64_t)(ne1 - 1) * w->nb1 + rb; /* one expert */
    if ((w->type == DSI_TYPE_F32 && ((w->offset | w->nb1 | w->nb2) & 3)) ||
        ((w->type == DSI_TYPE_F16 || w->type == DSI_TYPE_BF16) && ((w->offset | w->nb1 | w->nb2) & 1)) ||
        (t->bytes % 2 == 0 && ((w->offset | w->nb1 | w->nb2) & 1))) /* 16-bit fields (wload.glsl) */
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: weight rows are misaligned", c->name);
    uint32_t e = e_first;
    while (e < e_last) {
        uint64_t off = w->offset + (uint64_t)e * w->nb2;
        uint64_t avail = dsib_vk_window_avail(c->inst, w->buf, off);
        mm_win win;
        memset(&win, 0, sizeof win);
        if (avail >= ebytes && (e_last - e == 1 || w->nb2 >= ebytes)) {
            /* whole experts */
            uint32_t fit = 1;
            while (e + fit < e_last && (uint64_t)fit * w->nb2 + ebytes <= avail) fit++;
            win.e0 = e;
            win.ne = fit;
            win.r0 = 0;
            win.nr = ne1;
            if (dsib_vk_resolve(c->inst, w->buf, off, (uint64_t)(fit - 1) * w->nb2 + ebytes, &win.b) != DSI_OK)
                return FAIL(c, DSI_ERR_INTERNAL, "vulkan %s: window resolution failed", c->name);
            dsi_status st = fn(c, w, &win, ud);
            if (st != DSI_OK) return st;
            e += fit;
            continue;
        }
        /* one expert in row windows */
        uint32_t r = 0;
        while (r < ne1) {
            uint64_t roff = off + (uint64_t)r * w->nb1;
            uint64_t a = dsib_vk_window_avail(c->inst, w->buf, roff);
            if (a < rb)
                return FAIL(c, DSI_ERR_UNSUPPORTED,
                            "vulkan %s: a weight row (%llu bytes at %llu) straddles an allocation "
                            "chunk or exceeds the binding window",
                            c->name, (unsigned long long)rb, (unsigned long long)roff);
            uint64_t fit = (a - rb) / w->nb1 + 1;
            if (fit > ne1 - r) fit = ne1 - r;
            win.e0 = e;
            win.ne = 1;
            win.r0 = r;
            win.nr = (uint32_t)fit;
            if (dsib_vk_resolve(c->inst, w->buf, roff, (fit - 1) * w->nb1 + rb, &win.b) != DSI_OK)
                return FAIL(c, DSI_ERR_INTERNAL, "vulkan %s: window resolution failed", c->name);
            dsi_status st = fn(c, w, &win, ud);
            if (st != DSI_OK) return st;
            r += (uint32_t)fit;
        }
        e++;
    }
    return DSI_OK;
}

typedef struct mm_args {
    int mode;
    dsib_vk_bind bx, by, bi;
    uint32_t x_off, ldx, y_off, ldy, n, R, Kg, ids_off, xdiv, period;
    int si;
} mm_args;

static dsi_status mm_window(opc *c, const dsib_weight *w, const mm_win *win, void *ud) {
    mm_args *a = ud;
    uint32_t p[DSIB_VK_PUSH_WORDS];
    memset(p, 0, sizeof p);
    p[0] = (uint32_t)a->mode;
    p[1] = win->b.skew;
    p[2] = (uint32_t)w->nb1;
    p[3] = (uint32_t)(w->nb2 > 0xFFFFFFFFull ? 0 : w->nb2);
    p[4] = (uint32_t)w->ne[0];
    p[5] = win->r0;
    p[6] = win->nr;
    p[7] = win->e0;
    p[8] = win->ne;
    p[9] = a->x_off;
    p[10] = a->ldx;
    p[11] = a->y_off;
    p[12] = a->ldy;
    p[13] = a->n;
    p[14] = a->R ? a->R : 0xFFFFFFFFu;
    p[15] = a->Kg;
    p[16] = a->ids_off;
    p[17] = a->mode == MM_ROWS_ADD ? a->period : (a->xdiv ? a->xdiv : 1);
    dsib_vk_bind b[4] = {win->b, a->bx, a->by, a->bi};
    /* The narrow variant (a CPU device) computes up to 4 output rows per group (push 19), each
     * row's sum as alone: 4 where the rows of a group read the same x columns (no groups, or
     * groups of a multiple of 4 rows starting on a multiple of 4) */
    uint32_t rpg = 1;
    if ((dsib_vk_shaders[a->si].needs & DSIB_VK_NEED_NARROW) &&
        (a->Kg == 0 || (a->R % 4 == 0 && win->r0 % 4 == 0)))
        rpg = 4;
    p[19] = rpg;
    uint32_t ng = (win->nr + rpg - 1) / rpg;
    if (a->mode == MM_PLAIN) {
        uint32_t gy = (a->n + 3) / 4;
        return dispatch_rows(c, a->si, b, 4, p, 32, gy, ng, 1, 18, 1);
    }
    if (a->mode == MM_IDS) {
        uint32_t gy = a->n < 65535 ? a->n : 65535, gz = (a->n + 65534) / 65535;
        return dispatch_rows(c, a->si, b, 4, p, 32, gy, ng, gz, 18, 1);
    }
    /* rows: gx = column blocks, gy = tokens */
    uint32_t gx = (uint32_t)((w->ne[0] + 63) / 64);
    p[18] = 0;
    return dsib_vk_dispatch(c->inst, c->r, (uint32_t)a->si, b, 4, p, 32, gx, a->n, 1);
}

static dsi_status matmul_impl(opc *c, const dsib_weight *w, int32_t expert, uint32_t groups,
                              dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n) {
    if (n == 0) return DSI_OK;
    vk_type tv_;
    const vk_type *t = type_info(w->type, &tv_);
    if (!t) return FAIL(c, DSI_ERR_UNSUPPORTED, "vulkan %s: weight type %d is not supported", c->name, (int)w->type);
    if (expert < 0 || expert >= (w->ne[2] ? w->ne[2] : 1) || groups == 0 || w->ne[1] % groups)
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: bad expert / groups", c->name);
    mm_args a;
    memset(&a, 0, sizeof a);
    a.mode = MM_PLAIN;
    a.si = pick(c->inst, t->shader);
    uint64_t K = (uint64_t)w->ne[0];
    dsi_status st = bind_words(c, x, span(n, ldx, K * groups), &a.bx, &a.x_off, "x");
    if (st == DSI_OK) st = bind_words(c, y, span(n, ldy, (uint64_t)w->ne[1]), &a.by, &a.y_off, "y");
    if (st != DSI_OK) return st;
    a.bi = a.bx;
    a.ldx = ldx;
    a.ldy = ldy;
    a.n = n;
    a.R = (uint32_t)(w->ne[1] / groups);
    a.Kg = groups > 1 ? (uint32_t)K : 0;
    return for_windows(c, w, (uint32_t)expert, (uint32_t)expert + 1, mm_window, &a);
}

static dsi_status op_matmul(dsib_stream *strm, const dsib_weight *w, int32_t expert,
                            dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy, uint32_t n) {
    opc c;
    if (op_start(strm, &c, "matmul") != DSI_OK) return DSI_ERR_BACKEND;
    return op_end(&c, matmul_impl(&c, w, expert, 1, x, ldx, y, ldy, n));
}

static dsi_status op_matmul_grouped(dsib_stream *strm, const dsib_weight *w, uint32_t groups,
                                    dsib_view x, uint32_t ldx, dsib_view y, uint32_t ldy,
                                    uint32_t n) {
    opc c;
    if (op_start(strm, &c, "matmul_grouped") != DSI_OK) return DSI_ERR_BACKEND;
    return op_end(&c, matmul_impl(&c, w, 0, groups, x, ldx, y, ldy, n));
}

static dsi_status op_get_rows(dsib_stream *strm, const dsib_weight *table, dsib_view ids,
                              dsib_view y, uint32_t ldy, uint32_t n) {
    opc c;
    if (op_start(strm, &c, "get_rows") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (n) {
        vk_type tv_;
        const vk_type *t = type_info(table->type, &tv_);
        if (!t) {
            st = FAIL(&c, DSI_ERR_UNSUPPORTED, "vulkan get_rows: type %d is not supported", (int)table->type);
        } else {
            mm_args a;
            memset(&a, 0, sizeof a);
            a.mode = MM_ROWS;
            a.si = pick(c.inst, t->shader);
            st = bind_words(&c, ids, (uint64_t)n * 4, &a.bi, &a.ids_off, "ids");
            if (st == DSI_OK) st = bind_words(&c, y, span(n, ldy, (uint64_t)table->ne[0]), &a.by, &a.y_off, "y");
            a.bx = a.by;
            a.ldy = ldy;
            a.n = n;
            if (st == DSI_OK) st = for_windows(&c, table, 0, 1, mm_window, &a);
        }
    }
    return op_end(&c, st);
}

static dsi_status op_add_rows_periodic(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t n,
                                       uint32_t width, const dsib_weight *table, dsib_view rows,
                                       uint32_t period) {
    opc c;
    if (op_start(strm, &c, "add_rows_periodic") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (period == 0 || table->ne[0] != (int64_t)width)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT,
                  "vulkan add_rows_periodic: width must equal the table row length");
    else if (n) {
        vk_type tv_;
        const vk_type *t = type_info(table->type, &tv_);
        if (!t) {
            st = FAIL(&c, DSI_ERR_UNSUPPORTED, "vulkan add_rows_periodic: type %d unsupported", (int)table->type);
        } else {
            mm_args a;
            memset(&a, 0, sizeof a);
            a.mode = MM_ROWS_ADD;
            a.si = pick(c.inst, t->shader);
            st = bind_words(&c, x, span(n, ldx, width), &a.by, &a.y_off, "x");
            if (st == DSI_OK) st = bind_words(&c, rows, (uint64_t)n * 16, &a.bi, &a.ids_off, "rows");
            a.bx = a.by;
            a.ldy = ldx;
            a.n = n;
            a.period = period;
            if (st == DSI_OK) st = for_windows(&c, table, 0, 1, mm_window, &a);
        }
    }
    return op_end(&c, st);
}

/* ---- element-wise family ---------------------------------------------------------------------- */

enum { EW_ADD = 0, EW_SCALE, EW_SWIGLU, EW_EXPAND, EW_COLLAPSE, EW_POST, EW_MOE_SWIGLU, EW_SUMK };

static dsi_status ew(opc *c, uint32_t *p, const dsib_vk_bind *b, uint32_t rows, uint32_t width) {
    p[1] = rows;
    p[2] = width;
    return dispatch_rows(c, shader("eltwise"), b, 5, p, 32, (width + 63) / 64, rows, 1, 13, 0);
}

static dsi_status op_add(dsib_stream *strm, dsib_view a, uint32_t lda, dsib_view b, uint32_t ldb,
                         dsib_view y, uint32_t ldy, uint32_t rows, uint32_t width) {
    opc c;
    if (op_start(strm, &c, "add") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[5];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {EW_ADD};
    dsi_status st = DSI_OK;
    if (rows && width) {
        st = bind_words(&c, a, span(rows, lda, width), &bd[0], &p[3], "a");
        if (st == DSI_OK) st = bind_words(&c, b, span(rows, ldb, width), &bd[1], &p[5], "b");
        if (st == DSI_OK) st = bind_words(&c, y, span(rows, ldy, width), &bd[2], &p[7], "y");
        p[4] = lda, p[6] = ldb, p[8] = ldy;
        if (st == DSI_OK) st = ew(&c, p, bd, rows, width);
    }
    return op_end(&c, st);
}

static dsi_status op_scale(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                           uint32_t width, float s) {
    opc c;
    if (op_start(strm, &c, "scale") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[5];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {EW_SCALE};
    dsi_status st = DSI_OK;
    if (rows && width) {
        st = bind_words(&c, x, span(rows, ldx, width), &bd[0], &p[3], "x");
        p[4] = ldx;
        p[9] = fbits(s);
        if (st == DSI_OK) st = ew(&c, p, bd, rows, width);
    }
    return op_end(&c, st);
}

static dsi_status op_swiglu(dsib_stream *strm, dsib_view g, uint32_t ldg, dsib_view u,
                            uint32_t ldu, dsib_view y, uint32_t ldy, uint32_t rows,
                            uint32_t width, float limit) {
    opc c;
    if (op_start(strm, &c, "swiglu") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[5];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {EW_SWIGLU};
    dsi_status st = DSI_OK;
    if (rows && width) {
        st = bind_words(&c, g, span(rows, ldg, width), &bd[0], &p[3], "g");
        if (st == DSI_OK) st = bind_words(&c, u, span(rows, ldu, width), &bd[1], &p[5], "u");
        if (st == DSI_OK) st = bind_words(&c, y, span(rows, ldy, width), &bd[2], &p[7], "y");
        p[4] = ldg, p[6] = ldu, p[8] = ldy;
        p[9] = fbits(limit);
        if (st == DSI_OK) st = ew(&c, p, bd, rows, width);
    }
    return op_end(&c, st);
}

static dsi_status op_copy(dsib_stream *strm, dsib_view src, dsib_view dst, uint64_t bytes) {
    opc c;
    if (op_start(strm, &c, "copy") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (!src.buf || !dst.buf) st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan copy: NULL buffer");
    else if (bytes) st = dsib_vk_copy(c.inst, c.r, src.buf, src.offset, dst.buf, dst.offset, bytes);
    return op_end(&c, st);
}

static dsi_status op_copy_rows(dsib_stream *strm, dsib_view src, uint32_t lds, dsib_view dst,
                               uint32_t ldd, uint32_t rows, uint32_t width) {
    opc c;
    if (op_start(strm, &c, "copy_rows") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (!src.buf || !dst.buf) st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan copy_rows: NULL buffer");
    if (st == DSI_OK && lds == width && ldd == width)
        st = dsib_vk_copy(c.inst, c.r, src.buf, src.offset, dst.buf, dst.offset, (uint64_t)rows * width * 4);
    else
        for (uint32_t t = 0; t < rows && st == DSI_OK; t++)
            st = dsib_vk_copy(c.inst, c.r, src.buf, src.offset + (uint64_t)t * lds * 4, dst.buf,
                              dst.offset + (uint64_t)t * ldd * 4, (uint64_t)width * 4);
    return op_end(&c, st);
}

/* Binds a state view whole (every slot): ops address slot s, row r themselves. Packed rows
 * (shaders/state.glsl) only where the op reads or writes them (`packed`): their rows must
 * start on 4-byte boundaries (row_bytes a multiple of 4; lib/kv lays out no other). */
static dsi_status bind_state_fmt(opc *c, const dsib_state *st, uint32_t width, int packed,
                                 dsib_vk_bind *b, uint32_t *off, const char *what) {
    if (!st || !st->buf || st->slots == 0 || st->rows == 0 || st->ld < width)
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: bad %s state view", c->name, what);
    uint64_t rb = st->format == DSIB_STATE_F32 && st->row_bytes == 0 ? (uint64_t)st->ld * 4
                                                                        : st->row_bytes;
    if (st->format != DSIB_STATE_F32) {
        if (!packed)
            return FAIL(c, DSI_ERR_UNSUPPORTED, "vulkan %s: %s state format %d is not supported",
                        c->name, what, (int)st->format);
        if (st->format > DSIB_STATE_E2M1_E4M3 || st->ld != width ||
            !dsii_sp_valid(st->format, st->ld, st->qcols, st->block) ||
            rb != dsii_sp_row_bytes(st->format, st->ld, st->qcols, st->block))
            return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: bad packed %s state view",
                        c->name, what);
        if (rb % 4)
            return FAIL(c, DSI_ERR_UNSUPPORTED,
                        "vulkan %s: packed %s rows of %llu bytes are not 4-byte aligned",
                        c->name, what, (unsigned long long)rb);
    } else if (rb != (uint64_t)st->ld * 4) {
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: bad %s state row size", c->name, what);
    }
    dsib_view v = {st->buf, st->offset};
    return bind_words(c, v, (uint64_t)st->slots * st->rows * rb, b, off, what);
}
static dsi_status bind_state(opc *c, const dsib_state *st, uint32_t width, dsib_vk_bind *b,
                             uint32_t *off, const char *what) {
    return bind_state_fmt(c, st, width, 0, b, off, what);
}
/* The push words of a state's row form: format, quantised values, values per scale, row
 * bytes (shaders/state.glsl). */
static void state_words(const dsib_state *st, uint32_t *p) {
    p[0] = (uint32_t)st->format;
    p[1] = st->format == DSIB_STATE_F32 ? 0 : st->qcols;
    p[2] = st->format == DSIB_STATE_F32 ? 1 : st->block;
    p[3] = st->format == DSIB_STATE_F32 || st->row_bytes == 0 ? st->ld * 4 : st->row_bytes;
}

enum { ROWS_STORE_RING = 0, ROWS_STORE_GROUP = 1, ROWS_GATHER = 2 };

static dsi_status rows_dispatch(opc *c, uint32_t *p, const dsib_vk_bind *bd, uint32_t n,
                                uint32_t width) {
    p[5] = n;
    p[6] = width;
    return dispatch_rows(c, shader("rows"), bd, 3, p, 32, (width + 63) / 64, n, 1, 10, 0);
}

static dsi_status op_store_rows(dsib_stream *strm, dsib_view src, uint32_t lds, uint32_t n,
                                dsib_view rows, const dsib_state *dst, uint32_t width,
                                uint32_t ratio, uint32_t flags) {
    opc c;
    if (op_start(strm, &c, "store_rows") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    int ring = (flags & DSIB_STORE_RING) != 0;
    if (ratio == 0 || (ring && ratio != 1) || (flags & ~DSIB_STORE_RING))
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan store_rows: bad ratio / flags");
    if (st == DSI_OK && n && width) {
        dsib_vk_bind bd[3];
        uint32_t p[32] = {ring ? ROWS_STORE_RING : ROWS_STORE_GROUP};
        st = bind_words(&c, src, span(n, lds, width), &bd[0], &p[1], "src");
        if (st == DSI_OK) st = bind_state_fmt(&c, dst, width, 1, &bd[1], &p[3], "dst");
        if (st == DSI_OK) st = bind_words(&c, rows, (uint64_t)n * 16, &bd[2], &p[7], "rows");
        p[2] = lds, p[4] = dst->ld, p[8] = dst->rows, p[9] = ratio, p[11] = dst->slots;
        /* packed rows (shaders/rows.comp): one invocation per four blocks, one per f32 of
         * the tail */
        uint32_t units = width;
        if (st == DSI_OK && dst->format != DSIB_STATE_F32) {
            state_words(dst, &p[12]);
            units = (dst->qcols / dst->block + 3) / 4 + (width - dst->qcols);
        }
        if (st == DSI_OK) st = rows_dispatch(&c, p, bd, n, units);
    }
    return op_end(&c, st);
}

static dsi_status op_gather_rows(dsib_stream *strm, dsib_view src, uint32_t lds, dsib_view idx,
                                 dsib_view dst, uint32_t ldd, uint32_t n, uint32_t width) {
    opc c;
    if (op_start(strm, &c, "gather_rows") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (n && width) {
        dsib_vk_bind bd[3];
        uint32_t p[32] = {ROWS_GATHER};
        /* the source rows are addressed by index: bind from the view to the window's end */
        st = bind_words(&c, src, (uint64_t)width * 4, &bd[0], &p[1], "src");
        if (st == DSI_OK) st = bind_words(&c, dst, span(n, ldd, width), &bd[1], &p[3], "dst");
        if (st == DSI_OK) st = bind_words(&c, idx, (uint64_t)n * 4, &bd[2], &p[7], "idx");
        p[2] = lds, p[4] = ldd;
        if (st == DSI_OK) st = rows_dispatch(&c, p, bd, n, width);
    }
    return op_end(&c, st);
}

/* ---- norms, positions, quantisation --------------------------------------------------------- */

static dsi_status op_rms_norm(dsib_stream *strm, dsib_view x, uint32_t ldx, dsib_view y,
                              uint32_t ldy, uint32_t rows, uint32_t width, const dsib_weight *w,
                              float eps) {
    opc c;
    if (op_start(strm, &c, "rms_norm") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[3];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {0};
    dsi_status st = DSI_OK;
    if (rows && width) {
        st = bind_words(&c, x, span(rows, ldx, width), &bd[0], &p[0], "x");
        if (st == DSI_OK) st = bind_words(&c, y, span(rows, ldy, width), &bd[1], &p[2], "y");
        if (st == DSI_OK && w) st = bind_param(&c, w, width, &bd[2], &p[6], &p[7], "norm weight");
        p[1] = ldx, p[3] = ldy, p[4] = width, p[5] = w != NULL, p[8] = fbits(eps);
        if (st == DSI_OK) st = dispatch_rows(&c, shader("rms_norm"), bd, 3, p, 32, 1, rows, 1, 9, 1);
    }
    return op_end(&c, st);
}

static dsi_status op_rope_tail(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                               uint32_t heads, uint32_t head_dim, dsib_view rws,
                               int32_t pos_delta, const dsib_rope *rope, int32_t inverse) {
    opc c;
    if (op_start(strm, &c, "rope_tail") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (!rope || rope->n_rot <= 0 || rope->n_rot > 512 || (uint32_t)rope->n_rot > head_dim ||
        (rope->n_rot & 1))
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan rope_tail: bad n_rot");
    if (st == DSI_OK && rows && heads) {
        uint32_t half = (uint32_t)rope->n_rot / 2;
        dsib_buffer *tb = NULL;
        char msg[256];
        st = dsib_vk_rope_table(c.inst, rope, &tb, msg, sizeof msg);
        if (st != DSI_OK) st = FAIL(&c, st, "%s", msg);
        dsib_vk_bind bd[3];
        uint32_t p[32] = {0};
        dsib_view tv = {tb, 0};
        if (st == DSI_OK) st = bind_words(&c, x, span(rows, ldx, (uint64_t)heads * head_dim), &bd[0], &p[0], "x");
        if (st == DSI_OK) st = bind_words(&c, tv, (uint64_t)3 * 1024 * half * 8, &bd[1], &p[10], "table");
        if (st == DSI_OK) st = bind_words(&c, rws, (uint64_t)rows * 16, &bd[2], &p[7], "rows");
        p[1] = ldx, p[2] = rows, p[3] = heads, p[4] = head_dim, p[5] = half;
        p[8] = (uint32_t)pos_delta, p[9] = inverse ? 1u : 0u;
        if (st == DSI_OK && heads > 65535) st = FAIL(&c, DSI_ERR_UNSUPPORTED, "vulkan rope_tail: too many heads");
        for (uint32_t r0 = 0; r0 < rows && st == DSI_OK; r0 += 65535) {
            uint32_t cnt = rows - r0 < 65535 ? rows - r0 : 65535;
            p[6] = r0;
            st = dsib_vk_dispatch(c.inst, c.r, (uint32_t)shader("rope"), bd, 3, p, 32, (half + 63) / 64, heads, cnt);
        }
    }
    return op_end(&c, st);
}

static dsi_status op_fake_quant(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                                uint32_t col0, uint32_t ncols, uint32_t block, int32_t recipe,
                                uint32_t flags) {
    opc c;
    if (op_start(strm, &c, "fake_quant") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (block == 0 || ncols % block || recipe < 0 || recipe > 2)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan fake_quant: bad block / recipe");
    if (st == DSI_OK && rows && ncols) {
        dsib_vk_bind bd[1];
        uint32_t p[32] = {0};
        st = bind_words(&c, x, span(rows, ldx, (uint64_t)col0 + ncols), &bd[0], &p[0], "x");
        p[1] = ldx, p[2] = col0, p[3] = block, p[4] = (uint32_t)recipe, p[5] = flags & DSIB_FQ_NO_ROUND ? 1u : 0u;
        if (st == DSI_OK) st = dispatch_rows(&c, shader("fake_quant"), bd, 1, p, 32, ncols / block, rows, 1, 6, 0);
    }
    return op_end(&c, st);
}

static dsi_status op_hadamard(dsib_stream *strm, dsib_view x, uint32_t ldx, uint32_t rows,
                              uint32_t chunks, uint32_t size) {
    opc c;
    if (op_start(strm, &c, "hadamard") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (size == 0 || (size & (size - 1)) || size > 1024)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan hadamard: size must be a power of two <= 1024");
    if (st == DSI_OK && rows && chunks) {
        dsib_vk_bind bd[1];
        uint32_t p[32] = {0};
        st = bind_words(&c, x, span(rows, ldx, (uint64_t)chunks * size), &bd[0], &p[0], "x");
        p[1] = ldx, p[2] = size, p[3] = fbits(1.0f / sqrtf((float)size));
        if (st == DSI_OK) st = dispatch_rows(&c, shader("hadamard"), bd, 1, p, 32, chunks, rows, 1, 4, 0);
    }
    return op_end(&c, st);
}

/* ---- mHC --------------------------------------------------------------------------------------- */

static dsi_status op_hc_expand(dsib_stream *strm, dsib_view e, uint32_t lde, dsib_view X,
                               uint32_t n, uint32_t n_hc, uint32_t D) {
    opc c;
    if (op_start(strm, &c, "hc_expand") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[5];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {EW_EXPAND};
    dsi_status st = DSI_OK;
    if (n && D && n_hc) {
        st = bind_words(&c, e, span(n, lde, D), &bd[0], &p[3], "e");
        if (st == DSI_OK) st = bind_words(&c, X, (uint64_t)n * n_hc * D * 4, &bd[2], &p[7], "X");
        p[4] = lde, p[10] = n_hc;
        if (st == DSI_OK) st = ew(&c, p, bd, n, D);
    }
    return op_end(&c, st);
}

static dsi_status op_hc_collapse(dsib_stream *strm, dsib_view X, dsib_view coef, uint32_t ldc,
                                 dsib_view y, uint32_t ldy, uint32_t n, uint32_t n_hc, uint32_t D) {
    opc c;
    if (op_start(strm, &c, "hc_collapse") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[5];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {EW_COLLAPSE};
    dsi_status st = DSI_OK;
    if (n && D && n_hc) {
        st = bind_words(&c, X, (uint64_t)n * n_hc * D * 4, &bd[0], &p[3], "X");
        if (st == DSI_OK) st = bind_words(&c, coef, span(n, ldc, n_hc), &bd[3], &p[11], "coef");
        if (st == DSI_OK) st = bind_words(&c, y, span(n, ldy, D), &bd[2], &p[7], "y");
        p[8] = ldy, p[10] = n_hc, p[12] = ldc;
        if (st == DSI_OK) st = ew(&c, p, bd, n, D);
    }
    return op_end(&c, st);
}

static dsi_status op_hc_post(dsib_stream *strm, dsib_view f, uint32_t ldf, dsib_view R,
                             dsib_view coef, uint32_t ldc, dsib_view Xo, uint32_t n, uint32_t n_hc,
                             uint32_t D) {
    opc c;
    if (op_start(strm, &c, "hc_post") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_vk_bind bd[5];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {EW_POST};
    dsi_status st = DSI_OK;
    if (n_hc > 16) st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan hc_post: n_hc > 16");
    if (st == DSI_OK && n && D && n_hc) {
        st = bind_words(&c, f, span(n, ldf, D), &bd[0], &p[3], "f");
        if (st == DSI_OK) st = bind_words(&c, R, (uint64_t)n * n_hc * D * 4, &bd[1], &p[5], "R");
        if (st == DSI_OK) st = bind_words(&c, coef, span(n, ldc, DSIB_HC_COEF(n_hc)), &bd[3], &p[11], "coef");
        if (st == DSI_OK) st = bind_words(&c, Xo, (uint64_t)n * n_hc * D * 4, &bd[4], &p[15], "Xo");
        p[4] = ldf, p[10] = n_hc, p[12] = ldc;
        if (st == DSI_OK) st = ew(&c, p, bd, n, D);
    }
    return op_end(&c, st);
}

static dsi_status op_hc_mix(dsib_stream *strm, dsib_view X, uint32_t n, uint32_t n_hc, uint32_t D,
                            const dsib_weight *fn, const dsib_weight *scale, const dsib_weight *base,
                            float rms_eps, float hc_eps, uint32_t iters, int32_t mode,
                            dsib_view coef, uint32_t ldc) {
    opc c;
    if (op_start(strm, &c, "hc_mix") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    uint32_t n_mix = mode == DSIB_HC_HEAD ? n_hc : n_hc * (2 + n_hc);
    if (n_hc == 0 || n_hc > 16 || fn->ne[1] != (int64_t)n_mix || fn->ne[0] != (int64_t)n_hc * D ||
        ldc < n_mix)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan hc_mix: shape mismatch");
    if (st == DSI_OK && n) st = matmul_impl(&c, fn, 0, 1, X, n_hc * D, coef, ldc, n);
    if (st == DSI_OK && n) {
        dsib_vk_bind bd[4];
        uint32_t p[32] = {0};
        st = bind_words(&c, X, (uint64_t)n * n_hc * D * 4, &bd[0], &p[0], "X");
        if (st == DSI_OK) st = bind_words(&c, coef, span(n, ldc, n_mix), &bd[1], &p[3], "coef");
        if (st == DSI_OK) st = bind_param(&c, scale, mode == DSIB_HC_HEAD ? 1 : 3, &bd[2], &p[9], &p[10], "scale");
        if (st == DSI_OK) st = bind_param(&c, base, n_mix, &bd[3], &p[11], &p[12], "base");
        p[1] = n_hc, p[2] = D, p[4] = ldc, p[5] = mode == DSIB_HC_HEAD ? 1u : 0u;
        p[6] = fbits(rms_eps), p[7] = fbits(hc_eps), p[8] = iters;
        if (st == DSI_OK) st = dispatch_rows(&c, shader("hc_mix"), bd, 4, p, 32, 1, n, 1, 13, 1);
    }
    return op_end(&c, st);
}

/* ---- compressed attention ------------------------------------------------------------------- */


static dsi_status op_compress_pool(dsib_stream *strm, const dsib_state *ring_kv,
                                   const dsib_state *ring_sc, dsib_view kv, dsib_view sc,
                                   uint32_t ldc, dsib_view rows, uint32_t n, uint32_t ratio,
                                   int32_t overlap, uint32_t hd, dsib_view out, uint32_t ldo) {
    opc c;
    if (op_start(strm, &c, "compress_pool") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    uint32_t width = overlap ? 2 * hd : hd;
    if (ratio == 0 || ratio > 4096 || !ring_kv || !ring_sc || ring_kv->rows != ring_sc->rows ||
        ring_kv->ld != ring_sc->ld || ring_kv->slots != ring_sc->slots)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan compress_pool: bad arguments");
    if (st == DSI_OK && n && hd) {
        dsib_vk_bind bd[6];
        uint32_t p[32] = {0};
        st = bind_state(&c, ring_kv, width, &bd[0], &p[0], "ring_kv");
        if (st == DSI_OK) st = bind_state(&c, ring_sc, width, &bd[1], &p[1], "ring_sc");
        if (st == DSI_OK) st = bind_words(&c, kv, span(n, ldc, width), &bd[2], &p[4], "kv");
        if (st == DSI_OK) st = bind_words(&c, sc, span(n, ldc, width), &bd[3], &p[5], "sc");
        if (st == DSI_OK) st = bind_words(&c, out, span(n, ldo, hd), &bd[4], &p[14], "out");
        if (st == DSI_OK) st = bind_words(&c, rows, (uint64_t)n * 16, &bd[5], &p[7], "rows");
        p[2] = ring_kv->ld, p[3] = ring_kv->rows, p[6] = ldc, p[8] = n, p[9] = ratio;
        p[10] = overlap ? 1u : 0u, p[11] = hd, p[12] = ring_kv->slots, p[15] = ldo;
        if (st == DSI_OK)
            st = dispatch_rows(&c, shader("compress_pool"), bd, 6, p, 32, (hd + 63) / 64, n, 1, 13, 0);
    }
    return op_end(&c, st);
}

static dsi_status indexer_impl(opc *c, dsib_view q, uint32_t ldq, dsib_view w, uint32_t ldw,
                               const dsib_state *keys, uint32_t heads, uint32_t hd, dsib_view rows,
                               uint32_t n, uint32_t ratio, uint32_t topk, dsib_view idx,
                               dsib_view cand_in, dsib_view cand_out, uint32_t cand_block,
                               uint32_t cand_k) {
    int cands = cand_in.buf || cand_out.buf;
    if (ratio == 0 || topk == 0 || (cands && (cand_block == 0 || cand_k == 0)) || !keys ||
        keys->ld != hd)
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT, "vulkan %s: bad arguments", c->name);
    if (n == 0) return DSI_OK;
    /* scratch rows sized for the stream's largest position */
    uint64_t max_rows = (uint64_t)c->s->desc.max_positions / ratio + 1;
    uint64_t nb = cands ? (max_rows + cand_block - 1) / cand_block + 1 : 0;
    uint64_t stride = 2 * max_rows + 2 * nb;
    dsib_buffer *scr = dsib_vk_stream_ws(c->s, (uint64_t)n * stride * 4);
    if (!scr)
        return FAIL(c, DSI_ERR_INVALID_ARGUMENT,
                    "vulkan %s: %u rows exceed the stream's workspace", c->name, n);
    dsib_vk_bind bd[8];
    memset(bd, 0, sizeof bd);
    uint32_t p[32] = {0};
    dsib_view sv = {scr, 0};
    dsi_status st = bind_words(c, q, span(n, ldq, (uint64_t)heads * hd), &bd[0], &p[0], "q");
    if (st == DSI_OK) st = bind_words(c, w, span(n, ldw, heads), &bd[1], &p[2], "w");
    if (st == DSI_OK) st = bind_state_fmt(c, keys, hd, 1, &bd[2], &p[4], "keys");
    if (st == DSI_OK) state_words(keys, &p[21]);
    if (st == DSI_OK) st = bind_words(c, idx, (uint64_t)n * topk * 4, &bd[3], &p[10], "idx");
    if (st == DSI_OK) st = bind_words(c, sv, (uint64_t)n * stride * 4, &bd[4], &p[20], "scratch");
    if (st == DSI_OK && cand_in.buf) st = bind_words(c, cand_in, (uint64_t)n * cand_k * 4, &bd[5], &p[17], "cand_in");
    if (st == DSI_OK && cand_out.buf) st = bind_words(c, cand_out, (uint64_t)n * cand_k * 4, &bd[6], &p[18], "cand_out");
    if (st == DSI_OK) st = bind_words(c, rows, (uint64_t)n * 16, &bd[7], &p[7], "rows");
    p[1] = ldq, p[3] = ldw, p[5] = heads, p[6] = hd, p[8] = ratio;
    p[9] = topk, p[11] = (uint32_t)stride, p[13] = cand_in.buf != NULL, p[14] = cand_out.buf != NULL;
    p[15] = cand_block, p[16] = cands ? cand_k : 0, p[19] = keys->rows;
    if (st == DSI_OK) st = dispatch_rows(c, pick(c->inst, "indexer"), bd, 8, p, 32, 1, n, 1, 12, 1);
    return st;
}

static dsi_status op_indexer_topk(dsib_stream *strm, dsib_view q, uint32_t ldq, dsib_view w,
                                  uint32_t ldw, const dsib_state *keys, uint32_t heads,
                                  uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                                  uint32_t topk, dsib_view idx) {
    opc c;
    if (op_start(strm, &c, "indexer_topk") != DSI_OK) return DSI_ERR_BACKEND;
    dsib_view none = {NULL, 0};
    return op_end(&c, indexer_impl(&c, q, ldq, w, ldw, keys, heads, hd, rows, n, ratio, topk,
                                   idx, none, none, 0, 0));
}

static dsi_status op_indexer_topk_v41(dsib_stream *strm, dsib_view q, uint32_t ldq, dsib_view w,
                                      uint32_t ldw, const dsib_state *keys, uint32_t heads,
                                      uint32_t hd, dsib_view rows, uint32_t n, uint32_t ratio,
                                      uint32_t topk, dsib_view idx, dsib_view cand_in,
                                      dsib_view cand_out, uint32_t cand_block, uint32_t cand_k) {
    opc c;
    if (op_start(strm, &c, "indexer_topk_v41") != DSI_OK) return DSI_ERR_BACKEND;
    return op_end(&c, indexer_impl(&c, q, ldq, w, ldw, keys, heads, hd, rows, n, ratio, topk,
                                   idx, cand_in, cand_out, cand_block, cand_k));
}

static dsi_status op_engram_gate(dsib_stream *strm, dsib_view X, uint32_t n, uint32_t n_hc,
                                 uint32_t D, dsib_view kv, uint32_t ldkv, const dsib_weight *qw,
                                 const dsib_weight *kw, float eps) {
    opc c;
    if (op_start(strm, &c, "engram_gate") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (!qw || !kw || n_hc == 0 || D == 0 || ldkv < (n_hc + 1) * D || qw->ne[0] != (int64_t)D ||
        kw->ne[0] != (int64_t)D || qw->ne[1] < (int64_t)n_hc || kw->ne[1] < (int64_t)n_hc ||
        n_hc > 65535)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan engram_gate: bad arguments");
    if (st == DSI_OK && n) {
        dsib_vk_bind bd[4];
        uint32_t p[32] = {0};
        st = bind_words(&c, X, (uint64_t)n * n_hc * D * 4, &bd[0], &p[0], "X");
        if (st == DSI_OK) st = bind_words(&c, kv, span(n, ldkv, (uint64_t)(n_hc + 1) * D), &bd[1], &p[3], "kv");
        if (st == DSI_OK) st = bind_param(&c, qw, (uint64_t)n_hc * D, &bd[2], &p[5], &p[6], "q_weight");
        if (st == DSI_OK) st = bind_param(&c, kw, (uint64_t)n_hc * D, &bd[3], &p[7], &p[8], "k_weight");
        p[1] = n_hc, p[2] = D, p[4] = ldkv, p[9] = fbits(eps), p[11] = fbits(1.0f / sqrtf((float)D));
        if (st == DSI_OK) st = dispatch_rows(&c, shader("engram_gate"), bd, 4, p, 32, n_hc, n, 1, 10, 0);
    }
    return op_end(&c, st);
}

static dsi_status op_attn_sink(dsib_stream *strm, dsib_view q, uint32_t ldq, uint32_t H,
                               uint32_t hd, dsib_view rows, uint32_t n, uint32_t window,
                               const dsib_state *ring, dsib_view kv, uint32_t ldkv,
                               uint32_t comp_ratio, const dsib_state *comp, dsib_view idx,
                               uint32_t topk, const dsib_weight *sinks, float scale,
                               dsib_view out, uint32_t ldo) {
    opc c;
    if (op_start(strm, &c, "attn_sink") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (!ring || ring->rows < window || ring->ld != hd || hd > 1024 || hd == 0 || H > 65535 ||
        (comp_ratio && (!comp || comp->ld != hd || comp->slots != ring->slots)))
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan attn_sink: bad arguments");
    if (st == DSI_OK && n && H) {
        dsib_vk_bind bd[8];
        memset(bd, 0, sizeof bd);
        uint32_t p[32] = {0};
        st = bind_words(&c, q, span(n, ldq, (uint64_t)H * hd), &bd[0], &p[0], "q");
        if (st == DSI_OK) st = bind_state_fmt(&c, ring, hd, 1, &bd[1], &p[6], "ring");
        if (st == DSI_OK) st = bind_words(&c, kv, span(n, ldkv, hd), &bd[2], &p[8], "kv");
        if (st == DSI_OK && comp_ratio) st = bind_state_fmt(&c, comp, hd, 1, &bd[3], &p[11], "comp");
        if (st == DSI_OK) state_words(ring, &p[25]);
        if (st == DSI_OK && comp_ratio) state_words(comp, &p[21]);
        p[12] = 0xFFFFFFFFu;
        if (st == DSI_OK && comp_ratio && idx.buf) st = bind_words(&c, idx, (uint64_t)n * topk * 4, &bd[4], &p[12], "idx");
        if (st == DSI_OK) st = bind_param(&c, sinks, H, &bd[5], &p[14], &p[15], "sinks");
        if (st == DSI_OK) st = bind_words(&c, out, span(n, ldo, (uint64_t)H * hd), &bd[6], &p[17], "out");
        if (st == DSI_OK) st = bind_words(&c, rows, (uint64_t)n * 16, &bd[7], &p[4], "rows");
        p[1] = ldq, p[2] = H, p[3] = hd, p[5] = window, p[7] = ring->rows;
        p[9] = ldkv, p[10] = comp_ratio, p[13] = topk, p[16] = fbits(scale), p[18] = ldo;
        p[20] = comp_ratio ? comp->rows : 0;
        /* the device's variant (the narrow one on a CPU device) holds hd <= 128 values */
        int si = hd <= 8 * 16 ? pick(c.inst, "attn_sink") : shader("attn_sink");
        if (st == DSI_OK) st = dispatch_rows(&c, si, bd, 8, p, 32, H, n, 1, 19, 0);
    }
    return op_end(&c, st);
}

/* ---- MoE ------------------------------------------------------------------------------------------ */

static dsi_status op_moe_route(dsib_stream *strm, dsib_view logits, uint32_t ldl, uint32_t E,
                               uint32_t k, const dsib_weight *bias, const dsib_weight *tid2eid,
                               dsib_view ids, float norm_add, float route_scale, uint32_t n,
                               dsib_view sel, dsib_view wts) {
    opc c;
    if (op_start(strm, &c, "moe_route") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    if (k == 0 || k > E || E > 65536) st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan moe_route: bad k / E");
    if (st == DSI_OK && tid2eid && (tid2eid->type != DSI_TYPE_I32 || (tid2eid->offset & 3) || (tid2eid->nb1 & 3)))
        st = FAIL(&c, DSI_ERR_UNSUPPORTED, "vulkan moe_route: tid2eid must be int32");
    if (st == DSI_OK && n) {
        dsib_vk_bind bd[6];
        memset(bd, 0, sizeof bd);
        uint32_t p[32] = {0}, dummy = 0;
        st = bind_words(&c, logits, span(n, ldl, E), &bd[0], &p[0], "logits");
        if (st == DSI_OK && bias && !tid2eid) st = bind_param(&c, bias, E, &bd[1], &p[5], &p[6], "bias");
        if (st == DSI_OK && tid2eid) {
            if (dsib_vk_resolve(c.inst, tid2eid->buf, tid2eid->offset,
                                (uint64_t)(tid2eid->ne[1] - 1) * tid2eid->nb1 + (uint64_t)k * 4, &bd[2]) != DSI_OK)
                st = FAIL(&c, DSI_ERR_UNSUPPORTED, "vulkan moe_route: tid2eid does not fit one binding");
            p[8] = bd[2].skew;
            p[9] = (uint32_t)tid2eid->nb1;
            if (st == DSI_OK) st = bind_words(&c, ids, (uint64_t)n * 4, &bd[3], &p[10], "ids");
        }
        if (st == DSI_OK) st = bind_words(&c, sel, (uint64_t)n * k * 4, &bd[4], &p[14], "sel");
        if (st == DSI_OK) st = bind_words(&c, wts, (uint64_t)n * k * 4, &bd[5], &p[15], "wts");
        (void)dummy;
        p[1] = ldl, p[2] = E, p[3] = k, p[4] = bias && !tid2eid, p[7] = tid2eid != NULL;
        p[11] = fbits(norm_add), p[12] = fbits(route_scale), p[13] = n;
        if (st == DSI_OK)
            st = dsib_vk_dispatch(c.inst, c.r, (uint32_t)shader("moe_route"), bd, 6, p, 32, (n + 63) / 64, 1, 1);
    }
    return op_end(&c, st);
}

/* By-id matmul: y[r][:] = W_{sel[r]} · x[r / xdiv], r < nr, over all expert windows. */
static dsi_status mm_ids(opc *c, const dsib_weight *w, const dsib_vk_bind *bsel, uint32_t sel_off,
                         dsib_view xv, uint32_t ldx, uint32_t xdiv, dsib_view yv, uint32_t nr) {
    vk_type tv_;
    const vk_type *t = type_info(w->type, &tv_);
    if (!t) return FAIL(c, DSI_ERR_UNSUPPORTED, "vulkan moe_experts: weight type %d is not supported", (int)w->type);
    mm_args a;
    memset(&a, 0, sizeof a);
    a.mode = MM_IDS;
    a.si = pick(c->inst, t->shader);
    dsi_status st = bind_words(c, xv, span(nr / xdiv, ldx, (uint64_t)w->ne[0]), &a.bx, &a.x_off, "x");
    if (st == DSI_OK) st = bind_words(c, yv, (uint64_t)nr * w->ne[1] * 4, &a.by, &a.y_off, "y");
    if (st != DSI_OK) return st;
    a.bi = *bsel;
    a.ids_off = sel_off;
    a.ldx = ldx;
    a.ldy = (uint32_t)w->ne[1];
    a.n = nr;
    a.xdiv = xdiv;
    a.R = 0;
    uint32_t E = (uint32_t)(w->ne[2] ? w->ne[2] : 1);
    return for_windows(c, w, 0, E, mm_window, &a);
}

static dsi_status op_moe_experts(dsib_stream *strm, dsib_view x, uint32_t ldx, dsib_view sel,
                                 dsib_view wts, uint32_t k, const dsib_weight *w1,
                                 const dsib_weight *w3, const dsib_weight *w2, float limit,
                                 uint32_t n, dsib_view y, uint32_t ldy) {
    opc c;
    if (op_start(strm, &c, "moe_experts") != DSI_OK) return DSI_ERR_BACKEND;
    dsi_status st = DSI_OK;
    int64_t D = w1->ne[0], F = w1->ne[1];
    if (w2->ne[0] != F || w2->ne[1] != D || w3->ne[0] != D || w3->ne[1] != F || k == 0)
        st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT, "vulkan moe_experts: shape mismatch");
    if (st == DSI_OK && n) {
        uint32_t nr = n * k;
        /* G, U [nr][F] and Z [nr][D] in the stream's workspace, each at an aligned offset */
        uint64_t al = c.inst->min_align > 256 ? c.inst->min_align : 256;
        uint64_t gb = ((uint64_t)nr * F * 4 + al - 1) / al * al;
        uint64_t ub = gb, zb = (uint64_t)nr * D * 4;
        dsib_buffer *ws = dsib_vk_stream_ws(strm, gb + ub + zb);
        if (!ws)
            st = FAIL(&c, DSI_ERR_INVALID_ARGUMENT,
                      "vulkan moe_experts: %u rows exceed the stream's workspace", n);
        dsib_view G = {ws, 0}, U = {ws, gb}, Z = {ws, gb + ub};
        dsib_vk_bind bsel, bw;
        uint32_t sel_off = 0, w_off = 0;
        if (st == DSI_OK) st = bind_words(&c, sel, (uint64_t)nr * 4, &bsel, &sel_off, "sel");
        if (st == DSI_OK) st = bind_words(&c, wts, (uint64_t)nr * 4, &bw, &w_off, "wts");
        if (st == DSI_OK) st = mm_ids(&c, w1, &bsel, sel_off, x, ldx, k, G, nr);
        if (st == DSI_OK) st = mm_ids(&c, w3, &bsel, sel_off, x, ldx, k, U, nr);
        if (st == DSI_OK) {
            /* G = swiglu(G, U)·wts[r] (router weight before the down projection, §3.5) */
            dsib_vk_bind bd[5];
            memset(bd, 0, sizeof bd);
            uint32_t p[32] = {EW_MOE_SWIGLU};
            st = bind_words(&c, G, (uint64_t)nr * F * 4, &bd[0], &p[3], "G");
            if (st == DSI_OK) st = bind_words(&c, U, (uint64_t)nr * F * 4, &bd[1], &p[5], "U");
            bd[2] = bd[0];
            p[7] = p[3];
            bd[3] = bw;
            p[11] = w_off;
            p[4] = p[6] = p[8] = (uint32_t)F;
            p[9] = fbits(limit);
            if (st == DSI_OK) st = ew(&c, p, bd, nr, (uint32_t)F);
        }
        if (st == DSI_OK) st = mm_ids(&c, w2, &bsel, sel_off, G, (uint32_t)F, 1, Z, nr);
        if (st == DSI_OK) {
            /* y[t] = Σ_{j ascending} Z[t·k + j] */
            dsib_vk_bind bd[5];
            memset(bd, 0, sizeof bd);
            uint32_t p[32] = {EW_SUMK};
            st = bind_words(&c, Z, (uint64_t)nr * D * 4, &bd[0], &p[3], "Z");
            if (st == DSI_OK) st = bind_words(&c, y, span(n, ldy, (uint64_t)D), &bd[2], &p[7], "y");
            p[4] = (uint32_t)D, p[8] = ldy, p[14] = k;
            if (st == DSI_OK) st = ew(&c, p, bd, n, (uint32_t)D);
        }
    }
    return op_end(&c, st);
}

int dsib_vk_type_has_matmul(int32_t type) {
    vk_type tv;
    return type_info(type, &tv) != NULL;
}

const dsib_ops dsib_vk_ops = {
    .struct_size = sizeof(dsib_ops),
    .matmul = op_matmul,
    .matmul_grouped = op_matmul_grouped,
    .get_rows = op_get_rows,
    .rms_norm = op_rms_norm,
    .add = op_add,
    .scale = op_scale,
    .copy = op_copy,
    .copy_rows = op_copy_rows,
    .gather_rows = op_gather_rows,
    .rope_tail = op_rope_tail,
    .store_rows = op_store_rows,
    .fake_quant = op_fake_quant,
    .hadamard = op_hadamard,
    .hc_expand = op_hc_expand,
    .hc_mix = op_hc_mix,
    .hc_collapse = op_hc_collapse,
    .hc_post = op_hc_post,
    .compress_pool = op_compress_pool,
    .indexer_topk = op_indexer_topk,
    .attn_sink = op_attn_sink,
    .add_rows_periodic = op_add_rows_periodic,
    .moe_route = op_moe_route,
    .moe_experts = op_moe_experts,
    .swiglu = op_swiglu,
    .indexer_topk_v41 = op_indexer_topk_v41,
    .engram_gate = op_engram_gate,
};
