#!/usr/bin/env bash
# Replay-step tiling sweep for the kv-layout families (GDN, KDA) at batch 256 (~8 min on a fresh H200): the default
# tiling beside register caps without spills and fewer warps per program. Why these points (sm_90 compiles on the CPU,
# benchmarks/sm90_report.py, 2026-12-03): at the default 96-register cap the GDN step spills 56 bytes (none at
# 112); 1-warp programs (value tiles of 8 or 16) have 12-25 shared-memory barriers instead of 47 (cross-warp
# reductions vanish) at 200-250 registers. Usage: bash benchmarks/gpu/sweep_tiling.sh [commit] (writes under $OUT).
set -u
source "$(dirname "$0")/part.sh"
gpu_setup sweep_log.txt "${1:-}"
TUNE=(python3 benchmarks/tune_replay.py --shapes qwen3.5-122b-gdn,kimi-linear-kda --batch 256)
# fp8 read copies spill more at the 96 cap (GDN 140 bytes, KDA 108; GDN 16 at 128)
TAIL=20 part caps 180 "${TUNE[@]}" --read none,fp8 --maxnreg 0,112,128 --out "$OUT/sweep_caps.json"
for cfg in "2 16" "1 16" "1 8"; do  # warps, value tile (uncapped: these need 200-250 registers)
  set -- $cfg
  TAIL=8 part "warps$1_bv$2" 70 "${TUNE[@]}" --read none --warps "$1" --block-v "$2" --maxnreg 255 --out "$OUT/sweep_w$1_bv$2.json"
done
TAIL=8 part verify 100 "${TUNE[@]}" --read none --verify 4,8 --warps 0,2 --out "$OUT/sweep_verify.json"
echo total $SECONDS
