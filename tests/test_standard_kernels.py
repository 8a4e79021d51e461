"""The standard fused decode kernel and the snapshot baseline against the families' float64 math.

On the CPU the Triton kernels run under the interpreter (tiny odd shapes); the ``gpu`` tests repeat
the checks at real layer shapes and capture a decode loop in a CUDA graph.
"""
import pytest
import torch

from conftest import DEVICE
from replay_compile.families import get_family, standard_scan
from replay_compile.families import standard_step as reference_step
from replay_compile.families.base import Canonical
from replay_compile.templates.snapshot import snapshot_commit, snapshot_table, snapshot_verify
from replay_compile.templates.standard import default_block_v, default_num_warps, standard_step
from replay_compile.testing import StandardPool, poisoned_like, random_canonical, rel_rms

FAMILIES = ["simple_gla", "gla", "deltanet", "gated_deltanet", "kda", "mamba2"]
TOL = 2e-5  # fp32 kernel against float64 math


def _draw(name, batch, heads, head_k, head_v, k_heads, layout, tokens=None, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(1 << 30, ())))
    return random_canonical(get_family(name), batch, heads, head_k, head_v, k_heads, tokens=tokens,
                            generator=g, layout=layout)


def _to(x: Canonical, dtype=torch.float32, device=DEVICE) -> Canonical:
    return Canonical(*(None if f is None else f.to(device=device, dtype=dtype) for f in x))


def _kernel_step(state, x, fam, layout, **kw):
    return standard_step(state, *x, delta=fam.delta, decay=fam.decay, layout=layout, **kw)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("name", FAMILIES)
def test_standard_step_matches_float64(name, layout):
    """Odd dims, grouped heads, a value axis split over several programs, padding rows and a larger pool."""
    fam = get_family(name)
    B, Hv, Hk, K, V, N = 4, 4, 2, 5, 7, 6
    x, _ = _draw(name, B, Hv, K, V, Hk, layout)
    _, pool = _draw(name, N, Hv, K, V, Hk, layout)
    slots = torch.tensor([4, -1, 0, 3])
    live = slots >= 0
    x = Canonical(*(None if f is None else f.clone() for f in x))
    for f in x:
        if f is not None:
            f[~live] = float("nan")  # padding rows may carry garbage
    o_ref, s_ref = reference_step(pool[slots[live]], Canonical(*(None if f is None else f[live] for f in x)),
                                  delta=fam.delta, layout=layout)

    state = pool.to(device=DEVICE, dtype=torch.float32)
    untouched = [1, 2, 5]
    state[untouched] = float("nan")  # slots no row addresses must be neither read nor written
    out = poisoned_like(torch.empty(B, Hv, V, device=DEVICE))
    o = _kernel_step(state, _to(x), fam, layout, slots=slots.to(DEVICE), out=out, block_v=2)

    assert o.data_ptr() == out.data_ptr()
    assert rel_rms(o[live], o_ref) < TOL
    assert torch.equal(o[~live].cpu(), torch.zeros_like(o[~live].cpu()))
    assert rel_rms(state[slots[live]], s_ref) < TOL
    assert torch.isnan(state[untouched]).all()


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2"])
def test_standard_steps_follow_the_scan(name, layout):
    """Several tokens in a row (the state written by one step is read by the next), default tiling."""
    fam = get_family(name)
    B, Hv, Hk, K, V, T = 3, 2, 1, 6, 5, 4
    xs, s0 = _draw(name, B, Hv, K, V, Hk, layout, tokens=T)
    o_ref, s_ref = standard_scan(s0.clone(), xs, delta=fam.delta, layout=layout)
    state = s0.to(device=DEVICE, dtype=torch.float32)
    for t in range(T):
        o = _kernel_step(state, _to(Canonical(*(None if f is None else f[:, t] for f in xs))), fam, layout)
        assert rel_rms(o, o_ref[:, t]) < TOL
    assert rel_rms(state, s_ref) < TOL


