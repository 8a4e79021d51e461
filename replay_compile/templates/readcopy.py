"""Read-copy tiles inside a kernel: dequantize on load, re-quantize at a flush (formats of ``runtime/quant.py``).

Tiles are handled in the ``[K, V]`` orientation of the math. A read copy's scales run along keys, so a program
owning value columns ``offs_v`` (and, as every program does, all keys) owns whole scale rows. Data are stored
value-major (``[V, K]`` per head) or key-major (``[K, V]``; 4-bit codes then pair values), as
``quant.ReadFormat.key_major`` says (NOTE [read copy orientation] in ``runtime/state.py``); launchers read which from
the data (``key_major``).

Format codes: 0 none, 1 bf16/fp16 (plain cast), 2 fp8-e4m3 + fp32 row scale, 3 e2m1 (two codes a byte,
low nibble = even key, or even value where key-major) + e4m3 block scale per 16 keys + fp32 row scale. Divisions
use ``tl.div_rn`` so scales and codes match torch's IEEE division bit for bit (row scales multiply by ``1 / qmax``
in fp32, as ``quant._row_scale`` does).

NOTE [read-copy reciprocals]: a flushing program re-quantizes its tile (4K values) with IEEE divisions by row
only (``tl.div_rn(1, s)``, as ``torch.reciprocal``) and multiplies per value: on sm_90 each ``div.rn.f32`` is a
reciprocal, Newton steps and a call to a slow path, and the call's register traffic spills. An fp8 copy divides
once per row scale. A 4-bit copy too: its e4m3 block scales come from ``amax_block * (1 / s) * (1 / 6)`` and their
reciprocals from a table (``_e4m3_reciprocal``: exact, so ``quant.py`` matches bit for bit with
``torch.reciprocal``), because a division per block ran in a layout that replicates the ``[BV, BK / 16]`` blocks
over 16 lanes (a thread divided 64 times). sm_90 compile of the Mamba-2 step on a 4-bit copy (L = 16): division
call sites 132 -> 16, spills 1536 -> 820 bytes, SASS 9160 -> 7368 instructions (2026-12-06). e2m1 codes come from
the bits of ``y >= 1`` (rounding to one mantissa bit) instead of seven comparisons. H200, batch 256, L = 16, step us
(2026-12-04, tune_replay.py, when block scales still divided per block): fp8 copy Mamba-2 295.2 -> 279.0, GDN
608.5 -> 582.4, KDA 348.9 -> 332.7; 4-bit GDN 795.8 -> 686.9, KDA 465.0 -> 415.4, Mamba-2 769.3 -> 791.7 (its
per-block divisions spilled).
"""
from __future__ import annotations

import triton
import triton.language as tl

READ_CODES = {None: 0, "bf16": 1, "fp16": 1, "fp8": 2, "fp4": 3}
FP8_MAX = tl.constexpr(448.0)
FP4_MAX = tl.constexpr(6.0)


def key_major(read: dict) -> bool:
    """Whether a read copy (seen ``[..., V, K]``) is stored key-major: the launchers' constexpr. 4-bit codes tell by
    their packing (key-major pairs rows, so a row holds all padded keys), which holds for every ``V``."""
    if "block_scale" in read:
        return read["data"].shape[-1] == read["block_scale"].shape[-1] * 16
    return "data" in read and read["data"].stride(-1) != 1


@triton.jit
def _row_scale(amax, qmax):
    finite = amax < float("inf")
    amax = tl.where(finite, amax, 0.0)
    return tl.where(amax > 0, amax * (1.0 / qmax), 1.0)  # fp32 reciprocal, as quant._row_scale


@triton.jit
def _reciprocal(s):
    """``1 / s`` rounded as IEEE division (``torch.reciprocal``)."""
    return tl.div_rn(tl.full(s.shape, 1.0, tl.float32), s)


