"""Triton templates: kernels generated per (decay kind x delta rule, layout, dims, L, T, dtypes).

``replay``: the ReplaySSM decode / verify / materialize template and its launcher; ``verify``: the chunked
verify (a speculative verify as key-chunk products, for the calls it claims); ``cursors``: row
phases, a row's cursor moves (run by the replay kernel) and the commit kernel; ``readcopy``: read-copy (de)quantization tiles; ``sround``: stochastic
rounding; ``standard`` / ``snapshot``: the standard fused kernel and the snapshot baseline.
"""
