// Small parameter tensors (norm weights, hc scale/base, sinks, router bias) in binding `pb`:
// f32, f16 or bf16 chosen at run time. `skew` is the byte offset of element 0.
float ldp(uint type, uint skew, uint i) {
    if (type == 0u) return uintBitsToFloat(pb.d[(skew >> 2) + i]);
    uint b = skew + 2u * i;
    uint h = (pb.d[b >> 2] >> ((b & 2u) << 3)) & 0xFFFFu;
    if (type == 1u) return unpackHalf2x16(h).x;
    return uintBitsToFloat(h << 16);
}
