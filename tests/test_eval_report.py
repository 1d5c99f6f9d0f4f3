"""Report: schema, plots, Markdown, reruns identical, CLI, integration with converted models."""

from __future__ import annotations

import json

import jsonschema
import pytest

import retrofit
from retrofit.evaluation import Report, evaluate
from retrofit.evaluation.report import schema
try:  # tests/ is a package in this repo; also runnable as plain files
    from .test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama
except ImportError:
    from test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama


def _run(out=None, **kw):
    opts = dict(data=docs(), baselines=[("gpt2-32", tiny_gpt2(n_positions=32), byte_tokenizer())],
                tokenizer=byte_tokenizer(), budget=256, stride=8, position_buckets=8, passkey=True,
                passkey_lengths=[270], passkey_depths=[0.0, 1.0], passkey_trials=2, seed=5, progress=False)
    opts.update(kw)
    return evaluate(("llama", tiny_llama(), byte_tokenizer()), [32, 64], out=out, **opts)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    return _run(out), out


def test_report_json_validates_and_has_rows(saved):
    report, out = saved
    data = json.loads((out / "report.json").read_text())
    jsonschema.validate(data, schema())
    assert data["schema_version"] == "1.0"
    assert data["environment"]["torch"] and data["environment"]["hardware"]["device"] == "cpu"
    assert len(data["data"]["fingerprint"]) == 16 and data["seeds"] == {"passkey": 5}
    for row in data["rows"]:
        assert {"model", "role", "length", "method", "ppl", "tokens"} <= set(row)
        assert row["tokens"] == data["data"]["tokens"] == 256
    by = {(r["model"], r["length"], r["method"]): r for r in data["rows"]}
    assert by[("llama", 64, "non-overlapping")]["role"] == "original"  # evaluated as it came: not converted
    # the learned-absolute baseline never runs 64 plainly: only a labelled sliding row
    assert ("gpt2-32", 64, "non-overlapping") not in by
    slid = by[("gpt2-32", 64, "sliding")]
    assert slid["window"] == 32 and slid["stride"] == 8 and "not run plainly" in slid["note"]
    assert by[("gpt2-32", 32, "sliding")]["note"] is None
    assert Report.load(out).rows == report.rows


def test_plots_and_markdown_written(saved):
    _, out = saved
    for name in ("ppl_vs_length.png", "loss_by_position.png", "passkey.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "| `gpt2-32` | baseline | sliding |" in md and "## Passkey retrieval" in md and "not run" in md


def test_rerun_is_identical(saved):
    report, _ = saved
    again = _run()
    assert again.comparable() == report.comparable()
    assert json.dumps(again.comparable(), sort_keys=True) == json.dumps(report.comparable(), sort_keys=True)
    assert set(report.data) - set(report.comparable()) == {"cost", "timing", "plots"}


def test_schema_rejects_a_broken_report(saved):
    report, _ = saved
    bad = json.loads(json.dumps(report.data))
    bad["rows"][0]["method"] = "overlapping"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema())


def test_converted_model_runs_past_native_length_against_its_base():
    base = tiny_gpt2(n_positions=32)
    conv = retrofit.convert(tiny_gpt2(n_positions=32), "alibi")
    report = evaluate(("gpt2-alibi", conv, byte_tokenizer()), [32, 64], data=docs(),
                      baselines=[("gpt2", base, byte_tokenizer())], budget=128, stride=16, sliding=False, progress=False)
    methods = {(r["model"], r["length"]): r["method"] for r in report.rows}
    assert methods == {("gpt2-alibi", 32): "non-overlapping", ("gpt2-alibi", 64): "non-overlapping",
                       ("gpt2", 32): "non-overlapping", ("gpt2", 64): "sliding"}
    notes = {(r["model"], r["length"]): r["note"] for r in report.rows}
    assert notes[("gpt2-alibi", 32)] is None and notes[("gpt2-alibi", 64)] == "past the native length 32"
    assert "not run plainly" in notes[("gpt2", 64)]
    m = report["models"][0]
    assert m["scheme"] == "alibi" and m["converted"] and m["max_length"] is None
    assert report.rows[0]["attention_path"] not in (None, "sdpa", "eager")  # retrofit's kernel ran


def test_cli_eval(tmp_path, capsys):
    """retrofit.save -> `retrofit eval CHECKPOINT --baseline BASE`: the checkpoint is re-patched on load."""
    from retrofit.cli import main

    model_dir, base_dir = tmp_path / "model", tmp_path / "base"
    base = tiny_gpt2(n_positions=32)
    base.save_pretrained(base_dir)
    byte_tokenizer().save_pretrained(base_dir)
    retrofit.save(retrofit.convert(tiny_gpt2(n_positions=32), "alibi"), model_dir, tokenizer=byte_tokenizer())
    text = tmp_path / "held.txt"
    text.write_text("".join(doc.text for doc in docs()))
    rc = main(["eval", str(model_dir), "--lengths", "32,64", "--data", str(text), "--baseline", str(base_dir),
               "--budget", "128", "--stride", "16", "--no-sliding", "--no-plots", "--no-progress"])
    assert rc == 0
    report = Report.load(model_dir / "eval")
    methods = {(r["model"], r["length"]): r["method"] for r in report.rows}
    assert methods == {(str(model_dir), 32): "non-overlapping", (str(model_dir), 64): "non-overlapping",
                       (str(base_dir), 32): "non-overlapping", (str(base_dir), 64): "sliding"}
    assert report["models"][0]["scheme"] == "alibi" and report["models"][1]["max_length"] == 32
    assert "| model | role | method | 32 | 64 |" in capsys.readouterr().out
    rc = main(["eval", str(model_dir), "--lengths", "32,100000", "--data", str(text), "--out", str(tmp_path / "x")])
    assert rc == 2 and "larger than the available text" in capsys.readouterr().err
    rc = main(["eval", str(base_dir), "--lengths", "32,64", "--data", str(text), "--out", str(tmp_path / "y")])
    assert rc == 2 and "at most 32" in capsys.readouterr().err  # the evaluated model must support every length


def test_a_footnote_is_said_once_for_all_its_lengths():
    """A baseline past its table at several lengths: one footnote, not one per length (issue 17)."""
    from retrofit.evaluation.markdown import render_markdown

    conv = retrofit.convert(tiny_gpt2(n_positions=32), "alibi")
    report = evaluate(("gpt2-alibi", conv, byte_tokenizer()), [32, 64, 128], data=docs(),
                      baselines=[("gpt2", tiny_gpt2(n_positions=32), byte_tokenizer())], budget=128, stride=16,
                      sliding=False, progress=False)
    md = render_markdown(report)
    assert md.count("accepts at most 32 tokens") == 1 and md.count("\\* ") == 1, md
    assert "past the native length" not in md  # a note of unstarred (non-overlapping) rows
