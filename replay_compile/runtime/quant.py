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
holds the even column. Block scale ``b = e4m3(amax_block / s_row / 6)`` with
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

    @property
    def bits(self) -> float:
        return {"bf16": 16, "fp16": 16, "fp8": 8, "fp4": 4}[self.name]

    def key_major(self, layout: str) -> bool:
        """Whether ``ReplayState`` stores this format's data key-major for a state of ``layout`` (NOTE [read copy
        orientation] in ``state.py``; kernels read it from the data's strides, ``templates.readcopy.key_major``)."""
        return self.name == "fp8" and layout == "kv"

    def alloc(self, shape, device, *, column_major: bool = False) -> dict[str, torch.Tensor]:
        """Zeroed storage for read copies of states of ``shape = [..., R, C]``.

        ``column_major``: 16-bit and fp8 data live in a ``[..., C, R]`` buffer, handed out as its transposed view
        (shape ``[..., R, C]``: every torch operation is unchanged, only kernels see the strides). 4-bit codes pack
        two columns a byte and stay row-major.
        """
        *lead, C = shape
        if self.name != "fp4":
            dtype = _torch_dtype(self.name)
            data = (torch.zeros(*shape[:-2], C, shape[-2], dtype=dtype, device=device).transpose(-1, -2) if column_major
                    else torch.zeros(shape, dtype=dtype, device=device))
            if self.name != "fp8":
                return {"data": data}
            return {"data": data, "row_scale": torch.ones(lead, dtype=torch.float32, device=device)}
        nb = -(-C // FP4_BLOCK)
        return {"data": torch.zeros(*lead, nb * FP4_BLOCK // 2, dtype=torch.uint8, device=device),
                "block_scale": torch.zeros(*lead, nb, dtype=torch.float8_e4m3fn, device=device),
                "row_scale": torch.ones(lead, dtype=torch.float32, device=device)}

    def quantize(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parts of the read copy of fp32 ``x [..., R, C]`` (same keys as :meth:`alloc`)."""
        x = x.float()
        if self.name in ("bf16", "fp16"):
            return {"data": x.to(_torch_dtype(self.name))}
        if self.name == "fp8":
            s = _row_scale(x, FP8_MAX)
            return {"data": (x * torch.reciprocal(s)[..., None]).to(torch.float8_e4m3fn), "row_scale": s}
        return _fp4_quantize(x)

    def dequantize(self, parts: dict[str, torch.Tensor], C: Optional[int] = None) -> torch.Tensor:
        """fp32 values of a read copy; ``C`` trims fp4's padding to the state's last dim."""
        if self.name in ("bf16", "fp16"):
            return parts["data"].float()
        if self.name == "fp8":
            return parts["data"].float() * parts["row_scale"][..., None]
        return _fp4_dequantize(parts, C)


def read_format(name: Optional[str]) -> Optional[ReadFormat]:
    if name is None or name == "none":
        return None
    if name not in READ_DTYPES:
        raise ValueError(f"read copy dtype must be one of {('none',) + READ_DTYPES}, got {name!r}")
    return ReadFormat(name)


def _torch_dtype(name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[name]


def _row_scale(x: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = x.abs().amax(-1)
    amax = torch.where(torch.isfinite(amax), amax, torch.zeros_like(amax))
    # a multiply by the fp32 reciprocal: what CUDA torch does for ``tensor / python_scalar`` (CPU torch
    # divides), so CPU, GPU and the Triton kernels agree bit for bit
    return torch.where(amax > 0, amax * (1.0 / qmax), torch.ones_like(amax))


def _fp4_quantize(x: torch.Tensor) -> dict[str, torch.Tensor]:
    *lead, C = x.shape
    nb = -(-C // FP4_BLOCK)
    xp = torch.nn.functional.pad(x, (0, nb * FP4_BLOCK - C)).view(*lead, nb, FP4_BLOCK)
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
    code = code.view(*lead, nb * FP4_BLOCK // 2, 2)
    return {"data": code[..., 0] | (code[..., 1] << 4), "block_scale": b, "row_scale": s_row}


def _fp4_dequantize(parts, C: Optional[int]) -> torch.Tensor:
    data, b, s_row = parts["data"], parts["block_scale"], parts["row_scale"]
    codes = torch.stack((data & 0xF, data >> 4), dim=-1).flatten(-2).long()
    m = codes & 7  # e2m1 magnitude: m/2 for the subnormals 0, 1; else 2^(m//2 - 1) * (1 + (m % 2) / 2)
    mag = torch.where(m < 2, m * 0.5, torch.exp2((m // 2 - 1).float()) * (1 + (m % 2) * 0.5)).float()
    val = torch.where((codes & 8) != 0, -mag, mag)
    *lead, ncol = val.shape
    nb = b.shape[-1]
    val = val.view(*lead, nb, FP4_BLOCK) * (b.float() * s_row[..., None])[..., None]
    val = val.view(*lead, ncol)
    return val if C is None else val[..., :C]
