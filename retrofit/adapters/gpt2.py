"""GPT-2: learned absolute positions (``transformer.wpe``), fused c_attn, Conv1D."""

from __future__ import annotations

from ..errors import UnsupportedArchitectureError
from ..encodings.base import ModelSpec
from .base import Adapter, AttentionSite, NeutralisedPositionTable, register_adapter


@register_adapter("gpt2")
class GPT2Adapter(Adapter):
    name = "gpt2"
    model_types = ("gpt2",)
    native_kind = "learned_absolute"
    attention_class_names = ("GPT2Attention",)

    def check(self):
        if getattr(self.config, "add_cross_attention", False):
            raise UnsupportedArchitectureError("gpt2 with cross-attention (encoder-decoder use) is not supported")

    def sites(self):
        return [AttentionSite(i, block.attn) for i, block in enumerate(self.base().h)]

    def spec(self):
        c = self.config
        return ModelSpec(
            num_layers=c.n_layer,
            num_heads=c.n_head,
            num_kv_heads=c.n_head,
            head_dim=c.n_embd // c.n_head,
            hidden_size=c.n_embd,
            native_length=c.n_positions,
            native_kind=self.native_kind,
        )

    def native_max_length(self):
        return self.config.n_positions

    def neutralise(self, state):
        base = self.base()
        table = NeutralisedPositionTable(base.wpe, state, positions=lambda position_ids: position_ids)
        return [self.swap(base, "wpe", table)]
