#!/usr/bin/env bash
# Replay tiling sweep around the defaults at batch 256 (~9.5 min on a fresh H200: its parts are boxed to 560 s): all
# three families, fp32 checkpoint and fp8 copy, warps x register cap for steps, caps for verify, the window L, read
# copies in wider and in smaller value tiles, and GDN/KDA in the other layout.
# The defaults (NOTE [register cap] in templates/replay.py) came from this sweep's first run (2026-12-03, seventh
# session, BENCHMARKS.md): 2 warps beat 1, 4 and 8 everywhere; the best cap was 168 for one-token kv tiles (GDN,
# KDA), 128 for vk tiles (Mamba-2) and for verify; L = 8 was the fastest of 8, 16, 32 (L = 4 was first added by
# the eleventh session). A `--maxnreg 0` row runs the default cap of the default warps; one-warp verify programs
# were timed on 2026-12-03 (tenth session) and lost everywhere (BENCHMARKS.md). Usage: bash benchmarks/gpu/sweep_tiling.sh [commit] (writes under $OUT).
set -u
source "$(dirname "$0")/part.sh"
gpu_setup sweep_log.txt "${1:-}"
TUNE=(python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda --batch 256)
TAIL=24 part caps 150 "${TUNE[@]}" --read none,fp8 --warps 2,4 --maxnreg 128,168,200 --out "$OUT/sweep_caps.json"
TAIL=12 part verify 110 "${TUNE[@]}" --no-steps --verify 4,8 --maxnreg 0,168 --out "$OUT/sweep_verify.json"
TAIL=12 part window 70 "${TUNE[@]}" --read none,fp8 --window 4,8,16 --out "$OUT/sweep_window.json"
# read copies with wider value tiles: a GDN / KDA step reading an fp8 copy (a quarter of the bytes) took as long
# as with the fp32 checkpoint on 2026-12-03 (non-flush 392 vs 393 us): not bandwidth-bound at the fp32 tiling
TAIL=14 part readcopy_tiles 100 "${TUNE[@]}" --read bf16,fp8 --block-v 64,128 --warps 4,8 \
  --out "$OUT/sweep_readcopy_tiles.json"
# the other way: smaller fp8 tiles under a lower cap. Nsight Compute on 2026-12-04 (BENCHMARKS.md) found the GDN / KDA
# fp8-copy steps issue-bound at 10-12 resident warps per SM (168 registers x 64 threads: 6 programs), with DRAM at
# 21-27%; value tiles of 16 need half the registers for the tile, and a cap of 96 or 128 fits 10 or 8 programs
TAIL=10 part readcopy_small_tiles 70 "${TUNE[@]}" --shapes qwen3.5-122b-gdn,kimi-linear-kda --read fp8 --block-v 16,32 \
  --maxnreg 96,128 --out "$OUT/sweep_readcopy_small_tiles.json"
# GDN / KDA with keys contiguous (vLLM's [HV, V, K] state; transformers' is [H, K, V]): if faster, a checkpoint
# of our own in that layout (as the 16-bit checkpoint option keeps one) would pay for its transposes
TAIL=10 part layout_vk 60 "${TUNE[@]}" --shapes qwen3.5-122b-gdn,kimi-linear-kda --read none --layout vk --verify 8 \
  --out "$OUT/sweep_layout_vk.json"
echo total $SECONDS
