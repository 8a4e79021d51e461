#!/usr/bin/env bash
# What the default verify (templates/verify.py NOTE [default verify]) and the read copies need from a GPU, in parts
# (in the order of the script: a call cut at its limit keeps the parts it finished).
# tests to spec ran on an H100 in the thirtieth session, fan, fantests, spec16 and prefold in the thirty-first
# (BENCHMARKS.md, 2026-12-07: the fan-out patch dropped, prefold found Mamba-2's key-contiguous chunks), keychunk in
# the thirty-second (passed: the patch landed), nfcap and flushwl in the thirty-third (a cap of 96 landed; the work
# list lost, rebased since), nfcheck there too (tests passed; 4 warps lost); they stay to repeat after a change to these kernels.
# Parts products and copydots ran on an H200 in the thirty-fourth session, lost, and left with their patches
# (benchmarks/experiments/2026-12-07_raw_fold_as_products.patch, ..._copy_reads_as_products.patch).
# probe, ncucopy, m2flush and nfstages ran on an H100 in the thirty-fifth (m2flush's split became the default),
# dtests, kda, ncuverify and nf64 in the thirty-sixth (GDN's 2-stage copies and KDA's one-program-a-head verify became
# defaults; nf64 lost). items, verifyw, fla, unroll, fanx and fanxtests have not run (fanx's fan-outs are the flush
# launch's forerunners: time them only beside it).
#   tests   the fp32-activation verify tests (the default table's fp32 entries rest on them), and the
#           chunked verify's GDN / KDA tilings timed below (TESTS=copies: the read-copy tests instead, TESTS=all: both)
#   gdn     GDN verify tilings around the default (T = 8 stood at 1.36x one standard step on an H100; asked <= 1.3x)
#   kda     KDA's verify (default since the thirty-sixth session: chunked from 8 drafts, 2 warps on value tiles of
#           128, one program a head) against the 1-warp tiles of 64 it replaced and other one-program-a-head forms; ~2 min
#   copies  read-copy steps of GDN / KDA with the non-flush loop pipelined (2 stages), which lost before the copies
#           went key-major (NOTE [two row loops]), and fp8 tiles of 64 values on 4 warps (more bytes in flight)
#   spec    issue 6's speculative grid at batch 256 with the default verify, window $SPEC_WINDOW (16: where the
#           thirty-first session's H100 met issue 6's targets)
#   fan     benchmarks/experiments/2026-12-07_flush_fan_out.patch (one pair a flushing program) beside main: GDN and
#           KDA steps, no copy / fp8 / 4-bit, L = 8 and 16 (timed at L = 8 and dropped)
#   fanx    the fan-out with idle programs returning at once (2026-12-07_flush_fan_out_early_exit.patch) and the
#           fan-out patch's raw-replay half alone (2026-12-07_raw_fold_key_layout.patch: keys in the tile's layout once
#           a record; sm_90: GDN fp8 step 75 -> 71 barriers but 228 -> 264 bytes spilled), beside main (not run yet)
#   fanxtests fantests on the early-exit patch (run it where fanx wins)
#   fantests the replay template's GPU kernel tests on the patched copy (not the chunked verify's; > 200 s on a cold
#           machine, so apart from fan: with both, one 600 s call may not finish)
#   items   read-copy steps at L = 8 with 1 and 2 (head, value tile) pairs a program against the default 4: on the
#           thirtieth session's H100 run the flushing programs set GDN's copy steps (a non-flush loop 8-15% faster
#           left the step where it was), and fewer pairs make each flushing program shorter (not timed yet)
#   prefold the chunked verify of 8 drafts with every row folding its records first (window 0, as at window 8 in
#           issue 6's grid: Mamba-2 1650 us there against GDN's 975, 1.23x one standard step at L = 24) and with none
#           (window 16), in each family's layout and in the other (is it Mamba-2's key-contiguous store?), and
#           Mamba-2 with GDN's bf16x3 products (or its bf16x2?)
#   spec16  T = 4 and 8 at window 16: Mamba-2's T = 8 verify at window 8 runs at L = 8, where nearly every row folds
#           its window first (2.1-2.3x one standard step; 1.23x at L = 24 in tune_replay.py)
#   flushwl  the flushing rows' launch as a work list walking only their (unit, pair) items
#           (benchmarks/experiments/2026-12-07_flush_work_list.patch; main: a grid over every row's items, whose
#           programs on rows that do not flush cost 20-40 us): the replay template's GPU tests on the patched copy, then
#           GDN / KDA steps beside main, no copy / fp8 / 4-bit, L = 8, 16, one launch and two. Lost in the thirty-third
#           session with 8 programs an SM (each walked ~4 items); rebased in the thirty-fourth with as many programs as
#           a steady state's flushing rows have items (ceil(B / L) rows: one item a program, no idle programs;
#           `flush_programs`, 0 the grid). Runs ~10 min: a call of its own
#   nfcap    the non-flush rows' launch of read-copy steps under register caps of 112, 96 and 80 (`nonflush_registers`;
#           it uses 128-163 registers under the default 168, where the flushing rows' launch needs them: sm_90, L = 16,
#           at 96 GDN fp8 / 4-bit and KDA fp8 spill nothing, at 80 GDN fp8 nothing, KDA fp8 68 bytes); GDN / KDA, L = 16
#   nfcheck  the replay template's GPU tests (not the chunked verify's) with the non-flush launch's default cap of 96
#            (NOTE [non-flush register cap]), and read-copy steps of GDN / KDA at L = 16 with that launch on 2 or 4
#            warps (`nonflush_warps`) under caps of 96 (2 warps' default; none on 4), 80 and 64 (sm_90, 4 warps at 64:
#            no spills, 8 programs / 32 warps an SM against 2 warps' 10 / 20), then the flushing rows' launch on 4 warps
#            (uncapped and at 128) beside the default non-flush launch
#   unroll   read-copy steps of GDN / KDA at L = 8, 16 with the flushing rows' fold unrolled by 2, 4 and 8 (NOTE [fold
#            unrolling]: read copies on `kv` tiles keep 1, from when the fold shared a kernel with the copy's
#            dequantisation; in the flush launch it no longer does. sm_90, L = 16, flushing rows' launch at 1 / 2 / 4 /
#            8: GDN fp8 166 / 168 / 168 / 168 registers, 0 spilled; GDN 4-bit 16 / 8 / 32 / 8 bytes spilled; KDA fp8
#            0 / 12 / 32 / 80). Where one wins, make it the default and run PARTS=nfcheck (its tests) on it
#   nfstages read-copy steps of GDN / KDA at L = 8, 16 with the non-flush rows' loop pipelined over 2 stages (8 pairs
#            a program) now that it has a launch of its own: on the thirtieth session's H100, before the flush launch,
#            2 stages made GDN's non-flush rows 8-15% faster while the flushing rows in the same launch set the step
#            (sm_90, L = 16, non-flush launch at 2 stages: GDN fp8 / 4-bit 0 bytes spilled, KDA fp8 132);
#            value tiles of 16 and 64 (32 by default; both launches; 64 takes 8 warps, uncapped: sm_90 GDN fp8 non-flush
#            launch 101 registers, 0 spilled) at 1 and 2 stages, then the flushing rows' launch
#            on 2 warps under caps of 128 and 112 (sm_90, L = 16, bytes spilled at
#            168 / 128 / 112: GDN fp8 0 / 68 / 144, 4-bit 16 / 372 / 640, KDA fp8 0 / 104 / 180: more programs an
#            SM for the latency-bound record chain, against spills)
#   m2flush  Mamba-2's read-copy steps (`vk` tiles, one launch by default, NOTE [two row loops]) with rows split and
#            the flushing rows' launch (`--stages 1 --flush-items 1`), its GPU tests first: on the H200 (2026-12-07)
#            Mamba-2's 4-bit step lost to the standard one (0.80x at L = 8, 0.99x at 16) where its fp8 step ran 1.93x.
#            sm_90, L = 16, one launch -> flushing rows' / other rows' launch, bytes spilled: fp8 68 -> 172 / 0, 4-bit
#            820 -> 672 / 0 (other rows 1632 / 1904 SASS instructions, against 3728 / 7368 in one launch); the
#            flushing rows' launch also at 168 registers
#   ncucopy  Nsight Compute on the read-copy steps' two launches (NOTE [flush launch]): GDN fp8's non-flush launch
#            (37% of bandwidth on the H200, 2026-12-07; tensor-core reads made it slower, so not the FMAs: which
#            stalls?), its flushing rows' launch (~105 us of its 378 us step at L = 16), KDA fp8's non-flush launch.
#            Sections as ncu_replay.sh; ~3 min
#   nfbv     read-copy steps of GDN / KDA with the non-flush rows' launch alone on value tiles of 64
#            (``nonflush_block_v``; nf64 put both launches there and lost to the flushing rows' launch), caps 96 / 128,
#            after its GPU tests; ~5 min
#   ncuverify Nsight Compute on the default verify of 8 drafts at L = 24 (window 16 + T) of KDA and GDN: both were
#            latency-bound at 12.5% occupancy (255 registers) on an H100 (2026-12-08, KDA then on 1-warp tiles of 64,
#            since on one 2-warp program a head); asked <= 1.3x one standard step (H200: KDA 4.13x, GDN 1.82x). ~2 min
#   verifyw  verify of 4 and 8 drafts at windows 8 and 16 (L = w + T) for the three shapes: on the H200 (2026-12-07,
#            window 16) Mamba-2 1.47x, GDN 1.82x, KDA 4.13x one standard step, where the H100 had GDN at 1.23-1.29x
#            at window 8 (asked <= 1.3x), ~2 min
#   fla      issue 3's table with flash-linear-attention's column (`bench kernels --quick`, three shapes, batch 1 and
#            256): needs the fla-core wheel carried in .whl (run's carry [".whl"]), ~4 min
#   defaults the GPU tests a change of the replay template's defaults needs, then the standing table (~6 min;
#            dtests: the tests alone, for a call that times the defaults in fla's table instead)
#   nf64     read-copy steps of GDN / KDA with value tiles of 64 on 2 warps (the probe's best fp8 tiling: 82% of
#            bandwidth against 70% at tiles of 32, H100; nfstages timed tiles of 64 only on their default 8 warps).
#            sm_90, GDN fp8 L = 16: non-flush launch at 128 registers 0 bytes spilled, flushing rows' at 255 12 bytes
#   probe    benchmarks/copy_read_probe.py: a plain kernel reading an fp8 (and fp32) key-major copy at GDN 122B's
#            batch 256 (the two key reductions of a delta-rule row, no window) over value tiles, warps, pairs a
#            program, contiguous values a load, stages: can any tiling read the copy near the bandwidth? ~3 min
#   keychunk the GPU tests of Mamba-2's default verify on key-contiguous states in chunks of 32 keys (NOTE
#           [key-contiguous chunks]) and of the default verify's table (20 s on an H100, 2026-12-07)
# Usage: [FAN_WINDOWS=8] [PARTS="defaults dtests nfbv nf64 ncuverify probe tests gdn kda copies spec fan fantests items prefold spec16 keychunk nfcap nfcheck ncucopy nfstages m2flush verifyw fla unroll flushwl fanx fanxtests"] [TESTS=verify|copies|all] bash benchmarks/gpu/verify_next.sh [commit]
# (writes under $OUT; ~15 min with every part: call it in two parts)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup verify_next_log.txt "${1:-}"
PARTS=${PARTS:-"defaults"}  # ~6 min on a cold machine (on an H200 then: fla spec, verifyw; flushwl, unroll)
has() { [[ " $PARTS " == *" $1 "* ]]; }
COPY_TESTS="read_copies_and_rounding_gpu or two_row_loops_short_last_program_gpu or e2m1 or e4m3"
VERIFY_TESTS="chunked_verify_gpu_fp32_activations or (chunked_verify_gpu and (gdn or kda))"
has tests && TAIL=20 part tests 330 python3 -m pytest -m "gpu or not slow" tests/test_kernels.py -q -p no:cacheprovider \
  --tb=line -k "$(case ${TESTS:-verify} in copies) echo "$COPY_TESTS" ;; all) echo "$COPY_TESTS or $VERIFY_TESTS" ;;
                   *) echo "$VERIFY_TESTS" ;; esac)"
