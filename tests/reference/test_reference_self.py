#!/usr/bin/python3
"""Self-checks of the NumPy reference's building blocks against hand-computed values.

Run: /usr/bin/python3 tests/reference/test_reference_self.py [-v]
Exit status 0 when every check passes, 1 otherwise; 77 (skipped) when NumPy is absent.
Skips follow tests/common/skip.h: the reason is printed and appended to $DSI_SKIP_LOG, and
with DSI_REQUIRE_<WHAT>=1 (PYTHON: NumPy; MODELS: dsinfer-mkmodel) the absence fails.
"""

import math
import os
import struct
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from skip import status as absent  # noqa: E402  (tests/common/skip.py: skip.h's contract)

try:
    import numpy as np
except ImportError:
    sys.exit(absent("PYTHON", "%s has no NumPy (Debian python3-numpy)" % sys.executable))

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_reader as gr  # noqa: E402
import dsref  # noqa: E402
import make_test_gguf as mk  # noqa: E402

F32 = np.float32
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def eq(a, b, msg=""):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or not np.array_equal(a, b):
        raise AssertionError("%s: got %s expected %s" % (msg, a.tolist() if a.size < 40 else a,
                                                         b.tolist() if b.size < 40 else b))


def close(a, b, tol, msg=""):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or np.max(np.abs(a - b)) > tol:
        raise AssertionError("%s: max |diff| %s > %g" % (msg, np.max(np.abs(a - b)) if
                                                        a.shape == b.shape else "shape", tol))


# ---------------------------------------------------------------------------- rounding
@check
def e2m1_ties_section_10_1():
    # §10.1: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    x = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    eq(dsref.e2m1_rne(np.array(x, F32)), want, "e2m1 ties")
    eq(dsref.e2m1_rne(-np.array(x, F32)), -np.array(want), "e2m1 negative ties")
    # grid points map to themselves; off-midpoint values go to the nearest
    grid = [0, .5, 1, 1.5, 2, 3, 4, 6]
    eq(dsref.e2m1_rne(np.array(grid, F32)), grid, "e2m1 grid")
    eq(dsref.e2m1_rne(np.array([0.26, 0.74, 2.49, 2.51, 4.99, 5.01, 5.9], F32)),
       [0.5, 0.5, 2, 3, 4, 6, 6], "e2m1 nearest")


@check
def e4m3_ties_and_grid():
    # every finite E4M3FN code rounds to itself
    vals = gr.E4M3_TABLE[np.isfinite(gr.E4M3_TABLE)]
    eq(dsref.e4m3_rne(vals), vals, "e4m3 grid fixed points")
    # hand-computed midpoints: ties go to the even mantissa
    x = np.array([1.0625,      # 1.0 (m=0) | 1.125 (m=1)      -> 1.0
                  1.1875,      # 1.125 (m=1) | 1.25 (m=2)     -> 1.25
                  2 ** -10,    # 0 | 2^-9 (subnormal m=1)     -> 0
                  3 * 2 ** -10,  # 2^-9 (m=1) | 2^-8 (m=2)    -> 2^-8
                  432.0,       # 416 (m=5) | 448 (m=6)         -> 448
                  248.0,       # 240 (1.875*128, m=7) | 256 (m=0 next binade) -> 256
                  17.0,        # 16 (m=0) | 18 (m=1)           -> 16
                  2 ** -6 * 1.0625,  # 2^-6 (m=0) | 2^-6*1.125 (m=1) -> 2^-6
                  7.5 * 2 ** -9], F32)  # largest subnormal 7*2^-9 (m=7) | 2^-6 -> 2^-6
    want = [1.0, 1.25, 0.0, 2 ** -8, 448.0, 256.0, 16.0, 2 ** -6, 2 ** -6]
    eq(dsref.e4m3_rne(x), want, "e4m3 ties")
    eq(dsref.e4m3_rne(-x), -np.array(want), "e4m3 negative ties")
    # brute force against the decoded table for random values in range
    rng = np.random.default_rng(5)
    v = (rng.standard_normal(5000) * rng.choice([1e-3, 1e-1, 10, 100], 5000)).astype(F32)
    v = np.clip(v, -448, 448)
    fin = np.unique(vals)
    got = dsref.e4m3_rne(v)
    for xi, gi in zip(v[:2000], got[:2000]):
        d = np.abs(fin.astype(np.float64) - float(xi))
        best = fin[d == d.min()]
        if gi not in best:
            raise AssertionError("e4m3 %r -> %r not nearest %r" % (xi, gi, best))


