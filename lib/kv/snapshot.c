/* lib/kv/snapshot.c — the snapshot format (snapshot.h, docs/snapshots.md). */
#include "kv/snapshot.h"

#include "backends/backend.h"
#include "quant/statepack.h"

/* xxHash from Debian's libxxhash-dev, inlined: no link dependency and no XXH_* symbol in
 * the library's exports. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

/* The fuzz build (tests/fuzz/fuzz_snapshot.c) lets mutated bytes past the checksums so the
 * checks behind them get fuzzed too. */
#ifdef DSII_SNAP_FUZZ
#define CHECKSUM_BAD(a, b) ((void)(a), (void)(b), 0)
#else
#define CHECKSUM_BAD(a, b) ((a) != (b))
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "snapshot payloads are little-endian IEEE-754 copies of host memory"
#endif

static const uint8_t k_magic[8] = {'D', 'S', 'I', 'S', 'N', 'A', 'P', 0x1A};

enum {
    TAG_TOKENS = 0x4E4B4F54u, /* "TOKN" */
    TAG_LOGITS = 0x54474F4Cu, /* "LOGT" */
    TAG_LAYOUT = 0x5459414Cu, /* "LAYT" */
    TAG_STATE = 0x54415453u   /* "STAT" */
};
static const uint32_t k_order[DSII_SNAP_N_SECTIONS] = {TAG_TOKENS, TAG_LOGITS, TAG_LAYOUT,
                                                       TAG_STATE};

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static const char *tag_name(uint32_t tag, char out[5]) {
    for (int i = 0; i < 4; i++) {
        char c = (char)(tag >> (8 * i));
        out[i] = (c >= 32 && c < 127) ? c : '?';
    }
    out[4] = 0;
    return out;
}

/* ---- which rows a prefix needs ------------------------------------------------------------ */

/* Rows of component c stored for a prefix of L tokens taken while the slot holds P >= L:
 * rings: positions first .. L−1 (every position still in the ring); row arrays: rows
 * 0 .. count−1 (the groups the prefix completed). Returns 0 when the prefix is too far
 * behind P for this ring. */
static int stored_rows(const dsii_kv_comp *c, uint32_t L, uint32_t P, uint32_t *first,
                       uint32_t *count) {
    if (c->kind == DSII_KV_RING) {
        uint32_t f = P > c->rows ? P - c->rows : 0;
        if (L < f) return 0;
        *first = f;
        *count = L - f;
    } else {
        uint32_t n = c->ratio ? L / c->ratio : c->rows;
        *first = 0;
        *count = n < c->rows ? n : c->rows;
    }
    return 1;
}

/* ---- packed rows (issue 19: FP8 / FP4 state, lib/quant/statepack.h) ----------------------- */

/* The form a component's rows take in a snapshot: the form the pool stores them in (packed
 * on the CPU with the rounding on, f32 elsewhere). A loader converts to its own pool's form
 * (packed rows unpack exactly; f32 rows pack exactly when they lie on the grids, which
 * validation checks), so images of every backend load everywhere. */
typedef struct snap_form {
    int32_t format;
    uint32_t qcols, block, row_bytes;
} snap_form;

static snap_form form_of(const dsii_kv_comp *c) {
    snap_form f = {c->format, c->qcols, c->block, c->row_bytes};
    return f;
}

/* n rows of component c from the form (from_fmt, from_q, from_b) into form `to` (host; not in
 * place; tmp: c->ld floats).
 * Returns 0, or 1 when a row was not on f's grid (it cannot be stored exactly). */
static int rows_convert(const dsii_kv_comp *c, int32_t from_fmt, uint32_t from_q,
                        uint32_t from_b, const uint8_t *src, const snap_form *to, uint8_t *dst,
                        uint32_t n, float *tmp) {
    uint32_t frb = dsii_sp_row_bytes(from_fmt, c->ld, from_q, from_b);
    int bad = 0;
    for (uint32_t r = 0; r < n; r++) {
        dsii_sp_unpack_row(from_fmt, c->ld, from_q, from_b, src + (size_t)r * frb, tmp);
        bad |= dsii_sp_pack_row(to->format, c->ld, to->qcols, to->block, tmp,
                                dst + (size_t)r * to->row_bytes);
    }
    return bad;
}

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct wr {
    dsii_snap_write_fn fn;
    void *ud;
    uint64_t n;
    XXH3_state_t h;
    int failed;
} wr;

