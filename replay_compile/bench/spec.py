"""``replayssm bench spec``: speculative decoding, replay verify + commit against state snapshots.

One speculative step verifies ``T`` tokens per row (the last sampled token plus ``T - 1`` drafts) and
keeps ``n`` of them (``1 <= n <= T``). Two ways to make that undoable:

* snapshot (what serving engines do): the verify kernel writes a full state after every token into
  ``1 + T`` slots per sequence; commit picks slot ``n`` (an index move).
* replay: verify appends ``T`` ring records and writes no state (rows whose ring cannot take ``T``
  more fold first); commit moves the ring pointer by ``n``.

Per (shape, T, batch, acceptance) the table gives the step time (verify + commit, averaged over a run
of steps with the acceptance counts drawn per row and per step, rows at staggered ring phases),
accepted tokens per second, state bytes per sequence, sequences that fit in 80 GB of state, and one
standard decode step for scale. Acceptance is either a per-draft probability (counts ~ truncated
geometric) or ``text``: the counts a prompt-lookup drafter gets on real text (this package's own
sources, word tokens), i.e. what it would get if the target reproduced that text.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys

import torch

from ..families import get_family
from ..runtime import ReplayState
from ..templates import verify_forms
from .kernels import SHAPES, SMOKE_SHAPES, Timer, _dump, draw_inputs, draw_state, state_bytes

BUDGET = 80e9


def text_acceptance(T: int, ngram: int = 2, limit: int = 40000) -> torch.Tensor:
    """Accepted counts ``n`` (1..T) of prompt-lookup drafting on real text, one per position."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    words = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        with open(path) as f:
            words += re.findall(r"\w+|[^\w\s]", f.read())
    words = words[:limit]
    last_seen, counts = {}, []
    for i in range(ngram, len(words) - T):
        key = tuple(words[i - ngram:i])
        j = last_seen.get(key)
        n = 1
        if j is not None:
            while n < T and j + n - 1 < i and words[j + n - 1] == words[i + n - 1]:
                n += 1
        counts.append(n)
        last_seen[key] = i
    return torch.tensor(counts)


