"""Reproducible stochastic rounding of fp32 values to bf16 / fp16 (the flush write of a 16-bit checkpoint).

Random bits come from Philox4x32-10 exactly as ``triton.language.randint(seed, offset)`` draws them,
so a Triton kernel and this reference round identically. The stream is keyed per slot and flush:
``seed = mix(base_seed, slot, flush_index)``, ``offset = element index within the slot``.

Rounding rule: with ``ulp`` the spacing of the target format at ``|x|`` (subnormals included),
``|x|`` goes up to the next representable value with probability ``frac(|x| / ulp)``, else down;
``u = (bits >> 8) * 2**-24`` and "up" means ``u < frac``. Non-finite values pass through.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
# (mantissa bits, smallest normal exponent) of each 16-bit target
_FORMATS = {torch.bfloat16: (7, -126), torch.float16: (10, -14)}
# odd 64-bit multipliers mixing (base seed, slot, flush index) into one Philox key
SEED_MIX = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64))


def _mulhilo(a: int, b: torch.Tensor):
    p = b * a  # < 2**64: int64 wraps, keeping the low 64 bits exactly
    return (p >> 32) & _M32, p & _M32


def philox_randint(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``tl.randint(seed, offset)`` in torch: int64 ``seed`` and ``offset`` (broadcast), uint32 values in int64."""
    c0, c1 = offset & _M32, (offset >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c2 = hi_b ^ c1 ^ k0, hi_a ^ c3 ^ k1
        c1, c3 = lo_b, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0


def slot_seed(base_seed: int, slots: torch.Tensor, flush_index: torch.Tensor) -> torch.Tensor:
    """One Philox key per (slot, flush): int64 arithmetic that wraps the same way in a kernel."""
    return base_seed + slots.to(torch.int64) * SEED_MIX[0] + flush_index.to(torch.int64) * SEED_MIX[1]


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, seed: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x [B, ...]`` to ``dtype`` (bf16/fp16) stochastically; ``seed [B]`` keys each row."""
    if dtype not in _FORMATS:
        raise ValueError(f"stochastic rounding targets bf16 or fp16, not {dtype}")
    mant, emin = _FORMATS[dtype]
    x = x.float()
    offset = torch.arange(x[0].numel(), dtype=torch.int64, device=x.device).view(x.shape[1:])
    bits = philox_randint(seed.view(-1, *[1] * (x.dim() - 1)), offset)
    u = (bits >> 8).to(torch.float64) * 2.0 ** -24
    mag = x.abs().double()
    exp = torch.frexp(mag.float())[1].to(torch.float64) - 1  # floor(log2 |x|) for x != 0
    ulp = torch.exp2(torch.clamp(exp, min=emin) - mant)
    scaled = mag / ulp
    down = torch.floor(scaled)
    rounded = (down + (u < scaled - down).to(torch.float64)) * ulp
    out = torch.where(torch.isfinite(x), torch.copysign(rounded, x.double()), x.double())
    return out.to(dtype)
