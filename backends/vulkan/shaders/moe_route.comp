#version 450
// MoE router (§3.5 / §4.4), one token per invocation: s = sqrt(softplus(l)); selection by
// tid2eid row (hash layers) or top-k of s + bias (ties: lower expert id first), best first;
// weights s[sel]/(Σ s[sel] + norm_add)·route_scale.
// push: 0 l_off, 1 ldl, 2 E, 3 k, 4 has_bias, 5 bias type, 6 bias skew, 7 has_tid2eid,
//       8 tid skew (bytes), 9 tid nb1, 10 ids_off, 11 norm_add, 12 route_scale, 13 n,
//       14 sel_off, 15 wts_off
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer LB { uint d[]; } lb;
layout(std430, binding = 1) readonly buffer PB { uint d[]; } pb;
layout(std430, binding = 2) readonly buffer TB { int d[]; } tb;
layout(std430, binding = 3) readonly buffer IDB { int d[]; } idb;
layout(std430, binding = 4) buffer SB { int d[]; } selb;
layout(std430, binding = 5) buffer WB { uint d[]; } wtb;
#include "common.glsl"
#include "pload.glsl"

float log1p_(float y) {
    if (y < 0.01) return y * (1.0 - y * (0.5 - y * (1.0 / 3.0 - y * 0.25)));
    return log(1.0 + y);
}
float softplus(float x) { return x > 20.0 ? x : log1p_(exp(x)); }

void main() {
    uint t = gl_GlobalInvocationID.x;
    if (t >= pc.p[13]) return;
    uint E = pc.p[2], k = pc.p[3];
    uint lo = pc.p[0] + t * pc.p[1];
    uint so = pc.p[14] + t * k;
    if (pc.p[7] != 0u) {
        int tok = idb.d[pc.p[10] + t];
        uint ro = (pc.p[8] + uint(tok) * pc.p[9]) >> 2;
        for (uint i = 0u; i < k; i++) selb.d[so + i] = clamp(tb.d[ro + i], 0, int(E) - 1);
    } else {
        for (uint i = 0u; i < k; i++) {
            int best = -1;
            float bv = 0.0;
            for (uint e = 0u; e < E; e++) {
                bool taken = false;
                for (uint j = 0u; j < i; j++) taken = taken || selb.d[so + j] == int(e);
                if (taken) continue;
                float v = sqrt(softplus(uintBitsToFloat(lb.d[lo + e])));
                if (pc.p[4] != 0u) v += ldp(pc.p[5], pc.p[6], e);
                if (best < 0 || v > bv) {
                    best = int(e);
                    bv = v;
                }
            }
            selb.d[so + i] = best;
        }
    }
    float sum = 0.0;
    for (uint i = 0u; i < k; i++) sum += sqrt(softplus(uintBitsToFloat(lb.d[lo + uint(selb.d[so + i])])));
    sum += PF(11);
    for (uint i = 0u; i < k; i++) {
        float s = sqrt(softplus(uintBitsToFloat(lb.d[lo + uint(selb.d[so + i])])));
        wtb.d[pc.p[15] + t * k + i] = floatBitsToUint(s / sum * PF(12));
    }
}