def draw_accepted(acceptance, T: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """``[steps, batch]`` accepted counts in 1..T: truncated geometric with ``p`` per draft, or from real text."""
    g = torch.Generator().manual_seed(seed)
    if acceptance == "text":
        pool = text_acceptance(T)
        return pool[torch.randint(len(pool), (steps, batch), generator=g)]
    ok = torch.rand(steps, batch, T - 1, generator=g) < float(acceptance)
    return 1 + ok.long().cumprod(-1).sum(-1)


def bench_case(shape, batch, T, L, acceptance, timer, device, steps=16, seed=0, verify_form="auto") -> dict:
    """One table row: ``steps`` speculative steps (acceptance counts differ per step and row) timed as one run."""
    from ..templates.snapshot import snapshot_commit, snapshot_table, snapshot_verify  # noqa: PLC0415
    from ..templates.standard import standard_step  # noqa: PLC0415

    fam = get_family(shape.family)
    kw = dict(delta=fam.delta, decay=fam.decay, layout=shape.layout)
    x = draw_inputs(shape, batch, T, device, seed)
    n = draw_accepted(acceptance, T, batch, steps, seed).to(device)
    mean_n = float(n.float().mean())

    rs = ReplayState(draw_state(shape, batch, device, seed), fam, L, layout=shape.layout, k_heads=shape.k_heads,
                     verify_form=verify_form)
    rs.count.copy_(torch.randint(0, L + 1, (batch,), generator=torch.Generator().manual_seed(seed)))  # phases

    def replay_steps():
        for s in range(steps):
            rs.verify(*x)
            rs.commit(n[s])

    states = draw_state(shape, batch * (1 + T), device, seed)
    table = snapshot_table(batch, T, device=device)
    out = torch.empty(batch, T, shape.heads, shape.head_v, device=device)

    def snapshot_steps():
        for s in range(steps):
            snapshot_verify(states, *x, table=table, out=out, **kw)
            table.copy_(snapshot_commit(table, n[s]))

    one = draw_state(shape, batch, device, seed)
    x1 = type(x)(*(None if f is None else f[:, 0] for f in x))
    rows = {}
    for name, fn, steps in (("replay", replay_steps, steps), ("snapshot", snapshot_steps, steps),
                            ("standard step", lambda: standard_step(one, *x1, **kw), 1)):
        us, how = timer(fn)
        rows[name] = {"us": us / steps, "timing": how}
    per_seq = {"replay": rs.memory_report()["per_slot"], "snapshot": (1 + T) * state_bytes(shape)}
    for name in ("replay", "snapshot"):
        r = rows[name]
        r["accepted_tok_s"] = batch * mean_n / (r["us"] * 1e-6)
        r["bytes_per_seq"] = per_seq[name]
        r["seqs_in_80GB"] = int(BUDGET // per_seq[name])
    return {"shape": shape.family, "batch": batch, "T": T, "L": L, "acceptance": acceptance,
            "mean_accepted": mean_n, **{k: v for k, v in rows.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="replayssm bench spec", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="nemotron3-super-mamba2,qwen3.5-122b-gdn")
    p.add_argument("--T", default="1,2,4,8", help="tokens verified per row per step")
    p.add_argument("--batch", default="32,128,256,512")
    p.add_argument("--acceptance", default="0.5,0.8,1.0,text")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--steps", type=int, default=16, help="speculative steps per timed run")
    p.add_argument("--verify-form", default="auto",
                   help="replay's verify: auto | tokens | chunked[:k=v,...] (templates/verify_forms.py)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="bench_spec.json")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: a check of the harness")
    args = p.parse_args(argv)
    try:
        verify_forms.parse(args.verify_form)
    except ValueError as e:
        p.error(str(e))
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the templates import triton
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    names = ["smoke-gdn", "smoke-mamba2"] if args.smoke else args.shapes.split(",")
    if args.smoke:
        args.T, args.batch, args.acceptance, args.window, args.steps = "2", "3", "0.5,text", 4, 2
    Ts, batches = [int(t) for t in args.T.split(",")], [int(b) for b in args.batch.split(",")]
    accs = args.acceptance.split(",")
    timer = Timer(args.device, warmup_ms=10, rep_ms=50)
    cases = [(s, t, b, a) for s in names for t in Ts for b in batches for a in accs]
    meta = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "argv": argv or sys.argv[1:],
            "verify_form": args.verify_form}
    results = []
    for i, (s, T, b, a) in enumerate(cases):
        print(f"\r[{i + 1}/{len(cases)}] {s} T={T} batch={b} acceptance={a}" + " " * 20, end="", file=sys.stderr,
              flush=True)
        results.append(bench_case(shapes[s], b, T, max(args.window, T), a, timer, args.device, args.steps,
                                  verify_form=args.verify_form))
        _dump({"meta": meta, "results": results}, args.out)  # after every case: a run cut short keeps what it measured
    print(file=sys.stderr)
    print(format_table(results))
    print(f"\nwrote {args.out}")
    return 0


def format_table(results) -> str:
    head = (f"{'shape':<24}{'T':>3}{'batch':>6}{'accept':>7}{'n/row':>6}{'replay us':>10}{'snap us':>9}"
            f"{'std us':>8}{'replay/std':>11}{'tok/s x':>8}{'MB/seq r|s':>14}{'seqs@80GB r|s':>16}")
    lines = [head, "-" * len(head)]
    for r in results:
        rp, sn, st = r["replay"], r["snapshot"], r["standard step"]
        lines.append(f"{r['shape']:<24}{r['T']:>3}{r['batch']:>6}{str(r['acceptance']):>7}{r['mean_accepted']:>6.2f}"
                     f"{rp['us']:>10.1f}{sn['us']:>9.1f}{st['us']:>8.1f}{rp['us'] / st['us']:>11.2f}"
                     f"{rp['accepted_tok_s'] / sn['accepted_tok_s']:>8.2f}"
                     f"{rp['bytes_per_seq'] / 2**20:>7.1f}|{sn['bytes_per_seq'] / 2**20:<6.1f}"
                     f"{rp['seqs_in_80GB']:>8}|{sn['seqs_in_80GB']:<7}")
    lines.append("tok/s x: replay's accepted tokens per second over the snapshot path's (same run);"
                 " r|s: replay | snapshot")
    return "\n".join(lines)
