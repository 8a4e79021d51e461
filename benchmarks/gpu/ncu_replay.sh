#!/usr/bin/env bash
# Where the replay kernel's time goes, from Nsight Compute's counters (~4 min on a fresh H200; ncu reads counters on
# the Firecracker machines, KINDS.md). One launch per case, rows at staggered phases (benchmarks/profile_replay.py):
# GDN's step (with its flushing rows) and its non-flush path, Mamba-2's step beside it (88% of bandwidth where GDN
# reaches 66%), KDA's step, GDN in the key-contiguous layout (a checkpoint of our own in that layout is the change
# it would justify), and GDN's verify of T = 4. Sections: speed of light, occupancy, warp stall reasons, scheduler,
# and SourceCounters (the SASS lines with the most stall samples; Triton keeps line info, so they map to the
# template's source lines).
# Usage: bash benchmarks/gpu/ncu_replay.sh [commit]   (writes $OUT/ncu_replay.txt)
set -u
source "$(dirname "$0")/part.sh"
gpu_setup ncu_log.txt "${1:-}"
PROFILE=(python3 benchmarks/profile_replay.py)
export PART_LOG="$OUT/ncu_replay.txt"
TAIL=30 part gdn_step 60 "${NCU_REPLAY[@]}" -s 1 "${PROFILE[@]}" qwen3.5-122b-gdn
TAIL=30 part gdn_nonflush 60 "${NCU_REPLAY[@]}" -s 1 "${PROFILE[@]}" qwen3.5-122b-gdn --no-commit
TAIL=30 part mamba2_step 60 "${NCU_REPLAY[@]}" -s 1 "${PROFILE[@]}" nemotron3-super-mamba2
TAIL=30 part kda_step 60 "${NCU_REPLAY[@]}" -s 1 "${PROFILE[@]}" kimi-linear-kda
TAIL=30 part gdn_step_vk 60 "${NCU_REPLAY[@]}" -s 1 "${PROFILE[@]}" qwen3.5-122b-gdn --layout vk
TAIL=30 part gdn_verify4 60 "${NCU_REPLAY[@]}" -s 1 "${PROFILE[@]}" qwen3.5-122b-gdn --tokens 4 --window 20 --no-commit --steps 2
echo total $SECONDS
