"""What a fine-tune writes beside its weights: an embedding model's sentence-transformers modules follow the model
it started from (its Normalize kept: unit vectors), so ``SentenceTransformer(final)`` serves like the original."""

from __future__ import annotations

import json
import logging

import pytest

from retrofit.training.outputs import after_pooling

ST = "sentence_transformers.models."


def modules(tmp_path, *types: str):
    entries = [{"idx": i, "name": str(i), "path": "", "type": ST + t} for i, t in enumerate(types)]
    (tmp_path / "modules.json").write_text(json.dumps(entries))
    return tmp_path


def test_a_normalize_after_pooling_is_kept(tmp_path):
    pytest.importorskip("sentence_transformers")
    kept = after_pooling(modules(tmp_path, "Transformer", "Pooling", "Normalize"))
    assert [type(m).__name__ for m in kept] == ["Normalize"]


def test_no_source_or_no_normalize_keeps_nothing(tmp_path):
    assert after_pooling(None) == []
    assert after_pooling(tmp_path) == []  # a folder without modules.json: a plain transformers model
    assert after_pooling(modules(tmp_path, "Transformer", "Pooling")) == []


def test_a_dense_after_pooling_is_dropped_and_said(tmp_path, caplog):
    pytest.importorskip("sentence_transformers")
    with caplog.at_level(logging.WARNING):
        kept = after_pooling(modules(tmp_path, "Transformer", "Pooling", "Dense", "Normalize"))
    assert [type(m).__name__ for m in kept] == ["Normalize"]
    assert "Dense" in caplog.text and "not kept" in caplog.text


@pytest.mark.parametrize(("scheme", "options", "want"), [("extend", {"length": 256}, 256), ("t5", {}, 96)])
def test_sentence_transformers_reads_to_the_trained_models_reach_else_its_block(scheme, options, want):
    """A fine-tuned embedding model's text limit: extend's table (as convert and the native export write it), an
    unbounded scheme's the block it trained at."""
    import transformers as tf

    import retrofit
    from retrofit.training.outputs import reads_to

    cfg = tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    model = retrofit.convert(tf.BertModel(cfg), scheme, **options)
    assert reads_to(model, block_length=96) == want
