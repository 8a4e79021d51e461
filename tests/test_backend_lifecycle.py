"""The backend's runtime contract: 16-bit checkpoints, registry lifetime, grouped heads, speculative T = 1.

Every check compares with eager PyTorch or with a directly driven :class:`ReplayState` (the oracle for
semantics that eager does not have, e.g. a 16-bit checkpoint), on fresh random inputs, across flushes.
"""
import gc
import weakref

import pytest
import torch

import replay_compile
from replay_compile import ReplayError, ReplayState
from replay_compile.ops import registry
from replay_compile.testing import rel_rms

FAST = dict(inductor=False)
B, H, HK, K, V = 3, 4, 2, 5, 3


@pytest.fixture(autouse=True)
def _fresh(fresh_compiler):
    yield


def inplace_step(S, q, k, v, g):
    """Simple GLA, state ``[B, H, K, V]`` written in place, read after the update."""
    S.mul_(torch.exp(g)[..., None, None]).add_(torch.einsum("bhk,bhv->bhkv", k, v))
    return torch.einsum("bhkv,bhk->bhv", S, q)


def draw(gen, heads=H, dtype=torch.float32):
    return (torch.randn(B, heads, K, generator=gen, dtype=dtype), torch.randn(B, heads, K, generator=gen, dtype=dtype),
            torch.randn(B, H, V, generator=gen, dtype=dtype), -torch.rand(B, H, generator=gen, dtype=dtype) * 0.3)


# ------------------------------------------------------------------------------ checkpoint_dtype
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_checkpoint_dtype_keeps_a_16bit_checkpoint_of_an_fp32_state(dtype, stochastic):
    """The op's runtime equals a ReplayState on a 16-bit state; materialize widens into the user's tensor."""
    gen = torch.Generator().manual_seed(1)
    S = torch.randn(B, H, K, V, generator=gen)
    oracle = ReplayState(S.to(getattr(torch, dtype)), "simple_gla", 4, kernels="torch",
                         stochastic_rounding=stochastic)
    opts = dict(FAST, window=4, checkpoint_dtype=dtype, stochastic_rounding=stochastic)
    step = torch.compile(inplace_step, backend="replayssm", options=opts)
    eager = S.clone()
    for _ in range(14):
        q, k, v, g = draw(gen)
        o = step(S, q, k, v, g)
        assert rel_rms(o, oracle.step(q, k, v, g)) <= 1e-6
        assert rel_rms(o, inplace_step(eager, q, k, v, g)) <= 3e-2
    (rs,) = registry.managed_states()
    assert rs.state.dtype == getattr(torch, dtype) and rs.user_state is S and S.dtype == torch.float32
    assert bool((rs.flushes > 0).all())
    replay_compile.materialize(S)
    assert torch.equal(S, oracle.materialize().float())
    report = replay_compile.explain(inplace_step, S.clone(), *draw(gen), options=opts)
    assert report.sites[0].checkpoint_dtype == dtype and f"checkpoint {dtype}" in str(report)


def test_checkpoint_dtype_other_graphs_see_the_widened_state_and_writes_reach_the_checkpoint():
    gen = torch.Generator().manual_seed(2)
    S = torch.randn(B, H, K, V, generator=gen)
    oracle = ReplayState(S.bfloat16(), "simple_gla", 3, kernels="torch")
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=3, checkpoint_dtype="bf16"))
    peek = torch.compile(lambda s: s * 2.0, backend="replayssm", options=FAST)
    halve = torch.compile(lambda s: s.mul_(0.5), backend="replayssm", options=FAST)
    for t in range(10):
        x = draw(gen)
        assert rel_rms(step(S, *x), oracle.step(*x)) <= 1e-6
        if t % 3 == 1:
            assert torch.equal(peek(S), oracle.materialize().float() * 2.0)
        if t % 4 == 2:
            halve(S)
            oracle.materialize().mul_(0.5)
            oracle.reload()


@pytest.mark.parametrize("state_dtype,option", [(torch.bfloat16, "float16"), (torch.float64, "bfloat16")])
def test_checkpoint_dtype_that_cannot_be_honoured_is_rejected(state_dtype, option):
    gen = torch.Generator().manual_seed(3)
    S = torch.randn(B, H, K, V, generator=gen, dtype=state_dtype)
    eager = S.clone()
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, checkpoint_dtype=option))
    for _ in range(3):
        x = draw(gen, dtype=state_dtype)
        assert rel_rms(step(S, *x), inplace_step(eager, *x)) <= 1e-6
    assert replay_compile.counters["reject:checkpoint_dtype"] == 1
    report = replay_compile.explain(inplace_step, S, *x, options=dict(checkpoint_dtype=option))
    assert "applies to float32 states" in report.rejected[0].reason
    with pytest.raises(ReplayError, match="checkpoint_dtype"):
        ReplayState(S, "simple_gla", 4, checkpoint_dtype=getattr(torch, option))


