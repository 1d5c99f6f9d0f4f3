"""Far-context gain: does a model read past its native length, or only run there?

For a model evaluated plainly at a length ``L`` past its native ``N``, the same target tokens are scored
twice more: by the same model through a native-size sliding window (window ``N``, stride ``N/2``: every
token sees at most ``N`` tokens), and by the original through its sliding window (the report's baseline
rows). The gain is the window's perplexity over the full context's, ``exp(mean(nll_window - nll_full))``:
above 1 the tokens past the window help. Its 95% interval is a paired bootstrap over blocks of ``L``
consecutive targets (the non-overlapping windows), so both sides always cover the same tokens.
A gain whose interval lies above 1 reads past native; one whose interval holds 1 only runs there.
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 2000


def paired_gain(nll_window: np.ndarray, nll_full: np.ndarray, block: int, seed: int = 0) -> dict:
    """``{"gain", "ci_low", "ci_high", "blocks"}`` for two per-target NLL arrays over the same targets."""
    if nll_window.shape != nll_full.shape:
        raise ValueError(f"the two rows score different tokens: {nll_window.shape} vs {nll_full.shape}")
    n = nll_full.size - nll_full.size % block
    diff = (nll_window[:n] - nll_full[:n]).reshape(-1, block).mean(axis=1)  # [blocks]
    out = {
        "gain": round(math.exp(float((nll_window - nll_full).mean())), 4),
        "blocks": int(diff.size),
        "ci_low": None,
        "ci_high": None,
    }
    if diff.size >= 2:
        rng = np.random.default_rng(seed)
        means = diff[rng.integers(0, diff.size, size=(RESAMPLES, diff.size))].mean(axis=1)  # [RESAMPLES]
        lo, hi = np.quantile(means, [0.025, 0.975])
        out["ci_low"], out["ci_high"] = round(math.exp(float(lo)), 4), round(math.exp(float(hi)), 4)
    return out


def reads(entry: dict) -> bool:
    """The gain's interval lies above 1. A single block has no interval: nothing can be said, so no."""
    return entry["ci_low"] is not None and entry["ci_low"] > 1.0


def far_context(models, jobs, nll: dict) -> list[dict]:
    """One entry per (evaluated model, length past its native, comparison): against its own native window
    and against the sliding window of each baseline that cannot run the length (the original, past its table;
    a baseline that runs it plainly has no window to compare with). ``nll``: per-target NLL by (model index, method, length)."""
    out = []
    for job in jobs:
        m = models[job.model]
        native = (m.info.get("native") or {}).get("length")
        if m.role == "baseline" or job.method != "non-overlapping" or not native or job.length <= native:
            continue
        full = nll[(job.model, job.method, job.length)]
        against = [("own native window", job.model, "native-window")]
        against += [  # a baseline read through its own window: one with a limit below the length (the original)
            (f"{b.name} sliding window", i, "sliding")
            for i, b in enumerate(models)
            if b.role == "baseline" and b.max_length is not None and b.max_length < job.length
        ]
        for label, i, method in against:
            window = nll.get((i, method, job.length))
            if window is None:
                continue
            entry = {
                "model": m.name,
                "length": job.length,
                "native": native,
                "against": label,
                **paired_gain(window, full, job.length),
            }
            entry["reads"] = reads(entry)
            out.append(entry)
    return out
