"""Read-copy tiles inside a kernel: dequantize on load, re-quantize at a flush (formats of ``runtime/quant.py``).

Tiles are handled in the ``[K, V]`` orientation of the math; the read copy is stored in the state's
physical layout (rows ``R``, last dim ``C``: ``[K, V]`` for ``"kv"``, ``[V, K]`` for ``"vk"``), and its
scales run along ``C``. A program that quantizes must therefore own whole physical rows (columns start
at 0): the launcher gives kv-layout states with fp8/fp4 read copies one value tile covering all of ``V``.

Format codes: 0 none, 1 bf16/fp16 (plain cast), 2 fp8-e4m3 + fp32 row scale, 3 e2m1 (two codes a byte,
low nibble = even column) + e4m3 block scale per 16 + fp32 row scale. Divisions use ``tl.div_rn`` so
scales and codes match torch's IEEE division bit for bit (row scales multiply by ``1 / qmax`` in fp32,
as ``quant._row_scale`` does).
"""
from __future__ import annotations

import triton
import triton.language as tl

READ_CODES = {None: 0, "bf16": 1, "fp16": 1, "fp8": 2, "fp4": 3}
FP8_MAX = tl.constexpr(448.0)
FP4_MAX = tl.constexpr(6.0)


@triton.jit
def _to_physical(x, LAYOUT_KV: tl.constexpr):
    """``[K, V]`` tile <-> physical ``[R, C]`` tile (a transpose for the vk layout; its own inverse)."""
    if not LAYOUT_KV:
        x = tl.trans(x)
    return x


@triton.jit
def _row_scale(amax, qmax):
    finite = amax < float("inf")
    amax = tl.where(finite, amax, 0.0)
    return tl.where(amax > 0, amax * (1.0 / qmax), 1.0)  # fp32 reciprocal, as quant._row_scale


@triton.jit
def _fp4_magnitude(code):
    """e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} of 3-bit codes."""
    c = code.to(tl.float32)
    return tl.where(code < 4, 0.5 * c, tl.where(code == 7, 6.0, c - 2.0))


@triton.jit
def load_read_tile(data, row_scale, block_scale, head_off, rows, cols, mask_rc, use,
                   R: tl.constexpr, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                   READ: tl.constexpr, LAYOUT_KV: tl.constexpr, CD: tl.constexpr):
    """Dequantized ``[BK, BV]`` tile of one (slot, head); ``rows [BR]``, ``cols [BC]`` physical indices.

    ``head_off`` is the (slot, head) index ``slot * Hv + h``; ``mask_rc [BR, BC]`` masks the tile and
    nothing is read unless ``use`` (a scalar predicate: the row reads the copy, not the checkpoint).
    """
    rmask = (rows < R) & use
    if READ == 3:
        CP: tl.constexpr = (C + 15) // 16 * 16
        half = tl.arange(0, BC // 2)
        byte = tl.load(data + head_off * R * (CP // 2) + rows[:, None] * (CP // 2) + half[None, :],
                       mask=rmask[:, None] & (half < CP // 2)[None, :], other=0).to(tl.int32)
        code = tl.reshape(tl.join(byte & 0xF, byte >> 4), (BR, BC))
        mag = _fp4_magnitude(code & 7)
        val = tl.where((code & 8) != 0, -mag, mag)
        nb: tl.constexpr = CP // 16
        blk = tl.arange(0, BC // 16)
        b = tl.load(block_scale + head_off * R * nb + rows[:, None] * nb + blk[None, :],
                    mask=rmask[:, None] & (blk < nb)[None, :]).to(tl.float32)
        s = tl.load(row_scale + head_off * R + rows, mask=rmask, other=1.0)
        bs = b * s[:, None]
        phys = tl.reshape(tl.reshape(val, (BR, BC // 16, 16)) * bs[:, :, None], (BR, BC))
    else:
        phys = tl.load(data + head_off * R * C + rows[:, None] * C + cols[None, :], mask=mask_rc & use).to(tl.float32)
        if READ == 2:
            phys = phys * tl.load(row_scale + head_off * R + rows, mask=rmask, other=1.0)[:, None]
    phys = tl.where(mask_rc, phys, 0.0)  # masked lanes of fp8 loads are undefined (no fp8 "other")
    return _to_physical(phys, LAYOUT_KV).to(CD)


@triton.jit
def store_read_tile(stored, data, row_scale, block_scale, head_off, rows, cols, mask_rc, write,
                    R: tl.constexpr, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                    READ: tl.constexpr, LAYOUT_KV: tl.constexpr):
    """Quantize the stored checkpoint tile ``stored [BK, BV]`` (fp32) into the read copy (if ``write``)."""
    phys = tl.where(mask_rc, _to_physical(stored, LAYOUT_KV), 0.0)
    if READ == 1:
        tl.store(data + head_off * R * C + rows[:, None] * C + cols[None, :], phys, mask=mask_rc & write)
    elif READ == 2:
        s = _row_scale(tl.max(tl.abs(phys), 1), FP8_MAX)
        q = tl.div_rn(phys, tl.broadcast_to(s[:, None], (BR, BC))).to(tl.float8e4nv)
        tl.store(data + head_off * R * C + rows[:, None] * C + cols[None, :], q, mask=mask_rc & write)
        tl.store(row_scale + head_off * R + rows, s, mask=(rows < R) & write)
    elif READ == 3:
        CP: tl.constexpr = (C + 15) // 16 * 16
        nb: tl.constexpr = CP // 16
        s = _row_scale(tl.max(tl.abs(phys), 1), FP4_MAX * FP8_MAX)
        blocks = tl.reshape(phys, (BR, BC // 16, 16))
        bamax = tl.max(tl.abs(blocks), 2)
        den = tl.broadcast_to((s * 6.0)[:, None], (BR, BC // 16))  # FP4_MAX * s_row, as quant.py
        b8 = tl.div_rn(bamax, den).to(tl.float8e4nv)
        scale = b8.to(tl.float32) * s[:, None]
        scale = tl.where(scale > 0, scale, 1.0)
        y = tl.div_rn(tl.abs(blocks), tl.broadcast_to(scale[:, :, None], (BR, BC // 16, 16)))
        code = ((y > 0.25).to(tl.int32) + (y > 0.75).to(tl.int32) + (y > 1.25).to(tl.int32)
                + (y > 1.75).to(tl.int32) + (y > 2.5).to(tl.int32) + (y > 3.5).to(tl.int32) + (y > 5.0).to(tl.int32))
        code = code | ((blocks < 0).to(tl.int32) << 3)
        lo, hi = tl.split(tl.reshape(code, (BR, BC // 2, 2)))
        byte = (lo | (hi << 4)).to(tl.uint8)
        half = tl.arange(0, BC // 2)
        tl.store(data + head_off * R * (CP // 2) + rows[:, None] * (CP // 2) + half[None, :], byte,
                 mask=((rows < R)[:, None] & (half < CP // 2)[None, :]) & write)
        blk = tl.arange(0, BC // 16)
        tl.store(block_scale + head_off * R * nb + rows[:, None] * nb + blk[None, :], b8,
                 mask=((rows < R)[:, None] & (blk < nb)[None, :]) & write)
        tl.store(row_scale + head_off * R + rows, s, mask=(rows < R) & write)
