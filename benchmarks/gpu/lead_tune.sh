# Replay-template tuning sweep (lead), ~4 min on an H200: warps at batch 256, fp8 copies, batch 1 and verify T = 8.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
timeout 120 python3 benchmarks/tune_replay.py --read none --warps 2,4 --out $OUT/tune_a.json 2>&1 | grep -v Warning | cut -c1-200
timeout 50 python3 benchmarks/tune_replay.py --read fp8 --out $OUT/tune_b.json 2>&1 | grep -v Warning | cut -c1-200
timeout 60 python3 benchmarks/tune_replay.py --read none --batch 1,256 --warps 2 --verify 8 --out $OUT/tune_c.json 2>&1 | grep -v Warning | cut -c1-200
echo total $SECONDS
