"""Plain-PyTorch decode steps, spelled the many ways models write them, plus decoys.

The ``replayssm`` backend must find a linear recurrence by what it computes, not by how it is
written (issue 4, item 2). Each :class:`Spelling` here is one way of writing one decode step, with
metadata saying what the backend should conclude (family, state layout, grouped heads, tokens per
call, rewrite or not) and a builder that makes a fresh :class:`Case`: the function or module, its
initial state, a per-step input maker (fresh random inputs at tiny odd sizes) and, for real
recurrences, an independent float64 reference built from the families' canonical math
(``to_canonical -> standard_step -> finish``). ``tests/test_spellings.py`` proves each spelling
against that reference eagerly, then compiles it.

Decoys look like recurrences but are not (nonlinear in the state, state read elsewhere, dense
transition, ...). ``rewrite=False``: the backend must leave them alone (``rejected=True``: with a
recorded reason). ``rewrite=None``: a correct rewrite is conceivable; only equality with eager is
required.

State protocols (``Spelling.mode``):
    "returned"  ``fn(state, **inputs) -> (out, new_state)``, the caller feeds ``new_state`` back
    "inplace"   ``fn(state, **inputs) -> out``, updates ``state`` in place (an argument)
    "buffer"    ``module(**inputs) -> out``, the state is a module buffer (``Case.state_attr``)
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from replay_compile.families import Canonical, expand_heads, get_family, kv_view, standard_step
from replay_compile.families import _inputs

# Tiny odd sizes (the Triton interpreter runs the kernels on CPU CI): batch, value heads, key heads
# of grouped spellings (Mamba-2 groups), key dim (Mamba-2 state dim N), value dim (head dim P).
BATCH, HEADS, K_HEADS, HEAD_K, HEAD_V = 3, 4, 2, 5, 3
FLOATS = (torch.float32, torch.float64)
FP32_ONLY = (torch.float32,)


@dataclasses.dataclass
class Case:
    """One live instance of a spelling: call :meth:`step` with inputs from :meth:`draw`."""

    fn: Callable                          # plain function, or nn.Module for mode "buffer"
    mode: str
    state: Optional[torch.Tensor]         # the live state of modes "returned"/"inplace"
    draw: Callable[[torch.Generator], dict]
    reference: Optional[Callable] = None  # (state, inputs) -> (out, new_state), float64
    state_attr: str = "state"

    def live_state(self) -> torch.Tensor:
        return getattr(self.fn, self.state_attr) if self.mode == "buffer" else self.state

    def holder(self):
        """What ``replay_compile.materialize`` is given: the module, or the state tensor."""
        return self.fn if self.mode == "buffer" else self.state

    def step(self, inputs: dict, fn: Optional[Callable] = None):
        """One call through ``fn`` (default: the eager ``self.fn``); returns the call's output."""
        fn = self.fn if fn is None else fn
        if self.mode == "returned":
            out, self.state = fn(self.state, **inputs)
            return out
        if self.mode == "inplace":
            return fn(self.state, **inputs)
        return fn(**inputs)

    def to(self, device) -> "Case":
        """The case on ``device``: state, module and every drawn input moved there."""
        draw = self.draw
        return dataclasses.replace(
            self, fn=self.fn.to(device) if self.mode == "buffer" else self.fn,
            state=None if self.state is None else self.state.to(device),
            draw=lambda g: {n: x.to(device) for n, x in draw(g).items()})

    def twin(self) -> "Case":
        """An independent copy in the same state (for running compiled next to eager)."""
        fn = copy.deepcopy(self.fn) if self.mode == "buffer" else self.fn
        state = None if self.state is None else self.state.clone()
        return dataclasses.replace(self, fn=fn, state=state)


@dataclasses.dataclass(frozen=True)
class Spelling:
    name: str
    build: Callable[..., Case]            # (dtype, generator, batch=BATCH) -> Case
    mode: str
    family: Optional[str] = None          # expected family (decoys: None)
    layout: Optional[str] = None          # "kv" | "vk"
    grouped: bool = False                 # fewer q/k heads (or Mamba-2 groups) than value heads
    tokens: int = 1                       # tokens per call (Python loop unrolled by Dynamo)
    rewrite: Optional[bool] = True        # True: must be rewritten; False: must not; None: either
    rejected: bool = False                # decoys: must appear in explain().rejected with a reason
    dtypes: tuple = FLOATS                # state dtypes the spelling is written for
    why: str = ""                         # what the spelling exercises / why a decoy is not a recurrence

    @property
    def template(self) -> Optional[str]:
        return None if self.family is None else get_family(self.family).template


CORPUS: list[Spelling] = []


def _register(spelling: Spelling) -> None:
    assert spelling.name not in {s.name for s in CORPUS}, spelling.name
    CORPUS.append(spelling)


def by_name(name: str) -> Spelling:
    return next(s for s in CORPUS if s.name == name)


# ------------------------------------------------------------------------------------ references
def _f64(x):
    return x.double() if torch.is_tensor(x) and x.is_floating_point() else x


