"""Falcon (issue 42): rotary or ALiBi, multi-query or grouped (the new decoder architecture), through a stand-in
attention. Its own mechanism reproduces its logits exactly; the ALiBi variant's bias is added before the score
scaling (``scale_bias``), so ALiBi without it is a different model; rescaled RoPE exports to Falcon itself."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import retrofit

from ..tiny import NATIVE, falcon, ids

VARIANTS = {
    "rotary, multi-query": {},
    "rotary, new decoder architecture": dict(new_decoder_architecture=True, num_kv_heads=2),
    "rotary, one key per head, sequential": dict(multi_query=False, parallel_attn=False, bias=True),
    "alibi": dict(alibi=True),
    "alibi, new decoder architecture": dict(alibi=True, new_decoder_architecture=True, num_kv_heads=2),
}


def own(extra):
    return ("alibi", {"scale_bias": True}) if extra.get("alibi") else ("rope", {})


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_its_own_mechanism_gives_back_its_logits_past_native_with_left_padding(variant):
    extra = VARIANTS[variant]
    model = falcon(**extra)
    x, mask = ids(2, NATIVE + 12), torch.ones(2, NATIVE + 12, dtype=torch.long)
    x[1, :5], mask[1, :5] = 0, 0
    with torch.no_grad():
        before = model(x, attention_mask=mask).logits
        scheme, options = own(extra)
        retrofit.convert(model, scheme, **options)
        assert retrofit.describe(model)["native"]["kind"] == scheme
        after, solo = model(x, attention_mask=mask).logits, model(x[1:, 5:]).logits
    torch.testing.assert_close(after[0], before[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(after[1, 5:], before[1, 5:], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(solo[0], after[1, 5:], atol=2e-5, rtol=1e-4)
    assert all(type(b.self_attention).__name__ == "RetrofitFalconAttention" for b in model.transformer.h)
    retrofit.revert(model)
    with torch.no_grad():
        assert torch.equal(model(x, attention_mask=mask).logits, before), "revert is not exact"


@pytest.mark.parametrize("variant", ["alibi", "alibi, new decoder architecture"])
def test_the_alibi_variant_converts_live_and_generates_with_its_cache_as_without(variant, tmp_path):
    model = falcon(**VARIANTS[variant])
    x = ids(1, NATIVE + 8)
    with torch.no_grad():
        before = model(x).logits
    retrofit.convert(model, "rope")  # ALiBi -> RoPE: a different mechanism
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        assert not torch.allclose(model(x).logits, before, atol=1e-3), "patch is not live"
        a, b = model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=2e-5, rtol=1e-4)
    retrofit.save(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(retrofit.load(tmp_path / "m")(x).logits, model(x).logits)


@pytest.mark.parametrize("variant,scaling", [("rotary, multi-query", "yarn"), ("alibi", "yarn"), ("alibi", "none")])
def test_rescaled_rope_exports_to_falcon_itself_exactly(variant, scaling, tmp_path):
    """A rotary Falcon rescaled, or an ALiBi Falcon given RoPE: Falcon's own config holds either, exact."""
    model = falcon(**VARIANTS[variant])
    retrofit.convert(model, "rope", **({"scaling": "yarn", "factor": 4.0} if scaling == "yarn" else {}))
    result = retrofit.export(model, tmp_path / "x", native=True)
    assert result.exact
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x")
    assert type(back) is tf.FalconForCausalLM
    assert back.config.rope_parameters["rope_type"] == ("yarn" if scaling == "yarn" else "default")
    assert not back.config.alibi
    x = ids(1, 3 * NATIVE)
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["rotary, multi-query", "rotary, new decoder architecture"])
def test_a_rotary_falcon_given_alibi_exports_to_falcon_with_alibi_exactly(variant, tmp_path):
    model = falcon(**VARIANTS[variant])
    retrofit.convert(model, "alibi", scale_bias=True)
    assert retrofit.export(model, tmp_path / "x", native=True).exact
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x")
    assert back.config.alibi
    x = ids(1, 3 * NATIVE)
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, atol=2e-5, rtol=1e-4)


def test_alibi_after_the_scaling_is_not_falcon_and_the_export_says_so(tmp_path):
    model = falcon()
    retrofit.convert(model, "alibi")
    with pytest.raises(retrofit.foundation.errors.RetrofitError, match="scale_bias=true"):
        retrofit.export(model, tmp_path / "x", native=True)
    assert not (tmp_path / "x").exists()


def test_the_attention_reads_the_padding_back_from_each_form_of_the_mask():
    """What Falcon's model makes of retrofit's (B, 1, 1, kv) mask: passed through (bool), or a float with ALiBi
    added and the padded keys at the dtype's minimum (transformers 5.25): the (B, kv) padding either way, None when
    every key is real."""
    from retrofit.adapters.neutral import padding

    pad = torch.tensor([[False, True, True], [True, True, True]])
    alibi = torch.arange(3.0).expand(2, 4, 1, 3)  # (B, H, 1, kv)
    as_float = alibi.masked_fill(~pad[:, None, None, :], torch.finfo(torch.float32).min)
    for mask in (pad, pad[:, None, None, :], as_float):
        assert torch.equal(padding(mask), pad)
    assert padding(torch.ones(2, 1, 1, 3, dtype=torch.bool)) is None and padding(None) is None
    assert padding(torch.zeros(2, 4, 1, 3)) is None  # ALiBi's 0s: no key padded
