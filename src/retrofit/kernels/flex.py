"""``flex``: compiled ``flex_attention`` with the bias as a ``score_mod`` and causality, window and padding
as a block mask. The bias kernel on CUDA; on CPU it has no backward and (torch 2.13) miscompiles padded/windowed
block masks, and the CPU flash kernels are faster, so there auto takes it only for unpadded, unwindowed
inference when the CPU flash op is missing, after a compile per process and scheme (measured:
docs/ARCHITECTURE.md, "The attention kernels"; ``dynamic=True``
and contiguous inputs: compiled once for one 128-token block and once for more, not per length or memory
layout). If compiling or running fails, the failure is logged, auto reports the call as
``"chunked (flex failed)"`` and flex is not tried again in this process.
"""

from __future__ import annotations

import logging

import torch

from .call import Call, Unavailable

log = logging.getLogger(__name__)

_fn = None  # the compiled flex_attention
_block_mask_fn = None  # the compiled create_block_mask
_error: str | None = None
_failed = False  # flex compiled or ran and failed in this process: auto no longer tries it


def serves(c: Call) -> str | None:
    if c.bias is None:
        return "no score bias (a score_mod adds one; a query-dependent relative term cannot be one)"
    if c.q.is_cuda:
        return None
    # CPU: no backward, no padded/windowed block masks, no per-row tensor in a score_mod (inductor's CPU
    # template fails to compile the load, torch 2.13), no float64 (refused on CPU)
    if c.grad:
        return "flex attention on CPU has no backward"
    if c.masked:
        return "flex attention on CPU cannot take padding or windows (torch 2.13 miscompiles the block masks)"
    if c.row_scale is not None:
        return "flex attention on CPU cannot take a per-row bias scale"
    if c.q.dtype == torch.float64:
        return "flex attention on CPU refuses float64"
    return None


def worth(c: Call) -> bool:
    """Auto takes flex for long calls without dropout (short/decoding queries are cheaper chunked)."""
    return c.Tq >= 128 and c.dropout == 0


def run(c: Call) -> torch.Tensor:
    fns = compiled()
    try:
        return attend_flex(fns, c)
    except Exception as e:  # a compiler failure: say so, stop using flex in this process
        disable(e)
        raise Unavailable("flex failed", f"flex_attention failed: {e}") from e


def compiled():
    """(flex_attention, create_block_mask), compiled per process with symbolic lengths (``dynamic=True``: not
    per length); ``Unavailable`` when they cannot be (or failed before)."""
    global _fn, _block_mask_fn, _error
    if _fn is None and _error is None:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            _fn = torch.compile(flex_attention, dynamic=True)
            _block_mask_fn = torch.compile(create_block_mask, dynamic=True)
        except Exception as e:  # no compiler, old torch, ...
            _error = f"{type(e).__name__}: {e}"
            log.warning("flex_attention unavailable (%s); bias schemes use the chunked SDPA kernel", _error)
    if _fn is None:
        raise Unavailable("flex failed" if _failed else "flex unavailable", f"flex attention is unavailable: {_error}")
    return _fn, _block_mask_fn


def disable(error: Exception) -> None:
    global _fn, _block_mask_fn, _error, _failed
    _failed = True
    _error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    _fn = _block_mask_fn = None
    log.warning("flex_attention failed (%s); this process uses the chunked SDPA kernel from now on", _error)


def attend_flex(fns, c: Call):
    """The call's causal attention (q (B, H, Tq, D), k/v (B, H, Tk, D) -> (B, H, Tq, D)) with its bias, per-row
    scale, window and key padding, through ``fns`` (``compiled()``)."""
    flex_attention, create_block_mask = fns
    bias, key_padding, window, q_start, row_scale = c.bias, c.key_padding, c.window, c.q_start, c.row_scale
    # one memory layout whatever made q, k, v (a fused projection's views, a cache's concatenation): the
    # compiled function guards on strides, and a new layout would compile it again (seconds on CPU)
    q, k, v = (t.contiguous() for t in (c.q, c.k, c.v))  # (B, H, T, D)
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

    block_mask = create_block_mask(mask_mod, B if key_padding is not None else None, None, Tq, Tk, device=q.device)
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=c.scaling)
