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

dsi_status dsii_engram_gather(const dsi_context *ctx, const dsii_engram_table *t,
                              const uint32_t *rows, size_t n, float *dst, dsii_error *err) {
    const int row264 = t->type == DSII_TYPE_ENGRAM_ROW264;
    const dsii_type_traits *tr = row264 ? NULL : dsii_type_get(t->type);
    if (!row264 && (!tr || !tr->dequantize_row))
        return dsii_fail(err, DSI_ERR_INTERNAL, "engram gather: table not initialised");
    uint8_t *scratch = NULL;
    if (t->placement == DSII_ENGRAM_PLACE_PREAD) {
        scratch = (uint8_t *)dsii_malloc(ctx, (size_t)t->row_bytes);
        if (!scratch) return dsii_fail(err, DSI_ERR_OUT_OF_HOST_MEMORY, "engram gather: scratch");
    }
    const int round_bf16 = t->type == DSI_TYPE_FP8_E4M3_R32 || t->type == DSI_TYPE_FP8_E4M3_B32 ||
                           t->type == DSI_TYPE_FP8_E4M3_B128 || row264;
    dsi_status st = DSI_OK;
    for (size_t i = 0; i < n; i++) {
        if ((uint64_t)rows[i] >= t->n_rows) {
            st = dsii_fail(err, DSI_ERR_INTERNAL, "engram gather: row %u >= %llu rows",
                           (unsigned)rows[i], (unsigned long long)t->n_rows);
            break;
        }
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
                st = dsii_file_read(t->file, t->file_offset + (uint64_t)rows[i] * t->row_bytes,
                                    t->row_bytes, scratch, err);
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
            st = dsii_file_read(t->file, t->file_offset + (uint64_t)rows[i] * t->row_bytes,
                                t->row_bytes, scratch, err);
            if (st != DSI_OK) break;
            src = scratch;
        }
        float *d = dst + i * (size_t)t->row_elems;
        if (row264)
            deq_row264(src, d, t->row_elems);
        else
            tr->dequantize_row(src, d, t->row_elems);
        /* FP8 rows are dequantised to bf16 (§4.6 step 1, as ds4_engram.c does). E4M3 times a
         * power-of-two scale is exact in bf16 except below bf16's normal range, so this only
         * matters at the edges; F32/F16/BF16 (debug) tables are used as stored. */
        if (round_bf16)
            for (int64_t j = 0; j < t->row_elems; j++) d[j] = dsii_bf16_rne(d[j]);
    }
    dsii_free(ctx, scratch);
    return st;
}
