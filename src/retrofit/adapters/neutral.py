"""The stand-ins ``Adapter.neutralise`` swaps in for a family's native positional mechanism: a learned
position table, or a rotary-embedding module. Each keeps the original reachable (``.original``) so that
``revert`` is exact, and mixes it back in while a fine-tune fades it out (``native_fade``)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..foundation.errors import LengthError, RetrofitError
from .inputs import state_positions


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
        pos = self.positions(*args, **kwargs).to(self.weight.device)  # (B, T)
        state = self.state
        out = torch.zeros(*pos.shape, self.weight.shape[-1], dtype=self.weight.dtype, device=self.weight.device)
        if state.placement.native_fade > 0:
            idx = pos + state.placement.offset + self.index_offset
            if int(idx.max()) >= self.weight.shape[0]:
                raise LengthError(
                    f"native_fade needs the native position table, which has {self.weight.shape[0] - self.index_offset} rows;"
                    f" got position {int(idx.max()) - self.index_offset}"
                )
            out = out + state.placement.native_fade * nn.functional.embedding(idx, self.weight)
        scheme = state.scheme()
        if scheme.kind == "absolute":
            new = state_positions(state, pos.shape[-1], pos.device, native=pos)
            out = out + scheme.embed(state.place(new), out.dtype)
        return out


class NeutralisedRotary(nn.Module):
    """Stands in for a rotary-embedding module: returns cos = 1, sin = 0 (an exact identity rotation; a module
    returning complex ``freqs_cis``: 1 + 0i), or the original rotation at angle x ``native_fade`` while a
    fine-tune fades it out."""

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

    def __getattr__(self, name: str):
        """What the model reads off its rotary module besides calling it (lfm3's ``layer_types``) comes from
        the original."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["original"], name)

    def release(self) -> None:
        """Give the original back the model's own config (called by ``revert``)."""
        if self._shared_config is not None:
            self.original.config = self._shared_config

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, *args, **kwargs):
        self.calls += 1
        fade = self.state.placement.native_fade
        if fade > 0:
            return self.original(x, (position_ids + self.state.placement.offset).float() * fade, *args, **kwargs)
        out = self.original(x, position_ids, *args, **kwargs)
        if torch.is_tensor(out) and out.is_complex():  # DeepSeek-V2's freqs_cis: the unit rotation
            return torch.ones_like(out)
        cos, sin = out
        return torch.ones_like(cos), torch.zeros_like(sin)


class NeutralisedSinCos(nn.Module):
    """Stands in for GPT-J's and CodeGen's rotary module, which returns ``(sin, cos)`` (that order) read from a
    fixed table of ``max_position_embeddings`` rows: returns sin = 0, cos = 1 (an exact identity rotation) at
    any length, or the original rotation at angle x ``native_fade`` (computed from ``inv_freq``, since a faded
    position is not a row of the table) while a fine-tune fades it out."""

    def __init__(self, original: nn.Module, state, inv_freq: torch.Tensor):
        super().__init__()
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "state", state)
        self.register_buffer("inv_freq", inv_freq.float().clone(), persistent=False)  # (rot / 2,)
        self.calls = 0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        self.calls += 1
        fade = self.state.placement.native_fade
        angle = (position_ids + self.state.placement.offset).float()[..., None] * fade * self.inv_freq.to(x.device)
        if fade > 0:  # (B, T, rot / 2): the original's angles, faded, in the input's dtype as GPT-J casts them
            return angle.sin().to(x.dtype), angle.cos().to(x.dtype)
        return torch.zeros_like(angle, dtype=x.dtype), torch.ones_like(angle, dtype=x.dtype)


def padding(mask):
    """The (B, kv) padding (True = real; None = all real) in the mask a family's model hands its stand-in attention
    from retrofit's (``Adapter.mask_tensor``, ``mask_dims``): (B, kv) or (B, 1, 1, kv) as given, or a float
    (B, H, 1, kv) with a bias added onto it and the padded keys at the dtype's minimum (Falcon's ALiBi)."""
    if mask is not None and mask.dim() == 4:
        mask = mask[:, 0, -1, :]  # (B, kv)
        mask = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return None if mask is None or bool(mask.all()) else mask


class NeutralisedAttention(nn.Module):
    """Base of the stand-ins for attention modules that compute attention inline, with no attention-function
    dispatch (BLOOM, Falcon, MPT): the original kept reachable (``revert``), and q, k, v sent through
    ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` (the registered ``"retrofit"``). A subclass keeps its
    family's projections and splits its fused qkv as the family does."""

    is_causal = True
    family = "this family"  # named in errors

    def __init__(self, original: nn.Module, config, state):
        super().__init__()
        self.config = config
        object.__setattr__(self, "original", original)
        object.__setattr__(self, "state", state)
        self.calls = 0

    def native_alibi_not_faded(self) -> None:
        """A native ALiBi is not faded in: ``native_fade`` asks for what only a rotary or a table can give."""
        if self.state.placement.native_fade > 0:
            raise RetrofitError(
                f"native_fade: {self.family}'s ALiBi is not faded in (convert to alibi to keep it instead)"
            )

    def attend(self, q, k, v, mask, scaling: float, dropout: float):
        """(out (B, T, H, D), weights) through the configured attention function; q (B, H, T, D), k, v
        (B, Hkv, Tk, D)."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        function = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        return function(self, q, k, v, mask, scaling=scaling, dropout=dropout if self.training else 0.0)
