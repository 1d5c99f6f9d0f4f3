"""research/smollm2_far.py's targets table (#68): each fine-tuned cell against the issue's targets and SelfExtend."""

from __future__ import annotations

import smollm2_far


def _row(method, gains, reach=16384, ppl=(10.0, 5.0), fine_tune=True):
    copy = [{"distance": d, "copy_gain": g} for d, g in zip((4096, 12288, 24576), gains)]
    return {
        "method": method,
        "copy": copy,
        "effective_reach": {"reach": reach, "native": 8192},
        "ppl_1x_other_domains": dict(zip(("pydoc prose", "stdlib code"), ppl)),
        "fine_tune": {"fine_tune_tokens": 1} if fine_tune else None,
    }


def _record(*cells):
    base = _row("as is", (0.0, 0.0, 0.0), reach=0, fine_tune=False)
    ref = _row("self_extend x4", (2.0, 1.5, 1.0), fine_tune=False)
    return {"rows": [base, ref, *cells]}


def test_a_cell_stronger_past_native_everywhere_is_said_so_and_a_weaker_one_by_how_much():
    strong = _row("strong", (0.1, 1.6, 1.2), reach=30720, ppl=(10.1, 5.05))
    weak = _row("weak", (3.0, 1.4, 0.2), ppl=(11.0, 5.0))  # ahead at 0.5x (not past native), short at 3x by 0.8
    table = smollm2_far.targets(_record(strong, weak))
    assert "| strong | 3.75x: met | 1.010x: met | at least as strong at every distance past native |" in table
    assert "| weak | 2x: not met | 1.100x: not met | short by up to 0.80 nats a token (at 3x) |" in table
    assert "self_extend" not in table and "as is" not in table  # only fine-tuned cells are held to the targets


def test_without_selfextend_in_the_record_the_table_says_so():
    data = _record(_row("cell", (1.0, 1.0, 1.0)))
    data["rows"] = [r for r in data["rows"] if r["method"] != "self_extend x4"]
    assert "SelfExtend x4 not measured" in smollm2_far.targets(data)


def test_the_fine_tune_seconds_are_written_while_it_runs_and_a_failure_raises(tmp_path, monkeypatch):
    import json
    import subprocess
    import sys

    monkeypatch.setattr(smollm2_far, "recipe", lambda cell, args: {"output_dir": str(tmp_path / "cell")})
    real = subprocess.Popen
    code = {"run": "import time; time.sleep(2.5)"}
    monkeypatch.setattr(smollm2_far.subprocess, "Popen", lambda cmd: real([sys.executable, "-c", code["run"]]))
    final, seconds = smollm2_far.finetune("cell", None)
    assert final == tmp_path / "cell" / "final" and 2.5 <= seconds < 30
    assert json.loads((tmp_path / "cell" / "seconds.json").read_text())["seconds"] == seconds
    code["run"] = "raise SystemExit(3)"
    try:
        smollm2_far.finetune("cell", None)
    except subprocess.CalledProcessError as err:
        assert err.returncode == 3
    else:
        raise AssertionError("a failed fine-tune must raise")
    assert json.loads((tmp_path / "cell" / "seconds.json").read_text())["seconds"] >= seconds  # counts add up


def test_the_prose_sequence_reads_its_own_documents_and_keeps_its_own_cache():
    import argparse
    from pydoc_data.topics import topics

    import reach

    ap = argparse.ArgumentParser()
    reach.sequence_options(ap, cache="c")
    shakespeare, prose = ap.parse_args([]), ap.parse_args(["--text", "prose"])
    assert reach.original_window_cache(shakespeare) != reach.original_window_cache(prose)
    assert "prose" not in reach.original_window_cache(shakespeare).name  # the Shakespeare caches stay valid
    docs = reach.TEXTS["prose"][0]()
    assert len(docs) == len(topics) and docs[0].text == topics[sorted(topics)[0]]
