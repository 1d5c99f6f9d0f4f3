"""GPT-NeoX / Pythia (Black et al., 2022): partial rotary (``rotary_pct`` -> ``partial_rotary_factor``)
from one ``gpt_neox.rotary_emb`` module, applied by each layer's attention to the first
``rotary_ndims`` dims of q and k only. Neutralising returns an identity rotation of those
dims, so replacing the rotary removes it from the rotated part and leaves the rest as it was."""

from __future__ import annotations

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer
from .llama import native_rope
from .neutral import NeutralisedRotary


class GPTNeoXAdapter(Adapter):
    model_types = ("gpt_neox",)
    native_kind = "rope"
    attention_class_names = ("GPTNeoXAttention",)
    lora_targets = ("query_key_value", "dense")

    def check(self):
        base = self.base()
        if not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
            raise UnsupportedArchitectureError("gpt_neox: expected gpt_neox.rotary_emb and gpt_neox.layers")
        super().check()

    def attention_layers(self):
        return [AttentionLayer(i, layer.attention) for i, layer in enumerate(self.base().layers)]

    def native_rope(self):
        return native_rope(self.config, self.base().rotary_emb)

    def neutralise(self, state):
        base = self.base()
        return [self.swap(base, "rotary_emb", NeutralisedRotary(base.rotary_emb, state))]
