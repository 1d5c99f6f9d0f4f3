"""Sharded fine-tunes as a user launches them: `accelerate launch --config_file recipes/accelerate/X.yaml
-m retrofit finetune RECIPE`, two CPU processes over gloo.

Route taken here: Accelerate enables FSDP only on accelerator devices, so on CPU processes retrofit
switches the run to FSDP2 (`fully_shard`) with the plugin Accelerate built from the config
(`src/retrofit/training/sharding.py`). Each case is checked against one process over the same global batch:
per-step loss, validation loss, and the logits of the saved `final/` (a full, unsharded retrofit checkpoint
read back with `retrofit.load` on one process).

Research's test, beside the script that writes these differences out (`research/check_sharded.py`): both take the
models, recipe, launch and readings from `research/sharded.py` (tests/ and research/ import nothing of each other).
What needs no launch (DeepSpeed refused on CPU processes, the shipped configs) is `tests/training/test_sharded.py`.
"""

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import retrofit
import sharded as check
from retrofit.training import finetune
from sharded import EVERY, STEPS, build_models, kill_group, launch_command, launch_env, recipe

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "accelerate"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("models"))


def launch(config: str, r: dict, where: Path) -> subprocess.CompletedProcess:
    return check.launch(CONFIGS / config, r, where)


# One case per route and quirk (each launch is ~20 s of fresh processes on 2 cores): every route (FSDP2,
# FSDP2 with offload, DDP), LoRA and full, a scheme with position parameters (t5), one without (alibi),
# and a rotary model (llama, yarn buffers).
CASES = {  # id: (model, scheme, options, method, accelerate config), four of check.CASES
    case: check.CASES[case] for case in ("gpt2-t5-lora", "gpt2-alibi-full", "llama-yarn-full", "gpt2-alibi-lora-ddp")
}
ROUTES = {"fsdp.yaml": "fsdp2", "fsdp-offload.yaml": "fsdp2+offload", "ddp.yaml": "ddp"}


def test_the_cases_are_the_scripts_one_per_route():
    """The launched cases are the figures' (``check.CASES``, by id), and every accelerate config the script measures
    is launched here."""
    assert CASES and all(check.CASES[case] == spec for case, spec in CASES.items())
    assert {spec[4] for spec in CASES.values()} == {spec[4] for spec in check.CASES.values()}
    assert all((CONFIGS / spec[4]).is_file() for spec in check.CASES.values())


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder that every worker of this pytest run sees (``-n 2``: the workers' common base; alone: its
    own base), so that a launch several tests read runs once per run, not once per worker."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


def run_pair(case: str, models: Path, tmp_path_factory) -> tuple:
    """(case, two-process run folder, one-process run folder over the same global batch, the launch's
    stderr), launched by whichever worker asks first; the other waits for it on a file lock."""
    from filelock import FileLock

    model, scheme, options, method, config = CASES[case]
    where = shared_dir(tmp_path_factory, f"sharded-{case}")
    with FileLock(f"{where}.lock"):
        if not (where / "stderr.txt").is_file():
            where.mkdir(exist_ok=True)
            sharded = recipe(models / model, scheme, options, method, where / "sharded", batch_size=1)
            sharded["train"]["rank_checksums"] = True  # each rank writes a hash of the trained weights it holds
            res = launch(config, sharded, where)
            assert res.returncode == 0, res.stderr[-4000:]
            finetune(recipe(models / model, scheme, options, method, where / "single", batch_size=2))
            (where / "stderr.txt").write_text(res.stderr)
    return case, where / "sharded", where / "single", (where / "stderr.txt").read_text()


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, models, tmp_path_factory):
    return run_pair(request.param, models, tmp_path_factory)


def test_sharded_run_matches_one_process(pair):
    case, sharded, single, stderr = pair
    config = CASES[case][4]
    s = json.loads((sharded / "summary.json").read_text())
    assert s["num_processes"] == 2 and s["route"] == ROUTES[config], s
    assert len(s["peak_memory_mib"]["rss"]) == 2
    if s["route"].startswith("fsdp2"):
        assert s["parameters"]["sharded"] > 0 and s["parameters"]["unsharded"] == [], s["parameters"]
        assert "FSDP2" in stderr  # the log says which route ran
    a, b = check.losses(sharded), check.losses(single)
    assert len(a) == len(b) == STEPS
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=2e-4, rtol=0)
    assert abs(s["val_loss_after"] - json.loads((single / "summary.json").read_text())["val_loss_after"]) < 2e-4
    assert s["val_loss_after"] < s["val_loss_before"]
    ranks = [(sharded / "rank_checksums" / f"rank{i}.txt").read_text() for i in (0, 1)]
    if s["route"] == "ddp":  # replicas: both ranks end with the same trained weights
        assert ranks[0] == ranks[1], ranks
    else:  # each rank holds its own shards
        assert ranks[0] != ranks[1], ranks


