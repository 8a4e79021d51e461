"""Runtime objects of replay-managed states, keyed by the user's state tensor.

# NOTE [state keys]
A compiled graph receives the user's state tensor (a module buffer, a cache tensor, or an argument
fed back from the previous call); Inductor re-inplaces the mutating op onto that very tensor. The
key is the tensor's memory (device, data pointer, shape, strides, dtype): aliases of one tensor
share a ``ReplayState``, a new tensor (another batch size, another layer) gets its own.

# NOTE [entry lifetime]
An entry dies with its state's memory: the ``ReplayState`` holds the tensor weakly (NOTE [weak
state] in ``runtime.state``) and a finalizer on the tensor's storage drops the entry, freeing ring,
cursors and read copy. The storage (not the tensor object) is what counts: a cache may hand in a
fresh alias of the same memory every call. A lookup also checks that the entry's storage is the
caller's (a dead tensor's entry must never serve a new tensor at the same address, e.g. if a
finalizer is delayed by a reference cycle). Objects used inside a CUDA-graph capture are parked,
not freed, when their state dies: a captured graph keeps their ring and cursor addresses, and
replaying it after those are reused would corrupt memory; ``drop_parked()`` frees them once the
captured graphs are gone (``torch._dynamo.reset()``). ``release(obj)`` in ``api`` drops entries
early (after making them exact).

# NOTE [runtime memory]
A ``ReplayState`` is created on the first call that meets its state, which under
``mode="reduce-overhead"`` is a CUDA-graph tree's warm-up run: every allocation of the calling
thread then goes to the tree's private pool, whose checker fails on live blocks it did not hand out
as outputs, and whose memory the tree may reuse. The ring, cursors and read copy are long-lived, so
they are allocated on another thread (and a side stream ordered against the caller's), in the
ordinary pool, and recorded on the caller's stream before use.

# NOTE [site config]
The op receives its site's configuration as one JSON string (family, window, layout, dtypes,
kernels, speculative): a string is a valid custom-op argument and keeps the op schema fixed. A
state met again under another configuration (recompiled with other options) is first made exact,
then wrapped anew.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
import threading
import weakref
from typing import Iterator, Optional

import torch

from ..runtime import ReplayState

_registry: dict = {}                # state_key -> _Entry
_parked: list = []                  # ReplayStates whose state died after a CUDA-graph capture
_tokens = itertools.count()


class _Entry:
    __slots__ = ("config", "rs", "token", "captured")

    def __init__(self, config: str, rs: ReplayState):
        self.config, self.rs, self.token, self.captured = config, rs, next(_tokens), False


def state_key(t: torch.Tensor) -> tuple:
    return (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def site_config(*, family: str, window: int, layout: str, k_heads: int, read_dtype: Optional[str],
                stochastic_rounding: bool, kernels: str, speculative: bool, read_old: bool = False,
                checkpoint_dtype: Optional[str] = None, route: str = "replay", verify_form: str = "auto") -> str:
    """``read_old``: the call's first query reads the state before its tokens (one more output row).
    ``checkpoint_dtype``: a 16-bit checkpoint of a float32 state (NOTE [checkpoint dtype] in
    ``runtime.state``); None: the state is its own checkpoint. ``route="standard"``: the standard recurrence
    on the state itself, no replay state (NOTE [cost model] in ``passes.cost_model``). ``verify_form``: the
    Triton path's verify template (``templates/verify_forms.py``)."""
    return json.dumps(dict(family=family, window=window, layout=layout, k_heads=k_heads, read_dtype=read_dtype,
                           stochastic_rounding=stochastic_rounding, kernels=kernels, speculative=speculative,
                           read_old=read_old, checkpoint_dtype=checkpoint_dtype, route=route,
                           verify_form=verify_form), sort_keys=True)


@functools.lru_cache(maxsize=None)
def parse_config(config: str) -> dict:
    return json.loads(config)


def replay_state_for(state: torch.Tensor, config: str) -> ReplayState:
    """The ``ReplayState`` of ``state`` under ``config`` (created on first use: the state is exact then)."""
    wanted = _state_part(config)
    entry = _lookup(state)
    if entry is None or entry.config != wanted:
        entry = _new_entry(state, config, wanted, old=entry)
    if state.is_cuda and torch.cuda.is_current_stream_capturing():
        entry.captured = True
    return entry.rs


