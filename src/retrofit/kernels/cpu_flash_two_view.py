"""``cpu-flash-two-view``: a two-view rotary scheme (SelfExtend, STRING) through the CPU flash op, for inference.

Query block [qs, qe) (slots; C = qe - qs <= reach R, so the block's own causal square is all near keys) meets its
keys in five pieces of one softmax, each a call of the CPU flash op, merged by their log-sum-exps
(``cpu_flash.merge``); with a = qs - R + 1:

    keys  [0, a)          far for every query of the block (j <= qs - R): the far view, a rectangle
    keys  [a, a + C - 1)  the strip: key a + c is far for query qs + r when c < r, a causal square of the far view
                          (the block's queries from its second on)
    keys  [a, a + C)      ... and near when c >= r: a causal square of the near view, queries and keys reversed
    keys  [a + C, qs)     near for every query: the near view, a rectangle
    keys  [qs, qe)        the block's causal square: the near view

so every key is read once, by the view its distance picks, through the fused kernel, and no score tensor is
written out. A block's strip that would start before key 0 (one block per call at most) is scored written out,
both views (C x C). Blocks of ``BLOCK`` queries: the CPU flash op tiles 768 queries or more by 256, fewer by 64.
"""

from __future__ import annotations

import torch

from . import cpu_flash
from .call import Call
from .chunked import Piece, two_view_scores

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
    """(B, H, Tq, D), keys at full heads."""
    R, Tq = c.far.reach, c.Tq
    C = max(1, min(BLOCK, R))
    outs = []
    for s in range(0, Tq, C):
        e = min(Tq, s + C)
        out, lse = _block(c, s, e)
        outs.append(out.to(c.q.dtype))
    return torch.cat(outs, dim=2)


def _block(c: Call, s: int, e: int):
    """(out fp32, lse) of query rows [s, e): the pieces of the module docstring, merged."""
    q, k, v, far, scaling = c.q, c.k, c.v, c.far, c.scaling
    qs, qe = c.q_start + s, c.q_start + e
    C, a = e - s, qs - far.reach + 1
    qb, fqb = q[:, :, s:e], far.q[:, :, s:e]
    out, lse = cpu_flash.forward(qb, k[:, :, qs:qe], v[:, :, qs:qe], scaling, causal=True)[:2]
    out = out.float()
    pieces = []  # (first row, out, lse): a piece of rows [first, first + its rows)
    m = max(0, min(a + C, qs))  # keys [m, qs): near for every query
    if a >= 0 and a + C > 1:  # far keys here: the far rectangle and the strip, through the flash op
        if a:
            pieces.append((0, *cpu_flash.forward(fqb, far.k[:, :, :a], v[:, :, :a], scaling, causal=False)[:2]))
        if C > 1:
            fk, fv = far.k[:, :, a : a + C - 1], v[:, :, a : a + C - 1]
            pieces.append((1, *cpu_flash.forward(fqb[:, :, 1:], fk, fv, scaling)[:2]))
        if m > a:
            pieces.append((0, *_near_strip(qb, k[:, :, a:m], v[:, :, a:m], scaling)))
    elif a + C > 1:  # the strip starts before key 0: keys [0, m) written out, both views
        pieces.append((0, *_both_views(qb, fqb, (k[:, :, :m], far.k[:, :, :m], v[:, :, :m]), qs, far.reach, scaling)))
    else:  # no far key: every earlier key is near
        m = 0
    if qs > m:
        pieces.append((0, *cpu_flash.forward(qb, k[:, :, m:qs], v[:, :, m:qs], scaling, causal=False)[:2]))
    for first, piece_out, piece_lse in pieces:
        rows = slice(first, first + piece_out.shape[-2])
        out[:, :, rows], lse[:, :, rows] = cpu_flash.merge(out[:, :, rows], lse[:, :, rows], piece_out, piece_lse)
    return out, lse


def _near_strip(qb, k, v, scaling):
    """The block's C queries over the strip's n keys (n = C, or C - 1 where the strip reaches the block), key c
    near for query r when c >= r: queries and keys reversed, a causal square; rows 0 .. n - 1 (the last query
    has no near key here when n = C - 1)."""
    C, n = qb.shape[-2], k.shape[-2]
    out, lse = cpu_flash.forward(qb.flip(-2)[:, :, C - n :], k.flip(-2), v.flip(-2), scaling, causal=True)[:2]
    return out.flip(-2), lse.flip(-1)


def _both_views(qb, fqb, keys: tuple, qs: int, reach: int, scaling: float):
    """(out fp32 (B, H, C, D), lse (B, H, C)) over keys [0, n) scored by the view their distance picks;
    ``keys``: (near view's keys, far view's keys, values), each (B, H, n, D)."""
    kb, fkb, vb = keys
    scores = (
        two_view_scores(Piece(qb, kb, vb, qs, 0, far_q=fqb, far_k=fkb), reach) * scaling
    )  # (B, H, C, n): some key here is far
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ vb.float(), lse
