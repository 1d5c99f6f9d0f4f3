"""Learned-absolute families keep their own architecture: the position table holds the scheme's values
(all zeros for NoPE, the fixed sinusoids for ``sinusoidal``, the stretched table's rows for ``extend``),
enlarged to ``max_length`` rows. The export's note names the table and how to get a longer one; a scheme exported
so may say both in its own words (class attributes ``table_words``, ``longer_table``: ``nope``'s, ``extend``'s), else
``TABLE_WORDS`` and ``LONGER_TABLE``."""

from __future__ import annotations

import torch

from ..adapters import ADAPTERS
from ..foundation.errors import RetrofitError
from ..patch.conversion import scheme_of
from .base import Built, Surgery, plain_config

TABLE_WORDS = "a fixed {name}"  # the table in the export's note, unless the scheme says it (nope: "an all-zero")
LONGER_TABLE = "re-export with a larger max_length (--max-length)"  # how to get a longer one, unless the scheme says


def baked_table(model, info, opts) -> Built:
    """A learned-absolute family keeps its own architecture; its position table is replaced by the scheme's
    values at positions 0..max_length-1: all zeros for NoPE, the (scaled) sinusoids for ``sinusoidal``, the
    learned rows for ``extend``."""
    table = ADAPTERS.get(info["architecture"])(model).position_table  # this model's: roberta's prefix and offset
    key, size_attr, first = table.key, table.size_attr, table.first_row
    cfg = plain_config(model)
    rows = model.state_dict()[key].shape[0]  # the native table, kept in the converted model under its name
    uncounted = rows - getattr(cfg, size_attr)  # rows its config does not count (OPT's offset; RoBERTa counts its own)
    setattr(cfg, size_attr, opts["max_length"] + first - uncounted)
    dst = type(model)(cfg).to(dtype=model.dtype).eval()
    cut = Surgery(dst)
    src_sd = {k: v for k, v in model.state_dict().items() if not k.startswith("retrofit_positions.")}
    dst_params = dict(dst.named_parameters())
    if key not in dst_params:
        raise RetrofitError(f"export: {type(dst).__name__} has no position table {key!r}")
    for name, p in dst_params.items():
        if name == key:
            cut(p, _table_rows(model, info, p, first), name)
        elif name in src_sd:
            cut(p, src_sd[name], name)
    scheme = scheme_of(model)
    what = getattr(scheme, "table_words", TABLE_WORDS.format(name=scheme.name))
    note = (
        f"{type(dst).__name__} with {what} position table of {opts['max_length']} positions: longer inputs do "
        f"not fit the table; {getattr(scheme, 'longer_table', LONGER_TABLE)}"
    )
    return Built(cut.finish(model), exact=True, notes=[note], limit=opts["max_length"])


def _table_rows(model, info, table: torch.Tensor, first: int) -> torch.Tensor:
    """(rows, E) table whose row ``first + p`` holds the scheme's embedding of position p."""
    rows = torch.zeros_like(table)
    if info["scheme"] == "nope":
        return rows
    scheme = scheme_of(model)
    pos = torch.arange(rows.shape[0] - first, device=table.device)[None]  # (1, max_length)
    with torch.no_grad():
        rows[first:] = scheme.embed(pos, torch.float32)[0].to(rows.dtype)
    if first:  # rows before position 0 (OPT's padding offset) are never looked up for real tokens
        rows[:first] = 0
    return rows
