#!/usr/bin/env bash
# Last GPU check of a session (~5 min on a fresh H200): kernel tests, `bench spec` (verify + commit against snapshots),
# the GPU soak and speculative example. E2E=kernels runs instead the transformers e2e tests with the Triton kernels
# (6 families, fp32, batch 4), and E2E=inductor the bf16 case through Inductor, each as a call of its own: on
# 2026-12-03 the six kernel cases needed ~360 s over two runs, and the Inductor case did not finish in 220 s (it
# compiles 4 graphs; ~3 min on the CPU).
# Time boxes from 2026-12-03 (sixth session): kernel tests > 100 s with 12 tests, spec 60 s, soak 44 s (all three
# families), example 47 s.
# Usage: [E2E=kernels|inductor] bash benchmarks/gpu/final_check.sh [commit] (writes under $OUT).
set -u
source "$(dirname "$0")/part.sh"
gpu_setup final_log.txt "${1:-}"
if [ -n "${E2E:-}" ]; then
  ensure_transformers  # without it the test file skips itself and the call returns 0
  case "$E2E" in  # pytest -k selection and time box of each
    kernels) SELECT=triton_kernels BOX=500 ;;
    inductor) SELECT=inductor BOX=540 ;;
    *) echo "E2E must be kernels or inductor, got $E2E"; exit 2 ;;
  esac
  TAIL=12 part "e2e_$E2E" "$BOX" python3 -m pytest -m gpu tests/models/test_generate_replay.py -k "$SELECT" -rA \
    -p no:cacheprovider
else
  TAIL=6 part tests 120 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
  TAIL=14 part spec 80 python3 -m replay_compile.cli bench spec --T 4,8 --batch 256 --acceptance 0.8,text --steps 8 \
    --out "$OUT/spec_b256.json"
  TAIL=8 part soak_gpu 100 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_soak.py -k soak_gpu
  TAIL=8 part spec_example_gpu 75 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_speculative_example.py
fi
echo total $SECONDS
