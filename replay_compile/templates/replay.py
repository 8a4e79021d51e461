"""The replay decode template: one launch of it serves every row of a step, verify or materialize (two where the
flushing rows take a launch of their own: NOTE [flush launch]).

A program owns one row and a run of (value head, value tile) pairs of one unit (NOTE [key-group
programs]). Per pair it loads the ``[K, BV]`` checkpoint tile once (or, on rows that do not flush, the
read copy's tile), computes the ``T`` outputs from it and the row's window of records (ring positions
below the row's count, then this call's ``T`` tokens), and only on rows that flush folds the window (a
rank-L update) and writes the checkpoint and read copy. Everything per row (flush or not, where the
window ends) comes from the device cursors inside the kernel (``cursors.row_phase``): there is no host
sync, so a call can be captured in a CUDA graph; the last program of a row moves its cursors (NOTE [the
last program moves the cursors] in ``cursors.py``).

Verifies may run in ``verify.py`` instead (the chunked verify: the tokens together, as products), where a state's
verify form asks for it (``templates/verify_forms.py``); this template's token loop serves the others.

Flush folds re-read their records from memory (``_fold``, NOTE [fold unrolling]), so the flush path,
which only 1/L of rows take, costs few registers on the others (a ``tl.dot`` fold took the kernel to
254 registers and 0.55-0.68x of the standard kernel on the H200). See NOTE [register cap].

# NOTE [key-group programs]
A token's read is ``S_p^T q = G * base^T q + sum_j w_j (k_j . q) u_j``. The dots ``k_j . q`` of the
window's keys are the same for every value head of a key group and every value tile; only the weights
``w_j`` (one number per record and head under scalar decay) and the updates ``u_j`` differ. A program
therefore serves one unit (a key group; a value head under per-channel decay, whose weights are per key
channel and enter the dots) and computes the ``[T, L]`` dots once (``_key_dots`` / ``_channel_dots``);
then it loops over its (head, value tile) pairs, each costing the tile read and ``[L, BV]`` of updates.
With one tile per program (the design before 2026-12-03) the ``[L, K]`` window was re-read and
re-reduced by all 32 tiles of a Mamba-2 key group. ``tiling`` splits a unit over several programs
while the grid would be small (batch 1), trading repeated dots for parallelism.

Specialisation (constexpr): decay kind x delta rule (the family's ``template``), raw delta folds,
read-copy format and storage order, layout (strides + ``LAYOUT_KV``), head dims, grouping, window ``L``, draft length
``T``, checkpoint dtype (stochastic rounding), compute dtype. Value columns are independent in every
family (the delta rule's ``S^T k`` reduces over keys), which is what lets a program own a value tile.

# NOTE [tile layout]
Where keys are contiguous (``vk`` states), a ``[BK, BV]`` load takes the coalescer's layout: 4 keys per
thread, the other key bits across the 32 lanes, so each token's ``base^T q`` costs 5 shuffle rounds per
value column a thread holds. ``_load_tile`` loads the fp32 checkpoint tile as ``[BV, BK / 32, 32]`` instead:
still 16-byte vectors along keys, but (fp32, K = 128) the coalescer then spends only 8 lanes on keys and 4 on
values, and the chunks of 32 keys sit in registers, so a token's reduction is 16 products in the thread and
3 shuffle rounds (sm_90 compile of a Mamba-2 8-token call: 635 -> 363 shuffles, 168 -> 158 registers;
one-token step 93 -> 59 shuffles. H200, batch 256: step 419.5 -> 397.8 us, verify T = 8 2668 -> 2143 us).
Kept plain, each after a trial: the ring's keys in ``_key_dots`` (half the shuffles in the sm_90 compile, but
verify slower on the H200: Mamba-2 T = 8 2941 us), read copies (more barriers and spills in the compile),
and the exact tile a flushing row swaps in over its read copy (the two layouts would meet at the swap; the
read-copy kernel is then the one measured before this change, SASS for SASS). ``kv`` tiles (values contiguous:
GDN, KDA) keep the plain load too: a 4D load putting the warps on values (no cross-warp key reduction) made
their steps 16-47% slower on the H200 (commit ``a3c3326``, BENCHMARKS.md).

# NOTE [closed-form fold]
A flush folds n records into the tile: ``S_n = A S_0 + sum_i (w_i k_i) u_i^T`` with ``A`` the product of the
n decays and ``w_i`` that of the decays after record i (scalars, or vectors over key channels that scale keys).
``_fold`` scales the tile once by ``A`` (the exponential of a sum of log-decays) and then adds the records latest
first, ``w`` growing by one decay per record: one fused multiply-add per tile element and record instead of a
multiply and a multiply-add when each record decayed the tile. A decay of exactly 0 (``log_a = -inf``) gives
``A = 0`` and weight 0 to the records before it, as the in-order fold did; records past ``n_total`` load as 0.
sm_90 compile: FMUL in the GDN / Mamba-2 step 1146 / 1117 -> 304 / 275. H200, batch 256, L = 16 (2026-12-03,
with NOTE [paired reductions], against main in the same run): Mamba-2 fp8-copy step 306.9 -> 295.4 us (1.74 ->
1.81x the standard kernel), KDA 289.7 -> 279.6 (unrolled by 8 now, NOTE [fold unrolling]); the fp32 Mamba-2
step is unchanged (345.7 / 347.8) and verify T = 8 is 3-4% slower (Mamba-2 1527 -> 1592 us, GDN 3024 -> 3112).

# NOTE [paired reductions]
Under the delta rule a token reads the tile twice (``base^T q_t`` for its output, ``base^T k_t`` for its
update) and the window twice. Both of each pair reduce over the same axis, and on ``kv`` tiles that axis
spans warps, so each reduction is a shared-memory exchange with barriers. ``_dots2`` reduces a pair in one
``tl.reduce`` of two operands: one exchange for both. The output then takes the token's own update as
``(k_p . q_t) u_t`` (``KQ``, per program) instead of reducing the window again after ``u_t`` joins it.
One-token calls only: in the token loop of a verify the pairs made GDN's T = 8 9% slower on the H200 (3023 ->
3305 us, more spills), where the one-token GDN step went 447.6 -> 435.2 us (1.19 -> 1.23x the standard
kernel; non-flush 399.6 -> 361.7 us) with the closed-form fold beside it (2026-12-03, batch 256, L = 16).

# NOTE [fold decay in one load]
The closed-form fold needs ``A``, the sum of the n log-decays, before its first record. Scalar decay loads all
``BL`` of them as one ``[BL]`` vector and sums it (no order to keep); the loop of one load per record had run
un-unrolled in verify calls. H200, batch 256, L = 16 (2026-12-04, variants.sh, against main in the same run):
verify T = 8 Mamba-2 1591 -> 1514 us, GDN 3104 -> 2986; one-token steps within noise (Mamba-2 347.6 / 349.2,
GDN 435.2 / 438.6). Per-channel decay keeps the loop: the same load as ``[BL, BK]`` spilled (sm_90 KDA step
108 -> 264 bytes) and made KDA's step 279.8 -> 312.2 us (verify T = 8 1577 -> 1553).

# NOTE [two row loops]
A one-token call on ``kv`` tiles (GDN, KDA steps) runs its (head, value tile) pairs in one of two loops,
picked per row: rows that flush take the loop with the folds and the barriers they need, the others a loop
without them. Triton's software pipeliner skips a loop that holds a barrier, so only the second can prefetch
the next pair's tile into shared memory (cp.async, ``num_stages`` 2) over up to 8 pairs a program
(``MAX_PIPELINED_ITEMS``), read copy or not; under per-channel decay it runs unpipelined (1 stage). Steps on
``vk`` tiles keep one loop, except on a 4-bit copy (NOTE [flush launch]).
Where a unit's last program has fewer pairs than ``ITEMS``, the non-flush loop repeats its last pair instead
of branching around the missing ones (a branch would keep the loads from being pipelined; the repeat writes
the same outputs and records again). H200, batch 256, L = 16, step (non-flush) us, one loop
(main) -> two loops of 1 / 2 stages (2026-12-04, ``tune_replay.py --stages=-1,0,1,2`` at ``b97085a``): GDN
438.0 (357.4) -> 445.1 / **418.8 (338.7)**, KDA 279.2 (214.8) -> 255.7 / **263.7 (207.4)**, KDA fp8 copy 380.7
-> **351.0** / 402.4, GDN fp8 copy 612.5 -> 609.2 / 731.8. Everything else keeps one loop, which the split
made slower: Mamba-2 (``vk``) 345.2 -> 368.2 / 470.2, verify T = 8 (GDN 2996 -> 4497 us in an earlier run).
At L = 8 (2026-12-04, ``tune_replay.py --window 8 --stages=1,2,3 --items 0,8`` at ``e35d617``): GDN 1 / 2 / 3
stages 417.6 / 400.8 / 404.3 us, with 8 pairs 391.5 / **375.3** / 382.1; KDA (4 pairs a unit, so 8 changes
nothing) **221.1** / 228.7 / 234.1, hence 1 stage under per-channel decay (it also won at L = 16 above). Mamba-2
split at a cap of 168 registers lost again (L = 8: 345.6 / 379.1 / 457.1 against one loop's 331.0). Read copies ran
1 stage until their flushing rows got a launch of their own (NOTE [flush launch]); since then 2 stages (8 pairs) win
for GDN's and lose for KDA's (GPU tests of the pipelined copy loop: ``PARTS=defaults bash
benchmarks/gpu/verify_next.sh``): H100, batch 256, step (non-flush) us, 1 -> 2 stages (2026-12-07,
``tune_replay.py --stages=-1,2`` at ``6a6b7b0``): GDN fp8 L = 8 414.2 -> 409.2, L = 16 392.0 (283.9) -> **378.0
(273.5)**, 4-bit L = 8 472.6 -> 455.8, L = 16 428.7 (301.1) -> **412.1 (277.2)**; KDA fp8 L = 16 241.2 -> 281.9,
4-bit 266.6 -> 277.6. Value tiles of 16 or 64 lost at either stage count (GDN fp8 L = 16: 575.7 and 1081.7 us at 2
stages).

# NOTE [flush launch]
Where non-flush rows loop apart (NOTE [two row loops]: by default one-token ``kv`` calls, materialize included),
a call may take two launches of this kernel: first the
rows that flush (``ROWS`` 1: the other rows' programs return at once), ``flush_items`` pairs a program, leaving
every cursor as it was; then the others (``ROWS`` 2), whose programs of flushing rows only take the row's ticket,
so the last ticket of every row still moves its cursors (NOTE [the last program moves the cursors]). Both read
the same cursors: stream order puts the whole first launch before the second, which is why the first must come
first. Each launch compiles only its loop: the non-flush rows' kernel carries no fold, which set the registers of
both (sm_90, GDN fp8 step, L = 8: 168 registers and 228 bytes spilled in one launch; 128 and 0 for the non-flush
rows' launch, 167 and 0 for the flushing rows' at one pair a program), and the flushing rows get as many programs
as they have pairs. Still one launch sequence per call, no host sync: a CUDA graph captures both. The default for
read copies, whose flushing rows (an fp32 tile beside the copy, a raw replay under the delta rule,
re-quantization) set the step's time: H100, batch 256, L = 16, one launch -> two at one pair a program
(2026-12-07): GDN fp8 516.2 -> 412.7 us, 4-bit 617.3 -> 516.4; KDA fp8 302.0 -> 264.9, 4-bit 353.3 -> 291.1. The
first launch's programs on rows that do not flush (at L = 8, 7/8 of GDN's 65536) return at once but cost 20-40 us, which
is why steps without a copy keep one launch (GDN 499.7 -> 520.6 us at L = 8). A fixed grid (8 programs an SM) walking
only the flushing rows' items lost (H100, L = 16: GDN fp8 412.0 -> 449.7 us, 4-bit 513.8 -> 572.3; without a copy
at L = 8, 520.4 -> 535.2): its few programs serve a flush slower than one program a pair does, more than the idle
programs it saves (``benchmarks/experiments/2026-12-07_flush_work_list.patch``). On ``vk`` tiles (Mamba-2) the two
launches are the default for 4-bit copies only, whose one launch dequantized e2m1 blocks in the kernel that folds
(sm_90, L = 16: 820 bytes spilled; split, the other rows' launch spills nothing and runs 1904 SASS instructions
against 7368): H100, batch 256, step us, one launch -> two (2026-12-07, ``tune_replay.py --stages 1 --flush-items 1``
at ``6a6b7b0``): 4-bit L = 8 696.3 -> **471.9**, L = 16 562.0 -> **417.0**; fp8 L = 8 315.1 -> 348.3, L = 16
303.2 -> 301.2, so fp8 copies keep one launch. (On the H200 the one-launch 4-bit step had lost to the standard
step: 0.80x at L = 8, 0.99x at 16.) The two launches may take different value tiles (``nonflush_block_v``, opt in):
tiles of 64 on 2 warps for both made GDN's fp8 non-flush rows faster (H100, L = 8, ``PARTS=nf64``: 265.5 -> 221.8
us) and its flushing rows slower (step 407.2 -> 411.2), so the candidate is 64 for the non-flush launch alone (not
timed yet: ``PARTS=nfbv``).

# NOTE [non-flush register cap]
Once the fold has a launch of its own (NOTE [flush launch]), the non-flush rows' launch needs far fewer registers
than the 168 of NOTE [register cap] (sm_90, L = 16: 128-163 used), and a lower cap buys occupancy: at 96 GDN fp8 /
4-bit and KDA fp8 spill nothing. H100, batch 256, L = 16, step us at caps 168 / 112 / 96 / 80 (2026-12-07,
``tune_replay.py --nonflush-maxnreg``): GDN fp8 413.1 / 413.6 / 393.8 / 382.2, 4-bit 516.5 / 464.2 / 429.0 /
426.2; KDA fp8 264.8 / 245.1 / 242.2 / 247.9, 4-bit 290.7 / 266.5 / 267.2 / 270.4. 96 is within 3% of the best
cap in every cell (``NONFLUSH_REGISTERS``); the flushing rows' launch keeps 168. More warps lost there: the
non-flush launch on 4 warps (``nonflush_warps``; 32 resident warps an SM at 64 registers against 20) ran its rows
35-52% slower at every cap, each key reduction then crossing 4 warps through shared memory; so did the flushing
rows' launch on 4 warps (GDN fp8 392.1 -> 399.2 us, 4-bit 429.5 -> 451.8 at 128 registers).

# NOTE [window weights without differences]
The decay from record ``i`` to position ``p`` is ``exp(sum_{i<j<=p} log_a_j)``: a reverse cumulative
sum of the log-decays shifted by one position (gathered a second time at ``j + 1``), never a difference
of prefix sums, so a decay of exactly 0 (``log_a = -inf``) gives weight 0, not NaN, as in reference.py.
That is done once, for the committed records; each of the call's ``T`` tokens then multiplies the
weights by its own decay and joins with weight 1 (running products: no cumulative exponential per token).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from ..families.base import Canonical
from .cursors import commit_kernel, finalize_row, load_row, row_phase
from .readcopy import READ_CODES, key_major, load_read_tile, store_read_tile
from .sround import SR_FORMATS, slot_seed, stochastic_round

@triton.jit
def _ring(ring_row, stride, j, n, cols, col_mask, CD: tl.constexpr):
    """``[BL, BC]`` ring records at positions ``j < n`` (0 at the others, which are never read)."""
    live = (j < n)[:, None] & col_mask[None, :]
    return tl.load(ring_row + j[:, None] * stride + cols[None, :], mask=live, other=0.0).to(CD)


@triton.jit
def _ring1(ring_row, stride, j, n, CD: tl.constexpr):
    """``[BL]`` scalar ring records (per-head log-decay), as :func:`_ring`."""
    return tl.load(ring_row + j * stride, mask=j < n, other=0.0).to(CD)


@triton.jit
def _record(ring_row, x_row, stride, i, n_ring, n_total, offs, mask, CD: tl.constexpr):
    """Record ``i`` of a window: ring position ``i`` below ``n_ring``, input token ``i - n_ring`` below ``n_total``, else 0."""
    ring = i < n_ring
    new = (i >= n_ring) & (i < n_total)
    r = tl.load(ring_row + i * stride + offs, mask=mask & ring, other=0.0)
    x = tl.load(x_row + (i - n_ring) * stride + offs, mask=mask & new, other=0.0)
    return tl.where(ring, r.to(CD), x.to(CD))


@triton.jit
def _log_decay(rla, xla, i, n_ring, n_total, LS: tl.constexpr, offs_k, mask_k, DECAY: tl.constexpr, CD: tl.constexpr):
    """Record ``i``'s log-decay (a scalar, or ``[BK]`` per key channel); 0 past ``n_total``."""
    if DECAY == 2:
        return _record(rla, xla, LS, i, n_ring, n_total, offs_k, mask_k, CD)
    else:
        return _record(rla, xla, LS, i, n_ring, n_total, 0, True, CD)


