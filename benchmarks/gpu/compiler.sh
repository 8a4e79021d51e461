#!/usr/bin/env bash
# compiler helper's GPU checks (issue 4): the backend on the H200 with the Triton kernels and CUDA graphs.
# Runtime: ~2-3 min in all (mostly Inductor/Triton compiles): tests/test_backend_gpu.py ~2 min,
# the lifecycle tests (CPU-sized, on the GPU build) ~30 s. Writes JUnit XML + logs under $OUT.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pytest -m gpu tests/test_backend_gpu.py -v --durations=0 -p no:cacheprovider \
    --junitxml="$OUT/compiler_backend_gpu.xml" 2>&1 | tee "$OUT/compiler_backend_gpu.log" | tail -40
python3 -m pytest tests/test_backend_lifecycle.py -q -p no:cacheprovider \
    --junitxml="$OUT/compiler_lifecycle.xml" 2>&1 | tee "$OUT/compiler_lifecycle.log" | tail -15
