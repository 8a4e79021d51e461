"""Opt-in integrations that route other libraries' recurrent kernels to the replay runtime.

``replay_compile.integrations.transformers``: Hugging Face transformers models (Qwen3-Next, Qwen3.5,
Kimi-Linear, Mamba-2, Nemotron-H), decode and multi-token speculative verify. Imported on demand only:
this package does not import transformers.
"""
