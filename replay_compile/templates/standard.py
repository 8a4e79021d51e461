"""The standard fused decode kernel: read S, update, write S, output, in one pass over the state.

This is the baseline every replay kernel is measured against, and the route the replay dispatch takes
at small batch (where replay cannot win). One template serves every family: the decay kind
(``"none"`` / ``"scalar"`` / ``"channel"``) and the delta rule are compile-time switches, the state
layout is resolved into strides on the host, grouped q/k heads are an index division.

One program owns one ``[K, BV]`` tile of one (row, value head): the whole key axis (the delta rule and
the output reduce over it) and a block of value columns (independent of each other), so a state
element is read once and written once, and the tile never leaves registers.

The same kernel runs ``T`` tokens per row with the tile in registers; the snapshot baseline
(``snapshot.py``) uses that to write one full state per draft token.

# NOTE [slot tables]
Row ``b`` reads the state at slot ``src[b]`` and writes it back to ``dst[b, j]``. A slot of ``-1`` marks
a padding row: it reads nothing, writes no state and outputs zeros (its inputs may hold garbage,
even NaN). ``standard_step`` passes ``dst = src`` (update in place); snapshots pass ``T`` columns.
Without slot tables (``src = dst = None``) row ``b`` is slot ``b``: no index tensor is built, which
keeps a small-batch step at one kernel launch.
Slot indices (int32 or int64) are widened to int64 so offsets into large pools cannot overflow.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

_DECAY_CODE = {"none": 0, "scalar": 1, "channel": 2}


@triton.jit
def _recurrent_decode_kernel(
    state, q, k, v, log_a, beta, o, src, dst,
    stride_sn, stride_sh, stride_sk, stride_sv, stride_src, stride_dst,
    ROW_IS_SLOT: tl.constexpr, T: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, DELTA: tl.constexpr, STORE_EVERY_TOKEN: tl.constexpr,
):
    """One ``[BK, BV]`` state tile of row ``b``, value head ``h``, over ``T`` tokens.

    Inputs ``q, k [B, T, HV // GROUP, K]``, ``v [B, T, HV, V]``, ``log_a [B, T, HV(, K)]``,
    ``beta [B, T, HV]``, output ``o [B, T, HV, V]``; the state is addressed through its strides
    (``stride_sk`` / ``stride_sv`` step along the key / value axis, whatever the layout).
    """
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // GROUP
    CD = o.dtype.element_ty

    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < K, offs_v < V
    tile = offs_k[:, None] * stride_sk + offs_v[None, :] * stride_sv
    mask_tile = mask_k[:, None] & mask_v[None, :]

    if ROW_IS_SLOT:
        slot = i_b
    else:
        slot = tl.load(src + i_b * stride_src).to(tl.int64)
    live = slot >= 0
    head = state + i_h * stride_sh
    S = tl.load(head + tl.maximum(slot, 0) * stride_sn + tile, mask=mask_tile & live, other=0).to(CD)

    for t in tl.static_range(T):
        tok = i_b * T + t
        b_q = tl.load(q + (tok * (HV // GROUP) + i_hk) * K + offs_k, mask=mask_k, other=0).to(CD)
        b_k = tl.load(k + (tok * (HV // GROUP) + i_hk) * K + offs_k, mask=mask_k, other=0).to(CD)
        b_v = tl.load(v + (tok * HV + i_h) * V + offs_v, mask=mask_v, other=0).to(CD)
        if DECAY == 1:
            S = S * tl.exp(tl.load(log_a + tok * HV + i_h).to(CD))
        elif DECAY == 2:
            g = tl.load(log_a + (tok * HV + i_h) * K + offs_k, mask=mask_k, other=0).to(CD)
            S = S * tl.exp(g)[:, None]
        if DELTA:
            b_beta = tl.load(beta + tok * HV + i_h).to(CD)
            b_v = b_beta * (b_v - tl.sum(S * b_k[:, None], axis=0))
        S = S + b_k[:, None] * b_v[None, :]
        b_o = tl.sum(S * b_q[:, None], axis=0)
        tl.store(o + (tok * HV + i_h) * V + offs_v, tl.where(live, b_o, 0.0), mask=mask_v)
        if STORE_EVERY_TOKEN:
            out_slot = slot if ROW_IS_SLOT else tl.load(dst + i_b * stride_dst + t).to(tl.int64)
            tl.store(head + tl.maximum(out_slot, 0) * stride_sn + tile, S.to(state.dtype.element_ty),
                     mask=mask_tile & live & (out_slot >= 0))
    if not STORE_EVERY_TOKEN:
        out_slot = slot if ROW_IS_SLOT else tl.load(dst + i_b * stride_dst).to(tl.int64)
        tl.store(head + tl.maximum(out_slot, 0) * stride_sn + tile, S.to(state.dtype.element_ty),
                 mask=mask_tile & live & (out_slot >= 0))


# NOTE [tiling]
# Measured on the H200 at batch 256 (BENCHMARKS.md, tuning sweep): a [128, 64] fp32 tile with 2 warps
# moves 90-95% of copy bandwidth for every template in either layout; [128, 32] tiles lose 10-15% on
# the kv layout (the key-axis reductions cross more warps per byte). Tiles stay <= 8K elements at
# >= 2 warps (<= 128 state registers per thread): one warp on an 8K tile ran up to 8x slower. Small batches split the
# value axis further so the grid still covers the GPU.
_MAX_TILE = 8192
_MIN_PROGRAMS = 264  # two programs per H200 SM


def default_block_v(head_k: int, head_v: int, programs_per_block: int = _MIN_PROGRAMS) -> int:
    """Value columns per program for ``[K, V]`` heads and ``programs_per_block`` (row, head) pairs.

    The largest of 64/32/16 dividing V (no masked lanes), capped by the tile budget, then halved
    while the grid is smaller than ``_MIN_PROGRAMS``.
    """
    cap = max(1, _MAX_TILE // triton.next_power_of_2(head_k))
    bv = next((b for b in (64, 32, 16) if head_v % b == 0), min(32, triton.next_power_of_2(head_v)))
    bv = min(bv, cap)
    while bv > 16 and programs_per_block * triton.cdiv(head_v, bv) < _MIN_PROGRAMS:
        bv //= 2
    return bv


def default_num_warps(block_k: int, block_v: int) -> int:
    """2 warps for tiles of 2K-8K elements (32-128 per thread); 1 for smaller tiles."""
    return 2 if block_k * block_v >= 2048 else 1


def _launch(state, q, k, v, log_a, beta, src, dst, *, delta, decay, layout, store_every_token,
            out=None, block_v=None, num_warps=None):
    """Run the kernel over ``B`` rows of ``T`` tokens (inputs ``[B, T, ...]``); returns ``o [B, T, Hv, V]``.

    ``src [B]`` / ``dst [B, J]`` are integer slot tables (any strides), or both None (row b is slot b).

    ``out`` (optional, contiguous ``[B, T, Hv, V]`` in the compute dtype) receives the outputs.
    """
    if decay not in _DECAY_CODE:
        raise ValueError(f"decay must be one of {tuple(_DECAY_CODE)}, got {decay!r}")
    if layout not in ("kv", "vk"):
        raise ValueError(f"layout must be 'kv' or 'vk', got {layout!r}")
    if (log_a is None) != (decay == "none") or (beta is None) == delta:
        raise ValueError(f"log_a/beta do not match decay={decay!r}, delta={delta}")
    B, T, Hk, K = q.shape
    Hv, V = v.shape[2], v.shape[3]
    if Hv % Hk:
        raise ValueError(f"{Hv} value heads is not a multiple of {Hk} key heads")
    if src is None and B > state.shape[0]:
        raise ValueError(f"{B} rows but the state has {state.shape[0]} slots: pass slots")
    stride_sk, stride_sv = (state.stride(2), state.stride(3)) if layout == "kv" else (state.stride(3), state.stride(2))
    cd = torch.float64 if state.dtype == torch.float64 else torch.float32
    o = torch.empty(B, T, Hv, V, dtype=cd, device=state.device) if out is None else out
    if o.shape != (B, T, Hv, V) or o.dtype != cd or not o.is_contiguous():
        raise ValueError(f"out must be a contiguous {cd} tensor of shape {(B, T, Hv, V)}")
    BK = triton.next_power_of_2(K)
    BV = block_v or default_block_v(K, V, B * Hv)
    contig = lambda t: None if t is None else t.contiguous()  # noqa: E731
    grid = (B * Hv, triton.cdiv(V, BV))
    _recurrent_decode_kernel[grid](
        state, contig(q), contig(k), contig(v), contig(log_a), contig(beta), o, src, dst,
        state.stride(0), state.stride(1), stride_sk, stride_sv,
        0 if src is None else src.stride(0), 0 if dst is None else dst.stride(0),
        ROW_IS_SLOT=src is None, T=T, HV=Hv, GROUP=Hv // Hk, K=K, V=V, BK=BK, BV=BV,
        DECAY=_DECAY_CODE[decay], DELTA=delta, STORE_EVERY_TOKEN=store_every_token,
        num_warps=num_warps or default_num_warps(BK, BV),
    )
    return o


def standard_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  log_a: Optional[torch.Tensor] = None, beta: Optional[torch.Tensor] = None, *,
                  delta: bool, decay: str, layout: str, slots: Optional[torch.Tensor] = None,
                  out: Optional[torch.Tensor] = None, block_v: Optional[int] = None,
                  num_warps: Optional[int] = None) -> torch.Tensor:
    """One decode token per row with the standard recurrence, state updated in place.

    Args:
        state: ``[N, Hv, K, V]`` (layout ``"kv"``) or ``[N, Hv, V, K]`` (``"vk"``), any float dtype
            (arithmetic in fp32; fp64 for fp64 states). May be a strided view.
        q, k: ``[B, Hk, K]``; v: ``[B, Hv, V]``; log_a: ``[B, Hv]`` (scalar decay) or ``[B, Hv, K]``
            (channel decay) or None; beta: ``[B, Hv]`` (delta rule) or None. Canonical inputs as in
            ``families/base.py`` (q already scaled).
        slots: ``[B]`` slot of each row in ``state`` (-1: padding row, zero output, no state touched);
            None means row b is slot b.
        out: optional contiguous ``[B, Hv, V]`` output buffer (fp32; fp64 for fp64 states).
        block_v, num_warps: tiling overrides (benchmark sweeps); defaults suit the H200.
    Returns:
        ``o [B, Hv, V]`` in fp32 (fp64 for fp64 states).
    """
    src = None if slots is None else slots.to(state.device)
    add_t = lambda t: None if t is None else t[:, None]  # noqa: E731
    o = _launch(state, add_t(q), add_t(k), add_t(v), add_t(log_a), add_t(beta), src, add_t(src),
                delta=delta, decay=decay, layout=layout, store_every_token=False, out=add_t(out),
                block_v=block_v, num_warps=num_warps)
    return o[:, 0]


def standard_advance(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     log_a: Optional[torch.Tensor], beta: Optional[torch.Tensor], *, delta: bool, decay: str,
                     layout: str) -> torch.Tensor:
    """``T`` decode tokens per row with the standard recurrence in one launch, state updated in place.

    Inputs as :func:`standard_step` with a token axis after ``B`` (``q, k [B, T, Hk, K]``, ``v [B, T, Hv, V]``,
    ``log_a [B, T, Hv(, K)]``, ``beta [B, T, Hv]``); row b is slot b. Returns ``o [B, T, Hv, V]`` (fp32; fp64
    for fp64 states). The compiler's standard route (NOTE [cost model] in ``passes/cost_model.py``).
    """
    return _launch(state, q, k, v, log_a, beta, None, None, delta=delta, decay=decay, layout=layout,
                   store_every_token=False)
