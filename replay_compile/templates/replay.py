"""The replay decode template: one launch of it serves every row of a step, verify or materialize.

One program owns one (row, value head, value tile): it loads its ``[K, BV]`` checkpoint tile once
(rows that do not flush read the read copy instead), gathers the row's committed records, runs the
call's ``T`` tokens through the window, and only on rows that flush folds the window into the
checkpoint (one rank-L product on the tensor cores) and re-quantizes the read copy. Everything per row
(flush or not, where the window ends) comes from the device cursors inside the kernel
(``cursors.row_phase``), and the last program of a row to finish moves the row's cursors
(``cursors.finalize_row``, NOTE [one launch per call]): no host sync, one launch, so a step can be
captured in a CUDA graph.

# NOTE [the window in registers]
The kernel holds three things per program: the state tile ``base [BK, BV]``, the keys of the window
weighted by their decay to the current position ``KWp [BL, BK]`` and the corrected updates
``U [BL, BV]`` (plus the call's ``T`` tokens, loaded as blocks up front). A token at position ``p`` reads

    S_p^T x = base^T (G_p * x) + sum_j (KWp_j . x) U_j           (G_p: the checkpoint's decay to p)

and moving to the next position multiplies ``KWp`` by that token's decay and puts its key in row p
(``_advance``): per token, one ``[BL, BK]`` scaling, not a fresh cumulative decay (which would cost
``BL x K`` exponentials per token with per-channel decays). A fold is ``G * base + KWp^T U`` (``_fold``),
as rank-1 updates in exact fp32: on the H200 a ``tl.dot`` there (tf32x3, or an fp32 FMA dot) cost every
program shared memory, registers and spills, which slowed the non-flush path that 15 of 16 rows take.

# NOTE [window weights without differences]
The decay from record ``i`` to position ``p`` is ``exp(sum_{i<j<=p} log_a_j)``: a reverse cumulative
sum of the log-decays shifted by one position (gathered a second time at ``j + 1``), or a running
product, never a difference of prefix sums, so a decay of exactly 0 (``log_a = -inf``) gives weight 0,
not NaN, as in reference.py.

Specialisation (constexpr): decay kind x delta rule (the family's ``template``), raw delta folds,
read-copy format, layout (strides + ``LAYOUT_KV``), head dims, grouping, window ``L``, draft length
``T``, checkpoint dtype (stochastic rounding), compute dtype. Value columns are independent in every
family (the delta rule's ``S^T k`` reduces over keys), which is what lets a program own a value tile.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton
import triton.language as tl

from ..families.base import Canonical
from .cursors import commit_kernel, finalize_row, load_row, row_phase
from .readcopy import READ_CODES, load_read_tile, store_read_tile
from .sround import SR_FORMATS, slot_seed, stochastic_round


@triton.jit
def _gather(ring_row, x_row, stride, j, n_ring, n_new, cols, col_mask, CD: tl.constexpr):
    """``[BL, BC]`` records at window positions ``j``: ring for ``j < n_ring``, then ``n_new`` tokens, 0 beyond.

    Ring records ``[N, L, ...]`` and inputs ``[B, T, ...]`` share their per-position ``stride``.
    """
    in_ring = (j < n_ring)[:, None] & col_mask[None, :]
    in_new = ((j >= n_ring) & (j < n_ring + n_new))[:, None] & col_mask[None, :]
    r = tl.load(ring_row + j[:, None] * stride + cols[None, :], mask=in_ring, other=0.0)
    x = tl.load(x_row + (j - n_ring)[:, None] * stride + cols[None, :], mask=in_new, other=0.0)
    return tl.where(in_ring, r.to(CD), x.to(CD))


@triton.jit
def _gather1(ring_row, x_row, stride, j, n_ring, n_new, CD: tl.constexpr):
    """``[BL]`` scalar records (per-head log-decay or beta), as :func:`_gather`."""
    in_ring = j < n_ring
    in_new = (j >= n_ring) & (j < n_ring + n_new)
    r = tl.load(ring_row + j * stride, mask=in_ring, other=0.0)
    x = tl.load(x_row + (j - n_ring) * stride, mask=in_new, other=0.0)
    return tl.where(in_ring, r.to(CD), x.to(CD))


@triton.jit
def _gather_decays(rla, xla, LS: tl.constexpr, j, n_ring, n_new, offs_k, mask_k, DECAY: tl.constexpr,
                   CD: tl.constexpr):
    """Log-decays at positions ``j`` and ``j + 1`` (``[BL]`` scalar or ``[BL, BK]`` per channel; 0 without decay)."""
    LA = 0.0
    LN = 0.0
    if DECAY == 2:
        LA = _gather(rla, xla, LS, j, n_ring, n_new, offs_k, mask_k, CD)
        LN = _gather(rla, xla, LS, j + 1, n_ring, n_new, offs_k, mask_k, CD)
    elif DECAY == 1:
        LA = _gather1(rla, xla, LS, j, n_ring, n_new, CD)
        LN = _gather1(rla, xla, LS, j + 1, n_ring, n_new, CD)
    return LA, LN


@triton.jit
def _weights_at(KW, LA, LN, j, p, DECAY: tl.constexpr):
    """``(lg, KWp)`` at position ``p``: the checkpoint's log-decay, keys weighted by their decay (0 after ``p``)."""
    live = (j <= p)[:, None]
    KWp = tl.where(live, KW, 0.0)
    lg = 0.0
    if DECAY == 1:
        lg = tl.sum(tl.where(j <= p, LA, 0.0), 0)
        KWp = KWp * tl.exp(tl.cumsum(tl.where(j + 1 <= p, LN, 0.0), 0, reverse=True))[:, None]
    elif DECAY == 2:
        lg = tl.sum(tl.where(live, LA, 0.0), 0)
        KWp = KWp * tl.exp(tl.cumsum(tl.where((j + 1 <= p)[:, None], LN, 0.0), 0, reverse=True))
    return lg, KWp


