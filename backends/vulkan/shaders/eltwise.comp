#version 450
// Element-wise ops; one invocation per (row, column) — or per (row, d) for the mHC modes.
// Work group: 64 columns of one row (row = WorkGroupID.y + row_base).
// push: 0 mode, 1 rows, 2 width, 3 a_off, 4 lda, 5 b_off, 6 ldb, 7 y_off, 8 ldy, 9 f (scale /
//       limit), 10 n_hc, 11 c_off, 12 ldc, 13 row_base, 14 k, 15 d_off, 16 ldd
// modes: 0 add y=a+b; 1 scale a*=f; 2 swiglu y=silu(min(a,f))·clamp(b,±f);
//        3 hc_expand y[t][h][:]=a[t][:]; 4 hc_collapse y[t]=Σ_h c[t][h]·a[t][h];
//        5 hc_post d[t][j]=c[t][n_hc+j]·a[t]+Σ_i c[t][2n_hc+i·n_hc+j]·b[t][i] (d may be b);
//        6 moe swiglu y=swiglu(a,b)·c[t] (c = per-row weight); 7 sum over k: y[t]=Σ_j a[t·k+j]
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer AB { uint d[]; } ab;
layout(std430, binding = 1) buffer BB { uint d[]; } bb;
layout(std430, binding = 2) buffer YB { uint d[]; } yb;
layout(std430, binding = 3) buffer CB { uint d[]; } cb;
layout(std430, binding = 4) buffer DB { uint d[]; } db;
#include "common.glsl"
#define A(i) uintBitsToFloat(ab.d[i])
#define B(i) uintBitsToFloat(bb.d[i])
#define C(i) uintBitsToFloat(cb.d[i])

float silu(float x) { return x / (1.0 + exp(-x)); }
float swiglu(float g, float u, float lim) {
    if (lim > 0.0) {
        g = min(g, lim);
        u = clamp(u, -lim, lim);
    }
    return silu(g) * u;
}

void main() {
    uint mode = pc.p[0];
    uint r = gl_WorkGroupID.y + pc.p[13];
    uint c = gl_GlobalInvocationID.x;
    if (r >= pc.p[1] || c >= pc.p[2]) return;
    uint W = pc.p[2];
    if (mode == 0u) {
        yb.d[pc.p[7] + r * pc.p[8] + c] = floatBitsToUint(A(pc.p[3] + r * pc.p[4] + c) + B(pc.p[5] + r * pc.p[6] + c));
    } else if (mode == 1u) {
        uint i = pc.p[3] + r * pc.p[4] + c;
        ab.d[i] = floatBitsToUint(A(i) * PF(9));
    } else if (mode == 2u) {
        yb.d[pc.p[7] + r * pc.p[8] + c] = floatBitsToUint(swiglu(A(pc.p[3] + r * pc.p[4] + c), B(pc.p[5] + r * pc.p[6] + c), PF(9)));
    } else if (mode == 3u) {
        uint v = ab.d[pc.p[3] + r * pc.p[4] + c];
        uint nh = pc.p[10];
        for (uint h = 0u; h < nh; h++) yb.d[pc.p[7] + (r * nh + h) * W + c] = v;
    } else if (mode == 4u) {
        uint nh = pc.p[10];
        uint co = pc.p[11] + r * pc.p[12], xo = pc.p[3] + r * nh * W + c;
        float a = C(co) * A(xo);
        for (uint h = 1u; h < nh; h++) a += C(co + h) * A(xo + h * W);
        yb.d[pc.p[7] + r * pc.p[8] + c] = floatBitsToUint(a);
    } else if (mode == 5u) {
        uint nh = pc.p[10];
        uint co = pc.p[11] + r * pc.p[12];
        float f = A(pc.p[3] + r * pc.p[4] + c);
        float rv[16];
        uint ro = pc.p[5] + r * nh * W + c;
        for (uint i = 0u; i < nh; i++) rv[i] = B(ro + i * W);
        // every invocation has read its R values before any writes its outputs only for the
        // same (t, d): Xo may alias R
        for (uint j = 0u; j < nh; j++) {
            float a = C(co + nh + j) * f;
            for (uint i = 0u; i < nh; i++) a += C(co + 2u * nh + i * nh + j) * rv[i];
            db.d[pc.p[15] + r * nh * W + j * W + c] = floatBitsToUint(a);
        }
    } else if (mode == 6u) {
        float v = swiglu(A(pc.p[3] + r * pc.p[4] + c), B(pc.p[5] + r * pc.p[6] + c), PF(9));
        yb.d[pc.p[7] + r * pc.p[8] + c] = floatBitsToUint(v * C(pc.p[11] + r));
    } else if (mode == 7u) {
        uint k = pc.p[14];
        uint ao = pc.p[3] + r * k * pc.p[4] + c;
        float a = A(ao);
        for (uint j = 1u; j < k; j++) a += A(ao + j * pc.p[4]);
        yb.d[pc.p[7] + r * pc.p[8] + c] = floatBitsToUint(a);
    }
}
