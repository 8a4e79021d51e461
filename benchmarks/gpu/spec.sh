#!/usr/bin/env bash
# Issue 6 GPU checks (helper "spec"). Runs from the repo root on one H200; writes under "$OUT".
# Runtime: <= 405 s in all (setup ~15 s + the part limits below; each part is cut by `timeout`).
#   accuracy_gated_deltanet /    60 s each  bench accuracy, 128K tokens, CUDA-graph replays; decoding stops
#   accuracy_kda                            after 45 s with the lengths reached (the JSON is always written)
#   accuracy_hf                  60 s       bench accuracy --hf (Qwen3.5 GDN hybrid, float64), up to 32K tokens,
#                                           stops after 40 s of decoding with the lengths reached (needs transformers)
#   soak_gpu                    100 s       tests/test_soak.py::test_soak_gpu, 8 s of decoding a family at batch 64
#                                           (+ the kernels' compiles, outside that time box)
#   spec_example_gpu             60 s       examples/speculative_decoding.py on the GPU (Inductor compile; kept
#                                           logits close to greedy decoding's)
#   spec_transformers_gpu        50 s       transformers integration on the GPU (Qwen3.5 and Mamba-2; skipped
#                                           without transformers): same tokens, logits close
set -u
export TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
source "$(dirname "$0")/part.sh"
gpu_setup spec_log.txt "${1:-}"
carried_wheels  # optional (fla, transformers, ...)
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" \
  | tee "$OUT/versions.txt"
python3 -c "import transformers; print('transformers', transformers.__version__)" >> "$OUT/versions.txt" 2>&1 \
  || echo "transformers missing: accuracy_hf fails, transformers GPU tests skip" | tee -a "$OUT/versions.txt"
for fam in gated_deltanet kda; do
  TAIL=24 part "accuracy_$fam" 60 python3 -m replay_compile.cli bench accuracy --families "$fam" --steps 131072 \
    --chunk 128 --max-seconds 45 --out "$OUT/accuracy_$fam.json" --plot "$OUT/accuracy_$fam.png" --no-progress
done
TAIL=20 part accuracy_hf 60 python3 -m replay_compile.cli bench accuracy --hf --hf-model qwen3_5 --steps 32768 \
  --max-seconds 40 --out "$OUT/accuracy_hf_qwen3_5.json"
TAIL=12 part soak_gpu 100 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_soak.py -k soak_gpu
TAIL=8 part spec_example_gpu 60 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_speculative_example.py
TAIL=8 part spec_transformers_gpu 50 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_integration_transformers.py -k "qwen3_5 or mamba2"
