"""Facts about an architecture that decide whether a positional conversion is exact, read from the model
itself (its config and its modelling code), never from its name.

``detect(model)`` lists the quirks a model has; an adapter declares the ones it handles
(``Adapter.handles``). A model with a quirk its adapter does not handle is refused by name before any
conversion; the lossless probe (``retrofit.patch.probe``) catches what no declared fact describes."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Quirk:
    name: str  # the key adapters declare in ``handles``
    says: str  # what it is, for the user
    present: Callable[[nn.Module], object]  # a truthy value (shown to the user) when the model has it


def _cfg(model, attr):
    return getattr(model.config, attr, None)


def _no_rope_layers(model):
    layers = _cfg(model, "no_rope_layers")  # smollm3: 1 = rotary, 0 = no positions (the list decides)
    if layers is not None:
        off = sum(1 for x in layers if not x)
        return off and f"config.no_rope_layers has {off} layers without positions"
    thetas = _cfg(model, "layer_rope_theta")  # granite_swa: theta 0 = no positions
    if thetas is not None:
        off = sum(1 for t in thetas if not t)
        return off and f"config.layer_rope_theta has {off} layers at theta 0 (no positions)"
    interval = _cfg(model, "no_rope_layer_interval")  # llama4
    return f"config.no_rope_layer_interval={interval}" if interval else None


def _per_layer_type_rope(model):
    params = _cfg(model, "rope_parameters")
    if (
        isinstance(params, dict)
        and params
        and "rope_theta" not in params
        and all(isinstance(v, dict) for v in params.values())
    ):
        return f"config.rope_parameters keyed by layer type: {sorted(params)}"
    return None


def _attention_modules(model):
    return [m for n, m in model.named_modules() if n.endswith(("self_attn", ".attention", ".attn"))]


def _sinks(model):
    return next(("self_attn.sinks" for m in _attention_modules(model) if hasattr(m, "sinks")), None)


def _interleaved_rotary(model):
    """GPT-J-style rotary pairs dims (0, 1), (2, 3), ... instead of (i, i + d/2): the modelling module's
    ``rotate_half`` reads every second dim (``x[..., ::2]``), or rotates complex pairs (``_pairs_interleaved``)."""
    for m in _attention_modules(model)[:1]:
        if _pairs_interleaved(type(m).__module__):
            return f"{type(m).__module__}.rotate_half pairs interleaved dims"
    return None


def _reversed_rotary(model):
    """rotate_half returning (x2, -x1) instead of (-x2, x1) (nanochat): each pair turns by -angle."""
    for m in _attention_modules(model)[:1]:
        if _turns_back(type(m).__module__):
            return f"{type(m).__module__}.rotate_half returns (x2, -x1)"
    return None


@functools.cache
def _turns_back(module_name: str) -> bool:
    fn = getattr(sys.modules.get(module_name), "rotate_half", None)
    try:
        return fn is not None and "(x2, -x1)" in inspect.getsource(fn).replace(" ", "").replace(",", ", ")
    except (OSError, TypeError):
        return False


@functools.cache
def _pairs_interleaved(module_name: str) -> bool:
    """``rotate_half`` reads every second dim, or the rotation multiplies complex pairs (DeepSeek-V2's
    ``apply_rotary_emb``: ``view_as_complex`` of (..., d/2, 2), written back interleaved)."""
    module = sys.modules.get(module_name)
    try:
        half = getattr(module, "rotate_half", None)
        if half is not None and "::2" in inspect.getsource(half):
            return True
        emb = getattr(module, "apply_rotary_emb", None)
        return emb is not None and "view_as_complex" in inspect.getsource(emb)
    except (OSError, TypeError):
        return False


QUIRKS = (
    Quirk(
        "softcap",
        "attention-logit softcapping",
        lambda m: (
            _cfg(m, "attn_logit_softcapping") and f"config.attn_logit_softcapping={_cfg(m, 'attn_logit_softcapping')}"
        ),
    ),
    Quirk("no_rope_layers", "layers without positions beside rotary ones", _no_rope_layers),
    Quirk(
        "split_rotary",
        "rotary on a split-off part of the head (MLA)",
        lambda m: _cfg(m, "qk_rope_head_dim") and f"config.qk_rope_head_dim={_cfg(m, 'qk_rope_head_dim')}",
    ),
    Quirk("per_layer_type_rope", "per-layer-type rope parameters (sliding and global layers)", _per_layer_type_rope),
    Quirk("sinks", "attention sinks", _sinks),
    Quirk(
        "sparse_indexer",
        "a learned sparse-attention indexer that picks each query's keys from rotary positions of its own (DSA)",
        lambda m: next(("self_attn.indexer" for a in _attention_modules(m) if hasattr(a, "indexer")), None),
    ),
    Quirk("interleaved_rotary", "interleaved (GPT-J-style) rotary", _interleaved_rotary),
    Quirk("reversed_rotary", "rotary turning each pair the other way (rotate_half as (x2, -x1))", _reversed_rotary),
    Quirk(
        "disentangled",
        "DeBERTa's disentangled relative attention (content-to-position terms of its own)",
        lambda m: next((f"{type(a).__name__}.pos_att_type" for a in m.modules() if hasattr(a, "pos_att_type")), None),
    ),
)


def detect(model) -> dict[str, str]:
    """{quirk name: what shows it} for every quirk ``model`` has."""
    found = {}
    for q in QUIRKS:
        try:
            shown = q.present(model)
        except Exception:  # a config or module that does not read as expected has not shown the quirk
            shown = None
        if shown:
            found[q.name] = str(shown)
    return found


def unhandled(model, handles: tuple[str, ...]) -> list[str]:
    """ "what (shown by ...)" for every quirk of ``model`` outside ``handles``."""
    says = {q.name: q.says for q in QUIRKS}
    return [f"{says[k]} ({v})" for k, v in detect(model).items() if k not in handles]
