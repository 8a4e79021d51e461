"""Mamba-2 (Nemotron-H, Nemotron-3): scalar decay per head, groups of heads share B and C.

Native inputs (one token; a ``T`` axis may follow ``B``)::

    x        [B, H, P]   head inputs (P = head dim = the recurrence's V)
    dt       [B, H]      raw time step, before ``softplus(dt + dt_bias)``
    A        [H]         negative per-head rate (models store ``A_log``; ``A = -exp(A_log)``)
    dt_bias  [H]
    B, C     [B, G, N]   input/output projections shared by H // G heads (N = state dim = K)
    D        [H]         optional skip, ``y += D * x``
    z        [B, H, P]   optional gate, ``y *= silu(z)``

Canonical form: ``log_a = dt * A``, ``k = B``, ``q = C``, ``v = dt * x``. Models store the state as
``[B, H, P, N]``, i.e. layout ``"vk"``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _inputs
from .base import Canonical, RecurrenceFamily, compute_dtype, kv_view
from .registry import register_family


def _dt(dt, dt_bias):
    return F.softplus(dt + dt_bias)


def to_canonical(x, dt, A, dt_bias, B, C, D=None, z=None):
    dt = _dt(dt, dt_bias)
    return Canonical(q=C, k=B, v=dt[..., None] * x, log_a=dt * A)


def finish(o, x, D=None, z=None, **_):
    y = o if D is None else o + D[..., None].to(o.dtype) * x.to(o.dtype)
    return y if z is None else y * F.silu(z.to(o.dtype))


def native_step(state, layout="vk", *, x, dt, A, dt_bias, B, C, D=None, z=None):
    """Mamba-2's decode step as transformers spells it: ``h = exp(dt*A) * h + (dt*x) B^T``, ``y = h C``."""
    cd = compute_dtype(state.dtype)
    h = kv_view(state, layout).transpose(-1, -2).to(cd)  # [B, H, P, N]
    heads, groups = h.shape[-3], B.shape[-2]
    dt = _dt(dt.to(cd), dt_bias.to(cd))
    dA = torch.exp(dt * A.to(cd))[..., None, None].expand_as(h)  # models expand the decay to [B, H, P, N]
    Bh = B.to(cd).repeat_interleave(heads // groups, dim=-2)
    Ch = C.to(cd).repeat_interleave(heads // groups, dim=-2)
    dBx = (dt[..., None] * x.to(cd))[..., :, None] * Bh[..., None, :]
    h = h * dA + dBx
    y = torch.matmul(h, Ch[..., None])[..., 0]
    y = finish(y, x, D, z)
    return y, kv_view(h.transpose(-1, -2), layout).to(state.dtype)


def make_inputs(batch, heads, head_k, head_v, k_heads=None, dtype=torch.float32, generator=None,
                layout="vk", tokens=None, long_memory=False):
    """``head_k`` is the state dim N, ``head_v`` the head dim P, ``k_heads`` the number of groups."""
    groups = k_heads or 1
    shp = lambda *rest: _inputs.token_shape(batch, tokens, *rest)  # noqa: E731
    if long_memory:  # dt * A in (log 0.9999, log 0.99999): tiny steps on slow heads
        A = -_inputs.uniform((heads,), dtype, generator, 0.5, 1.0)
        dt_bias = _inputs.uniform((heads,), dtype, generator, -11.0, -9.5)
        dt = _inputs.draw(shp(heads), dtype, generator, scale=0.1)
    else:
        A = -torch.exp(_inputs.uniform((heads,), dtype, generator, 0.0, 2.7))
        dt_bias = _inputs.uniform((heads,), dtype, generator, -4.0, -1.0)
        dt = _inputs.draw(shp(heads), dtype, generator)
    native = dict(x=_inputs.draw(shp(heads, head_v), dtype, generator), dt=dt, A=A, dt_bias=dt_bias,
                  B=_inputs.draw(shp(groups, head_k), dtype, generator),
                  C=_inputs.draw(shp(groups, head_k), dtype, generator),
                  D=_inputs.draw((heads,), dtype, generator), z=_inputs.draw(shp(heads, head_v), dtype, generator))
    return native, _inputs.state(batch, heads, head_k, head_v, dtype, generator, layout)


FAMILY = register_family(RecurrenceFamily(
    name="mamba2", decay="scalar", delta=False, to_canonical=to_canonical, finish=finish,
    native_step=native_step, make_inputs=make_inputs, aliases=("mamba-2", "nemotron_h"),
    description=__doc__.splitlines()[0]))
