"""Report: schema, plots, Markdown, reruns identical, CLI, integration with converted models."""

from __future__ import annotations

import json

import jsonschema
import pytest

import retrofit
from retrofit.evaluation import Report, evaluate
from retrofit.evaluation.report import schema

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

try:  # tests/ is a package in this repo; also runnable as plain files
    from .test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama
except ImportError:
    from test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama


def _run(out=None, **kw):
    opts = dict(
        data=docs(),
        baselines=[("gpt2-32", tiny_gpt2(n_positions=32), byte_tokenizer())],
        tokenizer=byte_tokenizer(),
        budget=256,
        stride=8,
        position_buckets=8,
        passkey=True,
        passkey_lengths=[270],
        passkey_depths=[0.0, 1.0],
        passkey_trials=2,
        seed=5,
        progress=False,
    )
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
    assert len(data["data"]["fingerprint"]) == 16 and data["seeds"] == {"passkey": 5, "copy": 5}
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


# --- the plots a user opens: nothing cut off, nothing hidden, plain labels -----------------------------


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _assert_nothing_past_the_edge(fig):
    """Every drawn title, label, tick label and legend lies inside the figure (before any tight
    cropping at save): the figure's tight box, the union of what is drawn, is within its canvas."""
    renderer = _drawn(fig)
    box = fig.bbox
    drawn = [fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)]
    drawn += [a.get_tightbbox(renderer) for a in fig.axes] + [lg.get_window_extent(renderer) for lg in fig.legends]
    for e in drawn:
        assert e.x0 >= box.x0 - 1 and e.y0 >= box.y0 - 1 and e.x1 <= box.x1 + 1 and e.y1 <= box.y1 + 1, (e, box)


def _assert_legends_outside_the_axes(fig):
    renderer = _drawn(fig)
    assert fig.legends
    for legend in fig.legends:
        for ax in fig.axes:
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def _labelled_lines(ax):
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def _assert_styles_unique(ax):
    from matplotlib.colors import to_rgba

    lines = _labelled_lines(ax)
    styles = [(to_rgba(ln.get_color()), ln.get_linestyle(), ln.get_marker()) for ln in lines]
    assert len(set(styles)) == len(styles), styles
    pairs = [(c, ls) for c, ls, _ in styles]
    assert len(set(pairs)) == len(pairs), pairs


def test_a_models_native_window_series_looks_unlike_its_other_series(saved):
    """A fine-tuned model's non-overlapping and native-window series differ in line style and marker, not
    only in the legend (they once shared colour, marker and line)."""
    import copy

    import matplotlib.pyplot as plt

    from retrofit.evaluation.plots import ppl_figure

    report, _ = saved
    data = copy.deepcopy(report.data)
    model = next(r["model"] for r in data["rows"] if r["method"] == "non-overlapping" and r["model"] != "gpt2-32")
    mine = [r for r in data["rows"] if r["model"] == model and r["method"] == "non-overlapping"]
    data["rows"] += [{**r, "method": "native-window", "ppl": r["ppl"] * 1.01} for r in mine]
    fig = ppl_figure(Report(data))
    try:
        lines = {ln.get_label(): ln for ln in _labelled_lines(fig.axes[0])}
        a, b = lines[f"{model} (non-overlapping)"], lines[f"{model} (native-window)"]
        assert a.get_linestyle() != b.get_linestyle() and a.get_marker() != b.get_marker()
        _assert_styles_unique(fig.axes[0])
    finally:
        plt.close(fig)


