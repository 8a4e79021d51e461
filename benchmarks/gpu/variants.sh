#!/usr/bin/env bash
# Times kernel patches of benchmarks/experiments beside main in one run: main first, then each patch applied to a
# copy of replay_compile/ (tune_replay.py prints which copy it imports). Per tree on the H200 (2026-12-03): 132 s with
# TUNE="--read none,fp8 --verify 8" (three shapes); the default TUNE (verify T = 4 and 8) and --fold-unroll 0,8 did
# not fit the 150 s box (BOX=seconds widens it); TESTS=1 also runs the GPU kernel tests on each patched copy
# (~150-170 s each on a warm H200; more than 200 s on a cold H100 on 2026-12-07, hence TEST_BOX, default 400 s; a variant
# counts only after they pass there).
# TEST_K narrows those tests (pytest -k: "not chunked_verify" for a patch of the replay template only).
# Usage: [TUNE="--read none --verify 8"] [BOX=200] [TESTS=1 [TEST_K=...]] bash benchmarks/gpu/variants.sh benchmarks/experiments/A.patch ...
set -u
source "$(dirname "$0")/part.sh"
gpu_setup variants_log.txt
read -r -a TUNE_ARGS <<< "${TUNE:---read none,fp8 --verify 4,8}"
TAIL=16 part main "${BOX:-150}" python3 benchmarks/tune_replay.py "${TUNE_ARGS[@]}" --out "$OUT/variant_main.json"
for patch in "$@"; do
  name=$(basename "$patch" .patch); dir=/tmp/variant_$name
  if ! patched_copy "$dir" "$patch" replay_compile; then echo "$name: does not apply"; continue; fi
  if [ -n "${TESTS:-}" ]; then  # -P: "python3 -m" would put the repository (main's package) before PYTHONPATH
    imports_from "$dir"
    TAIL=4 part "tests_$name" "${TEST_BOX:-400}" env PYTHONPATH="$dir" python3 -P -m pytest -m gpu tests/test_kernels.py -q -x \
      -p no:cacheprovider ${TEST_K:+-k "$TEST_K"}
  fi
  TAIL=16 part "$name" "${BOX:-150}" env PYTHONPATH="$dir" python3 benchmarks/tune_replay.py "${TUNE_ARGS[@]}" \
    --out "$OUT/variant_$name.json"
done
echo total $SECONDS