@check
def bf16_rounding():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20], F32)
    # 1+2^-8 is the midpoint of 1 and 1+2^-7 -> even (1.0); 1+3*2^-8 -> 1+2^-6 (even)
    eq(dsref.bf16_rne(x), [1.0, 1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7], "bf16 rne")


@check
def pow2_ceil_exact():
    eq(dsref.pow2_ceil(np.array([1.0, 0.5, 3.0, 0.3, 2 ** -126, 1.0000001], F32)),
       [1.0, 0.5, 4.0, 0.5, 2 ** -126, 2.0], "pow2 ceil")


@check
def fake_quant_recipes():
    # FP8 UE8M0: amax 448 -> s = 1 (values already on the grid stay)
    x = np.zeros(64, F32)
    x[0] = 448.0
    x[1] = 1.0625
    y = dsref.fq_fp8_ue8m0(x, 64)
    eq(y[:2], [448.0, 1.0], "fp8 s=1")
    # amax 449 -> s = 2; 449/2 = 224.5 -> 224; 1.0625/2 = 0.53125 (exact on grid: 1.0625*2^-1)
    x[0] = 449.0
    y = dsref.fq_fp8_ue8m0(x, 64)
    eq(y[:2], [448.0, 1.0], "fp8 s=2")  # 0.53125 is the midpoint 0.5|0.5625 -> 0.5 -> *2 = 1.0
    # tiny block: amax floor 1e-4 -> s = 2^ceil(log2(1e-4/448)) = 2^-22
    x = np.full(64, 1e-9, F32)
    y = dsref.fq_fp8_ue8m0(x, 64)
    s = 2.0 ** -22
    # 1e-9 / 2^-22 = 0.0041943 = 2.15 subnormal steps of 2^-9 -> 2 * 2^-9 -> * 2^-22 = 2^-30
    eq(y, np.full(64, 2.0 ** -30), "fp8 floor")
    # no-fake-quant: clamp and rescale only -> identity for power-of-two scales
    x = np.random.default_rng(1).standard_normal(64).astype(F32)
    eq(dsref.fq_fp8_ue8m0(x, 64, fake=False), x, "fp8 no-fake identity")
    eq(dsref.fq_fp4_ue8m0(x, 32, fake=False), x, "fp4 no-fake identity")
    # FP4 UE8M0: amax 6 -> s = 1, values on the e2m1 grid; 0.75 -> 1, 2.5 -> 2
    x = np.zeros(32, F32)
    x[:4] = [6.0, 0.75, 2.5, -5.0]
    eq(dsref.fq_fp4_ue8m0(x, 32)[:4], [6.0, 1.0, 2.0, -4.0], "fp4 ue8m0")
    # amax 7 -> s = 2: 7/2=3.5 -> 4 -> 8 ; 0.75/2 = .375 -> .5 -> 1.0
    x[0] = 7.0
    eq(dsref.fq_fp4_ue8m0(x, 32)[:2], [8.0, 1.0], "fp4 ue8m0 s=2")
    # FP4 with E4M3 scale: amax 6 -> s = e4m3(1) = 1
    x = np.zeros(16, F32)
    x[:3] = [6.0, 1.25, -3.5]
    eq(dsref.fq_fp4_e4m3(x, 16)[:3], [6.0, 1.0, -4.0], "fp4 e4m3 s=1")
    # amax 7.5 -> s = e4m3(1.25) = 1.25; 7.5/1.25 = 6 -> 6*1.25 = 7.5; 1.25/1.25=1 -> 1.25
    x[0] = 7.5
    eq(dsref.fq_fp4_e4m3(x, 16)[:2], [7.5, 1.25], "fp4 e4m3 s=1.25")
    # amax 6.3 -> 1.05 -> e4m3 1.0 (1.0|1.125: nearest 1.0); 6.3/1 clamps to 6 -> 6
    x[0] = 6.3
    eq(dsref.fq_fp4_e4m3(x, 16)[0], 6.0, "fp4 e4m3 clamp")
    eq(dsref.fq_fp4_e4m3(x, 16, fake=False)[0], 6.0, "fp4 e4m3 no-fake clamp")


