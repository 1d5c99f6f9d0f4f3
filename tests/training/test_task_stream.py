"""``task:`` with ``data.streaming: true``: a classifier's or an embedding model's records read as a stream
(``training/task_stream.py``), as a user types the recipe: the first records held out and never trained on, classes
from ``data.labels`` or a class-label column, a run stopped after a checkpoint and resumed equal to the uninterrupted
one, ``retrofit eval`` of the run on those same held-out records; what a stream cannot do is said at once."""

from __future__ import annotations

import json

import pytest

from retrofit.cli import main
from retrofit.foundation.errors import RecipeError
from retrofit.training.recipe import Recipe
from retrofit.training.task_stream import TaskStream

from .test_masked_lm import bert_folder
from .test_tasks import NATIVE, classifier_folder, write


def records(path, n: int = 40):
    rows = [{"text": f"text {i} " + "word " * (8 + 5 * (i % 7)), "label": "ab"[i % 2]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe(src, files, out, **data) -> dict:
    return {
        "task": "classification",
        "model": {"name_or_path": str(src)},
        "convert": {"scheme": "alibi"},
        "data": {
            "files": str(files),
            "streaming": True,
            "block_length": 2 * NATIVE,
            "max_validation_blocks": 8,
            **data,
        },
        "train": {"steps": 6, "batch_size": 2, "seed": 3, "lora": {"dropout": 0.0}},
        "checkpoint": {"every": 2},
        "output_dir": str(out),
    }


def test_the_first_records_are_held_out_and_never_trained_on(tmp_path):
    r = Recipe.from_dict(recipe("x", records(tmp_path / "r.jsonl"), tmp_path / "o", labels=["a", "b"]))
    src = TaskStream.of_task(r)
    src.row = lambda rec: rec["text"]
    held = src.validation(None, 0, True, 8)
    assert [x.split()[1] for x in held] == [str(i) for i in range(8)]
    trained = [rec["text"] for rec in src.documents(0, 1, 3, 0)]
    assert len(trained) == 32 and not set(trained) & set(held)
    assert src.class_names(r.data.labels) == ("a", "b")


def test_a_class_label_column_gives_the_classes_and_plain_labels_need_data_labels(tmp_path):
    import datasets

    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    (tmp_path / "ds" / "data").mkdir(parents=True)
    rows = {"text": [f"review {i}" for i in range(12)], "label": [i % 2 for i in range(12)]}
    datasets.Dataset.from_dict(rows, features=feats).to_parquet(tmp_path / "ds" / "data" / "train-00000.parquet")
    raw = recipe("x", "-", tmp_path / "o")
    raw["data"] = {**{k: v for k, v in raw["data"].items() if k != "files"}, "dataset": str(tmp_path / "ds")}
    src = TaskStream.of_task(Recipe.from_dict(raw))
    assert src.class_names(None) == ("neg", "pos")
    assert next(src.records(src.open()))["label"] == "neg"  # by name, as the records read whole give it
    plain = TaskStream.of_task(Recipe.from_dict(recipe("x", records(tmp_path / "r.jsonl"), tmp_path / "o")))
    with pytest.raises(RecipeError, match="set data.labels"):
        plain.class_names(None)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"dataset": "longdoc:mention", "files": None}, "with a longdoc: task"),
        ({"max_documents": 10}, "'data.max_documents' bounds a source read whole"),
    ],
)
def test_what_a_task_stream_cannot_do_fails_before_loading(tmp_path, change, match):
    raw = recipe("x", records(tmp_path / "r.jsonl"), tmp_path / "o")
    raw["data"].update(change)
    with pytest.raises(RecipeError, match=match):
        Recipe.from_dict(raw)


@pytest.mark.slow  # three fine-tunes and an evaluation
def test_a_streamed_classifier_resumes_exactly_and_is_evaluated_on_its_held_out_records(tmp_path):
    from ..procs import assert_resume_is_exact

    src = classifier_folder(tmp_path / "cls")  # classes a, b
    files = records(tmp_path / "r.jsonl")
    assert_resume_is_exact(lambda out: recipe(src, files, out, labels=["a", "b"]), tmp_path, 6)
    run = tmp_path / "whole"
    info = json.loads((run / "versions.json").read_text())
    assert info["task"] == "classification" and info["validation_documents"] == 8 and "train_stream" in info
    assert json.loads((run / "summary.json").read_text())["heldout"]["examples"] == 8
    assert main(["eval", str(run), "--lengths", f"{NATIVE},{2 * NATIVE}"]) == 0
    report = json.loads((run / "eval" / "report.json").read_text())
    assert sum(report["bins"]) == 8  # the same first 8 records the fine-tune held out


@pytest.mark.slow
def test_a_streamed_embedding_model_fine_tunes_from_pairs(tmp_path):
    pytest.importorskip("sentence_transformers")
    src = bert_folder(tmp_path / "bert")
    rows = [{"query": f"question {i}", "document": f"item {i} is described here " * 4} for i in range(24)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = recipe(src, tmp_path / "pairs.jsonl", tmp_path / "run")
    raw.update(task="embedding", convert={"scheme": "t5"})
    assert main(["finetune", write(tmp_path, raw)]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["heldout"]["examples"] == 8


@pytest.mark.parametrize(
    "change, match",
    [
        ({"validation_split": "validation"}, "names a split of a Hub dataset"),
        ({"validation_documents": 4}, "'data.validation_documents'"),
    ],
)
def test_validation_keys_a_streamed_task_does_not_read_fail_before_loading(tmp_path, change, match):
    raw = recipe("x", records(tmp_path / "r.jsonl"), tmp_path / "o", labels=["a", "b"])
    raw["data"].update(change)
    with pytest.raises(RecipeError, match=match):
        Recipe.from_dict(raw)


def test_a_stream_whose_records_are_all_held_out_is_an_error(tmp_path):
    from retrofit.foundation.errors import DataError

    raw = recipe("x", records(tmp_path / "r.jsonl", n=10), tmp_path / "o", labels=["a", "b"])
    src = TaskStream.of_task(Recipe.from_dict(raw))
    src.row = lambda rec: rec["text"]
    src.validation(None, 0, True, 8)
    with pytest.raises(DataError, match="2 record\\(s\\) left for training after the 8 held out; one step needs 4"):
        src.check_room(4)
    src.check_room(2)
