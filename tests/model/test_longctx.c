/*
 * Long-context state (issue 19; docs/internals.md "State layout"), on both tiny models, CPU
 * (argv[1] "vulkan": test_longctx_vulkan runs 1, 1b and 2 on the Vulkan backend, whose ops
 * read and write the same packed rows in their shaders; 3 and 4 are the CPU's: host
 * allocations and chunked prefill at 4,096 tokens, which lavapipe would take minutes for;
 * under the validation layer, DSINFER_VULKAN_VALIDATION=1, parts 1 and 1b run over 64 tokens,
 * part 2 not, and the layer must have counted no error):
 *
 *  1. packed state: window rings, compressed KV rows and index keys stored as FP8 / FP4 codes
 *     with their block scales (lib/quant/statepack.h) give logits bit-identical to the f32
 *     storage (DSI_SESSION_FLAG_F32_STATE) over 320 tokens in chunks of 7, crossing the
 *     window (16), every compression boundary (ratios 4 / 16, 2 / 1) and the indexer top-k
 *     saturation; the state really is packed (bytes per token = the figure computed here
 *     from model-spec §3.8 / §4.8 for the tiny shapes) and NO_FAKE_QUANT keeps it f32;
 * 1b. (GPU backends) host offload: a state budget that holds the rings but not the row arrays
 *     puts the compressed rows and index keys in host RAM, with the same logits;
 *  2. snapshots carry the packed form: packed → f32-stored session and back continue
 *     bit-identically (the f32 session's image, loaded into a packed session, saves as the
 *     packed session's image byte for byte), and a version-1 image (f32 rows, built here
 *     from the version-2 one) still loads; a version-1 image with a row off the FP8 grid is
 *     refused (STATE_MISMATCH) and the session is untouched;
 *  3. the trained context filled to its end (chunked prefill, n_batch 256) gives the same
 *     last logits as a fresh session's prefill in chunks of 173; one token more is
 *     CONTEXT_FULL;
 *  4. memory: through counting allocator hooks, a session created with n_ctx = 4096 holds
 *     far less than its full state, and at depth D it holds at most
 *     bytes/token · (1.125 · D + 1024 + 256 + ratio slack) + a constant more than at creation
 *     (lib/kv lazy growth); a session whose full state exceeds the budget fails at creation
 *     naming the bytes needed and the budget.
 */
#define _GNU_SOURCE
#define DSI_EXPERIMENTAL
#define XXH_INLINE_ALL
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dsinfer.h"
#include "model_test_util.h"
#include "tests/common/skip.h"
#include "tests/common/filter.h"
#include "tests/common/vk_validation.h"

#include "api/session_impl.h"
#include "arch/arch.h"
#include "kv/snapshot.h"
#include "model/model.h"
#include "quant/statepack.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct fx {
    const char *file;
    int v41;
    dsi_context *ctx;
    dsi_model *m;
    int32_t V;
    uint32_t n_ctx_train;
} fx;

static fx g_fx[2] = {{"tiny-v4.gguf", 0, NULL, NULL, 0, 0}, {"tiny-v41.gguf", 1, NULL, NULL, 0, 0}};
static const char *g_backend = "cpu";

/* ---- counting allocator hooks (live bytes) ------------------------------------------- */

