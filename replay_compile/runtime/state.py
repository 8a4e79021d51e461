"""``ReplayState``: one recurrent state (or slot pool) held in ReplaySSM form.

The user's state tensor *is* the checkpoint. Beside it the object owns, per physical slot:

    ring      the last (up to) L input records:  log_a [N, L, Hv(, K)], k [N, L, Hk, K], u [N, L, Hv, V]
              (+ raw v [N, L, Hv, V] and beta [N, L, Hv] for delta-rule folds replayed exactly)
    count     [N] int32   committed records since the checkpoint (device tensor; never read on the host)
    flushes   [N] int64   checkpoint writes so far (also keys stochastic rounding)
    nonfinite [N] bool    a non-finite input reached this slot since its last reset
    read      optional low-precision read copy of the checkpoint (see ``quant``), seen value-major
              ``[N, Hv, V, K]`` whatever the layout (NOTE [read copy orientation])

# NOTE [read copy orientation]
A read copy's scales run along its last dim. Seen value-major, every value column of the state has
its own scales over all K keys, so a kernel program that owns a tile of value columns (the unit every
family's read reduces over keys for) owns whole scale rows and can re-quantize them at a flush alone.
fp8 data of ``kv`` states are stored key-major all the same (``[N, Hv, K, V]``, seen through a transposed view),
so a kernel loads the copy's tile in the layout of the checkpoint's tile and of the window's records
(``readcopy._data_offsets``). Value-major, Triton computed a one-token step's tile reads twice, in two layouts,
with a conversion of the tile between them (sm_90 compile of GDN's step at L = 8: 3784 -> 3064 SASS instructions,
tile reductions 5 -> 4 as without a copy, no tile conversion). H100, batch 256, L = 8, step (non-flush) us, value-
major -> key-major in the same run (2026-12-06): GDN 560.8 (367.9) -> 494.6 (286.5), KDA 286.8 (183.1) -> 270.5
(151.9). 16-bit copies stay value-major: key-major their flushing rows got slower than the reads got faster (GDN
560.1 -> 569.5 us, KDA 289.3 -> 310.1, runs minutes apart on one H100). 4-bit copies of ``kv`` states are key-major
too: their codes then pair values (two a byte, ``quant.py``), load in the tile's layout, and meet block scales
stored ``[KP / 16, V]``, broadcast over their 16 keys; value-major, the codes packed two keys a byte and were
unpacked as ``[V, K]`` and transposed (sm_90 compile of the steps at L = 16, value-major -> key-major: GDN 2 -> 0
tile conversions, SASS 6064 -> 5640 instructions, spills 364 -> 442 bytes; KDA 4 -> 2 conversions, as its fp8 step,
7072 -> 6728). H100, batch 256, L = 16, step (non-flush) us, same run (2026-12-07): GDN 655.5 (392.4) -> 616.6
(349.6), KDA 394.0 (230.6) -> 353.1 (179.2).

# NOTE [checkpoint dtype]
``checkpoint_dtype`` (bf16/fp16) narrows the checkpoint of a float32 user state: the object then
keeps its own 16-bit checkpoint (rounded to nearest at creation, stochastically at flushes when
asked) and the user's tensor is written only by :meth:`materialize` (the 16-bit checkpoint, folded
and widened) and read only by :meth:`reload`. Without it the user's tensor is the checkpoint.

# NOTE [weak state]
``weak_state=True`` (the op registry's objects) keeps only weak references to the user's tensor:
the tensor last handed in and its storage. A call made while the caller holds the tensor uses it;
otherwise a view is rebuilt from the storage. So a registry entry never keeps a freed state alive.

Rows of a call address slots through ``slots [B]`` (the serving-engine layout; -1 marks a padding
row that touches nothing and gets a zero output). ``slots=None`` means row b is slot b.

# NOTE [cursor invariants]
``0 <= count <= L`` always; records at ring positions ``>= count`` are garbage and are masked, never
multiplied by zero (they may hold NaN from a poisoned earlier sequence). ``reset`` zeroes the
checkpoint, read copy, ring and cursors of a slot. Value checks on slots and acceptance counts need
the host and are skipped while a CUDA graph is being captured (kernels clamp instead).
"""
from __future__ import annotations

