"""Normal forms of FX values relative to one recurrent state: the abstract domain of the rewrite.

Why: models spell one recurrence many ways (broadcast multiply + sum, ``einsum`` with any index
names, ``matmul`` with transposes, in-place chains, decays on either side). Matching spellings is
fragile; instead every value that depends on the state ``S`` is interpreted as a polynomial over
labelled atoms, in which all those spellings coincide.

# NOTE [labels]
The state's four axes are labelled ``b`` (batch), ``h`` (heads), ``r`` and ``c`` (its physical
dims 2 and 3). Every state-dependent value carries ``axes``: one label (or ``None`` for a size-1
axis) per dim. Which of ``r``/``c`` is the key axis K is decided later, by the contractions.

# NOTE [normal form]
A value is a sum of monomials ``sign * prod(factors)``; a factor is
  * ``Leaf(node, labels, power)``: an S-independent graph value, its dims labelled (``node=None``:
    a Python constant),
  * ``STATE``: the state itself (free labels ``b, h, r, c``),
  * ``Contract(label, mono)``: the sum over ``label`` of a monomial.
Multiplication distributes, sums concatenate, reductions become ``Contract`` around the factors
that carry the reduced label. A monomial containing ``STATE`` twice is nonlinear: interpretation
fails and the caller rejects the state with the recorded reason.

# NOTE [flat axes]
A leaf may span a state axis it does not vary along: Mamba-2 models expand ``exp(dt * A)`` to the
full ``[B, H, P, N]`` before multiplying. ``constant_along`` follows elementwise ops, expands and
views back to the inputs; the canonical input then takes index 0 along such axes.

# NOTE [merged axes]
``state.view(B * H, P, N)`` (Mamba-2's batched ``bmm`` read) merges adjacent labelled axes: such an
axis is labelled by a tuple (``("b", "h")``) and splits back on a later reshape. A merged axis may
be broadcast against and carried, not summed over.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Optional, Union

import torch
import torch.fx as fx

LABELS = ("b", "h", "r", "c")


class Unsupported(Exception):
    """The value cannot be put in normal form; the message is the rejection reason."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


@dataclasses.dataclass(frozen=True)
class Leaf:
    node: Optional[fx.Node]
    labels: tuple
    power: int = 1
    const: float = 1.0
    flat: frozenset = frozenset()   # labels the value is constant along (broadcast before, NOTE [flat axes])

    @property
    def free(self) -> frozenset:
        return frozenset(atoms(self.labels)) - self.flat


class _State:
    free = frozenset(LABELS)

    def __repr__(self):
        return "S"


STATE = _State()


@dataclasses.dataclass(frozen=True)
class Mono:
    sign: int
    factors: tuple

    @property
    def degree(self) -> int:
        return sum(1 if f is STATE else f.mono.degree if isinstance(f, Contract) else 0 for f in self.factors)

    @property
    def free(self) -> frozenset:
        return frozenset().union(*(f.free for f in self.factors)) if self.factors else frozenset()


@dataclasses.dataclass(frozen=True)
class Contract:
    label: str
    mono: Mono

    @property
    def free(self) -> frozenset:
        return self.mono.free - {self.label}


Factor = Union[Leaf, _State, Contract]


@dataclasses.dataclass(frozen=True)
class Form:
    """A state-dependent value: ``axes`` (label or None per dim) and a sum of monomials."""

    axes: tuple
    terms: tuple


def atoms(axes) -> list:
    """State labels of ``axes``, merged axes (tuples, NOTE [merged axes]) flattened in order."""
    out = []
    for a in axes:
        if isinstance(a, tuple):
            out.extend(a)
        elif a is not None:
            out.append(a)
    return out


def axis_size(sizes: dict, a) -> int:
    return 1 if a is None else math.prod(sizes[x] for x in a) if isinstance(a, tuple) else sizes[a]


