"""Gated DeltaNet (Qwen3-Next, Qwen3.5): scalar decay + delta rule, grouped value heads."""
from .qk_families import make_family
from .registry import register_family

FAMILY = register_family(make_family(
    "gated_deltanet", decay="scalar", delta=True, l2norm_default=True, aliases=('gdn',),
    description="Gated DeltaNet (Qwen3-Next, Qwen3.5): scalar decay + delta rule, grouped value heads."))
