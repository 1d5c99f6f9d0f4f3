"""The checks of research/study_rounds.py and research/study.py: the grids of the committed study reports resolve
to exactly the cells each report holds; the cells they plan, the cache they come from (its plans, reruns, a
report's cells put back into an empty one). Run from the repository root:

    python -m pytest research/test_study_rounds.py

CI runs it with the other research tests (``python -m pytest research``, after the README's test line; the
session cache and the micro stand-in are research/conftest.py's); the study tables themselves
(retrofit.study.tables) are tested in tests/study/test_study.py.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import shutil
from pathlib import Path

import pytest

import study
import study_rounds as R
from harness import ROOT
from retrofit.foundation.errors import RecipeError
from retrofit.models.standin import load_stats, weights_sha256
from retrofit.study import tables as T
from retrofit.study.cache import CellCache


def test_the_script_holds_only_the_grids_of_the_committed_reports():
    """No cell runner, cache, parser or report code of its own: a main, and one Round per committed report, whose
    cells (through the package) are the report's first ones, in its order, with its settings and plans; the
    others are cells of earlier grids of that round, which come back from the report itself."""
    import retrofit

    mine = {n for n, v in vars(study).items() if inspect.isfunction(v) and v.__module__ == study.__name__}
    assert mine == {"main"}
    assert all(isinstance(r, R.Round) for r in study.ROUNDS.values())
    for name, r in study.ROUNDS.items():
        assert Path(r.out).name == f"{name}.json"
        report = json.loads((ROOT / r.out).read_text())
        if r.part == "smollm2":
            assert [label for label, _ in r.smollm2] == list(report["smollm2"]["runs"])
            assert r.smollm2_lengths == report["smollm2"]["lengths"]
        if "gpt2" not in report:
            continue
        assert {R.parse_scheme(x)["scheme"] for x in r.schemes} <= set(retrofit.schemes())
        g = report["gpt2"]
        native, tokens = g["stand_in"]["native_length"], g["stand_in"]["pretrain_tokens"]
        assert [native * k for k in r.multiples] == g["lengths"]
        if "settings" in g["stand_in"]:  # what the cache is checked against before a report's cells come back
            assert r.settings(native) == g["stand_in"]["settings"]
        planned = R.cells(r, tokens, native)
        assert [c["name"] for c in planned] == [c["name"] for c in g["cells"][: len(planned)]]
        for cell, measured in zip(planned, g["cells"]):
            assert R.plan_of(cell) == R.plan_of(measured), cell["name"]
        for kept in g["cells"][len(planned) :]:  # measured by an earlier grid of the round: back from the report
            assert "rows" in kept and "error" not in kept, kept["name"]
        assert bool(g.get("passkey")) == bool(R.passkey_budgets(r, [c["budget"] for c in planned]))


def test_the_committed_reports_record_the_command_that_rebuilds_them():
    for name, r in study.ROUNDS.items():
        if name == "study_gpt2":
            continue  # from before the reports recorded their stand-in and settings: rebuilt, it gains them
        assert json.loads((ROOT / r.out).read_text())["command"] == f"python research/study.py {name}"
    with pytest.raises(SystemExit):
        study.main(["study9"])


def test_steps_for_rounds_up_and_zero_means_none():
    assert R.steps_for(0, 1_000_000, 512) == 0
    assert R.steps_for(0.001, 1_000_000, 512) == 2  # 1000 tokens -> 2 steps of 512
    assert R.steps_for(0.02, 1_024_000, 2 * 256) == 40
    assert R.steps_for(1e-9, 1000, 512) == 1  # a positive budget always trains


def _round(**kw):
    return R.Round(**{"out": "s.json", "variants": False, **kw})


def test_grid_has_one_control_per_budget_and_variants_at_the_top():
    r = _round(budgets=[0, 0.005, 0.02], methods=["full", "lora"], schemes=["alibi", "rope"], variants=True)
    cells = R.cells(r, pretrain_tokens=1_024_000, native=256)
    names = [c["name"] for c in cells]
    assert len(names) == len(set(names))
    controls = [c for c in cells if c["role"] == "control"]
    assert sorted((c["method"], c["budget"]) for c in controls) == [
        ("full", 0.005),
        ("full", 0.02),
        ("lora", 0.005),
        ("lora", 0.02),
    ]
    assert {c["name"] for c in cells if c["budget"] == 0} == {"alibi-none-0.0", "rope-none-0.0"}
    for c in cells:  # equal extra tokens for every cell of a budget, controls included
        assert c["extra_tokens"] == c["steps"] * 2 * 256
    variants = [c for c in cells if c["name"].count("-") == 3]
    assert {c["name"] for c in variants} == {
        "alibi-full-0.02-distill",
        "alibi-full-0.02-fade",
        "rope-full-0.02-distill",
        "rope-full-0.02-fade",
        "rope-full-0.02-offset",
    }
    assert all(c["budget"] == 0.02 for c in variants)


def _rows(ppls: dict[int, float], role="converted"):
    return [{"length": L, "role": role, "method": "non-overlapping", "ppl": p} for L, p in ppls.items()]


def _report(micro_dir, r: R.Round, native=32) -> dict:
    """A report of ``r`` on the micro stand-in, as a session on another machine would have committed it."""
    stats = load_stats(micro_dir)
    lengths = [native * k for k in r.multiples]
    cells = [
        {**c, "rows": _rows({L: 10.0 + i + L / 1000 for L in lengths}), "seconds": 1.0, "trainable_parameters": 0}
        for i, c in enumerate(R.cells(r, stats["pretrain_tokens"], native))
    ]
    original = _rows({native: 12.0}, "baseline") + [
        {"length": L, "role": "baseline", "method": "sliding", "ppl": 12.5} for L in lengths
    ]
    return {
        "command": "python research/study.py test",
        "hardware": {"device": "cpu"},
        "versions": {},
        "gpt2": {
            "stand_in": {
                "native_length": native,
                "pretrain_tokens": stats["pretrain_tokens"],
                "weights_sha256": weights_sha256(micro_dir),
                "pretrain_stats": stats,
                "settings": r.settings(native),
            },
            "lengths": lengths,
            "original": original,
            "cells": cells,
            "seconds": {"original": 2.0},
        },
        "seconds": 5.0,
    }


def test_a_report_rebuilds_from_its_own_cells_in_an_empty_cache(cache, micro_dir, tmp_path):
    r = _round(
        preset="micro",
        schemes=["alibi", "nope"],
        methods=["full"],
        budgets=[0, 0.5],
        multiples=[1, 2],
        runs=str(tmp_path / "runs"),
        out=str(tmp_path / "s.json"),
        passkey_trials=0,
    )
    committed = _report(micro_dir, r)
    Path(r.out).write_text(json.dumps(committed))
    files = R.rebuild(r, "python research/study.py test")
    g = json.loads(Path(r.out).read_text())["gpt2"]
    assert files == [r.out, str(tmp_path / "s.md"), str(tmp_path / "s_ppl_vs_length.png")]
    assert [c["name"] for c in g["cells"]] == [c["name"] for c in committed["gpt2"]["cells"]]
    assert not [c for c in g["cells"] if "error" in c] and g["original"] == committed["gpt2"]["original"]
    assert (tmp_path / "runs" / "alibi-full-0.5" / "cell.json").is_file()
    again = json.loads(Path(r.out).read_text())
    assert again["hardware"] == {"device": "cpu"} and again["seconds"] == 5.0  # the measuring run's, kept
    table = {row["cell"]: row for row in g["table"]}
    assert table["alibi-full-0.5"]["vs_control@1x"] > 0 and "### Cheapest budget" in (tmp_path / "s.md").read_text()
    # the report once more, from the cache alone: the same bytes
    first = Path(r.out).read_bytes()
    R.rebuild(r, "python research/study.py test")
    assert Path(r.out).read_bytes() == first
    # a smaller grid keeps the report's other cells
    R.rebuild(dataclasses.replace(r, budgets=[0]), "python research/study.py test")
    assert [c["name"] for c in json.loads(Path(r.out).read_text())["gpt2"]["cells"]] == [c["name"] for c in g["cells"]]
    # a cell the cache and the report lack is reported as not run (nothing is trained)
    Path(r.out).unlink()
    shutil.rmtree(tmp_path / "runs" / "nope-full-0.5")
    R.rebuild(r, "python research/study.py test")
    cells = {c["name"]: c for c in json.loads(Path(r.out).read_text())["gpt2"]["cells"]}
    assert cells["nope-full-0.5"]["error"] == R.NOT_RUN and "rows" in cells["alibi-full-0.5"]


def test_a_report_of_another_stand_in_or_other_settings_is_refused(cache, micro_dir, tmp_path):
    r = _round(
        preset="micro",
        schemes=["alibi"],
        methods=["full"],
        budgets=[0],
        multiples=[1, 2],
        runs=str(tmp_path / "runs"),
        out=str(tmp_path / "study.json"),
        passkey_trials=0,
    )
    good = _report(micro_dir, r)
    for key, value in (
        ("weights_sha256", "0" * 64),
        ("settings", {**good["gpt2"]["stand_in"]["settings"], "lr_full": 1.0}),
    ):
        report = json.loads(json.dumps(good))
        report["gpt2"]["stand_in"][key] = value
        Path(r.out).write_text(json.dumps(report))
        with pytest.raises(
            RecipeError, match="another stand-in" if key == "weights_sha256" else "other settings.*lr_full"
        ):
            R.rebuild(r, "python research/study.py test")
        assert json.loads(Path(r.out).read_text()) == report  # left as it was
        assert not (tmp_path / "runs").exists()
    # a report from before the hash was recorded: the same pretraining losses, the round's settings
    legacy = json.loads(json.dumps(good))
    for key in ("weights_sha256", "settings"):
        del legacy["gpt2"]["stand_in"][key]
    Path(r.out).write_text(json.dumps(legacy))
    R.rebuild(r, "python research/study.py test")
    assert "error" not in json.loads(Path(r.out).read_text())["gpt2"]["cells"][0]
    legacy["gpt2"]["stand_in"]["pretrain_stats"]["heldout_loss"] += 1e-9
    Path(r.out).write_text(json.dumps(legacy))
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(RecipeError, match="no hash recorded"):
        R.rebuild(r, "python research/study.py test")


def test_scheme_specs_carry_options_into_the_cells():
    assert R.parse_scheme("alibi") == {"label": "alibi", "scheme": "alibi", "options": {}}
    assert R.parse_scheme("rope:scaling=yarn;factor=8") == {
        "label": "rope-yarn-8",
        "scheme": "rope",
        "options": {"scaling": "yarn", "factor": 8},
    }
    assert R.parse_scheme("pi4=rope:scaling=linear;factor=4.0;learned=true")["options"] == {
        "scaling": "linear",
        "factor": 4.0,
        "learned": True,
    }
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        R.parse_scheme("rope:factor")
    r = _round(
        budgets=[0, 0.02], methods=["lora"], schemes=["alibi", "pi4=rope:scaling=linear;factor=4"], variants=True
    )
    cells = {c["name"]: c for c in R.cells(r, pretrain_tokens=1_024_000, native=256)}
    assert {"pi4-none-0.0", "pi4-lora-0.02", "alibi-lora-0.02"} <= set(cells)
    assert not any(n.startswith("rope-") for n in cells)  # variants run for the plain schemes only
    pi4 = cells["pi4-lora-0.02"]
    assert pi4["scheme"] == "rope" and pi4["options"] == {"scaling": "linear", "factor": 4}
    assert R.parse_scheme("pi=rope") == {"label": "pi", "scheme": "rope", "options": {}}


def test_a_cached_cell_is_reused_for_its_plan_only(tmp_path):
    cell = {
        "name": "yarn-lora-0.02",
        "scheme": "rope",
        "options": {"scaling": "yarn", "factor": 8},
        "method": "lora",
        "budget": 0.02,
        "steps": 4,
        "extra_tokens": 8,
        "role": "converted",
    }
    cache = CellCache(tmp_path)
    cache.put(cell["name"], {**cell, "rows": []})
    assert R.cached_cell(cache, {**cell, "label": "yarn"}) == {**cell, "rows": [], "label": "yarn"}  # a label added
    assert R.cached_cell(cache, {**cell, "options": {"scaling": "yarn", "factor": 16}})["error"] == R.NOT_RUN
    assert R.cached_cell(CellCache(tmp_path, rerun=["yarn-*"]), cell)["error"] == R.NOT_RUN  # to run again: not read
    assert not cache.restore(cell["name"], {"rows": [1]}) and cache.get(cell["name"], R.plan_of(cell), R.plan_of)


def test_pose_zero_shot_only_and_seeded_cells_in_the_grid():
    spec = R.parse_scheme("yp=rope:scaling=yarn;factor=32;pose=8192")
    assert spec == {"label": "yp", "scheme": "rope", "options": {"scaling": "yarn", "factor": 32}, "pose": 8192}
    with pytest.raises(RecipeError, match="pose=TARGET"):
        R.parse_scheme("rope:pose=long")
    r = _round(
        budgets=[0, 0.02, 0.1],
        methods=["full"],
        zero_shot_only=["dyn"],
        seeds=[1, 2],
        seed_labels=["yp"],
        seed_budgets=[0.1],
        schemes=["yp=rope:scaling=yarn;factor=32;pose=8192", "dyn=rope:scaling=dynamic;factor=32", "nope"],
    )
    cells = {c["name"]: c for c in R.cells(r, pretrain_tokens=1_024_000, native=256)}
    assert "yp-none-0.0" not in cells  # PoSE is a fine-tune: no budget-0 cell
    assert "dyn-none-0.0" in cells and not [n for n in cells if n.startswith("dyn-full")]  # zero-shot only
    seeded = sorted(n for n in cells if "-seed" in n)
    assert seeded == ["control-full-0.1-seed1", "control-full-0.1-seed2", "yp-full-0.1-seed1", "yp-full-0.1-seed2"]
    assert (
        cells["yp-full-0.1-seed2"]["seed"] == 2 and cells["yp-full-0.1-seed2"]["steps"] == cells["yp-full-0.1"]["steps"]
    )
    assert R.plan_of(cells["yp-full-0.1-seed1"]) != R.plan_of(cells["yp-full-0.1"])
    with pytest.raises(RecipeError, match="name no scheme label"):
        _round(schemes=["alibi"], seed_labels=["rope"])


def test_long_blocks_calibration_and_a_teacher_in_the_grid():
    spec = R.parse_scheme("ek=extend:length=8192;block=4096;calibrate=50;objective=both")
    assert spec == {
        "label": "ek",
        "scheme": "extend",
        "options": {"length": 8192},
        "block": 4096,
        "calibrate": 50,
        "objective": "both",
    }
    for bad in ("t5:block=long", "t5:objective=kl"):
        with pytest.raises(RecipeError):
            R.parse_scheme(bad)
    r = _round(
        budgets=[0, 0.02],
        methods=["full"],
        schemes=["ek=extend:length=8192;block=4096;objective=both", "tc=t5:calibrate=50"],
    )
    cells = {c["name"]: c for c in R.cells(r, pretrain_tokens=1_024_000, native=256)}
    assert "ek-none-0.0" not in cells and "tc-none-0.0" in cells  # long blocks train; calibration alone is zero-shot
    assert cells["ek-full-0.02"]["block"] == 4096 and cells["tc-none-0.0"]["calibrate"] == 50


def test_labels_seeds_and_pose_targets_are_checked():
    assert R.parse_scheme("rope:pose=4096")["label"] == "rope-pose4096"  # never "rope-4096" (= theta 4096)
    with pytest.raises(RecipeError, match="share the label"):
        _round(schemes=["a=alibi", "a=rope"])
    with pytest.raises(RecipeError, match="must exceed the native length"):
        R.cells(_round(budgets=[0.02], methods=["full"], schemes=["rope:pose=256"]), 1_024_000, 256)
    # seed 0 as an extra seed (base seed 1) is a seed of its own, not the base cell
    r = _round(
        budgets=[0, 0.02],
        methods=["full"],
        schemes=["alibi"],
        seed=1,
        seeds=[0],
        seed_labels=["alibi"],
        seed_budgets=[0, 0.02],
    )
    cells = {c["name"]: c for c in R.cells(r, 1_024_000, 256)}
    assert "alibi-none-0.0-seed0" not in cells  # no seeds for the no-fine-tune cells
    assert R.plan_of(cells["alibi-full-0.02-seed0"]) != R.plan_of(cells["alibi-full-0.02"])


def test_the_smollm2_runs_of_the_report_come_back_into_an_empty_cache(tmp_path):
    """The committed report's SmolLM2 runs go back into an empty cache under their round's file names; the
    converted LoRA runs are compared with the control of the same steps."""
    committed = json.loads((ROOT / "benchmarks" / "study.json").read_text())
    committed["smollm2"]["runs"] = runs = {  # the measured runs, less the controls (made up below)
        label: res
        for label, res in committed["smollm2"]["runs"].items()
        if "rows" in res and not label.startswith("control-")
    }
    assert "alibi-lora-100" in runs and "rope-yarnx4-lora-30" in runs  # what the first round reported
    out = tmp_path / "study.json"
    out.write_text(json.dumps(committed))
    r = dataclasses.replace(study.ROUNDS["study"], runs=str(tmp_path / "runs"), out=str(out))
    assert R.rebuild(r, "python research/study.py study") == [
        str(out),
        str(out.with_suffix(".md")),
        str(tmp_path / "study_gpt2_ppl_vs_length.png"),
    ]
    again = json.loads(out.read_text())
    assert again["gpt2"] == committed["gpt2"]  # the other part is kept
    for label, res in runs.items():
        assert again["smollm2"]["runs"][label] == res
    assert (tmp_path / "runs" / "smollm2" / "alibi-lora-100.json").is_file()
    assert again["smollm2"]["runs"]["control-lora-100"]["error"] == R.NOT_RUN  # a new run is not invented
    assert again["smollm2"]["vs_control"] == []  # no control measured: nothing to compare with
    # a control measured (here: a made-up one, in the cache) is compared with the runs of the same steps
    ctrl = {"steps": 100, "rows": [{"length": 1024, "role": "converted", "method": "non-overlapping", "ppl": 40.0}]}
    (tmp_path / "runs" / "smollm2" / "control-lora-100.json").write_text(json.dumps(ctrl))
    (tmp_path / "runs" / "smollm2" / "alibi-lora-100.json").unlink()  # and the report's run comes back again
    R.rebuild(r, "python research/study.py study")
    vs = json.loads(out.read_text())["smollm2"]["vs_control"]
    alibi = [v for v in vs if v["run"] == "alibi-lora-100"]
    assert [(v["length"], v["control"]) for v in alibi] == [(1024, "control-lora-100")]
    assert alibi[0]["ratio"] == round(T.ppl_at(runs["alibi-lora-100"]["rows"], 1024) / 40.0, 4)
    assert not [v for v in vs if v["run"] == "rope-yarnx4-lora-30"]  # 30 steps: no control of its steps here
    assert "| alibi-lora-100 | control-lora-100 | 1024 |" in out.with_suffix(".md").read_text()


def test_passkey_for_the_base_seeds_cells_at_the_passkey_budgets_only(tmp_path):
    cell = {"scheme": "alibi", "method": "full", "steps": 4, "rows": []}
    results = [
        {**cell, "name": "alibi-full-0.1", "budget": 0.1},
        {**cell, "name": "alibi-full-0.1-seed1", "budget": 0.1, "seed": 1},
        {**cell, "name": "alibi-full-0.02", "budget": 0.02},
        {
            "scheme": "rope",
            "method": "full",
            "steps": 4,
            "name": "rope-full-0.1",
            "budget": 0.1,
            "error": "RuntimeError: boom",
        },
    ]
    r = _round(passkey_budgets="top", passkey_trials=5)
    cache = CellCache(tmp_path)
    plan = {"lengths": [32, 64], "trials": 5, "depths": R.PASSKEY_DEPTHS, "seed": 0}
    # a record cached before the plan keys block and calibrate existed is the same plan
    old_cell_plan = {k: v for k, v in R.plan_of(results[0]).items() if k not in ("block", "calibrate")}
    cache.put("alibi-full-0.1", {"plan": {**plan, "cell": old_cell_plan}, "rows": [], "by_length": {}}, "passkey.json")
    out = R.passkey_part(32, [32, 64], results, r, cache)
    assert set(out) == {"original", "alibi-full-0.1"}
    assert out["original"]["error"] == R.NOT_RUN and out["alibi-full-0.1"]["by_length"] == {}
    assert R.passkey_part(32, [32, 64], results, _round(passkey_budgets="none"), cache) == {}


def test_seed_methods_limit_the_extra_seeds_to_those_methods():
    r = _round(
        budgets=[0.1], methods=["full", "lora"], schemes=["alibi"], seeds=[1], seed_labels=["alibi"], seed_budgets=[0.1]
    )
    both = sorted(c["name"] for c in R.cells(r, pretrain_tokens=1_024_000, native=256) if "-seed" in c["name"])
    assert both == ["alibi-full-0.1-seed1", "alibi-lora-0.1-seed1", "control-full-0.1-seed1", "control-lora-0.1-seed1"]
    r.seed_methods = ["full"]
    full = sorted(c["name"] for c in R.cells(r, pretrain_tokens=1_024_000, native=256) if "-seed" in c["name"])
    assert full == ["alibi-full-0.1-seed1", "control-full-0.1-seed1"]
    with pytest.raises(RecipeError, match="seed_methods"):
        _round(schemes=["alibi"], methods=["full"], seed_methods=["lora"])


def test_a_budget_reads_as_a_share_of_the_pretraining_tokens():
    assert R.budget_words(None, 1_000_000) == "not reached" and R.budget_words(0, 1_000_000) == "0 (no fine-tune)"
    assert R.budget_words(0.1, 1_000_000) == "10.0% (100,000 tokens)"
