"""Speculative decoding of a plain-PyTorch hybrid LM compiled with ``replayssm`` in speculative mode.

Each step drafts ``T`` tokens per row (prompt lookup or a small draft model), verifies them with one
call of the target on ``T + 1`` tokens, and keeps each row's accepted prefix: the attention caches
move their lengths, and ``replay_compile.commit`` moves the recurrent states' ring pointers. No state
is copied or snapshotted. Greedy speculative output is token-identical to greedy decoding (CPU,
float32/float64) and logit-close on the GPU, where TF32 tensor-core dots may flip near-tied argmaxes:
there the check compares the kept tokens' logits with greedy decoding's up to each row's first
differing token (both were computed on the same context).

    python examples/speculative_decoding.py --drafter ngram --draft 4 --tokens 48
    python examples/speculative_decoding.py --device cuda --dtype float32 --tokens 64
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import replay_compile
from replay_compile.toy import DraftModelDrafter, HybridLM, PromptLookupDrafter


@torch.no_grad()
def greedy(model: HybridLM, prompts: torch.Tensor, new_tokens: int, step=None):
    """Plain greedy decoding, one token per call; returns (tokens [B, new_tokens], logits [B, new_tokens, V])."""
    step = step or model
    model.allocate(prompts.shape[0])
    model(prompts[:, :-1])
    model.advance(prompts.shape[1] - 1)
    last, toks, logits = prompts[:, -1], [], []
    for _ in range(new_tokens):
        lg = step(last[:, None])[:, -1]
        model.advance(1)
        last = lg.argmax(-1)
        toks.append(last)
        logits.append(lg)
    return torch.stack(toks, 1), torch.stack(logits, 1)


@torch.no_grad()
def speculative(model: HybridLM, verify, prompts: torch.Tensor, new_tokens: int, drafter, T: int):
    """Greedy speculative decoding with ``verify`` (the compiled target).

    Returns ``(tokens [B, new_tokens], logits [B, new_tokens, V] of the kept tokens, stats)``.
    """
    B = prompts.shape[0]
    model.allocate(B)
    model(prompts[:, :-1])  # eager prefill writes the exact states before the first compiled call
    model.advance(prompts.shape[1] - 1)
    seqs = [row.tolist() for row in prompts]
    out, kept_logits = [[] for _ in range(B)], [[] for _ in range(B)]
    last = prompts[:, -1]
    steps = accepted = 0
    while min(len(o) for o in out) < new_tokens:
        drafts = drafter(seqs, T).to(prompts.device)  # [B, T]
        logits = verify(torch.cat([last[:, None], drafts], 1))  # [B, T + 1, V]
        pred = logits.argmax(-1)
        match = (pred[:, :T] == drafts).long().cumprod(1).sum(1)  # drafts accepted per row
        n = match + 1  # the last token plus the accepted drafts enter the caches
        replay_compile.commit(model, n)
        model.advance(n)
        for b in range(B):
            new = drafts[b, :match[b]].tolist() + [int(pred[b, match[b]])]
            out[b] += new
            kept_logits[b].append(logits[b, :len(new)].clone())
            seqs[b] += new
        last = pred[torch.arange(B), match]
        steps += 1
        accepted += int(match.sum())
    toks = torch.tensor([o[:new_tokens] for o in out])
    logits = torch.stack([torch.cat(lg)[:new_tokens] for lg in kept_logits]).cpu()
    return toks, logits, dict(steps=steps, drafted=steps * T * B, accepted=accepted,
                      tokens_per_step=sum(len(o) for o in out) / (steps * B))


def logit_gap(spec_tokens, spec_logits, ref_tokens, ref_logits) -> tuple[float, int]:
    """Largest logit difference relative to the logits' scale, over each row's tokens up to and including its
    first differing token (same context on both sides); and the number of rows whose tokens differ."""
    gaps, differ = [], 0
    for b in range(ref_tokens.shape[0]):
        diff = (spec_tokens[b] != ref_tokens[b]).nonzero()
        end = int(diff[0]) + 1 if diff.numel() else ref_tokens.shape[1]
        differ += bool(diff.numel())
        gaps.append((spec_logits[b, :end] - ref_logits[b, :end]).abs().max() / ref_logits[b, :end].abs().max())
    return float(max(gaps)), differ


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", choices=["ngram", "model"], default="ngram")
    p.add_argument("--draft", type=int, default=4, help="draft tokens T per step")
    p.add_argument("--tokens", type=int, default=48, help="new tokens per row")
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--window", type=int, default=16, help="replay window L (>= T + 1)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logit-tol", type=float, default=1e-3, help="relative logit tolerance (GPU check)")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    model = HybridLM(max_len=32 + args.tokens + args.draft + 2).to(args.device, dtype).eval()
    # a repetitive prompt gives prompt lookup something to find
    base = torch.randint(0, 97, (args.batch, 8))
    prompts = torch.cat([base, base, base[:, :4]], 1).to(args.device)
    drafter = PromptLookupDrafter() if args.drafter == "ngram" else DraftModelDrafter(model)

    t0 = time.perf_counter()
    ref, ref_logits = greedy(model, prompts, args.tokens)
    t_greedy = time.perf_counter() - t0
    verify = torch.compile(model, backend="replayssm",
                           options={"speculative": True, "window": args.window})
    t0 = time.perf_counter()
    spec, spec_logits, stats = speculative(model, verify, prompts, args.tokens, drafter, args.draft)
    t_spec = time.perf_counter() - t0
    same = torch.equal(spec, ref.cpu())
    gap, differ = logit_gap(spec, spec_logits, ref.cpu(), ref_logits.cpu())
    print(f"drafter {args.drafter}, T={args.draft}, batch {args.batch}, {args.tokens} new tokens, {args.dtype}")
    print(f"  greedy (eager):              {t_greedy:6.2f} s, {args.tokens} target calls")
    print(f"  speculative (replayssm):     {t_spec:6.2f} s (incl. compile), {stats['steps']} target calls, "
          f"{stats['accepted']}/{stats['drafted']} drafts accepted, {stats['tokens_per_step']:.2f} tokens/row/call")
    print(f"  token-identical to greedy: {same} ({differ} of {args.batch} rows differ)")
    print(f"  largest logit difference / logit scale (same context): {gap:.2e} (tolerance {args.logit_tol:g})")
    ok = gap <= args.logit_tol and (same or args.device.startswith("cuda"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
