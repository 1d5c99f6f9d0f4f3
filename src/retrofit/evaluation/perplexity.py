"""Per-token losses over a fixed token stream: non-overlapping windows and sliding windows.

Both methods score exactly the same *targets*: with a stream ``ids`` of ``n + 1`` tokens, the
targets are ``ids[1:n + 1]`` (every token except the first, which only serves as context).

- non-overlapping, length ``L``: window ``k`` feeds ``ids[k*L : k*L + L]`` and scores
  ``ids[k*L + 1 : k*L + L + 1]``; every window scores all of its ``L`` targets.
- sliding, window ``W``, stride ``S`` (the protocol of the HF perplexity guide, PI and YaRN): the
  first window scores all of its ``W`` targets; each later window ends ``S`` tokens further and
  scores only its last ``S`` targets (fewer for the last one), so every target is scored once and
  sees at least ``W - S`` tokens of context.

Losses come back as a float64 array of length ``n`` (target order), so methods and models can be
compared token by token.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

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


def sliding_spans(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows ``(start, end, n_scored)`` over targets ``0..n-1`` (target ``t`` is ``ids[t + 1]``).

    The window feeds ``ids[start:end]`` and scores its last ``n_scored`` targets. Together the
    scored targets are exactly ``0..n-1``, each once.
    """
    if not 0 < stride <= window:
        raise ValueError(f"stride must be in (0, window={window}], got {stride}")
    spans, end = [], min(window, n)
    spans.append((0, end, end))
    while end < n:
        new_end = min(end + stride, n)
        spans.append((max(0, new_end - window), new_end, new_end - end))
        end = new_end
    return spans


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


def sliding_window_logits(model, input_ids: torch.Tensor, window: int, stride: int) -> torch.Tensor:
    """Logits [B, T, V] of every position of ``input_ids`` [B, T] read through sliding windows
    (``sliding_spans``): positions [0, window) come from the first window; each later window ends
    ``stride`` tokens further and gives only its last ``stride`` positions (fewer for the last one), so
    position p >= window is predicted from between window - stride and window tokens of context.
    Materialises [B, T, V]: the fine-tune's teacher goes window by window instead (training/teacher.py)."""
    spans = sliding_spans(input_ids.shape[1], window, stride)
    return torch.cat([last_logits(model, input_ids[:, s:e], k) for s, e, k in spans], dim=1)


def sliding_window_count(n: int, window: int, stride: int) -> int:
    """Number of forward passes ``sliding_nll`` makes (for progress bars)."""
    return 1 + max(0, math.ceil((n - min(window, n)) / stride))


# ----------------------------------------------------------------------------- statistics

# two-sided 95% Student-t quantiles, df = 1..30
_T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t_quantile_975(df: int) -> float:
    """0.975 quantile of Student's t (table up to 30 df, Cornish-Fisher expansion beyond)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def summarize(nll: np.ndarray, block: int) -> dict:
    """ppl, mean NLL, tokens and a 95% CI over blocks of ``block`` consecutive targets.

    For non-overlapping windows the blocks are the windows; for a sliding evaluation they are the
    same target spans, so CIs of both methods cover the same units. The CI is a t interval on the
    per-block mean NLL, mapped through exp.
    """
    tokens = int(nll.size)
    mean = float(nll.mean())
    blocks = nll[: tokens - tokens % block].reshape(-1, block).mean(axis=1) if tokens >= block else nll[None].mean(1)
    n_blocks = int(blocks.size)
    out = {"ppl": math.exp(mean), "nll": mean, "tokens": tokens, "ci_blocks": n_blocks, "ci_low": None, "ci_high": None}
    if n_blocks >= 2:
        half = t_quantile_975(n_blocks - 1) * float(blocks.std(ddof=1)) / math.sqrt(n_blocks)
        out["ci_low"], out["ci_high"] = math.exp(mean - half), math.exp(mean + half)
    return out


def loss_by_position(nll: np.ndarray, length: int, buckets: int) -> dict:
    """Mean NLL by the target's position inside its non-overlapping window.

    Buckets are log-spaced (position 0, then edges at 1 .. L geometrically; duplicates after
    rounding merge), so the first tokens of a window, where loss changes fastest, get their own.
    """
    per_pos = nll.reshape(-1, length).mean(axis=0)  # [L]
    buckets = max(1, min(buckets, length))
    edges = [0, *sorted({int(round(x)) for x in np.geomspace(1, length, buckets)})]
    starts, ends, losses = [], [], []
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            starts.append(int(a))
            ends.append(int(b))
            losses.append(float(per_pos[a:b].mean()))
    return {"bucket_start": starts, "bucket_end": ends, "loss": losses, "windows": int(nll.size // length)}
