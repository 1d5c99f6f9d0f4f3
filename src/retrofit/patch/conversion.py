"""convert / revert / describe: swap a model instance's positional mechanism in place.

Mechanics: one attention function and one mask function, both registered as ``"retrofit"`` with
transformers' ``AttentionInterface`` / ``AttentionMaskInterface``. A converted model selects them
through its own config (``_attn_implementation = "retrofit"``); each of its attention modules
carries a small per-layer context that points at this model's state. No transformers class is
modified, so converted and unconverted models (or two conversions) live side by side.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import kernels
from ..adapters import ADAPTERS, adapter_for
from ..adapters.base import TABLE_KINDS
from ..adapters.inputs import track_inputs
from ..foundation.errors import (
    AlreadyConvertedError,
    LengthError,
    NotConvertedError,
    OptionError,
    PatchNotLiveError,
    RetrofitError,
)
from ..foundation.versions import __version__
from ..scheme import SCHEMES, Scheme
from ..scheme.options import parse_common
from . import probe
from .attention import (  # noqa: F401  (retrofit_attention, retrofit_mask: registered on import)
    ATTN_NAME,
    POSITIONS_MODULE,
    LayerContext,
    Placement,
    RetrofitState,
    retrofit_attention,
    retrofit_mask,
)
from .saved_config import (  # noqa: F401  (SAVED_MODEL_TYPE, UNBOUNDED, mark_saved_config: public here too)
    SAVED_MODEL_TYPE,
    UNBOUNDED,
    advertise_reach,
    base_config,
    mark_saved_config,
    withdraw_reach,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
def schemes() -> list[str]:
    return SCHEMES.names()


def architectures() -> list[str]:
    return ADAPTERS.names()


def _state(model) -> RetrofitState | None:
    return getattr(model, "_retrofit_state", None)


def encoder_of(model) -> nn.Module:
    """A converted model's encoder (``model.base_model``: what ``AutoModel`` gives for a classifier's checkpoint),
    carrying the conversion's state, so ``describe`` of the encoder says what it runs (its attention is the
    converted model's own modules)."""
    base = model.base_model
    if base is not model and _state(model) is not None:
        base._retrofit_state = _state(model)
    return base


def _check_model(model):
    from transformers import PreTrainedModel

    if type(model).__name__.startswith("Peft") or hasattr(model, "peft_config"):
        raise RetrofitError("convert the model before wrapping it with PEFT (or merge_and_unload first)")
    if not isinstance(model, PreTrainedModel):
        raise RetrofitError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")


DEFAULT_KERNEL = "auto"  # the kernel ``convert`` takes when none is named


def convert(
    model, to: str, *, force: bool = False, kernel: str | None = None, verify: bool = True, **options
) -> nn.Module:
    """Replace ``model``'s positional mechanism with scheme ``to``, in place; returns the model.

    ``options`` are the scheme's (see ``retrofit convert --help``). ``kernel``: auto (``DEFAULT_KERNEL``) or a
    kernel of ``retrofit.kernels.KERNELS`` (saved with the checkpoint; ``set_kernel`` changes it).
    ``force=True`` converts a model that was already converted (it is reverted first).
    Raises UnknownSchemeError, UnsupportedArchitectureError, OptionError, AlreadyConvertedError,
    PatchNotLiveError (nothing is left half-patched: a failed conversion is reverted)."""
    return _convert(model, to, options, Converting(force=force, kernel=kernel or DEFAULT_KERNEL, verify=verify))


def convert_shape(model, to: str, *, kernel: str | None = None, **options) -> nn.Module:
    """``convert`` for a model without weights (on the meta device), to count what the conversion adds and freezes
    (``retrofit finetune --plan``): nothing runs a forward (the lossless probe, the QK-norm calibration and the live
    check need weights)."""
    how = Converting(kernel=kernel or DEFAULT_KERNEL, verify=False, from_checkpoint=True)
    return _convert(model, to, options, how)


@dataclass(frozen=True)
class Converting:
    """How ``_convert`` converts: over an earlier conversion (``force``), with which kernel, checked live
    afterwards (``verify``), for a saved checkpoint's block (``from_checkpoint``: no probe, no QK-norm
    calibration) or inside the probe itself (``probing``)."""

    force: bool = False
    kernel: str = DEFAULT_KERNEL
    verify: bool = True
    from_checkpoint: bool = False
    probing: bool = False


