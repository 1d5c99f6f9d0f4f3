"""Sharded fine-tunes, what needs no launch: DeepSpeed on CPU processes refused with what to use instead, the shipped
Accelerate configs parse. The launches themselves (two CPU processes over gloo against one process, a rank killed
and resumed, ``--final-from`` an FSDP checkpoint) are research's tests (``research/test_sharded.py``, run by CI
with ``python -m pytest research``): their harness (``research/sharded.py``) is shared with the script that writes
their figures, and research and tests import nothing of each other."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "recipes" / "accelerate"


def test_deepspeed_on_cpu_processes_is_refused_clearly(monkeypatch):
    """Accelerate runs DeepSpeed on GPUs only: on CPU processes (cpu=True) it would run DDP without
    saying so. The run stops with a RecipeError (exit code 2) that says what to use instead."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from retrofit.foundation.errors import RecipeError
    from retrofit.training import sharding

    acc = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, num_processes=2)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(RecipeError, match="recipes/accelerate/fsdp.yaml"):
        sharding.cpu_route(acc, "no")
    assert RecipeError.exit_code == 2


def test_shipped_accelerate_configs_parse():
    from accelerate.commands.config.config_args import load_config_from_file

    names = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert names == ["ddp.yaml", "deepspeed-zero3.yaml", "fsdp-offload.yaml", "fsdp.yaml"]
    for name in names:
        cfg = load_config_from_file(str(CONFIGS / name))
        assert cfg.num_processes == 2
    assert load_config_from_file(str(CONFIGS / "fsdp.yaml")).fsdp_config["fsdp_version"] == 2
