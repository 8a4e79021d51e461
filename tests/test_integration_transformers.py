"""replay_compile.integrations.transformers: transformers models decode and verify drafts in replay form.

Reference: greedy decoding of the same tiny random-weight model, one token per call, with transformers'
own functions. Speculative greedy decoding through the integration (T drafts verified per call, per-row
acceptance from a drafter that is right most of the time) must give the same tokens, and logits of
the kept tokens within float32 reassociation noise.
"""
import os
import sys

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

import replay_compile  # noqa: E402
from replay_compile.integrations import transformers as replay_tf  # noqa: E402
from replay_compile.runtime import ReplayError  # noqa: E402
from replay_compile.testing import NoisyOracleDrafter  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
import tiny  # noqa: E402

ROUTED = ("qwen3_next", "qwen3_5", "kimi_linear", "mamba2", "nemotron_h")
FAST = ("qwen3_5", "mamba2")  # one GDN hybrid (with attention) and one Mamba-2 model in the default suite


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _cache_kw(model, cache):
    return {replay_tf._cache_argument(model): cache, "use_cache": True}


@torch.no_grad()
def greedy_reference(model, ids, new_tokens):
    """Eager greedy decoding, one token per call: (tokens [B, N], logits [B, N, vocab])."""
    cache = DynamicCache(config=model.config)
    logits = model(ids, **_cache_kw(model, cache)).logits[:, -1]
    toks, lgs = [], []
    for i in range(new_tokens):
        lgs.append(logits)
        toks.append(logits.argmax(-1))
        if i + 1 < new_tokens:
            logits = model(toks[-1][:, None], **_cache_kw(model, cache)).logits[:, -1]
    return torch.stack(toks, 1), torch.stack(lgs, 1)


def _check_speculative(family, device="cpu", kernels="torch", new_tokens=14, T=3, window=8):
    model = tiny.tiny_model(family).to(device)
    ids = tiny.prompts(3, 8, seed=1)[0].to(device)
    ref, ref_logits = greedy_reference(model, ids, new_tokens)
    drafter = NoisyOracleDrafter(ref.cpu(), ids.shape[1], tiny.VOCAB, pad=3)
    with replay_tf.enable_replay(model, window=window, speculative=True, kernels=kernels) as replay:
        toks, logits, stats = replay_tf.speculative_generate(model, replay, ids, new_tokens, drafter, T)
    assert torch.equal(toks, ref)
    tol = 1e-2 if device != "cpu" else 1e-3  # float32 reassociation (GPU: TF32 tensor-core dots in the kernels)
    torch.testing.assert_close(logits, ref_logits, rtol=tol, atol=tol)
    assert 0 < stats["accepted"] < stats["drafted"]  # partial, per-row acceptance exercised the rollback
    assert stats["steps"] < new_tokens


@pytest.mark.parametrize("family", FAST)
def test_speculative_greedy_is_token_identical(family):
    _check_speculative(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in ROUTED if f not in FAST])
def test_speculative_greedy_is_token_identical_all_families(family):
    _check_speculative(family)


@pytest.mark.slow
@pytest.mark.parametrize("family", ROUTED)
def test_speculative_long_run_small_window(family):
    """More tokens than several windows, verifies that do not fit trigger early folds."""
    _check_speculative(family, new_tokens=40, T=4, window=5)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ROUTED)
def test_speculative_on_gpu_logit_close(family):
    """Triton replay kernels on the GPU: same tokens, logits close to transformers' own decoding."""
    _check_speculative(family, device="cuda", kernels="auto", new_tokens=24, T=4, window=16)


@pytest.mark.parametrize("family", ["qwen3_5"] + [pytest.param(f, marks=pytest.mark.slow)
                                                 for f in ROUTED if f != "qwen3_5"])
