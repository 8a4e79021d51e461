"""``replayssm bench model`` keeps working: a CPU smoke run end to end, and the table/share logic."""
import json

import pytest

pytest.importorskip("transformers")

from replay_compile.bench import model as bench_model  # noqa: E402


def test_smoke_run_writes_table_json_and_progress(tmp_path, capsys):
    out, png = tmp_path / "model.json", tmp_path / "model.png"
    argv = ["--smoke", "--models", "qwen3.5-122b", "--columns", "eager,replay,no-recurrent", "--steps", "1",
            "--out", str(out), "--plot", str(png)]
    assert bench_model.main(argv) == 0
    captured = capsys.readouterr()
    assert "[1/4] qwen3.5-122b B=2: prefill 12 tokens" in captured.err
    assert "| qwen3.5-122b | 2 |" in captured.out and "(3 sites)" in captured.out
    results = json.loads(out.read_text())
    (row,) = results["rows"]
    assert set(row["cells"]) == {"eager", "replay", "no-recurrent"}
    assert all(cell["us"] > 0 for cell in row["cells"].values()), row
    replay = row["cells"]["replay"]
    assert replay["sites_rewritten"] == 3  # the three GDN layers of the stack
    assert replay["rel_err"] < 3e-2  # bf16 weights
    assert results["meta"]["context"] == 12 and results["meta"]["inductor"] is False
    assert png.exists() or "plot not written: matplotlib" in captured.out


def test_shares_and_table_from_results():
    cells = {"eager": {"us": 900.0}, "compile": {"us": 400.0}, "replay": {"us": 250.0, "sites_rewritten": 3},
             "no-recurrent": {"us": 100.0}, "compile+cg": {"us": 300.0}, "replay+cg": {"us": None, "why": "boom"}}
    shares = bench_model.recurrent_shares(cells)
    assert shares == pytest.approx({"compile": 0.75, "replay": 0.6})  # no no-recurrent+cg: no +cg shares
    results = {"meta": dict(device="cpu", dtype="bfloat16", context=8, window=4, repeats=1, steps=2),
               "rows": [dict(model="m", batch=2, cells=cells, recurrent_share=shares)]}
    table = bench_model.format_table(results)
    assert "| m | 2 | 900 | 400 | 250 (3 sites) | 100 | 300 | n/a | 1.60x |" in table
    assert "n/a m B=2 replay+cg: boom" in table


@pytest.mark.parametrize("argv", [["--smoke", "--models", "gpt2"], ["--smoke", "--columns", "fast"],
                                  ["--smoke", "--modes", "reduce-overhead"]])
def test_bad_arguments_fail_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_model.parse_args(argv)
    assert exc.value.code == 2
    assert "replayssm bench model" in capsys.readouterr().err
