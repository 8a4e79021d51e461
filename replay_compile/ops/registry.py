"""Runtime objects of replay-managed states, keyed by the user's state tensor.

# NOTE [state keys]
A compiled graph receives the user's state tensor (a module buffer, a cache tensor, or an argument
fed back from the previous call); Inductor re-inplaces the mutating op onto that very tensor. The
key is the tensor's memory (device, data pointer, shape, strides, dtype): aliases of one tensor
share a ``ReplayState``, a new tensor (another batch size, another layer) gets its own. The entry
keeps the tensor alive, so an address cannot be reused by another tensor while its entry exists;
``release(obj)`` in ``api`` drops entries (after making them exact).

# NOTE [site config]
The op receives its site's configuration as one JSON string (family, window, layout, dtypes,
kernels, speculative): a string is a valid custom-op argument and keeps the op schema fixed. A
state met again under another configuration (recompiled with other options) is first made exact,
then wrapped anew.
"""
from __future__ import annotations

import contextlib
import functools
import json
from typing import Iterator, Optional

import torch

from ..runtime import ReplayState

_registry: dict = {}


def state_key(t: torch.Tensor) -> tuple:
    return (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def site_config(*, family: str, window: int, layout: str, k_heads: int, read_dtype: Optional[str],
                stochastic_rounding: bool, kernels: str, speculative: bool, read_old: bool = False) -> str:
    """``read_old``: the call's first query reads the state before its tokens (one more output row)."""
    return json.dumps(dict(family=family, window=window, layout=layout, k_heads=k_heads, read_dtype=read_dtype,
                           stochastic_rounding=stochastic_rounding, kernels=kernels, speculative=speculative,
                           read_old=read_old), sort_keys=True)


@functools.lru_cache(maxsize=None)
def parse_config(config: str) -> dict:
    return json.loads(config)


def replay_state_for(state: torch.Tensor, config: str) -> ReplayState:
    """The ``ReplayState`` of ``state`` under ``config`` (created on first use: the state is exact then)."""
    key, wanted = state_key(state), _state_part(config)
    entry = _registry.get(key)
    if entry is not None and entry[0] == wanted:
        return entry[1]
    if entry is not None:
        entry[1].materialize()
    cfg = parse_config(config)
    rs = ReplayState(state, cfg["family"], cfg["window"], layout=cfg["layout"], k_heads=cfg["k_heads"],
                     read_dtype=cfg["read_dtype"], stochastic_rounding=cfg["stochastic_rounding"],
                     kernels=cfg["kernels"])
    _registry[key] = (wanted, rs)
    return rs


@functools.lru_cache(maxsize=None)
def _state_part(config: str) -> str:
    """The part of a site config that shapes the ``ReplayState`` (not per-call flags)."""
    cfg = dict(parse_config(config))
    cfg.pop("read_old", None)
    return json.dumps(cfg, sort_keys=True)


def find(state: torch.Tensor) -> Optional[ReplayState]:
    """The ``ReplayState`` managing ``state``, if any (no creation)."""
    entry = _registry.get(state_key(state))
    return None if entry is None else entry[1]


def forget(state: torch.Tensor) -> None:
    _registry.pop(state_key(state), None)


def managed_states() -> list:
    return [rs for _, rs in _registry.values()]


@contextlib.contextmanager
def scoped_registry() -> Iterator[dict]:
    """A private registry (numeric validation, opcheck): states created inside never leak out."""
    global _registry
    saved, _registry = _registry, {}
    try:
        yield _registry
    finally:
        _registry = saved
