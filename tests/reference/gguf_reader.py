#!/usr/bin/python3
"""Minimal, independent GGUF v3 reader and dequantisers for the NumPy reference.

Written from the GGUF file-format description and ggml's published block layouts
(looked up in ggml-quants.c / ggml-common.h), not from libdsinfer's C code, so it
can serve as an oracle for lib/gguf and lib/quant.

Public API:
    GGUFFile(path)           parse header, metadata, tensor infos
      .version, .alignment, .data_offset, .kv (dict key -> python value),
      .kv_types (key -> (type, elem_type)), .tensors (dict name -> TensorInfo)
      .raw(name) -> bytes-like (memoryview into the mmapped file)
      .tensor(name, dtype=np.float64) -> numpy array, shape = reversed(ne)
    dequantize(type_id, raw_bytes, n_elements) -> float32 1-D array
    Also the scalar helpers e4m3_to_float, e8m0_to_float, f16/bf16 decoders.

Only Python 3 + NumPy.
"""

import mmap
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"

# Metadata value types (GGUF spec)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, \
    T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)

_SCALAR_FMT = {
    T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h",
    T_UINT32: "<I", T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?",
    T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d",
}
_SCALAR_NP = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2",
    T_UINT32: "<u4", T_INT32: "<i4", T_FLOAT32: "<f4", T_BOOL: "<u1",
    T_UINT64: "<u8", T_INT64: "<i8", T_FLOAT64: "<f8",
}

# ggml tensor type ids (ggml.h enum ggml_type)
GGML_F32 = 0
GGML_F16 = 1
GGML_Q4_0 = 2
GGML_Q4_1 = 3
GGML_Q5_0 = 6
GGML_Q5_1 = 7
GGML_Q8_0 = 8
GGML_Q8_1 = 9
GGML_Q2_K = 10
GGML_Q3_K = 11
GGML_Q4_K = 12
GGML_Q5_K = 13
GGML_Q6_K = 14
GGML_Q8_K = 15
GGML_IQ2_XXS = 16
GGML_I8 = 24
GGML_I16 = 25
GGML_I32 = 26
GGML_I64 = 27
GGML_F64 = 28
GGML_BF16 = 30
GGML_MXFP4 = 39

# FP8 types.  The ids and block layouts are the ones defined in
# docs/tensor-types.md (see FP8_TYPES below, filled in from that document).
FP8_TYPES = {}

# (block elements, block bytes) for the types we can size.
TYPE_BLOCK = {
    GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_BF16: (1, 2), GGML_F64: (1, 8),
    GGML_I8: (1, 1), GGML_I16: (1, 2), GGML_I32: (1, 4), GGML_I64: (1, 8),
    GGML_Q4_0: (32, 18), GGML_Q4_1: (32, 20), GGML_Q5_0: (32, 22),
    GGML_Q5_1: (32, 24), GGML_Q8_0: (32, 34), GGML_Q8_1: (32, 36),
    GGML_Q2_K: (256, 84), GGML_Q3_K: (256, 110), GGML_Q4_K: (256, 144),
    GGML_Q5_K: (256, 176), GGML_Q6_K: (256, 210), GGML_Q8_K: (256, 292),
    GGML_IQ2_XXS: (256, 66), GGML_MXFP4: (32, 17),
    # sizes only (known to ggml, not decoded here)
    17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 29: (256, 56), 34: (256, 54), 35: (256, 66),
}

TYPE_NAME = {
    GGML_F32: "F32", GGML_F16: "F16", GGML_BF16: "BF16", GGML_F64: "F64",
    GGML_I8: "I8", GGML_I16: "I16", GGML_I32: "I32", GGML_I64: "I64",
    GGML_Q8_0: "Q8_0", GGML_Q2_K: "Q2_K", GGML_Q4_K: "Q4_K",
    GGML_Q4_0: "Q4_0", GGML_Q6_K: "Q6_K", GGML_IQ2_XXS: "IQ2_XXS",
    GGML_MXFP4: "MXFP4",
}


