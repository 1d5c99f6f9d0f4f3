"""The LLaMA family: rotary decoders whose attention applies ``position_embeddings=(cos, sin)``
from one ``model.rotary_emb`` module (grouped-query attention and sliding windows included)."""

from __future__ import annotations

from ..errors import UnsupportedArchitectureError
from .base import Adapter, AttentionSite, NeutralisedRotary, register_adapter


def native_rope(config, rotary) -> dict:
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
    }


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
        if c.model_type == "qwen2" and not getattr(c, "use_sliding_window", False):
            return None
        return window

    def sites(self):
        return [AttentionSite(i, layer.self_attn, self._window(i)) for i, layer in enumerate(self.base().layers)]

    def native_rope(self):
        return native_rope(self.config, self.base().rotary_emb)

    def neutralise(self, state):
        base = self.base()
        return [self.swap(base, "rotary_emb", NeutralisedRotary(base.rotary_emb, state))]
