#!/usr/bin/env bash
# Replay-kernel GPU check (~8 min on a fresh H200): the GPU kernel tests first, then the replay step at batch 1 and
# 256 (read none / fp8) with verify T = 4, 8, speculative decoding against snapshots (`bench spec`, batch 256), and
# the model stacks at batch 256 (`bench model`, CUDA graphs). Usage: bash benchmarks/gpu/kernels_tune.sh [commit]
# (writes under $OUT). ITEMS=0,1,4,16 adds a sweep of (head, value tile) pairs per program; NCU=1 Nsight
# Compute reads of the Mamba-2 step and of the verify kernel (T = 8; Mamba-2, GDN: +2 min). BREAKEVEN=1 times replay
# against the standard kernel at batch 1-32 (the compiler's cost model, NOTE [cost model] in passes/cost_model.py,
# came from it; +1 min).
set -u
source "$(dirname "$0")/part.sh"
gpu_setup kernels_log.txt "${1:-}"
TAIL=15 part tests 170 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
TAIL=30 part tune 110 python3 benchmarks/tune_replay.py --read none,fp8 --batch 1,256 --verify 4,8 --out "$OUT/tune.json"
if [ -n "${ITEMS:-}" ]; then
  TAIL=30 part tune_items 220 python3 benchmarks/tune_replay.py --read none,fp8 --items "$ITEMS" --out "$OUT/tune_items.json"
fi
if [ -n "${BREAKEVEN:-}" ]; then
  TAIL=34 part breakeven 90 python3 -m replay_compile.cli bench kernels --shapes \
    nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda --batch 1,4,8,16,32 --window 8,16 --read none --verify 0 \
    --columns ours,standard --out "$OUT/breakeven.json"
fi
TAIL=16 part spec 90 python3 -m replay_compile.cli bench spec --T 4,8 --batch 256 --acceptance 0.8,text --steps 8 \
  --out "$OUT/spec_b256.json"
for model in qwen3.5-122b nemotron3-super kimi-linear; do
  TAIL=10 part "model_b256_$model" 70 python3 -m replay_compile.cli bench model --models "$model" --batch 256 \
    --modes reduce-overhead --columns compile,replay,replay-fp8 --out "$OUT/models_b256_$model.json"
done
if [ -n "${NCU:-}" ]; then
  NCU_ARGS=(ncu --clock-control none -k regex:replay_kernel -s 1 -c 1 --section SpeedOfLight --section Occupancy
            --section LaunchStats --section WarpStateStats)
  TAIL=60 part ncu_mamba2 60 "${NCU_ARGS[@]}" python3 benchmarks/profile_replay.py nemotron3-super-mamba2
  for shape in nemotron3-super-mamba2 qwen3.5-122b-gdn; do  # the verify kernel: where its time goes (stall reasons)
    TAIL=60 part "ncu_verify_$shape" 60 "${NCU_ARGS[@]}" --section SchedulerStats --section InstructionStats \
      python3 benchmarks/profile_replay.py "$shape" --tokens 8 --window 24 --no-commit --steps 2
  done
fi
echo total $SECONDS
