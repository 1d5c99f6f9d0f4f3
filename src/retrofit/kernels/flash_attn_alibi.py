"""``flash-attn-alibi``: ALiBi through FlashAttention 2's ``alibi_slopes`` (CUDA, fp16/bf16, no padding), when
the ``flash_attn`` package is installed."""

from __future__ import annotations

import torch

from .call import Call

_flash = None
_flash_checked = False


def serves(c: Call) -> str | None:
    if c.slopes is None:
        return "no ALiBi slopes (a bias linear in the distance)"
    if not c.q.is_cuda or c.q.dtype not in (torch.float16, torch.bfloat16):
        return "FlashAttention 2 runs on CUDA in fp16/bf16 only"
    if c.key_padding is not None or c.row_scale is not None:
        return "FlashAttention 2 takes no padding mask and no per-row bias scale"
    if torch.is_grad_enabled() and c.slopes.requires_grad:
        return "FlashAttention 2 returns no gradient for alibi_slopes (learned slopes)"
    if not available():
        return "the flash_attn package is not installed (or not built for this torch/CUDA)"
    return None


def run(c: Call) -> torch.Tensor:
    return flash_attn_alibi(c)


def available() -> bool:
    global _flash, _flash_checked
    if not _flash_checked:
        _flash_checked = True
        try:
            from flash_attn import flash_attn_func

            _flash = flash_attn_func
        except Exception:  # not installed, or built for another torch/CUDA
            _flash = None
    return _flash is not None


def flash_attn_alibi(c: Call) -> torch.Tensor:
    """FlashAttention 2 with ``alibi_slopes`` (``c.slopes``): it adds ``-m_h * |i + Tk - Tq - j|`` to the scaled
    score, causal and bottom-right aligned (a cached prefix is simply the first Tk - Tq keys), with the call's
    window and dropout. q (B, H, Tq, D), k/v (B, H, Tk, D) -> (B, H, Tq, D)."""
    q, k, v, window = c.q, c.k, c.v, c.window
    # flash_attn takes (B, T, H, D)
    out = _flash(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        dropout_p=c.dropout,
        softmax_scale=c.scaling,
        causal=True,
        window_size=(window - 1, 0) if window else (-1, -1),
        alibi_slopes=c.slopes.to(device=q.device, dtype=torch.float32).contiguous(),
    )
    return out.transpose(1, 2)
