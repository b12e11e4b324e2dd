#version 450
// Sink attention (§3.4) for one (row, head) per work group: visible rows in the fixed order
// compressed (top-k list or all) then window; online softmax with the sink logit in the
// denominator only; K = V = the row. hd <= 1024. Position, slot and the sequence's first
// row come from the step rows; state rows of the slot (ring / compressed rows, ld = hd).
// push: 0 q_off, 1 ldq, 2 H, 3 hd, 4 rows_off, 5 window, 6 ring_off, 7 ring rows per slot,
//       8 kv_off, 9 ldkv, 10 comp_ratio, 11 comp_off, 12 idx_off (or ~0u: all rows), 13 topk,
//       14 sink type, 15 sink skew, 16 scale, 17 out_off, 18 ldo, 19 row_base,
//       20 comp rows per slot
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer QB { uint d[]; } qb;
layout(std430, binding = 1) readonly buffer RB { uint d[]; } rb;
layout(std430, binding = 2) readonly buffer KB { uint d[]; } kb;
layout(std430, binding = 3) readonly buffer CB { uint d[]; } cb;
layout(std430, binding = 4) readonly buffer IB { int d[]; } ib;
layout(std430, binding = 5) readonly buffer PB { uint d[]; } pb;
layout(std430, binding = 6) buffer OB { uint d[]; } ob;
layout(std430, binding = 7) readonly buffer RW { int d[]; } rw;
#include "common.glsl"
#include "pload.glsl"
shared float red[64];
float q_[16], o_[16];
float m_, den_;

// src: 0 comp, 1 ring, 2 kv
void row(uint src, uint off) {
    uint tid = gl_LocalInvocationID.x, hd = pc.p[3];
    float d = 0.0;
    [[unroll]] for (uint k = 0u; k < 16u; k++) {
        uint i = tid + 64u * k;
        if (i < hd) {
            uint w = src == 0u ? cb.d[off + i] : (src == 1u ? rb.d[off + i] : kb.d[off + i]);
            d += q_[k] * uintBitsToFloat(w);
        }
    }
    red[tid] = d;
    barrier();
    [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float z = red[0] * PF(16);
    barrier();
    float mn = max(m_, z);
    float a = exp(m_ - mn), e = exp(z - mn);
    den_ = den_ * a + e;
    [[unroll]] for (uint k = 0u; k < 16u; k++) {
        uint i = tid + 64u * k;
        if (i < hd) {
            uint w = src == 0u ? cb.d[off + i] : (src == 1u ? rb.d[off + i] : kb.d[off + i]);
            o_[k] = o_[k] * a + e * uintBitsToFloat(w);
        }
    }
    m_ = mn;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint H = pc.p[2], hd = pc.p[3];
    uint t = gl_WorkGroupID.y + pc.p[19], h = gl_WorkGroupID.x;
    uint ro = pc.p[4] + t * 4u;
    int p = rw.d[ro];
    uint slot = uint(rw.d[ro + 1u]);
    int first = rw.d[ro + 2u];
    int pos0 = rw.d[pc.p[4] + uint(first) * 4u];
    uint cbase = pc.p[11] + slot * pc.p[20] * hd;
    uint qo = pc.p[0] + t * pc.p[1] + h * hd;
    [[unroll]] for (uint k = 0u; k < 16u; k++) {
        uint i = tid + 64u * k;
        q_[k] = i < hd ? uintBitsToFloat(qb.d[qo + i]) : 0.0;
        o_[k] = 0.0;
    }
    float sink = ldp(pc.p[14], pc.p[15], h);
    m_ = sink;
    den_ = 1.0;
    uint ratio = pc.p[10];
    if (ratio > 0u) {
        if (pc.p[12] != 0xFFFFFFFFu) {
            uint io = pc.p[12] + t * pc.p[13];
            for (uint k = 0u; k < pc.p[13]; k++) {
                int c = ib.d[io + k];
                if (c >= 0) row(0u, cbase + uint(c) * hd);
            }
        } else {
            int nv = (p + 1) / int(ratio);
            for (int c = 0; c < nv; c++) row(0u, cbase + uint(c) * hd);
        }
    }
    int w0 = max(0, p - int(pc.p[5]) + 1);
    for (int q = w0; q <= p; q++) {
        if (q < pos0) row(1u, pc.p[6] + (slot * pc.p[7] + uint(q % int(pc.p[7]))) * hd);
        else row(2u, pc.p[8] + uint(first + q - pos0) * pc.p[9]);
    }
    uint oo = pc.p[17] + t * pc.p[18] + h * hd;
    [[unroll]] for (uint k = 0u; k < 16u; k++) {
        uint i = tid + 64u * k;
        if (i < hd) ob.d[oo + i] = floatBitsToUint(o_[k] / den_);
    }
}
