"""``replayssm bench model``: decode-step time of hybrid decoder stacks, eager vs compiled vs ``replayssm``.

Each model is a transformers causal LM of a few decoder layers whose linear-recurrent layers have the
real shapes (REPLAYSSM.md, section 5), random bf16 weights and a small vocabulary:

    nemotron3-super   NemotronH: Mamba-2, MLP, Mamba-2, attention; Mamba-2 128 heads x 64 x state 128, 8 groups
    qwen3.5-122b      Qwen3.5: GDN x 3, attention; 16 qk / 64 v heads of 128 x 128
    kimi-linear       Kimi-Linear: KDA x 3, MLA attention; 32 heads of 128 x 128

Hidden sizes follow the public configs; the mixture-of-experts blocks of the real models are replaced
by one dense MLP (``MLP_WIDTH``), so the share of the recurrent layers measured here is that of this
stack, not of the full model. The cache is a ``StaticCache`` (static shapes: what CUDA graphs need)
filled by a chunked prefill of ``--context`` random tokens; then the decode step (one token per row; the
static cache gives every call the same shapes) is timed per column, from the same prefilled cache:

    eager         the model as written (transformers' torch paths)
    compile       torch.compile(model.forward), Inductor
    replay        backend="replayssm" (fp32 checkpoint + ring of L records), Inductor for the rest
    replay-fp8    the same with an fp8 read copy of the checkpoint
    no-recurrent  torch.compile of the stack with its linear-recurrent mixers replaced by a stub that
                  returns zeros: step time minus this is the time spent in those layers (share column)

Compiled columns run under each ``--modes`` entry: ``default`` and ``reduce-overhead`` (CUDA graphs,
reported as ``+cg``; on the CPU only ``default``). Eager always runs plain, and with ``reduce-overhead``
also recorded by hand in one CUDA graph (``eager+cg``, when the step can be captured). A step's time
is the median over repeats of ``--steps`` consecutive calls (a multiple of L, so replay's checkpoint
writes are amortized as in serving), wall clock with a device synchronize. Before timing, each
column's first step is compared with eager's from the same cache (``rel_err``, rel-RMS of the logits)
and the replayssm columns report how many sites were rewritten (the GPU cost model keeps batches
below 8 standard). A column that fails is ``n/a`` with the reason in the JSON. Progress goes to
stderr; ``--out`` writes JSON after every cell, ``--plot`` a PNG of step time against batch size
(matplotlib optional), ``--profile FILE`` each cell's torch.profiler table of kernels by device time (where
the time of a step goes, e.g. what is left around the recurrence).

``--smoke`` runs tiny shapes on the CPU in seconds (tests/test_bench_model.py).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from typing import Callable, Optional

import torch

from .kernels import _dump, _reason, _rel, comma_list

COLUMNS = ("eager", "compile", "replay", "replay-fp8", "no-recurrent")
COMPILED = COLUMNS[1:]
MODES = ("default", "reduce-overhead")
BATCHES = (1, 8, 32, 128, 256)
VOCAB = 1024
MLP_WIDTH = 8192


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A decoder stack: transformers config class and kwargs, real and smoke-sized."""

    config_class: str
    causal_lm: str
    modeling: str              # transformers module defining causal_lm
    recurrence: str            # canonical family the backend must rewrite
    mixer: tuple               # (layer type attribute value, mixer attribute) of the linear-recurrent layers
    real: dict
    smoke: dict

    @property
    def module(self) -> str:
        return f"transformers.models.{self.modeling}"


def _common(hidden, layers):
    return dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, tie_word_embeddings=False,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=True)


