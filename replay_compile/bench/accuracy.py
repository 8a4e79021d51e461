"""``replayssm bench accuracy``: split-precision error against a float64 reference over long decodes.

Every variant decodes the same random token stream as a float64 standard recurrence; we record the
relative output error and the KL divergence of a proxy softmax head (a fixed random projection of the
layer output to 512 logits) at log-spaced lengths. Half the heads have long memory (per-step decay in
0.9999..0.99999), half short memory (0.97..0.99): long-memory heads are where precision matters.

Variants: the fp32 standard recurrence; pure states stored in bf16 / fp8 / fp4 (re-quantized after
every token, the error feeds back); the replay form with an fp32 checkpoint and a bf16 / fp8 / fp4 read
copy (re-quantized from the checkpoint at flushes only); an fp16 checkpoint with round-to-nearest and
with stochastic rounding.

On CUDA the loop runs as CUDA-graph replays of ``--chunk`` tokens (inputs drawn inside the graph), so
128K tokens take seconds, not minutes.

``--hf`` runs the same comparison inside a transformers hybrid model instead (``bench.hf_accuracy``:
next-token KL against the model in float64; ``replayssm bench accuracy --hf --help``).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from ..families import get_family
from ..families.base import Canonical, l2norm, standard_step
from ..runtime import ReplayState, quant

VOCAB = 512
LONG = (math.log(0.9999), math.log(0.99999))
SHORT = (math.log(0.97), math.log(0.99))
SHAPES = {  # family: (Hv, Hk, K, V): real head sizes, few heads
    "mamba2": (8, 1, 128, 64),
    "gated_deltanet": (8, 2, 128, 128),
    "kda": (8, 8, 128, 128),
}
PAIRS = (("bf16", "bf16 state", "ckpt fp32 + bf16 read"), ("fp8", "fp8 state", "ckpt fp32 + fp8 read"),
         ("fp4", "fp4 state", "ckpt fp32 + fp4 read"))


class StandardVariant:
    """Standard recurrence whose state is stored in ``store`` (None: ``dtype``) after every token."""

    def __init__(self, state, delta, store=None, dtype=torch.float32):
        self.delta, self.fmt = delta, quant.read_format(store)
        self.S = state.to(dtype).clone()
        self.parts = None if self.fmt is None else self.fmt.quantize(self.S)

    def step(self, x):
        S = self.S if self.fmt is None else self.fmt.dequantize(self.parts, self.S.shape[-1])
        o, S = standard_step(S, x, delta=self.delta)
        if self.fmt is None:
            self.S.copy_(S)
        else:
            for k, v in self.fmt.quantize(S).items():
                self.parts[k].copy_(v)
        return o


class ReplayVariant:
    def __init__(self, state, family, window, Hk, read=None, ckpt=torch.float32, sr=False):
        self.rs = ReplayState(state.to(ckpt).clone(), family, window, k_heads=Hk, read_dtype=read,
                              stochastic_rounding=sr, seed=1234)

    def step(self, x):
        return self.rs.step(*x)


def decay_bounds(Hv, long_heads, device):
    """Per-head log-decay ranges ``(lo, hi) [Hv]``: long memory on the first ``long_heads`` heads."""
    lo = torch.tensor([LONG[0] if h < long_heads else SHORT[0] for h in range(Hv)], device=device)
    hi = torch.tensor([LONG[1] if h < long_heads else SHORT[1] for h in range(Hv)], device=device)
    return lo, hi


def _inputs(fam, B, Hv, Hk, K, V, lo, hi, gen, device):
    """One token of canonical inputs with log-decays in ``[lo, hi]`` per head (see module docstring)."""
    r = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    shape = (B, Hv) if fam.decay == "scalar" else (B, Hv, K)
    u = torch.rand(*shape, device=device, generator=gen)
    bounds = (lo, hi) if fam.decay == "scalar" else (lo[:, None], hi[:, None])
    log_a = bounds[0] + (bounds[1] - bounds[0]) * u
    q, k, v = r(B, Hk, K), r(B, Hk, K), r(B, Hv, V)
    if fam.delta:
        q, k = l2norm(q) * K ** -0.5, l2norm(k)
        beta = torch.rand(B, Hv, device=device, generator=gen) * 0.8 + 0.1
        return Canonical(q, k, v, log_a, beta)
    return Canonical(q * K ** -0.5, k * K ** -0.5, v, log_a, None)


def _metrics(o, ref, W, groups):
    """Per head group: relative error and KL(ref || o) of the proxy head, as a [2, G] tensor."""
    out = []
    for g, heads in enumerate(groups):
        a, b = o[:, heads].double().flatten(1), ref[:, heads].flatten(1)
        err = (a - b).norm() / b.norm()
        rms = b.pow(2).mean().sqrt().clamp_min(1e-30)  # logits of the reference keep std ~3 as the state grows
        lp, lq = torch.log_softmax(b @ W[g] / rms, -1), torch.log_softmax(a @ W[g] / rms, -1)
        kl = (lp.exp() * (lp - lq)).sum(-1).mean()
        out.append(torch.stack([err, kl]))
    return torch.stack(out, 1).float()


def run_family(name, args, device):
    fam = get_family(name)
    Hv, Hk, K, V = SHAPES[name] if not args.smoke else (4, 1, 16, 8)
    B, long_heads = args.batch, Hv // 2
    groups = [slice(0, long_heads), slice(long_heads, Hv)]  # slices: no index tensors inside a CUDA graph
    torch.manual_seed(args.seed)  # CUDA graphs draw from the default generator
    gen = None if device.type == "cuda" else torch.Generator().manual_seed(args.seed)
    ref_S = torch.zeros(B, Hv, K, V, dtype=torch.float64, device=device)
    variants = {"fp32 standard": StandardVariant(ref_S, fam.delta)}
    for fmt, pure, split in PAIRS:
        variants[pure] = StandardVariant(ref_S, fam.delta, fmt)
        variants[split] = ReplayVariant(ref_S.float(), fam, args.window, Hk, read=fmt)
    variants["ckpt fp16"] = ReplayVariant(ref_S.float(), fam, args.window, Hk, ckpt=torch.float16)
    variants["ckpt fp16 + SR"] = ReplayVariant(ref_S.float(), fam, args.window, Hk, ckpt=torch.float16, sr=True)
    # proxy head: a fixed projection of each head group's outputs to VOCAB logits
    W = torch.randn(2, long_heads * V, VOCAB, dtype=torch.float64, device=device, generator=gen)
    W *= 3.0 / math.sqrt(long_heads * V)

    lo, hi = decay_bounds(Hv, long_heads, device)  # made outside the CUDA graph (no host copies inside)

    def one_token(t_out):
        x = _inputs(fam, B, Hv, Hk, K, V, lo, hi, gen, device)
        o_ref, new_ref = standard_step(ref_S, Canonical(*(None if f is None else f.double() for f in x)),
                                       delta=fam.delta)
        ref_S.copy_(new_ref)  # in place: a CUDA graph replays on fixed addresses
        for i, var in enumerate(variants.values()):
            o = var.step(x)
            if t_out is not None:
                t_out[i].copy_(_metrics(o, o_ref, W, groups))

    # only the `avg` tokens before each reported length are measured (metrics cost more than the steps)
    chunk = args.chunk if device.type == "cuda" else args.avg
    assert args.avg <= chunk and args.first % chunk == 0, "--avg <= --chunk and --first a multiple of --chunk"
    n_chunks = args.steps // chunk
    measured = {t // chunk - 1 for t in _checkpoints(n_chunks * chunk, args.first)}
    buf = torch.zeros(chunk, len(variants), 2, 2, device=device)
    runs = {False: lambda: [one_token(None) for _ in range(chunk)],
            True: lambda: [one_token(buf[c]) for c in range(chunk)]}
    if device.type == "cuda":
        for m in (False, True):
            runs[m]()  # warm up (compiles kernels) outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                runs[m]()
            runs[m] = graph.replay
    hist, start = {}, time.perf_counter()
    for c in range(n_chunks):
        runs[c in measured]()
        if c in measured:
            hist[(c + 1) * chunk] = buf[chunk - args.avg:].mean(0).cpu()
        if args.progress and c % max(1, n_chunks // 10) == 0:
            print(f"  {name}: {c * chunk:>7}/{n_chunks * chunk} tokens", flush=True)
        if args.max_seconds is not None and hist and time.perf_counter() - start > args.max_seconds:
            print(f"  {name}: stopped after {(c + 1) * chunk} tokens (--max-seconds {args.max_seconds:g})")
            break
    elapsed = time.perf_counter() - start
    if args.progress:
        print(f"  {name}: {n_chunks * chunk} tokens in {elapsed:.1f} s")
    return _summarize(hist, list(variants)), elapsed


def _checkpoints(steps, first):
    pts, t = [], first
    while t <= steps:
        pts.append(t)
        t *= 2
    return pts


def _summarize(hist, names):
    """``{variant: {"long"|"short": {length: {"err", "kl"}}}}`` from ``hist[length] = [variant, metric, group]``."""
    return {name: {group: {t: {"err": float(h[i, 0, g]), "kl": float(h[i, 1, g])} for t, h in sorted(hist.items())}
                   for g, group in enumerate(("long", "short"))}
            for i, name in enumerate(names)}


def kl_gain(pure: float, split: float) -> float:
    """How many times lower the split precision's KL is than the pure state's. A pure state that diverged
    (non-finite KL: a 4-bit state does within a few thousand tokens) loses to any finite split: inf."""
    if not math.isfinite(split):
        return 0.0
    return pure / max(split, 1e-300) if math.isfinite(pure) else math.inf


def _targets(name, res, fam):
    """The issue's targets on long-memory heads, as (description, value, ok) rows."""
    long = {v: res[v]["long"] for v in res}
    ts = sorted(next(iter(long.values())))
    first, last = ts[0], ts[-1]
    rows = []
    for split in ("ckpt fp32 + bf16 read", "ckpt fp32 + fp8 read", "ckpt fp32 + fp4 read"):
        ratio = long[split][last]["err"] / long[split][first]["err"]
        rows.append((f"{split}: err {last} / err {first} <= 1.5", ratio, ratio <= 1.5))
    late = [t for t in ts if t >= 65536] or [last]
    for fmt, pure, split in PAIRS:
        gain = min(kl_gain(long[pure][t]["kl"], long[split][t]["kl"]) for t in late)
        rows.append((f"KL {pure} / KL {split} at >= {late[0]} >= 20", gain, gain >= 20))
    if fam.decay == "scalar" and not fam.delta:
        kl = long["ckpt fp32 + fp4 read"][last]["kl"]
        rows.append((f"fp4 read copy KL at {last} <= 0.05", kl, kl <= 0.05))
    return rows


