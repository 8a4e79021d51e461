"""``replayssm bench accuracy --hf``: split precision inside a transformers hybrid model, logit KL vs float64.

A small random-weight transformers hybrid (Qwen3.5: Gated DeltaNet + attention, or Nemotron-H:
Mamba-2 + attention; real recurrent head sizes, half the heads with long memory, decay ~0.9999) runs
in float64 through ``replay_compile.integrations.transformers``. Its recurrent layers go to a runner that
keeps one group of batch rows per precision variant, all fed the same tokens (sampled from the float64
reference group), so every variant sees the same context and only the recurrent state's storage
differs: the float64 reference, the fp32 standard recurrence, pure bf16 / fp8 / fp4 states (re-quantized
after every token), and the replay form with an fp32 checkpoint plus a bf16 / fp8 / fp4 read copy.
Reported: KL(reference || variant) of the next-token distribution and the relative logit error,
averaged over the ``--avg`` tokens before each reported length.
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from ..families.base import Canonical, kv_view
from .accuracy import PAIRS, ReplayVariant, StandardVariant, _checkpoints, add_length_arguments, kl_gain, \
    parse_length_arguments

VOCAB, BOS = 512, 1
REFERENCE = "float64 reference"
LONG_DT_BIAS, SHORT_DT_BIAS = -9.5, -3.5  # softplus(a + dt_bias) ~ 7e-5 (decay ~0.99993) and ~0.03 (~0.97)


class VariantRunner:
    """Runner for the transformers integration: batch row group ``i`` runs precision variant ``i``.

    ``advance(state, x, ...)`` gets one decode token for all rows; on a state's first call each variant
    takes a copy of its rows (all groups start equal). Outputs are float64 ``[B, 1, Hv, V]``.
    """

    def __init__(self, names, rows, window):
        self.names, self.rows, self.window = names, rows, window
        self._variants: dict = {}

    def _make(self, state, family, layout, k_heads):
        S = kv_view(state[:self.rows], layout)  # every variant works on the [K, V] orientation
        made = []
        for name in self.names:
            if name == REFERENCE:
                made.append(StandardVariant(S, family.delta, dtype=torch.float64))
            elif name == "fp32 standard":
                made.append(StandardVariant(S, family.delta))
            elif name.endswith(" state"):
                made.append(StandardVariant(S, family.delta, name.split()[0]))
            else:  # "ckpt fp32 + <fmt> read"
                made.append(ReplayVariant(S.float().contiguous(), family, self.window, k_heads, read=name.split()[3]))
        return made

    def advance(self, state, x: Canonical, *, family, layout):
        if x.q.shape[1] != 1:
            raise ValueError("the accuracy runner takes one decode token per call")
        variants = self._variants.get(id(state))
        if variants is None:
            variants = self._variants[id(state)] = self._make(state, family, layout, x.k.shape[2])
        outs = []
        for g, var in enumerate(variants):
            part = slice(g * self.rows, (g + 1) * self.rows)
            xg = Canonical(*(None if f is None else f[part, 0] for f in x))
            if g:  # the variants get float32 inputs, as a float32 model would hand them
                xg = Canonical(*(None if f is None else f.float() for f in xg))
            outs.append(var.step(xg).double())
        return torch.cat(outs)[:, None]


def build_model(kind: str, smoke: bool, seed: int):
    """A random-weight transformers hybrid (one recurrent layer + one attention layer), float64, eval."""
    import transformers  # noqa: PLC0415  (optional dependency)

    common = dict(vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                  num_attention_heads=4, num_key_value_heads=2, use_cache=True,
                  initializer_range=0.1)  # sharper next-token distributions than the configs' 0.02
    if kind == "qwen3_5":
        dims = (dict(hidden_size=32, intermediate_size=48, head_dim=8, linear_num_key_heads=1, linear_num_value_heads=2,
                     linear_key_head_dim=16, linear_value_head_dim=8) if smoke else
                dict(hidden_size=256, intermediate_size=512, head_dim=64, linear_num_key_heads=2,
                     linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128))
        config = transformers.Qwen3_5TextConfig(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                                                linear_conv_kernel_dim=4, **dims, **common)
        model_class = transformers.Qwen3_5ForCausalLM
    elif kind == "nemotron_h":
        dims = (dict(hidden_size=32, intermediate_size=48, head_dim=8, mamba_num_heads=2, mamba_head_dim=8,
                     ssm_state_size=16) if smoke else
                dict(hidden_size=256, intermediate_size=512, head_dim=64, mamba_num_heads=4, mamba_head_dim=64,
                     ssm_state_size=128))
        config = transformers.NemotronHConfig(layers_block_type=["mamba", "attention"], n_groups=1, expand=1,
                                              conv_kernel=4, chunk_size=64, use_mamba_kernels=False,
                                              time_step_min=1e-6, **dims, **common)
        model_class = transformers.NemotronHForCausalLM
    else:
        raise ValueError(f"unknown model {kind!r}: qwen3_5 or nemotron_h")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    with torch.no_grad():  # half the heads remember ~10^4 tokens, half ~30
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                heads = module.dt_bias.shape[0]
                module.A_log.zero_()
                module.dt_bias.copy_(torch.tensor([LONG_DT_BIAS if h < heads // 2 else SHORT_DT_BIAS
                                                   for h in range(heads)]))
    return model.double().eval()


def _metrics(logits, groups: int, rows: int) -> torch.Tensor:
    """Per variant group: KL(reference || group) and relative logit error, ``[groups, 2]``."""
    lg = logits.view(groups, rows, -1)
    ref = torch.log_softmax(lg[0], -1)
    out = []
    for g in range(groups):
        lq = torch.log_softmax(lg[g], -1)
        kl = (ref.exp() * (ref - lq)).sum(-1).mean()
        err = (lg[g] - lg[0]).norm() / lg[0].norm()
        out.append(torch.stack([kl, err]))
    return torch.stack(out)


@torch.no_grad()
def run(args, device) -> dict:
    from transformers import DynamicCache  # noqa: PLC0415

    from ..integrations.transformers import _cache_argument, enable_replay  # noqa: PLC0415

    names = [REFERENCE, "fp32 standard"] + [p[1] for p in PAIRS] + [p[2] for p in PAIRS]
    model = build_model(args.hf_model, args.smoke, args.seed).to(device)
    runner = VariantRunner(names, args.rows, args.window)
    groups, B = len(names), len(names) * args.rows
    gen = torch.Generator(device=device).manual_seed(args.seed)
    checkpoints, measured = set(_checkpoints(args.steps, args.first)), set()
    for t in checkpoints:
        measured.update(range(t - args.avg, t))
    sums, hist = torch.zeros(groups, 2, dtype=torch.float64, device=device), {}
    cache = DynamicCache(config=model.config)
    base, head = model.base_model, model.get_output_embeddings()
    kw = {_cache_argument(base): cache, "use_cache": True}

    def next_logits(ids):  # the head applied here: some models cast logits to float32 (a 1e-8 KL noise floor)
        return head(base(ids, **kw).last_hidden_state[:, -1])

    start = time.perf_counter()
    with enable_replay(model, window=args.window, runner=runner):
        logits = next_logits(torch.full((B, 1), BOS, device=device))
        done = 0
        for t in range(args.steps):
            if t in measured:
                sums += _metrics(logits, groups, args.rows)
            if t + 1 in checkpoints:
                hist[t + 1] = (sums / args.avg).cpu()
                sums.zero_()
                if args.progress:
                    print(f"  {args.hf_model}: {t + 1} tokens, {time.perf_counter() - start:.0f} s", flush=True)
            out_of_time = args.max_seconds is not None and time.perf_counter() - start > args.max_seconds
            if hist and t % 256 == 0 and out_of_time:
                print(f"  {args.hf_model}: stopped after {t} tokens (--max-seconds {args.max_seconds:g})")
                break
            probs = torch.softmax(logits[:args.rows] / args.temperature, -1)
            token = torch.multinomial(probs, 1, generator=gen)  # [rows, 1], the reference's sample
            logits = next_logits(token.repeat(groups, 1))
            done = t + 1
    if not hist:
        raise RuntimeError(f"no reported length reached (first is {args.first}): raise --max-seconds")
    results = {name: {t: {"kl": float(h[g, 0]), "logit_err": float(h[g, 1])} for t, h in sorted(hist.items())}
               for g, name in enumerate(names) if name != REFERENCE}
    return dict(tokens=done, results=results, seconds=time.perf_counter() - start)


def _targets(res) -> list:
    ts = sorted(next(iter(res.values())))
    first, last = ts[0], ts[-1]
    rows = []
    for _, pure, split in PAIRS:
        flat = res[split][last]["kl"] / max(res[split][first]["kl"], 1e-300)
        rows.append((f"{split}: KL {last} / KL {first} <= 1.5", flat, flat <= 1.5))
        gain = kl_gain(res[pure][last]["kl"], res[split][last]["kl"])
        rows.append((f"KL {pure} / KL {split} at {last} >= 20", gain, gain >= 20))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="replayssm bench accuracy --hf", description=__doc__.splitlines()[0])
    p.add_argument("--hf-model", default="qwen3_5", choices=["qwen3_5", "nemotron_h"])
    p.add_argument("--rows", type=int, default=2, help="batch rows per variant")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the reference")
    add_length_arguments(p, steps=32768, out="accuracy_hf.json", smoke="tiny model, few steps: a CPU check of the harness",
                         max_seconds="stop after this long (lengths reached so far)",
                         plot="write a log-log PNG of KL against tokens (needs matplotlib)")
    args = parse_length_arguments(p, argv)
    device = torch.device(args.device)
    rep = run(args, device)
    targets = _targets(rep["results"])
    report = {"args": vars(args), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              **rep, "targets": [dict(check=c, value=v, ok=ok) for c, v, ok in targets]}
    _print(args.hf_model, rep, targets)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")
    if args.plot:
        plot(args.hf_model, rep["results"], args.plot)
    return 0


def plot(model: str, results: dict, path: str) -> None:
    """Log-log PNG of each variant's next-token KL against tokens (non-finite points left out)."""
    import matplotlib  # noqa: PLC0415  (optional dependency: the `plot` extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, by in results.items():
        ts = [t for t in sorted(by, key=int) if math.isfinite(by[t]["kl"]) and by[t]["kl"] > 0]
        ax.loglog([int(t) for t in ts], [by[t]["kl"] for t in ts], marker="o", ms=3, label=name)
    ax.set_title(f"{model} (transformers, float64 reference): next-token KL")
    ax.set_xlabel("tokens")
    ax.set_ylabel("KL(float64 || variant)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def _print(model, rep, targets) -> None:
    res = rep["results"]
    ts = sorted(next(iter(res.values())))
    show = sorted({ts[0], ts[len(ts) // 2], ts[-1]})
    print(f"\n{model} (transformers, float64 model, {rep['seconds']:.0f} s): next-token KL vs float64 "
          f"| relative logit error")
    head = f"{'variant':<24}" + "".join(f"{'KL@' + str(t):>12}" for t in show) + "".join(
        f"{'err@' + str(t):>12}" for t in show)
    print(head + "\n" + "-" * len(head))
    for name, by in res.items():
        cells = [f"{by[t]['kl']:.2e}" for t in show] + [f"{by[t]['logit_err']:.2e}" for t in show]
        print(f"{name:<24}" + "".join(f"{c:>12}" for c in cells))
    for check, value, ok in targets:
        print(f"  [{'ok' if ok else 'MISS'}] {check}: {value:.3g}"
              + (" (the pure state diverged: its logits are not finite)" if value == math.inf else ""))
