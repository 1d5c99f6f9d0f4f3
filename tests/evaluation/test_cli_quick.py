"""`retrofit eval` says what it will cost before it starts, and `--quick` is the lighter preset (issue 44,
item 10); the report opens with its verdict."""

import json

import pytest

pytestmark = pytest.mark.slow  # a conversion and a full evaluation: outside `pytest -m "not slow"`


def test_quick_eval_says_its_cost_first_and_opens_with_a_verdict(tmp_path, user_env, in_process):
    r = in_process(["retrofit", "convert", "tiny-gpt2", "--to", "alibi", "--out", "ck"], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = in_process(["retrofit", "eval", "ck", "--quick", "--baseline", "tiny-gpt2", "--no-plots"], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-3000:]
    cost = r.stderr.index("cost: ")
    line = r.stderr[cost:].splitlines()[0]
    assert "tokens through the models" in line and "retrofit eval --quick" not in line  # quick already: no advice
    report = json.loads((tmp_path / "ck" / "eval" / "report.json").read_text())
    assert report["settings"]["lengths"] == [64, 128, 256] and report["data"]["budget"] == 8192
    assert report["settings"]["copy"]["trials"] == 4 and report["settings"]["copy"]["distances"] == [16, 64, 128, 256]
    assert {g["against"] for g in report["far_context"]} == {"own native window", "tiny-gpt2 sliding window"}
    assert [v["length"] for v in report["verdict"]["models"]] == [256]
    md = (tmp_path / "ck" / "eval" / "report.md").read_text()
    assert md.index("## Verdict") < md.index("## Perplexity vs length") and "## Retrieval at distance" in md
