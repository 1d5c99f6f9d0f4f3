"""GPT-2 sources into other native architectures: ALiBi -> Falcon, RoPE -> GPT-NeoX."""

from __future__ import annotations

import math

from ..foundation.errors import RetrofitError
from .base import Built, Surgery, per_head_qkv
from .rope import _check_rope_config, _keep_rotary_pct, rope_parameters

FALCON_BF16_EXACT = 258  # Falcon builds slope * position in bfloat16: positions 0..256 are exact, 257 is not


def _gpt2_checks(model) -> None:
    c = model.config
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx:
        raise RetrofitError(
            "export: this GPT-2 scales attention scores differently (scale_attn_weights=False or "
            "scale_attn_by_inverse_layer_idx=True); no native architecture matches: use retrofit.load"
        )


def _gpt2_common(c) -> dict:
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.n_embd,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": getattr(c, "pad_token_id", None),
        "initializer_range": c.initializer_range,
        "tie_word_embeddings": _tied(c),
    }


def _tied(config) -> bool:
    return bool(getattr(config, "tie_word_embeddings", True))


def gpt2_alibi_to_falcon(model, info, opts) -> Built:
    """Falcon with ``alibi=True`` adds the bias before the 1/sqrt(d) scaling: exact for ``scale_bias=True``."""
    from transformers import FalconConfig, FalconForCausalLM

    _gpt2_checks(model)
    scaled = bool(info["options"].get("scale_bias"))
    learned = bool(info["options"].get("learn_slopes"))
    if learned and not opts["approximate"]:
        raise RetrofitError(
            "export: this model's ALiBi slopes are learned (learn_slopes=true); Falcon always uses the standard "
            "slopes of its head count, so no native architecture carries them. Pass approximate=True "
            "(--approximate) for an inexact Falcon export with the standard slopes, or load this model with "
            "retrofit.load(path)"
        )
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
        **_gpt2_common(c),
        num_kv_heads=c.n_head,
        alibi=True,
        parallel_attn=False,
        bias=True,
        multi_query=False,
        new_decoder_architecture=False,
        activation=c.activation_function,
        ffn_hidden_size=c.n_inner or 4 * c.n_embd,
        layer_norm_epsilon=c.layer_norm_epsilon,
        max_position_embeddings=opts["reach"],
        hidden_dropout=c.resid_pdrop,
        attention_dropout=c.attn_pdrop,
    )
    dst = FalconForCausalLM(cfg).to(dtype=model.dtype).eval()
    out = dst.transformer
    done = _gpt2_body(model, dst, out.word_embeddings, out.h, lambda d: d.self_attention, out.ln_f)
    exact = scaled and not learned
    built = Built(done, exact=exact, exact_below=FALCON_BF16_EXACT if exact else None)
    if learned:
        built.notes.append("approximate: the model's learned ALiBi slopes are replaced by Falcon's standard ones")
    if not scaled:
        built.notes.append(
            f"approximate: the model adds the ALiBi bias after the 1/sqrt(d) scaling, Falcon before it, so the "
            f"exported slopes are effectively divided by sqrt({c.n_embd // c.n_head})"
        )
    built.notes.append(
        f"Falcon builds the ALiBi bias slope*position in bfloat16 (transformers' build_alibi_tensor): in fp32 the "
        f"export is exact for sequences of up to {FALCON_BF16_EXACT - 1} tokens; beyond, key biases are rounded "
        "to 8 significant bits"
    )
    if not math.log2(c.n_head).is_integer():
        built.exact = False
        built.notes.append(f"{c.n_head} heads (not a power of two): some slopes are not exact in bfloat16")
    built.notes.append(
        "Falcon's eager attention (attn_implementation='eager', output_attentions=True) adds the bias "
        "twice in transformers 5.x; use the default sdpa"
    )
    return built


def _gpt2_body(model, dst, embed, layers, attention_of, final_ln):
    """GPT-2's embedding, blocks and final LayerNorm into a sequential-residual target (Falcon, GPT-NeoX)."""
    cut, src, n_head = Surgery(dst), model.transformer, model.config.n_head
    cut(embed.weight, src.wte.weight, "wte")
    for i, (s, d) in enumerate(zip(src.h, layers, strict=True)):
        _gpt2_block(cut, s, d, attention_of(d), n_head, f"h.{i}")
    cut(final_ln.weight, src.ln_f.weight, "ln_f.weight")
    cut(final_ln.bias, src.ln_f.bias, "ln_f.bias")
    return cut.finish(model)


def _gpt2_block(cut, s, d, attn, n_head: int, name: str) -> None:
    """One GPT-2 block ``s`` into a sequential-residual block ``d`` (its attention ``attn``) with per-head fused QKV
    (Falcon, GPT-NeoX)."""
    ln1, ln2 = d.input_layernorm, d.post_attention_layernorm
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


def gpt2_rope_to_neox(model, info, opts) -> Built:
    """GPT-NeoX with a sequential residual is GPT-2 with rotate-half RoPE on the first rotary_pct of each head."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    _gpt2_checks(model)
    c = model.config
    rope, max_pos, notes = rope_parameters(info["options"], head_dim=c.n_embd // c.n_head)
    cfg = GPTNeoXConfig(
        **_gpt2_common(c),
        intermediate_size=c.n_inner or 4 * c.n_embd,
        hidden_act=c.activation_function,
        rope_parameters=rope,
        rotary_pct=rope["partial_rotary_factor"],
        max_position_embeddings=max_pos,
        layer_norm_eps=c.layer_norm_epsilon,
        use_parallel_residual=False,
        attention_bias=True,
        hidden_dropout=c.resid_pdrop,
        attention_dropout=c.attn_pdrop,
    )
    _keep_rotary_pct(cfg)
    dst = GPTNeoXForCausalLM(cfg).to(dtype=model.dtype).eval()
    _check_rope_config(dst.config, rope)
    out = dst.gpt_neox
    done = _gpt2_body(model, dst, out.embed_in, out.layers, lambda d: d.attention, out.final_layer_norm)
    return Built(done, exact=True, notes=notes, strict=rope.get("rope_type") != "dynamic")
