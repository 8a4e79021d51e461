"""The decode-graph facts docs/MODEL_SPELLINGS.md states, checked on the graphs Dynamo really produces.

The `replayssm` pass codes against these facts (state placeholder sources, write-back by `copy_` or by
returning the new state, conv states as look-alike decoys, graph counts, no graph breaks); a
transformers upgrade that changes any of them must fail here, not silently in the pass. The recording
backend runs each graph as is, so the compiled generation must also match eager exactly.
One family (mamba2) runs in the default suite; the rest are `slow` (3 graphs of ~500-1700 lines to
trace each: 10-70 s on a loaded 2-core CPU).
"""

import pytest
import torch

pytest.importorskip("transformers")

from record_graphs import record  # noqa: E402
from tiny import greedy, prompts, tiny_model  # noqa: E402

BATCH = 4

# family: (graphs, state source template, linear layers, state shape at batch 4, write-back)
EXPECTED = {
    "mamba2": (2, "L['cache_params'].layers[{}].recurrent_states[0]", [0, 1], (4, 4, 6, 10), "copy_"),
    "nemotron_h": (3, "L['kwargs']['past_key_values'].layers[{}].recurrent_states[0]", [0, 2], (4, 4, 6, 10), "copy_"),
    "qwen3_next": (3, "L['kwargs']['past_key_values'].layers[{}].recurrent_states[0]", [0, 1, 2], (4, 4, 6, 10), "copy_"),
    "qwen3_5": (3, "L['kwargs']['past_key_values'].layers[{}].recurrent_states[0]", [0, 1, 2], (4, 4, 6, 10), "copy_"),
    "kimi_linear": (3, "L['kwargs']['past_key_values'].layers[{}].recurrent_states[0]", [0, 1], (4, 2, 10, 10), "copy_"),
    "minimax": (3, "L['kwargs']['past_key_values'].linear_cache[{}]", [1, 3], (4, 4, 8, 8), "output"),
}
FAST = {"mamba2"}  # cheapest to compile; the hybrids run under `-m slow`


def family_params():
    return [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in EXPECTED]


def placeholder_by_source(graph, source):
    names = [name for name, src in graph["sources"].items() if src == source]
    assert len(names) == 1, f"{source} not a placeholder of graph {graph['compile_id']}"
    return next(n for n in graph["gm"].graph.find_nodes(op="placeholder") if n.name == names[0])


def copy_writes(node):
    return [user for user in node.users if user.op == "call_method" and user.target == "copy_" and user.args[0] is node]


def ancestors(node):
    seen, stack = set(), [node]
    while stack:
        for parent in stack.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


@pytest.fixture(scope="module")
def recordings():
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = record(family, batch=BATCH, new_tokens=3, prompt_len=7)
        return cache[family]

    return get


@pytest.mark.parametrize("family", family_params())
def test_graph_count_and_no_graph_breaks(recordings, family):
    recorder, summary = recordings(family)
    assert summary["graph_breaks"] == {}
    assert summary["graphs"] == EXPECTED[family][0]


@pytest.mark.parametrize("family", family_params())
def test_decode_state_placeholders_and_write_back(recordings, family):
    recorder, _ = recordings(family)
    _, template, layers, shape, write_back = EXPECTED[family]
    decode = recorder.graphs[-1]
    outputs = decode["gm"].graph.find_nodes(op="output")[0].args[0]
    for layer in layers:
        state = placeholder_by_source(decode, template.format(layer))
        assert tuple(state.meta["example_value"].shape) == shape
        assert state.meta["example_value"].dtype == torch.float32
        assert state.name not in decode["static"]  # created inside the compiled prefill: not marked
        writes = copy_writes(state)
        if write_back == "copy_":
            assert len(writes) == 1 and state in ancestors(writes[0].args[1])
            conv = placeholder_by_source(decode, template.format(layer).replace("recurrent_states", "conv_states"))
            assert len(copy_writes(conv)) == 1  # the look-alike decoy is there too
        else:
            assert writes == [] and any(state in ancestors(out) for out in outputs)


@pytest.mark.parametrize("family", family_params())
def test_prefill_graph_has_no_state_input(recordings, family):
    recorder, _ = recordings(family)
    _, template, layers, _, _ = EXPECTED[family]
    prefill_sources = set(recorder.graphs[0]["sources"].values())
    assert not any(template.format(layer) in prefill_sources for layer in layers)


@pytest.mark.parametrize("family", family_params())
def test_recorded_generation_matches_eager(family):
    """Dynamo's replay of cache side effects (lazy state creation, list assignment) keeps eager results."""
    input_ids, attention_mask = prompts(BATCH, 7, seed=3, left_pad=3)
    eager_model = tiny_model(family, seed=5)
    expected_seq, expected_logits = greedy(eager_model, input_ids, attention_mask, 3)
    torch._dynamo.reset()
    compiled_model = tiny_model(family, seed=5)
    compiled_model.forward = torch.compile(compiled_model.forward, backend="eager")
    seq, logits = greedy(compiled_model, input_ids, attention_mask, 3)
    assert torch.equal(seq, expected_seq)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