class GGUFError(Exception):
    pass


# ----------------------------------------------------------------------------
# scalar format decoders
# ----------------------------------------------------------------------------

def f16_to_float(u16):
    """uint16 array (IEEE binary16 bits) -> float32 array."""
    return np.asarray(u16, dtype="<u2").view(np.float16).astype(np.float32)


def bf16_to_float(u16):
    """uint16 array (bfloat16 bits) -> float32 array (exact: bf16 is the top half of f32)."""
    u = np.asarray(u16, dtype=np.uint32)
    return (u << np.uint32(16)).view(np.float32)


def _build_e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 7
        if e == 0xF and m == 7:
            v = float("nan")          # E4M3FN: only S.1111.111 is NaN, no infinities
        elif e == 0:
            v = s * m * 2.0 ** -9     # subnormal: m * 2^-6 * 2^-3
        else:
            v = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = v
    return t


E4M3_TABLE = _build_e4m3_table()


def e4m3_to_float(b):
    return E4M3_TABLE[np.asarray(b, dtype=np.uint8)]


def _build_e8m0_table():
    t = np.zeros(256, dtype=np.float32)
    for e in range(256):
        if e == 255:
            t[e] = np.float32("nan")
        else:
            # 2^(e-127); e = 0 gives 2^-127 (float bits 0x00400000, a subnormal),
            # the value ds4's e8m0_to_f32 uses (model-spec §2.1).
            t[e] = np.float32(np.ldexp(1.0, e - 127))
    return t


E8M0_TABLE = _build_e8m0_table()


def e8m0_to_float(b):
    return E8M0_TABLE[np.asarray(b, dtype=np.uint8)]


# OCP E2M1 value table (model-spec §2.1)
E2M1_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6],
                       dtype=np.float32)


# ----------------------------------------------------------------------------
# block dequantisers (all return float32, 1-D, n elements)
# ----------------------------------------------------------------------------

def _blocks(raw, n, blk_elems, blk_bytes):
    if n % blk_elems:
        raise GGUFError("element count %d not a multiple of block size %d" % (n, blk_elems))
    nb = n // blk_elems
    buf = np.frombuffer(raw, dtype=np.uint8, count=nb * blk_bytes)
    return buf.reshape(nb, blk_bytes)


def deq_q8_0(raw, n):
    # block_q8_0 { f16 d; int8 qs[32]; }  y[j] = qs[j] * d
    b = _blocks(raw, n, 32, 34)
    d = f16_to_float(b[:, 0:2].copy().view("<u2")[:, 0])
    qs = b[:, 2:34].view(np.int8).astype(np.float32)
    return (qs * d[:, None]).reshape(-1)


def _k4_scale_min(sc):
    """ggml get_scale_min_k4 for j = 0..7 on the 12 packed bytes; sc: [nb, 12] uint8.
    Returns (scales [nb, 8], mins [nb, 8]) as int."""
    sc = sc.astype(np.int32)
    d = np.zeros((sc.shape[0], 8), dtype=np.int32)
    m = np.zeros((sc.shape[0], 8), dtype=np.int32)
    for j in range(8):
        if j < 4:
            d[:, j] = sc[:, j] & 63
            m[:, j] = sc[:, j + 4] & 63
        else:
            d[:, j] = (sc[:, j + 4] & 0xF) | ((sc[:, j - 4] >> 6) << 4)
            m[:, j] = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    return d, m