def reshape_axes(axes, sizes: dict, out_shape) -> tuple:
    """Axes after reshaping a value with ``axes`` to ``out_shape``: labelled axes may merge (a tuple)
    or split back, size-1 axes come and go (NOTE [merged axes])."""
    flat = [(a, sizes[a]) for a in atoms(axes)]
    out, i = [], 0
    for s in out_shape:
        if s == 1:  # a size-1 dim keeps a size-1 label (batch 1) when one comes next
            take = i < len(flat) and flat[i][1] == 1
            out.append(flat[i][0] if take else None)
            i += take
            continue
        group, prod = [], 1
        while i < len(flat) and prod < s:
            group.append(flat[i][0])
            prod *= flat[i][1]
            i += 1
        if prod != s:
            raise Unsupported("reshape", "a reshape that splits a state axis")
        out.append(group[0] if len(group) == 1 else tuple(group))
    if any(size != 1 for _, size in flat[i:]):
        raise Unsupported("reshape", "a reshape that drops a state axis")
    return tuple(out)


def state_form(axes=LABELS) -> Form:
    return Form(tuple(axes), (Mono(1, (STATE,)),))


def is_bare_state(form: Form) -> bool:
    return len(form.terms) == 1 and form.terms[0] == Mono(1, (STATE,))


# ------------------------------------------------------------------------------------------ sizes
def shape_of(node) -> Optional[tuple]:
    """Concrete (hinted) shape of a node's tensor value, None for non-tensors."""
    val = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else node
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(_hint(s) for s in val.shape)


def dtype_of(node) -> Optional[torch.dtype]:
    val = node.meta.get("example_value", node.meta.get("val"))
    return val.dtype if isinstance(val, torch.Tensor) else None


def _hint(s):
    """A concrete value for a (possibly symbolic) int, float or bool."""
    if isinstance(s, (int, float, bool)):
        return s
    hint = s.node.hint if getattr(s.node, "hint", None) is not None else s.node.shape_env.size_hint(s.node.expr)
    if isinstance(s, torch.SymFloat):
        return float(hint)
    if isinstance(s, torch.SymBool):
        return bool(hint)
    return int(hint)


# --------------------------------------------------------------------------------- op vocabulary
def op_name(node: fx.Node) -> Optional[str]:
    """A spelling-independent name: ``torch.mul``, ``operator.mul`` and ``Tensor.mul`` are all "mul"."""
    if node.op == "call_method":
        return node.target
    if node.op != "call_function":
        return None
    t = node.target
    if t in _OPERATORS:
        return _OPERATORS[t]
    if getattr(t, "__module__", None) in ("torch", "torch.functional", "torch._C._nn", "torch.nn.functional"):
        return getattr(t, "__name__", None)
    return None


_OPERATORS = {operator.mul: "mul", operator.add: "add", operator.sub: "sub", operator.neg: "neg",
              operator.truediv: "div", operator.matmul: "matmul", operator.getitem: "getitem",
              operator.imul: "mul_", operator.iadd: "add_", operator.isub: "sub_", operator.itruediv: "div_"}
CASTS = {"to", "float", "double", "type_as", "contiguous", "clone", "type", "half", "bfloat16"}
VIEWS = {"getitem", "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as",
         "select", "narrow", "t", "flatten", "unflatten", "as_strided", "view_as", "reshape_as", "movedim",
         "swapaxes"}
ALIASING = VIEWS | (CASTS - {"clone"})  # results that may share the state's memory
METADATA = {"size", "dim", "stride", "numel", "data_ptr", "is_contiguous", "element_size", "get_device",
            "zeros_like", "ones_like", "empty_like", "new_zeros", "new_ones", "new_empty", "new_full"}
SHAPE_ONLY_ARGS = {"expand_as", "view_as", "type_as", "reshape_as"}  # their second argument gives a shape/dtype
OVERWRITE = {"copy_", "fill_", "zero_"}


