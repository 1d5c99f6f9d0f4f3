"""`retrofit finetune RECIPE --final-from CHECKPOINT` on DeepSpeed ZeRO-3 checkpoints.

Accelerate runs DeepSpeed on GPUs only, so CI cannot train through it here. The ZeRO-3 layout is written
by hand (as DeepSpeed writes it: fp32 flat partitions per rank in the optimizer files, frozen fragments and
buffers in the model files) and read back; where DeepSpeed is installed, a checkpoint written by
DeepSpeed itself (ZeRO-3 on two CPU processes over gloo) is read too.
"""

import enum
import importlib.util
import math
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import yaml

import retrofit
from retrofit.cli import main
from retrofit.foundation.errors import RetrofitError
from retrofit.training import consolidate
from retrofit.training.outputs import rebuilt
from retrofit.training.recipe import Recipe

WORLD = 2


def _recipe(tmp_path, scheme="t5") -> Path:
    r = {
        "model": {"name_or_path": "tiny-gpt2"},
        "convert": {"scheme": scheme, "options": {}},
        "data": {"dataset": "stdlib"},
        "train": {"method": "lora", "lora": {"r": 4, "alpha": 8}, "train_norms": True},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _trained(path: Path):
    """The model the recipe builds, its trainable weights moved off their start (a 'trained' model)."""
    model, _ = rebuilt(Recipe.from_yaml(path))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _partition(t: torch.Tensor, rank: int) -> torch.Tensor:
    flat = t.detach().float().flatten()
    part = math.ceil(flat.numel() / WORLD)
    flat = torch.cat([flat, flat.new_zeros(part * WORLD - flat.numel())])
    return flat[rank * part : (rank + 1) * part].clone()


class Stage(enum.IntEnum):  # stands for DeepSpeed's ZeroStageEnum: an object weights_only refuses
    weights = 3


def write_zero3(model, folder: Path, enum_stage: bool = False) -> None:
    """The ZeRO-3 layout of `model` over WORLD ranks: trainable parameters in two groups."""
    folder.mkdir(parents=True)
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    frozen = [(n, p) for n, p in named if not p.requires_grad]
    groups = [trainable[: len(trainable) // 2], trainable[len(trainable) // 2 :]]
    buffers = {n: b for n, b in model.named_buffers() if n in model.state_dict()}
    by_ptr = {p.data_ptr(): n for n, p in named}
    shared = {
        k: by_ptr[v.data_ptr()]
        for k, v in model.state_dict().items()  # tied weights, as DeepSpeed records them
        if k not in dict(named) and k not in buffers and v.data_ptr() in by_ptr
    }
    for rank in range(WORLD):
        states = {
            "module": dict(buffers) if rank == 0 else {},
            "buffer_names": list(buffers),
            "param_shapes": [OrderedDict((n, p.shape) for n, p in g) for g in groups],
            "frozen_param_shapes": OrderedDict((n, p.shape) for n, p in frozen),
            "frozen_param_fragments": {n: _partition(p, rank) for n, p in frozen},
            "shared_params": shared,
            "ds_version": "0.19.8",
        }
        torch.save(states, folder / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
        optim = {
            "optimizer_state_dict": {
                "zero_stage": Stage.weights if enum_stage else 3,
                "partition_count": WORLD,
                "fp32_flat_groups": [torch.cat([_partition(p, rank) for _, p in g]) for g in groups],
            }
        }
        torch.save(optim, folder / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


def _logits(model):
    ids = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


@pytest.mark.parametrize("scheme", ["t5", "alibi"])
def test_final_from_a_zero3_checkpoint_written_by_hand(tmp_path, capsys, scheme):
    path = _recipe(tmp_path, scheme)
    model = _trained(path)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000010"
    write_zero3(model, ckpt / "pytorch_model")
    assert consolidate.layout(ckpt) == "zero3"
    state = consolidate.read(ckpt, model.state_dict())
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v.float()), k
    assert main(["finetune", str(path), "--final-from", str(ckpt)]) == 0
    final = Path(capsys.readouterr().out.strip())
    assert final == tmp_path / "run" / "final"
    loaded = retrofit.load(final)
    assert retrofit.describe(loaded)["scheme"] == scheme
    torch.testing.assert_close(_logits(loaded), _logits(model.merge_and_unload()), atol=1e-5, rtol=0)


def test_pickled_objects_need_trust_pickle(tmp_path):
    path = _recipe(tmp_path)
    model = _trained(path)
    ckpt = tmp_path / "ck"
    write_zero3(model, ckpt / "pytorch_model", enum_stage=True)
    with pytest.raises(RetrofitError, match="--trust-pickle"):
        consolidate.read(ckpt, model.state_dict())
    state = consolidate.read(ckpt, model.state_dict(), trust_pickle=True)
    assert all(torch.equal(state[k], v.float()) for k, v in model.state_dict().items())


def test_mismatched_files_and_unknown_folders_fail_clearly(tmp_path):
    path = _recipe(tmp_path)
    model = _trained(path)
    ckpt = tmp_path / "ck"
    write_zero3(model, ckpt / "pytorch_model")
    (ckpt / "pytorch_model" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(RetrofitError, match="optimizer-state files"):
        consolidate.read(ckpt, model.state_dict())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["finetune", str(path), "--final-from", str(empty)]) == 2
    assert not (tmp_path / "run" / "final").exists()


WORKER = """
import os, sys, torch, deepspeed
from retrofit.training.outputs import rebuilt
from retrofit.training.recipe import Recipe
from safetensors.torch import save_file
model, _ = rebuilt(Recipe.from_yaml(sys.argv[1]))
g = torch.Generator().manual_seed(5)
with torch.no_grad():
    for p in model.parameters():
        if p.requires_grad:
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
reference = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "zero_force_ds_cpu_optimizer": False}
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
engine.save_checkpoint(sys.argv[2], "pytorch_model")
if os.environ["RANK"] == "0":
    save_file(reference, sys.argv[2] + "/reference.safetensors")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed not installed (CI does not install it)"
)
def test_final_from_a_checkpoint_deepspeed_wrote(tmp_path):
    """ZeRO-3 run by DeepSpeed itself on two CPU processes (gloo), saved, read back exactly."""
    from safetensors.torch import load_file

    path = _recipe(tmp_path)
    (tmp_path / "worker.py").write_text(WORKER)
    ckpt = tmp_path / "ck"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(WORLD),
            str(tmp_path / "worker.py"),
            str(path),
            str(ckpt),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    reference = load_file(ckpt / "reference.safetensors")
    with pytest.raises(RetrofitError, match="--trust-pickle"):  # DeepSpeed pickles its ZeroStageEnum
        consolidate.read(ckpt, reference)
    state = consolidate.read(ckpt, reference, trust_pickle=True)
    assert state.keys() == reference.keys()
    for k in reference:
        assert torch.equal(state[k], reference[k].float()), k
