"""``retrofit study GRID``: the grid's cells, and the tiny grid run as a user types it (recipes/study-tiny.yaml),
its tables and plot written, a second run reusing every cached cell and ``--rerun`` recomputing one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrofit.foundation.errors import OptionError, RecipeError
from retrofit.study import Grid, cells, run_study

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "study-tiny.yaml"
NAMES = ["alibi-none-0", "control-full-6", "alibi-full-6", "control-full-6-seed1", "alibi-full-6-seed1"]


def test_grid_cells_are_the_recipe_with_the_cells_keys_set(tmp_path):
    grid = Grid.from_yaml(TINY)
    assert [c["name"] for c in cells(grid)] == NAMES
    assert grid.output_dir == "runs/study-tiny"
    by = {
        c["name"]: c
        for c in cells(
            Grid.from_yaml(
                TINY,
                ["schemes={yarn: [convert.scheme=rope, convert.options.factor=4], alibi: []}", "methods=[full, lora]"],
            )
        )
    }
    assert by["yarn-lora-6-seed1"]["overrides"] == [
        "convert.scheme=yarn",
        "convert.scheme=rope",
        "convert.options.factor=4",
        "train.method=lora",
        "train.steps=6",
        "train.seed=1",
    ]
    assert by["yarn-lora-6-seed1"]["scheme"] == "rope" and by["control-lora-6"]["scheme"] is None
    assert "yarn-lora-0" not in by and "yarn-none-0" in by  # budget 0 trains nothing: one cell, any method
    for bad, match in (
        (["budgets=[-1]"], "optimizer steps"),
        (["schemes={alibi: [nokey]}"], "key.path=value"),
        (["seeds=[0, 0]"], "twice"),
        (["budget=[1]"], "did you mean 'budgets'"),
    ):
        with pytest.raises(RecipeError, match=match):
            Grid.from_yaml(TINY, bad)
    with pytest.raises(OptionError, match="no cell of this grid matches"):  # before anything runs
        run_study(grid, out=tmp_path, rerun=["t5-*"])
    assert not any(tmp_path.iterdir())


def test_retrofit_study_tiny_grid_writes_its_tables_and_reuses_its_cells(tmp_path, cache, user_env, in_process):
    env = {**user_env, "RETROFIT_CACHE": str(cache)}
    out = tmp_path / "study"

    first = in_process(["retrofit", "study", "recipes/study-tiny.yaml", "--out", str(out)], REPO, env)
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads((out / "study.json").read_text())
    assert [c["name"] for c in report["cells"]] == NAMES and all("rows" in c for c in report["cells"])
    table = {r["cell"]: r for r in report["table"]}
    assert table["alibi-full-6"]["control_ppl@1x"] == table["control-full-6"]["ppl@1x"]
    assert table["alibi-full-6"]["ppl@16x"] and table["control-full-6"]["ppl@4x"] is None  # the control: 1x only
    assert [(r["label"], r["method"]) for r in report["cheapest"]] == [("alibi", "full")]
    assert [(r["label"], r["seeds"]) for r in report["seeds"]] == [("control", [0, 1]), ("alibi", [0, 1])]
    assert set(report["retrieval"]["passkey"]) == {"alibi-none-0", "alibi-full-6"}  # base seed, past native
    md = (out / "study.md").read_text()
    for heading in ("### Cheapest budget", "### Seeds", "### Passkey retrieval"):
        assert heading in md
    assert md in first.stdout and (out / "ppl_vs_length.png").stat().st_size > 0

    again = in_process(  # the same command again: what it reuses
        ["retrofit", "study", "recipes/study-tiny.yaml", "--out", str(out), "--rerun", "alibi-none-*"],
        REPO,
        {**user_env, "RETROFIT_CACHE": str(cache)},
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count(": cached") == len(NAMES) - 1 and "alibi-none-0: cached" not in again.stderr
    second = json.loads((out / "study.json").read_text())
    assert second["table"] == [
        {**r, "seconds": s["seconds"]} if "seconds" in r else r for r, s in zip(report["table"], second["table"])
    ]  # seeded: the same figures
