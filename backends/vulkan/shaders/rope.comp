#version 450
// Tail RoPE (§3.9): rotates the last n_rot dims of each head, interleaved pairs, at the
// row's position from the step rows (+ delta, clamped at 0). cos/sin of p·f come from a
// per-(rope config) table the host computed in double precision, in three levels of 1024
// positions: p = p2·2^20 + p1·2^10 + p0, (c, s) = L0[p0] · L1[p1] · L2[p2] as complex
// products in f32 (a few ulp from the CPU backend's cos/sin of p·f).
// push: 0 x_off, 1 ldx, 2 n, 3 heads, 4 head_dim, 5 half (= n_rot/2), 6 row_base,
//       7 rows_off, 8 pos_delta (int), 9 inverse, 10 table_off
// table: [3][1024][half] (cos, sin) pairs
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer XB { uint d[]; } xb;
layout(std430, binding = 1) readonly buffer TB { uint d[]; } tb;
layout(std430, binding = 2) readonly buffer RB { int d[]; } rb;
#include "common.glsl"
vec2 tab(uint lvl, uint j, uint i, uint half_) {
    uint o = pc.p[10] + ((lvl * 1024u + j) * half_ + i) * 2u;
    return vec2(uintBitsToFloat(tb.d[o]), uintBitsToFloat(tb.d[o + 1u]));
}
void main() {
    uint half_ = pc.p[5];
    uint i = gl_GlobalInvocationID.x;          // pair
    uint h = gl_WorkGroupID.y;                 // head
    uint r = gl_WorkGroupID.z + pc.p[6];       // row
    if (i >= half_ || r >= pc.p[2]) return;
    int pos = rb.d[pc.p[7] + r * 4u] + int(pc.p[8]);
    uint p = uint(max(pos, 0));
    vec2 a = tab(0u, p & 1023u, i, half_);
    vec2 b = tab(1u, (p >> 10) & 1023u, i, half_);
    vec2 c = tab(2u, (p >> 20) & 1023u, i, half_);
    vec2 ab = vec2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
    float cs = ab.x * c.x - ab.y * c.y;
    float sn = ab.x * c.y + ab.y * c.x;
    if (pc.p[9] != 0u) sn = -sn;
    uint base = pc.p[0] + r * pc.p[1] + h * pc.p[4] + (pc.p[4] - 2u * half_) + 2u * i;
    float x0 = uintBitsToFloat(xb.d[base]), x1 = uintBitsToFloat(xb.d[base + 1u]);
    xb.d[base] = floatBitsToUint(x0 * cs - x1 * sn);
    xb.d[base + 1u] = floatBitsToUint(x0 * sn + x1 * cs);
}
