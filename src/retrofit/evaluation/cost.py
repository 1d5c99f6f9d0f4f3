"""Wall time and peak memory of a block of work (CUDA allocator on GPU, peak RSS on CPU)."""

from __future__ import annotations

import re
import resource
import sys
import time

import torch

_STATUS = "/proc/self/status"


def _status_kb(field: str) -> int | None:
    try:
        with open(_STATUS) as f:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        # raw write: not a file: resets the kernel's peak-RSS counter (/proc/self/clear_refs)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


class Meter:
    """``with Meter(device) as m: ...``; then ``m.result()`` -> seconds, peak memory and how it was measured.

    - CUDA: ``torch.cuda.max_memory_allocated`` (peak of tensors, weights included), reset at entry.
    - Linux CPU: peak resident set size of the process (VmHWM), reset at entry through clear_refs,
      so the peak belongs to this block.
    - elsewhere: ``ru_maxrss``, the peak since the process started (an upper bound).
    ``peak_memory_delta_bytes`` is the peak minus what was in use at entry.
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.measure = "torch.cuda.max_memory_allocated"
            self.before = torch.cuda.memory_allocated(self.device)
        elif _reset_rss_peak() and _status_kb("VmHWM") is not None:
            self.measure = "peak RSS (VmHWM, reset per measurement)"
            self.before = (_status_kb("VmRSS") or 0) * 1024
        else:
            self.measure = "ru_maxrss (peak since process start)"
            self.before = _maxrss_bytes()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self.measure.startswith("peak RSS"):
            self.peak = (_status_kb("VmHWM") or 0) * 1024
        else:
            self.peak = _maxrss_bytes()
        self.seconds = time.perf_counter() - self.t0
        return False

    def result(self, tokens: int) -> dict:
        return {
            "seconds": self.seconds,
            "tokens_per_s": tokens / self.seconds if self.seconds > 0 else None,
            "peak_memory_bytes": int(self.peak),
            "peak_memory_delta_bytes": int(max(0, self.peak - self.before)),
            "memory_measure": self.measure,
        }


# ---- the estimate said before an evaluation starts ----------------------------------------------------------
TIMING_S = 4.0  # forwards timed for the estimate stop growing past about half this: said before long work starts
SHORT = 16  # tokens of the short forward that measures the fixed cost of a pass
QUICK_S = 0.2  # a forward quicker than this is timed three times (the best counts)


def when(seconds: float) -> str:
    """``about 42 s``, ``about 8 min``, ``about 1.5 h``; ``under a second`` (never "about 0 s")."""
    if seconds < 0.5:
        return "under a second"
    return f"about {_span(seconds)}"


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def plan_line(work: list[tuple[int, int]]) -> str:
    """What the evaluation puts through the models, from ``work``: (window length, forward passes) pairs."""
    tokens, passes = sum(n * c for n, c in work), sum(c for _, c in work)
    lengths = sorted({n for n, c in work if c})
    span = f"{lengths[0]:,}" if len(lengths) == 1 else f"{lengths[0]:,} to {lengths[-1]:,}"
    return f"cost: {tokens:,} tokens through the models in {passes:,} forward passes (windows of {span} tokens)"


def _forward_s(model, ids: torch.Tensor, k: int) -> float:
    """One timed forward of the first ``k`` tokens."""
    x = ids[:k].reshape(1, -1).to(next(model.parameters()).device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(input_ids=x)
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        return time.perf_counter() - t0


def _best_s(model, ids: torch.Tensor, k: int, first: float) -> float:
    """``first`` (a forward of ``k`` tokens just timed), or the best of it and two more when it was quick: one
    slow moment of a busy machine does not set the estimate, and a slow forward is not run again."""
    return first if first >= QUICK_S else min(first, _forward_s(model, ids, k), _forward_s(model, ids, k))


def time_forwards(model, ids: torch.Tensor, target: int) -> list[tuple[int, float]]:
    """(tokens, seconds) of forwards timed now on the eval's own tokens ``ids``: a short one (the fixed cost of
    a pass; after a warm-up), then doubling lengths up to ``target`` (the longest window), stopping early once a
    forward takes about ``TIMING_S / 2``: a few seconds in all, however large the model."""
    target = max(1, min(target, ids.numel()))
    short = min(SHORT, target)
    _forward_s(model, ids, short)  # warm-up: first calls allocate
    timed = [(short, _best_s(model, ids, short, _forward_s(model, ids, short)))]
    k = short
    while k < target and timed[-1][1] < TIMING_S / 2:
        k = min(2 * k, target)
        timed.append((k, _best_s(model, ids, k, _forward_s(model, ids, k))))
    return timed


def pass_seconds(n: int, timed: list[tuple[int, float]]) -> float:
    """A forward of ``n`` tokens, read off the forwards ``timed`` ((tokens, seconds), by length): between two
    of them on the line through both, past the longest on the slope of the last two (a convex cost grows at
    least that fast), below the shortest as the shortest. Times are taken as non-decreasing in the length, so
    noise never gives a negative cost per token or an absurd rate."""
    points, slowest = [], 0.0
    for k, t in sorted(timed):
        slowest = max(slowest, t)
        points.append((k, slowest))
    if n <= points[0][0]:
        return points[0][1]
    for (k0, t0), (k1, t1) in zip(points, points[1:]):
        if n <= k1:
            return t0 + (t1 - t0) * (n - k0) / (k1 - k0)
    (k0, t0), (k1, t1) = points[-2] if len(points) > 1 else (0, 0.0), points[-1]
    return t1 + (t1 - t0) / (k1 - k0) * (n - k1)


def estimate(work: list[tuple[int, int]], timed: list[tuple[int, float]]) -> float:
    """Seconds of forwards for ``work``: (window length, passes) pairs, each pass as ``pass_seconds`` reads it."""
    return sum(c * pass_seconds(n, timed) for n, c in work if c)


def time_line(name: str, work: list[tuple[int, int]], timed: list[tuple[int, float]], quick: bool = False) -> str:
    """The time the forwards of ``work`` take here, and what it was measured on; ``quick``: the evaluation is
    already as light as ``retrofit eval --quick`` (no lighter one to suggest)."""
    seconds = estimate(work, timed)
    (s, ts), (k, tk) = timed[0], timed[-1]
    measured = f"{k:,} tokens in {tk * 1e3:,.1f} ms, {k / max(tk, 1e-9):,.0f} tokens/s"
    if k > s:
        measured += f"; {s:,} tokens in {ts * 1e3:,.1f} ms"
    longest = max(n for n, c in work if c)
    beyond = (
        f"; longer windows (up to {longest:,} tokens) extrapolated from the last two, so likely more: attention "
        "grows faster than the length"
        if k < longest
        else ""
    )
    return (
        f"cost: {when(seconds)} here for the forwards alone (timed now on {name}: {measured}); scoring adds "
        f"to it{beyond}" + ("" if quick else "; lighter: retrofit eval --quick")
    )
