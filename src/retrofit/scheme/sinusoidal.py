"""Fixed sinusoidal absolute positions (Vaswani et al., 2017, "Attention Is All You Need", sec. 3.5),
added to the token embeddings: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)).

It is the baseline of the ALiBi paper (Press et al., 2022): defined at every position, so it runs
past the native length, but perplexity degrades there. No learned parameters.

Scale: unit sinusoids (RMS 1/sqrt(2)) would swamp typical token embeddings (RMS ~0.02-0.1), so by
default they are scaled to the RMS of the model's token embeddings (``scale=None``; the resolved
value is stored in the options, so a saved model reloads with the same scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..foundation.errors import OptionError
from .kinds import AbsoluteScheme
from .options import option
from .spec import ModelSpec


def frequencies(dim: int, base: float, device=None) -> torch.Tensor:
    """(ceil(dim/2),) fp32: the angular frequency of each sin/cos pair of ``sinusoids``."""
    return base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)


def sinusoids(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(...,) positions -> (..., dim) fp32 sinusoids, sin on even and cos on odd channels."""
    inv_freq = frequencies(dim, base, positions.device)  # (ceil(d/2),)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., ceil(d/2))
    out = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., 2 ceil(d/2)) interleaved
    return out[..., :dim]


def halved_sinusoids(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(...,) positions -> (..., dim) fp32 sinusoids, sin in the first ceil(dim/2) channels and cos in the rest, the
    angles in float64 as Marian's and Pegasus's tables compute them (then cast), so they equal those tables."""
    inv_freq = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    return torch.cat((angles.sin(), angles.cos()), dim=-1)[..., :dim].to(torch.float32)


LAYOUTS = ("interleaved", "halves")


class Sinusoidal(AbsoluteScheme):
    fixed_because = "the sinusoidal table is fixed"

    @dataclass
    class Options:
        base: float = option(10000.0, "wavelength base (the paper's 10000)")
        scale: float | None = option(
            None,
            "amplitude multiplier; default: sqrt(2) x the token embeddings' RMS (equal RMS to the tokens), or 1 "
            "on a model whose own table holds sinusoids (Marian, Pegasus: the same model up to its table)",
        )
        layout: str | None = option(
            None,
            "interleaved: sin on even, cos on odd channels (the paper's); halves: sin in the first half, cos in the "
            "second (Marian's and Pegasus's tables); default: halves on a model whose own table holds sinusoids, "
            "else interleaved",
            LAYOUTS,
        )

    @classmethod
    def resolve_defaults(cls, spec, opts):
        own = spec.native_kind == "sinusoidal"  # its own table is this scheme: by default, the same sinusoids
        if opts.layout is None:
            opts.layout = "halves" if own else "interleaved"
        if opts.scale is None:
            rms = spec.embedding_rms
            opts.scale = 1.0 if own else float(math.sqrt(2.0) * rms) if rms else 1.0
        if opts.base <= 1:
            raise OptionError(f"sinusoidal: base must be > 1; got {opts.base}")
        if not math.isfinite(opts.scale) or opts.scale < 0:
            raise OptionError(f"sinusoidal: scale must be a finite non-negative number; got {opts.scale}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)

    def embed(self, position_ids, dtype):
        # position_ids (B, T) -> (B, T, hidden)
        dim, base = self.spec.hidden_size, self.options.base
        if self.options.layout == "halves":
            return (halved_sinusoids(position_ids, dim, base) * self.options.scale).to(dtype)
        return (sinusoids(position_ids, dim, base) * self.options.scale).to(dtype)