def _family_reference(family: str, layout: str, native_of: Callable, tokens: int, old_output: bool):
    """Reference ``(out, new_state)`` from the canonical math, in float64.

    ``native_of(raw64)`` maps the spelling's inputs (already float64) to the family's native
    keyword arguments. ``old_output``: the spelling reads its output from the state before the
    update, ``o_t = S_{t-1}^T q_t``.
    """
    fam = get_family(family)

    def reference(state, inputs):
        native = native_of({k: _f64(v) for k, v in inputs.items()})
        x = fam.to_canonical(**native)
        if tokens == 1:
            x = Canonical(*(None if f is None else f.unsqueeze(1) for f in x))
        S, outs = state.double(), []
        for t in range(x.q.shape[1]):
            xt = Canonical(*(None if f is None else f[:, t] for f in x))
            o, S_next = standard_step(S, xt, delta=fam.delta, layout=layout)
            if old_output:
                q = expand_heads(xt.q, S.shape[1])
                o = torch.einsum("bhkv,bhk->bhv", kv_view(S, layout), q)
            outs.append(o)
            S = S_next
        o = torch.stack(outs, 1)
        return fam.finish(o[:, 0] if tokens == 1 else o, **native), S

    return reference


# Maps from a qk spelling's raw inputs to the family's native arguments.
def PLAIN(r):  # noqa: N802
    return {**r, "scale": 1.0, "use_qk_l2norm": False}


def SCALED(r):  # noqa: N802
    return {**r, "scale": None, "use_qk_l2norm": False}


def L2_SCALED(r):  # noqa: N802  (the families' own l2norm: x * rsqrt(sum x^2 + 1e-6))
    return {**r, "scale": None, "use_qk_l2norm": True}


def NORMALIZE_PLAIN(r):  # noqa: N802  (F.normalize(q), F.normalize(k), no scale)
    return {**r, "q": F.normalize(r["q"], dim=-1), "k": F.normalize(r["k"], dim=-1), "scale": 1.0,
            "use_qk_l2norm": False}


def NORMALIZE_SCALED(r):  # noqa: N802
    return {**NORMALIZE_PLAIN(r), "scale": None}


def _same(r, gen=None):
    return r


