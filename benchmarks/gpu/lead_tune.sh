# Replay-template tuning run (lead): GPU tests of the kernels, then the tiling sweep (~7 min on an H200).
# .oldpkg (optional, carried): an older replay_compile to time beside the current one.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
t0=$SECONDS
timeout 130 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels.py 2>&1 | grep -v "^  \|^$\|Warning" | tail -15 | cut -c1-300
echo "pytest took $((SECONDS-t0))s"
timeout 130 python3 benchmarks/tune_replay.py --read none,fp8 --block-v 0,32 --warps 2,4 --out $OUT/tune_a.json 2>&1 | grep -v Warning | cut -c1-200
[ -d .oldpkg ] && PYTHONPATH=$PWD/.oldpkg timeout 50 python3 benchmarks/tune_replay.py --read none --out $OUT/tune_old.json 2>&1 | grep -v Warning | cut -c1-200
timeout 90 python3 benchmarks/tune_replay.py --read none --batch 1,256 --verify 8 --out $OUT/tune_c.json 2>&1 | grep -v Warning | cut -c1-200
echo total $SECONDS
