/*
 * Shared helpers of the cross-backend tests: load the CPU backend and a GPU module, paired
 * buffers (same contents on both sides, guard bytes around every buffer), comparison by
 * normalised mean squared error.
 */
#ifndef DSI_BACKEND_TEST_UTIL_H
#define DSI_BACKEND_TEST_UTIL_H

#include "backends/backend.h"

#include <stddef.h>
#include <stdint.h>

#define BT_GUARD 256u       /* bytes of guard pattern before and after every buffer */
#define BT_GUARD_BYTE 0xA5u

typedef struct bt_side {
    const dsib_backend *be;
    dsib_instance *inst;
    dsib_stream *strm;   /* ops run here (sized by bt_stream_desc) */
    void *dl;
    dsib_host host;
} bt_side;

/* The shapes the test streams are created for (generous for every op test). */
void bt_stream_desc(dsib_stream_desc *d);

/* Loads the CPU backend (side 0) and module `name` (side 1). Returns 0 on success; 77 when the
 * module or its device is missing (tests/common/skip.h: reason printed and logged) unless
 * DSI_REQUIRE_VULKAN=1, then 1; 1 when a listed device cannot be used. */
int bt_open(bt_side sides[2], const char *name);
void bt_close(bt_side sides[2]);
/* Creates another instance of side 1's backend (e.g. after changing env knobs). */
int bt_reopen_gpu(bt_side *s);

/* A buffer allocated on both sides with the same initial contents. */
typedef struct bt_buf {
    dsib_buffer *b[2];
    uint64_t bytes; /* payload bytes (the guards are extra) */
} bt_buf;

/* Allocates and fills with `init` (NULL: the guard byte pattern everywhere). */
int bt_buf_new(bt_side sides[2], bt_buf *pb, const void *init, uint64_t bytes);
void bt_buf_free(bt_side sides[2], bt_buf *pb);
static inline dsib_view bt_view(const bt_buf *pb, int side, uint64_t byte_off) {
    dsib_view v = {pb->b[side], BT_GUARD + byte_off};
    return v;
}
/* A state view over a buffer: `slots` slots of `rows` rows of `ld` floats. */
static inline dsib_state bt_state(const bt_buf *pb, int side, uint32_t slots, uint32_t rows,
                                  uint32_t ld) {
    dsib_state s = {pb->b[side], BT_GUARD, slots, rows, ld, DSIB_STATE_F32, 0, 0, 0, 0};
    return s;
}
/* Step rows: `nseq` sequences, sequence i in slot slots[i] at positions pos0[i] ..
 * pos0[i]+count[i]-1, rows in order. Returns the total row count. */
int bt_rows_new(bt_side sides[2], bt_buf *pb, uint32_t nseq, const int32_t *slots,
                const int32_t *pos0, const int32_t *count);
/* Downloads the payload of side `side` into `out` (bytes) and checks the guards; returns
 * the number of guard bytes that changed. */
uint64_t bt_buf_read(bt_side sides[2], const bt_buf *pb, int side, void *out);

/* NMSE = Σ(a−b)² / Σ b², with b the CPU reference; *bad counts NaN/Inf positions where the
 * reference is finite (and vice versa). */
double bt_nmse(const float *a, const float *ref, size_t n, size_t *bad);

/* Deterministic random numbers. */
void bt_seed(uint64_t s);
float bt_uniform(float lo, float hi);
void bt_fill(float *x, size_t n, float lo, float hi);

/* Validation messages counted by the module (dsib_vulkan_debug_stats), or -1 if unknown. */
long long bt_validation_errors(const bt_side *gpu, char *last, size_t cap, int *enabled);

#endif
