"""The Triton replay kernels against the plain-torch reference (and float64 math) on tiny shapes.

Under the interpreter (CPU CI) every template variant runs: decay kind x delta rule, both layouts,
grouped heads, odd head dims, windows L >= 1, verify lengths T, padding rows, per-row phases, read
copies, stochastic rounding, commit with random acceptance, materialize and reset. Outputs are
poisoned (NaN) before each kernel runs, and ring positions past the committed count hold NaN, so an
unwritten output or a stale record read as live fails. ``gpu`` tests repeat the checks at real shapes
and capture a decode loop in a CUDA graph.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from replay_compile.families import get_family
from replay_compile.families.base import Canonical
from replay_compile.runtime import quant, rounding, triton_impl
from replay_compile.runtime.state import ReplayState
from replay_compile.templates import verify, verify_forms
from replay_compile.templates.readcopy import _e2m1_magnitude_code, _e2m1_value_over_2p14, _e4m3_reciprocal
from replay_compile.templates.sround import SR_FORMATS, slot_seed, stochastic_round
from replay_compile.testing import StandardPool, poisoned_like, random_canonical, rel_rms

from conftest import DEVICE



@triton.jit
def _round_kernel(x, y, seed, slot, flush, N: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr):
    i = tl.arange(0, N)
    r = stochastic_round(tl.load(x + i), slot_seed(seed, slot, flush), i, MANT, EMIN)
    tl.store(y + i, r)


@triton.jit
def _e2m1_code_kernel(y, code, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(code + i, _e2m1_magnitude_code(tl.load(y + i)))


@triton.jit
def _e2m1_value_kernel(code, val, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(val + i, _e2m1_value_over_2p14(tl.load(code + i)))


@triton.jit
def _e4m3_reciprocal_kernel(b8, inv, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(inv + i, _e4m3_reciprocal(tl.load(b8 + i)))


FAMILIES = ["mamba2", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda"]


class Pair:
    """The same pool driven through the torch reference and the Triton kernels, compared after each call.

    Verifies take the replay template's token loop unless a test asks for another form (``verify_form``, or
    ``tiling=dict(chunked=True)``): under the default table (NOTE [default verify]) fp32 scalar-decay verifies would
    take the chunked verify (tested on its own below), and the token loop, still the verify of every read copy and
    float64 state, would lose these tests."""

    def __init__(self, family, *, B, H, Hk, K, V, L, layout="kv", dtype=torch.float32, read=None, sr=False,
                 generator, long_memory=False, device=DEVICE, tiling=None, activations=torch.float32, out_tol=None,
                 verify_form="tokens"):
        self.f, self.g, self.dims, self.dev, self.long = get_family(family), generator, (H, K, V, Hk), device, long_memory
        self.dtype = dtype
        _, st = random_canonical(self.f, B, H, K, V, Hk, dtype=torch.float32, generator=generator, layout=layout)
        st = st.to(dtype).to(device)
        kw = dict(layout=layout, k_heads=Hk, read_dtype=read, stochastic_rounding=sr, seed=1234,
                  verify_form=verify_form)
        self.ref = ReplayState(st.clone(), self.f, L, kernels="torch", **kw)
        self.tri = ReplayState(st.clone(), self.f, L, kernels="triton", **kw)
        for buf in self.tri.ring.values():  # garbage past every count must never be read
            buf.fill_(float("nan"))
        self.worst = 0.0
        self.tiling = tiling or {}  # block_v / items overrides of templates.replay.tiling
        self.activations = activations  # dtype of q, k, v (bf16 as in a model; log-decays and betas stay fp32)
        self.out_tol = out_tol  # outputs' tolerance where the kernels' reads round (the checkpoint's stays)

    def inputs(self, B, T=None):
        H, K, V, Hk = self.dims
        x, _ = random_canonical(self.f, B, H, K, V, Hk, tokens=T, dtype=torch.float32, generator=self.g,
                                long_memory=self.long)
        x = x._replace(**{n: getattr(x, n).to(self.activations) for n in ("q", "k", "v")})
        return Canonical(*(None if t is None else t.to(self.dev) for t in x))

    def _out(self, x, slots, commit, force_flush=False):
        B, T = x.q.shape[:2]
        if self.tri.read is not None:  # both read the same copy (rounding of the copy is checked on its own)
            for name, part in self.tri.read.items():
                self.ref.read[name].copy_(part)
        o_ref = self.ref.impl.advance(self.ref, x, slots, commit=commit, force_flush=force_flush)
        out = poisoned_like(torch.empty(B, T, self.tri.num_heads, self.tri.head_v, dtype=self.tri.compute_dtype,
                                        device=self.dev))
        o_tri = triton_impl.advance_into(self.tri, x, slots, out, commit=commit, force_flush=force_flush,
                                         **self.tiling)
        return o_ref, o_tri

    def step(self, slots=None, B=None, force_flush=False):
        x = self.inputs(B or (self.tri.num_slots if slots is None else slots.shape[0]), T=1)
        self.check(*self._out(x, slots, True, force_flush), "step")

    def verify_commit(self, T, slots=None, B=None):
        B = B or (self.tri.num_slots if slots is None else slots.shape[0])
        x = self.inputs(B, T=T)
        self.check(*self._out(x, slots, False), f"verify T={T}")
        n = torch.randint(0, T + 1, (B,), generator=self.g).to(self.dev)
        self.ref.impl.commit(self.ref, n, slots)
        triton_impl.commit(self.tri, n, slots)
        self.check(None, None, "commit")

    def check(self, o_ref, o_tri, what):
        # a 16-bit checkpoint rounds at every flush: the two fold orders may round one element apart,
        # and the read copy carries that ulp into the outputs (1.5e-5 seen on the H200, bf16 + SR)
        tol = 1e-5 if self.tri.state.dtype in (torch.float32, torch.float64) else 1e-4
        if o_ref is not None:  # the ring below keeps the state's tolerance whatever the outputs' (NOTE [verify
            e = rel_rms(o_tri, o_ref)  # product precision]: only the outputs' products may round)
            self.worst = max(self.worst, e)
            assert e < (self.out_tol or tol), f"{what}: output rel err {e:.2e}"
        assert torch.equal(self.tri.count, self.ref.count), f"{what}: count {self.tri.count} vs {self.ref.count}"
        assert torch.equal(self.tri.flushes, self.ref.flushes), f"{what}: flushes"
        assert torch.equal(self.tri.nonfinite, self.ref.nonfinite), f"{what}: nonfinite"
        e = rel_rms(self.tri.state.float(), self.ref.state.float())
        if self.tri.stochastic_rounding:  # the same random stream: bit-equal except where the two fp32 fold
            # orders put a value on the other side of its rounding threshold (rare; a different stream
            # would change about half of the elements)
            differ = (self.tri.state.view(torch.int16) != self.ref.state.view(torch.int16)).float().mean()
            assert differ <= 1e-3 and e <= 1e-2, f"{what}: SR bits differ on {differ:.2e}, rel err {e:.2e}"
        else:
            assert e <= (1e-6 if self.tri.state.dtype == torch.float32 else 1e-2), f"{what}: checkpoint rel err {e:.2e}"
        if self.tri.read_format is not None:  # the copy is the quantized checkpoint; the interpreter truncates
            # fp32 -> bf16/fp16 casts and rounds fp8 differently, the GPU must match torch exactly
            fmt, C, vk = self.tri.read_format, self.tri.head_k, self.tri.read_view(self.tri.state).float()
            want = fmt.dequantize(fmt.quantize(vk), C)
            e = rel_rms(fmt.dequantize(self.tri.read, C), want)
            cpu_tol = {"bf16": 1e-2, "fp16": 1e-3, "fp8": 0.1, "fp4": 0.25}[fmt.name]
            # on the GPU a rare element rounds differently (hardware cvt vs torch's software fp8 rounding;
            # seen once: 6e-5 fp8, 5e-8 fp4)
            assert e <= (1e-3 if DEVICE == "cuda" else cpu_tol), f"{what}: read copy {e:.2e}"
            if "row_scale" in self.tri.read:
                assert torch.equal(self.tri.read["row_scale"], fmt.quantize(vk)["row_scale"]), \
                    f"{what}: row scales"
        live = torch.arange(self.tri.window, device=self.dev)[None, :] < self.ref.count[:, None].long()
        for name, buf in self.tri.ring.items():
            m = live.view(*live.shape, *[1] * (buf.dim() - 2)).expand_as(buf)
            a, b = buf[m], self.ref.ring[name][m]
            fin = torch.isfinite(b)  # log_a = -inf records are legal
            assert torch.equal(a[~fin], b[~fin]), f"{what}: ring {name} non-finite records"
            e = rel_rms(a[fin], b[fin]) if fin.any() else 0.0
            assert e < tol, f"{what}: ring {name} rel err {e:.2e}"


# one layout per family in CI (each decay kind x delta rule meets both layouts across the list)
CI_LAYOUT = {"mamba2": "vk", "simple_gla": "kv", "gla": "kv", "deltanet": "vk", "gated_deltanet": "kv", "kda": "vk"}
DIMS = {"kv": (4, 2, 5, 3, 3), "vk": (2, 2, 4, 6, 5)}  # H, Hk, K, V, L: grouped heads, odd dims


def _random_sequence(family, layout, seed, tiling=None):
    """Step / verify / commit / materialize / reset crossing flushes, with padding and per-row phases."""
    g = torch.Generator().manual_seed(seed)
    H, Hk, K, V, L = DIMS[layout]
    p = Pair(family, B=3, H=H, Hk=Hk, K=K, V=V, L=L, layout=layout, generator=g, tiling=tiling)
    slots = torch.tensor([2, -1, 0, 1], device=DEVICE)  # a padding row, rows out of slot order
    p.step()
    p.step(slots=slots[:3])  # slot 1 is skipped: phases diverge
    for _ in range(L - 1):
        p.step(slots=slots)
    p.verify_commit(T=2, slots=slots)
    p.verify_commit(T=L)
    p.step(force_flush=True)
    for impl, rs in ((p.ref.impl, p.ref), (triton_impl, p.tri)):
        impl.materialize(rs, torch.tensor([0, 2], device=DEVICE))
    p.check(None, None, "materialize")
    p.ref.reset([1])
    p.tri.reset([1])
    p.step(slots=slots)


@pytest.mark.parametrize("family", FAMILIES)
def test_steps_and_verify_match_reference(family):
    _random_sequence(family, CI_LAYOUT[family], seed=FAMILIES.index(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_programs_serving_several_tiles(family):
    """Value tiles of 2 columns, 3 (head, tile) pairs a program: programs loop over heads of a key group and
    value tiles, and the last program of a unit has fewer pairs than the others (NOTE [key-group programs])."""
    _random_sequence(family, "kv", seed=20 + FAMILIES.index(family), tiling=dict(block_v=2, items=3))


@pytest.mark.parametrize("family", ["mamba2", "gated_deltanet", "kda"])
def test_multi_token_calls_at_head_dims_over_16(family):
    """Calls of several tokens at head dims >= 16 (odd K), value tiles of 16, two (head, tile) pairs a program."""
    g = torch.Generator().manual_seed(30 + FAMILIES.index(family))
    p = Pair(family, B=3, H=2, Hk=1, K=17, V=18, L=5, layout="vk", generator=g, tiling=dict(block_v=16, items=2))
    for T in (2, 3, 5, 2):
        p.verify_commit(T=T)
        p.step()


@pytest.mark.parametrize("family,read", [("mamba2", None), ("gated_deltanet", None), ("mamba2", "fp8")])
def test_vk_tiles_of_several_key_chunks(family, read):
    """K = 40 in the vk layout: the checkpoint tile is loaded as two chunks of 32 keys, the second one partly
    masked (NOTE [tile layout]); steps, flushes and verify with partial acceptance; with a read copy the
    flushing rows swap in the exact tile over the copy's."""
    g = torch.Generator().manual_seed(40 + FAMILIES.index(family))
    p = Pair(family, B=2, H=2, Hk=1, K=40, V=5, L=4, layout="vk", read=read, generator=g)
    for T in (1, 3, 1, 2, 1, 1):
        if T == 1:
            p.step()
        else:
            p.verify_commit(T=T)


