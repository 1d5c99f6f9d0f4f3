"""Falcon: rotary (``model.rotary_emb``) or, with ``config.alibi``, ALiBi built from the padding mask (added before
the 1/sqrt(d) score scaling; from transformers 5.25, or with a 4-D mask before it, into the mask itself). Each
``self_attention`` is swapped for ``RetrofitFalconAttention``: the same fused ``query_key_value`` (split as Falcon
lays it out: multi-query, grouped as in Falcon-40B's new decoder architecture, or one key/value per head),
``dense``, and q, k, v sent through the configured attention function. retrofit's mask reaches Falcon's model as
(B, 1, 1, kv) (``mask_dims``), so whatever it adds onto it, the attention reads back the padding alone. The rotary
variant's rotation is the neutralised rotary module's (an identity, or the original faded in); the ALiBi variant's
own tensor is not read. Revert puts the original modules back."""

from __future__ import annotations

import dataclasses

from torch import nn

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer
from .llama import native_rope
from .neutral import NeutralisedAttention, NeutralisedRotary, padding


class RetrofitFalconAttention(NeutralisedAttention):
    """Stands in for ``FalconAttention``: its projections, attention through the configured function."""

    family = "Falcon"

    def __init__(self, original: nn.Module, config, state):
        super().__init__(original, config, state)
        self.query_key_value, self.dense = original.query_key_value, original.dense
        drop = original.attention_dropout  # an nn.Dropout before transformers 5.25, its p since
        self.attention_dropout = drop.p if isinstance(drop, nn.Dropout) else float(drop)
        self.num_heads, self.head_dim, self.layer_idx = original.num_heads, original.head_dim, original.layer_idx
        self.layout = (
            "grouped" if original.new_decoder_architecture else "multi_query" if original.multi_query else "per_head"
        )
        self.groups = original.num_kv_heads  # key/value groups of the grouped layout
        # the new decoder architecture broadcasts each key/value group to its query heads (as Falcon's own code did)
        self.num_kv_heads = original.num_heads if original.new_decoder_architecture else original.num_kv_heads
        self.scaling = original.inv_norm_factor
        self.alibi = bool(config.alibi)

    def forward(self, hidden_states, alibi=None, attention_mask=None, position_ids=None, layer_past=None,
                use_cache=False, output_attentions=False, **kwargs):  # fmt: skip
        """``FalconAttention.forward``'s call: ``FalconDecoderLayer`` passes everything past ``hidden_states`` by
        keyword, ``position_embeddings`` (the last of them) among ``kwargs``; the positions before it keep theirs."""
        from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

        position_embeddings = kwargs.get("position_embeddings")

        self.calls += 1
        if self.alibi:
            self.native_alibi_not_faded()
        B, T, _ = hidden_states.shape
        q, k, v = (x.transpose(1, 2) for x in self.split(self.query_key_value(hidden_states)))  # (B, H*, T, D)
        if not self.alibi and position_embeddings is not None:  # the neutralised rotary: identity, or faded in
            q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if layer_past is not None:
            k, v = layer_past.update(k, v, self.layer_idx)
        mask = padding(attention_mask)  # (B, kv) or None
        out, weights = self.attend(q, k, v, mask, self.scaling, self.attention_dropout)  # (B, T, H, D)
        return self.dense(out.reshape(B, T, self.num_heads * self.head_dim)), weights

    def split(self, fused):
        """fused (B, T, width) -> q (B, T, H, D), k and v (B, T, Hkv, D): Falcon's layouts of ``query_key_value``
        (each group's queries then its key and value; H queries then one key and one value; per head q, k, v)."""
        B, T, _ = fused.shape
        if self.layout == "grouped":
            g = fused.view(B, T, self.groups, -1, self.head_dim)  # (B, T, groups, H / groups + 2, D)
            q = g[:, :, :, :-2].flatten(2, 3)
            k, v = (g[:, :, :, [i]].expand_as(g[:, :, :, :-2]).flatten(2, 3) for i in (-2, -1))
            return q, k, v
        if self.layout == "multi_query":
            return fused.view(B, T, self.num_heads + 2, self.head_dim).split([self.num_heads, 1, 1], dim=2)
        return fused.view(B, T, self.num_heads, 3, self.head_dim).unbind(3)


class FalconAdapter(Adapter):
    model_types = ("falcon",)
    native_kind = "rope"  # per model: "alibi" with config.alibi (set in __init__)
    native_alibi = {"scale_bias": True}  # Falcon adds ALiBi before the 1/sqrt(d) scaling (the probe's own options)
    attention_class_names = ("FalconAttention", "FalconFlashAttention2")
    lora_targets = ("query_key_value", "dense")
    mask_tensor = True  # FalconModel (transformers 5.25) adds ALiBi onto the mask: a tensor, never None
    mask_dims = 4  # (B, 1, 1, kv): the ALiBi it adds broadcasts per example (as Falcon's own 4-D masks)

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.native_kind = "alibi" if getattr(self.config, "alibi", False) else "rope"

    def check(self):
        for i, block in enumerate(self.base().h):
            name = type(block.self_attention).__name__
            if name not in self.attention_class_names + ("RetrofitFalconAttention",):
                raise UnsupportedArchitectureError(f"falcon: layer {i} attention is {name}")

    def attention_layers(self):
        return [AttentionLayer(i, block.self_attention) for i, block in enumerate(self.base().h)]

    def spec(self):
        """Keys and values as Falcon's attention shapes them: one per query head in the new decoder architecture
        (its groups broadcast), one for all heads with multi-query, else num_kv_heads."""
        c, spec = self.config, super().spec()
        kv = spec.num_heads if c.new_decoder_architecture else 1 if c.multi_query else c.num_kv_heads
        return dataclasses.replace(spec, num_kv_heads=kv)

    def native_max_length(self) -> int | None:
        return None  # rotary or ALiBi: the original runs at any length

    def native_rope(self):
        return None if self.native_kind == "alibi" else native_rope(self.config, self.base().rotary_emb)

    def neutralise(self, state):
        base = self.base()
        swaps = []
        if self.native_kind == "rope":
            swaps.append(self.swap(base, "rotary_emb", NeutralisedRotary(base.rotary_emb, state)))
        for block in base.h:
            sw = self.swap(block, "self_attention", RetrofitFalconAttention(block.self_attention, self.config, state))
            sw.freeze = False  # the stand-in trains the original's projections
            swaps.append(sw)
        return swaps
