"""``cpu-flash-mask``: a bias of any shape (FIRE's query-normalised distance; T5/Shaw/ALiBi with a block's own
positions or a temperature) through the CPU flash kernel as its float mask, one block of queries at a time.

Each block of C queries attends over the keys it can see, with its own (H, C, Tc) bias as the kernel's
float mask (``block_bias``: the scheme's bias, the causal, window and padding masks as -inf, a per-row
temperature). Only the causal part is built (about N^2 / 2 + N C / 2 bias entries per head, never
H x N x N at once), and no score tensor is kept: saved for backward are q, k, v, the output and the
log-sum-exp (O(N)).

Backward, per block: the flash kernel's own backward for q, k, v (given the output and log-sum-exp); or,
when a parameter of the bias needs a gradient, the block's probabilities P and dS = P (dP - rowsum(dO * O))
computed once from its recomputed scores, giving dq, dk, dv (four matmuls) and the bias's gradient dS, pushed
through the block's bias rebuilt under autograd to the parameters (FIRE's MLP, c and threshold; T5's or Shaw's
table).

CPU only (``cpu_flash.available``), no dropout; any cache offset, padding or window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import cpu_flash
from .call import BiasFn, Call, chunk_rows

ROWS = 128  # queries per block, at most
BLOCK_ELEMENTS = 1 << 21  # a block's (B, H, C, Tc) mask stays near this size: with 12 heads C leaves 128
# rows past ~1.4k keys and reaches 32 past ~2.7k
MIN_ROWS = 32  # the CPU flash kernel's own query split; fewer rows only add calls


def serves(c: Call) -> str | None:
    if c.bias is None:
        return "no score bias"
    return op_serves(c)


def op_serves(c: Call) -> str | None:
    """Why the CPU flash op's mask kernel cannot run this call (dropout, no op for this device or dtype), or None."""
    if c.dropout > 0:
        return "attention dropout (the CPU flash op's mask kernel takes none)"
    if not cpu_flash.available(c.q):
        return "the CPU flash op is missing for this device or dtype (CUDA, float64, an old torch)"
    return None


def run(c: Call) -> torch.Tensor:
    max_rows = chunk_rows(c.q.shape[0] * c.q.shape[1], c.Tq, c.Tk)
    if by_distance(c):
        return attend_distance(c, max_rows=max_rows)
    return attend_dense(c, max_rows=max_rows)


def by_distance(c: Call) -> bool:
    """The bias is one value per distance for every query (``Call.distance_only``) and nothing else shapes the
    mask but causality and a window: the distance table's route."""
    return c.distance_only and c.causal and c.key_padding is None and c.row_scale is None and c.Tk == c.q_start + c.Tq


@dataclass(frozen=True)
class Span:
    """One block of ``block_bias``: the queries at slots q0 .. q0 + C - 1 over the keys at k0 .. k0 + Tc - 1."""

    q0: int
    C: int
    k0: int
    Tc: int
    row_scale: torch.Tensor | None = None  # (B, C): each query row's bias multiplied by its scale (a temperature)


@dataclass(frozen=True)
class Seen:
    """Which keys a query sees: those up to its own slot (``causal``; else every key), fewer than ``window`` back
    (``causal`` False: |i - j| < window), and the real ones of ``key_padding`` (B, Tk) bool (True = real token)."""

    key_padding: torch.Tensor | None = None
    window: int | None = None
    causal: bool = True


