"""The spelling corpus (tests/compiler/spellings.py) against the families' math and the compiler.

Two halves:
1. Eager: every spelling equals the canonical float64 recurrence (``to_canonical -> standard_step
   -> finish``), reads its state in its output, and stays bounded over long runs. These prove the
   corpus itself, independently of the backend.
2. Compiled with ``backend="replayssm"``: outputs equal eager at every one of >= 100 steps
   (crossing many flushes), the state equals eager whenever ``replay_compile.materialize`` makes it
   exact, counters prove the expected rewrite happened (or that a decoy was rejected with a reason),
   and ``replay_compile.explain`` reports the site.

CI (CPU, 2 cores, a few minutes for the whole suite) runs every spelling at one window with the rest
of the graph left eager (``inductor=False``: the rewrite and the runtime are what is under test), the
full set ``L in {1, 4, 16}`` x fp32/fp64 for a few, and Inductor end to end for a few; ``-m slow``
runs the whole sweep (every spelling x L x dtype, Inductor on, 300 steps) and every explain check.
"""
import importlib.metadata
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402

import replay_compile  # noqa: E402
from compiler.spellings import BATCH, CORPUS, by_name, decoys, positives  # noqa: E402
from replay_compile.families import families, get_family  # noqa: E402
from replay_compile.options import ReplayOptions  # noqa: E402
from replay_compile.testing import rel_rms  # noqa: E402

STEPS = 100
MATERIALIZE_EVERY = 23          # prime: materialize at every ring phase of L = 4 and 16
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
EAGER_TOL = {torch.float32: 2e-6, torch.float64: 1e-12}
WINDOWS = (1, 4, 16)
CI_WINDOW = 4
FAST = {"inductor": False}
FULL_IN_CI = ("sgla_broadcast_sum", "gdn_transformers_grouped", "decoy_tanh_state")  # all L x dtypes
INDUCTOR_IN_CI = ("retnet_fixed_decay_buffer",)  # a cheap Inductor compile on 2 CPU cores
EXPLAIN_IN_CI = ("sgla_broadcast_sum", "sgla_vk_matmul_inplace", "sgla_python_loop_T3", "retnet_fixed_decay_buffer",
                 "gla_broadcast_sum", "deltanet_matmul_vk_inplace", "gdn_transformers_grouped",
                 "gdn_python_loop_T3_buffer", "kda_grouped_expand_vk_inplace", "mamba2_transformers_buffer",
                 "decoy_tanh_state", "decoy_state_read_by_logger", "decoy_dense_transition",
                 "decoy_integer_state_buffer", "decoy_partial_update")


def _flat(out) -> torch.Tensor:
    parts = out if isinstance(out, (tuple, list)) else (out,)
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in parts])


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little") >> 1


def _ids(spellings):
    return [s.name for s in spellings]


def _slow_unless(in_ci: bool, *values):
    return pytest.param(*values, marks=() if in_ci else pytest.mark.slow)


