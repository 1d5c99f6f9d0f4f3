"""The evaluation options exist once (``retrofit.evaluation.options.EvalOptions``): every field is a
``retrofit eval`` flag and a pipeline recipe key, and neither ``evaluate()``, the command line nor the
recipe section has a default of its own."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from retrofit.cli import build_parser
from retrofit.cli import eval as cli_eval
from retrofit.evaluation.options import DEFAULTS, NAMES, EvalOptions
from retrofit.evaluation.runner import LOAD_KEYS, RUN_KEYS, evaluate
from retrofit.foundation.errors import OptionError
from retrofit.pipeline.recipe import EvalSection, load_recipe

NOT_OPTIONS = {
    "help",
    "model",
    "gguf_file",
    "baseline",
    "device",
    "dtype",
    "out",
    "no_plots",
    "no_progress",
    "func",
    "quick",
}


def _eval_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["eval"]


def test_every_option_is_a_flag_with_the_dataclass_default_and_help():
    p = _eval_parser()
    flags = {a.dest: a for a in p._actions}
    assert set(flags) - NOT_OPTIONS == set(NAMES)  # no eval option outside the dataclass
    for f in dataclasses.fields(EvalOptions):
        a = flags[f.name]
        assert a.default is argparse.SUPPRESS, f.name  # an unset flag keeps the dataclass default
        assert cli_eval.flag(f) in a.option_strings and f.metadata["help"] in a.help.replace("%%", "%"), f.name
    args = p.parse_args(["m"])
    assert cli_eval._options(args) == {}  # nothing given: evaluate() reads EvalOptions' defaults
    args = p.parse_args(["m", "--no-sliding", "--buckets", "8", "--recall-span", "20", "--passkey-depths", "0,1"])
    assert cli_eval._options(args) == {
        "sliding": False,
        "position_buckets": 8,
        "recall_span": 20,
        "recall": True,
        "passkey_depths": [0.0, 1.0],
        "passkey": True,  # a measure's flag turns it on
    }


def test_evaluate_has_no_option_default_of_its_own():
    params = inspect.signature(evaluate).parameters
    assert {n for n in params if n in NAMES} == {"lengths", "data"}  # positional conveniences, default None
    assert params["lengths"].default is None and params["data"].default is None
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())  # every other option is a keyword of EvalOptions


def test_an_unknown_keyword_is_an_option_error_naming_every_valid_one_before_anything_loads(monkeypatch):
    from retrofit.evaluation import runner

    monkeypatch.setattr(runner, "load_models", lambda *a, **k: pytest.fail("loaded before the keywords were checked"))
    with pytest.raises(OptionError) as e:
        evaluate("no/such-model", budgett=4096, out="x", progress=False, device="cpu")  # one typo among valid ones
    said = str(e.value)
    assert "'budgett'" in said and "out" not in said.split(";")[0] and "device" not in said.split(";")[0]
    assert all(name in said for name in (*NAMES, *LOAD_KEYS, *RUN_KEYS))


def test_every_option_is_a_recipe_key_with_the_same_default():
    section = {f.name: f for f in dataclasses.fields(EvalSection)}
    assert set(NAMES) <= set(section) and set(section) - set(NAMES) == {"baselines"}
    rr = load_recipe("recipes/tiny-gpt2-alibi-lora.yaml")  # no eval section: every default
    assert {n: getattr(rr.eval, n) for n in NAMES} == dataclasses.asdict(DEFAULTS)
    changed = {
        "budget": 77,
        "position_buckets": 8,
        "sliding": False,
        "doc_separator": "SEP",
        "stride": 3,
        "recall_cue": 2,
        "data": "shakespeare:heldout",
        "lengths": ["1x"],
        "passkey_trials": 2,
        "seed": 4,
    }
    rr = load_recipe("recipes/tiny-gpt2-alibi-lora.yaml", [f"eval.{k}={v}" for k, v in changed.items()])
    assert {k: getattr(rr.eval, k) for k in changed} == changed
