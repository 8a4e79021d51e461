"""Opt-in replay form for Hugging Face transformers models: decode and T-token speculative verify.

Why this exists: transformers decodes one token with a per-token recurrent function, but every call of
more than one token on a cache (a speculative verify of ``T`` drafts, a prompt continuation) goes to a
chunked-scan function (``torch_chunk_gated_delta_rule``, ``chunk_kimi_delta_attention``,
``mamba2_chunk_scan``, or flash-linear-attention / mamba-ssm kernels when installed). That path is a
blocked WY / SSD computation, not the per-token recurrence the ``replayssm`` pass recognises, so
``torch.compile(backend="replayssm")`` leaves it alone. This module instead swaps the model's recurrent
functions, while it is enabled, for calls of the replay runtime (``torch.ops.replay_compile.advance``,
the op the compiler inserts), so decode steps, verifies and commits run on ring pointers::

    from replay_compile.integrations import transformers as replay_tf

    with replay_tf.enable_replay(model, window=16, speculative=True) as replay:
        logits = model(ids, attention_mask=mask, position_ids=pos, past_key_values=cache).logits  # T tokens/row
        replay.commit(cache, n_accepted)     # keep n_accepted[b] tokens of row b (ring pointers + conv windows)
    # on exit every routed state is made exact and handed back to transformers

Routed (transformers 5.17; the layer class decides, so other models are untouched):

==================  =============================  ==========================================================
family              layer classes                  functions
==================  =============================  ==========================================================
Gated DeltaNet      Qwen3NextGatedDeltaNet,        torch_recurrent_gated_delta_rule (decode),
                    Qwen3_5GatedDeltaNet,          torch_chunk_gated_delta_rule (verify / continuation)
                    Qwen3_5MoeGatedDeltaNet
KDA                 KimiLinearDeltaAttention       recurrent_kimi_delta_attention, chunk_kimi_delta_attention
Mamba-2             Mamba2Mixer,                   mamba2_selective_state_update (decode),
                    NemotronHMamba2Mixer           mamba2_chunk_scan (verify / continuation)
==================  =============================  ==========================================================

Not routed: MiniMax lightning attention computes its recurrence inline in the layer's ``forward`` (no
function to swap); use ``torch.compile(backend="replayssm")`` for its decode step. Prefill (a call with
no previous state) keeps transformers' own function: there is no state to keep in replay form yet
(float64 models excepted: transformers' torch paths compute in float32 even then, so a float64 prefill
runs the float64 reference scan here instead, keeping a float64 model float64 end to end).

Semantics:
* A routed call on ``T`` tokens equals ``T`` one-token decode steps of the same model (the verify follows
  the decode path: Mamba-2's ``dt_limit`` clamp, applied only by transformers' chunked path, is not
  applied; its default ``(0, inf)`` makes the two paths agree).
* GDN query/key heads arrive already repeated to the value heads, so the ring keeps one key per value head.
* Speculative mode (``speculative=True``): every call on a cache that has a previous state (one token
  or more, as with the compiled backend) is a verify; follow it with :meth:`ReplayIntegration.commit`, which
  keeps ``n_accepted[b]`` tokens of row ``b``: recurrent states by ring pointer (``replay_compile.commit``)
  and the short-convolution windows by a per-row gather of the window transformers recorded during the
  verify (its ``record_past`` switch). Calling ``replay_compile.commit`` alone would leave the conv
  windows unrolled: the next call then raises instead of running on them.
* Attention KV caches: transformers' ``DynamicCache`` cannot drop a different number of tokens per row.
  Rejected tokens' entries stay and are masked out by the attention mask of later calls;
  :func:`speculative_generate` does that bookkeeping (masks and per-row positions).
* A call the runtime cannot take (packed ``cu_seqlens`` batches, a non-broadcast Mamba-2 ``dt``) makes
  that state exact, drops its replay form and runs transformers' function, with a warning.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import importlib
import inspect
import logging
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..api import ReplayCompileError
from ..api import commit as replay_commit, materialize as replay_materialize, release as replay_release
from ..families import Canonical, RecurrenceFamily, get_family
from ..ops import registry, site_config
from ..ops.replay_ops import advance
from ..options import ReplayOptions
from ..runtime import ReplayError
from ..runtime.state import accepted_counts

log = logging.getLogger("replay_compile")

_GDN_FUNCTIONS = ("torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule")
_KDA_FUNCTIONS = ("recurrent_kimi_delta_attention", "chunk_kimi_delta_attention")


@dataclasses.dataclass(frozen=True)
class _Target:
    """One transformers layer class whose recurrent functions are routed."""

    module: str          # transformers modeling module
    layer_class: str
    family: str          # registered family name
    layout: str          # state layout in the cache: "kv" [B, H, K, V] or "vk" [B, H, V, K]
    functions: dict      # function name in ``module`` -> adapter


# ----------------------------------------------------------------------------------------- adapters
class _Fallback(Exception):
    """The runtime cannot take this call: make the state exact and run transformers' function."""


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _delta_rule(route: "_LayerRoute", a: dict):
    """GDN / KDA functions: ``(query, key, value, g, beta, initial_state, output_final_state, ...)``.

    q, k ``[B, T, H, K]`` (GDN: already repeated to the value heads), v ``[B, T, H, V]``, g ``[B, T, H]``
    (GDN) or ``[B, T, H, K]`` (KDA), beta ``[B, T, H]``; returns ``(o [B, T, H, V], state or None)``.
    """
    query, state = a["query"], a["initial_state"]
    cd = _compute_dtype(query)
    if state is None and cd != torch.float64:
        return None  # prefill: transformers' own function
    if a.get("cu_seqlens") is not None:
        raise _Fallback("packed sequences (cu_seqlens) are not supported by the replay runtime")
    q, k = query.to(cd), a["key"].to(cd)
    if a["use_qk_l2norm_in_kernel"]:
        q, k = route.l2norm(q, dim=-1, eps=1e-6), route.l2norm(k, dim=-1, eps=1e-6)
    x = Canonical(q * q.shape[-1] ** -0.5, k, a["value"].to(cd), a["g"].to(cd), a["beta"].to(cd))
    o, state = route.scan_or_run(state, x)
    return o.to(query.dtype), (state if a["output_final_state"] else None)


