"""Perplexity against length: what the per-token losses (``scoring.losses``) are summarised into.

Both methods score exactly the same *targets*: with a stream ``ids`` of ``n + 1`` tokens, the
targets are ``ids[1:n + 1]`` (every token except the first, which only serves as context).

- non-overlapping, length ``L``: window ``k`` feeds ``ids[k*L : k*L + L]`` and scores
  ``ids[k*L + 1 : k*L + L + 1]``; every window scores all of its ``L`` targets.
- sliding, window ``W``, stride ``S`` (the protocol of the HF perplexity guide, PI and YaRN): the
  first window scores all of its ``W`` targets; each later window ends ``S`` tokens further and
  scores only its last ``S`` targets (fewer for the last one), so every target is scored once and
  sees at least ``W - S`` tokens of context.

Here: a 95% interval over blocks of targets (``summarize``) and the loss by position in a window.
"""

from __future__ import annotations

import math

import numpy as np

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
