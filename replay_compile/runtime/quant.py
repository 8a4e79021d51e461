"""Low-precision read copies of the fp32 checkpoint.

A read copy is what non-flush steps read instead of the checkpoint; it is re-quantized from the
fp32 checkpoint at every flush, so its error never feeds back into the recurrence. Blocks run along
the last dim (``C``); ``R`` is the second-to-last dim. ``ReplayState`` stores its copy value-major
(``R = V``, ``C = K``: NOTE [read copy orientation] in ``state.py``).

| format | storage per ``[R, C]`` head                      | scales                                       |
|--------|---------------------------------------------------|----------------------------------------------|
| bf16   | ``[R, C]`` bfloat16                               | none                                         |
| fp16   | ``[R, C]`` float16                                | none                                         |
| fp8    | ``[R, C]`` float8_e4m3fn                          | one fp32 per row: ``amax / 448``             |
| fp4    | ``[R, ceil(C/16)*8]`` uint8, two e2m1 codes/byte  | one e4m3 per 16 values, times one fp32 per row |

fp4 (e2m1, "NVFP4"-style) codes are sign | 3-bit magnitude over {0, .5, 1, 1.5, 2, 3, 4, 6}; a value
rounds to the nearest magnitude, ties toward zero (``code = #midpoints below |x|``); the low nibble
holds the even column. A key-major format (``ReadFormat.key_major``) stores its data ``[..., C, R]`` and hands it
out as the transposed view; its 4-bit codes pair rows instead (``[..., ceil(R/2), CP]`` seen, low nibble = even
row) and its block scales are stored ``[..., nb, R]`` (seen ``[..., R, nb]``): NOTE [read copy orientation] in
``state.py``. Block scale ``b = e4m3(amax_block / s_row / 6)`` with
``s_row = amax_row / (6 * 448)``, so every block scale fits e4m3's range whatever the state's size.

Values are scaled by multiplying with fp32 reciprocals, as the kernels do, where a division per value slowed the
flushing rows: one IEEE division per row scale; a 4-bit value is ``|x| * (1/b * 1/s_row)``, with ``1/b`` (exact
IEEE reciprocal of the e4m3 block scale) from a table in the kernels (NOTE [read-copy reciprocals] in
``templates/readcopy.py``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_BLOCK = 16
FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
READ_DTYPES = ("bf16", "fp16", "fp8", "fp4")


@dataclasses.dataclass(frozen=True)
class ReadFormat:
    name: str
    key_major: bool = False  # storage order (module docstring); kernels read it from strides (readcopy.key_major)

    @property
    def bits(self) -> float:
        return {"bf16": 16, "fp16": 16, "fp8": 8, "fp4": 4}[self.name]

    def alloc(self, shape, device) -> dict[str, torch.Tensor]:
        """Zeroed storage for read copies of states of ``shape = [..., R, C]`` (key-major: transposed views)."""
        *lead, R, C = shape
        if self.name != "fp4":
            data = _zeros(shape, _torch_dtype(self.name), device, self.key_major)
            if self.name != "fp8":
                return {"data": data}
            return {"data": data, "row_scale": torch.ones(*lead, R, dtype=torch.float32, device=device)}
        nb = -(-C // FP4_BLOCK)
        data_shape = (*lead, -(-R // 2), nb * FP4_BLOCK) if self.key_major else (*lead, R, nb * FP4_BLOCK // 2)
        return {"data": _zeros(data_shape, torch.uint8, device, self.key_major),
                "block_scale": _zeros((*lead, R, nb), torch.float8_e4m3fn, device, self.key_major),
                "row_scale": torch.ones(*lead, R, dtype=torch.float32, device=device)}

    def quantize(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parts of the read copy of fp32 ``x [..., R, C]`` (same keys and shapes as :meth:`alloc`)."""
        x = x.float()
        if self.name in ("bf16", "fp16"):
            return {"data": x.to(_torch_dtype(self.name))}
        if self.name == "fp8":
            s = _row_scale(x, FP8_MAX)
            return {"data": (x * torch.reciprocal(s)[..., None]).to(torch.float8_e4m3fn), "row_scale": s}
        return _fp4_quantize(x, self.key_major)

    def dequantize(self, parts: dict[str, torch.Tensor], C: Optional[int] = None) -> torch.Tensor:
        """fp32 values of a read copy; ``C`` trims fp4's padding to the state's last dim."""
        if self.name in ("bf16", "fp16"):
            return parts["data"].float()
        if self.name == "fp8":
            return parts["data"].float() * parts["row_scale"][..., None]
        return _fp4_dequantize(parts, C, self.key_major)


