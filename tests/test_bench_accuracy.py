"""The accuracy benchmark's harness runs end to end on the CPU (tiny heads, few tokens)."""
import json

import pytest

from replay_compile.bench import accuracy


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_accuracy_smoke(tmp_path):
    out = tmp_path / "acc.json"
    assert accuracy.main(["--smoke", "--families", "mamba2", "--out", str(out), "--no-progress"]) == 0
    rep = json.loads(out.read_text())
    res = rep["families"]["mamba2"]["results"]
    assert set(res) == {"fp32 standard", "bf16 state", "fp8 state", "fp4 state", "ckpt fp32 + bf16 read",
                        "ckpt fp32 + fp8 read", "ckpt fp32 + fp4 read", "ckpt fp16", "ckpt fp16 + SR"}
    errs = {v: res[v]["long"]["64"]["err"] for v in res}
    assert errs["fp32 standard"] < 1e-5 < errs["bf16 state"]  # fp32 tracks float64; bf16 storage does not
    assert errs["ckpt fp32 + fp8 read"] < errs["fp8 state"]
    assert rep["families"]["mamba2"]["targets"]


@pytest.mark.parametrize("model", ["qwen3_5", "nemotron_h"])
def test_accuracy_hf_smoke(tmp_path, model):
    """``--hf``: precision variants side by side in a transformers hybrid (float64), KL against float64."""
    pytest.importorskip("transformers")
    out = tmp_path / "acc_hf.json"
    assert accuracy.main(["--hf", "--smoke", "--hf-model", model, "--out", str(out), "--no-progress"]) == 0
    rep = json.loads(out.read_text())
    res = rep["results"]
    assert set(res) == {"fp32 standard", "bf16 state", "fp8 state", "fp4 state", "ckpt fp32 + bf16 read",
                        "ckpt fp32 + fp8 read", "ckpt fp32 + fp4 read"}
    kl = {v: res[v]["64"]["kl"] for v in res}
    assert abs(kl["fp32 standard"]) < 1e-12 < kl["bf16 state"]  # fp32 tracks float64; bf16 storage does not
    assert kl["ckpt fp32 + fp8 read"] < kl["fp8 state"]
    assert rep["targets"]


def test_accuracy_hf_plot_leaves_out_diverged_points(tmp_path):
    """The PNG of KL against tokens draws finite points only (a pure 4-bit state's KL turns NaN at 32K)."""
    pytest.importorskip("matplotlib")
    from replay_compile.bench.hf_accuracy import plot
    results = {"fp4 state": {"1024": {"kl": 1.7}, "32768": {"kl": float("nan")}},
               "ckpt fp32 + fp4 read": {"1024": {"kl": 2e-2}, "32768": {"kl": 1.9e-2}}}
    plot("qwen3_5", results, str(tmp_path / "kl.png"))
    assert (tmp_path / "kl.png").stat().st_size > 0


def test_kl_gain_counts_a_diverged_pure_state_as_lost():
    from replay_compile.bench.accuracy import kl_gain
    assert kl_gain(2e-3, 1e-4) == pytest.approx(20)
    assert kl_gain(float("nan"), 3e-2) == float("inf")  # a 4-bit state overflows; the split read does not
    assert kl_gain(float("inf"), float("nan")) == 0.0     # a diverged split read never passes
