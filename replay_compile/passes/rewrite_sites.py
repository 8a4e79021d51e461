"""Replace a proven site's update and reads by ``replay_compile::advance`` calls.

Why: once :mod:`find_sites` has proven a state's update affine in a family's form, the canonical
inputs are products of graph values (the leaves of its normal form). This pass builds them with a
few view/mul nodes, calls the op, rewires every read to the op's output and deletes the old update.

# NOTE [op placement]
An op for generations ``g..h`` is inserted after the last node its inputs need; every read of those
generations must come after that point (a token's input computed from an earlier token's output,
as in an autoregressive unroll, forces one op per token). Speculative sites need all drafts in one
op, so they are rejected when that is impossible.

# NOTE [log decay]
A decay leaf ``exp(x)`` computed in fp32/fp64 contributes ``x`` to ``log_a`` (no log/exp round
trip); any other leaf contributes ``log(leaf)`` (a precomputed decay, or an ``exp`` rounded to 16
bits: the log of the rounded value, taken after widening, reproduces the decay eager multiplies
by), a constant ``log(c)``.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from ..ops.registry import site_config
from .find_sites import Rejected, Site
from .normal_form import LABELS, atoms, dtype_of, exp_argument, inplace_of, op_name, shape_of

_DIM = {a: i for i, a in enumerate(LABELS)}


class _Builder:
    """Emits nodes before ``anchor``; labels are state axes (NOTE [labels] in ``normal_form``)."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node, state: fx.Node):
        self.g, self.anchor, self.state = graph, anchor, state
        self._sizes = {}

    def call(self, target, *args, method=False):
        with self.g.inserting_before(self.anchor):
            return self.g.call_method(target, args) if method else self.g.call_function(target, args)

    def size(self, label):
        if label not in self._sizes:
            self._sizes[label] = self.call("size", self.state, _DIM[label], method=True)
        return self._sizes[label]

    def align(self, node, labels, target, flat=frozenset()) -> fx.Node:
        """``node`` (dims labelled ``labels``) viewed with axes ``target`` (missing axes size 1).

        Merged axes (NOTE [merged axes] in ``normal_form``) are split first and merged again last.
        """
        x = node
        for d in reversed(range(len(labels))):
            if isinstance(labels[d], tuple):
                x = self.call("unflatten", x, d, [self.size(a) for a in labels[d]], method=True)
        labels = tuple(y for l in labels for y in (l if isinstance(l, tuple) else (l,)))
        flat_target = tuple(y for l in target for y in (l if isinstance(l, tuple) else (l,)))
        x = self._align_atoms(x, labels, flat_target, flat)
        start = 0
        merges = []
        for l in target:
            width = len(l) if isinstance(l, tuple) else 1
            if width > 1:
                merges.append((start, start + width - 1))
            start += width
        for a, b in reversed(merges):
            x = self.call("flatten", x, a, b, method=True)
        return x

    def _align_atoms(self, x, labels, target, flat) -> fx.Node:
        for d in reversed(range(len(labels))):
            if labels[d] is None:
                x = self.call("squeeze", x, d, method=True)
            elif labels[d] in flat:  # constant along this axis: any index will do
                x = self.call(torch.select, x, d, 0)
        present = [l for l in labels if l is not None and l not in flat]
        if any(l not in target for l in present):
            raise Rejected("internal", f"factor axes {labels} do not fit {target}")
        perm = sorted(range(len(present)), key=lambda i: target.index(present[i]))
        if perm != list(range(len(present))):
            x = self.call("permute", x, *perm, method=True)
        for i, l in enumerate(target):
            if l is None or l not in present:
                x = self.call("unsqueeze", x, i, method=True)
        return x

    def widened(self, node) -> fx.Node:
        """``node`` in the state's compute precision when it is a 16-bit float (exact: a widening cast)."""
        if dtype_of(node) not in (torch.bfloat16, torch.float16):
            return node
        return self.call("to", node, torch.float64 if dtype_of(self.state) == torch.float64 else torch.float32,
                         method=True)

    def leaf(self, f, target):
        if f.node is None:
            return None, f.const ** f.power
        x = self.align(f.node, f.labels, target, f.flat)
        return (x if f.power == 1 else self.call(torch.reciprocal, x)), 1.0

    def product(self, leaves, target, scale: float = 1.0):
        out = None
        for f in leaves:
            x, c = self.leaf(f, target)
            scale *= c
            if x is not None:
                out = x if out is None else self.call(torch.mul, out, x)
        if out is None:
            raise Rejected("constant_input", "a canonical input is a constant")
        return out if scale == 1.0 else self.call(torch.mul, out, scale)

    def full(self, x, target):
        """Expanded to the full canonical shape and made contiguous."""
        x = self.call("expand", x, *[self.size(l) for l in target], method=True)
        return self.call("contiguous", x, method=True)

    def log_decay(self, leaves, target):
        out, const = None, 0.0
        for f in leaves:
            if f.node is None:
                if f.const <= 0:
                    raise Rejected("decay", "a non-positive constant decay")
                const += f.power * math.log(f.const)
                continue
            # exp(x) rounded to 16 bits is not exp(x): the log of the decay as stored keeps its rounding
            arg = exp_argument(f.node) if dtype_of(f.node) in (torch.float32, torch.float64) else None
            x = self.align(arg if arg is not None else self.call(torch.log, self.widened(f.node)), f.labels,
                           target, f.flat)
            if f.power != 1:
                x = self.call(torch.neg, x)
            out = x if out is None else self.call(torch.add, out, x)
        if out is None:
            raise Rejected("decay", "a constant decay")
        return out if const == 0.0 else self.call(torch.add, out, const)


