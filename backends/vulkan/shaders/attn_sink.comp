#version 450
// Sink attention (§3.4) for one (row, head) per work group: visible rows in the fixed order
// compressed (top-k list or all) then window; online softmax with the sink logit in the
// denominator only; K = V = the row. hd <= 1024. Position, slot and the sequence's first
// row come from the step rows; state rows of the slot (ring / compressed rows, ld = hd).
// push: 0 q_off, 1 ldq, 2 H, 3 hd, 4 rows_off, 5 window, 6 ring_off, 7 ring rows per slot,
//       8 kv_off, 9 ldkv, 10 comp_ratio, 11 comp_off, 12 idx_off (or ~0u: all rows), 13 topk,
//       14 sink type, 15 sink skew, 16 scale, 17 out_off, 18 ldo, 19 row_base,
//       20 comp rows per slot, 21/22/23/24 comp format / quantised values / values per scale /
//       row bytes, 25/26/27/28 the same for the ring (format 0 = f32; packed: state.glsl)
#extension GL_EXT_control_flow_attributes : enable
#ifdef NARROW
// Variant for CPU Vulkan devices (DSIB_VK_NEED_NARROW, as matmul.comp): one subgroup of 8
// invocations per (row, head), each holding 16 values of q and o (hd <= 128; the host keeps
// the 64-wide shader for larger heads: a 64-value unrolled variant took minutes to compile on
// lavapipe), the dot product of each visible row reduced by one subgroupAdd: no barrier and
// no shared memory. What it saves on lavapipe is the 64-wide group's masked work (with
// hd = 128 each of its 8 SIMD slices runs 16 value steps, 2 of them live): 4x prefill there
// (docs/vulkan.md). Per device the operation order is fixed.
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#define WG 8u
#else
#define WG 64u
#endif
#define NK 16u
layout(local_size_x = WG) in;
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
#include "state.glsl"
DEF_ST_LOAD(ld_comp, cb)
DEF_ST_LOAD(ld_ring, rb)
#ifndef NARROW
shared float red[64];
#endif
float q_[NK], o_[NK];
float m_, den_;

// One visible row: its values v (each read once), then the dot product with q reduced over
// the group and the online-softmax update of o. The callers read v with the loader of the
// row's source (compressed, ring or this step's kv rows).
void accum(float v[NK]) {
    uint tid = gl_LocalInvocationID.x, hd = pc.p[3];
    float d = 0.0;
    [[unroll]] for (uint k = 0u; k < NK; k++) {
        uint i = tid + WG * k;
        if (i < hd) d += q_[k] * v[k];
    }
#ifdef NARROW
    float z = subgroupAdd(d) * PF(16);
#else
    red[tid] = d;
    barrier();
    [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float z = red[0] * PF(16);
    barrier();
#endif
    float mn = max(m_, z);
    float a = exp(m_ - mn), e = exp(z - mn);
    den_ = den_ * a + e;
    [[unroll]] for (uint k = 0u; k < NK; k++) {
        uint i = tid + WG * k;
        if (i < hd) o_[k] = o_[k] * a + e * v[k];
    }
    m_ = mn;
}

// A compressed row at byte off (row_comp), and a window row (row_win): the ring row at byte
// roff when ring, else the kv row at word koff. Each has one call site, so the shader holds
// two copies of accum (a CPU device compiles every call inlined: four copies took lavapipe
// about 16 s of CPU to compile), and row_comp runs only its own loader (a CPU device runs
// both sides of a branch under a mask).
void row_comp(uint off) {
    uint tid = gl_LocalInvocationID.x, hd = pc.p[3];
    float v[NK];
    [[unroll]] for (uint k = 0u; k < NK; k++) {
        uint i = tid + WG * k;
        v[k] = 0.0;
        if (i < hd) v[k] = ld_comp(pc.p[21], off, i, pc.p[22], pc.p[23]);
    }
    accum(v);
}
void row_win(bool ring, uint roff, uint koff) { // loads only from the row's source
    uint tid = gl_LocalInvocationID.x, hd = pc.p[3];
    float v[NK];
    [[unroll]] for (uint k = 0u; k < NK; k++) {
        uint i = tid + WG * k;
        v[k] = 0.0;
        if (i < hd) {
            if (ring) v[k] = ld_ring(pc.p[25], roff, i, pc.p[26], pc.p[27]);
            else v[k] = uintBitsToFloat(kb.d[koff + i]);
        }
    }
    accum(v);
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
    uint cbase = pc.p[11] * 4u + slot * pc.p[20] * pc.p[24]; // bytes
    uint qo = pc.p[0] + t * pc.p[1] + h * hd;
    [[unroll]] for (uint k = 0u; k < NK; k++) {
        uint i = tid + WG * k;
        q_[k] = i < hd ? uintBitsToFloat(qb.d[qo + i]) : 0.0;
        o_[k] = 0.0;
    }
    float sink = ldp(pc.p[14], pc.p[15], h);
    m_ = sink;
    den_ = 1.0;
    uint ratio = pc.p[10];
    if (ratio > 0u) {
        // the top-k list's rows in its order, or every compressed row so far
        bool listed = pc.p[12] != 0xFFFFFFFFu;
        uint io = listed ? pc.p[12] + t * pc.p[13] : 0u;
        int nc = listed ? int(pc.p[13]) : (p + 1) / int(ratio);
        for (int k = 0; k < nc; k++) {
            int c = k;
            if (listed) c = ib.d[io + uint(k)];
            if (c >= 0) row_comp(cbase + uint(c) * pc.p[24]);
        }
    }
    int w0 = max(0, p - int(pc.p[5]) + 1);
    for (int q = w0; q <= p; q++) {
        // only the address of the row's own source is formed (the other may not exist)
        bool ring = q < pos0;
        uint roff = 0u, koff = 0u;
        if (ring) roff = pc.p[6] * 4u + (slot * pc.p[7] + uint(q % int(pc.p[7]))) * pc.p[28];
        else koff = pc.p[8] + uint(first + q - pos0) * pc.p[9];
        row_win(ring, roff, koff);
    }
    uint oo = pc.p[17] + t * pc.p[18] + h * hd;
    [[unroll]] for (uint k = 0u; k < NK; k++) {
        uint i = tid + WG * k;
        if (i < hd) ob.d[oo + i] = floatBitsToUint(o_[k] / den_);
    }
}
