"""Recall: an induction oracle scores 100%, a random model ~0; the Wilson interval; same inputs, same
report; `retrofit eval --recall-*` writes the section to report.json and report.md."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from tqdm import tqdm

import retrofit
from retrofit.evaluation import evaluate, passkey, recall
from retrofit.evaluation.models import EvalModel
from retrofit.evaluation.options import eval_options
from retrofit.evaluation.recall import run as run_recall
from retrofit.foundation.errors import OptionError


def _recall(trials, span, cue, seed):
    return eval_options(recall_trials=trials, recall_span=span, recall_cue=cue, seed=seed)


pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

try:  # tests/ is a package in this repo; also runnable as plain files
    from ..tiny import TINY
    from .test_eval_common import TEXT, byte_tokenizer, docs, tiny_gpt2, tiny_llama
except ImportError:
    from test_eval_common import TEXT, byte_tokenizer, docs, tiny_gpt2, tiny_llama
    from tiny import TINY


class InductionOracle(torch.nn.Module):
    """At every position t: all mass on the token that followed the longest earlier match of the
    sequence's suffix ending at t (an ideal induction head); logits for every position, as a causal LM."""

    def __init__(self, vocab: int = 260):
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **kw):
        s = input_ids[0]
        T = s.numel()
        eq = s[:, None] == s[None, :]  # [i, t]
        match = torch.zeros(T, T, dtype=torch.long)  # common suffix length of s[..i] and s[..t]
        match[:, 0] = eq[:, 0]
        for t in range(1, T):
            match[1:, t] = eq[1:, t] * (match[:-1, t - 1] + 1)
            match[0, t] = eq[0, t]
        idx = torch.arange(T)
        score = torch.where(idx[:, None] < idx[None, :], match * T + idx[:, None], -1)  # only i < t; ties: latest
        best = score.max(0)  # a real match scores >= T
        nxt = torch.where(best.values >= T, s[(best.indices + 1).clamp(max=T - 1)], 0)
        logits = torch.full((1, T, self.vocab), -1e4)
        logits[0, idx, nxt] = 0.0
        return SimpleNamespace(logits=logits)


def _ascii_ids(tok, n: int = 4000) -> list[int]:
    """Natural text in byte ids < 128 (no EOS), enough for every length below."""
    return tok((TEXT * 40)[:n], add_special_tokens=False)["input_ids"]


def test_build_places_the_span_and_repeats_its_cue():
    text = list(range(100, 400))
    span = [7, 8, 9, 10, 11, 12]
    for depth in (0.0, 0.5, 1.0):
        p = recall.build(text, 64, depth, span, 5, recall.Layout(cue=2, prefix=(1,)))
        n = 64 - 1 - 12  # filler tokens
        assert len(p.ids) == 64 and p.ids[0] == 1
        assert p.ids[p.span_index : p.span_index + 6] == span and p.span_index == 1 + round(depth * n)
        assert p.ids[-6:] == span and p.continuation_start == 64 - 4
        assert [t for t in p.ids[1:] if t >= 100] == text[5 : 5 + n]  # the filler is the text, in order
    with pytest.raises(ValueError):
        recall.build(text, 11, 0.5, span, 0, recall.Layout(cue=2))  # no room for the span twice
    with pytest.raises(ValueError):
        recall.build(text, 64, 0.5, span, 0, recall.Layout(cue=6))  # nothing left to recall


