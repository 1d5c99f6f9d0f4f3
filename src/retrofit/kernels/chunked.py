"""``chunked``: query-chunked SDPA, the kernel that serves every call. Each chunk builds its own (H, C, Tk) bias
(or relative logits), so memory is O(H * C * N), linear in N. Exact in any dtype (half inputs are scored in
fp32 when there is a positional term). Under grad each chunk is checkpointed, so backward never holds every
chunk's bias."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .call import Call, Relative, chunk_rows
from .cpu_flash_mask import Seen, Span, block_bias


def serves(c: Call) -> str | None:
    return None  # any bias, relative term, padding, window, cache, dropout, dtype, device


@dataclass
class Piece:
    """One chunk of a call's queries and the keys it can see: query slots q0 .. q0 + C - 1 over key slots
    k0 .. k0 + Tc - 1, with the chunk's rows of every per-query tensor."""

    q: torch.Tensor  # (B, H, C, D)
    k: torch.Tensor  # (B, H, Tc, D)
    v: torch.Tensor  # (B, H, Tc, D)
    q0: int
    k0: int
    row_scale: torch.Tensor | None = None  # (B or 1, C)
    rel_q: torch.Tensor | None = None  # (B, H, C, D) the relative term's query side
    far_q: torch.Tensor | None = None  # (B, H, C, D) the far view's queries
    far_k: torch.Tensor | None = None  # (B, H, Tc, D) the far view's keys


def run(c: Call) -> torch.Tensor:
    """The call, one chunk of queries at a time: (B, H, Tq, D); each chunk builds its own (H, C, Tk) bias."""
    B, H, Tq, D = c.q.shape
    rows = chunk_rows(H, Tq, c.k.shape[-2])
    if c.relative is not None:  # per batch row, over the chunk's distances: C + Tc, or a block's own span
        span = c.k.shape[-2] if c.relative.positions is None else int(c.relative.keys.shape[1])
        rows = chunk_rows(H * B, Tq, c.k.shape[-2] + span)
    grads = c.q.requires_grad or c.k.requires_grad or c.v.requires_grad
    use_ckpt = torch.is_grad_enabled() and rows < Tq and grads
    outs = [
        checkpoint(_chunk, c, piece, use_reentrant=False) if use_ckpt else _chunk(c, piece) for piece in pieces(c, rows)
    ]
    return torch.cat(outs, dim=2)


def pieces(c: Call, rows: int):
    """The call's chunks of ``rows`` queries, each with the keys it can see: [lo, hi) (the causal upper bound, the
    window's lower bound; both sides of the query without causality)."""
    Tq, window = c.q.shape[-2], c.window
    for s in range(0, Tq, rows):
        e = min(Tq, s + rows)
        hi = c.q_start + e if c.causal else c.k.shape[-2]
        if window and not c.causal:  # both sides: |i - j| < window
            hi = min(hi, c.q_start + e - 1 + window)
        lo = max(0, c.q_start + s - window + 1) if window else 0
        yield Piece(
            c.q[:, :, s:e],
            c.k[:, :, lo:hi],
            c.v[:, :, lo:hi],
            c.q_start + s,
            lo,
            None if c.row_scale is None else c.row_scale[:, s:e],
            None if c.relative is None else c.relative.query[:, :, s:e],
            None if c.far is None else c.far.q[:, :, s:e],
            None if c.far is None else c.far.k[:, :, lo:hi],
        )


def _chunk(c: Call, p: Piece) -> torch.Tensor:
    """One piece of the call: (B, H, C, D)."""
    compute_dtype = p.q.dtype
    if c.bias is not None or p.rel_q is not None:
        if p.q.dtype in (torch.float16, torch.bfloat16):
            compute_dtype = torch.float32  # the positional term is large at long range: score it in fp32
    mask = _mask(c, p, compute_dtype)
    scores = None if p.far_q is None else two_view_scores(p, c.far.reach)
    if scores is not None:  # far keys here: their logits from the second view
        return _written_out(p, c, mask, scores * c.scaling)
    if c.softcap is not None or c.sinks is not None:
        return _written_out(p, c, mask)
    out = F.scaled_dot_product_attention(
        p.q.to(compute_dtype),
        p.k.to(compute_dtype),
        p.v.to(compute_dtype),
        attn_mask=mask,
        dropout_p=c.dropout,
        scale=c.scaling,
    )
    return out.to(p.q.dtype)