def test_standard_step_without_slots_and_int32_slots():
    """slots=None addresses rows 0..B-1 of a larger pool; int32 slot tensors work like int64."""
    fam = get_family("gated_deltanet")
    x, _ = _draw("gated_deltanet", 2, 2, 4, 3, 1, "vk")
    _, pool = _draw("gated_deltanet", 4, 2, 4, 3, 1, "vk")
    o_ref, s_ref = reference_step(pool[:2].clone(), x, delta=True, layout="vk")
    for slots in (None, torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)):
        state = pool.to(device=DEVICE, dtype=torch.float32)
        state[2:] = float("nan")
        o = _kernel_step(state, _to(x), fam, "vk", slots=slots)
        assert rel_rms(o, o_ref) < TOL and rel_rms(state[:2], s_ref) < TOL
        assert torch.isnan(state[2:]).all()
    with pytest.raises(ValueError, match="pass slots"):
        _kernel_step(pool[:1].float(), _to(x, device="cpu"), fam, "vk")


@pytest.mark.parametrize("state_dtype", [torch.float64, torch.bfloat16])
def test_standard_step_state_dtypes(state_dtype):
    """fp64 states compute in fp64; a bf16 state is read and written in bf16 around fp32 arithmetic."""
    fam = get_family("kda")
    x, s0 = _draw("kda", 2, 2, 3, 4, 1, "kv")
    state = s0.to(device=DEVICE, dtype=state_dtype)
    o_ref, s_ref = reference_step(state.double().cpu(), x, delta=True, layout="kv")
    o = _kernel_step(state, _to(x, torch.float64 if state_dtype == torch.float64 else torch.bfloat16), fam, "kv")
    tol = 1e-12 if state_dtype == torch.float64 else 2e-2
    assert o.dtype == (torch.float64 if state_dtype == torch.float64 else torch.float32)
    assert rel_rms(o, o_ref) < tol and rel_rms(state, s_ref) < tol


def test_standard_step_rejects_mismatched_inputs():
    fam = get_family("mamba2")
    x, s0 = _draw("mamba2", 2, 2, 3, 4, 1, "vk")
    with pytest.raises(ValueError, match="log_a/beta"):
        standard_step(s0.float(), x.q.float(), x.k.float(), x.v.float(), None, None, delta=False, decay="scalar",
                      layout="vk")
    with pytest.raises(ValueError, match="out must be"):
        _kernel_step(s0.float(), _to(x, device="cpu"), fam, "vk", out=torch.empty(2, 2, 5))


@pytest.mark.parametrize("K,V,pairs,bv", [(128, 64, 256 * 128, 64), (128, 80, 256 * 96, 16), (128, 128, 2 * 64, 32),
                                          (128, 128, 1 * 32, 16), (256, 128, 4096, 32), (5, 3, 8, 4)])
def test_default_tiling(K, V, pairs, bv):
    """No masked value lanes where V allows it, tiles of <= 8K elements, a grid that covers the GPU."""
    assert default_block_v(K, V, pairs) == bv
    assert 1 <= default_num_warps(triton_next_pow2(K), bv) <= 2


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("name", ["simple_gla", "gated_deltanet", "kda"])
def test_snapshot_verify_and_commit(name, layout):
    """Two rounds of verify T drafts + commit random acceptances against the standard pool oracle."""
    fam = get_family(name)
    B, Hv, Hk, K, V, T = 3, 2, 1, 5, 3, 3
    _, s0 = _draw(name, B, Hv, K, V, Hk, layout)
    oracle = StandardPool(s0, fam, layout)
    table = snapshot_table(B, T).to(DEVICE)
    states = torch.full((B * (1 + T), *s0.shape[1:]), float("nan"), device=DEVICE)
    states[table[:, 0]] = s0.to(device=DEVICE, dtype=torch.float32)
    for _ in range(2):
        xs, _ = _draw(name, B, Hv, K, V, Hk, layout, tokens=T)
        out = poisoned_like(torch.empty(B, T, Hv, V, device=DEVICE))
        o = snapshot_verify(states, *_to(xs), table=table, delta=fam.delta, decay=fam.decay, layout=layout,
                            out=out)
        assert rel_rms(o, oracle.verify(xs)) < TOL
        n = torch.randint(0, T + 1, (B,))
        oracle.commit(n)
        table = snapshot_commit(table, n.to(DEVICE))
        assert sorted(table.flatten().tolist()) == list(range(B * (1 + T)))  # still a permutation
        assert rel_rms(states[table[:, 0]], oracle.state) < TOL


