#!/usr/bin/env bash
# Times the pipelined-tiles experiment (benchmarks/experiments/2026-12-04_pipelined_tiles.patch, NOTE [two row
# loops] there): rows that do not flush run a loop of their own, without the flush path's barriers, so Triton's
# software pipeliner can prefetch the next (head, value tile) pair's checkpoint tile into shared memory
# (cp.async) while the current one is reduced. main first, then the patch with REPLAY_ITEM_STAGES=2 (prefetch)
# and =1 (the two loops alone), then the GPU kernel tests on the patch. Timed on `ad2cd4b` (fifteenth session); the
# patch does not apply to later commits, which carry a narrower form of it (NOTE [two row loops]).
# Usage: [TUNE="--read none,fp8 --verify 8"] [BOX=170] [STAGES="2 1"] bash benchmarks/gpu/item_stages.sh (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup item_stages_log.txt
read -r -a TUNE_ARGS <<< "${TUNE:---read none,fp8 --verify 8}"
dir=/tmp/variant_pipelined_tiles
patched_copy "$dir" benchmarks/experiments/2026-12-04_pipelined_tiles.patch replay_compile tests || exit 1
imports_from "$dir"
TAIL=12 part main "${BOX:-170}" python3 benchmarks/tune_replay.py "${TUNE_ARGS[@]}" --out "$OUT/stages_main.json"
for st in ${STAGES:-2 1}; do
  TAIL=12 part "stages$st" "${BOX:-170}" env REPLAY_ITEM_STAGES="$st" PYTHONPATH="$dir" python3 -P \
    benchmarks/tune_replay.py "${TUNE_ARGS[@]}" --out "$OUT/stages_$st.json"
done
if [ -n "${TESTS:-1}" ]; then
  TAIL=4 part tests 220 env REPLAY_ITEM_STAGES=2 PYTHONPATH="$dir" python3 -P -m pytest -m gpu -q -x -p no:cacheprovider \
    "$dir/tests/test_kernels.py"
fi
echo total $SECONDS
