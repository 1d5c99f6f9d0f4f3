"""Where an embedding model's sentence-transformers files come from: a local folder as it is, a Hub id through
huggingface_hub's own cache (the same path a user's download takes; here a cache written by hand, offline)."""

from __future__ import annotations

import json
import logging

from huggingface_hub import constants

from retrofit.models.sources import sentence_transformers_source

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def hub_cache(root, repo: str):
    """A Hugging Face cache holding ``repo``'s sentence-transformers files, as snapshot_download leaves it."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snap = repo_dir / "snapshots" / ("a" * 40)
    (snap / "1_Pooling").mkdir(parents=True)
    (snap / "modules.json").write_text(json.dumps(MODULES))
    (snap / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("a" * 40)
    return snap


def test_a_hub_ids_files_come_from_the_cache_offline(tmp_path, monkeypatch):
    snap = hub_cache(tmp_path, "org/emb")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    folder = sentence_transformers_source("org/emb")
    assert folder == snap and json.loads((folder / "modules.json").read_text()) == MODULES


def test_a_hub_id_out_of_reach_is_said(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.WARNING):
        assert sentence_transformers_source("org/not-cached") is None
    assert "org/not-cached" in caplog.text and "without its normalisation" in caplog.text


def test_a_local_folder_is_its_own_source(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))
    assert sentence_transformers_source(str(tmp_path)) == tmp_path
