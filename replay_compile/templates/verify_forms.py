"""Verify forms: which template runs a verify of ``T`` draft tokens, as a short string.

Used by ``ReplayState(verify_form=...)``, ``replayssm bench spec --verify-form`` and ``benchmarks/tune_replay.py
--verify-form``. This module imports no triton, so a form is checked when a state is built, on any machine::

    auto               NOTE [default verify] (templates/verify.py): the chunked verify where its table lists a
                       tiling for the call, else the replay template's token loop
    tokens             the replay template's token loop
    chunked[:k=v,...]  the chunked verify, with templates.verify.tiling's keywords as
                       bv block_v, kc key_chunk, nw num_warps, st stages, dot, mr max_registers, bt token_tile
                       (e.g. ``chunked:dot=bf16x3,nw=1,kc=16,bt=8``)

A ``chunked`` form serves the verifies the chunked template supports (``verify.supports``); other calls (steps,
commits, read copies, float64) keep the token loop.
"""
from __future__ import annotations

from typing import Optional

# the chunked verify's product forms (NOTE [verify product precision] in verify.py)
DOTS = ("tf32x3", "tf32", "ieee", "split", "bf16x3", "bf16x2", "bf16")
_KEYS = {"bv": ("block_v", int), "kc": ("key_chunk", int), "nw": ("num_warps", int), "st": ("stages", int),
         "dot": ("dot", str), "mr": ("max_registers", int), "bt": ("token_tile", int)}


def parse(form: str) -> tuple[str, Optional[dict]]:
    """``(kind, tiling)`` of a form: ``("auto", None)``, ``("tokens", None)`` or ``("chunked", {keyword: value})``.

    Raises:
        ValueError: an unknown kind, key or product form, or a value of the wrong type.
    """
    if not isinstance(form, str):
        raise ValueError(f"a verify form is a string, got {type(form).__name__}")
    kind, _, opts = form.partition(":")
    if kind in ("auto", "tokens") and not opts:
        return kind, None
    if kind != "chunked":
        raise ValueError(f"unknown verify form {form!r}: 'auto', 'tokens' or 'chunked[:k=v,...]' "
                         f"with keys {sorted(_KEYS)}")
    tiling = {}
    for item in filter(None, opts.split(",")):
        key, _, val = item.partition("=")
        if key not in _KEYS:
            raise ValueError(f"unknown key {key!r} in verify form {form!r}; keys: {sorted(_KEYS)}")
        name, conv = _KEYS[key]
        try:
            tiling[name] = conv(val)
        except ValueError:
            raise ValueError(f"{key}={val!r} in verify form {form!r} is not a {conv.__name__}") from None
    if tiling.get("dot", DOTS[0]) not in DOTS:
        raise ValueError(f"dot={tiling['dot']!r} in verify form {form!r}; product forms: {DOTS}")
    return kind, tiling