def inplace_of(node: fx.Node) -> bool:
    """In-place tensor method (``x.mul_(y)``, ``x *= y``, ``x[i] = y``): its value is its first argument, mutated."""
    if node.op == "call_function" and node.target is operator.setitem:
        return isinstance(node.args[0], fx.Node)
    name = op_name(node)
    return bool(name) and name.endswith("_") and not name.startswith("_") and node.args and \
        isinstance(node.args[0], fx.Node)


# ------------------------------------------------------------------------------------- algebra
def mono_mul(a: Mono, b: Mono) -> Mono:
    m = Mono(a.sign * b.sign, a.factors + b.factors)
    if m.degree > 1:
        raise Unsupported("nonlinear", "a product of two state-dependent values")
    return m


def poly_mul(p: tuple, q: tuple) -> tuple:
    return tuple(mono_mul(a, b) for a in p for b in q)


def contract(terms: tuple, label: str) -> tuple:
    """Sum over ``label``: factors carrying it move inside a ``Contract``."""
    out = []
    for m in terms:
        inside = tuple(f for f in m.factors if label in f.free)
        outside = tuple(f for f in m.factors if label not in f.free)
        if not inside:
            raise Unsupported("broadcast_sum", f"sum over axis {label!r} of a term constant along it")
        out.append(Mono(m.sign, outside + (Contract(label, Mono(1, inside)),)))
    return tuple(out)


