"""T5 relative buckets (Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", sec. 2.1): a learned scalar bias per head for each bucket of the offset
i - j. Offsets below ``num_buckets // 2`` get a bucket each; larger ones share logarithmically wider
buckets up to ``max_distance``, beyond which all offsets share the last bucket. Causal decoders use
T5's unidirectional form (all buckets for i - j >= 0), identical to transformers'
``T5Attention._relative_position_bucket(..., bidirectional=False)``; an encoder (``spec.bidirectional``)
uses T5's own encoder form, half the buckets for the keys before the query and half for those after
(``bidirectional=True``).

Initialisation (``init="alibi"``, default): bucket b of head h starts at -slope_h x (the mean
distance of the offsets in b), so the converted model starts close to ALiBi and keeps its recency;
``init="zero"`` is T5's fresh start (no position information until trained).

Parameters: ``table`` (L, H, num_buckets) with ``per_layer=True`` (default; L x H x 32 scalars,
e.g. 32 x 32 x 32 = 32k for a 7B model), else (1, H, num_buckets) shared by every layer as in T5.
The bias is a gather ``table[layer, h, bucket(i - j)]``: no H x N x N tensor is stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..foundation.errors import OptionError
from .alibi import alibi_slopes
from .kinds import BiasScheme, gather_per_head
from .options import option
from .spec import ModelSpec

INITS = ("alibi", "zero")


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Unidirectional T5 bucket of ``distance = i - j`` (any shape; negative distances -> bucket 0)."""
    n = distance.clamp(min=0)
    max_exact = num_buckets // 2
    # log-spaced buckets; the clamp keeps log() finite where the exact branch is taken
    scaled = torch.log(n.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n.to(torch.long), large)


def t5_bucket_both(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bidirectional T5 bucket of ``relative = j - i``: keys up to the query in [0, num_buckets / 2), keys after
    it in [num_buckets / 2, num_buckets), each side T5's unidirectional buckets of |i - j|."""
    half = num_buckets // 2
    return t5_bucket(relative.abs(), half, max_distance) + (relative > 0).to(torch.long) * half


def bucket_distances(bucket_of, num_buckets: int, horizon: int) -> torch.Tensor:
    """Representative distance of each bucket: the mean of the offsets 0..horizon-1 that fall in it
    (buckets no offset reaches take the next reachable bucket's value). ``bucket_of(d) -> bucket``."""
    d = torch.arange(horizon)
    b = bucket_of(d)
    total = torch.zeros(num_buckets, dtype=torch.float64).index_add_(0, b, d.double())
    count = torch.zeros(num_buckets, dtype=torch.float64).index_add_(0, b, torch.ones_like(d, dtype=torch.float64))
    mean = total / count.clamp(min=1)
    for k in range(num_buckets - 2, -1, -1):  # over buckets, not positions: fill unreachable ones
        if count[k] == 0:
            mean[k] = mean[k + 1]
    return mean


class T5Buckets(BiasScheme):
    shift_invariant = True

    @dataclass
    class Options:
        num_buckets: int = option(32, "buckets per head: half exact (small offsets), half log-spaced")
        max_distance: int = option(128, "offsets at or beyond this share the last bucket")
        per_layer: bool = option(True, "one table per layer (False: one shared by all layers, as in T5)")
        init: str = option(
            "alibi", "alibi: start at -slope_h x bucket distance (keeps recency); zero: T5's fresh start", INITS
        )

    @classmethod
    def resolve_defaults(cls, spec, opts):
        if opts.num_buckets < 2:
            raise OptionError(f"t5: num_buckets must be >= 2; got {opts.num_buckets}")
        side = opts.num_buckets // 2 if spec.bidirectional else opts.num_buckets  # buckets per side
        if spec.bidirectional and (opts.num_buckets < 4 or opts.num_buckets % 2):
            raise OptionError(
                f"t5: an encoder's buckets split in two sides; num_buckets must be even and >= 4, got {opts.num_buckets}"
            )
        if opts.max_distance <= side // 2:
            raise OptionError(
                f"t5: max_distance ({opts.max_distance}) must exceed {side // 2} (half of one side's buckets)"
            )
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        layers = spec.num_layers if options.per_layer else 1
        self.both, m = spec.bidirectional, options.max_distance
        table = torch.zeros(layers, spec.num_heads, options.num_buckets)
        if options.init == "alibi":  # each bucket at -slope_h x its mean |i - j| (both sides alike on an encoder)
            side = options.num_buckets // 2 if self.both else options.num_buckets
            dist = bucket_distances(lambda d: t5_bucket(d, side, m), side, m + 1)
            slopes = torch.tensor(alibi_slopes(spec.num_heads), dtype=torch.float64)
            table[:] = (-slopes[:, None] * dist.repeat(options.num_buckets // side)[None, :]).float()
        self.table = nn.Parameter(table)  # (L or 1, H, num_buckets)
        # bucket of each offset i - j in -max_distance..max_distance (or 0..max_distance on a decoder; every
        # larger offset shares its side's last bucket): a lookup instead of a log per score element
        lut = self.bucket(torch.arange(-m if self.both else 0, m + 1))
        self.register_buffer("lut", lut, persistent=False)  # (max_distance + 1,) or (2 max_distance + 1,)

    def bucket(self, distance: torch.Tensor) -> torch.Tensor:
        """The bucket of ``distance = i - j``: T5's unidirectional form, or its bidirectional one on an encoder."""
        o = self.options
        if self.both:
            return t5_bucket_both(-distance, o.num_buckets, o.max_distance)
        return t5_bucket(distance, o.num_buckets, o.max_distance)

    def distance_band(self, layer):
        if self.both:  # the band kernel serves causal calls; an encoder's offsets run both ways
            return None
        return self.table[layer if self.options.per_layer else 0][:, self.lut]  # (H, max_distance + 1)

    def bias(self, layer, h, q_pos, k_pos):
        # h (H,1,1), q_pos (1,C,1), k_pos (1,1,Tk) -> (H, C, Tk); or 0-d tensors -> 0-d
        table = self.table[layer if self.options.per_layer else 0]  # (H, num_buckets)
        m = self.options.max_distance
        if self.both:  # offsets -m..m at lut index 0..2m
            distance = (q_pos - k_pos).clamp(-m, m) + m
        else:
            distance = (q_pos - k_pos).clamp(0, m)  # future keys are masked anyway
        if h.dim() == 0:  # FlexAttention score_mod
            return table[h, self.lut[distance]]
        return gather_per_head(table[:, self.lut], h, distance)  # (H, max_distance + 1) per-distance values
