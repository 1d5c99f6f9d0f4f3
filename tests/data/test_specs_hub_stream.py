"""A Hub dataset named as data (retrofit eval --data, convert.calibrate.data) is streamed and read only as
far as needed, never loaded whole (issue 44, item 7). Tested on a local dataset folder through the very
call a Hub name takes (datasets.load_dataset(name, streaming=True))."""

import json

import pytest

from retrofit.data.specs import CHARS_PER_TOKEN, hub_documents
from retrofit.foundation.errors import DataError


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    with open(d / "train.jsonl", "w") as f:
        for i in range(500):
            f.write(json.dumps({"text": f"document {i} " + "word " * 200, "id": i}) + "\n")
    return d


def test_a_dataset_is_streamed_up_to_what_is_needed(folder, monkeypatch):
    import datasets

    seen = []
    real = datasets.load_dataset

    def spy(*a, **k):
        seen.append(k.get("streaming"))
        return real(*a, **k)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    docs = hub_documents(str(folder), max_chars=100 * CHARS_PER_TOKEN)
    assert seen == [True]
    assert 1 <= len(docs) <= 3 and docs[0].text.startswith("document 0 ")
    assert len(hub_documents(str(folder))) == 500  # no bound: the whole split, still streamed
    with pytest.raises(DataError, match="no field 'body'.*fields: text, id"):
        hub_documents(f"{folder}::train:body")
