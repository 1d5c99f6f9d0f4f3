"""``cpu-flash-band``: a distance bias that goes flat past a reach K (T5 buckets, Shaw's clipped table),
through the stock fused causal kernel.

Such a bias is ``b_h(i - j) = c_h + g_h(i - j)`` with ``c_h = b_h(K)`` and ``g_h(d) = 0`` for ``d >= K``.
Under the softmax the per-row constant ``c_h`` cancels, so only the band of the last K keys of each
query carries a bias: ``g`` by distance, zero from K on. T5 and Shaw (``_Band``) run it as
``cpu_flash_mask``'s table route: each block of queries reads the keys before it and its own causal square
through the CPU flash op, the table as a strided float mask (no copy, O(N) memory), merged by log-sum-exp; a long
block reads the keys at the reach or further from all its queries with no mask (``Table``'s ``zero_from``);
backward, the flash op's own backward per piece, and the bias's gradient per distance read off the band's K
scores per query (``band_score_grads``). Saved for backward: q, k, v, the output and the log-sum-exp (O(N)).

The band as its own pieces (``Layout``, ``band_forward``, ``band_backward``; NEZHA's relative band uses them):

- **far keys** (``i - j >= K``): queries ``K..N-1`` over keys ``0..N-K-1`` form a causal square shifted
  by K, which the stock CPU flash kernel computes as it is (``is_causal``), returning its log-sum-exp;
- **the band** (``0 <= i - j < K``): each block of C queries over the window of keys ending with its
  own last one, through the same kernel with a float mask; every window has the same
  distance pattern, so one (H, C, W) mask serves all blocks, batched as one call (O(N (C + K)) memory);
- the two merge through their log-sum-exps; backward, the flash kernel's own backward for each (given the
  merged output and log-sum-exp it returns each piece's exact gradients).

CPU only (``cpu_flash.available``): CUDA takes flex for these biases. Full causal self-attention only (no cache
offset, padding, window, dropout or per-row scale); the caller picks another kernel otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cpu_flash, cpu_flash_mask
from .call import Call

ROWS = 128  # queries per band block
GROUP_ELEMENTS = 1 << 24  # max elements of one group's windows (64 MiB fp32)
SCORE_ELEMENTS = 1 << 18  # max elements of one group's scores in the bias gradient (1 MiB fp32: cache-sized; one
# block of 12 heads at a time read the gradient of T5's band in half the time of 64 MiB groups, docs/results.md "Round 8")


def serves(c: Call) -> str | None:
    if c.band is None:
        return "no distance table flat past a reach (T5, Shaw)"
    if not c.full or c.masked or c.row_scale is not None:
        return "not full causal self-attention without padding, window or per-row scale"
    return cpu_flash_mask.serves(c)  # a bias, the CPU flash op, no dropout


def run(c: Call) -> torch.Tensor:
    return attend_band(c.q, c.k, c.v, scaling=c.scaling, band=c.band)


def attend_band(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scaling: float, band: torch.Tensor
) -> torch.Tensor:
    """Causal self-attention of q, k, v (B, H, N, D) with the bias ``band[h, min(i - j, K)]``;
    band (H, K + 1): the bias at distances 0..K, flat from K on. Returns (B, H, N, D)."""
    K = band.shape[-1] - 1
    g = band[:, :K] - band[:, K:]  # (H, K): the band's bias over the far one
    return _Band.apply(q, k, v, g.to(torch.float32), scaling)


class Layout:
    """The band in blocks of C queries. Block b's window is the T * C keys ending with its own last one,
    so every window has the same distance pattern and the same (H, C, W) bias; keys are left-padded by
    L = (T - 1) * C >= K - 1 and the sequence right-padded to n * C. The first T - 1 blocks (whose
    windows reach into the padding) are attended one by one over their real keys; the rest in one call
    with the blocks as the batch."""

    def __init__(self, N: int, K: int, device, row_elements: int = 1):
        self.N, self.K, self.C = N, K, ROWS
        self.row_elements = row_elements  # B * H * D: one key row of every window, for the group budget
        self.T = -(-(self.C + K - 1) // self.C)  # window tiles
        self.W, self.L = self.T * self.C, (self.T - 1) * self.C
        self.n = -(-N // self.C)
        d = torch.arange(self.C, device=device)[:, None] - torch.arange(self.W, device=device)[None, :] + self.L
        self.inside = (d >= 0) & (d < K)  # (C, W): query r of a block and column c of its window
        self.idx = d.clamp(0, K - 1)
        r = torch.arange(self.C, device=device)[:, None]
        # (C, K): the window column of ``band``'s entry (r, t), the key at distance K - 1 - t
        self.column = r + self.L - K + 1 + torch.arange(K, device=device)[None, :]

    def band(self, x):  # (B, H, G, C, W) contiguous -> (B, H, G, C, K) view: column t at distance K - 1 - t
        b, h, g, _, _ = x.stride()
        return x.as_strided((*x.shape[:-1], self.K), (b, h, g, self.W + 1, 1), x.storage_offset() + self.L - self.K + 1)

    def bias(self, g):  # (H, K) -> (1, H, C, W) fp32, -inf outside the band
        return g[:, self.idx].masked_fill(~self.inside, float("-inf"))[None]

    def blocks(self, x):  # (B, H, N, D) -> (B, H, n, C, D) fp32, zero rows at the end (a view when none are needed)
        x, pad = x.float(), self.n * self.C - self.N
        return (F.pad(x, (0, 0, 0, pad)) if pad else x).unflatten(2, (self.n, self.C))

    def windows(self, x):  # (B, H, N, D) -> (B, H, n, W, D) fp32: a strided view of the padded keys
        x = F.pad(x.float(), (0, 0, self.L, self.n * self.C - self.N))
        return x.unfold(2, self.W, self.C).transpose(-1, -2)

    def fold(self, w):  # (B, H, n, W, D) window gradients -> (B, H, N, D) key gradients
        B, H, n, _, D = w.shape
        acc = w.new_zeros(B, H, (n + self.T - 1) * self.C, D)
        w = w.view(B, H, n, self.T, self.C, D)
        for t in range(self.T):
            acc[:, :, t * self.C : (t + n) * self.C] += w[:, :, :, t].reshape(B, H, n * self.C, D)
        return acc[:, :, self.L : self.L + self.N]

    def pieces(self):
        """The flash calls over the band: (blocks, lo) for each of the first blocks alone (window columns
        before lo are padding), then (blocks, None) for the rest with the blocks as the batch, in groups
        whose windows hold at most ``GROUP_ELEMENTS`` elements."""
        first = min(self.n, self.T - 1)
        for b in range(first):
            yield slice(b, b + 1), self.L - b * self.C
        per_block = max(1, GROUP_ELEMENTS // (self.row_elements * self.W))  # windows' copies stay bounded
        for b in range(first, self.n, per_block):
            yield slice(b, min(self.n, b + per_block)), None

    @staticmethod
    def take(x, piece, lo=0):
        """Rows of blocks/windows x (B, H, n, R, ...) for a piece: (B, H, R', ...) or (B * m, H, R, ...)."""
        rows, alone = piece
        if alone is not None:
            return x[:, :, rows.start, lo:]
        x = x[:, :, rows].transpose(1, 2)
        return x.reshape(-1, *x.shape[2:])

    @staticmethod
    def put(acc, piece, value):  # the inverse of take for an accumulator (B, H, n, R, ...)
        rows, alone = piece
        if alone is not None:
            view = acc[:, :, rows.start]
            view[:, :, view.shape[2] - value.shape[2] :] = value
        else:
            acc[:, :, rows] = value.view(acc.shape[0], -1, *value.shape[1:]).transpose(1, 2)


class _Band(torch.autograd.Function):
    """T5 / Shaw: the band's bias over the far one as a table by distance (zero from K on) through
    ``cpu_flash_mask``'s table route (each block's keys before it and its causal square, one pass over the keys);
    the bias's gradient per distance read off the band's K scores per query (``band_score_grads``)."""

    @staticmethod
    def forward(ctx, q, k, v, g, scaling):
        N = q.shape[-2]
        out, lse = cpu_flash_mask.table_forward(*(x.float() for x in (q, k, v)), scaling, _table(g, N))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, g, out, lse)
        ctx.scaling = scaling
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, g, out, lse = ctx.saved_tensors
        B, H, N, D = q.shape
        qf, kf, vf, of, df = (x.float() for x in (q, k, v, out, dout.contiguous()))
        dq, dk, dv = cpu_flash_mask.table_backward(df, (qf, kf, vf), of, lse, ctx.scaling, _table(g, N))
        dg = None
        if ctx.needs_input_grad[3]:  # d loss / d g (H, K): dS summed per distance, over the band's windows
            lay = Layout(N, g.shape[-1], q.device, B * H * D)
            blocks = (lay.blocks(qf), lay.windows(kf), lay.windows(vf), lay.blocks(df), lay.blocks(of))
            blocks += (lay.blocks(lse[..., None])[..., 0],)
            dg = torch.zeros_like(g)
            reversed_g = g.flip(-1)[None, :, None, None, :]  # band_score_grads' order: distance K - 1 - t
            for _, _, ds in band_score_grads(lay, blocks, ctx.scaling, lambda b0, b1: reversed_g):
                dg += ds.sum((0, 2, 3))
            dg = dg.flip(-1)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, None