def block_bias(
    bias: BiasFn | None, H: int, span: Span, device, dtype=torch.float32, seen: Seen = Seen()
) -> torch.Tensor:
    """The float mask of the ``span``'s queries over its keys: (1 or B, H, C, Tc) in ``dtype``, the bias (times
    ``span.row_scale`` (B, C)) where the key is visible, -inf elsewhere (future keys, keys a window or more back,
    padding in the cache's slots: as ``seen`` says; a query always sees itself). Not causal: keys after the query
    are visible too, and a window spans both sides (the adapter gives the module's own width, e.g. ModernBERT's
    local_attention / 2 + 1). ``bias`` None: a (1 or B, 1, C, Tc) bool mask (True = visible)."""
    q_pos = torch.arange(span.q0, span.q0 + span.C, device=device)
    k_pos = torch.arange(span.k0, span.k0 + span.Tc, device=device)
    rel = q_pos[:, None] - k_pos[None, :]  # (C, Tc)
    allowed = rel >= 0 if seen.causal else torch.ones_like(rel, dtype=torch.bool)
    if seen.window:
        allowed = allowed & ((rel if seen.causal else rel.abs()) < seen.window)
    allowed = allowed[None, None]  # (1, 1, C, Tc)
    if seen.key_padding is not None:
        pad = seen.key_padding[:, span.k0 : span.k0 + span.Tc].bool()[:, None, None, :]  # (B, 1, 1, Tc)
        allowed = (allowed & pad) | (rel == 0)  # a padded query still sees itself: no all-masked (NaN) rows
    if bias is None:
        return allowed
    h = torch.arange(H, device=device)[:, None, None]
    mask = bias(h, q_pos[None, :, None], k_pos[None, None, :]).to(dtype)[None]  # (1, H, C, Tc)
    if span.row_scale is not None:
        mask = mask * span.row_scale[:, None, :, None].to(dtype)  # (B, H, C, Tc)
    return mask.masked_fill(~allowed, float("-inf"))


def attend_dense(c: Call, max_rows: int = ROWS) -> torch.Tensor:
    """Causal attention of ``c.q`` (B, H, Tq, D) over ``c.k``, ``c.v`` (B, H, Tk, D) with ``c.bias(h, i, j)`` added
    to the scores; query r sits at slot q_start + r; its key padding, window and per-row scale as ``Call`` says.
    ``c.bias_params``: the tensors the bias is computed from (their gradients are returned through the bias).
    ``max_rows``: fewer queries per block when a block's (B, H, C, Tc) scores would be too large. Half inputs are
    scored in fp32. Returns (B, H, Tq, D) in q's dtype."""
    q, k = c.q, c.k
    rows = max(1, min(ROWS, max_rows, block_rows(q.shape[0] * q.shape[1], k.shape[-2])))
    row_scale = None if c.row_scale is None else c.row_scale.detach()
    spec = (c.bias, c.key_padding, c.window, c.q_start, row_scale, c.scaling, rows)
    return _Dense.apply(spec, q, k, c.v, *c.bias_params)


def block_rows(BH: int, Tk: int) -> int:
    """Queries per block for B x H heads over Tk keys: a multiple of MIN_ROWS whose mask stays near
    BLOCK_ELEMENTS: fewer rows of long keys run faster and hold less transient memory than more (measured:
    docs/ARCHITECTURE.md, "The attention kernels")."""
    fit = BLOCK_ELEMENTS // max(1, BH * Tk) // MIN_ROWS * MIN_ROWS
    return max(MIN_ROWS, min(ROWS, fit))


def _blocks(spec, Tq: int):
    """(s, e, lo, hi): query rows [s, e) and the keys [lo, hi) they can see."""
    window, q_start, rows = spec[2], spec[3], spec[6]
    for s in range(0, Tq, rows):
        e = min(Tq, s + rows)
        lo = max(0, q_start + s - window + 1) if window else 0
        yield s, e, lo, q_start + e


def _mask(spec, H, rows: tuple[int, int], keys: tuple[int, int], device):
    """The float mask of query rows [s, e) over keys [lo, hi) (``rows``, ``keys``) as ``spec`` says."""
    (s, e), (lo, hi) = rows, keys
    bias, key_padding, window, q_start, row_scale = spec[:5]
    scales = None if row_scale is None else row_scale[:, s:e]
    span, seen = Span(q_start + s, e - s, lo, hi - lo, scales), Seen(key_padding, window)
    return block_bias(bias, H, span, device, seen=seen)


