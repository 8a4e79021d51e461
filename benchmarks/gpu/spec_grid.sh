#!/usr/bin/env bash
# Issue 6's full speculative grid on one H200: `bench spec` over T 1,2,4,8 x acceptance 0.5,0.8,1.0,text for the
# Mamba-2 and GDN shapes at the batch sizes in $BATCHES (default 32,128). At batch 256 a case took ~6.5 s
# (2026-12-03); the grid is 32 cases per batch size, so run the batches as separate calls:
#   BATCHES=32,128 bash benchmarks/gpu/spec_grid.sh [commit]      (~4 min)
#   BATCHES=256 bash benchmarks/gpu/spec_grid.sh [commit]         (~4 min)
#   BATCHES=512 bash benchmarks/gpu/spec_grid.sh [commit]         (~7 min)
# `bench spec` writes its JSON after every case, so a part cut by its time box keeps what it measured.
set -u
source "$(dirname "$0")/part.sh"
gpu_setup spec_grid_log.txt "${1:-}"
BATCHES=${BATCHES:-32,128}
TAIL=70 part "spec_grid_${BATCHES//,/_}" 560 python3 -m replay_compile.cli bench spec --T 1,2,4,8 --batch "$BATCHES" \
  --acceptance 0.5,0.8,1.0,text --steps 8 --out "$OUT/spec_grid_${BATCHES//,/_}.json"
echo total $SECONDS