ONE="nw=1,bt=8"
GDN_FORMS=${GDN_FORMS:-"tokens;chunked:dot=bf16x3,$ONE,kc=16;chunked:dot=bf16x3,$ONE,kc=32;chunked:dot=bf16x3,$ONE,kc=16,bv=32;chunked:dot=bf16x2,$ONE,kc=32;chunked:dot=bf16x3,$ONE,kc=16,bv=128;chunked:dot=bf16x3,$ONE,kc=16,mr=128"}
has gdn && TAIL=20 part gdn 150 python3 benchmarks/tune_replay.py --shapes qwen3.5-122b-gdn --batch 256 --no-steps \
  --verify 8,4 --verify-window 16 --verify-form "$GDN_FORMS" --out "$OUT/verify_gdn.json"
# KDA's default (auto: 2 warps on tiles of 128) against the 1-warp tiles of 64 it replaced and its neighbours: sm_90,
# T = 8, L = 24: 2 warps 8320 SASS instructions, 255 registers, 36 bytes spilled; 1 warp 13912 / 255 / 72; 4 warps on
# tiles of 128 4832 / 253 / none (slowest on an H100)
B3="chunked:dot=bf16x3,bt=8,kc=16"
KDA_FORMS="$B3,nw=1;$B3,nw=4,bv=128;$B3,nw=2,bv=64;chunked:dot=bf16x2,bt=8,kc=16,nw=2,bv=128"
has kda && TAIL=4 part kda_tests 150 python3 -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider --tb=short \
  -k "chunked_verify_gpu and kimi and block_v"