@pytest.mark.parametrize("token_tile", [16, 8])
@pytest.mark.parametrize("family,layout", [("gated_deltanet", "kv"), ("mamba2", "vk"), ("deltanet", "kv"),
                                           ("simple_gla", "vk"), ("kda", "kv"), ("gla", "vk")])
def test_chunked_verify_over_key_chunks_and_value_tiles(family, layout, token_tile):
    """The chunked verify (templates/verify.py) walking K = 40 in chunks of 16 (the last one partly masked) over
    value tiles of 2 (V = 5), with pre-flushing rows (folded in the walk), padding and drafts as long as the
    window, every decay kind; drafts padded to 16 or to 8 (rank-1 updates over them, NOTE [verify token
    tiles])."""
    g = torch.Generator().manual_seed(60 + FAMILIES.index(family))
    p = Pair(family, B=3, H=2, Hk=1, K=40, V=5, L=6, layout=layout, generator=g, long_memory=True,
             tiling=dict(verify_tiling=dict(key_chunk=16, block_v=2, token_tile=token_tile), chunked=True))
    slots = torch.tensor([1, -1, 2, 0], device=DEVICE)
    for T in (3, 2, 4, 6, 2):
        p.verify_commit(T=T, slots=slots)
        p.step(slots=slots)


def test_chunked_verify_folds_into_16_bit_checkpoints():
    """A chunked verify's pre-flushing rows write bf16 / fp16 checkpoints stochastically rounded bit for bit as
    rounding.py does (seeded per slot, flush and element, both layouts)."""
    g = torch.Generator().manual_seed(90)
    for ckpt, layout in ((torch.bfloat16, "kv"), (torch.float16, "vk")):
        p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=5, V=3, L=4, layout=layout, dtype=ckpt, sr=True, generator=g,
                 tiling=dict(chunked=True))
        for T in (3, 3, 2, 4):
            p.verify_commit(T=T)
        assert p.tri.flushes.sum() > 0


