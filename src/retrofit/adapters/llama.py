"""The LLaMA layout: rotary decoders whose attention applies ``position_embeddings=(cos, sin)``
from one ``model.rotary_emb`` module (grouped-query attention and sliding windows included).

Claimed by structure: any model whose base has a ``rotary_emb`` module and ``layers`` whose attention
(``self_attn`` or ``attn``; a hybrid's other layers hold no positions) takes ``position_embeddings`` and calls transformers' attention interface (mixtral, phi3, gemma, ...), not
only the types listed in ``model_types`` (the ones this suite tests). A type claimed by structure is
converted only after the lossless probe (``retrofit.patch.probe``) reproduced its logits."""

from __future__ import annotations

import dataclasses

from torch import nn

from ..foundation.errors import UnsupportedArchitectureError
from . import quirks
from .base import Adapter, AttentionLayer, calls_attention_interface
from .neutral import NeutralisedRotary


def native_rope(config, rotary, interleaved: bool = False, reversed_: bool = False) -> dict:
    """The model's own rotary settings: transformers' standardised ``rope_parameters`` plus the
    module's actual frequencies (never guessed attribute names such as ``rope_theta``).

    A model with rope parameters per layer type (gemma3's sliding and global layers): the global type's
    settings (``full_attention``), plus ``by_layer_type`` {type: its settings} and ``layer_types`` (one type
    per layer), read from the module's ``{type}_original_inv_freq``; the rope scheme keeps the other types'
    rotation as it is and applies its options to the global layers."""
    params = dict(config.rope_parameters or {})
    if "rope_theta" in params:
        return _one_rope(params, config, rotary.original_inv_freq, getattr(rotary, "attention_scaling", 1.0)) | {
            "interleaved": interleaved,
            "reversed": reversed_,
        }
    types, used = list(getattr(config, "layer_types", None) or []), _typed_ropes(rotary, config)
    if not used:
        raise UnsupportedArchitectureError(f"{config.model_type}: unsupported rope_parameters layout {sorted(params)}")
    per = {
        t: _one_rope(
            params[t], config, getattr(rotary, f"{t}_original_inv_freq"), getattr(rotary, f"{t}_attention_scaling", 1.0)
        )
        | {"interleaved": interleaved, "reversed": reversed_}
        for t in used
    }
    main = "full_attention" if "full_attention" in per else sorted(per)[0]
    return {**per[main], "main_type": main, "by_layer_type": per, "layer_types": types}


def _one_rope(params: dict, config, inv_freq, attention_scaling) -> dict:
    split = getattr(config, "qk_rope_head_dim", None)  # MLA: the rotary part is split off and sits last in a head
    if split:
        return {
            # DeepSeek's attention scale holds a temperature of its own native YaRN (mscale_all_dim): kept as is
            # unchanged, refused when the rotation is rescaled (``RoPE``)
            "own_temperature": float(params.get("mscale_all_dim") or 0.0),
            "theta": float(params["rope_theta"]),
            "fraction": 1.0,  # of the rotary part: it all rotates
            "rot_dims": int(split),
            "at_end": True,
            "rope_type": params.get("rope_type", "default"),
            "inv_freq": inv_freq.detach().float().cpu().clone(),
            "attention_scaling": float(attention_scaling),
        }
    fraction = float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    extra = {}
    if 2 * len(inv_freq) == head_dim and int(head_dim * fraction) != head_dim:
        # "proportional" rope: every dim has a frequency, those past the fraction 0 (they stay put): the rope
        # scheme rotates all dims and keeps the zero frequencies zero whatever its options
        fraction, extra = 1.0, {"zero_from": int((inv_freq != 0).sum())}
    return {
        **extra,
        "theta": float(params["rope_theta"]),
        "fraction": fraction,
        "rope_type": params.get("rope_type", "default"),
        "inv_freq": inv_freq.detach().float().cpu().clone(),
        "attention_scaling": float(attention_scaling),
    }


def _has_frequencies(rotary, config) -> bool:
    """The rotary module keeps its original frequencies: one set, or one per layer type (gemma3)."""
    if hasattr(rotary, "original_inv_freq"):
        return True
    return bool(_typed_ropes(rotary, config))


def _typed_ropes(rotary, config) -> list[str]:
    """The layer types a per-layer-type rotary module holds frequencies for (those its layers use)."""
    params, types = getattr(config, "rope_parameters", None), getattr(config, "layer_types", None)
    if not isinstance(params, dict) or not types:
        return []
    used = [t for t in sorted(set(types)) if isinstance(params.get(t), dict)]
    return used if all(hasattr(rotary, f"{t}_original_inv_freq") for t in used) else []


ATTENTION_NAMES = ("self_attn", "attn")  # what a layer calls its attention module


def attention_of(layer: nn.Module) -> nn.Module | None:
    """A layer's attention module; None for a layer that mixes tokens otherwise (a hybrid's conv or
    recurrent layer holds no positions)."""
    return next((m for n in ATTENTION_NAMES if isinstance(m := getattr(layer, n, None), nn.Module)), None)


