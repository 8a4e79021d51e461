#!/usr/bin/env bash
# What the default verify (templates/verify.py NOTE [default verify]) and the read copies still needed from a GPU, in
# parts (in this order: a call cut at its limit keeps the parts it finished). All of it ran on an
# H100 in the thirtieth session (BENCHMARKS.md, 2026-12-07): the tests passed (run with more than the former 150 s
# box: 255 s on a cold machine), and the timings chose the default table's fp32 and KDA entries; kept to repeat them
# after a change to these kernels.
#   tests   the fp32-activation verify tests (the default table's fp32 entries rest on them), and the
#           chunked verify's GDN / KDA tilings timed below (TESTS=copies: the read-copy tests instead, TESTS=all: both)
#   gdn     GDN verify tilings around the default (T = 8 stood at 1.36x one standard step on an H100; asked <= 1.3x)
#   kda     KDA's 1-warp verify forms against its token loop (the default from 8 drafts)
#   copies  read-copy steps of GDN / KDA with the non-flush loop pipelined (2 stages), which lost before the copies
#           went key-major (NOTE [two row loops]), and fp8 tiles of 64 values on 4 warps (more bytes in flight)
#   spec    issue 6's speculative grid at batch 256 with the default verify
# Usage: [PARTS="tests gdn kda copies spec"] [TESTS=verify|copies|all] bash benchmarks/gpu/verify_next.sh [commit]
# (writes under $OUT; ~15 min with every part: call it in two parts)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup verify_next_log.txt "${1:-}"
PARTS=${PARTS:-"tests gdn kda copies spec"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
COPY_TESTS="read_copies_and_rounding_gpu or two_row_loops_short_last_program_gpu or e2m1 or e4m3"
VERIFY_TESTS="chunked_verify_gpu_fp32_activations or (chunked_verify_gpu and (gdn or kda))"
has tests && TAIL=20 part tests 330 python3 -m pytest -m "gpu or not slow" tests/test_kernels.py -q -p no:cacheprovider \
  --tb=line -k "$(case ${TESTS:-verify} in copies) echo "$COPY_TESTS" ;; all) echo "$COPY_TESTS or $VERIFY_TESTS" ;;
                   *) echo "$VERIFY_TESTS" ;; esac)"
ONE="nw=1,bt=8"
GDN_FORMS=${GDN_FORMS:-"tokens;chunked:dot=bf16x3,$ONE,kc=16;chunked:dot=bf16x3,$ONE,kc=32;chunked:dot=bf16x3,$ONE,kc=16,bv=32;chunked:dot=bf16x2,$ONE,kc=32;chunked:dot=bf16x3,$ONE,kc=16,bv=128;chunked:dot=bf16x3,$ONE,kc=16,mr=128"}
has gdn && TAIL=20 part gdn 150 python3 benchmarks/tune_replay.py --shapes qwen3.5-122b-gdn --batch 256 --no-steps \
  --verify 8,4 --verify-window 16 --verify-form "$GDN_FORMS" --out "$OUT/verify_gdn.json"
has kda && TAIL=12 part kda 120 python3 benchmarks/tune_replay.py --shapes kimi-linear-kda --batch 256 --no-steps \
  --verify 8,4 --verify-window 16 --verify-form "tokens;chunked:dot=bf16x3,$ONE,kc=16;chunked:dot=bf16x2,$ONE,kc=16" \
  --out "$OUT/verify_kda.json"
COPY_SHAPES="--shapes qwen3.5-122b-gdn,kimi-linear-kda --batch 256 --window 8 --stages=-1,2"
has copies && TAIL=24 part copies 130 python3 benchmarks/tune_replay.py $COPY_SHAPES --read fp8,fp4 \
  --out "$OUT/copies.json"
has copies && TAIL=16 part copies_bv64 70 python3 benchmarks/tune_replay.py $COPY_SHAPES --read fp8 --block-v 64 \
  --warps 4 --out "$OUT/copies_bv64.json"
has spec && TAIL=40 part spec 150 python3 -m replay_compile.cli bench spec --T 1,2,4,8 --batch 256 \
  --acceptance 0.5,0.8,1.0,text --window 8 --steps 8 --out "$OUT/spec_grid_256.json"
echo total $SECONDS
