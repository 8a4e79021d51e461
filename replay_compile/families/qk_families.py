"""Shared front end of the attention-like families (SimpleGLA/RetNet, GLA, DeltaNet, GDN, KDA).

They all take ``q, k [.., Hk, K]``, ``v [.., Hv, V]``, an optional log-decay ``g`` (per head or
per key channel), an optional ``beta``, a query ``scale`` (default ``K ** -0.5``) and optional
l2-normalisation of q and k. Each family file only states which of these it has.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _inputs
from .base import Canonical, RecurrenceFamily, compute_dtype, expand_heads, kv_view, l2norm


def make_family(name, *, decay, delta, l2norm_default, aliases=(), description="") -> RecurrenceFamily:
    def to_canonical(q, k, v, g=None, beta=None, scale: Optional[float] = None, use_qk_l2norm: bool = l2norm_default):
        if (g is None) != (decay == "none"):
            raise ValueError(f"{name}: log-decay g is {'required' if decay != 'none' else 'not used'}")
        if (beta is None) == delta:
            raise ValueError(f"{name}: beta is {'required' if delta else 'not used'}")
        if use_qk_l2norm:
            q, k = l2norm(q), l2norm(k)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return Canonical(q * scale, k, v, g, beta)

    def finish(o, **_):
        return o

    def native_step(state, layout="kv", **native):
        # Spelled as flash-linear-attention's fused_recurrent loops do (broadcast multiply + sum),
        # independently of the einsum form in base.standard_step.
        x = to_canonical(**native)
        h = kv_view(state, layout).to(compute_dtype(state.dtype))
        hv = h.shape[-3]
        q, k = expand_heads(x.q.to(h.dtype), hv), expand_heads(x.k.to(h.dtype), hv)
        if x.log_a is not None:
            a = x.log_a.to(h.dtype).exp()
            h = h * (a[..., None, None] if decay == "scalar" else a[..., :, None])
        v = x.v.to(h.dtype)
        if delta:
            v = (v - (h * k[..., :, None]).sum(-2)) * x.beta.to(h.dtype)[..., None]
        h = h + k[..., :, None] * v[..., None, :]
        return (h * q[..., :, None]).sum(-2), kv_view(h, layout).to(state.dtype)

    def make_inputs(batch, heads, head_k, head_v, k_heads=None, dtype=torch.float32, generator=None,
                    layout="kv", tokens=None, long_memory=False):
        k_heads = k_heads or heads
        shp = lambda *rest: _inputs.token_shape(batch, tokens, *rest)  # noqa: E731
        native = dict(q=_inputs.draw(shp(k_heads, head_k), dtype, generator),
                      k=_inputs.draw(shp(k_heads, head_k), dtype, generator),
                      v=_inputs.draw(shp(heads, head_v), dtype, generator))
        if decay == "scalar":
            native["g"] = _inputs.log_decay(shp(heads), dtype, generator, long_memory)
        elif decay == "channel":
            native["g"] = _inputs.log_decay(shp(heads, head_k), dtype, generator, long_memory)
        if delta:
            native["beta"] = _inputs.uniform(shp(heads), dtype, generator, 0.05, 0.95)
        return native, _inputs.state(batch, heads, head_k, head_v, dtype, generator, layout)

    return RecurrenceFamily(name=name, decay=decay, delta=delta, to_canonical=to_canonical, finish=finish,
                            native_step=native_step, make_inputs=make_inputs, aliases=aliases,
                            description=description)
