"""The replayssm backend on the GPU: the toy hybrid LM compiled end to end, Triton kernels, CUDA graphs.

Each test decodes a compiled model and an eager twin (same weights) on the same teacher-forced random
tokens, and compares the logits at every step and the materialized recurrent states every
``CHECK_EVERY`` steps (fp32: rel-RMS <= 1e-5), over >= 300 steps (many flushes at L = 8 or 16),
through a recompile on a new batch size, a compiled prefill (a multi-token op) and a graph that
writes the states without being rewritten (a chunked prefill left to the exact-state guard).

Budget: under 2 minutes on one H200, almost all of it compiling (Inductor for the decode graphs;
``inductor=False`` where the graph's lowering is not what is tested). ``min_batch=1`` keeps the cost model
from giving these small batches the standard route (NOTE [cost model]): the replay form is what is tested.
The helpers take a ``device``: ``PYTHONPATH=. python3 tests/test_backend_gpu.py cpu [steps]`` runs the
same checks on the CPU (reference ops instead of Triton, no CUDA graphs).
"""
from __future__ import annotations

import copy
import gc
import sys
import weakref

import pytest
import torch

import replay_compile
from replay_compile.ops import registry, scoped_registry
from replay_compile.testing import StateLayer, rel_rms
from replay_compile.toy.hybrid_lm import HybridLM

TOL = 1e-5
VOCAB = 97
LAYERS = "mgak"          # Mamba-2, Gated DeltaNet, attention, KDA
RECURRENT = 3
MAX_LEN = 400
CHECK_EVERY = 50


@pytest.fixture(autouse=True)
def _fresh(fresh_compiler):
    yield


# ----------------------------------------------------------------------------------- helpers
def twins(batch: int, device: str, seed: int = 0):
    """``(eager, compiled)`` copies of one random toy LM, caches allocated for ``batch`` rows."""
    torch.manual_seed(seed)
    eager = HybridLM(vocab=VOCAB, layers=LAYERS, max_len=MAX_LEN).to(device, torch.float32).eval()
    comp = copy.deepcopy(eager)
    eager.allocate(batch)
    comp.allocate(batch)
    return eager, comp


def states(model: HybridLM) -> dict:
    return {name: buf for name, buf in model.named_buffers() if name.startswith("state")}


def tokens(gen: torch.Generator, batch: int, T: int, device: str) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, T), generator=gen).to(device)


def call(fn, toks: torch.Tensor, cudagraphs: bool) -> torch.Tensor:
    """One compiled call; under CUDA graphs the output is copied out before the next replay reuses it."""
    if cudagraphs:
        torch.compiler.cudagraph_mark_step_begin()
    return fn(toks).clone()


def check_states(eager: HybridLM, comp: HybridLM, what: str) -> None:
    replay_compile.materialize(comp)
    want, got = states(eager), states(comp)
    assert want.keys() == got.keys()
    for name in want:
        err = rel_rms(got[name], want[name])
        assert err <= TOL, f"{what}: state {name} rel-RMS {err:.2e}"


def decode(eager: HybridLM, comp: HybridLM, step_fn, steps: int, gen, *, cudagraphs: bool, what: str) -> float:
    """Teacher-forced decode of both twins; returns the worst per-step logits rel-RMS (asserted <= TOL)."""
    batch, device = eager.lengths.shape[0], eager.lengths.device
    worst = 0.0
    with torch.no_grad():
        for t in range(steps):
            toks = tokens(gen, batch, 1, device)
            want = eager(toks)
            got = call(step_fn, toks, cudagraphs)
            err = rel_rms(got, want)
            assert err <= TOL, f"{what}: logits rel-RMS {err:.2e} at step {t}"
            worst = max(worst, err)
            eager.advance(1)
            comp.advance(1)
            if (t + 1) % CHECK_EVERY == 0 or t == steps - 1:
                check_states(eager, comp, f"{what}, step {t}")
    return worst


def prefill_eager(eager: HybridLM, comp: HybridLM, gen, T: int) -> None:
    """Both twins prefilled eagerly (the compiled twin's states are exact before the first compiled call)."""
    toks = tokens(gen, eager.lengths.shape[0], T, eager.lengths.device)
    with torch.no_grad():
        eager(toks)
        comp(toks)
    eager.advance(T)
    comp.advance(T)


def assert_every_recurrent_layer_rewritten() -> None:
    """Each recurrent family rewritten; only the attention KV caches (4-D, written) left alone."""
    c = replay_compile.counters
    assert all(c[f"rewrite:{f}"] >= 1 for f in ("mamba2", "gated_deltanet", "kda")), dict(c)
    assert c["sites_rejected"] == c["reject:unsupported_op"], dict(c)


def compiled(model: HybridLM, mode):
    """``mode`` as the backend option (torch.compile's own ``mode=`` refuses ``options=``; the spellings'
    GPU tests cover that spelling)."""
    return torch.compile(model, backend="replayssm", options={"window": 8, "mode": mode, "min_batch": 1})


def decode_and_recompile(device: str, mode=None, steps: int = 300) -> None:
    """>= 300 decode steps, then new caches of another batch size (a recompile) and more steps."""
    cudagraphs = mode == "reduce-overhead"
    gen = torch.Generator().manual_seed(1)
    eager, comp = twins(9, device)
    step = compiled(comp, mode)
    prefill_eager(eager, comp, gen, 5)
    decode(eager, comp, step, steps, gen, cudagraphs=cudagraphs, what=f"mode={mode}, batch 9")
    assert_every_recurrent_layer_rewritten()
    for model in (eager, comp):
        model.allocate(12)
    prefill_eager(eager, comp, gen, 3)
    decode(eager, comp, step, 40, gen, cudagraphs=cudagraphs, what=f"mode={mode}, batch 12 (recompiled)")
    assert replay_compile.counters["sites_rewritten"] >= 2 * RECURRENT, dict(replay_compile.counters)