def _table(g: torch.Tensor, N: int) -> cpu_flash_mask.Table:
    """The masks of g (H, K) as a bias by distance over N keys: g[d] below K, 0 from K on."""
    H, K = g.shape
    table = torch.zeros(H, N, dtype=torch.float32, device=g.device)
    table[:, : min(K, N)] = g[:, :N]
    return cpu_flash_mask.Table(table, 0, cpu_flash_mask.square_rows(H, N), zero_from=K)


def band_forward(q, k, v, scaling, lay: Layout, mask_of):
    """Causal self-attention of q, k, v (B, H, N, D) whose band (keys less than K back) carries a float mask and
    whose far keys carry none: (out in q's dtype, lse (B, H, N) fp32). ``mask_of(piece)``: the band's mask for one
    of ``lay.pieces()``, (1 or as many as the piece's batch, H, C, its window columns), -inf outside the band."""
    B, H, N, D = q.shape
    K = lay.K
    out = torch.empty(B, H, lay.n, lay.C, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, H, lay.n, lay.C, dtype=torch.float32, device=q.device)
    qb, kw, vw = lay.blocks(q), lay.windows(k), lay.windows(v)
    for piece in lay.pieces():  # the band: blocks of queries over their windows, with the mask
        lo = piece[1] or 0
        o, s = cpu_flash.forward(
            lay.take(qb, piece), lay.take(kw, piece, lo), lay.take(vw, piece, lo), scaling, mask_of(piece), causal=False
        )
        lay.put(out, piece, o)
        lay.put(lse, piece, s)
    out, lse = out.view(B, H, -1, D)[:, :, :N], lse.view(B, H, -1)[:, :, :N]
    if N > K:  # far keys: queries K.. over keys ..N-K, a causal square; merged by log-sum-exp
        far_out, far_lse = cpu_flash.forward(q[:, :, K:], k[:, :, : N - K], v[:, :, : N - K], scaling)
        out[:, :, K:], lse[:, :, K:] = cpu_flash.merge(far_out, far_lse, out[:, :, K:], lse[:, :, K:])
    return out.to(q.dtype), lse.contiguous()


