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
queries forward and backward: ``_CausalSquare``, v's matmuls and dk at v's width; at positions 0 .. N - 1 the
angles' table in the fewest leading singular directions that hold it to fp32's rounding, ``compressed``: fewer
than ``dim`` over a few thousand positions), a cached prefix on CPU as a rectangle then a square (``cpu_flash.rectangle_then_square``); padding, a window or dropout in
blocks of queries with a boolean mask each (checkpointed under grad: memory linear in N). Half-precision
inputs are scored in fp32. Auto passes a decoding step on (``sdpa_alibi_dims.worth``: the dims would be
appended to every cached key at every step).
"""

from __future__ import annotations

import functools

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
    square = c.full and not c.masked and not c.dropout and cpu_flash.available(c.q)  # the causal square
    narrow = _narrow(c.Tk, tuple(freqs.tolist()), dtype, c.q.device) if square and rel.positions is None else None
    table, basis = narrow or (_table(freqs, k_pos, dtype), None)  # (Tk, r) and (dim, r), or (Tk, dim) and None
    qx = queries(c.q.to(dtype), rel.query.to(dtype), proj.to(dtype), freqs, q_pos, basis)  # (B, H, Tq, D + r)
    if square:
        return _CausalSquare.apply(qx, c.k.to(dtype), table, c.v.to(dtype), c.scaling).to(c.q.dtype)
    kx = torch.cat([c.k.to(dtype), table.expand(B, H, c.Tk, -1)], dim=-1)
    width = fused_width(qx.shape[-1], qx)
    qx, kx, vx = pad_to(qx, width), pad_to(kx, width), pad_to(c.v.to(dtype), width)
    return _attend(c, qx, kx, vx)[..., :D].to(c.q.dtype)


def compressed(table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """V (dim, r), orthonormal: the fewest leading singular directions of the keys' sinusoid table G (Tk, dim,
    float64) that hold every row of it to ``dtype``'s rounding, r a multiple of ``WIDTH_STEP`` below dim (or Tk
    where the table has fewer rows: then exact); None where no such width is narrower than dim.

    Over a finite span of positions the slow frequencies' sines and cosines are nearly polynomials of j, so G has a
    low numerical rank (47 of 64 over 2,048 positions; it grows ~5 a doubling). With G = U S V^T, keeping the
    first r directions moves row j by ||(U S)_{j, >=r}||; r is the smallest whose largest move is at most half an
    ulp of 1 in ``dtype`` (2^-24 in fp32), about the rounding a row of the table carries when stored in it. The
    score's term then is (x_i V) . (G_j V) for the query side x_i (``queries``' ``basis``): r dims instead of dim
    on q and k, the score-shaped matmuls narrower."""
    n, dim = table.shape
    tol = torch.finfo(dtype).eps / 2
    if table.dtype != torch.float64 or dtype == torch.float64 or dim <= WIDTH_STEP:
        return None
    if torch.linalg.svdvals(table)[dim - WIDTH_STEP :].square().sum().div(n).sqrt() > tol:
        return None  # the rows' mean square move at dim - WIDTH_STEP (a bound below the largest) is already over
    U, S, Vh = torch.linalg.svd(table, full_matrices=False)
    moved = ((U * S) ** 2).flip(-1).cumsum(-1).flip(-1).amax(0).sqrt()  # moved[r]: the largest row's move, r kept
    keep = int((moved > tol).sum())  # moved falls with r: the first r at or under the rounding
    r = -(-max(keep, 1) // WIDTH_STEP) * WIDTH_STEP
    return Vh[:r].T if r < dim else None  # (dim, min(r, Tk))


@functools.lru_cache(maxsize=4)
def _narrow(n: int, freqs: tuple, dtype: torch.dtype, device: torch.device) -> tuple | None:
    """(G V in ``dtype`` (n, r), V in ``dtype`` (dim, r)) at positions 0 .. n - 1, kept from call to call (every
    layer and step of a length alike); None where ``compressed`` finds no narrower width."""
    with torch.inference_mode(False), torch.no_grad():  # plain tensors whatever mode the first call ran in
        freqs = torch.tensor(freqs, dtype=wide(device), device=device)
        table = _table(freqs, torch.arange(n, device=device), freqs.dtype)  # (n, dim), wide
        basis = compressed(table, dtype)
        return None if basis is None else ((table @ basis).to(dtype), basis.to(dtype))


WIDTH_STEP = 8  # the compressed width rounds up to a multiple of this (measured: docs/results.md, "Attention kernel")


def queries(q, rel_q, proj, freqs, q_pos, basis=None) -> torch.Tensor:
    """qx = [q, a, b] of the module docstring: q, rel_q (B, H, Tq, D), proj (H, D, dim), q_pos (Tq,) ->
    (B, H, Tq, D + dim); with ``basis`` (dim, r) from ``compressed``: [q, [a, b] @ basis], (B, H, Tq, D + r)."""
    halves = torch.cat([proj[..., 0::2], proj[..., 1::2]], dim=-1)  # (H, D, dim): R's sin channels, then its cos
    return _Queries.apply(q, rel_q, halves, _table(freqs, q_pos, q.dtype), basis)


class _Queries(torch.autograd.Function):
    """[q, a, b] written once into one (B, H, Tq, D + dim) tensor, p = rel_q @ halves split into its halves
    [p_even | p_odd] (contiguous: no strided channels), each half rotated by w_f i as RoPE rotates a pair; with a
    basis, [a, b] goes through it (dim -> r) on its way into the tensor."""

    @staticmethod
    def forward(ctx, q, rel_q, halves, angles, basis):
        B, H, T, D = q.shape
        F2 = angles.shape[-1] // 2
        cos_i, sin_i = angles[:, :F2], angles[:, F2:]  # (T, dim / 2) each
        p = rel_q @ halves  # (B, H, T, dim)
        even, odd = p[..., :F2], p[..., F2:]
        r = 2 * F2 if basis is None else basis.shape[-1]
        qx = torch.empty(B, H, T, D + r, dtype=q.dtype, device=q.device)
        qx[..., :D] = q
        ab = qx[..., D:] if basis is None else torch.empty_like(p)  # (B, H, T, dim)
        a, b = ab[..., :F2], ab[..., F2:]
        torch.mul(even, sin_i, out=a).addcmul_(odd, cos_i)  # a = p_even sin(w i) + p_odd cos(w i)
        torch.mul(odd, sin_i, out=b).addcmul_(even, cos_i, value=-1.0)  # b = p_odd sin(w i) - p_even cos(w i)
        if basis is not None:
            qx[..., D:] = ab @ basis  # (B, H, T, r)
        ctx.save_for_backward(rel_q, halves, cos_i, sin_i, basis)
        return qx

    @staticmethod
    def backward(ctx, dqx):
        rel_q, halves, cos_i, sin_i, basis = ctx.saved_tensors
        D, F2 = rel_q.shape[-1], cos_i.shape[-1]
        dab = dqx[..., D:] if basis is None else dqx[..., D:] @ basis.T  # (B, H, T, dim)
        da, db = dab[..., :F2], dab[..., F2:]
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


def _table(freqs, pos, dtype):
    """[cos(w p), sin(w p)] (T, dim) at positions ``pos``: the keys' side, and the query side's rotation."""
    return torch.cat(_angles(freqs, pos, dtype), -1)


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
    """Full causal attention of qx (B, H, N, D + r) over [k, angles] (angles (N, r): the same for every head; r the
    sinusoid's dim, or fewer: ``compressed``) and v (B, H, N, D), in blocks of queries over the keys they see
    (``_blocks``: a group of heads, ``ROWS`` queries): P from the scores at width D + r (torch's fused softmax, in place, one pass over a row), its
    matmuls with v at v's width. The CPU flash op takes equal widths only, so through it v would be zero-padded
    to D + r and P V would cost twice (measured against it: ``docs/results.md``, "Attention kernel", its
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
    """P of one block: queries qb (B, g, C, D + r) at rows [s, s + C) over keys kx (B, g, e, D + r), e = s + C,
    the block's own square masked causally; softmax in place over the scores' buffer."""
    scores = (qb @ kx.transpose(-1, -2)).mul_(scaling)  # (B, g, C, e)
    C = qb.shape[-2]
    future = torch.ones(C, C, dtype=torch.bool, device=qb.device).triu_(1)  # a key after its query
    scores[..., s:].masked_fill_(future, float("-inf"))
    return torch.softmax(scores, -1, out=scores)


def _blocks(k, angles, qx):
    """(heads, s, e, kx): a slice of heads (a group whose block of scores stays under BLOCK_ELEMENTS), the block's
    queries [s, e) and the keys they see, kx (B, g, e, D + r) = [k, angles], built once a group."""
    B, H, N, _ = k.shape
    rows = max(16, min(ROWS, BLOCK_ELEMENTS // (B * N)))  # one head's block under BLOCK_ELEMENTS
    group = max(1, min(H, BLOCK_ELEMENTS // (B * rows * N)))  # as many heads as stay under it
    for h0 in range(0, H, group):
        h = slice(h0, min(H, h0 + group))
        kx = torch.cat([k[:, h], angles.expand(B, h.stop - h0, N, -1)], dim=-1)  # (B, g, N, D + r)
        for s in range(0, N, rows):
            e = min(N, s + rows)
            yield h, s, e, kx[:, :, :e]
