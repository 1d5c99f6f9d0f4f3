"""MPT: ALiBi as its native mechanism, built by ``MptModel`` for ``max_seq_len`` keys (so the original cannot run
past it) and added inside ``MptAttention``, which has no attention-function dispatch. Each ``attn`` is swapped for
``RetrofitMptAttention``: the same fused ``Wqkv`` (clipped as ``clip_qkv`` says), ``out_proj`` and softmax scale,
with q, k, v sent through the configured attention function; MPT's own ALiBi tensor is not read. A source whose
ALiBi becomes another scheme, or ALiBi again with the options of the study; revert puts the originals back.

Its slopes are 2^(-8 i / n) over the next power of two of the heads, interleaved: exactly Press et al.'s for any head
count. transformers' ``MptModel`` always builds them so (``attn_config.alibi_bias_max`` and ``attn_config.alibi`` are
not read by it), and so does the stand-in's conversion."""

from __future__ import annotations

from torch import nn

from ..foundation.errors import UnsupportedArchitectureError
from .base import Adapter, AttentionLayer
from .neutral import NeutralisedAttention, padding


class RetrofitMptAttention(NeutralisedAttention):
    """Stands in for ``MptAttention``: its projections, attention through the configured function."""

    family = "MPT"

    def __init__(self, original: nn.Module, config, state):
        super().__init__(original, config, state)
        self.Wqkv, self.out_proj = original.Wqkv, original.out_proj
        self.num_heads, self.head_dim, self.layer_idx = original.n_heads, original.head_dim, original.layer_idx
        self.scaling, self.clip_qkv, self.dropout = original.softmax_scale, original.clip_qkv, original.attn_dropout_p

    def forward(self, hidden_states, position_bias=None, cache=None, attention_mask=None, **kwargs):
        self.calls += 1
        self.native_alibi_not_faded()
        B, T, _ = hidden_states.shape
        qkv = self.Wqkv(hidden_states)  # (B, T, 3E)
        if self.clip_qkv:
            qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
        q, k, v = (x.reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=2))
        cache = cache if cache is not None else kwargs.get("past_key_values")  # its name before transformers 5.24
        if cache is not None:  # (B, H, T, D) each
            k, v = cache.update(k, v, self.layer_idx)
        mask = padding(attention_mask)  # the all-real mask MPT needs a tensor for (``Adapter.mask_tensor``): None
        out, weights = self.attend(q, k, v, mask, self.scaling, self.dropout)  # (B, T, H, D)
        return self.out_proj(out.reshape(B, T, self.num_heads * self.head_dim)), weights


class MptAdapter(Adapter):
    model_types = ("mpt",)
    native_kind = "alibi"
    attention_class_names = ("MptAttention",)
    lora_targets = ("Wqkv", "out_proj")
    mask_tensor = True  # MptModel calls .to(torch.bool) on the mask: an all-real one instead of None

    def check(self):
        for i, block in enumerate(self.base().blocks):
            name = type(block.attn).__name__
            if name not in self.attention_class_names + ("RetrofitMptAttention",):
                raise UnsupportedArchitectureError(f"mpt: layer {i} attention is {name}")

    def attention_layers(self):
        return [AttentionLayer(i, block.attn) for i, block in enumerate(self.base().blocks)]

    def neutralise(self, state):
        swaps = []
        for block in self.base().blocks:
            sw = self.swap(block, "attn", RetrofitMptAttention(block.attn, self.config, state))
            sw.freeze = False  # the stand-in trains the original's projections
            swaps.append(sw)
        return swaps