def _convert(model, to, options: dict, how: Converting):
    force, kernel, from_checkpoint = how.force, how.kernel, how.from_checkpoint
    _check_model(model)
    scheme_cls = SCHEMES.get(to)
    kernel = kernels.check(kernel, scheme_cls.kind)
    state = _state(model)
    if state is not None:
        if not force:
            raise AlreadyConvertedError(
                f"model is already converted to {state.scheme_name!r}; call retrofit.revert(model) first or pass force=True"
            )
        revert(model)
    elif getattr(model.config, "retrofit", None) and not (force or from_checkpoint):
        block = model.config.retrofit
        raise AlreadyConvertedError(
            f"this checkpoint was saved by retrofit with scheme {block.get('scheme')!r}; "
            "load it with retrofit.load(path) (plain from_pretrained does not re-apply the patch)"
        )
    adapter = adapter_for(model)
    _check_direction(adapter, scheme_cls, to)
    if adapter.by_structure and not (from_checkpoint or how.probing):  # not a type this suite tests: own logits first
        probe.lossless(model, adapter, _probe_convert, revert, _set_attn)
    if state is None:
        _own_config(model)
    spec = dataclasses.replace(adapter.spec(), embedding_rms=_embedding_rms(model), native_table=adapter.native_table())
    common, own = parse_common(spec, options)
    opts = scheme_cls.parse_options(spec, own)
    ref = next(model.parameters())
    scheme = scheme_cls(spec, opts)
    scheme.set_common(common)
    scheme = scheme.to(ref.device)

    state = RetrofitState(
        root=model,
        scheme_name=to,
        adapter=adapter,
        kernel=kernel,
        original_attn=model.config._attn_implementation,
        native_max=adapter.native_max_length(),
    )
    model.add_module(POSITIONS_MODULE, scheme)
    model._retrofit_state = state
    try:
        state.hooks.extend(track_inputs(state, adapter.base()))  # positions and cache length of each call
        state.swaps = adapter.neutralise(state)
        if scheme.kind == "absolute" and adapter.native_kind not in TABLE_KINDS:  # no table to stand in for
            state.swaps += adapter.add_absolute(state)
        for sw in state.swaps:
            if not sw.freeze:  # a stand-in that reuses the original's weights (e.g. a wrapped attention module)
                continue
            for p in sw.original.parameters():
                if p.requires_grad:
                    p.requires_grad_(False)
                    state.frozen.append(p)
        for at in adapter.attention_layers():
            at.module._retrofit_layer = LayerContext(state, at.layer, at.window, at.positions)
        _set_attn(model, ATTN_NAME)
        previous = getattr(model.config, "retrofit", None) or {}
        model.config.retrofit = {
            "base_model": previous.get("base_model") or getattr(model.config, "_name_or_path", None) or None,
            "scheme": to,
            "options": scheme.options_dict(),
            "architecture": adapter.name,
            "native": {"kind": adapter.native_kind, "length": spec.native_length},
            "kernel": kernel,
            "retrofit_version": __version__,
            "base_config": base_config(model.config, previous, type(model).__name__),
        }
        if common.qk_norm and not from_checkpoint:
            _calibrate_qk_norm(model, state, spec.native_length)
        if how.verify:
            _verify_live(model, state)
        advertise_reach(model, state, reach(model))
    except BaseException:
        revert(model)
        raise
    log.info("converted %s (%s) to %s %s", type(model).__name__, adapter.name, to, scheme.options_dict())
    return model


def reach(model) -> int:
    """How far the converted model may read: the scheme's limit, else ``UNBOUNDED`` (no limit)."""
    return describe(model)["max_length"] or UNBOUNDED


def _embedding_rms(model) -> float | None:
    """Root-mean-square of the input token embeddings (absolute schemes scale to it); None if unreadable."""
    try:
        with torch.no_grad():
            return float(model.get_input_embeddings().weight.float().pow(2).mean().sqrt())
    except (AttributeError, NotImplementedError, RuntimeError):  # no embedding module, meta or quantised weights
        return None


def _own_config(model) -> None:
    """Give the model a config object of its own before converting writes to it (reach, attention function,
    the ``retrofit`` block): the caller may still hold the one it built the model from and build another
    model from it. Every module that shares the model's config gets the copy."""
    shared = model.config
    own = copy.deepcopy(shared)
    for m in model.modules():
        if getattr(m, "config", None) is shared:
            m.config = own


def _set_attn(model, name: str | None):
    model.config._attn_implementation = name
    for m in model.modules():  # some modules cache a config of their own
        cfg = getattr(m, "config", None)
        if cfg is not None and cfg is not model.config and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name