def test_ppl_plot_is_readable(saved):
    import matplotlib.pyplot as plt

    from retrofit.evaluation.plots import ppl_figure

    report, _ = saved
    fig = ppl_figure(report)
    try:
        _assert_nothing_past_the_edge(fig)
        _assert_legends_outside_the_axes(fig)
        ax = fig.axes[0]
        assert ax.get_yscale() == "log"
        labels = [t.get_text() for t in ax.get_yticklabels(which="both") + ax.get_xticklabels(which="both")]
        assert [x for x in labels if x]  # plain numbers, never 1.05×10² or 2⁶
        assert not any("10^" in x or "\\times" in x or "×" in x or "$" in x for x in labels), labels
        _assert_styles_unique(ax)
        # the original's single non-overlapping point: plotted, inside the axes, above every other series
        [single] = [c for c in ax.containers if c.get_label() == "gpt2-32 (non-overlapping)"]
        point = single.lines[0]
        [(x, y)] = point.get_xydata()
        row = next(r for r in report.rows if r["model"] == "gpt2-32" and r["method"] == "non-overlapping")
        assert (x, y) == (row["length"], pytest.approx(row["ppl"]))
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert x0 < x < x1 and y0 < y < y1
        others = [ln for ln in ax.get_lines() if ln is not point]
        assert point.get_zorder() > max(ln.get_zorder() for ln in others)
        assert point.get_markersize() > max(ln.get_markersize() for ln in _labelled_lines(ax))
        assert "gpt2-32 (non-overlapping)" in [t.get_text() for t in fig.legends[0].get_texts()]
    finally:
        plt.close(fig)


def test_loss_by_position_plot_tells_eleven_lines_apart(saved):
    import copy

    import matplotlib.pyplot as plt

    from retrofit.evaluation import Report
    from retrofit.evaluation.plots import positions_figure

    report, _ = saved
    # a run like the quickstart's: three models, five lengths each for two of them (11 lines)
    entries = report["loss_by_position"]
    many = Report(copy.deepcopy(report.data))
    many.data["loss_by_position"] = [
        dict(entries[i % len(entries)], model=name, length=L)
        for i, (name, lengths) in enumerate(
            [
                ("base + alibi (fine-tuned)", [128, 256, 512, 1024, 2048]),
                ("base (original)", [128]),
                ("base + alibi (not fine-tuned)", [128, 256, 512, 1024, 2048]),
            ]
        )
        for L in lengths
    ]
    assert len(many["loss_by_position"]) == 11
    for rep, n in ((report, len(entries)), (many, 11)):
        fig = positions_figure(rep)
        try:
            _assert_nothing_past_the_edge(fig)
            _assert_legends_outside_the_axes(fig)
            ax = fig.axes[0]
            assert len(_labelled_lines(ax)) == n
            _assert_styles_unique(ax)
            texts = [t.get_text() for t in fig.legends[0].get_texts()]
            assert {e["model"] for e in rep["loss_by_position"]} <= {t.replace("\n", " ") for t in texts}
        finally:
            plt.close(fig)


def test_passkey_plot_has_full_titles_and_a_not_run_legend(saved):
    import matplotlib.pyplot as plt

    from retrofit.evaluation import Report
    from retrofit.evaluation.plots import NOT_RUN_COLOR, passkey_figure

    report, _ = saved
    long = Report(json.loads(json.dumps(report.data)))
    for r in long["passkey"]:  # names like the pipeline's, longer than a panel is wide
        r["model"] = f"baseline:quickstart + alibi {r['model']} (not fine-tuned)"
    for rep in (report, long):
        fig = passkey_figure(rep)
        try:
            _assert_nothing_past_the_edge(fig)
            _assert_legends_outside_the_axes(fig)
            renderer = _drawn(fig)
            panels = [ax for ax in fig.axes if ax.get_title()]
            models = list(dict.fromkeys(r["model"] for r in rep["passkey"]))
            assert [ax.get_title().replace("\n", " ") for ax in panels] == models  # whole names, never cut
            boxes = [ax.get_tightbbox(renderer) for ax in panels]  # panels, labels included, do not overlap
            assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
            assert any(r["accuracy"] is None for r in rep["passkey"])
            [legend] = fig.legends
            assert [t.get_text() for t in legend.get_texts()][0].startswith("not run")
            from matplotlib.colors import to_rgba

            assert to_rgba(legend.legend_handles[0].get_facecolor()) == to_rgba(NOT_RUN_COLOR)
        finally:
            plt.close(fig)


