"""Schemes against oracles that ship in transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply_rotary
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from retrofit.scheme import SCHEMES, ModelSpec
from retrofit.scheme.alibi import alibi_slopes


def spec(heads=8, head_dim=16, native=64, rope=None):
    return ModelSpec(
        num_layers=2,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        hidden_size=heads * head_dim,
        native_length=native,
        native_kind="rope" if rope else "learned_absolute",
        native_rope=rope,
    )


def make(name, s=None, **options):
    cls = SCHEMES.get(name)
    s = s or spec()
    return cls(s, cls.parse_options(s, options))


@pytest.mark.parametrize("heads", [1, 2, 4, 6, 8, 12, 16, 20, 25, 32, 40])
def test_alibi_slopes_match_bloom(heads):
    bloom = build_alibi_tensor(torch.ones(1, 3), heads, torch.float32)[:, 0, 1]  # slope_h * 1
    torch.testing.assert_close(torch.tensor(alibi_slopes(heads)), bloom, rtol=1e-6, atol=0)


@pytest.mark.parametrize("heads", [4, 8, 16, 32])
def test_alibi_bias_matches_mpt(heads):
    """MPT's bias is slope * (j - (T-1)) per key; softmax is shift-invariant, so the row bias matches ours up to a
    per-row constant (exactly the same for the last query)."""
    T = 12
    mpt = build_mpt_alibi_tensor(heads, T)[:, 0, :]  # (H, T) = slope_h * (j - (T - 1))
    s = make("alibi", spec(heads=heads))
    h = torch.arange(heads)[:, None, None]
    ours = s.bias(0, h, torch.full((1, 1, 1), T - 1), torch.arange(T)[None, None, :])[:, 0, :]
    torch.testing.assert_close(ours, mpt, rtol=1e-6, atol=1e-6)


def test_alibi_bias_full_matrix_matches_bloom_softmax():
    heads, T = 6, 10
    s = make("alibi", spec(heads=heads))
    h = torch.arange(heads)[:, None, None]
    i, j = torch.arange(T)[None, :, None], torch.arange(T)[None, None, :]
    causal = j <= i
    ours = s.bias(0, h, i, j).masked_fill(~causal, float("-inf")).softmax(-1)
    bloom = build_alibi_tensor(torch.ones(1, T), heads, torch.float32)  # (H, 1, T): slope_h * j
    theirs = bloom.expand(heads, T, T).masked_fill(~causal[0], float("-inf")).softmax(-1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def llama_cos_sin(rope_parameters, head_dim, max_pos, positions):
    cfg = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=rope_parameters,
    )
    return LlamaRotaryEmbedding(cfg)(torch.zeros(1), positions[None])


ROPE_CASES = [
    ({}, {"rope_type": "default", "rope_theta": 10000.0}, 64),
    ({"theta": 500000.0}, {"rope_type": "default", "rope_theta": 500000.0}, 64),
    ({"scaling": "linear", "factor": 4.0}, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 256),
    (
        {"scaling": "yarn", "factor": 4.0},
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
        256,
    ),
    ({"scaling": "dynamic", "factor": 2.0}, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 64),
]


@pytest.mark.parametrize("options,params,max_pos", ROPE_CASES)
@pytest.mark.parametrize("length", [40, 300])
def test_rope_matches_llama_rotary(options, params, max_pos, length):
    head_dim = 16
    s = make("rope", spec(head_dim=head_dim, native=64), **options)
    pos = torch.arange(length)
    cos, sin = llama_cos_sin(params, head_dim, max_pos, pos)
    q, k = torch.randn(1, 2, length, head_dim), torch.randn(1, 2, length, head_dim)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(s.rotate(0, q, pos, length), q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s.rotate(0, k, pos, length), k_ref, rtol=1e-5, atol=1e-5)


def test_rope_ntk_is_the_ntk_aware_base():
    head_dim, factor = 16, 4.0
    s = make("rope", spec(head_dim=head_dim), scaling="ntk", factor=factor)
    base = 10000.0 * factor ** (head_dim / (head_dim - 2))
    cos, sin = llama_cos_sin({"rope_type": "default", "rope_theta": base}, head_dim, 64, torch.arange(50))
    q = torch.randn(1, 1, 50, head_dim)
    torch.testing.assert_close(
        s.rotate(0, q, torch.arange(50), 50), apply_rotary_pos_emb(q, q, cos, sin)[0], rtol=1e-5, atol=1e-5
    )


def test_partial_rope_matches_gpt_neox_rotary():
    """GPT-NeoX rotates only the first rotary_ndims dims (rotate-half convention)."""
    head_dim, fraction, T = 32, 0.25, 20
    s = make("rope", spec(head_dim=head_dim), fraction=fraction)
    rot = int(head_dim * fraction)
    cos, sin = llama_cos_sin({"rope_type": "default", "rope_theta": 10000.0}, rot, 64, torch.arange(T))
    q = torch.randn(1, 2, T, head_dim)
    ref, _ = neox_apply_rotary(q, q, cos, sin)  # applies to q[..., :rot] and passes the rest through
    torch.testing.assert_close(s.rotate(0, q, torch.arange(T), T), ref, rtol=1e-5, atol=1e-5)


def test_rope_on_a_rope_model_defaults_to_its_own_frequencies():
    native = {
        "theta": 50000.0,
        "fraction": 1.0,
        "rope_type": "llama3",
        "inv_freq": torch.rand(8),
        "attention_scaling": 1.0,
    }
    s = make("rope", spec(head_dim=16, rope=native))
    assert s.options.theta == 50000.0
    torch.testing.assert_close(s.inv_freq, native["inv_freq"])


def test_rope_rotation_is_transformers_arithmetic_bit_for_bit():
    """Given transformers' own cos and sin, the rotation (its second product and sum in place) equals LLaMA's
    ``apply_rotary_pos_emb`` exactly, and so does q's gradient through it."""
    head_dim, length = 16, 40
    s = make("rope", spec(head_dim=head_dim, native=64))
    pos = torch.arange(length)
    cos, sin = llama_cos_sin({"rope_type": "default", "rope_theta": 10000.0}, head_dim, 64, pos)
    s.cos_sin = lambda p, n: (cos[0], sin[0])  # (T, D), as the scheme's own
    q = torch.randn(1, 2, length, head_dim, requires_grad=True)
    weight = torch.randn(1, 2, length, head_dim)
    ours = s.rotate(0, q, pos, length)
    (grad,) = torch.autograd.grad((ours * weight).sum(), q)
    ref = apply_rotary_pos_emb(q, q, cos, sin)[0]
    (ref_grad,) = torch.autograd.grad((ref * weight).sum(), q)
    assert torch.equal(ours, ref) and torch.equal(grad, ref_grad)
