"""The LLaMA layout: rotary decoders whose attention applies ``position_embeddings=(cos, sin)``
from one ``model.rotary_emb`` module (grouped-query attention and sliding windows included).

Claimed by structure: any model whose base has a ``rotary_emb`` module and ``layers`` whose ``self_attn``
takes ``position_embeddings`` and calls transformers' attention interface (mixtral, phi3, gemma, ...), not
only the types listed in ``model_types`` (the ones this suite tests). A type claimed by structure is
converted only after the lossless probe (``retrofit.probe``) reproduced its logits."""

from __future__ import annotations

import functools
import inspect

from torch import nn

from ..errors import UnsupportedArchitectureError
from . import quirks
from .base import Adapter, AttentionSite, register_adapter
from .standins import NeutralisedRotary


def native_rope(config, rotary, interleaved: bool = False) -> dict:
    """The model's own rotary settings: transformers' standardised ``rope_parameters`` plus the
    module's actual frequencies (never guessed attribute names such as ``rope_theta``)."""
    params = dict(config.rope_parameters or {})
    if "rope_theta" not in params:  # nested per-layer-type parameters are not supported
        raise UnsupportedArchitectureError(f"{config.model_type}: unsupported rope_parameters layout {sorted(params)}")
    return {
        "theta": float(params["rope_theta"]),
        "fraction": float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0),
        "rope_type": params.get("rope_type", "default"),
        "inv_freq": rotary.original_inv_freq.detach().float().cpu().clone(),
        "attention_scaling": float(getattr(rotary, "attention_scaling", 1.0)),
        "interleaved": interleaved,  # GPT-J-style pairs (2i, 2i + 1)
    }


@functools.cache
def _on_attention_interface(cls: type) -> bool:
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in src and "position_embeddings" in src


def rotary_interface_layout(base) -> bool:
    """Is ``base`` the LLaMA layout: a ``rotary_emb`` module with its frequencies, and ``layers`` each with
    a ``self_attn`` that takes ``position_embeddings`` and calls the attention interface?"""
    rotary, layers = getattr(base, "rotary_emb", None), getattr(base, "layers", None)
    if not hasattr(rotary, "original_inv_freq") or not isinstance(layers, nn.ModuleList) or not len(layers):
        return False
    attns = [getattr(layer, "self_attn", None) for layer in layers]
    return all(a is not None and _on_attention_interface(type(a)) for a in attns)


@register_adapter("llama")
class LlamaAdapter(Adapter):
    name = "llama"
    model_types = ("llama", "mistral", "qwen2", "qwen3", "granite", "olmo", "olmo2", "starcoder2")
    native_kind = "rope"
    attention_class_names = (
        "LlamaAttention",
        "MistralAttention",
        "Qwen2Attention",
        "Qwen3Attention",
        "GraniteAttention",
        "OlmoAttention",
        "Olmo2Attention",
        "Starcoder2Attention",
    )
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    # the rope scheme rotates interleaved pairs (other schemes remove the rotary); layers without positions
    # (smollm3's no_rope_layers) stay without them
    handles = ("interleaved_rotary", "no_rope_layers")

    @classmethod
    def supports(cls, model) -> bool:
        return super().supports(model) or rotary_interface_layout(getattr(model, "base_model", None))

    def targets(self) -> tuple[str, ...]:
        """The attention's own linear layers (phi names its output ``dense``, not ``o_proj``)."""
        attn = self.base().layers[0].self_attn
        return tuple(n for n, m in attn.named_children() if isinstance(m, nn.Linear)) or self.lora_targets

    def check(self):
        base = self.base()
        if not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
            raise UnsupportedArchitectureError(f"{self.config.model_type}: expected model.rotary_emb and model.layers")
        super().check()

    def _window(self, i: int) -> int | None:
        c = self.config
        window = getattr(c, "sliding_window", None)
        if not window:
            return None
        layer_types = getattr(c, "layer_types", None)
        if layer_types is not None:
            return window if layer_types[i] == "sliding_attention" else None
        if getattr(c, "use_sliding_window", True) is False:  # qwen2 and its kin keep the field but switch it off
            return None
        return window

    def sites(self):
        rope = getattr(self.config, "no_rope_layers", None)  # 1: rotary, 0: no positions
        return [
            AttentionSite(i, layer.self_attn, self._window(i), positions=bool(rope[i]) if rope is not None else True)
            for i, layer in enumerate(self.base().layers)
        ]

    def native_rope(self):
        interleaved = "interleaved_rotary" in quirks.detect(self.model)
        return native_rope(self.config, self.base().rotary_emb, interleaved)

    def neutralise(self, state):
        base = self.base()
        return [self.swap(base, "rotary_emb", NeutralisedRotary(base.rotary_emb, state))]
