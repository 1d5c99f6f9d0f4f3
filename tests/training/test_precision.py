"""bf16 on a CPU without native bf16 is emulated (~15x slower): the fine-tune says so before it starts and trains
in fp32 unless the recipe insists (``train.cpu_mixed_precision: keep``); ``--plan`` says which precision it
plans; the deprecated checkpointing call is not made."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml

from retrofit.foundation import versions
from retrofit.training.model import mixed_precision
from retrofit.training.recipe import Recipe

REPO = Path(__file__).resolve().parents[2]


def _recipe(**train) -> Recipe:
    return Recipe.from_dict(
        {
            "model": {"name_or_path": "tiny-gpt2"},
            "convert": {"scheme": "alibi"},
            "data": {"dataset": "stdlib", "block_length": 64, "max_documents": 20, "max_validation_blocks": 2},
            "train": {"steps": 2, "mixed_precision": "bf16", **train},
            "output_dir": "x",
        }
    )


@pytest.fixture
def avx2_only(monkeypatch):
    monkeypatch.setattr(versions, "cpu_info", lambda: {"processor": "AVX2 CPU", "flags": ["avx2", "fma"]})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_bf16_on_a_cpu_without_native_bf16_trains_in_fp32_and_says_so(avx2_only):
    precision, why = mixed_precision(_recipe().train)
    assert precision == "no" and "emulated" in why and "cpu_mixed_precision: keep" in why


def test_the_recipe_can_insist(avx2_only):
    assert mixed_precision(_recipe(cpu_mixed_precision="keep").train) == ("bf16", None)


def test_a_cpu_with_amx_keeps_bf16(monkeypatch):
    monkeypatch.setattr(versions, "cpu_info", lambda: {"flags": ["amx_bf16", "avx2"]})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mixed_precision(_recipe().train) == ("bf16", None)


def test_plan_says_the_precision_it_plans(avx2_only, tmp_path, user_env, in_process):
    recipe = yaml.safe_load((REPO / "recipes" / "tiny-alibi-lora.yaml").read_text())
    recipe["train"]["mixed_precision"] = "bf16"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    r = in_process(["retrofit", "finetune", str(path), "--plan"], tmp_path, user_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "precision: fp32 (train.mixed_precision is bf16, but this machine has no GPU" in r.stdout


@pytest.mark.slow
def test_the_fine_tune_runs_fp32_there_with_no_deprecation_warning(avx2_only, tmp_path, caplog):
    from retrofit.training import finetune

    r = _recipe(gradient_checkpointing=True).to_dict()
    r["output_dir"] = str(tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # gradient_checkpointing_enable's deprecation
        finetune(r)
    assert "Training in fp32 instead" in caplog.text