def _broadcast_part(t: Optional[torch.Tensor], dims: tuple) -> Optional[torch.Tensor]:
    """``t`` without the trailing ``dims`` it was expanded along (stride 0): Mamba-2's ``dt [B, H, P]`` -> ``[B, H]``."""
    if t is None:
        return None
    if any(t.stride(d) != 0 and t.shape[d] != 1 for d in dims):
        raise _Fallback(f"a Mamba-2 parameter of shape {tuple(t.shape)} varies along head_dim/state_size")
    for _ in dims:
        t = t[..., 0]
    return t


def _mamba2_canonical(x, dt, A, dt_bias, B, C, softplus: bool, cd) -> Canonical:
    """Mamba-2 inputs with a token axis (``x [B, T, H, P]``, ``dt [B, T, H]``, ``A [H]``, ``B, C [B, T, G, N]``)."""
    dt = dt.to(cd) if dt_bias is None else dt.to(cd) + dt_bias.to(cd)
    if softplus:
        dt = F.softplus(dt)
    return Canonical(q=C.to(cd), k=B.to(cd), v=dt[..., None] * x.to(cd), log_a=dt * A.to(cd))


def _mamba2_step(route: "_LayerRoute", a: dict):
    """``mamba2_selective_state_update(state, hidden_states [B, H, P], dt, A, B, C, D, dt_bias, ...)``.

    transformers expands ``dt`` to ``[B, H, P]``, ``A`` to ``[H, P, N]``, ``D`` and ``dt_bias`` to ``[H, P]``;
    the state ``[B, H, P, N]`` is updated in place; returns ``y [B, H, P]`` (D skip included, no gate).
    """
    if a.get("z") is not None:
        raise _Fallback("a gate z inside the Mamba-2 step is not supported (transformers passes z=None)")
    x, state = a["hidden_states"], a["state"]
    cd = _compute_dtype(x)
    dt, A = _broadcast_part(a["dt"], (-1,)), _broadcast_part(a["A"], (-1, -2))
    dt_bias, D = _broadcast_part(a["dt_bias"], (-1,)), _broadcast_part(a["D"], (-1,))
    xs = _mamba2_canonical(x[:, None], dt[:, None], A, dt_bias, a["B"][:, None], a["C"][:, None],
                           a["dt_softplus"], cd)
    y = route.run(state, xs)[:, 0]
    if D is not None:
        y = y + D.to(cd)[:, None] * x.to(cd)
    return y.to(x.dtype)


