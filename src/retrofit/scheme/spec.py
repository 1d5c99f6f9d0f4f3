"""``ModelSpec``: what a scheme knows of the model it is installed in (an adapter fills it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """What a scheme needs to know about the model it is installed in (filled by the adapter)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    native_length: int  # positions the model was trained on
    native_kind: str  # "learned_absolute" | "rope" | "alibi"
    native_rope: dict | None = None  # {"theta", "fraction", "rope_type", "inv_freq" (tensor), "attention_scaling"}
    embedding_rms: float | None = (
        None  # RMS of the input token embeddings (filled by convert; absolute schemes scale to it)
    )
    # learned-absolute families: the native table's rows for positions 0 .. native - 1 (filled by convert)
    native_table: Any = field(default=None, compare=False, repr=False)
    # its attention sees the keys after the query (an encoder): a scheme with a learned table per offset keeps one
    # for each side (T5's bidirectional buckets)
    bidirectional: bool = False
