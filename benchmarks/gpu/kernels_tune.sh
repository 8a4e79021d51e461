#!/usr/bin/env bash
# Replay-kernel GPU check (~9 min on a fresh H200): the GPU kernel tests first, then the tiling sweep at batch 256
# (read none / fp8, (head, value tile) pairs per program), batch 1, and verify T = 8.
# Usage: bash benchmarks/gpu/kernels_tune.sh (writes under $OUT). NCU=1 adds an Nsight Compute read of the Mamba-2 step.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
PART_LOG="$OUT/kernels_log.txt"; source "$(dirname "$0")/part.sh"
TAIL=15 part tests 170 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
TAIL=40 part tune_items 220 python3 benchmarks/tune_replay.py --read none,fp8 --items 0,1,4,16 --out "$OUT/tune_items.json"
TAIL=20 part tune_b1_verify 150 python3 benchmarks/tune_replay.py --read none --batch 1,256 --verify 8 \
  --out "$OUT/tune_b1_verify.json"
if [ -n "${NCU:-}" ]; then
  NCU_ARGS=(ncu --clock-control none -k regex:replay_kernel -s 1 -c 1 --section SpeedOfLight --section Occupancy
            --section LaunchStats --section WarpStateStats)
  TAIL=60 part ncu_mamba2 60 "${NCU_ARGS[@]}" python3 benchmarks/profile_replay.py nemotron3-super-mamba2
fi
echo total $SECONDS
