#!/usr/bin/env bash
# GPU check and timing of the default verify's candidate (templates/verify.py NOTE [default verify]; ~8 min on a
# fresh H100): the verify's product forms and the chunked verify's GPU tests of its bf16 tilings, the candidate
# against the token loop and its neighbours (verify T = 8, 4 at batch 256; with fp32 activations too, as the
# transformers integration hands them), `bench spec` at T = 4 with the candidate
# (and the token loop at one acceptance), then the other GPU kernel tests.
# Usage: [PARTS="tests_bf16 forms forms_fp32 spec spec_tokens tests_rest"] bash benchmarks/gpu/default_verify.sh [commit]
# (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup default_verify_log.txt "${1:-}"
PARTS=${PARTS:-"tests_bf16 forms forms_fp32 spec spec_tokens tests_rest"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
has tests_bf16 && TAIL=40 part tests_bf16 110 python3 -m pytest -m "gpu or not slow" tests/test_kernels.py -q -p no:cacheprovider --tb=line \
  -k "verify_products or (chunked_verify_gpu and (bf16 or token_tile))"
FORMS=${FORMS:-"tokens;chunked:dot=bf16x3,nw=1,bt=8,kc=16;chunked:dot=bf16x3,nw=2,bt=8,kc=16;chunked:dot=bf16x2,nw=1,bt=8,kc=16;chunked:dot=bf16,nw=1,bt=8"}
has forms && TAIL=40 part forms 120 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn --batch 256 \
  --no-steps --verify 8,4 --verify-window 16 --verify-form "$FORMS" --out "$OUT/verify_forms.json"
CANDIDATE=${CANDIDATE:-"chunked:dot=bf16x3,nw=1,bt=8,kc=16"}
has forms_fp32 && TAIL=12 part forms_fp32 60 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn \
  --batch 256 --no-steps --verify 8,4 --verify-window 16 --verify-activations fp32 --verify-form "tokens;$CANDIDATE" \
  --out "$OUT/verify_forms_fp32.json"
has spec && TAIL=30 part spec 90 python3 -m replay_compile.cli bench spec --T 4 --batch 256 --acceptance 0.5,0.8,1.0,text \
  --window 8 --steps 8 --verify-form "$CANDIDATE" --out "$OUT/spec_t4.json"
has spec_tokens && TAIL=12 part spec_tokens 40 python3 -m replay_compile.cli bench spec --T 4 --batch 256 --acceptance 0.8 \
  --window 8 --steps 8 --verify-form tokens --out "$OUT/spec_t4_tokens.json"
has tests_rest && TAIL=8 part tests_rest 200 python3 -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider -k "not chunked_verify"
echo total $SECONDS
