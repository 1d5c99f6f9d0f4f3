"""MPT (issue 42): a native-ALiBi source through a stand-in attention. Its own mechanism reproduces its logits
with left padding, any head count (MPT's slope rule is the paper's); it runs past max_seq_len once converted."""

from __future__ import annotations

import pytest
import torch

import retrofit

from ..tiny import NATIVE, ids, mpt


@pytest.mark.parametrize("heads,width", [(4, 64), (6, 48)])
def test_its_own_alibi_gives_back_its_logits_with_left_padding(heads, width):
    model = mpt(n_heads=heads, d_model=width)
    x, mask = ids(2, NATIVE - 2), torch.ones(2, NATIVE - 2, dtype=torch.long)
    x[1, :5], mask[1, :5] = 0, 0
    with torch.no_grad():
        before = model(x, attention_mask=mask).logits
        retrofit.convert(model, "alibi")
        after, solo = model(x, attention_mask=mask).logits, model(x[1:, 5:]).logits
        assert model(ids(1, 3 * NATIVE)).logits.shape[1] == 3 * NATIVE  # past the original's alibi tensor
    torch.testing.assert_close(after[0], before[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(after[1, 5:], before[1, 5:], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(solo[0], after[1, 5:], atol=2e-5, rtol=1e-4)
    retrofit.revert(model)
    with torch.no_grad():
        assert torch.equal(model(x, attention_mask=mask).logits, before)


def test_clipped_qkv_is_kept():
    model = mpt(attn_config={"clip_qkv": 0.05})
    x = ids(1, NATIVE)
    with torch.no_grad():
        before = model(x).logits
        retrofit.convert(model, "alibi")
        torch.testing.assert_close(model(x).logits, before, atol=2e-5, rtol=1e-4)


def test_the_slope_fields_transformers_does_not_read_do_not_change_the_conversion():
    """transformers' MptModel builds ALiBi with alibi_bias_max 8 whatever attn_config says: so does the stand-in."""
    model = mpt(attn_config={"alibi_bias_max": 16})
    x = ids(1, NATIVE)
    with torch.no_grad():
        before = model(x).logits
        retrofit.convert(model, "alibi")
        torch.testing.assert_close(model(x).logits, before, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["mpt", "bloom"])
def test_a_native_alibi_source_kept_on_alibi_exports_to_itself_past_native(family, tmp_path):
    """After a fine-tune that kept ALiBi (the scheme's parameters trained or not), the same architecture holds it:
    MPT with max_seq_len raised to the export's length, BLOOM as it is; exact past native."""
    import transformers as tf

    from ..tiny import TINY

    model = TINY[family]()
    retrofit.convert(model, "alibi")
    assert retrofit.export(model, tmp_path / "x", native=True, max_length=8 * NATIVE).exact
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x")
    assert type(back) is type(model)
    x = ids(1, 4 * NATIVE)
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, atol=2e-5, rtol=1e-4)
