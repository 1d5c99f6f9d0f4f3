"""Native-architecture export: write a converted model as an architecture transformers already has.

    retrofit.export(model_or_run_dir, "out/", native=True) -> ExportResult

The exported folder loads with plain ``transformers.AutoModelForCausalLM.from_pretrained(out)``,
without retrofit and without remote code (no ``retrofit`` block, no ``auto_map`` in its config).
One short function per (adapter, scheme) pair maps the weights (nanoGPT-style surgery: every
tensor's name and shape is checked before it is copied):

    gpt2  + alibi (scale_bias=True)  -> Falcon (alibi=True, sequential residual, biases, gelu_new)
    gpt2  + rope                     -> GPT-NeoX (use_parallel_residual=False, rotary_pct, tied embeddings)
    gpt2 | gpt_neo | opt + nope       -> the same architecture, position table all zeros and enlarged
    gpt2 | gpt_neo | opt + sinusoidal -> the same architecture, position table = the fixed sinusoids
    llama | gpt_neox + rope (any scaling) -> the same architecture with ``rope_parameters`` set

After writing, the folder is loaded back with plain transformers and its logits are compared with
the patched model's on random token ids past the native length; the result (and versions) go to
``retrofit_export.json`` beside the weights. A pair that no native architecture can express (T5
buckets, FIRE, ...) is a ``RetrofitError`` that points to ``retrofit.load``; ALiBi added after the
score scaling (``scale_bias=False``) is refused too unless ``approximate=True`` (Falcon, inexact,
reported with the perplexity difference). See docs/export.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import run_folder as rf
from .errors import OptionError, RetrofitError
from .versions import library_versions

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # max abs logit difference (fp32) for an export that claims to be exact
FALCON_BF16_EXACT = 258  # Falcon builds slope * position in bfloat16: positions 0..256 are exact, 257 is not


# ---------------------------------------------------------------------------------------------
# result and registry
# ---------------------------------------------------------------------------------------------
class ExportResult(dict):
    """What ``export`` wrote: ``out``, ``native``, ``mapping``, ``target`` (architecture class),
    ``exact``, ``max_abs_logit_diff`` (measured on the written folder), ``check_length``, ``notes``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Built:
    """A mapping's output: the native model (weights copied) and what is known about its exactness."""

    model: nn.Module
    exact: bool  # equal to the patched model (within TOLERANCE in fp32) at every length up to exact_below
    notes: list[str] = field(default_factory=list)
    exact_below: int | None = None  # exactness only holds for sequences shorter than this (None: any length)
    strict: bool = True  # a measured difference above the tolerance is an error (False: reported, not raised)


MAPPINGS: dict[tuple[str, str], Callable[..., Built]] = {}
MAPPING_TARGETS: dict[tuple[str, str], str] = {}


def mapping(adapter: str, scheme: str, target: str):
    """Register ``fn(model, info, options) -> Built`` for converted (adapter, scheme) models."""

    def deco(fn):
        MAPPINGS[(adapter, scheme)] = fn
        MAPPING_TARGETS[(adapter, scheme)] = target
        return fn

    return deco


