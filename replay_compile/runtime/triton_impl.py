"""Triton implementation of the replay operations (same interface and semantics as ``reference.py``).

``advance`` runs one replay call (decode step, verify of T tokens, or the standard route with
``force_flush``) as one launch of the replay template (two for read-copy steps: NOTE [flush launch]), or, for a
verify whose form asks for it (the state's
``verify_form``, ``templates/verify_forms.py``, or ``chunked=True``), of the chunked verify template
(``templates/verify.py``); the last program of each row moves the row's
cursors (``templates/cursors.py`` NOTE [the last program moves the cursors]).
``commit`` is one tiny launch; ``materialize`` is the replay template with no tokens. Nothing here
reads a device value on the host, so every operation can be captured in a CUDA graph.

Small batches are dispatched one level up: the compiler's cost model (``passes/cost_model.py``) gives a
site the standard route below replay's break-even. This runtime has no per-call dispatch: at batch 1
the replay step measured 10.1-13.7 us against 7.8-8.8 us for the standard kernel (H200, one launch per
call, 2026-12-02), and routing a call
to ``templates/standard.py`` is only correct for rows with no pending records, which the host cannot
know without a sync.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..families.base import Canonical
from ..templates import replay, verify

def _buffers(rs) -> replay.ReplayBuffers:
    return replay.ReplayBuffers(state=rs.state, ring=rs.ring, read=rs.read, count=rs.count,
                                flushes=rs.flushes, nonfinite=rs.nonfinite, tickets=rs.tickets)


def _spec(rs) -> replay.ReplaySpec:
    return replay.ReplaySpec(decay=rs.family.decay, delta=rs.family.delta, raw=rs.raw_fold, layout=rs.layout,
                             window=rs.window, k_heads=rs.num_k_heads,
                             read_format=None if rs.read_format is None else rs.read_format.name,
                             stochastic_rounding=rs.stochastic_rounding, seed=rs.seed)


def _slots(slots: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if slots is None else slots.contiguous()


def _form_tiling(rs, spec, x: Canonical, *, commit: bool, force_flush: bool) -> Optional[dict]:
    """The chunked verify's tiling for this call under the state's verify form, or None (the token loop)."""
    T = x.q.shape[1]
    if T < 2 or commit or force_flush:  # steps and committing calls: the replay template, whatever the form
        return None
    kind, tiling = rs.verify_choice
    if kind == "auto":  # NOTE [default verify]
        activations = x.q.dtype if x.k.dtype == x.q.dtype else None
        return verify.default_tiling(spec, T, rs.compute_dtype, activations, commit=commit, force_flush=force_flush)
    if kind == "chunked" and verify.supports(spec, T, rs.compute_dtype, commit=commit, force_flush=force_flush,
                                             materialize=False):
        return tiling
    return None


def advance_into(rs, x: Canonical, slots, out: torch.Tensor, *, commit: bool, force_flush: bool,
                 block_v: Optional[int] = None, num_warps: Optional[int] = None,
                 max_registers: Optional[int] = None, items: Optional[int] = None,
                 fold_unroll: Optional[int] = None, nonflush_stages: Optional[int] = None,
                 flush_items: Optional[int] = None, nonflush_registers: Optional[int] = None,
                 nonflush_warps: Optional[int] = None, nonflush_block_v: Optional[int] = None,
                 chunked: Optional[bool] = None,
                 verify_tiling: Optional[dict] = None) -> torch.Tensor:
    """:func:`advance` writing into ``out [B, T, Hv, V]`` (contiguous, compute dtype); the keywords override
    ``templates.replay.tiling`` and ``templates.verify.tiling`` (``verify_tiling``), and ``chunked`` a verify's
    template (True: the chunked verify, False: the token loop; None: the state's ``verify_form``)."""
    B, T = x.q.shape[:2]
    if out.shape != (B, T, rs.num_heads, rs.head_v) or out.dtype != rs.compute_dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {rs.compute_dtype} tensor [{B}, {T}, {rs.num_heads}, {rs.head_v}]")
    spec = _spec(rs)
    if chunked is None and verify_tiling is None:  # the state's verify form (templates/verify_forms.py)
        verify_tiling = _form_tiling(rs, spec, x, commit=commit, force_flush=force_flush)
        chunked = verify_tiling is not None
    if chunked and T >= 2 and not (commit or force_flush):  # a verify's template (steps ignore the choice)
        if not verify.supports(spec, T, rs.compute_dtype, commit=commit, force_flush=force_flush, materialize=False):
            raise ValueError("the chunked verify serves verifies on fp32 states without a read copy")
        verify.launch(_buffers(rs), spec, x, _slots(slots), out, **(verify_tiling or {}))
        return out
    replay.launch(_buffers(rs), spec, x, _slots(slots), out, commit=commit, force_flush=force_flush,
                  materialize=False, block_v=block_v, num_warps=num_warps, max_registers=max_registers,
                  items=items, fold_unroll=fold_unroll, nonflush_stages=nonflush_stages, flush_items=flush_items,
                  nonflush_registers=nonflush_registers, nonflush_warps=nonflush_warps,
                  nonflush_block_v=nonflush_block_v)
    return out


def advance(rs, x: Canonical, slots, *, commit: bool, force_flush: bool) -> torch.Tensor:
    """Append ``T`` tokens per row (inputs ``[B, T, ...]``); outputs ``[B, T, Hv, V]``, zero on padding rows.

    See reference.py NOTE [flush points].
    """
    B, T = x.q.shape[:2]
    out = torch.empty(B, T, rs.num_heads, rs.head_v, dtype=rs.compute_dtype, device=rs.state.device)
    return advance_into(rs, x, slots, out, commit=commit, force_flush=force_flush)


def commit(rs, n_accepted: torch.Tensor, slots) -> None:
    """Advance each row's committed count by its accepted drafts (``n_accepted [B]``)."""
    replay.commit(rs.count, n_accepted, _slots(slots), rs.window)


def materialize(rs, slots) -> None:
    """Fold the committed records of ``slots`` (None: all) into their checkpoints (count -> 0)."""
    replay.launch(_buffers(rs), _spec(rs), None, _slots(slots), None, commit=False, force_flush=False,
                  materialize=True)
