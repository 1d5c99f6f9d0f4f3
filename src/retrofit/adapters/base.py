"""The adapter interface: one small adapter per architecture family.

An adapter knows where a family keeps its attention modules and its native positional
mechanism. ``neutralise`` swaps the native mechanism for a stand-in that keeps the original
reachable (``.original``) so ``revert`` is exact; the new scheme itself runs inside the
registered ``"retrofit"`` attention function, per model instance.

The per-call input tracking lives in ``inputs``, the neutralised modules in ``neutral``.
"""

from __future__ import annotations

import abc
import functools
import inspect
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..foundation.errors import UnsupportedArchitectureError
from ..foundation.native import native_length
from ..foundation.registry import Registry, part_class
from ..scheme.spec import ModelSpec
from . import quirks
from .inputs import state_positions

ADAPTERS: Registry[type[Adapter]] = Registry("architecture", UnsupportedArchitectureError)
# native kinds kept in a position table added to the token embeddings: learned rows, or fixed sinusoids stored as a
# table (Marian's, Pegasus's); both bound the unconverted model's input to the table's rows
TABLE_KINDS = ("learned_absolute", "sinusoidal")


def register_family(name: str) -> type[Adapter]:
    """Register the adapter that the family module ``adapters/<name>.py`` defines, under its name (its line in
    ``adapters.FAMILIES``: the one place a family's name is declared)."""
    cls = part_class(f"{__package__}.{name}", Adapter, f"family {name!r}")
    cls.name = name
    return ADAPTERS.register(name)(cls)


def register_adapter(name: str):
    """Deprecated (out-of-tree adapters written for retrofit <= 0.x): a decorator registering ``cls`` as ``name``.
    The package's families are lines of ``adapters.FAMILIES`` instead."""

    def deco(cls):
        cls.name = name
        return ADAPTERS.register(name)(cls)

    return deco


@dataclass
class AttentionLayer:
    """One attention module an adapter patches: its layer index, sliding window and whether it reads positions.
    (Not a ``Site``: that is one call of a converted layer, ``scheme.site.Site``.)"""

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

    name: ClassVar[str]  # its line in ``adapters.FAMILIES`` (set when registered)
    model_types: ClassVar[tuple[str, ...]]
    native_kind: ClassVar[str]  # "learned_absolute" | "sinusoidal" (a fixed table) | "rope" | "alibi"
    attention_class_names: ClassVar[tuple[str, ...]]  # HF classes of the patched attention modules
    lora_targets: ClassVar[tuple[str, ...]]  # default LoRA target modules (suffixes of module names)
    handles: ClassVar[tuple[str, ...]] = ()  # the ``quirks.QUIRKS`` this adapter converts exactly
    fan_in_fan_out: ClassVar[bool] = False  # linear layers store weights transposed (HF Conv1D)
    position_table: ClassVar[PositionTable | None] = None  # learned-absolute families: their table
    native_alibi: ClassVar[dict] = {}  # native-ALiBi families: the alibi options that reproduce it (the probe's)
    mask_tensor: ClassVar[bool] = False  # the modelling code calls tensor methods on the mask: never give it None
    mask_dims: ClassVar[int] = 2  # the padding mask as (B, kv), or 4: (B, 1, 1, kv) for code that adds a bias onto it

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
        for at in self.attention_layers():
            if type(at.module).__name__ not in self.attention_class_names:
                raise UnsupportedArchitectureError(
                    f"{self.config.model_type}: layer {at.layer} attention is {type(at.module).__name__}, "
                    f"expected one of {', '.join(self.attention_class_names)}"
                )

    def base(self) -> nn.Module:
        return self.model.base_model

    @abc.abstractmethod
    def attention_layers(self) -> list[AttentionLayer]:
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
            bidirectional=any(not getattr(s.module, "is_causal", True) for s in self.attention_layers()),
        )

    def native_rope(self) -> dict | None:
        """The native rotary settings (rotary families override this)."""
        return None

    def native_max_length(self) -> int | None:
        """Longest input the *unconverted* model accepts: a learned table's rows; rotary models have no hard limit."""
        return native_length(self.config) if self.native_kind in TABLE_KINDS else None

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
    has = quirks.unhandled(model, tuple(q for _n, c in ADAPTERS.items() for q in c.handles))  # none converts these
    raise UnsupportedArchitectureError(
        f"architecture {model_type!r} ({type(model).__name__}) is not supported"
        + (f" (it has {'; '.join(has)})" if has else "")
        + f"; supported: {supported}, and any "
        "decoder with the LLaMA layout (a rotary_emb module, layers of self_attn on transformers' attention "
        "interface) or OPT's (a learned embed_positions table, layers of self_attn on that interface) that "
        "passes the lossless probe (docs/support.md)"
    )


@functools.cache
def calls_attention_interface(cls: type, *also: str) -> bool:
    """Does the attention class ``cls`` run its scores through transformers' attention interface (its ``forward``
    looks its function up in ``ALL_ATTENTION_FUNCTIONS``), and take each of ``also`` as an argument of its
    ``forward`` (e.g. ``position_embeddings``: the rotary layout's cos/sin, computed outside it)? The structural
    claims' one test of an attention module. The arguments are read from the signature; the interface call from
    the source, because transformers has no mark that says it: ``_supports_attention_backend`` is a model's flag,
    not its attention classes' (a flagged MiniMax runs its lightning-attention layers without the interface),
    and it is unset on models whose attention does call it (BART, BioGPT, Blenderbot-Small, Marian, mBART,
    Pegasus, StableLM, Falcon-H1, OLMo-Hybrid, Lara-Mini: in every supported transformers that has them),
    which the flag alone would stop claiming."""
    try:
        params = inspect.signature(cls.forward).parameters
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError, ValueError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in src and all(word in params for word in also)