@triton.jit
def _scaled(S, log_a, DECAY: tl.constexpr):
    """The ``[BK, BV]`` tile times ``exp(log_a)`` (a scalar, or ``[BK]`` along keys); ``S`` itself without decay."""
    if DECAY == 1:
        S = S * tl.exp(log_a)
    elif DECAY == 2:
        S = S * tl.exp(log_a)[:, None]
    return S


@triton.jit
def _fold(S, rk, rla, ru, xk, xla, n_ring, n_total, offs_k, mask_k, offs_v, mask_v,
          KS: tl.constexpr, LS: tl.constexpr, US: tl.constexpr, L: tl.constexpr, BL: tl.constexpr,
          DECAY: tl.constexpr, CD: tl.constexpr, UNROLL: tl.constexpr):
    """Checkpoint after the records at positions ``< n_total``: that of ``S <- a_i * S + k_i u_i^T`` in order.

    Keys and log-decays come from the ring below ``n_ring`` and from this call's inputs above it; the
    corrected updates ``u`` all come from the ring (this program wrote the new ones: see the barrier
    before a fold). Only flushing rows run it, so it re-reads records instead of holding the window in
    registers, which keeps the non-flush path's register budget (and occupancy) for the state tile.
    ``UNROLL`` records per loop iteration (NOTE [fold unrolling]). NOTE [closed-form fold]: the tile is
    scaled once and each record adds ``(w_i k_i) u_i^T``.
    """
    if DECAY == 1:  # NOTE [fold decay in one load]
        every = tl.arange(0, BL)
        S = _scaled(S, tl.sum(_log_decay(rla, xla, every, n_ring, n_total, LS, offs_k, mask_k, DECAY, CD), 0), DECAY)
    elif DECAY == 2:
        total = _log_decay(rla, xla, 0, n_ring, n_total, LS, offs_k, mask_k, DECAY, CD)
        for i in tl.range(1, L, loop_unroll_factor=UNROLL):
            total += _log_decay(rla, xla, i, n_ring, n_total, LS, offs_k, mask_k, DECAY, CD)
        S = _scaled(S, total, DECAY)
    w = tl.full([], 1.0, CD) if DECAY < 2 else tl.full(offs_k.shape, 1.0, CD)
    for r in tl.range(0, L, loop_unroll_factor=UNROLL):
        i = L - 1 - r  # latest record first: its weight is 1, each older one's is the product of the later decays
        k_i = _record(rk, xk, KS, i, n_ring, n_total, offs_k, mask_k, CD)  # 0 past n_total
        u_i = tl.load(ru + i * US + offs_v, mask=mask_v & (i < n_total), other=0.0).to(CD)
        S += (w * k_i)[:, None] * u_i[None, :]
        if DECAY > 0:
            w = w * tl.exp(_log_decay(rla, xla, i, n_ring, n_total, LS, offs_k, mask_k, DECAY, CD))
    return S


