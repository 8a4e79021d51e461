"""Split precision: read-copy formats, stochastic rounding, and error that stays bounded while pure low-precision states drift."""
import os

import pytest
import torch

import replay_compile as rc
from replay_compile.families.base import Canonical, standard_step
from replay_compile.runtime import quant, rounding
from replay_compile.testing import random_canonical, rel_rms, token


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("name, tol", [("bf16", 4e-3), ("fp16", 5e-4), ("fp8", 4e-2), ("fp4", 0.15)])
def test_read_format_roundtrip(name, tol, layout):
    fmt = quant.read_format(name, layout)
    x = torch.randn(3, 4, 7, 37, dtype=torch.float64).float() * torch.logspace(-4, 2, 7)[:, None]  # odd R and C
    parts = fmt.quantize(x)
    store = fmt.alloc(x.shape, x.device)
    assert set(parts) == set(store) and all(parts[k].shape == store[k].shape for k in parts)
    for k in parts:  # what the state does: parts copied into the (possibly transposed) storage
        store[k].copy_(parts[k])
    y = fmt.dequantize(store, x.shape[-1])
    # the storage order changes no value: key-major 4-bit codes pair rows, value-major ones columns
    value_major = quant.read_format(name)
    assert torch.equal(y, value_major.dequantize(value_major.quantize(x), x.shape[-1]))
    assert y.shape == x.shape
    # per row relative error: scales are per row, so small rows are not drowned by large ones
    err = ((y - x).norm(dim=-1) / x.norm(dim=-1)).max()
    assert err <= tol, err


def test_fp4_grid_and_rounding_rule():
    fmt = quant.read_format("fp4")
    vals = torch.tensor(quant.FP4_VALUES + tuple(-v for v in quant.FP4_VALUES[1:]))
    x = torch.cat([vals, torch.zeros(16 - vals.numel())])[None] * 0.25  # one block; amax 6*0.25
    assert torch.equal(fmt.dequantize(fmt.quantize(x), 16), x)  # grid points are exact
    mid = torch.tensor([[0.25, 0.3, 0.75, 0.8, 5.0, 5.1, -2.5, 6.0] + [0.0] * 8])
    got = fmt.dequantize(fmt.quantize(mid), 16)[0, :8]
    assert got.tolist() == [0.0, 0.5, 0.5, 1.0, 4.0, 6.0, -2.0, 6.0]  # nearest, ties toward zero


def test_philox_matches_triton_randint():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton
    import triton.language as tl

    @triton.jit
    def draw(out, seed, N: tl.constexpr):
        off = tl.arange(0, N).to(tl.int64) + (1 << 33)  # offsets past 2**32 use the high counter word
        tl.store(out + tl.arange(0, N), tl.randint(seed, off))

    if not torch.cuda.is_available():
        seed = -0x1234_5678_9ABC_DEF
        out = torch.empty(64, dtype=torch.int32)
        draw[(1,)](out, seed, 64)
        ours = rounding.philox_randint(torch.tensor(seed), torch.arange(64) + (1 << 33))
        assert torch.equal(out.long() & 0xFFFFFFFF, ours)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_unbiased_reproducible_and_bracketing(dtype):
    x = torch.randn(1, 4096).float() * torch.logspace(-6, 3, 4096)  # includes fp16 subnormals
    seeds = torch.arange(200)
    r = torch.stack([rounding.stochastic_round(x, dtype, s.view(1)) for s in seeds]).float()
    assert torch.equal(r[0], rounding.stochastic_round(x, dtype, seeds[:1]).float())  # reproducible
    # every draw is one of the two representable neighbours of x: at most 2 values, within one spacing
    assert ((r == r.amax(0)) | (r == r.amin(0))).all()
    spacing = (x.to(dtype).float() - x).abs() * 2 + torch.finfo(dtype).smallest_normal * 2 ** -10
    assert ((r - x).abs() <= torch.maximum(spacing, x.abs() * torch.finfo(dtype).eps)).all()
    bias = (r.mean(0) - x).abs() / x.abs()
    rne = (x.to(dtype).float() - x).abs() / x.abs()
    assert bias.mean() < 0.25 * rne.mean()  # unbiased on average, far below round-to-nearest's error
    assert not torch.equal(rounding.stochastic_round(x, dtype, torch.tensor([1])),
                           rounding.stochastic_round(x, dtype, torch.tensor([2])))


def test_sr_checkpoint_is_reproducible_per_slot():
    fam = rc.get_family("mamba2")
    g = torch.Generator().manual_seed(2)
    x, state = random_canonical(fam, 3, heads=2, head_k=4, head_v=3, k_heads=1, tokens=9, dtype=torch.float32,
                                generator=g, layout="vk")
    outs = []
    for _ in range(2):
        rs = rc.ReplayState(state.clone().bfloat16(), fam, 4, layout="vk", k_heads=1, stochastic_rounding=True, seed=9)
        for t in range(9):
            rs.step(*token(x, t))
        outs.append(rs.materialize().clone())
    assert torch.equal(outs[0], outs[1])


def _drift_run(read_dtype, state_dtype, steps, fam_name="simple_gla"):
    """Relative output error vs float64 of replay with a read copy, and of a state stored in ``state_dtype``."""
    fam = rc.get_family(fam_name)
    g = torch.Generator().manual_seed(0)
    H, K, V = 2, 16, 16
    x, state = random_canonical(fam, 2, heads=H, head_k=K, head_v=V, k_heads=H, tokens=steps, dtype=torch.float64,
                                generator=g, long_memory=True)
    x = Canonical(x.q, x.k, x.v * 0.05, x.log_a, x.beta)
    exact = state.clone()
    pure = state.clone().to(state_dtype)
    rs = rc.ReplayState(state.float(), fam, 16, read_dtype=read_dtype)
    err_split, err_pure = [], []
    for t in range(steps):
        xt = token(x, t)
        o_ref, exact = standard_step(exact, xt, delta=fam.delta)
        o_pure, pure = standard_step(pure, xt, delta=fam.delta)
        o = rs.step(*(None if f is None else f.float() for f in xt))
        err_split.append(rel_rms(o, o_ref))
        err_pure.append(rel_rms(o_pure, o_ref))
    return torch.tensor(err_split), torch.tensor(err_pure)


def test_read_copy_error_stays_bounded_while_pure_state_drifts():
    """4096 steps, long-memory decays: a bf16 read copy's error stays flat; a bf16 state's grows."""
    split, pure = _drift_run("bf16", torch.bfloat16, 4096)
    early, late = slice(256, 512), slice(3840, 4096)
    assert split[late].mean() <= 1.5 * split[early].mean()  # flat in length
    assert pure[late].mean() >= 3 * pure[early].mean()      # the stored state drifts
    assert split[late].mean() * 10 <= pure[late].mean()
