"""Kimi Delta Attention: per-key-channel decay + delta rule."""
from .qk_families import make_family
from .registry import register_family

FAMILY = register_family(make_family(
    "kda", decay="channel", delta=True, l2norm_default=True, aliases=('kimi_delta_attention',),
    description="Kimi Delta Attention: per-key-channel decay + delta rule."))