def leaf_nodes(step) -> list:
    """Graph values a step's canonical inputs are built from."""
    leaves = list(step.k) + list(step.decay) + list(step.q or []) + list(step.beta or [])
    for _, vs in step.v:
        leaves += list(vs)
    return [f.node for f in leaves if f.node is not None]


def _early_users(site: Site, steps, anchor_pos: int, order) -> list:
    """Descendants of ``steps``' reads placed before the op's anchor (moved after it), or None when
    one is an input of the chunk or moving them past an in-place write would change their value."""
    pos = {n: i for i, n in enumerate(order)}
    leaves = {n for s in steps for n in leaf_nodes(s)}
    found, stack = set(), [r for s in steps for r, *_ in s.reads]
    while stack:
        for u in stack.pop().users:
            if u not in found and pos[u] <= anchor_pos:
                found.add(u)
                stack.append(u)
    if found & leaves:
        return None
    if found:
        first = min(pos[n] for n in found)
        if any(inplace_of(n) and n not in site.region for n in order[first:anchor_pos + 1]):
            return None
    return sorted(found, key=pos.get)


def plan_chunks(site: Site, order: list) -> list:
    """Consecutive generations sharing one op (NOTE [op placement]): ``[(first, last, anchor_pos, moved)]``."""
    pos = {n: i for i, n in enumerate(order)}
    anchor_of = lambda steps: max((pos[n] for s in steps for n in leaf_nodes(s)), default=-1)  # noqa: E731
    chunks, start = [], 0
    while start < len(site.steps):
        end = start
        moved = _early_users(site, site.steps[start:start + 1], anchor_of(site.steps[start:start + 1]), order)
        if moved is None:
            raise Rejected("read_order", "a step's own output feeds its inputs")
        while end + 1 < len(site.steps):
            more = _early_users(site, site.steps[start:end + 2], anchor_of(site.steps[start:end + 2]), order)
            if more is None:
                break
            end, moved = end + 1, more
        chunks.append((start, end, anchor_of(site.steps[start:end + 1]), moved))
        start = end + 1
    return chunks


