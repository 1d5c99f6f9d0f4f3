"""What a fine-tune says before any weights load (``training/preflight.py``): a classifier or an embedding recipe on a
decoder, a trained classifier's classes against the records' labels, a missing data file, a missing field, a label
outside the classes and a long-document task of the other kind, each refused by ``retrofit finetune --check`` and by
the run itself before the model loads (the loading is patched to fail: reaching it fails the test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from retrofit.cli import main
from retrofit.foundation.errors import DataError, RecipeError
from retrofit.training import preflight, tasks
from retrofit.training.model import new_head
from retrofit.training.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
DECODER = next(ROOT.glob("standins/quickstart-*"))  # a shipped GPT-2 stand-in (GPT2LMHeadModel)
CLASSIFIER = ROOT / "standins" / "small-bert-mention-classifier"  # 4 classes: lion, horse, crown, sword
ENCODER = next(ROOT.glob("standins/small-bert-[0-9a-f]*"))  # a masked LM (BertForMaskedLM): a new head
OWN = ("lion", "horse", "crown", "sword")


@pytest.fixture
def no_weights(monkeypatch):
    """Loading the model fails the test: whatever is said must come before it."""

    def load(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the error")

    monkeypatch.setattr("retrofit.training.model.load", load)


def records(tmp_path, labels, field="label", n=40) -> str:
    path = tmp_path / "records.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"text {i} " * 8, field: labels[i % len(labels)]}) + "\n" for i in range(n))
    )
    return str(path)


def recipe(tmp_path, **raw) -> dict:
    base = {
        "task": "classification",
        "model": {"name_or_path": str(CLASSIFIER)},
        "data": {"block_length": 64},
        "train": {"method": "full", "steps": 1, "batch_size": 2},
        "output_dir": str(tmp_path / "run"),
    }
    for key, value in raw.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and key in base else value
    return base


def check_cli(tmp_path, raw: dict, capsys) -> tuple[int, str]:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    rc = main(["finetune", str(path), "--check"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def refused_before_loading(raw: dict, error, match: str) -> None:
    from retrofit.training.loop import finetune

    with pytest.raises(error, match=match):
        finetune(raw)


@pytest.mark.parametrize("task, data", [("embedding", "longdoc:needle"), ("classification", "longdoc:mention")])
def test_a_task_on_a_decoder_is_refused_by_check_and_before_loading(tmp_path, capsys, no_weights, task, data):
    raw = recipe(tmp_path, task=task, model={"name_or_path": str(DECODER)}, data={"dataset": data})
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 2 and f"'task: {task}' trains an encoder" in out and "GPT2LMHeadModel" in out, out
    refused_before_loading(raw, RecipeError, "trains an encoder")


def test_a_built_in_decoder_is_refused_without_being_built(tmp_path, no_weights):
    raw = recipe(tmp_path, task="embedding", model={"name_or_path": "tiny-gpt2"}, data={"dataset": "longdoc:needle"})
    with pytest.raises(RecipeError, match="'tiny-gpt2' is a causal-lm model"):
        preflight.check(Recipe.from_dict(raw))
    assert not (tmp_path / "run").exists()


def test_the_built_in_embedding_model_passes_as_an_encoder_without_being_built(tmp_path, capsys, no_weights):
    """``minilm`` (all-MiniLM-L6-v2, an embedding model) is an encoder: ``task: embedding`` on it is accepted, by
    ``--check`` as by the fine-tune's own check, from its name alone (no wheel read, no weights loaded)."""
    raw = recipe(tmp_path, task="embedding", model={"name_or_path": "minilm"}, data={"dataset": "longdoc:needle"})
    assert preflight.model_facts("minilm").encoder
    assert preflight.check(Recipe.from_dict(raw)) == []
    assert check_cli(tmp_path, raw, capsys)[0] == 0


@pytest.mark.parametrize(
    "labels, words",
    [
        (["alpha", "beta", "gamma", "delta"], "labels are alpha, beta, delta, gamma"),  # the same count, renamed
        (["lion", "horse", "crown"], "labels are crown, horse, lion"),  # fewer: a 3-class head would replace it
    ],
)
def test_records_of_other_classes_than_a_trained_classifiers_are_refused(tmp_path, capsys, no_weights, labels, words):
    raw = recipe(tmp_path, data={"files": records(tmp_path, labels)})
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 2 and "classifier of 4 classes (lion, horse, crown, sword)" in out and words in out, out
    assert "model.new_head: true" in out
    refused_before_loading(raw, RecipeError, "classifier of 4 classes")


def test_data_labels_in_another_order_than_the_heads_are_refused(tmp_path, no_weights):
    raw = recipe(tmp_path, data={"files": records(tmp_path, OWN), "labels": sorted(OWN)})
    refused_before_loading(raw, RecipeError, r"crown, horse, lion, sword \(data.labels, in this order\)")


def test_records_of_its_own_classes_keep_the_heads_order(tmp_path):
    """Sorted, the records' labels would be crown, horse, lion, sword: the head's class 0 (lion) renamed crown."""
    r = Recipe.from_dict(recipe(tmp_path, data={"files": records(tmp_path, list(reversed(OWN)))}))
    assert preflight.check(r) == []
    assert tasks.label_names(r) == OWN