static void raw(wr *w, const void *p, size_t n) {
    if (w->failed || n == 0) return;
    if (w->fn(w->ud, p, n) != 0) {
        w->failed = 1;
        return;
    }
    w->n += n;
}

static void sec_begin(wr *w, uint32_t tag, uint64_t len) {
    uint8_t h[DSII_SNAP_SECTION_HEAD];
    put32(h, tag);
    put32(h + 4, 0);
    put64(h + 8, len);
    XXH3_64bits_reset(&w->h);
    XXH3_64bits_update(&w->h, h, sizeof h);
    raw(w, h, sizeof h);
}

static void sec_data(wr *w, const void *p, size_t n) {
    if (n == 0) return;
    XXH3_64bits_update(&w->h, p, n);
    raw(w, p, n);
}

static void sec_end(wr *w) {
    uint8_t t[8];
    put64(t, XXH3_64bits_digest(&w->h));
    raw(w, t, sizeof t);
}

/* Sizes of src's snapshot: the whole, the largest component, the state section. */
static dsi_status plan_sizes(const dsii_snap_src *src, uint64_t *total, uint64_t *max_comp,
                             uint64_t *state_bytes, dsii_error *e) {
    const dsii_kv_layout *l = dsii_kv_pool_layout(src->pool);
    uint32_t L = src->n_tokens, P = src->cur;
    if (L > P || L == 0)
        return dsii_fail(e, DSI_ERR_INTERNAL, "snapshot: bad prefix %u (state %u)", L, P);
    uint64_t sb = 0, mc = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        uint32_t f, c;
        if (!stored_rows(&l->c[i], L, P, &f, &c))
            return dsii_fail(e, DSI_ERR_INTERNAL,
                             "snapshot: a prefix of %u tokens is no longer in the state of %u",
                             L, P);
        uint64_t b = (uint64_t)c * form_of(&l->c[i]).row_bytes;
        sb += b;
        if (b > mc) mc = b;
    }
    const uint64_t sec = DSII_SNAP_SECTION_HEAD + DSII_SNAP_SECTION_TAIL;
    *total = DSII_SNAP_HEADER_BYTES + DSII_SNAP_N_SECTIONS * sec + (uint64_t)L * 4 +
             (src->logits ? (uint64_t)src->id.n_vocab * 4 : 0) +
             (uint64_t)l->n * DSII_SNAP_LAYOUT_ENTRY + sb;
    *max_comp = mc;
    *state_bytes = sb;
    return DSI_OK;
}

dsi_status dsii_snap_size(const dsii_snap_src *src, uint64_t *total, dsii_error *e) {
    uint64_t mc, sb;
    return plan_sizes(src, total, &mc, &sb, e);
}

