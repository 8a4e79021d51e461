"""Kernel benchmark: ``python benchmarks/bench_kernels.py [--quick|--smoke] ...`` (same as ``replayssm bench kernels``)."""
import sys

from replay_compile.bench.kernels import main

if __name__ == "__main__":
    sys.exit(main())
