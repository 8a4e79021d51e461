"""The replayssm graph rewrite: find recurrent-state sites, prove them, check them, rewrite them.

One pass per file: :mod:`normal_form` (the abstract domain), :mod:`find_sites` (detection and
proof), :mod:`rewrite_sites` (the op substitution), :mod:`validate` (numeric check). This module
runs them in order on a Dynamo graph and reports what happened (``counters``, logger
``replay_compile``, a :class:`RewriteResult` for ``explain``).

# NOTE [pipeline]
The pass works on Dynamo's torch-level graph (module buffers are placeholders, ``example_inputs``
are real tensors, einsum equations are intact). Sites are found on a copy; they are validated
together against the untouched original (one by one only after a mismatch, to find the culprit);
the accepted ones are rewritten on a fresh copy one at a time, re-analysed after each rewrite (a
rewrite replaces reads that later sites may consume). The original graph module is never modified.
Any failure inside the pass becomes a rejection with its reason, never a failed compile (unless
``strict``).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Optional

import torch
import torch.fx as fx

from ..runtime.state import resolve_kernels
from . import cost_model, find_sites, rewrite_sites, validate
from .find_sites import GraphIndex, Rejected, analyze, candidate_states, choose_family
from .rewrite_sites import checkpoint_dtype

counters: collections.Counter = collections.Counter()
log = logging.getLogger("replay_compile")


class ReplayCompileError(RuntimeError):
    """``strict=True`` and a candidate state could not be rewritten."""


@dataclasses.dataclass(frozen=True)
class SiteReport:
    state: str
    family: str
    state_shape: tuple
    layout: str
    window: int
    read_dtype: Optional[str]
    checkpoint_dtype: str
    kernel: str
    tokens: int
    k_heads: int            # query/key heads kept in the ring (fewer than the state's heads when grouped)
    route: str = "replay"   # "standard": the cost model runs the standard recurrence (NOTE [cost model])


@dataclasses.dataclass(frozen=True)
class Rejection:
    state: str
    code: str
    reason: str


@dataclasses.dataclass
class RewriteResult:
    gm: fx.GraphModule
    sites: list
    rejected: list
    before: str
    after: str
    rewritten_inputs: frozenset     # placeholder indices of rewritten states
    state_inputs: frozenset         # placeholder indices of other 4-D floating inputs
    mutated_inputs: frozenset       # placeholder indices written in place by the returned graph


def clone_gm(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` that Inductor still recognises as Dynamo's graph (NOTE [Dynamo metadata])."""
    g = fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    copy = fx.GraphModule(gm, g)
    _carry_dynamo_metadata(gm, copy)
    return copy


# NOTE [Dynamo metadata]
# AOTAutograd reads which graph inputs are static (parameters, buffers, addresses marked static) from
# Dynamo's marks on the graph module: ``meta["dynamo_compile_id"]``, ``_param_name_to_source`` and each
# placeholder's ``_dynamo_source``. A copy without them is compiled as a foreign graph, and CUDA-graph
# trees then skip any graph that writes a buffer in place ("mutated inputs"): on the H200 every
# transformers model ran 3-4x slower under replayssm + reduce-overhead than under torch.compile's.
def _carry_dynamo_metadata(src: fx.GraphModule, dst: fx.GraphModule) -> None:
    dst.meta.update(src.meta)
    if hasattr(src, "_param_name_to_source"):
        dst._param_name_to_source = src._param_name_to_source
    sources = {n.name: n._dynamo_source for n in src.graph.find_nodes(op="placeholder") if hasattr(n, "_dynamo_source")}
    for n in dst.graph.find_nodes(op="placeholder"):
        if n.name in sources:
            n._dynamo_source = sources[n.name]