def _mamba2_scan(route: "_LayerRoute", a: dict):
    """``mamba2_chunk_scan(hidden_states [B, T, H, P], dt [B, T, H], A [H], B, C [B, T, G, N], ...)``."""
    if a.get("z") is not None:
        raise _Fallback("a gate z inside the Mamba-2 scan is not supported (transformers passes z=None)")
    x, state = a["hidden_states"], a["initial_states"]
    cd = _compute_dtype(x)
    if state is None and cd != torch.float64:
        return None  # prefill: transformers' own function
    xs = _mamba2_canonical(x, a["dt"], a["A"], a["dt_bias"], a["B"], a["C"], a["dt_softplus"], cd)
    o, state = route.scan_or_run(state, xs)
    if a["D"] is not None:
        o = o + a["D"].to(cd)[:, None] * x.to(cd)
    return (o, state) if a["return_final_states"] else o


_TARGETS = (
    *(_Target(f"transformers.models.{m}.modeling_{m}", cls, "gated_deltanet", "kv",
              {name: _delta_rule for name in _GDN_FUNCTIONS})
      for m, cls in (("qwen3_next", "Qwen3NextGatedDeltaNet"), ("qwen3_5", "Qwen3_5GatedDeltaNet"),
                     ("qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"))),
    _Target("transformers.models.kimi_linear.modeling_kimi_linear", "KimiLinearDeltaAttention", "kda", "kv",
            {name: _delta_rule for name in _KDA_FUNCTIONS}),
    *(_Target(f"transformers.models.{m}.modeling_{m}", cls, "mamba2", "vk",
              {"mamba2_selective_state_update": _mamba2_step, "mamba2_chunk_scan": _mamba2_scan})
      for m, cls in (("mamba2", "Mamba2Mixer"), ("nemotron_h", "NemotronHMamba2Mixer"))),
)


# ------------------------------------------------------------------------------------------ runners
class ReplayRunner:
    """Default runner: each routed call is one ``replay_compile::advance`` op on the cache's state tensor.

    The op keeps the state's ``ReplayState`` in the ops registry (keyed by the tensor), so
    ``replay_compile.commit / materialize / release`` reach it through the cache object.
    """

    def __init__(self, options: ReplayOptions):
        self.options = options

    def advance(self, state: torch.Tensor, x: Canonical, *, family: RecurrenceFamily, layout: str) -> torch.Tensor:
        """Append ``T`` tokens (canonical inputs ``[B, T, ...]``) to ``state``; returns ``o [B, T, Hv, V]``."""
        o = self.options
        narrow = o.checkpoint_dtype != "float32" and state.dtype == torch.float32
        config = site_config(family=family.name, window=o.window, layout=layout, k_heads=x.k.shape[2],
                             read_dtype=o.read_dtype, stochastic_rounding=o.stochastic_rounding and narrow,
                             kernels=o.kernels, speculative=o.speculative,
                             checkpoint_dtype=o.checkpoint_dtype if narrow else None, verify_form=o.verify_form)
        return advance(state, x.q, x.k, x.v, x.log_a, x.beta, config)


# ------------------------------------------------------------------------------------------ routing
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("replay_compile_transformers_route", default=None)
_PATCHES: dict = {}  # (module, function) -> [original, number of integrations using it]


@dataclasses.dataclass
class _LayerRoute:
    """A routed layer: its target, cache index and the integration that owns it."""

    target: _Target
    layer_idx: int
    family: RecurrenceFamily
    l2norm: Optional[Callable]
    integration: "ReplayIntegration"

    @property
    def layout(self) -> str:
        return self.target.layout

    def run(self, state: torch.Tensor, x: Canonical) -> torch.Tensor:
        self.integration._states[id(state)] = state
        return self.integration.runner.advance(state, x, family=self.family, layout=self.layout)

    def scan_or_run(self, state: Optional[torch.Tensor], x: Canonical) -> tuple:
        """``(o, state)``: the replay call on ``state``, or for a float64 prefill (``state`` None) the float64
        reference scan from a zero state of this layer's layout."""
        if state is not None:
            return self.run(state, x), state
        B, _, H, V = x.v.shape
        K = x.k.shape[-1]
        dims = (K, V) if self.layout == "kv" else (V, K)
        state = torch.zeros(B, H, *dims, dtype=x.v.dtype, device=x.v.device)
        return self.family.scan(state, x, layout=self.layout)