# --------------------------------------------------------------------------------- interpretation
class Interpreter:
    """Normal forms of the nodes that depend on one state atom.

    ``deps`` maps a node to its resolved argument nodes (NOTE [versions] in ``find_sites``);
    ``resolve(node, arg)`` gives the version of ``arg`` that ``node`` reads.
    """

    def __init__(self, sizes: dict, resolve):
        self.sizes = sizes          # label -> size
        self.resolve = resolve
        self.forms: dict = {}
        self.failures: dict = {}

    # -- entry
    def run(self, atom: fx.Node, atom_axes: tuple, order: list) -> None:
        self.forms[atom] = state_form(atom_axes)
        for n in order:
            if n is atom or n.op == "output" or not any(self._dependent(a) for a in self._node_args(n)):
                continue
            try:
                self.forms[n] = self.transfer(n)
            except Unsupported as e:
                self.failures[n] = e
            except Exception as e:  # noqa: BLE001  (an unforeseen spelling: record it, never crash the compile)
                self.failures[n] = Unsupported("internal", f"{type(e).__name__}: {e}")

    def _dependent(self, a) -> bool:
        return isinstance(a, fx.Node) and (a in self.forms or a in self.failures)

    def _node_args(self, n):
        flat = []
        fx.node.map_arg((n.args, n.kwargs), lambda a: flat.append(self.resolve(n, a)))
        if n.op == "call_method" and n.target in OVERWRITE and flat:
            flat = flat[1:]  # copy_/fill_ do not read the old value of their target
        if op_name(n) in METADATA:
            return []
        if op_name(n) in SHAPE_ONLY_ARGS:
            return flat[:1]
        return flat

    def arg(self, n: fx.Node, a):
        """Form of an argument, or the (resolved) independent node / constant."""
        if isinstance(a, fx.Node):
            r = self.resolve(n, a)
            if r in self.failures:
                raise self.failures[r]
            return self.forms.get(r, r)
        return a

    # -- transfer functions
    def transfer(self, n: fx.Node) -> Form:
        name = op_name(n)
        if name in METADATA:
            raise Unsupported("metadata", name)
        args = [self.arg(n, a) for a in (n.args[:1] if name in SHAPE_ONLY_ARGS else n.args)]
        kwargs = {k: self.arg(n, v) for k, v in n.kwargs.items()}
        if n.op == "call_method" and n.target in OVERWRITE:
            if n.target != "copy_":
                raise Unsupported("overwrite", f"{n.target} of the state")
            if n.args[0].op != "placeholder" and op_name(self.resolve(n, n.args[0])) in ALIASING:
                raise Unsupported("view_write", "in-place write through a view of the state")
            return self.align_to(args[1], shape_of(n))
        if inplace_of(n):
            target = self.resolve(n, n.args[0])
            if op_name(target) in ALIASING or op_name(n.args[0]) in ALIASING:
                raise Unsupported("view_write", "in-place write through a view or alias of the state")
            if name is None:
                raise Unsupported("unsupported_op", "item assignment into the state")
            name = name[:-1]
        if name in CASTS:
            return self.form_of(args[0], "cast")
        if name in ("mul", "add", "sub", "div"):
            return self.binary(n, name, args, kwargs)
        if name == "neg":
            f = self.form_of(args[0], name)
            return Form(f.axes, tuple(Mono(-m.sign, m.factors) for m in f.terms))
        if name == "sum":
            return self.reduce_sum(n, args, kwargs)
        if name == "einsum":
            return self.einsum(n, args)
        if name in ("matmul", "bmm", "__matmul__"):
            return self.matmul(n, args[0], args[1])
        if name in VIEWS:
            return self.view(n, name, args, kwargs)
        raise Unsupported("unsupported_op", f"{name or n.target} applied to the state")

    def form_of(self, x, what) -> Form:
        if not isinstance(x, Form):
            raise Unsupported("unsupported_op", f"{what} of a state-dependent value")
        return x

    def align_to(self, x, shape) -> Form:
        f = self.form_of(x, "copy")
        pad = len(shape) - len(f.axes)
        if pad < 0:
            raise Unsupported("shape", "copy into a smaller tensor")
        return Form((None,) * pad + f.axes, f.terms)

    # binary elementwise ops: broadcast letters by position
    def binary(self, n, name, args, kwargs):
        if kwargs.get("alpha", 1) != 1 or len(args) > 2:
            raise Unsupported("unsupported_op", f"{name} with alpha")
        a, b = args
        out = shape_of(n)
        letters = [f"d{i}" for i in range(len(out))]
        ops = [(x, _right_letters(x, letters, out)) for x in (a, b)]
        if name == "mul":
            return self.combine(ops, letters)
        if name in ("add", "sub"):
            return self.combine_sum(ops, letters, signs=(1, 1 if name == "add" else -1))
        if isinstance(b, Form):
            raise Unsupported("nonlinear", "division by a state-dependent value")
        return self.combine(ops, letters, invert=(False, True))

    def reduce_sum(self, n, args, kwargs):
        f = self.form_of(args[0], "sum")
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if dims is None:
            raise Unsupported("full_sum", "sum over every axis of the state")
        dims = [dims] if isinstance(dims, int) else list(dims)
        nd = len(f.axes)
        dims = sorted({d % nd for d in dims})
        terms = f.terms
        for d in dims:
            if isinstance(f.axes[d], tuple):
                raise Unsupported("merged_sum", "a sum over merged state axes")
            if f.axes[d] is not None:
                terms = contract(terms, f.axes[d])
        axes = tuple(None if i in dims else a for i, a in enumerate(f.axes)) if keep else \
            tuple(a for i, a in enumerate(f.axes) if i not in dims)
        return Form(axes, terms)

    def einsum(self, n, args):
        eq = args[0]
        ops = args[1:]
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = list(ops[0])
        eq = eq.replace(" ", "")
        lhs, _, out = eq.partition("->")
        ins = lhs.split(",")
        if not _:
            raise Unsupported("einsum", "implicit-output einsum")
        letters_in = []
        ell = None
        for spec, x in zip(ins, ops):
            nd = len(shape_of(x) if not isinstance(x, Form) else x.axes)
            if "..." in spec:
                k = nd - (len(spec) - 3)
                ell = [f"e{i}" for i in range(k)] if ell is None or len(ell) < k else ell
                pre, post = spec.split("...")
                letters_in.append(list(pre) + ell[len(ell) - k:] + list(post))
            else:
                letters_in.append(list(spec))
        out_letters = list(out.replace("...", "\0"))
        if "\0" in out_letters:
            i = out_letters.index("\0")
            out_letters[i:i + 1] = ell or []
        return self.combine(list(zip(ops, letters_in)), out_letters)

    def matmul(self, n, a, b):
        sa = a.axes if isinstance(a, Form) else shape_of(a)
        sb = b.axes if isinstance(b, Form) else shape_of(b)
        if len(sa) < 2 or len(sb) < 1:
            raise Unsupported("matmul", "matmul with a 1-D left operand")
        batch = max(len(sa), len(sb)) - 2
        bl = [f"m{i}" for i in range(batch)]
        la = bl[batch - (len(sa) - 2):] + ["mi", "mk"]
        if len(sb) == 1:
            lb, out = ["mk"], bl + ["mi"]
        else:
            lb, out = bl[batch - (len(sb) - 2):] + ["mk", "mj"], bl + ["mi", "mj"]
        return self.combine([(a, la), (b, lb)], out)

    def view(self, n, name, args, kwargs):
        f = self.form_of(args[0], name)
        out = shape_of(n)
        axes = list(f.axes)
        if name == "getitem":
            return Form(_index_axes(axes, args[1]), f.terms)
        if name in ("transpose", "swapaxes"):
            i, j = (d % len(axes) for d in args[1:3])
            axes[i], axes[j] = axes[j], axes[i]
            return Form(tuple(axes), f.terms)
        if name == "t":
            return Form(tuple(axes[::-1]), f.terms)
        if name in ("permute", "movedim"):
            if name == "movedim":
                raise Unsupported("unsupported_op", "movedim of the state")
            perm = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
            return Form(tuple(axes[p % len(axes)] for p in perm), f.terms)
        if name == "unsqueeze":
            d = args[1] % (len(axes) + 1)
            return Form(tuple(axes[:d] + [None] + axes[d:]), f.terms)
        if name in ("expand", "expand_as"):
            pad = len(out) - len(axes)
            new = [None] * pad + axes
            for i, (a, s) in enumerate(zip(new, out)):
                if a is None and s != 1:
                    raise Unsupported("expand", "expanding the state along a new axis")
            return Form(tuple(new), f.terms)
        # squeeze / view / reshape / flatten / unflatten: sizes decide which axes merge or split
        return Form(reshape_axes(axes, self.sizes, out), f.terms)

    # -- products and sums in letter space
    def _label_map(self, ops, out_letters):
        """Label of every letter: from state-dependent operands, then by size among unused labels."""
        lab, size = {}, {}
        for x, letters in ops:
            shp = x.axes if isinstance(x, Form) else (shape_of(x) if isinstance(x, fx.Node) else ())
            for i, l in enumerate(letters):
                if isinstance(x, Form):
                    a = x.axes[i]
                    if a is not None:
                        if lab.get(l, a) != a:
                            raise Unsupported("axes", f"axis {l} joins state axes {lab[l]} and {a}")
                        lab[l] = a
                        size[l] = axis_size(self.sizes, a)
                else:
                    size[l] = max(size.get(l, 1), shp[i])
        used = set(atoms(lab.values()))
        for l in list(dict.fromkeys(sum((list(ls) for _, ls in ops), []))):
            if l in lab or size.get(l, 1) == 1:
                continue
            cands = [a for a in LABELS if a not in used and self.sizes[a] == size[l]]
            if len(cands) != 1:
                raise Unsupported("axes", f"cannot tell which state axis a dim of size {size[l]} is "
                                  f"({'ambiguous' if cands else 'none fits'})")
            lab[l] = cands[0]
            used.add(cands[0])
        return lab

    def _poly(self, x, letters, lab, invert=False) -> tuple:
        if isinstance(x, Form):
            return x.terms
        if isinstance(x, fx.Node):
            shp = shape_of(x)
            labels = tuple(lab.get(l) if s != 1 else None for l, s in zip(letters, shp))
            p = factorize(x, labels, self.sizes)
        elif isinstance(x, (int, float)):
            p = (Mono(1, (Leaf(None, (), const=float(x)),)),)
        else:
            raise Unsupported("unsupported_op", f"operand {x!r}")
        return _invert(p) if invert else p

    def combine(self, ops, out_letters, invert=None) -> Form:
        lab = self._label_map(ops, out_letters)
        terms = (Mono(1, ()),)
        for i, (x, letters) in enumerate(ops):
            terms = poly_mul(terms, self._poly(x, letters, lab, invert=bool(invert and invert[i])))
        for l in dict.fromkeys(sum((list(ls) for _, ls in ops), [])):
            if l not in out_letters and lab.get(l) is not None:
                if isinstance(lab[l], tuple):
                    raise Unsupported("merged_sum", "a sum over merged state axes")
                terms = contract(terms, lab[l])
        axes = tuple(lab.get(l) for l in out_letters)
        if len(set(atoms(axes))) != len(atoms(axes)):
            raise Unsupported("axes", "a state axis appears twice in one value")
        return Form(axes, terms)

    def combine_sum(self, ops, out_letters, signs) -> Form:
        lab = self._label_map(ops, out_letters)
        terms = ()
        for (x, letters), s in zip(ops, signs):
            terms += tuple(Mono(s * m.sign, m.factors) for m in self._poly(x, letters, lab))
        return Form(tuple(lab.get(l) for l in out_letters), terms)


