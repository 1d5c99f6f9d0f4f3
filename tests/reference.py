"""A plain reference attention (full N x N scores, fp32) built from transformers' own oracles:
BLOOM's ``build_alibi_tensor`` for ALiBi, LLaMA's ``apply_rotary_pos_emb`` and rotary module for RoPE (GPT-J's for interleaved pairs),
T5's ``_relative_position_bucket`` for T5 buckets; Shaw and FIRE written from their papers.
Registered as the attention implementation ``"retrofit_reference"``; it reads the same per-layer
context as the real kernel, so a converted model can be run through it for comparison."""

from __future__ import annotations

import torch
from transformers import AttentionInterface, LlamaConfig
from transformers.masking_utils import AttentionMaskInterface
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rotary
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.t5.modeling_t5 import T5Attention

from retrofit.patch.conversion import retrofit_mask


def alibi_oracle_slopes(num_heads):
    alibi = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)  # (H, 1, 2) = slope_h * [0, 1]
    return alibi[:, 0, 1]


def rope_oracle_cos_sin(scheme, positions):
    o = scheme.options
    rot = scheme.rot_dim
    rope_type = {"none": "default", "ntk": "default"}.get(o.scaling, o.scaling)
    theta = o.theta * (o.factor ** (rot / (rot - 2)) if o.scaling == "ntk" else 1.0)
    params = {"rope_type": rope_type, "rope_theta": theta}
    if rope_type != "default":
        params["factor"] = o.factor
    if rope_type == "yarn":
        params.update(original_max_position_embeddings=o.native_length, beta_fast=o.beta_fast, beta_slow=o.beta_slow)
    max_pos = int(o.native_length * o.factor) if rope_type in ("linear", "yarn") else o.native_length
    cfg = LlamaConfig(
        hidden_size=rot * 4,
        num_attention_heads=4,
        head_dim=rot,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    rotary = LlamaRotaryEmbedding(cfg)
    native = scheme.spec.native_rope
    if o.scaling == "none" and native and o.theta == native["theta"] and o.fraction == native["fraction"]:
        rotary.inv_freq = native["inv_freq"].clone()
        rotary.attention_scaling = native["attention_scaling"]
    x = torch.zeros(1, dtype=torch.float32)
    return rotary(x, positions[None])  # (1, T, rot) each


def _rope(scheme, q, k, q_pos, k_pos):
    rot = scheme.rot_dim
    cos_k, sin_k = rope_oracle_cos_sin(scheme, k_pos)
    cos_q, sin_q = cos_k[:, -q.shape[-2] :], sin_k[:, -q.shape[-2] :]
    if scheme.interleaved:  # pairs (2i, 2i + 1): GPT-J's own rotation, on (B, T, H, D) with (sin, cos) (1, T, rot/2)
        half = rot // 2

        def turn(x, sin, cos):
            return gptj_rotary(x[..., :rot].transpose(1, 2), sin[..., :half], cos[..., :half]).transpose(1, 2)

        qr, kr = turn(q, sin_q, cos_q), turn(k, sin_k, cos_k)
        return torch.cat([qr, q[..., rot:]], -1), torch.cat([kr, k[..., rot:]], -1)
    qr, _ = apply_rotary_pos_emb(q[..., :rot], q[..., :rot], cos_q, sin_q)
    kr, _ = apply_rotary_pos_emb(k[..., :rot], k[..., :rot], cos_k, sin_k)
    return torch.cat([qr, q[..., rot:]], -1), torch.cat([kr, k[..., rot:]], -1)


def _table(s, layer):
    return s.table[layer if s.options.per_layer else 0]  # (H, entries)


def t5_reference(s, layer, i, j):
    """T5's own bucketing (unidirectional on a causal decoder, T5's encoder form on an encoder), then a plain
    table lookup."""
    b = T5Attention._relative_position_bucket(
        j - i,
        bidirectional=s.spec.bidirectional,
        num_buckets=s.options.num_buckets,
        max_distance=s.options.max_distance,
    )  # (Tq, Tk)
    return _table(s, layer)[:, b]


def shaw_reference(s, layer, i, j):
    """Shaw et al. (2018): a_ij = w[clip(j - i, -k, k)]; the table holds w[0], w[-1], ..., w[-k] (j <= i)."""
    k = s.options.max_distance
    rel = torch.clamp(j - i, -k, k)  # (Tq, Tk)
    return _table(s, layer)[:, (-rel).clamp(min=0)]


def fire_reference(s, layer, i, j):
    """Li et al. (2023), appendix code: f(log(|c (i - j)| + 1) / (log(|c max(i, L)| + 1) + eps)), L = |s L0|."""
    li = layer if s.options.per_layer else 0
    c = s.c[li]
    L = (
        (s.threshold_scale[li] * s.options.threshold).abs()
        if s.options.learned_threshold
        else torch.tensor(float(s.options.threshold))
    )
    rel = (i - j).clamp(min=0).float()  # future keys are masked
    normaliser = torch.log(torch.abs(c * torch.maximum(i.float(), L)) + 1) + 1e-6  # (Tq, 1)
    x = torch.log(torch.abs(c * rel) + 1) / normaliser  # (Tq, Tk)
    hidden = torch.relu(x[..., None] * s.w1[li] + s.b1[li])  # (Tq, Tk, W)
    return (hidden @ s.w2[li].T + s.b2[li]).permute(2, 0, 1)  # (H, Tq, Tk)


def _sinusoid(d, dim, base):
    """The papers' sinusoid of offsets d (...,): channel 2k = sin(d / base^(2k/dim)), 2k + 1 = cos(...)."""
    k = torch.arange(dim // 2, dtype=torch.float64)
    angle = d.double()[..., None] / base ** (2 * k / dim)  # (..., dim/2)
    return torch.stack([angle.sin(), angle.cos()], -1).flatten(-2).float()  # (..., dim)


def xl_reference(s, layer, q, k, i, j):
    """Dai et al. (2019), sec. 3.3: A_ij = (a) q_i.k_j + (b) q_i.W_R R_{i-j} + (c) u.k_j + (d) v.W_R R_{i-j}."""
    li = layer if s.options.per_layer else 0
    u, v, W = s.u[li].float(), s.v[li].float(), s.proj[li].float()  # (H, D), (H, D), (H * D, dim)
    H, D = u.shape
    d = (i - j) if s.spec.bidirectional else (i - j).clamp(min=0)  # a decoder's future keys are masked
    R = _sinusoid(d, s.options.dim, s.options.base)  # (Tq, Tk, dim)
    r = (R @ W.T).view(*R.shape[:2], H, D)  # (Tq, Tk, H, D)
    a = q @ k.transpose(-1, -2)
    b = torch.einsum("bhid,ijhd->bhij", q, r)
    c = u[None, :, None, :] @ k.transpose(-1, -2)  # (B, H, 1, Tk)
    d = torch.einsum("hd,ijhd->hij", v, r)[None]  # (1, H, Tq, Tk)
    return a + b + c + d


def nezha_reference(s, layer, q, k, i, j):
    """Wei et al. (2019): q_i.k_j + q_i.a_ij, a_ij the sinusoid of clip(j - i, -k, k) at the head dim."""
    a = _sinusoid(torch.clamp(j - i, -s.options.max_distance, s.options.max_distance), q.shape[-1], s.options.base)
    return q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a)


# scheme name -> scores(scheme, layer, q (B, H, Tq, D), k (B, H, Tk, D), i, j) -> (B, H, Tq, Tk), before scaling
REFERENCE_SCORES = {"xl": xl_reference, "nezha": nezha_reference}

# scheme name -> bias(scheme, layer, i (Tq,1), j (1,Tk)) -> (H, Tq, Tk); extended by later schemes.
# Absolute ("sinusoidal") and "nope" schemes have no bias: their reference is plain causal attention.
REFERENCE_BIAS = {
    # BLOOM's slopes times -|i - j|: symmetric on an encoder's keys after the query, as jina-bert
    "alibi": lambda s, layer, i, j: alibi_oracle_slopes(s.spec.num_heads)[:, None, None] * -(j - i).abs().float(),
    "t5": t5_reference,
    "shaw": shaw_reference,
    "fire": fire_reference,
}


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    ctx = module._retrofit_layer
    scheme = ctx.state.scheme()
    kind = scheme.kind if ctx.positions else "none"  # a layer the original ran without positions
    B, H, Tq, D = query.shape
    Tk = key.shape[-2]
    query, key = query.float(), key.float()
    if scheme.common.qk_norm and ctx.positions:  # Zhang & Sennrich's RMSNorm per head: x / sqrt(mean(x^2) + eps) * g
        query = (
            query / torch.sqrt(query.pow(2).mean(-1, keepdim=True) + 1e-6) * scheme.q_gain[ctx.layer][:, None].float()
        )
        key = key / torch.sqrt(key.pow(2).mean(-1, keepdim=True) + 1e-6) * scheme.k_gain[ctx.layer][:, None].float()
    key = key.repeat_interleave(H // key.shape[1], 1)
    value = value.repeat_interleave(H // value.shape[1], 1).float()
    i = torch.arange(Tk - Tq, Tk)[:, None]
    j = torch.arange(Tk)[None, :]
    if kind == "rotary":
        query, key = _rope(scheme, query, key, i[:, 0], j[0])
    scaling = scaling if scaling is not None else D**-0.5  # some transformers releases pass None for GPT-2
    content = query @ key.transpose(-1, -2) * scaling  # (B, H, Tq, Tk)
    positional = torch.zeros(())
    if kind == "relative":
        positional = REFERENCE_SCORES[scheme.name](scheme, ctx.layer, query, key, i, j) * scaling - content
    if kind == "bias":
        positional = REFERENCE_BIAS[scheme.name](scheme, ctx.layer, i, j) * (
            scaling if scheme.bias_scaled_with_scores else 1
        )
    beta, length = scheme.common.temperature, scheme.common.temperature_length
    if beta and ctx.positions:  # every logit of query i times 1 + beta * ln(max(1, (i + 1) / length))
        tau = (1 + beta * torch.log(torch.clamp((i + 1).double() / length, min=1.0))).float()
        content, positional = content * tau, positional * tau
    softcap = kwargs.get("softcap")  # gemma2 (its eager code): the content logits capped, then the rest added
    if softcap is not None:
        content = torch.tanh(content / softcap) * softcap
    scores = content + positional
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    before = (j <= i) if causal else torch.ones_like(j <= i)  # an encoder sees the keys after the query too
    if ctx.window:  # W keys up to the query; |i - j| < W both ways on an encoder
        before = before & (((i - j) if causal else (i - j).abs()) < ctx.window)
    allowed = before
    if attention_mask is not None:
        allowed = (allowed & attention_mask[:, None, None, :].bool()) | (i == j)
    scores = scores.masked_fill(~allowed, float("-inf"))
    sinks = kwargs.get("s_aux", getattr(module, "sinks", None))  # gpt_oss (its eager code): one more logit, dropped
    if sinks is not None:
        sink = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        out = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1] @ value
    else:
        out = torch.softmax(scores, -1) @ value
    return out.to(module_dtype(module)).transpose(1, 2).contiguous(), None


def module_dtype(module):
    return next(module.parameters()).dtype


AttentionInterface.register("retrofit_reference", reference_attention)
AttentionMaskInterface.register("retrofit_reference", retrofit_mask)
