"""GPTBigCode (StarCoder 1, SantaCoder): learned absolute positions (``transformer.wpe``) as GPT-2, with
``nn.Linear`` projections (not Conv1D) and multi-query attention (one key/value head) when
``config.multi_query``."""

from __future__ import annotations

import dataclasses

from ..errors import UnsupportedArchitectureError
from .base import Adapter, AttentionSite, PositionTable, register_adapter
from .standins import NeutralisedPositionTable


@register_adapter("gpt_bigcode")
class GPTBigCodeAdapter(Adapter):
    name = "gpt_bigcode"
    model_types = ("gpt_bigcode",)
    native_kind = "learned_absolute"
    attention_class_names = ("GPTBigCodeAttention",)
    lora_targets = ("c_attn", "c_proj", "c_fc")
    position_table = PositionTable("transformer.wpe.weight", "max_position_embeddings")

    def check(self):
        if getattr(self.config, "add_cross_attention", False):
            raise UnsupportedArchitectureError(
                "gpt_bigcode with cross-attention (encoder-decoder use) is not supported"
            )
        super().check()

    def spec(self):
        """Multi-query attention: one key/value head (the config has no ``num_key_value_heads``)."""
        spec = super().spec()
        return dataclasses.replace(spec, num_kv_heads=1) if getattr(self.config, "multi_query", False) else spec

    def sites(self):
        return [AttentionSite(i, block.attn) for i, block in enumerate(self.base().h)]

    def neutralise(self, state):
        base = self.base()
        table = NeutralisedPositionTable(base.wpe, state, positions=lambda position_ids: position_ids)
        return [self.swap(base, "wpe", table)]