static atomic_llong g_live;
#define HDR 64
static void *c_malloc(size_t n, void *ud) {
    (void)ud;
    uint8_t *p = malloc(n + HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    atomic_fetch_add(&g_live, (long long)n);
    return p + HDR;
}
static void c_free(void *q, void *ud) {
    (void)ud;
    if (!q) return;
    uint8_t *p = (uint8_t *)q - HDR;
    size_t n;
    memcpy(&n, p, sizeof n);
    atomic_fetch_sub(&g_live, (long long)n);
    free(p);
}
static void *c_realloc(void *q, size_t n, void *ud) {
    if (!q) return c_malloc(n, ud);
    uint8_t *p = (uint8_t *)q - HDR;
    size_t o;
    memcpy(&o, p, sizeof o);
    uint8_t *r = realloc(p, n + HDR);
    if (!r) return NULL;
    memcpy(r, &n, sizeof n);
    atomic_fetch_add(&g_live, (long long)n - (long long)o);
    return r + HDR;
}

static int setup(void **state) {
    fx *f = *state;
    const char *path = mt_model_path(f->file, NULL);
    if (!path) return 0;
    dsi_context_options co;
    dsi_context_options_init(&co, DSI_ABI_VERSION);
    co.n_threads = 2;
    co.backend = g_backend;
    co.malloc_fn = c_malloc;
    co.realloc_fn = c_realloc;
    co.free_fn = c_free;
    if (dsi_context_create(&co, &f->ctx) != DSI_OK) return -1;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    if (dsi_model_load(f->ctx, path, &mo, &f->m) != DSI_OK) {
        printf("# load %s: %s\n", path, dsi_last_error());
        return -1;
    }
    dsi_model_info info;
    dsi_model_info_init(&info);
    dsi_model_get_info(f->m, &info);
    f->V = info.n_vocab;
    f->n_ctx_train = (uint32_t)info.n_ctx_train;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    if (f->m) dsi_model_free(f->m);
    if (f->ctx) dsi_context_free(f->ctx);
    f->m = NULL;
    f->ctx = NULL;
    return 0;
}

static void need(fx *f) {
    if (!f->m) {
        if (!mt_model_path(f->file, NULL))
            DSIT_SKIP_TEST("MODELS", "%s not found in $DSI_MODELS_DIR", f->file);
        fail_msg("%s did not open", f->file);
    }
}

static dsi_session *session(dsi_model *m, uint32_t n_ctx, uint32_t n_batch, uint32_t flags) {
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = n_ctx;
    so.n_batch = n_batch;
    so.flags = flags;
    dsi_session *s = NULL;
    if (dsi_session_create(m, &so, &s) != DSI_OK) fail_msg("session: %s", dsi_last_error());
    return s;
}

static uint32_t pos_of(dsi_session *s) {
    uint32_t p = 0;
    assert_int_equal(dsi_session_position(s, &p), DSI_OK);
    return p;
}

static const float *logits_of(dsi_session *s) {
    const float *lg = NULL;
    int32_t v = 0;
    assert_int_equal(dsi_session_logits(s, &lg, &v), DSI_OK);
    return lg;
}

/* Bytes per token of context of the packed row arrays of the tiny shapes (head_dim 128,
 * RoPE 64, index keys 128; lib/quant/statepack.h layout, model-spec §3.8 / §4.8 recipes):
 *  - V4: compressed row = 64 nope dims E4M3 (64 B) + 1 UE8M0 scale, padded to 68, + 64 RoPE
 *    dims f32 (256 B) = 324 B; index key = 128 E2M1 (64 B) + 4 UE8M0 scales = 68 B.
 *    Ratio-4 layers (2, 4) hold a row and a key per 4 tokens, ratio-16 layers (3, 5) a row
 *    per 16: 2·(324 + 68)/4 + 2·324/16 = 236.5 (f32: 2·(512 + 512)/4 + 2·512/16 = 576).
 *  - V4.1: compressed row = 128 E2M1 (64 B) + 8 E4M3 scales = 72 B; key 68 B; KV sources:
 *    layer 2 (ratio 2) and layer 5 (ratio 1): (72 + 68)/2 + (72 + 68) = 210
 *    (f32: (512 + 512)/2 + 1024 = 1536). */
static const double k_bpt_packed[2] = {236.5, 210.0}, k_bpt_f32[2] = {576.0, 1536.0};

/* ---- 1. packed vs f32 ------------------------------------------------------------------ */

/* Tokens of a comparison run: `full`, or DSI_LONGCTX_TOKENS (test_longctx_vulkan_split: 96),
 * or 64 under the validation layer (lavapipe many times slower) — never fewer than 64: still
 * past the window (16), several groups of every ratio (up to 16) and the indexer's top-k. */
static size_t n_tokens(size_t full) {
    const char *ev = getenv("DSI_LONGCTX_TOKENS");
    size_t n = ev ? (size_t)strtoul(ev, NULL, 10) : full;
    if (dsit_vk_validation_requested() && n > 64) n = 64;
    return n < 64 ? 64 : n;
}

static void test_packed_vs_f32(void **state) {
    fx *f = *state;
    need(f);
    const size_t n = n_tokens(320);
    dsi_token *tok = malloc(sizeof *tok * n);
    mt_tokens(tok, n, f->V, 1901);
    /* a session with state, held while the runs below take more slots of its pool: the
     * pool's growth (new buffers, every slot copied; several buffers where the device's
     * binding is small, test_longctx_vulkan_split) keeps its rows */
    const size_t nk = 40;
    dsi_session *keep = session(f->m, 512, 64, 0);
    assert_int_equal(dsi_session_append(keep, tok, nk), DSI_OK);
    float *a = mt_all_logits(f->m, tok, n, 7, 0, 512);
    float *b = mt_all_logits(f->m, tok, n, 7, DSI_SESSION_FLAG_F32_STATE, 512);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t p = 0; p < n; p++)
        if (memcmp(a + p * (size_t)f->V, b + p * (size_t)f->V, sizeof(float) * (size_t)f->V))
            fail_msg("%s: packed and f32 state differ first at position %zu", f->file, p);
    dsii_state_info ik;
    dsii_session_state_info(keep, &ik);
    assert_true(ik.pool_slots >= 2); /* the pool grew under it */
    for (size_t p = nk; p < nk + 8; p++) {
        assert_int_equal(dsi_session_append(keep, &tok[p], 1), DSI_OK);
        if (memcmp(logits_of(keep), a + p * (size_t)f->V, sizeof(float) * (size_t)f->V))
            fail_msg("%s: a session's state changed when its pool grew (position %zu)", f->file, p);
    }
    printf("# %s: pool of %u slots in %u buffer(s)\n", f->file, ik.pool_slots, ik.pool_buffers);
    dsi_session_free(keep);
    /* the storage really differs: layout figures */
    dsi_session *sp = session(f->m, 512, 64, 0), *sf = session(f->m, 512, 64, DSI_SESSION_FLAG_F32_STATE);
    dsi_session *sn = session(f->m, 512, 64, DSI_SESSION_FLAG_NO_FAKE_QUANT);
    dsii_state_info ip, iff, in;
    dsii_session_state_info(sp, &ip);
    dsii_session_state_info(sf, &iff);
    dsii_session_state_info(sn, &in);
    printf("# %s: state bytes/token packed %.2f, f32 %.2f; rings %llu / %llu bytes\n", f->file,
           ip.bytes_per_token, iff.bytes_per_token, (unsigned long long)ip.ring_bytes,
           (unsigned long long)iff.ring_bytes);
    assert_int_equal(ip.packed, 1);
    assert_int_equal(iff.packed, 0);
    assert_int_equal(in.packed, 0); /* rounding off: the rows are not on the grids */
    assert_true(ip.bytes_per_token == k_bpt_packed[f->v41]);
    assert_true(iff.bytes_per_token == k_bpt_f32[f->v41]);
    assert_true(in.bytes_per_token == k_bpt_f32[f->v41]);
    dsi_session_free(sp);
    dsi_session_free(sf);
    dsi_session_free(sn);
    free(a);
    free(b);
    free(tok);
}

