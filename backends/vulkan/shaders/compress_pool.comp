#version 450
// Compressor pooling (§3.4 / §4.3): per (group, channel), softmax over the candidate token
// rows of the channel's score, weighted sum of their kv. Candidate order and the max / Σexp
// / Σp·kv sequence follow the CPU backend.
// push: 0 rk_off, 1 rs_off, 2 ldr, 3 ring_len, 4 kv_off, 5 sc_off, 6 ldc, 7 pos0, 8 n,
//       9 ratio, 10 overlap, 11 hd, 12 w0, 13 n_groups, 14 out_off, 15 ldo
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer RK { uint d[]; } rk;
layout(std430, binding = 1) readonly buffer RS { uint d[]; } rsb;
layout(std430, binding = 2) readonly buffer KV { uint d[]; } kv;
layout(std430, binding = 3) readonly buffer SC { uint d[]; } sc;
layout(std430, binding = 4) buffer OB { uint d[]; } ob;
#include "common.glsl"

// candidate c (0 .. nc) → (is_ring, float index of the row start incl. lane offset)
int g_w;
bool cand(uint c, out bool ring, out uint off) {
    uint r = pc.p[9];
    bool ov = pc.p[10] != 0u;
    int lane0 = (ov && g_w > 0) ? 1 : 0;   // lane A present
    int grp;
    uint lane_off;
    if (ov && g_w > 0 && c < r) {
        grp = g_w - 1;
        lane_off = 0u;
    } else {
        uint cc = (ov && g_w > 0) ? c - r : c;
        c = cc;
        grp = g_w;
        lane_off = ov ? pc.p[11] : 0u;
    }
    int q = grp * int(r) + int(c % r);
    int pos0 = int(pc.p[7]);
    if (q < pos0) {
        ring = true;
        off = uint(q % int(pc.p[3])) * pc.p[2] + lane_off;
    } else {
        ring = false;
        off = uint(q - pos0) * pc.p[6] + lane_off;
    }
    return lane0 == 0;
}
float score(bool ring, uint off) { return uintBitsToFloat(ring ? rsb.d[pc.p[1] + off] : sc.d[pc.p[5] + off]); }
float value(bool ring, uint off) { return uintBitsToFloat(ring ? rk.d[pc.p[0] + off] : kv.d[pc.p[4] + off]); }

void main() {
    uint j = gl_GlobalInvocationID.x;
    uint g = gl_WorkGroupID.y;
    if (j >= pc.p[11] || g >= pc.p[13]) return;
    g_w = int(pc.p[12]) + int(g);
    uint r = pc.p[9];
    uint nc = (pc.p[10] != 0u && g_w > 0) ? 2u * r : r;
    bool ring;
    uint off;
    cand(0u, ring, off);
    float mx = score(ring, off + j);
    for (uint c = 1u; c < nc; c++) {
        cand(c, ring, off);
        mx = max(mx, score(ring, off + j));
    }
    float z = 0.0;
    for (uint c = 0u; c < nc; c++) {
        cand(c, ring, off);
        z += exp(score(ring, off + j) - mx);
    }
    float a = 0.0;
    for (uint c = 0u; c < nc; c++) {
        cand(c, ring, off);
        a += (exp(score(ring, off + j) - mx) / z) * value(ring, off + j);
    }
    ob.d[pc.p[14] + g * pc.p[15] + j] = floatBitsToUint(a);
}
