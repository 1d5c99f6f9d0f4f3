"""The shipped stand-in classifier and embedding model (``standins/small-bert-*-classifier``, ``-embedding``: the
encoder stand-in after a short task fine-tune at its native length, ``research/encoder_tasks.py --ship``): their
files match their SHA256SUMS, they load through their Auto class and ``SentenceTransformer`` without retrofit's help,
and they do their task at native (what the study's cells start from; a damaged or wrong copy fails here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers as tf

from retrofit.evaluation import longdoc as measure
from retrofit.evaluation.models import EvalModel
from retrofit.models.standin import check_shipped

STANDINS = Path(__file__).resolve().parents[2] / "standins"
CLASSIFIER, EMBEDDING = STANDINS / "small-bert-mention-classifier", STANDINS / "small-bert-needle-embedding"
NATIVE = 256


@pytest.mark.parametrize("folder", [CLASSIFIER, EMBEDDING], ids=["classifier", "embedding"])
def test_the_shipped_task_standins_are_whole_and_say_how_they_were_built(folder):
    check_shipped(folder)
    build = json.loads((folder / "build.json").read_text())
    assert build["from"] == "baseline:small-bert" and build["command"].startswith("python research/encoder_tasks.py")
    assert all(s["documents"][1] <= NATIVE for s in build["stages"])  # a fine-tune at native only


def _eval_model(model, tok) -> EvalModel:
    return EvalModel("standin", "converted", model.eval(), tok, {"native": {"length": NATIVE}, "max_length": NATIVE})


def test_the_shipped_classifier_loads_as_itself_and_finds_the_word_at_native():
    model = tf.AutoModelForSequenceClassification.from_pretrained(CLASSIFIER)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.id2label == {0: "lion", 1: "horse", 2: "crown", 3: "sword"}
    tok = tf.AutoTokenizer.from_pretrained(CLASSIFIER)
    data = measure.run([_eval_model(model, tok)], "longdoc:mention", [NATIVE], NATIVE, 32)
    assert data["rows"][0]["score"] >= 0.9  # chance: 25%


def test_the_shipped_embedding_model_loads_in_sentence_transformers_and_retrieves_at_native():
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(EMBEDDING), device="cpu")
    assert model.max_seq_length == NATIVE
    bare = tf.AutoModel.from_pretrained(EMBEDDING)
    data = measure.run([_eval_model(bare, model.tokenizer)], "longdoc:needle", [NATIVE], NATIVE, 32)
    assert data["rows"][0]["score"] >= 0.2  # chance: 1 in 32


def test_the_docs_line_that_tries_the_classifier_runs_as_typed(tmp_path, monkeypatch, capsys):
    """docs/encoders.md's line, run from the repository's root (its --out moved to a temporary folder)."""
    import shlex

    from retrofit.cli import main

    root = STANDINS.parent
    doc = (root / "docs" / "encoders.md").read_text().splitlines()
    line = next(x for x in doc if x.startswith("retrofit eval standins/"))
    args = shlex.split(line)
    assert args[:2] == ["retrofit", "eval"]
    args[args.index("--out") + 1] = str(tmp_path / "ev")
    monkeypatch.chdir(root)
    assert main(args[1:]) == 0
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["task"] == "longdoc:mention" and report["rows"][0]["score"] >= 0.9
    check_shipped(CLASSIFIER)  # nothing written into the shipped folder


def test_eval_of_a_shipped_folder_writes_its_report_beside_it_not_into_it(tmp_path, monkeypatch, capsys):
    """A folder with a SHA256SUMS stays as shipped: the default --out is eval-NAME in the working directory, said."""
    import shutil

    from retrofit.cli import main

    copy = tmp_path / "small-bert-mention-classifier"
    shutil.copytree(CLASSIFIER, copy)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(copy), "--data", "longdoc:mention", "--lengths", "1x", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"{copy}: its files are checksummed (SHA256SUMS: a shipped folder), so the report goes to " in out, out
    assert json.loads((tmp_path / "eval-small-bert-mention-classifier" / "report.json").read_text())["rows"]
    assert not (copy / "eval").exists()
    check_shipped(copy)
