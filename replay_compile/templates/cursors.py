"""Per-row phase of a replay call, and the cursor moves: a row's finalize (in the replay kernel) and the commit kernel.

# NOTE [the last program moves the cursors]
Every program of a row reads the row's ``count`` and the ring's shared records (keys per key head,
log-decays and betas per value head, read by every value tile). A pre-flushing row folds its old
records and then writes its new ones over the same ring positions, so those shared writes and the
cursor update must wait until every program of the row has read. Each program, when done, takes a
ticket (``tickets[slot]``, an acq_rel atomic after a block barrier); the one that draws the last
ticket has seen every other program of the row finish, writes the row's shared records, moves its
cursors (``finalize_row``) and puts the ticket back to 0 for the next call (where the flushing rows have a launch of
their own, the one after it takes their tickets: NOTE [flush launch] in ``replay.py``). One launch per call, no
host sync: a CUDA graph replays it with fresh cursor values. Tile-private records (``u``, raw ``v``)
are written by the program that owns the tile. A slot given twice in one call would leave its ticket
off count; the host check rejects repeated slots (``ReplayState._check_slots``).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_phase(c, live, T: tl.constexpr, L: tl.constexpr, COMMIT: tl.constexpr, FORCE: tl.constexpr,
              MATERIALIZE: tl.constexpr):
    """``(pre, post, count0)`` of a row with ``c`` committed records (NOTE [flush points], reference.py).

    ``pre``: fold the committed records first (``c + T > L``); ``count0``: records kept before the new
    ones; ``post``: fold everything after the call (ring full on commit, forced, or materialize).
    """
    if MATERIALIZE:
        pre = live & (c < 0)
        count0 = c
        post = live & (c > 0)
    else:
        pre = live & (c + T > L)
        count0 = tl.where(pre, 0, c)
        if FORCE:
            post = live
        elif COMMIT:
            post = live & (count0 + T == L)
        else:
            post = live & (c < 0)
    return pre, post, count0


@triton.jit
def load_row(slots, count, b, L: tl.constexpr, HAS_SLOTS: tl.constexpr):
    """``(slot, live, c)`` of row ``b``: padding rows (slot -1) address slot 0 but are never live."""
    if HAS_SLOTS:
        slot = tl.load(slots + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    c = tl.load(count + slot, mask=live, other=0)
    return slot, live, tl.minimum(tl.maximum(c, 0), L)


@triton.jit
def _copy_record(src, dst, live, ROWS: tl.constexpr, COLS: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.arange(0, BR)[:, None]
    c = tl.arange(0, BC)[None, :]
    m = (r < ROWS) & (c < COLS)
    tl.store(dst + r * COLS + c, tl.load(src + r * COLS + c, mask=m, other=0), mask=m & live)


@triton.jit
def finalize_row(k, log_a, beta, ring_k, ring_la, ring_beta, count, flushes, b, slot, live, pre, post, count0,
                 T: tl.constexpr, L: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
                 BHV: tl.constexpr, BHK: tl.constexpr, BK: tl.constexpr,
                 DECAY: tl.constexpr, RAW: tl.constexpr, COMMIT: tl.constexpr):
    """Row ``b``: write its new shared records (k ``[T, HK, K]``, log_a, raw beta) and move its cursors."""
    for t in tl.static_range(T):
        pos = slot * L + count0 + t
        tok = b * T + t
        _copy_record(k + tok * HK * K, ring_k + pos * HK * K, live, HK, K, BHK, BK)
        if DECAY == 1:
            _copy_record(log_a + tok * HV, ring_la + pos * HV, live, 1, HV, 1, BHV)
        elif DECAY == 2:
            _copy_record(log_a + tok * HV * K, ring_la + pos * HV * K, live, HV, K, BHV, BK)
        if RAW:
            _copy_record(beta + tok * HV, ring_beta + pos * HV, live, 1, HV, 1, BHV)
    if COMMIT:
        new_count = count0 + T
    else:
        new_count = count0
    new_count = tl.where(post, 0, new_count)
    tl.store(count + slot, new_count.to(count.dtype.element_ty), mask=live)
    f = tl.load(flushes + slot, mask=live, other=0)
    tl.store(flushes + slot, f + pre.to(f.dtype) + post.to(f.dtype), mask=live)


@triton.jit
def commit_kernel(n_accepted, slots, count, B, L: tl.constexpr, HAS_SLOTS: tl.constexpr, BLOCK: tl.constexpr):
    """``count[slot] += n_accepted[b]`` for live rows (clamped to ``[0, L]``: a graph cannot validate)."""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = b < B
    if HAS_SLOTS:
        slot = tl.load(slots + b, mask=inside, other=-1).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    live = inside & (slot >= 0)
    slot = tl.maximum(slot, 0)
    n = tl.load(n_accepted + b, mask=live, other=0)
    c = tl.load(count + slot, mask=live, other=0)
    tl.store(count + slot, tl.minimum(tl.maximum(c + n, 0), L).to(count.dtype.element_ty), mask=live)
