#version 450
// Row moves between step rows and per-sequence state (backends/backend.h store_rows,
// gather_rows). One work group: 64 columns of one row (row = WorkGroupID.y + row_base).
// push: 0 mode, 1 src_off, 2 lds, 3 dst_off, 4 ldd, 5 n, 6 width, 7 rows_off (mode 0/1:
//       step rows; mode 2: int32 indices), 8 state rows per slot, 9 ratio, 10 row_base,
//       11 state slots
// modes: 0 store ring (row pos mod rows, skipped when a later row of the sequence takes
//        the same ring row); 1 store group ((pos+1) mod ratio == 0 → row (pos+1)/ratio − 1);
//        2 gather dst[t] = src[idx[t]]
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer SB { uint d[]; } sb;
layout(std430, binding = 1) buffer DB { uint d[]; } db;
layout(std430, binding = 2) readonly buffer RB { int d[]; } rb;
#include "common.glsl"
void main() {
    uint mode = pc.p[0];
    uint t = gl_WorkGroupID.y + pc.p[10];
    uint c = gl_GlobalInvocationID.x;
    if (t >= pc.p[5] || c >= pc.p[6]) return;
    if (mode == 2u) {
        int ix = rb.d[pc.p[7] + t];
        if (ix < 0) return;
        db.d[pc.p[3] + t * pc.p[4] + c] = sb.d[pc.p[1] + uint(ix) * pc.p[2] + c];
        return;
    }
    uint ro = pc.p[7] + t * 4u;
    int p = rb.d[ro], slot = rb.d[ro + 1u], first = rb.d[ro + 2u], count = rb.d[ro + 3u];
    if (p < 0 || slot < 0 || uint(slot) >= pc.p[11]) return;
    uint R = pc.p[8];
    uint row;
    if (mode == 0u) {
        int last = rb.d[pc.p[7] + uint(first) * 4u] + count - 1;
        if (p <= last - int(R)) return;
        row = uint(p) % R;
    } else {
        uint ratio = pc.p[9];
        if ((uint(p) + 1u) % ratio != 0u) return;
        row = (uint(p) + 1u) / ratio - 1u;
        if (row >= R) return;
    }
    db.d[pc.p[3] + (uint(slot) * R + row) * pc.p[4] + c] = sb.d[pc.p[1] + t * pc.p[2] + c];
}