def test_induction_oracle_scores_100_percent_and_lengths_past_a_limit_are_not_run():
    tok = byte_tokenizer()
    text = _ascii_ids(tok)
    m = EvalModel("oracle", "converted", InductionOracle(), tok, {"max_length": None})
    capped = EvalModel("capped", "baseline", InductionOracle(), tok, {"max_length": 100})
    with tqdm(disable=True) as bar:
        results = run_recall([m, capped], text, [64, 256], [0.0, 0.5, 1.0], _recall(5, 12, 4, 3), bar)
    mine = [r for r in results if r["model"] == "oracle"]
    assert len(mine) == 6
    assert all(r["accuracy"] == 1.0 and r["token_accuracy"] == 1.0 and r["mean_logprob"] == 0.0 for r in mine)
    assert all((r["ci_low"], r["ci_high"]) == (round(passkey.wilson(5, 5)[0], 4), 1.0) for r in mine)
    assert all(s["tokens_right"] == 8 for r in mine for s in r["scores"])
    past = [r for r in results if r["model"] == "capped" and r["length"] == 256]
    assert len(past) == 3 and all(r["accuracy"] is None and "not run" in r["note"] for r in past)
    within = [r for r in results if r["model"] == "capped" and r["length"] == 64]
    assert [r["scores"] for r in within] == [r["scores"] for r in mine if r["length"] == 64]


def test_a_random_model_scores_near_zero():
    tok = byte_tokenizer()
    torch.manual_seed(0)
    model = TINY["gpt2"]()  # vocab 128, native 32: byte ids of ASCII text fit
    m = EvalModel("random", "converted", model, tok, {"max_length": 32})
    with tqdm(disable=True) as bar:
        [r] = run_recall([m], _ascii_ids(tok), [32], [0.5], _recall(10, 12, 4, 0), bar)
    assert r["trials"] == 10 and r["correct"] == 0 and r["accuracy"] == 0.0
    assert r["token_accuracy"] < 0.2
    assert r["mean_logprob"] < math.log(0.5)  # far from sure of the right tokens
    assert (r["ci_low"], r["ci_high"]) == (0.0, round(passkey.wilson(0, 10)[1], 4))


def test_wilson_interval_by_hand():
    # 9 of 10 at z = 1.96, by hand: p = 0.9, z^2 = 3.8416, denominator 1 + 3.8416/10 = 1.38416,
    # centre (0.9 + 3.8416/20) / 1.38416 = 0.78898, half 1.96 * sqrt(0.009 + 0.009604) / 1.38416 = 0.19314
    low, high = passkey.wilson(9, 10)
    assert (low, high) == pytest.approx((0.78898 - 0.19314, 0.78898 + 0.19314), abs=1e-4)
    assert (low, high) == pytest.approx((0.5958, 0.9821), abs=1e-4)


def _evaluate(**kw):
    opts = dict(
        data=docs(),
        tokenizer=byte_tokenizer(),
        budget=256,
        sliding=False,
        recall=True,
        recall_lengths=[64, 128],
        recall_depths=[0.0, 1.0],
        recall_trials=3,
        seed=11,
        progress=False,
    )
    opts.update(kw)
    return evaluate(("llama", tiny_llama(), byte_tokenizer()), [64], **opts)


def test_same_inputs_same_report_and_paired_trials():
    a, b = _evaluate(), _evaluate()
    assert a.comparable() == b.comparable()
    a.validate()
    assert a["settings"]["recall"] == {
        "lengths": [64, 128],
        "depths": [0.0, 1.0],
        "trials": 3,
        "span": 12,
        "cue": 4,
        "text_tokens": a["settings"]["recall"]["text_tokens"],
        "scoring": "teacher-forced argmax (one forward per trial)",
    }
    assert a["seeds"]["recall"] == 11 and len(a["recall"]) == 4
    assert all(-30 < r["mean_logprob"] < 0 and 0 <= r["token_accuracy"] <= 1 for r in a["recall"])
    c = _evaluate(seed=12)
    assert [r["scores"] for r in c["recall"]] != [r["scores"] for r in a["recall"]]  # the seed matters
    text = byte_tokenizer()("".join(d.text for d in docs()), add_special_tokens=False)["input_ids"]
    spans = recall.make_spans(11, 3, 12, recall.token_pool(text, byte_tokenizer()))
    assert (
        len({tuple(s) for s in spans}) == 3
        and recall.make_spans(11, 3, 12, recall.token_pool(text, byte_tokenizer())) == spans
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"recall_cue": 12}, "smaller than recall_span"),
        ({"recall_depths": [1.5]}, "recall depths"),
        ({"recall_trials": 0}, "recall_trials"),
    ],
)
def test_bad_recall_options_are_clear_errors(kw, match):
    with pytest.raises(OptionError, match=match):
        _evaluate(**kw)


