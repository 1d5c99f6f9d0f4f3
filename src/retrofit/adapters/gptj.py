"""GPT-J and CodeGen: interleaved partial rotary (pairs (2i, 2i + 1) of the first ``rotary_dim`` dims of each
head) from one ``transformer.rotary_emb`` module that returns ``(sin, cos)`` read from a fixed table of
``max_position_embeddings`` rows, so the original cannot run past that length; attention on transformers'
interface."""

from __future__ import annotations

import torch

from ..foundation.errors import UnsupportedArchitectureError
from ..foundation.native import native_length
from .base import Adapter, AttentionLayer
from .neutral import NeutralisedSinCos


def gptj_inv_freq(rotary_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """The frequencies of GPT-J's ``create_sinusoidal_positions``, with its integer arange: (rotary_dim / 2,)."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64) / rotary_dim))


class GPTJAdapter(Adapter):
    model_types = ("gptj", "codegen")
    native_kind = "rope"
    attention_class_names = ("GPTJAttention", "CodeGenAttention")
    lora_targets = ("q_proj", "k_proj", "v_proj", "out_proj")  # GPT-J's; ``targets`` reads CodeGen's fused qkv_proj

    def check(self):
        if not getattr(self.config, "rotary_dim", None):
            raise UnsupportedArchitectureError(
                f"{self.config.model_type}: rotary_dim is not set (its rotary table would span the whole hidden size)"
            )
        if not hasattr(self.base(), "rotary_emb"):
            raise UnsupportedArchitectureError(
                f"{self.config.model_type}: expected transformer.rotary_emb (one rotary module, as transformers 5.24 "
                "builds GPT-J and CodeGen; older releases rotate inside the attention: upgrade transformers)"
            )
        super().check()

    def targets(self) -> tuple[str, ...]:
        attn = self.base().h[0].attn
        return tuple(n for n, m in attn.named_children() if isinstance(m, torch.nn.Linear)) or self.lora_targets

    def attention_layers(self):
        return [AttentionLayer(i, block.attn) for i, block in enumerate(self.base().h)]

    def native_rope(self):
        rot, head_dim = self.config.rotary_dim, self.config.n_embd // self.config.n_head
        return {
            "theta": 10000.0,
            "fraction": rot / head_dim,
            "rope_type": "default",
            "inv_freq": gptj_inv_freq(rot).float(),
            "attention_scaling": 1.0,
            "interleaved": True,
        }

    def native_max_length(self) -> int | None:
        """The original reads its rotation from a table: it cannot run past that many positions."""
        return native_length(self.config)

    def neutralise(self, state):
        base = self.base()
        inv_freq = self.native_rope()["inv_freq"]
        return [self.swap(base, "rotary_emb", NeutralisedSinCos(base.rotary_emb, state, inv_freq))]