dsi_status dsii_snap_write(const dsii_snap_src *src, dsii_snap_write_fn write, void *user_data,
                           uint64_t *bytes_written, dsii_error *e) {
    if (bytes_written) *bytes_written = 0;
    const dsii_kv_layout *l = dsii_kv_pool_layout(src->pool);
    const dsi_context *ctx = l->ctx;
    uint32_t L = src->n_tokens, P = src->cur;
    uint64_t total = 0, max_comp = 0, state_bytes = 0;
    dsi_status pst = plan_sizes(src, &total, &max_comp, &state_bytes, e);
    if (pst != DSI_OK) return pst;
    uint64_t tok_b = (uint64_t)L * 4, log_b = src->logits ? (uint64_t)src->id.n_vocab * 4 : 0;
    uint64_t lay_b = (uint64_t)l->n * DSII_SNAP_LAYOUT_ENTRY;

    uint8_t h[DSII_SNAP_HEADER_BYTES];
    memset(h, 0, sizeof h);
    memcpy(h, k_magic, 8);
    put32(h + 8, DSII_SNAP_VERSION);
    put32(h + 12, DSII_SNAP_HEADER_BYTES);
    memcpy(h + 16, src->id.fingerprint, 16);
    put32(h + 32, src->id.arch);
    put32(h + 36, src->id.n_vocab);
    put32(h + 40, src->id.state_flags);
    put32(h + 44, L);
    put32(h + 48, src->logits ? 1u : 0u);
    put32(h + 52, l->n);
    put32(h + 56, src->margin);
    put32(h + 60, DSII_SNAP_N_SECTIONS);
    put64(h + 64, total);
    if (src->backend) {
        size_t bl = strlen(src->backend);
        memcpy(h + 72, src->backend, bl < 15 ? bl : 15);
    }
    put64(h + 120, XXH3_64bits(h, 120));

    wr w;
    memset(&w, 0, sizeof w);
    w.fn = write;
    w.ud = user_data;
    raw(&w, h, sizeof h);

    sec_begin(&w, TAG_TOKENS, tok_b);
    for (uint32_t i = 0; i < L && !w.failed; i += 1024) {
        uint8_t b[4096];
        uint32_t k = L - i < 1024 ? L - i : 1024;
        for (uint32_t j = 0; j < k; j++) put32(b + 4 * j, (uint32_t)src->tokens[i + j]);
        sec_data(&w, b, (size_t)k * 4);
    }
    sec_end(&w);

    sec_begin(&w, TAG_LOGITS, log_b);
    if (src->logits) sec_data(&w, src->logits, (size_t)log_b);
    sec_end(&w);

    sec_begin(&w, TAG_LAYOUT, lay_b);
    for (uint32_t i = 0; i < l->n; i++) {
        const dsii_kv_comp *c = &l->c[i];
        uint32_t f = 0, cnt = 0;
        stored_rows(c, L, P, &f, &cnt);
        uint8_t b[DSII_SNAP_LAYOUT_ENTRY];
        put32(b, c->kind);
        put32(b + 4, c->rows);
        put32(b + 8, c->ld);
        put32(b + 12, c->ratio);
        put32(b + 16, f);
        put32(b + 20, cnt);
        snap_form fm = form_of(c);
        put32(b + 24, (uint32_t)fm.format);
        put32(b + 28, fm.qcols);
        put32(b + 32, fm.block);
        sec_data(&w, b, sizeof b);
    }
    sec_end(&w);

    dsi_status st = DSI_OK;
    uint8_t *buf = max_comp ? dsii_malloc(ctx, (size_t)max_comp) : NULL;
    if (max_comp && !buf) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "snapshot: out of host memory");
    sec_begin(&w, TAG_STATE, state_bytes);
    for (uint32_t i = 0; i < l->n && st == DSI_OK && !w.failed; i++) {
        const dsii_kv_comp *c = &l->c[i];
        uint32_t f = 0, cnt = 0;
        stored_rows(c, L, P, &f, &cnt);
        if (cnt == 0) continue;
        size_t rb = c->row_bytes;
        if (c->kind == DSII_KV_RING) {
            /* positions f .. f+cnt−1 oldest first: at most two contiguous pieces */
            uint32_t r0 = f % c->rows, n1 = c->rows - r0 < cnt ? c->rows - r0 : cnt;
            st = dsii_kv_rows_read(src->pool, src->slot, i, r0, n1, buf, e);
            if (st == DSI_OK && cnt > n1)
                st = dsii_kv_rows_read(src->pool, src->slot, i, 0, cnt - n1, buf + n1 * rb, e);
        } else {
            st = dsii_kv_rows_read(src->pool, src->slot, i, 0, cnt, buf, e);
        }
        if (st == DSI_OK) sec_data(&w, buf, (size_t)cnt * rb); /* the pool's own form */
    }
    sec_end(&w);
    dsii_free(ctx, buf);
    if (st != DSI_OK) return st;
    if (w.failed)
        return dsii_fail(e, DSI_ERR_IO, "snapshot: the writer failed after %llu of %llu bytes",
                         (unsigned long long)w.n, (unsigned long long)total);
    if (w.n != total)
        return dsii_fail(e, DSI_ERR_INTERNAL, "snapshot: wrote %llu bytes, planned %llu",
                         (unsigned long long)w.n, (unsigned long long)total);
    if (bytes_written) *bytes_written = w.n;
    return DSI_OK;
}

