"""``replayssm bench kernels``: replay decode kernels against the standard kernels they replace.

For each real layer shape and batch size it times one decode step of

    ours      ReplayState(..., kernels="triton").step, rows at staggered ring phases (count[b] = b % L,
              so 1/L of the rows flush per step: the time is the L-step amortized cost)
    standard  our fused standard kernel (templates/standard.py)
    fla       flash-linear-attention's fused_recurrent for the family (fla-core, when importable)
    eager     the plain-torch step (families/base.standard_step + in-place state write)
    compile   torch.compile (default mode) of that same step

and what a compiled model would run instead at that size (``route``, the cost model's choice: replay, our standard
kernel, or the original graph under Inductor) with its speed against the best standard kernel; rows under 0.95x are
listed under the table (issue 3: never lose). And, for speculative decoding, replay verify of T tokens (+ commit)
against the snapshot baseline (templates/snapshot.py) and one standard step, with the per-sequence state memory of
both.

Each time is a median of ``triton.testing.do_bench`` over replays of a CUDA graph holding one call
(GPU time without Python launch overhead, as engines run decode; direct calls where capture fails).
do_bench clears the L2 before every call, so the state is always read from HBM. Achieved GB/s is the bytes the kernel must move divided by its time,
reported as a fraction of the device copy bandwidth measured at the start of the same run; the
``floor`` is those bytes at copy bandwidth. A column that cannot run (kernels not written yet, fla
missing, ...) is ``n/a`` with the reason in the JSON, so the harness runs at every stage of the project.

``--smoke`` runs tiny shapes on the CPU (replay through the torch reference, our standard kernel
under the Triton interpreter) in seconds; CI uses it to keep this file working.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

import torch

COLUMNS = ("ours", "standard", "fla", "eager", "compile")
NEVER_LOSE = 0.95  # a compiled model's step against the best standard kernel, at every batch size (issue 3)


@dataclasses.dataclass(frozen=True)
class Shape:
    family: str
    heads: int      # Hv
    k_heads: int    # Hk (Mamba-2: groups)
    head_k: int     # K (Mamba-2: dstate)
    head_v: int     # V (Mamba-2: headdim)
    layout: str     # the layout the model stores its state in


SHAPES = {
    "nemotron3-super-mamba2": Shape("mamba2", 128, 8, 128, 64, "vk"),
    "nemotron3-nano-mamba2": Shape("mamba2", 96, 8, 128, 80, "vk"),
    "qwen3.5-122b-gdn": Shape("gated_deltanet", 64, 16, 128, 128, "kv"),
    "qwen3.5-4b-gdn": Shape("gated_deltanet", 32, 16, 128, 128, "kv"),
    "kimi-linear-kda": Shape("kda", 32, 32, 128, 128, "kv"),
}
SMOKE_SHAPES = {
    "smoke-mamba2": Shape("mamba2", 4, 2, 8, 6, "vk"),
    "smoke-gdn": Shape("gated_deltanet", 4, 2, 8, 8, "kv"),
    "smoke-kda": Shape("kda", 2, 2, 8, 8, "kv"),
}


def real_shape(name: str, layout: Optional[str] = None) -> Shape:
    """``SHAPES[name]``, with its state in ``layout`` instead of the model's when given (tools' ``--layout``)."""
    return SHAPES[name] if layout is None else dataclasses.replace(SHAPES[name], layout=layout)


FULL = dict(batch=[1, 8, 32, 128, 256, 512], window=[4, 8, 16, 32], read=["none", "bf16", "fp8", "fp4"],
            verify=[1, 2, 4, 8])
QUICK = dict(batch=[1, 256], window=[8, 16], read=["none", "fp8", "fp4"], verify=[4, 8])
SMOKE = dict(batch=[3], window=[4], read=["none", "fp8"], verify=[2])
TUNE_CONFIGS = [(bv, nw) for bv in (16, 32, 64) for nw in (1, 2, 4, 8)]


# ------------------------------------------------------------------------------------------ timing
class Timer:
    """Median time of ``fn()`` in microseconds.

    On CUDA, ``fn`` is captured in a CUDA graph (as serving engines run decode) and the graph replay
    is timed with ``do_bench``, which clears the L2 before every call: the time is the GPU's, without
    Python launch overhead. A function that cannot be captured is timed directly (``timing`` says
    which). On the CPU: the wall clock.
    """

    def __init__(self, device: str, warmup_ms: int, rep_ms: int, graphs: bool = True):
        self.device, self.warmup_ms, self.rep_ms, self.graphs = device, warmup_ms, rep_ms, graphs

    def __call__(self, fn: Callable[[], object]) -> tuple[float, str]:
        """``(microseconds, timing method)``."""
        if self.device != "cuda":
            return self._wall(fn), "wall clock"
        from triton.testing import do_bench  # noqa: PLC0415
        run, how = fn, "do_bench"
        if self.graphs:
            graph = _capture(fn)
            if graph is not None:
                run, how = graph.replay, "cuda graph"
        return 1e3 * do_bench(run, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"), how

    @staticmethod
    def _wall(fn) -> float:
        fn()
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return 1e6 * statistics.median(samples)


def _capture(fn) -> Optional["torch.cuda.CUDAGraph"]:
    """``fn`` captured in a CUDA graph after two warm-up calls on a side stream, or None if it cannot be."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:  # noqa: BLE001  (host syncs, host-side allocation checks, ...: time it directly)
        torch.cuda.synchronize()
        return None


