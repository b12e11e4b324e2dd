#version 450
// Weight matmul / expert matmul / embedding rows for one weight type (WTYPE, a compile-time
// define). One work group (64 invocations) computes one output row for a tile of up to 4
// tokens (mode 0), one (output row, id row) pair (mode 1), or 64 columns of one gathered row
// (mode 2; mode 3 adds it); the NARROW variant's group of 8 computes up to 4 output rows
// (push 19) in modes 0 and 1. The caller splits big weights into windows (r_base/e_base
// ranges) that fit one storage binding (docs/vulkan.md).
// push: 0 mode, 1 w_skew, 2 nb1, 3 nb2, 4 K, 5 r_base, 6 r_count, 7 e_base, 8 e_count,
//       9 x_off, 10 ldx, 11 y_off, 12 ldy, 13 n, 14 R (rows per group), 15 Kg (x columns
//       per group), 16 ids_off (mode 3: step rows offset), 17 xdiv (mode 3: period), 18 row
//       chunk base (in groups), 19 output rows per group (NARROW, modes 0 and 1: 1 to 4)
#extension GL_EXT_control_flow_attributes : enable
#if defined(SUBGROUP) || defined(NARROW)
// Variant for devices with subgroup arithmetic in compute (DSIB_VK_NEED_SUBGROUP_ARITH):
// the 64-lane reductions use subgroupAdd and one shared-memory step instead of a 6-level
// tree. Per device the operation order is still fixed (same pipeline for every n).
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif
#ifdef NARROW
// Variant for CPU Vulkan devices (lavapipe; DSIB_VK_NEED_NARROW): a work group of 8 invocations,
// one subgroup (the host picks it only where the subgroup size is at least 8), so the
// reductions are one subgroupAdd with no barrier and no shared memory: on a CPU device a
// barrier suspends every SIMD slice of the group, which dominated the 64-wide groups' cost.
// In modes 0 and 1 a group computes up to 4 consecutive output rows (push 19, the host's
// choice), so that the rows share the loads of x and one group launch: on lavapipe that
// took 44 % off the matmuls' time. Each row's sum is computed exactly as alone (lane l adds the
// columns l, l + 8, ... in order, then one subgroupAdd), so the grouping never changes a
// bit; per device the operation order is fixed (same pipeline for every n).
#define WG 8u
#else
#define WG 64u
#endif
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer WB { uint d[]; } wb;
layout(std430, binding = 1) readonly buffer XB { uint d[]; } xb;
layout(std430, binding = 2) buffer YB { uint d[]; } yb;
layout(std430, binding = 3) readonly buffer IB { int d[]; } ib;
#include "common.glsl"
#include "wload.glsl"

#ifndef NARROW
shared float red[4 * 64];
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
#ifdef DQ_INIT
    // shared codebook of the IQ types (wload_ggml.glsl), before any return: 64 shares, each
    // call ends with a barrier (the same number of calls in every invocation)
    for (uint sh = tid; sh < 64u; sh += WG) DQ_INIT(sh);
#endif
    uint mode = pc.p[0], K = pc.p[4];
    if (mode >= 2u) {
        // 2: y[t] = row ids[t]; 3: y[t] += row (pos of step row t) mod p17 (add_rows_periodic)
        uint t = gl_WorkGroupID.y;
        int id = mode == 2u ? ib.d[pc.p[16] + t] : int(uint(ib.d[pc.p[16] + t * 4u]) % pc.p[17]);
        if (id < int(pc.p[5]) || id >= int(pc.p[5] + pc.p[6])) return;
        uint rb = pc.p[1] + uint(id - int(pc.p[5])) * pc.p[2];
        for (uint c = tid; c < 64u; c += WG) {
            uint i = (gl_WorkGroupID.x + pc.p[18]) * 64u + c;
            if (i >= K) return;
            uint yi = pc.p[11] + t * pc.p[12] + i;
            float v = dq(rb, i);
            if (mode == 3u) v += uintBitsToFloat(yb.d[yi]);
            yb.d[yi] = floatBitsToUint(v);
        }
        return;
    }
