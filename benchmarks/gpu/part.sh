# Sourced by the GPU scripts. `gpu_setup LOG [COMMIT]`: unbuffered Python, $OUT created, parts logged to $OUT/LOG,
# the package installed (the backend's entry point exists only then). `part NAME SECONDS CMD...` runs CMD with a time limit, appends its output to
# one log ($PART_LOG, default $OUT/log.txt: the device tool returns at most 8 files from $OUT) and prints
# the last $TAIL lines (Warning lines left out of the preview, not of the log).
part() {
  local name=$1 secs=$2; shift 2
  echo "=== $name (limit ${secs}s)"; local t0=$SECONDS log=/tmp/part_$name.txt
  timeout "$secs" "$@" > "$log" 2>&1; echo "rc=$? in $((SECONDS - t0))s" | tee -a "$log"
  { echo "=== $name"; cat "$log"; } >> "${PART_LOG:-$OUT/log.txt}"
  grep -v Warning "$log" | tail -n "${TAIL:-20}" | cut -c1-240
}

# transformers (test extra) from wheels carried in .whl/models where the machine has none
# (pip download transformers==5.17.0 for cp312 manylinux: only missing dependencies get installed)
ensure_transformers() {
  python3 -c "import transformers" 2>/dev/null || python3 -m pip install -q --no-index --find-links .whl/models \
    "transformers==5.17.0" 2>&1 | grep -v WARN | tail -2
  python3 -c "import transformers; print('transformers', transformers.__version__)"
}

# optional wheels carried in .whl (fla-core, ...: run's carry [".whl"]) into a folder of their own, offline, and on
# PYTHONPATH; returns 1 where none was carried
carried_wheels() {
  ls .whl/*.whl > /dev/null 2>&1 || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
}

# Nsight Compute on one replay-kernel launch (add -s N: the launches to skip), the sections the profiling scripts read
NCU_REPLAY=(ncu --clock-control none -k regex:replay_kernel -c 1 --section SpeedOfLight --section Occupancy
            --section LaunchStats --section WarpStateStats --section SchedulerStats --section SourceCounters)

gpu_setup() {
  export PYTHONUNBUFFERED=1 REPLAYSSM_COMMIT=${2:-${REPLAYSSM_COMMIT:-unknown}}
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; PART_LOG="$OUT/$1"
  python3 -m pip install --no-build-isolation --no-deps -e . -q 2>&1 | grep -v WARN | tail -2
}

# `patched_copy DIR PATCH FOLDER...`: the repository's FOLDERs copied into DIR with the parts of PATCH under them
# applied (returns 1 if it does not apply); `imports_from DIR` checks that Python imports replay_compile from there.
# Run the copy as `env PYTHONPATH=DIR python3 -P ...`: "python3 -m" alone puts the repository's package first.
patched_copy() {
  local dir=$1 patch; patch=$(realpath "$2"); shift 2
  local include=() folder
  for folder in "$@"; do include+=("--include=$folder/*"); done
  rm -rf "$dir"; mkdir -p "$dir"; cp -r "$@" "$dir/"
  (cd "$dir" && git apply "${include[@]}" "$patch")
}
imports_from() {
  env PYTHONPATH="$1" python3 -P -c "import replay_compile as r; assert r.__file__.startswith('$1'), r.__file__"
}
