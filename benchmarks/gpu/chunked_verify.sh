#!/usr/bin/env bash
# GPU check and timing of the chunked verify (templates/verify.py; ~7 min on a fresh H200): its GPU kernel tests,
# verify T = 4, 8 at batch 256 (L = 16 + T) for the token loop and the chunked verify's tilings (KDA: T = 8), then
# `bench spec` at T = 4 (L = 8), then the other GPU kernel tests.
# Usage: [FORMS="tokens;chunked;..."] [KDA_FORMS=...] [PARTS="tests forms kda spec tests_rest"] \
#   bash benchmarks/gpu/chunked_verify.sh [commit]   (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup verify_log.txt "${1:-}"
PARTS=${PARTS:-"tests forms kda spec tests_rest"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
has tests && TAIL=8 part tests 240 python3 -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider -k chunked_verify
FORMS=${FORMS:-"tokens;chunked;chunked:kc=16;chunked:dot=split;chunked:dot=split,kc=16;chunked:kc=16,mr=128;chunked:bv=32;chunked:dot=tf32"}
has forms && TAIL=60 part forms 240 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn --batch 256 \
  --no-steps --verify 8,4 --verify-window 16 --verify-form "$FORMS" --out "$OUT/verify_forms.json"
has kda && TAIL=8 part kda 90 python3 benchmarks/tune_replay.py --shapes kimi-linear-kda --batch 256 \
  --no-steps --verify 8 --verify-window 16 --verify-form "${KDA_FORMS:-tokens;chunked:kc=16}" --out "$OUT/verify_kda.json"
has spec && TAIL=30 part spec 80 python3 -m replay_compile.cli bench spec --T 4 --batch 256 --acceptance 0.5,0.8,1.0,text \
  --window 8 --steps 8 --out "$OUT/spec_t4.json"
has tests_rest && TAIL=8 part tests_rest 200 python3 -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider -k "not chunked_verify"
echo total $SECONDS
