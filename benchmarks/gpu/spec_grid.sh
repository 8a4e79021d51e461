#!/usr/bin/env bash
# Issue 6's full speculative grid on one H200: `bench spec` over T 1,2,4,8 x acceptance 0.5,0.8,1.0,text for the
# Mamba-2 and GDN shapes at the batch sizes in $BATCHES (default 32,128), 32 cases per batch size. On a warm H200
# (2026-12-03, tenth session) batch 256 took 44 s and batches 32,128,512 together 82 s:
#   BATCHES=256 bash benchmarks/gpu/spec_grid.sh [commit]
#   BATCHES=32,128,512 bash benchmarks/gpu/spec_grid.sh [commit]
#   WINDOW=8 ... (the window L, default 16); FORM=chunked:... (the verify form, default auto)
# `bench spec` writes its JSON after every case, so a part cut by its time box keeps what it measured.
set -u
source "$(dirname "$0")/part.sh"
gpu_setup spec_grid_log.txt "${1:-}"
BATCHES=${BATCHES:-32,128}
TAIL=70 part "spec_grid_${BATCHES//,/_}" 560 python3 -m replay_compile.cli bench spec --T 1,2,4,8 --batch "$BATCHES" \
  --window "${WINDOW:-16}" --verify-form "${FORM:-auto}" \
  --acceptance 0.5,0.8,1.0,text --steps 8 --out "$OUT/spec_grid_${BATCHES//,/_}.json"
echo total $SECONDS
