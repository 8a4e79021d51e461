"""Registers, spills and shared memory of the replay kernels on sm_90, compiled on a machine without a GPU.

Device time is scarce; ``ptxas -v`` is not. This builds a ``ReplayState`` on the CPU for a real layer
shape, intercepts the replay (or chunked verify) kernel's launch (nothing runs), compiles the kernel for sm_90a with the
specialisation Triton's JIT would apply on the GPU (pointers 16-byte aligned, integers equal to 1 folded,
multiples of 16 marked), runs Triton's bundled ``ptxas -v`` and prints what it reports:

    python benchmarks/sm90_report.py nemotron3-super-mamba2,none,1,16 qwen3.5-122b-gdn,fp8,8,24 --batch 256

Each case is ``shape,read,T,L`` (shapes of ``replayssm bench kernels``). ``--dump DIR`` also writes each
call's TTGIR (the layouts Triton chose) and SASS; every line counts SASS instructions and the opcodes in
``SASS_COUNTED`` (CALL: a division's slow path, BAR, SHFL, shared-memory and spill traffic);
``--warps``, ``--block-v``, ``--maxnreg``, ``--items``, ``--fold-unroll`` and ``--stages`` override the tiling,
``--layout`` the state layout, ``--verify-form`` the verify's template and tiling (as ``tune_replay.py``),
``--activations`` the inputs' dtype. Figures are the compiler's, not timings: on
2026-12-02 a kernel with no spills still ran at half of bandwidth, and on 2026-12-03 a variant with half the
shuffles ran slower (BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from replay_compile.bench.kernels import draw_inputs, draw_state, real_shape  # noqa: E402
from replay_compile.families import get_family  # noqa: E402
from replay_compile.runtime import ReplayState, triton_impl  # noqa: E402
from replay_compile.templates import replay, verify  # noqa: E402
from ttgir_checks import racy_prefetch_reads, tile_conversions  # noqa: E402
from tune_replay import verify_form  # noqa: E402

_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
          torch.int64: "i64", torch.uint8: "u8", torch.float64: "fp64", torch.float8_e4m3fn: "fp8e4nv"}


class _Capture:
    """Stands in for a JIT function: ``kernel[grid](*args, **kwargs)`` records the call in ``calls``."""

    def __init__(self, fn, calls: list):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.fn, args, kwargs))


def _source(fn, args, kwargs):
    """``(ASTSource, num_warps)`` of one recorded call, specialised as the JIT would on a GPU."""
    kwargs = dict(kwargs)
    num_warps = kwargs.pop("num_warps", 4)
    kwargs.pop("maxnreg", None)
    names = list(inspect.signature(fn.fn).parameters)
    values = dict(zip(names, args), **kwargs)
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(names):
        value = values[name]
        if isinstance(value, torch.Tensor):
            signature[name], attrs[(i,)] = "*" + _TYPES[value.dtype], [["tt.divisibility", 16]]
        elif name in kwargs or value is None or isinstance(value, (bool, str)) or value == 1:
            signature[name], constants[name] = "constexpr", value
        else:
            signature[name] = "i64" if abs(value) >= 2 ** 31 else "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs), num_warps


def report(fn, args, kwargs, dump: str = "") -> str:
    """``ptxas -v``'s summary of one recorded call; with ``dump``, its TTGIR and SASS are written as ``dump.*``."""
    src, num_warps = _source(fn, args, kwargs)
    options = dict(num_warps=num_warps, **({"maxnreg": kwargs["maxnreg"]} if "maxnreg" in kwargs else {}))
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        ptx = os.path.join(d, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        log = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True).stderr
        sass = subprocess.run([ptxas.replace("ptxas", "cuobjdump"), "-sass", os.path.join(d, "k.cubin")],
                              capture_output=True, text=True).stdout
    if dump:
        with open(dump + ".ttgir", "w") as f:
            f.write(kernel.asm["ttgir"])
        with open(dump + ".sass", "w") as f:
            f.write(sass)
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return (f"{num_warps} warps, {regs.group(1) if regs else '?'} registers, {spills.group(1) if spills else '?'} "
            f"bytes spilled, {kernel.metadata.shared} bytes shared memory; SASS {_sass_counts(sass)}; "
            f"{tile_conversions(kernel.asm['ttgir'])} tile conversions; "
            f"{racy_prefetch_reads(kernel.asm['ttgir'])} racy prefetch reads")


