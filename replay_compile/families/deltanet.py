"""DeltaNet: delta rule, no decay."""
from .qk_families import make_family
from .registry import register_family

FAMILY = register_family(make_family(
    "deltanet", decay="none", delta=True, l2norm_default=True, aliases=(),
    description="DeltaNet: delta rule, no decay."))
