"""``sdpa``: stock scaled-dot-product attention (the stock speed) for a call with no positional term in its
scores (RoPE, absolute and no-position schemes): full causal self-attention, one decoding query that sees
every key, or bidirectional attention over every key, without padding or a window."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .call import Call


def serves(c: Call) -> str | None:
    if c.positional:
        return "a positional term in the scores (stock SDPA adds none)"
    if c.masked:
        return "padding or a window"
    if c.causal and not (c.Tq == c.Tk or c.Tq == 1):
        return "several queries after a cached prefix"
    return None


def run(c: Call) -> torch.Tensor:
    # grouped-query keys (Hkv < H) as they are: SDPA's enable_gqa
    return F.scaled_dot_product_attention(
        c.q,
        c.k,
        c.v,
        dropout_p=c.dropout,
        is_causal=c.causal and c.Tq == c.Tk and c.Tq > 1,
        scale=c.scaling,
        enable_gqa=c.k.shape[1] != c.q.shape[1],
    )
