"""GPT-2: learned absolute positions (``transformer.wpe``), fused c_attn, Conv1D."""

from __future__ import annotations

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer, PositionTable
from .neutral import NeutralisedPositionTable


class GPT2Adapter(Adapter):
    model_types = ("gpt2",)
    native_kind = "learned_absolute"
    attention_class_names = ("GPT2Attention",)
    lora_targets = ("c_attn", "c_proj", "c_fc")
    fan_in_fan_out = True  # Conv1D
    position_table = PositionTable("transformer.wpe.weight", "n_positions")

    def check(self):
        if getattr(self.config, "add_cross_attention", False):
            raise UnsupportedArchitectureError(
                f"{self.config.model_type} with cross-attention (encoder-decoder use) is not supported"
            )
        super().check()

    def attention_layers(self):
        return [AttentionLayer(i, block.attn) for i, block in enumerate(self.base().h)]

    def neutralise(self, state):
        base = self.base()
        table = NeutralisedPositionTable(base.wpe, state, positions=lambda position_ids: position_ids)
        return [self.swap(base, "wpe", table)]
