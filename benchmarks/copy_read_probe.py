"""How fast can a plain kernel read a read copy? The non-flush rows' floor, without replay's window.

On the H200 (2026-12-07, BENCHMARKS.md) the non-flush rows of an fp8 copy ran at 32-42% of the copy bandwidth and
those of the fp32 checkpoint at 76-89%. This probe reads the same bytes in the same key-major layout (``[K, V]``
a head, fp8 codes with one fp32 scale a value column, or fp32) and does the least the replay must do with them:
the two reductions over keys that a delta-rule row needs (``S^T q`` and ``S^T k``), nothing else. Swept over the
things the replay template fixes (value tile, warps, pairs a program, how many contiguous values a thread loads,
pipelining of a program's pairs), it says whether the replay's tiling can reach the bandwidth at all, and which
tiling does: if the probe is slow at the template's tiling too, the tiling is the cause; if not, the window's work is.

    python benchmarks/copy_read_probe.py --batch 256 --heads 64 --out probe.json

Each row is checked against a float64 reference on fresh inputs (outputs poisoned first) before it is timed.
Run under ``TRITON_INTERPRET=1`` with ``--batch 2 --heads 3`` on a CPU as a check of the kernel itself.
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton
import triton.language as tl

from replay_compile.bench.kernels import Timer, comma_list, copy_bandwidth


@triton.jit
def copy_read_kernel(data, scale, q, k, out, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BV: tl.constexpr, ITEMS: tl.constexpr, CONTIG: tl.constexpr, FP8: tl.constexpr,
                     STAGES: tl.constexpr):
    """Program ``(b, part)`` serves pairs ``[part * ITEMS, (part + 1) * ITEMS)`` of row ``b``'s (head, value tile)
    pairs. ``data [B, HV, K, V]`` (fp8 codes with ``scale [B, HV, V]``, or fp32), ``q, k [B, HV, K]`` fp32;
    ``out [2, B, HV, V]``: ``S^T q`` and ``S^T k``."""
    b = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    NVT: tl.constexpr = V // BV
    offs_k = tl.arange(0, K)
    cols = tl.arange(0, BV)
    for i in tl.range(0, ITEMS, num_stages=STAGES):
        item = tl.minimum(part * ITEMS + i, HV * NVT - 1)  # a repeated last pair rewrites what it wrote
        head = b * HV + item // NVT
        offs_v = (item % NVT) * BV + cols
        tile = data + head * K * V + offs_k[:, None] * V + offs_v[None, :]
        x = tl.load(tl.max_contiguous(tile, [1, CONTIG])).to(tl.float32)
        if FP8:
            x = x * tl.load(scale + head * V + offs_v)[None, :]
        xq = tl.load(q + head * K + offs_k)
        xk = tl.load(k + head * K + offs_k)
        tl.store(out + head * V + offs_v, tl.sum(x * xq[:, None], 0))
        tl.store(out + (tl.num_programs(0) * HV + head) * V + offs_v, tl.sum(x * xk[:, None], 0))


def draw(batch: int, heads: int, K: int, V: int, fp8: bool, device: str) -> dict:
    """Fresh inputs: the copy's codes (or fp32 values), its scales, a query and a key a head."""
    values = torch.randn(batch, heads, K, V, device=device)
    if fp8:
        s = values.abs().amax(2) / 448.0
        data = (values / s[:, :, None, :]).to(torch.float8_e4m3fn)
    else:
        data, s = values, torch.ones(batch, heads, V, device=device)
    return dict(data=data, scale=s.contiguous(), q=torch.randn(batch, heads, K, device=device),
                k=torch.randn(batch, heads, K, device=device))


def reference(x: dict) -> torch.Tensor:
    """``[2, B, HV, V]`` in float64: the dequantized tile's reductions against the query and the key."""
    s = x["data"].double() * x["scale"].double()[:, :, None, :]
    return torch.stack([torch.einsum("bhkv,bhk->bhv", s, x[n].double()) for n in ("q", "k")])


def launch(x: dict, out: torch.Tensor, bv: int, warps: int, items: int, contig: int, stages: int) -> None:
    batch, heads, K, V = x["data"].shape
    grid = (batch, triton.cdiv(heads * (V // bv), items))
    copy_read_kernel[grid](x["data"], x["scale"], x["q"], x["k"], out, heads, K, V, bv, items, contig,
                           x["data"].dtype == torch.float8_e4m3fn, stages, num_warps=warps)


def check(x: dict, out: torch.Tensor, config: tuple) -> float:
    """Relative RMS error of one launch against the float64 reference (outputs poisoned first)."""
    out.fill_(float("nan"))
    launch(x, out, *config)
    want = reference(x)
    err = ((out.double() - want).pow(2).mean() / want.pow(2).mean()).sqrt().item()
    if not err < 1e-5:
        raise AssertionError(f"probe {config}: relative RMS error {err:.3g}")
    return err


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--heads", type=int, default=64, help="value heads a row (GDN 122B: 64, KDA: 32)")
    p.add_argument("--dims", type=int, default=128, help="K = V")
    p.add_argument("--read", type=comma_list(str), default=["fp8", "fp32"])
    p.add_argument("--block-v", type=comma_list(int), default=[32, 64, 128])
    p.add_argument("--warps", type=comma_list(int), default=[2, 4, 8])
    p.add_argument("--items", type=comma_list(int), default=[1, 4])
    p.add_argument("--contig", type=comma_list(int), default=[4, 16], help="contiguous values a load claims")
    p.add_argument("--stages", type=comma_list(int), default=[1, 2])
    p.add_argument("--out")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = Timer(device, 25, 100)
    bandwidth = copy_bandwidth(device, 2.0, timer) if device == "cuda" else float("nan")
    print(f"copy bandwidth {bandwidth:.0f} GB/s; batch {args.batch} x {args.heads} heads, K = V = {args.dims}")
    rows = []
    for read in args.read:
        x = draw(args.batch, args.heads, args.dims, args.dims, read == "fp8", device)
        out = torch.empty(2, args.batch, args.heads, args.dims, device=device)
        moved = sum(t.numel() * t.element_size() for t in x.values()) + out.numel() * 4
        for config in itertools.product(args.block_v, args.warps, args.items, args.contig, args.stages):
            err = check(draw(args.batch, args.heads, args.dims, args.dims, read == "fp8", device), out, config)
            us, _ = timer(lambda: launch(x, out, *config))
            gbs = moved / us / 1e3
            rows.append(dict(read=read, block_v=config[0], warps=config[1], items=config[2], contig=config[3],
                             stages=config[4], us=us, gbs=gbs, of_bandwidth=gbs / bandwidth, rel_rms=err))
            print(f"{read:5s} bv {config[0]:3d} warps {config[1]} items {config[2]} contig {config[3]:2d} "
                  f"stages {config[4]}: {us:8.1f} us {gbs:7.0f} GB/s {100 * gbs / bandwidth:5.1f}%", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(bandwidth_gbs=bandwidth, batch=args.batch, heads=args.heads, dims=args.dims, rows=rows),
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
