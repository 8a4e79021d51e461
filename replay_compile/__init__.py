"""replay-compile: ReplaySSM decode for linear-recurrent layers, reached from plain PyTorch code.

    model = torch.compile(model, backend="replayssm")

Layers: ``families`` (recurrences as data + reference math), ``runtime`` (``ReplayState``:
checkpoint + ring + cursors), ``templates`` (Triton kernels), ``passes`` (the FX rewrite).
"""
from .families import (Canonical, FamilyError, RecurrenceFamily, families, get_family,  # noqa: F401
                       register_family, standard_scan, standard_step)
from .runtime import ReplayError, ReplayState  # noqa: F401
from .api import (ExplainReport, commit, counters, explain, materialize, release,  # noqa: F401
                  reset_counters)

__version__ = "0.1.0"
