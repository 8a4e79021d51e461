"""Families as data: native spellings equal the canonical math; registration refuses what does not fit."""
import dataclasses

import pytest
import torch

import replay_compile as rc
from replay_compile.families import FamilyError, register_family
from replay_compile.families.base import Canonical, standard_scan, standard_step
from replay_compile.testing import rel_rms, token


@pytest.mark.parametrize("family", [f.name for f in rc.families()])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_native_step_equals_canonical_and_scan_equals_steps(family, layout):
    fam = rc.get_family(family)
    g = torch.Generator().manual_seed(1)
    native, state = fam.make_inputs(3, 6, 7, 5, 3, dtype=torch.float64, generator=g, layout=layout, tokens=4)
    x = fam.to_canonical(**native)
    o_scan, s_scan = standard_scan(state, x, delta=fam.delta, layout=layout)
    S = state
    for t in range(4):
        nat_t = {k: (v[:, t] if v.dim() > 1 else v) for k, v in native.items()}
        y_native, S_native = fam.native_step(S, layout=layout, **nat_t)
        o, S = standard_step(S, token(x, t), delta=fam.delta, layout=layout)
        assert rel_rms(fam.finish(o, **nat_t), y_native) <= 1e-13
        assert rel_rms(S, S_native) <= 1e-13
        assert rel_rms(o_scan[:, t], o) <= 1e-13
    assert rel_rms(s_scan, S) <= 1e-13


def test_mamba2_front_end():
    fam = rc.get_family("mamba2")
    g = torch.Generator().manual_seed(2)
    native, _ = fam.make_inputs(2, 4, 8, 3, 2, dtype=torch.float64, generator=g)
    x = fam.to_canonical(**native)
    dt = torch.nn.functional.softplus(native["dt"] + native["dt_bias"])
    assert torch.allclose(x.log_a, dt * native["A"]) and (x.log_a < 0).all()
    assert torch.equal(x.k, native["B"]) and torch.equal(x.q, native["C"])
    o = torch.randn(2, 4, 3, dtype=torch.float64)
    y = fam.finish(o, **native)
    expect = (o + native["D"][:, None] * native["x"]) * torch.nn.functional.silu(native["z"])
    assert torch.allclose(y, expect)


def test_registration_refuses_a_family_whose_step_does_not_fit():
    gla = rc.get_family("gla")
    # a native step that decays per *value* channel: no template computes that
    def wrong_step(state, layout="kv", **native):
        x = gla.to_canonical(**native)
        o, s = standard_step(state, Canonical(x.q, x.k, x.v, None, None), delta=False, layout=layout)
        return o, s * 0.5
    with pytest.raises(FamilyError, match="does not match"):
        register_family(dataclasses.replace(gla, name="wrong_gla", aliases=(), native_step=wrong_step))
    with pytest.raises(FamilyError, match="already registered"):
        register_family(gla)
    with pytest.raises(FamilyError, match="unknown recurrence family"):
        rc.get_family("mamba3")
    assert "wrong_gla" not in [f.name for f in rc.families()]


def test_grouped_heads_use_consecutive_groups():
    S = torch.zeros(1, 4, 2, 1, dtype=torch.float64)
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)  # 2 key heads
    v = torch.ones(1, 4, 1, dtype=torch.float64)
    _, S = standard_step(S, Canonical(k, k, v), delta=False)
    assert S[0, :, :, 0].tolist() == [[1, 0], [1, 0], [0, 1], [0, 1]]  # heads 0,1 -> group 0; 2,3 -> group 1


def test_family_gives_step_scan_and_replay_form():
    fam = rc.get_family("kda")
    g = torch.Generator().manual_seed(4)
    native, state = fam.make_inputs(2, 2, 3, 4, 2, dtype=torch.float64, generator=g, tokens=5)
    x = fam.to_canonical(**native)
    o_scan, s_scan = fam.scan(state, x)
    rs = fam.replay(state.clone(), 2)
    for t in range(5):
        assert rel_rms(rs.step(*token(x, t)), o_scan[:, t]) <= 1e-12
    assert rel_rms(rs.materialize(), s_scan) <= 1e-12
    assert rel_rms(fam.step(state, token(x, 0))[0], o_scan[:, 0]) <= 1e-13