class _Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, q, k, v, *params):
        B, H, Tq, D = q.shape
        scaling = spec[5]
        qf, kf, vf = (x.float() for x in (q, k, v))
        out = torch.empty(B, H, Tq, v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
        for s, e, lo, hi in _blocks(spec, Tq):
            mask = _mask(spec, H, (s, e), (lo, hi), q.device).expand(B, -1, -1, -1)
            out[:, :, s:e], lse[:, :, s:e] = cpu_flash.forward(
                qf[:, :, s:e], kf[:, :, lo:hi], vf[:, :, lo:hi], scaling, mask, causal=False
            )
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *params = ctx.saved_tensors
        spec = ctx.spec
        scaling = spec[5]
        B, H, Tq, _ = q.shape
        qf, kf, vf, of, df = (x.float() for x in (q, k, v, out, dout.contiguous()))
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        wanted = [i for i, p in enumerate(params) if ctx.needs_input_grad[4 + i]]
        dparams = [None] * len(params)
        for s, e, lo, hi in _blocks(spec, Tq):
            qc, kc, vc, oc, dc, lc = (
                qf[:, :, s:e],
                kf[:, :, lo:hi],
                vf[:, :, lo:hi],
                of[:, :, s:e],
                df[:, :, s:e],
                lse[:, :, s:e],
            )
            with torch.enable_grad():
                mask = _mask(spec, H, (s, e), (lo, hi), q.device)
            fixed = mask.detach()
            if not (wanted and mask.requires_grad):  # q, k, v only: the flash kernel's own backward
                g = cpu_flash.backward(
                    dc, (qc, kc, vc), (oc, lc.contiguous()), scaling, fixed.expand(B, -1, -1, -1), causal=False
                )
                dq[:, :, s:e] += g[0]
                dk[:, :, lo:hi] += g[1]
                dv[:, :, lo:hi] += g[2]
                continue
            # the bias's parameters too: P and dS once, for q, k, v and the bias alike
            p = _probabilities(qc, kc, lc, fixed, scaling)  # (B, H, C, Tc)
            dv[:, :, lo:hi] += p.transpose(-1, -2) @ dc
            ds = p.mul_((dc @ vc.transpose(-1, -2)).sub_((dc * oc).sum(-1, keepdim=True)))  # dS = P (dP - delta)
            dq[:, :, s:e] += (ds @ kc).mul_(scaling)
            dk[:, :, lo:hi] += (ds.transpose(-1, -2) @ qc).mul_(scaling)
            dmask = ds.sum(0, keepdim=True) if mask.shape[0] == 1 else ds
            got = torch.autograd.grad(mask, [params[i] for i in wanted], dmask, allow_unused=True)
            for i, grad in zip(wanted, got):
                if grad is not None:
                    dparams[i] = grad if dparams[i] is None else dparams[i] + grad
        return None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), *dparams


def attend_distance(c: Call, max_rows: int = ROWS) -> torch.Tensor:
    """``attend_dense`` for a bias of the distance alone (``by_distance``): the bias is evaluated once per distance
    (an (H, Tk) table, FIRE's MLP on Tk values instead of on every score) and each block of queries reads it as a
    strided view, its rows in reverse order (row r' of the view starts one table entry after row r' - 1's, a view
    with no copy; the CPU flash op reads such a mask as it is). Backward: each block's P and dS once, giving dq, dk,
    dv and the table's gradient, dS summed along the block's diagonals (one value per distance), then pushed
    through the table to the bias's parameters once per call."""
    q, k = c.q, c.k
    rows = max(1, min(ROWS, max_rows, block_rows(q.shape[0] * q.shape[1], k.shape[-2])))
    spec = (c.bias, None, c.window, c.q_start, None, c.scaling, rows)
    return _Distance.apply(spec, q, k, c.v, *c.bias_params)


