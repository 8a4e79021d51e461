"""``replayssm bench model`` keeps working: a CPU smoke run end to end, and the table/share logic."""
import json

import pytest
import torch

pytest.importorskip("transformers")

from replay_compile.bench import model as bench_model  # noqa: E402


def test_smoke_run_writes_table_json_and_progress(tmp_path, capsys):
    out, png = tmp_path / "model.json", tmp_path / "model.png"
    argv = ["--smoke", "--models", "qwen3.5-122b", "--columns", "replay,no-recurrent", "--steps", "1",
            "--out", str(out), "--plot", str(png)]
    assert bench_model.main(argv) == 0
    captured = capsys.readouterr()
    assert "[1/3] qwen3.5-122b B=2: prefill 12 tokens" in captured.err
    assert "| qwen3.5-122b | 2 |" in captured.out and "(3 sites)" in captured.out
    results = json.loads(out.read_text())
    (row,) = results["rows"]
    assert set(row["cells"]) == {"replay", "no-recurrent"}
    assert all(cell["us"] > 0 for cell in row["cells"].values()), row
    replay = row["cells"]["replay"]
    assert replay["sites_rewritten"] == 3  # the three GDN layers of the stack
    assert replay["rel_err"] < 3e-2  # bf16 weights
    assert results["meta"]["context"] == 12 and results["meta"]["inductor"] is False
    assert results["meta"]["validate"] is False
    assert png.exists() or "plot not written: matplotlib" in captured.out
    merged = tmp_path / "merged.json"  # a run cut into parts joins back
    assert bench_model.main(["--merge", str(out), str(out), "--out", str(merged)]) == 0
    assert len(json.loads(merged.read_text())["rows"]) == 2
    assert capsys.readouterr().out.count("| qwen3.5-122b | 2 |") == 2


@pytest.mark.parametrize("name", list(bench_model.SPECS))
def test_decode_step_after_chunked_prefill_matches_full_forward(name):
    """The timed step is a real decode step: prefilled in chunks into the static cache, its logits equal
    those of one cache-free forward over the whole prompt (fp32)."""
    spec = bench_model.SPECS[name]
    bench_model.bind_torch_paths([spec.module])
    model = bench_model.build_model(spec, smoke=True, device="cpu", dtype=torch.float32)
    decode = bench_model.DecodeCache(model, batch=2, context=12, prefill_chunk=5, headroom=4, device="cpu")
    prompt = torch.randint(3, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    assert torch.equal(decode.token, prompt[:, 12:])
    with torch.no_grad():
        expected = model(input_ids=prompt).logits[:, -1:]
    for _ in range(2):  # restore() puts the cache back exactly
        torch.testing.assert_close(decode.step_fn(model.forward)(), expected, atol=1e-5, rtol=1e-5)
        decode.restore()
    with bench_model.without_recurrence(model, spec):
        assert len([m for m in model.modules() if isinstance(m, bench_model.NoRecurrence)]) == \
            len(bench_model.recurrent_mixers(model, spec)) == (2 if spec.recurrence == "mamba2" else 3)
    assert not any(isinstance(m, bench_model.NoRecurrence) for m in model.modules())


@pytest.mark.parametrize("name", list(bench_model.SPECS))
def test_prefill_of_some_rows_tiled_over_the_batch(name):
    """A batch prefilled from 2 rows (tiled to 4): rows 2, 3 decode their own token on rows 0, 1's context."""
    spec = bench_model.SPECS[name]
    bench_model.bind_torch_paths([spec.module])
    model = bench_model.build_model(spec, smoke=True, device="cpu", dtype=torch.float32)
    decode = bench_model.DecodeCache(model, batch=4, context=12, prefill_chunk=5, headroom=4, device="cpu",
                                     prefill_rows=2)
    prompt = torch.randint(3, model.config.vocab_size, (4, 13), generator=torch.Generator().manual_seed(1))
    context = torch.cat([prompt[:2, :12], prompt[:2, :12]])
    with torch.no_grad():
        expected = model(input_ids=torch.cat([context, prompt[:, 12:]], dim=1)).logits[:, -1:]
    torch.testing.assert_close(decode.step_fn(model.forward)(), expected, atol=1e-5, rtol=1e-5)


def test_profile_appends_a_table_per_cell(tmp_path):
    prof = tmp_path / "prof.txt"
    argv = ["--smoke", "--models", "qwen3.5-122b", "--columns", "compile,replay", "--steps", "2", "--profile", str(prof)]
    assert bench_model.main(argv) == 0
    text = prof.read_text()
    assert text.count("=== qwen3.5-122b B=2 ") == 2 and "=== qwen3.5-122b B=2 replay: " in text
    assert "Self CPU" in text  # torch.profiler's table


def test_merge_orders_rows_by_model_then_batch(tmp_path):
    def part(name, *rows):
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {"command": name}, "rows": [{"model": m, "batch": b} for m, b in rows]}))
        return str(path)
    merged = bench_model.merge([part("a.json", ("kda", 1), ("gdn", 32)), part("b.json", ("gdn", 8), ("kda", 256),
                                                                                   ("kda", 8))])
    assert [(r["model"], r["batch"]) for r in merged["rows"]] == [("kda", 1), ("kda", 8), ("kda", 256), ("gdn", 8),
                                                                  ("gdn", 32)]
    assert [s["command"] for s in merged["meta"]["merged_from"]] == ["a.json", "b.json"]


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
