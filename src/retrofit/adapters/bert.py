"""The BERT layout: learned absolute positions in ``embeddings.position_embeddings`` added to the token (and
token-type) embeddings, ``encoder.layer[i].attention.self`` on transformers' attention interface. Its
direction is the module's own (``is_causal``: an encoder's attention sees every key, a ``...ForCausalLM``
decoder's the keys before the query): the attention call reads it, so one adapter serves both.

RoBERTa and its kin count positions from ``padding_idx + 1`` over the real tokens (position p at row
p + padding_idx + 1, padding at row padding_idx): the table's first row and the native length say so.
The embeddings read their own ``position_ids`` and ``token_type_ids`` buffers, one row per native
position: while converted they are longer, so an input past native reaches the new scheme.

Claimed by structure (bert, roberta, electra, xlm-roberta, camembert, ernie, ...): the types listed in
``model_types`` are the ones this suite tests; any other is converted after the lossless probe."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .base import Adapter, AttentionLayer, PositionTable, Swap, calls_attention_interface
from .neutral import NeutralisedPositionTable

LONG_BUFFERS = 1 << 16  # positions the embeddings' own buffers cover while converted (the native rows' 128x at 512)


def _layers(base):
    """The encoder's layers: BERT's ``encoder.layer``, DistilBERT's ``transformer.layer``, ALBERT's layers of
    every group (``encoder.albert_layer_groups[g].albert_layers``: one module each, run for every layer of its
    group, so one site serves them all with the same weights, as the model shares its own)."""
    for stack in ("encoder", "transformer"):
        layers = getattr(getattr(base, stack, None), "layer", None)
        if isinstance(layers, nn.ModuleList):
            return layers
    groups = getattr(getattr(base, "encoder", None), "albert_layer_groups", None)
    if isinstance(groups, nn.ModuleList):
        return nn.ModuleList([layer for g in groups for layer in getattr(g, "albert_layers", [])])
    return None


def _self_attention(layer) -> nn.Module | None:
    """A layer's self-attention module: BERT's ``attention.self``, DistilBERT's ``attention``."""
    attn = getattr(layer, "attention", None)
    return getattr(attn, "self", attn) if isinstance(attn, nn.Module) else None


def bert_layout(base) -> bool:
    """Is ``base`` the BERT layout: an ``embeddings.position_embeddings`` table and ``encoder.layer`` whose
    ``attention.self`` (DistilBERT: ``transformer.layer``, ``attention``) calls the attention interface?"""
    table = getattr(getattr(base, "embeddings", None), "position_embeddings", None)
    layers = _layers(base)
    if not isinstance(table, nn.Embedding) or not isinstance(layers, nn.ModuleList) or not len(layers):
        return False
    attns = [_self_attention(layer) for layer in layers]
    return all(a is not None and calls_attention_interface(type(a)) for a in attns)


class BertAdapter(Adapter):
    model_types = ("bert",)
    kin = ("roberta", "xlm-roberta", "electra", "distilbert", "albert")  # claimed by structure (tested: test_encoders)
    native_kind = "learned_absolute"
    attention_class_names = ("BertSelfAttention",)
    lora_targets = ("query", "key", "value", "dense")
    position_table = PositionTable("bert.embeddings.position_embeddings.weight", "max_position_embeddings")

    def __init__(self, model):
        super().__init__(model)
        prefix, first = model.base_model_prefix, self._first_row()
        key = f"{prefix}.embeddings.position_embeddings.weight" if prefix and hasattr(model, prefix) else None
        if key is None:  # the bare base model
            key = "embeddings.position_embeddings.weight"
        if (key, first) != (self.position_table.key, 0):  # roberta's kin: its prefix, its first row
            self.position_table = PositionTable(key, "max_position_embeddings", first)

    @classmethod
    def supports(cls, model) -> bool:
        return super().supports(model) or bert_layout(getattr(model, "base_model", None))

    def _first_row(self) -> int:
        """RoBERTa's kin keep ``padding_idx`` on their embeddings: position p sits at row p + padding_idx + 1."""
        pad = getattr(self.base().embeddings, "padding_idx", None)
        return 0 if pad is None else int(pad) + 1

    def spec(self):
        spec = super().spec()
        first = self._first_row()
        return (
            spec if not first else dataclasses.replace(spec, native_length=self.config.max_position_embeddings - first)
        )

    def native_max_length(self) -> int | None:
        return self.config.max_position_embeddings - self._first_row()

    def native_table(self):
        weight = self.base().embeddings.position_embeddings
        weight = getattr(weight, "weight", None)
        first = self._first_row()
        n = self.config.max_position_embeddings - first
        return None if weight is None else weight.detach()[first : first + n]

    def targets(self) -> tuple[str, ...]:
        return self.lora_targets

    def attention_layers(self):
        return [AttentionLayer(i, _self_attention(layer)) for i, layer in enumerate(_layers(self.base()))]

    def neutralise(self, state):
        emb = self.base().embeddings
        first = self._first_row()
        table = NeutralisedPositionTable(
            emb.position_embeddings, state, positions=lambda position_ids: position_ids - first, index_offset=first
        )
        swaps = [self.swap(emb, "position_embeddings", table)]
        n = max(LONG_BUFFERS, 4 * self.config.max_position_embeddings)
        for name, make in (
            ("position_ids", lambda: torch.arange(n)),
            ("token_type_ids", lambda: torch.zeros(n, dtype=torch.long)),
        ):
            old = getattr(emb, name, None)
            if isinstance(old, torch.Tensor):
                emb._buffers[name] = make().to(old.device).expand((1, -1))  # (1, n): the model's own, longer
                swaps.append(Swap(emb, name, old, freeze=False))
        return swaps
