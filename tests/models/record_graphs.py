"""Record what Dynamo hands a torch.compile backend when a tiny transformers hybrid decodes.

Why: the `replayssm` pass codes against the FX graphs Dynamo produces for real models; this script
shows them (source of docs/MODEL_SPELLINGS.md). It compiles `model.forward` with a backend that stores
each graph it receives (code, placeholders with their Dynamo sources, shapes, dtypes, static-address
marks), runs eager, and reports graph breaks and recompiles.

    python tests/models/record_graphs.py qwen3_next --batch 4 --new-tokens 4 --out /tmp/graphs

writes /tmp/graphs/qwen3_next_b4/graph_<n>.py (one per compiled graph, placeholders listed on top)
and prints a summary. Not collected by pytest (no test_ prefix).
"""

import argparse
import os
import re
import sys

import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._inductor.decomposition import select_decomp_table

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny import FAMILIES, continue_greedy, greedy, prompts, tiny_model  # noqa: E402


class GraphRecorder:
    """A torch.compile backend that keeps every graph it receives and runs it eagerly.

    Each entry of `graphs`: compile_id, gm (the GraphModule), sources ({placeholder name: Dynamo source
    name}; the source is only readable while the backend runs), static (placeholder names whose real
    input carries `_dynamo_static_input_type`), placeholders (one summary line each), code.
    """

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs, **kwargs):
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        self.graphs.append(
            dict(
                compile_id=str(torch._guards.CompileContext.current_compile_id()),
                gm=gm,
                sources={node.name: source_name(node) for node in placeholders},
                static={
                    node.name
                    for node, example in zip(placeholders, example_inputs)
                    if getattr(example, "_dynamo_static_input_type", None)
                },
                placeholders=[describe_placeholder(node, ex) for node, ex in zip(placeholders, example_inputs)],
                code=gm.code,
            )
        )
        return gm.forward


def source_name(node):
    grapharg = node.meta.get("grapharg")
    if grapharg is None:
        return "?"
    name = grapharg.source.name
    return name() if callable(name) else name


def describe_placeholder(node, example):
    """'name: source shape dtype [static]' for one placeholder of a Dynamo graph and its real input."""
    value = node.meta.get("example_value", node.meta.get("val"))  # Dynamo graph, AOT graph
    if isinstance(value, torch.Tensor):
        static = getattr(example, "_dynamo_static_input_type", None)
        static = f" static={static}" if static else ""
        return f"{node.name}: {source_name(node)} {tuple(value.shape)} {value.dtype}{static}"
    return f"{node.name}: {source_name(node)} {type(value).__name__} {value}"


def record(family, batch, new_tokens, prompt_len, dtype=torch.float32, continue_len=0, aot=False):
    """Compile `model.forward` with a GraphRecorder, run greedy generation, return (recorder, summary).

    With `continue_len` > 0, a second generate continues on the same cache with `continue_len` more
    prompt tokens (the multi-token path reading an existing state). With `aot`, the recorder sees the
    functional ATen graphs AOTAutograd makes with Inductor's decompositions (no placeholder sources).
    """
    torch._dynamo.reset()
    counters.clear()
    model = tiny_model(family, dtype=dtype, seed=0)
    recorder = GraphRecorder()
    backend = aot_autograd(fw_compiler=recorder, decompositions=select_decomp_table()) if aot else recorder
    model.forward = torch.compile(model.forward, backend=backend)
    input_ids, attention_mask = prompts(batch, prompt_len, seed=1, left_pad=3 if batch > 1 else 0)
    sequences, _, cache = greedy(model, input_ids, attention_mask, new_tokens, return_cache=True)
    if continue_len:
        more_ids, _ = prompts(batch, continue_len, seed=2)
        continue_greedy(model, sequences, attention_mask, cache, more_ids, new_tokens)
    summary = dict(
        graphs=len(recorder.graphs),
        compile_ids=[g["compile_id"] for g in recorder.graphs],
        graph_breaks=dict(counters["graph_break"]),
        unique_graphs=counters["stats"]["unique_graphs"],
    )
    return recorder, summary


def shorten(code):
    """Readable graph code (not runnable): `l_self_modules_model_modules_layers_modules_0_modules_mixer_
    parameters_A_log_` -> `<model.layers.0.mixer.A_log>`, Dynamo's `;  x = None` frees dropped."""
    def module_path(match):
        path = match.group(1).replace("_modules_", ".").replace("_parameters_", ".").replace("_buffers_", ".")
        return f"<{path.removeprefix('modules_')}>"

    code = re.sub(r"\bl?_?[lL]_self_(\w+?)_\b", module_path, code)
    return re.sub(r";  [^;\n]+ = None$", "", code, flags=re.MULTILINE)


def write(recorder, directory):
    """graph_<n>.py (exact code) and graph_<n>.short.py (shortened names) per recorded graph."""
    os.makedirs(directory, exist_ok=True)
    for index, graph in enumerate(recorder.graphs):
        header = f"# compile id {graph['compile_id']}\n# placeholders:\n"
        header += "".join(f"#   {line}\n" for line in graph["placeholders"])
        for suffix, code in (("", graph["code"]), (".short", shorten(graph["code"]))):
            with open(os.path.join(directory, f"graph_{index}{suffix}.py"), "w") as handle:
                handle.write(header + code)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"any of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=7)
    parser.add_argument("--continue-len", type=int, default=0, help="second generate on the same cache")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--aot", action="store_true", help="record AOTAutograd's functional ATen graphs")
    parser.add_argument("--out", default=None, help="directory for graph_<n>.py files")
    args = parser.parse_args(argv)
    for family in args.families or FAMILIES:
        recorder, summary = record(
            family, args.batch, args.new_tokens, args.prompt_len, getattr(torch, args.dtype), args.continue_len, args.aot
        )
        print(family, summary)
        if args.out:
            tag = (f"_cont{args.continue_len}" if args.continue_len else "") + ("_aot" if args.aot else "")
            write(recorder, os.path.join(args.out, f"{family}_b{args.batch}_{args.dtype}{tag}"))


if __name__ == "__main__":
    main()
