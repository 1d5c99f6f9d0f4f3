"""Confidence intervals of proportions, the one place for them: Wilson's score interval of one proportion, and
Newcombe's interval of the difference of two proportions read on the same items."""

from __future__ import annotations

import math


def wilson(correct: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% at z = 1.96) for ``correct`` of ``trials``: honest at 0/n and n/n,
    where the normal interval collapses to a point (0/30 gives [0, 0.114])."""
    if trials <= 0:
        raise ValueError(f"trials must be > 0, got {trials}")
    p, z2 = correct / trials, z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a: list[int], b: list[int], z: float = 1.96) -> tuple[float, float, float]:
    """The difference of two proportions read on the same documents (``a``, ``b``: each document's 0/1) with its
    95% interval, Newcombe's method 10 (1998): the two Wilson intervals joined through the pairs' correlation."""
    n = len(a)
    both, only_a = sum(x and y for x, y in zip(a, b)), sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    neither = n - both - only_a - only_b
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    (l1, u1), (l2, u2) = wilson(both + only_a, n, z), wilson(both + only_b, n, z)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / margins**0.5 if margins else 0.0
    d = p1 - p2
    low = d - max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2) ** 0.5
    high = d + max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2) ** 0.5
    return d, max(-1.0, low), min(1.0, high)
