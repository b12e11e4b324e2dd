/*
 * lib/kv/snapshot.h — the session snapshot format (docs/snapshots.md): encoding one
 * sequence's state (timeline tokens, last logits, the rows of its state-pool slot that its
 * prefix needs) and validating / applying an encoded image.
 *
 * The format is backend-independent: state rows are stored by position (rings, oldest
 * first) and by row index (row arrays, only the rows the prefix completed), as little-endian
 * f32 or packed FP8 / FP4 rows (version 2), whatever the pool's capacity (n_ctx), rewind
 * margin or device. A snapshot therefore
 * restores into a session of any n_ctx >= its length on any backend.
 *
 * Loading is two-phase: dsii_snap_validate checks every byte (magic, version, header and
 * section xxHash3 checksums, the model fingerprint, sizes, every layout entry against the
 * target pool, every token id) without touching anything; only then dsii_snap_apply writes
 * the slot. Only a device failure during apply can leave the slot half written (the caller
 * then forgets its timeline).
 */
#ifndef DSI_KV_SNAPSHOT_H
#define DSI_KV_SNAPSHOT_H

#include "base/base.h"
#include "kv/kv.h"

#include <stddef.h>
#include <stdint.h>

#define DSII_SNAP_VERSION 2u
#define DSII_SNAP_HEADER_BYTES 128u
#define DSII_SNAP_SECTION_HEAD 16u   /* tag, reserved, length */
#define DSII_SNAP_SECTION_TAIL 8u    /* xxh3-64 of head + payload */
/* Layout entries (u32 each). Version 1: kind, rows, ld, ratio, first, count (rows f32).
 * Version 2 appends the rows' stored form: format (DSIB_STATE_*), qcols, block — rows are
 * written in the saving pool's form (packed, lib/quant/statepack.h, or f32) and converted
 * to the loading pool's. */
#define DSII_SNAP_LAYOUT_ENTRY_V1 24u
#define DSII_SNAP_LAYOUT_ENTRY 36u
/* Oldest version this library reads (docs/snapshots.md "Versions"). */
#define DSII_SNAP_VERSION_MIN 1u
#define DSII_SNAP_N_SECTIONS 4u

/* Identity of the model + numerics a state belongs to. */
typedef struct dsii_snap_ident {
    uint8_t fingerprint[16];   /* dsii_snap_fingerprint of the model */
    uint32_t arch;             /* DSI_ARCH_* */
    uint32_t n_vocab;
    uint32_t state_flags;      /* session flags that change the state's numbers */
} dsii_snap_ident;

/* Output: returns 0 on success, anything else is a write failure. */
typedef int32_t (*dsii_snap_write_fn)(void *user_data, const void *data, size_t n);

typedef struct dsii_snap_src {
    dsii_snap_ident id;
    uint32_t margin;           /* the pool's rewind margin (informational) */
    const char *backend;       /* informational, at most 15 characters kept */
    const int32_t *tokens;     /* the prefix to save: tokens[0 .. n_tokens) */
    uint32_t n_tokens;
    const float *logits;       /* logits of tokens[n_tokens − 1], or NULL */
    dsii_kv_pool *pool;
    uint32_t slot;
    uint32_t cur;              /* tokens the slot holds now (>= n_tokens; the prefix must be
                                  within the pool's rewind margin of it) */
} dsii_snap_src;

/* The size dsii_snap_write will write for src (no device work). */
dsi_status dsii_snap_size(const dsii_snap_src *src, uint64_t *total, dsii_error *e);

/* Streams the snapshot of src to `write` (rows are downloaded component by component).
 * IO when the writer fails (the message says where); the slot is only read. */
dsi_status dsii_snap_write(const dsii_snap_src *src, dsii_snap_write_fn write, void *user_data,
                           uint64_t *bytes_written, dsii_error *e);

/* What the target accepts. */
typedef struct dsii_snap_target {
    dsii_snap_ident id;
    uint32_t n_ctx;
    const dsii_kv_layout *layout;
} dsii_snap_target;

/* Checks the first DSII_SNAP_HEADER_BYTES (magic, version, header checksum, identity,
 * length against the target) and returns the snapshot's total size. */
dsi_status dsii_snap_check_header(const uint8_t *h, size_t n, const dsii_snap_target *t,
                                  uint64_t *total, dsii_error *e);

/* A validated image (pointers into the caller's buffer). */
typedef struct dsii_snap_view {
    const uint8_t *buf;
    uint32_t n_tokens;
    uint32_t has_logits;
    uint32_t n_comps;
    const uint8_t *tokens;     /* n_tokens little-endian int32 */
    const uint8_t *logits;     /* n_vocab f32 or NULL */
    const uint8_t *layout;     /* n_comps entries of entry_bytes */
    const uint8_t *state;      /* the rows */
    uint32_t version;          /* format version of the image */
    uint32_t entry_bytes;      /* DSII_SNAP_LAYOUT_ENTRY(_V1) */
    uint64_t state_bytes;      /* bytes of the rows */
} dsii_snap_view;

/* Validates a complete image of `n` bytes against `t`; touches nothing. */
dsi_status dsii_snap_validate(const uint8_t *buf, size_t n, const dsii_snap_target *t,
                              int32_t n_vocab_check, dsii_snap_view *v, dsii_error *e);

/* Writes a validated image's rows into `slot` of `pool` (whose layout was the target's).
 * *exact_from: the shortest prefix an exact rewind can go back to afterwards (rings hold
 * the positions the snapshot had). */
dsi_status dsii_snap_apply(const dsii_snap_view *v, dsii_kv_pool *pool, uint32_t slot,
                           uint32_t *exact_from, dsii_error *e);

/* Reads the tokens of a validated image. */
void dsii_snap_tokens(const dsii_snap_view *v, int32_t *out);
void dsii_snap_logits(const dsii_snap_view *v, uint32_t n_vocab, float *out);

#endif /* DSI_KV_SNAPSHOT_H */