/* ---- reading ------------------------------------------------------------------------------- */

/* The largest snapshot a target can accept for n_tokens (each ring holds at most every
 * position of the prefix, each row array at most the target's rows). */
static uint64_t max_bytes(const dsii_snap_target *t, uint32_t n_tokens, uint32_t n_comps) {
    const uint64_t sec = DSII_SNAP_SECTION_HEAD + DSII_SNAP_SECTION_TAIL;
    uint64_t b = DSII_SNAP_HEADER_BYTES + 4 * sec + (uint64_t)n_tokens * 4 +
                 (uint64_t)t->id.n_vocab * 4 + (uint64_t)n_comps * DSII_SNAP_LAYOUT_ENTRY;
    /* rows: f32 is the largest form any version writes */
    for (uint32_t i = 0; i < t->layout->n; i++) {
        const dsii_kv_comp *c = &t->layout->c[i];
        uint64_t rows = c->kind == DSII_KV_RING ? n_tokens : c->rows;
        b += rows * c->ld * sizeof(float);
    }
    return b;
}

dsi_status dsii_snap_check_header(const uint8_t *h, size_t n, const dsii_snap_target *t,
                                  uint64_t *total, dsii_error *e) {
    *total = 0;
    if (n < 12 || memcmp(h, k_magic, 8) != 0)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "not a libdsinfer snapshot (%s)",
                         n < 12 ? "too short" : "bad magic");
    uint32_t ver = get32(h + 8);
    if (ver > DSII_SNAP_VERSION)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED,
                         "snapshot format version %u is newer than this library's (%u)", ver,
                         DSII_SNAP_VERSION);
    if (ver == 0)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot format version 0 is invalid");
    if (ver < DSII_SNAP_VERSION_MIN)
        return dsii_fail(e, DSI_ERR_UNSUPPORTED,
                         "snapshot format version %u is older than this library reads (%u..%u)",
                         ver, DSII_SNAP_VERSION_MIN, DSII_SNAP_VERSION);
    if (n < DSII_SNAP_HEADER_BYTES)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot truncated: %zu bytes, the header alone is %u",
                         n, DSII_SNAP_HEADER_BYTES);
    if (CHECKSUM_BAD(get64(h + 120), XXH3_64bits(h, 120)))
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot header checksum mismatch (corrupt)");
    if (get32(h + 12) != DSII_SNAP_HEADER_BYTES || get32(h + 60) != DSII_SNAP_N_SECTIONS)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot header: bad header size or section count");
    if (memcmp(h + 16, t->id.fingerprint, 16) != 0 || get32(h + 32) != t->id.arch ||
        get32(h + 36) != t->id.n_vocab)
        return dsii_fail(e, DSI_ERR_STATE_MISMATCH,
                         "snapshot belongs to another model (fingerprint, architecture or "
                         "vocabulary differ)");
    if (get32(h + 40) != t->id.state_flags)
        return dsii_fail(e, DSI_ERR_STATE_MISMATCH,
                         "snapshot was taken with session flags 0x%x, this session has 0x%x",
                         get32(h + 40), t->id.state_flags);
    uint32_t nt = get32(h + 44);
    if (nt > t->n_ctx)
        return dsii_fail(e, DSI_ERR_CONTEXT_FULL,
                         "snapshot holds %u tokens, the session's n_ctx is %u", nt, t->n_ctx);
    if (nt == 0)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot holds no tokens");
    if (get32(h + 48) > 1)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot header: bad logits flag");
    if (get32(h + 52) != t->layout->n)
        return dsii_fail(e, DSI_ERR_STATE_MISMATCH,
                         "snapshot state has %u components, this session's has %u",
                         get32(h + 52), t->layout->n);
    uint64_t tot = get64(h + 64);
    uint64_t lim = max_bytes(t, nt, t->layout->n);
    if (tot < DSII_SNAP_HEADER_BYTES || tot > lim)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT,
                         "snapshot header: size %llu outside what %u tokens can take (<= %llu)",
                         (unsigned long long)tot, nt, (unsigned long long)lim);
    *total = tot;
    return DSI_OK;
}

