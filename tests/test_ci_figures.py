"""CI's check of the README's set-up figures (.ci/readme_figures.py): the minutes are bounds for an idle machine,
checked on an idle run and said but not checked when other processes took a large share of the CPU; the test
count is checked either way. And .ci/run's measure of that share: what others took, not the run's own work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # processes: the script as CI runs it

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "readme_figures.py"


def _check(monkeypatch, capsys, quickstart_s: float, tests: int, others: float) -> tuple[int, str]:
    args = ["--quickstart-s", str(quickstart_s), "--tests-s", "60", "--tests", str(tests), "--others", str(others)]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def _stated_tests() -> int:
    """The README's test count, as the script's own pattern reads it."""
    pattern = re.search(r"^SENTENCE = re\.compile\((r\".*?\"), re\.S\)", SCRIPT.read_text(), re.M).group(1)
    m = re.search(eval(pattern), (SCRIPT.parents[1] / "README.md").read_text(), re.S)  # noqa: S307 (our own literal)
    return int(m.group(3).replace(",", ""))


@pytest.mark.parametrize("busy, want", [(False, 1), (True, 0)])
def test_a_slow_quickstart_fails_the_check_only_on_an_idle_machine(busy, want, monkeypatch, capsys):
    rc, out = _check(monkeypatch, capsys, 3600, _stated_tests(), 0.6 if busy else 0.02)
    assert rc == want, out
    assert ("not checked" in out) == busy


def test_the_test_count_is_checked_on_a_busy_machine_too(monkeypatch, capsys):
    rc, out = _check(monkeypatch, capsys, 60, 10 * _stated_tests(), 0.6)
    assert rc == 1 and "tests ran; the README says about" in out


@pytest.mark.slow
def test_ci_counts_its_own_work_apart_from_other_processes(tmp_path):
    """.ci/run's cpu_snapshot: a child's CPU seconds count as the run's own (cutime), a process it did not wait
    for as another's; the share CI computes from them is what readme_figures reads as --others."""
    run = (SCRIPT.parent / "run").read_text()
    snapshot = run[run.index("cpu_snapshot() {") : run.index("\n}\n", run.index("cpu_snapshot() {")) + 3]
    script = tmp_path / "s.sh"
    script.write_text(
        snapshot
        + "a=$(cpu_snapshot)\n"
        + "python3 -c 'import time\nwhile time.process_time() < 1.0: pass'\n"  # our own child: 1 s of CPU
        + "b=$(cpu_snapshot)\necho $a $b\n"
    )
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60).stdout.split()
    m0, o0, m1, o1 = map(float, out)
    assert 0.95 < o1 - o0 < 3.0  # the child's CPU time, counted as the run's own
    assert m1 - m0 >= o1 - o0 - 0.1  # the machine's busy time includes it
