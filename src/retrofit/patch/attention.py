"""The attention and mask functions registered as ``"retrofit"`` with transformers' ``AttentionInterface`` /
``AttentionMaskInterface``, and what they read: the converted model's state (``RetrofitState``) and the context
each converted layer carries (``LayerContext``). The attention function is the glue between transformers and the
scheme: it reads the layer's context, builds the call's ``Site`` (a ``LayerCall``), asks the scheme's kind to prepare its term
(``Scheme.prepare``, scheme/kinds.py) and hands one ``kernels.Call`` to the kernel table (``kernels.attend``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import kernels
from ..adapters.base import Adapter, Swap
from ..adapters.inputs import state_positions
from ..foundation.errors import LengthError, PatchNotLiveError, RetrofitError
from ..scheme import Scheme, Site, Term

ATTN_NAME = "retrofit"
log = logging.getLogger(__name__)

POSITIONS_MODULE = "retrofit_positions"  # the submodule holding the new position parameters


@dataclass(frozen=True)
class Placement:
    """Where a fine-tune places the next blocks' tokens (``set_position_controls``; training/positions.py hands one
    per step): every position shifted by ``offset`` (random-offset augmentation), ``native_fade`` of the native
    mechanism mixed back in (1 = fully native), or ``positions``, a (T,) long tensor giving each token's absolute
    position (PoSE, randomized, EndPrompt; no cache while set). The default places tokens as the model reads them."""

    offset: int = 0
    native_fade: float = 0.0
    positions: Any = None


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
    placement: Placement = field(default_factory=Placement)  # a fine-tune's placement of the next blocks
    calibration: dict | None = None  # while QK-norm calibrates: {(layer, "q"|"k"): mean RMS per head}
    attention_dropout: float | None = None  # set: the attention probabilities' dropout while training (a fine-tune's)
    calls: dict[int, int] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)
    last_kernel: str | None = None

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
        if self.placement.positions is None:
            return index + self.placement.offset
        return self.placement.positions.to(index.device)[index]

    def record(self, layer: int, kernel: str):
        self.calls[layer] = self.calls.get(layer, 0) + 1
        if kernel not in self.kernels:
            log.info("retrofit attention kernel: %s (scheme %s)", kernel, self.scheme_name)
        self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        self.last_kernel = kernel


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


@dataclass
class LayerCall(Site):
    """One call of a converted layer's attention: the ``Site`` a scheme's kind reads (``scheme.site.Site``), its
    layer and scheme, its direction, and where its queries and keys sit (``q_start``: earlier keys in the cache;
    ``shift``: a sliding-window cache's dropped keys; ``placed``: a training block's own positions)."""

    ctx: LayerContext
    scheme: Scheme
    causal: bool
    scaling: float
    Tq: int
    Tk: int
    q_start: int
    shift: int
    placed: bool

    @property
    def layer(self) -> int:
        return self.ctx.layer

    @property
    def window(self) -> int | None:
        return self.ctx.window

    @property
    def offset(self) -> int:
        return self.ctx.state.placement.offset

    @property
    def calibration(self) -> dict | None:
        return self.ctx.state.calibration

    def place(self, index):
        return self.ctx.state.place(index)

    def layer_index(self, device) -> torch.Tensor:
        return self.ctx.layer_index(device)

    @property
    def position_inputs(self) -> bool:
        info = self.ctx.state.inputs or {}
        return info.get("position_ids") is not None or info.get("attention_mask") is not None

    def token_positions(self, device) -> torch.Tensor:
        return state_positions(self.ctx.state, self.Tq, device)

    def row_shifts(self, device) -> torch.Tensor | None:
        """Per batch row, position - slot index of its tokens (B,): left padding (positions counted over real
        tokens, as ``generate`` builds them) or a caller's ``position_ids`` move a row's tokens off their slots.
        Read at the row's last real query of this call (its tokens are contiguous). None: no position inputs."""
        if not self.position_inputs:
            return None
        Tq, Tk = self.Tq, self.Tk
        pos = self.token_positions(device)  # (B or 1, Tq)
        mask = self.ctx.state.inputs.get("attention_mask")
        real = torch.ones_like(pos, dtype=torch.bool)
        if mask is not None and mask.shape[-1] >= Tq:
            real = mask[:, -Tq:].to(device=device, dtype=torch.bool)
        pos, real = torch.broadcast_tensors(pos, real)  # (B, Tq) each: (1, Tq) position ids with a (B, T) mask
        index = torch.where(real, torch.arange(Tq, device=device), -1).max(-1).values  # (B,) last real; -1: none
        at = index.clamp(min=0)
        shift = pos.gather(-1, at[:, None])[:, 0] - (Tk - Tq + at)  # position - slot
        return torch.where(index >= 0, shift, torch.zeros_like(shift))

    def in_place(self, key) -> bool:
        """``key`` is the cache's own tensor (a plain DynamicCache, see ``adapters.inputs.track_inputs``) and no
        gradient flows through it: new rows may be transformed in place, once, as they enter the cache."""
        return bool((self.ctx.state.inputs or {}).get("cache_in_place")) and not key.requires_grad