@triton.jit
def _advance(lg, KWp, la_t, k_t, j, p, DECAY: tl.constexpr):
    """Move ``(lg, KWp)`` from position ``p - 1`` to ``p``: every record decays by ``a_p``, key ``p`` joins at 1."""
    if DECAY == 1:
        lg = lg + la_t
        KWp = KWp * tl.exp(la_t)
    elif DECAY == 2:
        lg = lg + la_t
        KWp = KWp * tl.exp(la_t)[None, :]
    return lg, tl.where((j == p)[:, None], k_t[None, :], KWp)


@triton.jit
def _decay_of(lg, DECAY: tl.constexpr):
    """``G = exp(lg)`` (1 without decay)."""
    g = 1.0
    if DECAY > 0:
        g = tl.exp(lg)
    return g


@triton.jit
def _window_read(KWp, U, x):
    """``sum_j (KWp_j . x) U_j`` ``[BV]`` for ``x [BK]``."""
    return tl.sum(tl.sum(KWp * x[None, :], 1)[:, None] * U, 0)


@triton.jit
def _state_read(base, g, x):
    """``base^T (g * x)`` ``[BV]`` (``g`` scalar or ``[BK]``)."""
    return tl.sum(base * (x * g)[:, None], 0)


@triton.jit
def _row(X, j, i):
    """Row ``i`` of ``X [BL, BC]`` (a masked reduction: registers cannot be indexed by a loop variable)."""
    return tl.sum(tl.where((j == i)[:, None], X, 0.0), 0)


@triton.jit
def _fold(S, lg, KWp, U, j, BL: tl.constexpr, DECAY: tl.constexpr):
    """The checkpoint after a window: ``G * S + sum_i KWp_i U_i^T`` (``G = exp(lg)`` per tile or per key row).

    Rank-1 updates in fp32 registers: only rows that flush run it, and a ``tl.dot`` here would hold a
    second ``[BK, BV]`` accumulator and shared-memory operands in every program (registers and occupancy
    of the non-flush path; an fp32 FMA dot spills to local memory on sm_90).
    """
    if DECAY == 1:
        S = S * tl.exp(lg)
    elif DECAY == 2:
        S = S * tl.exp(lg)[:, None]
    for i in range(0, BL):
        S += _row(KWp, j, i)[:, None] * _row(U, j, i)[None, :]
    return S


