"""Run a few replay decode steps of one real shape, for a profiler (Nsight Compute) to read.

    ncu --clock-control none -k regex:replay_kernel -c 1 --section SpeedOfLight \
        python3 benchmarks/profile_replay.py nemotron3-super-mamba2 --read fp8

Rows sit at staggered ring phases (``count[b] = b % L``) as in ``bench kernels``; ``--no-commit`` keeps
the cursors still, so every profiled launch is the non-flush path alone; ``--tokens T`` makes each call a
``T``-token one: with ``--no-commit`` that is the verify kernel (a committing call folds after it).
"""
from __future__ import annotations

import argparse

import torch

from replay_compile.bench.kernels import SHAPES, draw_inputs, real_shape, staggered_replay_state
from replay_compile.runtime import triton_impl


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--read", default="none")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-commit", action="store_true")
    p.add_argument("--tokens", type=int, default=1, help="tokens per call (T > 1: a verify-sized call)")
    p.add_argument("--layout", choices=("kv", "vk"), help="state layout instead of the shape's (as tune_replay.py)")
    args = p.parse_args(argv)
    shape, B, L = real_shape(args.shape, args.layout), args.batch, args.window
    T = args.tokens
    x = draw_inputs(shape, B, T, "cuda", seed=B)
    rs = staggered_replay_state(shape, B, L, "cuda", args.read, tokens=T)
    out = torch.empty(B, T, rs.num_heads, rs.head_v, device="cuda")
    for _ in range(args.steps):
        triton_impl.advance_into(rs, x, None, out, commit=not args.no_commit, force_flush=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
