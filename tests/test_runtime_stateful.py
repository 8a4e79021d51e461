"""Random operation sequences (hypothesis stateful testing): replay and standard decoding stay equal."""
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import replay_compile as rc
from replay_compile.testing import StandardPool, random_canonical, rel_rms, token

N_SLOTS, SHAPE = 4, dict(heads=2, head_k=3, head_v=5, k_heads=1)


class ReplayVsStandard(RuleBasedStateMachine):
    @initialize(family=st.sampled_from([f.name for f in rc.families()]), layout=st.sampled_from(["kv", "vk"]),
                window=st.integers(1, 6), read=st.sampled_from([None, None, "bf16"]), seed=st.integers(0, 2**20))
    def setup(self, family, layout, window, read, seed):
        self.fam, self.layout, self.window = rc.get_family(family), layout, window
        self.g = torch.Generator().manual_seed(seed)
        _, state = random_canonical(self.fam, N_SLOTS, **SHAPE, tokens=1, generator=self.g, layout=layout)
        self.rs = rc.ReplayState(state, self.fam, window, layout=layout, k_heads=1, read_dtype=read)
        self.oracle = StandardPool(state, self.fam, layout)
        # a bf16 read copy is approximate: compare loosely, the exact checkpoint tightly
        self.tol = 1e-12 if read is None else 2e-2
        self.pending = None

    def _inputs(self, slots, T):
        x, _ = random_canonical(self.fam, len(slots), **SHAPE, tokens=T, generator=self.g, layout=self.layout)
        return x, torch.tensor(slots)

    @precondition(lambda self: self.pending is None)
    @rule(slots=st.permutations(list(range(N_SLOTS)) + [-1, -1]).map(lambda p: p[:3]))
    def step(self, slots):
        x, s = self._inputs(slots, 1)
        x1 = token(x, 0)
        assert rel_rms(self.rs.step(*x1, slots=s), self.oracle.step(x1, s)) <= self.tol

    @precondition(lambda self: self.pending is None)
    @rule(slots=st.permutations(list(range(N_SLOTS)) + [-1]).map(lambda p: p[:3]), data=st.data())
    def verify(self, slots, data):
        T = data.draw(st.integers(1, self.window))
        x, s = self._inputs(slots, T)
        assert rel_rms(self.rs.verify(*x, slots=s), self.oracle.verify(x, s)) <= self.tol
        self.pending = (len(slots), T)

    @precondition(lambda self: self.pending is not None)
    @rule(data=st.data())
    def commit(self, data):
        B, T = self.pending
        n = torch.tensor(data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
        self.rs.commit(n)
        self.oracle.commit(n)
        self.pending = None

    @precondition(lambda self: self.pending is None)
    @rule(slot=st.integers(0, N_SLOTS - 1))
    def reset(self, slot):
        self.rs.reset([slot])
        self.oracle.reset([slot])

    @precondition(lambda self: self.pending is None)
    @rule()
    def materialize(self):
        self.rs.materialize()
        assert rel_rms(self.rs.state, self.oracle.state) <= 1e-12

    @invariant()
    def cursors_in_range(self):
        if hasattr(self, "rs"):
            assert ((self.rs.count >= 0) & (self.rs.count <= self.window)).all()


ReplayVsStandard.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_replay_vs_standard = ReplayVsStandard.TestCase