def test_checkpoint_dtype_matching_a_16bit_state_uses_the_state_itself():
    S = torch.randn(B, H, K, V).bfloat16()
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=2, checkpoint_dtype="bf16"))
    step(S, *draw(torch.Generator().manual_seed(4), dtype=torch.bfloat16))
    (rs,) = registry.managed_states()
    assert rs.state is S


# ------------------------------------------------------------------------------ registry lifetime
def _run_and_forget(step, S, steps=6):
    gen = torch.Generator().manual_seed(5)
    for _ in range(steps):
        step(S, *draw(gen))
    (rs,) = registry.managed_states()
    return weakref.ref(rs), weakref.ref(rs.ring["u"])


def test_registry_entry_dies_with_its_state_tensor():
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=4))
    S = torch.randn(B, H, K, V)
    rs_ref, ring_ref = _run_and_forget(step, S)
    del S
    gc.collect()
    assert registry.managed_states() == []
    assert rs_ref() is None and ring_ref() is None, "the runtime's buffers outlived the state"


def test_registry_entry_of_a_module_buffer_dies_with_the_module():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("state", torch.randn(B, H, K, V))

        def forward(self, q, k, v, g):
            return inplace_step(self.state, q, k, v, g)

    layer = Layer()
    step = torch.compile(layer, backend="replayssm", options=dict(FAST, window=4))
    gen = torch.Generator().manual_seed(6)
    for _ in range(6):
        step(*draw(gen))
    rs_ref = weakref.ref(registry.managed_states()[0])
    del layer, step
    torch._dynamo.reset()
    gc.collect()
    assert registry.managed_states() == [] and rs_ref() is None


def test_entry_lives_while_an_alias_holds_the_memory():
    """The storage, not the tensor object, keys the lifetime: a view keeps the ring (and its records)."""
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=4))
    gen = torch.Generator().manual_seed(7)
    S = torch.randn(B, H, K, V, generator=gen)
    eager = S.clone()
    for _ in range(6):  # 6 = one flush + 2 pending records
        x = draw(gen)
        step(S, *x)
        inplace_step(eager, *x)
    flat = S.view(-1)
    del S
    gc.collect()
    (rs,) = registry.managed_states()
    rs.materialize()  # the user's tensor object is gone: the runtime rebuilds a view of the storage
    assert rel_rms(flat.view(B, H, K, V), eager) <= 1e-5
    S = flat.view(B, H, K, V)  # a new tensor object on the same memory finds the same runtime
    assert registry.find(S) is rs
    del S, rs, flat
    gc.collect()
    assert registry.managed_states() == []


def test_a_state_whose_memory_was_swapped_gets_a_fresh_runtime():
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=4))
    gen = torch.Generator().manual_seed(8)
    S = torch.randn(B, H, K, V, generator=gen)
    for _ in range(3):
        step(S, *draw(gen))
    fresh = torch.randn(B, H, K, V, generator=gen)
    S.set_(fresh.clone())  # the old memory dies with its records: the user replaced the state
    eager = fresh.clone()
    for _ in range(6):
        x = draw(gen)
        assert rel_rms(step(S, *x), inplace_step(eager, *x)) <= 1e-5
    gc.collect()
    assert len(registry.managed_states()) == 1


def test_an_entry_whose_memory_is_not_the_callers_is_never_handed_out():
    """The guard behind the finalizers: an entry at the caller's address whose storage is another one
    (what a delayed finalizer would leave for a new tensor at a reused address) is dropped, and the
    caller gets a fresh runtime (the old ring's pending records must not reach its outputs)."""
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=4))
    gen = torch.Generator().manual_seed(11)
    S = torch.randn(B, H, K, V, generator=gen)
    for _ in range(3):
        step(S, *draw(gen))
    (stale,) = registry.managed_states()
    stale._user._storage = lambda: None  # as if S's memory had died and been reallocated to this tensor
    S.normal_(generator=gen)
    assert registry.find(S) is None
    eager = S.clone()
    for _ in range(6):
        x = draw(gen)
        assert rel_rms(step(S, *x), inplace_step(eager, *x)) <= 1e-5
    (rs,) = registry.managed_states()
    assert rs is not stale and rs.user_state is S