def test_snapshot_padding_rows_touch_nothing():
    B, T = 2, 2
    xs, s0 = _draw("gated_deltanet", B, 2, 4, 3, 2, "kv", tokens=T)
    table = torch.tensor([[0, 1, 2], [-1, 4, 5]], dtype=torch.int32, device=DEVICE)
    states = torch.full((6, *s0.shape[1:]), float("nan"), device=DEVICE)
    states[0] = s0[0].to(DEVICE, torch.float32)
    o = snapshot_verify(states, *_to(xs), table=table, delta=True, decay="scalar", layout="kv")
    o_ref, _ = standard_scan(s0[:1], Canonical(*(f[:1] for f in xs)), delta=True, layout="kv")
    assert rel_rms(o[0], o_ref[0]) < TOL
    assert torch.equal(o[1].cpu(), torch.zeros_like(o[1].cpu()))
    assert torch.isnan(states[3:]).all()


# ------------------------------------------------------------------------------------------- GPU
REAL_SHAPES = {  # family, Hv, Hk, K, V, layout
    "nemotron3_super_mamba2": ("mamba2", 128, 8, 128, 64, "vk"),
    "nemotron3_nano_mamba2": ("mamba2", 96, 8, 128, 80, "vk"),
    "qwen35_122b_gdn": ("gated_deltanet", 64, 16, 128, 128, "kv"),
    "qwen35_4b_gdn": ("gated_deltanet", 32, 16, 128, 128, "vk"),
    "kimi_linear_kda": ("kda", 32, 32, 128, 128, "kv"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(REAL_SHAPES))
def test_gpu_real_shapes(shape):
    name, Hv, Hk, K, V, layout = REAL_SHAPES[shape]
    fam = get_family(name)
    B = 5
    xs, s0 = _draw(name, B, Hv, K, V, Hk, layout, tokens=3)
    xs = Canonical(*(None if f is None else f.to(torch.bfloat16).double() for f in xs))  # bf16 activations
    o_ref, s_ref = standard_scan(s0.clone(), xs, delta=fam.delta, layout=layout)
    state = s0.to(device="cuda", dtype=torch.float32)
    for t in range(3):
        xt = _to(Canonical(*(None if f is None else f[:, t] for f in xs)), torch.bfloat16, "cuda")
        o = _kernel_step(state, xt, fam, layout, out=poisoned_like(torch.empty(B, Hv, V, device="cuda")))
        assert rel_rms(o, o_ref[:, t]) < TOL
    assert rel_rms(state, s_ref) < TOL
    # snapshot verify of the same 3 tokens from the initial state
    table = snapshot_table(B, 3, "cuda")
    states = torch.full((B * 4, *s0.shape[1:]), float("nan"), device="cuda")
    states[table[:, 0]] = s0.to(device="cuda", dtype=torch.float32)
    o = snapshot_verify(states, *_to(xs, torch.bfloat16, "cuda"), table=table, delta=fam.delta, decay=fam.decay,
                        layout=layout)
    assert rel_rms(o, o_ref) < TOL
    assert rel_rms(states[table[:, 3]], s_ref) < TOL


@pytest.mark.gpu
def test_gpu_cuda_graph_decode_loop():
    name, Hv, Hk, K, V, layout = REAL_SHAPES["qwen35_122b_gdn"]
    fam = get_family(name)
    B, T = 8, 4
    xs, s0 = _draw(name, B, Hv, K, V, Hk, layout, tokens=T)
    o_ref, s_ref = standard_scan(s0.clone(), xs, delta=True, layout=layout)
    state = s0.to(device="cuda", dtype=torch.float32)
    xin = _to(Canonical(*(f[:, 0] for f in xs)), device="cuda")
    out = torch.empty(B, Hv, V, device="cuda")
    slots = torch.arange(B, device="cuda")
    _kernel_step(state.clone(), xin, fam, layout, slots=slots, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _kernel_step(state, xin, fam, layout, slots=slots, out=out)
    for t in range(T):
        for dst, f in zip(xin, xs):
            dst.copy_(f[:, t])
        graph.replay()
        assert rel_rms(out, o_ref[:, t]) < TOL
    assert rel_rms(state, s_ref) < TOL
