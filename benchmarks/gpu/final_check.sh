#!/usr/bin/env bash
# Last GPU check of a session (~4 min on a fresh H200): kernel tests, `bench spec` (verify + commit against snapshots),
# the GPU soak and speculative example; E2E=1 adds the transformers e2e qwen3_next case with the Triton kernels.
# Usage: bash benchmarks/gpu/final_check.sh [commit] (writes under $OUT).
set -u
source "$(dirname "$0")/part.sh"
gpu_setup final_log.txt "${1:-}"
TAIL=6 part tests 75 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
TAIL=14 part spec 50 python3 -m replay_compile.cli bench spec --T 4,8 --batch 256 --acceptance 0.8,text --steps 8 \
  --out "$OUT/spec_b256.json"
TAIL=8 part soak_gpu 40 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_soak.py -k soak_gpu
TAIL=8 part spec_example_gpu 35 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_speculative_example.py
if [ -n "${E2E:-}" ]; then  # +60 s
  TAIL=12 part e2e 60 python3 -m pytest -m gpu tests/models/test_generate_replay.py -q -rA -p no:cacheprovider \
    -k "triton_kernels and qwen3_next"
fi
echo total $SECONDS
