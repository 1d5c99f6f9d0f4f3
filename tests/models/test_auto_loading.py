"""A converted model outside retrofit's own calls: plain transformers loading (subfolders, refused
arguments, old checkpoints), multi-process saving, and a model whose native RoPE reads the config."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import transformers as tf

import retrofit
from retrofit.foundation.errors import RetrofitError
from retrofit.models.builtin import TINY_LLAMA

from ..tiny import NATIVE, TINY, ids


def test_dynamic_native_rope_is_untouched_by_the_advertised_reach():
    """Dynamic RoPE reads max_position_embeddings as its native length: the converted config's
    'no limit' must not reach it (it overflowed a torch.tensor), while fading or after revert."""
    cfg = tf.LlamaConfig(
        vocab_size=128,
        **TINY_LLAMA,
        max_position_embeddings=NATIVE,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    model = tf.LlamaForCausalLM(cfg).eval()
    x = ids(1, 3 * NATIVE)
    with torch.no_grad():
        before = model(x).logits
        retrofit.convert(model, "alibi")
        assert model(x).logits.shape[1] == 3 * NATIVE
        retrofit.set_position_controls(model, native_fade=0.5)
        model(x)
        retrofit.set_position_controls(model)
        retrofit.revert(model)
        assert torch.equal(model(x).logits, before)
    assert model.model.rotary_emb.config is model.config


def test_save_pretrained_from_a_non_main_process(tmp_path):
    model = retrofit.convert(TINY["gpt2"](), "alibi")
    model.save_pretrained(tmp_path / "m", is_main_process=False)  # other ranks write no config: no error
    model.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "retrofit"


def test_auto_loading_honours_subfolder_and_refuses_what_it_cannot_honour(tmp_path):
    retrofit.save(retrofit.convert(TINY["gpt2"](), "alibi"), tmp_path / "repo" / "step2")
    model = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "repo", subfolder="step2", dtype=torch.float32)
    assert retrofit.describe(model)["scheme"] == "alibi"
    with pytest.raises(RetrofitError, match="quantization_config"):  # refused, never dropped silently
        tf.AutoModelForCausalLM.from_pretrained(tmp_path / "repo" / "step2", quantization_config={"bits": 4})


def test_an_older_checkpoint_is_pushed_marked(tmp_path):
    """Saved before configs were marked (model_type gpt2, no base_config): retrofit.load reads it, and push
    stages a marked config.json so the Hub copy never loads as the original; the folder is untouched."""
    from retrofit.publishing.hub import stage

    retrofit.save(retrofit.convert(TINY["gpt2"](), "alibi"), tmp_path / "new")
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "new", old)
    d = json.loads((old / "config.json").read_text())
    d["n_positions"] = d["retrofit"].pop("base_config")["n_positions"]
    d["model_type"], d["architectures"] = "gpt2", ["GPT2LMHeadModel"]
    (old / "config.json").write_text(json.dumps(d))
    x = ids(1, 2 * NATIVE)
    with torch.no_grad():
        assert torch.equal(retrofit.load(old)(x).logits, retrofit.load(tmp_path / "new")(x).logits)
    staged = stage([(p.name, p) for p in old.iterdir() if p.is_file()], tmp_path / "staged")
    assert json.loads((staged / "config.json").read_text())["model_type"] == "retrofit"
    assert retrofit.describe(tf.AutoModelForCausalLM.from_pretrained(staged))["scheme"] == "alibi"
    assert json.loads((old / "config.json").read_text())["model_type"] == "gpt2"


@pytest.mark.slow
def test_a_failed_registration_leaves_transformers_working(tmp_path):
    code = (
        "import retrofit.models.auto as a\n"
        "def boom(m): raise RuntimeError('api changed')\n"
        "a._AFTER[a._CONFIG_AUTO] = boom\n"
        "from transformers import AutoConfig, AutoTokenizer\n"
        "print('transformers ok')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2] / "src")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "transformers ok" in r.stdout, r.stderr[-2000:]
    assert "could not register" in r.stderr
