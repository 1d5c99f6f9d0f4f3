"""``retrofit eval`` of a classifier on records (``retrofit.evaluation.records``): the held-out records its run
fine-tuned on, or ``--data``'s, each read whole and counted in the first length that holds it; a model that reads past
native is told apart from the original truncated there, by length bin, as for the offline tasks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer

from retrofit.data import longdoc
from retrofit.evaluation import longdoc as measure
from retrofit.evaluation import records
from retrofit.evaluation.models import EvalModel
from retrofit.foundation.errors import DataError, OptionError

STANDIN = next((Path(__file__).resolve().parents[2] / "standins").glob("small-bert-*"))
NATIVE = 256
LENGTHS = [NATIVE, 2 * NATIVE, 4 * NATIVE]


class Finder(nn.Module):
    """A classifier that finds "The secret word is <word>." in what it reads (``reach``: the tokens it reads)."""

    def __init__(self, builder: longdoc.Builder, reach: int | None = None):
        super().__init__()
        self.b, self.reach, self.w = builder, reach, nn.Parameter(torch.zeros(1))
        labels = dict(enumerate(longdoc.WORDS))
        self.config = SimpleNamespace(architectures=["BertForSequenceClassification"], id2label=labels, num_labels=4)

    def forward(self, input_ids):
        ids = input_ids[0, : self.reach].tolist()
        found = [any(ids[i : i + len(p)] == p for i in range(len(ids))) for p in self.b.words]
        return SimpleNamespace(logits=torch.tensor([[5.0 * f for f in found]]))


Finder.__name__ = "BertForSequenceClassification"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(STANDIN)


def write_records(path: Path, n: int = 24) -> Path:
    """Records of 3 sizes (about 1x, 1.5x and 3.5x native tokens), the label's sentence near each one's end."""
    rows = []
    for i in range(n):
        words = ["the"] * (100, 380, 880)[i % 3]
        word = longdoc.WORDS[i % 4]
        rows.append({"text": " ".join(words[:-4] + f"The secret word is {word}.".split() + words[-4:]), "label": word})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_records_are_read_whole_by_length_and_a_reading_past_native_is_told_apart(tmp_path, tok):
    src = records.source_for(str(write_records(tmp_path / "test.jsonl")), None, given=True)
    b = longdoc.Builder("longdoc:mention", tok, "heldout")
    info = {"native": {"length": NATIVE}, "max_length": None}
    models = [
        EvalModel("long", "converted", Finder(b), tok, info),
        EvalModel("original", "baseline", Finder(b, NATIVE), tok, {"native": {"length": NATIVE}, "max_length": NATIVE}),
    ]
    data = measure.run_records(models, src, LENGTHS, NATIVE)
    assert data["bins"] == [8, 8, 8] and data["examples"] == 24  # each size in its own bin
    s = {(r["model"], r["read"], r["length"]): r["score"] for r in data["rows"]}
    assert all(s["long", "whole", L] == 1.0 for L in LENGTHS)
    assert s["original", "truncated", NATIVE] == 1.0  # the records that fit: read whole by every reading
    for L in LENGTHS[1:]:  # the evidence past native: no word found, the first class (chance)
        assert s["original", "truncated", L] <= 0.25
    assert s["original", "chunk-mean", 4 * NATIVE] == 1.0  # one piece: a chunk holds it
    assert ("original", "whole", NATIVE) not in s  # on what its table holds, its truncated reading
    assert "documents a column: 8 / 8 / 8" in measure.table(data)
    cut = [EvalModel("long", "converted", Finder(b, NATIVE), tok, info), models[1]]  # ignores text past native
    said = measure.verdict(measure.run_records(cut, src, LENGTHS, NATIVE))  # the first class past native: chance
    assert said.startswith("at chance past native at 512, 1,024 tokens") and "beats no reading" in said, said


def test_a_records_label_the_classifier_lacks_and_a_missing_field_are_clear_errors(tmp_path, tok):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"text": "a b c", "label": "zebra"}) + "\n")
    src = records.source_for(str(path), None, given=True)
    with pytest.raises(DataError, match="'zebra' is not one of the model's classes"):
        records.examples(src, tok, longdoc.WORDS, 512, NATIVE)
    path.write_text(json.dumps({"body": "a b c", "label": "lion"}) + "\n")
    with pytest.raises(DataError, match=r"no field 'text' \(fields: body, label\); set data.text_field to the field"):
        records.examples(records.source_for(str(path), None, given=True), tok, longdoc.WORDS, 512, NATIVE)
    with pytest.raises(OptionError, match="long-document task or on records"):
        records.source_for("stdlib", None, given=False)


def test_the_held_out_records_are_those_the_fine_tune_held_out(tmp_path):
    """The fine-tune and the evaluation of its run split the records in one place, with the recipe's seed."""
    from retrofit.data.specs import heldout_split

    train, held = heldout_split(list(range(40)), 3, 0.25, 64)
    assert len(held) == 10 and sorted(train + held) == list(range(40)) and not set(train) & set(held)
    assert heldout_split(list(range(40)), 3, 0.25, 4)[1] == held[:4]  # at most max_validation_blocks
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    data = {
        "files": "r.jsonl",
        "dataset": None,
        "validation_fraction": 0.25,
        "max_validation_blocks": 64,
        "split": "train",
    }
    (run / "recipe.yaml").write_text(json.dumps({"data": data, "train": {"seed": 3}}))
    src = records.source_for("stdlib", run / "final", given=False)
    assert src.heldout == (3, 0.25, 64) and src.data.files == "r.jsonl"