def test_cli_eval_with_recall_flags(tmp_path, capsys):
    """retrofit.save -> `retrofit eval CHECKPOINT --recall-lengths ...` (the flags turn recall on)."""
    from retrofit.cli import main

    model_dir = tmp_path / "model"
    retrofit.save(retrofit.convert(tiny_gpt2(n_positions=32), "alibi"), model_dir, tokenizer=byte_tokenizer())
    text = tmp_path / "held.txt"
    text.write_text("".join(doc.text for doc in docs()))
    rc_ = main(
        [
            "eval",
            str(model_dir),
            "--lengths",
            "32,64",
            "--data",
            str(text),
            "--budget",
            "128",
            "--no-sliding",
            "--recall-lengths",
            "1x,2x",
            "--recall-depths",
            "0,0.5",
            "--recall-trials",
            "2",
            "--recall-span",
            "8",
            "--recall-cue",
            "3",
            "--no-progress",
        ]
    )
    assert rc_ == 0
    report = json.loads((model_dir / "eval" / "report.json").read_text())
    s = report["settings"]["recall"]
    assert (s["lengths"], s["depths"], s["trials"], s["span"], s["cue"]) == ([32, 64], [0.0, 0.5], 2, 8, 3)
    assert [(r["length"], r["depth"], r["trials"]) for r in report["recall"]] == [
        (32, 0.0, 2),
        (32, 0.5, 2),
        (64, 0.0, 2),
        (64, 0.5, 2),
    ]
    assert "recall.png" in report["plots"] and (model_dir / "eval" / "recall.png").is_file()
    md = (model_dir / "eval" / "report.md").read_text()
    assert "## Recall" in md and "| model | length | depth 0 | depth 0.5 |" in md and "![recall](recall.png)" in md
    assert "## Passkey" not in md and report["passkey"] is None
    rc_ = main(
        [
            "eval",
            str(model_dir),
            "--lengths",
            "32",
            "--data",
            str(text),
            "--budget",
            "128",
            "--no-sliding",
            "--recall",
            "--recall-span",
            "20",
            "--no-plots",
            "--no-progress",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert rc_ == 2 and "too short" in capsys.readouterr().err  # 2 x 20 tokens do not fit in 32


def test_recipe_eval_section_takes_recall_with_the_cli_defaults():
    from retrofit.evaluation.options import DEFAULTS as D
    from retrofit.foundation.errors import RecipeError
    from retrofit.pipeline.recipe import load_recipe

    rr = load_recipe("recipes/tiny-run.yaml", ["eval.recall=true", "eval.recall_lengths=1x,4x"])
    e = rr.eval
    assert e.recall and e.recall_lengths == ["1x", "4x"]
    assert (tuple(e.recall_depths), e.recall_trials, e.recall_span, e.recall_cue) == (
        tuple(D.recall_depths),
        D.recall_trials,
        D.recall_span,
        D.recall_cue,
    )
    off = load_recipe("recipes/tiny-run.yaml", ["eval.recall_trials=7"])
    assert off.stage_hash("eval") == load_recipe("recipes/tiny-run.yaml").stage_hash("eval")  # recall off: not hashed
    assert rr.stage_hash("eval") != off.stage_hash("eval")
    for bad, key in (
        ("eval.recall_cue=12", "recall_cue"),
        ("eval.recall_depths=[2]", "recall_depths"),
        ("eval.recall_trials=0", "recall_trials"),
    ):
        with pytest.raises(RecipeError, match=key):
            load_recipe("recipes/tiny-run.yaml", [bad])
