"""Isolation, poisoning and bad input: reset, padding rows, NaN confinement, clear errors, untouched state."""
import pytest
import torch

import replay_compile as rc
from replay_compile.families.base import Canonical
from replay_compile.runtime import ReplayError
from replay_compile.testing import StandardPool, random_canonical, rel_rms, token

SHAPE = dict(heads=4, head_k=5, head_v=3, k_heads=2)


def _snapshot(rs):
    bufs = {"state": rs.state, "count": rs.count, "flushes": rs.flushes, "nonfinite": rs.nonfinite,
            **{f"ring.{k}": v for k, v in rs.ring.items()}, **{f"read.{k}": v for k, v in (rs.read or {}).items()}}
    return {k: v.clone() for k, v in bufs.items()}


def _same(a, b):
    return all(torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.float8_e4m3fn else a[k],
                           b[k].view(torch.uint8) if b[k].dtype == torch.float8_e4m3fn else b[k]) or
               (a[k].isnan() == b[k].isnan()).all() and torch.equal(a[k].nan_to_num(), b[k].nan_to_num())
               for k in a)


@pytest.mark.parametrize("family", ["mamba2", "gated_deltanet", "kda"])
def test_reset_isolates_slot_and_padding_touches_nothing(family):
    fam = rc.get_family(family)
    g = torch.Generator().manual_seed(3)
    x, state = random_canonical(fam, 4, **SHAPE, tokens=30, generator=g)
    rs = rc.ReplayState(state, fam, 4, k_heads=2)
    oracle = StandardPool(state, fam, "kv")
    slots = torch.tensor([0, 1, 2, 3])
    for t in range(11):
        rs.step(*token(x, t, slots.clamp(min=0)), slots=slots)
        oracle.step(token(x, t, slots.clamp(min=0)), slots)
    before = _snapshot(rs)
    # a call made only of padding rows changes nothing at all
    pad = torch.tensor([-1, -1])
    assert (rs.step(*token(x, 11, pad.clamp(min=0)), slots=pad) == 0).all()
    assert _same(before, _snapshot(rs))
    rs.reset([2])
    oracle.reset([2])
    assert (rs.state[2] == 0).all() and int(rs.count[2]) == 0
    for t in range(11, 30):  # slot 2 restarts from zero, the others carry on untouched
        o = rs.step(*token(x, t, slots.clamp(min=0)), slots=slots)
        assert rel_rms(o, oracle.step(token(x, t, slots.clamp(min=0)), slots)) <= 1e-12
    rs.materialize()
    assert rel_rms(rs.state, oracle.state) <= 1e-12


@pytest.mark.parametrize("family", ["mamba2", "gla", "deltanet", "kda"])
@pytest.mark.parametrize("read_dtype", [None, "fp8"])
def test_nan_in_one_row_stays_in_its_slot(family, read_dtype):
    fam = rc.get_family(family)
    g = torch.Generator().manual_seed(5)
    x, state = random_canonical(fam, 5, **SHAPE, tokens=20, dtype=torch.float32, generator=g)
    rs = rc.ReplayState(state, fam, 3, k_heads=2, read_dtype=read_dtype)
    slots = torch.tensor([4, 1, -1, 0])
    x = Canonical(*(None if f is None else f.clone() for f in x))
    x.v[1, 6] = float("nan")  # row 1 (slot 1) gets a NaN at step 6
    x.k[1, 9] = float("inf")
    for t in range(20):
        o = rs.step(*token(x, t, slots.clamp(min=0)), slots=slots)
        assert torch.isfinite(o[[0, 2, 3]]).all(), t
    rs.materialize()
    assert rs.nonfinite.tolist() == [False, True, False, False, False]
    assert torch.isfinite(rs.state[[0, 2, 3, 4]]).all()
    rs.reset([1])
    assert torch.isfinite(rs.state).all() and not rs.nonfinite.any()