@triton.jit
def _verify_product_kernel(a, b, c, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, DOT: tl.constexpr,
                           EXACT: tl.constexpr, TRANS: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    if TRANS:  # a transposed operand, as the verify's key dots take it
        A = tl.trans(tl.load(a + k[:, None] * M + m[None, :]))
    else:
        A = tl.load(a + m[:, None] * K + k[None, :])
    tl.store(c + m[:, None] * N + n[None, :], verify._mm(A, tl.load(b + k[:, None] * N + n[None, :]), DOT, EXACT))


@pytest.mark.parametrize("M,K,N,trans", [(64, 32, 16, False), (64, 16, 16, False), (16, 16, 16, True),
                                         (64, 16, 8, True)])
@pytest.mark.parametrize("dot", ["ieee", "split", "bf16x3", "bf16x2", "bf16"])
def test_verify_products(M, K, N, trans, dot):
    """Every product form of the chunked verify (NOTE [verify product precision]) against float64, with operands
    that bf16 holds exactly (``EXACT`` 1: ``b``, 2: both) or not (0); on the GPU, its tensor-core shapes."""
    tol = {"bf16x2": 3e-5 if DEVICE == "cuda" else 2e-4, "bf16": 1e-2}.get(dot, 1e-6)
    g = torch.Generator().manual_seed(M + K + N)
    for exact in (0, 1, 2):
        if dot == "split" and exact == 0:
            continue  # 3xTF32, the default form's products
        a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
        b = b.bfloat16().float() if exact else b
        a = a.bfloat16().float() if exact == 2 else a
        c = torch.full((M, N), float("nan"), device=DEVICE)
        _verify_product_kernel[(1,)](a.t().contiguous().to(DEVICE) if trans else a.to(DEVICE), b.to(DEVICE), c,
                                     M, K, N, dot, exact, trans)
        assert rel_rms(c.cpu().double(), a.double() @ b.double()) < tol, (dot, exact)


# outputs' tolerance of the verify's read precisions that round (NOTE [verify product precision]): bf16x2 keeps
# 16 bits of the checkpoint (the interpreter truncates its parts: ~4e-5 seen), bf16 8 (~4e-3 to 9e-3)
_READ_TOL = {"bf16x2": 1e-4, "bf16": 2e-2}


@pytest.mark.parametrize("dot,activations", [("split", "bf16"), ("bf16x3", "bf16"), ("bf16x2", "bf16"),
                                             ("bf16", "bf16"), ("bf16x3", "fp32"), ("bf16x2", "fp32"),
                                             ("bf16", "fp32")])
@pytest.mark.parametrize("family", ["mamba2", "gated_deltanet", "kda"])
def test_chunked_verify_split_products_on_bf16_activations(family, dot, activations):
    """``dot="split"``: with bf16 queries and keys the checkpoint's products take a high and a low TF32 part;
    ``"bf16x3"``: three bf16 parts of every fp32 operand (a dropped part fails at 1e-5); ``"bf16x2"`` and
    ``"bf16"`` round the queries' reads only: the products that make updates (fold, delta rule) stay exact, so
    the ring and the checkpoint keep their tolerances (NOTE [verify product precision]); with fp32 activations
    the key-key dots round too unless they are taken as updates."""
    g = torch.Generator().manual_seed(80 + FAMILIES.index(family))
    activations = {"bf16": torch.bfloat16, "fp32": torch.float32}[activations]
    p = Pair(family, B=3, H=2, Hk=1, K=20, V=5, L=6, generator=g, long_memory=True, activations=activations,
             tiling=dict(verify_tiling=dict(dot=dot), chunked=True), out_tol=_READ_TOL.get(dot))
    for T in (3, 4, 2, 5):
        p.verify_commit(T=T)
    assert p.tri.flushes.sum() > 0


def test_chunked_verify_key_contiguous_chunks_of_32():
    """Mamba-2's default on key-contiguous states at windows up to 16 (NOTE [key-contiguous chunks] in
    templates/verify.py): bf16x2 at 1 warp walking K = 72 in chunks of 32 (the last partly masked), rows that fold
    first, padding, bf16 activations."""
    g = torch.Generator().manual_seed(97)
    p = Pair("mamba2", B=3, H=2, Hk=1, K=72, V=5, L=6, layout="vk", generator=g, long_memory=True,
             activations=torch.bfloat16, out_tol=_READ_TOL["bf16x2"], tiling=dict(verify_tiling=dict(
                 dot="bf16x2", token_tile=8, key_chunk=32, num_warps=1), chunked=True))
    slots = torch.tensor([1, -1, 2, 0], device=DEVICE)
    for T in (3, 6, 2, 5):
        p.verify_commit(T=T, slots=slots)
    assert p.tri.flushes.sum() > 0


def test_chunked_verify_supports_and_default(monkeypatch):
    """The chunked verify serves verifies (T >= 2, no commit) on fp32 states without a read copy, and is a call's
    default where NOTE [default verify] lists a tiling for its activations' dtype (here a stand-in table); other
    calls take the replay template's token loop (``chunked=False`` too), and asking for it where unsupported is
    an error."""
    from replay_compile.templates import replay, verify

    spec = replay.ReplaySpec(decay="scalar", delta=True, raw=False, layout="kv", window=16, k_heads=2,
                             read_format=None, stochastic_rounding=False, seed=0)
    supports = lambda T, dtype=torch.float32, commit=False, **kw: verify.supports(
        dataclasses.replace(spec, **kw), T, dtype, commit=commit, force_flush=False, materialize=False)
    assert supports(2) and supports(8, decay="none") and supports(3, delta=False, layout="vk")
    assert supports(4, decay="channel")
    assert not (supports(1) or supports(4, commit=True) or supports(4, read_format="fp8")
                or supports(4, dtype=torch.float64))
    candidate = dict(dot="bf16x3", key_chunk=16, num_warps=1)  # NOTE [default verify]
    monkeypatch.setattr(verify, "_DEFAULT_TILING", {("scalar", True, torch.bfloat16): candidate,
                                                     ("none", False, torch.bfloat16): candidate,
                                                     ("none", False, torch.float32): dict(candidate, num_warps=2)})
    default = lambda T=4, act=torch.bfloat16, commit=False, **kw: verify.default_tiling(
        dataclasses.replace(spec, **kw), T, torch.float32, act, commit=commit, force_flush=False)
    assert default() == dict(candidate, token_tile=8)
    assert default(T=8)["token_tile"] == 8 and default(decay="none", delta=False)
    assert default(act=torch.float32, decay="none", delta=False)["num_warps"] == 2
    assert not any((default(act=torch.float32), default(act=None), default(decay="channel"), default(T=1), default(T=9),
                    default(commit=True), default(read_format="bf16"), default(T=17), default(delta=False)))
    launched, launch = [], verify.launch
    monkeypatch.setattr(verify, "launch", lambda *a, **kw: launched.append(kw) or launch(*a, **kw))
    for family, act, chunked, want in [("gated_deltanet", torch.bfloat16, None, [default(T=3)]),
                                       ("gated_deltanet", torch.float32, None, []),
                                       ("gated_deltanet", torch.bfloat16, False, []),
                                       ("mamba2", torch.bfloat16, None, [])]:
        launched.clear()
        p = Pair(family, B=2, H=2, Hk=1, K=4, V=3, L=4, generator=torch.Generator().manual_seed(6),
                 activations=act, tiling=dict(chunked=chunked), verify_form="auto")
        p.verify_commit(T=3)
        assert launched == want, (family, act, chunked)
    with pytest.raises(ValueError, match="products are one of"):
        verify.tiling(128, 128, 8, 24, dot="bf16x4")
    # NOTE [prefetched operands read in place]: bf16 products at 4+ warps walk in 1 stage
    assert verify.tiling(128, 128, 8, 24, dot="bf16x3").stages == 1
    assert verify.tiling(128, 128, 8, 24, dot="bf16x3", num_warps=2).stages == 2
    assert verify.tiling(128, 128, 8, 24, dot="split").stages == 2
    with pytest.raises(ValueError, match="1 stage"):
        verify.tiling(128, 128, 8, 24, dot="bf16x2", stages=2)
    with pytest.raises(ValueError, match="more than 4 warps"):  # NOTE [verify warps]
        verify.tiling(128, 128, 8, 24, num_warps=8)
    assert verify.tiling(128, 128, 8, 24, num_warps=8, block_v=128).num_warps == 8
    p = Pair("kda", B=2, H=2, Hk=1, K=4, V=3, L=4, read="bf16", generator=torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match="chunked verify"):
        triton_impl.advance_into(p.tri, p.inputs(2, T=2), None, torch.empty(2, 2, 2, 3, device=DEVICE),
                                 commit=False, force_flush=False, chunked=True)


def test_verify_forms(monkeypatch):
    """A state's verify form (templates/verify_forms.py) over the default table: served where the chunked verify
    supports the call, else the token loop; a bad form is refused when the state is built."""
    monkeypatch.setattr(verify, "_DEFAULT_TILING", {("scalar", True, torch.bfloat16): dict(dot="bf16x3")})
    launched, launch = [], verify.launch
    monkeypatch.setattr(verify, "launch", lambda *a, **kw: launched.append(kw) or launch(*a, **kw))
    for act, read, form, want in [(torch.float32, None, "chunked:kc=16,dot=bf16x3",
                                   [dict(key_chunk=16, dot="bf16x3")]),
                                  (torch.bfloat16, None, "tokens", []), (torch.float32, "bf16", "chunked", [])]:
        launched.clear()
        p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, generator=torch.Generator().manual_seed(7),
                 activations=act, read=read, verify_form=form)
        p.verify_commit(T=3)
        assert launched == want, (act, read, form)
    assert verify_forms.parse("chunked:bv=32,kc=16,nw=1,st=1,dot=bf16x2,mr=128,bt=8") == ("chunked", dict(
        block_v=32, key_chunk=16, num_warps=1, stages=1, dot="bf16x2", max_registers=128, token_tile=8))
    for bad in ("chunky", "tokens:kc=16", "chunked:zz=1", "chunked:kc=x", "chunked:dot=bf16x4"):
        with pytest.raises(ValueError, match="verify form"):
            ReplayState(torch.zeros(1, 2, 4, 3), "gated_deltanet", 4, verify_form=bad)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_steps_and_verify_match_reference_other_layout(family):
    _random_sequence(family, "vk" if CI_LAYOUT[family] == "kv" else "kv", seed=10 + FAMILIES.index(family))