def _new_entry(state: torch.Tensor, config: str, wanted: str, old: Optional[_Entry]) -> _Entry:
    if old is not None:
        old.rs.materialize()
        _retire(old)
    cfg = parse_config(config)
    ckpt = cfg.get("checkpoint_dtype")
    rs = _build_runtime(state, lambda: ReplayState(
        state, cfg["family"], cfg["window"], layout=cfg["layout"], k_heads=cfg["k_heads"],
        read_dtype=cfg["read_dtype"], stochastic_rounding=cfg["stochastic_rounding"], kernels=cfg["kernels"],
        checkpoint_dtype=None if ckpt is None else getattr(torch, ckpt), weak_state=True,
        verify_form=cfg.get("verify_form", "auto")))
    entry = _Entry(wanted, rs)
    key = state_key(state)
    _registry[key] = entry
    weakref.finalize(state.untyped_storage(), _on_state_freed, _registry, key, entry.token).atexit = False
    return entry


def _build_runtime(state: torch.Tensor, build) -> ReplayState:
    """``build()`` with its CUDA allocations out of any CUDA-graph pool (NOTE [runtime memory])."""
    if state.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return build()
    main, side = torch.cuda.current_stream(state.device), torch.cuda.Stream(state.device)
    side.wait_stream(main)  # the state's latest value is what the runtime starts from

    def on_side_stream():
        with torch.cuda.device(state.device), torch.cuda.stream(side):
            return build()

    rs = in_another_thread(on_side_stream)
    main.wait_stream(side)
    for t in rs.owned_tensors():
        t.record_stream(main)
    return rs


def in_another_thread(fn):
    """``fn()`` run on a fresh thread; its result, or its exception re-raised here."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (re-raised in the caller's thread)
            result["error"] = e

    worker = threading.Thread(target=run, name="replayssm-runtime-alloc")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _lookup(state: torch.Tensor) -> Optional[_Entry]:
    """The live entry of ``state``'s memory (NOTE [entry lifetime]); a stale one is dropped."""
    key = state_key(state)
    entry = _registry.get(key)
    if entry is not None and not entry.rs.holds(state):
        _retire(_registry.pop(key))
        return None
    return entry


def _on_state_freed(table: dict, key: tuple, token: int) -> None:
    entry = table.get(key)
    if entry is not None and entry.token == token:
        del table[key]
        _retire(entry)


def _retire(entry: _Entry) -> None:
    if entry.captured:
        _parked.append(entry.rs)


def drop_parked() -> int:
    """Free the runtime buffers of dead states that CUDA graphs captured (NOTE [entry lifetime]); their count."""
    n = len(_parked)
    _parked.clear()
    return n


@functools.lru_cache(maxsize=None)
def _state_part(config: str) -> str:
    """The part of a site config that shapes the ``ReplayState`` (not per-call flags)."""
    cfg = dict(parse_config(config))
    cfg.pop("read_old", None)
    return json.dumps(cfg, sort_keys=True)


def find(state: torch.Tensor) -> Optional[ReplayState]:
    """The ``ReplayState`` managing ``state``, if any (no creation)."""
    entry = _lookup(state)
    return None if entry is None else entry.rs


def release(state: torch.Tensor) -> None:
    """Make ``state`` exact (its pending records folded in) and drop its ``ReplayState``, if it has one."""
    entry = _lookup(state)
    if entry is not None:
        entry.rs.materialize()
        _retire(_registry.pop(state_key(state)))


def is_empty() -> bool:
    """No state is replay-managed now (then no graph's inputs need a lookup)."""
    return not _registry


def managed_states() -> list:
    return [entry.rs for entry in _registry.values()]


@contextlib.contextmanager
def scoped_registry() -> Iterator[dict]:
    """A private registry (numeric validation, opcheck): states created inside never leak out."""
    global _registry
    saved, _registry = _registry, {}
    try:
        yield _registry
    finally:
        _registry = saved
