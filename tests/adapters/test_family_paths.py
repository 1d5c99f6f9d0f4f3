"""A user's path on each decoder family users bring (issue 42): a tiny model saved as a folder with a tokenizer,
``retrofit convert FOLDER --to alibi --out RUN`` as typed, ``retrofit finetune`` for two steps from that
checkpoint, ``retrofit eval RUN --quick`` (1x, 2x, 4x native), and ``retrofit export RUN --native``: exact where a
native architecture holds ALiBi (bloom, mpt), else refused with the reason. In-process (``retrofit.cli.main``),
one model per family."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
import yaml

from retrofit.cli import main
from retrofit.models.builtin import byte_tokenizer
from retrofit.native_export.base import MAPPINGS

from ..tiny import GPTJ_LAYOUT, NATIVE, _llama_like
from .test_structure import CLAIMED

MOE = dict(num_local_experts=4, num_experts_per_tok=2)


def _small(config_cls, model_cls, vocab, **extra):
    last = vocab - 1  # the byte tokenizer's one special token
    ids = dict(pad_token_id=last, bos_token_id=last, eos_token_id=last)
    return _llama_like(config_cls, model_cls, vocab_size=vocab, **ids, **extra)()


def _gpt(config_cls, model_cls, vocab, **extra):
    cfg = config_cls(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=NATIVE, **extra)
    cfg.pad_token_id = cfg.bos_token_id = cfg.eos_token_id = vocab - 1
    return model_cls(cfg)


def _falcon(vocab, **extra):
    last = vocab - 1
    cfg = tf.FalconConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **extra)
    cfg.max_position_embeddings, cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = NATIVE, last, last, last
    return tf.FalconForCausalLM(cfg)


FAMILIES = {  # family: (model factory taking the vocab size, whether a native export exists for alibi)
    "gpt_bigcode": lambda v: _gpt(tf.GPTBigCodeConfig, tf.GPTBigCodeForCausalLM, v, multi_query=True),
    "gptj": lambda v: _gpt(tf.GPTJConfig, tf.GPTJForCausalLM, v, rotary_dim=8, n_inner=128),
    "bloom": lambda v: tf.BloomForCausalLM(
        tf.BloomConfig(vocab_size=v, hidden_size=64, n_layer=2, n_head=4, seq_length=NATIVE, pad_token_id=v - 1)
    ),
    "gemma2": lambda v: _small(tf.Gemma2Config, tf.Gemma2ForCausalLM, v, head_dim=16, attn_logit_softcapping=5.0),
    "gemma3_text": lambda v: _small(
        tf.Gemma3TextConfig,
        tf.Gemma3ForCausalLM,
        v,
        head_dim=16,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
    ),
    "gpt_oss": lambda v: _small(tf.GptOssConfig, tf.GptOssForCausalLM, v, head_dim=16, **MOE),
    # the LLaMA layout, by type and by structure (the probe first)
    "llama": lambda v: _small(tf.LlamaConfig, tf.LlamaForCausalLM, v),
    "mistral": lambda v: _small(tf.MistralConfig, tf.MistralForCausalLM, v, sliding_window=24),
    "qwen2": lambda v: _small(tf.Qwen2Config, tf.Qwen2ForCausalLM, v),
    "qwen3": lambda v: _small(tf.Qwen3Config, tf.Qwen3ForCausalLM, v, head_dim=16),
    "granite": lambda v: _small(tf.GraniteConfig, tf.GraniteForCausalLM, v),
    "olmo": lambda v: _small(tf.OlmoConfig, tf.OlmoForCausalLM, v),
    "starcoder2": lambda v: _small(tf.Starcoder2Config, tf.Starcoder2ForCausalLM, v, sliding_window=24),
    "qwen3_moe": lambda v: _small(
        tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, v, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    ),
    "falcon": lambda v: _falcon(v),
    "mpt": lambda v: tf.MptForCausalLM(
        tf.MptConfig(vocab_size=v, d_model=64, n_layers=2, n_heads=4, max_seq_len=NATIVE, pad_token_id=v - 1)
    ),
    "falcon-alibi": lambda v: _falcon(v, alibi=True),
}


# the LLaMA-layout types test_structure.py claims by structure (MoE, partial, interleaved and reversed rotary,
# layers without positions, MLA): the same tiny configs, here on the user's path
for _t in ("mixtral", "qwen2_moe", "gemma", "phi", "phi3", "stablelm", "cohere", "smollm3", "deepseek_v3"):
    FAMILIES[_t] = lambda v, _c=CLAIMED[_t]: _small(_c[0], _c[1], v, **_c[2])

if GPTJ_LAYOUT:  # codegen beside gptj where this transformers rotates GPT-J outside its attention
    FAMILIES["codegen"] = lambda v: _gpt(tf.CodeGenConfig, tf.CodeGenForCausalLM, v, rotary_dim=8, n_inner=128)
else:
    FAMILIES.pop("gptj")


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_convert_finetune_eval_on_each_new_family(family, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tok = byte_tokenizer()
    torch.manual_seed(0)
    FAMILIES[family](len(tok)).save_pretrained("src")
    tok.save_pretrained("src")
    assert main(["convert", "src", "--to", "alibi", "--out", "run"]) == 0
    recipe = {
        "model": {"name_or_path": "run"},
        "convert": {"scheme": "alibi"},
        "data": {"dataset": "stdlib", "max_documents": 4, "block_length": NATIVE, "max_validation_blocks": 2},
        "train": {"method": "lora", "steps": 2, "batch_size": 2, "eval_every": 2},
        "output_dir": "run",
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["finetune", "recipe.yaml"]) == 0
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert main(["eval", "run", "--quick", "--no-plots", "--budget", "1024"]) == 0  # the quick default: test_cli_quick
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["settings"]["lengths"][-1] == 4 * NATIVE
    far = [r for r in report["rows"] if r["length"] == 4 * NATIVE and r["method"] == "non-overlapping"]
    assert far and all(0 < r["ppl"] < 1e4 for r in far), report["rows"]  # it runs at 4x, finite
    family = json.loads((tmp_path / "run" / "final" / "config.json").read_text())["retrofit"]["architecture"]
    code = main(["export", "run", "--native", "--out", "exported"])
    if f"{family}+alibi" in MAPPINGS and family != "falcon":  # Falcon holds ALiBi only before the scaling
        assert code == 0 and (tmp_path / "exported" / "config.json").is_file()
    else:
        assert code != 0 and not (tmp_path / "exported").exists()
