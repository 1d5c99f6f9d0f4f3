"""GPT-Neo (Black et al., 2021): learned absolute positions (``transformer.wpe``), layers that alternate
global and local attention (``config.attention_layers``; a local layer sees the last
``config.window_size`` keys), and no 1/sqrt(d) score scaling.

transformers' GPT-Neo attention has no attention-function dispatch (it computes eager attention in
``GPTNeoSelfAttention._attn``), so each ``attn.attention`` is swapped for ``RetrofitGPTNeoAttention``:
a stand-in that reuses the original's projections (same parameters, same state-dict keys) and sends
q, k, v through the configured attention function with ``scaling=1.0`` and the layer's window.
Revert puts the original modules back."""

from __future__ import annotations

from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer, PositionTable
from .neutral import NeutralisedPositionTable


class RetrofitGPTNeoAttention(nn.Module):
    """Stands in for ``GPTNeoSelfAttention``: the same projections, attention through
    ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` (the registered ``"retrofit"``)."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.config = original.config
        self.layer_id, self.attention_type = original.layer_id, original.attention_type
        self.num_heads, self.head_dim = original.num_heads, original.head_dim
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (
            original.k_proj,
            original.v_proj,
            original.q_proj,
            original.out_proj,
        )
        self.attn_dropout, self.resid_dropout = original.attn_dropout, original.resid_dropout
        self.calls = 0

    def forward(
        self, hidden_states, attention_mask=None, layer_past=None, use_cache=False, output_attentions=False, **kwargs
    ):
        self.calls += 1
        B, T, _ = hidden_states.shape

        def split(x):
            return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)

        query, key, value = (
            split(self.q_proj(hidden_states)),
            split(self.k_proj(hidden_states)),
            split(self.v_proj(hidden_states)),
        )
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_id)
        attend = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        out, weights = attend(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=1.0,  # GPT-Neo does not scale its scores
            dropout=self.attn_dropout.p if self.training else 0.0,
        )  # (B, T, H, D)
        out = self.resid_dropout(self.out_proj(out.reshape(B, T, self.num_heads * self.head_dim)))
        return out, weights


class GPTNeoAdapter(Adapter):
    model_types = ("gpt_neo",)
    native_kind = "learned_absolute"
    attention_class_names = ("GPTNeoSelfAttention",)
    lora_targets = ("q_proj", "k_proj", "v_proj", "out_proj")
    position_table = PositionTable("transformer.wpe.weight", "max_position_embeddings")

    def check(self):
        for i, block in enumerate(self.base().h):
            inner = block.attn.attention
            if type(inner).__name__ not in self.attention_class_names + ("RetrofitGPTNeoAttention",):
                raise UnsupportedArchitectureError(
                    f"gpt_neo: layer {i} attention is {type(inner).__name__} (flash-attention models are not supported; "
                    "load with attn_implementation='eager')"
                )

    def attention_layers(self):
        c = self.config
        return [
            AttentionLayer(i, block.attn.attention, c.window_size if c.attention_layers[i] == "local" else None)
            for i, block in enumerate(self.base().h)
        ]

    def neutralise(self, state):
        base = self.base()
        swaps = [
            self.swap(
                base, "wpe", NeutralisedPositionTable(base.wpe, state, positions=lambda position_ids: position_ids)
            )
        ]
        for block in base.h:
            sw = self.swap(block.attn, "attention", RetrofitGPTNeoAttention(block.attn.attention))
            sw.freeze = False  # the stand-in trains the original's projections
            swaps.append(sw)
        return swaps