def _calibrate_qk_norm(model, state: RetrofitState, native_length: int, length: int = 256) -> None:
    """Start QK-norm's gains at the mean RMS of each head's q and k on one pass of ``min(length, native)``
    deterministic tokens, so normalised scores start close to the original ones. The pass runs with
    gains of one and the norm itself off (``state.calibration`` collects the RMS per layer and head)."""
    scheme = state.scheme()
    vocab = model.get_input_embeddings().weight.shape[0]
    n = min(length, native_length)
    ids = ((torch.arange(n, device=next(model.parameters()).device) * 7919 + 11) % vocab)[None]
    state.calibration = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(input_ids=ids)
        with torch.no_grad():
            for (layer, which), rms in state.calibration.items():
                gain = scheme.q_gain if which == "q" else scheme.k_gain
                gain[layer] = rms[:, None].to(gain.dtype)  # (H, 1) over the head dim
        calibrated = len(state.calibration)
    finally:
        state.calibration = None
        model.train(was_training)
    if calibrated != 2 * scheme.spec.num_layers:
        raise PatchNotLiveError(
            f"qk_norm: the calibration pass reached {calibrated // 2} of {scheme.spec.num_layers} layers"
        )
    log.info("qk_norm: gains calibrated on %d tokens", n)


def _check_direction(adapter, scheme_cls, to: str) -> None:
    """A model whose attention sees keys after the query (an encoder) takes only a scheme defined for them."""
    both = [s.layer for s in adapter.attention_layers() if not getattr(s.module, "is_causal", True)]
    if both and not scheme_cls.bidirectional:
        ok = sorted(n for n, c in SCHEMES.items() if c.bidirectional)
        raise OptionError(
            f"scheme {to!r} is defined for keys before the query only, and this model's attention is "
            f"bidirectional (layers {both[:4]}{'...' if len(both) > 4 else ''}): use one of {', '.join(ok)}"
        )


def _probe_convert(model, scheme: str, options: dict) -> None:
    _convert(model, scheme, options, Converting(probing=True))


def _verify_live(model, state: RetrofitState, length: int = 8):
    """Run a short probe; raise PatchNotLiveError unless every layer ran the new attention
    and the native mechanism's stand-in was consulted."""
    layers = state.adapter.attention_layers()
    state.calls.clear()
    stand_ins = [getattr(sw.parent, sw.attr) for sw in state.swaps]  # stand-in modules count their calls
    stand_ins = [s for s in stand_ins if isinstance(s, nn.Module)]  # (a longer buffer swapped in counts nothing)
    for s in stand_ins:
        s.calls = 0
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(length, device=next(model.parameters()).device) * 7 + 3) % vocab
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(input_ids=ids[None], use_cache=False)
    finally:
        model.train(was_training)
    missing = [s.layer for s in layers if state.calls.get(s.layer, 0) == 0]
    if missing:
        raise PatchNotLiveError(
            f"the new attention did not run in layers {missing} of {len(layers)}; this transformers version "
            f"may dispatch attention differently. Nothing was converted."
        )
    idle = [type(s).__name__ for s in stand_ins if s.calls == 0]
    if idle:
        raise PatchNotLiveError(f"the native positional mechanism was not replaced ({', '.join(idle)} never called)")
    state.calls.clear()


def revert(model) -> nn.Module:
    """Undo ``convert``: the original modules and attention implementation come back; logits equal the original's."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("model is not converted (nothing to revert)")
    for handle in reversed(state.hooks):
        handle.remove()
    for sw in reversed(state.swaps):
        release = getattr(getattr(sw.parent, sw.attr), "release", None)  # a stand-in that lent the original something
        if release is not None:
            release()
        original = sw.original
        if isinstance(original, torch.Tensor):  # a buffer swapped out (BERT's position ids): follow device moves
            original = original.to(getattr(sw.parent, sw.attr).device)
        setattr(sw.parent, sw.attr, original)
    for p in state.frozen:
        p.requires_grad_(True)
    for at in state.adapter.attention_layers():
        if hasattr(at.module, "_retrofit_layer"):
            del at.module._retrofit_layer
    _set_attn(model, state.original_attn)
    withdraw_reach(model, state)
    if POSITIONS_MODULE in model._modules:
        del model._modules[POSITIONS_MODULE]
    if hasattr(model.config, "retrofit"):
        del model.config.retrofit
    del model._retrofit_state
    return model


def max_length(model, *, fading: bool | None = None) -> int | None:
    """Longest input a converted model accepts (None: no limit). ``fading``: while the native mechanism
    is mixed back in (``native_fade`` > 0) its table bounds positions too; default: as set now."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("max_length needs a converted model (retrofit.describe covers both)")
    limit = state.scheme().max_length()
    if (state.placement.native_fade > 0 if fading is None else fading) and state.native_max:
        limit = min(limit or 1 << 62, state.native_max)
    return limit


def reapply(model, block: dict) -> nn.Module:
    """Convert a freshly loaded base model as a saved checkpoint's ``retrofit`` block says (scheme,
    options, kernel), without the probe: the caller restores the learned position parameters, then
    calls ``verify``."""
    how = Converting(kernel=block.get("kernel", "auto"), verify=False, from_checkpoint=True)
    return _convert(model, block["scheme"], block["options"], how)