import weakref
from typing import Optional, Sequence, Union

import torch

from ..families import RecurrenceFamily, get_family
from ..families.base import Canonical, LAYOUTS, compute_dtype
from ..templates import verify_forms
from . import quant, reference

_CHECKPOINT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class ReplayError(ValueError):
    """Bad input to a replay operation; the state was not touched."""


class ReplayState:
    """A recurrent state in replay form.

    Args:
        state: the checkpoint, ``[N, Hv, K, V]`` (layout ``"kv"``) or ``[N, Hv, V, K]`` (``"vk"``); N is
            the batch of a plain state or the number of slots of a pool. Updated in place at flushes.
        family: a :class:`RecurrenceFamily` or a registered name.
        window: L, records kept before a flush (``L = 1`` is the standard recurrence).
        layout: ``"kv"`` or ``"vk"``.
        k_heads: query/key heads Hk (Hv must be a multiple); default Hv.
        read_dtype: ``None``/``"none"``, ``"bf16"``, ``"fp16"``, ``"fp8"`` or ``"fp4"``.
        ring_dtype: dtype of ring records (default: the compute dtype, float32 or float64).
        stochastic_rounding: round the flush write of a bf16/fp16 checkpoint stochastically.
        seed: base seed of stochastic rounding (streams are per slot and flush).
        validate: check slot indices and acceptance counts on the host (skipped during graph capture).
        kernels: ``"torch"`` (plain-torch reference), ``"triton"`` (generated kernels; on the CPU they run
            under ``TRITON_INTERPRET=1``) or ``"auto"`` (Triton on CUDA, torch elsewhere).
        checkpoint_dtype: ``torch.bfloat16``/``torch.float16`` keeps a 16-bit checkpoint of a float32
            ``state`` (NOTE [checkpoint dtype]); None or ``state.dtype``: ``state`` is the checkpoint.
        weak_state: hold ``state`` only weakly (NOTE [weak state]).
        verify_form: the Triton path's verify template: ``"auto"``, ``"tokens"`` or ``"chunked[:k=v,...]"``
            (``templates/verify_forms.py``; the torch path ignores it).
    """

    def __init__(self, state: torch.Tensor, family: Union[str, RecurrenceFamily], window: int, *,
                 layout: str = "kv", k_heads: Optional[int] = None, read_dtype: Optional[str] = None,
                 ring_dtype: Optional[torch.dtype] = None, stochastic_rounding: bool = False, seed: int = 0,
                 validate: bool = True, kernels: str = "auto", checkpoint_dtype: Optional[torch.dtype] = None,
                 weak_state: bool = False, verify_form: str = "auto"):
        self.family = get_family(family) if isinstance(family, str) else family
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ReplayError(f"window L must be an integer >= 1, got {window!r}")
        if layout not in LAYOUTS:
            raise ReplayError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if not isinstance(state, torch.Tensor) or state.dim() != 4:
            raise ReplayError(f"state must be a 4-D tensor [N, Hv, K, V] or [N, Hv, V, K], got "
                              f"{getattr(state, 'shape', type(state))}")
        if state.dtype not in _CHECKPOINT_DTYPES:
            raise ReplayError(f"state dtype must be one of {_CHECKPOINT_DTYPES}, got {state.dtype}")
        self._user = _StateHandle(state, weak=weak_state)
        self._own_checkpoint = _narrowed_checkpoint(state, checkpoint_dtype)
        if stochastic_rounding and self.state.dtype not in (torch.bfloat16, torch.float16):
            raise ReplayError("stochastic_rounding needs a bf16 or fp16 checkpoint")
        self.window, self.layout = window, layout
        self.num_slots, self.num_heads = state.shape[0], state.shape[1]
        self.head_k, self.head_v = (state.shape[2], state.shape[3]) if layout == "kv" else (state.shape[3], state.shape[2])
        self.num_k_heads = k_heads or self.num_heads
        if self.num_heads % self.num_k_heads:
            raise ReplayError(f"{self.num_heads} value heads is not a multiple of k_heads={self.num_k_heads}")
        self.compute_dtype = compute_dtype(self.state.dtype)
        self.read_format = quant.read_format(read_dtype, layout)
        self.stochastic_rounding, self.seed, self.validate = stochastic_rounding, int(seed), validate
        # delta-rule folds replay raw inputs when reads are approximate (REPLAYSSM.md section 4)
        self.raw_fold = self.family.delta and self.read_format is not None
        self._alloc(ring_dtype or self.compute_dtype)
        self.impl = _select_impl(kernels, self.state.device)
        try:  # the verify's template on the Triton path (templates/verify_forms.py)
            self.verify_form, self.verify_choice = verify_form, verify_forms.parse(verify_form)
        except ValueError as e:
            raise ReplayError(str(e)) from None
        self._pending: Optional[tuple[Optional[torch.Tensor], int]] = None

    @property
    def state(self) -> torch.Tensor:
        """The checkpoint: the user's tensor, or the object's own 16-bit copy (NOTE [checkpoint dtype])."""
        return self._own_checkpoint if self._own_checkpoint is not None else self._user.get()

    @property
    def user_state(self) -> torch.Tensor:
        """The user's state tensor (exact after :meth:`materialize`)."""
        return self._user.get()

    def holds(self, state: torch.Tensor) -> bool:
        """Whether ``state`` is this object's user tensor (same memory and geometry); remembers it."""
        return self._user.offer(state)

    # ----------------------------------------------------------------------------------- buffers
    def _alloc(self, ring_dtype):
        N, L, H, Hk, K, V, dev = (self.num_slots, self.window, self.num_heads, self.num_k_heads,
                                  self.head_k, self.head_v, self.state.device)
        z = lambda *s, dtype=ring_dtype: torch.zeros(*s, dtype=dtype, device=dev)  # noqa: E731
        self.ring = {"k": z(N, L, Hk, K), "u": z(N, L, H, V)}
        if self.family.decay == "scalar":
            self.ring["log_a"] = z(N, L, H, dtype=self.compute_dtype)
        elif self.family.decay == "channel":
            self.ring["log_a"] = z(N, L, H, K, dtype=self.compute_dtype)
        if self.raw_fold:
            self.ring["v"], self.ring["beta"] = z(N, L, H, V), z(N, L, H)
        self.count = torch.zeros(N, dtype=torch.int32, device=dev)
        self.flushes = torch.zeros(N, dtype=torch.int64, device=dev)
        self.nonfinite = torch.zeros(N, dtype=torch.bool, device=dev)
        # the Triton kernels' per-row tickets (NOTE [the last program moves the cursors]), 0 between calls
        self.tickets = torch.zeros(N, dtype=torch.int32, device=dev)
        self.read = None
        if self.read_format is not None:
            self.read = self.read_format.alloc(self.read_view(self.state).shape, dev)
            for name, part in self.read_format.quantize(self.read_view(self.state).float()).items():
                self.read[name].copy_(part)

    def owned_tensors(self) -> list:
        """Every tensor this object allocated (ring, cursors, read copy, own checkpoint), not the user's state."""
        found = []
        for value in vars(self).values():
            values = value.values() if isinstance(value, dict) else (value,)
            found += [t for t in values if isinstance(t, torch.Tensor)]
        return found

    def memory_report(self) -> dict:
        """Bytes held: checkpoint, read copy, ring, cursors, their total, and the total per slot."""
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        rep = {"checkpoint": nbytes([self.state]),
               "read_copy": nbytes(self.read.values()) if self.read else 0,
               "ring": nbytes(self.ring.values()),
               "cursors": nbytes([self.count, self.flushes, self.nonfinite, self.tickets])}
        rep["total"] = sum(rep.values())
        rep["per_slot"] = rep["total"] / self.num_slots
        return rep

    # -------------------------------------------------------------------------------- operations
    def step(self, q, k, v, log_a=None, beta=None, *, slots=None, force_flush: bool = False) -> torch.Tensor:
        """Decode one token per row; returns ``o [B, Hv, V]``.

        Inputs are canonical (``q, k [B, Hk, K]``, ``v [B, Hv, V]``, ``log_a [B, Hv] | [B, Hv, K]``,
        ``beta [B, Hv]``). Each row appends its record; a row whose ring becomes full folds it into
        the checkpoint (each row at its own phase). ``force_flush`` folds every row (the standard route).
        """
        self._no_pending("step")
        if not all(t is None or isinstance(t, torch.Tensor) for t in (q, k, v, log_a, beta)):
            raise ReplayError("step inputs must be tensors (or None)")
        x = Canonical(*(None if t is None else t[:, None] for t in (q, k, v, log_a, beta)))
        return self._advance(x, slots, commit=True, force_flush=force_flush)[:, 0]

    def verify(self, q, k, v, log_a=None, beta=None, *, slots=None) -> torch.Tensor:
        """Outputs of ``T`` draft tokens per row (inputs ``[B, T, ...]``), records appended tentatively.

        Returns ``o [B, T, Hv, V]``. Follow with :meth:`commit`. Rows whose ring cannot take ``T`` more
        records fold their committed ones first.
        """
        self._no_pending("verify")
        x = Canonical(q, k, v, log_a, beta)
        o = self._advance(x, slots, commit=False, force_flush=False)
        self._pending = (slots, q.shape[1])
        return o

    def commit(self, n_accepted) -> None:
        """Keep the first ``n_accepted[b]`` (0..T) draft records of each row of the last verify."""
        if self._pending is None:
            raise ReplayError("commit without a pending verify")
        slots, T = self._pending
        B = self.num_slots if slots is None else slots.shape[0]
        n = accepted_counts(n_accepted, B, T, self.count.device, check_range=self._checking())
        self._check_slots(slots, B)
        self.impl.commit(self, n, slots)
        self._pending = None

    def materialize(self, slots=None) -> torch.Tensor:
        """Make the checkpoint exact (fold committed records); the state tensor is returned."""
        self._no_pending("materialize")
        slots = as_slots(slots, self.state.device)
        self._check_slots(slots, None)
        self.impl.materialize(self, slots)
        if self._own_checkpoint is not None:
            s = self._slot_index(slots)
            self.user_state[s] = self.state[s].to(self.user_state.dtype)
        return self.user_state

    def reload(self, slots=None) -> None:
        """The checkpoint of ``slots`` was written from outside: drop their rings, rebuild their read copy."""
        self._no_pending("reload")
        s = self._slot_index(slots)
        self.count[s] = 0
        if self._own_checkpoint is not None:
            self.state[s] = self.user_state[s].to(self.state.dtype)
        if self.read_format is not None:
            for name, part in self.read_format.quantize(self.read_view(self.state[s]).float()).items():
                self.read[name][s] = part

    def reset(self, slots) -> None:
        """Start ``slots`` clean: zero checkpoint, read copy, ring and cursors (a recycled slot)."""
        self._no_pending("reset")
        s = self._slot_index(torch.as_tensor(slots, device=self.state.device).view(-1))
        self.state[s] = 0
        if self._own_checkpoint is not None:
            self.user_state[s] = 0
        for buf in (*self.ring.values(), self.count, self.flushes, self.nonfinite):
            buf[s] = 0
        if self.read_format is not None:
            zero = torch.zeros_like(self.read_view(self.state[s]), dtype=torch.float32)
            for name, part in self.read_format.quantize(zero).items():
                self.read[name][s] = part

    # ----------------------------------------------------------------------------------- helpers
    def read_view(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a state-shaped tensor) in the read copy's value-major orientation ``[..., V, K]``."""
        return t.transpose(-1, -2) if self.layout == "kv" else t

    def _advance(self, x: Canonical, slots, *, commit, force_flush):
        self._check_inputs(x)
        self._check_slots(slots, x.q.shape[0])
        return self.impl.advance(self, x, slots, commit=commit, force_flush=force_flush)

    def _slot_index(self, slots):
        """Index of the slots a maintenance call touches (all slots for None; padding dropped)."""
        slots = as_slots(slots, self.state.device)
        self._check_slots(slots, None)
        return slice(None) if slots is None else slots[slots >= 0]

    def _checking(self) -> bool:
        return self.validate and not (self.state.is_cuda and torch.cuda.is_current_stream_capturing())

    def _no_pending(self, op):
        if self._pending is not None:
            raise ReplayError(f"{op} between verify and commit: commit the pending draft first")

    def _check_slots(self, slots, B: Optional[int]) -> None:
        """Validate ``slots`` (None: row b is slot b) for a call of ``B`` rows (None: any)."""
        if slots is None:
            if B is not None and B != self.num_slots:
                raise ReplayError(f"batch of {B} rows but the state has {self.num_slots} slots: pass slots=")
            return
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
            raise ReplayError("slots must be a 1-D int32/int64 tensor (-1 marks a padding row)")
        if slots.device != self.state.device:
            raise ReplayError(f"slots are on {slots.device}, the state on {self.state.device}")
        if B is not None and slots.shape[0] != B:
            raise ReplayError(f"{slots.shape[0]} slot indices for a batch of {B} rows")
        if self._checking():
            bad = (slots < -1) | (slots >= self.num_slots)
            if bool(bad.any()):
                raise ReplayError(f"unknown slot(s) {slots[bad].tolist()}: the pool has {self.num_slots} slots")
            real = slots[slots >= 0]
            if real.unique().numel() != real.numel():
                raise ReplayError("a slot appears in two rows of one call")

    def _check_inputs(self, x: Canonical) -> int:
        fam, H, Hk, K, V = self.family, self.num_heads, self.num_k_heads, self.head_k, self.head_v
        if not isinstance(x.q, torch.Tensor) or x.q.dim() != 4:
            raise ReplayError(f"q must be [B, Hk, K] (or [B, T, Hk, K] for verify), got {getattr(x.q, 'shape', x.q)}")
        B, T = x.q.shape[:2]
        if T < 1 or T > self.window:
            raise ReplayError(f"draft length T={T} must lie in [1, L={self.window}]")
        want = {"q": (B, T, Hk, K), "k": (B, T, Hk, K), "v": (B, T, H, V),
                "log_a": None if fam.decay == "none" else ((B, T, H) if fam.decay == "scalar" else (B, T, H, K)),
                "beta": (B, T, H) if fam.delta else None}
        for name, t in zip(x._fields, x):
            shape = want[name]
            if shape is None:
                if t is not None:
                    raise ReplayError(f"family {fam.name!r} takes no {name}")
                continue
            if not isinstance(t, torch.Tensor):
                raise ReplayError(f"family {fam.name!r} needs {name} of shape {shape}")
            if tuple(t.shape) != shape:
                raise ReplayError(f"{name} has shape {tuple(t.shape)}, expected {shape} (B, T, heads, dim) "
                                  f"for this state (Hv={H}, Hk={Hk}, K={K}, V={V})")
            if not t.dtype.is_floating_point:
                raise ReplayError(f"{name} must be floating point, got {t.dtype}")
            if t.device != self.state.device:
                raise ReplayError(f"{name} is on {t.device}, the state on {self.state.device}")
        return B


