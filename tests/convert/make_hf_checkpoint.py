#!/usr/bin/python3
"""Tiny DeepSeek V4 Flash / V4.1 Flash checkpoints in the Hugging Face layout, for the
dsinfer-convert tests. Written from model-spec §1.2 / §2 (names, dtypes, block formats), not
from the converter.

  make_hf_checkpoint.py --arch v4|v41 --out DIR [--seed N] [--shards N] [--grow K]

DIR receives config.json, tokenizer.json, model.safetensors.index.json and the shards, plus
expected.npz (not part of a real checkpoint, the converter ignores it): the dequantized f32
value of every tensor under its GGUF name, and the Engram constants DeepSeek's engram.py
would compute (token map, primes, multipliers) — what the converted file must contain.

Formats: dense FP8 = F8_E4M3 [out, in] + `.scale` F8_E8M0 [ceil(out/B), ceil(in/B)] with
B = 128 (V4) / 32 (V4.1); routed experts = I8 [out, in/2] (element 2j the low nibble) +
`.scale` F8_E8M0 [out, in/32]; Engram tables F8_E4M3 [rows, K] + `.scale` [rows, K/32];
norms BF16; mHC, sinks, biases, ape F32; tid2eid I64. --grow K multiplies the routed experts
(K times as many) to make a larger checkpoint of the same structure (memory test).
"""

import argparse
import json
import os
import re
import struct
import unicodedata

import numpy as np

# ---------------------------------------------------------------------------- formats

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3_values():
    v = np.zeros(256, np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 15, b & 7
        v[b] = s * (m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    v[0x7F] = v[0xFF] = np.nan
    return v


E4M3 = e4m3_values()
_codes = np.array([b for b in range(256) if not np.isnan(E4M3[b]) and b != 0x80])
_order = np.argsort(E4M3[_codes])
_SORTED_CODES = _codes[_order]
_SORTED_VALS = E4M3[_SORTED_CODES]


def to_e4m3(x):
    """Nearest E4M3 code (ties to the lower magnitude neighbour are fine: any valid code)."""
    x = np.clip(x, -448, 448)
    i = np.clip(np.searchsorted(_SORTED_VALS, x), 1, len(_SORTED_VALS) - 1)
    lo, hi = _SORTED_VALS[i - 1], _SORTED_VALS[i]
    pick = np.where(np.abs(x - lo) <= np.abs(hi - x), i - 1, i)
    return _SORTED_CODES[pick].astype(np.uint8)


def pow2_scale(amax, top):
    """E8M0 byte of 2^ceil(log2(amax / top)) (amax 0 -> 2^0)."""
    e = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / top)), 0).astype(np.int64)
    return np.clip(e + 127, 1, 254).astype(np.uint8)


def e8m0(b):
    return np.ldexp(1.0, b.astype(np.int64) - 127)


