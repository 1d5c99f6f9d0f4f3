"""Per-token losses and logits of a causal LM over a token stream: non-overlapping and sliding windows
(``windows.sliding_spans``), the logits of a window's last positions. Logits are computed ``LOGIT_CHUNK``
positions at a time where the model's head allows it, so a long window never holds [T, vocab] at once.

With a stream ``ids`` of ``n + 1`` tokens the targets are ``ids[1:n + 1]``; losses come back as a float64
array of length ``n`` in target order, so methods and models compare token by token.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .windows import sliding_spans

#: logits are materialised for at most this many positions at a time (per batch row)
LOGIT_CHUNK = 1024


def _uses_plain_head(model) -> bool:
    """True when logits are exactly ``lm_head(last_hidden_state)`` (no soft-capping or scaling)."""
    cfg = getattr(model, "config", None)
    if cfg is None or hasattr(model, "peft_config") or not hasattr(model, "get_output_embeddings"):
        return False  # PEFT wrappers and custom modules: use their full forward
    if model.get_output_embeddings() is None:
        return False
    for attr in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            return False
    base = getattr(model, "base_model", None)
    return base is not None and base is not model


def hidden_and_head(model, input_ids: torch.Tensor):
    """``(hidden [B, T, D], head)`` when the chunked path applies, else ``(logits [B, T, V], None)``."""
    if _uses_plain_head(model):
        out = model.base_model(input_ids=input_ids, use_cache=False)
        return out[0], model.get_output_embeddings()
    out = model(input_ids=input_ids, use_cache=False)
    return out.logits, None


def token_nll(model, input_ids: torch.Tensor, targets: torch.Tensor, score_from: int = 0) -> torch.Tensor:
    """NLL (float64, natural log) of ``targets[:, score_from:]`` given ``input_ids``.

    ``input_ids``, ``targets``: [B, T] (targets are the inputs shifted left by one).
    Returns [B, T - score_from]. Logits are computed ``LOGIT_CHUNK`` positions at a time, in
    float32, so a long window never materialises a [T, vocab] float32 tensor at once.
    """
    hidden, head = hidden_and_head(model, input_ids)
    hidden = hidden[:, score_from:]  # [B, T', D] or [B, T', V]
    tgt = targets[:, score_from:].to(hidden.device)  # [B, T']
    parts = []
    for s in range(0, hidden.shape[1], LOGIT_CHUNK):
        h = hidden[:, s : s + LOGIT_CHUNK]
        logits = (head(h) if head is not None else h).float()  # [B, c, V]
        nll = F.cross_entropy(logits.transpose(1, 2), tgt[:, s : s + LOGIT_CHUNK], reduction="none")  # [B, c]
        parts.append(nll.double().cpu())
    return torch.cat(parts, dim=1)


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def nonoverlapping_nll(
    model, ids: torch.Tensor, length: int, *, batch_size: int = 1, on_window: Callable[[int], None] | None = None
) -> np.ndarray:
    """Per-target NLL [n] with non-overlapping windows of ``length``; ``ids``: [n + 1], n % length == 0."""
    n = ids.numel() - 1
    if n % length:
        raise ValueError(f"{n} targets are not a multiple of length {length}")
    dev = _device(model)
    inputs = ids[:-1].view(-1, length)  # [n/L, L]
    targets = ids[1:].view(-1, length)  # [n/L, L]
    out = np.empty(n, dtype=np.float64)
    with torch.inference_mode():
        for b in range(0, inputs.shape[0], batch_size):
            x, y = inputs[b : b + batch_size].to(dev), targets[b : b + batch_size]
            nll = token_nll(model, x, y)  # [bs, L]
            out[b * length : b * length + nll.numel()] = nll.reshape(-1).numpy()
            if on_window:
                on_window(x.shape[0])
    return out


def sliding_nll(
    model, ids: torch.Tensor, window: int, stride: int, *, on_window: Callable[[int], None] | None = None
) -> np.ndarray:
    """Per-target NLL [n] with sliding windows of ``window`` tokens advancing by ``stride``."""
    n = ids.numel() - 1
    dev = _device(model)
    out = np.empty(n, dtype=np.float64)
    with torch.inference_mode():
        for start, end, k in sliding_spans(n, window, stride):
            x = ids[start:end].unsqueeze(0).to(dev)  # [1, W]
            y = ids[start + 1 : end + 1].unsqueeze(0)  # [1, W]
            nll = token_nll(model, x, y, score_from=(end - start) - k)  # [1, k]
            out[end - k : end] = nll[0].numpy()
            if on_window:
                on_window(1)
    return out


def last_logits(model, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
    """Logits [B, keep, V] of the last ``keep`` positions of ``input_ids`` [B, T] (the head reads those alone
    where the chunked path applies)."""
    hidden, head = hidden_and_head(model, input_ids)
    hidden = hidden[:, hidden.shape[1] - keep :]
    return head(hidden) if head is not None else hidden
