"""``foundation.task``: the words the errors use for a model's task."""

from __future__ import annotations

from retrofit.foundation.task import with_article


def test_a_task_is_said_with_its_article_and_embeddings_as_an_embedding_model():
    assert f"{with_article('embeddings')} model" == "an embedding model"
    assert with_article("sequence-classification") == "a sequence-classification"
    assert with_article("causal-lm") == "a causal-lm"
