/* Engram table access: row gather behind one call, whatever the placement (§4.6 step 1). */
#include "engram/engram.h"

#include "quant/fp.h"
#include "quant/quant.h"

#include <string.h>

/* Rows are small (release: 264 bytes); anything far larger is a malformed file. */
#define ENGRAM_MAX_ROW_BYTES (1u << 20)

/* ds4's row: K E4M3 values, then K/32 E8M0 scales. */
static void deq_row264(const uint8_t *src, float *dst, int64_t k) {
    for (int64_t j = 0; j < k; j++)
        dst[j] = dsii_e4m3_to_f32(src[j]) * dsii_e8m0_to_f32(src[k + j / 32]);
}

static dsi_status table_common(dsii_engram_table *t, int32_t type, int64_t row_elems,
                               uint64_t n_rows, dsii_error *err) {
    memset(t, 0, sizeof *t);
    if (type == DSII_TYPE_ENGRAM_ROW264) {
        if (row_elems < 32 || row_elems % 32 || row_elems > (int64_t)ENGRAM_MAX_ROW_BYTES)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "engram table: bad row264 row of %lld values",
                             (long long)row_elems);
        if (n_rows == 0 || n_rows > UINT32_MAX)
            return dsii_fail(err, DSI_ERR_BAD_FORMAT, "engram table: %llu rows", (unsigned long long)n_rows);
        t->type = type;
        t->row_elems = row_elems;
        t->n_rows = n_rows;
        t->row_bytes = (uint64_t)row_elems / 32 * 33;
        return DSI_OK;
    }
    const dsii_type_traits *tr = dsii_type_get(type);
    if (!tr) return dsii_fail(err, DSI_ERR_UNSUPPORTED, "engram table: unknown type %d", (int)type);
    if (!tr->supported || !tr->dequantize_row)
        return dsii_fail(err, DSI_ERR_UNSUPPORTED, "engram table: type %s is not supported",
                         tr->name);
    uint64_t rb = 0;
    if (row_elems < 1 || !dsii_type_row_size(type, row_elems, &rb) || rb == 0 ||
        rb > ENGRAM_MAX_ROW_BYTES)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "engram table: bad row of %lld %s elements",
                         (long long)row_elems, tr->name);
    if (n_rows == 0 || n_rows > UINT32_MAX)
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "engram table: %llu rows",
                         (unsigned long long)n_rows);
    t->type = type;
    t->row_elems = row_elems;
    t->n_rows = n_rows;
    t->row_bytes = rb;
    return DSI_OK;
}

dsi_status dsii_engram_table_host(dsii_engram_table *t, int32_t type, int64_t row_elems,
                                  uint64_t n_rows, const void *data, dsii_error *err) {
    dsi_status st = table_common(t, type, row_elems, n_rows, err);
    if (st != DSI_OK) return st;
    if (!data) return dsii_fail(err, DSI_ERR_INVALID_ARGUMENT, "engram table: no data");
    t->placement = DSII_ENGRAM_PLACE_HOST;
    t->host = (const uint8_t *)data;
    return DSI_OK;
}

dsi_status dsii_engram_table_file(dsii_engram_table *t, int32_t type, int64_t row_elems,
                                  uint64_t n_rows, const dsii_file *f, uint64_t offset,
                                  dsii_error *err) {
    dsi_status st = table_common(t, type, row_elems, n_rows, err);
    if (st != DSI_OK) return st;
    uint64_t total = 0;
    if (!f || !dsii_mul_u64(t->row_bytes, n_rows, &total) || !dsii_file_range_ok(f, offset, total))
        return dsii_fail(err, DSI_ERR_BAD_FORMAT, "engram table: %llu rows at offset %llu "
                         "beyond the end of %s",
                         (unsigned long long)n_rows, (unsigned long long)offset,
                         f ? dsii_file_name(f) : "(no file)");
    t->placement = DSII_ENGRAM_PLACE_PREAD;
    t->file = f;
    t->file_offset = offset;
    return DSI_OK;
}

