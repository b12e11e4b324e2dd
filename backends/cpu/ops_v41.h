/*
 * backends/cpu/ops_v41.h — the V4.1 ops of the CPU backend (ops_v41.c), spliced into the op
 * table of ops.c through DSIB_CPU_OPS_V41_INIT. Contracts: backends/backend.h, "V4.1 ops".
 */
#ifndef DSIB_CPU_OPS_V41_H
#define DSIB_CPU_OPS_V41_H

#include "backends/backend.h"

dsi_status dsib_cpu_indexer_topk_v41(dsib_stream *strm, dsib_view q, uint32_t ldq,
                                     dsib_view w, uint32_t ldw, const dsib_state *keys,
                                     uint32_t heads, uint32_t hd, dsib_view rows, uint32_t n,
                                     uint32_t ratio, uint32_t topk, dsib_view idx,
                                     dsib_view cand_in, dsib_view cand_out, uint32_t cand_block,
                                     uint32_t cand_k);
dsi_status dsib_cpu_engram_gate(dsib_stream *strm, dsib_view X, uint32_t n, uint32_t n_hc,
                                uint32_t D, dsib_view kv, uint32_t ldkv, const dsib_weight *qw,
                                const dsib_weight *kw, float eps);

/* Tests: the indexer scores Σ_h relu(q_h · k_c) · w_h of keys [c0, c1) of one slot, by the
 * path the op takes (the AVX-512 one where the CPU and the key format allow it; the scalar
 * one under dsib_cpu_ops_force_isa(DSIB_ISA_SCALAR)). */
void dsib_cpu_indexer_v41_scores(const float *q, const float *w, const dsib_state *keys,
                                 uint32_t slot, uint32_t heads, uint32_t hd, uint32_t c0,
                                 uint32_t c1, float *score);

/* V4's indexer scan (backends/cpu/ops.c: dot_fixed per key and head, relu d < 0 ? 0 : d,
 * heads ascending) of keys [c0, c1) of one slot (slot_keys = its row 0) on the AVX-512 path
 * for packed E2M1 / UE8M0 keys: the same bits as the scalar loop. Returns 0 (nothing
 * written) where that path cannot run (CPU, format). */
int dsib_cpu_indexer_v4_scan(const dsib_state *keys, uint32_t heads, uint32_t hd, const float *q,
                              const float *w, const uint8_t *slot_keys, uint32_t c0, uint32_t c1,
                              float *score);

#define DSIB_CPU_OPS_V41_INIT                                                                  \
    .indexer_topk_v41 = dsib_cpu_indexer_topk_v41, .engram_gate = dsib_cpu_engram_gate,

#endif /* DSIB_CPU_OPS_V41_H */
