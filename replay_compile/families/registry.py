"""The family registry: ``register_family`` validates a family numerically before accepting it.

Built-in families register themselves through the same public call (one file each), so a user's
family is held to exactly the checks ours pass. A family is given either as a
:class:`RecurrenceFamily` or as a plain-torch reference step function plus role names::

    register_family("my_gdn", my_step, roles={"state": "h", "q": "q", "k": "k", "v": "v",
                                                "log_a": "g", "beta": "b"}, layout="kv")

# NOTE [step-function families]
The template (decay kind x delta rule) of a step function is found by measurement, not declared:
the function is run in float64 on random canonical inputs for each template its roles allow (no
decay role: "none"; a decay role: "scalar", then "channel"; a ``beta`` role: delta rule) and the
first template whose canonical math it reproduces is taken. None reproduced: the registration is
refused with each template's measured error. Roles: ``state``, ``q``, ``k``, ``v`` (required),
``log_a`` (log-decay) or ``decay`` (decay factor, > 0), ``beta``. The function returns
``(o [B, Hv, V], new_state)`` and takes q/k with Hv heads (grouped heads are expanded before it).
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional, Union

import torch

from . import _inputs
from .base import LAYOUTS, Canonical, RecurrenceFamily, standard_step

ROLES = ("state", "q", "k", "v", "log_a", "decay", "beta")

_FAMILIES: dict[str, RecurrenceFamily] = {}


class FamilyError(ValueError):
    """A family was refused at registration, or an unknown family was asked for."""


def register_family(family: Union[RecurrenceFamily, str], step: Optional[Callable] = None, *,
                    roles: Optional[dict] = None, layout: str = "kv", aliases: tuple = (),
                    description: str = "", replace: bool = False) -> RecurrenceFamily:
    """Register ``family`` after checking that its native step equals the canonical math.

    ``family`` is a :class:`RecurrenceFamily`, or a name with a reference ``step`` function and its
    ``roles`` (NOTE [step-function families]; ``layout`` is the state layout ``step`` uses).
    The check draws random native inputs (``family.make_inputs``) in float64, runs
    ``family.native_step`` and ``to_canonical -> standard_step -> finish`` for both state layouts,
    and refuses the family (``FamilyError``, with the measured mismatch) if they differ.
    """
    if not isinstance(family, RecurrenceFamily):
        family = family_from_step(family, step, roles=roles, layout=layout, aliases=aliases,
                                  description=description)
    elif step is not None or roles is not None:
        raise FamilyError("pass either a RecurrenceFamily or a name with a step function and roles, not both")
    names = (family.name, *family.aliases)
    taken = [n for n in names if n in _FAMILIES and _FAMILIES[n].name != family.name]
    if taken or (family.name in _FAMILIES and not replace):
        raise FamilyError(f"family name(s) {taken or [family.name]} already registered (pass replace=True to override)")
    _check_native_matches_canonical(family)
    for n in names:
        _FAMILIES[n] = family
    return family


def get_family(name: str) -> RecurrenceFamily:
    """The registered family called ``name`` (or one of its aliases)."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise FamilyError(f"unknown recurrence family {name!r}; registered: {sorted(set(f.name for f in _FAMILIES.values()))}") from None


def families() -> list[RecurrenceFamily]:
    """All registered families, each once, in registration order."""
    seen = {}
    for f in _FAMILIES.values():
        seen.setdefault(f.name, f)
    return list(seen.values())


def _check_native_matches_canonical(family: RecurrenceFamily, tol: float = 1e-10) -> None:
    g = torch.Generator().manual_seed(0)
    for layout in LAYOUTS:
        native, state = family.make_inputs(batch=3, heads=4, head_k=5, head_v=3, k_heads=2,
                                           dtype=torch.float64, generator=g, layout=layout)
        y_ref, s_ref = family.native_step(state.clone(), layout=layout, **native)
        o, s_new = standard_step(state.clone(), family.to_canonical(**native), delta=family.delta, layout=layout)
        y = family.finish(o, **native)
        for what, a, b in (("output", y, y_ref), ("state", s_new, s_ref)):
            if a.shape != b.shape:
                raise FamilyError(f"family {family.name!r} ({layout}): {what} shape {tuple(a.shape)} from the "
                                  f"{family.template} template, {tuple(b.shape)} from the native step")
            err = (a - b).norm() / b.norm().clamp_min(1e-300)
            if not err <= tol:
                raise FamilyError(f"family {family.name!r} ({layout}): the native step does not match the "
                                  f"{family.template!r} template (rel. {what} error {float(err):.2e} > {tol:g}); "
                                  "check decay kind, delta flag and to_canonical")