def rewrite_site(gm: fx.GraphModule, site: Site, options) -> None:
    """Rewrite ``site`` in ``gm.graph`` in place (the site was found on this graph)."""
    g = gm.graph
    order = list(g.nodes)
    chunks = plan_chunks(site, order)
    if options.speculative and len(chunks) > 1:
        raise Rejected("speculative_order", "a draft token's input depends on an earlier draft's output")
    K, V = site.key, ("c" if site.key == "r" else "r")
    groups = _common_groups(site)
    ckpt = _checkpoint_option(site, options)
    config = lambda read_old: site_config(  # noqa: E731
        family=site.family.name, window=options.window, layout=site.layout, k_heads=site.sizes["h"] // groups,
        read_dtype=options.read_dtype, stochastic_rounding=options.stochastic_rounding, kernels=options.kernels,
        speculative=options.speculative, read_old=read_old, checkpoint_dtype=ckpt, route=site.route,
        verify_form=options.verify_form)
    for first, last, anchor_pos, moved in chunks:
        anchor = order[anchor_pos + 1] if anchor_pos >= 0 else next(n for n in order if n.op != "placeholder")
        b = _Builder(g, anchor, site.placeholder)
        steps = site.steps[first:last + 1]
        read_old = site.read_old and first == 0
        if read_old and len(steps) == 1:
            raise Rejected("read_order", "the pre-update read feeds the update's inputs")
        canon = [_canonical(b, s, K, V, site, groups) for s in steps[read_old:]]
        stacked = [None if c[0] is None else b.call(torch.stack, list(c), 1) for c in zip(*canon)]
        if read_old:
            q0 = _query_input(b, steps[0], K, groups)
            stacked[0] = b.call(torch.cat, [b.call("unsqueeze", q0, 1, method=True), stacked[0]], 1)
        o = b.call(torch.ops.replay_compile.advance.default, site.placeholder, *stacked, config(read_old))
        for t, s in enumerate(steps):
            o_t = b.call(torch.select, o, 1, t)
            for read, sign, outer, axes in s.reads:
                _replace_read(b, read, o_t, sign, outer, axes, V)
        for n in moved:
            anchor.prepend(n)
    _remove_update(g, site)


def checkpoint_dtype(state_dtype: torch.dtype, options) -> torch.dtype:
    """The checkpoint's dtype for a state of ``state_dtype`` (NOTE [checkpoint dtype] in ``runtime.state``).

    ``checkpoint_dtype="float32"`` (the default) narrows nothing: every state is its own checkpoint.
    A 16-bit option narrows float32 states; a state already in it is its own checkpoint; any other
    state cannot honour it and is rejected rather than silently kept at another precision.
    """
    wanted = options.checkpoint_torch_dtype
    if wanted == torch.float32 or state_dtype == wanted:
        return state_dtype
    if state_dtype != torch.float32:
        raise Rejected("checkpoint_dtype", f"checkpoint_dtype={options.checkpoint_dtype} applies to float32 states, "
                                           f"this one is {str(state_dtype).replace('torch.', '')}")
    return wanted


def _checkpoint_option(site: Site, options):
    """The op's ``checkpoint_dtype``: None when the state is its own checkpoint."""
    state_dtype = site.placeholder.meta["example_value"].dtype
    ckpt = checkpoint_dtype(state_dtype, options)
    return None if ckpt == state_dtype else str(ckpt).replace("torch.", "")


def key_heads(site: Site) -> int:
    """Query/key heads of the rewritten site (the ring keeps one key per key head)."""
    return site.sizes["h"] // _common_groups(site)


def _head_repeats(leaves, sizes: dict) -> int:
    """``r`` when the product of ``leaves`` has grouped heads (head ``h`` equals head ``r * (h // r)``),
    proven per leaf: each one is constant along heads or repeats them ``r``-fold (:func:`_leaf_repeats`);
    1 when that is not proven (the site then keeps one key per value head)."""
    found = set()
    for f in leaves:
        if f.node is None or "h" not in f.free:
            continue
        found.add(_leaf_repeats(f, sizes))
    return found.pop() if len(found) == 1 else 1


