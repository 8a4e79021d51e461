"""GLA: one decay per key channel, no delta rule."""
from .qk_families import make_family
from .registry import register_family

FAMILY = register_family(make_family(
    "gla", decay="channel", delta=False, l2norm_default=False, aliases=(),
    description="GLA: one decay per key channel, no delta rule."))
