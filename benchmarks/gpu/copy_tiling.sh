#!/usr/bin/env bash
# Seventeenth session (2026-12-04), one H200 call (~7 min; part limits below; writes under $OUT):
#   tests      GPU kernel tests of the tree (the raw delta fold without a decayed tile copy), 210 s
#   fp8_tiles  tune_replay.py: GDN and KDA steps on an fp8 copy at L = 8, value tiles of 64 and 4 warps beside
#              the defaults (the copy's non-flush rows run at 24-28% of bandwidth: more bytes in flight per
#              program), and the pipelined non-flush loop with 8 pairs, 90 s
#   verify_kda tune_replay.py: KDA verify T = 4, 8 at L = 8 + T (best_window.sh ran out of time before it), 60 s
#   accuracy   bench accuracy of GDN over 128K tokens (copies re-quantized by reciprocal since 4966168), 130 s
# Usage: bash benchmarks/gpu/copy_tiling.sh [commit]
set -u
source "$(dirname "$0")/part.sh"
gpu_setup copy_tiling_log.txt "${1:-}"
TAIL=4 part tests 210 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider
TAIL=12 part fp8_tiles 90 python3 benchmarks/tune_replay.py --batch 256 --shapes qwen3.5-122b-gdn,kimi-linear-kda \
  --read fp8 --window 8 --block-v 0,64 --warps 0,4 --out "$OUT/copy_tiling_fp8.json"
TAIL=6 part fp8_pipelined 50 python3 benchmarks/tune_replay.py --batch 256 --shapes qwen3.5-122b-gdn,kimi-linear-kda \
  --read fp8 --window 8 --stages 2 --items 8 --out "$OUT/copy_tiling_fp8_pipelined.json"
TAIL=6 part verify_kda 60 python3 benchmarks/tune_replay.py --batch 256 --shapes kimi-linear-kda --read none --no-steps \
  --verify 4,8 --verify-window 8 --out "$OUT/copy_tiling_verify_kda.json"
TAIL=24 part accuracy 130 python3 -m replay_compile.cli bench accuracy --families gated_deltanet --steps 131072 \
  --chunk 128 --max-seconds 60 --out "$OUT/copy_tiling_accuracy.json" --plot "$OUT/copy_tiling_accuracy.png" \
  --no-progress
echo total $SECONDS
