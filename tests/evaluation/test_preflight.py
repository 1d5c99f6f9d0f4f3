"""evaluation/preflight.py: what a local model's config.json rules out is said before its weights load (the same
errors the measures raise on the loaded model): lengths past a converted checkpoint's limit, a classifier's data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import retrofit
from retrofit.evaluation import preflight, runner
from retrofit.evaluation.options import eval_options
from retrofit.foundation.errors import LengthError, OptionError

ROOT = Path(__file__).resolve().parents[2]
DECODER = next(ROOT.glob("standins/quickstart-*"))  # GPT-2, native 128
CLASSIFIER = ROOT / "standins" / "small-bert-mention-classifier"  # BERT, native 256, 4 classes


@pytest.fixture(scope="module")
def extended(tmp_path_factory) -> dict[str, Path]:
    """The shipped decoder and classifier converted to ``extend`` at 2x native, saved (their limit: 2x native)."""
    out = {}
    for key, src in (("lm", DECODER), ("classifier", CLASSIFIER)):
        model, tok = retrofit.load_model(str(src))
        retrofit.convert(model, "extend", length="2x")
        out[key] = retrofit.save(model, tmp_path_factory.mktemp(key) / "model", tokenizer=tok)
    return out


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails the test: what is checked must come before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(runner, "load_models", refuse)


def test_lengths_past_a_converted_limit_are_said_before_the_weights_load(extended, no_loading):
    lm = str(extended["lm"])
    with pytest.raises(LengthError, match=r"lengths 1024 exceed what .* \(extend: at most 256 tokens\)"):
        retrofit.evaluate(lm, lengths=["8x"])
    with pytest.raises(LengthError, match=r"passkey lengths 512 exceed what .* at most 256 tokens"):
        retrofit.evaluate(lm, lengths=["1x"], passkey=True, passkey_lengths=["4x"])
    with pytest.raises(LengthError, match=r"recall lengths 1024 exceed"):
        retrofit.evaluate(lm, lengths=["1x"], recall=True, recall_lengths=[1024])


def test_lengths_within_the_limit_or_left_to_their_defaults_pass(extended):
    lm = str(extended["lm"])
    preflight.check(lm, eval_options(lengths=["1x", "2x"], passkey=True), default_lengths=False)
    preflight.check(lm, eval_options(), default_lengths=True)  # the defaults (1x-8x) stop at the limit themselves


def test_a_run_folder_is_read_through_its_final_model(extended, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(extended["lm"], run / "final")
    with pytest.raises(LengthError, match="at most 256 tokens"):
        preflight.check(str(run), eval_options(lengths=["8x"]), default_lengths=False)


def test_a_classifier_without_data_or_past_its_table_is_told_before_loading(extended, no_loading):
    classifier = str(extended["classifier"])
    with pytest.raises(OptionError, match="pass --data with one of longdoc:mention"):
        retrofit.evaluate(classifier)
    with pytest.raises(OptionError, match="reads at most 512 tokens; the longest length is 2048"):
        retrofit.evaluate(classifier, lengths=["8x"], data="longdoc:mention")


@pytest.mark.parametrize(
    "model, data, said",
    [
        (CLASSIFIER, "longdoc:needle", "needs an embedding model"),
        (ROOT / "standins" / "small-bert-needle-embedding", "longdoc:mention", "needs a sequence-classification"),
    ],
)
def test_a_longdoc_task_of_the_other_kind_is_refused_from_the_config_before_loading(tmp_path, model, data, said):
    """The rule of who reads a task (``data.longdoc.check_reader``) from config.json: a folder and a run folder."""
    run = tmp_path / "run"
    shutil.copytree(model, run / "final")
    for where in (model, run):
        with pytest.raises(OptionError, match=said):
            preflight.check(where, eval_options(data=data), True)
    preflight.check(CLASSIFIER, eval_options(data="longdoc:mention"), True)  # its own task passes


@pytest.mark.parametrize(
    "record, said",
    [({"text": "the lion", "class": "lion"}, "no field 'label'"), ({"text": "a", "label": "tiger"}, "'tiger'")],
)
def test_records_a_classifier_cannot_score_are_refused_from_their_first_ones_before_loading(tmp_path, record, said):
    """``--data`` records missing the label field, or with a label not one of the classes: the measure's rule
    (``records.check_record``) on the first records and the config's classes, before the model loads."""
    import json

    from retrofit.foundation.errors import DataError

    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"text": "the horse", "label": "horse"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=said):
        preflight.check(CLASSIFIER, eval_options(data=str(path)), True)
    path.write_text(json.dumps({"text": "the horse", "label": "horse"}) + "\n")
    preflight.check(CLASSIFIER, eval_options(data=str(path)), True)  # records of its classes pass