@triton.jit
def _true_updates(S, KR, LAF, VR, BETA, j, BL: tl.constexpr, DECAY: tl.constexpr):
    """``(lg, KWp, U)`` after replaying the delta recurrence over raw records from the exact checkpoint ``S``.

    ``u_i = beta_i (v_i - a_i S_{i-1}^T k_i)`` record by record, each seeing the checkpoint (decayed to
    it) and the records before it (forward substitution of the window's triangular system). Positions
    past the window hold zeros in every input, so their ``u`` is 0 and they leave ``lg`` and ``KWp`` as
    they were.
    """
    lg = 0.0
    if DECAY > 0:
        lg = tl.zeros_like(tl.sum(LAF, 0))
    KWp = tl.zeros_like(KR)
    U = tl.zeros_like(VR)
    for i in range(0, BL):
        k_i = _row(KR, j, i)
        la_i = 0.0
        if DECAY == 2:
            la_i = _row(LAF, j, i)
        elif DECAY == 1:
            la_i = tl.sum(tl.where(j == i, LAF, 0.0), 0)
        lg, KWp = _advance(lg, KWp, la_i, k_i, j, i, DECAY)
        beta_i = tl.sum(tl.where(j == i, BETA, 0.0), 0)
        sk = _state_read(S, _decay_of(lg, DECAY), k_i) + _window_read(KWp, U, k_i)  # U row i is still 0
        U = tl.where((j == i)[:, None], (beta_i * (_row(VR, j, i) - sk))[None, :], U)
    return lg, KWp, U


@triton.jit
def _state_tile(state, slot, h, vt, stride_sn, stride_sh, stride_sk, stride_sv, K: tl.constexpr, V: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, LAYOUT_KV: tl.constexpr):
    """Block pointer to the ``[BK, BV]`` checkpoint tile (keys x values) of one (slot, head, value tile).

    A block pointer keeps the tile's address in scalars until the load or store, where a pointer
    tensor (8 bytes per element) would stay live across the kernel for the flush-row store.
    """
    head = state + slot * stride_sn + h * stride_sh
    if LAYOUT_KV:
        blk = tl.make_block_ptr(head, (K, V), (stride_sk, stride_sv), (0, vt * BV), (BK, BV), (1, 0))
    else:
        blk = tl.make_block_ptr(head, (K, V), (stride_sk, stride_sv), (0, vt * BV), (BK, BV), (0, 1))
    return blk


@triton.jit
def _nonfinite(x):
    """Any element of the block ``x`` is NaN or infinite."""
    return tl.sum((~(tl.abs(x) < float("inf"))).to(tl.int32)) > 0


@triton.jit
def _nonfinite1(x):
    """The scalar ``x`` is NaN or infinite."""
    return ~(tl.abs(x) < float("inf"))


