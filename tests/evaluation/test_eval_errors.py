"""Each bad input is a clear RetrofitError raised before any window is scored."""

from __future__ import annotations

import pytest

from retrofit.evaluation import evaluate
from retrofit.foundation.errors import DataError, HubError, LengthError, OptionError

pytestmark = pytest.mark.slow  # processes, fine-tunes or pipeline runs: outside `pytest -m "not slow"`

try:  # tests/ is a package in this repo; also runnable as plain files
    from .test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama
except ImportError:
    from test_eval_common import byte_tokenizer, docs, tiny_gpt2, tiny_llama


@pytest.fixture
def counted():
    """A tiny Llama that counts its forward passes."""
    model = tiny_llama()
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    return model, calls


def _eval(model, lengths, **kw):
    kw.setdefault("data", docs())
    kw.setdefault("tokenizer", byte_tokenizer())
    return evaluate(model, lengths, budget=kw.pop("budget", 128), progress=False, **kw)


def test_length_larger_than_text(counted):
    model, calls = counted
    with pytest.raises(LengthError, match="larger than the available text"):
        _eval(model, [32, 100_000], budget=200_000)
    assert not calls


def test_unknown_dataset(counted, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model, calls = counted
    with pytest.raises(HubError, match="no-such-dataset-xyz.*not in the Hugging Face cache"):  # offline: at once
        _eval(model, [32], data="no-such-dataset-xyz:cfg:test")
    with pytest.raises(DataError, match="no file matches"):
        _eval(model, [32], data="missing/*.txt")
    assert not calls


def test_unknown_field(counted, monkeypatch):
    import datasets

    fake = datasets.Dataset.from_dict({"text": ["a b c " * 50], "title": ["t"]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: fake)
    model, calls = counted
    with pytest.raises(DataError, match="no field 'body'.*fields: text, title"):
        _eval(model, [32], data="somewhere:default:test:body")
    assert not calls


def test_baseline_with_other_tokenizer_is_refused(counted):
    model, calls = counted
    other = byte_tokenizer(eos=False)  # different vocabulary (no <eos>)
    with pytest.raises(OptionError, match="different tokenizer"):
        _eval(model, [32], baselines=[("other", tiny_gpt2(), other)])
    assert not calls


def test_length_past_what_the_scheme_supports(counted):
    model, calls = counted
    gpt2 = tiny_gpt2(n_positions=64)  # learned absolute: 64 at most
    gpt2.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(LengthError, match="at most 64"):
        _eval(gpt2, [32, 128], budget=256)
    with pytest.raises(LengthError, match="passkey lengths 300"):
        _eval(gpt2, [32], passkey=True, passkey_lengths=[300])
    assert not calls


def test_length_past_a_converted_models_limit():
    import retrofit

    model = retrofit.convert(tiny_gpt2(n_positions=64), "alibi")
    retrofit.set_position_controls(model, native_fade=0.5)  # mixing the native table back in caps the length
    with pytest.raises(LengthError, match="alibi: at most 64"):
        _eval(model, [32, 128], budget=256)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"stride": 0}, "stride"),
        ({"passkey": True, "passkey_depths": [1.5]}, "depths"),
        ({"passkey": True, "passkey_lengths": [20]}, "too short"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_options(counted, kw, match):
    model, calls = counted
    with pytest.raises((OptionError, LengthError), match=match):
        _eval(model, [32], **kw)
    with pytest.raises(OptionError, match="integer"):
        _eval(model, [32, "64"])
    assert not calls


def test_stride_not_below_a_baselines_window(counted):
    model, calls = counted
    with pytest.raises(OptionError, match="stride 64 must be smaller"):
        _eval(model, [32, 128], budget=256, stride=64, baselines=[("g", tiny_gpt2(n_positions=32), byte_tokenizer())])
    assert not calls
