"""Issue 5, items 1-2: transformers hybrids compiled with ``backend="replayssm"`` generate what eager does.

For each tiny model of tests/models/tiny.py: ``model.forward = torch.compile(model.forward,
backend="replayssm")``, greedy ``generate`` (prefill through the model's chunked path, then one-token
decode steps through the rewritten recurrence), then a second ``generate`` on the same cache (its
prompt goes through the chunked path, which reads and writes the replay-managed state). Against an
eager copy of the same model:
- tokens are equal and the logits of every step are within a rel-RMS tolerance;
- the materialized recurrent states are within tolerance of eager's;
- ``replay_compile.explain`` on a decode step rewrites every linear-recurrent layer with the expected
  family and leaves the conv states alone.

Greedy-token equality alone is weak (REPLAYSSM.md, pitfalls): the logits are compared at every step,
and ``test_tolerance_would_catch_a_state_error`` shows a 1e-3 error in the states moves the logits by
more than the fp32 tolerance. A token may differ only at a near-tie of eager's logits (the check
says so and stops comparing that row; at least half of all steps must be compared). States stay fp32
except MiniMax's, which follow the weights.

Default suite: one cheap family at short length on the CPU (``inductor=False``: the rest of the
graph runs as captured, so the only difference from eager is the recurrence). ``slow``: the full
matrix (6 families x batch {1, 4 left-padded} x {fp32, bf16} weights, 64 tokens + a 16-token
continuation), and one bf16 family through Inductor. ``gpu``: fp32 at batch 4 with the Triton kernels,
and the same bf16 family through Inductor. The models run their torch code even where fla / mamba_ssm
are installed (tiny.py).
"""

import copy
import re

import pytest
import torch

pytest.importorskip("transformers")

import replay_compile  # noqa: E402
from replay_compile.testing import rel_rms  # noqa: E402
from tiny import FAMILIES, continue_greedy, greedy, prompts, recurrent_states, tiny_model  # noqa: E402

# model -> (canonical recurrence the backend must find, indices of the linear-recurrent layers)
RECURRENCES = {
    "mamba2": ("mamba2", [0, 1]),
    "nemotron_h": ("mamba2", [0, 2]),
    "qwen3_next": ("gated_deltanet", [0, 1, 2]),
    "qwen3_5": ("gated_deltanet", [0, 1, 2]),
    "kimi_linear": ("kda", [0, 1]),
    "minimax": ("simple_gla", [1, 3]),
}
# Per-step logit tolerance (rel-RMS against eager) and final-state tolerance, by weight dtype. fp32:
# reassociation of the recurrence only. bf16: the recurrence's fp32 output is rounded to bf16 where
# eager's is, and one flipped rounding then propagates through the later layers.
LOGIT_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
STATE_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
# The Triton kernels on the H200 sum in another order at every step: qwen3_next fp32 reached 1.03e-4 at step 49
# (2026-12-02). A 1e-3 state error still moves the logits by more than twice this (test below).
LOGIT_TOL_TRITON_FP32 = 2e-4
PROMPT_LEN, MORE_LEN, LEFT_PAD = 7, 5, 3
CPU_OPTIONS = dict(inductor=False, min_batch=1)
GPU_OPTIONS = dict(min_batch=1)  # min_batch: the GPU cost model would give these tiny batches the standard route


# Known failures, each with its handoff request (xfail strict: a fix turns them into failures to unmark).
KNOWN = {
    ("minimax", torch.bfloat16): "both layers are rewritten (explain), but MiniMax's MoE router picks its top-k "
                                 "experts from bf16 logits: a reassociated, correct rounding flips a choice and "
                                 "the logits jump (1e-1 at batch 4, step 2; a tie cuts batch 1 at step 8; CPU); "
                                 "the logit check assumes a continuous model",
}


def matrix(batches, dtypes):
    """(family, batch, dtype) params of the end-to-end matrix, known failures marked xfail(strict=True)."""
    params = []
    for family in FAMILIES:
        for batch in batches:
            for dtype in dtypes:
                reason = KNOWN.get((family, dtype))
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                name = f"{family}-{batch}-{str(dtype).replace('torch.', '')}"
                params.append(pytest.param(family, batch, dtype, marks=marks, id=name))
    return params


@pytest.fixture(autouse=True)
def _fresh(fresh_compiler):
    yield


# ------------------------------------------------------------------------------------------ runs
def make_inputs(batch, device):
    """Left-padded prompts [batch, PROMPT_LEN] (row i has min(i, LEFT_PAD) pads) and the tokens
    [batch, MORE_LEN] appended before the continuation."""
    ids, mask = prompts(batch, PROMPT_LEN, seed=21, left_pad=LEFT_PAD if batch > 1 else 0)
    more, _ = prompts(batch, MORE_LEN, seed=22)
    return ids.to(device), mask.to(device), more.to(device)