@torch.no_grad()
def test_one_token_verify_rolls_back(family):
    """Speculative one-token calls are tentative: commit(0) restores states and conv windows exactly.

    The dropped token's attention KV entry stays in the cache, masked out (as speculative_generate does).
    """
    model = tiny.tiny_model(family)
    ids = tiny.prompts(2, 8, seed=2)[0]
    ref, ref_logits = greedy_reference(model, ids, 3)
    cache, mask = DynamicCache(config=model.config), torch.ones(2, 7, dtype=torch.long)
    positions = "position_ids" in replay_tf.inspect.signature(model.forward).parameters

    def call(token, pos):
        nonlocal mask
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        extra = {"position_ids": torch.full((2, 1), pos)} if positions else {}
        return model(token, attention_mask=mask, **extra, **_cache_kw(model, cache)).logits[:, -1]

    with replay_tf.enable_replay(model, window=4, speculative=True, kernels="torch") as replay:
        model(ids[:, :-1], attention_mask=mask, **_cache_kw(model, cache))
        last = ids[:, -1:]
        for i in range(3):
            call((last + 7) % tiny.VOCAB, 7 + i)  # a wrong token, then dropped
            replay.commit(cache, torch.tensor([0, 0]))
            mask[:, -1] = 0
            out = call(last, 7 + i)
            replay.commit(cache, 1)
            torch.testing.assert_close(out, ref_logits[:, i], rtol=1e-3, atol=1e-3)
            last = ref[:, i:i + 1]


@torch.no_grad()
def test_decode_and_disable_hand_back_exact_states():
    """Plain decode through the integration equals eager; after disable transformers continues exactly."""
    model = tiny.tiny_model("qwen3_5")
    ids = tiny.prompts(2, 8, seed=3)[0]
    ref, ref_logits = greedy_reference(model, ids, 10)
    cache = DynamicCache(config=model.config)
    replay = replay_tf.enable_replay(model, window=3, kernels="torch", verify_form="tokens")
    logits = model(ids, **_cache_kw(model, cache)).logits[:, -1]
    for i in range(6):
        torch.testing.assert_close(logits, ref_logits[:, i], rtol=1e-3, atol=1e-3)
        logits = model(ref[:, i:i + 1], **_cache_kw(model, cache)).logits[:, -1]
    assert replay_compile.ops.registry.find(cache.layers[0].recurrent_states[0]).verify_form == "tokens"
    replay.disable()  # states exact again, functions restored
    assert replay_compile.ops.registry.find(cache.layers[0].recurrent_states[0]) is None
    for i in range(6, 10):
        torch.testing.assert_close(logits, ref_logits[:, i], rtol=1e-3, atol=1e-3)
        logits = model(ref[:, i:i + 1], **_cache_kw(model, cache)).logits[:, -1]


@torch.no_grad()
def test_misuse_raises_clear_errors():
    model = tiny.tiny_model("qwen3_5")
    ids = tiny.prompts(2, 8, seed=4)[0]
    cache = DynamicCache(config=model.config)
    with pytest.raises(ReplayError, match="no layer this integration routes"):
        replay_tf.enable_replay(tiny.tiny_model("minimax"))
    replay = replay_tf.enable_replay(model, window=4, speculative=True, kernels="torch")
    model(ids, **_cache_kw(model, cache))
    with pytest.raises(ReplayError, match="no verify of this cache is pending"):
        replay.commit(cache, 1)
    model(ids[:, :3], **_cache_kw(model, cache))
    with pytest.raises(ReplayError, match="n_accepted must lie in"):
        replay.commit(cache, 4)
    replay_compile.commit(cache, 3)  # the recurrent states only: the conv windows are still unrolled
    with pytest.raises(ReplayError, match="uncommitted verify"):
        model(ids[:, :1], **_cache_kw(model, cache))
    with pytest.raises(ReplayError, match="uncommitted verify"):
        replay.disable()
    replay.commit(cache, 3)  # rolls the conv windows (the states were committed above)
    with pytest.raises(ReplayError, match="already enabled"):
        replay_tf.enable_replay(model)
    replay.disable()
    with pytest.raises(RuntimeError, match="boom"):  # an exception mid-verify still hands the model back
        with replay_tf.enable_replay(model, window=4, speculative=True, kernels="torch"):
            model(ids[:, :2], **_cache_kw(model, cache))
            raise RuntimeError("boom")
    assert model._replay_integration is None


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5", "kimi_linear", "mamba2"])
def test_speculative_with_triton_kernels(family):
    """The generated Triton kernels (interpreter on the CPU) behind the same routing."""
    _check_speculative(family, kernels="triton", new_tokens=8, T=3, window=8)


@pytest.mark.slow
def test_transformers_example_runs():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import transformers_speculative  # noqa: PLC0415

    assert transformers_speculative.main(["--tokens", "12", "--device", "cpu"]) == 0