/* One row: dequantised, then FP8 rows rounded to bf16 (§4.6 step 1, as ds4_engram.c does).
 * E4M3 times a power-of-two scale is exact in bf16 except below bf16's normal range, so the
 * rounding only matters at the edges; F32/F16/BF16 (debug) tables are used as stored. */
static void deq_row(const dsii_engram_table *t, const dsii_type_traits *tr, const uint8_t *src,
                    float *d) {
    const int row264 = t->type == DSII_TYPE_ENGRAM_ROW264;
    if (row264)
        deq_row264(src, d, t->row_elems);
    else
        tr->dequantize_row(src, d, t->row_elems);
    const int round_bf16 = t->type == DSI_TYPE_FP8_E4M3_R32 || t->type == DSI_TYPE_FP8_E4M3_B32 ||
                           t->type == DSI_TYPE_FP8_E4M3_B128 || row264;
    if (round_bf16)
        for (int64_t j = 0; j < t->row_elems; j++) d[j] = dsii_bf16_rne(d[j]);
}

static dsi_status read_row(const dsii_engram_table *t, uint32_t row, uint8_t *dst, dsii_error *err) {
    const uint64_t off = t->file_offset + (uint64_t)row * t->row_bytes;
    dsii_error e;
    dsi_status st = dsii_file_read(t->file, off, t->row_bytes, dst, &e);
    if (st != DSI_OK)
        return dsii_fail(err, st, "engram gather: row %u at offset %llu: %s", (unsigned)row,
                         (unsigned long long)off, e.msg);
    return DSI_OK;
}

/* ---- parallel readers (issue 17) ------------------------------------------------------------
 * Plan, under the row cache's lock held for the whole gather, in the serial order: a row whose
 * slot holds it is a hit (dequantised from the slot now, or — when an earlier row of this
 * gather is to fill the slot — later from that row's bytes); any other row is a read (a
 * "miss") whose slot is retagged at once, as the serial path would. A retagged slot carries
 * the miss number in the tag's bits 33.. (row + 1 < 2^33 fills the low bits), so later rows
 * of the gather see the serial cache state; the slot's bytes are written after the reads,
 * by the last miss that tagged it. Same hits, misses, bytes read and final cache as the
 * serial path; nobody else sees the marked tags (lock). */

#define TAG_ROW_MASK ((UINT64_C(1) << 33) - 1)

typedef struct gather_job {
    const dsii_engram_table *t;
    const dsii_type_traits *tr;
    const uint32_t *rows;
    const size_t *miss;   /* [n_miss] index into rows of each read */
    uint8_t *raw;         /* [n_miss][row_bytes] */
    float *dst;
    const atomic_int *cancel; /* or NULL */
    pthread_mutex_t mu;   /* the first failure */
    size_t fail_k;        /* SIZE_MAX: none */
    dsii_error err;
} gather_job;

static int gather_item(void *arg, size_t k) {
    gather_job *j = arg;
    const dsii_engram_table *t = j->t;
    const size_t i = j->miss[k];
    dsii_error e;
    uint8_t *raw = j->raw + k * (size_t)t->row_bytes;
    dsi_status st = j->cancel && atomic_load_explicit(j->cancel, memory_order_acquire)
                        ? dsii_fail(&e, DSI_ERR_CANCELLED, "engram gather: cancelled before reading "
                                    "row %u", (unsigned)j->rows[i])
                        : read_row(t, j->rows[i], raw, &e);
    if (st != DSI_OK) {
        /* items are claimed in order, so the lowest failing k is the serial path's failure */
        pthread_mutex_lock(&j->mu);
        if (k < j->fail_k) {
            j->fail_k = k;
            j->err = e;
        }
        pthread_mutex_unlock(&j->mu);
        return 1;
    }
    deq_row(t, j->tr, raw, j->dst + i * (size_t)t->row_elems);
    return 0;
}

