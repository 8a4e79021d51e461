"""The chunked verify template: a speculative verify of ``T`` draft tokens as small matrix products.

Status (2026-12-08): the default verify of scalar-decay families, T <= 8 (1-warp programs of bf16 products,
NOTE [default verify]: 1.23x / 1.36x one standard step at T = 8 for Mamba-2 / GDN on an H100, where the token loop
takes 2.21x / 4.18x), and of KDA on bf16 activations at T = 8 (2-warp programs, one a head: 2.72x, token loop
4.61x); opt-in elsewhere (``ReplayState(verify_form=...)``, ``advance_into(..., chunked=True)``). Every tiling of
the GPU tests passed on an H100, bf16x3 at 4 warps since NOTE [prefetched operands read in place]. 8 warps on
value tiles of 64 made an illegal memory access (NOTE [verify warps], refused since).

One program owns one row, one value head and one value tile ``[BV]``. It walks the checkpoint's key axis in
chunks of ``BKC`` keys and takes every read the call needs from each chunk at once, as products on the tensor
cores; the tile is never whole in registers, and no product waits on another token. After the walk, the
window (the row's committed records) and the draft tokens' mutual dependence are a few ``[BT, *]`` products and
a ``T x T`` unit lower-triangular inverse (the WY form of the delta rule). Rows whose window cannot take the
``T`` drafts (``pre``, NOTE [flush points] in ``runtime/reference.py``) fold the committed records into each chunk
as they walk it (NOTE [pre rows fold in the walk]). Per-row phases come from the device cursors, and the last program of
a row moves them (NOTE [the last program moves the cursors]): one launch, no host sync, CUDA-graph safe.

# NOTE [chunked verify algebra]
Scalar (or no) decay, ring records ``(k_j, u_j, log_a_j)`` for ``j < c``, draft tokens ``t < T``. With
``Gc`` the decay of the whole window, ``W_j`` the decay after record ``j`` to the window's end, ``D_t`` the decay
from the window's end through token ``t`` and ``E[t, s]`` that from token ``s`` to ``t`` (``s <= t``)::

    PQ = Q S_c      HQ = Q Kh^T      KQ = Q Kd^T         (reads of one walk over key chunks)
    PK = K S_c      HK = K Kh^T      KK = K Kd^T         (delta rule)
    X_q = D * (Gc PQ + (HQ * W) Uh)                       the tokens' reads of the window (decayed to them)
    X_k = D * (Gc PK + (HK * W) Uh)
    U   = (I + A)^-1 (beta * (V - X_k)),  A[t, s] = beta_t E[t, s] KK[t, s]  (s < t)   (no delta rule: U = V)
    O   = X_q + (E * KQ) U                                (E * KQ lower triangular with its diagonal)

which is ``reference.py``'s token loop reassociated: token ``t``'s update reads ``S_{p-1}`` decayed by ``a_p``
(the window, then the earlier drafts), and its output reads ``S_p`` (its own record included). Every decay is
the exponential of a sum of log-decays over the positions between two points (``tl.cumsum`` of masked
log-decays), never a difference of prefix sums, so ``log_a = -inf`` gives 0, not NaN (NOTE [window weights
without differences] in ``replay.py``). A ``pre`` row's outputs use the same algebra (its records are still its
window), and its fold ``S_c <- Gc S_c + (Kh * W)^T Uh`` is one more product per chunk, stored chunk by chunk.
Per-channel decay (KDA, GLA) puts ``Gc``, ``W`` and ``D`` into the operands key channel by key channel
(``_chunk_decays``), and ``E`` into the draft-key dots as a ``[BT, BKC, BT]`` factor summed over the chunk's keys.

# NOTE [verify product precision]
The products take fp32 operands as three TF32 tensor-core passes (``tf32x3``: about fp32's accuracy, the
checkpoint's ~1e-6 relative error in the tests). ``dot="ieee"`` runs them as FMA loops instead, ``"tf32"`` the
queries' reads in one pass (inexact: ~1e-3 of the outputs; its updates stay 3xTF32, as below; a tuning point).
``"split"`` uses what bf16 / fp16 activations give: their queries and keys are exact in TF32, so a product of the
checkpoint with them takes two passes (the checkpoint as a high and a low TF32 part) and one of two of them a
single pass, at the same accuracy.
``"bf16x3"`` takes bf16 products, as the reference fork's verify does, but keeps fp32's accuracy: an fp32 operand
goes in as three bf16 parts (``_bf16_parts``: 24 bits of mantissa), bf16 activations as they are, so a read of the
checkpoint by a query costs three bf16 passes and a dot of two keys one; bf16 operands are half the registers and
shared memory of TF32 ones, which is what the fork's one-warp programs live on. ``"bf16x2"`` (two parts: ~2^-16
of each element, ~1e-5 of the outputs) and ``"bf16"`` (one pass, the fork's rounding of the checkpoint: ~4e-3, a
bf16 read copy's precision) round the reads by the queries only, which make the outputs: every product that
makes an update (a pre row's fold, the delta rule's reads by the drafts' keys and its solve, whose ``u`` the ring
keeps and a later flush folds) runs as ``"bf16x3"`` (``_UPD``), so the checkpoint stays exact whatever the
outputs' precision; the fork rounds those too. Float64 states keep the token loop. The GPU compiler wants inner
dims of 16, so ``BC`` and ``BKC`` are at least 16 (``BT`` too, unless NOTE [verify token tiles]).

# NOTE [verify product orientation]
Products are taken as ``[BV, BKC] x [BKC, BT]`` (values along rows), not ``[BT, BKC] x [BKC, BV]``: with 16 token
rows, the tensor-core layout put the 4 warps along the rows and gave each warp the whole ``[16, BV]`` product,
and the GDN verify took 255 registers and spilled 1316 bytes (sm_90 compile, T = 8, L = 24); with values along
rows the warps split them: 246 registers, no spills (``benchmarks/sm90_report.py ... --verify-form chunked``).

# NOTE [pre rows fold in the walk]
A pre row folds each chunk ``S <- Gc S + (Kh * W)^T Uh`` right after loading it, stores it and takes its reads
from the folded chunk, its window then empty (``Gc = 1``, ``Uh = 0`` afterwards), which is ``reference.py``'s
``exact`` state: one read and one write of the checkpoint per pre row, where folding in a second walk after the
reads (this template until 2026-12-06) read it twice.

# NOTE [verify token tiles]
``BT`` (drafts, padded) may be 8 (``tiling(token_tile=8)``): the GPU takes products with 8 rows or columns but not
an inner dim below 16, so the two products over the drafts (``[BV, BT] x [BT, BT]``: the delta rule's inverse and
the drafts' own contributions) then run as ``T`` rank-1 updates (``_mm_tokens``); the interpreter accepts the
small products, so only the GPU tests check this.
"""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .cursors import finalize_row, load_row, row_phase
from .replay import _any_nonfinite, _get_row, _ring, _ring1, _store_checkpoint
from .sround import SR_FORMATS
from .verify_forms import DOTS

