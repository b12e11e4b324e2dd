"""FP8 / FP4 fake quantisation (model-spec §10.1) with straight-through gradients.

Every function takes x (float32, last dim a multiple of `block`) and returns the fake-quantised
value in the forward pass and the identity gradient in the backward pass (QAT). With
round_=False the grid rounding is skipped (clamp and rescale only), which is what
DSI_SESSION_FLAG_NO_FAKE_QUANT does in the library (§10.4 "debug switch").

The exact recipes (§10.1):
  e4m3, UE8M0 scale: amax = max(max|x|, 1e-4); s = 2^ceil(log2(amax * f32(1/448)));
                     x <- e4m3_rne(clamp(x/s, ±448)) * s
  e2m1, UE8M0 scale: amax = max(max|x|, 6*2^-126); s = 2^ceil(log2(amax * f32(1/6)));
                     x <- e2m1_rne(clamp(x/s, ±6)) * s
  e2m1, E4M3 scale:  amax = max(max|x|, 6*2^-9); s = e4m3_rne(amax / 6);
                     x <- e2m1_rne(clamp(x/s, ±6)) * s
"""
import torch

_F32_1_448 = torch.tensor(1.0 / 448.0, dtype=torch.float32).item()
_F32_1_6 = torch.tensor(1.0 / 6.0, dtype=torch.float32).item()


def _pow2_ceil(y):
    """2^ceil(log2(y)) for positive finite float32 y, exactly (frexp, no log2 rounding)."""
    m, e = torch.frexp(y)                      # y = m * 2^e, m in [0.5, 1)
    e = torch.where(m == 0.5, e - 1, e)        # exact power of two maps to itself
    return torch.ldexp(torch.ones_like(y), e)


def e4m3_rne(v):
    """Rounds float32 values (|v| <= 448) to the E4M3FN grid, ties to even."""
    a = v.abs()
    m, e = torch.frexp(a)                      # a = m*2^e, floor(log2 a) = e-1
    ex = torch.clamp(e - 1, min=-6)            # subnormals share the 2^-6 binade step
    step = torch.ldexp(torch.ones_like(a), ex - 3)
    r = torch.round(a / step) * step           # torch.round is half-to-even
    r = torch.where(a == 0, a, r)
    return torch.copysign(r, v)


def e2m1_rne(v):
    """Rounds float32 values (|v| <= 6) to the E2M1 grid {0,.5,1,1.5,2,3,4,6}, ties to even."""
    a = v.abs()
    step = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a),
                                                                   torch.full_like(a, 2.0)))
    r = torch.round(a / step) * step
    return torch.copysign(r, v)


def _blocks(x, block):
    shp = x.shape
    return x.reshape(*shp[:-1], shp[-1] // block, block), shp


def _fake_quant(x, block, round_, floor, scale_of, lim, grid):
    """Per block of `block` values: amax (floored), scale s = scale_of(amax),
    x <- grid(clamp(x/s, ±lim)) * s (grid skipped without rounding)."""
    xb, shp = _blocks(x, block)
    s = scale_of(xb.abs().amax(-1, keepdim=True).clamp_min(floor))
    q = torch.clamp(xb / s, -lim, lim)
    if round_:
        q = grid(q)
    return (q * s).reshape(shp)


def _q_e4m3_ue8m0(x, block, round_):
    return _fake_quant(x, block, round_, 1e-4, lambda a: _pow2_ceil(a * _F32_1_448), 448.0, e4m3_rne)


def _q_e2m1_ue8m0(x, block, round_):
    return _fake_quant(x, block, round_, 6.0 * 2.0 ** -126, lambda a: _pow2_ceil(a * _F32_1_6), 6.0, e2m1_rne)


def _q_e2m1_e4m3(x, block, round_):
    return _fake_quant(x, block, round_, 6.0 * 2.0 ** -9, lambda a: e4m3_rne(a / 6.0), 6.0, e2m1_rne)


def _ste(fn, x, block, round_):
    with torch.no_grad():
        q = fn(x.detach(), block, round_)
    if not x.requires_grad:
        return q
    return x + (q - x).detach()


def fp8(x, block, round_=True):
    """e4m3 with a UE8M0 scale per `block` values (window KV, V4.1 compressed index keys...)."""
    return _ste(_q_e4m3_ue8m0, x, block, round_)


def fp4(x, block, round_=True):
    """e2m1 with a UE8M0 scale per `block` values (indexer q and k)."""
    return _ste(_q_e2m1_ue8m0, x, block, round_)


def fp4_e4m3(x, block, round_=True):
    """e2m1 with an E4M3 scale per `block` values (V4.1 compressed KV rows, blocks of 16)."""
    return _ste(_q_e2m1_e4m3, x, block, round_)
