"""Speculative decoding of a Hugging Face transformers hybrid model through the replay runtime.

transformers verifies several tokens with a chunked scan that the ``replayssm`` backend does not
rewrite, so this example uses the opt-in integration instead: ``enable_replay`` routes the model's
recurrent functions (Gated DeltaNet, KDA, Mamba-2) to the replay op, each step verifies ``T`` drafts
per row, and ``commit`` keeps each row's accepted tokens by moving ring pointers (and cutting the
short-convolution windows). Greedy speculative output equals greedy decoding.

    python examples/transformers_speculative.py                      # tiny random Qwen3.5 (no download)
    python examples/transformers_speculative.py --model /path/to/a/local/checkpoint --device cuda
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import transformers
from transformers import DynamicCache

from replay_compile.integrations import transformers as replay_tf
from replay_compile.toy import PromptLookupDrafter


def tiny_qwen3_5(seed=0):
    """A random-weight Qwen3.5 text model: 3 Gated DeltaNet layers and 1 attention layer."""
    config = transformers.Qwen3_5TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, initializer_range=0.2, tie_word_embeddings=False,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
    torch.manual_seed(seed)
    return transformers.Qwen3_5ForCausalLM(config)


@torch.no_grad()
def greedy(model, ids, new_tokens):
    """Plain greedy decoding with transformers' own functions: tokens ``[B, new_tokens]``."""
    cache = DynamicCache(config=model.config)
    kw = {replay_tf._cache_argument(model): cache, "use_cache": True}
    logits, out = model(ids, **kw).logits[:, -1], []
    for _ in range(new_tokens):
        out.append(logits.argmax(-1))
        logits = model(out[-1][:, None], **kw).logits[:, -1]
    return torch.stack(out, 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="local checkpoint directory (default: a tiny random Qwen3.5)")
    p.add_argument("--draft", type=int, default=4, help="draft tokens T per step")
    p.add_argument("--tokens", type=int, default=48, help="new tokens per row")
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--window", type=int, default=16, help="replay window L (>= T + 1)")
    p.add_argument("--read-dtype", default=None, help="read copy of the checkpoint: bf16, fp8, fp4")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    if args.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
    else:
        model = tiny_qwen3_5()
    model = model.to(args.device).eval()
    vocab = model.config.get_text_config().vocab_size
    base = torch.randint(3, vocab, (args.batch, 8))
    ids = torch.cat([base, base, base[:, :4]], 1).to(args.device)  # repetitive: prompt lookup finds drafts

    t0 = time.perf_counter()
    ref = greedy(model, ids, args.tokens)
    t_greedy = time.perf_counter() - t0
    t0 = time.perf_counter()
    with replay_tf.enable_replay(model, window=args.window, speculative=True, read_dtype=args.read_dtype) as replay:
        spec, _, stats = replay_tf.speculative_generate(model, replay, ids, args.tokens, PromptLookupDrafter(),
                                                        args.draft)
    t_spec = time.perf_counter() - t0
    same = torch.equal(spec, ref)
    print(f"{type(model).__name__}, T={args.draft}, batch {args.batch}, {args.tokens} new tokens, L={args.window}")
    print(f"  greedy (transformers):     {t_greedy:6.2f} s, {args.tokens} target calls")
    print(f"  speculative (replay):      {t_spec:6.2f} s, {stats['steps']} target calls, "
          f"{stats['accepted']}/{stats['drafted']} drafts accepted")
    print(f"  token-identical to greedy: {same}")
    return 0 if same or args.read_dtype else 1


if __name__ == "__main__":
    sys.exit(main())
