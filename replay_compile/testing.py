"""Helpers shared by the tests, the demo and the benchmarks' correctness checks."""
from __future__ import annotations

import torch


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64; NaN or inf anywhere in ``a`` fails every tolerance."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so any element a kernel fails to write fails the check."""
    return torch.full_like(x, float("nan"))
