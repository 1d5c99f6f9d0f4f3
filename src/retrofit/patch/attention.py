"""The attention and mask functions registered as ``"retrofit"`` with transformers'
``AttentionInterface`` / ``AttentionMaskInterface``: they read the layer's context (``state.LayerContext``)
and run the converted model's scheme: one ``kernels.Call`` per call, handed to the path table (``kernels.attend``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import kernels
from ..adapters.calls import state_positions
from ..foundation.errors import LengthError, PatchNotLiveError, RetrofitError
from .state import LayerContext

ATTN_NAME = "retrofit"


@dataclass
class Site:
    """One call of a converted layer's attention: its layer, scheme and kind, its direction, and where its
    queries and keys sit (``q_start``: earlier keys in the cache; ``shift``: a sliding-window cache's dropped
    keys; ``placed``: a training block's own positions)."""

    ctx: LayerContext
    scheme: object
    kind: str  # the scheme's kind ("bias", "rotary", "relative", "absolute", "none")
    causal: bool
    scaling: float
    Tq: int
    Tk: int
    q_start: int
    shift: int
    placed: bool

    @property
    def state(self):
        return self.ctx.state


@dataclass
class BiasTerms:
    """A bias scheme's term for one call: the bias function and what the fused paths read instead of it."""

    bias: object = None  # bias(h, i, j) of slot indices
    slopes: torch.Tensor | None = None  # ALiBi's (H,), scaled
    band: torch.Tensor | None = None  # T5's / Shaw's (H, K + 1), scaled
    rows: torch.Tensor | None = None  # (B,) per-row shifts where rows sit at different positions
    tau: torch.Tensor | None = None  # the temperature left to the row scale (None once folded into the bias)
    layer: object = None
    scale: float | None = None


def retrofit_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query (B, H, Tq, D), key/value (B, Hkv, Tk, D) -> ((B, Tq, H, D), None): each kind prepares its term,
    then one ``kernels.Call`` goes to the path table."""
    site = _site(module, query, key, scaling, kwargs)
    state, scheme = site.state, site.scheme
    if state.attention_dropout is not None:  # a fine-tune's train.attention_dropout, in place of the module's
        dropout = state.attention_dropout if module.training else 0.0
    if scheme.common.qk_norm and site.ctx.positions:
        query, key = _qk_norm(state, scheme, site.ctx.layer, query, key, site.q_start)
    far = None
    if site.kind == "rotary":
        query, key, far = _rotary(site, query, key)
    rel_query = None
    if site.kind == "relative":  # Transformer-XL: content query q + u, position query q + v
        query, rel_query = scheme.relative_queries(site.ctx.layer, query)
    tau = None
    if scheme.common.temperature and site.ctx.positions:
        query, rel_query, far, tau = _temperature(site, query, rel_query, far)
    relative = None
    if rel_query is not None:
        relative = _relative(state, scheme, site.ctx.layer, rel_query, site.Tk, site.placed, site.causal)
    terms = _bias_terms(site, query, tau) if site.kind == "bias" else BiasTerms(tau=tau)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise RetrofitError("retrofit attention takes a 2D padding mask; a custom 4D mask is not supported")
    call = kernels.Call(
        query,
        key,
        value,
        site.scaling,
        bias=terms.bias,
        slopes=terms.slopes,
        band=terms.band,
        row_scale=terms.tau,
        relative=relative,
        key_padding=attention_mask,
        window=site.ctx.window,
        q_start=site.q_start,
        dropout=dropout,
        bias_params=tuple(scheme.parameters()) if terms.bias is not None else (),
        causal=site.causal,
        softcap=kwargs.get("softcap"),  # gemma2's attention-logit softcapping
        sinks=kwargs.get("s_aux", getattr(module, "sinks", None)),  # gpt_oss's attention sinks
        far=far,
    )
    out = _run(site, call, terms)
    return out.transpose(1, 2).contiguous(), None


def _site(module, query, key, scaling, kwargs) -> Site:
    """The call's ``Site``, checked: a converted layer, a direction its scheme has, a length it reaches, and a
    block's own positions only on a call without a cache."""
    ctx: LayerContext | None = getattr(module, "_retrofit_layer", None)
    if ctx is None:
        raise PatchNotLiveError(
            f"the retrofit attention function was called by {type(module).__name__}, which was not converted; "
            "use retrofit.convert(model, ...) or retrofit.load(path), not config._attn_implementation"
        )
    state, scheme = ctx.state, ctx.state.scheme()
    causal = kwargs.get("is_causal")  # the direction: the call's, else the module's (an encoder's is False)
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    kind = scheme.kind if ctx.positions else "none"  # a layer the original ran without positions stays so
    Tq, Tk, D = query.shape[-2], key.shape[-2], query.shape[-1]
    if not causal and kind in ("bias", "relative") and not scheme.bidirectional:
        raise RetrofitError(
            f"scheme {scheme.name!r} has no bidirectional form; this attention sees keys after the query"
        )
    limit = scheme.max_length()
    if limit is not None and Tk > limit:
        raise LengthError(f"scheme {scheme.name!r} supports at most {limit} positions; got {Tk}")
    q_start = Tk - Tq  # the cache holds Tk - Tq earlier keys
    # a sliding-window cache drops its oldest keys: shift slot indices to the tokens' true positions
    # (a scheme that reads absolute positions, e.g. FIRE's normaliser or dynamic RoPE, needs them)
    seen = (state.inputs or {}).get("past", 0)
    placed = state.positions is not None  # a training block's own positions (PoSE, randomized)
    if placed and (q_start or Tk > len(state.positions)):
        raise RetrofitError(
            f"position override of {len(state.positions)} positions set (a fine-tune's PoSE/randomized "
            f"positions) but this call has {Tk} keys with a cache of {q_start}; reset it first"
        )
    shift = seen - q_start if seen > q_start else 0
    scaling = D**-0.5 if scaling is None else scaling
    return Site(ctx, scheme, kind, causal, scaling, Tq, Tk, q_start, shift, placed)


def _rotary(site: Site, query, key):
    """(query, key, far view): q and k rotated at their positions; SelfExtend / STRING's far view from q and k
    before the rotation (a sliding-window layer whose window is within native never reads past it, so it keeps
    its exact positions)."""
    state, scheme, layer, q_start = site.state, site.scheme, site.ctx.layer, site.q_start
    local = site.ctx.window is not None and site.ctx.window <= scheme.spec.native_length
    reach = None if local else scheme.far_reach(layer)
    far = None
    if reach is not None:
        far = _far_view(state, scheme, query, key, site, reach)
    k_pos = state.place(torch.arange(site.Tk, device=query.device) + site.shift)
    length = _rotary_length(state, scheme, site.Tq, site.Tk + site.shift, query.device, site.placed)
    first = None if site.placed else site.shift + state.offset  # consecutive positions: cos/sin from a table
    new = None if first is None else first + q_start
    query = scheme.rotate(layer, query, k_pos[q_start:], length, start=new)
    if _rotate_once(state, scheme, key):
        # the cache keeps rotated keys, as a native RoPE model's does: rotate only the new rows, in place
        key[:, :, q_start:] = scheme.rotate(layer, key[:, :, q_start:], k_pos[q_start:], length, start=new)
    else:
        key = scheme.rotate(layer, key, k_pos, length, start=first)
    if far is not None and far.k is None:  # STRING: the far view's keys are where they are
        far = kernels.Far(far.q, key, far.reach)
    return query, key, far


def _temperature(site: Site, query, rel_query, far):
    """The length-aware temperature: every logit of query i times tau_i (B or 1, Tq), its positional terms'
    too (padding-aware): (query, rel_query, far, tau) scaled."""
    tau = site.scheme.temperature(site.state.place(state_positions(site.state, site.Tq, query.device)))
    times = tau.to(query.dtype)[:, None, :, None]
    query = query * times
    rel_query = None if rel_query is None else rel_query * times
    far = None if far is None else kernels.Far(far.q * times, far.k, far.reach)
    return query, rel_query, far, tau


def _bias_terms(site: Site, query, tau) -> BiasTerms:
    """A bias scheme's term: the bias function (at a block's own positions, or moved by a cache's shift), ALiBi's
    slopes or T5/Shaw's band for the fused paths where they are exact, per-row shifts where left padding or
    position ids move rows off their slots, and the temperature folded into the bias where it is the slots'."""
    scheme, state, placed = site.scheme, site.state, site.placed
    t = BiasTerms(tau=tau, layer=site.ctx.layer_index(query.device))  # a 0-d tensor: compiled score_mods keep it
    t.scale = site.scaling if scheme.bias_scaled_with_scores else None
    moved = site.shift + state.offset  # a distance-only bias ignores it; FIRE's normaliser reads i
    if not (scheme.shift_invariant or placed):  # left padding / position_ids move a row's tokens off their slots
        rows = _row_shifts(state, site.Tq, site.Tk, query.device)
        t.rows = None if rows is None or bool((rows == site.shift).all()) else rows + state.offset  # (B,)
    t.bias = _bias_fn(scheme, t.layer, state.place if placed else None, moved, t.scale)
    t.slopes = None if placed else scheme.linear_slopes(site.ctx.layer)  # ALiBi: the fused kernels' own
    if t.slopes is not None and t.scale:
        t.slopes = t.slopes * t.scale
    # T5 / Shaw: a distance bias flat past a reach (not with a block's own positions or a temperature)
    t.band = None if placed or tau is not None else scheme.distance_band(site.ctx.layer)
    if t.band is not None and t.scale:
        t.band = t.band * t.scale
    plain = t.slopes is None and t.rows is None and not (placed or moved)
    if tau is not None and plain and _tau_of_slots(scheme, tau, site.q_start, site.Tk):
        # the temperature read from the query's own position inside the bias: a compiled flex score_mod
        # that loads a per-row tensor fails inductor's CPU template (torch 2.13); this one compiles
        tempered, temperature = t.bias, scheme.temperature_fn(query.device)
        t.bias = lambda h, i, j: tempered(h, i, j) * temperature(i)  # noqa: E731
        t.tau = None
    return t


def _run(site: Site, call, terms: BiasTerms) -> torch.Tensor:
    """The call through the path table (one call per group of rows that share a shift, where rows sit at
    different positions); the path is recorded for ``describe``."""
    state = site.state
    if terms.rows is None:
        out, path = kernels.attend(call, state.kernel)
    else:
        out, path = torch.empty_like(call.q), None
        for moved in terms.rows.unique().tolist():
            idx = (terms.rows == moved).nonzero()[:, 0]
            bias = _bias_fn(site.scheme, terms.layer, None, moved, terms.scale)
            out[idx], path = kernels.attend(call.rows(idx, bias), state.kernel)
    state.record(site.ctx.layer, path)
    return out


def _far_view(state, scheme, query, key, site: Site, reach: int):
    """The second view of a two-view rotary scheme: q (and, for SelfExtend, k) rotated at ``far_positions`` of
    each token's absolute position (per batch row where left padding moves a row's tokens off their slots:
    SelfExtend's grouping is not shift-invariant). Keys in the cache are unrotated (``keys_reread``)."""
    q_start, shift = site.q_start, site.shift
    if site.placed:
        raise RetrofitError(
            f"rope extension {scheme.options.extension!r} is training-free: it takes no fine-tune's PoSE or "
            "randomized positions"
        )
    if not site.causal:
        raise RetrofitError(f"rope extension {scheme.options.extension!r} needs causal attention (a decoder)")
    Tq, Tk = query.shape[-2], key.shape[-2]
    slots = state.place(torch.arange(Tk, device=query.device) + shift)  # (Tk,) positions without padding
    moves = _row_shifts(state, Tq, Tk, query.device) if scheme.keys_reread else None
    far_q = torch.empty_like(query)
    far_k = torch.empty_like(key) if scheme.keys_reread else None
    for moved in [None] if moves is None else moves.unique().tolist():
        rows = slice(None) if moved is None else (moves == moved).nonzero()[:, 0]
        pos = slots if moved is None else torch.arange(Tk, device=query.device) + moved + state.offset
        q_pos, k_pos = scheme.far_positions(pos[q_start:], pos)
        far_q[rows] = scheme.rotate(None, query[rows], q_pos, Tk)
        if far_k is not None:
            far_k[rows] = scheme.rotate(None, key[rows], k_pos, Tk)
    return kernels.Far(far_q, far_k, reach)


def _bias_fn(scheme, layer, place, moved: int, scale):
    """The bias of slot indices i, j: at a block's own positions (``place``), else moved by ``moved``.
    (The common unmoved case passes i, j as they are: a Python int added inside a compiled flex score_mod is
    specialised per value and hits the same inductor C++ error as a per-layer int.)"""
    if place is not None:
        bias = lambda h, i, j: scheme.bias(layer, h, place(i), place(j))  # noqa: E731
    elif moved:
        bias = lambda h, i, j: scheme.bias(layer, h, i + moved, j + moved)  # noqa: E731
    else:
        bias = lambda h, i, j: scheme.bias(layer, h, i, j)  # noqa: E731
    if scale:
        return lambda h, i, j: bias(h, i, j) * scale  # noqa: E731
    return bias


def _row_shifts(state, Tq: int, Tk: int, device) -> torch.Tensor | None:
    """Per batch row, position - slot index of its tokens (B,): left padding (positions counted over real
    tokens, as ``generate`` builds them) or a caller's ``position_ids`` move a row's tokens off their slots.
    Read at the row's last real query of this call (its tokens are contiguous). None: no position inputs."""
    info = state.inputs or {}
    if info.get("position_ids") is None and info.get("attention_mask") is None:
        return None
    pos = state_positions(state, Tq, device)  # (B or 1, Tq)
    mask = info.get("attention_mask")
    real = torch.ones_like(pos, dtype=torch.bool)
    if mask is not None and mask.shape[-1] >= Tq:
        real = mask[:, -Tq:].to(device=device, dtype=torch.bool)
    pos, real = torch.broadcast_tensors(pos, real)  # (B, Tq) each: (1, Tq) position ids with a (B, T) mask
    index = torch.where(real, torch.arange(Tq, device=device), -1).max(-1).values  # (B,) last real query; -1: none
    at = index.clamp(min=0)
    shift = pos.gather(-1, at[:, None])[:, 0] - (Tk - Tq + at)  # position - slot
    return torch.where(index >= 0, shift, torch.zeros_like(shift))


def _rotary_length(state, scheme, Tq: int, slots: int, device, placed: bool) -> int:
    """The sequence length a length-dependent rotation (dynamic RoPE) is sized on: as transformers'
    ``dynamic_rope_update``, max(position_ids) + 1 over the batch, so left padding does not count (positions
    from the caller or counted over the 2D mask's real tokens); ``slots`` (the key count) without either."""
    info = state.inputs or {}
    if (
        not scheme.rotation_depends_on_length
        or placed
        or (info.get("position_ids") is None and info.get("attention_mask") is None)
    ):
        return slots
    return int(state_positions(state, Tq, device).max()) + 1


def _tau_of_slots(scheme, tau, q_start, Tk) -> bool:
    """The rows' temperature is the one of their slot indices (no padding, no caller's position ids)."""
    return bool((tau == scheme.temperature(torch.arange(q_start, Tk, device=tau.device))[None]).all())


def _relative(state, scheme, layer, rel_query, Tk, placed, causal=True) -> kernels.Relative:
    """The position side of a relative scheme: one key vector per distance this call can meet (distances
    only, so a sliding-window cache's shift does not enter; a block's own positions may span more), the
    negative ones too where keys after the query count (an encoder)."""
    positions = state.place(torch.arange(Tk, device=rel_query.device)) if placed else None
    n = int(positions.max() - positions.min()) + 1 if placed else Tk
    first = 0 if causal else -(n - 1)
    keys = scheme.relative_keys(layer, n - first, rel_query.dtype, rel_query.device, start=first)  # (H or 1, ., D)
    return kernels.Relative(
        rel_query,
        keys,
        positions,
        sinusoid=scheme.relative_sinusoid(layer, rel_query.device),
        reach=scheme.relative_reach(),
        first=first,
    )


def _qk_norm(state, scheme, layer, query, key, q_start):
    """QK-norm before the positions act. Keys in a cache that were already normalised (and, for a rotary
    scheme writing through the cache, rotated) are left as they are: only the new rows are normalised."""
    if state.calibration is not None:  # calibrating: record each head's RMS, leave q and k as they are
        for which, x in (("q", query), ("k", key)):
            state.calibration[(layer, which)] = x.float().pow(2).mean(dim=(0, 2, 3)).sqrt()
        return query, key
    query = scheme.qk_normed(layer, query, "q")
    if _writes_through_cache(state, key):
        key[:, :, q_start:] = scheme.qk_normed(layer, key[:, :, q_start:], "k")  # the cache keeps normalised keys
        return query, key
    return query, scheme.qk_normed(layer, key, "k")


def _rotate_once(state, scheme, key) -> bool:
    """Rotate each key once, as it enters the cache: a plain DynamicCache holds this very tensor, no
    gradient flows through it, and the scheme rotates a position the same way at every length (dynamic
    RoPE rescales with the length: its whole cache is re-rotated every step, exactly)."""
    return _writes_through_cache(state, key) and not (scheme.rotation_depends_on_length or scheme.keys_reread)


def _writes_through_cache(state, key) -> bool:
    """``key`` is the cache's own tensor (a plain DynamicCache, see ``adapters.calls.track_inputs``) and no
    gradient flows through it: new rows may be transformed in place, once, as they enter the cache."""
    return bool((state.inputs or {}).get("cache_in_place")) and not key.requires_grad


def retrofit_mask(batch_size=None, kv_length=None, kv_offset=0, attention_mask=None, config=None, **kwargs):
    """Linear-memory mask: only the (B, kv_length) padding mask (True = real token), or None (an all-real one for
    a family whose modelling code needs a tensor: ``Adapter.mask_tensor``). Causality and sliding windows are
    applied by the attention function itself."""
    if attention_mask is None:
        if _needs_tensor(config):
            return torch.ones(batch_size, kv_length, dtype=torch.bool, device=kwargs.get("device"))
        return None
    pad = attention_mask[:, kv_offset : kv_offset + kv_length].bool()
    if pad.shape[-1] < kv_length:  # positions not covered by the 2D mask are real tokens
        pad = torch.nn.functional.pad(pad, (0, kv_length - pad.shape[-1]), value=True)
    return None if bool(pad.all()) and not _needs_tensor(config) else pad


def _needs_tensor(config) -> bool:
    from ..adapters.base import adapter_class

    cls = adapter_class(getattr(config, "model_type", None))
    return bool(cls is not None and cls.mask_tensor)


def _register_interfaces():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, retrofit_attention)
    AttentionMaskInterface.register(ATTN_NAME, retrofit_mask)


_register_interfaces()
