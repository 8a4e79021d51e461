"""Benchmarks behind ``replayssm bench ...`` (thin wrappers live in ``benchmarks/``)."""
