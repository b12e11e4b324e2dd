// Packed session-state rows (lib/quant/statepack.h, backends/backend.h dsib_state): a row of
// `width` values whose first `qc` are quantised in blocks of `blk`:
//   codes   qc bytes (E4M3) or qc / 2 bytes (E2M1: element 2i in the low nibble)
//   scales  qc / blk bytes (UE8M0 exponent byte, or an E4M3 byte for format 3)
//   pad     to a multiple of 4 bytes (only when an f32 tail follows)
//   tail    (width − qc) f32 values
// Formats: 0 f32, 1 E4M3 + UE8M0, 2 E2M1 + UE8M0, 3 E2M1 + E4M3. Rows start at a multiple of
// 4 bytes (the Vulkan backend declines packed components whose row_bytes is not). A value
// decodes to grid(code)·scale, which is exact in f32 — the same number the fake-quant recipe
// stored (model-spec §10.1), so ops compute with the same numbers as from f32 rows. The
// values are built from bits (no exp2, no division): exact on every device.
// Requires common.glsl (e2m1_to_f32).

// E4M3FN byte → value, as lib/quant/statepack.c's table (0x7F / 0xFF, never stored, read as
// ±448).
float st_e4m3(uint b) {
    uint e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 0u) v = float(m) * (1.0 / 512.0);
    else if (e == 15u && m == 7u) v = 448.0;
    else v = uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) != 0u ? -v : v;
}
// UE8M0 byte → 2^(e−127) (e = 0: 2^-127, statepack.h)
float st_ue8m0(uint e) { return uintBitsToFloat(e != 0u ? e << 23 : 0x00400000u); }

uint st_codes_bytes(uint fmt, uint qc) { return fmt == 1u ? qc : qc / 2u; }
uint st_tail_offset(uint fmt, uint qc, uint blk) {
    return (st_codes_bytes(fmt, qc) + qc / blk + 3u) & ~3u;
}

// float NAME(uint fmt, uint ra, uint i, uint qc, uint blk): value i of the row that starts at
// byte ra of buffer B (a uint array). fmt 0: the f32 word ra / 4 + i.
#define ST_BYTE(B, a) ((B.d[(a) >> 2] >> (((a) & 3u) * 8u)) & 255u)
#ifdef NARROW
// The CPU-device variants (NARROW): two loads per value whatever the format. lavapipe runs
// every branch of a shader under a mask and every buffer load as a loop over the lanes, so
// the value's word (an f32 row, the f32 tail, or the word holding its code byte) and its
// scale byte are read once each and the format is picked by selects (docs/vulkan.md). The
// same values as the branching form below, which GPUs keep (no extra load per value).
#define DEF_ST_LOAD(NAME, B)                                                              \
    float NAME(uint fmt, uint ra_, uint i, uint qc, uint blk) {                            \
        bool packed_ = fmt != 0u && i < qc;                                                \
        uint ca_ = ra_ + (fmt == 1u ? i : i / 2u);                                         \
        uint wa_ = fmt == 0u ? (ra_ >> 2) + i                                              \
                 : packed_ ? ca_ >> 2                                                      \
                           : ((ra_ + st_tail_offset(fmt, qc, blk)) >> 2) + i - qc;        \
        uint w_ = B.d[wa_];                                                                \
        uint sb_ = ST_BYTE(B, ra_ + st_codes_bytes(fmt, qc) + i / max(blk, 1u));           \
        if (!packed_) return uintBitsToFloat(w_);                                          \
        float s = fmt == 3u ? st_e4m3(sb_) : st_ue8m0(sb_);                               \
        uint cb_ = (w_ >> ((ca_ & 3u) * 8u)) & 255u;                                       \
        if (fmt == 1u) return st_e4m3(cb_) * s;                                            \
        return e2m1_to_f32((i & 1u) != 0u ? cb_ >> 4 : cb_) * s;                          \
    }
#else
#define DEF_ST_LOAD(NAME, B)                                                              \
    float NAME(uint fmt, uint ra_, uint i, uint qc, uint blk) {                            \
        if (fmt == 0u) return uintBitsToFloat(B.d[(ra_ >> 2) + i]);                        \
        if (i >= qc)                                                                      \
            return uintBitsToFloat(B.d[((ra_ + st_tail_offset(fmt, qc, blk)) >> 2) + i - qc]); \
        uint sb_ = ST_BYTE(B, ra_ + st_codes_bytes(fmt, qc) + i / blk);                    \
        float s = fmt == 3u ? st_e4m3(sb_) : st_ue8m0(sb_);                               \
        if (fmt == 1u) return st_e4m3(ST_BYTE(B, ra_ + i)) * s;                            \
        uint cb_ = ST_BYTE(B, ra_ + i / 2u);                                               \
        return e2m1_to_f32((i & 1u) != 0u ? cb_ >> 4 : cb_) * s;                          \
    }
#endif

// ---- packing (store_rows; lib/quant/statepack.c dsii_sp_pack_row) ------------------------
// f32 → E4M3FN code, round to nearest even, saturating at ±448 (lib/quant/fp.c).
uint st_to_e4m3(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 24) & 0x80u, ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7Fu;
    if (ax >= 0x43E00000u) return sign | 0x7Eu;
    uint e = ax >> 23;
    if (e >= 121u) {
        uint r = ax + 0x7FFFFu + ((ax >> 20) & 1u);
        return sign | (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u);
    }
    if (e < 117u) return sign;
    uint m = (ax & 0x7FFFFFu) | 0x800000u, sh = 141u - e;
    uint q = m >> sh, rem = m & ((1u << sh) - 1u), half_ = 1u << (sh - 1u);
    if (rem > half_ || (rem == half_ && (q & 1u) != 0u)) q++;
    return sign | q;
}
// f32 → E2M1 code, round to nearest even, saturating at ±6 (lib/quant/fp.c).
uint st_to_e2m1(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0u;
    uint sign = (x >> 31) != 0u ? 8u : 0u;
    float a = uintBitsToFloat(x & 0x7FFFFFFFu);
    uint c;
    if (a <= 0.25) c = 0u;
    else if (a < 0.75) c = 1u;
    else if (a <= 1.25) c = 2u;
    else if (a < 1.75) c = 3u;
    else if (a <= 2.5) c = 4u;
    else if (a < 3.5) c = 5u;
    else if (a <= 5.0) c = 6u;
    else c = 7u;
    return sign | c;
}
// UE8M0 byte of a block: the smallest e (−127 ≤ e ≤ 127) with amax ≤ gmax·2^e (gmax = 448 or
// 6; gmax·2^e is a normal number for every such e, built from bits).
uint st_ue8m0_for(float amax, float gmax) {
    if (!(amax > 0.0)) return 0u;
    int ea = int((floatBitsToUint(amax) >> 23) & 255u) - 127;
    int eg = int((floatBitsToUint(gmax) >> 23) & 255u) - 127;
    int e = max(ea - eg - 1, -127);
    while (e < 127 && amax > uintBitsToFloat(uint(int(floatBitsToUint(gmax)) + (e << 23)))) e++;
    return uint(e + 127);
}
