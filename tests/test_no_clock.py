"""No test asserts wall-clock time: a busy machine would fail it. Speed is measured in benchmarks/ (ratios side
by side in one process, the CPU recorded); a test checks the cause (e.g. no torch imported, no retry made)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCKS = {"perf_counter", "time", "monotonic", "process_time"}


def _clock_names(tree: ast.AST) -> set[str]:
    """Names assigned from a clock call (t0 = time.perf_counter())."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Attribute) and f.attr in CLOCKS:
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _asserts_on_clock(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    clocked = _clock_names(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for sub in ast.walk(node.test):
            call = isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in CLOCKS
            if call or (isinstance(sub, ast.Name) and sub.id in clocked | {"seconds", "elapsed"}):
                lines.append(node.lineno)
                break
    return lines


def test_no_test_asserts_wall_clock_time():
    found = {
        str(p.relative_to(ROOT)): ln
        for p in sorted((ROOT / "tests").rglob("test_*.py"))
        if (ln := _asserts_on_clock(p))
    }
    assert not found, f"wall-clock assertions (measure speed in benchmarks/, check the cause in tests): {found}"