def _right_letters(x, letters, out_shape):
    """Broadcast letters of an operand aligned right against the output (size-1 dims get own letters)."""
    if isinstance(x, Form):
        nd = len(x.axes)
    elif isinstance(x, fx.Node):
        nd = len(shape_of(x))
    else:
        return []
    return letters[len(letters) - nd:] if nd else []


def _invert(p: tuple) -> tuple:
    if len(p) != 1:
        raise Unsupported("division", "division by a sum")
    m = p[0]
    fs = []
    for f in m.factors:
        if not isinstance(f, Leaf):
            raise Unsupported("nonlinear", "division by a state-dependent value")
        fs.append(dataclasses.replace(f, power=-f.power))
    return (Mono(m.sign, tuple(fs)),)


def _index_axes(axes, idx):
    """Axes after ``x[idx]`` when idx only holds ``None``, ``:`` and ``...``."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    for i in idx:
        if not (i is None or i is Ellipsis or (isinstance(i, slice) and i == slice(None))):
            raise Unsupported("indexing", f"indexing the state with {i!r}")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    out, src = [], 0
    for i in idx:
        if i is None:
            out.append(None)
        elif i is Ellipsis:
            k = len(axes) - n_real
            out.extend(axes[src:src + k])
            src += k
        else:
            out.append(axes[src])
            src += 1
    return tuple(out + list(axes[src:]))


# ----------------------------------------------------------------------- S-independent factors
def factorize(node: fx.Node, labels: tuple, sizes: dict, depth: int = 0) -> tuple:
    """Polynomial of an S-independent value whose dims carry ``labels``: products, broadcasts, views
    and casts are looked through, so ``k[..., None] * v[..., None, :]`` becomes two leaves."""
    if len(set(atoms(labels))) != len(atoms(labels)):
        raise Unsupported("axes", "a value spans one state axis twice")
    leaf = (Mono(1, (Leaf(node, labels, flat=constant_along(node, labels, sizes)),)),)
    if depth > 32 or not isinstance(node, fx.Node):
        return leaf
    name = op_name(node)
    args = node.args
    try:
        if name in CASTS and isinstance(args[0], fx.Node):
            return factorize(args[0], labels, sizes, depth + 1)
        if name == "neg":
            return tuple(Mono(-m.sign, m.factors) for m in factorize(args[0], labels, sizes, depth + 1))
        if name in ("mul", "div") and len(args) == 2 and not node.kwargs:
            out = (Mono(1, ()),)
            for i, x in enumerate(args):
                p = _sub_factor(x, labels, sizes, depth)
                out = poly_mul(out, _invert(p) if (name == "div" and i == 1) else p)
            return out
        if name == "einsum":
            return _factorize_einsum(node, labels, sizes, depth)
        if name in ("matmul", "bmm", "__matmul__") and len(args) == 2:
            return _factorize_outer_matmul(node, labels, sizes, depth)
        if name in VIEWS and isinstance(args[0], fx.Node):
            src = _view_source_labels(node, name, labels, sizes)
            if src is not None:
                return factorize(args[0], src, sizes, depth + 1)
    except Unsupported:
        return leaf
    return leaf


ELEMENTWISE = {"exp", "softplus", "sigmoid", "clamp", "clip", "neg", "mul", "add", "sub", "div", "log", "silu",
               "sqrt", "rsqrt", "pow", "tanh", "abs", "reciprocal", "exp2", "log1p", "expm1", "square", "relu",
               "logsigmoid"} | CASTS


def constant_along(node, labels, sizes, depth: int = 0) -> frozenset:
    """State labels of ``labels`` along which ``node``'s value cannot vary (NOTE [flat axes])."""
    mine = frozenset(atoms(labels))
    if not mine or depth > 24 or not isinstance(node, fx.Node):
        return mine if not isinstance(node, fx.Node) else frozenset()
    name = op_name(node)
    shp = shape_of(node)
    if shp is None:
        return frozenset()
    if name in ELEMENTWISE:
        out = mine
        for a in list(node.args) + list(node.kwargs.values()):
            if isinstance(a, fx.Node) and shape_of(a) is not None:
                sub = _broadcast_labels(labels, shape_of(a))
                out &= constant_along(a, sub, sizes, depth + 1) | (mine - frozenset(atoms(sub)))
        return out
    if name in VIEWS and node.args and isinstance(node.args[0], fx.Node):
        src = _view_source_labels(node, name, labels, sizes)
        if src is not None:
            return constant_along(node.args[0], src, sizes, depth + 1) | (mine - frozenset(atoms(src)))
    return frozenset()


