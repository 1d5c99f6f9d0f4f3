"""The adapter interface: one small adapter per architecture family.

An adapter knows where a family keeps its attention modules and its native positional
mechanism. ``neutralise`` swaps the native mechanism for a stand-in that keeps the original
reachable (``.original``) so ``revert`` is exact; the new scheme itself runs inside the
registered ``"retrofit"`` attention function, per model instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import nn

from ..errors import LengthError, UnsupportedArchitectureError
from ..registry import Registry
from ..encodings.base import ModelSpec

ADAPTERS: Registry[type["Adapter"]] = Registry("architecture", UnsupportedArchitectureError)


def register_adapter(name: str):
    return ADAPTERS.register(name)


@dataclass
class AttentionSite:
    layer: int
    module: nn.Module
    window: int | None = None  # sliding-window size of this layer (None: global)


@dataclass
class Swap:
    """One replaced submodule: ``setattr(parent, attr, original)`` undoes it."""

    parent: nn.Module
    attr: str
    original: nn.Module


class Adapter:
    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]
    native_kind: ClassVar[str]  # "learned_absolute" | "rope"
    attention_class_names: ClassVar[tuple[str, ...]]  # HF classes of the patched attention modules

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config

    @classmethod
    def supports(cls, model: nn.Module) -> bool:
        return getattr(model.config, "model_type", None) in cls.model_types

    def check(self) -> None:
        """Raise UnsupportedArchitectureError for configs of this family that the adapter cannot patch."""

    def base(self) -> nn.Module:
        return self.model.base_model

    def sites(self) -> list[AttentionSite]:
        raise NotImplementedError

    def spec(self) -> ModelSpec:
        raise NotImplementedError

    def native_max_length(self) -> int | None:
        """Longest input the *unconverted* model accepts (None: no hard limit)."""
        return None

    def neutralise(self, state) -> list[Swap]:
        raise NotImplementedError

    def add_absolute(self, state) -> list:
        """Hook an absolute scheme's embedding in (families without a position table override this)."""
        raise UnsupportedArchitectureError(f"{self.name}: absolute schemes are not supported yet")

    def swap(self, parent: nn.Module, attr: str, new: nn.Module) -> Swap:
        original = getattr(parent, attr)
        setattr(parent, attr, new)
        return Swap(parent, attr, original)


def adapter_for(model: nn.Module) -> Adapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for _name, cls in ADAPTERS.items():
        if cls.supports(model):
            adapter = cls(model)
            adapter.check()
            return adapter
    supported = ", ".join(f"{n} ({', '.join(c.model_types)})" for n, c in ADAPTERS.items())
    raise UnsupportedArchitectureError(
        f"architecture {model_type!r} ({type(model).__name__}) is not supported; supported: {supported}"
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
            out = out + scheme.embed(pos + state.offset, out.dtype)
        return out


class NeutralisedRotary(nn.Module):
    """Stands in for a rotary-embedding module: returns cos = 1, sin = 0 (an exact identity rotation),
    or the original rotation at angle x ``native_fade`` while a fine-tune fades it out."""

    def __init__(self, original: nn.Module, state):
        super().__init__()
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "state", state)
        self.calls = 0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        self.calls += 1
        fade = self.state.native_fade
        if fade > 0:
            return self.original(x, (position_ids + self.state.offset).float() * fade, *args, **kwargs)
        cos, sin = self.original(x, position_ids, *args, **kwargs)
        return torch.ones_like(cos), torch.zeros_like(sin)
