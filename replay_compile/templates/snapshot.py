"""The snapshot baseline of speculative decoding, as serving engines do it today.

Each sequence owns ``1 + T`` state slots. Verifying ``T`` draft tokens reads the current state once
and writes one full state per draft token into the other ``T`` slots; committing ``n`` accepted
tokens picks the snapshot taken after token ``n`` by moving an index, no state copy. Its cost is
what ReplaySSM's verify removes: ``T`` full state writes per step and ``1 + T`` slots per sequence.

# NOTE [slot table]
``table [B, 1 + T]`` int64 lists the slots of row ``b``: column 0 holds the current state, columns
``1..T`` are scratch. ``verify`` writes the state after draft token ``t`` into column ``t + 1``;
``commit(n)`` swaps columns 0 and ``n`` of each row, so column 0 again holds the current state and the
old current slot becomes scratch. A row whose column 0 is ``-1`` is padding (zero outputs, no writes).
"""
from __future__ import annotations

from typing import Optional

import torch

from .standard import _launch


def snapshot_verify(states: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    log_a: Optional[torch.Tensor] = None, beta: Optional[torch.Tensor] = None, *,
                    table: torch.Tensor, delta: bool, decay: str, layout: str,
                    out: Optional[torch.Tensor] = None, block_v: Optional[int] = None,
                    num_warps: Optional[int] = None) -> torch.Tensor:
    """Outputs of ``T`` draft tokens per row, one state snapshot per token.

    Args:
        states: the slot pool ``[N, Hv, K, V]`` (layout ``"kv"``) or ``[N, Hv, V, K]`` (``"vk"``).
        q, k: ``[B, T, Hk, K]``; v: ``[B, T, Hv, V]``; log_a: ``[B, T, Hv(, K)]`` or None;
            beta: ``[B, T, Hv]`` or None (canonical inputs with a token axis).
        table: ``[B, 1 + T]`` slot table (NOTE [slot table]); reads column 0, writes columns ``1..T``.
        out: optional contiguous ``[B, T, Hv, V]`` output buffer.
    Returns:
        ``o [B, T, Hv, V]`` in fp32 (fp64 for fp64 states).
    """
    T = q.shape[1]
    if table.dim() != 2 or table.shape != (q.shape[0], 1 + T):
        raise ValueError(f"table must be [B, 1 + T] = [{q.shape[0]}, {1 + T}], got {tuple(table.shape)}")
    if table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"table must hold int32/int64 slot indices, got {table.dtype}")
    return _launch(states, q, k, v, log_a, beta, table[:, 0], table[:, 1:], delta=delta, decay=decay,
                   layout=layout, store_every_token=True, out=out, block_v=block_v, num_warps=num_warps)


def snapshot_commit(table: torch.Tensor, n_accepted: torch.Tensor) -> torch.Tensor:
    """Keep the snapshot after ``n_accepted[b]`` (0..T) drafts: returns the new ``[B, 1 + T]`` table.

    Swaps columns 0 and ``n`` of each row on the device (no host sync, no state copy); padding rows
    must pass ``n = 0``.
    """
    n = n_accepted.to(device=table.device, dtype=torch.int64).view(-1, 1)
    rows = torch.arange(table.shape[0], device=table.device)[:, None]
    cols = torch.arange(table.shape[1], device=table.device)[None, :].expand_as(table)
    swapped = torch.where(cols == 0, n, torch.where(cols == n, torch.zeros_like(n), cols))
    return table[rows, swapped]


def snapshot_table(batch: int, draft_len: int, device=None) -> torch.Tensor:
    """The initial table of a pool of ``batch * (1 + T)`` slots: row b owns slots ``b*(1+T) .. b*(1+T)+T``."""
    return torch.arange(batch * (1 + draft_len), dtype=torch.int64, device=device).view(batch, 1 + draft_len)