def _l2(x):
    """The l2norm transformers' GDN/KDA code uses (same formula as the families')."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _tokens_arg(tokens: int):
    return None if tokens == 1 else tokens


# ---------------------------------------------------------------------------- qk-family spellings
def qk_spelling(name, family, fn, *, mode, layout="kv", grouped=False, tokens=1, native=PLAIN,
                raw=_same, old_output=False, dtypes=FLOATS, module=None, rewrite=True, why=""):
    """A spelling over the attention-like families' inputs ``q, k, v, g, beta``.

    ``raw(native_inputs, generator)`` turns the family's drawn inputs into what ``fn`` takes (e.g. a
    precomputed decay ``exp(g)``, bf16 copies); ``native(raw64)`` maps them back for the reference.
    ``module(state, first_inputs) -> nn.Module`` wraps ``fn`` for mode "buffer".
    """
    fam = get_family(family)

    def build(dtype, gen, batch=BATCH):
        def draw_native(g):
            return fam.make_inputs(batch, HEADS, HEAD_K, HEAD_V, K_HEADS if grouped else None, dtype=dtype,
                                   generator=g, layout=layout, tokens=_tokens_arg(tokens))

        _, state = draw_native(gen)
        ref = _family_reference(family, layout, native, tokens, old_output)
        draw = lambda g: raw(draw_native(g)[0], g)  # noqa: E731
        if mode == "buffer":
            m = module(state)
            return Case(m, mode, None, draw, m.reference(ref))
        return Case(fn, mode, state, draw, ref)

    _register(Spelling(name, build, mode, family, layout, grouped, tokens, rewrite, dtypes=dtypes, why=why))


def _outer(k, v):
    return k[..., :, None] * v[..., None, :]


# --- SimpleGLA / RetNet (scalar decay, no delta) ---------------------------------------------
def sgla_broadcast(S, q, k, v, g):
    S = S * g.exp()[..., None, None] + k[..., :, None] * v[..., None, :]
    return (S * q[..., :, None]).sum(-2), S


qk_spelling("sgla_broadcast_sum", "simple_gla", sgla_broadcast, mode="returned",
            why="broadcast multiply + sum, state returned and fed back")


def sgla_einsum_inplace(S, q, k, v, g):
    S.mul_(torch.exp(g)[:, :, None, None])
    S.add_(torch.einsum("bhk,bhv->bhkv", k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q) * q.shape[-1] ** -0.5


qk_spelling("sgla_einsum_inplace_scaled_out", "simple_gla", sgla_einsum_inplace, mode="inplace", native=SCALED,
            why="mul_/add_ chain on an argument, einsum, query scale applied to the output")


def sgla_einsum_names_vk(S, q, k, v, g):
    decay = torch.exp(g).unsqueeze(-1).unsqueeze(-1)
    new = decay * S + torch.einsum("zyi,zyj->zyij", v, k)
    return torch.einsum("zyij,zyj->zyi", new, q), new


qk_spelling("sgla_einsum_other_names_vk", "simple_gla", sgla_einsum_names_vk, mode="returned", layout="vk",
            why="einsum with unusual index names, [V, K] state, decay on the left")


def sgla_matmul_unsqueeze(S, q, k, v, g):
    a = g.exp()[..., None, None]
    S.copy_(S * a + k.unsqueeze(-1) @ v.unsqueeze(-2))
    return (q.unsqueeze(-2) @ S).squeeze(-2)


qk_spelling("sgla_matmul_unsqueeze_copy", "simple_gla", sgla_matmul_unsqueeze, mode="inplace",
            why="@ with unsqueeze, decay on the right, written back with copy_")


def sgla_bmm_flat(S, q, k, v, g):
    b, h, dk, dv = S.shape
    Sf = S.reshape(b * h, dk, dv) * g.exp().reshape(b * h, 1, 1)
    Sf = Sf + torch.bmm(k.reshape(b * h, dk, 1), v.reshape(b * h, 1, dv))
    o = torch.bmm(Sf.transpose(1, 2), q.reshape(b * h, dk, 1))
    return o.reshape(b, h, dv), Sf.reshape(b, h, dk, dv)


qk_spelling("sgla_bmm_flattened_heads", "simple_gla", sgla_bmm_flat, mode="returned",
            why="bmm over flattened batch*heads, transpose for the read")


def sgla_permute_matmul(S, q, k, v, g):
    S.mul_(g.exp()[..., None, None]).add_(_outer(k, v))
    return torch.matmul(S.permute(0, 1, 3, 2), q.unsqueeze(-1)).squeeze(-1)


qk_spelling("sgla_permute_matmul", "simple_gla", sgla_permute_matmul, mode="inplace",
            why="matmul with permute for S^T q")


def sgla_vk_matmul(S, q, k, v, g):
    S.mul_(g.exp()[..., None, None]).add_(v[..., :, None] * k[..., None, :])
    return torch.matmul(S, q.unsqueeze(-1)).squeeze(-1)


qk_spelling("sgla_vk_matmul_inplace", "simple_gla", sgla_vk_matmul, mode="inplace", layout="vk",
            why="[V, K] state, in-place chain, S @ q")


def sgla_precomputed_decay(S, q, k, v, a):
    S = a[:, :, None, None] * S + k[..., :, None] * v[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


def _exp_g_as_a(r, gen=None):
    r = dict(r)
    r["a"] = r.pop("g").exp()
    return r


def _log_a_as_g(native):
    def f(r):
        r = dict(r)
        r["g"] = r.pop("a").log()
        return native(r)
    return f


qk_spelling("sgla_precomputed_decay", "simple_gla", sgla_precomputed_decay, mode="returned", raw=_exp_g_as_a,
            native=_log_a_as_g(PLAIN), why="decay passed in already exponentiated")


def sgla_old_state_output(S, q, k, v, g):
    o = torch.einsum("bhkv,bhk->bhv", S, q)
    S = S * g.exp()[..., None, None] + torch.einsum("bhk,bhv->bhkv", k, v)
    return o, S


qk_spelling("sgla_output_from_old_state", "simple_gla", sgla_old_state_output, mode="returned", old_output=True,
            why="output read from the state before the update")


def sgla_old_state_output_vk(S, q, k, v, g):
    o = (S * q[..., None, :]).sum(-1)
    S.mul_(g.exp()[..., None, None]).add_(v.unsqueeze(-1) * k.unsqueeze(-2))
    return o


qk_spelling("sgla_output_from_old_state_vk_inplace", "simple_gla", sgla_old_state_output_vk, mode="inplace",
            layout="vk", old_output=True, why="old-state read, then in-place update of a [V, K] state")


def sgla_grouped_repeat(S, q, k, v, g):
    rep = S.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    S = S * torch.exp(g)[..., None, None] + torch.einsum("bhk,bhv->bhkv", k, v)
    return torch.einsum("bhkv,bhk->bhv", S, q), S


qk_spelling("sgla_grouped_repeat_interleave", "simple_gla", sgla_grouped_repeat, mode="returned", grouped=True,
            why="q/k heads repeated with repeat_interleave")


def _expand_heads(x, heads):
    b, hk, d = x.shape
    return x[:, :, None, :].expand(b, hk, heads // hk, d).reshape(b, heads, d)


def sgla_grouped_expand_vk(S, q, k, v, g):
    q, k = _expand_heads(q, S.shape[1]), _expand_heads(k, S.shape[1])
    S.mul_(torch.exp(g)[..., None, None])
    S.add_(torch.einsum("bhv,bhk->bhvk", v, k))
    return torch.einsum("bhvk,bhk->bhv", S, q)


qk_spelling("sgla_grouped_expand_vk_inplace", "simple_gla", sgla_grouped_expand_vk, mode="inplace",
            layout="vk", grouped=True, why="q/k heads repeated with expand + reshape, [V, K] state")


def sgla_normalized(S, q, k, v, g):
    q = F.normalize(q, dim=-1) * q.shape[-1] ** -0.5
    k = F.normalize(k, dim=-1)
    S = g.exp()[..., None, None] * S + _outer(k, v)
    return (S * q[..., :, None]).sum(-2), S


qk_spelling("sgla_l2_normalized_qk", "simple_gla", sgla_normalized, mode="returned", native=NORMALIZE_SCALED,
            why="F.normalize on q and k, query scale")


def sgla_bf16_upcast(S, q, k, v, g):
    q, k, v, g = q.float(), k.float(), v.float(), g.float()
    S.mul_(g.exp()[..., None, None]).add_(_outer(k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q)


def _to_bf16(r, gen=None):
    return {n: x.to(torch.bfloat16) for n, x in r.items()}


qk_spelling("sgla_bf16_inputs_upcast", "simple_gla", sgla_bf16_upcast, mode="inplace", raw=_to_bf16,
            dtypes=FP32_ONLY, why="bf16 activations upcast with .float() before an fp32 state update")


def sgla_loop(S, q, k, v, g):
    outs = []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, 1), S


qk_spelling("sgla_python_loop_T3", "simple_gla", sgla_loop, mode="returned", tokens=3,
            why="Python loop over 3 tokens (one multi-token site)")


class _RetNet(nn.Module):
    """RetNet's recurrent form: fixed per-head decay gamma_h = 1 - 2^(-5-h), state as a buffer."""

    def __init__(self, state, layout):
        super().__init__()
        heads = state.shape[1]
        self.layout = layout
        self.register_buffer("state", state.clone())
        self.register_buffer("gamma", (1 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64))).to(state.dtype))

    def forward(self, q, k, v):
        scale = q.shape[-1] ** -0.5
        if q.dim() == 3:
            return self._token(q * scale, k, v)
        return torch.stack([self._token(q[:, t] * scale, k[:, t], v[:, t]) for t in range(q.shape[1])], 1)

    def _token(self, q, k, v):
        if self.layout == "kv":
            self.state.mul_(self.gamma[:, None, None]).add_(k.unsqueeze(-1) * v.unsqueeze(-2))
            return torch.einsum("bhkv,bhk->bhv", self.state, q)
        self.state.copy_(self.gamma.view(1, -1, 1, 1) * self.state + v.unsqueeze(-1) * k.unsqueeze(-2))
        return (self.state @ q.unsqueeze(-1)).squeeze(-1)

    def reference(self, family_reference):
        def ref(state, inputs):
            g = self.gamma.double().log().expand(*inputs["q"].shape[:-2], -1)
            return family_reference(state, {**inputs, "g": g})
        return ref


