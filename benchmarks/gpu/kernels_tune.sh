#!/usr/bin/env bash
# Replay-kernel GPU check (~8 min on a fresh H200): tiling sweep + verify, the GPU kernel tests, an Nsight
# Compute read of the Mamba-2 step. Usage: bash benchmarks/gpu/kernels_tune.sh (writes under $OUT).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
PART_LOG="$OUT/kernels_log.txt"; source "$(dirname "$0")/part.sh"
TAIL=20 part tune_default 200 python3 benchmarks/tune_replay.py --read none,fp8 --verify 8 --out "$OUT/tune_default.json"
TAIL=12 part tune_tiles 110 python3 benchmarks/tune_replay.py --read none --block-v 64 --warps 4,8 --out "$OUT/tune_tiles.json"
TAIL=15 part tests 150 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
NCU=(ncu --clock-control none -k regex:replay_kernel -s 1 -c 1 --section SpeedOfLight --section Occupancy
     --section LaunchStats --section WarpStateStats)
TAIL=60 part ncu_mamba2 60 "${NCU[@]}" python3 benchmarks/profile_replay.py nemotron3-super-mamba2
echo total $SECONDS
