"""The committed records' renderings and the research scripts' own runs, each started as a process as documented
(``python research/NAME.py``): docs/results.md's and the README's tables are what the scripts print from the
committed JSONs (not typed), the memory table is what the formula prints, and the prepared GPU check runs (without
a GPU it says so and exits 0; its dry run executes the same code on the CPU and writes the JSON and the table).
Moved here from tests/ (#59): the package's tests start no research script."""

import json
import re
import subprocess
import sys

from harness import ROOT


def _rendered(script: str, record: str, *flags: str) -> list[str]:
    """``python research/SCRIPT --table benchmarks/RECORD [FLAG]``'s stdout, once per flag ('' = the tables)."""
    out = []
    for flag in flags:
        command = [sys.executable, str(ROOT / "research" / script), "--table", f"benchmarks/{record}", flag]
        r = subprocess.run([c for c in command if c], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        out.append(r.stdout)
    return out


def _block(name: str) -> str:
    """docs/results.md between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``."""
    results = (ROOT / "docs" / "results.md").read_text()
    return results.split(f"<!-- {name}:begin -->")[1].split(f"<!-- {name}:end -->")[0]


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


# the kernel rounds of issue #71 whose tables docs/results.md keeps: folder -> rows its table must hold
TWO_VIEW = ("self_extend (LLaMA body)", "string (LLaMA body)")
EVERY_KERNEL = ("| alibi |", "| t5 |", "| fire |", "| xl | train step |", *TWO_VIEW)
KERNEL_ROUNDS = {
    "benchmarks/kernel_round11": EVERY_KERNEL,
    "benchmarks/kernel_round11_steady": ("| xl | train step |",),
    "benchmarks/kernel_round12": EVERY_KERNEL,
    "benchmarks/kernel_round12_steady": EVERY_KERNEL,
    "benchmarks/kernel_round12b": TWO_VIEW,  # after the rotation's temporaries went
    "benchmarks/kernel_round12b_steady": TWO_VIEW,
    "benchmarks/kernel_round13": ("| alibi |", "| t5 |", "| fire |", "| xl | train step |"),  # XL's table compressed
    "benchmarks/kernel_round13_steady": ("| alibi |", "| t5 |", "| fire |", "| xl | train step |"),
    "benchmarks/kernel_round13b": ("| t5 |", "| xl | train step |", *TWO_VIEW),  # the figures near a line, again
    "benchmarks/kernel_round14": EVERY_KERNEL,  # SelfExtend's near band in one call
    "benchmarks/kernel_round14_steady": ("| alibi |", "| t5 |", "| fire |", "| xl | train step |"),
    "benchmarks/kernel_round14b": ("| t5 |", *TWO_VIEW),  # at the closing kernels
}


def test_the_latest_kernel_rounds_in_results_are_what_their_jsons_give():
    """docs/results.md's round 11, 12 and 13 tables (issue #71; glibc's default malloc, and a steady one) are what
    research/kernel_table.py prints from their JSONs."""
    for folder, rows in KERNEL_ROUNDS.items():
        r = subprocess.run(
            [sys.executable, str(ROOT / "research" / "kernel_table.py"), folder],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        table = "\n".join(r.stdout.rstrip("\n").splitlines()[2:])
        assert all(row in table for row in rows), (folder, table)
        assert table in (ROOT / "docs" / "results.md").read_text(), folder


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


def test_the_smollm2_fine_tune_tables_and_the_readme_sentence_are_what_the_json_gives():
    """docs/results.md's short-fine-tune tables and the README's sentence for the best fine-tuned cell are rendered
    from benchmarks/smollm2_use.json by research/smollm2_use.py, not typed; every cell has its effective reach."""
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


def test_the_encoder_task_tables_and_the_readme_row_are_what_the_json_gives():
    """docs/results.md's long-document tables and the README's classifier/embedding row are rendered from
    benchmarks/encoder_tasks.json by research/encoder_tasks.py, not typed; every cell stayed within 2% of the
    stand-in's pretraining tokens."""
    data = json.loads((ROOT / "benchmarks" / "encoder_tasks.json").read_text())
    assert {r["task"] for r in data["rows"]} == {"mention", "both", "needle", "passkey"}
    assert all(r["budget_share"] <= 0.02 for r in data["rows"] if r["steps"])
    tables, row = _rendered("encoder_tasks.py", "encoder_tasks.json", "", "--readme")
    assert tables.strip() == _block("encoder-tasks").strip()
    readme = next(
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| encoders, a classifier")
    )
    assert row.strip() in readme


def test_the_encoder_task_variants_table_is_what_its_json_gives():
    """docs/results.md's table of the study's variants (learning rate, batch, seed) is rendered from
    benchmarks/encoder_tasks_variants.json; each variant stayed within 2% of the stand-in's pretraining tokens."""
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


def test_docs_memory_table_is_what_the_formula_prints():
    res = subprocess.run(
        [sys.executable, str(ROOT / "research" / "memory_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_device_check_without_a_gpu_and_its_dry_run(tmp_path, user_env):
    r = subprocess.run(
        ["bash", str(ROOT / "research" / "device_check.sh")],
        env={**user_env, "OUT": str(tmp_path / "x")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "no CUDA GPU" in r.stdout, r.stderr[-2000:]
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "research" / "device_check.py"),
            "--dry-run",
            "--schemes",
            "alibi,t5",
            "--out",
            str(tmp_path / "dry"),
        ],
        env=user_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads((tmp_path / "dry" / "device_check.json").read_text())
    assert {c["scheme"] for c in record["correctness"]} == {"alibi", "t5"}
    assert all(c["relative"] < 1e-4 for c in record["correctness"])  # fp32 on the CPU: the kernels agree
    assert {(s["mode"], s["length"]) for s in record["speed"]} == {
        (m, L) for m in ("forward", "train") for L in (128, 256)
    }
    assert record["finetune"]["tokens_per_s"] > 0 and "cpu" in record["device"]
    assert "| alibi |" in (tmp_path / "dry" / "device_check.md").read_text()


def test_the_minilm_grid_tables_and_the_readme_figures_are_what_the_json_gives():
    """docs/results.md's all-MiniLM-L6-v2 tables and the README's real-model figures are rendered from
    benchmarks/minilm_grid.json by research/minilm_grid.py, not typed; every fine-tune stayed within 30 CPU-minutes
    and every cell says its CPU."""
    data = json.loads((ROOT / "benchmarks" / "minilm_grid.json").read_text())
    assert all((e.get("fine_tune") or {}).get("cpu_minutes", 0) <= 30 for e in data["cells"])
    assert all(e["cpu"] for e in data["cells"]) and data["hardware"]["processor"]
    script = [sys.executable, str(ROOT / "research" / "minilm_grid.py"), "--table", "benchmarks/minilm_grid.json"]
    tables = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    row = subprocess.run([*script, "--readme"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tables.returncode == 0 and row.returncode == 0, tables.stderr[-2000:] + row.stderr[-2000:]
    results = (ROOT / "docs" / "results.md").read_text()
    between = results.split("<!-- minilm-grid:begin -->")[1].split("<!-- minilm-grid:end -->")[0]
    assert tables.stdout.strip() == between.strip()
    assert row.stdout.strip() in (ROOT / "README.md").read_text()
    # the model docs/encoders.md tells users to rebuild and serve is the README's cell, and a cell of the grid
    rebuilt = re.findall(r'minilm_grid\.py --cells "([^"]+)"', (ROOT / "docs" / "encoders.md").read_text())
    assert rebuilt and all(f"), {name} after" in row.stdout for name in rebuilt), (rebuilt, row.stdout[:200])


def test_the_smollm2_far_tables_and_the_readme_words_are_what_the_json_gives():
    """docs/results.md's 4x tables and the README's words for the 2x adapter read at 32k are rendered from
    benchmarks/smollm2_far.json by research/smollm2_far.py, not typed; every row holds the out-of-domain ppl."""
    data = json.loads((ROOT / "benchmarks" / "smollm2_far.json").read_text())
    assert {"as is", "yarn x4 + pose (2x round)"} <= {r["method"] for r in data["rows"]}
    assert all(set(r["ppl_1x_other_domains"]) == {"pydoc prose", "stdlib code"} for r in data["rows"])
    script = [sys.executable, str(ROOT / "research" / "smollm2_far.py"), "--table", "benchmarks/smollm2_far.json"]
    tables = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    cell = subprocess.run([*script, "--readme"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tables.returncode == 0 and cell.returncode == 0, tables.stderr[-2000:] + cell.stderr[-2000:]
    results = (ROOT / "docs" / "results.md").read_text()
    assert (
        tables.stdout.rstrip("\n")
        in results.split("<!-- smollm2-far:begin -->")[1].split("<!-- smollm2-far:end -->")[0]
    )
    assert cell.stdout.strip() in (ROOT / "README.md").read_text()
    swaps = subprocess.run([*script, "--readme-swaps"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert swaps.returncode == 0, swaps.stderr[-2000:]
    schemes = [((r.get("fine_tune") or {}).get("recipe") or {}).get("convert", {}).get("scheme") for r in data["rows"]]
    lines = swaps.stdout.strip().splitlines()
    assert len(lines) == sum(s in ("alibi", "nope") for s in schemes)  # each swap measured is in the README
    assert all(line in (ROOT / "README.md").read_text() for line in lines)
    tuned = subprocess.run([*script, "--readme-tuned"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    lines = tuned.stdout.strip().splitlines()
    assert len(lines) == schemes.count("rope")  # each fine-tuned rescaled RoPE cell measured is in the README
    assert all(line in (ROOT / "README.md").read_text() for line in lines)
    free = subprocess.run([*script, "--readme-free"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0, free.stderr[-2000:]
    methods = [r["method"] for r in data["rows"] if not r.get("fine_tune")]
    lines = free.stdout.strip().splitlines()
    assert len(lines) == sum(m.startswith(("self_extend", "string")) for m in methods)  # each measured is said
    assert all(line in (ROOT / "README.md").read_text() for line in lines)


def test_the_smollm2_far_prose_table_and_the_readme_words_are_what_the_json_gives():
    """The same probes on held-out English prose (#68: another domain than the fine-tunes'): docs/results.md's
    block and the README's words are research/smollm2_far.py's rendering of benchmarks/smollm2_far_prose.json."""
    data = json.loads((ROOT / "benchmarks" / "smollm2_far_prose.json").read_text())
    assert "prose" in data["data"] and "--text prose" in data["command"]
    tables, words = _rendered("smollm2_far.py", "smollm2_far_prose.json", "", "--readme-prose")
    assert tables.rstrip("\n") in _block("smollm2-far-prose")
    lines = words.strip().splitlines()
    assert len(lines) == sum(bool(r.get("fine_tune")) for r in data["rows"])  # each fine-tuned cell is said
    assert all(line in (ROOT / "README.md").read_text() for line in lines)
