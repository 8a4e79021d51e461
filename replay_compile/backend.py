"""The ``replayssm`` torch.compile backend.

``torch.compile(model, backend="replayssm", options={...})`` finds this function through the
``torch_dynamo_backends`` entry point (pyproject.toml); it is a plain function on purpose: a second
registration at import time fails the first compile of a fresh process (COMPILER_NOTES.md).

# NOTE [where the pass runs]
On Dynamo's torch-level graph, before AOTAutograd: module buffers and cache tensors are placeholders
with their sources (reports name them), ``example_inputs`` are real tensors (the numeric validation
runs the graph), einsum equations and in-place chains are still visible, and the rewritten graph is
then compiled exactly like default ``torch.compile`` (``compile_fx`` with the options of ``mode``:
``torch.compile``'s ``mode=`` or the backend option of that name, since ``torch.compile`` refuses
``mode=`` together with ``options=``). An
Inductor post-grad hook would see normalized ATen instead, but its cached artifacts would need a
``uuid()`` over sources, families and options; at this level Inductor caches the already rewritten
graph, op config strings included, so no extra cache key is needed.

# NOTE [exact state for other graphs]
A graph that reads or writes a replay-managed state without owning it (a prefill or chunked path,
a reset, a graph whose site was rejected) must see the exact state: before it runs, every such
input that the op registry manages is materialized; after it runs, inputs it wrote in place are
reloaded (their rings dropped, read copies rebuilt). Graphs with no such inputs run unwrapped.
"""
from __future__ import annotations

from typing import Optional

import torch

from .ops import registry
from .options import ReplayOptions
from .passes import RewriteResult, rewrite_graph


def replayssm_backend(gm: torch.fx.GraphModule, example_inputs, mode: Optional[str] = None,
                      options: Optional[dict] = None):
    """Rewrite recurrent-state sites of ``gm``, compile the rest (Inductor unless ``inductor=False``)."""
    opts = ReplayOptions.from_dict(options)
    result = rewrite_graph(gm, example_inputs, opts)
    return guard_other_states(compile_rest(result.gm, example_inputs, inductor_mode(mode, opts), opts), result)


def inductor_mode(mode: Optional[str], opts: ReplayOptions) -> Optional[str]:
    """``torch.compile``'s ``mode=`` or the ``mode`` option (both only when they agree)."""
    if mode is not None and opts.mode is not None and mode != opts.mode:
        raise ValueError(f"torch.compile mode={mode!r} and option 'mode'={opts.mode!r} disagree")
    if mode not in (None, "default") and not opts.inductor:
        raise ValueError(f"torch.compile mode={mode!r} needs inductor=True (the mode is Inductor's)")
    return mode if mode is not None else opts.mode


def compile_rest(gm: torch.fx.GraphModule, example_inputs, mode: Optional[str], opts: ReplayOptions):
    """The rewritten graph compiled as default ``torch.compile`` would (``mode`` honoured), or eager."""
    if not opts.inductor:
        return gm.forward
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    return compile_fx(gm, example_inputs, config_patches=list_mode_options(mode) if mode else None)


def guard_other_states(compiled, result: RewriteResult):
    """Wrap ``compiled`` per NOTE [exact state for other graphs]."""
    watched = sorted(result.state_inputs)
    if not watched:
        return compiled
    written = [i for i in watched if i in result.mutated_inputs]

    def run(*args):  # Dynamo calls a backend's callable with unboxed inputs
        if registry.is_empty():  # e.g. a batch-1 model whose sites all stayed standard: no per-input lookups
            return compiled(*args)
        managed = [(i, rs) for i in watched if isinstance(args[i], torch.Tensor)
                   for rs in [registry.find(args[i])] if rs is not None]
        for _, rs in managed:
            rs.materialize()
        out = compiled(*args)
        for i, rs in managed:
            if i in written:
                rs.reload()
        return out

    return run
