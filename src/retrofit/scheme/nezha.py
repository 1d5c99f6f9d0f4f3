"""NEZHA's functional relative positions (Wei et al., 2019, "NEZHA: Neural Contextualized Representation
for Chinese Language Understanding", sec. 3.2): Shaw et al.'s key form, q_i . a_ij added to the score,
with fixed sinusoidal vectors a_ij[2k] = sin((j - i) / base^(2k/D)), a_ij[2k+1] = cos((j - i) / base^(2k/D))
of the clipped offset (|j - i| <= ``max_distance``; the paper's 64), keys after the query included on an
encoder (NEZHA is a BERT-style encoder). No learned parameters; the same
chunked relative-logit kernel as ``xl`` (``kind = "relative"``), with one table shared by every head.

Convention: the paper's equations, not the released code's. Huawei's NEZHA code indexes a sinusoid table by
clip(j - i, -max_distance, max_distance) + max_distance (so its vectors are sinusoids of a shifted,
non-negative index) and adds a value term as well (a_ij^V to the values, Shaw's second term). Here a_ij is
the sinusoid of the signed clipped offset itself, as in the paper's sec. 3.2 formula, and there is no value
term: the positions act on the scores only, like every other scheme of this package. A checkpoint trained
with the released code therefore does not load into this scheme as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..foundation.errors import OptionError
from .kinds import RelativeScheme
from .options import option
from .sinusoidal import sinusoids
from .spec import ModelSpec


class Nezha(RelativeScheme):
    shift_invariant = True

    @dataclass
    class Options:
        max_distance: int = option(64, "clipping distance: offsets beyond it share the vector at it (the paper's 64)")
        base: float = option(10000.0, "wavelength base (the paper's 10000)")

    @classmethod
    def resolve_defaults(cls, spec, opts):
        if opts.max_distance < 1:
            raise OptionError(f"nezha: max_distance must be >= 1; got {opts.max_distance}")
        if opts.base <= 1:
            raise OptionError(f"nezha: base must be > 1; got {opts.base}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)

    def relative_queries(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, q  # no global biases

    def relative_reach(self) -> int:
        return self.options.max_distance

    def relative_keys(
        self, layer: int, n: int, dtype: torch.dtype, device: torch.device, start: int = 0
    ) -> torch.Tensor:
        """a for i - j = start .. start + n - 1 (j - i = -d, clipped to [-k, k]: both sides on an encoder, as the
        paper's BERT-style model) -> (1, n, D), shared by every head."""
        k = self.options.max_distance
        offset = -torch.arange(start, start + n, device=device).clamp(-k, k)  # j - i
        return sinusoids(offset, self.spec.head_dim, self.options.base)[None].to(dtype)
