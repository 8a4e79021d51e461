"""Checks of a kernel's TTGIR (Triton's GPU-level IR, ``kernel.asm["ttgir"]``) that need no GPU: used by
``sm90_report.py`` and ``tests/test_sm90_compile.py``. No imports with side effects (the report's clears
``TRITON_INTERPRET``, which a test process must keep)."""
from __future__ import annotations

import math
import re

_SLOT_VIEW = re.compile(r"(%[\w.]+) = ttg.memdesc_index %[\w.]+\[[^\]]*\] : !ttg.memdesc<(\d+)x")


def racy_prefetch_reads(ttgir: str) -> int:
    """Reads of a one-slot prefetch buffer, inside a pipelined loop, after the loop has issued its next copy into
    it (templates/verify.py NOTE [prefetched operands read in place]): each may see the next iteration's data."""
    one_slot = {m.group(1) for m in _SLOT_VIEW.finditer(ttgir) if m.group(2) == "1"}
    racy, depth, issued = 0, None, False
    for line in ttgir.splitlines():
        if depth is None:
            if "scf.for" not in line:
                continue
            depth, issued = 0, False
        issued |= "ttg.async_copy_global_to_local" in line
        if issued and ("ttg.local_load" in line or "ttng.warp_group_dot " in line):
            racy += any(name in one_slot for name in re.findall(r"%[\w.]+", line.split("=", 1)[-1]))
        depth += line.count("{") - line.count("}")
        if depth <= 0 and "}" in line:
            depth = None
    return racy


_CONVERT = re.compile(r"ttg.convert_layout %[\w.#]+ : tensor<((?:\d+x)+)")


def tile_conversions(ttgir: str, min_elements: int = 4096) -> int:
    """Layout conversions of tensors of at least ``min_elements`` (a state tile through shared memory, with its
    barriers): runtime/state.py NOTE [read copy orientation] is the case where one made a step reduce its tile twice."""
    sizes = (m.group(1).rstrip("x").split("x") for m in _CONVERT.finditer(ttgir))
    return sum(1 for dims in sizes if math.prod(int(d) for d in dims) >= min_elements)
