#!/usr/bin/env bash
# Issues 3 and 6 at the best window (L = 8 was the fastest fp32 step for all three shapes on 2026-12-04) beside the
# default 16, batch 256, on one H200 (~8 min on a warm machine, part limits below; writes under $OUT):
#   verify      tune_replay.py: verify T = 4, 8 + commit at L = 8 + T and 16 + T (fp32 checkpoint), 100 s
#   spec        bench spec: Mamba-2 and GDN shapes, T = 4, acceptance 0.5 / 0.8 / 1.0 / text, L = 8, 120 s
#   gdn_kv/vk   tune_replay.py: the GDN step on key-contiguous (`vk`) tiles, vLLM's layout and the reference fork's,
#               also as 1-warp programs and 64-value tiles like the fork's, beside `kv` (BENCHMARKS.md, sixteenth
#               session: the fork's 320 us GDN step reduces keys inside a warp), 40 + 100 s. sm_90 compile of the
#               step (`sm90_report.py qwen3.5-122b-gdn,none,1,8 --layout vk [...]`, no commit): kv default 2 warps,
#               168 registers, 20 bytes spilled; vk default 2 warps / 128 / 48; vk 1 warp 255 / 24; vk 64-value
#               tiles 8 warps / 115 / 0; vk 1 warp with 64-value tiles 11132 bytes spilled (expect it to lose)
#   accuracy    bench accuracy of GDN over 128K tokens (fp8 / 4-bit copies among its variants: the copies are
#               re-quantized by reciprocal since 4966168), 60 s
# First run (2026-12-04, seventeenth session, at 2829b96): verify, gdn_vk and accuracy ran past their limits of then
# (100 / 100 / 60 s; the 64-value vk tiles took most of gdn_vk and lost, 0.28-1.02x): limits raised, those tiles dropped.
# Usage: bash benchmarks/gpu/best_window.sh [commit]
set -u
source "$(dirname "$0")/part.sh"
gpu_setup best_window_log.txt "${1:-}"
TAIL=12 part verify 170 python3 benchmarks/tune_replay.py --batch 256 --read none --window 8 --no-steps \
  --verify 4,8 --verify-window 8,16 --out "$OUT/best_window_verify.json"
TAIL=20 part spec 120 python3 -m replay_compile.cli bench spec --T 4 --batch 256 --acceptance 0.5,0.8,1.0,text \
  --window 8 --steps 8 --out "$OUT/best_window_spec.json"
TAIL=6 part gdn_kv 40 python3 benchmarks/tune_replay.py --batch 256 --shapes qwen3.5-122b-gdn --read none \
  --window 8,16 --out "$OUT/best_window_gdn_kv.json"
TAIL=10 part gdn_vk 150 python3 benchmarks/tune_replay.py --batch 256 --shapes qwen3.5-122b-gdn --read none \
  --window 8,16 --layout vk --warps 0,1 --out "$OUT/best_window_gdn_vk.json"
TAIL=24 part accuracy 130 python3 -m replay_compile.cli bench accuracy --families gated_deltanet --steps 131072 \
  --chunk 128 --max-seconds 60 --out "$OUT/best_window_accuracy.json" --no-progress
echo total $SECONDS
