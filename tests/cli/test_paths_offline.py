"""A path is a path at once, and an offline machine is found once (a user's report: `retrofit eval runs/gpt2-alibi`
took 34 s to say "not in the Hugging Face cache"; `retrofit finetune recipes/gpt2-alibi-lora.yaml` spent 60 s on
five "Retrying" lines from datasets). In this process, never touching the network: the Hub's download functions,
its probe and the resolver fail the test when called."""

from __future__ import annotations

import socket

import pytest

from retrofit.cli import main
from retrofit.foundation.errors import HubError
from retrofit.models import sources


def _never(what: str):
    def called(*args, **kwargs):
        raise AssertionError(f"{what} was called")

    return called


@pytest.fixture
def online_looking(tmp_path, monkeypatch):
    """In tmp_path with HF_HUB_OFFLINE unset (as the user's shell was), a fresh probe, and no network to ask:
    what asks it fails the test."""
    import huggingface_hub
    from huggingface_hub import constants, file_download

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RETROFIT_PROGRESS", "0")
    monkeypatch.setenv("RETROFIT_CACHE", str(tmp_path / "cache"))
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(sources, "_probed", {})
    monkeypatch.setattr(sources, "_unreachable", _never("the Hub probe"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _never("hf_hub_download"))
    monkeypatch.setattr(file_download, "hf_hub_download", _never("hf_hub_download"))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", _never("try_to_load_from_cache"))
    monkeypatch.setattr(socket, "getaddrinfo", _never("socket.getaddrinfo"))
    return tmp_path


def _run(args: list[str], capsys) -> tuple[int, str]:
    rc = main(args)
    return rc, capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["runs/gpt2-alibi", "./gpt2-alibi", "runs/gpt2-alibi/final"])
def test_a_missing_run_folder_is_a_missing_path_said_without_the_network(online_looking, capsys, name):
    (online_looking / "runs" / "tiny-gpt2-alibi").mkdir(parents=True)  # the README's first run is there
    rc, err = _run(["eval", name], capsys)
    assert rc == 2 and f"no such file or folder: {name}" in err, err
    assert "Hugging Face cache" not in err
    rc, err = _run(["eval", "tiny-gpt2", "--baseline", name, "--out", "out"], capsys)
    assert rc == 2 and f"no such file or folder: {name}" in err, err


def test_what_names_a_path_and_what_a_hub_id(online_looking):
    (online_looking / "runs").mkdir()
    (online_looking / "someorg" / "model").mkdir(parents=True)
    for path in ("runs/x", "./x", "/abs/x", "~/x", "a/b/c", "someorg/model", "runs\\x", "not a hub id"):
        assert sources.names_a_path(path), path
    for hub in ("gpt2", "HuggingFaceTB/SmolLM2-135M", "openai-community/gpt2"):
        assert not sources.names_a_path(hub), hub
    with pytest.raises(Exception, match="no such file or folder: runs/x .runs/ is a folder here"):
        sources.check("runs/x")


def test_an_unreachable_hub_is_asked_once_per_process(online_looking, monkeypatch):
    asked = []
    monkeypatch.setattr(sources, "_unreachable", lambda endpoint: asked.append(endpoint) or "ConnectError: no route")
    assert sources.hub_unusable() == "the Hub does not answer"
    assert sources.hub_unusable() == "the Hub does not answer"
    assert len(asked) == 1


def test_a_hub_dataset_offline_fails_at_once_without_retries(online_looking, monkeypatch):
    """The Hub does not answer the one probe: datasets reads its cache only, so a dataset not cached fails at
    once, never through huggingface_hub's retries (each sleeps first)."""
    import time as _time

    from huggingface_hub.utils import _http

    from retrofit.data.specs import hub_documents

    monkeypatch.setattr(sources, "_unreachable", lambda endpoint: "ConnectError: no route")
    monkeypatch.setattr(_http.time, "sleep", _never("a retry's sleep"))
    assert _http.time is _time
    with pytest.raises(HubError, match="not in the Hugging Face cache, and the Hub does not answer"):
        hub_documents("someone/not-a-cached-dataset")


def test_with_hf_hub_offline_a_hub_dataset_fails_at_once(online_looking, monkeypatch):
    from huggingface_hub import constants

    from retrofit.data.specs import hub_documents

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="not in the Hugging Face cache, and HF_HUB_OFFLINE is set"):
        hub_documents("someone/not-a-cached-dataset:config:test")


def test_finetune_says_a_missing_model_before_it_opens_the_data(online_looking, capsys, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", _never("datasets.load_dataset"))
    (online_looking / "runs").mkdir()
    recipe = online_looking / "r.yaml"
    recipe.write_text(
        "model: {name_or_path: runs/gpt2-alibi}\nconvert: {scheme: alibi}\n"
        "data: {dataset: HuggingFaceFW/fineweb-edu, config: sample-10BT}\noutput_dir: runs/gpt2-alibi\n"
    )
    rc, err = _run(["finetune", str(recipe)], capsys)
    assert rc == 2 and "no such file or folder: runs/gpt2-alibi" in err, err
    from retrofit.training import finetune

    with pytest.raises(Exception, match="no such file or folder: runs/gpt2-alibi"):
        finetune(str(recipe))
