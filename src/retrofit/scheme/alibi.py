"""ALiBi (Press et al., 2022): a linear recency bias per head. Fixed by default (no learned parameters);
``learn_slopes=True`` makes the per-head slopes a parameter (started at the standard slopes; saved, trained,
reloaded), e.g. for ``retrofit convert --calibrate``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .kinds import BiasScheme
from .options import option
from .spec import ModelSpec


def alibi_slopes(num_heads: int) -> list[float]:
    """Geometric slopes 2^(-8/n * i); for n not a power of two, the paper's rule:
    the slopes of the closest lower power of two, then every other slope of the next one."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


class ALiBi(BiasScheme):
    fixed_because = "its slopes are fixed; convert with --option learn_slopes=true to make them parameters"
    shift_invariant = True

    @dataclass
    class Options:
        scale_bias: bool = option(
            False,
            "add the bias before the 1/sqrt(d) score scaling (Falcon's convention, needed for an exact "
            "Falcon export); default adds it after, as in the paper",
        )
        learn_slopes: bool = option(
            False,
            "make the per-head slopes a learned parameter (started at the standard slopes, saved with the "
            "checkpoint; what `convert --calibrate` trains); default: fixed slopes",
        )

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        slopes = torch.tensor(alibi_slopes(spec.num_heads), dtype=torch.float32)
        if options.learn_slopes:  # a parameter: saved, trained, loaded like any scheme parameter
            self.slopes = nn.Parameter(slopes)
        else:  # fp32, non-persistent: recomputed from the head count, moves with .to(device)
            self.register_buffer("slopes", slopes, persistent=False)
        self.bias_scaled_with_scores = options.scale_bias

    def options_dict(self):
        out = super().options_dict()
        if not out.get("learn_slopes"):  # fixed slopes: the config reads as before the option existed
            out.pop("learn_slopes", None)
        return out

    def linear_slopes(self, layer):
        return self.slopes

    def bias(self, layer, h, q_pos, k_pos):
        # -slope_h * |i - j|: 0 on the diagonal, more negative with distance on either side (a decoder masks the
        # keys after the query; an encoder sees them, as jina-bert's symmetric ALiBi)
        return -self.slopes[h] * (q_pos - k_pos).abs().to(torch.float32)