/* ---- 1b. host offload (GPU backends) ---------------------------------------------------- */

/* A second load of the model whose state budget holds the rings but not the row arrays at
 * n_ctx: its sessions keep the compressed rows and index keys in host RAM (lib/arch/exec.c,
 * DSIB_BUFFER_HOST_MEMORY) and compute the very logits of the model with all state on the
 * device. (lavapipe has no separate host heap: there the buffers are host memory either
 * way, and this checks the layout and the ops reading it.) */
static void test_offload(void **state) {
    fx *f = *state;
    need(f);
    const size_t n = n_tokens(96);
    dsi_token *tok = malloc(sizeof *tok * n);
    mt_tokens(tok, n, f->V, 1901);
    float *a = mt_all_logits(f->m, tok, n, 7, 0, 512);
    assert_non_null(a);
    dsi_session *s0 = session(f->m, 512, 64, 0);
    dsii_state_info i0;
    dsii_session_state_info(s0, &i0);
    dsi_session_free(s0);
    assert_int_equal(i0.offload, 0);
    /* room for the rings (and their 64-byte alignment), not for the row arrays */
    const uint64_t budget = i0.ring_bytes + 64 * 256;
    assert_true(budget < i0.full_bytes);
    dsi_model *m2 = NULL;
    dsi_model_options mo;
    dsi_model_options_init(&mo);
    assert_int_equal(dsi_model_load(f->ctx, mt_model_path(f->file, NULL), &mo, &m2), DSI_OK);
    m2->exec->state_budget = budget;
    dsi_session *s = session(m2, 512, 64, 0);
    dsii_state_info io;
    dsii_session_state_info(s, &io);
    printf("# %s: offloaded: %llu of %llu bytes of the pool in host RAM; device part at n_ctx "
           "%llu bytes (budget %llu, all on the device %llu)\n", f->file,
           (unsigned long long)io.pool_host_bytes, (unsigned long long)io.pool_bytes,
           (unsigned long long)io.device_full_bytes, (unsigned long long)budget,
           (unsigned long long)io.full_bytes);
    assert_int_equal(io.offload, 1);
    assert_true(io.pool_host_bytes > 0 && io.pool_host_bytes < io.pool_bytes);
    assert_true(io.device_full_bytes <= budget);
    dsi_session_free(s);
    float *b = mt_all_logits(m2, tok, n, 7, 0, 512);
    assert_non_null(b);
    for (size_t p = 0; p < n; p++)
        if (memcmp(a + p * (size_t)f->V, b + p * (size_t)f->V, sizeof(float) * (size_t)f->V))
            fail_msg("%s: offloaded state gives other logits, first at position %zu", f->file, p);
    /* a budget that cannot hold even the rings: a clear error at creation */
    m2->exec->state_budget = io.device_full_bytes - 1;
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = 512;
    dsi_session *t = NULL;
    assert_int_equal(dsi_session_create(m2, &so, &t), DSI_ERR_OUT_OF_DEVICE_MEMORY);
    printf("# over the budget: %s\n", dsi_last_error());
    assert_non_null(strstr(dsi_last_error(), "host RAM"));
    dsi_model_free(m2);
    free(a);
    free(b);
    free(tok);
}