def _broadcast_labels(labels, shape) -> tuple:
    sub = labels[len(labels) - len(shape):] if shape else ()
    return tuple(l if s != 1 else None for l, s in zip(sub, shape))


def _factorize_einsum(node, labels, sizes, depth):
    """An einsum without contraction (``bhk,bhv->bhkv``) is the product of its operands."""
    eq, ops = node.args[0].replace(" ", ""), list(node.args[1:])
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    lhs, arrow, out = eq.partition("->")
    if not arrow or "." in eq or set(lhs.replace(",", "")) - set(out):
        raise Unsupported("factor", "einsum with a contraction")
    lab = dict(zip(out, labels))
    poly = (Mono(1, ()),)
    for spec, x in zip(lhs.split(","), ops):
        shp = shape_of(x)
        poly = poly_mul(poly, factorize(x, tuple(lab[c] if s != 1 else None for c, s in zip(spec, shp)),
                                        sizes, depth + 1))
    return poly


def _factorize_outer_matmul(node, labels, sizes, depth):
    """``a [.., n, 1] @ b [.., 1, p]`` is the product of ``a`` and ``b``."""
    a, b = node.args
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None or len(sa) < 2 or len(sb) < 2 or sa[-1] != 1 or sb[-2] != 1:
        raise Unsupported("factor", "matmul with a contraction")
    batch = labels[:-2]
    la = tuple(l if s != 1 else None for l, s in zip(batch[len(batch) - (len(sa) - 2):] + (labels[-2], None), sa))
    lb = tuple(l if s != 1 else None for l, s in zip(batch[len(batch) - (len(sb) - 2):] + (None, labels[-1]), sb))
    return poly_mul(factorize(a, la, sizes, depth + 1), factorize(b, lb, sizes, depth + 1))