def supported_pairs() -> list[str]:
    """``["gpt2+alibi -> FalconForCausalLM", "gpt2|gpt_neo|opt+nope -> same architecture ...", ...]``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for (adapter, scheme), target in MAPPING_TARGETS.items():
        groups.setdefault((scheme, target), []).append(adapter)
    return [f"{'|'.join(adapters)}+{scheme} -> {target}" for (scheme, target), adapters in groups.items()]


# ---------------------------------------------------------------------------------------------
# weight surgery
# ---------------------------------------------------------------------------------------------
def put(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    """Copy ``src`` into parameter/buffer ``dst`` (named ``name`` in errors) after checking the shape."""
    if tuple(dst.shape) != tuple(src.shape):
        raise RetrofitError(f"export: shape mismatch for {name}: target {tuple(dst.shape)}, source {tuple(src.shape)}")
    with torch.no_grad():
        dst.copy_(src.to(dtype=dst.dtype, device=dst.device))


def per_head_qkv(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """GPT-2 fused attention (Conv1D, (E, 3E) = [q | k | v] columns) -> a Linear weight (3E, E) whose
    rows are interleaved per head [q_h, k_h, v_h] (Falcon, GPT-NeoX). A bias (3E,) works the same way."""
    out = weight.T if weight.dim() == 2 else weight  # (3E, E) or (3E,)
    three_e = out.shape[0]
    head_dim = three_e // (3 * num_heads)
    rest = out.shape[1:]
    return out.reshape(3, num_heads, head_dim, *rest).transpose(0, 1).reshape(three_e, *rest)


def copy_lm_head(dst_model, src_model) -> None:
    """Tied models share the embedding; an untied source head is copied."""
    src, dst = src_model.get_output_embeddings(), dst_model.get_output_embeddings()
    if src.weight is src_model.get_input_embeddings().weight:
        if dst.weight is not dst_model.get_input_embeddings().weight:
            raise RetrofitError("export: the source ties its lm_head to the embeddings but the target does not")
        return
    put(dst.weight, src.weight, "lm_head.weight")


def check_surgery(dst_model, copied: set[int]) -> None:
    """Every parameter of the target must have been written (no silently random weight)."""
    missing = [n for n, p in dst_model.named_parameters() if id(p) not in copied]
    if missing:
        raise RetrofitError(f"export: target parameters left unset: {missing[:8]}")


class Surgery:
    """Tracks which target parameters were written."""

    def __init__(self, dst_model):
        self.dst = dst_model
        self.done: set[int] = set()

    def __call__(self, dst: torch.Tensor, src: torch.Tensor, name: str):
        put(dst, src, name)
        self.done.add(id(dst))

    def finish(self, src_model):
        copy_lm_head(self.dst, src_model)
        self.done.add(id(self.dst.get_output_embeddings().weight))
        check_surgery(self.dst, self.done)
        return self.dst


# ---------------------------------------------------------------------------------------------
# GPT-2 source
# ---------------------------------------------------------------------------------------------
def _gpt2_checks(model) -> None:
    c = model.config
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx:
        raise RetrofitError(
            "export: this GPT-2 scales attention scores differently (scale_attn_weights=False or "
            "scale_attn_by_inverse_layer_idx=True); no native architecture matches: use retrofit.load"
        )


def _gpt2_common(c) -> dict:
    return {
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
        "pad_token_id": getattr(c, "pad_token_id", None), "initializer_range": c.initializer_range,
        "tie_word_embeddings": _tied(c),
    }


def _tied(config) -> bool:
    return bool(getattr(config, "tie_word_embeddings", True))


@mapping("gpt2", "alibi", "FalconForCausalLM")
def gpt2_alibi_to_falcon(model, info, opts) -> Built:
    """Falcon with ``alibi=True`` adds the bias before the 1/sqrt(d) scaling: exact for ``scale_bias=True``."""
    from transformers import FalconConfig, FalconForCausalLM

    _gpt2_checks(model)
    scaled = bool(info["options"].get("scale_bias"))
    if not scaled and not opts["approximate"]:
        raise RetrofitError(
            "export: gpt2 + alibi with scale_bias=False (bias added after the 1/sqrt(d) scaling) has no native "
            "architecture: Falcon adds it before the scaling, MPT has no linear biases and BLOOM adds an embedding "
            "LayerNorm. Convert with `--option scale_bias=true` (before fine-tuning) for an exact Falcon export, "
            "pass approximate=True (--approximate) for an inexact Falcon export, or load this model with "
            "retrofit.load(path)"
        )
    c = model.config
    cfg = FalconConfig(
        **_gpt2_common(c), num_kv_heads=c.n_head, alibi=True, parallel_attn=False, bias=True, multi_query=False,
        new_decoder_architecture=False, activation=c.activation_function, ffn_hidden_size=c.n_inner or 4 * c.n_embd,
        layer_norm_epsilon=c.layer_norm_epsilon, max_position_embeddings=opts["reach"],
        hidden_dropout=c.resid_pdrop, attention_dropout=c.attn_pdrop,
    )
    dst = FalconForCausalLM(cfg).to(dtype=model.dtype).eval()
    cut = Surgery(dst)
    src, out = model.transformer, dst.transformer
    cut(out.word_embeddings.weight, src.wte.weight, "wte")
    for i, (s, d) in enumerate(zip(src.h, out.h, strict=True)):
        _gpt2_block(cut, s, d, d.self_attention, d.input_layernorm, d.post_attention_layernorm, c.n_head, f"h.{i}")
    cut(out.ln_f.weight, src.ln_f.weight, "ln_f.weight")
    cut(out.ln_f.bias, src.ln_f.bias, "ln_f.bias")
    built = Built(cut.finish(model), exact=scaled, exact_below=FALCON_BF16_EXACT if scaled else None)
    if not scaled:
        built.notes.append(
            f"approximate: the model adds the ALiBi bias after the 1/sqrt(d) scaling, Falcon before it, so the "
            f"exported slopes are effectively divided by sqrt({c.n_embd // c.n_head})")
    built.notes.append(
        f"Falcon builds the ALiBi bias slope*position in bfloat16 (transformers' build_alibi_tensor): in fp32 the "
        f"export is exact for sequences of up to {FALCON_BF16_EXACT - 1} tokens; beyond, key biases are rounded "
        "to 8 significant bits"
    )
    if not math.log2(c.n_head).is_integer():
        built.exact = False
        built.notes.append(f"{c.n_head} heads (not a power of two): some slopes are not exact in bfloat16")
    built.notes.append("Falcon's eager attention (attn_implementation='eager', output_attentions=True) adds the bias "
                       "twice in transformers 5.x; use the default sdpa")
    return built


def _gpt2_block(cut, s, d, attn, ln1, ln2, n_head: int, name: str) -> None:
    """One GPT-2 block into a sequential-residual block with per-head fused QKV (Falcon, GPT-NeoX)."""
    cut(ln1.weight, s.ln_1.weight, f"{name}.ln_1.weight")
    cut(ln1.bias, s.ln_1.bias, f"{name}.ln_1.bias")
    cut(attn.query_key_value.weight, per_head_qkv(s.attn.c_attn.weight, n_head), f"{name}.attn.c_attn.weight")
    cut(attn.query_key_value.bias, per_head_qkv(s.attn.c_attn.bias, n_head), f"{name}.attn.c_attn.bias")
    cut(attn.dense.weight, s.attn.c_proj.weight.T, f"{name}.attn.c_proj.weight")  # Conv1D (in, out) -> (out, in)
    cut(attn.dense.bias, s.attn.c_proj.bias, f"{name}.attn.c_proj.bias")
    cut(ln2.weight, s.ln_2.weight, f"{name}.ln_2.weight")
    cut(ln2.bias, s.ln_2.bias, f"{name}.ln_2.bias")
    mlp = d.mlp
    cut(mlp.dense_h_to_4h.weight, s.mlp.c_fc.weight.T, f"{name}.mlp.c_fc.weight")
    cut(mlp.dense_h_to_4h.bias, s.mlp.c_fc.bias, f"{name}.mlp.c_fc.bias")
    cut(mlp.dense_4h_to_h.weight, s.mlp.c_proj.weight.T, f"{name}.mlp.c_proj.weight")
    cut(mlp.dense_4h_to_h.bias, s.mlp.c_proj.bias, f"{name}.mlp.c_proj.bias")


@mapping("gpt2", "rope", "GPTNeoXForCausalLM")
def gpt2_rope_to_neox(model, info, opts) -> Built:
    """GPT-NeoX with a sequential residual is GPT-2 with rotate-half RoPE on the first rotary_pct of each head."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    _gpt2_checks(model)
    c = model.config
    rope, max_pos, notes = rope_parameters(info["options"], head_dim=c.n_embd // c.n_head)
    cfg = GPTNeoXConfig(
        **_gpt2_common(c), intermediate_size=c.n_inner or 4 * c.n_embd, hidden_act=c.activation_function,
        rope_parameters=rope, rotary_pct=rope["partial_rotary_factor"], max_position_embeddings=max_pos,
        layer_norm_eps=c.layer_norm_epsilon, use_parallel_residual=False, attention_bias=True,
        hidden_dropout=c.resid_pdrop, attention_dropout=c.attn_pdrop,
    )
    _keep_rotary_pct(cfg)
    dst = GPTNeoXForCausalLM(cfg).to(dtype=model.dtype).eval()
    _check_rope_config(dst.config, rope)
    cut = Surgery(dst)
    src, out = model.transformer, dst.gpt_neox
    cut(out.embed_in.weight, src.wte.weight, "wte")
    for i, (s, d) in enumerate(zip(src.h, out.layers, strict=True)):
        _gpt2_block(cut, s, d, d.attention, d.input_layernorm, d.post_attention_layernorm, c.n_head, f"h.{i}")
    cut(out.final_layer_norm.weight, src.ln_f.weight, "ln_f.weight")
    cut(out.final_layer_norm.bias, src.ln_f.bias, "ln_f.bias")
    return Built(cut.finish(model), exact=True, notes=notes, strict=rope.get("rope_type") != "dynamic")


# family -> (state-dict key of the learned position table, config attribute of its size, row of position 0)
POSITION_TABLES = {
    "gpt2": ("transformer.wpe.weight", "n_positions", 0),
    "gpt_neo": ("transformer.wpe.weight", "max_position_embeddings", 0),
    "opt": ("model.decoder.embed_positions.weight", "max_position_embeddings", 2),
}


def baked_table(model, info, opts) -> Built:
    """A learned-absolute family keeps its own architecture; its position table is replaced by the scheme's
    values at positions 0..max_length-1: all zeros for NoPE, the (scaled) sinusoids for ``sinusoidal``."""
    key, size_attr, first = POSITION_TABLES[info["architecture"]]
    cfg = _plain_config(model)
    setattr(cfg, size_attr, opts["max_length"])
    dst = type(model)(cfg).to(dtype=model.dtype).eval()
    cut = Surgery(dst)
    src_sd = {k: v for k, v in model.state_dict().items() if not k.startswith("retrofit_positions.")}
    dst_params = dict(dst.named_parameters())
    if key not in dst_params:
        raise RetrofitError(f"export: {type(dst).__name__} has no position table {key!r}")
    for name, p in dst_params.items():
        if name == key:
            cut(p, _table_rows(model, info, p, first), name)
        elif name in src_sd:
            cut(p, src_sd[name], name)
    what = "an all-zero" if info["scheme"] == "nope" else f"a fixed {info['scheme']}"
    note = (f"{type(dst).__name__} with {what} position table of {opts['max_length']} positions: longer inputs do "
            "not fit the table; re-export with a larger max_length (--max-length)")
    return Built(cut.finish(model), exact=True, notes=[note])


def _table_rows(model, info, table: torch.Tensor, first: int) -> torch.Tensor:
    """(rows, E) table whose row ``first + p`` holds the scheme's embedding of position p."""
    rows = torch.zeros_like(table)
    if info["scheme"] == "nope":
        return rows
    scheme = model._retrofit_state.scheme()
    pos = torch.arange(rows.shape[0] - first, device=table.device)[None]  # (1, max_length)
    with torch.no_grad():
        rows[first:] = scheme.embed(pos, torch.float32)[0].to(rows.dtype)
    if first:  # rows before position 0 (OPT's padding offset) are never looked up for real tokens
        rows[:first] = 0
    return rows


for _family in POSITION_TABLES:
    for _scheme in ("nope", "sinusoidal"):
        mapping(_family, _scheme, "same architecture (baked position table)")(baked_table)


# ---------------------------------------------------------------------------------------------
# rotary sources: the same architecture with rope_parameters
# ---------------------------------------------------------------------------------------------
def rope_parameters(o: dict, head_dim: int, native_params: dict | None = None) -> tuple[dict, int, list[str]]:
    """retrofit's ``rope`` options -> (transformers ``rope_parameters``, ``max_position_embeddings``, notes)."""
    theta, fraction, native, factor = float(o["theta"]), float(o["fraction"]), int(o["native_length"]), float(o["factor"])
    params: dict[str, Any] = {"rope_theta": theta}
    if native_params is None or fraction != 1.0 or "partial_rotary_factor" in native_params:
        params["partial_rotary_factor"] = fraction  # always for GPT-NeoX (its default is 0.25)
    notes: list[str] = []
    scaling = o["scaling"]
    if scaling in ("none", "ntk"):
        rot = int(head_dim * fraction)
        if scaling == "ntk":  # static NTK-aware: the default rope with a larger base
            params["rope_theta"] = theta * factor ** (rot / (rot - 2))
            notes.append(f"static NTK-aware scaling written as default RoPE with rope_theta={params['rope_theta']:.6g}")
        return {"rope_type": "default", **params}, int(native * factor), notes
    params.update(rope_type=scaling, factor=factor)
    if scaling == "yarn":
        params.update(original_max_position_embeddings=native, beta_fast=float(o["beta_fast"]),
                      beta_slow=float(o["beta_slow"]))
        if o.get("attention_factor") is not None:
            params["attention_factor"] = float(o["attention_factor"])
    if scaling == "dynamic":
        notes.append(
            "dynamic NTK: transformers computes the grown base from a float32 tensor length, retrofit from a Python "
            "int (float64): the frequencies differ by ~1e-7 relative, which grows with the position (measured 8.9e-4 "
            "max logit difference at 8448 tokens on SmolLM2-135M)")
        notes.append(
            "dynamic NTK: a full forward of T tokens uses the frequencies for T (as retrofit does); transformers keeps "
            "the grown frequencies for later, shorter calls and bakes them into the KV cache, while retrofit "
            "re-rotates cached keys with the current length's frequencies, so cached generation past the native "
            "length differs slightly")
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


def _plain_config(model):
    """A copy of the model's config without the retrofit block, remote-code map or attention override."""
    d = model.config.to_dict()
    base = (d.get("retrofit") or {}).get("base_config") or {}
    d.update({k: v for k, v in base.items() if k not in ("model_type", "architectures")})  # the original length
    for key in ("retrofit", "auto_map", "_attn_implementation", "_attn_implementation_autoset", "transformers_version"):
        d.pop(key, None)
    return type(model.config).from_dict(d)


def _same_arch_rope(model, info, opts) -> Built:
    spec = model._retrofit_state.scheme().spec  # the adapter's spec of the unconverted model
    o = info["options"]
    nat = spec.native_rope or {}
    if float(o["fraction"]) != float(nat.get("fraction", 1.0)):
        raise RetrofitError(
            f"export: rotary fraction {o['fraction']} differs from the model's own ({nat.get('fraction')}); "
            f"{type(model).__name__} rotates a fixed part of each head: use retrofit.load")
    cfg = _plain_config(model)
    native_params = dict(model.config.rope_parameters or {})
    same = o["scaling"] == "none" and float(o["theta"]) == float(nat.get("theta"))
    if same:  # the scheme kept the model's own frequencies (native scaling included)
        rope, max_pos, notes = native_params, cfg.max_position_embeddings, ["RoPE unchanged: the original config"]
    else:
        rope, max_pos, notes = rope_parameters(o, spec.head_dim, native_params)
        if nat.get("rope_type", "default") != "default":
            notes.append(f"the model's native {nat['rope_type']!r} rope scaling is replaced, as in the patched model")
    cfg.rope_parameters = rope
    cfg.max_position_embeddings = max_pos
    if cfg.model_type == "gpt_neox":
        _keep_rotary_pct(cfg)
    dst = type(model)(cfg).to(dtype=model.dtype).eval()
    _check_rope_config(dst.config, rope)
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


for _family in ("llama", "gpt_neox"):
    mapping(_family, "rope", "same architecture (rope_parameters)")(_same_arch_rope)


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------
def _resolve_source(model_or_dir):
    """A converted model, a retrofit checkpoint folder, or a pipeline run folder holding ``final/``."""
    if isinstance(model_or_dir, nn.Module):
        return model_or_dir, None, None
    path = rf.model_dir(model_or_dir)
    if not (path / "config.json").exists():
        raise RetrofitError(f"{model_or_dir} is neither a retrofit checkpoint nor a run folder with final/ in it")
    from .io import load

    model = load(path)
    tokenizer = None
    if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer, path


def _info(model) -> dict:
    from .core import describe

    info = describe(model)
    if not info["converted"]:
        raise RetrofitError("export: the model is not converted (nothing retrofit-specific to export; "
                            "save it with save_pretrained)")
    state = model._retrofit_state
    if state.native_fade > 0 or state.offset:
        raise RetrofitError("export: reset fine-tune position controls first "
                            "(retrofit.set_position_controls(model, offset=0, native_fade=0))")
    return info


def _check_ids(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=g)


def max_logit_diff(a, b, ids: torch.Tensor) -> float:
    """Max abs difference of the two models' logits on ``ids`` (one full forward each, no cache)."""
    with torch.no_grad():
        la = a(input_ids=ids.to(a.device), use_cache=False).logits.float()
        lb = b(input_ids=ids.to(b.device), use_cache=False).logits.float()
    return float((la - lb.to(la.device)).abs().max())


def export(model_or_run_dir, path: str | os.PathLike, native: bool = True, *, tokenizer=None,
           max_length: int | None = None, check_length: int | None = None, approximate: bool = False,
           ppl_text: str = "stdlib", tolerance: float = TOLERANCE) -> ExportResult:
    """Write ``model_or_run_dir`` (a converted model, a retrofit checkpoint folder, or a run folder with
    ``final/``) to ``path``. ``native=True``: a native transformers architecture (see the module doc);
    ``native=False``: the retrofit format (``retrofit.save``; reload with ``retrofit.load``).

    ``max_length``: the longest sequence the native model should accept where its architecture has a
    limit (GPT-2 for NoPE: the size of the zero position table; default max(8192, 4 x native)).
    ``check_length``: tokens of the random-id equivalence check (default min(4 x native, native + 1024)).
    ``approximate=True``: also write the closest architecture where none is exact (gpt2 + alibi with
    scale_bias=False -> Falcon); an inexact export reports ``exact: False``, the reason, and, when a tokenizer
    is known, the perplexity of both models on ``ppl_text`` (a ``retrofit.data`` spec) at ``check_length``.
    An export that should be exact but differs by more than ``tolerance`` raises and writes nothing."""
    from .core import reach
    from .io import save

    model, tok, source = _resolve_source(model_or_run_dir)
    tokenizer = tokenizer if tokenizer is not None else tok
    info = _info(model)
    if not native:
        out = save(model, path, tokenizer=tokenizer)
        return ExportResult(out=str(out), native=False, mapping=None, target="retrofit", exact=True,
                            max_abs_logit_diff=0.0, check_length=None, notes=["load with retrofit.load(path)"])
    pair = (info["architecture"], info["scheme"])
    fn = MAPPINGS.get(pair)
    if fn is None:
        raise RetrofitError(
            f"no native architecture expresses {pair[0]} + {pair[1]}; supported: {'; '.join(supported_pairs())}. "
            "Export without --native (retrofit format) and load it with retrofit.load(path)"
        )
    native_len = int(info["native"]["length"])
    opts = {"max_length": _positive("max_length", max_length, max(8192, 4 * native_len)), "approximate": approximate,
            "reach": max_length or reach(model)}  # what an unbounded export advertises (ALiBi: no limit)
    check_len = _positive("check_length", check_length, min(4 * native_len, native_len + 1024))
    if fn is baked_table:  # the table is the length limit of the exported model
        check_len = min(check_len, opts["max_length"])
    was_training = model.training
    model.eval()
    try:
        built = fn(model, info, opts)
        check = {"length": check_len, "tolerance": tolerance, "ppl_text": ppl_text}
        return _write(model, built, tokenizer, path, pair, info, source, check)
    finally:
        model.train(was_training)


def _positive(name: str, value, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise OptionError(f"{name} must be an int >= 2; got {value!r}")
    return value


def _write(model, built: Built, tokenizer, path, pair, info, source, check: dict) -> ExportResult:
    from transformers import AutoModelForCausalLM

    from .atomic import write_dir
    from .io import tokenizer_reach

    check_len, tolerance = check["length"], check["tolerance"]
    result = ExportResult(native=True, mapping=f"{pair[0]}+{pair[1]}", target=type(built.model).__name__,
                          model_type=built.model.config.model_type, check_length=check_len,
                          dtype=str(model.dtype).replace("torch.", ""), source=str(source) if source else None)

    def write(tmp: Path):
        built.model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            tokenizer_reach(tmp / "tokenizer_config.json", built.model.config.max_position_embeddings)
        _check_config(tmp / "config.json")
        reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=model.dtype).eval()
        if getattr(built.model.config, "rope_parameters", None):
            _check_rope_config(reloaded.config, built.model.config.rope_parameters)
        diff = max_logit_diff(model, reloaded, _check_ids(model.get_input_embeddings().weight.shape[0], check_len))
        limit = built.exact_below
        fp32 = model.dtype == torch.float32
        exact = built.exact and (diff <= tolerance or not fp32)
        if built.exact and built.strict and (limit is None or check_len < limit) and diff > tolerance and fp32:
            raise RetrofitError(f"export: {result['target']} should equal the patched model but differs by {diff:.3g} "
                                f"(tolerance {tolerance:g}) at {check_len} tokens; nothing was written")
        notes = list(built.notes)
        if not fp32:
            notes.append(f"measured in {result['dtype']}: the {tolerance:g} tolerance applies to float32 only")
        if limit is not None and check_len >= limit:
            exact = False
            notes.append(f"checked at {check_len} tokens, past the exact range (< {limit})")
        result.update(exact=exact, exact_below=limit, max_abs_logit_diff=diff, notes=notes)
        if not exact:
            result.update(_ppl_difference(model, reloaded, tokenizer, check["ppl_text"], check_len))
        record = {**result, "retrofit": {k: info[k] for k in ("scheme", "options", "architecture", "native")},
                  "versions": library_versions()}
        (tmp / rf.EXPORT_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

    out = write_dir(path, write)
    result["out"] = str(out)
    log.info("exported %s to %s (%s, max |dlogit| %.3g)", result["mapping"], out, result["target"],
             result["max_abs_logit_diff"])
    return result


def _ppl_difference(patched, exported, tokenizer, spec: str, length: int, windows: int = 2) -> dict:
    """Perplexity of both models on up to ``windows`` windows of ``length`` tokens of real text."""
    if tokenizer is None:
        return {"ppl": None, "ppl_note": "no tokenizer: the perplexity difference was not measured"}
    from .data import load_documents, tokenize_documents

    tokens = [t for doc in tokenize_documents(tokenizer, load_documents(spec)) for t in doc]
    n = min(windows, len(tokens) // length)
    if n == 0:
        return {"ppl": None, "ppl_note": f"{spec!r} has fewer than {length} tokens: perplexity not measured"}
    ids = torch.tensor(tokens[: n * length]).view(n, length)
    a, b = _nll(patched, ids), _nll(exported, ids)
    return {"ppl": {"text": spec, "tokens": n * length, "length": length, "patched": math.exp(a),
                    "exported": math.exp(b), "relative_diff": math.exp(b - a) - 1}}


def _nll(model, ids: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood over the rows of ``ids`` (N, L)."""
    total = 0.0
    with torch.no_grad():
        for row in ids:
            logits = model(input_ids=row[None].to(model.device), use_cache=False).logits[0, :-1].float()
            total += float(nn.functional.cross_entropy(logits, row[1:].to(logits.device), reduction="sum"))
    return total / (ids.shape[0] * (ids.shape[1] - 1))


def _check_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    bad = [k for k in ("retrofit", "auto_map") if k in cfg]
    if bad or cfg.get("_attn_implementation") == "retrofit":
        raise RetrofitError(f"export: the written config still has {bad or '_attn_implementation=retrofit'}")
