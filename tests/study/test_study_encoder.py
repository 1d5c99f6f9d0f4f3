"""``retrofit study`` on a masked LM, as a user types it: a grid whose recipe names an encoder stand-in that is
not built yet (the study builds it, as ``retrofit run`` does), the cells scored by masked-LM perplexity and bits
per character against the control, and whether each cell reads past its native length. RoBERTa's kind: its
table holds its native length plus the padding offset, and every run (the control's too) is scored at the
native length its adapter reads, not the table's rows."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.slow  # pipeline runs: outside `pytest -m "not slow"`

GRID = {
    "recipe": {
        "model": {"name_or_path": "baseline:micro-roberta"},
        "data": {
            "dataset": "shakespeare:train",
            "max_documents": 2,
            "block_length": 32,
            "validation_fraction": 0.25,
            "max_validation_blocks": 2,
        },
        "train": {"method": "full", "steps": 4, "batch_size": 2, "learning_rate": 1.0e-3, "warmup_steps": 1},
        "eval": {
            "lengths": ["1x", "4x"],
            "data": "shakespeare:heldout",
            "budget": 512,
            "copy_distances": ["0.25x", "1x", "4x"],
            "copy_trials": 2,
        },
    },
    "schemes": {"alibi": []},
    "methods": ["full"],
    "budgets": [0, 4],
    "target": {"long": 4},
}


def test_a_masked_lm_study_builds_its_stand_in_and_reports_bits_per_character(tmp_path, user_env, in_process):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    out = tmp_path / "study"
    r = in_process(["retrofit", "study", str(grid), "--out", str(out)], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pretraining it now" in r.stderr  # the stand-in was not in the user's fresh cache
    report = json.loads((out / "study.json").read_text())
    table = {row["cell"]: row for row in report["table"]}
    assert set(table) == {"original (plain at 1x, sliding beyond)", "alibi-none-0", "control-full-4", "alibi-full-4"}
    # the original cannot run past its table: no as-is row; past 1x it reads through its sliding window
    original = table["original (plain at 1x, sliding beyond)"]
    assert original["bpc@1x"] > 0 and original["bpc@4x"] > 0
    cell = table["alibi-full-4"]
    control = table["control-full-4"]
    assert cell["bpc_vs_control@1x"] == round(cell["bpc@1x"] / control["bpc@1x"], 4)
    assert cell["bpc@4x/1x"] == round(cell["bpc@4x"] / cell["bpc@1x"], 4)
    assert control["bpc@4x"] is None  # the control keeps its table: scored at 1x only
    # BPC is the masked NLL in bits over the characters per token: the same ratio as the NLL, not the perplexity
    rows = {
        (row["length"], row["method"]): row
        for row in next(c for c in report["cells"] if c["name"] == "alibi-full-4")["rows"]
    }
    native = report["native_length"]
    assert native == 32 and control["ppl@1x"] and control["bpc@1x"]  # micro: 32 positions, a table of 35 rows
    assert cell["bpc@1x"] == rows[(native, "non-overlapping")]["bpc"]
    # whether it reads past native: the far-context gain over its own native window, in the causal report's terms
    gains = report["use"]["alibi-full-4"]["gains"]
    assert [g["length"] for g in gains] == [4 * native] and gains[0]["against"] == "own native window"
    assert gains[0]["reads"] == (gains[0]["ci_low"] > 1.0)
    md = (out / "study.md").read_text()
    assert "## Bits per character (masked tokens)" in md and "| alibi-full-4 |" in md
