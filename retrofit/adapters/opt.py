"""OPT (Zhang et al., 2022): learned absolute positions in ``model.decoder.embed_positions``, whose
row p + 2 holds position p (OPT's offset of 2), with positions counted over non-padding tokens.
The attention pre-scales the query and passes ``scaling=1.0``."""

from __future__ import annotations

import torch

from ..encodings.base import ModelSpec
from ..errors import UnsupportedArchitectureError
from .base import Adapter, AttentionSite, NeutralisedPositionTable, register_adapter


def opt_positions(attention_mask: torch.Tensor, past_key_values_length: int = 0, position_ids=None) -> torch.Tensor:
    """The positions ``OPTLearnedPositionalEmbedding.forward`` would look up (before its + 2)."""
    if position_ids is None:  # OPT's own rule: count real tokens; padding gets -1
        position_ids = (torch.cumsum(attention_mask, dim=1) * attention_mask - 1).long()
        position_ids = position_ids[:, past_key_values_length:]
    return position_ids


@register_adapter("opt")
class OPTAdapter(Adapter):
    name = "opt"
    model_types = ("opt",)
    native_kind = "learned_absolute"
    attention_class_names = ("OPTAttention",)

    def base(self):
        return self.model.base_model.decoder  # OPTForCausalLM.model (OPTModel).decoder

    def check(self):
        table = getattr(self.base(), "embed_positions", None)
        if table is None or getattr(table, "offset", None) != 2:
            raise UnsupportedArchitectureError("opt: expected decoder.embed_positions with OPT's offset of 2")
        for site in self.sites():
            if type(site.module).__name__ not in self.attention_class_names:
                raise UnsupportedArchitectureError(f"opt: unexpected attention class {type(site.module).__name__}")

    def sites(self):
        return [AttentionSite(i, layer.self_attn) for i, layer in enumerate(self.base().layers)]

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
        )

    def native_max_length(self):
        return self.config.max_position_embeddings

    def neutralise(self, state):
        base = self.base()
        table = NeutralisedPositionTable(base.embed_positions, state, positions=opt_positions, index_offset=2)
        return [self.swap(base, "embed_positions", table)]
