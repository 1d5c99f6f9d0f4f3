"""Positions a training block receives when fine-tuning at a short block for a longer target.

- **PoSE** (Zhu et al., 2023, arXiv 2309.10400): the block is split into ``chunks`` contiguous
  pieces; piece c is shifted by a skip u_c, the skips drawn uniformly from [0, target - L] and
  sorted, so positions stay strictly increasing and the block spans up to the target length while
  each piece keeps its local order.
- **randomized** (Ruoss et al., 2023, "Randomized Positional Encodings"): a sorted uniform random
  subset of L distinct positions of [0, target).
- **endprompt** (EndPrompt, arXiv 2605.14589: short sequences whose final segment sits near the target): the
  block's first ``L - s`` tokens keep positions 0 .. L - s - 1, its last ``s = L // 4`` tokens end within ``s``
  positions of the target, so every step holds distances close to the target length itself.

Both are drawn from a seeded ``random.Random`` per step: the same recipe gives the same positions,
on every process and after a resume.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

METHODS = ("none", "pose", "randomized", "endprompt")


def pose(length: int, target: int, chunks: int, rng: random.Random) -> torch.Tensor:
    """(length,) strictly increasing positions in [0, target): ``chunks`` pieces, each shifted by a sorted skip."""
    import torch  # here, not at the top: the recipe's checks read METHODS without torch

    chunks = max(1, min(chunks, length))
    bounds = [round(c * length / chunks) for c in range(chunks + 1)]
    skips = sorted(rng.randint(0, target - length) for _ in range(chunks))
    pieces = [torch.arange(bounds[c], bounds[c + 1]) + skips[c] for c in range(chunks)]
    return torch.cat(pieces)


def randomized(length: int, target: int, rng: random.Random) -> torch.Tensor:
    """(length,) a sorted uniform random subset of [0, target)."""
    import torch

    return torch.tensor(sorted(rng.sample(range(target), length)), dtype=torch.long)


def endprompt(length: int, target: int, rng: random.Random) -> torch.Tensor:
    """(length,) strictly increasing positions: the body at 0 .. length - s - 1, the last s = length // 4 tokens as
    one piece ending at target - 1 - j, j drawn uniformly from [0, s]."""
    import torch

    s = max(1, length // 4)
    end = target - 1 - rng.randint(0, min(s, target - length))  # the final segment's last position
    body = torch.arange(length - s)  # (L - s,)
    return torch.cat([body, torch.arange(end - s + 1, end + 1)])  # (L,)


def draw(method: str, length: int, target: int, chunks: int, seed: int, step: int) -> torch.Tensor | None:
    """This step's positions (None for method "none"); the same (seed, step) always gives the same ones."""
    if method == "none":
        return None
    rng = random.Random(seed * 1_000_003 + step * 7 + 1)
    if method == "pose":
        return pose(length, target, chunks, rng)
    if method == "randomized":
        return randomized(length, target, rng)
    if method == "endprompt":
        return endprompt(length, target, rng)
    raise ValueError(f"positions method must be one of {METHODS}; got {method!r}")
