"""The OPT layout: learned absolute positions in a decoder's ``embed_positions`` table (an ``nn.Embedding``)
added to the token embeddings, and ``layers`` whose ``self_attn`` calls transformers' attention interface.
A table of fixed sinusoids in the same place (transformers' ``...SinusoidalPositionalEmbedding``: Marian, Pegasus)
is a ``sinusoidal`` native kind: not learned, and ``sinusoidal`` reproduces it (the probe checks it does).

OPT's table stores position p at row p + 2 (its ``offset`` of 2) and counts positions over the real tokens.
The table sits on ``model.decoder`` (OPT) or on the base model itself (BioGPT); its row of position 0 is the
module's own ``offset`` (0 without one), its key the model's own parameter name.

Claimed by structure: any model of this layout (biogpt, ...), not only the types listed in ``model_types``
(the ones this suite tests by name); a type claimed by structure is converted only after the lossless probe
(``retrofit.patch.probe``) reproduced its logits."""

from __future__ import annotations

import dataclasses
import inspect

import torch
from torch import nn

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer, PositionTable, calls_attention_interface
from .neutral import NeutralisedPositionTable


def opt_positions(attention_mask: torch.Tensor, past_key_values_length: int = 0, position_ids=None) -> torch.Tensor:
    """The positions ``OPTLearnedPositionalEmbedding.forward`` would look up (before its + 2)."""
    if position_ids is None:  # OPT's own rule: count real tokens; padding gets -1
        position_ids = (torch.cumsum(attention_mask, dim=1) * attention_mask - 1).long()
        position_ids = position_ids[:, past_key_values_length:]
    return position_ids


def counted_positions(shape_of, past_key_values_length: int = 0, position_ids=None) -> torch.Tensor:
    """The positions a table called with the input ids (or their shape) looks up: ``past + arange(T)`` per row."""
    if position_ids is not None:
        return position_ids
    batch, length = tuple(shape_of.shape if isinstance(shape_of, torch.Tensor) else shape_of)[:2]
    past = int(past_key_values_length)
    return torch.arange(past, past + length).expand(batch, -1)


# the table's first argument -> how its call turns into positions
POSITION_RULES = {"attention_mask": opt_positions, "input_ids": counted_positions, "input_ids_shape": counted_positions}


def table_rule(table: nn.Module):
    """The positions rule of a table's call (read from its first argument's name), or None for a call it does not
    know."""
    try:
        first = next(iter(inspect.signature(table.forward).parameters), None)
    except (TypeError, ValueError):
        return None
    return POSITION_RULES.get(first)


def own_table(decoder: nn.Module | None) -> nn.Module | None:
    """The decoder's position table: the original one while a stand-in holds its place (a converted model)."""
    table = getattr(decoder, "embed_positions", None)
    return getattr(table, "original", table)


def decoder_of(base: nn.Module | None) -> nn.Module | None:
    """Where the table and the layers live: ``base.decoder`` (OPT), else the base model itself (BioGPT)."""
    decoder = getattr(base, "decoder", None)
    return decoder if isinstance(decoder, nn.Module) else base


def learned_table_layout(base) -> bool:
    """Is ``base`` the OPT layout: a decoder with an ``embed_positions`` table (an ``nn.Embedding`` whose call this
    module reads) and ``layers`` whose ``self_attn`` calls the attention interface?"""
    decoder = decoder_of(base)
    table, layers = own_table(decoder), getattr(decoder, "layers", None)
    if not isinstance(table, nn.Embedding) or table_rule(table) is None:
        return False
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        return False
    attns = [getattr(layer, "self_attn", None) for layer in layers]
    return all(isinstance(a, nn.Module) and calls_attention_interface(type(a)) for a in attns)


class OPTAdapter(Adapter):
    model_types = ("opt",)
    native_kind = "learned_absolute"
    attention_class_names = ("OPTAttention",)
    lora_targets = ("q_proj", "k_proj", "v_proj", "out_proj")
    position_table = PositionTable("model.decoder.embed_positions.weight", "max_position_embeddings", first_row=2)

    def __init__(self, model):
        super().__init__(model)
        table = own_table(self.base())
        weight = getattr(table, "weight", None)
        key = next((n for n, p in model.named_parameters(remove_duplicate=False) if p is weight), None)
        first = int(getattr(table, "offset", 0) or 0)
        if key is not None and (key, first) != (self.position_table.key, self.position_table.first_row):
            self.position_table = PositionTable(key, "max_position_embeddings", first)  # this model's own
        if "Sinusoidal" in type(table).__name__:  # a fixed sinusoid table (Marian's, Pegasus's), not learned rows
            self.native_kind = "sinusoidal"

    @classmethod
    def supports(cls, model) -> bool:
        return super().supports(model) or learned_table_layout(getattr(model, "base_model", None))

    def base(self):
        return decoder_of(self.model.base_model)  # OPTForCausalLM.model (OPTModel).decoder; BioGptModel itself

    def check(self):
        table = own_table(self.base())
        first = self.position_table.first_row
        if table is None or int(getattr(table, "offset", 0) or 0) != first or table_rule(table) is None:
            raise UnsupportedArchitectureError(
                f"{self.config.model_type}: expected decoder.embed_positions, a table with its first row at {first}"
            )
        super().check()

    def targets(self) -> tuple[str, ...]:
        """The attention's own linear layers (OPT's and BioGPT's: q_proj, k_proj, v_proj, out_proj)."""
        attn = self.base().layers[0].self_attn
        return tuple(n for n, m in attn.named_children() if isinstance(m, nn.Linear)) or self.lora_targets

    def attention_layers(self):
        return [AttentionLayer(i, layer.self_attn) for i, layer in enumerate(self.base().layers)]

    def spec(self):
        """Read off the decoder's own modules where they say it: a decoder beside an encoder (BART's kin) has its
        own layer and head counts, while its config's standard names map to the encoder's."""
        spec, attn = super().spec(), self.base().layers[0].self_attn
        heads, head_dim = getattr(attn, "num_heads", None), getattr(attn, "head_dim", None)
        if not isinstance(heads, int) or not isinstance(head_dim, int):
            return spec
        return dataclasses.replace(
            spec, num_layers=len(self.base().layers), num_heads=heads, num_kv_heads=heads, head_dim=head_dim
        )

    def neutralise(self, state):
        base = self.base()
        rule = table_rule(base.embed_positions)
        table = NeutralisedPositionTable(
            base.embed_positions, state, positions=rule, index_offset=self.position_table.first_row
        )
        return [self.swap(base, "embed_positions", table)]
