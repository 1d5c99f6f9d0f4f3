"""The adapter interface: one small adapter per architecture family.

An adapter knows where a family keeps its attention modules and its native positional
mechanism. ``neutralise`` swaps the native mechanism for a stand-in that keeps the original
reachable (``.original``) so ``revert`` is exact; the new scheme itself runs inside the
registered ``"retrofit"`` attention function, per model instance.
"""

from __future__ import annotations

import abc
import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..encodings.base import ModelSpec
from ..errors import LengthError, UnsupportedArchitectureError
from ..native import native_length
from ..registry import Registry
from . import quirks

ADAPTERS: Registry[type[Adapter]] = Registry("architecture", UnsupportedArchitectureError)


def register_adapter(name: str):
    return ADAPTERS.register(name)


@dataclass
class AttentionSite:
    layer: int
    module: nn.Module
    window: int | None = None  # sliding-window size of this layer (None: global)
    positions: bool = True  # False: a layer the original runs without positions (smollm3's), kept so


@dataclass(frozen=True)
class PositionTable:
    """Where a learned-absolute family keeps its table: the state-dict key of its weight, the config
    attribute of its size, and the row that holds position 0 (OPT stores position p at row p + 2)."""

    key: str
    size_attr: str
    first_row: int = 0


@dataclass
class Swap:
    """One replaced submodule: ``setattr(parent, attr, original)`` undoes it."""

    parent: nn.Module
    attr: str
    original: nn.Module
    freeze: bool = True  # freeze the original's parameters while it is swapped out (False: the stand-in reuses them)


class Adapter(abc.ABC):
    """Every fact about one architecture family (a meta-test checks that each adapter declares them)."""

    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]
    native_kind: ClassVar[str]  # "learned_absolute" | "rope"
    attention_class_names: ClassVar[tuple[str, ...]]  # HF classes of the patched attention modules
    lora_targets: ClassVar[tuple[str, ...]]  # default LoRA target modules (suffixes of module names)
    handles: ClassVar[tuple[str, ...]] = ()  # the ``quirks.QUIRKS`` this adapter converts exactly
    fan_in_fan_out: ClassVar[bool] = False  # linear layers store weights transposed (HF Conv1D)
    position_table: ClassVar[PositionTable | None] = None  # learned-absolute families: their table

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        """Does this adapter claim ``model``? By model type here; an adapter may claim by structure."""
        return getattr(model.config, "model_type", None) in cls.model_types

    @property
    def by_structure(self) -> bool:
        """Claimed by its structure, not by a model type this suite tests: ``convert`` runs the lossless probe."""
        return getattr(self.config, "model_type", None) not in self.model_types

    def targets(self) -> tuple[str, ...]:
        """Default LoRA target modules of this model."""
        return self.lora_targets

    def check(self) -> None:
        """Raise UnsupportedArchitectureError for configs of this family that the adapter cannot patch: a quirk
        it does not handle (named), or an attention site outside ``attention_class_names``."""
        bad = quirks.unhandled(self.model, self.handles)
        if bad:
            raise UnsupportedArchitectureError(
                f"{self.config.model_type} ({type(self.model).__name__}) has {'; '.join(bad)}, which the {self.name} "
                "adapter does not convert exactly: refused rather than converted silently wrong"
            )
        if self.by_structure:
            return
        for site in self.sites():
            if type(site.module).__name__ not in self.attention_class_names:
                raise UnsupportedArchitectureError(
                    f"{self.config.model_type}: layer {site.layer} attention is {type(site.module).__name__}, "
                    f"expected one of {', '.join(self.attention_class_names)}"
                )

    def base(self) -> nn.Module:
        return self.model.base_model

    @abc.abstractmethod
    def sites(self) -> list[AttentionSite]:
        """Every attention module this adapter patches, with its layer index and sliding window."""

    def spec(self) -> ModelSpec:
        """Read through transformers' standard config names (``attribute_map`` covers n_layer, n_head, ...)."""
        c = self.config
        heads = c.num_attention_heads
        return ModelSpec(
            num_layers=c.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
            hidden_size=c.hidden_size,
            native_length=native_length(c),
            native_kind=self.native_kind,
            native_rope=self.native_rope(),
        )

    def native_rope(self) -> dict | None:
        """The native rotary settings (rotary families override this)."""
        return None

    def native_max_length(self) -> int | None:
        """Longest input the *unconverted* model accepts: a learned table's rows; rotary models have no hard limit."""
        return native_length(self.config) if self.native_kind == "learned_absolute" else None

    def native_table(self) -> torch.Tensor | None:
        """The learned table's rows for positions 0 .. native - 1 (OPT's offset skipped), or None."""
        table = self.position_table
        if table is None:
            return None
        weight = dict(self.model.named_parameters(remove_duplicate=False)).get(table.key)
        if weight is None:  # already swapped out (a checkpoint being re-converted): the stand-in keeps its weight
            weight = self.model.state_dict().get(table.key)
        first = table.first_row
        return None if weight is None else weight.detach()[first : first + native_length(self.config)]

    @abc.abstractmethod
    def neutralise(self, state) -> list[Swap]:
        """Swap the native positional mechanism for stand-ins; return the swaps (revert undoes them)."""

    def add_absolute(self, state) -> list[Swap]:
        """Add an absolute scheme's embedding to the token embeddings, for families without a
        position table (rotary ones): a forward hook on the input-embedding module (its handle goes
        to ``state.hooks``; revert removes it). Positions come from ``state_positions``.
        Callers passing ``inputs_embeds`` bypass the embedding module, and so the absolute positions."""
        embed = self.model.get_input_embeddings()

        def add_positions(module, args, out):  # out (B, T, E)
            pos = state_positions(state, out.shape[1], out.device)
            return out + state.scheme().embed(state.place(pos), out.dtype)

        state.hooks.append(embed.register_forward_hook(add_positions))
        return []

    def swap(self, parent: nn.Module, attr: str, new: nn.Module) -> Swap:
        original = getattr(parent, attr)
        setattr(parent, attr, new)
        return Swap(parent, attr, original)