# ---------------------------------------------------------------------------- transforms
@check
def hadamard_orthonormal():
    h = dsref.hadamard_matrix(128)
    close(h @ h.T, np.eye(128), 1e-12, "H H^T = I")
    close(h, h.T, 0, "H symmetric")
    close(h[0], np.full(128, 1 / math.sqrt(128)), 1e-15, "first row")
    x = np.random.default_rng(2).standard_normal(128)
    close(np.linalg.norm(h @ x), np.linalg.norm(x), 1e-12, "norm preserved")


@check
def yarn_low_high_real_config():
    lo, hi = dsref.yarn_low_high(64, 160000.0, 65536.0, 32.0, 1.0)
    eq([lo, hi], [15, 25], "YaRN low/high (§3.9)")
    f = dsref.rope_freqs(64, 160000.0, (16.0, 65536.0, 32.0, 1.0))
    f0 = 160000.0 ** (-2.0 * np.arange(32) / 64)
    close(f[:16], f0[:16], 0, "high-freq pairs untouched")
    close(f[25:], f0[25:] / 16, 1e-18, "low-freq pairs interpolated")
    close(f[20], f0[20] / 16 * 0.5 + f0[20] * 0.5, 1e-18, "ramp midpoint")


@check
def rope_interleaved_and_inverse():
    f = dsref.rope_freqs(4, 10000.0)
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])     # rope on last 4 dims, pairs (3,4),(5,6)
    y = dsref.rope_tail(x, 7, f)
    th0, th1 = 7 * 1.0, 7 * 10000.0 ** -0.5
    want = [1, 2, 3 * math.cos(th0) - 4 * math.sin(th0), 3 * math.sin(th0) + 4 * math.cos(th0),
            5 * math.cos(th1) - 6 * math.sin(th1), 5 * math.sin(th1) + 6 * math.cos(th1)]
    close(y, want, 1e-12, "rope")
    close(dsref.rope_tail(y, 7, f, inverse=True), x, 1e-12, "inverse rope")


@check
def sinkhorn_doubly_stochastic():
    rng = np.random.default_rng(3)
    for _ in range(20):
        mix = rng.standard_normal(24)
        base = rng.standard_normal(24)
        pre, post, c = dsref.sinkhorn_split(mix, np.array([1.0, 1.0, 1.0]), base, 4, 20, 1e-6)
        # 20 iterations end with a column normalisation: columns are 1 up to eps,
        # rows close to 1
        close(c.sum(axis=0), np.ones(4), 1e-5, "Sinkhorn column sums")
        close(c.sum(axis=1), np.ones(4), 1e-2, "Sinkhorn row sums")
        _, _, c2 = dsref.sinkhorn_split(mix, np.array([1.0, 1.0, 1.0]), base, 4, 500, 1e-6)
        close(c2.sum(axis=1), np.ones(4), 1e-5, "Sinkhorn row sums (converged)")
        assert np.all(pre > 0) and np.all(pre < 1 + 1e-6 + 1e-12)
        assert np.all(post > 0) and np.all(post < 2)


@check
def topk_ties_lowest_first():
    s = np.array([0.0, 1.0, 0.0, 1.0, 0.0, -np.inf, 0.0])
    eq(dsref.topk_lowest_first(s, 4), [1, 3, 0, 2], "ties lowest position first (§10.2)")
    eq(dsref.topk_lowest_first(np.array([-0.0, 0.0, 0.0]), 2), [0, 1], "signed zeros tie")


@check
def sink_attention_hand():
    q = np.array([[1.0, 0.0]])
    rows = np.array([[1.0, 0.0], [0.0, 1.0]])
    sink = np.array([0.5])
    o = dsref.sink_attention(q, rows, sink, 1.0)
    e = np.exp([1.0, 0.0])
    den = e.sum() + np.exp(0.5)
    close(o, [[e[0] / den, e[1] / den]], 1e-15, "sink attention")


