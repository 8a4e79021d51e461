"""ReplayOptions: every option of the agreed API validated, with errors that name the option."""
import dataclasses

import pytest
import torch

from replay_compile.options import ReplayOptions

AGREED_DEFAULTS = dict(window=16, checkpoint_dtype="float32", read_dtype=None, stochastic_rounding=False,
                       families=None, min_batch=None, strict=False, inductor=True, fuel=None,
                       speculative=False, validate=True, kernels="auto", verify_form="auto", mode=None)


def test_defaults_are_the_agreed_api():
    assert ReplayOptions.from_dict(None).as_dict() == AGREED_DEFAULTS
    assert ReplayOptions.from_dict({}) == ReplayOptions.defaults() == ReplayOptions()


def test_unknown_key_lists_known_ones():
    with pytest.raises(ValueError) as e:
        ReplayOptions.from_dict({"windw": 8})
    msg = str(e.value)
    assert "'windw'" in msg
    for name in AGREED_DEFAULTS:
        assert name in msg


def test_not_a_dict():
    with pytest.raises(ValueError, match="must be a dict"):
        ReplayOptions.from_dict([("window", 4)])


GOOD = [
    ("window", 1, 1), ("window", 37, 37),
    ("checkpoint_dtype", "bfloat16", "bfloat16"), ("checkpoint_dtype", "float16", "float16"),
    ("checkpoint_dtype", torch.float16, "float16"), ("checkpoint_dtype", "fp32", "float32"),
    ("read_dtype", "bf16", "bf16"), ("read_dtype", "fp16", "fp16"), ("read_dtype", "fp8", "fp8"),
    ("read_dtype", "fp4", "fp4"), ("read_dtype", "none", None), ("read_dtype", None, None),
    ("families", ["gdn", "mamba2"], ("gated_deltanet", "mamba2")), ("families", ("kda",), ("kda",)),
    ("families", None, None),
    ("min_batch", 8, 8), ("min_batch", None, None), ("fuel", 0, 0), ("fuel", 3, 3), ("fuel", None, None),
    ("strict", True, True), ("inductor", False, False), ("speculative", True, True),
    ("validate", False, False), ("kernels", "torch", "torch"), ("kernels", "triton", "triton"),
    ("mode", "reduce-overhead", "reduce-overhead"), ("mode", "max-autotune", "max-autotune"), ("mode", None, None),
    ("verify_form", "tokens", "tokens"), ("verify_form", "chunked:dot=bf16x3,nw=1", "chunked:dot=bf16x3,nw=1"),
]


@pytest.mark.parametrize("name,value,stored", GOOD)
def test_accepts_and_normalises(name, value, stored):
    assert getattr(ReplayOptions.from_dict({name: value}), name) == stored


BAD = [
    ("window", 0, "int >= 1"), ("window", -3, "int >= 1"), ("window", 2.0, "int >= 1"),
    ("window", True, "int >= 1"), ("window", None, "int >= 1"), ("window", "16", "int >= 1"),
    ("checkpoint_dtype", "float64", "'float32', 'bfloat16', 'float16'"),
    ("checkpoint_dtype", torch.float64, "'float32'"), ("checkpoint_dtype", None, "'float32'"),
    ("read_dtype", "int8", "'bf16', 'fp16', 'fp8', 'fp4' or None"), ("read_dtype", torch.bfloat16, "'fp8'"),
    ("stochastic_rounding", 1, "True or False"), ("stochastic_rounding", None, "True or False"),
    ("families", "gla", "list of registered family names"), ("families", [3], "list of registered"),
    ("families", ["no_such_family"], "unknown recurrence family 'no_such_family'"), ("families", [], "empty"),
    ("min_batch", 0, "int >= 1 or None"), ("min_batch", 1.5, "int >= 1 or None"),
    ("strict", "yes", "True or False"), ("inductor", 0, "True or False"),
    ("fuel", -1, "int >= 0 or None"), ("fuel", False, "int >= 0 or None"),
    ("speculative", None, "True or False"), ("validate", "False", "True or False"),
    ("kernels", "cuda", "'auto', 'torch', 'triton'"), ("kernels", None, "'auto'"),
    ("mode", "fast", "'reduce-overhead'"), ("mode", 1, "None or one of"),
    ("verify_form", "chunky", "'auto', 'tokens' or 'chunked[:k=v,...]'"), ("verify_form", 3, "is a string"),
    ("verify_form", "chunked:dot=bf16x4", "product forms"),
]


@pytest.mark.parametrize("name,value,allowed", BAD)
def test_rejects_with_option_name_and_allowed_values(name, value, allowed):
    with pytest.raises(ValueError) as e:
        ReplayOptions.from_dict({name: value})
    assert repr(name) in str(e.value) and allowed in str(e.value)


def test_every_agreed_option_is_checked():
    """Each option has at least one accepted and one rejected value above."""
    names = set(AGREED_DEFAULTS)
    assert {n for n, *_ in BAD} == names
    assert {n for n, *_ in GOOD} | {"stochastic_rounding"} == names


