#!/usr/bin/python3
"""Random tiny deepseek4 / deepseek41 GGUF files for exercising dsref.py before (and
independently of) dsinfer-mkmodel.  Names and keys follow docs/model-files.md; the
shapes follow the tiny configurations of model-spec.md §7.

Usage:
  /usr/bin/python3 tests/reference/make_test_gguf.py --arch deepseek4|deepseek41 --out F.gguf
        [--seed N] [--vocab V] [--wtype f32|f16|bf16|q8_0|fp8_b32|fp8_b128] [--table f32|fp8]
Also a small GGUF writer (GGUFWriter) used by test_reference_self.py.
"""

import argparse
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as gr  # noqa: E402


# ----------------------------------------------------------------------------
# writer
# ----------------------------------------------------------------------------

def _str(b, s):
    e = s.encode("utf-8")
    b += struct.pack("<Q", len(e)) + e


class GGUFWriter:
    def __init__(self, alignment=32):
        self.kv = []           # (key, type, value, elem_type)
        self.tensors = []      # (name, ne, type, bytes)
        self.alignment = alignment

    def add(self, key, vt, value, et=None):
        self.kv.append((key, vt, value, et))

    def u32(self, k, v): self.add(k, gr.T_UINT32, int(v))
    def i32(self, k, v): self.add(k, gr.T_INT32, int(v))
    def f32(self, k, v): self.add(k, gr.T_FLOAT32, float(v))
    def bool(self, k, v): self.add(k, gr.T_BOOL, bool(v))
    def string(self, k, v): self.add(k, gr.T_STRING, v)
    def arr(self, k, et, v): self.add(k, gr.T_ARRAY, list(v), et)

    def tensor(self, name, ne, type_id, data):
        self.tensors.append((name, list(ne), type_id, bytes(data)))

    def _value(self, b, vt, v, et):
        if vt in gr._SCALAR_FMT:
            b += struct.pack(gr._SCALAR_FMT[vt], v)
        elif vt == gr.T_STRING:
            _str(b, v)
        elif vt == gr.T_ARRAY:
            b += struct.pack("<IQ", et, len(v))
            for x in v:
                self._value(b, et, x, None)
        else:
            raise ValueError(vt)

    def write(self, path):
        if self.alignment != 32:
            self.kv.insert(0, ("general.alignment", gr.T_UINT32, self.alignment, None))
        b = bytearray()
        b += b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for k, vt, v, et in self.kv:
            _str(b, k)
            b += struct.pack("<I", vt)
            self._value(b, vt, v, et)
        off = 0
        offs = []
        for name, ne, t, data in self.tensors:
            offs.append(off)
            off += (len(data) + self.alignment - 1) // self.alignment * self.alignment
        for (name, ne, t, data), o in zip(self.tensors, offs):
            _str(b, name)
            b += struct.pack("<I", len(ne))
            for x in ne:
                b += struct.pack("<Q", x)
            b += struct.pack("<IQ", t, o)
        pad = (-len(b)) % self.alignment
        b += b"\0" * pad
        for (name, ne, t, data), o in zip(self.tensors, offs):
            b += data
            b += b"\0" * ((-len(data)) % self.alignment)
        with open(path, "wb") as fh:
            fh.write(b)


# ----------------------------------------------------------------------------
# encoders (test-side quantisers; simple, not ggml's optimisers)
# ----------------------------------------------------------------------------

def enc_f16(a):
    return np.asarray(a, dtype="<f2").tobytes()


def enc_bf16(a):
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return u.tobytes()