#ifdef NARROW
    // rows [r0, r0 + nrow) of the window; they read the same x columns (the host checked)
    uint rpg = clamp(pc.p[19], 1u, 4u);
    uint r0 = (gl_WorkGroupID.x + pc.p[18]) * rpg;
    uint nrow = min(rpg, pc.p[6] - r0);
    uint o0 = pc.p[5] + r0;
    uint xcol0 = (o0 / pc.p[14]) * pc.p[15];
    if (mode == 1u) {
        uint r = gl_WorkGroupID.y + gl_WorkGroupID.z * 65535u;
        if (r >= pc.p[13]) return;
        int e = ib.d[pc.p[16] + r];
        if (e < int(pc.p[7]) || e >= int(pc.p[7] + pc.p[8])) return;
        uint rb = pc.p[1] + uint(e - int(pc.p[7])) * pc.p[3] + r0 * pc.p[2];
        uint xo = pc.p[9] + (r / pc.p[17]) * pc.p[10] + xcol0;
        float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
        for (uint i = tid; i < K; i += WG) {
            float xv = uintBitsToFloat(xb.d[xo + i]);
            [[unroll]] for (uint q = 0u; q < 4u; q++)
                if (q < nrow) acc[q] += dq(rb + q * pc.p[2], i) * xv;
        }
        [[unroll]] for (uint q = 0u; q < 4u; q++) {
            float s = subgroupAdd(acc[q]);
            if (tid == 0u && q < nrow) yb.d[pc.p[11] + r * pc.p[12] + o0 + q] = floatBitsToUint(s);
        }
        return;
    }
    // mode 0: rows × a tile of up to 4 tokens
    uint t0 = gl_WorkGroupID.y * 4u;
    uint nt = min(4u, pc.p[13] - t0);
    uint rb = pc.p[1] + r0 * pc.p[2];
    uint xo = pc.p[9] + t0 * pc.p[10] + xcol0;
    float acc[16];
    [[unroll]] for (uint q = 0u; q < 16u; q++) acc[q] = 0.0;
    for (uint i = tid; i < K; i += WG) {
        float xv[4];
        [[unroll]] for (uint t = 0u; t < 4u; t++)
            xv[t] = t < nt ? uintBitsToFloat(xb.d[xo + t * pc.p[10] + i]) : 0.0;
        [[unroll]] for (uint q = 0u; q < 4u; q++) {
            if (q < nrow) {
                float w = dq(rb + q * pc.p[2], i);
                [[unroll]] for (uint t = 0u; t < 4u; t++)
                    if (t < nt) acc[q * 4u + t] += w * xv[t];
            }
        }
    }
    [[unroll]] for (uint q = 0u; q < 4u; q++)
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            float s = subgroupAdd(acc[q * 4u + t]);
            if (tid == 0u && q < nrow && t < nt)
                yb.d[pc.p[11] + (t0 + t) * pc.p[12] + o0 + q] = floatBitsToUint(s);
        }
#else
    uint orel = gl_WorkGroupID.x + pc.p[18];
    uint o = pc.p[5] + orel;
    uint xcol = (o / pc.p[14]) * pc.p[15];
    if (mode == 1u) {
        uint r = gl_WorkGroupID.y + gl_WorkGroupID.z * 65535u;
        if (r >= pc.p[13]) return;
        int e = ib.d[pc.p[16] + r];
        if (e < int(pc.p[7]) || e >= int(pc.p[7] + pc.p[8])) return;
        uint rb = pc.p[1] + uint(e - int(pc.p[7])) * pc.p[3] + orel * pc.p[2];
        uint xo = pc.p[9] + (r / pc.p[17]) * pc.p[10] + xcol;
        float acc = 0.0;
        for (uint i = tid; i < K; i += WG) acc += dq(rb, i) * uintBitsToFloat(xb.d[xo + i]);
#if defined(SUBGROUP)
        float sg = subgroupAdd(acc);
        if (subgroupElect()) red[gl_SubgroupID] = sg;
        barrier();
        if (tid == 0u) {
            float s = 0.0;
            for (uint i = 0u; i < gl_NumSubgroups; i++) s += red[i];
            yb.d[pc.p[11] + r * pc.p[12] + o] = floatBitsToUint(s);
        }
#else
        red[tid] = acc;
        barrier();
        [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
            if (tid < s) red[tid] += red[tid + s];
            barrier();
        }
        if (tid == 0u) yb.d[pc.p[11] + r * pc.p[12] + o] = floatBitsToUint(red[0]);
#endif
        return;
    }
    uint t0 = gl_WorkGroupID.y * 4u;
    uint n = pc.p[13];
    uint nt = min(4u, n - t0);
    uint rb = pc.p[1] + orel * pc.p[2];
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    uint xo = pc.p[9] + t0 * pc.p[10] + xcol;
    for (uint i = tid; i < K; i += WG) {
        float w = dq(rb, i);
        [[unroll]] for (uint t = 0u; t < 4u; t++)
            if (t < nt) acc[t] += w * uintBitsToFloat(xb.d[xo + t * pc.p[10] + i]);
    }
#if defined(SUBGROUP)
    [[unroll]] for (uint t = 0u; t < 4u; t++) {
        float sg = subgroupAdd(acc[t]);
        if (subgroupElect()) red[t * 64u + gl_SubgroupID] = sg;
    }
    barrier();
    if (tid < nt) {
        float s = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; i++) s += red[tid * 64u + i];
        yb.d[pc.p[11] + (t0 + tid) * pc.p[12] + o] = floatBitsToUint(s);
    }
#else
    [[unroll]] for (uint t = 0u; t < 4u; t++) red[t * 64u + tid] = acc[t];
    barrier();
    [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s)
            [[unroll]] for (uint t = 0u; t < 4u; t++) red[t * 64u + tid] += red[t * 64u + tid + s];
        barrier();
    }
    if (tid < nt) yb.d[pc.p[11] + (t0 + tid) * pc.p[12] + o] = floatBitsToUint(red[tid * 64u]);
#endif
#endif
}