def _leaf_repeats(f, sizes: dict) -> int:
    """Repeats of a leaf's head axis, found under order-preserving views and casts of the leaf:
    ``x.repeat_interleave(r, dim=<head>)``, or ``expand`` of a size-1 axis right after the head axis
    followed by a reshape merging the two (``x[:, :, None].expand(B, Hk, r, K).reshape(B, Hk * r, K)``,
    ``unsqueeze``/``flatten``/``contiguous`` spellings alike). Shapes prove the head axis is the one
    repeated: the non-1 sizes of the repeated value and of the leaf (its state labels) must agree."""
    seq = [sizes[a] for a in atoms(f.labels) if sizes[a] != 1]
    head = sum(1 for a in atoms(f.labels)[:atoms(f.labels).index("h")] if sizes[a] != 1)
    node = f.node
    while isinstance(node, fx.Node):
        found = _interleaved(node) or _expanded(node)
        if found is not None:
            shape, axis, repeats = found
            ok = [d for d in shape if d != 1] == seq and sum(1 for d in shape[:axis] if d != 1) == head
            return repeats if ok and repeats > 1 else 1
        if op_name(node) not in ORDER_KEEPING or not node.args:
            return 1
        node = node.args[0]
    return 1


ORDER_KEEPING = {"reshape", "view", "flatten", "unflatten", "unsqueeze", "squeeze", "contiguous", "clone", "to",
                 "float", "double", "type_as"}


def _interleaved(node):
    """``(shape, head axis, repeats)`` of ``x.repeat_interleave(repeats, dim)`` with one repeat count for
    all (an int, or a symbolic size under dynamic shapes: then read off the shapes; a tensor of
    per-element counts is not a group repeat)."""
    if op_name(node) != "repeat_interleave":
        return None
    args, kw = node.args, node.kwargs
    repeats = kw.get("repeats", args[1] if len(args) > 1 else None)
    dim = kw.get("dim", args[2] if len(args) > 2 else None)
    shape, src = shape_of(node), shape_of(args[0]) if isinstance(args[0], fx.Node) else None
    scalar = isinstance(repeats, int) or (isinstance(repeats, fx.Node) and shape_of(repeats) is None)
    if not scalar or not isinstance(dim, int) or shape is None or src is None or len(src) != len(shape):
        return None
    dim %= len(shape)
    if src[dim] == 0 or shape[dim] % src[dim]:
        return None
    return shape, dim, shape[dim] // src[dim]


def _expanded(node):
    """``(merged shape, head axis, repeats)`` of ``reshape(expand(x))`` where the expand grows one size-1
    axis right after the head axis and the reshape merges the two (and only adds or drops size-1 axes)."""
    if op_name(node) not in ("reshape", "view", "flatten") or not isinstance(node.args[0], fx.Node):
        return None
    expand = node.args[0]
    while op_name(expand) in ("contiguous", "clone"):
        expand = expand.args[0]
    if op_name(expand) != "expand" or not isinstance(expand.args[0], fx.Node):
        return None
    src, es, rs = shape_of(expand.args[0]), shape_of(expand), shape_of(node)
    if None in (src, es, rs) or len(src) != len(es):
        return None
    grown = [i for i in range(len(es)) if es[i] != src[i]]
    if len(grown) != 1 or grown[0] == 0 or src[grown[0]] != 1:
        return None
    j = grown[0]
    merged = es[:j - 1] + (es[j - 1] * es[j],) + es[j + 1:]
    if [d for d in rs if d != 1] != [d for d in merged if d != 1]:
        return None
    return merged, j - 1, es[j]


def _common_groups(site: Site) -> int:
    """Value heads per query/key head when every step's q and k repeat grouped heads alike (else 1)."""
    found = {_head_repeats(s.k, site.sizes) for s in site.steps} | \
            {_head_repeats(s.q, site.sizes) for s in site.steps if s.q}
    return found.pop() if len(found) == 1 else 1


