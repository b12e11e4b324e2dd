// Shared declarations of the libdsinfer Vulkan shaders.
// Every binding is a plain uint array (std430), so the baseline shaders need nothing beyond
// Vulkan 1.1 compute: f32 data is read with uintBitsToFloat, packed weights byte-wise.
// Push constants are 32 uint words; each shader documents its own word layout.
layout(push_constant) uniform PC { uint p[32]; } pc;

#define PF(i) uintBitsToFloat(pc.p[i])
#define PI(i) int(pc.p[i])

float nan_f() { return uintBitsToFloat(0x7fc00000u); }

// FP8 E4M3FN (bias 7, subnormal step 2^-9, 0x7F/0xFF NaN) — model-spec §2.1
float e4m3_to_f32(uint b) {
    uint e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 0u) v = float(m) * (1.0 / 512.0);
    else if (e == 15u && m == 7u) v = nan_f();
    else v = (1.0 + float(m) * 0.125) * exp2(float(int(e) - 7));
    return (b & 0x80u) != 0u ? -v : v;
}
// UE8M0 scale: 2^(e-127); e = 0 → 2^-127 (ds4's bit pattern 0x00400000); 255 → NaN
float e8m0_to_f32(uint e) {
    if (e == 0u) return uintBitsToFloat(0x00400000u);
    if (e == 255u) return nan_f();
    return uintBitsToFloat(e << 23);
}
// FP4 E2M1 nibble → value
float e2m1_to_f32(uint n) {
    const float t[16] = float[16](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);
    return t[n & 15u];
}
