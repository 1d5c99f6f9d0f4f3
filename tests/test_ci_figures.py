"""CI's check of the README's set-up figures (.ci/readme_figures.py): the minutes are bounds for an idle machine,
checked on an idle run and said but not checked on a busy one; the test count is checked either way."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "readme_figures.py"


def _module():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(monkeypatch, capsys, quickstart_s: float, tests: int, load: float) -> tuple[int, str]:
    args = ["--quickstart-s", str(quickstart_s), "--tests-s", "60", "--tests", str(tests), "--load", str(load)]
    monkeypatch.setattr("sys.argv", ["readme_figures.py", *args])
    rc = _module().main()
    return rc, capsys.readouterr().out


def _stated_tests() -> int:
    return _module().stated((SCRIPT.parents[1] / "README.md").read_text())[2]


@pytest.mark.parametrize("busy, want", [(False, 1), (True, 0)])
def test_a_slow_quickstart_fails_the_check_only_on_an_idle_machine(busy, want, monkeypatch, capsys):
    cores = os.cpu_count() or 2
    rc, out = _check(monkeypatch, capsys, 3600, _stated_tests(), cores + 2.0 if busy else 0.5)
    assert rc == want, out
    assert ("not checked" in out) == busy


def test_the_test_count_is_checked_on_a_busy_machine_too(monkeypatch, capsys):
    rc, out = _check(monkeypatch, capsys, 60, 10 * _stated_tests(), (os.cpu_count() or 2) + 2.0)
    assert rc == 1 and "tests ran; the README says about" in out