def band_backward(dout, qkv, merged, scaling, lay: Layout, mask_of):
    """(dq, dk, dv) fp32 of ``band_forward``'s attention of ``qkv`` (q, k, v (B, H, N, D)), given its output and
    log-sum-exp (``merged``: (out, lse)), and the blocks (qb, kw, vw, db, ob, lb) that ``band_score_grads`` reads."""
    q, k, v = qkv
    out, lse = merged
    B, H, N, D = q.shape
    K = lay.K
    dout = dout.contiguous()
    qb, kw, vw = lay.blocks(q), lay.windows(k), lay.windows(v)
    ob, db, lb = lay.blocks(out), lay.blocks(dout), lay.blocks(lse[..., None])[..., 0]
    dqb, dkw, dvw = torch.zeros_like(qb), torch.zeros_like(kw), torch.zeros_like(vw)
    for piece in lay.pieces():  # the band's gradients, from the merged output and lse
        lo = piece[1] or 0
        grads = cpu_flash.backward(
            lay.take(db, piece),
            (lay.take(qb, piece), lay.take(kw, piece, lo), lay.take(vw, piece, lo)),
            (lay.take(ob, piece), lay.take(lb, piece).contiguous()),
            scaling,
            mask_of(piece),
            causal=False,
        )
        for acc, grad in zip((dqb, dkw, dvw), grads):
            lay.put(acc, piece, grad)
    dq, dk, dv = dqb.view(B, H, -1, D)[:, :, :N], lay.fold(dkw), lay.fold(dvw)
    if N > K:  # the far square's exact gradients, from the merged output and log-sum-exp
        far = cpu_flash.backward(
            dout[:, :, K:],
            (q[:, :, K:], k[:, :, : N - K], v[:, :, : N - K]),
            (out[:, :, K:].contiguous(), lse[:, :, K:].contiguous()),
            scaling,
        )
        dq[:, :, K:] += far[0]
        dk[:, :, : N - K] += far[1]
        dv[:, :, : N - K] += far[2]
    return dq, dk, dv, (qb, kw, vw, db, ob, lb)


