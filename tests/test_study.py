"""scripts/study.py: the grid it plans, the table it derives, and one end-to-end run on the micro stand-in."""

from __future__ import annotations

import importlib.util
import json
import math
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_steps_for_rounds_up_and_zero_means_none(study):
    assert study.steps_for(0, 1_000_000, 512) == 0
    assert study.steps_for(0.001, 1_000_000, 512) == 2  # 1000 tokens -> 2 steps of 512
    assert study.steps_for(0.02, 1_024_000, 2 * 256) == 40
    assert study.steps_for(1e-9, 1000, 512) == 1  # a positive budget always trains


def test_grid_has_one_control_per_budget_and_variants_at_the_top(study):
    args = Namespace(budgets=[0, 0.005, 0.02], methods=["full", "lora"], schemes=["alibi", "rope"],
                     batch_size=2, variants=True)
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
    table = {r["cell"]: r for r in study.table_gpt2(original, [ctrl, good, bad, broken], lengths, native)}
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
        study.main(["--part", "smollm2", "--smollm2-runs", "original,nope", "--out", str(tmp_path / "s.json")])
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
    assert (tmp_path / "study.md").read_text().count("| alibi-full-2.0 |") == 1
    assert (tmp_path / "study_gpt2_ppl_vs_length.png").stat().st_size > 0
    # a second run reads every cell from the cache and reports the same table
    study.main(argv + ["--cached-only"])
    again = json.loads((tmp_path / "study.json").read_text())["gpt2"]["table"]
    assert again == g["table"]


def test_scheme_specs_carry_options_into_the_cells_and_the_recipe(study, tmp_path):
    assert study.parse_scheme("alibi") == {"label": "alibi", "scheme": "alibi", "options": {}}
    assert study.parse_scheme("rope:scaling=yarn;factor=8") == {
        "label": "rope-yarn-8", "scheme": "rope", "options": {"scaling": "yarn", "factor": 8}}
    assert study.parse_scheme("pi4=rope:scaling=linear;factor=4.0;learned=true")["options"] == {
        "scaling": "linear", "factor": 4.0, "learned": True}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        study.parse_scheme("rope:factor")
    args = Namespace(budgets=[0, 0.02], methods=["lora"], schemes=["alibi", "pi4=rope:scaling=linear;factor=4"],
                     batch_size=2, variants=True)
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
    args = Namespace(runs=str(tmp_path), force=False, cached_only=True)
    assert study.run_cell(cell, tmp_path, 32, [32], args)["rows"] == []  # same settings: reused
    with pytest.raises(LookupError, match="not run yet"):  # same label, factor 16: never the factor-8 figures
        study.run_cell({**cell, "options": {"scaling": "yarn", "factor": 16}}, tmp_path, 32, [32], args)


def test_end_to_end_on_the_micro_llama_stand_in_reads_the_original_as_is(study, cache, tmp_path):
    argv = ["--part", "gpt2", "--preset", "micro-llama", "--schemes", "yarn2=rope:scaling=yarn;factor=2,alibi",
            "--methods", "lora", "--budgets", "0,2", "--multiples", "1,2", "--eval-budget", "64", "--batch-size", "2",
            "--no-variants", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "study.json")]
    study.main(argv)
    g = json.loads((tmp_path / "study.json").read_text())["gpt2"]
    assert g["stand_in"]["pretrain_stats"]["model_class"] == "LlamaForCausalLM" and g["lengths"] == [32, 64]
    cells = {c["name"]: c for c in g["cells"]}
    assert not [c for c in cells.values() if "error" in c], [c.get("error") for c in cells.values()]
    assert cells["yarn2-lora-2.0"]["options"] == {"scaling": "yarn", "factor": 2}
    table = {r["cell"]: r for r in g["table"]}
    as_is, cropped = table["original (read past native as is)"], table["original (plain at 1x, sliding beyond)"]
    assert math.isfinite(as_is["ppl@2x"])
    assert as_is["ppl@2x"] != cropped["ppl@2x"]  # a 64-token window, not the 32-token crop
    assert all(math.isfinite(table[n]["ppl@2x"]) for n in ("yarn2-none-0.0", "yarn2-lora-2.0", "alibi-lora-2.0"))
    assert "LlamaForCausalLM stand-in `micro-llama`" in (tmp_path / "study.md").read_text()