@triton.jit
def _e4m3_reciprocal(b8):
    """``1 / b`` of e4m3 values ``b >= 0`` as IEEE fp32 division rounds it (``torch.reciprocal``), 0 where ``b`` is 0
    or NaN, without a division: ``b`` is exactly ``2^E (1 + j / 8)`` in fp32 (subnormal codes too), and
    ``1 / b = 2^-E * RN(8 / (8 + j))`` rounds as the table entry does (a power of two scales exactly)."""
    b = b8.to(tl.float32)
    bits = b.to(tl.int32, bitcast=True)
    j = (bits >> 20) & 7
    pow2 = ((254 - (bits >> 23)) << 23).to(tl.float32, bitcast=True)  # 2^-E
    lo = tl.where((j & 2) != 0, tl.where((j & 1) != 0, 8 / 11, 8 / 10), tl.where((j & 1) != 0, 8 / 9, 1.0))
    hi = tl.where((j & 2) != 0, tl.where((j & 1) != 0, 8 / 15, 8 / 14), tl.where((j & 1) != 0, 8 / 13, 8 / 12))
    return tl.where(b > 0, pow2 * tl.where((j & 4) != 0, hi, lo), 0.0)


@triton.jit
def _e2m1_magnitude_code(y):
    """3-bit e2m1 code of ``y >= 0``: how many of quant.FP4_MIDPOINTS lie below it (nearest magnitude, ties down).

    From 1 up, that is ``y`` rounded to one mantissa bit, ties down: adding ``2^21 - 1`` to the fp32 bits and
    keeping exponent and top mantissa bit gives ``2 * (127 + e) + m``, and the code of ``(1 + m / 2) * 2^e`` is
    ``2 + 2e + m`` (saturated at 7 = 6.0). Below 1 (and NaN) the two lower midpoints are compared.
    """
    bits = y.to(tl.int32, bitcast=True)
    rounded = tl.minimum(((bits + 0x1FFFFF) >> 22) - 252, 7)
    return tl.where(y >= 1.0, rounded, (y > 0.25).to(tl.int32) + (y > 0.75).to(tl.int32))


