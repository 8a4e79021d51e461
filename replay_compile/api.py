"""Public helpers around the backend: ``explain``, ``materialize``, ``commit``, ``release``, counters.

``explain(fn, *args, **kwargs)`` compiles ``fn`` for one example call with a capturing backend that
runs the same rewrite (validation included) but executes the *original* graphs, and restores every
tensor the call could have written (arguments, module parameters and buffers), so ``fn`` behaves
afterwards as if ``explain`` had never run.
"""
from __future__ import annotations

from typing import Optional

import torch

from .ops import registry
from .options import ReplayOptions
from .passes import ReplayCompileError, Rejection, SiteReport, counters, rewrite_graph  # noqa: F401


def reset_counters() -> None:
    counters.clear()


class ExplainReport:
    """What the backend does to ``fn``: ``sites`` (rewrites) and ``rejected`` (states left alone)."""

    def __init__(self, results: list):
        self.results = results
        self.sites: list[SiteReport] = [s for r in results for s in r.sites]
        self.rejected: list[Rejection] = [x for r in results for x in r.rejected]

    def __str__(self) -> str:
        lines = [f"replayssm: {len(self.sites)} site(s) rewritten, {len(self.rejected)} state(s) left alone"]
        for s in self.sites:
            form = (f"L={s.window}, checkpoint {s.checkpoint_dtype}, read copy {s.read_dtype or 'none'}"
                    if s.route == "replay" else "standard recurrence (cost model: batch below replay's break-even)")
            lines.append(f"  rewrite {s.state}: {s.family} state {list(s.state_shape)} layout {s.layout}, "
                         f"{s.k_heads} key head(s), {form}, kernel {s.kernel}, {s.tokens} token(s)")
        for x in self.rejected:
            lines.append(f"  reject  {x.state}: {x.reason} [{x.code}]")
        for i, r in enumerate(self.results):
            lines.append(f"\n--- graph {i} before ---\n{r.before.strip()}\n--- graph {i} after ---\n{r.after.strip()}")
        return "\n".join(lines)

    __repr__ = __str__


def explain(fn, *args, options: Optional[dict] = None, **kwargs) -> ExplainReport:
    """Report the rewrites ``torch.compile(fn, backend="replayssm", options=options)`` would make."""
    opts = ReplayOptions.from_dict(options)
    results = []

    def capture(gm, example_inputs, **_):
        results.append(rewrite_graph(gm, example_inputs, opts.replace(strict=False)))
        return gm.forward

    saved = [(t, t.detach().clone()) for t in _tensors((args, kwargs, _module_of(fn)))]
    try:
        torch.compile(fn, backend=capture)(*args, **kwargs)
    finally:
        with torch.no_grad():
            for t, copy in saved:
                t.copy_(copy)
    return ExplainReport(results)


def _module_of(fn):
    if isinstance(fn, torch.nn.Module):
        return fn
    return getattr(fn, "__self__", None)


def _tensors(obj, depth: int = 0, seen=None) -> list:
    """Tensors reachable from ``obj``: containers, modules (params, buffers), plain objects' attributes."""
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or depth > 6:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return [t for t in list(obj.parameters()) + list(obj.buffers())] + \
            [t for v in vars(obj).values() if not isinstance(v, (dict, torch.nn.Module))
             for t in _tensors(v, depth + 1, seen)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v, depth + 1, seen)]
    if isinstance(obj, (list, tuple, set)):
        return [t for v in obj for t in _tensors(v, depth + 1, seen)]
    if hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
        return [t for v in vars(obj).values() for t in _tensors(v, depth + 1, seen)]
    return []


def _managed(obj) -> list:
    found, seen = [], set()
    for t in _tensors(obj):
        rs = registry.find(t)
        if rs is not None and id(rs) not in seen:
            seen.add(id(rs))
            found.append(rs)
    return found


def materialize(obj):
    """Make every replay-managed state reachable from ``obj`` exact (a tensor, module, cache object)."""
    for rs in _managed(obj):
        rs.materialize()
    return obj


def commit(obj, n_accepted) -> None:
    """Keep ``n_accepted`` (int or ``[B]`` per-row counts) drafts of the last speculative call."""
    pending = [rs for rs in _managed(obj) if rs._pending is not None]
    if not pending:
        raise ReplayCompileError("commit: no replay-managed state reachable from this object has pending drafts "
                                 "(was the last call compiled with speculative=True?)")
    for rs in pending:
        rs.commit(n_accepted)


def release(obj) -> None:
    """Make states reachable from ``obj`` exact and drop their replay runtime (rings, cursors)."""
    for t in _tensors(obj):
        registry.release(t)