def _drop_g(r, gen=None):
    return {n: x for n, x in r.items() if n != "g"}


qk_spelling("retnet_fixed_decay_buffer", "simple_gla", None, mode="buffer", raw=_drop_g, native=SCALED,
            module=lambda state: _RetNet(state, "kv"), why="RetNet fixed decay buffer, state as a module buffer")
qk_spelling("retnet_fixed_decay_buffer_vk_loop_T2", "simple_gla", None, mode="buffer", layout="vk", tokens=2,
            raw=_drop_g, native=SCALED, module=lambda state: _RetNet(state, "vk"),
            why="RetNet, [V, K] buffer written with copy_, Python loop over 2 tokens")


# --- GLA (per-key-channel decay, no delta) ----------------------------------------------------
def gla_broadcast(S, q, k, v, g):
    S = S * g.exp()[..., :, None] + k[..., :, None] * v[..., None, :]
    return (S * q[..., :, None]).sum(-2), S


qk_spelling("gla_broadcast_sum", "gla", gla_broadcast, mode="returned", why="per-channel decay, broadcast form")


def gla_einsum_vk(S, q, k, v, g):
    S.mul_(g.exp().unsqueeze(-2))
    S.add_(torch.einsum("bhv,bhk->bhvk", v, k))
    return torch.einsum("bhvk,bhk->bhv", S, q * q.shape[-1] ** -0.5)


qk_spelling("gla_einsum_vk_inplace", "gla", gla_einsum_vk, mode="inplace", layout="vk", native=SCALED,
            why="per-channel decay along the last dim of a [V, K] state, einsum")


class _GLAPrecomputed(nn.Module):
    """GLA with grouped q/k heads and a precomputed per-channel decay ``a = exp(g)``."""

    def __init__(self, state):
        super().__init__()
        self.register_buffer("state", state.clone())

    def forward(self, q, k, v, a):
        rep = self.state.shape[1] // q.shape[1]
        q, k = q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)
        self.state.copy_(a.unsqueeze(-1) * self.state + torch.matmul(k.unsqueeze(-1), v.unsqueeze(-2)))
        return torch.matmul(q.unsqueeze(-2), self.state).squeeze(-2)

    @staticmethod
    def reference(family_reference):
        return family_reference


qk_spelling("gla_grouped_precomputed_buffer", "gla", None, mode="buffer", grouped=True, raw=_exp_g_as_a,
            native=_log_a_as_g(PLAIN), module=_GLAPrecomputed,
            why="module buffer, grouped heads, precomputed per-channel decay, matmul")


def gla_loop(S, q, k, v, g):
    outs = []
    for t in range(q.shape[1]):
        S.copy_(S * torch.exp(g[:, t]).unsqueeze(-1) + torch.einsum("bhk,bhv->bhkv", k[:, t], v[:, t]))
        outs.append((S * q[:, t].unsqueeze(-1)).sum(-2))
    return torch.stack(outs, 1)


qk_spelling("gla_python_loop_T2_inplace", "gla", gla_loop, mode="inplace", tokens=2,
            why="Python loop over 2 tokens writing an argument with copy_")


def gla_old_state_output(S, q, k, v, g):
    o = torch.einsum("bhkv,bhk->bhv", S, q)
    return o, S * g.exp()[..., :, None] + _outer(k, v)


