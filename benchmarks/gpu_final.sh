#!/usr/bin/env bash
# One H200 call that checks the kernels and records every benchmark (device time is scarce: each part
# has a time limit and writes under $OUT as it goes). Usage: bash benchmarks/gpu_final.sh <commit>
# Carry the fla-core wheel (.whl/fla_core-*.whl) for the fla column. ~8.5 min in all.
# Lesson of 2026-12-02 (second session): on a fresh machine Triton and Inductor compiles fill these slots
# (pytest_kernels needed > 80 s, bench kernels with fla > 120 s for 2 rows); give each issue its own call
# (benchmarks/gpu/{compiler,models,spec}.sh, benchmarks/gpu/lead_tune.sh) when device time allows.
set -u
export PYTHONUNBUFFERED=1 REPLAYSSM_COMMIT=${1:-unknown}
python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
if ls .whl/fla*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/fla*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
part() {  # part NAME SECONDS CMD...: run with a limit, keep its output, print its tail
  local name=$1 secs=$2; shift 2
  echo "=== $name (limit ${secs}s)"; local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.txt" 2>&1; echo "rc=$? in $((SECONDS - t0))s" | tee -a "$OUT/$name.txt"
  tail -n "${TAIL:-12}" "$OUT/$name.txt" | cut -c1-220
}
GPUTEST=(python3 -m pytest -m gpu -q -p no:cacheprovider -rf)
TAIL=6 part pytest_kernels 80 "${GPUTEST[@]}" tests/test_kernels.py
TAIL=34 part kernels 120 python3 -m replay_compile.cli bench kernels --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda \
  --batch 1,256 --window 16 --read none,bf16,fp8,fp4 --verify 8 --columns ours,standard,fla --warmup-ms 5 --rep-ms 20 \
  --out "$OUT/kernels.json"
if [ -d .oldpkg ]; then  # optional: an older replay_compile (carried) timed beside this one
  TAIL=8 PYTHONPATH=$PWD/.oldpkg part previous_template 30 python3 benchmarks/tune_replay.py --read none --out "$OUT/previous.json"
fi
TAIL=8 part pytest_backend 50 "${GPUTEST[@]}" tests/test_backend_gpu.py
TAIL=8 part pytest_models 40 "${GPUTEST[@]}" tests/models/test_generate_replay.py
TAIL=10 part model_b256 70 python3 -m replay_compile.cli bench model --batch 256 --modes reduce-overhead --steps 8 --repeats 2 \
  --columns compile,replay,replay-fp8,no-recurrent --out "$OUT/model_b256.json"
TAIL=8 part model_b1 30 python3 -m replay_compile.cli bench model --batch 1 --modes reduce-overhead --steps 8 --repeats 2 \
  --columns compile,replay --out "$OUT/model_b1.json"
for fam in gated_deltanet kda; do
  TAIL=14 part "accuracy_$fam" 30 python3 -m replay_compile.cli bench accuracy --families "$fam" --steps 131072 \
    --chunk 128 --max-seconds 22 --out "$OUT/accuracy_$fam.json" --no-progress
done
TAIL=12 part spec 35 python3 -m replay_compile.cli bench spec --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn --T 4,8 --batch 256 \
  --acceptance 0.8,text --steps 4 --out "$OUT/spec.json"
echo "total ${SECONDS}s"
