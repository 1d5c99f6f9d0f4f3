"""What each call of a converted model brings: its position inputs and its cache, read through
transformers' names of either version (``cache`` from 5.24, ``past_key_values`` before).

``track_inputs`` hooks the base model so that ``state.inputs`` holds the current call's ``position_ids``,
2D padding mask and cache length; ``state_positions`` turns them into the absolute positions of the
call's new tokens. A plain ``DynamicCache`` whose keys a rotary scheme rotated on entry is marked
(``ROTATED_MARK``) so that later calls rotate only the new keys.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn


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
