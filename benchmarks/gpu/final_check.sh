#!/usr/bin/env bash
# Last GPU check of a session (~5 min on a fresh H200): kernel tests, `bench spec` (verify + commit against snapshots),
# the GPU soak and speculative example. E2E=1 runs the transformers e2e tests instead (6 families with the Triton
# kernels, one bf16 through Inductor), as a call of its own: two runs on 2026-12-03 needed 130 s for 4 cases and
# 230 s for 2 more plus part of the Inductor one, which did not finish; the 420 s box may cut it again.
# Time boxes from 2026-12-03: spec took 51 s, the soak more than 40 s, the example more than 35 s.
# Usage: [E2E=1] bash benchmarks/gpu/final_check.sh [commit] (writes under $OUT).
set -u
source "$(dirname "$0")/part.sh"
gpu_setup final_log.txt "${1:-}"
if [ -n "${E2E:-}" ]; then
  ensure_transformers  # without it the test file skips itself and the call returns 0
  TAIL=12 part e2e 420 python3 -m pytest -m gpu tests/models/test_generate_replay.py -rA -p no:cacheprovider
else
  TAIL=6 part tests 75 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
  TAIL=14 part spec 80 python3 -m replay_compile.cli bench spec --T 4,8 --batch 256 --acceptance 0.8,text --steps 8 \
    --out "$OUT/spec_b256.json"
  TAIL=8 part soak_gpu 75 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_soak.py -k soak_gpu
  TAIL=8 part spec_example_gpu 75 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_speculative_example.py
fi
echo total $SECONDS