def distance_table(spec, H: int, Tk: int, device) -> torch.Tensor:
    """(H, Tk) fp32: the bias at distances 0 .. Tk - 1 (read at the last query's slot), -inf from a window on."""
    bias, window = spec[0], spec[2]
    last = Tk - 1
    d = torch.arange(Tk, device=device)
    h = torch.arange(H, device=device)[:, None, None]
    table = bias(h, torch.full((1, 1, 1), last, device=device), (last - d)[None, None]).to(torch.float32)[:, 0]
    if window:
        table = table.masked_fill(d >= window, float("-inf"))
    return table


def _reversed(table: torch.Tensor, rows: int) -> torch.Tensor:
    """(H, M): the table extended by rows - 1 future distances (-inf) and read backwards: entry m holds distance
    Tk - 1 - m (M = Tk + rows - 1)."""
    future = table.new_full((table.shape[0], rows - 1), float("-inf"))
    return torch.cat([future, table], dim=-1).flip(-1).contiguous()


def _view(rev: torch.Tensor, Tk: int, block) -> torch.Tensor:
    """(1, H, C, Tc) the block's mask with its rows in reverse order: row r' is query e - 1 - r' (a strided view)."""
    s, e, lo, hi = block
    base = Tk - e + lo  # row r' = rev[base + r' : base + r' + Tc]: distance e - 1 - r' - (lo + c)
    return rev.unfold(-1, hi - lo, 1)[:, base : base + e - s][None]


SQUARE_ELEMENTS = 1 << 24  # the table route's (H, C, C) square mask, built once per call, stays under this
LONG_KEYS = 8192  # from this many keys the table route takes 1,024-row blocks


def square_rows(H: int, Tk: int) -> int:
    """Query rows per block on the table route over Tk keys: 1024 from ``LONG_KEYS`` keys on (the CPU flash op tiles
    768 queries or more by 256 rows, fewer by 64: a long rectangle's keys are read fewer times), else 256 (the
    block's (H, C, C) square mask is built in the forward and again in the backward: at 1,024 rows it cost T5 a
    quarter of stock attention's time at 2,048 tokens; docs/results.md, "Round 8"); fewer so that the square stays
    under ``SQUARE_ELEMENTS``."""
    start = 1024 if Tk >= LONG_KEYS else 256
    return next((r for r in (1024, 512, 256, 128) if r <= start and H * r * r <= SQUARE_ELEMENTS), MIN_ROWS)


SPLIT_ROWS = 768  # from this many rows a block's keys past a table's zero reach run without a mask (``Table.pieces``)


class Table:
    """The masks of the table route for queries at slots [q_start, q_start + Tq) over keys [0, Tk), from the (H, Tk)
    table of a bias by distance: per block of ``rows`` queries, the keys before the block as a strided view with its
    rows reversed (``rectangle``) and the block's own causal square, one (1, H, C, C) tensor for every block.
    ``zero_from``: the table is 0 from this distance on (T5's and Shaw's band over its far value); blocks of
    ``SPLIT_ROWS`` rows or more then read the keys that far from every query of the block with no mask at all."""

    def __init__(self, table: torch.Tensor, q_start: int, rows: int, window: int | None = None, zero_from=None):
        self.Tk, self.q_start, self.rows, self.window = table.shape[-1], q_start, rows, window
        self.zero_from = zero_from if rows >= SPLIT_ROWS else None
        self.rev = _reversed(table, rows)
        n = min(rows, self.Tk)
        self.square = _view(self.rev, self.Tk, (self.Tk - n, self.Tk, self.Tk - n, self.Tk)).flip(-2).contiguous()

    def blocks(self, Tq: int):
        """(s, e, lo): query rows [s, e) and the first key any of them sees (a window's)."""
        for s in range(0, Tq, self.rows):
            e = min(Tq, s + self.rows)
            yield s, e, max(0, self.q_start + s - self.window + 1) if self.window else 0

    def rectangle(self, s: int, e: int, lo: int) -> torch.Tensor:
        """(1, H, C, qs - lo) the keys [lo, qs) before the block (qs = q_start + s), rows reversed (a view)."""
        qs = self.q_start + s
        return _view(self.rev, self.Tk, (qs, qs + e - s, lo, qs))

    def pieces(self, s: int, e: int, lo: int):
        """The flash calls of block [s, e): (keys [k0, k1), mask (1, H, C, k1 - k0) or None, causal, rows reversed):
        its causal square first (no earlier block reaches its keys), then the keys before it that every query of
        the block sees at ``zero_from`` or further (no mask), then the rest of the keys before it (the rectangle's
        view, rows reversed). Long blocks read faster split so, short ones slower (the extra call and merge outweigh
        the mask they save; docs/results.md, "Round 12")."""
        qs, C = self.q_start + s, e - s
        yield qs, qs + C, self.square[..., :C, :C], True, False
        cut = lo if self.zero_from is None else min(qs, max(lo, qs - self.zero_from + 1))
        if cut > lo:
            yield lo, cut, None, False, False
        if qs > cut:
            yield cut, qs, self.rectangle(s, e, cut), False, True


