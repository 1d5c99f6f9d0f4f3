"""Linear-memory attention with a positional score bias.

The paths, chosen per call by device, dtype and grad, and always recorded (``last_path``):

- ``"fused-alibi"``: a bias linear in the distance (ALiBi, either convention) rides as extra q/k
  dimensions through the stock fused SDPA kernel, forward and backward (``fused.attend_alibi``);
  padding, windows and the cache included. ``"fused-band"``: a distance bias flat past a reach K
  (T5, Shaw) as the stock fused causal kernel over the keys at least K back plus an explicit band of
  the last K keys, merged by log-sum-exp, forward and backward (``band.attend_band``; CPU, full causal
  self-attention without padding, window or dropout). ``"fused-dense"``: any other bias (FIRE; T5/Shaw/ALiBi
  with a block's own positions, a temperature, padding or a cache) as the CPU flash kernel's float mask,
  one block of queries at a time, with its own backward (``dense.attend_dense``; CPU, no dropout).
  ``"flash-attn-alibi"``: the same bias through
  FlashAttention 2's ``alibi_slopes`` on CUDA in fp16/bf16 without padding, when it is installed.

- ``"flex"``: compiled ``flex_attention`` with the bias as a ``score_mod`` and causality, window
  and padding as a block mask. The bias path on CUDA; on CPU it has no backward and (torch 2.13)
  miscompiles padded/windowed block masks, and the dense path is faster, so there it runs only when
  asked for or when the CPU flash op is missing, for unpadded, unwindowed inference, after a ~15 s
  compile per process (``dynamic=True``: no recompile per length). If compiling fails,
  the failure is logged, the path is reported as ``"chunked (flex failed)"`` and flex is not tried again.
- ``"chunked"``: query-chunked SDPA; each chunk builds its own (H, C, Tk) bias, so memory is
  O(H * C * N), linear in N. Exact in any dtype (half inputs are scored in fp32 when there is a
  bias). Under grad each chunk is checkpointed, so backward never holds every chunk's bias.
- ``"sdpa-causal"`` / ``"sdpa"``: no bias, no padding, no window: stock SDPA (the stock speed).

``RETROFIT_ATTENTION_PATH=auto|fused|flex|chunked`` decides for models left at ``convert(..., kernel="auto")``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import band as band_path
from . import dense, flash, fused

log = logging.getLogger(__name__)

BiasFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (h, q_pos, k_pos) -> bias


@dataclass
class Relative:
    """A query-dependent positional term (Transformer-XL, NEZHA): the logit of query i and key j gains
    ``query[i] . keys[d]`` (times ``scaling``), d = pos[i] - pos[j]. Built per query chunk from the chunk's
    distances only: (B, H, C, C + Tc) logits, never H x N x N, so memory stays linear in N."""

    query: torch.Tensor  # (B, H, Tq, D) the position-side query (Transformer-XL: q + v), scaled like q
    keys: torch.Tensor  # (H or 1, n, D) one vector per distance 0 .. n - 1
    positions: torch.Tensor | None = None  # (Tk,) the key slots' positions (a block's own); None: slot indices
KERNELS = ("auto", "fused", "flex", "chunked")
CHUNK_ELEMENTS = 1 << 25  # max elements of one chunk's (H, C, Tk) score tensor (128 MiB in fp32)

_flex_fn = None
_flex_error: str | None = None
_flex_failed = False  # flex compiled or ran and failed in this process: auto no longer tries it


def choose_path(requested: str, q: torch.Tensor, has_bias: bool, dropout: float, masked: bool = False,
                linear: bool = False, padded: bool = False, relative: bool = False, scaled: bool = False,
                banded: bool = False, full: bool = False) -> str:
    """Which path runs. ``requested`` is the model's kernel option (the env var decides for "auto").
    ``masked``: padding or a sliding window is present (CPU flex miscompiles those block masks
    in torch 2.13's inductor, so on CPU they take the chunked path). ``linear``: the bias is
    ``-m_h * (i - j)`` (ALiBi), which the fused paths serve; ``padded``: padding is present.
    ``relative``: a query-dependent term (``Relative``), which only the chunked path serves; ``scaled``: each
    query row's bias is scaled by a tensor (a temperature), which neither FlashAttention's ``alibi_slopes``
    nor CPU flex can take. ``banded``: the bias is a distance table flat past a reach (T5, Shaw), which the fused
    band path serves on CPU when the call is ``full`` causal self-attention (no cache offset) without padding,
    window, per-row scale or dropout. Any other bias takes the dense path on CPU (without dropout).
    ``kernel="fused"`` takes those wherever they run and chunked elsewhere (CUDA, dropout)."""
    if requested == "auto":
        requested = os.environ.get("RETROFIT_ATTENTION_PATH", "auto")
    if requested not in KERNELS:
        raise ValueError(f"attention path must be one of {KERNELS}; got {requested!r}")
    if relative:  # a score_mod cannot reduce over the head dim, and no fused kernel takes such a term
        if requested in ("fused", "flex"):
            raise RuntimeError(f"the {requested} attention path cannot serve a query-dependent relative term "
                               "(Transformer-XL, NEZHA); use kernel='auto' or 'chunked'")
        return "chunked"
    dense_ok = has_bias and flash.available(q) and dropout == 0  # CPU: any bias as the flash op's float mask
    band_ok = banded and full and dense_ok and not (masked or scaled)
    if requested == "fused" and not linear:
        if not has_bias:
            raise RuntimeError("the fused attention paths serve a positional bias (alibi, t5, shaw, fire); "
                               "use kernel='auto' or 'chunked'")
        # the band for whole-sequence calls; any other bias on CPU as a dense mask; CUDA or dropout: chunked
        return "fused-band" if band_ok else "fused-dense" if dense_ok else "chunked"
    if linear and requested in ("auto", "fused"):
        half = q.dtype in (torch.float16, torch.bfloat16)
        if requested == "auto" and q.is_cuda and half and not padded and not scaled and fused.flash_attn_available():
            return "flash-attn-alibi"
        return "fused-alibi"
    if not has_bias or requested == "chunked" or dropout > 0:
        return "chunked"
    if requested == "auto" and dense_ok:  # CPU: faster than flex for inference, and they have a backward
        return "fused-band" if band_ok else "fused-dense"
    grad = torch.is_grad_enabled() and q.requires_grad
    # CPU flex: no backward, no padded/windowed block masks, no per-row tensor in a score_mod (inductor's
    # CPU template fails to compile the load, torch 2.13), no float64 (refused on CPU)
    flex_ok = q.is_cuda or not (grad or masked or scaled or q.dtype == torch.float64)
    if requested == "flex":
        if not flex_ok:
            raise RuntimeError("flex attention on CPU has no backward and cannot take padding, windows, a "
                               "per-row bias scale or float64; use kernel='chunked' or 'auto'")
        if not _flex_available():
            raise RuntimeError(f"flex attention was requested but is unavailable: {_flex_error}")
        return "flex"
    # auto: flex wherever it runs (CUDA: forward and backward; CPU: inference on unpadded, unwindowed
    # inputs, where it is the fastest bias path); short/decoding queries are cheaper on the chunked path.
    if flex_ok and q.shape[-2] >= 128:
        if _flex_available():
            return "flex"
        return "chunked (flex failed)" if _flex_failed else "chunked (flex unavailable)"
    return "chunked"


def _flex_available() -> bool:
    global _flex_fn, _flex_error
    if _flex_fn is None and _flex_error is None:
        try:
            from torch.nn.attention.flex_attention import flex_attention

            _flex_fn = torch.compile(flex_attention, dynamic=True)
        except Exception as e:  # no compiler, old torch, ...
            _flex_error = f"{type(e).__name__}: {e}"
            log.warning("flex_attention unavailable (%s); bias schemes use the chunked SDPA path", _flex_error)
    return _flex_fn is not None


def _disable_flex(error: Exception) -> None:
    global _flex_fn, _flex_error, _flex_failed
    _flex_failed = True
    _flex_error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    _flex_fn = None
    log.warning("flex_attention failed (%s); this process uses the chunked SDPA path from now on", _flex_error)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scaling: float,
    bias: BiasFn | None = None,
    key_padding: torch.Tensor | None = None,
    window: int | None = None,
    q_start: int = 0,
    dropout: float = 0.0,
    kernel: str = "auto",
    slopes: torch.Tensor | None = None,
    band: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    relative: Relative | None = None,
    bias_params: tuple[torch.Tensor, ...] = (),
) -> tuple[torch.Tensor, str]:
    """Causal attention of q (B, H, Tq, D) over k, v (B, H or Hkv, Tk, D); query i sits at key position q_start + i.
    Grouped-query keys (Hkv < H) go to stock SDPA as they are (``enable_gqa``), else are repeated per head.

    key_padding: (B, Tk) bool, True = real token. window: keys with i - j >= window are masked.
    slopes: (H,) when ``bias(h, i, j) == -slopes[h] * (i - j)`` exactly (ALiBi): the fused paths may serve it.
    band: (H, K + 1) when ``bias(h, i, j) == band[h, min(i - j, K)]`` exactly (T5, Shaw): so may the band path.
    row_scale: (B or 1, Tq) multiplies query row i's bias (a temperature; q is already scaled by the caller).
    relative: a query-dependent term added to the logits (chunked path).
    bias_params: the tensors ``bias`` is computed from (the dense path returns their gradients through it).
    Returns (output (B, H, Tq, D), path name)."""
    if row_scale is not None and bias is not None:
        if q.dtype not in (torch.float32, torch.float64):
            slopes = None  # the fused q side would round tau in half precision: no fused path
        row_scale = row_scale.to(torch.float32).expand(q.shape[0], q.shape[-2])  # (B, Tq)
    else:
        row_scale = None
    if key_padding is not None and bool(key_padding.all()):
        key_padding = None
    if window and q_start + q.shape[-2] <= window:  # every key of this call is within the window
        window = None
    Tq, Tk = q.shape[-2], k.shape[-2]
    path = choose_path(kernel, q, bias is not None, dropout, masked=key_padding is not None or bool(window),
                       linear=slopes is not None, padded=key_padding is not None, relative=relative is not None,
                       scaled=row_scale is not None, banded=band is not None, full=q_start == 0 and Tq == Tk > 1)
    if path == "chunked" and bias is None and relative is None and key_padding is None and window is None and (Tq == Tk or Tq == 1):
        # stock SDPA: full causal self-attention, or one decoding query that sees every key
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=Tq == Tk and Tq > 1, scale=scaling,
                                             enable_gqa=k.shape[1] != q.shape[1])
        return out, "sdpa-causal" if Tq > 1 else "sdpa"
    if k.shape[1] != q.shape[1]:  # grouped-query attention: (B, Hkv, Tk, D) -> (B, H, Tk, D)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if path == "fused-band":
        return band_path.attend_band(q, k, v, scaling=scaling, band=band), path
    if path == "fused-dense":
        rows = _chunk_rows(q.shape[0] * q.shape[1], Tq, Tk)
        return dense.attend_dense(q, k, v, scaling=scaling, bias=bias, params=bias_params, key_padding=key_padding,
                                  window=window, q_start=q_start, row_scale=row_scale, max_rows=rows), path
    if path == "flash-attn-alibi" and torch.is_grad_enabled() and slopes.requires_grad:
        path = "fused-alibi"  # FlashAttention returns no gradient for alibi_slopes: learned slopes take the fused path
    if path == "fused-alibi":
        # CPU SDPA with dropout materialises the scores: cap the block's rows like the chunked path
        cap = _chunk_rows(q.shape[1], q.shape[-2], k.shape[-2]) if dropout > 0 and not q.is_cuda else None
        out = fused.attend_alibi(q, k, v, scaling=scaling, slopes=slopes, key_padding=key_padding, window=window,
                                 q_start=q_start, dropout=dropout, max_rows=cap, row_scale=row_scale)
        return out, path
    if path == "flash-attn-alibi":
        return fused.flash_attn_alibi(q, k, v, scaling=scaling, slopes=slopes, window=window, dropout=dropout), path
    if path == "flex":
        try:
            return _attend_flex(q, k, v, scaling, bias, key_padding, window, q_start, row_scale), "flex"
        except Exception as e:  # a compiler failure: say so, stop using flex in this process, use chunked
            if kernel == "flex":  # asked for explicitly: do not substitute
                raise
            _disable_flex(e)
            path = "chunked (flex failed)"
    return _attend_chunked(q, k, v, scaling, bias, key_padding, window, q_start, dropout, row_scale, relative), path


def _chunk_rows(H: int, Tq: int, Tk: int) -> int:
    return max(16, min(Tq, CHUNK_ELEMENTS // max(1, H * Tk)))


def _attend_chunked(q, k, v, scaling, bias, key_padding, window, q_start, dropout, row_scale=None, relative=None):
    B, H, Tq, D = q.shape
    rows = _chunk_rows(H, Tq, k.shape[-2])
    if relative is not None:  # per batch row, over the chunk's distances: C + Tc, or a block's own span
        span = k.shape[-2] if relative.positions is None else int(relative.keys.shape[1])
        rows = _chunk_rows(H * B, Tq, k.shape[-2] + span)
    use_ckpt = torch.is_grad_enabled() and rows < Tq and (q.requires_grad or k.requires_grad or v.requires_grad)
    outs = []
    for s in range(0, Tq, rows):
        e = min(Tq, s + rows)
        # keys this chunk can see: [lo, hi) (causal upper bound, window lower bound)
        hi = q_start + e
        lo = max(0, q_start + s - window + 1) if window else 0
        rows_scale = None if row_scale is None else row_scale[:, s:e]
        rel = () if relative is None else (relative.query[:, :, s:e], relative.keys, relative.positions)
        args = (q[:, :, s:e], k[:, :, lo:hi], v[:, :, lo:hi], q_start + s, lo, scaling, bias, key_padding, window, dropout,
                rows_scale, *rel)
        outs.append(checkpoint(_chunk, *args, use_reentrant=False) if use_ckpt else _chunk(*args))
    return torch.cat(outs, dim=2)


def _chunk(qc, kc, vc, q0, k0, scaling, bias, key_padding, window, dropout, row_scale=None, rel_q=None, rel_keys=None,
           positions=None):
    # qc (B, H, C, D), kc/vc (B, H, Tc, D); q0/k0: slot indices of the first query/key
    C, Tc = qc.shape[-2], kc.shape[-2]
    compute_dtype = qc.dtype
    if bias is not None:
        if qc.dtype in (torch.float16, torch.bfloat16):
            compute_dtype = torch.float32  # the bias is large at long range: score it in fp32
        mask = dense.block_bias(bias, qc.shape[1], q0, C, k0, Tc, qc.device, compute_dtype, key_padding, window,
                                row_scale)  # (1 or B, H, C, Tc)
    elif rel_q is not None:
        if qc.dtype in (torch.float16, torch.bfloat16):
            compute_dtype = torch.float32
        q_pos, k_pos = torch.arange(q0, q0 + C, device=qc.device), torch.arange(k0, k0 + Tc, device=qc.device)
        if positions is not None:  # a block's own positions (PoSE, randomized)
            q_pos, k_pos = positions[q0 : q0 + C], positions[k0 : k0 + Tc]
        mask = _relative_logits(rel_q, rel_keys, q_pos, k_pos, scaling, compute_dtype)  # (B, H, C, Tc)
        mask = mask.masked_fill(~dense.block_bias(None, 1, q0, C, k0, Tc, qc.device, key_padding=key_padding,
                                                  window=window), float("-inf"))
    else:
        mask = dense.block_bias(None, 1, q0, C, k0, Tc, qc.device, key_padding=key_padding, window=window)
    out = F.scaled_dot_product_attention(
        qc.to(compute_dtype), kc.to(compute_dtype), vc.to(compute_dtype), attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.to(qc.dtype)


def _relative_logits(rel_q, rel_keys, q_pos, k_pos, scaling, dtype):
    """``rel_q[i] . rel_keys[pos_i - pos_j] * scaling`` for one chunk: rel_q (B, H, C, D), rel_keys (H or 1, n, D),
    q_pos (C,), k_pos (Tc,) -> (B, H, C, Tc). One matmul against the chunk's distinct distances (at most
    C + Tc - 1 for consecutive positions), then a gather (the rel-shift of Transformer-XL, written as an index)."""
    dist = (q_pos[:, None] - k_pos[None, :]).clamp(min=0)  # (C, Tc); future keys are masked anyway
    lo, hi = int(dist.min()), int(dist.max())
    table = rel_keys[:, lo : hi + 1].to(dtype)  # (H or 1, n_d, D)
    per_distance = rel_q.to(dtype) @ table.transpose(-1, -2)  # (B, H, C, n_d)
    B, H, C, _ = per_distance.shape
    index = (dist - lo).expand(B, H, C, dist.shape[-1])  # a view: no (B, H, C, Tc) index tensor
    return per_distance.gather(-1, index) * scaling


def _attend_flex(q, k, v, scaling, bias, key_padding, window, q_start, row_scale=None):
    from torch.nn.attention.flex_attention import create_block_mask

    B, H, Tq, D = q.shape
    Tk = k.shape[-2]

    if row_scale is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias(h, q_idx + q_start, kv_idx).to(score.dtype)
    else:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + (bias(h, q_idx + q_start, kv_idx) * row_scale[b, q_idx]).to(score.dtype)

    def mask_mod(b, h, q_idx, kv_idx):
        qa = q_idx + q_start
        m = kv_idx <= qa
        if window:
            m = m & (qa - kv_idx < window)
        if key_padding is not None:
            m = m & (key_padding[b, kv_idx] | (kv_idx == qa))
        return m

    block_mask = create_block_mask(
        mask_mod, B if key_padding is not None else None, None, Tq, Tk, device=q.device, _compile=True
    )
    return _flex_fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scaling)
