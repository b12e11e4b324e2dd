"""PyTorch implementation of the DeepSeek V4 Flash (§3) and V4.1 Flash (§4) graphs, written
from shared/docs/model-spec.md (section numbers below refer to it), for training the tiny
models of docs/trained-models.md. Everything runs over whole sequences (prefill / training
semantics, §10.3), batch-first: x is [B, T, ...].

Independent of the library's C code and of tests/reference/dsref.py by design: it is the
third implementation the perplexity-agreement test compares against.
"""
import math
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import fq


@dataclass
class Config:
    name: str = "kjv-v41"
    v41: bool = True
    vocab: int = 4096
    dim: int = 256
    n_layers: int = 10
    n_heads: int = 4
    head_dim: int = 128
    rope_dim: int = 64
    q_lora: int = 64
    o_groups: int = 2
    o_lora: int = 32
    window: int = 32
    ctx: int = 4096
    ratios: List[int] = field(default_factory=lambda: [0, 0, 2, 2, 2, 1, 1, 1, 1, 1])
    idx_heads: int = 4
    idx_dim: int = 128
    idx_topk: int = 8
    n_experts: int = 8
    n_used: int = 2
    n_shared: int = 1
    ff: int = 64
    n_hash: int = 0
    hc: int = 4
    sinkhorn: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-20
    rope_base: float = 10000.0
    rope_base_c: float = 160000.0
    yarn_factor: float = 16.0
    yarn_orig: int = 64
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    swiglu: float = 10.0
    route_scale: float = 1.5
    # V4.1 roles (§4.3)
    kv_src: List[int] = field(default_factory=lambda: [2, 5])
    idx_src: List[int] = field(default_factory=lambda: [2, 5, 7])
    cand_src: int = 5
    cand_topk_blocks: int = 4
    cand_block: int = 4
    # Engram (§4.6)
    engram_layers: List[int] = field(default_factory=lambda: [1, 3])
    engram_heads: int = 2
    engram_dim: int = 32
    engram_ngram: int = 3
    engram_vocab: int = 4000
    # DSpark (§4.5)
    n_dspark: int = 3
    dspark_block: int = 5
    targets: List[int] = field(default_factory=lambda: [7, 8, 9])
    markov_rank: int = 16
    dspark_experts: int = 4
    dspark_used: int = 1
    # V4 MTP (§3.7)
    n_mtp: int = 0
    # token ids the graph needs (tokenizer layout, bpe.py)
    pad_id: int = 2
    noise_id: int = 2


def v4_config(**kw):
    c = dict(name="kjv-v4", v41=False, n_layers=6, ratios=[0, 0, 4, 16, 4, 16], idx_topk=8,
             n_hash=3, norm_eps=1e-6, kv_src=[], idx_src=[], cand_src=-1, engram_layers=[],
             n_dspark=0, targets=[], n_mtp=1)
    c.update(kw)
    return Config(**c)


# ---------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------

def rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms(x, self.eps) * self.weight


def lin(i, o, gain=1.0):
    """A [o, i] weight (HF layout; GGUF ne = [i, o]), uniform with std gain/sqrt(i)."""
    w = torch.empty(o, i)
    nn.init.uniform_(w, -gain * math.sqrt(3.0 / i), gain * math.sqrt(3.0 / i))
    return nn.Parameter(w)


