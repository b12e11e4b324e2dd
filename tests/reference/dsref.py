#!/usr/bin/python3
"""Independent NumPy reference forward pass for DeepSeek V4 Flash (`deepseek4`) and
DeepSeek V4.1 Flash (`deepseek41`), written from docs/model-spec.md (§3, §4, §10) only.

Token by token, one position at a time, keeping the per-layer window rings,
compressor state, compressed rows and index keys exactly as the spec describes.
Math in float64; the FP8/FP4 fake-quant recipes of §10.1 run in float32.
See docs/reference.md.

CLI:
  /usr/bin/python3 tests/reference/dsref.py --model M.gguf (--tokens 1,2,3 | --tokens-file F)
      --out LOGITS.bin [--no-fake-quant] [--positions all|last]
writes little-endian float32 [n_positions][n_vocab].

Library:
  from dsref import Model
  m = Model("tiny-v4.gguf", fake_quant=True)
  logits = m.forward([1, 2, 3])            # float64 [3][n_vocab]
  st = m.new_state(); m.forward_token(st, 1); m.forward_token(st, 2)
  ids, draft_logits = m.draft(st, 3)       # §3.7 MTP / §4.5 DSpark drafts after [1, 2] + 3
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_reader as gr  # noqa: E402

F32 = np.float32
F64 = np.float64

# ============================================================================
# §10.1 fake-quant primitives (float32 semantics)
# ============================================================================

E4M3_MAX = F32(448.0)
E2M1_MAX = F32(6.0)


def pow2_ceil(v):
    """2^ceil(log2 v) for positive float32 v, exact (a power of two maps to itself)."""
    v = np.asarray(v, dtype=F32)
    m, e = np.frexp(v)                 # v = m * 2^e, m in [0.5, 1)
    e = np.where(m == 0.5, e - 1, e)   # exact power of two
    return np.ldexp(np.ones_like(v), e).astype(F32)


def e4m3_rne(v):
    """Round float32 values (|v| <= 448) to the E4M3FN grid, round-to-nearest-even.
    Normal binade [2^k, 2^(k+1)) has step 2^(k-3); below 2^-6 the subnormal step is 2^-9."""
    v = np.asarray(v, dtype=F32)
    _, e = np.frexp(v)                 # |v| in [2^(e-1), 2^e)
    ulp = np.ldexp(np.ones_like(v), np.maximum(e - 4, -9)).astype(F32)
    return (np.rint(v / ulp) * ulp).astype(F32)


def e2m1_rne(v):
    """Round float32 values (|v| <= 6) to the E2M1 grid {0,.5,1,1.5,2,3,4,6}, RNE.
    Binade [2^k, 2^(k+1)) (k >= 0) has step 2^(k-1); below 1 the step is 0.5."""
    v = np.asarray(v, dtype=F32)
    _, e = np.frexp(v)
    ulp = np.ldexp(np.ones_like(v), np.maximum(e - 2, -1)).astype(F32)
    return (np.rint(v / ulp) * ulp).astype(F32)


def bf16_rne(v):
    """Round float32 values to bfloat16 (round-to-nearest-even), returned as float32."""
    v = np.ascontiguousarray(np.asarray(v, dtype=F32))
    u = v.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1
    u = (u + 0x7FFF + lsb) >> 16 << 16
    out = u.astype(np.uint32).view(F32)
    return np.where(np.isnan(v), v, out)


# Midpoint tracing (--trace-midpoints): when TRACE is a list, every fake-quant call appends
# (tag, margin) where margin = min over elements of | frac(x/s / step) - 0.5 |, i.e. how far
# (in grid steps) the closest element sat from a rounding midpoint (0 = exactly on one).
TRACE = None
TRACE_TAG = ""


def _trace(y, kind):
    if TRACE is None:
        return
    y = np.asarray(y, dtype=F32)
    _, e = np.frexp(y)
    if kind == "e4m3":
        step = np.ldexp(np.ones_like(y), np.maximum(e - 4, -9))
    else:
        step = np.ldexp(np.ones_like(y), np.maximum(e - 2, -1))
    t = (y / step).astype(F64)
    frac = t - np.floor(t)
    TRACE.append((TRACE_TAG + "/" + kind, float(np.min(np.abs(frac - 0.5)))))


# Quantiser dump (--trace-quant): when QDUMP is an open binary file, every fake-quant call
# writes its position, layer, site, recipe, block, element count, then its float32 input x
# (before the block scale) and float32 output.  The model tests compare these, call by call,
# with libdsinfer's own quantiser inputs and decisions (tests/common/fq_trace.c).
QDUMP = None
QDUMP_AT = (-1, -1, -1)          # (position, layer, site) of the current call
QSITES = {"window-kv": 0, "compressed-kv": 1, "index-key": 2, "index-q": 3}
R_E4M3_UE8M0, R_E2M1_UE8M0, R_E2M1_E4M3 = 0, 1, 2   # numbering of backends/backend.h


def _qdump(recipe, block, x32, out):
    if QDUMP is None:
        return
    x32 = np.ascontiguousarray(x32, dtype="<f4").reshape(-1)
    out = np.ascontiguousarray(out, dtype="<f4").reshape(-1)
    pos, il, site = QDUMP_AT
    np.array([pos, il, site, recipe, block, x32.size], dtype="<i4").tofile(QDUMP)
    x32.tofile(QDUMP)
    out.tofile(QDUMP)


def fq_fp8_ue8m0(x, block, fake=True):
    """§10.1 e4m3 with UE8M0 (power-of-two) block scale.  x: 1-D, len % block == 0."""
    x32 = np.asarray(x, dtype=F32).reshape(-1, block)
    amax = np.maximum(np.abs(x32).max(axis=1), F32(1e-4))
    s = pow2_ceil((amax * F32(1.0 / 448.0)).astype(F32))[:, None]
    y = np.clip((x32 / s).astype(F32), -E4M3_MAX, E4M3_MAX)
    _trace(y, "e4m3")
    if fake:
        y = e4m3_rne(y)
    out = (y * s).astype(F32)
    _qdump(R_E4M3_UE8M0, block, x32, out)
    return out.reshape(np.shape(x))


def fq_fp4_ue8m0(x, block, fake=True):
    """§10.1 e2m1 with UE8M0 block scale (indexer q/k)."""
    x32 = np.asarray(x, dtype=F32).reshape(-1, block)
    amax = np.maximum(np.abs(x32).max(axis=1), F32(6.0 * 2.0 ** -126))
    s = pow2_ceil((amax * F32(1.0 / 6.0)).astype(F32))[:, None]
    y = np.clip((x32 / s).astype(F32), -E2M1_MAX, E2M1_MAX)
    _trace(y, "e2m1")
    if fake:
        y = e2m1_rne(y)
    out = (y * s).astype(F32)
    _qdump(R_E2M1_UE8M0, block, x32, out)
    return out.reshape(np.shape(x))


def fq_fp4_e4m3(x, block, fake=True):
    """§10.1 e2m1 with E4M3 block scale (V4.1 compressed KV rows, block 16).
    The scale is always rounded to e4m3 (it is a stored format, not an activation
    rounding); --no-fake-quant only drops the e2m1 rounding of x/s (§10.4)."""
    x32 = np.asarray(x, dtype=F32).reshape(-1, block)
    amax = np.maximum(np.abs(x32).max(axis=1), F32(6.0 * 2.0 ** -9))
    sc = np.minimum((amax / F32(6.0)).astype(F32), E4M3_MAX)
    _trace(sc, "e4m3-scale")
    s = e4m3_rne(sc)[:, None]
    y = np.clip((x32 / s).astype(F32), -E2M1_MAX, E2M1_MAX)
    _trace(y, "e2m1")
    if fake:
        y = e2m1_rne(y)
    out = (y * s).astype(F32)
    _qdump(R_E2M1_E4M3, block, x32, out)
    return out.reshape(np.shape(x))


# ============================================================================
# other primitives (float64)
# ============================================================================

def rmsnorm(x, w, eps):
    x = np.asarray(x, dtype=F64)
    r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return r * w if w is not None else r


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def silu(x):
    return x * sigmoid(x)


def hadamard_matrix(n):
    """Normalised Walsh-Hadamard matrix (Sylvester order), H @ H = I."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != n:
        raise ValueError("Hadamard size must be a power of two")
    return h / math.sqrt(n)


