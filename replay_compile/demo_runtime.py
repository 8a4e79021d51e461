"""``replayssm demo``: every family decoded in replay form next to the standard recurrence.

For each registered family it runs a few hundred decode steps of a small slot pool (rows at their
own ring phases, one padding row) through :class:`ReplayState`, and the same tokens through the
standard recurrence in float64, then prints the largest output error, the checkpoint writes
(flushes) against the standard path's one write per token, and memory per slot.
"""
from __future__ import annotations

import argparse
import time

import torch

from .families import families as registered_families
from .runtime import ReplayState
from .testing import StandardPool, random_canonical, rel_rms, token


def _run_family(fam, args, device):
    g = torch.Generator().manual_seed(args.seed)
    n_slots, heads, k_heads, K, V = 5, 4, 2, 16, 24
    x, state = random_canonical(fam, n_slots, heads, K, V, k_heads, tokens=args.steps, generator=g,
                                layout="kv", dtype=torch.float64)
    oracle = StandardPool(state, fam, "kv")
    rs = ReplayState(state.float().to(device), fam, args.window, k_heads=k_heads, read_dtype=args.read_dtype)
    slots = torch.tensor([3, 0, -1, 4, 1])  # slot 2 idle, one padding row
    for t in range(args.window // 2):  # stagger the ring phases: slots 3 and 0 start early
        early = torch.tensor([3, 0, -1, -1, -1])
        rs.step(*(None if f is None else f.float().to(device) for f in token(x, t, early.clamp(min=0))),
                slots=early.to(device))
        oracle.step(token(x, t, early.clamp(min=0)), early)
    worst, start = 0.0, time.perf_counter()
    for t in range(args.window // 2, args.steps):
        xt = token(x, t, slots.clamp(min=0))
        o = rs.step(*(None if f is None else f.float().to(device) for f in xt), slots=slots.to(device))
        worst = max(worst, rel_rms(o, oracle.step(xt, slots)))
    elapsed = time.perf_counter() - start
    rs.materialize()
    mem = rs.memory_report()
    return dict(family=fam.name, template=fam.template, steps=args.steps, max_err=worst,
                state_err=rel_rms(rs.state, oracle.state), flushes=int(rs.flushes.sum()),
                standard_writes=(args.steps - args.window // 2) * 4 + (args.window // 2) * 2,
                ring_kb=mem["ring"] / n_slots / 1024, ckpt_kb=mem["checkpoint"] / n_slots / 1024,
                read_kb=mem["read_copy"] / n_slots / 1024, ms_per_step=1e3 * elapsed / args.steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="replayssm demo --runtime", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--window", type=int, default=8, help="ring window L")
    p.add_argument("--read-dtype", default=None, choices=[None, "bf16", "fp16", "fp8", "fp4"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"ReplaySSM runtime demo: {args.steps} decode steps per family, L={args.window}, "
          f"read copy {args.read_dtype or 'none'}, device {args.device}; 5 rows (1 padding) over 5 slots, "
          "fp32 replay vs float64 standard recurrence\n")
    head = (f"{'family':<15}{'template':<15}{'max out err':>12}{'state err':>11}{'ckpt writes':>12}"
            f"{'(standard)':>11}{'ckpt KB':>9}{'ring KB':>9}{'read KB':>9}{'ms/step':>9}")
    print(head + "\n" + "-" * len(head))
    ok = True
    for fam in registered_families():
        r = _run_family(fam, args, torch.device(args.device))
        ok &= r["max_err"] < (1e-5 if args.read_dtype is None else 0.2)
        print(f"{r['family']:<15}{r['template']:<15}{r['max_err']:>12.2e}{r['state_err']:>11.2e}{r['flushes']:>12}"
              f"{r['standard_writes']:>11}{r['ckpt_kb']:>9.1f}{r['ring_kb']:>9.1f}{r['read_kb']:>9.1f}"
              f"{r['ms_per_step']:>9.2f}")
    print("\nreplay outputs match the standard recurrence" if ok else "\nMISMATCH: see the errors above")
    return 0 if ok else 1