has kda && TAIL=20 part kda 150 python3 benchmarks/tune_replay.py --shapes kimi-linear-kda --batch 256 --no-steps \
  --verify 8,4 --verify-window 16 --verify-form "auto;$KDA_FORMS" \
  --out "$OUT/verify_kda.json"
has probe && TAIL=60 part probe 200 python3 benchmarks/copy_read_probe.py --read fp8 --out "$OUT/copy_read_probe.json"
has probe && TAIL=8 part probe_fp32 60 python3 benchmarks/copy_read_probe.py --read fp32 --contig 4 --items 4 \
  --out "$OUT/copy_read_probe_fp32.json"
KV_SHAPES="--shapes qwen3.5-122b-gdn,kimi-linear-kda --batch 256"  # the two kv-tile families at batch 256
COPY_SHAPES="$KV_SHAPES --window 8 --stages=-1,2"
has copies && TAIL=24 part copies 130 python3 benchmarks/tune_replay.py $COPY_SHAPES --read fp8,fp4 \
  --out "$OUT/copies.json"
has copies && TAIL=16 part copies_bv64 70 python3 benchmarks/tune_replay.py $COPY_SHAPES --read fp8 --block-v 64 \
  --warps 4 --out "$OUT/copies_bv64.json"
has spec && TAIL=40 part spec 150 python3 -m replay_compile.cli bench spec --T 1,2,4,8 --batch 256 \
  --acceptance 0.5,0.8,1.0,text --window "${SPEC_WINDOW:-16}" --steps 8 --out "$OUT/spec_grid_256.json"
