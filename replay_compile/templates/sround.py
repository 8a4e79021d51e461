"""Stochastic rounding of fp32 tiles to bf16 / fp16 inside a kernel, bit-exact with ``runtime/rounding.py``.

The random bits are ``tl.randint(seed, offset)`` with a 64-bit seed mixed from (base seed, slot, flush
index) and a 32-bit offset (the element's index within its slot in the physical layout), so the
Philox stream is the one ``rounding.philox_randint`` reproduces in torch.

# NOTE [exact power-of-two scaling]
``|x| / ulp`` and ``n * ulp`` must be exact (the reference computes them in float64). Powers of two
are built from exponent bits and applied in two halves, so no factor leaves fp32's normal range
(bf16's smallest ulp is 2**-133 and its scaling factor reaches 2**133); a product of an fp32 value
and a power of two is exact unless it underflows, and neither half-step does.
"""
from __future__ import annotations

import triton
import triton.language as tl

SEED_MIX_SLOT = tl.constexpr(0x9E3779B97F4A7C15 - (1 << 64))
SEED_MIX_FLUSH = tl.constexpr(0xBF58476D1CE4E5B9 - (1 << 64))
# (mantissa bits, smallest normal exponent) of each 16-bit checkpoint format
SR_FORMATS = {"bfloat16": (7, -126), "float16": (10, -14)}


@triton.jit
def _pow2(n):
    """``2**n`` as fp32 for integer tensors ``n`` in [-126, 127]."""
    return ((n + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _scale_pow2(x, n):
    """``x * 2**n`` (exact, see NOTE [exact power-of-two scaling])."""
    half = n >> 1
    return x * _pow2(half) * _pow2(n - half)


@triton.jit
def slot_seed(base_seed, slot, flush_index):
    """Philox key of one (slot, flush): int64 arithmetic that wraps like ``rounding.slot_seed``."""
    return base_seed + slot.to(tl.int64) * SEED_MIX_SLOT + flush_index.to(tl.int64) * SEED_MIX_FLUSH


@triton.jit
def stochastic_round(x, seed, offset, MANT: tl.constexpr, EMIN: tl.constexpr):
    """fp32 values of ``x`` rounded stochastically to a format with ``MANT`` mantissa bits.

    ``offset`` (int32, shaped like ``x``) indexes the Philox stream; the result is exactly
    representable in the target format, so casting it afterwards does not round again.
    """
    bits = tl.randint(seed, offset)
    u = (bits >> 8).to(tl.float32) * (1.0 / 16777216.0)
    mag = tl.abs(x)
    biased = (mag.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.maximum(biased - 127, EMIN)
    scaled = _scale_pow2(mag, MANT - e)
    down = tl.floor(scaled)
    up = (u < scaled - down).to(tl.float32)
    rounded = _scale_pow2(down + up, e - MANT)
    sign = x.to(tl.int32, bitcast=True) & -2147483648  # copysign: keeps -0.0 (negation is 0 - x in Triton)
    signed = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(mag < float("inf"), signed, x)
