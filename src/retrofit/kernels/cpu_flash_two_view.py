"""``cpu-flash-two-view``: a two-view rotary scheme (SelfExtend, STRING) through the CPU flash op, for inference.

Query block [qs, qe) (slots; C = qe - qs <= reach R, so the block's own causal square is all near keys) meets its
keys in four pieces of one softmax, merged by their log-sum-exps (``cpu_flash.merge``):

    keys  [0, a)      far for every query of the block (j <= qs - R): the far view, a rectangle
    keys  [a, b)      near for some queries, far for others (fewer than C keys): both views, written out
    keys  [b, qs)     near for every query: the near view, a rectangle
    keys  [qs, qe)    the block's causal square: the near view

so no score tensor is larger than C x C and the long ranges go through the fused kernel.
"""

from __future__ import annotations

import torch

from . import cpu_flash
from .call import Call
from .chunked import two_view_scores

BLOCK = 256  # query rows per block (at most the scheme's reach)


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
    q, k, v, far = c.q, c.k, c.v, c.far
    R, Tq = far.reach, c.Tq
    C = max(1, min(BLOCK, R))
    outs = []
    for s in range(0, Tq, C):
        e = min(Tq, s + C)
        qs, qe = c.q_start + s, c.q_start + e
        a = min(max(0, qs - R + 1), qs)  # keys [0, a): far for every query here
        b = min(max(qe - R, a), qs)  # keys [b, qs): near for every query here
        qb, fqb = q[:, :, s:e], far.q[:, :, s:e]
        pieces = [cpu_flash.forward(qb, k[:, :, qs:qe], v[:, :, qs:qe], c.scaling, causal=True)[:2]]
        if a:
            pieces.append(cpu_flash.forward(fqb, far.k[:, :, :a], v[:, :, :a], c.scaling, causal=False)[:2])
        if b > a:
            keys = (k[:, :, a:b], far.k[:, :, a:b], v[:, :, a:b])  # near keys, far keys, values
            pieces.append(_both_views(qb, fqb, keys, qs, a, R, c.scaling))
        if qs > b:
            pieces.append(cpu_flash.forward(qb, k[:, :, b:qs], v[:, :, b:qs], c.scaling, causal=False)[:2])
        out, lse = pieces[0]
        for piece_out, piece_lse in pieces[1:]:
            out, lse = cpu_flash.merge(out, lse, piece_out, piece_lse)
        outs.append(out.to(q.dtype))
    return torch.cat(outs, dim=2)


def _both_views(qb, fqb, keys: tuple, qs: int, ks: int, reach: int, scaling: float):
    """(out fp32 (B, H, C, D), lse (B, H, C)) over keys [ks, ks + n) scored by the view their distance picks;
    ``keys``: (near view's keys, far view's keys, values), each (B, H, n, D)."""
    kb, fkb, vb = keys
    scores = two_view_scores(qb, kb, fqb, fkb, qs, ks, reach) * scaling  # (B, H, C, n): some key here is far
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ vb.float(), lse