def test_stochastic_rounding_needs_16_bit_checkpoint():
    with pytest.raises(ValueError, match="stochastic_rounding.*16-bit"):
        ReplayOptions.from_dict({"stochastic_rounding": True})
    o = ReplayOptions.from_dict({"stochastic_rounding": True, "checkpoint_dtype": "bfloat16"})
    assert o.stochastic_rounding and o.checkpoint_torch_dtype == torch.bfloat16


def test_frozen_and_direct_construction_validates():
    o = ReplayOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.window = 4
    with pytest.raises(ValueError, match="'window'"):
        ReplayOptions(window=0)
    with pytest.raises(ValueError, match="'kernels'"):
        o.replace(kernels="cuda")
    assert o.replace(window=4).window == 4 and o.window == 16


def test_key_is_stable_and_covers_every_option():
    a = ReplayOptions.from_dict({"families": ["mamba2", "gdn"], "window": 8})
    b = ReplayOptions.from_dict({"window": 8, "families": ["gated_deltanet", "mamba2", "gdn"]})
    assert a == b and a.key() == b.key() and hash(a) == hash(b)
    base = ReplayOptions()
    changes = dict(window=4, checkpoint_dtype="float16", read_dtype="fp8", families=["gla"], min_batch=2,
                   strict=True, inductor=False, fuel=1, speculative=True, validate=False, kernels="torch",
                   mode="reduce-overhead")
    keys = {base.key()}
    for name, value in changes.items():
        keys.add(base.replace(**{name: value}).key())
    keys.add(base.replace(checkpoint_dtype="bfloat16", stochastic_rounding=True).key())
    assert len(keys) == len(changes) + 2
    for name in AGREED_DEFAULTS:
        assert f"{name}=" in base.key()


def test_mode_needs_inductor_and_agrees_with_torch_compile():
    from replay_compile.backend import inductor_mode
    with pytest.raises(ValueError, match="'mode'.*inductor=True"):
        ReplayOptions.from_dict({"mode": "reduce-overhead", "inductor": False})
    opts = ReplayOptions.from_dict({"mode": "reduce-overhead", "window": 8})
    assert inductor_mode(None, opts) == inductor_mode("reduce-overhead", opts) == "reduce-overhead"
    with pytest.raises(ValueError, match="disagree"):
        inductor_mode("max-autotune", opts)
    with pytest.raises(ValueError, match="needs inductor=True"):
        inductor_mode("reduce-overhead", ReplayOptions.from_dict({"inductor": False}))


def test_family_enabled_resolves_aliases():
    o = ReplayOptions.from_dict({"families": ["gdn"]})
    assert o.family_enabled("gated_deltanet") and o.family_enabled("gdn") and not o.family_enabled("mamba2")
    assert ReplayOptions().family_enabled("kda")


@pytest.mark.parametrize("device,batch,heads,options,route", [
    ("cuda", 7, 64, dict(), "standard"),           # 448 head rows: far below replay's break-even (delta rule)
    ("cuda", 64, 64, dict(), "standard"),          # 4096 head rows at L = 16: not yet (NOTE [cost model])
    ("cuda", 64, 64, dict(window=8), "replay"),    # 4096 head rows at L = 8: replay pays off
    ("cuda", 128, 64, dict(), "replay"),           # 8192 at L = 16
    ("cuda", 7, 64, dict(min_batch=2), "replay"),  # the user's threshold replaces the cost model
    ("cuda", 7, 64, dict(speculative=True), "replay"),  # commit needs the replay form whatever the batch
    ("cpu", 7, 64, dict(), "replay"),              # measured on the GPU only
])
def test_cost_model_route(device, batch, heads, options, route):
    from types import SimpleNamespace

    from replay_compile.passes import _route
    site = SimpleNamespace(sizes={"b": batch, "h": heads}, tokens=1, read_old=False, delta=True, name="state")
    state = SimpleNamespace(meta={"example_value": SimpleNamespace(device=torch.device(device))})
    assert _route(site, state, ReplayOptions(**options)) == route


@pytest.mark.parametrize("batch,delta,options,rejected", [
    (1, False, dict(min_batch=2), "min_batch=2"),  # the user's threshold
    (7, False, dict(), "original graph"),           # cost model: Inductor's graph wins at tiny batch
    (7, True, dict(), None),                        # delta rule: the standard route wins (NOTE [cost model])
    (8, False, dict(), None),
    (7, False, dict(speculative=True), None),       # only replay commits
])
def test_small_batches_left_alone(batch, delta, options, rejected):
    from types import SimpleNamespace

    from replay_compile.passes import Rejected, _policy
    site = SimpleNamespace(sizes={"b": batch, "h": 64}, tokens=1, delta=delta)
    state = SimpleNamespace(meta={"example_value": SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)})
    if rejected:
        with pytest.raises(Rejected, match=rejected):
            _policy(site, state, ReplayOptions(**options), n_accepted=0)
    else:
        _policy(site, state, ReplayOptions(**options), n_accepted=0)