/* ---- 2. snapshots ---------------------------------------------------------------------- */

static uint8_t *save(dsi_session *s, size_t *n) {
    assert_int_equal(dsi_session_save_buffer(s, NULL, 0, n), DSI_OK);
    uint8_t *b = malloc(*n);
    size_t m = 0;
    assert_int_equal(dsi_session_save_buffer(s, b, *n, &m), DSI_OK);
    assert_int_equal(m, *n);
    return b;
}

static uint32_t g32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void p32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void p64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites a version-2 image as version 1 (24-byte layout entries, every row f32), with
 * valid checksums. off_grid: adds 1e-3 to the first value of the first packed row. */
static uint8_t *to_v1(const uint8_t *img, size_t n, size_t *out_n, int off_grid) {
    (void)n;
    uint8_t *o = calloc(1, n * 8 + 4096);
    memcpy(o, img, DSII_SNAP_HEADER_BYTES);
    p32(o + 8, 1);
    uint32_t nc = g32(img + 52);
    size_t ip = DSII_SNAP_HEADER_BYTES, op = DSII_SNAP_HEADER_BYTES;
    const uint8_t *layout = NULL;
    for (int s = 0; s < 4; s++) {
        uint32_t tag = g32(img + ip);
        uint64_t len = (uint64_t)g32(img + ip + 8) | (uint64_t)g32(img + ip + 12) << 32;
        const uint8_t *pl = img + ip + 16;
        uint8_t *oh = o + op;
        uint8_t *opl = oh + 16;
        uint64_t olen = len;
        if (s < 2) {
            memcpy(opl, pl, len);
        } else if (s == 2) {
            layout = pl;
            for (uint32_t i = 0; i < nc; i++) memcpy(opl + 24 * i, pl + 36 * i, 24);
            olen = 24ull * nc;
        } else {
            const uint8_t *src = pl;
            float *dst = (float *)(void *)opl;
            int done = 0;
            for (uint32_t i = 0; i < nc; i++) {
                const uint8_t *e = layout + 36 * i;
                uint32_t ld = g32(e + 8), cnt = g32(e + 20), fmt = g32(e + 24), qc = g32(e + 28),
                         bl = g32(e + 32);
                uint32_t rb = dsii_sp_row_bytes((int32_t)fmt, ld, qc, bl);
                for (uint32_t r = 0; r < cnt; r++) {
                    dsii_sp_unpack_row((int32_t)fmt, ld, qc, bl, src, dst);
                    if (off_grid && fmt != 0 && !done) {
                        dst[0] += 1e-3f;
                        done = 1;
                    }
                    src += rb;
                    dst += ld;
                }
            }
            olen = (uint64_t)((uint8_t *)dst - opl);
        }
        p32(oh, tag);
        p32(oh + 4, 0);
        p64(oh + 8, olen);
        p64(opl + olen, XXH3_64bits(oh, 16 + olen));
        ip += 16 + len + 8;
        op += 16 + olen + 8;
    }
    p64(o + 64, op);
    p64(o + 120, XXH3_64bits(o, 120));
    *out_n = op;
    return o;
}

