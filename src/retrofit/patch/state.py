"""The per-model state of a converted model and the per-layer context its attention modules carry."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters.base import Adapter, Swap
from ..encodings import Scheme

log = logging.getLogger("retrofit.patch.core")

POSITIONS_MODULE = "retrofit_positions"  # the submodule holding the new position parameters


@dataclass
class RetrofitState:
    root: nn.Module
    scheme_name: str
    adapter: Adapter
    kernel: str
    original_attn: str | None
    native_max: int | None = None  # the unconverted model's hard limit (a learned table's rows), read before converting
    reach_key: str | None = None  # the config attribute that advertises the length (max_position_embeddings)
    reach_original: Any = None  # its value before converting (revert restores it)
    swaps: list[Swap] = field(default_factory=list)
    frozen: list[nn.Parameter] = field(default_factory=list)
    hooks: list = field(default_factory=list)  # removable hook handles installed by the adapter
    inputs: dict | None = None  # the current forward's position_ids, 2D mask and cache length (see track_inputs)
    offset: int = 0
    calibration: dict | None = None  # while QK-norm calibrates: {(layer, "q"|"k"): mean RMS per head}
    positions: Any = None  # (T,) long: the absolute position of each token of a training block (PoSE, randomized)
    native_fade: float = 0.0
    attention_dropout: float | None = None  # set: the attention probabilities' dropout while training (a fine-tune's)
    calls: dict[int, int] = field(default_factory=dict)
    paths: dict[str, int] = field(default_factory=dict)
    last_path: str | None = None

    def scheme(self) -> Scheme:
        """The live scheme module; resolves PEFT's ModulesToSaveWrapper to its active copy."""
        mod = getattr(self.root, POSITIONS_MODULE)
        if hasattr(mod, "modules_to_save") and hasattr(mod, "original_module"):
            active = getattr(mod, "active_adapters", None) or [getattr(mod, "active_adapter", "default")]
            name = active[0] if isinstance(active, (list, tuple)) else active
            if getattr(mod, "disable_adapters", False) or name not in mod.modules_to_save:
                return mod.original_module
            return mod.modules_to_save[name]
        return mod

    def place(self, index):
        """Absolute positions of token indices ``index`` (any shape): the fine-tune's position override
        (``positions[index]``) when set, else ``index + offset``."""
        if self.positions is None:
            return index + self.offset
        return self.positions.to(index.device)[index]

    def record(self, layer: int, path: str):
        self.calls[layer] = self.calls.get(layer, 0) + 1
        if path not in self.paths:
            log.info("retrofit attention path: %s (scheme %s)", path, self.scheme_name)
        self.paths[path] = self.paths.get(path, 0) + 1
        self.last_path = path


@dataclass
class LayerContext:
    state: RetrofitState
    layer: int
    window: int | None
    positions: bool = True  # False: this layer attends without positions, as in the original
    _index: dict = field(default_factory=dict)

    def layer_index(self, device) -> torch.Tensor:
        """The layer number as a 0-d tensor on ``device`` (for bias functions: a compiled flex score_mod
        indexing a table with a Python int that differs per layer hits an inductor C++ compile error
        in torch 2.13; a tensor index compiles once for every layer)."""
        key = str(device)
        if key not in self._index:
            self._index[key] = torch.tensor(self.layer, device=device)
        return self._index[key]