def copy_bandwidth(device: str, gbytes: float, timer: Timer) -> float:
    """Device copy bandwidth in GB/s, counting bytes read + written (a torch copy of ``gbytes`` GB).

    Timed directly, never from a CUDA graph: a captured device-to-device copy becomes a memcpy node
    that the copy engines run at ~2.8 TB/s on the H200, against ~4.25 TB/s for the SM copy kernel.
    """
    n = int(gbytes * 1e9 / 2 / 4)
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    direct = Timer(timer.device, timer.warmup_ms, timer.rep_ms, graphs=False)
    us, _ = direct(lambda: dst.copy_(src))
    return 2 * n * 4 / us / 1e3


# ------------------------------------------------------------------------------------------ inputs
def draw_inputs(shape: Shape, batch: int, tokens: Optional[int], device: str, seed: int,
                activations: torch.dtype = torch.bfloat16):
    """Canonical inputs ``[B, (T,) ...]`` (``activations``, bf16 by default, and fp32 log-decay) drawn natively
    and mapped. fp32 activations are what the transformers integration hands the ops.

    Drawn as one sequence of ``B*T`` tokens so the family's random state (which ``make_inputs`` also
    draws) stays one slot small; the benchmark's states come from :func:`draw_state`.
    """
    from ..families import get_family  # noqa: PLC0415
    fam = get_family(shape.family)
    g = torch.Generator().manual_seed(seed)
    n = batch * (tokens or 1)
    native, _ = fam.make_inputs(1, shape.heads, shape.head_k, shape.head_v, shape.k_heads, dtype=torch.float32,
                                generator=g, layout=shape.layout, tokens=n)
    x = fam.to_canonical(**native)
    lead = (batch,) if tokens is None else (batch, tokens)
    out = []
    for name, f in zip(x._fields, x):
        if f is None:
            out.append(None)
            continue
        f = f[0].reshape(*lead, *f.shape[2:]).to(device)
        out.append(f if name == "log_a" else f.to(activations))
    return type(x)(*out)


def draw_state(shape: Shape, slots: int, device: str, seed: int) -> torch.Tensor:
    dims = (shape.head_k, shape.head_v) if shape.layout == "kv" else (shape.head_v, shape.head_k)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(slots, shape.heads, *dims, device=device, generator=g).mul_(0.5)