def fp8_tiles(w, B):
    """[out, in] f32 -> (codes, scales [ceil(out/B), ceil(in/B)], dequantized)."""
    out, inn = w.shape
    to, ti = -(-out // B), -(-inn // B)
    sc = np.zeros((to, ti), np.uint8)
    codes = np.zeros_like(w, dtype=np.uint8)
    deq = np.zeros_like(w, dtype=np.float32)
    for a in range(to):
        for b in range(ti):
            blk = w[a * B:(a + 1) * B, b * B:(b + 1) * B]
            s = pow2_scale(np.abs(blk).max(), 448.0)
            sc[a, b] = s
            c = to_e4m3(blk / e8m0(s))
            codes[a * B:(a + 1) * B, b * B:(b + 1) * B] = c
            deq[a * B:(a + 1) * B, b * B:(b + 1) * B] = (E4M3[c] * e8m0(s)).astype(np.float32)
    return codes, sc, deq


def fp8_rows32(w):
    """[rows, K] f32 -> (codes, scales [rows, K/32], dequantized): Engram tables."""
    rows, K = w.shape
    blk = w.reshape(rows, K // 32, 32)
    sc = pow2_scale(np.abs(blk).max(axis=2), 448.0)
    c = to_e4m3(blk / e8m0(sc)[:, :, None])
    deq = (E4M3[c] * e8m0(sc)[:, :, None]).astype(np.float32).reshape(rows, K)
    return c.reshape(rows, K), sc, deq


def fp4(w):
    """[out, in] f32 -> (packed I8 [out, in/2], scales [out, in/32], dequantized)."""
    out, inn = w.shape
    blk = w.reshape(out, inn // 32, 32)
    sc = pow2_scale(np.abs(blk).max(axis=2), 6.0)
    v = blk / e8m0(sc)[:, :, None]
    nib = np.abs(v[..., None] - E2M1[None, None, None, :]).argmin(axis=3).astype(np.uint8)
    deq = (E2M1[nib] * e8m0(sc)[:, :, None]).astype(np.float32).reshape(out, inn)
    nib = nib.reshape(out, inn)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed, sc, deq


def bf16(w):
    u = w.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r, (r.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------- tokenizer

CORPUS = ("the quick brown fox jumps over the lazy dog. in the beginning there was text and "
          "the model learned to read it. café naïve Ångström ÄÖÜ Ａｂｃ ﬁsh x² Σίσυφος ΣΑΣ İstanbul "
          "中文字符 日本語 emoji 😀 tabs\tand\nnew lines  double  spaces ") * 4


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
            "<｜Assistant｜>", "<think>", "</think>"]


def make_tokenizer(n_merges):
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    words = [[b2u[b] for b in w.encode("utf-8")] for w in re.findall(r" ?\S+|\s+", CORPUS)]
    merges = []
    while len(merges) < n_merges:
        pairs = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + 1
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(a + " " + b)
        vocab[a + b] = len(vocab)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                else:
                    i += 1
    added = []
    for s in SPECIALS:
        vocab[s] = len(vocab)
        added.append({"id": vocab[s], "content": s, "special": True})
    vocab["<custom>"] = len(vocab)
    added.append({"id": vocab["<custom>"], "content": "<custom>", "special": False})
    tok = {
        "version": "1.0",
        "added_tokens": [dict(a, single_word=False, lstrip=False, rstrip=False, normalized=False) for a in added],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                  "merges": [m.split(" ") for m in merges]},
    }
    return tok, vocab, {a["id"] for a in added}


def engram_key_map(vocab, added_ids, n_vocab):
    """DeepSeek's engram.py compressed map (via ds4's deepseek41_metadata.py), from Python's
    unicodedata: NFKC, NFD, strip Mn, lower, whitespace folding, strip."""
    u2b = {v: k for k, v in bytes_to_unicode().items()}
    by_id = {i: t for t, i in vocab.items()}
    sentinel = "\ue000"

    def norm(s):
        s = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", s))
        s = "".join(ch for ch in s if unicodedata.category(ch) != "Mn").lower()
        s = re.sub(r"[ \t\r\n]+", " ", s)
        s = sentinel if s == " " else s
        return s.strip().replace(sentinel, " ")

    unique, out = {}, []
    for i in range(n_vocab):
        tok = by_id.get(i, "[PAD%d]" % i)
        if i in added_ids or i not in by_id:
            text = tok
        else:
            try:
                text = bytes(u2b[ch] for ch in tok).decode("utf-8")
            except (UnicodeDecodeError, KeyError):
                text = "\ufffd"
        key = tok if "\ufffd" in text else (norm(text) or text)
        out.append(unique.setdefault(key, len(unique)))
    return np.array(out, np.int64), len(unique)


# ---------------------------------------------------------------------------- model

def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


class Gen:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.st = {}        # HF name -> (dtype, np array of the stored values)
        self.expect = {}    # GGUF name -> dequantized f32 (HF [out, in] orientation)

    def u(self, shape, a):
        return (self.rng.uniform(-1, 1, size=shape) * a).astype(np.float32)

    def lin(self, shape, gain=1.0):
        return self.u(shape, gain * np.sqrt(3.0 / shape[-1]))

    def f32(self, hf, gg, x):
        self.st[hf] = ("F32", x.astype(np.float32))
        self.expect[gg] = x.astype(np.float32)

    def bf(self, hf, gg, x):
        raw, deq = bf16(x)
        self.st[hf] = ("BF16", raw)
        self.expect[gg] = deq

    def fp8(self, hf, gg, x, B):
        c, s, deq = fp8_tiles(x, B)
        self.st[hf] = ("F8_E4M3", c)
        self.st[hf[:-len(".weight")] + ".scale"] = ("F8_E8M0", s)
        self.expect[gg] = deq

    def table(self, hf, gg, x):
        c, s, deq = fp8_rows32(x)
        self.st[hf] = ("F8_E4M3", c)
        self.st[hf[:-len(".weight")] + ".scale"] = ("F8_E8M0", s)
        self.expect[gg] = deq

    def experts(self, hpfx, gname, E, out, inn, wn, gain=1.0):
        deqs = []
        for e in range(E):
            p, s, deq = fp4(self.lin((out, inn), gain))
            self.st["%s.%d.%s.weight" % (hpfx, e, wn)] = ("I8", p.view(np.int8))
            self.st["%s.%d.%s.scale" % (hpfx, e, wn)] = ("F8_E8M0", s)
            deqs.append(deq)
        self.expect[gname] = np.stack(deqs)

    def norm(self, hf, gg, n):
        self.bf(hf, gg, 1.0 + self.u((n,), 0.1))

    def hc_base(self, hf, gg, hc):
        b = self.u((2 * hc + hc * hc,), 0.5)
        b[2 * hc:] += np.eye(hc, dtype=np.float32).reshape(-1)
        self.f32(hf, gg, b)

    def hc_scale(self, hf, gg, n):
        self.f32(hf, gg, np.array([0.5, 0.5, 1.0][:n], np.float32) + self.u((n,), 0.1))


def block(g, c, hp, gp, ratio, v41, draft, kv_src, idx_src, is_hash, E, k, B):
    D, Q, H, hd, G, R = c["hidden_size"], c["q_lora_rank"], c["num_attention_heads"], c["head_dim"], c["o_groups"], c["o_lora_rank"]
    hc, IH, ID, F, V = c["hc_mult"], c["index_n_heads"], c["index_head_dim"], c["moe_intermediate_size"], c["vocab_size"]
    M = (2 + hc) * hc
    for w in ("attn", "ffn"):
        g.f32(hp + "hc_%s_fn" % w, gp + "hc_%s_fn.weight" % w, g.lin((M, hc * D)))
        g.hc_base(hp + "hc_%s_base" % w, gp + "hc_%s_base.weight" % w, hc)
        g.hc_scale(hp + "hc_%s_scale" % w, gp + "hc_%s_scale.weight" % w, 3)
    g.norm(hp + "attn_norm.weight", gp + "attn_norm.weight", D)
    g.norm(hp + "ffn_norm.weight", gp + "ffn_norm.weight", D)
    g.f32(hp + "attn.attn_sink", gp + "attn_sinks.weight", g.u((H,), 1.0))
    g.fp8(hp + "attn.wq_a.weight", gp + "attn_q_a.weight", g.lin((Q, D)), B)
    g.norm(hp + "attn.q_norm.weight", gp + "attn_q_a_norm.weight", Q)
    g.fp8(hp + "attn.wq_b.weight", gp + "attn_q_b.weight", g.lin((H * hd, Q)), B)
    g.fp8(hp + "attn.wkv.weight", gp + "attn_kv.weight", g.lin((hd, D)), B)
    g.norm(hp + "attn.kv_norm.weight", gp + "attn_kv_a_norm.weight", hd)
    g.fp8(hp + "attn.wo_a.weight", gp + "attn_output_a.weight", g.lin((G * R, H * hd // G)), B)
    g.fp8(hp + "attn.wo_b.weight", gp + "attn_output_b.weight", g.lin((D, G * R), 0.5), B)
    if not v41 and ratio > 0:
        co = 2 if ratio == 4 else 1
        g.f32(hp + "attn.compressor.ape", gp + "attn_compressor_ape.weight", g.u((ratio, co * hd), 0.5))
        g.bf(hp + "attn.compressor.wkv.weight", gp + "attn_compressor_kv.weight", g.lin((co * hd, D)))
        g.bf(hp + "attn.compressor.wgate.weight", gp + "attn_compressor_gate.weight", g.lin((co * hd, D)))
        g.norm(hp + "attn.compressor.norm.weight", gp + "attn_compressor_norm.weight", hd)
        if ratio == 4:
            g.fp8(hp + "attn.indexer.wq_b.weight", gp + "indexer.attn_q_b.weight", g.lin((IH * ID, Q)), B)
            g.bf(hp + "attn.indexer.weights_proj.weight", gp + "indexer.proj.weight", g.lin((IH, D)))
            g.f32(hp + "attn.indexer.compressor.ape", gp + "indexer_compressor_ape.weight", g.u((4, 2 * ID), 0.5))
            g.bf(hp + "attn.indexer.compressor.wkv.weight", gp + "indexer_compressor_kv.weight", g.lin((2 * ID, D)))
            g.bf(hp + "attn.indexer.compressor.wgate.weight", gp + "indexer_compressor_gate.weight", g.lin((2 * ID, D)))
            g.norm(hp + "attn.indexer.compressor.norm.weight", gp + "indexer_compressor_norm.weight", ID)
    if v41 and kv_src:
        g.bf(hp + "attn.compressor.wkv.weight", gp + "attn_compressor_kv.weight", g.lin((hd, D)))
        if ratio > 1:
            g.bf(hp + "attn.compressor.wgate.weight", gp + "attn_compressor_gate.weight", g.lin((hd, D)))
        g.norm(hp + "attn.compressor.norm.weight", gp + "attn_compressor_norm.weight", hd)
        g.bf(hp + "attn.indexer.wk.weight", gp + "indexer.attn_k.weight", g.lin((ID, hd)))
        g.norm(hp + "attn.indexer.k_norm.weight", gp + "indexer.k_norm.weight", ID)
    if v41 and idx_src:
        g.fp8(hp + "attn.indexer.wq_b.weight", gp + "indexer.attn_q_b.weight", g.lin((IH * ID, Q)), B)
        g.bf(hp + "attn.indexer.weights_proj.weight", gp + "indexer.proj.weight", g.lin((IH, D)))
    g.bf(hp + "ffn.gate.weight", gp + "ffn_gate_inp.weight", g.lin((E, D), 2.0))
    if is_hash:
        t = np.stack([g.rng.permutation(E)[:k] for _ in range(V)]).astype(np.int64)
        g.st[hp + "ffn.gate.tid2eid"] = ("I64", t)
        g.expect[gp + "ffn_gate_tid2eid.weight"] = t.astype(np.float32)
    else:
        g.f32(hp + "ffn.gate.bias", gp + "exp_probs_b.bias", g.u((E,), 0.1))
    if v41:
        g.f32(hp + "ffn.gate.bias_vl", gp + "exp_probs_b_vl.bias", g.u((E,), 0.1))
    g.experts(hp + "ffn.experts", gp + "ffn_gate_exps.weight", E, F, D, "w1")
    g.experts(hp + "ffn.experts", gp + "ffn_up_exps.weight", E, F, D, "w3")
    g.experts(hp + "ffn.experts", gp + "ffn_down_exps.weight", E, D, F, "w2", 0.5)
    SF = c["n_shared_experts"] * F
    g.fp8(hp + "ffn.shared_experts.w1.weight", gp + "ffn_gate_shexp.weight", g.lin((SF, D)), B)
    g.fp8(hp + "ffn.shared_experts.w3.weight", gp + "ffn_up_shexp.weight", g.lin((SF, D)), B)
    g.fp8(hp + "ffn.shared_experts.w2.weight", gp + "ffn_down_shexp.weight", g.lin((D, SF), 0.5), B)


def build(arch, seed, grow):
    v41 = arch == "v41"
    g = Gen(seed)
    tok, vocab, added_ids = make_tokenizer(200)
    n_tok = len(vocab)
    c = {
        "vocab_size": n_tok if v41 else n_tok + 3, "hidden_size": 256, "moe_intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
        "q_lora_rank": 64, "o_lora_rank": 32, "o_groups": 2, "n_routed_experts": 8 * grow, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-20 if v41 else 1e-6,
        "rope_theta": 10000, "compress_rope_theta": 160000, "sliding_window": 16, "index_n_heads": 4,
        "index_head_dim": 128, "index_topk": 8 if not v41 else 4, "hc_mult": 4, "hc_eps": 1e-6,
        "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": True, "hidden_act": "silu",
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1},
    }
    B = 32 if v41 else 128
    if not v41:
        c.update({"num_hidden_layers": 4, "compress_ratios": [0, 0, 4, 128, 0], "num_hash_layers": 2,
                  "num_nextn_predict_layers": 1, "first_k_dense_replace": 0})
        ratios, kvs, ixs = c["compress_ratios"], [], []
    else:
        c.update({"num_hidden_layers": 6, "compress_ratios": [0, 0, 2, 2, 1, 1, 0, 0, 0],
                  "kv_source_layer_ids": [2, 4], "index_source_layer_ids": [2, 4, 5],
                  "candidate_source_layer_id": 4, "candidate_topk_blocks": 2, "candidate_block_size": 2,
                  "engram_layer_ids": [1, 3], "engram_max_ngram_size": 3, "engram_vocab_size": 500,
                  "engram_n_heads": 2, "engram_head_dim": 64, "engram_pad_token_id": vocab["<｜▁pad▁｜>"],
                  "num_nextn_predict_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": vocab["<｜▁pad▁｜>"],
                  "dspark_target_layer_ids": [3, 4, 5], "dspark_markov_rank": 16, "dspark_n_routed_experts": 4,
                  "dspark_num_experts_per_tok": 1})
        ratios, kvs, ixs = c["compress_ratios"], c["kv_source_layer_ids"], c["index_source_layer_ids"]
    D, V, hc, L = c["hidden_size"], c["vocab_size"], c["hc_mult"], c["num_hidden_layers"]
    exp = {}
    if v41:  # Engram constants, as DeepSeek's engram.py computes them
        tmap, ncomp = engram_key_map(vocab, added_ids, V)
        c["engram_compressed_vocab_size"] = ncomp
        seen, primes, mults = set(), [], []
        bound = (np.iinfo(np.int64).max // ncomp) // 2
        for layer in c["engram_layer_ids"]:
            row = []
            for _ in range(c["engram_max_ngram_size"] - 1):
                cur = c["engram_vocab_size"] - 1
                for _ in range(c["engram_n_heads"]):
                    cur += 1
                    while not is_prime(cur) or cur in seen:
                        cur += 1
                    seen.add(cur)
                    row.append(cur)
            primes.append(row)
            mults.append((np.random.default_rng(10007 * layer).integers(0, bound, size=c["engram_max_ngram_size"],
                                                                         dtype=np.int64) * 2 + 1))
        c["engram_num_embeddings"] = [sum(r) for r in primes]
        exp.update(engram_token_map=tmap, engram_primes=np.array(primes, np.int64).reshape(-1),
                   engram_multipliers=np.array(mults, np.int64).reshape(-1),
                   engram_pad_id=np.array([tmap[c["engram_pad_token_id"]]]))
    g.bf("embed.weight", "token_embd.weight", g.u((V, D), 1.7))
    for i in range(L):
        hp, gp = "layers.%d." % i, "blk.%d." % i
        block(g, c, hp, gp, ratios[i], v41, False, i in kvs, i in ixs, not v41 and i < c.get("num_hash_layers", 0),
              c["n_routed_experts"], c["num_experts_per_tok"], B)
        if v41 and i in c["engram_layer_ids"]:
            j = c["engram_layer_ids"].index(i)
            K, C = c["engram_head_dim"], (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
            g.table(hp + "engram.embed.weight", gp + "engram.embd.weight", g.u((c["engram_num_embeddings"][j], K), 1.7))
            g.fp8(hp + "engram.wkv.weight", gp + "engram.wkv.weight", g.lin(((hc + 1) * D, C * K), 0.5), B)
            g.bf(hp + "engram.q_weight", gp + "engram.q.weight", 1.0 + g.u((hc, D), 0.5))
            g.bf(hp + "engram.k_weight", gp + "engram.k.weight", 1.0 + g.u((hc, D), 0.5))
    if not v41:
        block(g, c, "mtp.0.", "mtp.0.", 0, False, True, False, False, False, c["n_routed_experts"],
              c["num_experts_per_tok"], B)
        g.fp8("mtp.0.e_proj.weight", "mtp.0.e_proj.weight", g.lin((D, D), 0.7), B)
        g.fp8("mtp.0.h_proj.weight", "mtp.0.h_proj.weight", g.lin((D, D), 0.7), B)
        for n in ("enorm", "hnorm", "norm"):
            g.norm("mtp.0.%s.weight" % n, "mtp.0.%s.weight" % n, D)
        g.f32("mtp.0.hc_head_fn", "mtp.0.hc_head_fn.weight", g.lin((hc, hc * D)))
        g.f32("mtp.0.hc_head_base", "mtp.0.hc_head_base.weight", g.u((hc,), 0.5))
        g.hc_scale("mtp.0.hc_head_scale", "mtp.0.hc_head_scale.weight", 1)
        g.f32("hc_head_fn", "output_hc_fn.weight", g.lin((hc, hc * D)))
        g.f32("hc_head_base", "output_hc_base.weight", g.u((hc,), 0.5))
        g.hc_scale("hc_head_scale", "output_hc_scale.weight", 1)
    else:
        T, rk = len(c["dspark_target_layer_ids"]), c["dspark_markov_rank"]
        for d in range(3):
            p = "mtp.%d." % d
            block(g, c, p, p, 0, True, True, False, False, False, c["dspark_n_routed_experts"],
                  c["dspark_num_experts_per_tok"], B)
        g.fp8("mtp.0.main_proj.weight", "mtp.0.main_proj.weight", g.lin((D, T * D)), B)
        g.norm("mtp.0.main_norm.weight", "mtp.0.main_norm.weight", D)
        g.norm("mtp.2.norm.weight", "mtp.2.norm.weight", D)
        g.bf("mtp.2.markov_head.embed.weight", "mtp.2.markov_embd.weight", g.u((V, rk), 1.7))
        g.bf("mtp.2.markov_head.head.weight", "mtp.2.markov_head.weight", g.lin((V, rk), 0.5))
        g.bf("mtp.2.confidence_head.proj.weight", "mtp.2.confidence_proj.weight", g.lin((1, D + rk)))
        # vision parts the text model does not use
        g.st["vision.patch_embed.weight"] = ("BF16", bf16(g.u((8, 16), 1.0))[0])
        g.st["aligner.w1.weight"] = ("BF16", bf16(g.u((8, 8), 1.0))[0])
        g.st["image_newline"] = ("F32", g.u((8,), 1.0))
    g.norm("norm.weight", "output_norm.weight", D)
    g.bf("head.weight", "output.weight", g.lin((V, D), 3.0))
    cfg = dict(c, architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", bos_token_id=vocab[SPECIALS[0]],
               eos_token_id=vocab[SPECIALS[1]],
               quantization_config={"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "weight_block_size": [B, B]}, expert_dtype="fp4")
    if v41:
        text = dict(c, model_type="deepseek_v41_text")
        cfg = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "text_config": text,
               "bos_token_id": vocab[SPECIALS[0]], "eos_token_id": vocab[SPECIALS[1]],
               "pad_token_id": vocab[SPECIALS[2]], "image_token_id": V - 1,
               "vision_config": {"num_hidden_layers": 1},
               "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                       "weight_block_size": [B, B], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}}
    return g, cfg, tok, exp


def write_safetensors(path, items):
    header, off, blobs = {}, 0, []
    for name, (dt, arr) in items:
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=("v4", "v41"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--grow", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    g, cfg, tok, exp = build(a.arch, a.seed, a.grow)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    names = sorted(g.st)
    per = -(-len(names) // a.shards)
    wm = {}
    for s in range(a.shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
        part = names[s * per:(s + 1) * per]
        write_safetensors(os.path.join(a.out, fn), [(n, g.st[n]) for n in part])
        for n in part:
            wm[n] = fn
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f, indent=1)
    np.savez(os.path.join(a.out, "expected.npz"), **{("t:" + k): v for k, v in g.expect.items()}, **exp)


if __name__ == "__main__":
    main()
