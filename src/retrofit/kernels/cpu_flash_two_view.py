"""``cpu-flash-two-view``: a two-view rotary scheme (SelfExtend, STRING) through the CPU flash op, for inference.

The query at slot i reads key j through the near view when i - j < R (the reach) and through the far view when
i - j >= R. Both are pieces of one softmax, each a call of the CPU flash op, merged by their log-sum-exps in place
(``cpu_flash.merge_into``):

- **the far view, in one call**: query i meets keys [0, i - R], a causal triangle shifted by R: rows from slot R on
  over keys from 0 (a rectangle of the keys before the first such row's, when the call starts after a cache);
- **the near view, block by block**: query block [qs, qe) (C = qe - qs <= R, so the block's own causal square is
  all near keys) over its own square, then the keys before it within the reach: with a = qs - R + 1, key c is near
  for the block's query r when c >= a + r: keys [max(a, 0), m), m = min(a + C, qs), the strip (queries and keys
  reversed: a causal square), and keys [m, qs), near for every query, a rectangle.

Every key is read once, by the view its distance picks, through the fused kernel; no score tensor is written out.
The far view's triangle is one large causal call (the flash op's causal tiles waste least on one large square), and
the near view's two triangles per block are its only small ones. Blocks of ``BLOCK`` queries: the CPU flash op
tiles 768 queries or more by 256, fewer by 64.
"""

from __future__ import annotations

import torch

from . import cpu_flash
from .call import Call

BLOCK = 1024  # query rows per block (at most the scheme's reach)


def serves(c: Call) -> str | None:
    if c.far is None:
        return "no second view"
    if not cpu_flash.available(c.q):
        return "not a CPU tensor of a dtype the CPU flash op takes"
    if c.grad:
        return "gradients (inference only)"
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
    q, R = c.q, c.far.reach
    C = max(1, min(BLOCK, R))
    out = q.new_empty(q.shape, dtype=torch.float32)  # (B, H, Tq, D)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)  # (B, H, Tq)
    for s in range(0, c.Tq, C):
        _near(c, s, min(c.Tq, s + C), out, lse)
    first = max(0, R - c.q_start)  # the first query row with a far key: slot R
    if first < c.Tq:
        rows = slice(first, None)
        cpu_flash.merge_into(out[:, :, rows], lse[:, :, rows], *_far(c, first))
    return out.to(q.dtype)


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


def _near(c: Call, s: int, e: int, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Query rows [s, e) over their near keys (the module docstring's pieces), into ``out`` and ``lse``'s rows."""
    q, k, v, scaling = c.q, c.k, c.v, c.scaling
    qs, qe = c.q_start + s, c.q_start + e
    C, a = e - s, qs - c.far.reach + 1
    qb, o, ls = q[:, :, s:e], out[:, :, s:e], lse[:, :, s:e]
    own, own_lse = cpu_flash.forward(qb, k[:, :, qs:qe], v[:, :, qs:qe], scaling, causal=True)[:2]
    o.copy_(own)
    ls.copy_(own_lse)
    lo, m = max(a, 0), max(0, min(a + C, qs))
    if m > lo:  # the strip: key lo + c is near for query r when lo + c >= a + r
        skip = a + C - m  # reversed query rows with no key here (the last queries of the block)
        rev = cpu_flash.forward(qb.flip(-2)[:, :, skip:], *(x[:, :, lo:m].flip(-2) for x in (k, v)), scaling)[:2]
        rows = slice(0, C - skip)
        cpu_flash.merge_into(o[:, :, rows], ls[:, :, rows], rev[0].flip(-2), rev[1].flip(-1))
    if qs > m:  # the near rectangle
        cpu_flash.merge_into(o, ls, *cpu_flash.forward(qb, k[:, :, m:qs], v[:, :, m:qs], scaling, causal=False)[:2])
