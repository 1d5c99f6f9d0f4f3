"""What the extra-dimension paths (``sdpa-alibi-dims``, ``sdpa-relative-dims``) share: the positional term
rides as extra q/k dimensions through stock SDPA, so q, k and v are padded to one width, blocks of queries
take a boolean mask, and a decoding step is passed on."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .call import Call
from .cpu_flash_mask import Seen, Span, block_bias

DECODE_ROWS = 16  # at most this many queries over a longer cache, no gradient: a decoding step


def worth(c: Call) -> bool:
    """Auto passes a decoding step on: the dims would be appended to every cached key at every step (a copy of
    the cache per layer), where the next path adds the step's term directly (ALiBi decodes slower than stock on
    its dims path, faster on cpu-flash-mask; measured: docs/results.md, "Decoding with the KV cache")."""
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


def block_mask(i0, i1, lo, hi, key_padding, window, device):
    """Bool mask (B|1, 1, C, Tc) for queries [i0, i1) over keys [lo, hi) (``cpu_flash_mask.block_bias``'s),
    or None when the block is the plain causal square (or a single query that sees every key)."""
    if key_padding is None and not window and lo == 0 and (i1 - i0 == hi or i1 - i0 == 1):
        return None
    return block_bias(None, 1, Span(i0, i1 - i0, lo, hi - lo), device, seen=Seen(key_padding, window))