# ================================================================== 1. the corpus, eagerly
def test_corpus_covers_issue_4():
    pos, dec = positives(), decoys()
    assert len(pos) >= 30 and len(dec) >= 10
    assert len({s.name for s in CORPUS}) == len(CORPUS)
    assert {s.family for s in pos} == {f.name for f in families()} >= {
        "mamba2", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda"}
    assert {s.layout for s in pos} == {"kv", "vk"}
    assert {s.mode for s in pos} == {"returned", "inplace", "buffer"}
    assert sum(s.tokens > 1 for s in pos) >= 5 and sum(s.grouped for s in pos) >= 5
    assert {s.template for s in pos if s.tokens > 1} >= {"scalar", "channel", "scalar_delta", "channel_delta"}
    assert sum(s.rewrite is False and s.rejected for s in dec) >= 8, "most decoys must be rejected with a reason"
    assert all(s.why for s in CORPUS)


WITH_REFERENCE = [(s, d) for s in positives() for d in s.dtypes]


@pytest.mark.parametrize("spelling,dtype", WITH_REFERENCE, ids=[f"{s.name}-{str(d)[6:]}" for s, d in WITH_REFERENCE])
def test_spelling_equals_family_math(spelling, dtype):
    """Each step of the spelling equals the canonical recurrence from the same state, and reads it."""
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    case = spelling.build(dtype, g)
    for step in range(4):
        inputs = case.draw(g)
        before = case.live_state().clone()
        out = case.step(inputs)
        ref_out, ref_state = case.reference(before, inputs)
        msg = f"{spelling.name} {dtype} step {step} seed {seed}"
        assert _flat(out).shape == _flat(ref_out).shape, msg
        assert rel_rms(_flat(out), _flat(ref_out)) <= EAGER_TOL[dtype], msg
        assert rel_rms(case.live_state(), ref_state) <= EAGER_TOL[dtype], msg
        # the output must depend on the state, or the compiled checks could not see state errors
        nudged_out, _ = case.reference(before * (1 + 1e-3 * torch.randn(before.shape, generator=g, dtype=torch.float64)
                                                 ).to(before.dtype), inputs)
        assert rel_rms(_flat(nudged_out), _flat(ref_out)) > 10 * EAGER_TOL[dtype], msg


@pytest.mark.parametrize("spelling", CORPUS, ids=_ids(CORPUS))
def test_spelling_stays_bounded(spelling):
    """Inputs are drawn so that long runs neither vanish nor blow up (the compiled checks run 100+ steps)."""
    g = torch.Generator().manual_seed(_seed())
    case = spelling.build(spelling.dtypes[0], g)
    for _ in range(STEPS + STEPS // 2):
        out = case.step(case.draw(g))
    state = case.live_state().double()
    assert torch.isfinite(state).all() and 0 < state.abs().max() < 1e3
    assert torch.isfinite(_flat(out)).all() and _flat(out).abs().max() < 1e4


# ============================================================ 2. compiled with replayssm
@pytest.fixture
def fresh_compiler():
    import torch._inductor.config as inductor_config
    # config.patch, not monkeypatch: pytest >= 9.2's undo breaks torch's config modules
    with inductor_config.patch(force_disable_caches=True):
        torch._dynamo.reset()
        replay_compile.reset_counters()
        yield
        torch._dynamo.reset()


def _clone_inputs(inputs: dict) -> dict:
    return {n: x.clone() for n, x in inputs.items()}


def run_compiled(spelling, dtype, window, steps=STEPS, options=None, *, device="cpu", batch=BATCH, mode=None):
    """Step eager and compiled twins with the same fresh inputs; check outputs and materialized states.

    ``mode`` (e.g. "reduce-overhead") goes to ``torch.compile``, which then takes no options: the
    window is the default one.
    """
    seed = _seed()
    g = torch.Generator().manual_seed(seed)
    eager = spelling.build(dtype, g, batch).to(device)
    comp = eager.twin()
    if mode is None:
        compiled = torch.compile(comp.fn, backend="replayssm", options={"window": window, **(options or {})})
    else:
        compiled = torch.compile(comp.fn, backend="replayssm", mode=mode)
        window = ReplayOptions.defaults().window
    tol = TOL[dtype]
    for step in range(steps):
        inputs = eager.draw(g)
        want = eager.step(inputs)
        got = comp.step(_clone_inputs(inputs), fn=compiled)
        msg = f"{spelling.name} {dtype} L={window} step {step} seed {seed}"
        assert _flat(got).shape == _flat(want).shape, msg
        assert rel_rms(_flat(got), _flat(want)) <= tol, f"output: {msg}"
        if (step + 1) % MATERIALIZE_EVERY == 0 or step == steps - 1:
            replay_compile.materialize(comp.holder())
            assert rel_rms(comp.live_state(), eager.live_state()) <= tol, f"materialized state: {msg}"


def _template_rewrites(template: str) -> int:
    return sum(replay_compile.counters[f"rewrite:{f.name}"] for f in families() if f.template == template)


def check_counters(spelling):
    c = replay_compile.counters
    if spelling.rewrite:
        assert c["sites_rewritten"] >= 1, dict(c)
        assert _template_rewrites(spelling.template) >= 1, dict(c)
        assert c["sites_rejected"] == 0, dict(c)
    elif spelling.rewrite is False:
        assert c["sites_rewritten"] == 0, dict(c)
        if spelling.rejected:
            assert c["sites_rejected"] >= 1, dict(c)
            assert any(k.startswith("reject:") and v > 0 for k, v in c.items()), dict(c)


def _ci_cases():
    return [(s, d, L) for s in CORPUS for d in s.dtypes for L in WINDOWS
            if (d, L) == (s.dtypes[0], CI_WINDOW) or s.name in FULL_IN_CI]


def _case_ids(cases):
    return [f"{s.name}-{str(d)[6:]}-L{L}" for s, d, L in cases]


@pytest.mark.parametrize("spelling,dtype,window", _ci_cases(), ids=_case_ids(_ci_cases()))
def test_compiled_equals_eager(fresh_compiler, spelling, dtype, window):
    run_compiled(spelling, dtype, window, options=FAST)
    check_counters(spelling)


INDUCTOR_CASES = [_slow_unless(s.name in INDUCTOR_IN_CI and (d, L) == (s.dtypes[0], CI_WINDOW), s, d, L)
                  for s in CORPUS for d in s.dtypes for L in WINDOWS]


@pytest.mark.parametrize("spelling,dtype,window", INDUCTOR_CASES,
                         ids=_case_ids([p.values for p in INDUCTOR_CASES]))
def test_compiled_with_inductor_equals_eager(fresh_compiler, spelling, dtype, window):
    """Default options (the rest of the graph through Inductor); 300 steps in the slow sweep."""
    run_compiled(spelling, dtype, window, steps=STEPS if spelling.name in INDUCTOR_IN_CI else 3 * STEPS)
    check_counters(spelling)


def _explain_call(case, inputs):
    """``(fn, args, kwargs)`` of one example call of the case's function or module."""
    if case.mode == "buffer":
        return case.fn, (), inputs
    return case.fn, (case.state.clone(),), inputs


@pytest.mark.parametrize("spelling", [_slow_unless(s.name in EXPLAIN_IN_CI, s) for s in CORPUS], ids=_ids(CORPUS))
def test_explain_reports_site(fresh_compiler, spelling):
    g = torch.Generator().manual_seed(_seed())
    case = spelling.build(torch.float32, g)
    untouched = case.twin()
    fn, args, kwargs = _explain_call(case, case.draw(g))
    forward = type(fn).forward if case.mode == "buffer" else None
    report = replay_compile.explain(fn, *args, options={"window": 5}, **kwargs)
    text = str(report)
    assert "before" in text.lower() and "after" in text.lower(), text
    for r in report.rejected:
        assert isinstance(r.reason, str) and r.reason.strip(), r
        assert isinstance(r.state, str) and r.state.strip(), r
    if spelling.rewrite:
        assert len(report.sites) == 1 and report.rejected == [], text
        site = report.sites[0]
        assert get_family(site.family).template == spelling.template, site.family
        assert site.family in text
        assert tuple(site.state_shape) == tuple(case.live_state().shape)
        assert site.layout == spelling.layout and site.window == 5 and site.tokens == spelling.tokens
        heads = site.state_shape[1]  # grouped spellings keep one ring key per query/key head
        assert site.k_heads < heads if spelling.grouped else site.k_heads == heads, (site.k_heads, heads)
        assert str(site.checkpoint_dtype).replace("torch.", "") == "float32" and site.read_dtype is None
        assert isinstance(site.kernel, str) and site.kernel
    elif spelling.rewrite is False:
        assert report.sites == [], text
        if spelling.rejected:
            assert len(report.rejected) >= 1, text
    if case.mode == "buffer":  # explain must leave the module as it was: same forward, plain eager results
        assert type(fn).forward is forward
        getattr(fn, case.state_attr).copy_(untouched.live_state())
        inputs = case.draw(g)
        assert torch.equal(_flat(case.step(inputs)), _flat(untouched.step(_clone_inputs(inputs))))
        assert torch.equal(case.live_state(), untouched.live_state())


# ============================================================== options reach the backend
def test_families_option_excludes_a_family(fresh_compiler):
    spelling = by_name("sgla_broadcast_sum")
    run_compiled(spelling, torch.float32, 4, steps=30, options={**FAST, "families": ["gated_deltanet"]})
    assert replay_compile.counters["sites_rewritten"] == 0
    assert replay_compile.counters["sites_rejected"] >= 1


def test_fuel_zero_rewrites_nothing(fresh_compiler):
    run_compiled(by_name("gla_broadcast_sum"), torch.float32, 4, steps=30, options={**FAST, "fuel": 0})
    assert replay_compile.counters["sites_rewritten"] == 0


def test_strict_raises_on_a_decoy(fresh_compiler):
    case = by_name("decoy_tanh_state").build(torch.float32, torch.Generator().manual_seed(0))
    compiled = torch.compile(case.fn, backend="replayssm", options={**FAST, "strict": True})
    with pytest.raises(Exception, match="(?i)reject|strict"):
        case.step(case.draw(torch.Generator().manual_seed(1)), fn=compiled)


def test_unknown_option_is_an_error(fresh_compiler):
    case = by_name("sgla_broadcast_sum").build(torch.float32, torch.Generator().manual_seed(0))
    compiled = torch.compile(case.fn, backend="replayssm", options={"windw": 4})
    with pytest.raises(Exception, match="windw"):
        case.step(case.draw(torch.Generator().manual_seed(1)), fn=compiled)


# ================================================================ entry point, fresh process
def test_entry_point_declared():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert [ep.value for ep in eps if ep.name == "replayssm"] == ["replay_compile.backend:replayssm_backend"]


FRESH_PROCESS = textwrap.dedent("""
    import torch

    def step(S, q, k, v, g):
        S.mul_(g.exp()[..., None, None]).add_(torch.einsum("bhk,bhv->bhkv", k, v))
        return torch.einsum("bhkv,bhk->bhv", S, q)

    S = torch.randn(3, 4, 5, 3)
    S_eager = S.clone()
    f = torch.compile(step, backend="replayssm", options={"window": 4, "inductor": False})
    for _ in range(10):
        q, k, g = torch.randn(3, 4, 5), torch.randn(3, 4, 5), -torch.rand(3, 4) * 0.5
        v = torch.randn(3, 4, 3)
        o = f(S, q, k, v, g)
        o_eager = step(S_eager, q, k, v, g)
        assert (o - o_eager).norm() <= 1e-5 * o_eager.norm(), (o - o_eager).norm()
    import replay_compile
    replay_compile.materialize(S)
    assert (S - S_eager).norm() <= 1e-5 * S_eager.norm()
    assert replay_compile.counters["sites_rewritten"] >= 1, dict(replay_compile.counters)
    print("OK")
""")


def test_backend_found_without_import_in_fresh_process():
    """The first compile of a fresh process, with no import of ours (entry point only)."""
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    r = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-4000:]


# ===================================================================== GPU (H200): Triton + CUDA graphs
GPU_BATCH = 9  # odd; below replay's break-even, so default options take the standard route (NOTE [cost model])
# States as buffers or in-place arguments: a state returned and fed back is a CUDA-graph output that the
# next replay overwrites (cudagraph trees refuse to read it), whatever the backend.
CUDAGRAPH_SPELLINGS = ("sgla_vk_matmul_inplace", "retnet_fixed_decay_buffer", "gla_grouped_precomputed_buffer",
                       "gdn_python_loop_T3_buffer", "kda_grouped_expand_vk_inplace", "mamba2_transformers_buffer",
                       "decoy_decay_depends_on_state")


@pytest.mark.gpu
@pytest.mark.parametrize("spelling", CORPUS, ids=_ids(CORPUS))
def test_gpu_triton_kernels(fresh_compiler, spelling):
    """Every spelling with the Triton kernels on the GPU, at a batch the cost model would refuse."""
    run_compiled(spelling, torch.float32, CI_WINDOW, options={**FAST, "kernels": "triton", "min_batch": 1},
                 device="cuda")
    check_counters(spelling)


@pytest.mark.gpu
@pytest.mark.parametrize("spelling", [by_name(n) for n in CUDAGRAPH_SPELLINGS], ids=CUDAGRAPH_SPELLINGS)
def test_gpu_cudagraphs(fresh_compiler, spelling):
    """mode="reduce-overhead": CUDA graphs over the op, Inductor for the rest, default options (at this batch the
    cost model's standard route; the replay form under CUDA graphs is ``test_backend_gpu``'s)."""
    run_compiled(spelling, torch.float32, None, steps=3 * STEPS, device="cuda", batch=GPU_BATCH, mode="reduce-overhead")
    check_counters(spelling)
