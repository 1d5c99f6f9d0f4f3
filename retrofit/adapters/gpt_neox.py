"""GPT-NeoX / Pythia (Black et al., 2022): partial rotary (``rotary_pct`` -> ``partial_rotary_factor``)
from one ``gpt_neox.rotary_emb`` module, applied by each layer's attention to the first
``rotary_ndims`` dims of q and k only. Neutralising returns an identity rotation of those
dims, so replacing the rotary removes it from the rotated part and leaves the rest as it was."""

from __future__ import annotations

from ..encodings.base import ModelSpec
from ..errors import UnsupportedArchitectureError
from .base import Adapter, AttentionSite, NeutralisedRotary, register_adapter
from .llama import native_rope


@register_adapter("gpt_neox")
class GPTNeoXAdapter(Adapter):
    name = "gpt_neox"
    model_types = ("gpt_neox",)
    native_kind = "rope"
    attention_class_names = ("GPTNeoXAttention",)

    def check(self):
        base = self.base()
        if not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
            raise UnsupportedArchitectureError("gpt_neox: expected gpt_neox.rotary_emb and gpt_neox.layers")
        for site in self.sites():
            if type(site.module).__name__ not in self.attention_class_names:
                raise UnsupportedArchitectureError(f"gpt_neox: unexpected attention class {type(site.module).__name__}")

    def sites(self):
        return [AttentionSite(i, layer.attention) for i, layer in enumerate(self.base().layers)]

    def spec(self):
        c = self.config
        return ModelSpec(
            num_layers=c.num_hidden_layers,
            num_heads=c.num_attention_heads,
            num_kv_heads=c.num_attention_heads,
            head_dim=c.hidden_size // c.num_attention_heads,
            hidden_size=c.hidden_size,
            native_length=c.max_position_embeddings,
            native_kind=self.native_kind,
            native_rope=native_rope(c, self.base().rotary_emb),
        )

    def neutralise(self, state):
        base = self.base()
        return [self.swap(base, "rotary_emb", NeutralisedRotary(base.rotary_emb, state))]
