"""Tiny random-weight transformers hybrid models (no download) for end-to-end tests.

Why: issue 5 compiles real transformers decoders with the `replayssm` backend. The checks need models
that build in milliseconds on CPU, keep every code path of the full-size model (linear-recurrent and
attention layers interleaved, grouped heads, Mamba-2 groups, untied embeddings) and are deterministic
given a seed. Sizes are small but not degenerate: grouped heads really repeat (GDN 2 qk / 4 v heads,
Mamba-2 4 heads in 2 groups), head dims differ between k and v where the model allows it, and the
recurrent head dims are not powers of two where the model allows it, so layout mix-ups show up as shape
errors or wrong numbers instead of passing by symmetry.

Keys of `BUILDERS` are the family names of issue 5; `model_type` of the resulting config is the exact
transformers name (Qwen3.5's text-only decoder is `qwen3_5_text`, built with `Qwen3_5ForCausalLM`).
Dense MLPs are used where the config allows it (mixture-of-experts blocks are not what we compile);
MiniMax has no dense option, so its tiny model keeps a 4-expert MoE.

Requires transformers 5.x (written against 5.17.0).
"""

import torch
import transformers

from replay_compile.bench.model import bind_torch_paths

VOCAB = 96
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

# Raised from the configs' 0.02 so logits are far from uniform: greedy tokens of random
# models are then less likely to tie, which keeps token-equality checks meaningful.
INIT_RANGE = 0.2


def _common(**overrides):
    base = dict(
        vocab_size=VOCAB,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        use_cache=True,
    )
    base.update(overrides)
    return base


def mamba2_config(**overrides):
    """Pure Mamba-2 (no attention): 4 heads x head_dim 6 x state 10, 2 groups, 2 layers.
    State [B, 4, 6, 10] = [B, H, P, N]."""
    kw = _common(
        hidden_size=12,  # expand 2 -> intermediate 24 = num_heads * head_dim
        num_heads=4,
        head_dim=6,
        state_size=10,
        n_groups=2,
        expand=2,
        conv_kernel=4,
        num_hidden_layers=2,
        chunk_size=8,
        initializer_range=0.1,
        time_step_max=1.0,  # see _state_reaches_logits
    )
    kw.update(overrides)
    return transformers.Mamba2Config(**kw)


def nemotron_h_config(**overrides):
    """Nemotron-H: Mamba-2 / attention / Mamba-2 / MLP blocks (one mixer per block, like the real
    model). Mamba-2 4 heads x 6 x state 10, 2 groups; attention 4 q / 2 kv heads of 8."""
    kw = _common(
        hidden_size=32,
        layers_block_type=["mamba", "attention", "mamba", "mlp"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        mamba_num_heads=4,
        mamba_head_dim=6,
        ssm_state_size=10,
        n_groups=2,
        expand=1,  # Nemotron-H sizes the mixer from mamba_num_heads * mamba_head_dim, not expand
        conv_kernel=4,
        chunk_size=8,
        use_mamba_kernels=False,
        # The mixer clamps dt >= time_step_min in its chunked (prefill) path but not in its one-token
        # decode step, so the two paths disagree whenever softplus(dt + dt_bias) < time_step_min
        # (seen: 2% state error at the default 1e-3). A tiny minimum keeps the paths consistent
        # (and draws some slow-decay heads at init, where replay precision matters most).
        time_step_min=1e-6,
        time_step_max=1.0,  # see _state_reaches_logits
    )
    kw.update(overrides)
    return transformers.NemotronHConfig(**kw)


def _gdn_hybrid(**extra):
    """GDN, GDN, GDN, attention (the real 3:1 pattern). GDN 2 qk heads of 6, 4 v heads of 10: grouped heads
    (repeat_interleave by 2) and K != V; attention 4 q / 2 kv heads of 8."""
    return _common(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=6,
        linear_value_head_dim=10,
        linear_conv_kernel_dim=4,
        **extra,
    )


def qwen3_next_config(**overrides):
    """Qwen3-Next (:func:`_gdn_hybrid`) with dense MLPs in every layer."""
    return transformers.Qwen3NextConfig(**{**_gdn_hybrid(mlp_only_layers=[0, 1, 2, 3]), **overrides})


def qwen3_5_config(**overrides):
    """Qwen3.5 text decoder (model_type `qwen3_5_text`, :func:`_gdn_hybrid`); dense MLPs."""
    return transformers.Qwen3_5TextConfig(**{**_gdn_hybrid(), **overrides})


def kimi_linear_config(**overrides):
    """Kimi-Linear: KDA, KDA, MLA attention (dense MLPs). KDA 2 heads of 10 (K = V in this model)."""
    kw = _common(
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "dense", "dense"],
        linear_attn_config=dict(head_dim=10, num_heads=2, short_conv_kernel_size=4),
    )
    kw.update(overrides)
    return transformers.KimiLinearConfig(**kw)


def minimax_config(**overrides):
    """MiniMax-01: attention, lightning (linear) attention, attention, lightning; 4-expert MoE MLPs.
    Lightning state [B, 4, 8, 8] = [B, H, K, V] (K = V = head_dim in this model)."""
    kw = _common(
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        block_size=8,
        layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"],
    )
    kw.update(overrides)
    return transformers.MiniMaxConfig(**kw)


