#version 450
// mHC coefficients (§3.3, §3.6) for one token per work group. The fn·flat(X) products were
// written into coef by a matmul dispatch before this one; here: RMS factor of flat(X), then
// (BLOCK) pre/post sigmoids and the Sinkhorn comb, or (HEAD) pre only. Same operation order
// as the CPU backend.
// push: 0 x_off, 1 n_hc, 2 D, 3 c_off, 4 ldc, 5 mode, 6 rms_eps, 7 hc_eps, 8 iters,
//       9 scale type, 10 scale skew, 11 base type, 12 base skew, 13 row_base
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XB { uint d[]; } xb;
layout(std430, binding = 1) buffer CB { uint d[]; } cb;
layout(std430, binding = 2) readonly buffer SB { uint d[]; } sb;
layout(std430, binding = 3) readonly buffer BB { uint d[]; } bsb;
#include "common.glsl"
float ldpx(uint type, uint skew, uint i, bool base) {
    uint b = type == 0u ? skew + 4u * i : skew + 2u * i;
    uint w = base ? bsb.d[b >> 2] : sb.d[b >> 2];
    if (type == 0u) return uintBitsToFloat(w);
    uint h = (w >> ((b & 2u) << 3)) & 0xFFFFu;
    return type == 1u ? unpackHalf2x16(h).x : uintBitsToFloat(h << 16);
}
float sigm(float x) { return 1.0 / (1.0 + exp(-x)); }
shared float red[64];
void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.x + pc.p[13];
    uint nh = pc.p[1], D = pc.p[2], W = nh * D;
    uint xo = pc.p[0] + t * W;
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
    if (tid != 0u) return;
    float rs = 1.0 / sqrt(red[0] / float(W) + PF(6));
    float eps = PF(7);
    uint co = pc.p[3] + t * pc.p[4];
    uint st = pc.p[9], ss_ = pc.p[10], bt = pc.p[11], bs = pc.p[12];
    float s0 = ldpx(st, ss_, 0u, false);
    if (pc.p[5] == 1u) {
        for (uint h = 0u; h < nh; h++) {
            float m = uintBitsToFloat(cb.d[co + h]) * rs;
            cb.d[co + h] = floatBitsToUint(sigm(m * s0 + ldpx(bt, bs, h, true)) + eps);
        }
        return;
    }
    float s1 = ldpx(st, ss_, 1u, false), s2 = ldpx(st, ss_, 2u, false);
    for (uint h = 0u; h < nh; h++) {
        float m0 = uintBitsToFloat(cb.d[co + h]) * rs;
        float m1 = uintBitsToFloat(cb.d[co + nh + h]) * rs;
        cb.d[co + h] = floatBitsToUint(sigm(m0 * s0 + ldpx(bt, bs, h, true)) + eps);
        cb.d[co + nh + h] = floatBitsToUint(2.0 * sigm(m1 * s1 + ldpx(bt, bs, nh + h, true)));
    }
    float C[256];
    uint cc = co + 2u * nh;
    for (uint i = 0u; i < nh * nh; i++)
        C[i] = (uintBitsToFloat(cb.d[cc + i]) * rs) * s2 + ldpx(bt, bs, 2u * nh + i, true);
    for (uint i = 0u; i < nh; i++) {
        float mx = C[i * nh];
        for (uint j = 1u; j < nh; j++) mx = max(mx, C[i * nh + j]);
        float s = 0.0;
        for (uint j = 0u; j < nh; j++) {
            C[i * nh + j] = exp(C[i * nh + j] - mx);
            s += C[i * nh + j];
        }
        for (uint j = 0u; j < nh; j++) C[i * nh + j] = C[i * nh + j] / s + eps;
    }
    uint iters = pc.p[8];
    for (uint it = 0u; it < iters; it++) {
        if (it > 0u)
            for (uint i = 0u; i < nh; i++) {
                float s = 0.0;
                for (uint j = 0u; j < nh; j++) s += C[i * nh + j];
                s += eps;
                for (uint j = 0u; j < nh; j++) C[i * nh + j] /= s;
            }
        for (uint j = 0u; j < nh; j++) {
            float s = 0.0;
            for (uint i = 0u; i < nh; i++) s += C[i * nh + j];
            s += eps;
            for (uint i = 0u; i < nh; i++) C[i * nh + j] /= s;
        }
    }
    for (uint i = 0u; i < nh * nh; i++) cb.d[cc + i] = floatBitsToUint(C[i]);
}