def _sub_factor(x, labels, sizes, depth):
    if isinstance(x, (int, float)):
        return (Mono(1, (Leaf(None, (), const=float(x)),)),)
    if not isinstance(x, fx.Node) or shape_of(x) is None:
        raise Unsupported("factor", "non-tensor operand")
    shp = shape_of(x)
    sub = labels[len(labels) - len(shp):] if shp else ()
    sub = tuple(l if s != 1 else None for l, s in zip(sub, shp))
    return factorize(x, sub, sizes, depth + 1)


def _view_source_labels(node, name, labels, sizes) -> Optional[tuple]:
    """Labels of a view's input given the view's labels (None when the view is not a relabelling)."""
    src = node.args[0]
    shp = shape_of(src)
    if shp is None:
        return None
    args = node.args
    if name == "getitem":
        idx = args[1] if isinstance(args[1], tuple) else (args[1],)
        if not all(i is None or i is Ellipsis or (isinstance(i, slice) and i == slice(None)) for i in idx):
            return None
        # run the index forward on placeholder names, then read labels back
        names = tuple(f"s{i}" for i in range(len(shp)))
        fwd = _index_axes(list(names), idx)
        back = dict(zip(fwd, labels))
        return tuple(back.get(nm) if s != 1 else None for nm, s in zip(names, shp))
    if name in ("transpose", "swapaxes"):
        i, j = (d % len(shp) for d in args[1:3])
        out = list(labels)
        out[i], out[j] = out[j], out[i]
        return tuple(out)
    if name == "permute":
        perm = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        out = [None] * len(perm)
        for o, p in enumerate(perm):
            out[p % len(perm)] = labels[o]
        return tuple(out)
    if name == "unsqueeze":
        d = args[1] % len(labels)
        return tuple(labels[:d] + labels[d + 1:])
    if name in ("expand", "expand_as"):
        pad = len(labels) - len(shp)
        return tuple(l if s != 1 else None for l, s in zip(labels[pad:], shp))
    if name in ("squeeze", "view", "reshape", "flatten", "unflatten", "view_as", "reshape_as"):
        try:
            return reshape_axes(labels, sizes, shp)
        except Unsupported:
            return None
    return None


