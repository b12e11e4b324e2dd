#version 450
// RMSNorm of one row per work group: y = x·rsqrt(mean(x²)+eps)·w (§3 "RMSNorm").
// push: 0 x_off, 1 ldx, 2 y_off, 3 ldy, 4 width, 5 has_w, 6 w_type, 7 w_skew, 8 eps, 9 row_base
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XB { uint d[]; } xb;
layout(std430, binding = 1) buffer YB { uint d[]; } yb;
layout(std430, binding = 2) readonly buffer PB { uint d[]; } pb;
#include "common.glsl"
#include "pload.glsl"
shared float red[64];
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r = gl_WorkGroupID.x + pc.p[9];
    uint W = pc.p[4];
    uint xo = pc.p[0] + r * pc.p[1], yo = pc.p[2] + r * pc.p[3];
    float ss = 0.0;
    for (uint i = tid; i < W; i += 64u) {
        float v = uintBitsToFloat(xb.d[xo + i]);
        ss += v * v;
    }
    red[tid] = ss;
    barrier();
    [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float rs = 1.0 / sqrt(red[0] / float(W) + PF(8));
    for (uint i = tid; i < W; i += 64u) {
        float v = uintBitsToFloat(xb.d[xo + i]) * rs;
        if (pc.p[5] != 0u) v *= ldp(pc.p[6], pc.p[7], i);
        yb.d[yo + i] = floatBitsToUint(v);
    }
}
