"""Tensor names, layouts and types of the exported models (docs/model-files.md §3, §4), and a
small GGUF reader for loading an exported file back into the PyTorch model.

A torch weight is stored [out, in] (HF layout); GGUF `ne` lists dims fastest first, so the
same memory is ne = [in, out] — no transpose. Expert stacks [E, out, in] are ne = [in, out, E].
"""
import struct

import numpy as np
import torch

import model as M

F32, F16, Q8_0, I32, FP8_R32 = 0, 1, 8, 26, 1026


def _mat_type(ne0):
    return Q8_0 if ne0 % 32 == 0 else F32


def tensors(m):
    """Yields (gguf name, torch tensor in HF layout, gguf type) for every exported tensor."""
    cfg = m.cfg
    yield "token_embd.weight", m.embed, F16

    def block(pfx, blk):
        at = blk.attn
        yield pfx + "attn_norm.weight", blk.attn_norm.weight, F32
        yield pfx + "attn_q_a.weight", at.wq_a, _mat_type(cfg.dim)
        yield pfx + "attn_q_a_norm.weight", at.q_norm.weight, F32
        yield pfx + "attn_q_b.weight", at.wq_b, _mat_type(cfg.q_lora)
        yield pfx + "attn_kv.weight", at.wkv, _mat_type(cfg.dim)
        yield pfx + "attn_kv_a_norm.weight", at.kv_norm.weight, F32
        yield pfx + "attn_sinks.weight", at.sink, F32
        yield pfx + "attn_output_a.weight", at.wo_a, _mat_type(at.wo_a.shape[1])
        yield pfx + "attn_output_b.weight", at.wo_b, _mat_type(at.wo_b.shape[1])
        for w, hc in (("attn", blk.hc_attn), ("ffn", blk.hc_ffn)):
            yield pfx + "hc_%s_fn.weight" % w, hc.fn, F32
            yield pfx + "hc_%s_base.weight" % w, hc.base, F32
            yield pfx + "hc_%s_scale.weight" % w, hc.scale, F32
        r = blk.ratio
        if not cfg.v41 and r > 0:
            yield pfx + "attn_compressor_ape.weight", at.c_ape, F32
            yield pfx + "attn_compressor_kv.weight", at.c_wkv, F32
            yield pfx + "attn_compressor_gate.weight", at.c_wgate, F32
            yield pfx + "attn_compressor_norm.weight", at.c_norm.weight, F32
            if r == 4:
                yield pfx + "indexer.attn_q_b.weight", at.i_wq_b, F32
                yield pfx + "indexer.proj.weight", at.i_proj, F32
                yield pfx + "indexer_compressor_ape.weight", at.i_ape, F32
                yield pfx + "indexer_compressor_kv.weight", at.i_wkv, F32
                yield pfx + "indexer_compressor_gate.weight", at.i_wgate, F32
                yield pfx + "indexer_compressor_norm.weight", at.i_norm.weight, F32
        if cfg.v41 and at.kv_source:
            yield pfx + "attn_compressor_kv.weight", at.c_wkv, F32
            if r > 1:
                yield pfx + "attn_compressor_gate.weight", at.c_wgate, F32
            yield pfx + "attn_compressor_norm.weight", at.c_norm.weight, F32
            yield pfx + "indexer.attn_k.weight", at.i_wk, F32
            yield pfx + "indexer.k_norm.weight", at.i_k_norm.weight, F32
        if cfg.v41 and at.index_source:
            yield pfx + "indexer.attn_q_b.weight", at.i_wq_b, F32
            yield pfx + "indexer.proj.weight", at.i_proj, F32
        moe = blk.moe
        yield pfx + "ffn_norm.weight", blk.ffn_norm.weight, F32
        yield pfx + "ffn_gate_inp.weight", moe.gate, F32
        if moe.hash:
            yield pfx + "ffn_gate_tid2eid.weight", moe.tid2eid, I32
        else:
            yield pfx + "exp_probs_b.bias", moe.bias, F32
        yield pfx + "ffn_gate_exps.weight", moe.w1, _mat_type(cfg.dim)
        yield pfx + "ffn_up_exps.weight", moe.w3, _mat_type(cfg.dim)
        yield pfx + "ffn_down_exps.weight", moe.w2, _mat_type(cfg.ff)
        yield pfx + "ffn_gate_shexp.weight", moe.s1, _mat_type(cfg.dim)
        yield pfx + "ffn_up_shexp.weight", moe.s3, _mat_type(cfg.dim)
        yield pfx + "ffn_down_shexp.weight", moe.s2, _mat_type(moe.s2.shape[1])

    for i, blk in enumerate(m.layers):
        pfx = "blk.%d." % i
        yield from block(pfx, blk)
        if str(i) in m.engram:
            e = m.engram[str(i)]
            yield pfx + "engram.embd.weight", e.table, FP8_R32
            yield pfx + "engram.wkv.weight", e.wkv, _mat_type(e.wkv.shape[1])
            yield pfx + "engram.q.weight", e.q, F32
            yield pfx + "engram.k.weight", e.k, F32
    if not cfg.v41 and cfg.n_mtp:
        yield from block("mtp.0.", m.drafts[0])
        yield "mtp.0.e_proj.weight", m.e_proj, _mat_type(cfg.dim)
        yield "mtp.0.h_proj.weight", m.h_proj, _mat_type(cfg.dim)
        yield "mtp.0.enorm.weight", m.enorm.weight, F32
        yield "mtp.0.hnorm.weight", m.hnorm.weight, F32
        yield "mtp.0.norm.weight", m.mtp_norm.weight, F32
        yield "mtp.0.hc_head_fn.weight", m.mtp_hc_fn, F32
        yield "mtp.0.hc_head_base.weight", m.mtp_hc_base, F32
        yield "mtp.0.hc_head_scale.weight", m.mtp_hc_scale, F32
    if cfg.v41 and cfg.n_dspark:
        last = cfg.n_dspark - 1
        for d, blk in enumerate(m.drafts):
            pfx = "mtp.%d." % d
            yield from block(pfx, blk)
            if d == 0:
                yield "mtp.0.main_proj.weight", m.main_proj, _mat_type(m.main_proj.shape[1])
                yield "mtp.0.main_norm.weight", m.main_norm.weight, F32
            if d == last:
                yield pfx + "norm.weight", m.draft_norm.weight, F32
                yield pfx + "markov_embd.weight", m.markov_embed, F32
                yield pfx + "markov_head.weight", m.markov_head, F32
                yield pfx + "confidence_proj.weight", m.conf_proj, F32
    yield "output_norm.weight", m.norm.weight, F32
    yield "output.weight", m.head, _mat_type(cfg.dim)
    if not cfg.v41:
        yield "output_hc_fn.weight", m.hc_head_fn, F32
        yield "output_hc_base.weight", m.hc_head_base, F32
        yield "output_hc_scale.weight", m.hc_head_scale, F32