def test_window_one_and_float64_against_standard():
    """L = 1 is the standard recurrence; float64 replay equals float64 standard decoding to ~1e-13."""
    g = torch.Generator().manual_seed(7)
    for family, L in (("gated_deltanet", 1), ("kda", 4), ("mamba2", 3)):
        f = get_family(family)
        x0, st = random_canonical(f, 2, 2, 3, 4, 1, dtype=torch.float64, generator=g)
        tri = ReplayState(st.clone().to(DEVICE), f, L, k_heads=1, kernels="triton")
        pool = StandardPool(st.clone(), f, "kv")
        for t in range(2 * L + 1):
            x, _ = random_canonical(f, 2, 2, 3, 4, 1, dtype=torch.float64, generator=g, tokens=min(2, L) if t % 2 else None)
            if t % 2:
                o_std = pool.verify(x)
                o = tri.verify(*(None if v is None else v.to(DEVICE) for v in x))
                pool.commit(1)
                tri.commit(1)
            else:
                o_std = pool.step(x)
                o = tri.step(*(None if v is None else v.to(DEVICE) for v in x))
            assert rel_rms(o, o_std) < 1e-12, (family, t)
        tri.materialize()
        assert rel_rms(tri.state, pool.state) < 1e-12


@pytest.mark.parametrize("read,family,layout,block_v", [("bf16", "gated_deltanet", "kv", None),
                                                         ("fp8", "mamba2", "kv", None), ("fp8", "gla", "vk", None),
                                                         ("fp4", "kda", "vk", None),
                                                         ("fp4", "gated_deltanet", "kv", 16)])
def test_read_copies(read, family, layout, block_v):
    """Non-flush rows read the quantized copy, flush rows the exact checkpoint and re-quantize it;
    delta-rule folds replay raw records. Key-major 4-bit codes pair values: an odd V leaves the last byte half
    used, and value tiles of 16 (the second holding one value) each own their bytes."""
    g = torch.Generator().manual_seed(3)
    small = 16 if read == "fp4" else 4  # e2m1 blocks run along 16 columns
    p = Pair(family, B=2, H=2, Hk=1, K=small, V=small + 1, L=3, layout=layout, read=read, generator=g,
             tiling=block_v and dict(block_v=block_v))
    for _ in range(3):
        p.step()
    p.verify_commit(T=2)
    p.step()


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_read_copy_storage_orientation(layout):
    """NOTE [read copy orientation]: fp8 and 4-bit copies of kv states store their data key-major (a transposed
    view of a [N, Hv, K, V] buffer; 4-bit codes then pair values, [N, Hv, ceil(V / 2), KP] seen), every other copy
    value-major; all are seen as [N, Hv, V, K]."""
    f = get_family("gated_deltanet")
    _, st = random_canonical(f, 2, 2, 16, 5, 1, dtype=torch.float32, generator=torch.Generator().manual_seed(1),
                             layout=layout)
    for read in ("bf16", "fp16", "fp8", "fp4"):
        data = ReplayState(st.clone(), f, 3, kernels="torch", layout=layout, k_heads=1, read_dtype=read).read["data"]
        key_major = layout == "kv" and read in ("fp8", "fp4")
        rows = 3 if key_major and read == "fp4" else 5
        assert data.shape[-2] == rows and data.transpose(-1, -2).is_contiguous() == key_major, (read, data.stride())


def test_read_fp16_and_stochastic_rounding_bit_exact():
    """bf16/fp16 checkpoints with stochastic rounding: the flush writes equal rounding.py bit for bit."""
    g = torch.Generator().manual_seed(5)
    for ckpt, read, layout in ((torch.bfloat16, "fp16", "kv"), (torch.float16, None, "vk")):
        p = Pair("gated_deltanet", B=2, H=2, Hk=2, K=3, V=5, L=2, layout=layout, dtype=ckpt, read=read, sr=True,
                 generator=g)
        for _ in range(5):
            p.step()


def test_stochastic_round_kernel_matches_reference_on_edge_values():
    """Subnormals, ties, signed zeros, huge and non-finite values round exactly as rounding.py does."""
    special = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 1e-45, 6e-8, 3.3e38, -3.39e38, float("inf"), float("-inf"),
                            float("nan"), 1.0, -1.5, 65504.0, 65520.0, 1e-5])
    x = torch.cat([special, torch.randn(48, generator=torch.Generator().manual_seed(1)) * 10.0]).to(DEVICE)
    for dtype in (torch.bfloat16, torch.float16):
        mant, emin = SR_FORMATS[str(dtype).removeprefix("torch.")]
        y = torch.empty_like(x)
        _round_kernel[(1,)](x, y, 99, 3, 5, N=x.numel(), MANT=mant, EMIN=emin)
        seed = rounding.slot_seed(99, torch.tensor([3]), torch.tensor([5])).to(DEVICE)
        ref = rounding.stochastic_round(x[None], dtype, seed)[0]
        got = y.to(dtype)
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), (dtype, x[got.view(torch.int16) != ref.view(torch.int16)])


def test_e2m1_codes_from_bits_count_the_midpoints():
    """The kernel's e2m1 code (rounding the fp32 bits, NOTE [read-copy reciprocals]) equals quant.py's count of
    midpoints below ``y`` at every midpoint, its fp32 neighbours, the grid, subnormals, overflow and NaN."""
    mids = torch.tensor(quant.FP4_MIDPOINTS + quant.FP4_VALUES + (1.0, 8.0))
    edges = torch.cat([mids, torch.nextafter(mids, torch.tensor(0.0)), torch.nextafter(mids, torch.tensor(99.0))])
    special = torch.tensor([0.0, 1e-45, 1e-40, 1e-30, 0.5, 6.5, 7.0, 7.5, 1e30, 3.4e38, float("inf"), float("nan")])
    noise = torch.rand(4096 - edges.numel() - special.numel(), generator=torch.Generator().manual_seed(8)) * 8
    y = torch.cat([edges, special, noise]).float().to(DEVICE)
    code = torch.empty(y.numel(), dtype=torch.int32, device=DEVICE)
    _e2m1_code_kernel[(1,)](y, code, N=y.numel())
    want = sum((y > m).int() for m in quant.FP4_MIDPOINTS)
    assert torch.equal(code, want), y[code != want]


def test_e2m1_values_from_fp16_bits_equal_quant_py():
    """Every 4-bit code read as fp16 bits (NOTE [e2m1 as fp16 bits]) is 2^-14 times quant.py's e2m1 value, signed
    zero included."""
    code = torch.arange(16, dtype=torch.int32)
    mag = torch.tensor(quant.FP4_VALUES)[code & 7]
    want = torch.where(code >= 8, -mag, mag)
    val = torch.empty(16, device=DEVICE)
    _e2m1_value_kernel[(1,)](code.to(DEVICE), val, N=16)
    got = val.cpu() * 16384.0
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit()), got


def test_e4m3_reciprocals_from_a_table_equal_torch():
    """The 4-bit copy's division-free reciprocal of every e4m3 bit pattern (subnormals, zero, NaN) equals
    ``torch.reciprocal`` of its fp32 value where that is positive, and 0 elsewhere, bit for bit."""
    b8 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    bf = b8.float()
    want = torch.where(bf > 0, torch.reciprocal(bf), torch.zeros_like(bf))
    inv = torch.empty(256, device=DEVICE)
    _e4m3_reciprocal_kernel[(1,)](b8.to(DEVICE), inv, N=256)
    checked = bf.isnan().logical_not() if DEVICE == "cpu" else torch.ones(256, dtype=torch.bool)  # the interpreter
    got = inv.cpu()  # converts the e4m3 NaN code to 480, the GPU to NaN
    assert torch.equal(got.view(torch.int32)[checked], want.view(torch.int32)[checked]), (bf, got, want)


