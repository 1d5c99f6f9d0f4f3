"""``retrofit run``: recipe sections, stages and manifest, skipping done stages, and a kill during the
fine-tune followed by a resumed run (recipes/tiny-run.yaml: tiny-gpt2, built offline)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import retrofit
from retrofit.foundation.errors import OptionError, RecipeError, RetrofitError
from retrofit.pipeline import stages as pipeline

from ..pipeline_run import REPO, TINY_RECIPE, copy_run, shared_run
from ..procs import crash_after_first_checkpoint

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

VERSION_KEYS = {"retrofit", "torch", "transformers", "peft", "accelerate"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return shared_run(tmp_path_factory)


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


# ---- the recipe ------------------------------------------------------------------------------------
def test_recipe_sections_and_defaults():
    rr = pipeline.load_recipe(TINY_RECIPE)
    assert rr.finetune.model.name_or_path == "tiny-gpt2"
    assert rr.eval.baselines == ["original"] and rr.push.repo is None and rr.export.native is True
    assert pipeline.resolve_lengths(rr.eval.lengths, 64) == [64, 128, 256]
    assert pipeline.resolve_lengths(["1x", "0.5x", 300, "2x"], 100) == [50, 100, 200, 300]


def test_quickstart_recipe_is_valid_and_spans_1x_to_16x():
    from retrofit.models.standin import PRESETS

    rr = pipeline.load_recipe(REPO / "recipes" / "quickstart.yaml")
    assert rr.finetune.model.name_or_path == "baseline:quickstart" and rr.finetune.convert.scheme == "alibi"
    assert rr.finetune.data.dataset == "shakespeare:train" and rr.eval.data == "shakespeare:heldout"
    native = PRESETS["quickstart"].n_positions
    assert pipeline.resolve_lengths(rr.eval.lengths, native) == [native * k for k in (1, 2, 4, 8, 16)]
    assert "original" in rr.eval.baselines


@pytest.mark.parametrize(
    "override, key",
    [
        ("eval.lenghts=[1x]", "eval.lenghts"),  # unknown key, with a suggestion
        ("eval.passkey=yes please", "eval.passkey"),  # wrong type
        ("eval.budget=0", "eval.budget"),
        ("eval.lengths=[4y]", "eval.lengths"),
        ("eval.passkey_depths=[2]", "eval.passkey_depths"),
        ("push.repo=not a repo", "push.repo"),
        ("push.privat=true", "push.privat"),
        ("export.native=maybe", "export.native"),
        ("card.tags=[1]", "card.tags"),
        ("train.stpes=3", "train.stpes"),  # the fine-tune part is validated as strictly
    ],
)
def test_bad_sections_name_the_key(override, key):
    with pytest.raises((RecipeError, OptionError)) as e:
        pipeline.load_recipe(TINY_RECIPE, [override])
    assert key in str(e.value)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(RecipeError, match="did you mean 'eval.lengths'"):
        pipeline.load_recipe(TINY_RECIPE, ["eval.lenghts=[1x]"])


# ---- one uninterrupted run -----------------------------------------------------------------------------
def test_every_stage_recorded_with_outputs_and_versions(run_dir):
    m = _manifest(run_dir)
    assert m["recipe_hash"] and m["recipe"].endswith("tiny-run.yaml")
    stages = m["stages"]
    assert list(stages) == list(pipeline.STAGES)
    assert [stages[s]["status"] for s in ("finetune", "eval", "card")] == ["done"] * 3
    assert stages["export"]["status"] in ("done", "not available")
    assert stages["push"]["status"] == "skipped"
    for name, e in stages.items():
        assert VERSION_KEYS <= set(e["versions"]), name
        assert e["started"] <= e["finished"] and e["inputs"]
        for out in e["outputs"]:
            assert (run_dir / out).exists(), out
    for f in (
        "final/config.json",
        "summary.json",
        "eval/report.json",
        "eval/ppl_vs_length.png",
        "README.md",
        "run.yaml",
        "recipe.yaml",
    ):
        assert (run_dir / f).exists(), f


def test_eval_is_against_the_original_with_a_sliding_row_past_native(run_dir):
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["settings"]["lengths"] == [64, 128, 256]
    roles = {m["name"]: m for m in report["models"]}
    main, orig = report["models"][0], report["models"][1]
    assert main["converted"] and main["scheme"] == "alibi" and not orig["converted"] and len(roles) == 2
    past = [r for r in report["rows"] if r["model"] == orig["name"] and r["length"] > 64]
    assert past and all(r["method"] == "sliding" and r["window"] == 64 for r in past)
    assert "/" not in main["name"] and "/" not in orig["name"]  # no local paths in what gets pushed


def test_export_result_recorded(run_dir):
    e = _manifest(run_dir)["stages"]["export"]
    if e["status"] == "done":
        assert e["result"]["target"] and (run_dir / "export" / "config.json").is_file()
    else:
        assert e["reason"]


def test_rerun_skips_every_done_stage(run_dir, caplog):
    before = _manifest(run_dir)["stages"]
    with caplog.at_level(logging.INFO, logger="retrofit.pipeline.stages"):
        retrofit.run(TINY_RECIPE, overrides=[f"output_dir={run_dir}"])
    after = _manifest(run_dir)["stages"]
    for s in pipeline.STAGES:
        assert after[s]["started"] == before[s]["started"], s
    assert caplog.text.count("already done") == len(pipeline.STAGES)


def test_changed_eval_section_reruns_eval_and_later_only(run_dir, tmp_path):
    copy = copy_run(run_dir, tmp_path / "copy")
    before = _manifest(copy)["stages"]
    time.sleep(1.1)  # timestamps have one-second resolution
    retrofit.run(copy / "run.yaml", overrides=["eval.budget=512", "eval.passkey=false", "eval.lengths=[1x, 2x]"])
    after = _manifest(copy)["stages"]
    assert after["finetune"]["started"] == before["finetune"]["started"]
    for s in ("eval", "export", "card"):  # the changed stage and every later one run again
        assert after[s]["started"] > before[s]["started"], s
    assert json.loads((copy / "eval" / "report.json").read_text())["data"]["budget"] == 512


def test_export_not_available_does_not_fail_the_run(run_dir, tmp_path, monkeypatch):
    from retrofit import native_export

    def refuse(*a, **k):
        raise RetrofitError("no native architecture for this pair")

    monkeypatch.setattr(native_export, "export", refuse)
    copy = copy_run(run_dir, tmp_path / "copy")
    retrofit.run(copy / "run.yaml", force=("export",))
    e = _manifest(copy)["stages"]["export"]
    assert e["status"] == "not available" and "no native architecture" in e["reason"]
    card = (copy / "README.md").read_text()
    assert "no native architecture for this pair" in card


# ---- killed during the fine-tune, then resume ----------------------------------------------------------
def _weights(run: Path) -> dict:
    return load_file(str(run / "final" / "model.safetensors"))


def test_kill_during_finetune_then_rerun_resumes_and_matches(run_dir, tmp_path):
    """`retrofit run` stopped dead once a fine-tune checkpoint exists (tests/procs.py: a SIGKILL of a process
    is tests/training/test_finetune.py's); the re-run resumes from it, runs every later stage, and ends with
    the weights of the uninterrupted run."""
    out = tmp_path / "killed"
    fast_eval = ["eval.lengths=[1x]", "eval.passkey=false"]  # not part of the fine-tune: its weights stay comparable
    with crash_after_first_checkpoint():
        retrofit.run(TINY_RECIPE, overrides=[f"output_dir={out}", *fast_eval])
    assert not (out / "final").exists()
    # stopped by an exception here ("failed"; a SIGKILL leaves "running"): either is a stage not done, re-run
    assert _manifest(out)["stages"]["finetune"]["status"] == "failed"

    retrofit.run(TINY_RECIPE, overrides=[f"output_dir={out}", *fast_eval])
    m = _manifest(out)["stages"]
    assert all(m[s]["status"] in pipeline.DONE for s in pipeline.STAGES)
    summary = json.loads((out / "summary.json").read_text())
    steps = yaml.safe_load(TINY_RECIPE.read_text())["train"]["steps"]
    assert 0 < summary["resumed_from_step"] < steps and m["finetune"]["resumed_from_step"] > 0
    a, b = _weights(run_dir), _weights(out)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


def test_run_from_a_converted_checkpoint_compares_with_its_original_positions(tmp_path):
    """A recipe that starts from `retrofit convert`'s output: the 'original' baseline is that checkpoint
    reverted (its learned table), the 'converted' one is the checkpoint as it was."""
    model, tok = retrofit.load_model("tiny-gpt2")
    retrofit.save(retrofit.convert(model, "alibi", kernel="chunked", scale_bias=True), tmp_path / "ck", tokenizer=tok)
    out = retrofit.run(
        TINY_RECIPE,
        overrides=[
            f"model.name_or_path={tmp_path / 'ck'}",
            f"output_dir={tmp_path / 'ck'}",
            "train.steps=2",
            "eval.baselines=[original, converted]",
            "eval.passkey=false",
            "export.native=false",
        ],
    )
    report = json.loads((out / "eval" / "report.json").read_text())
    by_role = [(m["role"], m["converted"], m["scheme"]) for m in report["models"]]
    assert by_role == [("converted", True, "alibi"), ("baseline", False, None), ("baseline", True, "alibi")]


def test_library_evaluate_knows_the_original(run_dir, tmp_path):
    """`retrofit.evaluate(RUN, baselines=["original"])`: the library resolves "original" as the CLI and the
    recipes do (the model the run started from, unconverted), with the same numbers as the run's own row."""
    ran = json.loads((run_dir / "eval" / "report.json").read_text())
    rec = yaml.safe_load((run_dir / "run.yaml").read_text())["eval"]
    report = retrofit.evaluate(
        str(run_dir), baselines=["original"], data=rec["data"], budget=rec["budget"], lengths=rec["lengths"]
    ).data
    base = report["models"][1]
    assert base["name"] == "tiny-gpt2 (original)" and not base["converted"]

    def row(rep, name):
        return [r["ppl"] for r in rep["rows"] if r["model"] == name and r["method"] == "non-overlapping"]

    assert row(report, base["name"]) == row(ran, base["name"]) != []
    model, tok = retrofit.load_model("tiny-gpt2")  # a plain model: its own original, nothing says another
    with pytest.raises(OptionError, match="records no model it was converted from"):
        retrofit.evaluate(model, tokenizer=tok, baselines=["original"], lengths=[8], data=rec["data"], budget=64)


def test_cli_eval_baseline_original_means_what_recipes_mean(run_dir, tmp_path, capsys):
    """`--baseline original` worked in recipes only (issue 32 item 11): `retrofit eval RUN --baseline original`
    scores the unconverted model the run started from (read from its run.yaml / the checkpoint's retrofit
    block), and gets the very numbers the pipeline's own 'original' row has on the same tokens."""
    from retrofit.cli import main

    ran = json.loads((run_dir / "eval" / "report.json").read_text())
    rec = yaml.safe_load((run_dir / "run.yaml").read_text())["eval"]
    args = [
        "--baseline",
        "original",
        "--data",
        rec["data"],
        "--budget",
        str(rec["budget"]),
        "--lengths",
        ",".join(rec["lengths"]),
        "--no-plots",
        "--no-progress",
    ]
    for target in (run_dir, run_dir / "final"):
        out = tmp_path / target.name
        assert main(["eval", str(target), *args, "--out", str(out)]) == 0
        report = json.loads((out / "report.json").read_text())
        base = report["models"][1]
        assert base["name"] == "tiny-gpt2 (original)" and base["role"] == "baseline" and not base["converted"]

        def row(rep, name):
            return [r["ppl"] for r in rep["rows"] if r["model"] == name and r["method"] == "non-overlapping"]

        assert row(report, base["name"]) == row(ran, base["name"]) != []
    capsys.readouterr()
    # a converted checkpoint without a run: its config's retrofit block names the base model
    model, tok = retrofit.load_model("tiny-gpt2")
    ck = retrofit.save(retrofit.convert(model, "alibi"), tmp_path / "ck", tokenizer=tok)
    assert main(["eval", str(ck), *args, "--out", str(tmp_path / "ck-eval")]) == 0
    report = json.loads((tmp_path / "ck-eval" / "report.json").read_text())
    assert [(m["name"], m["converted"]) for m in report["models"]][1] == ("tiny-gpt2 (original)", False)
    # a plain model records no original: a clear error (exit 2), before any scoring
    plain = tmp_path / "plain"
    retrofit.revert(model)
    model.save_pretrained(plain)
    tok.save_pretrained(plain)
    assert main(["eval", str(plain), "--baseline", "original", "--out", str(tmp_path / "x")]) == 2
    assert "records no model it was converted from" in capsys.readouterr().err


@pytest.mark.parametrize("start", ["classifier", "masked-lm"])
def test_a_classifier_recipe_runs_every_stage_against_its_original(tmp_path, start, caplog):
    """``retrofit run`` of a ``task: classification`` recipe: fine-tune, the long-document evaluation (default lengths
    up to the model's limit), the native export, the card. A run from a classifier compares with it; one from a
    masked LM (a new head) has no original classifier: said, not faked."""
    from retrofit.cli import main

    from ..training.test_masked_lm import bert_folder
    from ..training.test_tasks import classifier_folder

    src = classifier_folder(tmp_path / "cls") if start == "classifier" else bert_folder(tmp_path / "mlm")
    recipe = {
        "task": "classification",
        "model": {"name_or_path": str(src)},
        "convert": {"scheme": "extend", "options": {"length": "2x"}},
        "data": {"dataset": "longdoc:both", "block_length": 128, "min_block_length": 64},
        "train": {"method": "full", "steps": 2, "batch_size": 2},
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    with caplog.at_level(logging.WARNING):
        assert main(["run", str(tmp_path / "r.yaml")]) == 0
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["kind"] == "long-document" and report["task"] == "longdoc:both"
    assert report["lengths"] == [64, 128]  # 1x-8x by default, stopped at the extended table's 128 positions
    baselines = {r["read"] for r in report["rows"] if r["role"] == "baseline"}
    if start == "classifier":
        assert baselines == {"whole", "truncated", "chunk-mean", "best-chunk"}
    else:
        assert baselines == set() and "not a classifier: no original reading" in caplog.text
    manifest = _manifest(tmp_path / "run")
    assert manifest["stages"]["export"]["status"] == "done"  # extend -> plain BERT with a longer table
    card = (tmp_path / "run" / "README.md").read_text()
    assert "Long-document evaluation" in card
    assert (
        "| method | full (classification objective: the classifier's cross-entropy" in card
        and "lm objective" not in card
    )


def test_an_embedding_recipe_runs_from_the_python_api_exports_and_pushes(tmp_path):
    """``retrofit.run(dict)`` of a ``task: embedding`` recipe: the long-document evaluation against the original
    encoder, the native export (a plain BERT that sentence-transformers loads reading past the old table), and
    what ``push`` would upload (a dry run: the sentence-transformers module files with the model)."""
    st = pytest.importorskip("sentence_transformers")
    from retrofit.publishing.hub import push

    from ..training.test_masked_lm import bert_folder

    recipe = {
        "task": "embedding",
        "model": {"name_or_path": str(bert_folder(tmp_path / "mlm"))},
        "convert": {"scheme": "extend", "options": {"length": "2x"}},
        "data": {"dataset": "longdoc:passkey", "block_length": 128, "min_block_length": 64},
        "train": {"method": "full", "steps": 2, "batch_size": 4},
        "output_dir": str(tmp_path / "run"),
    }
    run = retrofit.run(recipe)
    report = json.loads((run / "eval" / "report.json").read_text())
    assert report["task"] == "longdoc:passkey" and report["task_kind"] == "embedding"
    assert {r["read"] for r in report["rows"] if r["role"] == "baseline"} == {
        "whole",
        "truncated",
        "chunk-mean",
        "best-chunk",
    }
    model = st.SentenceTransformer(str(run / "export"), device="cpu")  # plain BERT, 128 positions
    assert model.max_seq_length == 128 and model.encode(["word " * 100]).shape == (1, 64)  # past the native 64
    uploaded = {path for path, _ in push(run, "user/emb", dry_run=True)["files"]}
    assert {"modules.json", "1_Pooling/config.json", "model.safetensors", "README.md"} <= uploaded
    card = (run / "README.md").read_text()  # its task's objective, and loaded with its pooling
    assert "library_name: sentence-transformers" in card and f'SentenceTransformer("{run / "export"}")' in card
    assert "(contrastive embedding objective" in card and "lm objective" not in card