def generate_twice(model, batch, new_tokens, more_tokens, device):
    """Greedy generation, then a continuation on its cache: a dict of sequences, per-step logits
    ([steps, B, vocab]), the recurrent states between the two (``states1``, made exact first: the
    continuation then runs on materialized states) and the cache."""
    ids, mask, more = make_inputs(batch, device)
    seq, logits, cache = greedy(model, ids, mask, new_tokens, return_cache=True)
    replay_compile.materialize(cache)  # a no-op for eager
    states1 = {layer: state.clone() for layer, state in recurrent_states(cache).items()}
    seq2, logits2 = continue_greedy(model, seq, mask, cache, more, more_tokens)
    return dict(seq=seq, logits=logits.float(), states1=states1, seq2=seq2, logits2=logits2.float(), cache=cache)


def compare_steps(replay, eager, replay_logits, eager_logits, tol, rows):
    """Check each row of ``rows`` step by step; returns (rows whose tokens stayed equal, steps compared).

    Logits must be within ``tol`` (rel-RMS) up to a row's first differing token; a differing token is
    allowed only where eager's choice leads the replay's by no more than the logit tolerance allows
    (a tie: bf16 logits tie often), and the row is not compared after it.
    """
    steps = eager_logits.shape[0]
    tokens_r, tokens_e = replay[:, -steps:], eager[:, -steps:]
    equal_rows, compared = [], 0
    for b in rows:
        differ = (tokens_r[b] != tokens_e[b]).nonzero().flatten().tolist()
        last = differ[0] if differ else steps - 1
        for t in range(last + 1):
            err = rel_rms(replay_logits[t, b], eager_logits[t, b])
            assert err <= tol, f"row {b} step {t}: logits rel-RMS {err:.2e} > {tol:.0e}"
        compared += last + 1
        if not differ:
            equal_rows.append(b)
            continue
        e = eager_logits[last, b]
        gap = float(e[tokens_e[b, last]] - e[tokens_r[b, last]])
        assert gap <= 2 * tol * float(e.norm()), \
            f"row {b} step {last}: token {int(tokens_r[b, last])} != eager's {int(tokens_e[b, last])}, " \
            f"which leads by {gap:.3e} (not a tie)"
    return equal_rows, compared


def assert_states_match(replay_states, eager_states, rows, dtype, when):
    assert replay_states.keys() == eager_states.keys()
    for layer in eager_states if rows else []:
        err = rel_rms(replay_states[layer][rows], eager_states[layer][rows])
        assert err <= STATE_TOL[dtype], f"layer {layer} {when}: state rel-RMS {err:.2e}"


def assert_generation_matches(replay, eager, dtype, tol=None):
    """Both generations and the states of ``replay`` (a compiled run) against ``eager``: every row
    until its first tie; at least half of all steps must have been compared. ``tol``: the per-step
    logit tolerance, ``LOGIT_TOL[dtype]`` by default."""
    tol = tol or LOGIT_TOL[dtype]
    rows = list(range(eager["seq"].shape[0]))
    rows, compared1 = compare_steps(replay["seq"], eager["seq"], replay["logits"], eager["logits"], tol, rows)
    assert_states_match(replay["states1"], eager["states1"], rows, dtype, "after the first generation")
    rows, compared2 = compare_steps(replay["seq2"], eager["seq2"], replay["logits2"], eager["logits2"], tol, rows)
    replay_compile.materialize(replay["cache"])
    assert_states_match(recurrent_states(replay["cache"]), recurrent_states(eager["cache"]), rows, dtype, "at the end")
    total = eager["seq"].shape[0] * (eager["logits"].shape[0] + eager["logits2"].shape[0])
    assert compared1 + compared2 >= total / 2, f"ties cut the comparison to {compared1 + compared2} of {total} steps"


def explain_decode_step(model, run, options):
    """``explain`` of one decode step of ``model`` (eager) on a copy of ``run``'s cache."""
    cache = copy.deepcopy(run["cache"])
    seq = run["seq2"]
    mask = torch.ones_like(seq)
    mask[:, :PROMPT_LEN] = make_inputs(seq.shape[0], seq.device)[1]
    cache_kw = "cache_params" if model.config.model_type == "mamba2" else "past_key_values"
    report = replay_compile.explain(model.forward, input_ids=seq[:, -1:], attention_mask=mask, use_cache=True,
                                    options=options, **{cache_kw: cache})
    torch._dynamo.reset()  # explain's capturing backend must not serve later compiles
    return report