def table_forward(q, k, v, scaling, masks: Table):
    """(out fp32, lse fp32) of q (B, H, Tq, D) over k, v with the table's bias: per block, its pieces (``Table.pieces``)
    through the CPU flash op, merged by log-sum-exp."""
    B, H, Tq, D = q.shape
    out = torch.empty(B, H, Tq, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.empty(B, H, Tq, dtype=torch.float32, device=q.device)
    for s, e, lo in masks.blocks(Tq):
        for i, (k0, k1, mask, causal, flip) in enumerate(masks.pieces(s, e, lo)):
            qc = q[:, :, s:e].flip(-2) if flip else q[:, :, s:e]
            mask = None if mask is None else mask.expand(B, -1, -1, -1)
            o, m = cpu_flash.forward(qc, k[:, :, k0:k1], v[:, :, k0:k1], scaling, mask, causal)
            o, m = (o.flip(-2), m.flip(-1)) if flip else (o, m)
            if i == 0:
                out[:, :, s:e], lse[:, :, s:e] = o, m
            else:
                cpu_flash.merge_into(out[:, :, s:e], lse[:, :, s:e], o, m)
    return out, lse


def table_backward(dout, qkv: tuple, out, lse, scaling, masks: Table):
    """(dq, dk, dv) fp32 of ``table_forward``'s attention, given its output and log-sum-exp: the flash op's own
    backward for each piece. A block's square comes first and no earlier block reaches its keys, so its gradients
    are written, the other pieces' added (only the keys before the first query start at zero)."""
    q, k, v = qkv
    B, Tq = q.shape[0], q.shape[-2]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dk[:, :, : masks.q_start].zero_()
    dv[:, :, : masks.q_start].zero_()
    for s, e, lo in masks.blocks(Tq):
        rows = [x[:, :, s:e].contiguous() for x in (dout, q, out, lse)]  # dout, q, out (B, H, C, D), lse (B, H, C)
        for i, (k0, k1, mask, causal, flip) in enumerate(masks.pieces(s, e, lo)):
            d, qc, o, m = [x.flip(-1 if x.dim() == 3 else -2) for x in rows] if flip else rows
            mask = None if mask is None else mask.expand(B, -1, -1, -1)
            g = cpu_flash.backward(d, (qc, k[:, :, k0:k1], v[:, :, k0:k1]), (o, m), scaling, mask, causal)
            if i == 0:  # the square
                dq[:, :, s:e], dk[:, :, k0:k1], dv[:, :, k0:k1] = g
                continue
            dq[:, :, s:e] += g[0].flip(-2) if flip else g[0]
            dk[:, :, k0:k1] += g[1]
            dv[:, :, k0:k1] += g[2]
    return dq, dk, dv


class _Distance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, q, k, v, *params):
        H, Tk, scaling = q.shape[1], k.shape[-2], spec[5]
        masks = Table(distance_table(spec, H, Tk, q.device), spec[3], square_rows(H, Tk), spec[2])
        out, lse = table_forward(*(x.float() for x in (q, k, v)), scaling, masks)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, *params)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *params = ctx.saved_tensors
        spec = ctx.spec
        B, H, Tq, _ = q.shape
        Tk = k.shape[-2]
        wanted = [i for i, p in enumerate(params) if ctx.needs_input_grad[4 + i]]
        with torch.enable_grad():
            table = distance_table(spec, H, Tk, q.device)
        qf, kf, vf, of, df = (x.float() for x in (q, k, v, out, dout.contiguous()))
        dparams = [None] * len(params)
        if not (wanted and table.requires_grad):  # q, k, v only: the flash op's own backward
            masks = Table(table.detach(), spec[3], square_rows(H, Tk), spec[2])
            dq, dk, dv = table_backward(df, (qf, kf, vf), of, lse, spec[5], masks)
            return None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), *dparams
        rev = _reversed(table.detach(), spec[6])
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        dtable = torch.zeros(H, Tk, dtype=torch.float32, device=q.device)
        for s, e, lo, hi in _blocks(spec, Tq):  # P and dS once per block, for q, k, v and the table alike
            mask = _view(rev, Tk, (spec[3] + s, spec[3] + e, lo, hi))
            qc, dc, oc = (x[:, :, s:e].flip(-2) for x in (qf, df, of))
            kc, vc, lc = kf[:, :, lo:hi], vf[:, :, lo:hi], lse[:, :, s:e].flip(-1)
            ds = _block_grads((qc, kc, vc, oc, dc, lc), mask, spec[5], (dq, dk, dv), (s, e, lo, hi))
            dtable[:, : hi - lo] += ds.sum(0)[:, : hi - lo].flip(-1)  # by distance 0 .. Tc - 1
        got = torch.autograd.grad(table, [params[i] for i in wanted], dtable, allow_unused=True)
        for i, grad in zip(wanted, got):
            dparams[i] = grad
        return None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), *dparams


