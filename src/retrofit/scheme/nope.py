"""NoPE: no positional signal at all (Haviv et al., 2022, "Transformer Language Models without
Positional Encodings Still Learn Positional Information"; Kazemnejad et al., 2023). The native
mechanism is removed and nothing replaces it: the causal mask alone carries order."""

from __future__ import annotations

from .kinds import NoneScheme


class NoPE(NoneScheme):
    table_words = "an all-zero"  # its native export's note (native_export/baked_table.py)
    fixed_because = "NoPE has no positional term at all"
    shift_invariant = True
