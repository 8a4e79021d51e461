#!/usr/bin/env bash
# Sweeps the knobs around NOTE [two row loops] at batch 256 (~8 min on a warm H200; its first three parts ran at
# L = 8 instead on 2026-12-04 at `e35d617`, the window part as step_check.sh's KNOB: BENCHMARKS.md, sixteenth session):
#   kv_stages     GDN / KDA without a read copy, L = 16: pipeline stages 1-3 of the non-flush loop, 4 (default)
#                 or 8 pairs a program (longer loops give the prefetch more to overlap);
#   kv_copy_fold  GDN / KDA with an fp8 copy: one loop or two, the flush fold unrolled by 1 (default) or 8;
#   vk_split      Mamba-2: one loop (default) or two of 1 / 2 stages under the default cap (128) or 168;
#   window        the three shapes at L = 8 and 16 with the landed defaults (issue 3 asks its figures at the
#                 best L; L = 8 was the fastest for all three at `eb41bb3`).
# sm_90 compile of these cells on the CPU (`benchmarks/sm90_report.py CASE --stages S --items I --fold-unroll U
# --maxnreg R`, bytes spilled with commit / without, at `cb4bf6c`): GDN L = 16 default 96 / 40, 8 pairs 8 / 0;
# 3 stages 84 / 28 with 38.8 KB of shared memory a program (occupancy 5 programs an SM instead of 6); fp8 copies
# with the fold unrolled by 8 GDN 556 / 664, KDA 632 / 640 (default 156 / 140, 160 / 160); Mamba-2 split at cap
# 168: 2 stages 28 / 0, 1 stage 16 / 20 (at 128: 448 / 132, the split that lost 7-36% on the H200).
# Usage: bash benchmarks/gpu/two_loops_sweep.sh (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup two_loops_log.txt
TUNE=(python3 benchmarks/tune_replay.py --batch 256)
TAIL=14 part kv_stages 170 "${TUNE[@]}" --shapes qwen3.5-122b-gdn,kimi-linear-kda --read none --stages=1,2,3 \
  --items 0,8 --out "$OUT/two_loops_kv_stages.json"
TAIL=10 part kv_copy_fold 130 "${TUNE[@]}" --shapes qwen3.5-122b-gdn,kimi-linear-kda --read fp8 --stages=0,1 \
  --fold-unroll 0,8 --out "$OUT/two_loops_kv_copy_fold.json"
TAIL=10 part vk_split 130 "${TUNE[@]}" --shapes nemotron3-super-mamba2 --read none,fp8 --stages=0,1,2 \
  --maxnreg 0,168 --out "$OUT/two_loops_vk_split.json"
TAIL=14 part window 150 "${TUNE[@]}" --read none,fp8 --window 8,16 --out "$OUT/two_loops_window.json"
echo total $SECONDS