def track_inputs(state, base: nn.Module) -> list:
    """Hooks on the base model: a forward pre-hook recording the position inputs of the current call in
    ``state.inputs`` (``position_ids`` as given or None, the 2D ``attention_mask``, the cache length
    ``past``, and ``cache_in_place``: whether keys may be rotated once, as they enter the cache), and a
    forward hook marking the cache such a call filled. Returns the hook handles (removed by revert)."""
    sig = inspect.signature(base.forward)

    def record(module, args, kwargs):
        try:
            bound = sig.bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = kwargs
        extra = bound.get("kwargs", {}) if isinstance(bound.get("kwargs"), dict) else {}

        def get(k):
            return bound.get(k, extra.get(k))

        cache = get("cache") if get("cache") is not None else get("past_key_values")  # transformers >= 5.24: cache
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        mask = get("attention_mask")
        state.inputs = {
            "position_ids": get("position_ids"),
            "attention_mask": mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None,
            "past": past,
            "cache_in_place": _rotated_once(cache),
        }

    def mark(module, args, output):
        cache = _plain_cache(output_cache(output))
        if cache is not None and (state.inputs or {}).get("cache_in_place"):
            setattr(cache, ROTATED_MARK, True)

    return [base.register_forward_pre_hook(record, with_kwargs=True), base.register_forward_hook(mark)]


def output_cache(output):
    """The cache a model output carries: ``cache`` from transformers 5.24, ``past_key_values`` before.
    Read by key: asking a 5.24 output for the old name logs a deprecation warning."""
    keys = list(output.keys()) if isinstance(output, dict) else []
    for name in ("cache", "past_key_values"):
        if name in keys and output[name] is not None:
            return output[name]
    return None


def cache_kwarg(model) -> str:
    """The forward's name for the KV cache: ``cache`` from transformers 5.24, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


ROTATED_MARK = "_retrofit_keys_rotated"  # set on a DynamicCache whose keys a rotary scheme rotated on entry


def _plain_cache(cache):
    """The DynamicCache holding self-attention keys when it hands the attention the very tensors it keeps
    (a write into the returned keys is a write into the cache); None for any other cache (quantized,
    offloaded, static, a subclass)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    cache = getattr(cache, "self_attention_cache", cache)  # GPT-2 with cross-attention wraps its own
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return None
    if not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in getattr(cache, "layers", [])):
        return None
    return cache


def _rotated_once(cache) -> bool:
    """May this call rotate keys once, in place, as they enter the cache (as a native RoPE model does)?
    Yes for no cache yet (the model makes a DynamicCache; the forward hook marks it), an empty plain
    DynamicCache, or one this model marked; no for anything else (its keys are re-rotated every call)."""
    if cache is None:
        return True
    plain = _plain_cache(cache)
    if plain is None:
        return False
    return bool(getattr(plain, ROTATED_MARK, False)) or cache.get_seq_length() == 0


