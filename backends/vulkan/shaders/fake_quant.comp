#version 450
// FP8 / FP4 fake-quant (model-spec §10.1) in place, one block per work group.
// push: 0 x_off, 1 ldx, 2 col0, 3 block, 4 recipe, 5 flags (1 = no rounding), 6 row_base
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer XB { uint d[]; } xb;
#include "common.glsl"
shared float red[64];

// Round to the e4m3 grid, ties to even (|q| <= 448 after the clamp).
float e4m3_rne(float q) {
    float a = abs(q);
    if (a == 0.0) return q;
    float step;
    if (a < 0.015625) step = 1.0 / 512.0; // subnormals: 2^-9 steps
    else {
        int e;
        frexp(a, e);                        // a = m·2^e, m in [0.5, 1)
        step = exp2(float(e - 4));          // 3 mantissa bits
    }
    float r = roundEven(a / step) * step;
    r = min(r, 448.0);
    return q < 0.0 ? -r : r;
}
// Round to the e2m1 grid {0,.5,1,1.5,2,3,4,6}, ties to even.
float e2m1_rne(float q) {
    float a = abs(q);
    float step = a < 2.0 ? 0.5 : (a < 4.0 ? 1.0 : 2.0);
    float r = min(roundEven(a / step) * step, 6.0);
    return q < 0.0 ? -r : (q == 0.0 ? q : r);
}
// Smallest power of two >= x (x > 0), as the UE8M0 scale (exponent clamped to [-127, 127]).
float pow2_ceil(float x) {
    int e;
    float m = frexp(x, e);                  // x = m·2^e
    int k = (m == 0.5) ? e - 1 : e;
    k = clamp(k, -127, 127);
    return k == -127 ? uintBitsToFloat(0x00400000u) : exp2(float(k));
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint blk = pc.p[3];
    uint r = gl_WorkGroupID.y + pc.p[6];
    uint base = pc.p[0] + r * pc.p[1] + pc.p[2] + gl_WorkGroupID.x * blk;
    float amax = 0.0;
    for (uint i = tid; i < blk; i += 64u) amax = max(amax, abs(uintBitsToFloat(xb.d[base + i])));
    red[tid] = amax;
    barrier();
    [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = max(red[tid], red[tid + s]);
        barrier();
    }
    amax = red[0];
    uint recipe = pc.p[4];
    float sc, lim;
    if (recipe == 0u) {
        amax = max(amax, 1e-4);
        sc = pow2_ceil(amax * (1.0 / 448.0));
        lim = 448.0;
    } else if (recipe == 1u) {
        amax = max(amax, 6.0 * exp2(-126.0));
        sc = pow2_ceil(amax * (1.0 / 6.0));
        lim = 6.0;
    } else {
        amax = max(amax, 6.0 * exp2(-9.0));
        sc = e4m3_rne(amax / 6.0);
        lim = 6.0;
    }
    bool rnd = (pc.p[5] & 1u) == 0u;
    for (uint i = tid; i < blk; i += 64u) {
        float q = clamp(uintBitsToFloat(xb.d[base + i]) / sc, -lim, lim);
        if (rnd) q = recipe == 0u ? e4m3_rne(q) : e2m1_rne(q);
        xb.d[base + i] = floatBitsToUint(q * sc);
    }
}
