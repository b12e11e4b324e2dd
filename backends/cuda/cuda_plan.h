/*
 * backends/cuda/cuda_plan.h — the host-side planning of the CUDA backend in plain C++ (no
 * CUDA API, no device code): launch geometry of every kernel family, the stream workspace
 * layout derived from a dsib_stream_desc, the op / weight-type support table, and the
 * allocation padding. The module (cuda_backend.cu and the kernel files) uses exactly these
 * functions, and tests/gpu/test_cuda_host.cc runs them on the CPU in CI, where no device and
 * possibly no nvcc exist.
 */
#ifndef DSIC_CUDA_PLAN_H
#define DSIC_CUDA_PLAN_H

#include "backends/backend.h"

#include <stdint.h>

namespace dsic {

/* ---- launch geometry ------------------------------------------------------------------- */

struct Dim3 {
    uint32_t x, y, z;
};

/* Weight matmul (matmul, matmul_grouped, hc_mix's projection): one warp per output row, MM_WARPS
 * warps per block, MM_NT tokens per warp (each weight chunk is decoded once for MM_NT tokens).
 * grid.x = row blocks over all groups' rows, grid.y = token tiles. */
enum { MM_WARPS = 4, MM_NT = 8, MM_THREADS = 32 * MM_WARPS };
inline Dim3 mm_grid(uint64_t rows_total, uint32_t n) {
    Dim3 d;
    d.x = (uint32_t)((rows_total + MM_WARPS - 1) / MM_WARPS);
    d.y = (n + MM_NT - 1) / MM_NT;
    d.z = 1;
    return d;
}

/* Routed experts: grid.x = groups (at most min(E, slots): each group is one selected
 * expert), grid.y = row blocks of the expert's output rows; every block loops over the
 * group's slots in tiles of MM_NT. */
inline uint32_t moe_max_groups(uint32_t E, uint64_t slots) {
    return (uint32_t)(slots < (uint64_t)E ? slots : (uint64_t)E);
}
inline Dim3 moe_grid(uint32_t E, uint64_t slots, uint32_t rows) {
    Dim3 d;
    d.x = moe_max_groups(E, slots);
    d.y = (rows + MM_WARPS - 1) / MM_WARPS;
    d.z = 1;
    return d;
}

/* Elementwise kernels: 256 threads, a grid-stride loop over at most 65535·… blocks. */
enum { EW_THREADS = 256 };
inline uint32_t ew_blocks(uint64_t elems) {
    uint64_t b = (elems + EW_THREADS - 1) / EW_THREADS;
    if (b == 0) b = 1;
    return b > 65535u * 16u ? 65535u * 16u : (uint32_t)b;
}

/* Row-reduction kernels (rms_norm, hc_mix coefficients, engram gate, attention, indexer):
 * one block of RED_THREADS per row (or row × head). */
enum { RED_THREADS = 256 };

/* Attention: rows of one (token, head) are scored in chunks of ATT_CHUNK (one per thread). */
enum { ATT_THREADS = 128, ATT_CHUNK = ATT_THREADS };

/* ---- workspace --------------------------------------------------------------------------- */

/* The stream workspace (bytes), laid out from a dsib_stream_desc; every op uses it from
 * offset 0 (ops on one stream run in order, so they share it):
 *  - the indexers: per launch of `idx_rows` rows, scores [idx_rows][max_positions] f32 and
 *    block keys [idx_rows][max_positions] u32 (the op launches ceil(n / idx_rows) times);
 *  - moe_experts: the group tables (int32: n_groups, expert of each group [E], offsets
 *    [E+1], slot list [slots], counters [E]) and two [slots][max_width] f32 arrays: A holds
 *    the gate rows then the activations, B the up rows then the expert outputs. */
struct WsPlan {
    uint32_t idx_rows;           /* indexer rows per launch */
    uint64_t idx_scores, idx_keys; /* offsets */
    uint64_t idx_bytes;          /* bytes of the indexer part */
    uint64_t moe_groups;         /* offset of the int32 group tables */
    uint64_t moe_h, moe_y;       /* offsets of H and Y */
    uint64_t moe_bytes;
    uint64_t total;
};

inline uint64_t al256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

/* Indexer budget: at most this many bytes for one launch's scores and keys. */
enum { IDX_WS_BUDGET_MIB = 64 };

inline WsPlan ws_plan(const dsib_stream_desc *d) {
    WsPlan p = {};
    uint64_t rows = d->max_rows ? d->max_rows : 1;
    uint64_t pos = d->max_positions ? d->max_positions : 1;
    uint64_t per_row = 8 * pos; /* score + key */
    uint64_t r = ((uint64_t)IDX_WS_BUDGET_MIB << 20) / per_row;
    if (r < 1) r = 1;
    if (r > rows) r = rows;
    if (r > 64) r = 64;
    p.idx_rows = (uint32_t)r;
    p.idx_scores = 0;
    p.idx_keys = al256(4 * r * pos);
    p.idx_bytes = p.idx_keys + al256(4 * r * pos);
    uint64_t E = d->max_experts, k = d->max_experts_used, w = d->max_width;
    uint64_t slots = rows * k;
    if (E && k && w) {
        p.moe_groups = 0;
        p.moe_h = al256(4 * (1 + E + (E + 1) + slots + E));
        p.moe_y = p.moe_h + al256(4 * slots * w);
        p.moe_bytes = p.moe_y + al256(4 * slots * w);
    }
    p.total = p.idx_bytes > p.moe_bytes ? p.idx_bytes : p.moe_bytes;
    if (p.total < 256) p.total = 256;
    return p;
}

/* Device allocations are padded to whole 256-byte units plus one unit, so that a kernel's
 * aligned word load that straddles the end of a weight row stays inside the allocation. */
inline uint64_t alloc_bytes(uint64_t size) { return al256(size ? size : 1) + 256; }

/* ---- what the module computes -------------------------------------------------------------- */

/* Weight types decoded by the matmul / get_rows / moe kernels (cuda_math.h dq_elem). */
inline int plan_type_ok(int32_t t) {
    switch (t) {
    case DSI_TYPE_F32: case DSI_TYPE_F16: case DSI_TYPE_BF16: case DSI_TYPE_Q8_0:
    case DSI_TYPE_Q4_K: case DSI_TYPE_Q2_K: case DSI_TYPE_MXFP4:
    case DSI_TYPE_FP8_E4M3_B128: case DSI_TYPE_FP8_E4M3_B32: case DSI_TYPE_FP8_E4M3_R32:
    case DSI_TYPE_IQ2_XXS:
        return 1;
    default:
        return 0;
    }
}

/* supports_op: every op is implemented; the weight-decoding ops decline the types above do
 * not list (the core then reports the model as unsupported on "cuda" at session creation). */
inline int32_t plan_supports_op(uint32_t op, int32_t type) {
    if (op >= DSIB_OP_COUNT) return 0;
    if (type < 0) return 1;
    switch (op) {
    case DSIB_OP_MATMUL:
    case DSIB_OP_MATMUL_GROUPED:
    case DSIB_OP_GET_ROWS:
    case DSIB_OP_MOE_EXPERTS:
    case DSIB_OP_ADD_ROWS_PERIODIC:
    case DSIB_OP_HC_MIX:
        return plan_type_ok(type);
    case DSIB_OP_MOE_ROUTE: /* bias f32 / tid2eid i32 */
        return type == DSI_TYPE_F32 || type == DSI_TYPE_F16 || type == DSI_TYPE_BF16 ||
               type == DSI_TYPE_I32;
    default:
        return plan_type_ok(type);
    }
}

} // namespace dsic

#endif /* DSIC_CUDA_PLAN_H */
