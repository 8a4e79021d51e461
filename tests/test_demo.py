"""The README's first command keeps working: ``replayssm demo`` (model demo and runtime demo)."""
import pytest

from replay_compile import demo, demo_runtime


@pytest.mark.slow  # two Inductor compiles: minutes on 2 CPU cores
def test_model_demo_runs_and_matches_eager(capsys):
    assert demo.main(["--steps", "6", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "rewritten" in out and "replayssm matches eager" in out
    assert out.count("rewritten ") == 3  # Mamba-2, Gated DeltaNet and KDA layers; attention is left alone


def test_runtime_demo_runs(capsys):
    assert demo_runtime.main(["--steps", "12", "--window", "4"]) == 0
    assert "replay outputs match the standard recurrence" in capsys.readouterr().out
