"""The prepared GPU check (research/device_check.sh): without a GPU it says so and exits 0; its dry run executes
the same code on the CPU and writes the JSON and the table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
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