def rewrite_graph(gm: fx.GraphModule, example_inputs, options) -> RewriteResult:
    """Rewrite every provable site of ``gm`` (which is left untouched) under ``options``."""
    work = clone_gm(gm)
    index = GraphIndex(work.graph)
    placeholders = [n for n in work.graph.nodes if n.op == "placeholder"]
    rejected, accepted = [], []
    for P in candidate_states(index):
        try:
            site = _analyze(index, P, options)
            _policy(site, P, options, len(accepted))
            accepted.append(site)
        except Rejected as e:
            rejected.append(Rejection(find_sites.source_name(P), e.code, e.reason))
    if options.validate:
        accepted = _validated(gm, example_inputs, options, accepted, placeholders, rejected)
    final, sites = _rewrite_named(gm, [s.placeholder.name for s in accepted], options, rejected)
    reports = [_report(s, options) for s in sites]
    _count(reports, rejected, options)
    names = {s.placeholder.name for s in sites}
    final_ph = [n for n in final.graph.nodes if n.op == "placeholder"]
    final_index = GraphIndex(final.graph)
    return RewriteResult(
        gm=final, sites=reports, rejected=rejected, before=gm.code, after=final.code,
        rewritten_inputs=frozenset(i for i, n in enumerate(final_ph) if n.name in names),
        state_inputs=frozenset(i for i, n in enumerate(final_ph) if n.name not in names and _is_state_like(n)),
        mutated_inputs=frozenset(i for i, n in enumerate(final_ph) if final_index.final.get(n, n) is not n))


def _is_state_like(n) -> bool:
    val = n.meta.get("example_value")
    return isinstance(val, torch.Tensor) and val.dim() == 4 and val.dtype.is_floating_point


def _policy(site, P, options, n_accepted: int) -> None:
    batch = site.sizes["b"]
    if options.min_batch is not None and batch < options.min_batch:
        raise Rejected("small_batch", f"batch {batch} < min_batch={options.min_batch}")
    if _cost_model_applies(P, options) and _cost_model_route(site, options) == "original":
        raise Rejected("small_batch", f"batch {batch}: the original graph is faster here than replay or the standard "
                                      "route (cost model; set min_batch to override)")
    if options.fuel is not None and n_accepted >= options.fuel:
        raise Rejected("fuel", f"fuel={options.fuel} exhausted")
    if site.tokens > options.window and options.speculative:
        raise Rejected("speculative_window", f"{site.tokens} draft tokens exceed window L={options.window}")
    checkpoint_dtype(P.meta["example_value"].dtype, options)


