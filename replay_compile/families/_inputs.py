"""Random native inputs for tests, demos and benchmarks (realistic ranges, fresh on every call)."""
from __future__ import annotations

import math
from typing import Optional

import torch


def draw(shape, dtype, generator, scale=1.0, shift=0.0) -> torch.Tensor:
    """Normal samples on the CPU with ``generator``; callers move them to a device."""
    return torch.randn(*shape, generator=generator, dtype=torch.float64).mul_(scale).add_(shift).to(dtype)


def uniform(shape, dtype, generator, lo, hi) -> torch.Tensor:
    return (torch.rand(*shape, generator=generator, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def token_shape(batch: int, tokens: Optional[int], *rest) -> tuple:
    """``[B, *rest]`` for one token, ``[B, T, *rest]`` for ``tokens`` tokens."""
    return (batch, *rest) if tokens is None else (batch, tokens, *rest)


def log_decay(shape, dtype, generator, long_memory: bool) -> torch.Tensor:
    """Log-decays in (-0.5, 0): per-step decay 0.6..1, or 0.9999..0.99999 for long-memory heads."""
    if long_memory:
        return uniform(shape, dtype, generator, math.log(0.9999), math.log(0.99999))
    return uniform(shape, dtype, generator, -0.5, -1e-3)


def state(batch, heads, head_k, head_v, dtype, generator, layout) -> torch.Tensor:
    dims = (head_k, head_v) if layout == "kv" else (head_v, head_k)
    return draw((batch, heads, *dims), dtype, generator, scale=0.5)