# SASS opcodes worth counting when a change is judged on the CPU: a CALL is the slow path of an IEEE division
# (``div.rn.f32``), BAR a barrier, SHFL a cross-lane reduction step, LDS/STS shared memory, LDL/STL spills
SASS_COUNTED = ("CALL", "BAR", "SHFL", "LDS", "STS", "LDL", "STL")


def _sass_counts(sass: str) -> str:
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", sass))
    return f"{ops.total()} instructions: " + ", ".join(f"{ops[name]} {name}" for name in SASS_COUNTED)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help="shape,read,T,L (read: none, bf16, fp8, fp4)")
    p.add_argument("--batch", type=int, default=256, help="rows (sets the tiling; default 256)")
    p.add_argument("--dump", default="", help="write each call's TTGIR and SASS under this folder")
    p.add_argument("--warps", type=int, default=0, help="override the tiling's warps per program")
    p.add_argument("--block-v", type=int, default=0, help="override the tiling's value tile")
    p.add_argument("--maxnreg", type=int, default=0, help="cap registers per thread (ptxas .maxnreg)")
    p.add_argument("--layout", choices=("kv", "vk"), help="state layout instead of the shape's (as tune_replay.py)")
    p.add_argument("--items", type=int, default=0, help="override the (head, value tile) pairs a program serves")
    p.add_argument("--fold-unroll", type=int, default=0, help="override the flush fold's unrolling")
    p.add_argument("--stages", type=int, default=-1, help="override the non-flush rows' loop (NOTE [two row loops]): "
                   "0 one loop for all rows, s > 0 a loop of their own over s pipeline stages")
    p.add_argument("--flush-items", type=int, default=-1, help="override the flushing rows' launch (NOTE [flush "
                   "launch]): 0 none, n > 0 n pairs a program")
    p.add_argument("--nonflush-maxnreg", type=int, default=0, help="register cap of the non-flush rows' launch where "
                   "the flushing rows have their own (0: the default, NONFLUSH_REGISTERS or --maxnreg's)")
    p.add_argument("--nonflush-warps", type=int, default=0, help="warps of the non-flush rows' launch where the "
                   "flushing rows have their own (0: those of the flushing rows' launch)")
    p.add_argument("--nonflush-block-v", type=int, default=0, help="value tile of the non-flush rows' launch where "
                   "the flushing rows have their own (0: that of the flushing rows' launch)")
    p.add_argument("--verify-form", default="auto", help="verify calls' template and tiling (tune_replay.py's "
                   "--verify-form, one variant)")
    p.add_argument("--activations", choices=("bf16", "fp32"), default="bf16",
                   help="dtype of queries, keys and values (the default verify's table has entries for both)")
    args = p.parse_args(argv)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    calls = []
    replay.replay_kernel = _Capture(replay.replay_kernel, calls)
    verify.verify_kernel = _Capture(verify.verify_kernel, calls)
    for case in args.cases:
        name, read, T, L = case.split(",")
        shape, T, L = real_shape(name, args.layout), int(T), int(L)
        rs = ReplayState(draw_state(shape, args.batch, "cpu", seed=1), get_family(shape.family), L,
                         layout=shape.layout, k_heads=shape.k_heads, read_dtype=None if read == "none" else read,
                         validate=False, kernels="triton")
        out = torch.empty(args.batch, T, rs.num_heads, rs.head_v)
        x = draw_inputs(shape, args.batch, T, "cpu", seed=1,
                        activations=torch.bfloat16 if args.activations == "bf16" else torch.float32)
        labels = []
        for commit in (True, False):
            n = len(calls)
            triton_impl.advance_into(rs, x, None, out, commit=commit, force_flush=False,
                                     max_registers=args.maxnreg or None, num_warps=args.warps or None,
                                     block_v=args.block_v or None, items=args.items or None,
                                     fold_unroll=args.fold_unroll or None,
                                     nonflush_stages=None if args.stages < 0 else args.stages,
                                     flush_items=None if args.flush_items < 0 else args.flush_items,
                                     nonflush_registers=args.nonflush_maxnreg or None,
                                     nonflush_warps=args.nonflush_warps or None,
                                     nonflush_block_v=args.nonflush_block_v or None,
                                     **verify_form(args.verify_form))
            labels += [("commit" if commit else "no commit") + {1: ", flushing rows", 2: ", other rows"}.get(
                kw.get("ROWS"), "") for _, _, kw in calls[n:]]
        for (fn, a, kw), commit in zip(calls, labels):
            dump = os.path.join(args.dump, re.sub(r"\W+", "_", f"{case}_{commit}")) if args.dump else ""
            print(f"{case} ({commit}, {fn.fn.__name__}): {report(fn, a, kw, dump)}", flush=True)
        calls.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
