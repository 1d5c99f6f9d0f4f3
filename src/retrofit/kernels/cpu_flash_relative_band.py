"""``cpu-flash-relative-band``: a query-dependent relative term whose table goes flat past a reach K (NEZHA's
clipped sinusoids, ``Relative.reach``) through the CPU flash op, as ``cpu-flash-band`` runs T5 and Shaw.

The term of query i and key j is ``r_i . a_{min(i-j, K)}``. Past the reach it is ``r_i . a_K``, the same for
every key of row i: the softmax cancels it, so subtracting it from every key of the row changes nothing.
What is left is ``r_i . (a_d - a_K)`` on the band of the last K keys (d = i - j < K) and nothing on the far
keys. So the split of ``cpu_flash_band`` applies as it is: the far keys as one causal square shifted by K,
the band as blocks of queries over their windows with the term as the flash op's float mask, merged by
log-sum-exp; only the band's mask now differs from row to row: per block, ``r (C, D) @ (a_d - a_K)^T`` (C, K)
spread over the window's columns (O(N K) work and memory, per group of blocks).

Backward: the flash op's own backward for the far square and the band (``cpu_flash_band.band_backward``);
the band's score gradients dS (``band_score_grads``) give r's, ``dS @ (a - a_K)``. The table takes no
gradient (NEZHA's is fixed; a learned one goes to chunked). Saved for backward: q, k, v, r, the table, the
output and the log-sum-exp (O(N)).

CPU only, full causal self-attention at slot positions without padding, window or dropout, more keys than
the reach; chunked serves the rest.
"""

from __future__ import annotations

import torch

from . import cpu_flash_mask
from .call import Call
from .cpu_flash_band import Layout, band_backward, band_forward, band_score_grads


def serves(c: Call) -> str | None:
    rel = c.relative
    if rel is None or rel.reach is None:
        return "no relative term flat past a reach (NEZHA)"
    if not c.full or c.masked or rel.positions is not None:
        return "not full causal self-attention at slot positions without padding or window"
    if c.Tk <= rel.reach or rel.keys.shape[1] <= rel.reach:
        return "no key past the reach"
    if rel.keys.requires_grad and torch.is_grad_enabled():
        return "a table that needs its gradient per distance (the far keys' share is never formed)"
    return cpu_flash_mask.op_serves(c)


def run(c: Call) -> torch.Tensor:
    rel = c.relative
    return _RelativeBand.apply(c.q, c.k, c.v, rel.query, rel.keys.detach(), rel.reach, c.scaling)


def _band_terms(rq_blocks, keys, K, scaling):
    """(the term per block and band distance (B, H, n, C, K) fp32, the table's band rows over the flat one
    (H or 1, K, D))."""
    table = keys[:, : K + 1].float()
    over = table[:, :K] - table[:, K:]  # (H or 1, K, D)
    return (rq_blocks @ over.transpose(-1, -2)[:, None]).mul_(scaling), over


def _masks(lay, terms):
    """mask_of(piece) for ``band_forward``: each block's terms spread over its window's columns."""

    def mask_of(piece):
        t = lay.take(terms, piece)  # (B or B * m, H, C, K)
        m = t.gather(-1, lay.idx.expand(*t.shape[:-1], lay.W)).masked_fill_(~lay.inside, float("-inf"))
        return m[..., piece[1] or 0 :].contiguous()

    return mask_of


class _RelativeBand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rq, keys, K, scaling):
        B, H, N, D = q.shape
        lay = Layout(N, K, q.device, B * H * D)
        terms, _ = _band_terms(lay.blocks(rq), keys, K, scaling)
        out, lse = band_forward(q, k, v, scaling, lay, _masks(lay, terms))
        ctx.save_for_backward(q, k, v, rq, keys, out, lse)
        ctx.K, ctx.scaling = K, scaling
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, rq, keys, out, lse = ctx.saved_tensors
        K, scaling = ctx.K, ctx.scaling
        B, H, N, D = q.shape
        lay = Layout(N, K, q.device, B * H * D)
        rqb = lay.blocks(rq)
        terms, over = _band_terms(rqb, keys, K, scaling)
        dq, dk, dv, blocks = band_backward(dout, (q, k, v), (out, lse), scaling, lay, _masks(lay, terms))
        drq = None
        if ctx.needs_input_grad[3]:
            drqb = torch.zeros_like(rqb)
            reversed_over = over.flip(-2)[:, None]  # band_score_grads' order: distance K - 1 - t
            for b0, b1, ds in band_score_grads(lay, blocks, scaling, lambda b0, b1: terms[:, :, b0:b1].flip(-1)):
                drqb[:, :, b0:b1] = ds.mul_(scaling) @ reversed_over  # (B, H, G, C, K) @ (H or 1, 1, K, D)
            drq = drqb.view(B, H, -1, D)[:, :, :N].to(rq.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), drq, None, None, None