BUILDERS = {
    "mamba2": (mamba2_config, "Mamba2ForCausalLM"),
    "nemotron_h": (nemotron_h_config, "NemotronHForCausalLM"),
    "qwen3_next": (qwen3_next_config, "Qwen3NextForCausalLM"),
    "qwen3_5": (qwen3_5_config, "Qwen3_5ForCausalLM"),
    "kimi_linear": (kimi_linear_config, "KimiLinearForCausalLM"),
    "minimax": (minimax_config, "MiniMaxForCausalLM"),
}
FAMILIES = tuple(BUILDERS)

MODELING_MODULES = [f"transformers.models.{f}.modeling_{f}" for f in FAMILIES]


# The models run their torch code: transformers binds a recurrence to flash-linear-attention / mamba_ssm
# kernels when they are importable (the GPU machine has fla), at module import, and an opaque kernel has no
# recurrence for the backend to rewrite. If a modeling module was imported before, a library kernel in use
# shows up as a missing rewrite in test_generate_replay.
bind_torch_paths(MODELING_MODULES)


def tiny_config(family, **overrides):
    """Config of the tiny model for `family` (a key of BUILDERS); overrides go to the config class."""
    make_config, _ = BUILDERS[family]
    return make_config(**overrides)


def tiny_model(family, dtype=torch.float32, seed=0, **overrides):
    """Random-weight tiny causal LM for `family`, in eval mode, weights in `dtype`.

    Weights are drawn on CPU in float32 with `torch.manual_seed(seed)` (so a seed gives the same model
    in every dtype), then cast.
    """
    config = tiny_config(family, **overrides)
    model_class = getattr(transformers, BUILDERS[family][1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    _state_reaches_logits(model)
    return model.to(dtype).eval()


# Mamba-2 skip weight D after init: 1.0 in transformers' init.
MAMBA_SKIP_SCALE = 0.1


def _state_reaches_logits(model):
    """Make the Mamba-2 state matter for the logits, so a wrong recurrence cannot pass a logit check.

    With transformers' init (D = 1, dt <= 0.1) the skip term D * x swamps the state read C^T S: a
    random 1e-3 relative error in every Mamba-2 state moved the logits by only ~5e-5 of their scale,
    below the tolerances of the end-to-end tests. Larger steps (time_step_max = 1 in the configs)
    and D scaled by MAMBA_SKIP_SCALE bring that to ~1e-3, like the GDN/KDA models.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mixer.D"):
                param.mul_(MAMBA_SKIP_SCALE)


def prompts(batch, length, seed=0, left_pad=0):
    """Random prompt ids [batch, length] avoiding special ids, and its attention mask.

    With `left_pad` > 0, row i (for i >= 1) gets `min(i, left_pad)` left padding tokens (row 0 none), so
    rows have distinct real lengths, as `generate` sees in batched serving.
    """
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        pad = min(row, left_pad)
        input_ids[row, :pad] = PAD_ID
        attention_mask[row, :pad] = 0
    return input_ids, attention_mask


def greedy(model, input_ids, attention_mask, new_tokens, return_cache=False, **kwargs):
    """Greedy generation returning (sequences, per-step logits [steps, B, vocab][, cache]).

    To continue on a cache, use `continue_greedy`.
    """
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=PAD_ID,
        **kwargs,
    )
    if return_cache:
        return out.sequences, torch.stack(out.logits), out.past_key_values
    return out.sequences, torch.stack(out.logits)


def continue_greedy(model, sequences, prompt_mask, cache, more_ids, new_tokens):
    """Second greedy generation on the cache returned with `sequences`, after appending `more_ids`.

    `prompt_mask` is the attention mask of the first prompt (left padding); generated and appended
    tokens are real tokens.

    The last token of `sequences` was sampled but never fed, so the model must consume it plus
    `more_ids` as one multi-token step on top of the cached state. Hybrids take the whole sequence
    with `past_key_values=cache` (generate slices off the cached part). Mamba-2 names its cache
    `cache_params`, which generate's slicing does not see: it must get only the uncached tail, or it
    re-feeds the whole sequence on top of the state (wrong logits, no error).
    Returns (sequences, per-step logits) of the continuation.
    """
    full = torch.cat([sequences, more_ids], dim=1)
    mask = torch.ones_like(full)
    mask[:, : prompt_mask.shape[1]] = prompt_mask
    if model.config.model_type == "mamba2":
        tail = slice(sequences.shape[1] - 1, None)
        return greedy(model, full[:, tail], mask[:, tail], new_tokens, cache_params=cache)
    return greedy(model, full, mask, new_tokens, past_key_values=cache)


def recurrent_states(cache):
    """{layer_idx: state tensor} of every linear-recurrent layer in a transformers cache.

    Hybrid caches (`DynamicCache` with `LinearAttentionLayer`s) keep the state in
    `cache.layers[i].recurrent_states[0]`; `MiniMaxCache` keeps it in `cache.linear_cache[i]`
    (an empty list for attention layers).
    """
    if hasattr(cache, "linear_cache"):
        return {i: s for i, s in enumerate(cache.linear_cache) if isinstance(s, torch.Tensor)}
    states = {}
    for i, layer in enumerate(cache.layers):
        held = getattr(layer, "recurrent_states", {}).get(0)
        if held is not None:
            states[i] = held
    return states
