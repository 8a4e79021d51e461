"""Kernels compiled for sm_90 on a machine without a GPU (``benchmarks/sm90_report.py``), checked in their TTGIR,
which the interpreter never builds: the chunked verify's tilings (those the tests and the default verify use) read
no prefetch buffer in place (templates/verify.py NOTE [prefetched operands read in place]), and a step on a read
copy of a ``kv`` state moves no tile between layouts (runtime/state.py NOTE [read copy orientation])."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from ttgir_checks import racy_prefetch_reads, tile_conversions  # noqa: E402

# the loop of a tiling that failed on an H100 (bf16x3, 4 warps, 2 stages), cut down: the next chunk's copy is issued
# into the one-slot buffer, then a warpgroup MMA reads that buffer's view
_RACY_LOOP = """
    %KK:2 = scf.for %i = %c0 to %c4 step %c1 iter_args(%a = %cst, %t = %tok) -> (tensor<64x16xf32>, !ttg.async.token) {
      %w = ttg.async_wait %t {num = 0 : i32}
      %Qt_556 = ttg.memdesc_index %Qt_212[%i] : !ttg.memdesc<1x32x16xbf16, #shared2, #smem, mutable> -> !ttg.memdesc<32x16xbf16, #shared2, #smem, mutable>
      %Qt_557 = ttg.local_load %Qt_556 token %w : !ttg.memdesc<32x16xbf16, #shared2, #smem, mutable> -> tensor<32x16xbf16>
      %c = ttg.async_copy_global_to_local %p, %Qt_234 mask %m other %z {contiguity = 4 : i32}
      %r = scf.if %pre -> (tensor<64x16xf32>) {
        %d = ttng.warp_group_dot %S, %Qt_556, %a {inputPrecision = 0 : i32} : tensor<64x32xbf16> * !ttg.memdesc<32x16xbf16, #shared2, #smem, mutable> -> tensor<64x16xf32>
        scf.yield %d : tensor<64x16xf32>
      } else {
        scf.yield %a : tensor<64x16xf32>
      }
      scf.yield %r, %c : tensor<64x16xf32>, !ttg.async.token
    } {tt.num_stages = 2 : i32}
    %after = ttng.warp_group_dot %S, %Qt_556, %a : tensor<64x32xbf16> * !ttg.memdesc<32x16xbf16, #shared2, #smem, mutable> -> tensor<64x16xf32>
"""


def test_racy_prefetch_reads_counts_in_place_reads_after_the_next_copy():
    """The read before the copy (into registers) and the one after the loop are safe; the MMA's is not."""
    assert racy_prefetch_reads(_RACY_LOOP) == 1
    assert racy_prefetch_reads(_RACY_LOOP.replace("1x32x16xbf16", "2x32x16xbf16")) == 0  # a second slot


@pytest.mark.parametrize("shape,form,activations", [
    ("qwen3.5-122b-gdn", "chunked:dot=bf16x3", "bf16"),  # 12 racy reads at 2 stages: the H100 failure
    ("nemotron3-super-mamba2", "chunked:dot=bf16x3", "bf16"),  # 6 at 2 stages
    *((shape, "auto", act) for shape in ("qwen3.5-122b-gdn", "nemotron3-super-mamba2") for act in ("bf16", "fp32")),
    ("kimi-linear-kda", "auto", "bf16"),  # the default verify (NOTE [default verify]) of 8 drafts
])
def test_verify_tilings_read_no_prefetch_buffer_in_place(shape, form, activations):
    lines = [ln for ln in _report(f"{shape},none,8,13", "--batch", "5", "--verify-form", form, "--activations",
                                  activations) if "verify_kernel" in ln]
    assert len(lines) == 1 and lines[0].endswith("; 0 racy prefetch reads"), lines


def _report(case: str, *args: str) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sm90_report.py"), case, *args],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    return run.stdout.splitlines()


def test_tile_conversions_counts_large_converts_only():
    line = "%a = ttg.convert_layout %b : tensor<{}xf32, #blocked> -> tensor<{}xf32, #blocked1> loc(#l)"
    assert tile_conversions("\n".join(line.format(s, s) for s in ("128x32", "16x128", "128", "64x2x32"))) == 2


@pytest.mark.parametrize("read", ["fp8", "fp4"])
def test_kv_step_on_a_copy_converts_no_tile(read):
    """GDN's one-token step (no commit: its tile is only read, folded and re-quantized) on an fp8 or 4-bit copy: the
    copy's tile loads in the layout the step computes in (stored value-major, as fp8 before 2026-12-06 and 4-bit
    before 2026-12-07: 2 conversions), in both launches of the step (NOTE [flush launch])."""
    # --batch 16 gives the tiling of batch 256 (at 5, programs split their units and the step runs one row loop)
    lines = [ln for ln in _report(f"qwen3.5-122b-gdn,{read},1,8", "--batch", "16") if "(no commit" in ln]
    assert len(lines) == 2 and all("; 0 tile conversions;" in ln for ln in lines), lines