dsi_status dsii_snap_validate(const uint8_t *buf, size_t n, const dsii_snap_target *t,
                              int32_t n_vocab_check, dsii_snap_view *v, dsii_error *e) {
    memset(v, 0, sizeof *v);
    uint64_t total = 0;
    dsi_status st = dsii_snap_check_header(buf, n, t, &total, e);
    if (st != DSI_OK) return st;
    if (n < total)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot truncated: %zu of %llu bytes", n,
                         (unsigned long long)total);
    if (n > total)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot has %llu bytes after its end",
                         (unsigned long long)(n - total));
    v->buf = buf;
    v->version = get32(buf + 8);
    v->entry_bytes = v->version >= 2 ? DSII_SNAP_LAYOUT_ENTRY : DSII_SNAP_LAYOUT_ENTRY_V1;
    v->n_tokens = get32(buf + 44);
    v->has_logits = get32(buf + 48);
    v->n_comps = get32(buf + 52);
    const uint8_t *payload[DSII_SNAP_N_SECTIONS];
    uint64_t len[DSII_SNAP_N_SECTIONS];
    uint64_t off = DSII_SNAP_HEADER_BYTES;
    for (uint32_t s = 0; s < DSII_SNAP_N_SECTIONS; s++) {
        char nm[5];
        tag_name(k_order[s], nm);
        if (total - off < DSII_SNAP_SECTION_HEAD + DSII_SNAP_SECTION_TAIL)
            return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: section '%s' missing", nm);
        const uint8_t *sh = buf + off;
        uint64_t ln = get64(sh + 8);
        if (get32(sh) != k_order[s] || get32(sh + 4) != 0 ||
            ln > total - off - DSII_SNAP_SECTION_HEAD - DSII_SNAP_SECTION_TAIL) {
            char got[5];
            return dsii_fail(e, DSI_ERR_BAD_FORMAT,
                             "snapshot: section %u should be '%s' (found '%s', %llu bytes) (corrupt)",
                             s, nm, tag_name(get32(sh), got), (unsigned long long)ln);
        }
        uint64_t sum = XXH3_64bits(sh, (size_t)(DSII_SNAP_SECTION_HEAD + ln));
        if (CHECKSUM_BAD(get64(sh + DSII_SNAP_SECTION_HEAD + ln), sum))
            return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: section '%s' checksum mismatch (corrupt)",
                             nm);
        payload[s] = sh + DSII_SNAP_SECTION_HEAD;
        len[s] = ln;
        off += DSII_SNAP_SECTION_HEAD + ln + DSII_SNAP_SECTION_TAIL;
    }
    if (off != total)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: %llu bytes after the last section",
                         (unsigned long long)(total - off));
    if (len[0] != (uint64_t)v->n_tokens * 4)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: token section size %llu for %u tokens",
                         (unsigned long long)len[0], v->n_tokens);
    if (len[1] != (v->has_logits ? (uint64_t)t->id.n_vocab * 4 : 0))
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: logits section size %llu",
                         (unsigned long long)len[1]);
    if (len[2] != (uint64_t)v->n_comps * v->entry_bytes)
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: layout section size %llu",
                         (unsigned long long)len[2]);
    v->tokens = payload[0];
    v->logits = v->has_logits ? payload[1] : NULL;
    v->layout = payload[2];
    v->state = payload[3];
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        int32_t tk = (int32_t)get32(v->tokens + 4 * (size_t)i);
        if (tk < 0 || tk >= n_vocab_check)
            return dsii_fail(e, DSI_ERR_BAD_FORMAT,
                             "snapshot: token %d at %u is outside the vocabulary (%d)", tk, i,
                             n_vocab_check);
    }
    /* every component against the target layout */
    const dsii_kv_layout *tl = t->layout;
    uint64_t state = 0;
    for (uint32_t i = 0; i < v->n_comps; i++) {
        const uint8_t *p = v->layout + (size_t)i * v->entry_bytes;
        uint32_t kind = get32(p), ld = get32(p + 8), ratio = get32(p + 12);
        uint32_t first = get32(p + 16), count = get32(p + 20);
        const dsii_kv_comp *c = &tl->c[i];
        if (kind != c->kind || ld != c->ld || ratio != c->ratio)
            return dsii_fail(e, DSI_ERR_STATE_MISMATCH,
                             "snapshot: state component %u (kind %u, %u floats, ratio %u) differs "
                             "from this session's (kind %u, %u floats, ratio %u)",
                             i, kind, ld, ratio, c->kind, c->ld, c->ratio);
        uint32_t fmt = 0, qc = 0, bl = 0;
        if (v->version >= 2) fmt = get32(p + 24), qc = get32(p + 28), bl = get32(p + 32);
        /* the rows' form: f32, or exactly the component's declared packed form */
        if (fmt != DSIB_STATE_F32 &&
            (fmt != (uint32_t)c->decl_format || qc != c->decl_qcols || bl != c->decl_block))
            return dsii_fail(e, DSI_ERR_STATE_MISMATCH,
                             "snapshot: state component %u is stored as format %u (%u values in "
                             "blocks of %u), this session's rows are format %d (%u in blocks of %u)",
                             i, fmt, qc, bl, (int)c->decl_format, c->decl_qcols, c->decl_block);
        if (fmt == DSIB_STATE_F32 && (qc || bl))
            return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: component %u: f32 rows with a block", i);
        uint64_t erb = fmt == DSIB_STATE_F32 ? (uint64_t)ld * 4u
                                             : dsii_sp_row_bytes((int32_t)fmt, ld, qc, bl);
        if (kind == DSII_KV_RING) {
            uint32_t span = c->rows > tl->margin ? c->rows - tl->margin : c->rows;
            uint32_t need = v->n_tokens < span ? v->n_tokens : span;
            if (first > v->n_tokens || count != v->n_tokens - first || count < need)
                return dsii_fail(e, DSI_ERR_BAD_FORMAT,
                                 "snapshot: ring component %u holds positions %u+%u, the prefix "
                                 "of %u tokens needs its last %u",
                                 i, first, count, v->n_tokens, need);
        } else {
            uint32_t want = ratio ? v->n_tokens / ratio : count;
            if (first != 0 || count != want || count > c->rows)
                return dsii_fail(e, DSI_ERR_BAD_FORMAT,
                                 "snapshot: row component %u holds %u rows (from %u), expected %u "
                                 "(<= %u)",
                                 i, count, first, want, c->rows);
        }
        if (len[3] < state || (uint64_t)count * erb > len[3] - state)
            return dsii_fail(e, DSI_ERR_BAD_FORMAT,
                             "snapshot: state section %llu bytes, too short for component %u",
                             (unsigned long long)len[3], i);
        /* f32 rows into a packed pool: every row must be on the grid (checked before
         * anything is written, so apply cannot fail on it) */
        if (fmt == DSIB_STATE_F32 && c->format != DSIB_STATE_F32) {
            float *tmp = dsii_malloc(tl->ctx, (size_t)ld * 4 + c->row_bytes);
            if (!tmp) return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "snapshot: out of host memory");
            int bad = 0;
            for (uint32_t r = 0; r < count && !bad; r++) {
                memcpy(tmp, payload[3] + state + (size_t)r * erb, (size_t)ld * 4);
                bad = dsii_sp_pack_row(c->format, ld, c->qcols, c->block, tmp,
                                       (uint8_t *)(tmp + ld));
            }
            dsii_free(tl->ctx, tmp);
            if (bad)
                return dsii_fail(e, DSI_ERR_STATE_MISMATCH,
                                 "snapshot: state component %u has f32 rows off the FP8/FP4 grid "
                                 "this session stores packed (a snapshot taken without rounding?)",
                                 i);
        }
        state += (uint64_t)count * erb;
    }
    if (state != len[3])
        return dsii_fail(e, DSI_ERR_BAD_FORMAT, "snapshot: state section %llu bytes, layout says %llu",
                         (unsigned long long)len[3], (unsigned long long)state);
    v->state_bytes = state;
    return DSI_OK;
}

