#!/usr/bin/env bash
# Times the read-copy dots experiments on a patched copy of the package (NOTE [read-copy dots] in the patches: the
# non-flush rows of a call on an fp8 copy take base^T q_t / base^T k_t from one fp16 tl.dot before the token loop):
# PATCH=benchmarks/experiments/2026-12-04_read_copy_dots.patch (default; one-token calls) or
# ..._read_copy_dots_verify.patch (verify calls too, up to 16 columns). First the GPU tests (the patch's
# tests/test_read_copy_dots.py at the real head sizes and value tiles, and the kernel tests that read copies:
# bit-exact copies, a CUDA-graph loop on an fp8 copy), then fp8 calls at batch 256 with the dots off
# (REPLAY_COPY_DOTS=0: main's path, same tree) and on, the latter under register caps 0 (the default: 168 for
# one-token kv calls, 128 otherwise), 200 and 255. sm_90 compile (no commit, bytes spilled at the default cap, main ->
# patch): GDN step 152 -> 400 (one-token patch) / 220 (verify patch); with the verify patch GDN T = 8 968 -> 2468
# (588 at 255 registers, none at 4 warps), Mamba-2 T = 8 168 -> 816 (none at 255). ~6-8 min on a fresh H200.
# Usage: [PATCH=...] [VERIFY="--verify 4,8 --verify-read fp8"] bash benchmarks/gpu/read_copy_dots.sh
# (writes under $OUT)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup copy_dots_log.txt
dir=/tmp/variant_read_copy_dots
patched_copy "$dir" "${PATCH:-benchmarks/experiments/2026-12-04_read_copy_dots.patch}" replay_compile tests || exit 1
imports_from "$dir"
TAIL=6 part tests 220 env PYTHONPATH="$dir" python3 -P -m pytest -m gpu -q -x -p no:cacheprovider \
  "$dir/tests/test_read_copy_dots.py" "$dir/tests/test_kernels.py" -k "read_cop or cuda_graph"
read -r -a VERIFY_ARGS <<< "${VERIFY:-}"
TUNE=(env PYTHONPATH="$dir" python3 -P benchmarks/tune_replay.py --batch 256 --read fp8 "${VERIFY_ARGS[@]}")
TAIL=8 part plain 110 env REPLAY_COPY_DOTS=0 "${TUNE[@]}" --out "$OUT/copy_dots_off.json"
TAIL=14 part dots 240 env REPLAY_COPY_DOTS=1 "${TUNE[@]}" --maxnreg 0,200,255 --out "$OUT/copy_dots_on.json"
echo total $SECONDS
