"""Recurrence families as data, and the canonical plain-torch math they all share.

Every family this package knows is one instance of a single recurrence over a per-head matrix
state, written here in the ``[K, V]`` orientation::

    S_t = Decay_t(S_{t-1}) + k_t u_t^T          o_t = S_t^T q_t
    u_t = v_t                                            (plain)
    u_t = beta_t * (v_t - Decay_t(S_{t-1})^T k_t)        (delta rule)

``Decay_t`` multiplies by ``exp(log_a_t)``: nothing (``decay="none"``), one scalar per head
(``"scalar"``: Mamba-2, SimpleGLA, RetNet, Gated DeltaNet) or one factor per key channel
(``"channel"``: GLA, KDA), which scales the rows of the ``[K, V]`` state.

A family is therefore two facts (decay kind, delta rule) plus a model-facing front end that turns
the model's own inputs (``dt``, ``A``, ``x``, ``B``, ``C`` for Mamba-2; ``g``, ``beta`` for Gated
DeltaNet, ...) into the canonical inputs, and a back end that finishes the output (D skip, gate).

Canonical shapes (one token; a ``T`` axis follows ``B`` for multi-token calls)::

    q, k    [B, Hk, K]      query/key heads; Hv must be a multiple of Hk (grouped heads)
    v       [B, Hv, V]
    log_a   [B, Hv] (scalar) | [B, Hv, K] (channel) | None (no decay)
    beta    [B, Hv] (delta rule) | None
    state   [B, Hv, K, V] (layout "kv") | [B, Hv, V, K] (layout "vk")
    o       [B, Hv, V]

The state layout is a parameter: the math always works on a ``[K, V]`` view of the state.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Literal, NamedTuple, Optional

import torch

DecayKind = Literal["none", "scalar", "channel"]
Layout = Literal["kv", "vk"]
LAYOUTS = ("kv", "vk")
DECAY_KINDS = ("none", "scalar", "channel")


class Canonical(NamedTuple):
    """Canonical per-token inputs of one recurrence step (see the module docstring for shapes)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    log_a: Optional[torch.Tensor] = None
    beta: Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class RecurrenceFamily:
    """One recurrence family, described as data.

    ``decay`` and ``delta`` pick the template; ``to_canonical`` maps the model's native inputs
    (keyword arguments) to :class:`Canonical`; ``finish(o, **native)`` turns the recurrence output
    into the model's output (identity for most families; D skip and z gate for Mamba-2).
    ``native_step(state, layout=..., **native) -> (y, new_state)`` is the family's reference
    step written the way models spell it; tests check it against the canonical math.
    ``make_inputs(batch, heads, ..., dtype, generator)`` draws random native inputs for tests,
    demos and benchmarks.
    """

    name: str
    decay: DecayKind
    delta: bool
    to_canonical: Callable[..., Canonical]
    finish: Callable[..., torch.Tensor]
    native_step: Callable[..., tuple]
    make_inputs: Callable[..., dict]
    aliases: tuple = ()
    description: str = ""

    def __post_init__(self):
        if self.decay not in DECAY_KINDS:
            raise ValueError(f"family {self.name!r}: decay must be one of {DECAY_KINDS}, got {self.decay!r}")

    @property
    def template(self) -> str:
        """Name of the kernel template this family lowers to: decay kind x delta rule."""
        return f"{self.decay}{'_delta' if self.delta else ''}"

    def step(self, state: torch.Tensor, x: "Canonical", layout: "Layout" = "kv"):
        """The standard single-token step on canonical inputs: ``(o [B, Hv, V], new_state)``."""
        return standard_step(state, x, delta=self.delta, layout=layout)

    def scan(self, state: torch.Tensor, xs: "Canonical", layout: "Layout" = "kv"):
        """``T`` tokens of the standard recurrence (inputs ``[B, T, ...]``): ``(o [B, T, Hv, V], final_state)``."""
        return standard_scan(state, xs, delta=self.delta, layout=layout)

    def replay(self, state: torch.Tensor, window: int, **options):
        """The replay form: a :class:`~replay_compile.runtime.ReplayState` holding ``state`` as its checkpoint."""
        from ..runtime import ReplayState  # noqa: PLC0415  (runtime imports families)

        return ReplayState(state, self, window, **options)


def kv_view(state: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The ``[..., K, V]`` view of a state stored in ``layout`` (a view: writes reach ``state``)."""
    if layout == "kv":
        return state
    if layout == "vk":
        return state.transpose(-1, -2)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def expand_heads(x: torch.Tensor, num_heads: int, dim: int = -2) -> torch.Tensor:
    """Repeat grouped q/k heads ``[..., Hk, K]`` to ``[..., num_heads, K]`` (head h uses group h // (num_heads // Hk))."""
    groups = x.shape[dim]
    if num_heads % groups:
        raise ValueError(f"{num_heads} value heads is not a multiple of {groups} query/key heads")
    return x if groups == num_heads else x.repeat_interleave(num_heads // groups, dim=dim)


def decay_factor(log_a: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor | float:
    """``exp(log_a)`` shaped to scale a ``[B, Hv, K, V]`` state (1.0 when there is no decay)."""
    if log_a is None:
        return 1.0
    a = torch.exp(log_a.to(like.dtype))
    return a[..., None, None] if a.dim() == like.dim() - 2 else a[..., :, None]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic dtype for a state stored in ``dtype``: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def standard_step(state: torch.Tensor, x: Canonical, *, delta: bool, layout: Layout = "kv"):
    """One token of the standard recurrence, functional.

    Args:
        state: ``[B, Hv, K, V]`` (``"kv"``) or ``[B, Hv, V, K]`` (``"vk"``).
        x: canonical inputs for one token (shapes in the module docstring).
    Returns:
        ``(o [B, Hv, V], new_state)``; ``new_state`` has the layout and dtype of ``state``.
    """
    cd = compute_dtype(state.dtype)
    S = kv_view(state, layout).to(cd)
    hv = S.shape[-3]
    q = expand_heads(x.q.to(cd), hv)
    k = expand_heads(x.k.to(cd), hv)
    v = x.v.to(cd)
    S = S * decay_factor(x.log_a, S)
    if delta:
        u = x.beta.to(cd)[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    else:
        u = v
    S = S + k[..., :, None] * u[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, q)
    new_state = kv_view(S, layout).to(state.dtype)
    return o, new_state


def standard_scan(state: torch.Tensor, xs: Canonical, *, delta: bool, layout: Layout = "kv"):
    """``T`` tokens of the standard recurrence: inputs carry a ``T`` axis after ``B``.

    Returns ``(o [B, T, Hv, V], final_state)``.
    """
    outs = []
    T = xs.q.shape[1]
    for t in range(T):
        step_in = Canonical(*(None if f is None else f[:, t] for f in xs))
        o, state = standard_step(state, step_in, delta=delta, layout=layout)
        outs.append(o)
    return torch.stack(outs, dim=1), state


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the normalisation GDN/KDA apply to q and k)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
