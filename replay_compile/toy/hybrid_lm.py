"""A small hybrid language model in plain PyTorch: attention + Mamba-2 / Gated DeltaNet / KDA layers.

Nothing here knows about replay-compile. The recurrent layers are spelled one token at a time, the
way a reference implementation would write them, so a call on ``T`` tokens is a Python loop that
Dynamo unrolls and the ``replayssm`` backend turns into one multi-token replay op.

Decoding protocol (what a serving loop does):
* ``model.allocate(batch)`` creates the caches: per recurrent layer a state buffer, per attention layer a
  KV cache with per-row lengths.
* ``model(tokens)`` runs ``T`` new tokens per row (``tokens [B, T]``) and returns logits ``[B, T, vocab]``.
  It writes the recurrent states and the KV entries of all ``T`` tokens but does not move the lengths.
* ``model.advance(n)`` moves every row's attention length by ``n[b]`` accepted tokens. Plain decoding
  advances by ``T``; speculative decoding by the accepted count (with ``replay_compile.commit`` doing
  the same for the recurrent states).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class Mamba2Mixer(nn.Module):
    """Mamba-2 decode: ``h = exp(dt*A) h + (dt x) B^T``, ``y = h C + D x``, gated by ``silu(z)``; state ``[B, H, P, N]``."""

    def __init__(self, d_model, heads=4, head_dim=8, d_state=16, groups=2):
        super().__init__()
        self.h, self.p, self.n, self.g = heads, head_dim, d_state, groups
        self.in_proj = nn.Linear(d_model, 2 * heads * head_dim + 2 * groups * d_state + heads, bias=False)
        self.out_proj = nn.Linear(heads * head_dim, d_model, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 8.0, heads)))
        self.dt_bias = nn.Parameter(torch.linspace(-4.0, -1.0, heads))
        self.D = nn.Parameter(torch.ones(heads))

    def state_shape(self, batch):
        return (batch, self.h, self.p, self.n)

    def forward(self, u, state):
        B, T, _ = u.shape
        h, p, n, g = self.h, self.p, self.n, self.g
        x, z, Bm, Cm, dt = self.in_proj(u).split([h * p, h * p, g * n, g * n, h], dim=-1)
        x, z = x.view(B, T, h, p), z.view(B, T, h, p)
        Bm = Bm.view(B, T, g, n).repeat_interleave(h // g, dim=2)
        Cm = Cm.view(B, T, g, n).repeat_interleave(h // g, dim=2)
        dt = F.softplus(dt + self.dt_bias)
        A = -torch.exp(self.A_log)
        ys = []
        for t in range(T):
            dA = torch.exp(dt[:, t] * A)[:, :, None, None]
            dBx = (dt[:, t, :, None] * x[:, t])[..., None] * Bm[:, t, :, None, :]
            state.copy_(state * dA + dBx)
            y = torch.matmul(state, Cm[:, t, :, :, None]).squeeze(-1)
            ys.append((y + self.D[:, None] * x[:, t]) * F.silu(z[:, t]))
        return self.out_proj(torch.stack(ys, 1).reshape(B, T, h * p))


class GatedDeltaMixer(nn.Module):
    """Gated DeltaNet (``per_channel=False``) or KDA (``True``) decode; state ``[B, Hv, K, V]``."""

    def __init__(self, d_model, qk_heads=2, v_heads=4, head_k=8, head_v=8, per_channel=False):
        super().__init__()
        self.hk, self.hv, self.dk, self.dv, self.per_channel = qk_heads, v_heads, head_k, head_v, per_channel
        gate = v_heads * head_k if per_channel else v_heads
        self.in_proj = nn.Linear(d_model, 2 * qk_heads * head_k + v_heads * head_v + gate + v_heads, bias=False)
        self.out_proj = nn.Linear(v_heads * head_v, d_model, bias=False)
        self.gate_bias = nn.Parameter(torch.full((gate,), -3.0))

    def state_shape(self, batch):
        return (batch, self.hv, self.dk, self.dv)

    def forward(self, u, state):
        B, T, _ = u.shape
        hk, hv, dk, dv = self.hk, self.hv, self.dk, self.dv
        gate = hv * dk if self.per_channel else hv
        q, k, v, g, beta = self.in_proj(u).split([hk * dk, hk * dk, hv * dv, gate, hv], dim=-1)
        q = l2norm(q.view(B, T, hk, dk)).repeat_interleave(hv // hk, dim=2) * dk ** -0.5
        k = l2norm(k.view(B, T, hk, dk)).repeat_interleave(hv // hk, dim=2)
        v, beta = v.view(B, T, hv, dv), torch.sigmoid(beta)
        g = -F.softplus(g + self.gate_bias)  # log-decay <= 0
        g = g.view(B, T, hv, dk) if self.per_channel else g
        ys = []
        for t in range(T):
            decay = g[:, t].exp()
            state.mul_(decay[..., None] if self.per_channel else decay[..., None, None])
            kv_mem = (state * k[:, t, :, :, None]).sum(-2)
            delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
            state.add_(k[:, t, :, :, None] * delta[:, :, None, :])
            ys.append((state * q[:, t, :, :, None]).sum(-2))
        return self.out_proj(torch.stack(ys, 1).reshape(B, T, hv * dv))


class Attention(nn.Module):
    """Causal attention over a fixed-size KV cache with per-row lengths (a pointer, moved by ``advance``)."""

    def __init__(self, d_model, heads=2):
        super().__init__()
        self.h, self.d = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, u, k_cache, v_cache, lengths):
        B, T, _ = u.shape
        q, k, v = self.qkv(u).view(B, T, 3, self.h, self.d).unbind(2)
        pos = lengths[:, None] + torch.arange(T, device=u.device)  # [B, T] absolute positions
        rows = torch.arange(B, device=u.device)[:, None].expand(B, T)
        k_cache.index_put_((rows, pos), k)
        v_cache.index_put_((rows, pos), v)
        keys = torch.arange(k_cache.shape[1], device=u.device)
        mask = keys[None, None, :] <= pos[:, :, None]  # [B, T, maxlen]
        s = torch.einsum("bthd,bshd->bhts", q, k_cache) / math.sqrt(self.d)
        s = s.masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v_cache)
        return self.out(o.reshape(B, T, -1))


class HybridLM(nn.Module):
    """``layers``: a string of ``a`` (attention), ``m`` (Mamba-2), ``g`` (Gated DeltaNet), ``k`` (KDA)."""

    def __init__(self, vocab=97, d_model=32, layers="mgak", max_len=256):
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(vocab, d_model)
        make = {"a": lambda: Attention(d_model), "m": lambda: Mamba2Mixer(d_model),
                "g": lambda: GatedDeltaMixer(d_model), "k": lambda: GatedDeltaMixer(d_model, per_channel=True)}
        self.kinds = layers
        self.mixers = nn.ModuleList(make[c]() for c in layers)
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in layers)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def allocate(self, batch: int):
        """(Re)create every cache for ``batch`` rows: zero states, empty KV caches."""
        p = next(self.parameters())
        for i, (kind, mixer) in enumerate(zip(self.kinds, self.mixers)):
            if kind == "a":
                shape = (batch, self.max_len, mixer.h, mixer.d)
                self.register_buffer(f"k_cache{i}", torch.zeros(shape, dtype=p.dtype, device=p.device))
                self.register_buffer(f"v_cache{i}", torch.zeros(shape, dtype=p.dtype, device=p.device))
            else:
                self.register_buffer(f"state{i}", torch.zeros(mixer.state_shape(batch), dtype=p.dtype, device=p.device))
        self.register_buffer("lengths", torch.zeros(batch, dtype=torch.long, device=p.device))

    def forward(self, tokens):
        h = self.embed(tokens)
        for i, (kind, mixer, norm) in enumerate(zip(self.kinds, self.mixers, self.norms)):
            if kind == "a":
                h = h + mixer(norm(h), getattr(self, f"k_cache{i}"), getattr(self, f"v_cache{i}"), self.lengths)
            else:
                h = h + mixer(norm(h), getattr(self, f"state{i}"))
        return self.head(h)

    @torch.no_grad()
    def advance(self, n):
        """Move the attention caches' lengths by ``n`` (an int or ``[B]`` accepted counts)."""
        self.lengths += torch.as_tensor(n, device=self.lengths.device)


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting: find the latest earlier occurrence of the last n tokens, propose what followed."""

    def __init__(self, ngram=2):
        self.ngram = ngram

    def __call__(self, seqs: list[list[int]], T: int) -> torch.Tensor:
        drafts = []
        for seq in seqs:
            tail, proposal = seq[-self.ngram:], []
            for start in range(len(seq) - self.ngram - 1, -1, -1):
                if seq[start:start + self.ngram] == tail:
                    proposal = seq[start + self.ngram:start + self.ngram + T]
                    break
            drafts.append((proposal + [seq[-1]] * T)[:T])
        return torch.tensor(drafts)


class DraftModelDrafter:
    """A small stateless draft model: one attention block over the last ``context`` tokens, greedy."""

    def __init__(self, target: HybridLM, context=16, seed=1):
        torch.manual_seed(seed)
        d = target.embed.embedding_dim
        self.embed, self.head, self.context = target.embed, target.head, context  # shares the target's vocab maps
        self.block = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True).to(target.head.weight)

    @torch.no_grad()
    def __call__(self, seqs: list[list[int]], T: int) -> torch.Tensor:
        ctx = torch.tensor([s[-self.context:] for s in seqs], device=self.head.weight.device)
        out = []
        for _ in range(T):
            mask = nn.Transformer.generate_square_subsequent_mask(ctx.shape[1], device=ctx.device)
            nxt = self.head(self.block(self.embed(ctx), src_mask=mask, is_causal=True)[:, -1]).argmax(-1)
            out.append(nxt)
            ctx = torch.cat([ctx[:, 1:], nxt[:, None]], 1)
        return torch.stack(out, 1).cpu()