@triton.jit
def _e2m1_value_over_2p14(code):
    """e2m1 values of 4-bit codes (sign | 2-bit exponent | 1-bit mantissa), times ``2^-14``.

    NOTE [e2m1 as fp16 bits]: the code's sign moved to bit 15 and its three other bits to bits 11..9 of a half
    make an fp16 number with exponent field ``e`` and top mantissa bit ``m``: ``2^(e-15) (1 + m/2)`` for
    ``e > 0`` and the subnormal ``m 2^-15`` for ``e = 0``, each exactly ``2^-14`` times the e2m1 value
    (``2^(e-1) (1 + m/2)``, subnormal ``m / 2``). One conversion to fp32 replaces a lookup of compares and
    selects; callers fold ``2^14`` into the scale (exact: a power of two).
    """
    bits = ((code & 8) << 12) | ((code & 7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _data_offsets(head_off, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr, KEY_MAJOR: tl.constexpr):
    """``[BK, BV]`` offsets of a 16-bit or fp8 copy's elements, stored ``[K, V]`` per head where ``KEY_MAJOR``.

    Key-major offsets claim runs of only 4 contiguous values: Triton's coalescer then gives the tile the fp32
    checkpoint tile's layout (4 values a thread) rather than 16-byte vectors of 8 or 16 values, which would meet
    the window's layout in a tile conversion (NOTE [read copy orientation] in ``runtime/state.py``).
    """
    if KEY_MAJOR:
        return tl.max_contiguous(head_off * V * K + offs_k[:, None] * V + offs_v[None, :], [1, 4])
    return head_off * V * K + offs_k[:, None] + offs_v[None, :] * K


@triton.jit
def _byte_columns(offs_v, BV: tl.constexpr):
    """``[BV / 2]`` byte columns of a key-major 4-bit tile: values ``2i, 2i + 1`` share byte ``i`` (tiles start
    even). A fresh arange (``offs_v``'s layout stays its own); even byte pairs let a thread load 2 bytes at once."""
    return tl.multiple_of(tl.min(offs_v, 0) // 2, 2) + tl.arange(0, BV // 2)


@triton.jit
def _fp4_key_major_bytes(head_off, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """Offsets ``[BK, BV / 2]`` of a key-major 4-bit tile's code bytes (``[KP, ceil(V / 2)]`` per head) and
    ``[1, BV / 2]`` which byte columns exist."""
    KP: tl.constexpr = (K + 15) // 16 * 16
    VP: tl.constexpr = (V + 1) // 2
    cols = _byte_columns(offs_v, BV)
    return head_off * KP * VP + offs_k[:, None] * VP + cols[None, :], (cols < VP)[None, :]


@triton.jit
def _fp4_key_major_blocks(head_off, offs_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr):
    """Offsets ``[BK / 16, BV]`` of a key-major 4-bit tile's block scales (``[KP / 16, V]`` per head), and which
    exist."""
    NB: tl.constexpr = (K + 15) // 16
    blk = tl.arange(0, BK // 16)
    return head_off * NB * V + blk[:, None] * V + offs_v[None, :], (blk < NB)[:, None] & (offs_v < V)[None, :]


@triton.jit
def _load_fp4_key_major(data, row_scale, block_scale, head_off, offs_k, offs_v, mask_kv,
                        K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Dequantized ``[BK, BV]`` tile of a key-major 4-bit copy: bytes ``[KP, ceil(V / 2)]`` per head (low nibble =
    even value), loaded 2 a thread so that the unpacked tile takes the fp32 checkpoint tile's layout (4 values a
    thread, as ``_data_offsets``), times block scales ``[KP / 16, V]`` broadcast over their 16 keys. Lanes outside
    the state are undefined (no fp8 ``other``): ``load_read_tile`` zeroes them."""
    byte_off, cols_in = _fp4_key_major_bytes(head_off, offs_k, offs_v, K, V, BV)
    byte = tl.load(data + tl.max_contiguous(byte_off, [1, 2]), mask=(offs_k < K)[:, None] & cols_in,
                   other=0).to(tl.int32)
    code = tl.reshape(tl.join(byte & 0xF, byte >> 4), (BK, BV))
    blk_off, blk_in = _fp4_key_major_blocks(head_off, offs_v, K, V, BK)
    b = tl.load(block_scale + blk_off, mask=blk_in).to(tl.float32)
    s = tl.load(row_scale + head_off * V + offs_v, mask=offs_v < V, other=1.0)
    scale = b * (s * 16384.0)[None, :]  # NOTE [e2m1 as fp16 bits]
    return tl.reshape(tl.reshape(_e2m1_value_over_2p14(code), (BK // 16, 16, BV)) * scale[:, None, :], (BK, BV))


@triton.jit
def _store_fp4_key_major(x, data, row_scale, block_scale, head_off, offs_k, offs_v,
                         K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Quantize ``x [BK, BV]`` (0 outside the state) into a key-major 4-bit copy (:func:`_load_fp4_key_major`)."""
    s = _row_scale(tl.max(tl.abs(x), 0), FP4_MAX * FP8_MAX)
    inv_s = _reciprocal(s)[None, :]  # NOTE [read-copy reciprocals]
    blocks = tl.reshape(x, (BK // 16, 16, BV))
    b8 = (tl.max(tl.abs(blocks), 1) * inv_s * (1.0 / FP4_MAX)).to(tl.float8e4nv)  # [BK / 16, BV]
    y = tl.abs(blocks) * (_e4m3_reciprocal(b8) * inv_s)[:, None, :]
    code = tl.reshape(_e2m1_magnitude_code(y) | ((blocks < 0).to(tl.int32) << 3), (BK, BV))
    lo, hi = tl.split(tl.reshape(code, (BK, BV // 2, 2)))
    byte_off, cols_in = _fp4_key_major_bytes(head_off, offs_k, offs_v, K, V, BV)
    KP: tl.constexpr = (K + 15) // 16 * 16
    tl.store(data + byte_off, (lo | (hi << 4)).to(tl.uint8), mask=(offs_k < KP)[:, None] & cols_in)  # pad keys: 0
    blk_off, blk_in = _fp4_key_major_blocks(head_off, offs_v, K, V, BK)
    tl.store(block_scale + blk_off, b8, mask=blk_in)
    tl.store(row_scale + head_off * V + offs_v, s, mask=offs_v < V)


@triton.jit
def load_read_tile(data, row_scale, block_scale, head_off, offs_k, offs_v, mask_kv,
                   K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   READ: tl.constexpr, KEY_MAJOR: tl.constexpr, CD: tl.constexpr):
    """Dequantized ``[BK, BV]`` tile of one (slot, head) at keys ``offs_k`` and values ``offs_v``.

    ``head_off`` is the (slot, head) index ``slot * Hv + h``. Key-major copies and 16-bit / fp8 value-major ones
    are loaded in the ``[K, V]`` orientation directly; value-major e2m1 codes are unpacked along keys as
    ``[BV, BK]`` and transposed.
    """
    vmask = offs_v < V
    if (READ == 3) & KEY_MAJOR:
        x = _load_fp4_key_major(data, row_scale, block_scale, head_off, offs_k, offs_v, mask_kv, K, V, BK, BV)
    elif READ == 3:
        KP: tl.constexpr = (K + 15) // 16 * 16
        half = tl.arange(0, BK // 2)
        byte = tl.load(data + head_off * V * (KP // 2) + offs_v[:, None] * (KP // 2) + half[None, :],
                       mask=vmask[:, None] & (half < KP // 2)[None, :], other=0).to(tl.int32)
        code = tl.reshape(tl.join(byte & 0xF, byte >> 4), (BV, BK))
        val = _e2m1_value_over_2p14(code)
        nb: tl.constexpr = KP // 16
        blk = tl.arange(0, BK // 16)
        b = tl.load(block_scale + head_off * V * nb + offs_v[:, None] * nb + blk[None, :],
                    mask=vmask[:, None] & (blk < nb)[None, :]).to(tl.float32)
        s = tl.load(row_scale + head_off * V + offs_v, mask=vmask, other=1.0)
        bs = b * (s * 16384.0)[:, None]  # NOTE [e2m1 as fp16 bits]
        x = tl.trans(tl.reshape(tl.reshape(val, (BV, BK // 16, 16)) * bs[:, :, None], (BV, BK)))
    else:
        x = tl.load(data + _data_offsets(head_off, offs_k, offs_v, K, V, KEY_MAJOR), mask=mask_kv).to(tl.float32)
        if READ == 2:
            x = x * tl.load(row_scale + head_off * V + offs_v, mask=vmask, other=1.0)[None, :]
    return tl.where(mask_kv, x, 0.0).to(CD)  # masked lanes of fp8 loads are undefined (no fp8 "other")


@triton.jit
def store_read_tile(stored, data, row_scale, block_scale, head_off, offs_k, offs_v, mask_kv,
                    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, READ: tl.constexpr,
                    KEY_MAJOR: tl.constexpr):
    """Quantize the stored checkpoint tile ``stored [BK, BV]`` (fp32) into the read copy."""
    x = tl.where(mask_kv, stored, 0.0)
    vmask = offs_v < V
    if READ == 1:
        tl.store(data + _data_offsets(head_off, offs_k, offs_v, K, V, KEY_MAJOR), x, mask=mask_kv)
    elif READ == 2:
        s = _row_scale(tl.max(tl.abs(x), 0), FP8_MAX)
        q = (x * _reciprocal(s)[None, :]).to(tl.float8e4nv)  # NOTE [read-copy reciprocals]
        tl.store(data + _data_offsets(head_off, offs_k, offs_v, K, V, KEY_MAJOR), q, mask=mask_kv)
        tl.store(row_scale + head_off * V + offs_v, s, mask=vmask)
    elif (READ == 3) & KEY_MAJOR:
        _store_fp4_key_major(x, data, row_scale, block_scale, head_off, offs_k, offs_v, K, V, BK, BV)
    elif READ == 3:
        phys = tl.trans(x)  # [BV, BK]: e2m1 blocks of 16 keys
        KP: tl.constexpr = (K + 15) // 16 * 16
        nb: tl.constexpr = KP // 16
        s = _row_scale(tl.max(tl.abs(phys), 1), FP4_MAX * FP8_MAX)
        blocks = tl.reshape(phys, (BV, BK // 16, 16))
        bamax = tl.max(tl.abs(blocks), 2)
        inv_s = _reciprocal(s)[:, None]  # NOTE [read-copy reciprocals]: one division a row, as quant._fp4_quantize
        b8 = (bamax * inv_s * (1.0 / FP4_MAX)).to(tl.float8e4nv)
        y = tl.abs(blocks) * (_e4m3_reciprocal(b8) * inv_s)[:, :, None]
        code = _e2m1_magnitude_code(y) | ((blocks < 0).to(tl.int32) << 3)
        lo, hi = tl.split(tl.reshape(code, (BV, BK // 2, 2)))
        byte = (lo | (hi << 4)).to(tl.uint8)
        half = tl.arange(0, BK // 2)
        tl.store(data + head_off * V * (KP // 2) + offs_v[:, None] * (KP // 2) + half[None, :], byte,
                 mask=vmask[:, None] & (half < KP // 2)[None, :])
        blk = tl.arange(0, BK // 16)
        tl.store(block_scale + head_off * V * nb + offs_v[:, None] * nb + blk[None, :], b8,
                 mask=vmask[:, None] & (blk < nb)[None, :])
        tl.store(row_scale + head_off * V + offs_v, s, mask=vmask)
