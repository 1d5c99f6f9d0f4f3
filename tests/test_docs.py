"""The user docs: a README users can read (at most 250 lines), and no issue numbers in any user doc
(they mean nothing to a user; the history lives in git)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_at_most_250_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines; move measurements to docs/results.md"


def test_no_issue_numbers_in_user_docs():
    found = [
        f"{p.relative_to(ROOT)}:{i}: {m.group(0)}"
        for p in USER_DOCS
        for i, line in enumerate(p.read_text().splitlines(), 1)
        for m in re.finditer(r"\bissues? #?\d+|\(#\d+\)", line, re.IGNORECASE)
    ]
    assert not found, found


@pytest.mark.slow
def test_the_kernel_table_in_results_is_what_the_benchmark_jsons_give():
    """docs/results.md's kernel table is rendered from the JSONs (research/kernel_table.py, run as documented), not
    typed."""
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "research" / "kernel_table.py"),
            "benchmarks/kernel_table",
            "benchmarks/bench_kernel_relative.json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    table = r.stdout.rstrip("\n")
    rows = {tuple(c.strip() for c in line.split("|")[1:3]) for line in table.splitlines()[4:]}
    schemes = ["alibi", "t5", "shaw", "fire", "xl", "nezha", "rope", "nope", "sinusoidal"]
    assert rows >= {(s, m) for s in schemes for m in ("inference", "train step")}, rows  # every scheme, both modes
    assert table in (ROOT / "docs" / "results.md").read_text()


def test_the_recipe_table_names_each_recipes_corpus():
    """docs/finetune.md's recipe table: its data column is each recipe's data.dataset (a table once said
    Shakespeare, wikitext-103 and pg19 for recipes that all stream FineWeb-Edu)."""
    import re

    import yaml

    names = {
        "HuggingFaceFW/fineweb-edu": "FineWeb-Edu (streamed)",
        "stdlib": "stdlib (offline)",
        "shakespeare:train": "Shakespeare (offline)",
    }
    table = (ROOT / "docs" / "finetune.md").read_text().split("### Recipes", 1)[1].split("###", 1)[0]
    checked = 0
    for line in table.splitlines():
        m = re.match(r"\| `([\w-]+)`", line)
        if not m:
            continue
        data = line.rstrip(" |").rsplit("|", 1)[1].strip()
        for name in re.findall(r"`([\w-]+)`", line.split("|")[1]):
            dataset = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())["data"]["dataset"]
            assert data == names.get(dataset, dataset), line
            checked += 1
    assert checked >= 10


@pytest.mark.slow
def test_the_smollm2_reach_tables_and_the_readme_figures_are_what_the_json_gives():
    """docs/results.md's SmolLM2 reach tables and the README's SelfExtend figures are rendered from
    benchmarks/smollm2_reach.json by research/smollm2_reach.py (as its docstring says), not typed."""
    script = [sys.executable, str(ROOT / "research" / "smollm2_reach.py"), "--table", "benchmarks/smollm2_reach.json"]
    tables = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    cell = subprocess.run([*script, "--readme"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tables.returncode == 0 and cell.returncode == 0, tables.stderr[-2000:] + cell.stderr[-2000:]
    assert "self_extend" in tables.stdout and "| as is |" in tables.stdout
    assert tables.stdout.rstrip("\n") in (ROOT / "docs" / "results.md").read_text()
    assert cell.stdout.strip() in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_the_smollm2_fine_tune_tables_and_the_readme_sentence_are_what_the_json_gives():
    """docs/results.md's short-fine-tune tables and the README's sentence for the best fine-tuned cell are rendered
    from benchmarks/smollm2_use.json by research/smollm2_use.py, not typed; every cell has its effective reach."""
    import json

    data = json.loads((ROOT / "benchmarks" / "smollm2_use.json").read_text())
    assert all("effective_reach" in r and r["effective_reach"]["native"] == 8192 for r in data["rows"])
    assert {"as is", "self_extend", "yarn x2 + pose", "yarn x2 + pose + copies"} <= {r["method"] for r in data["rows"]}
    script = [sys.executable, str(ROOT / "research" / "smollm2_use.py"), "--table", "benchmarks/smollm2_use.json"]
    tables = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    cell = subprocess.run([*script, "--readme"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tables.returncode == 0 and cell.returncode == 0, tables.stderr[-2000:] + cell.stderr[-2000:]
    results = (ROOT / "docs" / "results.md").read_text()
    assert (
        tables.stdout.rstrip("\n")
        in results.split("<!-- smollm2-use:begin -->")[1].split("<!-- smollm2-use:end -->")[0]
    )
    assert cell.stdout.strip() in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_the_encoder_task_tables_and_the_readme_row_are_what_the_json_gives():
    """docs/results.md's long-document tables and the README's classifier/embedding row are rendered from
    benchmarks/encoder_tasks.json by research/encoder_tasks.py, not typed; every cell stayed within 2% of the
    stand-in's pretraining tokens."""
    import json

    data = json.loads((ROOT / "benchmarks" / "encoder_tasks.json").read_text())
    assert {r["task"] for r in data["rows"]} == {"mention", "both", "needle", "passkey"}
    assert all(r["budget_share"] <= 0.02 for r in data["rows"] if r["steps"])
    script = [sys.executable, str(ROOT / "research" / "encoder_tasks.py"), "--table", "benchmarks/encoder_tasks.json"]
    tables = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    row = subprocess.run([*script, "--readme"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tables.returncode == 0 and row.returncode == 0, tables.stderr[-2000:] + row.stderr[-2000:]
    results = (ROOT / "docs" / "results.md").read_text()
    between = results.split("<!-- encoder-tasks:begin -->")[1].split("<!-- encoder-tasks:end -->")[0]
    assert tables.stdout.strip() == between.strip()
    readme = next(
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| encoders, a classifier")
    )
    assert row.stdout.strip() in readme


@pytest.mark.slow
def test_the_encoder_task_variants_table_is_what_its_json_gives():
    """docs/results.md's table of the study's variants (learning rate, batch, seed) is rendered from
    benchmarks/encoder_tasks_variants.json; each variant stayed within 2% of the stand-in's pretraining tokens."""
    import json

    data = json.loads((ROOT / "benchmarks" / "encoder_tasks_variants.json").read_text())
    assert all(r["budget_share"] <= 0.02 for r in data["rows"])
    script = [sys.executable, str(ROOT / "research" / "encoder_tasks.py"), "--table"]
    tables = subprocess.run(
        [*script, "benchmarks/encoder_tasks_variants.json"], cwd=ROOT, capture_output=True, text=True
    )
    assert tables.returncode == 0, tables.stderr[-2000:]
    results = (ROOT / "docs" / "results.md").read_text()
    between = results.split("<!-- encoder-variants:begin -->")[1].split("<!-- encoder-variants:end -->")[0]
    assert tables.stdout.strip() == between.strip()


def test_the_readme_encoder_row_states_what_the_encoder_studies_measured():
    """The README's encoder row and the recipes' reasons quote benchmarks/encoders_small_*/study.json (the
    ALiBi cell at 0.5%: its masked-token ppl at 1x over the control's and its 8x/1x), not typed figures."""
    import json

    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| encoders, learned absolute"))
    for stand_in, recipe in (("bert", "bert-alibi-full"), ("roberta", "roberta-alibi-full")):
        study = json.loads((ROOT / "benchmarks" / f"encoders_small_{stand_in}" / "study.json").read_text())
        cell = next(r for r in study["table"] if r["cell"] == "alibi-full-20")
        vs, ratio = f"{cell['vs_control@1x']:.3f}x", f"{cell['ppl@8x/1x']:.3f}"
        assert vs in row and f"`recipes/{recipe}.yaml`" in row, (stand_in, vs, row)
        assert f"{vs} the continued-training control's" in (ROOT / "recipes" / f"{recipe}.yaml").read_text()
        assert f"8x/1x {ratio}" in (ROOT / "recipes" / f"{recipe}.yaml").read_text()
        if stand_in == "bert":
            assert f"8x/1x {ratio}" in row
