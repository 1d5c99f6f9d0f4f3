"""The windows a long token stream is read through, shared by the evaluation and the fine-tune's teacher.

- ``sliding_spans``: windows of ``window`` tokens, each ending ``stride`` tokens after the last and scoring only
  its new targets (the protocol of the HF perplexity guide, PI and YaRN; a causal model's sliding reading).
- ``centred_spans``: windows advancing by ``stride``, each scoring the middle ``stride`` of its window (a
  masked LM's sliding reading: every position from the window where it is most central).
"""

from __future__ import annotations

import math


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


def centred_spans(n: int, window: int, stride: int) -> list[tuple[int, int, int, int]]:
    """Windows (start, end, a, b) over 0..n-1, advancing by ``stride``: each scores positions [a, b), the
    middle ``stride`` of its window (the first from 0, the last to n), so together they score 0..n-1 once."""
    if not 0 < stride <= window:
        raise ValueError(f"stride must be in (0, window={window}], got {stride}")
    margin, spans, start = (window - stride) // 2, [], 0
    while True:
        end = min(start + window, n)
        a = 0 if start == 0 else start + margin
        b = n if end == n else start + margin + stride
        spans.append((start, end, a, b))
        if end == n:
            return spans
        start += stride


def sliding_window_count(n: int, window: int, stride: int) -> int:
    """Number of forward passes ``sliding_nll`` makes (for progress bars)."""
    return 1 + max(0, math.ceil((n - min(window, n)) / stride))