def _router(target: _Target, name: str, original: Callable, adapter: Callable) -> Callable:
    """``original`` for every caller except a routed layer of ``target`` (see ``_CURRENT``)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def routed(*args, **kwargs):
        route = _CURRENT.get()
        if route is None or route.target.module != target.module:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.update(arguments.pop("kwargs", {}))
        try:
            out = adapter(route, arguments)
        except _Fallback as why:
            route.integration._fall_back(arguments.get("initial_state", arguments.get("initial_states",
                                                                                     arguments.get("state"))), why)
            return original(*args, **kwargs)
        return original(*args, **kwargs) if out is None else out

    routed.__replay_original__ = original
    return routed


def _patch(target: _Target) -> None:
    mod = importlib.import_module(target.module)
    for name, adapter in target.functions.items():
        key = (target.module, name)
        if key not in _PATCHES:
            original = getattr(mod, name)
            _PATCHES[key] = [original, 0]
            setattr(mod, name, _router(target, name, original, adapter))
        _PATCHES[key][1] += 1


def _unpatch(target: _Target) -> None:
    mod = importlib.import_module(target.module)
    for name in target.functions:
        key = (target.module, name)
        _PATCHES[key][1] -= 1
        if _PATCHES[key][1] == 0:
            setattr(mod, name, _PATCHES.pop(key)[0])


def _layer_class(target: _Target):
    try:
        return getattr(importlib.import_module(target.module), target.layer_class)
    except (ImportError, AttributeError):
        return None


class ReplayIntegration:
    """The routed recurrent layers of one model; undo with :meth:`disable` (or leave the ``with`` block)."""

    def __init__(self, model: torch.nn.Module, options: ReplayOptions, runner=None):
        if getattr(model, "_replay_integration", None) is not None:
            raise ReplayError(f"replay is already enabled on this {type(model).__name__}: disable() it first")
        self.model, self.options = model, options
        self.runner = runner or ReplayRunner(options)
        self._states: dict = {}      # id -> state tensor routed so far (released on disable)
        self._recording: dict = {}   # id(cache) -> (cache, {layer_idx: conv window before the verify})
        self._tokens: list = []
        self.routes = self._find_routes(model)
        if not self.routes:
            names = ", ".join(t.layer_class for t in _TARGETS)
            raise ReplayError(f"{type(model).__name__} has no layer this integration routes (supported: {names})")
        self._hooks = []
        for module in self.routes:
            self._hooks.append(module.register_forward_pre_hook(self._enter_layer, with_kwargs=True))
            self._hooks.append(module.register_forward_hook(self._leave_layer, always_call=True))
        self._targets = list({route.target.module: route.target for route in self.routes.values()}.values())
        for target in self._targets:
            _patch(target)
        model._replay_integration = self

    def _find_routes(self, model) -> dict:
        classes = [(cls, t) for t in _TARGETS if (cls := _layer_class(t)) is not None]
        routes = {}
        for module in model.modules():
            for cls, target in classes:
                if type(module) is cls:
                    mod = importlib.import_module(target.module)
                    routes[module] = _LayerRoute(target, module.layer_idx, get_family(target.family),
                                                 getattr(mod, "l2norm", None), self)
        return routes

    # --------------------------------------------------------------------------------------- hooks
    def _enter_layer(self, module, args, kwargs):
        route = self.routes[module]
        cache = kwargs.get("cache_params", args[1] if len(args) > 1 else None)
        if cache is not None:
            self._before_cached_call(route, cache)
        self._tokens.append((module, _CURRENT.set(route)))

    def _leave_layer(self, module, args, *_):
        if self._tokens and self._tokens[-1][0] is module:  # not entered when the pre-hook raised
            _CURRENT.reset(self._tokens.pop()[1])

    def _before_cached_call(self, route: _LayerRoute, cache) -> None:
        recording = self._recording.get(id(cache))
        if recording is not None and route.layer_idx in recording[1]:
            raise ReplayError("this cache has an uncommitted verify: call ReplayIntegration.commit(cache, n_accepted) "
                              "first (replay_compile.commit alone does not roll back the convolution windows)")
        if self.options.speculative and cache.has_previous_state(route.layer_idx):
            layer = cache.layers[route.layer_idx]
            self._recording.setdefault(id(cache), (cache, {}))[1][route.layer_idx] = layer.conv_states[0].clone()
            layer.record_past = True  # transformers keeps the whole conv window until it is cut (its rollback switch)

    # ------------------------------------------------------------------------------------- commits
    @torch.no_grad()
    def commit(self, cache, n_accepted) -> None:
        """Keep the first ``n_accepted[b]`` tokens (0..T; int or ``[B]``) of row ``b`` of the last verify on ``cache``.

        Moves the recurrent states' ring pointers (``replay_compile.commit``; skipped if that was called
        already) and cuts each row's convolution window to the kept tokens.
        """
        recording = self._recording.get(id(cache))
        if recording is None:
            raise ReplayError("commit: no verify of this cache is pending (speculative=True and more than one token?)")
        windows = {idx: _kept_conv_window(cache.layers[idx], old, n_accepted) for idx, old in recording[1].items()}
        try:
            replay_commit(cache, n_accepted)
        except ReplayCompileError:
            pass  # the recurrent states were committed with replay_compile.commit already: only the windows move
        for idx, window in windows.items():
            cache.layers[idx].conv_states[0] = window
            cache.layers[idx].record_past = False
        del self._recording[id(cache)]

    def materialize(self, cache):
        """Make every routed state in ``cache`` exact (it stays in replay form)."""
        return replay_materialize(cache)

    def _fall_back(self, state: Optional[torch.Tensor], why: Exception) -> None:
        log.warning("replay_compile.integrations.transformers: running transformers' function instead: %s", why)
        if state is not None and registry.find(state) is not None:
            replay_release(state)
            self._states.pop(id(state), None)

    def disable(self) -> None:
        """Make routed states exact, hand them back to transformers, remove hooks and function patches."""
        if self._recording:
            raise ReplayError("disable with an uncommitted verify: commit(cache, n_accepted) first")
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for target in self._targets:
            _unpatch(target)
        self._targets = []
        replay_release(list(self._states.values()))
        self._states.clear()
        self.model._replay_integration = None

    def __enter__(self) -> "ReplayIntegration":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # an aborted verify keeps nothing, so the model is always handed back
            for cache, _ in list(self._recording.values()):
                self.commit(cache, 0)
        self.disable()


def _kept_conv_window(layer, before: torch.Tensor, n_accepted) -> torch.Tensor:
    """The conv window of each row after keeping ``n[b]`` of the verify's tokens: ``[B, C, kernel]``.

    ``before`` is the window before the verify. With ``record_past`` transformers appended the verify's
    ``T`` conv inputs to it; row ``b``'s window is the ``kernel`` columns ending at ``len(before) + n[b]``.
    One-token calls of some models (Kimi-Linear) shift the window in place instead: then the window is
    the new one where the token is kept and ``before`` where it is not.
    """
    full, kernel, old_len = layer.conv_states[0], layer.conv_kernel_size[0], before.shape[-1]
    B, C, total = full.shape
    T = total - old_len if total > old_len else 1
    n = accepted_counts(n_accepted, B, T, full.device)
    if total == old_len:
        return torch.where(n[:, None, None] > 0, full, before).contiguous()
    padded = F.pad(full, (kernel, 0))  # zero history for rows shorter than the kernel
    cols = (old_len + n)[:, None] + torch.arange(kernel, device=full.device)  # padded columns [end, end + kernel)
    return padded.gather(2, cols[:, None, :].expand(B, C, kernel)).contiguous()


def enable_replay(model: torch.nn.Module, *, window: int = 16, speculative: bool = False,
                  read_dtype: Optional[str] = None, checkpoint_dtype: str = "float32",
                  stochastic_rounding: bool = False, kernels: str = "auto", verify_form: str = "auto",
                  runner=None) -> ReplayIntegration:
    """Route ``model``'s recurrent functions to the replay runtime until ``disable()`` / the end of a ``with``.

    Args:
        window: replay window L (a verify of ``T`` tokens needs ``T <= L``).
        speculative: every call on a cache with a previous state (one token or more) is a verify, kept by
            :meth:`ReplayIntegration.commit`.
        read_dtype: low-precision read copy of the fp32 checkpoint: None, "bf16", "fp16", "fp8", "fp4".
        checkpoint_dtype, stochastic_rounding: a 16-bit checkpoint of the float32 cache states (the runtime
            keeps it; ``materialize`` writes the cache tensor), rounded stochastically on flushes or not.
        kernels: "auto" (Triton on CUDA, plain torch elsewhere), "torch" or "triton".
        verify_form: the Triton path's verify template, "auto", "tokens" or "chunked[:k=v,...]"
            (``templates/verify_forms.py``).
        runner: advanced; an object with ``advance(state, x, *, family, layout) -> o`` replacing the replay
            op (``replayssm bench accuracy --hf`` uses it to run precision variants side by side).
    """
    options = ReplayOptions.from_dict(dict(window=window, speculative=speculative, read_dtype=read_dtype,
                                           checkpoint_dtype=checkpoint_dtype,
                                           stochastic_rounding=stochastic_rounding, kernels=kernels,
                                           verify_form=verify_form))
    return ReplayIntegration(model, options, runner)


# ------------------------------------------------------------------------------ speculative decoding
def _cache_argument(model) -> str:
    return "cache_params" if "cache_params" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def speculative_generate(model, integration: ReplayIntegration, input_ids: torch.Tensor, new_tokens: int,
                         drafter: Callable, draft_tokens: int = 4) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Greedy speculative decoding of a transformers causal LM enabled with ``speculative=True``.

    Each step feeds ``[last token, T drafts]`` per row (one verify), accepts each row's longest matching
    draft prefix, and commits ``n[b] = accepted + 1`` tokens. Attention layers keep rejected tokens' KV
    entries, masked out by the attention mask, with per-row ``position_ids``.

    Args:
        input_ids: ``[B, P]`` prompts without padding (``P >= 2``).
        drafter: ``drafter(seqs: list[list[int]], T) -> LongTensor [B, T]``.
    Returns:
        ``(tokens [B, new_tokens], logits [B, new_tokens, vocab] of the kept tokens, stats)``.
    """
    from transformers import DynamicCache  # noqa: PLC0415  (optional dependency)

    if not integration.options.speculative:
        raise ReplayError("speculative_generate needs an integration enabled with speculative=True")
    if draft_tokens + 1 > integration.options.window:
        raise ReplayError(f"a verify of {draft_tokens} drafts + 1 token needs window >= {draft_tokens + 1}")
    B, P = input_ids.shape
    dev = input_ids.device
    cache = DynamicCache(config=model.config)
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    kw = {_cache_argument(model): cache, "use_cache": True}
    mask = torch.ones(B, P - 1, dtype=torch.long, device=dev)
    model(input_ids[:, :-1], attention_mask=mask, **kw)
    next_pos = torch.full((B,), P - 1, device=dev)
    seqs, last = [row.tolist() for row in input_ids], input_ids[:, -1]
    toks, logits = [[] for _ in range(B)], [[] for _ in range(B)]
    steps = accepted = 0
    while min(len(t) for t in toks) < new_tokens:
        drafts = drafter(seqs, draft_tokens).to(dev)
        inp = torch.cat([last[:, None], drafts], 1)
        mask = torch.cat([mask, torch.ones_like(inp)], 1)
        extra = {"position_ids": next_pos[:, None] + torch.arange(inp.shape[1], device=dev)} if takes_positions else {}
        out = model(inp, attention_mask=mask, **extra, **kw).logits  # [B, T + 1, vocab]
        pred = out.argmax(-1)
        match = (pred[:, :-1] == drafts).long().cumprod(1).sum(1)
        n = match + 1
        integration.commit(cache, n)
        mask[:, -inp.shape[1]:] = (torch.arange(inp.shape[1], device=dev) < n[:, None]).long()
        next_pos += n
        for b in range(B):
            kept = drafts[b, :match[b]].tolist() + [int(pred[b, match[b]])]
            toks[b] += kept
            seqs[b] += kept
            logits[b].append(out[b, :n[b]])
        last = pred[torch.arange(B, device=dev), match]
        steps += 1
        accepted += int(match.sum())
    tokens = torch.tensor([t[:new_tokens] for t in toks], device=dev)
    kept_logits = torch.stack([torch.cat(lg)[:new_tokens] for lg in logits])
    stats = dict(steps=steps, drafted=steps * draft_tokens * B, accepted=accepted)
    return tokens, kept_logits, stats
