"""Plain-torch implementation of the replay operations (the reference the Triton kernels must match).

It works on a :class:`~replay_compile.runtime.state.ReplayState`'s buffers, for the rows of one call
whose slot is not padding. All arithmetic runs in the state's compute dtype (float64 for float64
states, float32 otherwise) on the ``[K, V]`` view of the state.

# NOTE [window algebra]
After a checkpoint ``S_c`` and records ``(log_a_j, k_j, u_j)`` at ring positions ``0..p``::

    S_p = G_p * S_c + sum_{i<=p} w_{p,i} * k_i u_i^T
    G_p = exp(sum_{j<=p} log_a_j)      w_{p,i} = exp(sum_{i<j<=p} log_a_j)

(products per key channel for channel decay). Positions after ``p`` hold neutral records
(log_a = 0, k = u = 0), so ``G_p`` is the sum over the whole window and ``w_{p,i}`` its exclusive
suffix sum: no per-row position indexing, and the suffix is a shifted cumsum, never a difference of
prefix sums, so a decay of exactly 0 (log_a = -inf) gives 0, not NaN.

Delta rule: ``u_p = beta_p * (v_p - Decay_p(S_{p-1})^T k_p)``; ``Decay_p(S_{p-1})`` is the same sum
taken before ``u_p`` is inserted (its slot still holds 0).

# NOTE [flush points]
``pre``: a call of ``T`` tokens on a row with ``count + T > L`` first folds the ``count`` committed
records into the checkpoint (only after commits, or in verify). ``post``: a committing call whose
ring becomes full (``count + T == L``) folds everything, the new records included, so ``L = 1`` is
exactly the standard recurrence. ``force_flush`` makes every row ``post`` (the standard route).
Rows that flush read the exact checkpoint; the others read the read copy when there is one.
With a read copy, delta-rule folds replay the raw records ``(log_a, k, v, beta)`` from the exact
checkpoint, so read-copy error never reaches the checkpoint.
"""
from __future__ import annotations

import torch

from ..families.base import Canonical, expand_heads, kv_view
from . import rounding


def _window_terms(ring: dict, decay: str):
    """Per-row decay sums of a window: ``G [n, Hv(, K)]`` and suffix weights ``w [n, L, Hv(, K)]``."""
    la = ring.get("log_a")
    if la is None:
        return None, None
    total = la.sum(1)
    incl_suffix = la.flip(1).cumsum(1).flip(1)
    excl_suffix = torch.cat([incl_suffix[:, 1:], torch.zeros_like(incl_suffix[:, :1])], dim=1)
    return total.exp(), excl_suffix.exp()


def _read(base, ring, G, w, x, decay):
    """``S_p^T x`` for ``x [n, Hv, K]``: ``base^T (G * x) + sum_i u_i ((w_i * k_i) . x)``."""
    k, u = ring["k"], ring["u"]
    gx = x if G is None else x * (G[..., None] if decay == "scalar" else G)
    kw = k if w is None else k * (w[..., None] if decay == "scalar" else w)
    return torch.einsum("nhkv,nhk->nhv", base, gx) + torch.einsum("nlhk,nhk,nlhv->nhv", kw, x, u)


def _fold(base, ring, decay, raw: bool):
    """Checkpoint after every record in ``ring`` (neutral records change nothing)."""
    if raw:  # the true delta recurrence, record by record, from the exact checkpoint
        S = base
        for i in range(ring["k"].shape[1]):
            if "log_a" in ring:
                a = ring["log_a"][:, i].exp()
                S = S * (a[..., None, None] if decay == "scalar" else a[..., None])
            k = ring["k"][:, i]
            u = ring["beta"][:, i, :, None] * (ring["v"][:, i] - torch.einsum("nhkv,nhk->nhv", S, k))
            S = S + k[..., None] * u[..., None, :]
        return S
    G, w = _window_terms(ring, decay)
    kw = ring["k"] if w is None else ring["k"] * (w[..., None] if decay == "scalar" else w)
    S = base if G is None else base * (G[..., None, None] if decay == "scalar" else G[..., None])
    return S + torch.einsum("nlhk,nlhv->nhkv", kw, ring["u"])


def _gather_window(rs, slots, count):
    """Ring records of ``slots`` in compute dtype, k expanded to value heads, stale positions neutral."""
    cd = rs.compute_dtype
    live = torch.arange(rs.window, device=count.device)[None, :] < count[:, None]  # [n, L]
    out = {}
    for name, buf in rs.ring.items():
        x = buf[slots].to(cd)
        if name == "k":
            x = expand_heads(x, rs.num_heads)
        m = live.view(*live.shape, *[1] * (x.dim() - 2))
        out[name] = torch.where(m, x, torch.zeros((), dtype=cd, device=x.device))
    return out


def _insert(window, pos, name, value):
    """Write ``value [n, ...]`` at ring position ``pos [n]`` of each row."""
    idx = pos.view(-1, 1, *[1] * (value.dim() - 1)).expand(-1, 1, *value.shape[1:])
    window[name] = window[name].scatter(1, idx, value[:, None])


def _store_checkpoint(rs, slots, S, flush_index):
    """Write fp32 ``S [n, Hv, K, V]`` into the user's state (with stochastic rounding if asked)."""
    phys = kv_view(S, rs.layout)
    if rs.stochastic_rounding:
        seed = rounding.slot_seed(rs.seed, slots, flush_index)
        stored = rounding.stochastic_round(phys, rs.state.dtype, seed)
    else:
        stored = phys.to(rs.state.dtype)
    rs.state[slots] = stored
    if rs.read_format is not None:
        for name, part in rs.read_format.quantize(rs.read_view(stored).float()).items():
            rs.read[name][slots] = part