@triton.jit
def replay_kernel(
    state, q, k, v, log_a, beta, out, slots,
    ring_k, ring_u, ring_la, ring_v, ring_beta,
    read_data, read_row_scale, read_block_scale,
    count, flushes, nonfinite, arrivals, seed,
    stride_sn, stride_sh, stride_sk, stride_sv,
    T: tl.constexpr, L: tl.constexpr, BL: tl.constexpr, BTK: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BHV: tl.constexpr, BHK: tl.constexpr,
    DECAY: tl.constexpr, DELTA: tl.constexpr, RAW: tl.constexpr, READ: tl.constexpr, LAYOUT_KV: tl.constexpr,
    COMMIT: tl.constexpr, FORCE: tl.constexpr, MATERIALIZE: tl.constexpr, HAS_SLOTS: tl.constexpr,
    SR: tl.constexpr, SR_MANT: tl.constexpr, SR_EMIN: tl.constexpr, CD: tl.constexpr,
):
    """Row ``b``, value head ``h``, value tile ``vt`` of a replay call over ``T`` tokens.

    Inputs (contiguous): ``q, k [B, T, HK, K]``, ``v [B, T, HV, V]``, ``log_a [B, T, HV(, K)]``,
    ``beta [B, T, HV]``; output ``out [B, T, HV, V]``. Ring (contiguous): ``k [N, L, HK, K]``,
    ``u / v [N, L, HV, V]``, ``log_a [N, L, HV(, K)]``, ``beta [N, L, HV]``. The checkpoint is addressed
    through its strides (``stride_sk / stride_sv`` step along keys / values, whatever the layout).
    """
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vt = tl.program_id(2)
    HK: tl.constexpr = HV // GROUP
    hk = h // GROUP
    slot, live, c = load_row(slots, count, b, L, HAS_SLOTS)
    n_flushes = 0
    if SR:  # the stochastic-rounding stream of this flush, read before the last program moves it
        n_flushes = tl.load(flushes + slot, mask=live, other=0)

    offs_k = tl.arange(0, BK)
    offs_v = vt * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < K, offs_v < V
    mask_kv = mask_k[:, None] & mask_v[None, :]
    j = tl.arange(0, BL)
    head = slot * HV + h
    if LAYOUT_KV:
        R: tl.constexpr = K
        C: tl.constexpr = V
        BR: tl.constexpr = BK
        BC: tl.constexpr = BV
        rows, cols, mask_rc = offs_k, offs_v, mask_kv
    else:
        R: tl.constexpr = V
        C: tl.constexpr = K
        BR: tl.constexpr = BV
        BC: tl.constexpr = BK
        rows, cols, mask_rc = offs_v, offs_k, mask_v[:, None] & mask_k[None, :]

    # the state tile first: its load depends on the slot only, so it overlaps the cursor load
    if READ > 0:
        base = load_read_tile(read_data, read_row_scale, read_block_scale, head, rows, cols, mask_rc, live,
                              R, C, BR, BC, READ, LAYOUT_KV, CD)
    else:
        base = tl.load(_state_tile(state, slot, h, vt, stride_sn, stride_sh, stride_sk, stride_sv, K, V, BK, BV,
                                   LAYOUT_KV), boundary_check=(0, 1), padding_option="zero").to(CD)
        base = tl.where(live, base, 0.0)  # a padding row read slot 0's tile: it must not show
    pre, post, count0 = row_phase(c, live, T, L, COMMIT, FORCE, MATERIALIZE)
    flush = pre | post
    if READ > 0:
        if flush:  # rows that write the checkpoint read it exactly
            base = tl.load(_state_tile(state, slot, h, vt, stride_sn, stride_sh, stride_sk, stride_sv, K, V, BK, BV,
                                       LAYOUT_KV), boundary_check=(0, 1), padding_option="zero").to(CD)

    # per-position strides of records (ring and inputs alike)
    KS: tl.constexpr = HK * K
    US: tl.constexpr = HV * V
    LS: tl.constexpr = HV * K if DECAY == 2 else HV
    LW: tl.constexpr = K if DECAY == 2 else 1
    rk = ring_k + slot * L * KS + hk * K
    ru = ring_u + slot * L * US + h * V + vt * BV
    rv = ring_v + slot * L * US + h * V + vt * BV
    rla = ring_la + slot * L * LS + h * LW
    rbeta = ring_beta + slot * L * HV + h
    xq = q + b * T * KS + hk * K
    xk = k + b * T * KS + hk * K
    xv = v + b * T * US + h * V + vt * BV
    xla = log_a + b * T * LS + h * LW
    xbeta = beta + b * T * HV + h
    cols_v = tl.arange(0, BV)

    # every load this program needs is issued before the arrival below (its release waits for them):
    # this call's tokens ``[BTK, ...]``, then the committed window below count0
    jt = tl.arange(0, BTK)
    tok = jt < T
    QT = tl.load(xq + jt[:, None] * KS + offs_k[None, :], mask=tok[:, None] & mask_k[None, :], other=0.0).to(CD)
    KT = tl.load(xk + jt[:, None] * KS + offs_k[None, :], mask=tok[:, None] & mask_k[None, :], other=0.0).to(CD)
    VT = tl.load(xv + jt[:, None] * US + cols_v[None, :], mask=tok[:, None] & mask_v[None, :], other=0.0).to(CD)
    LAT = 0.0
    if DECAY == 1:
        LAT = tl.load(xla + jt * LS, mask=tok, other=0.0).to(CD)
    elif DECAY == 2:
        LAT = tl.load(xla + jt[:, None] * LS + offs_k[None, :], mask=tok[:, None] & mask_k[None, :], other=0.0).to(CD)
    BETAT = 0.0
    if DELTA:
        BETAT = tl.load(xbeta + jt * HV, mask=tok, other=0.0).to(CD)
    KW = _gather(rk, xk, KS, j, count0, 0, offs_k, mask_k, CD)
    LA, LN = _gather_decays(rla, xla, LS, j, count0, 0, offs_k, mask_k, DECAY, CD)
    U = _gather(ru, xv, US, j, count0, 0, cols_v, mask_v, CD)

    if pre:  # fold the committed records first (their ring positions are about to be reused)
        KO = _gather(rk, xk, KS, j, c, 0, offs_k, mask_k, CD)
        LAO, LNO = _gather_decays(rla, xla, LS, j, c, 0, offs_k, mask_k, DECAY, CD)
        if RAW:
            VO = _gather(rv, xv, US, j, c, 0, cols_v, mask_v, CD)
            BO = _gather1(rbeta, xbeta, HV, j, c, 0, CD)
            lgo, KWo, UO = _true_updates(base, KO, LAO, VO, BO, j, BL, DECAY)
        else:
            lgo, KWo = _weights_at(KO, LAO, LNO, j, c - 1, DECAY)
            UO = _gather(ru, xv, US, j, c, 0, cols_v, mask_v, CD)
        base = _fold(base, lgo, KWo, UO, j, BL, DECAY)
    # NOTE [one launch per call] (cursors.py): this program's reads of the row's cursors and of the
    # records the last program overwrites are done (every thread used them before the barrier)
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals + slot, 1, mask=live, sem="release")

    bad = _nonfinite(QT) | _nonfinite(KT) | _nonfinite(VT)
    if DECAY > 0:
        bad = bad | _nonfinite(LAT)
    if DELTA:
        bad = bad | _nonfinite(BETAT)
    tl.store(nonfinite + slot, tl.full([], 1, tl.uint8), mask=bad & live)

    # the committed window weighted to its last position; the T tokens join it one at a time
    lg, KWp = _weights_at(KW, LA, LN, j, count0 - 1, DECAY)
    O = tl.zeros([BTK, BV], CD)
    for t in tl.static_range(T):
        p = count0 + t
        q_t = _row(QT, jt, t)
        k_t = _row(KT, jt, t)
        la_t = 0.0
        if DECAY == 1:
            la_t = tl.sum(tl.where(jt == t, LAT, 0.0), 0)
        elif DECAY == 2:
            la_t = _row(LAT, jt, t)
        lg, KWp = _advance(lg, KWp, la_t, k_t, j, p, DECAY)
        g = _decay_of(lg, DECAY)
        u_t = _row(VT, jt, t)
        if DELTA:  # u = beta (v - a S_{p-1}^T k): the window without row p (U row p is still 0)
            beta_t = tl.sum(tl.where(jt == t, BETAT, 0.0), 0)
            u_t = beta_t * (u_t - _state_read(base, g, k_t) - _window_read(KWp, U, k_t))
        U = tl.where((j == p)[:, None], u_t[None, :], U)
        O = tl.where((jt == t)[:, None], (_state_read(base, g, q_t) + _window_read(KWp, U, q_t))[None, :], O)
    tl.store(out + ((b * T + jt[:, None]) * HV + h) * V + offs_v[None, :], tl.where(live, O, 0.0),
             mask=tok[:, None] & mask_v[None, :])
    new_rows = ((j >= count0) & (j < count0 + T) & live)[:, None] & mask_v[None, :]
    tl.store(ru + j[:, None] * US + cols_v[None, :], U, mask=new_rows)  # this tile's records
    if RAW:
        tl.store(rv + (count0 + jt)[:, None] * US + cols_v[None, :], VT, mask=(tok & live)[:, None] & mask_v[None, :])

    if post:  # post rows read the exact checkpoint: base is exact
        if RAW:  # the true recurrence over the raw records, from the exact checkpoint
            KR = _gather(rk, xk, KS, j, count0, T, offs_k, mask_k, CD)
            LAF, _ = _gather_decays(rla, xla, LS, j, count0, T, offs_k, mask_k, DECAY, CD)
            VR = _gather(rv, xv, US, j, count0, T, cols_v, mask_v, CD)
            BR_ = _gather1(rbeta, xbeta, HV, j, count0, T, CD)
            lg, KWp, U = _true_updates(base, KR, LAF, VR, BR_, j, BL, DECAY)
        base = _fold(base, lg, KWp, U, j, BL, DECAY)
    if flush:
        if SR:
            if LAYOUT_KV:
                phys = offs_k[:, None] * V + offs_v[None, :]
            else:
                phys = offs_v[None, :] * K + offs_k[:, None]
            seed_row = slot_seed(seed, slot, n_flushes)
            stored = stochastic_round(base.to(tl.float32), seed_row, (h * K * V + phys).to(tl.int32), SR_MANT, SR_EMIN)
        else:
            stored = base.to(state.dtype.element_ty).to(CD)
        tl.store(_state_tile(state, slot, h, vt, stride_sn, stride_sh, stride_sk, stride_sv, K, V, BK, BV, LAYOUT_KV),
                 stored.to(state.dtype.element_ty), boundary_check=(0, 1))
        if READ > 0:
            store_read_tile(stored.to(tl.float32), read_data, read_row_scale, read_block_scale, head, rows, cols,
                            mask_rc, flush, R, C, BR, BC, READ, LAYOUT_KV)

    if live & (arrived == HV * tl.num_programs(2) - 1):  # the row's last program
        finalize_row(k, log_a, beta, b, slot, pre, post, count0, ring_k, ring_la, ring_beta, count, flushes,
                     arrivals, T, L, HV, HK, K, BHV, BHK, BK, DECAY, RAW, COMMIT)


