"""Native export of a converted encoder: the schemes a learned table can hold (``extend``, ``nope``,
``sinusoidal``) keep the encoder's own architecture, RoBERTa's padding offset included, and load with plain
transformers for their task with the very logits past the native length; one no architecture holds is refused."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.foundation.errors import RetrofitError
from retrofit.native_export import export


def _encoder(kind: str):
    common = dict(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    torch.manual_seed(0)
    if kind == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(max_position_embeddings=32, **common)).eval()
    return tf.RobertaForMaskedLM(tf.RobertaConfig(max_position_embeddings=35, pad_token_id=1, **common)).eval()


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("scheme, options", [("extend", {"length": "4x"}), ("nope", {}), ("sinusoidal", {})])
def test_a_converted_encoder_exports_as_its_own_architecture_exactly(tmp_path, kind, scheme, options):
    model = retrofit.convert(_encoder(kind), scheme, **options)
    result = export(model, tmp_path / "out", native=True)
    back = tf.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(model) and result.exact and result.max_abs_logit_diff == 0.0
    ids = torch.randint(5, 200, (2, 100), generator=torch.Generator().manual_seed(1))  # ~3x the native length
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=1e-5, rtol=0)


def test_alibi_on_an_encoder_has_no_native_architecture_and_says_what_does(tmp_path):
    with pytest.raises(RetrofitError, match=r"no native architecture expresses bert \+ alibi.*bert\|.*extend"):
        export(retrofit.convert(_encoder("bert"), "alibi"), tmp_path / "out", native=True)