def read_format(name: Optional[str], layout: str = "vk") -> Optional[ReadFormat]:
    """The read copy ``name`` of a state of ``layout``: fp8 and fp4 copies of ``kv`` states are stored key-major
    (NOTE [read copy orientation] in ``state.py``)."""
    if name is None or name == "none":
        return None
    if name not in READ_DTYPES:
        raise ValueError(f"read copy dtype must be one of {('none',) + READ_DTYPES}, got {name!r}")
    return ReadFormat(name, key_major=name in ("fp8", "fp4") and layout == "kv")


def _zeros(shape, dtype, device, transposed: bool) -> torch.Tensor:
    """Zeros of ``shape``, stored with the last two dims swapped where ``transposed`` (a transposed view)."""
    if not transposed:
        return torch.zeros(shape, dtype=dtype, device=device)
    *lead, R, C = shape
    return torch.zeros(*lead, C, R, dtype=dtype, device=device).transpose(-1, -2)


def _torch_dtype(name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[name]


def _row_scale(x: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = x.abs().amax(-1)
    amax = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
    # a multiply by the fp32 reciprocal: what CUDA torch does for ``tensor / python_scalar`` (CPU torch
    # divides), so CPU, GPU and the Triton kernels agree bit for bit
    return torch.where(amax > 0, amax * (1.0 / qmax), torch.ones_like(amax))


def _fp4_quantize(x: torch.Tensor, pair_rows: bool) -> dict[str, torch.Tensor]:
    *lead, R, C = x.shape
    nb = -(-C // FP4_BLOCK)
    xp = torch.nn.functional.pad(x, (0, nb * FP4_BLOCK - C)).view(*lead, R, nb, FP4_BLOCK)
    s_row = _row_scale(x, FP4_MAX * FP8_MAX)
    # one division a row; the e4m3 block scales' reciprocals come from a table in the kernels (readcopy.py)
    inv_s = torch.reciprocal(s_row)[..., None]
    b = (xp.abs().amax(-1) * inv_s * (1.0 / FP4_MAX)).to(torch.float8_e4m3fn)
    bf = b.float()
    y = xp.abs() * (torch.where(bf > 0, torch.reciprocal(bf), torch.zeros_like(bf)) * inv_s)[..., None]
    code = torch.zeros_like(y, dtype=torch.uint8)
    for m in FP4_MIDPOINTS:
        code += (y > m).to(torch.uint8)
    code |= (xp < 0).to(torch.uint8) << 3
    code = code.view(*lead, R, nb * FP4_BLOCK)
    if pair_rows:  # [R2, 2, CP]: rows 2i and 2i + 1 share a byte
        code = torch.nn.functional.pad(code, (0, 0, 0, R % 2)).view(*lead, -1, 2, nb * FP4_BLOCK)
        lo, hi = code.unbind(-2)
    else:  # [R, CP/2, 2]: columns 2i and 2i + 1 share a byte
        lo, hi = code.view(*lead, R, -1, 2).unbind(-1)
    return {"data": lo | (hi << 4), "block_scale": b, "row_scale": s_row}


def _fp4_dequantize(parts, C: Optional[int], pair_rows: bool) -> torch.Tensor:
    data, b, s_row = parts["data"], parts["block_scale"], parts["row_scale"]
    R = s_row.shape[-1]
    if pair_rows:
        codes = torch.stack((data & 0xF, data >> 4), dim=-2).flatten(-3, -2)[..., :R, :].long()
    else:
        codes = torch.stack((data & 0xF, data >> 4), dim=-1).flatten(-2).long()
    m = codes & 7  # e2m1 magnitude: m/2 for the subnormals 0, 1; else 2^(m//2 - 1) * (1 + (m % 2) / 2)
    mag = torch.where(m < 2, m * 0.5, torch.exp2((m // 2 - 1).float()) * (1 + (m % 2) * 0.5)).float()
    val = torch.where((codes & 8) != 0, -mag, mag)
    *lead, ncol = val.shape
    nb = b.shape[-1]
    val = val.view(*lead, nb, FP4_BLOCK) * (b.float() * s_row[..., None])[..., None]
    val = val.view(*lead, ncol)
    return val if C is None else val[..., :C]
