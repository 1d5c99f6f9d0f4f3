"""scripts/study.py: the grid it plans, the committed reports' tables (retrofit.study.tables), and end-to-end runs on the micro stand-in."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from argparse import Namespace
from pathlib import Path

import pytest

from retrofit import baseline
from retrofit.study import tables as T

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _grid_args(**kw):
    base = dict(batch_size=2, variants=False, zero_shot_only=set(), seeds=[], seed_labels=set(), seed_budgets=[],
                seed_methods=set())
    return Namespace(**{**base, **kw})


def test_steps_for_rounds_up_and_zero_means_none(study):
    assert study.steps_for(0, 1_000_000, 512) == 0
    assert study.steps_for(0.001, 1_000_000, 512) == 2  # 1000 tokens -> 2 steps of 512
    assert study.steps_for(0.02, 1_024_000, 2 * 256) == 40
    assert study.steps_for(1e-9, 1000, 512) == 1  # a positive budget always trains


def test_grid_has_one_control_per_budget_and_variants_at_the_top(study):
    args = _grid_args(budgets=[0, 0.005, 0.02], methods=["full", "lora"], schemes=["alibi", "rope"], variants=True)
    cells = study.grid(args, pretrain_tokens=1_024_000, native=256)
    names = [c["name"] for c in cells]
    assert len(names) == len(set(names))
    controls = [c for c in cells if c["role"] == "control"]
    assert sorted((c["method"], c["budget"]) for c in controls) == [
        ("full", 0.005), ("full", 0.02), ("lora", 0.005), ("lora", 0.02)]
    assert {c["name"] for c in cells if c["budget"] == 0} == {"alibi-none-0", "rope-none-0"}
    for c in cells:  # equal extra tokens for every cell of a budget, controls included
        assert c["extra_tokens"] == c["steps"] * 2 * 256
    variants = [c for c in cells if c["name"].count("-") == 3]
    assert {c["name"] for c in variants} == {"alibi-full-0.02-distill", "alibi-full-0.02-fade",
                                             "rope-full-0.02-distill", "rope-full-0.02-fade", "rope-full-0.02-offset"}
    assert all(c["budget"] == 0.02 for c in variants)


def _rows(ppls: dict[int, float], role="converted"):
    return [{"length": L, "role": role, "method": "non-overlapping", "ppl": p} for L, p in ppls.items()]


def test_table_compares_with_the_control_and_the_original(study):
    native, lengths = 4, [4, 32, 64]
    original = _rows({4: 10.0}, "baseline") + [
        {"length": L, "role": "baseline", "method": "sliding", "ppl": 10.5} for L in (4, 32, 64)]
    ctrl = {"name": "control-full-0.1", "scheme": None, "method": "full", "budget": 0.1, "extra_tokens": 8,
            "role": "control", "rows": _rows({4: 9.0})}
    good = {"name": "alibi-full-0.1", "scheme": "alibi", "method": "full", "budget": 0.1, "extra_tokens": 8,
            "role": "converted", "rows": _rows({4: 9.9, 32: 9.8, 64: 10.2})}
    bad = {**good, "name": "rope-full-0.1", "scheme": "rope", "rows": _rows({4: 9.5, 32: 12.0, 64: 20.0})}
    broken = {**{k: v for k, v in good.items() if k != "rows"}, "name": "t5-full-0.1", "scheme": "t5",
              "error": "RuntimeError: boom"}
    table = {r["cell"]: r for r in T.cell_table(original, [ctrl, good, bad, broken], lengths, native)}
    assert table["original (plain at 1x, sliding beyond)"]["ppl@8x"] == 10.5  # sliding past 1x
    g = table["alibi-full-0.1"]
    assert g["vs_control@1x"] == round(9.9 / 9.0, 4) and g["ppl@8x/1x"] == round(9.8 / 9.9, 4)
    assert g["beats_original_sliding_everywhere"] is True
    assert table["rope-full-0.1"]["beats_original_sliding_everywhere"] is False
    assert table["t5-full-0.1"]["error"] == "RuntimeError: boom" and "ppl@1x" not in table["t5-full-0.1"]


def test_unknown_names_are_refused_before_any_work(study, tmp_path):
    with pytest.raises(SystemExit, match="unknown schemes"):
        study.main(["--part", "gpt2", "--schemes", "alibi,bogus", "--out", str(tmp_path / "s.json")])
    with pytest.raises(SystemExit, match="unknown --smollm2-runs"):
        study.main(["--part", "smollm2", "--smollm2-runs", "original,bogus", "--out", str(tmp_path / "s.json")])
    assert not (tmp_path / "s.json").exists()


def test_end_to_end_on_the_micro_stand_in_is_cached_and_deterministic(study, cache, micro_dir, tmp_path):
    argv = ["--part", "gpt2", "--preset", "micro", "--schemes", "alibi", "--methods", "full", "--budgets", "0,2",
            "--multiples", "1,2", "--eval-budget", "64", "--batch-size", "2", "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "study.json")]
    study.main(argv)
    out = json.loads((tmp_path / "study.json").read_text())
    g = out["gpt2"]
    assert g["stand_in"]["native_length"] == 32 and g["lengths"] == [32, 64]
    cells = {c["name"]: c for c in g["cells"]}
    assert set(cells) == {"alibi-none-0.0", "control-full-2.0", "alibi-full-2.0", "alibi-full-2.0-distill",
                          "alibi-full-2.0-fade"}
    assert not [c for c in cells.values() if "error" in c], [c.get("error") for c in cells.values()]
    assert cells["alibi-full-2.0"]["steps"] == cells["control-full-2.0"]["steps"] > 0
    assert cells["alibi-full-2.0"]["trainable_parameters"] > 0 and cells["alibi-none-0.0"]["trainable_parameters"] == 0
    table = {r["cell"]: r for r in g["table"]}
    for name in ("alibi-none-0.0", "alibi-full-2.0"):
        assert all(math.isfinite(table[name][k]) for k in ("ppl@1x", "ppl@2x"))
    assert table["alibi-full-2.0"]["vs_control@1x"] > 0
    # fine-tuning changed the converted model
    assert table["alibi-full-2.0"]["ppl@1x"] != table["alibi-none-0.0"]["ppl@1x"]
    md = (tmp_path / "study.md").read_text()
    assert md.split("### ")[0].count("| alibi-full-2.0 |") == 1
    # passkey at the top budget and for the original: the prompt does not fit in 32 or 64 tokens, and says so
    assert set(g["passkey"]) == {"original", "control-full-2.0", "alibi-full-2.0", "alibi-full-2.0-distill",
                                 "alibi-full-2.0-fade"}
    assert all(r["accuracy"] is None and "too short" in r["note"] for r in g["passkey"]["alibi-full-2.0"]["rows"])
    assert "### Passkey retrieval" in md and "### Cheapest budget" in md
    assert (tmp_path / "study_gpt2_ppl_vs_length.png").stat().st_size > 0
    # a second run reads every cell from the cache and reports the same table
    study.main(argv + ["--cached-only"])
    again = json.loads((tmp_path / "study.json").read_text())["gpt2"]["table"]
    assert again == g["table"]
    # another machine (an empty --runs cache): the cells come back from the report itself, same stand-in
    assert g["stand_in"]["weights_sha256"] == baseline.weights_sha256(micro_dir)
    shutil.rmtree(tmp_path / "runs")
    study.main(argv + ["--cached-only"])
    again = json.loads((tmp_path / "study.json").read_text())["gpt2"]
    assert again["table"] == g["table"] and again["passkey"] == g["passkey"]
    assert (tmp_path / "runs" / "alibi-full-2.0" / "cell.json").is_file()
    # a smaller grid keeps the report's other cells
    study.main([*argv[:argv.index("--budgets") + 1], "0", *argv[argv.index("--budgets") + 2:], "--cached-only"])
    smaller = json.loads((tmp_path / "study.json").read_text())["gpt2"]
    assert {c["name"] for c in smaller["cells"]} == set(cells) and smaller["table"] == g["table"]
    # a report measured on another stand-in, or with other settings, is refused and left as it was
    for key, value in (("weights_sha256", "0" * 64), ("settings", {**g["stand_in"]["settings"], "lr_full": 1.0})):
        report = json.loads((tmp_path / "study.json").read_text())
        report["gpt2"]["stand_in"][key] = value
        (tmp_path / "study.json").write_text(json.dumps(report))
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
        with pytest.raises(SystemExit, match="another stand-in" if key == "weights_sha256" else "other settings.*lr_full"):
            study.main(argv + ["--cached-only"])
        assert json.loads((tmp_path / "study.json").read_text()) == report
        (tmp_path / "study.json").write_text(json.dumps({**report, "gpt2": g}))  # the measured report again
    # a report from before the hash was recorded: the same pretraining losses and the command's settings
    legacy = json.loads((tmp_path / "study.json").read_text())
    for key in ("weights_sha256", "settings"):
        del legacy["gpt2"]["stand_in"][key]
    (tmp_path / "study.json").write_text(json.dumps(legacy))
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    study.main(argv + ["--cached-only"])
    assert json.loads((tmp_path / "study.json").read_text())["gpt2"]["table"] == g["table"]
    legacy["gpt2"]["stand_in"]["pretrain_stats"]["heldout_loss"] += 1e-9
    (tmp_path / "study.json").write_text(json.dumps(legacy))
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(SystemExit, match="no hash recorded"):
        study.main(argv + ["--cached-only"])


def test_a_run_stopped_midway_leaves_its_finished_cells_in_the_report(study, cache, micro_dir, tmp_path, monkeypatch):
    argv = ["--part", "gpt2", "--preset", "micro", "--schemes", "alibi,nope", "--methods", "full", "--budgets", "0",
            "--multiples", "1,2", "--eval-budget", "64", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "s.json")]
    run_cell, calls = study.run_cell, []

    def stop_at_the_second(*a, **k):
        calls.append(a[0]["name"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return run_cell(*a, **k)

    monkeypatch.setattr(study, "run_cell", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        study.main(argv)
    cells = {c["name"]: c for c in json.loads((tmp_path / "s.json").read_text())["gpt2"]["cells"]}
    assert "rows" in cells["alibi-none-0.0"] and "pending" in cells["nope-none-0.0"]["error"]
    monkeypatch.setattr(study, "run_cell", run_cell)
    study.main(argv)  # the grid finished
    calls.clear()
    monkeypatch.setattr(study, "run_cell", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):  # a --rerun of nope stopped before it ends: its figures stay
        study.main([*argv, "--rerun", "nope-none-0.0"])
    cells = {c["name"]: c for c in json.loads((tmp_path / "s.json").read_text())["gpt2"]["cells"]}
    assert "rows" in cells["nope-none-0.0"] and "error" not in cells["nope-none-0.0"]


def test_scheme_specs_carry_options_into_the_cells_and_the_recipe(study, tmp_path):
    assert study.parse_scheme("alibi") == {"label": "alibi", "scheme": "alibi", "options": {}}
    assert study.parse_scheme("rope:scaling=yarn;factor=8") == {
        "label": "rope-yarn-8", "scheme": "rope", "options": {"scaling": "yarn", "factor": 8}}
    assert study.parse_scheme("pi4=rope:scaling=linear;factor=4.0;learned=true")["options"] == {
        "scaling": "linear", "factor": 4.0, "learned": True}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        study.parse_scheme("rope:factor")
    args = _grid_args(budgets=[0, 0.02], methods=["lora"], schemes=["alibi", "pi4=rope:scaling=linear;factor=4"],
                      variants=True)
    cells = {c["name"]: c for c in study.grid(args, pretrain_tokens=1_024_000, native=256)}
    assert {"pi4-none-0", "pi4-lora-0.02", "alibi-lora-0.02"} <= set(cells)
    assert not any(n.startswith("rope-") for n in cells)  # variants run for the plain schemes only
    pi4 = cells["pi4-lora-0.02"]
    assert pi4["scheme"] == "rope" and pi4["options"] == {"scaling": "linear", "factor": 4}
    r = study.recipe_for(pi4, tmp_path, 256, Namespace(batch_size=2, lr_full=1e-4, lr_lora=1e-3, seed=0,
                                                      lora_embeddings=True), tmp_path / "out")
    assert r["convert"] == {"scheme": "rope", "options": {"scaling": "linear", "factor": 4}}
    assert study.recipe_for(cells["alibi-lora-0.02"], tmp_path, 256, Namespace(
        batch_size=2, lr_full=1e-4, lr_lora=1e-3, seed=0, lora_embeddings=True), tmp_path / "o")["convert"] == {
        "scheme": "alibi"}
    assert study.parse_scheme("pi=rope") == {"label": "pi", "scheme": "rope", "options": {}}
    with pytest.raises(SystemExit, match="unknown schemes"):
        study.main(["--part", "gpt2", "--schemes", "x=bogus:factor=2", "--out", str(tmp_path / "s.json")])


def test_a_cached_cell_with_other_options_is_not_reused(study, tmp_path):
    cell = {"name": "yarn-lora-0.02", "scheme": "rope", "options": {"scaling": "yarn", "factor": 8}, "method": "lora",
            "budget": 0.02, "steps": 4, "extra_tokens": 8, "role": "converted"}
    (tmp_path / cell["name"]).mkdir()
    (tmp_path / cell["name"] / "cell.json").write_text(json.dumps({**cell, "rows": []}))
    args = Namespace(runs=str(tmp_path), force=False, cached_only=True, new_cells=True, rerun=set())
    assert study.run_cell(cell, tmp_path, 32, [32], args)["rows"] == []  # same settings: reused
    with pytest.raises(LookupError, match="not run yet"):  # named in --rerun: the cache is not used
        study.run_cell(cell, tmp_path, 32, [32], Namespace(**{**vars(args), "rerun": {cell["name"]}}))
    with pytest.raises(LookupError, match="not run yet"):  # same label, factor 16: never the factor-8 figures
        study.run_cell({**cell, "options": {"scaling": "yarn", "factor": 16}}, tmp_path, 32, [32], args)
    with pytest.raises(LookupError, match="no-new-cells"):
        study.run_cell({**cell, "options": {"scaling": "yarn", "factor": 16}}, tmp_path, 32, [32],
                       Namespace(runs=str(tmp_path), force=False, cached_only=False, new_cells=False, rerun=set()))


def test_end_to_end_on_the_micro_llama_stand_in_reads_the_original_as_is(study, cache, tmp_path):
    argv = ["--part", "gpt2", "--preset", "micro-llama", "--schemes", "yarn2=rope:scaling=yarn;factor=2,alibi",
            "--methods", "lora", "--budgets", "0,2", "--multiples", "1,8", "--eval-budget", "256", "--batch-size", "2",
            "--no-variants", "--stand-in-passkey-trials", "2", "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "study.json")]
    study.main(argv)
    g = json.loads((tmp_path / "study.json").read_text())["gpt2"]
    assert g["stand_in"]["pretrain_stats"]["model_class"] == "LlamaForCausalLM" and g["lengths"] == [32, 256]
    cells = {c["name"]: c for c in g["cells"]}
    assert not [c for c in cells.values() if "error" in c], [c.get("error") for c in cells.values()]
    assert cells["yarn2-lora-2.0"]["options"] == {"scaling": "yarn", "factor": 2}
    table = {r["cell"]: r for r in g["table"]}
    as_is, cropped = table["original (read past native as is)"], table["original (plain at 1x, sliding beyond)"]
    assert math.isfinite(as_is["ppl@8x"])
    assert as_is["ppl@8x"] != cropped["ppl@8x"]  # a 256-token window, not the 32-token crop
    assert all(math.isfinite(table[n]["ppl@8x"]) for n in ("yarn2-none-0.0", "yarn2-lora-2.0", "alibi-lora-2.0"))
    # passkey: the original read as is and the top-budget cells at every length the prompt fits in (not 32)
    for name in ("original", "yarn2-lora-2.0", "alibi-lora-2.0"):
        pk = g["passkey"][name]
        assert [r["depth"] for r in pk["rows"] if r["length"] == 256] == [0.0, 0.5, 1.0]
        assert set(pk["by_length"]) == {"256"} and pk["by_length"]["256"]["trials"] == 6
        low, high = pk["by_length"]["256"]["ci_low"], pk["by_length"]["256"]["ci_high"]
        assert 0 <= low <= pk["by_length"]["256"]["accuracy"] <= high <= 1 and high - low > 0.3  # 6 trials: wide
    assert g["passkey"]["control-lora-2.0"]["by_length"].keys() == {"32"} or not g["passkey"]["control-lora-2.0"]["by_length"]
    assert "LlamaForCausalLM stand-in `micro-llama`" in (tmp_path / "study.md").read_text()
    # --rerun: one cell trained again (its weights gone, as on a fresh machine), the others left as cached
    runs = tmp_path / "runs"
    shutil.rmtree(runs / "alibi-lora-2.0" / "ft")
    (runs / "alibi-lora-2.0" / "passkey.json").unlink()
    kept = {p: p.stat().st_mtime_ns for p in runs.glob("*/cell.json") if p.parent.name != "alibi-lora-2.0"}
    with pytest.raises(SystemExit, match="not cells of this grid"):
        study.main([*argv, "--rerun", "alibi-lora-0.5"])
    with pytest.raises(SystemExit, match="cannot go with --cached-only"):
        study.main([*argv, "--rerun", "alibi-lora-2.0", "--cached-only"])
    with pytest.raises(SystemExit, match="stand-in grid"):
        study.main(["--part", "smollm2", "--rerun", "alibi-lora", "--out", str(tmp_path / "sm.json")])
    study.main([*argv, "--rerun", "alibi-lora-2.0"])
    again = json.loads((tmp_path / "study.json").read_text())["gpt2"]
    assert (runs / "alibi-lora-2.0" / "ft" / "final").is_dir()
    assert {c["name"]: c["rows"] for c in again["cells"]} == {n: c["rows"] for n, c in cells.items()}  # seeded
    assert again["passkey"]["alibi-lora-2.0"]["rows"] == g["passkey"]["alibi-lora-2.0"]["rows"]
    assert {p: p.stat().st_mtime_ns for p in kept} == kept


def test_pose_zero_shot_only_and_seeded_cells_in_the_grid(study, tmp_path):
    spec = study.parse_scheme("yp=rope:scaling=yarn;factor=32;pose=8192")
    assert spec == {"label": "yp", "scheme": "rope", "options": {"scaling": "yarn", "factor": 32}, "pose": 8192}
    with pytest.raises(SystemExit, match="pose=TARGET"):
        study.parse_scheme("rope:pose=long")
    args = _grid_args(budgets=[0, 0.02, 0.1], methods=["full"], zero_shot_only={"dyn"}, seeds=[1, 2],
                      seed_labels={"yp"}, seed_budgets=[0.1],
                      schemes=["yp=rope:scaling=yarn;factor=32;pose=8192", "dyn=rope:scaling=dynamic;factor=32", "nope"])
    cells = {c["name"]: c for c in study.grid(args, pretrain_tokens=1_024_000, native=256)}
    assert "yp-none-0" not in cells  # PoSE is a fine-tune: no budget-0 cell
    assert "dyn-none-0" in cells and not [n for n in cells if n.startswith("dyn-full")]  # zero-shot only
    seeded = sorted(n for n in cells if "-seed" in n)
    assert seeded == ["control-full-0.1-seed1", "control-full-0.1-seed2", "yp-full-0.1-seed1", "yp-full-0.1-seed2"]
    assert cells["yp-full-0.1-seed2"]["seed"] == 2 and cells["yp-full-0.1-seed2"]["steps"] == cells["yp-full-0.1"]["steps"]
    assert study.plan_of(cells["yp-full-0.1-seed1"]) != study.plan_of(cells["yp-full-0.1"])
    rargs = Namespace(batch_size=2, lr_full=1e-4, lr_lora=1e-3, seed=0, lora_embeddings=True)
    r = study.recipe_for(cells["yp-full-0.1-seed2"], tmp_path, 256, rargs, tmp_path / "o")
    assert r["train"]["seed"] == 2 and r["train"]["positions"]["method"] == "pose"
    assert r["train"]["positions"]["target_length"] == 8192 and "pose" not in r["convert"]["options"]
    assert study.recipe_for(cells["yp-full-0.1"], tmp_path, 256, rargs, tmp_path / "o")["train"]["seed"] == 0
    with pytest.raises(SystemExit, match="name no --schemes label"):
        study.main(["--part", "gpt2", "--schemes", "alibi", "--seed-labels", "rope", "--out", str(tmp_path / "s.json")])


def test_long_blocks_calibration_and_a_teacher_in_the_grid(study, tmp_path):
    spec = study.parse_scheme("ek=extend:length=8192;block=4096;calibrate=50;objective=both")
    assert spec == {"label": "ek", "scheme": "extend", "options": {"length": 8192}, "block": 4096, "calibrate": 50,
                    "objective": "both"}
    for bad in ("t5:block=long", "t5:objective=kl"):
        with pytest.raises(SystemExit):
            study.parse_scheme(bad)
    args = _grid_args(budgets=[0, 0.02], methods=["full"],
                      schemes=["ek=extend:length=8192;block=4096;objective=both", "tc=t5:calibrate=50"])
    cells = {c["name"]: c for c in study.grid(args, pretrain_tokens=1_024_000, native=256)}
    assert "ek-none-0" not in cells and "tc-none-0" in cells  # long blocks train; calibration alone is zero-shot
    rargs = Namespace(batch_size=16, lr_full=1e-4, lr_lora=1e-3, seed=0, lora_embeddings=True)
    r = study.recipe_for(cells["ek-full-0.02"], tmp_path, 256, rargs, tmp_path / "o")
    assert r["data"]["block_length"] == 4096 and r["train"]["batch_size"] == 1  # the same 4,096 tokens a step
    assert r["data"]["max_validation_blocks"] == 1 and r["train"]["objective"] == "both"
    r = study.recipe_for(cells["tc-full-0.02"], tmp_path, 256, rargs, tmp_path / "o")
    assert r["convert"]["calibrate"] == {"data": "shakespeare:train", "steps": 50} and r["train"]["batch_size"] == 16
    with pytest.raises(SystemExit, match="multiple of the native"):
        study.recipe_for({**cells["ek-full-0.02"], "block": 300}, tmp_path, 256, rargs, tmp_path / "o")


def _row(cell, label, method, budget, p1, p16=None, **kw):
    return {"cell": cell, "label": label, "scheme": None if label == "control" else "x", "method": method,
            "budget": budget, "ppl@1x": p1, "ppl@16x": p16, **kw}


def test_cheapest_budget_needs_both_the_control_and_the_length_criteria(study):
    table = [{"cell": "original (plain at 1x, sliding beyond)", "scheme": None, "method": None, "budget": 0, "ppl@1x": 10.0},
             _row("control-full-0.02", "control", "full", 0.02, 9.0), _row("control-full-0.1", "control", "full", 0.1, 8.0),
             _row("a-none-0", "a", "none", 0, 10.1, 10.5),         # 1.01x original, 16x/1x 1.04: met at 0
             _row("b-none-0", "b", "none", 0, 30.0, 90.0),
             _row("b-full-0.02", "b", "full", 0.02, 9.2, 9.3),      # 1.022x control: not met
             _row("b-full-0.1", "b", "full", 0.1, 8.1, 8.4),        # 1.0125x, 1.037: met
             _row("c-full-0.1", "c", "full", 0.1, 8.0, 8.5),        # length criterion fails (1.0625)
             _row("b-full-0.1-seed1", "b", "full", 0.1, 20.0, 20.0, seed=1)]  # seeds never decide
    got = {(r["label"], r["method"]): r for r in T.cheapest_budgets(table, native=256)}
    assert got[("a", "full")]["cheapest_budget"] == 0
    assert got[("b", "full")]["cheapest_budget"] == 0.1
    assert [c["met"] for c in got[("b", "full")]["checked"]] == [False, False, True]
    assert got[("c", "full")]["cheapest_budget"] is None
    md = "\n".join(T.cheapest_markdown(list(got.values()), lambda b: T.budget_words(b, 1_000_000)))
    assert "| c | full | not reached |" in md and "| b | full | 10.0% (100,000 tokens) |" in md
    seeds = T.seed_table(table, [256], 256)
    assert len(seeds) == 1 and seeds[0]["seeds"] == [0, 1]
    assert seeds[0]["ppl@1x"]["mean"] == pytest.approx((8.1 + 20.0) / 2) and seeds[0]["ppl@1x"]["n"] == 2
    # the target seed by seed: each seed against its own control; a seed that fails either test is not counted
    judged = [{**r, "control_ppl@1x": 8.0, "ppl@16x/1x": round(r["ppl@16x"] / r["ppl@1x"], 4)} for r in
              (_row("d-full-0.1", "d", "full", 0.1, 8.1, 8.4),                # 1.0125x, 1.037: met
               _row("d-full-0.1-seed1", "d", "full", 0.1, 8.1, 8.6, seed=1),  # 16x/1x 1.062: not met
               _row("d-full-0.1-seed2", "d", "full", 0.1, 8.3, 8.3, seed=2))]  # 1.0375x the control: not met
    (d,) = T.seed_table(judged, [256], 256)
    assert d["met"] == {"seeds": 1, "of": 3} and d["ppl@16x/1x"]["max"] == 1.0617
    assert "| d | full | 0.1 | 0,1,2 |" in "\n".join(T.seeds_markdown([d])) and "| 1 of 3 |" in T.seeds_markdown([d])[-2]


def test_passkey_pooled_over_depths_with_the_wilson_interval(study):
    rows = [{"length": 256, "depth": d, "correct": c, "trials": 10, "accuracy": c / 10} for d, c in ((0, 0), (0.5, 3), (1, 2))]
    rows.append({"length": 512, "depth": None, "correct": 0, "trials": 0, "accuracy": None, "note": "too short"})
    pooled = T.pooled_passkey(rows)
    assert set(pooled) == {"256"} and pooled["256"]["correct"] == 5 and pooled["256"]["trials"] == 30
    assert pooled["256"]["ci_low"] < 5 / 30 < pooled["256"]["ci_high"]


def test_labels_seeds_and_pose_targets_are_checked(study, tmp_path):
    assert study.parse_scheme("rope:pose=4096")["label"] == "rope-pose4096"  # never "rope-4096" (= theta 4096)
    with pytest.raises(SystemExit, match="share the label"):
        study.main(["--part", "gpt2", "--schemes", "a=alibi,a=rope", "--out", str(tmp_path / "s.json")])
    with pytest.raises(SystemExit, match="must exceed the native length"):
        study.grid(_grid_args(budgets=[0.02], methods=["full"], schemes=["rope:pose=256"]), 1_024_000, 256)
    # seed 0 as an extra seed (base seed 1) is a seed of its own, not the base cell
    args = _grid_args(budgets=[0, 0.02], methods=["full"], schemes=["alibi"], seeds=[0], seed_labels={"alibi"},
                      seed_budgets=[0, 0.02])
    cells = {c["name"]: c for c in study.grid(args, 1_024_000, 256)}
    assert "alibi-none-0-seed0" not in cells  # no seeds for the no-fine-tune cells
    assert study.plan_of(cells["alibi-full-0.02-seed0"]) != study.plan_of(cells["alibi-full-0.02"])
    table = [{"cell": "original (plain at 1x, sliding beyond)", "scheme": None, "method": None, "budget": 0, "ppl@1x": 10.0},
             _row("control-full-0.02", "control", "full", 0.02, 9.0),
             _row("control-full-0.02-seed0", "control", "full", 0.02, 99.0, seed=0),
             _row("a-full-0.02", "a", "full", 0.02, 9.1, 9.2),
             _row("a-full-0.02-seed0", "a", "full", 0.02, 50.0, 50.0, seed=0)]
    (got,) = T.cheapest_budgets(table, 256)
    assert got["cheapest_budget"] == 0.02 and got["checked"][0]["reference@1x"] == 9.0  # the base control
    assert T.seed_table(table, [256], 256, base_seed=1)[0]["seeds"] == [0, 1]


def test_the_smollm2_runs_of_the_report_come_back_into_an_empty_cache(study, tmp_path, monkeypatch):
    """The committed report's SmolLM2 runs go back into an empty --runs cache under their plan's file names, so
    only the runs it lacks would run; the converted LoRA runs are compared with the control of the same steps."""
    from retrofit import assets

    committed = json.loads((ROOT / "benchmarks" / "study.json").read_text())
    committed["smollm2"]["runs"] = runs = {  # the measured runs, less the controls (made up below)
        label: res for label, res in committed["smollm2"]["runs"].items() if "rows" in res and not label.startswith("control-")}
    assert "alibi-lora-100" in runs and "rope-yarnx4-lora-30" in runs  # what the first round reported
    monkeypatch.setattr(assets, "smollm2_gguf", lambda: tmp_path / "absent.gguf")  # nothing is loaded: --cached-only
    out = tmp_path / "study.json"
    out.write_text(json.dumps(committed))
    argv = ["--part", "smollm2", "--cached-only", "--runs", str(tmp_path / "runs"), "--out", str(out)]
    study.main(argv)
    again = json.loads(out.read_text())
    assert again["gpt2"] == committed["gpt2"]  # the other part is kept
    for label, res in runs.items():
        assert again["smollm2"]["runs"][label] == res
    assert (tmp_path / "runs" / "smollm2" / "alibi-lora-100.json").is_file()
    assert "not run yet" in again["smollm2"]["runs"]["control-lora-100"]["error"]  # a new run is not invented
    assert again["smollm2"]["vs_control"] == []  # no control measured: nothing to compare with
    # a control measured (here: a made-up one, in the cache) is compared with the runs of the same steps
    ctrl = {"steps": 100, "rows": [{"length": 1024, "role": "converted", "method": "non-overlapping", "ppl": 40.0}]}
    (tmp_path / "runs" / "smollm2" / "control-lora-100.json").write_text(json.dumps(ctrl))
    (tmp_path / "runs" / "smollm2" / "alibi-lora-100.json").unlink()  # and the report's run comes back again
    study.main(argv)
    vs = json.loads(out.read_text())["smollm2"]["vs_control"]
    alibi = [v for v in vs if v["run"] == "alibi-lora-100"]
    assert [(v["length"], v["control"]) for v in alibi] == [(1024, "control-lora-100")]
    assert alibi[0]["ratio"] == round(T.ppl_at(runs["alibi-lora-100"]["rows"], 1024) / 40.0, 4)
    assert not [v for v in vs if v["run"] == "rope-yarnx4-lora-30"]  # 30 steps: no control of its steps here
    assert "| alibi-lora-100 | control-lora-100 | 1024 |" in out.with_suffix(".md").read_text()


def test_passkey_runs_for_the_base_seeds_cells_at_the_passkey_budgets_only(study, tmp_path, monkeypatch):
    tested = []
    monkeypatch.setattr(study, "_passkey_cached", lambda name, *a, **k: tested.append(name) or {"rows": []})
    cell = {"scheme": "alibi", "method": "full", "steps": 4, "rows": []}
    results = [{**cell, "name": "alibi-full-0.1", "budget": 0.1},
               {**cell, "name": "alibi-full-0.1-seed1", "budget": 0.1, "seed": 1},
               {**cell, "name": "alibi-full-0.02", "budget": 0.02},
               {"scheme": "rope", "method": "full", "steps": 4, "name": "rope-full-0.1", "budget": 0.1,
                "error": "RuntimeError: boom"}]
    args = Namespace(stand_in_passkey_budgets="top", stand_in_passkey_trials=5, runs=str(tmp_path))
    out = study.passkey_part(tmp_path, 32, [32, 64], results, args)
    assert tested == ["original", "alibi-full-0.1"] and set(out) == set(tested)


def test_seed_methods_limit_the_extra_seeds_to_those_methods(study, tmp_path):
    args = _grid_args(budgets=[0.1], methods=["full", "lora"], schemes=["alibi"], seeds=[1], seed_labels={"alibi"},
                      seed_budgets=[0.1])
    both = sorted(c["name"] for c in study.grid(args, pretrain_tokens=1_024_000, native=256) if "-seed" in c["name"])
    assert both == ["alibi-full-0.1-seed1", "alibi-lora-0.1-seed1", "control-full-0.1-seed1", "control-lora-0.1-seed1"]
    args.seed_methods = {"full"}
    full = sorted(c["name"] for c in study.grid(args, pretrain_tokens=1_024_000, native=256) if "-seed" in c["name"])
    assert full == ["alibi-full-0.1-seed1", "control-full-0.1-seed1"]
    with pytest.raises(SystemExit, match="--seed-methods"):
        study.main(["--part", "gpt2", "--schemes", "alibi", "--methods", "full", "--seed-methods", "lora",
                    "--out", str(tmp_path / "s.json")])


def test_a_cached_smollm2_run_gets_passkey_at_its_new_lengths_only(study, tmp_path, monkeypatch):
    """--passkey-lengths longer than a cached run's passkey: only the missing lengths the run has rows at are
    tested (its rebuilt model, its perplexity not measured again), added to its cache with their seconds; a
    second invocation runs nothing."""
    import retrofit
    from retrofit import assets

    monkeypatch.setattr(assets, "smollm2_gguf", lambda: tmp_path / "model.gguf")
    built, calls = [], []
    monkeypatch.setattr(retrofit, "load_model", lambda *a, **k: (object(), "tok"))
    monkeypatch.setattr(retrofit, "convert", lambda model, scheme, **o: built.append((scheme, o)))

    def fake_evaluate(model, lengths, passkey_lengths, **k):
        calls.append((lengths, passkey_lengths))
        data = {"passkey": [{"role": "converted", "length": L, "correct": 2, "trials": 3, "accuracy": 2 / 3}
                            for L in passkey_lengths]}
        return Namespace(rows=[], data=data)

    monkeypatch.setattr(retrofit, "evaluate", fake_evaluate)
    cache = tmp_path / "runs" / "smollm2"
    cache.mkdir(parents=True)
    rows = [{"length": L, "role": "converted", "method": "non-overlapping", "ppl": 20.0} for L in (8192, 16384)]
    (cache / "rope-yarnx4.json").write_text(json.dumps({"rows": rows, "passkey": {"8192": 1.0}, "seconds": 9.0,
                                                        "passkey_error": "LookupError: an earlier try"}))
    argv = ["--part", "smollm2", "--smollm2-runs", "rope-yarnx4", "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "s.json")]
    study.main(argv)
    assert calls == [([1024], [16384])]  # 16k only: 8k is cached, and the run has no rows at 1k-4k
    assert built == [("rope", {"scaling": "yarn", "factor": 4.0})]  # the run's own conversion
    res = json.loads((cache / "rope-yarnx4.json").read_text())
    assert res["passkey"] == {"8192": 1.0, "16384": 0.667} and res["rows"] == rows and res["seconds"] == 9.0
    assert list(res["passkey_seconds"]) == ["16384"] and "passkey_error" not in res  # the earlier failure is gone
    report = json.loads((tmp_path / "s.json").read_text())["smollm2"]
    assert report["runs"]["rope-yarnx4-no-finetune"]["passkey"]["16384"] == 0.667
    assert report["seconds"] == 9.0 + res["passkey_seconds"]["16384"]
    assert f"| 9.0 + {res['passkey_seconds']['16384']} (passkey at 16384) |" in (tmp_path / "s.md").read_text()
    study.main(argv)
    assert len(calls) == 1  # nothing left to test
    study.main([*argv, "--passkey-lengths", "8192"])
    assert len(calls) == 1