class Rope:
    """Interleaved-pair RoPE on the last rope_dim dims (§3.9), with YaRN for ratio>0 layers.
    Angles in float64, cos/sin rounded to float32 once."""

    def __init__(self, cfg, yarn, max_pos):
        rd = cfg.rope_dim
        base = cfg.rope_base_c if yarn else cfg.rope_base
        f = [base ** (-2.0 * i / rd) for i in range(rd // 2)]
        if yarn and cfg.yarn_factor > 1.0:
            def corr(beta):
                return rd * math.log(cfg.yarn_orig / (2 * math.pi * beta)) / (2 * math.log(base))
            low = max(math.floor(corr(cfg.beta_fast)), 0)
            high = min(math.ceil(corr(cfg.beta_slow)), rd - 1)
            if high == low:
                high += 0.001
            for i in range(rd // 2):
                ramp = min(max((i - low) / (high - low), 0.0), 1.0)
                f[i] = f[i] / cfg.yarn_factor * ramp + f[i] * (1.0 - ramp)
        pos = np.arange(max_pos, dtype=np.float64)[:, None]
        th = pos * np.array(f, dtype=np.float64)[None, :]
        self.cos = torch.from_numpy(np.cos(th).astype(np.float32))
        self.sin = torch.from_numpy(np.sin(th).astype(np.float32))
        self.rd = rd

    def __call__(self, x, pos, inverse=False):
        """x [B,T,n] or [B,T,heads,n]; pos [T] or [B,T] (int64 positions)."""
        c = self.cos[pos]
        s = self.sin[pos]
        if x.dim() == 4:                 # [.., T, heads, n]: pos covers the dims before heads
            c = c.unsqueeze(-2)
            s = s.unsqueeze(-2)
        if inverse:
            s = -s
        rd = self.rd
        head, tail = x[..., :-rd], x[..., -rd:]
        x0, x1 = tail[..., 0::2], tail[..., 1::2]
        y0 = x0 * c - x1 * s
        y1 = x0 * s + x1 * c
        y = torch.stack([y0, y1], -1).flatten(-2)
        return torch.cat([head, y], -1)


def hadamard(x):
    """Normalised Walsh-Hadamard transform over the last dim (power of two), §3.4."""
    n = x.shape[-1]
    h = 1
    y = x
    while h < n:
        y = y.reshape(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack([a + b, a - b], -2).reshape(*x.shape[:-1], n)
        h *= 2
    return y * (1.0 / math.sqrt(n))


def sel_mask(idx, valid, n):
    """[B,T,k] selected indices (+ validity) -> boolean mask [B,T,n]."""
    m = torch.zeros(*idx.shape[:-1], n, dtype=torch.bool)
    if idx.shape[-1]:
        m.scatter_(-1, idx, valid)
    return m


def stable_topk_idx(scores, k):
    """Indices of the k largest scores along the last dim, ties -> lowest index (§10.2)."""
    _, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    return idx[..., :k]


# ---------------------------------------------------------------------------------------
# mHC (§3.3, §4.2)
# ---------------------------------------------------------------------------------------

class HC(nn.Module):
    """hc_{attn,ffn}_{fn,base,scale}: mixes from the flattened streams, Sinkhorn comb."""

    def __init__(self, cfg):
        super().__init__()
        hc, D = cfg.hc, cfg.dim
        M = (2 + hc) * hc
        self.hc = hc
        self.fn = nn.Parameter(torch.randn(M, hc * D) * (0.02 / math.sqrt(hc * D)) * 8)
        base = torch.zeros(M)
        base[:hc] = -1.1                      # pre ~ 0.25 per stream
        comb = torch.eye(hc) * 2.0            # comb starts near the identity
        base[2 * hc:] = comb.flatten()
        self.base = nn.Parameter(base + 0.01 * torch.randn(M))
        self.scale = nn.Parameter(torch.ones(3))
        self.norm_eps = cfg.norm_eps
        self.hc_eps = cfg.hc_eps
        self.iters = cfg.sinkhorn

    def mixes(self, X):
        hc = self.hc
        flat = X.flatten(-2)                                   # [..., hc*D] stream-major
        mix = F.linear(flat, self.fn) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        pre = torch.sigmoid(mix[..., :hc] * self.scale[0] + self.base[:hc]) + self.hc_eps
        post = 2.0 * torch.sigmoid(mix[..., hc:2 * hc] * self.scale[1] + self.base[hc:2 * hc])
        C = (mix[..., 2 * hc:] * self.scale[2] + self.base[2 * hc:]).unflatten(-1, (hc, hc))
        C = torch.softmax(C, -1) + self.hc_eps                 # row softmax (over j)
        C = C / (C.sum(-2, keepdim=True) + self.hc_eps)        # column normalise
        for _ in range(self.iters - 1):
            C = C / (C.sum(-1, keepdim=True) + self.hc_eps)
            C = C / (C.sum(-2, keepdim=True) + self.hc_eps)
        return pre, post, C


def hc_collapse(pre, X):
    return (pre.unsqueeze(-1) * X).sum(-2)


def hc_post(f, R, post, C):
    # X'[j] = post[j] f + sum_i C[i][j] R[i]   (unrolled over i: tiny batched matmuls are slow)
    out = post.unsqueeze(-1) * f.unsqueeze(-2)
    for i in range(C.shape[-2]):
        out = out + C[..., i, :].unsqueeze(-1) * R[..., i, :].unsqueeze(-2)
    return out


# ---------------------------------------------------------------------------------------
# MoE (§3.5, §4.4)
# ---------------------------------------------------------------------------------------

class MoE(nn.Module):
    def __init__(self, cfg, n_experts, n_used, hash_layer):
        super().__init__()
        D, Fw = cfg.dim, cfg.ff
        SF = cfg.n_shared * Fw
        self.E, self.k = n_experts, n_used
        self.limit = cfg.swiglu
        self.route = cfg.route_scale
        self.v41 = cfg.v41
        self.hash = hash_layer
        self.gate = lin(D, n_experts)
        if hash_layer:
            g = torch.Generator().manual_seed(1234)
            t = torch.stack([torch.randperm(n_experts, generator=g)[:n_used] for _ in range(cfg.vocab)])
            self.register_buffer("tid2eid", t.to(torch.int64))
        else:
            self.register_buffer("bias", torch.zeros(n_experts))
        self.w1 = nn.Parameter(torch.stack([lin(D, Fw).data for _ in range(n_experts)]))
        self.w3 = nn.Parameter(torch.stack([lin(D, Fw).data for _ in range(n_experts)]))
        self.w2 = nn.Parameter(torch.stack([lin(Fw, D, 0.5).data for _ in range(n_experts)]))
        self.s1 = lin(D, SF)
        self.s3 = lin(D, SF)
        self.s2 = lin(SF, D, 0.5)
        self.load = None

    def swiglu(self, g, u):
        if self.limit > 0:
            g = torch.clamp(g, max=self.limit)
            u = torch.clamp(u, -self.limit, self.limit)
        return F.silu(g) * u

    def forward(self, y, tokens):
        shp = y.shape
        y = y.reshape(-1, shp[-1])
        logits = F.linear(y, self.gate)
        s = torch.sqrt(F.softplus(logits))
        if self.hash:
            sel = self.tid2eid[tokens.reshape(-1)]
        else:
            sel = torch.topk(s.detach() + self.bias, self.k, dim=-1).indices
        w = s.gather(-1, sel)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.route
        out = torch.zeros_like(y)
        with torch.no_grad():
            self.load = torch.bincount(sel.reshape(-1), minlength=self.E).float()
        for e in range(self.E):
            tok, slot = (sel == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            ye = y[tok]
            h = self.swiglu(F.linear(ye, self.w1[e]), F.linear(ye, self.w3[e])) * w[tok, slot].unsqueeze(-1)
            out = out.index_add(0, tok, F.linear(h, self.w2[e]))
        out = out + F.linear(self.swiglu(F.linear(y, self.s1), F.linear(y, self.s3)), self.s2)
        return out.reshape(shp)

    @torch.no_grad()
    def update_bias(self, gamma):
        """Auxiliary-loss-free balancing (noaux_tc): nudge the selection bias of
        over-loaded experts down and under-loaded ones up."""
        if self.hash or self.load is None:
            return
        self.bias += gamma * torch.sign(self.load.mean() - self.load)


# ---------------------------------------------------------------------------------------
# Attention (§3.4 V4, §4.3 V4.1)
# ---------------------------------------------------------------------------------------

def window_attend(q, kv, sink, W, comp=None):
    """Sink attention (§3.4) of q [B,T,H,hd] over the causal window (the last W positions,
    the current one included) of kv [B,T,hd], plus optional compressed rows
    comp = (rows [B,C,hd], mask [B,T,C]: the rows each query attends). K = V.
    The window part runs block-local (query block n sees key blocks n-1 and n)."""
    B, T, H, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    nb = (T + W - 1) // W
    Tp = nb * W
    if Tp != T:
        q = torch.cat([q, q.new_zeros(B, Tp - T, H, hd)], 1)
        kv = torch.cat([kv, kv.new_zeros(B, Tp - T, hd)], 1)
    qb = q.view(B, nb, W, H, hd).permute(0, 1, 3, 2, 4)              # [B,nb,H,W,hd]
    kb = kv.view(B, nb, W, hd)
    kprev = torch.cat([kb.new_zeros(B, 1, W, hd), kb[:, :-1]], 1)
    keys = torch.cat([kprev, kb], 2)                                   # [B,nb,2W,hd]
    sw = torch.matmul(qb, keys.unsqueeze(2).transpose(-1, -2)) * scale  # [B,nb,H,W,2W]
    qi = torch.arange(W).view(W, 1)
    ki = torch.arange(2 * W).view(1, 2 * W) - W                        # key offset vs block start
    ok = (ki <= qi) & (ki > qi - W)                                    # [W,2W]
    first = torch.zeros(nb, 1, 1, dtype=torch.bool)
    first[0] = True
    ok = ok.view(1, W, 2 * W) & ~(first & (ki < 0).view(1, 1, 2 * W))  # no block before 0
    sw = sw.masked_fill(~ok.view(1, nb, 1, W, 2 * W), float("-inf"))
    sw = sw.permute(0, 1, 3, 2, 4).reshape(B, Tp, H, 2 * W)[:, :T]    # [B,T,H,2W]
    parts = [sw]
    if comp is not None:
        rows, mask = comp
        sc = torch.matmul(q[:, :T].reshape(B, T * H, hd), rows.transpose(1, 2)).view(B, T, H, -1) * scale
        sc = sc.masked_fill(~mask.unsqueeze(2), float("-inf"))
        parts.append(sc)
    parts.append(sink.view(1, 1, H, 1).expand(B, T, H, 1))
    p = torch.softmax(torch.cat(parts, -1), -1)
    pw = p[..., :2 * W]
    if Tp != T:
        pw = torch.cat([pw, pw.new_zeros(B, Tp - T, H, 2 * W)], 1)
    pw = pw.reshape(B, nb, W, H, 2 * W).permute(0, 1, 3, 2, 4)         # [B,nb,H,W,2W]
    o = torch.matmul(pw, keys.unsqueeze(2))                            # [B,nb,H,W,hd]
    o = o.permute(0, 1, 3, 2, 4).reshape(B, Tp, H, hd)[:, :T]
    if comp is not None:
        C = comp[0].shape[1]
        pc = p[..., 2 * W:2 * W + C].reshape(B, T * H, C)
        o = o + torch.matmul(pc, comp[0]).view(B, T, H, hd)
    return o


class Attention(nn.Module):
    """One layer's attention: Q/KV path, compressor / indexer per the layer's role."""

    def __init__(self, cfg, lid, ratio, draft=False):
        super().__init__()
        D, Q, H, hd = cfg.dim, cfg.q_lora, cfg.n_heads, cfg.head_dim
        G, R = cfg.o_groups, cfg.o_lora
        self.cfg, self.lid, self.ratio, self.draft = cfg, lid, ratio, draft
        eps = cfg.norm_eps
        self.wq_a = lin(D, Q)
        self.q_norm = RMSNorm(Q, eps)
        self.wq_b = lin(Q, H * hd)
        self.wkv = lin(D, hd)
        self.kv_norm = RMSNorm(hd, eps)
        self.sink = nn.Parameter(torch.zeros(H))
        self.wo_a = lin(H * hd // G, G * R)
        self.wo_b = lin(G * R, D, 0.5)
        self.rope = None
        ID, IH = cfg.idx_dim, cfg.idx_heads
        if not cfg.v41 and ratio > 0:
            co = 2 if ratio == 4 else 1
            self.c_ape = nn.Parameter(torch.zeros(ratio, co * hd))
            self.c_wkv = lin(D, co * hd)
            self.c_wgate = lin(D, co * hd)
            self.c_norm = RMSNorm(hd, eps)
            if ratio == 4:
                self.i_wq_b = lin(Q, IH * ID)
                self.i_proj = lin(D, IH)
                self.i_ape = nn.Parameter(torch.zeros(4, 2 * ID))
                self.i_wkv = lin(D, 2 * ID)
                self.i_wgate = lin(D, 2 * ID)
                self.i_norm = RMSNorm(ID, eps)
        self.kv_source = cfg.v41 and lid in cfg.kv_src
        self.index_source = cfg.v41 and lid in cfg.idx_src
        if self.kv_source:
            self.c_wkv = lin(D, hd)
            if ratio > 1:
                self.c_wgate = lin(D, hd)
            self.c_norm = RMSNorm(hd, eps)
            self.i_wk = lin(hd, ID)
            self.i_k_norm = RMSNorm(ID, eps)
        if self.index_source:
            self.i_wq_b = lin(Q, IH * ID)
            self.i_proj = lin(D, IH)

    # -- shared pieces --------------------------------------------------------------
    def kv_row(self, x, pos, fqr):
        """Window KV: RMSNorm(wkv x), RoPE on the tail, FP8 simulation (§3.4 / §4.3)."""
        cfg = self.cfg
        kv = self.kv_norm(F.linear(x, self.wkv))
        kv = self.rope(kv, pos)
        if cfg.v41:
            kv = fq.fp8(kv, 32, fqr)
        else:
            nope = cfg.head_dim - cfg.rope_dim
            kv = torch.cat([fq.fp8(kv[..., :nope], 64, fqr), kv[..., nope:]], -1)
        return kv

    def queries(self, x, pos):
        cfg = self.cfg
        qr = self.q_norm(F.linear(x, self.wq_a))
        q = F.linear(qr, self.wq_b).unflatten(-1, (cfg.n_heads, cfg.head_dim))
        if not cfg.v41:
            q = rms(q, cfg.norm_eps)                      # §3.4 step 3 (V4 only)
        q = self.rope(q, pos)
        return qr, q

    def out_proj(self, o, pos):
        cfg = self.cfg
        o = self.rope(o, pos, inverse=True)               # V carried the key's rotation
        G, R = cfg.o_groups, cfg.o_lora
        og = o.flatten(-2).unflatten(-1, (G, -1))        # [..., G, H/G*hd]
        wa = self.wo_a.view(G, R, -1)
        low = torch.einsum("...gi,gri->...gr", og, wa).flatten(-2)
        return F.linear(low, self.wo_b)

    # -- V4 compressor (§3.4) -------------------------------------------------------
    def v4_compress(self, x, wkv, wgate, ape, norm, width, ratio):
        """Returns pooled+normalised rows [B, n_win, width] for complete windows."""
        B, T, _ = x.shape
        nw = T // ratio
        if nw == 0:
            return x.new_zeros(B, 0, width)
        kv = F.linear(x[:, :nw * ratio], wkv).view(B, nw, ratio, -1)
        sc = F.linear(x[:, :nw * ratio], wgate).view(B, nw, ratio, -1) + ape
        if ratio == 4:
            # overlap: lane A = dims [0:w) of window w-1, lane B = dims [w:2w) of window w
            kva, kvb = kv[..., :width], kv[..., width:]
            sca, scb = sc[..., :width], sc[..., width:]
            prev_kv = torch.cat([kva.new_zeros(B, 1, ratio, width), kva[:, :-1]], 1)
            prev_sc = torch.cat([sca.new_full((B, 1, ratio, width), float("-inf")), sca[:, :-1]], 1)
            kv = torch.cat([prev_kv, kvb], 2)
            sc = torch.cat([prev_sc, scb], 2)
        p = torch.softmax(sc, 2)
        pooled = (p * kv).sum(2)
        return norm(pooled)

    # -- V4.1 compressor (§4.3) ----------------------------------------------------
    def v41_latent(self, x):
        B, T, _ = x.shape
        r = self.ratio
        ng = T // r
        if r == 1:
            lat = F.linear(x, self.c_wkv)
        else:
            kv = F.linear(x[:, :ng * r], self.c_wkv).view(B, ng, r, -1)
            sc = F.linear(x[:, :ng * r], self.c_wgate).view(B, ng, r, -1)
            lat = (torch.softmax(sc, 2) * kv).sum(2)
        return self.c_norm(lat)


class Block(nn.Module):
    def __init__(self, cfg, lid, ratio, draft=False, n_experts=None, n_used=None, hash_layer=False):
        super().__init__()
        self.cfg, self.lid, self.ratio = cfg, lid, ratio
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, lid, ratio, draft)
        self.hc_attn = HC(cfg)
        self.hc_ffn = HC(cfg)
        self.moe = MoE(cfg, n_experts or cfg.n_experts, n_used or cfg.n_used, hash_layer)


# ---------------------------------------------------------------------------------------
# Engram (§4.6)
# ---------------------------------------------------------------------------------------

def next_primes(cfg):
    """Per layer: primes and offsets in column order (n-2)*heads + head (§4.6)."""
    def is_prime(n):
        if n < 2:
            return False
        d = 2
        while d * d <= n:
            if n % d == 0:
                return False
            d += 1
        return True
    seen = set()
    out = []
    for _ in cfg.engram_layers:
        primes = []
        for _n in range(2, cfg.engram_ngram + 1):
            cur = cfg.engram_vocab - 1
            for _h in range(cfg.engram_heads):
                while True:
                    cur += 1
                    if is_prime(cur) and cur not in seen:
                        break
                seen.add(cur)
                primes.append(cur)
        offs = [0]
        for p in primes[:-1]:
            offs.append(offs[-1] + p)
        out.append((primes, offs, sum(primes)))
    return out


def multipliers(layer, n_comp, n):
    bound = (np.iinfo(np.int64).max // n_comp) // 2
    m = np.random.default_rng(10007 * layer).integers(0, bound, size=n) * 2 + 1
    return [int(v) for v in m]


class Engram(nn.Module):
    def __init__(self, cfg, rows):
        super().__init__()
        D, hc, K = cfg.dim, cfg.hc, cfg.engram_dim
        C = (cfg.engram_ngram - 1) * cfg.engram_heads
        self.table = nn.Parameter(torch.randn(rows, K))
        self.wkv = lin(C * K, (hc + 1) * D, 0.5)
        self.q = nn.Parameter(torch.ones(hc, D))
        self.k = nn.Parameter(torch.ones(hc, D))
        self.hc, self.D, self.K = hc, D, K
        self.eps = cfg.norm_eps

    def forward(self, X, rows, fqr):
        E = self.table[rows]                               # [B,T,C,K]
        E = fq.fp8(E, 32, fqr)                             # FP8 rows (weight QAT, r32 scales)
        E = E.flatten(-2)
        kv = F.linear(E, self.wkv)
        hc, D = self.hc, self.D
        key = kv[..., :hc * D].unflatten(-1, (hc, D))
        value = kv[..., hc * D:]
        w = self.q * self.k
        dot = (X * w * key).sum(-1) * torch.rsqrt(X.pow(2).mean(-1) + self.eps) \
            * torch.rsqrt(key.pow(2).mean(-1) + self.eps) / math.sqrt(D)
        g = torch.sigmoid(torch.sign(dot) * torch.sqrt(torch.clamp(dot.abs(), min=1e-6)))
        return X + g.unsqueeze(-1) * value.unsqueeze(-2)


def engram_rows(tokens, tmap, pad, mults, primes, offs, n_ngram, heads):
    """tokens [B,T] int64 numpy -> rows [B,T,C] (§4.6 hash; look-backs before the sequence
    start become the compressed pad id)."""
    tok = tmap[tokens]
    B, T = tok.shape
    cols = []
    r = tok * np.int64(mults[0])
    for k in range(1, n_ngram):
        prev = np.full_like(tok, pad)
        prev[:, k:] = tok[:, :-k]
        r = r ^ (prev * np.int64(mults[k]))
        for h in range(heads):
            c = (k - 1) * heads + h
            cols.append(r % np.int64(primes[c]) + np.int64(offs[c]))
    return np.stack(cols, -1)


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

class Model(nn.Module):
    def __init__(self, cfg, tmap=None, max_pos=4096):
        super().__init__()
        self.cfg = cfg
        D, V = cfg.dim, cfg.vocab
        self.embed = nn.Parameter(torch.randn(V, D))
        self.head = lin(D, V, 1.0)
        self.norm = RMSNorm(D, cfg.norm_eps)
        self.fake_round = True
        self.rope0 = Rope(cfg, False, max_pos + 16)
        self.rope_c = Rope(cfg, True, max_pos + 16)
        self.layers = nn.ModuleList()
        for i in range(cfg.n_layers):
            r = cfg.ratios[i]
            b = Block(cfg, i, r, hash_layer=(not cfg.v41 and i < cfg.n_hash))
            b.attn.rope = self.rope_c if r > 0 else self.rope0
            self.layers.append(b)
        if not cfg.v41:
            self.hc_head_fn = nn.Parameter(torch.randn(cfg.hc, cfg.hc * D) * 0.002)
            self.hc_head_base = nn.Parameter(torch.full((cfg.hc,), -1.1))
            self.hc_head_scale = nn.Parameter(torch.ones(1))
        # roles (§4.3)
        if cfg.v41:
            self.kv_src_of, self.topk_src_of, self.cand_masked = {}, {}, {}
            last_kv = last_idx = None
            for i in range(cfg.n_layers):
                if cfg.ratios[i] == 0:
                    continue
                if i in cfg.kv_src:
                    last_kv = i
                if i in cfg.idx_src:
                    last_idx = i
                self.kv_src_of[i] = last_kv
                self.topk_src_of[i] = last_idx
                self.cand_masked[i] = (i in cfg.idx_src and cfg.cand_src >= 0 and i > cfg.cand_src
                                       and i not in cfg.kv_src)
        # Engram
        self.engram = nn.ModuleDict()
        if cfg.v41 and cfg.engram_layers:
            self.primes = next_primes(cfg)
            for j, L in enumerate(cfg.engram_layers):
                self.engram[str(L)] = Engram(cfg, self.primes[j][2])
            self.tmap = np.asarray(tmap, dtype=np.int64)
            self.n_comp = int(self.tmap.max()) + 1
            self.mults = [multipliers(L, self.n_comp, cfg.engram_ngram) for L in cfg.engram_layers]
        # draft blocks
        self.drafts = nn.ModuleList()
        if cfg.v41 and cfg.n_dspark:
            for d in range(cfg.n_dspark):
                b = Block(cfg, cfg.n_layers + d, 0, draft=True, n_experts=cfg.dspark_experts,
                          n_used=cfg.dspark_used)
                b.attn.rope = self.rope0
                self.drafts.append(b)
            T = len(cfg.targets)
            self.main_proj = lin(T * D, D)
            self.main_norm = RMSNorm(D, cfg.norm_eps)
            self.draft_norm = RMSNorm(D, cfg.norm_eps)
            self.markov_embed = nn.Parameter(torch.randn(V, cfg.markov_rank) * 0.1)
            self.markov_head = nn.Parameter(torch.zeros(V, cfg.markov_rank))
            self.conf_proj = nn.Parameter(torch.zeros(1, D + cfg.markov_rank))
        if not cfg.v41 and cfg.n_mtp:
            b = Block(cfg, cfg.n_layers, 0, draft=True)
            b.attn.rope = self.rope0
            self.drafts.append(b)
            self.e_proj = lin(D, D, 0.7)
            self.h_proj = lin(D, D, 0.7)
            self.enorm = RMSNorm(D, cfg.norm_eps)
            self.hnorm = RMSNorm(D, cfg.norm_eps)
            self.mtp_norm = RMSNorm(D, cfg.norm_eps)
            self.mtp_hc_fn = nn.Parameter(torch.randn(cfg.hc, cfg.hc * D) * 0.002)
            self.mtp_hc_base = nn.Parameter(torch.full((cfg.hc,), -1.1))
            self.mtp_hc_scale = nn.Parameter(torch.ones(1))

    # ---------------------------------------------------------------------------
    def engram_hash(self, tokens_np):
        cfg = self.cfg
        pad = int(self.tmap[cfg.pad_id])
        out = {}
        for j, L in enumerate(cfg.engram_layers):
            primes, offs, _ = self.primes[j]
            out[L] = torch.from_numpy(engram_rows(tokens_np, self.tmap, pad, self.mults[j], primes,
                                                  offs, cfg.engram_ngram, cfg.engram_heads))
        return out

    def hc_head(self, X, fn, base, scale):
        flat = X.flatten(-2)
        mix = F.linear(flat, fn) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        pre = torch.sigmoid(mix * scale + base) + self.cfg.hc_eps
        return hc_collapse(pre, X)

    # ---------------------------------------------------------------------------
    def forward(self, tokens, want_draft=True, anchors=None):
        """tokens [B,T] int64. Returns dict: logits [B,T,V], aux (indexer KL), and the
        draft outputs (see draft_* methods)."""
        cfg = self.cfg
        B, T = tokens.shape
        pos = torch.arange(T)
        fqr = self.fake_round
        X = self.embed[tokens].unsqueeze(2).expand(B, T, cfg.hc, cfg.dim).contiguous()
        aux = []
        shared = {}                                    # V4.1: kv source -> (latent rows, index keys)
        topk = {}                                      # V4.1: index source -> (idx, valid)
        cand_mask = None
        mains = []
        if cfg.v41:
            rows = self.engram_hash(tokens.numpy()) if cfg.engram_layers else {}
            pre_mix = torch.zeros(B, T, cfg.hc)
            pre_mix[..., 0] = 1.0
        for i, blk in enumerate(self.layers):
            if cfg.v41:
                if str(i) in self.engram:
                    X = self.engram[str(i)](X, rows[i], fqr)
                if i in cfg.targets:
                    mains.append(X.mean(2))
                # lagged mHC (§4.2)
                R = X
                a_pre, a_post, a_comb = blk.hc_attn.mixes(X)
                x = hc_collapse(pre_mix, X)
                a, cand_mask = self.attn_v41(blk, i, blk.attn_norm(x), pos, shared, topk, cand_mask, aux)
                X = hc_post(a, R, a_post, a_comb)
                R = X
                f_pre, f_post, f_comb = blk.hc_ffn.mixes(X)
                x = hc_collapse(a_pre, X)
                f = blk.moe(blk.ffn_norm(x), tokens)
                X = hc_post(f, R, f_post, f_comb)
                pre_mix = f_pre
            else:
                R = X
                pre, post, comb = blk.hc_attn.mixes(X)
                a = self.attn_v4(blk, blk.attn_norm(hc_collapse(pre, X)), pos, aux)
                X = hc_post(a, R, post, comb)
                R = X
                pre, post, comb = blk.hc_ffn.mixes(X)
                f = blk.moe(blk.ffn_norm(hc_collapse(pre, X)), tokens)
                X = hc_post(f, R, post, comb)
        if cfg.v41:
            y = hc_collapse(pre_mix, X)
        else:
            y = self.hc_head(X, self.hc_head_fn, self.hc_head_base, self.hc_head_scale)
        logits = F.linear(self.norm(y), self.head)
        out = {"logits": logits, "aux": sum(aux) / max(len(aux), 1) if aux else logits.new_zeros(()),
               "X": X, "mains": mains}
        return out

    # ---------------------------------------------------------------------------
    def indexer_loss(self, attn_logits_c, valid_c, s_idx):
        """KL(attention mass over compressed rows || indexer softmax), both over the rows
        each query may see; the target is detached (DSA-style indexer training)."""
        with torch.no_grad():
            tgt = torch.softmax(attn_logits_c.masked_fill(~valid_c.unsqueeze(2), float("-inf")), -1)
            tgt = tgt.nan_to_num(0.0).sum(2)            # sum over heads
            tgt = tgt / tgt.sum(-1, keepdim=True).clamp_min(1e-20)
        ls = torch.log_softmax(s_idx.masked_fill(~valid_c, float("-inf")), -1)
        ls = ls.masked_fill(~valid_c, 0.0)
        has = valid_c.any(-1)
        kl = (tgt * (torch.log(tgt.clamp_min(1e-20)) - ls)).sum(-1)
        return (kl * has).sum() / has.sum().clamp_min(1)

    def attn_v4(self, blk, x, pos, aux):
        cfg, at = self.cfg, blk.attn
        fqr = self.fake_round
        B, T, _ = x.shape
        qr, q = at.queries(x, pos)
        kv = at.kv_row(x, pos, fqr)
        extra = None
        r = blk.ratio
        if r > 0:
            hd = cfg.head_dim
            rows = at.v4_compress(x, at.c_wkv, at.c_wgate, at.c_ape, at.c_norm, hd, r)
            nw = rows.shape[1]
            wpos = torch.arange(nw) * r
            rows = at.rope(rows, wpos.unsqueeze(0).expand(B, nw))
            nope = hd - cfg.rope_dim
            rows = torch.cat([fq.fp8(rows[..., :nope], 64, fqr), rows[..., nope:]], -1)
            vis = torch.arange(nw).view(1, nw) < ((pos + 1) // r).view(T, 1)   # [T, nw]
            if r == 4:
                # lightning indexer (§3.4)
                xi, qri = x.detach(), qr.detach()
                kI = at.v4_compress(xi, at.i_wkv, at.i_wgate, at.i_ape, at.i_norm, cfg.idx_dim, 4)
                kI = at.rope(kI, wpos.unsqueeze(0).expand(B, nw))
                kI = fq.fp4(hadamard(kI), 32, fqr)
                qI = F.linear(qri, at.i_wq_b).unflatten(-1, (cfg.idx_heads, cfg.idx_dim))
                qI = at.rope(qI, pos.unsqueeze(0).expand(B, T))
                qI = fq.fp4(hadamard(qI), 32, fqr)
                wI = F.linear(xi, at.i_proj) * (1.0 / math.sqrt(cfg.idx_dim)) * (1.0 / math.sqrt(cfg.idx_heads))
                sI = (torch.relu(torch.einsum("bthd,bcd->bthc", qI, kI)) * wI.unsqueeze(-1)).sum(2)
                valid_all = vis.unsqueeze(0).expand(B, T, nw)
                idx, valid = self.select(sI, valid_all, cfg.idx_topk)
                if self.training:
                    with torch.no_grad():
                        al = torch.einsum("bthd,bcd->bthc", q, rows) / math.sqrt(hd)
                    aux.append(self.indexer_loss(al, valid_all, sI))
            else:
                idx = torch.arange(nw).view(1, 1, nw).expand(B, T, nw)
                valid = vis.unsqueeze(0).expand(B, T, nw)
            extra = (rows, sel_mask(idx, valid, rows.shape[1]))
        o = window_attend(q, kv, at.sink, cfg.window, extra)
        return at.out_proj(o, pos)

    @staticmethod
    def select(scores, valid, k):
        """Top-min(k, visible) rows by score, ties lowest position first (§10.2). Returns
        (idx [B,T,k'], valid [B,T,k'])."""
        n = scores.shape[-1]
        kk = min(k, n)
        s = scores.detach().masked_fill(~valid, float("-inf"))
        idx = stable_topk_idx(s, kk) if kk else s.new_zeros(*s.shape[:-1], 0, dtype=torch.long)
        v = torch.gather(valid, -1, idx) & torch.isfinite(torch.gather(s, -1, idx))
        return idx, v

    def attn_v41(self, blk, i, x, pos, shared, topk, cand_mask, aux):
        cfg, at = self.cfg, blk.attn
        fqr = self.fake_round
        B, T, _ = x.shape
        hd = cfg.head_dim
        qr, q = at.queries(x, pos)
        kv = at.kv_row(x, pos, fqr)
        r = blk.ratio
        extra = None
        if r > 0:
            if at.kv_source:
                lat = at.v41_latent(x)                        # [B, ng, hd]
                ng = lat.shape[1]
                gpos = (torch.arange(ng) * r).unsqueeze(0).expand(B, ng)
                latd = lat.detach()                           # indexer keys: no grad into the KV path
                k = at.i_k_norm(F.linear(latd, at.i_wk))
                k = at.rope(k, gpos)
                k = fq.fp4(k, 32, fqr)
                rows = fq.fp4_e4m3(at.rope(lat, gpos), 16, fqr)
                shared[i] = (rows, k)
            src = self.kv_src_of[i]
            rows, keys = shared[src]
            ng = rows.shape[1]
            vis = torch.arange(ng).view(1, ng) < ((pos + 1) // r).view(T, 1)
            valid_all = vis.unsqueeze(0).expand(B, T, ng)
            if at.index_source:
                xi, qri = x.detach(), qr.detach()
                qI = F.linear(qri, at.i_wq_b).unflatten(-1, (cfg.idx_heads, cfg.idx_dim))
                qI = at.rope(qI, pos.unsqueeze(0).expand(B, T))
                qI = fq.fp4(qI, 32, fqr)
                wI = F.linear(xi, at.i_proj) * (1.0 / math.sqrt(cfg.idx_dim)) * (1.0 / math.sqrt(cfg.idx_heads))
                sI = (torch.relu(torch.einsum("bthd,bcd->bthc", qI, keys)) * wI.unsqueeze(-1)).sum(2)
                if i == cfg.cand_src:
                    cand_mask = self.candidates(sI, valid_all, r)
                valid_sel = valid_all
                if self.cand_masked[i] and cand_mask is not None:
                    valid_sel = valid_all & cand_mask
                idx, valid = self.select(sI, valid_sel, cfg.idx_topk)
                topk[i] = (idx, valid)
                if self.training:
                    with torch.no_grad():
                        al = torch.einsum("bthd,bcd->bthc", q, rows) / math.sqrt(hd)
                    aux.append(self.indexer_loss(al, valid_sel, sI))
            idx, valid = topk[self.topk_src_of[i]]
            extra = (rows, sel_mask(idx, valid, rows.shape[1]))
        o = window_attend(q, kv, at.sink, cfg.window, extra)
        return at.out_proj(o, pos), cand_mask

    def candidates(self, s, valid, r):
        """Candidate blocks (§4.3): block score = max over the block's visible positions,
        the block holding the newest visible position forced to +inf, the top
        min(cand_topk_blocks, n_blocks) blocks with a score > -inf kept."""
        cfg = self.cfg
        B, T, n = s.shape
        bs = cfg.cand_block
        nb = (n + bs - 1) // bs
        sm = s.detach().masked_fill(~valid, float("-inf"))
        padn = nb * bs - n
        if padn:
            sm = torch.cat([sm, sm.new_full((B, T, padn), float("-inf"))], -1)
        bsc = sm.view(B, T, nb, bs).amax(-1)
        nvis = valid.sum(-1)                                    # [B,T]
        newest = ((nvis - 1).clamp_min(0) // bs)
        has = nvis > 0
        bsc = bsc.scatter(-1, newest.unsqueeze(-1), torch.where(has, float("inf"), float("-inf")).unsqueeze(-1)
                          .expand(B, T, 1).to(bsc.dtype))
        kb = min(cfg.cand_topk_blocks, nb)
        bidx = stable_topk_idx(bsc, kb)
        bok = torch.gather(bsc, -1, bidx) > float("-inf")
        bmask = torch.zeros(B, T, nb, dtype=torch.bool)
        bmask.scatter_(-1, bidx, bok)
        return bmask.repeat_interleave(bs, -1)[..., :n] & valid

    # ---------------------------------------------------------------------------
    # Draft blocks
    # ---------------------------------------------------------------------------
    def draft_block_v41(self, blk, X, pre_mix, x_ctx_kv, ctx_pos, ctx_valid, dpos, d_tokens):
        """One DSpark stage over draft slots. X [N,S,hc,D] (N anchors, S slots), ctx rows
        x_ctx_kv [N,W,hd] (already projected, roped, quantised), ctx_valid [N,W],
        dpos [N,S] RoPE positions of the slots."""
        cfg, at = self.cfg, blk.attn
        fqr = self.fake_round
        R = X
        a_pre, a_post, a_comb = blk.hc_attn.mixes(X)
        x = blk.attn_norm(hc_collapse(pre_mix, X))
        _, q = at.queries(x, dpos)
        kv = at.kv_row(x, dpos, fqr)                              # [N,S,hd]
        N, S, H, hd = q.shape
        keys = torch.cat([x_ctx_kv, kv], 1)                       # [N, W+S, hd]
        valid = torch.cat([ctx_valid, torch.ones(N, S, dtype=torch.bool)], 1)
        sc = torch.einsum("nshd,nkd->nshk", q, keys) / math.sqrt(hd)
        sc = sc.masked_fill(~valid.view(N, 1, 1, -1), float("-inf"))
        sc = torch.cat([sc, at.sink.view(1, 1, H, 1).expand(N, S, H, 1)], -1)
        p = torch.softmax(sc, -1)[..., :-1]
        o = torch.einsum("nshk,nkd->nshd", p, keys)
        a = at.out_proj(o, dpos)
        X = hc_post(a, R, a_post, a_comb)
        R = X
        f_pre, f_post, f_comb = blk.hc_ffn.mixes(X)
        f = blk.moe(blk.ffn_norm(hc_collapse(a_pre, X)), d_tokens)
        X = hc_post(f, R, f_post, f_comb)
        return X, f_pre

    def dspark_ctx(self, mains):
        """main_x (§4.5): RMSNorm(main_proj · concat(main hiddens of the target layers))."""
        return self.main_norm(F.linear(torch.cat(mains, -1), self.main_proj))

    def dspark(self, main_x, first_tok, anchor, prev_ids, batch_idx, detach_shared=True):
        """Runs the 3 DSpark stages for N blocks. main_x [B,T,D] (per target position),
        anchor [N] = position of the known token first_tok [N] (context = positions
        < anchor, the last `window` of them), prev_ids [N,S] = the token before each slot
        (slot 0: first_tok; slot i: draft/teacher token i) for the Markov head.
        Returns logits [N,S,V], confidence logits [N,S]."""
        cfg = self.cfg
        W = cfg.window
        N = anchor.shape[0]
        cpos = anchor.view(N, 1) - W + torch.arange(W).view(1, W)        # [N,W]
        mx = main_x[batch_idx.view(N, 1), cpos.clamp_min(0)]              # [N,W,D]
        return self.dspark_rows(mx, first_tok, anchor, prev_ids, detach_shared)

    def dspark_rows(self, mx, first_tok, anchor, prev_ids, detach_shared=True):
        """dspark() on the gathered context rows: mx [N,W,D] = main_x of positions
        anchor-W .. anchor-1 (rows of negative positions are ignored: masked)."""
        cfg = self.cfg
        S, W, D = cfg.dspark_block, cfg.window, cfg.dim
        N = anchor.shape[0]
        emb = self.embed.detach() if detach_shared else self.embed
        ids = torch.full((N, S), 0, dtype=torch.long)
        ids[:, 0] = first_tok
        ids[:, 1:] = cfg.noise_id
        X = emb[ids].unsqueeze(2).expand(N, S, cfg.hc, D).contiguous()
        pre_mix = torch.zeros(N, S, cfg.hc)
        pre_mix[..., 0] = 1.0
        dpos = anchor.view(N, 1) + torch.arange(S).view(1, S)
        cpos = anchor.view(N, 1) - W + torch.arange(W).view(1, W)        # [N,W]
        cvalid = cpos >= 0
        cpos_c = cpos.clamp_min(0)
        for blk in self.drafts:
            ckv = blk.attn.kv_row(mx, cpos_c, self.fake_round)
            X, pre_mix = self.draft_block_v41(blk, X, pre_mix, ckv, cpos_c, cvalid, dpos, ids)
        y = hc_collapse(pre_mix, X)
        head = self.head.detach() if detach_shared else self.head
        logits = F.linear(self.draft_norm(y), head)
        me = self.markov_embed[prev_ids]                                  # [N,S,rank]
        logits = logits + F.linear(me, self.markov_head)
        conf = F.linear(torch.cat([y, me], -1), self.conf_proj).squeeze(-1)
        return logits, conf

    def mtp(self, Xmain, next_tokens, detach_shared=True):
        """V4 MTP block (§3.7), DeepSeek-V3 pairing: the main HC state of position p with
        the embedding of token p+1 predicts token p+2. Window attention over the MTP's own
        positions (causal), RoPE position p. Xmain [B,T,hc,D], next_tokens [B,T]."""
        cfg = self.cfg
        blk = self.drafts[0]
        B, T = next_tokens.shape
        emb = self.embed.detach() if detach_shared else self.embed
        E = F.linear(self.enorm(emb[next_tokens]), self.e_proj)
        Hp = F.linear(self.hnorm(Xmain), self.h_proj)
        X = E.unsqueeze(2) + Hp
        pos = torch.arange(T)
        R = X
        pre, post, comb = blk.hc_attn.mixes(X)
        a = self.attn_v4(blk, blk.attn_norm(hc_collapse(pre, X)), pos, [])
        X = hc_post(a, R, post, comb)
        R = X
        pre, post, comb = blk.hc_ffn.mixes(X)
        f = blk.moe(blk.ffn_norm(hc_collapse(pre, X)), next_tokens)
        X = hc_post(f, R, post, comb)
        y = self.hc_head(X, self.mtp_hc_fn, self.mtp_hc_base, self.mtp_hc_scale)
        head = self.head.detach() if detach_shared else self.head
        return F.linear(self.mtp_norm(y), head)