def test_nonfinite_inputs_flag_only_their_slot():
    g = torch.Generator().manual_seed(11)
    p = Pair("mamba2", B=3, H=2, Hk=1, K=4, V=3, L=2, generator=g)
    x = p.inputs(3, T=1)
    v = x.v.clone()
    v[1, 0, 1, 2] = float("nan")
    x = x._replace(v=v)
    o_ref, o_tri = p._out(x, None, True)
    assert torch.equal(p.tri.nonfinite, torch.tensor([False, True, False], device=DEVICE))
    assert torch.equal(p.tri.nonfinite, p.ref.nonfinite)
    assert rel_rms(o_tri[[0, 2]], o_ref[[0, 2]]) < 1e-5


# ----------------------------------------------------------------------------------------------- GPU
REAL = {  # family, Hv, Hk, K, V, layout (REPLAYSSM.md section 5)
    "nemotron3-super-mamba2": ("mamba2", 128, 8, 128, 64, "vk"),
    "nemotron3-nano-mamba2": ("mamba2", 96, 8, 128, 80, "vk"),
    "qwen3.5-122b-gdn": ("gated_deltanet", 64, 16, 128, 128, "kv"),
    "qwen3.5-4b-gdn": ("gated_deltanet", 32, 16, 128, 128, "kv"),
    "kimi-linear-kda": ("kda", 32, 32, 128, 128, "kv"),
}


def _real_pair(name, B, L, seed, **kw):
    family, H, Hk, K, V, layout = REAL[name]
    return Pair(family, B=B, H=H, Hk=Hk, K=K, V=V, L=L, layout=layout, generator=torch.Generator().manual_seed(seed),
                long_memory=True, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(REAL))
@pytest.mark.parametrize("L", [4, 11])
def test_real_shapes_gpu(name, L):
    """Real layer shapes on the GPU: steps at per-row phases with padding, verify T = 3 + commit, force flush.

    ``L = 11`` leaves a remainder after the unrolled fold's iterations of 8 (NOTE [fold unrolling]). Every call
    passes slots (one kernel variant per call kind keeps the GPU compile time down)."""
    p = _real_pair(name, B=6, L=L, seed=1)
    slots = torch.tensor([5, -1, 0, 3, 1, 2, 4], device=DEVICE)
    p.step(slots=slots[2:5])
    for _ in range(5):
        p.step(slots=slots)
    p.verify_commit(T=3, slots=slots)
    p.step(slots=slots, force_flush=True)
    p.verify_commit(T=3, slots=slots)


_VERIFY_TILINGS = {  # every tiling the tuning sweeps (templates.verify.tiling), per shape
    "qwen3.5-122b-gdn": [{}, dict(block_v=32), dict(block_v=128, num_warps=8), dict(key_chunk=16),
                         dict(key_chunk=16, max_registers=128), dict(key_chunk=64), dict(dot="ieee"), dict(stages=1),
                         dict(stages=3), dict(dot="split"), dict(dot="split", key_chunk=16),
                         dict(dot="split", token_tile=8), dict(dot="bf16x3"), dict(dot="bf16x3", token_tile=8),
                         dict(dot="bf16x3", token_tile=8, key_chunk=16, max_registers=128),
                         dict(dot="bf16x3", token_tile=8, key_chunk=16, num_warps=2), dict(dot="bf16x3", num_warps=1),
                         dict(dot="bf16x3", token_tile=8, key_chunk=16, num_warps=1),
                         dict(dot="bf16x2", token_tile=8, key_chunk=16, num_warps=1),
                         dict(dot="bf16", token_tile=8, num_warps=1),
                         *(dict(dot=dot, token_tile=8, key_chunk=32, num_warps=1) for dot in ("bf16x3", "bf16x2")),
                         *(dict(dot="bf16x3", token_tile=8, key_chunk=16, num_warps=1, **kw)
                           for kw in (dict(block_v=32), dict(block_v=128), dict(max_registers=128)))],
    "nemotron3-super-mamba2": [{}, dict(dot="ieee"), dict(key_chunk=16, max_registers=128), dict(dot="split"),
                               dict(dot="bf16x3"), dict(dot="bf16x3", token_tile=8, key_chunk=16),
                               dict(dot="bf16x3", token_tile=8, key_chunk=16, num_warps=1),
                               dict(dot="bf16x2", token_tile=8, key_chunk=16, num_warps=1),
                               dict(dot="bf16x2", token_tile=8, key_chunk=32, num_warps=1)],
    "nemotron3-nano-mamba2": [{}, dict(dot="bf16x3", token_tile=8)],
    "qwen3.5-4b-gdn": [{}],
    "kimi-linear-kda": [{}, dict(key_chunk=16), dict(dot="bf16x3", token_tile=8, key_chunk=16),
                        *(dict(dot=dot, token_tile=8, key_chunk=16, num_warps=1) for dot in ("bf16x3", "bf16x2")),
                        # one program a head (no per-channel decay factors computed twice), and 2-warp tiles of 64
                        *(dict(dot="bf16x3", token_tile=8, key_chunk=16, num_warps=nw, block_v=bv)
                          for nw, bv in ((4, 128), (2, 128), (2, 64))),
                        dict(dot="bf16x2", token_tile=8, key_chunk=16, num_warps=4, block_v=128)],
}


def _tiling_id(x):
    return (",".join(f"{k}={v}" for k, v in x.items()) or "default") if isinstance(x, dict) else x


@pytest.mark.gpu
@pytest.mark.parametrize("name,vt", [(n, vt) for n, vts in _VERIFY_TILINGS.items() for vt in vts], ids=_tiling_id)
def test_chunked_verify_gpu(name, vt):
    """The chunked verify at real shapes on the GPU, one tiling at a time: drafts of 8 and 5 tokens at L = 13
    (rows that pre-flush and rows that do not), padding, random acceptance; 3xTF32, split TF32, bf16x3 (and FMA)
    products within the fp32 tolerance, bf16x2 and bf16 reads within theirs; drafts padded to 16 and to 8 (NOTE
    [verify token tiles])."""
    dot = vt.get("dot")
    _verify_real_shape(name, vt, 4 + _VERIFY_TILINGS[name].index(vt),
                       torch.bfloat16 if dot in ("split", "bf16x3", *_READ_TOL) else torch.float32)


# the 1-warp tilings of NOTE [default verify] on fp32 queries and keys (what the transformers integration hands the
# ops): both operands of a bf16 product go in as parts (six passes for bf16x3, three for bf16x2)
_FP32_ACTIVATION_TILINGS = [dict(dot=dot, token_tile=8, key_chunk=16, num_warps=1) for dot in ("bf16x3", "bf16x2")]
_FP32_ACTIVATION_SHAPES = ["nemotron3-super-mamba2", "qwen3.5-122b-gdn"]


@pytest.mark.gpu
@pytest.mark.parametrize("vt", _FP32_ACTIVATION_TILINGS, ids=_tiling_id)
@pytest.mark.parametrize("name", _FP32_ACTIVATION_SHAPES)
def test_chunked_verify_gpu_fp32_activations(name, vt):
    """test_chunked_verify_gpu's checks for the default verify's tilings on fp32 activations."""
    _verify_real_shape(name, vt, 40 + _FP32_ACTIVATION_TILINGS.index(vt), torch.float32)


def _verify_real_shape(name, vt, seed, activations):
    p = _real_pair(name, B=5, L=13, seed=seed, tiling=dict(verify_tiling=vt, chunked=True),
                   out_tol=_READ_TOL.get(vt.get("dot")), activations=activations)
    slots = torch.tensor([4, -1, 0, 2, 1, 3], device=DEVICE)
    for T in (8, 5, 8, 8):
        p.verify_commit(T=T, slots=slots)


def test_default_verify_tilings_passed_the_gpu_tests():
    """Every tiling of NOTE [default verify]'s table, as a call gets it, is one that the GPU tests run on its
    family's real shapes with the activations the table lists it for (test_chunked_verify_gpu gives bf16 products
    bf16 activations; test_chunked_verify_gpu_fp32_activations gives them fp32 ones)."""
    from replay_compile.templates import verify

    families = {"scalar": {False: ["nemotron3-super-mamba2"], True: ["qwen3.5-122b-gdn"]},
                "channel": {True: ["kimi-linear-kda"]}}
    assert verify._DEFAULT_TILING, "the table is empty: update this test and NOTE [default verify]"
    for key, tile in verify._DEFAULT_TILING.items():
        decay, delta, act = key
        wide = [dict(tile, key_chunk=verify._WIDE_KEY_CHUNK[key])] if key in verify._WIDE_KEY_CHUNK else []
        for name in families[decay][delta]:
            assert act == torch.bfloat16 or name in _FP32_ACTIVATION_SHAPES, (name, act)
            tested = _VERIFY_TILINGS[name] if act == torch.bfloat16 else _FP32_ACTIVATION_TILINGS
            for t in (tile, *wide):
                assert dict(t, token_tile=8) in tested, (name, act, t)


