#!/usr/bin/env bash
# The short form of default_verify.sh for a lease with ~3 minutes left: product forms and the candidate default
# tiling's GPU tests (GDN, Mamba-2), the candidate against the token loop (T = 8, 4), then `bench spec` at T = 4
# (the candidate's verify form) if time remains.
set -u
source "$(dirname "$0")/part.sh"
gpu_setup default_verify_log.txt "${1:-}"
D="dot=bf16x3,token_tile=8,key_chunk=16,num_warps=1"
TAIL=12 part tests 70 python3 -m pytest -m "gpu or not slow" -q -p no:cacheprovider --tb=line "tests/test_kernels.py::test_chunked_verify_gpu[qwen3.5-122b-gdn-$D]" \
  "tests/test_kernels.py::test_chunked_verify_gpu[nemotron3-super-mamba2-$D]" tests/test_kernels.py::test_verify_products
TAIL=20 part forms 60 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn --batch 256 \
  --no-steps --verify 8,4 --verify-window 16 --verify-form "tokens;chunked:dot=bf16x3,nw=1,bt=8,kc=16;chunked:dot=bf16x2,nw=1,bt=8,kc=16" \
  --out "$OUT/verify_forms.json"
TAIL=30 part spec 60 python3 -m replay_compile.cli bench spec --T 4 --batch 256 --acceptance 0.8,text --window 8 --steps 4 \
  --shapes qwen3.5-122b-gdn --verify-form "chunked:dot=bf16x3,nw=1,bt=8,kc=16" --out "$OUT/spec_t4.json"
echo total $SECONDS
