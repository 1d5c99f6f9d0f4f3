"""OPT (Zhang et al., 2022): learned absolute positions in ``model.decoder.embed_positions``, whose
row p + 2 holds position p (OPT's offset of 2), with positions counted over non-padding tokens.
The attention pre-scales the query and passes ``scaling=1.0``."""

from __future__ import annotations

import torch

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionSite, PositionTable, register_adapter
from .standins import NeutralisedPositionTable


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
    lora_targets = ("q_proj", "k_proj", "v_proj", "out_proj")
    position_table = PositionTable("model.decoder.embed_positions.weight", "max_position_embeddings", first_row=2)

    def base(self):
        return self.model.base_model.decoder  # OPTForCausalLM.model (OPTModel).decoder

    def check(self):
        table = getattr(self.base(), "embed_positions", None)
        first = self.position_table.first_row
        if table is None or getattr(table, "offset", None) != first:
            raise UnsupportedArchitectureError(f"opt: expected decoder.embed_positions with OPT's offset of {first}")
        super().check()

    def sites(self):
        return [AttentionSite(i, layer.self_attn) for i, layer in enumerate(self.base().layers)]

    def neutralise(self, state):
        base = self.base()
        table = NeutralisedPositionTable(
            base.embed_positions, state, positions=opt_positions, index_offset=self.position_table.first_row
        )
        return [self.swap(base, "embed_positions", table)]
