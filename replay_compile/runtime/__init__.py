"""The ReplaySSM state runtime: checkpoint + ring + device cursors, and the reference math behind it."""
from .quant import READ_DTYPES, ReadFormat, read_format  # noqa: F401
from .state import ReplayError, ReplayState, as_slots  # noqa: F401
