"""The research folder beside the package (research/: the scripts that rebuild the committed reports and their
shared harness) and the package stay apart: a research file sets no import path and imports no test; a research
script imports no other script; nothing under src/ or tests/ imports from research/, and no test under tests/ runs
a research file (research's own tests, under research/, do). Read from the files' syntax trees, not their prose."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESEARCH = ROOT / "research"
LOADERS = {"spec_from_file_location", "run_path", "SourceFileLoader", "load_source"}  # a file loaded as a module


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imported(path: Path) -> list[tuple[str, int]]:
    """(top-level module, line) of every absolute import in ``path``, those inside functions included, and of
    every ``importlib.import_module("NAME")`` / ``__import__("NAME")`` with a literal name."""
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.args[0].value.split(".")[0], node.lineno))
    return out


def _research_files() -> list[Path]:
    return sorted(RESEARCH.rglob("*.py"))


def _is_script(path: Path) -> bool:
    """A file run as ``python research/NAME.py``: it has an ``if __name__ == "__main__":`` block."""
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        for node in _tree(path).body
    )


def test_the_research_folder_holds_the_scripts_and_the_harness():
    names = {p.name for p in RESEARCH.iterdir()}
    assert {"harness.py", "study.py", "study_rounds.py", "device_check.sh", "device_check.py"} <= names
    assert not (ROOT / "scripts").exists()
    assert not (ROOT / "src" / "retrofit" / "study" / "rounds.py").exists()


def test_no_research_file_sets_an_import_path():
    """The package is installed (`pip install -e .`) and a script's own folder is on sys.path already."""
    inserting = [
        p.name
        for p in sorted(RESEARCH.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and b"sys.path.insert" in p.read_bytes()
    ]
    assert not inserting, inserting
    bad = []
    for path in _research_files():
        for node in ast.walk(_tree(path)):
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                target = next((t for t in targets if isinstance(t, ast.Attribute)), None)
            if (
                isinstance(target, ast.Attribute)
                and target.attr == "path"
                and isinstance(target.value, ast.Name)
                and target.value.id == "sys"
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, bad


def test_no_research_file_imports_a_test():
    tests = {"tests", "conftest"} | {p.stem for p in (ROOT / "tests").rglob("*.py")}
    mine = {p.stem for p in _research_files()}
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _research_files()
        for name, line in _imported(path)
        if name in tests - mine
    ]
    assert not bad, bad
    loaded = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _research_files()
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in LOADERS
    ]
    assert not loaded, loaded


def test_no_research_script_imports_another():
    """What scripts share lives in research/harness.py (or a module of the folder that is not run, such as
    study_rounds.py); a research test may import the script it checks."""
    scripts = {p.stem for p in _research_files() if _is_script(p)}
    assert {"study", "check_sharded", "compare_distill", "compare_dropout"} <= scripts
    assert not scripts & {"harness", "study_rounds"}
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _research_files()
        if path.stem in scripts
        for name, line in _imported(path)
        if name in scripts - {path.stem}
    ]
    assert not bad, bad


def test_nothing_in_src_or_tests_imports_from_research():
    research = {"research"} | {p.stem for p in _research_files()}
    files = sorted((ROOT / "src").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    bad = [f"{f.relative_to(ROOT)}:{line}: {name}" for f in files for name, line in _imported(f) if name in research]
    assert not bad, bad
    loaded = [
        f"{f.relative_to(ROOT)}:{node.lineno}"
        for f in files
        for node in ast.walk(_tree(f))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in LOADERS
    ]
    assert not loaded, loaded


def test_every_research_path_named_exists():
    """Docs, records' readers, docstrings and tests name research files that are there."""
    texts = [ROOT / "README.md", ROOT / "standins" / "README.md", *(ROOT / "docs").glob("*.md")]
    texts += [*(ROOT / "benchmarks").glob("*.md"), *(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    texts += [*_research_files(), ROOT / ".ci" / "run"]
    named = {
        (m.group(0), f.relative_to(ROOT))
        for f in texts
        for m in re.finditer(r"\bresearch/[a-z0-9_/]+\.(?:py|sh)\b", f.read_text())
    }
    missing = sorted(f"{where}: {path}" for path, where in named if not (ROOT / path).is_file())
    assert not missing, missing
    assert len(named) > 20


def test_check_sharded_measures_the_cases_the_test_checks():
    """research/check_sharded.py and research/test_sharded.py take the models, recipe, launch and readings from one
    place, ``research/sharded.py`` (research's, not the package's: the package holds no code only research and its
    tests run), and define none of them again; the test checks that it launches one case per route the script
    measures (``test_the_cases_are_the_scripts_one_per_route``)."""
    shared = {"STEPS", "EVERY", "FILES", "CASES", "build_models", "recipe", "launch_command", "losses", "logits"}

    def defined(path: Path) -> set[str]:
        out = set()
        for node in _tree(path).body:
            if isinstance(node, ast.FunctionDef):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                out |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        return out

    def imports_it(path: Path) -> bool:
        return "sharded" in {name for name, _ in _imported(path)}

    script, test = RESEARCH / "check_sharded.py", RESEARCH / "test_sharded.py"
    assert shared <= defined(RESEARCH / "sharded.py")
    assert imports_it(script) and imports_it(test)
    assert not defined(script) & (shared - {"CASES"}), defined(script) & shared
    assert not defined(test) & (shared - {"CASES"}), defined(test) & shared  # its CASES: a subset, by id
    assert "test_the_cases_are_the_scripts_one_per_route" in defined(test)
    assert not (ROOT / "src" / "retrofit" / "training" / "sharded_check.py").exists()


def test_the_session_cache_is_made_in_one_place():
    """tests/ and research/ set up their session cache with the root conftest.py's ``seeded_cache`` (test-only code:
    not the package's; neither folder imports the other, both are under the rootdir whose conftest pytest loads)."""

    def defines(path: Path) -> set[str]:
        return {n.name for n in _tree(path).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    assert {"seeded_cache", "_seeded_cache"} <= defines(ROOT / "conftest.py")
    assert not {"seeded_cache", "_seeded_cache"} & (
        defines(ROOT / "tests" / "conftest.py") | defines(RESEARCH / "conftest.py")
    )
    from retrofit.models import assets

    assert not hasattr(assets, "seeded_cache")


def test_no_product_test_starts_a_research_file():
    """The README's test line (``tests/``) checks the product: a test that runs a research script as a process
    (a table rendered from a committed record, a GPU check's dry run) is research's own, under research/ (run by
    CI with ``python -m pytest research``). Read as: a test function that starts a process and names research/."""
    starters = {"run", "Popen", "check_output", "check_call", "call"}

    def names_research(node: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and (n.value == "research" or re.fullmatch(r"research/\S+\.(?:py|sh)", n.value))
            for n in ast.walk(node)
        )

    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for fn in ast.walk(_tree(path)):
            if not isinstance(fn, ast.FunctionDef):
                continue
            starts = any(
                isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in starters
                for n in ast.walk(fn)
            )
            if starts and names_research(fn):
                bad.append(f"{path.relative_to(ROOT)}:{fn.lineno}: {fn.name}")
    assert not bad, bad
