"""``sdpa-relative-dims``: Transformer-XL through the stock fused SDPA kernel: the relative term rides as extra
dimensions of q and k.

Transformer-XL's position vectors are r_d = W_h R(d), R(d) interleaving sin and cos of ``d * w_f``
(``Relative.sinusoid``). With p_i = W_h^T (q_i + v) (``dim`` wide), the angle-difference identities give

    (q_i + v) . r_{i-j} = sum_f p_{i,2f} sin(w_f (i - j)) + p_{i,2f+1} cos(w_f (i - j))
                        = sum_f a_{i,f} cos(w_f j) + b_{i,f} sin(w_f j),
    a_{i,f} = p_{i,2f} sin(w_f i) + p_{i,2f+1} cos(w_f i),   b_{i,f} = p_{i,2f+1} sin(w_f i) - p_{i,2f} cos(w_f i)

(each pair of p rotated by w_f i, as RoPE does), so q' = [q + u, a, b] and k' = [k, cos(w j), sin(w j)] give
``scaling * q'.k'`` = the score, exactly, at any positions (a cache offset, a block's own positions). The
fused kernel then runs forward and backward with O(N) memory, and autograd carries the gradients of q, u, v
and W_R through a, b. The sines and cosines of the positions are taken in float64 (the chunked kernel's table
rounds ``d * w_f`` in fp32 first: the two agree to that rounding). v is zero-padded to q's width: the CPU
flash kernel runs only with equal widths (through SDPA unequal widths ran several times slower than v padded;
measured: docs/ARCHITECTURE.md, "The attention kernels").

Cost: q and k ``dim`` wider (the head dim by default: twice the score matmuls); measured in
``benchmarks/bench_kernel_relative.json``. Full causal attention runs as one causal square (on CPU in blocks of
queries forward and backward: ``_CausalSquare``, v's matmuls and dk at v's width), a cached prefix
on CPU as a rectangle then a square (``cpu_flash.rectangle_then_square``); padding, a window or dropout in
blocks of queries with a boolean mask each (checkpointed under grad: memory linear in N). Half-precision
inputs are scored in fp32. Auto passes a decoding step on (``sdpa_alibi_dims.worth``: the dims would be
appended to every cached key at every step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import cpu_flash
from .call import Call, chunk_rows
from .cpu_flash_mask import Seen, Span
from .sdpa_alibi_dims import block_mask, fused_width, pad_to, wide, worth  # noqa: F401  (worth: the table's row)


def serves(c: Call) -> str | None:
    if c.relative is None or c.relative.sinusoid is None:
        return "no relative term whose keys are a projected sinusoid (Transformer-XL)"
    return None


def run(c: Call) -> torch.Tensor:
    rel = c.relative
    dtype = torch.float32 if c.q.dtype in (torch.float16, torch.bfloat16) else c.q.dtype
    B, H, Tq, D = c.q.shape
    k_pos = torch.arange(c.Tk, device=c.q.device) if rel.positions is None else rel.positions
    q_pos = k_pos[c.q_start : c.q_start + Tq]
    proj, freqs = rel.sinusoid
    qx = torch.cat([c.q.to(dtype), query_dims(rel.query.to(dtype), proj.to(dtype), freqs, q_pos)], dim=-1)
    cos_j, sin_j = _angles(freqs, k_pos, dtype)
    if c.full and not c.masked and not c.dropout and cpu_flash.available(qx):  # the causal square, its own backward
        angles = torch.cat([cos_j, sin_j], -1)
        return _CausalSquare.apply(qx, c.k.to(dtype), angles, c.v.to(dtype), c.scaling).to(c.q.dtype)
    kx = torch.cat([c.k.to(dtype), torch.cat([cos_j, sin_j], -1).expand(B, H, c.Tk, -1)], dim=-1)
    width = fused_width(qx.shape[-1], qx)
    qx, kx, vx = pad_to(qx, width), pad_to(kx, width), pad_to(c.v.to(dtype), width)
    return _attend(c, qx, kx, vx)[..., :D].to(c.q.dtype)


def query_dims(rel_q: torch.Tensor, proj: torch.Tensor, freqs: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """[a, b] of the module docstring: rel_q (B, H, Tq, D), proj (H, D, dim), q_pos (Tq,) -> (B, H, Tq, dim)."""
    p = rel_q @ proj  # (B, H, Tq, dim)
    even, odd = p[..., 0::2], p[..., 1::2]
    cos_i, sin_i = _angles(freqs, q_pos, p.dtype)
    return torch.cat([even * sin_i + odd * cos_i, odd * sin_i - even * cos_i], dim=-1)


def _angles(freqs, pos, dtype):
    """(cos, sin) of pos * freqs, (T, dim / 2) each, taken in float64 where the device has it."""
    w = wide(pos.device)
    angles = pos.to(w)[:, None] * freqs.to(w)[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _attend(c: Call, qx, kx, vx):
    plain = not c.masked and not c.dropout
    if plain and (c.full or c.Tq == 1):  # one causal square, or one query over every key
        return F.scaled_dot_product_attention(qx, kx, vx, is_causal=c.full, scale=c.scaling)
    if plain and cpu_flash.available(qx):  # a cached prefix, then the new queries' own causal square
        s = c.q_start
        return cpu_flash.rectangle_then_square(qx, kx[:, :, :s], vx[:, :, :s], kx[:, :, s:], vx[:, :, s:], c.scaling)
    rows = chunk_rows(c.q.shape[1], c.Tq, c.Tk)  # padding, a window or dropout: blocks with a bool mask each
    use_ckpt = c.grad and rows < c.Tq
    outs = []
    for s in range(0, c.Tq, rows):
        e = min(c.Tq, s + rows)
        args = (qx[:, :, s:e], kx, vx, c.q_start + s, c)
        outs.append(checkpoint(_block, *args, use_reentrant=False) if use_ckpt else _block(*args))
    return torch.cat(outs, dim=2)


def _block(qb, kx, vx, i0, c: Call):
    i1 = i0 + qb.shape[-2]
    lo = max(0, i0 - c.window + 1) if c.window else 0
    mask = block_mask(Span(i0, i1 - i0, lo, i1 - lo), Seen(c.key_padding, c.window), qb.device)
    causal = mask is None and i0 == 0 and i1 > 1
    return F.scaled_dot_product_attention(
        qb, kx[:, :, lo:i1], vx[:, :, lo:i1], attn_mask=mask, dropout_p=c.dropout, is_causal=causal, scale=c.scaling
    )


ROWS = 128  # queries per block of the causal square (fewer where one head's block would pass BLOCK_ELEMENTS)
BLOCK_ELEMENTS = 1 << 20  # a block's (B, heads, C, keys) scores stay under this (4 MiB in fp32, near the caches):
# heads in groups, one head a block from 8,192 keys on; all heads at once (16 MiB) ran the square slower


class _CausalSquare(torch.autograd.Function):
    """Full causal attention of qx (B, H, N, D + dim) over [k, angles] (angles (N, dim): the same for every head)
    and v (B, H, N, D), in blocks of queries over the keys they see (``_blocks``: a group of heads, ``ROWS``
    queries): P from the scores at width D + dim, its matmuls with v at v's width. The CPU flash op takes equal
    widths only, so through it v would be zero-padded to D + dim and P V would cost twice (measured against it:
    ``docs/results.md``, "Attention kernel", its latest round).
    The backward recomputes P from the saved log-sum-exp, so v's matmuls (P^T dO, dO v^T) and dk's run at v's
    width too. Saved for backward: qx, k, v, the output and the log-sum-exp (O(N))."""

    @staticmethod
    def forward(ctx, qx, k, angles, v, scaling):
        B, H, N, D = v.shape
        out = torch.empty_like(v)
        lse = torch.empty(B, H, N, dtype=v.dtype, device=v.device)
        for h, s, e, kx in _blocks(k, angles, qx):
            scores = (qx[:, h, s:e] @ kx.transpose(-1, -2)).mul_(scaling)  # (B, g, C, e)
            future = _future(scores, s, e)
            scores[..., s:].masked_fill_(future, float("-inf"))
            m = scores.amax(-1, keepdim=True)
            p = cpu_flash.exp_(scores.sub_(m))
            p[..., s:].masked_fill_(future, 0.0)
            total = p.sum(-1, keepdim=True)
            out[:, h, s:e] = (p @ v[:, h, :e]).div_(total)
            lse[:, h, s:e] = m.add_(total.log_()).squeeze(-1)
        ctx.save_for_backward(qx, k, angles, v, out, lse)
        ctx.scaling = scaling
        return out

    @staticmethod
    def backward(ctx, dout):
        qx, k, angles, v, out, lse = ctx.saved_tensors
        D = v.shape[-1]
        dout = dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)  # rowsum(dO * O): (B, H, N, 1)
        dqx, dk, dv = torch.empty_like(qx), torch.zeros_like(k), torch.zeros_like(v)
        for h, s, e, kx in _blocks(k, angles, qx):
            scores = (qx[:, h, s:e] @ kx.transpose(-1, -2)).mul_(ctx.scaling).sub_(lse[:, h, s:e, None])
            p = cpu_flash.exp_(scores)  # P (B, g, C, e), from the merged log-sum-exp
            p[..., s:].masked_fill_(_future(p, s, e), 0.0)  # the block's own square: keys after the query
            dc = dout[:, h, s:e]
            dv[:, h, :e] += p.transpose(-1, -2) @ dc
            ds = p.mul_((dc @ v[:, h, :e].transpose(-1, -2)).sub_(delta[:, h, s:e]))  # dS = P (dP - delta)
            dqx[:, h, s:e] = ds @ kx
            dk[:, h, :e] += ds.transpose(-1, -2) @ qx[:, h, s:e, :D]
        return dqx.mul_(ctx.scaling), dk.mul_(ctx.scaling), None, dv, None


def _blocks(k, angles, qx):
    """(heads, s, e, kx): a slice of heads (a group whose block of scores stays under BLOCK_ELEMENTS), the block's
    queries [s, e) and the keys they see, kx (B, g, e, D + dim) = [k, angles], built once a group."""
    B, H, N, _ = k.shape
    rows = max(16, min(ROWS, BLOCK_ELEMENTS // (B * N)))  # one head's block under BLOCK_ELEMENTS
    group = max(1, min(H, BLOCK_ELEMENTS // (B * rows * N)))  # as many heads as stay under it
    for h0 in range(0, H, group):
        h = slice(h0, min(H, h0 + group))
        kx = torch.cat([k[:, h], angles.expand(B, h.stop - h0, N, -1)], dim=-1)  # (B, g, N, D + dim)
        for s in range(0, N, rows):
            e = min(N, s + rows)
            yield h, s, e, kx[:, :, :e]


def _future(scores, s, e):
    """The block's own square (its last e - s keys): True where a key comes after its query."""
    return torch.ones(e - s, e - s, dtype=torch.bool, device=scores.device).triu_(1)