@pytest.mark.slow
def test_a_classifier_fine_tuned_on_records_is_evaluated_on_its_held_out_records_and_on_data(tmp_path, capsys):
    """As a user types it: fine-tune a classifier on a jsonl of records, then ``retrofit eval RUN`` (its held-out
    records, by length) and ``retrofit eval RUN --data test.jsonl --baseline original``."""
    from retrofit.cli import main

    from ..training.test_tasks import classifier_folder, write

    src = classifier_folder(tmp_path / "cls")  # 2 classes, native 64
    rows = [{"text": "word " * (20 + 37 * (i % 4)), "label": "ab"[i % 2]} for i in range(32)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "task": "classification",
        "model": {"name_or_path": str(src)},
        "convert": {"scheme": "alibi"},
        "data": {"files": str(tmp_path / "train.jsonl"), "block_length": 256, "validation_fraction": 0.25},
        "train": {"steps": 2, "batch_size": 2},
        "output_dir": str(tmp_path / "run"),
    }
    assert main(["finetune", write(tmp_path, recipe)]) == 0
    run = tmp_path / "run"
    assert main(["eval", str(run), "--lengths", "64,128,256"]) == 0
    report = json.loads((run / "eval" / "report.json").read_text())
    assert report["task"].startswith("the held-out records of") and sum(report["bins"]) == 8  # 25% of 32
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:12]))
    out = tmp_path / "ev"
    args = ["eval", str(run), "--data", str(tmp_path / "test.jsonl"), "--baseline", "original", "--out", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert sum(report["bins"]) == 12 and {r["read"] for r in report["rows"] if r["role"] == "baseline"} == {
        "truncated",
        "chunk-mean",
        "best-chunk",
    }
    assert "test.jsonl" in capsys.readouterr().out


def test_a_classifier_named_by_index_reads_integer_labels_by_index(tmp_path, tok):
    """A classifier whose classes have no names (LABEL_0 ...) and records whose labels are the class indices."""
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"text": f"text {i}", "label": i % 2}) + "\n" for i in range(4)))
    got = records.examples(records.source_for(str(path), None, given=True), tok, ("LABEL_0", "LABEL_1"), 64, NATIVE)
    assert [e.label for e in got] == [0, 1, 0, 1]


def test_records_of_a_folder_of_parquet_files_are_read(tmp_path, tok):
    import datasets

    (tmp_path / "recs").mkdir()
    for part in range(2):
        rows = {"text": [f"text {part} {i}" for i in range(3)], "label": ["lion", "horse", "lion"]}
        datasets.Dataset.from_dict(rows).to_parquet(tmp_path / "recs" / f"part-{part}.parquet")
    got = records.examples(records.source_for(str(tmp_path / "recs"), None, given=True), tok, longdoc.WORDS, 64, NATIVE)
    assert [e.label for e in got] == [0, 1, 0, 0, 1, 0]


def test_queries_that_share_a_document_each_find_it(tmp_path, tok):
    """Retrieval over records: a query's hit is its own document by content, so two queries of one document both
    count (an oracle embedding: a bag of hashed 4-grams)."""
    from .test_longdoc_eval import Bag

    doc = "the quick brown fox jumps over the lazy dog " * 4
    rows = [{"query": "quick brown fox jumps", "document": doc}, {"query": "over the lazy dog", "document": doc}]
    rows += [
        {"query": f"entry {i} of the index", "document": f"entry {i} of the index, then more " * 3} for i in range(4)
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = {"native": {"length": NATIVE}, "max_length": None}
    models = [EvalModel("bag", "converted", Bag(), tok, info)]
    data = measure.run_records(models, records.source_for(str(path), None, given=True), [NATIVE], NATIVE)
    assert data["rows"][0]["score"] == 1.0


def test_what_data_may_hold_records_is_read_only_once_the_model_is_known(tmp_path):
    """``retrofit eval`` reads text data before loading a model (bad data said at once), but records only after: a
    classifier's parquet is not text. Built-in names are known without loading them."""
    from retrofit.evaluation.runner import _task_of
    from retrofit.models import builtin

    (tmp_path / "t.txt").write_text("words")
    (tmp_path / "r.parquet").write_bytes(b"PAR1")
    assert not records.may_hold_records(str(tmp_path / "t.txt")) and not records.may_hold_records("stdlib")
    assert records.may_hold_records(str(tmp_path / "r.parquet")) and records.may_hold_records(str(tmp_path))
    assert records.may_hold_records("org/some-dataset")
    assert _task_of("tiny-gpt2") == "causal-lm" and _task_of("baseline:small-bert") == "masked-lm"
    assert builtin.task_of("org/model") is None and _task_of("org/model") is None