static dsi_status gather_parallel(const dsi_context *ctx, const dsii_engram_table *t,
                                  const dsii_type_traits *tr, const uint32_t *rows, size_t n,
                                  float *dst, const atomic_int *cancel, dsii_error *err) {
    const size_t rb = (size_t)t->row_bytes;
    uint64_t raw_bytes = 0;
    if (!dsii_mul_u64(n, t->row_bytes, &raw_bytes) || raw_bytes > SIZE_MAX)
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "engram gather: %zu rows", n);
    size_t *miss = dsii_calloc(ctx, n, 2 * sizeof *miss);
    uint8_t *raw = dsii_malloc(ctx, (size_t)raw_bytes);
    if (!miss || !raw) {
        dsii_free(ctx, miss);
        dsii_free(ctx, raw);
        return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "engram gather: scratch");
    }
    size_t *ref = miss + n; /* per row: the miss whose bytes it takes, or SIZE_MAX (done) */
    dsii_engram_cache *c = t->cache;
    size_t nm = 0;
    uint64_t hits = 0;
    if (c) pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        if (c) {
            const uint64_t slot = (uint64_t)rows[i] % c->n_rows, tag = c->tag[slot];
            if ((tag & TAG_ROW_MASK) == (uint64_t)rows[i] + 1) {
                hits++;
                if (tag >> 33) {
                    ref[i] = (size_t)(tag >> 33) - 1;
                } else {
                    deq_row(t, tr, c->data + slot * rb, dst + i * (size_t)t->row_elems);
                    ref[i] = SIZE_MAX;
                }
                continue;
            }
            c->tag[slot] = ((uint64_t)rows[i] + 1) | ((uint64_t)(nm + 1) << 33);
        }
        ref[i] = nm;
        miss[nm++] = i;
    }
    gather_job j = {.t = t, .tr = tr, .rows = rows, .miss = miss, .raw = raw, .dst = dst,
                    .cancel = cancel, .fail_k = SIZE_MAX};
    pthread_mutex_init(&j.mu, NULL);
    if (nm) dsii_engram_readers_run(nm > 1 ? t->readers : NULL, nm, gather_item, &j);
    pthread_mutex_destroy(&j.mu);
    const dsi_status st = j.fail_k == SIZE_MAX ? DSI_OK : j.err.status;
    if (c) {
        for (size_t k = 0; k < nm; k++) {
            const uint64_t slot = (uint64_t)rows[miss[k]] % c->n_rows;
            if ((c->tag[slot] >> 33) != (uint64_t)k + 1) continue; /* a later miss took it */
            if (st == DSI_OK) {
                memcpy(c->data + slot * rb, raw + k * rb, rb);
                c->tag[slot] = (uint64_t)rows[miss[k]] + 1;
            } else {
                c->tag[slot] = 0;
            }
        }
        if (st == DSI_OK) {
            if (c->hits) atomic_fetch_add_explicit(c->hits, hits, memory_order_relaxed);
            if (c->misses) atomic_fetch_add_explicit(c->misses, nm, memory_order_relaxed);
            if (c->bytes_read)
                atomic_fetch_add_explicit(c->bytes_read, (uint64_t)nm * t->row_bytes,
                                          memory_order_relaxed);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (st == DSI_OK) {
        for (size_t i = 0; i < n; i++)
            if (ref[i] != SIZE_MAX && miss[ref[i]] != i)
                deq_row(t, tr, raw + ref[i] * rb, dst + i * (size_t)t->row_elems);
    } else {
        dsii_fail(err, st, "%s", j.err.msg);
    }
    dsii_free(ctx, raw);
    dsii_free(ctx, miss);
    return st;
}

dsi_status dsii_engram_gather(const dsi_context *ctx, const dsii_engram_table *t,
                              const uint32_t *rows, size_t n, float *dst, dsii_error *err) {
    return dsii_engram_gather_c(ctx, t, rows, n, dst, NULL, err);
}

/* A read the cancel request stops: CANCELLED, like any failed read. */
static dsi_status read_row_c(const dsii_engram_table *t, uint32_t row, uint8_t *dst,
                             const atomic_int *cancel, dsii_error *err) {
    if (cancel && atomic_load_explicit(cancel, memory_order_acquire))
        return dsii_fail(err, DSI_ERR_CANCELLED, "engram gather: cancelled before reading row %u",
                         (unsigned)row);
    return read_row(t, row, dst, err);
}

dsi_status dsii_engram_gather_c(const dsi_context *ctx, const dsii_engram_table *t,
                                const uint32_t *rows, size_t n, float *dst,
                                const atomic_int *cancel, dsii_error *err) {
    const int row264 = t->type == DSII_TYPE_ENGRAM_ROW264;
    const dsii_type_traits *tr = row264 ? NULL : dsii_type_get(t->type);
    if (!row264 && (!tr || !tr->dequantize_row))
        return dsii_fail(err, DSI_ERR_INTERNAL, "engram gather: table not initialised");
    for (size_t i = 0; i < n; i++)
        if ((uint64_t)rows[i] >= t->n_rows)
            return dsii_fail(err, DSI_ERR_INTERNAL, "engram gather: row %u >= %llu rows",
                             (unsigned)rows[i], (unsigned long long)t->n_rows);
    /* two or more rows and readers: the parallel path (a gather that turns out to be all
     * hits, or one read, runs there on the calling thread alone) */
    if (t->placement == DSII_ENGRAM_PLACE_PREAD && t->readers && n >= 2 && n < ((size_t)1 << 30))
        return gather_parallel(ctx, t, tr, rows, n, dst, cancel, err);
    uint8_t *scratch = NULL;
    if (t->placement == DSII_ENGRAM_PLACE_PREAD) {
        scratch = (uint8_t *)dsii_malloc(ctx, (size_t)t->row_bytes);
        if (!scratch) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "engram gather: scratch");
    }
    dsi_status st = DSI_OK;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *src;
        if (t->placement == DSII_ENGRAM_PLACE_HOST) {
            src = t->host + (uint64_t)rows[i] * t->row_bytes;
        } else if (t->cache) {
            /* the row cache (lib/place): a hit is the same bytes the file holds */
            dsii_engram_cache *c = t->cache;
            uint64_t slot = (uint64_t)rows[i] % c->n_rows;
            uint8_t *cd = c->data + slot * t->row_bytes;
            pthread_mutex_lock(&c->mu);
            if (c->tag[slot] == (uint64_t)rows[i] + 1) {
                memcpy(scratch, cd, (size_t)t->row_bytes);
                if (c->hits) atomic_fetch_add_explicit(c->hits, 1, memory_order_relaxed);
            } else {
                st = read_row_c(t, rows[i], scratch, cancel, err);
                if (st == DSI_OK) {
                    memcpy(cd, scratch, (size_t)t->row_bytes);
                    c->tag[slot] = (uint64_t)rows[i] + 1;
                    if (c->misses) atomic_fetch_add_explicit(c->misses, 1, memory_order_relaxed);
                    if (c->bytes_read)
                        atomic_fetch_add_explicit(c->bytes_read, t->row_bytes, memory_order_relaxed);
                }
            }
            pthread_mutex_unlock(&c->mu);
            if (st != DSI_OK) break;
            src = scratch;
        } else {
            st = read_row_c(t, rows[i], scratch, cancel, err);
            if (st != DSI_OK) break;
            src = scratch;
        }
        deq_row(t, tr, src, dst + i * (size_t)t->row_elems);
    }
    dsii_free(ctx, scratch);
    return st;
}
