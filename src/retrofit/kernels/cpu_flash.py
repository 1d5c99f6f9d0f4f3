"""The CPU flash attention kernel with its log-sum-exp: what splitting one attention into pieces needs.

``torch.nn.functional.scaled_dot_product_attention`` returns no log-sum-exp, so two pieces of one softmax
(two key ranges seen by the same queries) cannot be merged through it. The CPU kernel's own op returns it,
and its backward, given the *merged* output and log-sum-exp, returns each piece's exact gradients
(P = exp(S - lse), dS = P (dP - rowsum(dO * O)) need only the final O and lse): FlashAttention's split
across key blocks. ``is_causal`` is top-left aligned: query r sees keys 0..r.
"""

from __future__ import annotations

import functools

import torch

EXP_FLOOR = -87.0  # ln of fp32's smallest normal is -87.34: below it torch's CPU exp leaves its vector path


def exp_(scores: torch.Tensor) -> torch.Tensor:
    """``scores.exp_()`` for probabilities, in place, with arguments below ``EXP_FLOOR`` (masked -inf, a steep
    bias) raised to it first: they give 1.6e-38 instead of 0 (or a denormal), which no fp32 sum can see, and
    torch's CPU exp runs many times slower on a vector holding any of them, flushed denormals or not
    (measured: docs/results.md, "Attention kernel", FIRE)."""
    return scores.clamp_(min=EXP_FLOOR).exp_()


def available(q: torch.Tensor) -> bool:
    """The CPU flash op and its backward are present, for this dtype."""
    return (
        not q.is_cuda
        and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
    )


@functools.cache
def takes_grouped() -> bool:
    """The CPU flash op reads grouped-query keys (Hkv < H) as they are (PyTorch 2.5 on): probed once."""
    q, kv = torch.ones(1, 2, 2, 4, device="cpu"), torch.ones(1, 1, 2, 4, device="cpu")
    try:
        return forward(q, kv, kv, 0.5)[0].shape == q.shape
    except RuntimeError:
        return False


def forward(q, k, v, scaling, mask=None, causal=True):
    """(out, lse): out like q's rows with v's width, lse (B, H, Tq) fp32."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scaling
    )


def backward(dout, qkv: tuple, merged: tuple, scaling, mask=None, causal=True):
    """(dq, dk, dv) of one piece (``qkv``: its q, k, v), given the merged output and log-sum-exp (``merged``:
    (out, lse), as ``forward`` and ``merge`` return them)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, *qkv, *merged, 0.0, causal, attn_mask=mask, scale=scaling
    )


def merge(out_a, lse_a, out_b, lse_b):
    """Two pieces of one softmax over disjoint keys -> (out fp32, lse fp32)."""
    out, lse = out_a.float().clone(), lse_a.float().clone()
    merge_into(out, lse, out_b, lse_b.float())
    return out, lse


def merge_into(out, lse, out_b, lse_b) -> None:
    """``merge`` in place: ``out`` (fp32) and ``lse`` (fp32, views allowed) become the merge with piece b."""
    new = torch.logaddexp(lse, lse_b)
    out.mul_((lse - new).exp_().unsqueeze(-1)).addcmul_(out_b, (lse_b - new).exp_().unsqueeze(-1))
    lse.copy_(new)


def rectangle_then_square(q, k_rect, v_rect, k_square, v_square, scaling):
    """Queries (B, H, C, D) over every key of a rectangle (B, H, R, D) and then causally over a square of C
    keys (query r sees square keys 0..r): a query block at rows [R, R + C) of a causal attention, with
    no mask tensor. Differentiable in every input."""
    return _RectangleThenSquare.apply(q, k_rect, v_rect, k_square, v_square, scaling)


class _RectangleThenSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k_rect, v_rect, k_square, v_square, scaling):
        out_r, lse_r = forward(q, k_rect, v_rect, scaling, causal=False)
        out_s, lse_s = forward(q, k_square, v_square, scaling, causal=True)
        out, lse = merge(out_r, lse_r, out_s, lse_s)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k_rect, v_rect, k_square, v_square, out, lse)
        ctx.scaling = scaling
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_rect, v_rect, k_square, v_square, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq_r, dk_r, dv_r = backward(dout, (q, k_rect, v_rect), (out, lse), ctx.scaling, causal=False)
        dq_s, dk_s, dv_s = backward(dout, (q, k_square, v_square), (out, lse), ctx.scaling, causal=True)
        return dq_r + dq_s, dk_r, dv_r, dk_s, dv_s, None
