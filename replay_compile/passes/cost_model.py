"""Which route a CUDA decode site takes: replay, or the standard recurrence in one fused kernel.

A replay step reads the state once (and each row's window of records) and writes it once every L steps;
a standard step reads and writes the whole state every step. At a large batch the state traffic decides
and replay wins; at a small one the kernels are latency-bound, and replay's extra work per program (the
window's dots and updates, the flush programs' folds) costs more than the traffic it saves. Below its
break-even point a site runs the standard recurrence through the same op (``route="standard"``:
``templates/standard.py``, state updated in place every step): what engines ship today, and faster than
the original graph under Inductor (at batch 256 a GDN layer's plain-torch recurrence took ~1.2 ms under
torch.compile, the standard kernel 0.53 ms: ``bench model`` and ``bench kernels``, BENCHMARKS.md).

# NOTE [cost model]
Break-even points measured on the H200 (2026-12-03, ``replayssm bench kernels --columns ours,standard
--read none``, fp32 states, BENCHMARKS.md), replay / standard at batch x value heads ("head rows"):

    family (value heads)       L = 8: 2048 / 4096 head rows   L = 16: 4096 / 8192 head rows
    Mamba-2 Super (128)        0.88x / 1.16x                  0.97x / 1.25x
    Mamba-2 Nano (96)          1.14x at 3072                  0.94x at 3072, 1.23x at 6144
    GDN 122B (64)              0.97x / 1.10x                  0.98x / 1.09x
    GDN 4B (32)                0.95x / 1.09x                  0.95x / (not measured)
    KDA (32)                   0.92x / 1.06x                  0.90x / 0.98x

Replay pays off from about ``512 * L`` head rows, across families and head counts (the kernels are
latency-bound until the grid holds that many (row, head) tiles per record of the window). Other windows
extrapolate that rule: not measured.

Below batch 8 a family without the delta rule keeps its original graph: Inductor fuses its elementwise
update well, and the model stacks at batch 1 (``bench model --batch 1 --modes reduce-overhead``, bf16, CUDA
graphs) measured Nemotron-3-Super (Mamba-2) at 0.96x of torch.compile with the standard route against 1.01x
with the original graph, while the delta-rule stacks gained from it: Qwen3.5-122B (GDN) 1.06x, Kimi-Linear
(KDA) 1.08x (at batch 32: 1.18x, 1.24x, and Nemotron 1.30x).
"""
from __future__ import annotations

HEAD_ROWS_PER_RECORD = 512
ORIGINAL_GRAPH_BELOW = 8  # batch under which sites without the delta rule stay as they were


def route(batch: int, value_heads: int, window: int, delta: bool) -> str:
    """The fastest of the three for a CUDA site of this size, as measured (NOTE [cost model]):

    ``"original"`` (batch under 8, no delta rule: the graph is left to Inductor), ``"standard"`` (under
    ``512 x window`` head rows: the standard recurrence through our op), else ``"replay"``.
    """
    if batch < ORIGINAL_GRAPH_BELOW and not delta:
        return "original"
    if batch * value_heads < HEAD_ROWS_PER_RECORD * window:
        return "standard"
    return "replay"