def _grouped(b: _Builder, leaves, target, groups):
    """The canonical ``[B, Hk, K]`` input of grouped heads: every ``groups``-th head of the product."""
    x = b.product(leaves, target)
    h = target.index("h")
    x = b.call(operator.getitem, x, tuple(slice(None, None, groups) if i == h else slice(None)
                                          for i in range(len(target))))
    sizes = [b.call("size", x, i, method=True) if l == "h" else b.size(l) for i, l in enumerate(target)]
    return b.call("contiguous", b.call("expand", x, *sizes, method=True), method=True)


def _query_input(b: _Builder, s, K, groups):
    bhk = ("b", "h", K)
    return _grouped(b, s.q, bhk, groups) if groups > 1 else b.full(b.product(s.q, bhk), bhk)


def _canonical(b: _Builder, s, K, V, site: Site, groups: int = 1):
    bhk, bhv, bh = ("b", "h", K), ("b", "h", V), ("b", "h")
    k = _grouped(b, s.k, bhk, groups) if groups > 1 else b.full(b.product(s.k, bhk), bhk)
    q = _query_input(b, s, K, groups) if s.q else b.call(torch.zeros_like, k)
    v = None
    for sign, leaves in s.v:
        term = b.product(leaves, bhv, float(sign))
        v = term if v is None else b.call(torch.add, v, term)
    v = b.full(v, bhv)
    log_a = None
    if site.decay_kind != "none":
        target = bh if site.decay_kind == "scalar" else bhk
        log_a = b.full(b.log_decay(s.decay, target), target)
    beta = b.full(b.product(s.beta, bh, float(s.beta_sign)), bh) if site.delta else None
    return q, k, v, log_a, beta


def _replace_read(b: _Builder, read, o_t, sign, outer, axes, V):
    """``read`` equals ``sign * prod(outer) * o_t`` with dims ``axes``."""
    x = b.align(o_t, ("b", "h", V), tuple(axes))
    scale = float(sign)
    for f in outer:
        y, c = b.leaf(f, tuple(axes))
        scale *= c
        if y is not None:
            x = b.call(torch.mul, x, y)
    if scale != 1.0:
        x = b.call(torch.mul, x, scale)
    val = read.meta.get("example_value")
    x = b.call("to", x, val.dtype, method=True) if isinstance(val, torch.Tensor) else x
    read.replace_all_uses_with(x)


def _remove_update(g: fx.Graph, site: Site) -> None:
    """Delete the old update: the op now owns the state. Returned states are the placeholder itself."""
    region = site.region
    for r in [n for n in g.nodes if n in region and n in site.axes]:
        for u in list(r.users):
            if u not in region and not _is_read(u, site):
                _drop_shape_use(g, u, r, site)
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    out.args = fx.node.map_arg(out.args, lambda a: site.placeholder if a in region else a)
    for n in reversed(list(g.nodes)):
        if (n in region or _is_read(n, site)) and n is not site.placeholder and not n.users:
            g.erase_node(n)
    left = [n for n in g.nodes if n in region and n is not site.placeholder]
    if left:
        raise Rejected("internal", f"old update nodes still used: {[n.name for n in left]}")


def _drop_shape_use(g, user, r, site) -> None:
    """``x.expand_as(r)``, ``r.size(d)`` ...: the same, with ``r``'s shape spelled from the placeholder's."""
    b = _Builder(g, user, site.placeholder)
    sizes = [1 if a is None else b.size(a) for a in site.axes[r]]
    name = op_name(user)
    if name == "size" and user.args[0] is r and len(user.args) == 2:
        user.replace_all_uses_with(sizes[user.args[1] % len(sizes)])
    elif name in ("expand_as", "view_as", "reshape_as") and user.args[1] is r and user.args[0] is not r:
        x = b.call({"expand_as": "expand", "view_as": "view", "reshape_as": "reshape"}[name], user.args[0],
                   *sizes, method=True)
        user.replace_all_uses_with(x)
    elif name == "type_as" and user.args[1] is r and user.args[0] is not r:
        user.replace_all_uses_with(b.call("to", user.args[0], r.meta["example_value"].dtype, method=True))
    else:
        return
    g.erase_node(user)


def _is_read(n, site) -> bool:
    return any(n is r for s in site.steps for r, *_ in s.reads)

