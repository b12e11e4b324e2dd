#version 450
// Lightning-indexer scores and top-k (§3.4, §10.2) for one token per work group:
// score_c = Σ_h relu(q[h]·k_c)·w[h] (h ascending, dots in index order) into a scratch row,
// then rank selection (higher score first, ties: lower position first) and the selected
// positions written in ascending order, the rest −1.
// push: 0 q_off, 1 ldq, 2 w_off, 3 ldw, 4 k_off, 5 heads, 6 hd, 7 pos0, 8 ratio, 9 topk,
//       10 idx_off, 11 scratch stride (floats per token), 12 row_base
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer QB { uint d[]; } qb;
layout(std430, binding = 1) readonly buffer WB { uint d[]; } wb;
layout(std430, binding = 2) readonly buffer KB { uint d[]; } kb;
layout(std430, binding = 3) buffer IB { int d[]; } ib;
layout(std430, binding = 4) buffer SB { uint d[]; } sb;
#include "common.glsl"
shared uint cnt[64];
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.x + pc.p[12];
    int p = int(pc.p[7]) + int(t);
    uint nvis = uint((p + 1) / int(pc.p[8]));
    uint topk = pc.p[9];
    uint io = pc.p[10] + t * topk;
    if (nvis <= topk) {
        for (uint i = tid; i < topk; i += 64u) ib.d[io + i] = i < nvis ? int(i) : -1;
        return;
    }
    uint heads = pc.p[5], hd = pc.p[6];
    uint qo = pc.p[0] + t * pc.p[1], wo = pc.p[2] + t * pc.p[3];
    uint so = t * pc.p[11];
    for (uint c = tid; c < nvis; c += 64u) {
        uint ko = pc.p[4] + c * hd;
        float s = 0.0;
        for (uint h = 0u; h < heads; h++) {
            float d = 0.0;
            for (uint i = 0u; i < hd; i++)
                d += uintBitsToFloat(qb.d[qo + h * hd + i]) * uintBitsToFloat(kb.d[ko + i]);
            d = max(d, 0.0);
            s += d * uintBitsToFloat(wb.d[wo + h]);
        }
        sb.d[so + c] = floatBitsToUint(s);
    }
    barrier();
    memoryBarrierBuffer();
    // rank of c = #candidates better than c; selected iff rank < topk. The flag goes into the
    // upper half of the scratch row.
    for (uint c = tid; c < nvis; c += 64u) {
        float sc_ = uintBitsToFloat(sb.d[so + c]);
        uint rank = 0u;
        for (uint c2 = 0u; c2 < nvis && rank < topk; c2++) {
            float s2 = uintBitsToFloat(sb.d[so + c2]);
            if (s2 > sc_ || (s2 == sc_ && c2 < c)) rank++;
        }
        sb.d[so + nvis + c] = rank < topk ? 1u : 0u;
    }
    barrier();
    memoryBarrierBuffer();
    if (tid == 0u) {
        uint k = 0u;
        for (uint c = 0u; c < nvis && k < topk; c++)
            if (sb.d[so + nvis + c] != 0u) ib.d[io + k++] = int(c);
        for (; k < topk; k++) ib.d[io + k] = -1;
    }
}