# NOTE [bf16 products under the interpreter]
# Under TRITON_INTERPRET=1 (triton 3.6) ``tl.dot`` of bf16 operands returns garbage (16x16 products of randn off by
# ~1e10), while casts to and from bf16 are usable. bf16 products therefore run as fp32 products of the same bf16
# values there (``_dot16``): the CPU tests check the splitting and the algebra, the GPU tests the bf16 products.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _bf16_parts(a):
    """fp32 ``a`` as three bf16 parts ``hi + mid + lo`` that hold it to ~2^-24 of ``|a|`` (each part rounds the
    remainder of the ones before; the subtractions are exact in fp32)."""
    hi = a.to(tl.bfloat16)
    r = a - hi.to(tl.float32)
    mid = r.to(tl.bfloat16)
    return hi, mid, (r - mid.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _dot16(a, b, acc=None):
    """``a @ b (+ acc)`` of bf16 operands, fp32 result. The interpreter's bf16 products are garbage (NOTE [bf16
    products under the interpreter]), so there the same values go through an fp32 product."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _mm_bf16(a, b, EXACT: tl.constexpr, PARTS: tl.constexpr):
    """``a @ b`` as bf16 tensor-core products with fp32 accumulation: an operand that bf16 holds exactly (``EXACT``:
    1 for ``b``, 2 for both) goes in as it is, the other as ``PARTS`` of its bf16 parts (3: fp32's accuracy, 2:
    ~2^-16 of each element). With two split operands the products of order < ``PARTS`` are kept (six or three;
    the rest are below 2^-24 or 2^-16). Smallest terms first."""
    if EXACT == 2:
        return _dot16(a.to(tl.bfloat16), b.to(tl.bfloat16))
    a_hi, a_mid, a_lo = _bf16_parts(a)
    if EXACT == 1:
        b16 = b.to(tl.bfloat16)
        acc = _dot16(a_mid, b16, _dot16(a_lo, b16)) if PARTS == 3 else _dot16(a_mid, b16)
        return _dot16(a_hi, b16, acc)
    b_hi, b_mid, b_lo = _bf16_parts(b)
    acc = _dot16(a_mid, b_mid, _dot16(a_hi, b_lo, _dot16(a_lo, b_hi))) if PARTS == 3 else None
    return _dot16(a_hi, b_hi, _dot16(a_mid, b_hi, _dot16(a_hi, b_mid, acc)))


@triton.jit
def _mm(a, b, DOT: tl.constexpr, EXACT: tl.constexpr = 0):
    """``a @ b`` of fp32 operands (NOTE [verify product precision]); ``EXACT``: 1 if ``b``, 2 if both hold values
    that the products' input format represents exactly (TF32: bf16 / fp16 activations, bf16: bf16 ones), which
    ``DOT="split"``, ``"bf16x3"`` and ``"bf16x2"`` use to take fewer passes."""
    if DOT == "bf16x3":
        return _mm_bf16(a, b, EXACT, 3)
    elif DOT == "bf16x2":
        return _mm_bf16(a, b, EXACT, 2)
    elif DOT == "bf16":  # one inexact pass (the reference fork's arithmetic): a tuning point only
        return _dot16(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif DOT == "split":
        if EXACT == 2:
            return tl.dot(a, b, input_precision="tf32")
        elif EXACT == 1:  # a = hi + lo, each exact in TF32 to ~2^-22 of a; b needs no split
            hi = (a.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
            return tl.dot(hi, b, input_precision="tf32") + tl.dot(a - hi, b, input_precision="tf32")
        else:
            return tl.dot(a, b, input_precision="tf32x3")
    else:
        return tl.dot(a, b, input_precision=DOT)


@triton.jit
def _mm_tokens(a, b, tt, T: tl.constexpr, DOT: tl.constexpr):
    """``a [R, BT] @ b [BT, BT]`` over the draft tokens: a product when ``BT >= 16`` (the GPU's least inner dim),
    else ``T`` rank-1 updates in fp32 (NOTE [verify token tiles])."""
    if tt.shape[0] >= 16:
        return _mm(a, b, DOT)
    acc = tl.zeros([a.shape[0], b.shape[1]], tl.float32)
    for s in tl.static_range(T):
        acc += tl.sum(tl.where((tt == s)[None, :], a, 0.0), 1)[:, None] * _get_row(b, tt, s)[None, :]
    return acc


@triton.jit
def _reads(S, Qr, Kr, PQ, PK, DOT: tl.constexpr, UPD: tl.constexpr, EXACT: tl.constexpr, DELTA: tl.constexpr):
    """``PQ + S Qr`` and (delta rule) ``PK + S Kr``: a chunk's reads by the drafts' queries and keys."""
    PQ += _mm(S, Qr, DOT, EXACT)
    if DELTA:
        PK += _mm(S, Kr, UPD, EXACT)
    return PQ, PK


@triton.jit
def _cols(ptr, cols, n, stride, rows, row_mask, CD: tl.constexpr):
    """``[R, C]`` records ``ptr + c * stride + r`` for columns ``c < n`` (0 elsewhere): ``replay._ring`` transposed."""
    m = row_mask[:, None] & (cols < n)[None, :]
    return tl.load(ptr + cols[None, :] * stride + rows[:, None], mask=m, other=0.0).to(CD)


@triton.jit
def _decays(rla, xla, c, j, tt, bad, T: tl.constexpr, LS: tl.constexpr, DECAY: tl.constexpr, CD: tl.constexpr):
    """``(Gc, W [BC], D [BT], E [BT, BT], bad)`` of NOTE [chunked verify algebra], ``E`` transposed (``E[s, t]``:
    from token ``s`` to ``t``); all ones without decay or under per-channel decay (inside the products there)."""
    if DECAY == 1:
        Gc = tl.exp(tl.sum(_ring1(rla, LS, j, c, CD), 0))
        W = tl.exp(tl.cumsum(_ring1(rla, LS, j + 1, c, CD), 0, reverse=True))  # sum over j < r < c
        la_d = _ring1(xla, LS, tt, T, CD)
        bad = bad | _any_nonfinite(la_d)
        D = tl.exp(tl.cumsum(la_d, 0))
        later = tt[None, :] > tt[:, None]  # [s, r]: r > s
        E = tl.exp(tl.cumsum(tl.where(later, la_d[None, :], 0.0), 1))  # [s, t]: sum over s < r <= t
    else:
        Gc = tl.full([], 1.0, CD)
        W = tl.full(j.shape, 1.0, CD)
        D = tl.full(tt.shape, 1.0, CD)
        E = tl.full([tt.shape[0], tt.shape[0]], 1.0, CD)
    return Gc, W, D, E, bad


@triton.jit
def _chunk_decays(rla, xla, c, j, tt, kk, mk, bad, T: tl.constexpr, LS: tl.constexpr, CD: tl.constexpr):
    """Per-channel decay over one key chunk: ``(Gc [BKC], W [BC, BKC], D [BKC, BT], E [BT, BKC, BT], bad)``, the
    factors of NOTE [chunked verify algebra] per key channel (``E[s, k, t]``: from token ``s`` to ``t``)."""
    Gc = tl.exp(tl.sum(_ring(rla, LS, j, c, kk, mk, CD), 0))
    W = tl.exp(tl.cumsum(_ring(rla, LS, j + 1, c, kk, mk, CD), 0, reverse=True))  # sum over j < r < c
    la_d = _cols(xla, tt, T, LS, kk, mk, CD)  # [BKC, BT]
    bad = bad | _any_nonfinite(la_d)
    D = tl.exp(tl.cumsum(la_d, 1))
    later = tt[None, None, :] > tt[:, None, None]  # [s, ., r]: r > s
    E = tl.exp(tl.cumsum(tl.where(later, la_d[None, :, :], 0.0), 2))  # sum over s < r <= t
    return Gc, W, D, E, bad


@triton.jit
def _unit_lower_inverse(A, tt, T: tl.constexpr):
    """``(I + A)^-1`` for strictly lower-triangular ``A [BT, BT]``, by forward substitution over its ``T`` rows."""
    eye = (tt[:, None] == tt[None, :]).to(A.dtype)
    X = eye
    for i in tl.static_range(1, T):
        a_i = tl.sum(tl.where((tt == i)[:, None], A, 0.0), 0)  # row i of A
        row = tl.sum(a_i[:, None] * X, 0)  # sum_s A[i, s] X[s, :]
        X = tl.where((tt == i)[:, None], X - row[None, :], X)
    return X


@triton.jit
def verify_kernel(
    state, q, k, v, log_a, beta, out, slots,
    ring_k, ring_u, ring_la,
    count, flushes, nonfinite, tickets, seed,
    stride_sn, stride_sh, stride_sk, stride_sv,
    T: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, DELTA: tl.constexpr, HAS_SLOTS: tl.constexpr,
    LAYOUT_KV: tl.constexpr, SR: tl.constexpr, SR_MANT: tl.constexpr, SR_EMIN: tl.constexpr, CD: tl.constexpr,
    DOT: tl.constexpr, UPD: tl.constexpr, EXACT_QK: tl.constexpr,
    BHV: tl.constexpr, BHK: tl.constexpr, STAGES: tl.constexpr,
):
    """Row ``b``, value head ``h``, value tile ``vt`` of a verify of ``T`` tokens (no commit).

    Inputs (contiguous): ``q, k [B, T, HK, K]``, ``v [B, T, HV, V]``, ``log_a [B, T, HV(, K)]``, ``beta [B, T, HV]``;
    output ``out [B, T, HV, V]``. Ring (contiguous): ``k [N, L, HK, K]``, ``u [N, L, HV, V]``, ``log_a [N, L, HV(, K)]``.
    The checkpoint is addressed through its strides (``stride_sk / stride_sv`` step along keys / values).
    """
    NVT: tl.constexpr = (V + BV - 1) // BV
    HK: tl.constexpr = HV // GROUP
    KS: tl.constexpr = HK * K
    US: tl.constexpr = HV * V
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(0) // NVT
    vt = tl.program_id(0) % NVT
    hk = h // GROUP
    slot, live, c = load_row(slots, count, b, L, HAS_SLOTS)
    pre, post, count0 = row_phase(c, live, T, L, False, False, False)

    tt = tl.arange(0, BT)
    j = tl.arange(0, BC)
    offs_v = vt * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    toks = tt < T
    xq = q + b * T * KS + hk * K
    xk = k + b * T * KS + hk * K
    LS: tl.constexpr = HV * K if DECAY == 2 else HV
    LW: tl.constexpr = K if DECAY == 2 else 1
    rla = ring_la + slot * L * LS + h * LW
    xla = log_a + b * T * LS + h * LW
    rk = ring_k + slot * L * KS + hk * K
    ru = ring_u + slot * L * US + h * V
    s_head = state + slot * stride_sn + h * stride_sh
    bad = live & (c < 0)

    # One walk over key chunks: every read of the checkpoint, the window's keys and the drafts' keys. Products
    # put values (or window positions) along their rows, tokens along columns: 16 token rows would leave every
    # warp a copy of the whole product (NOTE [verify product orientation]). A pre row folds each chunk first and
    # reads the folded chunk, its window then empty (NOTE [pre rows fold in the walk]).
    Gc, W, D, E, bad = _decays(rla, xla, c, j, tt, bad, T, LS, DECAY, CD)
    Uh = _cols(ru, j, c, US, offs_v, mask_v, CD)  # [BV, BC] the window's updates
    PQ = tl.zeros([BV, BT], CD)  # PQ[v, t] = (S_c^T q_t)[v]
    PK = PQ
    HQ = tl.zeros([BC, BT], CD)  # HQ[j, t] = k_j . q_t (window keys)
    HK_ = HQ
    KQ = tl.zeros([BT, BT], CD)  # KQ[s, t] = k_s . q_t (draft keys)
    KK = KQ
    for kc in tl.range(0, BK // BKC, num_stages=STAGES):
        kk = kc * BKC + tl.arange(0, BKC)
        mk = kk < K
        S = tl.load(s_head + offs_v[:, None] * stride_sv + kk[None, :] * stride_sk,
                    mask=mask_v[:, None] & mk[None, :], other=0.0).to(CD)
        Qt = _cols(xq, tt, T, KS, kk, mk, CD)  # [BKC, BT]
        Kt = _cols(xk, tt, T, KS, kk, mk, CD)
        Kh = _ring(rk, KS, j, c, kk, mk, CD)  # [BC, BKC]
        bad = bad | _any_nonfinite(Qt) | _any_nonfinite(Kt)
        if DECAY == 2:  # the decays enter the operands, key channel by key channel
            Gk, Wh, Dt, E3, bad = _chunk_decays(rla, xla, c, j, tt, kk, mk, bad, T, LS, CD)
            Kh = Kh * Wh
            KQ += tl.sum(tl.trans(Kt)[:, :, None] * Qt[None, :, :] * E3, 1)
            if DELTA:
                KK += tl.sum(tl.trans(Kt)[:, :, None] * Kt[None, :, :] * E3, 1)
            Qr = Qt * Dt  # the drafts' decays; the window's, Gk, joins the checkpoint's reads on unfolded chunks
            Kr = Kt * Dt
        else:
            KQ += _mm(tl.trans(Kt), Qt, DOT, 2 * EXACT_QK)
            if DELTA:
                KK += _mm(tl.trans(Kt), Kt, UPD, 2 * EXACT_QK)
            Qr = Qt
            Kr = Kt
        # Both branches take their reads: S changed inside an `if` and read after it crashed triton 3.6's
        # layout pass with bf16x3 products ("operand does not dominate this use").
        if pre:  # S_c <- Gc S_c + (Kh * W)^T Uh, stored, then read
            if DECAY == 2:
                S = S * Gk[None, :] + _mm(Uh, Kh, UPD)
            else:
                S = Gc * S + _mm(Uh, Kh * W[:, None], UPD)
            s_chunk = s_head + kk[:, None] * stride_sk + offs_v[None, :] * stride_sv  # [BKC, BV], as replay's tiles
            _store_checkpoint(tl.trans(S), state, s_chunk, mk[:, None] & mask_v[None, :], state, state, state,
                              flushes, seed, slot, slot * HV + h, h, kk, offs_v, K, V, BKC, BV, 0, False, LAYOUT_KV,
                              SR, SR_MANT, SR_EMIN, CD)
            PQ, PK = _reads(S, Qr, Kr, PQ, PK, DOT, UPD, EXACT_QK * (DECAY < 2), DELTA)
        elif DECAY == 2:
            PQ, PK = _reads(S, Qr * Gk[:, None], Kr * Gk[:, None], PQ, PK, DOT, UPD, 0, DELTA)
        else:
            PQ, PK = _reads(S, Qr, Kr, PQ, PK, DOT, UPD, EXACT_QK, DELTA)
        HQ += _mm(Kh, Qr, DOT, EXACT_QK * (DECAY < 2))
        if DELTA:
            HK_ += _mm(Kh, Kr, UPD, EXACT_QK * (DECAY < 2))

    Gc = tl.where(pre, 1.0, Gc)
    Uh = tl.where(pre, 0.0, Uh)  # a pre row's window is folded: empty
    XQ = D[None, :] * (Gc * PQ + _mm(Uh, HQ * W[:, None], DOT))
    U = _cols(v + b * T * US + h * V, tt, T, US, offs_v, mask_v, CD)  # [BV, BT] the drafts' v
    bad = bad | _any_nonfinite(U)
    before = tt[:, None] < tt[None, :]  # [s, t]: s < t
    if DELTA:
        beta_d = _ring1(beta + b * T * HV + h, HV, tt, T, CD)
        bad = bad | _any_nonfinite(beta_d)
        XK = D[None, :] * (Gc * PK + _mm(Uh, HK_ * W[:, None], UPD))
        A = tl.trans(tl.where(before, beta_d[None, :] * E * KK, 0.0))  # A[t, s], s < t
        U = _mm_tokens(beta_d[None, :] * (U - XK), tl.trans(_unit_lower_inverse(A, tt, T)), tt, T, UPD)
    O = XQ + _mm_tokens(U, tl.where(before | (tt[:, None] == tt[None, :]), E * KQ, 0.0), tt, T, DOT)
    tl.store(out + ((b * T + tt[None, :]) * HV + h) * V + offs_v[:, None], tl.where(live, O, 0.0),
             mask=mask_v[:, None] & toks[None, :])

    tl.debug_barrier()  # every thread has read the window's updates before the drafts' overwrite a pre row's
    pos = count0 + tt
    tl.store(ru + pos[None, :] * US + offs_v[:, None], U, mask=mask_v[:, None] & (toks & live)[None, :])
    tl.store(nonfinite + slot, tl.full([], 1, tl.uint8), mask=bad & live)
    if live:
        # NOTE [the last program moves the cursors]
        tl.debug_barrier()
        ticket = tl.atomic_add(tickets + slot, 1, sem="acq_rel")
        if ticket == tl.num_programs(0) - 1:
            finalize_row(k, log_a, beta, ring_k, ring_la, ring_la, count, flushes, b, slot, live, pre, post,
                         count0, T, L, HV, HK, K, BHV, BHK, BK, DECAY, False, False)
            tl.store(tickets + slot, 0)


# ------------------------------------------------------------------------------------------ launcher
# NOTE [prefetched operands read in place]
# Triton 3.6's software pipelining of the chunk walk prefetches the next chunk's loads into a one-slot shared buffer
# (``cp.async``) before the loop body's products have run. A product that reads that buffer in place, rather than
# from registers, may see the next chunk: bf16 activations need no conversion for bf16 products, so at 4 warps
# (Hopper's warpgroup MMA, its B operand from shared memory) the drafts' queries and keys went straight from the
# buffer into the reads of the checkpoint, issued after the next copy. On an H100 those tilings gave wrong outputs
# (relative error 0.7-1.1; 2026-12-06, GPU tests of bf16x3 at 16-token tiles), and their sm_90 compile shows 6-12 such
# reads where every tiling that passed shows none (``benchmarks/sm90_report.py``: "racy prefetch reads"). bf16
# products at 4 or more warps therefore walk in 1 stage (no prefetch), and so passed the same GPU tests (H100, later
# on 2026-12-06); at 1-2 warps the products load their operands into registers first.
# ``tests/test_sm90_compile.py`` compiles the tilings that ship and checks.
# NOTE [verify warps]
# On an H100 (triton 3.6, 2026-12-06) 8 warps on value tiles of 64 with chunks of 32 keys made an illegal memory
# access in a GDN verify of 8 tokens (batch 5, L = 13, fp32 and CUDA_LAUNCH_BLOCKING=1; exact at 4 warps, and at
# 8 warps on tiles of 128 or with chunks of 16 keys): a miscompile or an unexplained bug of this template, not
# found on the CPU. Until it is understood, more than 4 warps are refused below tiles of 128. Its sm_90 compile (fp32
# activations, batch 5, L = 13) is the only one of the three that spills (255 registers, 48 bytes; chunks of 16:
# 208, none; tiles of 128: 255, none), and none reads a prefetch buffer in place (NOTE [prefetched operands read in
# place]): not that race.
# activations whose every value the products' input format holds exactly (TF32 for "split", bf16 for the bf16 forms)
_EXACT_IN = {"split": (torch.bfloat16, torch.float16),
             **dict.fromkeys(("bf16x3", "bf16x2", "bf16"), (torch.bfloat16,))}
# the products that make updates (the pre rows' fold, the delta rule's key reads and solve) keep fp32's accuracy
# whatever the queries' reads take (NOTE [verify product precision])
_UPD = {"tf32": "tf32x3", "bf16": "bf16x3", "bf16x2": "bf16x3"}


# NOTE [default verify]
# A call takes this template by default where this table lists a tiling for its (decay, delta rule, activations'
# dtype), with an fp32 compute dtype without a read copy (a 16-bit checkpoint too) and from ``_FEWEST_TOKENS`` (2
# unless listed) to 8 drafts (padded to 8); every other verify takes the replay template's token loop. bf16 queries
# and keys enter the bf16 products as they are; fp32 ones (what the transformers integration hands the ops) as parts
# too, so they are listed apart. Entries are tilings that passed the GPU tests (``_VERIFY_TILINGS`` and
# ``_FP32_ACTIVATION_TILINGS`` in tests/test_kernels.py, which a CPU test checks) and beat the token loop at T = 8
# (H100, batch 256, L = 16 + T; us, x one standard step, token loop vs tiling at T = 8 / 4; BENCHMARKS.md):
#   Mamba-2, bf16 (2026-12-06, default_verify.sh): token loop 1591 (2.21x) / 851; bf16x2 885 (1.23x) / 726,
#     bf16x3 950 (1.32x) / 788
#   GDN, bf16 (same run): token loop 3065 (4.18x) / 1381; bf16x3 997 (1.36x) / 875, bf16x2 1020 / 847
#   fp32 activations, bf16x3 (2026-12-06): Mamba-2 1545 / 862 -> 990 / 813, GDN 2643 / 1310 -> 1085 / 1012 (their
#     GPU tests passed on 2026-12-07, verify_next.sh)
#   KDA, bf16 (2026-12-07, verify_next.sh): token loop 1776 (4.61x) / 868; bf16x3 1184 (3.08x) / 1010, bf16x2 1248
#     / 1023: the token loop stays faster at T = 4, hence 8 drafts the fewest (5-7 not timed). One program a head
#     (2026-12-08, ``PARTS=kda``): 2 warps on value tiles of 128, bf16x3, **1037.5 (2.72x)** / 891.9 against 1 warp on
#     tiles of 64 1167.9 / 862.8 (token loop at T = 4); 4 warps 1846.8, 2 warps on tiles of 64 1517.3. Per-channel
#     decay factors ([BT, BKC, BT] a key chunk) no longer repeat in each value tile's program; Nsight Compute on the
#     1-warp form: 12.5% occupancy (registers, shared memory), one instruction issued every 2.6 cycles a scheduler
#   Mamba-2, bf16, windows of up to 16 (``_WIDE_KEY_CHUNK``, 2026-12-07 second run, H100): chunks of 32 keys.
# bf16x2 rounds only the outputs' reads (~1e-5 of them, far under the bf16 activations' own 4e-3; the checkpoint
# and ring stay exact, NOTE [verify product precision]); GDN takes bf16x3, fastest at T = 8 and exact, and so do
# fp32 activations (bf16x2 not timed there). Not listed: no decay (not timed), KDA on fp32 activations (not tested
# on a GPU), T > 8 (16-token tiles at 1 warp: not timed).
# ``ReplayState(verify_form=...)`` overrides the table per state (``templates/verify_forms.py``).
_ONE_WARP = dict(key_chunk=16, num_warps=1)
_DEFAULT_TILING: dict = {  # (decay, delta rule, activations' dtype) -> tiling keywords
    ("scalar", False, torch.bfloat16): dict(_ONE_WARP, dot="bf16x2"),
    ("scalar", True, torch.bfloat16): dict(_ONE_WARP, dot="bf16x3"),
    ("scalar", False, torch.float32): dict(_ONE_WARP, dot="bf16x3"),
    ("scalar", True, torch.float32): dict(_ONE_WARP, dot="bf16x3"),
    ("channel", True, torch.bfloat16): dict(key_chunk=16, num_warps=2, block_v=128, dot="bf16x3"),
}
_FEWEST_TOKENS: dict = {("channel", True, torch.bfloat16): 8}  # entries whose token loop wins below this many drafts

# NOTE [key-contiguous chunks]
# On key-contiguous (``vk``) checkpoints, Mamba-2's layout, a chunk of 16 keys is a 64-byte half of each value row's
# 128-byte line, loaded and (by rows that fold first, ``pre``) stored half a line at a time. With windows of up to 16
# (``BC`` = 16) chunks of 32 keys, whole lines, are much faster there; with longer windows (``BC`` = 32) they are
# slower (more registers). H100, batch 256, bf16x2 at 1 warp, kc16 -> kc32 (us; L = w + T; 2026-12-07 second run):
# T = 8: L = 8 (every row folds first) 1706 -> 976, L = 16 1015 -> 858, L = 24 884 -> 1254; T = 4: L = 4 1518 ->
# 893, L = 12 899 -> 688, L = 20 727 -> 1032. The layout, not the family, is the cause: at L = 8 a ``kv`` Mamba-2
# took 882 us at kc16 and a ``vk`` GDN 1367 against its ``kv`` 998. Only the measured entry takes the wider chunk.
_WIDE_KEY_CHUNK: dict = {("scalar", False, torch.bfloat16): 32}  # vk states with windows up to 16: keys per chunk


class VerifyTiling(NamedTuple):
    """Block sizes of a chunked verify launch (grid ``(Hv * value tiles, rows)``)."""

    BT: int   # draft tokens, padded (NOTE [verify token tiles])
    BC: int   # window positions, padded (>= 16)
    BK: int   # keys, padded to whole chunks
    BKC: int  # keys per chunk
    BV: int   # value columns per program
    num_warps: int
    stages: int  # software-pipelining stages of the chunk walk
    dot: str  # input precision of the fp32 products (NOTE [verify product precision])
    max_registers: Optional[int]  # ptxas register cap (None: the compiler's choice)


def supports(spec, T: int, compute_dtype: torch.dtype, *, commit: bool, force_flush: bool,
             materialize: bool) -> bool:
    """Whether this template can run a call: a verify (``T >= 2``, no commit) on an fp32 compute dtype without a
    read copy (read copies and float64 keep the replay template's token loop)."""
    return (T >= 2 and not (commit or force_flush or materialize) and spec.read_format is None
            and compute_dtype == torch.float32)


def default_tiling(spec, T: int, compute_dtype: torch.dtype, activations: Optional[torch.dtype], *, commit: bool,
                   force_flush: bool) -> Optional[dict]:
    """The chunked verify's tiling where it is the default verify of a call, else None (the replay template's token
    loop): a measured win for the family's decay kind and delta rule with these activations (queries and keys of
    one dtype) in NOTE [default verify]'s table."""
    if T > 8 or not supports(spec, T, compute_dtype, commit=commit, force_flush=force_flush, materialize=False):
        return None
    key = (spec.decay, spec.delta, activations)
    tile = _DEFAULT_TILING.get(key)
    if tile is None or T < _FEWEST_TOKENS.get(key, 2):
        return None
    if spec.layout == "vk" and spec.window <= 16 and key in _WIDE_KEY_CHUNK:  # NOTE [key-contiguous chunks]
        tile = dict(tile, key_chunk=_WIDE_KEY_CHUNK[key])
    return dict(tile, token_tile=8)


def tiling(K: int, V: int, T: int, L: int, key_chunk: Optional[int] = None, block_v: Optional[int] = None,
           num_warps: Optional[int] = None, stages: Optional[int] = None, dot: Optional[str] = None,
           max_registers: Optional[int] = None, token_tile: Optional[int] = None) -> VerifyTiling:
    """Defaults: chunks of 32 keys, value tiles of up to 64 columns, 4 warps, 2 stages (1 for bf16 products at 4 or
    more warps: NOTE [prefetched operands read in place]), 3xTF32 products, drafts padded to 16 (``token_tile=8``:
    to 8 where ``T <= 8``, NOTE [verify token tiles])."""
    BKC = max(16, min(key_chunk or 32, triton.next_power_of_2(K)))
    BK = max(triton.next_power_of_2(K), BKC)
    BV = block_v or min(triton.next_power_of_2(V), 64)
    if (num_warps or 4) > 4 and BV < 128:  # NOTE [verify warps]
        raise ValueError(f"the chunked verify runs more than 4 warps only on value tiles of 128 (got {BV})")
    if token_tile not in (None, 8, 16):
        raise ValueError(f"the chunked verify pads drafts to 8 or 16 (got token_tile={token_tile})")
    if dot not in (None, *DOTS):
        raise ValueError(f"the chunked verify's products are one of {DOTS} (got dot={dot!r})")
    one_stage = (dot or "").startswith("bf16") and (num_warps or 4) >= 4  # NOTE [prefetched operands read in place]
    if one_stage and (stages or 1) > 1:
        raise ValueError(f"bf16 products at 4 or more warps walk the key chunks in 1 stage (got stages={stages})")
    BT = max(token_tile or 16, triton.next_power_of_2(T))
    return VerifyTiling(BT, max(16, triton.next_power_of_2(L)), BK, BKC, BV, num_warps or 4,
                        stages if stages is not None else 1 if one_stage else 2, dot or "tf32x3", max_registers)


def launch(buf, spec, x, slots: Optional[torch.Tensor], out: torch.Tensor, **overrides) -> None:
    """A verify of ``T`` draft tokens per row (``x`` inputs ``[B, T, ...]``, ``out [B, T, Hv, V]`` contiguous) as
    one launch of :func:`verify_kernel`; ``overrides`` are :func:`tiling`'s keywords. ``slots [B]`` (-1 = padding)
    or None (row b is slot b)."""
    state, ring = buf.state, buf.ring
    Hv = state.shape[1]
    K, V = (state.shape[2], state.shape[3]) if spec.layout == "kv" else (state.shape[3], state.shape[2])
    B, T = x.q.shape[:2]
    if B == 0:
        return
    tile = tiling(K, V, T, spec.window, **overrides)
    dummy = ring["k"]
    sr_mant, sr_emin = SR_FORMATS.get(str(state.dtype).removeprefix("torch."), (0, 0))
    stride_sk, stride_sv = ((state.stride(2), state.stride(3)) if spec.layout == "kv"
                            else (state.stride(3), state.stride(2)))
    cap = dict(maxnreg=tile.max_registers) if tile.max_registers else {}
    verify_kernel[(Hv * triton.cdiv(V, tile.BV), B)](
        state, x.q.contiguous(), x.k.contiguous(), x.v.contiguous(),
        dummy if x.log_a is None else x.log_a.contiguous(), dummy if x.beta is None else x.beta.contiguous(),
        out, dummy if slots is None else slots, ring["k"], ring["u"], ring.get("log_a", dummy),
        buf.count, buf.flushes, buf.nonfinite.view(torch.uint8), buf.tickets, spec.seed,
        state.stride(0), state.stride(1), stride_sk, stride_sv,
        T=T, L=spec.window, BT=tile.BT, BC=tile.BC, HV=Hv, GROUP=Hv // spec.k_heads, K=K, V=V, BK=tile.BK,
        BKC=tile.BKC, BV=tile.BV, DECAY={"none": 0, "scalar": 1, "channel": 2}[spec.decay], DELTA=spec.delta,
        HAS_SLOTS=slots is not None, LAYOUT_KV=spec.layout == "kv", SR=spec.stochastic_rounding, SR_MANT=sr_mant,
        SR_EMIN=sr_emin, CD=tl.float32, DOT=tile.dot, UPD=_UPD.get(tile.dot, tile.dot),
        EXACT_QK=int({x.q.dtype, x.k.dtype} <= set(_EXACT_IN.get(tile.dot, ()))), BHV=triton.next_power_of_2(Hv),
        BHK=triton.next_power_of_2(spec.k_heads), STAGES=tile.stages, num_warps=tile.num_warps, **cap)