static void test_snapshot_packed(void **state) {
    fx *f = *state;
    need(f);
    const size_t n = 150, k = 20;
    dsi_token tok[170];
    mt_tokens(tok, n + k, f->V, 2903);
    dsi_session *a = session(f->m, 512, 64, 0);                          /* packed */
    dsi_session *b = session(f->m, 512, 32, DSI_SESSION_FLAG_F32_STATE); /* f32 rows */
    dsi_session *c = session(f->m, 512, 16, 0);                          /* packed */
    dsi_session *d = session(f->m, 512, 16, 0);                          /* packed */
    assert_int_equal(dsi_session_append(a, tok, n), DSI_OK);
    size_t na = 0;
    uint8_t *ia = save(a, &na);
    /* packed image → f32-stored session */
    assert_int_equal(dsi_session_load_buffer(b, ia, na), DSI_OK);
    /* version 1 (f32 rows) → packed session */
    size_t n1 = 0, n1bad = 0;
    uint8_t *i1 = to_v1(ia, na, &n1, 0), *i1bad = to_v1(ia, na, &n1bad, 1);
    assert_int_equal(g32(i1 + 8), 1);
    assert_true(n1 > na); /* f32 rows take more room than packed ones */
    assert_int_equal(dsi_session_load_buffer(c, i1, n1), DSI_OK);
    /* a row off the grid cannot be stored packed: refused before anything changes */
    assert_int_equal(dsi_session_append(d, tok, 40), DSI_OK);
    float *before = malloc(sizeof(float) * (size_t)f->V);
    memcpy(before, logits_of(d), sizeof(float) * (size_t)f->V);
    assert_int_equal(dsi_session_load_buffer(d, i1bad, n1bad), DSI_ERR_STATE_MISMATCH);
    const char *msg = dsi_session_last_error(d);
    printf("# off-grid v1 image: %s\n", msg);
    assert_non_null(strstr(msg, "grid"));
    assert_int_equal(pos_of(d), 40);
    assert_memory_equal(logits_of(d), before, sizeof(float) * (size_t)f->V);
    /* every continuation bit-identical */
    assert_memory_equal(logits_of(a), logits_of(b), sizeof(float) * (size_t)f->V);
    assert_memory_equal(logits_of(a), logits_of(c), sizeof(float) * (size_t)f->V);
    for (size_t i = 0; i < k; i++) {
        assert_int_equal(dsi_session_append(a, &tok[n + i], 1), DSI_OK);
        assert_int_equal(dsi_session_append(b, &tok[n + i], 1), DSI_OK);
        assert_int_equal(dsi_session_append(c, &tok[n + i], 1), DSI_OK);
        if (memcmp(logits_of(a), logits_of(b), sizeof(float) * (size_t)f->V))
            fail_msg("%s: f32-stored restore differs at continuation token %zu", f->file, i);
        if (memcmp(logits_of(a), logits_of(c), sizeof(float) * (size_t)f->V))
            fail_msg("%s: version-1 restore differs at continuation token %zu", f->file, i);
    }
    /* the f32-stored session's image (f32 rows) loads into a packed session, which then
     * writes exactly the packed session's image */
    size_t na2 = 0, nb2 = 0, nd2 = 0;
    uint8_t *ia2 = save(a, &na2), *ib2 = save(b, &nb2);
    assert_true(nb2 > na2);
    assert_int_equal(dsi_session_load_buffer(d, ib2, nb2), DSI_OK);
    uint8_t *id2 = save(d, &nd2);
    assert_int_equal(na2, nd2);
    assert_memory_equal(ia2, id2, na2);
    free(id2);
    printf("# %s: snapshot of %zu tokens: %zu bytes (version 1, f32 rows: %zu)\n", f->file, n, na,
           n1);
    free(before);
    free(ia);
    free(ia2);
    free(ib2);
    free(i1);
    free(i1bad);
    dsi_session_free(a);
    dsi_session_free(b);
    dsi_session_free(c);
    dsi_session_free(d);
}

