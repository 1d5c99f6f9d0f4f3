"""BLOOM: ALiBi as its native mechanism, built by ``BloomModel`` from the padding mask (slope_h x the key's
position over real tokens) and added inside ``BloomAttention``, which has no attention-function dispatch. Each
``self_attention`` is swapped for ``RetrofitBloomAttention``: the same fused ``query_key_value`` (heads
interleaved as BLOOM stores them), ``dense`` and residual dropout, with q, k, v sent through the configured
attention function; BLOOM's own ALiBi tensor is not read. A source whose ALiBi becomes another scheme, or
ALiBi again with the options of the study; revert puts the original modules back."""

from __future__ import annotations

import dataclasses

from torch import nn

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer
from .neutral import NeutralisedAttention

TRAINED_LENGTH = 2048  # BLOOM's training sequence length (Scao et al., 2022); its config has no length key


class RetrofitBloomAttention(NeutralisedAttention):
    """Stands in for ``BloomAttention``: its projections, attention through the configured function."""

    family = "BLOOM"

    def __init__(self, original: nn.Module, config, state):
        super().__init__(original, config, state)
        self.query_key_value, self.dense, self.attention_dropout = (
            original.query_key_value,
            original.dense,
            original.attention_dropout,
        )
        self.num_heads, self.head_dim, self.layer_idx = original.num_heads, original.head_dim, original.layer_idx
        self.scaling, self.hidden_dropout = original.inv_norm_factor, original.hidden_dropout

    def forward(self, hidden_states, residual, alibi=None, attention_mask=None, layer_past=None, **kwargs):
        from transformers.models.bloom.modeling_bloom import dropout_add

        self.calls += 1
        self.native_alibi_not_faded()
        B, T, _ = hidden_states.shape
        q, k, v = self.original._reshape(self.query_key_value(hidden_states))  # (B, H, T, D) each
        if layer_past is not None:
            k, v = layer_past.update(k, v, self.layer_idx)
        out, weights = self.attend(q, k, v, attention_mask, self.scaling, self.attention_dropout.p)  # (B, T, H, D)
        out = self.dense(out.reshape(B, T, self.num_heads * self.head_dim))
        return dropout_add(out, residual, self.hidden_dropout, self.training), weights


class BloomAdapter(Adapter):
    model_types = ("bloom",)
    native_kind = "alibi"
    attention_class_names = ("BloomAttention",)
    lora_targets = ("query_key_value", "dense")

    def check(self):
        if getattr(self.config, "pretraining_tp", 1) > 1 and getattr(self.config, "slow_but_exact", False):
            raise UnsupportedArchitectureError("bloom with slow_but_exact tensor-parallel output is not supported")
        for i, block in enumerate(self.base().h):
            name = type(block.self_attention).__name__
            if name not in self.attention_class_names + ("RetrofitBloomAttention",):
                raise UnsupportedArchitectureError(f"bloom: layer {i} attention is {name}")

    def attention_layers(self):
        return [AttentionLayer(i, block.self_attention) for i, block in enumerate(self.base().h)]

    def spec(self):
        """The native length: the config's if it names one (a converted checkpoint's), else BLOOM's 2,048."""
        spec = super().spec()
        return spec if spec.native_length else dataclasses.replace(spec, native_length=TRAINED_LENGTH)

    def native_max_length(self) -> int | None:
        return None  # ALiBi: no table, the original runs at any length

    def neutralise(self, state):
        swaps = []
        for block in self.base().h:
            sw = self.swap(block, "self_attention", RetrofitBloomAttention(block.self_attention, self.config, state))
            sw.freeze = False  # the stand-in trains the original's projections
            swaps.append(sw)
        return swaps