def state_positions(state, length: int, device, native: torch.Tensor | None = None) -> torch.Tensor:
    """Absolute positions (B or 1, length) of the current call's new tokens, for an absolute scheme:
    the caller's ``position_ids`` if given; else, with a 2D padding mask, positions counted over real
    tokens only (as ``generate`` does: left padding does not shift them, padded slots get 1); else the
    model's own (``native``) or ``past + arange(length)``."""
    info = state.inputs or {}
    given = info.get("position_ids")
    if given is not None:
        return given.to(device)
    mask = info.get("attention_mask")
    past = info.get("past", 0)
    if mask is not None and mask.shape[-1] == past + length:
        m = mask.to(device=device, dtype=torch.long)
        return (m.cumsum(-1) - 1).masked_fill(m == 0, 1)[:, past:]
    if native is not None:
        return native
    return (torch.arange(length, device=device) + past)[None]


def adapter_class(model_type: str | None) -> type[Adapter] | None:
    """The adapter class registered for a model type, or None."""
    return next((cls for _name, cls in ADAPTERS.items() if model_type in cls.model_types), None)


def claimant(model: nn.Module) -> Adapter | None:
    """The adapter that claims ``model`` (by type or by structure), not yet checked; None when none does."""
    return next((cls(model) for _name, cls in ADAPTERS.items() if cls.supports(model)), None)


def adapter_for(model: nn.Module) -> Adapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for _name, cls in ADAPTERS.items():
        if cls.supports(model):
            adapter = cls(model)
            adapter.check()
            return adapter
    supported = ", ".join(f"{n} ({', '.join(c.model_types)})" for n, c in ADAPTERS.items())
    has = quirks.unhandled(model, ())
    raise UnsupportedArchitectureError(
        f"architecture {model_type!r} ({type(model).__name__}) is not supported"
        + (f" (it has {'; '.join(has)})" if has else "")
        + f"; supported: {supported}, and any "
        "decoder with the LLaMA layout (a rotary_emb module, layers of self_attn on transformers' attention "
        "interface) that passes the lossless probe (docs/support.md)"
    )


class NeutralisedPositionTable(nn.Module):
    """Stands in for a learned absolute position table.

    Returns zeros (the new scheme works in attention), or the new absolute scheme's embedding,
    plus ``native_fade`` x the original table while a fine-tune fades it out. The table's
    weight stays registered under its original name (same state-dict key), frozen.
    ``positions(*args, **kwargs) -> (B, T) position ids`` adapts the family's call signature.
    """

    def __init__(self, original: nn.Embedding, state, positions: Callable[..., torch.Tensor], index_offset: int = 0):
        super().__init__()
        self.weight = original.weight
        object.__setattr__(self, "original", original)  # reachable, not a second state-dict entry
        object.__setattr__(self, "state", state)
        self.positions = positions
        self.index_offset = index_offset  # OPT stores position p at row p + 2
        self.calls = 0

    def forward(self, *args, **kwargs) -> torch.Tensor:
        self.calls += 1
        pos = self.positions(*args, **kwargs)  # (B, T)
        state = self.state
        out = torch.zeros(*pos.shape, self.weight.shape[-1], dtype=self.weight.dtype, device=self.weight.device)
        if state.native_fade > 0:
            idx = pos + state.offset + self.index_offset
            if int(idx.max()) >= self.weight.shape[0]:
                raise LengthError(
                    f"native_fade needs the native position table, which has {self.weight.shape[0] - self.index_offset} rows;"
                    f" got position {int(idx.max()) - self.index_offset}"
                )
            out = out + state.native_fade * nn.functional.embedding(idx, self.weight)
        scheme = state.scheme()
        if scheme.kind == "absolute":
            new = state_positions(state, pos.shape[-1], pos.device, native=pos)
            out = out + scheme.embed(state.place(new), out.dtype)
        return out


class NeutralisedRotary(nn.Module):
    """Stands in for a rotary-embedding module: returns cos = 1, sin = 0 (an exact identity rotation),
    or the original rotation at angle x ``native_fade`` while a fine-tune fades it out."""

    def __init__(self, original: nn.Module, state):
        super().__init__()
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "state", state)
        self.calls = 0
        # The converted model's config advertises its new reach; dynamic RoPE reads the config's length as
        # its native one, so the original keeps a private copy of the config as it is now (``release`` undoes).
        shared = getattr(original, "config", None)
        object.__setattr__(self, "_shared_config", shared)
        if shared is not None:
            original.config = copy.deepcopy(shared)

    def release(self) -> None:
        """Give the original back the model's own config (called by ``revert``)."""
        if self._shared_config is not None:
            self.original.config = self._shared_config

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        self.calls += 1
        fade = self.state.native_fade
        if fade > 0:
            return self.original(x, (position_ids + self.state.offset).float() * fade, *args, **kwargs)
        cos, sin = self.original(x, position_ids, *args, **kwargs)
        return torch.ones_like(cos), torch.zeros_like(sin)
