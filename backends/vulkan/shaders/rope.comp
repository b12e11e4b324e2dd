#version 450
// Tail RoPE (§3.9): rotates the last n_rot dims of each head, interleaved pairs. cos/sin come
// from a table the host computed in double precision (same values as the CPU backend).
// push: 0 x_off, 1 ldx, 2 rows, 3 heads, 4 head_dim, 5 half (= n_rot/2), 6 row_base
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer XB { uint d[]; } xb;
layout(std430, binding = 1) readonly buffer TB { uint d[]; } tb;
#include "common.glsl"
void main() {
    uint half_ = pc.p[5];
    uint i = gl_GlobalInvocationID.x;          // pair
    uint h = gl_WorkGroupID.y;                 // head
    uint r = gl_WorkGroupID.z + pc.p[6];       // row
    if (i >= half_ || r >= pc.p[2]) return;
    uint base = pc.p[0] + r * pc.p[1] + h * pc.p[4] + (pc.p[4] - 2u * half_) + 2u * i;
    float cs = uintBitsToFloat(tb.d[(r * half_ + i) * 2u]);
    float sn = uintBitsToFloat(tb.d[(r * half_ + i) * 2u + 1u]);
    float x0 = uintBitsToFloat(xb.d[base]), x1 = uintBitsToFloat(xb.d[base + 1u]);
    xb.d[base] = floatBitsToUint(x0 * cs - x1 * sn);
    xb.d[base + 1u] = floatBitsToUint(x0 * sn + x1 * cs);
}
