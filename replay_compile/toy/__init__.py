"""Plain-PyTorch toy models for the demo, the examples and end-to-end tests (no replay-compile code inside)."""
from .hybrid_lm import DraftModelDrafter, HybridLM, PromptLookupDrafter  # noqa: F401
