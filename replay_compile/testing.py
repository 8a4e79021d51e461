"""Helpers shared by the tests, the demo and the benchmarks' correctness checks."""
from __future__ import annotations

import torch

from .families.base import Canonical, standard_step


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64; NaN or inf anywhere in ``a`` fails every tolerance."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so any element a kernel fails to write fails the check."""
    return torch.full_like(x, float("nan"))


def random_canonical(family, batch, heads, head_k, head_v, k_heads, *, tokens=None, dtype=torch.float64,
                     generator=None, layout="kv", long_memory=False):
    """Random canonical inputs ``[B, (T,) ...]`` of ``family`` (drawn natively, then mapped) and a random state."""
    native, state = family.make_inputs(batch, heads, head_k, head_v, k_heads, dtype=dtype, generator=generator,
                                       layout=layout, tokens=tokens, long_memory=long_memory)
    return family.to_canonical(**native), state


class StateLayer(torch.nn.Module):
    """Simple GLA with its state ``[B, H, K, V]`` as a buffer, written in place (CUDA-graph friendly)."""

    def __init__(self, state: torch.Tensor):
        super().__init__()
        self.register_buffer("state", state)

    def forward(self, q, k, v, g):
        self.state.mul_(torch.exp(g)[..., None, None]).add_(torch.einsum("bhk,bhv->bhkv", k, v))
        return torch.einsum("bhkv,bhk->bhv", self.state, q)


class NoisyOracleDrafter:
    """Drafts the true greedy continuation ``truth [B, n]`` with ~30% of tokens corrupted (``t -> t + 1``),
    so per-row acceptance counts vary from 0 to T; drafts past the end of ``truth`` are ``pad``.
    Called as ``drafter(seqs, T)`` with each row's tokens so far (prompt of ``prompt_len`` included)."""

    def __init__(self, truth: torch.Tensor, prompt_len: int, vocab: int, pad: int = 0, seed: int = 0):
        self.truth, self.prompt_len, self.vocab, self.pad = truth, prompt_len, vocab, pad
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, seqs, T: int) -> torch.Tensor:
        out = []
        for b, seq in enumerate(seqs):
            done = len(seq) - self.prompt_len
            good = self.truth[b, done:done + T].tolist()
            good += [self.pad] * (T - len(good))
            bad = (torch.rand(T, generator=self.gen) < 0.3).tolist()
            out.append([(t + 1) % self.vocab if x else t for t, x in zip(good, bad)])
        return torch.tensor(out)


class StandardPool:
    """The oracle: each slot decoded by the standard recurrence, with verify snapshots and commit.

    Mirrors :class:`~replay_compile.runtime.ReplayState`'s operations on canonical inputs
    (``slots=None``: row b is slot b; -1 marks padding rows, whose outputs are zero).
    """

    def __init__(self, state: torch.Tensor, family, layout: str):
        self.family, self.layout = family, layout
        self.state = state.clone()
        self._drafts = None

    def verify(self, x: Canonical, slots=None) -> torch.Tensor:
        """Outputs ``[B, T, Hv, V]`` of ``T`` tokens per row; keeps every intermediate state."""
        B, T = x.q.shape[:2]
        rows = [b for b in range(B) if slots is None or int(slots[b]) >= 0]
        ss = rows if slots is None else [int(slots[b]) for b in rows]
        states, outs = [self.state[ss]], []
        for t in range(T):
            xt = Canonical(*(None if f is None else f[rows, t] for f in x))
            o, S = standard_step(states[-1], xt, delta=self.family.delta, layout=self.layout)
            states.append(S)
            outs.append(o)
        out = torch.zeros(B, T, *outs[0].shape[1:], dtype=outs[0].dtype)
        out[rows] = torch.stack(outs, 1)
        self._drafts = (B, rows, ss, states)
        return out

    def commit(self, n_accepted) -> None:
        """Keep the state after ``n_accepted[b]`` drafts of each row of the last verify."""
        B, rows, ss, states = self._drafts
        n = torch.as_tensor(n_accepted).expand(B)
        for i, (b, s) in enumerate(zip(rows, ss)):
            self.state[s] = states[int(n[b])][i]
        self._drafts = None

    def step(self, x: Canonical, slots=None) -> torch.Tensor:
        o = self.verify(Canonical(*(None if f is None else f[:, None] for f in x)), slots)
        self.commit(1)
        return o[:, 0]

    def reset(self, slots) -> None:
        self.state[torch.as_tensor(slots)] = 0


def token(x: Canonical, t, rows=None) -> Canonical:
    """Token ``t`` of multi-token canonical inputs ``[B, T, ...]`` (rows ``rows`` only, if given)."""
    return Canonical(*(None if f is None else (f[:, t] if rows is None else f[rows, t]) for f in x))