/* ---- 3. the whole trained context ------------------------------------------------------ */

static void test_full_context(void **state) {
    fx *f = *state;
    need(f);
    const uint32_t N = f->n_ctx_train;
    assert_true(N >= 1024 && N <= 8192);
    dsi_token *tok = malloc(sizeof *tok * (N + 1));
    mt_tokens(tok, N + 1, f->V, 3907);
    dsi_session *a = session(f->m, N, 256, 0), *b = session(f->m, N, 173, 0);
    assert_int_equal(dsi_session_append(a, tok, N), DSI_OK);
    assert_int_equal(dsi_session_sync(b, tok, N, NULL), DSI_OK);
    assert_int_equal(pos_of(a), N);
    if (memcmp(logits_of(a), logits_of(b), sizeof(float) * (size_t)f->V))
        fail_msg("%s: last logits at the full context (%u) differ between chunkings", f->file, N);
    size_t am = mt_argmax(logits_of(a), f->V);
    assert_int_equal(dsi_session_append(a, &tok[N], 1), DSI_ERR_CONTEXT_FULL);
    assert_int_equal(pos_of(a), N);
    assert_int_equal(mt_argmax(logits_of(a), f->V), am);
    dsii_state_info ia;
    dsii_session_state_info(a, &ia);
    assert_true(ia.pool_positions >= N);
    dsi_session_free(a);
    dsi_session_free(b);
    free(tok);
}

/* ---- 4. memory ------------------------------------------------------------------------- */

