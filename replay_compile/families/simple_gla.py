"""SimpleGLA / RetNet / Lightning attention: one decay per head, no delta rule."""
from .qk_families import make_family
from .registry import register_family

FAMILY = register_family(make_family(
    "simple_gla", decay="scalar", delta=False, l2norm_default=False, aliases=('retnet', 'lightning'),
    description="SimpleGLA / RetNet / Lightning attention: one decay per head, no delta rule."))
