#!/usr/bin/env bash
# One H200 call that checks the kernels and records every benchmark (device time is scarce: each part
# has a time limit and writes under $OUT as it goes). Usage: bash benchmarks/gpu_final.sh <commit>
set -u
export PYTHONUNBUFFERED=1 REPLAYSSM_COMMIT=${1:-unknown} TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
part() {  # part NAME SECONDS CMD...: run with a limit, keep its output, print its tail
  local name=$1 secs=$2; shift 2
  echo "=== $name (limit ${secs}s)"; local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.txt" 2>&1; echo "rc=$? in $((SECONDS - t0))s" | tee -a "$OUT/$name.txt"
  tail -n "${TAIL:-12}" "$OUT/$name.txt" | cut -c1-200
}
TAIL=30 part kernels 140 python3 -m replay_compile.cli bench kernels --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda \
  --batch 1,256 --window 16 --read none,fp8 --verify 8 --columns ours,standard,fla --warmup-ms 10 --rep-ms 30 \
  --out "$OUT/kernels.json"
TAIL=14 part spec 50 python3 -m replay_compile.cli bench spec --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn --T 4,8 --batch 256 \
  --acceptance 0.8,text --steps 8 --out "$OUT/spec.json"
TAIL=40 part accuracy 90 python3 -m replay_compile.cli bench accuracy --families mamba2 --steps 131072 --chunk 128 \
  --out "$OUT/accuracy.json" --plot "$OUT/accuracy.png" --no-progress
TAIL=12 part pytest_gpu 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels.py
