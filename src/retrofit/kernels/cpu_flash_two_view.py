"""``cpu-flash-two-view``: a two-view rotary scheme (SelfExtend, STRING) through the CPU flash op, for inference.

The query at slot s reads key j through the near view when s - j < R (the reach) and through the far view when
s - j >= R. Both are pieces of one softmax, each a call of the CPU flash op, merged by their log-sum-exps in place
(``cpu_flash.merge_into``):

- **the head**: rows whose slot is below R have no far key: one causal call (after a cache, the cached keys
  too, as a rectangle);
- **the near band**, rows from slot R on: row s reads keys [s - R + 1, s], a window that slides with the row.
  Whole blocks of ``BAND`` rows, the block from slot t reading the window [t - R + 1, t + BAND), go in one call of
  the flash op per batch row: the blocks folded into its batch, their keys and values strided views of k and v (a
  block's window starts ``BAND`` keys after the previous one's: no copy), one mask for all (key j of the window for
  the block's row r when r <= j < r + R); the rows left over, fewer than a block, in one more call;
- **the far view, in one call**: row s meets keys [0, s - R], a causal triangle shifted by R (a rectangle of
  the keys before the first such row's, when the call starts after a cache).

Each pair of a row and a key enters the softmax through the one view its distance picks, through the fused kernel;
no score tensor is written out. The far view's triangle is one large causal call (the flash op's causal tiles
waste least on one large square). The band scores BAND - 1 keys a row that its mask drops: small blocks waste
least there, and the flash op tiles queries by 32 below 192 rows anyway (docs/results.md, "Attention kernel",
round 14).
"""

from __future__ import annotations

import dataclasses

import torch

from . import cpu_flash
from .call import Call, Far

BAND = 32  # query rows per block of the near band


def serves(c: Call) -> str | None:
    if c.far is None:
        return "no second view"
    if not cpu_flash.available(c.q):
        return "not a CPU tensor of a dtype the CPU flash op takes"
    if c.grad:
        return "gradients (inference only)"
    if c.k.shape[-2] != c.q_start + c.Tq:
        return "keys other than the rows' own and those before them"
    if not c.q.shape[-1] == c.k.shape[-1] == c.v.shape[-1]:
        return "values narrower or wider than the queries (MLA), which the CPU flash op does not take"
    if c.key_padding is not None or c.window or c.dropout or c.row_scale is not None:
        return "padding, a window or dropout"
    if any(x is not None for x in (c.bias, c.slopes, c.band, c.relative)):
        return "another positional term"
    return None


def run(c: Call) -> torch.Tensor:
    """(B, H, Tq, D); grouped-query keys read as they are where the CPU flash op takes them."""
    c = c if cpu_flash.takes_grouped() else c.full_heads()
    c = _unit_stride(c)
    q = c.q
    out = q.new_empty(q.shape, dtype=torch.float32)  # (B, H, Tq, D)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)  # (B, H, Tq)
    head = max(0, min(c.Tq, c.far.reach - c.q_start))  # rows below slot R: no far key
    if head:
        _head(c, head, out, lse)
    if head < c.Tq:
        _band(c, head, out, lse)
        rows = slice(head, None)
        cpu_flash.merge_into(out[:, :, rows], lse[:, :, rows], *_far(c, head))
    return out.to(q.dtype)


def _unit_stride(c: Call) -> Call:
    """``c`` with q, k, v and the far view's q and k of unit stride along D (the op's and ``_blocks``' reading)."""
    if all(x.stride(-1) == 1 for x in (c.q, c.k, c.v, c.far.q, c.far.k)):
        return c
    q, k, v, fq, fk = (x.contiguous() for x in (c.q, c.k, c.v, c.far.q, c.far.k))
    return dataclasses.replace(c, q=q, k=k, v=v, far=Far(fq, fk, c.far.reach))