def prefill_and_chunked_writer(device: str, steps: int = 300) -> None:
    """A compiled prefill (T tokens: one multi-token op per layer) and, mid-decode, a chunked prefill
    that the backend leaves alone (``fuel=0``): it must see exact states and its writes must reach
    the replay runtime (NOTE [exact state for other graphs] in ``backend``)."""
    gen = torch.Generator().manual_seed(2)
    eager, comp = twins(10, device)
    opts = {"window": 8, "inductor": False, "min_batch": 1}
    step = torch.compile(comp, backend="replayssm", options=opts)
    chunked = torch.compile(comp, backend="replayssm", options={**opts, "fuel": 0})
    toks = tokens(gen, 10, 6, device)
    with torch.no_grad():
        want, got = eager(toks), step(toks)
    assert rel_rms(got, want) <= TOL, "compiled prefill logits"
    eager.advance(6)
    comp.advance(6)
    check_states(eager, comp, "after the compiled prefill")
    assert_every_recurrent_layer_rewritten()
    for part in range(3):
        decode(eager, comp, step, steps // 3, gen, cudagraphs=False, what=f"decode part {part}")
        toks = tokens(gen, 10, 4, device)
        with torch.no_grad():
            want, got = eager(toks), chunked(toks)
        assert rel_rms(got, want) <= TOL, f"chunked prefill {part} logits"
        eager.advance(4)
        comp.advance(4)
    check_states(eager, comp, "end")
    assert replay_compile.counters["reject:fuel"] >= RECURRENT, dict(replay_compile.counters)


# -------------------------------------------------------------------------------------- tests
@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_toy_lm_decode_recompile_matches_eager(mode):
    """Triton kernels, Inductor for the rest; CUDA graphs for reduce-overhead."""
    decode_and_recompile("cuda", mode)


@pytest.mark.gpu
def test_gpu_toy_lm_prefill_and_unrewritten_chunked_writer():
    prefill_and_chunked_writer("cuda")


def small_inputs(gen, device, B=9, H=4, K=16, V=8):
    return tuple(x.to(device) for x in (torch.randn(B, H, K, generator=gen), torch.randn(B, H, K, generator=gen),
                                        torch.randn(B, H, V, generator=gen), -torch.rand(B, H, generator=gen) * 0.3))


@pytest.mark.gpu
@pytest.mark.parametrize("stochastic", [False, True])
def test_gpu_checkpoint_dtype_bf16_through_the_triton_kernels(stochastic):
    """The op's own bf16 checkpoint (Triton kernels) equals a ReplayState on a bf16 state (Triton too)."""
    gen = torch.Generator().manual_seed(3)
    S = torch.randn(9, 4, 16, 8, generator=gen).cuda()
    oracle = replay_compile.ReplayState(S.bfloat16(), "simple_gla", 4, kernels="triton", stochastic_rounding=stochastic)
    layer = StateLayer(S.clone())
    step = torch.compile(layer, backend="replayssm", options={"window": 4, "checkpoint_dtype": "bfloat16",
                                                              "stochastic_rounding": stochastic, "inductor": False,
                                                              "min_batch": 1})
    for t in range(40):
        x = small_inputs(gen, "cuda")
        err = rel_rms(step(*x), oracle.step(*x))
        assert err <= TOL, f"step {t}: {err:.2e}"
    replay_compile.materialize(layer)
    assert torch.equal(layer.state, oracle.materialize().float())


@pytest.mark.gpu
def test_gpu_runtime_of_a_captured_state_is_parked_not_freed():
    """Under CUDA graphs a dead state's ring stays allocated (captured graphs point at it) until drop_parked."""
    gen = torch.Generator().manual_seed(4)
    layer = StateLayer(torch.randn(9, 4, 16, 8, generator=gen).cuda())
    eager = StateLayer(layer.state.clone())
    step = torch.compile(layer, backend="replayssm", options={"mode": "reduce-overhead", "min_batch": 1})
    for t in range(40):
        x = small_inputs(gen, "cuda")
        torch.compiler.cudagraph_mark_step_begin()
        err = rel_rms(step(*x).clone(), eager(*x))
        assert err <= TOL, f"step {t}: {err:.2e}"
    (rs,) = registry.managed_states()
    assert registry._lookup(layer.state).captured, "the step was not captured: the test checks nothing"
    ring = weakref.ref(rs.ring["u"])
    del rs, layer, step
    torch._dynamo.reset()
    gc.collect()
    assert registry.managed_states() == [], "the state outlived its module and compiled graphs"
    assert ring() is not None, "a captured runtime was freed: replaying its graph would read freed memory"
    assert registry.drop_parked() >= 1  # earlier tests may have parked runtimes too
    gc.collect()
    assert ring() is None


if __name__ == "__main__":  # the same checks on another device, e.g. `python3 tests/test_backend_gpu.py cpu`
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    with scoped_registry():
        decode_and_recompile(dev, None, steps=n)
        torch._dynamo.reset()
        prefill_and_chunked_writer(dev, steps=n)
    print("OK")
