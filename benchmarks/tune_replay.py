"""Tiling sweep of the replay template on the GPU (a development tool; figures go to BENCHMARKS.md).

For each real shape at one batch size it times, per (read format, L, block_v, num_warps, maxnreg, items,
fold_unroll, stages): ``step`` (a decode step with rows at staggered ring phases, the L-step amortized cost, as `bench kernels`)
and ``nf`` (the same call without committing: no row flushes, the cursors stay put: the non-flush path
alone), beside our standard kernel, with GB/s against the copy bandwidth of the same run and the step's ceiling
(its speedup over the standard kernel if it moved its bytes at 100% of that bandwidth); ``--verify T,...``
adds a verify of T tokens + commit of all (L = w + T for each ``--verify-window`` w, default 16; fp32 checkpoint unless
``--verify-read``) per (block_v, num_warps, maxnreg) on the token loop, and per ``--verify-form`` variant (``tokens``:
the token loop; ``chunked`` with optional ``key=value`` overrides of ``templates/verify.py``'s tiling, e.g.
``chunked:bv=32,nw=2,kc=64,st=1,dot=ieee,mr=128,bt=8``).

    python benchmarks/tune_replay.py --batch 256 --out tune.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

from replay_compile.bench.kernels import Timer, comma_list, copy_bandwidth, draw_inputs, draw_state, io_bytes, \
    real_shape, record_bytes, replay_step_bytes, staggered_replay_state, state_bytes
from replay_compile.families import get_family
from replay_compile.runtime import triton_impl
from replay_compile.templates import verify_forms
from replay_compile.templates.standard import standard_step

ACTIVATIONS = {"bf16": torch.bfloat16, "fp32": torch.float32}


def activation_list(text: str) -> list:
    names = text.split(",")
    if not set(names) <= ACTIVATIONS.keys():
        raise argparse.ArgumentTypeError(f"activations are {', '.join(ACTIVATIONS)}, not {text!r}")
    return names


def verify_form(form: str) -> dict:
    """``advance_into`` keywords of a ``--verify-form`` variant (``templates/verify_forms.py``)."""
    kind, tiling = verify_forms.parse(form)
    if kind == "auto":
        return {}
    if kind == "tokens":
        return {"chunked": False}
    return {"chunked": True, "verify_tiling": tiling}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", type=comma_list(str), default=["nemotron3-super-mamba2", "qwen3.5-122b-gdn", "kimi-linear-kda"])
    p.add_argument("--batch", type=comma_list(int), default=[256])
    p.add_argument("--read", type=comma_list(str), default=["none", "bf16", "fp8"])
    p.add_argument("--window", type=comma_list(int), default=[16])
    p.add_argument("--block-v", type=comma_list(int), default=[0])
    p.add_argument("--warps", type=comma_list(int), default=[0])
    p.add_argument("--maxnreg", type=comma_list(int), default=[0])
    p.add_argument("--items", type=comma_list(int), default=[0], help="(head, value tile) pairs a program serves")
    p.add_argument("--fold-unroll", type=comma_list(int), default=[0], help="records per flush-fold iteration")
    p.add_argument("--stages", type=comma_list(int), default=[-1], help="non-flush rows' loop: -1 the default, 0 one "
                   "loop for all rows, s > 0 a loop of their own pipelined over s stages (NOTE [two row loops])")
    p.add_argument("--flush-items", type=comma_list(int), default=[-1], help="-1 the default, 0 one launch for every "
                   "row, n > 0 the flushing rows first in a launch of n pairs a program (NOTE [flush launch])")
    p.add_argument("--nonflush-maxnreg", type=comma_list(int), default=[0], help="register cap of the non-flush rows' "
                   "launch where the flushing rows have their own (0: the default, NONFLUSH_REGISTERS or --maxnreg's; no effect "
                   "on calls of one launch)")
    p.add_argument("--nonflush-warps", type=comma_list(int), default=[0], help="warps of the non-flush rows' launch "
                   "where the flushing rows have their own (0: those of the flushing rows' launch)")
    p.add_argument("--nonflush-block-v", type=comma_list(int), default=[0], help="value tile of the non-flush rows' "
                   "launch where the flushing rows have their own (0: that of the flushing rows' launch)")
    p.add_argument("--verify", type=comma_list(int), default=[])
    p.add_argument("--verify-window", type=comma_list(int), default=[16], help="verify rows use L = w + T for each w "
                   "(as bench kernels)")
    p.add_argument("--verify-form", type=lambda s: s.split(";"), default=["auto"],
                   help="verify variants separated by ';': auto (the runtime's choice), tokens, or "
                        "chunked[:bv=,kc=,nw=,st=,dot=,mr=,bt=] (templates/verify.py's tiling)")
    p.add_argument("--verify-activations", type=activation_list, default=["bf16"],
                   help="dtypes of the verify rows' activations (bf16, fp32: what the transformers integration hands)")
    p.add_argument("--verify-read", default="none", help="read copy of the verify rows' state (none, bf16, fp8, fp4)")
    p.add_argument("--layout", choices=("kv", "vk"), help="state layout instead of the model's (e.g. GDN with keys "
                   "contiguous, as vLLM stores it)")
    p.add_argument("--no-steps", action="store_true", help="time only the standard step and the verify rows")
    p.add_argument("--out", default="tune.json")
    args = p.parse_args(argv)
    timer = Timer("cuda", 10, 30)
    bw = copy_bandwidth("cuda", 4.0, timer)
    rows = []
    print(f"copy bandwidth {bw:.0f} GB/s; replay_compile from {os.path.dirname(triton_impl.__file__)}")
    for name, B in itertools.product(args.shapes, args.batch):
        shape = real_shape(name, args.layout)
        fam = get_family(shape.family)
        x = draw_inputs(shape, B, None, "cuda", seed=B)
        st = draw_state(shape, B, "cuda", seed=1)
        std_us, _ = timer(lambda: standard_step(st, *x, delta=fam.delta, decay=fam.decay, layout=shape.layout))
        std_bytes = 2 * B * state_bytes(shape) + io_bytes(x)
        print(f"{name} ({shape.layout}) B={B} standard {std_us:.1f} us {std_bytes / std_us / 1e3 / bw:.0%} bw")
        rows.append(dict(shape=name, layout=shape.layout, batch=B, kind="standard", us=std_us))
        xt = type(x)(*(None if f is None else f[:, None] for f in x))
        for read, L, bv, nw, mr, it, fu, st, fi, nr, nn, nb in itertools.product(
                [] if args.no_steps else args.read, args.window, args.block_v, args.warps, args.maxnreg, args.items,
                args.fold_unroll, args.stages, args.flush_items, args.nonflush_maxnreg, args.nonflush_warps,
                args.nonflush_block_v):
            rs = staggered_replay_state(shape, B, L, "cuda", read)
            out = torch.empty(B, 1, rs.num_heads, rs.head_v, device="cuda")
            kw = {k: val for k, val in (("block_v", bv), ("num_warps", nw), ("max_registers", mr), ("items", it),
                                        ("fold_unroll", fu), ("nonflush_registers", nr), ("nonflush_warps", nn),
                                        ("nonflush_block_v", nb))
                  if val}
            if st >= 0:
                kw["nonflush_stages"] = st
            if fi >= 0:
                kw["flush_items"] = fi
            try:
                step_us, _ = timer(lambda: triton_impl.advance_into(rs, xt, None, out, commit=True, force_flush=False, **kw))
                nf_us, _ = timer(lambda: triton_impl.advance_into(rs, xt, None, out, commit=False, force_flush=False, **kw))
            except Exception as e:  # noqa: BLE001
                print(f"  {read} L={L} bv={bv} nw={nw} items={it} fu={fu}: {type(e).__name__}: {str(e)[:150]}")
                continue
            read_b = rs.memory_report()["read_copy"] // B
            step_bytes = replay_step_bytes(shape, fam, B, L, read_b, rs.raw_fold, x)
            nf_bytes = B * ((read_b or state_bytes(shape)) + record_bytes(shape, fam, rs.raw_fold) * (L - 1) / 2) + io_bytes(x)
            r = dict(shape=name, layout=shape.layout, batch=B, kind="replay", read=read, L=L, block_v=bv, warps=nw,
                     maxnreg=mr, items=it, fold_unroll=fu, stages=st, flush_items=fi, nonflush_maxnreg=nr,
                     nonflush_warps=nn, nonflush_block_v=nb,
                     step_us=step_us,
                     nf_us=nf_us, step_bw=step_bytes / step_us / 1e3 / bw, nf_bw=nf_bytes / nf_us / 1e3 / bw,
                     speedup=std_us / step_us,
                     ceiling=std_us * bw * 1e3 / step_bytes)  # the speedup of a step at 100% of copy bandwidth
            rows.append(r)
            print(f"  {read:5s} L={L:2d} bv={bv:3d} nw={nw} mr={mr} it={it} fu={fu} st={st} fi={fi} nr={nr} nn={nn} "
                  f"nb={nb}: step {step_us:7.1f} us ({r['step_bw']:.0%} bw, "
                  f"{r['speedup']:.2f}x std of {r['ceiling']:.2f}x)  non-flush {nf_us:7.1f} us ({r['nf_bw']:.0%} bw)",
                  flush=True)
            del rs
        for T, w, bv, nw, mr, form, act in itertools.product(args.verify, args.verify_window, args.block_v, args.warps,
                                                             args.maxnreg, args.verify_form, args.verify_activations):
            L = w + T
            xv = draw_inputs(shape, B, T, "cuda", seed=B + T, activations=ACTIVATIONS[act])
            rs = staggered_replay_state(shape, B, L, "cuda", args.verify_read, tokens=T)
            n_all = torch.full((B,), T, dtype=torch.int64, device="cuda")
            out = torch.empty(B, T, rs.num_heads, rs.head_v, device="cuda")
            kw = {k: val for k, val in (("block_v", bv), ("num_warps", nw), ("max_registers", mr)) if val}
            kw.update(verify_form(form))
            def ver():  # rs.verify + rs.commit, with the tiling overrides
                triton_impl.advance_into(rs, xv, None, out, commit=False, force_flush=False, **kw)
                triton_impl.commit(rs, n_all, None)
            try:
                us, _ = timer(ver)
            except Exception as e:  # noqa: BLE001
                print(f"  verify T={T} L={L} bv={bv} nw={nw} mr={mr}: {type(e).__name__}: {str(e)[:150]}")
                continue
            rows.append(dict(shape=name, layout=shape.layout, batch=B, kind="verify", T=T, L=L, read=args.verify_read,
                             block_v=bv, warps=nw, maxnreg=mr, form=form, activations=act, us=us, vs_std=us / std_us))
            print(f"  verify T={T} L={L} {args.verify_read} {act} {form} bv={bv} nw={nw} mr={mr}: {us:.1f} us = "
                  f"{us / std_us:.2f}x std step", flush=True)
            del rs
        with open(args.out, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