def _head(c: Call, n: int, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Rows [0, n) (slot q_start + r reads keys [0, q_start + r]) into ``out`` and ``lse``'s rows."""
    q, k, v, s0 = c.q[:, :, :n], c.k, c.v, c.q_start
    o, ls = out[:, :, :n], lse[:, :, :n]
    own, own_lse = cpu_flash.forward(q, k[:, :, s0 : s0 + n], v[:, :, s0 : s0 + n], c.scaling, causal=True)[:2]
    o.copy_(own)
    ls.copy_(own_lse)
    if s0:
        cpu_flash.merge_into(o, ls, *cpu_flash.forward(q, k[:, :, :s0], v[:, :, :s0], c.scaling, causal=False)[:2])


def _band(c: Call, first: int, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Rows [first, Tq) over their near windows into ``out`` and ``lse``'s rows: the whole blocks of ``BAND`` rows
    in one call per batch row, the rows left over in one call for the batch."""
    blocks, left = divmod(c.Tq - first, BAND)
    rows = slice(first, first + blocks * BAND)
    for b in range(c.q.shape[0]) if blocks else ():
        o, ls = _windows(c, b, first, blocks)  # (blocks, H, BAND, D), (blocks, H, BAND)
        out[b, :, rows].unflatten(1, (blocks, BAND)).copy_(o.transpose(0, 1))
        lse[b, :, rows].unflatten(1, (blocks, BAND)).copy_(ls.transpose(0, 1))
    if left:
        R, rest = c.far.reach, slice(rows.stop, None)
        keys = slice(c.q_start + rows.stop - R + 1, c.q_start + c.Tq)  # the window of the left rows
        mask = _band_mask(left, R, c.q.dtype)
        o, ls = cpu_flash.forward(c.q[:, :, rest], c.k[:, :, keys], c.v[:, :, keys], c.scaling, mask, False)[:2]
        out[:, :, rest].copy_(o)
        lse[:, :, rest].copy_(ls)


def _windows(c: Call, b: int, first: int, n: int):
    """(out, lse) of ``n`` blocks of ``BAND`` rows from row ``first`` of batch row b, each over its near window:
    the block from slot t reads keys [t - R + 1, t + BAND), through the band mask."""
    R = c.far.reach
    q = _blocks(c.q[b], first, n, BAND)  # (n, H, BAND, D)
    start = c.q_start + first - R + 1
    k, v = (_blocks(x[b], start, n, R + BAND - 1) for x in (c.k, c.v))  # (n, Hkv, R + BAND - 1, D)
    return cpu_flash.forward(q, k, v, c.scaling, mask=_band_mask(BAND, R, q.dtype), causal=False)[:2]


def _blocks(x: torch.Tensor, start: int, n: int, length: int) -> torch.Tensor:
    """(n, heads, length, D), a view of x (heads, T, D) (D of unit stride): block i is rows [start + i * BAND, +
    length)."""
    sh, st, sd = x.stride()
    return x.as_strided((n, x.shape[0], length, x.shape[-1]), (BAND * st, sh, st, sd), x.storage_offset() + start * st)


def _band_mask(size: int, reach: int, dtype: torch.dtype) -> torch.Tensor:
    """(size, reach + size - 1): 0 where the window's key j is near for the block's row r (r <= j < r + reach),
    -inf elsewhere."""
    r, j = torch.arange(size)[:, None], torch.arange(reach + size - 1)[None]
    return torch.zeros(size, reach + size - 1, dtype=dtype).masked_fill_((j < r) | (j >= r + reach), float("-inf"))


def _far(c: Call, first: int):
    """(out, lse) of query rows [first, Tq) over their far keys: row ``first`` + r (slot s) meets keys [0, s - R],
    the keys before the first row's last far key K0 (a rectangle) and a causal square from K0."""
    fq, fk, v, scaling = c.far.q[:, :, first:], c.far.k, c.v, c.scaling
    k0, n = c.q_start + first - c.far.reach, c.Tq - first
    out, lse = cpu_flash.forward(fq, fk[:, :, k0 : k0 + n], v[:, :, k0 : k0 + n], scaling, causal=True)[:2]
    if k0 == 0:
        return out, lse
    out = out.float()
    cpu_flash.merge_into(out, lse, *cpu_flash.forward(fq, fk[:, :, :k0], v[:, :, :k0], scaling, causal=False)[:2])
    return out, lse