def deq_q4_k(raw, n):
    # block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }
    # For each 64-element chunk c (0..3): sub-block 2c uses the low nibbles of
    # qs[32c .. 32c+31], sub-block 2c+1 the high nibbles of the same 32 bytes.
    # y = d*sc*q - dmin*m  (computed in f32 as ggml: d1 = d*sc, m1 = dmin*m)
    b = _blocks(raw, n, 256, 144)
    nb = b.shape[0]
    d = f16_to_float(b[:, 0:2].copy().view("<u2")[:, 0])
    dmin = f16_to_float(b[:, 2:4].copy().view("<u2")[:, 0])
    sc, mn = _k4_scale_min(b[:, 4:16])
    qs = b[:, 16:144].reshape(nb, 4, 32)
    out = np.zeros((nb, 8, 32), dtype=np.float32)
    for c in range(4):
        lo = (qs[:, c, :] & 0xF).astype(np.float32)
        hi = (qs[:, c, :] >> 4).astype(np.float32)
        d1 = (d * sc[:, 2 * c].astype(np.float32))[:, None]
        m1 = (dmin * mn[:, 2 * c].astype(np.float32))[:, None]
        d2 = (d * sc[:, 2 * c + 1].astype(np.float32))[:, None]
        m2 = (dmin * mn[:, 2 * c + 1].astype(np.float32))[:, None]
        out[:, 2 * c, :] = d1 * lo - m1
        out[:, 2 * c + 1, :] = d2 * hi - m2
    return out.reshape(-1)


def deq_q2_k(raw, n):
    # block_q2_K { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }  (84 bytes)
    # scales[g]: low nibble = scale, high nibble = min of 16-element group g.
    # Elements: for half h (0,1) covering 128 elements with q = qs[32h .. 32h+31],
    # shift s = 0,2,4,6 (j = 0..3): group 8h+2j   = ((q[0:16]  >> s) & 3)
    #                                group 8h+2j+1 = ((q[16:32] >> s) & 3)
    # y = d*sc*q - dmin*m
    b = _blocks(raw, n, 256, 84)
    nb = b.shape[0]
    scales = b[:, 0:16].astype(np.int32)
    qs = b[:, 16:80]
    d = f16_to_float(b[:, 80:82].copy().view("<u2")[:, 0])
    dmin = f16_to_float(b[:, 82:84].copy().view("<u2")[:, 0])
    out = np.zeros((nb, 16, 16), dtype=np.float32)
    for h in range(2):
        q = qs[:, 32 * h:32 * h + 32]
        for j in range(4):
            s = 2 * j
            for half in range(2):
                g = 8 * h + 2 * j + half
                vals = ((q[:, 16 * half:16 * half + 16] >> s) & 3).astype(np.float32)
                dl = (d * (scales[:, g] & 0xF).astype(np.float32))[:, None]
                ml = (dmin * (scales[:, g] >> 4).astype(np.float32))[:, None]
                out[:, g, :] = dl * vals - ml
    return out.reshape(-1)


def deq_mxfp4(raw, n):
    # ggml block_mxfp4 { u8 e; u8 qs[16]; }  (17 bytes, 32 elements)
    # ggml element order: y[j] = low nibble of qs[j], y[j+16] = high nibble of qs[j]
    # (j = 0..15) -- NOT the OCP/HF "element 2j = low nibble of byte j" order.
    # ggml scales by kvalues {0,1,2,3,4,6,8,12,...} * 2^(e-128); identical to
    # e2m1 value * 2^(e-127).
    b = _blocks(raw, n, 32, 17)
    nb = b.shape[0]
    s = e8m0_to_float(b[:, 0])
    qs = b[:, 1:17]
    out = np.empty((nb, 32), dtype=np.float32)
    out[:, 0:16] = E2M1_VALUES[qs & 0xF]
    out[:, 16:32] = E2M1_VALUES[qs >> 4]
    out *= s[:, None]
    return out.reshape(-1)


def deq_plain(type_id, raw, n):
    if type_id == GGML_F32:
        return np.frombuffer(raw, dtype="<f4", count=n).astype(np.float32)
    if type_id == GGML_F16:
        return f16_to_float(np.frombuffer(raw, dtype="<u2", count=n))
    if type_id == GGML_BF16:
        return bf16_to_float(np.frombuffer(raw, dtype="<u2", count=n))
    if type_id == GGML_F64:
        return np.frombuffer(raw, dtype="<f8", count=n).copy()
    if type_id == GGML_I8:
        return np.frombuffer(raw, dtype="<i1", count=n).copy()
    if type_id == GGML_I16:
        return np.frombuffer(raw, dtype="<i2", count=n).copy()
    if type_id == GGML_I32:
        return np.frombuffer(raw, dtype="<i4", count=n).copy()
    if type_id == GGML_I64:
        return np.frombuffer(raw, dtype="<i8", count=n).copy()
    return None