def gguf_ne(t):
    return list(reversed(list(t.shape)))


# ---------------------------------------------------------------------------------------
# Reader (enough for our own files: GGUF v3, types F32 F16 Q8_0 I32 FP8_E4M3_R32)
# ---------------------------------------------------------------------------------------

class GGUF:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        b = self.buf
        magic, ver, nt, nkv = struct.unpack_from("<IIQQ", b, 0)
        if magic != 0x46554747 or ver != 3:
            raise ValueError("%s: not a GGUF v3 file" % path)
        self.off = 24
        self.kv = {}
        for _ in range(nkv):
            k = self._str()
            t = self._u32()
            self.kv[k] = self._val(t)
        self.tensors = {}
        for _ in range(nt):
            name = self._str()
            nd = self._u32()
            ne = list(struct.unpack_from("<%dq" % nd, b, self.off))
            self.off += 8 * nd
            typ = self._u32()
            off = struct.unpack_from("<Q", b, self.off)[0]
            self.off += 8
            self.tensors[name] = (ne, typ, off)
        align = self.kv.get("general.alignment", 32)
        self.data = (self.off + align - 1) // align * align

    def _u32(self):
        v = struct.unpack_from("<I", self.buf, self.off)[0]
        self.off += 4
        return v

    def _str(self):
        n = struct.unpack_from("<Q", self.buf, self.off)[0]
        s = self.buf[self.off + 8:self.off + 8 + n].decode("utf-8")
        self.off += 8 + n
        return s

    _fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def _val(self, t):
        if t == 8:
            return self._str()
        if t == 9:
            et = self._u32()
            n = struct.unpack_from("<Q", self.buf, self.off)[0]
            self.off += 8
            if et == 8:
                return [self._str() for _ in range(n)]
            f = self._fmt[et]
            v = list(struct.unpack_from("<%d%s" % (n, f), self.buf, self.off))
            self.off += n * struct.calcsize(f)
            return v
        f = self._fmt[t]
        v = struct.unpack_from("<" + f, self.buf, self.off)[0]
        self.off += struct.calcsize(f)
        return v

    def tensor(self, name):
        """Dequantised tensor as float32 (int64 for I32) numpy, shape = reversed ne."""
        ne, typ, off = self.tensors[name]
        n = int(np.prod(ne))
        rows = n // ne[0]
        p = self.data + off
        if typ == F32:
            a = np.frombuffer(self.buf, np.float32, n, p).copy()
        elif typ == F16:
            a = np.frombuffer(self.buf, np.float16, n, p).astype(np.float32)
        elif typ == I32:
            a = np.frombuffer(self.buf, np.int32, n, p).astype(np.int64)
        elif typ == Q8_0:
            nb = n // 32
            raw = np.frombuffer(self.buf, np.uint8, nb * 34, p).reshape(nb, 34)
            d = raw[:, :2].copy().view(np.float16).astype(np.float32)
            q = raw[:, 2:].copy().view(np.int8).astype(np.float32)
            a = (q * d).reshape(-1)
        elif typ == FP8_R32:
            bpr = (ne[0] + 31) // 32
            raw = np.frombuffer(self.buf, np.uint8, rows * bpr * 33, p).reshape(rows, bpr, 33)
            e = raw[:, :, 0].astype(np.int32)
            scale = np.where(e == 0, 2.0 ** -127, np.ldexp(1.0, e - 127)).astype(np.float64)
            v = e4m3_decode(raw[:, :, 1:])
            a = (v * scale[:, :, None]).reshape(rows, bpr * 32)[:, :ne[0]].astype(np.float32).reshape(-1)
        else:
            raise ValueError("tensor %s: type %d not handled" % (name, typ))
        return a.reshape(list(reversed(ne)))


def e4m3_decode(c):
    c = c.astype(np.int32)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * np.ldexp(1.0, e - 7))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return s * v


def load_weights(m, path):
    """Copies the (dequantised) weights of an exported GGUF into model m, in place."""
    g = GGUF(path)
    seen = set()
    with torch.no_grad():
        for name, t, _typ in tensors(m):
            a = g.tensor(name)
            if list(a.shape) != list(t.shape):
                raise ValueError("%s: shape %s in file, %s in model" % (name, a.shape, tuple(t.shape)))
            t.copy_(torch.from_numpy(a).to(t.dtype))
            seen.add(name)
    extra = set(g.tensors) - seen
    if extra:
        raise ValueError("unexpected tensors in %s: %s" % (path, sorted(extra)[:5]))
    return g
