"""NoPE: no positional signal at all (Haviv et al., 2022, "Transformer Language Models without
Positional Encodings Still Learn Positional Information"; Kazemnejad et al., 2023). The native
mechanism is removed and nothing replaces it: the causal mask alone carries order."""

from __future__ import annotations

from .base import Scheme, register_scheme


@register_scheme("nope")
class NoPE(Scheme):
    name = "nope"
    shift_invariant = True
    kind = "none"
