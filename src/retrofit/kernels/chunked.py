"""``chunked``: query-chunked SDPA, the path that serves every call. Each chunk builds its own (H, C, Tk) bias
(or relative logits), so memory is O(H * C * N), linear in N. Exact in any dtype (half inputs are scored in
fp32 when there is a positional term). Under grad each chunk is checkpointed, so backward never holds every
chunk's bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .call import Call, chunk_rows
from .cpu_flash_mask import block_bias


def serves(c: Call) -> str | None:
    return None  # any bias, relative term, padding, window, cache, dropout, dtype, device


def run(c: Call) -> torch.Tensor:
    """The call, one chunk of queries at a time: (B, H, Tq, D)."""
    return attend_chunked(
        c.q,
        c.k,
        c.v,
        c.scaling,
        c.bias,
        c.key_padding,
        c.window,
        c.q_start,
        c.dropout,
        c.row_scale,
        c.relative,
        c.softcap,
        c.sinks,
        c.causal,
        c.far,
    )


def attend_chunked(
    q,
    k,
    v,
    scaling,
    bias,
    key_padding,
    window,
    q_start,
    dropout,
    row_scale=None,
    relative=None,
    softcap=None,
    sinks=None,
    causal=True,
    far=None,
):
    """q (B, H, Tq, D), k/v (B, H, Tk, D) -> (B, H, Tq, D); each chunk builds its own (H, C, Tk) bias."""
    B, H, Tq, D = q.shape
    rows = chunk_rows(H, Tq, k.shape[-2])
    if relative is not None:  # per batch row, over the chunk's distances: C + Tc, or a block's own span
        span = k.shape[-2] if relative.positions is None else int(relative.keys.shape[1])
        rows = chunk_rows(H * B, Tq, k.shape[-2] + span)
    use_ckpt = torch.is_grad_enabled() and rows < Tq and (q.requires_grad or k.requires_grad or v.requires_grad)
    outs = []
    for s in range(0, Tq, rows):
        e = min(Tq, s + rows)
        # keys this chunk can see: [lo, hi) (causal upper bound, window lower bound; both sides without causality)
        hi = q_start + e if causal else k.shape[-2]
        if window and not causal:  # both sides: |i - j| < window
            hi = min(hi, q_start + e - 1 + window)
        lo = max(0, q_start + s - window + 1) if window else 0
        rows_scale = None if row_scale is None else row_scale[:, s:e]
        rel = (None, None, None, 0)
        if relative is not None:
            rel = (relative.query[:, :, s:e], relative.keys, relative.positions, relative.first)
        two = (None, None, None) if far is None else (far.q[:, :, s:e], far.k[:, :, lo:hi], far.reach)
        args = (
            q[:, :, s:e],
            k[:, :, lo:hi],
            v[:, :, lo:hi],
            q_start + s,
            lo,
            scaling,
            bias,
            key_padding,
            window,
            dropout,
            rows_scale,
            *rel,
            softcap,
            sinks,
            causal,
            *two,
        )
        outs.append(checkpoint(_chunk, *args, use_reentrant=False) if use_ckpt else _chunk(*args))
    return torch.cat(outs, dim=2)


def _chunk(
    qc,
    kc,
    vc,
    q0,
    k0,
    scaling,
    bias,
    key_padding,
    window,
    dropout,
    row_scale=None,
    rel_q=None,
    rel_keys=None,
    positions=None,
    first=0,
    softcap=None,
    sinks=None,
    causal=True,
    far_q=None,
    far_k=None,
    reach=None,
):
    # qc (B, H, C, D), kc/vc (B, H, Tc, D); q0/k0: slot indices of the first query/key
    C, Tc = qc.shape[-2], kc.shape[-2]
    compute_dtype = qc.dtype
    if bias is not None:
        if qc.dtype in (torch.float16, torch.bfloat16):
            compute_dtype = torch.float32  # the bias is large at long range: score it in fp32
        mask = block_bias(
            bias, qc.shape[1], q0, C, k0, Tc, qc.device, compute_dtype, key_padding, window, row_scale, causal
        )  # (1 or B, H, C, Tc)
    elif rel_q is not None:
        if qc.dtype in (torch.float16, torch.bfloat16):
            compute_dtype = torch.float32
        q_pos, k_pos = torch.arange(q0, q0 + C, device=qc.device), torch.arange(k0, k0 + Tc, device=qc.device)
        if positions is not None:  # a block's own positions (PoSE, randomized)
            q_pos, k_pos = positions[q0 : q0 + C], positions[k0 : k0 + Tc]
        mask = relative_logits(rel_q, rel_keys, q_pos, k_pos, scaling, compute_dtype, first)  # (B, H, C, Tc)
        mask = mask.masked_fill(
            ~block_bias(None, 1, q0, C, k0, Tc, qc.device, key_padding=key_padding, window=window, causal=causal),
            float("-inf"),
        )
    else:
        mask = block_bias(None, 1, q0, C, k0, Tc, qc.device, key_padding=key_padding, window=window, causal=causal)
    scores = None if far_q is None else two_view_scores(qc, kc, far_q, far_k, q0, k0, reach)
    if scores is not None:  # far keys here: their logits from the second view
        return _written_out(qc, kc, vc, scaling, mask, dropout, softcap, sinks, scores * scaling)
    if softcap is not None or sinks is not None:
        return _written_out(qc, kc, vc, scaling, mask, dropout, softcap, sinks)
    out = F.scaled_dot_product_attention(
        qc.to(compute_dtype),
        kc.to(compute_dtype),
        vc.to(compute_dtype),
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
    )
    return out.to(qc.dtype)


def two_view_scores(qc, kc, far_q, far_k, q0: int, k0: int, reach: int) -> torch.Tensor | None:
    """fp32 logits (B, H, C, Tc), unscaled, of queries from slot ``q0`` over keys from slot ``k0``: a key at
    distance >= ``reach`` scored by the far view (``far_q . far_k``), a nearer one by the near view; None when no
    key here is that far (the near view alone: plain attention)."""
    C, Tc = qc.shape[-2], kc.shape[-2]
    far = (q0 + torch.arange(C, device=qc.device))[:, None] - k0 - torch.arange(Tc, device=qc.device) >= reach
    if not bool(far.any()):
        return None
    scores = far_q.float() @ far_k.float().transpose(-1, -2)
    if bool(far.all()):
        return scores
    return torch.where(far, scores, qc.float() @ kc.float().transpose(-1, -2))


def _written_out(qc, kc, vc, scaling, mask, dropout, softcap, sinks, scores=None):
    """The chunk with its scores written out in fp32 (B, H, C, Tc) (``scores``: given, a two-view scheme's; else
    ``qc . kc * scaling``): the content logits softcapped (gemma2:
    ``softcap * tanh(s / softcap)``), then the positional term and the mask added (``mask``: float, or bool
    True = visible), then a softmax over the keys and, with ``sinks`` (H,), one more logit per head whose
    share is dropped (gpt_oss)."""
    if scores is None:
        scores = (qc.float() @ kc.float().transpose(-1, -2)) * scaling  # (B, H, C, Tc)
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
    probs = F.dropout(probs, p=dropout) if dropout else probs
    return (probs @ vc.float()).to(qc.dtype)  # (B, H, C, D)


def relative_logits(rel_q, rel_keys, q_pos, k_pos, scaling, dtype, first=0):
    """``rel_q[i] . rel_keys[pos_i - pos_j - first] * scaling`` for one chunk: rel_q (B, H, C, D), rel_keys (H or
    1, n, D) from distance ``first`` on, q_pos (C,), k_pos (Tc,) -> (B, H, C, Tc). One matmul against the chunk's
    distinct distances (at most C + Tc - 1 for consecutive positions), then a gather (the rel-shift of
    Transformer-XL, written as an index)."""
    dist = q_pos[:, None] - k_pos[None, :]  # (C, Tc)
    if first == 0:
        dist = dist.clamp(min=0)  # a decoder's future keys are masked anyway
    lo, hi = int(dist.min()), int(dist.max())
    table = rel_keys[:, lo - first : hi - first + 1].to(dtype)  # (H or 1, n_d, D)
    per_distance = rel_q.to(dtype) @ table.transpose(-1, -2)  # (B, H, C, n_d)
    B, H, C, _ = per_distance.shape
    index = (dist - lo).expand(B, H, C, dist.shape[-1])  # a view: no (B, H, C, Tc) index tensor
    return per_distance.gather(-1, index) * scaling
