"""GPTBigCode (StarCoder 1, SantaCoder): GPT-2's layout (learned absolute positions in ``transformer.wpe``)
with ``nn.Linear`` projections (not Conv1D) and multi-query attention (one key/value head) when
``config.multi_query``."""

from __future__ import annotations

import dataclasses

from .base import PositionTable
from .gpt2 import GPT2Adapter


class GPTBigCodeAdapter(GPT2Adapter):
    model_types = ("gpt_bigcode",)
    attention_class_names = ("GPTBigCodeAttention",)
    fan_in_fan_out = False  # nn.Linear
    position_table = PositionTable("transformer.wpe.weight", "max_position_embeddings")

    def spec(self):
        """Multi-query attention: one key/value head (the config has no ``num_key_value_heads``)."""
        spec = super().spec()
        return dataclasses.replace(spec, num_kv_heads=1) if getattr(self.config, "multi_query", False) else spec
