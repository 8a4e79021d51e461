"""Eager checks of the tiny transformers hybrids (tests/models/tiny.py), fp32, CPU.

These pin down the ground truth the compiled runs of issue 5 are compared against, so each check is
one that a broken model or cache path fails:
- cached greedy decode (prefill through the chunked path, then one-token recurrent steps) gives the
  same logits as a cache-free forward over the whole sequence (chunked path only);
- a left-padded batch of 4 gives, row by row, the logits of each prompt run alone at batch 1;
- every linear-recurrent layer leaves an fp32 state of the documented shape in the cache.
"""

import pytest
import torch

pytest.importorskip("transformers")

from tiny import FAMILIES, continue_greedy, greedy, prompts, recurrent_states, tiny_model  # noqa: E402

NEW_TOKENS = 4
PROMPT_LEN = 7
ATOL = 2e-4  # fp32 chunked scan vs recurrent step: reassociation only

# Expected linear-recurrent layers and state shape per family at batch 1 (see docs/MODEL_SPELLINGS.md):
# Mamba-2 [B, H, P, N] (head_dim P = value side, state N = key side), GDN/KDA/lightning [B, H, K, V].
EXPECTED_STATES = {
    "mamba2": ([0, 1], (1, 4, 6, 10)),
    "nemotron_h": ([0, 2], (1, 4, 6, 10)),
    "qwen3_next": ([0, 1, 2], (1, 4, 6, 10)),
    "qwen3_5": ([0, 1, 2], (1, 4, 6, 10)),
    "kimi_linear": ([0, 1], (1, 2, 10, 10)),
    "minimax": ([1, 3], (1, 4, 8, 8)),
}


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    return request.param, tiny_model(request.param, seed=1234)


def full_forward_logits(model, sequences, attention_mask, steps):
    """Logits of the last `steps` positions from one cache-free forward over `sequences`."""
    with torch.no_grad():
        logits = model(input_ids=sequences, attention_mask=attention_mask, use_cache=False).logits
    return logits[:, -steps - 1 : -1].transpose(0, 1)


def test_config_is_tiny_untied_hybrid(family_model):
    family, model = family_model
    config = model.config
    assert config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) < 200_000
    if family != "mamba2":
        assert {"linear_attention", "full_attention"} <= set(config.layer_types)


def test_greedy_batch1_matches_cache_free_forward(family_model):
    family, model = family_model
    input_ids, attention_mask = prompts(1, PROMPT_LEN, seed=11)
    sequences, step_logits = greedy(model, input_ids, attention_mask, NEW_TOKENS)
    assert sequences.shape == (1, PROMPT_LEN + NEW_TOKENS)
    assert step_logits.shape == (NEW_TOKENS, 1, model.config.vocab_size)
    reference = full_forward_logits(model, sequences, torch.ones_like(sequences), NEW_TOKENS)
    torch.testing.assert_close(step_logits, reference, atol=ATOL, rtol=ATOL)


def test_greedy_batch4_left_padded_matches_rows_alone(family_model):
    family, model = family_model
    input_ids, attention_mask = prompts(4, PROMPT_LEN, seed=12, left_pad=3)
    sequences, step_logits = greedy(model, input_ids, attention_mask, NEW_TOKENS)
    assert sequences.shape == (4, PROMPT_LEN + NEW_TOKENS)
    assert attention_mask.sum(1).tolist() == [7, 6, 5, 4]
    for row in (0, 3):  # unpadded and most padded (rows 1, 2 add little but cost time)
        real = attention_mask[row].bool()
        alone_ids = input_ids[row, real][None]
        alone_seq, alone_logits = greedy(model, alone_ids, torch.ones_like(alone_ids), NEW_TOKENS)
        assert torch.equal(sequences[row, PROMPT_LEN:], alone_seq[0, alone_ids.shape[1] :])
        torch.testing.assert_close(step_logits[:, row], alone_logits[:, 0], atol=ATOL, rtol=ATOL)


def test_recurrent_states_are_fp32_with_documented_shape(family_model):
    family, model = family_model
    input_ids, attention_mask = prompts(1, PROMPT_LEN, seed=13)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=2,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    states = recurrent_states(out.past_key_values)
    layers, shape = EXPECTED_STATES[family]
    assert sorted(states) == layers
    for state in states.values():
        assert state.shape == shape and state.dtype == torch.float32
        assert state.abs().sum() > 0


def test_continue_on_cache_matches_fresh_generation(family_model):
    """A second generate on the returned cache (multi-token step reading the state) equals one
    fresh generate over the whole sequence (batch 4, left padded)."""
    family, model = family_model
    input_ids, attention_mask = prompts(4, PROMPT_LEN, seed=14, left_pad=3)
    sequences, _, cache = greedy(model, input_ids, attention_mask, NEW_TOKENS, return_cache=True)
    more_ids, _ = prompts(4, 5, seed=15)
    continued, continued_logits = continue_greedy(model, sequences, attention_mask, cache, more_ids, NEW_TOKENS)
    full = torch.cat([sequences, more_ids], dim=1)
    full_mask = torch.cat([attention_mask, torch.ones_like(full[:, attention_mask.shape[1] :])], dim=1)
    fresh, fresh_logits = greedy(model, full, full_mask, NEW_TOKENS)
    torch.testing.assert_close(continued_logits, fresh_logits, atol=ATOL, rtol=ATOL)
    assert torch.equal(continued[:, -NEW_TOKENS:], fresh[:, -NEW_TOKENS:])
