#version 450
// Normalised Walsh–Hadamard transform of one `size` chunk per work group (same butterfly
// order as the CPU backend, so results are identical). size <= 1024.
// push: 0 x_off, 1 ldx, 2 size, 3 scale (f32), 4 row_base
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer XB { uint d[]; } xb;
#include "common.glsl"
shared float v[1024];
void main() {
    uint tid = gl_LocalInvocationID.x, n = pc.p[2];
    uint base = pc.p[0] + (gl_WorkGroupID.y + pc.p[4]) * pc.p[1] + gl_WorkGroupID.x * n;
    for (uint i = tid; i < n; i += 64u) v[i] = uintBitsToFloat(xb.d[base + i]);
    barrier();
    for (uint h = 1u; h < n; h <<= 1) {
        for (uint p = tid; p < n / 2u; p += 64u) {
            uint i = (p / h) * 2u * h + (p % h);
            float a = v[i], b = v[i + h];
            v[i] = a + b;
            v[i + h] = a - b;
        }
        barrier();
    }
    for (uint i = tid; i < n; i += 64u) xb.d[base + i] = floatBitsToUint(v[i] * PF(3));
}