# ------------------------------------------------------------------------------ value equality
def same_value(a, b, depth: int = 0) -> bool:
    """Structural equality of two graph values (same op on equal arguments, or the same node)."""
    if a is b:
        return True
    if isinstance(a, fx.Node) and isinstance(b, fx.Node):
        if depth > 16 or a.op != b.op or a.target != b.target or a.op in ("placeholder", "get_attr"):
            return False
        return same_value(a.args, b.args, depth + 1) and same_value(a.kwargs, b.kwargs, depth + 1)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y, depth) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k], depth) for k in a)
    return type(a) is type(b) and a == b


def same_leaf(a: Leaf, b: Leaf) -> bool:
    if a.node is None or b.node is None:
        return a.node is b.node and a.const == b.const and a.power == b.power
    return a.power == b.power and a.labels == b.labels and same_value(a.node, b.node)


def match_multiset(sub: list, full: list) -> Optional[list]:
    """``full`` minus ``sub`` (leaf equality), or None when ``sub`` is not contained in ``full``."""
    rest = list(full)
    for x in sub:
        for i, y in enumerate(rest):
            if same_leaf(x, y):
                del rest[i]
                break
        else:
            return None
    return rest


def exp_argument(node) -> Optional[fx.Node]:
    """``x`` when ``node`` is ``exp(x)`` (any spelling), else None."""
    if isinstance(node, fx.Node) and op_name(node) == "exp" and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def describe(form: Form) -> str:
    """Short text of a form, for logs and reasons."""
    def f(x):
        if x is STATE:
            return "S"
        if isinstance(x, Contract):
            return f"sum_{x.label}({m(x.mono)})"
        base = x.node.name if x.node is not None else repr(x.const)
        return f"{base}[{''.join(map(_ax, x.labels))}]" + ("^-1" if x.power < 0 else "")

    def m(mono):
        return ("-" if mono.sign < 0 else "") + "*".join(f(x) for x in mono.factors)
    return f"[{''.join(map(_ax, form.axes))}] " + " + ".join(m(t) for t in form.terms)


def _ax(a) -> str:
    return "1" if a is None else f"({''.join(a)})" if isinstance(a, tuple) else a