def test_default_verify_fewest_tokens():
    """KDA's chunked verify is the default from 8 drafts only (its token loop is faster at 4: NOTE [default
    verify]); scalar decay takes it from 2, on bf16 and fp32 activations alike."""
    from replay_compile.templates import replay, verify

    spec = replay.ReplaySpec(decay="channel", delta=True, raw=False, layout="kv", window=16, k_heads=2,
                             read_format=None, stochastic_rounding=False, seed=0)
    default = lambda T, act=torch.bfloat16, **kw: verify.default_tiling(
        dataclasses.replace(spec, **kw), T, torch.float32, act, commit=False, force_flush=False)
    assert [T for T in range(1, 10) if default(T)] == [8]
    assert not default(8, torch.float32)
    for act in (torch.bfloat16, torch.float32):
        assert [T for T in range(1, 10) if default(T, act, decay="scalar")] == list(range(2, 9))


def test_default_verify_key_chunk_follows_the_layout():
    """Mamba-2's bf16 verify walks a key-contiguous checkpoint in chunks of 32 keys (whole 128-byte lines) where the
    window is at most 16, of 16 elsewhere; other entries keep 16 (NOTE [key-contiguous chunks])."""
    from replay_compile.templates import replay, verify

    spec = replay.ReplaySpec(decay="scalar", delta=False, raw=False, layout="vk", window=16, k_heads=2,
                             read_format=None, stochastic_rounding=False, seed=0)
    chunk = lambda act=torch.bfloat16, **kw: verify.default_tiling(
        dataclasses.replace(spec, **kw), 8, torch.float32, act, commit=False, force_flush=False)["key_chunk"]
    assert [chunk(window=w) for w in (4, 8, 16, 17, 24)] == [32, 32, 32, 16, 16]
    assert chunk(layout="kv") == chunk(torch.float32) == chunk(delta=True) == 16


@pytest.mark.gpu
@pytest.mark.parametrize("name,read", [("qwen3.5-122b-gdn", None), ("kimi-linear-kda", None), ("qwen3.5-122b-gdn", "fp8")])
def test_two_row_loops_short_last_program_gpu(name, read):
    """The non-flush loop compiled with its pipelining (the defaults: 2 stages, read copy or not; 1 under
    per-channel decay) and 3 pairs a program, so a unit's last program repeats its last pair (NOTE [two row
    loops]); steps across flushes."""
    p = _real_pair(name, B=5, L=3, seed=3, read=read, tiling=dict(block_v=32, items=3))
    slots = torch.tensor([4, -1, 0, 2, 1, 3], device=DEVICE)
    for _ in range(7):
        p.step(slots=slots)


@pytest.mark.gpu
@pytest.mark.parametrize("name,read", [("qwen3.5-122b-gdn", "fp8"), ("kimi-linear-kda", None), ("qwen3.5-4b-gdn", "fp4"),
                                       ("nemotron3-super-mamba2", "fp8"), ("nemotron3-super-mamba2", "fp4")])
def test_flush_launch_gpu(name, read, replay_launches_run):
    """The flushing rows' launch of one pair a program, then the others' (NOTE [flush launch]), at real shapes:
    steps across flushes with padding rows, a verify between them. Mamba-2's key-contiguous tiles split their rows
    by default on a 4-bit copy only; its fp8 row asks, and so does KDA without a copy (one launch by default there,
    ``test_flush_launch_rule``)."""
    ask = read is None or (REAL[name][-1] == "vk" and read != "fp4")  # not a default there
    p = _real_pair(name, B=5, L=3, seed=4, read=read, tiling=dict(flush_items=1, nonflush_stages=1) if ask else {})
    slots = torch.tensor([4, -1, 0, 2, 1, 3], device=DEVICE)
    for T in (1, 1, 1, 2, 1, 1, 1):
        if T == 1:
            p.step(slots=slots)
        else:
            p.verify_commit(T=T, slots=slots)
    assert {launch["ROWS"] for launch in replay_launches_run if launch["T"] == 1} == {1, 2}


@pytest.mark.gpu
@pytest.mark.parametrize("name,read", [("qwen3.5-122b-gdn", "fp8"), ("qwen3.5-122b-gdn", "fp4"),
                                       ("kimi-linear-kda", "fp8")])
def test_nonflush_value_tile_gpu(name, read, replay_launches_run):
    """The non-flush rows' launch on value tiles of 64 (2 warps, the default pipelining), the flushing rows' on the
    default tile, at real shapes across flushes (``test_nonflush_value_tile``)."""
    p = _real_pair(name, B=5, L=3, seed=5, read=read, tiling=dict(nonflush_block_v=64, nonflush_registers=128))
    slots = torch.tensor([4, -1, 0, 2, 1, 3], device=DEVICE)
    for _ in range(7):
        p.step(slots=slots)
    assert {launch["BV"] for launch in replay_launches_run if launch["ROWS"] == 2} == {64}


@pytest.mark.gpu
@pytest.mark.parametrize("name,read,ckpt", [("nemotron3-super-mamba2", "fp8", torch.float32),
                                            ("qwen3.5-4b-gdn", "fp4", torch.float32),
                                            ("kimi-linear-kda", "fp16", torch.bfloat16)])
def test_read_copies_and_rounding_gpu(name, read, ckpt):
    """Read copies equal torch's quantization of the checkpoint bit for bit; SR writes equal rounding.py."""
    p = _real_pair(name, B=5, L=3, seed=2, read=read, dtype=ckpt, sr=ckpt != torch.float32)
    for _ in range(4):
        p.step()
    p.verify_commit(T=2)
    p.step()


@pytest.mark.gpu
@pytest.mark.parametrize("flush_items", [None, 0])
def test_cuda_graph_decode_loop(flush_items):
    """A captured decode step, replayed with fresh inputs, follows the reference step by step across flushes (by
    default in two launches, NOTE [flush launch]; 0: in one)."""
    from replay_compile.templates import replay

    name, L, B = "qwen3.5-4b-gdn", 4, 16
    p = _real_pair(name, B=B, L=L, seed=3, read="fp8")
    tile = replay.tiling(triton_impl._spec(p.tri), p.tri.head_k, p.tri.head_v, B, p.tri.num_heads, 1)
    assert tile.flush_items == 1  # the default step below takes two launches
    if flush_items is not None:
        def step(*x):
            out = torch.empty(B, 1, p.tri.num_heads, p.tri.head_v, device=DEVICE)
            one = Canonical(*(None if f is None else f[:, None] for f in x))
            return triton_impl.advance_into(p.tri, one, None, out, commit=True, force_flush=False,
                                            flush_items=flush_items)[:, 0]
    else:
        step = p.tri.step
    p.tri.count.copy_(torch.arange(B, device=DEVICE) % L)  # every phase at once (records start at zero)
    p.ref.count.copy_(p.tri.count)
    for name_, buf in p.tri.ring.items():
        buf.copy_(p.ref.ring[name_])
    static = p.inputs(B, T=None)
    p.ref.step(*static)  # warm-up (compiles the kernels) outside the capture, on both
    step(*static)
    for name_, part in p.tri.read.items():
        p.ref.read[name_].copy_(part)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static = step(*static)
    for _ in range(2 * L + 1):
        x = p.inputs(B, T=None)
        for dst, src in zip(static, x):
            if dst is not None:
                dst.copy_(src)
        graph.replay()
        for name_, part in p.tri.read.items():  # both read the same copy (as Pair._out does)
            p.ref.read[name_].copy_(part)
        o_ref = p.ref.step(*x)
        p.check(o_ref, o_static, "graph replay")


