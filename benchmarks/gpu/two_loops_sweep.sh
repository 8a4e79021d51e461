#!/usr/bin/env bash
# Sweeps the knobs around NOTE [two row loops] at batch 256, L = 16 (~6 min on a warm H200; not run yet):
#   kv_stages     GDN / KDA without a read copy: pipeline stages 1-3 of the non-flush loop, 4 (default) or 8 pairs
#                 a program (longer loops give the prefetch more to overlap);
#   kv_copy_fold  GDN / KDA with an fp8 copy: one loop or two, the flush fold unrolled by 1 (default) or 8 (its
#                 own loop now, so the unrolled fold's registers may no longer cost the non-flush rows);
#   vk_split      Mamba-2: one loop (default) or two of 1 / 2 stages under the default cap (128) or 168 (the split
#                 spilled 448 bytes at 128 in the sm_90 compile and lost 7-36% on the H200).
# sm_90 compile of these cells (benchmarks/sm90_report.py with the same overrides): see BENCHMARKS.md's fifteenth
# session. Usage: bash benchmarks/gpu/two_loops_sweep.sh (writes under $OUT)
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
echo total $SECONDS