def _analyze(index, P, options):
    try:
        site = analyze(index, P)
        site.family = choose_family(site, options)
        return site
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001  (a bug in the analysis must not break the user's compile)
        log.warning("replayssm: analysis of %s failed", P.name, exc_info=True)
        raise Rejected("internal", f"{type(e).__name__}: {e}") from e


def _rewrite_named(gm, names, options, rejected=None):
    """A copy of ``gm`` with the sites of the named placeholders rewritten, one at a time.

    With ``rejected`` (a list), a site whose rewrite fails is recorded there and skipped (the copy is
    rebuilt from ``gm`` without it); without, the failure propagates.
    """
    out, done, sites = clone_gm(gm), [], []
    for name in names:
        try:
            sites.append(_rewrite_one(out, name, options))
            done.append(name)
        except Exception as e:  # noqa: BLE001
            if rejected is None:
                raise
            code, reason = (e.code, e.reason) if isinstance(e, Rejected) else \
                ("rewrite_failed", f"{type(e).__name__}: {e}")
            rejected.append(Rejection(name, code, reason))
            out = clone_gm(gm)
            sites = [_rewrite_one(out, n, options) for n in done]
    out.graph.lint()
    out.recompile()
    return out, sites


def _rewrite_one(gm, name, options):
    index = GraphIndex(gm.graph)
    P = next(p for p in index.order if p.op == "placeholder" and p.name == name)
    site = _analyze(index, P, options)
    site.route = _route(site, P, options)
    rewrite_sites.rewrite_site(gm, site, options)
    return site


def _route(site, P, options) -> str:
    """``"replay"``, or ``"standard"`` where the cost model says a standard step is faster (NOTE [cost model]).

    Only on CUDA, and only where the user set no ``min_batch`` of their own; speculative sites (their
    caller commits per-row counts) and sites that read the state before their tokens need replay.
    """
    if not _cost_model_applies(P, options) or site.read_old:
        return "replay"
    if _cost_model_route(site, options) != "standard":  # "original" sites were rejected by _policy
        return "replay"
    log.info("replayssm: %s runs the standard recurrence: batch %d x %d heads is below replay's break-even "
             "at L=%d (cost model; set min_batch to override)", site.name, site.sizes["b"], site.sizes["h"],
             options.window)
    return "standard"


def _cost_model_route(site, options) -> str:
    return cost_model.route(site.sizes["b"], site.sizes["h"], options.window, site.delta)


def _cost_model_applies(P, options) -> bool:
    """On CUDA, unless the user set their own ``min_batch`` or the site is speculative (only replay commits)."""
    return P.meta["example_value"].device.type == "cuda" and options.min_batch is None and not options.speculative


def _validated(gm, example_inputs, options, sites, placeholders, rejected) -> list:
    """The sites whose rewrite matches the original numerically: all at once, else one by one."""
    if len(sites) > 1:
        try:
            _validate_sites(gm, example_inputs, options, sites, placeholders)
            return sites
        except Rejected:
            pass
    ok = []
    for site in sites:
        try:
            _validate_sites(gm, example_inputs, options, [site], placeholders)
            ok.append(site)
        except Rejected as e:
            rejected.append(Rejection(site.name, e.code, e.reason))
    return ok


def _returning_reads(gm, sites):
    """``(copy of gm that also returns every read of sites, number of reads)`` (NOTE [site-local check])."""
    probe = clone_gm(gm)
    nodes = {n.name: n for n in probe.graph.nodes}
    reads = [nodes[r.name] for s in sites for step in s.steps for r, *_ in step.reads]
    out = next(n for n in reversed(probe.graph.nodes) if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    out.args = (tuple(results) + tuple(reads),)
    probe.recompile()
    return probe, len(reads)


# NOTE [site-local check]
# A rewrite changes values in exactly two places: each read of the state (replaced by the op's output,
# ``rewrite_sites._replace_read``) and the state itself; every other use of the old update is a shape use
# or is refused (``_remove_update``). So the check compares the reads, returned by a copy of the graph
# made for it, and the states: not the graph's own outputs, which after a router's top-k or an argmax can
# jump on a correct, reassociated read (MiniMax's MoE layers, bf16: a 1.5e-1 output difference from
# reads equal to 3e-3).
def _validate_sites(gm, example_inputs, options, sites, placeholders) -> None:
    """Check the algebra of the rewrite with exact reads and the reference ops (the read copy's rounding
    and the kernels' agreement with the reference are the runtime's business, tested there; so is a
    16-bit checkpoint's rounding)."""
    options = options.replace(read_dtype=None, kernels="torch", checkpoint_dtype="float32", stochastic_rounding=False)
    names = [s.placeholder.name for s in sites]
    probe, n_reads = _returning_reads(gm, sites)
    try:
        candidate, _ = _rewrite_named(probe, names, options)
    except Rejected:
        raise
    except Exception as e:  # noqa: BLE001  (a rewrite that cannot be built is a rejection, not a crash)
        log.warning("replayssm: rewrite of %s failed", names, exc_info=True)
        raise Rejected("rewrite_failed", f"{type(e).__name__}: {e}") from e
    try:
        floor = validate.tolerance_of([n for s in sites for step in s.steps for n in rewrite_sites.leaf_nodes(step)])
        bad = validate.check(probe, candidate, example_inputs, [placeholders.index(s.placeholder) for s in sites],
                             compared=n_reads, state_floor=floor)
    except Exception as e:  # noqa: BLE001
        raise Rejected("validation_error", f"{type(e).__name__}: {e}") from e
    if bad:
        raise Rejected("validation", f"numeric check failed: {bad}")


def _kernel_name(site, options) -> str:
    impl = resolve_kernels(options.kernels, site.placeholder.meta["example_value"].device)
    return f"{site.route}_{site.family.template}[{impl}]"


def _report(site, options) -> SiteReport:
    return SiteReport(state=site.name, family=site.family.name, state_shape=site.state_shape, layout=site.layout,
                      window=options.window, read_dtype=options.read_dtype,
                      checkpoint_dtype=str(checkpoint_dtype(site.placeholder.meta["example_value"].dtype, options)
                                           ).replace("torch.", ""),
                      kernel=_kernel_name(site, options), tokens=site.tokens, k_heads=rewrite_sites.key_heads(site),
                      route=site.route)


def _count(reports, rejected, options) -> None:
    for r in reports:
        counters["sites_rewritten"] += 1
        counters[f"rewrite:{r.family}"] += 1
        counters[f"route:{r.route}"] += 1
        log.info("replayssm: rewrote %s as %s (%s, %s, %d token(s))", r.state, r.family, r.layout,
                 r.kernel, r.tokens)
    for r in rejected:
        counters["sites_rejected"] += 1
        counters[f"reject:{r.code}"] += 1
        log.info("replayssm: left %s as it was: %s (%s)", r.state, r.reason, r.code)
    if options.strict and rejected:
        raise ReplayCompileError("replayssm (strict): " + "; ".join(f"{r.state}: {r.reason}" for r in rejected))
