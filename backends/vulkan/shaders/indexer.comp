#version 450
// Lightning-indexer scores and top-k for one token per work group (§3.4, §4.3, §10.2):
// score_c = Σ_h relu(q[h]·k_c)·w[h] (h ascending, dots in index order) into a scratch row;
// optional candidate blocks (V4.1 candidate source: block max, newest block +inf, best
// cand_k blocks) and candidate masking (V4.1 masked index sources); then rank selection
// (higher score first, ties: lower position first) written in ascending position order,
// the rest −1.
// push: 0 q_off, 1 ldq, 2 w_off, 3 ldw, 4 k_off, 5 heads, 6 hd, 7 pos0, 8 ratio, 9 topk,
//       10 idx_off, 11 scratch stride (words per token), 12 row_base, 13 has cand_in,
//       14 has cand_out, 15 cand_block, 16 cand_k, 17 cand_in off, 18 cand_out off,
//       19 v41 (no "all rows" shortcut needed, but harmless)
// scratch row: [0,nvis) scores, [nvis,2nvis) flags, [2nvis, 2nvis+nb) block scores,
//              [2nvis+nb, 2nvis+2nb) block flags
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer QB { uint d[]; } qb;
layout(std430, binding = 1) readonly buffer WB { uint d[]; } wb;
layout(std430, binding = 2) readonly buffer KB { uint d[]; } kb;
layout(std430, binding = 3) buffer IB { int d[]; } ib;
layout(std430, binding = 4) buffer SB { uint d[]; } sb;
layout(std430, binding = 5) readonly buffer CI { int d[]; } ci;
layout(std430, binding = 6) buffer CO { int d[]; } co;
#include "common.glsl"

void sync_() {
    memoryBarrierBuffer();
    barrier();
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.x + pc.p[12];
    int p = int(pc.p[7]) + int(t);
    uint nvis = uint((p + 1) / int(pc.p[8]));
    uint topk = pc.p[9];
    uint io = pc.p[10] + t * topk;
    bool cin = pc.p[13] != 0u, cout_ = pc.p[14] != 0u;
    uint cb = pc.p[15], ck = pc.p[16];
    if (!cin && !cout_ && nvis <= topk) {
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
    sync_();
    if (cout_) {
        uint nb = (nvis + cb - 1u) / cb;
        uint bo = so + 2u * nvis;
        for (uint b = tid; b < nb; b += 64u) {
            float m = uintBitsToFloat(0xff800000u); // -inf
            uint end = min((b + 1u) * cb, nvis);
            for (uint c = b * cb; c < end; c++) m = max(m, uintBitsToFloat(sb.d[so + c]));
            if (b == nb - 1u) m = uintBitsToFloat(0x7f800000u); // newest block: +inf
            sb.d[bo + b] = floatBitsToUint(m);
        }
        sync_();
        uint keep = min(ck, nb);
        for (uint b = tid; b < nb; b += 64u) {
            float m = uintBitsToFloat(sb.d[bo + b]);
            uint rank = 0u;
            for (uint b2 = 0u; b2 < nb && rank < keep; b2++) {
                float m2 = uintBitsToFloat(sb.d[bo + b2]);
                if (m2 > m || (m2 == m && b2 < b)) rank++;
            }
            sb.d[bo + nb + b] = (rank < keep && m > uintBitsToFloat(0xff800000u)) ? 1u : 0u;
        }
        sync_();
        if (tid == 0u) {
            uint oo = pc.p[18] + t * ck, k = 0u;
            for (uint b = 0u; b < nb && k < ck; b++)
                if (sb.d[bo + nb + b] != 0u) co.d[oo + k++] = int(b);
            for (; k < ck; k++) co.d[oo + k] = -1;
        }
    }
    // allowed flags (candidate masking) go into the flag half first
    for (uint c = tid; c < nvis; c += 64u) {
        uint ok = 1u;
        if (cin) {
            ok = 0u;
            int b = int(c / cb);
            uint cio = pc.p[17] + t * ck;
            for (uint j = 0u; j < ck; j++) {
                int v = ci.d[cio + j];
                if (v == b) { ok = 1u; break; }
                if (v < 0 || v > b) break;
            }
        }
        sb.d[so + nvis + c] = ok;
    }
    sync_();
    // rank among allowed candidates; a position is selected iff allowed and rank < topk.
    // Flags are rewritten after a barrier, so ranks first go to a private pass.
    for (uint c = tid; c < nvis; c += 64u) {
        uint flag = sb.d[so + nvis + c];
        if (flag == 0u) continue;
        float sc_ = uintBitsToFloat(sb.d[so + c]);
        uint rank = 0u;
        for (uint c2 = 0u; c2 < nvis && rank < topk; c2++) {
            if (sb.d[so + nvis + c2] == 0u) continue;
            float s2 = uintBitsToFloat(sb.d[so + c2]);
            if (s2 > sc_ || (s2 == sc_ && c2 < c)) rank++;
        }
        // encode: bit0 allowed, bit1 selected (written after everyone has read bit0)
        sb.d[so + nvis + c] = rank < topk ? 3u : 1u;
    }
    sync_();
    if (tid == 0u) {
        uint k = 0u;
        for (uint c = 0u; c < nvis && k < topk; c++)
            if (sb.d[so + nvis + c] == 3u) ib.d[io + k++] = int(c);
        for (; k < topk; k++) ib.d[io + k] = -1;
    }
}