dsi_status dsii_snap_apply(const dsii_snap_view *v, dsii_kv_pool *pool, uint32_t slot,
                           uint32_t *exact_from, dsii_error *e) {
    const dsii_kv_layout *tl = dsii_kv_pool_layout(pool);
    const uint8_t *src = v->state;
    uint32_t L = v->n_tokens, ef = 0;
    uint8_t *cv = NULL; /* rows converted to the pool's stored form */
    float *tmp = NULL;
    for (uint32_t i = 0; i < v->n_comps; i++) {
        const uint8_t *p = v->layout + (size_t)i * v->entry_bytes;
        uint32_t first = get32(p + 16), count = get32(p + 20);
        const dsii_kv_comp *c = &tl->c[i];
        int32_t fmt = v->version >= 2 ? (int32_t)get32(p + 24) : DSIB_STATE_F32;
        uint32_t qc = v->version >= 2 ? get32(p + 28) : 0, bl = v->version >= 2 ? get32(p + 32) : 0;
        size_t erb = dsii_sp_row_bytes(fmt, c->ld, qc, bl);
        const uint8_t *rows = src;
        src += (size_t)count * erb;
        size_t rb = c->row_bytes;
        if (fmt != c->format && count) {
            /* packed snapshot rows into an f32 pool, or f32 rows into a packed pool (exact:
             * validate checked them) */
            dsii_free(tl->ctx, cv);
            dsii_free(tl->ctx, tmp);
            cv = dsii_malloc(tl->ctx, (size_t)count * rb);
            tmp = dsii_malloc(tl->ctx, (size_t)c->ld * 4);
            if (!cv || !tmp) {
                dsii_free(tl->ctx, cv);
                dsii_free(tl->ctx, tmp);
                return dsii_fail(e, DSI_ERR_OUT_OF_HOST_MEMORY, "snapshot: out of host memory");
            }
            snap_form to = {c->format, c->qcols, c->block, c->row_bytes};
            (void)rows_convert(c, fmt, qc, bl, rows, &to, cv, count, tmp);
            rows = cv;
        }
        dsi_status st = DSI_OK;
        if (c->kind == DSII_KV_RING) {
            /* the last min(count, rows) positions go to their rows pos mod rows */
            uint32_t f = L - count, skip = 0;
            if (count > c->rows) {
                skip = count - c->rows;
                f += skip;
            }
            uint32_t cnt = count - skip;
            const uint8_t *s = rows + (size_t)skip * rb;
            uint32_t r0 = f % c->rows, n1 = c->rows - r0 < cnt ? c->rows - r0 : cnt;
            st = dsii_kv_rows_write(pool, slot, i, r0, n1, s, e);
            if (st == DSI_OK && cnt > n1)
                st = dsii_kv_rows_write(pool, slot, i, 0, cnt - n1, s + (size_t)n1 * rb, e);
            uint32_t span = c->rows > tl->margin ? c->rows - tl->margin : c->rows;
            if (f > 0 && f + span > ef) ef = f + span;
            (void)first;
        } else if (count) {
            st = dsii_kv_rows_write(pool, slot, i, 0, count, rows, e);
        }
        if (st != DSI_OK) {
            dsii_free(tl->ctx, cv);
            dsii_free(tl->ctx, tmp);
            return st;
        }
    }
    dsii_free(tl->ctx, cv);
    dsii_free(tl->ctx, tmp);
    if (exact_from) *exact_from = ef;
    return DSI_OK;
}

void dsii_snap_tokens(const dsii_snap_view *v, int32_t *out) {
    for (uint32_t i = 0; i < v->n_tokens; i++) out[i] = (int32_t)get32(v->tokens + 4 * (size_t)i);
}

void dsii_snap_logits(const dsii_snap_view *v, uint32_t n_vocab, float *out) {
    if (v->logits) memcpy(out, v->logits, (size_t)n_vocab * sizeof(float));
}