def dequantize(type_id, raw, n, ne=None):
    """Decode n elements of type type_id from raw bytes (ggml order).  Integer types
    come back as integer arrays, everything else as float32 (F64 as float64).
    `ne` (the tensor's ne list) is passed to layouts that need the row length."""
    v = deq_plain(type_id, raw, n)
    if v is not None:
        return v
    if type_id == GGML_Q8_0:
        return deq_q8_0(raw, n)
    if type_id == GGML_Q4_K:
        return deq_q4_k(raw, n)
    if type_id == GGML_Q2_K:
        return deq_q2_k(raw, n)
    if type_id == GGML_MXFP4:
        return deq_mxfp4(raw, n)
    if type_id in FP8_TYPES:
        return FP8_TYPES[type_id]["deq"](raw, n, ne)
    raise GGUFError("unsupported tensor type %d (%s)" % (type_id, TYPE_NAME.get(type_id, "?")))


def type_nbytes(type_id, n, ne=None):
    if type_id in TYPE_BLOCK:
        be, bb = TYPE_BLOCK[type_id]
        if n % be:
            raise GGUFError("element count %d not a multiple of block %d for type %d"
                            % (n, be, type_id))
        return n // be * bb
    if type_id in FP8_TYPES:
        return FP8_TYPES[type_id]["nbytes"](n, ne)
    raise GGUFError("unknown tensor type %d" % type_id)


# ----------------------------------------------------------------------------
# FP8 E4M3 + E8M0 block-scale types (layout: docs/tensor-types.md)
# ----------------------------------------------------------------------------
GGML_FP8_E4M3_B128 = 1024
GGML_FP8_E4M3_B32 = 1025
GGML_FP8_E4M3_R32 = 1026


# docs/tensor-types.md: all three types share one block layout, `[e][v0 .. v(B-1)]` --
# one UE8M0 scale byte followed by the B E4M3FN codes it scales (B = 128 for b128, 32 for
# b32 and r32).  Every row (ne[0] elements) is stored independently as ceil(ne[0]/B)
# blocks; the last block of a row is padded with value bytes that are not elements.
# (b128/b32 repeat a 2-D tile's scale in each of the tile's rows; a reader need not care.)
_FP8_B = {GGML_FP8_E4M3_B128: 128, GGML_FP8_E4M3_B32: 32, GGML_FP8_E4M3_R32: 32}


def _fp8_geometry(B, n, ne):
    n0 = int(ne[0]) if ne else n
    if n0 <= 0 or n % n0:
        raise GGUFError("bad FP8 tensor geometry")
    return n0, n // n0, -(-n0 // B)


def _fp8_nbytes_fn(B):
    def nbytes(n, ne):
        n0, rows, nb = _fp8_geometry(B, n, ne)
        return rows * nb * (B + 1)
    return nbytes


def _fp8_deq_fn(B):
    def deq(raw, n, ne=None):
        n0, rows, nb = _fp8_geometry(B, n, ne)
        blk = np.frombuffer(raw, dtype=np.uint8, count=rows * nb * (B + 1))
        blk = blk.reshape(rows, nb, B + 1)
        x = e4m3_to_float(blk[:, :, 1:]) * e8m0_to_float(blk[:, :, 0])[:, :, None]
        return x.reshape(rows, nb * B)[:, :n0].astype(np.float32).reshape(-1)
    return deq


