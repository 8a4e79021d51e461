#!/usr/bin/env bash
# models helper's GPU run (issue 5): transformers hybrids end to end under replayssm, and `replayssm bench model`.
# Runtime: <= ~6 min in all, each part time-boxed (a part cut short keeps what it wrote under $OUT); the e2e tests
# are in final_check.sh (E2E=kernels, E2E=inductor): 130 s ran 4 of their 7 cases on 2026-12-03.
#   bench at batch 256, all columns, CUDA graphs (reduce-overhead), 75 s per model                    <= 225 s
#   bench at batch 1 (compile vs replayssm: the "no slower at batch 1" target)                        <= 100 s
#   merged table/JSON/plot of both                                                                     ~ 5 s
#   MODELS_SWEEP=1: batch 8,32,128 of the GDN stack                                                   +180 s
#   PROFILE=1: torch.profiler kernel tables of a b256 step (compile, replay) of the GDN and KDA stacks  +180 s
# Compiles dominate (one Inductor compile per column and batch). Usage: bash benchmarks/gpu/models.sh [commit]
set -u
source "$(dirname "$0")/part.sh"
gpu_setup models_log.txt "${1:-}"
ensure_transformers
BENCH=(python3 -m replay_compile.cli bench model)
for model in qwen3.5-122b nemotron3-super kimi-linear; do  # one time box per model; JSON saved after every cell
  TAIL=10 part "bench_b256_$model" 75 "${BENCH[@]}" --models "$model" --batch 256 --modes reduce-overhead \
    --columns eager,compile,replay,no-recurrent,replay-fp8 --out "$OUT/models_bench_b256_$model.json"
done
TAIL=12 part bench_b1 100 "${BENCH[@]}" --batch 1 --modes reduce-overhead --columns compile,replay \
  --out "$OUT/models_bench_b1.json"
TAIL=40 part bench_all 20 "${BENCH[@]}" --merge "$OUT"/models_bench_b*.json --out "$OUT/models_bench.json" \
  --plot "$OUT/models_bench.png"
if [ -n "${PROFILE:-}" ]; then  # optional (+~3 min): kernels of a b256 step, compile vs replay, GDN and KDA stacks
  for model in qwen3.5-122b kimi-linear; do
    TAIL=4 part "profile_$model" 90 "${BENCH[@]}" --models "$model" --batch 256 --modes reduce-overhead \
      --columns compile,replay --steps 16 --repeats 1 --profile "$OUT/models_profile.txt" --out "/tmp/profile_$model.json"
  done
fi
if [ -n "${MODELS_SWEEP:-}" ]; then  # optional (+~3 min): batch 8, 32, 128 of the GDN stack
  TAIL=12 part bench_sweep 180 "${BENCH[@]}" --models qwen3.5-122b --batch 8,32,128 --modes reduce-overhead \
    --columns compile,replay,replay-fp8 --out "$OUT/models_bench_sweep.json"
fi