def rope_freqs(rd, base, yarn=None):
    """Per-pair frequencies f_i, i = 0..rd/2-1 (§3.9).  yarn = (factor, L0, beta_fast,
    beta_slow) or None.  No mscale."""
    i = np.arange(rd // 2, dtype=F64)
    f = base ** (-2.0 * i / rd)
    if yarn is not None:
        factor, L0, bfast, bslow = yarn
        lo, hi = yarn_low_high(rd, base, L0, bfast, bslow)
        if lo == hi:
            hi = hi + 0.001
        ramp = np.clip((i - lo) / (hi - lo), 0.0, 1.0)
        f = f / factor * ramp + f * (1.0 - ramp)
    return f


def yarn_low_high(rd, base, L0, bfast, bslow):
    def corr(b):
        return rd * math.log(L0 / (2.0 * math.pi * b)) / (2.0 * math.log(base))
    lo = max(math.floor(corr(bfast)), 0)
    hi = min(math.ceil(corr(bslow)), rd - 1)
    return lo, hi


def rope_tail(x, pos, freqs, inverse=False):
    """Interleaved-pair RoPE on the last 2*len(freqs) dims of x (last axis)."""
    rd = 2 * len(freqs)
    x = np.array(x, dtype=F64, copy=True)
    t = x[..., -rd:]
    th = pos * freqs
    c = np.cos(th)
    s = np.sin(th)
    if inverse:
        s = -s
    x0 = t[..., 0::2].copy()
    x1 = t[..., 1::2].copy()
    t[..., 0::2] = x0 * c - x1 * s
    t[..., 1::2] = x0 * s + x1 * c
    x[..., -rd:] = t
    return x


def topk_lowest_first(scores, k):
    """Indices of the k largest scores; equal scores: lowest index first (§10.2)."""
    order = np.argsort(-np.asarray(scores, dtype=F64), kind="stable")
    return order[:k]


def sinkhorn_split(mix, scale, base, n_hc, iters, eps):
    """§3.3 hc_split_sinkhorn.  mix: [(2+n_hc)*n_hc]."""
    pre = sigmoid(mix[0:n_hc] * scale[0] + base[0:n_hc]) + eps
    post = 2.0 * sigmoid(mix[n_hc:2 * n_hc] * scale[1] + base[n_hc:2 * n_hc])
    c = (mix[2 * n_hc:] * scale[2] + base[2 * n_hc:]).reshape(n_hc, n_hc)
    c = c - c.max(axis=1, keepdims=True)
    c = np.exp(c)
    c = c / c.sum(axis=1, keepdims=True) + eps
    c = c / (c.sum(axis=0, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=1, keepdims=True) + eps)
        c = c / (c.sum(axis=0, keepdims=True) + eps)
    return pre, post, c


def sink_attention(q, rows, sink, scale):
    """q [H, hd], rows [N, hd] (K = V), sink [H] -> o [H, hd]."""
    z = (q @ rows.T) * scale
    m = np.maximum(sink, z.max(axis=1))
    e = np.exp(z - m[:, None])
    den = np.exp(sink - m) + e.sum(axis=1)
    return (e @ rows) / den[:, None]


# ============================================================================
# GGUF naming (docs/model-files.md)
# ============================================================================

class ModelError(Exception):
    pass


def _blk(il, s):
    # a backbone layer is an int; a draft block (model-files.md §4) its prefix "mtp.i"
    if isinstance(il, str):
        return "%s.%s" % (il, s)
    return "blk.%d.%s" % (il, s)


# ============================================================================
# Model
# ============================================================================

class Model:
    def __init__(self, path, fake_quant=True):
        self.path = path
        self.fake = bool(fake_quant)
        self.g = gr.GGUFFile(path)
        self.arch = self.g.kv.get("general.architecture")
        if self.arch not in ("deepseek4", "deepseek41"):
            raise ModelError("unsupported general.architecture %r" % (self.arch,))
        self._cache = {}
        self._read_config()
        self._validate_tensors()

    # ------------------------------------------------------------------ metadata
    # alternative spellings accepted (docs/model-files.md §2.2)
    _ALT = {
        "hyper_connection.sinkhorn_iterations": ["hyper_connection.sinkhorn_iters"],
        "attention.indexer.head_count": ["indexer.head_count"],
        "attention.indexer.key_length": ["attention.indexer.head_dim", "indexer.key_length",
                                         "indexer.head_dim"],
        "attention.indexer.top_k": ["indexer.top_k"],
    }

    def _k(self, key, default=None, required=True):
        for kk in [key] + self._ALT.get(key, []):
            full = "%s.%s" % (self.arch, kk)
            if full in self.g.kv:
                return self.g.kv[full]
        if required and default is None:
            raise ModelError("missing metadata key %s.%s" % (self.arch, key))
        return default

    def n_vocab_meta(self):
        return int(self.g.tensors["token_embd.weight"].ne[1])

    def _read_config(self):
        k = self._k
        emb = self.g.tensors.get("token_embd.weight")
        if emb is None or len(emb.ne) != 2:
            raise ModelError("missing or malformed tensor token_embd.weight")
        self.n_vocab = int(emb.ne[1])
        vs = k("vocab_size", None, required=False)
        if vs is not None and int(vs) != self.n_vocab:
            raise ModelError("vocab_size %d != token_embd rows %d" % (int(vs), self.n_vocab))
        self.n_layer = int(k("block_count"))
        # llama.cpp nextn convention: MTP block counted in block_count (model-files.md §4.1)
        nn = int(k("nextn_predict_layers", 0, required=False) or 0)
        if nn > 0 and self.g.has("blk.%d.nextn.eh_proj.weight" % (self.n_layer - 1)):
            self.n_layer -= nn
        self.dim = int(k("embedding_length"))
        self.n_head = int(k("attention.head_count"))
        self.hd = int(k("attention.key_length"))
        vl = int(k("attention.value_length", self.hd))
        if vl != self.hd:
            raise ModelError("value_length != key_length")
        self.rd = int(k("rope.dimension_count"))
        self.q_lora = int(k("attention.q_lora_rank"))
        self.o_lora = int(k("attention.output_lora_rank"))
        self.o_groups = int(k("attention.output_group_count"))
        self.window = int(k("attention.sliding_window"))
        self.n_exp = int(k("expert_count"))
        self.n_used = int(k("expert_used_count"))
        self.inter = int(k("expert_feed_forward_length"))
        self.n_shared = int(k("expert_shared_count", 1))
        self.idx_heads = int(k("attention.indexer.head_count"))
        self.idx_dim = int(k("attention.indexer.key_length"))
        self.idx_topk = int(k("attention.indexer.top_k"))
        self.n_hc = int(k("hyper_connection.count"))
        self.sk_iters = int(k("hyper_connection.sinkhorn_iterations"))
        self.hc_eps = float(k("hyper_connection.epsilon"))
        self.rms_eps = float(k("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(k("rope.freq_base"))
        self.crope_base = float(k("attention.compress_rope_freq_base"))
        self.yarn_factor = float(k("rope.scaling.factor", 1.0))
        self.yarn_L0 = float(k("rope.scaling.original_context_length", 0.0))
        self.yarn_bfast = float(k("rope.scaling.yarn_beta_fast", 32.0))
        self.yarn_bslow = float(k("rope.scaling.yarn_beta_slow", 1.0))
        self.route_scale = float(k("expert_weights_scale", 1.0))
        if not bool(k("expert_weights_norm", True, required=False)):
            raise ModelError("expert_weights_norm must be true (§3.5)")
        gf = k("expert_gating_func", None, required=False)
        if gf is not None and int(gf) != 4:
            raise ModelError("expert_gating_func %d is not sqrt-softplus (4)" % int(gf))
        for key in ("expert_group_count", "expert_group_used_count", "leading_dense_block_count"):
            v = k(key, None, required=False)
            if v is not None and int(v) != 0:
                raise ModelError("%s.%s must be 0" % (self.arch, key))
        if int(k("attention.head_count_kv", 1, required=False)) != 1:
            raise ModelError("attention.head_count_kv must be 1")
        ratios = [int(x) for x in k("attention.compress_ratios")]
        if len(ratios) < self.n_layer:
            raise ModelError("compress_ratios has %d entries < block_count %d"
                             % (len(ratios), self.n_layer))
        self.ratios = ratios
        clamp = k("swiglu_clamp_exp", None, required=False)
        if clamp is None:
            self.swiglu_limit = [10.0] * self.n_layer
        elif np.ndim(clamp) == 0:
            self.swiglu_limit = [float(clamp)] * self.n_layer
        else:
            self.swiglu_limit = [float(x) for x in clamp]
        clamp_sh = k("swiglu_clamp_shexp", None, required=False)
        if clamp_sh is None:
            self.swiglu_limit_sh = list(self.swiglu_limit)
        elif np.ndim(clamp_sh) == 0:
            self.swiglu_limit_sh = [float(clamp_sh)] * self.n_layer
        else:
            self.swiglu_limit_sh = [float(x) for x in clamp_sh]
        if len(self.swiglu_limit) < self.n_layer or len(self.swiglu_limit_sh) < self.n_layer:
            raise ModelError("swiglu_clamp_exp / _shexp has fewer entries than block_count")
        if self.arch == "deepseek4":
            self.n_hash = int(k("hash_layer_count", 0))
        else:
            self.n_hash = 0
            self.kv_sources = [int(x) for x in k("kv_source_layer_ids")]
            self.index_sources = [int(x) for x in k("index_source_layer_ids")]
            self.cand_source = int(k("attention.candidate_source_layer_id", -1))
            if self.cand_source >= 0:
                self.cand_block = int(k("attention.candidate_block_size"))
                self.cand_topk = int(k("attention.candidate_topk_blocks"))
            self.engram_layers = [int(x) for x in k("engram.layer_ids", [], required=False)]
            if len(self.engram_layers):
                self.eg_heads = int(k("engram.head_count"))
                self.eg_dim = int(k("engram.key_length"))
                self.eg_max_ngram = int(k("engram.max_ngram_size"))
                self.eg_pad = int(k("engram.pad_id"))          # already a compressed id
                self.eg_mult = np.asarray(k("engram.multipliers"), dtype=np.uint64)
                self.eg_primes = np.asarray(k("engram.primes"), dtype=np.uint64)
                self.eg_offsets = np.asarray(k("engram.offsets"), dtype=np.uint64)
                self.eg_token_map = np.asarray(k("engram.token_map"), dtype=np.int64)
                N, H, ne = self.eg_max_ngram, self.eg_heads, len(self.engram_layers)
                if N < 2 or H < 1:
                    raise ModelError("bad engram max_ngram_size / head_count")
                if (len(self.eg_mult) != ne * N or len(self.eg_primes) != ne * (N - 1) * H
                        or len(self.eg_offsets) != ne * (N - 1) * H):
                    raise ModelError("engram multipliers/primes/offsets have wrong length")
                if len(self.eg_token_map) != self.n_vocab_meta():
                    raise ModelError("engram.token_map length != vocabulary size")
                C = (N - 1) * H
                for e_i, L in enumerate(self.engram_layers):
                    pr = [int(x) for x in self.eg_primes[e_i * C:(e_i + 1) * C]]
                    of = [int(x) for x in self.eg_offsets[e_i * C:(e_i + 1) * C]]
                    if min(pr) < 2 or of != [sum(pr[:c]) for c in range(C)]:
                        raise ModelError("engram layer %d: bad primes / offsets" % L)
                    ti = self.g.tensors.get(_blk(L, "engram.embd.weight"))
                    if ti is None or len(ti.ne) != 2 or ti.ne[0] != self.eg_dim \
                            or ti.ne[1] != sum(pr):
                        raise ModelError("engram layer %d: table missing or not [%d, %d]"
                                         % (L, self.eg_dim, sum(pr)))
                    if any(int(m) % 2 == 0 for m in self.eg_mult[e_i * N:(e_i + 1) * N]):
                        raise ModelError("engram layer %d: even multiplier" % L)
        if emb.ne[0] != self.dim:
            raise ModelError("token_embd.weight width %d != embedding_length" % emb.ne[0])
        if self.n_head * self.hd % self.o_groups:
            raise ModelError("heads*head_dim not divisible by output_group_count")
        # RoPE tables per layer (§3.9: per layer, not per tensor)
        yarn = None
        if self.yarn_factor > 1.0 and self.yarn_L0 > 0:
            yarn = (self.yarn_factor, self.yarn_L0, self.yarn_bfast, self.yarn_bslow)
        self.freqs = []
        for il in range(self.n_layer):
            if self.ratios[il] > 0:
                self.freqs.append(rope_freqs(self.rd, self.crope_base, yarn))
            else:
                self.freqs.append(rope_freqs(self.rd, self.rope_base, None))
        self.hadamard = hadamard_matrix(self.idx_dim) if self.arch == "deepseek4" else None
        if self.arch == "deepseek41":
            self._plan_v41()
        self._read_drafts(clamp, clamp_sh)

    def _read_drafts(self, clamp, clamp_sh):
        """Draft blocks mtp.0, mtp.1, ... (model-files.md §4: consecutive i with
        mtp.i.attn_norm.weight).  Per-layer arrays (compress_ratios, swiglu_clamp_*) give draft
        block i the entry L+i, else the trunk's last value is repeated (model-files.md §4.3).
        RoPE base rope.freq_base, no YaRN (§3.7, §4.5: ratio 0, window only).  A file whose
        draft blocks are incomplete still runs the forward pass; drafting then fails with the
        reason (self.draft_error)."""
        self.ds_targets = []
        self.draft_error = None
        n = 0
        while self.g.has("mtp.%d.attn_norm.weight" % n):
            n += 1
        self.n_draft = n
        self.drafts = {}

        def per_layer(v, i, default):
            if v is None:
                return default
            if np.ndim(v) == 0:
                return float(v)
            v = [float(x) for x in v]
            return v[self.n_layer + i] if len(v) > self.n_layer + i else v[-1]
        for i in range(n):
            pfx = "mtp.%d" % i
            if len(self.ratios) > self.n_layer + i and self.ratios[self.n_layer + i] != 0:
                self.draft_error = "draft block %d: compress ratio must be 0" % i
            lim = per_layer(clamp, i, 10.0)
            self.drafts[pfx] = {
                "lim": lim,
                "lim_sh": per_layer(clamp_sh, i, lim),
                "n_used": self.n_used,
                "freqs": rope_freqs(self.rd, self.rope_base, None),
            }
        if n and self.arch == "deepseek41":
            k = self._k
            try:
                targets = [int(x) for x in k("dspark_target_layer_ids")]
                self.ds_block = int(k("dspark_block_size"))
                self.ds_noise = int(k("dspark_noise_token_id"))
                self.ds_rank = int(k("dspark_markov_rank"))
                n_used = int(k("dspark_expert_used_count"))
                if any(t < 0 or t >= self.n_layer for t in targets) or self.ds_block < 1 \
                        or not 0 <= self.ds_noise < self.n_vocab or n_used < 1:
                    raise ModelError("bad dspark_target_layer_ids / block_size / "
                                     "noise_token_id / expert_used_count")
                self.ds_targets = targets
                for d in self.drafts.values():
                    d["n_used"] = n_used
            except ModelError as ex:
                self.draft_error = str(ex)

    def _freqs(self, il):
        return self.drafts[il]["freqs"] if isinstance(il, str) else self.freqs[il]

    def _plan_v41(self):
        """§4.3 roles: most recent source in stack order."""
        self.key_owners = [s for s in self.kv_sources if self.g.has(_blk(s, self.N_IDX_K))]
        self.kv_src_of = {}
        self.idx_src_of = {}
        self.key_src_of = {}
        for il in range(self.n_layer):
            if self.ratios[il] <= 0:
                continue
            ks = [s for s in self.kv_sources if s <= il]
            xs = [s for s in self.index_sources if s <= il]
            if not ks:
                raise ModelError("layer %d has ratio > 0 but no preceding KV source" % il)
            self.kv_src_of[il] = ks[-1]
            if self.ratios[ks[-1]] != self.ratios[il]:
                raise ModelError("layer %d (ratio %d) reads KV source %d of ratio %d"
                                 % (il, self.ratios[il], ks[-1], self.ratios[ks[-1]]))
            self.idx_src_of[il] = xs[-1] if xs else None
        self.cand_masked = set()
        for s in self.index_sources:
            # model-files.md §2.3: an index source after the candidate source that is not a
            # KV source has its scores masked to the candidate blocks
            if self.cand_source >= 0 and s > self.cand_source and s not in self.kv_sources:
                if self.kv_src_of.get(s) != self.cand_source:
                    raise ModelError("index source %d after the candidate source reads KV "
                                     "of %s, not of the candidate source" % (s, self.kv_src_of.get(s)))
                self.cand_masked.add(s)
            if s in self.key_owners:
                self.key_src_of[s] = s          # §10.3: an owner reads its own keys
            else:
                ow = [o for o in self.key_owners if o <= s]
                if not ow:
                    raise ModelError("index source %d has no index-key owner before it" % s)
                self.key_src_of[s] = ow[-1]
            if self.ratios[s] <= 0:
                raise ModelError("index source %d has ratio 0" % s)
        for s in self.kv_sources:
            if self.ratios[s] <= 0:
                raise ModelError("KV source %d has ratio 0" % s)

    # ------------------------------------------------------------------ tensors
    # tensor-name suffixes (docs/model-files.md); V4 follows ds4 / llama.cpp (§5.1)
    N_IDX_K = "indexer.attn_k.weight"
    N_IDX_K_NORM = "indexer.k_norm.weight"

    def w(self, name, required=True):
        if name in self._cache:
            return self._cache[name]
        if not self.g.has(name):
            if required:
                raise ModelError("missing tensor %s" % name)
            return None
        v = self.g.tensor(name, dtype=F64)
        self._cache[name] = v
        return v

    def lw(self, il, suffix, required=True):
        return self.w(_blk(il, suffix), required)

    def _validate_tensors(self):
        need = ["token_embd.weight", "output.weight", "output_norm.weight"]
        if self.arch == "deepseek4":
            need += ["output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight"]
        for n in need:
            if not self.g.has(n):
                raise ModelError("missing tensor %s" % n)
        for il in range(self.n_layer):
            for s in ("attn_norm.weight", "ffn_norm.weight", "attn_q_a.weight",
                      "attn_q_b.weight", "attn_kv.weight", "attn_sinks.weight",
                      "attn_output_a.weight", "attn_output_b.weight",
                      "hc_attn_fn.weight", "hc_ffn_fn.weight", "ffn_gate_inp.weight"):
                if not self.g.has(_blk(il, s)):
                    raise ModelError("missing tensor %s" % _blk(il, s))

    # ------------------------------------------------------------------ state
    def new_state(self):
        st = {"pos": 0, "tokens": [], "layers": [dict() for _ in range(self.n_layer)]}
        for il in range(self.n_layer):
            L = st["layers"][il]
            L["win"] = []               # window KV rows (all positions; last `window` used)
            L["ckv"] = []               # compressor per-token kv projections
            L["csc"] = []               # compressor per-token scores
            L["crows"] = []             # compressed rows (post-norm, RoPE, fake-quant)
            L["ikv"] = []               # V4 indexer compressor
            L["isc"] = []
            L["irows"] = []             # index keys
        if self.arch == "deepseek41":
            st["pre_mix"] = None
        # draft-block inputs, one entry per position (§3.7: the main model's final HC state;
        # §4.5: concat of mean_h X[h] at the input of each DSpark target layer)
        st["xs"] = []
        st["taps"] = []
        st["mtp_kv"] = {}               # V4 MTP window rows: position -> (token, kv row)
        st["ring"] = {}                 # DSpark stage rings: (stage, position) -> kv row
        st["main_x"] = {}               # DSpark stage-0 input main_x per position
        return st

    # ------------------------------------------------------------------ mHC
    def hc_mixes(self, X, fn, scale, base):
        flat = X.reshape(-1)
        r = 1.0 / math.sqrt(float(np.mean(flat * flat)) + self.rms_eps)
        mix = (fn @ flat) * r
        return sinkhorn_split(mix, scale, base, self.n_hc, self.sk_iters, self.hc_eps)

    @staticmethod
    def hc_post(f, R, post, comb):
        # X'[j] = post[j] * f + sum_i comb[i][j] * R[i]
        return post[:, None] * f[None, :] + comb.T @ R

    # ------------------------------------------------------------------ attention
    def _q_path(self, il, x):
        qr = rmsnorm(self.lw(il, "attn_q_a.weight") @ x, self.lw(il, "attn_q_a_norm.weight"),
                     self.rms_eps)
        q = (self.lw(il, "attn_q_b.weight") @ qr).reshape(self.n_head, self.hd)
        return qr, q

    @staticmethod
    def _tag(pos, il, what):
        global TRACE_TAG, QDUMP_AT
        if TRACE is not None:
            TRACE_TAG = "pos %d layer %d %s" % (pos, il, what)
        # draft block "mtp.i" (model-files.md §4) is numbered 1000 + i in the dump
        QDUMP_AT = (pos, il if isinstance(il, int) else 1000 + int(il.split(".")[1]),
                    QSITES[what])

    def _kv_window(self, il, x, pos):
        self._tag(pos, il, "window-kv")
        kv = rmsnorm(self.lw(il, "attn_kv.weight") @ x, self.lw(il, "attn_kv_a_norm.weight"),
                     self.rms_eps)
        kv = rope_tail(kv, pos, self._freqs(il))
        if self.arch == "deepseek4":
            nope = self.hd - self.rd
            # §3.4 step 3: FP8 on the nope dims only, blocks of 64; RoPE dims untouched
            kv[:nope] = fq_fp8_ue8m0(kv[:nope], 64, self.fake)
        else:
            # §4.3: whole vector, blocks of 32
            kv = fq_fp8_ue8m0(kv, 32, self.fake).astype(F64)
        return kv

    def _attend(self, il, q, pos, win_rows, comp_rows):
        rows = win_rows if comp_rows is None or len(comp_rows) == 0 else \
            np.concatenate([win_rows, comp_rows], axis=0)
        sink = self.lw(il, "attn_sinks.weight")
        o = sink_attention(q, rows, sink, 1.0 / math.sqrt(self.hd))
        o = rope_tail(o, pos, self._freqs(il), inverse=True)
        # grouped output projection
        G = self.o_groups
        og = o.reshape(G, -1)                                  # [G, H*hd/G]
        wa = self.lw(il, "attn_output_a.weight").reshape(G, self.o_lora, -1)
        low = np.einsum("grd,gd->gr", wa, og).reshape(-1)      # [G*o_lora]
        return self.lw(il, "attn_output_b.weight") @ low

    # ---- V4 compressor (§3.4): overlapping lanes for ratio 4, plain for others
    def _v4_compress(self, kvs, scs, ratio, width, w):
        """Pool window w.  kvs/scs: lists of per-token rows (coff*width)."""
        if ratio == 4:
            cand_kv = [kvs[4 * w + t][width:] for t in range(4)]
            cand_sc = [scs[4 * w + t][width:] for t in range(4)]
            if w > 0:
                cand_kv = [kvs[4 * (w - 1) + t][:width] for t in range(4)] + cand_kv
                cand_sc = [scs[4 * (w - 1) + t][:width] for t in range(4)] + cand_sc
        else:
            cand_kv = kvs[ratio * w:ratio * (w + 1)]
            cand_sc = scs[ratio * w:ratio * (w + 1)]
        K = np.stack(cand_kv)
        S = np.stack(cand_sc)
        S = S - S.max(axis=0, keepdims=True)
        P = np.exp(S)
        P /= P.sum(axis=0, keepdims=True)
        return (P * K).sum(axis=0)

    def _v4_attention(self, il, L, x, pos, token):
        qr, q = self._q_path(il, x)
        q = rmsnorm(q, None, self.rms_eps)                    # per-head weight-less RMSNorm
        q = rope_tail(q, pos, self.freqs[il])
        L["win"].append(self._kv_window(il, x, pos))
        lo = max(0, pos - self.window + 1)
        win_rows = np.stack(L["win"][lo:pos + 1])
        ratio = self.ratios[il]
        comp = None
        if ratio > 0:
            coff = 2 if ratio == 4 else 1
            ape = self.lw(il, "attn_compressor_ape.weight")    # [ratio, coff*hd]
            L["ckv"].append(self.lw(il, "attn_compressor_kv.weight") @ x)
            L["csc"].append(self.lw(il, "attn_compressor_gate.weight") @ x + ape[pos % ratio])
            if ratio == 4:
                iape = self.lw(il, "indexer_compressor_ape.weight")
                L["ikv"].append(self.lw(il, "indexer_compressor_kv.weight") @ x)
                L["isc"].append(self.lw(il, "indexer_compressor_gate.weight") @ x
                                + iape[pos % ratio])
            if (pos + 1) % ratio == 0:
                wi = pos // ratio
                pooled = self._v4_compress(L["ckv"], L["csc"], ratio, self.hd, wi)
                c = rmsnorm(pooled, self.lw(il, "attn_compressor_norm.weight"), self.rms_eps)
                c = rope_tail(c, wi * ratio, self.freqs[il])
                nope = self.hd - self.rd
                self._tag(pos, il, "compressed-kv")
                c[:nope] = fq_fp8_ue8m0(c[:nope], 64, self.fake)
                L["crows"].append(c)
                if ratio == 4:
                    pk = self._v4_compress(L["ikv"], L["isc"], 4, self.idx_dim, wi)
                    k = rmsnorm(pk, self.lw(il, "indexer_compressor_norm.weight"), self.rms_eps)
                    k = rope_tail(k, wi * ratio, self.freqs[il])
                    k = self.hadamard @ k
                    self._tag(pos, il, "index-key")
                    L["irows"].append(fq_fp4_ue8m0(k, 32, self.fake).astype(F64))
            n_vis = (pos + 1) // ratio
            if n_vis > 0:
                rows = np.stack(L["crows"][:n_vis])
                if ratio == 4 and n_vis > self.idx_topk:
                    qi = (self.lw(il, "indexer.attn_q_b.weight") @ qr).reshape(
                        self.idx_heads, self.idx_dim)
                    qi = rope_tail(qi, pos, self.freqs[il])
                    qi = qi @ self.hadamard.T
                    self._tag(pos, il, "index-q")
                    qi = fq_fp4_ue8m0(qi, 32, self.fake).astype(F64)
                    wts = (self.lw(il, "indexer.proj.weight") @ x) \
                        * (1.0 / math.sqrt(self.idx_dim)) * (1.0 / math.sqrt(self.idx_heads))
                    keys = np.stack(L["irows"][:n_vis])
                    sc = (np.maximum(qi @ keys.T, 0.0) * wts[:, None]).sum(axis=0)
                    sel = np.sort(topk_lowest_first(sc, self.idx_topk))
                    rows = rows[sel]
                comp = rows
        return self._attend(il, q, pos, win_rows, comp)

    # ---- V4.1 attention (§4.3)
    def _v41_source_step(self, il, L, x, pos):
        """KV source compressor: emit latent row / index key when the group completes."""
        ratio = self.ratios[il]
        kvp = self.lw(il, "attn_compressor_kv.weight") @ x
        if ratio == 1:
            pooled = kvp
        else:
            L["ckv"].append(kvp)
            L["csc"].append(self.lw(il, "attn_compressor_gate.weight") @ x)
            if (pos + 1) % ratio:
                return
            K = np.stack(L["ckv"][-ratio:])
            S = np.stack(L["csc"][-ratio:])
            S = S - S.max(axis=0, keepdims=True)
            P = np.exp(S)
            P /= P.sum(axis=0, keepdims=True)
            pooled = (P * K).sum(axis=0)
            L["ckv"].clear()
            L["csc"].clear()
        j = pos // ratio
        latent = rmsnorm(pooled, self.lw(il, "attn_compressor_norm.weight"), self.rms_eps)
        if il in self.key_owners:
            k = rmsnorm(self.lw(il, self.N_IDX_K) @ latent, self.lw(il, self.N_IDX_K_NORM),
                        self.rms_eps)
            k = rope_tail(k, j * ratio, self.freqs[il])
            self._tag(pos, il, "index-key")
            L["irows"].append(fq_fp4_ue8m0(k, 32, self.fake).astype(F64))
        c = rope_tail(latent, j * ratio, self.freqs[il])
        self._tag(pos, il, "compressed-kv")
        L["crows"].append(fq_fp4_e4m3(c, 16, self.fake).astype(F64))

    def _v41_index_scores(self, il, qr, x, pos, keys):
        qi = (self.lw(il, "indexer.attn_q_b.weight") @ qr).reshape(self.idx_heads, self.idx_dim)
        qi = rope_tail(qi, pos, self.freqs[il])
        self._tag(pos, il, "index-q")
        qi = fq_fp4_ue8m0(qi, 32, self.fake).astype(F64)
        wts = (self.lw(il, "indexer.proj.weight") @ x) \
            * (1.0 / math.sqrt(self.idx_dim)) * (1.0 / math.sqrt(self.idx_heads))
        return (np.maximum(qi @ keys.T, 0.0) * wts[:, None]).sum(axis=0)

    def _v41_attention(self, il, st, x, pos):
        L = st["layers"][il]
        tok = st["tok"]
        qr, q = self._q_path(il, x)
        q = rope_tail(q, pos, self.freqs[il])
        L["win"].append(self._kv_window(il, x, pos))
        lo = max(0, pos - self.window + 1)
        win_rows = np.stack(L["win"][lo:pos + 1])
        comp = None
        if self.ratios[il] > 0:
            if il in self.kv_sources:
                self._v41_source_step(il, L, x, pos)
            src = self.kv_src_of[il]
            S = st["layers"][src]
            ratio = self.ratios[src]
            n_vis = (pos + 1) // ratio
            if il in self.index_sources:
                sel = None
                if n_vis > 0:
                    ks = self.key_src_of[il]
                    keys = np.stack(st["layers"][ks]["irows"][:n_vis])
                    sc = self._v41_index_scores(il, qr, x, pos, keys)
                    if il == self.cand_source:
                        tok["cand"] = self._candidate_mask(sc, n_vis)
                    elif il in self.cand_masked:
                        mask = tok.get("cand")
                        if mask is None or len(mask) != n_vis:
                            raise ModelError("layer %d: candidate mask unavailable" % il)
                        sc = np.where(mask, sc, -np.inf)
                    k = min(self.idx_topk, n_vis)
                    sel = topk_lowest_first(sc, k)
                    # entries masked to -inf are not attended (see docs/reference.md)
                    sel = np.sort(sel[sc[sel] > -np.inf])
                tok["topk"] = sel
            if n_vis > 0:
                sel = tok.get("topk")
                if self.idx_src_of.get(il) is None:
                    sel = np.arange(n_vis)
                elif sel is None:
                    raise ModelError("layer %d: no top-k from its index source" % il)
                comp = np.stack(S["crows"][:n_vis])[sel]
        return self._attend(il, q, pos, win_rows, comp)

    def _candidate_mask(self, sc, n_vis):
        """§4.3 two-level candidates at the candidate source."""
        B = self.cand_block
        nb = (n_vis + B - 1) // B
        pad = np.full(nb * B, -np.inf)
        pad[:n_vis] = sc
        bs = pad.reshape(nb, B).max(axis=1)
        bs[(n_vis - 1) // B] = np.inf
        k = min(self.cand_topk, nb)
        chosen = topk_lowest_first(bs, k)
        chosen = chosen[bs[chosen] > -np.inf]
        mask = np.zeros(nb * B, dtype=bool)
        for b in chosen:
            mask[b * B:(b + 1) * B] = True
        return mask[:n_vis]

    # ------------------------------------------------------------------ MoE (§3.5, §4.4)
    def _moe(self, il, y, token):
        draft = isinstance(il, str)
        lim = self.drafts[il]["lim"] if draft else self.swiglu_limit[il]
        logits = self.lw(il, "ffn_gate_inp.weight") @ y
        s = np.sqrt(softplus(logits))
        if not draft and il < self.n_hash:
            idx = self.lw(il, "ffn_gate_tid2eid.weight")[token].astype(np.int64)
            if np.any(idx < 0) or np.any(idx >= self.n_exp):
                raise ModelError("tid2eid out of range")
        else:
            bias = self.lw(il, "exp_probs_b.bias", required=False)
            sel = s + bias if bias is not None else s
            idx = topk_lowest_first(sel, self.drafts[il]["n_used"] if draft else self.n_used)
        wsel = s[idx]
        if self.arch == "deepseek41":
            wsel = wsel / (wsel.sum() + 1e-20)
        else:
            wsel = wsel / wsel.sum()
        wsel = wsel * self.route_scale
        Wg = self.lw(il, "ffn_gate_exps.weight")    # [E, inter, D]
        Wu = self.lw(il, "ffn_up_exps.weight")
        Wd = self.lw(il, "ffn_down_exps.weight")    # [E, D, inter]
        out = np.zeros(self.dim)
        if lim <= 0:
            lim = np.inf                          # 0 = no clamp (model-files.md §2.2)
        for e, wk in zip(idx, wsel):
            g = np.minimum(Wg[e] @ y, lim)
            u = np.clip(Wu[e] @ y, -lim, lim)
            out += Wd[e] @ (silu(g) * u * wk)
        if self.g.has(_blk(il, "ffn_gate_shexp.weight")):
            lsh = self.drafts[il]["lim_sh"] if draft else self.swiglu_limit_sh[il]
            if lsh <= 0:
                lsh = np.inf
            g = np.minimum(self.lw(il, "ffn_gate_shexp.weight") @ y, lsh)
            u = np.clip(self.lw(il, "ffn_up_shexp.weight") @ y, -lsh, lsh)
            out += self.lw(il, "ffn_down_shexp.weight") @ (silu(g) * u)
        return out

    # ------------------------------------------------------------------ Engram (§4.6)
    def _engram_rows(self, e_i, st):
        """24-style row ids for the current position of engram layer index e_i."""
        N = self.eg_max_ngram
        H = self.eg_heads
        toks = st["tokens"]
        p = len(toks) - 1
        cm = self.eg_token_map
        def cmap(t):
            return int(cm[t])
        pad = self.eg_pad                        # stored already compressed (model-files §2.4)
        mult = self.eg_mult.reshape(-1, N)[e_i]
        ncol = (N - 1) * H
        primes = self.eg_primes.reshape(-1, ncol)[e_i]
        offs = self.eg_offsets.reshape(-1, ncol)[e_i]
        tk = []
        for k in range(N):
            tk.append(cmap(toks[p - k]) if p - k >= 0 else pad)
        r = tk[0] * int(mult[0])
        rows = []
        for k in range(1, N):
            r ^= tk[k] * int(mult[k])
            for h in range(H):
                col = (k - 1) * H + h
                rows.append(r % int(primes[col]) + int(offs[col]))
        return rows

    def _engram(self, il, st, X):
        e_i = self.engram_layers.index(il)
        rows = self._engram_rows(e_i, st)
        E = np.concatenate([self._engram_table_row(il, r) for r in rows]).astype(F64)
        kv = self.lw(il, "engram.wkv.weight") @ E
        D = self.dim
        H = self.n_hc
        key = kv[:H * D].reshape(H, D)
        value = kv[H * D:(H + 1) * D]
        wqk = self.lw(il, "engram.q.weight") * self.lw(il, "engram.k.weight")   # [H, D]
        eps = self.rms_eps
        out = X.copy()
        for h in range(H):
            rx = 1.0 / math.sqrt(float(np.mean(X[h] * X[h])) + eps)
            rk = 1.0 / math.sqrt(float(np.mean(key[h] * key[h])) + eps)
            dot = float(np.sum(X[h] * wqk[h] * key[h])) * rx * rk / math.sqrt(D)
            g = sigmoid(float(np.sign(dot)) * math.sqrt(max(abs(dot), 1e-6)))
            out[h] = X[h] + g * value
        return out

    def _engram_table_row(self, il, row):
        name = _blk(il, "engram.embd.weight")
        ti = self.g.tensors.get(name)
        if ti is None:
            raise ModelError("missing tensor %s" % name)
        if row < 0 or row >= ti.ne[1]:
            raise ModelError("engram row %d out of range" % row)
        v = gr.read_row(self.g, name, row).astype(F32)
        if ti.type in gr.FP8_TYPES:
            # §4.6 / §5.2: FP8 rows are dequantised, then rounded to bf16 (RNE).
            # F32/F16/BF16 "debug" tables are used as stored (docs/reference.md).
            v = bf16_rne(v)
        return v

    # ------------------------------------------------------------------ blocks
    def forward_token(self, st, token, want_logits=True):
        if token < 0 or token >= self.n_vocab:
            raise ModelError("token id %d out of range [0, %d)" % (token, self.n_vocab))
        pos = st["pos"]
        st["tokens"].append(token)
        st["tok"] = {}
        e = self.g_embed(token)
        X = np.tile(e, (self.n_hc, 1))
        if self.arch == "deepseek4":
            X = self._v4_layers(st, X, pos, token)
            st["xs"].append(X)
            y = self._v4_head(X)
        else:
            X, pre_mix = self._v41_layers(st, X, pos, token)
            y = pre_mix @ X
        st["pos"] = pos + 1
        if not want_logits:
            return None
        yn = rmsnorm(y, self.w("output_norm.weight"), self.rms_eps)
        return self.w("output.weight") @ yn

    def g_embed(self, token):
        ti = self.g.tensors["token_embd.weight"]
        if "token_embd.weight" in self._cache:
            return self._cache["token_embd.weight"][token]
        return gr.read_row(self.g, "token_embd.weight", token).astype(F64)

    def _v4_layers(self, st, X, pos, token):
        for il in range(self.n_layer):
            L = st["layers"][il]
            R = X
            pre, post, comb = self.hc_mixes(X, self.lw(il, "hc_attn_fn.weight"),
                                            self.lw(il, "hc_attn_scale.weight"),
                                            self.lw(il, "hc_attn_base.weight"))
            x_in = pre @ X
            a = self._v4_attention(il, L, rmsnorm(x_in, self.lw(il, "attn_norm.weight"),
                                                  self.rms_eps), pos, token)
            X = self.hc_post(a, R, post, comb)
            R = X
            pre, post, comb = self.hc_mixes(X, self.lw(il, "hc_ffn_fn.weight"),
                                            self.lw(il, "hc_ffn_scale.weight"),
                                            self.lw(il, "hc_ffn_base.weight"))
            x_in = pre @ X
            f = self._moe(il, rmsnorm(x_in, self.lw(il, "ffn_norm.weight"), self.rms_eps), token)
            X = self.hc_post(f, R, post, comb)
        return X

    def _v4_head(self, X, names=("output_hc_fn.weight", "output_hc_scale.weight",
                                 "output_hc_base.weight")):
        """§3.6 HC head (the trunk's, or the MTP's own hc_head_*, §3.7 step 4)."""
        flat = X.reshape(-1)
        r = 1.0 / math.sqrt(float(np.mean(flat * flat)) + self.rms_eps)
        mix = (self.w(names[0]) @ flat) * r
        pre = sigmoid(mix * self.w(names[1]).reshape(-1)[0] + self.w(names[2])) + self.hc_eps
        return pre @ X

    def _v41_layers(self, st, X, pos, token):
        pre_mix = np.zeros(self.n_hc)
        pre_mix[0] = 1.0                                   # make_identity_pre_mix
        taps = [None] * len(self.ds_targets)
        for il in range(self.n_layer):
            if il in self.engram_layers:
                X = self._engram(il, st, X)
            if il in self.ds_targets:
                # §4.1: main_hidden_i = mean over the HC streams of layer i's input (after
                # Engram, before the block)
                taps[self.ds_targets.index(il)] = X.mean(axis=0)
            R = X
            a_pre, a_post, a_comb = self.hc_mixes(X, self.lw(il, "hc_attn_fn.weight"),
                                                  self.lw(il, "hc_attn_scale.weight"),
                                                  self.lw(il, "hc_attn_base.weight"))
            x = pre_mix @ X
            a = self._v41_attention(il, st, rmsnorm(x, self.lw(il, "attn_norm.weight"),
                                                    self.rms_eps), pos)
            X = self.hc_post(a, R, a_post, a_comb)
            R = X
            f_pre, f_post, f_comb = self.hc_mixes(X, self.lw(il, "hc_ffn_fn.weight"),
                                                  self.lw(il, "hc_ffn_scale.weight"),
                                                  self.lw(il, "hc_ffn_base.weight"))
            x = a_pre @ X
            f = self._moe(il, rmsnorm(x, self.lw(il, "ffn_norm.weight"), self.rms_eps), token)
            X = self.hc_post(f, R, f_post, f_comb)
            pre_mix = f_pre
        if taps:
            st["taps"].append(np.concatenate(taps))
        return X, pre_mix

    # ------------------------------------------------------------------ draft blocks
    # The drafters of §3.7 (V4 MTP) and §4.5 (V4.1 DSpark), for the state of a timeline that
    # holds tokens[0 .. P) (last target position p = P - 1) and the next token `next` (the
    # token of position P, not yet evaluated).  Where the spec leaves a choice open, the
    # choice libdsinfer documents in docs/spec.md ("How it runs", step 2) is taken and cited.
    def _hc_sub(self, pfx, X, which):
        return self.hc_mixes(X, self.lw(pfx, "hc_%s_fn.weight" % which),
                             self.lw(pfx, "hc_%s_scale.weight" % which),
                             self.lw(pfx, "hc_%s_base.weight" % which))

    def _draft_q(self, pfx, x, pos):
        _, q = self._q_path(pfx, x)
        if self.arch == "deepseek4":
            q = rmsnorm(q, None, self.rms_eps)          # §3.4: per-head q norm, V4 only
        return rope_tail(q, pos, self._freqs(pfx))

    def _need_drafts(self, st, arch):
        if self.arch != arch or self.n_draft < 1:
            raise ModelError("the model has no %s draft blocks"
                             % ("MTP" if arch == "deepseek4" else "DSpark"))
        if self.draft_error:
            raise ModelError("draft blocks unusable: " + self.draft_error)
        if st["pos"] < 1:
            raise ModelError("drafting needs at least one evaluated position")

    # ---- V4 MTP (§3.7)
    def _mtp_x0(self, xm, token):
        """§3.7 steps 1-3: X0[h] = e_proj·enorm(embed[t]) + h_proj·hnorm(X_main[h])."""
        e = rmsnorm(self.g_embed(token), self.lw("mtp.0", "enorm.weight"), self.rms_eps)
        E = self.lw("mtp.0", "e_proj.weight") @ e
        Hn = rmsnorm(xm, self.lw("mtp.0", "hnorm.weight"), self.rms_eps)   # per stream
        return E[None, :] + Hn @ self.lw("mtp.0", "h_proj.weight").T

    def mtp_draft(self, st, next_token):
        """One MTP draft: (ids [1], logits [1][V]).

        Pairing (§3.7 marks it UNKNOWN/verify): libdsinfer uses DeepSeek-V3's — the MTP row of
        position q pairs the main model's final HC state X_main[q] with token q+1 and predicts
        token q+2 (docs/spec.md, "How it runs" 2, "MTP (DeepSeek-V3 pairing, the one the trained
        models use)"), so the draft for position P+1 comes from the row of p = P-1 paired with
        `next`.  The block's own window (§3.7: "its own window cache", ratio 0) holds the rows
        q = p-W+1 .. p, each pairing X_main[q] with tokens[q+1] (`next` for q = p); the rows are
        placed at RoPE position q (with the rounding off a common shift of every position
        changes nothing: RoPE is relative, the FP8 clamp never bites)."""
        self._need_drafts(st, "deepseek4")
        pfx = "mtp.0"
        p = st["pos"] - 1
        toks = st["tokens"] + [int(next_token)]
        rows = []
        for q in range(max(0, p - self.window + 1), p + 1):
            t = toks[q + 1]
            c = st["mtp_kv"].get(q)
            if c is None or c[0] != t:
                # a window row needs only the attention input of its own row (§3.2)
                X0 = self._mtp_x0(st["xs"][q], t)
                pre, _, _ = self._hc_sub(pfx, X0, "attn")
                xin = rmsnorm(pre @ X0, self.lw(pfx, "attn_norm.weight"), self.rms_eps)
                c = (t, self._kv_window(pfx, xin, q))
                st["mtp_kv"][q] = c
            rows.append(c[1])
        # the row of p: one normal V4 block (§3.2-3.5) on X0, window-only attention
        X = self._mtp_x0(st["xs"][p], toks[p + 1])
        R = X
        pre, post, comb = self._hc_sub(pfx, X, "attn")
        xin = rmsnorm(pre @ X, self.lw(pfx, "attn_norm.weight"), self.rms_eps)
        a = self._attend(pfx, self._draft_q(pfx, xin, p), p, np.stack(rows), None)
        X = self.hc_post(a, R, post, comb)
        R = X
        pre, post, comb = self._hc_sub(pfx, X, "ffn")
        f = self._moe(pfx, rmsnorm(pre @ X, self.lw(pfx, "ffn_norm.weight"), self.rms_eps), None)
        X = self.hc_post(f, R, post, comb)
        # §3.7 step 4: the MTP's own HC head and norm, the shared output head
        y = self._v4_head(X, ("mtp.0.hc_head_fn.weight", "mtp.0.hc_head_scale.weight",
                              "mtp.0.hc_head_base.weight"))
        lg = self.w("output.weight") @ rmsnorm(y, self.lw(pfx, "norm.weight"), self.rms_eps)
        return np.array([int(np.argmax(lg))]), lg[None, :]

    # ---- V4.1 DSpark (§4.5)
    def _ds_ring_row(self, st, stage, q):
        """Stage `stage`'s window-ring row of target position q: main_kv = kv_norm(wkv ·
        main_x) with RoPE at q and the §4.3 window-KV FP8 (whole vector, blocks of 32), where
        main_x = RMSNorm(main_proj · concat(main_hidden_t), main_norm) (stage 0's tensors,
        §4.5).  "Prefill only seeds this ring": every target position has its row."""
        key = (stage, q)
        if key not in st["ring"]:
            if q not in st["main_x"]:
                st["main_x"][q] = rmsnorm(self.lw("mtp.0", "main_proj.weight") @ st["taps"][q],
                                          self.lw("mtp.0", "main_norm.weight"), self.rms_eps)
            st["ring"][key] = self._kv_window("mtp.%d" % stage, st["main_x"][q], q)
        return st["ring"][key]

    def dspark_draft(self, st, next_token, picks=None):
        """The DSpark block: (ids [S], logits [S][V] with the Markov bias, conf [S] or None).

        Slots i = 0..S-1 hold [next, noise x (S-1)] at positions p+1 .. p+S; every stage is a
        lagged-mHC block (§4.2) whose attention lets each slot see its stage's ring rows
        p-W+1 .. p (the window of `sliding_window` rows, as docs/spec.md "How it runs" 2 reads
        §4.5's "128-slot window ring") and the keys of all S slots (non-causal within the
        block; the slots' keys are the §4.3 window KV at their own positions).  Then, sequentially, slot i's logits get the
        bigram bias of out_ids[i] (out_ids[0] = next) and out_ids[i+1] is the greedy pick
        (np.argmax: ties to the lowest id) — or picks[i] where given (to follow another
        implementation's picks after a near-tie).  conf_i = proj · concat(y_i,
        markov_embed[out_ids[i]]) as §4.5 writes it (a logit; libdsinfer thresholds its
        sigmoid, docs/spec.md); None without confidence_proj."""
        self._need_drafts(st, "deepseek41")
        S, W = self.ds_block, self.window
        p = st["pos"] - 1
        ids = [int(next_token)] + [self.ds_noise] * (S - 1)
        pos = [p + 1 + i for i in range(S)]
        X = [np.tile(self.g_embed(t), (self.n_hc, 1)) for t in ids]
        one_hot = np.zeros(self.n_hc)
        one_hot[0] = 1.0                                  # §4.5: pre_mix one-hot
        pm = [one_hot] * S
        lo = max(0, p - W + 1)
        for stage in range(self.n_draft):
            pfx = "mtp.%d" % stage
            ring = [self._ds_ring_row(st, stage, q) for q in range(lo, p + 1)]
            mixes, qs, keys = [], [], []
            for i in range(S):
                mixes.append(self._hc_sub(pfx, X[i], "attn"))
                xin = rmsnorm(pm[i] @ X[i], self.lw(pfx, "attn_norm.weight"), self.rms_eps)
                qs.append(self._draft_q(pfx, xin, pos[i]))
                keys.append(self._kv_window(pfx, xin, pos[i]))   # §4.3 window KV of the slot
            rows = np.stack(ring + keys)
            for i in range(S):
                a_pre, a_post, a_comb = mixes[i]
                a = self._attend(pfx, qs[i], pos[i], rows, None)
                Xi = self.hc_post(a, X[i], a_post, a_comb)
                f_pre, f_post, f_comb = self._hc_sub(pfx, Xi, "ffn")
                f = self._moe(pfx, rmsnorm(a_pre @ Xi, self.lw(pfx, "ffn_norm.weight"),
                                           self.rms_eps), None)
                X[i] = self.hc_post(f, Xi, f_post, f_comb)
                pm[i] = f_pre
        last = "mtp.%d" % (self.n_draft - 1)
        ys = [pm[i] @ X[i] for i in range(S)]
        lg = np.stack([self.w("output.weight") @ rmsnorm(y, self.lw(last, "norm.weight"),
                                                         self.rms_eps) for y in ys])
        membd = self.lw(last, "markov_embd.weight")        # [V, rank]: row = token
        mhead = self.lw(last, "markov_head.weight")        # [V, rank]
        proj = self.lw(last, "confidence_proj.weight", required=False)
        out, conf = [ids[0]], []
        for i in range(S):
            lg[i] = lg[i] + mhead @ membd[out[i]]
            if proj is not None:
                conf.append(float(proj.reshape(-1) @ np.concatenate([ys[i], membd[out[i]]])))
            out.append(int(picks[i]) if picks is not None else int(np.argmax(lg[i])))
        return np.array(out[1:]), lg, (np.array(conf) if proj is not None else None)

    def draft(self, st, next_token, picks=None):
        """The model's drafter (MTP for deepseek4, DSpark for deepseek41): (ids, logits)."""
        if self.arch == "deepseek4":
            return self.mtp_draft(st, next_token)
        ids, lg, _ = self.dspark_draft(st, next_token, picks)
        return ids, lg

    # ------------------------------------------------------------------ driver
    def forward(self, tokens, positions="all"):
        st = self.new_state()
        out = []
        n = len(tokens)
        for i, t in enumerate(tokens):
            want = positions == "all" or i == n - 1
            lg = self.forward_token(st, int(t), want_logits=want)
            if want:
                out.append(lg)
        return np.array(out, dtype=F64).reshape(len(out), self.n_vocab)


# ============================================================================
# CLI
# ============================================================================

def _parse_tokens(args):
    if args.tokens is not None:
        s = args.tokens.strip()
        if not s:
            return []
        return [int(t) for t in s.split(",") if t.strip() != ""]
    with open(args.tokens_file, "r") as fh:
        return [int(t) for t in fh.read().split()]


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="NumPy reference forward pass (deepseek4/deepseek41)")
    ap.add_argument("--model", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens")
    g.add_argument("--tokens-file")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-fake-quant", action="store_true")
    ap.add_argument("--positions", choices=("all", "last"), default="all")
    ap.add_argument("--trace-midpoints", metavar="FILE",
                    help="write, per fake-quant call, how close its nearest element sat to a "
                         "rounding midpoint (grid steps), smallest first (§10.4)")
    ap.add_argument("--trace-quant", metavar="FILE",
                    help="write every fake-quant call (position, layer, site, recipe, block, "
                         "float32 inputs and outputs) to FILE, binary (see QDUMP)")
    args = ap.parse_args(argv)
    global TRACE, QDUMP
    TRACE = [] if args.trace_midpoints else None
    try:
        QDUMP = open(args.trace_quant, "wb") if args.trace_quant else None
        toks = _parse_tokens(args)
        if not toks:
            raise ModelError("no tokens given")
        m = Model(args.model, fake_quant=not args.no_fake_quant)
        lg = m.forward(toks, args.positions)
        if not np.all(np.isfinite(lg)):
            raise ModelError("non-finite logits")
        lg.astype("<f4").tofile(args.out)
        if TRACE is not None:
            with open(args.trace_midpoints, "w") as fh:
                fh.write("# margin_in_grid_steps  call (0 = exactly on a midpoint)\n")
                for tag, mg in sorted(TRACE, key=lambda t: t[1]):
                    fh.write("%.6g  %s\n" % (mg, tag))
    except (ModelError, gr.GGUFError, OSError, ValueError) as ex:
        print("dsref: error: %s" % ex, file=sys.stderr)
        return 1
    except Exception as ex:  # noqa: BLE001 - report, never a traceback-less success
        print("dsref: internal error: %s: %s" % (type(ex).__name__, ex), file=sys.stderr)
        return 1
    finally:
        TRACE = None
        if QDUMP is not None:
            QDUMP.close()
            QDUMP = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