@check
def candidate_blocks_hand():
    class M:
        cand_block = 2
        cand_topk = 2
    sc = np.array([1.0, 5.0, 2.0, 0.0, 3.0])
    # blocks: max(1,5)=5, max(2,0)=2, [3,-inf] newest -> +inf; keep 2 -> blocks 2 and 0
    eq(dsref.Model._candidate_mask(M, sc, 5), [1, 1, 0, 0, 1], "candidate mask")
    # tie between blocks 0 and 1 (both 5): lowest block first
    sc = np.array([5.0, 0.0, 5.0, 1.0, 0.0, 0.0])
    eq(dsref.Model._candidate_mask(M, sc, 6), [1, 1, 0, 0, 1, 1], "candidate tie")


# ---------------------------------------------------------------------------- engram
@check
def engram_hash_hand():
    class M:
        eg_max_ngram = 3
        eg_heads = 2
        eg_pad = 7
        eg_token_map = np.array([10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
        eg_mult = np.array([1, 3, 5, 7, 9, 11, 13, 15, 17], dtype=np.uint64)  # 3 layers x 3
        eg_primes = np.array([11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53], dtype=np.uint64)
        eg_offsets = np.array([0, 11, 24, 41, 0, 23, 52, 83, 0, 41, 84, 131], dtype=np.uint64)
    st = {"tokens": [4, 9]}
    # layer index 1: m = [7, 9, 11], primes [23, 29 | 31, 37], offsets [0, 23 | 52, 83]
    # position 1: tok = [cmap(9)=19, cmap(4)=14, pad=7]
    r = 19 * 7 ^ 14 * 9
    want = [r % 23, r % 29 + 23]
    r ^= 7 * 11
    want += [r % 31 + 52, r % 37 + 83]
    eq(dsref.Model._engram_rows(M, 1, st), want, "engram rows")
    st = {"tokens": [4]}
    r = 14 * 7 ^ 7 * 9
    want = [r % 23, r % 29 + 23]
    r ^= 7 * 11
    want += [r % 31 + 52, r % 37 + 83]
    eq(dsref.Model._engram_rows(M, 1, st), want, "engram rows at position 0 (padding)")


RELEASE_PRIMES = {
    1: [[16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183],
        [16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321],
        [16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463]],
    14: [[16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627],
         [16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769],
         [16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889]],
}
RELEASE_MULT = {1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
                14: [67716810739261, 51510806800915, 30921347202721, 82619226485591]}


@check
def engram_release_primes_offsets():
    primes = mk.engram_primes(16000000, [1, 14], 4, 8)
    for li, L in enumerate([1, 14]):
        want = [p for grp in RELEASE_PRIMES[L] for p in grp]
        eq(primes[li], want, "primes layer %d (§4.6)" % L)
        offs = np.concatenate([[0], np.cumsum(want)[:-1]])
        assert offs[0] == 0 and offs[8] == sum(want[:8])
    assert sum(primes[0]) == 384006168, sum(primes[0])
    assert sum(primes[1]) == 384016682, sum(primes[1])
    # tiny-v41 (§7.2): rows 4062 and 4152
    tp = mk.engram_primes(1000, [1, 3], 3, 2)
    eq([sum(tp[0]), sum(tp[1])], [4062, 4152], "tiny engram rows")


@check
def engram_release_multipliers():
    bound = (np.iinfo(np.int64).max // 99092) // 2
    assert bound == 46539438283891, bound
    m = mk.engram_multipliers([1, 14], 4, 99092)
    eq(m[0], RELEASE_MULT[1], "multipliers layer 1")
    eq(m[1], RELEASE_MULT[14], "multipliers layer 14")


# ---------------------------------------------------------------------------- dequantisers
def f16b(x):
    return np.array([x], dtype="<f2").tobytes()


@check
def deq_q8_0_block():
    qs = np.arange(-16, 16, dtype=np.int8)
    raw = f16b(0.25) + qs.tobytes()
    eq(gr.dequantize(gr.GGML_Q8_0, raw, 32), qs.astype(np.float64) * 0.25, "Q8_0")


def pack_k4_scales(sc, m):
    """Independent packer for the Q4_K 12-byte 6-bit scale/min array."""
    b = [0] * 12
    for j in range(8):
        if j < 4:
            b[j] |= sc[j] & 63
            b[j + 4] |= m[j] & 63
        else:
            b[j + 4] |= (sc[j] & 0xF) | ((m[j] & 0xF) << 4)
            b[j - 4] |= (sc[j] >> 4) << 6
            b[j] |= (m[j] >> 4) << 6
    return bytes(b)


@check
def deq_q4_k_block():
    rng = np.random.default_rng(7)
    sc = [int(v) for v in rng.integers(0, 64, 8)]
    mn = [int(v) for v in rng.integers(0, 64, 8)]
    sc[5], mn[6] = 63, 63   # exercise the high bits
    q = rng.integers(0, 16, 256)          # element values in natural order
    qs = bytearray(128)
    for c in range(4):
        for l in range(32):
            qs[32 * c + l] = int(q[64 * c + l]) | (int(q[64 * c + 32 + l]) << 4)
    d, dmin = 0.5, 0.125
    raw = f16b(d) + f16b(dmin) + pack_k4_scales(sc, mn) + bytes(qs)
    want = np.array([d * sc[i // 32] * q[i] - dmin * mn[i // 32] for i in range(256)])
    close(gr.dequantize(gr.GGML_Q4_K, raw, 256), want, 0, "Q4_K")


@check
def deq_q2_k_block():
    rng = np.random.default_rng(8)
    sc = rng.integers(0, 16, 16)
    mn = rng.integers(0, 16, 16)
    q = rng.integers(0, 4, 256)
    qs = bytearray(64)
    # element i: half h = i // 128, within half k = i % 128: group-of-32 j = k // 32 (shift 2j),
    # l = k % 32 -> byte 32h + l
    for i in range(256):
        h, k = divmod(i, 128)
        j, l = divmod(k, 32)
        qs[32 * h + l] |= int(q[i]) << (2 * j)
    scales = bytes(int(s) | (int(m) << 4) for s, m in zip(sc, mn))
    d, dmin = 0.25, 0.5
    raw = scales + bytes(qs) + f16b(d) + f16b(dmin)
    want = np.array([d * sc[i // 16] * q[i] - dmin * mn[i // 16] for i in range(256)])
    close(gr.dequantize(gr.GGML_Q2_K, raw, 256), want, 0, "Q2_K")


@check
def deq_mxfp4_block():
    # ggml order: y[j] = low nibble of qs[j], y[j+16] = high nibble of qs[j]
    e = 127 + 2            # scale 4
    qs = bytes((j & 0xF) | (((15 - j) & 0xF) << 4) for j in range(16))
    vals = [0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6]
    want = [vals[j] * 4 for j in range(16)] + [vals[15 - j] * 4 for j in range(16)]
    eq(gr.dequantize(gr.GGML_MXFP4, bytes([e]) + qs, 32), want, "MXFP4")


@check
def deq_float_types():
    x = np.array([1.5, -2.25, 65504.0, 2 ** -24], dtype=np.float32)
    eq(gr.dequantize(gr.GGML_F16, x.astype("<f2").tobytes(), 4), x, "F16")
    eq(gr.dequantize(gr.GGML_F32, x.astype("<f4").tobytes(), 4), x, "F32")
    b = np.array([0x3FC0, 0xC010, 0x0000, 0x8000], dtype="<u2").tobytes()
    eq(gr.dequantize(gr.GGML_BF16, b, 4), [1.5, -2.25, 0.0, -0.0], "BF16")
    eq(gr.e8m0_to_float(np.array([127, 128, 0, 120])), [1.0, 2.0, 2.0 ** -127, 2.0 ** -7], "E8M0")
    eq(gr.e4m3_to_float(np.array([0x38, 0x7E, 0x01, 0xB8, 0x08])),
       [1.0, 448.0, 2.0 ** -9, -1.0, 2.0 ** -6], "E4M3")
    assert np.isnan(gr.e4m3_to_float(np.array([0x7F]))[0])


@check
def deq_fp8_types():
    if not gr.FP8_TYPES:
        raise AssertionError("FP8 types not registered (docs/tensor-types.md layout missing)")
    for tid, spec in sorted(gr.FP8_TYPES.items()):
        spec["selftest"]()


# ---------------------------------------------------------------------------- GGUF
@check
def gguf_roundtrip_metadata_and_alignment():
    w = mk.GGUFWriter(alignment=64)
    w.add("a.u8", gr.T_UINT8, 200)
    w.add("a.i8", gr.T_INT8, -100)
    w.add("a.u16", gr.T_UINT16, 60000)
    w.add("a.i16", gr.T_INT16, -30000)
    w.add("a.u32", gr.T_UINT32, 4000000000)
    w.add("a.i32", gr.T_INT32, -2000000000)
    w.add("a.f32", gr.T_FLOAT32, 1.5)
    w.add("a.bool", gr.T_BOOL, True)
    w.add("a.str", gr.T_STRING, "héllo")
    w.add("a.u64", gr.T_UINT64, 2 ** 63 + 5)
    w.add("a.i64", gr.T_INT64, -2 ** 62)
    w.add("a.f64", gr.T_FLOAT64, 1e-20)
    w.add("a.arr_i32", gr.T_ARRAY, [1, -2, 3], gr.T_INT32)
    w.add("a.arr_str", gr.T_ARRAY, ["x", "yz", ""], gr.T_STRING)
    w.tensor("t0", [3], gr.GGML_F32, np.array([1, 2, 3], "<f4").tobytes())
    w.tensor("t1", [32, 2], gr.GGML_Q8_0, (f16b(1.0) + bytes(range(32))) * 2)
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "t.gguf")
        w.write(p)
        g = gr.GGUFFile(p)
        assert g.alignment == 64 and g.data_offset % 64 == 0
        kv = g.kv
        assert kv["a.u8"] == 200 and kv["a.i8"] == -100 and kv["a.u16"] == 60000
        assert kv["a.i16"] == -30000 and kv["a.u32"] == 4000000000 and kv["a.i32"] == -2000000000
        assert kv["a.f32"] == 1.5 and kv["a.bool"] is True and kv["a.str"] == "héllo"
        assert kv["a.u64"] == 2 ** 63 + 5 and kv["a.i64"] == -2 ** 62 and kv["a.f64"] == 1e-20
        eq(kv["a.arr_i32"], [1, -2, 3], "int array")
        assert kv["a.arr_str"] == ["x", "yz", ""]
        eq(g.tensor("t0"), [1, 2, 3], "t0")
        assert g.tensors["t1"].shape == (2, 32)
        eq(g.tensor("t1")[1], np.arange(32), "t1 row")
        eq(g.row("t1", 1), np.arange(32), "read_row")
        g.close()
        # nested arrays: hand-written value
        b = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
        k = b"n.a"
        b += struct.pack("<Q", len(k)) + k + struct.pack("<I", gr.T_ARRAY)
        b += struct.pack("<IQ", gr.T_ARRAY, 2)
        b += struct.pack("<IQ", gr.T_UINT8, 2) + bytes([1, 2])
        b += struct.pack("<IQ", gr.T_UINT8, 1) + bytes([3])
        with open(p, "wb") as fh:
            fh.write(b)
        g = gr.GGUFFile(p)
        assert [list(x) for x in g.kv["n.a"]] == [[1, 2], [3]]
        g.close()
        # truncated file -> GGUFError
        with open(p, "wb") as fh:
            fh.write(bytes(b[:-1]))
        try:
            gr.GGUFFile(p)
            raise AssertionError("truncated file accepted")
        except gr.GGUFError:
            pass


# ---------------------------------------------------------------------------- end to end
@check
def end_to_end_generated_models():
    toks = [int(t) for t in np.random.default_rng(11).integers(0, 512, 80)]
    with tempfile.TemporaryDirectory() as td:
        for arch in ("deepseek4", "deepseek41"):
            p = os.path.join(td, arch + ".gguf")
            mk.build(arch, seed=99, vocab=512).write(p)
            m = dsref.Model(p)
            a = m.forward(toks)
            assert a.shape == (80, 512) and np.all(np.isfinite(a))
            last = m.forward(toks, "last")
            close(last[0], a[-1], 0, "%s: --positions last == last row" % arch)
            pre = m.forward(toks[:50])
            close(pre, a[:50], 0, "%s: causal prefix" % arch)
            b = dsref.Model(p, fake_quant=False).forward(toks)
            assert np.mean(np.abs(a - b)) > 1e-4, "%s: fake quant has no effect?" % arch
            rc = dsref.main(["--model", p, "--tokens", ",".join(map(str, toks[:5])),
                             "--out", os.path.join(td, "o.bin")])
            assert rc == 0
            o = np.fromfile(os.path.join(td, "o.bin"), dtype="<f4").reshape(5, 512)
            close(o, a[:5].astype(np.float32), 0, "%s: CLI output" % arch)
            import contextlib
            import io
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = dsref.main(["--model", p, "--tokens", "1,99999", "--out",
                                 os.path.join(td, "o.bin")])
            assert "out of range" in err.getvalue(), err.getvalue()
            assert rc != 0, "out-of-range token accepted"


class Skip(Exception):
    """A check that needs something absent here: args = (WHAT, reason)."""


def _mkmodel():
    m = os.environ.get("DSI_MKMODEL")
    if not m:
        b = os.environ.get("DSI_BUILD_DIR")
        m = os.path.join(b, "bin", "dsinfer-mkmodel") if b else ""
    if not m or not os.access(m, os.X_OK):
        raise Skip("MODELS", "dsinfer-mkmodel not available (set DSI_MKMODEL)")
    return m


@check
def mkmodel_files_dequantise_consistently():
    """Every quantised type written by dsinfer-mkmodel decodes (with this reader) to values
    close to the same seed's f32 file: a wrong block layout / element order would give a
    relative RMS error of ~1.4, far above these bounds."""
    import subprocess
    mk_bin = _mkmodel()
    bound = {"F16": 1e-3, "BF16": 5e-3, "Q8_0": 1e-2, "Q4_K": 0.1, "Q2_K": 0.4,
             "MXFP4": 0.2, "FP8_E4M3_B128": 0.05, "FP8_E4M3_B32": 0.05}
    seen = set()
    with tempfile.TemporaryDirectory() as td:
        for cfg in ("tiny-v4", "tiny-v41"):
            ref_p = os.path.join(td, cfg + ".gguf")
            subprocess.run([mk_bin, "--config", cfg, "--layout", "native", "-o", ref_p], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ref = gr.GGUFFile(ref_p)
            for t in ("q8_0", "q4_k", "q2_k", "mxfp4", "fp8", "bf16"):
                p = os.path.join(td, "%s-%s.gguf" % (cfg, t))
                subprocess.run([mk_bin, "--config", cfg, "--type", t, "--layout", "native", "-o", p], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                g = gr.GGUFFile(p)
                for n, ti in g.tensors.items():
                    if ti.type == ref.tensors[n].type or ti.type in (gr.GGML_I32,):
                        continue
                    a = ref.tensor(n)
                    b = g.tensor(n)
                    rel = math.sqrt(float(np.mean((a - b) ** 2) / np.mean(a ** 2)))
                    k = gr.TYPE_NAME.get(ti.type, str(ti.type))
                    seen.add(k)
                    if rel > bound.get(k, 0.0):
                        raise AssertionError("%s %s (%s): relative RMS error %.3g" % (p, n, k, rel))
                g.close()
            # the f32 model runs end to end
            lg = dsref.Model(ref_p).forward(list(range(3, 40)))
            assert np.all(np.isfinite(lg)) and lg.shape == (37, 1024)
            ref.close()
    missing = set(bound) - seen
    if missing:
        raise AssertionError("types not exercised: %s" % sorted(missing))


def main():
    verbose = "-v" in sys.argv
    fails = skips = 0
    for fn in CHECKS:
        try:
            fn()
            print("PASS", fn.__name__)
        except Skip as ex:
            if absent(ex.args[0], ex.args[1], fn.__name__) == 77:
                skips += 1
            else:
                fails += 1
        except Exception as ex:  # noqa: BLE001
            fails += 1
            print("FAIL", fn.__name__, "-", ex)
            if verbose:
                traceback.print_exc()
    print("%d/%d checks passed, %d skipped" % (len(CHECKS) - fails - skips, len(CHECKS), skips))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
