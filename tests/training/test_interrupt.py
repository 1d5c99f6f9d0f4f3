"""Ctrl-C during `retrofit finetune` saves a checkpoint where it stopped and says which step a re-run
resumes from; the re-run goes on from there (issue 44, item 6)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _recipe(tmp_path: Path) -> Path:
    r = yaml.safe_load((ROOT / "recipes" / "tiny-alibi-lora.yaml").read_text())
    r["output_dir"] = str(tmp_path / "run")
    r["train"].update(steps=400, eval_every=0, log_every=1)
    r["checkpoint"] = {"every": 1000, "keep_last": 1, "resume": "auto"}  # no checkpoint before the interrupt
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _logged_steps(run: Path) -> int:
    log = run / "log.jsonl"
    if not log.is_file():
        return 0
    return max((json.loads(ln).get("step", 0) for ln in log.read_text().splitlines() if ln.strip()), default=0)


def test_ctrl_c_saves_where_it_stopped_and_the_same_command_resumes(tmp_path, user_env, in_process):
    recipe = _recipe(tmp_path)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "retrofit", "finetune", str(recipe)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=user_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while _logged_steps(run) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    saved = sorted((run / "checkpoints").glob("step_*"))
    assert len(saved) == 1, err[-3000:]
    step = int(saved[0].name.split("_")[1])
    assert step >= 3 and step == _logged_steps(run), (step, _logged_steps(run))
    assert f"interrupted after step {step} of 400" in err and "the same command resumes from it" in err, err[-2000:]
    assert "\nretrofit finetune: interrupted" in err

    # the same command again (the signal needed a process; what the re-run resumes does not), shortened
    r = in_process(["retrofit", "finetune", str(recipe), "--set", f"train.steps={step + 2}"], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == step and summary["steps"] == step + 2
