#!/usr/bin/env bash
# Times benchmarks/experiments/2026-12-04_read_copy_dots.patch (NOTE [read-copy dots] in the patch: a one-token
# call's non-flush rows take base^T q / base^T k of an fp8 copy from one fp16 tl.dot) on a patched copy of the
# package: its GPU tests (the patch's tests/test_read_copy_dots.py at the real head sizes and value tiles, and the
# kernel tests that read copies: bit-exact copies, a CUDA-graph loop on an fp8 copy), then fp8 steps at batch 256 with the dots off (REPLAY_COPY_DOTS=0: main's path, same tree) and on,
# the latter under register caps 168 (default), 200 and 232 (the sm_90 compile spilled 412 bytes at 168 where main
# spills 176, 12 at 232). ~6 min on a fresh H200.
# Usage: bash benchmarks/gpu/read_copy_dots.sh   (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup copy_dots_log.txt
dir=/tmp/variant_read_copy_dots
rm -rf "$dir"; mkdir -p "$dir"; cp -r replay_compile tests "$dir/"
(cd "$dir" && git apply "$OLDPWD/benchmarks/experiments/2026-12-04_read_copy_dots.patch") || exit 1
env PYTHONPATH="$dir" python3 -P -c "import replay_compile as r; assert r.__file__.startswith('$dir'), r.__file__"
TAIL=6 part tests 220 env PYTHONPATH="$dir" python3 -P -m pytest -m gpu -q -x -p no:cacheprovider \
  "$dir/tests/test_read_copy_dots.py" "$dir/tests/test_kernels.py" -k "read_cop or cuda_graph"
TUNE=(env PYTHONPATH="$dir" python3 -P benchmarks/tune_replay.py --batch 256 --read fp8)
TAIL=8 part plain 90 env REPLAY_COPY_DOTS=0 "${TUNE[@]}" --out "$OUT/copy_dots_off.json"
TAIL=14 part dots 200 env REPLAY_COPY_DOTS=1 "${TUNE[@]}" --maxnreg 0,200,232 --out "$OUT/copy_dots_on.json"
echo total $SECONDS