def test_exact_zero_decays_and_window_one_with_read_copy():
    """log_a = -inf (a decay of exactly 0) gives weight 0, never NaN; L = 1 with a read copy is the standard step."""
    g = torch.Generator().manual_seed(13)
    for family, L, read in (("gla", 3, None), ("gated_deltanet", 4, None), ("kda", 1, "bf16")):
        p = Pair(family, B=2, H=2, Hk=1, K=3, V=2, L=L, read=read, generator=g)
        for t in range(L + 2):
            x = p.inputs(2, T=1)
            la = x.log_a.clone()
            la[t % 2, 0, 1] = float("-inf")  # one head of one row forgets everything
            p.check(*p._out(x._replace(log_a=la), None, True), f"{family} step {t}")


def _recorded_launches(monkeypatch, run: bool) -> list:
    """The keyword arguments of each replay-kernel launch, recorded (and the launch run where ``run``)."""
    from replay_compile.templates import replay

    launches, kernel = [], replay.replay_kernel

    class Record:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs)
                if run:
                    kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(replay, "replay_kernel", Record())
    return launches


@pytest.fixture
def replay_launches(monkeypatch):
    """The keyword arguments of each replay-kernel launch, recorded instead of run."""
    return _recorded_launches(monkeypatch, run=False)


@pytest.fixture
def replay_launches_run(monkeypatch):
    """The keyword arguments of each replay-kernel launch, recorded as the launches run."""
    return _recorded_launches(monkeypatch, run=True)


def test_register_cap_belongs_to_the_default_warps(replay_launches):
    """The tiling's register cap is passed only with its own warps; other warps get the caller's cap or none."""
    from replay_compile.templates import replay

    g = torch.Generator().manual_seed(3)
    p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, generator=g)
    x = p.inputs(2, T=1)
    tile = replay.tiling(triton_impl._spec(p.tri), 4, 3, 2, 2, 1)
    assert tile.max_registers is not None  # a capped default, so that the rows below can tell the cases apart
    for kw, want in ((dict(), tile.max_registers), (dict(num_warps=tile.num_warps), tile.max_registers),
                     (dict(num_warps=4), None), (dict(num_warps=4, max_registers=200), 200)):
        out = torch.empty(2, 1, 2, 3, device=DEVICE)
        triton_impl.advance_into(p.tri, x, None, out, commit=True, force_flush=False, **kw)
        assert replay_launches[-1].get("maxnreg") == want, (kw, replay_launches[-1].get("maxnreg"))


def test_nonflush_register_cap(replay_launches):
    """The non-flush rows' launch runs under ``NONFLUSH_REGISTERS`` where the flushing rows have their own (NOTE
    [non-flush register cap]); ``nonflush_registers`` / ``nonflush_warps`` set that launch alone, ``max_registers``
    both; warps other than the tiling's drop the default caps; a call of one launch ignores the non-flush settings."""
    from replay_compile.templates import replay

    p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, read="fp8", generator=torch.Generator().manual_seed(8))
    tile = replay.tiling(triton_impl._spec(p.tri), 4, 3, 2, 2, 1)
    cap, nw, nf = tile.max_registers, tile.num_warps, replay.NONFLUSH_REGISTERS
    assert tile.flush_items and cap and tile.nonflush_registers == nf < cap
    for kw, want in ((dict(), [(nw, cap), (nw, nf)]), (dict(nonflush_registers=80), [(nw, cap), (nw, 80)]),
                     (dict(max_registers=200), [(nw, 200), (nw, 200)]),
                     (dict(num_warps=2 * nw), [(2 * nw, None), (2 * nw, None)]),
                     (dict(nonflush_warps=2 * nw), [(nw, cap), (2 * nw, None)]),
                     (dict(nonflush_warps=2 * nw, nonflush_registers=64), [(nw, cap), (2 * nw, 64)]),
                     (dict(nonflush_registers=80, nonflush_warps=2 * nw, flush_items=0), [(nw, cap)])):
        del replay_launches[:]
        out = torch.empty(2, 1, 2, 3, device=DEVICE)
        triton_impl.advance_into(p.tri, p.inputs(2, T=1), None, out, commit=True, force_flush=False, **kw)
        got = [(launch["num_warps"], launch.get("maxnreg")) for launch in replay_launches]
        assert got == want, (kw, got)


def test_fold_unrolling_rule_and_override(replay_launches):
    """One-token calls unroll the flush fold by 8 (not with a kv read copy, not verify); an explicit
    ``fold_unroll`` reaches the launch (NOTE [fold unrolling])."""
    from replay_compile.templates import replay

    spec = replay.ReplaySpec(decay="scalar", delta=True, raw=False, layout="kv", window=16, k_heads=2,
                             read_format=None, stochastic_rounding=False, seed=0)
    unroll = lambda T, **kw: replay.tiling(dataclasses.replace(spec, **kw), 128, 128, 256, 8, T).fold_unroll
    assert unroll(1) == 8 and unroll(1, decay="none") == 8 and unroll(1, decay="channel") == 8
    assert unroll(1, read_format="fp8", layout="vk") == 8
    assert unroll(4) == 1 and unroll(1, read_format="fp8") == 1 and unroll(1, decay="channel", read_format="fp8") == 1
    p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, generator=torch.Generator().manual_seed(4))
    for kw, want in ((dict(), 8), (dict(fold_unroll=2), 2)):
        out = torch.empty(2, 1, 2, 3, device=DEVICE)
        triton_impl.advance_into(p.tri, p.inputs(2, T=1), None, out, commit=True, force_flush=False, **kw)
        assert replay_launches[-1]["FOLD_UNROLL"] == want, (kw, replay_launches[-1]["FOLD_UNROLL"])


def test_two_row_loops_rule_and_override(replay_launches):
    """One-token ``kv`` calls give non-flush rows a loop of their own, pipelined over 2 stages and up to 8 pairs a
    program, read copy or not, except under per-channel decay (1 stage, 4 pairs); ``vk`` tiles only on a 4-bit copy
    (1 stage); an explicit ``nonflush_stages`` reaches the launch (NOTE [two row loops])."""
    from replay_compile.templates import replay

    spec = replay.ReplaySpec(decay="scalar", delta=True, raw=False, layout="kv", window=16, k_heads=2,
                             read_format=None, stochastic_rounding=False, seed=0)
    tile = lambda T, **kw: replay.tiling(dataclasses.replace(spec, **kw), 128, 128, 256, 8, T)
    stages = lambda T, **kw: tile(T, **kw).nonflush_stages
    assert stages(1) == 2 and stages(1, read_format="fp8") == 2 and stages(1, read_format="fp4") == 2
    assert stages(1, decay="channel") == 1 and stages(1, decay="channel", read_format="fp8") == 1
    assert stages(1, layout="vk", read_format="fp4") == 1 and stages(4, layout="vk", read_format="fp4") == 0
    assert stages(4) == 0 and stages(1, layout="vk") == 0 and stages(1, layout="vk", read_format="fp8") == 0
    # a key group of 4 heads x 4 value tiles of 32: 8 pairs a program only on the pipelined loop
    assert tile(1).items == 8 and tile(1, read_format="fp8").items == 8 and tile(4).items == 4
    assert tile(1, decay="channel").items == 4 and tile(1, layout="vk").items == 4
    p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, generator=torch.Generator().manual_seed(5))
    for kw, want in ((dict(), (True, 2)), (dict(nonflush_stages=0), (False, 1)), (dict(nonflush_stages=3), (True, 3))):
        out = torch.empty(2, 1, 2, 3, device=DEVICE)
        triton_impl.advance_into(p.tri, p.inputs(2, T=1), None, out, commit=True, force_flush=False, **kw)
        got = (replay_launches[-1]["SPLIT"], replay_launches[-1]["STAGES"])
        assert got == want, (kw, got)


@pytest.mark.parametrize("flush_items", [0, None])
@pytest.mark.parametrize("family,layout,read,stages", [("gated_deltanet", "kv", None, 0), ("kda", "kv", "bf16", 2),
                                                       ("mamba2", "vk", "fp8", 1), ("deltanet", "vk", None, 2)])
