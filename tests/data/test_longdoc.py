"""The offline long-document tasks (``retrofit.data.longdoc``): each document has exactly its drawn length, its
evidence sits where the example says, and the label follows from the evidence alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from retrofit.data import longdoc
from retrofit.foundation.errors import DataError

STANDIN = next((Path(__file__).resolve().parents[2] / "standins").glob("small-bert-*"))


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(STANDIN)


def words(tok, ids: list[int]) -> int:
    """How many times the document says "The secret word is <w>." for any of the words."""
    text = tok.decode(ids)
    return sum(text.count(f"The secret word is {w}.") for w in longdoc.WORDS)


def test_a_mention_document_says_its_label_once_at_its_depth(tok):
    b = longdoc.Builder("longdoc:mention", tok, "heldout")
    for i in range(20):
        ex = b.example(3, i, 300, depth=i / 19)
        assert len(ex.ids) == 300 and ex.ids[:1] == b.first
        piece = b.words[ex.label]
        assert ex.ids[ex.evidence[0] : ex.evidence[0] + len(piece)] == piece
        assert words(tok, ex.ids) == 1
        body = 300 - len(b.first) - len(piece)
        assert ex.evidence[0] - len(b.first) == round(i / 19 * body)  # the depth asked for


def test_both_needs_the_two_ends(tok):
    """Label 1: the sentence in the first and the last tenth; label 0: once, in one of them; both labels and both
    single places are drawn."""
    b = longdoc.Builder("longdoc:both", tok, "heldout")
    seen = set()
    for i in range(40):
        ex = b.example(5, i, 1000)
        n = words(tok, ex.ids)
        assert n == (2 if ex.label else 1) == len(ex.evidence)
        where = tuple("start" if at < 120 else "end" if at > 880 else "middle" for at in ex.evidence)
        assert "middle" not in where
        seen.add((ex.label, where))
    assert seen == {(1, ("start", "end")), (0, ("start",)), (0, ("end",))}


def test_a_needle_query_is_the_passage_in_its_document(tok):
    b = longdoc.Builder("longdoc:needle", tok, "heldout")
    ex = b.example(1, 0, 500, depth=0.75)
    passage = ex.query[len(b.first) :]
    assert len(passage) == longdoc.PASSAGE and ex.query[:1] == b.first
    assert ex.ids[ex.evidence[0] : ex.evidence[0] + len(passage)] == passage


def test_examples_are_seeded_and_the_splits_differ(tok):
    a = longdoc.Builder("longdoc:mention", tok, "train")
    h = longdoc.Builder("longdoc:mention", tok, "heldout")
    assert a.example(0, 4, 200).ids == a.example(0, 4, 200).ids
    assert a.example(0, 4, 200).ids != a.example(0, 5, 200).ids
    assert not set(map(tuple, _windows(a.filler[:20_000]))) & set(map(tuple, _windows(h.filler[:20_000])))


def _windows(ids: list[int], n: int = 24) -> list[list[int]]:
    return [ids[i : i + n] for i in range(0, len(ids) - n, n)]


def test_bad_specs_and_short_documents_are_clear_errors(tok):
    with pytest.raises(DataError, match="longdoc:mention, longdoc:both, longdoc:needle, longdoc:passkey"):
        longdoc.task_of("longdoc:summary")
    with pytest.raises(DataError, match="too short"):
        longdoc.Builder("longdoc:mention", tok, "heldout").example(0, 0, 4)


def test_a_passkey_document_holds_the_key_its_query_asks_for(tok):
    b = longdoc.Builder("longdoc:passkey", tok, "heldout")
    keys = set()
    for i in range(10):
        ex = b.example(2, i, 400, depth=i / 9)
        key = tok.decode(ex.query).split("The pass key is ")[1].rstrip(".")
        assert len(ex.ids) == 400 and tok.decode(ex.ids).count(f"The pass key is {key}.") == 1
        assert tok.decode(ex.ids[ex.evidence[0] :]).startswith(f" The pass key is {key}.")
        keys.add(key)
    assert len(keys) == 10  # every document its own key