SPECS = {
    "nemotron3-super": ModelSpec(
        "NemotronHConfig", "NemotronHForCausalLM", "nemotron_h.modeling_nemotron_h", "mamba2",
        ("linear_attention", "mixer"),
        real=dict(_common(4096, 4), layers_block_type=["mamba", "mlp", "mamba", "attention"],
                  mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4,
                  # prefill only (decode is the recurrent step): transformers' torch chunk scan builds a
                  # [B, chunks, chunk, chunk, heads, state] product, 256 GiB at batch 256 with chunks of 128
                  chunk_size=8, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
                  intermediate_size=MLP_WIDTH, use_mamba_kernels=False),
        smoke=dict(_common(32, 4), vocab_size=64, layers_block_type=["mamba", "mlp", "mamba", "attention"],
                   mamba_num_heads=4, mamba_head_dim=6, ssm_state_size=10, n_groups=2, conv_kernel=4, chunk_size=8,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
                   use_mamba_kernels=False)),
    "qwen3.5-122b": ModelSpec(
        "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", "qwen3_5.modeling_qwen3_5", "gated_deltanet",
        ("linear_attention", "linear_attn"),
        real=dict(_common(3072, 4), layer_types=["linear_attention"] * 3 + ["full_attention"],
                  linear_num_key_heads=16, linear_num_value_heads=64, linear_key_head_dim=128,
                  linear_value_head_dim=128, linear_conv_kernel_dim=4, num_attention_heads=32,
                  num_key_value_heads=2, head_dim=256, intermediate_size=MLP_WIDTH),
        smoke=dict(_common(32, 4), vocab_size=64, layer_types=["linear_attention"] * 3 + ["full_attention"],
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6, linear_value_head_dim=10,
                   linear_conv_kernel_dim=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   intermediate_size=48)),
    "kimi-linear": ModelSpec(
        "KimiLinearConfig", "KimiLinearForCausalLM", "kimi_linear.modeling_kimi_linear", "kda",
        ("linear_attention", "self_attn"),
        real=dict(_common(2304, 4), layer_types=["linear_attention"] * 3 + ["full_attention"],
                  mlp_layer_types=["dense"] * 4, linear_attn_config=dict(head_dim=128, num_heads=32,
                                                                         short_conv_kernel_size=4),
                  num_attention_heads=32, num_key_value_heads=32, q_lora_rank=None, kv_lora_rank=512,
                  qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, intermediate_size=MLP_WIDTH,
                  moe_intermediate_size=1024),
        smoke=dict(_common(32, 4), vocab_size=64, layer_types=["linear_attention"] * 3 + ["full_attention"],
                   mlp_layer_types=["dense"] * 4, linear_attn_config=dict(head_dim=10, num_heads=2,
                                                                          short_conv_kernel_size=4),
                   num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                   qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, intermediate_size=48,
                   moe_intermediate_size=16)),
}
SMOKE = dict(batch=[2], context=12, prefill_chunk=8, steps=4, repeats=1, window=4)
# prefill_chunk 64: transformers' torch chunked KDA builds a [B, H, T/64, 64, 64, K] fp32 decay tensor per call
# (17 GB at batch 256 and 64 tokens, a few of them live at once); longer calls would not fit on one GPU.
REAL = dict(context=1024, prefill_chunk=64, steps=32, repeats=3, window=16)


# ------------------------------------------------------------------------------------------ models
LIBRARY_KERNELS = ("fla", "mamba_ssm", "causal_conv1d")


@contextlib.contextmanager
def hidden_packages(names):
    """Make ``import name`` fail inside the block (``sys.modules[name] = None``), restore afterwards."""
    missing = object()
    saved = {name: sys.modules.get(name, missing) for name in names}
    sys.modules.update(dict.fromkeys(names, None))
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is missing:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def bind_torch_paths(modules) -> bool:
    """Import the modeling ``modules`` (names) with the kernel packages hidden; False if one was imported before.

    transformers binds a recurrence to flash-linear-attention / mamba_ssm kernels when they are
    importable, at module import. An opaque kernel leaves ``replayssm`` nothing to rewrite, so by
    default the stacks run the models' torch code (``--library-kernels`` keeps the packages).
    """
    import importlib  # noqa: PLC0415
    if any(name in sys.modules for name in modules):
        return False
    with hidden_packages(LIBRARY_KERNELS):  # `import fla` now fails
        for name in modules:
            importlib.import_module(name)
    return True