def staggered_replay_state(shape: Shape, batch: int, window: int, device: str, read: str = "none",
                           kernels: str = "triton", tokens: int = 1):
    """A ``ReplayState`` of ``batch`` slots of ``shape`` with rows at staggered ring phases: row ``b`` holds
    ``(b % (window // tokens)) * tokens`` records, so calls of ``tokens`` tokens flush 1 / (L / T) of the rows
    each (the L-step amortized cost in one call)."""
    from ..families import get_family  # noqa: PLC0415
    from ..runtime import ReplayState  # noqa: PLC0415
    rs = ReplayState(draw_state(shape, batch, device, seed=1), get_family(shape.family), window, layout=shape.layout,
                     k_heads=shape.k_heads, read_dtype=None if read == "none" else read, validate=False,
                     kernels=kernels)
    rs.count.copy_((torch.arange(batch, device=device) % max(window // tokens, 1)) * tokens)
    return rs


# ------------------------------------------------------------------------------------------- bytes
def io_bytes(x) -> int:
    """Bytes of a call's inputs plus its fp32 outputs."""
    inputs = sum(f.numel() * f.element_size() for f in x if f is not None)
    return inputs + x.v.numel() * 4


def state_bytes(shape: Shape, itemsize: int = 4) -> int:
    return shape.heads * shape.head_k * shape.head_v * itemsize


def record_bytes(shape: Shape, fam, raw: bool, itemsize: int = 4) -> int:
    """One ring record: k, u (+ v, beta when delta folds replay raw inputs) and the log-decay."""
    n = shape.k_heads * shape.head_k + shape.heads * shape.head_v
    n += {"none": 0, "scalar": shape.heads, "channel": shape.heads * shape.head_k}[fam.decay]
    if raw:
        n += shape.heads * shape.head_v + shape.heads
    return n * itemsize


def replay_step_bytes(shape: Shape, fam, batch: int, L: int, read_copy_per_slot: int, raw: bool, x) -> float:
    """Bytes one staggered-phase step must move, averaged over the L phases.

    Non-flush rows ((L-1)/L of them) read the read copy (the fp32 checkpoint without one); flush rows
    read the exact checkpoint, write it back and re-quantize the read copy. Every row reads its live
    records ((L-1)/2 on average) and writes one.
    """
    ckpt, read = state_bytes(shape), read_copy_per_slot
    per_row = read * (L - 1) / L + (2 * ckpt + read) / L if read else ckpt * (L + 1) / L
    per_row += record_bytes(shape, fam, raw) * ((L - 1) / 2 + 1)
    return batch * per_row + io_bytes(x)


# ----------------------------------------------------------------------------------------- columns
def _eager_step(fam, layout):
    from ..families.base import Canonical, standard_step  # noqa: PLC0415

    def step(state, q, k, v, log_a, beta):
        o, new = standard_step(state, Canonical(q, k, v, log_a, beta), delta=fam.delta, layout=layout)
        state.copy_(new)
        return o
    return step


def _fla_step(fam, layout) -> tuple[Callable, Callable]:
    """``(call, prepare)``: fla's fused_recurrent for the family on one token (``T = 1``).

    ``prepare(x)`` turns canonical inputs (q pre-scaled, l2norm applied) into fla's ``[B, 1, H, D]``
    arguments; ``call(*prepared, h0)`` returns ``(o, final_state)``.

    fla 0.6 returns the final state in a new buffer (same bytes as an in-place update). Its simple_gla
    and gla kernels need as many q/k heads as value heads: grouped q/k are expanded before timing.
    """
    if fam.template == "scalar":
        from fla.ops.simple_gla import fused_recurrent_simple_gla as fn  # noqa: PLC0415
        call = lambda q, k, v, g, b, h0: fn(q, k, v, g=g, **_fla_state(h0, layout))  # noqa: E731
    elif fam.template == "channel":
        from fla.ops.gla import fused_recurrent_gla as fn  # noqa: PLC0415
        call = lambda q, k, v, g, b, h0: fn(q, k, v, gk=g, **_fla_state(h0, layout))  # noqa: E731
    elif fam.template == "scalar_delta":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fn  # noqa: PLC0415
        call = lambda q, k, v, g, b, h0: fn(q, k, v, g=g, beta=b, **_fla_state(h0, layout))  # noqa: E731
    elif fam.template == "channel_delta":
        from fla.ops.kda import fused_recurrent_kda as fn  # noqa: PLC0415
        call = lambda q, k, v, g, b, h0: fn(q, k, v, g=g, beta=b, **_fla_state(h0, layout))  # noqa: E731
    elif fam.template == "none_delta":
        from fla.ops.delta_rule import fused_recurrent_delta_rule as fn  # noqa: PLC0415
        call = lambda q, k, v, g, b, h0: fn(q, k, v, beta=b, **_fla_state(h0, layout))  # noqa: E731
    else:
        raise NotImplementedError(f"no fla fused_recurrent for template {fam.template!r}")
    expand = fam.template in ("scalar", "channel")

    def prepare(x):
        hv = x.v.shape[1]
        q, k = x.q, x.k
        if expand and q.shape[1] != hv:
            q, k = (t.repeat_interleave(hv // t.shape[1], dim=1) for t in (q, k))
        add_t = lambda t: None if t is None else t[:, None].contiguous()  # noqa: E731
        return tuple(map(add_t, (q, k, x.v, x.log_a, x.beta)))
    return call, prepare


def _fla_state(h0, layout):
    kw = dict(scale=1.0, initial_state=h0, output_final_state=True)
    if layout == "vk":
        kw["state_v_first"] = True
    return kw


# ------------------------------------------------------------------------------------------- rows
class Bench:
    """The measurements of one run (rows of the step, verify and tuning tables) and its progress bar."""

    def __init__(self, args, timer: Timer):
        self.args, self.timer, self.device = args, timer, args.device
        self.done, self.total = 0, 0
        self.copy_gbps = float("nan")

    def progress(self, what: str):
        self.done += 1
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {what:<60}", end="",
              file=sys.stderr, flush=True)

    def measure(self, fn: Callable[[], object]) -> dict:
        """``{"us", "why", "timing"}``: ``us`` is None and ``why`` the reason when the column cannot run."""
        try:
            us, how = self.timer(fn)
            return {"us": us, "why": None, "timing": how}
        except Exception as e:  # noqa: BLE001  (any failure makes the column n/a, the run goes on)
            return {"us": None, "why": _reason(e)}

    # ----------------------------------------------------------------------------- baselines
    def baselines(self, name: str, shape: Shape, batch: int) -> dict:
        """Times of the standard columns for one (shape, batch), plus their check against ours."""
        from ..families import get_family  # noqa: PLC0415
        from ..templates.standard import standard_step  # noqa: PLC0415
        fam = get_family(shape.family)
        x = draw_inputs(shape, batch, None, self.device, seed=batch)
        state0 = draw_state(shape, batch, self.device, seed=1)
        kw = dict(delta=fam.delta, decay=fam.decay, layout=shape.layout)
        res = {"bytes": 2 * batch * state_bytes(shape) + io_bytes(x)}

        ref_state = state0.clone()
        ref_o = standard_step(ref_state, *x, **kw)
        fns = {"standard": lambda s: lambda: standard_step(s, *x, **kw)}
        if "eager" in self.args.columns:
            fns["eager"] = lambda s, f=_eager_step(fam, shape.layout): lambda: f(s, *x)
        if "compile" in self.args.columns and not self.args.smoke:
            fns["compile"] = lambda s, f=torch.compile(_eager_step(fam, shape.layout)): lambda: f(s, *x)
        if "fla" in self.args.columns:
            fns["fla"] = self._fla_column(fam, shape, x)
        for col in COLUMNS[1:]:
            if col not in self.args.columns:
                continue
            if col not in fns:
                res[col] = {"us": None, "why": "skipped in --smoke" if self.args.smoke else "not available"}
                continue
            res[col] = self._run_column(col, fns[col], state0, ref_state, ref_o, name, batch)
        return res

    def _fla_column(self, fam, shape, x):
        try:
            call, prepare = _fla_step(fam, shape.layout)
        except Exception as e:  # noqa: BLE001
            return lambda s, why=f"{type(e).__name__}: {e}": _raise(why)
        args = prepare(x)

        def make(s):
            return lambda: call(*args, s)
        return make

    def _run_column(self, col, make, state0, ref_state, ref_o, name, batch):
        self.progress(f"{name} B={batch} {col}")
        try:
            s = state0.clone()
            out = make(s)()
            o, new = (out[0].reshape(ref_o.shape), out[1]) if isinstance(out, tuple) else (out, s)
            err = max(_rel(o, ref_o), _rel(new, ref_state))
        except Exception as e:  # noqa: BLE001
            return {"us": None, "why": _reason(e)}
        return {**self.measure(make(state0.clone())), "check": err}

    # -------------------------------------------------------------------------------- replay
    def replay_step(self, shape: Shape, batch: int, L: int, read: str) -> dict:
        from ..families import get_family  # noqa: PLC0415
        fam = get_family(shape.family)
        x = draw_inputs(shape, batch, None, self.device, seed=batch + 7)
        try:
            rs = staggered_replay_state(shape, batch, L, self.device, read, self.args.replay_kernels)
        except Exception as e:  # noqa: BLE001
            return {"us": None, "why": _reason(e)}
        mem = rs.memory_report()
        read_copy = mem["read_copy"] // batch
        return {**self.measure(lambda: rs.step(*x)), "per_slot_bytes": mem["per_slot"],
                "bytes": replay_step_bytes(shape, fam, batch, L, read_copy, rs.raw_fold, x)}

    def verify(self, name: str, shape: Shape, batch: int, T: int) -> dict:
        """Replay verify T (+ commit of all T) vs snapshot verify T (+ index commit) vs one standard step."""
        from ..families import get_family  # noqa: PLC0415
        from ..templates.snapshot import snapshot_commit, snapshot_table, snapshot_verify  # noqa: PLC0415
        fam = get_family(shape.family)
        x = draw_inputs(shape, batch, T, self.device, seed=batch + T)
        kw = dict(delta=fam.delta, decay=fam.decay, layout=shape.layout)
        ckpt = state_bytes(shape)
        row = {"T": T, "snapshot_per_seq_bytes": (1 + T) * ckpt,
               "snapshot_bytes": batch * (1 + T) * ckpt + io_bytes(x)}

        self.progress(f"{name} B={batch} verify T={T} snapshot")
        table = snapshot_table(batch, T, self.device)
        states = draw_state(shape, batch * (1 + T), self.device, seed=2)
        n_all = torch.full((batch,), T, device=self.device)

        def snap():
            nonlocal table
            snapshot_verify(states, *x, table=table, **kw)
            table = snapshot_commit(table, n_all)
        row.update({f"snapshot_{k}": v for k, v in self.measure(snap).items()})
        del states

        if "ours" not in self.args.columns:
            row["replay_us"], row["replay_why"] = None, "not asked"
            return row
        self.progress(f"{name} B={batch} verify T={T} replay")
        L = self.args.verify_window + T
        try:
            rs = staggered_replay_state(shape, batch, L, self.device, kernels=self.args.replay_kernels, tokens=T)

            def replay():
                rs.verify(*x)
                rs.commit(n_all)
            row.update({f"replay_{k}": v for k, v in self.measure(replay).items()})
            row["replay_per_seq_bytes"] = rs.memory_report()["per_slot"]
            row["window"] = L
        except Exception as e:  # noqa: BLE001
            row["replay_us"], row["replay_why"] = None, _reason(e)
        return row


def comma_list(conv: Callable):
    """An argparse ``type``: ``"a,b,,c"`` -> ``[conv("a"), conv("b"), conv("c")]``."""
    return lambda s: [conv(v) for v in s.split(",") if v]


def _reason(e: Exception) -> str:
    msg = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {msg}"


def _raise(why):
    raise RuntimeError(why)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ------------------------------------------------------------------------------------------- driver
def parse_args(argv):
    p = argparse.ArgumentParser(prog="replayssm bench kernels", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=comma_list(str), help=f"comma list of {', '.join(SHAPES)} (default: all)")
    p.add_argument("--batch", type=comma_list(int), help=f"batch sizes (default {FULL['batch']})")
    p.add_argument("--window", type=comma_list(int), help=f"replay windows L (default {FULL['window']})")
    p.add_argument("--read", type=comma_list(str), help=f"read-copy formats, 'none' = fp32 (default {FULL['read']})")
    p.add_argument("--verify", type=comma_list(int), help=f"draft lengths T (default {FULL['verify']}); 0 skips verify")
    p.add_argument("--verify-window", type=int, default=16, help="verify rows use L = this + T (default 16)")
    p.add_argument("--verify-batch", type=comma_list(int), help="batch sizes of verify rows (default: 256 if measured, "
                                                         "else the largest)")
    p.add_argument("--columns", type=comma_list(str), default=list(COLUMNS), help=f"subset of {','.join(COLUMNS)}")
    p.add_argument("--quick", action="store_true", help=f"a ~4 minute GPU run: batch/L/read/T = {QUICK}")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU in seconds (CI)")
    p.add_argument("--tune", action="store_true", help="also sweep our standard kernel's (block_v, num_warps)")
    p.add_argument("--tune-batch", type=comma_list(int), help="batch sizes of the sweep (default: the verify batches)")
    p.add_argument("--timing", choices=("graph", "direct"), default="graph",
                   help="CUDA: time CUDA-graph replays (default) or direct calls, both with do_bench")
    p.add_argument("--replay-kernels", choices=("triton", "torch"), help="ReplayState kernels for 'ours' "
                   "(default: triton on CUDA, torch reference otherwise)")
    p.add_argument("--warmup-ms", type=int, help="do_bench warm-up per row (default 25 ms; 10 with --quick)")
    p.add_argument("--rep-ms", type=int, help="do_bench measuring time per row (default 100 ms; 40 with --quick)")
    p.add_argument("--copy-gb", type=float, default=4.0, help="size of the bandwidth-reference copy")
    p.add_argument("--out", default="bench_kernels.json", help="JSON results path")
    args = p.parse_args(argv)
    preset = SMOKE if args.smoke else QUICK if args.quick else FULL
    for key in ("batch", "window", "read", "verify"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    args.warmup_ms = args.warmup_ms or (10 if args.quick else 25)
    args.rep_ms = args.rep_ms or (40 if args.quick else 100)
    args.verify = [t for t in args.verify if t > 0]
    args.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    args.replay_kernels = args.replay_kernels or ("triton" if args.device == "cuda" else "torch")
    known = SMOKE_SHAPES if args.smoke else SHAPES
    args.shapes = args.shapes or list(known)
    bad = [s for s in args.shapes if s not in known] + [c for c in args.columns if c not in COLUMNS]
    if bad:
        p.error(f"unknown shape(s)/column(s) {bad}; shapes: {', '.join(known)}; columns: {', '.join(COLUMNS)}")
    if args.smoke:
        args.copy_gb = min(args.copy_gb, 0.05)
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before templates import triton
    timer = Timer(args.device, args.warmup_ms, args.rep_ms, graphs=args.timing == "graph")
    shapes = {n: (SMOKE_SHAPES if args.smoke else SHAPES)[n] for n in args.shapes}
    bench = Bench(args, timer)
    verify_batches = args.verify_batch or ([256] if 256 in args.batch else [max(args.batch)])
    tune_batches = [b for b in (args.tune_batch or verify_batches) if b in args.batch]
    n_base = sum(1 for c in COLUMNS[1:] if c in args.columns and not (args.smoke and c == "compile"))
    n_ours = "ours" in args.columns
    bench.total = len(shapes) * (len(args.batch) * (n_base + len(args.window) * len(args.read) * n_ours)
                                 + len(verify_batches) * len(args.verify) * (1 + n_ours)
                                 + (len(tune_batches) * len(TUNE_CONFIGS) if args.tune else 0))
    bench.copy_gbps = copy_bandwidth(args.device, args.copy_gb, timer)
    results = {"meta": _meta(args, argv, bench.copy_gbps), "step": [], "verify": [], "tune": []}
    for name, shape in shapes.items():
        for batch in args.batch:
            base = bench.baselines(name, shape, batch)
            if args.tune and batch in tune_batches:
                results["tune"] += _tune(bench, name, shape, batch)
            for L in args.window if "ours" in args.columns else []:
                for read in args.read:
                    bench.progress(f"{name} B={batch} L={L} read={read} ours")
                    ours = bench.replay_step(shape, batch, L, read)
                    results["step"].append(_step_row(name, shape, batch, L, read, ours, base, bench.copy_gbps))
            if "ours" not in args.columns:
                results["step"].append(_step_row(name, shape, batch, None, None, {"us": None, "why": "not asked"},
                                                 base, bench.copy_gbps))
            if batch in verify_batches:
                for T in args.verify:
                    row = bench.verify(name, shape, batch, T)
                    row.update(shape=name, batch=batch, standard_us=base["standard"]["us"])
                    results["verify"].append(row)
        _dump(results, args.out)  # after every shape: a run cut short keeps what it measured
    print(file=sys.stderr)
    print(format_tables(results))
    print(f"\nwrote {args.out}")
    return 0


def _dump(results: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def _tune(bench, name, shape, batch) -> list:
    from ..families import get_family  # noqa: PLC0415
    from ..templates.standard import standard_step  # noqa: PLC0415
    fam = get_family(shape.family)
    x = draw_inputs(shape, batch, None, bench.device, seed=batch)
    state = draw_state(shape, batch, bench.device, seed=1)
    nbytes = 2 * batch * state_bytes(shape) + io_bytes(x)
    rows = []
    for bv, nw in TUNE_CONFIGS:
        bench.progress(f"{name} B={batch} tune block_v={bv} warps={nw}")
        m = bench.measure(lambda: standard_step(state, *x, delta=fam.delta, decay=fam.decay, layout=shape.layout,
                                                block_v=bv, num_warps=nw))
        rows.append(dict(shape=name, batch=batch, block_v=bv, num_warps=nw, **m,
                         gbps=None if m["us"] is None else nbytes / m["us"] / 1e3))
    return rows


def _step_row(name, shape, batch, L, read, ours, base, copy_gbps) -> dict:
    row = dict(shape=name, family=shape.family, layout=shape.layout, batch=batch, L=L, read=read,
               copy_gbps=copy_gbps, standard_bytes=base["bytes"], standard_floor_us=base["bytes"] / copy_gbps / 1e3)
    row["ours"] = ours
    if ours.get("bytes"):
        row["ours_floor_us"] = ours["bytes"] / copy_gbps / 1e3
    for col in COLUMNS[1:]:
        if col in base:
            row[col] = base[col]
    best = [row[c]["us"] for c in ("standard", "fla") if c in row and row[c]["us"]]
    if ours.get("us") and best:
        row["speedup_vs_best_standard"] = min(best) / ours["us"]
    if L is not None:
        _dispatch(row, shape, batch, L, min(best) if best else None)
    return row


def _dispatch(row: dict, shape: Shape, batch: int, L: int, best_us: Optional[float]) -> None:
    """What a compiled model runs for this row and how it compares: the cost model's route (NOTE [cost model] in
    ``passes/cost_model.py``) and ``dispatched_vs_best_standard``, the best standard time over the dispatched
    route's (``replay``: ours, ``standard``: our standard kernel, ``original``: the plain step under torch.compile,
    which is what Inductor runs on the original graph). Issue 3 asks it to stay >= 0.95x at every batch size."""
    from ..families import get_family  # noqa: PLC0415
    from ..passes import cost_model  # noqa: PLC0415
    row["route"] = cost_model.route(batch, shape.heads, L, get_family(shape.family).delta)
    runs = row.get({"replay": "ours", "standard": "standard", "original": "compile"}[row["route"]]) or {}
    if runs.get("us") and best_us:
        row["dispatched_vs_best_standard"] = best_us / runs["us"]


def _meta(args, argv, copy_gbps) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = ""
    commit = commit or os.environ.get("REPLAYSSM_COMMIT", "")  # the device copy has no .git: pass it in
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke)"
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), device=dev,
                torch=torch.__version__, triton=_version("triton"), fla=_version("fla"), commit=commit,
                command=" ".join(["replayssm bench kernels", *argv]),
                copy_gbps=copy_gbps, replay_kernels=args.replay_kernels)


def _version(module) -> Optional[str]:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------------------------ tables
def _us(c) -> str:
    return "n/a" if not c or c.get("us") is None else f"{c['us']:.1f}"


def _timings(results) -> set:
    """Timing methods used anywhere in ``results`` (CUDA graph replay, direct do_bench, wall clock)."""
    found = set()
    for r in results["step"] + results["tune"]:
        for c in [r, *[v for v in r.values() if isinstance(v, dict)]]:
            if c.get("timing"):
                found.add(c["timing"])
    found.update(v for r in results["verify"] for k, v in r.items() if k.endswith("_timing") and v)
    return found


def _num(v, fmt=".1f", unit="") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def _mib(nbytes) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**20:.3g} MiB"


def format_tables(results: dict) -> str:
    """Markdown tables of the step rows, the verify rows and the tuning sweep."""
    copy = results["meta"]["copy_gbps"]
    lines = [f"device {results['meta']['device']}, copy bandwidth {copy:.0f} GB/s (read+write), "
             f"timing: {', '.join(sorted(_timings(results)))}", "",
             "| shape | B | L | read | ours us | std us | fla us | eager us | compile us | ours %bw | std %bw "
             "| ours floor us | std floor us | best std / ours | route | best std / dispatched |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def pct(c, nbytes):
        return "n/a" if not c or not c.get("us") or not nbytes else f"{100 * nbytes / c['us'] / 1e3 / copy:.0f}%"
    for r in results["step"]:
        lines.append(
            f"| {r['shape']} | {r['batch']} | {r['L'] or '-'} | {r['read'] or '-'} | {_us(r['ours'])} "
            f"| {_us(r.get('standard'))} | {_us(r.get('fla'))} | {_us(r.get('eager'))} | {_us(r.get('compile'))} "
            f"| {pct(r['ours'], r['ours'].get('bytes'))} | {pct(r.get('standard'), r['standard_bytes'])} "
            f"| {_num(r.get('ours_floor_us'))} | {_num(r['standard_floor_us'])} "
            f"| {_num(r.get('speedup_vs_best_standard'), '.2f', 'x')} | {r.get('route') or '-'} "
            f"| {_num(r.get('dispatched_vs_best_standard'), '.2f', 'x')} |")
    losing = [r for r in results["step"] if r.get("dispatched_vs_best_standard", 1.0) < NEVER_LOSE]
    if losing:
        lines += ["", f"below {NEVER_LOSE}x of the best standard kernel as dispatched (issue 3's never-lose ask): "
                  + "; ".join(f"{r['shape']} B={r['batch']} L={r['L']} read={r['read']} {r['route']} "
                              f"{r['dispatched_vs_best_standard']:.2f}x" for r in losing)]
    if results["verify"]:
        lines += ["", "| shape | B | T | replay verify us | snapshot verify us | 1 std step us | replay / std "
                      "| replay B/seq | snapshot B/seq |", "|---|---|---|---|---|---|---|---|---|"]
        for r in results["verify"]:
            ratio = (f"{r['replay_us'] / r['standard_us']:.2f}x" if r.get("replay_us") and r.get("standard_us")
                     else "n/a")
            fmt = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
            lines.append(f"| {r['shape']} | {r['batch']} | {r['T']} | {fmt(r.get('replay_us'))} "
                         f"| {fmt(r['snapshot_us'])} | {fmt(r['standard_us'])} | {ratio} "
                         f"| {_mib(r.get('replay_per_seq_bytes'))} | {_mib(r['snapshot_per_seq_bytes'])} |")
    if results["tune"]:
        lines += ["", "| shape | B | block_v | warps | std us | GB/s |", "|---|---|---|---|---|---|"]
        for r in results["tune"]:
            lines.append(f"| {r['shape']} | {r['batch']} | {r['block_v']} | {r['num_warps']} | {_us(r)} "
                         f"| {'n/a' if r['gbps'] is None else round(r['gbps'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
