"""``Site``: one attention call of a converted layer, as a kind's ``prepare`` reads it. It is the one site type:
``patch/attention.py`` builds it from the layer's context (``patch.attention.LayerCall`` implements it); this layer
reads nothing of the patch."""

from __future__ import annotations

import typing

import torch


class Site(typing.Protocol):
    """Where one attention call sits, as a kind's ``prepare`` reads it."""

    layer: int
    window: int | None  # the layer's sliding window
    causal: bool  # False: keys after the query count too (an encoder)
    scaling: float  # of the scores
    Tq: int
    Tk: int
    q_start: int  # earlier keys in the cache
    shift: int  # a sliding-window cache's dropped keys
    placed: bool  # a training block's own positions (PoSE, randomized): ``place`` reads them
    offset: int  # added to every position
    calibration: dict | None  # while QK-norm calibrates: {(layer, "q"|"k"): RMS per head}, filled here
    position_inputs: bool  # the caller gave position ids or a 2D padding mask

    def place(self, index: torch.Tensor) -> torch.Tensor:
        """Absolute positions of token slots ``index``."""

    def layer_index(self, device) -> torch.Tensor:
        """The layer number as a 0-d tensor on ``device`` (for bias functions)."""

    def token_positions(self, device) -> torch.Tensor:
        """(B or 1, Tq) positions of the call's queries, from the caller's position ids or the padding mask."""

    def row_shifts(self, device) -> torch.Tensor | None:
        """(B,) position - slot of each batch row's tokens; None without position inputs."""

    def in_place(self, key: torch.Tensor) -> bool:
        """``key`` is the cache's own tensor and takes no gradient: new rows may be transformed in place, once."""
