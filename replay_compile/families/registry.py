"""The family registry: ``register_family`` validates a family numerically before accepting it.

Built-in families register themselves through the same public call (one file each), so a user's
family is held to exactly the checks ours pass.
"""
from __future__ import annotations

import torch

from .base import LAYOUTS, RecurrenceFamily, standard_step

_FAMILIES: dict[str, RecurrenceFamily] = {}


class FamilyError(ValueError):
    """A family was refused at registration, or an unknown family was asked for."""


def register_family(family: RecurrenceFamily, *, replace: bool = False) -> RecurrenceFamily:
    """Register ``family`` after checking that its native step equals the canonical math.

    The check draws random native inputs (``family.make_inputs``) in float64, runs
    ``family.native_step`` and ``to_canonical -> standard_step -> finish`` for both state layouts,
    and refuses the family (``FamilyError``, with the measured mismatch) if they differ.
    """
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