def test_two_row_loops_forced_either_way(family, layout, read, stages, flush_items):
    """Every call (verify too) with one loop for all rows (0) or non-flush rows looping apart (1, 2: the
    interpreter ignores ``num_stages``), across flushes, padding, read copies and a unit's last program short of
    pairs (value tiles of 2 over V = 3, 3 pairs a program: the flush loop skips the missing pair, the non-flush
    loop repeats its last one; NOTE [two row loops]); split loops in one launch (``flush_items`` 0) or, with a read
    copy, in two by default (NOTE [flush launch])."""
    g = torch.Generator().manual_seed(50 + FAMILIES.index(family))
    p = Pair(family, B=3, H=2, Hk=1, K=4, V=3, L=3, layout=layout, read=read, generator=g,
             tiling=dict(block_v=2, items=3, nonflush_stages=stages, flush_items=flush_items))
    slots = torch.tensor([2, -1, 0, 1], device=DEVICE)
    for T in (1, 1, 2, 1, 1, 3, 1):
        if T == 1:
            p.step(slots=slots)
        else:
            p.verify_commit(T=T, slots=slots)


@pytest.mark.parametrize("family,read,flush_items,heads,layout", [
    ("gated_deltanet", None, 1, (2, 1), "kv"), ("kda", "fp8", 2, (2, 1), "kv"), ("gla", "fp4", 1, (2, 1), "kv"),
    ("mamba2", "bf16", 3, (2, 1), "kv"), ("gated_deltanet", "fp8", 1, (4, 2), "kv"), ("mamba2", "fp8", 1, (4, 2), "vk"),
    ("mamba2", "fp4", 1, (4, 2), "vk")])
def test_flush_launch(family, read, flush_items, heads, layout, replay_launches_run):
    """One-token calls with the flushing rows in a launch of their own before the others' (NOTE [flush launch]):
    steps across flushes, padding rows and a unit's last program short of pairs in either launch (value tiles of 2
    over V = 3), with verifies between them (one launch: verifies do not split their row loops by default), and a
    forced flush (every row at once). 4 value heads over 2 key heads: 2 units of 4 pairs each. Key-contiguous (``vk``)
    tiles split their rows by default on a 4-bit copy only; the fp8 row asks (NOTE [two row loops])."""
    g = torch.Generator().manual_seed(60 + FAMILIES.index(family))
    K = 16 if read == "fp4" else 4  # e2m1 blocks of 16 keys
    split = dict(nonflush_stages=1) if layout == "vk" and read != "fp4" else {}
    p = Pair(family, B=3, H=heads[0], Hk=heads[1], K=K, V=3, L=3, layout=layout, read=read, generator=g,
             tiling=dict(block_v=2, items=3, flush_items=flush_items, **split))
    slots = torch.tensor([2, -1, 0, 1], device=DEVICE)
    for T in (1, 1, 1, 2, 1, 1, 1, 3, 1, 1, 1, 0, 1):  # L = 3 steps in a row: every row flushes in each run of them
        if T <= 1:
            p.step(slots=slots, force_flush=T == 0)
        else:
            p.verify_commit(T=T, slots=slots)
    assert {launch["ROWS"] for launch in replay_launches_run if launch["T"] == 1} == {1, 2}


def test_flush_launch_rule(replay_launches):
    """One-token ``kv`` calls with a read copy take two launches by default, the flushing rows' first (``ROWS`` 1, one
    pair a program, then 2); without a copy one launch unless ``flush_items`` asks; calls that do not split their
    row loops (verify, ``vk`` tiles) keep one whatever it asks (NOTE [flush launch])."""
    p = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, generator=torch.Generator().manual_seed(6))
    c = Pair("gated_deltanet", B=2, H=2, Hk=1, K=4, V=3, L=4, read="fp8", generator=torch.Generator().manual_seed(6))
    q = Pair("mamba2", B=2, H=2, Hk=1, K=4, V=3, L=4, layout="vk", read="fp8",
             generator=torch.Generator().manual_seed(7))
    for pair, T, kw, want in ((p, 1, dict(flush_items=1), [1, 2]), (p, 1, dict(), [0]), (c, 1, dict(), [1, 2]),
                              (c, 1, dict(flush_items=0), [0]), (p, 2, dict(flush_items=1), [0]),
                              (q, 1, dict(flush_items=1), [0])):
        del replay_launches[:]
        out = torch.empty(2, T, 2, 3, device=DEVICE)
        triton_impl.advance_into(pair.tri, pair.inputs(2, T=T), None, out, commit=True, force_flush=False, **kw)
        assert [launch["ROWS"] for launch in replay_launches] == want, (T, kw, replay_launches)
        if want == [1, 2]:
            assert replay_launches[0]["ITEMS"] == 1


@pytest.mark.parametrize("family,read,layout,flush_bv,nonflush_bv", [
    ("gated_deltanet", "fp8", "kv", 2, 4), ("kda", "fp4", "kv", 8, 4), ("mamba2", "fp4", "vk", 4, 8)])
def test_nonflush_value_tile(family, read, layout, flush_bv, nonflush_bv, replay_launches_run):
    """The non-flush rows' launch on a value tile of its own (``nonflush_block_v``, NOTE [flush launch]): steps across
    flushes, padding rows and a forced flush, V = 9 in tiles of 2, 4 or 8 (short last tiles), 3 pairs a program (a
    unit's last program short of pairs in the launches of 2 value heads a unit); each launch gets its own tile and
    the grid it makes."""
    g = torch.Generator().manual_seed(70 + FAMILIES.index(family))
    K = 16 if read == "fp4" else 4  # e2m1 blocks of 16 keys
    p = Pair(family, B=3, H=4, Hk=2, K=K, V=9, L=3, layout=layout, read=read, generator=g,
             tiling=dict(block_v=flush_bv, nonflush_block_v=nonflush_bv, items=3, flush_items=1, nonflush_stages=1))
    slots = torch.tensor([2, -1, 0, 1], device=DEVICE)
    for T in (1, 1, 1, 1, 0, 1):
        p.step(slots=slots, force_flush=T == 0)
    tiles = {(launch["ROWS"], launch["BV"]) for launch in replay_launches_run}
    assert tiles == {(1, flush_bv), (2, nonflush_bv)}, tiles


def test_nonflush_value_tile_rule():
    """``nonflush_block_v`` sets the tile (and the pairs, ``items`` and ``parts``) of the non-flush rows' launch only
    where the flushing rows have their own; a call of one launch keeps ``BV`` for both."""
    from replay_compile.templates import replay

    spec = replay.ReplaySpec(decay="scalar", delta=True, raw=False, layout="kv", window=16, k_heads=2,
                             read_format="fp8", stochastic_rounding=False, seed=0)
    tile = lambda **kw: replay.tiling(spec, 128, 128, 256, 8, 1, **kw)
    base, wide = tile(), tile(nonflush_block_v=64)
    assert base.flush_items and base.nonflush_BV == base.BV == wide.BV == 32 and wide.nonflush_BV == 64
    assert (wide.flush_items, wide.flush_parts) == (base.flush_items, base.flush_parts)
    assert wide.items * wide.parts >= 4 * 2 > wide.items * (wide.parts - 1)  # a unit: 4 heads x 2 tiles of 64
    one, plain = tile(nonflush_block_v=64, flush_items=0), tile(flush_items=0)
    assert one.nonflush_BV == one.BV == 32 and (one.items, one.parts) == (plain.items, plain.parts)
    with pytest.raises(ValueError, match="power of two"):
        tile(nonflush_block_v=48)


def test_exact_zero_decays_in_verify():
    """A draft token or committed record with log_a = -inf inside a multi-token call: weight 0, never NaN."""
    g = torch.Generator().manual_seed(17)
    for family in ("mamba2", "gated_deltanet", "gla"):
        p = Pair(family, B=2, H=2, Hk=1, K=3, V=2, L=7, generator=g)
        for t in range(3):
            x = p.inputs(2, T=1)
            la = x.log_a.clone()
            la[t % 2, 0, 0] = float("-inf")
            p.check(*p._out(x._replace(log_a=la), None, True), f"{family} step {t}")
        x = p.inputs(2, T=3)
        la = x.log_a.clone()
        la[0, 1, 1] = float("-inf")  # the second draft token of row 0 forgets everything, in head 1
        p.check(*p._out(x._replace(log_a=la), None, False), f"{family} verify")