def rotary_interface_layout(base) -> bool:
    """Is ``base`` the LLaMA layout: a ``rotary_emb`` module with its frequencies, and ``layers`` each with
    an attention module (``self_attn``, or ``attn``) that takes ``position_embeddings`` and calls the attention
    interface? A hybrid's layers without one (conv, recurrent) are left as they are."""
    rotary, layers = getattr(base, "rotary_emb", None), getattr(base, "layers", None)
    if (
        not _has_frequencies(rotary, getattr(base, "config", None))
        or not isinstance(layers, nn.ModuleList)
        or not len(layers)
    ):
        return False
    attns = [a for a in map(attention_of, layers) if a is not None]  # a hybrid's other layers hold no positions
    return bool(attns) and all(calls_attention_interface(type(a), "position_embeddings") for a in attns)


class LlamaAdapter(Adapter):
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
    # (smollm3's no_rope_layers) stay without them; per-layer-type rope (gemma3): the rope scheme keeps the
    # local layers' own rotation and applies its options to the global layers; softcapped logits (gemma2) and
    # attention sinks (gpt_oss) go through the one kernel that writes the scores out (kernels: ``Kernel.scores``)
    # MLA (deepseek_v3 and kin): the rotary part is split off and concatenated after the rest of each head
    # (x2, -x1) (nanochat) rotates the other way
    handles = (
        "interleaved_rotary",
        "no_rope_layers",
        "per_layer_type_rope",
        "softcap",
        "sinks",
        "split_rotary",
        "reversed_rotary",
    )

    @classmethod
    def supports(cls, model) -> bool:
        return super().supports(model) or rotary_interface_layout(getattr(model, "base_model", None))

    def targets(self) -> tuple[str, ...]:
        """The attention's own linear layers (phi names its output ``dense``, not ``o_proj``)."""
        attn = next(a for a in map(attention_of, self.base().layers) if a is not None)
        return tuple(n for n, m in attn.named_children() if isinstance(m, nn.Linear)) or self.lora_targets

    def check(self):
        base = self.base()
        if not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
            raise UnsupportedArchitectureError(f"{self.config.model_type}: expected model.rotary_emb and model.layers")
        super().check()

    def _window(self, i: int, attn=None) -> int | None:
        """Layer i's window: keys i - j < W (a decoder's, from the config); on an encoder |i - j| < W with W the
        module's own ``sliding_window`` (ModernBERT stores local_attention / 2 + 1, Gemma3's bidirectional
        layers their config's width: each family's own rule)."""
        if attn is not None and not getattr(attn, "is_causal", True):
            return getattr(attn, "sliding_window", None) or None
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

    def _positions(self) -> list | None:
        """Per layer, whether it has positions: smollm3's ``no_rope_layers`` (1: rotary, 0: none), or granite_swa's
        ``layer_rope_theta`` (0: none); None when every layer has them."""
        c = self.config
        if getattr(c, "no_rope_layers", None) is not None:
            return [bool(x) for x in c.no_rope_layers]
        thetas = getattr(c, "layer_rope_theta", None)
        return [bool(t) for t in thetas] if thetas is not None else None

    def _rotaries(self) -> list[str]:
        """Where the rotary modules the layers read live: ``rotary_emb``, or one per distinct rope theta
        (granite_swa's ``rotary_embs``; its ``rotary_emb`` stays unused)."""
        embs = getattr(self.base(), "rotary_embs", None)
        if isinstance(embs, nn.ModuleList) and len(embs):
            return [f"rotary_embs.{i}" for i in range(len(embs))]
        return ["rotary_emb"]

    def attention_layers(self):
        rope = self._positions()
        attns = [(i, attention_of(layer)) for i, layer in enumerate(self.base().layers)]
        return [
            AttentionLayer(i, attn, self._window(i, attn), positions=bool(rope[i]) if rope is not None else True)
            for i, attn in attns
            if attn is not None
        ]

    def spec(self):
        """MLA's queries and keys are qk_nope_head_dim + qk_rope_head_dim wide (its config's head_dim is the
        rotary part's)."""
        spec, c = super().spec(), self.config
        if getattr(c, "qk_rope_head_dim", None):
            return dataclasses.replace(spec, head_dim=int(c.qk_nope_head_dim) + int(c.qk_rope_head_dim))
        return spec

    def native_rope(self):
        has = quirks.detect(self.model)
        # GPT-J-style pairs (2i, 2i + 1) (DeepSeek-V2's complex pairs too); DeepSeek-V3's rope_interleave reads
        # such pairs but writes them as halves (not this quirk), so its split-off part reaches attention half-split
        interleaved = "interleaved_rotary" in has
        names = self._rotaries()
        if len(names) > 1:  # one rotary module per rope theta
            raise UnsupportedArchitectureError(
                f"{self.config.model_type}: rope thetas that differ by layer ({len(names)} rotary modules) are not "
                "converted yet; refused rather than converted silently wrong"
            )
        rotary = self.base().get_submodule(names[0])
        return native_rope(getattr(rotary, "config", self.config), rotary, interleaved, "reversed_rotary" in has)

    def neutralise(self, state):
        swaps = []
        for name in self._rotaries():
            parent, _, attr = name.rpartition(".")
            holder = self.base().get_submodule(parent) if parent else self.base()
            swaps.append(
                self.swap(
                    holder,
                    attr,
                    NeutralisedRotary(getattr(holder, attr) if not attr.isdigit() else holder[int(attr)], state),
                )
            )
        return swaps
