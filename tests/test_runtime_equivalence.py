"""Replay form == standard recurrence: every family x layout x {plain, pool} x L, across many flushes."""
import pytest
import torch

import replay_compile as rc
from replay_compile.families.base import Canonical
from replay_compile.testing import StandardPool, random_canonical, rel_rms, token

FAMILIES = [f.name for f in rc.families()]
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
# B rows, Hv value heads, Hk key heads, K, V: odd on purpose
SHAPE = dict(heads=4, head_k=5, head_v=3, k_heads=2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("window", [1, 3, 8, 16])
def test_step_matches_standard(family, layout, window):
    fam = rc.get_family(family)
    g = torch.Generator().manual_seed(hash((family, layout, window)) % 2**31)
    steps = 2 * window + 7  # many flushes for small L, at least two for L = 16
    for dtype in (torch.float64, torch.float32):
        for pool in (False, True):
            n_slots = 6 if pool else 3
            x, state = random_canonical(fam, n_slots, **SHAPE, tokens=steps, dtype=dtype, generator=g, layout=layout)
            oracle = StandardPool(state, fam, layout)
            rs = rc.ReplayState(state, fam, window, layout=layout, k_heads=SHAPE["k_heads"])
            for t in range(steps):
                if pool:  # 4 rows (one padding) over a shuffled subset of the 6 slots
                    slots = torch.cat([torch.randperm(n_slots, generator=g)[:3], torch.tensor([-1])])
                    slots = slots[torch.randperm(4, generator=g)]
                    xt = token(x, t, slots.clamp(min=0))
                else:
                    slots, xt = None, token(x, t)
                o = rs.step(*xt, slots=slots)
                o_ref = oracle.step(xt, slots)
                assert rel_rms(o, o_ref) <= TOL[dtype], (dtype, pool, t)
                if pool:
                    assert (o[slots < 0] == 0).all()
            assert int(rs.flushes.sum()) > 0 or window > steps
            rs.materialize()
            assert (rs.count == 0).all()
            assert rel_rms(rs.state, oracle.state) <= TOL[dtype], (dtype, pool)


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_commit_matches_accepted_tokens(family):
    """verify T drafts + commit(n random in 0..T) == standard decoding of only the accepted tokens."""
    fam = rc.get_family(family)
    g = torch.Generator().manual_seed(7 + FAMILIES.index(family))
    for layout, window, T in (("kv", 4, 2), ("vk", 8, 3), ("kv", 5, 5), ("vk", 16, 4)):
        x, state = random_canonical(fam, 5, **SHAPE, tokens=8 * T, dtype=torch.float64, generator=g, layout=layout)
        oracle = StandardPool(state, fam, layout)
        rs = rc.ReplayState(state, fam, window, layout=layout, k_heads=SHAPE["k_heads"])
        slots = torch.tensor([4, -1, 0, 2])
        for it in range(8):
            xt = Canonical(*(None if f is None else f[slots.clamp(min=0), it * T:(it + 1) * T] for f in x))
            o = rs.verify(*xt, slots=slots)
            o_ref = oracle.verify(xt, slots)
            assert rel_rms(o, o_ref) <= 1e-12, (layout, window, T, it)
            n = torch.randint(0, T + 1, (4,), generator=g)
            rs.commit(n)
            oracle.commit(n)
            if it % 3 == 2:  # single steps between drafts, at whatever phase the commits left
                xs = token(x, it, slots.clamp(min=0))
                assert rel_rms(rs.step(*xs, slots=slots), oracle.step(xs, slots)) <= 1e-12
        rs.materialize()
        assert rel_rms(rs.state, oracle.state) <= 1e-12