def add_length_arguments(p: argparse.ArgumentParser, *, steps: int, out: str, smoke: str, max_seconds: str,
                         plot: str) -> None:
    """The options both accuracy harnesses share (lengths, window, device, outputs), with their own defaults/help."""
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--first", type=int, default=1024, help="first reported length (then doubling)")
    p.add_argument("--avg", type=int, default=64, help="tokens averaged before each reported length")
    p.add_argument("--smoke", action="store_true", help=smoke)
    p.add_argument("--max-seconds", type=float, default=None, help=max_seconds)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=out)
    p.add_argument("--plot", default=None, help=plot)
    p.add_argument("--no-progress", dest="progress", action="store_false")


def parse_length_arguments(p: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parse; ``--smoke`` shrinks the run to a CPU check (64 steps at most, reports from 16, window 4)."""
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.first, args.avg, args.window = min(args.steps, 64), 16, 8, 4
    return args


def main(argv=None) -> int:
    argv = list(argv) if argv is not None else None
    if argv is not None and "--hf" in argv:
        from . import hf_accuracy  # noqa: PLC0415  (needs transformers)

        return hf_accuracy.main([a for a in argv if a != "--hf"])
    p = argparse.ArgumentParser(prog="replayssm bench accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--hf", action="store_true", help="run inside a transformers hybrid model (bench.hf_accuracy)")
    p.add_argument("--families", default="mamba2,gated_deltanet,kda")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--chunk", type=int, default=128, help="tokens per CUDA-graph replay")
    add_length_arguments(p, steps=131072, out="accuracy.json", smoke="tiny heads, few steps: a CPU check of the harness",
                         max_seconds="per family: stop decoding after this long, reporting the lengths reached",
                         plot="write a log-log PNG of error against tokens (needs matplotlib)")
    args = parse_length_arguments(p, argv)
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    results, report = {}, {"args": vars(args), "device": gpu,
                           "shapes": SHAPES, "families": {}}
    all_ok = True
    for name in args.families.split(","):
        res, secs = run_family(name, args, device)
        results[name] = res
        targets = _targets(name, res, get_family(name))
        report["families"][name] = {"results": res, "seconds": secs,
                                    "targets": [dict(check=c, value=v, ok=ok) for c, v, ok in targets]}
        _print_family(name, res, targets)
        all_ok &= all(ok for *_, ok in targets)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")
    if args.plot:
        _plot(results, args.plot)
    return 0 if all_ok or args.smoke else 1


def _print_family(name, res, targets):
    ts = sorted(next(iter(res.values()))["long"])
    show = sorted({ts[0], ts[len(ts) // 2], ts[-1]})
    print(f"\n{name}: long-memory heads (short-memory in brackets), relative output error | proxy-head KL")
    head = f"{'variant':<24}" + "".join(f"{'err@' + str(t):>20}" for t in show) + "".join(
        f"{'KL@' + str(t):>20}" for t in show)
    print(head + "\n" + "-" * len(head))
    for var, by in res.items():
        cells = [f"{by['long'][t]['err']:.2e} ({by['short'][t]['err']:.1e})" for t in show]
        cells += [f"{by['long'][t]['kl']:.2e} ({by['short'][t]['kl']:.1e})" for t in show]
        print(f"{var:<24}" + "".join(f"{c:>20}" for c in cells))
    for check, value, ok in targets:
        print(f"  [{'ok' if ok else 'MISS'}] {check}: {value:.3g}")


def _plot(results, path):
    import matplotlib  # noqa: PLC0415  (optional dependency: the `plot` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        for var, by in res.items():
            ts = sorted(by["long"])
            ax.loglog(ts, [by["long"][t]["err"] for t in ts], marker="o", ms=3, label=var)
        ax.set_title(f"{name}: long-memory heads")
        ax.set_xlabel("tokens")
        ax.set_ylabel("relative output error vs float64")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
