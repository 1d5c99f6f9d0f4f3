"""The SmolLM2 adapters docs/results.md measured (benchmarks/smollm2_use_adapter/: YaRN x4 + PoSE toward 2x;
benchmarks/smollm2_far_adapter/: YaRN x8 + PoSE toward 4x; benchmarks/smollm2_dynamic_adapter/: dynamic NTK x4 +
PoSE + data.copies toward 4x, the recommended cell; a few MB each) load with the one line the docs give, and are
live: on held-out Shakespeare each predicts better than the same conversion without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import retrofit

pytestmark = pytest.mark.slow  # SmolLM2 is loaded twice (~1 min)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _nll(model, ids) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


@pytest.mark.parametrize(
    ("folder", "scaling", "factor"),
    [
        ("smollm2_use_adapter", "yarn", 4.0),
        ("smollm2_far_adapter", "yarn", 8.0),
        ("smollm2_dynamic_adapter", "dynamic", 4.0),
    ],
)
def test_the_shipped_adapter_loads_in_one_line_and_is_live(folder, scaling, factor):
    from retrofit.data.specs import tokenize_documents
    from retrofit.models import assets

    model = retrofit.load(BENCHMARKS / folder)  # the one line
    info = retrofit.describe(model)
    assert info["scheme"] == "rope" and info["options"]["scaling"] == scaling and info["options"]["factor"] == factor
    plain, tok = retrofit.load_model("smollm2", dtype="float32")
    retrofit.convert(plain, "rope", scaling=scaling, factor=factor)
    text = [t for d in tokenize_documents(tok, assets.shakespeare_documents("heldout")[:2]) for t in d]
    ids = torch.tensor([text[:512]])
    assert _nll(model, ids) < _nll(plain, ids) - 0.02  # the LoRA weights are merged in, not dropped
