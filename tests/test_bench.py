"""The kernel benchmark runs end to end on the CPU (``--smoke``) and writes a complete JSON file; the CPU smoke
commands need no hand-set interpreter flag."""
import json
import os
import pathlib
import runpy
import subprocess
import sys

import pytest
import torch

from replay_compile.bench import kernels


def test_smoke_run_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert kernels.main(["--smoke", "--shapes", "smoke-gdn,smoke-mamba2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["meta"]["copy_gbps"] > 0 and res["meta"]["replay_kernels"] == "torch"
    assert {r["shape"] for r in res["step"]} == {"smoke-gdn", "smoke-mamba2"}
    assert len(res["step"]) == 2 * len(kernels.SMOKE["read"]) * len(kernels.SMOKE["window"])
    for r in res["step"]:
        assert r["standard"]["us"] > 0 and r["standard"]["check"] == 0.0
        assert r["eager"]["us"] > 0 and r["eager"]["check"] < 1e-5  # eager step agrees with our kernel
        assert r["fla"]["us"] is None or r["fla"]["check"] < 1e-3
        assert r["ours"]["us"] > 0 and r["ours"]["bytes"] > 0
        assert r["compile"] == {"us": None, "why": "skipped in --smoke"}
    for r in res["verify"]:
        assert r["snapshot_us"] > 0 and r["replay_us"] > 0
        assert r["snapshot_per_seq_bytes"] == (1 + r["T"]) * kernels.state_bytes(kernels.SMOKE_SHAPES[r["shape"]])
        assert r["replay_per_seq_bytes"] > 0 and r["window"] == 16 + r["T"]
    assert "| smoke-gdn | 3 | 4 | none |" in printed and "snapshot verify us" in printed
    assert all(r["route"] in ("replay", "standard", "original") for r in res["step"])


def test_unavailable_column_is_na(tmp_path, monkeypatch):
    """A column that cannot run is reported n/a with its reason; the run goes on."""
    monkeypatch.setattr(kernels.Bench, "replay_step", lambda self, *a: {"us": None, "why": "ImportError: x"})
    out = tmp_path / "k.json"
    kernels.main(["--smoke", "--shapes", "smoke-kda", "--verify", "0", "--read", "none", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["step"][0]["ours"]["us"] is None and res["verify"] == []
    assert "speedup_vs_best_standard" not in res["step"][0]


def _timed(us):
    return {"us": us, "why": None}


@pytest.mark.parametrize("batch, route, dispatched", [(256, "replay", 0.8), (8, "standard", 1.0),
                                                      (1, "original", 0.5)])
def test_dispatched_route_against_best_standard(batch, route, dispatched):
    """Each step row says what a compiled model runs at its size and how that compares with the best standard
    kernel (fla's where faster); a dispatched route under 0.95x is listed below the table."""
    shape = kernels.SHAPES["nemotron3-super-mamba2"]
    base = {"bytes": 1, "standard": _timed(100.0), "fla": _timed(120.0), "compile": _timed(200.0)}
    row = kernels._step_row("nemotron3-super-mamba2", shape, batch, 16, "fp4", {**_timed(125.0), "bytes": 1}, base,
                            1000.0)
    assert row["route"] == route and row["dispatched_vs_best_standard"] == pytest.approx(dispatched)
    meta = {"copy_gbps": 1000.0, "device": "test"}
    table = kernels.format_tables({"meta": meta, "step": [row], "verify": [], "tune": []})
    assert f"| {route} | {dispatched:.2f}x |" in table
    assert ("never-lose" in table) == (dispatched < kernels.NEVER_LOSE)


def test_rejects_unknown_shape():
    with pytest.raises(SystemExit):
        kernels.parse_args(["--shapes", "no-such-model"])


def test_replay_bytes_floor():
    """fp32 replay moves ckpt*(1 + 1/L) per row plus records; a read copy cuts the non-flush reads."""
    from replay_compile.families import get_family
    shape = kernels.SHAPES["nemotron3-super-mamba2"]
    fam = get_family("mamba2")
    x = kernels.draw_inputs(shape, 2, None, "cpu", seed=0)
    ckpt = kernels.state_bytes(shape)
    rec = kernels.record_bytes(shape, fam, raw=False)
    io = kernels.io_bytes(x)
    assert kernels.replay_step_bytes(shape, fam, 2, 8, 0, False, x) == pytest.approx(
        2 * (ckpt * 9 / 8 + rec * 4.5) + io)
    fp8 = ckpt // 4
    assert kernels.replay_step_bytes(shape, fam, 2, 8, fp8, False, x) == pytest.approx(
        2 * (fp8 * 7 / 8 + (2 * ckpt + fp8) / 8 + rec * 4.5) + io)


def test_wrapper_script_help(monkeypatch, capsys):
    script = pathlib.Path(__file__).parents[1] / "benchmarks" / "bench_kernels.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0 and "--quick" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["kernels", "spec"])
def test_cpu_smoke_command_needs_no_interpreter_flag(command, tmp_path):
    """``replayssm bench kernels|spec --smoke`` on a machine without a GPU, from a shell that did not set
    ``TRITON_INTERPRET`` (the tests' conftest sets it): the command turns the interpreter on before any Triton
    template is imported, so ``import replay_compile`` must not import one."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([sys.executable, "-m", "replay_compile.cli", "bench", command, "--smoke",
                          "--out", str(tmp_path / "out.json")], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())


def _probe():
    script = pathlib.Path(__file__).parents[1] / "benchmarks" / "copy_read_probe.py"
    return runpy.run_path(str(script), run_name="copy_read_probe")


@pytest.mark.parametrize("read", ["fp8", "fp32"])
def test_copy_read_probe_checks_each_tiling(read, tmp_path):
    """``benchmarks/copy_read_probe.py`` under the interpreter: every tiling passes its float64 check (odd head
    count, value tiles below V, a unit's last program short of pairs) and lands in the JSON."""
    probe, out = _probe(), tmp_path / "probe.json"
    assert probe["main"](["--batch", "2", "--heads", "3", "--dims", "16", "--read", read, "--block-v", "8,16",
                          "--warps", "2", "--items", "1,4", "--contig", "4", "--stages", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(r["rel_rms"] < 1e-5 for r in rows)


def test_copy_read_probe_check_catches_a_wrong_scale(monkeypatch):
    """The probe's check fails a launch that reads the copy with scales 0.1% off."""
    probe = _probe()
    x = probe["draw"](2, 3, 16, 16, True, "cpu")
    off = dict(x, scale=x["scale"] * 1.001)
    launch = probe["launch"]
    monkeypatch.setitem(probe["check"].__globals__, "launch", lambda x_, out, *config: launch(off, out, *config))
    with pytest.raises(AssertionError, match="relative RMS"):
        probe["check"](x, torch.empty(2, 2, 3, 16), (8, 2, 4, 4, 1))
