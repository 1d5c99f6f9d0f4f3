"""Clipped relative positions (Shaw, Uszkoreit & Vaswani, 2018, "Self-Attention with Relative Position
Representations"), scalar form: a learned bias per head for each offset i - j, clipped at
``max_distance`` (the paper's k: ``a_ij = w_clip(j - i, k)``). A causal decoder only sees
j - i in [-k, 0], so the table has k + 1 entries per head; an encoder (``spec.bidirectional``) sees keys on
both sides, with separate offsets before and after the query, as the paper's 2k + 1 entries.

Initialisation (``init="alibi"``, default): entry d of head h starts at -slope_h x d, i.e. exactly
ALiBi up to ``max_distance`` and flat beyond, so the converted model keeps its recency;
``init="zero"`` is the paper's fresh start.

Parameters: ``table`` (L, H, k + 1) with ``per_layer=True`` (default; Shaw et al. learn one set
per layer), else (1, H, k + 1) shared; (L, H, 2k + 1) on an encoder, entry k + d for the offset i - j = d.
The bias is a gather ``table[layer, h, min(i - j, k)]`` (an encoder's: ``clip(i - j, -k, k) + k``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..foundation.errors import OptionError
from .alibi import alibi_slopes
from .kinds import BiasScheme, gather_per_head
from .options import option
from .spec import ModelSpec

INITS = ("alibi", "zero")


class ShawClipped(BiasScheme):
    shift_invariant = True

    @dataclass
    class Options:
        max_distance: int = option(
            128, "clipping distance k: offsets beyond k share the value at k (the paper used 16)"
        )
        per_layer: bool = option(True, "one table per layer (False: one shared by all layers)")
        init: str = option("alibi", "alibi: start at -slope_h x min(d, k) (keeps recency); zero: a fresh start", INITS)

    @classmethod
    def resolve_defaults(cls, spec, opts):
        if opts.max_distance < 1:
            raise OptionError(f"shaw: max_distance must be >= 1; got {opts.max_distance}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        layers, k = (spec.num_layers if options.per_layer else 1), options.max_distance
        self.both = spec.bidirectional  # keys after the query too: offsets -k..k
        offsets = torch.arange(-k if self.both else 0, k + 1, dtype=torch.float32)  # (k + 1) or (2k + 1)
        table = torch.zeros(layers, spec.num_heads, offsets.numel())
        if options.init == "alibi":  # -slope_h x |d|: ALiBi's recency, symmetric on an encoder
            slopes = torch.tensor(alibi_slopes(spec.num_heads), dtype=torch.float32)
            table[:] = -slopes[:, None] * offsets.abs()[None, :]
        self.table = nn.Parameter(table)  # (L or 1, H, k + 1) or (L or 1, H, 2k + 1)

    def distance_band(self, layer):
        """(H, k + 1): the values for keys at distance 0..k before the query (the causal kernels' band)."""
        table = self.table[layer if self.options.per_layer else 0]
        return table[:, self.options.max_distance :] if self.both else table

    def bias(self, layer, h, q_pos, k_pos):
        # h (H,1,1), q_pos (1,C,1), k_pos (1,1,Tk) -> (H, C, Tk); or 0-d tensors -> 0-d
        table, k = self.table[layer if self.options.per_layer else 0], self.options.max_distance  # (H, k+1 | 2k+1)
        if self.both:  # an encoder: keys after the query have their own offsets
            return gather_per_head(table, h, (q_pos - k_pos).clamp(-k, k) + k)
        offset = (q_pos - k_pos).clamp(0, k)  # future keys are masked anyway
        return gather_per_head(table, h, offset)
