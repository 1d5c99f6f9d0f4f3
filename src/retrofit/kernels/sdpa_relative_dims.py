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
    qx = queries(c.q.to(dtype), rel.query.to(dtype), proj.to(dtype), freqs, q_pos)  # (B, H, Tq, D + dim)
    cos_j, sin_j = _angles(freqs, k_pos, dtype)
    if c.full and not c.masked and not c.dropout and cpu_flash.available(qx):  # the causal square, its own backward
        angles = torch.cat([cos_j, sin_j], -1)
        return _CausalSquare.apply(qx, c.k.to(dtype), angles, c.v.to(dtype), c.scaling).to(c.q.dtype)
    kx = torch.cat([c.k.to(dtype), torch.cat([cos_j, sin_j], -1).expand(B, H, c.Tk, -1)], dim=-1)
    width = fused_width(qx.shape[-1], qx)
    qx, kx, vx = pad_to(qx, width), pad_to(kx, width), pad_to(c.v.to(dtype), width)
    return _attend(c, qx, kx, vx)[..., :D].to(c.q.dtype)


def queries(q, rel_q, proj, freqs, q_pos) -> torch.Tensor:
    """qx = [q, a, b] of the module docstring: q, rel_q (B, H, Tq, D), proj (H, D, dim), q_pos (Tq,) ->
    (B, H, Tq, D + dim)."""
    cos_i, sin_i = _angles(freqs, q_pos, q.dtype)
    halves = torch.cat([proj[..., 0::2], proj[..., 1::2]], dim=-1)  # (H, D, dim): R's sin channels, then its cos
    return _Queries.apply(q, rel_q, halves, cos_i, sin_i)


class _Queries(torch.autograd.Function):
    """[q, a, b] written once into one (B, H, Tq, D + dim) tensor, p = rel_q @ halves split into its halves
    [p_even | p_odd] (contiguous: no strided channels), each half rotated by w_f i as RoPE rotates a pair."""

    @staticmethod
    def forward(ctx, q, rel_q, halves, cos_i, sin_i):
        B, H, T, D = q.shape
        F2 = cos_i.shape[-1]
        p = rel_q @ halves  # (B, H, T, dim)
        even, odd = p[..., :F2], p[..., F2:]
        qx = torch.empty(B, H, T, D + 2 * F2, dtype=q.dtype, device=q.device)
        qx[..., :D] = q
        a, b = qx[..., D : D + F2], qx[..., D + F2 :]
        torch.mul(even, sin_i, out=a).addcmul_(odd, cos_i)  # a = p_even sin(w i) + p_odd cos(w i)
        torch.mul(odd, sin_i, out=b).addcmul_(even, cos_i, value=-1.0)  # b = p_odd sin(w i) - p_even cos(w i)
        ctx.save_for_backward(rel_q, halves, cos_i, sin_i)
        return qx

    @staticmethod
    def backward(ctx, dqx):
        rel_q, halves, cos_i, sin_i = ctx.saved_tensors
        D, F2 = rel_q.shape[-1], cos_i.shape[-1]
        da, db = dqx[..., D : D + F2], dqx[..., D + F2 :]
        dp = torch.empty(*dqx.shape[:-1], 2 * F2, dtype=dqx.dtype, device=dqx.device)  # (B, H, T, dim)
        torch.mul(da, sin_i, out=dp[..., :F2]).addcmul_(db, cos_i, value=-1.0)  # d p_even
        torch.mul(da, cos_i, out=dp[..., F2:]).addcmul_(db, sin_i)  # d p_odd
        d_rel_q = dp @ halves.transpose(-1, -2) if ctx.needs_input_grad[1] else None
        d_halves = (rel_q.transpose(-1, -2) @ dp).sum(0) if ctx.needs_input_grad[2] else None
        return dqx[..., :D], d_rel_q, d_halves, None, None


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
    queries): P from the scores at width D + dim (torch's fused softmax, in place, one pass over a row), its
    matmuls with v at v's width. The CPU flash op takes equal widths only, so through it v would be zero-padded
    to D + dim and P V would cost twice (measured against it: ``docs/results.md``, "Attention kernel", its
    latest round). The backward recomputes each block's P the same way (the forward's P, bit for bit), so v's
    matmuls (P^T dO, dO v^T) and dk's run at v's width too. Saved for backward: qx, k, v and the output (O(N))."""

    @staticmethod
    def forward(ctx, qx, k, angles, v, scaling):
        out = torch.empty_like(v)
        for h, s, e, kx in _blocks(k, angles, qx):
            p = _probabilities(qx[:, h, s:e], kx, s, scaling)  # (B, g, C, e)
            torch.matmul(p, v[:, h, :e], out=out[:, h, s:e])
        ctx.save_for_backward(qx, k, angles, v, out)
        ctx.scaling = scaling
        return out

    @staticmethod
    def backward(ctx, dout):
        qx, k, angles, v, out = ctx.saved_tensors
        D = v.shape[-1]
        dout = dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)  # rowsum(dO * O): (B, H, N, 1)
        dqx, dk, dv = torch.empty_like(qx), torch.zeros_like(k), torch.zeros_like(v)
        for h, s, e, kx in _blocks(k, angles, qx):
            p = _probabilities(qx[:, h, s:e], kx, s, ctx.scaling)
            dc = dout[:, h, s:e]
            dv[:, h, :e] += p.transpose(-1, -2) @ dc
            ds = p.mul_((dc @ v[:, h, :e].transpose(-1, -2)).sub_(delta[:, h, s:e]))  # dS = P (dP - delta)
            torch.matmul(ds, kx, out=dqx[:, h, s:e])
            dk[:, h, :e] += ds.transpose(-1, -2) @ qx[:, h, s:e, :D]
        return dqx.mul_(ctx.scaling), dk.mul_(ctx.scaling), None, dv, None


def _probabilities(qb, kx, s, scaling):
    """P of one block: queries qb (B, g, C, D + dim) at rows [s, s + C) over keys kx (B, g, e, D + dim), e = s + C,
    the block's own square masked causally; softmax in place over the scores' buffer."""
    scores = (qb @ kx.transpose(-1, -2)).mul_(scaling)  # (B, g, C, e)
    C = qb.shape[-2]
    future = torch.ones(C, C, dtype=torch.bool, device=qb.device).triu_(1)  # a key after its query
    scores[..., s:].masked_fill_(future, float("-inf"))
    return torch.softmax(scores, -1, out=scores)


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
