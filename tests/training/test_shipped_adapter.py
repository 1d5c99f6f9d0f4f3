"""The SmolLM2 adapter docs/results.md measured (benchmarks/smollm2_use_adapter/, a few MB) loads with the one line
the docs give, and is live: on held-out Shakespeare it predicts better than the same conversion without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import retrofit

pytestmark = pytest.mark.slow  # SmolLM2 is loaded twice (~1 min)

ADAPTER = Path(__file__).resolve().parents[2] / "benchmarks" / "smollm2_use_adapter"


def _nll(model, ids) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def test_the_shipped_adapter_loads_in_one_line_and_is_live():
    from retrofit.data.specs import tokenize_documents
    from retrofit.models import assets

    model = retrofit.load(ADAPTER)  # the one line
    info = retrofit.describe(model)
    assert info["scheme"] == "rope" and info["options"]["scaling"] == "yarn" and info["options"]["factor"] == 4.0
    plain, tok = retrofit.load_model("smollm2", dtype="float32")
    retrofit.convert(plain, "rope", scaling="yarn", factor=4.0)
    text = [t for d in tokenize_documents(tok, assets.shakespeare_documents("heldout")[:2]) for t in d]
    ids = torch.tensor([text[:512]])
    assert _nll(model, ids) < _nll(plain, ids) - 0.02  # the LoRA weights are merged in, not dropped
