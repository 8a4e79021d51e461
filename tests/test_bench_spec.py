"""The speculative-decoding benchmark's harness runs on the CPU; acceptance draws follow their definition."""
import json

import pytest
import torch

from replay_compile.bench import spec


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_acceptance_draws():
    n = spec.draw_accepted(1.0, 4, 8, 5, seed=0)
    assert n.shape == (5, 8) and (n == 4).all()  # every draft accepted
    n = spec.draw_accepted(0.5, 8, 4000, 1, seed=0).float()
    assert (n >= 1).all() and (n <= 8).all()
    assert abs(n.mean().item() - sum(0.5 ** i for i in range(8))) < 0.05  # 1 + p + p^2 + ... + p^7
    text = spec.text_acceptance(4)
    assert ((text >= 1) & (text <= 4)).all() and (text > 1).any()  # real text repeats itself sometimes


def test_spec_smoke(tmp_path):
    out = tmp_path / "spec.json"
    assert spec.main(["--smoke", "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert {r["shape"] for r in res} == {"mamba2", "gated_deltanet"}
    for r in res:
        assert r["replay"]["bytes_per_seq"] < r["snapshot"]["bytes_per_seq"]
        assert r["replay"]["seqs_in_80GB"] > r["snapshot"]["seqs_in_80GB"]
        assert torch.isfinite(torch.tensor(r["replay"]["us"]))


def test_spec_smoke_with_a_verify_form(tmp_path, monkeypatch):
    """``--verify-form`` reaches every replay state (on a GPU, the Triton path's verify template); a bad form is a
    usage error before anything runs."""
    forms, state = [], spec.ReplayState
    monkeypatch.setattr(spec, "ReplayState", lambda *a, **kw: forms.append(kw["verify_form"]) or state(*a, **kw))
    out = tmp_path / "spec.json"
    assert spec.main(["--smoke", "--device", "cpu", "--out", str(out), "--verify-form", "chunked:kc=16"]) == 0
    assert json.loads(out.read_text())["meta"]["verify_form"] == "chunked:kc=16"
    assert len(forms) == 4 and set(forms) == {"chunked:kc=16"}
    with pytest.raises(SystemExit):
        spec.main(["--smoke", "--device", "cpu", "--out", str(out), "--verify-form", "chunked:kc=sixteen"])
