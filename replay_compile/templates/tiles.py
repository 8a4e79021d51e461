"""Loading rows of keys (``[R, BK]``, keys contiguous in memory) in a layout made for reductions over keys.

Used for ``vk`` checkpoint tiles and the ring's keys. Not for read copies (value-major, keys contiguous
too): with them the sm_90 compile of a one-token fp8 step had more barriers and spills, not fewer.

NOTE [tile layout]
Where keys are contiguous (``vk`` states), a ``[BK, BV]`` load takes the coalescer's layout: 4 keys per
thread, the other key bits across the 32 lanes, so each token's ``base^T q`` costs 5 shuffle rounds per
value column a thread holds. ``load_key_rows`` loads such rows as ``[R, BK / 32, 32]`` instead: still 16-byte
vectors along keys, but the coalescer then spends only 8 lanes on keys and 4 on values, and the chunks of 32
keys sit in registers, so a token's reduction is 16 products in the thread and 3 shuffle rounds (sm_90
compile of a Mamba-2 8-token call: 635 -> 363 shuffles; one-token step 93 -> 59; H200, batch 256: step
419.5 -> 397.8 us, verify T = 4 / 8 1512 / 2668 -> 1066 / 2143 us). Ring keys (``[L, K]`` per key head,
reduced over keys by every token in ``_key_dots``) take the same layout: shuffles of a GDN 8-token call
1045 -> 501. Per-channel decay keeps the plain load (its dots then spilled 1172 bytes).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_key_rows(ptr, rows, row_stride, row_mask, key_stride, K: tl.constexpr, BK: tl.constexpr,
                  CD: tl.constexpr):
    """``[R, BK]`` values at ``ptr + rows * row_stride + key * key_stride`` in ``CD`` (0 where masked),
    loaded as ``[R, BK / 32, 32]`` so that chunks of 32 keys sit in each thread's registers (NOTE [tile layout]).
    """
    KI: tl.constexpr = BK if BK < 32 else 32
    KC: tl.constexpr = BK // KI
    k3 = tl.arange(0, KC)[None, :, None] * KI + tl.arange(0, KI)[None, None, :]  # fresh aranges: the loads vectorize
    m3 = row_mask[:, None, None] & (k3 < K)
    x = tl.load(ptr + rows[:, None, None] * row_stride + k3 * key_stride, mask=m3)  # no `other`: fp8 has none
    return tl.reshape(tl.where(m3, x.to(CD), 0.0), [rows.shape[0], BK])