def _mask(c: Call, p: Piece, dtype) -> torch.Tensor:
    """The piece's positional term and mask: a float (1 or B, H, C, Tc) bias or relative logits with -inf where
    masked, or a bool visibility mask (no positional term)."""
    C, Tc, device = p.q.shape[-2], p.k.shape[-2], p.q.device
    span, visible = Span(p.q0, C, p.k0, Tc, p.row_scale), Seen(c.key_padding, c.window, c.causal)
    if c.bias is not None:
        return block_bias(c.bias, p.q.shape[1], span, device, dtype, visible)
    seen = block_bias(None, 1, span, device, seen=visible)
    if p.rel_q is None:
        return seen
    rel = c.relative
    q_pos, k_pos = torch.arange(p.q0, p.q0 + C, device=device), torch.arange(p.k0, p.k0 + Tc, device=device)
    if rel.positions is not None:  # a block's own positions (PoSE, randomized)
        q_pos, k_pos = rel.positions[p.q0 : p.q0 + C], rel.positions[p.k0 : p.k0 + Tc]
    logits = relative_logits(p.rel_q, rel, q_pos, k_pos, c.scaling, dtype)  # (B, H, C, Tc)
    return logits.masked_fill(~seen, float("-inf"))


def two_view_scores(p: Piece, reach: int) -> torch.Tensor | None:
    """fp32 logits (B, H, C, Tc), unscaled, of the piece's queries (from slot ``p.q0``) over its keys (from slot
    ``p.k0``): a key at distance >= ``reach`` scored by the far view (``p.far_q . p.far_k``), a nearer one by the
    near view (``p.q . p.k``); None when no key here is that far (the near view alone: plain attention)."""
    qc, kc, far_q, far_k, q0, k0 = p.q, p.k, p.far_q, p.far_k, p.q0, p.k0
    C, Tc = qc.shape[-2], kc.shape[-2]
    far = (q0 + torch.arange(C, device=qc.device))[:, None] - k0 - torch.arange(Tc, device=qc.device) >= reach
    if not bool(far.any()):
        return None
    scores = far_q.float() @ far_k.float().transpose(-1, -2)
    if bool(far.all()):
        return scores
    return torch.where(far, scores, qc.float() @ kc.float().transpose(-1, -2))


def _written_out(p, c, mask, scores=None):
    """The chunk ``p`` (its q, k, v) of the call ``c`` with its scores written out in fp32 (B, H, C, Tc) (``scores``:
    given, a two-view scheme's; else ``q . k * scaling``): the content logits softcapped (gemma2:
    ``softcap * tanh(s / softcap)``), then the positional term and the mask added (``mask``: float, or bool
    True = visible), then a softmax over the keys and, with ``sinks`` (H,), one more logit per head whose
    share is dropped (gpt_oss)."""
    qc, kc, vc, softcap, sinks = p.q, p.k, p.v, c.softcap, c.sinks
    if scores is None:
        scores = (qc.float() @ kc.float().transpose(-1, -2)) * c.scaling  # (B, H, C, Tc)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.float()
    if sinks is not None:
        sink = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, C, 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    probs = F.dropout(probs, p=c.dropout) if c.dropout else probs
    return (probs @ vc.float()).to(qc.dtype)  # (B, H, C, D)


def relative_logits(rel_q, rel: Relative, q_pos, k_pos, scaling, dtype):
    """``rel_q[i] . rel.keys[pos_i - pos_j - rel.first] * scaling`` for one chunk: rel_q (B, H, C, D), rel.keys (H
    or 1, n, D) from distance ``rel.first`` on, q_pos (C,), k_pos (Tc,) -> (B, H, C, Tc). One matmul against the
    chunk's distinct distances (at most C + Tc - 1 for consecutive positions), then a gather (the rel-shift of
    Transformer-XL, written as an index)."""
    rel_keys, first = rel.keys, rel.first
    dist = q_pos[:, None] - k_pos[None, :]  # (C, Tc)
    if first == 0:
        dist = dist.clamp(min=0)  # a decoder's future keys are masked anyway
    lo, hi = int(dist.min()), int(dist.max())
    table = rel_keys[:, lo - first : hi - first + 1].to(dtype)  # (H or 1, n_d, D)
    per_distance = rel_q.to(dtype) @ table.transpose(-1, -2)  # (B, H, C, n_d)
    B, H, C, _ = per_distance.shape
    index = (dist - lo).expand(B, H, C, dist.shape[-1])  # a view: no (B, H, C, Tc) index tensor
    return per_distance.gather(-1, index) * scaling
