"""Options of the ``replayssm`` backend: one frozen, validated record per compile.

``torch.compile(fn, backend="replayssm", options={...})`` hands the user's dict to the backend;
:meth:`ReplayOptions.from_dict` turns it into a :class:`ReplayOptions` or raises ``ValueError``
naming the option and the values it accepts. A typo must fail loudly: a silently ignored
``"windw": 8`` would compile with the default window and nobody would notice.

:meth:`ReplayOptions.key` is a stable string of every option, for the pass's cache key (Inductor's
FX graph cache keys custom passes by ``uuid()``; options left out of it would let a stale
artifact compiled under other options run).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch

from .runtime.quant import READ_DTYPES
from .templates import verify_forms

CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")
KERNELS = ("auto", "torch", "triton")

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    """Validated backend options (see the field comments; defaults are the agreed API's).

    Build with :meth:`from_dict`; direct construction validates too.
    """

    window: int = 16                        # L: records kept between checkpoint writes, >= 1
    # checkpoint storage of float32 states: "float32" (the user's tensor) | "bfloat16" | "float16" (the
    # runtime keeps its own 16-bit checkpoint; materialize writes the user's tensor; other dtypes: rejected)
    checkpoint_dtype: str = "float32"
    read_dtype: Optional[str] = None        # low-precision read copy: None | "bf16" | "fp16" | "fp8" | "fp4"
    stochastic_rounding: bool = False       # stochastic rounding on 16-bit checkpoint writes
    families: Optional[tuple] = None        # None = all registered; else canonical family names, sorted
    min_batch: Optional[int] = None         # replay only at batch >= min_batch; None = cost model
    strict: bool = False                    # raise instead of falling back when a site is rejected
    inductor: bool = True                   # compile the rest of the graph with Inductor (honours mode=)
    fuel: Optional[int] = None              # rewrite at most this many sites (bisecting); None = no limit
    speculative: bool = False               # every call (T >= 1 tokens) appends tentatively: replay_compile.commit
    validate: bool = True                   # numeric check of every rewrite before accepting it
    kernels: str = "auto"                   # "auto" | "torch" (reference ops) | "triton"
    # the Triton path's verify template: "auto" (NOTE [default verify]) | "tokens" | "chunked[:k=v,...]"
    verify_form: str = "auto"
    # Inductor mode for the rest of the graph, as torch.compile's mode= (which torch.compile refuses
    # together with options=, so CUDA graphs plus other options need this): None | "reduce-overhead" | ...
    mode: Optional[str] = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            normalized = _VALIDATORS[f.name](f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, normalized)
        if self.mode not in (None, "default") and not self.inductor:
            raise ValueError(f"option 'mode'={self.mode!r} needs inductor=True (the mode is Inductor's)")
        if self.stochastic_rounding and self.checkpoint_dtype == "float32":
            raise ValueError("option 'stochastic_rounding' needs a 16-bit checkpoint_dtype "
                             "('bfloat16' or 'float16'); the float32 checkpoint is written exactly")

    @classmethod
    def from_dict(cls, options: Optional[Mapping[str, Any]] = None) -> "ReplayOptions":
        """Validated options from the user's dict (``None`` or ``{}``: the defaults).

        Raises:
            ValueError: an unknown key (the message lists the known ones) or a bad value (the
                message names the option and the allowed values).
        """
        if options is None:
            return cls()
        if isinstance(options, ReplayOptions):
            return options
        if not isinstance(options, Mapping):
            raise ValueError(f"replayssm options must be a dict, got {type(options).__name__}")
        unknown = sorted(str(k) for k in options if k not in _VALIDATORS)
        if unknown:
            raise ValueError(f"unknown replayssm option(s) {unknown}; known options: {sorted(_VALIDATORS)}")
        return cls(**options)

    @classmethod
    def defaults(cls) -> "ReplayOptions":
        return cls()

    def replace(self, **changes) -> "ReplayOptions":
        """A copy with ``changes`` applied (validated like :meth:`from_dict`)."""
        return ReplayOptions.from_dict({**self.as_dict(), **changes})

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def key(self) -> str:
        """Stable text of every option, in field order, e.g. ``"window=16;checkpoint_dtype=float32;..."``."""
        return ";".join(f"{name}={_key_text(value)}" for name, value in self.as_dict().items())

    @property
    def checkpoint_torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.checkpoint_dtype)

    def family_enabled(self, name: str) -> bool:
        """Whether the registered family ``name`` (or an alias) may be rewritten under these options."""
        return self.families is None or _canonical_family_name("families", name) in self.families


def _key_text(value) -> str:
    return ",".join(value) if isinstance(value, tuple) else repr(value) if isinstance(value, str) else str(value)


def _allowed(name: str, value, allowed: str) -> ValueError:
    return ValueError(f"option {name!r} must be {allowed}, got {value!r} ({type(value).__name__})")


def _bool(name, value):
    if not isinstance(value, bool):
        raise _allowed(name, value, "True or False")
    return value


def _int_at_least(minimum: int, optional: bool):
    def check(name, value):
        if value is None and optional:
            return None
        # bool is an int subclass: window=True is a typo, not a window of 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _allowed(name, value, f"an int >= {minimum}" + (" or None" if optional else ""))
        return int(value)
    return check


def _one_of(choices: tuple, optional: bool = False, aliases: Optional[dict] = None):
    def check(name, value):
        if isinstance(value, (str, torch.dtype)):
            value = (aliases or {}).get(value, value)
        if value is None and optional:
            return None
        if value not in choices:
            raise _allowed(name, value, "one of " + ", ".join(map(repr, choices)) + (" or None" if optional else ""))
        return value
    return check


def _inductor_mode(name, value):
    from torch._inductor import list_mode_options  # noqa: PLC0415  (Inductor loads only when asked)
    modes = tuple(list_mode_options())
    if value is not None and value not in modes:
        raise _allowed(name, value, "None or one of " + ", ".join(map(repr, modes)))
    return value


def _canonical_family_name(name, family) -> str:
    from .families import FamilyError, get_family
    if not isinstance(family, str):
        raise _allowed(name, family, "None or a list of registered family names")
    try:
        return get_family(family).name
    except FamilyError as e:
        raise ValueError(f"option {name!r}: {e}") from None


def _families(name, value):
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise _allowed(name, value, "None or a list of registered family names")
    if not value:
        raise ValueError(f"option {name!r} is empty: no family could be rewritten (use None for all families)")
    return tuple(sorted({_canonical_family_name(name, f) for f in value}))


def _verify_form(name, value):
    try:
        verify_forms.parse(value)
    except ValueError as e:
        raise ValueError(f"option {name!r}: {e}") from None
    return value


_VALIDATORS = {
    "window": _int_at_least(1, optional=False),
    "checkpoint_dtype": _one_of(CHECKPOINT_DTYPES, aliases=_DTYPE_NAMES),
    "read_dtype": _one_of(READ_DTYPES, optional=True, aliases={"none": None}),
    "stochastic_rounding": _bool,
    "families": _families,
    "min_batch": _int_at_least(1, optional=True),
    "strict": _bool,
    "inductor": _bool,
    "fuel": _int_at_least(0, optional=True),
    "speculative": _bool,
    "validate": _bool,
    "kernels": _one_of(KERNELS),
    "verify_form": _verify_form,
    "mode": _inductor_mode,
}