KEYCHUNK_TESTS="(chunked_verify_gpu and nemotron3-super and bf16x2 and key_chunk and 32 and not fp32) or default_verify"
has keychunk && TAIL=4 part keychunk_tests 200 python3 -m pytest -m "gpu or not slow" tests/test_kernels.py -q \
  -p no:cacheprovider --tb=short -k "$KEYCHUNK_TESTS"
X=benchmarks/experiments
FAN_TUNE="$KV_SHAPES --read none,fp8,fp4 --window ${FAN_WINDOWS:-8,16}"
# `fan_tests NAME PATCH`: the replay template's GPU kernel tests (not the chunked verify's) on a copy with PATCH applied
fan_tests() {
  patched_copy "/tmp/$1" "$2" replay_compile && imports_from "/tmp/$1" && TAIL=4 part "$1" 400 \
    env PYTHONPATH="/tmp/$1" python3 -P -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider -k "not chunked_verify"
}
has nfcap && TAIL=20 part nfcap 150 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 16 \
  --nonflush-maxnreg 0,112,96,80 --out "$OUT/nonflush_caps.json"
has nfcheck && TAIL=4 part nfcheck_tests 330 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider \
  -k "not chunked_verify"
has nfcheck && TAIL=30 part nfcheck 200 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 16 \
  --nonflush-warps 2,4 --nonflush-maxnreg 0,80,64 --out "$OUT/nonflush_warps.json"
