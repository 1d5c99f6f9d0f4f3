"""Retrieval targets placed in fine-tune blocks (``data.copies``): a natural span of the block written again
later in the same block, so that the model learns to read back that far.

The distance is measured in *positions*, not tokens: when PoSE or randomized positions stretch a short block
over a longer target (``train.positions``), a span at token ``i`` and its copy at token ``j`` sit
``pos[j] - pos[i]`` positions apart, which can be far past the native length in a block shorter than it.
Each copy draws a distance uniformly from ``[min_distance, max_distance]`` and is placed where the block's
positions hold that distance exactly; where they hold none (a PoSE gap), at the nearest distance they hold.
Spans never overlap one another's first or second occurrence.

Every draw is seeded by (seed, row), the loop's seed of the micro-batch and process (``masking.seed_of``): the
same recipe places the same copies after a resume, and other ones on each process and micro-batch.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import torch

from ..foundation.errors import RecipeError
from ..foundation.seeds import derive

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Copy:
    row: int
    first: int  # token index of the span's first occurrence
    second: int  # token index of its copy
    distance: int  # positions between them: pos[second] - pos[first]


def place_one(pos: torch.Tensor, span: int, d: int, taken: torch.Tensor, rng: random.Random) -> tuple[int, int] | None:
    """(first, second) token indices of one copy whose positions are nearest ``d`` apart (exactly ``d`` where the
    positions allow it) among the places where neither occurrence touches a ``taken`` token; None if none is free."""
    L = pos.shape[0]
    count = torch.cat([torch.zeros(1, dtype=torch.long), taken.long().cumsum(0)])  # (L + 1,): taken before k
    start = torch.arange(L - span + 1)  # (S,): every span's first token
    free = start[count[start + span] == count[start]]  # (F,): spans touching nothing taken
    if free.numel() < 2:
        return None
    p = pos[free]  # (F,): increasing
    after = torch.searchsorted(free, free + span)  # (F,): the first free span starting after the span at i ends
    at = torch.searchsorted(p, p + d)  # (F,): the first free span at or past pos + d
    i = torch.arange(free.numel()).repeat(2)  # (2F,): each first with two candidate seconds, one on either side
    j = torch.maximum(torch.cat([at, at - 1]), after.repeat(2))  # (2F,)
    ok = j < free.numel()
    if not ok.any():
        return None
    i, j = i[ok], j[ok]
    gap = (p[j] - p[i] - d).abs()
    best = (gap == gap.min()).nonzero().flatten()
    k = best[rng.randrange(best.numel())]
    return int(free[i[k]]), int(free[j[k]])


def distance_range(cfg, target: int) -> tuple[int, int]:
    """[lo, hi] the distances are drawn from: ``cfg``'s, by default the span length to ``target`` (a block's own
    positions may cap hi further: ``place``)."""
    return cfg.min_distance or cfg.span_length, cfg.max_distance or target


def place(
    batch: torch.Tensor, positions: torch.Tensor | None, cfg, target: int, seed: int
) -> tuple[torch.Tensor, list[Copy]]:
    """(a copy of ``batch`` (B, L) with up to ``cfg.spans`` copies a row, the copies placed): ``positions`` (L,)
    are the block's positions (None: 0..L-1); distances are drawn from [cfg.min_distance or the span length,
    cfg.max_distance or ``target``], capped by the distance the block's positions span."""
    B, L = batch.shape
    pos = torch.arange(L) if positions is None else positions.cpu().long()  # (L,)
    lo, hi = distance_range(cfg, target)
    hi = min(hi, int(pos[L - cfg.span_length] - pos[0]))  # the farthest start to start the positions hold
    out, placed = batch.clone(), []
    for row in range(B):
        rng = random.Random(derive(seed, row))
        taken, n = torch.zeros(L, dtype=torch.bool), 0
        for _ in range(4 * cfg.spans):  # a draw whose every place is taken is drawn again, 4 tries a copy
            if n == cfg.spans:
                break
            where = place_one(pos, cfg.span_length, rng.randint(lo, max(lo, hi)), taken, rng)
            if where is None:
                continue
            n += 1
            i, j = where
            out[row, j : j + cfg.span_length] = out[row, i : i + cfg.span_length]
            taken[i : i + cfg.span_length] = taken[j : j + cfg.span_length] = True
            placed.append(Copy(row, i, j, int(pos[j] - pos[i])))
    return out, placed


def say(cfg, masker, reach: int) -> None:
    """``data.copies`` (``cfg``): refused for a masked LM (``masker``), else said before training; distances drawn up
    to ``reach`` by default."""
    if not cfg.spans:
        return
    if masker is not None:
        raise RecipeError("'data.copies' places retrieval targets for a causal LM; this model is a masked LM")
    lo, hi = distance_range(cfg, reach)
    log.info(
        "data.copies: up to %d spans of %d tokens a block, copied %d-%d positions later (drawn uniformly)",
        cfg.spans,
        cfg.span_length,
        lo,
        hi,
    )


def added(cfg, batch: torch.Tensor, drawn, reach: int, seed: int) -> torch.Tensor:
    """``batch`` (B, L) with ``data.copies`` (``cfg``) retrieval targets placed at distances up to ``reach`` in the
    block's placement ``drawn`` (None: 0..L-1); as it was when the option is off."""
    if not cfg.spans:
        return batch
    placed, _ = place(batch.cpu(), drawn, cfg, reach, seed)
    return placed.to(batch.device)
