"""Run a few replay decode steps of one real shape, for a profiler (Nsight Compute) to read.

    ncu --clock-control none -k regex:replay_kernel -c 1 --section SpeedOfLight \
        python3 benchmarks/profile_replay.py nemotron3-super-mamba2 --read fp8

Rows sit at staggered ring phases (``count[b] = b % L``) as in ``bench kernels``; ``--no-commit`` keeps
the cursors still, so every profiled launch is the non-flush path alone.
"""
from __future__ import annotations

import argparse

import torch

from replay_compile.bench.kernels import SHAPES, draw_inputs, draw_state
from replay_compile.families import get_family
from replay_compile.runtime import ReplayState, triton_impl


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--read", default="none")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-commit", action="store_true")
    args = p.parse_args(argv)
    shape, B, L = SHAPES[args.shape], args.batch, args.window
    fam = get_family(shape.family)
    x = draw_inputs(shape, B, None, "cuda", seed=B)
    x = type(x)(*(None if f is None else f[:, None] for f in x))
    rs = ReplayState(draw_state(shape, B, "cuda", seed=1), fam, L, layout=shape.layout, k_heads=shape.k_heads,
                     read_dtype=None if args.read == "none" else args.read, validate=False, kernels="triton")
    rs.count.copy_(torch.arange(B, device="cuda") % L)
    out = torch.empty(B, 1, rs.num_heads, rs.head_v, device="cuda")
    for _ in range(args.steps):
        triton_impl.advance_into(rs, x, None, out, commit=not args.no_commit, force_flush=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
