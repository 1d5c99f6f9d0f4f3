"""Every measure of an evaluation has one interface (``evaluation/measure.py``): the runner drives them alike, a
measure not asked writes its keys as absent, every key a causal LM's measures write is a section of the report, in
the report's order, and a new measure is its module and one line of ``measure.CATALOG``."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from retrofit.evaluation import measure, report, runner
from retrofit.evaluation.options import EvalOptions, eval_options
from retrofit.foundation.errors import OptionError


def _measures():
    return measure.measures()


def test_every_measure_class_in_the_package_is_in_the_table():
    """A measure written but not listed would never run: each Measure subclass in evaluation/ is in the catalog."""
    from retrofit import evaluation

    for info in pkgutil.iter_modules(evaluation.__path__):
        importlib.import_module(f"retrofit.evaluation.{info.name}")
    classes = set()
    todo = [measure.Measure]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("retrofit."):  # not a test's
                classes.add(sub)
            todo.append(sub)
    assert {type(m) for m in _measures()} == classes


@pytest.mark.parametrize("m", _measures(), ids=lambda m: f"{type(m).__name__}")
def test_each_measure_overrides_the_interface(m):
    assert m.name, "its report key"
    for hook in ("asked", "plan", "run"):
        assert getattr(type(m), hook) is not getattr(measure.Measure, hook), f"{type(m).__name__}.{hook}"


def test_the_causal_measures_write_the_report_sections_in_order():
    """Their names (and the perplexity's keys) are the report's sections, in the catalog's order, the cost last."""
    names = [m.name for m in measure.by_task()["causal-lm"]]
    assert names[0] == "perplexity" and set(names[1:]) <= set(report.sections())
    assert [n for n in report.sections() if n in names[1:]] == names[1:]
    assert report.sections() == ("rows", "far_context", "loss_by_position", "passkey", "recall", "copy", "cost")
    assert set(report.sections()) <= set(report.schema()["properties"])


def test_a_measure_not_asked_says_so_before_anything_is_read():
    o = EvalOptions()
    asked = {m.name: m.asked(o) for m in measure.by_task()["causal-lm"]}
    assert asked["passkey"] is None and asked["recall"] is None and asked["copy"]
    for m in measure.by_task()["causal-lm"][1:]:
        assert m.absent() == {m.name: None}


@pytest.mark.parametrize(
    "given, word",
    [
        ({"passkey": True, "passkey_trials": 0}, "passkey_trials"),
        ({"passkey_depths": [1.5]}, "passkey depths"),
        ({"recall": True, "recall_cue": 12, "recall_span": 12}, "recall_cue"),
        ({"recall": True, "recall_depths": [-0.1]}, "recall depths"),
        ({"batch_size": 0}, "batch_size"),
        ({"copy_distances": []}, "copy distances"),
    ],
)
def test_each_measure_checks_its_own_options(given, word):
    o = eval_options(**given)
    with pytest.raises(OptionError, match=word):
        for m in measure.by_task()["causal-lm"]:
            m.asked(o)


@pytest.mark.parametrize(
    "given, error",
    [
        ({"lengths": [128]}, "exceed what"),  # tiny-gpt2's table holds 64 positions
        ({"lengths": [32], "passkey": True}, "passkey length 32 is too short"),
        ({"lengths": [32], "recall": True, "recall_lengths": [16], "recall_span": 12}, "recall length 16"),
        ({"lengths": [64], "copy_distances": [2]}, "copy distance 2 cannot hold"),
    ],
)
def test_what_the_model_rules_out_is_said_before_any_tokens_are_read(monkeypatch, given, error):
    """Each measure's check runs once the model is loaded and before the documents are tokenized."""
    from retrofit.foundation.errors import LengthError

    def tokenize(setup):
        raise AssertionError("tokens read before the measures' checks")

    monkeypatch.setattr(runner, "_stream", tokenize)
    with pytest.raises(LengthError, match=error):
        runner.evaluate("tiny-gpt2", progress=False, **given)


CLASSIFIER = Path(__file__).resolve().parents[2] / "standins" / "small-bert-mention-classifier"


@pytest.fixture
def no_loading(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr(runner, "load_models", load)


@pytest.mark.parametrize(
    "model, given, words",
    [
        (CLASSIFIER, {"passkey": True}, "passkey asked, but the model is a sequence-classification model"),
        (CLASSIFIER, {"recall": True, "passkey": True}, "passkey, recall asked"),
        ("baseline:small-bert", {"recall": True}, "recall asked, but the model is a masked-lm model"),
    ],
)
def test_a_measure_asked_that_the_models_task_has_not_is_an_error_before_loading(no_loading, model, given, words):
    with pytest.raises(OptionError, match=words):
        runner.evaluate(str(model), progress=False, **given)


def test_the_cli_refuses_passkey_on_a_classifier_at_once(no_loading, tmp_path, monkeypatch, capsys):
    from retrofit.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(CLASSIFIER), "--passkey", "--data", "longdoc:mention"]) == 2
    assert "passkey asked, but the model is a sequence-classification model" in capsys.readouterr().err
    assert not (CLASSIFIER / "eval").exists()


@pytest.mark.parametrize("kind", list(measure.by_task()))
def test_the_measures_on_by_default_that_a_task_has_not_are_left_out_without_an_error(kind):
    measures = runner._measures_of(kind, runner._asked(EvalOptions())[1])  # perplexity, copy: on by default
    assert measures == measure.by_task()[kind]


TOY = '''
from retrofit.evaluation.measure import Measure, Planned


class Toy(Measure):
    """A measure as a user adds one: how many tokens every model scored."""

    name = "toy"
    schema = {"toy": {"type": ["object", "null"], "required": ["tokens"]}}

    def asked(self, o):
        return True

    def plan(self, setup, asked):
        return Planned(work=[(setup.lengths[0], 1)], settings={"toy": {"models": len(setup.models)}}, state=True)

    def run(self, setup, planned, bar):
        bar.update(1)
        return {"toy": {"tokens": len(setup.stream.ids)}}

    def markdown(self, report, plots):
        return ["## Toy", "", f"Every model scored {report.data['toy']['tokens']:,} tokens.", ""]


MEASURE = Toy()
'''


def test_a_new_measure_is_its_module_and_one_catalog_line(tmp_path, monkeypatch):
    """A toy measure written as a module and named by one line of ``measure.CATALOG`` runs with a causal LM's
    measures, and its key, settings and section land in report.json (validated by the schema it declares) and
    report.md, after copy and before the cost."""
    import json

    (tmp_path / "toys").mkdir()
    (tmp_path / "toys" / "__init__.py").write_text("")
    (tmp_path / "toys" / "count.py").write_text(TOY)  # a module of the package would be "count:MEASURE"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(measure.CATALOG, "toy", "toys.count:MEASURE")  # the one line
    out = tmp_path / "eval"
    runner.evaluate("tiny-gpt2", [64], budget=512, copy=False, sliding=False, out=out, progress=False)
    data = json.loads((out / "report.json").read_text())
    assert data["toy"]["tokens"] >= 512 and data["settings"]["toy"] == {"models": 1}
    keys = list(data)
    assert keys.index("copy") < keys.index("toy") < keys.index("cost")
    md = (out / "report.md").read_text()
    assert f"## Toy\n\nEvery model scored {data['toy']['tokens']:,} tokens." in md
    assert md.index("## Toy") < md.index("## Cost")
