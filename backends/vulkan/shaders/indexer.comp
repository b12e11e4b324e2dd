#version 450
// Lightning-indexer scores and top-k for one token per work group (§3.4, §4.3, §10.2):
// score_c = Σ_h relu(q[h]·k_c)·w[h] (h ascending, dots in index order) into a scratch row;
// optional candidate blocks (V4.1 candidate source: block max, newest block +inf, best
// cand_k blocks) and candidate masking (V4.1 masked index sources); then rank selection
// (higher score first, ties: lower position first) written in ascending position order,
// the rest −1.
// push: 0 q_off, 1 ldq, 2 w_off, 3 ldw, 4 k_off, 5 heads, 6 hd, 7 rows_off, 8 ratio, 9 topk,
//       10 idx_off, 11 scratch stride (words per token), 12 row_base, 13 has cand_in,
//       14 has cand_out, 15 cand_block, 16 cand_k, 17 cand_in off, 18 cand_out off,
//       19 key rows per slot, 20 scratch off (words), 21/22/23/24 key format / quantised
//       values / values per scale / row bytes (format 0 = f32; packed: state.glsl)
// The row's position and slot come from the step rows; keys of the slot (hd values a row).
// scratch row: [0,nvis) scores, [nvis,2nvis) flags, [2nvis, 2nvis+nb) block scores,
//              [2nvis+nb, 2nvis+2nb) block flags
#ifdef NARROW
// Variant for CPU Vulkan devices (DSIB_VK_NEED_NARROW, as matmul.comp / attn_sink.comp): a
// work group of 8 invocations = one subgroup, so every count of the rank selection is one
// subgroupAdd instead of a 6-level shared-memory tree with a barrier per level (32 counts a
// selection: lavapipe suspends and resumes each of a 64-wide group's 8 slices at every
// barrier). The scores, counts and selections are the same (integer counts; each score is
// one lane's sum in the same order), so the indices are identical.
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#define WG 8u
#else
#define WG 64u
#endif
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer QB { uint d[]; } qb;
layout(std430, binding = 1) readonly buffer WB { uint d[]; } wb;
layout(std430, binding = 2) readonly buffer KB { uint d[]; } kb;
layout(std430, binding = 3) buffer IB { int d[]; } ib;
layout(std430, binding = 4) buffer SB { uint d[]; } sb;
layout(std430, binding = 5) readonly buffer CI { int d[]; } ci;
layout(std430, binding = 6) buffer CO { int d[]; } co;
layout(std430, binding = 7) readonly buffer RW { int d[]; } rw;
#include "common.glsl"
#include "state.glsl"
DEF_ST_LOAD(ld_key, kb)

void sync_() {
    memoryBarrierBuffer();
    barrier();
}

// Top-k without sorting: the k-th best score is found by a radix select on order-preserving
// 32-bit keys (32 counting passes over the row, O(rows) each), then positions are taken in
// ascending order: every key above the threshold, plus the lowest positions whose key
// equals it (ties: lower position first, §10.2).
shared uint cnt[64];
uint fkey(uint bits) { return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u); }
// #allowed c < N with key >= T (flags: allowed iff sb[fo + c] != 0; no flags: all)
uint count_ge(uint so, uint fo, bool flags, uint N, uint T) {
    uint tid = gl_LocalInvocationID.x, k = 0u;
    for (uint c = tid; c < N; c += WG) {
        if (flags && sb.d[fo + c] == 0u) continue;
        if (fkey(sb.d[so + c]) >= T) k++;
    }
#ifdef NARROW
    return subgroupAdd(k);
#else
    cnt[tid] = k;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) cnt[tid] += cnt[tid + s];
        barrier();
    }
    uint r = cnt[0];
    barrier();
    return r;