qk_spelling("gla_output_from_old_state", "gla", gla_old_state_output, mode="returned", old_output=True,
            why="per-channel decay, output from the old state")


# --- DeltaNet (no decay, delta rule) ----------------------------------------------------------
def deltanet_broadcast(S, q, k, v, beta):
    q, k = _l2(q) * q.shape[-1] ** -0.5, _l2(k)
    kv_mem = (S * k[..., :, None]).sum(-2)
    delta = (v - kv_mem) * beta[..., None]
    S = S + k[..., :, None] * delta[..., None, :]
    return (S * q[..., :, None]).sum(-2), S


qk_spelling("deltanet_broadcast_sum", "deltanet", deltanet_broadcast, mode="returned", native=L2_SCALED,
            why="delta rule, rsqrt l2norm, broadcast + sum")


def deltanet_matmul_vk(S, q, k, v, beta):
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    kv_mem = (S @ k.unsqueeze(-1)).squeeze(-1)
    u = beta.unsqueeze(-1) * (v - kv_mem)
    S.add_(u.unsqueeze(-1) @ k.unsqueeze(-2))
    return (S @ q.unsqueeze(-1)).squeeze(-1)


qk_spelling("deltanet_matmul_vk_inplace", "deltanet", deltanet_matmul_vk, mode="inplace", layout="vk",
            native=NORMALIZE_PLAIN, why="delta rule with @ on a [V, K] state, in place")


def deltanet_householder(S, q, k, v, beta):
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    bk = beta[..., None] * k
    eye = torch.eye(k.shape[-1], dtype=S.dtype, device=S.device)
    S = (eye - bk[..., :, None] * k[..., None, :]) @ S + bk[..., :, None] * v[..., None, :]
    return (S * q[..., :, None]).sum(-2), S


# A correct rewrite needs (I - b k k^T) recognised in a matrix product: either outcome is fine.
qk_spelling("deltanet_householder_form", "deltanet", deltanet_householder, mode="returned", rewrite=None,
            native=NORMALIZE_PLAIN, why="delta rule as (I - b k k^T) @ S + b k v^T (dense-looking transition)")