def test_weak_state_runtime_reports_a_freed_state():
    rs = ReplayState(torch.zeros(2, 2, 3, 3), "simple_gla", 4, weak_state=True)
    gc.collect()
    with pytest.raises(ReplayError, match="freed"):
        rs.materialize()


# ---------------------------------------------------------------------------------- grouped heads
def _expand(x, heads):
    b, hk, d = x.shape
    return x[:, :, None, :].expand(b, hk, heads // hk, d).reshape(b, heads, d)


def grouped_expand(S, q, k, v, g):
    q, k = _expand(q, S.shape[1]), _expand(k, S.shape[1])
    return inplace_step(S, q, k, v, g)


def grouped_flatten(S, q, k, v, g):
    heads = S.shape[1]
    q = q.unsqueeze(2).expand(-1, -1, heads // q.shape[1], -1).flatten(1, 2)
    k = k[..., None, :].expand(-1, -1, heads // k.shape[1], -1).flatten(1, 2)
    return inplace_step(S, q, k, v, g)


def grouped_repeat_interleave(S, q, k, v, g):
    rep = S.shape[1] // q.shape[1]
    return inplace_step(S, q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, 1), v, g)


def grouped_transformers_mamba2_style(S, q, k, v, g):
    """Groups as transformers' Mamba-2 spells them: reshape, expand, contiguous, reshape with a size-1
    axis; the read is a ``bmm`` on ``[B * H]``-merged views."""
    b, heads = S.shape[:2]
    groups, rep = k.shape[1], heads // k.shape[1]
    kh = k.reshape(b, groups, 1, K).expand(b, groups, rep, K).contiguous().reshape(b, heads, 1, K)
    qh = q.reshape(b, groups, 1, K).expand(b, groups, rep, K).contiguous().reshape(b, heads, K)
    S.mul_(torch.exp(g)[..., None, None]).add_(kh.transpose(-1, -2) * v[:, :, None, :])
    out = torch.bmm(S.view(b * heads, K, V).transpose(1, 2), qh.view(b * heads, K, 1))
    return out.view(b, heads, V)


def tiled_heads(S, q, k, v, g):  # head h reads key head h % Hk: not the grouped layout, kept per value head
    rep = S.shape[1] // q.shape[1]
    return inplace_step(S, q.repeat(1, rep, 1), k.repeat(1, rep, 1), v, g)


@pytest.mark.parametrize("fn,k_heads", [(grouped_expand, HK), (grouped_flatten, HK), (grouped_repeat_interleave, HK),
                                        (grouped_transformers_mamba2_style, HK), (tiled_heads, H)])
def test_grouped_heads_keep_one_ring_key_per_key_head(fn, k_heads):
    gen = torch.Generator().manual_seed(9)
    S = torch.randn(B, H, K, V, generator=gen)
    eager = S.clone()
    step = torch.compile(fn, backend="replayssm", options=dict(FAST, window=4))
    for _ in range(10):
        x = draw(gen, heads=HK)
        assert rel_rms(step(S, *x), fn(eager, *x)) <= 1e-5
    (rs,) = registry.managed_states()
    assert rs.num_k_heads == k_heads and rs.ring["k"].shape[2] == k_heads
    replay_compile.materialize(S)
    assert rel_rms(S, eager) <= 1e-5
    report = replay_compile.explain(fn, S.clone(), *draw(gen, heads=HK), options=FAST)
    assert report.sites[0].k_heads == k_heads


# ------------------------------------------------------------------------- speculative, T = 1
def test_speculative_one_token_calls_are_tentative_until_commit():
    """A spec-decoding loop verifying one token per call: each call needs a commit, rejected ones vanish."""
    gen = torch.Generator().manual_seed(10)
    S = torch.randn(B, H, K, V, generator=gen)
    ref = S.clone()
    step = torch.compile(inplace_step, backend="replayssm", options=dict(FAST, window=4, speculative=True))
    for _ in range(12):
        x = draw(gen)
        o = step(S, *x)
        trial = ref.clone()
        assert rel_rms(o, inplace_step(trial, *x)) <= 1e-5
        keep = torch.randint(0, 2, (B,), generator=gen)
        replay_compile.commit(S, keep)
        ref = torch.where(keep.bool()[:, None, None, None], trial, ref)
    replay_compile.materialize(S)
    assert rel_rms(S, ref) <= 1e-5
    step(S, *draw(gen))
    with pytest.raises(ReplayError, match="commit"):
        step(S, *draw(gen))
