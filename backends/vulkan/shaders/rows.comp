#version 450
// Row moves between step rows and per-sequence state (backends/backend.h store_rows,
// gather_rows). One work group: 64 columns of one row (row = WorkGroupID.y + row_base).
// push: 0 mode, 1 src_off, 2 lds, 3 dst_off, 4 ldd, 5 n, 6 width, 7 rows_off (mode 0/1:
//       step rows; mode 2: int32 indices), 8 state rows per slot, 9 ratio, 10 row_base,
//       11 state slots, 12 state format (0 f32; else packed, state.glsl), 13 quantised
//       values per row, 14 values per scale, 15 state row bytes
// A packed store (mode 0/1, format != 0) runs one invocation per unit of the row: units
// [0, ng) pack four blocks each (their codes and the one word of their four scale bytes),
// units [ng, ng + width − qcols) copy the f32 tail; p[6] is then the unit count.
// modes: 0 store ring (row pos mod rows, skipped when a later row of the sequence takes
//        the same ring row); 1 store group ((pos+1) mod ratio == 0 → row (pos+1)/ratio − 1);
//        2 gather dst[t] = src[idx[t]]
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer SB { uint d[]; } sb;
layout(std430, binding = 1) buffer DB { uint d[]; } db;
layout(std430, binding = 2) readonly buffer RB { int d[]; } rb;
#include "common.glsl"
#include "state.glsl"

const float st_grid[7] = float[7](6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5);
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
    uint src = pc.p[1] + t * pc.p[2];
    uint fmt = pc.p[12];
    if (fmt == 0u) {
        db.d[pc.p[3] + (uint(slot) * R + row) * pc.p[4] + c] = sb.d[src + c];
        return;
    }
    uint qc = pc.p[13], blk = pc.p[14], rb = pc.p[3] * 4u + (uint(slot) * R + row) * pc.p[15];
    uint nblk = qc / blk, ng = (nblk + 3u) / 4u;
    if (c >= ng) { // the f32 tail
        uint i = c - ng;
        db.d[((rb + st_tail_offset(fmt, qc, blk)) >> 2) + i] = sb.d[src + qc + i];
        return;
    }
    uint sw = 0u;
    for (uint j = 0u; j < 4u; j++) {
        uint b = 4u * c + j;
        if (b >= nblk) break;
        uint vb = src + b * blk;
        float amax = 0.0;
        for (uint i = 0u; i < blk; i++) amax = max(amax, abs(uintBitsToFloat(sb.d[vb + i])));
        uint sc;
        if (fmt == 3u) {
            // the quantiser's E4M3 scale s has amax = g·s for a grid magnitude g: the first g
            // whose candidate s makes every value of the block exact (statepack.c; products
            // are exact, so the test is too)
            sc = 0u;
            bool found = !(amax > 0.0);
            for (uint k = 0u; k < 7u && !found; k++) {
                uint cs = st_to_e4m3(amax / st_grid[k]);
                if (cs == 0u || (cs & 0x7Fu) == 0x7Fu) continue;
                float s = st_e4m3(cs);
                if (s * st_grid[k] != amax) continue;
                bool ok = true;
                for (uint i = 0u; i < blk && ok; i++) {
                    float v = uintBitsToFloat(sb.d[vb + i]);
                    ok = floatBitsToUint(e2m1_to_f32(st_to_e2m1(v / s)) * s) == floatBitsToUint(v);
                }
                if (ok) {
                    sc = cs;
                    found = true;
                }
            }
            if (!found) sc = st_to_e4m3(max(amax, 6.0 / 512.0) / 6.0); // off the grid
        } else {
            sc = st_ue8m0_for(amax, fmt == 1u ? 448.0 : 6.0);
        }
        sw |= sc << (8u * j);
        // codes: value / scale (UE8M0: times 2^(127 − sc), exact; E4M3 scale: on the grid
        // the quotient rounds to the very code whatever the division's last bits)
        float inv = uintBitsToFloat((254u - min(sc, 253u)) << 23), s3 = st_e4m3(sc);
        if (fmt == 1u) {
            uint o = (rb + b * blk) >> 2;
            for (uint w = 0u; w < blk / 4u; w++) {
                uint word = 0u;
                for (uint k = 0u; k < 4u; k++)
                    word |= st_to_e4m3(uintBitsToFloat(sb.d[vb + 4u * w + k]) * inv) << (8u * k);
                db.d[o + w] = word;
            }
        } else {
            uint o = (rb + b * blk / 2u) >> 2;
            for (uint w = 0u; w < blk / 8u; w++) {
                uint word = 0u;
                for (uint k = 0u; k < 8u; k++) {
                    float v = uintBitsToFloat(sb.d[vb + 8u * w + k]);
                    uint code;
                    if (fmt == 2u) code = st_to_e2m1(v * inv);
                    else if (s3 > 0.0) code = st_to_e2m1(v / s3);
                    else code = (floatBitsToUint(v) >> 31) != 0u ? 8u : 0u;
                    word |= code << (4u * k);
                }
                db.d[o + w] = word;
            }
        }
    }
    db.d[((rb + st_codes_bytes(fmt, qc)) >> 2) + c] = sw;
}