@triton.jit
def _fold_raw(S, rk, rla, rv, rbeta, xk, xla, xv, xbeta, n_ring, n_new, offs_k, mask_k, offs_v, mask_v,
              KS: tl.constexpr, LS: tl.constexpr, US: tl.constexpr, BS: tl.constexpr, L: tl.constexpr,
              DECAY: tl.constexpr, CD: tl.constexpr, UNROLL: tl.constexpr):
    """The true delta recurrence over raw records ``(log_a, k, v, beta)``, from the exact checkpoint ``S``.

    Runs ``L`` iterations (the trip count stays a compile-time constant: the interpreter cannot loop to a
    device value); records past ``n_ring + n_new`` load as ``k, log_a = 0`` and get ``u = 0``, which leaves
    ``S`` unchanged (``1 * S + 0 * 0``) without a select of the whole tile.
    """
    n_total = n_ring + n_new
    for i in tl.range(0, L, loop_unroll_factor=UNROLL):
        k_i = _record(rk, xk, KS, i, n_ring, n_total, offs_k, mask_k, CD)
        v_i = _record(rv, xv, US, i, n_ring, n_total, offs_v, mask_v, CD)
        beta_i = _record(rbeta, xbeta, BS, i, n_ring, n_total, 0, True, CD)
        if DECAY > 0:
            a_i = tl.exp(_log_decay(rla, xla, i, n_ring, n_total, LS, offs_k, mask_k, DECAY, CD))
        else:
            a_i = 1.0
        u = beta_i * (v_i - _tile_dot(S, a_i * k_i))  # (a_i S)^T k_i without a decayed copy of the tile
        u = tl.where(i < n_total, u, 0.0)  # a non-finite checkpoint must not spread through a padding record
        if DECAY == 2:
            S = S * a_i[:, None]
        elif DECAY == 1:
            S = S * a_i
        S += k_i[:, None] * u[None, :]
    return S


@triton.jit
def _fold_window(S, rk, rla, ru, rv, rbeta, xk, xla, xv, xbeta, n_ring, n_new, offs_k, mask_k, offs_v, mask_v,
                 KS: tl.constexpr, LS: tl.constexpr, US: tl.constexpr, HV: tl.constexpr, L: tl.constexpr,
                 BL: tl.constexpr, DECAY: tl.constexpr, RAW: tl.constexpr, CD: tl.constexpr, UNROLL: tl.constexpr):
    """The tile after the window's records: ``n_ring`` from the ring, then ``n_new`` of this call's inputs
    (:func:`_fold`; raw delta records replay the recurrence, :func:`_fold_raw`)."""
    if RAW:
        S = _fold_raw(S, rk, rla, rv, rbeta, xk, xla, xv, xbeta, n_ring, n_new, offs_k, mask_k, offs_v, mask_v,
                      KS, LS, US, HV, L, DECAY, CD, UNROLL)
    else:
        S = _fold(S, rk, rla, ru, xk, xla, n_ring, n_ring + n_new, offs_k, mask_k, offs_v, mask_v, KS, LS, US, L, BL,
                  DECAY, CD, UNROLL)
    return S