def test_final_is_a_full_checkpoint_with_the_same_logits(pair):
    case, sharded, single, _ = pair
    w_sharded, w_single = (
        load_file(sharded / "final" / "model.safetensors"),
        load_file(single / "final" / "model.safetensors"),
    )
    assert w_sharded.keys() == w_single.keys()
    assert all(w_sharded[k].shape == w_single[k].shape for k in w_sharded)  # gathered, not one rank's shard
    info = retrofit.describe(retrofit.load(sharded / "final"))
    assert info["scheme"] == CASES[case][1]
    torch.testing.assert_close(check.logits(sharded / "final"), check.logits(single / "final"), atol=5e-4, rtol=0)


def test_position_parameters_are_sharded_and_saved(pair, models):
    """T5's bucket table (retrofit_positions) is in every FSDP checkpoint like any other parameter, and
    the trained table reaches final/."""
    case, sharded, single, _ = pair
    if CASES[case][1] != "t5":
        pytest.skip("a scheme with position parameters")
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = sorted((sharded / "checkpoints").glob("step_*"))[-1]
    keys = FileSystemReader(str(ckpt / "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata
    assert any("retrofit_positions" in k for k in keys), sorted(keys)[:20]
    final = load_file(sharded / "final" / "model.safetensors")
    table = [k for k in final if "retrofit_positions" in k]
    assert table
    trained_alone = load_file(single / "final" / "model.safetensors")
    from transformers import AutoModelForCausalLM

    start = retrofit.convert(AutoModelForCausalLM.from_pretrained(models / "gpt2"), "t5").state_dict()
    for k in table:
        torch.testing.assert_close(final[k], trained_alone[k], atol=5e-4, rtol=0)
        assert not torch.equal(final[k], start[k]), f"{k} did not train"


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "retrofit" in " ".join(child.cmdline()):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_kill_one_rank_then_resume_auto(models, tmp_path, tmp_path_factory):
    """SIGKILL rank 1 after the first checkpoint: the launcher stops the run; launched again with
    `resume: auto` it goes on from the last checkpoint and ends with the uninterrupted run's weights
    (the gpt2-t5-lora case's launch, the same recipe but its folder)."""
    steps = STEPS
    _, reference, _, _ = run_pair("gpt2-t5-lora", models, tmp_path_factory)

    r = recipe(models / "gpt2", "t5", {}, "lora", tmp_path / "killed", batch_size=1, steps=steps)
    r["train"]["rank_checksums"] = True  # as the reference: a debug output, not part of the training
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(r))
    out = tmp_path / "killed"
    launcher = subprocess.Popen(
        launch_command(CONFIGS / "fsdp.yaml", path),
        env=launch_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline, killed = time.time() + 300, False
    try:
        while time.time() < deadline and launcher.poll() is None and not killed:
            if (out / "checkpoints" / f"step_{EVERY:08d}").is_dir():
                pid = _rank_pid(launcher, 1)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
            time.sleep(0.01)
        launcher.wait(120)
    finally:
        kill_group(launcher)
    assert killed and launcher.returncode != 0, "the run ended before rank 1 could be killed"
    assert not (out / "final").exists() and not (out / "summary.json").exists()

    res = launch("fsdp.yaml", r, tmp_path)  # checkpoint.resume defaults to auto
    assert res.returncode == 0, res.stderr[-4000:]
    s = json.loads((out / "summary.json").read_text())
    assert EVERY <= s["resumed_from_step"] < steps, s
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if "loss" in x] == list(range(1, steps + 1))
    a, b = (
        load_file(out / "final" / "model.safetensors"),
        load_file(reference / "final" / "model.safetensors"),
    )
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed not installed (CI does not install it)"
)
def test_deepspeed_config_launched_on_cpu_is_refused(models, tmp_path):
    """The same through `accelerate launch --config_file recipes/accelerate/deepspeed-zero3.yaml`."""
    r = recipe(models / "gpt2", "alibi", {}, "lora", tmp_path / "ds", batch_size=1)
    res = launch("deepspeed-zero3.yaml", r, tmp_path)
    assert res.returncode != 0
    assert "DeepSpeed" in res.stderr and "recipes/accelerate/fsdp.yaml" in res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "ds" / "checkpoints").exists()


def test_final_from_an_fsdp_checkpoint_on_one_process(pair, tmp_path, capsys):
    """`retrofit finetune RECIPE --final-from checkpoints/step_N` reads the sharded checkpoint (DCP) on
    one process and writes the same final/ the two-process run wrote at that step."""
    case, sharded, single, _ = pair
    if CASES[case][4] != "fsdp.yaml" or CASES[case][3] != "lora":
        pytest.skip("--final-from reads an FSDP LoRA checkpoint: checked on the FSDP LoRA case, gpt2-t5-lora")
    from retrofit.cli import main

    ckpt = sharded / "checkpoints" / f"step_{STEPS:08d}"
    assert (ckpt / "pytorch_model_fsdp_0" / ".metadata").is_file()
    recipe_path = sharded.parent / "sharded.yaml"
    out = tmp_path / "again"
    assert main(["finetune", str(recipe_path), "--final-from", str(ckpt), "--set", f"output_dir={out}"]) == 0
    assert capsys.readouterr().out.strip() == str(out / "final")
    torch.testing.assert_close(check.logits(out / "final"), check.logits(sharded / "final"), atol=1e-5, rtol=0)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