static void test_memory(void **state) {
    fx *f = *state;
    need(f);
    const uint32_t N = f->n_ctx_train;
    dsi_token *tok = malloc(sizeof *tok * N);
    mt_tokens(tok, N, f->V, 4909);
    long long l0 = atomic_load(&g_live);
    dsi_session *s = session(f->m, N, 256, 0);
    long long l1 = atomic_load(&g_live);
    dsii_state_info in;
    dsii_session_state_info(s, &in);
    printf("# %s: n_ctx %u: created with %lld bytes (full state would be %llu: %.2f B/token x "
           "%u + rings %llu)\n",
           f->file, N, l1 - l0, (unsigned long long)in.full_bytes, in.bytes_per_token, N,
           (unsigned long long)in.ring_bytes);
    /* lazy: the row arrays of 1024 + 256 positions, not of n_ctx */
    assert_true((double)in.pool_bytes <=
                (double)in.ring_bytes + in.bytes_per_token * (1024 + 256 + 64) + 64 * 1024);
    assert_true(in.pool_bytes < in.full_bytes);
    const uint32_t depth[3] = {1000, 2500, 4000};
    uint32_t at = 0;
    for (int i = 0; i < 3; i++) {
        uint32_t D = depth[i] < N ? depth[i] : N;
        assert_int_equal(dsi_session_append(s, tok + at, D - at), DSI_OK);
        at = D;
        long long l = atomic_load(&g_live);
        double bound = in.bytes_per_token * (1.125 * D + 1024 + 256 + 64) + 64 * 1024;
        dsii_state_info id;
        dsii_session_state_info(s, &id);
        printf("# depth %u: +%lld bytes since creation (pool %llu bytes, %llu positions), bound "
               "%.0f\n",
               D, l - l1, (unsigned long long)id.pool_bytes,
               (unsigned long long)id.pool_positions, bound);
        assert_true((double)(l - l1) <= bound);
        assert_true(id.pool_positions >= D);
    }
    dsi_session_free(s);
    /* the budget: a session whose full state does not fit fails at creation */
    dsii_exec *ex = f->m->exec;
    ex->state_budget = in.full_bytes - 1;
    dsi_session_options so;
    dsi_session_options_init(&so);
    so.n_ctx = N;
    dsi_session *t = NULL;
    assert_int_equal(dsi_session_create(f->m, &so, &t), DSI_ERR_OUT_OF_DEVICE_MEMORY);
    const char *msg = dsi_last_error();
    printf("# over budget: %s\n", msg);
    char want[64];
    snprintf(want, sizeof want, "needs %llu bytes", (unsigned long long)in.full_bytes);
    assert_non_null(strstr(msg, want));
    snprintf(want, sizeof want, "budget is %llu bytes", (unsigned long long)(in.full_bytes - 1));
    assert_non_null(strstr(msg, want));
    ex->state_budget = in.full_bytes;
    assert_int_equal(dsi_session_create(f->m, &so, &t), DSI_OK);
    dsi_session_free(t);
    ex->state_budget = 0;
    free(tok);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    dsit_filter();
    if (argc > 1) g_backend = argv[1];
    if (!mt_model_path("tiny-v4.gguf", NULL) && !mt_model_path("tiny-v41.gguf", NULL))
        return dsit_absent("MODELS", "no tiny models in $DSI_MODELS_DIR");
    const int gpu = strcmp(g_backend, "cpu") != 0;
    dsi_context *probe = NULL;
    if (gpu) {
        dsi_context_options co;
        dsi_context_options_init(&co, DSI_ABI_VERSION);
        co.backend = g_backend;
        if (dsi_context_create(&co, &probe) != DSI_OK)
            return dsit_absent("VULKAN", "no %s backend: %s", g_backend, dsi_last_error());
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_packed_vs_f32, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_packed_vs_f32, setup, teardown, &g_fx[1]),
        cmocka_unit_test_prestate_setup_teardown(test_snapshot_packed, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_snapshot_packed, setup, teardown, &g_fx[1]),
        cmocka_unit_test_prestate_setup_teardown(test_full_context, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_full_context, setup, teardown, &g_fx[1]),
        cmocka_unit_test_prestate_setup_teardown(test_memory, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_memory, setup, teardown, &g_fx[1]),
    };
    const struct CMUnitTest gpu_tests[] = {
        cmocka_unit_test_prestate_setup_teardown(test_packed_vs_f32, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_packed_vs_f32, setup, teardown, &g_fx[1]),
        cmocka_unit_test_prestate_setup_teardown(test_offload, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_offload, setup, teardown, &g_fx[1]),
        cmocka_unit_test_prestate_setup_teardown(test_snapshot_packed, setup, teardown, &g_fx[0]),
        cmocka_unit_test_prestate_setup_teardown(test_snapshot_packed, setup, teardown, &g_fx[1]),
    };
    int rc = gpu ? _cmocka_run_group_tests("test_longctx_gpu", gpu_tests,
                                           dsit_vk_validation_requested() ? 4 : 6, NULL, NULL)
                 : cmocka_run_group_tests(tests, NULL, NULL);
    /* the validation counters live in the loaded module: read them with a context open */
    if (gpu && strcmp(g_backend, "vulkan") == 0 && dsit_vk_validation_check("test_longctx vulkan") != 0)
        rc++;
    if (probe) dsi_context_free(probe);
    return rc;
}
