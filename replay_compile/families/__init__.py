"""Recurrence families: canonical math (``base``), the registry, and one file per built-in family."""
from .base import (Canonical, RecurrenceFamily, expand_heads, kv_view, l2norm, standard_scan,  # noqa: F401
                   standard_step)
from .registry import FamilyError, families, get_family, register_family  # noqa: F401

from . import simple_gla, gla, deltanet, gated_deltanet, kda, mamba2  # noqa: E402,F401  (register built-ins)
