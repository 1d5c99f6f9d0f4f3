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
    with pytest.raises(
        DataError, match="longdoc:mention, longdoc:both, longdoc:needle, longdoc:passkey, longdoc:context"
    ):
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


def test_a_context_query_is_cut_out_of_its_document(tok):
    """The query is a passage of the play; its document is the text around it, the passage removed, so the two
    share no cut text and the document keeps its length."""
    b = longdoc.Builder("longdoc:context", tok, "heldout")
    for i in range(6):
        ex = b.example(4, i, 200, depth=i / 5)
        cut = ex.query[len(b.first) :]
        assert len(ex.ids) == 200 and len(cut) == longdoc.CUT and ex.query[:1] == b.first
        at = ex.evidence[0]
        joined = ex.ids[len(b.first) : at] + cut + ex.ids[at:]  # put back, it is one stretch of a play
        assert any(b.filler[j : j + len(joined)] == joined for j in _starts(b.filler, joined[:8]))
        assert at - len(b.first) == round(i / 5 * (200 - len(b.first)))


def _starts(ids: list[int], head: list[int]) -> list[int]:
    return [j for j in range(len(ids) - len(head)) if ids[j : j + len(head)] == head]


def test_shared_filler_documents_differ_only_in_their_evidence(tok):
    """LongEmbed's setting: with ``shared`` every document of a length has the same filler, so a reading that never
    sees the evidence (truncated before it) cannot tell them apart."""
    b = longdoc.Builder("longdoc:passkey", tok, "heldout")
    a, c = b.example(9, 0, 600, 0.9, shared=True), b.example(9, 1, 600, 0.9, shared=True)
    assert a.ids[:500] == c.ids[:500] and a.ids != c.ids and a.query != c.query
    assert b.example(9, 0, 600, 0.9).query == a.query  # the key is the example's own either way
    own = b.example(9, 1, 600, 0.9)
    assert own.ids[:500] != c.ids[:500]


def test_every_help_that_lists_the_tasks_names_each_of_them():
    """``finetune --help``'s task key and data.dataset, ``eval --help`` and its --data: one list (``listed``)."""
    import argparse

    from retrofit.cli import eval as eval_cli
    from retrofit.evaluation.options import EvalOptions
    from retrofit.foundation.schema import help_of
    from retrofit.training.recipe import DataConfig, Recipe

    sub = argparse.ArgumentParser().add_subparsers()
    eval_cli.add_parser(sub)
    texts = [help_of(DataConfig)["dataset"], help_of(Recipe)["task"], help_of(EvalOptions)["data"]]
    texts.append(sub.choices["eval"].description)
    for name in longdoc.TASKS:
        assert all(f"longdoc:{name}" in text for text in texts), name