def _block_grads(block: tuple, mask, scaling, grads: tuple, span) -> torch.Tensor:
    """One block's dq, dk, dv added to ``grads`` (rows of ``block`` in reverse order, as ``mask``'s) and its dS summed
    along the anti-diagonals, (B, H, Tc + C - 1): entry t holds the keys at distance Tc - 1 - t."""
    qc, kc, vc, oc, dc, lc = block
    dq, dk, dv = grads
    s, e, lo, hi = span
    B, H, C, Tc = qc.shape[0], qc.shape[1], e - s, hi - lo
    p = _probabilities(qc, kc, lc, mask, scaling)  # (B, H, C, Tc)
    dv[:, :, lo:hi] += p.transpose(-1, -2) @ dc
    padded = p.new_empty(B, H, C, Tc + 2 * (C - 1))  # dS with C - 1 zero columns either side
    padded[..., : C - 1].zero_()
    padded[..., C - 1 + Tc :].zero_()
    ds = padded[..., C - 1 : C - 1 + Tc]
    torch.mul(p, (dc @ vc.transpose(-1, -2)).sub_((dc * oc).sum(-1, keepdim=True)), out=ds)  # P (dP - delta)
    dq[:, :, s:e] += (ds @ kc).mul_(scaling).flip(-2)
    dk[:, :, lo:hi] += (ds.transpose(-1, -2) @ qc).mul_(scaling)
    L = padded.shape[-1]  # element (r', t) of the view below: row r', column C - 1 + t - r' (r' + c = t)
    anti = padded.as_strided((B, H, C, Tc + C - 1), (H * C * L, C * L, L - 1, 1), padded.storage_offset() + C - 1)
    return anti.sum(-2)


def _probabilities(qc, kc, lse, mask, scaling):
    """P = exp(q k^T scaling + mask - lse) of one block: (B, H, C, Tc)."""
    return cpu_flash.exp_((qc @ kc.transpose(-1, -2)).mul_(scaling).add_(mask).sub_(lse[..., None]))