has nfcheck && TAIL=12 part flush_warps 80 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 16 \
  --warps 4 --maxnreg 0,128 --nonflush-warps 2 --nonflush-maxnreg 96 --out "$OUT/flush_warps.json"
# a read-copy call launches the flushing rows' kernel, then the others' (-s 1: the second); with --no-commit no row
# flushes, so the profiled launch is the non-flush rows' alone
has ncucopy && TAIL=40 part ncu_gdn_fp8_nonflush 90 "${NCU_REPLAY[@]}" -s 1 python3 benchmarks/profile_replay.py \
  qwen3.5-122b-gdn --read fp8 --no-commit
has ncucopy && TAIL=40 part ncu_gdn_fp8_flushing 90 "${NCU_REPLAY[@]}" -s 0 python3 benchmarks/profile_replay.py \
  qwen3.5-122b-gdn --read fp8
has ncucopy && TAIL=40 part ncu_kda_fp8_nonflush 90 "${NCU_REPLAY[@]}" -s 1 python3 benchmarks/profile_replay.py \
  kimi-linear-kda --read fp8 --no-commit
NCU_VERIFY=("${NCU_REPLAY[@]/regex:replay_kernel/regex:verify_kernel}" -s 1)
VERIFY_CALL=(--tokens 8 --window 24 --no-commit --steps 2)
has ncuverify && TAIL=40 part ncu_kda_verify8 90 "${NCU_VERIFY[@]}" python3 benchmarks/profile_replay.py \
  kimi-linear-kda "${VERIFY_CALL[@]}"
has ncuverify && TAIL=40 part ncu_gdn_verify8 90 "${NCU_VERIFY[@]}" python3 benchmarks/profile_replay.py \
  qwen3.5-122b-gdn "${VERIFY_CALL[@]}"
# defaults: after a change of the replay template's defaults, its GPU tests of split row loops, flush launches, read
# copies and CUDA graphs, then the standing table (BENCHMARKS.md's top section) at the new defaults
DEFAULT_TESTS="flush_launch_gpu or two_row_loops or read_copies or cuda_graph or e2m1 or e4m3"
{ has defaults || has dtests; } && TAIL=4 part defaults_tests 240 python3 -m pytest -m gpu tests/test_kernels.py -q \
  -p no:cacheprovider --tb=short -k "$DEFAULT_TESTS"
has defaults && TAIL=30 part standing 200 python3 benchmarks/tune_replay.py --shapes \
  nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda --batch 256 --read none,fp8,fp4 --window 8,16 \
  --out "$OUT/standing.json"
has nf64 && TAIL=36 part nf64 200 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 8,16 \
  --block-v 64 --warps 2 --maxnreg 255 --nonflush-maxnreg 128,112 --stages=-1,2 --out "$OUT/nonflush_tiles64.json"
has nfbv && TAIL=4 part nfbv_tests 150 python3 -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider \
  --tb=short -k "nonflush_value_tile_gpu"
has nfbv && TAIL=36 part nfbv 200 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 8,16 \
  --nonflush-block-v 0,64 --nonflush-maxnreg 0,128 --out "$OUT/nonflush_block_v.json"
has verifyw && TAIL=16 part verifyw 150 python3 benchmarks/tune_replay.py --shapes \
  nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda --batch 256 --no-steps --verify 8,4 --verify-window 8,16 \
  --out "$OUT/verify_windows.json"
