"""Custom ops that carry replay-form recurrent states through ``torch.compile`` graphs.

``torch.ops.replay_compile.advance`` is what the rewrite pass puts in place of a state's update and
reads; ``registry`` maps user state tensors to the :class:`~replay_compile.runtime.ReplayState`
objects that hold their rings and cursors.
"""
from .registry import managed_states, replay_state_for, scoped_registry, site_config  # noqa: F401
from .replay_ops import advance  # noqa: F401