@triton.jit
def _store_checkpoint(new, state, s_tile, mask_kv, read_data, read_row_scale, read_block_scale, flushes, seed, slot,
                      head, h, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, READ: tl.constexpr, READ_KEY_MAJOR: tl.constexpr, LAYOUT_KV: tl.constexpr,
                      SR: tl.constexpr, SR_MANT: tl.constexpr, SR_EMIN: tl.constexpr, CD: tl.constexpr):
    """A flushing row writes its folded tile ``new [BK, BV]`` to the checkpoint (stochastically rounded to a
    16-bit checkpoint under ``SR``, seeded per slot, flush and element) and re-quantizes the read copy from it."""
    if SR:
        if LAYOUT_KV:
            phys = offs_k[:, None] * V + offs_v[None, :]
        else:
            phys = offs_v[None, :] * K + offs_k[:, None]
        seed_row = slot_seed(seed, slot, tl.load(flushes + slot))
        stored = stochastic_round(new.to(tl.float32), seed_row, (h * K * V + phys).to(tl.int32), SR_MANT, SR_EMIN)
    else:
        stored = new.to(state.dtype.element_ty).to(CD)
    tl.store(s_tile, stored.to(state.dtype.element_ty), mask=mask_kv)
    if READ > 0:
        store_read_tile(stored.to(tl.float32), read_data, read_row_scale, read_block_scale, head, offs_k, offs_v,
                        mask_kv, K, V, BK, BV, READ, READ_KEY_MAJOR)


@triton.jit
def _put_row(M, tt, t, x):
    """``M`` with row ``t`` set to ``x`` (``M [BT, N]``, a small register matrix indexed by ``tt``)."""
    return tl.where((tt == t)[:, None], x[None, :], M)


@triton.jit
def _get_row(M, tt, t):
    """Row ``t`` of ``M [BT, N]``."""
    return tl.sum(tl.where((tt == t)[:, None], M, 0.0), 0)


@triton.jit
def _tile_dot(base, x):
    """``base^T x`` ``[BV]`` for the tile ``base [BK, BV]`` and ``x [BK]``."""
    return tl.sum(base * x[:, None], 0)