def test_plots_are_written_atomically(saved, tmp_path, monkeypatch):
    """A plot that fails half-way leaves the old PNG and no temporary file."""
    from retrofit.evaluation import plots

    report, out = saved
    old = (out / "ppl_vs_length.png").read_bytes()
    target = tmp_path / "ppl_vs_length.png"
    target.write_bytes(old)

    def broken(self, fname, **kw):
        open(fname, "wb").write(b"half")
        raise RuntimeError("killed")

    monkeypatch.setattr(plots.plt.Figure, "savefig", broken)
    with pytest.raises(RuntimeError):
        plots.plot_ppl(report, target)
    assert target.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == [target.name]


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
    report = evaluate(
        ("gpt2-alibi", conv, byte_tokenizer()),
        [32, 64],
        data=docs(),
        baselines=[("gpt2", base, byte_tokenizer())],
        budget=128,
        stride=16,
        sliding=False,
        progress=False,
    )
    methods = {(r["model"], r["length"]): r["method"] for r in report.rows if r["method"] != "native-window"}
    assert methods == {
        ("gpt2-alibi", 32): "non-overlapping",
        ("gpt2-alibi", 64): "non-overlapping",
        ("gpt2", 32): "non-overlapping",
        ("gpt2", 64): "sliding",
    }
    # the far-context gain's other side: the converted model through its native window, past native only
    assert [(r["model"], r["length"], r["window"]) for r in report.rows if r["method"] == "native-window"] == [
        ("gpt2-alibi", 64, 32)
    ]
    notes = {(r["model"], r["length"]): r["note"] for r in report.rows if r["method"] != "native-window"}
    assert notes[("gpt2-alibi", 32)] is None and notes[("gpt2-alibi", 64)] == "past the native length 32"
    assert "not run plainly" in notes[("gpt2", 64)]
    m = report["models"][0]
    assert m["scheme"] == "alibi" and m["converted"] and m["max_length"] is None
    assert report.rows[0]["kernel"] not in (None, "sdpa", "eager")  # retrofit's kernel ran


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
    rc = main(
        [
            "eval",
            str(model_dir),
            "--lengths",
            "32,64",
            "--data",
            str(text),
            "--baseline",
            str(base_dir),
            "--budget",
            "128",
            "--stride",
            "16",
            "--no-sliding",
            "--no-plots",
            "--no-progress",
        ]
    )
    assert rc == 0
    report = Report.load(model_dir / "eval")
    methods = {(r["model"], r["length"]): r["method"] for r in report.rows if r["method"] != "native-window"}
    assert methods == {
        (str(model_dir), 32): "non-overlapping",
        (str(model_dir), 64): "non-overlapping",
        (str(base_dir), 32): "non-overlapping",
        (str(base_dir), 64): "sliding",
    }
    assert report["models"][0]["scheme"] == "alibi" and report["models"][1]["max_length"] == 32
    assert "| model | role | method | 32 (1x) | 64 (2x) † |" in capsys.readouterr().out
    rc = main(["eval", str(model_dir), "--lengths", "32,100000", "--data", str(text), "--out", str(tmp_path / "x")])
    assert rc == 2 and "larger than the available text" in capsys.readouterr().err
    rc = main(["eval", str(base_dir), "--lengths", "32,64", "--data", str(text), "--out", str(tmp_path / "y")])
    assert rc == 2 and "at most 32" in capsys.readouterr().err  # the evaluated model must support every length


def test_a_footnote_is_said_once_for_all_its_lengths():
    """A baseline past its table at several lengths: one footnote, not one per length (issue 17)."""
    from retrofit.evaluation.markdown import render_markdown

    conv = retrofit.convert(tiny_gpt2(n_positions=32), "alibi")
    report = evaluate(
        ("gpt2-alibi", conv, byte_tokenizer()),
        [32, 64, 128],
        data=docs(),
        baselines=[("gpt2", tiny_gpt2(n_positions=32), byte_tokenizer())],
        budget=128,
        stride=16,
        sliding=False,
        progress=False,
    )
    md = render_markdown(report)
    assert md.count("accepts at most 32 tokens") == 1 and md.count("\\* ") == 1, md
    assert "past the native length 32" not in md  # a note of unstarred (non-overlapping) rows