has fla && carried_wheels && TAIL=45 part fla 300 python3 -m replay_compile.cli bench kernels --quick \
  --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn,kimi-linear-kda --verify 8 --out "$OUT/bench_quick_fla.json"
has nfstages && TAIL=20 part nfstages 150 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 8,16 \
  --stages=-1,2 --out "$OUT/nonflush_stages.json"
has nfstages && TAIL=20 part nf_tiles 120 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 16 \
  --block-v 16,64 --stages=-1,2 --out "$OUT/nonflush_tiles.json"
has nfstages && TAIL=12 part flush_caps 90 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 16 \
  --maxnreg 128,112 --nonflush-maxnreg 96 --out "$OUT/flush_caps.json"
has m2flush && TAIL=4 part m2flush_tests 150 python3 -m pytest -m gpu tests/test_kernels.py -q -p no:cacheprovider \
  --tb=short -k "flush_launch_gpu"
M2="--shapes nemotron3-super-mamba2 --batch 256 --read fp8,fp4 --window 8,16"
has m2flush && TAIL=10 part m2flush 90 python3 benchmarks/tune_replay.py $M2 --out "$OUT/m2_one_launch.json"
has m2flush && TAIL=12 part m2flush_split 120 python3 benchmarks/tune_replay.py $M2 --stages 1 --flush-items 1 \
  --maxnreg 0,168 --nonflush-maxnreg 96 --out "$OUT/m2_flush_launch.json"
has unroll && TAIL=36 part unroll 200 python3 benchmarks/tune_replay.py $KV_SHAPES --read fp8,fp4 --window 8,16 \
  --fold-unroll 0,2,4,8 --out "$OUT/flush_unroll.json"
has flushwl && fan_tests flushwl_tests $X/2026-12-07_flush_work_list.patch
has flushwl && TESTS= BOX=240 TUNE="$FAN_TUNE --flush-items 0,1" bash "$(dirname "$0")/variants.sh" \
  $X/2026-12-07_flush_work_list.patch
has fanx && TESTS= BOX=200 TUNE="$FAN_TUNE" bash "$(dirname "$0")/variants.sh" \
  $X/2026-12-07_flush_fan_out_early_exit.patch $X/2026-12-07_raw_fold_key_layout.patch
has fanxtests && fan_tests fanxtests $X/2026-12-07_flush_fan_out_early_exit.patch
has fan && TESTS= BOX=200 TUNE="$FAN_TUNE" bash "$(dirname "$0")/variants.sh" $X/2026-12-07_flush_fan_out.patch
has fantests && fan_tests fantests $X/2026-12-07_flush_fan_out.patch
has items && TAIL=24 part items 150 python3 benchmarks/tune_replay.py $KV_SHAPES \
  --window 8 --read fp8,fp4 --items 0,1,2 --out "$OUT/copies_items.json"
has spec16 && TAIL=24 part spec16 120 python3 -m replay_compile.cli bench spec --T 4,8 --batch 256 \
  --acceptance 0.8,text --window 16 --steps 8 --out "$OUT/spec_window16.json"
PRE="--batch 256 --no-steps --verify 8 --verify-window 0,16"  # window 0: every row folds its T records first
has prefold && TAIL=12 part prefold 120 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2,qwen3.5-122b-gdn \
  $PRE --out "$OUT/prefold.json"
has prefold && TAIL=8 part prefold_kv 90 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2 --layout kv \
  $PRE --out "$OUT/prefold_mamba2_kv.json"
has prefold && TAIL=8 part prefold_vk 90 python3 benchmarks/tune_replay.py --shapes qwen3.5-122b-gdn --layout vk \
  $PRE --out "$OUT/prefold_gdn_vk.json"
has prefold && TAIL=6 part prefold_x3 60 python3 benchmarks/tune_replay.py --shapes nemotron3-super-mamba2 --batch 256 \
  --no-steps --verify 8 --verify-window 0 --verify-form "chunked:dot=bf16x3,$ONE,kc=16" --out "$OUT/prefold_mamba2_x3.json"
echo total $SECONDS
