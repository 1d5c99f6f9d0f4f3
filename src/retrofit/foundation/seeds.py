"""One formula for every seed the package derives from a run's seed: ``seed * 1_000_003 + offset`` (``derive``), the
offset naming what it seeds (a step, a row, a document's index). The same run seed gives the same draws on every
process and after a resume; two offsets give independent ``random.Random`` streams."""

from __future__ import annotations

MULTIPLIER = 1_000_003  # a prime well above any offset a run reaches per seed


def derive(seed: int, offset: int = 0) -> int:
    """The seed of what ``offset`` names under the run's ``seed``."""
    return seed * MULTIPLIER + offset
