"""``sdpa-alibi-dims``: ALiBi through the stock fused SDPA kernel: the bias rides as extra dimensions of q and k.

Under a causal softmax, ALiBi's term ``-m_h * (i - j)`` equals ``m_h * (j - c)`` up to the per-row
constant ``m_h * (c - i)``, which the softmax ignores. ``m_h * (j - c)`` is a dot product: append
``P`` dimensions to q holding ``2^p`` and to k holding ``m_h * (j - c) / (scaling * 2^p)`` split into
``P`` parts of q's dtype (high, middle, low: together they carry ~24 bits even in bf16), and the
fused kernel (CPU flash, CUDA flash / memory-efficient) computes ``scaling * q'.k' = scaling * q.k +
m_h * (j - c)``, forward and backward, with O(N) memory and no bias tensor.

Precision: the kernel accumulates the score in fp32 (or the input dtype if wider), so a score of
size ``m * |j - c|`` loses ``2^-24 * m * |j - c|``. Only keys near a query matter (far ones are
decayed to nothing by the bias), so the error is set by the distance between a query and its
block's centre ``c``: queries go in blocks of at most ``MAX_SPAN / m`` rows, each block with its
own centre (one block with ``is_causal`` when the whole sequence fits; a later block on CPU as the keys
before it plus its own causal square, merged by log-sum-exp (``cpu_flash.rectangle_then_square``); else a
boolean (C, Tk) mask per block, which SDPA keeps for backward). Heads are grouped by the blocks they need (``head_groups``): at 8k tokens only the
steepest one or two heads of a 12-head model are blocked, the others run as one causal square.
``MAX_SPAN`` = 2048 bounds the error once a block is that wide (from ~2k tokens on): in fp32 the output
stays within 2e-4 of an fp64 reference at any length (tested at 8k; measured per length, and for the
chunked kernel, by ``research/measure_fused_alibi.py`` into ``benchmarks/fused_alibi_precision.json``). bf16/fp16 stay at their own rounding.

Steep heads read only as far as they can see (``reach``): a key whose bias puts it more than ``MARGIN`` below
the row's own diagonal score, whatever q and k hold (bounded by their norms), carries less than e^-MARGIN of the
row's probability, far under fp32's resolution; so a blocked head attends through a window of that reach
when it is shorter than the call, in blocks of about that many queries (at 8k this brought ALiBi's call to
stock's time; measured: docs/results.md, "Attention kernel").

On CUDA with FlashAttention 2 installed, auto takes ``flash-attn-alibi`` for half-precision inputs instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import cpu_flash
from .call import Call, chunk_rows
from .cpu_flash_mask import Seen, Span, block_bias

MAX_SPAN = 2048.0  # rows per query block x steepest slope (fp32 accumulation error ~ 2^-24 * span / 2)
MIN_ROWS = 64  # never smaller blocks (a slope above MAX_SPAN / 64 = 32 is not ALiBi)
MARGIN = 40.0  # a key past a head's reach holds < e^-40 (4e-18) of its row's probability: below fp32's 2^-24


def serves(c: Call) -> str | None:
    if c.slopes is None:  # (also dropped for a row scale in half precision: the q side would round tau)
        return "no ALiBi slopes (a bias linear in the distance)"
    return None


def run(c: Call) -> torch.Tensor:
    # CPU SDPA with dropout materialises the scores: cap the block's rows like the chunked kernel
    cap = chunk_rows(c.q.shape[1], c.Tq, c.Tk) if c.dropout > 0 and not c.q.is_cuda else None
    return attend_alibi(c, max_rows=cap)


@dataclass(frozen=True)
class Spec:
    """What every query block of one head group shares (``_block``'s arguments besides its own rows)."""

    slopes: torch.Tensor  # (H,) the group's ALiBi slopes
    scaling: float
    key_padding: torch.Tensor | None  # (B, Tk) bool, True = real token
    window: int | None  # as in ``Call``
    dropout: float
    width: int  # the fused head width of q and k with the bias dims, and of the padded v
    keys_back: int | None = None  # a ``reach``: each block reads the keys from that many before its first query on


def parts_for(dtype: torch.dtype) -> int:
    """Extra dimensions carrying the bias: enough mantissa for ~24 bits (fp64: one is plenty)."""
    return {torch.float64: 1, torch.float32: 2}.get(dtype, 3)


def block_rows(slopes: torch.Tensor, Tq: int) -> int:
    """Query rows per block: as many as keep ``m_max * rows <= MAX_SPAN``, balanced over the blocks."""
    m = float(slopes.detach().abs().max()) if slopes.numel() else 0.0
    cap = Tq if m == 0 else max(MIN_ROWS, int(MAX_SPAN / m))
    blocks = max(1, math.ceil(Tq / cap))
    return math.ceil(Tq / blocks)


def _bias_dims(slopes, positions, centre, scaling, dtype, parts):
    """(H, T, parts) of ``dtype``: m_h * (j - centre) / (scaling * 2^p) split high-to-low; and 2^p."""
    w = wide(positions.device)
    p2 = 2.0 ** round(math.log2(1.0 / scaling))  # a power of two: exact in every dtype
    rest = slopes.to(w)[:, None] * (positions.to(w) - centre)[None, :] / (scaling * p2)  # (H, T)
    pieces = []
    for _ in range(parts):
        piece = rest.to(dtype)
        pieces.append(piece)
        rest = rest - piece.to(w)
    return torch.stack(pieces, dim=-1), p2


def reach(q: torch.Tensor, k: torch.Tensor, slopes: torch.Tensor, scaling: float) -> int:
    """The distance past which no key can carry more than e^-MARGIN of a row's probability, for heads ``slopes``
    (the gentlest, m > 0): the score of a key d back is at most ``scaling |q_i| |k_j| - m d``, the row's diagonal
    score at least ``-scaling |q_i| |k_i|``, so keys beyond d hold at most exp(2 scaling |q| |k| - m d) / (1 - e^-m).
    A slope that is not positive (learned ones may turn) gives no reach: every key is read."""
    with torch.no_grad():
        qn = float(q.detach().float().norm(dim=-1).amax())
        kn = float(k.detach().float().norm(dim=-1).amax())
        m = float(slopes.detach().min())  # signed: a negative slope favours far keys
    if not m > 0 or not math.isfinite(qn * kn):
        return 2**62
    return math.ceil((2 * scaling * qn * kn + MARGIN - math.log1p(-math.exp(-m))) / m)


def head_groups(slopes: torch.Tensor, Tq: int) -> list[list[int]]:
    """Heads grouped by the number of query blocks they need, as lists of head indices.

    Only steep heads need several blocks (``m_h * Tq > MAX_SPAN``); the gentle ones, most heads of an
    ALiBi model at any length, run as one causal square: the fastest call."""
    groups: dict[int, list[int]] = {}
    for h in range(slopes.numel()):
        groups.setdefault(math.ceil(Tq / block_rows(slopes[h : h + 1], Tq)), []).append(h)
    return [groups[n] for n in sorted(groups)]


def _heads(x: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """x[:, idx] as a view when the heads are consecutive, else a copy."""
    if idx == list(range(idx[0], idx[-1] + 1)):
        return x[:, idx[0] : idx[-1] + 1]
    return x[:, idx]


def attend_alibi(c: Call, max_rows: int | None = None) -> torch.Tensor:
    """Causal attention with bias ``-c.slopes[h] * (i - j)``: ``c.q`` (B, H, Tq, D), ``c.k``/``c.v`` (B, H, Tk, D),
    query r at position q_start + r; key padding, window, dropout and a per-row scale as in ``Call``.

    ``max_rows`` caps the rows per block where the kernel falls back to materialising the scores
    (CPU SDPA with dropout runs the math path): then each block's scores are at most (H, max_rows, Tk)
    and, under grad, each block is checkpointed so backward never holds them all (linear memory).

    ``c.row_scale`` (B, Tq) fp32 multiplies query r's bias (a temperature): the q side of the extra dims
    carries ``2^p * tau_r`` instead of ``2^p``, so inputs of at least fp32 only (``Call``).

    Heads are grouped by the blocks they need (``head_groups``); a blocked group reads only its ``reach``."""
    groups = head_groups(c.slopes, c.Tq)
    if len(groups) == 1:
        return _attend_group((c.q, c.k, c.v), c.slopes, c, max_rows)
    outs = []  # steep heads in blocks (or through their reach), the rest as one causal square
    for n, g in enumerate(groups):
        qg, kg, vg = _heads(c.q, g), _heads(c.k, g), _heads(c.v, g)
        far = None
        if n and c.row_scale is None and not c.dropout:  # a blocked group: keys past its reach hold nothing
            far = reach(qg, kg, c.slopes[g], c.scaling)
            far = None if far >= c.q_start + c.Tq else far
        outs.append(_attend_group((qg, kg, vg), c.slopes[g], c, max_rows, keys_back=far))
    order = torch.tensor([h for g in groups for h in g]).argsort().to(c.q.device)
    return torch.cat(outs, dim=1)[:, order]  # (B, H, Tq, D) in the heads' own order


def _attend_group(qkv, slopes, c: Call, max_rows: int | None, keys_back: int | None = None) -> torch.Tensor:
    """The call's attention for the heads of ``qkv`` (q (B, h, Tq, D), k/v (B, h, Tk, D)) and their ``slopes``
    (h,), in blocks of queries. ``keys_back`` (a ``reach``): each block of queries reads the keys from that many
    before its first query on (a superset of what every row can see; no mask), in blocks of about that many rows."""
    q, k, v = qkv
    B, H, Tq, D = q.shape
    width = fused_width(D + parts_for(q.dtype), q)
    spec = Spec(slopes, c.scaling, c.key_padding, c.window, c.dropout, width, keys_back)
    v_wide = pad_to(v, width)  # (B, H, Tk, W): one padded copy, blocks take views of it
    rows = block_rows(slopes, Tq)
    if keys_back:
        rows = min(rows, max(MIN_ROWS, keys_back))  # a block reads its rows plus keys_back keys: O(N keys_back)
    if max_rows is not None and max_rows < rows:
        rows = max_rows
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    use_ckpt = max_rows is not None and rows < Tq and grad
    outs = []
    for s in range(0, Tq, rows):
        e = min(Tq, s + rows)
        scale = None if c.row_scale is None else c.row_scale[:, s:e]
        args = (q[:, :, s:e], k, v_wide, c.q_start + s, scale, spec)
        outs.append(checkpoint(_block, *args, use_reentrant=False) if use_ckpt else _block(*args))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _block(qb, k, v_wide, i0, row_scale, spec: Spec):
    """One block of queries at absolute positions [i0, i0 + C) over the keys they can see (from ``keys_back``
    keys before the block on, when given); ``row_scale`` (B, C) or None."""
    B, H, C, D = qb.shape
    parts = parts_for(qb.dtype)
    key_padding, window, dropout, keys_back = spec.key_padding, spec.window, spec.dropout, spec.keys_back
    i1 = i0 + C
    lo = max(0, i0 - window + 1 if window else 0, i0 - keys_back if keys_back else 0)
    hi = i1  # causal: keys up to the block's last query
    centre = (i0 + i1 - 1) // 2
    pos = torch.arange(lo, hi, device=qb.device)
    dims, p2 = _bias_dims(spec.slopes, pos, centre, spec.scaling, qb.dtype, parts)  # (H, Tc, P)
    if row_scale is None:
        q_side = qb.new_full((B, H, C, parts), p2)
    else:  # tau_r * m_h * (j - c): the row's constant tau_r * m_h * (c - i) still cancels in the softmax
        q_side = (row_scale.to(qb.dtype) * p2)[:, None, :, None].expand(B, H, C, parts)
    qx = torch.cat([qb, q_side], dim=-1)  # (B, H, C, D+P)
    kx = torch.cat([k[:, :, lo:hi], dims.unsqueeze(0).expand(B, H, hi - lo, parts)], dim=-1)  # (B, H, Tc, D+P)
    qx, kx = pad_to(qx, spec.width), pad_to(kx, spec.width)
    if i0 > lo and C > 1 and key_padding is None and not window and not dropout and cpu_flash.available(qx):
        # keys before the block, then its own causal square: no (C, Tc) mask is built or kept
        r = i0 - lo  # keys before the block, in kx
        out = cpu_flash.rectangle_then_square(
            qx, kx[:, :, :r], v_wide[:, :, lo:i0], kx[:, :, r:], v_wide[:, :, i0:hi], spec.scaling
        )
        return out[..., :D]
    mask = block_mask(Span(i0, i1 - i0, lo, hi - lo), Seen(key_padding, window), qb.device)
    square = mask is None and i0 == 0  # the whole causal square: the fastest call
    out = F.scaled_dot_product_attention(
        qx, kx, v_wide[:, :, lo:hi], attn_mask=mask, dropout_p=dropout, is_causal=square and C > 1, scale=spec.scaling
    )
    return out[..., :D]


# ---- what the extra-dimension kernels share (sdpa-relative-dims imports these): the positional term rides as
# extra q/k dimensions through stock SDPA, so q, k and v are padded to one width, blocks of queries take a boolean
# mask, and a decoding step is passed on
DECODE_ROWS = 16  # at most this many queries over a longer cache, no gradient: a decoding step


def worth(c: Call) -> bool:
    """Auto passes a decoding step on: the dims would be appended to every cached key at every step (a copy of
    the cache per layer), where the next kernel adds the step's term directly (ALiBi decodes slower than stock on
    its dims kernel, faster on cpu-flash-mask; measured: docs/results.md, "Decoding with the KV cache")."""
    return not (c.Tq <= DECODE_ROWS < c.Tk and not c.grad)


def wide(device: torch.device) -> torch.dtype:
    """The dtype positions and angles are taken in: float64 where the device has it."""
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def fused_width(width: int, x: torch.Tensor) -> int:
    """The head width the fused kernels take: CUDA's in multiples of 8 (zero padding), any on CPU."""
    return -(-width // 8) * 8 if x.is_cuda else width


def pad_to(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x (..., d) zero-padded to (..., dim)."""
    return F.pad(x, (0, dim - x.shape[-1])) if x.shape[-1] < dim else x


def block_mask(span: Span, seen: Seen, device):
    """Bool mask (B|1, 1, C, Tc) for the ``span``'s queries over its keys as ``seen`` says
    (``cpu_flash_mask.block_bias``'s), or None when the block is the plain causal square (or a single query that
    sees every key)."""
    if seen.key_padding is None and not seen.window and span.k0 == 0 and span.C in (span.k0 + span.Tc, 1):
        return None
    return block_bias(None, 1, span, device, seen=seen)