def build_model(spec: ModelSpec, smoke: bool, device: str, dtype: torch.dtype, seed: int = 0):
    """Random-weight causal LM of ``spec`` in eval mode (weights drawn on ``device``, then cast)."""
    import transformers  # noqa: PLC0415  (optional dependency: only this command needs it)
    config = getattr(transformers, spec.config_class)(**(spec.smoke if smoke else spec.real))
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, spec.causal_lm)(config)
    return model.to(dtype).eval()


def recurrent_mixers(model, spec: ModelSpec) -> list:
    """(layer, attribute) of every linear-recurrent mixer of ``model``."""
    kind, attr = spec.mixer
    return [(layer, attr) for layer in model.model.layers if getattr(layer, "block_type", None) == kind]


class NoRecurrence(torch.nn.Module):
    """Stands in for a linear-recurrent mixer: adds nothing to the residual, touches no state."""

    def forward(self, hidden_states, **_):
        return torch.zeros_like(hidden_states)


@contextlib.contextmanager
def without_recurrence(model, spec: ModelSpec):
    mixers = recurrent_mixers(model, spec)
    saved = [getattr(layer, attr) for layer, attr in mixers]
    for layer, attr in mixers:
        setattr(layer, attr, NoRecurrence())
    try:
        yield
    finally:
        for (layer, attr), mixer in zip(mixers, saved):
            setattr(layer, attr, mixer)


# ------------------------------------------------------------------------------------------- cache
class DecodeCache:
    """A ``StaticCache`` prefilled with ``context`` random tokens, with a snapshot to restore from.

    Each decode step writes its token's keys at the cache's own device-side length counter (which it
    advances), so a column may take ``headroom`` steps before ``restore()``. ``restore()`` copies the
    snapshot (counters included) back in place: the tensors keep their addresses, which compiled
    graphs and CUDA graphs hold on to.

    Only ``prefill_rows`` rows are prefilled; their cache is tiled over the batch (rows repeat every
    ``prefill_rows``; decode tokens stay distinct). transformers' torch chunk scans build intermediates
    that grow with batch x context (the Nemotron-3-Super stack asked for 81 GiB at batch 256, H200).
    """

    def __init__(self, model, batch: int, context: int, prefill_chunk: int, headroom: int, device: str,
                 seed: int = 1, prefill_rows: int = 32):
        import transformers  # noqa: PLC0415
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(3, model.config.vocab_size, (batch, context + 1), generator=g).to(device)
        rows = min(batch, prefill_rows)
        rows = rows if batch % rows == 0 else batch
        part = transformers.StaticCache(config=model.config, max_cache_len=context + headroom)
        with torch.no_grad():
            for start in range(0, context, prefill_chunk):
                end = min(start + prefill_chunk, context)  # the last prompt token is the decode step's input
                model(input_ids=prompt[:rows, start:end], past_key_values=part, use_cache=True)
            if rows == batch:
                self.cache = part
            else:  # a full-batch cache (one token allocates it), then every tensor tiled from the prefilled rows
                self.cache = transformers.StaticCache(config=model.config, max_cache_len=context + headroom)
                model(input_ids=prompt[:, :1], past_key_values=self.cache, use_cache=True)
                if len(self.tensors()) != len(_cache_tensors(part)):
                    raise RuntimeError("a prefilled cache and the full-batch cache hold different tensors")
                for full, src in zip(self.tensors(), _cache_tensors(part)):
                    full.copy_(_tile_rows(src, full.shape))
        self.token = prompt[:, context:]
        self.snapshot = [(t, t.clone()) for t in self.tensors()]

    def tensors(self) -> list:
        return _cache_tensors(self.cache)

    def restore(self) -> None:
        from ..api import release  # noqa: PLC0415
        release(self.cache)  # a replay-managed state is made exact and handed back before it is overwritten
        with torch.no_grad():
            for t, saved in self.snapshot:
                t.copy_(saved)

    def step_fn(self, forward: Callable, cudagraph_trees: bool = False) -> Callable[[], torch.Tensor]:
        """One decode step of ``forward`` on this cache (the next position); returns the logits.

        ``cudagraph_trees``: ``forward`` was compiled with mode="reduce-overhead"; each call starts a new
        step, so its CUDA graph may overwrite the previous call's outputs (nobody reads them).
        """
        def step():
            if cudagraph_trees:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                return forward(input_ids=self.token, past_key_values=self.cache, use_cache=True).logits
        return step