@triton.jit
def _add_pairs(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _dots2(M, x, y):
    """``(M^T x, M^T y)`` for ``M [N, BV]``, ``x, y [N]``: one reduction over ``N`` for both (NOTE [paired reductions])."""
    return tl.reduce((M * x[:, None], M * y[:, None]), 0, _add_pairs)


@triton.jit
def _key_dots(rk, xq, xk, count0, j, tt, offs_k, mask_k, bad,
              KS: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr, DELTA: tl.constexpr,
              CD: tl.constexpr):
    """``(DQ, DK, bad)``: the window keys' dots with each token's query (and key), shared by a key group.

    ``DQ[t, j] = k_j . q_t`` over window positions ``j <= count0 + t`` (the ring's records below ``count0``,
    then the call's tokens; 0 beyond), ``DK`` likewise with ``k_t`` (delta rule). Scalar and no decay
    only: their weights are one number per record and head, applied per head (NOTE [key-group programs]).
    """
    KW = _ring(rk, KS, j, count0, offs_k, mask_k, CD)
    DQ = tl.zeros([BT, BL], CD)
    DK = DQ
    for t in tl.static_range(T):
        q_t = tl.load(xq + t * KS + offs_k, mask=mask_k, other=0.0).to(CD)
        k_t = tl.load(xk + t * KS + offs_k, mask=mask_k, other=0.0).to(CD)
        bad = bad | _any_nonfinite(q_t) | _any_nonfinite(k_t)
        KW = tl.where((j == count0 + t)[:, None], k_t[None, :], KW)
        if DELTA:
            DK = _put_row(DK, tt, t, tl.sum(KW * k_t[None, :], 1))
        DQ = _put_row(DQ, tt, t, tl.sum(KW * q_t[None, :], 1))
    return DQ, DK, bad


@triton.jit
def _channel_dots(rk, rla, xq, xk, xla, count0, j, tt, offs_k, mask_k, bad,
                  KS: tl.constexpr, LS: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BL: tl.constexpr,
                  DELTA: tl.constexpr, CD: tl.constexpr):
    """``(DQ, DK, G, bad)`` of one value head with per-channel decay: the decay enters the dots.

    ``DQ[t, j] = (w_j^(t) * k_j) . q_t`` with ``w_j^(t)`` the channel decays from record ``j`` to token
    ``t`` (NOTE [window weights without differences]), and ``G [BK]`` the channel decay of the committed
    records: token ``t`` reads ``base^T (G^(t) * q_t) + sum_j DQ[t, j] u_j`` with ``G^(t) = G * a_0 ... a_t``
    (returned as ``G^(0)``, once per program; :func:`_tile_tokens` multiplies ``a_1 ... a_t`` in per pair).
    ``DK`` likewise with ``k_t`` (delta rule: ``S_{p-1}`` decayed by ``a_p``). The products replaced
    ``[T, BK]`` matrices of ``G^(t) * q_t`` whose rows every pair extracted: KDA verify at batch 256 went
    1865 -> 1145 us (T = 4) and 5339 -> 2234 us (T = 8) on the H200 (2026-12-03), and the 8-token call
    stopped spilling.
    """
    KW = _ring(rk, KS, j, count0, offs_k, mask_k, CD)
    LA = _ring(rla, LS, j, count0, offs_k, mask_k, CD)
    LN = _ring(rla, LS, j + 1, count0, offs_k, mask_k, CD)
    G = tl.exp(tl.sum(LA, 0))
    KW = KW * tl.exp(tl.cumsum(tl.where((j + 1 < count0)[:, None], LN, 0.0), 0, reverse=True))
    DQ = tl.zeros([BT, BL], CD)
    DK = DQ
    for t in tl.static_range(T):
        q_t = tl.load(xq + t * KS + offs_k, mask=mask_k, other=0.0).to(CD)
        k_t = tl.load(xk + t * KS + offs_k, mask=mask_k, other=0.0).to(CD)
        la_t = tl.load(xla + t * LS + offs_k, mask=mask_k, other=0.0).to(CD)
        bad = bad | _any_nonfinite(q_t) | _any_nonfinite(k_t) | _any_nonfinite(la_t)
        a_t = tl.exp(la_t)
        if t == 0:  # G^(0), once per program; _tile_tokens multiplies the later tokens' decays per pair
            G = G * a_t
        KW = tl.where((j == count0 + t)[:, None], k_t[None, :], KW * a_t[None, :])
        if DELTA:
            DK = _put_row(DK, tt, t, tl.sum(KW * k_t[None, :], 1))
        DQ = _put_row(DQ, tt, t, tl.sum(KW * q_t[None, :], 1))
    return DQ, DK, G, bad


@triton.jit
def _tile_tokens(base, U, DQ, DK, KQ, GC, rla, xq, xk, xv, xla, xbeta, o_ptr, ru, rv, count0, j, tt,
                 offs_k, mask_k, cols_v, mask_v, live, bad,
                 KS: tl.constexpr, US: tl.constexpr, LS: tl.constexpr, HV: tl.constexpr, V: tl.constexpr,
                 T: tl.constexpr, DECAY: tl.constexpr, DELTA: tl.constexpr, RAW: tl.constexpr, CD: tl.constexpr):
    """The ``T`` outputs of one (head, value tile) from its base tile and window updates ``U [BL, BV]``.

    Writes each token's output and its update record ``u`` (and raw ``v``); returns ``bad``. Per-head
    weights ``W [BL]`` and total decay ``G`` are running products (NOTE [window weights without
    differences]); with per-channel decay the weights are inside ``DQ`` already, so ``W`` only marks the
    positions written so far, and ``G [BK]`` starts from ``GC`` (:func:`_channel_dots`). ``base^T x`` is one
    reduction of the tile per token: one fp32 ``tl.dot`` for all tokens (tried on 2026-12-02) made verify
    1.5-2.5x slower on the H200 (8 warps to fit its registers, and the tile through shared memory).
    """
    G = 1.0
    W = tl.where(j < count0, 1.0, 0.0).to(CD)
    if DECAY == 2:
        G = GC
    if DECAY == 1:
        G = tl.exp(tl.sum(_ring1(rla, LS, j, count0, CD), 0))
        LN = _ring1(rla, LS, j + 1, count0, CD)
        W = W * tl.exp(tl.cumsum(tl.where(j + 1 < count0, LN, 0.0), 0, reverse=True))
    for t in tl.static_range(T):
        p = count0 + t
        v_t = tl.load(xv + t * US + cols_v, mask=mask_v, other=0.0).to(CD)
        bad = bad | _any_nonfinite(v_t)
        if DECAY == 1:
            la_t = tl.load(xla + t * LS).to(CD)
            bad = bad | _nonfinite(la_t)
            a_t = tl.exp(la_t)
            G = G * a_t
            W = W * a_t
        if DECAY == 2 and t > 0:  # a_t of the later tokens (token 0's is in GC; all checked in _channel_dots)
            G = G * tl.exp(tl.load(xla + t * LS + offs_k, mask=mask_k, other=0.0).to(CD))
        W = tl.where(j == p, 1.0, W)
        xq_t = tl.load(xq + t * KS + offs_k, mask=mask_k, other=0.0).to(CD) * G
        cq = _get_row(DQ, tt, t) * W
        u_t = v_t
        if DELTA:  # U has no row >= p yet: the reads are of S_{p-1} decayed by a_p
            xk_t = tl.load(xk + t * KS + offs_k, mask=mask_k, other=0.0).to(CD) * G
            beta_t = tl.load(xbeta + t * HV).to(CD)
            bad = bad | _nonfinite(beta_t)
            ck = _get_row(DK, tt, t) * W
            if T == 1:  # NOTE [paired reductions]
                bq, bk = _dots2(base, xq_t, xk_t)
                wq, wk = _dots2(U, cq, ck)
                u_t = beta_t * (v_t - bk - wk)
            else:
                u_t = beta_t * (v_t - _tile_dot(base, xk_t) - tl.sum(ck[:, None] * U, 0))
            if RAW:
                tl.store(rv + p * US + cols_v, v_t, mask=mask_v & live)
        U = tl.where((j == p)[:, None], u_t[None, :], U)
        if DELTA and T == 1:  # the window's sum was taken before u_t joined it: add the token's own record
            o_t = bq + wq + tl.sum(tl.where(tt == t, KQ, 0.0)) * u_t
        else:
            o_t = _tile_dot(base, xq_t) + tl.sum(cq[:, None] * U, 0)
        tl.store(o_ptr + t * HV * V + cols_v, tl.where(live, o_t, 0.0), mask=mask_v)
        tl.store(ru + p * US + cols_v, u_t, mask=mask_v & live)
    return bad


@triton.jit
def _load_tile(s_tile, mask_kv, s_head, offs_v, mask_v, stride_sk, stride_sv, K: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr, LAYOUT_KV: tl.constexpr, CD: tl.constexpr):
    """The checkpoint tile ``[BK, BV]`` at ``s_tile`` (pointers ``[BK, BV]`` into the head at ``s_head``); with
    contiguous keys, loaded so that a token's key reduction stays mostly inside each thread (NOTE [tile layout])."""
    if LAYOUT_KV:
        return tl.load(s_tile, mask=mask_kv, other=0.0).to(CD)
    else:
        KI: tl.constexpr = BK if BK < 32 else 32
        KC: tl.constexpr = BK // KI
        k3 = tl.arange(0, KC)[None, :, None] * KI + tl.arange(0, KI)[None, None, :]  # fresh aranges: the loads vectorize
        m3 = (k3 < K) & mask_v[:, None, None]
        x = tl.load(s_head + offs_v[:, None, None] * stride_sv + k3 * stride_sk, mask=m3, other=0.0)
        return tl.reshape(tl.permute(x, (1, 2, 0)), [BK, BV]).to(CD)


@triton.jit
def _any_nonfinite(x):
    return tl.sum((~(tl.abs(x) < float("inf"))).to(tl.int32)) > 0


@triton.jit
def _nonfinite(x):
    return ~(tl.abs(x) < float("inf"))


@triton.jit
def _take_ticket(k, log_a, beta, ring_k, ring_la, ring_beta, count, flushes, tickets, b, slot, live, pre, post, count0,
                 T: tl.constexpr, L: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
                 BHV: tl.constexpr, BHK: tl.constexpr, BK: tl.constexpr, DECAY: tl.constexpr, RAW: tl.constexpr,
                 COMMIT: tl.constexpr):
    """Count this program done with row ``b``; the row's last one moves its cursors (NOTE [the last program moves
    the cursors])."""
    ticket = tl.atomic_add(tickets + slot, 1, sem="acq_rel")
    if ticket == tl.num_programs(1) * tl.num_programs(2) - 1:
        finalize_row(k, log_a, beta, ring_k, ring_la, ring_beta, count, flushes, b, slot, live, pre, post,
                     count0, T, L, HV, HK, K, BHV, BHK, BK, DECAY, RAW, COMMIT)
        tl.store(tickets + slot, 0)


@triton.jit
def replay_kernel(
    state, q, k, v, log_a, beta, out, slots,
    ring_k, ring_u, ring_la, ring_v, ring_beta,
    read_data, read_row_scale, read_block_scale,
    count, flushes, nonfinite, tickets, seed,
    stride_sn, stride_sh, stride_sk, stride_sv,
    T: tl.constexpr, L: tl.constexpr, BL: tl.constexpr, BT: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ITEMS: tl.constexpr,
    DECAY: tl.constexpr, DELTA: tl.constexpr, RAW: tl.constexpr, READ: tl.constexpr, READ_KEY_MAJOR: tl.constexpr,
    LAYOUT_KV: tl.constexpr,
    COMMIT: tl.constexpr, FORCE: tl.constexpr, MATERIALIZE: tl.constexpr, HAS_SLOTS: tl.constexpr,
    SR: tl.constexpr, SR_MANT: tl.constexpr, SR_EMIN: tl.constexpr, CD: tl.constexpr,
    BHV: tl.constexpr, BHK: tl.constexpr, FOLD_UNROLL: tl.constexpr, SPLIT: tl.constexpr,
    STAGES: tl.constexpr, ROWS: tl.constexpr,
):
    """Row ``b``, ``unit`` (a key group; a value head under per-channel decay), pairs ``[part * ITEMS,
    (part + 1) * ITEMS)`` of the unit's (value head, value tile) pairs, of a replay call over ``T`` tokens.
    ``ROWS`` (NOTE [flush launch]): 0 serves every row; 1 only the rows that flush, leaving their cursors; 2 the
    others, and moves every row's cursors.

    Inputs (contiguous): ``q, k [B, T, HK, K]``, ``v [B, T, HV, V]``, ``log_a [B, T, HV(, K)]``,
    ``beta [B, T, HV]``; output ``out [B, T, HV, V]``. Ring (contiguous): ``k [N, L, HK, K]``,
    ``u / v [N, L, HV, V]``, ``log_a [N, L, HV(, K)]``, ``beta [N, L, HV]``. The checkpoint is addressed
    through its strides (``stride_sk / stride_sv`` step along keys / values, whatever the layout).
    ``tickets [N]`` (int32, zero between calls): NOTE [the last program moves the cursors].
    """
    b = tl.program_id(0).to(tl.int64)
    unit = tl.program_id(1)
    part = tl.program_id(2)
    HK: tl.constexpr = HV // GROUP
    NVT: tl.constexpr = (V + BV - 1) // BV
    HEADS: tl.constexpr = GROUP if DECAY < 2 else 1  # value heads of a unit
    slot, live, c = load_row(slots, count, b, L, HAS_SLOTS)
    pre, post, count0 = row_phase(c, live, T, L, COMMIT, FORCE, MATERIALIZE)
    flush = pre | post
    if ROWS == 1:  # NOTE [flush launch]: the flushing rows' own launch
        if flush == 0:
            return
    if ROWS == 2:  # ... then the others', which only counts the flushing rows' programs done
        if flush:
            tl.debug_barrier()  # every warp has read the cursors that the row's last ticket moves (flush: a live row)
            _take_ticket(k, log_a, beta, ring_k, ring_la, ring_beta, count, flushes, tickets, b, slot, live, pre,
                         post, count0, T, L, HV, HK, K, BHV, BHK, BK, DECAY, RAW, COMMIT)
            return

    offs_k = tl.arange(0, BK)
    mask_k = offs_k < K
    cols_v = tl.arange(0, BV)
    j = tl.arange(0, BL)
    tt = tl.arange(0, BT)
    # per-position strides of records (ring and inputs alike)
    KS: tl.constexpr = HK * K
    US: tl.constexpr = HV * V
    LS: tl.constexpr = HV * K if DECAY == 2 else HV
    LW: tl.constexpr = K if DECAY == 2 else 1
    h0 = unit * HEADS
    hk = h0 // GROUP
    rk = ring_k + slot * L * KS + hk * K
    xq = q + b * T * KS + hk * K
    xk = k + b * T * KS + hk * K

    bad = live & (c < 0)
    if DECAY == 2:
        DQ, DK, GC, bad = _channel_dots(rk, ring_la + slot * L * LS + h0 * LW, xq, xk, log_a + b * T * LS + h0 * LW,
                                            count0, j, tt, offs_k, mask_k, bad, KS, LS, T, BT, BL, DELTA, CD)
    else:
        DQ, DK, bad = _key_dots(rk, xq, xk, count0, j, tt, offs_k, mask_k, bad, KS, T, BT, BL, DELTA, CD)
        GC = 1.0  # unused: scalar and no decay keep their window decay per head (in _tile_tokens)
    KQ = tl.sum(tl.where(j[None, :] == count0 + tt[:, None], DQ, 0.0), 1)  # k_p . q_t: a token's own record

    # NOTE [two row loops]: loop 1 serves the rows that flush (every row without SPLIT), loop 0 the others
    FIRST: tl.constexpr = 1 if ROWS == 1 else 1 - SPLIT
    for loop in tl.static_range(FIRST, 1 if ROWS == 2 else 2):
        if (flush == (loop == 1)) | (SPLIT == 0):
            for i in tl.range(0, ITEMS, num_stages=1 if loop == 1 else STAGES):
                item = part * ITEMS + i
                if loop == 1:
                    todo = item < HEADS * NVT  # the unit's last program may have fewer pairs than ITEMS
                else:  # no branch, so the loads stay pipelinable: a repeated pair rewrites the values it wrote
                    item = tl.minimum(item, HEADS * NVT - 1)
                    todo = True
                if todo:
                    h = h0 + item // NVT
                    vt = item % NVT
                    offs_v = vt * BV + cols_v
                    mask_v = offs_v < V
                    mask_kv = mask_k[:, None] & mask_v[None, :]
                    head = slot * HV + h
                    s_head = state + slot * stride_sn + h * stride_sh
                    s_tile = s_head + offs_k[:, None] * stride_sk + offs_v[None, :] * stride_sv
                    rla = ring_la + slot * L * LS + h * LW
                    ru = ring_u + slot * L * US + h * V + vt * BV
                    rv = ring_v + slot * L * US + h * V + vt * BV
                    rbeta = ring_beta + slot * L * HV + h
                    xv = v + b * T * US + h * V + vt * BV
                    xla = log_a + b * T * LS + h * LW
                    xbeta = beta + b * T * HV + h

                    # The tile's address does not depend on the row's count, so its load is in flight with the
                    # window's. Window records are loaded only below the count: ~(L-1)/2 of L on average (unmasked
                    # ring loads, tried on 2026-12-02, moved the Mamba-2 non-flush path from 363 to 491 us on the H200).
                    # One tile live at a time: non-flush rows read the copy, flush rows the exact tile (a plain
                    # load: a key-chunk tile would meet the copy's layout). Split flush loops hold only flush rows.
                    if (READ > 0) & (SPLIT == 1) & (loop == 1):
                        base = tl.load(s_tile, mask=mask_kv, other=0.0).to(CD)
                    elif READ > 0:
                        base = load_read_tile(read_data, read_row_scale, read_block_scale, head, offs_k, offs_v,
                                              mask_kv, K, V, BK, BV, READ, READ_KEY_MAJOR, CD)
                        if loop == 1:
                            if flush:
                                base = tl.load(s_tile, mask=mask_kv, other=0.0).to(CD)
                    else:
                        base = _load_tile(s_tile, mask_kv, s_head, offs_v, mask_v, stride_sk, stride_sv, K, BK, BV,
                                          LAYOUT_KV, CD)

                    if loop == 1:
                        if pre:  # fold the committed records first (their ring positions are about to be reused)
                            base = _fold_window(base, rk, rla, ru, rv, rbeta, xk, xla, xv, xbeta, c, 0, offs_k, mask_k,
                                                cols_v, mask_v, KS, LS, US, HV, L, BL, DECAY, RAW, CD, FOLD_UNROLL)
                        tl.debug_barrier()  # every old record is read before this tile's new records overwrite them

                    U = _ring(ru, US, j, count0, cols_v, mask_v, CD)
                    bad = _tile_tokens(base, U, DQ, DK, KQ, GC, rla, xq, xk, xv, xla, xbeta, out + (b * T * HV + h) * V
                                       + vt * BV, ru, rv, count0, j, tt, offs_k, mask_k, cols_v, mask_v, live, bad,
                                       KS, US, LS, HV, V, T, DECAY, DELTA, RAW, CD)

                    if loop == 1:
                        tl.debug_barrier()  # the new u records written above are visible to every thread of the fold
                        new = base
                        if post:  # post rows read the exact checkpoint: base is exact
                            new = _fold_window(base, rk, rla, ru, rv, rbeta, xk, xla, xv, xbeta, count0, T, offs_k,
                                               mask_k, cols_v, mask_v, KS, LS, US, HV, L, BL, DECAY, RAW, CD,
                                               FOLD_UNROLL)
                        if flush:
                            _store_checkpoint(new, state, s_tile, mask_kv, read_data, read_row_scale, read_block_scale,
                                              flushes, seed, slot, head, h, offs_k, offs_v, K, V, BK, BV, READ,
                                              READ_KEY_MAJOR, LAYOUT_KV, SR, SR_MANT, SR_EMIN, CD)
    tl.store(nonfinite + slot, tl.full([], 1, tl.uint8), mask=bad & live)
    if (ROWS != 1) & live:  # the flushing rows' launch leaves the cursors to the launch after it
        tl.debug_barrier()  # every thread of this program has read what the row's finalize overwrites
        _take_ticket(k, log_a, beta, ring_k, ring_la, ring_beta, count, flushes, tickets, b, slot, live, pre, post,
                     count0, T, L, HV, HK, K, BHV, BHK, BK, DECAY, RAW, COMMIT)


# ------------------------------------------------------------------------------------------ launcher
# NOTE [fold unrolling]
# A flushing row's program folds L records into each of its tiles, one load round trip per record when
# the loop is not unrolled, and runs several times as long as the others (at batch 256, L = 16, the 1/16
# of rows that flush added 93 us to GDN's 378 us non-flush step). One-token calls (and materialize)
# unroll the fold by 8 (with a read copy only on `vk` tiles), which lets the records' loads overlap: H200, batch 256, L = 16
# (2026-12-03, tune_replay.py on variants): Mamba-2 step 354 -> 346 us (bf16 copy 339 -> 331, fp8 copy
# 321 -> 307), GDN 471 -> 448; at the commit that made it the default, against --fold-unroll 1 in the same
# run (step_check.sh): Mamba-2 350 -> 342, fp8 copy 324 -> 310, GDN 471 -> 447. Per-channel decay joined
# with the closed-form fold (NOTE [closed-form fold]), which multiplies the tile by one decay vector instead
# of one per record: KDA 311 (unroll 1) -> 284 us, where the in-order fold had lost at 8 (289 -> 304). Everything
# else keeps 1, slower at 8: GDN's `kv` tiles with a read copy (bf16 625 -> 651 us, fp8 616 -> 746: the copy's
# dequantisation and the unrolled fold compete for registers), and verify calls (T = 4: Mamba-2 770 -> 912 us,
# GDN 1341 -> 1522).
_DECAY_CODE = {"none": 0, "scalar": 1, "channel": 2}
# programs a grid should have before a unit's tiles are shared by fewer of them (NOTE [key-group programs])
PROGRAMS = 1024
# at most this many (head, value tile) pairs a program: a flushing row's program folds each of its pairs,
# and with 32 pairs (a whole Mamba-2 key group) the flush programs ran long (step 506 us, 4 pairs: 421 us;
# H200, 2026-12-02, tune_replay.py --items 0,1,4,16)
MAX_ITEMS = 4
# ... except where the non-flush rows loop apart on a pipelined loop, which a longer loop feeds better:
# GDN step, L = 8, 2 stages, 4 -> 8 pairs 400.8 -> 375.3 us (H200, 2026-12-04, tune_replay.py --items 0,8)
MAX_PIPELINED_ITEMS = 8
# register cap of the non-flush rows' launch where the flushing rows have their own (NOTE [non-flush register cap])
NONFLUSH_REGISTERS = 96


@dataclasses.dataclass(frozen=True)
class ReplayBuffers:
    """Device tensors of one replay state (see ``runtime/state.py``); absent parts are None."""

    state: torch.Tensor
    ring: dict
    read: Optional[dict]
    count: torch.Tensor
    flushes: torch.Tensor
    nonfinite: torch.Tensor
    tickets: torch.Tensor


@dataclasses.dataclass(frozen=True)
class ReplaySpec:
    """The host-known facts a kernel is specialised on (besides shapes)."""

    decay: str
    delta: bool
    raw: bool
    layout: str
    window: int
    k_heads: int
    read_format: Optional[str]
    stochastic_rounding: bool
    seed: int


class Tiling(NamedTuple):
    """Block sizes, warps and register cap of a replay launch, and its grid ``(rows, units, parts)``."""

    BK: int
    BV: int
    BL: int
    num_warps: int
    max_registers: Optional[int]
    units: int   # programs' shared unit: key groups, or value heads under per-channel decay
    items: int   # (value head, value tile) pairs a program serves
    parts: int   # programs per unit
    fold_unroll: int  # records per iteration of a flush fold (NOTE [fold unrolling])
    nonflush_stages: int  # 0: one loop for every row; s > 0: non-flush rows loop apart over s stages (NOTE [two row loops])
    flush_items: int  # 0: one launch; n > 0: the flushing rows first, in a launch of n pairs a program (NOTE [flush launch])
    flush_parts: int  # programs per unit of that launch
    nonflush_registers: Optional[int]  # register cap of the launch after it (NOTE [non-flush register cap])
    nonflush_BV: int  # value tile of the launch that ``items`` and ``parts`` describe (``BV`` unless two launches)


def tiling(spec: ReplaySpec, K: int, V: int, rows: int, Hv: int, T: int, block_v: Optional[int] = None,
           items: Optional[int] = None, fold_unroll: Optional[int] = None,
           nonflush_stages: Optional[int] = None, flush_items: Optional[int] = None,
           nonflush_block_v: Optional[int] = None) -> Tiling:
    """How a call of ``T`` tokens over ``rows`` rows is cut into programs (:class:`Tiling`).

    Value tiles of ~4K elements, halved while the grid would leave SMs idle; every tile holds all keys,
    so it owns whole scale rows of a (value-major) read copy. A unit (key group; value head under
    per-channel decay) is split into programs of ``items`` tiles each, as few as keep ~``PROGRAMS`` programs
    in the grid (NOTE [key-group programs]).

    NOTE [register cap]: tiles of up to ~4K elements run 2 warps capped at 168 registers (one-token calls
    on ``kv`` tiles; 128 was 4-10% slower there) or 128 (verify, and ``vk`` tiles, where 168 made Mamba-2
    steps 7-11% slower). With 2 warps fewer warps share each tile's key reduction, and the cap trades a few
    spilled bytes (sm_90 compile of the steps: 0-80 with fp32 checkpoints, 112-176 with fp8 copies) for
    occupancy. Against the previous 4 warps (96 registers, none under per-channel decay without a read
    copy), batch 256 on the H200 (2026-12-03, tune_replay.py): step Mamba-2 397 -> 354 us, GDN 554 -> 471,
    KDA 323 -> 289 (with the running channel decay); fp8 copies Mamba-2 376 -> 321, GDN 705 -> 615, KDA
    424 -> 381; verify T = 8 Mamba-2 2145 -> 1526, GDN 3918 -> 3046. 8 warps, 1-warp programs (value tiles
    of 8 or 16) and caps of 96 or 255 were all slower (``benchmarks/gpu/sweep_tiling.sh`` sweeps around
    these defaults).

    Where the flushing rows have a launch of their own (NOTE [flush launch]), ``nonflush_block_v`` gives the other
    rows' launch a value tile of its own (by default both take ``BV``); ``items`` and ``parts`` are that launch's.
    Its register cap stays ``NONFLUSH_REGISTERS``, set for tiles of ~4K elements: a wider tile wants the launch's
    ``nonflush_registers`` too (sm_90, GDN fp8 step on tiles of 64: 324 bytes spilled at 96 registers, 104 at 128).
    """
    for name, bv in (("block_v", block_v), ("nonflush_block_v", nonflush_block_v)):
        if bv is not None and (bv < 1 or bv & (bv - 1)):
            raise ValueError(f"{name} must be a power of two (got {bv})")
    BK = max(triton.next_power_of_2(K), 16 if spec.read_format == "fp4" else 1)  # e2m1 blocks of 16 keys
    BV = block_v or min(triton.next_power_of_2(V), max(16, 4096 // BK))
    while not block_v and BV > 16 and rows * Hv * triton.cdiv(V, BV) < 2048:
        BV //= 2
    num_warps = 16 if BK * BV >= 16384 else (8 if BK * BV >= 8192 else 2)
    cap = (168 if T <= 1 and spec.layout == "kv" else 128) if num_warps == 2 else None
    units = Hv if spec.decay == "channel" else spec.k_heads
    pairs = lambda bv: Hv // units * triton.cdiv(V, bv)  # (value head, value tile) pairs of a unit
    per_unit = pairs(BV)
    if nonflush_stages is None:  # NOTE [two row loops]
        if T > 1:
            nonflush_stages = 0
        elif spec.layout == "kv":
            nonflush_stages = 1 if spec.decay == "channel" else 2
        else:  # vk: only a 4-bit copy's flushing rows are worth a launch of their own (NOTE [flush launch])
            nonflush_stages = 1 if spec.read_format == "fp4" else 0
    if flush_items is None:  # NOTE [flush launch]: read copies (their flushing rows set the step's time)
        flush_items = 1 if spec.read_format else 0
    flush_items = min(flush_items, per_unit) if nonflush_stages > 0 else 0
    nonflush_BV = (nonflush_block_v or BV) if flush_items else BV
    nonflush_pairs = pairs(nonflush_BV)
    if items is None:
        items = min(nonflush_pairs, MAX_PIPELINED_ITEMS if nonflush_stages > 1 else MAX_ITEMS)
        while items > 1 and rows * units * triton.cdiv(nonflush_pairs, items) < PROGRAMS:
            items = triton.cdiv(items, 2)
    items = max(1, min(items, nonflush_pairs))
    if fold_unroll is None:
        fold_unroll = 8 if T <= 1 and (spec.read_format is None or spec.layout == "vk") else 1
    nonflush_cap = NONFLUSH_REGISTERS if flush_items and cap else cap  # NOTE [non-flush register cap]
    return Tiling(BK, BV, triton.next_power_of_2(spec.window), num_warps, cap, units, items,
                  triton.cdiv(nonflush_pairs, items), fold_unroll, nonflush_stages, flush_items,
                  triton.cdiv(per_unit, flush_items) if flush_items else 0, nonflush_cap, nonflush_BV)


def launch(buf: ReplayBuffers, spec: ReplaySpec, x: Canonical, slots: Optional[torch.Tensor], out: Optional[torch.Tensor],
           *, commit: bool, force_flush: bool, materialize: bool, block_v: Optional[int] = None,
           num_warps: Optional[int] = None, max_registers: Optional[int] = None, items: Optional[int] = None,
           fold_unroll: Optional[int] = None, nonflush_stages: Optional[int] = None,
           flush_items: Optional[int] = None, nonflush_registers: Optional[int] = None,
           nonflush_warps: Optional[int] = None, nonflush_block_v: Optional[int] = None) -> None:
    """Run one replay call (``x`` inputs ``[B, T, ...]``; ``materialize``: ``x`` is None, no tokens).

    One launch of the replay kernel over ``(B, units, parts)`` (:func:`tiling`), after one over ``(B, units,
    flush_parts)`` for the flushing rows where the tiling has ``flush_items`` (NOTE [flush launch]; then
    ``nonflush_registers``, ``nonflush_warps`` and ``nonflush_block_v`` set the second launch's register cap, warps
    and value tile); the last program of each row moves its cursors (NOTE [the last program moves the cursors]).
    ``slots [B]`` (int, -1 = padding) or None (row b is slot b); ``out [B, T, Hv, V]`` contiguous.
    """
    state, ring = buf.state, buf.ring
    Hv = state.shape[1]
    K, V = (state.shape[2], state.shape[3]) if spec.layout == "kv" else (state.shape[3], state.shape[2])
    if materialize:
        B, T = (state.shape[0] if slots is None else slots.shape[0]), 0
        q = k = v = log_a = beta = ring["k"]
    else:
        B, T = x.q.shape[:2]
        q, k, v = x.q.contiguous(), x.k.contiguous(), x.v.contiguous()
        log_a = ring["k"] if x.log_a is None else x.log_a.contiguous()
        beta = ring["k"] if x.beta is None else x.beta.contiguous()
    if B == 0:
        return
    cd = torch.float64 if state.dtype == torch.float64 else torch.float32
    tile = tiling(spec, K, V, B, Hv, T, block_v, items, fold_unroll, nonflush_stages, flush_items, nonflush_block_v)
    num_warps = num_warps or tile.num_warps
    if not tile.flush_items:  # one launch: the non-flush rows' own settings do not apply
        nonflush_registers, nonflush_warps = None, None
    nonflush_warps = nonflush_warps or num_warps
    # the default caps belong to the default warps (NOTE [register cap], NOTE [non-flush register cap])
    max_registers_default = tile.max_registers if num_warps == tile.num_warps else None
    nonflush_default = tile.nonflush_registers if nonflush_warps == tile.num_warps else None
    nonflush_registers = nonflush_registers or max_registers or nonflush_default
    max_registers = max_registers or max_registers_default
    read = buf.read or {}
    dummy = ring["k"]
    sr_mant, sr_emin = SR_FORMATS.get(str(state.dtype).removeprefix("torch."), (0, 0))
    stride_sk, stride_sv = ((state.stride(2), state.stride(3)) if spec.layout == "kv"
                            else (state.stride(3), state.stride(2)))
    args = (
        state, q, k, v, log_a, beta, dummy if out is None else out, dummy if slots is None else slots,
        ring["k"], ring["u"], ring.get("log_a", dummy), ring.get("v", dummy), ring.get("beta", dummy),
        read.get("data", dummy), read.get("row_scale", dummy), read.get("block_scale", dummy),
        buf.count, buf.flushes, buf.nonfinite.view(torch.uint8), buf.tickets, spec.seed,
        state.stride(0), state.stride(1), stride_sk, stride_sv)
    constants = dict(
        T=T, L=spec.window, BL=tile.BL, BT=triton.next_power_of_2(max(T, 1)), HV=Hv, GROUP=Hv // spec.k_heads,
        K=K, V=V, BK=tile.BK, DECAY=_DECAY_CODE[spec.decay], DELTA=spec.delta,
        RAW=spec.raw, READ=READ_CODES[spec.read_format], READ_KEY_MAJOR=key_major(read), LAYOUT_KV=spec.layout == "kv",
        COMMIT=commit,
        FORCE=force_flush, MATERIALIZE=materialize, HAS_SLOTS=slots is not None, SR=spec.stochastic_rounding,
        SR_MANT=sr_mant, SR_EMIN=sr_emin, CD=tl.float64 if cd == torch.float64 else tl.float32,
        BHV=triton.next_power_of_2(Hv), BHK=triton.next_power_of_2(spec.k_heads), FOLD_UNROLL=tile.fold_unroll,
        SPLIT=tile.nonflush_stages > 0, STAGES=max(tile.nonflush_stages, 1))
    cap = lambda registers: dict(maxnreg=registers) if registers else {}  # NOTE [register cap]
    if tile.flush_items:  # NOTE [flush launch]: before the launch that moves the cursors
        replay_kernel[(B, tile.units, tile.flush_parts)](*args, BV=tile.BV, ITEMS=tile.flush_items, ROWS=1,
                                                         **constants, num_warps=num_warps, **cap(max_registers))
    replay_kernel[(B, tile.units, tile.parts)](*args, BV=tile.nonflush_BV, ITEMS=tile.items,
                                               ROWS=2 if tile.flush_items else 0, **constants,
                                               num_warps=nonflush_warps, **cap(nonflush_registers))


def commit(count: torch.Tensor, n_accepted: torch.Tensor, slots: Optional[torch.Tensor], window: int) -> None:
    """``count[slot] += n_accepted[b]`` on the device (one tiny launch)."""
    B = n_accepted.shape[0]
    if B == 0:
        return
    BLOCK = 128
    commit_kernel[(triton.cdiv(B, BLOCK),)](n_accepted.contiguous(), count if slots is None else slots, count, B,
                                            L=window, HAS_SLOTS=slots is not None, BLOCK=BLOCK, num_warps=1)