# ------------------------------------------------------------------------ step-function families
def family_from_step(name: str, step: Callable, *, roles: dict, layout: str = "kv", aliases: tuple = (),
                     description: str = "") -> RecurrenceFamily:
    """A :class:`RecurrenceFamily` for a reference step function (NOTE [step-function families])."""
    if not isinstance(name, str) or not callable(step):
        raise FamilyError("register_family(name, step, roles=...) needs a name and a step function")
    roles = dict(roles or {})
    unknown = sorted(set(roles) - set(ROLES))
    missing = [r for r in ("state", "q", "k", "v") if r not in roles]
    if unknown or missing or ("log_a" in roles and "decay" in roles):
        raise FamilyError(f"family {name!r}: roles must name 'state', 'q', 'k', 'v' and optionally one of "
                          f"'log_a'/'decay' and 'beta' (unknown {unknown}, missing {missing})")
    if layout not in LAYOUTS:
        raise FamilyError(f"family {name!r}: layout must be one of {LAYOUTS}, got {layout!r}")
    params = inspect.signature(step).parameters
    absent = [a for a in roles.values() if a not in params]
    if absent:
        raise FamilyError(f"family {name!r}: the step function has no argument(s) {absent}")
    delta = "beta" in roles
    kinds = ("none",) if not ({"log_a", "decay"} & set(roles)) else ("scalar", "channel")
    errors = []
    for decay in kinds:
        fam = _step_family(name, step, roles, layout, decay, delta, aliases, description)
        try:
            _check_native_matches_canonical(fam)
            return fam
        except Exception as e:  # noqa: BLE001  (any failure of this template is a measurement)
            errors.append(f"{fam.template}: {e}")
    raise FamilyError(f"family {name!r} maps onto no kernel template (decay none/scalar/channel x delta rule "
                      f"{'on' if delta else 'off'}): " + "; ".join(errors))


def _step_family(name, step, roles, fn_layout, decay, delta, aliases, description) -> RecurrenceFamily:
    arg = dict(roles)

    def to_canonical(**native):
        log_a = None
        if "log_a" in arg:
            log_a = native[arg["log_a"]]
        elif "decay" in arg:
            log_a = torch.log(native[arg["decay"]])
        return Canonical(native[arg["q"]], native[arg["k"]], native[arg["v"]], log_a,
                         native[arg["beta"]] if delta else None)

    def native_step(state, layout="kv", **native):
        # the same [K, V] view, stored the way the step function expects (and back)
        own = state if layout == fn_layout else state.transpose(-1, -2)
        o, new = step(**{arg["state"]: own}, **native)
        return o, new if layout == fn_layout else new.transpose(-1, -2)

    def make_inputs(batch, heads, head_k, head_v, k_heads=None, dtype=torch.float32, generator=None,
                    layout="kv", tokens=None, long_memory=False):
        shp = lambda *rest: _inputs.token_shape(batch, tokens, *rest)  # noqa: E731
        native = {arg["q"]: _inputs.draw(shp(heads, head_k), dtype, generator),
                  arg["k"]: _inputs.draw(shp(heads, head_k), dtype, generator),
                  arg["v"]: _inputs.draw(shp(heads, head_v), dtype, generator)}
        if decay != "none":
            g = _inputs.log_decay(shp(heads) if decay == "scalar" else shp(heads, head_k), dtype, generator,
                                  long_memory)
            native[arg.get("log_a") or arg["decay"]] = g if "log_a" in arg else g.exp()
        if delta:
            native[arg["beta"]] = _inputs.uniform(shp(heads), dtype, generator, 0.05, 0.95)
        return native, _inputs.state(batch, heads, head_k, head_v, dtype, generator, layout)

    return RecurrenceFamily(name=name, decay=decay, delta=delta, to_canonical=to_canonical,
                            finish=lambda o, **_: o, native_step=native_step, make_inputs=make_inputs,
                            aliases=tuple(aliases), description=description or f"user family {name}")