def _fp8_enc_fn(B):
    def enc(a):
        """Test-side writer (tensor-types.md "Writer quantization"): a is [rows, n];
        per block s = 2^ceil(log2(amax * f32(1/448))) (zero block: e = 127), RNE to E4M3
        by nearest-code search (ties: even code), padding bytes 0."""
        a = np.asarray(a, dtype=np.float32)
        if a.ndim == 1:
            a = a[None, :]
        rows, n0 = a.shape
        nb = -(-n0 // B)
        pad = np.zeros((rows, nb * B), dtype=np.float32)
        pad[:, :n0] = a
        blocks = pad.reshape(rows * nb, B)
        amax = np.abs(blocks).max(axis=1)
        out = np.zeros((rows * nb, B + 1), dtype=np.uint8)
        codes = np.arange(256)
        codes = codes[np.isfinite(E4M3_TABLE)]
        vals = E4M3_TABLE[codes].astype(np.float64)
        for i in range(rows * nb):
            if amax[i] == 0:
                e = 0
            else:
                v = np.float32(amax[i] * np.float32(1.0 / 448.0))
                m, e = np.frexp(v)
                e = int(e - 1 if m == 0.5 else e)
            out[i, 0] = e + 127
            x = blocks[i].astype(np.float64) / 2.0 ** e
            d = np.abs(vals[None, :] - x[:, None])
            best = d.min(axis=1, keepdims=True)
            cand = d == best
            # ties: the even code (mantissa lsb 0) wins
            pick = np.where(cand & ((codes[None, :] & 1) == 0), 1, 0) + cand
            out[i, 1:] = codes[np.argmax(pick, axis=1)]
        out = out.reshape(rows, nb, B + 1)
        for r in range(rows):
            for j in range(n0, nb * B):
                out[r, j // B, 1 + j % B] = 0
        return out.tobytes()
    return enc


def _fp8_selftest():
    # r32 / b32: one block: scale byte 127+3 (x8), values 1.0 (0x38), -0.5 (0xB0),
    # 448 (0x7E), 2^-9 (0x01)
    blk = bytes([130, 0x38, 0xB0, 0x7E, 0x01]) + bytes(28)
    want = np.zeros(64)
    want[0:4] = [8.0, -4.0, 3584.0, 8 * 2.0 ** -9]
    want[32:36] = want[0:4]
    for t in (GGML_FP8_E4M3_R32, GGML_FP8_E4M3_B32):
        y = dequantize(t, blk * 2, 64, [64])
        if not np.array_equal(y.astype(np.float64), want):
            raise AssertionError("type %d decode: %s" % (t, y[:4]))
    if type_nbytes(GGML_FP8_E4M3_R32, 256, [256]) != 264:
        raise AssertionError("fp8_e4m3_r32 row size")
    # padded rows: ne = [40, 2] in b32 -> 2 blocks (66 bytes) per row, 40 elements emitted
    row0 = bytes([127]) + bytes([0x38] * 32) + bytes([126]) + bytes([0x40] * 8) + bytes(24)
    row1 = bytes([128]) + bytes([0xB8] * 32) + bytes([127]) + bytes([0x01] * 8) + bytes(24)
    if type_nbytes(GGML_FP8_E4M3_B32, 80, [40, 2]) != 132:
        raise AssertionError("b32 padded size")
    y = dequantize(GGML_FP8_E4M3_B32, row0 + row1, 80, [40, 2]).reshape(2, 40)
    w = np.zeros((2, 40))
    w[0, :32] = 1.0
    w[0, 32:] = 2.0 * 0.5
    w[1, :32] = -2.0
    w[1, 32:] = 2.0 ** -9
    if not np.array_equal(y.astype(np.float64), w):
        raise AssertionError("b32 padded decode")
    # b128: ne = [130] -> 2 blocks of 129 bytes; element 128 and 129 in block 1
    raw = bytes([127]) + bytes([0x30] * 128) + bytes([129, 0x38, 0xC0]) + bytes(126)
    y = dequantize(GGML_FP8_E4M3_B128, raw, 130, [130])
    w = np.concatenate([np.full(128, 0.5), [4.0, -8.0]])
    if y.shape != (130,) or not np.array_equal(y.astype(np.float64), w):
        raise AssertionError("b128 decode")
    # E8M0 255 -> NaN
    y = dequantize(GGML_FP8_E4M3_R32, bytes([255, 0x38]) + bytes(31), 32, [32])
    if not np.isnan(y[0]):
        raise AssertionError("E8M0 255 must be NaN")
    # writer round trip
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((3, 70)) * 5).astype(np.float32)
    for t, B in _FP8_B.items():
        enc = FP8_TYPES[t]["enc"](a)
        y = dequantize(t, enc, a.size, [70, 3]).reshape(3, 70)
        if np.max(np.abs(y - a) / (np.abs(a) + 1e-3)) > 1.0 / 16 + 1e-6:
            raise AssertionError("type %d writer round trip error too large" % t)


for _t, _B in _FP8_B.items():
    FP8_TYPES[_t] = {"nbytes": _fp8_nbytes_fn(_B), "deq": _fp8_deq_fn(_B),
                     "enc": _fp8_enc_fn(_B), "selftest": _fp8_selftest}
TYPE_NAME.update({GGML_FP8_E4M3_B128: "FP8_E4M3_B128", GGML_FP8_E4M3_B32: "FP8_E4M3_B32",
                  GGML_FP8_E4M3_R32: "FP8_E4M3_R32"})


# ----------------------------------------------------------------------------
# file reader
# ----------------------------------------------------------------------------

class TensorInfo:
    __slots__ = ("name", "ne", "type", "offset", "nbytes", "n")

    def __init__(self, name, ne, type_id, offset):
        self.name = name
        self.ne = list(ne)
        self.type = type_id
        self.offset = offset
        n = 1
        for x in ne:
            n *= x
        self.n = n
        self.nbytes = type_nbytes(type_id, n, self.ne)

    @property
    def shape(self):
        """numpy shape (row-major): reversed ne."""
        return tuple(reversed(self.ne))

    def __repr__(self):
        return "TensorInfo(%s, ne=%s, type=%s)" % (self.name, self.ne,
                                                   TYPE_NAME.get(self.type, self.type))


class _Cursor:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def need(self, k):
        if k < 0 or self.pos + k > self.size:
            raise GGUFError("truncated file at offset %d (need %d bytes)" % (self.pos, k))

    def unpack(self, fmt):
        k = struct.calcsize(fmt)
        self.need(k)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += k
        return v

    def string(self):
        n = self.unpack("<Q")
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s.decode("utf-8", errors="surrogateescape")

    def array_np(self, dt, count):
        k = np.dtype(dt).itemsize * count
        self.need(k)
        a = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
        self.pos += k
        return a


class GGUFFile:
    def __init__(self, path):
        self.path = path
        self._fh = open(path, "rb")
        try:
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise GGUFError("empty file")
        self.buf = memoryview(self._mm)
        c = _Cursor(self.buf)
        c.need(4)
        if bytes(self.buf[0:4]) != GGUF_MAGIC:
            raise GGUFError("bad magic")
        c.pos = 4
        self.version = c.unpack("<I")
        if self.version not in (2, 3):
            raise GGUFError("unsupported GGUF version %d" % self.version)
        n_tensors = c.unpack("<Q")
        n_kv = c.unpack("<Q")
        if n_tensors > (1 << 24) or n_kv > (1 << 24):
            raise GGUFError("implausible counts")
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = c.string()
            vt = c.unpack("<I")
            val, et = self._read_value(c, vt)
            self.kv[key] = val
            self.kv_types[key] = (vt, et)
        self.tensors = {}
        self.tensor_order = []
        for _ in range(n_tensors):
            name = c.string()
            nd = c.unpack("<I")
            if nd > 8:
                raise GGUFError("tensor %s: too many dims" % name)
            ne = [c.unpack("<Q") for _ in range(nd)]
            tt = c.unpack("<I")
            off = c.unpack("<Q")
            ti = TensorInfo(name, ne, tt, off)
            if name in self.tensors:
                raise GGUFError("duplicate tensor %s" % name)
            self.tensors[name] = ti
            self.tensor_order.append(name)
        self.alignment = int(self.kv.get("general.alignment", 32))
        if self.alignment <= 0 or (self.alignment & (self.alignment - 1)):
            raise GGUFError("bad alignment %d" % self.alignment)
        self.data_offset = (c.pos + self.alignment - 1) // self.alignment * self.alignment
        for ti in self.tensors.values():
            if ti.offset % self.alignment:
                raise GGUFError("tensor %s misaligned" % ti.name)
            if self.data_offset + ti.offset + ti.nbytes > len(self.buf):
                raise GGUFError("tensor %s extends past end of file" % ti.name)

    def _read_value(self, c, vt):
        if vt in _SCALAR_FMT:
            v = c.unpack(_SCALAR_FMT[vt])
            return (bool(v) if vt == T_BOOL else v), None
        if vt == T_STRING:
            return c.string(), None
        if vt == T_ARRAY:
            et = c.unpack("<I")
            n = c.unpack("<Q")
            if n > len(self.buf):
                raise GGUFError("implausible array length")
            if et in _SCALAR_NP:
                a = c.array_np(_SCALAR_NP[et], n)
                if et == T_BOOL:
                    a = a.astype(bool)
                return a, et
            if et == T_STRING:
                return [c.string() for _ in range(n)], et
            if et == T_ARRAY:
                return [self._read_value(c, T_ARRAY)[0] for _ in range(n)], et
            raise GGUFError("bad array element type %d" % et)
        raise GGUFError("bad metadata value type %d" % vt)

    def has(self, name):
        return name in self.tensors

    def raw(self, name):
        ti = self.tensors[name]
        s = self.data_offset + ti.offset
        return self.buf[s:s + ti.nbytes]

    def tensor(self, name, dtype=np.float64):
        """Dequantised tensor with numpy shape reversed(ne)."""
        ti = self.tensors[name]
        v = dequantize(ti.type, self.raw(name), ti.n, ti.ne)
        v = v.reshape(ti.shape)
        if dtype is not None and v.dtype.kind == "f":
            v = v.astype(dtype)
        return v

    def row(self, name, i):
        """Row i (along ne[1]) of a tensor of >= 2 dims, dequantised (float32)."""
        return read_row(self, name, i)

    def close(self):
        try:
            self.buf.release()
            self._mm.close()
        except Exception:
            pass
        self._fh.close()


def read_row(g, name, i):
    """Dequantise row i (the i-th run of ne[0] elements) of tensor `name`."""
    ti = g.tensors[name]
    if len(ti.ne) < 2:
        raise GGUFError("tensor %s is not a matrix" % name)
    nrows = ti.n // ti.ne[0]
    if i < 0 or i >= nrows:
        raise GGUFError("row %d out of range for %s" % (i, name))
    if ti.type in FP8_TYPES and "row" in FP8_TYPES[ti.type]:
        return FP8_TYPES[ti.type]["row"](g, ti, i)
    rb = type_nbytes(ti.type, ti.ne[0], [ti.ne[0]])
    s = g.data_offset + ti.offset + i * rb
    return dequantize(ti.type, g.buf[s:s + rb], ti.ne[0], [ti.ne[0]])


def main(argv):
    if len(argv) < 2:
        print("usage: gguf_reader.py FILE.gguf", file=sys.stderr)
        return 2
    g = GGUFFile(argv[1])
    print("version", g.version, "alignment", g.alignment, "data_offset", g.data_offset)
    for k, v in g.kv.items():
        if isinstance(v, (list, np.ndarray)) and len(v) > 16:
            v = "[%d items] %s ..." % (len(v), list(v[:8]))
        print("  %s = %s" % (k, v))
    for n in g.tensor_order:
        print(" ", g.tensors[n])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
