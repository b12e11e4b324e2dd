#version 450
// Compressor pooling (§3.4 / §4.3), one output row per step row: a row at position p that
// completes group w = (p+1)/ratio − 1 gets, per channel, the softmax over the candidate
// token rows' scores of their kv (candidate order and the max / Σexp / Σp·kv sequence as the
// CPU backend); every other row gets zeros. Candidates at q < pos0 come from the rings of
// the row's slot, q >= pos0 from the step rows.
// push: 0 rk_off, 1 rs_off, 2 ldr, 3 ring rows per slot, 4 kv_off, 5 sc_off, 6 ldc,
//       7 rows_off, 8 n, 9 ratio, 10 overlap, 11 hd, 12 ring slots, 13 row_base,
//       14 out_off, 15 ldo
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer RK { uint d[]; } rk;
layout(std430, binding = 1) readonly buffer RS { uint d[]; } rsb;
layout(std430, binding = 2) readonly buffer KV { uint d[]; } kv;
layout(std430, binding = 3) readonly buffer SC { uint d[]; } sc;
layout(std430, binding = 4) buffer OB { uint d[]; } ob;
layout(std430, binding = 5) readonly buffer RB { int d[]; } rb;
#include "common.glsl"

int g_w, g_pos0, g_first;
uint g_slot;
// candidate c → (is_ring, word offset of the row start incl. lane offset)
void cand(uint c, out bool ring, out uint off) {
    uint r = pc.p[9];
    bool ov = pc.p[10] != 0u;
    int grp;
    uint lane_off;
    if (ov && g_w > 0 && c < r) {
        grp = g_w - 1;
        lane_off = 0u;
    } else {
        c = (ov && g_w > 0) ? c - r : c;
        grp = g_w;
        lane_off = ov ? pc.p[11] : 0u;
    }
    int q = grp * int(r) + int(c % r);
    if (q < g_pos0) {
        ring = true;
        off = (g_slot * pc.p[3] + uint(q % int(pc.p[3]))) * pc.p[2] + lane_off;
    } else {
        ring = false;
        off = uint(g_first + q - g_pos0) * pc.p[6] + lane_off;
    }
}
float score(bool ring, uint off) { return uintBitsToFloat(ring ? rsb.d[pc.p[1] + off] : sc.d[pc.p[5] + off]); }
float value(bool ring, uint off) { return uintBitsToFloat(ring ? rk.d[pc.p[0] + off] : kv.d[pc.p[4] + off]); }

void main() {
    uint j = gl_GlobalInvocationID.x;
    uint t = gl_WorkGroupID.y + pc.p[13];
    if (j >= pc.p[11] || t >= pc.p[8]) return;
    uint ro = pc.p[7] + t * 4u;
    int p = rb.d[ro];
    uint oo = pc.p[14] + t * pc.p[15] + j;
    uint r = pc.p[9];
    if (p < 0 || (uint(p) + 1u) % r != 0u || uint(rb.d[ro + 1u]) >= pc.p[12]) {
        ob.d[oo] = 0u;
        return;
    }
    g_w = (p + 1) / int(r) - 1;
    g_slot = uint(rb.d[ro + 1u]);
    g_first = rb.d[ro + 2u];
    g_pos0 = rb.d[pc.p[7] + uint(g_first) * 4u];
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
    ob.d[oo] = floatBitsToUint(a);
}