class _StateHandle:
    """The user's state tensor, held strongly or weakly (NOTE [weak state])."""

    def __init__(self, state: torch.Tensor, weak: bool):
        self.weak = weak
        self.geometry = (state.storage_offset(), tuple(state.shape), tuple(state.stride()), state.dtype,
                         state.device)
        self.data_ptr = state.data_ptr()
        if weak:
            self._storage = weakref.ref(state.untyped_storage())
            self._tensor = weakref.ref(state)
        else:
            self._strong = state

    def get(self) -> torch.Tensor:
        if not self.weak:
            return self._strong
        t = self._tensor()
        if t is not None and t.data_ptr() == self.data_ptr:  # (a tensor can be re-pointed with set_)
            return t
        storage = self._storage()
        if storage is None:
            raise ReplayError("the state tensor of this ReplayState was freed")
        offset, shape, stride, dtype, device = self.geometry
        t = torch.empty(0, dtype=dtype, device=device).set_(storage, offset, shape, stride)
        self._tensor = weakref.ref(t)
        return t

    def offer(self, state: torch.Tensor) -> bool:
        """``state`` is the same memory and geometry as the held tensor (then it is remembered)."""
        same = (state.data_ptr() == self.data_ptr and (state.storage_offset(), tuple(state.shape),
                tuple(state.stride()), state.dtype, state.device) == self.geometry)
        if same and self.weak:
            same = self._storage() is state.untyped_storage()
            self._tensor = weakref.ref(state)
        return same


