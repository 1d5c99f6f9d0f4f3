"""Rotary sources (LLaMA family, GPT-NeoX): the same architecture with ``rope_parameters`` set; and the
translation of retrofit's ``rope`` options into transformers' ``rope_parameters`` (GPT-2 -> GPT-NeoX too)."""

from __future__ import annotations

from typing import Any

from ..foundation.errors import RetrofitError
from ..patch.conversion import scheme_of
from .base import Built, Surgery, plain_config


def rope_parameters(
    o: dict, head_dim: int, native_params: dict | None = None, rot_dims: int | None = None
) -> tuple[dict, int, list[str]]:
    """retrofit's ``rope`` options -> (transformers ``rope_parameters``, ``max_position_embeddings``, notes).
    ``rot_dims``: the rotating dims where the model states them (MLA's qk_rope_head_dim)."""
    theta, fraction, native, factor = (
        float(o["theta"]),
        float(o["fraction"]),
        int(o["native_length"]),
        float(o["factor"]),
    )
    params: dict[str, Any] = {"rope_theta": theta}
    if native_params is None or fraction != 1.0 or "partial_rotary_factor" in native_params:
        params["partial_rotary_factor"] = fraction  # always for GPT-NeoX (its default is 0.25)
    notes: list[str] = []
    scaling = o["scaling"]
    if scaling in ("none", "ntk"):
        rot = rot_dims or int(head_dim * fraction)
        if scaling == "ntk":  # static NTK-aware: the default rope with a larger base
            params["rope_theta"] = theta * factor ** (rot / (rot - 2))
            notes.append(f"static NTK-aware scaling written as default RoPE with rope_theta={params['rope_theta']:.6g}")
        return {"rope_type": "default", **params}, int(native * factor), notes
    params.update(rope_type=scaling, factor=factor)
    if scaling == "yarn":
        params.update(
            original_max_position_embeddings=native, beta_fast=float(o["beta_fast"]), beta_slow=float(o["beta_slow"])
        )
        if o.get("attention_factor") is not None:
            params["attention_factor"] = float(o["attention_factor"])
    if scaling == "dynamic":
        notes.append(
            "dynamic NTK: transformers computes the grown base from a float32 tensor length, retrofit from a Python "
            "int (float64): the frequencies differ by ~1e-7 relative, which grows with the position (measured 8.9e-4 "
            "max logit difference at 8448 tokens on SmolLM2-135M)"
        )
        notes.append(
            "dynamic NTK: a full forward of T tokens uses the frequencies for T (as retrofit does); transformers keeps "
            "the grown frequencies for later, shorter calls and bakes them into the KV cache, while retrofit "
            "re-rotates cached keys with the current length's frequencies, so cached generation past the native "
            "length differs slightly"
        )
        return params, native, notes  # transformers' dynamic rope takes max_position_embeddings as the native length
    return params, int(native * factor), notes


def _keep_rotary_pct(cfg) -> None:
    """transformers 5.0 rebuilds GPT-NeoX's partial_rotary_factor from the legacy ``rotary_pct`` key (default
    0.25) whenever a config is loaded: write that key too, so every 5.x reads the same fraction."""
    cfg.rotary_pct = cfg.rope_parameters.get("partial_rotary_factor", 1.0)


def _check_rope_config(config, wanted: dict) -> None:
    """transformers may rewrite rope_parameters (legacy keys, defaults): the ones we set must survive."""
    got = dict(config.rope_parameters or {})
    bad = {k: (v, got.get(k)) for k, v in wanted.items() if got.get(k) != v}
    if bad:
        raise RetrofitError(f"export: transformers did not keep rope_parameters {bad} (wanted, got)")


def same_architecture(model, info, opts) -> Built:
    spec = scheme_of(model).spec  # the adapter's spec of the unconverted model
    o = info["options"]
    nat = spec.native_rope or {}
    if float(o["fraction"]) != float(nat.get("fraction", 1.0)):
        raise RetrofitError(
            f"export: rotary fraction {o['fraction']} differs from the model's own ({nat.get('fraction')}); "
            f"{type(model).__name__} rotates a fixed part of each head: use retrofit.load"
        )
    cfg = plain_config(model)
    main = nat.get("main_type")  # per-layer-type rope (gemma3): the options went to this type's layers only
    all_params = dict(model.config.rope_parameters or {})
    native_params = dict(all_params[main]) if main else all_params
    same = o["scaling"] == "none" and nat.get("theta") is not None and float(o["theta"]) == float(nat["theta"])
    if same:  # the scheme kept the model's own frequencies (native scaling included)
        rope, max_pos, notes = native_params, cfg.max_position_embeddings, ["RoPE unchanged: the original config"]
    else:
        rope, max_pos, notes = rope_parameters(o, spec.head_dim, native_params, nat.get("rot_dims"))
        if nat.get("rope_type", "default") != "default":
            notes.append(f"the model's native {nat['rope_type']!r} rope scaling is replaced, as in the patched model")
        if main:
            notes.append(f"rope_parameters[{main!r}] rescaled; the other layer types keep their own, as patched")
    cfg.rope_parameters = {**all_params, main: rope} if main else rope
    cfg.max_position_embeddings = max_pos
    if getattr(cfg, "alibi", False):  # a Falcon whose ALiBi became RoPE: the same architecture, rotary
        cfg.alibi = False
        notes.append("Falcon's ALiBi replaced by its rotary (alibi: false), as patched")
    if cfg.model_type == "gpt_neox":
        _keep_rotary_pct(cfg)
    dst = type(model)(cfg).to(dtype=model.dtype).eval()
    _check_rope_config(dst.config, {main: rope} if main else rope)
    strict = rope.get("rope_type") != "dynamic"  # see the float32 note in rope_parameters
    cut = Surgery(dst)
    src_sd = {k: v for k, v in model.state_dict().items() if not k.startswith("retrofit_positions.")}
    dst_names = {n for n, _ in dst.named_parameters()}
    extra = sorted(set(src_sd) - set(dst.state_dict()))
    if extra:
        raise RetrofitError(f"export: source tensors with no place in {type(dst).__name__}: {extra[:8]}")
    for name, p in dst.named_parameters():
        if name in src_sd and name in dst_names:
            cut(p, src_sd[name], name)
    return Built(cut.finish(model), exact=True, notes=notes, strict=strict)