def _cache_tensors(cache) -> list:
    """Every tensor of a transformers cache's layers (keys, values, length counter, conv and recurrent states)."""
    found = []
    for layer in cache.layers:
        for name in ("keys", "values", "cumulative_length"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                found.append(t)
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            found += [t for t in states.values() if isinstance(t, torch.Tensor)]
    return found


def _tile_rows(src: torch.Tensor, shape) -> torch.Tensor:
    """``src`` repeated along dim 0 to ``shape`` (tensors without a batch dim, e.g. counters, as they are)."""
    if tuple(src.shape) == tuple(shape):
        return src
    if src.dim() == 0 or tuple(src.shape[1:]) != tuple(shape[1:]) or shape[0] % src.shape[0]:
        raise ValueError(f"cannot tile a cache tensor {tuple(src.shape)} to {tuple(shape)}")
    return src.repeat(shape[0] // src.shape[0], *[1] * (src.dim() - 1))


# ------------------------------------------------------------------------------------------ timing
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_step(step: Callable, device: str, steps: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``steps`` consecutive calls, in microseconds."""
    for _ in range(2):
        step()
    samples = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        samples.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(samples)


def profile_table(step: Callable, device: str, steps: int, rows: int = 25) -> str:
    """torch.profiler's table of the ops and kernels of ``steps`` calls, by self time on ``device``
    (where a step's time goes: which kernels, how many launches)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    sort = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows)


def compiled_forward(model, column: str, mode: str, window: int, min_batch: Optional[int], inductor: bool,
                     validate: bool):
    """``model.forward`` compiled for ``column`` under ``mode`` (static shapes: one graph per batch).

    Without ``inductor`` (smoke runs) the graphs run as captured: fast to build, same code paths.
    """
    mode_arg = None if mode == "default" else mode
    if column in ("compile", "no-recurrent"):
        return torch.compile(model.forward, mode=mode_arg, dynamic=False, backend="inductor" if inductor else "eager")
    # the mode goes in the options: torch.compile refuses mode= together with options=
    options = {"window": window, "min_batch": min_batch, "inductor": inductor, "mode": mode_arg, "validate": validate}
    if column == "replay-fp8":
        options["read_dtype"] = "fp8"
    return torch.compile(model.forward, backend="replayssm", dynamic=False, options=options)


# ------------------------------------------------------------------------------------------- bench
class Bench:
    def __init__(self, args):
        self.args = args
        self.done, self.total = 0, 0

    def progress(self, what: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)

    def measure(self, model, spec, decode: DecodeCache, column: str, mode: str, reference, label: str = "") -> dict:
        """One cell: first-step error against eager, then the step time (``us`` None and ``why`` on failure);
        with ``--profile``, then the kernels of ``--steps`` more calls, appended to that file under ``label``."""
        from .. import reset_counters  # noqa: PLC0415
        from ..passes import counters  # noqa: PLC0415
        torch._dynamo.reset()
        reset_counters()
        skips_before = _cudagraph_skips()
        stub = without_recurrence(model, spec) if column == "no-recurrent" else contextlib.nullcontext()
        cell = {}
        try:
            with stub:
                forward = model.forward if column == "eager" else \
                    compiled_forward(model, column, mode, self.args.window, self.args.min_batch,
                                     self.args.inductor, self.args.validate)
                decode.restore()
                step = decode.step_fn(forward, cudagraph_trees=column != "eager" and mode == "reduce-overhead")
                t0 = time.perf_counter()
                logits = step().float().clone()
                cell["first_call_s"] = round(time.perf_counter() - t0, 2)
                if column != "no-recurrent":
                    cell["rel_err"] = _rel(logits, reference)
                if column == "eager" and mode == "reduce-overhead":
                    step = _captured(step)
                cell["us"] = time_step(step, self.args.device, self.args.steps, self.args.repeats)
                if self.args.profile:
                    with open(self.args.profile, "a") as f:
                        f.write(f"=== {label}: {cell['us']:.0f} us per step; {self.args.steps} steps profiled\n"
                                f"{profile_table(step, self.args.device, self.args.steps)}\n")
        except Exception as e:  # noqa: BLE001  (one failing cell must not end the run)
            cell.update(us=None, why=_reason(e))
        finally:
            decode.restore()
            torch._dynamo.reset()
        if column.startswith("replay"):
            cell["sites_rewritten"] = counters["sites_rewritten"]
        if mode == "reduce-overhead":
            cell["cudagraph_skips"] = _cudagraph_skips() - skips_before
        return cell

    def row(self, name: str, spec: ModelSpec, model, batch: int, results: dict) -> None:
        """Measure every column at ``batch`` into a new row of ``results``, saved after every cell."""
        args = self.args
        self.progress(f"{name} B={batch}: prefill {args.context} tokens")
        # reference, first call, warm-up, capture, timed and profiled steps
        headroom = 16 + args.steps * (args.repeats + bool(args.profile))
        decode = DecodeCache(model, batch, args.context, args.prefill_chunk, headroom, args.device)
        reference = decode.step_fn(model.forward)().float().clone()
        decode.restore()
        row = dict(model=name, batch=batch, context=args.context, recurrence=spec.recurrence, cells={},
                   recurrent_share={})
        results["rows"].append(row)
        for column in args.columns:
            modes = sorted({"default", *args.modes}) if column == "eager" else args.modes  # plain eager: no compile
            for mode in modes:
                key = column if mode == "default" else f"{column}+cg"
                self.progress(f"{name} B={batch} {key}")
                row["cells"][key] = self.measure(model, spec, decode, column, mode, reference, f"{name} B={batch} {key}")
                row["recurrent_share"] = recurrent_shares(row["cells"])
                if args.out:
                    _dump(results, args.out)  # a run cut short keeps what it measured
        del decode
        _free(args.device)


def _captured(step: Callable) -> Callable:
    """``step`` recorded in one CUDA graph (the eager column's "+cg"): its replay, or an error saying why not."""
    from .kernels import _capture  # noqa: PLC0415
    graph = _capture(step)
    if graph is None:
        raise RuntimeError("the eager step cannot be captured in a CUDA graph (a host sync or allocation check)")
    return graph.replay


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters  # noqa: PLC0415
    return counters["inductor"].get("cudagraph_skips", 0)


def _free(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def recurrent_shares(cells: dict) -> dict:
    """Share of step time in the linear-recurrent layers, per compiled column with a matching stub time:
    ``1 - t(no-recurrent) / t(column)`` under the same mode."""
    shares = {}
    for key, cell in cells.items():
        suffix = "+cg" if key.endswith("+cg") else ""
        rest = cells.get("no-recurrent" + suffix, {}).get("us")
        if key.startswith(("compile", "replay")) and cell.get("us") and rest:
            shares[key] = 1.0 - rest / cell["us"]
    return shares


# ------------------------------------------------------------------------------------------ output
def _us(cell: Optional[dict]) -> str:
    """Step time; replayssm cells add the number of sites rewritten (0: the step ran standard)."""
    if not cell or cell.get("us") is None:
        return "n/a"
    sites = f" ({cell['sites_rewritten']} sites)" if "sites_rewritten" in cell else ""
    return f"{cell['us']:.0f}{sites}"


def table_keys(results: dict) -> list:
    keys = []
    for row in results["rows"]:
        keys += [k for k in row["cells"] if k not in keys]
    return keys


def format_table(results: dict) -> str:
    """Markdown table: step time (us) per column, speedup of replay over compile, recurrent share."""
    keys = table_keys(results)
    meta = results["meta"]
    lines = [f"device {meta['device']}, {meta['dtype']} weights, context {meta['context']}, L={meta['window']}, "
             f"step = median of {meta['repeats']} x {meta['steps']} calls", "",
             "| model | B | " + " | ".join(f"{k} us" for k in keys) + " | replay / compile | share in recurrent |",
             "|---|---|" + "---|" * len(keys) + "---|---|"]
    for row in results["rows"]:
        cells = row["cells"]
        speed = []
        for suffix in ("", "+cg"):
            c, r = cells.get("compile" + suffix, {}).get("us"), cells.get("replay" + suffix, {}).get("us")
            if c and r:
                speed.append(f"{c / r:.2f}x{suffix}")
        share = ", ".join(f"{k} {100 * v:.0f}%" for k, v in row["recurrent_share"].items())
        lines.append(f"| {row['model']} | {row['batch']} | " + " | ".join(_us(cells.get(k)) for k in keys)
                     + f" | {' '.join(speed) or '-'} | {share or '-'} |")
    failed = [(row["model"], row["batch"], k, c["why"]) for row in results["rows"] for k, c in row["cells"].items()
              if c.get("why")]
    lines += [f"\nn/a {m} B={b} {k}: {why}" for m, b, k, why in failed]
    return "\n".join(lines)


def plot(results: dict, path: str) -> Optional[str]:
    """PNG of step time against batch, one panel per model; returns why not when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    models = list(dict.fromkeys(r["model"] for r in results["rows"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, name in zip(axes[0], models):
        rows = [r for r in results["rows"] if r["model"] == name]
        for key in table_keys(results):
            pts = [(r["batch"], r["cells"][key]["us"]) for r in rows if r["cells"].get(key, {}).get("us")]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=key)
        ax.set(title=name, xscale="log", yscale="log", xlabel="batch", ylabel="decode step (us)")
        ax.legend(fontsize=7)
    fig.suptitle(f"decode step, {results['meta']['device']}, context {results['meta']['context']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def _meta(args, argv) -> dict:
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    import transformers  # noqa: PLC0415
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), device=dev,
                torch=torch.__version__, transformers=transformers.__version__,
                commit=os.environ.get("REPLAYSSM_COMMIT", ""), command=" ".join(["replayssm bench model", *argv]),
                dtype=str(args.dtype).replace("torch.", ""), context=args.context, window=args.window,
                steps=args.steps, repeats=args.repeats, smoke=args.smoke, inductor=args.inductor,
                validate=args.validate, mlp_width=MLP_WIDTH, library_kernels=args.library_kernels)


# ------------------------------------------------------------------------------------------- driver
def parse_args(argv):
    p = argparse.ArgumentParser(prog="replayssm bench model", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=comma_list(str), default=list(SPECS), help=f"comma list of {', '.join(SPECS)}")
    p.add_argument("--batch", type=comma_list(int), help=f"batch sizes (default {','.join(map(str, BATCHES))})")
    p.add_argument("--columns", type=comma_list(str), default=list(COLUMNS), help=f"subset of {','.join(COLUMNS)}")
    p.add_argument("--modes", type=comma_list(str), help="compiled columns' modes: default,reduce-overhead "
                                                  "(default: both on CUDA, default on the CPU)")
    p.add_argument("--context", type=int, help=f"prefilled tokens (default {REAL['context']})")
    p.add_argument("--prefill-chunk", type=int, help=f"tokens per prefill call (default {REAL['prefill_chunk']})")
    p.add_argument("--steps", type=int, help=f"decode calls per timing sample (default {REAL['steps']})")
    p.add_argument("--repeats", type=int, help=f"timing samples, the median is reported (default {REAL['repeats']})")
    p.add_argument("--window", type=int, help=f"replay window L (default {REAL['window']})")
    p.add_argument("--min-batch", type=int, help="replayssm min_batch option (default: the backend's cost model)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="weights (states stay fp32)")
    p.add_argument("--library-kernels", action="store_true",
                   help="let transformers use fla / mamba_ssm / causal_conv1d kernels when installed (replayssm "
                        "then finds no recurrence to rewrite in those layers); default: the models' torch code")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU in seconds (CI); implies --no-inductor")
    p.add_argument("--no-inductor", dest="inductor", action="store_false",
                   help="compiled columns run their graphs as captured (torch.compile backend 'eager', replayssm "
                        "option inductor=False)")
    p.add_argument("--out", help="JSON results path")
    p.add_argument("--plot", help="PNG plot path (needs matplotlib)")
    p.add_argument("--profile", metavar="FILE", help="after timing each cell, profile --steps more calls and append "
                   "torch.profiler's table of kernels by device time to FILE")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="measure nothing: join the rows of earlier --out files (a run cut into parts), then "
                        "print the table and write --out / --plot")
    p.add_argument("--validate", action="store_true", help="keep replayssm's numeric check of each rewrite at "
                   "compile time (off: it draws every graph input again, slow at these sizes; each column's "
                   "rel_err against eager checks the result instead)")
    args = p.parse_args(argv)
    preset = {**REAL, **(SMOKE if args.smoke else {})}
    for key in ("context", "prefill_chunk", "steps", "repeats", "window"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    args.batch = args.batch or list(SMOKE["batch"] if args.smoke else BATCHES)
    args.device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    args.modes = args.modes or (list(MODES) if args.device == "cuda" else ["default"])
    args.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    args.inductor = args.inductor and not args.smoke
    bad = [m for m in args.models if m not in SPECS] + [c for c in args.columns if c not in COLUMNS] + \
          [m for m in args.modes if m not in MODES]
    if bad:
        p.error(f"unknown model(s)/column(s)/mode(s) {bad}; models: {', '.join(SPECS)}; "
                f"columns: {', '.join(COLUMNS)}; modes: {', '.join(MODES)}")
    if "reduce-overhead" in args.modes and args.device != "cuda":
        p.error("mode reduce-overhead (CUDA graphs) needs a CUDA device")
    return args


def merge(paths: list) -> dict:
    """The rows of several result files under the first one's meta (``merged_from`` lists them all), by model
    (in order of first appearance), then batch: the table reads and the plot draws batch by batch."""
    parts = []
    for path in paths:
        with open(path) as f:
            parts.append(json.load(f))
    sources = [dict(path=path, command=part["meta"]["command"]) for path, part in zip(paths, parts)]
    meta = dict(parts[0]["meta"], merged_from=sources)
    rows = [row for part in parts for row in part["rows"]]
    models = {name: i for i, name in enumerate(dict.fromkeys(row["model"] for row in rows))}
    return {"meta": meta, "rows": sorted(rows, key=lambda row: (models[row["model"]], row["batch"]))}


def report(results: dict, args) -> None:
    print(format_table(results))
    if args.out:
        _dump(results, args.out)
        print(f"\nwrote {args.out}")
    if args.plot:
        why = plot(results, args.plot)
        print(f"plot not written: {why}" if why else f"wrote {args.plot}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.merge:
        report(merge(args.merge), args)
        return 0
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any replay kernel imports triton
    if not args.library_kernels and not bind_torch_paths([SPECS[m].module for m in args.models]):
        print("note: transformers modeling modules were imported before; kernel packages not hidden", file=sys.stderr)
    bench = Bench(args)
    per_row = 1 + sum(len({"default", *args.modes}) if c == "eager" else len(args.modes) for c in args.columns)
    bench.total = len(args.models) * len(args.batch) * per_row
    results = {"meta": _meta(args, argv), "rows": []}
    for name in args.models:
        spec = SPECS[name]
        model = build_model(spec, args.smoke, args.device, args.dtype)
        for batch in args.batch:
            bench.row(name, spec, model, batch, results)
        del model
        _free(args.device)
    print(file=sys.stderr)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