def assert_every_recurrence_rewritten(report, family):
    expected, layers = RECURRENCES[family]
    state = re.compile(r"(?:layers\[(\d+)\]\.recurrent_states\[0\]|linear_cache\[(\d+)\])$")
    rewritten = {}
    for site in report.sites:
        match = state.search(site.state)
        assert match, f"rewrote {site.state}, which is not a recurrent state"
        rewritten[int(match.group(1) or match.group(2))] = site.family
    assert rewritten == {layer: expected for layer in layers}, str(report).split("\n\n")[0]
    assert not any(state.search(r.state) for r in report.rejected), str(report).split("\n\n")[0]


def run_case(family, batch, dtype, new_tokens, more_tokens, device, options, tol=None):
    """The whole issue-5 check for one configuration."""
    eager_model = tiny_model(family, dtype=dtype, seed=3).to(device)
    eager = generate_twice(eager_model, batch, new_tokens, more_tokens, device)
    assert_every_recurrence_rewritten(explain_decode_step(eager_model, eager, options), family)

    model = tiny_model(family, dtype=dtype, seed=3).to(device)
    model.forward = torch.compile(model.forward, backend="replayssm", options=options)
    replay = generate_twice(model, batch, new_tokens, more_tokens, device)
    assert replay_compile.counters[f"rewrite:{RECURRENCES[family][0]}"] >= len(RECURRENCES[family][1])
    assert_generation_matches(replay, eager, dtype, tol)


# ----------------------------------------------------------------------------------------- tests
def test_mamba2_short_generation_matches_eager():
    """Default suite: batch 4 left-padded, fp32, window 4 (several flushes in 8 steps)."""
    run_case("mamba2", 4, torch.float32, new_tokens=8, more_tokens=3, device="cpu",
             options=dict(CPU_OPTIONS, window=4))


@pytest.mark.slow
@pytest.mark.parametrize("family,batch,dtype", matrix([1, 4], [torch.float32, torch.bfloat16]))
def test_generation_matches_eager(family, batch, dtype):
    run_case(family, batch, dtype, new_tokens=64, more_tokens=16, device="cpu", options=CPU_OPTIONS)


@pytest.mark.gpu
@pytest.mark.parametrize("family,batch,dtype", matrix([4], [torch.float32]))
def test_generation_matches_eager_triton_kernels(family, batch, dtype):
    """On the GPU the rewritten sites run the Triton kernels; the rest of the graph runs as captured.
    fp32 weights (the tightest tolerance on the kernels) at batch 4 (left padding) only, to keep the GPU
    run near 2 minutes; bf16 goes through Inductor below, the rest of the matrix runs on the CPU."""
    run_case(family, batch, dtype, new_tokens=64, more_tokens=16, device="cuda",
             options=dict(GPU_OPTIONS, inductor=False, kernels="triton"), tol=LOGIT_TOL_TRITON_FP32)


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow),
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
def test_generation_matches_eager_inductor(device):
    """Default options (Inductor compiles the rest of the graph, kernels chosen automatically), bf16 weights.

    Inductor computes a fused bf16 expression in fp32 and rounds once, where eager rounds after every op:
    torch.compile's default alone moves this model's prompt logits by 3.5e-2 from eager (2026-12-03, CPU),
    more than the bf16 tolerance. ``emulate_precision_casts`` makes Inductor round as eager does (0 difference
    on the prompt), so what the comparison sees is the rewrite. ~3 minutes on the CPU, mostly compiling."""
    with torch._inductor.config.patch(emulate_precision_casts=True):
        run_case("qwen3_next", 4, torch.bfloat16, new_tokens=64, more_tokens=16, device=device, options=GPU_OPTIONS)


@pytest.mark.parametrize("family", [f if f == "mamba2" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_tolerance_would_catch_a_state_error(family):
    """A random 1e-3 (of the state's max) error in every recurrent state moves the next step's logits
    by more than the fp32 tolerance: the logit checks above see a wrong recurrence."""
    model = tiny_model(family, seed=3)
    ids, mask, _ = make_inputs(2, "cpu")
    seq, _, cache = greedy(model, ids, mask, 6, return_cache=True)
    step_mask = torch.cat([mask, torch.ones_like(seq[:, PROMPT_LEN:])], dim=1)
    cache_kw = "cache_params" if model.config.model_type == "mamba2" else "past_key_values"
    generator = torch.Generator().manual_seed(0)
    logits = []
    for scale in (0.0, 1e-3):
        perturbed = copy.deepcopy(cache)
        for state in recurrent_states(perturbed).values():
            state.add_(scale * state.abs().max() * torch.randn(state.shape, generator=generator))
        with torch.no_grad():
            logits.append(model(input_ids=seq[:, -1:], attention_mask=step_mask, use_cache=True,
                                **{cache_kw: perturbed}).logits)
    assert rel_rms(logits[1], logits[0]) > max(3 * LOGIT_TOL[torch.float32], 2 * LOGIT_TOL_TRITON_FP32)
