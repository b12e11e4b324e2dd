#version 450
// Engram gate (§4.6 steps 3–5) for one (token, stream) per work group, in place on X:
// a = Σ x², b = Σ key², c = Σ x·(qw·kw)·key; dot = c·rsqrt(a/D+eps)·rsqrt(b/D+eps)/√D;
// g = sigmoid(sign(dot)·sqrt(max(|dot|, 1e-6))); x += g·value.
// push: 0 x_off, 1 n_hc, 2 D, 3 kv_off, 4 ldkv, 5 qw type, 6 qw skew, 7 kw type, 8 kw skew,
//       9 eps, 10 row_base, 11 inv_sqrt_d
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer XB { uint d[]; } xb;
layout(std430, binding = 1) readonly buffer KV { uint d[]; } kv;
layout(std430, binding = 2) readonly buffer QW { uint d[]; } qw;
layout(std430, binding = 3) readonly buffer KW { uint d[]; } kw;
#include "common.glsl"
float ldw2(uint type, uint skew, uint i, bool k) {
    uint b = type == 0u ? skew + 4u * i : skew + 2u * i;
    uint w = k ? kw.d[b >> 2] : qw.d[b >> 2];
    if (type == 0u) return uintBitsToFloat(w);
    uint h = (w >> ((b & 2u) << 3)) & 0xFFFFu;
    return type == 1u ? unpackHalf2x16(h).x : uintBitsToFloat(h << 16);
}
shared float ra[64], rb[64], rc[64];
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y + pc.p[10];
    uint nh = pc.p[1], D = pc.p[2];
    uint xo = pc.p[0] + (t * nh + h) * D;
    uint ko = pc.p[3] + t * pc.p[4] + h * D;
    uint vo = pc.p[3] + t * pc.p[4] + nh * D;
    float a = 0.0, b = 0.0, c = 0.0;
    for (uint d = tid; d < D; d += 64u) {
        float x = uintBitsToFloat(xb.d[xo + d]), k = uintBitsToFloat(kv.d[ko + d]);
        float w = ldw2(pc.p[5], pc.p[6], h * D + d, false) * ldw2(pc.p[7], pc.p[8], h * D + d, true);
        a += x * x;
        b += k * k;
        c += x * w * k;
    }
    ra[tid] = a;
    rb[tid] = b;
    rc[tid] = c;
    barrier();
    [[unroll]] for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) {
            ra[tid] += ra[tid + s];
            rb[tid] += rb[tid + s];
            rc[tid] += rc[tid + s];
        }
        barrier();
    }
    float eps = PF(9);
    float rx = 1.0 / sqrt(ra[0] / float(D) + eps), rk = 1.0 / sqrt(rb[0] / float(D) + eps);
    float dot_ = rc[0] * rx * rk * PF(11);
    float mag = sqrt(max(abs(dot_), 1e-6));
    float sg = dot_ > 0.0 ? 1.0 : (dot_ < 0.0 ? -1.0 : 0.0);
    float g = 1.0 / (1.0 + exp(-(sg * mag)));
    for (uint d = tid; d < D; d += 64u)
        xb.d[xo + d] = floatBitsToUint(uintBitsToFloat(xb.d[xo + d]) + g * uintBitsToFloat(kv.d[vo + d]));
}
