"""``replayssm demo``: a tiny hybrid LM decoded eagerly, with torch.compile's default, and with ``replayssm``.

The model (``replay_compile.toy.HybridLM``: attention + Mamba-2 + Gated DeltaNet + KDA layers, plain
PyTorch, random weights, no download) decodes the same tokens three ways from the same caches. The
demo prints which layers the backend rewrote (the ``explain`` report), the largest logit difference
against eager at any step, and decode tokens per second. ``--runtime`` runs the runtime demo instead
(every family's ``ReplayState`` against the standard recurrence).
"""
from __future__ import annotations

import argparse
import time

import torch

from .api import explain, materialize
from .toy import HybridLM


# Decode steps left out of tokens/s: the first compiles, and the second would recompile if a guard on the
# first call's input failed on the next token (a strided prompt column did: stride 12 vs 1, hence the
# contiguous first token); timing a compile measures Inductor, not decoding.
UNTIMED_STEPS = 2


def _decode(step, model, caches, first, steps):
    """Greedy-decode ``steps`` tokens from ``caches``; returns (logits [B, steps, V], seconds of the timed steps)."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            buf.copy_(caches[name])
        tok, out, start = first, [], None
        for i in range(steps):
            if i == UNTIMED_STEPS:
                if first.is_cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
            logits = step(tok[:, None])[:, -1].clone()
            model.advance(1)
            tok = logits.argmax(-1)
            out.append(logits)
        if first.is_cuda:
            torch.cuda.synchronize()
        return torch.stack(out, 1), time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="replayssm demo", description=__doc__.splitlines()[0])
    p.add_argument("--runtime", action="store_true", help="run the runtime demo (ReplayState per family)")
    p.add_argument("--layers", default="mgak", help="a: attention, m: Mamba-2, g: Gated DeltaNet, k: KDA")
    p.add_argument("--batch", type=int, default=8,
                   help="sequences (default 8: on a GPU the backend's cost model keeps batches below 8 standard)")
    p.add_argument("--steps", type=int, default=40, help="decode steps (crossing several flushes; > 2)")
    p.add_argument("--window", type=int, default=8, help="replay window L")
    p.add_argument("--read-dtype", default=None, choices=["bf16", "fp16", "fp8", "fp4"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args, rest = p.parse_known_args(argv)
    if not args.runtime and args.steps <= UNTIMED_STEPS:
        p.error(f"--steps must be > {UNTIMED_STEPS} (the first {UNTIMED_STEPS} steps are not timed)")
    if args.runtime:
        from . import demo_runtime  # noqa: PLC0415
        return demo_runtime.main(rest)
    torch.manual_seed(0)
    model = HybridLM(layers=args.layers, max_len=16 + args.steps + 2).to(args.device).eval()
    model.allocate(args.batch)
    prompt = torch.randint(0, 97, (args.batch, 12), device=args.device)
    with torch.no_grad():
        model(prompt[:, :-1])
        model.advance(prompt.shape[1] - 1)
    caches = {n: b.clone() for n, b in model.named_buffers()}
    # min_batch=1: the replay form at the demo's tiny batch (on a GPU the cost model would give it the
    # standard route, NOTE [cost model])
    options = {"window": args.window, "read_dtype": args.read_dtype, "min_batch": 1}
    print(f"tiny hybrid LM ({args.layers}: a=attention m=Mamba-2 g=GatedDeltaNet k=KDA), batch {args.batch}, "
          f"{args.steps} decode steps, device {args.device}, replayssm options {options}\n")

    report = explain(model, prompt[:, -1:], options=options)
    print("explain():")
    for s in report.sites:
        print(f"  rewritten  {s.state}: {s.family}, state {list(s.state_shape)} ({s.layout}), kernel {s.kernel}")
    for r in report.rejected:
        print(f"  left alone {r.state}: {r.reason}")

    runs = {"eager": model,
            "torch.compile": torch.compile(model),
            "replayssm": torch.compile(model, backend="replayssm", options=options)}
    ref = None
    print(f"\n{'run':<15}{'tokens/s':>10}{'max |logit - eager|':>22}{'same tokens':>13}")
    for name, step in runs.items():
        logits, secs = _decode(step, model, caches, prompt[:, -1].contiguous(), args.steps)
        if name == "replayssm":
            materialize(model)
        ref = logits if ref is None else ref
        diff = (logits - ref).abs().max().item()
        same = torch.equal(logits.argmax(-1), ref.argmax(-1))
        print(f"{name:<15}{args.batch * (args.steps - UNTIMED_STEPS) / secs:>10.1f}{diff:>22.2e}{str(same):>13}")
    ok = diff < 1e-3
    print("\nreplayssm matches eager" if ok else "\nMISMATCH against eager")
    return 0 if ok else 1
