#!/usr/bin/env bash
# GPU check of a change to the one-token replay step (~7-9 min on a fresh H200; 2026-12-04: kernel tests 152 s and
# > 170 s on two fresh machines, the soak ~90 s with its compiles outside its time box): kernel tests, the GPU soak, the
# step at batch 256 for the three real shapes with the default tiling beside a knob's other value
# (KNOB="--fold-unroll 0,1" by default: 0 = the tiling's choice), and the Qwen3.5 GDN model stack at batch 256
# (compile vs replayssm, CUDA graphs, L = $WINDOW, default 8; MODELS="qwen3.5-122b kimi-linear" for more stacks,
# ~65 s each).
# Usage: [KNOB="--maxnreg 0,128"] [STEPS_BOX=seconds] [WINDOW=16] [MODELS=...] bash benchmarks/gpu/step_check.sh [commit]   (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup step_log.txt "${1:-}"
TAIL=6 part tests 210 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
TAIL=8 part soak_gpu 100 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_soak.py -k soak_gpu
# shellcheck disable=SC2086  # KNOB is a list of arguments
TAIL=16 part steps "${STEPS_BOX:-130}" python3 benchmarks/tune_replay.py --batch 256 --read none,fp8 ${KNOB:---fold-unroll 0,1} \
  --out "$OUT/step_tune.json"
ensure_transformers
for model in ${MODELS:-qwen3.5-122b}; do
  TAIL=8 part "model_$model" 90 python3 -m replay_compile.cli bench model --models "$model" --batch 256 \
    --modes reduce-overhead --columns compile,replay --window "${WINDOW:-8}" --out "$OUT/step_model_$model.json"
done
echo total $SECONDS
