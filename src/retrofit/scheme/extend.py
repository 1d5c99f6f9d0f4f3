"""Stretch the learned table instead of replacing it (learned-absolute families: GPT-2, GPT-Neo, OPT).

The native table's ``native`` rows become a table of ``length`` rows, still learned (saved, trainable,
visible to PEFT), added to the token embeddings exactly where the native table was:

- ``init="copy"`` (Beltagy et al., 2020, "Longformer", sec. 5: RoBERTa's 512 rows copied to 4,096):
  position p < native keeps its own row, so the model is exactly the original up to its native length;
  later positions repeat the table periodically. ``copy_from`` is the row each later period starts at:
  0 repeats every row (Longformer's copy); 1 skips row 0, the start-of-text row (in GPT-2 its norm is
  several times the others' and the model treats it as an attention sink), so it appears at position 0
  only. ``docs/results.md`` measures both (past native at budget 0 on the GPT-2 stand-in).
- ``init="interpolate"`` (Chen et al., 2023, "Position Interpolation", applied to a table as in Karypis
  et al., 2023, arXiv 2310.14633): position p reads the native table at x = p * native / length, linear
  between rows floor(x) and floor(x) + 1, so every position lands inside the range the model was trained on.

Its reach is finite: an input longer than ``length`` is a ``LengthError`` naming the limit, and the
converted config advertises ``length``. Native export is the same architecture with the bigger table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..foundation.errors import LengthError, OptionError
from ..foundation.native import rows_of
from .kinds import AbsoluteScheme
from .options import option
from .spec import ModelSpec

INITS = ("copy", "interpolate")


def resolve_length(value, native: int) -> int:
    """``length`` as given (an int, or a multiple of the native length such as ``"16x"``) -> rows."""
    return rows_of(value, native)


def copied_rows(table: torch.Tensor, length: int, copy_from: int = 0) -> torch.Tensor:
    """(length, E): row p = table[p] for p < native, then table[copy_from:] repeated."""
    native = table.shape[0]
    p = torch.arange(length)
    later = copy_from + (p - native) % (native - copy_from)
    return table[torch.where(p < native, p, later)].clone()


def interpolated_rows(table: torch.Tensor, length: int) -> torch.Tensor:
    """(length, E): row p = the table read at x = p * native / length, linear between neighbouring rows."""
    native = table.shape[0]
    x = torch.arange(length, dtype=torch.float64) * native / length  # (length,) in [0, native)
    lo = x.floor().long().clamp(max=native - 1)
    hi = (lo + 1).clamp(max=native - 1)
    w = (x - lo.to(torch.float64))[:, None]
    return ((1 - w) * table[lo].double() + w * table[hi].double()).to(table.dtype)


class Extend(AbsoluteScheme):
    # its native export's note (native_export/baked_table.py): the table in words, and how to get a longer one
    table_words = "the stretched"
    longer_table = "convert with a larger length="

    @dataclass
    class Options:
        length: int | str = option(
            "16x", "rows of the new table: positions, or a multiple of the native length ('16x')"
        )
        init: str = option(
            "copy",
            "copy: rows repeat the native table (exact up to native); interpolate: "
            "positions squeezed into the native range, PI-style",
            INITS,
        )
        copy_from: int = option(
            1,
            "copy: the row each later period starts at (0: Longformer's plain repeat; "
            "1: position 0's start-of-text row is not repeated)",
        )

    @classmethod
    def resolve_defaults(cls, spec, opts):
        opts.length = resolve_length(opts.length, spec.native_length)
        if spec.native_kind == "sinusoidal":
            raise OptionError(
                "extend stretches a learned absolute position table; this model's table holds fixed sinusoids, "
                "defined at every position: convert to sinusoidal (by default its own layout and scale: the same "
                "model up to its table, the sinusoids continued past it)"
            )
        if spec.native_kind != "learned_absolute":
            raise OptionError(
                "extend stretches a learned absolute position table (gpt2, gpt_neo, opt); this model "
                f"has {spec.native_kind} positions: use rope with scaling (pi, ntk, yarn) instead"
            )
        if opts.length < spec.native_length:
            raise OptionError(f"extend: length {opts.length} is shorter than the native table ({spec.native_length})")
        if not 0 <= opts.copy_from < spec.native_length:
            raise OptionError(f"extend: copy_from must be in [0, {spec.native_length}); got {opts.copy_from}")
        return opts

    def __init__(self, spec: ModelSpec, options):
        super().__init__(spec, options)
        native = spec.native_table  # (native, E): the learned rows, in the model's dtype
        if native is None:
            raise OptionError(
                "extend: the model's learned position table was not found (its adapter names the "
                "weight; a quantised or offloaded table cannot be stretched)"
            )
        if options.init == "copy":
            rows = copied_rows(native.detach(), options.length, options.copy_from)
        else:
            rows = interpolated_rows(native.detach(), options.length)
        self.table = nn.Parameter(rows)  # (length, E)

    def embed(self, position_ids, dtype):
        # position_ids (B, T) -> (B, T, E)
        if position_ids.numel() and int(position_ids.max()) >= self.options.length:
            raise LengthError(
                f"scheme 'extend' has a table of {self.options.length} positions; got position "
                f"{int(position_ids.max())} (convert with a larger length=)"
            )
        return nn.functional.embedding(position_ids.clamp(min=0), self.table).to(dtype)
