"""``replay_compile::advance``: one site's state update and reads, for T tokens, as one custom op.

Inputs are canonical and carry a token axis (``q, k [B, T, Hk, K]``, ``v [B, T, Hv, V]``,
``log_a [B, T, Hv(, K)]``, ``beta [B, T, Hv]``); the output is ``o [B, T, Hv, V]`` in the state's
compute dtype (float64 for float64 states, float32 otherwise), ``o[:, t] = S_t^T q_t``.

# NOTE [advance semantics]
``read_old``: ``q`` has one more row, read from the state *before* the tokens (NOTE [reads of the old
state] in ``passes.find_sites``); the output then has ``T + 1`` rows. Without speculation, T = 1:
``ReplayState.step`` (commits; folds when the ring fills); T > 1: chunks of at most L tokens, each
``verify`` then ``commit(all)``: eager semantics. Speculative sites append every call tentatively,
T = 1 included (``verify``), so a loop verifying one draft per call works like any other draft
length; ``replay_compile.commit(obj, n_accepted)`` keeps the accepted records, and a call before
that commit raises.
The state is declared mutated (it is the checkpoint, written at flushes), so functionalization
orders the op against every other use of the state and Inductor re-inplaces it onto the user's tensor.
``route="standard"`` (the cost model's choice below replay's break-even): the standard recurrence
updates the state every call (up to L tokens a launch); no replay state exists for it.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..families import get_family
from ..families.base import Canonical, standard_scan
from ..runtime.state import resolve_kernels
from .registry import parse_config, release, replay_state_for


def _compute_dtype(state: torch.Tensor) -> torch.dtype:
    return torch.float64 if state.dtype == torch.float64 else torch.float32


@torch.library.custom_op("replay_compile::advance", mutates_args=("state",))
def advance(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            log_a: Optional[torch.Tensor], beta: Optional[torch.Tensor], config: str) -> torch.Tensor:
    """Append T tokens to the replay state of ``state`` and return their outputs ``[B, T, Hv, V]``."""
    cfg = parse_config(config)
    if cfg.get("route") == "standard":
        return _standard(state, q, k, v, log_a, beta, cfg)
    rs = replay_state_for(state, config)
    if cfg.get("read_old"):
        old = _read_old(rs, q[:, :1], k, v, log_a, beta)
        return torch.cat([old, _append(rs, q[:, 1:], k, v, log_a, beta, cfg["speculative"])], dim=1)
    return _append(rs, q, k, v, log_a, beta, cfg["speculative"])


def _append(rs, q, k, v, log_a, beta, speculative: bool) -> torch.Tensor:
    # the runtime's outputs are fresh tensors (a custom op's output may not alias its inputs): no copy
    T = q.shape[1]
    if speculative:
        return rs.verify(q, k, v, log_a, beta)
    if T == 1:
        pick = lambda x: None if x is None else x[:, 0]  # noqa: E731
        return rs.step(pick(q), pick(k), pick(v), pick(log_a), pick(beta))[:, None]
    outs = []
    for part in _token_chunks((q, k, v, log_a, beta), rs.window):
        outs.append(rs.verify(*part))
        rs.commit(outs[-1].shape[1])
    return torch.cat(outs, dim=1)


def _token_chunks(inputs, n: int):
    """``inputs`` (``[B, T, ...]`` tensors or None) cut along tokens into chunks of at most ``n``."""
    T = inputs[0].shape[1]
    return [[None if x is None else x[:, s:s + n] for x in inputs] for s in range(0, T, n)]


def _standard(state, q, k, v, log_a, beta, cfg) -> torch.Tensor:
    """The standard recurrence over the call's tokens on ``state`` itself (NOTE [cost model]): no replay state."""
    release(state)  # replay may have managed it before (another graph of the model): its records first
    family = get_family(cfg["family"])
    if resolve_kernels(cfg["kernels"], state.device) == "triton":  # chunks of <= L tokens: the kernel unrolls them
        # imported here: a Triton template is compiled or interpreted as TRITON_INTERPRET says when it is imported,
        # and the CPU commands (`replayssm bench ... --device cpu`) set it after `import replay_compile`
        from ..templates.standard import standard_advance  # noqa: PLC0415
        return torch.cat([standard_advance(state, *part, delta=family.delta, decay=family.decay, layout=cfg["layout"])
                          for part in _token_chunks((q, k, v, log_a, beta), cfg["window"])], dim=1)
    cd = _compute_dtype(state)
    x = Canonical(*(None if t is None else t.to(cd) for t in (q, k, v, log_a, beta)))
    o, new = standard_scan(state.to(cd), x, delta=family.delta, layout=cfg["layout"])
    state.copy_(new)
    return o


def _read_old(rs, q, k, v, log_a, beta):
    """``S^T q`` of the state before this call's tokens: a neutral draft record, read, then dropped."""
    first = lambda x: None if x is None else torch.zeros_like(x[:, :1])  # noqa: E731
    o = rs.verify(q, first(k), first(v), first(log_a), first(beta))
    rs.commit(0)
    return o


@advance.register_fake
def _(state, q, k, v, log_a, beta, config):
    layout = parse_config(config)["layout"]
    heads, head_v = state.shape[1], state.shape[3] if layout == "kv" else state.shape[2]
    return q.new_empty((q.shape[0], q.shape[1], heads, head_v), dtype=_compute_dtype(state), device=state.device)