def verify(model) -> None:
    """Run the liveness probe on a converted model (PatchNotLiveError unless the patch runs in every layer)."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("verify needs a converted model")
    _verify_live(model, state)


def scheme_of(model) -> Scheme:
    """The live scheme module of a converted model (PEFT's active copy when wrapped)."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("scheme_of needs a converted model")
    return state.scheme()


def position_controls(model) -> tuple[int, float]:
    """(offset, native_fade) now set on a converted model (see ``set_position_controls``)."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("position_controls needs a converted model")
    return state.placement.offset, state.placement.native_fade


def is_converted(model) -> bool:
    return _state(model) is not None


def frozen_parameters(model) -> list[nn.Parameter]:
    """The parameters ``convert`` froze (the swapped-out native mechanism); empty when unconverted."""
    state = _state(model)
    return list(state.frozen) if state else []


def set_kernel(model, kernel: str) -> None:
    """Choose the attention kernel of a converted model: auto or a kernel of ``retrofit.kernels.KERNELS``
    (earlier names such as ``fused`` are mapped). Saved with the model (its config's ``retrofit`` block)."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("set_kernel needs a converted model")
    state.kernel = model.config.retrofit["kernel"] = kernels.check(kernel, state.scheme().kind)


def set_position_controls(model, offset: int = 0, native_fade: float = 0.0, positions=None) -> None:
    """Fine-tune controls. ``offset``: shift every position by k (random-offset augmentation; a
    scheme whose scores depend only on i - j, ``Scheme.shift_invariant``, is unaffected).
    ``native_fade`` in [0, 1]: add this much of the native mechanism back (1 = fully native,
    0 = the new scheme alone). ``positions``: a 1-D strictly increasing tensor giving the absolute
    position of each token of the next blocks (PoSE, randomized positions; no cache while set).
    Calling it with no arguments resets all three."""
    place(model, Placement(offset, native_fade, positions))


def place(model, placement: Placement) -> None:
    """Set a fine-tune's ``Placement`` of the next blocks on a converted model (checked; see
    ``set_position_controls``); ``Placement()`` resets it."""
    state = _state(model)
    if state is None:
        raise NotConvertedError("set_position_controls needs a converted model")
    offset, native_fade, positions = placement.offset, placement.native_fade, placement.positions
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise OptionError(f"offset must be a non-negative int; got {offset!r}")
    if not isinstance(native_fade, (int, float)) or not 0 <= native_fade <= 1:
        raise OptionError(f"native_fade must be in [0, 1]; got {native_fade!r}")
    if positions is not None:
        positions = _check_positions(state, positions)
        if offset or native_fade:
            raise OptionError("positions cannot be combined with offset or native_fade")
    state.placement = Placement(offset, float(native_fade), positions)


def _check_positions(state, positions) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.dtype.is_floating_point:
        raise OptionError(f"positions must be a 1-D integer tensor; got {positions!r}")
    if len(positions) and (int(positions[0]) < 0 or bool((positions[1:] <= positions[:-1]).any())):
        raise OptionError("positions must be non-negative and strictly increasing")
    limit = state.scheme().max_length()
    if limit is not None and len(positions) and int(positions[-1]) >= limit:
        raise LengthError(
            f"scheme {state.scheme_name!r} supports at most {limit} positions; "
            f"the largest given is {int(positions[-1])}"
        )
    return positions.long()


def describe(model) -> dict[str, Any]:
    """What the model uses now: scheme, options, native mechanism, whether converted, max length."""
    state = _state(model)
    model_type = getattr(model.config, "model_type", None)
    if state is None:
        try:
            adapter = adapter_for(model)
        except RetrofitError:
            adapter = None
        native = {"kind": adapter.native_kind, "length": adapter.spec().native_length} if adapter else {}
        return {
            "converted": False,
            "scheme": None,
            "options": {},
            "model_type": model_type,
            "base_model": getattr(model.config, "_name_or_path", None) or None,
            "architecture": adapter.name if adapter else None,
            "native": native,
            "max_length": adapter.native_max_length() if adapter else getattr(model.config, "n_positions", None),
            "positions_module": None,
            "trainable_position_parameters": 0,
            "kernel": None,
            "last_kernel": None,
            "retrofit_version": __version__,
        }
    scheme = state.scheme()
    limit = max_length(model)
    return {
        "converted": True,
        "scheme": state.scheme_name,
        "options": scheme.options_dict(),
        "model_type": model_type,
        "base_model": model.config.retrofit.get("base_model"),
        "architecture": state.adapter.name,
        "native": dict(model.config.retrofit["native"]),
        "max_length": limit,
        "positions_module": POSITIONS_MODULE,
        "trainable_position_parameters": sum(p.numel() for p in scheme.parameters()),
        "kernel": state.kernel,
        "last_kernel": state.last_kernel,
        "kernels": dict(state.kernels),
        "retrofit_version": __version__,
    }