#endif
}
// Largest T with count_ge(T) >= k (0 if fewer than k allowed).
uint kth_key(uint so, uint fo, bool flags, uint N, uint k) {
    uint T = 0u;
    for (int b = 31; b >= 0; b--) {
        uint c = T | (1u << uint(b));
        if (count_ge(so, fo, flags, N, c) >= k) T = c;
    }
    return T;
}
// Thread 0: writes the selected positions ascending to dst (int buffer ib or co), −1 padded.
void take(uint so, uint fo, bool flags, uint N, uint k, uint T, bool to_co, uint oo) {
    uint gt = T == 0xFFFFFFFFu ? 0u : count_ge(so, fo, flags, N, T + 1u);
    if (gl_LocalInvocationID.x != 0u) return;
    uint need = k > gt ? k - gt : 0u, m = 0u;
    for (uint c = 0u; c < N && m < k; c++) {
        if (flags && sb.d[fo + c] == 0u) continue;
        uint key = fkey(sb.d[so + c]);
        bool sel = key > T;
        if (!sel && key == T && need > 0u) {
            sel = true;
            need--;
        }
        if (sel) {
            if (to_co) co.d[oo + m] = int(c);
            else ib.d[oo + m] = int(c);
            m++;
        }
    }
    for (; m < k; m++) {
        if (to_co) co.d[oo + m] = -1;
        else ib.d[oo + m] = -1;
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.x + pc.p[12];
    int p = rw.d[pc.p[7] + t * 4u];
    uint kslot = pc.p[4] * 4u + uint(rw.d[pc.p[7] + t * 4u + 1u]) * pc.p[19] * pc.p[24]; // bytes
    uint nvis = uint((p + 1) / int(pc.p[8]));
    uint topk = pc.p[9];
    uint io = pc.p[10] + t * topk;
    bool cin = pc.p[13] != 0u, cout_ = pc.p[14] != 0u;
    uint cb = pc.p[15], ck = pc.p[16];
    if (!cin && !cout_ && nvis <= topk) {
        for (uint i = tid; i < topk; i += WG) ib.d[io + i] = i < nvis ? int(i) : -1;
        return;
    }
    uint heads = pc.p[5], hd = pc.p[6];
    uint qo = pc.p[0] + t * pc.p[1], wo = pc.p[2] + t * pc.p[3];
    uint so = pc.p[20] + t * pc.p[11];
    for (uint c = tid; c < nvis; c += WG) {
        uint ko = kslot + c * pc.p[24];
        uint kf = pc.p[21], kq = pc.p[22], kbk = pc.p[23];
        float s = 0.0;
        for (uint h = 0u; h < heads; h++) {
            float d = 0.0;
            for (uint i = 0u; i < hd; i++)
                d += uintBitsToFloat(qb.d[qo + h * hd + i]) * ld_key(kf, ko, i, kq, kbk);
            d = max(d, 0.0);
            s += d * uintBitsToFloat(wb.d[wo + h]);
        }
        sb.d[so + c] = floatBitsToUint(s);
    }
    sync_();
    if (cout_) {
        uint nb = (nvis + cb - 1u) / cb;
        uint bo = so + 2u * nvis;
        for (uint b = tid; b < nb; b += WG) {
            float m = uintBitsToFloat(0xff800000u); // -inf
            uint end = min((b + 1u) * cb, nvis);
            for (uint c = b * cb; c < end; c++) m = max(m, uintBitsToFloat(sb.d[so + c]));
            if (b == nb - 1u) m = uintBitsToFloat(0x7f800000u); // newest block: +inf
            sb.d[bo + b] = floatBitsToUint(m);
        }
        sync_();
        // allowed blocks: score > −inf
        for (uint b = tid; b < nb; b += WG)
            sb.d[bo + nb + b] = uintBitsToFloat(sb.d[bo + b]) > uintBitsToFloat(0xff800000u) ? 1u : 0u;
        sync_();
        uint T = kth_key(bo, bo + nb, true, nb, ck);
        take(bo, bo + nb, true, nb, ck, T, true, pc.p[18] + t * ck);
        sync_();
    }
    // allowed flags (candidate masking) go into the flag half first
    for (uint c = tid; c < nvis; c += WG) {
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
    uint T = kth_key(so, so + nvis, cin, nvis, topk);
    take(so, so + nvis, cin, nvis, topk, T, false, io);
}