# ------------------------------------------------------------------------------------------ launcher
_DECAY_CODE = {"none": 0, "scalar": 1, "channel": 2}
_MIN_PROGRAMS = 264  # two per H200 SM: below that, value tiles shrink so a small batch still fills the GPU


@dataclasses.dataclass(frozen=True)
class ReplayBuffers:
    """Device tensors of one replay state (see ``runtime/state.py``); absent parts are None."""

    state: torch.Tensor
    ring: dict
    read: Optional[dict]
    count: torch.Tensor
    flushes: torch.Tensor
    nonfinite: torch.Tensor
    arrivals: torch.Tensor


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


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Block sizes of one launch: ``[BK, BV]`` state tile, ``BL`` window rows, ``BTK`` token rows."""

    BK: int
    BV: int
    BL: int
    BTK: int
    num_warps: int


def tiling(spec: ReplaySpec, K: int, V: int, rows: int, Hv: int, T: int, block_v: Optional[int] = None,
           num_warps: Optional[int] = None) -> Tiling:
    """Tiles of a call over ``rows`` rows of ``T`` tokens.

    Programs that quantize a row-scaled read copy must own whole physical rows (kv layout: all of V);
    otherwise ``[K, 64]``-element tiles at most (8K fp32, as the standard kernel), value tiles halved while
    the grid would leave SMs idle.
    """
    BK = triton.next_power_of_2(K)
    if spec.read_format in ("fp8", "fp4") and spec.layout == "kv":
        BV = max(16, triton.next_power_of_2(V))
    else:
        BV = block_v or max(16, min(triton.next_power_of_2(V), 8192 // BK))
        while not block_v and BV > 16 and rows * Hv * triton.cdiv(V, BV) < _MIN_PROGRAMS:
            BV //= 2
    BL = triton.next_power_of_2(spec.window)
    # H200 sweep (BENCHMARKS.md): 2 warps on [128, 64] fp32 decode tiles beat 4 and 8 by 1.3-2x; whole-row
    # [128, 128] read-copy tiles want 4 (2 spill, 8 leave too few programs per SM); a verify holds its
    # T tokens as well and spills at 2 (ptxas -v, sm_90)
    num_warps = num_warps or (4 if BK * BV >= 16384 or (T > 1 and BK * BV >= 4096) else (2 if BK * BV >= 2048 else 1))
    return Tiling(BK, BV, BL, triton.next_power_of_2(max(T, 1)), num_warps)


def launch(buf: ReplayBuffers, spec: ReplaySpec, x: Canonical, slots: Optional[torch.Tensor], out: Optional[torch.Tensor],
           *, commit: bool, force_flush: bool, materialize: bool, block_v: Optional[int] = None,
           num_warps: Optional[int] = None) -> None:
    """Run one replay call (``x`` inputs ``[B, T, ...]``; ``materialize``: ``x`` is None, no tokens): one launch.

    Grid ``(B, Hv, V tiles)``; the last program of each row moves its cursors (NOTE [one launch per call]).
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
    fp64 = state.dtype == torch.float64
    tile = tiling(spec, K, V, B, Hv, T, block_v, num_warps)
    read = buf.read or {}
    dummy = ring["k"]
    sr_mant, sr_emin = SR_FORMATS.get(str(state.dtype).removeprefix("torch."), (0, 0))
    stride_sk, stride_sv = ((state.stride(2), state.stride(3)) if spec.layout == "kv"
                            else (state.stride(3), state.stride(2)))
    replay_kernel[(B, Hv, triton.cdiv(V, tile.BV))](
        state, q, k, v, log_a, beta, dummy if out is None else out, dummy if slots is None else slots,
        ring["k"], ring["u"], ring.get("log_a", dummy), ring.get("v", dummy), ring.get("beta", dummy),
        read.get("data", dummy), read.get("row_scale", dummy), read.get("block_scale", dummy),
        buf.count, buf.flushes, buf.nonfinite.view(torch.uint8), buf.arrivals, spec.seed,
        state.stride(0), state.stride(1), stride_sk, stride_sv,
        T=T, L=spec.window, BL=tile.BL, BTK=tile.BTK, HV=Hv, GROUP=Hv // spec.k_heads, K=K, V=V, BK=tile.BK,
        BV=tile.BV, BHV=triton.next_power_of_2(Hv), BHK=triton.next_power_of_2(spec.k_heads),
        DECAY=_DECAY_CODE[spec.decay], DELTA=spec.delta, RAW=spec.raw, READ=READ_CODES[spec.read_format],
        LAYOUT_KV=spec.layout == "kv", COMMIT=commit, FORCE=force_flush, MATERIALIZE=materialize,
        HAS_SLOTS=slots is not None, SR=spec.stochastic_rounding, SR_MANT=sr_mant, SR_EMIN=sr_emin,
        CD=tl.float64 if fp64 else tl.float32,
        num_warps=tile.num_warps)


def commit(count: torch.Tensor, n_accepted: torch.Tensor, slots: Optional[torch.Tensor], window: int) -> None:
    """``count[slot] += n_accepted[b]`` on the device (one tiny launch)."""
    B = n_accepted.shape[0]
    if B == 0:
        return
    BLOCK = 128
    commit_kernel[(triton.cdiv(B, BLOCK),)](n_accepted.contiguous(), count if slots is None else slots, count, B,
                                            L=window, HAS_SLOTS=slots is not None, BLOCK=BLOCK, num_warps=1)