def test_new_head_takes_the_records_labels_and_draws_a_new_head(tmp_path):
    import torch
    import transformers as tf

    r = Recipe.from_dict(recipe(tmp_path, model={"new_head": True}, data={"files": records(tmp_path, ["b", "a"])}))
    assert preflight.check(r) == [] and tasks.label_names(r) == ("a", "b")
    model = tf.BertForSequenceClassification.from_pretrained(CLASSIFIER)
    head, body = model.classifier.weight.clone(), model.bert.encoder.layer[0].output.dense.weight.clone()
    new_head(model)
    assert not torch.equal(model.classifier.weight, head) and torch.equal(model.classifier.bias, torch.zeros(4))
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight, body)  # the encoder is kept
    with pytest.raises(RecipeError, match="needs 'task: classification'"):
        Recipe.from_dict(
            recipe(tmp_path, task="embedding", model={"new_head": True}, data={"dataset": "longdoc:needle"})
        )


def test_a_masked_lm_takes_the_records_labels_as_a_new_head(tmp_path):
    r = Recipe.from_dict(
        recipe(tmp_path, model={"name_or_path": str(ENCODER)}, data={"files": records(tmp_path, ["y", "x", "z"])})
    )
    assert preflight.check(r) == [] and tasks.label_names(r) == ("x", "y", "z")


def test_a_missing_data_file_is_refused_by_check(tmp_path, capsys, no_weights):
    for raw in (
        recipe(tmp_path, data={"files": str(tmp_path / "nosuch.jsonl")}),
        {"model": {"name_or_path": "tiny-gpt2"}, "data": {"files": str(tmp_path / "nosuch.txt")}, "output_dir": "o"},
    ):
        rc, out = check_cli(tmp_path, raw, capsys)
        assert rc == 2 and "nosuch" in out, out
    refused_before_loading(
        recipe(tmp_path, data={"files": str(tmp_path / "nosuch.jsonl")}), DataError, "no file matches"
    )


@pytest.mark.parametrize(
    "task, field, key",
    [("classification", "category", "data.label_field"), ("embedding", "question", "data.query_field")],
)
def test_a_missing_field_is_refused_by_check_and_before_loading(tmp_path, capsys, no_weights, task, field, key):
    rows = [{"text": "x", "document": "y", field: "lion"}] * 8
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = str(CLASSIFIER if task == "classification" else ENCODER)
    raw = recipe(tmp_path, task=task, model={"name_or_path": model}, data={"files": str(path)})
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 2 and f"({key}; its fields:" in out and f"set {key}" in out, out
    refused_before_loading(raw, DataError, f"set {key}")


def test_a_label_outside_the_classes_is_refused_before_loading(tmp_path, capsys, no_weights):
    raw = recipe(
        tmp_path,
        model={"name_or_path": str(ENCODER)},
        data={"files": records(tmp_path, ["lion", "horse", "crown"]), "labels": ["lion", "horse"]},
    )
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 2 and "'crown', not among data.labels (lion, horse)" in out, out
    refused_before_loading(raw, DataError, "not among data.labels")


def test_a_long_document_task_of_the_other_kind_is_refused_with_the_recipe():
    raw = {"task": "classification", "model": {"name_or_path": "x"}, "data": {"dataset": "longdoc:needle"}}
    with pytest.raises(RecipeError, match="is an embedding task; the recipe's 'task' is classification"):
        Recipe.from_dict({**raw, "output_dir": "o"})


def test_a_hub_model_and_dataset_not_cached_are_noted_not_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    raw = recipe(tmp_path, model={"name_or_path": "someone/not-cached-model"}, data={"dataset": "someone/not-cached"})
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 0 and "# not checked: model 'someone/not-cached-model'" in out, out


def test_a_classifiers_unnamed_classes_take_the_records_labels_of_their_count(tmp_path):
    """transformers writes no id2label for its default 2 classes (LABEL_0, LABEL_1): named by the records' 2 labels;
    3 labels would replace its head."""
    folder = tmp_path / "cls"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "bert", "architectures": ["BertForSequenceClassification"]})
    )
    r = Recipe.from_dict(
        recipe(tmp_path, model={"name_or_path": str(folder)}, data={"files": records(tmp_path, ["y", "x"])})
    )
    assert preflight.check(r) == [] and tasks.label_names(r) == ("x", "y")
    r = Recipe.from_dict(
        recipe(tmp_path, model={"name_or_path": str(folder)}, data={"files": records(tmp_path, "xyz")})
    )
    with pytest.raises(RecipeError, match=r"classifier of 2 classes \(LABEL_0, LABEL_1\)"):
        preflight.check(r)


@pytest.mark.parametrize("length", [256, "2x"])
def test_blocks_past_the_converted_models_reach_are_refused_by_check_and_before_loading(
    tmp_path, capsys, no_weights, length
):
    """extend to 256 rows (the stand-in reads 128 natively), blocks of 512: said from config.json and the recipe."""
    raw = recipe(
        tmp_path,
        task=None,
        model={"name_or_path": str(DECODER)},
        data={"dataset": "stdlib", "block_length": 512},
        convert={"scheme": "extend", "options": {"length": length}},
    )
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 2 and "'data.block_length' = 512" in out and "256 positions" in out, out
    refused_before_loading(raw, RecipeError, "256 positions")


def test_blocks_past_a_converted_checkpoints_table_are_refused_before_loading(tmp_path, capsys, no_weights):
    folder = tmp_path / "extended"
    folder.mkdir()
    config = json.loads((DECODER / "config.json").read_text())
    config["retrofit"] = {"scheme": "extend", "options": {"length": 256}, "native": {"length": 128}}
    (folder / "config.json").write_text(json.dumps(config))
    raw = recipe(
        tmp_path, task=None, model={"name_or_path": str(folder)}, data={"dataset": "stdlib", "block_length": 300}
    )
    rc, out = check_cli(tmp_path, raw, capsys)
    assert rc == 2 and "'data.block_length' = 300" in out and "256 positions" in out, out
    refused_before_loading(raw, RecipeError, "256 positions")