def _narrowed_checkpoint(state: torch.Tensor, dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
    """The object's own 16-bit checkpoint, or None when ``state`` is the checkpoint."""
    if dtype is None or dtype == state.dtype:
        return None
    if state.dtype != torch.float32 or dtype not in (torch.bfloat16, torch.float16):
        raise ReplayError(f"checkpoint_dtype={dtype} needs a float32 state (got {state.dtype}); a state "
                          f"already in a 16-bit dtype is its own checkpoint")
    return state.detach().to(dtype)


def resolve_kernels(kernels: str, device: torch.device) -> str:
    """``"torch"`` or ``"triton"``: what the ``kernels`` option means on ``device`` (``"auto"``: Triton on CUDA)."""
    if kernels not in ("auto", "torch", "triton"):
        raise ReplayError(f"kernels must be 'auto', 'torch' or 'triton', got {kernels!r}")
    if kernels == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return kernels


def _select_impl(kernels: str, device: torch.device):
    """The module implementing ``advance / commit / materialize`` for this state."""
    if resolve_kernels(kernels, device) == "torch":
        return reference
    from . import triton_impl  # noqa: PLC0415  (imports triton)
    return triton_impl


def accepted_counts(n_accepted, B: int, T: int, device, check_range: bool = True) -> torch.Tensor:
    """``n_accepted`` (an int, or an integer tensor ``[B]`` or scalar) as a ``[B]`` tensor on ``device``.

    A Python int becomes a fill kernel, not a host copy, so a committing op can run inside a CUDA-graph
    capture; ``check_range`` (a host sync for tensors) checks ``0 <= n <= T``.
    """
    if isinstance(n_accepted, int) and not isinstance(n_accepted, bool):
        if not 0 <= n_accepted <= T:
            raise ReplayError(f"n_accepted must lie in [0, T={T}], got {n_accepted}")
        return torch.full((B,), n_accepted, dtype=torch.int64, device=device)
    n = torch.as_tensor(n_accepted, device=device)
    if n.dim() == 0:
        n = n.expand(B)
    if n.shape != (B,) or n.dtype.is_floating_point or n.dtype == torch.bool:
        raise ReplayError(f"n_accepted must be an integer or an integer tensor of shape [{B}], got "
                          f"{tuple(n.shape)} {n.dtype}")
    if check_range and bool(((n < 0) | (n > T)).any()):
        raise ReplayError(f"n_accepted must lie in [0, T={T}], got {n.tolist()}")
    return n


def as_slots(slots: Union[None, Sequence[int], torch.Tensor], device) -> Optional[torch.Tensor]:
    """Convenience: turn a list of slot indices into the int64 tensor the operations take."""
    return None if slots is None else torch.as_tensor(slots, dtype=torch.int64, device=device)