def retrofit_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query (B, H, Tq, D), key/value (B, Hkv, Tk, D) -> ((B, Tq, H, D), None): the scheme's kind prepares its
    term, then one ``kernels.Call`` goes to the kernel table."""
    site = _site(module, query, key, scaling, kwargs)
    state = site.ctx.state
    if state.attention_dropout is not None:  # a fine-tune's train.attention_dropout, in place of the module's
        dropout = state.attention_dropout if module.training else 0.0
    if attention_mask is not None and attention_mask.dim() != 2:
        raise RetrofitError("retrofit attention takes a 2D padding mask; a custom 4D mask is not supported")
    # a layer the original ran without positions stays so
    term = site.scheme.prepare(site, query, key) if site.ctx.positions else Term(query, key)
    call = kernels.Call(
        v=value,
        scaling=site.scaling,
        key_padding=attention_mask,
        window=site.window,
        q_start=site.q_start,
        dropout=dropout,
        causal=site.causal,
        # the attention interface's own keywords (transformers' flash_attention_forward takes both): gemma2's
        # attention-logit softcapping, gpt_oss's sinks (its eager path reads the module's)
        softcap=kwargs.get("softcap"),
        sinks=kwargs.get("s_aux", getattr(module, "sinks", None)),
        **term.fields(),
    )
    out, ran = kernels.attend(call, state.kernel)
    state.record(site.layer, ran)  # for ``describe``
    return out.transpose(1, 2).contiguous(), None


def _site(module, query, key, scaling, kwargs) -> LayerCall:
    """The call's ``Site``, checked: a converted layer, a length its scheme reaches, and a block's own positions
    only on a call without a cache."""
    ctx: LayerContext | None = getattr(module, "_retrofit_layer", None)
    if ctx is None and getattr(module, "is_decoder", False) and not getattr(module, "is_causal", True):
        raise PatchNotLiveError(  # BART's kin: a decoder layer's cross-attention over encoder_hidden_states
            f"{type(module).__name__} is a cross-attention (the model was called with encoder_hidden_states): "
            "retrofit converts a decoder's self-attention only, and a converted causal LM reads its own tokens; "
            "call it without encoder_hidden_states"
        )
    if ctx is None:
        raise PatchNotLiveError(
            f"the retrofit attention function was called by {type(module).__name__}, which was not converted; "
            "use retrofit.convert(model, ...) or retrofit.load(path), not config._attn_implementation"
        )
    state, scheme = ctx.state, ctx.state.scheme()
    causal = kwargs.get("is_causal")  # the direction: the call's, else the module's (an encoder's is False)
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    Tq, Tk, D = query.shape[-2], key.shape[-2], query.shape[-1]
    limit = scheme.max_length()
    if limit is not None and Tk > limit:
        raise LengthError(f"scheme {scheme.name!r} supports at most {limit} positions; got {Tk}")
    q_start = Tk - Tq  # the cache holds Tk - Tq earlier keys
    # a sliding-window cache drops its oldest keys: shift slot indices to the tokens' true positions
    # (a scheme that reads absolute positions, e.g. FIRE's normaliser or dynamic RoPE, needs them)
    seen = (state.inputs or {}).get("past", 0)
    given = state.placement.positions  # a training block's own positions (PoSE, randomized)
    placed = given is not None
    if placed and (q_start or Tk > len(given)):
        raise RetrofitError(
            f"position override of {len(given)} positions set (a fine-tune's PoSE/randomized "
            f"positions) but this call has {Tk} keys with a cache of {q_start}; reset it first"
        )
    shift = seen - q_start if seen > q_start else 0
    scaling = D**-0.5 if scaling is None else scaling
    return LayerCall(ctx, scheme, causal, scaling, Tq, Tk, q_start, shift, placed)


def retrofit_mask(batch_size=None, kv_length=None, kv_offset=0, attention_mask=None, config=None, **kwargs):
    """Linear-memory mask: only the (B, kv_length) padding mask (True = real token), or None (an all-real one for
    a family whose modelling code needs a tensor: ``Adapter.mask_tensor``; as (B, 1, 1, kv_length) where it adds
    a bias onto a 4-D mask: ``Adapter.mask_dims``). Causality and sliding windows are applied by the attention
    function itself."""
    needs_tensor, dims = _mask_form(config)
    if attention_mask is None:
        if not needs_tensor:
            return None
        pad = torch.ones(batch_size, kv_length, dtype=torch.bool, device=kwargs.get("device"))
    else:
        pad = attention_mask[:, kv_offset : kv_offset + kv_length].bool()
        if pad.shape[-1] < kv_length:  # positions not covered by the 2D mask are real tokens
            pad = torch.nn.functional.pad(pad, (0, kv_length - pad.shape[-1]), value=True)
        if bool(pad.all()) and not needs_tensor:
            return None
    return pad[:, None, None, :] if dims == 4 else pad  # (B, kv) or (B, 1, 1, kv)


def _mask_form(config) -> tuple[bool, int]:
    """(``Adapter.mask_tensor``, ``Adapter.mask_dims``) of the config's family (False, 2 for one not claimed)."""
    from ..adapters.base import adapter_class

    cls = adapter_class(getattr(config, "model_type", None))
    return (False, 2) if cls is None else (bool(cls.mask_tensor), cls.mask_dims)


def _register_interfaces():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, retrofit_attention)
    AttentionMaskInterface.register(ATTN_NAME, retrofit_mask)


_register_interfaces()
