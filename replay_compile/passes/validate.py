"""Numeric check of a rewrite: the rewritten graph against the original on fresh random inputs.

Why: the normal-form proof covers the algebra, not every assumption behind the canonical inputs
(a precomputed decay must be positive, a cast may change rounding, an op may be misread). Each
site is therefore run both ways for a few calls, states fed back, on inputs drawn fresh for the
recorded shapes and dtypes, inside a private op registry (NOTE [state keys] in ``ops.registry``).

# NOTE [tolerances]
A value is compared at the tolerance of its dtype, raised to the loosest dtype it was computed
through. Compared outputs, the sites' reads (NOTE [site-local check] in ``passes``): any floating dtype
of the graph. That floor dates from when the graph's own outputs were compared (in a bf16-weight model
a reassociated, correct read flips some bf16 roundings downstream and later layers spread them, ~4e-3
seen); the reads' own dtypes would be tighter, untried. States: the dtypes of their sites' canonical
inputs (``state_floor``): with fp32 inputs the check stays at fp32 precision; with bf16 factors
(transformers' bf16 Mamba-2 rounds ``dt * B`` then ``* x`` in bf16, ~3e-3 after 3 calls) no
reordering of the products reproduces eager's roundings. A misread site errs by O(1), far above.

# NOTE [random inputs]
States are drawn ``N(0, 0.25)``; other floating inputs ``N(0, 0.25)``, made non-negative when the
recorded example is (a precomputed decay stays a decay), and drawn in ``[0.5, 1]`` when the example
lies in ``(0, 1]``. Integer and boolean inputs keep their recorded values.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..ops import registry
from .normal_form import _hint

CALLS = 3


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-4 if dtype == torch.float32 else 3e-2


def _draw(example, state: bool, gen: torch.Generator):
    if isinstance(example, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _hint(example)
    if not isinstance(example, torch.Tensor) or not example.dtype.is_floating_point:
        return example.clone() if isinstance(example, torch.Tensor) else example
    x = torch.randn(example.shape, generator=gen, dtype=torch.float64) * 0.5
    if not state and example.numel() and bool((example >= 0).all()):
        x = x.abs()
        if bool((example > 0).all()) and bool((example <= 1).all()):
            x = torch.rand(example.shape, generator=gen, dtype=torch.float64) * 0.5 + 0.5
    return x.to(device=example.device, dtype=example.dtype)


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


def tolerance_of(nodes) -> float:
    """The loosest tolerance among the floating dtypes of ``nodes``' values (NOTE [tolerances])."""
    dtypes = {v.dtype for n in nodes for v in [n.meta.get("example_value", n.meta.get("val"))]
              if isinstance(v, torch.Tensor) and v.dtype.is_floating_point}
    return max((_tolerance(d) for d in dtypes), default=0.0)


def _mismatch(a, b, what: str, floor: float = 0.0) -> Optional[str]:
    if not isinstance(a, torch.Tensor):
        return None
    if not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return f"{what}: shape {getattr(b, 'shape', b)} instead of {tuple(a.shape)}"
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    nan_a, nan_b = ~torch.isfinite(a64), ~torch.isfinite(b64)
    if not torch.equal(nan_a, nan_b):
        return f"{what}: non-finite values differ"
    a64, b64 = a64.masked_fill(nan_a, 0), b64.masked_fill(nan_b, 0)
    err = float((a64 - b64).norm() / a64.norm().clamp_min(1e-30))
    tol = max(_tolerance(a.dtype), floor)
    if err > tol and float((a64 - b64).abs().max()) > 1e-30:
        return f"{what}: relative error {err:.2e} > {tol:g}"
    return None


def check(original, rewritten, example_inputs, states: list, compared: int, seed: int = 0,
          state_floor: float = 0.0) -> Optional[str]:
    """None when ``rewritten`` matches ``original`` over ``CALLS`` calls, else the mismatch.

    ``states`` are the placeholder indices of the rewritten sites' states; ``state_floor`` the least
    tolerance of their check (NOTE [tolerances]). Only the last ``compared`` outputs are compared (the
    sites' reads: NOTE [site-local check] in ``passes``); the others only feed returned states back.
    """
    gen = torch.Generator().manual_seed(seed)
    output_floor = tolerance_of(original.graph.nodes)
    with registry.scoped_registry(), torch.no_grad():
        base = [_draw(x, i in states, gen) for i, x in enumerate(example_inputs)]
        ins_a, ins_b = [_clone(x) for x in base], [_clone(x) for x in base]
        for call in range(CALLS):
            if call:
                fresh = [_draw(x, False, gen) if i not in states else None for i, x in enumerate(example_inputs)]
                for i, x in enumerate(fresh):
                    if i not in states and isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
                        ins_a[i], ins_b[i] = x.clone(), x.clone()
            out_a, out_b = _flat(original(*ins_a)), _flat(rewritten(*ins_b))
            for rs in registry.managed_states():  # speculative sites: accept every draft, as eager does
                if rs._pending is not None:
                    rs.commit(rs._pending[1])
            first = len(out_a) - compared
            for j, (a, b) in enumerate(zip(out_a, out_b)):
                for i in states:  # a returned state: feed it back next call
                    if b is ins_b[i]:
                        ins_a[i] = a
                        continue
                if j < first:
                    continue
                bad = _mismatch(a, b, f"call {call}, output {j}", output_floor)
                if bad and not any(b is ins_b[i] for i in states):
                    return bad
        for i in states:
            rs = registry.find(ins_b[i])
            if rs is not None:
                rs.materialize()
            bad = _mismatch(ins_a[i], ins_b[i], f"state {i} after {CALLS} calls", state_floor)
            if bad:
                return bad
    return None


def _flat(out) -> list:
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in _flat(x)]
    return [out]
