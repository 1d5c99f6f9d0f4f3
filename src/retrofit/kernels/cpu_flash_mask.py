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
    return attend_dense(c, max_rows=chunk_rows(c.q.shape[0] * c.q.shape[1], c.Tq, c.Tk))


@dataclass(frozen=True)
class Span:
    """One block of ``block_bias``: the queries at slots q0 .. q0 + C - 1 over the keys at k0 .. k0 + Tc - 1."""

    q0: int
    C: int
    k0: int
    Tc: int


@dataclass(frozen=True)
class Seen:
    """Which keys a query sees: those up to its own slot (``causal``; else every key), fewer than ``window`` back
    (``causal`` False: |i - j| < window), and the real ones of ``key_padding`` (B, Tk) bool (True = real token)."""

    key_padding: torch.Tensor | None = None
    window: int | None = None
    causal: bool = True


def block_bias(
    bias: BiasFn | None, H: int, span: Span, device, dtype=torch.float32, seen: Seen = Seen(), row_scale=None
) -> torch.Tensor:
    """The float mask of the ``span``'s queries over its keys: (1 or B, H, C, Tc) in ``dtype``, the bias (times
    ``row_scale`` (B, C)) where the key is visible, -inf elsewhere (future keys, keys a window or more back,
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
    if row_scale is not None:
        mask = mask * row_scale[:, None, :, None].to(dtype)  # (B, H, C, Tc)
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
    span, seen = Span(q_start + s, e - s, lo, hi - lo), Seen(key_padding, window)
    return block_bias(bias, H, span, device, seen=seen, row_scale=scales)


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
                    dc, (qc, kc, vc), oc, lc.contiguous(), scaling, fixed.expand(B, -1, -1, -1), causal=False
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


def _probabilities(qc, kc, lse, mask, scaling):
    """P = exp(q k^T scaling + mask - lse) of one block: (B, H, C, Tc)."""
    return cpu_flash.exp_((qc @ kc.transpose(-1, -2)).mul_(scaling).add_(mask).sub_(lse[..., None]))