def band_score_grads(lay, blocks, scaling, band_bias):
    """d loss / d (the band's K scores per query), dS = P (dP - rowsum(dO * O)), read off the windows' scores:
    yields (b0, b1, dS (B, H, G, C, K)), **column t at distance K - 1 - t** (a strided view of the scores, no
    gather), for groups of blocks [b0, b1) whose (B, H, G, C, W) scores stay under ``SCORE_ELEMENTS`` (O(N K) work
    past the matmuls, bounded memory). ``band_bias(b0, b1)``: the bias at those K distances in the same reversed
    order, broadcastable to dS (zero rows past the padding and the sequence's end give dS 0)."""
    qb, kw, vw, db, ob, lb = blocks
    B, H, n, C, _ = qb.shape
    group = max(1, SCORE_ELEMENTS // (B * H * C * lay.W))
    for b0 in range(0, n, group):
        b1 = min(n, b0 + group)
        scores = lay.band(qb[:, :, b0:b1] @ kw[:, :, b0:b1].transpose(-1, -2))  # (B, H, G, C, K) of (.., C, W)
        p = cpu_flash.exp_(scores.mul(scaling).add_(band_bias(b0, b1)).sub_(lb[:, :, b0:b1, :, None]))
        if b0 < lay.T - 1:  # the first blocks' windows reach into the padding
            p.masked_fill_(lay.column < _padding_columns(lay, b0, b1, qb.device), 0.0)
        dp = lay.band(db[:, :, b0:b1] @ vw[:, :, b0:b1].transpose(-1, -2))
        delta = (db[:, :, b0:b1] * ob[:, :, b0:b1]).sum(-1, keepdim=True)  # (B, H, G, C, 1)
        yield b0, b1, p.mul_(dp.sub_(delta))


def _padding_columns(lay, b0, b1, device):  # (1, 1, G, 1, 1): window columns below this are padding
    lo = (lay.L - torch.arange(b0, b1, device=device) * lay.C).clamp(min=0)
    return lo.view(1, 1, -1, 1, 1)