def enc_q8_0(a):
    a = np.asarray(a, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(a).max(axis=1)
    d = (amax / 127.0).astype(np.float16)
    df = d.astype(np.float32)
    inv = np.where(df > 0, 1.0 / np.where(df > 0, df, 1), 0)
    q = np.clip(np.rint(a * inv[:, None]), -127, 127).astype(np.int8)
    out = bytearray()
    for i in range(a.shape[0]):
        out += d[i:i + 1].astype("<f2").tobytes() + q[i].tobytes()
    return bytes(out)


def encode(a, wtype):
    if wtype == "f32":
        return gr.GGML_F32, np.asarray(a, dtype="<f4").tobytes()
    if wtype == "f16":
        return gr.GGML_F16, enc_f16(a)
    if wtype == "bf16":
        return gr.GGML_BF16, enc_bf16(a)
    if wtype == "q8_0":
        return gr.GGML_Q8_0, enc_q8_0(a)
    if wtype in ("fp8_b32", "fp8_b128"):
        t = gr.GGML_FP8_E4M3_B32 if wtype == "fp8_b32" else gr.GGML_FP8_E4M3_B128
        a = np.asarray(a, dtype=np.float32)
        return t, gr.FP8_TYPES[t]["enc"](a.reshape(-1, a.shape[-1]))
    raise ValueError(wtype)


# ----------------------------------------------------------------------------
# engram helpers (§4.6)
# ----------------------------------------------------------------------------

def is_prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def engram_primes(vocab_size, layers, max_ngram, heads):
    """Per layer: for n = 2..max_ngram, for each head, the next prime above the previous
    one, starting at vocab_size-1 for each n, never reusing a prime (global seen set)."""
    seen = set()
    out = []
    for _ in layers:
        lp = []
        for _n in range(2, max_ngram + 1):
            cur = vocab_size - 1
            for _h in range(heads):
                cur += 1
                while not is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                lp.append(cur)
        out.append(lp)
    return out


def engram_multipliers(layers, max_ngram, compressed_vocab):
    bound = (np.iinfo(np.int64).max // compressed_vocab) // 2
    return [list(np.random.default_rng(10007 * L).integers(0, bound, size=max_ngram) * 2 + 1)
            for L in layers]


# ----------------------------------------------------------------------------
# tiny models
# ----------------------------------------------------------------------------

def build(arch, seed=1234, vocab=1024, wtype="f32", table="f32", n_layer=None):
    rng = np.random.default_rng(seed)
    v41 = arch == "deepseek41"
    D, H, hd, rd, Q, G, R, W = 256, 4, 128, 64, 64, 2, 32, 16
    E, k, F = 8, 2, 64
    IH, ID = 4, 128
    hc = 4
    M = (2 + hc) * hc
    if v41:
        ratios = [0, 0, 2, 2, 2, 1, 1, 1, 1, 1]
        kv_src, idx_src, cand = [2, 5], [2, 5, 7], 5
        topk = 4
        eps = 1e-20
    else:
        ratios = [0, 0, 4, 16, 4, 16]
        topk = 8
        eps = 1e-6
    L = len(ratios)
    w = GGUFWriter()
    a = arch
    w.string("general.architecture", a)
    w.string("general.name", "reference-test-" + a)
    for key, val in [("block_count", L), ("embedding_length", D), ("vocab_size", vocab),
                     ("attention.head_count", H), ("attention.head_count_kv", 1),
                     ("attention.key_length", hd), ("attention.value_length", hd),
                     ("rope.dimension_count", rd), ("attention.q_lora_rank", Q),
                     ("attention.output_lora_rank", R), ("attention.output_group_count", G),
                     ("attention.sliding_window", W), ("attention.indexer.head_count", IH),
                     ("attention.indexer.key_length", ID), ("attention.indexer.top_k", topk),
                     ("expert_count", E), ("expert_used_count", k),
                     ("expert_feed_forward_length", F), ("expert_shared_count", 1),
                     ("hash_layer_count", 0 if v41 else 3),
                     ("hyper_connection.count", hc),
                     ("hyper_connection.sinkhorn_iterations", 20),
                     ("rope.scaling.original_context_length", 64),
                     ("nextn_predict_layers", 1)]:
        w.u32("%s.%s" % (a, key), val)
    for key, val in [("rope.freq_base", 10000.0), ("attention.compress_rope_freq_base", 160000.0),
                     ("rope.scaling.factor", 16.0), ("rope.scaling.yarn_beta_fast", 32.0),
                     ("rope.scaling.yarn_beta_slow", 1.0), ("expert_weights_scale", 1.5),
                     ("attention.layer_norm_rms_epsilon", eps),
                     ("hyper_connection.epsilon", 1e-6)]:
        w.f32("%s.%s" % (a, key), val)
    w.bool(a + ".expert_weights_norm", True)
    w.arr(a + ".attention.compress_ratios", gr.T_UINT32, ratios + [0] * (3 if v41 else 1))
    w.arr(a + ".swiglu_clamp_exp", gr.T_FLOAT32, [10.0] * L)
    if v41:
        w.arr(a + ".kv_source_layer_ids", gr.T_UINT32, kv_src)
        w.arr(a + ".index_source_layer_ids", gr.T_UINT32, idx_src)
        w.u32(a + ".attention.candidate_source_layer_id", cand)
        w.u32(a + ".attention.candidate_topk_blocks", 2)
        w.u32(a + ".attention.candidate_block_size", 2)
        eng_layers, eh, ek, en, evs = [1, 3], 2, 32, 3, 1000
        primes = engram_primes(evs, eng_layers, en, eh)
        mults = engram_multipliers(eng_layers, en, vocab)
        offs = []
        for lp in primes:
            o = [0]
            for p in lp[:-1]:
                o.append(o[-1] + p)
            offs.append(o)
        w.arr(a + ".engram.layer_ids", gr.T_UINT32, eng_layers)
        w.u32(a + ".engram.head_count", eh)
        w.u32(a + ".engram.key_length", ek)
        w.u32(a + ".engram.max_ngram_size", en)
        w.arr(a + ".engram.multipliers", gr.T_UINT64, [int(x) for m in mults for x in m])
        w.arr(a + ".engram.primes", gr.T_UINT64, [p for lp in primes for p in lp])
        w.arr(a + ".engram.offsets", gr.T_UINT64, [o for lo in offs for o in lo])
        w.arr(a + ".engram.token_map", gr.T_INT32, list(range(vocab)))
        w.u32(a + ".engram.pad_id", 2)
        w.u32(a + ".engram.compressed_vocab_size", vocab)

    def t(name, shape_ne, arr, cls="mat"):
        arr = np.asarray(arr, dtype=np.float32)
        if cls == "vec":
            tid, data = gr.GGML_F32, arr.astype("<f4").tobytes()
        elif cls == "mat":
            ok = shape_ne[0] % 32 == 0 or wtype.startswith("fp8") or wtype in ("f16", "bf16")
            tid, data = encode(arr, wtype if ok else "f32")
        else:
            tid, data = encode(arr, "f32" if wtype in ("q8_0", "fp8_b32", "fp8_b128") else wtype)
        w.tensor(name, shape_ne, tid, data)

    def lin(i, o, scale=1.0):
        return rng.standard_normal((o, i)) * (scale / np.sqrt(i))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    t("token_embd.weight", [D, vocab], rng.standard_normal((vocab, D)), "embd")
    t("output_norm.weight", [D], norm(D), "vec")
    t("output.weight", [D, vocab], lin(D, vocab))
    if not v41:
        t("output_hc_fn.weight", [hc * D, hc], lin(hc * D, hc, 0.5), "small")
        t("output_hc_base.weight", [hc], 0.3 * rng.standard_normal(hc), "vec")
        t("output_hc_scale.weight", [1], [0.5], "vec")
    for il in range(L):
        b = "blk.%d." % il
        r = ratios[il]
        t(b + "attn_norm.weight", [D], norm(D), "vec")
        t(b + "ffn_norm.weight", [D], norm(D), "vec")
        t(b + "attn_q_a.weight", [D, Q], lin(D, Q))
        t(b + "attn_q_a_norm.weight", [Q], norm(Q), "vec")
        t(b + "attn_q_b.weight", [Q, H * hd], lin(Q, H * hd, 2.0))
        t(b + "attn_kv.weight", [D, hd], lin(D, hd))
        t(b + "attn_kv_a_norm.weight", [hd], norm(hd), "vec")
        t(b + "attn_sinks.weight", [H], rng.standard_normal(H), "vec")
        t(b + "attn_output_a.weight", [H * hd // G, G * R], lin(H * hd // G, G * R))
        t(b + "attn_output_b.weight", [G * R, D], lin(G * R, D))
        for s in ("attn", "ffn"):
            t(b + "hc_%s_fn.weight" % s, [hc * D, M], lin(hc * D, M, 0.5), "small")
            t(b + "hc_%s_base.weight" % s, [M], 0.3 * rng.standard_normal(M), "vec")
            t(b + "hc_%s_scale.weight" % s, [3], 0.5 + 0.2 * rng.random(3), "vec")
        if not v41 and r > 0:
            coff = 2 if r == 4 else 1
            t(b + "attn_compressor_ape.weight", [coff * hd, r],
              0.5 * rng.standard_normal((r, coff * hd)), "small")
            t(b + "attn_compressor_kv.weight", [D, coff * hd], lin(D, coff * hd), "small")
            t(b + "attn_compressor_gate.weight", [D, coff * hd], lin(D, coff * hd), "small")
            t(b + "attn_compressor_norm.weight", [hd], norm(hd), "vec")
            if r == 4:
                t(b + "indexer.attn_q_b.weight", [Q, IH * ID], lin(Q, IH * ID, 2.0), "small")
                t(b + "indexer.proj.weight", [D, IH], lin(D, IH, 4.0), "small")
                t(b + "indexer_compressor_ape.weight", [2 * ID, 4],
                  0.5 * rng.standard_normal((4, 2 * ID)), "small")
                t(b + "indexer_compressor_kv.weight", [D, 2 * ID], lin(D, 2 * ID), "small")
                t(b + "indexer_compressor_gate.weight", [D, 2 * ID], lin(D, 2 * ID), "small")
                t(b + "indexer_compressor_norm.weight", [ID], norm(ID), "vec")
        if v41:
            if il in kv_src:
                t(b + "attn_compressor_kv.weight", [D, hd], lin(D, hd), "small")
                if r > 1:
                    t(b + "attn_compressor_gate.weight", [D, hd], lin(D, hd), "small")
                t(b + "attn_compressor_norm.weight", [hd], norm(hd), "vec")
                t(b + "indexer.attn_k.weight", [hd, ID], lin(hd, ID), "small")
                t(b + "indexer.k_norm.weight", [ID], norm(ID), "vec")
            if il in idx_src:
                t(b + "indexer.attn_q_b.weight", [Q, IH * ID], lin(Q, IH * ID, 2.0), "small")
                t(b + "indexer.proj.weight", [D, IH], lin(D, IH, 4.0), "small")
            if il in eng_layers:
                ei = eng_layers.index(il)
                rows = sum(primes[ei])
                C = (en - 1) * eh
                tab = rng.standard_normal((rows, ek)).astype(np.float32)
                if table == "fp8":
                    w.tensor(b + "engram.embd.weight", [ek, rows], gr.GGML_FP8_E4M3_R32,
                             gr.FP8_TYPES[gr.GGML_FP8_E4M3_R32]["enc"](tab))
                else:
                    t(b + "engram.embd.weight", [ek, rows], tab, "small")
                t(b + "engram.wkv.weight", [C * ek, (hc + 1) * D], lin(C * ek, (hc + 1) * D))
                t(b + "engram.q.weight", [D, hc], 1.0 + 0.3 * rng.standard_normal((hc, D)), "small")
                t(b + "engram.k.weight", [D, hc], 1.0 + 0.3 * rng.standard_normal((hc, D)), "small")
        # MoE
        t(b + "ffn_gate_inp.weight", [D, E], lin(D, E, 2.0), "small")
        if v41 or il >= 3:
            t(b + "exp_probs_b.bias", [E], 0.1 * rng.standard_normal(E), "vec")
        else:
            tid = np.stack([rng.permutation(E)[:k] for _ in range(vocab)]).astype("<i4")
            w.tensor(b + "ffn_gate_tid2eid.weight", [k, vocab], gr.GGML_I32, tid.tobytes())
        t(b + "ffn_gate_exps.weight", [D, F, E], lin(D, F * E, 2.0).reshape(E, F, D))
        t(b + "ffn_up_exps.weight", [D, F, E], lin(D, F * E, 2.0).reshape(E, F, D))
        t(b + "ffn_down_exps.weight", [F, D, E], lin(F, D * E).reshape(E, D, F))
        t(b + "ffn_gate_shexp.weight", [D, F], lin(D, F, 2.0))
        t(b + "ffn_up_shexp.weight", [D, F], lin(D, F, 2.0))
        t(b + "ffn_down_shexp.weight", [F, D], lin(F, D))
    # a few draft-block tensors the reference must tolerate (and ignore)
    t("mtp.0.attn_norm.weight", [D], norm(D), "vec")
    t("mtp.0.ffn_norm.weight", [D], norm(D), "vec")
    if v41:
        t("mtp.0.main_proj.weight", [3 * D, D], lin(3 * D, D))
    else:
        t("mtp.0.e_proj.weight", [D, D], lin(D, D))
    return w


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", required=True, choices=("deepseek4", "deepseek41"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--wtype", default="f32",
                    choices=("f32", "f16", "bf16", "q8_0", "fp8_b32", "fp8_b128"))
    ap.add_argument("--table", default="f32", choices=("f32", "fp8"))
    a = ap.parse_args(argv)
    build(a.arch, a.seed, a.vocab, a.wtype, a.table).write(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