def _bad_calls(rs, x):
    q, k, v, la, beta = x
    return {
        "q shape": lambda: rs.step(q[:, :1], k, v, la, beta),
        "v heads": lambda: rs.step(q, k, v[:, :1], la, beta),
        "missing decay": lambda: rs.step(q, k, v, None, beta),
        "int dtype": lambda: rs.step(q, k.long(), v, la, beta),
        "batch vs slots": lambda: rs.step(q[:2], k[:2], v[:2], la[:2], beta[:2]),
        "unknown slot": lambda: rs.step(q, k, v, la, beta, slots=torch.tensor([0, 1, 7])),
        "slot below -1": lambda: rs.step(q, k, v, la, beta, slots=torch.tensor([0, -2, 1])),
        "duplicate slot": lambda: rs.step(q, k, v, la, beta, slots=torch.tensor([0, 1, 1])),
        "float slots": lambda: rs.step(q, k, v, la, beta, slots=torch.tensor([0.0, 1.0, 2.0])),
        "T > L": lambda: rs.verify(*(f[:, None].expand(-1, 5, *f.shape[1:]) for f in x)),
        "commit without verify": lambda: rs.commit(1),
        "device": lambda: rs.step(q.to("meta"), k, v, la, beta),
    }


def test_bad_input_raises_and_leaves_state_untouched():
    fam = rc.get_family("gated_deltanet")
    g = torch.Generator().manual_seed(11)
    x, state = random_canonical(fam, 3, **SHAPE, tokens=4, generator=g)
    rs = rc.ReplayState(state, fam, 4, k_heads=2, read_dtype="fp4")
    for t in range(2):
        rs.step(*token(x, t))
    xt = token(x, 2)
    before = _snapshot(rs)
    for name, call in _bad_calls(rs, xt).items():
        with pytest.raises(ReplayError):
            call()
        assert _same(before, _snapshot(rs)), name
    # commit > T and commit after a finished commit
    rs.verify(*(f[:, None].expand(-1, 2, *f.shape[1:]) for f in xt))
    mid = _snapshot(rs)
    for n in (3, -1, torch.tensor([0, 1]), torch.tensor([0.5, 1.0, 1.0])):
        with pytest.raises(ReplayError):
            rs.commit(n)
        assert _same(mid, _snapshot(rs))
    with pytest.raises(ReplayError, match="between verify and commit"):
        rs.step(*xt)
    rs.commit(torch.tensor([0, 2, 1]))
    assert rs.count.tolist() == [2, 4, 3]


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window"), (dict(window=2.0), "window"), (dict(layout="kvk"), "layout"),
    (dict(k_heads=3), "multiple"), (dict(read_dtype="int3"), "read copy"),
    (dict(stochastic_rounding=True), "bf16 or fp16"), (dict(family="mamba3"), "unknown recurrence family"),
])
def test_bad_construction(kwargs, match):
    args = dict(state=torch.zeros(2, 4, 5, 3), family="gla", window=4) | kwargs
    with pytest.raises(ValueError, match=match):
        rc.ReplayState(**args)
    with pytest.raises(ReplayError, match="4-D"):
        rc.ReplayState(torch.zeros(4, 5, 3), "gla", 4)


def test_memory_report_counts_every_buffer():
    rs = rc.ReplayState(torch.zeros(8, 4, 16, 32), "gated_deltanet", 16, k_heads=2, read_dtype="fp8")
    rep = rs.memory_report()
    assert rep["checkpoint"] == 8 * 4 * 16 * 32 * 4
    assert rep["read_copy"] == 8 * 4 * 16 * 32 + 8 * 4 * 32 * 4  # fp8 values + one fp32 scale per value column
    ring = 8 * 16 * (2 * 16 + 4 * 32 + 4) * 4 + 8 * 16 * (4 * 32 + 4) * 4  # k, u, log_a + raw v, beta
    assert rep["ring"] == ring
    assert rep["total"] == sum(rep[k] for k in ("checkpoint", "read_copy", "ring", "cursors"))
    assert rep["per_slot"] == rep["total"] / 8
