"""Find recurrent-state sites in a Dynamo graph and prove them affine in a registered family's form.

Why a separate pass: detection must be semantic. Each candidate state (a 4-D floating placeholder
that is written back) is interpreted with :mod:`normal_form`; the first value whose form is
``Decay(S) + rank-one`` is one step of the recurrence, and becomes the state atom of the next
*generation* (a Python loop over T tokens unrolled by Dynamo is T generations, one multi-token op).
Everything unproven is left alone, with the reason recorded.

# NOTE [versions]
Dynamo graphs keep in-place writes as ``x.mul_(y)`` and keep referring to the placeholder ``x``
afterwards. Every node's arguments are therefore *resolved* to the version of the tensor current
when the node runs (the last in-place node on the same tensor), which makes in-place chains and
functional spellings the same dependency graph. ``copy_`` does not read its target's old value.
An in-place write through a view (``state[:, 0].mul_``, ``state.transpose(..).add_``) would change
the state behind this bookkeeping: such states are rejected.

# NOTE [site shape]
Per generation ``g`` (state atom ``S_g``; ``S_0`` the placeholder) the S_g-dependent nodes,
cut at the step node ``N`` (the first ``Decay(S_g) + outer`` value) and at reads (one contraction of
``S_g`` with a vector along K), must all be ancestors of ``N`` or of a read: any other use of the
state (another consumer, a nonlinear function, a dense transition) rejects the site. Reads of
``S_g`` for ``g >= 1`` are the outputs of step ``g``; reads of ``S_0`` (the pre-update state) are
rejected. The last atom must be written back: the placeholder's final in-place version, or returned.

# NOTE [delta rule]
``S' = D S + k u^T`` with ``u = beta (v - (D S)^T k)`` expands to two outer monomials:
``+k beta v`` and ``-k beta sum_K(D S k)``. The pass requires the contraction's decay and vector
to be the same values (structurally) as the update's, then reads ``beta`` and ``v`` off the two.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.fx as fx

from ..families import families as registered_families
from .normal_form import (LABELS, METADATA, SHAPE_ONLY_ARGS, STATE, atoms, Contract, Form, Interpreter, Leaf,
                          describe, dtype_of, inplace_of, is_bare_state, match_multiset, op_name, shape_of)


class Rejected(Exception):
    def __init__(self, code: str, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code, self.reason = code, reason


# ---------------------------------------------------------------------------------- graph index
class GraphIndex:
    """Version-resolved dependencies of a graph (NOTE [versions])."""

    def __init__(self, graph: fx.Graph):
        self.order = list(graph.nodes)
        self.pos = {n: i for i, n in enumerate(self.order)}
        self.resolved: dict = {}
        self.root: dict = {}
        current: dict = {}
        for n in self.order:
            res = {}
            fx.node.map_arg((n.args, n.kwargs), lambda a: res.setdefault(a, current.get(self.root.get(a, a), a)))
            self.resolved[n] = res
            if inplace_of(n):
                base = self.root.get(n.args[0], n.args[0])
                self.root[n] = base
                current[base] = n
        self.final = current
        self.deps = {n: self._deps(n) for n in self.order}
        self.users: dict = {n: [] for n in self.order}
        for n, ds in self.deps.items():
            for d in ds:
                self.users[d].append(n)

    def resolve(self, node, arg):
        return self.resolved.get(node, {}).get(arg, arg)

    def _deps(self, n):
        if n.op == "output" or op_name(n) in METADATA:
            return []
        args = list(n.args)
        if n.op == "call_method" and n.target in ("copy_", "fill_", "zero_"):
            args = args[1:]
        if op_name(n) in SHAPE_ONLY_ARGS:
            args = args[:1]
        out = []
        fx.node.map_arg((args, n.kwargs), lambda a: out.append(self.resolve(n, a)))
        return list(dict.fromkeys(out))

    def ancestors(self, nodes) -> set:
        seen, stack = set(), list(nodes)
        while stack:
            n = stack.pop()
            for d in self.deps.get(n, ()):
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return seen

    def reach(self, start, cut=()) -> set:
        """Nodes depending on ``start`` without passing through ``cut`` (cut nodes included)."""
        seen, stack = set(), [start]
        while stack:
            n = stack.pop()
            for u in self.users.get(n, ()):
                if u not in seen:
                    seen.add(u)
                    if u not in cut:
                        stack.append(u)
        return seen

    def output_node(self):
        return self.order[-1] if self.order and self.order[-1].op == "output" else None


# --------------------------------------------------------------------------------------- sites
@dataclasses.dataclass
class Step:
    """Canonical factors of one generation (leaves; built into graph values by the rewrite)."""

    node: fx.Node
    k: list
    v: list            # [(sign, leaves)] summed
    decay: list        # leaves whose product is the decay factor
    beta: Optional[list] = None
    beta_sign: int = 1
    q: Optional[list] = None
    reads: list = dataclasses.field(default_factory=list)   # [(node, sign, outside leaves, axes)]


@dataclasses.dataclass
class Site:
    placeholder: fx.Node
    name: str
    family: object
    layout: str
    decay_kind: str
    delta: bool
    key: str           # "r" or "c": the physical state axis that is K
    steps: list
    region: set
    returned: bool
    sizes: dict
    axes: dict = dataclasses.field(default_factory=dict)   # region node -> its axes (shape uses)
    read_old: bool = False  # steps[0] is a read of the pre-update state, not a token
    route: str = "replay"   # or "standard": set by the cost model at rewrite time (NOTE [cost model])

    @property
    def tokens(self) -> int:
        return len(self.steps) - self.read_old

    @property
    def state_shape(self) -> tuple:
        return tuple(self.sizes[a] for a in LABELS)


def source_name(node: fx.Node) -> str:
    ga = node.meta.get("grapharg")
    try:
        name = ga.source.name
        return name() if callable(name) else str(name)
    except Exception:  # noqa: BLE001  (source naming is best effort)
        return node.name


def candidate_states(index: GraphIndex) -> list:
    """4-D floating placeholders written back: mutated in place, or a same-shaped output depends on them."""
    out = index.output_node()
    outs = []
    if out is not None:
        fx.node.map_arg(out.args, outs.append)
    found = []
    for n in index.order:
        if n.op != "placeholder":
            continue
        val = n.meta.get("example_value")
        if not isinstance(val, torch.Tensor) or val.dim() != 4 or not val.dtype.is_floating_point:
            continue
        mutated = index.final.get(n, n) is not n
        returned = not mutated and any(o in _state_sized_flow(index, n) and shape_of(o) == shape_of(n) for o in outs)
        if mutated or returned:
            found.append(n)
    return found


def _state_sized_flow(index: GraphIndex, P: fx.Node) -> set:
    """Nodes reached from ``P`` through values as large as ``P`` (a state flows; a slice of an input does not)."""
    numel = lambda n: math.prod(shape_of(n) or (-1,))  # noqa: E731
    seen, stack, size = set(), [P], numel(P)
    while stack:
        for u in index.users.get(stack.pop(), ()):
            if u not in seen and numel(u) == size:
                seen.add(u)
                stack.append(u)
    return seen


def analyze(index: GraphIndex, P: fx.Node) -> Site:
    """Prove ``P`` a recurrent state of some registered family, or raise :class:`Rejected`."""
    sizes = dict(zip(LABELS, shape_of(P)))
    mutated = index.final.get(P, P) is not P
    atom, axes = P, LABELS
    gens, region, axes_of, old_reads = [], set(), {}, []
    while True:
        interp = Interpreter(sizes, index.resolve)
        interp.run(atom, axes, index.order[index.pos[atom] + 1:])
        forms = interp.forms
        step = next((n for n in index.order if n in forms and _split_step(forms[n]) is not None), None)
        anc_step = index.ancestors([step]) if step is not None else set()
        reads, live = _reads_and_live(index, interp, atom, step, anc_step)
        anc_reads = index.ancestors(reads)
        if gens:
            gens[-1].reads = [(r, forms[r]) for r in reads]
        elif step is not None:
            old_reads = [(r, forms[r]) for r in reads]
        region |= live | {atom}
        axes_of.update({n: forms[n].axes for n in live | {atom} if n in forms})
        if step is None:
            _check_final(index, interp, P, atom, live, anc_reads, mutated, bool(gens))
            break
        bad = [n for n in live if n not in anc_step and n not in anc_reads]
        if bad:
            raise _other_use(interp, bad, forms)
        gens.append(_GenRaw(step, forms[step]))
        atom, axes = step, forms[step].axes
    if not gens:
        raise Rejected("no_update", "no affine update of the state found")
    site = _recognize(P, gens, old_reads, region | {g.node for g in gens}, sizes, returned=not mutated)
    site.axes = axes_of
    return site


@dataclasses.dataclass
class _GenRaw:
    node: fx.Node
    form: Form
    reads: list = dataclasses.field(default_factory=list)


def _reads_and_live(index, interp, atom, step, anc_step):
    """Reads of ``atom`` (cut points) and the nodes reached from it before any cut (NOTE [site shape])."""
    forms = interp.forms
    reads, live = [], set()
    cut = {step} if step is not None else set()
    for n in index.order[index.pos[atom] + 1:]:
        if n.op == "output" or not any(d is atom or d in live for d in index.deps[n]):
            continue
        if n in cut:
            continue
        if n in forms and n not in anc_step and _read_parts(forms[n]) is not None:
            reads.append(n)
            continue
        live.add(n)
    return reads, live


def _other_use(interp, bad, forms) -> Rejected:
    for n in bad:
        if n in interp.failures:
            e = interp.failures[n]
            return Rejected(e.code, f"{e.detail} (at {n.name})")
    n = bad[0]
    what = describe(forms[n]) if n in forms else "?"
    return Rejected("other_use", f"the state reaches {n.name} ({n.target}), which is neither its update nor a "
                                 f"mat-vec read: {what}")


def _check_final(index, interp, P, atom, live, anc_reads, mutated, has_steps):
    forms = interp.forms
    transparent = {n for n in live if n in forms and is_bare_state(forms[n])}
    bad = [n for n in live if n not in transparent and n not in anc_reads]
    if bad:
        raise _other_use(interp, bad, forms)
    if not has_steps:
        return
    writeback = lambda n: n is atom or (n in transparent and forms[n].axes == LABELS and  # noqa: E731
                                        dtype_of(n) == dtype_of(P))
    out = index.output_node()
    returned = []
    if out is not None:
        fx.node.map_arg(out.args, lambda a: returned.append(index.resolve(out, a)))
    escaped = [r for r in returned if r is atom or r in live]
    if any(not writeback(r) or mutated for r in escaped):
        raise Rejected("returned_form", "the new state is returned in another form (or returned and written in place)")
    if mutated:
        if not writeback(index.final[P]):
            raise Rejected("not_written_back", "the state's final in-place value is not its updated value")
    elif not escaped:
        raise Rejected("not_written_back", "the updated state is neither written back in place nor returned")


def _split_step(form: Form):
    present = atoms(form.axes)
    if sorted(present) != sorted(LABELS):
        return None
    decay = [m for m in form.terms if STATE in m.factors]
    outer = [m for m in form.terms if STATE not in m.factors]
    if len(decay) != 1 or not outer:
        return None
    return decay[0], outer


def _read_parts(form: Form):
    """``(label, sign, inner leaves, outer leaves)`` when ``form`` is ``outer * sum_label(S * inner)``."""
    if len(form.terms) != 1:
        return None
    m = form.terms[0]
    contracts = [f for f in m.factors if isinstance(f, Contract)]
    if len(contracts) != 1 or any(f is STATE for f in m.factors):
        return None
    c = contracts[0]
    inner = [f for f in c.mono.factors if f is not STATE]
    if c.label not in ("r", "c") or c.mono.factors.count(STATE) != 1 or not all(isinstance(f, Leaf) for f in inner):
        return None
    other = "c" if c.label == "r" else "r"
    if any(f.free - {"b", "h", c.label} for f in inner):
        return None
    outer = [f for f in m.factors if f is not c]
    if any(f.free - {"b", "h", other} for f in outer):
        return None
    if sorted(atoms(form.axes)) != sorted(["b", "h", other]):
        return None
    return c.label, m.sign * c.mono.sign, inner, outer


# ----------------------------------------------------------------------------------- recognize
def _orientation(gens, old_reads) -> str:
    votes = {_read_parts(form)[0] for _, form in old_reads}
    for g in gens:
        decay, outer = _split_step(g.form)
        for f in decay.factors:
            if f is not STATE:
                votes |= f.free & {"r", "c"}
        for m in outer:
            votes |= {f.label for f in m.factors if isinstance(f, Contract)}
        for _, form in g.reads:
            votes.add(_read_parts(form)[0])
    if len(votes) != 1:
        raise Rejected("orientation", "cannot tell the key axis of the state" if not votes else
                       "decay, reads and delta rule disagree on the key axis")
    return votes.pop()


def _sides(leaves, K, V):
    k, u, s = [], [], []
    for f in leaves:
        if not isinstance(f, Leaf):
            raise Rejected("not_rank_one", "the update is not an outer product of two vectors")
        if K in f.free and V in f.free:
            raise Rejected("not_rank_one", "an update factor spans both state axes")
        (k if K in f.free else u if V in f.free else s).append(f)
    return k, u, s


def _recognize(P, gens, old_reads, region, sizes, returned) -> Site:
    K = _orientation(gens, old_reads)
    V = "c" if K == "r" else "r"
    steps, kinds = [], set()
    for g in gens:
        decay, outer = _split_step(g.form)
        if decay.sign != 1 or not all(isinstance(f, Leaf) or f is STATE for f in decay.factors):
            raise Rejected("decay", "the state's decay is not a positive elementwise factor")
        dleaves = [f for f in decay.factors if f is not STATE]
        if any(f.free - {"b", "h", K} for f in dleaves):
            raise Rejected("dense_decay", "the state's transition is not a per-head or per-key-channel decay")
        kind = "none" if not dleaves else "channel" if any(K in f.free for f in dleaves) else "scalar"
        step = _delta_step(g.node, outer, dleaves, K, V) if any(m.degree for m in outer) else \
            _plain_step(g.node, outer, dleaves, K, V)
        kinds.add((kind, step.beta is not None))
        step.q, step.reads = _query(g.reads, K)
        steps.append(step)
    if len(kinds) != 1:
        raise Rejected("mixed_steps", "the unrolled steps are of different kinds")
    kind, delta = kinds.pop()
    if old_reads:  # NOTE [reads of the old state]
        q, reads = _query(old_reads, K)
        steps.insert(0, Step(node=None, k=[], v=[], decay=[], q=q, reads=reads))
    return Site(placeholder=P, name=source_name(P), family=None, layout="kv" if K == "r" else "vk",
                decay_kind=kind, delta=delta, key=K, steps=steps, region=region, returned=returned, sizes=sizes,
                read_old=bool(old_reads))


def _plain_step(node, outer, dleaves, K, V) -> Step:
    k0, vs = None, []
    for m in outer:
        k, u, s = _sides(m.factors, K, V)
        if not k or not u:
            raise Rejected("not_rank_one", "an update term is constant along a state axis")
        if k0 is None:
            k0 = k
        elif match_multiset(k, k0) != [] or len(k) != len(k0):
            raise Rejected("not_rank_one", "the update is a sum of outer products with different keys")
        vs.append((m.sign, s + u))
    return Step(node, k=k0, v=vs, decay=dleaves)


def _delta_step(node, outer, dleaves, K, V) -> Step:
    if len(outer) != 2:
        raise Rejected("delta", "state-dependent update that is not the delta rule")
    A, B = sorted(outer, key=lambda m: m.degree)
    cs = [f for f in B.factors if isinstance(f, Contract)]
    if A.degree or len(cs) != 1 or cs[0].label != K:
        raise Rejected("delta", "state-dependent update that is not the delta rule")
    c = cs[0]
    kA, uA, sA = _sides(A.factors, K, V)
    kB, uB, sB = _sides([f for f in B.factors if f is not c], K, V)
    inner = [f for f in c.mono.factors if f is not STATE]
    # the decay's scalar factors sit outside the contraction, its channel factors inside; so do the
    # key's scalar factors (an l2 norm ``x * rsqrt(..)``): once from k, once from the (D S)^T k read
    w = match_multiset([f for f in dleaves if K in f.free], inner) if all(isinstance(f, Leaf) for f in inner) else None
    scalars = match_multiset([f for f in dleaves if K not in f.free], sB)
    k_scale = _pairs(scalars) if scalars is not None else []
    beta = match_multiset(k_scale + k_scale, scalars) if scalars is not None else None
    rest = match_multiset(k_scale + beta, sA) if beta is not None else None
    ok = (not uB and kA and c.mono.sign == 1 and c.mono.factors.count(STATE) == 1 and w is not None
          and rest is not None and match_multiset(kB, kA) == [] and len(kA) == len(kB)
          and match_multiset(w, kA) == [] and len(w) == len(kA))
    if not ok:
        raise Rejected("delta", "the correction term does not read the decayed state along the update's key")
    return Step(node, k=kA + k_scale, v=[(-A.sign * B.sign, rest + uA)], decay=dleaves, beta=beta, beta_sign=-B.sign)


def _pairs(leaves: list) -> list:
    """One of each pair of equal leaves (the key's scalar factors appear squared in the correction)."""
    rest, out = list(leaves), []
    while rest:
        x = rest.pop()
        twin = match_multiset([x], rest)
        if twin is not None:
            out.append(x)
            rest = twin
    return out


def _query(reads, K):
    q, out = None, []
    for node, form in reads:
        label, sign, inner, outer = _read_parts(form)
        if q is None:
            q = inner
        elif match_multiset(inner, q) != [] or len(inner) != len(q):
            raise Rejected("two_queries", "one state is read with two different query vectors in one step")
        out.append((node, sign, outer, form.axes))
    return q, out


def choose_family(site: Site, options):
    """The registered family whose template is the site's (decay kind x delta rule)."""
    fits = [f for f in registered_families() if f.decay == site.decay_kind and f.delta == site.delta]
    enabled = [f for f in fits if options.family_enabled(f.name)]
    if not enabled:
        what = f"{site.decay_kind} decay{' + delta rule' if site.delta else ''}"
        raise Rejected("family_disabled" if fits else "no_family", f"no enabled family has {what}")
    preferred = [f for f in enabled if f.name == "mamba2"] if site.layout == "vk" else []
    return (preferred or enabled)[0]


__all__ = ["GraphIndex", "Site", "Step", "Rejected", "analyze", "candidate_states", "choose_family"]