# --- Gated DeltaNet (scalar decay, delta rule) -------------------------------------------------
def gdn_transformers(S, q, k, v, g, beta):
    """One token of transformers' torch_recurrent_gated_delta_rule (Qwen3-Next), grouped heads."""
    rep = S.shape[1] // q.shape[1]
    q, k = _l2(q).repeat_interleave(rep, dim=1), _l2(k).repeat_interleave(rep, dim=1)
    q = q * q.shape[-1] ** -0.5
    S = S * g.exp().unsqueeze(-1).unsqueeze(-1)
    kv_mem = (S * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    S = S + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (S * q.unsqueeze(-1)).sum(dim=-2), S


qk_spelling("gdn_transformers_grouped", "gated_deltanet", gdn_transformers, mode="returned", grouped=True,
            native=L2_SCALED, why="transformers' recurrent gated delta rule, repeat_interleave heads")


def gdn_einsum_vk(S, q, k, v, a, b, A_log, dt_bias):
    """Qwen3-Next's gate computed in the step: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    g = -A_log.exp() * F.softplus(a + dt_bias)
    beta = b.sigmoid()
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    S.mul_(torch.exp(g)[..., None, None])
    kv_mem = torch.einsum("bhvk,bhk->bhv", S, k)
    S.add_(torch.einsum("bhv,bhk->bhvk", (v - kv_mem) * beta[..., None], k))
    return torch.einsum("bhvk,bhk->bhv", S, q)


def _qwen3_next_gate(r, gen):
    """Raw gate inputs drawn around Qwen3-Next's ranges; the family's own g and beta are dropped."""
    dtype, lead = r["v"].dtype, r["v"].shape[:-1]
    out = {n: r[n] for n in ("q", "k", "v")}
    out["a"] = _inputs.draw(lead, dtype, gen)
    out["b"] = _inputs.draw(lead, dtype, gen)
    out["A_log"] = _inputs.uniform(lead[-1:], dtype, gen, -2.0, 0.5)
    out["dt_bias"] = _inputs.uniform(lead[-1:], dtype, gen, -3.0, 0.0)
    return out


def _qwen3_next_native(r):
    g = -r["A_log"].exp() * F.softplus(r["a"] + r["dt_bias"])
    return NORMALIZE_PLAIN({"q": r["q"], "k": r["k"], "v": r["v"], "g": g, "beta": r["b"].sigmoid()})


qk_spelling("gdn_qwen3_next_gate_vk_inplace", "gated_deltanet", gdn_einsum_vk, mode="inplace", layout="vk",
            raw=_qwen3_next_gate, native=_qwen3_next_native,
            why="decay and beta computed from raw gate inputs in the step, einsum, [V, K] state in place")


class _GDNLoop(nn.Module):
    """Gated DeltaNet over T tokens per call, expand-repeated heads, state as a buffer."""

    def __init__(self, state):
        super().__init__()
        self.register_buffer("state", state.clone())

    def forward(self, q, k, v, g, beta):
        heads, outs = self.state.shape[1], []
        for t in range(q.shape[1]):
            qt, kt = _expand_heads(_l2(q[:, t]), heads), _expand_heads(_l2(k[:, t]), heads)
            S = self.state * g[:, t, :, None, None].exp()
            u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
            self.state.copy_(S + torch.einsum("bhk,bhv->bhkv", kt, u))
            outs.append(torch.einsum("bhkv,bhk->bhv", self.state, qt * qt.shape[-1] ** -0.5))
        return torch.stack(outs, 1)

    @staticmethod
    def reference(family_reference):
        return family_reference


qk_spelling("gdn_python_loop_T3_buffer", "gated_deltanet", None, mode="buffer", grouped=True, tokens=3,
            native=L2_SCALED, module=_GDNLoop, why="module buffer, Python loop over 3 tokens, expand heads")


def gdn_bf16_upcast(S, q, k, v, g, beta):
    q, k, v = _l2(q.float()), _l2(k.float()), v.float()
    S.mul_(g.float().exp()[..., None, None])
    delta = (v - (S * k[..., :, None]).sum(-2)) * beta.float()[..., None]
    S.add_(k[..., :, None] * delta[..., None, :])
    return (S * q[..., :, None]).sum(-2)


qk_spelling("gdn_bf16_inputs_upcast_inplace", "gated_deltanet", gdn_bf16_upcast, mode="inplace", raw=_to_bf16,
            native=lambda r: {**r, "scale": 1.0, "use_qk_l2norm": True}, dtypes=FP32_ONLY,
            why="bf16 activations upcast, in-place delta rule")


# --- KDA (per-key-channel decay, delta rule) ---------------------------------------------------
def kda_broadcast(S, q, k, v, g, beta):
    q, k = _l2(q) * q.shape[-1] ** -0.5, _l2(k)
    S = S * g.exp()[..., :, None]
    delta = (v - (S * k[..., :, None]).sum(-2)) * beta[..., None]
    S = S + k[..., :, None] * delta[..., None, :]
    return (S * q[..., :, None]).sum(-2), S


qk_spelling("kda_broadcast_sum", "kda", kda_broadcast, mode="returned", native=L2_SCALED,
            why="per-channel decay + delta rule, broadcast form")


def kda_grouped_vk(S, q, k, v, g, beta):
    heads = S.shape[1]
    q, k = _expand_heads(F.normalize(q, dim=-1), heads), _expand_heads(F.normalize(k, dim=-1), heads)
    S.mul_(torch.exp(g)[:, :, None, :])
    u = (v - torch.einsum("nhvk,nhk->nhv", S, k)) * beta[..., None]
    S.add_(torch.einsum("nhv,nhk->nhvk", u, k))
    return torch.einsum("nhvk,nhk->nhv", S, q)


qk_spelling("kda_grouped_expand_vk_inplace", "kda", kda_grouped_vk, mode="inplace", layout="vk", grouped=True,
            native=NORMALIZE_PLAIN, why="KDA on a [V, K] state in place, expand heads")


def kda_loop(S, q, k, v, g, beta):
    outs = []
    for t in range(q.shape[1]):
        qt, kt = _l2(q[:, t]), _l2(k[:, t])
        S = S * g[:, t].exp().unsqueeze(-1)
        kv_mem = (kt.unsqueeze(-2) @ S).squeeze(-2)
        S = S + kt.unsqueeze(-1) @ (beta[:, t].unsqueeze(-1) * (v[:, t] - kv_mem)).unsqueeze(-2)
        outs.append((qt.unsqueeze(-2) @ S).squeeze(-2) * qt.shape[-1] ** -0.5)
    return torch.stack(outs, 1), S


qk_spelling("kda_python_loop_T2", "kda", kda_loop, mode="returned", tokens=2, native=L2_SCALED,
            why="KDA, Python loop over 2 tokens with @")


# ----------------------------------------------------------------------------- Mamba-2 spellings
def mamba2_spelling(name, fn, *, mode, layout="vk", groups=K_HEADS, tokens=1, keys, raw=_same, module=None,
                    dtypes=FLOATS, why=""):
    """A Mamba-2 spelling; ``keys``: which native inputs ``fn`` takes per call (others are parameters)."""
    fam = get_family("mamba2")

    def build(dtype, gen, batch=BATCH):
        def draw_native(g):
            return fam.make_inputs(batch, HEADS, HEAD_K, HEAD_V, groups, dtype=dtype, generator=g, layout=layout,
                                   tokens=_tokens_arg(tokens))

        first, state = draw_native(gen)
        draw = lambda g: raw({n: x for n, x in draw_native(g)[0].items() if n in keys}, g)  # noqa: E731
        if mode == "buffer":
            m = module(state, first)
            ref = _family_reference("mamba2", layout, m.native, tokens, False)
            return Case(m, mode, None, draw, ref, state_attr="ssm_state")
        native = lambda r: {"D": None, "z": None, **r}  # noqa: E731
        return Case(fn, mode, state, draw, _family_reference("mamba2", layout, native, tokens, False))

    _register(Spelling(name, build, mode, "mamba2", layout, groups < HEADS, tokens, dtypes=dtypes, why=why))


class _Mamba2Mixer(nn.Module):
    """Mamba-2's decode step as transformers' torch path writes it: buffer ``ssm_state [B, H, P, N]``."""

    def __init__(self, state, params, upcast=False):
        super().__init__()
        self.upcast = upcast
        self.register_buffer("ssm_state", state.clone())
        self.A_log = nn.Parameter(torch.log(-params["A"]), requires_grad=False)
        self.dt_bias = nn.Parameter(params["dt_bias"].clone(), requires_grad=False)
        self.D = nn.Parameter(params["D"].clone(), requires_grad=False)

    def forward(self, x, dt, B, C, z):
        if x.dim() == 3:
            return self._token(x, dt, B, C, z)
        return torch.stack([self._token(x[:, t], dt[:, t], B[:, t], C[:, t], z[:, t]) for t in range(x.shape[1])], 1)

    def _token(self, x, dt, B, C, z):
        if self.upcast:
            x, dt, B, C, z = x.float(), dt.float(), B.float(), C.float(), z.float()
        heads, P, N = self.ssm_state.shape[1:]
        A = -torch.exp(self.A_log.float() if self.upcast else self.A_log)
        dt = F.softplus(dt + self.dt_bias)
        dA = torch.exp(dt[..., None, None] * A[:, None, None]).expand(-1, -1, P, N)
        rep = heads // B.shape[1]
        B, C = B.repeat_interleave(rep, dim=1), C.repeat_interleave(rep, dim=1)
        dBx = (dt[..., None] * x)[..., None] * B[:, :, None, :]
        self.ssm_state.copy_(self.ssm_state * dA + dBx)
        y = torch.matmul(self.ssm_state, C[..., None]).squeeze(-1)
        y = y + x * self.D[:, None]
        return y * F.silu(z)

    def native(self, r):
        return {**r, "A": -self.A_log.double().exp(), "dt_bias": self.dt_bias.double(), "D": self.D.double()}


mamba2_spelling("mamba2_transformers_buffer", None, mode="buffer", keys=("x", "dt", "B", "C", "z"),
                module=_Mamba2Mixer, why="transformers' Mamba-2 decode: decay expanded to [B,H,P,N], groups, D, z")
mamba2_spelling("mamba2_transformers_buffer_loop_T3", None, mode="buffer", tokens=3, keys=("x", "dt", "B", "C", "z"),
                module=_Mamba2Mixer, why="Mamba-2 mixer stepping 3 tokens in a Python loop")
mamba2_spelling("mamba2_bf16_upcast_buffer_one_group", None, mode="buffer", groups=1,
                keys=("x", "dt", "B", "C", "z"), raw=_to_bf16,
                module=lambda state, params: _Mamba2Mixer(state, params, upcast=True), dtypes=FP32_ONLY,
                why="bf16 activations upcast inside the mixer, one group shared by all heads")


def mamba2_einsum_expand(h, x, dt, A, dt_bias, B, C, D):
    dt = F.softplus(dt + dt_bias)
    dA = torch.exp(dt * A)
    heads = h.shape[1]
    Bh = B[:, :, None].expand(-1, -1, heads // B.shape[1], -1).flatten(1, 2)
    Ch = C[:, :, None].expand(-1, -1, heads // C.shape[1], -1).flatten(1, 2)
    h = h * dA[..., None, None] + torch.einsum("bhp,bhn->bhpn", dt[..., None] * x, Bh)
    y = torch.einsum("bhpn,bhn->bhp", h, Ch) + D[:, None] * x
    return y, h


mamba2_spelling("mamba2_functional_einsum_expand", mamba2_einsum_expand, mode="returned",
                keys=("x", "dt", "A", "dt_bias", "B", "C", "D"),
                why="functional Mamba-2 step, einsum, groups via expand + flatten, D skip")


def mamba2_kv_inplace(h, x, dt, A, dt_bias, B, C):
    dt = F.softplus(dt + dt_bias)
    h.mul_(torch.exp(A * dt)[:, :, None, None])
    h.add_(B.unsqueeze(-1) * (dt.unsqueeze(-1) * x).unsqueeze(-2))
    return (h * C.unsqueeze(-1)).sum(-2)


mamba2_spelling("mamba2_kv_state_inplace", mamba2_kv_inplace, mode="inplace", layout="kv", groups=HEADS,
                keys=("x", "dt", "A", "dt_bias", "B", "C"),
                why="Mamba-2 with a [N, P] state updated in place, one B/C per head")


# ----------------------------------------------------------------------------------------- decoys
def decoy(name, fn, *, mode="returned", rewrite=False, rejected=True, extra=None, state_attr="state", why):
    """A decoy over simple_gla-like inputs ``q, k, v, g`` (``extra(batch, dtype, gen)``: more inputs)."""
    fam = get_family("simple_gla")

    def build(dtype, gen, batch=BATCH):
        def draw(g):
            native, _ = fam.make_inputs(batch, HEADS, HEAD_K, HEAD_V, dtype=dtype, generator=g)
            return {**native, **(extra(batch, dtype, g) if extra else {})}

        _, state = fam.make_inputs(batch, HEADS, HEAD_K, HEAD_V, dtype=dtype, generator=gen)
        if mode == "buffer":
            return Case(fn(state), mode, None, draw, state_attr=state_attr)
        return Case(fn, mode, state, draw)

    _register(Spelling(name, build, mode, rewrite=rewrite, rejected=rejected, why=why))


def decoy_tanh(S, q, k, v, g):
    S = torch.tanh(S * g.exp()[..., None, None] + _outer(k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q), S


decoy("decoy_tanh_state", decoy_tanh, why="new state is nonlinear in the old one")


def decoy_logged(S, q, k, v, g):
    S = S * g.exp()[..., None, None] + _outer(k, v)
    return (torch.einsum("bhkv,bhk->bhv", S, q), S.square().mean()), S


decoy("decoy_state_read_by_logger", decoy_logged, why="the new state has another consumer (a logged statistic)")


def decoy_dense(S, q, k, v, g, M):
    S = M @ S + _outer(k, v)
    return torch.einsum("bhkv,bhk->bhv", S, q), S


decoy("decoy_dense_transition", decoy_dense, why="S' = M @ S with a dense input-dependent M",
      extra=lambda batch, dtype, g: {"M": _inputs.draw((batch, HEADS, HEAD_K, HEAD_K), dtype, g,
                                                        scale=0.4 / math.sqrt(HEAD_K))})


def decoy_overwrite(S, q, k, v, g):
    S.copy_(_outer(k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q)


decoy("decoy_overwritten_not_read", decoy_overwrite, mode="inplace", why="the state is overwritten without being read")


def decoy_state_decay(S, q, k, v, g):
    a = torch.sigmoid(S.mean((-2, -1)))[..., None, None]
    S.mul_(a).add_(_outer(k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q)


decoy("decoy_decay_depends_on_state", decoy_state_decay, mode="inplace", why="the decay is a function of the state")


def decoy_quadratic(S, q, k, v, g):
    S = S * g.exp()[..., None, None] + _outer(k, v)
    return ((S * S) * q[..., :, None]).sum(-2), S


decoy("decoy_quadratic_read", decoy_quadratic, why="the output is not a mat-vec of the state (S*S)")


class _Counter(nn.Module):
    """An integer position buffer incremented every step: written back, but not a float recurrence."""

    def __init__(self, state):
        super().__init__()
        self.register_buffer("pos", torch.zeros(state.shape[0], dtype=torch.int32))

    def forward(self, q, k, v, g):
        self.pos.add_(1)
        return q * self.pos[:, None, None].to(q.dtype).sqrt()


decoy("decoy_integer_state_buffer", _Counter, mode="buffer", rejected=False, state_attr="pos",
      why="the written-back buffer is an integer")


def decoy_softmax_read(S, q, k, v, g):
    S = S * g.exp()[..., None, None] + _outer(k, v)
    return (torch.softmax(S, dim=-2) * q[..., :, None]).sum(-2), S


decoy("decoy_state_as_attention_keys", decoy_softmax_read, why="the state is read through a softmax (used as keys)")


def decoy_bias(S, q, k, v, g):
    S = S * g.exp()[..., None, None] + _outer(k, v) + 0.1
    return torch.einsum("bhkv,bhk->bhv", S, q), S


decoy("decoy_affine_constant_term", decoy_bias, why="affine, but the input term is not an outer product (+ constant)")


def decoy_full_decay(S, q, k, v, g, G):
    S = S * G.exp() + _outer(k, v)
    return torch.einsum("bhkv,bhk->bhv", S, q), S


decoy("decoy_elementwise_decay", decoy_full_decay, why="one decay per state element: no family has it",
      extra=lambda batch, dtype, g: {"G": _inputs.log_decay((batch, HEADS, HEAD_K, HEAD_V), dtype, g, False)})


class _Memory(nn.Module):
    """A fixed memory buffer read as a mat-vec but never written: no recurrence."""

    def __init__(self, state):
        super().__init__()
        self.register_buffer("memory", state.clone())

    def forward(self, q, k, v, g):
        return torch.einsum("bhkv,bhk->bhv", self.memory, q) + v


decoy("decoy_read_only_buffer", _Memory, mode="buffer", rejected=False, state_attr="memory",
      why="a buffer that is read but never written")


def decoy_mixed_heads(S, q, k, v, g):
    S = S.roll(1, dims=1) * g.exp()[..., None, None] + _outer(k, v)
    return torch.einsum("bhkv,bhk->bhv", S, q), S


decoy("decoy_heads_mixed", decoy_mixed_heads, why="affine, but each head's new state reads another head")


def decoy_partial(S, q, k, v, g):
    S[:, :, :2].mul_(g.exp()[..., None, None]).add_(_outer(k[..., :2], v))
    return torch.einsum("bhkv,bhk->bhv", S, q)


decoy("decoy_partial_update", decoy_partial, mode="inplace", rewrite=None,
      why="only two key rows updated (a GLA with decay 1 on the other rows: a rewrite must be exact)")


def decoy_branch(S, q, k, v, g):
    if S.abs().amax() > 3.0:
        S.mul_(0.5)
    S.mul_(g.exp()[..., None, None]).add_(_outer(k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q)


decoy("decoy_data_dependent_branch", decoy_branch, mode="inplace", rewrite=None, why=(
      "a Python branch on the state's values: graph break; any graph that reads the state must see it exact"))


def positives() -> list[Spelling]:
    return [s for s in CORPUS if s.family is not None]


def decoys() -> list[Spelling]:
    return [s for s in CORPUS if s.family is None]