def _live_rows(rs, slots, B):
    """``(rows, slots)`` of a call's non-padding rows (a host sync on GPU: this is the reference)."""
    if slots is None:
        idx = torch.arange(rs.num_slots, device=rs.state.device)
        return idx, idx
    rows = (slots >= 0).nonzero().view(-1)
    return rows, slots[rows].long()


def advance(rs, x: Canonical, slots, *, commit: bool, force_flush: bool) -> torch.Tensor:
    """Append ``T`` tokens per row (inputs ``[B, T, ...]``); outputs ``[B, T, Hv, V]``, zero on padding rows.

    See NOTE [flush points].
    """
    B, T = x.q.shape[:2]
    out = torch.zeros(B, T, rs.num_heads, rs.head_v, dtype=rs.compute_dtype, device=rs.state.device)
    rows, slots = _live_rows(rs, slots, B)
    if rows.numel():
        xs = Canonical(*(None if t is None else t[rows] for t in x))
        out[rows] = _advance_rows(rs, xs, slots, commit=commit, force_flush=force_flush)
    return out


def commit(rs, n_accepted: torch.Tensor, slots) -> None:
    """Advance each row's committed count by its accepted drafts (``n_accepted [B]``)."""
    rows, s = _live_rows(rs, slots, n_accepted.shape[0])
    rs.count[s] += n_accepted[rows].to(rs.count.dtype)


def _advance_rows(rs, x: Canonical, slots: torch.Tensor, *, commit: bool, force_flush: bool):
    cd, decay, L = rs.compute_dtype, rs.family.decay, rs.window
    T = x.q.shape[1]
    count = rs.count[slots].long()
    S = kv_view(rs.state[slots], rs.layout).to(cd)
    window = _gather_window(rs, slots, count)
    raw = rs.raw_fold

    pre = count + T > L
    folded = _fold(S, window, decay, raw)
    pre4 = pre.view(-1, 1, 1, 1)
    exact = torch.where(pre4, folded, S)
    count0 = torch.where(pre, torch.zeros_like(count), count)
    live = torch.arange(L, device=count.device)[None, :] < count0[:, None]  # pre-flushed rows: empty
    window = {n: torch.where(live.view(*live.shape, *[1] * (t.dim() - 2)), t, torch.zeros_like(t))
              for n, t in window.items()}
    post = torch.full_like(pre, force_flush) | (torch.full_like(pre, commit) & (count0 + T == L))
    if rs.read_format is not None:
        R = kv_view(rs.read_format.dequantize({n: p[slots] for n, p in rs.read.items()}, rs.head_k), "vk").to(cd)
        base = torch.where((pre | post).view(-1, 1, 1, 1), exact, R)
    else:
        base = exact

    hv = rs.num_heads
    outs = []
    for t in range(T):
        pos = count0 + t
        q = expand_heads(x.q[:, t].to(cd), hv)
        k = expand_heads(x.k[:, t].to(cd), hv)
        if x.log_a is not None:
            _insert(window, pos, "log_a", x.log_a[:, t].to(cd))
        _insert(window, pos, "k", k)
        v = x.v[:, t].to(cd)
        G, w = _window_terms(window, decay)
        if rs.family.delta:
            beta = x.beta[:, t].to(cd)
            u = beta[..., None] * (v - _read(base, window, G, w, k, decay))
            if raw:
                _insert(window, pos, "v", v)
                _insert(window, pos, "beta", beta)
        else:
            u = v
        _insert(window, pos, "u", u)
        outs.append(_read(base, window, G, w, q, decay))

    new_ckpt = torch.where(post.view(-1, 1, 1, 1), _fold(exact, window, decay, raw), exact)
    flushed = pre | post
    _write_ring(rs, slots, window)
    if flushed.any():
        fs = slots[flushed]
        _store_checkpoint(rs, fs, new_ckpt[flushed], rs.flushes[fs])
        rs.flushes[fs] += pre[flushed].long() + post[flushed].long()
    new_count = count0 + T if commit else count0
    rs.count[slots] = torch.where(post, torch.zeros_like(new_count), new_count).to(rs.count.dtype)
    rs.nonfinite[slots] |= ~_finite_rows(x)
    return torch.stack(outs, dim=1)


def _write_ring(rs, slots, window):
    for name, buf in rs.ring.items():
        val = window[name]
        if name == "k" and rs.num_k_heads != rs.num_heads:  # store one copy per key head
            val = val[:, :, :: rs.num_heads // rs.num_k_heads]
        buf[slots] = val.to(buf.dtype)


def _finite_rows(x: Canonical) -> torch.Tensor:
    ok = None
    for f in x:
        if f is not None:
            r = torch.isfinite(f).flatten(1).all(1)
            ok = r if ok is None else ok & r
    return ok


def materialize(rs, slots) -> None:
    """Fold the committed records of ``slots`` (None: all) into their checkpoints (count -> 0)."""
    _, slots = _live_rows(rs, slots, None)
    count = rs.count[slots].long()
    S = kv_view(rs.state[slots], rs.layout).to(rs.compute_dtype)
    window = _gather_window(rs, slots, count)
    has = count > 0
    if has.any():
        fs = slots[has]
        folded = _fold(S, window, rs.family.decay, rs.raw_fold)[has]
        _store_checkpoint(rs, fs, folded, rs.flushes[fs])
        rs.flushes[fs] += 1
    rs.count[slots] = 0
